"""Tensor- and pipeline-parallel training: the split's memory, its step time, its refusals."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit, predict
from whichgpu.catalog import load_catalog
from whichgpu.errors import NotSplittable, UsageError
from whichgpu.estimate.data_parallel import load_links
from whichgpu.estimate.model_parallel import (
    data_parallel_link,
    model_parallel_note,
    model_parallel_step,
    plan_refusal,
)
from whichgpu.estimate.sharding import (
    Parallel,
    make_plan,
    model_parallel_sizes,
    rank_events,
    stage_share,
    stage_work_share,
)
from whichgpu.workloads import run_config
from whichgpu.workloads.hf import read_config

# a model of 8 repeated blocks (two tensors each) between an embedding and an output layer
EMBED, BLOCK_A, BLOCK_B, NORM, HEAD = 1000, 100, 200, 8, 1000
UNTIED = [EMBED, *[BLOCK_A, BLOCK_B] * 8, NORM, HEAD]
TIED = [EMBED, *[BLOCK_A, BLOCK_B] * 8, NORM]


def test_stage_share_puts_whole_layers_and_the_larger_end_on_the_heaviest_stage() -> None:
    # 4 stages of 2 layers (600 bytes); the output layer and the norm (1008) outweigh the
    # embedding (1000), so the last stage is the heaviest
    assert stage_share(UNTIED, 4) == pytest.approx((2 * 300 + 1008) / sum(UNTIED))
    # 3 stages: 3 layers on the fullest
    assert stage_share(UNTIED, 3) == pytest.approx((3 * 300 + 1008) / sum(UNTIED))
    # tied: the last stage keeps its copy of the embedding, as large as the first's
    assert stage_share(TIED, 4) == pytest.approx((2 * 300 + 1000) / sum(TIED))
    assert stage_share(UNTIED, 1) == 1.0
    assert stage_share([5, 7, 11], 2) == 1.0  # nothing repeats: nothing to split by layer


def test_the_last_stage_with_the_output_layer_sets_the_pipelines_pace() -> None:
    # work: 8 layers of 300 and the output layer (1000); the embedding's lookup does none
    assert stage_work_share(UNTIED, 4) == pytest.approx((2 * 300 + 1008) / (8 * 300 + 1008))
    # tied: the output product runs with the embedding's weights
    assert stage_work_share(TIED, 4) == pytest.approx((2 * 300 + 1000) / (8 * 300 + 1000))
    assert stage_work_share(UNTIED, 1) == 1.0
    assert stage_work_share(UNTIED, 4) > stage_share(UNTIED, 4)  # no lookup in the work


def test_one_gpu_of_the_split_holds_its_share_of_state_and_of_activations() -> None:
    plan = make_plan(Parallel(1, "ddp", tensor=2, pipeline=4), UNTIED, UNTIED, 1)
    assert plan.state_share == pytest.approx(stage_share(UNTIED, 4) / 2)
    assert plan.activation_share == pytest.approx(0.5)
    assert not plan.identity
    handles = [1, 2, 3, 4, 2, 3]
    sizes = [8000, 4096, 800, 1600, 4096, 800]
    allocs = [True, True, True, True, False, False]
    categories = ["parameter", "activation", "temporary", "temporary", "activation", "temporary"]
    phases = ["setup", "forward", "backward", "optimizer", "backward", "backward"]
    out = model_parallel_sizes(handles, sizes, allocs, categories, phases, plan)  # type: ignore[arg-type]
    share = plan.state_share
    assert out[0] == -(-round(8000 * share) // 8) * 8  # model state, padded to 8 bytes
    assert out[1] == 2048 and out[2] == 400  # activations and the passes' temporaries: 1/2
    assert out[3] == -(-round(1600 * share) // 8) * 8  # the optimizer's temporary: state
    assert out[4] == out[1] and out[5] == out[2]  # a free takes its allocation's size
    events = rank_events(handles, sizes, allocs, categories, phases, plan)  # type: ignore[arg-type]
    assert [e[1] for e in events] == out


def test_the_interleaved_schedule_keeps_more_activations_in_flight() -> None:
    plain = make_plan(Parallel(1, "ddp", tensor=1, pipeline=8), UNTIED, UNTIED, 1)
    interleaved = make_plan(Parallel(1, "ddp", tensor=1, pipeline=8, virtual=5), UNTIED, UNTIED, 1)
    assert plain.activation_share == 1.0
    assert interleaved.activation_share == pytest.approx(1 + 7 / 40)
    assert interleaved.state_share == plain.state_share


def test_data_parallel_copies_shard_what_the_split_leaves() -> None:
    split = make_plan(Parallel(4, "fsdp", tensor=2), UNTIED, UNTIED, 1)
    assert split.shard_parameters and split.state_share == pytest.approx(0.5)
    assert any("FSDP" in note for note in split.assumptions)


@pytest.fixture(scope="module")
def h100():  # type: ignore[no-untyped-def]
    return load_catalog().resolve("h100-sxm")


def test_tensor_parallel_halves_a_gpus_memory_and_pipeline_splits_its_state() -> None:
    def per_gpu(**split: int) -> dict[str, int]:
        (e,) = fit("llama-3.2-1b", gpus=["h100-sxm"], batch_size=4, seq_len=2048, **split)
        return e.breakdown

    one = per_gpu()
    tp = per_gpu(gpu_count=2, tensor_parallel=2)
    pp = per_gpu(gpu_count=2, pipeline_parallel=2, grad_accum=2)
    for category in ("weights", "optimizer", "activations"):
        assert tp[category] == pytest.approx(one[category] / 2, rel=0.02)
    # the model's own parameter sizes, as the memory model sees them
    share = stage_share(_llama_parameter_sizes(), 2)
    assert 0.5 < share < 0.75  # 8 of 16 layers and the tied embedding
    assert pp["optimizer"] == pytest.approx(one["optimizer"] * share, rel=0.02)
    # 1F1B: two micro-batches of half the layers on the first stage, one micro-batch's worth
    assert pp["activations"] == pytest.approx(one["activations"], rel=0.02)


def _llama_parameter_sizes() -> list[int]:
    from whichgpu.api.step import prepare
    from whichgpu.workloads.registry import get_workload

    chosen = get_workload("llama-3.2-1b")
    step = prepare(chosen, run_config(batch_size=4, seq_len=2048), None, None)
    return step.memory.state_sizes("parameter")


def test_pipeline_bubble_and_tensor_exchange_add_to_the_step(h100) -> None:  # type: ignore[no-untyped-def]
    run = run_config(gpus=8, tensor_parallel=2, pipeline_parallel=4, grad_accum=8)
    step = model_parallel_step(1.0, run, h100, tokens=4096, hidden_bytes_per_token=4096, layers=32)
    assert step.tensor_link is not None and step.tensor_link.kind == "nvswitch"
    # 4 exchanges a layer, 8 layers a stage, 8 micro-batches: 256 all-reduces of 16 MiB
    nbytes = 4096 * 4096
    one = max(nbytes / step.tensor_link.bus_bytes_per_s, load_links().all_reduce_floor_s)
    assert step.tensor_s == pytest.approx(8 * 4 * 8 * one)
    assert step.bubble_s == pytest.approx(3 * (1.0 + step.tensor_s / 8 + step.send_s / 8))
    interleaved = model_parallel_step(
        1.0,
        run.model_copy(update={"virtual_stages": 2}),
        h100,
        tokens=4096,
        hidden_bytes_per_token=4096,
        layers=32,
    )
    assert interleaved.send_s == pytest.approx(2 * step.send_s)
    assert interleaved.bubble_s < step.bubble_s / 2 + 1e-9 + step.send_s
    recomputed = model_parallel_step(
        1.0,
        run.model_copy(update={"checkpointing": True}),
        h100,
        tokens=4096,
        hidden_bytes_per_token=4096,
        layers=32,
    )
    assert recomputed.tensor_s == pytest.approx(step.tensor_s * 6 / 4)


def test_overlapped_tensor_exchanges_cost_only_what_outlasts_the_matrix_products(h100) -> None:  # type: ignore[no-untyped-def]
    run = run_config(gpus=8, tensor_parallel=2, pipeline_parallel=4, grad_accum=8)
    overlap = run.model_copy(update={"tensor_parallel_overlap": True})
    shape = {"tokens": 4096, "hidden_bytes_per_token": 4096, "layers": 32}
    plain = model_parallel_step(1.0, run, h100, **shape)
    # the matrix products of a stage's 8 layers take far longer than the exchanges: all hidden
    hidden = model_parallel_step(1.0, overlap, h100, **shape, gemm_s=1.0)
    assert hidden.tensor_s == 0.0 and plain.tensor_s > 0
    # products shorter than the exchanges: only the rest of each layer's is added
    per_layer = plain.tensor_s / 8 / 8  # 8 micro-batches, 8 layers a stage
    short = model_parallel_step(1.0, overlap, h100, **shape, gemm_s=8 * per_layer / 4)
    assert short.tensor_s == pytest.approx(plain.tensor_s * 3 / 4)
    assert short.bubble_s < plain.bubble_s
    assert "beside the layer's matrix products" in model_parallel_note(overlap, hidden, 0.5)
    assert "none of it hidden" in model_parallel_note(run, plain, 0.5)


def test_overlap_needs_tensor_parallel() -> None:
    with pytest.raises(UsageError) as info:
        run_config(gpus=8, tensor_parallel_overlap=True)
    from whichgpu.cli.output import error_message

    assert error_message(info.value).startswith("--tp-overlap overlaps tensor parallel's")
    assert "--tensor-parallel 2 or more" in error_message(info.value)


def test_predict_with_overlap_is_faster_by_the_exchanges_it_hides() -> None:
    options = {"gpus": ["h100-sxm"], "gpu_count": 4, "tensor_parallel": 4, "batch_size": 2}
    (plain,) = predict("llama-3.2-1b", seq_len=2048, **options)
    (overlap,) = predict("llama-3.2-1b", seq_len=2048, tensor_parallel_overlap=True, **options)
    assert plain.step_time_s and overlap.step_time_s and plain.throughput and overlap.throughput
    assert overlap.throughput > plain.throughput
    exchanged = plain.time_shares["exchange"] * plain.step_time_s
    assert plain.step_time_s - overlap.step_time_s <= exchanged + 1e-9
    assert any("beside the layer's matrix products" in a for a in overlap.assumptions)


def test_cli_predict_takes_the_overlap_and_refuses_it_without_a_split() -> None:
    flags = ["--gpu", "h100-sxm", "--gpus", "4", "--tensor-parallel", "4", "--batch-size", "2"]
    done = run_cli("predict", "llama-3.2-1b", *flags, "--tp-overlap", "--json", timeout_s=300)
    assert done.returncode == 0, done.stderr
    (speed,) = json.loads(done.stdout)
    assert speed["run"]["tensor_parallel_overlap"] is True
    refused = run_cli("predict", "llama-3.2-1b", "--gpu", "h100-sxm", "--tp-overlap")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "--tp-overlap" in refused.stderr and "--tensor-parallel 2 or more" in refused.stderr


def test_copies_exchange_inside_a_node_until_the_split_fills_it(h100) -> None:  # type: ignore[no-untyped-def]
    inside = data_parallel_link(h100, run_config(gpus=8, tensor_parallel=2))
    assert inside.kind == "nvswitch"
    across = data_parallel_link(
        h100, run_config(gpus=64, tensor_parallel=8, pipeline_parallel=4, grad_accum=4)
    )
    fabric = load_links().fabrics[load_links().default_fabric]
    assert across.kind == "network"
    # one GPU of each copy's ring per node: one NIC carries it
    assert across.bus_bytes_per_s == pytest.approx(
        fabric.bytes_per_s_per_gpu * load_links().bus_efficiency["network"]
    )


def test_predicted_speed_counts_the_copies_and_names_the_bubble() -> None:
    base = {"gpus": ["h100-sxm"], "batch_size": 4, "seq_len": 2048, "grad_accum": 8}
    (dp,) = predict("llama-3.2-1b", gpu_count=2, **base)
    (pp,) = predict("llama-3.2-1b", gpu_count=2, pipeline_parallel=2, **base)
    assert pp.throughput is not None and dp.throughput is not None
    assert pp.throughput < dp.throughput  # one copy, not two; and it idles
    bubble = pp.time_shares["bubble"]
    assert bubble == pytest.approx(1 / 9, rel=0.25)  # (p-1) of m+p-1 micro-batch times
    assert pp.global_batch_size == 4 * 8  # one copy
    assert dp.global_batch_size == 4 * 8 * 2
    assert any("1F1B over 8 micro-batches" in a for a in pp.assumptions)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"gpus": 6, "tensor_parallel": 4}, "not a multiple of 4"),
        ({"gpus": 4, "pipeline_parallel": 4}, "at least one micro-batch per stage"),
        (
            {"gpus": 4, "pipeline_parallel": 2, "grad_accum": 3, "virtual_stages": 2},
            "a multiple of 2",
        ),
        ({"gpus": 2, "virtual_stages": 2}, "interleaves a pipeline"),
        ({"gpus": 2, "tensor_parallel": 2, "method": "lora"}, "full training only"),
        ({"gpus": 2, "tensor_parallel": 2, "optimizer": "adamw-8bit"}, "8-bit"),
        ({"mode": "inference", "gpus": 2, "tensor_parallel": 2}, "tensor parallel across them"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_with_the_reason(options: dict, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UsageError, match=says):
        run_config(**options)


def test_a_split_without_a_count_is_one_copy() -> None:
    run = run_config(tensor_parallel=2, pipeline_parallel=2, grad_accum=2)
    assert run.gpus == 4 and run.data_parallel() == 1
    assert "tensor parallel 2 x pipeline parallel 2" in run.describe()


def test_the_models_shape_must_allow_the_split() -> None:
    config = read_config("llama-3.2-1b")  # 32 heads, 8 KV heads, 16 layers
    assert plan_refusal(config, run_config(gpus=16, tensor_parallel=16)) is not None
    assert "do not split evenly" in (
        plan_refusal(config, run_config(gpus=3, tensor_parallel=3)) or ""
    )
    assert "the model has 16" in (
        plan_refusal(config, run_config(gpus=32, pipeline_parallel=32, grad_accum=32)) or ""
    )
    assert plan_refusal(config, run_config(gpus=8, tensor_parallel=8)) is None


def test_a_model_without_layers_to_split_is_refused() -> None:
    with pytest.raises(NotSplittable, match="transformer language models"):
        fit("resnet50", gpus=["h100-sxm"], gpu_count=2, tensor_parallel=2, batch_size=8)


def test_cli_fit_and_predict_take_the_split() -> None:
    flags = ["--gpu", "h100-sxm", "--gpus", "4", "--tensor-parallel", "2"]
    flags += ["--pipeline-parallel", "2", "--grad-accum", "4", "--batch-size", "2"]
    done = run_cli("fit", "llama-3.2-1b", *flags, "--json", timeout_s=300)
    assert done.returncode == 0, done.stderr
    (estimate,) = json.loads(done.stdout)
    assert estimate["run"]["tensor_parallel"] == 2 and estimate["run"]["pipeline_parallel"] == 2
    assert any("pipeline parallel in 2 stages" in a for a in estimate["assumptions"])
    refused = run_cli(
        "predict", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "3", "--tensor-parallel", "3"
    )
    assert refused.returncode != 0
    assert "do not split evenly over 3 GPUs" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_report_on_a_split_model_shows_the_gpus_together() -> None:
    from whichgpu.api import report
    from whichgpu.report.html import render_html

    data = report(
        "llama-3.2-1b",
        gpus=["h100-sxm", "a100-sxm4-80gb"],
        gpu_count=4,
        tensor_parallel=2,
        grad_accum=2,
        batch_size=2,
        acquire="rent",
    )
    assert data.run.tensor_parallel == 2 and data.run.data_parallel() == 2
    (fastest, *_) = data.speeds
    (predicted,) = [e for e in data.throughput if e.gpu == fastest.gpu]
    assert predicted.n_gpus == 4  # the GPUs together, not one GPU's share
    assert fastest.throughput == pytest.approx(predicted.throughput)
    page = render_html(data)
    assert "Throughput of the 4 GPUs together (tensor parallel 2)" in page
    assert "2 copies data parallel" in page
    assert any("each GPU's share of the 4 GPUs' speed" in n for n in data.notes)


def test_bench_refuses_a_split_it_cannot_run() -> None:
    from whichgpu.api import bench

    with pytest.raises(UsageError, match="bench measures one GPU"):
        bench("llama-3.2-1b", gpu_count=2, tensor_parallel=2, device="cpu")


def test_an_nvlink_domain_larger_than_a_node_keeps_the_exchange_on_nvlink() -> None:
    from whichgpu.estimate.data_parallel import gpu_link, link_domain, network_note

    catalog = load_catalog()
    gb200, h100 = catalog.resolve("gb200"), catalog.resolve("h100-sxm")
    assert link_domain(gb200) == 72 and link_domain(h100) == 8
    assert gpu_link(gb200, 64).kind == "nvswitch"
    assert gpu_link(gb200, 144).kind == "network"  # two racks: the network between them
    assert gpu_link(h100, 64).kind == "network"
    assert "72-GPU NVLink domain" in network_note(64, None, gpu=gb200)
    assert "nodes of 8" in network_note(64, None, gpu=h100)
    split = run_config(gpus=64, tensor_parallel=2, pipeline_parallel=4, grad_accum=8)
    assert data_parallel_link(gb200, split).kind == "nvswitch"
    assert data_parallel_link(h100, split).kind == "network"


def test_a_split_traces_the_same_one_gpu_step() -> None:
    from whichgpu.workloads.profile_cache import traced_run

    split = run_config(gpus=8, tensor_parallel=2, pipeline_parallel=2, grad_accum=4)
    assert traced_run(split) == traced_run(run_config(grad_accum=4))


def test_hsdp_shards_over_the_copies_that_share_a_node(h100) -> None:  # type: ignore[no-untyped-def]
    from whichgpu.estimate.data_parallel import data_parallel_step, run_parallel, shard_group

    run = run_config(gpus=32, tensor_parallel=2, sharding="hsdp")  # 16 copies, 4 per node
    assert shard_group(run.data_parallel(), "hsdp", tensor=2) == 4
    assert run_parallel(run).gpus == 4
    step = data_parallel_step(1.0, 0.5, 8 * 2**30, 8 * 2**30, h100, 16, "hsdp", tensor=2)
    assert step.link.description.startswith("4 x 4:")  # 4 replicas of 4-GPU shard groups
    (one,) = fit(
        "llama-3.2-1b",
        gpus=["h100-sxm"],
        batch_size=2,
        **run.model_dump(include={"tensor_parallel", "sharding"}),
        gpu_count=32,
    )
    (flat,) = fit(
        "llama-3.2-1b",
        gpus=["h100-sxm"],
        batch_size=2,
        tensor_parallel=2,
        sharding="fsdp",
        gpu_count=8,  # 4 copies: FSDP over the same 4 as each node's shard group
    )
    assert one.breakdown["optimizer"] == flat.breakdown["optimizer"]
