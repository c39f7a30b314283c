"""Export a trained LSTM_RMC run to ONNX, check parity on real SICK pairs, write card and manifest entry.

python -m export.similarity --run runs/sim/vlmp --name rmc-vlmp-sick --default
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from app.tasks.similarity.service import combined_map
from app.tasks.similarity.tokenizer import tokenize
from app.tasks.similarity.vectors import DEFAULT_VOCABULARY, VOCABULARY_FILE, WordVectors
from export.cards import cpu_threads, data_files_table, duration, exporter_parser, notes_section
from export.manifest import upsert_model
from export.onnx_export import export_scan_graph
from export.plots import heatmap, training_curve
from models.rmc import RMCConfig, SentencePairModel
from models.sick_data import ENTAILMENT_LABELS, read_split
from models.training import load_checkpoint

PARITY_TOLERANCE = 1e-4
MAX_TOKENS = 64  # including <s> and </s>; SICK's longest sentence has 34
MAX_CHARACTERS = 1000
MAX_BATCH_PAIRS = 256
# Padded tokens (pairs x length) per ONNX run. A run's working memory grows with them: about 7.7 MB per
# 64-token pair for VLMP (246 MB at 32 x 64) and 2.4 MB for FLMP, while the time per pair does not depend on
# the batch at that length. These caps keep one run near 64 and 40 MB; short SICK pairs still batch 32.
MAX_CELLS = {"vlmp": 512, "flmp": 1024}
INPUTS = ["emb_a", "len_a", "emb_b", "len_b"]
OUTPUTS = [
    "relatedness_log_probs",
    "relatedness",
    "entailment_logits",
    "attn_a_fwd",
    "attn_a_bwd",
    "attn_b_fwd",
    "attn_b_bwd",
]
PAPER = {
    "vlmp": {"pearson": 0.8440, "mse": 0.2925, "accuracy": 0.8428},
    "flmp": {"pearson": 0.8107, "mse": 0.3452, "accuracy": 0.8538},
}


def load_model(run_dir: Path) -> tuple[SentencePairModel, np.ndarray]:
    """Best-trial weights and the special-token vectors of a training run."""
    checkpoint = load_checkpoint(run_dir / "best.pt")
    if "specials" not in checkpoint:  # a knowledge-tracing run (models.train_kt) has no sentence vectors
        raise SystemExit(f"{run_dir} is not a models.train_sim run; export.similarity exports LSTM_RMC runs")
    model = SentencePairModel(RMCConfig(**checkpoint["config"]))
    model.load_state_dict(checkpoint["model"])
    return model.eval(), np.asarray(checkpoint["specials"], dtype=np.float32)


def export_pair_model(model: SentencePairModel, path: Path) -> None:
    """One ONNX graph, dynamic batch and length (a and b share the padded length)."""
    batch, steps = torch.export.Dim("batch"), torch.export.Dim("time")
    example = (
        torch.randn(2, 7, model.config.embed_dim),
        torch.tensor([7, 3]),
        torch.randn(2, 7, model.config.embed_dim),
        torch.tensor([2, 7]),
    )
    shapes = {
        "emb_a": {0: batch, 1: steps},
        "len_a": {0: batch},
        "emb_b": {0: batch, 1: steps},
        "len_b": {0: batch},
    }
    export_scan_graph(model, example, INPUTS, OUTPUTS, shapes, path)


def check_parity(model: SentencePairModel, path: Path, vectors: WordVectors, pairs) -> float:
    """Max |ONNX - PyTorch (Python loop)| over all outputs on real pairs (SICK, or a user's), padded as a batch."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    encoded = [(vectors.embed(tokenize(p.sentence_a))[0], vectors.embed(tokenize(p.sentence_b))[0]) for p in pairs]
    length = max(max(len(a), len(b)) for a, b in encoded)
    emb = np.zeros((2, len(encoded), length, model.config.embed_dim), dtype=np.float32)
    for row, (a, b) in enumerate(encoded):
        emb[0, row, : len(a)], emb[1, row, : len(b)] = a, b
    len_a = np.array([len(a) for a, _ in encoded], dtype=np.int64)
    len_b = np.array([len(b) for _, b in encoded], dtype=np.int64)
    with torch.no_grad():
        expected = model(
            torch.from_numpy(emb[0]),
            torch.from_numpy(len_a),
            torch.from_numpy(emb[1]),
            torch.from_numpy(len_b),
        )
    actual = session.run(None, {"emb_a": emb[0], "len_a": len_a, "emb_b": emb[1], "len_b": len_b})
    diff, where = largest_difference([e.numpy() for e in expected], actual)
    if diff > PARITY_TOLERANCE:
        del session
        path.unlink()  # a graph that failed its check is not an artifact: the manifest never lists it
        raise SystemExit(
            f"ONNX parity failed on real sentence pairs: {diff:.2e} > {PARITY_TOLERANCE} ({where}); removed {path}"
        )
    return diff


def largest_difference(expected: list[np.ndarray], actual: list[np.ndarray]) -> tuple[float, str]:
    """Max |expected - actual| over the outputs, and where it is: the output's name and its pair (batch row).
    A NaN on either side counts as an infinite difference (it would compare as within any tolerance)."""
    diffs = [np.nan_to_num(np.abs(e - a), nan=np.inf) for e, a in zip(expected, actual, strict=True)]
    worst = max(range(len(diffs)), key=lambda i: float(diffs[i].max()))
    index = np.unravel_index(int(diffs[worst].argmax()), diffs[worst].shape)
    where = f"output {OUTPUTS[worst]}, pair {int(index[0])}, index {tuple(int(i) for i in index)}"
    return float(diffs[worst].max()), where


def attention_figure(path: Path, vectors: WordVectors, model_file: Path, pair, name: str) -> None:
    """Heatmaps of both sentences' combined attention maps for one test pair, from the ONNX graph."""
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])

    for suffix, sentence in (("a", pair.sentence_a), ("b", pair.sentence_b)):
        tokens = tokenize(sentence)
        emb = vectors.embed(tokens)[0][np.newaxis]
        length = np.array([len(tokens)], dtype=np.int64)
        outputs = dict(
            zip(OUTPUTS, session.run(None, {"emb_a": emb, "len_a": length, "emb_b": emb, "len_b": length}), strict=True)
        )
        matrix = combined_map(outputs["attn_a_fwd"][0], outputs["attn_a_bwd"][0])
        heatmap(
            matrix,
            tokens,
            tokens,
            f"{name}: attention, sentence {suffix} (row = step read, column = token attended)",
            path.with_name(f"{path.stem}.{suffix}.png"),
            xlabel="token attended",
            ylabel="step read",
        )


