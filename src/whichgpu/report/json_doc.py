"""JSON documents of whichgpu results (what ``--json`` prints; stable keys, documented in
``docs/commands.md``).

Each function returns plain JSON-ready data; ``dumps`` writes it. Keys carry units in their
names; unknown values are ``null``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from whichgpu.schema import (
    SCHEMA_VERSION,
    SPEC_FIELDS,
    Comparison,
    GpuSpec,
    MemoryEstimate,
    MemoryValidation,
    Price,
    ProfileSummary,
    Source,
    ThroughputEstimate,
    ThroughputValidation,
    WorkloadInfo,
)

if TYPE_CHECKING:
    from whichgpu.estimate.closed_form import CrossCheckRow

GPU_ROW_FIELDS = (
    "id",
    "name",
    "vendor",
    "segment",
    "architecture",
    "launch_date",
    "memory_gb",
    "memory_type",
    "memory_bandwidth_gbps",
    "fp32_tflops",
    "fp16_tensor_tflops",
    "bf16_tensor_tflops",
    "tf32_tensor_tflops",
    "fp8_tensor_tflops",
    "tdp_w",
    "launch_price_usd",
)
"""Keys of one row of ``whichgpu gpus --json``."""


def dumps(data: Any) -> str:
    """Serialise to indented JSON (UTF-8 text, stable key order); ``ValueError`` on an
    infinite or NaN figure, which JSON cannot hold, rather than writing invalid JSON."""
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False)


def _plain(spec: GpuSpec) -> dict[str, Any]:
    dumped: dict[str, Any] = spec.model_dump(mode="json")
    return dumped


def gpu_row(spec: GpuSpec) -> dict[str, Any]:
    """The summary of one GPU used by ``gpus --json``."""
    dumped = _plain(spec)
    return {key: dumped.get(key) for key in GPU_ROW_FIELDS}


def gpu_rows(specs: Iterable[GpuSpec]) -> list[dict[str, Any]]:
    """``gpus --json``: a list of summaries."""
    return [gpu_row(s) for s in specs]


def price_doc(price: Price, sources: Mapping[str, Source]) -> dict[str, Any]:
    """One price, with its source's title and URL when it is a catalog source."""
    doc: dict[str, Any] = price.model_dump(mode="json")
    doc.pop("gpu_id")
    src = sources.get(price.source)
    doc["source_url"] = src.url if src else None
    return doc


def gpu_sheet(
    spec: GpuSpec, prices: Iterable[Price], sources: Mapping[str, Source], catalog_version: str
) -> dict[str, Any]:
    """``show --json``: every field, its provenance (with source title and URL), aliases, prices."""
    dumped = _plain(spec)
    provenance = {}
    for field, prov in spec.provenance.items():
        src = sources[prov.source]
        provenance[field] = {
            **prov.model_dump(mode="json"),
            "source_title": src.title,
            "source_url": src.url,
        }
    doc = {key: dumped[key] for key in ("id", "name", "vendor", "segment")}
    doc.update({key: dumped[key] for key in SPEC_FIELDS})
    doc["notes"] = spec.notes
    doc["aliases"] = list(spec.aliases)
    doc["provenance"] = provenance
    doc["prices"] = [price_doc(p, sources) for p in prices]
    doc["catalog_version"] = catalog_version
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def comparison_doc(comparison: Comparison) -> dict[str, Any]:
    """``compare --json``: the GPUs, the rows (values and ratios to the first) and price notes."""
    doc: dict[str, Any] = comparison.model_dump(mode="json")
    doc["baseline"] = comparison.gpu_ids[0]
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def workload_rows(infos: Iterable[WorkloadInfo]) -> list[dict[str, Any]]:
    """``workloads --json``: one object per named workload."""
    return [info.model_dump(mode="json") for info in infos]


def profile_doc(summary: ProfileSummary) -> dict[str, Any]:
    """``profile --json``: the summary of a traced step."""
    doc: dict[str, Any] = summary.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def fit_doc(estimates: Iterable[MemoryEstimate]) -> list[dict[str, Any]]:
    """``fit --json``: one object per GPU (all byte counts in bytes; per GPU of ``gpus``
    training together under ``sharding`` when ``gpus`` > 1)."""
    return _per_gpu(estimates)


def _per_gpu(estimates: Iterable[MemoryEstimate | ThroughputEstimate]) -> list[dict[str, Any]]:
    """One JSON object per estimate, each with the schema version."""
    out = []
    for estimate in estimates:
        doc: dict[str, Any] = estimate.model_dump(mode="json")
        doc["schema_version"] = SCHEMA_VERSION
        out.append(doc)
    return out


def memory_validation_doc(validation: MemoryValidation) -> dict[str, Any]:
    """``validate memory --json``: every case and the summary."""
    doc: dict[str, Any] = validation.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc


def closed_form_check_doc(rows: Iterable[CrossCheckRow]) -> dict[str, Any]:
    """``validate closed-form --json``: every point (bytes) and the error ranges."""
    points = [
        {
            **dataclasses.asdict(r),
            "reserved_error": r.reserved_error,
        }
        for r in rows
    ]
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "points": points}
    for key in ("relative_error", "reserved_error"):
        values = [p[key] for p in points]
        doc[f"{key}_min"] = min(values, default=None)
        doc[f"{key}_max"] = max(values, default=None)
    return doc


def predict_doc(estimates: Iterable[ThroughputEstimate]) -> list[dict[str, Any]]:
    """``predict --json``: one object per GPU, fastest first."""
    return _per_gpu(estimates)


def throughput_validation_doc(validation: ThroughputValidation) -> dict[str, Any]:
    """``validate throughput --json``: every case, the summaries and the seed checks."""
    doc: dict[str, Any] = validation.model_dump(mode="json")
    doc["schema_version"] = SCHEMA_VERSION
    return doc
