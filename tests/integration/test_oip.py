"""The Open Inference Protocol (KServe v2 REST), spoken by the official `tritonclient` to a real server.

The numbers must equal the task API's (POST /similarity, /knowledge-trace) on the same server, and the
model metadata must equal the ONNX graphs as the `onnx` package reads them. Error statuses that need
engine states (queue full, deadline passed, model not loaded) run in-process on the real app.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient

from app.core.errors import Overloaded
from app.runtime.offload import MAX_QUEUED_BYTES, offload_or_shed
from tests.conftest import COMMITTED, KT_MODEL, SIM_MODEL, manifest_models
from tests.helpers import Server, app_client, running_server

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

httpclient = pytest.importorskip("tritonclient.http", reason="the protocol test needs the dev extra (tritonclient)")
from tritonclient.utils import InferenceServerException  # noqa: E402

TOLERANCE = 1e-5
KT_MODELS = [entry["name"] for entry in manifest_models(COMMITTED) if entry["task"] == "knowledge-trace"]
VERSIONS = {entry["name"]: entry["version"] for entry in manifest_models(COMMITTED)}
ONNX_DATATYPES = {onnx.TensorProto.INT64: "INT64", onnx.TensorProto.FLOAT: "FP32"}
PAIRS = [
    ("A man is playing a guitar.", "A person plays the guitar."),
    ("A dog runs across 2 fields", "The cat is sleeping on the sofa"),
    ("Kids are playing in the park", "Children play outside"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(COMMITTED) as running:
        yield running


@pytest.fixture(scope="module")
def triton(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    client.close()


def tensor(name: str, array: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    tensor_input = httpclient.InferInput(name, list(array.shape), datatype)
    tensor_input.set_data_from_numpy(array, binary_data=binary)
    return tensor_input


def outputs(names: list[str], binary: bool) -> list[httpclient.InferRequestedOutput]:
    return [httpclient.InferRequestedOutput(name, binary_data=binary) for name in names]


def kt_inputs(questions: np.ndarray, answers: np.ndarray, lengths: list[int], binary: bool, memory=None) -> list:
    inputs = [
        tensor("q", questions.astype(np.int64), "INT64", binary),
        tensor("r", answers.astype(np.int64), "INT64", binary),
        tensor("len", np.array(lengths, dtype=np.int64), "INT64", binary),
    ]
    if memory is not None:
        inputs.append(tensor("mv_in", memory.astype(np.float32), "FP32", binary))
    return inputs


def task_trace(server: Server, questions: np.ndarray, answers: np.ndarray) -> dict:
    interactions = [{"question": int(q), "correct": bool(r)} for q, r in zip(questions, answers, strict=True)]
    body = {"model": KT_MODEL, "interactions": interactions, "next_questions": [1]}
    response = httpx.post(f"{server.url}/knowledge-trace", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def graph_tensors(nodes) -> list[dict]:
    """Name, protocol datatype and shape (-1 for a symbolic dim) of ONNX graph inputs or outputs."""
    return [
        {
            "name": node.name,
            "datatype": ONNX_DATATYPES[node.type.tensor_type.elem_type],
            "shape": [dim.dim_value if dim.HasField("dim_value") else -1 for dim in node.type.tensor_type.shape.dim],
        }
        for node in nodes
    ]


def status_of(call) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status(), caught.value.message()


# -- health and metadata ---------------------------------------------------------------------------------
def test_health_and_readiness(triton) -> None:
    assert triton.is_server_live()
    assert triton.is_server_ready()
    for entry in manifest_models(COMMITTED):
        assert triton.is_model_ready(entry["name"])
        assert triton.is_model_ready(entry["name"], entry["version"])
    assert not triton.is_model_ready("no-such-model")
    assert not triton.is_model_ready(KT_MODEL, "9.9.9")
    metadata = triton.get_server_metadata()
    assert metadata["name"] == "mnemo"
    assert "binary_tensor_data" in metadata["extensions"]


@pytest.mark.parametrize("name", KT_MODELS)
def test_knowledge_trace_metadata_is_the_onnx_graph(triton, name: str) -> None:
    graph = onnx.load(COMMITTED / f"{name}.onnx").graph
    metadata = triton.get_model_metadata(name)
    assert metadata["name"] == name
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == graph_tensors(graph.input)
    assert metadata["outputs"] == graph_tensors(graph.output)
    state_input = "state_in" if name.startswith("dkt-") else "mv_in"  # the DKT baseline carries h and c
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["q", "r", "len", state_input]


def test_similarity_metadata(triton) -> None:
    metadata = triton.get_model_metadata(SIM_MODEL, VERSIONS[SIM_MODEL])
    assert metadata["inputs"] == [
        {"name": "sentence_a", "datatype": "BYTES", "shape": [-1]},
        {"name": "sentence_b", "datatype": "BYTES", "shape": [-1]},
    ]
    assert metadata["outputs"] == [
        {"name": "relatedness", "datatype": "FP32", "shape": [-1]},
        {"name": "entailment_probabilities", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "tokens_a", "datatype": "BYTES", "shape": [-1, -1]},
        {"name": "tokens_b", "datatype": "BYTES", "shape": [-1, -1]},
    ]


# -- the same numbers as the task API --------------------------------------------------------------------
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_knowledge_trace_equals_the_task_api(server, triton, binary: bool) -> None:
    """Rows of different lengths, one past the model's seqlen (chunked), padded to one T."""
    rng = np.random.default_rng(7)
    n_questions, seqlen = 50, 50  # dkvmn-synthetic
    lengths = [3, 2 * seqlen + 17, 40]
    steps = max(lengths)
    questions = np.zeros((len(lengths), steps), dtype=np.int64)
    answers = np.zeros((len(lengths), steps), dtype=np.int64)
    for row, length in enumerate(lengths):
        questions[row, :length] = rng.integers(1, n_questions + 1, length)
        answers[row, :length] = rng.integers(0, 2, length)
    names = ["p", "corr_w", "mastery", "mv_out"]
    result = triton.infer(KT_MODEL, kt_inputs(questions, answers, lengths, binary), outputs=outputs(names, binary))
    p, corr_w, mastery, memory = (result.as_numpy(name) for name in names)
    assert all(("parameters" in result.get_output(name)) == binary for name in names)
    assert p.shape == (3, steps) and corr_w.shape[:2] == (3, steps) and mastery.shape[:2] == (3, steps + 1)
    assert memory.shape[0] == 3
    for row, length in enumerate(lengths):
        expected = task_trace(server, questions[row, :length], answers[row, :length])
        np.testing.assert_allclose(p[row, :length], expected["predictions"], atol=TOLERANCE)
        np.testing.assert_allclose(corr_w[row, :length], expected["attention"], atol=TOLERANCE)
        np.testing.assert_allclose(mastery[row, : length + 1], expected["mastery"], atol=TOLERANCE)
        assert not p[row, length:].any() and not corr_w[row, length:].any() and not mastery[row, length + 1 :].any()


