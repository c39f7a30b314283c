"""What a run costs on one instance of a model: `fixed + per_step x length + per_cell x rows x length` seconds.

A run of `rows` rows padded to `length` steps (or tokens) computes `rows x length` cells. On a CPU the cost grows
with the cells; on a GPU it barely moves with the rows and grows with the steps (each step is a sequence of small
kernels). The three coefficients are fitted by non-negative least squares over the instance's runs, each older
run's weight decaying by DECAY at every new one (a run far slower than predicted counts as OUTLIER times the
prediction), and pulled a little (RIDGE) toward the previous fit, so that runs of a single size still give a usable
estimate. The registry seeds it with warm-up runs at startup.
"""

from __future__ import annotations

import numpy as np

DECAY = 0.9  # weight an older run keeps at each new run: about the last ten runs count
OUTLIER = 4.0  # a run counts as at most this many times its predicted cost
RIDGE = 1e-3  # pull toward the previous fit, relative to each coefficient's own weight in the fit


class CostModel:
    """Seconds per run, predicted from the runs observed so far (0 until the first)."""

    def __init__(self) -> None:
        self._gram = np.zeros((3, 3))  # decayed sums of x x^T and x y over the runs, x = (1, length, cells)
        self._moments = np.zeros(3)
        self.coefficients = np.zeros(3)  # fixed, per step, per cell (seconds)
        self.runs = 0

    @property
    def known(self) -> bool:
        return self.runs > 0

    def predict(self, rows: int, length: int) -> float:
        fixed, per_step, per_cell = self.coefficients
        return float(fixed + per_step * length + per_cell * rows * length)

    def observe(self, rows: int, length: int, seconds: float) -> None:
        """Fit again with a run of `rows` rows of `length` steps that took `seconds` (at most OUTLIER times the
        prediction: a run that waited for a CPU taken by another process says nothing of its own cost)."""
        if self.known and self.predict(rows, length) > 0:
            seconds = min(seconds, OUTLIER * self.predict(rows, length))
        x = np.array([1.0, length, rows * length], dtype=float)
        self._gram = DECAY * self._gram + np.outer(x, x)
        self._moments = DECAY * self._moments + x * seconds
        self.runs += 1
        pull = RIDGE * np.diag(self._gram) + 1e-12
        gram, moments = self._gram + np.diag(pull), self._moments + pull * self.coefficients
        free = [0, 1, 2]  # non-negative: a coefficient that fits below 0 is left out and the rest fitted again
        while free:
            solution = np.linalg.solve(gram[np.ix_(free, free)], moments[free])
            if (solution >= 0).all():
                break
            free.pop(int(np.argmin(solution)))
        self.coefficients = np.zeros(3)
        if free:
            self.coefficients[free] = solution

    def describe(self) -> dict[str, float]:
        """The fit, for GET /models: milliseconds per run and microseconds per step and per cell."""
        fixed, per_step, per_cell = self.coefficients
        return {"fixed_ms": fixed * 1e3, "per_step_us": per_step * 1e6, "per_cell_us": per_cell * 1e6}
