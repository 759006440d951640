"""PyTorch's SDPA backend choice on CUDA GPUs, and the memory the math fallback adds."""

from __future__ import annotations

from pathlib import Path

import pytest

from whichgpu.catalog import load_catalog
from whichgpu.estimate.attention import (
    AttentionChoice,
    attention_backend,
    attention_backend_for_op,
    efficient_head_dim_alignment,
    extra_attention_bytes,
    saved_attention_bytes,
)
from whichgpu.schema import AllocEvent, GpuSpec, OpRecord, RunConfig
from whichgpu.trace import trace_step
from whichgpu.workloads.user import config_workload

TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"


def _gpu(gpu_id: str) -> GpuSpec:
    return load_catalog([]).get(gpu_id)


@pytest.mark.parametrize(
    ("gpu_id", "dtype", "head_dim", "backend", "why"),
    [
        # Volta has no flash (sm80+); the CUTLASS kernel takes fp16 there
        ("tesla-v100-sxm2-16gb", "fp16", 64, "efficient", "flash needs sm80"),
        ("a100-sxm4-80gb", "bf16", 128, "flash", ""),
        ("h100-sxm", "bf16", 128, "flash", ""),
        ("rtx-5090", "bf16", 128, "flash", ""),
        # flash is fp16/bf16 only; efficient takes fp32
        ("a100-sxm4-80gb", "fp32", 128, "efficient", "flash needs fp16/bf16"),
        # flash stops at head_dim 256; efficient has no upper bound, only alignment
        ("a100-sxm4-80gb", "fp16", 512, "efficient", "head_dim <= 256"),
        # Turing: no bf16 in the efficient kernel before sm80, so math
        ("tesla-t4", "bf16", 64, "math", "efficient takes fp16/fp32 on sm75"),
        ("tesla-t4", "fp16", 64, "efficient", ""),
        # Pascal: efficient, no tensor cores so no head_dim alignment
        ("tesla-p100-pcie-16gb", "fp16", 100, "efficient", ""),
        # fp64 has no fused kernel
        ("h100-sxm", "float64", 64, "math", "efficient takes"),
    ],
)
def test_backend_by_gpu_dtype_and_head_dim(
    gpu_id: str, dtype: str, head_dim: int, backend: str, why: str
) -> None:
    choice = attention_backend(_gpu(gpu_id), dtype, head_dim, training=False, has_mask=False)
    assert choice.backend == backend
    assert why in choice.reason


def test_a_mask_or_a_non_square_causal_call_rules_out_flash() -> None:
    h100 = _gpu("h100-sxm")
    masked = attention_backend(h100, "bfloat16", 128, training=False, has_mask=True)
    assert masked.backend == "efficient" and "attn_mask" in masked.reason
    causal = attention_backend(
        h100, "bf16", 128, training=False, has_mask=False, causal_non_square=True
    )
    assert causal.backend == "efficient"


def test_misaligned_head_dim_with_a_mask_falls_back_to_math() -> None:
    # flash would pad head_dim 100 to 104, but a mask rules it out; efficient needs multiples of 8
    choice = attention_backend(_gpu("a100-sxm4-80gb"), "fp16", 100, training=False, has_mask=True)
    assert choice.backend == "math"
    assert "multiple of 8" in choice.reason


def test_ampere_geforce_cannot_train_flash_with_head_dims_above_192() -> None:
    rtx3090 = _gpu("rtx-3090")
    assert attention_backend(rtx3090, "bf16", 200, training=False, has_mask=False).backend == (
        "flash"
    )
    assert attention_backend(rtx3090, "bf16", 200, training=True, has_mask=False).backend == (
        "efficient"
    )
    # (224, 256] trains without dropout, not with it
    assert attention_backend(rtx3090, "bf16", 256, training=True, has_mask=False).backend == (
        "flash"
    )
    with_dropout = attention_backend(
        rtx3090, "bf16", 256, training=True, has_mask=False, dropout=True
    )
    assert with_dropout.backend == "efficient"
    # A100 (sm80) has the shared memory for it
    assert (
        attention_backend(_gpu("a100-sxm4-80gb"), "bf16", 200, training=True, has_mask=False)
    ).backend == "flash"


