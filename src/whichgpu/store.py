"""The results store: every ``BenchResult`` measured here or imported, kept in one SQLite file.

Over 600 lines because the store, its versioned layout and its file formats share one set of
checks (what a valid, plausible record is); the export and import formats and ``pivot_results``
(Lambda-style tables) are the seams along which it splits next.

``ResultStore`` keeps each result as one row (the full result as JSON beside indexed columns)
in ``settings.store_path()`` (``$WHICHGPU_STORE``, ``--store``): atomic WAL transactions,
several writers at once, never destructive, versioned with upgrade steps (``_STEPS``) and a
backup before each upgrade. Results travel as JSON or CSV files, and an imported record must be
a valid and possible measurement (``_implausible``). What it promises, and the file formats,
are in ``docs/bench.md`` ("Results store").
"""

from __future__ import annotations

import builtins
import contextlib
import csv
import datetime as dt
import functools
import io
import json
import math
import os
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

from pydantic import BaseModel, ConfigDict, ValidationError

from whichgpu import settings
from whichgpu.errors import StoreError, UsageError
from whichgpu.files import check_output_file, path_problem, write_atomically
from whichgpu.schema import SCHEMA_VERSION, BenchResult

ExportFormat = Literal["json", "csv"]
"""File formats of ``ResultStore.export`` and ``ResultStore.import_file``."""

STORE_FORMAT = "whichgpu-results"
"""Value of ``format`` in the ``meta`` table: what marks a SQLite file as a whichgpu store."""

STORE_VERSION = 1
"""Version of the store's table layout (``store_version`` in the ``meta`` table)."""

BUSY_TIMEOUT_S = 30.0
"""How long an operation waits for another process's write lock before it gives up, s."""
WAL_RETRY_S = 0.05
"""Pause between attempts to switch a new store to write-ahead logging."""

CSV_JSON_FIELDS = ("run", "per_rank", "notes", "environment")
"""``BenchResult`` fields that CSV holds as JSON text, in a column named ``<field>_json``."""

_CSV_FLAT = tuple(name for name in BenchResult.model_fields if name not in CSV_JSON_FIELDS)

CSV_COLUMNS = (*_CSV_FLAT, *(f"{name}_json" for name in CSV_JSON_FIELDS), "schema_version")
"""Header of an exported CSV file: one column per flat field, then the JSON columns."""

COUNT_LIMIT = 2**31 - 1
"""Largest count (batch, length, steps, devices) a stored result may hold."""
BYTES_LIMIT = 2**63 - 1
"""Largest byte count a stored result may hold: SQLite's largest integer."""
CLOCK_SKEW = dt.timedelta(days=1)
"""How far in the future an imported result's ``created_at`` may lie (clocks disagree)."""

_NEWER = "Upgrade whichgpu (pip install --upgrade whichgpu) to read it"
_ELSEWHERE = f"Point --store (or ${settings.ENV_STORE}) at another file, or move this one away"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ImportSummary(_Record):
    """What ``ResultStore.import_file`` did with a file."""

    path: str
    """The file read."""
    format: ExportFormat
    """Its format."""
    records: int
    """Results in the file."""
    added: int
    """Results added to the store."""
    already_present: int
    """Results the store already held (same id, same values), left as they were."""
    unknown_gpus: tuple[str, ...] = ()
    """GPUs (catalog ids) the file's results name that this whichgpu's catalog does not know,
    as a newer whichgpu may write: those results are stored but not used for predictions."""
    unknown_gpu_results: int = 0
    """Results of the file on those GPUs."""


class ExportSummary(_Record):
    """What ``ResultStore.export`` wrote."""

    path: str
    """The file written."""
    format: ExportFormat
    """Its format."""
    results: int
    """Results written."""


class PivotCell(_Record):
    """One workload on one device in the Lambda-style tables: the newest result for it."""

    result_id: str
    """Id of the result shown."""
    batch_size: int
    """Batch per device the throughput was measured at."""
    max_batch_size: int | None
    """Largest batch that ran, when it was searched."""
    throughput: float | None
    """Units per second over all devices of the run (None if the run did not fit)."""
    relative_throughput: float | None
    """Throughput over the reference device's in the same row (None without one)."""
    results: int
    """Stored results for this workload and device; the newest is shown."""


class PivotRow(_Record):
    """One workload setting across devices: the run options that change the speed (mode,
    method, precision, sequence length, optimizer, checkpointing) are the same in a row."""

    workload: str
    """Workload measured."""
    mode: str
    """``train`` or ``inference``."""
    method: str
    """``full``, ``lora`` or ``qlora``."""
    precision: str
    """Precision of the runs."""
    seq_len: int | None
    """Tokens per sequence (sequence models)."""
    optimizer: str
    """Optimizer of the runs."""
    checkpointing: bool
    """Whether the runs used gradient checkpointing."""
    throughput_unit: str
    """Unit of the throughputs (``images/s`` …)."""
    cells: dict[str, PivotCell]
    """Per device label (see ``device_label``), the devices this row was measured on."""

    @property
    def label(self) -> str:
        """The setting in words: workload and precision, then what differs from a full AMP
        training run with AdamW (``llama-3.1-8b bf16 qlora seq 2048 checkpointing``)."""
        words = [self.workload, self.precision]
        if self.method != "full":
            words.append(self.method)
        if self.mode != "train":
            words.append(self.mode)
        if self.seq_len:
            words.append(f"seq {self.seq_len}")
        if self.mode == "train" and self.optimizer != "adamw":
            words.append(self.optimizer)
        if self.checkpointing:
            words.append("checkpointing")
        return " ".join(words)


