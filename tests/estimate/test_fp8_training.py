"""fp8 training (``--precision fp8``, ``whichgpu.estimate.fp8``): derived from the bf16 AMP
step; refused where the GPU has no fp8 tensor cores; its memory and speed from the recipe's
arithmetic; its speedup against a published measurement."""

from __future__ import annotations

import pytest

from whichgpu.api import fit, predict
from whichgpu.errors import UsageError
from whichgpu.estimate.fp8 import Fp8Refused, fp8_linears, fp8_profile
from whichgpu.profiles.stored import load_stem
from whichgpu.validate.recipes import recipe_runs
from whichgpu.validate.timing import fit_options

LLAMA = "llama-3.1-8b_train_bf16_adamw"

# Llama 3.1 8B: 32 layers of q, k, v, o (4096 x 4096, 2 x 1024 x 4096, 4096 x 4096) and
# gate, up, down (3 x 4096 x 14336); the output projection (128,256 x 4096) stays bf16
LINEAR_WEIGHTS = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336)


def test_refused_on_rtx_3090_alone() -> None:
    with pytest.raises(Fp8Refused, match="no fp8 tensor cores"):
        fit("llama-3.2-1b", gpus=["rtx-3090"], precision="fp8", batch_size=1, seq_len=512)
    with pytest.raises(Fp8Refused, match="no fp8 tensor cores"):
        predict("llama-3.2-1b", gpus=["rtx-3090"], precision="fp8", batch_size=1, seq_len=512)


def test_left_out_with_the_reason_among_others() -> None:
    memory = fit("llama-3.2-1b", gpus=["h100-sxm", "rtx-3090"], precision="fp8", seq_len=512)
    assert [e.gpu for e in memory] == ["h100-sxm"]
    assert any("GeForce RTX 3090 is left out" in n and "fp8" in n for n in memory.notes)
    speed = predict(
        "llama-3.2-1b", gpus=["h100-sxm", "rtx-3090"], precision="fp8", batch_size=1, seq_len=512
    )
    assert [e.gpu for e in speed] == ["h100-sxm"]
    assert any("GeForce RTX 3090 is left out" in n for n in speed.notes)


def test_inference_and_lora_refused() -> None:
    with pytest.raises(UsageError, match="fp8 training"):
        fit("llama-3.2-1b", gpus=["h100-sxm"], precision="fp8", mode="inference")
    with pytest.raises(UsageError, match="full training"):
        fit("llama-3.2-1b", gpus=["h100-sxm"], precision="fp8", method="lora")


def test_linear_layers_found_from_the_profile() -> None:
    base = load_stem(LLAMA)
    assert base is not None
    found = fp8_linears(base)
    # forward, grad-input and grad-weight of 7 linears in each of 32 layers
    assert found.gemms == 32 * 7 * 3
    assert found.kept_shape == (4096, 128256)
    derived = fp8_profile(base)
    ops = derived.at(1, 512).ops
    fp8_gemms = [op for op in ops if op.dtype.startswith("float8")]
    assert len(fp8_gemms) == 32 * 7 * 3
    assert all(op.phase == "forward" for op in ops if op.dtype == "float8_e4m3fn")
    bf16_gemms = [op for op in ops if op.kind == "gemm" and op.dtype == "bfloat16"]
    assert len(bf16_gemms) == 3  # the output projection: forward and its two gradients
    # FLOPs unchanged: the same products, on other tensor cores
    assert sum(op.flops for op in ops if op.kind == "gemm") == sum(
        op.flops for op in base.at(1, 512).ops if op.kind == "gemm"
    )