def test_knowledge_trace_resumes_from_the_memory_it_returned(triton) -> None:
    """mv_out of the first half fed as mv_in of the second half gives the whole history's numbers."""
    rng = np.random.default_rng(11)
    questions = rng.integers(1, 51, (1, 30))
    answers = rng.integers(0, 2, (1, 30))
    whole = triton.infer(KT_MODEL, kt_inputs(questions, answers, [30], binary=False))
    first = triton.infer(KT_MODEL, kt_inputs(questions[:, :12], answers[:, :12], [12], binary=True))
    second_inputs = kt_inputs(questions[:, 12:], answers[:, 12:], [18], True, memory=first.as_numpy("mv_out"))
    second = triton.infer(KT_MODEL, second_inputs, model_version=VERSIONS[KT_MODEL])
    np.testing.assert_allclose(second.as_numpy("p")[0], whole.as_numpy("p")[0, 12:], atol=TOLERANCE)
    np.testing.assert_allclose(second.as_numpy("mv_out"), whole.as_numpy("mv_out"), atol=TOLERANCE)
    initial = np.load(COMMITTED / f"{KT_MODEL}.mv0.npy")[np.newaxis]
    explicit = triton.infer(KT_MODEL, kt_inputs(questions, answers, [30], True, memory=initial))
    np.testing.assert_allclose(explicit.as_numpy("p"), whole.as_numpy("p"), atol=TOLERANCE)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_similarity_equals_the_task_api(server, triton, binary: bool) -> None:
    first = np.array([a for a, _ in PAIRS], dtype=object)
    second = np.array([b for _, b in PAIRS], dtype=object)
    inputs = [tensor("sentence_a", first, "BYTES", binary), tensor("sentence_b", second, "BYTES", binary)]
    names = ["relatedness", "entailment_probabilities", "tokens_a", "tokens_b"]
    result = triton.infer(SIM_MODEL, inputs, outputs=outputs(names, binary))
    relatedness, probabilities = result.as_numpy("relatedness"), result.as_numpy("entailment_probabilities")
    tokens = {name: result.as_numpy(name) for name in ("tokens_a", "tokens_b")}
    assert all(("parameters" in result.get_output(name)) == binary for name in names)
    labels = next(m for m in httpx.get(f"{server.url}/models").json()["models"] if m["name"] == SIM_MODEL)[
        "entailment_labels"
    ]
    for row, (sentence_a, sentence_b) in enumerate(PAIRS):
        body = {"model": SIM_MODEL, "sentence_a": sentence_a, "sentence_b": sentence_b, "return_attention": False}
        expected = httpx.post(f"{server.url}/similarity", json=body, timeout=30).json()
        assert abs(relatedness[row] - expected["relatedness"]) <= TOLERANCE
        wanted = [expected["entailment"]["probabilities"][label] for label in labels]
        np.testing.assert_allclose(probabilities[row], wanted, atol=TOLERANCE)
        for name in ("tokens_a", "tokens_b"):
            row_tokens = [t.decode() if isinstance(t, bytes) else t for t in tokens[name][row]]
            assert [t for t in row_tokens if t] == expected[name]


