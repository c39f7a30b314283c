"""Knowledge-tracing models over the Open Inference Protocol: the graph's own tensors (`q`, `r`, `len`, the optional
state in; `p`, the state, DKVMN's `corr_w`, `mastery` out), run by `service.trace_all`, so T may exceed `seqlen`."""

from __future__ import annotations

import numpy as np

from app.runtime.collate import Feeds, pad_rows
from app.runtime.model import Admission, ProtocolError, ServedModel, TensorSpec, onnx_spec
from app.tasks.knowledge_trace import service
from app.tasks.knowledge_trace.service import KnowledgeTraceState

PLATFORM = "onnxruntime_onnx"
Histories = tuple[list[service.History], int]  # each row's history without its padding, and the padded length T


def inputs(model: ServedModel) -> list[TensorSpec]:
    """The graph's inputs; the state (`mv_in`, `state_in`) may be left out."""
    return [onnx_spec(node, node.name == model.state.state_input) for node in model.session.get_inputs()]


def outputs(model: ServedModel) -> list[TensorSpec]:
    return [onnx_spec(node) for node in model.session.get_outputs()]


def prepare(model: ServedModel, tensors: dict[str, np.ndarray | None]) -> tuple[Admission, Histories]:
    """Check shapes against each other and values against the model (400 naming the input and element); the rows
    are the graph's, the cells the steps run (padding excluded), as POST /knowledge-trace counts its interactions."""
    state: KnowledgeTraceState = model.state
    state_input = state.state_input
    questions, answers, lengths, memory = (tensors[name] for name in ("q", "r", "len", state_input))
    batch, steps = questions.shape
    if batch == 0 or steps == 0:
        raise ProtocolError(f"input q has shape {list(questions.shape)}; it needs at least one row and one step")
    if answers.shape != questions.shape:
        raise ProtocolError(f"input r has shape {list(answers.shape)}; it must match q's {list(questions.shape)}")
    if lengths.shape != (batch,):
        raise ProtocolError(f"input len has shape {list(lengths.shape)}; it must be [{batch}], one per row of q")
    if memory is not None and memory.shape[0] != batch:
        raise ProtocolError(f"input {state_input} has {memory.shape[0]} rows; q has {batch}")
    if len(short := np.flatnonzero((lengths < 1) | (lengths > steps))):
        row = int(short[0])
        raise ProtocolError(f"input len[{row}] is {int(lengths[row])}; it must be within 1..{steps} (q's T)")
    if batch > state.max_histories:
        raise ProtocolError(
            f"input q has {batch} rows; model {model.name} accepts at most {state.max_histories} histories per request"
        )
    if batch * steps > state.max_interactions:
        raise ProtocolError(
            f"input q has {batch} x {steps} = {batch * steps} steps (padding included); model {model.name} "
            f"accepts at most {state.max_interactions} per request"
        )
    live = np.arange(steps)[np.newaxis] < lengths[:, np.newaxis]
    for values, low, high, what in (
        (questions, 1, state.n_questions, f"q (the question ids of model {model.name})"),
        (answers, 0, 1, "r (answers)"),
    ):
        if len(bad := np.argwhere(live & ((values < low) | (values > high)))):
            row, step = (int(index) for index in bad[0])
            raise ProtocolError(
                f"input {what}: element [{row}, {step}] is {int(values[row, step])}; it must be within {low}..{high}"
            )
    if memory is not None and not np.isfinite(memory).all():
        raise ProtocolError(f"input {state_input} holds NaN or infinite values")
    counts = lengths.tolist()
    rows = [(questions[i, :n], answers[i, :n], None if memory is None else memory[i]) for i, n in enumerate(counts)]
    admission = model.batcher.admit(sum(service.rows_needed(model, n, False) for n in counts), cells=sum(counts))
    return admission, (rows, steps)


async def infer(model: ServedModel, prepared: Histories) -> Feeds:
    """Every row's trace, all rows at once (`service.trace_all`), zero-padded to T."""
    histories, steps = prepared
    traces, state_output = await service.trace_all(model, histories), model.state.state_output
    result = {state_output: np.stack([trace.pop(state_output) for trace in traces])}
    for name in traces[0]:  # mastery has its row 0, before any step
        result[name] = pad_rows([trace[name][np.newaxis] for trace in traces], steps + (name == "mastery"))
    return {name: array.astype(np.float32, copy=False) for name, array in result.items()}
