"""Export a trained DKVMN run to ONNX, check parity, write its assets, model card and manifest entry.

python -m export.kt --run runs/kt/assist2009 --name dkvmn-assist2009 --default
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from sklearn.metrics import adjusted_rand_score

from export.cards import cpu_threads, data_files_table, duration, exporter_parser, notes_section
from export.kt_cv import section as fold_spread_section
from export.kt_repeats import audit as repeat_audit
from export.kt_repeats import onnx_predictions, repeats_section
from export.manifest import upsert_model
from export.onnx_export import export_scan_graph, max_abs_diff
from export.plots import heatmap, training_curve
from models.dkvmn import DKVMN
from models.kt_data import Sequences, read_students, to_sequences
from models.train_kt import load_run_model

PARITY_TOLERANCE = 1e-4
PAPER_TEST_AUC = {"assist2009": 0.8157, "assist2015": 0.7268, "statics": 0.8284, "synthetic": 0.8273}
INPUTS = ["q", "r", "len", "mv_in"]
OUTPUTS = ["p", "corr_w", "mastery", "mv_out"]
MAX_INTERACTIONS = 10_000
MAX_HISTORIES = 256  # rows of one Open Inference Protocol request: each carries its memory in and out
# Padded steps per run (the manifest's max_cells). A 200-step DKVMN chunk costs about as much per history at
# batch 1 as at 32 on CPU, so the ASSISTments and STATICS models run one chunk per run (the one-step
# next-question rows still share runs). Synthetic's 50-step chunks are cheap enough to gain from batching:
# 4 share a run at 0.42 ms per history against 0.91 ms alone (measured, ORT 1 thread, arena off).
RUN_STEPS = 200


def load_model(run_dir: Path) -> DKVMN:
    """The DKVMN weights a training run ships: best on validation, or their refit on the whole training split."""
    model = load_run_model(run_dir)
    if not isinstance(model, DKVMN):
        raise SystemExit(f"{run_dir} trained {type(model).__name__}; export.kt exports DKVMN runs")
    return model


def export_dkvmn(model: DKVMN, path: Path) -> None:
    """One ONNX Scan graph with dynamic batch and time."""
    batch, steps = torch.export.Dim("batch"), torch.export.Dim("time")
    q = torch.randint(1, model.config.n_questions + 1, (2, 5))
    example = (
        q,
        torch.randint(0, 2, (2, 5)),
        torch.tensor([5, 3]),
        model.initial_memory(2).detach().contiguous(),
    )
    shapes = {
        "q": {0: batch, 1: steps},
        "r": {0: batch, 1: steps},
        "lengths": {0: batch},
        "mv_in": {0: batch},
    }
    export_scan_graph(model, example, INPUTS, OUTPUTS, shapes, path)


def parity(model: DKVMN, session: ort.InferenceSession, q: np.ndarray, r: np.ndarray, lengths: np.ndarray) -> float:
    """Max |ONNX - PyTorch (Python loop)| over all outputs for one batch."""
    mv = model.initial_memory(len(q)).detach().contiguous()
    args = (torch.from_numpy(q), torch.from_numpy(r), torch.from_numpy(lengths))
    with torch.no_grad():
        expected = model(*args, mv, use_scan=False)
    feeds = {"q": q, "r": r, "len": lengths, "mv_in": mv.numpy()}
    return max_abs_diff(session, feeds, expected)


def check_parity(model: DKVMN, path: Path, test_file: Path, seqlen: int) -> dict[str, float]:
    """Parity on random sequences and on the first 64 real test sequences; raises above the tolerance."""
    return check_parity_on(model, path, parity_batches(model.config.n_questions, test_file, seqlen))


def check_parity_on(model: DKVMN, path: Path, batches: dict[str, Sequences]) -> dict[str, float]:
    """Parity on each of `batches`; raises above the tolerance."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return within_tolerance({key: parity(model, session, b.q, b.r, b.lengths) for key, b in batches.items()})


def parity_batches(n_questions: int, test_file: Path, seqlen: int) -> dict[str, Sequences]:
    """What a knowledge-tracing graph's parity is checked on: 8 random sequences of 1 to 57 steps (padded to
    57), and the first 64 real test sequences."""
    return parity_batches_of(n_questions, to_sequences(read_students(test_file)[:64], seqlen))


