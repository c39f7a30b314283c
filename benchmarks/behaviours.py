"""`python -m benchmarks.behaviours --base DIR`: issue 27's behaviours, this tree against a baseline tree, in one run.

Both trees' `python -m app` (each from its own directory, with its own committed models and its own entry point:
the baseline's supervisor, this tree's gunicorn) run side by side on free loopback ports with the same
settings: MNEMO_WORKERS=2, a probe port (MNEMO_PROBE_PORT, what the deployment files probe), a worker
heartbeat of 5 s, a fresh SQLite student store, every other setting at its default. Each scenario runs on
both, the order alternating from one scenario to the next, so a drift of the shared machine hits both:

- bad input: the hostile corpus of tests/integration/test_hostile_requests.py and the framing cases of
  tests/http_framing_cases.py;
- overload: the overload mix (3,000-interaction histories with attention) at 64 and 256 connections, /health
  probed on the probe port and on the main port meanwhile;
- connection abuse: slowloris and idle sockets held past the header timeout (this tree's also behind
  deploy/nginx/nginx.conf, which its deployment files put in front);
- memory ceiling: the service's RSS (every process) under bodies over MNEMO_MAX_BODY_BYTES and near it;
- workers: a worker killed (SIGKILL), then one stopped (SIGSTOP), under load;
- students: appends to many students, appends racing on one (compare-and-swap: no update may be lost), reads;
- OIP: v2 infer at concurrency 1 and 32, and the protocol's error shape;
- explorer: the page in Debian's Chromium (Playwright), and what it loads;
- drain: SIGTERM once 32 requests are sent and accepted (last: it ends each service).

The table (scenario, metric, base, new, verdict) replaces the `behaviours` section of BENCHMARKS.md. Every loop is
bounded in count and time, and traffic goes to 127.0.0.1 only.

    git worktree add /tmp/base fd656d7
    python -m benchmarks.behaviours --base /tmp/base [--seconds 5] [--rounds 5] [--output FILE] [--only overload]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import httpx
import numpy as np

from benchmarks.connection_abuse import hold, idle, slowloris
from benchmarks.load import Sampler, _kt_body, health_probe, rss_mb, wrk
from benchmarks.servers import Candidate, Served, accepted, children, wait_ready
from benchmarks.table import write_section

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
KT_MODEL = "dkvmn-assist2009"
SIMILARITY = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument."}
ABUSE_CONNECTIONS = 200  # of each kind, slowloris and idle, at once
ABUSE_HOLD_S = 13  # past the 10 s header timeout of the baseline and of deploy/nginx/nginx.conf
ANSWER_TIMEOUT_S = 30  # a client's wait for one answer (the services' deadline is 10 s)
K8S_LIMIT_MB = 2048  # the memory limit of deploy/k8s/base/deployment.yaml, in both trees
EXPLORER_LOADS = 6
REPLACEMENT_WAIT_S = 20  # the figure given for a worker not replaced
MAX_OUTCOMES = 100_000  # a bound on the requests of any load cell, whatever its time


# -- the verdict --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """Which way a figure improves, and how far it may move the other way and still count as the same: more
    than `relative` times the baseline's value and more than `absolute`, in the figure's unit."""

    better: str  # "lower" or "higher"
    relative: float = 0.0
    absolute: float = 0.0
    unit: str = ""

    def text(self) -> str:
        """The rule in words, as the table's last column shows it."""
        slack = [f"{self.relative:.0%}"] if self.relative else []
        slack += [f"{self.absolute:g}{self.unit}"] if self.absolute else []
        if not slack:
            return f"{self.better} is better; any change counts"
        within = slack[0] if len(slack) == 1 else f"max({', '.join(slack)})"
        return f"{self.better} is better; same within {within}"


TIME = Rule("lower", relative=0.25, absolute=5.0, unit=" ms")  # on a shared machine
RATE = Rule("higher", relative=0.25)
MEMORY = Rule("lower", relative=0.25, absolute=20.0, unit=" MB")
FAILURES = Rule("lower")  # counts of failed requests, lost updates, errors
SHARE_LOW = Rule("lower", absolute=0.02)
SHARE_HIGH = Rule("higher", absolute=0.02)
RIGHT = Rule("higher")  # counts of cases handled right
REPLACED = Rule("lower", relative=0.25, absolute=1.0, unit=" s")  # seconds until a new worker


def verdict(base: float | None, new: float | None, rule: Rule) -> str:
    """`worse`, `same` or `better` for `new` against `base` by `rule`; `n/a` where either was not measured."""
    if base is None or new is None or np.isnan(base) or np.isnan(new):
        return "n/a"
    slack = max(rule.relative * abs(base), rule.absolute)
    gain = (base - new) if rule.better == "lower" else (new - base)
    if gain < -slack:
        return "worse"
    return "better" if gain > slack else "same"


