"""DKT baseline: predictions use only earlier steps, and padding never changes them."""

from __future__ import annotations

import torch

from models import train_kt
from models.dkt import DKT, DKTConfig
from tests.synthetic_data import write_synthetic_kt


def _model() -> DKT:
    torch.manual_seed(0)
    return DKT(DKTConfig(n_questions=7, hidden_dim=16)).eval()


def test_step_t_sees_only_answers_before_t():
    model = _model()
    q = torch.tensor([[3, 1, 4, 1, 5, 2]])
    r = torch.tensor([[1, 0, 1, 1, 0, 1]])
    flipped = r.clone()
    flipped[0, 3] = 0  # change the answer at step 3
    with torch.no_grad():
        base, changed = (model.training_logits(q, answers, torch.tensor([6])) for answers in (r, flipped))
    torch.testing.assert_close(base[:, :4], changed[:, :4], rtol=0, atol=0)  # steps 0..3 cannot see it
    assert not torch.allclose(base[:, 4:], changed[:, 4:])


def test_student_alone_equals_student_padded_in_a_batch():
    model = _model()
    q = torch.tensor([[3, 1, 4, 0, 0], [2, 2, 6, 7, 1]])
    r = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 1, 0, 1]])
    with torch.no_grad():
        batched = model.training_logits(q, r, torch.tensor([3, 5]))
        alone = model.training_logits(q[:1, :3], r[:1, :3], torch.tensor([3]))
    torch.testing.assert_close(batched[:1, :3], alone, rtol=0, atol=1e-6)


def test_train_kt_trains_the_baseline(tmp_path):
    data = write_synthetic_kt(tmp_path / "kt")
    args = ["--dataset", "synthetic-v0", "--data-dir", str(data), "--model", "dkt", "--hidden", "8", "--epochs", "2"]
    result = train_kt.main([*args, "--out", str(tmp_path / "run"), "--no-progress"])
    assert result["model"] == "dkt" and result["config"]["hidden_dim"] == 8
    assert 0.0 <= result["valid"]["auc"] <= 1.0 and len(result["history"]) == 2
