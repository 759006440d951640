"""Which price a cost computation uses: purchase kinds, cloud rates by provider, resale.

Prices come from the catalog (``Catalog.prices``, user price files included). Purchases use
the newest price of the kind asked; ``buy`` takes the lower of the newest new and used
prices, else the launch price (as ``whichgpu compare`` does). Cloud rates are per GPU-hour;
without a provider the cheapest one is taken.

Resale assumption: a GPU keeps, each year, the share of its value that its segment's resale
curve gives (``resale_curve``): a fit of dated used prices of several GPUs against their prices
new (``cost/resale.yaml``, each figure sourced), ``used / new = retention ** age``, never above
1. Over the years owned, the value it starts from is what a used one sells for today where the
catalog has that price (never more than was paid), else the price paid. The user may give the
yearly share instead (``--resale-per-year``). The rest of the machine is assumed to sell for
nothing. A segment with too few observations gets no curve, and then no resale is assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, cast, get_args

from whichgpu.catalog.cost_data import CostData, ResaleObservation, shipped_cost_data
from whichgpu.catalog.freshness import stale_policy
from whichgpu.catalog.query import Catalog
from whichgpu.errors import UsageError
from whichgpu.schema import GpuSpec, Price, PriceKind
from whichgpu.units import DAYS_PER_YEAR

PriceChoice = Literal["buy", "new", "used", "launch", "cloud", "cloud-spot"]
"""Price kinds a value or break-even computation accepts (``buy``: the lower of the freshest new
and used prices, else launch, ``Catalog.purchase_price``; ``cloud``: cheapest on-demand rate;
``cloud-spot``: cheapest spot rate)."""
PRICE_CHOICES: tuple[str, ...] = get_args(PriceChoice)
CLOUD_CHOICES = ("cloud", "cloud-spot")


def check_price_choice(kind: str) -> PriceChoice:
    """``kind`` as a ``PriceChoice``; anything else is a usage error listing the choices."""
    if kind in PRICE_CHOICES:
        return cast(PriceChoice, kind)
    raise UsageError(f"--price-kind: '{kind}' is not one of {', '.join(PRICE_CHOICES)}.")


def purchase_price(catalog: Catalog, gpu_id: str, kind: PriceChoice = "buy") -> Price | None:
    """The price of one GPU: the newest of ``kind`` (``buy``: the lower of the freshest new and
    used, else launch)."""
    if kind == "buy":
        return catalog.purchase_price(gpu_id)
    if kind in CLOUD_CHOICES:
        raise UsageError(f"'{kind}' is a rental rate, not a purchase price.")
    rows = catalog.prices(gpu_id, cast(PriceKind, kind))
    return rows[0] if rows else None


def _cloud_rows(catalog: Catalog, gpu_ids: Iterable[str], spot: bool) -> list[Price]:
    kind: PriceKind = "cloud-spot" if spot else "cloud-on-demand"
    return [p for gpu_id in gpu_ids for p in catalog.prices(gpu_id, kind)]


def known_providers(catalog: Catalog) -> list[str]:
    """Every provider with a cloud price in the catalog (user price files included)."""
    rows = _cloud_rows(catalog, (g.id for g in catalog.all()), False)
    rows += _cloud_rows(catalog, (g.id for g in catalog.all()), True)
    return sorted({p.provider for p in rows if p.provider})


def cloud_price(
    catalog: Catalog,
    spec: GpuSpec,
    provider: str | None = None,
    *,
    spot: bool = False,
    gpus: int = 1,
) -> Price:
    """The rate per GPU-hour of ``gpus`` x ``spec`` in one machine: the provider's cheapest, or
    the cheapest of all. A rate for whole 8-GPU nodes is not one for a single GPU, nor a 1-GPU
    instance's rate one for 8 GPUs together (``Price.instance_gpus``)."""
    rows = _cloud_rows(catalog, [spec.id], spot)
    kind = "spot" if spot else "on-demand"
    if provider is not None:
        name = provider.strip().lower()
        providers = known_providers(catalog)
        if name not in providers:
            raise UsageError(
                f"--provider: unknown provider '{provider}'. Providers with cloud prices in "
                f"the catalog: {', '.join(providers)}."
            )
        offered = sorted({p.provider for p in rows if p.provider})
        rows = [p for p in rows if p.provider == name]
        if not rows:
            others = f" Providers that rent it: {', '.join(offered)}." if offered else ""
            raise UsageError(
                f"--provider: {name} has no {kind} price for {spec.name} in the catalog.{others} "
                "Give the rate with --cloud-rate, or add it to a price file (--prices)."
            )
    sized = [p for p in rows if p.offered_for(gpus)]
    if rows and not sized:
        raise UsageError(
            f"No cloud {kind} offer of {gpus} x {spec.name} in one machine in the catalog: "
            f"{machine_sizes(rows)}. Give the rate with --cloud-rate, or add a price file "
            "(--prices) with the instance_gpus column."
        )
    rows = sized
    if not rows:
        raise UsageError(
            f"No cloud {kind} price for {spec.name} in the catalog. Give the rate with "
            "--cloud-rate, compare with another cloud GPU (--cloud-gpu), or add a price file "
            "(--prices)."
        )
    return min(rows, key=lambda p: p.usd)


