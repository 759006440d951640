"""Tracing inference of a causal language model: a prefill into a static KV cache, then one
decode step; and the plain forward pass of every other model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.estimate.profile_summary import live_peak
from whichgpu.schema import Precision, RunConfig, StepProfile
from whichgpu.trace import trace_step
from whichgpu.workloads.hf import _release, transformers_version
from whichgpu.workloads.run_config import DEFAULT_NEW_TOKENS
from whichgpu.workloads.user import config_workload

FIXTURES = Path(__file__).parents[1] / "fixtures"
TINY_LLAMA = FIXTURES / "tiny-llama.json"
CONFIG = json.loads(TINY_LLAMA.read_text(encoding="utf-8"))
LAYERS = CONFIG["num_hidden_layers"]
Q_HEADS = CONFIG["num_attention_heads"]
KV_HEADS = CONFIG["num_key_value_heads"]
HEAD_DIM = CONFIG["hidden_size"] // Q_HEADS
CONTEXT, NEW, CONCURRENCY = 64, 16, 3


def _serve(precision: Precision = "bf16", fake: bool = True) -> StepProfile:
    run = RunConfig(
        mode="inference",
        precision=precision,
        context=CONTEXT,
        new_tokens=NEW,
        concurrency=CONCURRENCY,
    )
    return trace_step(config_workload(TINY_LLAMA), run, fake=fake)


@pytest.mark.parametrize(("precision", "dtype_bytes"), [("bf16", 2), ("fp32", 4)])
def test_kv_cache_is_allocated_whole_for_context_plus_new_tokens(
    precision: Precision, dtype_bytes: int
) -> None:
    # K and V per layer: sequences x kv_heads (GQA: 2, not the 4 query heads) x (context + new)
    # x head_dim, in the serving dtype. They are the only tensors that outlive the request's
    # steps ("activation"); everything else is temporary.
    profile = _serve(precision)
    expected = 2 * LAYERS * KV_HEADS * HEAD_DIM * (CONTEXT + NEW) * CONCURRENCY * dtype_bytes
    cache = [e for e in profile.events if e.step == 1 and e.alloc and e.category == "activation"]
    assert sum(e.size_bytes for e in cache) == expected
    assert len(cache) == 2 * LAYERS
    assert profile.choices["kv_cache"].startswith("static")
    assert profile.choices["kv_cache"].endswith(f"= {expected} B")
    assert live_peak(profile)[1]["activation"] == expected


def test_decode_step_is_one_token_per_sequence_over_the_cache() -> None:
    profile = _serve()
    phases = {op.phase for op in profile.ops}
    assert phases == {"setup", "prefill", "decode"}
    # The projections run in the model's bf16. transformers 5.0 also forms the rotary angles
    # as a float32 batched matmul of frequencies by positions in each forward (5.24 forms them
    # elementwise): not a projection.
    decode_gemms = [
        op
        for op in profile.ops
        if op.phase == "decode" and op.kind == "gemm" and op.dtype == "bfloat16"
    ]
    # q, k, v, o, gate, up, down projections per layer, and the LM head
    assert len(decode_gemms) == 7 * LAYERS + 1
    assert {op.gemm_bmnk[1] for op in decode_gemms if op.gemm_bmnk} == {CONCURRENCY}
    prefill_gemms = [
        op
        for op in profile.ops
        if op.phase == "prefill" and op.kind == "gemm" and op.dtype == "bfloat16"
    ]
    m_values = [op.gemm_bmnk[1] for op in prefill_gemms if op.gemm_bmnk]
    # every projection sees all prompt tokens; the LM head only the last (logits_to_keep=1)
    assert m_values == [CONCURRENCY * CONTEXT] * (7 * LAYERS) + [CONCURRENCY]
    assert profile.units_per_step == CONCURRENCY
    assert profile.batch_size == CONCURRENCY
    assert (profile.run.context, profile.run.new_tokens) == (CONTEXT, NEW)


def test_attention_shapes_of_prefill_and_decode() -> None:
    profile = _serve()
    shapes = {op.phase: op.attention for op in profile.ops if op.kind == "attention"}
    # prefill: causal over the prompt, GQA (4 query heads on 2 kv heads)
    assert shapes["prefill"] == (
        CONCURRENCY, Q_HEADS, KV_HEADS, CONTEXT, CONTEXT, HEAD_DIM, 1, 0, 0
    )  # fmt: skip
    # decode: attends over every slot of the static cache with a (concurrency, 1, 1, slots)
    # mask, one row a sequence. transformers 5.24 folds the 2 query heads of each group into
    # q_len over the 2 kv heads; 5.17 (the H200 measurements' release) repeats the kv heads to
    # the 4 query heads first (repeat_kv: a copy of each layer's keys and values), as SDPA's
    # GQA path takes no mask there. The same FLOPs; the copy is in the trace's memory.
    group = Q_HEADS // KV_HEADS
    if _release(transformers_version()) >= (5, 24):
        heads, q_len = (KV_HEADS, KV_HEADS), group
    else:
        heads, q_len = (Q_HEADS, Q_HEADS), 1
    assert shapes["decode"] == (
        CONCURRENCY,
        *heads,
        q_len,
        CONTEXT + NEW,
        HEAD_DIM,
        0,
        1,
        CONCURRENCY,
    )


def test_cache_update_moves_only_the_new_keys_and_values() -> None:
    profile = _serve()
    updates = [op for op in profile.ops if op.phase == "decode" and op.name == "aten.index_copy_"]
    assert len(updates) == 2 * LAYERS
    one_token = CONCURRENCY * KV_HEADS * 1 * HEAD_DIM * 2
    assert {op.bytes_written for op in updates} == {one_token}


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_fake_inference_trace_equals_a_real_cpu_run(precision: Precision) -> None:
    fake, real = _serve(precision, fake=True), _serve(precision, fake=False)
    assert live_peak(fake) == live_peak(real)
    assert fake.flops_per_step == real.flops_per_step
    assert fake.bytes_per_step == real.bytes_per_step
    assert [op.name for op in fake.ops] == [op.name for op in real.ops]


def test_defaults_context_fits_the_model_positions() -> None:
    # tiny-llama has 256 positions: the default context leaves room for the new tokens
    profile = trace_step(config_workload(TINY_LLAMA), RunConfig(mode="inference"))
    assert profile.run.new_tokens == DEFAULT_NEW_TOKENS
    assert profile.run.context == CONFIG["max_position_embeddings"] - DEFAULT_NEW_TOKENS
    assert profile.batch_size == 1 and profile.units_per_step == 1


def test_batch_size_is_another_name_for_concurrency() -> None:
    workload = config_workload(TINY_LLAMA)
    run = RunConfig(mode="inference", batch_size=2, seq_len=32, new_tokens=8)
    profile = trace_step(workload, run)
    assert (profile.batch_size, profile.seq_len, profile.units_per_step) == (2, 32, 2)
    with pytest.raises(UsageError, match="concurrency"):
        trace_step(workload, RunConfig(mode="inference", batch_size=2, concurrency=4))


def test_context_longer_than_the_model_is_refused() -> None:
    with pytest.raises(UnsupportedWorkload, match="positions"):
        trace_step(
            config_workload(TINY_LLAMA), RunConfig(mode="inference", context=250, new_tokens=16)
        )


def test_models_that_do_not_generate_keep_a_plain_forward() -> None:
    workload = config_workload(TINY_LLAMA, task="seq-cls")
    profile = trace_step(workload, RunConfig(mode="inference", batch_size=1, seq_len=32))
    assert {op.phase for op in profile.ops} == {"setup", "forward"}
    assert "kv_cache" not in profile.choices
    with pytest.raises(UnsupportedWorkload, match="--context"):
        trace_step(workload, RunConfig(mode="inference", context=32))


def test_cli_profiles_inference() -> None:
    result = run_cli(
        "profile",
        "--config",
        str(TINY_LLAMA),
        "--mode",
        "inference",
        "--context",
        "64",
        "--new-tokens",
        "16",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["units_per_step"] == 1
    assert doc["seq_len"] == 64
    assert "kv_cache" in doc["choices"]


def test_allocation_and_in_place_fills_move_only_what_they_write() -> None:
    import torch

    from whichgpu.trace.recorder import Recorder

    x = torch.ones(256, 64)
    with Recorder(record_ops_of_step=0) as rec:
        noise = torch.empty_like(x)
        noise.bernoulli_(0.9)
        noise.div_(0.9)
        _ = x * noise
    moved = {op.name: (op.bytes_read, op.bytes_written) for op in rec.ops}
    size = x.numel() * x.element_size()
    assert moved["aten.empty_like"] == (0, 0)  # allocates, touches nothing
    assert moved["aten.bernoulli_"] == (0, size)  # overwrites without reading
    assert moved["aten.div_"] == (size, size)
    assert moved["aten.mul"] == (2 * size, size)


def test_dropout_is_traced_as_cudas_kernels() -> None:
    # F.dropout runs CUDA's native_dropout (a one-byte mask), and SDPA's dropout the fused
    # kernel, which keeps no scores; the Lambda stand-ins keep their materialised scores.
    from whichgpu.schema import RunConfig
    from whichgpu.trace.step import trace_step
    from whichgpu.workloads import get_workload

    run = RunConfig(batch_size=1, seq_len=32)
    gpt2 = trace_step(get_workload("gpt2"), run)
    names = {op.name for op in gpt2.ops}
    assert "aten.native_dropout" in names and "aten.bernoulli_" not in names
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in names
    assert gpt2.choices["attention_dropout"].startswith("p=0.1")
    stand_in = trace_step(get_workload("bert-base"), run)
    assert "attention_dropout" not in stand_in.choices
    assert not any(op.kind == "attention" for op in stand_in.ops)