@dataclass(frozen=True)
class Metric:
    scenario: str
    name: str
    key: str
    rule: Rule
    digits: int = 1


METRICS = [
    Metric("bad input", "hostile corpus: share answered 4xx", "bad.share_4xx", SHARE_HIGH, 3),
    Metric("bad input", "hostile corpus: answered 5xx", "bad.5xx", FAILURES, 0),
    Metric("bad input", "hostile corpus: no answer", "bad.none", FAILURES, 0),
    Metric("bad input", "hostile corpus: p50 ms", "bad.p50_ms", TIME, 2),
    Metric("bad input", "/health 200 after the corpus (1 yes)", "bad.alive", RIGHT, 0),
    Metric("bad input", "malformed requests: a JSON answer with X-Request-ID (of 5)", "bad.json_400", RIGHT, 0),
    Metric("bad input", "HTTP framing cases right (of 20)", "bad.framing", RIGHT, 0),
    *(
        Metric("overload", f"{c} conns: {name}", f"overload{c}.{key}", rule, digits)
        for c in (64, 256)
        for name, key, rule, digits in (
            ("share answered 429/503", "rejected", SHARE_HIGH, 3),
            ("429/503 p50 ms", "rejected_p50_ms", TIME, 1),
            ("read errors (no answer)", "errors", FAILURES, 0),
            ("admitted p99 ms", "admitted_p99_ms", TIME, 0),
            ("share of admitted ending 504", "share_504", SHARE_LOW, 3),
            ("/health p99 ms, probe port", "probe_p99_ms", TIME, 1),
            ("/health p99 ms, main port", "main_p99_ms", TIME, 1),
        )
    ),
    *(
        Metric("connection abuse", f"{front}: {name}", f"abuse{suffix}.{key}", rule, digits)
        for front, suffix in (("python -m app", ""), ("new behind deploy/nginx", "_nginx"))
        for name, key, rule, digits in (
            (f"slowloris closed in {ABUSE_HOLD_S} s (of {ABUSE_CONNECTIONS})", "slowloris", RIGHT, 0),
            (f"idle sockets closed in {ABUSE_HOLD_S} s (of {ABUSE_CONNECTIONS})", "idle", RIGHT, 0),
            ("/health failures meanwhile", "health_failed", FAILURES, 0),
            ("/health 200 afterwards (1 yes)", "alive", RIGHT, 0),
        )
    ),
    Metric("memory ceiling", "RSS idle MB, all processes", "memory.idle_mb", MEMORY, 0),
    Metric("memory ceiling", "RSS peak over idle MB, 8 MiB bodies", "memory.over_mb", MEMORY, 0),
    Metric("memory ceiling", "share of 8 MiB bodies answered 413", "memory.share_413", SHARE_HIGH, 3),
    Metric("memory ceiling", "RSS peak over idle MB, 10,000-step histories", "memory.near_mb", MEMORY, 0),
    Metric("memory ceiling", f"RSS peak MB (deploy/k8s limit {K8S_LIMIT_MB:,})", "memory.peak_mb", MEMORY, 0),
    Metric("workers", "SIGKILL: failed requests", "workers.kill_failed", FAILURES, 0),
    Metric("workers", "SIGKILL: s to a new worker (20: not in 20 s)", "workers.kill_replaced_s", REPLACED, 1),
    Metric("workers", "SIGSTOP: failed requests", "workers.stop_failed", FAILURES, 0),
    Metric("workers", "SIGSTOP: s to a new worker (20: not in 20 s)", "workers.stop_replaced_s", REPLACED, 1),
    Metric("students", "appends/s, 16 students", "students.appends_s", RATE, 0),
    Metric("students", "appends/s, 16 racing on one student", "students.racing_s", RATE, 0),
    Metric("students", "racing appends: lost updates", "students.lost", FAILURES, 0),
    Metric("students", "racing appends: not 200", "students.refused", FAILURES, 0),
    Metric("students", "reads/s, 16 connections", "students.reads_s", RATE, 0),
    Metric("OIP", "v2 infer c=1 p50 ms", "oip.c1_p50_ms", TIME, 2),
    Metric("OIP", "v2 infer c=32 per s", "oip.c32_s", RATE, 0),
    Metric("OIP", "error cases in the protocol's shape", "oip.errors_right", RIGHT, 0),
    Metric("explorer", "page ready in Chromium, ms", "explorer.ready_ms", Rule("lower", 0.5, 200, " ms"), 0),
    Metric("explorer", "console errors", "explorer.console_errors", FAILURES, 0),
    Metric("explorer", "page requests not 2xx/304", "explorer.failed", FAILURES, 0),
    Metric("explorer", "page and files, KB", "explorer.kb", Rule("lower", 0.25), 0),
    Metric("drain", "32 sent before SIGTERM: answered 200", "drain.ok", RIGHT, 0),
    Metric("drain", "32 sent before SIGTERM: answered 503", "drain.refused", FAILURES, 0),
    Metric("drain", "32 sent before SIGTERM: no answer", "drain.lost", FAILURES, 0),
    Metric("drain", "exit status", "drain.exit", FAILURES, 0),
]


