"""Cloud against own hardware: yearly costs, the break-even day, and the cost of N years.

::

    power_w                  = gpu_w + cpu_w
    energy_kwh_per_year      = power_w / 1000 x 24 x 365 x utilization
    electricity_usd_per_year = energy_kwh_per_year x electricity_usd_per_kwh
    cloud_usd_per_year       = cloud_usd_per_hour x 24 x 365 x utilization
    breakeven_days           = 365 x system_cost_usd
                               / (cloud_usd_per_year - electricity_usd_per_year)
    own_tco_usd              = system_cost_usd + electricity_usd_per_year x years - resale_usd
    cloud_tco_usd            = cloud_usd_per_year x years
    own_usd_per_year         = own_tco_usd / years

The break-even day is where the rent paid so far equals the purchase plus the electricity used
so far, electricity accruing day by day. Tim Dettmers' 2020 example (350 W + 100 W, 15 %,
$0.12/kWh, $2,200 against $2.14/h) gives 591.3 kWh and $70.96 a year and a crossing on day
293; the guide's "about 300 days ($2,311 vs $2,270)" are the rent for 300 days (2,311.20) against
the purchase plus the first whole year of electricity (2,270.96): ``cumulative_costs`` with
``electricity="yearly"`` gives both.

``breakeven`` fills the inputs a user leaves out from the catalog (GPU prices, board power,
cloud rates, the build class's base system) and the cost data (region, rules of thumb), and
says where each came from in ``Breakeven.inputs``.
"""

from __future__ import annotations

import math
from typing import Literal

from whichgpu.catalog.cost_data import (
    build_class_for,
    get_region,
    shipped_cost_data,
    utilization_value,
)
from whichgpu.catalog.query import Catalog
from whichgpu.cost.base_system import base_system_cost
from whichgpu.cost.energy import co2_kg, hours_per_year, yearly_energy_kwh
from whichgpu.cost.inputs import (
    answerable,
    fraction,
    non_negative,
    ownership_years,
    positive,
)
from whichgpu.cost.pricing import (
    MIN_CLASS_OBSERVATIONS,
    PriceChoice,
    cloud_price,
    price_note,
    purchase_price,
    resale_class,
    resale_class_curve,
    resale_curve,
)
from whichgpu.errors import UsageError
from whichgpu.schema import Breakeven, CostPoint, GpuSpec, Price
from whichgpu.units import DAYS_PER_YEAR, HOURS_PER_DAY

MONTHS_PER_YEAR = 12
"""Points per year of the break-even curve."""

ElectricityBilling = Literal["daily", "yearly"]
"""How electricity is counted in cumulative costs: accrued by the day, or each started year in
full (the guide's $2,270)."""


def cumulative_costs(
    result: Breakeven, days: float, *, electricity: ElectricityBilling = "daily"
) -> tuple[float, float]:
    """(rent paid, purchase + electricity) after ``days``, without resale."""
    non_negative("The days", days)
    cloud = result.cloud_usd_per_year * days / DAYS_PER_YEAR
    if electricity == "daily":
        years_of_power = days / DAYS_PER_YEAR
    else:
        years_of_power = float(math.ceil(days / DAYS_PER_YEAR))
    own = result.system_cost_usd + result.electricity_usd_per_year * years_of_power
    return cloud, own


