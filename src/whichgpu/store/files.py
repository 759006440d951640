"""The files results travel in: JSON and CSV exports (``write_results_file``) and their import
(``read_results_file``), which checks every record before anything is stored and reports each
problem by file, record or line, and field (``ImportFileError``); with the summaries of an
export and an import.
"""

from __future__ import annotations

import builtins
import csv
import datetime as dt
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

from pydantic import ValidationError

from whichgpu.errors import StoreError, UsageError
from whichgpu.files import write_atomically
from whichgpu.schema import SCHEMA_VERSION, BenchResult
from whichgpu.store.records import (
    _NEWER,
    NewerSchemaError,
    _check_schema_version,
    _first_problem,
    _implausible,
    _Record,
)

ExportFormat = Literal["json", "csv"]
"""File formats of ``ResultStore.export`` and ``ResultStore.import_file``."""


CSV_JSON_FIELDS = ("run", "per_rank", "notes", "environment")
"""``BenchResult`` fields that CSV holds as JSON text, in a column named ``<field>_json``."""

_CSV_FLAT = tuple(name for name in BenchResult.model_fields if name not in CSV_JSON_FIELDS)

CSV_COLUMNS = (*_CSV_FLAT, *(f"{name}_json" for name in CSV_JSON_FIELDS), "schema_version")
"""Header of an exported CSV file: one column per flat field, then the JSON columns."""


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
