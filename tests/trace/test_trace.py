"""Tracing a step with fake tensors: FLOPs against references, memory against a real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from whichgpu.errors import UnsupportedWorkload
from whichgpu.estimate.profile_summary import live_peak, summarize
from whichgpu.schema import RunConfig
from whichgpu.trace import trace_step
from whichgpu.workloads import get_workload
from whichgpu.workloads.user import config_workload

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_resnet50_forward_flops_match_the_reference() -> None:
    # ResNet-50 at 224x224: 4.1 GMACs per image forward (He et al. 2016, Table 1: 3.8 GFLOPs
    # counted as multiply-adds for v1; v1.5 with stride in the 3x3 conv is ~4.1 GMACs).
    summary = summarize(trace_step(get_workload("resnet50"), RunConfig(batch_size=2)))
    gmacs = summary.forward_flops_per_sample / 2 / 1e9
    assert gmacs == pytest.approx(4.1, rel=0.03)


def test_transformer_training_flops_are_six_n_per_token() -> None:
    # Training FLOPs ~ 6 x parameters x tokens (Kaplan et al. 2020) plus attention, which at
    # seq 128 is small; the embedding lookup costs no FLOPs (tied lm_head does).
    profile = trace_step(get_workload("gpt2"), RunConfig(batch_size=2, seq_len=128))
    tokens = 2 * 128
    six_n = 6 * profile.params_total * tokens
    assert profile.flops_per_step == pytest.approx(six_n, rel=0.06)
    assert profile.units_per_step == tokens


def test_profile_records_ops_events_and_choices() -> None:
    profile = trace_step(
        config_workload(FIXTURES / "tiny-llama.json"), RunConfig(batch_size=2, seq_len=32)
    )
    kinds = {op.kind for op in profile.ops}
    assert {"gemm", "elementwise", "optimizer"} <= kinds
    assert any(op.gemm_bmnk for op in profile.ops)
    categories = {e.category for e in profile.events}
    assert {"parameter", "gradient", "optimizer", "activation", "input"} <= categories
    assert profile.choices["optimizer_impl"] == "foreach"
    summary = summarize(profile)
    assert sum(summary.peak_live_by_category.values()) == summary.peak_live_bytes
    assert (
        summary.peak_live_by_category["optimizer"] == 2 * summary.peak_live_by_category["parameter"]
    )


@pytest.mark.parametrize(
    ("precision", "optimizer"),
    [
        ("fp32", "adamw"),
        ("bf16", "adamw"),
        ("bf16-pure", "adamw"),
        ("fp32", "adafactor"),  # reads its step and norms with .item(): no value under fake
        ("bf16", "sgd"),
    ],
)
def test_fake_trace_peak_equals_a_real_cpu_run_to_the_byte(precision: str, optimizer: str) -> None:
    run = RunConfig.model_validate(
        {"batch_size": 2, "seq_len": 32, "precision": precision, "optimizer": optimizer}
    )
    workload = config_workload(FIXTURES / "tiny-llama.json")
    fake = trace_step(workload, run, fake=True)
    real = trace_step(workload, run, fake=False)
    assert live_peak(fake) == live_peak(real)
    assert fake.flops_per_step == real.flops_per_step


@pytest.mark.parametrize("precision", ["bf16", "fp32", "bf16-pure"])
def test_autocast_weight_copies_are_marked_as_parameter_casts(precision: str) -> None:
    # tiny-llama (tests/fixtures): 2 layers of hidden 64, 4 heads and 2 KV heads of 16, MLP
    # 128, an untied lm_head over 512 tokens. Autocast casts each linear weight to bf16 once per
    # forward (its cache): q, k, v, o, gate, up, down and lm_head; embeddings and the RMSNorm
    # weights are not cast. fp32 and pure bf16 runs cast nothing.
    run = RunConfig.model_validate({"batch_size": 2, "seq_len": 32, "precision": precision})
    profile = trace_step(config_workload(FIXTURES / "tiny-llama.json"), run)
    casts = [e for e in profile.events if e.category == "parameter_cast" and e.alloc]
    if precision != "bf16":
        assert casts == []
        return
    hidden, kv, mlp, vocab, layers = 64, 2 * 16, 128, 512, 2
    linear = layers * (2 * hidden * hidden + 2 * kv * hidden + 3 * hidden * mlp) + vocab * hidden
    assert sum(e.size_bytes for e in casts if e.step == 1) == 2 * linear
    # every cast is gone by the end of the step (none is mistaken for state)
    freed = {e.storage for e in profile.events if e.category == "parameter_cast" and not e.alloc}
    assert {e.storage for e in casts} == freed


def test_inference_traces_without_gradients() -> None:
    profile = trace_step(
        config_workload(FIXTURES / "tiny-llama.json"),
        RunConfig(mode="inference", batch_size=2, seq_len=32),
    )
    categories = {e.category for e in profile.events}
    assert "gradient" not in categories and "optimizer" not in categories


def test_unsupported_precisions_say_why() -> None:
    with pytest.raises(UnsupportedWorkload, match="fp8"):
        trace_step(get_workload("gpt2"), RunConfig(precision="fp8"))


def test_attention_flops_are_counted() -> None:
    # Llama attention at seq 512: forward QK^T and PV are 2 x (2 x B x H x S x S x D) FLOPs
    # per layer (torch.utils.flop_counter.sdpa_flop_count); the fused CPU kernel must count them.
    profile = trace_step(get_workload("llama-3.2-1b"), RunConfig(batch_size=1, seq_len=512))
    attention = [op for op in profile.ops if op.kind == "attention"]
    assert attention and all(op.flops > 0 for op in attention)
    heads, head_dim, layers, seq = 32, 64, 16, 512
    forward = sum(op.flops for op in attention if op.phase == "forward")
    assert forward == 4 * heads * seq * seq * head_dim * layers


def test_depthwise_convolution_backward_is_not_overcounted() -> None:
    # A depthwise 3x3 conv over C channels: forward = 2 x N x C x H x W x 9 FLOPs; the input and
    # weight gradients cost the same each, so backward = 2 x forward (torch 2.13's own formula
    # ignores groups and would give ~C times more for the weight gradient).
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from whichgpu.trace.recorder import Recorder

    n, c, hw = 2, 64, 16
    with FakeTensorMode():
        conv = torch.nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        x = torch.randn(n, c, hw, hw, requires_grad=True)
        with Recorder(record_ops_of_step=0) as rec:
            conv(x).sum().backward()
    forward = 2 * n * c * hw * hw * 9
    by_name = {op.name: op.flops for op in rec.ops}
    assert by_name["aten.convolution"] == forward
    assert by_name["aten.convolution_backward"] == 2 * forward


def test_adafactor_keeps_factored_second_moments() -> None:
    # Adafactor stores a row and a column factor per matrix (rows + cols values instead of
    # rows x cols) and a full vector for 1-D parameters: far below AdamW's two copies.
    run = RunConfig.model_validate({"batch_size": 2, "seq_len": 32, "optimizer": "adafactor"})
    summary = summarize(trace_step(config_workload(FIXTURES / "tiny-llama.json"), run))
    by_category = summary.peak_live_by_category
    assert 0 < by_category["optimizer"] < 0.1 * by_category["parameter"]


DROPOUT_MODEL = """
import torch
from torch import nn


