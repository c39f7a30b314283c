"""`make loadtest`: the service under concurrent load on loopback, next to bare ONNX Runtime on the same inputs.

One run, in this order: start `python -m app` on the committed models (cold start to /ready: the median of
three starts; RSS); per scenario, wrk at concurrency 1 taking turns with bare ONNX Runtime at batch 1 on the
same inputs (same session options) and with the floor app (benchmarks/floor_app.py), bare ONNX Runtime at
batch 32, then wrk against /similarity, /similarity/batch and /knowledge-trace at concurrency 8, 32 and 256;
the overload mix (3,000-interaction histories; 256 pairs of 64 tokens with attention) at 256 and 1,024
connections with /health probed alongside; SIGTERM with 32 requests in flight. The results replace the load
section of BENCHMARKS.md. Every loop is bounded in time; traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np
import onnxruntime as ort

from app.core.settings import Settings
from app.runtime.collate import collate
from app.runtime.sessions import open_session
from app.tasks.similarity.service import EncodedPair, EncodedSentence, pair_feeds
from app.tasks.similarity.tokenizer import tokenize
from app.tasks.similarity.vectors import WordVectors
from benchmarks.common import ARTIFACTS, manifest_entry
from benchmarks.floor_app import ANSWERS as FLOOR_PATHS
from benchmarks.table import write_section

T = TypeVar("T")
REPO = ARTIFACTS.parent
LUA = Path(__file__).resolve().parent / "wrk" / "post.lua"
CONCURRENCY = (1, 8, 32, 256)
OVERLOAD_CONNECTIONS = (256, 1024)
PARTS = ("throughput", "overload")  # the tables `--base` measures (`--parts`)
COLD_STARTS = 3  # process start to /ready, one after the other: the median is reported
C1_ROUNDS = 3  # concurrency 1 alternates wrk and bare ONNX Runtime, so a drift of the shared machine hits both
PAIR = ("A man is playing a guitar on the stage tonight.", "A person plays an instrument for the crowd.")
WORDS = tuple(
    [
        "a",
        "man",
        "is",
        "playing",
        "a",
        "guitar",
        "while",
        "the",
        "woman",
        "and",
        "child",
        "watch",
        "him",
        "from",
        "the",
        "old",
        "wooden",
        "bench",
    ]
)
KT_MODEL = "dkvmn-assist2009"
SIM_MODEL = "rmc-vlmp-sick"


@dataclass
class Scenario:
    """One endpoint and body; the ORT work one request needs, alone and for 32 requests in one run."""

    name: str
    path: str
    body: dict
    items: int  # pairs or histories per request
    bare_single: Callable[[], object]
    bare_batch32: Callable[[], object]
    concurrency: tuple[int, ...] = CONCURRENCY


@dataclass
class WrkResult:
    statuses: dict[int, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    p10_ms: float = 0.0  # on a shared machine, less moved than the p50 by other processes taking the cores
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    requests: int = 0
    seconds: float = 0.0

    @property
    def ok_per_s(self) -> float:
        return sum(v for k, v in self.statuses.items() if 200 <= k < 300) / max(self.seconds, 1e-9)


# -- inputs and bare ONNX Runtime ---------------------------------------------------------------------
def _session(file: str) -> ort.InferenceSession:
    return open_session(ARTIFACTS / file, Settings(), "CPUExecutionProvider")


def _vectors() -> WordVectors:
    entry = manifest_entry(SIM_MODEL)
    specials = np.load(ARTIFACTS / entry["assets"]["special_vectors"]["file"])
    return WordVectors.from_glove(specials, np.load(ARTIFACTS / entry["assets"]["vocabulary"]["file"], mmap_mode="r"))


def _pair(vectors: WordVectors, a: str, b: str) -> EncodedPair:
    encoded = []
    for text in (a, b):
        tokens = tokenize(text)
        matrix, unknown = vectors.embed(tokens)
        encoded.append(EncodedSentence(tokens, matrix, unknown))
    return (encoded[0], encoded[1])


def _similarity_run(session: ort.InferenceSession, pairs: list[EncodedPair]) -> Callable[[], object]:
    feeds = collate([pair_feeds(pair) for pair in pairs], ("emb_a", "emb_b"))
    return lambda: session.run(None, feeds)


def _kt_run(session: ort.InferenceSession, histories: int, steps: int, next_questions: int) -> Callable[[], object]:
    rng = np.random.default_rng(0)
    memory = np.load(ARTIFACTS / manifest_entry(KT_MODEL)["assets"]["init_memory"]["file"]).astype(np.float32)
    trace = {
        "q": rng.integers(1, 111, (histories, steps)),
        "r": rng.integers(0, 2, (histories, steps)),
        "len": np.full(histories, steps, dtype=np.int64),
        "mv_in": np.repeat(memory[np.newaxis], histories, axis=0),
    }
    rows = histories * next_questions
    following = {
        "q": rng.integers(1, 111, (rows, 1)),
        "r": np.zeros((rows, 1), dtype=np.int64),
        "len": np.ones(rows, dtype=np.int64),
        "mv_in": np.repeat(memory[np.newaxis], rows, axis=0),
    }
    return lambda: (session.run(None, trace), session.run(None, following))


def _kt_body(steps: int, next_questions: list[int] | None, attention: bool, mastery: str = "all") -> dict:
    rng = np.random.default_rng(1)
    interactions = [
        {"question": int(q), "correct": bool(c)}
        for q, c in zip(rng.integers(1, 111, steps), rng.random(steps) < 0.6, strict=True)
    ]
    return {
        "model": KT_MODEL,
        "interactions": interactions,
        "next_questions": next_questions,
        "return_attention": attention,
        "mastery": mastery,
    }


def scenarios() -> list[Scenario]:
    vectors = _vectors()
    similarity = _session(f"{SIM_MODEL}.onnx")
    knowledge = _session(f"{KT_MODEL}.onnx")
    pair = _pair(vectors, *PAIR)
    pairs32 = [_pair(vectors, f"{PAIR[0]} {' '.join(WORDS[: i % 6])}", PAIR[1]) for i in range(32)]
    sentence = {"sentence_a": PAIR[0], "sentence_b": PAIR[1]}
    batch_pairs = [{"sentence_a": f"{PAIR[0]} {' '.join(WORDS[: i % 6])}", "sentence_b": PAIR[1]} for i in range(32)]
    return [
        Scenario(
            "/similarity (1 pair, attention off)",
            "/similarity",
            {**sentence, "model": SIM_MODEL, "return_attention": False},
            1,
            _similarity_run(similarity, [pair]),
            _similarity_run(similarity, [pair] * 32),
        ),
        Scenario(
            "/similarity/batch (32 pairs, attention off)",
            "/similarity/batch",
            {"pairs": batch_pairs, "model": SIM_MODEL, "return_attention": False},
            32,
            _similarity_run(similarity, pairs32),
            _similarity_run(similarity, pairs32),
        ),
        Scenario(
            "/knowledge-trace (200 interactions, 2 next, attention off)",
            "/knowledge-trace",
            _kt_body(200, [3, 7], attention=False),
            1,
            _kt_run(knowledge, 1, 200, 2),
            _kt_run(knowledge, 32, 200, 2),
        ),
        # the largest answers per ONNX millisecond: what encoding the answer costs shows here
        Scenario(
            "/similarity (1 pair, attention on)",
            "/similarity",
            {**sentence, "model": SIM_MODEL, "return_attention": True},
            1,
            _similarity_run(similarity, [pair]),
            _similarity_run(similarity, [pair] * 32),
            concurrency=(1,),
        ),
        Scenario(
            "/knowledge-trace (200 interactions, 2 next, attention on, every mastery row)",
            "/knowledge-trace",
            _kt_body(200, [3, 7], attention=True, mastery="all"),
            1,
            _kt_run(knowledge, 1, 200, 2),
            _kt_run(knowledge, 32, 200, 2),
            concurrency=(1,),
        ),
    ]


def timings_ms(call: Callable[[], object], repeats: int) -> np.ndarray:
    """Milliseconds of `repeats` calls, after 3 unmeasured ones."""
    for _ in range(3):
        call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return np.array(samples) * 1000


def median_ms(call: Callable[[], object], repeats: int) -> float:
    return float(np.median(timings_ms(call, repeats)))


def bare_timings_ms(call: Callable[[], object], seconds: float = 1.0) -> np.ndarray:
    """`timings_ms` of as many runs (10 to 100) as fit in about `seconds`."""
    started = time.perf_counter()
    call()
    return timings_ms(call, int(np.clip(seconds / max(time.perf_counter() - started, 1e-6), 10, 100)))


def bare_ms(call: Callable[[], object], seconds: float = 1.0) -> float:
    """The median of `bare_timings_ms`."""
    return float(np.median(bare_timings_ms(call, seconds)))


# -- the server, wrk, and what runs beside it ---------------------------------------------------------
def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


class Sampler(threading.Thread):
    """Samples a value every `interval` seconds until stopped (RSS, or /health latency)."""

    def __init__(self, probe: Callable[[], float], interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.probe, self.interval, self.samples = probe, interval, []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append(self.probe())
            self._halt.wait(self.interval)

    def stop(self) -> list[float]:
        self._halt.set()
        self.join()
        return self.samples


def health_probe(url: str) -> Callable[[], float]:
    """Seconds for GET /health on a new connection each time (as a kubelet probes); 5.0 on a timeout or error.

    A raw socket, not an HTTP client library: on these shared cores a client that builds a TLS-capable
    client per probe (httpx) spends tens of milliseconds of its own before it sends anything."""
    host, port = url.removeprefix("http://").split(":")
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()

    def probe() -> float:
        started = time.perf_counter()
        try:
            with socket.create_connection((host, int(port)), timeout=5) as connection:
                connection.sendall(request)
                answer = b""
                while chunk := connection.recv(4096):
                    answer += chunk
        except OSError:
            return 5.0
        return time.perf_counter() - started if answer.startswith(b"HTTP/1.1 200") else 5.0

    return probe


def compile_service(tree: Path = REPO) -> None:
    """Write the bytecode of the service's modules, as an installed service has it (`make serve` does the same).

    Without it, where PYTHONDONTWRITEBYTECODE is set (common in containers, and on the machine these numbers come
    from) every start compiles the ~60 modules of app/ from source again: about 0.1 s of the cold start."""
    compileall.compile_dir(str(tree / "app"), quiet=1)


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a process that imports the service from checkout `tree` and serves its committed models."""
    return {**os.environ, "PYTHONPATH": str(tree), "MNEMO_ARTIFACTS_DIR": str(tree / "artifacts")}