COMMON_DEVIATIONS = [
    "- GloVe 6B 50d (lowercased) instead of 840B 300d; out-of-vocabulary words read as `<unk>` instead of "
    "being dropped; `<s>`, `</s>`, `<number>`, `<unk>` get fixed seeded U(-0.5, 0.5) vectors (asset "
    "`special_vectors`).",
    "- Masking (docs/MODELS.md §1.4): padded steps leave the memory unchanged, the backward pass reverses each "
    "sentence within its own length, so results never depend on batch composition.",
    "- Adam with warmup instead of SGD 0.1 (docs/MODELS.md §1.9, §4).",
]


def pointer_text(pointer: str, window: int) -> str:
    """The pointer as a card names it."""
    return f"VLMP with window w={window}" if pointer == "vlmp" else "FLMP"


def attention_row_text(pointer: str, window: int, averaged: str) -> str:
    """What row t of a served attention map holds; `averaged` says what it is averaged over (heads, members)."""
    if pointer == "vlmp":
        return (
            f"the weights, {averaged}, that the memory row gave to the tokens of its window "
            f"(tokens t-{window - 1}..t) while reading token t"
        )
    return (
        f"the weight, {averaged}, that the memory row gave to token t while reading it "
        "(FLMP sees one token per step, so the map is diagonal)"
    )


def attention_maps_text(row_text: str) -> str:
    """The card's paragraph on the served attention maps, row t being `row_text`."""
    return (
        f"The service returns, per sentence, a `len(tokens) x len(tokens)` matrix. Row t is {row_text}. "
        "The encoder reads each sentence forward and reversed; the reversed pass's map is re-indexed to the "
        "original token order and the two maps are averaged: `combined = (forward + backward) / 2`. Entries are "
        "non-negative; a row sums to less than 1 by the weight the memory kept on itself. Tokens include the "
        "`<s>` and `</s>` markers."
    )


