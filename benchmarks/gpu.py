"""`make gpu-bench` (`python -m benchmarks.gpu`): the committed models on a GPU, against the CPU, in one run.

1. Bare ONNX Runtime, every committed graph, on CUDA (with and without IO binding) and on CPU, at batches 1, 32
   and 256: the median ms per run. Sessions are the service's (app/runtime/sessions.py: MNEMO_CUDA_* defaults,
   TF32 off); the CPU sessions use every CPU this process may use.
2. Memory: the GPU memory this process holds after runs of growing batches on a fresh session (nvidia-smi; the
   arena grows by what runs ask, kSameAsRequested), the bytes per row from its slope, and the rows per run that
   fit MNEMO_CUDA_MEM_LIMIT_MB (or the default 4096 MiB of deploy/k8s/overlays/gpu).
3. Parity: each graph's largest output difference from CPU at batch 32, with TF32 off (the service's default)
   and on.
4. The service (`python -m app` on 127.0.0.1) with MNEMO_PROVIDER `cuda`, `cpu` and `cuda,cpu` (or the `--service`
   specs given), at concurrency 1, 32 and 256 on /similarity and /knowledge-trace: answers/s, p50 and p99, any
   non-2xx statuses, each instance's rows per ONNX run (/metrics) and its cost fit before and after (/models).

The table replaces the gpu section of BENCHMARKS.md. Without CUDA it exits 2 with one line saying what is
missing; `--cpu-only` runs the CPU columns alone (a dry run of the code paths, written nowhere unless
`--output` is given). Needs only `requirements/gpu.txt` and the project: no torch, no httpx, no wrk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
from prometheus_client.parser import text_string_to_metric_families

from app.core.settings import Settings, usable_cpus
from app.runtime.sessions import PROVIDER_NAMES, open_session
from benchmarks.table import write_section

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts"
BATCHES = (1, 32, 256)
CONCURRENCY = (1, 32, 256)
SERVICE_PROVIDERS = ("cuda", "cpu", "cuda,cpu")
KT_MODEL, SIM_MODEL = "dkvmn-assist2009", "rmc-vlmp-sick"
TOKENS = 12  # per sentence of a similarity graph's input
PARITY_BATCH = 32
MEMORY_BATCHES = (1, 64, 128, 256)
OVERLAY_MEM_LIMIT_MB = 4096  # deploy/k8s/overlays/gpu
PAIR = {"sentence_a": "A man is playing a guitar on the stage.", "sentence_b": "A person plays an instrument."}
CUDA, CPU = PROVIDER_NAMES["cuda"], PROVIDER_NAMES["cpu"]


class Missing(Exception):
    """What this machine lacks for the GPU benchmark (one line)."""


def check_cuda() -> None:
    """Raise Missing unless onnxruntime-gpu is installed and a session really runs on a CUDA device."""
    available = ort.get_available_providers()
    if CUDA not in available:
        raise Missing(
            f"onnxruntime {ort.__version__} offers no CUDAExecutionProvider (only {', '.join(available)}): "
            "install requirements/gpu.txt on a machine with an NVIDIA GPU"
        )
    graph = next(iter(committed_graphs().values()))
    try:
        session = open_session(graph, Settings(), CUDA)
    except Exception as error:  # onnxruntime raises its own types for a missing driver or library
        raise Missing(f"a CUDA session could not be created: {str(error).splitlines()[0]}") from None
    if session.get_providers()[0] != CUDA:
        raise Missing("onnxruntime-gpu is installed but no CUDA device is usable (the session fell back to CPU)")


def committed_graphs() -> dict[str, Path]:
    """Every ONNX graph the manifest lists (models and their extra graphs), by a short name."""
    manifest = json.loads((ARTIFACTS / "manifest.json").read_text())
    graphs = {}
    for entry in manifest["models"]:
        graphs[entry["name"]] = ARTIFACTS / entry["file"]
        for key, graph in entry.get("graphs", {}).items():
            graphs[f"{entry['name']}.{key}"] = ARTIFACTS / graph["file"]
    return graphs


def entry_of(graph: str) -> dict:
    manifest = json.loads((ARTIFACTS / "manifest.json").read_text())
    return next(entry for entry in manifest["models"] if graph.split(".")[0] == entry["name"])


def feeds_for(session: ort.InferenceSession, graph: str, batch: int) -> dict[str, np.ndarray]:
    """Valid inputs of `batch` rows: axis 0 the batch, axis 1 the steps (the model's seqlen) or TOKENS tokens."""
    entry, rng = entry_of(graph), np.random.default_rng(0)
    steps = entry["metadata"].get("seqlen", TOKENS)
    feeds = {}
    for graph_input in session.get_inputs():
        shape = [
            batch,
            *(
                steps if index == 0 and not isinstance(dim, int) else dim
                for index, dim in enumerate(graph_input.shape[1:])
            ),
        ]
        name = graph_input.name
        if graph_input.type == "tensor(int64)":
            if name.startswith("len"):
                feeds[name] = np.full(shape, steps, dtype=np.int64)
            elif name == "q":
                feeds[name] = rng.integers(1, entry["metadata"]["n_questions"] + 1, shape)
            else:
                feeds[name] = rng.integers(0, 2, shape)
        elif name == "mv_in":
            memory = np.load(ARTIFACTS / entry["assets"]["init_memory"]["file"]).astype(np.float32)
            feeds[name] = np.repeat(memory[np.newaxis], batch, axis=0)
        else:
            feeds[name] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    return feeds


def median_ms(call: Callable[[], object], seconds: float, most: int = 200) -> float:
    """The median wall time of `call`, run after two warm-up calls for about `seconds` (at least 3 times)."""
    call(), call()
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < 3 or (time.perf_counter() < deadline and len(samples) < most):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return float(np.median(samples))


def bound_run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    """A run with the inputs copied to the device once and the outputs left there (IO binding)."""
    binding = session.io_binding()
    device = int(Settings().cuda_device_id.split(",")[0])
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", device))
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda", device)
    return lambda: session.run_with_iobinding(binding)


def bare_table(providers: list[str], batches: tuple[int, ...], seconds: float) -> list[str]:
    cpu_settings = Settings(intra_op_threads=usable_cpus(), concurrent_runs=1)
    columns = [(provider, batch) for provider in providers for batch in batches]
    heads = [f"{'CUDA' if p == CUDA else f'CPU {usable_cpus()} threads'} b{b}" for p, b in columns]
    if CUDA in providers:
        heads += [f"CUDA IO binding b{b}" for b in batches]
    lines = ["| graph | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for graph, path in committed_graphs().items():
        sessions = {p: open_session(path, cpu_settings if p == CPU else Settings(), p) for p in providers}
        cells = []
        for provider, batch in columns:
            feeds = feeds_for(sessions[provider], graph, batch)
            cells.append(median_ms(lambda s=sessions[provider], f=feeds: s.run(None, f), seconds))
        if CUDA in providers:
            cells += [
                median_ms(bound_run(sessions[CUDA], feeds_for(sessions[CUDA], graph, b)), seconds) for b in batches
            ]
        lines.append(f"| {graph} | " + " | ".join(f"{ms:,.1f}" for ms in cells) + " |")
        print(lines[-1], flush=True)
    return lines


def gpu_memory_bytes(pid: int) -> int | None:
    """The GPU memory `pid` holds, as nvidia-smi reports it; None without nvidia-smi or where it lists no such
    process (in a container, another PID namespace)."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    listed = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    used = [int(mib) for line in listed.splitlines() for owner, mib in [line.split(",")] if int(owner) == pid]
    return used[0] * 1024 * 1024 if used else None


def rows_within(limit_bytes: int, bytes_per_row: float) -> int:
    """Rows per run that fit an arena of `limit_bytes` at `bytes_per_row` (at least 1; the weights are a few MB)."""
    return max(1, int(limit_bytes // max(bytes_per_row, 1.0)))


def memory_table() -> list[str]:
    """Per graph: GPU memory after each batch of MEMORY_BATCHES on a fresh session, the slope, the rows that fit."""
    limit_mb = Settings().cuda_mem_limit_mb or OVERLAY_MEM_LIMIT_MB
    lines = [
        f"| graph | MB held after b{' / b'.join(map(str, MEMORY_BATCHES))} | MB per row | rows per run in "
        f"{limit_mb} MiB |",
        "|---|---|---|---|",
    ]
    for graph, path in committed_graphs().items():
        session = open_session(path, Settings(), CUDA)
        held = []
        for batch in MEMORY_BATCHES:
            session.run(None, feeds_for(session, graph, batch))
            held.append(gpu_memory_bytes(os.getpid()))
        del session
        if None in held:
            lines.append(f"| {graph} | nvidia-smi lists no memory for this process | | |")
            continue
        per_row = np.polyfit(MEMORY_BATCHES, held, 1)[0]
        rows = rows_within(limit_mb * 1024 * 1024, per_row)
        lines.append(f"| {graph} | {' / '.join(f'{b / 1e6:,.0f}' for b in held)} | {per_row / 1e6:.2f} | {rows:,} |")
        print(lines[-1], flush=True)
    return lines


def largest_difference(reference: list[np.ndarray], other: list[np.ndarray]) -> float:
    return max(
        float(np.max(np.abs(a.astype(np.float64) - b)))
        for a, b in zip(reference, other, strict=True)
        if np.issubdtype(a.dtype, np.floating)
    )


def parity_table(providers: list[str]) -> list[str]:
    """Each graph's largest output difference from CPU at batch PARITY_BATCH, TF32 off and on."""
    if CUDA in providers:
        others = [("CUDA, TF32 off (the default)", CUDA, False), ("CUDA, TF32 on", CUDA, True)]
    else:  # --cpu-only: a second CPU session, the code path of the comparison
        others = [("CPU again", CPU, False)]
    lines = ["| graph | " + " | ".join(name for name, _, _ in others) + " |", "|---|" + "---|" * len(others)]
    for graph, path in committed_graphs().items():
        reference_session = open_session(path, Settings(), CPU)
        feeds = feeds_for(reference_session, graph, PARITY_BATCH)
        reference = reference_session.run(None, feeds)
        cells = [
            largest_difference(reference, open_session(path, Settings(cuda_tf32=tf32), p).run(None, feeds))
            for _, p, tf32 in others
        ]
        lines.append(f"| {graph} | " + " | ".join(f"{value:.1e}" for value in cells) + " |")
        print(lines[-1], flush=True)
    return lines


# -- the service under load ---------------------------------------------------------------------------------
@dataclass
class Load:
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def row(self) -> str:
        ok = sum(count for status, count in self.statuses.items() if 200 <= status < 300)
        p50, p99 = np.percentile(self.latencies_ms, [50, 99]) if self.latencies_ms else (float("nan"),) * 2
        other = ", ".join(f"{count} x {status}" for status, count in sorted(self.statuses.items()) if status >= 300)
        return f"{ok / max(self.seconds, 1e-9):,.1f} | {p50:,.1f} | {p99:,.1f} | {other or '–'}"


async def _client(port: int, request: bytes, load: Load, stop_at: float) -> None:
    """One keep-alive connection sending `request` again and again until `stop_at`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            load.latencies_ms.append((time.perf_counter() - started) * 1000)
            load.statuses[status] += 1
            if b"connection: close" in head.lower():
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
    finally:
        writer.close()


async def _load(port: int, path: str, body: dict, connections: int, seconds: float) -> Load:
    payload = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    load = Load()
    started = time.perf_counter()
    await asyncio.gather(*(_client(port, request, load, started + seconds) for _ in range(connections)))
    load.seconds = time.perf_counter() - started
    return load


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_service(spec: str, log: Path) -> tuple[subprocess.Popen, int]:
    """`python -m app` on 127.0.0.1 for a `--service` spec (`cuda` or `cuda MNEMO_MAX_BATCH=256 ...`: the
    provider list, then settings), once /ready answers 200."""
    provider, *assignments = spec.split()
    port = _free_port()
    env = {
        **os.environ,
        "MNEMO_HOST": "127.0.0.1",
        "MNEMO_PORT": str(port),
        "MNEMO_PROVIDER": provider,
        "MNEMO_ARTIFACTS_DIR": str(ARTIFACTS),
        "MNEMO_LOG_LEVEL": "warning",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        **dict(assignment.split("=", 1) for assignment in assignments),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app"], env=env, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200:
                return process, port
        except OSError:
            time.sleep(0.5)
    process.kill()
    process.wait()
    raise RuntimeError(log.read_text().strip().splitlines()[-1] if log.read_text().strip() else "never ready")


def rows_per_run(port: int) -> str:
    """Each instance's rows per ONNX run so far (`model/instance rows/runs`), from the service's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    totals: Counter = Counter()
    for sample in (sample for family in text_string_to_metric_families(text) for sample in family.samples):
        if kind := {"mnemo_instance_runs_total": "runs", "mnemo_instance_rows_total": "rows"}.get(sample.name):
            totals[sample.labels["model"], sample.labels["model_instance"], kind] += sample.value
    return ", ".join(
        f"{model}/{instance} {totals[model, instance, 'rows'] / runs:.1f} ({runs:,.0f} runs)"
        for (model, instance, kind), runs in sorted(totals.items())
        if kind == "runs" and runs
    )


def cost_fits(port: int) -> str:
    """The benchmarked models' instances' cost fits (fixed ms + per step µs + per cell µs), from GET /models."""
    listed = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=10))["models"]
    return ", ".join(
        f"{model['name']}/{instance['name']} {cost['fixed_ms']:.2f} ms + {cost['per_step_us']:.1f} µs/step + "
        f"{cost['per_cell_us']:.2f} µs/cell"
        for model in listed
        if model["name"] in (KT_MODEL, SIM_MODEL)
        for instance in model["instances"]
        for cost in [instance["cost"]]
    )


