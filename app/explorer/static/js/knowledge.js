// The knowledge-tracing tab: build a history of answered questions, then see the predicted probability per
// step, the mastery of each concept over time, the attention per step and the next questions ranked; either for
// the history alone (POST /knowledge-trace) or appended to a student kept on the server (/students/{id}).
// A trace can also run the same history through a second model of the same data set and draw both side by side.
import { request, TIMEOUT_SECONDS } from "./api.js";
import { html, showError, showBusy, fixed, shorten } from "./dom.js";
import { renderHeatmap } from "./heatmap.js";
import { renderLineChart } from "./linechart.js";
import { parseHistory } from "./history.js";
import { studentIdProblem, readStudent, appendToStudent } from "./students.js";
import { describeModel } from "./models.js";

const $ = (id) => document.getElementById(id);
const CATALOG_PAGE = 1000;
const NEXT_SHOWN = 15;

const state = {
  models: new Map(), catalogs: new Map(), concepts: new Map(), history: [], historyModel: null,
  showAllNext: false, next: [], nextCompared: null, appending: false,
};

// Each Trace, Load student, Append and model change takes the next turn; an answer to an older turn is not
// drawn, so a slow answer never replaces a later one. An append (a write) blocks the three buttons until answered.
let turn = 0;

function busy(message) {
  showBusy($("kt-busy"), $("kt-result"), message && `${message}: waiting for the server (at most ${TIMEOUT_SECONDS} s)…`);
}

/** Fill the model picker, load the chosen model's question catalog and wire the controls. */
export function setUpKnowledge(models) {
  for (const model of models) state.models.set(model.name, model);
  const picker = $("kt-model");
  picker.replaceChildren(...models.map((model) => html("option", { value: model.name, selected: model.default }, model.name)));
  picker.addEventListener("change", () => {
    turn += 1; // an answer still on its way is for the other model
    busy("");
    $("kt-result").hidden = true;
    showSummary("");
    keepOrClearHistory();
    chooseModel();
  });
  $("kt-compare").addEventListener("change", describeCompared);
  $("add-form").addEventListener("submit", (event) => {
    event.preventDefault();
    addFromInput(event.submitter?.value !== "wrong");
  });
  $("paste-load").addEventListener("click", loadPasted);
  $("clear-history").addEventListener("click", () => {
    state.history = [];
    drawHistory();
  });
  $("trace").addEventListener("click", trace);
  $("student-form").addEventListener("submit", (event) => {
    event.preventDefault();
    loadStudent();
  });
  $("append-student").addEventListener("click", appendStudent);
  $("next-more").addEventListener("click", () => {
    state.showAllNext = !state.showAllNext;
    drawNext();
  });
  drawHistory();
  return chooseModel();
}

const currentModel = () => state.models.get($("kt-model").value);
const comparedModel = () => state.models.get($("kt-compare").value) ?? null;
const datasetOf = (model) => model?.metadata?.dataset;

/** Question ids mean the same in models of one data set: the history stays; in another data set it cannot. */
function keepOrClearHistory() {
  const before = state.models.get(state.historyModel);
  const model = currentModel();
  const note = $("history-note");
  if (state.history.length && before && datasetOf(before) !== datasetOf(model)) {
    note.textContent = `History cleared: ${model.name} is trained on ${datasetOf(model)}, where the question ids of `
      + `${before.name} (${datasetOf(before)}) mean other questions.`;
    state.history = [];
  } else {
    note.textContent = "";
  }
  note.hidden = !note.textContent;
  state.historyModel = model.name;
  drawHistory();
}

/** "Compare with": the other models of the chosen model's data set (the same question ids), or none. */
function fillCompare() {
  const model = currentModel();
  const picker = $("kt-compare");
  const kept = picker.value;
  const others = [...state.models.values()].filter((other) => other.name !== model.name && datasetOf(other) === datasetOf(model));
  picker.replaceChildren(
    html("option", { value: "" }, others.length ? "no second model" : `no other model on ${datasetOf(model)}`),
    ...others.map((other) => html("option", { value: other.name, selected: other.name === kept }, other.name)),
  );
  picker.disabled = others.length === 0;
  describeCompared();
}

function describeCompared() {
  const other = comparedModel();
  $("kt-compare-about").textContent = other ? `Compared with ${other.name}: ${describeModel(other)}` : "";
  $("kt-compare-about").hidden = !other;
}

/** The chosen model's questions as a Map id -> {name, concept}, fetched page by page once per model. */
async function catalog(name) {
  if (!state.catalogs.has(name)) {
    const questions = new Map();
    let total = Infinity;
    for (let offset = 0; offset < total; offset += CATALOG_PAGE) {
      const page = await request(`models/${encodeURIComponent(name)}/questions?offset=${offset}&limit=${CATALOG_PAGE}`);
      total = page.total;
      if (offset === 0) state.concepts.set(name, page.concepts ?? null); // the labels come with the first page
      for (const item of page.questions) questions.set(item.question, item);
      if (!page.questions.length) break;
    }
    state.catalogs.set(name, questions);
  }
  return state.catalogs.get(name);
}

