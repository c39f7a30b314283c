"""Attention maps of the LSTM_RMC encoder, vectorised (MODELS.md §2.5).

Graph outputs attn_{a,b}_{fwd,bwd} are [T,H,K] per pair: the weight each head of the memory row gave
its K slots while reading step t (slot 0 the memory itself; VLMP: then the window's tokens
t-w+1..t; FLMP: token t). For one direction, row t of the map holds the head-averaged weights of
the tokens read at step t; the backward pass read the sentence reversed, so its map is flipped back.
The returned map is the mean of the two directions, `len x len`, non-negative; a row sums to less
than 1 by the weight the memory kept on itself.
"""

from __future__ import annotations

import numpy as np


def direction_map(weights: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """[L,H,K] per-step memory-row weights of one pass -> [L,L] map in that pass's reading order."""
    mean = weights.mean(axis=1, dtype=np.float32)  # heads averaged: [L,K]
    length = len(mean)
    result = np.zeros((length, length), dtype=np.float32)
    steps = np.arange(length)
    if pointer == "flmp":
        result[steps, steps] = mean[:, 1]
        return result
    sources = steps[:, None] - window + 1 + np.arange(window)[None, :]  # [L, w]: token read in each slot
    valid = sources >= 0
    result[np.broadcast_to(steps[:, None], sources.shape)[valid], sources[valid]] = mean[:, 1 : 1 + window][valid]
    return result


def combined_map(forward: np.ndarray, backward: np.ndarray, pointer: str, window: int) -> np.ndarray:
    """Mean of the forward map and the backward map re-indexed to the original token order."""
    backward_map = direction_map(backward, pointer, window)[::-1, ::-1]
    return np.ascontiguousarray((direction_map(forward, pointer, window) + backward_map) / 2)
