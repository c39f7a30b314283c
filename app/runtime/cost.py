"""What a run costs on one instance of a model: `fixed + per_step x length + per_cell x rows x length` seconds, fitted
by non-negative least squares over its runs (a CPU's cost grows with the cells, a GPU's barely with the rows)."""

from __future__ import annotations

DECAY = 0.9  # weight an older run keeps at each new run: about the last ten runs count
OUTLIER = 4.0  # a run counts as at most this many times its predicted cost
RIDGE = 1e-3  # pull toward the previous fit, relative to each coefficient's own weight in the fit


class CostModel:
    """Seconds per run, predicted from the runs observed so far (0 until the first). Plain floats: numpy's per-call
    overhead on 3x3 arrays would cost more on the event loop, after every run."""

    def __init__(self) -> None:
        # decayed sums of x x^T and x y over the runs, x = (1, length, cells)
        self._gram = [[0.0] * 3 for _ in range(3)]
        self._moments = [0.0] * 3
        self.coefficients = (0.0, 0.0, 0.0)  # fixed, per step, per cell (seconds)
        self.runs = 0

    @property
    def known(self) -> bool:
        return self.runs > 0

    def predict(self, rows: int, length: int) -> float:
        fixed, per_step, per_cell = self.coefficients
        return fixed + per_step * length + per_cell * rows * length

    def observe(self, rows: int, length: int, seconds: float) -> None:
        """Fit again with a run of `rows` x `length` that took `seconds` (at most OUTLIER x the prediction)."""
        predicted = self.predict(rows, length)
        if self.known and predicted > 0:
            seconds = min(seconds, OUTLIER * predicted)
        x = (1.0, float(length), float(rows * length))
        for i in range(3):
            self._moments[i] = DECAY * self._moments[i] + x[i] * seconds
            for j in range(3):
                self._gram[i][j] = DECAY * self._gram[i][j] + x[i] * x[j]
        self.runs += 1
        pull = [RIDGE * self._gram[i][i] + 1e-12 for i in range(3)]
        gram = [[self._gram[i][j] + (pull[i] if i == j else 0.0) for j in range(3)] for i in range(3)]
        moments = [self._moments[i] + pull[i] * self.coefficients[i] for i in range(3)]
        free = [0, 1, 2]  # non-negative: a coefficient that fits below 0 is left out and the rest fitted again
        solution: list[float] = []
        while free:
            solution = _solve([[gram[i][j] for j in free] for i in free], [moments[i] for i in free])
            if min(solution) >= 0:
                break
            free.pop(solution.index(min(solution)))
        fitted = dict(zip(free, solution, strict=False))  # none when every one fits below 0
        self.coefficients = tuple(fitted.get(index, 0.0) for index in range(3))

    def describe(self) -> dict[str, float]:
        """The fit, for GET /models: milliseconds per run and microseconds per step and per cell."""
        fixed, per_step, per_cell = self.coefficients
        return {"fixed_ms": fixed * 1e3, "per_step_us": per_step * 1e6, "per_cell_us": per_cell * 1e6}


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """x with matrix x = vector, by Gauss-Jordan elimination (the matrix is positive definite: no pivoting needed)."""
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    for i, pivot in enumerate(rows):
        pivot[:] = [value / pivot[i] for value in pivot]
        for row in rows:
            if row is not pivot:
                factor = row[i]
                row[:] = [value - factor * top for value, top in zip(row, pivot, strict=True)]
    return [row[-1] for row in rows]
