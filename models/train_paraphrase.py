"""Train the MSRP paraphrase head on the sentence vectors of a served similarity model (its encoder is frozen).

    python -m models.train_paraphrase --encoder-model rmc-vlmp-sick --data-dir ../shared/data/msrp

Reads only the MSRP train file: a stratified 10% of its pairs (seed `--split-seed`) is the validation split,
the rest trains. The sentence vectors come from the encoder graph of `--encoder-model` in `--artifacts` (the
vectors POST /embeddings serves), computed once and kept in `<out>/features.npz`. Adam on the binary cross
entropy of `models.paraphrase.ParaphraseHead`; after every epoch the validation accuracy is measured and the
best epoch (the earliest among equals) is kept in `best.pt`. The test split is not read here: the exporter
(`python -m export.paraphrase`) evaluates the selected head on it once. The protocol is
docs/protocols/rmc-vlmp-msrp.md. Writes `last.pt`, `best.pt`, `features.npz` and `result.json` into `--out`
(default runs/msrp/<encoder-model>).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from app.core.integrity import sha256_of
from app.tasks.similarity.vectors import WordVectors
from models.cli import (
    add_run_options,
    model_name,
    parse_training_arguments,
    positive_float,
    positive_int,
    probability,
    run_directory,
)
from models.epoch_loop import StoppingRule, TrainingTask, run_epochs
from models.msrp_data import SPLIT_FILES, read_split, stratified_split
from models.paraphrase import ParaphraseHead, cpu_session, sentence_vectors
from models.training import (
    command_line,
    data_dir_default,
    data_file_records,
    load_checkpoint,
    seed_everything,
    set_threads,
    write_json,
)

FEATURES_FILE = "features.npz"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder-model", type=model_name, default="rmc-vlmp-sick", help="a similarity model")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"), help="where --encoder-model is")
    parser.add_argument("--data-dir", type=Path, default=data_dir_default() / "msrp")
    parser.add_argument("--out", type=run_directory, default=None)
    parser.add_argument("--seed", type=int, default=1234, help="weights, dropout and shuffling")
    parser.add_argument("--split-seed", type=int, default=1234, help="the validation split drawn from train")
    parser.add_argument("--valid-fraction", type=probability, default=0.1)
    parser.add_argument("--hidden", type=positive_int, default=512)
    parser.add_argument("--dropout", type=probability, default=0.25)
    parser.add_argument("--lr", type=positive_float, default=1e-3)
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--epochs", type=positive_int, default=60)
    parser.add_argument("--patience", type=positive_int, default=15)
    parser.add_argument("--threads", type=positive_int, default=1)
    add_run_options(parser)
    return parser


def encoder_files(artifacts: Path, name: str) -> tuple[Path, Path]:
    """The encoder graph and special-token vectors of similarity model `name` in the manifest of `artifacts`."""
    manifest = artifacts / "manifest.json"
    entries = {entry["name"]: entry for entry in json.loads(manifest.read_text())["models"]}
    entry = entries.get(name, {})
    if entry.get("task") != "similarity" or "encoder" not in entry.get("graphs", {}):
        raise SystemExit(f"{name} is not a similarity model with an encoder graph in {manifest}")
    return artifacts / entry["graphs"]["encoder"]["file"], artifacts / entry["assets"]["special_vectors"]["file"]


def train_features(out: Path, encoder: Path, specials: Path, pairs: list, threads: int) -> dict[str, np.ndarray]:
    """u, v of every train pair (kept in `<out>/features.npz` for as long as the encoder's sha256 matches)."""
    cache, digest = out / FEATURES_FILE, sha256_of(encoder)
    if cache.exists():
        stored = dict(np.load(cache))
        if str(stored["encoder_sha256"]) == digest and len(stored["u"]) == len(pairs):
            return stored
    started = time.perf_counter()
    vectors = WordVectors.from_glove(np.load(specials))
    session = cpu_session(encoder, threads)
    u = sentence_vectors(session, vectors, [pair.sentence_a for pair in pairs])
    v = sentence_vectors(session, vectors, [pair.sentence_b for pair in pairs])
    seconds = time.perf_counter() - started
    print(f"sentence vectors of {len(pairs)} pairs in {seconds:.0f} s", flush=True)
    features = {"u": u, "v": v, "encoder_sha256": np.array(digest), "seconds": np.array(seconds)}
    out.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **features)
    return features


