"""Knowledge distillation in models/train_sim.py: the loss mixing, and teacher targets from runs and graphs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models import teacher_targets, train_sim
from models.sick_data import relatedness_target
from tests.synthetic_data import write_sick

TINY = ["--pointer", "vlmp", "--heads", "2", "--head-size", "8", "--fc-dim", "16", "--no-progress"]


def _batch(seed: int = 0):
    """Model outputs, gold targets and teacher probabilities for a batch of 6 pairs, 2 of them swapped."""
    generator = torch.Generator().manual_seed(seed)
    log_probs = torch.log_softmax(torch.randn(6, 5, generator=generator), dim=-1)
    logits = torch.randn(6, 3, generator=generator)
    scores = 1 + 4 * torch.rand(6, generator=generator)
    targets = torch.from_numpy(np.stack([relatedness_target(float(s)) for s in scores]))
    labels = torch.randint(0, 3, (6,), generator=generator)
    swapped = torch.tensor([False, True, False, False, True, False])
    teacher = (
        torch.softmax(torch.randn(6, 5, generator=generator), dim=-1),
        torch.softmax(torch.randn(6, 3, generator=generator), dim=-1),
    )
    return (log_probs, None, logits), targets, labels, swapped, teacher


def test_weight_zero_gives_the_loss_without_a_teacher_exactly():
    outputs, targets, labels, swapped, teacher = _batch()
    plain = train_sim.joint_loss(outputs, targets, labels, swapped)
    assert torch.equal(train_sim.joint_loss(outputs, targets, labels, swapped, teacher, 0.0), plain)
    mixed_targets, soft_labels = train_sim.distillation_targets(targets, labels, teacher, 0.0)
    assert torch.equal(mixed_targets, targets) and torch.equal(soft_labels, F.one_hot(labels, 3).float())


def test_weight_one_uses_only_the_teacher():
    outputs, targets, labels, swapped, teacher = _batch()
    loss = train_sim.joint_loss(outputs, targets, labels, swapped, teacher, 1.0)
    _, other_targets, other_labels, _, _ = _batch(seed=1)
    assert not torch.equal(other_labels, labels)
    other_gold = train_sim.joint_loss(outputs, other_targets, other_labels, swapped, teacher, 1.0)
    torch.testing.assert_close(other_gold, loss, rtol=0, atol=0)
    log_probs, _, logits = outputs
    kept = ~swapped
    expected = (
        F.kl_div(log_probs, teacher[0], reduction="batchmean")
        - (teacher[1][kept] * torch.log_softmax(logits[kept], dim=-1)).sum(-1).mean()
    )
    torch.testing.assert_close(loss, expected)


def test_a_half_weight_mixes_gold_and_teacher_evenly():
    _, targets, labels, _, teacher = _batch()
    mixed_targets, soft_labels = train_sim.distillation_targets(targets, labels, teacher, 0.5)
    torch.testing.assert_close(mixed_targets, (targets + teacher[0]) / 2)
    torch.testing.assert_close(soft_labels, (F.one_hot(labels, 3) + teacher[1]) / 2)
    torch.testing.assert_close(soft_labels.sum(-1), torch.ones(6))


def test_soften_is_a_softmax_of_the_log_probabilities_over_the_temperature():
    probabilities = torch.softmax(torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), dim=-1).numpy()
    assert train_sim.soften(probabilities, 1.0) is probabilities
    softened = train_sim.soften(probabilities, 2.0)
    expected = torch.softmax(torch.log(torch.from_numpy(probabilities)) / 2, dim=-1).numpy()
    np.testing.assert_allclose(softened, expected, rtol=1e-5)
    np.testing.assert_allclose(softened.sum(-1), np.ones(6), rtol=1e-6)
    assert (softened.argmax(-1) == probabilities.argmax(-1)).all()
    assert (softened.max(-1) < probabilities.max(-1)).all()


@pytest.mark.slow
def test_teacher_targets_from_a_run_and_its_graph_agree_and_train_a_student(tmp_path):
    pytest.importorskip("onnxruntime")
    from export.similarity import export_pair_model, load_model

    data = write_sick(tmp_path / "sick")
    common = [*TINY, "--data-dir", str(data), "--epochs", "1", "--specials-seed", "5"]
    train_sim.main([*common, "--seed", "1", "--out", str(tmp_path / "teacher")])
    graph = tmp_path / "teacher.onnx"
    export_pair_model(load_model(tmp_path / "teacher")[0], graph)
    options = ["--data-dir", str(data), "--specials-seed", "5"]
    from_run = teacher_targets.main([*options, "--run", str(tmp_path / "teacher"), "--out", str(tmp_path / "a.npz")])
    from_graph = teacher_targets.main([*options, "--onnx", str(graph), "--out", str(tmp_path / "b.npz")])
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert a["relatedness"].shape == (48, 5) and a["entailment"].shape == (48, 3)
    np.testing.assert_allclose(a["relatedness"], b["relatedness"], atol=1e-5)
    np.testing.assert_allclose(a["entailment"], b["entailment"], atol=1e-5)
    assert from_run["mean"]["trial"]["pearson"] == pytest.approx(from_graph["mean"]["trial"]["pearson"], abs=1e-4)

    student = tmp_path / "student"
    teachers = ["--teacher-targets", str(tmp_path / "a.npz"), "--teacher-temperature", "2"]
    train_sim.main([*common, "--seed", "2", "--out", str(student), *teachers])
    result = json.loads((student / "result.json").read_text())
    assert result["distill_weight"] == 0.5 and result["teacher_targets"]["file"] == str(tmp_path / "a.npz")
    assert result["teacher_temperature"] == 2.0

    other = write_sick(tmp_path / "other", seed=3)
    with pytest.raises(SystemExit, match="another training file"):
        train_sim.main([*TINY, "--data-dir", str(other), "--epochs", "1", "--teacher-targets", str(tmp_path / "a.npz")])
