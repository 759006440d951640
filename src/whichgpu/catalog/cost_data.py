"""Cost data: electricity and carbon by region, build classes, rules of thumb, used prices.

Read from ``data/v1/cost/*.yaml`` (documented in ``data/README.md``, "Cost data"). Every value
is a scalar or ``{value, source, confidence, method, note}`` like the GPU records, and cites the
same source table. A malformed file raises ``CatalogError`` naming the file, the record and the
field. The cost package (``whichgpu.cost``) computes with these; this module only reads them.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from whichgpu.catalog.loader import DATA_DIR, _first_error, _read_yaml, _split_value, read_sources
from whichgpu.errors import CatalogError, UsageError
from whichgpu.schema import (
    BuildClass,
    CostRules,
    GridRegion,
    Provenance,
    Source,
    UtilizationProfile,
)

COST_FOLDER = "cost"
"""Sub-folder of a data folder that holds the cost files."""

_Model = TypeVar("_Model", bound=BaseModel)

_REGION_VALUES = ("electricity_usd_per_kwh", "grid_gco2_per_kwh")
_CLASS_VALUES = (
    "base_system_usd",
    "cpu_w",
    "psu_w",
    "gpu_lanes",
    "gpu_slot_positions",
    "expansion_slots",
    "server_airflow",
)
_CLASS_REQUIRED = ("cpu_w", "gpu_lanes", "gpu_slot_positions", "expansion_slots")
_RULE_VALUES = tuple(name for name in CostRules.model_fields if name != "provenance")


@dataclass(frozen=True)
class ResaleObservation:
    """One published used price of a GPU at a date, against its price new (``cost/resale.yaml``).

    The resale curves are fitted to these (``whichgpu.cost.pricing.resale_curve``); the GPU's
    launch date and segment come from its catalog record.
    """

    gpu_id: str
    """Catalog id of the GPU."""
    as_of: dt.date
    """The month (or day) the used price describes."""
    used_usd: float
    """The used price reported, USD."""
    new_usd: float
    """The price new it is compared with (launch MSRP, or the source's reference), USD."""
    provenance: Mapping[str, Provenance]
    """Where ``used_usd`` and ``new_usd`` come from."""


@dataclass(frozen=True)
class CostData:
    """Everything read from the cost files of one data folder, validated."""

    regions: tuple[GridRegion, ...]
    """Electricity price and carbon intensity by region."""
    build_classes: tuple[BuildClass, ...]
    """Machine classes, fewest GPUs first."""
    utilization_profiles: tuple[UtilizationProfile, ...]
    """Named utilisations."""
    rules: CostRules
    """Rules of thumb."""
    resale_observations: tuple[ResaleObservation, ...] = ()
    """Dated used prices against prices new, oldest first."""

    @property
    def provenance(self) -> tuple[Provenance, ...]:
        """Every value's provenance (the audit checks that every cost source is used)."""
        records: list[Mapping[str, Provenance]] = [r.provenance for r in self.regions]
        records += [c.provenance for c in self.build_classes]
        records += [p.provenance for p in self.utilization_profiles]
        records.append(self.rules.provenance)
        records += [o.provenance for o in self.resale_observations]
        return tuple(prov for record in records for prov in record.values())


def _parse(
    model: type[_Model],
    record: Any,
    *,
    identity: tuple[str, ...],
    values: tuple[str, ...],
    required: tuple[str, ...],
    sources: Mapping[str, Source],
    where: str,
) -> _Model:
    """Validate one record: plain identity fields, sourced value fields, into ``model``."""
    if not isinstance(record, Mapping):
        raise CatalogError(f"{where}: expected a mapping of fields.")
    unknown = set(record) - set(identity) - set(values)
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}.")
    fields: dict[str, Any] = {k: record[k] for k in identity if k in record}
    provenance: dict[str, Provenance] = {}
    for name in values:
        if name not in record or record[name] is None:
            if name in required:
                raise CatalogError(f"{where}, field '{name}': missing.")
            continue
        value, prov = _split_value(record[name], None, sources, f"{where}, field '{name}'")
        fields[name] = tuple(value) if isinstance(value, list) else value
        provenance[name] = prov
    try:
        return model(**fields, provenance=provenance)
    except ValidationError as exc:
        raise CatalogError(f"{where}: {_first_error(exc)}") from exc


def _records(doc: Mapping[str, Any], key: str, path: Path) -> list[Any]:
    records = doc.get(key) or []
    if not isinstance(records, list):
        raise CatalogError(f"{path}: '{key}:' must be a list.")
    return records


