"""An fp8 KV cache for serving engines (``--kv-cache-dtype fp8``): one byte per key and value
element, so the engine's cache holds twice the tokens and a decode step reads half the KV
bytes; where the engines have the path (refused with the reason elsewhere), and refused
without a serving engine or in training."""

from __future__ import annotations

import json
from typing import Any

import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.api.catalog import resolve_gpus
from whichgpu.errors import UsageError
from whichgpu.estimate.engine_speed import (
    KV_FP8_BYTES,
    EngineRates,
    EngineSpeed,
    KvCacheRefused,
    QuantizationRefused,
    kv_cache_fp8_source,
    model_shape,
)
from whichgpu.estimate.serving import kv_bytes_per_token
from whichgpu.workloads.hf import read_config

LLAMA_8B = read_config("llama-3.1-8b")
SERVE: dict[str, Any] = {"mode": "inference", "context": 4096, "new_tokens": 128}


def _gpu(name: str) -> Any:
    (gpu,) = resolve_gpus([name])
    return gpu


# --- the bytes -------------------------------------------------------------------------------


def test_kv_bytes_per_token_halve() -> None:
    bf16 = kv_bytes_per_token(LLAMA_8B, 2)
    fp8 = kv_bytes_per_token(LLAMA_8B, KV_FP8_BYTES)
    assert bf16 == 32 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head dim x 2 bytes
    assert fp8 * 2 == bf16


def test_decode_step_reads_half_the_kv_bytes() -> None:
    params = 8_030_261_248  # Llama 3.1 8B
    rates = EngineRates(
        bandwidth_bytes_per_s=2.0e12, peak_bandwidth_bytes_per_s=2.0e12, tensor_flops_per_s=5e14
    )
    steps, steady, tpot = {}, {}, {}
    for name, nbytes in (("bf16", 2), ("fp8", KV_FP8_BYTES)):
        shape = model_shape(LLAMA_8B, params * 2, kv_bytes_per_token(LLAMA_8B, nbytes), 2)
        speed = EngineSpeed(shape, rates, chunk_tokens=8192)
        steps[name] = speed.decode(64, 4096, 256)
        # TPOT is the steady step (decodes and the arriving prompts beside them): with 1024
        # new tokens a request's prompt is spread thin enough that the step is memory-bound
        steady[name], _ = speed.steady_step(64, 4096, 1024)
        tpot[name] = speed.point(64, 4096, 1024).tpot_s
    kv_part = 64 * (4096 + 128) * kv_bytes_per_token(LLAMA_8B, 2)
    assert steps["bf16"].bytes_read - steps["fp8"].bytes_read == pytest.approx(kv_part / 2)
    assert steps["fp8"].flops == steps["bf16"].flops  # attention reads fewer bytes, same FLOPs
    assert steps["bf16"].memory_bound and steps["fp8"].memory_bound
    ratio = steps["fp8"].bytes_read / steps["bf16"].bytes_read
    assert steps["fp8"].seconds / steps["bf16"].seconds == pytest.approx(ratio)
    assert steady["bf16"].memory_bound and steady["fp8"].memory_bound
    assert tpot["fp8"] is not None and tpot["bf16"] is not None
    # the kernels run one after another: attention, reading the cache, is the only one that
    # changes, by the bytes it no longer reads
    saved_s = (steady["bf16"].bytes_read - steady["fp8"].bytes_read) / rates.bandwidth_bytes_per_s
    assert tpot["bf16"] - tpot["fp8"] == pytest.approx(saved_s)
    assert tpot["fp8"] < 0.7 * tpot["bf16"]  # the KV cache is most of what 64 sequences read


# --- through the API ---------------------------------------------------------------------


def test_fit_serving_holds_twice_the_sequences() -> None:
    ask = {"gpus": ["h100-sxm"], "serving": "vllm", **SERVE}
    (auto,) = wg.fit("llama-3.1-8b", **ask)
    (fp8,) = wg.fit("llama-3.1-8b", kv_cache_dtype="fp8", **ask)
    assert auto.serving is not None and fp8.serving is not None
    assert fp8.serving.kv_bytes_per_token * 2 == auto.serving.kv_bytes_per_token
    assert fp8.serving.kv_cache_budget_bytes == auto.serving.kv_cache_budget_bytes
    assert fp8.serving.kv_blocks // 2 == auto.serving.kv_blocks  # twice the blocks, +1 rounding
    ratio = fp8.serving.max_concurrency / auto.serving.max_concurrency
    assert 1.95 < ratio < 2.05
    assert fp8.max_batch_size == fp8.serving.max_concurrency  # the engine's verdict
    assert "fp8 KV cache" in fp8.serving.engine_label
    assert any("KV cache in fp8 (e4m3)" in a for a in fp8.serving.assumptions)
    # the plain-PyTorch figures beside it stay those of its 16-bit cache
    assert fp8.kv_bytes_per_token == auto.kv_bytes_per_token


def test_fp8_kv_with_quantized_weights() -> None:
    ask = {"gpus": ["h100-sxm"], "serving": "vllm", "quantization": "int4", **SERVE}
    (int4,) = wg.fit("llama-3.1-8b", **ask)
    (both,) = wg.fit("llama-3.1-8b", kv_cache_dtype="fp8", **ask)
    assert int4.serving is not None and both.serving is not None
    assert both.serving.weights_bytes == int4.serving.weights_bytes
    assert both.serving.max_concurrency > 1.9 * int4.serving.max_concurrency
    assert "int4" in both.serving.engine_label and "fp8 KV cache" in both.serving.engine_label


