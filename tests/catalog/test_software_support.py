"""Software support as sourced data, a base system sized to the GPUs, and used prices in view:
what recommend does with them (issue 33, item 3)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import whichgpu.api as wg
from whichgpu.catalog import load_catalog
from whichgpu.catalog.components import read_component_prices, shipped_component_prices
from whichgpu.catalog.cost_data import build_class_for, shipped_cost_data
from whichgpu.catalog.loader import DATA_DIR
from whichgpu.catalog.software import read_software_support, shipped_software_support, support_for
from whichgpu.cost.base_system import base_system_cost
from whichgpu.errors import CatalogError
from whichgpu.schema import Ranking, RunConfig

CATALOG = load_catalog()
QLORA = RunConfig(method="qlora", seq_len=2048)


def _readme_example() -> Ranking:
    """docs/recommend.md's 'QLoRA a Llama-3.1-8B on a $1,500 budget'."""
    return wg.recommend(
        "llama-3.1-8b", method="qlora", checkpointing=True, seq_len=2048, budget_usd=1500
    )


def test_every_support_fact_has_a_public_source_and_a_date() -> None:
    data = shipped_software_support()
    assert {f.id for f in data.features} >= {"bnb-4bit", "bnb-8bit-optimizer", "fp8-training"}
    for fact in data.facts:
        assert fact.source.url.startswith("https://"), fact
        assert fact.as_of.year >= 2025 and fact.note
    vendors = {(f.feature, f.vendor.value) for f in data.facts}
    assert {("bnb-4bit", "amd"), ("bnb-4bit", "apple"), ("bnb-4bit", "nvidia")} <= vendors


def test_support_follows_the_stack_compute_capability_and_gfx_target() -> None:
    def status(gpu: str, run: RunConfig = QLORA, feature: str = "bnb-4bit") -> str | None:
        verdicts = {v.feature.id: v for v in support_for(CATALOG.resolve(gpu), run)}
        return verdicts[feature].status

    assert status("rtx-3090") == "supported"
    assert status("rx-7900-xtx") == "supported"  # gfx1100: a pre-built ROCm target
    assert status("rx-9070-xt") == "partial"  # gfx1201: ROCm 7.2.3+, known issues
    assert status("mi100") == "unsupported"  # gfx908, below the minimum gfx90a
    assert status("apple-m4-max") == "partial"
    eight_bit = RunConfig(optimizer="adamw-8bit", seq_len=512)
    assert status("apple-m4-max", eight_bit, "bnb-8bit-optimizer") == "unsupported"
    fp8 = RunConfig(precision="fp8", seq_len=512)
    assert status("rtx-3090", fp8, "fp8-training") == "unsupported"  # Ampere: no FP8
    assert status("rtx-4090", fp8, "fp8-training") == "supported"  # Ada: 8.9
    assert not support_for(CATALOG.resolve("rtx-3090"), RunConfig())  # needs none of them


def test_a_stack_that_cannot_run_qlora_is_left_out_with_the_fact_as_reason() -> None:
    ranking = wg.recommend("llama-3.1-8b", method="qlora", gpus=["mi100", "rtx-3090"])
    (left,) = [e for e in ranking.excluded if e.gpu == "mi100"]
    assert left.kind == "build" and left.reason.startswith("software: bitsandbytes 4-bit")
    assert "gfx908" in left.reason and "https://" in left.reason
    assert [c.gpu for c in ranking.ranking] == ["rtx-3090"]


def test_a_stack_that_runs_qlora_with_limits_ranks_after_those_that_run_it_fully() -> None:
    gpus = ["rx-9070-xt", "rtx-5070-ti"]
    ranking = wg.recommend("llama-3.1-8b", method="qlora", checkpointing=True, gpus=gpus)
    assert [c.gpu for c in ranking.ranking] == ["rtx-5070-ti", "rx-9070-xt"]
    radeon = ranking.ranking[1]
    # it is ranked lower for its software, not for its value
    assert radeon.perf_per_dollar > ranking.ranking[0].perf_per_dollar
    assert any(
        r.startswith("software: ranked after the GPUs that run it fully") and "RDNA4" in r
        for r in radeon.reasons
    )
    assert any("ranked after every GPU whose stack runs it fully" in a for a in ranking.assumptions)
    assert not ranking.closeness  # different tiers are not "too close to rank"
    # without QLoRA nothing is asked of bitsandbytes, and the value decides again
    plain = wg.recommend("llama-3.2-1b", seq_len=512, gpus=gpus)
    assert not any("ranked after" in r for c in plain.ranking for r in c.reasons)


