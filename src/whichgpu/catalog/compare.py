"""Side-by-side comparison of GPUs on what matters for deep learning, relative to the first.

The rows are memory, bandwidth, the AMP rate (FP16/BF16 with FP32 accumulate — what
mixed-precision training gets: tensor cores, or the FP32 units of a GPU without them), TF32
and FP8 rates, L2, power and price, plus two value ratios (tensor TFLOPS and bandwidth per
$1,000). Ratios divide by the first GPU's value.
"""

from __future__ import annotations

from collections.abc import Sequence

from whichgpu.catalog.freshness import stale_policy
from whichgpu.catalog.query import Catalog
from whichgpu.errors import UsageError
from whichgpu.schema import Comparison, ComparisonRow, GpuSpec, Price

_THOUSAND_USD = 1000.0


ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("Memory", "memory_gb", "GB", True),
    ("Memory bandwidth", "memory_bandwidth_gbps", "GB/s", True),
    ("AMP rate (FP16/BF16, FP32 acc.)", "amp_tensor_tflops", "TFLOPS", True),
    ("TF32 tensor", "tf32_tensor_tflops", "TFLOPS", True),
    ("FP8 tensor", "fp8_tensor_tflops", "TFLOPS", True),
    ("FP32 vector", "fp32_tflops", "TFLOPS", True),
    ("L2 cache", "l2_cache_mib", "MiB", True),
    ("Board power", "tdp_w", "W", False),
    ("Purchase price", "purchase_usd", "USD", False),
    ("Cloud on-demand (cheapest)", "cloud_usd_per_hour", "USD/h", False),
    ("AMP TFLOPS per $1,000", "amp_tflops_per_kusd", "TFLOPS/k$", True),
    ("Bandwidth per $1,000", "bandwidth_gbps_per_kusd", "GB/s/k$", True),
)
"""(label, field, unit, higher is better) of each compared quantity, in display order."""


def _price_note(price: Price | None) -> str:
    """Which price, where from: kind, provider, amount, date, age (``STALE`` past the
    threshold) and source."""
    if price is None:
        return "no price"
    where = f" {price.provider}" if price.provider else ""
    amount = f"${price.usd:,.2f}/h" if price.per == "hour" else f"${price.usd:,.0f}"
    source = "your price file" if price.user else price.source
    return (
        f"{price.kind}{where} {amount} ({price.as_of}, {stale_policy().age_note(price)}, {source})"
    )


def _per_kusd(value: float | None, price: Price | None) -> float | None:
    if value is None or price is None:
        return None
    return value / (price.usd / _THOUSAND_USD)


def _figures(spec: GpuSpec, buy: Price | None, rent: Price | None) -> dict[str, float | None]:
    """Every quantity of ``ROWS`` for one GPU."""
    return {
        "memory_gb": spec.memory_gb,
        "memory_bandwidth_gbps": spec.memory_bandwidth_gbps,
        "amp_tensor_tflops": spec.amp_tensor_tflops,
        "tf32_tensor_tflops": spec.tf32_tensor_tflops,
        "fp8_tensor_tflops": spec.fp8_tensor_tflops,
        "fp32_tflops": spec.fp32_tflops,
        "l2_cache_mib": spec.l2_cache_mib,
        "tdp_w": spec.tdp_w,
        "purchase_usd": buy.usd if buy else None,
        "cloud_usd_per_hour": rent.usd if rent else None,
        "amp_tflops_per_kusd": _per_kusd(spec.amp_tensor_tflops, buy),
        "bandwidth_gbps_per_kusd": _per_kusd(spec.memory_bandwidth_gbps, buy),
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base


def compare(catalog: Catalog, gpus: Sequence[GpuSpec]) -> Comparison:
    """Compare ``gpus`` (at least two, all different), baseline first."""
    if len(gpus) < 2:
        raise UsageError("Compare needs at least two GPUs, e.g. `whichgpu compare 3090 4090`.")
    ids = [g.id for g in gpus]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise UsageError(f"{', '.join(repeated)} is named twice; compare different GPUs.")
    choices = [catalog.purchase_choice(g.id) for g in gpus]
    buy = [c.price if c is not None else None for c in choices]
    rent = [catalog.cheapest_cloud_price(g.id) for g in gpus]
    figures = [_figures(g, b, r) for g, b, r in zip(gpus, buy, rent, strict=True)]
    rows = []
    for label, field, unit, higher in ROWS:
        values = tuple(f[field] for f in figures)
        rows.append(
            ComparisonRow(
                label=label,
                field=field,
                unit=unit,
                values=values,
                ratios=tuple(_ratio(v, values[0]) for v in values),
                higher_is_better=higher,
            )
        )
    return Comparison(
        gpu_ids=tuple(ids),
        names=tuple(g.name for g in gpus),
        rows=tuple(rows),
        price_notes=tuple(
            _price_note(None) if c is None else f"{_price_note(c.price)}: {c.reason}"
            for c in choices
        ),
        cloud_notes=tuple(_price_note(p) if p else "no cloud rate" for p in rent),
    )
