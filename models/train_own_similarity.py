"""Train the LSTM_RMC pair model on a user's own scored sentence pairs (models/scored_pairs.py); `mnemo train
similarity` runs it.

The model and its training are the built-in SICK models' (models/train_sim.py): frozen GloVe 6B 50d vectors
looked up with the served tokenizer, one VLMP encoder with a relatedness head and an entailment head, the sizes
of the served SICK members. Without a `label` column the entailment head gets no loss and is not served.

The protocol is fixed here, before any test evaluation, and written to `<run>/protocol.json` when a run starts:

- split by pair (seeded, `models.scored_pairs.split_pairs`): train, validation and test;
- selection on validation only: the epoch with the highest validation Pearson r + entailment accuracy (Pearson r
  alone without labels; the earlier on a tie), training stopping after `--epochs` epochs or `PATIENCE` epochs
  without a better one;
- the test split is evaluated once, on the selected weights, after training; a run directory that holds a
  result is never trained or evaluated again (start a new one);
- next to the model's test numbers, a baseline's on the same test split: the cosine of the two sentences' mean
  GloVe vectors, mapped to 1..5 by a least-squares line fitted on the training split (and, with labels, the
  training split's most frequent label).

Each epoch ends with `<run>/last.pt`, so `--resume` continues an interrupted run where it stopped.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr

from app.core.integrity import sha256_of
from app.tasks.similarity.tokenizer import words
from app.tasks.similarity.vectors import WordVectors, special_vectors
from models.epoch_loop import StoppingRule, TrainingTask, run_epochs
from models.own_run import check_run_dir, run_record
from models.rmc import RMCConfig, SentencePairModel
from models.scored_pairs import ScoredPairs, split_pairs
from models.sick_data import ENTAILMENT_LABELS, SickPair
from models.train_sim import EncodedSplit, evaluate, restore_schedule_and_shuffling, train_epoch
from models.training import load_checkpoint, seed_everything, set_threads, write_json
from models.user_csv import TEST_SHARE, VALID_SHARE

SIZES = dict(pointer="vlmp", window=5, num_heads=4, head_size=32, fc_dim=128)  # the served SICK members'
BATCH, LR, DECAY, CLIP = 16, 3e-4, 0.99, 5.0
PATIENCE = 6


@dataclass(frozen=True)
class Run:
    """What one `mnemo train similarity` run is asked to do."""

    csv: Path
    run_dir: Path
    epochs: int
    seed: int
    threads: int = 1
    resume: bool = False
    progress: bool = True


def selection_rule(labelled: bool) -> str:
    score = "validation Pearson r + entailment accuracy" if labelled else "validation Pearson r"
    return (
        f"the epoch with the highest {score} (the earlier on a tie); training stops after the epoch limit or "
        f"{PATIENCE} epochs without a better score; the test split is evaluated once, on those weights"
    )


def protocol_of(run: Run, data: ScoredPairs, splits: dict[str, list[int]]) -> dict:
    """The protocol record: the data, the split, the recipe and the selection rule, before training starts."""
    return {
        "data": {"file": str(run.csv), "sha256": sha256_of(run.csv), "pairs": len(data.pairs)},
        "labelled": data.labelled,
        "split": {
            "by": "pair",
            "seed": run.seed,
            "shares": {"valid": VALID_SHARE, "test": TEST_SHARE},
            "pairs": {name: len(rows) for name, rows in splits.items()},
        },
        "config": RMCConfig(**SIZES).to_dict(),
        "max_epochs": run.epochs,
        "patience": PATIENCE,
        "batch": BATCH,
        "selection": selection_rule(data.labelled),
    }


def metrics(model: SentencePairModel, split: EncodedSplit, labelled: bool) -> dict[str, float]:
    """Pearson r, Spearman rho and MSE of the relatedness; entailment accuracy when the data has labels."""
    found = evaluate(model, split)
    return found if labelled else {key: value for key, value in found.items() if key != "accuracy"}


def mean_vector(vectors: WordVectors, sentence: str) -> np.ndarray:
    """The mean GloVe vector of the sentence's words that have one (zeros when none has)."""
    rows = vectors.rows_of(words(sentence))
    known = rows[rows >= 0]
    return vectors.matrix[known].mean(0) if len(known) else np.zeros(vectors.matrix.shape[1], dtype=np.float32)


def glove_cosines(vectors: WordVectors, pairs: list[SickPair]) -> np.ndarray:
    a = np.stack([mean_vector(vectors, pair.sentence_a) for pair in pairs]).astype(np.float64)
    b = np.stack([mean_vector(vectors, pair.sentence_b) for pair in pairs]).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norms > 0, (a * b).sum(1) / np.maximum(norms, 1e-12), 0.0)