def test_rowwise_adds_a_rescaling_kernel_per_backward_product_and_casts_weights_twice() -> None:
    """torchao's rowwise recipe: every product in e4m3; each backward product (grad-input,
    grad-weight) runs cuBLAS's kernel and then a kernel that reads and writes its bf16 output
    again, scaled; each grad-input product casts its weight again, along the other axis."""
    from whichgpu.estimate.fp8 import AMAX_OP, CAST_OP, RESCALE_OP

    base = load_stem(LLAMA)
    assert base is not None
    tensorwise = fp8_profile(base).at(1, 512).ops
    rowwise = fp8_profile(base, "rowwise").at(1, 512).ops
    assert not [op for op in tensorwise if op.name == RESCALE_OP]
    rescales = [op for op in rowwise if op.name == RESCALE_OP]
    assert len(rescales) == 32 * 7 * 2 and all(op.phase == "backward" for op in rescales)
    # each reads its product's bf16 output and writes it again: the grad-weight ones are the
    # converted weights' size, the grad-input ones the tokens x the layer's input size
    weight_sized = sum(op.bytes_written for op in rescales if op.bytes_written in WEIGHT_BYTES)
    assert weight_sized == 2 * LINEAR_WEIGHTS
    assert all(op.bytes_read == op.bytes_written for op in rescales)
    assert {op.dtype for op in rowwise if op.dtype.startswith("float8")} == {"float8_e4m3fn"}

    def casts(ops: tuple[object, ...]) -> int:
        return sum(1 for op in ops if getattr(op, "name", "") in (AMAX_OP, CAST_OP))

    # one more cast (max-abs and copy) for each of the 224 grad-input products
    assert casts(rowwise) - casts(tensorwise) == 2 * 32 * 7
    # slower, by what those kernels move; memory about the same
    options = {
        "batch_size": 1,
        "seq_len": 4096,
        "precision": "fp8",
        "gpu_count": 8,
        "sharding": "fsdp",
    }
    speeds = {
        r: predict("llama-3.1-8b", gpus=["h100-sxm"], fp8_recipe=r, **options)[0]
        for r in ("tensorwise", "rowwise")
    }
    assert speeds["rowwise"].throughput and speeds["tensorwise"].throughput
    assert 0.85 < speeds["rowwise"].throughput / speeds["tensorwise"].throughput < 0.99
    assert any("rowwise dynamic scaling" in a for a in speeds["rowwise"].assumptions)
    memory = {
        r: fit("llama-3.1-8b", gpus=["h100-sxm"], fp8_recipe=r, **options)[0]
        for r in ("tensorwise", "rowwise")
    }
    grown = memory["rowwise"].peak_reserved_bytes - memory["tensorwise"].peak_reserved_bytes
    assert 0 <= grown <= 2**30


def test_a_recomputed_forward_product_is_a_forward_one() -> None:
    """Selective checkpointing recomputes k, o and up in the backward phase: forward products
    (e4m3, and under rowwise no rescaling and no second weight cast), told from the grad-input
    products by the grad-weight product beside each of those."""
    from whichgpu.estimate.fp8 import RESCALE_OP

    base = load_stem(LLAMA + "_ckptselective")
    assert base is not None
    for recipe in ("tensorwise", "rowwise"):
        ops = fp8_profile(base, recipe).at(1, 512).ops
        e4m3 = [op for op in ops if op.dtype == "float8_e4m3fn" and op.phase == "backward"]
        e5m2 = [op for op in ops if op.dtype == "float8_e5m2"]
        rescales = [op for op in ops if op.name == RESCALE_OP]
        if recipe == "tensorwise":
            assert len(e4m3) == 32 * 3 and len(e5m2) == 32 * 7 * 2 and not rescales
        else:
            assert len(e4m3) == 32 * (3 + 7 * 2) and not e5m2 and len(rescales) == 32 * 7 * 2


WEIGHT_BYTES = {2 * a * b for a, b in ((4096, 4096), (1024, 4096), (4096, 14336))}
"""The bf16 sizes of Llama 3.1 8B's converted weights."""


def test_rowwise_is_for_fp8_and_gathers_in_bf16() -> None:
    with pytest.raises(UsageError, match="it needs precision fp8"):
        fit("llama-3.2-1b", gpus=["h100-sxm"], precision="bf16", fp8_recipe="rowwise")
    with pytest.raises(UsageError, match="gathers them in bf16"):
        predict(
            "llama-3.2-1b",
            gpus=["h100-sxm"],
            precision="fp8",
            fp8_recipe="rowwise",
            gpu_count=8,
            sharding="fsdp",
            fp8_all_gather=True,
        )


