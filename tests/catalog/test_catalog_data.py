"""The shipped catalog: coverage, sources, consistency, and the names people use.

Expected names are those of the seed documents (Lambda's 2020 benchmark, Tim Dettmers'
guides) and of today's market, as listed in the foundation issue.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter

import pytest

from whichgpu.catalog import load_catalog
from whichgpu.catalog.audit import audit
from whichgpu.catalog.loader import DATA_DIR, read_data_dir
from whichgpu.errors import AmbiguousGpu
from whichgpu.schema import SPEC_FIELDS, Confidence, Vendor

DATA = read_data_dir(DATA_DIR)
CATALOG = load_catalog([])


def test_at_least_seventy_gpus() -> None:
    assert len(DATA.gpus) >= 70


def test_audit_finds_no_problem() -> None:
    assert audit(DATA) == []


def test_every_value_has_a_source_with_a_url() -> None:
    for gpu in DATA.gpus:
        for field in SPEC_FIELDS:
            if getattr(gpu, field) is not None:
                prov = gpu.provenance[field]
                assert DATA.sources[prov.source].url.startswith("https://"), (gpu.id, field)
                if prov.confidence is Confidence.DERIVED:
                    assert prov.method, (gpu.id, field)


def test_most_values_are_vendor_printed() -> None:
    counts = Counter(p.confidence for g in DATA.gpus for p in g.provenance.values())
    vendor = counts[Confidence.DATASHEET] + counts[Confidence.WHITEPAPER]
    assert vendor / sum(counts.values()) > 0.6, counts


def test_every_vendor_is_covered() -> None:
    assert {g.vendor for g in DATA.gpus} == set(Vendor)


# (name as a user types it, the catalog id it must resolve to)
SEED_AND_MARKET_NAMES = [
    ("GTX 1050 Ti", "gtx-1050-ti"),
    ("1060 6GB", "gtx-1060-6gb"),
    ("GTX 1070", "gtx-1070"),
    ("1070 Ti", "gtx-1070-ti"),
    ("GTX 1080", "gtx-1080"),
    ("1080 Ti", "gtx-1080-ti"),
    ("GTX 1650 Super", "gtx-1650-super"),
    ("980 Ti", "gtx-980-ti"),
    ("Titan Xp", "titan-xp"),
    ("Titan V", "titan-v"),
    ("Titan RTX", "titan-rtx"),
    ("RTX 2060", "rtx-2060"),
    ("2060 Super", "rtx-2060-super"),
    ("RTX 2070", "rtx-2070"),
    ("RTX 2080", "rtx-2080"),
    ("2080 Ti", "rtx-2080-ti"),
    ("Quadro RTX 5000", "quadro-rtx-5000"),
    ("Quadro RTX 6000", "quadro-rtx-6000"),
    ("Quadro RTX 8000", "quadro-rtx-8000"),
    ("RTX 3070", "rtx-3070"),
    ("rtx3090", "rtx-3090"),
    ("3090", "rtx-3090"),
    ("GeForce RTX 3090", "rtx-3090"),
    ("NVIDIA GeForce RTX 3090", "rtx-3090"),
    ("RTX 3090 Ti", "rtx-3090-ti"),
    ("4060 Ti 16GB", "rtx-4060-ti-16gb"),
    ("4090", "rtx-4090"),
    ("RTX 5090", "rtx-5090"),
    ("RTX A4000", "rtx-a4000"),
    ("A6000", "rtx-a6000"),
    ("RTX 6000 Ada", "rtx-6000-ada"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
    ("A10", "a10"),
    ("A10G", "a10g"),
    ("A30", "a30"),
    ("A40", "a40"),
    ("L4", "l4"),
    ("L40", "l40"),
    ("L40S", "l40s"),
    ("T4", "tesla-t4"),
    ("Tesla T4", "tesla-t4"),
    ("Tesla V100-PCIE-32GB", "tesla-v100-pcie-32gb"),
    ("Tesla V100-SXM2-16GB", "tesla-v100-sxm2-16gb"),
    ("A100-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("H100-SXM", "h100-sxm"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("H100 NVL", "h100-nvl"),
    ("H200 NVL", "h200-nvl"),
    ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("B200", "b200"),
    ("GB200", "gb200"),
    ("B300", "b300"),
    ("Tesla P4", "tesla-p4"),
    ("Tesla P40", "tesla-p40"),
    ("MI300X", "mi300x"),
    ("MI250X", "mi250x"),
    ("MI355X", "mi355x"),
    ("RX 7900 XTX", "rx-7900-xtx"),
    ("TPU v5e", "tpu-v5e"),
    ("Gaudi 3", "gaudi3"),
    ("M4 Max", "apple-m4-max"),
]


@pytest.mark.parametrize(("name", "gpu_id"), SEED_AND_MARKET_NAMES)
def test_names_people_use_resolve(name: str, gpu_id: str) -> None:
    assert CATALOG.resolve(name).id == gpu_id


@pytest.mark.parametrize(
    ("name", "some_candidates"),
    [
        ("A100", {"a100-sxm4-80gb", "a100-pcie-40gb"}),
        ("H100", {"h100-sxm", "h100-pcie", "h100-nvl"}),
        ("V100", {"tesla-v100-sxm2-32gb", "tesla-v100-pcie-16gb"}),
        ("P100", {"tesla-p100-pcie-16gb", "tesla-p100-sxm2-16gb"}),
        ("Titan X", {"titan-x-maxwell", "titan-x-pascal"}),
        ("RTX 6000", {"quadro-rtx-6000", "rtx-6000-ada"}),
        ("4060 Ti", {"rtx-4060-ti-8gb", "rtx-4060-ti-16gb"}),
    ],
)
def test_family_names_ask_which_variant(name: str, some_candidates: set[str]) -> None:
    with pytest.raises(AmbiguousGpu) as err:
        CATALOG.resolve(name)
    assert some_candidates <= {c[0] for c in err.value.candidates}


def test_memory_picks_the_variant_a_device_reports() -> None:
    assert CATALOG.resolve("4060 Ti", memory_gb=16).id == "rtx-4060-ti-16gb"
    with pytest.raises(AmbiguousGpu):  # 80 GB A100s exist as SXM4 and PCIe
        CATALOG.resolve("A100", memory_gb=80)


def test_geforce_amp_rate_is_half_the_headline() -> None:
    for gpu_id in ("rtx-2080-ti", "rtx-3090", "rtx-4090", "rtx-5090"):
        gpu = CATALOG.get(gpu_id)
        assert gpu.fp16_acc16_tensor_tflops is not None and gpu.fp16_tensor_tflops is not None
        assert gpu.fp16_tensor_tflops == pytest.approx(gpu.fp16_acc16_tensor_tflops / 2, rel=0.01)


def test_prices_are_dated_and_sourced() -> None:
    today = dt.date.today()
    kinds = Counter(p.kind for p in DATA.prices)
    assert kinds["launch"] >= 30
    assert kinds["cloud-on-demand"] >= 20
    assert kinds["new"] + kinds["used"] >= 10
    for price in DATA.prices:
        assert price.as_of <= today
        assert price.source in DATA.sources


def test_cloud_rates_read_from_a_sized_instance_carry_its_size() -> None:
    # a note that divides an instance price ("/ 8 GPUs", "8x ... instance", "8-GPU instance")
    # must give the machine size as data, or recommend would price 1 GPU at an 8-GPU node's rate
    stated = re.compile(r"/ (\d+) GPUs?\b|^(\d+)x \S|(\d+)-GPU instance|\((\d+)x ")
    checked = 0
    for price in DATA.prices:
        match = stated.search(price.note or "") if price.kind.startswith("cloud") else None
        if match is None:
            continue
        checked += 1
        size = int(next(g for g in match.groups() if g))
        assert price.instance_gpus is not None and size in price.instance_gpus, (
            f"{price.gpu_id} {price.provider} {price.usd}: note states {size} GPUs"
        )
    assert checked >= 30


def test_a100_40gb_rental_rates_are_dated_and_sourced() -> None:
    # the 40 GB A100 rents from single-GPU machines (GCP a2-highgpu-1g, Lambda 1x, Verda
    # 1A100.40S), not only whole 8-GPU nodes; each rate names its source and the date read
    rates = [p for p in DATA.prices if p.gpu_id == "a100-sxm4-40gb" and p.kind.startswith("cloud")]
    single = {(p.provider, p.kind) for p in rates if p.instance_gpus == (1,)}
    assert {
        ("gcp", "cloud-on-demand"),
        ("gcp", "cloud-spot"),
        ("lambda", "cloud-on-demand"),
        ("verda", "cloud-spot"),
    } <= single
    for price in rates:
        assert DATA.sources[price.source].url.startswith("https://")
        assert price.as_of.isoformat() in (price.note or ""), price
    assert CATALOG.cheapest_cloud_price("a100-sxm4-40gb", spot=True, gpus=1) is not None


# The GPUs of Lambda's 2020 deep-learning benchmark: the seed workloads' measured GPUs.
LAMBDA_2020_GPUS = (
    "rtx-2060",
    "rtx-2070",
    "rtx-2080",
    "gtx-1080-ti",
    "rtx-2080-ti",
    "titan-rtx",
    "quadro-rtx-6000",
    "quadro-rtx-8000",
)


@pytest.mark.parametrize("gpu_id", LAMBDA_2020_GPUS)
def test_lambda_2020_gpus_have_a_cuda_total(gpu_id: str) -> None:
    gpu = CATALOG.get(gpu_id)
    assert gpu.memory_cuda_total_mib is not None
    assert gpu.provenance["memory_cuda_total_mib"].source in DATA.sources


def test_cuda_total_is_just_below_the_marketed_size() -> None:
    """GPU memory is sold in binary units ("24 GB" is 24 GiB); CUDA sees a little less of it.

    Below the marketed size, and above 90 % of it (ECC on GDDR takes 1/16, the driver a few
    hundred MiB).
    """
    with_total = [g for g in DATA.gpus if g.memory_cuda_total_mib is not None]
    assert len(with_total) >= len(LAMBDA_2020_GPUS)
    for gpu in with_total:
        assert gpu.memory_gb is not None and gpu.memory_cuda_total_mib is not None
        marketed_mib = gpu.memory_gb * 1024
        assert 0.9 * marketed_mib < gpu.memory_cuda_total_mib < marketed_mib, gpu.id


def test_a_sustained_tensor_rate_above_the_peak_is_a_problem() -> None:
    from whichgpu.catalog.audit import audit_gpu

    t4 = load_catalog().resolve("tesla-t4")
    assert audit_gpu(t4) == []
    assert any(
        "sustained tensor" in p
        for p in audit_gpu(t4.model_copy(update={"sustained_tensor_tflops": 70.0}))
    )