# -- a raw HTTP/1.1 client: the status and time of every request (wrk's script sums latencies over statuses) --
def post_request(path: str, body: bytes, close: bool = False) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


def get_request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response whole (a Content-Length or a chunked body): its status, and whether the connection
    stays open."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    if headers.get("transfer-encoding") == "chunked":
        size = -1
        while size:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)  # the chunk and its CRLF; the last: the empty trailer section's CRLF
    else:
        await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers.get("connection") != "close"


Outcome = tuple[int | str, float]  # a status, or the name of the error that ended the request; seconds


async def hammer(port: int, requests: list[bytes], connections: int, seconds: float) -> tuple[list[Outcome], float]:
    """`connections` keep-alive clients, client i sending requests[i % len(requests)] one after the other for
    `seconds` (and at most MAX_OUTCOMES requests in all): every outcome, and the seconds it took."""
    outcomes: list[Outcome] = []
    started = time.monotonic()

    async def client(request: bytes) -> None:
        writer = None
        while time.monotonic() - started < seconds and len(outcomes) < MAX_OUTCOMES:
            sent = time.perf_counter()
            keep = False
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(HOST, port, limit=1 << 20)
                writer.write(request)
                status, keep = await asyncio.wait_for(read_answer(reader), ANSWER_TIMEOUT_S)
                outcomes.append((status, time.perf_counter() - sent))
            except (OSError, EOFError, TimeoutError, ValueError) as error:  # IncompleteReadError is an EOFError
                outcomes.append((type(error).__name__, time.perf_counter() - sent))
                await asyncio.sleep(0.01)
            if not keep and writer is not None:
                writer.close()
                writer = None
        if writer is not None:
            writer.close()

    await asyncio.gather(*(client(requests[index % len(requests)]) for index in range(connections)))
    return outcomes, time.monotonic() - started


def hammer_in_process(port: int, requests: list[bytes], connections: int, seconds: float):
    """`hammer` run to completion (in the pool's process, so that its work does not delay this one's probes)."""
    return asyncio.run(hammer(port, requests, connections, seconds))


def statuses(outcomes: list[Outcome]) -> Counter:
    return Counter(status for status, _ in outcomes)


def answered(outcomes: list[Outcome]) -> list[Outcome]:
    return [(status, seconds) for status, seconds in outcomes if isinstance(status, int)]


def percentile_ms(outcomes: list[Outcome], q: float) -> float:
    return float(np.percentile([seconds for _, seconds in outcomes], q) * 1000) if outcomes else float("nan")


@dataclass
class Run:
    """What every scenario gets besides its service: the cell length and the load generator's process."""

    seconds: float
    pool: ProcessPoolExecutor

    def hammer(self, port: int, requests: list[bytes], connections: int, seconds: float | None = None):
        return self.pool.submit(hammer_in_process, port, requests, connections, seconds or self.seconds).result()


# -- the services -------------------------------------------------------------------------------------
def serve(tree: Path, state: Path) -> Served:
    """`python -m app` of checkout `tree`, its own models, students in `state`; benchmarks/servers.py's settings,
    but the baseline's default header timeout (10 s, where servers.py shortens it) and an 8 s worker heartbeat."""
    python = sys.executable
    env = {
        "MNEMO_ARTIFACTS_DIR": str(tree / "artifacts"),
        "MNEMO_STATE_URL": f"sqlite://{state}",
        "MNEMO_HEADER_TIMEOUT_S": "10",
        "MNEMO_WORKER_STALL_S": "8",
    }
    return Served(Candidate(f"`python -m app` of {tree}", None, lambda port: [python, "-m", "app"], env, tree))


def family(pid: int) -> list[int]:
    """`pid` and its descendants."""
    pids, pending = [], [pid]
    while pending:
        current = pending.pop()
        with suppress(FileNotFoundError, ProcessLookupError):
            pending += children(current)
            pids.append(current)
    return pids