def write_card(path: Path, name: str, result: dict, parity: float, example, size_mb: float, notes: str = "") -> None:
    """The model card in markdown."""
    config, test, trial = result["config"], result["test"], result["trial"]
    pointer, window = config["pointer"], config["window"]
    paper = PAPER[pointer]
    lines = [
        f"# {name}",
        "",
        f"LSTM_RMC (Ahmed & Mercer 2020), {pointer_text(pointer, window)}, trained on SICK for relatedness "
        "(SICK-R) and entailment (SICK-E) with one shared Relational Memory encoder and two heads. Code: "
        "`models/rmc.py`.",
        "",
        "## Test metrics (SICK test, 4,927 pairs; model selected on SICK trial)",
        "",
        *metrics_table(test, trial, paper, "this model", "paper (same pointer, GloVe 840B 300d)"),
        "",
        "## Training",
        "",
        f"- Command: `{result['command']}`",
        f"- Seed {result['seed']}; {result['epochs_run']} epochs run, best trial (Pearson r + accuracy) at epoch "
        f"{result['best_epoch']}; wall time {duration(result['wall_seconds'])} ({cpu_threads(result)}, shared "
        "machine).",
        f"- Optimiser: {result['optimizer']}. Loss: KL(target || predicted) with the Tai et al. target "
        "distribution (batch mean) + entailment cross-entropy.",
        f"- Sizes: {config['num_heads']} heads x {config['head_size']} = memory width "
        f"{config['num_heads'] * config['head_size']}, 1 slot, 1 attention block, 2 distinct MLP layers with "
        f"ReLU, gate style 'unit', fc {config['fc_dim']}, dropout {config['dropout_relatedness']} (R head) / "
        f"{config['dropout_entailment']} (E head); {size_mb:.1f} MB ONNX.",
        "",
        *data_files_table(result),
        "",
        f"![training curve]({name}.curve.png)",
        "",
        "## Deviations from the paper and why (docs/MODELS.md)",
        "",
        "- **One encoder, two heads, trained jointly** (the spec trains the heads separately): one service call "
        "returns relatedness and entailment from a single encoder pass, half the serving cost and one training "
        "run per pointer on this 2-core machine. Selection on trial uses Pearson r + accuracy.",
        *_size_deviations(config),
        *COMMON_DEVIATIONS,
        "",
        "## Attention maps",
        "",
        attention_maps_text(attention_row_text(pointer, window, f"averaged over the {config['num_heads']} heads")),
        "",
        f'Example (test pair): "{example.sentence_a}" / "{example.sentence_b}" (gold relatedness '
        f"{example.relatedness}, {ENTAILMENT_LABELS[example.entailment]}).",
        "",
        f"![attention, sentence a]({name}.attention.a.png)",
        f"![attention, sentence b]({name}.attention.b.png)",
        "",
        "## Export",
        "",
        "- Inputs `emb_a`, `emb_b` [B,T,50] float32 (word vectors looked up in the service; a and b padded to one "
        "T), `len_a`, `len_b` [B] int64. Outputs `relatedness_log_probs` [B,5], `relatedness` [B], "
        "`entailment_logits` [B,3] and `attn_{a,b}_{fwd,bwd}` [B,T,8,K] (memory-row weights per step; K = 1 + w "
        "for VLMP, 2 for FLMP; index 0 is the memory itself).",
        f"- Parity with PyTorch (Python loop) on 64 real SICK trial pairs: max abs diff {parity:.2e} (tolerance 1e-4).",
        f"- Token limit {MAX_TOKENS} per sentence including the markers (SICK's longest is 34).",
        "",
    ]
    path.write_text("\n".join(lines + notes_section(notes)))


def metrics_table(test: dict, trial: dict, paper: dict, ours: str, published: str) -> list[str]:
    """The card's test metrics against the paper's, then its trial line."""
    return [
        f"| metric | {ours} | {published} |",
        "|---|---|---|",
        f"| relatedness Pearson r | {test['pearson']:.4f} | {paper['pearson']:.4f} |",
        f"| relatedness Spearman rho | {test['spearman']:.4f} | - |",
        f"| relatedness MSE | {test['mse']:.4f} | {paper['mse']:.4f} |",
        f"| entailment accuracy | {test['accuracy']:.4f} | {paper['accuracy']:.4f} |",
        "",
        f"Trial (validation): r {trial['pearson']:.4f}, rho {trial['spearman']:.4f}, MSE {trial['mse']:.4f}, "
        f"accuracy {trial['accuracy']:.4f}.",
    ]


