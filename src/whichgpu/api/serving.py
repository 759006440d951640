"""Serving engines' answers for ``predict``, ``fit`` and ``recommend``: the engine a question
names and its options checked (``--serving``, ``--quantization``, ``--kv-cache-dtype``), the
engine's memory with quantized weights or an fp8 KV cache on each GPU, and its speed
(``estimate.engine_speed``: TTFT, TPOT, output tokens/s, cost per million tokens) with what it
assumes, in words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from whichgpu.api.step import Step
from whichgpu.catalog.stacks import get_serving_engine
from whichgpu.errors import UsageError, option
from whichgpu.schema import (
    GpuSpec,
    MemoryEstimate,
    RunConfig,
    ServingBenchmark,
    ServingEngine,
    ServingSpeed,
    SoftwareStack,
)

if TYPE_CHECKING:
    from whichgpu.catalog.query import Catalog
    from whichgpu.estimate.engine_speed import (
        BurstTimes,
        EngineSpeed,
        KvCacheDtype,
        ModelShape,
        Quantization,
        QuantizedPath,
    )
    from whichgpu.estimate.throughput import GpuRates


def engine_asked(
    serving: str | None, mode: str, tpot_ms: float | None, ttft_ms: float | None
) -> ServingEngine | None:
    """The serving engine ``serving`` names (None: plain PyTorch), checked with its options."""
    if serving is None:
        if tpot_ms is not None or ttft_ms is not None:
            raise UsageError(
                f"{option('tpot_ms')} and {option('ttft_ms')} are targets of a serving engine; "
                f"add {option('serving')} vllm."
            )
        return None
    if mode != "inference":
        raise UsageError(
            f"{option('serving')} predicts a serving engine's speed; add {option('mode')} "
            "inference."
        )
    for name, value in (("tpot_ms", tpot_ms), ("ttft_ms", ttft_ms)):
        if value is not None and not value > 0:
            raise UsageError(f"{option(name)} must be a positive number of milliseconds.")
    return get_serving_engine(serving)


def checked_requests(
    requests: int | None, engine: ServingEngine | None, run: RunConfig
) -> int | None:
    """``requests`` (a closed-loop benchmark's prompts), checked against the run: it needs a
    serving engine and generated tokens."""
    if requests is None:
        return None
    if engine is None:
        raise UsageError(
            f"{option('requests')} simulates a serving engine's benchmark run; add "
            f"{option('serving')} vllm (and {option('mode')} inference)."
        )
    if requests < 1:
        raise UsageError(f"{option('requests')} must be a positive number of requests.")
    if run.new_tokens == 0:
        raise UsageError(
            f"{option('requests')} simulates requests that generate tokens; with "
            f"{option('new_tokens')} 0 the steady state is the answer (drop {option('requests')})."
        )
    return requests


def checked_quantization(
    quantization: str | None, engine: ServingEngine | None, run: RunConfig
) -> Quantization | None:
    """``quantization`` checked: one of ``engine_speed.QUANTIZATIONS``, with a serving engine
    or compiled decoding (inference ``--compile``: torchao's weight-only int8 and int4), and a
    16-bit serving dtype (the layers left unquantized and the activations)."""
    from whichgpu.estimate.engine_speed import COMPILED_WEIGHT_FORMATS, QUANTIZATIONS

    if quantization is None:
        return None
    compiled_decoding = engine is None and run.mode == "inference" and run.compile
    if engine is None and not compiled_decoding:
        raise UsageError(
            f"{option('quantization')} is how a serving engine or compiled decoding stores the "
            f"weights; add {option('serving')} vllm (or tensorrt-llm), or {option('compile')} "
            f"with {option('mode')} inference (int8, int4)."
        )
    if (
        compiled_decoding
        and quantization in QUANTIZATIONS
        and quantization not in COMPILED_WEIGHT_FORMATS
    ):
        raise UsageError(
            f"{option('quantization')} {quantization} with {option('compile')}: compiled "
            f"decoding models torchao's weight-only {', '.join(COMPILED_WEIGHT_FORMATS)}; "
            f"fp8 weights are modelled for serving engines ({option('serving')} vllm)."
        )
    for known in QUANTIZATIONS:
        if quantization == known:
            if run.precision not in ("bf16", "fp16", "bf16-pure"):
                raise UsageError(
                    f"{option('quantization')} {known} keeps activations and the other layers "
                    f"in 16 bits; use {option('precision')} bf16 or fp16, not {run.precision}."
                )
            return known
    raise UsageError(
        f"{option('quantization')} {quantization!r} is not modelled: use "
        f"{', '.join(QUANTIZATIONS)}."
    )


def checked_kv_cache_dtype(
    kv_cache_dtype: str | None, engine: ServingEngine | None, run: RunConfig
) -> KvCacheDtype:
    """``kv_cache_dtype`` checked: one of ``engine_speed.KV_CACHE_DTYPES`` (None: ``auto``,
    the serving dtype); ``fp8`` only in inference, with a serving engine (plain PyTorch
    generation keeps its cache in the serving dtype)."""
    from whichgpu.estimate.engine_speed import KV_CACHE_DTYPES

    if kv_cache_dtype is None or kv_cache_dtype == "auto":
        return "auto"
    if kv_cache_dtype != "fp8":
        raise UsageError(
            f"{option('kv_cache_dtype')} {kv_cache_dtype!r} is not modelled: use "
            f"{' or '.join(KV_CACHE_DTYPES)}."
        )
    if run.mode != "inference":
        raise UsageError(
            f"{option('kv_cache_dtype')} is how a serving engine stores its KV cache; "
            f"training keeps none: add {option('mode')} inference and {option('serving')} vllm."
        )
    if engine is None:
        raise UsageError(
            f"an fp8 KV cache is a serving engine's; add {option('serving')} vllm (or "
            "tensorrt-llm): plain PyTorch generation keeps its cache in the serving dtype."
        )
    return "fp8"


def kv_cache_note(step: Step, source: str) -> str:
    """What the answer assumes of the engine's fp8 KV cache, in words (``source``: where the
    engine's path on the GPU is documented)."""
    assert step.kv_per_token is not None
    fp8 = step.engine_kv_per_token() or 0
    return (
        f"KV cache in fp8 (e4m3): 1 byte per key and value element, {fp8:,} B per token "
        f"against {step.kv_per_token:,} B in {step.run.precision}: the cache holds "
        f"{step.kv_per_token / fp8:g}x the tokens and a decode step reads "
        f"{fp8 / step.kv_per_token:.0%} of the KV bytes; attention FLOPs unchanged; the "
        "per-tensor (or per-head) fp32 "
        "scales, a few bytes per layer, are left out, and so is the conversion in the "
        "attention kernel; accuracy (scales calibrated or 1.0) is the user's to check; the "
        f"engine keeps it on this GPU per {source}"
    )


def compiled_weights(step: Step, gpu: GpuSpec) -> tuple[int, str] | None:
    """Compiled decoding's quantized weights on ``gpu`` (None: none asked): the bytes one GPU
    holds less than the traced 16-bit request, and the format in words;
    ``QuantizationRefused`` where the GPU cannot run them (``compiled_quantization_refusal``)."""
    if step.quantization is None:
        return None
    from whichgpu.estimate.engine_speed import (
        COMPILED_WEIGHT_FORMATS,
        QuantizationRefused,
        compiled_quantization_refusal,
        model_shape,
    )
    from whichgpu.estimate.memory import weights_bytes
    from whichgpu.estimate.serving import serving_dtype_bytes

    why = compiled_quantization_refusal(step.quantization, gpu)
    if why is not None:
        raise QuantizationRefused(f"{why}.")
    assert step.model_config is not None and step.kv_per_token is not None
    fmt = COMPILED_WEIGHT_FORMATS[step.quantization]
    held = weights_bytes(step.profile)
    stored = model_shape(
        step.model_config, held, step.kv_per_token, serving_dtype_bytes(step.run.precision), fmt
    ).weights_bytes
    return max(held - stored, 0) // step.run.gpus, fmt.label


def engine_quantization(
    step: Step,
    engine: ServingEngine,
    gpu: GpuSpec,
    estimate: MemoryEstimate,
    software: SoftwareStack,
    quantization: Quantization | None,
) -> tuple[MemoryEstimate, QuantizedPath | None]:
    """``estimate`` with its engine's KV budget sized for the weights stored as
    ``quantization`` says and for the KV cache ``step.kv_cache_dtype`` says, and how the
    engine runs the weights on ``gpu`` (None: unquantized); ``QuantizationRefused`` where the
    engine cannot run them on ``gpu`` (``KvCacheRefused``: it has no fp8 KV cache there)."""
    fp8_kv = step.kv_cache_dtype == "fp8"
    if quantization is None and not fp8_kv:
        return estimate, None
    from whichgpu.estimate.engine_speed import kv_cache_fp8_source, model_shape, quantized_path
    from whichgpu.estimate.memory import weights_bytes
    from whichgpu.estimate.serving import kv_on_one_gpu, serving_dtype_bytes, with_engine_storage

    assert step.model_config is not None and step.kv_per_token is not None
    kv_note = kv_per_token = None
    if fp8_kv:
        kv_note = kv_cache_note(step, kv_cache_fp8_source(engine.id, engine.label, gpu))
        kv_per_token = kv_on_one_gpu(
            step.engine_kv_per_token() or 0, step.kv_heads or 1, step.run.gpus
        )
    path = (
        None if quantization is None else quantized_path(engine.id, engine.label, quantization, gpu)
    )
    shape = model_shape(
        step.model_config,
        weights_bytes(step.profile),
        step.kv_per_token,
        serving_dtype_bytes(step.run.precision),
        None if path is None else path.format,
    )
    stored = with_engine_storage(
        estimate,
        engine,
        software,
        weights_bytes=shape.weights_bytes,
        label=None if path is None else path.format.label,
        kv_per_token_bytes=kv_per_token,
        kv_note=kv_note,
    )
    return stored, path


def engine_fits(estimate: MemoryEstimate, run: RunConfig) -> bool:
    """Whether the engine's KV cache holds the asked sequences (one, without a concurrency)."""
    served = estimate.serving
    return served is not None and served.max_concurrency >= (run.batch_size or 1)


def serving_speed_on_gpu(
    step: Step,
    engine: ServingEngine,
    gpu: GpuSpec,
    rates: GpuRates,
    estimate: MemoryEstimate,
    targets_ms: tuple[float | None, float | None],
    catalog: Catalog,
    *,
    path: QuantizedPath | None = None,
    requests: int | None = None,
) -> ServingSpeed:
    """The engine's speed on ``gpu`` (``step.run.gpus`` of them, tensor parallel) at the
    asked concurrency (default: the most its KV cache holds), its growth with the concurrency,
    the largest concurrency within the targets and the cost per million output tokens; with
    ``path``, of weights quantized as it says (``engine_quantization``); with ``requests``, a
    closed-loop benchmark of that many requests too (``ServingSpeed.benchmark``)."""
    from whichgpu.estimate.engine_speed import prefill_only_speed

    # the engine's defaults on this GPU (its token budget), as its memory answer took them
    run = step.run
    n = run.gpus
    engine = engine.on_gpu(estimate.capacity_bytes / 2**30, gpu.name, n)
    context = estimate.seq_len or run.context or 1
    new = 1 if run.new_tokens is None else run.new_tokens
    limit = estimate.serving.max_concurrency if estimate.serving is not None else None
    concurrency = run.batch_size or max(limit or 1, 1)
    speed, rate_notes = _engine_speed(step, engine, gpu, rates, path)
    hourly, source = _rental(catalog, gpu, n)
    quantized = _quantized_notes(speed.shape, path)
    label = engine.label if path is None else f"{engine.label}, {path.format.label}"
    if step.kv_cache_dtype == "fp8":
        from whichgpu.estimate.engine_speed import kv_cache_fp8_source

        quantized += (kv_cache_note(step, kv_cache_fp8_source(engine.id, engine.label, gpu)),)
        label += ", fp8 KV cache"
    if new == 0:  # prefill-only requests: no decode step
        return prefill_only_speed(
            speed,
            engine=engine.id,
            engine_label=label,
            concurrency=concurrency,
            context=context,
            max_concurrency=limit,
            targets_ms=targets_ms,
            usd_per_gpu_hour=hourly,
            price_source=source,
            notes=(*quantized, *rate_notes),
        )
    return _decoding_speed(
        speed,
        engine,
        label,
        gpus=n,
        concurrency=concurrency,
        context=context,
        new_tokens=new,
        max_concurrency=limit,
        targets_ms=targets_ms,
        usd_per_gpu_hour=hourly,
        price_source=source,
        quantized=quantized,
        rate_notes=rate_notes,
        requests=requests,
    )


def _engine_speed(
    step: Step, engine: ServingEngine, gpu: GpuSpec, rates: GpuRates, path: QuantizedPath | None
) -> tuple[EngineSpeed, tuple[str, ...]]:
    """The engine's step-time model of the served model on ``gpu`` (``step.run.gpus`` of them;
    with ``path``, of its quantized weights), and what its achievable rates assume."""
    from whichgpu.estimate.engine_speed import EngineSpeed, engine_rates, model_shape
    from whichgpu.estimate.memory import weights_bytes
    from whichgpu.estimate.serving import serving_dtype_bytes

    run = step.run
    kv_per_token = step.engine_kv_per_token()  # the engine's cache: fp8 where asked
    assert step.model_config is not None and kv_per_token is not None
    shape = model_shape(
        step.model_config,
        weights_bytes(step.profile),
        kv_per_token,
        serving_dtype_bytes(run.precision),
        None if path is None else path.format,
    )
    achievable, rate_notes = engine_rates(
        gpu, rates, run.precision, gpus=run.gpus, kv_heads_total=step.kv_heads or 0, path=path
    )
    whole = engine.runs_prompts_whole(run.context or 0)
    speed = EngineSpeed(
        shape, achievable, chunk_tokens=engine.prefill_chunk_tokens, whole_prompts=whole
    )
    return speed, rate_notes + _prompt_note(engine, run.context or 0)


def _prompt_note(engine: ServingEngine, context: int) -> tuple[str, ...]:
    """How an engine without chunked prefill by default runs the prompts, in words (nothing
    for one that chunks them)."""
    if engine.chunked_prefill:
        return ()
    name = engine.label.split(",")[0].split(" (")[0]
    budget = engine.prefill_chunk_tokens
    if engine.runs_prompts_whole(context):
        return (
            f"{name} runs each prompt whole, in one step beside the decodes (chunked prefill "
            f"is off by default): a step takes the waiting prompts that fit its {budget}-token "
            "budget whole, in arrival order",
        )
    return (
        f"{name}'s defaults refuse a prompt of {context} tokens: with chunked prefill off (its "
        f"default) a prompt may not exceed max_num_tokens ({budget}); this answer is of the "
        "engine with enable_chunked_prefill=True, which serving such prompts needs, its "
        f"prompts chunked into the {budget}-token step budget",
    )


def _rental(catalog: Catalog, gpu: GpuSpec, gpus: int) -> tuple[float | None, str | None]:
    """The cheapest catalog on-demand rate of a machine of ``gpus`` x ``gpu``, in USD per GPU
    hour, and where it is from (None, None: the catalog rents none)."""
    from whichgpu.cost.pricing import cloud_price, price_note

    try:
        price = cloud_price(catalog, gpu, gpus=gpus)
    except UsageError:
        price = None
    if price is None:
        return None, None
    return price.usd, price_note(price)


def _quantized_notes(shape: ModelShape, path: QuantizedPath | None) -> tuple[str, ...]:
    """What the answer assumes of quantized weights (none without ``path``)."""
    if path is None:
        return ()
    return (
        f"weights: {path.label}, {shape.weights_bytes / 2**30:.2f} GiB in all (the "
        "decode step reads these bytes); the engine runs it on this GPU per "
        f"{path.source}",
    )


def _decoding_speed(
    speed: EngineSpeed,
    engine: ServingEngine,
    label: str,
    *,
    gpus: int,
    concurrency: int,
    context: int,
    new_tokens: int,
    max_concurrency: int | None,
    targets_ms: tuple[float | None, float | None],
    usd_per_gpu_hour: float | None,
    price_source: str | None,
    quantized: tuple[str, ...],
    rate_notes: tuple[str, ...],
    requests: int | None = None,
) -> ServingSpeed:
    """The engine's answer for requests that generate ``new_tokens`` (the counterpart of
    ``engine_speed.prefill_only_speed``): TTFT, TPOT and output tokens/s at ``concurrency``,
    their growth with it up to ``max_concurrency`` (the most the KV cache holds), the largest
    concurrency within ``targets_ms``, and the cost per million output tokens at
    ``usd_per_gpu_hour``; what the quantized weights and the rates assume joins its
    assumptions (``_decoding_assumptions``); with ``requests``, a closed-loop benchmark of
    that many requests at ``concurrency`` (``engine_run.closed_loop``), its running sequences
    capped by the engine's scheduler and the KV cache."""
    from whichgpu.estimate.engine_run import closed_loop
    from whichgpu.estimate.engine_speed import concurrency_ladder

    n, new, limit = gpus, new_tokens, max_concurrency
    hourly, source = usd_per_gpu_hour, price_source
    decode = speed.decode(concurrency, context, new)
    at = speed.point(concurrency, context, new)
    burst = speed.burst(concurrency, context, new)
    tpot_ms, ttft_ms = targets_ms
    within = speed.within_targets(
        limit if limit is not None else concurrency, context, new, targets_ms
    )
    per_million = None
    if hourly is not None:
        per_million = hourly * n / (at.output_tokens_per_s * 3600) * 1e6
    ladder = concurrency_ladder(concurrency, limit)
    benchmark = None
    if requests is not None:  # the KV limit is already within the engine's cap
        benchmark = closed_loop(
            speed,
            requests=requests,
            concurrency=concurrency,
            context=context,
            new_tokens=new,
            running_limit=limit or engine.max_sequences,
        )
    return ServingSpeed(
        engine=engine.id,
        engine_label=label,
        gpus=n,
        concurrency=concurrency,
        context=context,
        new_tokens=new,
        ttft_s=at.ttft_s,
        tpot_s=at.tpot_s,
        output_tokens_per_s=at.output_tokens_per_s,
        decode_bound="memory" if decode.memory_bound else "compute",
        decode_bytes=round(decode.bytes_read),
        decode_flops=decode.flops,
        bandwidth_bound_tpot_s=speed.bandwidth_bound_s(concurrency, context, new),
        max_concurrency=limit,
        by_concurrency=tuple(speed.point(c, context, new) for c in ladder),
        target_tpot_s=None if tpot_ms is None else tpot_ms / 1000,
        target_ttft_s=None if ttft_ms is None else ttft_ms / 1000,
        max_concurrency_within_targets=within,
        usd_per_gpu_hour=hourly,
        usd_per_million_output_tokens=per_million,
        price_source=source,
        burst_ttft_s=burst.ttft_s,
        burst_tpot_s=burst.tpot_s,
        burst_output_tokens_per_s=burst.output_tokens_per_s,
        benchmark=benchmark,
        assumptions=_decoding_assumptions(
            speed.shape,
            engine,
            gpus=n,
            concurrency=concurrency,
            context=context,
            new=new,
            quantized=quantized,
            rate_notes=rate_notes,
            burst=burst,
        )
        + (() if benchmark is None else (_benchmark_note(benchmark, engine, context),))
        + _over_limit_note(concurrency, limit),
    )


def _over_limit_note(concurrency: int, limit: int | None) -> tuple[str, ...]:
    """Where the asked concurrency is more than the engine runs at once, that it is, in words."""
    if limit is None or concurrency <= limit:
        return ()
    return (
        f"asked {concurrency} sequences, the engine runs at most {limit} at once (its KV cache "
        "or its scheduler's cap): the figures are of all of them running, which the engine "
        "does not do; it queues the rest, so their TTFT is longer (--requests N simulates the "
        f"queue; --concurrency {limit} or fewer is the steady state it reaches)",
    )


def _benchmark_note(run: ServingBenchmark, engine: ServingEngine, context: int) -> str:
    """What the simulated benchmark run (``--requests``) assumes, in words."""
    whole = engine.runs_prompts_whole(context)
    return (
        f"benchmark run: {run.requests} requests of these fixed lengths, {run.concurrency} in "
        "flight (the client sends the next as one ends), simulated step by step: the first "
        "wave arrives together; each step runs the decodes, then the prompts in arrival order "
        f"within the {engine.prefill_chunk_tokens}-token budget"
        + (" (each prompt whole, in a step whose budget holds it)" * whole)
        + f"; at most {run.running_limit} "
        "sequences run (the engine's cap or its KV cache); a request sent as another ends "
        "joins a busy engine's step after the next; TTFT and TPOT are each request's, as a "
        "benchmark client measures them, with no HTTP, tokenization or scheduler time"
    )


def _decoding_assumptions(
    shape: ModelShape,
    engine: ServingEngine,
    *,
    gpus: int,
    concurrency: int,
    context: int,
    new: int,
    quantized: tuple[str, ...],
    rate_notes: tuple[str, ...],
    burst: BurstTimes,
) -> tuple[str, ...]:
    """What the engine's answer for requests that generate assumes, in words: the decode
    step's model and what it reads, the ``quantized`` weights, a mixture of experts' routing,
    TTFT and TPOT, the rates (``rate_notes``) and the cost."""
    n = gpus
    whole = engine.runs_prompts_whole(context)
    moe: tuple[str, ...] = ()
    if shape.experts:
        moe = (
            f"mixture of experts: a step of B tokens reads the weights outside the experts "
            f"once and, per layer, the distinct experts its tokens are routed to, "
            f"{shape.experts} x (1 - (1 - {shape.experts_per_token}/{shape.experts})^B) of "
            f"{shape.experts} (uniform, independent routing; real routers are skewed, so fewer "
            f"are read: slow side); {shape.distinct_experts(concurrency):.2f} at concurrency "
            f"{concurrency}; FLOPs of the {shape.experts_per_token} active experts per token",
        )
    graphs = engine.cuda_graph_max_batch
    beyond = (
        f" up to {graphs} sequences (cuda_graph_max_bs on this GPU; a larger decode batch runs "
        "without one, which is not modelled: the answer errs fast there)"
        if graphs is not None and concurrency > graphs
        else ""
    )
    return (
        f"{engine.label}: decode steps replay a captured CUDA graph{beyond} (no per-operator "
        "launch floor); step time = the sum of its kernels, run one after another, each at "
        "its roofline: the weight matrix products max(weights and activations / achievable "
        "bandwidth, FLOPs / achievable tensor rate), attention max(KV cache / bandwidth, "
        "FLOPs / rate), the elementwise kernels (norms, residual adds, activation, rotary "
        "embedding) bytes / bandwidth"
        + (f", plus two all-reduces per layer over {n} GPUs" if n > 1 else ""),
        f"a decode step reads the weights once, every sequence's KV cache at the "
        f"generation's average length (context {context} + {new}/2) and the activations",
        *quantized,
        *moe,
        (
            "TTFT: the prompt run whole in one step beside the other sequences' decode tokens "
            "(steady state, no queueing)"
            if whole
            else f"TTFT: the prompt prefilled in chunks of the {engine.prefill_chunk_tokens}-"
            "token step budget less the other sequences' decode tokens (steady state, no "
            "queueing)"
        )
        + "; the output head runs for the prompt's last token only; the engine's GPU steps "
        "only: a client's TTFT adds the HTTP round trip and tokenizing the prompt",
        "TPOT: a step of the steady state, every sequence's decode token and beside them "
        "the prompts of the requests that replace the finished ones (each prompt prefilled "
        f"once over its {new} decode steps: concurrency x {context} / {new} prompt tokens a "
        f"step, within the {engine.prefill_chunk_tokens}-token budget), as a measured mean "
        "TPOT includes them; output tokens/s = concurrency / TPOT, or the prompts' pace "
        "where the budget holds them back",
        f"burst (the same {concurrency} requests arriving together, an offline batch): their "
        f"prompts prefilled first in steps of the {engine.prefill_chunk_tokens}-token budget "
        + ("(as many whole prompts a step as it holds) " if whole else "")
        + f"(the last request's TTFT, {burst.ttft_s * 1e3:,.1f} ms), then a decode step of all "
        f"of them together per token (TPOT {burst.tpot_s * 1e3:,.2f} ms): "
        f"{burst.output_tokens_per_s:,.0f} output tokens/s, prefill included",
        *rate_notes,
        "cost per million output tokens: the cheapest catalog on-demand rate for this "
        "machine size x GPUs / output tokens per hour at this concurrency, kept busy",
    )


def served_tokens_per_s(speed: ServingSpeed | None) -> float:
    """What orders the engines' answers: output tokens/s, or the prompt tokens/s of
    prefill-only requests (0 without an answer)."""
    if speed is None:
        return 0.0
    if speed.new_tokens == 0:
        return speed.prompt_tokens_per_s or 0.0
    return speed.output_tokens_per_s
