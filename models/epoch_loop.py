"""The training loop both training commands share: epochs, validation, early stopping, checkpoints, resume.

A command describes its task with a `TrainingTask` (how to run one epoch, how to validate, how to score)
and calls `run_epochs`. Every epoch ends with `<out>/last.pt` (weights, optimizer, the task's extra
state such as schedulers and random generators, and the loop state), so `resume=True` continues after
an interrupted run exactly where it stopped; the epoch with the best score is kept in `<out>/best.pt`.

With `TrainingTask.average_from = K` the loop also keeps the equal-weight mean of the weights at the end of
epochs K, K+1, ... (stochastic weight averaging, Izmailov et al. 2018), validates that averaged model after
each epoch next to the raw one, and selection takes whichever of the two scores best: `best.pt` then holds
the averaged weights and says which epochs they average. The running sum is saved in `last.pt`, so a
resumed run averages the same snapshots; resuming with a different K is refused.
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
    average_from: int = 0  # average the weights of epochs K, K+1, ... and select among them too (0: off)
    state: dict[str, Any] = field(
        default_factory=lambda: {
            "epoch": 0,
            "history": [],
            "best_score": -math.inf,
            "best_epoch": 0,
            "wall_seconds": 0.0,
        }
    )


class WeightAverage:
    """Equal-weight mean of a model's weights at several epoch ends (float tensors are summed in float64;
    other buffers, if any, are taken from the latest snapshot)."""

    def __init__(self, saved: dict[str, Any] | None = None) -> None:
        saved = saved or {"sums": {}, "count": 0, "first_epoch": 0, "last_epoch": 0}
        self.sums: dict[str, torch.Tensor] = saved["sums"]
        self.count: int = saved["count"]
        self.first_epoch: int = saved["first_epoch"]
        self.last_epoch: int = saved["last_epoch"]

    def add(self, model: torch.nn.Module, epoch: int) -> None:
        for name, tensor in model.state_dict().items():
            tensor = tensor.detach()
            if tensor.is_floating_point():
                summed = tensor.to(torch.float64)
                self.sums[name] = summed.clone() if self.count == 0 else self.sums[name] + summed
            else:
                self.sums[name] = tensor.clone()
        self.first_epoch = self.first_epoch or epoch
        self.last_epoch = epoch
        self.count += 1

    def weights(self, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The mean, in the dtypes of `like` (the model's own state dict)."""
        return {
            name: (self.sums[name] / self.count).to(tensor.dtype) if tensor.is_floating_point() else self.sums[name]
            for name, tensor in like.items()
        }

    def to_dict(self) -> dict[str, Any]:
        return {"sums": self.sums, "count": self.count, "first_epoch": self.first_epoch, "last_epoch": self.last_epoch}


def resume_from(task: TrainingTask, out: Path) -> dict[str, Any] | None:
    """Load `<out>/last.pt` into the task if it exists; return that checkpoint (None if there was none)."""
    if not (out / "last.pt").exists():
        print(f"--resume: no checkpoint in {out} (no last.pt): starting a new run", flush=True)
        return None
    checkpoint = load_checkpoint(out / "last.pt")
    saved_from = checkpoint["state"].get("average_from", 0)
    if saved_from != task.average_from:
        raise SystemExit(
            f"{out / 'last.pt'} was trained with weight averaging from epoch {saved_from} (0: none); "
            f"resuming it with {task.average_from} would average other snapshots: rerun with the same "
            "setting or start a new run directory"
        )
    task.model.load_state_dict(checkpoint["model"])
    task.optimizer.load_state_dict(checkpoint["optimizer"])
    task.load_extra(checkpoint)
    if "torch_rng" in checkpoint:  # dropout masks; absent from checkpoints older than this loop
        torch.set_rng_state(checkpoint["torch_rng"])
    task.state = checkpoint["state"]
    if "best_auc" in task.state:  # checkpoints written by train_kt before this loop was shared
        task.state["best_score"] = task.state.pop("best_auc")
    print(f"resumed at epoch {task.state['epoch']}", flush=True)
    return checkpoint


def should_continue(state: dict[str, Any], rule: StoppingRule) -> bool:
    """Whether another epoch may start."""
    return (
        state["epoch"] < rule.epochs
        and state["epoch"] - state["best_epoch"] < rule.patience
        and state["wall_seconds"] < rule.max_minutes * 60
    )


def run_epochs(task: TrainingTask, out: Path, rule: StoppingRule, resume: bool = False) -> dict[str, Any]:
    """Train until the stopping rule says stop; return the loop state (history, best epoch, wall time)."""
    checkpoint = resume_from(task, out) if resume else None
    average = WeightAverage(None if checkpoint is None else checkpoint.get("average"))
    state = task.state
    state["average_from"] = task.average_from
    while should_continue(state, rule):
        started = time.perf_counter()
        loss = task.train_epoch()
        metrics = task.validate()
        task.after_validation(metrics)
        state["epoch"] += 1
        row = {
            "epoch": state["epoch"],
            "train_loss": loss,
            **{f"{task.split}_{name}": value for name, value in metrics.items()},
            "lr": task.optimizer.param_groups[0]["lr"],
        }
        raw = task.model.state_dict()
        averaging = task.average_from and state["epoch"] >= task.average_from
        if averaging:  # the averaged weights are loaded over the model's own: keep a copy of these
            raw = {name: tensor.clone() for name, tensor in raw.items()}
        candidates = [("raw", metrics, raw, None)]
        if averaging:
            average.add(task.model, state["epoch"])
            averaged = average.weights(raw)
            task.model.load_state_dict(averaged)
            averaged_metrics = task.validate()  # evaluation mode: draws no random numbers
            task.model.load_state_dict(raw)
            row.update({f"{task.split}_average_{name}": value for name, value in averaged_metrics.items()})
            candidates.append(("average", averaged_metrics, averaged, [average.first_epoch, average.last_epoch]))
        state["wall_seconds"] += time.perf_counter() - started
        state["history"].append(row)
        for kind, candidate_metrics, weights, epochs in candidates:
            score = task.score(candidate_metrics)
            if score > state["best_score"]:
                state["best_score"], state["best_epoch"] = score, state["epoch"]
                state["best_weights"], state["best_averaged_epochs"] = kind, epochs
                extra = {} if epochs is None else {"averaged_epochs": epochs}
                save_checkpoint(out / "best.pt", {"model": weights, **task.best_payload, **extra})
        shown = " ".join(f"{name} {value:.4f}" for name, value in metrics.items())
        if len(candidates) > 1:
            shown += f"  average {average.first_epoch}-{average.last_epoch} " + " ".join(
                f"{name} {value:.4f}" for name, value in candidates[1][1].items()
            )
        print(
            f"epoch {state['epoch']:3d}  loss {loss:.4f}  {task.split} {shown}  "
            f"best {state['best_score']:.4f}@{state['best_epoch']} {state.get('best_weights', 'raw')}  "
            f"({time.perf_counter() - started:.1f}s)",
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
                **({"average": average.to_dict()} if task.average_from else {}),
            },
        )
    return state
