"""``ResultStore``: ``BenchResult``s kept in one SQLite file (``settings.store_path()``), added,
looked up by id or id prefix, listed, deleted, exported and imported, each operation one
transaction on a checked, up-to-date store; and ``catalog_gpu``, whether this whichgpu's
catalog knows a stored result's GPU.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pydantic import ValidationError

from whichgpu import settings
from whichgpu.errors import StoreError, UsageError
from whichgpu.files import check_output_file, path_problem
from whichgpu.schema import BenchResult
from whichgpu.store.files import (
    ExportSummary,
    ImportFileError,
    ImportSummary,
    format_of,
    read_results_file,
    write_results_file,
)
from whichgpu.store.layout import (
    _INSERT,
    _ORDER,
    _STEPS,
    BUSY_TIMEOUT_S,
    STORE_FORMAT,
    STORE_VERSION,
    _ensure_wal,
    _row,
    _transaction,
)
from whichgpu.store.records import _NEWER, _check_schema_version, _first_problem, _out_of_range

_ELSEWHERE = f"Point --store (or ${settings.ENV_STORE}) at another file, or move this one away"


class ResultLookupError(StoreError, UsageError):
    """An id (or id prefix) names no stored result, or several.

    A ``StoreError`` (it concerns the store) and a ``UsageError`` (bad input: the CLI exits with
    code 2, as for an unknown GPU).
    """

    def __init__(self, message: str, query: str, candidates: Sequence[str] = ()) -> None:
        self.query = query
        self.candidates = tuple(candidates)
        super().__init__(message)


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
