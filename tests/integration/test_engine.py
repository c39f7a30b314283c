"""The engine end to end: the committed models batched, then admission, deadlines and cancellation over HTTP.

Batching never changes a committed model's result. Then real server processes (`python -m tests.toy_server`)
answer 429, 504 and client disconnects while a held toy run keeps their only run slot busy (HELD_K: the run
waits until the test sends the server SIGUSR1), and /health meanwhile. The batcher itself, with a manual
clock, is tested in test_batcher.py.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time

import httpx
import numpy as np
import pytest

from app.core.metrics import Metrics
from app.runtime.instances import Instance
from app.runtime.registry import ModelRegistry
from app.tasks import TASKS
from app.tasks.knowledge_trace import service as kt_service
from app.tasks.similarity import service as sim_service
from tests.conftest import COMMITTED, SIM_MODEL
from tests.helpers import (
    TOY_SERVER,
    Server,
    app_settings,
    metric,
    release_held_runs,
    running_server,
    until_admitted,
    until_metric,
)
from tests.integration.test_connection_limits import closed_within
from tests.toy_model import HELD_TOY, PICKY_KS, toy_body, toy_entry, write_toy_artifacts
from tests.toy_profiles import flat_cost


# -- batch composition never changes a result (the committed models) ---------------------------------
@pytest.fixture(scope="module")
def committed_registry() -> ModelRegistry:
    registry = ModelRegistry(app_settings(COMMITTED), TASKS, Metrics())
    registry.load()
    return registry


def _with_engine(registry: ModelRegistry, scenario):
    """Run `scenario` with the engine started and the cost models flat (`_flat_costs`)."""

    async def main():
        _flat_costs(registry)
        async with registry.serve():
            return await scenario()

    return asyncio.run(main())


def _flat_costs(registry: ModelRegistry) -> None:
    """Make every instance's cost model flat (10 ms a run whatever its rows), so that whatever is queued together
    runs together: these tests compare results, not batch sizes. Runs teach the cost models this machine's times,
    which under load can say that batching saves nothing: a scenario calls it again before its batched pass."""
    for instance in _instances(registry):
        instance.cost = flat_cost(0.01)


def _instances(registry: ModelRegistry) -> list[Instance]:
    models = [
        *registry.models.values(),
        *(graph for model in registry.models.values() for graph in model.graphs.values()),
    ]
    return [instance for model in models for instance in model.instances]


def test_similarity_results_do_not_depend_on_the_batch(committed_registry):
    model = committed_registry.models[SIM_MODEL]
    texts = [
        ("A man is playing a guitar.", "A person plays an instrument."),
        ("Dogs run.", "A cat sleeps on the very long and soft sofa in the living room of the house."),
        ("Nobody is cutting an onion.", "A woman is slicing an onion."),
        ("A kid is on a slide.", "A child slides down."),
    ]
    pairs = sim_service.encode_pairs(model, texts, [("body",)] * len(texts))

    async def scenario():
        alone = [(await sim_service.run_pairs(model, [pair]))[0] for pair in pairs]
        together = await sim_service.run_pairs(model, pairs)
        return alone, together

    alone, together = _with_engine(committed_registry, scenario)
    for single, batched in zip(alone, together, strict=True):
        for output in single:
            np.testing.assert_allclose(single[output], batched[output], atol=1e-5, rtol=0)
    assert max(committed_registry.metrics.batch_size.labels(SIM_MODEL).collect()[0].samples[-1].value, 0) > 0


@pytest.mark.parametrize(("name", "chunks_share_runs"), [("dkvmn-assist2009", False), ("dkt-assist2009", True)])
def test_knowledge_trace_results_do_not_depend_on_the_batch(committed_registry, name, chunks_share_runs):
    """DKVMN runs a long history as a chain, DKT queues its chunks as rows that share runs: same results."""
    model = committed_registry.models[name]
    rng = np.random.default_rng(0)
    histories = [(rng.integers(1, 111, n), rng.integers(0, 2, n)) for n in (3, 57, 200, 431)]

    async def scenario():
        alone = [(await kt_service.trace_all(model, [(q, r, None)]))[0] for q, r in histories]
        _flat_costs(committed_registry)  # the runs alone taught them this machine's times
        together = await kt_service.trace_all(model, [(q, r, None) for q, r in histories])
        max_cells = model.batcher.config.max_cells
        assert (max_cells is None or max_cells >= 2 * model.state.seqlen) is chunks_share_runs
        return alone, together

    def runs_and_rows() -> tuple[float, float]:
        samples = committed_registry.metrics.batch_size.labels(name).collect()[0].samples
        values = {sample.name: sample.value for sample in samples}
        return values["mnemo_batch_size_rows_count"], values["mnemo_batch_size_rows_sum"]

    runs_before, rows_before = runs_and_rows()
    alone, together = _with_engine(committed_registry, scenario)
    for single, batched in zip(alone, together, strict=True):
        assert single.keys() == batched.keys()
        for output in single:
            np.testing.assert_allclose(single[output], batched[output], atol=1e-5, rtol=0)
    runs_after, rows_after = runs_and_rows()
    # 1 + 1 + 1 + 3 chunks, one row per chunk, alone then together: together, the one-chunk histories share a
    # run (DKVMN: the long one is a chain of 3 runs; DKT: its chunks share runs with the others too)
    assert rows_after - rows_before == 2 * 6 and runs_after - runs_before < 2 * 6


# -- over HTTP, against real server processes --------------------------------------------------------
def _toy_server(tmp_path, **env):
    artifacts = write_toy_artifacts(tmp_path / "toy", [toy_entry("toy-a", default=True)])
    settings = {"MNEMO_CONCURRENT_RUNS": "1", **env}
    return running_server(artifacts, TOY_SERVER, **settings)


async def _until_answered(requests: list[asyncio.Task], count: int) -> None:
    """Wait (at most 30 s) until `count` of `requests` have their answer."""
    deadline = time.monotonic() + 30
    while sum(request.done() for request in requests) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@pytest.mark.slow
def test_a_full_queue_answers_429_with_retry_after_at_once(tmp_path):
    async def scenario(server: Server):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            held = asyncio.create_task(client.post("/toy", json=HELD_TOY))
            await until_admitted(server.url, 1)
            answers = [asyncio.create_task(client.post("/toy", json=toy_body())) for _ in range(6)]
            await _until_answered(answers, 4)
            answered_while_held = [answer.result().status_code for answer in answers if answer.done()]
            release_held_runs(server)
            return (await held).status_code, answered_while_held, await asyncio.gather(*answers)

    with _toy_server(tmp_path, MNEMO_MAX_QUEUE="3") as server:
        held_status, answered_while_held, answers = asyncio.run(scenario(server))
        assert answered_while_held == [429] * 4  # at once: before the held run (and the 2 admitted) finished
        refused = [answer for answer in answers if answer.status_code == 429]
        assert held_status == 200 and len(refused) == 4 and {a.status_code for a in answers} == {200, 429}
        assert all(answer.headers["retry-after"] == "1" for answer in refused)
        assert "MNEMO_MAX_QUEUE" in refused[0].json()["detail"]
        assert metric(server.url, 'mnemo_requests_rejected_total{model="toy-a",reason="queue_full"}') == 4


@pytest.mark.slow
def test_a_large_body_for_a_model_that_refuses_all_work_is_429_before_it_is_parsed(tmp_path):
    unparsable = b'{"model": "toy-a", "x": [[1, 2, 3]], "k": [1], "pad": "' + b"a" * 9000  # no closing quote

    async def scenario(server: Server):
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            held = asyncio.create_task(client.post("/toy", json=HELD_TOY))
            await until_admitted(server.url, 1)
            while_full = await client.post("/toy/read", content=unparsable, headers=headers)
            unknown = await client.post("/toy/read", content=unparsable.replace(b"toy-a", b"toy-z"), headers=headers)
            release_held_runs(server)
            await held
            after = await client.post("/toy/read", content=unparsable, headers=headers)
            return while_full, unknown, after

    with _toy_server(tmp_path, MNEMO_MAX_QUEUE="1") as server:
        while_full, unknown, after = asyncio.run(scenario(server))
        assert while_full.status_code == 429 and while_full.headers["retry-after"] == "1"
        assert "toy-a is at capacity" in while_full.json()["detail"]
        assert unknown.status_code == 422  # a model the scan cannot resolve: parsed, and the parse error shown
        assert after.status_code == 422  # the same body, once the model has room: parsed
        assert metric(server.url, 'mnemo_requests_rejected_total{model="toy-a",reason="before_parsing"}') == 1


@pytest.mark.slow
def test_a_large_body_opening_with_a_model_that_refuses_it_is_429_before_the_rest_is_read(tmp_path):
    """Its 429 comes from its first part (before: only once the whole body was in), and the connection stays usable:
    the rest of the body is skipped, the next request on it answered."""
    opening = b'{"model": "toy-a", "x": [[1, 2, 3]], "k": [1], "pad": "'
    rest = b"a" * 20_000 + b'"}'
    head = "POST /toy/read HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "

    async def scenario(server: Server) -> tuple[bytes, bytes]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            held = asyncio.create_task(client.post("/toy", json=HELD_TOY))
            await until_admitted(server.url, 1)
            reader, writer = await asyncio.open_connection(*server.url.removeprefix("http://").split(":"))
            writer.write(f"{head}{len(opening) + len(rest)}\r\n\r\n".encode() + opening)
            refused = await asyncio.wait_for(reader.readuntil(b"}"), 30)  # the rest of the body not sent yet
            writer.write(rest + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            health = await asyncio.wait_for(reader.readuntil(b"}"), 30)
            writer.close()
            release_held_runs(server)
            await held
            return refused, health

    with _toy_server(tmp_path, MNEMO_MAX_QUEUE="1", MNEMO_BODY_TIMEOUT_S="2") as server:
        refused, health = asyncio.run(scenario(server))
        assert refused.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in refused.lower()
        assert b"toy-a is at capacity" in refused
        assert health.startswith(b"HTTP/1.1 200") and b'{"status":"ok"}' in health
        assert metric(server.url, 'mnemo_requests_rejected_total{model="toy-a",reason="before_parsing"}') == 1


@pytest.mark.slow
def test_a_request_past_its_deadline_is_504_and_queued_work_behind_it_never_runs(tmp_path):
    async def scenario(server: Server):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            held = asyncio.create_task(client.post("/toy", json=HELD_TOY))
            await until_admitted(server.url, 1)
            queued = await client.post("/toy", json=toy_body())
            held_answer = await held  # its deadline passed while its run was held
            release_held_runs(server)
            later = await client.post("/toy", json=toy_body())  # runs once the held run is done, the slot free again
            return held_answer, queued, later

    with _toy_server(tmp_path, MNEMO_REQUEST_TIMEOUT_S="2") as server:
        held, queued, later = asyncio.run(scenario(server))
        assert held.status_code == 504 and queued.status_code == 504 and later.status_code == 200
        assert "MNEMO_REQUEST_TIMEOUT_S" in queued.json()["detail"]
        assert metric(server.url, 'mnemo_requests_timed_out_total{model="toy-a"}') == 2
        # two runs of one row each, the held one and the later one: the queued row never ran
        assert metric(server.url, 'mnemo_batch_size_rows_count{model="toy-a"}') == 2
        assert metric(server.url, 'mnemo_batch_size_rows_sum{model="toy-a"}') == 2


@pytest.mark.slow
def test_a_batch_that_fails_in_onnxruntime_fails_only_its_bad_request_and_each_run_is_counted_once(tmp_path):
    """Three requests queue for toy-b (the picky graph) while toy-a's held run keeps the only run slot, so
    they run as one batch; the middle one's k fails that run, so each is rerun alone (the batcher's `_isolate`):
    the good ones get 200, the bad one 422, and the batch-size and inference histograms and the instance's counters
    count the same runs."""
    entries = [toy_entry("toy-a", default=True), toy_entry("toy-b")]
    artifacts = write_toy_artifacts(tmp_path / "picky", entries, picky=["toy-b"])

    async def scenario(server: Server):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            held = asyncio.create_task(client.post("/toy", json=HELD_TOY))
            await until_admitted(server.url, 1)
            bodies = [{"model": "toy-b", "x": [[1, 2, 3]], "k": [k]} for k in (1, PICKY_KS, 2)]
            answers = [asyncio.create_task(client.post("/toy", json=body)) for body in bodies]
            await until_metric(server.url, 'mnemo_queue_depth{model="toy-b"}', 3)
            release_held_runs(server)
            return await held, await asyncio.gather(*answers)

    with running_server(artifacts, TOY_SERVER, MNEMO_CONCURRENT_RUNS="1") as server:
        held, (first, bad, last) = asyncio.run(scenario(server))
        assert held.status_code == 200
        assert (first.status_code, first.json()["z"]) == (200, [2])
        assert (last.status_code, last.json()["z"]) == (200, [3])
        assert bad.status_code == 422 and "out of data bounds" in bad.json()["detail"][0]["msg"]
        runs = metric(server.url, 'mnemo_inference_duration_seconds_count{model="toy-b"}')
        assert runs == 2  # the two good requests, each rerun alone; the failed batch and the bad one never completed
        assert metric(server.url, 'mnemo_batch_size_rows_count{model="toy-b"}') == runs
        assert metric(server.url, 'mnemo_batch_size_rows_sum{model="toy-b"}') == 2
        assert metric(server.url, 'mnemo_instance_runs_total{model="toy-b",model_instance="cpu-0"}') == runs
        assert metric(server.url, 'mnemo_instance_rows_total{model="toy-b",model_instance="cpu-0"}') == 2


@pytest.mark.slow
def test_a_client_that_disconnects_cancels_its_queued_work(tmp_path):
    async def scenario(server: Server):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            held = asyncio.create_task(client.post("/toy", json=HELD_TOY))
            await until_admitted(server.url, 1)
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/toy", json=toy_body(), timeout=0.3)  # gives up and closes its connection
            release_held_runs(server)
            held_answer = await held
            await until_metric(server.url, 'mnemo_requests_cancelled_total{model="toy-a"}', 1)
            return held_answer, await client.post("/toy", json=toy_body())

    with _toy_server(tmp_path) as server:
        held, later = asyncio.run(scenario(server))
        assert held.status_code == 200 and later.status_code == 200
        assert metric(server.url, 'mnemo_requests_cancelled_total{model="toy-a"}') == 1
        # two runs of one row each, the held one and the later one: the row of the client that left never ran
        assert metric(server.url, 'mnemo_batch_size_rows_count{model="toy-a"}') == 2
        assert metric(server.url, 'mnemo_batch_size_rows_sum{model="toy-a"}') == 2


@pytest.mark.slow
def test_health_answers_while_inference_is_saturated(tmp_path):
    """The run slot is held and 15 requests wait for it: /health still answers at once (it never queues
    behind inference, and no run blocks the event loop)."""

    async def scenario(server: Server):
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            load = [asyncio.create_task(client.post("/toy", json=HELD_TOY))]
            await until_admitted(server.url, 1)  # it holds the run slot: none of the others runs inline before it
            load += [asyncio.create_task(client.post("/toy", json=toy_body())) for _ in range(15)]
            await until_admitted(server.url, 16)
            latencies = []
            for _ in range(10):
                started = time.perf_counter()
                assert (await client.get("/health")).status_code == 200
                latencies.append(time.perf_counter() - started)
            release_held_runs(server)
            statuses = {(await task).status_code for task in load}
            return max(latencies), statuses

    with _toy_server(tmp_path, MNEMO_MAX_BATCH="1", MNEMO_REQUEST_TIMEOUT_S="120") as server:
        slowest, statuses = asyncio.run(scenario(server))
        assert statuses == {200} and slowest < 1.0  # generous: a blocked loop would never answer


@pytest.mark.slow
def test_bodies_past_the_in_memory_budget_get_429_before_they_are_read(tmp_path):
    def post_headers(url: str, content_length: int) -> socket.socket:
        host, port = url.removeprefix("http://").split(":")
        connection = socket.create_connection((host, int(port)), timeout=10)
        head = f"POST /toy HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {content_length}"
        connection.sendall(head.encode() + b'\r\n\r\n{"x": ')  # then it stalls: the body stays announced, not read
        return connection

    with _toy_server(tmp_path, MNEMO_MAX_BODY_BYTES=str(40 << 20)) as server:
        holder = post_headers(server.url, 31 << 20)
        try:
            holder.sendall(b" " * (30 << 20))  # 30 MB of its body in, then it stalls
            time.sleep(1)  # the server holds the 30 MB it has read
            refused = httpx.post(f"{server.url}/toy", content=b"{" + b" " * (4 << 20) + b"}")
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert "too many request bodies" in refused.json()["detail"]
            # Answered before its body was read, the connection stays usable: the rest of the body is skipped
            # (not taken for the next request's headers), and the next request on it is answered.
            with post_headers(server.url, 4 << 20) as early:
                early.settimeout(10)
                assert early.recv(4096).startswith(b"HTTP/1.1 429")
                early.sendall(b" " * ((4 << 20) - len(b'{"x": ')))  # the rest of the announced body
                early.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = b""
                while b'{"status":"ok"}' not in answer and len(answer) < 65536:
                    answer += early.recv(4096)
                assert b"HTTP/1.1 200" in answer and b"HTTP/1.1 431" not in answer  # (a request id may hold "431")
        finally:
            holder.close()
        time.sleep(0.5)
        assert httpx.post(f"{server.url}/toy", json=toy_body()).status_code == 200  # the budget is given back
        assert metric(server.url, 'mnemo_server_requests_rejected_total{reason="bodies_in_memory"}') == 2


@pytest.mark.slow
def test_announced_bodies_that_do_not_arrive_take_none_of_the_in_memory_budget(tmp_path):
    """40 connections announce 1 MB (40 MB, past the 32 MB budget) and send nothing: other bodies are served."""
    with _toy_server(tmp_path) as server:
        host, port = server.url.removeprefix("http://").split(":")
        holders = [socket.create_connection((host, int(port)), timeout=10) for _ in range(40)]
        try:
            head = b"POST /toy HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"
            for holder in holders:
                holder.sendall(head)
            time.sleep(0.5)  # the server has read every announcement
            answer = httpx.post(f"{server.url}/toy", json=toy_body())
            assert answer.status_code == 200, answer.text
        finally:
            for holder in holders:
                holder.close()


def _trickle_body(url: str, content_length: int, every_s: float, for_s: float) -> bytes:
    """POST headers announcing `content_length`, then one byte every `every_s` (never a stall) until the server
    answers or `for_s` pass; what the server sent until it closed (b"" if nothing)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        head = f"POST /toy HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {content_length}"
        connection.sendall(head.encode() + b"\r\n\r\n ")
        ends = time.monotonic() + for_s
        while time.monotonic() < ends:
            readable, _, _ = select.select([connection], [], [], every_s)
            if readable:
                return closed_within(connection, 10)[1]  # the head and body may be two segments, then a reset
            connection.sendall(b" ")
    return b""


@pytest.mark.slow
def test_a_trickled_body_gets_408_at_the_request_deadline(tmp_path):
    """A byte every 0.5 s never stalls for MNEMO_BODY_TIMEOUT_S, but the body must be in by the deadline."""
    with _toy_server(tmp_path, MNEMO_REQUEST_TIMEOUT_S="3", MNEMO_BODY_TIMEOUT_S="2") as server:
        started = time.monotonic()
        answer = _trickle_body(server.url, 100_000, every_s=0.5, for_s=15)
        assert answer.startswith(b"HTTP/1.1 408") and b"MNEMO_REQUEST_TIMEOUT_S" in answer, answer[:300]
        assert time.monotonic() - started < 10  # the trickle would go on for 15 s
        assert httpx.post(f"{server.url}/toy", json=toy_body()).status_code == 200
