"""Train DKVMN (or the DKT baseline, `--model dkt`) on one knowledge-tracing data set (docs/MODELS.md §2, §4).

    python -m models.train_kt --dataset assist2009 --data-dir ../shared/data/kt

Trains on fold 1, keeps the epoch with the best validation AUC (checkpoint every epoch, `--resume`
continues), and evaluates the published test split once at the end. Writes into `--out`:
`last.pt` (resumable), `best.pt` (best weights and config) and `result.json` (history, metrics,
data hashes, command, seed, wall time), which `export.kt` turns into the ONNX file and model card.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from tqdm import tqdm

from models.cli import (
    add_run_options,
    kt_dataset,
    parse_training_arguments,
    positive_float,
    positive_int,
    probability,
    run_directory,
)
from models.dkt import DKT, DKTConfig
from models.dkvmn import DKVMN, DKVMNConfig
from models.epoch_loop import StoppingRule, TrainingTask, WeightAverage, run_epochs
from models.kt_data import CV_FOLDS, Sequences, cv_split, publishes_all_folds, read_students, split_files, to_sequences
from models.training import (
    command_line,
    data_dir_default,
    data_file_records,
    load_checkpoint,
    save_checkpoint,
    seed_everything,
    set_threads,
    write_json,
)

# Sizes from the authors' main.py (docs/MODELS.md §2.5); epochs/patience are ours (early stopping on valid).
RECIPES = {
    "assist2009": dict(n_questions=110, seqlen=200, batch=32, key_dim=50, value_dim=200, memory_size=20, sgd_lr=0.05),
    "assist2015": dict(n_questions=100, seqlen=200, batch=50, key_dim=50, value_dim=100, memory_size=20, sgd_lr=0.1),
    "statics": dict(n_questions=1223, seqlen=200, batch=10, key_dim=50, value_dim=100, memory_size=50, sgd_lr=0.01),
    "synthetic": dict(n_questions=50, seqlen=50, batch=32, key_dim=10, value_dim=10, memory_size=5, sgd_lr=0.05),
}
STOPPING = {"synthetic": dict(epochs=100, patience=20)}  # others: 40 epochs, patience 8


def recipe_for(dataset: str) -> dict:
    """The recipe of a data set name (`synthetic-vK` shares the synthetic recipe)."""
    family = "synthetic" if dataset.startswith("synthetic") else dataset
    return {**RECIPES[family], **STOPPING.get(family, dict(epochs=40, patience=8))}


def masked_bce_sum(logits: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy summed over valid steps (the authors' objective before the 1/B rescale)."""
    valid = torch.arange(logits.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    losses = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets.float(), reduction="none")
    return (losses * valid).sum()


@torch.no_grad()
def evaluate(model: DKVMN | DKT, data: Sequences, batch: int) -> dict[str, float]:
    """AUC, accuracy (threshold 0.5) and mean BCE over all valid steps, memory reset per sequence."""
    model.eval()
    probabilities, targets = [], []
    for start in range(0, len(data), batch):
        q, r, lengths = (torch.from_numpy(a[start : start + batch]) for a in (data.q, data.r, data.lengths))
        p = torch.sigmoid(model.training_logits(q, r, lengths))
        valid = torch.arange(q.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
        probabilities.append(p[valid].numpy())
        targets.append(r[valid].numpy())
    p, y = np.concatenate(probabilities).astype(np.float64), np.concatenate(targets)
    eps = 1e-7
    bce = -np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))
    return {"auc": float(roc_auc_score(y, p)), "accuracy": float(np.mean((p >= 0.5) == y)), "bce": float(bce)}