class ResultPivot(_Record):
    """Results arranged as Lambda's tables: rows of workloads, columns of devices."""

    devices: tuple[str, ...]
    """Column labels (see ``device_label``): the reference, then by name and device count."""
    rows: tuple[PivotRow, ...]
    """One per workload setting, by name."""
    reference: str | None
    """Device the relative throughputs are divided by (None when nothing has a throughput)."""
    reference_chosen: bool
    """Whether the caller named the reference (else it is the device measured most)."""
    notes: tuple[str, ...]
    """What the reader should know (newest-result rule, rows without the reference)."""


class ResultLookupError(StoreError, UsageError):
    """An id (or id prefix) names no stored result, or several.

    A ``StoreError`` (it concerns the store) and a ``UsageError`` (bad input: the CLI exits with
    code 2, as for an unknown GPU).
    """

    def __init__(self, message: str, query: str, candidates: Sequence[str] = ()) -> None:
        self.query = query
        self.candidates = tuple(candidates)
        super().__init__(message)


class ImportFileError(StoreError, UsageError):
    """A file given to ``import_file`` cannot be imported; the message names the file, the
    record (JSON) or line (CSV), and the field. Nothing of the file is imported."""

    def __init__(self, path: Path, problems: Sequence[str], advice: str | None = None) -> None:
        self.path = str(path)
        self.problems = tuple(problems)
        shown = "; ".join(problems[:3])
        if len(problems) > 3:
            shown += f"; and {len(problems) - 3} more problems"
        advice = advice or (
            "Fix the file (its format is described in docs/bench.md, 'Results store'), or "
            "export it again with `whichgpu results export`"
        )
        super().__init__(f"{path}: {shown}. Nothing was imported. {advice}.")


# --- Layout and its versions -----------------------------------------------------------------


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


def _utc_text(moment: dt.datetime) -> str:
    """A time as sortable UTC text (a time without a zone is taken as UTC, as results are)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


class NewerSchemaError(StoreError):
    """A result written under a newer ``SCHEMA_VERSION`` than this whichgpu reads."""

    def __init__(self, where: str, version: int) -> None:
        self.reason = (
            f"{where} was written by a newer whichgpu (result schema version {version}; this "
            f"whichgpu reads up to {SCHEMA_VERSION})"
        )
        super().__init__(f"{self.reason}. {_NEWER}.")


def _check_schema_version(version: object, where: str) -> None:
    """Refuse a result written under a newer (or a nonsensical) ``SCHEMA_VERSION``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StoreError(f"{where}: schema_version must be a whole number >= 1, not {version!r}")
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(where, version)


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


# --- The store --------------------------------------------------------------------------------


