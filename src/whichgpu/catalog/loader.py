"""Read and validate the catalog's data files: sources, GPU records and prices.

The data lives in ``data/v<N>/`` next to this module (documented column by column in
``data/README.md``). This module turns those files into validated ``Source``, ``GpuSpec`` and
``Price`` objects and rejects anything malformed with a ``CatalogError`` that names the file,
the record and the field. It holds no hardware numbers and does no querying.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import ValidationError

from whichgpu.catalog.names import NameIndex
from whichgpu.errors import CatalogError, GpuLookupError, PriceFileError
from whichgpu.schema import (
    SPEC_FIELDS,
    Confidence,
    GpuSpec,
    Price,
    PriceKind,
    Provenance,
    Source,
)
from whichgpu.units import LARGEST_NUMBER

DATA_VERSION = "v1"
"""The data folder this version of the code reads."""

DATA_DIR = Path(__file__).parent / "data" / DATA_VERSION

_IDENTITY_FIELDS = (
    "id",
    "name",
    "vendor",
    "segment",
    "aliases",
    "default_variant",
    "source",
    "notes",
)
_VALUE_KEYS = {"value", "source", "confidence", "method", "note"}
_STR_FIELDS = {"compute_capability", "gfx_target", "interconnect_gen", "chip", "architecture"}
PRICE_COLUMNS = ("gpu_id", "kind", "usd", "per", "provider", "region", "as_of", "source", "note")
OPTIONAL_PRICE_COLUMNS = ("instance_gpus",)
"""Columns a price file may add: ``instance_gpus``, the GPU counts of the machines a cloud rate
is offered in (``8``; ``1 2 4 8``), empty where not known."""
_KIND_PER = {"launch": "unit", "new": "unit", "used": "unit"}


@dataclass(frozen=True)
class CatalogData:
    """Everything read from one data folder, validated, before any user override."""

    sources: dict[str, Source]
    gpus: tuple[GpuSpec, ...]
    prices: tuple[Price, ...]


def _yaml_safe_loader() -> type[yaml.SafeLoader]:
    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return loader


def _read_yaml(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_yaml_safe_loader())
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from exc


def read_sources(paths: Iterable[Path]) -> dict[str, Source]:
    """Read source tables (``key: {title, url, publisher, kind, …}``) from YAML files."""
    sources: dict[str, Source] = {}
    for path in paths:
        doc = _read_yaml(path) or {}
        if not isinstance(doc, Mapping):
            raise CatalogError(f"{path}: expected a mapping of source keys to sources.")
        for key, body in doc.items():
            if key in sources:
                raise CatalogError(f"{path}: source key '{key}' is defined twice.")
            if not isinstance(body, Mapping):
                raise CatalogError(f"{path}: source '{key}' must be a mapping.")
            try:
                sources[str(key)] = Source(key=str(key), **body)
            except ValidationError as exc:
                raise CatalogError(f"{path}: source '{key}': {_first_error(exc)}") from exc
    return sources


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"field '{loc}': {err['msg']}" if loc else err["msg"]


def _split_value(
    raw: Any, default_source: str | None, sources: Mapping[str, Source], where: str
) -> tuple[Any, Provenance]:
    """Split a field's raw YAML into (value, provenance); ``raw`` is a scalar or a mapping."""
    if isinstance(raw, Mapping):
        unknown = set(raw) - _VALUE_KEYS
        if unknown:
            raise CatalogError(f"{where}: unknown keys {sorted(unknown)} in a sourced value.")
        if "value" not in raw:
            raise CatalogError(f"{where}: a sourced value needs a 'value' key.")
        value = raw["value"]
        source_key = raw.get("source", default_source)
        confidence_raw = raw.get("confidence")
        method = raw.get("method")
        note = raw.get("note")
    else:
        value, source_key, confidence_raw, method, note = raw, default_source, None, None, None
    if source_key is None:
        raise CatalogError(f"{where}: no source (give the record a 'source' or the value one).")
    if source_key not in sources:
        raise CatalogError(f"{where}: source '{source_key}' is not in the source table.")
    try:
        confidence = (
            Confidence(confidence_raw)
            if confidence_raw is not None
            else sources[source_key].kind.default_confidence()
        )
    except ValueError as exc:
        allowed = ", ".join(c.value for c in Confidence)
        raise CatalogError(f"{where}: confidence must be one of {allowed}.") from exc
    if confidence is Confidence.DERIVED and not method:
        raise CatalogError(f"{where}: a derived value must say how ('method').")
    return value, Provenance(source=source_key, confidence=confidence, method=method, note=note)


