"""The training step's optimizer implementation and loss kernel: what each changes in the traced
step, and the options that do not go together."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.estimate.profile_summary import live_peak
from whichgpu.profiles.stored import profile_key
from whichgpu.schema import RunConfig, StepProfile
from whichgpu.trace import trace_step
from whichgpu.workloads import get_workload, run_config

BATCH, SEQ = 4, 256
GPT2_VOCAB = 50257
GPT2_PARAMETERS = 124_439_808


def _gpt2(batch: int = BATCH, seq: int = SEQ, **options: str) -> StepProfile:
    return trace_step(get_workload("gpt2"), RunConfig(batch_size=batch, seq_len=seq, **options))


@pytest.mark.parametrize("impl", ["for-loop", "fused"])
def test_optimizer_without_foreach_has_no_temporaries_the_size_of_all_parameters(
    impl: str,
) -> None:
    # foreach AdamW's sqrt(exp_avg_sq) is one list of tensors as large as all parameters; a loop
    # holds one parameter's at a time; the fused kernel none of that size
    default = _gpt2(1, 64)  # activations this small leave the optimizer step the peak
    params_bytes = sum(
        e.size_bytes for e in default.events if e.alloc and e.category == "parameter"
    )
    other = _gpt2(1, 64, optimizer_impl=impl)
    (peak, at_peak), (other_peak, other_at_peak) = live_peak(default), live_peak(other)
    assert at_peak["temporary"] >= params_bytes  # the step's peak is the foreach update
    assert other_at_peak["temporary"] < params_bytes
    assert other_peak < peak


def test_fused_cross_entropy_keeps_no_fp32_copy_of_the_logits() -> None:
    logits_fp32 = BATCH * SEQ * GPT2_VOCAB * 4
    eager, fused = _gpt2(), _gpt2(loss_kernel="fused")

    def fp32_logit_sized(profile: StepProfile) -> int:
        return sum(
            1 for e in profile.events if e.alloc and e.step == 1 and e.size_bytes >= logits_fp32
        )

    assert fp32_logit_sized(eager) >= 2  # the upcast logits, log-softmax, their gradients
    assert fp32_logit_sized(fused) == 0
    assert live_peak(fused)[0] < live_peak(eager)[0] - logits_fp32
    assert "fused cross-entropy" in fused.run.describe()


def test_fused_cross_entropy_needs_a_language_model() -> None:
    with pytest.raises(UnsupportedWorkload, match="--loss-kernel fused"):
        trace_step(get_workload("resnet50"), RunConfig(batch_size=2, loss_kernel="fused"))


def test_options_that_do_not_go_together_are_refused() -> None:
    with pytest.raises(UsageError, match="bitsandbytes"):
        run_config(optimizer="adamw-8bit", optimizer_impl="fused")
    with pytest.raises(UsageError, match="no fused kernel"):
        run_config(optimizer="adafactor", optimizer_impl="fused")
    with pytest.raises(UsageError, match="applies to training"):
        run_config(mode="inference", loss_kernel="fused")
    assert run_config(optimizer="sgd", optimizer_impl="for-loop").optimizer_impl == "for-loop"


def test_stored_profile_keys_tell_the_recipes_apart() -> None:
    assert profile_key("gpt2", RunConfig()) == "gpt2_train_bf16_adamw"
    assert (
        profile_key("gpt2", RunConfig(optimizer_impl="for-loop", loss_kernel="fused"))
        == "gpt2_train_bf16_adamw_forloop_fusedce"
    )


def test_cli_takes_the_recipe_and_says_so() -> None:
    result = run_cli(
        "fit", "gpt2", "--gpu", "h200-sxm", "--seq-len", "1024", "--batch-size", "8",
        "--optimizer-impl", "fused", "--loss-kernel", "fused",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "adamw (fused), fused cross-entropy" in result.stdout
    bad = run_cli("fit", "gpt2", "--gpu", "h200-sxm", "--optimizer-impl", "vectorised")
    assert bad.returncode == 2 and "foreach" in bad.stderr
