"""Measure how much a knowledge-tracing test AUC owes to answers the model has just seen (issue 13, item 3).

    python -m export.kt_repeats --model artifacts/dkvmn-assist2009.onnx --dataset assist2009
    python -m export.kt_repeats --run runs/kt/dkt-assist2009   # a trained run, e.g. the DKT baseline

The preprocessed ASSISTments 2009 data is said to expand a problem tagged with several skills into
consecutive rows with the same answer, so the model can see an answer one step before it predicts it.
The data folder has no problem ids (its mapping files map each skill id to itself), so such rows cannot
be identified exactly. This command scores the shipped ONNX graph on the published test split (chunks of
`seqlen`, memory reset per chunk, as in the card's protocol) and looks at two sets of positions:

- `repeated skill pair` (chosen without looking at answers): the skill differs from the previous row's,
  and the two-row block (previous skill, this skill) also occurs right before or right after, as in
  4,5,4,5: consecutive problems tagged with the same two skills. If these rows are expanded problems,
  nearly all of them repeat the previous answer. Reported: their share, how often they repeat the
  previous answer (against other skill changes), and the AUC without them and on them alone.
- `changed skill, same answer`: every expanded row has this signature, so its size bounds the number of
  repeats from above. It is defined by the answer itself, so an AUC without it would be biased (every
  kept skill change contradicts the previous answer); only its share is reported.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from sklearn.metrics import roc_auc_score

from models.kt_data import Sequences, read_students, split_files, to_sequences
from models.train_kt import load_run_model, recipe_for
from models.training import data_dir_default


def onnx_predictions(
    session: ort.InferenceSession, data: Sequences, init_memory: np.ndarray, batch: int = 64, state_input: str = "mv_in"
):
    """p [n, seqlen] of an exported graph, every chunk starting from the initial state fed as `state_input`
    (DKVMN: its learned initial memory as `mv_in`; DKT: the zero LSTM state as `state_in`)."""
    rows = []
    for start in range(0, len(data), batch):
        q, r, lengths = (a[start : start + batch] for a in (data.q, data.r, data.lengths))
        state = np.broadcast_to(init_memory, (len(q), *init_memory.shape)).astype(np.float32)
        rows.append(session.run(["p"], {"q": q, "r": r, "len": lengths, state_input: np.ascontiguousarray(state)})[0])
    return np.concatenate(rows)


@torch.no_grad()
def run_predictions(run_dir: Path, data: Sequences, batch: int = 64) -> np.ndarray:
    """p [n, seqlen] of the weights a `models.train_kt` run ships (DKVMN or the DKT baseline)."""
    model = load_run_model(run_dir)
    rows = []
    for start in range(0, len(data), batch):
        q, r, lengths = (torch.from_numpy(a[start : start + batch]) for a in (data.q, data.r, data.lengths))
        rows.append(torch.sigmoid(model.training_logits(q, r, lengths)).numpy())
    return np.concatenate(rows)


def skill_changes(data: Sequences) -> np.ndarray:
    """[n, seqlen] True where the skill differs from the previous row's (never the first row of a chunk)."""
    changed = np.zeros_like(data.q, dtype=bool)
    changed[:, 1:] = (data.q[:, 1:] != data.q[:, :-1]) & (data.q[:, 1:] > 0)
    return changed


def repeated_skill_pairs(data: Sequences) -> np.ndarray:
    """Skill changes whose block (q[t-1], q[t]) also occurs at (q[t-3], q[t-2]) or (q[t+1], q[t+2])."""
    q = data.q
    before = np.zeros_like(q, dtype=bool)
    before[:, 3:] = (q[:, 1:-2] == q[:, 3:]) & (q[:, :-3] == q[:, 2:-1])
    after = np.zeros_like(q, dtype=bool)
    after[:, 1:-2] = (q[:, 2:-1] == q[:, :-3]) & (q[:, 3:] == q[:, 1:-2])
    return skill_changes(data) & (before | after)


def _auc(y: np.ndarray, p: np.ndarray) -> float:
    """ROC AUC, NaN when the positions hold fewer than two classes (for example none at all)."""
    return float(roc_auc_score(y, p)) if len(np.unique(y)) == 2 else math.nan


def _rate(flags: np.ndarray) -> float:
    """Share of True values, NaN for an empty selection."""
    return float(flags.mean()) if flags.size else math.nan


