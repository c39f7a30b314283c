"""The batcher driven directly: micro-batching, admission, cancellation, chains and the thread budget.

Runs go through a real ONNX Runtime session of the toy graph (y = 2x, z = k + 1) on the batcher's run-slot
threads. Time is a manual clock, shared by the batcher and the event loop's timers: a run costs `k[0]`
milliseconds of it, a test advances it where time must pass, and a run that must stay in flight is held on
its thread until the test releases it. No test sleeps or depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest

from app.core.errors import Overloaded
from app.core.metrics import Metrics
from app.core.request_context import request_arrival, request_body_bytes, request_connected
from app.runtime.batcher import CHAIN_SLICE_S, BatchConfig, Chain, ModelBatcher
from app.runtime.instances import CPU, Instance, RunSlots
from app.runtime.model import GraphLayout
from tests.manual_clock import WATCHDOG_S, ManualClock, run_on_clock
from tests.toy_model import build_toy_onnx
from tests.toy_profiles import flat_cost, linear_cost


class Hold:
    """Keeps the next `runs` runs that start waiting on their threads until `release()`."""

    def __init__(self, runs: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._free = runs
        self._holding = 0
        self._changed = asyncio.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """True for each of the first `runs` runs that ask (from their threads): those are held."""
        with self._lock:
            if self._free <= 0:
                return False
            self._free -= 1
            return True

    def wait(self) -> None:
        """On a run's thread: wait until released."""
        with self._lock:
            self._holding += 1
        self._loop.call_soon_threadsafe(self._changed.set)
        if not self._released.wait(WATCHDOG_S):
            raise TimeoutError("a held run was never released")

    async def started(self, runs: int = 1) -> None:
        """Until `runs` held runs are waiting on their threads."""
        while self._holding < runs:
            self._changed.clear()
            if self._holding < runs:
                await self._changed.wait()

    def release(self) -> None:
        self._released.set()


class ToyRuns:
    """The toy graph's session, its runs recorded (rows, thread, overlap); each costs `k[0]` ms of `clock`."""

    def __init__(self, path, clock: ManualClock) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(build_toy_onnx(path)), options, providers=["CPUExecutionProvider"])
        self.clock = clock
        self.batches: list[int] = []  # rows per finished run
        self.threads: list[str] = []  # the thread each run ran on
        self.active = self.most_active = 0
        self._hold: Hold | None = None
        self._lock = threading.Lock()

    def hold(self, runs: int = 1) -> Hold:
        """Hold the next `runs` runs that start (each on a run-slot thread, never on the event loop)."""
        self._hold = Hold(runs)
        return self._hold

    def __call__(self, feeds):
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.threads.append(threading.current_thread().name.split("_")[0])
            held = self._hold is not None and self._hold.take()
        try:
            if held:
                self._hold.wait()
            y, z = self.session.run(["y", "z"], feeds)
            self.clock.advance(float(feeds["k"].max()) / 1000)
        finally:
            with self._lock:
                self.active -= 1
                self.batches.append(len(feeds["k"]))
        return {"y": y, "z": z}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def toy_runs(tmp_path, clock) -> ToyRuns:
    return ToyRuns(tmp_path / "toy.onnx", clock)


def _feeds(value: float, cost_ms: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 3), value, dtype=np.float32), "k": np.array([cost_ms], dtype=np.int64)}


def _drive(
    scenario,
    run: Callable,
    clock: ManualClock,
    slots: int = 1,
    metrics: Metrics | None = None,
    alone: Callable[[], bool] = lambda: False,
    max_batch: int = 8,
    max_wait_s: float = 0.05,
    max_queue: int = 64,
    deadline_s: float = 10.0,
    max_cells: int | None = None,
    instances: list[Instance] | None = None,
):
    """Run `scenario(batcher)` on `clock` with a started batcher of the toy model (one CPU instance running `run`,
    or `instances`, each given `slots` run slots of its own), then stop it."""

    async def main():
        config = BatchConfig(max_batch, max_wait_s, max_queue, deadline_s, max_cells)
        served = instances or [Instance("cpu-0", CPU, run)]
        for instance in served:
            instance.slots = RunSlots(slots)
        batcher = ModelBatcher("toy", served, GraphLayout(), config, metrics or Metrics(), alone, clock)
        try:
            return await scenario(batcher)
        finally:
            await batcher.stop()
            for instance in served:
                instance.slots.executor.shutdown()

    return run_on_clock(clock, main())


