"""The chunking semantics of docs/STUDENTS.md, checked on the committed DKVMN model (assist2009).

The value memory is the DKVMN's only recurrent state, so feeding a history one interaction at a time,
carrying `mv_out` into the next call's `mv_in` through the state store, gives the same predictions as one
stateless call over the whole history (chunks of `seqlen`, app/inference/knowledge_trace.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from app.inference.knowledge_trace import RunGraph, Trace, trace_history
from app.students.factory import open_store
from app.students.store import StudentState
from app.students.update import NextState, update_state

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
MODEL = "dkvmn-assist2009"
HISTORY = 450  # more than two chunks of seqlen 200
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def committed_model() -> tuple[RunGraph, dict, np.ndarray]:
    entry = next(e for e in json.loads((ARTIFACTS / "manifest.json").read_text())["models"] if e["name"] == MODEL)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(ARTIFACTS / entry["file"]), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    init_memory = np.load(ARTIFACTS / entry["assets"]["init_memory"]["file"]).astype(np.float32)
    return run, entry, init_memory


def random_history(n_questions: int, length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, n_questions + 1, size=length), rng.integers(0, 2, size=length)


def test_one_by_one_through_the_store_equals_the_whole_history(
    committed_model: tuple[RunGraph, dict, np.ndarray], tmp_path: Path
) -> None:
    run, entry, init_memory = committed_model
    seqlen = entry["metadata"]["seqlen"]
    questions, correct = random_history(entry["metadata"]["n_questions"], HISTORY)
    whole = trace_history(run, init_memory, seqlen, questions, correct)

    store = open_store(f"sqlite://{tmp_path / 'students.db'}")
    predictions, last_mastery = [], None
    for step in range(HISTORY):

        def append(current: StudentState | None, step: int = step) -> NextState[Trace]:
            memory = init_memory if current is None else current.memory
            trace = trace_history(run, memory, seqlen, questions[step : step + 1], correct[step : step + 1])
            return NextState(trace.memory, step + 1, trace)

        stored, trace = update_state(store, MODEL, "student-1", entry["sha256"], append)
        predictions.append(trace.predictions[0])
        last_mastery = trace.mastery[-1]
    store.close()

    assert stored.interactions == HISTORY and whole.predictions.shape == (HISTORY,)
    assert np.max(np.abs(np.array(predictions) - whole.predictions)) < TOLERANCE
    assert np.max(np.abs(last_mastery - whole.mastery[-1])) < TOLERANCE
    assert np.max(np.abs(stored.memory - whole.memory)) < TOLERANCE


def test_any_chunk_sizes_equal_the_whole_history(committed_model: tuple[RunGraph, dict, np.ndarray]) -> None:
    """Appends of 1 to 37 interactions at a time: chunk boundaries never change a prediction."""
    run, entry, init_memory = committed_model
    seqlen = entry["metadata"]["seqlen"]
    questions, correct = random_history(entry["metadata"]["n_questions"], HISTORY, seed=1)
    whole = trace_history(run, init_memory, seqlen, questions, correct)
    sizes = np.random.default_rng(2).integers(1, 38, size=HISTORY)
    memory, predictions, start = init_memory, [], 0
    for size in sizes:
        if start >= HISTORY:
            break
        part = trace_history(run, memory, seqlen, questions[start : start + size], correct[start : start + size])
        predictions.append(part.predictions)
        memory, start = part.memory, start + size
    assert np.max(np.abs(np.concatenate(predictions) - whole.predictions)) < TOLERANCE


def test_the_comparison_notices_a_memory_that_is_not_carried(
    committed_model: tuple[RunGraph, dict, np.ndarray],
) -> None:
    """Restarting every chunk from the initial memory (the published evaluation) changes later predictions."""
    run, entry, init_memory = committed_model
    seqlen = entry["metadata"]["seqlen"]
    questions, correct = random_history(entry["metadata"]["n_questions"], HISTORY)
    whole = trace_history(run, init_memory, seqlen, questions, correct)
    restarted = np.concatenate(
        [
            trace_history(
                run, init_memory, seqlen, questions[start : start + seqlen], correct[start : start + seqlen]
            ).predictions
            for start in range(0, HISTORY, seqlen)
        ]
    )
    np.testing.assert_allclose(restarted[:seqlen], whole.predictions[:seqlen], atol=TOLERANCE)
    assert np.max(np.abs(restarted[seqlen:] - whole.predictions[seqlen:])) > 100 * TOLERANCE
