"""Quantized serving (``--quantization``) and mixture-of-experts decode in the serving engine's
speed model: the weights' bytes of each format, the engines' support per GPU (refused with the
reason), the fp8 tensor rate of W8A8, the KV budget the smaller weights leave, and the distinct
experts a decode step reads."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.catalog import load_catalog
from whichgpu.errors import UsageError
from whichgpu.estimate.engine_speed import (
    WEIGHT_FORMATS,
    EngineRates,
    EngineSpeed,
    QuantizationRefused,
    engine_rates,
    model_shape,
    quantized_path,
)
from whichgpu.estimate.serving import kv_bytes_per_token
from whichgpu.estimate.throughput import gpu_rates, load_inference_parameters, load_parameters
from whichgpu.units import GB
from whichgpu.workloads.hf import read_config

LLAMA_8B = read_config("llama-3.1-8b")
MIXTRAL = read_config("mixtral-8x7b")
SERVE: dict[str, Any] = {"mode": "inference", "context": 1024, "new_tokens": 128, "concurrency": 1}


def _rates(bandwidth: float = 2.0e12, tensor: float = 500e12) -> EngineRates:
    return EngineRates(
        bandwidth_bytes_per_s=bandwidth,
        peak_bandwidth_bytes_per_s=bandwidth,
        tensor_flops_per_s=tensor,
    )


# --- formats: bytes, not factors -------------------------------------------------------------


def test_weight_formats_count_their_scales_and_zero_points() -> None:
    assert WEIGHT_FORMATS["int4"].bytes_per_weight(4096) == pytest.approx(0.5 + 2.5 / 128)
    assert WEIGHT_FORMATS["int8"].bytes_per_weight(4096) == pytest.approx(1 + 2 / 128)
    assert WEIGHT_FORMATS["fp8"].bytes_per_weight(4096) == pytest.approx(1 + 4 / 4096)


def test_quantized_llama_keeps_embeddings_and_head_in_16_bits() -> None:
    params = 8_030_261_248  # Llama 3.1 8B
    kv = kv_bytes_per_token(LLAMA_8B, 2)
    bf16 = model_shape(LLAMA_8B, params * 2, kv, 2)
    int4 = model_shape(LLAMA_8B, params * 2, kv, 2, WEIGHT_FORMATS["int4"])
    embeddings = 2 * 128256 * 4096  # embedding and untied head
    linear = params - embeddings - 32 * 2 * 4096 - 4096  # less the norms
    expected = (params - linear) * 2 + linear * (0.5 + 2.5 / 128)
    assert int4.weights_bytes == pytest.approx(expected, rel=1e-6)
    assert 5.5e9 < int4.weights_bytes < 6.0e9  # published AWQ checkpoints: ~5.7 GB
    assert bf16.weights_bytes == params * 2
    assert int4.kv_bytes_per_token == bf16.kv_bytes_per_token  # the cache stays 16-bit


def test_batch_one_decode_reads_the_quantized_bytes() -> None:
    params = 8_030_261_248
    kv = kv_bytes_per_token(LLAMA_8B, 2)
    tpot, weights = {}, {}
    for name in ("bf16", "int8", "int4"):
        fmt = None if name == "bf16" else WEIGHT_FORMATS[name]  # type: ignore[index]
        shape = model_shape(LLAMA_8B, params * 2, kv, 2, fmt)
        step = EngineSpeed(shape, _rates(), chunk_tokens=8192).decode(1, 1024, 128)
        assert step.memory_bound
        cache = (1024 + 64) * kv  # one sequence's KV at its average length
        assert step.bytes_read - cache == pytest.approx(shape.weights_bytes, rel=0.01)
        tpot[name], weights[name] = step.seconds, shape.weights_bytes + cache
    assert tpot["int4"] < tpot["int8"] < tpot["bf16"]
    assert tpot["bf16"] / tpot["int4"] == pytest.approx(weights["bf16"] / weights["int4"], rel=0.01)
    assert tpot["bf16"] / tpot["int4"] > 2.5


# --- which engine runs what where -------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "quantization", "gpu", "w8a8"),
    [
        ("vllm", "fp8", "h100-sxm", True),
        ("vllm", "fp8", "l4", True),
        ("vllm", "fp8", "a100-80gb", False),  # FP8 Marlin, weight-only
        ("vllm", "fp8", "mi300x", True),
        ("vllm", "int4", "v100-sxm2-32gb", False),  # GPTQ kernels from Volta
        ("vllm", "int8", "a100-80gb", False),
        ("tensorrt-llm", "fp8", "h100-sxm", True),
        ("tensorrt-llm", "int4", "a100-80gb", False),
    ],
)
def test_engines_run_quantization_where_documented(
    engine: str, quantization: str, gpu: str, w8a8: bool
) -> None:
    spec = load_catalog().resolve(gpu)
    path = quantized_path(engine, engine, quantization, spec)  # type: ignore[arg-type]
    assert path.fp8_activations is w8a8
    assert path.source


@pytest.mark.parametrize(
    ("engine", "quantization", "gpu", "reason"),
    [
        ("tensorrt-llm", "fp8", "a100-80gb", "8.9"),  # no weight-only fp8 path
        ("tensorrt-llm", "int4", "t4", "8.0"),
        ("vllm", "fp8", "t4", "compute capability 7.5"),
        ("vllm", "int4", "mi300x", "NVIDIA"),
    ],
)
def test_engines_refuse_with_the_reason(
    engine: str, quantization: str, gpu: str, reason: str
) -> None:
    spec = load_catalog().resolve(gpu)
    with pytest.raises(QuantizationRefused, match=re.escape(reason)):
        quantized_path(engine, engine, quantization, spec)  # type: ignore[arg-type]


def test_w8a8_multiplies_at_the_fp8_tensor_rate() -> None:
    gpu = load_catalog().resolve("h100-sxm")
    path = quantized_path("vllm", "vLLM", "fp8", gpu)
    plain, _ = engine_rates(gpu, gpu_rates(gpu), "bf16")
    fp8, notes = engine_rates(gpu, gpu_rates(gpu), "bf16", path=path)
    assert plain.matmul_flops_per_s is None
    assert gpu.fp8_tensor_tflops is not None
    efficiency = load_inference_parameters().fp8_tensor_efficiency  # fitted, not the 16-bit one
    assert 0 < efficiency < 1 and efficiency != load_parameters().tensor_efficiency
    assert fp8.matmul_flops_per_s == pytest.approx(gpu.fp8_tensor_tflops * 1e12 * efficiency)
    assert any(f"{efficiency:.0%} of the catalog's fp8 tensor peak" in n for n in notes)
    # a compute-bound prefill chunk is faster; a batch-1 decode only by the bytes
    kv = kv_bytes_per_token(LLAMA_8B, 2)
    shape = model_shape(LLAMA_8B, 16 * GB, kv, 2, WEIGHT_FORMATS["fp8"])
    slow = EngineSpeed(shape, plain, chunk_tokens=8192).ttft(1, 8192, 0)
    fast = EngineSpeed(shape, fp8, chunk_tokens=8192).ttft(1, 8192, 0)
    assert fast < 0.7 * slow


# --- through the API and the CLI ------------------------------------------------------------


def test_predict_with_quantized_weights() -> None:
    (bf16,) = wg.predict("llama-3.1-8b", gpus=["h100-sxm"], serving="vllm", **SERVE)
    (int4,) = wg.predict(
        "llama-3.1-8b", gpus=["h100-sxm"], serving="vllm", quantization="int4", **SERVE
    )
    assert bf16.serving_speed is not None and int4.serving_speed is not None
    assert int4.serving_speed.decode_bytes < 0.4 * bf16.serving_speed.decode_bytes
    assert int4.serving_speed.tpot_s < 0.4 * bf16.serving_speed.tpot_s
    assert "int4 weight-only" in int4.serving_speed.engine_label
    assert any("W4A16" in a for a in int4.serving_speed.assumptions)
    # the smaller weights leave more KV cache: more sequences fit
    assert int4.serving_speed.max_concurrency is not None
    assert bf16.serving_speed.max_concurrency is not None
    assert int4.serving_speed.max_concurrency > bf16.serving_speed.max_concurrency


def test_fit_budget_grows_by_the_weights_saved() -> None:
    ask = {"gpus": ["h100-sxm"], "gpu_count": 2, "serving": "vllm", **SERVE}
    (bf16,) = wg.fit("llama-3.1-70b", **ask)
    (fp8,) = wg.fit("llama-3.1-70b", quantization="fp8", **ask)
    assert bf16.serving is not None and fp8.serving is not None
    saved = bf16.serving.weights_bytes - fp8.serving.weights_bytes
    assert saved > 30 * GB  # about half of 70B x 2 bytes, per GPU of 2
    assert fp8.serving.kv_cache_budget_bytes == bf16.serving.kv_cache_budget_bytes + saved
    assert fp8.serving.max_concurrency > bf16.serving.max_concurrency
    assert fp8.max_batch_size == fp8.serving.max_concurrency  # the engine's verdict


def test_fit_leaves_out_gpus_the_engine_cannot_run_it_on() -> None:
    out = wg.fit(
        "llama-3.1-8b",
        gpus=["h100-sxm", "a100-80gb"],
        serving="tensorrt-llm",
        quantization="fp8",
        **SERVE,
    )
    assert [e.gpu for e in out] == ["h100-sxm"]
    assert any("A100" in n and "8.9" in n for n in out.notes)


def test_quantization_is_checked() -> None:
    with pytest.raises(UsageError, match="serving"):
        wg.predict("llama-3.1-8b", gpus=["h100-sxm"], quantization="int4", **SERVE)
    with pytest.raises(UsageError, match="not modelled"):
        wg.predict(
            "llama-3.1-8b",
            gpus=["h100-sxm"],
            serving="vllm",
            quantization="nf4",  # type: ignore[arg-type]  # as a caller without types may
            **SERVE,
        )
    with pytest.raises(UsageError, match="16 bits"):
        wg.predict(
            "llama-3.1-8b",
            gpus=["h100-sxm"],
            serving="vllm",
            quantization="int4",
            precision="fp32",
            **SERVE,
        )
    with pytest.raises(QuantizationRefused, match=r"8\.9"):  # one GPU asked: refused outright
        wg.predict(
            "llama-3.1-8b", gpus=["a100-80gb"], serving="tensorrt-llm", quantization="fp8", **SERVE
        )


def test_recommend_serves_quantized_weights() -> None:
    ranking = wg.recommend(
        "llama-3.1-8b",
        acquire="rent",
        gpus=["h100-sxm", "a100-80gb"],
        serving="tensorrt-llm",
        quantization="fp8",
        **SERVE,
    )
    assert [c.gpu for c in ranking.ranking] == ["h100-sxm"]
    (left,) = ranking.excluded
    assert left.gpu.startswith("a100") and "cannot run fp8" in left.reason and "8.9" in left.reason


def test_cli_predict_quantization_json() -> None:
    done = run_cli(
        "predict", "llama-3.1-8b", "--mode", "inference", "--serving", "vllm",
        "--quantization", "int4", "--concurrency", "1", "--context", "1024",
        "--gpu", "h100-sxm", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    speed = doc[0]["serving_speed"]
    assert "W4A16" in speed["engine_label"]
    wrong = run_cli("predict", "llama-3.1-8b", "--mode", "inference", "--quantization", "int4")
    assert wrong.returncode != 0 and "--serving" in wrong.stderr


# --- mixture of experts ---------------------------------------------------------------------


def test_distinct_experts_under_uniform_routing() -> None:
    shape = model_shape(MIXTRAL, 93 * GB, kv_bytes_per_token(MIXTRAL, 2), 2)
    assert (shape.experts, shape.experts_per_token) == (8, 2)
    assert shape.expert_params == 3 * 4096 * 14336
    assert shape.distinct_experts(1) == pytest.approx(2.0)
    assert shape.distinct_experts(2) == pytest.approx(8 * (1 - 0.75**2))
    assert shape.distinct_experts(64) == pytest.approx(8.0, rel=1e-6)
    dense = model_shape(LLAMA_8B, 16 * GB, kv_bytes_per_token(LLAMA_8B, 2), 2)
    assert dense.distinct_experts(16) == 0.0
    assert dense.weights_read_bytes(16) == dense.weights_bytes


def test_moe_decode_reads_the_experts_its_tokens_are_routed_to() -> None:
    shape = model_shape(MIXTRAL, 93 * GB, kv_bytes_per_token(MIXTRAL, 2), 2)
    experts = shape.layers * shape.experts * shape.expert_bytes
    speed = EngineSpeed(shape, _rates(), chunk_tokens=8192)
    one = speed.decode(1, 1024, 128)
    # batch 1: the weights outside the experts and 2 of 8 experts per layer
    assert one.bytes_read == pytest.approx(93 * GB - experts * 6 / 8, rel=0.02)
    many = speed.decode(64, 1024, 128)
    weights_part = many.bytes_read - 64 * 1088 * shape.kv_bytes_per_token
    assert weights_part == pytest.approx(93 * GB, rel=0.02)  # every expert is read
    tpots = [speed.decode(b, 1024, 128).seconds for b in (1, 2, 4, 8)]
    assert tpots == sorted(tpots) and tpots[-1] > 2 * tpots[0]
    # FLOPs of the active parameters only
    assert shape.active_matmul_params() == shape.matmul_params - 32 * 6 * shape.expert_params


def test_mixtral_served_reads_less_than_its_weights_at_batch_one() -> None:
    (est,) = wg.predict("mixtral-8x7b", gpus=["h100-sxm"], gpu_count=2, serving="vllm", **SERVE)
    speed = est.serving_speed
    assert speed is not None
    assert speed.decode_bytes < 0.35 * 93e9 / 2 * 1.2  # ~13B active of 47B, per GPU of 2
    assert any("mixture of experts" in a and "uniform" in a for a in speed.assumptions)


def test_compiled_decoding_reads_quantized_weights() -> None:
    """--compile --quantization: torchao's weight-only int8 and int4, no engine. The decode
    step reads the stored bytes at the format's share of the 16-bit bandwidth; fit holds the
    stored weights; int4 needs tinygemm's Ampere or later; fp8 is an engine's."""
    from whichgpu.estimate.engine_speed import COMPILED_WEIGHT_FORMATS, model_shape
    from whichgpu.estimate.throughput import load_inference_parameters

    ask = {"mode": "inference", "compile": True, "concurrency": 1, "context": 64, "new_tokens": 128}
    step = {
        q: wg.predict("llama-3.1-8b", gpus=["h100-sxm"], quantization=q, **ask)[0]  # type: ignore[arg-type]
        for q in (None, "int8", "int4")
    }
    bf16, int8, int4 = (step[q].decode_step_s for q in (None, "int8", "int4"))
    assert bf16 is not None and int8 is not None and int4 is not None
    assert bf16 > int8 > int4
    ratios = load_inference_parameters().weight_only_bandwidth_ratio
    # the linear layers (all but the 16-bit embedding and head) dominate a batch-1 step
    for q, t in (("int8", int8), ("int4", int4)):
        per_weight = COMPILED_WEIGHT_FORMATS[q].bytes_per_weight(4096) / 2
        linear_share = per_weight / ratios[q]
        assert t / bf16 == pytest.approx(linear_share, rel=0.15)
        assert any(
            f"weights stored as {COMPILED_WEIGHT_FORMATS[q].label}" in a
            for a in step[q].assumptions
        )
    (plain,) = wg.fit("llama-3.1-8b", gpus=["h100-sxm"], **ask)  # type: ignore[arg-type]
    (held,) = wg.fit("llama-3.1-8b", gpus=["h100-sxm"], quantization="int4", **ask)  # type: ignore[arg-type]
    smaller = plain.breakdown["weights"] - held.breakdown["weights"]
    stored = model_shape(
        {
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 128256,
        },
        plain.breakdown["weights"],
        131072,
        2,
        COMPILED_WEIGHT_FORMATS["int4"],
    ).weights_bytes
    assert smaller == plain.breakdown["weights"] - stored
    assert held.peak_reserved_bytes == plain.peak_reserved_bytes - smaller
    assert held.max_batch_size >= plain.max_batch_size
    with pytest.raises(UsageError, match="tinygemm"):
        wg.predict("llama-3.1-8b", gpus=["v100-sxm2-32gb"], quantization="int4", **ask)  # type: ignore[arg-type]
    out = wg.predict(
        "llama-3.1-8b", gpus=["v100-sxm2-32gb", "a100-80gb"], quantization="int4", **ask
    )  # type: ignore[arg-type]
    assert [e.gpu for e in out] == ["a100-sxm4-80gb"]
    assert any("V100" in n and "tinygemm" in n for n in out.notes)
    with pytest.raises(UsageError, match="fp8 weights are modelled for serving engines"):
        wg.predict("llama-3.1-8b", gpus=["h100-sxm"], quantization="fp8", **ask)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="or compiled decoding stores the weights"):
        wg.predict("llama-3.1-8b", gpus=["h100-sxm"], quantization="int8", mode="inference")