async def _until_queued(metrics: Metrics, rows: int) -> None:
    """Until `rows` rows wait in the toy model's queue (tasks just created reach it within a few loop turns)."""
    while (metrics.registry.get_sample_value("mnemo_queue_depth", {"model": "toy"}) or 0) < rows:
        await asyncio.sleep(0)


async def _turns(count: int = 20) -> None:
    """Let the event loop run `count` times: whatever is due by the clock happens."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_an_idle_model_runs_a_request_at_once(toy_runs, clock):
    async def scenario(batcher):
        return await batcher.run(_feeds(1.5), 1, 1)  # no clock advance: any wait for max_wait would never end

    outputs = _drive(scenario, toy_runs, clock, max_wait_s=10)
    np.testing.assert_array_equal(outputs["y"], [[3.0, 3.0, 3.0]])
    assert toy_runs.batches == [1]


def test_a_request_alone_runs_on_the_event_loop_once_its_model_is_known_to_be_fast(toy_runs, clock):
    alone = [True]

    async def scenario(batcher):
        async def request(value: float, age_s: float = 0.0, cost_ms: int = 1):
            request_arrival.set(clock() - age_s)
            return await batcher.run(_feeds(value, cost_ms), 1, 1)

        await request(1)  # the model's run time is not known yet: a worker thread
        inline = await request(2)  # alone, small, known to be fast: on the loop
        await request(3, age_s=1.0)  # a request past its first INLINE_WINDOW_S: the queue
        alone[0] = False
        await request(4)  # another request is in flight: the queue
        alone[0] = True
        await request(5, cost_ms=100)  # inline (predicted fast), and it shows this model can be slow...
        for _ in range(6):
            await request(6, cost_ms=100)  # ...which its cost model learns in a few runs (OUTLIER: 4x at most each)
        await request(7)  # predicted slow: the queue
        return inline

    inline = _drive(scenario, toy_runs, clock, alone=lambda: alone[0])
    np.testing.assert_array_equal(inline["y"], [[4.0, 4.0, 4.0]])
    assert toy_runs.threads[:5] == ["onnx-run", "MainThread", "onnx-run", "onnx-run", "MainThread"]
    assert toy_runs.threads[-1] == "onnx-run"


def test_a_lone_request_on_an_idle_fast_model_runs_without_the_batching_loop(toy_runs, clock):
    async def scenario(batcher):
        request_arrival.set(clock())
        await batcher.run(_feeds(1), 1, 1)  # on a worker thread: the model's run time is learned
        batcher._loop_task.cancel()  # from now on, only rows that skip the queue can run
        request_arrival.set(clock())
        return await batcher.run(_feeds(2), 1, 1)

    outputs = _drive(scenario, toy_runs, clock, alone=lambda: True)
    np.testing.assert_array_equal(outputs["y"], [[4.0, 4.0, 4.0]])
    assert toy_runs.threads == ["onnx-run", "MainThread"]


def test_requests_arriving_during_a_run_share_the_next_one(toy_runs, clock):
    metrics = Metrics()

    async def scenario(batcher):
        hold = toy_runs.hold()
        first = asyncio.create_task(batcher.run(_feeds(0), 1, 1))
        await hold.started()
        rest = [asyncio.create_task(batcher.run(_feeds(value), 1, 1)) for value in range(1, 6)]
        await _until_queued(metrics, 5)
        hold.release()
        await first
        return await asyncio.gather(*rest)

    rest = _drive(scenario, toy_runs, clock, metrics=metrics)
    assert toy_runs.batches == [1, 5]
    for value, outputs in zip(range(1, 6), rest, strict=True):
        np.testing.assert_array_equal(outputs["y"], [[2.0 * value] * 3])  # each got its own rows back


def test_the_next_batch_flushes_on_size_while_another_run_is_in_flight(toy_runs, clock):
    async def scenario(batcher):
        hold = toy_runs.hold()
        slow = asyncio.create_task(batcher.run(_feeds(0), 1, 1))
        await hold.started()
        await asyncio.gather(*(batcher.run(_feeds(value), 1, 1) for value in range(4)))  # the clock stands still
        held_run_done = slow.done()
        hold.release()
        await slow
        return held_run_done

    held_run_done = _drive(scenario, toy_runs, clock, slots=2, max_batch=4, max_wait_s=30)
    assert toy_runs.batches == [4, 1]  # the full batch ran on the second slot at once: no max_wait
    assert not held_run_done


def test_the_next_batch_flushes_on_time_while_another_run_is_in_flight(toy_runs, clock):
    metrics = Metrics()

    async def scenario(batcher):
        hold = toy_runs.hold()
        slow = asyncio.create_task(batcher.run(_feeds(0), 1, 1))
        await hold.started()
        queued = asyncio.create_task(batcher.run(_feeds(1), 1, 1))
        await _until_queued(metrics, 1)
        clock.advance(0.29)
        await _turns()
        before_max_wait = queued.done()
        clock.advance(0.02)
        await queued  # held for max_wait to fill, then run beside the held one
        held_run_done = slow.done()
        hold.release()
        await slow
        return before_max_wait, held_run_done

    before_max_wait, held_run_done = _drive(
        scenario, toy_runs, clock, slots=2, metrics=metrics, max_batch=4, max_wait_s=0.3
    )
    assert not before_max_wait and not held_run_done
    assert toy_runs.batches == [1, 1]


def test_a_cancelled_request_is_dropped_before_it_runs_and_its_wait_is_counted(toy_runs, clock):
    """Requests cancelled while queued (deadline, client gone) are the longest waits: left out of
    mnemo_queue_wait_seconds, the histogram would show only the survivors' waits under overload."""
    metrics = Metrics()

    async def scenario(batcher):
        hold = toy_runs.hold()
        slow = asyncio.create_task(batcher.run(_feeds(0, cost_ms=1500), 1, 1))
        await hold.started()
        queued = asyncio.create_task(batcher.run(_feeds(9), 1, 1))
        await _until_queued(metrics, 1)
        clock.advance(0.3)
        queued.cancel()  # as its deadline would
        with pytest.raises(asyncio.CancelledError):
            await queued
        hold.release()
        await slow  # its run costs 1.5 s more
        await batcher.run(_feeds(2), 1, 1)

    _drive(scenario, toy_runs, clock, metrics=metrics)
    assert toy_runs.batches == [1, 1]  # the slow run and the last request: the cancelled one never ran
    labels = {"model": "toy"}
    assert metrics.registry.get_sample_value("mnemo_queue_wait_seconds_count", labels) == 3
    # the one given up waited its 0.3 s, not until the loop noticed it (after the slow run); the others none
    assert metrics.registry.get_sample_value("mnemo_queue_wait_seconds_sum", labels) == pytest.approx(0.3)