def baseline(vectors: WordVectors, train: list[SickPair], test: list[SickPair], labelled: bool) -> dict[str, float]:
    """The test numbers of the GloVe mean-vector cosine, mapped to 1..5 by a line fitted on the training split;
    with labels, the accuracy of always answering the training split's most frequent label."""
    gold = np.array([pair.relatedness for pair in train])
    slope, intercept = np.polyfit(glove_cosines(vectors, train), gold, 1)
    predicted = np.clip(slope * glove_cosines(vectors, test) + intercept, 1, 5)
    truth = np.array([pair.relatedness for pair in test])
    found = {
        "pearson": float(pearsonr(predicted, truth)[0]) if np.ptp(predicted) > 0 else 0.0,
        "spearman": float(spearmanr(predicted, truth)[0]) if np.ptp(predicted) > 0 else 0.0,
        "mse": float(np.mean((predicted - truth) ** 2)),
        "train_mean_mse": float(np.mean((gold.mean() - truth) ** 2)),
    }
    if labelled:
        majority = np.bincount([pair.entailment for pair in train], minlength=len(ENTAILMENT_LABELS)).argmax()
        found["accuracy"] = float(np.mean([pair.entailment == majority for pair in test]))
    return found


def train(run: Run, data: ScoredPairs, command: str) -> dict:
    """Train, select on validation, evaluate the test split once; write and return `<run>/result.json`."""
    splits = split_pairs(data, run.seed)
    protocol = protocol_of(run, data, splits)
    finished = check_run_dir(run.run_dir, run.resume, protocol)
    if finished is not None:
        print(f"{run.run_dir} holds this finished run: exporting it again, without training or testing")
        return finished
    write_json(run.run_dir / "protocol.json", protocol)
    set_threads(run.threads)
    seed_everything(run.seed)
    rng = np.random.default_rng(run.seed)
    specials = special_vectors(run.seed)
    vectors = WordVectors.from_glove(specials)
    pairs = {name: [data.pairs[row] for row in rows] for name, rows in splits.items()}
    encoded = {name: EncodedSplit(split, vectors) for name, split in pairs.items()}
    config = RMCConfig(**SIZES)
    model = SentencePairModel(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    steps = math.ceil(len(encoded["train"]) / BATCH)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / steps) * DECAY ** (step // steps)
    )
    options = argparse.Namespace(
        batch=BATCH, clip=CLIP, swap_relatedness=0.0, distill_weight=0.0, no_progress=not run.progress
    )
    print(
        f"{run.csv.name}: {len(data.pairs)} pairs{'' if data.labelled else ' (no labels: relatedness only)'}; "
        + ", ".join(f"{name} {len(rows)}" for name, rows in splits.items())
    )
    task = TrainingTask(
        model=model,
        optimizer=optimizer,
        train_epoch=lambda: train_epoch(model, optimizer, schedule, encoded["train"], rng, options),
        validate=lambda: metrics(model, encoded["valid"], data.labelled),
        score=lambda found: found["pearson"] + found.get("accuracy", 0.0),
        split="valid",
        best_payload={"config": config.to_dict(), "specials": specials},
        save_extra=lambda: {"schedule": schedule.state_dict(), "rng": rng.bit_generator.state},
        load_extra=lambda checkpoint: restore_schedule_and_shuffling(checkpoint, schedule, rng),
    )
    started = time.perf_counter()
    state = run_epochs(task, run.run_dir, StoppingRule(epochs=run.epochs, patience=PATIENCE), resume=run.resume)
    model.load_state_dict(load_checkpoint(run.run_dir / "best.pt")["model"])
    result = {
        "run": run_record(run),
        "command": command,
        "seed": run.seed,
        "protocol": protocol,
        "labelled": data.labelled,
        "config": config.to_dict(),
        "optimizer": f"Adam lr {LR}, 1-epoch linear warmup, x{DECAY}/epoch, clip {CLIP}, batch {BATCH}",
        "epochs_run": state["epoch"],
        "best_epoch": state["best_epoch"],
        "wall_seconds": round(state["wall_seconds"], 1),
        "session_seconds": round(time.perf_counter() - started, 1),
        "threads": run.threads,
        "valid": metrics(model, encoded["valid"], data.labelled),
        "test": metrics(model, encoded["test"], data.labelled),  # the one test evaluation
        "baseline_test": baseline(vectors, pairs["train"], pairs["test"], data.labelled),
        "history": state["history"],
    }
    write_json(run.run_dir / "result.json", result)
    test, base = result["test"], result["baseline_test"]
    print(
        f"best epoch {result['best_epoch']}  test r {test['pearson']:.4f} MSE {test['mse']:.4f}"
        + (f" accuracy {test['accuracy']:.4f}" if data.labelled else "")
        + f" (GloVe-cosine baseline r {base['pearson']:.4f} MSE {base['mse']:.4f})"
    )
    return result


def held_out(data: ScoredPairs, result: dict) -> list[SickPair]:
    """The run's test pairs, for the exporter's parity check."""
    return [data.pairs[row] for row in split_pairs(data, result["seed"])["test"]]


def summary(result: dict) -> str:
    """The run's test numbers and the baseline's, in one line."""
    test, base = result["test"], result["baseline_test"]
    return (
        f"test Pearson r {test['pearson']:.4f}, MSE {test['mse']:.4f} (GloVe-cosine baseline r {base['pearson']:.4f}, "
        f"MSE {base['mse']:.4f})"
    )
