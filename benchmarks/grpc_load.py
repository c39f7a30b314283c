"""`make loadtest`'s gRPC rows: ModelInfer on /knowledge-trace's model at concurrency 1 and 32, next to bare ONNX
Runtime on the same inputs in the same run.

One `python -m app` with MNEMO_GRPC_PORT on the committed models; a Python grpc.aio client (no ghz here) sends one
prebuilt ModelInferRequest (one history of 200 interactions as raw INT64 tensors; outputs `p` and `mv_out`, the
state to continue from) from `concurrency` callers for a bounded time and count. Bare ONNX Runtime runs the same
graph on the same tensors with the same session options: at batch 1 taking turns with the concurrency-1 rounds,
at batch 32 for the throughput ratio. The client shares the cores with the server. The result replaces the
`grpc` section of BENCHMARKS.md. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from app.core.settings import Settings
from app.runtime.sessions import open_session
from benchmarks.common import ARTIFACTS, manifest_entry
from benchmarks.load import KT_MODEL, bare_ms, compile_service, median_ms, start_server
from benchmarks.table import write_section

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
STEPS = 200
ROUNDS = 3  # concurrency 1 takes turns with bare ONNX Runtime, so a drift of the shared machine hits both
MAX_REQUESTS = 200_000  # a bound on any cell, whatever its time


@dataclass
class LoadResult:
    codes: Counter
    latencies_s: list[float]
    seconds: float

    @property
    def ok_per_s(self) -> float:
        return self.codes.get("OK", 0) / max(self.seconds, 1e-9)

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000) if self.latencies_s else float("nan")


def history(rows: int) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(0)
    return {
        "q": generator.integers(1, 111, (rows, STEPS)),
        "r": generator.integers(0, 2, (rows, STEPS)),
        "len": np.full(rows, STEPS, dtype=np.int64),
    }


def infer_request() -> bytes:
    """One history as the gRPC client sends it: raw little-endian tensors, outputs p and mv_out."""
    request = service_pb2.ModelInferRequest(model_name=KT_MODEL)
    for name, array in history(1).items():
        request.inputs.add(name=name, datatype="INT64", shape=list(array.shape))
        request.raw_input_contents.append(array.astype("<i8").tobytes())
    for name in ("p", "mv_out"):
        request.outputs.add(name=name)
    return request.SerializeToString()


def bare_run(rows: int):
    """The same graph on the same history (`rows` copies) with the model's initial memory, as the server runs it."""
    session = open_session(ARTIFACTS / f"{KT_MODEL}.onnx", Settings(), "CPUExecutionProvider")
    memory = np.load(ARTIFACTS / manifest_entry(KT_MODEL)["assets"]["init_memory"]["file"]).astype(np.float32)
    feeds = {**history(rows), "mv_in": np.repeat(memory[np.newaxis], rows, axis=0)}
    return lambda: session.run(None, feeds)


async def load(address: str, payload: bytes, concurrency: int, seconds: float) -> LoadResult:
    """`concurrency` callers on one channel, each calling again as soon as answered, for `seconds`."""
    codes: Counter = Counter()
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary(INFER_METHOD)
        await infer(payload, timeout=30)  # the connection is up before the clock starts
        started = time.perf_counter()
        stop_at = started + seconds

        async def caller() -> None:
            while time.perf_counter() < stop_at and len(latencies) < MAX_REQUESTS:
                sent = time.perf_counter()
                try:
                    await infer(payload, timeout=30)
                    codes["OK"] += 1
                    latencies.append(time.perf_counter() - sent)
                except grpc.aio.AioRpcError as error:
                    codes[error.code().name] += 1

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return LoadResult(codes, latencies, time.perf_counter() - started)


def rows(address: str, seconds: int) -> tuple[list[str], list[str]]:
    """The table rows and the summary lines."""
    payload = infer_request()
    single, batch32 = bare_run(1), bare_run(32)
    bare, rounds = [], []
    for _ in range(ROUNDS):
        bare.append(bare_ms(single))
        rounds.append(asyncio.run(load(address, payload, 1, max(1, seconds / ROUNDS))))
    single_ms = float(np.median(bare))
    alone = LoadResult(
        sum((result.codes for result in rounds), Counter()),
        [latency for result in rounds for latency in result.latencies_s],
        sum(result.seconds for result in rounds),
    )
    batch_items_s = 32 / (median_ms(batch32, 20) / 1000)
    crowd = asyncio.run(load(address, payload, 32, seconds))
    table = [
        "| call | concurrency | requests/s | p50 ms | p99 ms | vs bare ORT | answers |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = []
    for concurrency, result in ((1, alone), (32, crowd)):
        if concurrency == 1:
            versus = f"p50 {result.percentile_ms(50) / single_ms:.2f}x bare batch 1 ({single_ms:.2f} ms)"
        else:
            versus = f"{result.ok_per_s / batch_items_s:.2f}x bare batch 32 ({batch_items_s:.0f} histories/s)"
        answers = ", ".join(f"{code} {count}" for code, count in sorted(result.codes.items()))
        table.append(
            f"| gRPC ModelInfer {KT_MODEL}, 1 history of {STEPS} | {concurrency} | {result.ok_per_s:.0f} | "
            f"{result.percentile_ms(50):.2f} | {result.percentile_ms(99):.2f} | {versus} | {answers} |"
        )
        summary.append(f"- gRPC, concurrency {concurrency}: {versus}")
        print(table[-1], flush=True)
    return table, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8, help="duration of each cell")
    parser.add_argument("--output", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args()
    port = 19000 + os.getpid() % 1000
    os.environ["MNEMO_GRPC_PORT"] = str(port + 2)  # beside the HTTP port and the probe port (port + 1)
    compile_service()
    load_average = os.getloadavg()[0]  # the cores are shared: what else ran says how far to trust the figures
    process, _ = start_server(port, Path(tempfile.gettempdir()) / "mnemo-grpc-load-server.log")
    try:
        table, summary = rows(f"127.0.0.1:{port + 2}", args.seconds)
    finally:
        process.terminate()
        process.wait(60)
    settings = Settings()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = "\n".join(
        [
            "## gRPC load (`make loadtest`, `python -m benchmarks.grpc_load`)",
            "",
            f"Measured {when} on {os.cpu_count()} CPUs (load average {load_average:.1f} at the start): one "
            "`python -m app` with MNEMO_GRPC_PORT and the default "
            f"settings (MNEMO_CONCURRENT_RUNS={settings.concurrent_runs}, MNEMO_MAX_BATCH={settings.max_batch}, "
            f"MNEMO_MAX_WAIT_MS={settings.max_wait_ms:g}); a Python grpc.aio client on the same cores sends one "
            f"ModelInferRequest (one history of {STEPS} interactions, raw INT64 tensors; outputs p and mv_out) for "
            f"{args.seconds} s per cell; at concurrency 1 in {ROUNDS} rounds taking turns with bare ONNX Runtime at "
            "batch 1 (the same graph, tensors and session options). Bare batch 32: 32 copies of the history in one "
            "run.",
            "",
            *summary,
            "",
            *table,
        ]
    )
    write_section(args.output, "grpc", text)
    print(text)


if __name__ == "__main__":
    main()