def test_only_the_requested_outputs_come_back_with_the_request_id(triton) -> None:
    inputs = [tensor("sentence_a", np.array(["a b c"], dtype=object), "BYTES", False)]
    inputs.append(tensor("sentence_b", np.array(["a b d"], dtype=object), "BYTES", False))
    result = triton.infer(SIM_MODEL, inputs, outputs=outputs(["relatedness"], False), request_id="req-7")
    response = result.get_response()
    assert [output["name"] for output in response["outputs"]] == ["relatedness"]
    assert (response["id"], response["model_name"], response["model_version"]) == (
        "req-7",
        SIM_MODEL,
        VERSIONS[SIM_MODEL],
    )


# -- errors in the protocol's shape ------------------------------------------------------------------------
def test_unknown_model_and_version_are_404(triton) -> None:
    one = kt_inputs(np.array([[1]]), np.array([[1]]), [1], binary=False)
    status, message = status_of(lambda: triton.infer("no-such-model", one))
    assert status == "404" and "no-such-model" in message and KT_MODEL in message
    assert status_of(lambda: triton.get_model_metadata("no-such-model"))[0] == "404"
    status, message = status_of(lambda: triton.infer(KT_MODEL, one, model_version="99.0.0"))
    assert status == "404" and f"it serves {VERSIONS[KT_MODEL]}" in message


def test_bad_tensors_are_400(triton) -> None:
    q, r = np.array([[1, 2]]), np.array([[1, 0]])
    wrong_type = [tensor("q", q.astype(np.int32), "INT32", False), *kt_inputs(q, r, [2], False)[1:]]
    status, message = status_of(lambda: triton.infer(KT_MODEL, wrong_type))
    assert status == "400" and "INT32" in message and "INT64" in message
    wrong_rank = [tensor("q", q[0], "INT64", False), *kt_inputs(q, r, [2], False)[1:]]
    status, message = status_of(lambda: triton.infer(KT_MODEL, wrong_rank))
    assert status == "400" and "input q has shape [2]" in message
    wrong_memory = kt_inputs(q, r, [2], False, memory=np.zeros((1, 3, 10)))
    status, message = status_of(lambda: triton.infer(KT_MODEL, wrong_memory))
    assert status == "400" and "mv_in" in message and "[-1, 5, 10]" in message
    missing = kt_inputs(q, r, [2], False)[:2]
    status, message = status_of(lambda: triton.infer(KT_MODEL, missing))
    assert status == "400" and "missing input(s) len" in message
    too_long = kt_inputs(q, r, [3], False)
    status, message = status_of(lambda: triton.infer(KT_MODEL, too_long))
    assert status == "400" and "len[0] is 3" in message
    padded_wide = np.ones((2, 5001), dtype=np.int64)  # 10002 steps with padding; the model's limit is 10000
    status, message = status_of(lambda: triton.infer(KT_MODEL, kt_inputs(padded_wide, padded_wide, [1, 1], True)))
    assert status == "400" and "2 x 5001 = 10002 steps" in message and "at most 10000" in message


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_question_id_out_of_range_is_400(triton, binary: bool) -> None:
    inputs = kt_inputs(np.array([[1, 2], [3, 51]]), np.array([[1, 0], [0, 1]]), [2, 2], binary)
    status, message = status_of(lambda: triton.infer(KT_MODEL, inputs))
    assert status == "400"
    assert "element [1, 1] is 51" in message and "1..50" in message
    padded = kt_inputs(np.array([[1, 999]]), np.array([[1, 0]]), [1], binary)  # past len: padding, ignored
    assert triton.infer(KT_MODEL, padded).as_numpy("p").shape == (1, 2)


def test_sentence_over_the_model_limit_is_400(triton) -> None:
    long_sentence = " ".join(["word"] * 80)
    inputs = [tensor("sentence_a", np.array(["a dog", long_sentence], dtype=object), "BYTES", False)]
    inputs.append(tensor("sentence_b", np.array(["a cat", "a cat"], dtype=object), "BYTES", False))
    status, message = status_of(lambda: triton.infer(SIM_MODEL, inputs))
    assert status == "400" and "sentence_a[1]" in message and "at most 64" in message


