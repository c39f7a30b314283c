"""The /students endpoints against a real server (`python -m app`) and the real stores: SQLite files in a tmp
dir and a redis-server started here (AOF, fsync always). Model: the committed dkvmn-assist2009."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest
import redis

from app.students.io import open_store
from tests.conftest import COMMITTED
from tests.helpers import Server, app_client, running_server
from tests.redis_server import RedisServer, require_redis_server

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

MODEL = "dkvmn-assist2009"
OTHER_MODEL = "dkvmn-synthetic"
N_QUESTIONS = 110
TOLERANCE = 1e-5
WRITERS = 6
APPENDS_PER_WRITER = 15
ACKED_BEFORE_KILL = 30


# -- fixtures and helpers -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(require_redis_server(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path_factory.mktemp('state') / 'students.db'}"
    return request.getfixturevalue("redis_server").url()


@pytest.fixture(scope="module")
def api(store_url: str) -> Iterator[httpx.Client]:
    """A real server on the committed models over `store_url`, and a client of it."""
    with running_server(COMMITTED, MNEMO_STATE_URL=store_url) as server, client_of(server) as client:
        yield client


def client_of(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=60)


def history(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    questions, answers = rng.integers(1, N_QUESTIONS + 1, count), rng.integers(0, 2, count)
    return [{"question": int(q), "correct": bool(c)} for q, c in zip(questions, answers, strict=True)]


def student(student_id: str) -> str:
    return f"/students/{quote(student_id, safe='')}"


def append(client: httpx.Client, student_id: str, interactions: list[dict], **fields) -> httpx.Response:
    return client.post(
        f"{student(student_id)}/interactions", json={"model": MODEL, "interactions": interactions, **fields}
    )


def stateless(client: httpx.Client, interactions: list[dict]) -> dict:
    body = {"model": MODEL, "interactions": interactions, "next_questions": [], "return_attention": False}
    response = client.post("/knowledge-trace", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def unique_id(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns()}"


# -- behaviour on both stores ----------------------------------------------------------------------------
def test_one_by_one_over_http_equals_one_stateless_call_over_the_whole_history(api: httpx.Client) -> None:
    student_id, steps = unique_id("one-by-one"), history(450, seed=9)
    predictions = []
    for step in steps:
        response = append(api, student_id, [step])
        assert response.status_code == 200, response.text
        predictions += response.json()["predictions"]
    whole = stateless(api, steps)
    np.testing.assert_allclose(predictions, whole["predictions"], atol=TOLERANCE, rtol=0)
    state = api.get(student(student_id), params={"model": MODEL}).json()
    assert state["interactions"] == 450
    np.testing.assert_allclose(state["mastery"], whole["mastery"][-1], atol=TOLERANCE, rtol=0)
    assert response.json()["mastery"] == pytest.approx(whole["mastery"][-1], abs=TOLERANCE)


def test_appending_a_batch_equals_appending_one_by_one(api: httpx.Client) -> None:
    steps = history(260, seed=3)  # longer than seqlen 200: the batch runs in two chunks from the stored memory
    batched_id, single_id = unique_id("batched"), unique_id("single")
    first = append(api, batched_id, steps[:5]).json()
    second = append(api, batched_id, steps[5:], next_questions=[3, 7]).json()
    singles = [append(api, single_id, [step]).json()["predictions"][0] for step in steps]
    np.testing.assert_allclose(first["predictions"] + second["predictions"], singles, atol=TOLERANCE, rtol=0)
    assert second["interactions"] == 260
    assert [item["question"] for item in second["next"]] == [3, 7]
    whole = api.post(
        "/knowledge-trace", json={"model": MODEL, "interactions": steps, "next_questions": [3, 7], "mastery": "none"}
    ).json()
    np.testing.assert_allclose(
        [item["p_correct"] for item in second["next"]], [item["p_correct"] for item in whole["next"]], atol=TOLERANCE
    )


def test_concurrent_writers_over_http_lose_nothing(api: httpx.Client) -> None:
    """Each acknowledged append gets its own count; replaying them in that order gives the stored mastery."""
    student_id = unique_id("busy")
    answers = {writer: history(APPENDS_PER_WRITER, seed=100 + writer) for writer in range(WRITERS)}

    def writer(index: int) -> list[tuple[int, dict]]:
        acknowledged = []
        for step in answers[index]:
            response = append(api, student_id, [step])
            assert response.status_code == 200, response.text
            acknowledged.append((response.json()["interactions"], step))
        return acknowledged

    with ThreadPoolExecutor(WRITERS) as pool:
        acknowledged = sorted(item for items in pool.map(writer, range(WRITERS)) for item in items)
    total = WRITERS * APPENDS_PER_WRITER
    assert [count for count, _ in acknowledged] == list(range(1, total + 1))
    state = api.get(student(student_id), params={"model": MODEL}).json()
    assert state["interactions"] == total
    replayed = stateless(api, [step for _, step in acknowledged])
    np.testing.assert_allclose(state["mastery"], replayed["mastery"][-1], atol=TOLERANCE, rtol=0)


def test_concurrent_appends_to_one_student_in_one_process_write_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 appends at once to one student in one process read the same state and all but one lost the
    compare-and-swap, then ran the model and wrote again; now they take turns: 16 writes, none lost."""
    with app_client(COMMITTED, state_url=f"sqlite://{tmp_path / 'students.db'}") as client:
        store = client.app.state.students.get()
        writes = []
        write = store.write

        def counted(*args, **kwargs):
            writes.append(args)
            return write(*args, **kwargs)

        monkeypatch.setattr(store, "write", counted)
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda seed: append(client, "crowded", history(1, seed=seed)), range(16)))
    assert [answer.status_code for answer in answers] == [200] * 16
    assert sorted(answer.json()["interactions"] for answer in answers) == list(range(1, 17))
    assert len(writes) == 16