def parity_batches_of(n_questions: int, real: Sequences) -> dict[str, Sequences]:
    """8 random sequences of 1 to 57 steps (padded to 57), and the first 64 of `real`."""
    rng = np.random.default_rng(0)
    q = rng.integers(1, n_questions + 1, (8, 57)).astype(np.int64)
    r = rng.integers(0, 2, (8, 57)).astype(np.int64)
    return {
        "random": Sequences(q, r, rng.integers(1, 58, 8).astype(np.int64)),
        "real_test_sequences": Sequences(real.q[:64], real.r[:64], real.lengths[:64]),
    }


def within_tolerance(result: dict[str, float]) -> dict[str, float]:
    """The parity result, or exit naming it when a difference is above PARITY_TOLERANCE."""
    if max(result.values()) > PARITY_TOLERANCE:
        raise SystemExit(f"ONNX parity failed: {result} > {PARITY_TOLERANCE}")
    return result


def question_names(dataset: str, data_dir: Path, n_questions: int) -> list[str] | None:
    """Names of questions 1..Q where the data set has them (ASSIST2009 skills, STATICS steps)."""
    names = [""] * n_questions
    if dataset == "assist2009":
        lines = (data_dir / "assist2009_updated" / "assist2009_updated_skill_mapping.txt").read_text().splitlines()
        pairs = [(line.split("\t")[0], line.split("\t")[1]) for line in lines if "\t" in line]
    elif dataset == "statics":
        lines = (data_dir / "STATICS" / "STATICS_qid_qname").read_text().splitlines()[1:]
        pairs = [(line.split("\t")[0], line.split("\t")[1]) for line in lines if "\t" in line]
    else:
        return None
    for qid, name in pairs:
        if qid.strip().isdigit() and 1 <= int(qid) <= n_questions:
            names[int(qid) - 1] = name.strip()
    return names


def correlation_matrix(model: DKVMN) -> np.ndarray:
    """W_Q = softmax(A[1..Q] M^k^T): each question's weights over the N concepts [Q,N]."""
    with torch.no_grad():
        questions = torch.arange(1, model.config.n_questions + 1).unsqueeze(0)
        return model.correlation_weights(questions)[0].numpy()


def synthetic_concept_score(weights: np.ndarray, data_dir: Path, dataset: str) -> float:
    """Adjusted Rand index of the argmax concepts against the true ones in cluster_info_K."""
    version = int(dataset.removeprefix("synthetic-v"))
    truth = json.loads((data_dir / "synthetic" / f"cluster_info_{version}").read_text().splitlines()[0])
    return float(adjusted_rand_score(truth, weights.argmax(1)))


def synthetic_summary(runs_root: Path) -> dict | None:
    """Mean test AUC over all trained synthetic versions (the paper reports the mean of 20)."""
    aucs = {}
    result_files = runs_root.glob("synthetic-v*/result.json")
    for result_file in sorted(result_files, key=lambda path: int(path.parent.name.removeprefix("synthetic-v"))):
        aucs[result_file.parent.name] = json.loads(result_file.read_text())["test"]["auc"]
    if not aucs:
        return None
    values = list(aucs.values())
    return {
        "versions": len(aucs),
        "mean_test_auc": float(np.mean(values)),
        "std_test_auc": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
        "per_version": aucs,
    }