def build():
    model = nn.Sequential(nn.Linear(64, 512), nn.Dropout(0.1), nn.ReLU(), nn.Linear(512, 10))

    def make_batch(batch_size, seq_len):
        return {"input": torch.randn(batch_size, 64)}

    return model, make_batch
"""


def test_cpu_kernels_trace_the_cpu_dropout_and_cuda_kernels_its_one_byte_mask(
    tmp_path: Path,
) -> None:
    from whichgpu.workloads.user import model_workload

    path = tmp_path / "dropout_model.py"
    path.write_text(DROPOUT_MODEL, encoding="utf-8")
    workload = model_workload(f"{path}:build")
    run = RunConfig(batch_size=256, precision="fp32")
    cuda = trace_step(workload, run)
    cpu = trace_step(workload, run, kernels="cpu")
    assert any(op.name == "aten.native_dropout" for op in cuda.ops)
    assert not any(op.name == "aten.native_dropout" for op in cpu.ops)
    assert "kernels" not in cuda.choices and cpu.choices["kernels"].startswith("cpu:")
    # the CPU's fp32 mask (4 B per element) against CUDA's bool one (1 B): 3 B more each
    mask_elements = 256 * 512
    assert live_peak(cpu)[0] - live_peak(cuda)[0] >= 3 * mask_elements
    # and the CPU-kernel trace is the CPU's real step, to the byte
    assert live_peak(cpu) == live_peak(trace_step(workload, run, fake=False, kernels="cpu"))


@pytest.mark.parametrize("workload", ["gpt2", "bert-base"])
def test_checkpointing_recomputes_under_the_kernels_the_forward_ran(workload: str) -> None:
    """The recomputation of a checkpointed segment runs in the backward pass; with CUDA's
    dropout (and GPT-2's fused attention with dropout) it must take the same kernels as the
    forward pass, or torch.utils.checkpoint refuses the step: models with dropout raised."""
    model = get_workload(workload)
    plain = trace_step(model, RunConfig(batch_size=8, seq_len=512))
    ckpt = trace_step(model, RunConfig(batch_size=8, seq_len=512, checkpointing=True))
    if workload == "gpt2":
        assert "attention_dropout" in ckpt.choices  # the fused kernel with dropout was traced
    assert any(op.name == "aten.native_dropout" for op in ckpt.ops)  # CUDA's dropout kernel
    assert live_peak(ckpt)[0] < live_peak(plain)[0]
    # the recomputed forward adds its FLOPs: more than the plain step, less than two of them
    assert plain.flops_per_step < ckpt.flops_per_step < 2 * plain.flops_per_step