def test_a_retried_append_with_expected_interactions_is_never_counted_twice(api: httpx.Client) -> None:
    """A client whose answer was lost (a 503 after the write, a dropped connection) could only retry blindly,
    and a stored append was counted twice. With the count it extends, the retry is a 409 and stores nothing."""
    student_id, steps = unique_id("retried"), history(3, seed=21)
    assert append(api, student_id, steps[:2], expected_interactions=0).json()["interactions"] == 2
    retry = append(api, student_id, steps[:2], expected_interactions=0)
    assert retry.status_code == 409
    assert "has 2 interactions, not the 0 of expected_interactions: nothing was stored" in retry.json()["detail"]
    assert append(api, student_id, steps[2:], expected_interactions=2).json()["interactions"] == 3
    assert append(api, unique_id("new"), steps, expected_interactions=1).status_code == 409  # no state: 0
    assert api.get(student(student_id)).json()["interactions"] == 3
    for bad in (-1, True, "2", 1.5):
        response = append(api, student_id, steps, expected_interactions=bad)
        assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "expected_interactions"]


def test_a_state_of_another_model_version_is_409_saying_how_to_reset(api: httpx.Client, store_url: str) -> None:
    student_id = unique_id("old-version")
    store = open_store(store_url)
    try:
        memory = np.zeros((20, 200), dtype=np.float32)
        store.write(MODEL, student_id, memory=memory, interactions=7, model_sha256="0" * 64, expected_revision=None)
    finally:
        store.close()
    for response in (append(api, student_id, history(1, seed=1)), api.get(student(student_id))):
        assert response.status_code == 409
        assert "another version of the model" in response.json()["detail"]
        assert "DELETE /students/{student_id}" in response.json()["detail"]
    assert api.delete(student(student_id)).json()["deleted"] == [{"model": MODEL, "interactions": 7}]
    assert append(api, student_id, history(1, seed=1)).json()["interactions"] == 1