class ResultStore:
    """Benchmark results in a SQLite file, safe against crashes and concurrent writers.

    >>> store = ResultStore()            # settings.store_path(): $WHICHGPU_STORE or the default
    >>> store.add(result)                # doctest: +SKIP
    >>> store.list(workload="resnet50")  # newest first  # doctest: +SKIP

    Nothing touches the disk until an operation runs; each operation opens the file, does its
    work in one transaction and closes it, so a ``ResultStore`` may live as long as you like and
    be shared with child processes.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else settings.store_path()
        """The SQLite file (it may not exist yet)."""

    def __repr__(self) -> str:
        return f"ResultStore({str(self.path)!r})"

    # -- writing

    def add(self, result: BenchResult) -> str:
        """Store one result and return its id.

        Adding a result that is already stored (same id, same values) changes nothing; a
        different result under a stored id raises ``StoreError``.
        """
        self.add_many([result])
        return result.id

    def add_many(self, results: Iterable[BenchResult]) -> int:
        """Store several results in one transaction; return how many were new.

        All or nothing: if one of them conflicts with a stored result (same id, other values),
        ``StoreError`` is raised and none is added.
        """
        batch = builtins.list(results)
        if not batch:
            return 0
        for result in batch:
            beyond = _out_of_range(result.model_dump())
            if beyond:
                field, why = beyond[0]
                raise UsageError(
                    f"Result {result.id} cannot be stored: field '{field}' {why}. Nothing was "
                    "added; correct the result first."
                )
        with self._session(create=True) as conn:
            assert conn is not None
            with _transaction(conn):
                added, _, conflicts = self._insert(conn, batch)
                if conflicts:
                    ids = ", ".join(batch[i].id for i in conflicts[:5])
                    raise StoreError(
                        f"The results store {self.path} already holds a different result with "
                        f"id {ids}; stored results are never overwritten, so nothing was added. "
                        "Give the new result a new id, or delete the stored one first "
                        "(`whichgpu results delete ID`)."
                    )
        return added

    def delete(self, id_or_prefix: str) -> BenchResult:
        """Remove the result with this id (or unique id prefix) and return it.

        Raises ``ResultLookupError`` when no result, or more than one, matches.
        """
        with self._session(create=False) as conn:
            if conn is None:
                raise self._not_found(id_or_prefix, empty=True)
            with _transaction(conn):
                found = self._find(conn, id_or_prefix)
                conn.execute("DELETE FROM results WHERE id = ?", (found[0],))
        return self._parse(*found)

    # -- reading

    def get(self, id_or_prefix: str) -> BenchResult:
        """The result with this id, or with the only id that starts with it (case-insensitive).

        Raises ``ResultLookupError`` when no result matches, or several do (it lists them).
        """
        with self._session(create=False) as conn:
            if conn is None:
                raise self._not_found(id_or_prefix, empty=True)
            found = self._find(conn, id_or_prefix)
        return self._parse(*found)

    def list(
        self,
        *,
        workload: str | None = None,
        gpu: str | None = None,
        device: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[BenchResult]:
        """Stored results, newest first.

        ``workload`` and ``gpu`` (a catalog id) must match exactly, ignoring case; ``device``
        matches any part of the name the device reports (``H200``, ``Ryzen``). ``limit`` keeps
        the newest that many. A store that does not exist holds no results.
        """
        if limit is not None and limit < 1:
            raise UsageError(f"The limit must be 1 or more, not {limit}.")
        clauses: builtins.list[str] = []
        params: builtins.list[object] = []
        if workload is not None:
            clauses.append("workload = ? COLLATE NOCASE")
            params.append(workload)
        if gpu is not None:
            clauses.append("gpu = ? COLLATE NOCASE")
            params.append(gpu)
        if device is not None:
            clauses.append("instr(lower(device_name), lower(?)) > 0")
            params.append(device)
        sql = "SELECT id, schema_version, result_json FROM results"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += _ORDER
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._session(create=False) as conn:
            if conn is None:
                return []
            rows = conn.execute(sql, params).fetchall()
        return [self._parse(*row) for row in rows]

    # -- files

    def own_files(self) -> builtins.list[tuple[Path, str]]:
        """The store's file and SQLite's companions of it (write-ahead log, shared memory,
        rollback journal), each with what it is: files no export or report may replace."""
        companions = (
            ("-wal", "write-ahead log"),
            ("-shm", "shared memory"),
            ("-journal", "journal"),
        )
        return [
            (self.path, "the results store"),
            *(
                (self.path.with_name(self.path.name + suffix), f"the results store's {what}")
                for suffix, what in companions
            ),
        ]

    def export(
        self,
        path: Path,
        fmt: str | None = None,
        *,
        workload: str | None = None,
        gpu: str | None = None,
        device: str | None = None,
    ) -> ExportSummary:
        """Write the stored results (oldest first; filtered as ``list``) to a JSON or CSV file.

        The format comes from ``fmt``, else from the file's extension (``.json``, ``.csv``).
        The file is written beside its final name and renamed into place, so it is either the
        old file or the whole new one, never half written. ``import_file`` reads it back.

        Refused with a ``UsageError``, leaving every file as it was: a folder, the store itself
        (or its companion files), any other SQLite database, and an existing file when no
        result would be written (a mistyped store or filter would otherwise empty it).
        """
        path = Path(path).expanduser()
        check_output_file(path, protected=self.own_files())
        fmt = format_of(path, fmt)
        results = self.list(workload=workload, gpu=gpu, device=device)
        if not results and path.is_file():
            raise UsageError(self._nothing_to_export(path, workload, gpu, device))
        results.reverse()
        write_results_file(path, results, fmt)
        return ExportSummary(path=str(path), format=fmt, results=len(results))

    def _nothing_to_export(
        self, path: Path, workload: str | None, gpu: str | None, device: str | None
    ) -> str:
        """Why an export found no results, and why that leaves ``path`` as it was."""
        filters = ", ".join(
            f"{name} '{value}'"
            for name, value in (("workload", workload), ("gpu", gpu), ("device", device))
            if value is not None
        )
        if not self.path.exists():
            why = f"the results store {self.path} does not exist"
        elif filters:
            why = f"no result in {self.path} matches {filters}"
        else:
            why = f"the results store {self.path} holds no results"
        return (
            f"Nothing to export: {why}, so {path} was left as it was rather than replaced by an "
            f"empty file. Check the store's path (--store, ${settings.ENV_STORE}) and the "
            "filters (`whichgpu results list` shows what is stored); to empty the file on "
            "purpose, delete it first."
        )

    def import_file(self, path: Path, fmt: str | None = None) -> ImportSummary:
        """Add the results of a JSON or CSV file (as ``export`` writes them) to the store.

        Every record is validated before anything is written; an invalid one raises
        ``ImportFileError`` naming the file, the record (JSON) or line (CSV) and the field, and
        nothing is imported. Results already stored (same id, same values) are counted and
        left as they are, so importing a file twice adds nothing the second time; a record with
        a stored id but other values is an error. JSON may also be what ``--json`` prints:
        a list of results, or one result.

        Results on GPUs this whichgpu's catalog does not know (``gpu`` names no catalog GPU, as
        a newer whichgpu's results may) are stored, and counted in ``unknown_gpus`` and
        ``unknown_gpu_results``: predictions cannot use them.
        """
        path = Path(path).expanduser()
        problem = path_problem(path)
        if problem is not None:
            raise ImportFileError(
                path, [f"it {problem}"], "Give the name of a file `whichgpu results export` wrote"
            )
        fmt = format_of(path, fmt)
        records = read_results_file(path, fmt)
        unknown = [r.gpu for _, r in records if r.gpu is not None and catalog_gpu(r.gpu) is None]
        added = present = 0
        if records:
            with self._session(create=True) as conn:
                assert conn is not None
                with _transaction(conn):
                    added, present, conflicts = self._insert(conn, [r for _, r in records])
                    if conflicts:
                        problems = [
                            f"{records[i][0]}: id {records[i][1].id} is already stored with "
                            "other values (results are never overwritten)"
                            for i in conflicts
                        ]
                        raise ImportFileError(path, problems)
        return ImportSummary(
            path=str(path),
            format=fmt,
            records=len(records),
            added=added,
            already_present=present,
            unknown_gpus=tuple(sorted(set(unknown))),
            unknown_gpu_results=len(unknown),
        )

    # -- internals

    @contextlib.contextmanager
    def _session(self, *, create: bool) -> Iterator[sqlite3.Connection | None]:
        """An open, checked, up-to-date connection (None: no store and ``create`` is False);
        SQLite's and the file system's errors become ``StoreError``s naming the file."""
        conn: sqlite3.Connection | None = None
        try:
            conn = self._open(create=create)
            yield conn
        except sqlite3.Error as exc:
            raise self._sqlite_error(exc) from exc
        finally:
            if conn is not None:
                conn.close()

    def _open(self, *, create: bool) -> sqlite3.Connection | None:
        path = self.path
        if path.is_dir():
            raise StoreError(f"{path} is a folder, not a results store file. {_ELSEWHERE}.")
        exists = path.exists()
        if not exists and not create:
            return None
        if not exists:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"Cannot create the folder of the results store {path} ({exc.strerror}). "
                    f"{_ELSEWHERE}."
                ) from exc
        read_only = exists and not create and not os.access(path, os.W_OK)
        mode = "ro" if read_only else "rwc" if create else "rw"
        conn = sqlite3.connect(
            f"{path.absolute().as_uri()}?mode={mode}",
            uri=True,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,
        )
        try:
            version = self._version(conn)  # reads only: a foreign file is refused untouched
            if version == 0 and not create:
                conn.close()
                return None
            if not read_only:
                _ensure_wal(conn)
                conn.execute("PRAGMA synchronous = FULL")
            if version < STORE_VERSION:
                self._upgrade(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _version(self, conn: sqlite3.Connection) -> int:
        """The store's layout version (0 for an empty database); refuses foreign and newer."""
        tables = sorted(
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        )
        if not tables:
            return 0
        meta: dict[str, str] = {}
        if "meta" in tables:
            with contextlib.suppress(sqlite3.OperationalError):
                meta = {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM meta")}
        if meta.get("format") != STORE_FORMAT:
            raise StoreError(
                f"{self.path} is a SQLite database but not a whichgpu results store (its tables: "
                f"{', '.join(tables)}). It was left untouched. {_ELSEWHERE}."
            )
        raw = meta.get("store_version", "")
        if not raw.isdigit():
            raise StoreError(
                f"The results store {self.path} is damaged: its store_version is {raw!r}. It was "
                f"left untouched. {_ELSEWHERE}, and import your latest export into a new store."
            )
        version = int(raw)
        if version > STORE_VERSION:
            raise StoreError(
                f"The results store {self.path} was written by a newer whichgpu (store version "
                f"{version}; this whichgpu reads up to {STORE_VERSION}). {_NEWER}, or "
                f"{_ELSEWHERE[0].lower()}{_ELSEWHERE[1:]}."
            )
        return version

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        """Bring the store to ``STORE_VERSION`` in one transaction, after saving a copy."""
        with _transaction(conn):
            version = self._version(conn)  # again, under the lock: another process may have
            if 0 < version < STORE_VERSION:  # upgraded (or created) it meanwhile
                self._save_copy(version)
            for step in range(version, STORE_VERSION):
                _STEPS[step](conn)
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'store_version'", (str(step + 1),)
                )

    def _save_copy(self, version: int) -> Path:
        """Copy the store to ``<name>.v<version>.bak`` (a free name) before upgrading it.

        Called while the upgrading connection holds the write lock: the copy is read through a
        second connection, which may read (nobody else can write) until the upgrade commits.
        """
        target = self.path.with_name(f"{self.path.name}.v{version}.bak")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.v{version}.{n}.bak")
            n += 1
        source = sqlite3.connect(
            f"{self.path.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S
        )
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            copy.close()
            source.close()
        return target

    def _insert(
        self, conn: sqlite3.Connection, results: Sequence[BenchResult]
    ) -> tuple[int, int, builtins.list[int]]:
        """Insert new results: (added, already stored with the same values, conflicting indexes)."""
        added = present = 0
        conflicts: builtins.list[int] = []
        for i, result in enumerate(results):
            if conn.execute(_INSERT, _row(result)).rowcount == 1:
                added += 1
                continue
            stored = conn.execute(
                "SELECT id, schema_version, result_json FROM results WHERE id = ?", (result.id,)
            ).fetchone()
            if self._parse(*stored).model_dump_json() == result.model_dump_json():
                present += 1
            else:
                conflicts.append(i)
        return added, present, conflicts

    def _find(self, conn: sqlite3.Connection, query: str) -> tuple[str, int, str]:
        """The (id, schema_version, json) row of the one result ``query`` names."""
        key = query.strip()
        if not key:
            raise ResultLookupError(
                "An empty id names no result. `whichgpu results list` shows the ids.", query
            )
        row = conn.execute(
            "SELECT id, schema_version, result_json FROM results WHERE id = ?", (key,)
        ).fetchone()
        if row is not None:
            return (str(row[0]), int(row[1]), str(row[2]))
        escaped = key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = conn.execute(
            "SELECT id, schema_version, result_json, workload, device_name, gpu, n_gpus, "
            "created_at FROM results WHERE id LIKE ? ESCAPE '\\'" + _ORDER + " LIMIT 11",
            (escaped + "%",),
        ).fetchall()
        if not rows:
            total = conn.execute("SELECT count(*) FROM results").fetchone()[0]
            raise self._not_found(query, empty=total == 0)
        if len(rows) > 1:
            width = 12  # long enough to tell the ids shown apart
            longest = max(len(str(r[0])) for r in rows)
            while width < longest and len({str(r[0])[:width] for r in rows[:10]}) < len(rows[:10]):
                width += 4
            shown = [
                f"{r[0][:width]} ({r[3]} on {f'{r[6]}x ' if r[6] > 1 else ''}{r[5] or r[4]}, "
                f"{str(r[7])[:10]})"
                for r in rows[:10]
            ]
            more = " and more" if len(rows) > 10 else ""
            raise ResultLookupError(
                f"'{key}' is the start of several result ids in {self.path}: "
                f"{'; '.join(shown)}{more}. Give more of the id.",
                query,
                [str(r[0]) for r in rows],
            )
        return (str(rows[0][0]), int(rows[0][1]), str(rows[0][2]))

    def _not_found(self, query: str, *, empty: bool) -> ResultLookupError:
        if empty:
            return ResultLookupError(
                f"No result has the id '{query}': the results store {self.path} holds none yet. "
                "`whichgpu bench` measures one; `whichgpu results import FILE` adds results "
                "exported elsewhere.",
                query,
            )
        return ResultLookupError(
            f"No result in {self.path} has an id that starts with '{query}'. "
            "`whichgpu results list` shows the ids.",
            query,
        )

    def _parse(self, result_id: str, version: int, text: str) -> BenchResult:
        """A stored row back to a ``BenchResult`` (a damaged row is a ``StoreError``)."""
        where = f"Result {result_id} in the results store {self.path}"
        _check_schema_version(version, where)
        try:
            return BenchResult.model_validate_json(text)
        except ValidationError as exc:
            raise StoreError(
                f"{where} cannot be read ({_first_problem(exc)}): the store has been changed by "
                f"something other than whichgpu. It was left untouched. {_ELSEWHERE}, and "
                "import your latest export into a new store."
            ) from exc

    def _sqlite_error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        low = text.lower()
        path = self.path
        if "not a database" in low:
            return StoreError(
                f"{path} is not a SQLite database, so it cannot be a whichgpu results store "
                f"(SQLite: {text}). It was left untouched. {_ELSEWHERE}."
            )
        if "malformed" in low or "corrupt" in low:
            return StoreError(
                f"The results store {path} is damaged (SQLite: {text}). It was left untouched. "
                f"{_ELSEWHERE}, and import your latest export into a new store."
            )
        if "locked" in low or "busy" in low:
            return StoreError(
                f"The results store {path} stayed locked by another process for "
                f"{BUSY_TIMEOUT_S:.0f} s (SQLite: {text}). Try again when it has finished."
            )
        if "readonly" in low or "read-only" in low:
            return StoreError(
                f"The results store {path} is read-only (SQLite: {text}). Make it writable, "
                "or choose another file with --store."
            )
        return StoreError(
            f"The results store {path} could not be used (SQLite: {text}). Check that the file "
            "and its folder exist and are writable, or choose another file with --store."
        )


