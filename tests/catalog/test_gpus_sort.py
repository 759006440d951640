"""``whichgpu gpus --sort``: the price keys (price, rent, freshness), the named spec keys, and a
bad key's error — in the library and at the command line."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from whichgpu.catalog import load_catalog, sort_gpus
from whichgpu.catalog.sorting import NAMED_KEYS, parse_sort_key, sort_listing
from whichgpu.errors import UsageError

CATALOG = load_catalog([])


def test_named_keys_parse_to_what_they_sort_by() -> None:
    assert parse_sort_key("memory").field == "memory_gb"
    assert parse_sort_key("Price").basis == "buy"
    assert parse_sort_key(" rent ").basis == "rent"
    assert parse_sort_key("freshness").basis == "freshness"
    assert parse_sort_key("tdp_w").field == "tdp_w"  # any spec field still works


@pytest.mark.parametrize("bad", ["colour", "cheapest", "notes", ""])
def test_bad_key_says_what_was_wrong_and_lists_the_keys(bad: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_sort_key(bad)
    message = str(caught.value)
    assert f"Cannot sort by '{bad}'" in message
    for key in NAMED_KEYS:
        assert key in message
    assert caught.value.field == "sort"


def test_price_puts_the_cheapest_buy_price_first_and_unpriced_last() -> None:
    listing = sort_listing(CATALOG.all(), parse_sort_key("price"), CATALOG)
    prices = [row.price for row in listing]
    priced = [p.usd for p in prices if p is not None]
    assert len(priced) >= 30 and priced == sorted(priced)
    first_unpriced = next(i for i, p in enumerate(prices) if p is None)
    assert all(p is None for p in prices[first_unpriced:])
    for row in listing[:first_unpriced]:  # the price shown is the one compare buys at
        assert row.price == CATALOG.purchase_price(row.spec.id)


def test_rent_orders_by_the_cheapest_on_demand_rate() -> None:
    listing = sort_listing(CATALOG.all(), parse_sort_key("rent"), CATALOG)
    rates = [row.price for row in listing if row.price is not None]
    assert rates and all(p.kind == "cloud-on-demand" and p.per == "hour" for p in rates)
    assert [p.usd for p in rates] == sorted(p.usd for p in rates)


def test_freshness_puts_the_most_recent_observed_price_first() -> None:
    listing = sort_listing(CATALOG.all(), parse_sort_key("freshness"), CATALOG)
    dates = [row.price.as_of for row in listing if row.price is not None]
    assert dates == sorted(dates, reverse=True)
    assert all(row.price is None or row.price.kind != "launch" for row in listing)
    for row in listing:  # the newest of the GPU's own street and cloud prices
        if row.price is not None:
            observed = [p.as_of for p in CATALOG.prices(row.spec.id) if p.kind != "launch"]
            assert row.price.as_of == max(observed)


def test_sort_gpus_takes_the_price_keys_without_a_catalog() -> None:
    a100s = CATALOG.search("a100")
    by_rent = sort_gpus(a100s, "rent")
    assert sorted(g.id for g in by_rent) == sorted(g.id for g in a100s)
    assert by_rent == sort_gpus(a100s, "rent", CATALOG)


def _json_rows(*args: str) -> list[dict[str, Any]]:
    result = run_cli("gpus", *args, "--json")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def test_cli_json_is_sorted_by_price_and_carries_the_price_used() -> None:
    rows = _json_rows("--min-memory", "40", "--sort", "price")
    used = [r["sort_price"] for r in rows]
    priced = [p for p in used if p is not None]
    assert len(priced) >= 5
    assert [p["usd"] for p in priced] == sorted(p["usd"] for p in priced)
    assert used[len(priced) :] == [None] * (len(used) - len(priced))  # unpriced last
    for price in priced:
        assert price["per"] == "unit" and price["as_of"] and isinstance(price["stale"], bool)
        assert price["source_url"] and price["age_days"] >= 0


def test_cli_json_sorted_by_rent_and_freshness() -> None:
    rent = [r["sort_price"] for r in _json_rows("a100", "--sort", "rent") if r["sort_price"]]
    assert rent and [p["usd"] for p in rent] == sorted(p["usd"] for p in rent)
    assert all(p["kind"] == "cloud-on-demand" for p in rent)
    fresh = [r["sort_price"] for r in _json_rows("--sort", "freshness") if r["sort_price"]]
    dates = [dt.date.fromisoformat(p["as_of"]) for p in fresh]
    assert dates == sorted(dates, reverse=True)


def test_cli_spec_keys_keep_the_json_as_it_was() -> None:
    rows = _json_rows("--vendor", "nvidia", "--sort", "memory")
    sizes = [r["memory_gb"] for r in rows if r["memory_gb"] is not None]
    assert sizes == sorted(sizes, reverse=True)
    assert all("sort_price" not in r for r in rows)


def test_cli_sorts_by_the_prices_of_the_given_price_file(tmp_path: Path) -> None:
    prices = tmp_path / "prices.csv"
    prices.write_text(
        "gpu_id,kind,usd,per,provider,region,as_of,source,note\n"
        "a100-pcie-40gb,cloud-on-demand,0.05,hour,mycloud,,2026-11-01,my quote,\n"
    )
    rows = _json_rows("a100", "--sort", "rent", "--prices", str(prices))
    assert rows[0]["id"] == "a100-pcie-40gb"
    assert rows[0]["sort_price"]["provider"] == "mycloud" and rows[0]["sort_price"]["user"]


def test_cli_table_says_which_price_it_sorted_by() -> None:
    result = run_cli("gpus", "a100", "--sort", "price")
    assert result.returncode == 0, result.stderr
    assert "sorted by price: the buy price" in result.stdout
    assert "buy" in result.stdout and "(kind, market, date)" in result.stdout


def test_cli_bad_key_exits_2_with_the_valid_keys_and_no_traceback() -> None:
    result = run_cli("gpus", "--sort", "cheapest")
    assert result.returncode == 2
    assert "Cannot sort by 'cheapest' (--sort)" in result.stderr
    assert "price" in result.stderr and "freshness" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
