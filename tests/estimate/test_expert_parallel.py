"""Expert parallel (``--expert-parallel E``, ``whichgpu.estimate.expert_parallel``): a mixture of
experts' routed experts spread over E data-parallel copies; what each GPU holds, what it sends,
and what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit, predict
from whichgpu.catalog import load_catalog
from whichgpu.errors import NotSplittable, UsageError
from whichgpu.estimate.expert_parallel import (
    all_to_all,
    exchange_share,
    experts_of,
    plan_refusal,
)
from whichgpu.workloads import run_config
from whichgpu.workloads.hf import read_config

TINY_MIXTRAL = Path(__file__).parents[1] / "fixtures" / "tiny-mixtral.json"
# tiny-mixtral: 2 layers of hidden 64, 4 experts of 3 x 64 x 128 each, top 2; vocabulary 512
EXPERT_PARAMS = 2 * 4 * 3 * 64 * 128
ATTENTION = 64 * 64 * 2 + 64 * 32 * 2  # q, o; k, v (2 key/value heads of 16)
PARAMS = 2 * 512 * 64 + 2 * (ATTENTION + EXPERT_PARAMS // 2 + 64 * 4 + 2 * 64) + 64
SIZES = {"batch_size": 2, "seq_len": 64, "gpu_count": 8, "sharding": "zero1"}


def test_the_experts_of_a_config() -> None:
    mixtral = experts_of(read_config("mixtral-8x7b"))
    assert mixtral is not None
    assert (mixtral.layers, mixtral.experts, mixtral.per_token, mixtral.hidden) == (32, 8, 2, 4096)
    assert mixtral.parameters == 32 * 8 * 3 * 4096 * 14336  # 45.1 B of Mixtral's 46.7 B
    assert mixtral.dispatch_bytes_per_token() == 2 * 4096 * 2
    assert experts_of(read_config("llama-3.1-8b")) is None
    tiny = experts_of(json.loads(TINY_MIXTRAL.read_text()))
    assert tiny is not None and tiny.parameters == EXPERT_PARAMS
    assert tiny.fraction(PARAMS) == pytest.approx(EXPERT_PARAMS / PARAMS)


def test_plans_refused_with_the_reason() -> None:
    mixtral = read_config("mixtral-8x7b")
    assert plan_refusal(mixtral, run_config(gpus=64, expert_parallel=8)) is None
    why = plan_refusal(mixtral, run_config(gpus=48, expert_parallel=3))
    assert why is not None and "8 experts a layer" in why and "2, 4, 8" in why
    dense = plan_refusal(read_config("llama-3.1-8b"), run_config(gpus=8, expert_parallel=2))
    assert dense is not None and "has none" in dense
    with pytest.raises(NotSplittable, match="has none"):
        fit("llama-3.1-8b", gpus=["h100-sxm"], gpu_count=8, expert_parallel=2, seq_len=512)
    with pytest.raises(NotSplittable, match="the run has 6"):
        run_config(gpus=6, expert_parallel=4)
    with pytest.raises(UsageError, match="tensor_parallel"):
        run_config(gpus=8, tensor_parallel=2, expert_parallel=2)
    with pytest.raises(UsageError, match="hsdp"):
        run_config(gpus=16, sharding="hsdp", expert_parallel=2)
    with pytest.raises(UsageError, match="splits a training run"):
        run_config(mode="inference", gpus=2, expert_parallel=2)


def test_each_gpu_holds_its_share_of_what_it_holds_whole() -> None:
    """ZeRO-1: the 16-bit weights and gradients are whole on every GPU, so expert parallel
    cuts them to (1 - f) + f / E of the model; the optimizer state is a 1/N shard with or
    without it (the experts' over the copies that hold them: (f / E) / (N / E) = f / N)."""
    one, two, four = (
        fit(config=TINY_MIXTRAL, gpus=["h100-sxm"], expert_parallel=e, **SIZES)[0]
        for e in (1, 2, 4)
    )
    f = EXPERT_PARAMS / PARAMS
    working = 2 * PARAMS  # the 16-bit parameters
    for estimate, e in ((two, 2), (four, 4)):
        held = working - (one.breakdown["weights"] - estimate.breakdown["weights"])
        assert held == pytest.approx(working * (1 - f + f / e), rel=0.01)
        assert estimate.breakdown["optimizer"] == one.breakdown["optimizer"]
        assert estimate.breakdown["gradients"] < one.breakdown["gradients"]
        assert estimate.overheads["expert_parallel_dispatch"] > 0
        assert "expert parallel" in estimate.run.describe()
    assert "expert_parallel_dispatch" not in one.overheads
    # FSDP shards everything 1/N already: the state held is the same, the gathered layers less
    sharded = {**SIZES, "sharding": "fsdp"}
    plain = fit(config=TINY_MIXTRAL, gpus=["h100-sxm"], **sharded)[0]
    split = fit(config=TINY_MIXTRAL, gpus=["h100-sxm"], expert_parallel=4, **sharded)[0]
    assert split.breakdown["optimizer"] == plain.breakdown["optimizer"]
    assert split.peak_allocated_bytes < plain.peak_allocated_bytes


def test_exchange_share() -> None:
    # Mixtral on 64 copies, EP8: 3 % of the gradients among 64, 97 % / 8 among 8
    f = 0.966
    expected = ((1 - f) * 63 / 64 + f / 8 * 7 / 8) / (63 / 64)
    assert exchange_share(f, 8, 64) == pytest.approx(expected)
    assert exchange_share(f, 8, 8) == pytest.approx(1 - f)  # each copy holds its own experts
    assert exchange_share(f, 1, 64) == 1.0


def test_the_all_to_alls_of_a_step() -> None:
    """Four a layer and micro-batch (dispatch and combine, forward and backward), six where
    the layer is recomputed; each sends (E - 1) / E of the tokens' trips; NVLink within a
    node, the NIC beyond it."""
    mixtral = experts_of(read_config("mixtral-8x7b"))
    assert mixtral is not None
    h100 = load_catalog().resolve("h100-sxm")
    run = run_config(gpus=64, expert_parallel=8, grad_accum=2, batch_size=2, seq_len=4096)
    moved = all_to_all(run, h100, mixtral, tokens=8192, recomputed_share=0.0)
    assert moved.count == 4
    assert moved.bytes_each == 8192 * 2 * 4096 * 2 * 7 / 8
    assert "nvlink" in moved.link.lower()
    again = all_to_all(run, h100, mixtral, tokens=8192, recomputed_share=1.0)
    assert again.count == 6 and again.step_s == pytest.approx(moved.step_s * 1.5)
    wide = run_config(gpus=128, expert_parallel=16, batch_size=2, seq_len=4096)
    across = all_to_all(wide, h100, mixtral, tokens=8192, recomputed_share=0.0)
    assert "ib-ndr" in across.link and across.step_s > moved.step_s / 2


def test_predict_adds_the_all_to_alls_and_reduces_less() -> None:
    asked = {**SIZES, "gpu_count": 16, "network": None}
    plain = predict(config=TINY_MIXTRAL, gpus=["h100-sxm"], **asked)[0]
    split = predict(config=TINY_MIXTRAL, gpus=["h100-sxm"], expert_parallel=4, **asked)[0]
    assert plain.step_time_s and split.step_time_s
    note = next(a for a in split.assumptions if a.startswith("expert parallel 4"))
    assert "all-to-all" in note and "4 copies that hold the same ones" in note
    assert not any(a.startswith("expert parallel") for a in plain.assumptions)


def test_cli() -> None:
    result = run_cli(
        *("fit", "--config", str(TINY_MIXTRAL), "--gpu", "h100-sxm", "--gpus", "8"),
        *("--batch-size", "2", "--seq-len", "64", "--expert-parallel", "4", "--json"),
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["run"]["expert_parallel"] == 4
    refused = run_cli(
        *("fit", "--config", str(TINY_MIXTRAL), "--gpu", "h100-sxm", "--gpus", "8"),
        *("--expert-parallel", "3"),
    )
    assert refused.returncode != 0 and "--expert-parallel 3" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_fit_suggests_expert_parallel_for_a_mixture_of_experts_held_whole() -> None:
    """Where a mixture of experts does not fit with every expert on every GPU, ``fit`` names
    ``--expert-parallel`` among the levers (not for a dense model, nor where FSDP shards the
    experts already); the result says how many experts a layer has."""
    tight = {**SIZES, "gpu_count": 2, "sharding": "ddp", "batch_size": 8, "seq_len": 256}
    (estimate,) = fit(config=TINY_MIXTRAL, gpus=["h100-sxm"], **tight)
    assert estimate.experts_per_layer == 4
    (dense,) = fit("llama-3.2-1b", gpus=["h100-sxm"], seq_len=512, batch_size=1)
    assert dense.experts_per_layer is None
    asked = ("fit", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "512")
    whole = run_cli(*asked, "--batch-size", "1")
    assert whole.returncode == 0, whole.stderr
    text = " ".join(whole.stdout.split())
    assert "Nothing fits as asked" in text and "--expert-parallel E with --gpus a multiple" in text
    sharded = run_cli(*asked, "--batch-size", "1", "--sharding", "fsdp")
    assert "Nothing fits as asked" in sharded.stdout and "--expert-parallel" not in sharded.stdout