def test_stopping_cancels_the_queued_requests_and_lowers_the_queue_depth_by_their_rows(toy_runs, clock):
    metrics = Metrics()

    async def scenario(batcher):
        hold = toy_runs.hold()
        running = asyncio.create_task(batcher.run(_feeds(0), 1, 1))
        await hold.started()
        two_rows = {name: np.concatenate([value, value]) for name, value in _feeds(1).items()}
        queued = [asyncio.create_task(batcher.run(feeds, rows, 1)) for feeds, rows in ((_feeds(2), 1), (two_rows, 2))]
        await _until_queued(metrics, 3)
        stopping = asyncio.create_task(batcher.stop())
        await _turns()
        hold.release()
        await stopping
        await running
        return await asyncio.gather(*queued, return_exceptions=True)

    outcomes = _drive(scenario, toy_runs, clock, metrics=metrics)
    assert [type(outcome) for outcome in outcomes] == [asyncio.CancelledError] * 2
    assert toy_runs.batches == [1]
    assert metrics.registry.get_sample_value("mnemo_queue_depth", {"model": "toy"}) == 0


def test_rows_of_a_client_that_left_are_skipped_even_before_its_request_is_cancelled(toy_runs, clock):
    metrics = Metrics()
    client_there = {"gone": True, "here": True}

    async def request(batcher: ModelBatcher, name: str, value: float):
        request_connected.set(lambda: client_there[name])  # as RequestContext sets it from the connection
        return await batcher.run(_feeds(value), 1, 1)

    async def scenario(batcher):
        hold = toy_runs.hold()
        slow = asyncio.create_task(batcher.run(_feeds(0), 1, 1))
        await hold.started()
        left = asyncio.create_task(request(batcher, "gone", 9))
        stays = asyncio.create_task(request(batcher, "here", 2))
        await _until_queued(metrics, 2)
        client_there["gone"] = False  # the client closed its side; nothing has cancelled its request yet
        hold.release()
        await slow
        with pytest.raises(asyncio.CancelledError):
            await left
        return await stays

    answer = _drive(scenario, toy_runs, clock, metrics=metrics)
    assert float(answer["y"][0, 0]) == 2 * 2  # the toy graph doubles x
    assert toy_runs.batches == [1, 1]  # the held run, then only the request whose client stayed


