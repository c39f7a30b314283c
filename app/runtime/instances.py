"""A model's instances (one session each, on one provider of `MNEMO_PROVIDER`), what their runs cost and the run slots
they run on; a batch their device cannot hold is halved (the session stays usable)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType

import onnxruntime as ort

from app.core.errors import ServiceError
from app.core.metrics import Metrics
from app.runtime.collate import Feeds, concatenate

CPU = "CPUExecutionProvider"
RunGraph = Callable[[Feeds], Feeds]
# What onnxruntime says when an allocation fails: its arena past its bound, or CUDA, cuBLAS or cuDNN out of memory
OOM_MESSAGES = ("Failed to allocate memory", "is smaller than requested bytes", "out of memory", "STATUS_ALLOC_FAILED")
DECAY = 0.9  # weight an older run keeps at each new run: about the last ten runs count
OUTLIER = 4.0  # a run counts as at most this many times its predicted cost
RIDGE = 1e-3  # pull toward the previous fit, relative to each coefficient's own weight in the fit


class CostModel:
    """Seconds per run, `fixed + per_step x length + per_cell x rows x length`, fitted by non-negative least squares
    over the runs observed so far (0 until the first); plain floats, as numpy's overhead on 3x3 would cost more."""

    def __init__(self) -> None:
        # decayed sums of x x^T and x y over the runs, x = (1, length, cells)
        self._gram = [[0.0] * 3 for _ in range(3)]
        self._moments = [0.0] * 3
        self.coefficients = (0.0, 0.0, 0.0)  # fixed, per step, per cell (seconds)
        self.runs = 0  # observed so far: none, the cost is not known

    def predict(self, rows: int, length: int) -> float:
        fixed, per_step, per_cell = self.coefficients
        return fixed + per_step * length + per_cell * rows * length

    def observe(self, rows: int, length: int, seconds: float) -> None:
        """Fit again with a run of `rows` x `length` that took `seconds` (at most OUTLIER x the prediction)."""
        predicted = self.predict(rows, length)
        if self.runs and predicted > 0:
            seconds = min(seconds, OUTLIER * predicted)
        x = (1.0, length, rows * length)
        for i in range(3):
            self._moments[i] = DECAY * self._moments[i] + x[i] * seconds
            for j in range(3):
                self._gram[i][j] = DECAY * self._gram[i][j] + x[i] * x[j]
        self.runs += 1
        self.coefficients = _fit(self._gram, self._moments, self.coefficients)


def _fit(gram: list[list[float]], moments: list[float], previous: tuple) -> tuple[float, float, float]:
    """The coefficients, pulled toward `previous`, by Cramer's rule (this runs on the event loop after every run);
    while one fits below 0, the most negative is left out (its row and column made the identity's), the rest refit."""
    (a, b, c), (_, d, e), (_, _, f) = gram
    (m0, m1, m2), (v0, v1, v2) = moments, previous
    pa, pd, pf = RIDGE * a + 1e-12, RIDGE * d + 1e-12, RIDGE * f + 1e-12
    a, d, f, y0, y1, y2 = a + pa, d + pd, f + pf, m0 + pa * v0, m1 + pd * v1, m2 + pf * v2
    while True:
        p, q, r = d * f - e * e, c * e - b * f, b * e - c * d  # the cofactors of the symmetric matrix
        s, t, u = a * f - c * c, b * c - a * e, a * d - b * b
        det = a * p + b * q + c * r
        x = ((p * y0 + q * y1 + r * y2) / det, (q * y0 + s * y1 + t * y2) / det, (r * y0 + t * y1 + u * y2) / det)
        if min(x) >= 0:
            return x
        left_out = x.index(min(x))
        if left_out == 0:
            a, b, c, y0 = 1.0, 0.0, 0.0, 0.0
        elif left_out == 1:
            b, d, e, y1 = 0.0, 1.0, 0.0, 0.0
        else:
            c, e, f, y2 = 0.0, 0.0, 1.0, 0.0


class RunSlots:
    """At most `runs` ONNX runs at once, each on its own executor thread. All CPU instances share one (the thread
    budget); any other has one of its own (a GPU runs one batch at once)."""

    def __init__(self, runs: int, name: str = "onnx-run") -> None:
        self.runs = self.free = runs  # free: slots not acquired (asyncio.Semaphore does not say)
        self.semaphore = asyncio.Semaphore(runs)
        self.executor = ThreadPoolExecutor(max_workers=runs, thread_name_prefix=name)
        self.ends: list[float] = []  # predicted end of each run in progress (the clock of its batcher)

    async def acquire(self) -> None:
        await self.semaphore.acquire()
        self.free -= 1

    def release(self) -> None:
        self.free += 1
        self.semaphore.release()

    def free_at(self, now: float) -> float:
        """When a slot is predicted to be free: now if one is."""
        return now if self.free or not self.ends else max(now, min(self.ends))


class DeviceOutOfMemory(ServiceError):
    """One row of the batch does not fit in the device's memory (or the arena's bound)."""

    status_code = 503
    headers = MappingProxyType({"Retry-After": "1"})


@dataclass(eq=False)
class Instance:
    """One session of a model: how to run it, where, and what its runs cost."""

    name: str  # unique within its model: its provider's short name and its place in MNEMO_PROVIDER (`cpu-1`)
    provider: str  # the onnxruntime provider
    run: RunGraph  # blocking: the batcher calls it on one of `slots`' threads
    slots: RunSlots | None = None  # set by ModelRegistry.serve
    cost: CostModel = field(default_factory=CostModel)
    max_rows: int | None = None  # rows per run at most (None: no own limit), lowered when one ran out of memory

    def public_info(self) -> dict:
        """For GET /models: the cost model's fit in milliseconds per run and microseconds per step and per cell."""
        fixed, per_step, per_cell = self.cost.coefficients
        cost = {"fixed_ms": fixed * 1e3, "per_step_us": per_step * 1e6, "per_cell_us": per_cell * 1e6}
        return {"name": self.name, "provider": self.provider, "max_rows": self.max_rows, "cost": cost}


def session_instance(name: str, session: ort.InferenceSession, model: str, metrics: Metrics) -> Instance:
    """An instance that runs `session`. A batch the device cannot hold is halved and each half run again
    (mnemo_oom_splits_total), down to one row (then 503); the batcher then forms no batch larger than what fitted."""
    output_names = [output.name for output in session.get_outputs()]
    on_split = metrics.oom_splits.labels(model).inc

    def run_graph(feeds: Feeds) -> Feeds:
        try:
            return dict(zip(output_names, session.run(output_names, feeds), strict=True))
        except Exception as error:
            rows = len(next(iter(feeds.values())))
            if not any(part in str(error) for part in OOM_MESSAGES):  # its exception classes differ by build
                raise
            if rows <= 1:
                raise DeviceOutOfMemory(
                    f"Model {model}: one row of this request does not fit in the device's memory; retry later "
                    "or send a shorter input."
                ) from error
        half = (rows + 1) // 2
        instance.max_rows = min(instance.max_rows or half, half)
        on_split()
        halves = (slice(None, half), slice(half, None))
        return concatenate([run_graph({key: value[part] for key, value in feeds.items()}) for part in halves])

    return (instance := Instance(name, session.get_providers()[0], run_graph))
