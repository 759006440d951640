"""Purchase prices a buyer can act on: every shipped street price is dated and sourced, the
GPUs priced from published used figures have a purchase price, and ``Catalog.purchase_price``
takes the lower of the newest new and newest used price unless told which kind to use."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from whichgpu.catalog import load_catalog
from whichgpu.catalog.query import Catalog
from whichgpu.schema import PriceKind

CATALOG = load_catalog([])
TODAY = dt.date.today()


@pytest.mark.parametrize("kind", ["used", "new"])
def test_every_street_price_has_a_dated_source_with_a_url(kind: PriceKind) -> None:
    rows = [p for g in CATALOG.all() for p in CATALOG.prices(g.id, kind) if not p.user]
    assert rows, f"no shipped {kind} prices"
    for price in rows:
        assert price.source in CATALOG.sources, (price.gpu_id, price.source)
        source = CATALOG.sources[price.source]
        assert source.url and source.kind in ("market", "secondary"), price.source
        assert price.as_of <= TODAY and price.per == "unit" and price.usd > 0
        assert price.note, f"{price.gpu_id}: say what the source says"


@pytest.mark.parametrize(
    "gpu_id",
    [
        "a100-sxm4-80gb",
        "a100-pcie-80gb",
        "h100-pcie",
        "l40s",
        "rtx-a6000",
        "tesla-p40",
        "tesla-p100-pcie-16gb",
        "h100-sxm",
        "l4",
    ],
)
def test_gpus_with_a_published_street_price_have_a_purchase_price(gpu_id: str) -> None:
    choice = CATALOG.purchase_choice(gpu_id)
    assert choice is not None and choice.price.kind in ("new", "used")
    assert choice.price.source in CATALOG.sources


def test_tesla_p40_is_priced_used_from_a_dated_article() -> None:
    choice = CATALOG.purchase_choice("tesla-p40")
    assert choice is not None
    assert (choice.price.kind, choice.price.usd) == ("used", 295)
    assert choice.price.as_of == dt.date(2026, 6, 20)
    assert choice.reason == "newest used price; no new price"


@pytest.mark.parametrize(
    ("gpu_id", "usd", "as_of", "reason"),
    [
        # runlocalai.co's note on the B200 ramp: used H100 SXM at $22-25k, below the new estimate
        (
            "h100-sxm",
            23_500,
            dt.date(2026, 4, 1),
            "newest used price, below the newest new one ($30,000, 2026-07-01)",
        ),
        # runlocalai.co's L4 page: '$2,500 retail / $1,800-2,200 used'
        (
            "l4",
            2_000,
            dt.date(2026, 1, 1),
            "newest used price, below the newest new one ($2,500, 2026-01-01)",
        ),
    ],
)
def test_datacenter_cards_are_priced_used_from_dated_figures(
    gpu_id: str, usd: float, as_of: dt.date, reason: str
) -> None:
    choice = CATALOG.purchase_choice(gpu_id)
    assert choice is not None
    assert (choice.price.kind, choice.price.usd, choice.price.as_of) == ("used", usd, as_of)
    assert choice.reason == reason
    assert CATALOG.purchase_price(gpu_id) == choice.price
    assert CATALOG.purchase_price(gpu_id, used=True) == choice.price


def test_a_buy_ranking_ranks_the_datacenter_cards_priced_used() -> None:
    import whichgpu.api as wg

    gpus = ["h100-sxm", "l4", "a100-pcie-80gb", "l40s"]
    ranking = wg.recommend("resnet50", gpu_only=True, gpus=gpus)
    assert ranking.mode == "buy"
    ranked = {c.gpu: c for c in ranking.ranking}
    assert set(ranked) == set(gpus)
    assert not [e for e in ranking.excluded if e.kind == "price"]
    for gpu in gpus:
        choice = CATALOG.purchase_choice(gpu)
        assert choice is not None and ranked[gpu].purchase_usd == choice.price.usd
    assert ranked["l4"].purchase_usd == 2_000
    assert ranked["l40s"].purchase_usd == 8_000  # L40S: still its new price (no used figure)
    price = next(r for r in ranked["h100-sxm"].reasons if r.startswith("price: "))
    assert "used" in price and "px-runlocalai-b200-pulse" in price


# --- which price purchase_price chooses -------------------------------------------------------


def _catalog(tmp_path: Path, rows: str) -> Catalog:
    path = tmp_path / "prices.csv"
    path.write_text("gpu_id,kind,usd,per,provider,region,as_of,source,note\n" + rows)
    return load_catalog([path])


def test_default_is_the_lower_of_the_newest_new_and_used_price(tmp_path: Path) -> None:
    catalog = _catalog(
        tmp_path,
        "rtx-3080-12gb,new,900,unit,shop,US,2026-01-10,q1,\n"
        "rtx-3080-12gb,new,800,unit,shop,US,2025-01-10,q0,older and cheaper: not the newest\n"
        "rtx-3080-12gb,used,500,unit,ebay,US,2025-06-01,q2,\n",
    )
    choice = catalog.purchase_choice("rtx-3080-12gb")
    assert choice is not None
    assert (choice.price.kind, choice.price.usd) == ("used", 500)
    assert choice.reason == "newest used price, below the newest new one ($900, 2026-01-10)"
    assert catalog.purchase_price("rtx-3080-12gb") == choice.price


def test_new_wins_where_it_is_not_above_the_used_price(tmp_path: Path) -> None:
    catalog = _catalog(
        tmp_path,
        "rtx-3080-12gb,new,600,unit,shop,US,2026-01-10,q1,\n"
        "rtx-3080-12gb,used,600,unit,ebay,US,2026-02-01,q2,\n",
    )
    choice = catalog.purchase_choice("rtx-3080-12gb")
    assert choice is not None and choice.price.kind == "new"
    assert "not above the newest used one ($600, 2026-02-01)" in choice.reason


def test_used_false_gives_new_and_used_true_gives_used() -> None:
    new = CATALOG.purchase_price("rtx-4090", used=False)
    used = CATALOG.purchase_price("rtx-4090", used=True)
    assert new == CATALOG.prices("rtx-4090", "new")[0]
    assert used == CATALOG.prices("rtx-4090", "used")[0]
    assert used.usd < new.usd  # the shipped data: so the default takes the used price
    assert CATALOG.purchase_price("rtx-4090") == used
    choice = CATALOG.purchase_choice("rtx-4090", used=False)
    assert choice is not None and choice.reason == "newest new price (new only)"


def test_a_gpu_with_only_a_launch_price_gets_the_launch_price() -> None:
    gpu_id = "rtx-4070"
    assert not CATALOG.prices(gpu_id, "new") and not CATALOG.prices(gpu_id, "used")
    for used in (None, True, False):
        choice = CATALOG.purchase_choice(gpu_id, used)
        assert choice is not None and choice.price.kind == "launch"
        assert choice.reason.startswith("launch MSRP: no ")
    choice = CATALOG.purchase_choice(gpu_id)
    assert choice is not None and choice.reason == "launch MSRP: no new or used price"


def test_asking_for_a_kind_the_gpu_lacks_falls_back_to_launch_or_nothing() -> None:
    # the A100 80GB SXM has a used price only and no launch MSRP
    assert CATALOG.purchase_price("a100-sxm4-80gb", used=False) is None
    used = CATALOG.purchase_price("a100-sxm4-80gb")
    assert used is not None and used.kind == "used"
    # a GPU without any price has no purchase price
    assert CATALOG.purchase_choice("mi300x") is None


def test_compare_says_which_purchase_price_it_took_and_why() -> None:
    from whichgpu.catalog import load_catalog
    from whichgpu.catalog.compare import compare

    catalog = load_catalog()
    gpus = [catalog.resolve("3090"), catalog.resolve("4090")]
    comparison = compare(catalog, gpus)
    for gpu, note in zip(gpus, comparison.price_notes, strict=True):
        choice = catalog.purchase_choice(gpu.id)
        assert choice is not None and note.endswith(f": {choice.reason}")
        assert note.startswith(choice.price.kind)