def parse_gpu_record(
    record: Mapping[str, Any], sources: Mapping[str, Source], path: Path
) -> GpuSpec:
    """Validate one GPU record from a data file into a ``GpuSpec``."""
    gpu_id = record.get("id", "?")
    where = f"{path}: gpu '{gpu_id}'"
    unknown = set(record) - set(_IDENTITY_FIELDS) - set(SPEC_FIELDS)
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}.")
    default_source = record.get("source")
    fields: dict[str, Any] = {
        k: record[k]
        for k in ("id", "name", "vendor", "segment", "notes", "default_variant")
        if k in record
    }
    fields["aliases"] = tuple(str(a) for a in record.get("aliases") or ())
    provenance: dict[str, Provenance] = {}
    for name in SPEC_FIELDS:
        if name not in record or record[name] is None:
            continue
        value, prov = _split_value(
            record[name], default_source, sources, f"{where}, field '{name}'"
        )
        if value is None:
            continue
        if name in _STR_FIELDS and isinstance(value, int | float):
            value = str(value)
        fields[name] = value
        provenance[name] = prov
    fields["provenance"] = provenance
    try:
        return GpuSpec(**fields)
    except ValidationError as exc:
        raise CatalogError(f"{where}: {_first_error(exc)}") from exc


def read_gpus(paths: Iterable[Path], sources: Mapping[str, Source]) -> tuple[GpuSpec, ...]:
    """Read GPU records (a YAML list under ``gpus:``) from each file."""
    specs: list[GpuSpec] = []
    seen: dict[str, Path] = {}
    for path in paths:
        doc = _read_yaml(path) or {}
        records = doc.get("gpus") if isinstance(doc, Mapping) else None
        if not isinstance(records, list):
            raise CatalogError(f"{path}: expected a top-level 'gpus:' list.")
        for record in records:
            if not isinstance(record, Mapping):
                raise CatalogError(f"{path}: every entry under 'gpus:' must be a mapping.")
            spec = parse_gpu_record(record, sources, path)
            if spec.id in seen:
                raise CatalogError(
                    f"{path}: gpu id '{spec.id}' is also defined in {seen[spec.id]}."
                )
            seen[spec.id] = path
            specs.append(spec)
    return tuple(specs)


def read_price_csv(
    path: Path,
    gpu_ids: Iterable[str],
    sources: Mapping[str, Source],
    *,
    user: bool,
    names: NameIndex | None = None,
) -> tuple[Price, ...]:
    """Read one price CSV (columns ``PRICE_COLUMNS``, optionally ``OPTIONAL_PRICE_COLUMNS``).

    Shipped files must cite a key of the source table and name GPUs by catalog id; user files
    may cite anything (a URL, a quote number), and with ``names`` a ``gpu_id`` may be any name
    the commands accept (``4090``), read as its catalog id (the row's note says so). Errors name
    the file, line and field.
    """
    known_ids = set(gpu_ids)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's UTF-8 starts with a BOM
    except OSError as exc:
        raise PriceFileError(str(path), None, None, f"cannot be read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise PriceFileError(
            str(path), None, None, "is not UTF-8 text (save it as CSV UTF-8)"
        ) from exc
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    header = tuple(rows.fieldnames or ())
    missing = [c for c in PRICE_COLUMNS if c not in header]
    if missing:
        raise PriceFileError(
            str(path), 1, None, f"missing columns {missing}; expected {list(PRICE_COLUMNS)}"
        )
    extra = [c for c in header if c not in PRICE_COLUMNS + OPTIONAL_PRICE_COLUMNS]
    if extra:
        raise PriceFileError(str(path), 1, None, f"unknown columns {extra}")
    line_numbers = [i + 1 for i, line in enumerate(text.splitlines()) if not line.startswith("#")]
    prices: list[Price] = []
    for index, row in enumerate(rows):
        line = line_numbers[index + 1] if index + 1 < len(line_numbers) else None
        prices.append(_parse_price_row(row, path, line, known_ids, sources, user=user, names=names))
    return tuple(prices)


