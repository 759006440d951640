"""Software stacks: the memory a process holds outside PyTorch's allocator, and the speed
figures that depend on the stack's software (its attention on Hopper; whether a compiled step's
attention is masked), as sourced data.

Read from ``data/v1/stacks/*.yaml``; every value is a scalar or ``{value, source, confidence,
note}`` like the GPU records, and sources come from the same source table. Sizes are written in
MiB where they are allowances and in bytes where they are exact (``*_mib`` / ``*_bytes``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from whichgpu.catalog.loader import DATA_DIR, _first_error, _read_yaml, _split_value, read_sources
from whichgpu.errors import CatalogError, UsageError
from whichgpu.schema import Provenance, ServingEngine, SoftwareStack, Source
from whichgpu.units import MIB

_VALUE_FIELDS = {
    "cuda_context_mib": ("cuda_context_bytes", MIB),
    "cublas_workspace_bytes": ("cublas_workspace_bytes", 1),
    "cublas_workspace_sm90_bytes": ("cublas_workspace_sm90_bytes", 1),
    "cublaslt_workspace_bytes": ("cublaslt_workspace_bytes", 1),
    "cudnn_workspace_percent": ("cudnn_workspace_percent", 1),
    "nccl_mib_per_gpu": ("nccl_bytes_per_gpu", MIB),
    "hopper_attention_percent": ("hopper_attention_percent", 1),
}
_FLAG_FIELDS = ("compiled_causal_mask",)
"""Yes/no fields: ``value: true`` or ``false``."""


def parse_stack(
    record: Mapping[str, Any], sources: Mapping[str, Source], path: Path
) -> SoftwareStack:
    """Validate one stack record."""
    where = f"{path}: stack '{record.get('id', '?')}'"
    unknown = set(record) - {"id", "label", "default"} - set(_VALUE_FIELDS) - set(_FLAG_FIELDS)
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}.")
    fields: dict[str, Any] = {k: record[k] for k in ("id", "label", "default") if k in record}
    provenance: dict[str, Provenance] = {}
    for raw_name in (*_VALUE_FIELDS, *_FLAG_FIELDS):
        if raw_name not in record:
            raise CatalogError(f"{where}: field '{raw_name}' is missing.")
        value, prov = _split_value(record[raw_name], None, sources, f"{where}, field '{raw_name}'")
        if raw_name in _FLAG_FIELDS:
            if not isinstance(value, bool):
                raise CatalogError(
                    f"{where}, field '{raw_name}': write true or false, not {value!r}."
                )
            name = raw_name
        else:
            name, scale = _VALUE_FIELDS[raw_name]
            value = round(float(value) * scale)
        fields[name] = value
        provenance[name] = prov
    try:
        return SoftwareStack(**fields, provenance=provenance)
    except ValidationError as exc:
        raise CatalogError(f"{where}: {_first_error(exc)}") from exc


def read_stacks(data_dir: Path = DATA_DIR) -> tuple[SoftwareStack, ...]:
    """Every stack of a data folder; exactly one must be the default."""
    sources = read_sources(sorted((data_dir / "sources").glob("*.yaml")))
    stacks: list[SoftwareStack] = []
    for path in sorted((data_dir / "stacks").glob("*.yaml")):
        doc = _read_yaml(path) or {}
        stacks.extend(parse_stack(record, sources, path) for record in doc.get("stacks", []))
    ids = [s.id for s in stacks]
    if len(set(ids)) != len(ids):
        raise CatalogError(f"{data_dir / 'stacks'}: a stack id is defined twice.")
    if sum(s.default for s in stacks) != 1:
        raise CatalogError(f"{data_dir / 'stacks'}: exactly one stack must be the default.")
    return tuple(stacks)


_ENGINE_FIELDS = (
    "gpu_memory_utilization",
    "block_size_tokens",
    "profile_tokens",
    "prefill_chunk_tokens",
    "memory_fraction_of",
    "cuda_graphs_decode",
    "chunked_prefill",
    "max_sequences",
    "max_sequences_small_gpu",
    "large_gpu_gib",
    "small_gpu_names",
    "token_budget_small_gpu",
)
_OPTIONAL_ENGINE_FIELDS = ("memory_tiers", "static_reserve")
"""Fields only an engine whose defaults follow the GPU's memory in tiers has (SGLang)."""


def parse_serving_engine(
    record: Mapping[str, Any], sources: Mapping[str, Source], path: Path
) -> ServingEngine:
    """Validate one serving-engine record (``serving_engines:`` of a stacks file)."""
    where = f"{path}: serving engine '{record.get('id', '?')}'"
    unknown = set(record) - {"id", "label"} - set(_ENGINE_FIELDS) - set(_OPTIONAL_ENGINE_FIELDS)
    if unknown:
        raise CatalogError(f"{where}: unknown fields {sorted(unknown)}.")
    fields: dict[str, Any] = {k: record[k] for k in ("id", "label") if k in record}
    provenance: dict[str, Provenance] = {}
    missing = [name for name in _ENGINE_FIELDS if name not in record]
    if missing:
        raise CatalogError(f"{where}: field '{missing[0]}' is missing.")
    for name in (*_ENGINE_FIELDS, *_OPTIONAL_ENGINE_FIELDS):
        if name in record:
            value, prov = _split_value(record[name], None, sources, f"{where}, field '{name}'")
            fields[name] = value
            provenance[name] = prov
    try:
        return ServingEngine(**fields, provenance=provenance)
    except ValidationError as exc:
        raise CatalogError(f"{where}: {_first_error(exc)}") from exc


def read_serving_engines(data_dir: Path = DATA_DIR) -> tuple[ServingEngine, ...]:
    """Every serving engine of a data folder (``serving_engines:`` in ``stacks/*.yaml``)."""
    sources = read_sources(sorted((data_dir / "sources").glob("*.yaml")))
    engines: list[ServingEngine] = []
    for path in sorted((data_dir / "stacks").glob("*.yaml")):
        doc = _read_yaml(path) or {}
        engines.extend(
            parse_serving_engine(r, sources, path) for r in doc.get("serving_engines", [])
        )
    return tuple(engines)


def get_serving_engine(engine_id: str) -> ServingEngine:
    """The serving engine ``engine_id``; unknown ids are a usage error listing the known ones."""
    engines = read_serving_engines()
    for engine in engines:
        if engine.id == engine_id:
            return engine
    known = ", ".join(e.id for e in engines)
    raise UsageError(f"--serving: unknown serving engine '{engine_id}'. Known: {known}.")


@functools.cache
def shipped_stacks() -> tuple[SoftwareStack, ...]:
    """The stacks shipped with whichgpu (read once)."""
    return read_stacks()


def get_stack(stack_id: str | None = None) -> SoftwareStack:
    """The stack ``stack_id``, or the default one; unknown ids list the known ones."""
    stacks = shipped_stacks()
    if stack_id is None:
        return next(s for s in stacks if s.default)
    for stack in stacks:
        if stack.id == stack_id:
            return stack
    known = ", ".join(s.id for s in stacks)
    raise UsageError(f"Unknown software stack '{stack_id}'. Known stacks: {known}.")
