"""Attention maps of the LSTM_RMC encoder, vectorised (MODELS.md §2.5): per-step memory-row weights
[T,H,K] of each direction -> one `len x len` map, the mean of the forward map and the backward map flipped back."""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=512)
def _cells(length: int, pointer: str, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cells of a pass's map its memory row read: step steps[i] read token tokens[i] in slot slots[i]."""
    steps = np.arange(length)
    if pointer == "flmp":
        return steps, steps, np.ones(length, dtype=np.intp)
    sources = steps[:, None] - window + 1 + np.arange(window)[None, :]  # [L, w]: token read in each slot
    valid = sources >= 0
    slots = np.broadcast_to(1 + np.arange(window), sources.shape)
    return np.broadcast_to(steps[:, None], sources.shape)[valid], sources[valid], slots[valid]


def direction_map(weights: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """[L,H,K] per-step memory-row weights of one pass -> [L,L] map in that pass's reading order."""
    length = len(weights)
    steps, tokens, slots = _cells(length, pointer, window)
    result = np.zeros((length, length), dtype=np.float32)
    result[steps, tokens] = weights.mean(axis=1, dtype=np.float32)[steps, slots]  # heads averaged
    return result


def combined_map(forward: np.ndarray, backward: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """Mean of the forward map and the backward map, whose cell (t, i) lands at (L-1-t, L-1-i)."""
    length = len(forward)
    steps, tokens, slots = _cells(length, pointer, window)
    result = direction_map(forward, pointer, window)
    result[length - 1 - steps, length - 1 - tokens] += backward.mean(axis=1, dtype=np.float32)[steps, slots]
    result /= 2
    return result
