"""Prefill-only requests (``--new-tokens 0``: embedding, classification, scoring, reranking):
accepted as a run, served by the engine model as prefill steps only (requests/s, prompt
tokens/s, the request's latency as its TTFT by Little's law, no TPOT), the engine's KV cache
sized for the prompt alone, prices per million prompt tokens and per thousand requests, the
eager forward pass, and decode answers' JSON unchanged but for the added fields."""

from __future__ import annotations

import itertools
import json

import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.errors import UsageError
from whichgpu.estimate.engine_speed import (
    EngineRates,
    EngineSpeed,
    ModelShape,
    prefill_only_speed,
)
from whichgpu.schema import RunConfig, ServingSpeed, WorkloadInfo, decode_requests_per_s
from whichgpu.units import GB
from whichgpu.workloads.run_config import DEFAULT_NEW_TOKENS, inference_context, run_config

CHUNK = 8192


def _speed(chunk: int = CHUNK) -> EngineSpeed:
    weights = int(16 * GB)
    shape = ModelShape(
        layers=32,
        hidden=4096,
        q_width=4096,
        kv_width=1024,
        intermediate=14336,
        gated_mlp=True,
        vocab=128256,
        matmul_params=weights // 2 - 128256 * 4096,
        weights_bytes=weights,
        kv_bytes_per_token=131072,
        dtype_bytes=2,
    )
    rates = EngineRates(
        bandwidth_bytes_per_s=2.0e12, peak_bandwidth_bytes_per_s=2.0e12, tensor_flops_per_s=600e12
    )
    return EngineSpeed(shape, rates, chunk_tokens=chunk)


# --- the run ---------------------------------------------------------------------------------


def test_run_config_accepts_zero_new_tokens_in_inference() -> None:
    run = run_config(mode="inference", new_tokens=0, context=512, concurrency=8)
    assert run.new_tokens == 0
    with pytest.raises(UsageError, match="at least 1 \\(or 0"):
        run_config(mode="inference", new_tokens=-1)
    with pytest.raises(UsageError, match="inference only"):
        run_config(mode="train", new_tokens=0)


def test_inference_context_keeps_zero_and_defaults_none() -> None:
    info = WorkloadInfo(
        name="lm",
        family="hf-llm",
        task="lm",
        description="a language model",
        input_desc="tokens",
        throughput_unit="tokens",
        default_batch_size=1,
        default_seq_len=1024,
        max_seq_len=2048,
        is_sequence_model=True,
    )
    assert inference_context(info, RunConfig(mode="inference", new_tokens=0)) == (1024, 0)
    assert inference_context(info, RunConfig(mode="inference", context=2048, new_tokens=0)) == (
        2048,
        0,
    )
    assert inference_context(info, RunConfig(mode="inference"))[1] == DEFAULT_NEW_TOKENS


# --- the engine's speed ----------------------------------------------------------------------


def test_prefill_point_has_no_tpot_and_serves_requests() -> None:
    p = _speed().point(64, 512, 0)
    assert p.tpot_s is None and p.output_tokens_per_s == 0
    assert p.requests_per_s is not None and p.requests_per_s > 0
    assert p.prompt_tokens_per_s == pytest.approx(p.requests_per_s * 512)
    assert p.ttft_s == pytest.approx(64 / p.requests_per_s)  # Little's law


def test_prefill_scales_with_concurrency() -> None:
    """Short prompts: more requests share a step (weights read once) until the step budget is
    full; past it the throughput stays and the latency grows in proportion (queueing)."""
    speed = _speed()
    context = 128
    points = [speed.prefill_point(c, context) for c in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)]
    rps = [p.requests_per_s or 0.0 for p in points]
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(rps))
    assert rps[3] > 2 * rps[0]  # batching 8 short prompts beats one at a time
    ttft = [p.ttft_s for p in points]
    assert all(b >= a for a, b in itertools.pairwise(ttft))
    # one request alone: its latency is one step of its prompt
    alone = speed.prefill_step(1, context).seconds
    assert points[0].ttft_s == pytest.approx(alone)
    # the budget is full from 64 x 128 = 8192 tokens: same requests/s, latency x concurrency
    full = speed.prefill_point(64, context)
    double = speed.prefill_point(128, context)
    assert speed.prefill_tokens_per_step(128, context) == CHUNK
    assert double.requests_per_s == pytest.approx(full.requests_per_s)
    assert double.ttft_s == pytest.approx(2 * full.ttft_s)


def test_prefill_longer_than_budget_is_chunked() -> None:
    """A prompt longer than the step budget takes several steps, reading its cached start."""
    speed = _speed(chunk=2048)
    one = speed.prefill_point(1, 8192)
    assert speed.prefill_tokens_per_step(1, 8192) == 2048
    assert one.ttft_s > 3 * speed.prefill_step(1, 2048).seconds
    assert one.requests_per_s == pytest.approx(1 / one.ttft_s)