def train_epoch(model, optimizer, data: Sequences, batch: int, generator, clip: float, progress: bool) -> float:
    """One shuffled pass (last incomplete batch dropped, as in the code); returns the mean loss per step."""
    model.train()
    order = torch.randperm(len(data), generator=generator).numpy()
    n_batches = len(data) // batch
    total, steps = 0.0, 0
    for index in tqdm(range(n_batches), desc="train", leave=False, disable=not progress):
        rows = order[index * batch : (index + 1) * batch]
        q, r, lengths = (torch.from_numpy(a[rows]) for a in (data.q, data.r, data.lengths))
        loss_sum = masked_bce_sum(model.training_logits(q, r, lengths), r, lengths)
        optimizer.zero_grad()
        (loss_sum / len(rows)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        total += loss_sum.item()
        steps += int(lengths.sum())
    return total / max(steps, 1)


def build_model(config: DKVMNConfig | DKTConfig) -> DKVMN | DKT:
    """The model a config describes."""
    return DKT(config) if isinstance(config, DKTConfig) else DKVMN(config)


def model_config(args: argparse.Namespace, recipe: dict) -> DKVMNConfig | DKTConfig:
    """DKVMN sizes from the recipe (overridden by the flags), or the DKT baseline's."""
    if args.model == "dkt":
        return DKTConfig(n_questions=recipe["n_questions"], hidden_dim=args.hidden, dropout=args.dropout)
    return DKVMNConfig(
        n_questions=recipe["n_questions"],
        memory_size=args.memory_size or recipe["memory_size"],
        key_dim=recipe["key_dim"],
        value_dim=args.value_dim or recipe["value_dim"],
        paper_head=args.paper_head,
        dropout=args.dropout,
        init_std=args.init_std,
    )


def load_run_model(run_dir: Path) -> DKVMN | DKT:
    """The weights a finished run ships (best on validation, or their refit on the whole training split)."""
    result = json.loads((run_dir / "result.json").read_text())
    checkpoint = load_checkpoint(run_dir / result.get("weights", "best.pt"))
    config_class = DKTConfig if result.get("model") == "dkt" else DKVMNConfig
    model = build_model(config_class(**checkpoint["config"]))
    model.load_state_dict(checkpoint["model"])
    return model.eval()


def refit_on_full_train(args, recipe: dict, config, state: dict, data: Sequences, out: Path):
    """Retrain from scratch on the whole training split (every fold's train + valid) for the epochs selected on
    the validation fold, replaying the selection run's learning rate epoch by epoch. If selection picked a
    weight average (`--average-from`), the refit ships the mean of its own weights at the same epoch ends."""
    generator = seed_everything(args.seed)
    model = build_model(config)
    optimizer, _, _ = build_optimizer(args, recipe, model)
    rates = [optimizer.param_groups[0]["lr"]] + [row["lr"] for row in state["history"][: state["best_epoch"] - 1]]
    averaged_epochs = state.get("best_averaged_epochs") if state.get("best_weights") == "average" else None
    average = WeightAverage()
    started = time.perf_counter()
    for epoch, rate in enumerate(rates, start=1):
        for group in optimizer.param_groups:
            group["lr"] = rate
        loss = train_epoch(model, optimizer, data, recipe["batch"], generator, args.clip, not args.no_progress)
        if averaged_epochs and averaged_epochs[0] <= epoch <= averaged_epochs[1]:
            average.add(model, epoch)
        print(f"refit epoch {epoch}/{len(rates)}  lr {rate:g}  loss {loss:.4f}", flush=True)
    weights = model.state_dict()
    if averaged_epochs:
        weights = average.weights(weights)
        model.load_state_dict(weights)
        print(f"refit: shipping the mean of the weights after epochs {averaged_epochs[0]}-{averaged_epochs[1]}")
    extra = {"averaged_epochs": averaged_epochs} if averaged_epochs else {}
    save_checkpoint(out / "final.pt", {"model": weights, "config": config.to_dict(), "recipe": recipe, **extra})
    model.eval()
    return model, {
        "epochs": len(rates),
        "averaged_epochs": averaged_epochs,
        "train_sequences": len(data),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def build_optimizer(args: argparse.Namespace, recipe: dict, model: DKVMN | DKT):
    """Adam with a plateau schedule (ours), or the authors' SGD with momentum and step decay."""
    if args.optimizer == "sgd":  # the authors clip the summed-loss gradient at 50, i.e. 50/B here
        args.clip = args.clip or 50.0 / recipe["batch"]
        lr = args.lr or recipe["sgd_lr"]
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.667)
        return optimizer, scheduler, f"SGD lr {lr} momentum 0.9, x0.667 every 20 epochs, clip {args.clip}"
    args.clip = args.clip or 50.0
    lr = args.lr or 3e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=2)
    return optimizer, scheduler, f"Adam lr {lr}, ReduceLROnPlateau(valid AUC, factor 0.5, patience 2), clip {args.clip}"