def test_memory_from_the_recipe() -> None:
    """One GPU, AMP: autocast's bf16 copy of each converted weight (2 bytes, held from the
    forward to its backward) is an fp8 copy (1 byte): the live peak drops by one byte per
    converted weight, less the fp8 copies of one product's operands alive at the peak."""
    base = load_stem(LLAMA)
    assert base is not None
    derived = fp8_profile(base)
    # at a small step the peak is the optimizer's (AdamW's foreach temporaries), after the
    # weights' copies are gone: fp8 changes nothing there
    assert base.live_peak_bytes(1, 512) == derived.live_peak_bytes(1, 512)
    # at a large one it is the start of backward, with every copy held
    saved = base.live_peak_bytes(2, 4096) - derived.live_peak_bytes(2, 4096)
    transient = 2 * 4096 * 14336 + 4096 * 14336  # the largest product's fp8 operands
    assert LINEAR_WEIGHTS - transient <= saved <= LINEAR_WEIGHTS
    single = {
        p: fit("llama-3.1-8b", gpus=["h100-sxm"], precision=p, batch_size=2, seq_len=4096)[0]
        for p in ("bf16", "fp8")
    }
    drop = single["bf16"].peak_allocated_bytes - single["fp8"].peak_allocated_bytes
    assert 0.9 * LINEAR_WEIGHTS <= drop <= 1.05 * LINEAR_WEIGHTS
    # FSDP gathers 16-bit weights, so autocast has nothing to copy: fp8 adds only its
    # transient copies (the published peaks: 47.65 GB bf16, 47.77 GB fp8)
    sharded = {
        p: fit(
            "llama-3.1-8b",
            gpus=["h100-sxm"],
            precision=p,
            seq_len=2048,
            gpu_count=8,
            sharding="fsdp",
        )[0]
        for p in ("bf16", "fp8")
    }
    grown = sharded["fp8"].peak_reserved_bytes - sharded["bf16"].peak_reserved_bytes
    assert -(2**30) <= grown <= 2**30
    assert sharded["fp8"].max_batch_size == sharded["bf16"].max_batch_size


def test_speedup_on_h100_within_the_recipe_bounds() -> None:
    """fp8 GEMMs at twice the bf16 rate (1979 / 989 TFLOPS dense) can at most halve the
    linear layers' time, and the casts cost bandwidth: 1 < speedup < 1 / (1 - share / 2),
    with share the linear GEMMs' share of the bf16 step."""
    asked = {"batch_size": 1, "seq_len": 2048, "gpu_count": 8, "sharding": "fsdp"}
    bf16 = predict("llama-3.1-8b", gpus=["h100-sxm"], precision="bf16", **asked)[0]
    fp8 = predict("llama-3.1-8b", gpus=["h100-sxm"], precision="fp8", **asked)[0]
    assert bf16.throughput and fp8.throughput
    speedup = fp8.throughput / bf16.throughput
    assert 1.03 < speedup < 1.5
    assert fp8.run.precision == "fp8"
    assert any("torchao Float8Linear" in a for a in fp8.assumptions)


SPEEDUP_TOLERANCE = 0.2
"""How far the predicted fp8 speedup may be from the published one: the runs' speeds are
predicted within 20 % (``validate --source recipes``), the ratio of two runs of the same step
closer."""


@pytest.mark.slow
def test_speedup_against_published_torchao_h100() -> None:
    """torchao's published torchtitan runs (``validate/data/recipes``): compiled, selectively
    checkpointed, FSDP2 on 8 H100s, bf16 and tensorwise fp8 (from stored profiles and
    partitions, or traced once: about a minute)."""
    runs = {
        r.run.precision: r
        for r in recipe_runs()
        if r.gpu == "h100-sxm" and r.run.fp8_recipe == "tensorwise"
    }
    published = runs["fp8"].tokens_per_s_per_gpu / runs["bf16"].tokens_per_s_per_gpu
    out = {
        p: predict(r.workload, gpus=[r.gpu], stack=r.stack, **fit_options(r.run))[0]
        for p, r in runs.items()
    }
    assert out["bf16"].throughput and out["fp8"].throughput
    speedup = out["fp8"].throughput / out["bf16"].throughput
    error = speedup / published - 1
    assert abs(error) <= SPEEDUP_TOLERANCE, f"speedup {speedup:.3f}, error {error:+.1%}"