def compare_rent_own(
    *,
    system_cost_usd: float,
    gpu_w: float,
    cpu_w: float,
    utilization: float,
    electricity_usd_per_kwh: float,
    cloud_usd_per_hour: float,
    years: float,
    resale_usd: float = 0.0,
    grid_gco2_per_kwh: float | None = None,
    inputs: dict[str, str] | None = None,
    assumptions: tuple[str, ...] = (),
) -> Breakeven:
    """Renting against owning, from explicit numbers (the formulas of the module docstring)."""
    positive("The system cost (--system-cost)", system_cost_usd)
    non_negative("The GPU power (--gpu-watts)", gpu_w)
    non_negative("The CPU power (--cpu-watts)", cpu_w)
    fraction("The utilisation (--utilization)", utilization)
    non_negative("The electricity price (--electricity)", electricity_usd_per_kwh)
    positive("The cloud rate (--cloud-rate)", cloud_usd_per_hour)
    ownership_years("The years (--years)", years)
    non_negative("The resale value (--resale-usd)", resale_usd)
    if resale_usd > system_cost_usd:
        raise UsageError(
            f"The resale value ({resale_usd:,.0f}) is more than the system cost "
            f"({system_cost_usd:,.0f})."
        )
    energy = yearly_energy_kwh(gpu_w + cpu_w, utilization)
    electricity = energy * electricity_usd_per_kwh
    cloud = cloud_usd_per_hour * hours_per_year(utilization)
    days: float | None = None
    use_hours: float | None = None
    if cloud > electricity:
        days = system_cost_usd / (cloud - electricity) * DAYS_PER_YEAR
        use_hours = days * HOURS_PER_DAY * utilization
    own_tco = system_cost_usd + electricity * years - resale_usd
    cloud_tco = cloud * years
    given = "the prices and the power given (--system-cost, --cloud-rate, --electricity, watts)"
    for label, figure in (
        ("The cost of owning", system_cost_usd + electricity * years),
        ("The cost of renting", cloud_tco),
        ("The energy per year", energy),
    ):
        answerable(label, figure, given)
    steps = max(1, math.ceil(years * MONTHS_PER_YEAR))
    curve = []
    for step in range(steps + 1):
        day = min(step * DAYS_PER_YEAR / MONTHS_PER_YEAR, years * DAYS_PER_YEAR)
        curve.append(
            CostPoint(
                days=day,
                cloud_usd=cloud * day / DAYS_PER_YEAR,
                own_usd=system_cost_usd + electricity * day / DAYS_PER_YEAR,
            )
        )
    return Breakeven(
        system_cost_usd=system_cost_usd,
        gpu_w=gpu_w,
        cpu_w=cpu_w,
        utilization=utilization,
        electricity_usd_per_kwh=electricity_usd_per_kwh,
        cloud_usd_per_hour=cloud_usd_per_hour,
        years=years,
        resale_usd=resale_usd,
        energy_kwh_per_year=energy,
        electricity_usd_per_year=electricity,
        cloud_usd_per_year=cloud,
        own_usd_per_year=own_tco / years,
        breakeven_days=days,
        breakeven_use_hours=use_hours,
        own_tco_usd=own_tco,
        cloud_tco_usd=cloud_tco,
        grid_gco2_per_kwh=grid_gco2_per_kwh,
        co2_kg_per_year=co2_kg(energy, grid_gco2_per_kwh)
        if grid_gco2_per_kwh is not None
        else None,
        curve=tuple(curve),
        inputs=dict(inputs or {}),
        assumptions=assumptions,
    )


_BASE_ASSUMPTIONS = (
    "The rented capacity works exactly the hours the machine does (utilization of the year) "
    "and is as fast as it; rent is paid only for those hours.",
    "Electricity is counted while the machine works, at the GPUs' board power plus the CPU "
    "figure; idle power, cooling and the cloud's storage and traffic are left out.",
    "Break-even: the day on which the rent paid equals the purchase plus the electricity used, "
    "electricity accruing day by day; resale is counted only in the N-year totals.",
)


