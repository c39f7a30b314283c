"""The one place a batch is padded and split: sequence inputs zero-padded along axis 1, sequence outputs trimmed back
per item (its length plus a fixed extra), so no item's result depends on its batch."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

Feeds = dict[str, np.ndarray]


def pad_rows(arrays: Sequence[np.ndarray], length: int) -> np.ndarray:
    """Stack along axis 0, zero-padding axis 1 of each array to `length`."""
    first = arrays[0]
    out = np.zeros((sum(map(len, arrays)), length, *first.shape[2:]), dtype=first.dtype)
    for start, array in zip(itertools.accumulate(map(len, arrays), initial=0), arrays, strict=False):
        out[start : start + len(array), : array.shape[1]] = array
    return out


def collate(parts: Sequence[Feeds], sequence_inputs: Sequence[str]) -> Feeds:
    """One feed dict for a batch of items: sequence inputs padded to the batch's longest, others stacked."""
    if len(parts) == 1:
        return dict(parts[0])
    length = max((part[name].shape[1] for part in parts for name in sequence_inputs), default=0)
    return {
        name: pad_rows([part[name] for part in parts], length)
        if name in sequence_inputs
        else np.concatenate([part[name] for part in parts])
        for name in parts[0]
    }


def split(outputs: Feeds, items: Sequence[Any], sequence_outputs: Collection[str]) -> list[Feeds]:
    """Per queue item (its `rows`, `length` and `keep`): its rows of the outputs in `keep` (None: all), sequence
    outputs less the padding its inputs had (so `T + 1` steps stay `length + 1`)."""
    starts, padded = itertools.accumulate((item.rows for item in items), initial=0), max(item.length for item in items)
    return [
        {
            name: value[start : start + item.rows, : value.shape[1] - padded + item.length]
            if name in sequence_outputs
            else value[start : start + item.rows]
            for name, value in outputs.items()
            if item.keep is None or name in item.keep
        }
        for start, item in zip(starts, items, strict=False)
    ]


def concatenate(parts: Sequence[Feeds]) -> Feeds:
    """The outputs of one item that was run in several parts, joined back along axis 0."""
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
