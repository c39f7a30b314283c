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

    def describe(self) -> dict[str, float]:
        """The fit, for GET /models: milliseconds per run and microseconds per step and per cell."""
        fixed, per_step, per_cell = self.coefficients
        return {"fixed_ms": fixed * 1e3, "per_step_us": per_step * 1e6, "per_cell_us": per_cell * 1e6}


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