def _parse_price_row(
    row: Mapping[str, str | None],
    path: Path,
    line: int | None,
    known_ids: set[str],
    sources: Mapping[str, Source],
    *,
    user: bool,
    names: NameIndex | None = None,
) -> Price:
    def fail(field: str, problem: str) -> PriceFileError:
        return PriceFileError(str(path), line, field, problem)

    cell = {k: (v or "").strip() for k, v in row.items() if k is not None}
    read_as = None
    if cell["gpu_id"] not in known_ids:
        if names is None:
            raise fail("gpu_id", f"'{cell['gpu_id']}' is not a catalog id (see `whichgpu gpus`)")
        try:
            spec, variant = names.resolve_noted(cell["gpu_id"])
        except GpuLookupError as exc:
            raise fail("gpu_id", str(exc).rstrip(".")) from None
        read_as = f"gpu_id '{cell['gpu_id']}' read as {spec.id}" + (
            f" ({variant.rstrip('.')})" if variant else ""
        )
        cell["gpu_id"] = spec.id
    kinds = get_args(PriceKind)
    if cell["kind"] not in kinds:
        raise fail("kind", f"'{cell['kind']}' is not one of {', '.join(kinds)}")
    try:
        usd = float(cell["usd"])
    except ValueError:
        raise fail("usd", f"'{cell['usd']}' is not a number") from None
    if not 0 < usd <= LARGEST_NUMBER:
        raise fail(
            "usd",
            f"'{cell['usd']}' is not a positive amount in US dollars of a realistic size (at "
            f"most {LARGEST_NUMBER:.0e})",
        )
    expected_per = _KIND_PER.get(cell["kind"], "hour")
    if cell["per"] != expected_per:
        raise fail("per", f"a '{cell['kind']}' price is per '{expected_per}', not '{cell['per']}'")
    try:
        as_of = dt.date.fromisoformat(cell["as_of"])
    except ValueError:
        raise fail("as_of", f"'{cell['as_of']}' is not a date like 2026-11-21") from None
    if as_of > dt.date.today():
        raise fail("as_of", f"{as_of} is in the future")
    if not cell["source"]:
        raise fail("source", "every price needs a source")
    if not user and cell["source"] not in sources:
        raise fail("source", f"'{cell['source']}' is not in the source table")
    if cell["kind"].startswith("cloud") and not cell["provider"]:
        raise fail("provider", "a cloud price needs its provider")
    instance_gpus = None
    if cell.get("instance_gpus"):
        if not cell["kind"].startswith("cloud"):
            raise fail("instance_gpus", "only a cloud rate comes in machines of some GPU count")
        counts = re.split(r"[\s/;,]+", cell["instance_gpus"])
        if not all(c.isdigit() and int(c) > 0 for c in counts):
            raise fail(
                "instance_gpus",
                f"'{cell['instance_gpus']}' is not a list of GPU counts like '8' or '1 2 4 8'",
            )
        instance_gpus = tuple(sorted({int(c) for c in counts}))
    return Price(
        gpu_id=cell["gpu_id"],
        kind=cell["kind"],
        usd=usd,
        per=cell["per"],
        provider=cell["provider"] or None,
        region=cell["region"] or None,
        as_of=as_of,
        source=cell["source"],
        note="; ".join(n for n in (cell["note"], read_as) if n) or None,
        instance_gpus=instance_gpus,
        user=user,
    )


def launch_prices(gpus: Iterable[GpuSpec]) -> tuple[Price, ...]:
    """The launch MSRP of each GPU record, as a ``Price`` dated at its launch."""
    prices: list[Price] = []
    for spec in gpus:
        if spec.launch_price_usd is None or spec.launch_date is None:
            continue
        prov = spec.provenance["launch_price_usd"]
        prices.append(
            Price(
                gpu_id=spec.id,
                kind="launch",
                usd=spec.launch_price_usd,
                per="unit",
                as_of=spec.launch_date,
                source=prov.source,
                note=prov.note,
            )
        )
    return tuple(prices)


def read_data_dir(data_dir: Path = DATA_DIR) -> CatalogData:
    """Read and validate one whole data folder (sources, GPUs, shipped prices)."""
    if not data_dir.is_dir():
        raise CatalogError(f"{data_dir}: catalog data folder not found; reinstall whichgpu.")
    sources = read_sources(sorted((data_dir / "sources").glob("*.yaml")))
    gpus = read_gpus(sorted((data_dir / "gpus").glob("*.yaml")), sources)
    ids = [g.id for g in gpus]
    prices = list(launch_prices(gpus))
    for path in sorted((data_dir / "prices").glob("*.csv")):
        prices.extend(read_price_csv(path, ids, sources, user=False))
    return CatalogData(sources=sources, gpus=gpus, prices=tuple(prices))
