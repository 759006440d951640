"""Units of bytes, FLOPs, time and money, and the only conversions between them.

Memory is sold in decimal gigabytes (a "24 GB" card) but allocated and reported by CUDA in binary
units (GiB, MiB). Mixing the two is off by 7 %, so both are defined here, once, and every other
module converts through these names. Rates follow the vendors' conventions: memory bandwidth in
decimal GB/s, compute in decimal TFLOP/s.
"""

from __future__ import annotations

from typing import Final

KB: Final = 1_000
MB: Final = 1_000_000
GB: Final = 1_000_000_000
TB: Final = 1_000_000_000_000

KIB: Final = 1 << 10
MIB: Final = 1 << 20
GIB: Final = 1 << 30

TERA: Final = 1e12

SECONDS_PER_HOUR: Final = 3600.0
HOURS_PER_DAY: Final = 24.0
DAYS_PER_YEAR: Final = 365.0


def gb_to_bytes(gb: float) -> int:
    """Decimal gigabytes (as marketed) to bytes."""
    return round(gb * GB)


def gib_to_bytes(gib: float) -> int:
    """Binary gibibytes (as CUDA reports) to bytes."""
    return round(gib * GIB)


def mib_to_bytes(mib: float) -> int:
    """Binary mebibytes (as NVML reports) to bytes."""
    return round(mib * MIB)


def bytes_to_gb(n_bytes: float) -> float:
    """Bytes to decimal gigabytes."""
    return n_bytes / GB


def bytes_to_gib(n_bytes: float) -> float:
    """Bytes to binary gibibytes."""
    return n_bytes / GIB


def tflops_to_flops(tflops: float) -> float:
    """TFLOP/s to FLOP/s."""
    return tflops * TERA


# --- energy, mass and money (cost) -----------------------------------------------------------

WATTS_PER_KILOWATT: Final = 1_000.0
GRAMS_PER_KILOGRAM: Final = 1_000.0
USD_PER_KUSD: Final = 1_000.0
"""Dollars in the "per $1,000" of value figures."""
LARGEST_NUMBER: Final = 1e18
"""The largest number whichgpu takes (a price, hours, watts) or answers with (a bill, kWh, kg of
CO2): none is meaningful beyond it, and larger ones only overflow into infinities."""
MILLION: Final = 1_000_000.0
"""The "per million" of per-unit prices (USD per million tokens or samples)."""


def watts_to_kilowatts(watts: float) -> float:
    """W to kW."""
    return watts / WATTS_PER_KILOWATT


def grams_to_kilograms(grams: float) -> float:
    """g to kg."""
    return grams / GRAMS_PER_KILOGRAM