def breakeven(
    catalog: Catalog,
    *,
    gpu: GpuSpec | None = None,
    count: int = 1,
    system_cost_usd: float | None = None,
    gpu_w: float | None = None,
    cpu_w: float | None = None,
    utilization: float | str | None = None,
    electricity_usd_per_kwh: float | None = None,
    cloud_usd_per_hour: float | None = None,
    provider: str | None = None,
    cloud_gpu: GpuSpec | None = None,
    spot: bool = False,
    years: float | None = None,
    resale_usd: float | None = None,
    region: str | None = None,
    price_kind: PriceChoice = "buy",
    build_class: str | None = None,
    resale_per_year: float | None = None,
) -> Breakeven:
    """Renting against owning, every input not given filled in from the catalog and cost data.

    ``gpu`` (with ``count``) prices the machine (GPUs at ``price_kind`` + the build class's base
    system), gives its GPU power (board power) and, with ``provider`` or ``cloud_gpu``, the
    rent. ``utilization`` may be a fraction, a percentage (``"15%"``) or a profile id
    (``phd-desktop``). Resale: ``resale_usd``, else the GPUs' value after ``years`` at
    ``resale_per_year`` (else the segment's resale curve, ``pricing.resale_curve``). Explicit
    numbers always win. ``Breakeven.inputs`` says where each value
    came from.
    """
    data = shipped_cost_data()
    rules = data.rules
    if count < 1:
        raise UsageError(f"count must be at least 1, not {count}.")
    if cloud_usd_per_hour is not None and (provider is not None or cloud_gpu is not None):
        raise UsageError(
            "Give either the cloud rate (--cloud-rate) or where to read it (--provider, "
            "--cloud-gpu), not both."
        )
    utilization_from = "given"
    if isinstance(utilization, str):
        utilization, utilization_from = utilization_value(utilization, data)
    _check_given(
        system_cost_usd, gpu_w, cpu_w, utilization, electricity_usd_per_kwh, years, resale_usd
    )
    if resale_per_year is not None:
        if resale_usd is not None:
            raise UsageError(
                "Give either the resale value (--resale-usd) or the share kept per year "
                "(--resale-per-year), not both."
            )
        fraction("The share of value kept per year (--resale-per-year)", resale_per_year)
    if cloud_usd_per_hour is not None:
        positive("The cloud rate (--cloud-rate)", cloud_usd_per_hour)
    place = get_region(region, data)
    build = build_class_for(count, build_class, data, module=gpu is not None and gpu.is_module)
    inputs: dict[str, str] = {}
    assumptions = list(_BASE_ASSUMPTIONS)
    gpu_price = None

    if system_cost_usd is None:
        if gpu is None:
            raise UsageError(
                "Give the machine's price (--system-cost) or its GPU (--gpu) to price it from "
                "the catalog."
            )
        gpu_price = purchase_price(catalog, gpu.id, price_kind)
        if gpu_price is None:
            raise UsageError(
                f"No {price_kind} price for {gpu.name} in the catalog; give --system-cost or "
                "another --price-kind."
            )
        base = base_system_cost(gpu, count, build, data.rules)
        if base is None:
            raise UsageError(
                f"The {build.id} class has no sourced base-system price; give --system-cost."
            )
        system_cost_usd = count * gpu_price.usd + base.usd
        if gpu.is_module and gpu.form_factor is not None:
            assumptions.append(
                f"{gpu.name} is a {gpu.form_factor.value.upper()} module sold inside vendor "
                f"servers: priced with the {build.id} class's base system, a rough stand-in for "
                "such a server; give --system-cost for a quote."
            )
        inputs["system_cost_usd"] = f"{count} x {gpu.id} at {price_note(gpu_price)} + " + (
            base.describe()
        )
    else:
        inputs["system_cost_usd"] = "given"

    if gpu_w is None:
        if gpu is None or gpu.tdp_w is None:
            raise UsageError(
                "Give the GPUs' power (--gpu-watts) or a GPU whose board power is in the "
                "catalog (--gpu)."
            )
        gpu_w = count * gpu.tdp_w
        inputs["gpu_w"] = f"{count} x {gpu.id} board power {gpu.tdp_w:g} W ({_source(gpu)})"
    else:
        inputs["gpu_w"] = "given"

    if cpu_w is None:
        cpu_w = build.cpu_w
        inputs["cpu_w"] = f"{build.id} build class ({build.provenance['cpu_w'].source})"
    else:
        inputs["cpu_w"] = "given"

    if utilization is None:
        utilization = rules.default_utilization
        inputs["utilization"] = f"default ({rules.provenance['default_utilization'].source})"
    else:
        inputs["utilization"] = utilization_from

    if electricity_usd_per_kwh is None:
        if place.electricity_usd_per_kwh is None:
            raise UsageError(
                f"The region '{place.id}' has no electricity price in the data; give "
                "--electricity (USD per kWh)."
            )
        electricity_usd_per_kwh = place.electricity_usd_per_kwh
        inputs["electricity_usd_per_kwh"] = (
            f"region {place.id} ({place.provenance['electricity_usd_per_kwh'].source})"
        )
    else:
        inputs["electricity_usd_per_kwh"] = "given"

    if cloud_usd_per_hour is None:
        rented = cloud_gpu or gpu
        if rented is None:
            raise UsageError(
                "Give the cloud rate (--cloud-rate, USD per hour) or a GPU to read it from the "
                "catalog (--gpu, --cloud-gpu, --provider)."
            )
        rate = cloud_price(catalog, rented, provider, spot=spot, gpus=count)
        cloud_usd_per_hour = count * rate.usd
        inputs["cloud_usd_per_hour"] = f"{count} x {rented.id} at {price_note(rate)}"
        if rented is not gpu and gpu is not None:
            assumptions.append(
                f"One rented {rented.name} is taken to do the work of one {gpu.name}."
            )
    else:
        inputs["cloud_usd_per_hour"] = "given"

    if years is None:
        years = rules.default_years
        inputs["years"] = f"default ({rules.provenance['default_years'].source})"
    else:
        inputs["years"] = "given"

    if resale_usd is None:
        resale_usd = _resale(
            catalog,
            gpu,
            count,
            years,
            gpu_price or (purchase_price(catalog, gpu.id, price_kind) if gpu else None),
            resale_per_year,
            system_cost_usd,
            inputs,
            assumptions,
        )
    else:
        inputs["resale_usd"] = "given"

    grid = place.grid_gco2_per_kwh
    if grid is not None:
        inputs["grid_gco2_per_kwh"] = (
            f"region {place.id} ({place.provenance['grid_gco2_per_kwh'].source})"
        )
    return compare_rent_own(
        system_cost_usd=system_cost_usd,
        gpu_w=gpu_w,
        cpu_w=cpu_w,
        utilization=utilization,
        electricity_usd_per_kwh=electricity_usd_per_kwh,
        cloud_usd_per_hour=cloud_usd_per_hour,
        years=years,
        resale_usd=resale_usd,
        grid_gco2_per_kwh=grid,
        inputs=inputs,
        assumptions=tuple(assumptions),
    )


