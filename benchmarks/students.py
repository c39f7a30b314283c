"""Per-student appends: one answer costs the same at history 10 and 10,000 (HTTP, SQLite store, assist2009).

Each student is created with one POST of its whole starting history; then both get `APPENDS` single-answer
appends, alternating, each timed (read the state, one model step from the stored memory, compare-and-swap
write with SQLite's default synchronous=FULL, an fsync per append). For contrast: the stateless call a client
would otherwise make at history 10,000, asking only for the last mastery row.
`python -m benchmarks.students` prints these rows alone.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.common import p99, running_service, timings_ms
from benchmarks.table import Row, to_markdown

MODEL = "dkvmn-assist2009"
HISTORIES = (10, 10_000)
APPENDS = 200
WARMUP = 3
STATELESS_REPEATS = 10


def _interactions(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    questions, answers = rng.integers(1, 111, count), rng.integers(0, 2, count)
    return [{"question": int(q), "correct": bool(c)} for q, c in zip(questions, answers, strict=True)]


def _append_rows(client: httpx.Client) -> list[Row]:
    """Single-answer appends to the two students, alternating, so both see the same machine load."""
    for history in HISTORIES:
        body = {"model": MODEL, "interactions": _interactions(history, 1)}
        client.post(f"/students/bench-{history}/interactions", json=body).raise_for_status()
    answers = _interactions(WARMUP + APPENDS, 2)
    samples: dict[int, list[float]] = {history: [] for history in HISTORIES}
    for index, answer in enumerate(answers):
        for history in HISTORIES:
            started = time.perf_counter()
            body = {"model": MODEL, "interactions": [answer]}
            client.post(f"/students/bench-{history}/interactions", json=body).raise_for_status()
            if index >= WARMUP:
                samples[history].append((time.perf_counter() - started) * 1000)
    return [
        Row(
            MODEL,
            "POST /students/{id}/interactions",
            f"1 answer at history {history:,}, {APPENDS} sequential",
            float(np.median(samples[history])),
            p99(np.array(samples[history])),
            "SQLite, synchronous=FULL; alternating with the other history",
        )
        for history in HISTORIES
    ]


def _stateless_row(client: httpx.Client) -> Row:
    body = {
        "model": MODEL,
        "interactions": _interactions(HISTORIES[-1], 3),
        "next_questions": [],
        "return_attention": False,
        "return_predictions": False,
        "mastery": "last",
    }
    samples = timings_ms(lambda: client.post("/knowledge-trace", json=body).raise_for_status(), STATELESS_REPEATS, 1)
    return Row(
        MODEL,
        "POST /knowledge-trace",
        f"history {HISTORIES[-1]:,} resent, {STATELESS_REPEATS} sequential",
        float(np.median(samples)),
        p99(samples),
        "the stateless way to add one answer; last mastery row only",
    )


def rows() -> list[Row]:
    with tempfile.TemporaryDirectory() as directory:
        state_url = f"sqlite://{Path(directory) / 'students.db'}"
        with running_service(MNEMO_STATE_URL=state_url) as client:
            return [*_append_rows(client), _stateless_row(client)]


if __name__ == "__main__":
    print(to_markdown(rows()))
