"""Export a trained DKT baseline run to ONNX, check parity, write its model card and manifest entry.

python -m export.dkt --run runs/kt/dkt-assist2009 --name dkt-assist2009

The graph takes the LSTM state in and gives it back (`state_in`/`state_out` [B,2,S]: h and c), the way the
DKVMN graph takes and gives its value memory, so serving carries a long history across chunks the same way.
DKT has no memory slots: the manifest entry says `family: dkt`, and the service answers without mastery,
attention or question concepts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from export.cards import cpu_threads, data_files_table, duration, exporter_parser, notes_section
from export.kt import (
    MAX_HISTORIES,
    MAX_INTERACTIONS,
    parity_batches,
    question_names,
    within_tolerance,
    write_training_curve,
)
from export.kt_repeats import audit as repeat_audit
from export.kt_repeats import onnx_predictions, repeats_section
from export.manifest import upsert_model
from export.onnx_export import export_scan_graph, max_abs_diff
from models.dkt import DKT
from models.kt_data import Sequences, read_students, to_sequences
from models.train_kt import load_run_model

PAPER_DKT_TEST_AUC = {"assist2009": 0.8053}  # as reported in the DKVMN paper's comparison (Zhang et al. 2017)
INPUTS = ["q", "r", "len", "state_in"]
OUTPUTS = ["p", "state_out"]
FAMILY = "dkt"
# Unlike DKVMN (one chunk per run: its cost per history does not fall with the batch on CPU), the LSTM shares
# runs well: 200-step chunks at 1 thread, arena off, took 14.6 ms per history alone, 5.5 at batch 4, 4.5 at 8,
# 5.4 at 16 and 32 (one measurement on a shared 2-core machine). So a run holds up to 8 chunks.
BATCHED_CHUNKS = 8


def load_model(run_dir: Path) -> DKT:
    """The DKT weights a training run ships: best on validation, or their refit on the whole training split."""
    model = load_run_model(run_dir)
    if not isinstance(model, DKT):
        raise SystemExit(f"{run_dir} trained {type(model).__name__}; export.dkt exports DKT runs (--model dkt)")
    return model


def export_dkt(model: DKT, path: Path) -> None:
    """One ONNX Scan graph with dynamic batch and time."""
    batch, steps = torch.export.Dim("batch"), torch.export.Dim("time")
    example = (
        torch.randint(1, model.config.n_questions + 1, (2, 5)),
        torch.randint(0, 2, (2, 5)),
        torch.tensor([5, 3]),
        torch.randn(2, 2, model.config.hidden_dim),
    )
    shapes = {"q": {0: batch, 1: steps}, "r": {0: batch, 1: steps}, "lengths": {0: batch}, "state_in": {0: batch}}
    export_scan_graph(model, example, INPUTS, OUTPUTS, shapes, path)


def parity(model: DKT, session: ort.InferenceSession, q: np.ndarray, r: np.ndarray, lengths: np.ndarray) -> float:
    """Max |ONNX - PyTorch (Python loop)| over both outputs, from a random (not zero) state."""
    state = torch.randn(len(q), 2, model.config.hidden_dim, generator=torch.Generator().manual_seed(0)) * 0.5
    with torch.no_grad():
        expected = model(torch.from_numpy(q), torch.from_numpy(r), torch.from_numpy(lengths), state, use_scan=False)
    feeds = {"q": q, "r": r, "len": lengths, "state_in": state.numpy()}
    return max_abs_diff(session, feeds, expected)


@torch.no_grad()
def training_parity(model: DKT, data: Sequences) -> float:
    """Max |serving graph (step by step, from zeros) - the trained nn.LSTM| on the valid steps of `data`."""
    q, r, lengths = (torch.from_numpy(a) for a in (data.q, data.r, data.lengths))
    served, _ = model(q, r, lengths, model.initial_state(len(q)))
    trained = torch.sigmoid(model.training_logits(q, r, lengths))
    valid = torch.arange(q.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    return float((served - trained).abs()[valid].max())


def check_parity(model: DKT, path: Path, test_file: Path, seqlen: int) -> dict[str, float]:
    """Parity on random sequences and on the first 64 real test sequences, and of the step loop against the
    trained LSTM on the latter; raises above the tolerance."""
    return check_parity_on(model, path, parity_batches(model.config.n_questions, test_file, seqlen))


def check_parity_on(model: DKT, path: Path, batches: dict[str, Sequences]) -> dict[str, float]:
    """`check_parity` on the given batches (`random` and `real_test_sequences`)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    result = {key: parity(model, session, b.q, b.r, b.lengths) for key, b in batches.items()}
    return within_tolerance({**result, "trained_lstm": training_parity(model, batches["real_test_sequences"])})


