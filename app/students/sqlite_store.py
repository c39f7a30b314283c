"""The embedded store: one SQLite file in WAL mode, one connection per thread, compare-and-swap under `BEGIN
IMMEDIATE`; a file deleted or replaced under the running service makes it unavailable (writes to it would be lost)."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from app.students.store import Fields, StateStore, StoreUnavailable, StudentState, state_of, stored_count

SCHEMA = """
CREATE TABLE IF NOT EXISTS student_state (
    student_id   TEXT    NOT NULL,
    model        TEXT    NOT NULL,
    memory       BLOB    NOT NULL,
    n_concepts   INTEGER NOT NULL,
    d_v          INTEGER NOT NULL,
    interactions INTEGER NOT NULL,
    model_sha256 TEXT    NOT NULL,
    created_at   REAL    NOT NULL,
    updated_at   REAL    NOT NULL,
    revision     INTEGER NOT NULL,
    PRIMARY KEY (student_id, model)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS store_counter (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO store_counter (name, value) VALUES ('revision', 0);
"""
logger = logging.getLogger("mnemo.students")
STATE_COLUMNS = (
    "model, student_id, memory, n_concepts, d_v, interactions, model_sha256, created_at, updated_at, revision"
)
ONE_STATE = "FROM student_state WHERE student_id = ? AND model = ?"


class SqliteStateStore(StateStore):
    """`StateStore` on one SQLite file (made, with its folder, if missing); `synchronous`: FULL (fsync) or NORMAL."""

    name, driver_errors = "SQLite", sqlite3.Error

    def __init__(self, path: Path, synchronous: str = "FULL", busy_timeout_s: float = 5.0) -> None:
        self.path, self.where, self.synchronous, self._busy_timeout_s = path, str(path), synchronous, busy_timeout_s
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []  # every thread's, for close (list.append and pop are atomic)
        self._opened: os.stat_result | None = None  # the file, once opened
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreUnavailable(
                f"SQLite state store: cannot create its directory: {error.strerror}",
                f"cannot create the state directory {path.parent}: {error.strerror}",
            ) from error
        if self._query("PRAGMA journal_mode=WAL")[0][0] != "wal":
            raise StoreUnavailable(
                "SQLite state store: its file cannot be put in WAL mode",
                f"SQLite state file {path} cannot be put in WAL mode",
            )
        with self._unavailable():
            self._connection().executescript(SCHEMA)
        self._opened = os.stat(path)

    def read(self, model: str, student_id: str) -> StudentState | None:
        rows = self._query(f"SELECT {STATE_COLUMNS} {ONE_STATE}", student_id, model)
        return state_of(*rows[0]) if rows else None

    def _swap(self, fields: Fields, expected_revision: int | None) -> tuple[Any, ...]:
        model, student_id, *_, model_sha256 = fields
        with self._unavailable(), self._connection() as connection:  # COMMIT, or ROLLBACK on an error
            connection.execute("BEGIN IMMEDIATE")  # the write lock before the revision is read
            now = time.time()
            current = connection.execute(f"SELECT revision, model_sha256, created_at {ONE_STATE}", (student_id, model))
            current_revision, stored_sha256, created_at = current.fetchone() or (None, None, now)
            if current_revision != expected_revision or stored_sha256 not in (None, model_sha256):
                return stored_sha256, current_revision
            (revision,) = connection.execute(
                "UPDATE store_counter SET value = value + 1 WHERE name = 'revision' RETURNING value"
            ).fetchone()
            connection.execute(
                f"INSERT OR REPLACE INTO student_state ({STATE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*fields, created_at, now, revision),
            )
        self._check_file()  # deleted or replaced during the write: it went into the unlinked file
        return stored_sha256, current_revision, created_at, now, revision

    def delete(self, student_id: str) -> dict[str, int | None]:
        """Delete the rows (zeroed on their pages: secure_delete), then truncate the WAL so that the erased bytes do not
        linger there; a failed checkpoint (a full disk) is logged, not raised: the delete is committed."""
        with self._unavailable(), self._connection() as connection:
            connection.execute("BEGIN IMMEDIATE")
            rows = connection.execute(
                "DELETE FROM student_state WHERE student_id = ? RETURNING model, interactions", (student_id,)
            ).fetchall()
        try:
            if rows:
                self._connection().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as error:
            logger.warning(
                "student deleted, but the WAL of %s could not be checkpointed (%s): its old pages stay in the WAL "
                "until a later checkpoint",
                self.path,
                error,
            )
        return dict(sorted((str(model), stored_count(interactions)) for model, interactions in rows))

    def ids_after(self, after: str | None, count: int) -> list[str]:
        query = "SELECT DISTINCT student_id FROM student_state WHERE student_id > ? ORDER BY student_id LIMIT ?"
        return [row[0] for row in self._query(query, after or "", count)]

    def check_health(self) -> None:
        self._query("SELECT value FROM store_counter WHERE name = 'revision'")

    def close(self) -> None:
        while self._connections:
            self._connections.pop().close()

    def _query(self, query: str, *parameters: Any) -> list[Any]:
        """The rows of one statement on this thread's connection (sqlite3's messages name no path)."""
        with self._unavailable():
            return self._connection().execute(query, parameters).fetchall()

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection, once the path is checked to name the file opened at startup."""
        self._check_file()
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            connection.execute(f"PRAGMA synchronous={self.synchronous}")
            connection.execute("PRAGMA secure_delete=ON")  # erased students leave no bytes on free pages
            self._local.connection = connection
            self._connections.append(connection)
        return connection

    def _check_file(self) -> None:
        """`StoreUnavailable` until a restart once the path no longer names the file opened at startup."""
        with suppress(OSError):
            if self._opened is None or os.path.samestat(os.stat(self.path), self._opened):
                return
        raise StoreUnavailable(
            "SQLite state store: its file was deleted or replaced while the service ran",
            f"SQLite state file {self.path} was deleted or replaced while the service ran: restart the service "
            "to open the file now there (students written since were kept only in the deleted file)",
            until_restart=True,
        )
