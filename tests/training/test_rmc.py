"""LSTM_RMC: padding invariance, VLMP window semantics, masking, loop/scan agreement, ONNX parity."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.similarity import export_pair_model
from models.rmc import RelationalMemory, RMCConfig, SentencePairModel
from models.sick_data import relatedness_target

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

SMALL = {"num_heads": 2, "head_size": 8, "fc_dim": 16}


def _model(pointer: str, window: int = 3) -> SentencePairModel:
    torch.manual_seed(0)
    return SentencePairModel(RMCConfig(pointer=pointer, window=window, **SMALL)).eval()


def _pairs(lengths_a: list[int], lengths_b: list[int], steps: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    emb_a, emb_b = torch.randn(2, len(lengths_a), steps, 50, generator=generator)
    return emb_a, torch.tensor(lengths_a), emb_b, torch.tensor(lengths_b)


@pytest.mark.parametrize("pointer", ["vlmp", "flmp"])
def test_pair_alone_equals_pair_batched_with_longer_sentences(pointer):
    model = _model(pointer)
    emb_a, len_a, emb_b, len_b = _pairs([4, 17, 9], [5, 12, 17], 17)
    with torch.no_grad():
        batched = model(emb_a, len_a, emb_b, len_b)
        alone = model(emb_a[:1, :5], len_a[:1], emb_b[:1, :5], len_b[:1])
    for full, single in zip(batched[:3], alone[:3], strict=True):
        torch.testing.assert_close(full[:1], single, rtol=0, atol=1e-5)
    for full, single in zip(batched[3:], alone[3:], strict=True):  # attention of the real steps
        torch.testing.assert_close(full[:1, :5], single, rtol=0, atol=1e-5)


def _reference_vlmp_all_tokens(core: RelationalMemory, x: torch.Tensor) -> torch.Tensor:
    """The authors' VLMP: each step attends over [memory; every token so far], all rows through the block."""
    memory = core.initial_memory.clone()
    projected = core.input_projector(x)  # [1,T,M]
    for t in range(x.shape[1]):
        rows = torch.cat([memory.unsqueeze(1), projected[:, : t + 1]], dim=1)  # [1, t+2, M]
        q, k, v = (a.transpose(1, 2) for a in core.split_heads(core.qkv_layernorm(core.qkv_projector(rows))))
        attention = torch.softmax(q * core.config.head_size**-0.5 @ k.transpose(-1, -2), dim=-1)
        z = core.attended_memory_layernorm(rows + (attention @ v).transpose(1, 2).reshape(rows.shape))
        z = core.attended_memory_layernorm2(z + core.mlp(z))
        memory = core.gate(memory, z[:, 0], core.input_gate_projector(projected[:, t]))
    return memory


def test_vlmp_with_a_window_as_long_as_the_sentence_attends_over_all_tokens():
    steps = 7
    windowed = SentencePairModel(RMCConfig(pointer="vlmp", window=steps, **SMALL)).eval()
    x = torch.randn(1, steps, 50)
    with torch.no_grad():
        memory, _ = windowed.encoder.encode(x, torch.tensor([steps]))
        reference = _reference_vlmp_all_tokens(windowed.encoder, x)
        short_window, _ = _model("vlmp", window=2).encoder.encode(x, torch.tensor([steps]))
    torch.testing.assert_close(memory, reference, rtol=0, atol=1e-5)
    assert not torch.allclose(short_window, reference, atol=1e-3)  # a shorter window really sees less


@pytest.mark.parametrize("pointer", ["vlmp", "flmp"])
def test_masked_steps_leave_memory_unchanged_and_attend_to_nothing(pointer):
    core = _model(pointer).encoder
    x = torch.randn(1, 9, 50)
    with torch.no_grad():
        memory, attention = core.encode(x, torch.tensor([4]))
        memory_at_4, _ = core.encode(x[:, :4], torch.tensor([4]))
    assert torch.equal(memory, memory_at_4)
    assert torch.count_nonzero(attention[:, 4:]) == 0
    assert attention.min() >= 0
    torch.testing.assert_close(attention[:, :4].sum(-1), torch.ones(1, 4, SMALL["num_heads"]))


@pytest.mark.parametrize("pointer", ["vlmp", "flmp"])
def test_python_loop_and_scan_agree(pointer):
    model = _model(pointer)
    inputs = _pairs([3, 6], [6, 1], 6)
    with torch.no_grad():
        for loop, scan in zip(model(*inputs), model(*inputs, use_scan=True), strict=True):
            torch.testing.assert_close(loop, scan, rtol=0, atol=1e-6)


@pytest.mark.parametrize("pointer", ["vlmp", "flmp"])
def test_onnx_graph_matches_pytorch_for_any_batch_and_length(pointer, tmp_path):
    model = _model(pointer)
    path = tmp_path / "rmc.onnx"
    export_pair_model(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for lengths_a, lengths_b, steps in (([1], [1], 1), ([3, 20, 11], [20, 2, 5], 20)):
        emb_a, len_a, emb_b, len_b = _pairs(lengths_a, lengths_b, steps, seed=steps)
        with torch.no_grad():
            expected = model(emb_a, len_a, emb_b, len_b)
        feeds = {"emb_a": emb_a.numpy(), "len_a": len_a.numpy(), "emb_b": emb_b.numpy(), "len_b": len_b.numpy()}
        for e, a in zip(expected, session.run(None, feeds), strict=True):
            np.testing.assert_allclose(a, e.numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("score", [1.0, 2.4, 3.0, 4.75, 5.0])
def test_relatedness_target_reads_back_to_its_score(score):
    target = relatedness_target(score)
    assert target.sum() == pytest.approx(1.0)
    assert float((target * np.arange(1, 6)).sum()) == pytest.approx(score)