def test_malformed_bodies_are_400_in_the_protocol_shape(server: Server) -> None:
    url = f"{server.url}/v2/models/{KT_MODEL}/infer"
    cases = {
        "not json": b"{",
        "no inputs": b'{"inputs": []}',
        "strings for INT64": b'{"inputs": [{"name": "q", "shape": [1, 1], "datatype": "INT64", "data": ["x"]}]}',
        "too few elements": b'{"inputs": [{"name": "q", "shape": [1, 2], "datatype": "INT64", "data": [1]}]}',
        "unknown input": b'{"inputs": [{"name": "z", "shape": [1], "datatype": "INT64", "data": [1]}]}',
    }
    for case, body in cases.items():
        response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == 400, case
        assert set(response.json()) == {"error"}, case
    q = {"name": "q", "shape": [1, 1], "datatype": "INT64", "data": [1], "parameters": {"binary_data_size": 8}}
    header = json.dumps({"inputs": [q]}).encode()
    both = httpx.post(
        url,
        content=header + (1).to_bytes(8, "little"),
        headers={"content-type": "application/octet-stream", "inference-header-content-length": str(len(header))},
        timeout=30,
    )
    assert both.status_code == 400 and "both data and binary_data_size" in both.json()["error"]
    binary_q = {key: value for key, value in q.items() if key != "data"}
    no_header = httpx.post(url, json={"inputs": [binary_q]}, timeout=30)
    assert no_header.status_code == 400
    assert "send the Inference-Header-Content-Length header" in no_header.json()["error"]
    gzipped = httpx.post(
        url,
        content=gzip.compress(json.dumps({"inputs": [q]}).encode()),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
        timeout=30,
    )
    assert gzipped.status_code == 415 and "'gzip' is not supported" in gzipped.json()["error"]


def test_the_binary_header_length_must_be_ascii_digits(server: Server) -> None:
    url = f"{server.url}/v2/models/{KT_MODEL}/infer"
    for value in ("\u00b2".encode("latin-1"), b"9" * 5000, b"+12", b"12x"):
        response = httpx.post(url, content=b"{}", headers=[(b"inference-header-content-length", value)], timeout=30)
        assert response.status_code == 400, value
        assert "Inference-Header-Content-Length" in response.json()["error"], value


def step_inputs(rows: int, q: list, r: list | None = None, q_shape: list | None = None) -> dict:
    """A one-step-per-row KT request with JSON data as given (q's data and shape may be anything)."""
    return {
        "inputs": [
            {"name": "q", "shape": q_shape or [rows, 1], "datatype": "INT64", "data": q},
            {"name": "r", "shape": [rows, 1], "datatype": "INT64", "data": r if r is not None else [1] * rows},
            {"name": "len", "shape": [rows], "datatype": "INT64", "data": [1] * rows},
        ]
    }


HUGE = 987654321  # stands for a 4,000-digit integer: the JSON parser takes it, Python's json.dumps would not print it


# KT_MODEL's memory (5 slots x 10), its first number past the float range
MEMORY_OF_HUGE = {"name": "mv_in", "shape": [1, 5, 10], "datatype": "FP32", "data": [10**400] + [0.0] * 49}
MEMORY_PAST_FP32 = {**MEMORY_OF_HUGE, "data": [0.0, -1e39] + [0.0] * 48}  # a finite double, infinite as FP32


def huge_number(body: dict) -> bytes:
    return json.dumps(body).replace(str(HUGE), "1" + "0" * 3999).encode()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            step_inputs(3, [1, 2, 3], r=[1, False, True]),
            "input r: element 1 is false; INT64 data must be JSON integers",
        ),
        (step_inputs(3, [True, 12, 3]), "input q: element 0 is true"),
        (step_inputs(3, [1.5, 2, 3]), "input q: element 0 is 1.5"),
        (step_inputs(3, [2**64, 2, 3]), "INT64 holds -9223372036854775808..9223372036854775807"),
        (step_inputs(3, [1, 2, 3], q_shape=["3", "1"]), "inputs.0.shape.0"),
        (step_inputs(3, [1, 2, 3], q_shape=[3.0, 1.0]), "inputs.0.shape.0"),
        (step_inputs(3, [[[1]], [[2]], [[3]]]), "nested data must follow the shape [3, 1], or be flat"),
        (step_inputs(3, [[1, 2, 3]]), "nested data must follow the shape [3, 1], or be flat"),
        (huge_number(step_inputs(3, [HUGE, 2, 3])), "element 0 is an integer of about 4000 digits"),
        (huge_number(step_inputs(3, [1, 2, 3], q_shape=[HUGE, 1])), "inputs.0.shape.0"),
        (step_inputs(0, [], q_shape=[2**62, 0]), "inputs.0.shape.0: Input should be less than or equal to 2147483647"),
        ({"inputs": [*step_inputs(1, [1])["inputs"], MEMORY_OF_HUGE]}, "mv_in: element 0 is an integer of about"),
        (
            {"inputs": [*step_inputs(1, [1])["inputs"], MEMORY_PAST_FP32]},
            "input mv_in: element 1 is -1e+39; FP32 holds -3.4028235e+38..3.4028235e+38",
        ),
    ],
)
def test_json_tensor_data_must_hold_the_datatype_in_the_shape(server: Server, body: dict | bytes, message: str) -> None:
    url = f"{server.url}/v2/models/{KT_MODEL}/infer"
    if isinstance(body, bytes):
        response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        response = httpx.post(url, json=body, timeout=30)
    assert response.status_code == 400 and message in response.json()["error"]


