"""LSTM_RMC latency: ONNX Runtime against PyTorch eager, and the HTTP endpoints (SICK-like pairs)."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import (
    manifest_entry,
    onnx_vs_eager_rows,
    p99,
    running_service,
    session,
    threads,
    timings_ms,
)
from benchmarks.table import Row

MODEL = "rmc-vlmp-sick"
TOKENS = 12  # a median SICK sentence with its markers
PAIR = {"sentence_a": "A man is playing a guitar on the stage.", "sentence_b": "A person plays an instrument."}


def _graph_rows() -> list[Row]:
    from models.ensemble import EnsemblePairModel
    from models.rmc import RMCConfig, SentencePairModel

    entry = manifest_entry(MODEL)
    meta = entry["metadata"]
    onnx = session(entry["file"])
    torch.set_num_threads(threads())
    config = RMCConfig(
        pointer=meta["pointer"],
        window=meta["window"],
        num_heads=meta["heads"],
        head_size=meta["memory_size"] // meta["heads"],
        fc_dim=meta["fc_dim"],
    )
    # same sizes (and members, for an ensemble); latency does not depend on the weight values
    members = [SentencePairModel(config) for _ in range(meta.get("members", 1))]
    eager = (members[0] if len(members) == 1 else EnsemblePairModel(members)).eval()
    rng = np.random.default_rng(0)
    rows = []
    for batch in (1, 32):
        emb_a, emb_b = rng.normal(size=(2, batch, TOKENS, 50)).astype(np.float32)
        lengths = np.full(batch, TOKENS, dtype=np.int64)
        feeds = {"emb_a": emb_a, "len_a": lengths, "emb_b": emb_b, "len_b": lengths}
        args = [torch.from_numpy(a) for a in (emb_a, lengths, emb_b, lengths)]

        def eager_call(args=args):
            with torch.no_grad():
                eager(*args)

        rows += onnx_vs_eager_rows(
            MODEL, f"{batch} pair(s) x {TOKENS} tokens", lambda feeds=feeds: onnx.run(None, feeds), eager_call
        )
    return rows


def _http_rows() -> list[Row]:
    single = {**PAIR, "model": MODEL, "return_attention": True}
    batch = {"pairs": [PAIR] * 32, "model": MODEL, "return_attention": False}
    with running_service() as client:
        one = timings_ms(lambda: client.post("/similarity", json=single).raise_for_status(), 200, warmup=5)
        many = timings_ms(lambda: client.post("/similarity/batch", json=batch).raise_for_status(), 50, warmup=3)
    return [
        Row(
            MODEL,
            "POST /similarity",
            "1 pair, 200 sequential requests",
            float(np.median(one)),
            p99(one),
            "attention on",
        ),
        Row(
            MODEL,
            "POST /similarity/batch",
            "32 pairs, 50 sequential requests",
            float(np.median(many)),
            p99(many),
            f"{np.median(many) / 32:.2f} ms per pair",
        ),
    ]


def rows() -> list[Row]:
    return _graph_rows() + _http_rows()