def start_server(port: int, log: Path, tree: Path = REPO) -> tuple[subprocess.Popen, float]:
    """`python -m app` of checkout `tree` on its committed models (probe port: port + 1); the process and its
    seconds to /ready 200."""
    env = {**tree_env(tree), "MNEMO_PORT": str(port), "MNEMO_PROBE_PORT": str(port + 1), "MNEMO_HOST": "127.0.0.1"}
    started = time.perf_counter()
    command = [sys.executable, "-m", "app"]
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    _wait_until(process, f"http://127.0.0.1:{port}/ready", 200, log)
    return process, time.perf_counter() - started


def start_floor_app(port: int, log: Path, tree: Path = REPO) -> subprocess.Popen:
    """`python -m benchmarks.floor_app` of checkout `tree` on its committed models, once it answers (its 404 at /)."""
    command = [sys.executable, "-m", "benchmarks.floor_app", str(port)]
    process = subprocess.Popen(command, cwd=tree, env=tree_env(tree), stdout=log.open("w"), stderr=subprocess.STDOUT)
    _wait_until(process, f"http://127.0.0.1:{port}/", 404, log)
    return process


def _wait_until(process: subprocess.Popen, url: str, status: int, log: Path, timeout_s: float = 120) -> None:
    """Poll `url` until it answers `status`; an error if `process` exits first (see `log`) or after `timeout_s`."""
    started = time.perf_counter()
    with httpx.Client(timeout=2) as client:
        while time.perf_counter() - started < timeout_s:
            try:
                if client.get(url).status_code == status:
                    return
            except httpx.TransportError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"{' '.join(map(str, process.args))} exited; see {log}")
            time.sleep(0.005)
    process.kill()
    raise RuntimeError(f"{url} did not answer {status} in {timeout_s:g} s")