async function chooseModel() {
  const model = currentModel();
  if (!model) return;
  showError($("kt-error"), "");
  state.historyModel ??= model.name;
  $("kt-model-about").textContent = describeModel(model);
  fillCompare();
  $("kt-model-info").textContent = model.supports?.concepts === false
    ? `${model.n_questions} questions, ${model.family?.toUpperCase()}: no latent concepts (no mastery or attention)`
    : `${model.n_questions} questions, ${model.n_concepts} latent concepts`;
  try {
    const questions = await catalog(model.name);
    $("question-list").replaceChildren(...[...questions.values()].map((item) => html("option", { value: questionText(item) })));
  } catch (error) {
    showError($("kt-error"), `Could not load the question catalog: ${error.message}`);
  }
}

/** "12 · Mode", or "12 · question 12" where the data set has no names. */
function questionText(item) {
  return `${item.question} · ${item.name ?? `question ${item.question}`}`;
}

function describeQuestion(question) {
  const item = state.catalogs.get(currentModel().name)?.get(question);
  return item ? questionText(item) : `${question}`;
}

function addFromInput(correct) {
  const input = $("question-input");
  const text = input.value.trim();
  const questions = state.catalogs.get(currentModel().name) ?? new Map();
  const byId = /^\d+/.exec(text);
  const question = byId
    ? Number(byId[0])
    : [...questions.values()].find((item) => (item.name ?? "").toLowerCase() === text.toLowerCase())?.question;
  const limit = currentModel().n_questions;
  if (!question || question > limit) {
    showError($("kt-error"), `Pick a question from the list: an id from 1 to ${limit} or a name.`);
    return;
  }
  showError($("kt-error"), "");
  state.history.push({ question, correct });
  drawHistory();
  input.value = "";
  input.focus();
}

function loadPasted() {
  try {
    state.history = parseHistory($("paste-text").value);
    showError($("kt-error"), "");
    drawHistory();
  } catch (error) {
    showError($("kt-error"), error.message);
  }
}

function drawHistory() {
  $("history-count").textContent = `${state.history.length} answer${state.history.length === 1 ? "" : "s"}`;
  updateActions();
  $("history").replaceChildren(...state.history.map((step, index) => {
    const toggle = html("button", { type: "button", class: step.correct ? "answer right" : "answer wrong", "aria-pressed": String(step.correct),
      "aria-label": `Step ${index + 1} answered ${step.correct ? "right" : "wrong"}; press to change` },
      step.correct ? "✓ right" : "✗ wrong");
    toggle.addEventListener("click", () => {
      step.correct = !step.correct;
      drawHistory();
      $("history").children[index].querySelector("button.answer").focus();
    });
    const remove = html("button", { type: "button", class: "remove", "aria-label": `Remove step ${index + 1}` }, "✕");
    remove.addEventListener("click", () => {
      state.history.splice(index, 1);
      drawHistory();
    });
    return html("li", {}, [html("span", { class: "question" }, describeQuestion(step.question)), toggle, remove]);
  }));
}

/** Trace, Append and Load are usable unless an append is on its way; the first two need a history. */
function updateActions() {
  $("trace").disabled = state.history.length === 0 || state.appending;
  $("append-student").disabled = state.history.length === 0 || state.appending;
  $("student-load").disabled = state.appending;
}

async function trace() {
  const mine = ++turn;
  showError($("kt-error"), "");
  busy("Tracing");
  try {
    const history = state.history.map((step) => ({ ...step }));
    const other = comparedModel();
    const traceWith = (model) => request("knowledge-trace", {
      model: model.name, interactions: history, next_questions: null, return_attention: true,
    });
    const [result, compared] = await Promise.all([traceWith(currentModel()), other && traceWith(other)]);
    if (mine !== turn) return;
    showSummary(""); // this trace is of the history alone, not of a stored student
    show(result, history, 0, other && { name: other.name, result: compared });
  } catch (error) {
    if (mine !== turn) return;
    $("kt-result").hidden = true;
    showError($("kt-error"), error.message);
  } finally {
    if (mine === turn) busy("");
  }
}

/** The student id as typed (ids are compared exactly, so it is not trimmed), or null after showing its problem. */
function checkedStudentId() {
  const id = $("student-id").value;
  const problem = studentIdProblem(id);
  if (problem) showError($("kt-error"), `Student id: ${problem}.`);
  return problem ? null : id;
}

