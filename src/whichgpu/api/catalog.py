"""The catalog questions of the Python API: ``gpus`` (filter and sort), ``gpu`` (one by
name), ``compare`` (side by side), and ``resolve_gpus``, the names a sizing question asks
about turned into catalog GPUs.

Arguments are checked here as a notebook user gives them (a number where a number belongs,
a vendor or segment by its value in any case), so a mistake is a ``UsageError`` that says
what was expected rather than a failure deep in the catalog.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whichgpu.catalog import load_catalog, sort_gpus
from whichgpu.errors import UsageError
from whichgpu.schema import Comparison, GpuSpec, Segment, Vendor
from whichgpu.tabular import ResultList


def resolve_gpus(names: Sequence[str] | None) -> list[GpuSpec]:
    """Catalog GPUs by name (every GPU with a known memory size when ``names`` is empty); one
    name alone (``"4090"``) is one GPU, not a sequence of letters; a GPU named twice (``4090``
    and ``rtx-4090``) is answered once."""
    catalog = load_catalog()
    if isinstance(names, str):
        names = [names]
    if names is not None and not isinstance(names, Sequence):
        raise UsageError(
            f"gpus= takes GPU names (a list such as ['4090', 'h100-sxm']), not {names!r}; for "
            "a number of GPUs working together, give gpu_count=."
        )
    if names:
        found: dict[str, GpuSpec] = {}
        for name in names:
            gpu = catalog.resolve(name)
            found.setdefault(gpu.id, gpu)
        return list(found.values())
    return [g for g in catalog.all() if g.memory_gb]


def gpus(
    query: str | None = None,
    *,
    vendor: Vendor | str | None = None,
    min_memory_gb: float | None = None,
    segment: Segment | str | None = None,
    arch: str | None = None,
    sort: str = "launch_date",
    prices: Sequence[Path | str] | None = None,
) -> ResultList[GpuSpec]:
    """The GPU catalog, filtered and sorted (``whichgpu gpus``).

    ``query`` matches any part of a name or alias (``"4090"``, ``"a100"``); ``vendor``
    (``"nvidia"``, ``"amd"`` …), ``segment`` (``"consumer"``, ``"workstation"``,
    ``"datacenter"``), ``arch`` (``"Hopper"``) and ``min_memory_gb`` (GB as sold) keep what
    matches all of them. ``sort`` is a key of ``whichgpu gpus --sort``: ``price`` (buy price,
    cheapest first), ``rent`` (cheapest cloud rate), ``freshness`` (newest price first),
    ``memory``, ``name``, or a spec field (numbers and dates largest first, text A-Z); the price
    keys read the prices of ``prices``. ``prices`` are price files laid over the shipped
    prices (default: the user's file).
    """
    if query is not None and not isinstance(query, str):
        raise UsageError(f"query= is part of a GPU's name, a string such as '4090', not {query!r}.")
    if min_memory_gb is not None and (
        isinstance(min_memory_gb, bool) or not isinstance(min_memory_gb, int | float)
    ):
        raise UsageError(f"min_memory_gb must be a number of GB, not {min_memory_gb!r}.")
    if min_memory_gb is not None and not (math.isfinite(min_memory_gb) and min_memory_gb >= 0):
        raise UsageError(f"--min-memory must be a number of GB from 0 up, not {min_memory_gb}.")
    catalog = load_catalog(prices)
    if arch is not None and not catalog.search(architecture=arch):
        known = sorted({g.architecture for g in catalog.all() if g.architecture})
        raise UsageError(
            f"--arch: no architecture starts with '{arch}'. Known: {', '.join(known)}."
        )
    found = catalog.search(
        query,
        vendor=_choice(Vendor, vendor, "vendor"),
        segment=_choice(Segment, segment, "segment"),
        architecture=arch,
        min_memory_gb=min_memory_gb,
    )
    return ResultList(sort_gpus(found, sort, catalog))


def gpu(name: str) -> GpuSpec:
    """One catalog GPU by name, alias or id (``"4090"``, ``"h100 sxm"``), as ``whichgpu show``
    resolves it; an unknown or ambiguous name raises ``GpuLookupError`` with suggestions."""
    return load_catalog().resolve(name)


def compare(*names: str, prices: Sequence[Path | str] | None = None) -> Comparison:
    """Several GPUs side by side, each figure with its ratio to the first (``whichgpu compare``)."""
    from whichgpu.catalog.compare import compare as compare_gpus

    if len(names) < 2:
        raise UsageError("compare needs two or more GPUs; the first is the baseline.")
    catalog = load_catalog(prices)
    return compare_gpus(catalog, [catalog.resolve(n) for n in names])


def _choice(kind: type[Vendor] | type[Segment], value: Any, what: str) -> Any:
    """``value`` as a member of ``kind`` (given as the member or its value, any case)."""
    if value is None or isinstance(value, kind):
        return value
    try:
        return kind(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise UsageError(f"{what}: '{value}' is not one of {allowed}.") from None
