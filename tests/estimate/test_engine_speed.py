"""The serving engine's speed model (``predict --serving``): CUDA-graph decode at the
roofline, chunked prefill, the engines' sourced defaults, tensor-parallel activations in the
engine's KV budget, cost per million output tokens, and published serving measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whichgpu.api import predict
from whichgpu.catalog import load_catalog
from whichgpu.catalog.stacks import get_serving_engine, get_stack, read_serving_engines
from whichgpu.estimate.engine_speed import (
    EngineRates,
    EngineSpeed,
    ModelShape,
    concurrency_ladder,
    engine_rates,
)
from whichgpu.estimate.serving import serving_estimate
from whichgpu.estimate.throughput import gpu_rates, load_inference_parameters
from whichgpu.schema import ServingEngine, ServingEstimate
from whichgpu.units import GB

REFERENCE = Path(__file__).parents[1] / "data" / "serving_reference.json"


def _shape(weights_gb: float = 16.0) -> ModelShape:
    weights = int(weights_gb * GB)
    return ModelShape(
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


def _rates(bandwidth: float = 2.0e12, tensor: float = 250e12) -> EngineRates:
    return EngineRates(
        bandwidth_bytes_per_s=bandwidth,
        peak_bandwidth_bytes_per_s=bandwidth,
        tensor_flops_per_s=tensor,
    )


def test_engines_carry_sourced_speed_defaults() -> None:
    engines = {e.id: e for e in read_serving_engines()}
    assert {"vllm", "tensorrt-llm"} <= set(engines)
    for engine in engines.values():
        for name in ("prefill_chunk_tokens", "memory_fraction_of", "cuda_graphs_decode"):
            assert engine.provenance[name].source  # every value has its source
        assert engine.cuda_graphs_decode
    assert engines["tensorrt-llm"].memory_fraction_of == "free"
    assert engines["tensorrt-llm"].block_size_tokens == 32


def test_batch_one_decode_is_the_weights_over_the_bandwidth() -> None:
    speed = EngineSpeed(_shape(16.0), _rates(2.0e12), chunk_tokens=8192)
    step = speed.decode(1, 1024, 128)
    weights_s = 16.0 * GB / 2.0e12
    assert step.memory_bound
    assert weights_s < step.seconds < 1.02 * weights_s  # KV and activations: ~1 %
    # the steady state's step also prefills the next request's prompt: 1024 / 128 tokens
    steady, prompt = speed.steady_step(1, 1024, 128)
    assert prompt == 8 and step.seconds < steady.seconds < 1.01 * step.seconds
    assert speed.point(1, 1024, 128).output_tokens_per_s == pytest.approx(1 / steady.seconds)


def test_the_steady_state_counts_the_prompts_work_and_never_beats_the_tensor_rate() -> None:
    rates = _rates(tensor=50e12)
    speed = EngineSpeed(_shape(), rates, chunk_tokens=8192)
    for concurrency in (64, 1024, 4000, 6000):
        p = speed.point(concurrency, 128, 128)
        assert p.requests_per_s is not None
        # generated tokens run the whole model; prompt tokens all but the head (a prompt's
        # last token samples the first generated one, counted with them)
        body = 2.0 * (speed.shape.active_matmul_params() - speed.shape.head_params())
        head = 2.0 * speed.shape.head_params()
        flops_per_s = p.output_tokens_per_s * (body + head) + p.requests_per_s * 128 * body
        assert flops_per_s <= rates.tensor_flops_per_s * 1.0001
    # past the budget the prompts set the pace: 8192 - 6000 prompt tokens a step, not 6000
    step, prompt = speed.steady_step(6000, 128, 128)
    assert prompt == 8192 - 6000
    p = speed.point(6000, 128, 128)
    assert p.output_tokens_per_s == pytest.approx(prompt / (128 * step.seconds) * 128)


def test_a_step_is_its_kernels_one_after_another() -> None:
    """A large prefill step: the matrix products are compute-bound, attention and the
    elementwise kernels are not hidden under them, so the step takes their sum."""
    shape, rates = _shape(), _rates(tensor=500e12)
    speed = EngineSpeed(shape, rates, chunk_tokens=8192)
    step = speed.prefill_step(4, 2048)  # 8192 prompt tokens
    tokens = 8192
    matmul_s = 2.0 * shape.active_matmul_params() * tokens / rates.tensor_flops_per_s
    attention_s = 4.0 * shape.layers * shape.q_width * tokens * 1024 / rates.tensor_flops_per_s
    elementwise_s = tokens * shape.elementwise_bytes_per_token() / rates.bandwidth_bytes_per_s
    # per layer: two fused add + RMSNorm (4 x hidden each), SiLU x up (3 x intermediate),
    # rotary embedding of queries and keys, in 16-bit
    assert shape.elementwise_bytes_per_token() == 32 * 2 * (8 * 4096 + 3 * 14336 + 2 * 5120)
    kv_s = tokens * shape.kv_bytes_per_token / rates.bandwidth_bytes_per_s
    assert step.seconds == pytest.approx(matmul_s + max(attention_s, kv_s) + elementwise_s)
    assert step.seconds > max(matmul_s + attention_s, step.bytes_read / rates.bandwidth_bytes_per_s)


def test_the_scheduler_caps_running_sequences() -> None:
    """vLLM runs at most 1024 sequences on a GPU of 70 GiB or more that is not an A100, 256
    elsewhere; TensorRT-LLM 2048 everywhere: a short request's KV cache would hold more."""
    stack = get_stack()
    small = {
        "weights_bytes": 16 * GB,
        "activation_peak_bytes": 2 * GB,
        "kv_per_token_bytes": 65536,
        "tokens_per_sequence": 256,
    }
    vllm, trtllm = get_serving_engine("vllm"), get_serving_engine("tensorrt-llm")

    def on(engine: ServingEngine, gb: int, name: str) -> ServingEstimate:
        """The engine as it runs on that GPU (``on_gpu``), sized there."""
        ran = engine.on_gpu(gb * GB / 2**30, name)
        return serving_estimate(ran, stack, capacity_bytes=gb * GB, **small)

    h100 = on(vllm, 80, "H100 SXM")
    a100 = on(vllm, 80, "A100 SXM4 80GB")
    l40s = on(vllm, 48, "L40S")
    trt = on(trtllm, 80, "H100 SXM")
    assert (h100.max_concurrency, a100.max_concurrency, l40s.max_concurrency) == (1024, 256, 256)
    assert trt.max_concurrency == 2048
    held = h100.kv_blocks // h100.blocks_per_sequence
    assert held > 2048
    assert any("at most 1024 sequences" in a and str(held) in a for a in h100.assumptions)
    assert h100.holds_words() == (
        f"its scheduler runs at most 1024 sequences of 256 tokens at once (its KV cache would "
        f"hold {held})"
    )
    for engine in (vllm, trtllm):
        assert engine.provenance["max_sequences"].source
    # a long request: the KV cache binds first, and nothing is said of the cap
    long = serving_estimate(
        vllm.on_gpu(80 * GB / 2**30, "H100 SXM"),
        stack,
        capacity_bytes=80 * GB,
        **{**small, "tokens_per_sequence": 32768},
    )
    assert long.max_concurrency == long.kv_blocks // long.blocks_per_sequence < 1024
    assert not any("the KV cache would hold" in a for a in long.assumptions)
    assert (
        long.holds_words()
        == f"its KV cache holds {long.max_concurrency} sequences of 32,768 tokens"
    )