def test_one_bad_request_fails_alone_when_its_batch_fails(toy_runs, clock):
    metrics = Metrics()

    async def scenario(batcher):
        hold = toy_runs.hold()
        slow = asyncio.create_task(batcher.run(_feeds(0), 1, 1))
        await hold.started()
        bad = {"x": np.ones((1, 4), dtype=np.float32), "k": np.array([1])}  # the graph's width is 3
        outcomes = asyncio.gather(batcher.run(_feeds(2), 1, 1), batcher.run(bad, 1, 1), return_exceptions=True)
        await _until_queued(metrics, 2)  # both in the queue: they are taken as one batch
        hold.release()
        await slow
        return await outcomes

    good, bad = _drive(scenario, toy_runs, clock, metrics=metrics)
    np.testing.assert_array_equal(good["y"], [[4.0] * 3])
    assert isinstance(bad, Exception)


def test_admission_refuses_past_the_queue_bound_but_never_starves_a_large_request(toy_runs, clock):
    async def scenario(batcher):
        with batcher.admit(3):
            with pytest.raises(Overloaded, match="3 of 4 rows admitted"), batcher.admit(2):
                pass
            with batcher.admit(1):
                pass
        with batcher.admit(10):  # larger than the whole queue, but nothing else is admitted
            pass

    _drive(scenario, toy_runs, clock, max_queue=4)


@pytest.mark.parametrize(("waited_s", "refused"), [(0.0, False), (4.9, False), (5.1, True)])
def test_admission_refuses_a_request_on_an_idle_model_only_once_it_waited_past_its_share(
    toy_runs, clock, waited_s, refused
):
    """Nothing else admitted and a request larger than the whole queue: admitted whatever its size, unless it has
    already waited past half of the 10 s deadline."""

    async def scenario(batcher):
        request_arrival.set(clock() - waited_s)
        try:
            with batcher.admit(10, 100):
                return False
        except Overloaded as error:
            assert "MNEMO_REQUEST_TIMEOUT_S" in str(error)
            return True

    assert _drive(scenario, toy_runs, clock, max_queue=4, max_cells=10) is refused


@pytest.mark.parametrize(("cell_us", "waited_ms", "refused"), [(10, 0, False), (100, 0, True), (10, 4, True)])
def test_admission_refuses_work_that_could_not_finish_before_the_deadline(clock, cell_us, waited_ms, refused):
    """With a 10 ms deadline, half of it for the work: two requests of 100 cells at 10 us a cell (2 ms) fit, at
    100 us (20 ms) they do not, nor do they fit when the second has already spent 4 ms since it arrived."""

    async def scenario(batcher):
        with batcher.admit(1, 100):
            request_arrival.set(clock() - waited_ms / 1000)
            try:
                with batcher.admit(1, 100):
                    return False
            except Overloaded as error:
                assert "MNEMO_REQUEST_TIMEOUT_S" in str(error)
                return True

    instances = [Instance("cpu-0", CPU, lambda feeds: feeds, cost=linear_cost(cell_us / 1e6))]
    assert _drive(scenario, None, clock, deadline_s=0.01, instances=instances) is refused


class _Probe(Exception):
    """Leaves the probes of `_fits` at once, admitted or not."""


def _fits(batcher, *cells: float) -> bool:
    """Whether requests of `cells` cells each, admitted one inside the other, are all admitted now."""
    try:
        with contextlib.ExitStack() as held:
            for each in cells:
                held.enter_context(batcher.admit(1, each))
            raise _Probe
    except Overloaded as error:
        assert "MNEMO_REQUEST_TIMEOUT_S" in str(error)
        return False
    except _Probe:
        return True


def test_admission_counts_what_the_cost_model_learns_from_the_runs_not_the_time_requests_took(clock):
    """At 1 ms a cell (1 s deadline, 0.5 s for the work), three requests of 100 cells fit beside the one in flight
    (0.4 s) and five do not (0.6 s). A request that took 1 s, ten times its prediction (a flood's refusals crowding
    the CPU), changes nothing: holding a client's request is cheaper than refusing its resends, so admission does not
    tighten on it. Runs that take 2 ms a cell do (the cost model learns them): then one fits (0.3 s), three do not."""

    async def scenario(batcher):
        with batcher.admit(1, 100):
            clock.advance(1.0)
            before = _fits(batcher, *[100] * 3), _fits(batcher, *[100] * 5)
        with batcher.admit(1, 100):
            slow = _fits(batcher, *[100] * 3), _fits(batcher, *[100] * 5)
            for _ in range(40):
                batcher.instances[0].cost.observe(1, 100, 0.2)  # runs at 2 ms a cell
            return before, slow, (_fits(batcher, 100), _fits(batcher, 100, 100, 100))

    instances = [Instance("cpu-0", CPU, lambda feeds: feeds, cost=linear_cost(1e-3))]
    results = _drive(scenario, None, clock, deadline_s=1.0, instances=instances)
    assert results == ((True, False), (True, False), (True, False))


