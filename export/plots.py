"""PNG figures for the model cards (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def training_curve(history: list[dict], series: dict[str, str], best_epoch: int, title: str, path: Path) -> None:
    """One line per `series` key (label -> history field) over epochs, the selected epoch marked."""
    epochs = [row["epoch"] for row in history]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for label, key in series.items():
        axes.plot(epochs, [row[key] for row in history], marker=".", label=label)
    axes.axvline(best_epoch, color="grey", linestyle="--", label=f"selected epoch {best_epoch}")
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
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for label, history in histories.items():
        axes.plot([row["epoch"] for row in history], [row[key] for row in history], marker=".", label=label)
    axes.set_xlabel("epoch")
    axes.set_title(title)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
