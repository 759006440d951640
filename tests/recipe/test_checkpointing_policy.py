"""Activation checkpointing policies: full, every-N layers, selective (per operator)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.estimate.profile_summary import live_peak
from whichgpu.profiles.stored import profile_key
from whichgpu.recipe.training import _saves_output, selective_policy
from whichgpu.schema import RunConfig, StepProfile
from whichgpu.trace.step import trace_step
from whichgpu.workloads.base import enable_checkpointing
from whichgpu.workloads.run_config import run_config
from whichgpu.workloads.user import config_workload

TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
"""Two decoder layers: ``every-2`` checkpoints the first of them."""

POLICIES: dict[str, dict[str, Any]] = {
    "none": {},
    "full": {"checkpointing": True},
    "every-2": {"checkpointing_policy": "every-2"},
    "selective": {"checkpointing_policy": "selective"},
}


@pytest.fixture(scope="module")
def traces() -> dict[str, StepProfile]:
    workload = config_workload(TINY_LLAMA)
    return {
        name: trace_step(workload, run_config(batch_size=2, seq_len=64, **options))
        for name, options in POLICIES.items()
    }


def _backward_ops(profile: StepProfile) -> Counter[str]:
    return Counter(op.name for op in profile.ops if op.phase == "backward")


def test_live_peak_orders_by_what_is_kept(traces: dict[str, StepProfile]) -> None:
    peak = {name: live_peak(profile)[0] for name, profile in traces.items()}
    assert peak["none"] > peak["every-2"] > peak["full"]
    assert peak["none"] > peak["selective"] > peak["full"]


def test_recompute_shows_as_forward_ops_in_the_backward(traces: dict[str, StepProfile]) -> None:
    ops = {name: _backward_ops(profile) for name, profile in traces.items()}
    # the RMSNorm's rsqrt runs in the forward only: in the backward it is a recomputation
    assert ops["none"]["aten.rsqrt"] == 0
    assert ops["full"]["aten.rsqrt"] > ops["every-2"]["aten.rsqrt"] > 0
    assert ops["selective"]["aten.rsqrt"] == ops["full"]["aten.rsqrt"]
    # full recomputes the matrix multiplications and attention; selective keeps their outputs
    assert ops["full"]["aten.mm"] > ops["every-2"]["aten.mm"] > ops["none"]["aten.mm"]
    # selective recomputes every second matrix product of a layer (torchtitan's op mode): of
    # each layer's seven (q, k, v, o, gate, up, down) k, o and up, in both layers
    assert ops["selective"]["aten.mm"] == ops["none"]["aten.mm"] + 2 * 3
    attention = "aten._scaled_dot_product_flash_attention_for_cpu"
    assert ops["full"][attention] == 2 and ops["every-2"][attention] == 1
    assert ops["selective"][attention] == 0
    flops = {name: profile.flops_per_step for name, profile in traces.items()}
    assert flops["full"] > flops["every-2"] > flops["none"]
    assert flops["full"] > flops["selective"] > flops["none"]  # three products recomputed
    traffic = {name: profile.bytes_per_step for name, profile in traces.items()}
    assert traffic["full"] > traffic["selective"] > traffic["none"]


def test_selective_keeps_matmuls_and_attention() -> None:
    assert _saves_output("mm") and _saves_output("addmm")
    assert _saves_output("_scaled_dot_product_efficient_attention")
    assert not _saves_output("mul") and not _saves_output("mm_backward")


def test_selective_keeps_every_other_matrix_product_in_each_pass() -> None:
    from types import SimpleNamespace

    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    policy = selective_policy()
    layer = [aten.mm.default, aten.mul.Tensor, aten.mm.default, aten.addmm.default]
    layer += [aten._scaled_dot_product_efficient_attention.default, aten.mm.default]
    for recompute in (False, True):  # the recomputation counts apart and picks the same
        ctx = SimpleNamespace(is_recompute=recompute)
        saved = [policy(ctx, op) == CheckpointPolicy.MUST_SAVE for op in layer]
        assert saved == [True, False, False, True, True, False]
    # each checkpointed call gets a policy of its own: the count starts again
    assert selective_policy()(SimpleNamespace(is_recompute=False), aten.mm.default) == (
        CheckpointPolicy.MUST_SAVE
    )


def test_a_policy_turns_checkpointing_on() -> None:
    run = run_config(checkpointing_policy="every-2")
    assert run.checkpointing and run.checkpointing_every_layers() == 2
    assert run_config(checkpointing_policy=" Selective ").checkpointing_policy == "selective"
    assert run_config(checkpointing_policy="every-1").checkpointing_policy == "full"
    # any policy given alone turns it on, "full" too (it once did not: --checkpointing-policy
    # full measured and estimated a step without checkpointing); turned off, full stays off
    assert run_config(checkpointing_policy="full").checkpointing is True
    assert run_config(checkpointing=False, checkpointing_policy="full").checkpointing is False
    assert run_config(checkpointing=True).checkpointing_every_layers() == 1
    assert run_config().checkpointing_every_layers() is None
    assert "every 2nd layer" in run.describe()
    assert "every 3rd layer" in run_config(checkpointing_policy="every-3").describe()
    assert "--checkpointing-policy full" in " ".join(run.memory_levers())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"checkpointing_policy": "every-0"}, "is not a policy: use full"),
        ({"checkpointing_policy": "layers"}, "is not a policy: use full"),
        (
            {"checkpointing_policy": "selective", "checkpointing": False},
            "needs checkpointing, which was turned off",
        ),
        (
            {"checkpointing_policy": "every-2", "mode": "inference"},
            "checkpointing_policy saves memory in training only",
        ),
    ],
)
def test_policy_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        run_config(**options)
    assert caught.value.field == "checkpointing_policy"


def test_validate_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="checkpointing_policy"):
        RunConfig.model_validate({"checkpointing": True, "checkpointing_policy": "some"})


def test_profile_key_names_a_policy_other_than_full() -> None:
    base = profile_key("gpt2", run_config())
    full = profile_key("gpt2", run_config(checkpointing=True))
    assert full == base + "_ckpt"
    assert profile_key("gpt2", run_config(checkpointing_policy="full")) == full
    assert profile_key("gpt2", run_config(checkpointing_policy="every-1")) == full
    assert profile_key("gpt2", run_config(checkpointing_policy="every-2")) == base + "_ckptevery2"
    assert profile_key("gpt2", run_config(checkpointing_policy="selective")) == (
        base + "_ckptselective"
    )


def test_a_model_without_a_policy_switch_is_refused() -> None:
    class OwnBlocks:
        def gradient_checkpointing_enable(
            self, gradient_checkpointing_kwargs: dict[str, Any] | None = None
        ) -> None:
            self.kwargs = gradient_checkpointing_kwargs

    model = OwnBlocks()
    enable_checkpointing(model, use_reentrant=False)  # full: the model's own way
    assert model.kwargs == {"use_reentrant": False}
    with pytest.raises(UnsupportedWorkload, match="--checkpointing-policy full"):
        enable_checkpointing(model, 2, use_reentrant=False)


def test_cli_profile_with_a_policy() -> None:
    def peak(*policy: str) -> int:
        result = run_cli(
            "profile",
            "--config",
            str(TINY_LLAMA),
            "--batch-size",
            "2",
            "--seq-len",
            "64",
            *policy,
            "--json",
        )
        assert result.returncode == 0, result.stderr
        value: int = json.loads(result.stdout)["peak_live_bytes"]
        return value

    assert peak() > peak("--checkpointing-policy", "every-2") > peak("--checkpointing")
    result = run_cli("profile", "--config", str(TINY_LLAMA), "--checkpointing-policy", "most")
    assert result.returncode == 2
    assert "--checkpointing-policy 'most' is not a policy" in result.stderr
