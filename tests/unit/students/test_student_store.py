"""The student-state stores against the real databases: SQLite in a tmp dir and a redis-server started here."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis

from app.students.io import open_store
from app.students.sqlite_store import SqliteStateStore
from app.students.store import (
    RevisionConflict,
    StateStore,
    StateVersionMismatch,
    StoreUnavailable,
    StudentState,
    UnreadableState,
    update_state,
)
from tests.redis_server import RedisServer, require_redis_server
from tests.student_writer import MODEL, MODEL_SHA256, SHAPE, InlineCalls, append_one, update

ROOT = Path(__file__).resolve().parents[3]
WRITERS = 8
APPENDS_PER_WRITER = 50
ACKED_BEFORE_KILL = 100
CHILD_TIMEOUT_S = 120
UNAVAILABLE_WITHIN_S = 10.0  # the store's own timeouts are 1 s (connect) and 2 s (reply)


# -- fixtures -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(require_redis_server(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private server a test may kill, freeze and restart."""
    server = RedisServer(require_redis_server(), tmp_path / "redis")
    server.start()
    yield server
    server.kill()


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'state' / 'students.db'}"
    server: RedisServer = request.getfixturevalue("redis_server")
    redis.Redis.from_url(server.url()).flushdb()
    return server.url()


@pytest.fixture
def store(store_url: str) -> Iterator[StateStore]:
    opened = open_store(store_url)
    yield opened
    opened.close()