def service_table(providers: tuple[str, ...], concurrency: tuple[int, ...], seconds: float) -> list[str]:
    rng = np.random.default_rng(1)
    interactions = [
        {"question": int(q), "correct": bool(c)}
        for q, c in zip(rng.integers(1, 111, 200), rng.random(200) < 0.6, strict=True)
    ]
    scenarios = [
        ("/similarity (1 pair)", "/similarity", {**PAIR, "model": SIM_MODEL, "return_attention": False}),
        (
            "/knowledge-trace (200 interactions, 2 next)",
            "/knowledge-trace",
            {"model": KT_MODEL, "interactions": interactions, "next_questions": [3, 7], "return_attention": False},
        ),
    ]
    lines = [
        "| MNEMO_PROVIDER | endpoint | connections | answers/s | p50 ms | p99 ms | other statuses |",
        "|---|---|---|---|---|---|---|",
    ]
    footnotes: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        for provider in providers:
            try:
                process, port = start_service(provider, Path(scratch) / "service.log")
            except RuntimeError as error:
                lines.append(f"| {provider} | did not start: {error} | | | | | |")
                continue
            try:
                seeded = cost_fits(port)
                for name, path, body in scenarios:
                    for connections in concurrency:
                        load = asyncio.run(_load(port, path, body, connections, seconds))
                        lines.append(f"| {provider} | {name} | {connections} | {load.row()} |")
                        print(lines[-1], flush=True)
                footnotes.append(f"- `{provider}`, rows per run: {rows_per_run(port) or 'no runs counted'}")
                footnotes.append(f"  - cost fits at the start: {seeded}; after the load: {cost_fits(port)}")
            finally:
                process.terminate()
                process.wait(timeout=60)
    return [*lines, "", *footnotes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-only", action="store_true", help="the CPU columns alone (a dry run without a GPU)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--seconds", type=float, default=2.0, help="per bare-ONNX cell; x5 per load cell")
    parser.add_argument("--skip-service", action="store_true")
    parser.add_argument("--skip-bare", action="store_true", help="the service alone (no bare, parity or memory table)")
    parser.add_argument(
        "--service",
        action="append",
        help="a service to load: MNEMO_PROVIDER, then any settings (`cuda MNEMO_MAX_BATCH=256`); repeatable "
        f"(default: {', '.join(SERVICE_PROVIDERS)})",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="the file whose gpu section is replaced (default: BENCHMARKS.md, not with --cpu-only)",
    )
    arguments = parser.parse_args()
    if not arguments.cpu_only:
        try:
            check_cuda()
        except Missing as missing:
            print(f"benchmarks.gpu: {missing}", file=sys.stderr)
            sys.exit(2)
    providers = [CPU] if arguments.cpu_only else [CUDA, CPU]
    batches = tuple(int(b) for b in arguments.batches.split(","))
    concurrency = tuple(int(c) for c in arguments.concurrency.split(","))
    load_avg = os.getloadavg()[0]
    sections: list[str] = []
    if not arguments.skip_bare:
        sections += [
            f"Bare ONNX Runtime, median ms per run ({ort.__version__}, device {ort.get_device()}, load "
            f"average {load_avg:.1f} at the start):",
            "",
            *bare_table(providers, batches, arguments.seconds),
            "",
            f"Largest output difference from CPU at batch {PARITY_BATCH}:",
            "",
            *parity_table(providers),
        ]
        if CUDA in providers:
            sections += ["", "GPU memory held by a fresh session after growing batches:", "", *memory_table()]
    if not arguments.skip_service:
        service_providers = tuple(arguments.service or ()) or (("cpu",) if arguments.cpu_only else SERVICE_PROVIDERS)
        sections += [
            "",
            f"The service (`python -m app`, {arguments.seconds * 5:g} s per cell):",
            "",
            *service_table(service_providers, concurrency, arguments.seconds * 5),
        ]
    text = "\n".join(["`python -m benchmarks.gpu " + " ".join(sys.argv[1:]) + "`", "", *sections])
    output = arguments.output or (None if arguments.cpu_only else REPO / "BENCHMARKS.md")
    print(text)
    if output is not None:
        write_section(output, "gpu", text)


if __name__ == "__main__":
    main()