def test_a_state_not_written_by_the_service_is_a_409_saying_what_is_wrong_and_delete_erases_it(
    api: httpx.Client, store_url: str
) -> None:
    """A stored state with a malformed count (a hand edit, another program) answered GET, appends and DELETE with a
    bare 500."""
    student_id = unique_id("spoilt")
    assert append(api, student_id, history(2, seed=3)).status_code == 200
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite://")) as connection:
            connection.execute("UPDATE student_state SET interactions = 'x' WHERE student_id = ?", (student_id,))
    else:
        redis.Redis.from_url(store_url).hset(f"mnemo:student:{student_id}", f"interactions:{MODEL}", "x")
    for response in (append(api, student_id, history(1, seed=1)), api.get(student(student_id))):
        assert response.status_code == 409, response.text
        detail = response.json()["detail"]
        assert f"student {student_id!r} under model {MODEL} cannot be read (interactions: " in detail
        assert f"DELETE /students/{student_id} erases it" in detail
    erased = api.delete(student(student_id))
    assert erased.status_code == 200
    assert erased.json() == {"student_id": student_id, "deleted": [{"model": MODEL, "interactions": None}]}
    assert raw_records(store_url, student_id) == 0
    assert append(api, student_id, history(1, seed=1)).json()["interactions"] == 1


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (lambda memory: memory.reshape(40, 100), "memory has shape 40 x 100; the model takes 20 x 200"),
        (
            lambda memory: np.where(np.arange(memory.size).reshape(memory.shape) == 7, np.nan, memory),
            "memory holds nan",
        ),
    ],
)
def test_a_stored_memory_the_model_cannot_take_is_a_409(api: httpx.Client, store_url: str, spoil, problem: str) -> None:
    """A state with the right bytes in a shape the model does not take (40 x 100 for 20 x 200) reached the model: a 422
    blaming the request body for the graph's "invalid dimensions for input: mv_in"; one holding nan answered 200 with
    null probabilities (and stored nan again)."""
    student_id = unique_id("reshaped")
    assert append(api, student_id, history(2, seed=3)).status_code == 200
    store = open_store(store_url)
    try:
        state = store.read(MODEL, student_id)
        memory = spoil(state.memory).astype(np.float32)
        fields = {"interactions": state.interactions, "model_sha256": state.model_sha256}
        store.write(MODEL, student_id, memory=memory, expected_revision=state.revision, **fields)
    finally:
        store.close()
    for response in (append(api, student_id, history(1, seed=1)), api.get(student(student_id))):
        assert response.status_code == 409, response.text
        assert f"cannot be read ({problem}" in response.json()["detail"]
    assert api.delete(student(student_id)).json()["deleted"] == [{"model": MODEL, "interactions": 2}]


def test_erasure_removes_everything_under_every_model(api: httpx.Client, store_url: str) -> None:
    student_id = unique_id("erase-me")
    assert append(api, student_id, history(3, seed=2)).status_code == 200
    synthetic = {"model": OTHER_MODEL, "interactions": [{"question": 1, "correct": True}]}
    assert api.post(f"{student(student_id)}/interactions", json=synthetic).status_code == 200
    assert student_id in all_ids(api)

    erased = api.delete(student(student_id))
    assert erased.status_code == 200
    assert erased.json() == {
        "student_id": student_id,
        "deleted": [{"model": MODEL, "interactions": 3}, {"model": OTHER_MODEL, "interactions": 1}],
    }
    for model in (MODEL, OTHER_MODEL):
        assert api.get(student(student_id), params={"model": model}).status_code == 404
    assert student_id not in all_ids(api)
    assert api.delete(student(student_id)).json()["deleted"] == []
    assert raw_records(store_url, student_id) == 0


def all_ids(client: httpx.Client) -> list[str]:
    ids, after = [], None
    while True:
        page = client.get("/students", params={"limit": 50} | ({"after": after} if after else {})).json()
        ids += page["student_ids"]
        after = page["next_after"]
        if after is None:
            return ids


def test_an_nfc_and_an_nfd_id_are_two_students_over_http(api: httpx.Client) -> None:
    prefix = unique_id("élève")
    nfc, nfd = unicodedata.normalize("NFC", prefix), unicodedata.normalize("NFD", prefix)
    for student_id, count in ((nfc, 1), (nfd, 2)):
        assert append(api, student_id, history(count, seed=count)).status_code == 200
    for student_id, count in ((nfc, 1), (nfd, 2)):
        state = api.get(student(student_id), params={"model": MODEL}).json()
        assert (state["student_id"], state["interactions"]) == (student_id, count)
    assert [student_id for student_id in all_ids(api) if student_id in (nfc, nfd)] == sorted([nfc, nfd])
    for student_id, count in ((nfc, 1), (nfd, 2)):
        assert api.delete(student(student_id)).json()["deleted"] == [{"model": MODEL, "interactions": count}]


def raw_records(store_url: str, student_id: str) -> int:
    """Records mentioning the student, read from the database itself; for SQLite also any byte of the id left
    in the database file or its WAL (free pages, old page versions)."""
    if store_url.startswith("sqlite://"):
        path = Path(store_url.removeprefix("sqlite://"))
        with sqlite3.connect(path) as connection:
            rows = connection.execute("SELECT count(*) FROM student_state WHERE student_id = ?", (student_id,))
            count = rows.fetchone()[0]
        files = [path, path.with_name(path.name + "-wal")]
        return count + sum(file.read_bytes().count(student_id.encode()) for file in files if file.exists())
    client = redis.Redis.from_url(store_url)
    keys = [key for key in client.scan_iter() if student_id.encode() in key]
    return len(keys) + int(client.zscore("mnemo:students", student_id) is not None)