def wrk(url: str, body: dict, connections: int, seconds: int, timeout_s: float) -> WrkResult:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(body, handle)
    threads = min(2, connections)
    command = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        f"{round(timeout_s)}s",
        "-s",
        str(LUA),
        url,
    ]
    output = subprocess.run(
        command, env={**os.environ, "BODY_FILE": handle.name}, capture_output=True, text=True, timeout=seconds + 120
    ).stdout
    os.unlink(handle.name)
    result = WrkResult()
    for line in output.splitlines():
        parts = line.split()
        if line.startswith("MNEMO status"):
            result.statuses[int(parts[2])] = int(parts[3])
        elif line.startswith("MNEMO errors"):
            result.errors = {parts[i]: int(parts[i + 1]) for i in range(2, len(parts), 2)}
        elif line.startswith("MNEMO latency_low_us"):
            result.p10_ms = int(parts[3]) / 1000
        elif line.startswith("MNEMO latency_us"):
            result.p50_ms, result.p99_ms, result.max_ms = (int(parts[i]) / 1000 for i in (3, 5, 7))
        elif line.startswith("MNEMO total"):
            result.requests, result.seconds = int(parts[3]), int(parts[5]) / 1e6
    if not result.seconds:
        raise RuntimeError(f"wrk printed no summary: {output[-2000:]}")
    return result


