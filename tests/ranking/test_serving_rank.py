"""recommend --serving and fit --serving: a serving engine's KV cache decides what fits, and
its speed (output tokens/s) ranks, so one answer tells one story."""

from __future__ import annotations

import json

import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.errors import UsageError

SERVE_70B = {"mode": "inference", "concurrency": 32, "context": 4096}


def test_fit_takes_its_verdict_from_the_engine() -> None:
    (eager,) = wg.fit("llama-3.1-70b", gpus=["h100-sxm"], gpu_count=4, **SERVE_70B)
    (served,) = wg.fit("llama-3.1-70b", gpus=["h100-sxm"], gpu_count=4, serving="vllm", **SERVE_70B)
    assert not eager.fits  # plain PyTorch prefills the 32 prompts in one pass
    assert served.serving is not None and served.serving.max_concurrency >= 32
    assert served.fits and served.max_batch_size == served.serving.max_concurrency
    assert not served.max_batch_capped
    assert any("fits and the largest concurrency are vLLM" in a for a in served.assumptions)
    # the memory figures stay plain PyTorch's, for comparison
    assert served.device_total_bytes == eager.device_total_bytes


def test_recommend_with_an_engine_ranks_the_routine_deployments() -> None:
    ask = {**SERVE_70B, "acquire": "rent", "gpu_count": "auto", "gpus": ["h100-sxm", "h200-sxm"]}
    eager = wg.recommend("llama-3.1-70b", **ask)
    served = wg.recommend("llama-3.1-70b", serving="vllm", top=20, **ask)
    ranked = {(c.gpu, c.count) for c in served.ranking}
    assert ("h100-sxm", 4) not in {(c.gpu, c.count) for c in eager.ranking}
    assert {("h100-sxm", 4), ("h200-sxm", 2)} <= ranked
    assert all(c.throughput_unit == "output tokens/s" for c in served.ranking)
    assert "to serve with vLLM" in served.answer
    assert any(a.startswith("--serving vllm:") for a in served.assumptions)
    one = next(e for e in served.excluded if (e.gpu, e.count) == ("h100-sxm", 1))
    assert one.kind == "memory" and "KV cache holds 0 sequences" in one.reason
    # the engine's speed, as predict --serving gives it, and its cost per million tokens
    (speed,) = wg.predict(
        "llama-3.1-70b", gpus=["h100-sxm"], gpu_count=4, serving="vllm", **SERVE_70B
    )
    assert speed.serving_speed is not None
    four = next(c for c in served.ranking if (c.gpu, c.count) == ("h100-sxm", 4))
    assert four.throughput == pytest.approx(speed.serving_speed.output_tokens_per_s)
    assert four.batch_size == 32 and four.max_batch_size >= 32
    assert any("per million output tokens" in r for r in four.reasons)


def test_recommend_serving_needs_inference_of_a_language_model() -> None:
    with pytest.raises(UsageError, match="serving"):
        wg.recommend("gpt2", serving="vllm", gpus=["h100-sxm"])
    with pytest.raises(UsageError, match="unknown serving engine"):
        wg.recommend("gpt2", mode="inference", serving="lmdeploy", gpus=["h100-sxm"])
    with pytest.raises(UsageError, match="language models that generate"):
        wg.recommend("bert-base", mode="inference", serving="vllm", gpus=["h100-sxm"])


def test_cli_recommend_serving_json() -> None:
    done = run_cli(
        "recommend", "gpt2", "--mode", "inference", "--concurrency", "8", "--context", "512",
        "--rent", "--serving", "tensorrt-llm", "--gpu", "h100-sxm", "--gpu", "l4", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # the whole output is the document
    assert doc["ranking"] and all(c["throughput_unit"] == "output tokens/s" for c in doc["ranking"])
    assert "TensorRT-LLM" in doc["answer"]
    wrong = run_cli("recommend", "gpt2", "--serving", "vllm", "--gpu", "l4", "--rent")
    assert wrong.returncode != 0 and "--mode inference" in wrong.stderr


def test_a_bought_serving_machine_says_what_a_million_tokens_cost_owned() -> None:
    from whichgpu.catalog.cost_data import shipped_cost_data
    from whichgpu.cost import job_energy, machine_power_w

    ranking = wg.recommend(
        "llama-3.1-8b", mode="inference", concurrency=32, serving="vllm", gpus=["l40s"]
    )
    (best,) = ranking.ranking
    (owned,) = [r for r in best.reasons if r.startswith("owned: ")]
    assert best.purchase_usd is not None
    years = shipped_cost_data().rules.default_years
    power = machine_power_w(wg.gpu("l40s"), 1)
    hour = job_energy(power, 1.0).electricity_usd
    assert hour is not None
    hourly = best.purchase_usd / (years * 365 * 24) + hour
    expected = hourly / (best.throughput * 3600) * 1e6
    assert f"${expected:,.3f} per million output tokens" in owned
    # renting has its rental's figure only
    rented = wg.recommend(
        "llama-3.1-8b",
        mode="inference",
        concurrency=32,
        serving="vllm",
        acquire="rent",
        gpus=["l40s"],
    )
    assert not any(r.startswith("owned: ") for r in rented.ranking[0].reasons)
