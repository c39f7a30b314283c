"""The training loop both training commands share: epochs, validation, early stopping, checkpoints, resume.

A command describes its task with a `TrainingTask` (how to run one epoch, how to validate, how to score)
and calls `run_epochs`. Every epoch ends with `<out>/last.pt` (weights, optimizer, the task's extra
state such as schedulers and random generators, and the loop state), so `resume=True` continues after
an interrupted run exactly where it stopped; the epoch with the best score is kept in `<out>/best.pt`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.training import load_checkpoint, save_checkpoint


@dataclass(frozen=True)
class StoppingRule:
    """Stop after `epochs`, after `patience` epochs without a better score, or after `max_minutes` of training."""

    epochs: int
    patience: int
    max_minutes: float = math.inf


@dataclass
class TrainingTask:
    """What a training command plugs into the shared loop."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_epoch: Callable[[], float]  # one pass over the training data; returns the mean training loss
    validate: Callable[[], dict[str, float]]  # metrics on the held-out split (validation fold, SICK trial)
    score: Callable[[dict[str, float]], float]  # selection score of those metrics, higher is better
    split: str  # name of the held-out split, the prefix of its metrics in the history ("valid", "trial")
    best_payload: dict[str, Any]  # saved with the best weights (config, recipe, ...) for the exporter
    save_extra: Callable[[], dict[str, Any]] = dict  # further state for last.pt (schedulers, generators)
    load_extra: Callable[[dict[str, Any]], None] = lambda checkpoint: None
    after_validation: Callable[[dict[str, float]], None] = lambda metrics: None  # e.g. a plateau scheduler
    state: dict[str, Any] = field(
        default_factory=lambda: {
            "epoch": 0,
            "history": [],
            "best_score": -math.inf,
            "best_epoch": 0,
            "wall_seconds": 0.0,
        }
    )


def resume_from(task: TrainingTask, out: Path) -> bool:
    """Load `<out>/last.pt` into the task if it exists; return whether it did."""
    if not (out / "last.pt").exists():
        return False
    checkpoint = load_checkpoint(out / "last.pt")
    task.model.load_state_dict(checkpoint["model"])
    task.optimizer.load_state_dict(checkpoint["optimizer"])
    task.load_extra(checkpoint)
    if "torch_rng" in checkpoint:  # dropout masks; absent from checkpoints older than this loop
        torch.set_rng_state(checkpoint["torch_rng"])
    task.state = checkpoint["state"]
    if "best_auc" in task.state:  # checkpoints written by train_kt before this loop was shared
        task.state["best_score"] = task.state.pop("best_auc")
    print(f"resumed at epoch {task.state['epoch']}", flush=True)
    return True


def should_continue(state: dict[str, Any], rule: StoppingRule) -> bool:
    """Whether another epoch may start."""
    return (
        state["epoch"] < rule.epochs
        and state["epoch"] - state["best_epoch"] < rule.patience
        and state["wall_seconds"] < rule.max_minutes * 60
    )


def run_epochs(task: TrainingTask, out: Path, rule: StoppingRule, resume: bool = False) -> dict[str, Any]:
    """Train until the stopping rule says stop; return the loop state (history, best epoch, wall time)."""
    if resume:
        resume_from(task, out)
    state = task.state
    while should_continue(state, rule):
        started = time.perf_counter()
        loss = task.train_epoch()
        metrics = task.validate()
        task.after_validation(metrics)
        state["epoch"] += 1
        state["wall_seconds"] += time.perf_counter() - started
        state["history"].append(
            {
                "epoch": state["epoch"],
                "train_loss": loss,
                **{f"{task.split}_{name}": value for name, value in metrics.items()},
                "lr": task.optimizer.param_groups[0]["lr"],
            }
        )
        score = task.score(metrics)
        if score > state["best_score"]:
            state["best_score"], state["best_epoch"] = score, state["epoch"]
            save_checkpoint(out / "best.pt", {"model": task.model.state_dict(), **task.best_payload})
        shown = " ".join(f"{name} {value:.4f}" for name, value in metrics.items())
        print(
            f"epoch {state['epoch']:3d}  loss {loss:.4f}  {task.split} {shown}  "
            f"best {state['best_score']:.4f}@{state['best_epoch']}  ({time.perf_counter() - started:.1f}s)",
            flush=True,
        )
        save_checkpoint(
            out / "last.pt",
            {
                "model": task.model.state_dict(),
                "optimizer": task.optimizer.state_dict(),
                **task.save_extra(),
                "torch_rng": torch.get_rng_state(),
                "state": state,
            },
        )
    return state