def write_card(
    path: Path, name: str, result: dict, parity_result: dict, extras: dict, onnx_file: Path, notes: str = ""
) -> None:
    """The model card in markdown."""
    dataset = result["dataset"]
    family = "synthetic" if dataset.startswith("synthetic") else dataset
    config, recipe = result["config"], result["recipe"]
    lines = [
        f"# {name}",
        "",
        f"DKVMN (Zhang et al., WWW 2017) trained on `{dataset}` for knowledge tracing, exported to ONNX "
        "(one Scan graph, dynamic batch and time). Implementation: `models/dkvmn.py` "
        "(the authors' released code's predictor, `tanh(W_h k_t)`, per docs/MODELS.md §2.3).",
        "",
        "## Test metrics (published test split, memory reset every "
        f"{recipe['seqlen']} interactions as in the paper's protocol)",
        "",
        "| metric | this model | paper DKVMN |",
        "|---|---|---|",
        f"| test AUC | {result['test']['auc']:.4f} | {PAPER_TEST_AUC[family]:.4f} |",
        f"| test accuracy | {result['test']['accuracy']:.4f} | - |",
        *_validation_rows(result),
        "",
        *_cv_lines(result),
        *_repeats_lines(extras),
    ]
    spread = fold_spread_section(extras.get("cv_dirs", []))
    if spread:
        lines += [*spread, ""]
    if extras.get("synthetic_mean"):
        summary = extras["synthetic_mean"]
        lines += [
            f"Synthetic-5, all trained versions ({summary['versions']}): mean test AUC "
            f"{summary['mean_test_auc']:.4f} (sample std {summary['std_test_auc']:.4f}, range "
            f"{min(summary['per_version'].values()):.4f} to {max(summary['per_version'].values()):.4f}); the paper "
            "reports the mean of 20 versions, 0.8273. Per version: "
            + ", ".join(f"{k} {v:.4f}" for k, v in summary["per_version"].items())
            + ".",
            "",
        ]
    if "ari" in extras:
        lines += [
            f"Discovered concepts (argmax of each question's correlation weights) against the true "
            f"concepts of `cluster_info_0`: adjusted Rand index **{extras['ari']:.3f}**.",
            "",
        ]
    lines += [
        "## Training",
        "",
        f"- Command: `{result['command']}`",
        f"- Seed {result['seed']}; {_run_scope(result)}{result['epochs_run']} epochs run, best validation AUC at epoch "
        f"{result['best_epoch']}; wall time {duration(result['wall_seconds'])} ({cpu_threads(result)}).",
        f"- Optimiser: {result['optimizer']}; loss: binary cross-entropy summed over valid steps / batch "
        "(the authors' objective)."
        + (
            ""
            if result["optimizer"].startswith("SGD")
            else " Deviation from the original recipe (SGD with momentum, 100 epochs): Adam with a plateau "
            "schedule and early stopping on the validation fold."
        ),
        *_average_lines(result),
        *_refit_lines(result),
        f"- Sizes: Q={config['n_questions']}, N={config['memory_size']} concepts, d_k={config['key_dim']}, "
        f"d_v={config['value_dim']}, final fc {config['final_fc_dim']}, seqlen {recipe['seqlen']}, "
        f"batch {recipe['batch']} (docs/MODELS.md §2.5 unless the notes below say otherwise).",
        "",
        *data_files_table(result),
        "",
        "![training curve](" + f"{name}.curve.png)",
        "",
        "## Export",
        "",
        f"- `{onnx_file.name}`: inputs `q`, `r` [B,T] int64 (0 = padding), `len` [B] int64, `mv_in` [B,N,d_v] "
        "float32 (the learned initial memory is the asset `init_memory`); outputs `p` [B,T], `corr_w` [B,T,N], "
        "`mastery` [B,T+1,N], `mv_out` [B,N,d_v].",
        f"- Parity with PyTorch (max abs diff over all outputs): random {parity_result['random']:.2e}, "
        f"64 real test sequences {parity_result['real_test_sequences']:.2e} (tolerance 1e-4).",
        "- Serving carries the memory across chunks of seqlen for longer histories (see README).",
        "",
        "## Concept correlation weights",
        "",
        "Each row is a question, each column a latent concept: `softmax(A[q] M^k^T)`, the weights the model "
        "reads and writes with for that question (independent of the history).",
        "",
        f"![correlation weights]({name}.concepts.png)",
        "",
    ]
    path.write_text("\n".join(lines + notes_section(notes)))


def validation_metrics(result: dict) -> dict[str, float]:
    """The manifest's validation metrics, one meaning each (docs/MODELS.md §2.5): `valid_auc` the recipe's best
    validation AUC on the published fold 1, `valid_auc_cv_mean`/`_std` over the 5 folds of a cross-validation."""
    if "cv" not in result:
        return {"valid_auc": round(result["valid"]["auc"], 4)} if result.get("fold", 1) == 1 else {}
    cv = result["cv"]
    fold_one = next(row["valid_auc"] for row in cv["folds"] if row["fold"] == 1)
    return {
        "valid_auc": round(fold_one, 4),
        "valid_auc_cv_mean": round(cv["valid_auc_mean"], 4),
        "valid_auc_cv_std": round(cv["valid_auc_std"], 4),
    }