function showSummary(text) {
  $("student-summary").textContent = text;
  $("student-summary").hidden = !text;
}

async function loadStudent() {
  showError($("kt-error"), "");
  const id = checkedStudentId();
  if (id === null) return;
  const model = currentModel().name;
  const mine = ++turn;
  busy("Loading the student");
  try {
    const stored = await readStudent(id, model);
    if (mine !== turn) return;
    showSummary(`Student “${id}” under ${model}: ${stored.interactions} answers stored, last one at ${stored.updated_at}.`);
    showStored(stored);
  } catch (error) {
    if (mine !== turn) return;
    $("kt-result").hidden = true;
    showSummary("");
    showError($("kt-error"), error.status === 404
      ? `No student “${id}” under ${model} yet (404): add answers below and press “Append to student” to create it.`
      : `Could not load the student: ${error.message}`);
  } finally {
    if (mine === turn) busy("");
  }
}

async function appendStudent() {
  showError($("kt-error"), "");
  const id = checkedStudentId();
  if (id === null) return;
  const model = currentModel();
  const mine = ++turn;
  const sent = [...state.history];
  state.appending = true;
  updateActions();
  busy("Appending to the student");
  try {
    const history = sent.map((step) => ({ ...step }));
    const every = Array.from({ length: model.n_questions }, (_, index) => index + 1);
    const answer = await appendToStudent(id, model.name, history, every);
    // stored now, whatever happens while drawing: appending them again would count them twice
    state.history = state.history.filter((step) => !sent.includes(step));
    drawHistory();
    if (mine !== turn) return;
    const before = answer.interactions - history.length;
    showSummary(`Student “${id}” under ${model.name}: ${answer.interactions} answers stored (${history.length} just added).`);
    const { predictions, mastery_steps: mastery, attention, next } = answer;
    // A model without memory slots (DKT) answers mastery as null: no concepts to count.
    show({ model: model.name, predictions, mastery, attention, next, n_concepts: answer.mastery?.length ?? null }, history, before);
  } catch (error) {
    if (mine !== turn) return;
    $("kt-result").hidden = true;
    const maybe = error.status === 0 ? " The answers may have been stored: press “Load student” to see the count before appending them again." : "";
    showError($("kt-error"), `Could not append to the student: ${error.message}${maybe}`);
  } finally {
    state.appending = false;
    updateActions();
    if (mine === turn) busy("");
    if (document.activeElement === document.body) $("question-input").focus(); // the pressed button went disabled
  }
}

/** The chosen model's concept labels (their top skills) from its catalog, by concept; empty where it has none. */
function conceptLabels() {
  return new Map((state.concepts.get(currentModel().name) ?? []).map((item) => [item.concept, item.label]));
}

/** Each concept's column label: "6 · Addition Whole Numbers, …" where the catalog names it, else "concept 6". */
function conceptNames(count) {
  const labels = conceptLabels();
  return Array.from({ length: count }, (_, concept) => conceptName(concept, labels));
}

function conceptName(concept, labels) {
  return labels.has(concept) ? `${concept} · ${labels.get(concept)}` : `concept ${concept}`;
}

/** A concept in a sentence: "concept 6 (Addition Whole Numbers, …)", or "concept 6". */
function conceptWords(count) {
  const labels = conceptLabels();
  return Array.from({ length: count }, (_, concept) => `concept ${concept}${labels.has(concept) ? ` (${labels.get(concept)})` : ""}`);
}

/** A loaded student: the server keeps the memory, not the answers, so there is the current mastery only. */
function showStored(stored) {
  $("kt-result").hidden = false;
  for (const id of ["prediction-chart", "kt-attention-map", "next-card"]) $(id).hidden = true;
  const label = `now, after ${stored.interactions}`;
  $("mastery-map").hidden = stored.mastery === null; // DKT keeps no concept mastery
  if (stored.mastery === null) return;
  const words = conceptWords(stored.mastery.length);
  renderHeatmap($("mastery-map"), {
    title: "Mastery per concept, stored for this student", matrix: [stored.mastery], rowLabels: [label],
    colLabels: conceptNames(stored.mastery.length), rowAxis: "state", colAxis: "concept", domain: [0, 1], labelLength: 22,
    legendLabel: "P(right) from that concept alone",
    describe: (row, concept, value) => `after ${stored.interactions} answers, ${words[concept]}: mastery ${fixed(value, 3)}`,
  });
}

/**
 * Draw a trace of `history`; `before` answers came first (a stored student's), so step numbers start after them.
 * `compared` ({name, result}): a second model's trace of the same history, drawn next to the first.
 */
