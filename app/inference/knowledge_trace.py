"""Knowledge-trace inference around a DKVMN ONNX graph (numpy only).

Graph inputs: q, r [B,T] int64 (0 = padding), len [B] int64, mv_in [B,N,d_v] float32.
Outputs: p [B,T], corr_w [B,T,N], mastery [B,T+1,N], mv_out [B,N,d_v].

A history longer than the model's training sequence length is processed in consecutive chunks of
`seqlen` interactions, oldest first, each chunk starting from the value memory the previous chunk
ended with (`mv_out`). The published evaluation instead restarts every chunk from the initial memory;
for histories of at most `seqlen` interactions both are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

RunGraph = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Trace:
    """Per-step predictions [T], correlation weights [T,N], mastery [T+1,N], final memory [N,d_v]."""

    predictions: np.ndarray
    attention: np.ndarray
    mastery: np.ndarray
    memory: np.ndarray


def trace_history(
    run: RunGraph, init_memory: np.ndarray, seqlen: int, questions: np.ndarray, correct: np.ndarray
) -> Trace:
    """Run one student's history through the graph in chunks of `seqlen`, carrying the memory."""
    memory = init_memory[np.newaxis].astype(np.float32)
    predictions, attention, mastery = [], [], []
    for start in range(0, len(questions), seqlen):
        q = questions[start : start + seqlen].astype(np.int64)[np.newaxis]
        r = correct[start : start + seqlen].astype(np.int64)[np.newaxis]
        outputs = run({"q": q, "r": r, "len": np.array([q.shape[1]], dtype=np.int64), "mv_in": memory})
        predictions.append(outputs["p"][0])
        attention.append(outputs["corr_w"][0])
        mastery.append(outputs["mastery"][0] if start == 0 else outputs["mastery"][0, 1:])  # row 0 repeats
        memory = outputs["mv_out"]
    return Trace(np.concatenate(predictions), np.concatenate(attention), np.concatenate(mastery), memory[0])


def predict_next(run: RunGraph, memory: np.ndarray, next_questions: np.ndarray) -> np.ndarray:
    """P(correct) for each question after the history: one step per question from the final memory.

    The prediction at a step reads the memory before that step's write, so the response fed with it
    (0) does not matter.
    """
    count = len(next_questions)
    outputs = run(
        {
            "q": next_questions.astype(np.int64).reshape(count, 1),
            "r": np.zeros((count, 1), dtype=np.int64),
            "len": np.ones(count, dtype=np.int64),
            "mv_in": np.repeat(memory[np.newaxis], count, axis=0).astype(np.float32),
        }
    )
    return outputs["p"][:, 0]
