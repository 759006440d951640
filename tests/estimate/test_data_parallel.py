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
    check_gpu_count,
    data_parallel_step,
    exchange_bytes,
    get_fabric,
    gpu_link,
    load_links,
    memory_parallel,
    node_count,
    shard_group,
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


def test_zero1_reduces_once_a_step_where_zero2_reduces_every_micro_step() -> None:
    # 16 GPUs over InfiniBand, 8 micro-steps a step: ZeRO-2 keeps only its gradient shard, so
    # each micro-step's backward reduce-scatters; ZeRO-1 (and DDP) keep the whole gradients
    # and reduce them once, behind the last micro-step
    options = {"gpus": ["h100-sxm"], "gpu_count": 16, "batch_size": 2, "grad_accum": 8}
    shares = {}
    for sharding in ("ddp", "zero1", "zero2"):
        (e,) = wg.predict("llama-3.2-1b", sharding=sharding, seq_len=2048, **options)
        assert e.step_time_s is not None
        shares[sharding] = e.time_shares["exchange"] * e.step_time_s
        if sharding == "zero1":
            assert any("ZeRO-1 exchanges the gradients once" in a for a in e.assumptions)
    assert shares["zero1"] == pytest.approx(shares["ddp"], rel=0.05)
    assert shares["zero2"] > 4 * shares["zero1"]


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


def test_recommend_ranks_clusters_of_whole_machines_and_fit_takes_any_count() -> None:
    # recommend prices each machine of a cluster as one: the cost data's largest build is a node
    from whichgpu.catalog.cost_data import shipped_cost_data

    most = load_links().max_gpus_per_node
    assert most == max(b.gpus for b in shipped_cost_data().build_classes)
    result = run_cli("recommend", "resnet50", "--rent", "--gpus", "12", "--json")
    assert result.returncode == 2, result.stderr
    assert json.loads(result.stdout)["error"]["exit_code"] == 2
    assert f"nodes of {most}" in result.stderr and "Traceback" not in result.stderr
    # a range goes on past one machine in clusters; fit answers per GPU for any count
    ranking = wg.recommend("resnet50", acquire="rent", gpu_count="4-16", gpus=["h100-sxm"])
    assert sorted({c.count for c in ranking.ranking}) == [4, 8, 16]
    assert {c.count: c.machines for c in ranking.ranking} == {4: 1, 8: 1, 16: 2}
    (wide,) = wg.fit("llama-3.1-70b", gpus=["h100-sxm"], gpu_count=64, sharding="zero3")
    assert wide.gpus == 64


def test_fabrics_are_sourced_catalog_data() -> None:
    links = load_links()
    assert links.default_fabric == "ib-ndr"
    rates = {k: (f.gbit_per_s_per_gpu, f.bytes_per_s_per_gpu) for k, f in links.fabrics.items()}
    assert rates["ib-ndr"] == (400, 50 * GB)
    assert rates["ib-hdr"] == rates["roce-1600"] == (200, 25 * GB)
    assert all(f.source and f.name for f in links.fabrics.values())
    assert 0 < links.bus_efficiency["network"] <= 1
    assert links.bus_efficiency_sources["network"]
    assert get_fabric(None) == links.fabrics["ib-ndr"]
    assert get_fabric(" IB-HDR ").id == "ib-hdr"


def test_exchange_across_nodes_is_bound_by_the_fabric() -> None:
    catalog, links = load_catalog(), load_links()
    share = links.bus_efficiency["network"]
    a100 = catalog.resolve("a100-sxm4-80gb")
    node, hdr = gpu_link(a100, 8), gpu_link(a100, 16, network="ib-hdr")
    # the node's 8 NICs carry the ring together, at NCCL's share of their peak
    assert hdr.kind == "network" and "2 x 8 over" in hdr.description
    assert hdr.bus_bytes_per_s == pytest.approx(8 * 25 * GB * share)
    assert hdr.bus_bytes_per_s < node.bus_bytes_per_s
    # the bandwidth part of an exchange grows by the ring's bytes and the ratio of the rates
    grads, params = 16 * 10**9, 8 * 10**9
    args = (1.0, 0.5, grads, params, a100)
    on_node = data_parallel_step(*args, 8, "fsdp")
    across = data_parallel_step(*args, 16, "fsdp", network="ib-hdr")
    ratio = (15 / 16) / (7 / 8) * node.bus_bytes_per_s / hdr.bus_bytes_per_s
    assert across.exchange_s == pytest.approx(on_node.exchange_s * ratio)
    assert across.exchange_s > on_node.exchange_s
    # H100s on NDR: 8 NICs of 50 GB/s outrun NVLink 4's ring, which then sets the pace
    h100 = catalog.resolve("h100-sxm")
    ndr = gpu_link(h100, 16)
    assert ndr.bus_bytes_per_s == gpu_link(h100, 8).bus_bytes_per_s
    assert "ib-ndr" in ndr.description and "node's link sets the pace" in ndr.description
    h100_hdr = gpu_link(h100, 16, network="ib-hdr")
    assert h100_hdr.bus_bytes_per_s < ndr.bus_bytes_per_s
    assert data_parallel_step(1.0, 0.5, grads, params, h100, 16, "ddp", network="ib-hdr")
    assert node_count(64) == 8 and node_count(8) == 1