function show(result, history, before = 0, compared = null) {
  $("kt-result").hidden = false;
  for (const id of ["prediction-chart", "next-card"]) $(id).hidden = false;
  const stepName = (step) => `${before + step + 1} · ${describeQuestion(history[step].question)}`;
  const verdict = (step) => (history[step].correct ? "right" : "wrong");
  const second = compared?.result.predictions;
  const predicted = (step) => fixed(result.predictions[step], 3)
    + (compared ? ` by ${result.model}, ${fixed(second[step], 3)} by ${compared.name}` : "");
  renderLineChart($("prediction-chart"), {
    title: "Predicted probability of a right answer, before each step"
      + (compared ? `: ${result.model} and ${compared.name}` : ""),
    name: result.model,
    values: result.predictions,
    compare: compared && { name: compared.name, values: second },
    firstStep: before + 1,
    correct: history.map((step) => step.correct),
    describe: (step) => `step ${stepName(step)}: predicted ${predicted(step)}, answered ${verdict(step)}`,
    tableHeads: ["step", "question", "answered", ...(compared ? [result.model, compared.name] : ["P(right) predicted"])],
    tableRow: (step) => [before + step + 1, describeQuestion(history[step].question), verdict(step),
      fixed(result.predictions[step], 3), ...(compared ? [fixed(second[step], 3)] : [])],
  });
  // A model without memory slots (DKT) answers mastery and attention as null: no maps for it.
  $("mastery-map").hidden = result.mastery === null;
  $("kt-attention-map").hidden = result.attention === null;
  if (result.mastery !== null && result.attention !== null) showConceptMaps(result, history, before, stepName, verdict);
  state.next = [...result.next].sort((a, b) => b.p_correct - a.p_correct);
  state.nextCompared = compared && {
    name: compared.name, p: new Map(compared.result.next.map((item) => [item.question, item.p_correct])),
  };
  state.showAllNext = false;
  drawNext();
}

function showConceptMaps(result, history, before, stepName, verdict) {
  const concepts = conceptNames(result.n_concepts);
  const words = conceptWords(result.n_concepts);
  const start = before ? `stored (${before})` : "prior";
  const rowLabels = [start, ...history.map((step, i) => `${before + i + 1} ${step.correct ? "✓" : "✗"} ${describeQuestion(step.question)}`)];
  renderHeatmap($("mastery-map"), {
    title: "Mastery per concept, after each step", matrix: result.mastery, rowLabels, colLabels: concepts,
    rowAxis: "after step", colAxis: "concept", domain: [0, 1], labelLength: 22, legendLabel: "P(right) from that concept alone",
    describe: (row, concept, value) =>
      `${row === 0 ? (before ? `stored, after ${before} answers` : "prior") : `after step ${stepName(row - 1)} (${verdict(row - 1)})`}, ${words[concept]}: mastery ${fixed(value, 3)}`,
  });
  renderHeatmap($("kt-attention-map"), {
    title: "Attention per step: which concepts each question drew on", matrix: result.attention,
    rowLabels: rowLabels.slice(1), colLabels: concepts, rowAxis: "step", colAxis: "concept", domain: [0, 1],
    labelLength: 22, legendLabel: "correlation weight",
    describe: (row, concept, value) => `step ${stepName(row)}, ${words[concept]}: weight ${fixed(value, 3)}`,
  });
}

/** The next questions, most likely right first; with a second model, its P(right) in a last column. */
function drawNext() {
  const shown = state.showAllNext ? state.next : state.next.slice(0, NEXT_SHOWN);
  const compared = state.nextCompared;
  const labels = conceptLabels();
  const heads = ["#", "Question", "Concept", compared ? `P(right), ${currentModel().name}` : "P(right)"];
  if (compared) heads.push(`P(right), ${compared.name}`);
  $("next-table").tHead.replaceChildren(html("tr", {}, heads.map((head) => html("th", { scope: "col" }, head))));
  $("next-table").tBodies[0].replaceChildren(...shown.map((item, rank) => {
    const concept = item.concept === null || item.concept === undefined ? "–" : conceptName(item.concept, labels);
    return html("tr", {}, [
      html("td", {}, rank + 1),
      html("td", { title: questionText(item) }, shorten(questionText(item), 60)),
      html("td", { title: concept }, shorten(concept, 40)),
      probabilityCell(item.p_correct),
      ...(compared ? [probabilityCell(compared.p.get(item.question))] : []),
    ]);
  }));
  const more = $("next-more");
  more.hidden = state.next.length <= NEXT_SHOWN;
  more.textContent = state.showAllNext ? `Show the first ${NEXT_SHOWN}` : `Show all ${state.next.length}`;
}

function probabilityCell(p) {
  const bar = html("span", { class: "bar" });
  bar.style.width = `${p * 100}%`;
  return html("td", { class: "p" }, html("span", { class: "p-cell" }, [html("span", { class: "track", "aria-hidden": "true" }, bar), fixed(p, 3)]));
}
