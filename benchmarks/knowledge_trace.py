"""DKVMN latency: ONNX Runtime against PyTorch eager, and the HTTP endpoint (one student, 200 interactions)."""

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

MODEL = "dkvmn-assist2009"
STEPS = 200


def _graph_rows() -> list[Row]:
    from models.dkvmn import DKVMN, DKVMNConfig

    entry = manifest_entry(MODEL)
    meta = entry["metadata"]
    onnx = session(entry["file"])
    torch.set_num_threads(threads())
    config = DKVMNConfig(
        n_questions=meta["n_questions"], memory_size=meta["n_concepts"], key_dim=50, value_dim=meta["value_dim"]
    )
    eager = DKVMN(config).eval()  # same sizes; latency does not depend on the weight values
    rng = np.random.default_rng(0)
    rows = []
    for batch in (1, 32):
        q = rng.integers(1, meta["n_questions"] + 1, (batch, STEPS)).astype(np.int64)
        r = rng.integers(0, 2, (batch, STEPS)).astype(np.int64)
        lengths = np.full(batch, STEPS, dtype=np.int64)
        mv = np.repeat(np.load(f"artifacts/{entry['assets']['init_memory']['file']}")[None], batch, 0)
        feeds = {"q": q, "r": r, "len": lengths, "mv_in": mv}
        args = [torch.from_numpy(a) for a in (q, r, lengths, mv)]

        def eager_call(args=args):
            with torch.no_grad():
                eager(*args, use_scan=False)

        rows += onnx_vs_eager_rows(
            MODEL, f"batch {batch} x {STEPS} steps", lambda feeds=feeds: onnx.run(None, feeds), eager_call
        )
    return rows


def _http_rows() -> list[Row]:
    rng = np.random.default_rng(1)
    body = {
        "model": MODEL,
        "interactions": [
            {"question": int(q), "correct": bool(c)}
            for q, c in zip(rng.integers(1, 111, STEPS), rng.integers(0, 2, STEPS), strict=True)
        ],
        "return_attention": True,
    }
    with running_service() as client:
        samples = timings_ms(lambda: client.post("/knowledge-trace", json=body).raise_for_status(), 200, warmup=5)
    return [
        Row(
            MODEL,
            "POST /knowledge-trace",
            f"{STEPS} interactions, 200 sequential requests",
            float(np.median(samples)),
            p99(samples),
            "all 110 next questions, attention on",
        )
    ]


def rows() -> list[Row]:
    return _graph_rows() + _http_rows()