def random_memory(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def create(store: StateStore, student_id: str, model: str = MODEL, interactions: int = 3) -> StudentState:
    return store.write(
        model,
        student_id,
        memory=random_memory(),
        interactions=interactions,
        model_sha256=MODEL_SHA256,
        expected_revision=None,
    )


def leftovers(store_url: str, student_id: str) -> list:
    """Everything the database itself still holds about a student: rows, keys or set members."""
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite://")) as connection:
            return connection.execute("SELECT * FROM student_state WHERE student_id = ?", (student_id,)).fetchall()
    client = redis.Redis.from_url(store_url)
    keys = [key for key in client.scan_iter() if student_id.encode() in key]
    members = [member for member in client.zrange("mnemo:students", 0, -1) if member == student_id.encode()]
    return keys + members


# -- round trip and compare-and-swap --------------------------------------------------------------------
def test_memory_round_trips_bit_exact(store: StateStore) -> None:
    memory = random_memory(1)
    memory[0, :6] = [np.nan, -0.0, np.inf, -np.inf, np.float32(1e-45), np.finfo(np.float32).max]
    memory[1, 0] = np.frombuffer(np.uint32(0x7FC0_1234).tobytes(), dtype=np.float32)[0]  # NaN with a payload
    written = store.write(
        MODEL, "élève-42", memory=memory, interactions=7, model_sha256=MODEL_SHA256, expected_revision=None
    )
    read = store.read(MODEL, "élève-42")
    assert read.memory.dtype == np.float32 and read.memory.shape == SHAPE and not read.memory.flags.writeable
    assert read.memory.tobytes() == memory.tobytes()
    assert (read.model, read.student_id, read.interactions, read.model_sha256) == (MODEL, "élève-42", 7, MODEL_SHA256)
    assert read.revision == written.revision and read.created_at == written.created_at
    assert abs(read.updated_at - time.time()) < 60
    assert store.read(MODEL, "nobody") is None and store.read("other-model", "élève-42") is None


def test_compare_and_swap_rejects_stale_and_duplicate_writes(store: StateStore) -> None:
    first = create(store, "s1")
    with pytest.raises(RevisionConflict):
        create(store, "s1")  # create-if-absent, but it exists
    second = store.write(
        MODEL,
        "s1",
        memory=random_memory(2),
        interactions=4,
        model_sha256=MODEL_SHA256,
        expected_revision=first.revision,
    )
    assert second.revision > first.revision and second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    with pytest.raises(RevisionConflict):  # a writer that read `first` lost the race
        store.write(
            MODEL,
            "s1",
            memory=random_memory(3),
            interactions=4,
            model_sha256=MODEL_SHA256,
            expected_revision=first.revision,
        )
    assert store.read(MODEL, "s1").memory.tobytes() == random_memory(2).tobytes()


def test_revisions_are_never_reused_after_an_erasure(store: StateStore) -> None:
    """A writer that read the state before a DELETE cannot write the erased history back (no ABA)."""
    before = create(store, "s1")
    store.delete("s1")
    again = create(store, "s1")
    assert again.revision > before.revision
    with pytest.raises(RevisionConflict):
        store.write(
            MODEL,
            "s1",
            memory=random_memory(),
            interactions=4,
            model_sha256=MODEL_SHA256,
            expected_revision=before.revision,
        )


async def must_not_compute(current: StudentState | None) -> tuple[np.ndarray, int, None]:
    pytest.fail("must not compute")


def test_state_of_another_model_version_is_never_mixed(store: StateStore) -> None:
    stored = create(store, "s1")
    with pytest.raises(StateVersionMismatch) as mismatch:
        store.write(
            MODEL,
            "s1",
            memory=random_memory(),
            interactions=4,
            model_sha256="cd" * 32,
            expected_revision=stored.revision,
        )
    assert mismatch.value.status_code == 409 and "DELETE /students/" in mismatch.value.detail
    with pytest.raises(StateVersionMismatch):
        asyncio.run(update_state(InlineCalls(store), MODEL, "s1", "cd" * 32, must_not_compute))
    assert store.read(MODEL, "s1").memory.tobytes() == stored.memory.tobytes()


def test_update_gives_up_after_losing_every_race(store: StateStore) -> None:
    """A writer that always loses (another write lands while it computes) stops with a clear 409."""
    create(store, "contested")
    attempts = []

    def compute_while_another_writer_wins(current: StudentState | None) -> tuple[np.ndarray, int, None]:
        attempts.append(current.revision)
        append_one(store, "contested", 1)
        return current.memory.copy(), current.interactions + 1, None

    with pytest.raises(RevisionConflict, match="changed 3 times") as conflict:
        update(store, "contested", compute_while_another_writer_wins, max_attempts=3)
    assert conflict.value.status_code == 409
    assert len(attempts) == 3 and attempts == sorted(set(attempts))  # each attempt saw a newer state
    assert store.read(MODEL, "contested").interactions == 3 + 3  # the three winning appends, not the loser's


def test_memory_must_be_two_dimensional_float32(store: StateStore) -> None:
    with pytest.raises(ValueError, match="2-D float32"):
        store.write(
            MODEL, "s1", memory=np.zeros(SHAPE), interactions=1, model_sha256=MODEL_SHA256, expected_revision=None
        )
    assert store.read(MODEL, "s1") is None


@pytest.mark.slow
def test_concurrent_writer_threads_lose_nothing(store: StateStore) -> None:
    def writer(index: int) -> list[int]:
        return [append_one(store, "busy", index).interactions for _ in range(APPENDS_PER_WRITER)]

    with ThreadPoolExecutor(WRITERS) as pool:
        acknowledged = [count for counts in pool.map(writer, range(WRITERS)) for count in counts]
    assert_no_lost_update(store.read(MODEL, "busy"), acknowledged)


@pytest.mark.slow
def test_concurrent_writer_processes_lose_nothing(store: StateStore, store_url: str) -> None:
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.student_writer", store_url, "busy", str(index), str(APPENDS_PER_WRITER)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(WRITERS)
    ]
    acknowledged = []
    for child in children:
        out, _ = child.communicate(timeout=CHILD_TIMEOUT_S)
        assert child.returncode == 0
        acknowledged += [int(line) for line in out.split()]
    assert_no_lost_update(store.read(MODEL, "busy"), acknowledged)


def assert_no_lost_update(state: StudentState, acknowledged: list[int]) -> None:
    """Each acknowledged append got its own count, and the state holds every one of them."""
    total = WRITERS * APPENDS_PER_WRITER
    assert sorted(acknowledged) == list(range(1, total + 1))
    assert state.interactions == total
    expected = np.zeros(SHAPE, dtype=np.float32)
    expected[:WRITERS] = APPENDS_PER_WRITER
    np.testing.assert_array_equal(state.memory, expected)