def _validation_rows(result: dict) -> list[str]:
    """Validation rows of the metrics table, named as the manifest names them."""
    metrics = validation_metrics(result)
    rows = []
    if "valid_auc" in metrics:
        chose = "" if "cv" in result else ", model selection"
        rows.append(f"| validation AUC (fold 1{chose}; `valid_auc`) | {metrics['valid_auc']:.4f} | - |")
    if "cv" in result:
        rows.append(
            f"| validation AUC, mean of {len(result['cv']['folds'])} folds (model selection; `valid_auc_cv_mean`) "
            f"| {metrics['valid_auc_cv_mean']:.4f} (std {metrics['valid_auc_cv_std']:.4f}) | - |"
        )
    else:
        rows.append(f"| validation accuracy | {result['valid']['accuracy']:.4f} | - |")
    return rows


def _run_scope(result: dict) -> str:
    """Which run the epoch and wall-time figures describe, when the recipe was cross-validated."""
    return f"fold {result['fold']} (the fold the refit replays): " if "cv" in result else ""


def _cv_lines(result: dict) -> list[str]:
    """Per-fold best validation AUC and epoch of a cross-validated recipe."""
    if "cv" not in result:
        return []
    folds = ", ".join(
        f"fold {row['fold']} {row['valid_auc']:.4f} (epoch {row['best_epoch']})" for row in result["cv"]["folds"]
    )
    return [
        f"Cross-validation on the training split (`python -m models.cv_kt`, {duration(result['cv']['wall_seconds'])} "
        f"for the {len(result['cv']['folds'])} folds at {cpu_threads(result['cv'])}), best validation AUC per fold: "
        f"{folds}.",
        "",
    ]


def _repeats_lines(extras: dict) -> list[str]:
    """The repeated-answer caveat (ASSISTments 2009), measured by `export.kt_repeats`."""
    return repeats_section(extras["repeats"]) if "repeats" in extras else []


def _average_lines(result: dict) -> list[str]:
    """Which weights selection took when the run also validated a running weight average (`--average-from`)."""
    start = result.get("average_from", 0)
    if not start:
        return []
    if result.get("best_weights") == "average":
        first, last = result["best_averaged_epochs"]
        chosen = f"the mean of the weights at the ends of epochs {first}-{last}" + (
            "; the refit ships the mean of its own weights at the same epoch ends" if result.get("refit") else ""
        )
    else:
        chosen = f"the raw weights of epoch {result['best_epoch']}"
    return [
        f"- Weight averaging (`--average-from {start}`): from epoch {start} on, the equal-weight mean of the weights "
        "at every epoch end so far was validated next to the raw weights, and selection took whichever scored "
        f"higher: here {chosen}.",
    ]


def _refit_lines(result: dict) -> list[str]:
    """How the shipped weights were refit on the whole training split, if they were."""
    refit = result.get("refit")
    if not refit:
        return []
    fold = result.get("fold", 1)
    chosen = (
        f"the fold whose best epoch is the median of the {len(result['cv']['folds'])} folds (fold {fold}, epoch "
        f"{result['best_epoch']})"
        if "cv" in result
        else f"epoch {result['best_epoch']} on fold {fold}"
    )
    held_out = "the fold runs' on their validation folds" if "cv" in result else f"the fold-{fold} selection run's"
    return [
        f"- Refit: after selecting {chosen}, the model was retrained from scratch (same seed) on the whole "
        f"training split (`*_train.csv`, {refit['train_sequences']} sequences) for {refit['epochs']} epochs, "
        f"replaying that fold's learning rate per epoch ({refit['wall_seconds'] / 60:.1f} min). The shipped "
        f"weights and the test metrics are the refit's; the validation metrics are {held_out} (the refit "
        "has no held-out data).",
    ]


def write_training_curve(result: dict, name: str, artifacts: Path) -> None:
    """`<name>.curve.png`: training loss and validation AUC per epoch, the best epoch marked."""
    training_curve(
        result["history"],
        {"train loss (BCE/step)": "train_loss", "valid AUC": "valid_auc"},
        result["best_epoch"],
        f"{name}: training",
        artifacts / f"{name}.curve.png",
    )


