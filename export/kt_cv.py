"""The fold spread of cross-validated DKVMN recipes, as a model-card section.

    python -m export.kt_cv --card artifacts/dkvmn-assist2009.md --cv-dir /work/runs/kt/assist2009-base-cv

Reads the finished folds (`foldK/result.json`) of each `models.cv_kt` run directory, so a cross-validation
that is still running or was stopped is reported with the folds it finished. The first directory is the
recipe of the card's model; any others are the candidates it was compared with. `export.kt --cv-dir` writes
the same section into a freshly generated card; this command rewrites it in a card whose training run is
not at hand (the section sits between two markers, or goes before `## Training`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

from export.cards import cpu_threads, duration
from models.cv_kt import summarise
from models.kt_data import CV_FOLDS

BEGIN, END = "<!-- fold-spread -->", "<!-- /fold-spread -->"
FOLD_FLAGS = {"--fold": 1, "--out": 1, "--resume": 0}  # flags cv_kt adds per fold, with their value count


def finished_folds(cv_dir: Path) -> list[dict]:
    """The result of every finished fold of a cross-validation run, in fold order."""
    paths = sorted(cv_dir.glob("fold*/result.json"), key=lambda path: int(path.parent.name.removeprefix("fold")))
    return [json.loads(path.read_text()) for path in paths]


def recipe_arguments(cv_dir: Path, folds: list[dict]) -> list[str]:
    """The `models.train_kt` arguments of the recipe: from cv.json, else from a fold's recorded command."""
    if (cv_dir / "cv.json").exists():
        return json.loads((cv_dir / "cv.json").read_text())["train_args"]
    tokens = shlex.split(folds[0]["command"])[3:]  # drop `python -m <module>`
    if "--" in tokens:  # older runs recorded the cv_kt command line itself
        return tokens[tokens.index("--") + 1 :]
    arguments, index = [], 0
    while index < len(tokens):
        skip = FOLD_FLAGS.get(tokens[index])
        if skip is None:
            arguments.append(tokens[index])
        index += 1 + (skip or 0)
    return arguments


def recipe_summary(cv_dir: Path) -> dict | None:
    """Spread of one recipe's finished folds (None if none finished), with its command and fold test AUCs."""
    folds = finished_folds(cv_dir)
    if not folds:
        return None
    arguments = recipe_arguments(cv_dir, folds)
    return {
        **summarise(folds),
        "command": shlex.join(["python", "-m", "models.cv_kt", "--out", str(cv_dir), "--", *arguments]),
        "published_folds": "train" in folds[0]["data_files"],
        "fold_test_auc": [fold["test"]["auc"] for fold in folds],
    }


def _fold_list(summary: dict) -> str:
    return ", ".join(f"{row['valid_auc']:.4f} (epoch {row['best_epoch']})" for row in summary["folds"])


def section(cv_dirs: list[Path]) -> list[str]:
    """The card section: the model's recipe and its fold spread, then the candidates it was compared with."""
    summaries = [(cv_dir, recipe_summary(cv_dir)) for cv_dir in cv_dirs]
    summaries = [(cv_dir, summary) for cv_dir, summary in summaries if summary]
    if not summaries:
        return []
    recipe = summaries[0][1]
    finished = len(recipe["folds"])
    folds_text = (
        "the published `trainK`/`validK` folds"
        if recipe["published_folds"]
        else "the set publishes fold 1 only, so its training students are split into five folds by a seeded shuffle"
    )
    lines = [
        BEGIN,
        "## Fold spread (5-fold cross-validation on the training split)",
        "",
        f"Recipe of this model, `{recipe['command']}` ({folds_text}). Best validation AUC per fold: "
        f"{_fold_list(recipe)}; mean {recipe['valid_auc_mean']:.4f}, sample std {recipe['valid_auc_std']:.4f}, "
        f"range {min(r['valid_auc'] for r in recipe['folds']):.4f} to "
        f"{max(r['valid_auc'] for r in recipe['folds']):.4f}; {duration(recipe['wall_seconds'])} at "
        f"{cpu_threads(recipe)}.",
    ]
    if finished < CV_FOLDS:
        lines[-1] += f" Only {finished} of the {CV_FOLDS} folds finished in the time available."
    lines += [
        "",
        "The test AUC each fold model printed at the end of its run (never used to choose): "
        + ", ".join(f"{auc:.4f}" for auc in recipe["fold_test_auc"])
        + f" (mean {statistics.mean(recipe['fold_test_auc']):.4f}).",
        "",
    ]
    if len(summaries) > 1:
        lines += [
            "Recipes compared on the same folds (selection by the mean validation AUC only):",
            "",
            "| recipe (`models.cv_kt` run) | folds | mean valid AUC | std | per fold |",
            "|---|---|---|---|---|",
            *[
                f"| `{cv_dir.name}` | {len(s['folds'])} | {s['valid_auc_mean']:.4f} | {s['valid_auc_std']:.4f} "
                f"| {_fold_list(s)} |"
                for cv_dir, s in summaries
            ],
            "",
            "Commands: " + "; ".join(f"`{s['command']}`" for _, s in summaries[1:]) + ".",
            "",
        ]
    return [*lines, END]


def splice(card: str, lines: list[str]) -> str:
    """The card with its fold-spread section replaced by `lines` (inserted before `## Training` if absent)."""
    block = "\n".join(lines)
    if BEGIN in card:
        head, rest = card.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    head, marker, tail = card.partition("## Training")
    if not marker:
        raise SystemExit("card has neither a fold-spread section nor a '## Training' heading")
    return head + block + "\n\n" + marker + tail


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--card", type=Path, required=True, help="model card (markdown) to update in place")
    parser.add_argument("--cv-dir", type=Path, action="append", required=True, help="models.cv_kt run directory")
    args = parser.parse_args(argv)
    lines = section(args.cv_dir)
    if not lines:
        raise SystemExit(f"no finished fold under {', '.join(map(str, args.cv_dir))}")
    args.card.write_text(splice(args.card.read_text(), lines))
    print(f"{args.card}: fold spread of {args.cv_dir[0]}")


if __name__ == "__main__":
    main()
