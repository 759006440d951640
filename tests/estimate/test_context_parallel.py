"""Context-parallel training: each GPU's share of the sequence in memory and time, the ring of
keys and values, and what is refused."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit, predict
from whichgpu.catalog import load_catalog
from whichgpu.errors import NotSplittable, UsageError
from whichgpu.estimate.data_parallel import gpu_link, load_links, run_parallel
from whichgpu.estimate.memory import CONTEXT_RING_CHUNKS
from whichgpu.estimate.model_parallel import context_ring, model_parallel_step, plan_refusal
from whichgpu.estimate.sharding import Parallel, make_plan
from whichgpu.workloads import run_config
from whichgpu.workloads.hf import read_config

SIZES = [1000, *[100, 200] * 8, 8, 1000]
BASE = {"gpus": ["h100-sxm"], "batch_size": 2, "seq_len": 2048}


@pytest.fixture(scope="module")
def h100():  # type: ignore[no-untyped-def]
    return load_catalog().resolve("h100-sxm")


def test_each_gpu_holds_its_share_of_the_activations_and_the_whole_state() -> None:
    plan = make_plan(Parallel(2, "ddp", context=2), SIZES, SIZES, 1)
    assert plan.activation_share == pytest.approx(0.5) and plan.state_share == 1.0
    both = make_plan(Parallel(2, "ddp", tensor=2, context=4), SIZES, SIZES, 1)
    assert both.activation_share == pytest.approx(1 / 8) and both.state_share == 0.5
    assert any("context parallel over 4 GPUs" in a for a in both.assumptions)
    # the GPUs of a ring reduce the same gradients, so ZeRO and FSDP shard over them too
    run = run_config(gpus=8, context_parallel=4, sharding="fsdp")
    assert (run.data_parallel(), run.state_group()) == (2, 8)
    assert run_parallel(run).gpus == 8 and run_parallel(run).context == 4


def test_context_parallel_halves_a_gpus_activations_not_its_state() -> None:
    # beside two data-parallel GPUs, which hold the same model state (the same DDP buckets,
    # the same FSDP shards): per sequence, half the activations, so twice the batch
    options = {"gpus": ["h100-sxm"], "seq_len": 2048, "gpu_count": 2}
    for sharding in ("ddp", "fsdp"):
        (dp,) = fit("llama-3.2-1b", sharding=sharding, **options)
        (cp,) = fit("llama-3.2-1b", sharding=sharding, context_parallel=2, **options)
        for category in ("weights", "gradients", "optimizer"):
            assert cp.breakdown[category] == dp.breakdown[category], (sharding, category)
        per_sample = cp.breakdown["activations"] / cp.max_batch_size
        assert per_sample == pytest.approx(
            dp.breakdown["activations"] / dp.max_batch_size / 2, rel=0.02
        )
        assert cp.max_batch_size >= 2 * dp.max_batch_size
    (one,) = fit("llama-3.2-1b", **BASE)
    (cp,) = fit("llama-3.2-1b", gpu_count=2, context_parallel=2, **BASE)
    # the keys and values passing around the ring are counted, beside the step's share
    ring = cp.overheads["context_parallel_ring"]
    assert "context_parallel_ring" not in one.overheads
    assert any("passing around the ring are counted" in a for a in cp.assumptions)
    (wider,) = fit("llama-3.2-1b", gpu_count=4, context_parallel=4, **BASE)
    assert wider.overheads["context_parallel_ring"] == pytest.approx(ring / 2, rel=0.01)
    (longer,) = fit("llama-3.2-1b", gpu_count=2, context_parallel=2, **{**BASE, "seq_len": 4096})
    assert longer.overheads["context_parallel_ring"] == pytest.approx(2 * ring, rel=0.01)


def test_the_ring_is_four_chunks_of_one_layers_keys_and_values() -> None:
    from whichgpu.api.step import prepare
    from whichgpu.workloads.registry import get_workload

    step = prepare(get_workload("llama-3.2-1b"), run_config(batch_size=2, seq_len=2048), None, None)
    config = read_config("llama-3.2-1b")
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    ring = step.memory.context_ring_bytes(2, 2048, 2)
    # the keys and values as the attention call takes them: transformers repeats a group's
    # heads before it, so between the model's key/value heads and its query heads
    chunk = lambda heads: 2 * 2 * heads * 2048 * head_dim * 2 // 2  # noqa: E731
    low = CONTEXT_RING_CHUNKS * chunk(config["num_key_value_heads"])
    high = CONTEXT_RING_CHUNKS * chunk(config["num_attention_heads"])
    assert low <= ring <= high + CONTEXT_RING_CHUNKS * 2**21  # each chunk in 2 MiB segments
    assert step.memory.context_ring_bytes(2, 2048, 1) == 0
    # tensor parallel splits the heads too
    assert step.memory.context_ring_bytes(2, 2048, 2, tensor=2) < ring


def test_the_ring_hides_behind_attention_until_it_outlasts_it(h100) -> None:  # type: ignore[no-untyped-def]
    run = run_config(gpus=4, context_parallel=4)
    link = gpu_link(h100, 4)
    tokens, kv, layers = 8192, 2048, 16
    one_pass = 3 * tokens / 4 * kv / link.bus_bytes_per_s
    exposed = context_ring(run, h100, tokens, kv, layers, (0.0, 0.0))
    assert exposed.ring_s == pytest.approx(layers * 3 * one_pass)  # forward once, backward twice
    assert exposed.exposed_s == pytest.approx(exposed.ring_s) and exposed.hidden == 0.0
    hidden = context_ring(run, h100, tokens, kv, layers, (1.0, 2.0))
    assert hidden.exposed_s == 0.0 and hidden.hidden == 1.0
    recomputed = context_ring(
        run.model_copy(update={"checkpointing": True}), h100, tokens, kv, layers, (0.0, 0.0)
    )
    assert recomputed.ring_s == pytest.approx(layers * 4 * one_pass)  # the forward again
    # a ring wider than a node crosses the network at the GPU's own NIC
    wide = run_config(gpus=16, tensor_parallel=4, context_parallel=4)
    across = context_ring(wide, h100, tokens, kv, layers, (0.0, 0.0))
    data = load_links()
    nic = data.fabrics[data.default_fabric].bytes_per_s_per_gpu * data.bus_efficiency["network"]
    assert across.ring_s == pytest.approx(layers * 3 * 3 * tokens / 4 * kv / nic)
    step = model_parallel_step(
        1.0, run, h100, tokens=tokens, hidden_bytes_per_token=4096, layers=layers,
        kv_bytes_per_token=kv, attention_s=(0.0, 0.0),
    )  # fmt: skip
    assert step.context_s == pytest.approx(exposed.exposed_s) and step.tensor_s == 0.0


def test_predicted_speed_counts_one_sequence_over_the_ring() -> None:
    options = {**BASE, "grad_accum": 4}
    (one,) = predict("llama-3.2-1b", **options)
    (dp,) = predict("llama-3.2-1b", gpu_count=2, **options)
    (cp,) = predict("llama-3.2-1b", gpu_count=2, context_parallel=2, **options)
    assert one.throughput and dp.throughput and cp.throughput
    assert cp.global_batch_size == 2 * 4  # the two GPUs share each sequence
    assert dp.global_batch_size == 2 * 4 * 2
    # half the tokens each, but every kernel launched by both, and the ring: a little slower
    # than two GPUs on sequences of their own, faster than one
    assert one.throughput < cp.throughput <= dp.throughput
    assert cp.throughput > 0.8 * dp.throughput
    assert any("context parallel over 2 GPUs" in a for a in cp.assumptions)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"gpus": 6, "context_parallel": 4}, "not a multiple of 4"),
        ({"gpus": 2, "context_parallel": 2, "method": "lora"}, "--context-parallel"),
        ({"mode": "inference", "gpus": 2, "context_parallel": 2}, "splits a training run"),
        ({"gpus": 2, "context_parallel": 0}, "at least 1"),
    ],
)
def test_a_context_split_that_cannot_run_is_refused(options: dict, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UsageError) as info:
        run_config(**options)
    assert says in info.value.message_as(lambda f: "--" + f.replace("_", "-"))


def test_the_sequence_must_cut_into_two_chunks_a_gpu() -> None:
    config = read_config("llama-3.2-1b")
    assert plan_refusal(config, run_config(gpus=4, context_parallel=4, seq_len=2048)) is None
    why = plan_refusal(config, run_config(gpus=4, context_parallel=4, seq_len=2052)) or ""
    assert "8 equal chunks" in why and "degrees that do: 2" in why
    with pytest.raises(NotSplittable, match="8 equal chunks"):
        fit("llama-3.2-1b", gpus=["h100-sxm"], gpu_count=4, context_parallel=4, seq_len=2052)


def test_a_model_without_sequences_to_split_is_refused() -> None:
    with pytest.raises(NotSplittable, match="transformer language models"):
        fit("resnet50", gpus=["h100-sxm"], gpu_count=2, context_parallel=2, batch_size=8)


def test_a_context_parallel_run_traces_the_same_one_gpu_step() -> None:
    from whichgpu.workloads.profile_cache import traced_run

    assert traced_run(run_config(gpus=8, context_parallel=4)) == traced_run(run_config())


def test_cli_fit_and_predict_take_context_parallel() -> None:
    flags = ["--gpu", "h100-sxm", "--gpus", "4", "--context-parallel", "2"]
    flags += ["--batch-size", "2", "--seq-len", "2048"]
    done = run_cli("fit", "llama-3.2-1b", *flags, "--json", timeout_s=300)
    assert done.returncode == 0, done.stderr
    (estimate,) = json.loads(done.stdout)
    assert estimate["run"]["context_parallel"] == 2
    assert estimate["overheads"]["context_parallel_ring"] > 0
    done = run_cli("predict", "llama-3.2-1b", *flags, "--json", timeout_s=300)
    assert done.returncode == 0, done.stderr
    (speed,) = json.loads(done.stdout)
    assert speed["throughput"] > 0 and speed["global_batch_size"] == 2 * 2  # 2 copies
    refused = run_cli(
        "predict", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "4", "--context-parallel", "4",
        "--seq-len", "2052",
    )  # fmt: skip
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "8 equal chunks" in refused.stderr and "--context-parallel" in refused.stderr


def test_fit_suggests_context_parallel_where_the_sequence_fills_the_gpu() -> None:
    long = run_cli(
        "fit", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq-len", "32768", "--checkpointing"
    )
    assert long.returncode == 0, long.stderr
    assert "Nothing fits as asked" in long.stdout
    assert "--context-parallel C with --gpus C or more" in " ".join(long.stdout.split())
    # where the model state is most of it, the ring is no answer
    state = run_cli("fit", "llama-3.1-70b", "--gpu", "h100-sxm", "--seq-len", "2048")
    assert state.returncode == 0, state.stderr
    assert "Nothing fits as asked" in state.stdout and "--context-parallel" not in state.stdout
