"""Select a DKVMN recipe by 5-fold cross-validation on the training split, then refit on all of it.

    python -m models.cv_kt --out runs/kt/statics-n10-cv -- --dataset statics --memory-size 10

Everything after `--` goes to `models.train_kt` unchanged, except what cv_kt sets for each fold itself
(`--fold`, `--out`, `--resume`, `--overwrite`, `--refit-full`: refused there). Trains folds 1..5 (each in `<out>/foldK`,
resumable; finished folds are read back, not retrained), writes `<out>/cv.json` with each fold's best
validation AUC and epoch and their mean and spread. With `--refit`, the fold whose best epoch is the
median is resumed with `--refit-full` (once; a finished refit is read back): the model is retrained on
the whole training split for that many epochs, replaying that fold's learning rate. Its `result.json`
then carries the `cv` summary and is what `export.kt` ships. Test numbers are never read here.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

from models import train_kt
from models.cli import run_directory
from models.kt_data import CV_FOLDS
from models.training import command_line, write_json


def fold_result(out: Path, fold: int, train_args: list[str]) -> dict:
    """The finished result of one fold, training (or resuming) it first if needed; a fold finished with other
    arguments of `models.train_kt` is an error, never another recipe's number read back."""
    run = out / f"fold{fold}"
    if (run / "result.json").exists():
        result = json.loads((run / "result.json").read_text())
        trained_with = recipe_of(result["command"])
        if trained_with != train_args:
            raise SystemExit(
                f"{run} was trained with `{shlex.join(trained_with)}`, not `{shlex.join(train_args)}`: "
                "give this recipe its own --out directory"
            )
        return result
    return train_kt.main([*train_args, "--fold", str(fold), "--out", str(run), "--resume"])


def recipe_of(command: str) -> list[str]:
    """The `models.train_kt` arguments of a fold's recorded command (a refitted fold records the cv_kt command:
    those after its `--`), without the ones cv_kt adds per fold."""
    tokens, recipe = shlex.split(command), []
    module, tokens = tokens[2], tokens[3:]  # `python -m <module> ...`
    if module == "models.cv_kt":
        tokens = tokens[tokens.index("--") + 1 :]
    while tokens:
        token = tokens.pop(0)
        if token in ("--fold", "--out"):
            tokens.pop(0)
        elif token != "--resume":
            recipe.append(token)
    return recipe


def summarise(results: list[dict]) -> dict:
    """Per-fold best validation AUC and epoch, with their mean and sample standard deviation."""
    aucs = [r["valid"]["auc"] for r in results]
    epochs = [r["best_epoch"] for r in results]
    return {
        "folds": [{"fold": r["fold"], "valid_auc": r["valid"]["auc"], "best_epoch": r["best_epoch"]} for r in results],
        "valid_auc_mean": statistics.mean(aucs),
        "valid_auc_std": statistics.stdev(aucs) if len(aucs) > 1 else 0.0,
        "best_epoch_median": statistics.median_low(epochs),
        "wall_seconds": round(sum(r["wall_seconds"] for r in results), 1),
        "threads": max(r.get("threads", 1) for r in results),
    }


CHOSEN_BY_CV = frozenset({"--fold", "--out", "--resume", "--overwrite", "--refit-full"})  # per fold, set by cv_kt


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=run_directory, required=True, help="run directory of this recipe")
    parser.add_argument("--refit", action="store_true", help="refit the median fold on the whole training split")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of models.train_kt")
    args = parser.parse_args(argv)
    train_args = [a for a in args.train_args if a != "--"]
    chosen_here = sorted({a.split("=")[0] for a in train_args} & CHOSEN_BY_CV)
    if chosen_here:  # each fold gets its own: a value given here would be silently overridden
        parser.error(f"{', '.join(chosen_here)} after -- : cv_kt chooses these itself (use cv_kt's own --out)")
    results = [fold_result(args.out, fold, train_args) for fold in range(1, CV_FOLDS + 1)]
    cv = summarise(results)
    write_json(args.out / "cv.json", {"train_args": train_args, **cv})
    per_fold = ", ".join(f"{row['valid_auc']:.4f}@{row['best_epoch']}" for row in cv["folds"])
    print(f"cv: valid auc {cv['valid_auc_mean']:.4f} +- {cv['valid_auc_std']:.4f} ({per_fold})", flush=True)
    if not args.refit:
        return cv
    median_fold = next(r for r in results if r["best_epoch"] == cv["best_epoch_median"])
    run = args.out / f"fold{median_fold['fold']}"
    result = median_fold
    if not result.get("refit"):  # a finished refit is read back, not repeated
        result = train_kt.main(
            [*train_args, "--fold", str(result["fold"]), "--out", str(run), "--resume", "--refit-full"]
        )
    result["cv"] = cv
    result["command"] = command_line("models.cv_kt", argv)
    write_json(run / "result.json", result)
    return result


if __name__ == "__main__":
    main()