def write_card(
    path: Path, name: str, result: dict, parity_result: dict, repeats: dict | None, onnx_file: Path, notes: str = ""
) -> None:
    """The model card in markdown."""
    dataset, config, recipe = result["dataset"], result["config"], result["recipe"]
    paper = PAPER_DKT_TEST_AUC.get(dataset)
    lines = [
        f"# {name}",
        "",
        f"DKT (Piech et al., NeurIPS 2015: an LSTM over one-hot interactions) trained on `{dataset}`, the baseline "
        "the DKVMN paper compares with, exported to ONNX (one Scan graph, dynamic batch and time). Implementation: "
        "`models/dkt.py`. Served under POST /knowledge-trace next to the DKVMN models; it has no memory slots, so "
        "its answers carry predictions and next-question probabilities but no mastery, attention or concepts.",
        "",
        f"## Test metrics (published test split, state reset every {recipe['seqlen']} interactions as in the "
        "DKVMN paper's protocol)",
        "",
        "| metric | this model | paper DKT |",
        "|---|---|---|",
        f"| test AUC | {result['test']['auc']:.4f} | {f'{paper:.4f}' if paper else '-'} |",
        f"| test accuracy | {result['test']['accuracy']:.4f} | - |",
        f"| validation AUC (fold {result.get('fold', 1)}, model selection) | {result['valid']['auc']:.4f} | - |",
        f"| validation accuracy | {result['valid']['accuracy']:.4f} | - |",
        "",
        *(repeats_section(repeats) if repeats else []),
        *(
            [
                f"The exported graph reproduces the test AUC: {repeats['auc_all']:.4f} from ONNX Runtime against "
                f"{result['test']['auc']:.4f} from PyTorch at the end of training.",
                "",
            ]
            if repeats
            else []
        ),
        "## Training",
        "",
        f"- Command: `{result['command']}`",
        f"- Seed {result['seed']}; {result['epochs_run']} epochs run on fold {result.get('fold', 1)}, best "
        f"validation AUC at epoch {result['best_epoch']}; wall time {duration(result['wall_seconds'])} "
        f"({cpu_threads(result)}).",
        f"- Optimiser: {result['optimizer']}; loss: binary cross-entropy summed over valid steps / batch, "
        "as for DKVMN.",
        *_refit_lines(result),
        f"- Sizes: Q={config['n_questions']}, LSTM state S={config['hidden_dim']}, input 2Q one-hot "
        f"(q + r·Q), dropout {config['dropout']}, seqlen {recipe['seqlen']}, batch {recipe['batch']}.",
        "",
        *data_files_table(result),
        "",
        f"![training curve]({name}.curve.png)",
        "",
        "## Export",
        "",
        f"- `{onnx_file.name}`: inputs `q`, `r` [B,T] int64 (0 = padding), `len` [B] int64, `state_in` [B,2,S] "
        "float32 (the LSTM's h and c; zeros for a new history); outputs `p` [B,T] (P(q_t correct) from the state "
        "before step t) and `state_out` [B,2,S] (the state after each row's last valid step).",
        f"- Parity (max abs diff): ONNX against the PyTorch step loop, random {parity_result['random']:.2e} and 64 "
        f"real test sequences {parity_result['real_test_sequences']:.2e}; the step loop against the trained "
        f"`nn.LSTM` on those sequences {parity_result['trained_lstm']:.2e} (tolerance 1e-4).",
        "- Serving carries the state across chunks of seqlen for longer histories, as for DKVMN (see README).",
        "",
    ]
    path.write_text("\n".join(lines + notes_section(notes)))