def test_get_reports_count_times_version_and_mastery(api: httpx.Client) -> None:
    student_id = unique_id("reader")
    appended = append(api, student_id, history(4, seed=4)).json()
    state = api.get(student(student_id)).json()  # no ?model=: the default model, dkvmn-assist2009
    models = {model["name"]: model for model in api.get("/models").json()["models"]}
    assert state["model"] == MODEL and state["model_sha256"] == models[MODEL]["sha256"]
    assert state["interactions"] == 4 and state["student_id"] == student_id
    assert state["created_at"] <= state["updated_at"] and state["updated_at"].endswith("Z")
    np.testing.assert_allclose(state["mastery"], appended["mastery"], atol=TOLERANCE)


# -- input validation (SQLite server) ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sqlite_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    url = f"sqlite://{tmp_path_factory.mktemp('validation') / 'students.db'}"
    with running_server(COMMITTED, MNEMO_STATE_URL=url) as server, client_of(server) as client:
        yield client


@pytest.mark.parametrize(
    ("student_id", "rule"),
    [
        ("x" * 129, "1 to 128 characters"),
        ("two words", "printable"),
        ("tab\there", "printable"),
        ("\u200b", "printable"),
    ],
)
def test_bad_student_ids_are_422_naming_the_path_parameter_and_the_rule(
    sqlite_api: httpx.Client, student_id: str, rule: str
) -> None:
    for response in (
        append(sqlite_api, student_id, history(1, seed=0)),
        sqlite_api.get(student(student_id)),
        sqlite_api.delete(student(student_id)),
    ):
        assert response.status_code == 422
        (error,) = response.json()["detail"]
        assert error["loc"] == ["path", "student_id"] and rule in error["msg"]
        assert student_id not in error["msg"]


ONE_STEP = [{"question": 3, "correct": True}]


@pytest.mark.parametrize(
    ("body", "location"),
    [
        ({"interactions": []}, ["body", "interactions"]),
        ({}, ["body", "interactions"]),
        ({"interactions": [{"question": 0, "correct": True}]}, ["body", "interactions", 0, "question"]),
        ({"interactions": [{"question": N_QUESTIONS + 1, "correct": True}]}, ["body", "interactions", 0, "question"]),
        ({"interactions": [{"question": 3, "correct": "yes"}]}, ["body", "interactions", 0, "correct"]),
        ({"interactions": [{"question": 3, "correct": True}], "next_questions": [0]}, ["body", "next_questions", 0]),
        ({"interactions": ONE_STEP, "next_questions": [2**63]}, ["body", "next_questions", 0]),  # was a 500
        ({"interactions": ONE_STEP, "next_questions": [-(10**20)]}, ["body", "next_questions", 0]),
        ({"interactions": [{"question": 3, "correct": True}], "history": []}, ["body", "history"]),
    ],
)
def test_bad_bodies_are_422_naming_the_field(sqlite_api: httpx.Client, body: dict, location: list) -> None:
    response = sqlite_api.post("/students/learner-1/interactions", json={"model": MODEL, **body})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == location
    assert sqlite_api.get("/students/learner-1").status_code == 404  # nothing was stored


def test_an_append_naming_its_model_in_the_query_is_422_not_appended_to_the_default_model(
    sqlite_api: httpx.Client,
) -> None:
    """GET takes ?model=; POST takes the body's `model`: a query copied from GET was ignored (default model)."""
    response = sqlite_api.post(
        "/students/learner-q/interactions", params={"model": OTHER_MODEL}, json={"interactions": ONE_STEP}
    )
    assert response.status_code == 422
    error = response.json()["detail"][0]
    assert error["loc"] == ["query", "model"] and "body" in error["msg"]
    assert sqlite_api.get("/students/learner-q").status_code == 404  # nothing was stored


def test_a_delete_naming_a_model_is_422_and_erases_nothing(sqlite_api: httpx.Client) -> None:
    """DELETE erases the student under every model: a client asking for one model's state would have lost all."""
    for model in (MODEL, OTHER_MODEL):
        appended = sqlite_api.post("/students/learner-d/interactions", json={"model": model, "interactions": ONE_STEP})
        assert appended.status_code == 200
    response = sqlite_api.delete("/students/learner-d", params={"model": OTHER_MODEL})
    assert response.status_code == 422
    error = response.json()["detail"][0]
    assert error["loc"] == ["query", "model"] and "every model" in error["msg"]
    for model in (MODEL, OTHER_MODEL):
        assert sqlite_api.get("/students/learner-d", params={"model": model}).status_code == 200