def test_cudnn_goes_first_on_hopper_and_blackwell_only_when_preferred() -> None:
    def cudnn_first(gpu_id: str, head_dim: int) -> str:
        gpu = _gpu(gpu_id)
        return attention_backend(
            gpu, "bf16", head_dim, training=False, has_mask=False, prefer_cudnn=True
        ).backend

    assert cudnn_first("h100-sxm", 128) == "cudnn"
    assert cudnn_first("b200", 128) == "cudnn"
    assert cudnn_first("a100-sxm4-80gb", 128) == "flash"
    # head_dim 256 is past cuDNN's limit (without cuDNN > 9.22): flash again
    assert cudnn_first("h100-sxm", 256) == "flash"


def test_gemm_alignment_of_the_efficient_kernel() -> None:
    assert efficient_head_dim_alignment((8, 0), "bf16") == 8
    assert efficient_head_dim_alignment((8, 0), "fp32") == 4
    assert efficient_head_dim_alignment((7, 0), "fp16") == 8
    assert efficient_head_dim_alignment((7, 0), "fp32") == 1
    assert efficient_head_dim_alignment((6, 0), "fp16") == 1


def test_gpus_without_a_compute_capability_are_not_modelled() -> None:
    amd = next(g for g in load_catalog([]).all() if g.compute_capability is None)
    with pytest.raises(ValueError, match="compute capability"):
        attention_backend(amd, "bf16", 128, training=False, has_mask=False)


# --- memory ---------------------------------------------------------------------------------


def _attention_ops(mode: str) -> list[OpRecord]:
    run = (
        RunConfig(mode="inference", context=64, new_tokens=16, concurrency=2)
        if mode == "inference"
        else RunConfig(batch_size=2, seq_len=32)
    )
    profile = trace_step(config_workload(TINY_LLAMA), run)
    return [op for op in profile.ops if op.kind == "attention"]


def _math(op: OpRecord, training: bool) -> AttentionChoice:
    assert op.attention is not None
    return AttentionChoice(
        backend="math",
        reason="forced",
        compute_capability="8.0",
        dtype="bf16",
        head_dim=op.attention[5],
        training=training,
        has_mask=bool(op.attention[7]),
        dropout=False,
    )