def machine_sizes(rows: Iterable[Price]) -> str:
    """How the rows' providers rent the GPU: ``lambda in 1-GPU machines; aws in 8-GPU``."""
    by_provider: dict[str, set[int]] = {}
    for p in rows:
        by_provider.setdefault(p.provider or "?", set()).update(p.instance_gpus or ())
    parts = [
        f"{name} in {'/'.join(str(n) for n in sorted(sizes))}-GPU machines"
        if sizes
        else f"{name} (machine sizes not stated)"
        for name, sizes in sorted(by_provider.items())
    ]
    return "; ".join(parts)


def price_note(price: Price) -> str:
    """Which price it is, in a few words: kind, provider, amount, date and age (``STALE`` past
    the threshold, ``catalog.freshness``), source, machine size."""
    where = f", {price.provider}" if price.provider else ""
    per = "/h" if price.per == "hour" else ""
    mine = ", your file" if price.user else ""
    size = ""
    if price.instance_gpus is not None:
        size = f" in {'/'.join(str(n) for n in price.instance_gpus)}-GPU machines"
    return (
        f"{price.kind}{where}: ${price.usd:,.2f}{per}{size} on {price.as_of} "
        f"({stale_policy().age_note(price)}; {price.source}{mine})"
    )


MIN_RESALE_OBSERVATIONS = 3
"""Used prices a segment needs, of at least ``MIN_RESALE_GPUS`` GPUs, for a resale curve."""
MIN_RESALE_GPUS = 2
"""GPUs a segment's used prices must cover for a resale curve."""


@dataclass(frozen=True)
class ResaleCurve:
    """How fast GPUs of one segment lose value, fitted to dated used prices.

    ``used / new = retention_per_year ** age_years`` fitted by least squares on the logarithm
    (through 1 at launch) to ``observations``.
    """

    segment: str
    """The catalog segment it applies to (``consumer``, ``workstation``), or the class of
    datacenter GPUs (``H100-class``, see ``RESALE_CLASSES``)."""
    retention_per_year: float
    """Share of its value a GPU keeps per year (at most 1)."""
    observations: tuple[ResaleObservation, ...]
    """The dated used prices it is fitted to, oldest first."""
    ages_years: tuple[float, ...]
    """Age of the GPU at each observation, years since its launch."""

    @property
    def sources(self) -> tuple[str, ...]:
        """The source keys of the used prices, in order of first use."""
        keys = [o.provenance["used_usd"].source for o in self.observations]
        return tuple(dict.fromkeys(keys))

    def describe(self, catalog: Catalog) -> str:
        """``consumer GPUs keep 91.5 % a year: 6 used prices of RTX 3090, … (sources …)``."""
        names = dict.fromkeys(catalog.get(o.gpu_id).name for o in self.observations)
        first, last = self.observations[0].as_of, self.observations[-1].as_of
        return (
            f"{self.segment} GPUs keep {self.retention_per_year:.1%} of their value a year: fit "
            f"of {len(self.observations)} dated used prices against prices new ("
            f"{', '.join(names)}; {first:%Y-%m} to {last:%Y-%m}; cost/resale.yaml, sources "
            f"{', '.join(self.sources)})"
        )


