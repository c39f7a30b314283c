"""Export a pair model trained on a user's own scored pairs (models/train_own_similarity.py) into any artifacts
directory: the ONNX graph (parity-checked against PyTorch on the run's test pairs, as the SICK models are), the
word-vector assets the service's tokenizer needs, the model card and the manifest entry.

A model trained without entailment labels lists no `entailment_labels` (an empty list): the service then answers
relatedness only, without `entailment`.
"""

from __future__ import annotations

from pathlib import Path

from app.tasks.similarity.vectors import WordVectors
from export.cards import cpu_threads, duration
from export.manifest import upsert_model
from export.own_kt import is_first_of_its_task
from export.plots import training_curve
from export.similarity import (
    MAX_BATCH_PAIRS,
    MAX_CELLS,
    MAX_CHARACTERS,
    MAX_TOKENS,
    PARITY_TOLERANCE,
    check_parity,
    export_pair_model,
    load_model,
    pointer_text,
    word_vector_assets,
)
from models.sick_data import ENTAILMENT_LABELS, SickPair

VERSION = "1.0.0"
PARITY_PAIRS = 64
TASK = "similarity"


def export_run(run_dir: Path, result: dict, test: list[SickPair], artifacts: Path, name: str) -> dict:
    """Write `<name>.onnx`, its assets and card into `artifacts` and upsert its manifest entry; return the entry."""
    model, specials = load_model(run_dir)
    artifacts.mkdir(parents=True, exist_ok=True)
    onnx_file = artifacts / f"{name}.onnx"
    export_pair_model(model, onnx_file)
    parity = check_parity(model, onnx_file, WordVectors.from_glove(specials), test[:PARITY_PAIRS])
    assets = word_vector_assets(artifacts, name, specials)
    labelled = result["labelled"]
    curves = {"train loss": "train_loss", "valid Pearson r": "valid_pearson", "valid MSE": "valid_mse"}
    if labelled:
        curves["valid accuracy"] = "valid_accuracy"
    training_curve(
        result["history"], curves, result["best_epoch"], f"{name}: training", artifacts / f"{name}.curve.png"
    )
    (artifacts / f"{name}.md").write_text(card(name, result, parity, min(len(test), PARITY_PAIRS), onnx_file))
    config, test_metrics, base = model.config, result["test"], result["baseline_test"]
    metrics = {
        "test_pearson": round(test_metrics["pearson"], 4),
        "test_spearman": round(test_metrics["spearman"], 4),
        "test_mse": round(test_metrics["mse"], 4),
        **({"test_entailment_accuracy": round(test_metrics["accuracy"], 4)} if labelled else {}),
        "valid_pearson": round(result["valid"]["pearson"], 4),
        "baseline_glove_cosine_test_pearson": round(base["pearson"], 4),
        "baseline_glove_cosine_test_mse": round(base["mse"], 4),
        **({"baseline_majority_test_entailment_accuracy": round(base["accuracy"], 4)} if labelled else {}),
    }
    return upsert_model(
        artifacts,
        {
            "name": name,
            "task": TASK,
            "version": VERSION,
            "file": onnx_file.name,
            "default": is_first_of_its_task(artifacts, name, TASK),
            "limits": {"max_tokens": MAX_TOKENS, "max_characters": MAX_CHARACTERS, "max_batch_pairs": MAX_BATCH_PAIRS},
            "batching": {"max_cells": MAX_CELLS[config.pointer]},
            "metrics": metrics,
            "metadata": {
                "dataset": Path(result["protocol"]["data"]["file"]).name,
                "data_sha256": result["protocol"]["data"]["sha256"],
                "pointer": config.pointer,
                "window": config.window,
                "memory_size": config.mem_size,
                "heads": config.num_heads,
                "fc_dim": config.fc_dim,
                "embeddings": "glove-6b-50d",
                "entailment_labels": list(ENTAILMENT_LABELS) if labelled else [],
            },
            "assets": assets,
            "card": f"{name}.md",
        },
    )


