"""Export a model trained on a user's own answer log (models/train_own_kt.py) into any artifacts directory: the
ONNX graph (parity-checked against PyTorch), the question-id map and names, the model card and the manifest entry.

The graph numbers questions 1..Q; the asset `question_ids` holds the user's id of each (int64 when every id in the
CSV is an integer, else strings), so requests and answers use the CSV's own ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from export import dkt as dkt_export
from export import kt as dkvmn_export
from export.cards import cpu_threads, duration
from export.manifest import load_manifest, upsert_model
from models.dkt import DKT
from models.dkvmn import DKVMN
from models.kt_data import Sequences
from models.train_kt import load_run_model

VERSION = "1.0.0"


def export_run(run_dir: Path, result: dict, test: Sequences, artifacts: Path, name: str) -> dict:
    """Write `<name>.onnx`, its assets and card into `artifacts` and upsert its manifest entry; return the entry."""
    model = load_run_model(run_dir)
    onnx_file = artifacts / f"{name}.onnx"
    artifacts.mkdir(parents=True, exist_ok=True)
    batches = dkvmn_export.parity_batches_of(model.config.n_questions, test)
    assets = {"question_ids": {"file": f"{name}.question_ids.npy"}}
    np.save(artifacts / assets["question_ids"]["file"], np.array(result["question_ids"]))
    has_names = any(result["question_names"])
    if has_names:
        assets["question_names"] = {"file": f"{name}.names.npy"}
        np.save(artifacts / assets["question_names"]["file"], np.array(result["question_names"]))
    if isinstance(model, DKVMN):
        dkvmn_export.export_dkvmn(model, onnx_file)
        parity = dkvmn_export.check_parity_on(model, onnx_file, batches)
        assets["init_memory"] = {"file": f"{name}.mv0.npy"}
        assets["question_concepts"] = {"file": f"{name}.concepts.npy"}
        np.save(artifacts / assets["init_memory"]["file"], model.init_value_memory.detach().numpy())
        concepts = dkvmn_export.correlation_matrix(model).argmax(1).astype(np.int64)
        np.save(artifacts / assets["question_concepts"]["file"], concepts)
        family = {"family": "dkvmn", "n_concepts": model.config.memory_size, "value_dim": model.config.value_dim}
        max_cells = max(result["recipe"]["seqlen"], dkvmn_export.RUN_STEPS)
    else:
        assert isinstance(model, DKT)
        dkt_export.export_dkt(model, onnx_file)
        parity = dkt_export.check_parity_on(model, onnx_file, batches)
        family = {"family": "dkt", "hidden_dim": model.config.hidden_dim}
        max_cells = result["recipe"]["seqlen"] * dkt_export.BATCHED_CHUNKS
    dkvmn_export.write_training_curve(result, name, artifacts)
    (artifacts / f"{name}.md").write_text(card(name, result, parity, onnx_file))
    metrics = {
        "test_auc": round(result["test"]["auc"], 4),
        "test_accuracy": round(result["test"]["accuracy"], 4),
        "valid_auc": round(result["valid"]["auc"], 4),
        "baseline_per_question_mean_test_auc": round(result["baseline_test_auc"], 4),
    }
    return upsert_model(
        artifacts,
        {
            "name": name,
            "task": "knowledge-trace",
            "version": VERSION,
            "file": onnx_file.name,
            "default": is_first_of_its_task(artifacts, name),
            "limits": {
                "max_interactions": dkvmn_export.MAX_INTERACTIONS,
                "max_histories": dkvmn_export.MAX_HISTORIES,
            },
            "batching": {"max_cells": max_cells},
            "metrics": metrics,
            "metadata": {
                "dataset": Path(result["protocol"]["data"]["file"]).name,
                "data_sha256": result["protocol"]["data"]["sha256"],
                "n_questions": model.config.n_questions,
                "seqlen": result["recipe"]["seqlen"],
                "has_question_names": has_names,
                **family,
            },
            "assets": assets,
            "card": f"{name}.md",
        },
    )


def is_first_of_its_task(artifacts: Path, name: str, task: str = "knowledge-trace") -> bool:
    """Whether the manifest has no other default of `task`: then this model becomes the default one (a request
    without `model` gets it), else the default stays as it is."""
    others = [entry for entry in load_manifest(artifacts)["models"] if entry["name"] != name]
    return not any(entry["task"] == task and entry.get("default") for entry in others)


def card(name: str, result: dict, parity: dict[str, float], onnx_file: Path) -> str:
    """The model card in markdown."""
    protocol, config = result["protocol"], result["config"]
    students = protocol["split"]["students"]
    family = "DKT (an LSTM, no memory slots)" if result["model"] == "dkt" else "DKVMN"
    ids = result["question_ids"]
    lines = [
        f"# {name}",
        "",
        f"{family} trained with `mnemo train kt` on `{Path(protocol['data']['file']).name}` "
        f"(sha256 `{protocol['data']['sha256']}`): {protocol['data']['answers']} answers to {protocol['questions']} "
        f"questions by {sum(students.values())} students. Requests use the CSV's own question ids "
        f"({'integers' if ids and isinstance(ids[0], int) else 'strings'}), mapped by the asset `question_ids`.",
        "",
        "## Protocol (fixed in `models/train_own_kt.py` before the test evaluation)",
        "",
        f"- Split by student, seed {protocol['split']['seed']}: {students['train']} train, {students['valid']} "
        f"validation, {students['test']} test students.",
        f"- Selection on validation only: {protocol['selection']}.",
        f"- At most {protocol['max_epochs']} epochs, patience {protocol['patience']}; seqlen {protocol['seqlen']}, "
        f"batch {protocol['batch']}.",
        "",
        "## Test metrics (reported once)",
        "",
        "| metric | this model | per-question-mean baseline |",
        "|---|---|---|",
        f"| test AUC | {result['test']['auc']:.4f} | {result['baseline_test_auc']:.4f} |",
        f"| test accuracy | {result['test']['accuracy']:.4f} | - |",
        f"| validation AUC (selection) | {result['valid']['auc']:.4f} | - |",
        "",
        "The baseline predicts each answer by its question's mean correctness on the training split.",
        "",
        "## What saw the test split",
        "",
        "Nothing was decided after the test number: it was computed once, after selection, and is reported above as "
        "it came out.",
        "",
        "## Training",
        "",
        f"- Command: `{result['command']}`",
        f"- Seed {result['seed']}; {result['epochs_run']} epochs run, best validation AUC at epoch "
        f"{result['best_epoch']}; wall time {duration(result['wall_seconds'])} ({cpu_threads(result)}).",
        f"- Optimiser: {result['optimizer']}.",
        f"- Sizes: {', '.join(f'{key} {value}' for key, value in config.items())}.",
        "",
        f"![training curve]({name}.curve.png)",
        "",
        "## Reproduce",
        "",
        f"`{result['command']}` with a new `--run-dir` (the split, initialisation and shuffling follow the seed).",
        "",
        "## Export",
        "",
        f"- `{onnx_file.name}`: the same graph as the built-in {result['model'].upper()} models (README).",
        "- Parity with PyTorch (max abs diff): "
        + ", ".join(f"{key.replace('_', ' ')} {value:.2e}" for key, value in parity.items())
        + " (tolerance 1e-4).",
        "",
    ]
    return "\n".join(lines)