def test_json_tensor_data_may_be_flat_or_nested_as_the_shape(server: Server) -> None:
    url = f"{server.url}/v2/models/{KT_MODEL}/infer"
    flat = httpx.post(url, json=step_inputs(3, [1, 2, 3]), timeout=30).json()
    nested = httpx.post(url, json=step_inputs(3, [[1], [2], [3]]), timeout=30).json()
    assert flat["outputs"] == nested["outputs"]


def test_more_histories_than_the_model_takes_are_400(server: Server) -> None:
    """Each row carries a whole memory in and out: 10,000 one-step rows asked for a 470 MB answer."""
    limit = next(entry for entry in manifest_models(COMMITTED) if entry["name"] == KT_MODEL)["limits"]["max_histories"]
    url = f"{server.url}/v2/models/{KT_MODEL}/infer"
    refused = httpx.post(url, json=step_inputs(limit + 1, [1] * (limit + 1)), timeout=30)
    assert refused.status_code == 400
    assert f"{limit + 1} rows; model {KT_MODEL} accepts at most {limit} histories" in refused.json()["error"]
    assert httpx.post(url, json=step_inputs(limit, [1] * limit), timeout=60).status_code == 200


def test_a_sentence_with_a_control_character_is_400(triton) -> None:
    inputs = [tensor("sentence_a", np.array(["a dog", "a\x00b"], dtype=object), "BYTES", False)]
    inputs.append(tensor("sentence_b", np.array(["a cat", "a cat"], dtype=object), "BYTES", False))
    status, message = status_of(lambda: triton.infer(SIM_MODEL, inputs))
    assert status == "400" and "sentence_a[1]" in message and "control characters" in message


def test_a_sentence_that_only_looks_like_text_is_400(triton) -> None:
    """Braille blanks and a lone combining mark show nothing: no word, as an empty sentence."""
    inputs = [tensor("sentence_a", np.array(["a dog", "a dog"], dtype=object), "BYTES", False)]
    inputs.append(tensor("sentence_b", np.array(["a cat", "\u2800\u2800 \u0301"], dtype=object), "BYTES", False))
    status, message = status_of(lambda: triton.infer(SIM_MODEL, inputs))
    assert status == "400" and "sentence_b[1]" in message and "no words" in message


def test_every_error_under_v2_is_in_the_protocol_shape(server: Server) -> None:
    """Not only the protocol's routes: FastAPI's 404 and 405 and the body limit's 413 too (tritonclient reads
    `error` only)."""
    answers = [
        httpx.post(f"{server.url}/v2/repository/models/{KT_MODEL}/load", timeout=10),
        httpx.get(f"{server.url}/v2/systemsharedmemory/status", timeout=10),
        httpx.get(f"{server.url}/v2/models/{KT_MODEL}/infer", timeout=10),
        httpx.post(f"{server.url}/v2/models/{KT_MODEL}/infer", content=b"x" * (3 << 20), timeout=30),
    ]
    assert [answer.status_code for answer in answers] == [404, 404, 405, 413]
    assert all(set(answer.json()) == {"error"} and answer.json()["error"] for answer in answers)
    assert set(httpx.get(f"{server.url}/nope", timeout=10).json()) == {"detail"}  # the task API keeps its own
    for answer in answers[:3]:  # HEAD: the same status and Content-Length as the reshaped GET, no body
        head = httpx.head(answer.request.url, timeout=10)
        assert (head.status_code, head.headers["content-length"]) == (answer.status_code, str(len(answer.content)))


# -- parameters: honoured or refused by name, never ignored ------------------------------------------------
def test_the_timeout_parameter_shortens_the_deadline(triton) -> None:
    """Triton's `timeout` (microseconds): 1 us has passed before the work starts; a longer one than the
    server's deadline, or 0, is the server's deadline."""
    one = kt_inputs(np.array([[1]]), np.array([[1]]), [1], binary=True)
    status, message = status_of(lambda: triton.infer(KT_MODEL, one, timeout=1))
    assert status == "504" and "the request's timeout parameter" in message
    for timeout in (0, 10**15, 2**63 - 1):
        assert triton.infer(KT_MODEL, one, timeout=timeout).as_numpy("p").shape == (1, 1)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"sequence_id": 5, "sequence_start": True}, "parameters.sequence_id is 5: the sequence extension"),
        ({"priority": 3}, "parameters.priority is 3: requests are not prioritised"),
        ({"parameters": {"my_custom": 1}}, "parameters.my_custom: not a parameter this server knows"),
    ],
)
def test_parameters_that_are_not_honoured_are_400(triton, keywords: dict, message: str) -> None:
    one = kt_inputs(np.array([[1]]), np.array([[1]]), [1], binary=False)
    status, error = status_of(lambda: triton.infer(KT_MODEL, one, **keywords))
    assert status == "400" and message in error


