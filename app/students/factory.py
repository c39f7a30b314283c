"""`open_store(url)`: the one place that turns MNEMO_STATE_URL into a store."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from app.students.sqlite_store import SqliteStateStore
from app.students.store import StateStore

SQLITE_PREFIX = "sqlite://"
REDIS_SCHEMES = ("redis", "rediss", "unix")


def open_store(url: str) -> StateStore:
    """`sqlite:///abs/path.db` (a relative path after `sqlite://` is taken from the working directory) or
    `redis://host:port/db` (also `rediss://` and `unix://`). The URL is never echoed: it may hold a password.
    """
    if url.startswith(SQLITE_PREFIX):
        path = url.removeprefix(SQLITE_PREFIX)
        if not path:
            raise ValueError("MNEMO_STATE_URL sqlite:// needs a file path, e.g. sqlite:///var/lib/mnemo/students.db")
        return SqliteStateStore(Path(path).resolve())
    scheme = urlsplit(url).scheme
    if scheme in REDIS_SCHEMES:
        try:  # redis-py is the optional extra mnemo[redis]: an SQLite-only install does not need it
            from app.students.redis_store import RedisStateStore
        except ModuleNotFoundError as error:
            raise ValueError(
                "MNEMO_STATE_URL is a Redis URL but redis-py is not installed: pip install 'mnemo[redis]'"
            ) from error
        return RedisStateStore(url)
    raise ValueError(
        f"MNEMO_STATE_URL must start with sqlite:// or redis:// (also rediss://, unix://); got scheme {scheme!r}"
    )
