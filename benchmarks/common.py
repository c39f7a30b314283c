"""Timing helpers and a real uvicorn server on the committed artifacts, for the benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort

from benchmarks.table import Row

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def threads() -> int:
    """The CPUs this process may use (what the service uses by default)."""
    return len(os.sched_getaffinity(0))


def session(file: str) -> ort.InferenceSession:
    """A CPU session with the service's default thread count."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads()
    return ort.InferenceSession(str(ARTIFACTS / file), options, providers=["CPUExecutionProvider"])


def manifest_entry(name: str) -> dict:
    """The manifest entry of a committed model."""
    models = json.loads((ARTIFACTS / "manifest.json").read_text())["models"]
    return next(m for m in models if m["name"] == name)


def timings_ms(call: Callable[[], object], repeats: int, warmup: int = 3) -> np.ndarray:
    """Wall time of `repeats` sequential calls, in milliseconds."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return np.array(samples)


def p99(samples: np.ndarray) -> float:
    return float(np.percentile(samples, 99))


def onnx_vs_eager_rows(
    model: str, setting: str, onnx_call: Callable[[], object], eager_call: Callable[[], object], repeats: int = 30
) -> list[Row]:
    """Two rows, ONNX Runtime then PyTorch eager, timed back to back; the ratio of medians in the note."""
    ort_ms = timings_ms(onnx_call, repeats)
    eager_ms = timings_ms(eager_call, repeats)
    ratio = np.median(eager_ms) / np.median(ort_ms)
    note = f"{ratio:.1f}x faster than eager" if ratio >= 1 else f"{1 / ratio:.1f}x slower than eager"
    return [
        Row(model, "ONNX Runtime", setting, float(np.median(ort_ms)), p99(ort_ms), note),
        Row(model, "PyTorch eager (loop)", setting, float(np.median(eager_ms)), p99(eager_ms)),
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_service(**settings: str) -> Iterator[httpx.Client]:
    """uvicorn serving the committed artifacts on a free port, until the block ends; `settings`: MNEMO_* env."""
    port = _free_port()
    env = {**os.environ, "MNEMO_PORT": str(port), "MNEMO_LOG_LEVEL": "warning", **settings}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            deadline = time.monotonic() + 180
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/ready").status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the service did not become ready")
                time.sleep(0.5)
            yield client
    finally:
        process.terminate()
        process.wait(timeout=30)