def _size_deviations(config: dict) -> list[str]:
    """Card lines for sizes that differ from the spec's M = 512 and fc 512."""
    lines = []
    width = config["num_heads"] * config["head_size"]
    if width != 512:
        lines.append(
            f"- **Memory width {width} ({config['num_heads']} heads x {config['head_size']}) instead of 512**: "
            "2-3x cheaper per epoch on this CPU machine, and two 512-wide heads on a 512-wide encoder would make "
            "a ~28 MB file, over the project's 25 MB limit."
        )
    if config["fc_dim"] != 512:
        lines.append(
            f"- **Pair classifier width {config['fc_dim']} instead of 512**: keeps the file with two heads well "
            "under the project's 25 MB limit."
        )
    return lines


def word_vector_assets(artifacts: Path, name: str, specials: np.ndarray) -> dict:
    """Write what the service's tokenizer looks words up with: the model's special-token vectors and (once per
    directory) the GloVe vocabulary table; return their manifest assets."""
    specials_file = f"{name}.specials.npy"
    np.save(artifacts / specials_file, specials)
    vocabulary = artifacts / VOCABULARY_FILE
    if not vocabulary.exists():
        shutil.copyfile(DEFAULT_VOCABULARY, vocabulary)
    return {"special_vectors": {"file": specials_file}, "vocabulary": {"file": VOCABULARY_FILE}}


def manifest_entry(
    args: argparse.Namespace, onnx_file: Path, config: RMCConfig, test: dict, max_cells: int, assets: dict
) -> dict:
    """The manifest entry of a pair graph (`args`: name, version, default) with its test metrics."""
    paper = PAPER[config.pointer]
    return {
        "name": args.name,
        "task": "similarity",
        "version": args.version,
        "file": onnx_file.name,
        "default": args.default,
        "limits": {"max_tokens": MAX_TOKENS, "max_characters": MAX_CHARACTERS, "max_batch_pairs": MAX_BATCH_PAIRS},
        "batching": {"max_cells": max_cells},
        "metrics": {
            "test_pearson": round(test["pearson"], 4),
            "test_spearman": round(test["spearman"], 4),
            "test_mse": round(test["mse"], 4),
            "test_entailment_accuracy": round(test["accuracy"], 4),
            "paper_pearson": paper["pearson"],
            "paper_mse": paper["mse"],
            "paper_entailment_accuracy": paper["accuracy"],
        },
        "metadata": {
            "pointer": config.pointer,
            "window": config.window,
            "memory_size": config.mem_size,
            "heads": config.num_heads,
            "fc_dim": config.fc_dim,
            "embeddings": "glove-6b-50d",
            "entailment_labels": list(ENTAILMENT_LABELS),
        },
        "assets": assets,
        "card": f"{args.name}.md",
    }


def main(argv: list[str] | None = None) -> None:
    parser = exporter_parser(__doc__, "similarity")
    parser.add_argument("--example-pair", type=int, default=0, help="index of the SICK test pair in the card's figure")
    args = parser.parse_args(argv)
    result = json.loads((args.run / "result.json").read_text())
    model, specials = load_model(args.run)
    vectors = WordVectors.from_glove(specials)
    onnx_file = args.artifacts / f"{args.name}.onnx"
    export_pair_model(model, onnx_file)
    trial = read_split(Path(result["data_files"]["trial"]["file"]))
    parity = check_parity(model, onnx_file, vectors, trial[:64])
    example = read_split(Path(result["data_files"]["test"]["file"]))[args.example_pair]
    attention_figure(args.artifacts / f"{args.name}.attention.png", vectors, onnx_file, example, args.name)
    training_curve(
        result["history"],
        {
            "train loss": "train_loss",
            "trial Pearson r": "trial_pearson",
            "trial MSE": "trial_mse",
            "trial accuracy": "trial_accuracy",
        },
        result["best_epoch"],
        f"{args.name}: training",
        args.artifacts / f"{args.name}.curve.png",
    )
    assets = word_vector_assets(args.artifacts, args.name, specials)
    size_mb = onnx_file.stat().st_size / 1e6
    write_card(args.artifacts / f"{args.name}.md", args.name, result, parity, example, size_mb, args.notes)
    entry = upsert_model(
        args.artifacts,
        manifest_entry(args, onnx_file, model.config, result["test"], MAX_CELLS[model.config.pointer], assets),
    )
    print(f"{args.name}: {onnx_file} ({size_mb:.1f} MB) sha256 {entry['sha256'][:12]} parity {parity:.2e}")


if __name__ == "__main__":
    main()