def total_rss_mb(pid: int) -> float:
    """The RSS of the service: its first process and every descendant (workers, probe process)."""
    total = 0.0
    for each in family(pid):
        with suppress(FileNotFoundError, ProcessLookupError, AttributeError):
            total += rss_mb(each)
    return total


@contextmanager
def nginx_in_front(app_port: int) -> Iterator[int]:
    """deploy/nginx/nginx.conf as it is but for its ports and its files' directory: nginx's port."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if nginx is None:
        raise RuntimeError("nginx is not installed (`make system-deps`)")
    prefix = Path(tempfile.mkdtemp(prefix="mnemo-behaviours-nginx-"))
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    config = (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
    for pattern, value in {
        r"server 127\.0\.0\.1:8000;": f"server {HOST}:{app_port};",
        r"listen 8080 reuseport;": f"listen {HOST}:{port};",
        r"/tmp/": f"{prefix}/",
    }.items():
        config, count = re.subn(pattern, value, config)
        if not count:
            raise RuntimeError(f"{pattern} is no longer in deploy/nginx/nginx.conf")
    (prefix / "nginx.conf").write_text(config)
    command = [nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("nginx did not listen") from None
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(prefix, ignore_errors=True)


# -- the scenarios: each takes a service and the run, and returns its figures by key ------------------
MALFORMED = [  # fd656d7's tests/test_hostile_requests.py required its parser's 400 in the service's shape for these
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
    b"get /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


def hostile_corpus() -> list[bytes]:
    """tests/integration/test_hostile_requests.py's hostile requests, each on its own connection: the bodies (with
    non-finite numbers, lone surrogates, wrong types, sizes past the limits), the odd methods, paths, headers and
    framing, and the bodies not in UTF-8."""
    from tests.integration.test_hostile_requests import (
        BODIES,
        JSON_BODIES,
        NON_FINITE_AND_UNICODE,
        NOT_UTF8,
        REQUESTS,
    )

    bodies = [*BODIES, *((path, body) for path, body, _ in NON_FINITE_AND_UNICODE)]
    bodies += [(path, encode(body)) for path, body in JSON_BODIES for encode, _ in NOT_UTF8]
    return [post_request(path, body, close=True) for path, body in bodies] + REQUESTS


def bad_input(served: Served, run: Run) -> dict[str, float]:
    """The hostile corpus: 4xx, 5xx, no answer, p50; then /health; the malformed requests whose answer the
    baseline's tests required in the service's shape (JSON, a request id; RFC 9112 allows other statuses than
    its 400 for three of them, so any status under 500 counts); the framing cases."""
    from tests.http_framing_cases import CASES, exchange
    from tests.integration.test_hostile_requests import raw

    codes, times = [], []
    for request in hostile_corpus():
        started = time.perf_counter()
        answer = raw(served, request)
        times.append((time.perf_counter() - started) * 1000)
        codes.append(int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0)
    alive = httpx.get(f"{served.url}/health", timeout=5).status_code == 200
    shaped = 0
    for request in MALFORMED:
        head = raw(served, request).partition(b"\r\n\r\n")[0]
        shaped += (
            re.match(rb"HTTP/1\.1 [1-4]\d\d ", head) is not None
            and re.search(rb"(?im)^content-type: application/json\r?$", head) is not None
            and re.search(rb"(?im)^x-request-id: \S+\r?$", head) is not None
        )
    framing = sum(check(exchange(HOST, served.port, request)) for _, request, check in CASES)
    return {
        "bad.share_4xx": sum(400 <= code < 500 for code in codes) / len(codes),
        "bad.5xx": sum(code >= 500 for code in codes),
        "bad.none": codes.count(0),
        "bad.p50_ms": float(np.median(times)),
        "bad.alive": float(alive),
        "bad.json_400": shaped,
        "bad.framing": framing,
    }


def overload(served: Served, run: Run) -> dict[str, float]:
    """The overload mix at 64 and 256 connections for 2 x seconds each, /health probed every 50 ms on both ports
    meanwhile."""
    request = post_request("/knowledge-trace", json.dumps(_kt_body(3000, None, attention=True)).encode())
    figures = {}
    for connections in (64, 256):
        probes = [Sampler(health_probe(url), interval=0.05) for url in (served.probe_url, served.url)]
        for probe in probes:
            probe.start()
        outcomes, _ = run.hammer(served.port, [request], connections, 2 * run.seconds)
        probe_p99, main_p99 = (float(np.percentile(probe.stop(), 99) * 1000) for probe in probes)
        answers = answered(outcomes)
        admitted = [(status, seconds) for status, seconds in answers if status not in (429, 503)]
        rejected = [(status, seconds) for status, seconds in answers if status in (429, 503)]
        figures |= {
            f"overload{connections}.rejected": 1 - len(admitted) / max(len(answers), 1),
            f"overload{connections}.rejected_p50_ms": percentile_ms(rejected, 50),
            f"overload{connections}.errors": len(outcomes) - len(answers),
            f"overload{connections}.admitted_p99_ms": percentile_ms(admitted, 99),
            f"overload{connections}.share_504": (
                sum(status == 504 for status, _ in admitted) / len(admitted) if admitted else float("nan")
            ),
            f"overload{connections}.probe_p99_ms": probe_p99,
            f"overload{connections}.main_p99_ms": main_p99,
        }
        print(f"  {connections} connections: {dict(sorted(statuses(outcomes).items(), key=str))}", flush=True)
        time.sleep(3)  # the admitted work ends before the next cell
    return figures


def abuse_figures(port: int, url: str, prefix: str) -> dict[str, float]:
    """ABUSE_CONNECTIONS slowloris and as many idle connections at once, held ABUSE_HOLD_S, /health probed on
    `url` meanwhile: how many of each the server closed, the probes that failed, and /health afterwards."""
    from benchmarks.connection_abuse import health_probe as probe_health

    async def scenario() -> tuple[list, list, list]:
        stop, health = asyncio.Event(), []
        probe = asyncio.ensure_future(probe_health(url, stop, health))
        (slow, _), (quiet, _) = await asyncio.gather(
            hold(port, ABUSE_CONNECTIONS, ABUSE_HOLD_S, slowloris), hold(port, ABUSE_CONNECTIONS, ABUSE_HOLD_S, idle)
        )
        stop.set()
        await probe
        return slow, quiet, health

    slow, quiet, health = asyncio.run(scenario())
    try:
        alive = httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        alive = False
    return {
        f"{prefix}.slowloris": len(slow),
        f"{prefix}.idle": len(quiet),
        f"{prefix}.health_failed": sum(not isinstance(sample, float) for sample in health),
        f"{prefix}.alive": float(alive),
    }


def connection_abuse(served: Served, run: Run) -> dict[str, float]:
    return abuse_figures(served.port, served.url, "abuse")


def connection_abuse_behind_nginx(served: Served, run: Run) -> dict[str, float]:
    with nginx_in_front(served.port) as port:
        return abuse_figures(port, f"http://{HOST}:{port}", "abuse_nginx")


def memory_ceiling(served: Served, run: Run) -> dict[str, float]:
    """The service's RSS idle, and its peak over that while 32 clients send 8 MiB bodies (over the 1 MiB
    MNEMO_MAX_BODY_BYTES), then while 16 send 10,000-step histories with attention (under it; 4.8 MB answers)."""
    idle_mb = total_rss_mb(served.process.pid)
    oversized = post_request("/knowledge-trace", b" " * (8 << 20))
    history = [{"question": 1 + index % 100, "correct": index % 3 == 0} for index in range(10_000)]
    near = post_request(
        "/knowledge-trace", json.dumps({"model": KT_MODEL, "interactions": history, "return_attention": True}).encode()
    )
    figures = {"memory.idle_mb": idle_mb}
    for key, request, connections in (("over", oversized, 32), ("near", near, 16)):
        sampler = Sampler(lambda: total_rss_mb(served.process.pid), interval=0.1)
        sampler.start()
        outcomes, _ = run.hammer(served.port, [request], connections)
        peak_mb = max(sampler.stop())
        figures[f"memory.{key}_mb"] = peak_mb - idle_mb
        figures["memory.peak_mb"] = max(peak_mb, figures.get("memory.peak_mb", 0.0))
        if key == "over":
            answers = answered(outcomes)
            figures["memory.share_413"] = sum(status == 413 for status, _ in answers) / max(len(outcomes), 1)
        print(f"  {key}: {dict(sorted(statuses(outcomes).items(), key=str))}", flush=True)
        time.sleep(3)
    return figures


def worker_faults(served: Served, run: Run) -> dict[str, float]:
    """SIGKILL one worker, then SIGSTOP one, each under 8 connections of /similarity for 2 x seconds (wrk's
    timeout 2 s): requests that failed (5xx or no answer), and the seconds from the signal until a new worker
    replaced it (polled while the load runs)."""
    body = {**SIMILARITY, "return_attention": False}
    figures = {}
    for fault, key in ((signal.SIGKILL, "kill"), (signal.SIGSTOP, "stop")):
        victim = served.workers()[0]
        with ThreadPoolExecutor(1) as load:
            os.kill(victim, fault)
            signalled = time.monotonic()
            running = load.submit(wrk, f"{served.url}/similarity", body, 8, round(2 * run.seconds), 2)
            replaced_s = REPLACEMENT_WAIT_S
            while time.monotonic() - signalled < REPLACEMENT_WAIT_S:
                current = served.workers()
                if victim not in current and len(current) >= 2:
                    replaced_s = time.monotonic() - signalled
                    break
                time.sleep(0.05)
            result = running.result()
        with suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
        failed = sum(count for status, count in result.statuses.items() if status >= 500) + sum(result.errors.values())
        figures |= {f"workers.{key}_failed": failed, f"workers.{key}_replaced_s": replaced_s}
        wait_ready(served.url, served.process, served.log_path, 60)
        time.sleep(1)
    return figures


def students(served: Served, run: Run) -> dict[str, float]:
    """One-answer appends from 16 connections to 16 students, then to one student (the compare-and-swap races:
    every acknowledged append must be stored, once), then reads of the 16."""
    from tests.http_framing_cases import stored_interactions

    answer = b'{"interactions": [{"question": 12, "correct": true}]}'
    prefix = f"behaviours-{served.port}-{time.time_ns()}"
    many = [post_request(f"/students/{prefix}-{index}/interactions", answer) for index in range(16)]
    outcomes, elapsed = run.hammer(served.port, many, 16)
    figures = {"students.appends_s": statuses(outcomes)[200] / elapsed}
    outcomes, elapsed = run.hammer(served.port, [post_request(f"/students/{prefix}-race/interactions", answer)], 16)
    acknowledged = statuses(outcomes)[200]
    figures |= {
        "students.racing_s": acknowledged / elapsed,
        "students.lost": abs(acknowledged - stored_interactions(HOST, served.port, f"{prefix}-race")),
        "students.refused": len(outcomes) - acknowledged,
    }
    print(f"  racing: {dict(statuses(outcomes))}", flush=True)
    outcomes, elapsed = run.hammer(served.port, [get_request(f"/students/{prefix}-{index}") for index in range(16)], 16)
    figures["students.reads_s"] = statuses(outcomes)[200] / elapsed
    return figures


def oip_body(steps: int = 200) -> dict:
    """One history of `steps` interactions for the knowledge-tracing model, as Open Inference Protocol JSON."""
    generator = np.random.default_rng(0)
    return {
        "inputs": [
            {"name": "q", "shape": [1, steps], "datatype": "INT64", "data": generator.integers(1, 111, steps).tolist()},
            {"name": "r", "shape": [1, steps], "datatype": "INT64", "data": generator.integers(0, 2, steps).tolist()},
            {"name": "len", "shape": [1], "datatype": "INT64", "data": [steps]},
        ]
    }


KT_INFER = f"models/{KT_MODEL}/infer"
OIP_ERRORS = [  # method, path under /v2, body: each must be a 4xx whose JSON is {"error": "<message>"}
    ("POST", KT_INFER, b"{"),
    ("POST", KT_INFER, b'{"inputs": []}'),
    ("POST", KT_INFER, b'{"inputs": [{"name": "q", "shape": [1, 1], "datatype": "INT64", "data": ["x"]}]}'),
    ("POST", KT_INFER, b'{"inputs": [{"name": "q", "shape": [1, 2], "datatype": "INT64", "data": [1]}]}'),
    ("POST", KT_INFER, b'{"inputs": [{"name": "z", "shape": [1], "datatype": "INT64", "data": [1]}]}'),
    ("POST", "models/no-such-model/infer", json.dumps(oip_body(2)).encode()),
    ("POST", KT_INFER, b"x" * (3 << 20)),
    ("GET", KT_INFER, b""),
    ("POST", f"repository/models/{KT_MODEL}/load", b""),
]


def oip(served: Served, run: Run) -> dict[str, float]:
    """v2 infer on one 200-step history at concurrency 1 (p50) and 32 (answers/s), and the error cases."""
    url = f"{served.url}/v2/models/{KT_MODEL}/infer"
    seconds = round(run.seconds)
    one, many = (wrk(url, oip_body(), connections, seconds, 30) for connections in (1, 32))
    right = 0
    for method, path, body in OIP_ERRORS:
        headers = {"content-type": "application/json"}
        response = httpx.request(method, f"{served.url}/v2/{path}", content=body, headers=headers, timeout=30)
        with suppress(ValueError):
            shape = response.json()
            right += 400 <= response.status_code < 500 and list(shape) == ["error"] and bool(shape["error"])
    return {
        "oip.c1_p50_ms": one.p50_ms if set(one.statuses) == {200} else float("nan"),
        "oip.c32_s": many.ok_per_s,
        "oip.errors_right": right,
    }


def explorer(served: Served, run: Run) -> dict[str, float]:
    """The explorer page in Debian's Chromium (tests/integration/test_explorer.py's browser and page watcher),
    loaded EXPLORER_LOADS times, each in a fresh context: the median ms until it is ready (the first load left out),
    console errors and requests that were not 2xx or 304 (of every load), and the size of what it loaded."""
    from playwright.sync_api import sync_playwright

    from tests.integration.test_explorer import CHROMIUM, CHROMIUM_ARGS, watching

    codes: list[int] = []
    ready_ms = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for _ in range(EXPLORER_LOADS):
                with watching(browser, served.url) as watched:
                    watched.page.on("response", lambda response: codes.append(response.status))
                    started = time.perf_counter()
                    watched.open()
                    ready_ms.append((time.perf_counter() - started) * 1000)
                    console_errors, urls = len(watched.console_errors), sorted(set(watched.requests))
        finally:
            browser.close()
    loaded = [httpx.get(url, timeout=10) for url in urls if url.startswith(served.url)]
    return {
        "explorer.ready_ms": float(np.median(ready_ms[1:])),
        "explorer.console_errors": console_errors,
        "explorer.failed": sum(not (200 <= code < 300 or code == 304) for code in codes),
        "explorer.kb": sum(len(response.content) for response in loaded) / 1024,
    }


def drain(served: Served, run: Run, in_flight: int = 32) -> dict[str, float]:
    """`in_flight` /knowledge-trace requests (1,000 interactions) sent whole on their own connections; once the
    server has accepted every connection, SIGTERM: their answers, and the exit status. It ends the service."""
    request = post_request("/knowledge-trace", json.dumps(_kt_body(1000, [1], attention=False)).encode())

    async def scenario() -> list:
        connections = [await asyncio.open_connection(HOST, served.port) for _ in range(in_flight)]
        for _, writer in connections:
            writer.write(request)
        await asyncio.gather(*(writer.drain() for _, writer in connections))
        deadline = time.monotonic() + 10
        while not accepted(served.port, in_flight) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        os.kill(served.process.pid, signal.SIGTERM)
        answers = [asyncio.wait_for(read_answer(reader), 60) for reader, _ in connections]
        outcomes = await asyncio.gather(*answers, return_exceptions=True)
        for _, writer in connections:
            writer.close()
        return outcomes

    outcomes = asyncio.run(scenario())
    exit_status = served.process.wait(90)
    codes = Counter(outcome[0] if isinstance(outcome, tuple) else type(outcome).__name__ for outcome in outcomes)
    print(f"  answers {dict(codes)}, exit {exit_status}", flush=True)
    return {
        "drain.ok": codes[200],
        "drain.refused": codes[503],
        "drain.lost": sum(not isinstance(outcome, tuple) for outcome in outcomes),
        "drain.exit": abs(exit_status),
    }


SCENARIOS: list[tuple[str, Callable[[Served, Run], dict[str, float]]]] = [
    ("bad input", bad_input),
    ("overload", overload),
    ("connection abuse", connection_abuse),
    ("memory ceiling", memory_ceiling),
    ("workers", worker_faults),
    ("students", students),
    ("OIP", oip),
    ("explorer", explorer),
    ("drain", drain),  # last: it ends the services
]
REPEATED = ("overload", "students", "OIP", "explorer", "workers")  # a shared machine, or chance, moves their figures


# -- the run and the table ----------------------------------------------------------------------------
def cell(value: float | None, digits: int) -> str:
    if value is None or np.isnan(value):
        return "–"
    return f"{value:,.{digits}f}"


def table(figures: dict[str, dict[str, float]]) -> list[str]:
    lines = ["| scenario | metric | base | new | verdict | rule |", "|---|---|---|---|---|---|"]
    for metric in METRICS:
        base, new = (figures[label].get(metric.key) for label in ("base", "new"))
        lines.append(
            f"| {metric.scenario} | {metric.name} | {cell(base, metric.digits)} | {cell(new, metric.digits)} | "
            f"{verdict(base, new, metric.rule)} | {metric.rule.text()} |"
        )
    return lines


def commit_of(tree: Path) -> str:
    command = ["git", "-C", str(tree), "log", "-1", "--format=%h"]
    return subprocess.run(command, capture_output=True, text=True).stdout.strip() or "?"


def measure(trees: dict[str, Path], seconds: float, only: list[str], rounds: int) -> dict[str, dict[str, float]]:
    """Every scenario on both trees' services, the order alternating (a REPEATED scenario `rounds` times, each figure
    the median of its rounds); a scenario that fails is reported, and its figures are missing (n/a), not the end of
    the run."""
    samples: dict[str, dict[str, list[float]]] = {label: {} for label in trees}
    state = Path(tempfile.mkdtemp(prefix="mnemo-behaviours-"))
    services: dict[str, Served] = {}
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        run = Run(seconds, pool)
        try:
            for label, tree in trees.items():
                services[label] = serve(tree, state / f"{label}.db")
                print(f"{label}: {tree} on {services[label].url}, ready in {services[label].started_s:.1f} s")
            steps = list(SCENARIOS)
            steps.insert(3, ("connection abuse behind nginx", connection_abuse_behind_nginx))
            steps = [(name, step) for name, step in steps if not only or any(word in name for word in only)]
            turn = 0
            for name, step in steps:
                for _ in range(rounds if name in REPEATED else 1):
                    labels = list(trees) if turn % 2 == 0 else list(reversed(trees))
                    turn += 1
                    for label in ["new"] if step is connection_abuse_behind_nginx else labels:
                        started = time.monotonic()
                        try:
                            for key, value in step(services[label], run).items():
                                samples[label].setdefault(key, []).append(value)
                        except Exception as error:  # one scenario's failure is a missing figure, not the run's end
                            print(f"  {name} on {label} failed: {error!r}", flush=True)
                        print(f"{name} on {label}: {time.monotonic() - started:.0f} s", flush=True)
        finally:
            for served in services.values():
                with suppress(ProcessLookupError):
                    os.killpg(served.process.pid, signal.SIGKILL)
                served.process.wait(30)
            shutil.rmtree(state, ignore_errors=True)
    figures = {  # of the rounds that measured it: a round with nothing refused has no refusal latency
        label: {
            key: float(np.median(values)) if (values := [v for v in all_values if not np.isnan(v)]) else np.nan
            for key, all_values in by_key.items()
        }
        for label, by_key in samples.items()
    }
    figures["base"] |= {
        key.replace("abuse.", "abuse_nginx."): value
        for key, value in figures["base"].items()
        if key.startswith("abuse.")
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the baseline checkout (e.g. a git worktree)")
    parser.add_argument("--seconds", type=float, default=5, help="length of each load cell")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--only", nargs="+", default=[], help="only the scenarios whose name holds one of these")
    parser.add_argument("--rounds", type=int, default=3, help=f"rounds of each of {', '.join(REPEATED)} (medians)")
    args = parser.parse_args()
    if not (args.base / "app" / "__main__.py").is_file():
        parser.error(f"{args.base} is not a checkout of this project (git worktree add /tmp/base fd656d7)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 8192), hard), hard))
    trees = {"base": args.base.resolve(), "new": ROOT}
    load_before, started = os.getloadavg(), time.monotonic()
    figures = measure(trees, args.seconds, args.only, args.rounds)
    load_after, minutes = os.getloadavg(), (time.monotonic() - started) / 60
    rows = table(figures)
    verdicts = Counter(row.split(" | ")[4] for row in rows[2:])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = "\n".join(
        [
            "## Behaviours against the tree before issue 27 (`make behaviours BASE=...`)",
            "",
            f"Measured {when} in one run of `python -m benchmarks.behaviours --base {args.base} --seconds "
            f"{args.seconds:g} --rounds {args.rounds}` ({minutes:.1f} min) on {os.cpu_count()} CPUs shared with other "
            "work: load average "
            f"{load_before[0]:.1f} before and {load_after[0]:.1f} after. base: `python -m app` of "
            f"{commit_of(trees['base'])} (its supervisor); new: `python -m app` of {commit_of(ROOT)} (gunicorn with "
            "uvicorn workers). Both served their own committed models, side by side, with MNEMO_WORKERS=2, "
            "MNEMO_PROBE_PORT, MNEMO_WORKER_STALL_S=8 and a fresh SQLite student store, every other setting at its "
            f"default; each scenario ran on both in turn, the order alternating ({', '.join(REPEATED)}: {args.rounds} "
            "rounds, each figure the median of its rounds). "
            f"Load cells last {args.seconds:g} s. "
            "The verdict compares new with base by the row's rule: a figure is worse (or better) when it moved the "
            "wrong (or right) way by more than the slack the rule names, relative to base or absolute in the "
            "metric's unit, whichever is larger; counts of failures and of cases handled right have no slack. "
            "`–` is a figure that could not be measured (n/a). The nginx rows compare this tree behind "
            "deploy/nginx/nginx.conf with base's own `python -m app`.",
            "",
            f"Verdicts: {', '.join(f'{count} {name}' for name, count in verdicts.most_common())}.",
            "",
            *rows,
            "",
        ]
    )
    print(text)
    write_section(args.output, "behaviours", text)


if __name__ == "__main__":
    main()
