"""Software support: which fine-tuning and training methods and kernels run on which stack.

Read from ``data/v1/software/support.yaml`` with its own source table
(``data/v1/software/sources.yaml``; documented in ``data/README.md``, "Software support"). A
*feature* is something a run may need (bitsandbytes 4-bit for QLoRA, its 8-bit optimizers, an
FP8 training recipe, FlashAttention-2), with the run settings that need it and what a ranking
does when a GPU's stack runs it only partly or not at all. A *fact* says, for one feature and
one stack (a vendor, narrowed by CUDA compute capability or AMD LLVM target), whether it is
supported, with its source and date. ``support_for`` answers for one GPU and one run.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from whichgpu.catalog.loader import DATA_DIR, _read_yaml, read_sources
from whichgpu.errors import CatalogError
from whichgpu.schema import GpuSpec, RunConfig, Source, Vendor

SOFTWARE_FOLDER = "software"
"""Sub-folder of a data folder that holds the software-support files."""

SupportStatus = Literal["supported", "partial", "unsupported"]
"""What a fact says of a feature on a stack."""
Effect = Literal["exclude", "rank-lower", "note"]
"""What a ranking does with a GPU whose stack runs a needed feature partly or not at all."""
_STATUSES: tuple[str, ...] = get_args(SupportStatus)
_EFFECTS: tuple[str, ...] = get_args(Effect)
_NEEDED_BY = ("method", "optimizer", "precision", "has_seq_len")
"""Run settings a feature may be needed by (``has_seq_len``: a sequence model's run)."""


@dataclass(frozen=True)
class Feature:
    """Something a run may need from the software stack."""

    id: str
    """Stable id (``bnb-4bit``)."""
    label: str
    """What it is, in words."""
    needed_by: Mapping[str, tuple[Any, ...]]
    """Run settings that need it: ``method``, ``optimizer``, ``precision`` or ``has_seq_len``
    mapped to the values that need it (any one suffices)."""
    effect_unsupported: Effect
    """What a ranking does where the stack cannot run it."""
    effect_partial: Effect
    """What a ranking does where the stack runs it with limits."""

    def needed(self, run: RunConfig) -> bool:
        """Whether ``run`` needs this feature."""
        values = {
            "method": run.method,
            "optimizer": run.optimizer if run.mode == "train" else None,
            "precision": run.precision,
            "has_seq_len": run.seq_len is not None or run.context is not None,
        }
        return any(values[k] in allowed for k, allowed in self.needed_by.items())


@dataclass(frozen=True)
class SupportFact:
    """Whether one feature runs on one stack, with its source and date."""

    feature: str
    """The feature's id."""
    vendor: Vendor
    """The maker whose stack it is."""
    status: SupportStatus
    """``supported``, ``partial`` (runs with limits) or ``unsupported``."""
    source: Source
    """The public document that states it."""
    as_of: dt.date
    """The date the source states it (its publication date, else the day it was read)."""
    note: str
    """What the source says, in a few words."""
    gfx_targets: tuple[str, ...] = ()
    """AMD LLVM targets it covers (empty: any)."""
    min_compute_capability: tuple[int, int] | None = None
    """Lowest CUDA compute capability it covers (inclusive)."""
    below_compute_capability: tuple[int, int] | None = None
    """CUDA compute capability it covers up to (exclusive)."""

    def matches(self, gpu: GpuSpec) -> bool:
        """Whether the fact is about ``gpu``'s stack."""
        if gpu.vendor is not self.vendor:
            return False
        if self.gfx_targets and gpu.gfx_target not in self.gfx_targets:
            return False
        if self.min_compute_capability or self.below_compute_capability:
            cc = _capability(gpu.compute_capability)
            if cc is None:
                return False
            if self.min_compute_capability and cc < self.min_compute_capability:
                return False
            if self.below_compute_capability and cc >= self.below_compute_capability:
                return False
        return True

    def cite(self) -> str:
        """``sw-bnb-install-v050, 2026-11-27, https://…``: where and when it was said."""
        return f"{self.source.key}, {self.as_of}, {self.source.url}"


@dataclass(frozen=True)
class SoftwareSupport:
    """Every feature and fact of a data folder, validated."""

    features: tuple[Feature, ...]
    """Features, in file order."""
    facts: tuple[SupportFact, ...]
    """Facts, in file order (the first that matches a GPU decides)."""
    sources: Mapping[str, Source]
    """The source table of the facts."""


@dataclass(frozen=True)
class SupportVerdict:
    """What one needed feature comes to on one GPU."""

    feature: Feature
    """The feature the run needs."""
    status: SupportStatus | None
    """What the matching fact says; None where no fact is about this GPU's stack."""
    fact: SupportFact | None
    """The fact that decided (None: not known)."""

    @property
    def effect(self) -> Effect | None:
        """What the ranking does: ``exclude``, ``rank-lower``, ``note``, or None (runs fully)."""
        if self.status == "unsupported":
            return self.feature.effect_unsupported
        if self.status == "partial":
            return self.feature.effect_partial
        return None

    def describe(self) -> str:
        """The verdict in one line, with its source and date."""
        if self.fact is None:
            return f"{self.feature.label}: not known for this stack (no sourced fact)"
        words = {"supported": "runs", "partial": "runs with limits", "unsupported": "does not run"}
        return (
            f"{self.feature.label} {words[self.fact.status]}: {self.fact.note} ({self.fact.cite()})"
        )


def _capability(text: str | None) -> tuple[int, int] | None:
    """``"8.6"`` as ``(8, 6)``; None when absent or not of that form."""
    if not text:
        return None
    major, _, minor = str(text).partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return None


def _date(value: Any, where: str) -> dt.date:
    if isinstance(value, dt.date):
        return value
    raise CatalogError(f"{where}, field 'as_of': '{value}' is not a date like 2026-11-27.")


def _feature(record: Any, where: str) -> Feature:
    if not isinstance(record, Mapping):
        raise CatalogError(f"{where}: expected a mapping of fields.")
    unknown = set(record) - {"id", "label", "needed_by", "effect"}
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}.")
    needed = record.get("needed_by") or {}
    if not isinstance(needed, Mapping) or not needed or set(needed) - set(_NEEDED_BY):
        raise CatalogError(f"{where}, field 'needed_by': give some of {', '.join(_NEEDED_BY)}.")
    effect = record.get("effect") or {}
    if not isinstance(effect, Mapping) or set(effect) != {"unsupported", "partial"}:
        raise CatalogError(f"{where}, field 'effect': give 'unsupported' and 'partial'.")
    for key, value in effect.items():
        if value not in _EFFECTS:
            raise CatalogError(f"{where}, effect '{key}': one of {', '.join(_EFFECTS)}.")
    for key in ("id", "label"):
        if not isinstance(record.get(key), str):
            raise CatalogError(f"{where}, field '{key}': missing.")
    return Feature(
        id=record["id"],
        label=record["label"],
        needed_by={k: tuple(v) for k, v in needed.items()},
        effect_unsupported=cast(Effect, effect["unsupported"]),
        effect_partial=cast(Effect, effect["partial"]),
    )


