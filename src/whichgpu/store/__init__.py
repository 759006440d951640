"""The results store: every ``BenchResult`` measured here or imported, kept in one SQLite file.

``results`` holds ``ResultStore`` (and ``catalog_gpu``), ``layout`` its SQLite tables and their
versioned upgrade steps, ``records`` the checks of a valid, plausible result that the store and
import share, ``files`` the JSON and CSV export and import formats, and ``tables``
``pivot_results`` (Lambda-style tables); every public name is importable from here. What the
store promises, and the file formats, are in ``docs/bench.md`` ("Results store").
"""

from __future__ import annotations

from whichgpu.store.files import (
    CSV_COLUMNS,
    CSV_JSON_FIELDS,
    ExportFormat,
    ExportSummary,
    ImportFileError,
    ImportSummary,
    format_of,
    read_results_file,
    write_results_file,
)
from whichgpu.store.layout import BUSY_TIMEOUT_S, STORE_FORMAT, STORE_VERSION, WAL_RETRY_S
from whichgpu.store.records import BYTES_LIMIT, CLOCK_SKEW, COUNT_LIMIT, NewerSchemaError
from whichgpu.store.results import ResultLookupError, ResultStore, catalog_gpu
from whichgpu.store.tables import PivotCell, PivotRow, ResultPivot, device_label, pivot_results

__all__ = [
    "BUSY_TIMEOUT_S",
    "BYTES_LIMIT",
    "CLOCK_SKEW",
    "COUNT_LIMIT",
    "CSV_COLUMNS",
    "CSV_JSON_FIELDS",
    "STORE_FORMAT",
    "STORE_VERSION",
    "WAL_RETRY_S",
    "ExportFormat",
    "ExportSummary",
    "ImportFileError",
    "ImportSummary",
    "NewerSchemaError",
    "PivotCell",
    "PivotRow",
    "ResultLookupError",
    "ResultPivot",
    "ResultStore",
    "catalog_gpu",
    "device_label",
    "format_of",
    "pivot_results",
    "read_results_file",
    "write_results_file",
]
