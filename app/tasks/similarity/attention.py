"""Attention maps of the LSTM_RMC encoder, vectorised (MODELS.md §2.5): per-step memory-row weights
[T,H,K] of each direction -> one `len x len` map, the mean of the forward map and the backward map flipped back."""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=512)
def _cells(length: int, slots: int, pointer: str, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat indices of what a pass's memory row read: into its [L,K] weights, into its [L,L] map, and into that map
    flipped back (the backward pass's cell (t, i) is (L-1-t, L-1-i))."""
    steps = np.arange(length)
    if pointer == "flmp":
        step, token, slot = steps, steps, np.ones(length, dtype=np.intp)
    else:
        sources = steps[:, None] - window + 1 + np.arange(window)[None, :]  # [L, w]: token read in each slot
        valid = sources >= 0
        step, token = np.broadcast_to(steps[:, None], sources.shape)[valid], sources[valid]
        slot = np.broadcast_to(1 + np.arange(window), sources.shape)[valid]
    flipped = (length - 1 - step) * length + (length - 1 - token)
    return step * slots + slot, step * length + token, flipped


def direction_map(weights: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """[L,H,K] per-step memory-row weights of one pass -> [L,L] map in that pass's reading order (heads averaged)."""
    length, _, slots = weights.shape
    read, cells, _ = _cells(length, slots, pointer, window)
    result = np.zeros(length * length, dtype=np.float32)
    result[cells] = weights.mean(axis=1, dtype=np.float32).ravel()[read]
    return result.reshape(length, length)


def combined_map(forward: np.ndarray, backward: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """Mean of the forward map and the backward map flipped back (heads averaged: summed, then scaled once)."""
    length, heads, slots = forward.shape
    read, cells, flipped = _cells(length, slots, pointer, window)
    result = np.zeros(length * length, dtype=np.float32)
    result[cells] = forward.sum(axis=1, dtype=np.float32).ravel()[read]
    result[flipped] += backward.sum(axis=1, dtype=np.float32).ravel()[read]
    result *= 0.5 / heads
    return result.reshape(length, length)
