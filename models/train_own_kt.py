"""Train DKVMN (or DKT) on a user's own answer log, a CSV (models/answer_log.py); `mnemo train kt` runs it.

The protocol is fixed here, before any test evaluation, and written to `<run>/protocol.json` when a run starts:

- split by student (seeded, `models.answer_log.split_students`): train, validation and test;
- selection on validation only: the epoch with the highest validation AUC (the earlier on a tie), training
  stopping after `--epochs` epochs or `PATIENCE` epochs without a better one;
- the test split is evaluated once, on the selected weights, after training; a run directory that holds a
  result is never trained or evaluated again (start a new one);
- next to the model's test AUC, the per-question-mean baseline's on the same test split: each question's mean
  correctness on the training split (the training split's overall mean for a question it lacks).

Each epoch ends with `<run>/last.pt`, so `--resume` continues an interrupted run where it stopped.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from app.core.integrity import sha256_of
from models.answer_log import AnswerLog, split_students
from models.dkt import DKTConfig
from models.dkvmn import DKVMNConfig
from models.epoch_loop import StoppingRule, TrainingTask, run_epochs
from models.kt_data import Sequences, Student, to_sequences
from models.own_run import check_run_dir, run_record
from models.train_kt import (
    build_model,
    build_optimizer,
    evaluate,
    restore_schedule_and_shuffling,
    step_scheduler,
    train_epoch,
)
from models.training import load_checkpoint, seed_everything, set_threads, write_json
from models.user_csv import TEST_SHARE, VALID_SHARE

SEQLEN, BATCH = 200, 32  # BATCH, or every training sequence when fewer: an epoch drops its incomplete last batch
DKVMN_SIZES = dict(memory_size=20, key_dim=50, value_dim=100)
DKT_HIDDEN = 200
PATIENCE = 5
SELECTION_RULE = (
    "the epoch with the highest validation AUC (the earlier on a tie); training stops after the epoch limit or "
    f"{PATIENCE} epochs without a better validation AUC; the test split is evaluated once, on those weights"
)


@dataclass(frozen=True)
class Run:
    """What one `mnemo train kt` run is asked to do."""

    csv: Path
    run_dir: Path
    model: str  # dkvmn | dkt
    epochs: int
    seed: int
    threads: int = 1
    resume: bool = False
    progress: bool = True


def protocol_of(run: Run, log: AnswerLog, splits: dict[str, list[str]]) -> dict:
    """The protocol record: the data, the split, the recipe and the selection rule, before training starts."""
    return {
        "data": {"file": str(run.csv), "sha256": sha256_of(run.csv), "answers": log.n_answers},
        "questions": log.n_questions,
        "split": {
            "by": "student",
            "seed": run.seed,
            "shares": {"valid": VALID_SHARE, "test": TEST_SHARE},
            "students": {name: len(ids) for name, ids in splits.items()},
        },
        "model": run.model,
        "max_epochs": run.epochs,
        "patience": PATIENCE,
        "seqlen": SEQLEN,
        "batch": min(BATCH, len(sequences_of(log, splits["train"]).lengths)),
        "selection": SELECTION_RULE,
    }


def sequences_of(log: AnswerLog, student_ids: list[str]) -> Sequences:
    return to_sequences([log.students[student] for student in student_ids], SEQLEN)


def per_question_mean_auc(train: list[Student], test: list[Student], n_questions: int) -> float:
    """Test AUC of predicting each answer by its question's mean correctness on the training split."""
    questions = np.concatenate([student.questions for student in train])
    answers = np.concatenate([student.responses for student in train]).astype(np.float64)
    counts = np.bincount(questions, minlength=n_questions + 1)
    sums = np.bincount(questions, weights=answers, minlength=n_questions + 1)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), answers.mean())
    test_questions = np.concatenate([student.questions for student in test])
    test_answers = np.concatenate([student.responses for student in test])
    return float(roc_auc_score(test_answers, means[test_questions]))


