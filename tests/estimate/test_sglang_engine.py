"""SGLang as a serving engine: its defaults follow the GPU's memory in tiers, and its memory
fraction holds the weights and the KV cache only (``memory_fraction_of: static``)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from whichgpu.api import fit
from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_serving_engine, get_stack
from whichgpu.cli import app, main
from whichgpu.estimate.memory import capacity_of
from whichgpu.schema import EngineMemoryTier, ServingEngine, StaticReserve


def _capacity_gib(gpu: str) -> float:
    catalog = load_catalog()
    return capacity_of(catalog.resolve(gpu), catalog).bytes / 2**30


def test_an_80_gb_card_gets_the_8k_budget_and_the_10_gib_floor_rule() -> None:
    engine = get_serving_engine("sglang")
    cap = _capacity_gib("h100-sxm")
    one = engine.on_gpu(cap, "H100 SXM")
    # reserved = 512 + 8192 x 1.5 + 256 x 2 + 1 x 128 MiB = 13,440 (above the 10 GiB floor)
    assert (one.prefill_chunk_tokens, one.cuda_graph_max_batch) == (8192, 256)
    assert one.gpu_memory_utilization == round((cap * 1024 - 13440) / (cap * 1024), 3)
    four = engine.on_gpu(cap, "H100 SXM", 4)
    # from TP4 the CUDA graphs go up to 512 sequences: 512 + 12,288 + 1,024 + 512
    assert four.cuda_graph_max_batch == 512
    assert four.gpu_memory_utilization == round((cap * 1024 - 14336) / (cap * 1024), 3)
    assert engine.on_gpu(cap, "H100 SXM") == one  # resolving again changes nothing


def test_a_24_gb_card_gets_the_2k_budget_and_no_floor() -> None:
    engine = get_serving_engine("sglang")
    cap = _capacity_gib("rtx-4090")
    on = engine.on_gpu(cap, "GeForce RTX 4090")
    # 512 + 2048 x 1.5 + 24 x 2 + 128 = 3,760 MiB; the floor is for GPUs over 60 GiB
    assert (on.prefill_chunk_tokens, on.cuda_graph_max_batch) == (2048, 24)
    assert on.gpu_memory_utilization == round((cap * 1024 - 3760) / (cap * 1024), 3)


def test_the_kv_pool_is_the_fraction_of_free_memory_less_the_weights() -> None:
    (estimate,) = fit(
        "llama-3.1-8b", gpus=["h100-sxm"], mode="inference", context=1024, serving="sglang"
    )
    served = estimate.serving
    assert served is not None and served.memory_fraction_of == "static"
    stack = get_stack()
    fraction = served.gpu_memory_utilization
    budget = math.floor(fraction * (estimate.capacity_bytes - stack.cuda_context_bytes))
    # activations are in the memory the fraction leaves out, not taken from the cache
    assert served.kv_cache_budget_bytes == budget - served.weights_bytes
    assert served.block_size_tokens == 1 and served.blocks_per_sequence == 1024 + 128
    held = served.kv_cache_budget_bytes // (131072 * (1024 + 128))
    assert served.max_concurrency == min(held, 2048)


def test_tiers_must_rise_and_end_open() -> None:
    vllm = get_serving_engine("vllm")
    reserve = StaticReserve(
        base_mib=512, per_budget_token_mib=1.5, min_budget_tokens=2048, per_graph_batch_mib=2,
        per_gpu_mib=128, floor_mib=10240, floor_above_gib=60, large_tp_from=4,
    )  # fmt: skip
    tier = EngineMemoryTier(below_gib=40, token_budget=4096, graph_batch=8, graph_batch_large_tp=8)
    last = EngineMemoryTier(
        below_gib=None, token_budget=8192, graph_batch=8, graph_batch_large_tp=8
    )
    fields = vllm.model_dump(exclude={"memory_tiers", "static_reserve", "memory_fraction_of"})
    ok = ServingEngine(
        **fields, memory_tiers=(tier, last), static_reserve=reserve, memory_fraction_of="static"
    )
    assert ok.on_gpu(30, "x").prefill_chunk_tokens == 4096
    assert ok.on_gpu(50, "x").prefill_chunk_tokens == 8192
    with pytest.raises(ValueError, match="memory_tiers"):
        ServingEngine(**fields, memory_tiers=(last, tier), static_reserve=reserve)
    with pytest.raises(ValueError, match="static_reserve"):
        ServingEngine(**fields, memory_fraction_of="static")


def test_cli_predicts_sglang_and_refuses_what_it_does_not_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["predict", "llama-3.1-8b", "--mode", "inference", "--serving", "sglang", "-g",
         "h100-sxm", "--concurrency", "8", "--context", "512", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.stdout)
    speed = doc["serving_speed"]
    assert speed["engine"] == "sglang" and speed["concurrency"] == 8
    assert speed["ttft_s"] > 0 and speed["tpot_s"] > 0
    code = main(
        ["predict", "llama-3.1-8b", "--mode", "inference", "--serving", "sglang", "-g",
         "h100-sxm", "--quantization", "fp8"],
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "fp8 weights are not modelled for this engine" in err and "Traceback" not in err
    assert "--serving tensorrt-llm or vllm models them" in err