def main(argv: list[str] | None = None) -> None:
    parser = exporter_parser(__doc__, "knowledge-trace")
    parser.add_argument(
        "--cv-dir",
        type=Path,
        action="append",
        default=[],
        help="models.cv_kt run of this model's recipe (then of the candidates it was compared with), for the card",
    )
    args = parser.parse_args(argv)
    result = json.loads((args.run / "result.json").read_text())
    dataset = result["dataset"]
    model = load_model(args.run)
    onnx_file = args.artifacts / f"{args.name}.onnx"
    export_dkvmn(model, onnx_file)
    test_file = Path(result["data_files"]["test"]["file"])
    data_dir = test_file.parent.parent
    parity_result = check_parity(model, onnx_file, test_file, result["recipe"]["seqlen"])
    weights = correlation_matrix(model)
    assets = {
        "init_memory": {"file": f"{args.name}.mv0.npy"},
        "question_concepts": {"file": f"{args.name}.concepts.npy"},
    }
    np.save(args.artifacts / assets["init_memory"]["file"], model.init_value_memory.detach().numpy())
    np.save(args.artifacts / assets["question_concepts"]["file"], weights.argmax(1).astype(np.int64))
    names = question_names(dataset, data_dir, model.config.n_questions)
    if names:
        assets["question_names"] = {"file": f"{args.name}.names.npy"}
        np.save(args.artifacts / assets["question_names"]["file"], np.array(names))
    extras: dict = {"cv_dirs": args.cv_dir}
    if dataset == "assist2009":
        session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        test = to_sequences(read_students(test_file), result["recipe"]["seqlen"])
        extras["repeats"] = repeat_audit(
            onnx_predictions(session, test, model.init_value_memory.detach().numpy()), test
        )
    if dataset.startswith("synthetic"):
        extras["ari"] = synthetic_concept_score(weights, data_dir, dataset)
        extras["synthetic_mean"] = synthetic_summary(args.run.parent)
    write_training_curve(result, args.name, args.artifacts)
    labels = [f"{q + 1} {names[q][:28]}" if names else str(q + 1) for q in range(len(weights))]
    heatmap(
        weights,
        labels if len(weights) <= 120 else None,
        [str(i) for i in range(weights.shape[1])],
        f"{args.name}: correlation weights (question x concept)",
        args.artifacts / f"{args.name}.concepts.png",
        xlabel="concept",
        ylabel="question",
    )
    write_card(args.artifacts / f"{args.name}.md", args.name, result, parity_result, extras, onnx_file, args.notes)
    metrics = {
        "test_auc": round(result["test"]["auc"], 4),
        "test_accuracy": round(result["test"]["accuracy"], 4),
        **validation_metrics(result),
        "paper_test_auc": PAPER_TEST_AUC["synthetic" if dataset.startswith("synthetic") else dataset],
    }
    if "repeats" in extras and math.isfinite(extras["repeats"]["auc_without_pairs"]):
        metrics["test_auc_without_repeated_skill_pairs"] = round(extras["repeats"]["auc_without_pairs"], 4)
    if "ari" in extras:
        metrics["concept_adjusted_rand_index"] = round(extras["ari"], 4)
    if extras.get("synthetic_mean"):
        metrics["synthetic_mean_test_auc"] = round(extras["synthetic_mean"]["mean_test_auc"], 4)
        metrics["synthetic_versions"] = extras["synthetic_mean"]["versions"]
    entry = upsert_model(
        args.artifacts,
        {
            "name": args.name,
            "task": "knowledge-trace",
            "version": args.version,
            "file": onnx_file.name,
            "default": args.default,
            "limits": {"max_interactions": MAX_INTERACTIONS, "max_histories": MAX_HISTORIES},
            "batching": {"max_cells": max(result["recipe"]["seqlen"], RUN_STEPS)},
            "metrics": metrics,
            "metadata": {
                "dataset": dataset,
                "n_questions": model.config.n_questions,
                "n_concepts": model.config.memory_size,
                "seqlen": result["recipe"]["seqlen"],
                "value_dim": model.config.value_dim,
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