def _measured_math_extra(op: OpRecord, training: bool) -> tuple[int, int, int]:
    """Run ``op``'s attention for real on the CPU under the recorder, with the math backend
    and with the fused CPU kernel: (forward peak, kept after forward, backward peak) of math
    minus those of the fused kernel."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from whichgpu.trace.recorder import Recorder

    assert op.attention is not None
    b, hq, hk, lq, lk, d, causal, masked = op.attention[:8]

    def run(backend: SDPBackend) -> tuple[int, int, int]:
        q = torch.randn(b, hq, lq, d, dtype=torch.bfloat16, requires_grad=training)
        k = torch.randn(b, hk, lk, d, dtype=torch.bfloat16, requires_grad=training)
        v = torch.randn(b, hk, lk, d, dtype=torch.bfloat16, requires_grad=training)
        mask = torch.zeros(b, 1, lq, lk, dtype=torch.bfloat16) if masked else None
        grad = torch.randn(b, hq, lq, d, dtype=torch.bfloat16)
        marks: list[int] = []
        with (
            torch.set_grad_enabled(training),
            sdpa_kernel(backend),
            Recorder(record_ops_of_step=0) as rec,
        ):
            for t in (q, k, v, mask, grad):
                if t is not None:
                    rec.track(t, "input")
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=bool(causal), enable_gqa=hq != hk
            )
            marks.append(len(rec.events()))
            if training:
                torch.autograd.grad(out, (q, k, v), grad)
        events = [e for e in rec.events() if e.category != "input"]
        forward_events = [e for e in rec.events()[: marks[0]] if e.category != "input"]
        forward_peak, after_forward = _walk(forward_events, 0)
        backward_peak, _ = _walk(events[len(forward_events) :], after_forward)
        return forward_peak, after_forward, backward_peak - after_forward

    math, fused = run(SDPBackend.MATH), run(SDPBackend.FLASH_ATTENTION)
    return math[0] - fused[0], math[1] - fused[1], math[2] - fused[2]


def _walk(events: list[AllocEvent], live: int) -> tuple[int, int]:
    """(peak, final) live bytes over ``events``, starting from ``live``."""
    peak = live
    for event in events:
        live += event.size_bytes if event.alloc else -event.size_bytes
        peak = max(peak, live)
    return peak, live


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_math_extra_bytes_match_a_real_math_run_in_inference(phase: str) -> None:
    op = next(op for op in _attention_ops("inference") if op.phase == phase)
    choice = _math(op, training=False)
    forward, kept, _ = _measured_math_extra(op, training=False)
    assert extra_attention_bytes(op, choice) == forward
    assert saved_attention_bytes(op, choice) == kept == 0


def test_math_extra_and_saved_bytes_match_a_real_math_run_in_training() -> None:
    ops = _attention_ops("train")
    forward_op = next(op for op in ops if op.phase == "forward")
    backward_op = next(op for op in ops if op.phase == "backward")
    assert forward_op.attention == backward_op.attention
    forward, kept, backward = _measured_math_extra(forward_op, training=True)
    choice = _math(forward_op, training=True)
    assert extra_attention_bytes(forward_op, choice) == forward
    assert saved_attention_bytes(forward_op, choice) == kept
    assert extra_attention_bytes(backward_op, choice) == backward
    # the fp32 probabilities (batch x heads x q_len x kv_len x 4 B) are among what is kept
    b, hq, _, lq, lk = forward_op.attention[:5]
    assert kept > b * hq * lq * lk * 4


def test_math_scores_dominate_at_long_sequences() -> None:
    # fp32, no GQA, no mask: the peak is scaled q plus the scores and the probabilities, less
    # what the fused kernel allocates (output and logsumexp): 2 score matrices - logsumexp
    b, h, seq, d = 1, 8, 1024, 64
    op = OpRecord(
        name="aten._scaled_dot_product_flash_attention_for_cpu",
        kind="attention",
        phase="forward",
        flops=0,
        bytes_read=0,
        bytes_written=0,
        dtype="float32",
        attention=(b, h, h, seq, seq, d, 0, 0),
    )
    choice = attention_backend(
        _gpu("tesla-p100-pcie-16gb"), "fp32", d, training=False, has_mask=False
    )
    assert choice.backend == "efficient"
    assert extra_attention_bytes(op, choice) == 0
    math = AttentionChoice("math", "forced", "6.0", "fp32", d, False, False, False)
    assert extra_attention_bytes(op, math) == 2 * b * h * seq * seq * 4 - b * h * seq * 4


def test_fused_backends_add_nothing_for_the_traced_model() -> None:
    a100 = _gpu("a100-sxm4-80gb")
    for op in _attention_ops("inference"):
        choice = attention_backend_for_op(a100, op, training=False)
        # prefill is causal and square: flash; decode has a mask: efficient
        assert choice.backend == ("flash" if op.phase == "prefill" else "efficient")
        assert extra_attention_bytes(op, choice) == 0
        assert saved_attention_bytes(op, choice) == 0


def test_efficient_copies_a_mask_whose_kv_len_is_not_a_multiple_of_8_once_not_per_head() -> None:
    def decode(kv_len: int, *mask_rows: int) -> OpRecord:
        return OpRecord(
            name="aten._scaled_dot_product_flash_attention_for_cpu",
            kind="attention",
            phase="decode",
            flops=0,
            bytes_read=0,
            bytes_written=0,
            dtype="bfloat16",
            attention=(4, 8, 8, 1, kv_len, 128, 0, 1, *mask_rows),
        )

    h100 = _gpu("h100-sxm")
    for op in (decode(1000, 4), decode(1000)):  # aligned: the mask is used as it is
        choice = attention_backend_for_op(h100, op, training=False)
        assert choice.backend == "efficient" and extra_attention_bytes(op, choice) == 0
    # a (4, 1, 1, 1001) bf16 mask is copied with its last dimension padded to 1008
    op = decode(1001, 4)
    assert extra_attention_bytes(op, attention_backend_for_op(h100, op, training=False)) == (
        4 * 1008 * 2
    )
    # a profile that did not record the mask's shape: the largest it broadcasts to, per head
    op = decode(1001)
    assert extra_attention_bytes(op, attention_backend_for_op(h100, op, training=False)) == (
        4 * 8 * 1 * 1008 * 2
    )


def test_the_tracer_records_the_mask_it_passes_as_rows_per_key() -> None:
    import torch
    import torch.nn.functional as F

    from whichgpu.trace.recorder import Recorder

    q = torch.randn(2, 4, 5, 8)
    kv = torch.randn(2, 4, 7, 8)
    mask = torch.zeros(2, 1, 5, 7)
    with Recorder(record_ops_of_step=0) as rec:
        F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
        F.scaled_dot_product_attention(q, kv, kv)
    shapes = [op.attention for op in rec.ops if op.kind == "attention"]
    assert shapes == [(2, 4, 4, 5, 7, 8, 0, 1, 10), (2, 4, 4, 5, 7, 8, 0, 0, 0)]