def test_decode_grows_with_concurrency_and_turns_compute_bound() -> None:
    speed = EngineSpeed(_shape(), _rates(tensor=50e12), chunk_tokens=8192)
    tpots = [speed.decode(c, 1024, 128).seconds for c in (1, 8, 64, 512)]
    assert tpots == sorted(tpots)
    assert not speed.decode(4096, 128, 16).memory_bound


def test_ttft_is_chunked_prefill_beside_the_decodes() -> None:
    speed = EngineSpeed(_shape(), _rates(), chunk_tokens=2048)
    alone = speed.ttft(1, 8192, 128)
    assert alone > 4 * (16.0 * GB / 2.0e12)  # at least four chunks, each reading the weights
    assert speed.ttft(64, 8192, 128) > alone  # the decodes take part of every step's budget
    assert speed.ttft(1, 100, 128) < alone


def test_largest_concurrency_within_targets() -> None:
    speed = EngineSpeed(_shape(), _rates(), chunk_tokens=8192)
    target = speed.steady_step(32, 1024, 128)[0].seconds
    best = speed.largest_within(1000, 1024, 128, tpot_s=target, ttft_s=None)
    assert best == 32
    assert speed.largest_within(1000, 1024, 128, tpot_s=1e-6, ttft_s=None) == 0
    assert speed.largest_within(16, 1024, 128, tpot_s=10.0, ttft_s=10.0) == 16


def test_ladder_doubles_up_to_the_limit_and_keeps_the_asked() -> None:
    assert concurrency_ladder(24, 100) == (1, 2, 4, 8, 16, 24, 32, 64)
    assert concurrency_ladder(1, None) == (1, 2, 4)


