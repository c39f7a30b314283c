"""PNG figures for the model cards (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def training_curve(history: list[dict], series: dict[str, str], best_epoch: int, title: str, path: Path) -> None:
    """One line per `series` key (label -> history field) over epochs, the selected epoch marked."""
    lines = {label: history for label in series}
    _epoch_lines(lines, lambda label, row: row[series[label]], title, path, best_epoch)


def _epoch_lines(lines: dict, value, title: str, path: Path, marked_epoch: int | None = None) -> None:
    """A figure with one line per label over epochs: `value(label, row)` of each row of `lines[label]`."""
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for label, history in lines.items():
        axes.plot([row["epoch"] for row in history], [value(label, row) for row in history], marker=".", label=label)
    if marked_epoch is not None:
        axes.axvline(marked_epoch, color="grey", linestyle="--", label=f"selected epoch {marked_epoch}")
    axes.set_xlabel("epoch")
    axes.set_title(title)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def heatmap(
    matrix: np.ndarray,
    row_labels: list[str] | None,
    col_labels: list[str] | None,
    title: str,
    path: Path,
    xlabel: str = "",
    ylabel: str = "",
) -> None:
    """A labelled heatmap of a 2-D array."""
    height = min(12, max(3, 0.25 * matrix.shape[0] + 1.5)) if row_labels else 6
    figure, axes = plt.subplots(figsize=(max(4, 0.3 * matrix.shape[1] + 2.5), height))
    image = axes.imshow(matrix, aspect="auto", cmap="viridis")
    if row_labels:
        axes.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
    if col_labels:
        axes.set_xticks(range(len(col_labels)), col_labels, fontsize=7, rotation=60, ha="right")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def member_curves(histories: dict[str, list[dict]], title: str, path: Path, key: str = "trial_pearson") -> None:
    """One line per training run (label -> its history) of one history field over epochs."""
    _epoch_lines(histories, lambda label, row: row[key], title, path)
