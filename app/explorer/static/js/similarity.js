// The similarity tab: two sentences in, relatedness, entailment bars and the two attention maps out.
import { request, TIMEOUT_SECONDS } from "./api.js";
import { html, showError, showBusy, fixed } from "./dom.js";
import { renderHeatmap, largest } from "./heatmap.js";
import { describeModel } from "./models.js";

const $ = (id) => document.getElementById(id);

/** Fill the model picker and wire the form. */
export function setUpSimilarity(models) {
  const picker = $("similarity-model");
  picker.replaceChildren(...models.map((model) => html("option", { value: model.name, selected: model.default }, model.name)));
  const byName = new Map(models.map((model) => [model.name, model]));
  const describe = () => {
    const model = byName.get(picker.value);
    $("similarity-model-about").textContent = model ? describeModel(model) : "";
  };
  picker.addEventListener("change", describe);
  describe();
  const form = $("similarity-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    compare();
  });
  form.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
}

// Each Compare takes the next turn; an answer to an older one is not drawn (a slow answer never replaces a later one).
let turn = 0;

async function compare() {
  const mine = ++turn;
  const busy = (message) => showBusy($("similarity-busy"), $("similarity-result"), message);
  showError($("similarity-error"), "");
  busy(`Comparing: waiting for the server (at most ${TIMEOUT_SECONDS} s)…`);
  try {
    const result = await request("similarity", {
      sentence_a: $("sentence-a").value,
      sentence_b: $("sentence-b").value,
      model: $("similarity-model").value || null,
      return_attention: true,
    });
    if (mine === turn) show(result);
  } catch (error) {
    if (mine !== turn) return;
    $("similarity-result").hidden = true;
    showError($("similarity-error"), error.message);
  } finally {
    if (mine === turn) busy("");
  }
}

function show(result) {
  const relatedness = $("relatedness");
  relatedness.textContent = fixed(result.relatedness, 3);
  relatedness.dataset.value = result.relatedness;
  const share = (result.relatedness - 1) / 4;
  $("relatedness-marker").style.left = `${Math.min(100, Math.max(0, share * 100))}%`;
  $("relatedness-scale").setAttribute("aria-label", `relatedness ${fixed(result.relatedness, 3)} on a scale from 1 to 5`);

  // a model trained without entailment labels answers relatedness only
  $("entailment-label").textContent = result.entailment?.label.toLowerCase() ?? "not trained for this model";
  $("entailment-bars").replaceChildren(...Object.entries(result.entailment?.probabilities ?? {}).map(([label, p]) => {
    const bar = html("span", { class: "bar" });
    bar.style.width = `${p * 100}%`;
    return html("li", { class: label === result.entailment?.label ? "chosen" : "" }, [
      html("span", { class: "bar-label" }, label.toLowerCase()),
      html("span", { class: "track", role: "img", "aria-label": `${label.toLowerCase()} ${fixed(p * 100, 1)}%` }, bar),
      html("span", { class: "bar-value" }, `${fixed(p * 100, 1)}%`),
    ]);
  }));

  $("similarity-result").hidden = false;
  const unknown = new Set(result.unknown_tokens);
  const note = $("unknown-tokens");
  note.hidden = unknown.size === 0;
  note.textContent = unknown.size
    ? `Words without a word vector, read as <unk> (marked ? in the maps): ${[...unknown].join(", ")}`
    : "";
  // One colour scale for both maps, so that the same colour is the same weight in either sentence.
  const domain = [0, Math.max(largest(result.attention.sentence_a), largest(result.attention.sentence_b))];
  for (const [key, tokens, title] of [["a", result.tokens_a, "Sentence A"], ["b", result.tokens_b, "Sentence B"]]) {
    drawAttention($(`attention-${key}`), `${title}: attention while reading`, tokens, result.attention[`sentence_${key}`], unknown, domain);
  }
}

function drawAttention(figure, title, tokens, matrix, unknown, domain) {
  const labels = tokens.map((token) => (unknown.has(token) ? `${token} ?` : token));
  const marked = new Set(tokens.flatMap((token, i) => (unknown.has(token) ? [i] : [])));
  renderHeatmap(figure, {
    title, matrix, rowLabels: labels, colLabels: labels, rowAxis: "reading", colAxis: "attended",
    markedRows: marked, markedColumns: marked, square: true, domain,
    legendLabel: "attention weight (one scale for both sentences)",
    describe: (row, column, value) =>
      `reading “${tokens[row]}” (${row + 1}), attended to “${tokens[column]}” (${column + 1}): ${fixed(value, 4)}`,
  });
}