# -- erasure and paging ---------------------------------------------------------------------------------
FULL_DISK_DELETE = """
import numpy as np, sys
from pathlib import Path
from app.students.sqlite_store import SqliteStateStore
from app.students.store import StoreUnavailable
ballast = Path(sys.argv[1]) / "ballast"
ballast.write_bytes(bytes(128 * 1024))
store = SqliteStateStore(Path(sys.argv[1]) / "students.db")
memory = np.ones((20, 200), dtype=np.float32)
written = 0
try:
    while written < 1000:
        store.write("m", f"s{written}", memory=memory, interactions=1, model_sha256="x", expected_revision=None)
        written += 1
except StoreUnavailable as error:
    print("full:", error.detail)
ballast.unlink()  # room for the delete in the WAL, not for the database file to grow to the WAL's pages
print("deleted:", store.delete("s0"), "left:", store.read("m", "s0"))
"""


def test_a_delete_on_a_full_disk_answers_that_it_deleted(tmp_path: Path) -> None:
    """The delete commits to the WAL; only the checkpoint after it (the database file must grow) fails. That
    answered 503 for a student that was gone: the checkpoint is now logged, not raised. A real full disk: a
    1 MB tmpfs, mounted in a user namespace of its own."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"no user namespaces here to mount a small tmpfs: {probe.stderr.decode().strip()}")
    mount = f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"
    script = f'{mount} && exec "$0" -c "$1" {tmp_path}'
    command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, sys.executable, FULL_DISK_DELETE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr
    assert "full: SQLite state store failed: database or disk is full" in done.stdout
    assert "deleted: {'m': 1} left: None" in done.stdout
    assert "could not be checkpointed (database or disk is full)" in done.stderr


def test_delete_removes_everything_about_a_student(store: StateStore, store_url: str) -> None:
    create(store, "gone", model="model-a", interactions=5)
    create(store, "gone", model="model-b", interactions=9)
    create(store, "kept")
    assert store.delete("gone") == {"model-a": 5, "model-b": 9}
    assert store.read("model-a", "gone") is None and store.read("model-b", "gone") is None
    assert leftovers(store_url, "gone") == []
    assert store.ids_after(None, 100) == ["kept"]
    assert store.read(MODEL, "kept").interactions == 3
    assert store.delete("gone") == {}


def corrupt(store_url: str, student_id: str, how: str) -> None:
    """Spoil a stored state the way a hand edit or another program could: a field missing or malformed."""
    if store_url.startswith("sqlite://"):
        column, value = {"missing": ("memory", b""), "malformed": ("interactions", "many")}[how]
        with sqlite3.connect(store_url.removeprefix("sqlite://")) as connection:
            query = f"UPDATE student_state SET {column} = ? WHERE student_id = ? AND model = ?"
            connection.execute(query, (value, student_id, MODEL))
        return
    client, key = redis.Redis.from_url(store_url), f"mnemo:student:{student_id}"
    if how == "missing":
        client.hdel(key, f"shape:{MODEL}", f"revision:{MODEL}")
    else:
        client.hset(key, f"interactions:{MODEL}", "many")


@pytest.mark.parametrize("how", ["missing", "malformed"])
def test_an_unreadable_state_is_a_409_naming_it_and_delete_still_erases_it(
    store: StateStore, store_url: str, how: str
) -> None:
    """A state this service did not write (a field missing or malformed) raised TypeError, ValueError or KeyError:
    a bare 500 on GET, appends and DELETE. Reads and appends now say what is wrong; DELETE erases it."""
    create(store, "spoilt", interactions=5)
    create(store, "spoilt", model="model-b", interactions=2)
    corrupt(store_url, "spoilt", how)
    with pytest.raises(UnreadableState) as unreadable:
        store.read(MODEL, "spoilt")
    assert unreadable.value.status_code == 409
    assert f"student 'spoilt' under model {MODEL} cannot be read" in unreadable.value.detail
    problem = {"malformed": "interactions: Input should be a valid integer", "missing": "Field required"}[how]
    problem = "memory holds 0 bytes" if how == "missing" and store_url.startswith("sqlite://") else problem
    assert problem in unreadable.value.detail
    assert "DELETE /students/spoilt" in unreadable.value.detail
    with pytest.raises(UnreadableState):
        asyncio.run(update_state(InlineCalls(store), MODEL, "spoilt", MODEL_SHA256, must_not_compute))
    assert store.delete("spoilt") == {MODEL: None if how == "malformed" else 5, "model-b": 2}
    assert leftovers(store_url, "spoilt") == [] and store.read(MODEL, "spoilt") is None
    assert create(store, "spoilt").interactions == 3


@pytest.mark.parametrize("seconds", ["nan", "inf", "-inf", "1e300", "-1e20"])
def test_a_stored_time_no_date_can_hold_is_unreadable(store: StateStore, store_url: str, seconds: str) -> None:
    """created_at or updated_at set by hand to a number no UTC date holds was read, then a 500 when GET formatted it."""
    create(store, "timeless")
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite://")) as connection:
            query = "UPDATE student_state SET updated_at = ? WHERE student_id = ?"
            connection.execute(query, (seconds, "timeless"))  # REAL affinity: "1e300" a number, "nan" text
    else:
        redis.Redis.from_url(store_url).hset("mnemo:student:timeless", f"updated:{MODEL}", seconds)
    with pytest.raises(UnreadableState, match="updated_at"):
        store.read(MODEL, "timeless")
    assert store.delete("timeless") == {MODEL: 3}


def test_a_redis_key_that_is_not_a_hash_is_a_409_and_delete_erases_it(redis_server: RedisServer) -> None:
    """A student key of another type (written by something else) was a 503 "Redis state store failed" on reads, and
    on DELETE too, although the key was erased."""
    redis.Redis.from_url(redis_server.url()).flushdb()
    store = open_store(redis_server.url())
    try:
        create(store, "stringy")
        redis.Redis.from_url(redis_server.url()).set("mnemo:student:stringy", "not a hash")
        with pytest.raises(
            UnreadableState, match=rf"'stringy' under model {MODEL} cannot be read \(its Redis key is not"
        ):
            store.read(MODEL, "stringy")
        assert store.delete("stringy") == {}
        assert leftovers(redis_server.url(), "stringy") == [] and store.read(MODEL, "stringy") is None
    finally:
        store.close()


def test_a_redis_id_set_of_another_type_fails_a_write_before_it_stores_anything(redis_server: RedisServer) -> None:
    """The write's HSET ran before the ZADD that failed: a 503 "may have been stored" for a state then stored."""
    client = redis.Redis.from_url(redis_server.url())
    client.flushdb()
    client.set("mnemo:students", "not a sorted set")
    store = open_store(redis_server.url())
    try:
        with pytest.raises(StoreUnavailable, match=r"^Redis state store failed: response error$"):
            create(store, "s1")
        assert store.read(MODEL, "s1") is None
    finally:
        client.flushdb()
        store.close()