def test_a_classification_output_is_400(triton) -> None:
    one = kt_inputs(np.array([[1]]), np.array([[1]]), [1], binary=False)
    classes = [httpclient.InferRequestedOutput("p", class_count=2)]
    status, message = status_of(lambda: triton.infer(KT_MODEL, one, outputs=classes))
    assert status == "400" and "outputs[0].parameters.classification" in message


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"timeout": "abc"}, 'parameters.timeout is "abc"; it must be an integer count of microseconds'),
        ({"timeout": -1}, "parameters.timeout is -1"),
        ({"timeout": 1e30}, "parameters.timeout is 1e+30"),
        ({"timeout": 1.5}, "parameters.timeout is 1.5"),
        ({"timeout": float("nan")}, "parameters.timeout is NaN; it must be an integer count of microseconds within 0"),
        ({"timeout": float("inf")}, "parameters.timeout is Infinity; it must be an integer count of microseconds"),
        ({"priority": float("-inf")}, "parameters.priority is -Infinity: requests are not prioritised"),
        # values orjson cannot write (an integer past 64 bits in a list or object): they were a 500
        ({"content_type": [2**100]}, "parameters.content_type is [1267650600228229401496703205376]; it must be"),
        ({"priority": {"level": 2**64}}, 'parameters.priority is {"level":18446744073709551616}: requests are not'),
        ({"timeout": True}, "parameters.timeout is true"),
        ({"timeout": 2**63}, "parameters.timeout is 9223372036854775808"),
        ({"timeout": HUGE}, "parameters.timeout is an integer of about 4000 digits"),
        ({"priority": False}, "parameters.priority is false"),
        ({"sequence_end": True}, "parameters.sequence_end is true"),
        ({"binary_data_output": "yes"}, 'parameters.binary_data_output is "yes"; it must be true or false'),
        ({"shared_memory_region": "r"}, "parameters.shared_memory_region: the shared-memory extensions"),
    ],
)
def test_request_parameters_of_the_wrong_type_are_400(server: Server, parameters: dict, message: str) -> None:
    url = f"{server.url}/v2/models/{KT_MODEL}/infer"
    body = huge_number({**ONE_STEP, "parameters": parameters})
    response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400 and message in response.json()["error"]


