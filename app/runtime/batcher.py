"""Micro-batching and admission for one model over its instances, sized and routed by what runs cost, and its
statistics (docs/engine.md: admission, batching, routing, inline runs, chains, cancellation)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from app.core.errors import Overloaded
from app.core.metrics import Metrics
from app.core.request_context import request_arrival, request_body_bytes, request_connected
from app.runtime.collate import Feeds, collate, concatenate, split
from app.runtime.instances import CPU, Instance, RunGraph
from app.runtime.model import GraphLayout

MIN_SAVING = 0.05  # an item joins a batch when that saves at least this share of what it would cost alone
DEADLINE_SHARE = 0.5  # a request must be predicted done within this share of its deadline
SMOOTHING = 0.2  # weight of the newest sample in the moving averages (row length, body sizes)
INLINE_WINDOW_S = 0.02  # a lone request runs inline only in its first 20 ms (a long history soon queues)
INLINE_MAX_RUN_S = 0.015  # and only a batch predicted to take at most this long
CHAIN_SLICE_S = 0.05  # a chain runs chunks for about this long, then queues its remaining chunks again
PHASES = ("compute_input", "compute_infer", "compute_output")  # collating the inputs, the run, splitting the outputs
Clock = Callable[[], float]  # seconds, on the clock of `request_arrival` (time.perf_counter)
Sample = tuple[int, int, float, float, float]  # a run's rows, padded length and the seconds of each of PHASES
Keep = Collection[str] | None  # the outputs a request reads (None: all); the others are dropped at once


@dataclass(frozen=True)
class BatchConfig:
    """Per-model batching limits (settings, overridden by the manifest's `batching`)."""

    max_batch: int  # rows per run, on any instance
    max_wait_s: float
    max_queue: int
    deadline_s: float
    max_cells: int | None = None  # padded rows x length per run on a CPU instance (TEI's max_batch_tokens)


@dataclass(eq=False)
class Chain:
    """The chunks of one sequence, run in order, each fed the `state_output` of the one before as its `state_input`."""

    chunks: Sequence[tuple[Feeds, int]]  # (feeds of one row, its length); the first's feeds hold the initial state
    state_input: str
    state_output: str
    outputs: list[Feeds] = field(default_factory=list)

    @property
    def remaining(self) -> Sequence[tuple[Feeds, int]]:
        return self.chunks[len(self.outputs) :]

    def next_chunk(self) -> tuple[Feeds, int]:
        """The next chunk's feeds, from the state the one before ended with, and its length."""
        feeds, length = self.remaining[0]
        return ({**feeds, self.state_input: self.outputs[-1].pop(self.state_output)} if self.outputs else feeds), length

    def run(self, run_graph: RunGraph, wanted: Callable[[], bool], budget_s: float, clock: Clock) -> list[Sample]:
        """Run chunks until all are done, `budget_s` has passed or the request is no longer `wanted`."""
        samples, started = [], clock()
        while self.remaining and wanted():
            feeds, length = self.next_chunk()
            run_started = clock()
            self.outputs.append(run_graph(feeds))
            samples.append((1, length, 0.0, clock() - run_started, 0.0))
            if clock() - started >= budget_s:
                break
        return samples


@dataclass(eq=False)
class _Item:
    feeds: Feeds
    rows: int
    length: int
    enqueued: float
    arrival: float  # when its request arrived: the earliest request's rows run first
    future: asyncio.Future[Feeds] = field(repr=False)
    connected: Callable[[], bool] | None = field(default=None, repr=False)  # is its client still there?
    chain: Chain | None = field(default=None, repr=False)
    keep: Keep = None
    waiting: bool = True  # its wait not yet in mnemo_queue_wait_seconds

    def wanted(self) -> bool:
        """From any thread: its request still waits for it (not cancelled, client connected)."""
        return not self.future.done() and (self.connected is None or self.connected())

    def abandoned(self) -> bool:
        """True when its client has gone: its future is cancelled, so that its request stops too."""
        if gone := self.connected is not None and not self.connected():
            self.future.cancel()
        return gone


_ROWS, _LENGTH, _ARRIVAL = attrgetter("rows"), attrgetter("length"), attrgetter("arrival")  # map() runs them in C


def _smoothed(average: float | None, sample: float) -> float:
    return sample if not average else average + SMOOTHING * (sample - average)


def _rows(batch: list[_Item]) -> int:
    return sum(map(_ROWS, batch))


def _predicted(instance: Instance, batch: list[_Item]) -> float:
    """Seconds `batch` is predicted to take on `instance` (a chain: its remaining chunks, one after another)."""
    if (chain := batch[0].chain) is not None:
        return sum(instance.cost.predict(1, length) for _, length in chain.remaining)
    return instance.cost.predict(_rows(batch), max(map(_LENGTH, batch)))


class ModelStats:
    """One model's counters in the shape of Triton's statistics extension, updated on the event loop: requests (a 429
    at admission is a failure), queue waits, and each run's rows and PHASES."""

    def __init__(self) -> None:
        self.inference = {name: {"count": 0, "ns": 0} for name in ("success", "fail", "queue")}
        self.runs: dict[int, list[int]] = {}  # by batch size: runs, then each phase's nanoseconds
        self.last_inference_ms = 0  # Unix time of the last run, in milliseconds (0: none yet)

    def add(self, name: str, seconds: float) -> None:
        """A request done (`success` or `fail`, from its arrival) or a queue item's wait (`queue`)."""
        self.inference[name]["count"] += 1
        self.inference[name]["ns"] += int(seconds * 1e9)

    def executed(self, rows: int, *phase_seconds: float) -> None:
        """A run of `rows` rows and the seconds of each of its PHASES."""
        self.last_inference_ms = int(time.time() * 1000)
        sums = self.runs.setdefault(rows, [0, 0, 0, 0])
        sums[0] += 1
        for phase, seconds in enumerate(phase_seconds, 1):
            sums[phase] += int(seconds * 1e9)

    def snapshot(self) -> dict[str, Any]:
        """The counters in the statistics extension's shape (less the model's name and version)."""
        totals = [sum(column) for column in zip(*self.runs.values(), strict=True)] or [0, 0, 0, 0]

        def phases(sums: list[int]) -> dict[str, dict[str, int]]:
            return {phase: {"count": sums[0], "ns": ns} for phase, ns in zip(PHASES, sums[1:], strict=True)}

        return {
            "last_inference": self.last_inference_ms,
            "inference_count": sum(size * sums[0] for size, sums in self.runs.items()),
            "execution_count": totals[0],
            "inference_stats": deepcopy(self.inference) | phases(totals),
            "batch_stats": [{"batch_size": size, **phases(sums)} for size, sums in sorted(self.runs.items())],
        }


class ModelBatcher:
    """The queue, batching loop and admission of one model, over its instances."""

    def __init__(
        self,
        name: str,
        instances: Sequence[Instance],
        layout: GraphLayout,
        config: BatchConfig,
        metrics: Metrics,
        alone: Callable[[], bool] = lambda: False,
        clock: Clock = time.perf_counter,
    ) -> None:
        """Start batching. `alone()`: the server handles a single request. `clock` times every wait and run (a test that
        passes a manual clock runs the event loop's timers on it too)."""
        self.name, self.instances, self.config = name, tuple(instances), config
        self._layout, self._metrics, self._alone, self._clock = layout, metrics, alone, clock
        # this model's series, bound once: a labels() lookup per row would cost more than the batching saves
        self._admitted_gauge = metrics.admitted_rows.labels(name)
        self._queue_depth = metrics.queue_depth.labels(name)
        self._queue_wait = metrics.queue_wait.labels(name)
        self._batch_size, self._inference = metrics.batch_size.labels(name), metrics.inference.labels(name)
        self._instance_runs = {i.name: metrics.instance_runs.labels(name, i.name) for i in self.instances}
        self._instance_rows = {i.name: metrics.instance_rows.labels(name, i.name) for i in self.instances}
        self.stats = ModelStats()
        self._queue: list[_Item] = []
        self.admitted_rows = 0  # rows of the requests admitted and not yet done
        self._admitted_seconds = 0.0  # what the admitted requests are predicted to take, one after another
        self._typical_length = 1.0  # moving average of the rows' lengths, for requests that give no cells
        self._rows_per_byte = self._cells_per_byte = 0.0  # moving averages over admitted large bodies
        self._wakeup = asyncio.Event()
        self._runs: set[asyncio.Task] = set()
        self._loop_task = asyncio.create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        """Stop batching; queued items are cancelled, runs in progress finish."""
        self._loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop_task
        for item in self._queue:  # their requests' _outcomes observe their waits
            item.future.cancel()
        self._queue_depth.dec(_rows(self._queue))
        self._queue.clear()
        if self._runs:
            await asyncio.wait(self._runs)

    # -- admission ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def admit(self, rows: int, cells: float | None = None) -> Iterator[None]:
        """Hold room for `rows` rows (`cells` padded steps or tokens) while the request is handled, or 429 at once;
        the request is counted in the statistics, refused or not."""
        cells = rows * self._typical_length if cells is None else cells
        started, succeeded = request_arrival.get() or time.perf_counter(), False
        try:
            with self._holding(rows, cells):
                if size := request_body_bytes.get():  # a large body, parsed: what its rows and cells per byte were
                    self._rows_per_byte = _smoothed(self._rows_per_byte, rows / size)
                    self._cells_per_byte = _smoothed(self._cells_per_byte, cells / size)
                yield
            succeeded = True
        finally:
            self.stats.add("success" if succeeded else "fail", time.perf_counter() - started)

    def reserve(self, body_bytes: int) -> contextlib.AbstractContextManager[None]:
        """Hold the room bodies of this size needed while one is parsed (one row until one was admitted), or 429."""
        rows = max(1, round(body_bytes * self._rows_per_byte))
        return self._holding(rows, body_bytes * self._cells_per_byte, parsing=True)

    @contextlib.contextmanager
    def _holding(self, rows: int, cells: float, parsing: bool = False) -> Iterator[None]:
        """Hold `rows` rows of `cells` cells while a request is handled (or its body `parsing`), or 429 at once: past
        max_queue rows, or not done within DEADLINE_SHARE of its deadline after the admitted work, as predicted."""
        now, admitted, budget = self._clock(), self.admitted_rows, DEADLINE_SHARE * self.config.deadline_s
        own, arrival = self._seconds_for(rows, cells), request_arrival.get()
        waited = 0.0 if arrival is None else max(0.0, now - arrival)
        needed = waited + (self._admitted_seconds + own if admitted else 0.0)
        full = admitted and admitted + rows > self.config.max_queue
        if full or (waited < self.config.deadline_s and needed > budget):
            allowed = f"{budget:g} s admission allows, {DEADLINE_SHARE:.0%} of MNEMO_REQUEST_TIMEOUT_S"
            late = f"it would need about {needed:.1f} s with the admitted work, over the {allowed}"
            text = f"{admitted} of {self.config.max_queue} rows admitted, MNEMO_MAX_QUEUE" if full else late
            reason = "before_parsing" if parsing else "queue_full" if full else "deadline"
            self._metrics.rejected.labels(self.name, reason).inc()
            raise Overloaded(f"Model {self.name} is at capacity ({text}); retry after the Retry-After delay.")
        self.admitted_rows += rows
        self._admitted_seconds += own
        self._admitted_gauge.set(self.admitted_rows)
        try:
            yield
        finally:
            self.admitted_rows -= rows
            self._admitted_seconds -= own
            self._admitted_gauge.set(self.admitted_rows)

    def _seconds_for(self, rows: int, cells: float) -> float:
        """Predicted seconds for `rows` rows of `cells` cells: each slot group at its best instance's rate."""
        length = max(1, round(cells / rows))
        rates: dict[int, float] = {}  # cells per second, per slot group
        for instance in self.instances:
            run_rows = min(self._row_ceiling(instance), rows)
            if instance.provider == CPU and self.config.max_cells:
                run_rows = max(1, min(run_rows, self.config.max_cells // length))
            seconds = instance.cost.predict(run_rows, length)
            rate = math.inf if seconds <= 0 else instance.slots.runs * run_rows * length / seconds
            rates[id(instance.slots)] = max(rates.get(id(instance.slots), 0.0), rate)
        return cells / sum(rates.values())

    # -- submission --------------------------------------------------------------------------------
    async def run(self, feeds: Feeds, rows: int, length: int, keep: Keep = None) -> Feeds:
        """Outputs for `rows` rows of one length, batched with other requests' rows; with `keep`, only those."""
        return (await self.run_all([(feeds, rows, length)], keep))[0]

    async def run_all(self, requests: Sequence[tuple[Feeds, int, int]], keep: Keep = None) -> list[Feeds]:
        """Outputs of several `(feeds, rows, length)` at once: queued together, so that they can share runs."""
        parts = [self._parts(*request) for request in requests]
        for _, _, length in requests:
            self._typical_length = _smoothed(self._typical_length, length)
        items = [item for request_parts in parts for item in request_parts]
        for item in items:
            item.keep = keep
        instance = self._route(items) if len(items) == 1 and not self._queue and not self._runs else None
        if instance is not None and self._may_run_inline(instance, items, slots_held=0):
            await self._run_batch(instance, items, inline=True)
        else:
            self._enqueue(items)
        done = iter(await self._outcomes(items))
        return [concatenate([next(done) for _ in request_parts]) for request_parts in parts]

    async def run_chain(self, chain: Chain) -> list[Feeds]:
        """The outputs of each chunk of `chain`, run on a run slot's thread in slices of CHAIN_SLICE_S."""
        items = self._parts({}, 1, 0, chain)  # a chain's length: its chunks'; the batch is the chain alone
        self._enqueue(items)
        return (await self._outcomes(items))[0]

    async def _outcomes(self, items: list[_Item]) -> list:
        """The outputs of `items`; cancelled (deadline, client gone) or failed, the others are not wanted."""
        try:
            return [await item.future for item in items]
        except BaseException:
            self._stop_waiting(items)
            for item in items:
                item.future.cancel()
            raise

    def _enqueue(self, items: list[_Item]) -> None:
        self._queue.extend(items)
        self._queue_depth.inc(_rows(items))
        self._wakeup.set()

    def _parts(self, feeds: Feeds, rows: int, length: int, chain: Chain | None = None) -> list[_Item]:
        """Items for `rows` rows of this request: one, or parts the instance of the highest row ceiling can run."""
        now, arrival, connected = self._clock(), request_arrival.get(), request_connected.get()
        size, future, items = max(map(self._row_ceiling, self.instances)), asyncio.get_running_loop().create_future, []
        for start in range(0, rows, size):
            part = {name: value[start : start + size] for name, value in feeds.items()} if rows > size else feeds
            items.append(_Item(part, min(size, rows - start), length, now, arrival or now, future(), connected, chain))
        return items

    # -- the loop ----------------------------------------------------------------------------------
    async def _loop(self) -> None:
        """A batch starts at once while no run is in flight, else once max_batch rows wait or one waited max_wait."""
        while True:
            self._drop_cancelled()
            filling = self._queue and self._runs and _rows(self._queue) < self.config.max_batch
            wait_s = self._queue[0].enqueued + self.config.max_wait_s - self._clock() if filling else None
            if not self._queue or (wait_s is not None and wait_s > 0):
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), wait_s)
                continue
            instance = self._route(self._queue)
            await instance.slots.acquire()
            self._drop_cancelled()  # while it waited for a slot
            taken = self._form(instance, self._queue, self._clock(), slot_held=True) if self._queue else []
            chosen = {id(item) for item in taken}
            self._queue = [item for item in self._queue if id(item) not in chosen]
            self._queue_depth.dec(_rows(taken))
            batch = [item for item in taken if not item.abandoned()]  # less the items of departed clients
            if not batch or self._may_run_inline(instance, batch, slots_held=1):
                instance.slots.release()
                if batch:
                    await self._run_batch(instance, batch, inline=True)
                continue
            self._runs.add(asyncio.create_task(self._run_batch(instance, batch)))

    def _drop_cancelled(self) -> None:
        live = [item for item in self._queue if not item.future.done()]
        self._queue_depth.dec(_rows(self._queue) - _rows(live))
        self._queue = live

    def _row_ceiling(self, instance: Instance) -> int:
        return min(self.config.max_batch, instance.max_rows or self.config.max_batch)

    def _route(self, queue: list[_Item]) -> Instance:
        """The instance predicted to finish the queue's next batch first (by the largest batch any would take now)."""
        if len(self.instances) == 1:
            return self.instances[0]
        now = self._clock()
        batches = [(instance, self._form(instance, queue, now)) for instance in self.instances]
        batches = [(instance, batch) for instance, batch in batches if batch]
        reference = max(_rows(batch) for _, batch in batches)
        finish = {i: i.slots.free_at(now) + math.ceil(reference / _rows(b)) * _predicted(i, b) for i, b in batches}
        return min(finish, key=finish.__getitem__)

    def _form(self, instance: Instance, queue: list[_Item], now: float, slot_held: bool = False) -> list[_Item]:
        """The batch `instance` would run now: the earliest request's item, then the nearest in length that save
        MIN_SAVING, within the ceilings, the head's deadline and a share of the queue per free slot. A head over its
        ceiling is left to an instance whose ceiling it fits, or runs alone where none has (a run ran out of memory)."""
        head = min(queue, key=lambda item: item.arrival)
        if head.chain is not None or head.rows > self._row_ceiling(instance):
            fits_another = head.rows <= max(map(self._row_ceiling, self.instances))
            return [] if head.chain is None and fits_another else [head]
        spare = instance.slots.free - (0 if slot_held else 1)
        limit = min(self._row_ceiling(instance), math.ceil(_rows(queue) / (max(0, spare) + 1)))
        max_cells = self.config.max_cells if instance.provider == CPU else None
        due = head.arrival + self.config.deadline_s - instance.slots.free_at(now)
        predict = instance.cost.predict
        batch, rows, longest = [head], head.rows, head.length
        together = predict(rows, longest)
        others = (item for item in queue if item is not head and item.chain is None)
        for item in sorted(others, key=lambda item: (abs(item.length - head.length), item.arrival)):
            new_rows, new_longest = rows + item.rows, max(longest, item.length)
            if new_rows > limit or (max_cells is not None and new_rows * new_longest > max_cells):
                continue
            alone, joined = predict(item.rows, item.length), predict(new_rows, new_longest)
            if together + alone - joined < MIN_SAVING * alone or (joined > due >= together):
                continue
            batch.append(item)
            rows, longest, together = new_rows, new_longest, joined
        return batch

    def _may_run_inline(self, instance: Instance, batch: list[_Item], slots_held: int) -> bool:
        """A lone request's small batch runs on the event loop when no other run holds its slots (but its own)."""
        return (
            instance.cost.runs > 0
            and _predicted(instance, batch) <= INLINE_MAX_RUN_S
            and self._clock() - min(map(_ARRIVAL, batch)) < INLINE_WINDOW_S
            and instance.slots.free == instance.slots.runs - slots_held
            and self._alone()
        )

    def _stop_waiting(self, items: Iterable[_Item]) -> None:
        """Observe the wait of each item that leaves the queue, to run or given up (the longest, under overload)."""
        now = self._clock()
        for item in items:
            if item.waiting:
                item.waiting = False
                self._queue_wait.observe(now - item.enqueued)
                self.stats.add("queue", now - item.enqueued)

    async def _run_batch(self, instance: Instance, batch: list[_Item], inline: bool = False) -> None:
        """Run a batch on a run-slot thread of `instance` (its predicted end in `slots.ends` meanwhile), or `inline` (it
        never yields to another task, so it holds no slot); count each run, teach it to the cost model, settle."""
        self._stop_waiting(batch)
        try:
            if inline:
                outcomes, samples = self._compute(instance, batch)
            else:
                end = self._clock() + _predicted(instance, batch)
                instance.slots.ends.append(end)
                try:
                    loop, executor = asyncio.get_running_loop(), instance.slots.executor
                    outcomes, samples = await loop.run_in_executor(executor, self._compute, instance, batch)
                finally:
                    instance.slots.ends.remove(end)
            for rows, length, *phases in samples:
                instance.cost.observe(rows, length, sum(phases))
                self.stats.executed(rows, *phases)
                self._batch_size.observe(rows)
                self._inference.observe(phases[1])
                self._instance_runs[instance.name].inc()
                self._instance_rows[instance.name].inc(rows)
            for item, outcome in zip(batch, outcomes, strict=True):
                if item.future.done():
                    continue
                if isinstance(outcome, BaseException):
                    item.future.set_exception(outcome)
                elif item.chain and item.chain.remaining:  # its slice ended: queued again, unless abandoned
                    if not item.abandoned():
                        item.enqueued, item.waiting = self._clock(), True
                        self._enqueue([item])
                else:
                    item.future.set_result(outcome)
        finally:
            if not inline:
                instance.slots.release()
                self._runs.discard(asyncio.current_task())
            if self._queue:  # the loop waits on the queue only: an empty one has nothing for it to do
                self._wakeup.set()

    def _compute(self, instance: Instance, batch: list[_Item]) -> tuple[list, list[Sample]]:
        """Collate, run and split, or run a chain's next chunks: each item's outputs (or error) and each run's `Sample`.
        A failed batch is rerun item by item, so that one bad input fails only its own request."""
        try:
            if (chain := batch[0].chain) is not None:
                return [chain.outputs], chain.run(instance.run, batch[0].wanted, CHAIN_SLICE_S, self._clock)
            collating = self._clock()
            feeds = collate([item.feeds for item in batch], self._layout.sequence_inputs)
            started = self._clock()
            outputs = instance.run(feeds)
            finished = self._clock()
            parts = split(outputs, batch, self._layout.sequence_outputs)
            rows, longest = _rows(batch), max(map(_LENGTH, batch))
            return parts, [(rows, longest, started - collating, finished - started, self._clock() - finished)]
        except Exception as error:
            if len(batch) == 1:
                return [error], []
        reruns = [self._compute(instance, [item]) for item in batch]
        return [outcome for (outcome,), _ in reruns], [sample for _, samples in reruns for sample in samples]