def test_tensor_parallel_activations_split_in_the_kv_budget() -> None:
    engine, stack = get_serving_engine("vllm"), get_stack()
    common = {
        "capacity_bytes": 80 * GB,
        "weights_bytes": 35 * GB,
        "kv_per_token_bytes": 80_000,
        "tokens_per_sequence": 4224,
    }
    one = serving_estimate(engine, stack, activation_peak_bytes=8 * GB, gpus=1, **common)
    four = serving_estimate(engine, stack, activation_peak_bytes=8 * GB, gpus=4, **common)
    assert four.activation_peak_bytes == 2 * GB
    nccl = stack.nccl_bytes_per_gpu
    assert four.kv_cache_budget_bytes == one.kv_cache_budget_bytes + 6 * GB - nccl


def test_free_fraction_engine_keeps_a_share_of_what_is_left() -> None:
    engine, stack = get_serving_engine("tensorrt-llm"), get_stack()
    out = serving_estimate(
        engine,
        stack,
        capacity_bytes=80 * GB,
        weights_bytes=16 * GB,
        activation_peak_bytes=4 * GB,
        kv_per_token_bytes=131072,
        tokens_per_sequence=1152,
    )
    free = 80 * GB - 16 * GB - 4 * GB - stack.cuda_context_bytes
    assert out.kv_cache_budget_bytes == int(0.9 * free)


def test_engine_rates_use_the_throughput_models_constants() -> None:
    gpu = load_catalog().resolve("a100-80gb")
    rates, notes = engine_rates(gpu, gpu_rates(gpu), "bf16")
    share = load_inference_parameters().decode_memory_efficiency
    assert rates.bandwidth_bytes_per_s == pytest.approx(
        gpu_rates(gpu).bandwidth_bytes_per_s * share
    )
    assert any("decode share" in n for n in notes)


def _reference_rows() -> list[dict[str, object]]:
    return list(json.loads(REFERENCE.read_text())["rows"])


@pytest.mark.parametrize("row", _reference_rows(), ids=lambda r: str(r["id"]))
def test_published_serving_measurements(row: dict[str, object]) -> None:
    """Predicted TPOT against published measurements: the errors are reported in
    ``docs/serving.md``, not tuned to; this only fails when a prediction is off by more than
    the row's stated tolerance (a factor)."""
    from whichgpu.api import predict

    est = predict(
        str(row["workload"]),
        gpus=[str(row["gpu"])],
        gpu_count=int(str(row["gpus"])),
        mode="inference",
        context=int(str(row["input_tokens"])),
        new_tokens=int(str(row["output_tokens"])),
        concurrency=int(str(row["concurrency"])),
        serving=str(row["engine"]),
    )[0]
    assert est.serving_speed is not None
    predicted = est.serving_speed.tpot_s * 1000
    measured = float(str(row["tpot_ms"]))
    factor = float(str(row["tolerance_factor"]))
    assert measured / factor <= predicted <= measured * factor, (predicted, measured)


def test_an_engine_takes_its_defaults_for_the_gpu() -> None:
    """vLLM's OpenAI server budgets 2048 tokens a step (and profiles that many) on GPUs under
    70 GiB and on A100s, 8192 elsewhere; TensorRT-LLM 8192 everywhere."""
    vllm, trtllm = get_serving_engine("vllm"), get_serving_engine("tensorrt-llm")
    h100 = vllm.on_gpu(79.1, "H100 SXM")
    a100 = vllm.on_gpu(79.3, "A100 SXM4 80GB")
    l40s = vllm.on_gpu(44.5, "L40S")
    assert (h100.profile_tokens, h100.prefill_chunk_tokens, h100.max_sequences) == (
        8192,
        8192,
        1024,
    )
    for small in (a100, l40s):
        assert (small.profile_tokens, small.prefill_chunk_tokens, small.max_sequences) == (
            2048,
            2048,
            256,
        )
        assert small.on_gpu(44.5, "L40S") == small  # resolving again changes nothing
    assert vllm.provenance["token_budget_small_gpu"].source
    trt = trtllm.on_gpu(44.5, "L40S")
    assert (trt.profile_tokens, trt.prefill_chunk_tokens, trt.max_sequences) == (8192, 8192, 2048)


def test_fit_serving_profiles_the_gpus_token_budget() -> None:
    import whichgpu.api as wg

    ask = {"mode": "inference", "serving": "vllm", "context": 1024, "new_tokens": 128}
    h100, l40s = wg.fit("llama-3.2-1b", gpus=["h100-sxm", "l40s"], **ask)
    assert h100.serving is not None and l40s.serving is not None
    assert (h100.serving.profile_tokens, l40s.serving.profile_tokens) == (8192, 2048)
    assert l40s.serving.activation_peak_bytes < h100.serving.activation_peak_bytes
    (speed,) = wg.predict("llama-3.2-1b", gpus=["l40s"], concurrency=8, **ask)
    assert speed.serving_speed is not None
    assert any("2048-token" in a for a in speed.serving_speed.assumptions)


