"""Cost: the guides' worked examples, perf per dollar, TCO, CO2, build checks, data, CLI.

Expected numbers come from Tim Dettmers' guides (the seeds are translations):
- "Which GPU(s) to Get for Deep Learning" (2020-09-07): (350 W + 100 W) x 0.15 x 24 h x 365 =
  591 kWh, $71 a year at $0.12/kWh; a $2,200 desktop against a $2.14/h V100 spot instance
  breaks even after about 300 days ($2,311 vs $2,270); 4 x RTX 3090 = 1,400 W, a 1,600 W PSU
  leaves about 200 W for the rest, so use more than 1,700 W; the RTX 3090 is a 3-slot card.
- "A Full Hardware Guide to Deep Learning" (2018): GPUs + CPU + 100 W, plus 10 %.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import run_cli
from whichgpu import cost
from whichgpu.catalog import load_catalog
from whichgpu.catalog.cost_data import (
    build_class_for,
    get_region,
    read_cost_data,
    shipped_cost_data,
    utilization_value,
)
from whichgpu.catalog.loader import DATA_DIR
from whichgpu.cost.build import most_that_fit, placement
from whichgpu.cost.pricing import cloud_price, price_note, resale_curve
from whichgpu.errors import CatalogError, UsageError
from whichgpu.schema import BuildCheck, BuildReport

CATALOG = load_catalog([])

# The guide's cloud-vs-desktop example, every input given (no defaults involved).
GUIDE = {
    "system_cost_usd": 2200.0,
    "gpu_w": 350.0,
    "cpu_w": 100.0,
    "utilization": 0.15,
    "electricity_usd_per_kwh": 0.12,
    "cloud_usd_per_hour": 2.14,
}
GUIDE_ARGS = (
    "cost",
    "breakeven",
    "--system-cost",
    "2200",
    "--gpu-watts",
    "350",
    "--cpu-watts",
    "100",
    "--utilization",
    "0.15",
    "--electricity",
    "0.12",
    "--cloud-rate",
    "2.14",
)


# --- the worked example ----------------------------------------------------------------------


def test_guide_energy_and_electricity_per_year() -> None:
    result = cost.breakeven(**GUIDE, catalog=CATALOG)
    assert result.energy_kwh_per_year == pytest.approx(591.3)  # the guide: 591 kWh
    assert result.electricity_usd_per_year == pytest.approx(70.956)  # the guide: $71
    assert round(result.electricity_usd_per_year) == 71
    assert result.cloud_usd_per_year == pytest.approx(2.14 * 24 * 365 * 0.15)


def test_guide_breakeven_is_about_300_days() -> None:
    result = cost.breakeven(**GUIDE, catalog=CATALOG)
    assert result.breakeven_days is not None
    # exact crossing with electricity accruing by the day: 2,200 / (7.704 - 0.1944) = 293
    assert result.breakeven_days == pytest.approx(292.96, abs=0.01)
    assert 285 <= result.breakeven_days <= 300
    assert result.breakeven_use_hours == pytest.approx(result.breakeven_days * 24 * 0.15)


def test_guide_figures_at_300_days() -> None:
    """$2,311 vs $2,270: rent for 300 days against the purchase + a whole year of power."""
    result = cost.breakeven(**GUIDE, catalog=CATALOG)
    cloud, own_by_year = cost.cumulative_costs(result, 300, electricity="yearly")
    assert cloud == pytest.approx(2311.2)
    assert round(cloud) == 2311
    assert own_by_year == pytest.approx(2270.956)
    assert abs(own_by_year - 2270) < 1.5
    _, own_by_day = cost.cumulative_costs(result, 300)
    assert own_by_day == pytest.approx(2200 + 70.956 * 300 / 365)
    assert cloud > own_by_year > own_by_day


def test_breakeven_curve_crosses_at_breakeven() -> None:
    result = cost.breakeven(**GUIDE, years=1, catalog=CATALOG)
    before = [p for p in result.curve if p.days < 292]
    after = [p for p in result.curve if p.days > 294]
    assert before and after
    assert all(p.cloud_usd < p.own_usd for p in before)
    assert all(p.cloud_usd > p.own_usd for p in after)
    assert result.curve[-1].days == pytest.approx(365)


def test_never_breaks_even_when_rent_is_cheaper_than_power() -> None:
    result = cost.compare_rent_own(
        system_cost_usd=2000,
        gpu_w=450,
        cpu_w=100,
        utilization=1.0,
        electricity_usd_per_kwh=0.5,
        cloud_usd_per_hour=0.2,
        years=3,
    )
    assert result.breakeven_days is None
    assert result.breakeven_use_hours is None
    assert result.own_tco_usd > result.cloud_tco_usd


# --- TCO and resale -------------------------------------------------------------------------


def test_tco_with_resale() -> None:
    result = cost.compare_rent_own(
        system_cost_usd=3000,
        gpu_w=450,
        cpu_w=100,
        utilization=0.5,
        electricity_usd_per_kwh=0.2,
        cloud_usd_per_hour=0.7,
        years=2,
        resale_usd=1200,
    )
    kwh = 0.55 * 24 * 365 * 0.5
    assert result.energy_kwh_per_year == pytest.approx(kwh)
    assert result.own_tco_usd == pytest.approx(3000 + 2 * kwh * 0.2 - 1200)
    assert result.cloud_tco_usd == pytest.approx(2 * 0.7 * 24 * 365 * 0.5)
    assert result.own_usd_per_year == pytest.approx(result.own_tco_usd / 2)


def test_resale_above_the_price_is_refused() -> None:
    with pytest.raises(UsageError, match="resale"):
        cost.breakeven(**GUIDE, resale_usd=5000, catalog=CATALOG)


def test_the_resale_curve_is_fitted_to_several_dated_used_prices() -> None:
    curve = resale_curve(CATALOG, "consumer")
    assert curve is not None
    assert len(curve.observations) >= 3 and len({o.gpu_id for o in curve.observations}) >= 2
    assert len({o.as_of for o in curve.observations}) >= 2  # a series, not one price
    # least squares of ln(used / new) against age, through 1 at launch
    logs = [math.log(o.used_usd / o.new_usd) for o in curve.observations]
    ages = curve.ages_years
    slope = sum(t * y for t, y in zip(ages, logs, strict=True)) / sum(t * t for t in ages)
    assert curve.retention_per_year == pytest.approx(min(1.0, math.exp(slope)))
    assert curve.retention_per_year < 0.95  # not the 99 % a year of the 4090's one used price
    described = curve.describe(CATALOG)
    assert "cost/resale.yaml" in described and "cost-techspot-used-2022-06" in described
    # too few used prices of datacenter parts (one H100 PCIe): no curve
    assert resale_curve(CATALOG, "datacenter") is None


def test_resale_observations_are_catalog_gpus_at_their_launch_price() -> None:
    for obs in shipped_cost_data().resale_observations:
        spec = CATALOG.get(obs.gpu_id)
        assert spec.launch_date is not None and obs.as_of > spec.launch_date
        if spec.launch_price_usd is not None:
            assert obs.new_usd == spec.launch_price_usd, obs
        assert obs.provenance["used_usd"].source in CATALOG.sources


def test_resale_starts_from_the_used_price_today_and_follows_the_curve() -> None:
    # the 4090 sells new ($1,900) above its used price; resale starts from the used price and
    # loses the consumer curve's share each year: not $1,550 after 3 years
    curve = resale_curve(CATALOG, "consumer")
    used = CATALOG.prices("rtx-4090", "used")[0]
    assert curve is not None
    result = cost.breakeven(gpu="rtx-4090", count=2, cloud_usd_per_hour=1.0, catalog=CATALOG)
    assert result.resale_usd == pytest.approx(2 * used.usd * curve.retention_per_year**3)
    assert result.resale_usd < 2 * used.usd * 0.8
    assert "consumer resale curve" in result.inputs["resale_usd"]
    assert any("cost/resale.yaml" in a for a in result.assumptions)


def test_the_user_sets_the_share_kept_per_year() -> None:
    result = cost.breakeven(
        gpu="rtx-3090", cloud_usd_per_hour=1.0, years=2, resale_per_year=0.5, catalog=CATALOG
    )
    used = CATALOG.prices("rtx-3090", "used")[0]
    assert result.resale_usd == pytest.approx(used.usd * 0.25)
    assert "(given)" in result.inputs["resale_usd"]
    with pytest.raises(UsageError, match="not both"):
        cost.breakeven(gpu="rtx-3090", resale_usd=100, resale_per_year=0.5, catalog=CATALOG)
    with pytest.raises(UsageError, match="--resale-per-year"):
        cost.breakeven(gpu="rtx-3090", cloud_usd_per_hour=1.0, resale_per_year=1.5)
    args = ("--gpu", "3090", "--cloud-rate", "1", "--resale-per-year", "0.5", "--years", "2")
    done = run_cli("cost", "breakeven", *args, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resale_usd"] == pytest.approx(used.usd * 0.25)


def test_no_curve_no_resale() -> None:
    # the H200 is in no resale class with two dated used prices (the H100 class now is)
    result = cost.breakeven(
        gpu="h200-sxm", system_cost_usd=40000, cloud_usd_per_hour=2.0, catalog=CATALOG
    )
    assert result.resale_usd == 0 and result.inputs["resale_usd"] == "none assumed"
    assert any("--resale-per-year" in a for a in result.assumptions)


def test_defaults_come_from_catalog_and_cost_data() -> None:
    result = cost.breakeven(gpu="rtx-4090", count=2, provider="runpod", catalog=CATALOG)
    data = read_cost_data()
    desktop = build_class_for(2, data=data)
    bought = CATALOG.purchase_price("rtx-4090")
    rent = [p for p in CATALOG.prices("rtx-4090", "cloud-on-demand") if p.provider == "runpod"]
    assert bought is not None and rent and desktop.base_system_usd is not None
    assert result.system_cost_usd == pytest.approx(2 * bought.usd + desktop.base_system_usd)
    assert result.gpu_w == 2 * 450
    assert result.cpu_w == desktop.cpu_w
    assert result.utilization == data.rules.default_utilization
    assert result.years == data.rules.default_years
    assert result.electricity_usd_per_kwh == get_region(None, data).electricity_usd_per_kwh
    assert result.cloud_usd_per_hour == pytest.approx(2 * min(p.usd for p in rent))
    assert "runpod" in result.inputs["cloud_usd_per_hour"]
    assert all(result.inputs[k] != "given" for k in ("system_cost_usd", "gpu_w", "cpu_w"))


def test_a_count_of_gpus_is_rented_only_at_rates_for_that_many_in_one_machine(
    tmp_path: Path,
) -> None:
    prices = tmp_path / "mine.csv"
    prices.write_text(
        "gpu_id,kind,usd,per,provider,region,as_of,source,note,instance_gpus\n"
        "rtx-3060-12gb,cloud-on-demand,1.00,hour,bignode,,2026-01-02,quote,,8\n"
        "rtx-3060-12gb,cloud-on-demand,2.00,hour,single,,2026-01-02,quote,,1\n"
    )
    catalog = load_catalog([prices])
    gpu = catalog.get("rtx-3060-12gb")
    assert cloud_price(catalog, gpu).provider == "single"  # one GPU: not an 8-GPU node's rate
    assert cloud_price(catalog, gpu, gpus=8).provider == "bignode"
    with pytest.raises(UsageError, match=r"4 x .* in one machine.*bignode in 8-GPU machines"):
        cloud_price(catalog, gpu, gpus=4)
    cheapest = catalog.cheapest_cloud_price(gpu.id)
    assert cheapest is not None and cheapest.usd == 1.00  # per GPU-hour, any machine size
    assert "in 8-GPU machines" in price_note(cheapest)
    one = cost.breakeven(gpu="rtx-3060-12gb", catalog=catalog)
    eight = cost.breakeven(gpu="rtx-3060-12gb", count=8, catalog=catalog)
    assert one.cloud_usd_per_hour == pytest.approx(2.00)
    assert eight.cloud_usd_per_hour == pytest.approx(8 * 1.00)
    rated = cost.value(["rtx-3060-12gb"], price_kind="cloud", count=8, catalog=catalog)
    assert rated.rows[0].usd_per_hour == pytest.approx(8 * 1.00)
    with pytest.raises(UsageError, match="for 2 GPUs in one machine"):
        cost.value(["rtx-3060-12gb"], price_kind="cloud", count=2, catalog=catalog)


def test_utilization_as_profile_or_percentage() -> None:
    assert utilization_value("15%")[0] == pytest.approx(0.15)
    assert utilization_value("company-cluster")[0] == pytest.approx(0.60)
    result = cost.breakeven(**{**GUIDE, "utilization": "phd-cluster"}, catalog=CATALOG)
    assert result.utilization == pytest.approx(0.35)
    assert "phd-cluster" in result.inputs["utilization"]
    with pytest.raises(UsageError, match="utilization"):
        utilization_value("often")


@pytest.mark.parametrize("bad", [-0.1, 0.0, 1.5])
def test_bad_utilization_is_a_usage_error(bad: float) -> None:
    with pytest.raises(UsageError, match="utilisation"):
        cost.breakeven(**{**GUIDE, "utilization": bad}, catalog=CATALOG)


def test_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(UsageError, match="lambda") as info:
        cost.breakeven(gpu="h100-sxm", provider="nosuchcloud", catalog=CATALOG)
    assert "nosuchcloud" in str(info.value)


def test_provider_without_that_gpu_names_those_with_it() -> None:
    with pytest.raises(UsageError, match="Providers that rent it"):
        cost.breakeven(gpu="b200", provider="azure", catalog=CATALOG)


# --- energy and CO2 -------------------------------------------------------------------------


def test_co2_and_cost_of_a_job() -> None:
    job = cost.job_energy(450, 100, electricity_usd_per_kwh=0.12, grid_gco2_per_kwh=366)
    assert job.energy_kwh == pytest.approx(45.0)
    assert job.electricity_usd == pytest.approx(5.4)
    assert job.co2_kg == pytest.approx(45 * 366 / 1000)


def test_job_energy_uses_the_region() -> None:
    germany = get_region("de")
    job = cost.job_energy(1000, 10, region="de")
    assert job.region == "de"
    assert germany.electricity_usd_per_kwh and germany.grid_gco2_per_kwh
    assert job.electricity_usd == pytest.approx(10 * germany.electricity_usd_per_kwh)
    assert job.co2_kg == pytest.approx(10 * germany.grid_gco2_per_kwh / 1000)
    only_carbon = cost.job_energy(1000, 10, region="fr")
    assert only_carbon.electricity_usd is None and only_carbon.co2_kg is not None
    assert any("region 'fr' has no electricity price" in a for a in only_carbon.assumptions)
    with pytest.raises(UsageError, match="run time"):
        cost.job_energy(1000, 0, region="de")
    # both figures given: no region's data was used, and the answer names none
    given = cost.job_energy(1000, 10, electricity_usd_per_kwh=0.2, grid_gco2_per_kwh=300)
    assert given.region is None and given.co2_kg == pytest.approx(3.0)
    # free power is a price, as in cost breakeven; a negative carbon intensity is not
    assert cost.job_energy(1000, 10, electricity_usd_per_kwh=0).electricity_usd == 0
    with pytest.raises(UsageError, match="carbon intensity"):
        cost.job_energy(1000, 10, grid_gco2_per_kwh=-3)


def test_machine_power_adds_the_build_class_cpu() -> None:
    assert cost.machine_power_w("rtx-3090", 1, catalog=CATALOG) == 350 + 100
    assert cost.machine_power_w("rtx-3090", 4, cpu_w=0, catalog=CATALOG) == 1400


def test_breakeven_reports_co2_per_year() -> None:
    result = cost.breakeven(**GUIDE, region="de", catalog=CATALOG)
    assert result.grid_gco2_per_kwh == get_region("de").grid_gco2_per_kwh
    assert result.co2_kg_per_year == pytest.approx(591.3 * 381 / 1000)


# --- build checks ---------------------------------------------------------------------------


def _check(report: BuildReport, name: str) -> BuildCheck:
    return next(c for c in report.checks if c.name == name)


def test_seed_psu_example_four_3090() -> None:
    """4 x 350 W = 1,400 W; a 1,600 W PSU is not enough headroom: the guide asks > 1,700 W."""
    report = cost.build_checks("rtx-3090", 4, psu_w=1600, cpu_w=100, catalog=CATALOG)
    assert report.count * (report.gpu_tdp_w or 0) == 1400
    assert report.load_w == pytest.approx(1600)
    assert report.recommended_psu_w == pytest.approx(1760)
    assert report.recommended_psu_w > 1700
    power = _check(report, "power")
    assert power.status == "warn"
    assert "1,760 W" in power.reason
    too_small = cost.build_checks("rtx-3090", 4, psu_w=1500, cpu_w=100, catalog=CATALOG)
    assert _check(too_small, "power").status == "fail"
    enough = cost.build_checks("rtx-3090", 4, psu_w=1800, cpu_w=100, catalog=CATALOG)
    assert _check(enough, "power").status == "ok"


def test_three_slot_cards_do_not_fit_four_to_a_board() -> None:
    report = cost.build_checks("rtx-3090", 4, catalog=CATALOG)
    assert report.build_class == "workstation"
    slots = _check(report, "slots")
    assert slots.status == "fail"
    assert report.gpus_that_fit is not None and report.gpus_that_fit < 4
    assert "3-slot" in slots.reason
    assert report.status == "fail"


def test_two_slot_cards_fit_and_blowers_stack() -> None:
    report = cost.build_checks("rtx-a6000", 4, catalog=CATALOG)
    assert _check(report, "slots").status == "ok"
    assert _check(report, "cooling").status == "ok"
    assert report.lanes_per_gpu == 16


def test_open_air_cards_stacked_without_gaps_are_flagged() -> None:
    report = cost.build_checks("rtx-3080-10gb", 4, catalog=CATALOG)
    assert _check(report, "slots").status == "ok"
    cooling = _check(report, "cooling")
    assert cooling.status == "warn"
    assert "stacked" in cooling.reason
    one = cost.build_checks("rtx-3080-10gb", 1, catalog=CATALOG)
    assert _check(one, "cooling").status == "ok"


def test_a_unit_without_throughputs_is_refused() -> None:
    with pytest.raises(UsageError, match="--unit is the unit of --throughput"):
        cost.value(["4090", "3090"], throughput_unit="tokens/s", catalog=CATALOG)


def test_a_horizon_past_any_machines_life_is_refused() -> None:
    result = run_cli("cost", "breakeven", "--gpu", "4090", "--years", "1000")
    assert result.returncode == 2 and "at most 30 years" in result.stderr


def test_what_cannot_be_built_into_a_machine_is_refused() -> None:
    with pytest.raises(UsageError, match="rents it in its cloud only"):
        cost.build_checks("tpu-v5e", 4, catalog=CATALOG)
    with pytest.raises(UsageError, match="system on a chip"):
        cost.build_checks("apple-m4-max", 2, catalog=CATALOG)
    with pytest.raises(UsageError, match="--psu-watts must be a number of watts above 0"):
        cost.build_checks("rtx-4090", 2, psu_w=-1, catalog=CATALOG)


def test_nvlink_bridges_pair_pcie_cards() -> None:
    pair = _check(cost.build_checks("rtx-3090", 2, catalog=CATALOG), "nvlink")
    assert "bridge joins the two cards" in pair.reason
    four = _check(cost.build_checks("rtx-3090", 4, catalog=CATALOG), "nvlink")
    assert "in pairs only" in four.reason and "over PCIe" in four.reason


def test_modules_and_passive_cards() -> None:
    # an 8-GPU HGX board is the standard machine for SXM modules: a server, all checks pass
    sxm = cost.build_checks("h100-sxm", 8, catalog=CATALOG)
    assert sxm.build_class == "server" and sxm.status == "ok"
    assert "baseboard" in _check(sxm, "slots").reason
    assert "NVSwitch" in _check(sxm, "nvlink").reason
    assert cost.build_checks("h100-sxm", 2, catalog=CATALOG).build_class == "server"
    # ... and it has no slot in a desktop
    desk = cost.build_checks("h100-sxm", 2, build_class="desktop", catalog=CATALOG)
    assert _check(desk, "slots").status == "fail" and "module" in _check(desk, "slots").reason
    # breakeven prices one module in the same server class recommend does, with its CPU power
    alone = cost.breakeven(gpu="h100-sxm", catalog=CATALOG)
    server = next(b for b in shipped_cost_data().build_classes if b.id == "server")
    assert server.base_system_usd is not None
    # the module's purchase price is the catalog's default one: the used H100 SXM price, below
    # the new one
    module = CATALOG.purchase_price("h100-sxm")
    assert module is not None and module.kind == "used"
    assert alone.system_cost_usd == pytest.approx(module.usd + server.base_system_usd)
    assert "server base system" in alone.inputs["system_cost_usd"]
    assert alone.cpu_w == server.cpu_w
    assert cost.machine_power_w("h100-sxm", catalog=CATALOG) == 700 + server.cpu_w
    desktop_passive = cost.build_checks("a100-pcie-80gb", 2, catalog=CATALOG)
    assert _check(desktop_passive, "cooling").status == "warn"
    server = cost.build_checks("a100-pcie-80gb", 8, catalog=CATALOG)
    assert server.build_class == "server"
    assert _check(server, "cooling").status == "ok"


def test_pcie_lanes_per_gpu() -> None:
    two = cost.build_checks("rtx-4090", 2, build_class="desktop", catalog=CATALOG)
    assert two.lanes_per_gpu == 8
    assert _check(two, "pcie").status == "ok"


def test_placement_spreads_cards_and_respects_the_case() -> None:
    assert placement(3, [0, 2, 4, 6], 8, 2) == (0, 4)  # a free slot between the two
    assert placement(3, [0, 2, 4, 6], 8, 3) is None
    assert most_that_fit(3, list(range(7)), 8) == 2
    assert most_that_fit(2, list(range(7)), 8) == 4


def test_build_count_beyond_the_largest_class() -> None:
    with pytest.raises(UsageError, match="more than one machine"):
        cost.build_checks("rtx-4090", 9, catalog=CATALOG)


# --- performance per dollar -----------------------------------------------------------------


def test_value_normalises_to_the_reference() -> None:
    table = cost.value(
        ["rtx-3080-10gb", "rtx-3090", "rtx-4090"],
        price_kind="launch",
        reference="rtx-3080-10gb",
        catalog=CATALOG,
    )
    assert table.reference == "rtx-3080-10gb"
    by_id = {r.gpu: r for r in table.rows}
    ref = by_id["rtx-3080-10gb"]
    assert ref.relative == pytest.approx(1.0)
    for row in table.rows:
        spec = CATALOG.get(row.gpu)
        assert row.throughput_source == "proxy"
        assert row.throughput == spec.amp_tensor_tflops
        assert row.total_usd == spec.launch_price_usd
        assert row.throughput_per_kusd == pytest.approx(row.throughput / (row.total_usd / 1000))
        assert row.relative == pytest.approx(row.throughput_per_kusd / ref.throughput_per_kusd)
    assert [r.relative for r in table.rows] == sorted(
        (r.relative for r in table.rows), reverse=True
    )
    assert any("proxy" in a for a in table.assumptions)


def test_value_of_machines_adds_the_base_system() -> None:
    table = cost.value(["rtx-4090", "rtx-3090"], count=4, catalog=CATALOG)
    base = build_class_for(4).base_system_usd
    assert table.build_class == "workstation" and table.base_system_usd == base
    for row in table.rows:
        assert base is not None
        assert row.total_usd == pytest.approx(4 * row.gpu_price_usd + base)
        assert row.throughput == pytest.approx(4 * row.throughput_per_gpu)
    # a base cost makes the dearer, faster GPU relatively better than alone
    alone = cost.value(["rtx-4090", "rtx-3090"], reference="rtx-3090", catalog=CATALOG)
    machine = cost.value(["rtx-4090", "rtx-3090"], count=4, reference="rtx-3090", catalog=CATALOG)
    rel = {t: {r.gpu: r.relative for r in tab.rows} for t, tab in (("a", alone), ("m", machine))}
    assert rel["m"]["rtx-4090"] > rel["a"]["rtx-4090"]


def test_value_of_rented_gpus_per_million_units() -> None:
    table = cost.value(
        price_kind="cloud",
        throughput={"h100-sxm": 3000.0, "a100-sxm4-80gb": 1500.0},
        throughput_unit="tokens/s",
        catalog=CATALOG,
    )
    assert {r.gpu for r in table.rows} == {"h100-sxm", "a100-sxm4-80gb"}
    for row in table.rows:
        rate = CATALOG.cheapest_cloud_price(row.gpu)
        assert rate is not None and row.usd_per_hour == rate.usd
        per_hour = row.throughput * 3600
        assert row.usd_per_million_units == pytest.approx(rate.usd / per_hour * 1e6)
        assert row.throughput_source == "given" and row.throughput_unit == "tokens/s"
    best = table.rows[0]
    assert best.relative == pytest.approx(1.0) and table.reference == best.gpu


def test_value_skips_what_it_cannot_rate() -> None:
    table = cost.value(["h100-sxm", "rtx-4090"], count=2, catalog=CATALOG)
    assert [r.gpu for r in table.rows] == ["rtx-4090"]
    assert any(s.startswith("h100-sxm:") for s in table.skipped)


# --- data -----------------------------------------------------------------------------------


def test_shipped_cost_data_is_sourced() -> None:
    data = read_cost_data()
    sources = CATALOG.sources
    assert [c.gpus for c in data.build_classes] == sorted(c.gpus for c in data.build_classes)
    for count in (1, 2, 4, 8):
        assert build_class_for(count, data=data).gpus >= count
    for prov in data.provenance:
        assert sources[prov.source].url.startswith("https://"), prov
        if prov.confidence.value == "derived":
            assert prov.method, prov
    assert all(c.base_system_usd for c in data.build_classes)
    assert get_region(None, data).electricity_usd_per_kwh is not None


def _copy_data(tmp_path: Path) -> Path:
    target = tmp_path / "v1"
    shutil.copytree(DATA_DIR, target, ignore=shutil.ignore_patterns("gpus", "prices", "stacks"))
    return target


def _edit(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


def test_bad_region_value_names_file_record_and_field(tmp_path: Path) -> None:
    data_dir = _copy_data(tmp_path)

    def negative(doc: dict[str, Any]) -> None:
        doc["regions"][0]["electricity_usd_per_kwh"]["value"] = -1

    _edit(data_dir / "cost" / "regions.yaml", negative)
    with pytest.raises(CatalogError) as info:
        read_cost_data(data_dir)
    message = str(info.value)
    assert "regions.yaml" in message and "region 'us'" in message
    assert "electricity_usd_per_kwh" in message


def test_unsourced_or_unknown_fields_are_rejected(tmp_path: Path) -> None:
    data_dir = _copy_data(tmp_path)
    builds = data_dir / "cost" / "builds.yaml"

    def bad_source(doc: dict[str, Any]) -> None:
        doc["build_classes"][0]["cpu_w"]["source"] = "no-such-source"

    _edit(builds, bad_source)
    with pytest.raises(CatalogError, match=r"builds\.yaml: build class 'desktop', field 'cpu_w'"):
        read_cost_data(data_dir)

    data_dir = _copy_data(tmp_path / "again")

    def unknown(doc: dict[str, Any]) -> None:
        doc["build_classes"][1]["colour"] = "red"

    _edit(data_dir / "cost" / "builds.yaml", unknown)
    with pytest.raises(CatalogError, match=r"build class 'workstation': unknown fields"):
        read_cost_data(data_dir)


def test_missing_rule_and_layout_errors(tmp_path: Path) -> None:
    data_dir = _copy_data(tmp_path)

    def drop_rule(doc: dict[str, Any]) -> None:
        del doc["rules"]["psu_margin_fraction"]

    _edit(data_dir / "cost" / "builds.yaml", drop_rule)
    with pytest.raises(CatalogError, match=r"rules, field 'psu_margin_fraction': missing"):
        read_cost_data(data_dir)

    data_dir = _copy_data(tmp_path / "again")

    def overflow(doc: dict[str, Any]) -> None:
        doc["build_classes"][0]["expansion_slots"]["value"] = 2

    _edit(data_dir / "cost" / "builds.yaml", overflow)
    with pytest.raises(CatalogError, match=r"'desktop', field 'expansion_slots'"):
        read_cost_data(data_dir)


# --- command line ---------------------------------------------------------------------------


def test_cli_guide_example_json() -> None:
    result = run_cli(*GUIDE_ARGS, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # stdout is exactly one JSON document
    required = {
        "energy_kwh_per_year",
        "electricity_usd_per_year",
        "breakeven_days",
        "cloud_usd_per_year",
        "own_usd_per_year",
        "schema_version",
    }
    assert required <= set(doc)
    assert doc["energy_kwh_per_year"] == pytest.approx(591.3)
    assert doc["electricity_usd_per_year"] == pytest.approx(70.956)
    assert doc["breakeven_days"] == pytest.approx(292.96, abs=0.01)


def test_cli_guide_example_table_and_help() -> None:
    result = run_cli(*GUIDE_ARGS)
    assert result.returncode == 0, result.stderr
    assert "591.3 kWh" in result.stdout and "$70.96" in result.stdout
    assert "after 293 days" in result.stdout
    helped = run_cli("cost", "breakeven", "--help", env={"COLUMNS": "400"})
    assert helped.returncode == 0
    assert " ".join(GUIDE_ARGS[2:]) in " ".join(helped.stdout.split())


def test_cli_build_and_value_json() -> None:
    build = run_cli("cost", "build", "--gpu", "3090", "--count", "4", "--json")
    assert build.returncode == 0, build.stderr
    doc = json.loads(build.stdout)
    assert doc["status"] == "fail" and len(doc["checks"]) == 5
    assert {c["name"] for c in doc["checks"]} == {"power", "slots", "cooling", "pcie", "nvlink"}
    value = run_cli(
        "cost", "value", "-g", "4090", "-g", "3090", "--count", "2", "--reference", "3090", "--json"
    )
    assert value.returncode == 0, value.stderr
    table = json.loads(value.stdout)
    assert table["reference"] == "rtx-3090" and table["count"] == 2
    assert {"gpu", "relative", "total_usd", "throughput_per_kusd"} <= set(table["rows"][0])


def test_cli_energy_json() -> None:
    result = run_cli(
        "cost", "energy", "--watts", "450", "--hours", "100", "--region", "de", "--json"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["energy_kwh"] == pytest.approx(45.0) and doc["co2_kg"] is not None
    both = run_cli("cost", "energy", "--watts", "300", "--gpu", "4090", "--hours", "10")
    assert both.returncode == 2 and "not both" in both.stderr
    assert "Traceback" not in both.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--utilization", "-0.1"), "utilisation"),
        (("--provider", "nosuchcloud", "--gpu", "h100-sxm"), "nosuchcloud"),
        (("--gpu", "nosuchgpu9000"), "Unknown GPU"),
    ],
)
def test_cli_bad_input_exits_2_without_traceback(args: tuple[str, ...], words: str) -> None:
    base = list(GUIDE_ARGS[:-2]) if "--utilization" in args else ["cost", "breakeven"]
    result = run_cli(*base, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_cost_works_without_torch() -> None:
    program = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import whichgpu.cost, whichgpu.cli.cost, whichgpu.report.cost\n"
        "from whichgpu.cli import main\n"
        f"assert main({[*GUIDE_ARGS, '--json']!r}) == 0\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert math.isclose(json.loads(result.stdout)["energy_kwh_per_year"], 591.3)


def test_amp_rate_of_a_gpu_without_tensor_cores_is_its_fp32_rate() -> None:
    for gpu_id in ("gtx-1080-ti", "gtx-1660-ti"):
        spec = CATALOG.get(gpu_id)
        assert spec.fp16_tensor_tflops is None and spec.fp16_tflops is not None
        assert spec.amp_tensor_tflops == spec.fp32_tflops
    ampere = CATALOG.get("rtx-3090")
    assert ampere.amp_tensor_tflops == ampere.fp16_tensor_tflops


def test_a_job_longer_than_a_machine_lives_or_an_answer_beyond_1e18_is_refused() -> None:
    # 1e17 hours passed the CLI's 1e18 input check and printed a bill of $8.8e15
    done = run_cli("cost", "energy", "--hours", "1e17", "--gpu", "4090", "--json")
    assert done.returncode == 2
    assert "at most 262,800 h (30 years" in json.loads(done.stdout)["error"]["message"]
    with pytest.raises(UsageError, match="beyond the largest number"):
        cost.job_energy(1e18, 1e5)
    with pytest.raises(UsageError, match="beyond the largest number"):
        cost.breakeven(**{**GUIDE, "cloud_usd_per_hour": 1e17}, catalog=CATALOG)