def step_scheduler(scheduler, valid_auc: float) -> None:
    """Advance the learning-rate schedule after an epoch (the plateau schedule watches the valid AUC)."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(valid_auc)
    else:
        scheduler.step()


def restore_schedule_and_shuffling(checkpoint: dict, scheduler, generator: torch.Generator) -> None:
    """Put the learning-rate schedule and the shuffling generator back where `last.pt` left them."""
    scheduler.load_state_dict(checkpoint["scheduler"])
    generator.set_state(checkpoint["generator"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dataset", required=True, type=kt_dataset, help="assist2009 | assist2015 | statics | synthetic-vK"
    )
    parser.add_argument("--data-dir", type=Path, default=data_dir_default() / "kt")
    parser.add_argument("--out", type=run_directory, default=None, help="run directory (default runs/kt/<dataset>)")
    parser.add_argument("--epochs", type=positive_int, default=None, help="maximum epochs (default per data set)")
    parser.add_argument(
        "--patience", type=positive_int, default=None, help="epochs without a better valid AUC before stopping"
    )
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="adam (ours) or sgd (authors')")
    parser.add_argument(
        "--lr", type=positive_float, default=None, help="default: Adam 3e-3, SGD the authors' rate per data set"
    )
    parser.add_argument(
        "--clip", type=float, default=None, help="gradient-norm clip on the sum/B loss (default: Adam 50, SGD 50/B)"
    )

    parser.add_argument("--model", choices=("dkvmn", "dkt"), default="dkvmn", help="dkt: the LSTM baseline")
    parser.add_argument("--hidden", type=positive_int, default=200, help="DKT: LSTM state size")
    parser.add_argument("--dropout", type=probability, default=0.0, help="dropout before the output layer")
    parser.add_argument("--memory-size", type=positive_int, default=None, help="concepts N (default per data set)")
    parser.add_argument("--value-dim", type=positive_int, default=None, help="value size d_v (default per data set)")
    parser.add_argument("--paper-head", action="store_true", help="paper predictor (k_t) instead of the code's")
    parser.add_argument(
        "--init-std", type=float, default=DKVMNConfig.init_std, help="DKVMN: std of the N(0, s) initial weights"
    )
    parser.add_argument("--seed", type=int, default=1024)
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--average-from",
        type=int,
        default=0,
        help="from this epoch on, also validate the equal-weight mean of the weights at each epoch end and "
        "let selection pick it (stochastic weight averaging; 0: off); a refit averages the same epochs",
    )
    add_run_options(parser)
    parser.add_argument(
        "--refit-full",
        action="store_true",
        help="after selection on fold 1, retrain on the whole training split for the selected epochs",
    )
    parser.add_argument(
        "--fold",
        type=int,
        default=None,
        choices=range(1, CV_FOLDS + 1),
        metavar=f"1..{CV_FOLDS}",
        help="cross-validation fold: the published trainK/validK files, or for data sets that publish only fold 1 "
        "(synthetic) a seeded 5-way split of the whole training split; default: the published fold 1",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (for log files)")
    return parser


def load_splits(args: argparse.Namespace, recipe: dict) -> tuple[dict[str, Path], dict[str, Sequences]]:
    """The data files this run reads and their sequences: train, valid, test and (for a refit) full."""
    files = split_files(args.data_dir, args.dataset, args.fold or 1)
    derived = args.fold is not None and not publishes_all_folds(args.data_dir, args.dataset)
    if derived:
        del files["train"], files["valid"]
    elif not args.refit_full:
        del files["full"]
    for path in files.values():
        if not path.exists():
            raise SystemExit(f"missing data file {path} (set --data-dir or MNEMO_DATA_DIR)")
    students = {name: read_students(path, recipe["n_questions"]) for name, path in files.items()}
    if derived:
        students["train"], students["valid"] = cv_split(students["full"], args.fold)
    return files, {name: to_sequences(rows, recipe["seqlen"]) for name, rows in students.items()}


def main(argv: list[str] | None = None) -> dict:
    args = parse_training_arguments(build_parser(), argv, lambda args: Path("runs/kt") / args.dataset)
    recipe = recipe_for(args.dataset)
    out = args.out
    set_threads(args.threads)
    generator = seed_everything(args.seed)
    files, splits = load_splits(args, recipe)
    config = model_config(args, recipe)
    model = build_model(config)
    optimizer, scheduler, optimizer_text = build_optimizer(args, recipe, model)
    print(
        f"{args.dataset}: {len(splits['train'])} train / {len(splits['valid'])} valid / "
        f"{len(splits['test'])} test sequences"
    )
    task = TrainingTask(
        model=model,
        optimizer=optimizer,
        train_epoch=lambda: train_epoch(
            model, optimizer, splits["train"], recipe["batch"], generator, args.clip, not args.no_progress
        ),
        validate=lambda: evaluate(model, splits["valid"], 256),
        score=lambda metrics: metrics["auc"],
        split="valid",
        best_payload={"config": config.to_dict(), "recipe": recipe},
        save_extra=lambda: {"scheduler": scheduler.state_dict(), "generator": generator.get_state()},
        load_extra=lambda checkpoint: restore_schedule_and_shuffling(checkpoint, scheduler, generator),
        after_validation=lambda metrics: step_scheduler(scheduler, metrics["auc"]),
        average_from=args.average_from,
    )
    rule = StoppingRule(epochs=args.epochs or recipe["epochs"], patience=args.patience or recipe["patience"])
    state = run_epochs(task, out, rule, resume=args.resume)
    model.load_state_dict(load_checkpoint(out / "best.pt")["model"])
    valid = evaluate(model, splits["valid"], 256)
    refit = None
    if args.refit_full:
        model, refit = refit_on_full_train(args, recipe, config, state, splits["full"], out)
    result = {
        "dataset": args.dataset,
        "model": args.model,
        "fold": args.fold or 1,
        "command": command_line("models.train_kt", argv),
        "seed": args.seed,
        "config": config.to_dict(),
        "recipe": recipe,
        "optimizer": optimizer_text,
        "data_files": data_file_records(files),
        "epochs_run": state["epoch"],
        "best_epoch": state["best_epoch"],
        "average_from": args.average_from,
        "best_weights": state.get("best_weights", "raw"),  # "average": the mean of best_averaged_epochs
        "best_averaged_epochs": state.get("best_averaged_epochs"),
        "wall_seconds": round(state["wall_seconds"], 1),
        "threads": args.threads,
        "weights": "final.pt" if refit else "best.pt",
        "refit": refit,
        "valid": valid,
        "test": evaluate(model, splits["test"], 256),
        "history": state["history"],
    }
    write_json(out / "result.json", result)
    print(
        f"{args.dataset}: best epoch {result['best_epoch']}  valid auc {result['valid']['auc']:.4f}  "
        f"test auc {result['test']['auc']:.4f} acc {result['test']['accuracy']:.4f}"
    )
    return result


if __name__ == "__main__":
    main()
