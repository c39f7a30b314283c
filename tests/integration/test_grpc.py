"""The Open Inference Protocol over gRPC, spoken by the official `tritonclient.grpc` to a real server.

Its answers (inference, metadata, Triton's model config, statistics, repository index) must equal REST v2's as
`tritonclient.http` reads them from the same server, and the inference the task API's. The engine's states
(a full queue, a deadline shorter than the queue, SIGTERM with calls in flight) are reached with real work; a
full queue, API keys and hostile messages run on the app in-process, its gRPC server on a loopback port.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import COMMITTED, KT_MODEL, SIM_MODEL, manifest_models
from tests.helpers import ROOT, HeldRequest, Server, app_client, free_port, running_server

grpcclient = pytest.importorskip("tritonclient.grpc", reason="the gRPC test needs the dev extra (tritonclient)")
import tritonclient.grpc.model_config_pb2 as model_config_pb2  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

PAIRS = [("A man is playing a guitar.", "A person plays the guitar."), ("A dog runs", "The cat is sleeping")]
INFERENCE_SERVICE = "inference.GRPCInferenceService"
INFER_METHOD = f"/{INFERENCE_SERVICE}/ModelInfer"
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Server, str]]:
    port = free_port()
    with running_server(COMMITTED, MNEMO_GRPC_PORT=str(port)) as running:
        yield running, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def clients(server) -> Iterator[tuple[grpcclient.InferenceServerClient, httpclient.InferenceServerClient]]:
    running, address = server
    over_grpc = grpcclient.InferenceServerClient(address)
    over_rest = httpclient.InferenceServerClient(running.url.removeprefix("http://"))
    yield over_grpc, over_rest
    over_grpc.close()
    over_rest.close()


def kt_inputs(client_module, questions: np.ndarray, answers: np.ndarray, lengths: list[int]) -> list:
    inputs = []
    for name, array in (("q", questions), ("r", answers), ("len", np.array(lengths))):
        tensor = client_module.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array.astype(np.int64))
        inputs.append(tensor)
    return inputs


def sentences(client_module, pairs: list[tuple[str, str]]) -> list:
    inputs = []
    for index, name in enumerate(("sentence_a", "sentence_b")):
        tensor = client_module.InferInput(name, [len(pairs)], "BYTES")
        tensor.set_data_from_numpy(np.array([pair[index].encode() for pair in pairs], dtype=np.object_))
        inputs.append(tensor)
    return inputs


def grpc_status(call) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status(), caught.value.message()


def history(rows: int, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[int]]:
    generator = np.random.default_rng(seed)
    return generator.integers(1, 11, size=(rows, steps)), generator.integers(0, 2, size=(rows, steps)), [steps] * rows


def metric(server: Server, name: str, labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    return float(found[1]) if found else 0.0


# -- equal to REST ----------------------------------------------------------------------------------------
def test_health_metadata_and_config_equal_rest(clients) -> None:
    over_grpc, over_rest = clients
    assert over_grpc.is_server_live() and over_grpc.is_server_ready()
    assert over_grpc.get_server_metadata().name == over_rest.get_server_metadata()["name"] == "mnemo"
    extensions = set(over_grpc.get_server_metadata().extensions)
    assert extensions == {"model_configuration", "statistics"} < set(over_rest.get_server_metadata()["extensions"])
    for model in (KT_MODEL, SIM_MODEL):
        assert over_grpc.is_model_ready(model)
        metadata = json_format.ParseDict(over_rest.get_model_metadata(model), service_pb2.ModelMetadataResponse())
        assert over_grpc.get_model_metadata(model) == metadata
        config = json_format.ParseDict(over_rest.get_model_config(model), model_config_pb2.ModelConfig())
        assert over_grpc.get_model_config(model).config == config
        assert config.max_batch_size == 32 and config.dynamic_batching.max_queue_delay_microseconds == 2000
    kt_config = over_grpc.get_model_config(KT_MODEL).config
    assert [(tensor.name, list(tensor.dims)) for tensor in kt_config.input] == [
        ("q", [-1]),
        ("r", [-1]),
        ("len", []),
        ("mv_in", [5, 10]),
    ]
    index = over_grpc.get_model_repository_index()
    rest_index = over_rest.get_model_repository_index()
    assert index == json_format.ParseDict({"models": rest_index}, service_pb2.RepositoryIndexResponse())
    assert {KT_MODEL, SIM_MODEL} <= {model.name for model in index.models}
    assert {model.state for model in index.models} == {"READY"}


def test_unknown_model_is_not_found(clients) -> None:
    over_grpc, _ = clients
    status, message = grpc_status(lambda: over_grpc.get_model_metadata("nope"))
    assert status == "StatusCode.NOT_FOUND" and "Unknown model 'nope'" in message
    status, message = grpc_status(lambda: over_grpc.get_model_config(KT_MODEL, model_version="9"))
    assert status == "StatusCode.NOT_FOUND" and "has no version '9'" in message


def test_knowledge_trace_equals_rest_and_the_task_api(server, clients) -> None:
    running, _ = server
    over_grpc, over_rest = clients
    questions, answers, lengths = history(3, 12)
    lengths[1] = 7
    by_grpc = over_grpc.infer(KT_MODEL, kt_inputs(grpcclient, questions, answers, lengths))
    by_rest = over_rest.infer(KT_MODEL, kt_inputs(httpclient, questions, answers, lengths))
    for name in ("p", "mv_out", "corr_w", "mastery"):
        assert np.allclose(by_grpc.as_numpy(name), by_rest.as_numpy(name), atol=1e-5), name
    interactions = [
        {"question": int(q), "correct": bool(r)} for q, r in zip(questions[1, :7], answers[1, :7], strict=True)
    ]
    task = httpx.post(f"{running.url}/knowledge-trace", json={"model": KT_MODEL, "interactions": interactions})
    assert task.status_code == 200, task.text
    assert np.allclose(by_grpc.as_numpy("p")[1, :7], task.json()["predictions"], atol=1e-5)


def test_similarity_equals_rest(clients) -> None:
    over_grpc, over_rest = clients
    by_grpc = over_grpc.infer(SIM_MODEL, sentences(grpcclient, PAIRS), request_id="pair-1")
    by_rest = over_rest.infer(SIM_MODEL, sentences(httpclient, PAIRS))
    assert by_grpc.get_response().id == "pair-1"
    for name in ("relatedness", "entailment_probabilities"):
        assert np.allclose(by_grpc.as_numpy(name), by_rest.as_numpy(name), atol=1e-5), name
    for name in ("tokens_a", "tokens_b"):
        assert by_grpc.as_numpy(name).tolist() == by_rest.as_numpy(name).tolist()


def test_statistics_count_the_engine_work_and_equal_rest(clients) -> None:
    over_grpc, over_rest = clients
    before = over_grpc.get_inference_statistics(KT_MODEL).model_stats[0]
    questions, answers, lengths = history(2, 5, seed=1)
    for _ in range(3):
        over_grpc.infer(KT_MODEL, kt_inputs(grpcclient, questions, answers, lengths))
    after = over_grpc.get_inference_statistics(KT_MODEL)
    assert after == json_format.ParseDict(
        over_rest.get_inference_statistics(KT_MODEL), service_pb2.ModelStatisticsResponse()
    )
    stats = after.model_stats[0]
    assert (stats.name, stats.version) == (KT_MODEL, manifest_version(KT_MODEL))
    assert stats.inference_stats.success.count == before.inference_stats.success.count + 3
    assert stats.inference_stats.success.ns > before.inference_stats.success.ns
    assert stats.inference_count >= before.inference_count + 6  # two rows per request
    assert stats.execution_count > before.execution_count
    assert stats.inference_stats.compute_infer.count == stats.execution_count
    assert sum(batch.compute_infer.count for batch in stats.batch_stats) == stats.execution_count
    assert stats.last_inference >= before.last_inference
    every = over_grpc.get_inference_statistics()
    assert KT_MODEL in {model.name for model in every.model_stats}
    status, message = grpc_status(lambda: over_grpc.get_inference_statistics(model_version="9"))  # was all models
    assert status == "StatusCode.INVALID_ARGUMENT" and "version '9' names no model" in message


# -- statuses ---------------------------------------------------------------------------------------------
def raw_request(model: str, tensors: list[tuple[str, list[int], np.ndarray]]) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest with raw contents, each tensor's shape as given (it may disagree with its data)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, shape, array in tensors:
        request.inputs.add(name=name, datatype="INT64", shape=shape)
        request.raw_input_contents.append(array.astype("<i8").tobytes())
    return request


def test_bad_tensors_are_invalid_argument_and_the_server_keeps_serving(server, clients) -> None:
    _, address = server
    over_grpc, _ = clients
    questions, answers, lengths = history(1, 4)
    bad_id = kt_inputs(grpcclient, questions + 500, answers, lengths)
    status, message = grpc_status(lambda: over_grpc.infer(KT_MODEL, bad_id))
    assert status == "StatusCode.INVALID_ARGUMENT" and "element [0, 0]" in message
    without_q = kt_inputs(grpcclient, questions, answers, lengths)[1:]
    status, message = grpc_status(lambda: over_grpc.infer(KT_MODEL, without_q))
    assert status == "StatusCode.INVALID_ARGUMENT" and "missing input(s) q" in message
    with grpc.insecure_channel(address) as channel:
        infer = channel.unary_unary(INFER_METHOD)
        lying = raw_request(KT_MODEL, [("q", [1, 5], questions), ("r", [1, 5], answers), ("len", [1], np.array([4]))])
        with pytest.raises(grpc.RpcError) as caught:  # the shapes say 5 steps, the data holds 4
            infer(lying.SerializeToString(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input q: shape [1, 5] needs 40 bytes, got 32" in caught.value.details()
        del lying.raw_input_contents[-1]
        with pytest.raises(grpc.RpcError) as caught:
            infer(lying.SerializeToString(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "raw_input_contents has 2 entries for 3 inputs" in caught.value.details()
        with pytest.raises(grpc.RpcError) as caught:
            infer(b"\xff\xff\xff\xff not a protobuf", timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert "not a ModelInferRequest" in caught.value.details()
        typed = service_pb2.ModelInferRequest(model_name=KT_MODEL)
        for name, shape, values in (("q", [1, 2], [1, 2]), ("r", [1, 2], [0, 1]), ("len", [1], [2])):
            tensor = typed.inputs.add(name=name, datatype="INT64", shape=shape)
            tensor.contents.int64_contents.extend(values)
        answer = service_pb2.ModelInferResponse.FromString(infer(typed.SerializeToString(), timeout=10))
        assert [output.name for output in answer.outputs] == ["p", "corr_w", "mastery", "mv_out"]
        typed.inputs[0].contents.fp32_contents.append(1.0)
        with pytest.raises(grpc.RpcError) as caught:
            infer(typed.SerializeToString(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "INT64 data goes in contents.int64_contents, not contents.fp32_contents" in caught.value.details()
    assert over_grpc.is_server_ready()


def test_an_oversized_message_is_resource_exhausted_and_the_server_keeps_serving() -> None:
    port = free_port()
    with (
        app_client(COMMITTED, grpc_port=port, max_body_bytes=64 * 1024),
        grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client,
    ):
        questions, answers, lengths = history(1, 9_000)
        status, message = grpc_status(
            lambda: client.infer(KT_MODEL, kt_inputs(grpcclient, questions, answers, lengths))
        )
        assert status == "StatusCode.RESOURCE_EXHAUSTED" and "larger than max" in message
        questions, answers, lengths = history(1, 3)
        assert client.infer(KT_MODEL, kt_inputs(grpcclient, questions, answers, lengths)).as_numpy("p").shape == (1, 3)


def test_a_full_queue_is_resource_exhausted_with_retry_after() -> None:
    port = free_port()
    with app_client(COMMITTED, grpc_port=port) as served:
        batcher = served.app.state.registry.models[KT_MODEL].batcher
        questions, answers, lengths = history(1, 3)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = channel.unary_unary(INFER_METHOD)
            tensors = [("q", [1, 3], questions), ("r", [1, 3], answers), ("len", [1], np.array(lengths))]
            request = raw_request(KT_MODEL, tensors)
            # the queue filled as tests/integration/test_oip.py fills it
            with batcher.admit(batcher.config.max_queue), pytest.raises(grpc.RpcError) as caught:
                infer(request.SerializeToString(), timeout=10)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "at capacity" in caught.value.details()
            assert ("retry-after", "1") in caught.value.trailing_metadata()
            assert service_pb2.ModelInferResponse.FromString(infer(request.SerializeToString(), timeout=10)).outputs


def test_api_keys_guard_grpc_as_rest() -> None:
    port = free_port()
    with (
        app_client(COMMITTED, grpc_port=port, api_keys="k-one,k-two"),
        grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client,
    ):
        assert client.is_server_live()  # /v2/health/live is an open path
        status, message = grpc_status(lambda: client.get_model_metadata(KT_MODEL))
        assert status == "StatusCode.UNAUTHENTICATED" and "authorization: Bearer <key>" in message
        status, _ = grpc_status(lambda: client.get_model_metadata(KT_MODEL, headers={"authorization": "Bearer nope"}))
        assert status == "StatusCode.UNAUTHENTICATED"
        assert client.get_model_metadata(KT_MODEL, headers={"authorization": "Bearer k-two"}).name == KT_MODEL


def test_a_model_name_holding_a_slash_is_not_another_open_path() -> None:
    port = free_port()
    with (
        app_client(COMMITTED, grpc_port=port, api_keys="k-one", open_paths=f"/v2/models/{KT_MODEL}/ready"),
        grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client,
    ):
        assert client.is_model_ready(KT_MODEL)  # the open path
        status, _ = grpc_status(lambda: client.get_model_metadata(f"{KT_MODEL}/ready"))  # "/v2/models/{name}"
        assert status == "StatusCode.UNAUTHENTICATED"  # not NOT_FOUND with the models listed


def health_of(address: str, service: str) -> int:
    """The status grpc.health.v1.Health/Check gives `service` (what Kubernetes' grpc probe asks)."""
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status


def test_health_service_serves_the_server_and_the_inference_service(server) -> None:
    _, address = server
    assert health_of(address, "") == health_of(address, INFERENCE_SERVICE) == SERVING
    with pytest.raises(grpc.RpcError) as caught:
        health_of(address, "no.such.Service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_is_not_serving_while_a_model_is_not_ready(artifacts_copy: Path) -> None:
    (artifacts_copy / f"{KT_MODEL}.onnx").write_bytes(b"tampered")
    port = free_port()
    with app_client(artifacts_copy, grpc_port=port, on_model_error="skip", api_keys="k-one") as client:
        assert client.get("/v2/health/ready").status_code == 503
        address = f"127.0.0.1:{port}"
        assert health_of(address, "") == health_of(address, INFERENCE_SERVICE) == NOT_SERVING  # open: no key
        with grpcclient.InferenceServerClient(address) as triton:  # REST's 503 is ready=false over gRPC
            key = {"authorization": "Bearer k-one"}
            assert not triton.is_model_ready(KT_MODEL, headers=key) and triton.is_model_ready(SIM_MODEL, headers=key)


def test_health_turns_not_serving_when_the_drain_begins_and_watchers_are_told() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    with app_client(COMMITTED, grpc_port=port) as client, grpc.insecure_channel(address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(watch).status == SERVING
        client.app.state.drain.begin()
        assert next(watch).status == NOT_SERVING
        watch.cancel()
        assert health_of(address, "") == health_of(address, INFERENCE_SERVICE) == NOT_SERVING


# -- bounded concurrency: MNEMO_MAX_CONNECTIONS calls in flight, the rest RESOURCE_EXHAUSTED at once ------------
def hold_every_slot(channel: grpc.Channel, request: bytes, count: int) -> tuple[list[grpc.Future], threading.Event]:
    """`count` ModelInfer calls in flight at the server, each with its message held back until the event is set.

    A probe call refused RESOURCE_EXHAUSTED while every held call is still open shows the server holds all of them.
    A held call that raced a probe for the last slot was itself refused; it is started again."""
    release = threading.Event()

    def message() -> Iterator[bytes]:
        release.wait(60)
        yield request

    stream, probe = channel.stream_unary(INFER_METHOD), channel.unary_unary(INFER_METHOD)
    held: list[grpc.Future] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        held = [call for call in held if not call.done()]
        held += [stream.future(message(), timeout=60) for _ in range(count - len(held))]
        time.sleep(0.02)
        try:
            probe(request, timeout=10)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            if not any(call.done() for call in held):
                return held, release
    release.set()
    raise AssertionError("the held calls never filled the server's slots")


def test_calls_past_max_connections_are_resource_exhausted_at_once_and_the_server_keeps_serving() -> None:
    port = free_port()
    questions, answers, lengths = history(1, 3)
    tensors = [("q", [1, 3], questions), ("r", [1, 3], answers), ("len", [1], np.array(lengths))]
    request = raw_request(KT_MODEL, tensors).SerializeToString()
    with (
        app_client(COMMITTED, grpc_port=port, max_connections=2),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        infer = channel.unary_unary(INFER_METHOD)
        held, release = hold_every_slot(channel, request, 2)
        try:

            def refused(_: int) -> tuple[grpc.StatusCode, str]:
                try:
                    infer(request, timeout=10)
                except grpc.RpcError as error:
                    return error.code(), error.details()
                return grpc.StatusCode.OK, ""

            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(refused, range(16)))
            # refused, not queued behind the held calls until the client's deadline
            assert answers == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")] * 16
            with pytest.raises(grpc.RpcError) as caught:
                health_of(f"127.0.0.1:{port}", "")
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # every call counts
        finally:
            release.set()
        for call in held:
            assert service_pb2.ModelInferResponse.FromString(call.result(timeout=30)).outputs
        assert service_pb2.ModelInferResponse.FromString(infer(request, timeout=10)).outputs


# -- deadline, cancellation and drain, with real work ---------------------------------------------------------
FLOOD_MODEL = "dkvmn-assist2009"  # the largest knowledge-tracing model: 20 concepts, memory 20 x 200
FLOOD_STEPS = 10_000  # a chain of 50 chunks of 200 steps, run one after another
# the flood tests' server: admission refuses what is predicted past a quarter of its deadline (300 s), and a loaded
# machine's cost model predicted a flood call of 12 at 30.5 s (a quarter of 120 s is 30 s)
FLOOD_SERVER = {"MNEMO_REQUEST_TIMEOUT_S": "1200", "MNEMO_MAX_QUEUE": "4096"}


def flood(client: grpcclient.InferenceServerClient, count: int) -> list:
    """`count` calls of one history of FLOOD_STEPS steps each, in flight at once; their results as they come."""
    results: list = []
    questions, answers, lengths = history(1, FLOOD_STEPS)
    for _ in range(count):
        client.async_infer(
            FLOOD_MODEL,
            kt_inputs(grpcclient, questions, answers, lengths),
            callback=lambda result, error: results.append(error or result),
            outputs=[grpcclient.InferRequestedOutput("p")],
        )
    return results


def wait_admitted(server: Server) -> None:
    deadline = time.monotonic() + 30
    while metric(server, "mnemo_admitted_rows", f'model="{FLOOD_MODEL}"') == 0:
        assert time.monotonic() < deadline, "the flood was never admitted"
        time.sleep(0.02)


def test_a_deadline_shorter_than_the_queue_is_deadline_exceeded_and_drops_the_work() -> None:
    port = free_port()
    environment = {"MNEMO_GRPC_PORT": str(port), **FLOOD_SERVER}
    with running_server(COMMITTED, **environment) as running:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        results = flood(client, 12)
        wait_admitted(running)
        questions, answers, lengths = history(1, 3)
        started = time.monotonic()
        status, message = grpc_status(
            lambda: client.infer(FLOOD_MODEL, kt_inputs(grpcclient, questions, answers, lengths), client_timeout=0.5)
        )
        assert status == "StatusCode.DEADLINE_EXCEEDED" and time.monotonic() - started < 1.5
        # the server's answer (before the client's own deadline), counted as its time-outs
        assert re.search(r"did not complete within 0\.\d+ s \(the gRPC deadline\)", message), message
        assert metric(running, "mnemo_requests_timed_out_total", f'model="{FLOOD_MODEL}"') == 1
        assert len(results) < 12, "the flood was done before the deadline: it no longer makes a queue"
        deadline = time.monotonic() + 120
        while len(results) < 12 and time.monotonic() < deadline:
            time.sleep(0.1)
        errors = [str(result) for result in results if isinstance(result, Exception)]
        assert not errors, errors
        client.close()


def test_a_cancelled_call_drops_its_queued_work() -> None:
    """The client cancels a call queued behind a flood: grpc cancels its handler, whose rows leave the queue
    unrun (the model's executions are the flood's alone) and which the statistics count as failed."""
    port = free_port()
    environment = {"MNEMO_GRPC_PORT": str(port), **FLOOD_SERVER}
    with running_server(COMMITTED, **environment) as running:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        before = client.get_inference_statistics(FLOOD_MODEL).model_stats[0]
        results = flood(client, 8)
        wait_admitted(running)
        queued = client.async_infer(
            FLOOD_MODEL,
            kt_inputs(grpcclient, *history(1, FLOOD_STEPS, seed=2)),
            callback=lambda result, error: results.append(error or result),
        )
        time.sleep(0.2)  # queued behind the flood
        queued.cancel()
        deadline = time.monotonic() + 120
        while len(results) < 9 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sum(isinstance(result, InferenceServerException) for result in results) == 1, results
        while metric(running, "mnemo_grpc_requests_total", 'code="CANCELLED",method="ModelInfer"') != 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        stats = client.get_inference_statistics(FLOOD_MODEL).model_stats[0]
        assert stats.inference_stats.success.count == before.inference_stats.success.count + 8
        assert stats.inference_stats.fail.count == before.inference_stats.fail.count + 1
        chunks = FLOOD_STEPS // 200
        assert stats.execution_count == before.execution_count + 8 * chunks
        client.close()


def test_sigterm_answers_the_calls_in_flight_and_refuses_new_ones() -> None:
    port = free_port()
    with running_server(COMMITTED, MNEMO_GRPC_PORT=str(port), MNEMO_REQUEST_TIMEOUT_S="120") as running:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        results = flood(client, 6)
        wait_admitted(running)
        held = HeldRequest(running.url, "/knowledge-trace", b'{"model": "%s", "interactions": []}' % KT_MODEL.encode())
        running.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while health_of(f"127.0.0.1:{port}", "") == SERVING:  # the signal handler tells the health service
            assert time.monotonic() < deadline
            time.sleep(0.02)
        while len(results) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(results) == 6, results
        assert all(result.as_numpy("p").shape == (1, FLOOD_STEPS) for result in results), results
        questions, answers, lengths = history(1, 3)
        status, message = grpc_status(
            lambda: client.infer(FLOOD_MODEL, kt_inputs(grpcclient, questions, answers, lengths))
        )
        assert status == "StatusCode.UNAVAILABLE" and "shutting down" in message
        held.finish()
        assert running.process.wait(timeout=60) == 0
        client.close()


def test_a_grpc_port_in_use_stops_the_start_in_one_line() -> None:
    """A gRPC port another process holds stops the start before any model loads, in one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        environment = {**os.environ, "MNEMO_PORT": str(free_port()), "MNEMO_GRPC_PORT": str(port)}
        environment.update(MNEMO_ARTIFACTS_DIR=str(COMMITTED), MNEMO_PROVIDER="cpu", MNEMO_HOST="127.0.0.1")
        done = subprocess.run(
            [sys.executable, "-m", "app"], env=environment, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 1
    expected = (
        f"mnemo: cannot start: cannot listen on 127.0.0.1:{port} (MNEMO_HOST:MNEMO_GRPC_PORT): Address already in use"
    )
    assert done.stderr.strip().splitlines()[-1] == expected


def message(model: str = KT_MODEL, **fields) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest for `model`; `inputs` as (name, datatype, shape, raw bytes) tuples."""
    request = service_pb2.ModelInferRequest(model_name=model, id=fields.get("id", ""))
    for name, datatype, shape, raw in fields.get("inputs", ()):
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    return request


def int64s(*values: int) -> bytes:
    return np.array(values, dtype="<i8").tobytes()


ONE_STEP = [("q", "INT64", [1, 1], int64s(1)), ("r", "INT64", [1, 1], int64s(1)), ("len", "INT64", [1], int64s(1))]
UNSET_PARAMETER = message(inputs=ONE_STEP)
UNSET_PARAMETER.parameters["priority"].Clear()
SEQUENCE = message(inputs=ONE_STEP)
SEQUENCE.parameters["sequence_id"].int64_param = 5
NAN_TIMEOUT, INFINITE_PRIORITY = message(inputs=ONE_STEP), message(inputs=ONE_STEP)
NAN_TIMEOUT.parameters["timeout"].double_param = float("nan")
INFINITE_PRIORITY.parameters["priority"].double_param = float("inf")
TYPED_NOT_UTF8 = message(SIM_MODEL)  # typed contents, one element not UTF-8
for name, elements in (("sentence_a", [b"a", b"\xff"]), ("sentence_b", [b"a", b"b"])):
    TYPED_NOT_UTF8.inputs.add(name=name, datatype="BYTES", shape=[2]).contents.bytes_contents.extend(elements)
VALID = message(inputs=ONE_STEP).SerializeToString()
HOSTILE = [
    (message(inputs=[("q", "INT64", [2**32, 2**32], b""), *ONE_STEP[1:]]).SerializeToString(), "shape"),
    (message(inputs=[("q", "INT64", [-1, 1], int64s(1)), *ONE_STEP[1:]]).SerializeToString(), "has shape [-1, 1]"),
    (message(inputs=[("q", "INT64", [1] * 9, int64s(1)), *ONE_STEP[1:]]).SerializeToString(), "shape"),
    (message(inputs=[("q", "INT128", [1, 1], int64s(1)), *ONE_STEP[1:]]).SerializeToString(), "datatype INT128"),
    (
        message(inputs=[*ONE_STEP, ("mv_in", "FP32", [1, 5, 10], b"\x00\x00\xc0\x7f" * 50)]).SerializeToString(),
        "NaN",
    ),
    (message(inputs=[*ONE_STEP, *[("extra", "INT64", [1], int64s(1))] * 62]).SerializeToString(), "inputs"),
    (
        message(
            SIM_MODEL, inputs=[("sentence_a", "BYTES", [1], b"\x05\x00\x00"), ("sentence_b", "BYTES", [1], b"")]
        ).SerializeToString(),
        "truncated BYTES",
    ),
    (
        message(
            SIM_MODEL,
            inputs=[
                ("sentence_a", "BYTES", [1], b"\x01\x00\x00\x00\xff"),
                ("sentence_b", "BYTES", [1], b"\x01\x00\x00\x00a"),
            ],
        ).SerializeToString(),
        "not UTF-8 text",
    ),
    (TYPED_NOT_UTF8.SerializeToString(), "inputs[0] (sentence_a): BYTES element 1 is not UTF-8 text"),
    (message(SIM_MODEL, inputs=ONE_STEP).SerializeToString(), "unknown input 'q'"),
    (UNSET_PARAMETER.SerializeToString(), "parameters.priority holds no value"),
    (SEQUENCE.SerializeToString(), "the sequence extension is not offered"),
    (
        NAN_TIMEOUT.SerializeToString(),
        "parameters.timeout is NaN; it must be an integer count of microseconds within 0..9223372036854775807",
    ),
    (INFINITE_PRIORITY.SerializeToString(), "parameters.priority is Infinity: requests are not prioritised"),
    (VALID[:-3], "does not parse"),
    (b"\x1a\x02\xff\xfe" + VALID, "does not parse"),  # the request id (a proto3 string) not in UTF-8
]


@pytest.mark.parametrize(("payload", "words"), HOSTILE, ids=lambda value: repr(value)[:40])
def test_hostile_messages_are_invalid_argument_and_the_server_lives(server, clients, payload: bytes, words: str):
    _, address = server
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(INFER_METHOD)(payload, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert words in caught.value.details()
    assert clients[0].is_server_ready()


@pytest.mark.parametrize("method", ["ServerLive", "ModelMetadata", "ModelConfig", "RepositoryIndex", "ModelInfer"])
def test_a_malformed_message_to_any_rpc_is_invalid_argument_and_counted(server, method: str) -> None:
    """Each RPC decodes its own message: grpc's decoder answered UNKNOWN with the exception's class, uncounted."""
    running, address = server
    before = metric(running, "mnemo_grpc_requests_total", f'code="INVALID_ARGUMENT",method="{method}"')
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(f"/{INFERENCE_SERVICE}/{method}")(b"\xff\xff\xff\xff not a protobuf", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert f"The message is not a {method}Request ({INFERENCE_SERVICE}): it does not parse." == caught.value.details()
    after = metric(running, "mnemo_grpc_requests_total", f'code="INVALID_ARGUMENT",method="{method}"')
    assert after == before + 1


def manifest_version(name: str) -> str:
    return next(model["version"] for model in manifest_models(COMMITTED) if model["name"] == name)
