"""The store's SQLite layout and its versions: the ``meta`` and ``results`` tables, the upgrade
steps (``_STEPS[v]`` takes a version-``v`` store to ``v + 1``; ``STORE_VERSION`` of them), a
result as a row, the write transaction, and the switch to write-ahead logging.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator

from whichgpu.schema import SCHEMA_VERSION, BenchResult
from whichgpu.store.records import _utc_text

STORE_FORMAT = "whichgpu-results"
"""Value of ``format`` in the ``meta`` table: what marks a SQLite file as a whichgpu store."""

STORE_VERSION = 1
"""Version of the store's table layout (``store_version`` in the ``meta`` table)."""

BUSY_TIMEOUT_S = 30.0
"""How long an operation waits for another process's write lock before it gives up, s."""
WAL_RETRY_S = 0.05
"""Pause between attempts to switch a new store to write-ahead logging."""


def _create_v1(conn: sqlite3.Connection) -> None:
    """Version 0 (an empty file) to 1: the ``meta`` and ``results`` tables."""
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?)",
        [("format", STORE_FORMAT), ("store_version", "0")],
    )
    conn.execute(
        """
        CREATE TABLE results (
            id TEXT PRIMARY KEY,
            created_at TEXT NOT NULL,
            workload TEXT NOT NULL,
            device_name TEXT NOT NULL,
            gpu TEXT,
            precision TEXT NOT NULL,
            n_gpus INTEGER NOT NULL,
            batch_size INTEGER NOT NULL,
            throughput REAL,
            schema_version INTEGER NOT NULL,
            result_json TEXT NOT NULL
        )
        """
    )
    conn.execute("CREATE INDEX results_by_created_at ON results (created_at)")
    conn.execute("CREATE INDEX results_by_workload ON results (workload, precision)")
    conn.execute("CREATE INDEX results_by_device_name ON results (device_name)")
    conn.execute("CREATE INDEX results_by_gpu ON results (gpu)")


_STEPS: tuple[Callable[[sqlite3.Connection], None], ...] = (_create_v1,)
"""``_STEPS[v]`` upgrades a version-``v`` store to ``v + 1`` (``STORE_VERSION`` of them)."""


def _row(result: BenchResult) -> tuple[object, ...]:
    return (
        result.id,
        _utc_text(result.created_at),
        result.workload,
        result.device_name,
        result.gpu,
        result.precision,
        result.n_gpus,
        result.batch_size,
        result.throughput,
        SCHEMA_VERSION,
        result.model_dump_json(),
    )


_INSERT = (
    "INSERT OR IGNORE INTO results (id, created_at, workload, device_name, gpu, precision, "
    "n_gpus, batch_size, throughput, schema_version, result_json) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_ORDER = " ORDER BY created_at DESC, id DESC"


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction holding the write lock from its start; rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _ensure_wal(conn: sqlite3.Connection) -> None:
    """Put the store in write-ahead-log mode (once: the mode is kept in the file).

    Switching needs the file to itself, and SQLite answers "locked" at once rather than waiting
    when another process is creating the store at the same moment, so the switch is retried
    until the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        if mode == "wal":
            return
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(WAL_RETRY_S)