def test_a_body_being_parsed_holds_the_room_its_size_predicts(toy_runs, clock):
    async def scenario(batcher):
        # nothing learned yet: a body being parsed holds one row
        with batcher.reserve(10_000), pytest.raises(Overloaded, match="1 of 4 rows admitted"), batcher.admit(4):
            pass
        request_body_bytes.set(10_000)
        with batcher.admit(2):  # an admitted 10 KB body needed 2 rows: the batcher learns it
            pass
        request_body_bytes.set(None)
        with batcher.admit(3):
            with pytest.raises(Overloaded, match="at capacity") as refused, batcher.reserve(10_000):
                pass  # the 2 rows held by a 10 KB body being parsed do not fit beside 3 admitted
            with batcher.reserve(5_000):  # 1 row does
                pass
        # two 10 KB bodies parsed at once fill the queue: a third is refused before it is parsed
        with batcher.reserve(10_000), batcher.reserve(10_000), pytest.raises(Overloaded), batcher.reserve(10_000):
            pass
        return refused.value

    refusal = _drive(scenario, toy_runs, clock, max_queue=4)
    assert "3 of 4 rows admitted" in str(refusal)


def test_a_body_whose_size_taught_nothing_yet_holds_a_row_but_none_of_the_deadline(clock):
    """Before any large body was admitted nothing says what one needs: each being parsed holds a row (MNEMO_MAX_QUEUE)
    but no time. At 20 ms a run, 24 requests fit in 0.5 s beside three such bodies (0.48 s); were each body counted
    as one run, they would need 0.54 s."""

    async def scenario(batcher):
        with batcher.reserve(10_000), batcher.reserve(10_000), batcher.reserve(10_000):
            return _fits(batcher, *[1] * 24)

    instances = [Instance("cpu-0", CPU, lambda feeds: feeds, cost=flat_cost(0.02))]
    assert _drive(scenario, None, clock, deadline_s=1.0, instances=instances)


