"""The optimizer step in the backward pass (``--optimizer-impl in-backward``): each parameter
updated, and its gradient dropped, as soon as the gradient is accumulated; what the traced step
holds, the same step run for real by the bench, and the options it cannot run with."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import run_cli
from whichgpu.bench import CpuDevice, WorkloadRef
from whichgpu.bench.jobs import StepSpec
from whichgpu.bench.session import TorchSession
from whichgpu.errors import UsageError
from whichgpu.estimate.profile_summary import live_peak
from whichgpu.profiles.stored import profile_key
from whichgpu.recipe.training import InBackwardOptimizer, make_optimizer
from whichgpu.schema import RunConfig, StepProfile
from whichgpu.trace import trace_step
from whichgpu.workloads import get_workload, run_config

GPT2_PARAMETERS = 124_439_808
GPT2_EMBEDDING = 50257 * 768
"""The largest parameter: the token embedding, tied to the output projection."""
MLP = "tests/fixtures/user_model.py:build"


def _gpt2(impl: str) -> StepProfile:
    # activations this small leave the optimizer step (or, in-backward, the update of the
    # embedding at the end of the backward pass) the peak
    return trace_step(
        get_workload("gpt2"), RunConfig(batch_size=1, seq_len=64, optimizer_impl=impl)
    )


def test_gpt2_in_backward_never_holds_the_full_set_of_gradients() -> None:
    foreach, loop, in_backward = (_gpt2(i) for i in ("foreach", "for-loop", "in-backward"))
    gradients = 4 * GPT2_PARAMETERS  # fp32 gradients of fp32 parameters under AMP
    largest = 4 * GPT2_EMBEDDING  # the one gradient live while its parameter is updated
    assert not any(e.category == "gradient" for e in in_backward.events)
    peak, at_peak = live_peak(in_backward)
    assert "gradient" not in at_peak and at_peak["optimizer"] == 2 * gradients
    # the same per-parameter update as the loop, without the other parameters' gradients
    assert live_peak(loop)[0] - peak == gradients - largest
    # foreach also holds temporaries the size of all parameters
    assert live_peak(foreach)[0] - peak >= gradients - largest
    assert "adamw (in-backward)" in in_backward.run.describe()


def test_in_backward_updates_as_the_loop_does() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    other = copy.deepcopy(model)
    loop = make_optimizer(RunConfig(optimizer_impl="for-loop"), list(model.parameters()))
    in_backward = make_optimizer(RunConfig(optimizer_impl="in-backward"), list(other.parameters()))
    assert isinstance(in_backward, InBackwardOptimizer)
    for _ in range(3):
        batch = torch.randn(5, 8)
        model(batch).square().sum().backward()
        loop.step()
        loop.zero_grad(set_to_none=True)
        other(batch).square().sum().backward()
        assert all(p.grad is None for p in other.parameters())  # dropped in the backward
        in_backward.step()
        in_backward.zero_grad(set_to_none=True)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert set(in_backward.state) == set(other.parameters())


def test_the_bench_runs_it_on_the_cpu_as_the_tracer_traces_it() -> None:
    run = run_config(precision="bf16", batch_size=1, optimizer_impl="in-backward")
    ref = WorkloadRef.of(model=MLP)
    session = TorchSession(CpuDevice(), StepSpec(ref, run, 1, None), lambda event: None)
    peaks = session.memory_steps(2)
    model = session._eager
    assert all(p.grad is None for p in model.parameters())
    state = session._optimizer_state()
    assert len(state) == 3 * len(list(model.parameters()))  # step, exp_avg, exp_avg_sq
    traced = trace_step(ref.resolve(), run, kernels="cpu")
    assert not any(e.category == "gradient" for e in traced.events)
    assert peaks.allocated_bytes == live_peak(traced)[0]  # the same tensors, to the byte


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"grad_accum": 4}, "4 keeps the gradients across micro-steps"),
        ({"precision": "fp16"}, "GradScaler"),
        ({"gpus": 2}, "one GPU only"),
        ({"gpus": 4, "sharding": "zero2"}, "one GPU only"),
        ({"optimizer": "adamw-8bit"}, "bitsandbytes"),
        ({"mode": "inference"}, "applies to training"),
    ],
)
def test_options_it_cannot_run_with_are_refused(options: dict[str, object], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        run_config(optimizer_impl="in-backward", **options)


def test_it_takes_its_own_stored_profile_key_and_the_cli_takes_it() -> None:
    assert profile_key("gpt2", RunConfig()) == "gpt2_train_bf16_adamw"
    assert (
        profile_key("gpt2", RunConfig(optimizer_impl="in-backward"))
        == "gpt2_train_bf16_adamw_inbackward"
    )
    assert run_config(optimizer="sgd", optimizer_impl="in-backward").optimizer_impl == (
        "in-backward"
    )
    bad = run_cli(
        "fit", "gpt2", "--gpu", "h200-sxm", "--optimizer-impl", "in-backward", "--grad-accum", "2"
    )
    assert bad.returncode != 0 and "--grad-accum 2" in bad.stderr
