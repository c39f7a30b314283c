"""Batches sized and routed by what runs cost: the cost model, the toy profiles, batch sizes, routing, results
and deadlines.

The toy graphs (tests/toy_profiles.py) run in real ONNX Runtime sessions; time is a manual clock that each run
advances by its profile's cost, so the batcher sees a flat (GPU-like) or linear (CPU-like) profile whatever the
machine's speed. Only `test_the_toy_graphs_have_their_profiles` times real runs, with wide margins.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from app.core.errors import Overloaded
from app.core.metrics import Metrics
from app.core.request_context import request_arrival
from app.runtime.batcher import BatchConfig, ModelBatcher
from app.runtime.instances import CPU, DECAY, CostModel, Instance, RunSlots
from app.runtime.model import GraphLayout
from tests.manual_clock import ManualClock, run_on_clock
from tests.toy_profiles import (
    WIDTH,
    ProfileRuns,
    build_flat_onnx,
    build_linear_onnx,
    flat_cost,
    linear_cost,
    session,
)

FLAT_S = 0.010  # a flat run: 10 ms whatever its rows
ROW_S = 0.002  # a linear run: 2 ms a row


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _x(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, WIDTH), value, dtype=np.float32)}


def _drive(scenario, instances: list[Instance], clock: ManualClock, slots: int = 1, **config):
    """Run `scenario(batcher)` on `clock` with a started batcher over `instances` (each with `slots` run slots of its
    own), then stop it."""
    settings = {"max_batch": 64, "max_wait_s": 0.0, "max_queue": 10_000, "deadline_s": 10.0, **config}

    async def main():
        for instance in instances:
            instance.slots = RunSlots(slots)
        batcher = ModelBatcher("toy", instances, GraphLayout(), BatchConfig(**settings), Metrics(), clock=clock)
        try:
            return await scenario(batcher)
        finally:
            await batcher.stop()
            for instance in instances:
                instance.slots.executor.shutdown()

    return run_on_clock(clock, main())


async def _queued_behind_a_run(batcher: ModelBatcher, requests: int) -> list[dict]:
    """One request, then `requests` more queued while its run is in flight (the clock stands still meanwhile: the
    first run advances it only once it has computed); the answers of the later ones."""
    first = asyncio.ensure_future(batcher.run(_x(0), 1, 1))
    await asyncio.sleep(0)  # the first request is taken before the others are queued
    rest = [asyncio.ensure_future(batcher.run(_x(value), 1, 1)) for value in range(1, requests + 1)]
    await first
    return await asyncio.gather(*rest)


# -- the cost model ----------------------------------------------------------------------------------
def test_the_cost_model_recovers_fixed_per_step_and_per_cell_costs():
    cost = CostModel()
    assert not cost.runs and cost.predict(32, 100) == 0
    for rows, length in ((1, 10), (8, 10), (1, 50), (16, 30), (4, 200)):
        cost.observe(rows, length, 0.004 + 2e-5 * length + 1e-6 * rows * length)
    assert cost.runs
    assert cost.predict(64, 200) == pytest.approx(0.004 + 2e-5 * 200 + 1e-6 * 64 * 200, rel=1e-3)
    assert Instance("cpu-0", CPU, dict, cost=cost).public_info()["cost"] == pytest.approx(
        {"fixed_ms": 4.0, "per_step_us": 20.0, "per_cell_us": 1.0}, rel=1e-3
    )


def test_the_cost_model_never_predicts_a_negative_cost():
    """A CPU graph whose runs cost more per row in large batches (caches) fits no negative fixed cost."""
    cost = CostModel()
    for rows in (1, 2, 8, 32, 1, 32):
        cost.observe(rows, 100, 1e-5 * rows**1.3 * 100)
    assert min(cost.coefficients) >= 0
    assert 0 < cost.predict(1, 100) < cost.predict(8, 100) < cost.predict(32, 100)


def test_coefficients_that_fit_below_0_are_left_out_and_the_rest_fitted_again():
    """Single rows whose runs get faster with length: per step and per cell both fit below 0, so the fixed cost alone
    fits the runs, the decayed mean of their seconds."""
    cost, runs = CostModel(), [(10, 0.002), (40, 0.001)] * 10
    for length, seconds in runs:
        cost.observe(1, length, seconds)
    weights = [DECAY**age for age in range(len(runs))][::-1]
    mean = sum(weight * seconds for weight, (_, seconds) in zip(weights, runs, strict=True)) / sum(weights)
    assert cost.coefficients[1:] == (0.0, 0.0)
    assert cost.coefficients[0] == pytest.approx(mean, rel=1e-3)


def test_the_cost_model_follows_the_recent_runs_but_not_a_single_outlier():
    cost = flat_cost(0.001)
    cost.observe(1, 1, 1.0)  # a run that waited for a CPU another process held
    assert cost.predict(1, 1) < 0.002
    for _ in range(40):
        cost.observe(1, 1, 0.1)
    assert cost.predict(1, 1) == pytest.approx(0.1, rel=0.05)


def test_the_toy_graphs_have_their_profiles(tmp_path):
    """Real runs, timed (the fastest of 7, least moved by other processes): the flat graph costs about the same at
    64 rows as at 1, the linear one many times more at 256 rows (about 40 times here: both margins are wide)."""

    def fastest_s(graph, rows: int) -> float:
        samples = []
        for _ in range(7):
            started = time.perf_counter()
            graph.run(None, _x(0.5, rows))
            samples.append(time.perf_counter() - started)
        return min(samples)

    flat, linear = session(build_flat_onnx(tmp_path / "flat.onnx")), session(build_linear_onnx(tmp_path / "l.onnx"))
    for graph in (flat, linear):
        graph.run(None, _x(0.5, 64))  # the first runs allocate
    assert fastest_s(flat, 64) < 2 * fastest_s(flat, 1)
    assert fastest_s(linear, 256) > 8 * fastest_s(linear, 1)


# -- batch sizes -------------------------------------------------------------------------------------
def test_the_flat_profile_takes_everything_queued_and_the_linear_one_runs_rows_apart(tmp_path, clock):
    flat = ProfileRuns(build_flat_onnx(tmp_path / "flat.onnx"), clock, lambda rows: FLAT_S)
    linear = ProfileRuns(build_linear_onnx(tmp_path / "linear.onnx"), clock, lambda rows: ROW_S * rows)
    _drive(lambda b: _queued_behind_a_run(b, 20), [Instance("cpu-0", CPU, flat, cost=flat_cost(FLAT_S))], clock)
    _drive(lambda b: _queued_behind_a_run(b, 20), [Instance("cpu-0", CPU, linear, cost=linear_cost(ROW_S))], clock)
    assert flat.batches == [1, 20]
    assert linear.batches == [1] * 21


@pytest.mark.parametrize(
    ("max_batch", "max_rows", "max_cells", "provider", "batches"),
    [
        (8, None, None, CPU, [1, 8, 8, 4]),  # max_batch: rows per run on any instance
        (64, 6, None, CPU, [1, 6, 6, 6, 2]),  # the instance's own ceiling (its device's memory)
        (64, None, 5, CPU, [1, 5, 5, 5, 5]),  # max_cells: a ceiling of CPU instances...
        (64, None, 5, "CUDAExecutionProvider", [1, 20]),  # ...not of the others
    ],
)
def test_the_ceilings_bound_a_flat_profile_s_batches(
    tmp_path, clock, max_batch, max_rows, max_cells, provider, batches
):
    runs = ProfileRuns(build_flat_onnx(tmp_path / "flat.onnx"), clock, lambda rows: FLAT_S)
    instance = Instance("gpu-0", provider, runs, cost=flat_cost(FLAT_S), max_rows=max_rows)
    _drive(lambda b: _queued_behind_a_run(b, 20), [instance], clock, max_batch=max_batch, max_cells=max_cells)
    assert runs.batches == batches


def test_a_batch_is_kept_short_enough_for_its_earliest_request_to_meet_its_deadline(tmp_path, clock):
    """A profile of 100 ms a run plus 100 ms a row, deadline 1 s: the earliest request, 0.45 s old, gets the 4 rows
    that keep its run within its deadline (0.1 + 4 x 0.1 = 0.5 s < 0.55 s); the other 3 run after it."""
    runs = ProfileRuns(build_flat_onnx(tmp_path / "flat.onnx"), clock, lambda rows: 0.1 + 0.1 * rows)
    cost = CostModel()
    for rows in (1, 4, 16):
        cost.observe(rows, 1, 0.1 + 0.1 * rows)

    async def scenario(batcher):
        request_arrival.set(clock() - 0.45)
        old = asyncio.ensure_future(batcher.run(_x(0), 1, 1))
        request_arrival.set(clock())
        await asyncio.gather(old, *(batcher.run(_x(value), 1, 1) for value in range(1, 7)))

    _drive(scenario, [Instance("cpu-0", CPU, runs, cost=cost)], clock, deadline_s=1.0)
    assert runs.batches == [4, 3]


# -- routing -----------------------------------------------------------------------------------------
def test_a_lone_request_goes_to_the_fast_small_run_and_a_flood_to_the_flat_profile(tmp_path, clock):
    """A GPU-like instance (10 ms a run) and a CPU-like one (2 ms a row): one request is done sooner on the CPU-like
    one, twenty together sooner on the GPU-like one (10 ms against 40 ms)."""
    gpu = ProfileRuns(build_flat_onnx(tmp_path / "flat.onnx"), clock, lambda rows: FLAT_S)
    cpu = ProfileRuns(build_flat_onnx(tmp_path / "flat.onnx"), clock, lambda rows: ROW_S * rows)
    instances = [
        Instance("cuda-0", "CUDAExecutionProvider", gpu, cost=flat_cost(FLAT_S)),
        Instance("cpu-1", CPU, cpu, cost=linear_cost(ROW_S)),
    ]

    async def scenario(batcher):
        await batcher.run(_x(0), 1, 1)  # alone
        await asyncio.gather(*(batcher.run(_x(value), 1, 1) for value in range(20)))  # queued at once

    _drive(scenario, instances, clock)
    assert cpu.batches[0] == 1 and gpu.batches == [20]


@pytest.mark.parametrize(("busy_rows", "expected"), [(1, "fast"), (40, "slow")])
def test_a_batch_goes_to_the_instance_predicted_to_finish_it_first(tmp_path, clock, busy_rows, expected):
    """Two CPU sessions, one four times slower. While the fast one runs a batch of `busy_rows` rows, a request
    waits for it when that run ends soon (1 row: 2 + 2 ms < 8 ms), else goes to the slow one (80 + 2 ms > 8 ms)."""
    path = build_linear_onnx(tmp_path / "linear.onnx")
    fast = ProfileRuns(path, clock, lambda rows: ROW_S * rows)
    slow = ProfileRuns(path, clock, lambda rows: 4 * ROW_S * rows)
    instances = [
        Instance("cpu-0", CPU, fast, cost=linear_cost(ROW_S)),
        Instance("cpu-1", CPU, slow, cost=linear_cost(4 * ROW_S)),
    ]
    gate = asyncio.Event()
    original = instances[0].run

    def gated(feeds):  # the fast instance's first run waits until the request under test is routed
        if not fast.batches and len(feeds["x"]) == busy_rows:
            asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(30)
        return original(feeds)

    instances[0].run = gated

    async def scenario(batcher):
        nonlocal loop
        loop = asyncio.get_running_loop()
        busy = asyncio.ensure_future(batcher.run(_x(0, busy_rows), busy_rows, 1))
        while not instances[0].slots.ends:
            await asyncio.sleep(0)
        routed = asyncio.ensure_future(batcher.run(_x(1), 1, 1))
        for _ in range(20):
            await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(busy, routed)

    loop = None
    _drive(scenario, instances, clock)
    assert (fast.batches == [busy_rows, 1]) is (expected == "fast")
    assert (slow.batches == [1]) is (expected == "slow")


# -- results -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("served_by", [["cpu-0"], ["cpu-1"], ["cpu-0", "cpu-1"]])
def test_results_never_depend_on_the_instance_or_the_batch(tmp_path, clock, served_by):
    """The linear graph's answer is a real computation: run in batches of up to 8 rows on either session, or on
    both, each row's answer is within 1e-6 of its run alone."""
    path = build_linear_onnx(tmp_path / "linear.onnx")
    rng = np.random.default_rng(0)
    inputs = [rng.normal(0, 1, (1, WIDTH)).astype(np.float32) for _ in range(24)]
    alone = [session(path).run(["y"], {"x": x})[0] for x in inputs]
    runs = {name: ProfileRuns(path, clock, lambda rows: FLAT_S) for name in served_by}
    instances = [Instance(name, CPU, run, cost=flat_cost(FLAT_S)) for name, run in runs.items()]

    async def scenario(batcher):
        return await asyncio.gather(*(batcher.run({"x": x}, 1, 1) for x in inputs))

    outputs = _drive(scenario, instances, clock, slots=2, max_batch=8)
    for single, batched in zip(alone, outputs, strict=True):
        np.testing.assert_allclose(batched["y"], single, atol=1e-6, rtol=0)
    assert max(rows for run in runs.values() for rows in run.batches) > 1  # rows ran together