def card(name: str, result: dict, parity: float, parity_pairs: int, onnx_file: Path) -> str:
    """The model card in markdown."""
    protocol, config, test, base = result["protocol"], result["config"], result["test"], result["baseline_test"]
    pairs, labelled = protocol["split"]["pairs"], result["labelled"]
    rows = [
        ("relatedness Pearson r", test["pearson"], base["pearson"]),
        ("relatedness Spearman rho", test["spearman"], base["spearman"]),
        ("relatedness MSE", test["mse"], base["mse"]),
    ]
    if labelled:
        rows.append(("entailment accuracy", test["accuracy"], base["accuracy"]))
    valid = result["valid"]
    lines = [
        f"# {name}",
        "",
        f"LSTM_RMC ({pointer_text(config['pointer'], config['window'])}) trained with `mnemo train similarity` on "
        f"`{Path(protocol['data']['file']).name}` (sha256 `{protocol['data']['sha256']}`): "
        f"{protocol['data']['pairs']} scored sentence pairs"
        + (
            ", with entailment labels: it answers relatedness (1..5) and entailment."
            if labelled
            else ", without entailment labels: it answers relatedness (1..5) only, no `entailment`."
        ),
        "",
        "## Protocol (fixed in `models/train_own_similarity.py` before the test evaluation)",
        "",
        f"- Split by pair, seed {protocol['split']['seed']}: {pairs['train']} train, {pairs['valid']} validation, "
        f"{pairs['test']} test pairs.",
        f"- Selection on validation only: {protocol['selection']}.",
        "- Baseline: the cosine of the two sentences' mean GloVe 6B 50d vectors (words without a vector left out), "
        "mapped to 1..5 by a least-squares line fitted on the training split"
        + ("; for entailment, the training split's most frequent label." if labelled else "."),
        "",
        f"## Test metrics ({pairs['test']} held-out pairs, reported once)",
        "",
        "| metric | this model | baseline |",
        "|---|---|---|",
        *[f"| {label} | {ours:.4f} | {theirs:.4f} |" for label, ours, theirs in rows],
        "",
        f"Predicting the training split's mean score for every test pair: MSE {base['train_mean_mse']:.4f}. "
        f"Validation: r {valid['pearson']:.4f}, rho {valid['spearman']:.4f}, MSE {valid['mse']:.4f}"
        + (f", accuracy {valid['accuracy']:.4f}." if labelled else "."),
        "",
        "Nothing was decided after the test numbers: they were computed once, after selection, and are reported "
        "as they came out.",
        "",
        "## Training",
        "",
        f"- Command: `{result['command']}`",
        f"- Seed {result['seed']}; {result['epochs_run']} epochs run, best validation score at epoch "
        f"{result['best_epoch']}; wall time {duration(result['wall_seconds'])} ({cpu_threads(result)}).",
        f"- Optimiser: {result['optimizer']}. Loss: KL(target || predicted) with the Tai et al. target "
        "distribution" + (" + entailment cross-entropy." if labelled else " (no entailment loss: no labels)."),
        f"- Sizes: {config['num_heads']} heads x {config['head_size']} = memory width "
        f"{config['num_heads'] * config['head_size']}, fc {config['fc_dim']}, as the served SICK members; frozen "
        "GloVe 6B 50d word vectors, looked up by the service with the same tokenizer.",
        "",
        f"![training curve]({name}.curve.png)",
        "",
        "## Reproduce",
        "",
        f"`{result['command']}` with a new `--run-dir` (the split, initialisation and shuffling follow the seed).",
        "",
        "## Export",
        "",
        f"- `{onnx_file.name}`: the same graph as the built-in SICK models (README); the assets "
        "`special_vectors` and `vocabulary` are the vectors of `<s>`, `</s>`, `<number>`, `<unk>` and the GloVe "
        "word table the service looks tokens up in.",
        f"- Parity with PyTorch on {parity_pairs} test pairs: max abs diff {parity:.2e} "
        f"(tolerance {PARITY_TOLERANCE:g}).",
        f"- Token limit {MAX_TOKENS} per sentence including the markers.",
        "",
    ]
    return "\n".join(lines)
