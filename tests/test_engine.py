"""The engine: micro-batching, admission, cancellation and the thread budget, on real ONNX Runtime sessions.

The batcher is driven directly (toy graphs whose run time a test chooses, and the committed models),
then over HTTP against real server processes (429, 504, client disconnects, /health under load).
"""

from __future__ import annotations

import asyncio
import functools
import select
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from app.core.errors import Overloaded
from app.core.loop_lag import LoopLag
from app.core.metrics import Metrics
from app.core.request_context import request_arrival, request_body_bytes, request_connected
from app.core.settings import Settings
from app.runtime import batcher as batcher_module
from app.runtime.batcher import MIN_CELLS_TO_LEARN, BatchConfig, Chain, ModelBatcher, RunSlots
from app.runtime.engine import Engine
from app.runtime.registry import ModelRegistry
from app.tasks import TASKS
from app.tasks.knowledge_trace import service as kt_service
from app.tasks.similarity import service as sim_service
from tests.conftest import COMMITTED, SIM_MODEL
from tests.helpers import running_server
from tests.toy_model import PICKY_KS, build_slow_onnx, toy_entry, write_toy_artifacts


class RecordedRuns:
    """A real slow toy session whose runs are recorded: rows per run and how many overlapped."""

    def __init__(self, path) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(build_slow_onnx(path)), options, providers=["CPUExecutionProvider"])
        self.batches: list[int] = []
        self.threads: list[str] = []  # the thread each run ran on
        self.active = self.most_active = 0
        self._lock = threading.Lock()

    def __call__(self, feeds):
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.threads.append(threading.current_thread().name.split("_")[0])
        try:
            y, z = self.session.run(["y", "z"], feeds)
        finally:
            with self._lock:
                self.active -= 1
                self.batches.append(len(feeds["k"]))
        return {"y": y, "z": z}


def _feeds(value: float, spin: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 3), value, dtype=np.float32), "k": np.array([spin], dtype=np.int64)}


def _batcher(
    run, slots, max_batch=8, max_wait_s=0.05, max_queue=64, deadline_s=10.0, alone=lambda: False
) -> ModelBatcher:
    config = BatchConfig(max_batch, max_wait_s, max_queue, deadline_s)
    return ModelBatcher("toy", run, (), {}, slots, config, Metrics(), alone)


def _drive(scenario, runs: int = 1, **config):
    """Run `scenario(batcher)` in a fresh event loop with a started batcher, then stop it."""

    async def main():
        slots = RunSlots(runs)
        batcher = _batcher(config.pop("run"), slots, **config)
        batcher.start()
        try:
            return await scenario(batcher)
        finally:
            await batcher.stop()
            slots.close()

    return asyncio.run(main())


SLOW_RUN_S = 1.5  # how long a "slow" toy run should take, whatever the machine


@functools.lru_cache(maxsize=1)
def slow_spin() -> int:
    """Spin iterations that make one toy run take about SLOW_RUN_S here (calibrated once)."""
    runs = RecordedRuns(Path(tempfile.mkdtemp()) / "calibrate.onnx")
    started = time.perf_counter()
    runs(_feeds(0, 300))
    return max(300, int(300 * SLOW_RUN_S / (time.perf_counter() - started)))


