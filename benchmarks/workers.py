"""`python -m benchmarks.workers`: one server process against MNEMO_WORKERS=2 on the same machine.

For each worker count, in alternating rounds: start `python -m app` on the committed models (cold start
until every worker serves), the RSS and PSS of each process idle, wrk on /similarity and /knowledge-trace at
concurrency 32 (loopback only, bounded in time) with the server's CPU time per request (all its processes),
the memory after the load, then SIGTERM and the exit status.
Prints a Markdown table; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from app.core.settings import Settings, usable_cpus
from benchmarks.common import ARTIFACTS
from benchmarks.load import PAIR, SIM_MODEL, _kt_body, rss_mb, wrk

CONNECTIONS = 32
ENDPOINTS = {
    "/similarity": {"sentence_a": PAIR[0], "sentence_b": PAIR[1], "model": SIM_MODEL, "return_attention": False},
    "/knowledge-trace": _kt_body(200, [3, 7], attention=False),
}


def worker_pids(supervisor: int) -> list[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return [int(pid) for pid in children]


def start(workers: int, port: int, log: Path) -> tuple[subprocess.Popen, float]:
    """`python -m app` with `workers`; returns the process and the seconds until every worker serves."""
    env = {**os.environ, "MNEMO_PORT": str(port), "MNEMO_HOST": "127.0.0.1", "MNEMO_ARTIFACTS_DIR": str(ARTIFACTS)}
    env.update(MNEMO_WORKERS=str(workers), MNEMO_STATE_URL=f"sqlite://{log.with_suffix('.db')}")
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "app"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while time.perf_counter() - started < 180:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited; see {log}")
        if workers > 1:
            if f"all {workers} workers ready" in log.read_text():
                return process, time.perf_counter() - started
        else:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    return process, time.perf_counter() - started
            except httpx.TransportError:
                pass
        time.sleep(0.01)
    raise RuntimeError("the server did not become ready in 180 s")


def pss_mb(pid: int) -> float:
    """Proportional set size: shared pages (the same libraries in every worker) counted once over the processes."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.MULTILINE).group(1)) / 1024


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return ticks / os.sysconf("SC_CLK_TCK")


def memory_text(process: subprocess.Popen, workers: int) -> str:
    """RSS (PSS) in MB of the server, or of the supervisor and each worker."""
    pids = [process.pid] if workers == 1 else [process.pid, *worker_pids(process.pid)]
    return " + ".join(f"{rss_mb(pid):.0f} ({pss_mb(pid):.0f})" for pid in pids)


def measure(workers: int, seconds: int) -> list[str]:
    port = 18000 + (os.getpid() + workers) % 1000
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.gettempdir()) / f"mnemo-workers-{workers}.log"
    process, cold_start = start(workers, port, log)
    try:
        for path, body in ENDPOINTS.items():
            wrk(f"{url}{path}", body, CONNECTIONS, 2, 30)  # warm-up
        idle = memory_text(process, workers)
        pids = [process.pid] if workers == 1 else [process.pid, *worker_pids(process.pid)]
        cells = []
        for path, body in ENDPOINTS.items():
            cpu_before = cpu_seconds(pids)
            result = wrk(f"{url}{path}", body, CONNECTIONS, seconds, 30)
            ok = result.statuses.get(200, 0)
            cpu_ms = (cpu_seconds(pids) - cpu_before) * 1000 / max(ok, 1)
            cells.append(
                f"{ok / result.seconds:.0f} req/s, p50 {result.p50_ms:.0f} ms, p99 {result.p99_ms:.0f} ms, "
                f"{cpu_ms:.1f} CPU ms/req"
            )
            if ok != result.requests:
                cells[-1] += f", statuses {dict(result.statuses)}"
        loaded = memory_text(process, workers)
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    settings = Settings(workers=workers)  # the budget each worker computed from the same environment
    runs = f"{settings.concurrent_runs} x {settings.intra_op_threads}"
    return [str(workers), runs, f"{cold_start:.1f}", *cells, idle, loaded, str(status)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration per cell")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (1 worker, 2 workers)")
    args = parser.parse_args()
    header = [
        "workers",
        "runs x threads per worker",
        "cold start s",
        "/similarity c=32",
        "/knowledge-trace c=32",
        "RSS (PSS) MB idle: supervisor + workers",
        "RSS (PSS) MB after load",
        "exit",
    ]
    rows = []
    for _ in range(args.rounds):
        for workers in (1, 2):
            rows.append(measure(workers, args.seconds))
            print(" | ".join(rows[-1]), flush=True)
    print(f"\n{usable_cpus()} CPUs, wrk {args.seconds} s per cell, {CONNECTIONS} connections\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