# -- deadlines ---------------------------------------------------------------------------------------
def test_under_a_flood_admitted_requests_meet_their_deadline_and_the_rest_are_refused_at_once(tmp_path, clock):
    """400 requests, one every 1 ms, to a linear profile of 10 ms a row with a 1 s deadline (the runs move the clock
    too), after one request served alone (the pace is learned; the cautious start has its own test in
    test_batcher.py): each admitted one is answered within its deadline; the others are refused at arrival."""
    runs = ProfileRuns(build_linear_onnx(tmp_path / "linear.onnx"), clock, lambda rows: 0.01 * rows)
    instance = Instance("cpu-0", CPU, runs, cost=linear_cost(0.01))
    latencies, refused = [], []

    async def request(batcher, value: float) -> None:
        arrived = clock()
        request_arrival.set(arrived)
        try:
            with batcher.admit(1, 1):
                await batcher.run(_x(value), 1, 1)
        except Overloaded:
            refused.append(clock() - arrived)
            return
        latencies.append(clock() - arrived)

    async def scenario(batcher):
        await request(batcher, -1.0)
        latencies.clear()
        tasks = []
        for value in range(400):
            tasks.append(asyncio.ensure_future(request(batcher, value)))
            await asyncio.sleep(0)
            clock.advance(0.001)
        await asyncio.gather(*tasks)

    _drive(scenario, [instance], clock, deadline_s=1.0, max_batch=1)
    assert len(latencies) >= 20 and len(refused) >= 200
    assert max(refused) <= 0.01  # at arrival: at most a run that ended meanwhile on its thread moved the clock
    assert max(latencies) <= 1.0  # within the deadline