# --- Files ------------------------------------------------------------------------------------


def format_of(path: Path, fmt: str | None = None) -> ExportFormat:
    """The export format: ``fmt`` if given, else from the extension (``.json`` or ``.csv``)."""
    chosen = (fmt or Path(path).suffix.lstrip(".")).lower()
    if chosen == "json":
        return "json"
    if chosen == "csv":
        return "csv"
    if fmt:
        raise UsageError(f"Unknown results file format '{fmt}': use json or csv.")
    raise UsageError(
        f"Cannot tell the format of {path} from its extension: name it .json or .csv "
        "(or give --format json|csv)."
    )


def _write_atomically(path: Path, write: Callable[[TextIO], None]) -> None:
    """Write through a new temporary file beside ``path``, then rename it into place."""

    def text(out: BinaryIO) -> None:
        wrapper = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
        write(wrapper)
        wrapper.flush()
        wrapper.detach()  # the binary file stays open for the caller to sync and close

    try:
        write_atomically(path, text)
    except OSError as exc:
        raise StoreError(
            f"Cannot write {path} ({exc.strerror or exc}). Choose a file in a writable folder."
        ) from exc


def _write_json(out: TextIO, results: Sequence[BenchResult]) -> None:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "results": [r.model_dump(mode="json") for r in results],
    }
    out.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def _csv_cell(value: Any) -> str:
    """A flat value as CSV text: empty for None, ``true``/``false``, shortest exact float."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _write_csv(out: TextIO, results: Sequence[BenchResult]) -> None:
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for result in results:
        doc = result.model_dump(mode="json")
        row = [_csv_cell(doc[name]) for name in _CSV_FLAT]
        row += [json.dumps(doc[name], ensure_ascii=False) for name in CSV_JSON_FIELDS]
        row.append(str(SCHEMA_VERSION))
        writer.writerow(row)


def _first_problem(exc: ValidationError, rename: Callable[[str], str] = str) -> str:
    """``field 'a.b': message`` for the first error of a validation (and how many more)."""
    errors = exc.errors()
    first = errors[0]
    loc = [str(part) for part in first["loc"]]
    field = ".".join([rename(loc[0]), *loc[1:]]) if loc else ""
    text = f"field '{field}': {first['msg']}" if field else str(first["msg"])
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text


def _validate(
    doc: object, where: str, problems: builtins.list[str], rename: Callable[[str], str] = str
) -> BenchResult | None:
    """One record to a ``BenchResult``; a problem is appended (naming where) when it fails."""
    if not isinstance(doc, dict):
        problems.append(f"{where}: a result must be a JSON object, not {type(doc).__name__}")
        return None
    record = dict(doc)
    if "schema_version" in record:
        try:
            _check_schema_version(record.pop("schema_version"), where)
        except NewerSchemaError:
            raise
        except StoreError as exc:
            problems.append(str(exc))
            return None
    try:
        result = BenchResult.model_validate(record)
    except ValidationError as exc:
        problems.append(f"{where}, {_first_problem(exc, rename)}")
        return None
    impossible = _implausible(result, dt.datetime.now(dt.timezone.utc))
    if impossible:
        field, why = impossible[0]
        head, _, rest = field.partition(".")
        text = f"{where}, field '{rename(head)}{'.' if rest else ''}{rest}': {why}"
        if len(impossible) > 1:
            text += f" (and {len(impossible) - 1} more)"
        problems.append(text)
        return None
    return result


def _implausible(result: BenchResult, now: dt.datetime) -> builtins.list[tuple[str, str]]:
    """(field, why) for each value of ``result`` no measurement can have, though its type
    allows it: an empty workload or precision, an MFU or utilisation outside 0-1, a time in
    the future (beyond ``CLOCK_SKEW``), a count or byte count SQLite cannot hold, or a number
    that is not finite."""
    found: builtins.list[tuple[str, str]] = [
        (field, "is empty; a result names what it measured")
        for field in ("workload", "precision")
        if not getattr(result, field).strip()
    ]
    if result.mfu is not None and not 0 <= result.mfu <= 1:
        found.append(
            (
                "mfu",
                f"is {result.mfu:g} ({result.mfu:.0%}), not a fraction from 0 to 1: no run does "
                "more than its GPU's peak FLOPs",
            )
        )
    if result.utilization is not None and not 0 <= result.utilization <= 1:
        found.append(
            ("utilization", f"is {result.utilization:g}, not a fraction of the time from 0 to 1")
        )
    created = result.created_at
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.timezone.utc)
    if created > now + CLOCK_SKEW:
        found.append(
            (
                "created_at",
                f"is {_utc_text(created)[:19]}Z, in the future: a result is made when it is "
                "measured (is the clock of the machine that measured it right?)",
            )
        )
    found.extend(_out_of_range(result.model_dump()))
    return found


def _out_of_range(doc: object, field: str = "") -> builtins.list[tuple[str, str]]:
    """(field, why) for each whole number in ``doc`` (a result as ``model_dump`` gives it)
    beyond ``COUNT_LIMIT`` (``BYTES_LIMIT`` for byte counts, fields named ``*_bytes``), and each
    number that is not finite; ``field`` is the dotted path to ``doc``."""
    if isinstance(doc, dict):
        return [
            problem
            for key, value in doc.items()
            for problem in _out_of_range(value, f"{field}.{key}" if field else str(key))
        ]
    if isinstance(doc, (builtins.list, tuple)):
        return [p for i, v in enumerate(doc) for p in _out_of_range(v, f"{field}.{i}")]
    if isinstance(doc, bool):
        return []
    if isinstance(doc, int):
        limit = BYTES_LIMIT if field.endswith("_bytes") else COUNT_LIMIT
        if abs(doc) > limit:
            return [(field, f"is {doc}, beyond the largest number a result may hold ({limit:,})")]
    if isinstance(doc, float) and not math.isfinite(doc):
        return [(field, f"is {doc}, not a finite number")]
    return []


@functools.lru_cache(maxsize=256)
def catalog_gpu(gpu: str) -> str | None:
    """The catalog id of the GPU a stored result names (its ``gpu``), or None when this
    whichgpu's catalog does not know it: a result written by a newer whichgpu may name a GPU
    added since. Only the shipped catalog is asked (user price files add no GPUs)."""
    from whichgpu.catalog import load_catalog
    from whichgpu.errors import GpuLookupError

    try:
        return load_catalog(()).resolve(gpu).id
    except GpuLookupError:
        return None


def write_results_file(path: Path, results: Sequence[BenchResult], fmt: ExportFormat) -> None:
    """Write ``results`` to an exported file (``read_results_file`` reads it back), through a
    temporary file renamed into place: the old file or the whole new one, never half written."""
    writer = _write_json if fmt == "json" else _write_csv
    _write_atomically(path, lambda out: writer(out, results))


def read_results_file(path: Path, fmt: ExportFormat) -> builtins.list[tuple[str, BenchResult]]:
    """Every result of an exported file, each with where it is (``results[3]``, ``line 5``).

    Raises ``ImportFileError`` listing the problems when the file cannot be read or any
    record is invalid.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")  # line ends kept as written
    except UnicodeDecodeError as exc:
        raise ImportFileError(path, [f"not UTF-8 text ({exc.reason})"]) from exc
    except OSError as exc:
        raise ImportFileError(
            path, [f"cannot be read ({exc.strerror or exc})"], "Check the file's name"
        ) from exc
    try:
        found = _read_json(path, text) if fmt == "json" else _read_csv(path, text)
    except NewerSchemaError as exc:
        raise ImportFileError(path, [exc.reason], _NEWER) from exc
    first: dict[str, tuple[str, BenchResult]] = {}
    clashes: builtins.list[str] = []
    for where, result in found:
        seen = first.setdefault(result.id, (where, result))
        if seen[1] != result:
            clashes.append(f"{where}: id {result.id} is also {seen[0]}'s, with other values")
    if clashes:
        raise ImportFileError(path, clashes)
    return found


