"""Energy, its cost and its CO2: of a job (a run of known length) or of a year of use.

::

    energy_kwh        = power_w / 1000 x hours
    energy_kwh / year = power_w / 1000 x 24 x 365 x utilization
    electricity_usd   = energy_kwh x electricity_usd_per_kwh
    co2_kg            = energy_kwh x grid_gco2_per_kwh / 1000

Power is what the machine draws while it works (GPUs at their board power plus the CPU and the
rest); idle power is not counted. Pure arithmetic: prices and carbon intensities come from the
caller or from the region data (``whichgpu.catalog.cost_data``).
"""

from __future__ import annotations

from whichgpu.cost.inputs import LONGEST_YEARS, answerable, fraction, non_negative, positive
from whichgpu.errors import UsageError
from whichgpu.schema import JobEnergy
from whichgpu.units import DAYS_PER_YEAR, HOURS_PER_DAY, grams_to_kilograms, watts_to_kilowatts


def energy_kwh(power_w: float, hours: float) -> float:
    """kWh drawn by ``power_w`` for ``hours``."""
    return watts_to_kilowatts(non_negative("The power (--watts)", power_w)) * non_negative(
        "The run time (--hours)", hours
    )


def hours_per_year(utilization: float) -> float:
    """Hours of work in a year at ``utilization`` (24 x 365 x utilization)."""
    return HOURS_PER_DAY * DAYS_PER_YEAR * fraction("The utilisation (--utilization)", utilization)


def yearly_energy_kwh(power_w: float, utilization: float) -> float:
    """kWh a year of a machine drawing ``power_w`` while it works, ``utilization`` of the time."""
    return energy_kwh(power_w, hours_per_year(utilization))


def co2_kg(kwh: float, grid_gco2_per_kwh: float) -> float:
    """kg of CO2 of ``kwh`` at a grid carbon intensity in g per kWh."""
    return grams_to_kilograms(
        kwh * non_negative("The carbon intensity (--grid-gco2)", grid_gco2_per_kwh)
    )


def job_energy(
    power_w: float,
    hours: float,
    *,
    electricity_usd_per_kwh: float | None = None,
    grid_gco2_per_kwh: float | None = None,
    region: str | None = None,
) -> JobEnergy:
    """Energy, electricity cost and CO2 of a job drawing ``power_w`` for ``hours``.

    ``recommend`` passes the predicted run time; a missing price or carbon intensity leaves that
    figure ``None``.
    """
    positive("The power (--watts)", power_w)
    positive("The run time (--hours)", hours)
    longest_h = LONGEST_YEARS * DAYS_PER_YEAR * HOURS_PER_DAY
    if hours > longest_h:
        years = hours / (DAYS_PER_YEAR * HOURS_PER_DAY)
        raise UsageError(
            f"The run time (--hours) must be at most {longest_h:,.0f} h ({LONGEST_YEARS} years, "
            f"longer than any GPU machine is kept), not {hours:g} h ({years:.3g} years)."
        )
    kwh = energy_kwh(power_w, hours)
    usd = None
    if electricity_usd_per_kwh is not None:
        # 0 is a price (power paid for by someone else), as cost breakeven takes it
        usd = kwh * non_negative("The electricity price (--electricity)", electricity_usd_per_kwh)
    co2 = None
    if grid_gco2_per_kwh is not None:
        co2 = co2_kg(kwh, non_negative("The carbon intensity (--grid-gco2)", grid_gco2_per_kwh))
    given = "the run time (--hours) and the power (--watts)"
    answerable("The energy of the job", kwh, given)
    if usd is not None:
        answerable("The electricity bill", usd, f"{given} and the price (--electricity)")
    if co2 is not None:
        answerable("The CO2 of the job", co2, f"{given} and the carbon intensity (--grid-gco2)")
    return JobEnergy(
        power_w=power_w,
        hours=hours,
        energy_kwh=kwh,
        electricity_usd_per_kwh=electricity_usd_per_kwh,
        electricity_usd=usd,
        grid_gco2_per_kwh=grid_gco2_per_kwh,
        co2_kg=co2,
        region=region,
        assumptions=(
            "The machine draws this power for the whole run (board power, not a measurement); "
            "idle time and the cooling of a data centre (PUE) are not counted.",
            "Carbon intensity is a yearly average of the grid; the hour and season move it.",
            *_unknown(usd is None, co2 is None, region),
        ),
    )


def _unknown(no_price: bool, no_grid: bool, region: str | None) -> tuple[str, ...]:
    """Say which figures are missing and how to supply them, rather than leaving them out."""
    where = f"the region '{region}'" if region else "no region"
    out = []
    if no_price:
        out.append(
            f"Electricity cost unknown: {where} has no electricity price in the data; give "
            "--electricity (USD per kWh)."
        )
    if no_grid:
        out.append(
            f"CO2 unknown: {where} has no grid carbon intensity in the data; give --grid-gco2 "
            "(g per kWh)."
        )
    return tuple(out)
