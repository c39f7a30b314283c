"""The committed DKT baseline (dkt-assist2009) served by a real `python -m app` next to the DKVMN models.

Every number is checked against the committed ONNX graph run directly in ONNX Runtime over the whole
history at once (the service cuts it into chunks of seqlen 200, carrying the LSTM state h, c).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import COMMITTED
from tests.helpers import app_client, running_server

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

DKT = "dkt-assist2009"
DKVMN = "dkvmn-assist2009"
N_QUESTIONS = 110
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def api() -> Iterator[httpx.Client]:
    with running_server(COMMITTED) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def graph() -> ort.InferenceSession:
    return ort.InferenceSession(str(COMMITTED / f"{DKT}.onnx"), providers=["CPUExecutionProvider"])


def history(steps: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"question": int(q), "correct": bool(c)}
        for q, c in zip(rng.integers(1, N_QUESTIONS + 1, steps), rng.integers(0, 2, steps), strict=True)
    ]


def one_shot(graph: ort.InferenceSession, interactions: list[dict], next_questions: list[int]) -> tuple:
    """P per step over the whole history in one graph run from the zero state, and P of each next question."""
    q = np.array([[item["question"] for item in interactions]], dtype=np.int64)
    r = np.array([[int(item["correct"]) for item in interactions]], dtype=np.int64)
    hidden = graph.get_inputs()[3].shape[2]
    feeds = {"q": q, "r": r, "len": np.array([q.shape[1]]), "state_in": np.zeros((1, 2, hidden), np.float32)}
    p, state = graph.run(["p", "state_out"], feeds)
    count = len(next_questions)
    step = {
        "q": np.array(next_questions, dtype=np.int64).reshape(count, 1),
        "r": np.zeros((count, 1), dtype=np.int64),
        "len": np.ones(count, dtype=np.int64),
        "state_in": np.repeat(state, count, axis=0),
    }
    return p[0], graph.run(["p"], step)[0][:, 0]


def trace(api: httpx.Client, interactions: list[dict], **options) -> dict:
    response = api.post("/knowledge-trace", json={"model": DKT, "interactions": interactions, **options})
    assert response.status_code == 200, response.text
    return response.json()


def test_models_reports_the_family_and_what_it_supports(api):
    listed = {model["name"]: model for model in api.get("/models").json()["models"]}
    dkt, dkvmn = listed[DKT], listed[DKVMN]
    assert dkt["ready"] and dkt["task"] == "knowledge-trace" and not dkt["default"]
    assert dkt["family"] == "dkt" and dkt["supports"] == {"mastery": False, "attention": False, "concepts": False}
    assert dkt["n_questions"] == N_QUESTIONS and dkt["n_concepts"] is None and dkt["seqlen"] == 200
    assert dkt["metrics"]["test_auc"] > dkt["metrics"]["paper_test_auc"] == 0.8053
    assert dkvmn["family"] == "dkvmn" and all(dkvmn["supports"].values()) and dkvmn["n_concepts"] == 20
    assert dkvmn["default"]  # the DKT baseline is an alternative, never the default


def test_dkt_answers_with_predictions_and_next_questions_and_no_concept_fields(api, graph):
    interactions = history(30, seed=1)
    body = trace(api, interactions, next_questions=[3, 7], return_attention=True, mastery="all")
    expected, expected_next = one_shot(graph, interactions, [3, 7])
    assert body["model"] == DKT and body["family"] == "dkt" and body["n_concepts"] is None
    np.testing.assert_allclose(body["predictions"], expected, atol=TOLERANCE, rtol=0)
    assert body["mastery"] is None and body["attention"] is None  # asked for, but DKT has no memory slots
    assert [(item["question"], item["concept"], item["name"]) for item in body["next"]] == [
        (3, None, "Probability of Two Distinct Events"),
        (7, None, "Mode"),
    ]
    np.testing.assert_allclose([item["p_correct"] for item in body["next"]], expected_next, atol=TOLERANCE)
    everything = trace(api, interactions[:1])  # next_questions null: every question
    assert [item["question"] for item in everything["next"]] == list(range(1, N_QUESTIONS + 1))


def test_the_same_request_body_works_for_dkvmn_and_dkt(api):
    body = {"interactions": history(12, seed=2), "next_questions": [5]}
    dkvmn = api.post("/knowledge-trace", json={**body, "model": DKVMN}).json()
    dkt = api.post("/knowledge-trace", json={**body, "model": DKT}).json()
    assert dkvmn["family"] == "dkvmn" and len(dkvmn["mastery"]) == 13 and len(dkvmn["attention"]) == 12
    assert dkt["family"] == "dkt" and dkt["mastery"] is None and dkt["attention"] is None
    assert len(dkt["predictions"]) == len(dkvmn["predictions"]) == 12
    assert dkt["predictions"] != dkvmn["predictions"]


def test_a_long_history_in_chunks_equals_one_run_over_all_of_it(api, graph):
    interactions = history(650, seed=3)  # seqlen 200: four chunks, each from the state the last one ended with
    body = trace(api, interactions, next_questions=[1, 40, 110])
    expected, expected_next = one_shot(graph, interactions, [1, 40, 110])
    np.testing.assert_allclose(body["predictions"], expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose([item["p_correct"] for item in body["next"]], expected_next, atol=TOLERANCE, rtol=0)


def shared_runs(api: httpx.Client) -> float:
    """ONNX runs of the DKT model so far that held more than one row (the batcher's histogram in /metrics)."""
    lines = [line for line in api.get("/metrics").text.splitlines() if f'model="{DKT}"' in line]
    runs = next(line for line in lines if line.startswith("mnemo_batch_size_rows_count"))
    single = next(line for line in lines if line.startswith("mnemo_batch_size_rows_bucket") and 'le="1.0"' in line)
    return float(runs.split()[-1]) - float(single.split()[-1])


def test_results_do_not_depend_on_the_other_requests_in_the_batch(api):
    """Concurrent histories of different lengths share the model's runs; each answer equals its answer alone."""
    histories = [history(length, seed=10 + index) for index, length in enumerate((1, 7, 60, 199, 200, 230, 7, 90))]
    alone = [trace(api, steps, next_questions=[9, 99])["predictions"] for steps in histories]
    before = shared_runs(api)
    with ThreadPoolExecutor(max_workers=len(histories)) as pool:
        for _ in range(3):
            together = list(pool.map(lambda steps: trace(api, steps, next_questions=[9, 99]), histories))
            for answer, expected in zip(together, alone, strict=True):
                np.testing.assert_allclose(answer["predictions"], expected, atol=TOLERANCE, rtol=0)
    assert shared_runs(api) > before  # the concurrent rounds did share runs


@pytest.mark.parametrize(
    ("interactions", "next_questions", "location"),
    [
        ([{"question": N_QUESTIONS + 1, "correct": True}], None, ["body", "interactions", 0, "question"]),
        ([{"question": 1, "correct": True}], [0], ["body", "next_questions", 0]),
    ],
)
def test_out_of_range_questions_are_a_422_naming_the_field(api, interactions, next_questions, location):
    response = api.post(
        "/knowledge-trace", json={"model": DKT, "interactions": interactions, "next_questions": next_questions}
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == location


def test_students_keep_the_lstm_state_and_match_the_stateless_answer(api, graph):
    """Appends in pieces (one crossing seqlen) equal the whole history; mastery is null for DKT."""
    student_id, steps = f"dkt-{uuid.uuid4().hex}", history(260, seed=4)
    path = f"/students/{student_id}/interactions"
    first = api.post(path, json={"model": DKT, "interactions": steps[:3]}).json()
    second = api.post(path, json={"model": DKT, "interactions": steps[3:], "next_questions": [5, 50]}).json()
    expected, expected_next = one_shot(graph, steps, [5, 50])
    np.testing.assert_allclose(first["predictions"] + second["predictions"], expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose([item["p_correct"] for item in second["next"]], expected_next, atol=TOLERANCE)
    assert second["model"] == DKT and second["interactions"] == 260 and second["mastery"] is None
    state = api.get(f"/students/{student_id}", params={"model": DKT}).json()
    assert state["model"] == DKT and state["interactions"] == 260 and state["mastery"] is None
    assert api.get(f"/students/{student_id}").status_code == 404  # no state under the default model
    deleted = api.delete(f"/students/{student_id}").json()["deleted"]
    assert deleted == [{"model": DKT, "interactions": 260}]


def test_students_asked_for_attention_and_mastery_steps_get_null_for_dkt(api):
    """The options a DKVMN student may ask for are null for DKT (no memory slots), not an error."""
    path = f"/students/dkt-{uuid.uuid4().hex}/interactions"
    options = {"return_attention": True, "return_mastery_steps": True}
    response = api.post(path, json={"model": DKT, "interactions": history(3, seed=5), **options})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["attention"] is None and body["mastery_steps"] is None and body["mastery"] is None
    assert len(body["predictions"]) == 3


def test_question_catalog_has_names_and_no_concepts(api):
    page = api.get(f"/models/{DKT}/questions", params={"limit": 2}).json()
    assert page["total"] == N_QUESTIONS and page["concepts"] is None
    assert page["questions"] == [
        {"question": 1, "name": "Area Trapezoid", "concept": None},
        {"question": 2, "name": "Area Irregular Figure", "concept": None},
    ]


def test_open_inference_protocol_lists_and_runs_the_dkt_graph(api, graph):
    assert api.get(f"/v2/models/{DKT}/ready").status_code == 200
    metadata = api.get(f"/v2/models/{DKT}").json()
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["q", "r", "len", "state_in"]
    assert [tensor["name"] for tensor in metadata["outputs"]] == ["p", "state_out"]
    interactions = history(230, seed=5)
    q = [item["question"] for item in interactions]
    r = [int(item["correct"]) for item in interactions]
    inputs = [
        {"name": "q", "datatype": "INT64", "shape": [1, 230], "data": q},
        {"name": "r", "datatype": "INT64", "shape": [1, 230], "data": r},
        {"name": "len", "datatype": "INT64", "shape": [1], "data": [230]},
    ]
    response = api.post(f"/v2/models/{DKT}/infer", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    outputs = {tensor["name"]: tensor for tensor in response.json()["outputs"]}
    assert set(outputs) == {"p", "state_out"} and outputs["state_out"]["shape"][:2] == [1, 2]
    expected, _ = one_shot(graph, interactions, [1])
    np.testing.assert_allclose(outputs["p"]["data"], expected, atol=TOLERANCE, rtol=0)
    for name, shape in (("state_in", [1, 2, 3]), ("mv_in", [1, 2, 3])):  # a wrong shape, DKVMN's memory input
        state = {"name": name, "datatype": "FP32", "shape": shape, "data": [0.0] * 6}
        response = api.post(f"/v2/models/{DKT}/infer", json={"inputs": [*inputs, state]})
        assert response.status_code == 400 and name in response.json()["error"]


@pytest.mark.parametrize(
    ("family", "error"),
    [("dkvmn", "a dkvmn graph takes mv_in and gives mv_out"), ("rnn", "metadata.family is 'rnn'; known: dkvmn, dkt")],
)
def test_a_family_that_does_not_fit_the_graph_leaves_the_model_not_ready(artifacts_copy, family, error):
    """The DKT graph declared as DKVMN (or an unknown family) is a clear startup error for that model only."""
    manifest = json.loads((artifacts_copy / "manifest.json").read_text())
    entry = next(entry for entry in manifest["models"] if entry["name"] == DKT)
    entry["metadata"]["family"] = family
    (artifacts_copy / "manifest.json").write_text(json.dumps(manifest))
    with app_client(artifacts_copy, on_model_error="skip") as client:
        listed = {model["name"]: model for model in client.get("/models").json()["models"]}
    assert not listed[DKT]["ready"] and error in listed[DKT]["error"]
    assert listed[DKVMN]["ready"]
