"""Data-parallel step time: the link each GPU exchanges gradients over, and what it adds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.catalog import load_catalog
from whichgpu.cost import build_checks
from whichgpu.errors import UsageError
from whichgpu.estimate import prediction
from whichgpu.estimate.data_parallel import (
    data_parallel_step,
    exchange_bytes,
    gpu_link,
    load_links,
)
from whichgpu.estimate.throughput import OpTable, split_work
from whichgpu.units import GB


def test_links_follow_the_board_and_the_count() -> None:
    catalog = load_catalog()
    links = load_links()
    h100 = catalog.resolve("h100-sxm")
    switched = gpu_link(h100, 8)
    assert switched.kind == "nvswitch"
    assert h100.interconnect_bandwidth_gbps is not None
    assert switched.peak_bytes_per_s == h100.interconnect_bandwidth_gbps / 2 * GB
    assert switched.bus_bytes_per_s == switched.peak_bytes_per_s * links.bus_efficiency["nvswitch"]
    a6000 = catalog.resolve("rtx-a6000")  # NVLink bridge between two cards only
    assert gpu_link(a6000, 2).kind == "bridge"
    assert gpu_link(a6000, 4).kind == "pcie"
    rtx4090 = catalog.resolve("rtx-4090")
    pcie = gpu_link(rtx4090, 4)
    assert pcie.kind == "pcie"
    assert rtx4090.pcie_gen is not None
    assert pcie.peak_bytes_per_s == pytest.approx(
        links.pcie_gbps_per_lane[rtx4090.pcie_gen] * (rtx4090.pcie_lanes or 16) * GB
    )


def test_exchange_volume_by_sharding() -> None:
    gradients, parameters = 4_000, 2_000
    assert exchange_bytes(gradients, parameters, 1, "ddp") == 0
    assert exchange_bytes(gradients, parameters, 4, "ddp") == pytest.approx(2 * 0.75 * 4_000)
    assert exchange_bytes(gradients, parameters, 4, "zero2") == pytest.approx(2 * 0.75 * 4_000)
    # reduce-scatter of the gradients, and the parameters gathered for forward and backward
    assert exchange_bytes(gradients, parameters, 4, "fsdp") == pytest.approx(
        0.75 * 4_000 + 2 * 0.75 * 2_000
    )


def test_exchange_hides_behind_backward_but_for_the_last_bucket() -> None:
    gpu = load_catalog().resolve("rtx-4090")
    bucket = load_links().ddp_bucket_bytes
    gradients = 40 * bucket
    long_backward = data_parallel_step(1.0, 0.7, gradients, gradients, gpu, 4, "ddp")
    assert long_backward.exposed_s == pytest.approx(long_backward.exchange_s / 40)
    assert long_backward.step_time_s == pytest.approx(1.0 + long_backward.exposed_s)
    no_backward = data_parallel_step(1.0, 0.0, gradients, gradients, gpu, 4, "ddp")
    assert no_backward.exposed_s == pytest.approx(no_backward.exchange_s)
    # FSDP's gathers also hide behind forward
    fsdp = data_parallel_step(1.0, 0.0, gradients, gradients, gpu, 4, "fsdp")
    assert fsdp.exposed_s < fsdp.exchange_s


def test_gpus_without_pcie_data_are_refused_with_a_reason() -> None:
    catalog = load_catalog()
    no_pcie = next(
        g
        for g in catalog.all()
        if g.pcie_gen is None and not (g.interconnect_bandwidth_gbps and g.form_factor)
    )
    with pytest.raises(UsageError, match="PCIe"):
        gpu_link(no_pcie, 4)


def test_predict_on_n_gpus_scales_below_n_and_pcie_below_nvlink() -> None:
    one = wg.predict("bert-large", gpus=["a100-sxm4-80gb"], batch_size=8, seq_len=512)[0]
    eight = wg.predict(
        "bert-large", gpus=["a100-sxm4-80gb"], gpu_count=8, batch_size=8, seq_len=512
    )[0]
    assert eight.n_gpus == 8 and eight.link is not None and "nvlink" in eight.link
    assert one.throughput is not None and eight.throughput is not None
    assert eight.scaling_efficiency is not None and 0.5 < eight.scaling_efficiency <= 1.0
    assert eight.throughput == pytest.approx(8 * one.throughput * eight.scaling_efficiency)
    assert "exchange" in eight.time_shares
    pcie = wg.predict("bert-large", gpus=["rtx-4090"], gpu_count=8, batch_size=8, seq_len=512)[0]
    assert pcie.scaling_efficiency is not None
    assert pcie.scaling_efficiency < eight.scaling_efficiency


def test_predict_cli_on_four_gpus() -> None:
    result = run_cli(
        "predict", "gpt2", "--gpu", "3090", "--gpus", "4", "--batch-size", "4", "--json"
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["n_gpus"] == 4
    assert row["link"].startswith("PCIe 4.0")
    assert 0 < row["scaling_efficiency"] <= 1


def test_speed_questions_stop_at_one_machine() -> None:
    # the link figures describe one machine; the cost data's largest build is that machine
    from whichgpu.catalog.cost_data import shipped_cost_data

    most = load_links().max_gpus_per_node
    assert most == max(b.gpus for b in shipped_cost_data().build_classes)
    for args in (
        ("predict", "resnet50", "--gpus", str(most + 1)),
        ("recommend", "resnet50", "--rent", "--gpus", "16"),
    ):
        result = run_cli(*args, "--json")
        assert result.returncode == 2, result.stderr
        assert json.loads(result.stdout)["error"]["exit_code"] == 2
        assert f"at most {most}" in result.stderr and "whichgpu fit" in result.stderr
        assert "Traceback" not in result.stderr
    # a range stops at one machine; fit answers per GPU for any count
    ranking = wg.recommend("resnet50", acquire="rent", gpu_count="4-16", gpus=["h100-sxm"])
    assert sorted({c.count for c in ranking.ranking}) == [4, 8]
    (wide,) = wg.fit("llama-3.1-70b", gpus=["h100-sxm"], gpu_count=64, sharding="zero3")
    assert wide.gpus == 64


def test_tensor_parallel_serving_splits_weights_and_cache_and_adds_all_reduces() -> None:
    ask = {"mode": "inference", "concurrency": 4, "context": 1024, "new_tokens": 128}
    one = wg.fit("llama-3.2-3b", gpus=["h100-sxm"], batch_size=4, **ask)[0]
    two = wg.fit("llama-3.2-3b", gpus=["h100-sxm"], batch_size=4, gpu_count=2, **ask)[0]
    assert two.gpus == 2
    assert one.kv_cache_bytes is not None
    assert two.kv_cache_bytes == one.kv_cache_bytes // 2  # this GPU's half of the 8 KV heads
    weights_one, weights_two = one.breakdown["weights"], two.breakdown["weights"]
    assert weights_two == pytest.approx(weights_one / 2, rel=0.01)
    assert one.kv_cache_bytes is not None
    nccl = two.overheads["nccl_buffers"] - one.overheads.get("nccl_buffers", 0)
    saved = one.device_total_bytes - two.device_total_bytes + nccl
    assert saved == pytest.approx(weights_one / 2 + one.kv_cache_bytes / 2, rel=0.02)
    assert two.max_batch_size > one.max_batch_size
    assert any("tensor parallel" in a for a in two.assumptions)

    single = wg.predict("llama-3.2-3b", gpus=["h100-sxm"], **ask)[0]
    split = wg.predict("llama-3.2-3b", gpus=["h100-sxm"], gpu_count=2, **ask)[0]
    assert split.link is not None and "nvlink" in split.link
    assert single.decode_step_s is not None and split.decode_step_s is not None
    floor = load_links().all_reduce_floor_s
    layers = 28  # Llama 3.2 3B
    # half the work, plus two all-reduces per layer (each at least the floor)
    assert split.decode_step_s >= single.decode_step_s / 2 + 2 * layers * floor - 1e-12
    assert split.decode_step_s < single.decode_step_s
    assert 0 < split.time_shares["exchange"] < 1
    assert split.mfu is not None and single.mfu is not None and split.mfu < single.mfu


def test_split_work_reads_the_kv_heads_a_gpu_holds() -> None:
    table = OpTable(
        kinds=("gemm", "attention"),
        dtypes=("bfloat16", "bfloat16"),
        flops=np.array([800.0, 80.0]),
        bytes_moved=np.array([1600.0, 400.0]),
        units_per_step=1,
        batch_size=1,
        seq_len=16,
        is_matrix=np.array([True, True]),
        is_half=np.array([True, True]),
        is_fp32=np.array([False, False]),
        phases=np.array(["decode", "decode"]),
    )
    even = split_work(table, 8)
    assert even.flops.tolist() == [100.0, 10.0]
    assert even.bytes_moved.tolist() == [200.0, 50.0]
    # 4 KV heads over 8 GPUs: each keeps (and reads) one, a quarter of the cache
    replicated = split_work(table, 8, attention_bytes_share=0.25)
    assert replicated.flops.tolist() == [100.0, 10.0]  # query heads still split evenly
    assert replicated.bytes_moved.tolist() == [200.0, 100.0]


def test_tensor_parallel_decode_reads_replicated_kv_heads_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # tiny-llama has 2 KV heads: on 4 GPUs each holds (and reads) one, half of the cache,
    # not a quarter as an even split would have it; on 2 GPUs, also one
    config = str(Path(__file__).parents[1] / "fixtures" / "tiny-llama.json")
    ask = {"mode": "inference", "batch_size": 4096, "context": 200, "new_tokens": 16}
    two = wg.predict(config=config, gpus=["h100-sxm"], gpu_count=2, **ask)[0]
    four = wg.predict(config=config, gpus=["h100-sxm"], gpu_count=4, **ask)[0]
    (memory,) = wg.fit(config=config, gpus=["h100-sxm"], gpu_count=4, **ask)
    assert not any("fewer than the" in a for a in two.assumptions)
    assert any("2 KV heads are fewer than the 4 GPUs" in a for a in four.assumptions)
    monkeypatch.setattr(prediction, "kv_heads_on_one_gpu", lambda heads, gpus: heads / gpus)
    even = wg.predict(config=config, gpus=["h100-sxm"], gpu_count=4, **ask)[0]
    assert four.decode_step_s is not None and even.decode_step_s is not None
    assert two.decode_step_s is not None and memory.kv_cache_bytes is not None
    # the half of its cache an even split leaves out takes at least its time at peak bandwidth
    bandwidth = load_catalog().resolve("h100-sxm").memory_bandwidth_gbps
    assert bandwidth is not None
    unread_s = memory.kv_cache_bytes / 2 / (bandwidth * GB)
    assert four.decode_step_s - even.decode_step_s >= unread_s


def test_tensor_parallel_over_gpus_the_heads_do_not_split_over_is_refused() -> None:
    with pytest.raises(UsageError, match=r"28 attention heads \(4 key/value heads\)"):
        wg.fit("qwen2.5-7b", gpus=["h100-sxm"], gpu_count=8, mode="inference")
    with pytest.raises(UsageError, match="GPU counts that work: 2, 4, 8"):
        wg.predict("llama-3.1-8b", gpus=["h100-sxm"], gpu_count=3, mode="inference")


def test_pcie_width_is_what_the_machine_gives_each_card_as_cost_build_says() -> None:
    catalog = load_catalog()
    card = catalog.resolve("rtx-5080")
    two, four = gpu_link(card, 2), gpu_link(card, 4)
    report = build_checks("rtx-5080", 2, catalog=catalog)
    assert report.lanes_per_gpu == 8
    assert "x8 (in a desktop)" in two.description  # a desktop's 16 lanes shared by two
    assert "x16 (in a workstation)" in four.description
    assert two.peak_bytes_per_s == pytest.approx(four.peak_bytes_per_s / 2)
