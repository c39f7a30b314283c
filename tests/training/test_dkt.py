"""DKT baseline: predictions use only earlier steps, padding never changes them, and the serving graph (step
loop, scan, ONNX export) equals the trained LSTM and resumes a history from the state it returned."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export import dkt as export_dkt
from models import train_kt
from models.dkt import DKT, DKTConfig
from tests.helpers import app_client
from tests.synthetic_data import write_kt_students, write_synthetic_kt


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


def _history(steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, 8, (1, steps), generator=generator), torch.randint(0, 2, (1, steps), generator=generator)


def test_serving_graph_equals_the_trained_lstm_in_loop_and_scan():
    model = _model()
    q = torch.tensor([[3, 1, 4, 1, 5, 2], [2, 7, 7, 0, 0, 0]])
    r = torch.tensor([[1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]])
    lengths = torch.tensor([6, 3])
    with torch.no_grad():
        trained = torch.sigmoid(model.training_logits(q, r, lengths))
        loop, loop_state = model(q, r, lengths, model.initial_state(2))
        scan, scan_state = model(q, r, lengths, model.initial_state(2), use_scan=True)
    valid = torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)
    torch.testing.assert_close(loop[valid], trained[valid], rtol=0, atol=1e-6)
    torch.testing.assert_close(scan, loop, rtol=0, atol=1e-6)
    torch.testing.assert_close(scan_state, loop_state, rtol=0, atol=1e-6)
    with torch.no_grad():
        _, short_state = model(q[1:, :3], r[1:, :3], torch.tensor([3]), model.initial_state(1))
    torch.testing.assert_close(loop_state[1:], short_state, rtol=0, atol=1e-6)  # padding leaves the state as it was


def test_a_history_resumed_from_its_state_equals_the_whole_history():
    model = _model()
    q, r = _history(40)
    with torch.no_grad():
        whole, whole_state = model(q, r, torch.tensor([40]), model.initial_state(1))
        first, state = model(q[:, :17], r[:, :17], torch.tensor([17]), model.initial_state(1))
        second, final = model(q[:, 17:], r[:, 17:], torch.tensor([23]), state)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(final, whole_state, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def dkt_artifacts(tmp_path_factory: pytest.TempPathFactory):
    """A tiny DKT trained on generated assist2009-shaped data and exported by `python -m export.dkt`."""
    root = tmp_path_factory.mktemp("dkt")
    folder = root / "kt" / "assist2009_updated"
    for split, seed in (("train1", 0), ("valid1", 1), ("test", 2)):
        write_kt_students(folder / f"assist2009_updated_{split}.csv", 12, 110, 30, seed)
    (folder / "assist2009_updated_skill_mapping.txt").write_text("1\tCircumference\n2\tRounding\n")
    run, artifacts = root / "run", root / "artifacts"
    args = ["--dataset", "assist2009", "--data-dir", str(root / "kt"), "--model", "dkt", "--hidden", "16"]
    train_kt.main([*args, "--epochs", "1", "--out", str(run), "--no-progress"])
    export_dkt.main(["--run", str(run), "--name", "dkt-assist2009", "--artifacts", str(artifacts)])
    return run, artifacts


@pytest.mark.slow
def test_export_writes_graph_card_and_manifest_entry(dkt_artifacts):
    run, artifacts = dkt_artifacts
    entry = json.loads((artifacts / "manifest.json").read_text())["models"][0]
    assert entry["metadata"]["family"] == "dkt" and entry["metadata"]["hidden_dim"] == 16
    assert entry["metrics"]["paper_test_auc"] == 0.8053 and "test_auc_without_repeated_skill_pairs" in entry["metrics"]
    assert set(entry["assets"]) == {"question_names"} and entry["batching"]["max_cells"] > 0
    card = (artifacts / "dkt-assist2009.md").read_text()
    assert "## Evaluation caveat: answers repeated by multi-skill problems" in card and "state_in" in card
    session = ort.InferenceSession(str(artifacts / "dkt-assist2009.onnx"), providers=["CPUExecutionProvider"])
    assert [node.name for node in session.get_inputs()] == ["q", "r", "len", "state_in"]
    assert [node.name for node in session.get_outputs()] == ["p", "state_out"]
    model = export_dkt.load_model(run)
    q, r = _history(300, seed=3)
    with torch.no_grad():
        expected, _ = model(q, r, torch.tensor([300]), model.initial_state(1))
    feeds = {"q": q.numpy(), "r": r.numpy(), "len": np.array([300]), "state_in": np.zeros((1, 2, 16), np.float32)}
    np.testing.assert_allclose(session.run(["p"], feeds)[0], expected.numpy(), atol=1e-5)


@pytest.mark.slow
def test_the_exported_baseline_serves_long_histories_in_chunks(dkt_artifacts):
    """Through the service (seqlen 200 chunks carrying h and c) the answer equals one ONNX run over it all."""
    _, artifacts = dkt_artifacts
    q, r = _history(450, seed=4)
    session = ort.InferenceSession(str(artifacts / "dkt-assist2009.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"q": q.numpy(), "r": r.numpy(), "len": np.array([450]), "state_in": np.zeros((1, 2, 16), np.float32)}
    expected = session.run(["p"], feeds)[0][0]
    interactions = [{"question": int(a), "correct": bool(b)} for a, b in zip(q[0], r[0], strict=True)]
    with app_client(artifacts) as client:
        body = client.post("/knowledge-trace", json={"interactions": interactions, "next_questions": [2]}).json()
    np.testing.assert_allclose(body["predictions"], expected, atol=1e-5)
    assert body["family"] == "dkt" and body["mastery"] is None and body["attention"] is None
    assert (body["next"][0]["question"], body["next"][0]["concept"], body["next"][0]["name"]) == (2, None, "Rounding")