def test_the_readme_qlora_example_keeps_the_used_3090_within_the_budget() -> None:
    ranking = _readme_example()
    ranked = {c.gpu: c for c in ranking.ranking}
    assert "rtx-3090" in ranked, [e for e in ranking.excluded if e.gpu == "rtx-3090"]
    assert ranked["rtx-3090"].purchase_usd is not None
    assert ranked["rtx-3090"].purchase_usd <= 1500
    assert ranking.ranking[0].gpu != "rx-9070-xt"
    assert ranking.ranking[-1].gpu == "rx-9070-xt"  # partial support: after every full one


def test_the_base_system_scales_with_the_power_the_gpus_need() -> None:
    data = shipped_cost_data()
    desktop = build_class_for(1)
    small = base_system_cost(CATALOG.resolve("rtx-4060-ti-16gb"), 1, desktop, data.rules)
    big = base_system_cost(CATALOG.resolve("rtx-5090"), 1, desktop, data.rules)
    assert small is not None and big is not None and small.by_parts and big.by_parts
    assert big.usd > small.usd  # a 575 W card needs a bigger, dearer supply
    assert small.needed_psu_w is not None and big.needed_psu_w is not None
    assert small.parts[-1].part == big.parts[-1].part == "psu"
    assert big.needed_psu_w > small.needed_psu_w
    # every part is dated and sourced, and the one-GPU desktop is cheaper than the old figure
    assert all(p.as_of.year >= 2021 and p.provenance.source for p in big.parts)
    assert desktop.base_system_usd is not None and small.usd < desktop.base_system_usd
    # two GPUs and modules keep their class's whole-build figure
    two = base_system_cost(CATALOG.resolve("rtx-3090"), 2, desktop, data.rules)
    assert two is not None and not two.by_parts and two.usd == desktop.base_system_usd


def test_recommend_and_breakeven_price_the_machine_the_same_way() -> None:
    from whichgpu import cost

    ranking = wg.recommend("resnet50", gpus=["rtx-3090"])
    (only,) = ranking.ranking
    assert "desktop base system (parts:" in only.price_note and "W it needs" in only.price_note
    owned = cost.breakeven(gpu="rtx-3090", cloud_usd_per_hour=1.0, catalog=CATALOG)
    assert owned.system_cost_usd == pytest.approx(only.purchase_usd)


def test_over_budget_says_when_a_used_price_would_fit() -> None:
    catalog = wg.load_catalog()
    new = catalog.prices("rtx-4090", "new")[0].usd
    used = catalog.prices("rtx-4090", "used")[0].usd
    budget = (new + used) / 2  # between the two: only the used card fits
    ranking = wg.recommend(
        "resnet50", gpu_only=True, budget_usd=budget, used=False, gpus=["rtx-4090"]
    )
    (left,) = ranking.excluded
    assert left.kind == "budget" and "which fits: drop --new" in left.reason
    assert "used prices (drop --new)" in ranking.answer
    with_used = wg.recommend("resnet50", gpu_only=True, budget_usd=budget, gpus=["rtx-4090"])
    assert [c.gpu for c in with_used.ranking] == ["rtx-4090"]
    # within budget, a cheaper used price is named with how to rank with it
    roomy = wg.recommend("resnet50", gpu_only=True, used=False, gpus=["rtx-4090"])
    assert any("without --new it ranks with it" in r for r in roomy.ranking[0].reasons)


def _copy_data(tmp_path: Path) -> Path:
    target = tmp_path / "v1"
    shutil.copytree(DATA_DIR, target)
    return target


def test_malformed_support_and_component_files_name_the_file_and_the_field(
    tmp_path: Path,
) -> None:
    data = _copy_data(tmp_path)
    support = data / "software" / "support.yaml"
    support.write_text(support.read_text().replace("status: partial", "status: maybe", 1))
    with pytest.raises(CatalogError, match=r"support\.yaml: fact \d+, field 'status'"):
        read_software_support(data)
    parts = data / "components" / "parts.yaml"
    parts.write_text(parts.read_text().replace("as_of: 2021-11-29", "as_of: soon", 1))
    with pytest.raises(CatalogError, match=r"parts\.yaml: power supply \d+, field 'as_of'"):
        read_component_prices(data)
    assert shipped_component_prices().power_supply(10_000) is None