RESALE_CLASSES: dict[str, tuple[str, ...]] = {
    "V100": (
        "tesla-v100-sxm2-16gb",
        "tesla-v100-sxm2-32gb",
        "tesla-v100-pcie-16gb",
        "tesla-v100-pcie-32gb",
    ),
    "A100 40GB": ("a100-pcie-40gb", "a100-sxm4-40gb"),
    "A100 80GB": ("a100-pcie-80gb", "a100-sxm4-80gb"),
    "H100": ("h100-pcie", "h100-sxm", "h100-nvl"),
}
"""Datacenter GPUs valued by class, not by segment: generations of datacenter parts lose value
at very different rates (a V100 sells for a few per cent of its price new, an H100 for about
two thirds), so one pooled curve would misvalue each. Every form factor of a class shares
its curve."""
MIN_CLASS_OBSERVATIONS = 2
"""Dated used prices a class needs for its own resale curve; with fewer, no resale is assumed
for it (the rule before class curves) unless the user gives one."""
CLASS_SEGMENTS = frozenset({"datacenter"})
"""Segments whose GPUs are valued by class only: ``resale_curve`` pools none of them."""


def resale_class(gpu_id: str) -> str | None:
    """The resale class of a catalog GPU (``RESALE_CLASSES``), or None."""
    return next((name for name, ids in RESALE_CLASSES.items() if gpu_id in ids), None)


def _observed(
    catalog: Catalog, data: CostData, keep: Callable[[str, str], bool]
) -> tuple[list[ResaleObservation], list[float]]:
    """The observations whose GPU (id, segment) ``keep`` accepts, with a launch date and
    observed after launch, and the GPU's age at each."""
    kept: list[ResaleObservation] = []
    ages: list[float] = []
    for obs in data.resale_observations:
        spec = catalog.get(obs.gpu_id)
        if not keep(spec.id, spec.segment.value) or spec.launch_date is None:
            continue
        age = (obs.as_of - spec.launch_date).days / DAYS_PER_YEAR
        if age <= 0:
            continue
        kept.append(obs)
        ages.append(age)
    return kept, ages


def resale_class_curve(
    catalog: Catalog, name: str, data: CostData | None = None
) -> ResaleCurve | None:
    """The resale curve of the class ``name`` (``RESALE_CLASSES``) from the used prices of its
    GPUs; None with fewer than ``MIN_CLASS_OBSERVATIONS``."""
    ids = RESALE_CLASSES[name]
    kept, ages = _observed(catalog, data or shipped_cost_data(), lambda gid, _: gid in ids)
    if len(kept) < MIN_CLASS_OBSERVATIONS:
        return None
    return _fit(f"{name}-class", kept, ages)


def resale_curve(
    catalog: Catalog, segment: str, data: CostData | None = None
) -> ResaleCurve | None:
    """The resale curve of ``segment`` from the cost data's used prices; None with fewer than
    ``MIN_RESALE_OBSERVATIONS`` of ``MIN_RESALE_GPUS`` GPUs (of that segment, with a launch
    date, observed after launch), and for a segment valued by class (``CLASS_SEGMENTS``: see
    ``resale_class_curve``)."""
    if segment in CLASS_SEGMENTS:
        return None
    kept, ages = _observed(catalog, data or shipped_cost_data(), lambda _, seg: seg == segment)
    if len(kept) < MIN_RESALE_OBSERVATIONS or len({o.gpu_id for o in kept}) < MIN_RESALE_GPUS:
        return None
    return _fit(segment, kept, ages)


def _fit(segment: str, kept: list[ResaleObservation], ages: list[float]) -> ResaleCurve:
    # least squares of ln(used / new) = age x ln(retention), through the origin
    slope = sum(t * math.log(o.used_usd / o.new_usd) for o, t in zip(kept, ages, strict=True))
    slope /= sum(t * t for t in ages)
    return ResaleCurve(
        segment=segment,
        retention_per_year=min(1.0, math.exp(slope)),
        observations=tuple(kept),
        ages_years=tuple(ages),
    )