def audit(p: np.ndarray, data: Sequences) -> dict[str, float]:
    """Shares, same-answer rates and AUCs of the suspect positions, for predictions p [n, seqlen]."""
    valid = np.arange(data.q.shape[1])[None, :] < data.lengths[:, None]
    same_answer = np.zeros_like(valid)
    same_answer[:, 1:] = data.r[:, 1:] == data.r[:, :-1]
    changes, pairs = skill_changes(data) & valid, repeated_skill_pairs(data) & valid
    follows = valid.copy()
    follows[:, 0] = False  # rows with a previous row in their chunk
    kept = valid & ~pairs
    return {
        "positions": int(valid.sum()),
        "auc_all": _auc(data.r[valid], p[valid]),
        "pairs_share": float(pairs.sum() / valid.sum()),
        "pairs_same_answer_rate": _rate(same_answer[pairs]),
        "other_changes_same_answer_rate": _rate(same_answer[changes & ~pairs]),
        "same_skill_same_answer_rate": _rate(same_answer[follows & ~changes]),
        "auc_without_pairs": _auc(data.r[kept], p[kept]),
        "auc_on_pairs": _auc(data.r[pairs], p[pairs]),
        "changed_same_answer_share": float((changes & same_answer).sum() / valid.sum()),
    }


def repeats_section(result: dict[str, float]) -> list[str]:
    """The model card's section on the repeated-answer caveat, from an `audit` result."""
    return [
        "## Evaluation caveat: answers repeated by multi-skill problems",
        "",
        "Re-implementations report that this preprocessed data expands a problem tagged with several skills into "
        "consecutive rows with the same answer, so the model may see an answer one step before predicting it. "
        "The data folder cannot identify those rows: its mapping files map each skill id to itself and there are "
        "no problem ids. `python -m export.kt_repeats` estimates the effect on the test split:",
        "",
        "| test positions | share | same answer as the previous row | AUC |",
        "|---|---|---|---|",
        f"| all | 100% | - | {result['auc_all']:.4f} |",
        f"| skill changed and the two-skill block repeats next to it (4,5,4,5; chosen without looking at "
        f"answers) | {result['pairs_share']:.1%} | {result['pairs_same_answer_rate']:.1%} | "
        f"{result['auc_on_pairs']:.4f} |",
        f"| all but those | {1 - result['pairs_share']:.1%} | - | {result['auc_without_pairs']:.4f} |",
        f"| other skill changes | - | {result['other_changes_same_answer_rate']:.1%} | - |",
        f"| same skill as the previous row | - | {result['same_skill_same_answer_rate']:.1%} | - |",
        "",
        "Rows inside alternating two-skill blocks repeat the previous answer more often than other rows, and the "
        f"model scores AUC {result['auc_on_pairs']:.4f} on them against {result['auc_without_pairs']:.4f} on the "
        "rest: consistent with the model seeing an answer one step early, although such blocks may also just be "
        "easier to predict. The flagged set is not exactly the repeats: if the blocks are expanded problems, runs "
        "of three or more blocks also flag rows that start a new problem (a new answer), and isolated multi-skill "
        f"problems are missed. At most {result['changed_same_answer_share']:.1%} of test positions can be repeats "
        "(skill changed, answer unchanged); an AUC without that set is not reported, since choosing rows by their "
        "answer biases it. "
        "Compare DKVMN with other models on this data only under the same protocol.",
        "",
    ]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="an exported DKVMN graph (its .mv0.npy beside it)")
    source.add_argument("--run", type=Path, help="a models.train_kt run directory (DKVMN or DKT)")
    parser.add_argument("--dataset", default="assist2009")
    parser.add_argument("--data-dir", type=Path, default=data_dir_default() / "kt")
    args = parser.parse_args(argv)
    test_file = split_files(args.data_dir, args.dataset)["test"]
    data = to_sequences(read_students(test_file), recipe_for(args.dataset)["seqlen"])
    if args.run:
        p = run_predictions(args.run, data)
    else:
        session = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
        p = onnx_predictions(session, data, np.load(args.model.with_suffix(".mv0.npy")))
    result = audit(p, data)
    print(
        f"test positions {result['positions']}: AUC {result['auc_all']:.4f}\n"
        f"repeated skill pair: {result['pairs_share']:.1%} of positions, same answer as the previous row "
        f"{result['pairs_same_answer_rate']:.1%} "
        f"(other skill changes: {result['other_changes_same_answer_rate']:.1%}, "
        f"same skill again: {result['same_skill_same_answer_rate']:.1%}); "
        f"AUC without them {result['auc_without_pairs']:.4f}, on them {result['auc_on_pairs']:.4f}\n"
        f"changed skill, same answer (upper bound of repeats): {result['changed_same_answer_share']:.1%} of positions"
    )
    return result


if __name__ == "__main__":
    main()
