"""Adaptive micro-batching for one model, under a thread budget shared by all models.

- **Admission.** `admit(rows, cells)` reserves room for a request before any work is done. It raises
  `Overloaded` (429) at once past `max_queue` admitted rows, or when the admitted work could not be done
  before the request deadline: the batcher learns the seconds one padded cell (a row's step or token)
  costs from its own runs, and refuses a request when the admitted cells would take more than
  `DEADLINE_SHARE` of the deadline on the run slots. A request larger than the whole queue is still
  admitted when the model has nothing else admitted, so no valid request is refused forever.
  `reserve(body_bytes)` holds, while a large body is parsed, the room that a body of that size has needed
  (learned from the admissions of earlier large bodies), or refuses it (429) before any CPU is spent on it,
  so that a flood of large bodies is not parsed in full only to be refused at admission, taking the CPU
  from the admitted work.
- **Batching.** `run(feeds, rows, length)` queues rows of one sequence length and awaits their outputs;
  `run_all` queues several such items of one request at once (the pairs of a batch request, the k-th
  chunks of several histories), so that they can share runs. `keep` names the outputs a request reads: the
  others of each run are freed as soon as it is split (knowledge tracing's next-question rows read only `p`,
  not a copy of the memory each).
  When a run slot is free and this model has no run in flight, everything queued (up to `max_batch`
  rows) runs at once: no added latency when idle. While one of its runs is in flight (possible when
  `concurrent_runs` > 1), the next batch waits for `max_batch` rows or until its oldest row waited
  `max_wait`. Batches take the earliest request's item first, then the queued items closest to it in length, and
  skip any that would make more than half of the batch padding, or more padded cells (rows x length)
  than the model's `max_cells`. When other run slots are free, the queue is spread over them instead of
  filling one run.
- **Alone, inline.** When the server handles one request only and no run is in progress anywhere, a
  small batch (at most `INLINE_MAX_CELLS` cells, in its request's first `INLINE_WINDOW_S`, of a model whose
  small runs have taken at most `INLINE_MAX_RUN_S`; all the rows that request queued at once) runs on the
  event loop itself: no thread hand-off there and back, which on a busy machine costs more than the run.
  The loop is blocked for that one run; requests that arrive meanwhile wait in the socket buffers, then
  make the server not alone. When nothing is queued or running, such rows do not even enter the queue: the
  request's own task runs them at once, without waking the batching loop.
- **Chains.** `run_chain` runs a sequence cut into chunks, each chunk starting from the state the one
  before it ended with (knowledge tracing: a DKVMN history longer than `seqlen`). Its chunks run one after another
  on the run slot's thread, never batched with other items and without a turn of the event loop between
  them: under a flood the loop is busy refusing requests, and chunks that waited for it would miss their
  deadline. The thread checks between chunks that the request is still wanted (not cancelled, client
  connected).
- **Bounded cost.** An item of more than `max_batch` rows runs in parts, and a chain gives its run slot
  back after `CHAIN_SLICE_S` and queues its remaining chunks again (at its request's place: earliest
  first), so no request holds the model while others starve.
- **Cancellation.** A caller that is cancelled (deadline, client gone) cancels its futures; queued
  items whose future is done are dropped before they run. So are the items of a request whose client has
  closed its connection (`request_connected`, asked as a batch is taken), even before the event loop has
  processed the close.
- **Statistics.** `stats` (app/runtime/stats.py) counts the admitted requests that succeeded or failed, the
  queue waits, and each run with its rows and the time spent collating, running and splitting.
- **Thread budget.** `RunSlots` holds `concurrent_runs` executor threads and a semaphore; each ONNX
  run uses `intra_op_threads`, and the settings check that the product fits the CPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from app.core.errors import Overloaded
from app.core.metrics import Metrics
from app.core.request_context import request_arrival, request_body_bytes, request_connected
from app.runtime.collate import Feeds, collate, concatenate, split
from app.runtime.stats import ModelStats

MAX_PADDING_RATIO = 2.0  # padded cells may be at most twice the useful cells of a batch
DEADLINE_SHARE = 0.5  # admitted work must fit in this share of the deadline (the rest: parsing, decoding, noise)
COST_SMOOTHING = 0.2  # weight of the newest run in the moving averages of cost per cell and row length
MIN_CELLS_TO_LEARN = 256  # smaller runs (unless max_cells is smaller) cost mostly their fixed overhead
INLINE_MAX_CELLS = 256  # largest run (rows x length) done on the event loop when the request is alone
INLINE_WINDOW_S = 0.02  # only in a request's first 20 ms: a long chunked history soon goes through the queue
INLINE_MAX_RUN_S = 0.015  # and only for a model whose small runs take at most this long (learned from its runs)
WALL_COST_TTL_S = 5.0  # the wall time per cell counts this long after the batch it was learned from
CHAIN_SLICE_S = 0.05  # a chain runs chunks for about this long, then queues its remaining chunks again
RESERVE_SHARE = 0.5  # a body being parsed holds half the rows and cells that its size predicts: a low guess
RunGraph = Callable[[Feeds], Feeds]
Clock = Callable[[], float]  # seconds, on the clock of `request_arrival` (time.perf_counter)


@dataclass(frozen=True)
class BatchConfig:
    """Per-model batching limits (settings, overridden by the manifest's `batching`)."""

    max_batch: int
    max_wait_s: float
    max_queue: int
    deadline_s: float
    max_cells: int | None = None  # padded rows x length per run (TEI's max_batch_tokens); None: rows only


class RunSlots:
    """At most `runs` ONNX runs at once over all models, each on its own executor thread."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.semaphore = asyncio.Semaphore(runs)
        self.executor = ThreadPoolExecutor(max_workers=runs, thread_name_prefix="onnx-run")

    @property
    def free(self) -> int:
        """Run slots not taken right now."""
        return self.semaphore._value

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


@dataclass(eq=False)
class Chain:
    """The chunks of one sequence and the outputs of those run so far. Each chunk's `state_input` is the
    `state_output` of the chunk before it (the first chunk's feeds hold the initial state)."""

    chunks: Sequence[tuple[Feeds, int]]  # (feeds of one row, its length), never modified
    state_input: str
    state_output: str
    outputs: list[Feeds] = field(default_factory=list)

    def run(
        self, run_graph: RunGraph, wanted: Callable[[], bool], budget_s: float, clock: Clock = time.perf_counter
    ) -> None:
        """Run chunks in order until all are done, `budget_s` has passed on `clock`, or the request is no longer
        `wanted`."""
        started = clock()
        while not self.done and wanted():
            feeds, _ = self.chunks[len(self.outputs)]
            if self.outputs:
                feeds = {**feeds, self.state_input: self.outputs[-1][self.state_output]}
            self.outputs.append(run_graph(feeds))
            if clock() - started >= budget_s:
                return

    @property
    def done(self) -> bool:
        return len(self.outputs) == len(self.chunks)

    @property
    def cells(self) -> int:
        """The steps of the chunks still to run (one row each)."""
        return sum(length for _, length in self.chunks[len(self.outputs) :])


@dataclass(eq=False)
class _Item:
    feeds: Feeds
    rows: int
    length: int
    enqueued: float
    arrival: float  # when its request arrived: the earliest request's rows run first
    future: asyncio.Future[Feeds] = field(repr=False)
    connected: Callable[[], bool] | None = field(default=None, repr=False)  # is its client still there?
    chain: Chain | None = field(default=None, repr=False)  # run alone, chunk after chunk (see "Chains")
    keep: frozenset[str] | None = None  # the outputs its request reads (None: all); the others are dropped at once
    waiting: bool = True  # in the queue (or about to run inline), its wait not yet in mnemo_queue_wait_seconds

    def wanted(self) -> bool:
        """From any thread: its request still waits for it (not cancelled, client connected)."""
        return not self.future.done() and (self.connected is None or self.connected())

    def abandoned(self) -> bool:
        """True when its client has gone: its future is cancelled, so that its request stops too."""
        if self.connected is None or self.connected():
            return False
        self.future.cancel()
        return True


def _smoothed(average: float | None, sample: float) -> float:
    """The moving average (weight COST_SMOOTHING for the newest sample); the sample itself before any (None, 0)."""
    return sample if not average else average + COST_SMOOTHING * (sample - average)


def _kept(outputs: Feeds, keep: frozenset[str] | None) -> Feeds:
    """An item's outputs as its request reads them: all, or only those it keeps."""
    return outputs if keep is None else {name: outputs[name] for name in keep}


def _padded_cells(batch: list[_Item]) -> int:
    """Rows x the longest length: the cells one run of this batch computes."""
    return sum(item.rows for item in batch) * max(item.length for item in batch)


class ModelBatcher:
    """The queue and batching loop of one model."""

    def __init__(
        self,
        name: str,
        run_graph: RunGraph,
        sequence_inputs: Sequence[str],
        sequence_outputs: Mapping[str, int],
        slots: RunSlots,
        config: BatchConfig,
        metrics: Metrics,
        alone: Callable[[], bool] = lambda: False,
        clock: Clock = time.perf_counter,
    ) -> None:
        """`alone()` tells whether the server is handling a single request (see "Alone, inline"). `clock` is
        the time source of every wait, age and cost the batcher measures; the timeout of its wait for a fuller
        batch is an event-loop timer, so a test that passes a manual clock runs the loop on it too."""
        self.name = name
        self._clock = clock
        self.config = config
        self._run_graph = run_graph
        self._sequence_inputs = tuple(sequence_inputs)
        self._sequence_outputs = dict(sequence_outputs)
        self._slots = slots
        self._metrics = metrics
        # this model's series, bound once: a labels() lookup per row would cost more than the batching saves
        self._admitted_gauge = metrics.admitted_rows.labels(name)
        self._queue_depth = metrics.queue_depth.labels(name)
        self._queue_wait = metrics.queue_wait.labels(name)
        self._batch_size = metrics.batch_size.labels(name)
        self._alone = alone
        self.stats = ModelStats()
        self._queue: list[_Item] = []
        self._admitted_rows = 0
        self._admitted_cells = 0.0
        self._cell_seconds = 0.0  # moving average of one padded cell's run time (0 until the first run)
        self._wall_cell_seconds = 0.0  # moving average of the wall time per cell between batches done while busy
        self._last_done: float | None = None  # when the last batch finished, while requests stayed admitted
        self._wall_learned_at = -math.inf
        self._typical_length = 1.0  # moving average of the rows' lengths, for requests that give no cells
        self._rows_per_byte = 0.0  # moving averages over admitted large bodies (`request_body_bytes`)
        self._cells_per_byte = 0.0
        self._small_run_seconds: float | None = None  # moving average of runs of at most INLINE_MAX_CELLS cells
        self._in_flight = 0
        self.runs_done = 0
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._runs: set[asyncio.Task] = set()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        """Stop batching; queued items are cancelled, runs in progress finish."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        self._stop_waiting(self._queue)
        for item in self._queue:
            item.future.cancel()
        self._queue.clear()
        if self._runs:
            await asyncio.wait(self._runs)

    @property
    def busy(self) -> bool:
        """True while any request holds rows of this model."""
        return self._admitted_rows > 0

    # -- admission ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def admit(self, rows: int, cells: float | None = None) -> Iterator[None]:
        """Hold room for `rows` rows (`cells` padded steps or tokens) while the request is handled, or 429 at once."""
        cells = rows * self._typical_length if cells is None else cells
        arrival = request_arrival.get()
        started = time.perf_counter() if arrival is None else arrival
        try:
            with self._holding(rows, cells):
                self._learn_body_size(rows, cells)
                yield
        except BaseException:
            self.stats.request_done(time.perf_counter() - started, succeeded=False)
            raise
        self.stats.request_done(time.perf_counter() - started, succeeded=True)

    @contextlib.contextmanager
    def reserve(self, body_bytes: int) -> Iterator[None]:
        """Hold the room a body of `body_bytes` bytes is expected to need while it is parsed, or 429 at once."""
        rows = max(1, int(body_bytes * self._rows_per_byte * RESERVE_SHARE))
        cells = max(1.0, body_bytes * self._cells_per_byte * RESERVE_SHARE)
        with self._holding(rows, cells, refused_as="before_parsing"):
            yield

    @contextlib.contextmanager
    def _holding(self, rows: int, cells: float, refused_as: str | None = None) -> Iterator[None]:
        """Count `rows` and `cells` as admitted while the block runs, or 429 at once when they do not fit
        (`refused_as`: the metric's reason label, else the refusal's own)."""
        refusal = self._refusal(rows, cells)
        if refusal is not None:
            reason, why = refusal
            self._refuse(refused_as or reason, why)
        self._admitted_rows += rows
        self._admitted_cells += cells
        self._admitted_gauge.set(self._admitted_rows)
        try:
            yield
        finally:
            self._admitted_rows -= rows
            self._admitted_cells -= cells
            self._admitted_gauge.set(self._admitted_rows)
            if not self._admitted_rows:
                self._last_done = None  # idle: the next gap between batches would count the idle time

    def _learn_body_size(self, rows: int, cells: float) -> None:
        """Update the rows and cells per body byte from an admitted request whose large body was parsed."""
        size = request_body_bytes.get()
        if size:
            self._rows_per_byte = _smoothed(self._rows_per_byte, rows / size)
            self._cells_per_byte = _smoothed(self._cells_per_byte, cells / size)

    def _refusal(self, rows: int, cells: float) -> tuple[str, str] | None:
        """Why a request of `rows` rows and `cells` cells cannot be admitted now (reason, text), or None."""
        if not self._admitted_rows:
            return None
        if self._admitted_rows + rows > self.config.max_queue:
            return "queue_full", f"{self._admitted_rows} of {self.config.max_queue} rows admitted, MNEMO_MAX_QUEUE"
        seconds_per_cell = self._cell_seconds / self._slots.runs
        if self._clock() - self._wall_learned_at < WALL_COST_TTL_S:  # a past overload says nothing of now
            seconds_per_cell = max(seconds_per_cell, self._wall_cell_seconds)
        backlog_s = (self._admitted_cells + cells) * seconds_per_cell
        if backlog_s > DEADLINE_SHARE * self.config.deadline_s:
            return "deadline", f"the admitted work needs about {backlog_s:.1f} s, past the deadline"
        return None

    def _refuse(self, reason: str, why: str) -> None:
        self._metrics.rejected.labels(self.name, reason).inc()
        raise Overloaded(f"Model {self.name} is at capacity ({why}); retry after the Retry-After delay.")

    # -- submission --------------------------------------------------------------------------------
    async def run(self, feeds: Feeds, rows: int, length: int, keep: Collection[str] | None = None) -> Feeds:
        """Outputs for `rows` rows of one sequence length, run in batches with other requests' rows; with `keep`,
        only those outputs (the others of each run are freed as soon as it is split)."""
        (outputs,) = await self.run_all([(feeds, rows, length)], keep)
        return outputs

    async def run_all(
        self, requests: Sequence[tuple[Feeds, int, int]], keep: Collection[str] | None = None
    ) -> list[Feeds]:
        """Outputs of several `(feeds, rows, length)` at once: queued together, so that they can share runs."""
        kept = None if keep is None else frozenset(keep)
        parts = [self._parts(*request, kept) for request in requests]
        items = [item for request_parts in parts for item in request_parts]
        if len(items) == 1 and not self._queue and not self._in_flight and self._may_run_inline(items, slots_held=0):
            await self._slots.semaphore.acquire()  # every slot is free: no wait, no turn of the event loop
            self._in_flight += 1
            await self._run_batch(items, inline=True)
        else:
            self._enqueue(items)
        try:
            outputs = [await item.future for item in items]
        except BaseException:  # cancelled (deadline, client gone) or failed: the other rows are not wanted
            self._stop_waiting(items)
            for item in items:
                item.future.cancel()
            raise
        done = iter(outputs)
        return [concatenate([next(done) for _ in request_parts]) for request_parts in parts]

    async def run_chain(self, chain: Chain) -> list[Feeds]:
        """The outputs of each chunk of `chain` (one row each), run as described under "Chains"."""
        item = self._item({}, 1, chain.cells, chain)
        self._enqueue([item])
        try:
            return await item.future
        except BaseException:
            self._stop_waiting([item])
            item.future.cancel()
            raise

    def _enqueue(self, items: list[_Item]) -> None:
        """Put items in the queue and wake the batching loop."""
        self._queue.extend(items)
        self._queue_depth.inc(sum(item.rows for item in items))
        self._wakeup.set()

    def _parts(self, feeds: Feeds, rows: int, length: int, keep: frozenset[str] | None = None) -> list[_Item]:
        """Queue items for `rows` rows: one, or parts of at most `max_batch` rows (so no run exceeds it)."""
        self._typical_length = _smoothed(self._typical_length, length)
        size = self.config.max_batch
        return [
            self._item(
                {name: value[start : start + size] for name, value in feeds.items()} if rows > size else feeds,
                min(size, rows - start),
                length,
                keep=keep,
            )
            for start in range(0, rows, size)
        ]

    def _item(
        self,
        feeds: Feeds,
        rows: int,
        length: int,
        chain: Chain | None = None,
        keep: frozenset[str] | None = None,
    ) -> _Item:
        """A queue item of the current request (its arrival and its client's connection)."""
        now, arrival = self._clock(), request_arrival.get()
        future = asyncio.get_running_loop().create_future()
        arrived = now if arrival is None else arrival
        return _Item(feeds, rows, length, now, arrived, future, request_connected.get(), chain, keep)

    # -- the loop ----------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self._drop_cancelled()
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._in_flight:
                await self._fill()
            await self._slots.semaphore.acquire()
            batch = self._take()
            if not batch:
                self._slots.semaphore.release()
                continue
            self._in_flight += 1
            if self._may_run_inline(batch, slots_held=1):
                await self._run_batch(batch, inline=True)
                continue
            task = asyncio.create_task(self._run_batch(batch))
            self._runs.add(task)
            task.add_done_callback(self._runs.discard)

    async def _fill(self) -> None:
        """While a run is in flight: wait for a full batch, or until the oldest row waited max_wait."""
        while self._in_flight and self._queue and self._queued_rows() < self.config.max_batch:
            remaining = self._queue[0].enqueued + self.config.max_wait_s - self._clock()
            if remaining <= 0:
                return
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            self._drop_cancelled()

    def _queued_rows(self) -> int:
        return sum(item.rows for item in self._queue)

    def _drop_cancelled(self) -> None:
        live = [item for item in self._queue if not item.future.done()]
        dropped = sum(item.rows for item in self._queue) - sum(item.rows for item in live)
        if dropped:
            self._queue_depth.dec(dropped)
        self._queue = live

    def _take(self) -> list[_Item]:
        """The item of the earliest request, then the queued items nearest to it in length, within the limits.

        Serving the earliest request first (rather than the oldest queued row) finishes a chunked request
        before later ones, instead of advancing all of them together until all miss their deadlines.

        Called with a run slot taken: `self._slots.free` more could start at once.
        """
        self._drop_cancelled()
        if not self._queue:
            return []
        head = min(self._queue, key=lambda item: item.arrival)
        if head.chain is not None:
            self._queue.remove(head)
            self._queue_depth.dec()
            return [] if head.abandoned() else [head]
        # With other slots free, spread the queue over them rather than fill one run and leave them idle.
        limit = min(self.config.max_batch, math.ceil(self._queued_rows() / (self._slots.free + 1)))
        batch, rows, longest, useful = [head], head.rows, head.length, head.rows * head.length
        others = (item for item in self._queue if item is not head and item.chain is None)
        for item in sorted(others, key=lambda item: (abs(item.length - head.length), item.arrival)):
            if rows + item.rows > limit:
                continue
            new_longest = max(longest, item.length)
            new_useful = useful + item.rows * item.length
            if (rows + item.rows) * new_longest > MAX_PADDING_RATIO * new_useful:
                continue
            if self.config.max_cells is not None and (rows + item.rows) * new_longest > self.config.max_cells:
                continue
            batch.append(item)
            rows, longest, useful = rows + item.rows, new_longest, new_useful
        chosen = {id(item) for item in batch}
        self._queue = [item for item in self._queue if id(item) not in chosen]
        self._queue_depth.dec(rows)
        return [item for item in batch if not item.abandoned()]

    def _may_run_inline(self, batch: list[_Item], slots_held: int) -> bool:
        """See "Alone, inline" (`slots_held`: 1 when this batch's run slot is already taken)."""
        return (
            _padded_cells(batch) <= INLINE_MAX_CELLS
            and self._small_run_seconds is not None
            and self._small_run_seconds <= INLINE_MAX_RUN_S
            and self._clock() - min(item.arrival for item in batch) < INLINE_WINDOW_S
            and self._slots.free == self._slots.runs - slots_held  # no other run in progress, for any model
            and self._alone()
        )

    def _stop_waiting(self, items: Iterable[_Item]) -> None:
        """Observe the wait of each item that leaves the queue: to run, or given up (deadline, client gone,
        shutdown). Under overload the waits given up are the longest ones; left out, the histogram would show
        only the survivors'."""
        now = self._clock()
        for item in items:
            if item.waiting:
                item.waiting = False
                self._queue_wait.observe(now - item.enqueued)
                self.stats.waited(now - item.enqueued)

    async def _run_batch(self, batch: list[_Item], inline: bool = False) -> None:
        """Run a batch on a run-slot thread, or on the event loop itself when `inline`."""
        self._stop_waiting(batch)
        loop = asyncio.get_running_loop()
        try:
            try:
                if inline:
                    results, seconds, cells = self._execute(batch)
                else:
                    results, seconds, cells = await loop.run_in_executor(self._slots.executor, self._execute, batch)
                outcomes: list[Feeds | BaseException] = list(results)
                self._learn_cost(cells, seconds)
            except Exception as error:
                outcomes = [error] if len(batch) == 1 else await self._isolate(batch)
            for item, outcome in zip(batch, outcomes, strict=True):
                if item.future.done() or (item.chain is not None and self._requeued(item, outcome)):
                    continue
                if isinstance(outcome, BaseException):
                    item.future.set_exception(outcome)
                else:
                    item.future.set_result(outcome)
        finally:
            self._slots.semaphore.release()
            self._in_flight -= 1
            self.runs_done += 1
            if self._queue:  # the loop waits on the queue only: an empty one has nothing for it to do
                self._wakeup.set()

    def _requeued(self, item: _Item, outcome: Feeds | BaseException) -> bool:
        """True when a chain stopped before its last chunk: queued again for the rest, or cancelled when its
        client has gone (a chain that stopped because its request was cancelled has a done future)."""
        if isinstance(outcome, BaseException) or item.chain.done:
            return False
        if not item.abandoned():
            item.length, item.enqueued, item.waiting = item.chain.cells, self._clock(), True
            self._enqueue([item])
        return True

    def _learn_cost(self, cells: int, seconds: float) -> None:
        """Update the moving averages of one padded cell's run time and of its wall time while busy (from
        large runs), and of a small run's time, from a batch of `cells` padded cells just finished.

        The wall time per cell is the time since the previous batch finished, divided by this batch's cells,
        while requests stayed admitted in between: what the model really gets through, hand-offs, parsing and
        a crowded event loop included. Admission uses the slower of the two, so that an overloaded server
        admits only the work it can finish before the deadline; the wall time only for WALL_COST_TTL_S after
        its last sample, so that a past overload does not refuse the next burst, and it restarts from its
        next sample after that."""
        now, last_done = self._clock(), self._last_done
        self._last_done = now
        if cells <= INLINE_MAX_CELLS:
            self._small_run_seconds = _smoothed(self._small_run_seconds, seconds)
        if cells < min(MIN_CELLS_TO_LEARN, self.config.max_cells or MIN_CELLS_TO_LEARN):
            return
        self._cell_seconds = _smoothed(self._cell_seconds, seconds / cells)
        if last_done is not None:
            recent = now - self._wall_learned_at < WALL_COST_TTL_S
            self._wall_cell_seconds = _smoothed(self._wall_cell_seconds if recent else None, (now - last_done) / cells)
            self._wall_learned_at = now

    def _run_chunk(self, feeds: Feeds) -> Feeds:
        """One run of a chain's chunk (one row), counted in the batch-size metric like any run."""
        started = time.perf_counter()
        outputs = self._run_graph(feeds)
        self.stats.executed(1, 0.0, time.perf_counter() - started, 0.0)
        self._batch_size.observe(1)
        return outputs

    async def _isolate(self, batch: list[_Item]) -> list[Feeds | BaseException]:
        """A failed batch is rerun item by item, so one bad input fails only its own request."""
        loop = asyncio.get_running_loop()
        outcomes: list[Feeds | BaseException] = []
        for item in batch:
            try:
                outcomes += (await loop.run_in_executor(self._slots.executor, self._execute, [item]))[0]
            except Exception as error:
                outcomes.append(error)
        return outcomes

    def _execute(self, batch: list[_Item]) -> tuple[list, float, int]:
        """Collate, run and split (on an executor thread), or run a chain's next chunks; also the seconds of the
        runs themselves and the padded cells they computed, for the cost per cell (not the wait for the thread,
        which under load would make the model look slower than it is)."""
        chain = batch[0].chain
        if chain is not None:
            cells = chain.cells
            started = self._clock()
            chain.run(self._run_chunk, batch[0].wanted, CHAIN_SLICE_S, self._clock)
            return [chain.outputs], self._clock() - started, cells - chain.cells
        collating = self._clock()
        feeds = collate([item.feeds for item in batch], self._sequence_inputs)
        started = self._clock()
        outputs = self._run_graph(feeds)
        finished = self._clock()
        rows = sum(item.rows for item in batch)
        self._batch_size.observe(rows)  # every completed run, `_isolate` reruns too
        parts = split(outputs, [(item.rows, item.length) for item in batch], self._sequence_outputs)
        kept = [_kept(part, item.keep) for part, item in zip(parts, batch, strict=True)]
        self.stats.executed(rows, started - collating, finished - started, self._clock() - finished)
        return kept, finished - started, _padded_cells(batch)