def metric(url: str, prefix: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def statuses_text(result: WrkResult) -> str:
    parts = [f"{status}: {count}" for status, count in sorted(result.statuses.items())]
    errors = sum(result.errors.values())
    return ", ".join(parts) + (f"; socket errors {errors} ({result.errors})" if errors else "")


# -- the phases ---------------------------------------------------------------------------------------
def throughput_table(url: str, floor_url: str, pid: int, seconds: int) -> tuple[list[str], list[str]]:
    rows = [
        "| endpoint | concurrency | requests/s | items/s | p50 ms | p99 ms | vs bare ORT | answers | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    bare_rows = [
        "| endpoint's ORT work | bare batch 1: median ms | floor app, concurrency 1: p50 ms | bare batch 32: items/s |",
        "|---|---|---|---|",
    ]
    targets = []
    for scenario in scenarios():
        c1 = partial(concurrency_one, url, floor_url, scenario, seconds)
        (alone, single_ms, floor_ms), alone_peak = peak_rss_during(pid, c1)
        batch_items_s = 32 * scenario.items / (median_ms(scenario.bare_batch32, 20) / 1000)
        if scenario.items == 32:  # the request is itself a batch of 32: its bare work is one batch-32 run
            batch_items_s = 32 / (single_ms / 1000)
        floor_cell = "-" if floor_ms is None else f"{floor_ms:.2f}"
        bare_rows.append(f"| {scenario.name} | {single_ms:.2f} | {floor_cell} | {batch_items_s:.0f} |")
        for concurrency in scenario.concurrency:
            if concurrency == 1:
                result, peak = alone, alone_peak
            else:
                call = partial(wrk, f"{url}{scenario.path}", scenario.body, concurrency, seconds, 30)
                result, peak = peak_rss_during(pid, call)
            items_s = result.ok_per_s * scenario.items
            if concurrency == 1:
                versus = f"p50 {result.p50_ms / single_ms:.2f}x bare batch 1"
                floor_text = ""
                if floor_ms is not None:
                    floor_text = (
                        f" (the floor app: {floor_ms:.2f} ms = {floor_ms / single_ms:.2f}x; the service's own cost "
                        f"{result.p50_ms - floor_ms:.2f} ms)"
                    )
                targets.append(f"- {scenario.name}, concurrency 1: p50 {result.p50_ms:.2f} ms = {versus}{floor_text}")
            else:
                versus = f"{items_s / batch_items_s:.2f}x bare batch 32"
                if concurrency == 32:
                    targets.append(f"- {scenario.name}, concurrency 32: {items_s:.0f} items/s = {versus}")
            rows.append(
                f"| {scenario.name} | {concurrency} | {result.ok_per_s:.0f} | {items_s:.0f} | {result.p50_ms:.2f} | "
                f"{result.p99_ms:.2f} | {versus} | {statuses_text(result)} | {peak:.0f} |"
            )
            print(rows[-1], flush=True)
    return [*bare_rows, "", *rows], targets


def peak_rss_during(pid: int, call: Callable[[], T]) -> tuple[T, float]:
    """`call()`'s result and the server's peak RSS (MB) while it ran."""
    rss = Sampler(lambda: rss_mb(pid))
    rss.start()
    result = call()
    return result, max(rss.stop())


def concurrency_one(
    url: str, floor_url: str, scenario: Scenario, seconds: int
) -> tuple[WrkResult, float, float | None]:
    """wrk at concurrency 1 on the service and on the floor app (benchmarks/floor_app.py), and bare ONNX Runtime
    at batch 1, taking turns C1_ROUNDS times: the service's rounds merged (answers and rate summed, p50 and p99
    the rounds' medians, max the largest), the median of the bare medians and the floor's median p50 (None for
    a path the floor app does not serve)."""
    bare, rounds, floor = [], [], []
    round_seconds = max(1, round(seconds / C1_ROUNDS))
    for _ in range(C1_ROUNDS):
        bare.append(bare_ms(scenario.bare_single))
        if scenario.path in FLOOR_PATHS:
            floor.append(wrk(f"{floor_url}{scenario.path}", scenario.body, 1, round_seconds, 30).p50_ms)
        rounds.append(wrk(f"{url}{scenario.path}", scenario.body, 1, round_seconds, 30))
    return _merged(rounds), float(np.median(bare)), float(np.median(floor)) if floor else None


def _merged(rounds: list[WrkResult]) -> WrkResult:
    """Several wrk runs as one: answers and rate summed, p50 and p99 their medians, max the largest."""
    return WrkResult(
        statuses=dict(sum((Counter(result.statuses) for result in rounds), Counter())),
        errors=dict(sum((Counter(result.errors) for result in rounds), Counter())),
        p10_ms=float(np.median([result.p10_ms for result in rounds])),
        p50_ms=float(np.median([result.p50_ms for result in rounds])),
        p99_ms=float(np.median([result.p99_ms for result in rounds])),
        max_ms=max(result.max_ms for result in rounds),
        requests=sum(result.requests for result in rounds),
        seconds=sum(result.seconds for result in rounds),
    )


def overload_table(url: str, probe_url: str, pid: int, seconds: int, timeout_s: float) -> list[str]:
    words = " ".join((WORDS * 5)[:62])  # 64 tokens with <s> and </s>
    pairs = [{"sentence_a": words, "sentence_b": f"{words}"} for _ in range(256)]
    mixes = [
        ("/knowledge-trace, 3,000 interactions, all next, attention", "/knowledge-trace", _kt_body(3000, None, True)),
        (
            "/similarity/batch, 256 pairs x 64 tokens, attention",
            "/similarity/batch",
            {"pairs": pairs, "return_attention": True},
        ),
    ]
    rows = [
        "| mix | connections | answers | admitted that ended 504 | p99 ms | max ms | /health p99 ms, probe port "
        "| /health p99 ms, main port | peak RSS MB | RSS 10 s after MB | runs after the end |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, path, body in mixes:
        for connections in OVERLOAD_CONNECTIONS:
            rss = Sampler(lambda: rss_mb(pid))
            probes = [Sampler(health_probe(target), interval=0.05) for target in (probe_url, url)]
            rss.start()
            for sampler in probes:
                sampler.start()
            result = wrk(f"{url}{path}", body, connections, seconds, timeout_s + 5)
            runs_at_end = metric(url, "mnemo_batch_size_rows_count")
            probe_p99, main_p99 = (float(np.percentile(sampler.stop(), 99) * 1000) for sampler in probes)
            time.sleep(10)
            after = rss_mb(pid)
            runs_after = metric(url, "mnemo_batch_size_rows_count") - runs_at_end
            peak = max(rss.stop())
            rows.append(
                f"| {name} | {connections} | {statuses_text(result)} | {timed_out_share(result)} | "
                f"{result.p99_ms:.0f} | {result.max_ms:.0f} | {probe_p99:.1f} | {main_p99:.1f} | {peak:.0f} | "
                f"{after:.0f} | {runs_after:.0f} |"
            )
            print(rows[-1], flush=True)
    return rows


def timed_out_share(result: WrkResult) -> str:
    """The share of the admitted requests (answered 200 or 504) that ended in 504, as text."""
    admitted = result.statuses.get(200, 0) + result.statuses.get(504, 0)
    return f"{result.statuses.get(504, 0) / admitted:.0%} of {admitted}" if admitted else "none admitted"


def compare_trees(
    base: Path, seconds: int, overload_seconds: int, timeout_s: float, port: int, parts: tuple[str, ...] = PARTS
) -> str:
    """The throughput and overload tables (those of `parts`) of checkout `base`, then of this one, one server
    after the other."""
    tables = []
    for index, (label, tree) in enumerate(((f"base ({base})", base.resolve()), ("this tree", REPO))):
        port += 4 * index  # the other tree's processes may still be draining on theirs
        compile_service(tree)
        log = Path(tempfile.gettempdir()) / "mnemo-loadtest-server.log"
        process, _ = start_server(port, log, tree)
        floor = start_floor_app(port + 2, log.with_name("mnemo-loadtest-floor.log"), tree)
        url = f"http://127.0.0.1:{port}"
        try:
            throughput, overload = [], []
            if "throughput" in parts:
                throughput, _ = throughput_table(url, f"http://127.0.0.1:{port + 2}", process.pid, seconds)
            if "overload" in parts:
                overload = overload_table(url, f"http://127.0.0.1:{port + 1}", process.pid, overload_seconds, timeout_s)
        finally:
            for started in (process, floor):
                started.terminate()
                started.wait(60)
        tables += [f"### {label}", "", *throughput, "", *overload, ""]
    return "\n".join(tables)


def alternating(base: Path, rounds: int, seconds: int, port: int) -> list[str]:
    """/knowledge-trace (200 interactions) at each concurrency against checkout `base`'s server and this tree's,
    both up side by side and taking turns `rounds` times (the first to go alternates), so that a drift of the
    shared machine hits both: the median requests/s and p50 of each, and their ratio."""
    scenario = next(s for s in scenarios() if s.path == "/knowledge-trace")
    trees = {"base": base.resolve(), "this tree": REPO}
    processes, urls = {}, {}
    for index, (label, tree) in enumerate(trees.items()):
        compile_service(tree)
        log = Path(tempfile.gettempdir()) / f"mnemo-alternating-{index}.log"
        processes[label], _ = start_server(port + 4 * index, log, tree)
        urls[label] = f"http://127.0.0.1:{port + 4 * index}{scenario.path}"
    results: dict[tuple[str, int], list[WrkResult]] = {(label, c): [] for label in trees for c in CONCURRENCY}
    try:
        for round_index in range(rounds):
            order = list(trees)[:: 1 if round_index % 2 == 0 else -1]
            for concurrency in CONCURRENCY:
                for label in order:
                    result = wrk(urls[label], scenario.body, concurrency, seconds, 30)
                    results[(label, concurrency)].append(result)
                    print(round_index, label, concurrency, f"{result.ok_per_s:.0f}/s", result.statuses, flush=True)
    finally:
        for process in processes.values():
            process.terminate()
            process.wait(60)
    rows = [
        f"| {scenario.name}: concurrency | base requests/s | this tree requests/s | ratio | base p50 ms "
        "| this tree p50 ms | answers (base; this tree) |",
        "|---|---|---|---|---|---|---|",
    ]
    for concurrency in CONCURRENCY:
        base_runs, this_runs = results[("base", concurrency)], results[("this tree", concurrency)]
        base_rate, this_rate = (float(np.median([r.ok_per_s for r in runs])) for runs in (base_runs, this_runs))
        base_p50, this_p50 = (float(np.median([r.p50_ms for r in runs])) for runs in (base_runs, this_runs))
        answers = "; ".join(statuses_text(_merged(runs)) for runs in (base_runs, this_runs))
        rows.append(
            f"| {concurrency} | {base_rate:.0f} | {this_rate:.0f} | {this_rate / base_rate:.2f} | {base_p50:.2f} "
            f"| {this_p50:.2f} | {answers} |"
        )
    return rows


def drain(url: str, process: subprocess.Popen, in_flight: int = 32) -> str:
    body = _kt_body(1000, [1], attention=False)

    async def scenario() -> tuple[list, float]:
        limits = httpx.Limits(max_connections=in_flight + 4)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            tasks = [asyncio.create_task(client.post(f"{url}/knowledge-trace", json=body)) for _ in range(in_flight)]
            deadline = time.monotonic() + 30
            while metric(url, "mnemo_http_requests_in_flight") < in_flight + 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            process.send_signal(signal.SIGTERM)
            signalled = time.perf_counter()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.to_thread(process.wait, 120)
            return outcomes, time.perf_counter() - signalled

    outcomes, seconds = asyncio.run(scenario())
    answered = [o.status_code for o in outcomes if isinstance(o, httpx.Response)]
    failed = [type(o).__name__ for o in outcomes if not isinstance(o, httpx.Response)]
    counts = {status: answered.count(status) for status in sorted(set(answered))}
    return (
        f"SIGTERM with {in_flight} `/knowledge-trace` requests (1,000 interactions) in flight: answers {counts}, "
        f"connection errors {len(failed)}, exit code {process.returncode}, {seconds:.1f} s from SIGTERM to exit."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8, help="wrk duration per throughput cell")
    parser.add_argument("--overload-seconds", type=int, default=15)
    parser.add_argument("--output", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--base", type=Path, help="also measure this checkout first (a git worktree of a baseline)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS, help="with --base: the tables measured")
    parser.add_argument(
        "--alternate", type=int, metavar="ROUNDS", help="with --base: /knowledge-trace, the servers taking turns"
    )
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 8192), hard), hard))  # 1,024 connections, both sides
    settings = Settings()
    port = 18000 + os.getpid() % 1000
    if args.base is not None and args.alternate:
        load = os.getloadavg()
        rows = alternating(args.base, args.alternate, args.seconds, port)
        print(f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after (1 min)", *rows, sep="\n")
        return
    if args.base is not None:
        load = os.getloadavg()
        tables = compare_trees(
            args.base, args.seconds, args.overload_seconds, settings.request_timeout_s, port, tuple(args.parts)
        )
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        after = os.getloadavg()
        selected = "" if tuple(args.parts) == PARTS else f" --parts {' '.join(args.parts)}"
        header = (
            f"Measured {when} in one run of `python -m benchmarks.load --base {args.base}{selected}` on "
            f"{os.cpu_count()} CPUs, "
            f"the baseline's server first, then this tree's, with the settings of the load section; load average "
            f"{load[0]:.1f} before and {after[0]:.1f} after (1 min)."
        )
        write_section(args.output, "load-base", f"## Load against a baseline\n\n{header}\n\n{tables}")
        print(tables)
        return
    url, probe_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    floor_url = f"http://127.0.0.1:{port + 2}"
    log = Path(tempfile.gettempdir()) / "mnemo-loadtest-server.log"
    compile_service()
    cold_starts = []
    for _ in range(COLD_STARTS - 1):
        process, seconds = start_server(port, log)
        cold_starts.append(seconds)
        process.terminate()
        process.wait(60)
    process, seconds = start_server(port, log)  # this one serves the run
    cold_starts.append(seconds)
    cold_start = float(np.median(cold_starts))
    floor = None
    try:
        idle_rss = rss_mb(process.pid)
        print(f"cold start {cold_start:.2f} s, RSS {idle_rss:.0f} MB", flush=True)
        floor = start_floor_app(port + 2, log.with_name("mnemo-loadtest-floor.log"))
        throughput, targets = throughput_table(url, floor_url, process.pid, args.seconds)
        floor.terminate()
        floor.wait(60)
        overload = overload_table(url, probe_url, process.pid, args.overload_seconds, settings.request_timeout_s)
        drained = drain(url, process)
    finally:
        for started in (process, floor):
            if started is not None and started.poll() is None:
                started.kill()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = "\n".join(
        [
            "## Load (`make loadtest`)",
            "",
            f"Measured {when} in one run of `python -m benchmarks.load` on {os.cpu_count()} CPUs, one `python -m app`"
            f" process with the default settings (MNEMO_INTRA_OP_THREADS={settings.intra_op_threads}, "
            f"MNEMO_CONCURRENT_RUNS={settings.concurrent_runs}, MNEMO_MAX_BATCH={settings.max_batch}, "
            f"MNEMO_MAX_WAIT_MS={settings.max_wait_ms:g}, MNEMO_MAX_QUEUE={settings.max_queue}, "
            f"MNEMO_REQUEST_TIMEOUT_S={settings.request_timeout_s:g}) and its access log on; wrk on the same "
            f"cores, {args.seconds} s per cell. Bare ONNX Runtime: the same inputs and session options, the "
            f"server idle; at concurrency 1, wrk and bare batch 1 take turns in {C1_ROUNDS} rounds (the p50s and "
            "the bare times are the rounds' medians), so that a drift of the shared machine affects both. Items "
            "are pairs (similarity) or histories (knowledge tracing). The floor app (`benchmarks/floor_app.py`, "
            "its own process, idle otherwise) takes its turn in the same rounds for /similarity and "
            "/knowledge-trace: one plain ASGI function on plain uvicorn with the service's validation, encoding, "
            "inline ONNX runs and JSON rendering, and none of "
            "its middlewares, batching, admission or deadlines, so its p50 is what the same answer costs on this "
            "web stack before the service adds anything.",
            "",
            f"- Cold start, process start to `/ready` 200: median {cold_start:.2f} s of {COLD_STARTS} starts "
            f"({', '.join(f'{seconds:.2f}' for seconds in cold_starts)} s); RSS then {idle_rss:.0f} MB.",
            *targets,
            "",
            *throughput,
            "",
            f"Overload: {args.overload_seconds} s of wrk per row (its timeout {settings.request_timeout_s + 5:g} s, "
            "past the deadline), `/health` probed every 50 ms meanwhile, each probe on a new connection (as a "
            'kubelet does), on the probe port (MNEMO_PROBE_PORT) and on the main port; then 10 s idle. "runs after '
            "the end\": ONNX runs started after wrk's clients had gone.",
            "",
            *overload,
            "",
            drained,
            "",
        ]
    )
    write_section(args.output, "load", text)
    print(text)


if __name__ == "__main__":
    main()
