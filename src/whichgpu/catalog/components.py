"""Component prices of the base system: a build class's parts for a GPU count, power supplies.

Read from ``data/v1/components/parts.yaml`` with its own source table
(``data/v1/components/sources.yaml``; documented in ``data/README.md``, "Component prices").
Every price is a sourced value (``value``, ``source``, ``confidence``, ``method``, ``note``) with
the date the source gives for it. ``whichgpu.cost.base_system`` prices a machine with these.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whichgpu.catalog.loader import DATA_DIR, _read_yaml, _split_value, read_sources
from whichgpu.errors import CatalogError
from whichgpu.schema import Provenance, Source

COMPONENTS_FOLDER = "components"
"""Sub-folder of a data folder that holds the component prices."""


@dataclass(frozen=True)
class PricedPart:
    """One component at a dated, sourced price."""

    part: str
    """What it is (``cpu``, ``motherboard``, ``memory``, ``storage``, ``case``, ``psu``)."""
    label: str
    """The component in words."""
    usd: float
    """Its price, USD."""
    as_of: dt.date
    """The date the source gives for the price."""
    provenance: Provenance
    """Where the price comes from."""


@dataclass(frozen=True)
class Platform:
    """A build class's machine for an exact number of GPUs, without its power supply."""

    build_class: str
    """The build class (``desktop``)."""
    gpus: int
    """The GPU count it is for."""
    label: str
    """The machine in words."""
    parts: tuple[PricedPart, ...]
    """Its parts, power supply excluded."""

    @property
    def usd(self) -> float:
        """The parts' total, USD."""
        return sum(p.usd for p in self.parts)


@dataclass(frozen=True)
class PowerSupply:
    """A power supply of a rated wattage at a dated, sourced price."""

    watts: float
    """Rated output, W."""
    price: PricedPart
    """Its price."""


@dataclass(frozen=True)
class ComponentPrices:
    """Everything read from the component files of one data folder, validated."""

    platforms: tuple[Platform, ...]
    """Machines by build class and GPU count."""
    power_supplies: tuple[PowerSupply, ...]
    """Power supplies, smallest first."""
    sources: Mapping[str, Source]
    """The source table of the prices."""

    def platform(self, build_class: str, gpus: int) -> Platform | None:
        """The platform of ``build_class`` for ``gpus`` GPUs, if priced by parts."""
        return next(
            (p for p in self.platforms if p.build_class == build_class and p.gpus == gpus), None
        )

    def power_supply(self, needed_w: float) -> PowerSupply | None:
        """The smallest power supply rated at ``needed_w`` or more (None: none is)."""
        return next((s for s in self.power_supplies if s.watts >= needed_w), None)


def _part(
    record: Any, sources: Mapping[str, Source], where: str, part: str | None = None
) -> PricedPart:
    if not isinstance(record, Mapping):
        raise CatalogError(f"{where}: expected a mapping of fields.")
    allowed = {"label", "as_of", "usd"} | ({"part"} if part is None else {"watts"})
    unknown = set(record) - allowed
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}.")
    name = part or record.get("part")
    if not isinstance(name, str) or not isinstance(record.get("label"), str):
        raise CatalogError(f"{where}: give 'part' and 'label'.")
    as_of = record.get("as_of")
    if not isinstance(as_of, dt.date):
        raise CatalogError(f"{where}, field 'as_of': '{as_of}' is not a date like 2026-01-01.")
    if "usd" not in record:
        raise CatalogError(f"{where}, field 'usd': missing.")
    value, prov = _split_value(record["usd"], None, sources, f"{where}, field 'usd'")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CatalogError(f"{where}, field 'usd': '{value}' is not an amount in USD.")
    if value <= 0:
        raise CatalogError(f"{where}, field 'usd': must be above 0.")
    return PricedPart(name, record["label"], float(value), as_of, prov)


def read_component_prices(data_dir: Path = DATA_DIR) -> ComponentPrices:
    """Read and validate the component files of a data folder."""
    folder = data_dir / COMPONENTS_FOLDER
    sources = read_sources([folder / "sources.yaml"])
    path = folder / "parts.yaml"
    doc = _read_yaml(path) or {}
    if not isinstance(doc, Mapping) or set(doc) - {"platforms", "power_supplies"}:
        raise CatalogError(f"{path}: expected the sections 'platforms:' and 'power_supplies:'.")
    platforms: list[Platform] = []
    for i, record in enumerate(doc.get("platforms") or []):
        where = f"{path}: platform {i + 1}"
        if not isinstance(record, Mapping) or set(record) - {
            "build_class",
            "gpus",
            "label",
            "parts",
        }:
            raise CatalogError(f"{where}: give build_class, gpus, label and parts only.")
        gpus = record.get("gpus")
        if not isinstance(gpus, int) or gpus < 1 or not isinstance(record.get("build_class"), str):
            raise CatalogError(f"{where}: give its build_class and a GPU count of 1 or more.")
        parts = tuple(
            _part(p, sources, f"{where}, part {j + 1}")
            for j, p in enumerate(record.get("parts") or [])
        )
        if not parts:
            raise CatalogError(f"{where}: no parts.")
        platforms.append(Platform(record["build_class"], gpus, str(record.get("label", "")), parts))
    keys = [(p.build_class, p.gpus) for p in platforms]
    if len(set(keys)) != len(keys):
        raise CatalogError(f"{path}: a build class and GPU count is priced twice.")
    supplies: list[PowerSupply] = []
    for i, record in enumerate(doc.get("power_supplies") or []):
        where = f"{path}: power supply {i + 1}"
        watts = record.get("watts") if isinstance(record, Mapping) else None
        if isinstance(watts, bool) or not isinstance(watts, int | float) or watts <= 0:
            raise CatalogError(f"{where}, field 'watts': give the rated output in W.")
        supplies.append(PowerSupply(float(watts), _part(record, sources, where, part="psu")))
    supplies.sort(key=lambda s: s.watts)
    if len({s.watts for s in supplies}) != len(supplies):
        raise CatalogError(f"{path}: two power supplies of the same wattage.")
    used = {p.provenance.source for pl in platforms for p in pl.parts}
    used |= {s.price.provenance.source for s in supplies}
    unused = sorted(set(sources) - used)
    if unused:
        raise CatalogError(f"{folder / 'sources.yaml'}: sources {unused} are used by no price.")
    return ComponentPrices(tuple(platforms), tuple(supplies), sources)


@functools.cache
def shipped_component_prices() -> ComponentPrices:
    """The component prices shipped with whichgpu (read once per process)."""
    return read_component_prices()
