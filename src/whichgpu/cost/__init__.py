"""What is it worth? Performance per dollar, cloud against own, energy and CO2, build checks.

Pure Python on top of the catalog (prices, board power, slot width, cooling, links) and the
cost data (``data/v1/cost``: regions, build classes, rules of thumb, each sourced). The public
surface, one function per question, each returning a frozen type of ``whichgpu.schema``:

>>> from whichgpu import cost
>>> b = cost.breakeven(system_cost_usd=2200, gpu_w=350, cpu_w=100, utilization=0.15,
...                    electricity_usd_per_kwh=0.12, cloud_usd_per_hour=2.14)
>>> round(b.energy_kwh_per_year, 1), round(b.electricity_usd_per_year, 2)
(591.3, 70.96)
>>> round(b.breakeven_days)
293

- ``breakeven``: renting against owning (yearly costs, break-even day, N-year totals);
- ``value``: performance per dollar of GPUs or whole 1-8 GPU machines, bought or rented,
  normalised to a reference GPU;
- ``build_checks``: power supply, slots, cooling, PCIe lanes and NVLink of an N-GPU build;
- ``job_energy``: kWh, electricity cost and CO2 of a job of known length.

GPUs may be given as names (resolved like ``whichgpu show``) or as ``GpuSpec`` records. The
formulas and every default's source are in ``docs/cost.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from whichgpu.catalog import Catalog, load_catalog
from whichgpu.catalog.cost_data import (
    build_class_for,
    get_region,
    shipped_cost_data,
)
from whichgpu.cost import breakeven as _breakeven
from whichgpu.cost import value as _value
from whichgpu.cost.breakeven import compare_rent_own, cumulative_costs
from whichgpu.cost.build import check_build
from whichgpu.cost.energy import job_energy as _job_energy
from whichgpu.cost.pricing import PriceChoice, check_price_choice, known_providers
from whichgpu.errors import UsageError
from whichgpu.schema import Breakeven, BuildReport, GpuSpec, JobEnergy, ValueTable

__all__ = [
    "PriceChoice",
    "breakeven",
    "build_checks",
    "compare_rent_own",
    "cumulative_costs",
    "job_energy",
    "known_providers",
    "machine_power_w",
    "value",
]

GpuRef = str | GpuSpec
"""A GPU as a name, alias or catalog id, or as its catalog record."""


def _spec(catalog: Catalog, gpu: GpuRef) -> GpuSpec:
    return gpu if isinstance(gpu, GpuSpec) else catalog.resolve(gpu)


def breakeven(
    *,
    gpu: GpuRef | None = None,
    count: int = 1,
    system_cost_usd: float | None = None,
    gpu_w: float | None = None,
    cpu_w: float | None = None,
    utilization: float | str | None = None,
    electricity_usd_per_kwh: float | None = None,
    cloud_usd_per_hour: float | None = None,
    provider: str | None = None,
    cloud_gpu: GpuRef | None = None,
    spot: bool = False,
    years: float | None = None,
    resale_usd: float | None = None,
    region: str | None = None,
    price_kind: PriceChoice | str = "buy",
    build_class: str | None = None,
    resale_per_year: float | None = None,
    catalog: Catalog | None = None,
) -> Breakeven:
    """Cloud against own: yearly costs, the break-even day, N-year totals with resale.

    Every number left out is filled in and recorded in ``Breakeven.inputs``: the machine's price
    from ``count`` x the GPU's ``price_kind`` price + the build class's base system; GPU power
    from board power; CPU power from the build class; electricity and carbon from ``region``
    (default: the data's default region); utilisation and years from the rules of thumb; the
    rent from ``provider``'s (or the cheapest) rate for ``cloud_gpu`` (default: ``gpu``) x
    ``count``; resale from what a used one sells for today (else the price paid) kept at
    ``resale_per_year`` a year (default: the segment's resale curve, fitted to the dated used
    prices of ``cost/resale.yaml``). ``catalog`` defaults to
    ``load_catalog()`` (shipped data and the user's price file).
    """
    catalog = catalog or load_catalog()
    return _breakeven.breakeven(
        catalog,
        gpu=_spec(catalog, gpu) if gpu is not None else None,
        count=count,
        system_cost_usd=system_cost_usd,
        gpu_w=gpu_w,
        cpu_w=cpu_w,
        utilization=utilization,
        electricity_usd_per_kwh=electricity_usd_per_kwh,
        cloud_usd_per_hour=cloud_usd_per_hour,
        provider=provider,
        cloud_gpu=_spec(catalog, cloud_gpu) if cloud_gpu is not None else None,
        spot=spot,
        years=years,
        resale_usd=resale_usd,
        region=region,
        price_kind=check_price_choice(price_kind),
        build_class=build_class,
        resale_per_year=resale_per_year,
    )


def value(
    gpus: Sequence[GpuRef] | None = None,
    *,
    price_kind: PriceChoice | str = "buy",
    count: int | None = None,
    reference: GpuRef | None = None,
    throughput: Mapping[str, float] | None = None,
    throughput_unit: str | None = None,
    build_class: str | None = None,
    base_system_usd: float | None = None,
    catalog: Catalog | None = None,
) -> ValueTable:
    """Performance per dollar, normalised to a reference GPU (charts-ready rows).

    ``gpus``: the GPUs to rate (default: every GPU with a price of the kind and a throughput).
    ``price_kind``: ``buy`` (the lower of the newest new and used, else launch), ``new``,
    ``used``, ``launch``, ``cloud`` (cheapest on-demand rate) or ``cloud-spot``. ``count``: rate
    machines of that many GPUs with the base system of the build class for ``count`` (or
    ``build_class`` / ``base_system_usd``); None rates the GPU alone. ``throughput``: per-GPU
    throughput of the caller's workload by GPU name or id (predicted or measured, in
    ``throughput_unit``); without it the catalog's dense AMP tensor TFLOPS stand in, and the
    table says so. ``reference``: the GPU whose value is 1.0 (default: the first of ``gpus``,
    else the best)."""
    catalog = catalog or load_catalog()
    kind = check_price_choice(price_kind)
    specs = [_spec(catalog, g) for g in gpus] if gpus else None
    if throughput_unit and not throughput:
        raise UsageError(
            "--unit is the unit of --throughput, which was not given; add --throughput GPU=N "
            "for each GPU (or drop --unit to compare the catalog's TFLOPS)."
        )
    given = None
    if throughput:
        given = {_spec(catalog, g).id: float(v) for g, v in throughput.items()}
    build = None
    if count is not None and base_system_usd is None and kind not in ("cloud", "cloud-spot"):
        build = build_class_for(count, build_class)
    return _value.value_table(
        catalog,
        specs,
        price_kind=kind,
        count=count,
        reference=_spec(catalog, reference) if reference is not None else None,
        throughput=given,
        throughput_unit=throughput_unit,
        build=build,
        base_system_usd=base_system_usd,
    )


def build_checks(
    gpu: GpuRef,
    count: int,
    *,
    build_class: str | None = None,
    psu_w: float | None = None,
    cpu_w: float | None = None,
    catalog: Catalog | None = None,
) -> BuildReport:
    """Power supply, slot width, cooling, PCIe lanes and NVLink of ``count`` x ``gpu``.

    The machine is the smallest build class holding ``count`` GPUs (or ``build_class``); its
    board layout, CPU power and reference power supply are used unless ``psu_w`` / ``cpu_w``
    are given.
    """
    catalog = catalog or load_catalog()
    spec = _spec(catalog, gpu)
    data = shipped_cost_data()
    build = build_class_for(count, build_class, data, module=spec.is_module)
    return check_build(spec, count, build, data.rules, psu_w=psu_w, cpu_w=cpu_w)


def machine_power_w(
    gpu: GpuRef,
    count: int = 1,
    *,
    cpu_w: float | None = None,
    build_class: str | None = None,
    catalog: Catalog | None = None,
) -> float:
    """Power of a machine of ``count`` x ``gpu`` while it works: board power + the CPU and rest.

    ``cpu_w`` defaults to the build class's CPU figure (the class for ``count`` GPUs).
    """
    catalog = catalog or load_catalog()
    spec = _spec(catalog, gpu)
    if spec.tdp_w is None:
        raise UsageError(f"The catalog has no board power for {spec.name}; give the watts.")
    build = build_class_for(count, build_class, module=spec.is_module)
    return count * spec.tdp_w + (build.cpu_w if cpu_w is None else cpu_w)


def job_energy(
    power_w: float,
    hours: float,
    *,
    region: str | None = None,
    electricity_usd_per_kwh: float | None = None,
    grid_gco2_per_kwh: float | None = None,
) -> JobEnergy:
    """kWh, electricity cost and CO2 of a job drawing ``power_w`` for ``hours``.

    Price and carbon intensity default to ``region``'s (default: the data's default region);
    explicit values win.
    """
    place = get_region(region)
    # the region is the answer's only where one of its figures was used
    used_region = region is not None or electricity_usd_per_kwh is None or grid_gco2_per_kwh is None
    if electricity_usd_per_kwh is None:
        electricity_usd_per_kwh = place.electricity_usd_per_kwh
    if grid_gco2_per_kwh is None:
        grid_gco2_per_kwh = place.grid_gco2_per_kwh
    if electricity_usd_per_kwh is None and grid_gco2_per_kwh is None:
        raise UsageError(
            f"The region '{place.id}' has neither an electricity price nor a carbon intensity; "
            "give --electricity or --grid-gco2."
        )
    return _job_energy(
        power_w,
        hours,
        electricity_usd_per_kwh=electricity_usd_per_kwh,
        grid_gco2_per_kwh=grid_gco2_per_kwh,
        region=place.id if used_region else None,
    )