def test_the_earliest_request_runs_first_so_chunked_requests_finish_in_arrival_order(toy_runs, clock):
    order = []

    def run_and_record(feeds):
        order.append(int(feeds["x"][0, 0]))
        return toy_runs(feeds)

    async def chunked_request(batcher, request: int, arrival: float) -> None:
        request_arrival.set(arrival)
        for _ in range(3):  # each chunk is queued when the previous one is done, like a long history
            await batcher.run(_feeds(request, 50), 1, 1)

    async def scenario(batcher):
        now = clock()
        await asyncio.gather(chunked_request(batcher, 1, now), chunked_request(batcher, 2, now + 0.001))

    _drive(scenario, run_and_record, clock, max_batch=1, max_wait_s=0)
    assert order == [1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("slots", [1, 2])
def test_runs_in_flight_never_exceed_the_run_slots(toy_runs, clock, slots):
    async def scenario(batcher):
        hold = toy_runs.hold(slots)
        requests = asyncio.gather(*(batcher.run(_feeds(value), 1, 1) for value in range(12)))
        await hold.started(slots)  # every slot runs a batch, and rows are still queued
        await _turns()
        active = toy_runs.active
        hold.release()
        await requests
        return active

    assert _drive(scenario, toy_runs, clock, slots=slots, max_batch=2, max_wait_s=0) == slots
    assert toy_runs.most_active == slots and sum(toy_runs.batches) == 12


def test_an_item_larger_than_max_batch_runs_in_parts(toy_runs, clock):
    feeds = {"x": np.arange(30, dtype=np.float32).reshape(10, 3), "k": np.ones(10, dtype=np.int64)}

    outputs = _drive(lambda batcher: batcher.run(feeds, 10, 1), toy_runs, clock, max_batch=4)
    np.testing.assert_array_equal(outputs["y"], feeds["x"] * 2)
    assert sorted(toy_runs.batches) == [2, 4, 4]


def _chain(value: float, chunks: int, cost_ms: int = 1) -> Chain:
    """A toy chain: each chunk's x is the y (2x) of the chunk before it."""
    return Chain([(_feeds(value, cost_ms), 1)] + [(_feeds(0, cost_ms), 1)] * (chunks - 1), "x", "y")


def test_a_chain_runs_its_chunks_in_order_on_a_run_slot_carrying_the_state(toy_runs, clock):
    async def scenario(batcher):
        return await asyncio.gather(batcher.run_chain(_chain(1, 4)), batcher.run(_feeds(7), 1, 1))

    chain_outputs, alone = _drive(scenario, toy_runs, clock, max_batch=8, max_wait_s=0)
    assert float(chain_outputs[-1]["y"][0, 0]) == 16  # 1, doubled by each of the 4 chunks in turn
    assert [sorted(outputs) for outputs in chain_outputs] == [["z"]] * 3 + [["y", "z"]]  # each state given on, once
    assert float(alone["y"][0, 0]) == 14
    assert toy_runs.batches == [1] * 5  # never batched with the other request's row
    assert set(toy_runs.threads) == {"onnx-run"}  # the chunks ran on the run slot, not on the event loop


@pytest.mark.parametrize(
    ("chunk_ms", "expected"),
    [
        (1, ["chain", "chain", "chain", "earlier"]),  # three chunks fit in one slice
        (2000 * CHAIN_SLICE_S, ["chain", "earlier", "chain", "chain"]),  # one chunk spends the slice
    ],
)
def test_a_chain_gives_its_slot_back_after_its_slice_to_an_earlier_request(toy_runs, clock, chunk_ms, expected):
    metrics = Metrics()
    order = []

    def run_and_record(feeds):
        order.append("chain" if feeds["k"][0] else "earlier")
        return toy_runs(feeds)

    async def scenario(batcher):
        now = clock()
        request_arrival.set(now)
        hold = toy_runs.hold()  # the chain's first chunk ends only once the earlier request is queued
        chain = asyncio.ensure_future(batcher.run_chain(_chain(1, 3, cost_ms=int(chunk_ms))))
        await hold.started()
        request_arrival.set(now - 1)  # a request that arrived before the chain's
        earlier = asyncio.ensure_future(batcher.run(_feeds(1, cost_ms=0), 1, 1))
        await _until_queued(metrics, 1)
        hold.release()
        await asyncio.gather(chain, earlier)

    _drive(scenario, run_and_record, clock, metrics=metrics, max_batch=8, max_wait_s=0)
    assert order == expected


def test_a_chain_stops_between_chunks_once_its_client_has_gone(toy_runs, clock):
    connected = threading.Event()
    connected.set()

    def run_then_leave(feeds):
        connected.clear()  # the client leaves while the first chunk runs
        return toy_runs(feeds)

    async def scenario(batcher):
        request_connected.set(connected.is_set)
        with pytest.raises(asyncio.CancelledError):
            await batcher.run_chain(_chain(1, 5))

    _drive(scenario, run_then_leave, clock, max_batch=8, max_wait_s=0)
    assert toy_runs.batches == [1]


def test_an_item_queued_before_its_instance_s_ceiling_fell_still_runs(toy_runs, clock):
    """A run out of device memory lowers the instance's row ceiling (`max_rows`) below an item already queued: that
    item runs alone (its run halves it again if it must), where the loop used to spin on it and hang the event loop.
    The scenario runs on a daemon thread, so that such a hang fails the test instead of the suite."""
    instance = Instance("cpu-0", CPU, toy_runs)

    async def scenario(batcher):
        hold = toy_runs.hold()
        first = asyncio.create_task(batcher.run(_feeds(1), 1, 1))
        await hold.started()
        feeds = {"x": np.arange(12, dtype=np.float32).reshape(4, 3), "k": np.ones(4, dtype=np.int64)}
        queued = asyncio.create_task(batcher.run(feeds, 4, 1))
        await _turns()
        instance.max_rows = 2  # as the halving of a run that ran out of memory sets it
        hold.release()
        await first
        return await queued

    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(_drive(scenario, None, clock, instances=[instance])))
    thread.daemon = True
    thread.start()
    thread.join(WATCHDOG_S)
    assert outcome, "the batcher never ran the item queued before its instance's ceiling fell"
    np.testing.assert_array_equal(outcome[0]["y"], np.arange(12, dtype=np.float32).reshape(4, 3) * 2)
    assert toy_runs.batches == [1, 4]
