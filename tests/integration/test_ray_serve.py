"""`python -m app.ray_serve --replicas 2` for real: a local Ray instance (loopback only), two replicas of the app
over the committed models, both answering both endpoints with exactly the single-process results, behind the
launcher's API key, on the port its flag names."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.core.settings import DEFAULT_ARTIFACTS_DIR
from tests.helpers import app_client, same_answer

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 240  # a local Ray instance, Serve and two replicas loading six models on two shared cores
ROUNDS, CONCURRENCY = 12, 8  # at most 96 requests per endpoint
API_KEY = "ray-replica-key"
SIMILARITY = [
    {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument."},
    {"sentence_a": "A dog runs in the park.", "sentence_b": "Nobody is running.", "model": "rmc-flmp-sick"},
    {"sentence_a": "Two kids are eating 3 apples.", "sentence_b": "Children eat fruit.", "return_attention": False},
]
KNOWLEDGE_TRACE = [
    {"interactions": [{"question": 12, "correct": True}, {"question": 12, "correct": False}], "next_questions": [3]},
    {"model": "dkvmn-statics", "interactions": [{"question": q, "correct": q % 3 == 0} for q in range(1, 40)]},
    {"model": "dkvmn-synthetic", "interactions": [{"question": 7, "correct": True}], "return_attention": False},
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ray_processes(ray_tmp: str) -> list[int]:
    """PIDs of one Ray instance: its daemons name the temp dir on their command line, its workers (whose
    title Ray rewrites) inherited RAY_TMPDIR in their environment."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline, environ = (entry / "cmdline").read_bytes(), (entry / "environ").read_bytes()
            except OSError:
                continue
            if ray_tmp.encode() in cmdline or f"RAY_TMPDIR={ray_tmp}".encode() in environ.split(b"\0"):
                pids.append(int(entry.name))
    return pids


@contextmanager
def ray_serve(replicas: int) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run the entry point on a free loopback port until /ready; SIGINT it afterwards and check Ray is gone."""
    port = _free_port()
    ray_tmp = tempfile.mkdtemp(prefix="mnemo-ray-", dir="/tmp")  # short: Ray puts unix sockets under it
    env = {
        **os.environ,
        "MNEMO_HOST": "127.0.0.1",
        "MNEMO_API_KEYS": API_KEY,
        "MNEMO_ARTIFACTS_DIR": str(DEFAULT_ARTIFACTS_DIR),
        "MNEMO_PROVIDER": "cpu",
        "MNEMO_LOG_LEVEL": "warning",
        "RAY_TMPDIR": ray_tmp,
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "app.ray_serve", "--replicas", str(replicas), "--cpus-per-replica", "1"]
    command += ["--port", str(port)]  # the settings' flags of `mnemo serve`
    log = Path(ray_tmp) / "launcher.log"
    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while "mnemo: serving on" not in log.read_text():  # printed once serve.run saw every replica healthy
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Ray Serve never started:\n{log.read_text()[-4000:]}")
            time.sleep(0.5)
        assert httpx.get(f"{url}/ready", timeout=10).status_code == 200
        yield url, process
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
        leftovers = _ray_processes(ray_tmp)
        for pid in leftovers:  # only processes of this Ray instance
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert process.returncode == 0, log.read_text()[-4000:] if log.exists() else process.returncode
        assert not leftovers, f"Ray processes outlived the launcher: {leftovers}"


@pytest.fixture(scope="module")
def single_process() -> Iterator[TestClient]:
    with app_client(DEFAULT_ARTIFACTS_DIR) as client:
        yield client


def test_two_ray_serve_replicas_answer_both_endpoints_with_the_single_process_results(single_process):
    expected = {
        (path, index): single_process.post(path, json=body).json()
        for path, bodies in (("/similarity", SIMILARITY), ("/knowledge-trace", KNOWLEDGE_TRACE))
        for index, body in enumerate(bodies)
    }
    started = time.monotonic()
    key = {"Authorization": f"Bearer {API_KEY}"}
    with ray_serve(replicas=2) as (url, launcher), httpx.Client(base_url=url, timeout=30, headers=key) as client:
        startup = time.monotonic() - started
        assert httpx.post(f"{url}/similarity", json=SIMILARITY[0], timeout=30).status_code == 401  # no key
        replicas: dict[str, set[str]] = {"/similarity": set(), "/knowledge-trace": set()}
        pids: set[int] = set()

        def call(job: tuple[str, int]) -> None:
            path, index = job
            body = (SIMILARITY if path == "/similarity" else KNOWLEDGE_TRACE)[index]
            response = client.post(path, json=body)
            assert response.status_code == 200, response.text
            assert same_answer(response.json(), expected[path, index]), (response.json(), expected[path, index])
            replicas[path].add(response.headers["x-mnemo-replica"])
            pids.add(int(response.headers["x-mnemo-pid"]))

        jobs = [(path, index) for path in replicas for index in range(3)]
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            for _ in range(ROUNDS):
                list(pool.map(call, jobs * (CONCURRENCY // 2)))
                if all(len(seen) == 2 for seen in replicas.values()):
                    break
        assert all(len(seen) == 2 for seen in replicas.values()), replicas
        assert replicas["/similarity"] == replicas["/knowledge-trace"]
        assert len(pids) == 2 and launcher.pid not in pids and os.getpid() not in pids
        for pid in pids:
            os.kill(pid, 0)  # live processes of this machine
    print(
        f"\nRay Serve: two replicas ready {startup:.0f} s after launch; whole test {time.monotonic() - started:.0f} s"
    )