def binary_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, F1 of the paraphrase class and mean log loss of logits against 0/1 labels."""
    predicted = logits >= 0
    true_positive = float(np.sum(predicted & (labels == 1)))
    f1 = 2 * true_positive / max(1.0, float(predicted.sum() + (labels == 1).sum()))
    loss = F.binary_cross_entropy_with_logits(torch.from_numpy(logits), torch.from_numpy(labels.astype(np.float32)))
    return {"accuracy": float(np.mean(predicted == (labels == 1))), "f1": f1, "log_loss": float(loss)}


def evaluate(head: ParaphraseHead, u: torch.Tensor, v: torch.Tensor, labels: np.ndarray) -> dict[str, float]:
    head.eval()
    with torch.no_grad():
        return binary_metrics(head(u, v).numpy(), labels)


def train_epoch(head, optimizer, u, v, labels, batch: int, generator: torch.Generator) -> float:
    """One pass over the training pairs in a random order; returns the mean loss."""
    head.train()
    total = 0.0
    for rows in torch.randperm(len(u), generator=generator).split(batch):
        loss = F.binary_cross_entropy_with_logits(head(u[rows], v[rows]), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(rows)
    return total / len(u)


def main(argv: list[str] | None = None) -> dict:
    args = parse_training_arguments(build_parser(), argv, lambda args: Path("runs/msrp") / args.encoder_model)
    set_threads(args.threads)
    generator = seed_everything(args.seed)
    train_file = args.data_dir / SPLIT_FILES["train"]
    if not train_file.exists():
        raise SystemExit(f"missing data file {train_file} (set --data-dir or MNEMO_DATA_DIR)")
    pairs = read_split(train_file)
    labels = np.array([pair.paraphrase for pair in pairs])
    train_rows, valid_rows = stratified_split(labels, args.valid_fraction, args.split_seed)
    encoder, specials = encoder_files(args.artifacts, args.encoder_model)
    features = train_features(args.out, encoder, specials, pairs, args.threads)
    u, v = torch.from_numpy(features["u"]), torch.from_numpy(features["v"])
    head = ParaphraseHead(u.shape[1], args.hidden, args.dropout)
    head.standardise_with(u[train_rows], v[train_rows])
    optimizer = torch.optim.Adam(head.parameters(), lr=args.lr)
    train_labels = torch.from_numpy(labels[train_rows].astype(np.float32))
    print(f"{len(train_rows)} train / {len(valid_rows)} validation pairs, {u.shape[1]}-d sentence vectors", flush=True)
    config = {"width": u.shape[1], "hidden": args.hidden, "dropout": args.dropout}
    task = TrainingTask(
        model=head,
        optimizer=optimizer,
        train_epoch=lambda: train_epoch(
            head, optimizer, u[train_rows], v[train_rows], train_labels, args.batch, generator
        ),
        validate=lambda: evaluate(head, u[valid_rows], v[valid_rows], labels[valid_rows]),
        score=lambda metrics: metrics["accuracy"],
        split="valid",
        best_payload={"config": config},
        save_extra=lambda: {"generator": generator.get_state()},
        load_extra=lambda checkpoint: generator.set_state(checkpoint["generator"]),
    )
    state = run_epochs(task, args.out, StoppingRule(epochs=args.epochs, patience=args.patience), resume=args.resume)
    head.load_state_dict(load_checkpoint(args.out / "best.pt")["model"])
    best = state["history"][state["best_epoch"] - 1]
    result = {
        "command": command_line("models.train_paraphrase", argv),
        "encoder_model": args.encoder_model,
        "encoder_sha256": str(features["encoder_sha256"]),
        "seed": args.seed,
        "split_seed": args.split_seed,
        "valid_fraction": args.valid_fraction,
        "config": config,
        "lr": args.lr,
        "batch": args.batch,
        "epochs": args.epochs,
        "patience": args.patience,
        "threads": args.threads,
        "data_files": data_file_records({"train": train_file}),
        "pairs": {"train": len(train_rows), "valid": len(valid_rows)},
        "best_epoch": state["best_epoch"],
        "epochs_run": state["epoch"],
        "valid": {name.removeprefix("valid_"): value for name, value in best.items() if name.startswith("valid_")},
        "feature_seconds": float(features["seconds"]),
        "wall_seconds": state["wall_seconds"],
        "history": state["history"],
    }
    write_json(args.out / "result.json", result)
    print(f"best epoch {state['best_epoch']}: valid accuracy {result['valid']['accuracy']:.4f}", flush=True)
    return result


if __name__ == "__main__":
    main()