def _resale(
    catalog: Catalog,
    gpu: GpuSpec | None,
    count: int,
    years: float,
    paid: Price | None,
    per_year: float | None,
    system_cost_usd: float,
    inputs: dict[str, str],
    assumptions: list[str],
) -> float:
    """The GPUs' value after ``years``: from what a used one sells for today (never more than
    was paid), else the price paid, times the share kept per year (``per_year``, else the
    segment's resale curve) to the power ``years``; records how in ``inputs``/``assumptions``."""
    if gpu is None or paid is None:
        why = "no GPU given to derive it from" if gpu is None else f"no price of {gpu.name}"
        inputs["resale_usd"] = "none assumed"
        assumptions.append(f"Resale: none assumed ({why}); give --resale-usd.")
        return 0.0
    if per_year is not None:
        kept, curve_note, how = per_year, "given", f"{per_year:.1%} kept per year (given)"
    else:
        klass = resale_class(gpu.id)
        if klass is not None:
            curve = resale_class_curve(catalog, klass)
            what = (
                f"fewer than {MIN_CLASS_OBSERVATIONS} dated used prices of {klass}-class "
                "GPUs, which are valued by class, not pooled with other datacenter parts"
            )
        else:
            curve = resale_curve(catalog, gpu.segment.value)
            what = f"too few dated used prices of {gpu.segment.value} GPUs for a resale curve"
        if curve is None:
            inputs["resale_usd"] = "none assumed"
            assumptions.append(
                f"Resale: none assumed (the cost data has {what}); give --resale-per-year or "
                "--resale-usd."
            )
            return 0.0
        kept, curve_note = curve.retention_per_year, f"{curve.segment} resale curve"
        how = curve.describe(catalog)
    used = catalog.prices(gpu.id, "used")
    start, start_note = paid.usd, "paid"
    if used and used[0].usd < paid.usd:
        start = used[0].usd
        start_note = f"used today, {used[0].as_of}, {used[0].source}"
    each: float = start * kept**years
    inputs["resale_usd"] = (
        f"{count} x ${start:,.0f} ({start_note}) x {kept:.3f}^{years:g} ({curve_note})"
    )
    assumptions.append(
        f"Resale: {how}; the GPUs start from "
        + (
            f"what a used {gpu.name} sells for today (${start:,.0f}), not the ${paid.usd:,.0f} paid"
            if start < paid.usd
            else f"the ${paid.usd:,.0f} paid"
        )
        + "; the rest of the machine is assumed to sell for nothing. Set the share with "
        "--resale-per-year or the value with --resale-usd."
    )
    return min(count * each, system_cost_usd)


def _check_given(
    system_cost_usd: float | None,
    gpu_w: float | None,
    cpu_w: float | None,
    utilization: float | None,
    electricity_usd_per_kwh: float | None,
    years: float | None,
    resale_usd: float | None,
) -> None:
    """Refuse a bad number the user gave before anything is looked up."""
    if system_cost_usd is not None:
        positive("The system cost (--system-cost)", system_cost_usd)
    if gpu_w is not None:
        non_negative("The GPU power (--gpu-watts)", gpu_w)
    if cpu_w is not None:
        non_negative("The CPU power (--cpu-watts)", cpu_w)
    if utilization is not None:
        fraction("The utilisation (--utilization)", utilization)
    if electricity_usd_per_kwh is not None:
        non_negative("The electricity price (--electricity)", electricity_usd_per_kwh)
    if years is not None:
        ownership_years("The years (--years)", years)
    if resale_usd is not None:
        non_negative("The resale value (--resale-usd)", resale_usd)


def _source(spec: GpuSpec) -> str:
    prov = spec.provenance.get("tdp_w")
    return prov.source if prov else "catalog"