def test_paging_lists_each_id_once_in_a_stable_order(store: StateStore) -> None:
    ids = [f"student-{index:02d}" for index in range(20)] + ["Zoë", "学生7", "a:b@c.d", "~tilde", "+plus"]
    for student_id in ids:
        create(store, student_id, model="model-a")
    for student_id in ids[:5]:
        create(store, student_id, model="model-b")  # two states, still one id
    pages = [store.ids_after(None, 7)]
    while pages[-1]:
        pages.append(store.ids_after(pages[-1][-1], 7))
    assert [len(page) for page in pages] == [7, 7, 7, 4, 0]
    assert [student_id for page in pages for student_id in page] == sorted(ids)
    assert store.ids_after(None, 26) == sorted(ids)


def test_ids_are_compared_exactly_as_given(store: StateStore) -> None:
    """An id in NFC and NFD form are two students; glob and SQL metacharacters and the longest ids are plain text."""
    nfc, nfd = unicodedata.normalize("NFC", "Zoë"), unicodedata.normalize("NFD", "Zoë")
    assert nfc != nfd
    ids = [nfc, nfd, "*", "?", "[a]", "\\", "[", "-", "+", "(x", "%", "_", "a*b", "'--", "𝔘" * 128, "é" * 128]
    for index, student_id in enumerate(ids):
        create(store, student_id, interactions=index + 1)
    assert [store.read(MODEL, student_id).interactions for student_id in ids] == list(range(1, len(ids) + 1))
    pages = [store.ids_after(None, 1)]
    while pages[-1]:
        pages.append(store.ids_after(pages[-1][-1], 1))
    assert [student_id for page in pages for student_id in page] == sorted(ids)  # each cursor is exact, too
    for index, student_id in enumerate(ids):
        assert store.delete(student_id) == {MODEL: index + 1}
        assert store.read(MODEL, student_id) is None
    assert store.ids_after(None, 100) == []