def _refit_lines(result: dict) -> list[str]:
    """How the shipped weights were refit on the whole training split, if they were."""
    refit = result.get("refit")
    if not refit:
        return []
    return [
        f"- Refit: after selecting epoch {result['best_epoch']} on fold {result.get('fold', 1)}, the model was "
        f"retrained from scratch (same seed) on the whole training split (`*_train.csv`, {refit['train_sequences']} "
        f"sequences) for {refit['epochs']} epochs, replaying the selection run's learning rate per epoch "
        f"({refit['wall_seconds'] / 60:.1f} min). The shipped weights (`{result['weights']}`) and the test metrics "
        "are the refit's; the validation metrics are the fold model's (the refit has no held-out data).",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = exporter_parser(__doc__, "knowledge-trace")
    args = parser.parse_args(argv)
    result = json.loads((args.run / "result.json").read_text())
    dataset, seqlen = result["dataset"], result["recipe"]["seqlen"]
    model = load_model(args.run)
    onnx_file = args.artifacts / f"{args.name}.onnx"
    export_dkt(model, onnx_file)
    test_file = Path(result["data_files"]["test"]["file"])
    parity_result = check_parity(model, onnx_file, test_file, seqlen)
    assets = {}
    names = question_names(dataset, test_file.parent.parent, model.config.n_questions)
    if names:
        assets["question_names"] = {"file": f"{args.name}.names.npy"}
        np.save(args.artifacts / assets["question_names"]["file"], np.array(names))
    repeats = None
    if dataset == "assist2009":
        session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        test = to_sequences(read_students(test_file), seqlen)
        zeros = model.initial_state(1)[0].numpy()
        repeats = repeat_audit(onnx_predictions(session, test, zeros, state_input="state_in"), test)
    write_training_curve(result, args.name, args.artifacts)
    write_card(args.artifacts / f"{args.name}.md", args.name, result, parity_result, repeats, onnx_file, args.notes)
    metrics = {
        "test_auc": round(result["test"]["auc"], 4),
        "test_accuracy": round(result["test"]["accuracy"], 4),
        "valid_auc": round(result["valid"]["auc"], 4),
        "paper_test_auc": PAPER_DKT_TEST_AUC.get(dataset),
    }
    if repeats and math.isfinite(repeats["auc_without_pairs"]):
        metrics["test_auc_without_repeated_skill_pairs"] = round(repeats["auc_without_pairs"], 4)
    entry = upsert_model(
        args.artifacts,
        {
            "name": args.name,
            "task": "knowledge-trace",
            "version": args.version,
            "file": onnx_file.name,
            "default": args.default,
            "limits": {"max_interactions": MAX_INTERACTIONS, "max_histories": MAX_HISTORIES},
            "batching": {"max_cells": seqlen * BATCHED_CHUNKS},
            "metrics": metrics,
            "metadata": {
                "dataset": dataset,
                "family": FAMILY,
                "n_questions": model.config.n_questions,
                "seqlen": seqlen,
                "hidden_dim": model.config.hidden_dim,
                "has_question_names": bool(names),
            },
            "assets": assets,
            "card": f"{args.name}.md",
        },
    )
    size = onnx_file.stat().st_size / 1e6
    print(f"{args.name}: {onnx_file} ({size:.2f} MB) sha256 {entry['sha256'][:12]} parity {parity_result}")


if __name__ == "__main__":
    main()
