"""`python -m benchmarks.servers`: the candidate HTTP servers and process managers side by side, in one run.

Each candidate serves the committed models with MNEMO_WORKERS=2 and the probe port (MNEMO_PROBE_PORT, what the
deployment files probe), then, one after the other: concurrency 1 p50 and concurrency 32 throughput on
/similarity and /knowledge-trace (bare ONNX Runtime at batch 1 and 32 measured beside them); /health p99 on the
probe port and the main port during the overload mix (256 connections of 3,000-interaction histories);
slowloris and idle sockets (benchmarks/connection_abuse.py's clients); the HTTP framing cases of
tests/integration/test_http_framing.py; a worker killed with SIGKILL and one stopped with SIGSTOP under load;
SIGTERM with 32 requests in flight. Cells are a few seconds each, so the whole run takes about 10 minutes; the
figures of one run compare with each other only. Traffic goes to 127.0.0.1 only and every loop is bounded.

    python -m benchmarks.servers [--seconds 3] [--only granian uvicorn] [--output BENCHMARKS.md] [--baseline DIR]

`--baseline` serves another checkout first (e.g. the commit before, unpacked with `git archive`).

Candidates whose package is not installed are reported as such.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from benchmarks.common import ARTIFACTS
from benchmarks.connection_abuse import hold, idle, slowloris
from benchmarks.load import Sampler, _kt_body, bare_ms, health_probe, median_ms, scenarios, statuses_text, wrk
from benchmarks.table import write_section

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
WORKERS = 2
HEADER_TIMEOUT_S = 3  # where the candidate has a header timeout: short, so that the slowloris cell sees it act
KEEP_ALIVE_S = 5
STALL_S = 5  # a worker that does not answer its manager's heartbeat for this long is killed, where supported
ABUSE_CONNECTIONS = 200


@dataclass(frozen=True)
class Candidate:
    name: str
    needs: str | None  # the module that must be importable, None for the tree itself
    command: Callable[[int], list[str]]  # the command line for a port
    env: dict[str, str]
    project: Path = ROOT  # the checkout it serves (its working directory and first on PYTHONPATH)


def candidates(baseline: Path | None) -> list[Candidate]:
    python = sys.executable
    app_env = {"MNEMO_WORKERS": str(WORKERS)}
    before = [
        Candidate("before (`python -m app` of the baseline)", None, lambda port: [python, "-m", "app"], {}, baseline)
    ]
    return [
        *(before if baseline else []),
        Candidate("this tree (`python -m app`)", "uvicorn_worker", lambda port: [python, "-m", "app"], {}),
        Candidate(
            "gunicorn + uvicorn-worker (h11)",
            "uvicorn_worker",
            lambda port: [
                *(python, "-m", "gunicorn", "app.main:app", "-k", "uvicorn_worker.UvicornH11Worker"),
                *("-w", str(WORKERS), "-b", f"{HOST}:{port}", "--timeout", str(STALL_S)),
                *("--keep-alive", str(KEEP_ALIVE_S), "--graceful-timeout", "30", "--log-level", "warning"),
            ],
            app_env,
        ),
        Candidate(
            "granian",
            "granian",
            lambda port: [
                *(python, "-m", "granian", "--interface", "asgi", "--http", "1", "--no-ws"),
                *("--host", HOST, "--port", str(port), "--workers", str(WORKERS)),
                *("--http1-header-read-timeout", str(HEADER_TIMEOUT_S * 1000), "--respawn-failed-workers"),
                *("--respawn-interval", "1", "--workers-kill-timeout", "30", "--log-level", "warning"),
                "app.main:app",
            ],
            app_env,
        ),
        Candidate(
            "uvicorn --workers (h11)",
            "uvicorn",
            lambda port: [
                *(python, "-m", "uvicorn", "app.main:app", "--http", "h11", "--workers", str(WORKERS)),
                *("--host", HOST, "--port", str(port), "--timeout-keep-alive", str(KEEP_ALIVE_S)),
                *("--timeout-worker-healthcheck", str(STALL_S), "--timeout-graceful-shutdown", "30"),
                *("--no-access-log", "--log-level", "warning"),
            ],
            app_env,
        ),
    ]


class Served:
    """One candidate on a free port (probe port: port + 1), ready once /ready answers 200 on the main port."""

    def __init__(self, candidate: Candidate) -> None:
        self.port = free_port_pair()
        self.url = f"http://{HOST}:{self.port}"
        self.probe_url = f"http://{HOST}:{self.port + 1}"
        self.metrics_dir = tempfile.mkdtemp(prefix="mnemo-bench-metrics-")
        env = {
            **os.environ,
            "MNEMO_HOST": HOST,
            "MNEMO_PORT": str(self.port),
            "MNEMO_PROBE_PORT": str(self.port + 1),
            "MNEMO_ARTIFACTS_DIR": str(ARTIFACTS),
            "MNEMO_WORKERS": str(WORKERS),
            "MNEMO_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "MNEMO_KEEP_ALIVE_S": str(KEEP_ALIVE_S),
            "MNEMO_WORKER_STALL_S": str(STALL_S),
            "MNEMO_LOG_LEVEL": "warning",
            "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir,
            "PYTHONPATH": os.pathsep.join([str(candidate.project), *filter(None, [os.environ.get("PYTHONPATH")])]),
            **candidate.env,
        }
        self.log_path = Path(tempfile.gettempdir()) / f"mnemo-servers-{self.port}.log"
        self.process = subprocess.Popen(
            candidate.command(self.port),
            env=env,
            cwd=candidate.project,
            stdout=self.log_path.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started_s = wait_ready(self.url, self.process, self.log_path)

    def workers(self) -> list[int]:
        """The serving processes: children of the manager, less helpers (the probe process, multiprocessing's)."""
        pids = []
        for pid in children(self.process.pid):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"probe_server" not in command and b"resource_tracker" not in command:
                pids.append(pid)
        return pids

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def free_port_pair() -> int:
    """A port p with p and p + 1 free (the main port and the probe port)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            port = probe.getsockname()[1]
        with socket.socket() as second:
            try:
                second.bind((HOST, port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two adjacent free ports")


def children(pid: int) -> list[int]:
    pids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(child) for child in (task / "children").read_text().split()]
    return pids


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 120) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"not ready in {timeout_s:g} s; see {log}")


# -- the cells ------------------------------------------------------------------------------------------
def speed(served: Served, seconds: int) -> list[str]:
    """Concurrency 1 p50 (x bare batch 1) and concurrency 32 items/s (x bare batch 32), per endpoint."""
    cells = []
    for scenario in scenarios():
        if scenario.path == "/similarity/batch" or "attention on" in scenario.name:  # the table's four columns
            continue
        single = bare_ms(scenario.bare_single)
        one = wrk(f"{served.url}{scenario.path}", scenario.body, 1, seconds, 30)
        batch_items_s = 32 * scenario.items / (median_ms(scenario.bare_batch32, 10) / 1000)
        many = wrk(f"{served.url}{scenario.path}", scenario.body, 32, seconds, 30)
        cells.append(f"{one.p50_ms:.2f} ({one.p50_ms / single:.2f}x)")
        cells.append(f"{many.ok_per_s * scenario.items:.0f} ({many.ok_per_s * scenario.items / batch_items_s:.2f}x)")
    return cells


def overload(served: Served, seconds: int) -> list[str]:
    """/health p99 on the probe port and on the main port while 256 connections send the heaviest histories."""
    probes = [Sampler(health_probe(target), interval=0.05) for target in (served.probe_url, served.url)]
    for sampler in probes:
        sampler.start()
    result = wrk(f"{served.url}/knowledge-trace", _kt_body(3000, None, True), 256, seconds, 15)
    p99s = [float(np.percentile(sampler.stop(), 99) * 1000) for sampler in probes]
    time.sleep(2)  # the queue empties before the next cell
    return [f"{p99s[0]:.1f}", f"{p99s[1]:.1f}", statuses_text(result)]


def abuse(served: Served, seconds: float) -> list[str]:
    """ABUSE_CONNECTIONS slowloris and idle connections held `seconds`: how many the server closed, and when."""
    cells = []
    for behave in (slowloris, idle):
        closed_at, answers = asyncio.run(hold(served.port, ABUSE_CONNECTIONS, seconds, behave))
        text = f"{len(closed_at)}/{ABUSE_CONNECTIONS} closed"
        if closed_at:
            text += f" (median {np.median(closed_at):.1f} s)"
        cells.append(text + (f" {dict(sorted(answers.items()))}" if answers else ""))
    return cells


def framing(served: Served) -> str:
    """How many of the framing cases (tests/integration/test_http_framing.py) get a 400 and close, nothing else run."""
    from tests.http_framing_cases import CASES, exchange

    failed = [name for name, request, check in CASES if not check(exchange(HOST, served.port, request))]
    return f"{len(CASES) - len(failed)}/{len(CASES)}" + (f" (wrong: {'; '.join(failed)})" if failed else "")


def worker_faults(served: Served, seconds: int) -> list[str]:
    """SIGKILL one worker, then SIGSTOP another, each under 8 connections of /similarity: failed requests in
    `seconds` of load, and how long until the manager has a fresh worker in its place."""
    body = next(s.body for s in scenarios() if s.path == "/similarity")
    cells = []
    for fault in (signal.SIGKILL, signal.SIGSTOP):
        victims = served.workers()
        if len(victims) < WORKERS:
            cells.append(f"only {len(victims)} worker(s) to start with")
            continue
        victim = victims[0]
        os.kill(victim, fault)
        signalled = time.monotonic()
        result = wrk(f"{served.url}/similarity", body, 8, seconds, 2)
        replaced_s = None
        while time.monotonic() - signalled < 20:
            current = served.workers()
            if victim not in current and len(current) == WORKERS:
                replaced_s = time.monotonic() - signalled
                break
            time.sleep(0.1)
        if fault == signal.SIGSTOP and victim in served.workers():
            os.kill(victim, signal.SIGCONT)
        failed = sum(v for k, v in result.statuses.items() if k >= 500) + sum(result.errors.values())
        replaced = f"replaced in {replaced_s:.1f} s" if replaced_s is not None else "not replaced in 20 s"
        cells.append(f"{failed} failed of {result.requests}; {replaced}")
        try:
            wait_ready(served.url, served.process, served.log_path, 60)
        except RuntimeError as error:
            cells.append(f"did not recover: {error}")
            break
    return cells


def accepted(port: int, connections: int) -> bool:
    """At least `connections` connections to `port` are established and none waits in its accept queue."""
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout.split()
    established = subprocess.run(
        ["ss", "-Htn", "state", "established", f"sport = :{port}"], capture_output=True, text=True
    )
    return bool(listening) and listening[1] == "0" and len(established.stdout.splitlines()) >= connections


def drain(served: Served, in_flight: int = 32) -> str:
    """SIGTERM once the server has accepted the connections of `in_flight` heavy /knowledge-trace requests: their
    answers, and the exit."""
    body = _kt_body(3000, None, attention=True)

    async def run() -> tuple[list, float, int]:
        limits = httpx.Limits(max_connections=in_flight)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            answered_before = 0

            async def one() -> httpx.Response:
                nonlocal answered_before
                response = await client.post(f"{served.url}/knowledge-trace", json=body)
                answered_before += not signalled_at
                return response

            signalled_at = 0.0
            tasks = [asyncio.create_task(one()) for _ in range(in_flight)]
            deadline = time.monotonic() + 10
            while not accepted(served.port, in_flight) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            os.kill(served.process.pid, signal.SIGTERM)
            signalled_at = time.perf_counter()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.to_thread(served.process.wait, 60)
            return outcomes, time.perf_counter() - signalled_at, answered_before

    outcomes, seconds, before = asyncio.run(run())
    answered = [o.status_code for o in outcomes if isinstance(o, httpx.Response)]
    failed = len(outcomes) - len(answered)
    counts = {status: answered.count(status) for status in sorted(set(answered))}
    return (
        f"{counts}, {failed} failed, {before} done before the signal; exit {served.process.returncode}, {seconds:.1f} s"
    )


def measure(candidate: Candidate, seconds: int) -> list[str]:
    if candidate.needs and importlib.util.find_spec(candidate.needs) is None:
        return [candidate.name, f"not installed ({candidate.needs})"]
    served = Served(candidate)
    try:
        row = [candidate.name, f"{served.started_s:.1f}"]
        row += speed(served, seconds)
        row += overload(served, seconds * 2)
        row += abuse(served, HEADER_TIMEOUT_S + 3)
        row.append(framing(served))
        row += worker_faults(served, seconds * 2)
        row.append(drain(served))
    except Exception as error:  # one candidate's failure is a cell of the table, not the end of the run
        row = [candidate.name, f"failed: {error}"]
    finally:
        served.stop()
    print(" | ".join(row), flush=True)
    return row


HEADER = [
    "candidate",
    "start to /ready s",
    "/similarity c=1 p50 ms (x bare)",
    "/similarity c=32 pairs/s (x bare b32)",
    "/knowledge-trace c=1 p50 ms (x bare)",
    "/knowledge-trace c=32 histories/s (x bare b32)",
    "/health p99 ms, probe port, overload",
    "/health p99 ms, main port, overload",
    "overload answers",
    f"{ABUSE_CONNECTIONS} slowloris",
    f"{ABUSE_CONNECTIONS} idle sockets",
    "framing cases right",
    "SIGKILL a worker",
    "SIGSTOP a worker",
    "SIGTERM, 32 in flight",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=3, help="wrk duration per speed cell")
    parser.add_argument("--only", nargs="+", help="candidates whose name contains one of these words")
    parser.add_argument("--output", type=Path, help="write the table into this file's `servers` section")
    parser.add_argument("--baseline", type=Path, help="a checkout of the tree before the change, served first")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 8192), hard), hard))
    chosen = [c for c in candidates(args.baseline) if not args.only or any(word in c.name for word in args.only)]
    rows = [measure(candidate, args.seconds) for candidate in chosen]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    table = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    table += ["| " + " | ".join(row + [""] * (len(HEADER) - len(row))) + " |" for row in rows]
    text = "\n".join(
        [
            "## Servers (`python -m benchmarks.servers`)",
            "",
            f"Measured {when} in one run on {os.cpu_count()} shared CPUs (other work ran on the machine), "
            f"{WORKERS} workers each, wrk {args.seconds} s per speed cell, {args.seconds * 2} s for the overload "
            f"and worker cells; header timeout {HEADER_TIMEOUT_S} s and worker heartbeat {STALL_S} s where the "
            "candidate has them. Bare ONNX Runtime: batch 1 (c=1) and batch 32 (c=32) on the same inputs.",
            "",
            *table,
            "",
        ]
    )
    print(text)
    if args.output:
        write_section(args.output, "servers", text)


if __name__ == "__main__":
    main()