def _fact(
    record: Any, features: Sequence[str], sources: Mapping[str, Source], where: str
) -> SupportFact:
    if not isinstance(record, Mapping):
        raise CatalogError(f"{where}: expected a mapping of fields.")
    fields = {
        "feature",
        "vendor",
        "status",
        "source",
        "as_of",
        "note",
        "gfx_targets",
        "min_compute_capability",
        "below_compute_capability",
    }
    unknown = set(record) - fields
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}.")
    missing = [
        f for f in ("feature", "vendor", "status", "source", "as_of", "note") if not record.get(f)
    ]
    if missing:
        raise CatalogError(f"{where}: missing {missing}.")
    if record["feature"] not in features:
        raise CatalogError(f"{where}, field 'feature': '{record['feature']}' is not a feature.")
    if record["status"] not in _STATUSES:
        raise CatalogError(f"{where}, field 'status': one of {', '.join(_STATUSES)}.")
    if record["source"] not in sources:
        raise CatalogError(f"{where}: source '{record['source']}' is not in the source table.")
    try:
        vendor = Vendor(record["vendor"])
    except ValueError as exc:
        raise CatalogError(f"{where}, field 'vendor': '{record['vendor']}' is unknown.") from exc
    bounds: dict[str, tuple[int, int] | None] = {}
    for key in ("min_compute_capability", "below_compute_capability"):
        raw = record.get(key)
        bounds[key] = _capability(raw) if raw is not None else None
        if raw is not None and bounds[key] is None:
            raise CatalogError(f"{where}, field '{key}': '{raw}' is not like \"8.9\".")
    return SupportFact(
        feature=record["feature"],
        vendor=vendor,
        status=cast(SupportStatus, record["status"]),
        source=sources[record["source"]],
        as_of=_date(record["as_of"], where),
        note=str(record["note"]),
        gfx_targets=tuple(str(t) for t in record.get("gfx_targets") or ()),
        min_compute_capability=bounds["min_compute_capability"],
        below_compute_capability=bounds["below_compute_capability"],
    )


def read_software_support(data_dir: Path = DATA_DIR) -> SoftwareSupport:
    """Read and validate the software-support files of a data folder."""
    folder = data_dir / SOFTWARE_FOLDER
    sources = read_sources([folder / "sources.yaml"])
    path = folder / "support.yaml"
    doc = _read_yaml(path) or {}
    if not isinstance(doc, Mapping) or set(doc) - {"features", "facts"}:
        raise CatalogError(f"{path}: expected the sections 'features:' and 'facts:'.")
    features = [
        _feature(r, f"{path}: feature {i + 1}") for i, r in enumerate(doc.get("features") or [])
    ]
    ids = [f.id for f in features]
    if len(set(ids)) != len(ids):
        raise CatalogError(f"{path}: a feature id is defined twice.")
    facts = tuple(
        _fact(r, ids, sources, f"{path}: fact {i + 1}")
        for i, r in enumerate(doc.get("facts") or [])
    )
    unused = sorted(set(sources) - {f.source.key for f in facts})
    if unused:
        raise CatalogError(f"{folder / 'sources.yaml'}: sources {unused} are used by no fact.")
    return SoftwareSupport(features=tuple(features), facts=facts, sources=sources)


@functools.cache
def shipped_software_support() -> SoftwareSupport:
    """The software-support data shipped with whichgpu (read once per process)."""
    return read_software_support()


def support_for(
    gpu: GpuSpec, run: RunConfig, data: SoftwareSupport | None = None
) -> tuple[SupportVerdict, ...]:
    """For each feature ``run`` needs, what the first fact about ``gpu``'s stack says."""
    data = data or shipped_software_support()
    verdicts: list[SupportVerdict] = []
    for feature in data.features:
        if not feature.needed(run):
            continue
        fact = next((f for f in data.facts if f.feature == feature.id and f.matches(gpu)), None)
        verdicts.append(SupportVerdict(feature, fact.status if fact else None, fact))
    return tuple(verdicts)