def test_ids_that_are_not_utf8_are_422_not_one_shared_student(sqlite_api: httpx.Client) -> None:
    """%FF and %FE both decode to U+FFFD: without the rule they were the same student."""
    for raw in ("%FF", "%FE", "%ED%A0%80", "ok%FF"):
        response = sqlite_api.post(f"/students/{raw}/interactions", json={"model": MODEL, "interactions": ONE_STEP})
        assert response.status_code == 422 and "U+FFFD" in response.json()["detail"][0]["msg"], raw
    assert sqlite_api.get("/students?after=%FF").status_code == 422


def test_unknown_model_is_404_and_bad_paging_is_422(sqlite_api: httpx.Client) -> None:
    response = sqlite_api.post(
        "/students/learner-2/interactions", json={"model": "nope", "interactions": [{"question": 1, "correct": True}]}
    )
    assert response.status_code == 404 and MODEL in response.json()["detail"]
    assert sqlite_api.get("/students/learner-2", params={"model": "rmc-vlmp-sick"}).status_code == 404
    for params, location in (({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"after": "a b"}, "after")):
        response = sqlite_api.get("/students", params=params)
        assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", location]


def test_an_append_can_return_its_attention_and_mastery_per_step(sqlite_api: httpx.Client) -> None:
    """Off by default; asked for, they are the stateless call's rows for the same steps, row 0 the stored state."""
    student_id, steps = unique_id("steps"), history(8, seed=12)
    first = append(sqlite_api, student_id, steps[:3]).json()
    assert first["attention"] is None and first["mastery_steps"] is None
    stored = sqlite_api.get(student(student_id)).json()["mastery"]
    second = append(sqlite_api, student_id, steps[3:], return_attention=True, return_mastery_steps=True).json()
    whole = sqlite_api.post("/knowledge-trace", json={"model": MODEL, "interactions": steps}).json()
    assert len(second["attention"]) == 5 and len(second["mastery_steps"]) == 6
    np.testing.assert_allclose(second["attention"], whole["attention"][3:], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(second["mastery_steps"], whole["mastery"][3:], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(second["mastery_steps"][0], stored, atol=TOLERANCE, rtol=0)
    assert second["mastery_steps"][-1] == second["mastery"]
    response = append(sqlite_api, student_id, steps[:1], return_attention="yes")
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "return_attention"]


def test_paging_lists_every_id_once_in_order(sqlite_api: httpx.Client) -> None:
    created = sorted(f"page-{index:02d}" for index in range(7))
    for student_id in created:
        assert append(sqlite_api, student_id, history(1, seed=5)).status_code == 200
    pages, after = [], None
    while True:
        page = sqlite_api.get("/students", params={"limit": 3} | ({"after": after} if after else {})).json()
        pages.append(page["student_ids"])
        after = page["next_after"]
        if after is None:
            break
    listed = [student_id for page in pages for student_id in page]
    assert [student_id for student_id in listed if student_id.startswith("page-")] == created
    assert listed == sorted(listed) and all(len(page) <= 3 for page in pages)


# -- logs, crashes, an unavailable store -------------------------------------------------------------------------
def test_student_ids_never_appear_in_the_logs(tmp_path: Path) -> None:
    secret = "secret-learner-4711"
    url = f"sqlite://{tmp_path / 'students.db'}"
    with running_server(COMMITTED, MNEMO_STATE_URL=url) as server, client_of(server) as client:
        assert append(client, secret, history(2, seed=6)).status_code == 200
        assert client.get(student(secret)).status_code == 200
        assert append(client, secret, [{"question": 0, "correct": True}]).status_code == 422
        assert client.get(f"{student(secret)}/unknown-path").status_code == 404
        assert client.get(student(secret + " x")).status_code == 422
        assert client.get("/students", params={"after": secret}).status_code == 200
        assert client.delete(student(secret)).status_code == 200
        assert client.get(student(secret)).status_code == 404
    output = "\n".join(server.output)
    assert "/students/{student_id}/interactions" in output and "/students/{student_id}" in output
    assert secret not in output


def stream_appends(client: httpx.Client, student_id: str, steps: list[dict], acknowledged: list[int]) -> None:
    """Append one step at a time; record each acknowledged count; stop at the first transport error or 503 (a
    worker that outlives its killed master refuses new work while it exits)."""
    for step in steps:
        try:
            response = append(client, student_id, [step])
        except httpx.TransportError:
            return
        if response.status_code == 503:
            return
        assert response.status_code == 200, response.text
        acknowledged.append(response.json()["interactions"])


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_sigkill_of_the_server_keeps_every_acknowledged_interaction(tmp_path: Path, store: str) -> None:
    redis_server = RedisServer(require_redis_server(), tmp_path / "redis") if store == "redis" else None
    if redis_server is not None:
        redis_server.start()
    url = f"sqlite://{tmp_path / 'students.db'}" if redis_server is None else redis_server.url()
    student_id, steps, acknowledged = "crash-test", history(2000, seed=7), []
    try:
        with running_server(COMMITTED, MNEMO_STATE_URL=url) as server, client_of(server) as client:
            writer = threading.Thread(target=stream_appends, args=(client, student_id, steps, acknowledged))
            writer.start()
            deadline = time.monotonic() + 120
            while len(acknowledged) < ACKED_BEFORE_KILL and writer.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(server.process.pid, signal.SIGKILL)
            writer.join(timeout=60)
        assert len(acknowledged) >= ACKED_BEFORE_KILL and server.process.returncode == -signal.SIGKILL
        if redis_server is not None:  # Redis itself dies too, and comes back from its append-only file
            redis_server.kill()
            redis_server.start()
        with running_server(COMMITTED, MNEMO_STATE_URL=url) as server, client_of(server) as client:
            state = client.get(student(student_id)).json()
            assert acknowledged[-1] <= state["interactions"] <= acknowledged[-1] + 1  # one was in flight at most
            replayed = stateless(client, steps[: state["interactions"]])
            np.testing.assert_allclose(state["mastery"], replayed["mastery"][-1], atol=TOLERANCE, rtol=0)
    finally:
        if redis_server is not None:
            redis_server.kill()


def test_redis_unavailable_is_a_clear_503_while_the_stateless_endpoints_serve(tmp_path: Path) -> None:
    redis_server = RedisServer(require_redis_server(), tmp_path / "redis")
    redis_server.start()
    redis_server.kill()  # stopped before the service starts: startup must not fail
    try:
        with running_server(COMMITTED, MNEMO_STATE_URL=redis_server.url()) as server, client_of(server) as client:
            assert_students_unavailable_but_stateless_serve(client, redis_server.port)
            redis_server.start()  # back: the same service serves students without a restart
            assert append(client, "comeback", history(1, seed=8)).json()["interactions"] == 1
            redis_server.kill()  # gone while serving
            assert_students_unavailable_but_stateless_serve(client, redis_server.port)
            redis_server.start()  # the acknowledged interaction survived in the append-only file
            assert append(client, "comeback", history(1, seed=8)).json()["interactions"] == 2
            metrics = client.get("/metrics").text.splitlines()
            assert 'mnemo_server_requests_rejected_total{reason="store_unavailable"} 8.0' in metrics  # 2 x 4 above
        assert any("student state store unavailable at startup" in line for line in server.output)
        assert any(f"Redis state store 127.0.0.1:{redis_server.port}/0 failed" in line for line in server.output)
    finally:
        redis_server.kill()


def test_a_redis_write_answered_503_but_stored_says_so_and_its_retry_is_not_counted_twice(tmp_path: Path) -> None:
    """Redis frozen between the read and the write of an append: the write waits in the socket, the reply
    times out (2 s), the client hears 503 "retry later", then Redis wakes and stores it. The 503 now says the
    append may be stored, and its retry with expected_interactions is a 409, not a second copy."""
    redis_server = RedisServer(require_redis_server(), tmp_path / "redis")
    redis_server.start()
    steps = history(10_000, seed=22)  # its model run (~0.3 s) leaves time to freeze Redis after the read
    try:
        with running_server(COMMITTED, MNEMO_STATE_URL=redis_server.url()) as server, client_of(server) as client:
            assert append(client, "warm", steps).status_code == 200
            watcher = redis.Redis(port=redis_server.port, socket_timeout=10)
            with ThreadPoolExecutor(1) as pool, watcher.monitor() as monitor:
                answer = pool.submit(append, client, "frozen", steps)
                while b"mnemo:student:frozen" not in monitor.next_command()["command"].encode():
                    pass  # until the append's read, whose reply Redis sends just after
                time.sleep(0.1)
                redis_server.process.send_signal(signal.SIGSTOP)
                response = answer.result()
                redis_server.process.send_signal(signal.SIGCONT)
            assert response.status_code == 503, response.text
            assert "the append may have been stored all the same" in response.json()["detail"]
            assert client.get(student("frozen")).json()["interactions"] == 10_000
            retry = append(client, "frozen", steps, expected_interactions=0)
            assert retry.status_code == 409, retry.text
            assert client.get(student("frozen")).json()["interactions"] == 10_000
    finally:
        redis_server.kill()


def test_a_state_file_deleted_under_the_service_is_503_until_a_restart(tmp_path: Path) -> None:
    """Appends went into the unlinked file (200, lost at the next start); now 503 without Retry-After, which
    would invite retries that cannot help, and the log says to restart."""
    directory = tmp_path / "state"
    url = f"sqlite://{directory / 'students.db'}"
    with running_server(COMMITTED, MNEMO_STATE_URL=url) as server, client_of(server) as client:
        assert append(client, "kept", history(2, seed=3)).status_code == 200
        shutil.rmtree(directory)
        for response in (append(client, "lost", history(1, seed=4)), client.get(student("kept"))):
            assert response.status_code == 503 and "retry-after" not in response.headers
            assert response.json()["detail"].endswith("affected, until the service is restarted.")
        assert client.post("/similarity", json={"sentence_a": "a cat", "sentence_b": "a dog"}).status_code == 200
    assert any("was deleted or replaced while the service ran: restart the service" in line for line in server.output)


def assert_students_unavailable_but_stateless_serve(client: httpx.Client, port: int) -> None:
    for response in (
        append(client, "comeback", history(1, seed=8)),
        client.get(student("comeback")),
        client.delete(student("comeback")),
        client.get("/students"),
    ):
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert "student state store is unavailable" in response.json()["detail"]
        assert "Redis state store" in response.json()["detail"]
        assert f":{port}" not in response.json()["detail"]  # the log has the address, the client does not
    assert client.post("/knowledge-trace", json={"interactions": history(5, seed=8)}).status_code == 200
    pair = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument."}
    assert client.post("/similarity", json=pair).status_code == 200
    assert client.get("/ready").status_code == 200


def test_an_sqlite_path_that_cannot_be_created_leaves_the_stateless_endpoints_serving(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with app_client(COMMITTED, state_url=f"sqlite://{blocker / 'students.db'}") as client:
        response = client.post("/students/learner/interactions", json={"interactions": history(1, seed=0)})
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert "cannot create its directory" in response.json()["detail"]
        assert str(tmp_path) not in response.json()["detail"]
        assert client.post("/knowledge-trace", json={"interactions": history(3, seed=0)}).status_code == 200
        assert client.get("/ready").status_code == 200


class HeldWriteLock:
    """Another process's writer holding an SQLite database's write lock (`BEGIN IMMEDIATE`) until released."""

    def __init__(self, path: Path) -> None:
        self.connection = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        self.connection.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.connection.execute("ROLLBACK")
        self.connection.close()


def test_a_stalled_store_holds_up_the_students_endpoints_only(tmp_path: Path) -> None:
    """Appends blocked on the store's lock once took the threads that /similarity and /knowledge-trace parse
    and encode on: those answered 504 after the deadline. Now the store has threads of its own."""
    database = tmp_path / "students.db"
    url = f"sqlite://{database}"
    server_options = {"MNEMO_STATE_URL": url, "MNEMO_REQUEST_TIMEOUT_S": "4"}
    with running_server(COMMITTED, **server_options) as server, client_of(server) as client:
        assert append(client, "warm", history(1, seed=9)).status_code == 200  # the database exists
        lock = HeldWriteLock(database)
        with ThreadPoolExecutor(max_workers=12) as pool:
            stalled = [pool.submit(append, client_of(server), f"stalled-{n}", history(2, seed=n)) for n in range(12)]
            time.sleep(0.5)  # the appends now wait for the lock on the store's threads
            pair = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument."}
            assert client.post("/similarity", json=pair).status_code == 200
            assert client.post("/knowledge-trace", json={"interactions": history(400, seed=9)}).status_code == 200
            assert client.post("/similarity/batch", json={"pairs": [pair] * 8}).status_code == 200
            lock.release()
            statuses = [future.result().status_code for future in stalled]
        assert set(statuses) <= {200, 503, 504}, statuses
        for n, status in enumerate(statuses):  # what each was told is what the store holds
            stored = client.get(student(f"stalled-{n}"))
            assert (stored.status_code, status) in ((200, 200), (404, 503), (404, 504)), (n, status, stored.text)


def test_a_store_with_too_many_calls_waiting_is_429_busy_not_503_unavailable(tmp_path: Path) -> None:
    """With 4 store calls running and 64 waiting, the next was answered 503 "the store is unavailable" while
    the store was only slow: a busy answer the client should retry, 429, saying which limit it hit."""
    database = tmp_path / "students.db"
    with running_server(COMMITTED, MNEMO_STATE_URL=f"sqlite://{database}") as server, client_of(server) as client:
        assert append(client, "warm", history(1, seed=12)).status_code == 200
        lock = HeldWriteLock(database)  # each write now waits for it: the store's 4 threads and its queue fill

        async def appends() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as many:
                body = {"model": MODEL, "interactions": history(1, seed=12)}
                sent = [many.post(f"{student(f'busy-{n}')}/interactions", json=body) for n in range(90)]
                return await asyncio.gather(*sent)

        releaser = threading.Timer(2.0, lock.release)
        releaser.start()
        answers = asyncio.run(appends())
        releaser.join()
        busy = [n for n, answer in enumerate(answers) if answer.status_code == 429]
        assert busy and {answer.status_code for answer in answers} == {200, 429}
        for n in busy:
            assert answers[n].headers["retry-after"] == "1"
            assert "store is busy: 4 calls running and 64 waiting" in answers[n].json()["detail"]
            assert client.get(student(f"busy-{n}")).status_code == 404  # refused before anything was stored
        metrics = client.get("/metrics").text.splitlines()
        assert f'mnemo_server_requests_rejected_total{{reason="store_busy"}} {float(len(busy))}' in metrics
        assert 'mnemo_server_requests_rejected_total{reason="store_unavailable"} 0.0' in metrics


def test_an_append_whose_write_started_is_answered_with_its_result_not_504(tmp_path: Path) -> None:
    """The deadline (2 s: a 504 at 1.5 s) passes while the write waits for another writer's lock (3 s): the
    append was answered 504 "retry later" and stored all the same, so a retry counted it twice."""
    database = tmp_path / "students.db"
    server_options = {"MNEMO_STATE_URL": f"sqlite://{database}", "MNEMO_REQUEST_TIMEOUT_S": "2"}
    with running_server(COMMITTED, **server_options) as server, client_of(server) as client:
        assert append(client, "warm", history(1, seed=10)).status_code == 200
        lock = HeldWriteLock(database)
        releaser = threading.Timer(3.0, lock.release)
        releaser.start()
        response = append(client, "late-write", history(2, seed=10))
        releaser.join()
        assert response.status_code == 200, response.text
        assert response.json()["interactions"] == 2
        assert client.get(student("late-write")).json()["interactions"] == 2


def test_an_append_stored_before_the_deadline_is_not_answered_504_by_its_next_questions(tmp_path: Path) -> None:
    """The write waits 4.3 s for another writer's lock (within the store's 5 s busy timeout) and is stored before
    the 504 (due at 4.5 s: the 5 s deadline less its margin); the 10,000 `next_questions` were predicted after it
    and were still running at 4.5 s: a 504 "retry later" for a stored append. They are now predicted before the
    write. (A 5 s deadline, not 2 s: the cold warm-up append, 10,000 `next_questions` too, took more than the
    1.5 s before a 504 on a loaded machine.)"""
    database = tmp_path / "students.db"
    server_options = {"MNEMO_STATE_URL": f"sqlite://{database}", "MNEMO_REQUEST_TIMEOUT_S": "5"}
    wanted = [1 + n % N_QUESTIONS for n in range(10_000)]
    with running_server(COMMITTED, **server_options) as server, client_of(server) as client:
        assert append(client, "warm", history(1, seed=11), next_questions=wanted).status_code == 200
        lock = HeldWriteLock(database)
        releaser = threading.Timer(4.3, lock.release)
        releaser.start()
        response = append(client, "late-next", history(2, seed=11), next_questions=wanted)
        releaser.join()
        stored = client.get(student("late-next"))
        assert (stored.status_code, response.status_code) in ((200, 200), (404, 504)), response.text
        if response.status_code == 200:
            assert [item["question"] for item in response.json()["next"]] == wanted