def test_predict_serving_reads_half_the_kv() -> None:
    ask = {"gpus": ["h100-sxm"], "serving": "vllm", "concurrency": 64, **SERVE}
    (auto,) = wg.predict("llama-3.1-8b", **ask)
    (fp8,) = wg.predict("llama-3.1-8b", kv_cache_dtype="fp8", **ask)
    a, f = auto.serving_speed, fp8.serving_speed
    assert a is not None and f is not None
    assert a.decode_bytes is not None and f.decode_bytes is not None
    kv_part = 64 * (4096 + 64) * kv_bytes_per_token(LLAMA_8B, 2)
    assert a.decode_bytes - f.decode_bytes == pytest.approx(kv_part / 2, rel=1e-6)
    assert a.decode_flops == f.decode_flops
    assert a.tpot_s is not None and f.tpot_s is not None and f.tpot_s < a.tpot_s
    assert f.output_tokens_per_s > a.output_tokens_per_s
    assert a.max_concurrency is not None and f.max_concurrency is not None
    assert f.max_concurrency > 1.9 * a.max_concurrency
    assert any("KV cache in fp8 (e4m3)" in x and "accuracy" in x for x in f.assumptions)


# --- where it runs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "gpu"),
    [
        ("vllm", "h100-sxm"),
        ("vllm", "a100-80gb"),
        ("vllm", "tesla-v100-sxm2-32gb"),
        ("vllm", "mi300x"),
        ("tensorrt-llm", "h100-sxm"),
        ("tensorrt-llm", "l40s"),
    ],
)
def test_engines_keep_fp8_kv_where_documented(engine: str, gpu: str) -> None:
    assert kv_cache_fp8_source(engine, engine, _gpu(gpu))


@pytest.mark.parametrize(
    ("engine", "gpu", "needs"),
    [
        ("tensorrt-llm", "a100-80gb", "8.9"),
        ("tensorrt-llm", "mi300x", "8.9"),
        ("vllm", "tesla-p40", "7.0"),
        ("vllm", "gaudi2", "7.0"),
    ],
)
def test_engines_refuse_fp8_kv_with_the_reason(engine: str, gpu: str, needs: str) -> None:
    with pytest.raises(KvCacheRefused, match=needs) as refused:
        kv_cache_fp8_source(engine, engine, _gpu(gpu))
    assert "fp8" in str(refused.value) and _gpu(gpu).name in str(refused.value)
    assert isinstance(refused.value, QuantizationRefused)  # caught where quantization is


def test_gpu_without_the_path_is_refused_or_left_out() -> None:
    with pytest.raises(KvCacheRefused, match=r"TensorRT-LLM.*A100.*8\.9"):
        wg.predict(
            "llama-3.1-8b",
            gpus=["a100-80gb"],
            serving="tensorrt-llm",
            kv_cache_dtype="fp8",
            concurrency=1,
            **SERVE,
        )
    out = wg.fit(
        "llama-3.1-8b",
        gpus=["h100-sxm", "a100-80gb"],
        serving="tensorrt-llm",
        kv_cache_dtype="fp8",
        **SERVE,
    )
    assert [e.gpu for e in out] == ["h100-sxm"]
    assert any("A100" in n and "KV cache in fp8" in n for n in out.notes)


def test_recommend_leaves_out_gpus_without_the_path() -> None:
    ranking = wg.recommend(
        "llama-3.1-8b",
        acquire="rent",
        gpus=["h100-sxm", "a100-80gb"],
        serving="tensorrt-llm",
        kv_cache_dtype="fp8",
        concurrency=1,
        **SERVE,
    )
    assert [c.gpu for c in ranking.ranking] == ["h100-sxm"]
    (left,) = ranking.excluded
    assert left.gpu.startswith("a100") and "KV cache in fp8" in left.reason


# --- refused without an engine ---------------------------------------------------------------


def test_plain_generation_and_training_refuse_it() -> None:
    with pytest.raises(UsageError, match="serving engine's; add serving vllm"):
        wg.predict("llama-3.1-8b", gpus=["h100-sxm"], kv_cache_dtype="fp8", **SERVE)
    with pytest.raises(UsageError, match="serving engine's; add serving vllm"):
        wg.fit("llama-3.1-8b", gpus=["h100-sxm"], kv_cache_dtype="fp8", **SERVE)
    with pytest.raises(UsageError, match="training keeps none"):
        wg.fit("llama-3.1-8b", gpus=["h100-sxm"], kv_cache_dtype="fp8", seq_len=1024)
    with pytest.raises(UsageError, match="training keeps none"):
        wg.predict("llama-3.1-8b", gpus=["h100-sxm"], kv_cache_dtype="fp8", seq_len=1024)
    with pytest.raises(UsageError, match="not modelled"):
        wg.predict(
            "llama-3.1-8b", gpus=["h100-sxm"], serving="vllm", kv_cache_dtype="int8", **SERVE
        )
    # auto is the default, and asks for nothing
    (auto,) = wg.fit("llama-3.1-8b", gpus=["h100-sxm"], kv_cache_dtype="auto", **SERVE)
    assert auto.serving is None


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_predict_fp8_kv_json() -> None:
    done = run_cli(
        "predict", "llama-3.1-8b", "--mode", "inference", "--serving", "vllm",
        "--kv-cache-dtype", "fp8", "--gpu", "h100-sxm", "--concurrency", "64", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    speed = json.loads(done.stdout)[0]["serving_speed"]
    assert "fp8 KV cache" in speed["engine_label"]
    assert any("KV cache in fp8 (e4m3)" in a for a in speed["assumptions"])
    wrong = run_cli("predict", "llama-3.1-8b", "--mode", "inference", "--kv-cache-dtype", "fp8")
    assert wrong.returncode != 0 and "add --serving vllm" in wrong.stderr
