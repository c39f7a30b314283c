"""Median latency of LSTM_RMC pair graphs on onnxruntime (CPU, one intra-op thread), measured side by side.

python -m export.latency artifacts/rmc-vlmp-sick.onnx /tmp/one-member.onnx --batch 1 --batch 32

Every graph gets the same feeds: `batch` pairs of `tokens`-token sentences (random vectors; the cost of these
graphs depends on the shapes only). The graphs take turns run by run, so a change of the machine's load hits
them alike; the first graph is the reference of the printed ratios.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

WARMUP_RUNS = 5


def pair_feeds(batch: int, tokens: int, dim: int = 50) -> dict[str, np.ndarray]:
    """Feeds of `batch` pairs, both sentences `tokens` long."""
    generator = np.random.default_rng(0)
    emb = generator.normal(size=(2, batch, tokens, dim)).astype(np.float32)
    lengths = np.full(batch, tokens, dtype=np.int64)
    return {"emb_a": emb[0], "len_a": lengths, "emb_b": emb[1], "len_b": lengths}


def median_milliseconds(paths: list[Path], batch: int, tokens: int, repeats: int) -> list[float]:
    """Median wall time of one run of each graph, in milliseconds, the graphs run in turn `repeats` times."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    sessions = [ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]) for path in paths]
    feeds = pair_feeds(batch, tokens)
    for session in sessions:
        for _ in range(WARMUP_RUNS):
            session.run(None, feeds)
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(repeats):
        for session, measured in zip(sessions, times, strict=True):
            started = time.perf_counter()
            session.run(None, feeds)
            measured.append((time.perf_counter() - started) * 1000)
    return [float(np.median(measured)) for measured in times]


def latency_table(paths: list[Path], batches: list[int], tokens: int, repeats: int) -> list[dict]:
    """One row per batch size: each graph's median milliseconds and its ratio to the first graph."""
    rows = []
    for batch in batches:
        medians = median_milliseconds(paths, batch, tokens, repeats)
        rows.append({"batch": batch, "tokens": tokens, "repeats": repeats, "median_ms": medians})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graphs", type=Path, nargs="+", help="pair graphs; the first is the reference")
    parser.add_argument("--batch", type=int, action="append", help="pairs per run (repeatable; default 1 and 32)")
    parser.add_argument("--tokens", type=int, default=15, help="tokens per sentence, markers included")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    for row in latency_table(args.graphs, args.batch or [1, 32], args.tokens, args.repeats):
        reference = row["median_ms"][0]
        measured = zip(args.graphs, row["median_ms"], strict=True)
        shown = ", ".join(f"{path.name} {ms:.2f} ms ({ms / reference:.2f}x)" for path, ms in measured)
        print(f"batch {row['batch']}, {row['tokens']}-token pairs, median of {row['repeats']}: {shown}")


if __name__ == "__main__":
    main()
