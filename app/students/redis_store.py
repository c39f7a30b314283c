"""The store for several replicas: one Redis database, compare-and-swap in Lua, one hash per student (an erasure is one
DEL); a failed command is never retried (a write whose reply was lost may have been applied)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.students.store import Fields, StateStore, StudentState, UnreadableState, state_of, stored_count

STUDENT_KEY_PREFIX = b"mnemo:student:"
STUDENTS_KEY = b"mnemo:students"
REVISION_KEY = b"mnemo:revision"
ATTRIBUTES = ("memory", "shape", "interactions", "sha256", "created", "updated", "revision")  # StudentState's order
CONNECT_TIMEOUT_S = 1.0
# A write sent to a stalled server (busy, paused) runs when it wakes up, after the client gave up on its reply.
WRITE_OUTCOME_UNKNOWN = (
    "; the append may have been stored all the same: retry it with expected_interactions, or read the student first"
)
REPLY_TIMEOUT_S = 2.0

# KEYS: student hash, id set, revision counter. ARGV: model, expected revision ('' = absent), memory blob,
# shape, interactions, sha256, student id. Returns {stored sha256, current revision}, followed by
# {created, updated, revision} when written (the revision and the sha256 matched).
WRITE_SCRIPT = """
redis.replicate_commands()  -- Redis 5 and 6: allow TIME before writes (the default from Redis 7 on)
local model = ARGV[1]
local current = redis.call('HGET', KEYS[1], 'revision:' .. model) or ''
local stored_sha256 = redis.call('HGET', KEYS[1], 'sha256:' .. model) or ARGV[6]
if current ~= ARGV[2] or stored_sha256 ~= ARGV[6] then return {stored_sha256, current} end
redis.call('ZSCORE', KEYS[2], ARGV[7])  -- an id set of another type fails here, before the first write
local clock = redis.call('TIME')
local now = clock[1] .. '.' .. string.format('%06d', tonumber(clock[2]))
local created = redis.call('HGET', KEYS[1], 'created:' .. model) or now
local revision = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'memory:' .. model, ARGV[3], 'shape:' .. model, ARGV[4],
           'interactions:' .. model, ARGV[5], 'sha256:' .. model, ARGV[6], 'created:' .. model, created,
           'updated:' .. model, now, 'revision:' .. model, revision)
redis.call('ZADD', KEYS[2], 0, ARGV[7])
return {stored_sha256, current, created, now, revision}
"""


class RedisStateStore(StateStore):
    """`StateStore` over a Redis database given by a `redis://host:port/db` URL."""

    name, driver_errors, tells_driver_messages = "Redis", redis.RedisError, False  # its messages may name the host
    refusals = redis.ResponseError  # the script fails before its first write

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(
            url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=REPLY_TIMEOUT_S, retry=Retry(NoBackoff(), 0)
        )
        self._write_script = self._client.register_script(WRITE_SCRIPT)
        where = self._client.connection_pool.connection_kwargs
        self.where = f"{where.get('host', where.get('path'))}:{where.get('port', '')}/{where.get('db', 0)}"

    def read(self, model: str, student_id: str) -> StudentState | None:
        with self._unavailable():
            try:
                values = self._client.hmget(_student_key(student_id), [f"{name}:{model}" for name in ATTRIBUTES])
            except redis.ResponseError as error:
                if not str(error).startswith("WRONGTYPE"):
                    raise
                raise UnreadableState(model, student_id, "its Redis key is not a hash") from None
        if all(value is None for value in values):
            return None
        memory, shape, *stored = values
        rows, _, columns = (None, None, None) if shape is None else shape.partition(b",")
        return state_of(model, student_id, memory, rows, columns, *stored)

    def _swap(self, fields: Fields, expected_revision: int | None) -> tuple[Any, ...]:
        model, student_id, blob, rows, columns, interactions, model_sha256 = fields
        expected = "" if expected_revision is None else str(expected_revision)
        with self._unavailable(WRITE_OUTCOME_UNKNOWN):
            stored_sha256, current, *written = self._write_script(
                keys=[_student_key(student_id), STUDENTS_KEY, REVISION_KEY],
                args=[model, expected, blob, f"{rows},{columns}", interactions, model_sha256, student_id],
            )
        return stored_sha256.decode(), current.decode() or None, *written

    def delete(self, student_id: str) -> dict[str, int | None]:
        key = _student_key(student_id)
        with self._unavailable():  # one MULTI/EXEC transaction; a key that is not a hash is erased as holding nothing
            pipeline = self._client.pipeline().hgetall(key).delete(key).zrem(STUDENTS_KEY, student_id)
            stored, *_ = pipeline.execute(raise_on_error=False)
        stored = {} if isinstance(stored, redis.ResponseError) else stored
        models = sorted({field.decode(errors="replace").partition(":")[2] for field in stored} - {""})
        return {model: stored_count(stored.get(f"interactions:{model}".encode())) for model in models}

    def ids_after(self, after: str | None, count: int) -> list[str]:
        low = b"-" if after is None else b"(" + after.encode()
        with self._unavailable():
            return [member.decode() for member in self._client.zrangebylex(STUDENTS_KEY, low, b"+", start=0, num=count)]

    def check_health(self) -> None:
        with self._unavailable():
            self._client.ping()

    def close(self) -> None:
        self._client.close()


def _student_key(student_id: str) -> bytes:
    return STUDENT_KEY_PREFIX + student_id.encode()