def model_config(kind: str, n_questions: int) -> DKVMNConfig | DKTConfig:
    if kind == "dkt":
        return DKTConfig(n_questions=n_questions, hidden_dim=DKT_HIDDEN)
    return DKVMNConfig(n_questions=n_questions, **DKVMN_SIZES)


def train(run: Run, log: AnswerLog, command: str) -> dict:
    """Train, select on validation, evaluate the test split once; write and return `<run>/result.json`."""
    splits = split_students(log, run.seed)
    protocol = protocol_of(run, log, splits)
    finished = check_run_dir(run.run_dir, run.resume, protocol)
    if finished is not None:
        print(f"{run.run_dir} holds this finished run: exporting it again, without training or testing")
        return finished
    write_json(run.run_dir / "protocol.json", protocol)
    set_threads(run.threads)
    generator = seed_everything(run.seed)
    data = {name: sequences_of(log, ids) for name, ids in splits.items()}
    recipe = {"n_questions": log.n_questions, "seqlen": SEQLEN, "batch": protocol["batch"]}
    config = model_config(run.model, log.n_questions)
    model = build_model(config)
    options = argparse.Namespace(optimizer="adam", lr=None, clip=None)
    optimizer, scheduler, optimizer_text = build_optimizer(options, recipe, model)
    print(
        f"{run.csv.name}: {log.n_answers} answers, {log.n_questions} questions; students "
        + ", ".join(f"{name} {len(ids)}" for name, ids in splits.items())
    )
    task = TrainingTask(
        model=model,
        optimizer=optimizer,
        train_epoch=lambda: train_epoch(
            model, optimizer, data["train"], recipe["batch"], generator, options.clip, run.progress
        ),
        validate=lambda: evaluate(model, data["valid"], 256),
        score=lambda metrics: metrics["auc"],
        split="valid",
        best_payload={"config": config.to_dict(), "recipe": recipe},
        save_extra=lambda: {"scheduler": scheduler.state_dict(), "generator": generator.get_state()},
        load_extra=lambda checkpoint: restore_schedule_and_shuffling(checkpoint, scheduler, generator),
        after_validation=lambda metrics: step_scheduler(scheduler, metrics["auc"]),
    )
    started = time.perf_counter()
    state = run_epochs(task, run.run_dir, StoppingRule(epochs=run.epochs, patience=PATIENCE), resume=run.resume)
    model.load_state_dict(load_checkpoint(run.run_dir / "best.pt")["model"])
    students = {name: [log.students[student] for student in ids] for name, ids in splits.items()}
    result = {
        "run": run_record(run),
        "command": command,
        "model": run.model,
        "seed": run.seed,
        "protocol": protocol,
        "config": config.to_dict(),
        "recipe": recipe,
        "optimizer": optimizer_text,
        "epochs_run": state["epoch"],
        "best_epoch": state["best_epoch"],
        "wall_seconds": round(state["wall_seconds"], 1),
        "session_seconds": round(time.perf_counter() - started, 1),
        "threads": run.threads,
        "weights": "best.pt",
        "question_ids": log.question_ids,
        "question_names": log.question_names,
        "valid": evaluate(model, data["valid"], 256),
        "test": evaluate(model, data["test"], 256),  # the one test evaluation
        "baseline_test_auc": per_question_mean_auc(students["train"], students["test"], log.n_questions),
        "history": state["history"],
    }
    write_json(run.run_dir / "result.json", result)
    print(
        f"best epoch {result['best_epoch']}  valid auc {result['valid']['auc']:.4f}  test auc "
        f"{result['test']['auc']:.4f} (per-question-mean baseline {result['baseline_test_auc']:.4f})"
    )
    return result


def held_out(log: AnswerLog, result: dict) -> Sequences:
    """The run's test split, for the exporter's parity check."""
    return sequences_of(log, split_students(log, result["seed"])["test"])


def summary(result: dict) -> str:
    """The run's test number and its baseline's, in one line."""
    return f"test AUC {result['test']['auc']:.4f} (per-question-mean baseline {result['baseline_test_auc']:.4f})"