def test_prefill_only_speed_answer() -> None:
    speed = _speed()
    served = prefill_only_speed(
        speed,
        engine="vllm",
        engine_label="vLLM",
        concurrency=64,
        context=512,
        max_concurrency=800,
        targets_ms=(None, 200.0),
        usd_per_gpu_hour=2.0,
        price_source="test",
    )
    assert served.new_tokens == 0
    assert served.tpot_s is None and served.output_tokens_per_s == 0
    assert served.decode_bound is None and served.decode_bytes is None
    assert served.usd_per_million_output_tokens is None
    assert served.requests_per_s is not None and served.prompt_tokens_per_s is not None
    assert served.step_bound in ("memory", "compute")
    assert served.usd_per_million_prompt_tokens == pytest.approx(
        2.0 / (served.prompt_tokens_per_s * 3600) * 1e6
    )
    assert served.usd_per_thousand_requests == pytest.approx(
        2.0 / (served.requests_per_s * 3600) * 1e3
    )
    assert [p.concurrency for p in served.by_concurrency][:3] == [1, 2, 4]
    assert all(p.tpot_s is None for p in served.by_concurrency)
    within = served.max_concurrency_within_targets
    assert within is not None and 0 < within < 800
    last, next_one = speed.prefill_point(within, 512), speed.prefill_point(within + 1, 512)
    assert last.ttft_s <= 0.2 < next_one.ttft_s
    assert any("Little's law" in a for a in served.assumptions)
    with pytest.raises(UsageError, match="tpot_ms"):
        prefill_only_speed(
            speed,
            engine="vllm",
            engine_label="vLLM",
            concurrency=1,
            context=512,
            max_concurrency=8,
            targets_ms=(50.0, None),
        )


def test_decode_answer_json_keeps_its_fields() -> None:
    """A decode answer written before the per-request fields reads back with them derived;
    its own fields keep their values."""
    old = {
        "engine": "vllm",
        "engine_label": "vLLM",
        "gpus": 1,
        "concurrency": 32,
        "context": 1024,
        "new_tokens": 128,
        "ttft_s": 0.02,
        "tpot_s": 0.01,
        "output_tokens_per_s": 3200.0,
        "decode_bound": "memory",
        "decode_bytes": 20_000_000_000,
        "decode_flops": 1e12,
        "bandwidth_bound_tpot_s": 0.006,
        "usd_per_gpu_hour": 2.0,
        "usd_per_million_output_tokens": 0.17,
    }
    served = ServingSpeed.model_validate(old)
    doc = json.loads(served.model_dump_json())
    assert {k: doc[k] for k in old} == old
    rps = decode_requests_per_s(32, 0.02, 0.01, 128)
    assert served.requests_per_s == pytest.approx(rps) == pytest.approx(32 / (0.02 + 127 * 0.01))
    assert served.prompt_tokens_per_s == pytest.approx(rps * 1024)
    assert served.usd_per_thousand_requests == pytest.approx(2.0 / (rps * 3600) * 1e3)
    assert served.usd_per_million_prompt_tokens is None
    decode = _speed().point(32, 1024, 128)
    assert decode.requests_per_s == pytest.approx(
        decode_requests_per_s(32, decode.ttft_s, decode.tpot_s or 0.0, 128)
    )


# --- memory and the eager forward pass -------------------------------------------------------


def test_engine_kv_holds_the_prompt_only() -> None:
    def served(new_tokens: int) -> int:
        (est,) = wg.fit(
            "llama-3.1-8b",
            gpus=["h100-sxm"],
            mode="inference",
            context=512,
            new_tokens=new_tokens,
            concurrency=64,
            serving="vllm",
        )
        assert est.serving is not None
        assert est.serving.tokens_per_sequence == 512 + new_tokens
        return est.serving.max_concurrency

    assert served(0) > served(128)


def test_eager_prefill_only_is_one_forward_pass() -> None:
    (est,) = wg.predict(
        "llama-3.1-8b",
        gpus=["h100-sxm"],
        mode="inference",
        context=512,
        new_tokens=0,
        concurrency=8,
    )
    assert est.run.new_tokens == 0
    assert est.decode_step_s is None and est.prefill_s is not None
    assert est.step_time_s == pytest.approx(est.prefill_s)
    assert est.throughput == pytest.approx(8 * 512 / est.prefill_s)  # prompt tokens/s
    assert any("prefill-only" in a for a in est.assumptions)


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_predict_prefill_only_json() -> None:
    done = run_cli(
        "predict", "llama-3.1-8b", "--mode", "inference", "--serving", "vllm",
        "--new-tokens", "0", "--context", "512", "--concurrency", "64",
        "--gpu", "h100-sxm", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # stdout is the JSON alone
    speed = doc[0]["serving_speed"]
    assert speed["new_tokens"] == 0 and speed["context"] == 512
    assert speed["tpot_s"] is None and speed["output_tokens_per_s"] == 0
    assert speed["requests_per_s"] > 0
    assert speed["prompt_tokens_per_s"] == pytest.approx(speed["requests_per_s"] * 512)
    assert speed["ttft_s"] == pytest.approx(64 / speed["requests_per_s"])
    assert speed["usd_per_million_prompt_tokens"] > 0
