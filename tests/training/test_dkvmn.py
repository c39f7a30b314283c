"""DKVMN: masking, padding invariance, loop/scan agreement, ONNX parity, data validation."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.kt import export_dkvmn
from models import dkvmn
from models.dkvmn import DKVMN, DKVMNConfig
from models.kt_data import KTDataError, read_students, to_sequences
from models.unroll import unroll

CONFIG = DKVMNConfig(n_questions=30, memory_size=4, key_dim=8, value_dim=12)


@pytest.fixture(scope="module")
def model() -> DKVMN:
    torch.manual_seed(0)
    return DKVMN(CONFIG).eval()


def _batch(lengths: list[int], steps: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(1, CONFIG.n_questions + 1, (len(lengths), steps), generator=generator)
    r = torch.randint(0, 2, (len(lengths), steps), generator=generator)
    lengths_t = torch.tensor(lengths)
    padding = torch.arange(steps).unsqueeze(0) >= lengths_t.unsqueeze(1)
    return q.masked_fill(padding, 0), r.masked_fill(padding, 0), lengths_t


def _run(model: DKVMN, q, r, lengths, use_scan: bool = False):
    with torch.no_grad():
        return model(q, r, lengths, model.initial_memory(len(q)).contiguous(), use_scan=use_scan)


def test_student_alone_equals_student_batched_with_longer_ones(model):
    q, r, lengths = _batch([6, 15, 11], 15)
    p, w, mastery, memory = _run(model, q, r, lengths)
    p1, w1, mastery1, memory1 = _run(model, q[:1, :6], r[:1, :6], lengths[:1])
    torch.testing.assert_close(p[0, :6], p1[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(w[0, :6], w1[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(mastery[0, :7], mastery1[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(memory[0], memory1[0], rtol=0, atol=1e-6)


def test_masked_steps_leave_memory_unchanged(model):
    q, r, _ = _batch([10], 10)
    _, _, mastery, memory = _run(model, q, r, torch.tensor([4]))
    _, _, _, memory_at_4 = _run(model, q[:, :4], r[:, :4], torch.tensor([4]))
    assert torch.equal(memory, memory_at_4)
    for row in range(5, 11):  # mastery rows after the last valid step repeat its state
        assert torch.equal(mastery[0, row], mastery[0, 4])


def test_attention_rows_sum_to_one_and_mastery_is_a_probability(model):
    q, r, lengths = _batch([9, 3], 9)
    _, w, mastery, _ = _run(model, q, r, lengths)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 9))
    assert mastery.min() >= 0 and mastery.max() <= 1


def test_training_logits_match_the_serving_graph(model):
    q, r, lengths = _batch([7, 12], 12)
    p, *_ = _run(model, q, r, lengths)
    with torch.no_grad():
        torch.testing.assert_close(torch.sigmoid(model.training_logits(q, r, lengths)), p)


def _step_by_step_logits(model: DKVMN, q, r, lengths) -> torch.Tensor:
    """Training logits with the serving step (read, then erase-and-add, one step at a time)."""

    def step(memory, inputs_t):
        memory, read = model._read_and_write(memory, inputs_t)
        return memory, (read,)

    _, (reads,) = unroll(step, model.initial_memory(len(q)), model._step_terms(q, r, lengths))
    return model._predict_logits(reads, model._question_features(q))


@pytest.mark.parametrize("precomputed_write_limit", [0, 1 << 20], ids=["per-step-write", "precomputed-write"])
def test_training_logits_and_gradients_equal_the_step_by_step_ones_bit_for_bit(monkeypatch, precomputed_write_limit):
    monkeypatch.setattr(dkvmn, "PRECOMPUTED_WRITE_LIMIT", precomputed_write_limit)
    torch.manual_seed(1)
    model = DKVMN(CONFIG)
    q, r, lengths = _batch([12, 5, 9], 12)
    results = []
    for logits_of in (model.training_logits, lambda *batch: _step_by_step_logits(model, *batch)):
        model.zero_grad()
        logits = logits_of(q, r, lengths)
        (logits * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
        results.append([logits.detach(), *(parameter.grad.clone() for parameter in model.parameters())])
    for fast, reference in zip(*results, strict=True):
        assert torch.equal(fast, reference)


def test_python_loop_and_scan_agree(model):
    q, r, lengths = _batch([5, 8, 2], 8)
    for loop_output, scan_output in zip(_run(model, q, r, lengths), _run(model, q, r, lengths, True), strict=True):
        torch.testing.assert_close(loop_output, scan_output, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_onnx_graph_matches_pytorch_for_any_batch_and_length(model, tmp_path):
    path = tmp_path / "dkvmn.onnx"
    export_dkvmn(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for lengths, steps in (([1], 1), ([13, 40, 2], 40)):
        q, r, lengths_t = _batch(lengths, steps, seed=steps)
        expected = _run(model, q, r, lengths_t)
        mv = model.initial_memory(len(q)).detach().contiguous().numpy()
        actual = session.run(None, {"q": q.numpy(), "r": r.numpy(), "len": lengths_t.numpy(), "mv_in": mv})
        for e, a in zip(expected, actual, strict=True):
            np.testing.assert_allclose(a, e.numpy(), atol=1e-4, rtol=0)


def test_loader_chunks_students_and_names_the_bad_line(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("3\n1,2,3,\n1,0,1\n2\n4,5\n0,0\n")
    sequences = to_sequences(read_students(good, 5), seqlen=2)
    assert sequences.lengths.tolist() == [2, 1, 2]
    assert sequences.q.tolist() == [[1, 2], [3, 0], [4, 5]]
    bad = tmp_path / "bad.csv"
    bad.write_text("2\n1,2\n1,x\n")
    with pytest.raises(KTDataError, match=r"bad.csv:3"):
        read_students(bad)
    out_of_range = tmp_path / "range.csv"
    out_of_range.write_text("1\n9\n1\n")
    with pytest.raises(KTDataError, match=r"range.csv:2: question ids must be in 1..5"):
        read_students(out_of_range, 5)
