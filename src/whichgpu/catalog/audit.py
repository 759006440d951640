"""Internal-consistency checks of the catalog data, beyond what the schema can express.

``audit`` returns human-readable problems (an empty list means the data is consistent). The
test suite runs it on the shipped data; maintainers run ``python -m whichgpu.catalog.audit``
after editing data files. The tolerances here are about transcription errors, not hardware.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterable

from whichgpu.catalog.cost_data import read_cost_data
from whichgpu.catalog.loader import CatalogData, read_data_dir
from whichgpu.catalog.names import alias_keys, normalize
from whichgpu.catalog.stacks import read_serving_engines, read_stacks
from whichgpu.errors import CatalogError
from whichgpu.schema import SPEC_FIELDS, GpuSpec, Segment, Vendor
from whichgpu.units import MIB, gb_to_bytes

BANDWIDTH_TOLERANCE = 0.02
RATE_TOLERANCE = 0.015
EARLIEST_LAUNCH = dt.date(2012, 1, 1)


def _close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(abs(a), abs(b))


def _is_geforce_half_rate(spec: GpuSpec) -> bool:
    """GeForce RTX cards (not Titans) run FP16 x FP16 -> FP32 at half the FP16-accumulate rate."""
    return (
        spec.vendor is Vendor.NVIDIA
        and spec.segment is Segment.CONSUMER
        and "titan" not in spec.name.lower()
        and spec.fp16_tensor_tflops is not None
    )


def audit_gpu(spec: GpuSpec, today: dt.date | None = None) -> list[str]:
    """Problems with one record."""
    today = today or dt.date.today()
    p = f"{spec.id}:"
    problems = [
        f"{p} {name} has no provenance"
        for name in SPEC_FIELDS
        if getattr(spec, name) is not None and name not in spec.provenance
    ]
    bus, rate, bw = (
        spec.memory_bus_width_bits,
        spec.memory_data_rate_gbps,
        spec.memory_bandwidth_gbps,
    )
    if bus and rate and bw and not _close(bus / 8 * rate, bw, BANDWIDTH_TOLERANCE):
        problems.append(
            f"{p} bandwidth {bw} GB/s != bus {bus} bit / 8 x {rate} Gbps = {bus / 8 * rate:g}"
        )
    acc16, acc32 = spec.fp16_acc16_tensor_tflops, spec.fp16_tensor_tflops
    if acc16 and acc32:
        if _is_geforce_half_rate(spec):
            if not _close(acc16, 2 * acc32, RATE_TOLERANCE):
                problems.append(f"{p} GeForce FP16-acc {acc16} should be 2 x FP32-acc {acc32}")
        elif acc16 < acc32 * (1 - RATE_TOLERANCE):
            problems.append(f"{p} FP16-accumulate {acc16} below FP32-accumulate {acc32}")
    sparse = spec.sparse_fp16_tensor_tflops
    dense = max(x for x in (acc16, acc32, spec.bf16_tensor_tflops, 0.0) if x is not None)
    if sparse is not None and dense:
        if sparse < dense:
            problems.append(f"{p} sparse FP16 {sparse} below dense {dense}")
        elif spec.vendor is Vendor.NVIDIA and not _close(sparse, 2 * dense, RATE_TOLERANCE):
            problems.append(f"{p} NVIDIA sparse FP16 {sparse} should be 2 x dense {dense}")
    tf32, fp16, fp8 = spec.tf32_tensor_tflops, spec.fp16_tensor_tflops, spec.fp8_tensor_tflops
    if tf32 and fp16 and tf32 > fp16 * (1 + RATE_TOLERANCE):
        problems.append(f"{p} TF32 {tf32} above FP16 {fp16}")
    if fp8 and fp16 and fp8 < fp16 * (1 - RATE_TOLERANCE):
        problems.append(f"{p} FP8 {fp8} below FP16 {fp16}")
    if spec.fp4_tensor_tflops and fp8 and spec.fp4_tensor_tflops < fp8 * (1 - RATE_TOLERANCE):
        problems.append(f"{p} FP4 {spec.fp4_tensor_tflops} below FP8 {fp8}")
    sustained = spec.sustained_tensor_tflops
    if sustained is not None and not 0 < sustained <= (dense or 0.0):
        problems.append(f"{p} sustained tensor {sustained} not within its dense 16-bit peak")
    if spec.fp32_tflops and spec.fp64_tflops and spec.fp64_tflops > spec.fp32_tflops * 1.01:
        problems.append(f"{p} FP64 {spec.fp64_tflops} above FP32 {spec.fp32_tflops}")
    if spec.launch_date and not EARLIEST_LAUNCH <= spec.launch_date <= today:
        problems.append(f"{p} launch date {spec.launch_date} outside {EARLIEST_LAUNCH}..{today}")
    if spec.memory_usable_mib and spec.memory_gb:
        sold_mib = gb_to_bytes(spec.memory_gb) / MIB
        if not 0.80 * sold_mib <= spec.memory_usable_mib <= 1.10 * sold_mib:
            problems.append(
                f"{p} usable {spec.memory_usable_mib} MiB implausible for {spec.memory_gb} GB"
            )
    if spec.vendor is Vendor.NVIDIA and spec.compute_capability is None:
        problems.append(f"{p} NVIDIA record without compute capability")
    if spec.vendor is Vendor.AMD and spec.gfx_target is None:
        problems.append(f"{p} AMD record without gfx target")
    if spec.memory_gb is None or spec.memory_bandwidth_gbps is None:
        problems.append(f"{p} memory size and bandwidth are required")
    return problems


def audit(data: CatalogData, today: dt.date | None = None) -> list[str]:
    """All problems in a data folder: per record, names, and prices."""
    problems: list[str] = []
    for spec in data.gpus:
        problems.extend(audit_gpu(spec, today))
    problems.extend(_audit_names(data.gpus))
    launch = {g.id: g.launch_date for g in data.gpus}
    for price in data.prices:
        first = launch.get(price.gpu_id)
        if price.kind != "launch" and first and price.as_of < first:
            problems.append(
                f"{price.gpu_id}: {price.kind} price dated {price.as_of} before launch {first}"
            )
    used_sources = {prov.source for g in data.gpus for prov in g.provenance.values()}
    used_sources |= {p.source for p in data.prices}
    used_sources |= {prov.source for s in read_stacks() for prov in s.provenance.values()}
    used_sources |= {prov.source for e in read_serving_engines() for prov in e.provenance.values()}
    used_sources |= {prov.source for prov in read_cost_data().provenance}
    problems.extend(
        f"source '{key}' is not used by any value"
        for key in sorted(set(data.sources) - used_sources)
    )
    return problems


def _audit_names(gpus: Iterable[GpuSpec]) -> list[str]:
    """An id or marketing name must resolve to its own record, never ambiguously."""
    problems: list[str] = []
    owners: dict[str, set[str]] = {}
    for spec in gpus:
        for key in alias_keys(spec):
            owners.setdefault(key, set()).add(spec.id)
    for spec in gpus:
        for own in (spec.id, spec.name):
            ids = owners.get(normalize(own), set())
            if ids != {spec.id}:
                problems.append(
                    f"{spec.id}: its name '{own}' also resolves to {sorted(ids - {spec.id})}"
                )
    return problems


def main() -> int:
    """Print the problems of the shipped data; exit 1 if there are any."""
    try:
        data = read_data_dir()
    except CatalogError as exc:
        print(exc)
        return 1
    problems = audit(data)
    for line in problems:
        print(line)
    datasheet = sum(
        1
        for g in data.gpus
        for p in g.provenance.values()
        if p.confidence.value in ("datasheet", "whitepaper")
    )
    total = sum(len(g.provenance) for g in data.gpus)
    print(
        f"{len(data.gpus)} GPUs, {total} sourced values ({datasheet} datasheet/whitepaper), "
        f"{len(data.prices)} prices, {len(problems)} problems",
        file=sys.stderr,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
