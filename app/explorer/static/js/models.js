// One line per model for a reader who does not know the papers: what the model is, what it was trained on and its
// test score, built from GET /models (family, metadata, metrics), which has no description field of its own.
import { fixed } from "./dom.js";

const FAMILIES = {
  dkvmn: "DKVMN, a key-value memory network (Zhang et al. 2017) that keeps a mastery value per latent concept",
  dkt: "DKT, the LSTM baseline (Piech et al. 2015): one hidden state, no concepts",
  vlmp: "LSTM with a relational memory (Ahmed & Mercer 2020) whose pointer moves a variable length",
  flmp: "LSTM with a relational memory (Ahmed & Mercer 2020) whose pointer moves a fixed length",
};

const DATASETS = {
  assist2009: "ASSISTments 2009 (maths)",
  assist2015: "ASSISTments 2015 (maths)",
  statics: "a statics course (engineering)",
  "synthetic-v0": "simulated students",
};

/** "DKVMN, a key-value memory network …, trained on ASSISTments 2009 (maths): test AUC 0.816." */
export function describeModel(model) {
  const metadata = model.metadata ?? {};
  const kind = FAMILIES[model.family ?? metadata.pointer] ?? model.task;
  if (model.task === "similarity") {
    const { test_pearson: pearson, test_entailment_accuracy: accuracy } = model.metrics ?? {};
    const scores = [pearson === undefined ? null : `test Pearson r ${fixed(pearson, 3)}`,
      accuracy === undefined ? null : `entailment accuracy ${fixed(accuracy * 100, 1)}%`].filter(Boolean);
    return `${kind}, trained on SICK for relatedness (1..5) and entailment${scores.length ? `: ${scores.join(", ")}` : ""}.`;
  }
  const dataset = DATASETS[metadata.dataset] ?? metadata.dataset ?? "its own data";
  const auc = model.metrics?.test_auc;
  return `${kind}, trained on ${dataset}${auc === undefined ? "" : `: test AUC ${fixed(auc, 3)}`}.`;
}