def test_a_burst_prefills_every_prompt_then_decodes_them_together() -> None:
    speed = EngineSpeed(_shape(), _rates(tensor=250e12), chunk_tokens=2048)
    burst = speed.burst(8, 1000, 128)  # 8,000 prompt tokens: three full steps and 1,856
    full = speed.step(2048, 2048 * 1000 / 2, 2048, 2.048).seconds  # prompts ending a step
    rest = speed.step(1856, 1856 * 1000 / 2, 1856, 1.856).seconds
    assert burst.ttft_s == pytest.approx(3 * full + rest)
    assert burst.tpot_s == speed.decode(8, 1000, 128).seconds
    wall = burst.ttft_s + 127 * burst.tpot_s
    assert burst.output_tokens_per_s == pytest.approx(8 * 128 / wall)
    # the steady state's step carries the next prompts beside the decodes: slower
    steady, _ = speed.steady_step(8, 1000, 128)
    assert burst.tpot_s < steady.seconds


def test_tensorrt_llm_runs_prompts_whole_and_says_what_a_longer_one_needs() -> None:
    """TensorRT-LLM's LLM API has chunked prefill off by default (vLLM's V1 always chunks):
    its answer runs each prompt whole; a prompt past max_num_tokens, which its defaults
    refuse, is answered for the engine with chunked prefill switched on, and says so."""
    import whichgpu.api as wg

    assert get_serving_engine("vllm").chunked_prefill
    trt = get_serving_engine("tensorrt-llm")
    assert not trt.chunked_prefill
    assert trt.provenance["chunked_prefill"].source == "sw-trtllm-chunked-prefill"
    ask = {"mode": "inference", "concurrency": 4, "new_tokens": 128, "gpus": ["h100-sxm"]}
    (short,) = wg.predict("llama-3.1-8b", serving="tensorrt-llm", context=2048, **ask)  # type: ignore[arg-type]
    (long,) = wg.predict("llama-3.1-8b", serving="tensorrt-llm", context=16000, **ask)  # type: ignore[arg-type]
    assert short.serving_speed is not None and long.serving_speed is not None
    assert any("runs each prompt whole" in a for a in short.serving_speed.assumptions)
    assert any("TTFT: the prompt run whole" in a for a in short.serving_speed.assumptions)
    refused = "defaults refuse a prompt of 16000 tokens"
    assert any(
        refused in a and "enable_chunked_prefill=True" in a for a in long.serving_speed.assumptions
    )
    (vllm,) = wg.predict("llama-3.1-8b", serving="vllm", context=16000, **ask)  # type: ignore[arg-type]
    assert vllm.serving_speed is not None
    assert not any("whole" in a or "refuse" in a for a in vllm.serving_speed.assumptions)


def test_only_the_tokens_a_step_samples_from_run_the_output_head() -> None:
    """A prompt's tokens but its last produce no next token: the engines compute logits at
    the positions they sample from, so a 1,000-token prompt runs the head once, not 1,000
    times (for Llama 3.1 8B the head is 6.5 % of the matrix FLOPs of a token)."""
    speed = EngineSpeed(_shape(), _rates(tensor=50e12), chunk_tokens=8192)
    shape = speed.shape
    every = speed.step(1000, 1000 * 500, 1000)
    last = speed.step(1000, 1000 * 500, 1000, 1)
    head_flops = 2.0 * shape.head_params() * 999
    assert every.flops - last.flops == pytest.approx(head_flops)
    assert last.seconds < every.seconds
    # a decode step samples every token: the default
    assert speed.step(8, 8000, 8000).flops == speed.step(8, 8000, 8000, 8).flops
    # a whole prompt's TTFT is the step that samples its first token only
    assert speed.ttft(1, 1000, 16) == pytest.approx(last.seconds)


def test_more_sequences_than_the_engine_holds_are_said_to_queue() -> None:
    """Asked past the KV limit, the answer is of all of them running, and says the engine
    does not run them so."""

    def notes(concurrency: int) -> tuple[int | None, str]:
        (estimate,) = predict(
            "llama-3.1-8b", gpus=["rtx-4090"], mode="inference", serving="vllm",
            context=1024, concurrency=concurrency,
        )  # fmt: skip
        speed = estimate.serving_speed
        assert speed is not None
        return speed.max_concurrency, " ".join(speed.assumptions)

    limit, _ = notes(1)
    assert limit is not None and limit > 1
    _, within = notes(limit)
    _, over = notes(limit + 3)
    assert "queues the rest" not in within
    assert f"asked {limit + 3} sequences, the engine runs at most {limit} at once" in over
