// Entry point: the tabs (WAI-ARIA tab pattern, arrow keys move between them) and the models from GET /models.
import { request } from "./api.js";
import { setUpSimilarity } from "./similarity.js";
import { setUpKnowledge } from "./knowledge.js";

const tabs = [...document.querySelectorAll("[role=tab]")];

function selectTab(chosen, moveFocus) {
  for (const tab of tabs) {
    const selected = tab === chosen;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
    document.getElementById(tab.getAttribute("aria-controls")).hidden = !selected;
  }
  if (moveFocus) chosen.focus();
  history.replaceState(null, "", `#${chosen.id.replace("tab-", "")}`);
}

for (const tab of tabs) {
  tab.addEventListener("click", () => selectTab(tab, false));
  tab.addEventListener("keydown", (event) => {
    const index = tabs.indexOf(tab);
    const target = { ArrowRight: index + 1, ArrowLeft: index - 1, Home: 0, End: tabs.length - 1 }[event.key];
    if (target === undefined) return;
    event.preventDefault();
    selectTab(tabs[(target + tabs.length) % tabs.length], true);
  });
}
/** The tab named by the URL's fragment (#similarity, #knowledge), if any. */
function selectLinkedTab() {
  const linked = document.getElementById(`tab-${location.hash.slice(1)}`);
  if (linked) selectTab(linked, false);
}
selectLinkedTab();
window.addEventListener("hashchange", selectLinkedTab);

async function start() {
  const status = document.getElementById("status");
  status.textContent = "Loading the models…";
  try {
    const { models } = await request("models");
    setUpSimilarity(models.filter((model) => model.task === "similarity"));
    await setUpKnowledge(models.filter((model) => model.task === "knowledge-trace"));
    status.textContent = "";
    status.classList.remove("error");
    document.body.dataset.ready = "true";
  } catch (error) {
    const ask = error.status === 401 ? " Type this server's API key in the “API key” field at the top." : "";
    status.textContent = `Could not list the models: ${error.message}${ask}`;
    status.classList.add("error");
  }
}

// One start at a time: two that both succeeded would wire every control twice (each press sent twice).
let starting = null;
let startAgain = false;

/** Start, unless the page is ready; a key typed while a start runs starts again after it, if it failed. */
function startOnce() {
  if (document.body.dataset.ready) return;
  if (starting) {
    startAgain = true;
    return;
  }
  starting = start().finally(() => {
    starting = null;
    if (startAgain) {
      startAgain = false;
      startOnce();
    }
  });
}

startOnce();
// With API keys on, /models answers 401 until a key is given: try again once one is typed.
document.getElementById("api-key").addEventListener("change", startOnce);