def _check_build_class(build: BuildClass, where: str) -> None:
    positions = build.gpu_slot_positions
    if not positions or list(positions) != sorted(set(positions)) or positions[0] < 0:
        raise CatalogError(
            f"{where}, field 'gpu_slot_positions': give increasing, non-negative positions."
        )
    if positions[-1] >= build.expansion_slots:
        raise CatalogError(
            f"{where}, field 'expansion_slots': {build.expansion_slots} does not reach the last "
            f"slot position {positions[-1]}."
        )
    if len(positions) < build.gpus:
        raise CatalogError(
            f"{where}, field 'gpu_slot_positions': {len(positions)} positions for a class of "
            f"{build.gpus} GPUs."
        )


def _resale_observation(
    record: Any, sources: Mapping[str, Source], where: str
) -> ResaleObservation:
    """One record of ``resale_observations``: ``gpu``, ``as_of``, sourced ``used_usd`` and
    ``new_usd`` (positive amounts)."""
    if not isinstance(record, Mapping):
        raise CatalogError(f"{where}: expected a mapping of fields.")
    fields = ("gpu", "as_of", "used_usd", "new_usd")
    unknown = set(record) - set(fields)
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}.")
    missing = [f for f in fields if record.get(f) is None]
    if missing:
        raise CatalogError(f"{where}: missing {missing}.")
    if not isinstance(record["gpu"], str):
        raise CatalogError(f"{where}, field 'gpu': give a catalog id.")
    as_of = record["as_of"]
    if not isinstance(as_of, dt.date):
        raise CatalogError(f"{where}, field 'as_of': '{as_of}' is not a date like 2022-06-01.")
    amounts: dict[str, float] = {}
    provenance: dict[str, Provenance] = {}
    for name in ("used_usd", "new_usd"):
        value, prov = _split_value(record[name], None, sources, f"{where}, field '{name}'")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CatalogError(f"{where}, field '{name}': '{value}' is not an amount in USD.")
        if not (math.isfinite(value) and value > 0):
            raise CatalogError(f"{where}, field '{name}': must be a positive amount in USD.")
        amounts[name] = float(value)
        provenance[name] = prov
    return ResaleObservation(
        gpu_id=record["gpu"],
        as_of=as_of,
        used_usd=amounts["used_usd"],
        new_usd=amounts["new_usd"],
        provenance=provenance,
    )


def read_cost_data(data_dir: Path = DATA_DIR) -> CostData:
    """Read and validate the cost files of a data folder."""
    sources = read_sources(sorted((data_dir / "sources").glob("*.yaml")))
    regions: list[GridRegion] = []
    classes: list[BuildClass] = []
    profiles: list[UtilizationProfile] = []
    rules: CostRules | None = None
    observations: list[ResaleObservation] = []
    for path in sorted((data_dir / COST_FOLDER).glob("*.yaml")):
        doc = _read_yaml(path) or {}
        if not isinstance(doc, Mapping):
            raise CatalogError(f"{path}: expected a mapping at the top level.")
        unknown = set(doc) - {
            "regions",
            "build_classes",
            "utilization_profiles",
            "rules",
            "resale_observations",
        }
        if unknown:
            raise CatalogError(f"{path}: unknown sections {sorted(unknown)}.")
        for record in _records(doc, "regions", path):
            where = f"{path}: region '{_id(record)}'"
            regions.append(
                _parse(
                    GridRegion,
                    record,
                    identity=("id", "label", "default"),
                    values=_REGION_VALUES,
                    required=(),
                    sources=sources,
                    where=where,
                )
            )
        for record in _records(doc, "build_classes", path):
            where = f"{path}: build class '{_id(record)}'"
            build = _parse(
                BuildClass,
                record,
                identity=("id", "label", "gpus"),
                values=_CLASS_VALUES,
                required=_CLASS_REQUIRED,
                sources=sources,
                where=where,
            )
            _check_build_class(build, where)
            classes.append(build)
        for record in _records(doc, "utilization_profiles", path):
            where = f"{path}: utilization profile '{_id(record)}'"
            profiles.append(
                _parse(
                    UtilizationProfile,
                    record,
                    identity=("id", "label"),
                    values=("utilization",),
                    required=("utilization",),
                    sources=sources,
                    where=where,
                )
            )
        for index, record in enumerate(_records(doc, "resale_observations", path)):
            gpu = record.get("gpu", "?") if isinstance(record, Mapping) else "?"
            where = f"{path}: resale observation {index + 1} ('{gpu}')"
            observations.append(_resale_observation(record, sources, where))
        if "rules" in doc:
            if rules is not None:
                raise CatalogError(f"{path}: 'rules:' is also given in another cost file.")
            rules = _parse(
                CostRules,
                doc["rules"],
                identity=(),
                values=_RULE_VALUES,
                required=_RULE_VALUES,
                sources=sources,
                where=f"{path}: rules",
            )
    folder = data_dir / COST_FOLDER
    if rules is None:
        raise CatalogError(f"{folder}: no cost file has a 'rules:' section.")
    for kind, ids in (
        ("region", [r.id for r in regions]),
        ("build class", [c.id for c in classes]),
        ("utilization profile", [p.id for p in profiles]),
    ):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise CatalogError(f"{folder}: {kind} id(s) {twice} defined twice.")
    if sum(r.default for r in regions) != 1:
        raise CatalogError(f"{folder}: exactly one region must be the default.")
    if not classes:
        raise CatalogError(f"{folder}: no build classes.")
    sizes = [c.gpus for c in sorted(classes, key=lambda c: c.gpus)]
    if len(set(sizes)) != len(sizes):
        raise CatalogError(f"{folder}: two build classes hold the same number of GPUs.")
    return CostData(
        regions=tuple(regions),
        build_classes=tuple(sorted(classes, key=lambda c: c.gpus)),
        utilization_profiles=tuple(profiles),
        rules=rules,
        resale_observations=tuple(sorted(observations, key=lambda o: (o.as_of, o.gpu_id))),
    )


