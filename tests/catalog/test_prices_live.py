"""Prices a buyer can act on: dated used prices of datacenter cards, the age and staleness of
every price used, and cloud rates refreshed on request from gpuhunt (recorded offers, offline)."""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from whichgpu.catalog import load_catalog
from whichgpu.catalog.freshness import (
    StalePolicy,
    parse_stale_after,
    set_stale_after,
    stale_note,
    stale_policy,
)
from whichgpu.catalog.live import (
    INSTALL_HINT,
    LivePricesError,
    RecordedOffer,
    fetch_offers,
    offers_to_prices,
    update_live_prices,
)
from whichgpu.errors import UsageError
from whichgpu.schema import Price
from whichgpu.settings import live_prices_path

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gpuhunt_offers.csv"
TODAY = dt.date(2026, 11, 27)


def _recorded() -> list[RecordedOffer]:
    lines = (line for line in FIXTURE.read_text().splitlines() if not line.startswith("#"))
    return [
        RecordedOffer(
            provider=r["provider"],
            instance_name=r["instance_name"],
            location=r["location"],
            price=float(r["price"]),
            gpu_count=int(r["gpu_count"]),
            gpu_name=r["gpu_name"] or None,
            gpu_memory=float(r["gpu_memory"]) if r["gpu_memory"] else None,
            spot=r["spot"] == "True",
        )
        for r in csv.DictReader(lines)
    ]


@pytest.fixture(autouse=True)
def _default_thresholds() -> Iterator[None]:
    set_stale_after(None)
    yield
    set_stale_after(None)


def _price(as_of: dt.date, per: str = "unit") -> Price:
    kind = "used" if per == "unit" else "cloud-on-demand"
    return Price(gpu_id="a100-sxm4-80gb", kind=kind, usd=1.0, per=per, as_of=as_of, source="x")


# --- (2) street prices of datacenter cards ---------------------------------------------------


@pytest.mark.parametrize("gpu_id", ["a100-sxm4-80gb", "a100-pcie-80gb", "l40s", "h100-pcie"])
def test_datacenter_cards_have_a_dated_sourced_purchase_price(gpu_id: str) -> None:
    catalog = load_catalog([])
    price = catalog.purchase_price(gpu_id)
    assert price is not None and price.kind in ("new", "used")
    assert price.source in catalog.sources and catalog.sources[price.source].url