def test_runs_that_cannot_be_timed_across_nodes_are_refused() -> None:
    check_gpu_count(4096)
    with pytest.raises(UsageError, match="at most 4,096"):
        check_gpu_count(8192)
    with pytest.raises(UsageError, match="ask about 8 or 16 GPUs"):
        check_gpu_count(12)
    with pytest.raises(UsageError, match="tensor parallel"):
        check_gpu_count(16, "inference")
    with pytest.raises(UsageError, match=r"ib-ndr.*ib-hdr.*roce-1600"):
        check_gpu_count(16, network="ethernet-10g")
    with pytest.raises(UsageError, match="not a known fabric"):
        wg.predict("gpt2", gpus=["h100-sxm"], gpu_count=16, network="token-ring")
    with pytest.raises(UsageError, match="not a known fabric"):
        wg.fit("gpt2", gpus=["h100-sxm"], gpu_count=16, network="token-ring")
    for args in (("--gpus", "9"), ("--gpus", "16", "--mode", "inference")):
        result = run_cli("predict", "gpt2", "--gpu", "h100-sxm", *args, "--json")
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr


def test_predict_across_nodes_names_the_fabric() -> None:
    (row,) = wg.predict("llama-3.1-8b", gpus=["h100-sxm"], gpu_count=64, sharding="fsdp")
    assert row.n_gpus == 64 and row.link is not None and "8 x 8 over" in row.link
    note = next(a for a in row.assumptions if "nodes of 8 joined by" in a)
    assert "InfiniBand NDR (ib-ndr; the default fabric" in note and "400 Gb/s" in note
    # the exchange is described across the nodes, not as one node's
    assert any(
        a.startswith("64 GPUs in 8 nodes of 8, data parallel (fsdp)") for a in row.assumptions
    )
    assert not any("of one node" in a for a in row.assumptions)
    assert row.scaling_efficiency is not None and 0 < row.scaling_efficiency <= 1
    (eight,) = wg.predict("llama-3.1-8b", gpus=["h100-sxm"], gpu_count=8, sharding="fsdp")
    assert not any("nodes of 8" in a for a in eight.assumptions)


def test_predict_cli_across_nodes_on_a_named_fabric() -> None:
    result = run_cli(
        "predict", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "16", "--sharding", "fsdp",
        "--network", "ib-hdr", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["n_gpus"] == 16 and row["run"]["network"] == "ib-hdr"
    assert row["link"].startswith("2 x 8 over ib-hdr (200 Gb/s per GPU)")
    assert any("InfiniBand HDR (ib-hdr): 200 Gb/s" in a for a in row["assumptions"])


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


# --- HSDP: FSDP within each node, replicas across nodes -----------------------------------


def test_hsdp_shards_within_one_node_and_is_fsdp_on_one_node() -> None:
    assert shard_group(64, "hsdp") == 8 and shard_group(4, "hsdp") == 4
    assert shard_group(64, "fsdp") == 64
    assert memory_parallel(64, "hsdp").gpus == 8
    h100 = load_catalog().resolve("h100-sxm")
    assert h100 is not None
    one_node = [
        data_parallel_step(1.0, 0.6, 16 * GB, 32 * GB, h100, 8, how) for how in ("fsdp", "hsdp")
    ]
    assert one_node[0].step_time_s == one_node[1].step_time_s


def test_hsdp_across_nodes_all_reduces_the_shards_over_the_nics_behind_backward() -> None:
    h100 = load_catalog().resolve("h100-sxm")
    assert h100 is not None
    data = load_links()
    grads, params = 16 * GB, 16 * GB
    step = data_parallel_step(1.0, 0.6, grads, params, h100, 64, "hsdp", data)
    nic = get_fabric(None, data).bytes_per_s_per_gpu * data.bus_efficiency["network"]
    between = 2 * 7 / 8 * (grads / 8) / nic  # 8 replicas, each GPU's 1/8 shard
    inside = exchange_bytes(grads, params, 8, "hsdp") / gpu_link(h100, 8, data).bus_bytes_per_s
    assert step.exchange_s == pytest.approx(inside + between)
    assert "8 x 8" in step.link.description and "ib-ndr" in step.link.description
    # a backward too short for the shards' all-reduce: the rest adds to the step
    short = data_parallel_step(1.0, 0.01, grads, params, h100, 64, "hsdp", data)
    assert short.exposed_s == pytest.approx(between - 0.01)
    # a slower fabric exposes more
    hdr = data_parallel_step(1.0, 0.01, grads, params, h100, 64, "hsdp", data, "ib-hdr")
    assert hdr.exposed_s > short.exposed_s


def test_hsdp_holds_an_eight_gpu_fsdp_share_and_steps_an_eighth_of_the_optimizer() -> None:
    ask = {"gpus": ["h100-sxm"], "seq_len": 2048, "batch_size": 2}
    (fsdp8,) = wg.fit("llama-3.2-1b", gpu_count=8, sharding="fsdp", **ask)
    (hsdp64,) = wg.fit("llama-3.2-1b", gpu_count=64, sharding="hsdp", **ask)
    (fsdp64,) = wg.fit("llama-3.2-1b", gpu_count=64, sharding="fsdp", **ask)
    assert hsdp64.peak_allocated_bytes == fsdp8.peak_allocated_bytes
    assert hsdp64.peak_allocated_bytes > fsdp64.peak_allocated_bytes
    assert any("HYBRID_SHARD" in a for a in hsdp64.assumptions)
    (fast,) = wg.predict("llama-3.2-1b", gpu_count=64, sharding="fsdp", **ask)
    (hybrid,) = wg.predict("llama-3.2-1b", gpu_count=64, sharding="hsdp", **ask)
    assert hybrid.link is not None and "replicas' all-reduce" in hybrid.link
    assert hybrid.throughput is not None and fast.throughput is not None
    assert hybrid.throughput < fast.throughput  # a larger optimizer shard, a second link