def _id(record: Any) -> str:
    return str(record.get("id", "?")) if isinstance(record, Mapping) else "?"


@functools.cache
def shipped_cost_data() -> CostData:
    """The cost data shipped with whichgpu (read once per process)."""
    return read_cost_data()


def get_region(region_id: str | None = None, data: CostData | None = None) -> GridRegion:
    """The region ``region_id``, or the default; an unknown id lists the known ones."""
    data = data or shipped_cost_data()
    if region_id is None:
        return next(r for r in data.regions if r.default)
    key = region_id.strip().lower()
    for region in data.regions:
        if region.id == key:
            return region
    known = ", ".join(r.id for r in data.regions)
    raise UsageError(f"--region: unknown region '{region_id}'. Known regions: {known}.")


def build_class_for(
    count: int,
    class_id: str | None = None,
    data: CostData | None = None,
    *,
    module: bool = False,
) -> BuildClass:
    """The build class named ``class_id``, else the smallest that holds ``count`` GPUs.

    ``module``: the GPUs are modules (SXM, OAM) on a vendor's baseboard, which only a server
    takes: the smallest class with a server's airflow that holds them.
    """
    data = data or shipped_cost_data()
    if count < 1:
        raise UsageError(f"--count: a build needs at least one GPU, not {count}.")
    if class_id is not None:
        for build in data.build_classes:
            if build.id == class_id:
                if count > build.gpus:
                    raise UsageError(
                        f"--build-class: a {build.id} holds at most {build.gpus} GPUs, not {count}."
                    )
                return build
        known = ", ".join(c.id for c in data.build_classes)
        raise UsageError(f"--build-class: unknown class '{class_id}'. Known: {known}.")
    for build in data.build_classes:
        if build.gpus >= count and (build.server_airflow or not module):
            return build
    largest = data.build_classes[-1]
    raise UsageError(
        f"{count} GPUs is more than one machine of the cost data holds (at most "
        f"{largest.gpus}, a {largest.id}); price one machine and plan several."
    )


FULL_WIDTH_LANES = 16
"""The widest PCIe slot (x16)."""


def pcie_lanes_per_gpu(build: BuildClass, count: int, card_lanes: int | None) -> int:
    """The PCIe lanes each of ``count`` cards gets in a machine of class ``build``: the
    platform's GPU lanes shared out, at most a full x16 slot, rounded down to a width a link
    trains at (x16, x8, x4 …), and no more than the card has (``card_lanes``; None: x16)."""
    lanes = min(FULL_WIDTH_LANES, build.gpu_lanes // count)
    lanes = 1 << (lanes.bit_length() - 1) if lanes > 0 else 0
    return min(lanes, card_lanes or FULL_WIDTH_LANES)


def utilization_value(text: str, data: CostData | None = None) -> tuple[float, str]:
    """A utilisation from a number (0-1, or a percentage with ``%``) or a profile id.

    Returns the fraction and where it came from.
    """
    data = data or shipped_cost_data()
    raw = text.strip()
    for profile in data.utilization_profiles:
        if raw.lower() == profile.id:
            return profile.utilization, f"profile {profile.id}: {profile.label}"
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        known = ", ".join(p.id for p in data.utilization_profiles)
        raise UsageError(
            f"--utilization: '{text}' is neither a fraction (0.15), a percentage (15%) nor a "
            f"profile ({known})."
        ) from None
    return value, "given"