def _read_json(path: Path, text: str) -> builtins.list[tuple[str, BenchResult]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFileError(
            path, [f"line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})"]
        ) from exc
    if isinstance(doc, dict) and "results" in doc:
        if "schema_version" in doc:
            try:
                _check_schema_version(doc["schema_version"], "the file")
            except NewerSchemaError:
                raise
            except StoreError as exc:
                raise ImportFileError(path, [str(exc)]) from exc
        records = doc["results"]
        if not isinstance(records, builtins.list):
            raise ImportFileError(path, ["'results' must be a list of results"])
        labels = [f"results[{i}]" for i in range(len(records))]
    elif isinstance(doc, builtins.list):
        records = doc
        labels = [f"record [{i}]" for i in range(len(records))]
    elif isinstance(doc, dict) and "id" in doc:
        records = [doc]
        labels = ["the result"]
    else:
        raise ImportFileError(
            path,
            [
                'not a whichgpu results file: expected {"schema_version": N, "results": [...]}, '
                "a list of results, or one result"
            ],
        )
    problems: builtins.list[str] = []
    found = [
        (label, _validate(rec, label, problems)) for label, rec in zip(labels, records, strict=True)
    ]
    if problems:
        raise ImportFileError(path, problems)
    return [(label, result) for label, result in found if result is not None]


def _csv_column(field: str) -> str:
    return f"{field}_json" if field in CSV_JSON_FIELDS else field


def _read_csv(path: Path, text: str) -> builtins.list[tuple[str, BenchResult]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    if not header:
        raise ImportFileError(
            path, ["the file is empty: a header line naming the columns is needed"]
        )
    unknown = [name for name in header if name not in CSV_COLUMNS]
    if unknown:
        raise ImportFileError(
            path,
            [
                f"line 1: unknown column(s) {', '.join(map(repr, unknown))}; the columns are "
                + ", ".join(CSV_COLUMNS)
            ],
        )
    problems: builtins.list[str] = []
    found: builtins.list[tuple[str, BenchResult]] = []
    for row in reader:
        where = f"line {reader.line_num}"
        if None in row:
            problems.append(f"{where}: more cells than the header has columns")
            continue
        record: dict[str, Any] = {}
        for column, cell in row.items():
            if cell is None:  # a short row: the missing cells are absent
                continue
            if column == "schema_version":
                record[column] = int(cell) if cell.strip().isdigit() else cell
            elif column.endswith("_json") and column[:-5] in CSV_JSON_FIELDS:
                if cell == "":
                    continue
                try:
                    record[column[:-5]] = json.loads(cell)
                except json.JSONDecodeError as exc:
                    problems.append(f"{where}, field '{column}': not valid JSON ({exc.msg})")
                    record = {}
                    break
            else:
                record[column] = None if cell == "" else cell
        else:
            result = _validate(record, where, problems, _csv_column)
            if result is not None:
                found.append((where, result))
    if problems:
        raise ImportFileError(path, problems)
    return found


# --- Lambda-style tables ----------------------------------------------------------------------


def device_label(result: BenchResult) -> str:
    """How tables name a result's device: its catalog id (else the name the device reports),
    prefixed ``Nx`` for a run on N devices."""
    base = result.gpu or result.device_name
    return f"{result.n_gpus}x {base}" if result.n_gpus > 1 else base


def _newest(results: Sequence[BenchResult]) -> BenchResult:
    return max(results, key=lambda r: (_utc_text(r.created_at), r.id))


def _pick_reference(reference: str, names: dict[str, set[str]], n_gpus: dict[str, int]) -> str:
    """The device column a user's reference names: exact (any of its names), else a part."""
    key = reference.strip().casefold()
    for matches in (
        [d for d, known in names.items() if key in known],
        [d for d, known in names.items() if any(key in name for name in known)],
    ):
        if len(matches) == 1:
            return matches[0]
        single = [d for d in matches if n_gpus[d] == 1]
        if len(single) == 1:
            return single[0]
        if matches:
            raise UsageError(
                f"The reference '{reference}' matches several measured devices: "
                f"{', '.join(sorted(matches))}. Name one of them."
            )
    listed = ", ".join(sorted(names)) or "none"
    raise UsageError(
        f"No measured device matches the reference '{reference}'. Devices with results: {listed}."
    )


_Setting = tuple[str, str, str, str, int, str, bool]
"""A pivot row's key: workload, mode, method, precision, sequence length (0: none), optimizer,
checkpointing."""


def pivot_results(results: Iterable[BenchResult], reference: str | None = None) -> ResultPivot:
    """Arrange results as Lambda's tables: per workload setting and device, the newest result's
    largest batch, throughput, and throughput relative to ``reference``.

    A row is a workload at one mode, method, precision, sequence length, optimizer and
    checkpointing setting; a column is a device (see ``device_label``). Where a workload was
    measured several times on a device, the newest result is used and the notes say so.
    ``reference`` is matched against the devices' labels, catalog ids and reported names
    (ignoring case; a unique part will do, and a single-GPU device wins over multi-GPU runs of
    it); without one, the device with the most measured throughputs is the reference (on a
    tie, the one with fewer devices, then by name). Raises
    ``UsageError`` when ``reference`` matches no device, or several.
    """
    groups: dict[_Setting, dict[str, builtins.list[BenchResult]]]
    groups = defaultdict(lambda: defaultdict(builtins.list))
    names: dict[str, set[str]] = defaultdict(set)
    n_gpus: dict[str, int] = {}
    bases: dict[str, str] = {}
    for r in results:
        label = device_label(r)
        run = r.run
        setting = (
            r.workload,
            run.mode,
            run.method,
            r.precision,
            r.seq_len or 0,
            run.optimizer,
            run.checkpointing,
        )
        groups[setting][label].append(r)
        names[label] |= {label.casefold(), r.device_name.casefold()}
        if r.gpu:
            names[label].add(r.gpu.casefold())
        n_gpus[label] = r.n_gpus
        bases[label] = r.gpu or r.device_name
    newest = {key: {d: _newest(rs) for d, rs in cells.items()} for key, cells in groups.items()}

    chosen = reference is not None
    if reference is not None:
        ref: str | None = _pick_reference(reference, names, n_gpus)
    else:
        measured: dict[str, int] = defaultdict(int)
        for cells in newest.values():
            for d, r in cells.items():
                if r.throughput:
                    measured[d] += 1
        ref = min(measured, key=lambda d: (-measured[d], n_gpus[d], d)) if measured else None

    rows: builtins.list[PivotRow] = []
    repeated: builtins.list[str] = []
    missing_ref = 0
    for key in sorted(newest):
        workload, mode, method, precision, seq_len, optimizer, checkpointing = key
        cells = newest[key]
        ref_result = cells.get(ref) if ref is not None else None
        base = ref_result.throughput if ref_result is not None else None
        if ref is not None and not base:
            missing_ref += 1
        row_cells: dict[str, PivotCell] = {}
        for d in sorted(cells):
            r = cells[d]
            count = len(groups[key][d])
            if count > 1:
                repeated.append(f"{workload} {precision} on {d} ({count} results)")
            row_cells[d] = PivotCell(
                result_id=r.id,
                batch_size=r.batch_size,
                max_batch_size=r.max_batch_size,
                throughput=r.throughput,
                relative_throughput=(
                    r.throughput / base if r.throughput is not None and base else None
                ),
                results=count,
            )
        first = next(iter(cells.values()))
        rows.append(
            PivotRow(
                workload=workload,
                mode=mode,
                method=method,
                precision=precision,
                seq_len=seq_len or None,
                optimizer=optimizer,
                checkpointing=checkpointing,
                throughput_unit=first.throughput_unit,
                cells=row_cells,
            )
        )

    notes: builtins.list[str] = []
    if repeated:
        notes.append("Measured more than once, the newest result used: " + "; ".join(repeated[:8]))
        if len(repeated) > 8:
            notes[-1] += f"; and {len(repeated) - 8} more"
    if ref is not None and missing_ref:
        notes.append(
            f"{missing_ref} of {len(rows)} rows have no throughput on {ref}, so no relative "
            "throughput"
        )
    devices = sorted(names, key=lambda d: (d != ref, bases[d], n_gpus[d]))
    return ResultPivot(
        devices=tuple(devices),
        rows=tuple(rows),
        reference=ref,
        reference_chosen=chosen,
        notes=tuple(notes),
    )


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