def test_buy_ranking_includes_a100_and_l40s_with_dates() -> None:
    result = run_cli(
        "recommend", "bert-large", "--seq-len", "512", "--buy", "--used", "--gpu-only",
        "-g", "a100-sxm4-80gb", "-g", "a100-pcie-80gb", "-g", "l40s", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    ranked = {c["gpu"]: c for c in doc["ranking"]}
    assert set(ranked) == {"a100-sxm4-80gb", "a100-pcie-80gb", "l40s"}
    for c in ranked.values():
        assert c["price_as_of"] and c["price_as_of"] in c["price_note"]
        assert "days old" in c["price_note"]
        assert isinstance(c["price_stale"], bool)


# --- (3) age shown and judged -----------------------------------------------------------------


def test_age_and_staleness_by_kind() -> None:
    policy = StalePolicy(today=TODAY)
    old_cloud = _price(TODAY - dt.timedelta(days=91), per="hour")
    old_street = _price(TODAY - dt.timedelta(days=91))
    assert policy.is_stale(old_cloud) and not policy.is_stale(old_street)
    assert policy.age_note(old_cloud) == "91 days old, STALE (over 90)"
    assert policy.age_note(old_street) == "91 days old"
    assert StalePolicy(street_days=30, today=TODAY).is_stale(old_street)


def test_stale_after_parsing_and_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_stale_after("30") == (30, 30)
    assert parse_stale_after("30, 200") == (30, 200)
    for bad in ("soon", "-1", "1,2,3", ""):
        with pytest.raises(UsageError, match="--stale-after"):
            parse_stale_after(bad)
    monkeypatch.setenv("WHICHGPU_STALE_AFTER", "10,20")
    assert (stale_policy().cloud_days, stale_policy().street_days) == (10, 20)
    set_stale_after("5")  # the option wins over the environment
    assert stale_policy().cloud_days == 5


def test_stale_note_says_how_to_refresh() -> None:
    set_stale_after(None, today=TODAY)
    fresh, old = _price(TODAY), _price(TODAY - dt.timedelta(days=400))
    assert stale_note([fresh]) is None
    note = stale_note([fresh, old])
    assert note is not None and "whichgpu prices update" in note and "--prices" in note
    assert str(old.as_of) in note


def test_compare_shows_ages_and_the_option_moves_the_threshold() -> None:
    doc = json.loads(run_cli("compare", "a100-sxm4-80gb", "l40s", "--json").stdout)
    assert all("days old" in n for n in doc["price_notes"])
    text = run_cli("--stale-after", "0", "compare", "a100-sxm4-80gb", "l40s").stdout
    assert "STALE (over 0)" in text
    bad = run_cli("--stale-after", "soon", "compare", "l40s", "a40")
    assert bad.returncode == 2 and "--stale-after" in bad.stderr


def test_recommend_flags_stale_prices_in_table_and_assumptions() -> None:
    args = ("recommend", "bert-large", "--seq-len", "512", "--buy", "--gpu-only", "-g", "l40s")
    text = run_cli("--stale-after", "1", *args, env={"COLUMNS": "400"}).stdout
    assert "$8,000 stale" in text and "whichgpu prices update" in text
    doc = json.loads(run_cli("--stale-after", "1", *args, "--json").stdout)
    assert doc["ranking"][0]["price_stale"] is True
    assert any("whichgpu prices update" in a for a in doc["assumptions"])


# --- (1) live cloud prices from gpuhunt (recorded offers) -----------------------------------


def test_offers_map_to_catalog_ids_per_gpu_hour() -> None:
    prices, count, unmapped = offers_to_prices(_recorded(), load_catalog([]).all(), TODAY)
    assert count == 12
    by = {(p.gpu_id, p.kind, p.provider, p.region, p.instance_gpus): p for p in prices}
    p4de = by[("a100-sxm4-80gb", "cloud-on-demand", "aws", "us-east-1", (8,))]
    assert p4de.usd == pytest.approx(27.44705 / 8, abs=1e-4)
    assert p4de.as_of == TODAY and p4de.source == "gpuhunt"
    assert "p4de.24xlarge" in (p4de.note or "") and "SXM" in (p4de.note or "")
    assert ("a100-sxm4-80gb", "cloud-spot", "aws", "us-east-1", (8,)) in by
    assert by[("a10", "cloud-on-demand", "lambda", "us-east-1", (1,))].usd == 0.75
    # a rate for 2-GPU machines stays apart from the 1-GPU one
    assert by[("l40s", "cloud-on-demand", "runpod", "CA-MTL-1", (2,))].usd == 0.75
    assert by[("l40s", "cloud-on-demand", "runpod", "CA-MTL-1", (1,))].usd == 0.79
    assert ("rtx-4090", "cloud-on-demand", "runpod", "EU-RO-1", (1,)) in by
    # a 1-GPU "A100 80GB" may be PCIe or SXM; an unknown chip names nothing: both left out
    assert unmapped == ("A100 80GB", "ZZ9000 96GB")


def test_update_writes_a_dated_file_that_every_command_reads() -> None:
    path = live_prices_path()
    result = update_live_prices(path, load_catalog([]).all(), offers=_recorded(), today=TODAY)
    assert path.is_file() and result.as_of == TODAY
    assert f"fetched {TODAY}" in path.read_text().splitlines()[0]
    catalog = load_catalog([])
    aws = [p for p in catalog.prices("a100-sxm4-80gb", "cloud-on-demand") if p.provider == "aws"]
    # the provider's live rates replace its shipped ones for that GPU
    assert aws and all(p.source == "gpuhunt" and p.as_of == TODAY for p in aws)
    # other providers' shipped rates stay
    assert any(p.provider == "runpod" for p in catalog.prices("a100-sxm4-80gb"))


def test_user_price_file_wins_over_live_rates(tmp_path: Path) -> None:
    update_live_prices(live_prices_path(), load_catalog([]).all(), offers=_recorded(), today=TODAY)
    mine = tmp_path / "mine.csv"
    mine.write_text(
        "gpu_id,kind,usd,per,provider,region,as_of,source,note,instance_gpus\n"
        "a100-sxm4-80gb,cloud-on-demand,1.0,hour,aws,us-east-1,2026-11-20,contract,,8\n"
    )
    rows = [
        p
        for p in load_catalog([mine]).prices("a100-sxm4-80gb", "cloud-on-demand")
        if p.provider == "aws" and p.region == "us-east-1"
    ]
    assert [p.usd for p in rows] == [1.0]


def test_missing_extra_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gpuhunt", None)  # import gpuhunt raises ImportError
    with pytest.raises(LivePricesError, match=r"pip install 'whichgpu\[live-prices\]'"):
        fetch_offers()
    assert "live-prices" in INSTALL_HINT


def test_offline_download_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Catalog:
        def __init__(self, **_: object) -> None: ...

        def load(self) -> None:
            raise OSError("[Errno -3] Temporary failure in name resolution")

    fake = type(sys)("gpuhunt")
    fake.Catalog = _Catalog  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuhunt", fake)
    with pytest.raises(LivePricesError, match="offline"):
        fetch_offers()
    assert not live_prices_path().exists()


def test_cli_update_without_the_extra() -> None:
    result = run_cli("prices", "update", "--json")
    if result.returncode == 0:  # pragma: no cover - only where the extra is installed
        pytest.skip("gpuhunt is installed here")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["message"].count("whichgpu[live-prices]") == 1
