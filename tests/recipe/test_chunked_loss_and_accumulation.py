"""Chunked and fused-linear cross-entropy (``--loss-kernel chunked|fused-linear``) and gradient
accumulation (``--grad-accum``): the losses equal transformers' own, the logits they keep, the
gradients an accumulating step holds, and an optimizer step timed as its micro-steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_cli
from whichgpu.api import predict
from whichgpu.errors import UsageError
from whichgpu.estimate.prediction import accumulated
from whichgpu.estimate.profile_summary import live_peak
from whichgpu.estimate.throughput import StepTime
from whichgpu.profiles.stored import profile_key
from whichgpu.recipe.training import step_loss
from whichgpu.schema import RunConfig, StepProfile
from whichgpu.trace import trace_step
from whichgpu.workloads import get_workload, run_config
from whichgpu.workloads.hf import fused_linear_chunks

FIXTURES = Path(__file__).parents[1] / "fixtures"
GPT2_VOCAB = 50257


class _ModelLoss:
    """The workload's own loss, as ``BuiltWorkload.loss`` gives it: the model's."""

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return model(**batch).loss  # type: ignore[no-any-return]


def _tiny_gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model: torch.nn.Module = GPT2LMHeadModel(config)
    return model.eval()  # no dropout: every loss sees the same logits


@pytest.mark.parametrize("kernel", ["chunked", "fused-linear"])
def test_chunked_losses_equal_transformers_loss_and_its_gradients(kernel: str) -> None:
    model = _tiny_gpt2()
    ids = torch.randint(0, 1000, (3, 40))
    batch = {"input_ids": ids, "labels": ids}

    def loss_and_grads(loss_kernel: str) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = step_loss(_ModelLoss(), RunConfig(loss_kernel=loss_kernel), model, batch)  # type: ignore[arg-type]
        loss.backward()  # type: ignore[no-untyped-call]
        return loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain, plain_grads = loss_and_grads("torch")
    chunked, chunked_grads = loss_and_grads(kernel)
    assert chunked == pytest.approx(plain, rel=1e-5)
    assert len(chunked_grads) == len(plain_grads)
    for ours, theirs in zip(chunked_grads, plain_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the 16-bit logits, upcast inside
        half = step_loss(_ModelLoss(), RunConfig(loss_kernel=kernel), model, batch)  # type: ignore[arg-type]
    assert half.item() == pytest.approx(plain, rel=1e-2)


def test_fused_linear_chunks_follow_ligers_rule() -> None:
    assert fused_linear_chunks(50257, 768) == 64  # GPT-2: ceil(V/H) = 66
    assert fused_linear_chunks(128256, 2048) == 32  # Llama 3.2 1B: 63
    assert fused_linear_chunks(32000, 4096) == 8
    assert fused_linear_chunks(151936, 896) == 64  # 170, capped


def test_chunked_losses_keep_no_fp32_logits_and_fused_linear_no_logits_at_all() -> None:
    batch, seq = 4, 1024
    logits_bf16 = batch * seq * GPT2_VOCAB * 2
    logits_fp32 = 2 * logits_bf16

    def trace(kernel: str) -> StepProfile:
        run = RunConfig(batch_size=batch, seq_len=seq, loss_kernel=kernel)
        return trace_step(get_workload("gpt2"), run)

    def largest(profile: StepProfile) -> int:
        return max(e.size_bytes for e in profile.events if e.alloc and e.step == 1)

    plain, chunked, fused_linear = trace("torch"), trace("chunked"), trace("fused-linear")
    assert largest(plain) >= logits_fp32
    assert largest(chunked) < logits_fp32 / 4  # one chunk's fp32 copy at most
    # fused-linear's largest is the output weight's fp32 gradient (V x H), not logits
    assert largest(fused_linear) <= GPT2_VOCAB * 768 * 4 < logits_bf16 / 2
    plain_peak, chunked_peak = live_peak(plain)[0], live_peak(chunked)[0]
    linear_peak = live_peak(fused_linear)[0]
    assert chunked_peak < plain_peak - logits_fp32  # well below: GPT-2's 13 GiB against 9
    assert linear_peak < chunked_peak - logits_bf16 / 2  # nor the bf16 logits
    assert "fused-linear cross-entropy" in fused_linear.run.describe()


def test_stored_profile_keys_tell_the_new_recipes_apart() -> None:
    assert profile_key("gpt2", RunConfig()) == "gpt2_train_bf16_adamw"
    assert profile_key("gpt2", RunConfig(grad_accum=1)) == "gpt2_train_bf16_adamw"
    assert (
        profile_key("gpt2", RunConfig(loss_kernel="fused-linear", grad_accum=8))
        == "gpt2_train_bf16_adamw_fusedlinearce_accum"
    )
    assert (
        profile_key("gpt2", RunConfig(loss_kernel="chunked")) == "gpt2_train_bf16_adamw_chunkedce"
    )


def test_grad_accum_options_are_checked() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        run_config(grad_accum=0)
    with pytest.raises(UsageError, match="applies to training"):
        run_config(mode="inference", grad_accum=4)
    run = run_config(batch_size=4, grad_accum=8, gpus=2)
    assert run.global_batch_size() == 64
    assert "gradient accumulation 8" in run.describe()


def test_an_accumulating_step_holds_the_gradients_through_forward() -> None:
    workload = get_workload("gpt2")
    plain = trace_step(workload, RunConfig(batch_size=1, seq_len=128))
    accumulating = trace_step(workload, RunConfig(batch_size=1, seq_len=128, grad_accum=4))
    params = sum(e.size_bytes for e in plain.events if e.alloc and e.category == "parameter")

    def gradients_at_forward_end(profile: StepProfile) -> int:
        last_forward = max(i for i, op in enumerate(profile.ops) if op.phase == "forward")
        live: dict[int, int] = {}
        for e in profile.events:
            if e.category != "gradient" or (e.step == 1 and e.op_index > last_forward):
                continue
            if e.alloc:
                live[e.storage] = e.size_bytes
            else:
                live.pop(e.storage, None)
        return sum(live.values())

    assert gradients_at_forward_end(plain) == 0  # set to None after the last update
    assert gradients_at_forward_end(accumulating) >= params  # kept from the earlier micro-steps
    assert live_peak(accumulating)[0] > live_peak(plain)[0]
    assert "grad_accum" in accumulating.choices


def test_accumulated_step_is_n_micro_steps_and_one_update() -> None:
    step = StepTime(
        1.0, 0.6, 0.3, 0.1, {"forward": 0.3, "backward": 0.6, "optimizer": 0.1}, 10.0, 0.9
    )
    update = StepTime(0.1, 0.0, 0.1, 0.0, {"optimizer": 0.1}, 1.0, 0.0)
    total, micro_s = accumulated(step, update, 4)
    assert micro_s == pytest.approx(0.9)
    assert total.step_time_s == pytest.approx(4 * 0.9 + 0.1)
    assert total.phase_s == pytest.approx({"forward": 1.2, "backward": 2.4, "optimizer": 0.1})
    assert total.flops == pytest.approx(4 * 9 + 1)
    assert total.tensor_flops_share == pytest.approx(9 * 4 / 37)


def test_predict_times_an_optimizer_step_and_reports_the_global_batch() -> None:
    config = FIXTURES / "tiny-llama.json"
    options: dict[str, Any] = {"config": config, "gpus": ["h100-sxm"], "batch_size": 4}
    one = predict(**options)[0]
    four = predict(grad_accum=4, **options)[0]
    assert one.step_time_s is not None and four.step_time_s is not None
    assert four.micro_step_s is not None and one.micro_step_s is None
    update_s = four.step_time_s - 4 * four.micro_step_s
    assert 0 < update_s < four.micro_step_s
    # the first micro-step adds into no gradients: the plain step is a micro-step and the update
    assert one.step_time_s == pytest.approx(four.micro_step_s + update_s, rel=0.1)
    assert (one.global_batch_size, four.global_batch_size) == (4, 16)
    assert four.throughput == pytest.approx(16 * (four.seq_len or 0) / four.step_time_s)
    result = run_cli(
        "predict", "--config", str(config), "--gpu", "h100-sxm", "--batch-size", "4",
        "--grad-accum", "4", "--gpus", "2", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    entry = doc[0] if isinstance(doc, list) else doc["results"][0]
    assert (entry["batch_size"], entry["global_batch_size"]) == (4, 32)
    assert entry["run"]["grad_accum"] == 4