def test_tensor_parameters_are_checked(server: Server) -> None:
    url = f"{server.url}/v2/models/{KT_MODEL}/infer"
    inputs = [{**ONE_STEP["inputs"][0], "parameters": {"binary_data": True}}, *ONE_STEP["inputs"][1:]]
    response = httpx.post(url, json={"inputs": inputs}, timeout=30)
    assert response.status_code == 400 and "inputs[0].parameters.binary_data: not a parameter" in response.text
    as_text = {**ONE_STEP, "outputs": [{"name": "p", "parameters": {"binary_data": "true"}}]}
    response = httpx.post(url, json=as_text, timeout=30)
    assert response.status_code == 400 and "outputs[0].parameters.binary_data is" in response.json()["error"]
    off = {**ONE_STEP, "parameters": {"priority": 0, "sequence_id": 0, "sequence_start": False, "timeout": 0}}
    assert httpx.post(url, json=off, timeout=30).status_code == 200
    hinted = [{**tensor, "parameters": {"content_type": "np"}} for tensor in ONE_STEP["inputs"]]
    mlserver_style = {"inputs": hinted, "parameters": {"content_type": "np"}, "outputs": [{"name": "p"}]}
    assert httpx.post(url, json=mlserver_style, timeout=30).status_code == 200  # MLServer's codec hints
    huge_size = {**ONE_STEP["inputs"][0], "data": None, "parameters": {"binary_data_size": [2**64]}}
    response = httpx.post(url, json={"inputs": [huge_size, *ONE_STEP["inputs"][1:]]}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"] == "input q: binary_data_size [18446744073709551616] must be a count of bytes"
    wrong_hint = {**ONE_STEP, "parameters": {"content_type": 1}}
    response = httpx.post(url, json=wrong_hint, timeout=30)
    assert response.status_code == 400 and "parameters.content_type is 1; it must be a string" in response.text


def test_outputs_named_twice_are_400_and_an_empty_list_means_all(server: Server) -> None:
    """Twice (the second, binary, request was dropped without a word) is refused; `outputs: []` returned
    no outputs at all, where Triton returns every output as when `outputs` is absent."""
    url = f"{server.url}/v2/models/{KT_MODEL}/infer"
    twice = {**ONE_STEP, "outputs": [{"name": "p"}, {"name": "p", "parameters": {"binary_data": True}}]}
    response = httpx.post(url, json=twice, timeout=30)
    assert response.status_code == 400 and response.json() == {"error": "output p is requested twice"}
    everything = httpx.post(url, json=ONE_STEP, timeout=30).json()
    assert httpx.post(url, json={**ONE_STEP, "outputs": []}, timeout=30).json() == everything
    assert [output["name"] for output in everything["outputs"]] == ["p", "corr_w", "mastery", "mv_out"]


# -- engine states, in-process on the real app ------------------------------------------------------------
ONE_STEP = {
    "inputs": [
        {"name": "q", "shape": [1, 1], "datatype": "INT64", "data": [1]},
        {"name": "r", "shape": [1, 1], "datatype": "INT64", "data": [1]},
        {"name": "len", "shape": [1], "datatype": "INT64", "data": [1]},
    ]
}


def test_a_full_queue_is_429(client: TestClient) -> None:
    """The rows bound alone: the held rows are one cell of work, so admitting them never depends on the loop's lag
    or the runs' costs the shared app has seen (MNEMO_MAX_QUEUE counts rows, whatever their cells)."""
    batcher = client.app.state.registry.models[KT_MODEL].batcher
    with batcher.admit(batcher.config.max_queue, 1):
        response = client.post(f"/v2/models/{KT_MODEL}/infer", json=ONE_STEP)
    assert response.status_code == 429 and response.headers["retry-after"]
    assert "at capacity" in response.json()["error"] and "MNEMO_MAX_QUEUE" in response.json()["error"]
    assert client.post(f"/v2/models/{KT_MODEL}/infer", json=ONE_STEP).status_code == 200


class _Probe(Exception):
    """Ends a probe of `_hold_all_but` as a failed request: one that fails at once does not move the pace."""


def _hold_all_but(batcher, room: int) -> int:
    """The most cells that can be held admitted while `room` more still fit before the deadline (a bisection
    over the batcher's own admission: nothing runs)."""
    low, high = 0, 10**12
    while low < high:
        middle = (low + high + 1) // 2
        try:
            with batcher.admit(1, middle), batcher.admit(1, room):
                raise _Probe
        except _Probe:
            low = middle
        except Overloaded:
            high = middle - 1
    return low


def test_a_history_is_admitted_by_its_steps_as_on_the_task_api() -> None:
    """10,000 steps that do not fit before the deadline are 429 on both endpoints. The protocol counted a history
    as its chunks times the batcher's typical row length, which next-question rows (one step each) keep near
    1: 10,000 steps were admitted as about 50, and the work ran on past the deadline."""
    model = "dkvmn-assist2009"  # 110 questions, chunks of 200 steps
    questions = np.random.default_rng(0).integers(1, 111, size=10_000)
    interactions = [{"question": int(question), "correct": True} for question in questions]
    protocol = {
        "inputs": [
            {"name": "q", "shape": [1, 10_000], "datatype": "INT64", "data": questions.tolist()},
            {"name": "r", "shape": [1, 10_000], "datatype": "INT64", "data": [1] * 10_000},
            {"name": "len", "shape": [1], "datatype": "INT64", "data": [10_000]},
        ],
        "outputs": [{"name": "p"}],
    }
    with app_client(COMMITTED) as client:

        def trace(count: int, **body) -> httpx.Response:
            return client.post("/knowledge-trace", json={"model": model, "interactions": interactions[:count], **body})

        batcher = client.app.state.registry.models[model].batcher
        # a loop taken as punctual (its sampling task stopped): admission then does not move with the test machine's
        # load between bisection and request
        client.portal.call(lambda: [t.cancel() for t in asyncio.all_tasks() if t.get_name() == "loop-lag"])
        client.app.state.loop_lag.recent_s = 0.0
        assert trace(200, next_questions=[]).status_code == 200  # one run of 200 steps: the cost of a step is learned
        for _ in range(20):  # a history of one step and its next-question rows, one step each
            assert trace(1).status_code == 200
        assert trace(4_000, next_questions=[]).status_code == 200  # large enough to teach admission its pace
        with batcher.admit(1, _hold_all_but(batcher, 2_000)):
            task = trace(10_000, next_questions=[])
            response = client.post(f"/v2/models/{model}/infer", json=protocol)
            fits = client.post(f"/v2/models/{model}/infer", json=step_inputs(1, [1]))
    assert task.status_code == 429, task.text
    assert response.status_code == 429 and "MNEMO_REQUEST_TIMEOUT_S" in response.json()["error"], response.text
    assert fits.status_code == 200, fits.text


def test_a_large_body_is_429_while_the_parse_queue_is_full() -> None:
    """A large body waits in the one bounded parse queue, or is 429 before it is parsed when the queue is full, as
    on the task endpoints (protocol bodies were parsed and decoded outside it: they neither waited in it nor
    counted in it, so a flood of them held up the parsing of every other request)."""
    interactions = [{"question": 1, "correct": True}] * 4_000
    protocol = {  # a body over 8 KB: parsed on a worker thread
        "inputs": [
            {"name": "q", "shape": [1, 4_000], "datatype": "INT64", "data": [1] * 4_000},
            {"name": "r", "shape": [1, 4_000], "datatype": "INT64", "data": [1] * 4_000},
            {"name": "len", "shape": [1], "datatype": "INT64", "data": [4_000]},
        ]
    }
    release = threading.Event()
    # the longest deadline: the 4,000 steps parsed once the queue is free need 20 runs, and admission on the default
    # 10 s counts the loop's lag once per run past the first, so a loaded machine (a lag of 0.3 s) rightly refuses
    # them; the parse queue's 429s do not depend on the deadline
    with app_client(COMMITTED, request_timeout_s=3600) as client:
        held = client.portal.start_task_soon(offload_or_shed, MAX_QUEUED_BYTES, release.wait)  # a full queue
        try:
            task = client.post("/knowledge-trace", json={"model": KT_MODEL, "interactions": interactions})
            response = client.post(f"/v2/models/{KT_MODEL}/infer", json=protocol)
        finally:
            release.set()
            held.result()
        assert client.post(f"/v2/models/{KT_MODEL}/infer", json=protocol).status_code == 200
    assert task.status_code == 429, task.text
    assert response.status_code == 429 and response.headers["retry-after"], response.text
    assert "busy reading other requests" in response.json()["error"]


def test_a_passed_deadline_is_504() -> None:
    with app_client(COMMITTED, request_timeout_s=1e-9) as client:
        response = client.post(f"/v2/models/{KT_MODEL}/infer", json=ONE_STEP)
    assert response.status_code == 504 and "MNEMO_REQUEST_TIMEOUT_S" in response.json()["error"]


def test_a_model_that_did_not_load_is_503(artifacts_copy: Path) -> None:
    (artifacts_copy / f"{KT_MODEL}.onnx").write_bytes(b"tampered")
    with app_client(artifacts_copy, on_model_error="skip") as client:
        assert client.get(f"/v2/models/{KT_MODEL}/ready").status_code == 503
        assert client.get("/v2/health/ready").status_code == 503
        response = client.post(f"/v2/models/{KT_MODEL}/infer", json=ONE_STEP)
        assert response.status_code == 503 and "sha256" in response.json()["error"]
        assert client.get(f"/v2/models/{SIM_MODEL}/ready").status_code == 200


def test_draining_is_live_not_ready_and_refuses_inference() -> None:
    with app_client(COMMITTED) as client:
        client.app.state.drain.begin()
        assert client.get("/v2/health/live").status_code == 200
        assert client.get("/v2/health/ready").status_code == 503
        draining = client.post(f"/v2/models/{KT_MODEL}/infer", json=ONE_STEP)
        assert draining.status_code == 503 and "shutting down" in draining.json()["error"]


def test_the_repository_index_gives_each_model_its_state(artifacts_copy: Path) -> None:
    """Triton's repository index: a model that did not load is UNAVAILABLE with the reason; `ready: true` lists
    the ready ones only; its statistics and config are 503 like its inference."""
    (artifacts_copy / f"{KT_MODEL}.onnx").write_bytes(b"tampered")
    with app_client(artifacts_copy, on_model_error="skip") as client:
        index = {entry["name"]: entry for entry in client.post("/v2/repository/index").json()}
        assert index[KT_MODEL]["state"] == "UNAVAILABLE" and "sha256" in index[KT_MODEL]["reason"]
        version = next(model["version"] for model in manifest_models(COMMITTED) if model["name"] == SIM_MODEL)
        assert index[SIM_MODEL] == {"name": SIM_MODEL, "version": version, "state": "READY", "reason": ""}
        ready = client.post("/v2/repository/index", json={"ready": True}).json()
        assert KT_MODEL not in {entry["name"] for entry in ready} and SIM_MODEL in {entry["name"] for entry in ready}
        refused = client.post("/v2/repository/index", json={"ready": "yes"})
        assert refused.status_code == 400 and "ready" in refused.json()["error"]
        assert client.get(f"/v2/models/{KT_MODEL}/stats").status_code == 503
        assert client.get(f"/v2/models/{KT_MODEL}/config").status_code == 503
        every = client.get("/v2/models/stats").json()["model_stats"]
        assert SIM_MODEL in {model["name"] for model in every} and KT_MODEL not in {model["name"] for model in every}