# -- durability: SIGKILL in the middle of a stream of appends -------------------------------------------
def start_stream(store_url: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.student_writer", store_url, "streamer", "0", "1000000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_for_acknowledged(child: subprocess.Popen, count: int) -> int:
    """Read `count` acknowledged counts from the writer; return the last one."""
    last = 0
    for _ in range(count):
        line = child.stdout.readline()
        assert line.strip(), "the writer stopped before it was killed"
        last = int(line)
    return last


def kill_and_collect(child: subprocess.Popen, last_seen: int) -> int:
    """SIGKILL the writer and return the last count it printed (every printed count was acknowledged)."""
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    return max([last_seen, *(int(line) for line in child.stdout.read().split())])


def assert_acknowledged_state(state: StudentState, last_acknowledged: int) -> None:
    # The write in flight at the kill may have committed without being printed: at most one more.
    assert last_acknowledged <= state.interactions <= last_acknowledged + 1
    expected = np.zeros(SHAPE, dtype=np.float32)
    expected[0] = state.interactions
    np.testing.assert_array_equal(state.memory, expected)


@pytest.mark.parametrize("synchronous", ["full", "normal"])
@pytest.mark.slow
def test_sqlite_keeps_every_acknowledged_write_after_sigkill(tmp_path: Path, synchronous: str) -> None:
    """FULL (the default) also survives a power cut; NORMAL survives the death of the process, as shown here."""
    store_url = f"sqlite://{tmp_path / 'students.db'}?synchronous={synchronous}"
    child = start_stream(store_url)
    seen = wait_for_acknowledged(child, ACKED_BEFORE_KILL)
    last = kill_and_collect(child, seen)
    assert last >= ACKED_BEFORE_KILL
    reopened = open_store(store_url)
    assert_acknowledged_state(reopened.read(MODEL, "streamer"), last)
    reopened.close()


@pytest.mark.slow
def test_redis_with_aof_always_keeps_every_acknowledged_write_after_sigkill(own_redis_server: RedisServer) -> None:
    child = start_stream(own_redis_server.url())
    seen = wait_for_acknowledged(child, ACKED_BEFORE_KILL)
    own_redis_server.kill()  # the database dies mid-stream, then the writer
    last = kill_and_collect(child, seen)
    assert last >= ACKED_BEFORE_KILL
    own_redis_server.start()
    reopened = open_store(own_redis_server.url())
    assert_acknowledged_state(reopened.read(MODEL, "streamer"), last)
    reopened.close()


# -- unavailable databases --------------------------------------------------------------------------------
def assert_unavailable_quickly(store: StateStore) -> None:
    operations = [
        lambda: store.read(MODEL, "s1"),
        lambda: create(store, "s2"),
        lambda: store.delete("s1"),
        lambda: store.ids_after(None, 100),
        store.check_health,
    ]
    for operation in operations:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as unavailable:
            operation()
        assert time.monotonic() - started < UNAVAILABLE_WITHIN_S
        assert unavailable.value.status_code == 503


def test_redis_stopped_is_unavailable_quickly_then_recovers(own_redis_server: RedisServer) -> None:
    store = open_store(own_redis_server.url())
    create(store, "s1")
    own_redis_server.kill()
    assert_unavailable_quickly(store)
    with pytest.raises(StoreUnavailable, match=r"^Redis state store failed: connection error$"):  # no class name
        store.read(MODEL, "s1")
    own_redis_server.start()
    store.check_health()
    assert store.read(MODEL, "s1").interactions == 3
    store.close()


@pytest.mark.slow
def test_redis_frozen_times_out_instead_of_hanging(own_redis_server: RedisServer) -> None:
    store = open_store(own_redis_server.url() + "?socket_timeout=0.5")  # the URL may shorten the 2 s default
    store.check_health()
    own_redis_server.process.send_signal(signal.SIGSTOP)  # accepts connections, never answers
    try:
        assert_unavailable_quickly(store)
    finally:
        own_redis_server.process.send_signal(signal.SIGCONT)
    store.check_health()
    store.close()


def test_sqlite_locked_by_another_writer_is_unavailable(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "students.db", busy_timeout_s=0.2)
    create(store, "s1")
    holder = sqlite3.connect(tmp_path / "students.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match="database is locked"):
            create(store, "s2")
        assert store.read(MODEL, "s1").interactions == 3  # WAL: readers are not blocked by the writer
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    create(store, "s2")
    store.close()


def test_a_write_the_sqlite_file_was_deleted_under_is_unavailable_not_stored(tmp_path: Path) -> None:
    """The file deleted while a write runs (after the store checked it, before the commit): that write went into the
    unlinked file, lost at the next start, so it must not be answered as stored."""
    directory = tmp_path / "state"
    store = SqliteStateStore(directory / "students.db")
    create(store, "s1")

    def delete_the_file_before_the_insert(statement: str) -> None:
        if statement.startswith("INSERT OR REPLACE") and directory.exists():
            shutil.rmtree(directory)

    store._connection().set_trace_callback(delete_the_file_before_the_insert)
    with pytest.raises(StoreUnavailable, match="deleted or replaced") as unavailable:
        create(store, "s2")
    assert unavailable.value.until_restart
    store.close()


@pytest.mark.parametrize("how", ["directory removed", "file replaced"])
def test_sqlite_file_deleted_or_replaced_under_the_service_is_unavailable(tmp_path: Path, how: str) -> None:
    """Writes went on into the unlinked file, answered as stored and lost at the next start."""
    directory = tmp_path / "state"
    store = SqliteStateStore(directory / "students.db")
    create(store, "s1")
    shutil.rmtree(directory)
    if how == "file replaced":
        SqliteStateStore(directory / "students.db").close()  # another file at the same path
    for call in (lambda: create(store, "s2"), lambda: store.read(MODEL, "s1"), store.check_health):
        with pytest.raises(StoreUnavailable, match="its file was deleted or replaced while the service ran"):
            call()
    store.close()


def test_sqlite_path_that_cannot_be_created_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StoreUnavailable):
        open_store(f"sqlite://{tmp_path / 'a-file' / 'students.db'}")


def test_sqlite_url_sets_the_synchronous_mode(tmp_path: Path) -> None:
    for url, expected in [("", "FULL"), ("?synchronous=normal", "NORMAL"), ("?synchronous=FULL", "FULL")]:
        store = open_store(f"sqlite://{tmp_path / 'students.db'}{url}")
        create(store, f"s{expected}{len(url)}")
        assert store.synchronous == expected
        level = {"FULL": 2, "NORMAL": 1}[expected]
        assert store._connection().execute("PRAGMA synchronous").fetchone()[0] == level
        assert store._connection().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        store.close()
    with pytest.raises(ValueError, match=r"only the option synchronous=full\|normal"):
        open_store(f"sqlite://{tmp_path / 'students.db'}?journal=off")
    with pytest.raises(ValueError, match="MNEMO_STATE_URL sqlite:// option synchronous must be one of full, normal"):
        open_store(f"sqlite://{tmp_path / 'students.db'}?synchronous=off")


def test_state_url_must_name_a_known_store() -> None:
    with pytest.raises(ValueError, match="MNEMO_STATE_URL must start with sqlite:// or redis://"):
        open_store("postgres://user:secret@host/db")
    with pytest.raises(ValueError, match="needs a file path"):
        open_store("sqlite://")


def test_a_redis_url_without_the_redis_extra_says_how_to_install_it() -> None:
    program = (
        "import sys\n"
        "sys.modules['redis'] = None  # as if the optional extra mnemo[redis] were not installed\n"
        "from app.students.io import check_url, open_store\n"
        "for call in (check_url, open_store):\n"
        "    try:\n"
        "        call('redis://127.0.0.1:6379/0')\n"
        "    except ValueError as error:\n"
        "        print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    expected = "MNEMO_STATE_URL is a Redis URL but redis-py is not installed: pip install 'mnemo[redis]'"
    assert done.stdout.splitlines() == [expected, expected], done.stdout + done.stderr


def test_default_state_url_is_a_file_under_the_project_state_directory() -> None:
    from app.core.settings import Settings

    assert Settings.model_fields["state_url"].default == f"sqlite://{ROOT / 'state' / 'students.db'}"
