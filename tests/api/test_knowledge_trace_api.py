"""POST /knowledge-trace over HTTP on the committed synthetic DKVMN (and, with torch, a freshly trained tiny one)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import KT_MODEL
from tests.helpers import app_client

N_QUESTIONS = 50


def _body(questions, correct=None, **extra):
    correct = correct or [q % 2 == 0 for q in questions]
    interactions = [{"question": q, "correct": c} for q, c in zip(questions, correct, strict=True)]
    return {"model": KT_MODEL, "interactions": interactions, **extra}


@pytest.mark.slow
def test_real_test_set_student_matches_offline_pytorch_inference(tiny_artifacts):
    torch = pytest.importorskip("torch")
    from export.kt import load_model
    from models.kt_data import read_students

    runs = tiny_artifacts.parent / "runs" / "synthetic-v0"
    student = read_students(tiny_artifacts.parent / "kt" / "synthetic" / "naive_c5_q50_s4000_v0_test.csv")[0]
    with app_client(tiny_artifacts) as client:
        body = _body(student.questions, [bool(r) for r in student.responses])
        response = client.post("/knowledge-trace", json=body)
    assert response.status_code == 200
    model = load_model(runs)
    q = torch.tensor([student.questions])
    r = torch.tensor([student.responses])
    with torch.no_grad():
        p, w, mastery, _ = model(q, r, torch.tensor([q.shape[1]]), model.initial_memory(1).contiguous(), use_scan=False)
    body = response.json()
    np.testing.assert_allclose(body["predictions"], p[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(body["mastery"], mastery[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(body["attention"], w[0].numpy(), atol=1e-5)


def test_response_shapes_ranges_and_next_questions(client):
    body = client.post("/knowledge-trace", json=_body([3, 3, 7, 9], next_questions=[3, 50])).json()
    assert body["model"] == KT_MODEL and body["n_concepts"] == 5
    assert len(body["predictions"]) == 4
    assert np.array(body["mastery"]).shape == (5, 5)
    assert np.all((np.array(body["mastery"]) >= 0) & (np.array(body["mastery"]) <= 1))
    np.testing.assert_allclose(np.array(body["attention"]).sum(1), 1, atol=1e-5)
    assert [item["question"] for item in body["next"]] == [3, 50]
    assert all(0 <= item["p_correct"] <= 1 and 0 <= item["concept"] < 5 for item in body["next"])
    everything = client.post("/knowledge-trace", json=_body([1], return_attention=False)).json()  # all next
    assert [item["question"] for item in everything["next"]] == list(range(1, N_QUESTIONS + 1))
    assert everything["attention"] is None


def test_history_longer_than_seqlen_is_processed_in_chunks(client):
    questions = [(i * 7) % N_QUESTIONS + 1 for i in range(130)]  # seqlen is 50
    body = client.post("/knowledge-trace", json=_body(questions)).json()
    assert len(body["predictions"]) == 130 and len(body["mastery"]) == 131 and len(body["attention"]) == 130


def test_next_prediction_reflects_the_history(client):
    right = client.post("/knowledge-trace", json=_body([5] * 30, [True] * 30, next_questions=[5])).json()
    wrong = client.post("/knowledge-trace", json=_body([5] * 30, [False] * 30, next_questions=[5])).json()
    assert right["next"][0]["p_correct"] != wrong["next"][0]["p_correct"]


@pytest.mark.parametrize(
    ("body", "location"),
    [
        ({"model": KT_MODEL, "interactions": []}, ["body", "interactions"]),
        (_body([0]), ["body", "interactions", 0, "question"]),
        (_body([1, N_QUESTIONS + 1]), ["body", "interactions", 1, "question"]),
        (_body([1], next_questions=[0]), ["body", "next_questions", 0]),
        (_body([1], next_questions=[N_QUESTIONS + 1]), ["body", "next_questions", 0]),
        ({"interactions": [{"question": "3", "correct": True}]}, ["body", "interactions", 0, "question"]),
        ({"interactions": [{"question": 3.5, "correct": True}]}, ["body", "interactions", 0, "question"]),
        ({"interactions": [{"question": 3, "correct": "yes"}]}, ["body", "interactions", 0, "correct"]),
        ({"interactions": [{"question": 3}]}, ["body", "interactions", 0, "correct"]),
        ({"interactions": "3,4"}, ["body", "interactions"]),
        ({"interactions": [{"question": 1, "correct": True}] * 10_001}, ["body", "interactions"]),
        ({"interactions": [{"question": 1, "correct": True}], "return_attention": "no"}, ["body", "return_attention"]),
    ],
)
def test_invalid_requests_are_422_naming_the_field(client, body, location):
    response = client.post("/knowledge-trace", json=body)
    assert response.status_code == 422, response.text
    assert any(error["loc"][: len(location)] == location for error in response.json()["detail"])


def test_out_of_range_question_names_the_item_and_the_range(client):
    detail = client.post("/knowledge-trace", json=_body([1, 2, 99])).json()["detail"][0]
    assert detail["loc"] == ["body", "interactions", 2, "question"]
    assert "1..50" in detail["msg"]


def test_a_malformed_question_id_is_one_error_at_the_id_naming_both_forms(client):
    ids = [0, 2**31, 3.5, True, None, "", "x" * 201]
    response = client.post("/knowledge-trace", json=_body([1], next_questions=ids))
    detail = response.json()["detail"]
    assert response.status_code == 422 and response.json()["error_count"] == len(ids)
    assert [error["loc"] for error in detail] == [["body", "next_questions", i] for i in range(len(ids))]
    assert all("integer in 1..2147483647 or a string of 1 to 200 characters" in error["msg"] for error in detail)


def test_a_string_id_does_not_hide_an_out_of_range_one(client):
    response = client.post("/knowledge-trace", json=_body([1, 99], next_questions=["3", 99]))
    messages = {tuple(error["loc"]): error["msg"] for error in response.json()["detail"]}
    assert response.status_code == 422 and response.json()["error_count"] == 3
    assert "1..50" in messages[("body", "interactions", 1, "question")]
    assert (
        "is a string" in messages[("body", "next_questions", 0)] and "1..50" in messages[("body", "next_questions", 1)]
    )


def test_unknown_or_wrong_task_model_is_404_listing_the_names(client):
    for name in ("nope", "rmc-vlmp-sick"):
        response = client.post("/knowledge-trace", json={**_body([1]), "model": name})
        assert response.status_code == 404
        assert KT_MODEL in response.json()["detail"]


def test_ten_thousand_interactions_are_served(client):
    questions = [(i % N_QUESTIONS) + 1 for i in range(10_000)]
    response = client.post("/knowledge-trace", json=_body(questions, return_attention=False, next_questions=[1]))
    assert response.status_code == 200 and len(response.json()["predictions"]) == 10_000


def test_a_long_history_in_chunks_equals_feeding_it_one_interaction_at_a_time(client):
    """The chunking (seqlen 200, each chunk resuming from mv_out) is exact: same as 1-step runs carrying memory."""
    import onnxruntime as ort

    from tests.conftest import COMMITTED

    rng = np.random.default_rng(3)
    questions = rng.integers(1, 111, 450).tolist()
    correct = (rng.random(450) < 0.6).tolist()
    body = {**_body(questions, correct, next_questions=[5]), "model": "dkvmn-assist2009"}
    served = client.post("/knowledge-trace", json=body).json()
    session = ort.InferenceSession(str(COMMITTED / "dkvmn-assist2009.onnx"), providers=["CPUExecutionProvider"])
    memory = np.load(COMMITTED / "dkvmn-assist2009.mv0.npy")[np.newaxis].astype(np.float32)
    one_by_one = []
    for question, answer in zip(questions, correct, strict=True):
        feeds = {"q": np.array([[question]]), "r": np.array([[int(answer)]]), "len": np.array([1]), "mv_in": memory}
        p, _, _, memory = session.run(["p", "corr_w", "mastery", "mv_out"], feeds)
        one_by_one.append(p[0, 0])
    np.testing.assert_allclose(served["predictions"], one_by_one, atol=1e-5, rtol=0)