def test_an_idle_model_runs_a_request_at_once(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        return await batcher.run(_feeds(1.5), 1, 1)

    outputs = _drive(scenario, run=runs, max_wait_s=10)  # a long max_wait must not delay an idle model
    np.testing.assert_array_equal(outputs["y"], [[3.0, 3.0, 3.0]])
    assert runs.batches == [1]


def test_a_request_alone_runs_on_the_event_loop_once_its_model_is_known_to_be_fast(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")
    alone = [True]

    async def scenario(batcher):
        async def request(value: float, age_s: float = 0.0, spin: int = 1):
            request_arrival.set(time.perf_counter() - age_s)
            return await batcher.run(_feeds(value, spin), 1, 1)

        await request(1)  # the model's run time is not known yet: a worker thread
        inline = await request(2)  # alone, small, known to be fast: on the loop
        await request(3, age_s=1.0)  # a request past its first INLINE_WINDOW_S: the queue
        alone[0] = False
        await request(4)  # another request is in flight: the queue
        alone[0] = True
        await request(5, spin=slow_spin())  # inline (its cells look small), and it shows this model can be slow
        await request(6)  # so this one goes through the queue
        return inline

    inline = _drive(scenario, run=runs, alone=lambda: alone[0])
    np.testing.assert_array_equal(inline["y"], [[4.0, 4.0, 4.0]])
    assert runs.threads == ["onnx-run", "MainThread", "onnx-run", "onnx-run", "MainThread", "onnx-run"]


def test_a_lone_request_on_an_idle_fast_model_runs_without_the_batching_loop(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        request_arrival.set(time.perf_counter())
        await batcher.run(_feeds(1), 1, 1)  # on a worker thread: the model's run time is learned
        batcher._loop_task.cancel()  # from now on, only rows that skip the queue can run
        request_arrival.set(time.perf_counter())
        return await asyncio.wait_for(batcher.run(_feeds(2), 1, 1), timeout=5)

    outputs = _drive(scenario, run=runs, alone=lambda: True)
    np.testing.assert_array_equal(outputs["y"], [[4.0, 4.0, 4.0]])
    assert runs.threads == ["onnx-run", "MainThread"]


def test_requests_arriving_during_a_run_share_the_next_one(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        first = asyncio.create_task(batcher.run(_feeds(0, slow_spin()), 1, 1))
        await asyncio.sleep(0.1)
        rest = await asyncio.gather(*(batcher.run(_feeds(value), 1, 1) for value in range(1, 6)))
        await first
        return rest

    rest = _drive(scenario, run=runs)
    assert runs.batches == [1, 5]
    for value, outputs in zip(range(1, 6), rest, strict=True):
        np.testing.assert_array_equal(outputs["y"], [[2.0 * value] * 3])  # each got its own rows back


def test_the_next_batch_flushes_on_size_while_another_run_is_in_flight(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        slow = asyncio.create_task(batcher.run(_feeds(0, slow_spin()), 1, 1))
        await asyncio.sleep(0.1)
        await asyncio.gather(*(batcher.run(_feeds(value), 1, 1) for value in range(4)))
        return slow.done()

    slow_done = _drive(scenario, runs=2, run=runs, max_batch=4, max_wait_s=30)
    assert runs.batches[0] == 4  # the full batch ran on the second slot at once: no max_wait, no slow run
    assert not slow_done


def test_the_next_batch_flushes_on_time_while_another_run_is_in_flight(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        slow = asyncio.create_task(batcher.run(_feeds(0, slow_spin()), 1, 1))
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        await batcher.run(_feeds(1), 1, 1)
        return time.perf_counter() - started, slow.done()

    waited, slow_done = _drive(scenario, runs=2, run=runs, max_batch=4, max_wait_s=0.3)
    assert waited >= 0.25 and not slow_done  # held for max_wait to fill, then run beside the slow one


def test_a_cancelled_request_is_dropped_before_it_runs_and_its_wait_is_counted(tmp_path):
    """Requests cancelled while queued (deadline, client gone) are the longest waits: left out of
    mnemo_queue_wait_seconds, the histogram would show only the survivors' waits under overload."""
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        slow = asyncio.create_task(batcher.run(_feeds(0, slow_spin()), 1, 1))
        await asyncio.sleep(0.1)
        queued = asyncio.create_task(batcher.run(_feeds(9), 1, 1))
        await asyncio.sleep(0.3)
        queued.cancel()  # as its deadline would
        await slow
        await batcher.run(_feeds(2), 1, 1)
        return batcher._metrics.registry

    registry = _drive(scenario, run=runs)
    assert runs.batches == [1, 1]  # the slow run and the last request: the cancelled one never ran
    count = registry.get_sample_value("mnemo_queue_wait_seconds_count", {"model": "toy"})
    below = registry.get_sample_value("mnemo_queue_wait_seconds_bucket", {"model": "toy", "le": "1.0"})
    assert count == 3, count  # the slow run's item, the one given up and the last one
    assert below == 3  # the one given up waited its 0.3 s, not until the loop noticed it (after the slow run)


def test_rows_of_a_client_that_left_are_skipped_even_before_its_request_is_cancelled(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")
    client_there = {"gone": True, "here": True}

    async def request(batcher: ModelBatcher, name: str, value: float):
        request_connected.set(lambda: client_there[name])  # as RequestContext sets it from the connection
        return await batcher.run(_feeds(value), 1, 1)

    async def scenario(batcher):
        slow = asyncio.create_task(batcher.run(_feeds(0, slow_spin()), 1, 1))
        await asyncio.sleep(0.1)
        left = asyncio.create_task(request(batcher, "gone", 9))
        stays = asyncio.create_task(request(batcher, "here", 2))
        await asyncio.sleep(0.05)
        client_there["gone"] = False  # the client closed its side; nothing has cancelled its request yet
        await slow
        with pytest.raises(asyncio.CancelledError):
            await left
        return await stays

    answer = _drive(scenario, run=runs)
    assert float(answer["y"][0, 0]) == 2 * 2  # the toy graph doubles x
    assert runs.batches == [1, 1]  # the slow run, then only the request whose client stayed


def test_one_bad_request_fails_alone_when_its_batch_fails(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        slow = asyncio.create_task(batcher.run(_feeds(0, slow_spin()), 1, 1))
        await asyncio.sleep(0.1)
        bad = {"x": np.ones((1, 4), dtype=np.float32), "k": np.array([1])}  # the graph's width is 3
        outcomes = await asyncio.gather(batcher.run(_feeds(2), 1, 1), batcher.run(bad, 1, 1), return_exceptions=True)
        await slow
        return outcomes

    good, bad = _drive(scenario, run=runs)
    np.testing.assert_array_equal(good["y"], [[4.0] * 3])
    assert isinstance(bad, Exception)


def test_admission_refuses_past_the_queue_bound_but_never_starves_a_large_request(tmp_path):
    async def scenario(batcher):
        with batcher.admit(3):
            with pytest.raises(Overloaded, match="3 of 4 rows admitted"), batcher.admit(2):
                pass
            with batcher.admit(1):
                pass
        with batcher.admit(10):  # larger than the whole queue, but nothing else is admitted
            pass

    _drive(scenario, run=RecordedRuns(tmp_path / "slow.onnx"), max_queue=4)


def test_admission_refuses_work_that_could_not_finish_before_the_deadline(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")
    cells = MIN_CELLS_TO_LEARN

    async def scenario(batcher):
        started = time.perf_counter()
        await batcher.run(_feeds(0, slow_spin() // 4), 1, cells)  # the batcher learns what one cell costs
        cost = time.perf_counter() - started
        with batcher.admit(1, cells), pytest.raises(Overloaded, match="past the deadline"), batcher.admit(1, cells):
            pass
        return cost

    cost = _drive(scenario, run=runs, deadline_s=0.01)
    assert cost > 0.01  # one such request takes longer than the whole deadline: a second one cannot fit


def test_admission_counts_the_wall_time_a_busy_model_takes_until_it_is_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(batcher_module, "WALL_COST_TTL_S", 0.5)
    cells = MIN_CELLS_TO_LEARN

    async def scenario(batcher):
        with batcher.admit(1, cells):  # a request stays admitted while the model's batches finish slowly
            for _ in range(3):
                await batcher.run(_feeds(0), 1, cells)  # a fast run...
                await asyncio.sleep(0.2)  # ...then a wait before the next (a crowded loop, parsing, hand-offs)
            # about 0.2 s per 256 cells: 1,024 admitted cells need about 0.8 s, past half of the 1 s deadline
            with pytest.raises(Overloaded, match="past the deadline"), batcher.admit(1, 3 * cells):
                pass
        await asyncio.sleep(0.6)  # idle past WALL_COST_TTL_S: only the run time counts again
        with batcher.admit(1, cells), batcher.admit(1, 3 * cells):
            pass

    _drive(scenario, run=RecordedRuns(tmp_path / "toy.onnx"), deadline_s=1.0)


def test_a_body_being_parsed_holds_the_room_its_size_predicts(tmp_path):
    async def scenario(batcher):
        # nothing learned yet: a body being parsed holds one row
        with batcher.reserve(10_000), pytest.raises(Overloaded, match="1 of 4 rows admitted"), batcher.admit(4):
            pass
        request_body_bytes.set(10_000)
        with batcher.admit(4):  # an admitted 10 KB body needed 4 rows: the batcher learns it
            pass
        request_body_bytes.set(None)
        with batcher.admit(3):
            with pytest.raises(Overloaded, match="at capacity") as refused, batcher.reserve(10_000):
                pass  # the 2 rows held by a 10 KB body being parsed (half of 4) do not fit beside 3 admitted
            with batcher.reserve(2_500):  # 1 row does
                pass
        # two 10 KB bodies parsed at once fill the queue
        with batcher.reserve(10_000), batcher.reserve(10_000), pytest.raises(Overloaded), batcher.admit(1):
            pass
        return refused.value

    refusal = _drive(scenario, run=RecordedRuns(tmp_path / "toy.onnx"), max_queue=4)
    assert "3 of 4 rows admitted" in str(refusal)


def test_the_earliest_request_runs_first_so_chunked_requests_finish_in_arrival_order(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")
    order = []

    def run_and_record(feeds):
        order.append(int(feeds["x"][0, 0]))
        return runs(feeds)

    async def chunked_request(batcher, request: int, arrival: float) -> None:
        request_arrival.set(arrival)
        for _ in range(3):  # each chunk is queued when the previous one is done, like a long history
            await batcher.run(_feeds(request, 50), 1, 1)

    async def scenario(batcher):
        now = time.perf_counter()
        await asyncio.gather(chunked_request(batcher, 1, now), chunked_request(batcher, 2, now + 0.001))

    _drive(scenario, run=run_and_record, max_batch=1, max_wait_s=0)
    assert order == [1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("slots", [1, 2])
def test_runs_in_flight_never_exceed_the_run_slots(tmp_path, slots):
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        await asyncio.gather(*(batcher.run(_feeds(value, 300), 1, 1) for value in range(12)))

    _drive(scenario, runs=slots, run=runs, max_batch=2, max_wait_s=0)
    assert runs.most_active == slots and sum(runs.batches) == 12


def test_an_item_larger_than_max_batch_runs_in_parts(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")
    feeds = {"x": np.arange(30, dtype=np.float32).reshape(10, 3), "k": np.ones(10, dtype=np.int64)}

    outputs = _drive(lambda batcher: batcher.run(feeds, 10, 1), run=runs, max_batch=4)
    np.testing.assert_array_equal(outputs["y"], feeds["x"] * 2)
    assert sorted(runs.batches) == [2, 4, 4]


def _chain(value: float, chunks: int, spin: int = 1) -> Chain:
    """A toy chain: each chunk's x is the y (2x) of the chunk before it."""
    return Chain([(_feeds(value, spin), 1)] + [(_feeds(0, spin), 1)] * (chunks - 1), "x", "y")


def test_a_chain_runs_its_chunks_in_order_on_a_run_slot_carrying_the_state(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")

    async def scenario(batcher):
        return await asyncio.gather(batcher.run_chain(_chain(1, 4)), batcher.run(_feeds(7), 1, 1))

    chain_outputs, alone = _drive(scenario, run=runs, max_batch=8, max_wait_s=0)
    assert [float(outputs["y"][0, 0]) for outputs in chain_outputs] == [2, 4, 8, 16]
    assert float(alone["y"][0, 0]) == 14
    assert runs.batches == [1] * 5  # never batched with the other request's row
    assert set(runs.threads) == {"onnx-run"}  # the chunks ran on the run slot, not on the event loop


@pytest.mark.parametrize("slice_s", [0.0, 60.0])
def test_a_chain_gives_its_slot_back_after_its_slice_to_an_earlier_request(tmp_path, monkeypatch, slice_s):
    monkeypatch.setattr(batcher_module, "CHAIN_SLICE_S", slice_s)
    runs = RecordedRuns(tmp_path / "slow.onnx")
    order = []
    earlier_queued = threading.Event()

    def run_and_record(feeds):
        order.append("chain" if feeds["k"][0] > 1 else "earlier")
        if len(order) == 1:
            earlier_queued.wait(10)  # the chain's first chunk ends only once the earlier request is queued
        return runs(feeds)

    async def scenario(batcher):
        now = time.perf_counter()
        request_arrival.set(now)
        chain = asyncio.ensure_future(batcher.run_chain(_chain(1, 3, spin=2)))
        while not order:  # the chain's first chunk is running
            await asyncio.sleep(0.001)
        request_arrival.set(now - 1)  # a request that arrived before the chain's
        earlier = asyncio.ensure_future(batcher.run(_feeds(1), 1, 1))
        await asyncio.sleep(0)  # its row is queued
        earlier_queued.set()
        await asyncio.gather(chain, earlier)

    _drive(scenario, run=run_and_record, max_batch=8, max_wait_s=0)
    if slice_s:
        assert order == ["chain", "chain", "chain", "earlier"]
    else:
        assert order == ["chain", "earlier", "chain", "chain"]


def test_a_chain_stops_between_chunks_once_its_client_has_gone(tmp_path):
    runs = RecordedRuns(tmp_path / "slow.onnx")
    connected = threading.Event()
    connected.set()

    def run_then_leave(feeds):
        connected.clear()  # the client leaves while the first chunk runs
        return runs(feeds)

    async def scenario(batcher):
        request_connected.set(connected.is_set)
        with pytest.raises(asyncio.CancelledError):
            await batcher.run_chain(_chain(1, 5, spin=50))

    _drive(scenario, run=run_then_leave, max_batch=8, max_wait_s=0)
    assert runs.batches == [1]


# -- batch composition never changes a result (the committed models) ---------------------------------
@pytest.fixture(scope="module")
def committed_registry() -> ModelRegistry:
    registry = ModelRegistry(Settings(artifacts_dir=COMMITTED, provider="cpu", intra_op_threads=1), TASKS, Metrics())
    registry.load()
    return registry


def _with_engine(registry: ModelRegistry, scenario):
    async def main():
        engine = Engine(registry, registry.settings, registry.metrics)
        try:
            return await scenario()
        finally:
            await engine.stop()

    return asyncio.run(main())


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
        for name in single:
            np.testing.assert_allclose(single[name], batched[name], atol=1e-5, rtol=0)
    assert max(committed_registry.metrics.batch_size.labels(SIM_MODEL).collect()[0].samples[-1].value, 0) > 0


@pytest.mark.parametrize(("name", "chunks_share_runs"), [("dkvmn-assist2009", False), ("dkt-assist2009", True)])
def test_knowledge_trace_results_do_not_depend_on_the_batch(committed_registry, name, chunks_share_runs):
    """DKVMN runs a long history as a chain, DKT queues its chunks as rows that share runs: same results."""
    model = committed_registry.models[name]
    rng = np.random.default_rng(0)
    histories = [(rng.integers(1, 111, n), rng.integers(0, 2, n)) for n in (3, 57, 200, 431)]

    async def scenario():
        alone = [await kt_service.trace(model, q, r) for q, r in histories]
        together = await kt_service.trace_all(model, [(q, r, None) for q, r in histories])
        assert kt_service.chunks_share_runs(model) is chunks_share_runs
        return alone, together

    def runs_and_rows() -> tuple[float, float]:
        samples = committed_registry.metrics.batch_size.labels(name).collect()[0].samples
        values = {sample.name: sample.value for sample in samples}
        return values["mnemo_batch_size_rows_count"], values["mnemo_batch_size_rows_sum"]

    runs_before, rows_before = runs_and_rows()
    alone, together = _with_engine(committed_registry, scenario)
    for single, batched in zip(alone, together, strict=True):
        for field in ("predictions", "attention", "mastery", "memory"):
            if getattr(single, field) is not None or getattr(batched, field) is not None:
                np.testing.assert_allclose(getattr(single, field), getattr(batched, field), atol=1e-5, rtol=0)
    runs_after, rows_after = runs_and_rows()
    # 1 + 1 + 1 + 3 chunks, one row per chunk, alone then together: together, the one-chunk histories share a
    # run (DKVMN: the long one is a chain of 3 runs; DKT: its chunks share runs with the others too)
    assert rows_after - rows_before == 2 * 6 and runs_after - runs_before < 2 * 6


# -- over HTTP, against real server processes --------------------------------------------------------
def _toy_server(tmp_path, **env):
    artifacts = write_toy_artifacts(tmp_path / "slow", [toy_entry("toy-a", default=True)], slow=True)
    settings = {"MNEMO_CONCURRENT_RUNS": "1", **env}
    return running_server(artifacts, [sys.executable, "-m", "tests.toy_server"], **settings)


def _metric(url: str, line_start: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.split()[-1])
    return 0.0


async def _until(url: str, line_start: str, value: float) -> None:
    """Wait (at most 30 s) until the metric line starting with `line_start` reaches `value`."""
    deadline = time.monotonic() + 30
    while _metric(url, line_start) < value and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def _until_admitted(url: str, rows: int) -> None:
    """Wait until the toy model holds `rows` admitted rows: the slow request has arrived."""
    await _until(url, 'mnemo_admitted_rows{model="toy-a"}', rows)


def _toy(spin: int) -> dict:
    return {"x": [[1, 2, 3]], "k": [spin]}


def test_a_full_queue_answers_429_with_retry_after_at_once(tmp_path):
    async def scenario(url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            slow = asyncio.create_task(client.post("/toy", json=_toy(slow_spin())))
            await _until_admitted(url, 1)
            started = time.perf_counter()
            answers = await asyncio.gather(*(client.post("/toy", json=_toy(1)) for _ in range(6)))
            return (await slow).status_code, answers, time.perf_counter() - started

    with _toy_server(tmp_path, MNEMO_MAX_QUEUE="3") as server:
        slow_status, answers, _ = asyncio.run(scenario(server.url))
        refused = [answer for answer in answers if answer.status_code == 429]
        assert slow_status == 200 and len(refused) == 4 and {a.status_code for a in answers} == {200, 429}
        assert all(answer.headers["retry-after"] == "1" for answer in refused)
        assert "MNEMO_MAX_QUEUE" in refused[0].json()["detail"]
        assert _metric(server.url, 'mnemo_requests_rejected_total{model="toy-a",reason="queue_full"}') == 4


def test_a_large_body_for_a_model_that_refuses_all_work_is_429_before_it_is_parsed(tmp_path):
    unparsable = b'{"model": "toy-a", "x": [[1, 2, 3]], "k": [1], "pad": "' + b"a" * 9000  # no closing quote

    async def scenario(url):
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            slow = asyncio.create_task(client.post("/toy", json=_toy(slow_spin())))
            await _until_admitted(url, 1)
            while_full = await client.post("/toy/read", content=unparsable, headers=headers)
            unknown = await client.post("/toy/read", content=unparsable.replace(b"toy-a", b"toy-z"), headers=headers)
            await slow
            after = await client.post("/toy/read", content=unparsable, headers=headers)
            return while_full, unknown, after

    with _toy_server(tmp_path, MNEMO_MAX_QUEUE="1") as server:
        while_full, unknown, after = asyncio.run(scenario(server.url))
        assert while_full.status_code == 429 and while_full.headers["retry-after"] == "1"
        assert "toy-a is at capacity" in while_full.json()["detail"]
        assert unknown.status_code == 422  # a model the scan cannot resolve: parsed, and the parse error shown
        assert after.status_code == 422  # the same body, once the model has room: parsed
        assert _metric(server.url, 'mnemo_requests_rejected_total{model="toy-a",reason="before_parsing"}') == 1


def test_a_request_past_its_deadline_is_504_and_queued_work_behind_it_never_runs(tmp_path):
    async def scenario(url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            # A deadline long enough to see the slow request admitted on a loaded machine, and a run (3 x 1.5 s)
            # well past it, whatever the load did to the calibration.
            slow = asyncio.create_task(client.post("/toy", json=_toy(3 * slow_spin())))
            await _until_admitted(url, 1)
            queued = await client.post("/toy", json=_toy(1))
            return await slow, queued

    with _toy_server(tmp_path, MNEMO_REQUEST_TIMEOUT_S="2") as server:
        slow, queued = asyncio.run(scenario(server.url))
        assert slow.status_code == 504 and queued.status_code == 504
        assert "MNEMO_REQUEST_TIMEOUT_S" in queued.json()["detail"]
        asyncio.run(_until(server.url, 'mnemo_inference_duration_seconds_count{model="toy-a"}', 1))  # slow run done
        time.sleep(0.5)
        assert _metric(server.url, 'mnemo_requests_timed_out_total{model="toy-a"}') == 2
        assert _metric(server.url, 'mnemo_batch_size_rows_count{model="toy-a"}') == 1  # only the slow run ran


def test_a_batch_that_fails_in_onnxruntime_fails_only_its_bad_request_and_each_run_is_counted_once(tmp_path):
    """Three requests queue for toy-b (the picky graph) while toy-a's slow run holds the only run slot, so
    they run as one batch; the middle one's k fails that run, so each is rerun alone (the batcher's `_isolate`):
    the good ones get 200, the bad one 422, and the batch-size and inference histograms count the same runs."""
    entries = [toy_entry("toy-a", default=True), toy_entry("toy-b")]
    artifacts = write_toy_artifacts(tmp_path / "picky", entries, slow=True, picky=["toy-b"])

    async def scenario(url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            slow = asyncio.create_task(client.post("/toy", json=_toy(slow_spin())))
            await _until_admitted(url, 1)
            bodies = [{"model": "toy-b", "x": [[1, 2, 3]], "k": [k]} for k in (1, PICKY_KS, 2)]
            answers = [asyncio.create_task(client.post("/toy", json=body)) for body in bodies]
            await _until(url, 'mnemo_queue_depth{model="toy-b"}', 3)
            slot_held = _metric(url, 'mnemo_inference_duration_seconds_count{model="toy-a"}') == 0
            return slot_held, await slow, await asyncio.gather(*answers)

    with running_server(artifacts, [sys.executable, "-m", "tests.toy_server"], MNEMO_CONCURRENT_RUNS="1") as server:
        slot_held, slow, (first, bad, last) = asyncio.run(scenario(server.url))
        assert slot_held  # all three were queued before the slow run ended: they ran as one batch
        assert slow.status_code == 200
        assert (first.status_code, first.json()["z"]) == (200, [2])
        assert (last.status_code, last.json()["z"]) == (200, [3])
        assert bad.status_code == 422 and "out of data bounds" in bad.json()["detail"][0]["msg"]
        runs = _metric(server.url, 'mnemo_inference_duration_seconds_count{model="toy-b"}')
        assert runs == 2  # the two good requests, each rerun alone; the failed batch and the bad one never completed
        assert _metric(server.url, 'mnemo_batch_size_rows_count{model="toy-b"}') == runs
        assert _metric(server.url, 'mnemo_batch_size_rows_sum{model="toy-b"}') == 2


def test_a_client_that_disconnects_cancels_its_queued_work(tmp_path):
    async def scenario(url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            slow = asyncio.create_task(client.post("/toy", json=_toy(slow_spin())))
            await _until_admitted(url, 1)
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/toy", json=_toy(1), timeout=0.3)  # gives up and closes its connection
            return await slow

    with _toy_server(tmp_path) as server:
        assert asyncio.run(scenario(server.url)).status_code == 200
        time.sleep(0.3)
        assert _metric(server.url, 'mnemo_requests_cancelled_total{model="toy-a"}') == 1
        assert _metric(server.url, 'mnemo_batch_size_rows_count{model="toy-a"}') == 1  # the left one never ran


def test_health_answers_while_inference_is_saturated(tmp_path):
    async def scenario(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            load = [asyncio.create_task(client.post("/toy", json=_toy(slow_spin() // 10))) for _ in range(16)]
            await asyncio.sleep(0.3)
            latencies = []
            for _ in range(10):
                started = time.perf_counter()
                assert (await client.get("/health")).status_code == 200
                latencies.append(time.perf_counter() - started)
            statuses = {(await task).status_code for task in load}
            return max(latencies), statuses

    with _toy_server(tmp_path, MNEMO_MAX_BATCH="1", MNEMO_REQUEST_TIMEOUT_S="120") as server:
        slowest, statuses = asyncio.run(scenario(server.url))
        assert statuses == {200} and slowest < 1.0  # generous: a blocked loop would wait for whole runs


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
        assert httpx.post(f"{server.url}/toy", json=_toy(1)).status_code == 200  # the budget is given back
        assert _metric(server.url, 'mnemo_server_requests_rejected_total{reason="bodies_in_memory"}') == 2


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
            answer = httpx.post(f"{server.url}/toy", json=_toy(1))
            assert answer.status_code == 200, answer.text
        finally:
            for holder in holders:
                holder.close()


def _trickle_body(url: str, content_length: int, every_s: float, for_s: float) -> bytes:
    """POST headers announcing `content_length`, then one byte every `every_s` (never a stall) until the server
    answers or `for_s` pass; what the server sent (b"" if nothing)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        head = f"POST /toy HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {content_length}"
        connection.sendall(head.encode() + b"\r\n\r\n ")
        ends = time.monotonic() + for_s
        while time.monotonic() < ends:
            readable, _, _ = select.select([connection], [], [], every_s)
            if readable:
                return connection.recv(4096)
            connection.sendall(b" ")
    return b""


def test_a_trickled_body_gets_408_at_the_request_deadline(tmp_path):
    """A byte every 0.5 s never stalls for MNEMO_BODY_TIMEOUT_S, but the body must be in by the deadline."""
    with _toy_server(tmp_path, MNEMO_REQUEST_TIMEOUT_S="3", MNEMO_BODY_TIMEOUT_S="2") as server:
        started = time.monotonic()
        answer = _trickle_body(server.url, 100_000, every_s=0.5, for_s=15)
        assert answer.startswith(b"HTTP/1.1 408") and b"MNEMO_REQUEST_TIMEOUT_S" in answer, answer[:300]
        assert time.monotonic() - started < 5
        assert httpx.post(f"{server.url}/toy", json=_toy(1)).status_code == 200


def test_the_loop_lag_sees_a_blocked_event_loop_and_decays_once_it_keeps_up():
    metrics = Metrics()

    async def scenario():
        lag = LoopLag(metrics.loop_lag)
        lag.start()
        await asyncio.sleep(0.15)
        time.sleep(0.3)  # the event loop is blocked: its timers run late
        await asyncio.sleep(0.15)
        blocked = lag.recent_s
        await asyncio.sleep(1.5)
        await lag.stop()
        return blocked, lag.recent_s

    blocked, later = asyncio.run(scenario())
    assert blocked >= 0.2
    assert later < blocked / 2  # a spike counts half after about a second
    assert metrics.registry.get_sample_value("mnemo_event_loop_lag_seconds") == later
