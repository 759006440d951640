"""How fast a serving engine runs a language model: the speed model of ``predict --serving``.

Eager PyTorch generation (``estimate.prediction``) pays a host dispatch per operator, which a
batch-1 decode step of a 7B model spends most of its time on. Serving engines (vLLM,
TensorRT-LLM) replay a captured CUDA graph per decode step, so the step runs near the GPU's
roofline: ``max(bytes it reads / achievable bandwidth, FLOPs / achievable tensor rate)``, the
bytes being the weights once, every running sequence's KV cache up to its current length and
the activations. Prompts are prefilled in chunks of the engine's token budget beside the other
sequences' decodes. The achievable shares are the throughput model's own constants
(``data/throughput.json``: the decode bandwidth share, the fitted tensor efficiency); the
model's shape comes from its ``config.json``; tensor parallel adds two all-reduces per layer
and step (``estimate.data_parallel``). Pure Python; no fitted factor of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from whichgpu.estimate.data_parallel import Link, all_reduce_s, gpu_link
from whichgpu.estimate.serving import attention_heads, kv_heads, kv_heads_on_one_gpu, layer_shape
from whichgpu.estimate.throughput import (
    GpuRates,
    load_inference_parameters,
    load_parameters,
    peak_flops_per_s,
)
from whichgpu.schema import GpuSpec, Precision, ServingSpeedPoint

LOGIT_BYTES = 4
"""Bytes per logit: engines compute the sampler's logits in fp32."""


@dataclass(frozen=True)
class ModelShape:
    """What the engine speed model needs of a language model (whole model, not one GPU's)."""

    layers: int
    """Transformer layers."""
    hidden: int
    """Hidden size."""
    q_width: int
    """Query heads x head dim."""
    kv_width: int
    """Key/value heads x head dim."""
    intermediate: int
    """MLP intermediate size."""
    gated_mlp: bool
    """Gate, up and down projections (Llama, Mistral, Qwen) rather than two (GPT-2)."""
    vocab: int
    """Vocabulary (logits per token)."""
    matmul_params: int
    """Parameters that matrix products use per token: all but the embedding lookup (a tied
    head's matrix counts, being the head)."""
    weights_bytes: int
    """Parameters and buffers in the serving dtype."""
    kv_bytes_per_token: int
    """Keys and values of one token over all layers, whole model."""
    dtype_bytes: int
    """Bytes per weight, activation and KV element."""

    def activation_bytes_per_token(self) -> int:
        """Bytes one token's activations move through the matrix products of a forward pass:
        each product reads its input and writes its output once (QKV, attention output,
        MLP projections per layer; the head's fp32 logits)."""
        mlp_out = (2 if self.gated_mlp else 1) * self.intermediate
        per_layer = (
            self.hidden
            + self.q_width
            + 2 * self.kv_width  # QKV in, out
            + self.q_width
            + self.hidden  # attention output projection
            + self.hidden
            + mlp_out  # up (and gate)
            + self.intermediate
            + self.hidden  # down
        )
        return self.layers * per_layer * self.dtype_bytes + self.vocab * LOGIT_BYTES

    def flops_per_token(self, attended: float) -> float:
        """FLOPs of one token attending over ``attended`` tokens: ``2 x matmul params`` plus
        attention's ``QK^T`` and ``PV``, ``4 x layers x q_width x attended``."""
        return 2.0 * self.matmul_params + 4.0 * self.layers * self.q_width * attended


def model_shape(
    config: Mapping[str, Any], weights_bytes: int, kv_bytes_per_token: int, dtype_bytes: int
) -> ModelShape:
    """The shape of the model of a Hugging Face ``config.json`` (GPT-2's names too)."""
    inner = config.get("text_config")
    cfg: Mapping[str, Any] = inner if isinstance(inner, Mapping) else config
    layers, hidden = layer_shape(cfg)
    heads = attention_heads(cfg)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    gated = "intermediate_size" in cfg
    intermediate = int(cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * hidden)
    vocab = int(cfg.get("vocab_size") or 0)
    tied = bool(cfg.get("tie_word_embeddings", "n_embd" in cfg))  # GPT-2 ties its head
    params = weights_bytes // dtype_bytes
    return ModelShape(
        layers=layers,
        hidden=hidden,
        q_width=heads * head_dim,
        kv_width=kv_heads(cfg) * head_dim,
        intermediate=intermediate,
        gated_mlp=gated,
        vocab=vocab,
        matmul_params=params if tied else params - vocab * hidden,
        weights_bytes=weights_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        dtype_bytes=dtype_bytes,
    )


@dataclass(frozen=True)
class EngineRates:
    """What one GPU achieves under a serving engine, and how N of them exchange."""

    bandwidth_bytes_per_s: float
    """Achievable DRAM bandwidth: the catalog's x the decode bandwidth share."""
    peak_bandwidth_bytes_per_s: float
    """The catalog's DRAM bandwidth."""
    tensor_flops_per_s: float
    """Achievable matrix rate: the precision's peak x the fitted tensor efficiency."""
    gpus: int = 1
    """GPUs serving the model tensor parallel."""
    kv_share: float = 1.0
    """Share of the KV cache one GPU holds (its KV heads over all of them)."""
    link: Link | None = None
    """The GPUs' link (tensor parallel), None on one GPU."""


@dataclass(frozen=True)
class StepCost:
    """One engine step on one GPU."""

    seconds: float
    """Wall time, the all-reduces included."""
    bytes_read: float
    """Bytes the GPU reads and writes."""
    flops: float
    """FLOPs the GPU runs."""
    memory_bound: bool
    """Whether the bytes (not the FLOPs) set the time."""


class EngineSpeed:
    """The engine's step times for one model on one GPU type (or N tensor-parallel GPUs)."""

    def __init__(
        self,
        shape: ModelShape,
        rates: EngineRates,
        *,
        chunk_tokens: int,
        reduce_s: Callable[[float, int, Link], float] = all_reduce_s,
    ) -> None:
        self.shape = shape
        self.rates = rates
        self.chunk_tokens = chunk_tokens
        self._reduce_s = reduce_s

    def _step(self, tokens: int, attended_tokens: float, kv_read_tokens: float) -> StepCost:
        """A step running ``tokens`` tokens that attend over ``attended_tokens`` in all
        (summed over tokens) and read ``kv_read_tokens`` tokens of KV cache."""
        shape, rates, n = self.shape, self.rates, self.rates.gpus
        flops = (
            2.0 * shape.matmul_params * tokens
            + 4.0 * shape.layers * shape.q_width * attended_tokens
        ) / n
        nbytes = (
            shape.weights_bytes / n
            + kv_read_tokens * shape.kv_bytes_per_token * rates.kv_share
            + tokens * shape.activation_bytes_per_token() / n
        )
        memory_s = nbytes / rates.bandwidth_bytes_per_s
        compute_s = flops / rates.tensor_flops_per_s
        seconds = max(memory_s, compute_s)
        if n > 1 and rates.link is not None:  # two all-reduces of the hidden states per layer
            hidden_bytes = tokens * shape.hidden * shape.dtype_bytes
            seconds += 2 * shape.layers * self._reduce_s(hidden_bytes, n, rates.link)
        return StepCost(seconds, nbytes, flops, memory_s >= compute_s)

    def decode(self, concurrency: int, context: int, new_tokens: int) -> StepCost:
        """One decode step of ``concurrency`` sequences, each at the generation's average
        length ``context + new_tokens / 2``."""
        length = context + new_tokens / 2
        return self._step(concurrency, concurrency * length, concurrency * length)

    def bandwidth_bound_s(self, concurrency: int, context: int, new_tokens: int) -> float:
        """The decode step's bytes at the full DRAM bandwidth (no compute, no exchange)."""
        step = self.decode(concurrency, context, new_tokens)
        return step.bytes_read / self.rates.peak_bandwidth_bytes_per_s

    def ttft(self, concurrency: int, context: int, new_tokens: int) -> float:
        """One request's prompt of ``context`` tokens prefilled in chunks: each step holds the
        other ``concurrency - 1`` sequences' decode tokens first, then as much of the prompt
        as the engine's token budget leaves (at least one token)."""
        others = concurrency - 1
        chunk = max(self.chunk_tokens - others, 1)
        length = context + new_tokens / 2  # where the other sequences are, on average
        done, seconds = 0, 0.0
        steps = math.ceil(context / chunk)
        if steps > 64:  # equal chunks: time a few and scale (attention grows linearly)
            first = self._chunk_step(others, length, 0, chunk).seconds
            last = self._chunk_step(others, length, (steps - 1) * chunk, chunk).seconds
            return steps * (first + last) / 2
        while done < context:
            size = min(chunk, context - done)
            seconds += self._chunk_step(others, length, done, size).seconds
            done += size
        return seconds

    def _chunk_step(self, others: int, length: float, done: int, size: int) -> StepCost:
        """A step of ``others`` decodes at ``length`` and a prompt chunk of ``size`` tokens
        after ``done`` prompt tokens (which it reads from the cache)."""
        attended = others * length + size * (done + size / 2)
        kv_read = others * length + done + size  # the chunk writes its own keys and values
        return self._step(others + size, attended, kv_read)

    def point(self, concurrency: int, context: int, new_tokens: int) -> ServingSpeedPoint:
        """TTFT, TPOT and output tokens/s at ``concurrency``."""
        tpot = self.decode(concurrency, context, new_tokens).seconds
        return ServingSpeedPoint(
            concurrency=concurrency,
            ttft_s=self.ttft(concurrency, context, new_tokens),
            tpot_s=tpot,
            output_tokens_per_s=concurrency / tpot,
        )

    def largest_within(
        self,
        limit: int,
        context: int,
        new_tokens: int,
        *,
        tpot_s: float | None,
        ttft_s: float | None,
    ) -> int:
        """The largest concurrency up to ``limit`` whose TPOT and TTFT meet the targets (both
        grow with the concurrency), by bisection; 0 when even one sequence misses them."""

        def meets(c: int) -> bool:
            p = self.point(c, context, new_tokens)
            return (tpot_s is None or p.tpot_s <= tpot_s) and (ttft_s is None or p.ttft_s <= ttft_s)

        if limit < 1 or not meets(1):
            return 0
        lo, hi = 1, limit + 1  # meets(lo); hi: not known to meet
        if meets(limit):
            return limit
        hi = limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if meets(mid):
                lo = mid
            else:
                hi = mid
        return lo


def concurrency_ladder(asked: int, limit: int | None) -> tuple[int, ...]:
    """Concurrencies to show: 1, 2, 4 … up to the KV limit (or 4 x the asked one, at most
    1024), and the asked one."""
    top = limit if limit is not None and limit > 0 else max(4 * asked, 1)
    top = min(top, 1024)
    ladder = {asked}
    c = 1
    while c <= top:
        ladder.add(c)
        c *= 2
    return tuple(sorted(x for x in ladder if x >= 1))


def engine_rates(
    gpu: GpuSpec,
    rates: GpuRates,
    precision: Precision,
    *,
    gpus: int = 1,
    kv_heads_total: int = 0,
) -> tuple[EngineRates, tuple[str, ...]]:
    """The achievable rates of ``gpus`` x ``gpu`` under an engine, and where they come from:
    the decode bandwidth share and the fitted tensor efficiency of ``data/throughput.json``."""
    params = load_parameters()
    inference = load_inference_parameters()
    peak = peak_flops_per_s(rates, precision)
    on_vector = peak == rates.vector_flops_per_s  # no tensor cores for this precision
    efficiency = params.vector_efficiency if on_vector else params.tensor_efficiency
    share = (
        1.0 if kv_heads_total <= 0 else kv_heads_on_one_gpu(kv_heads_total, gpus) / kv_heads_total
    )
    out = EngineRates(
        bandwidth_bytes_per_s=rates.bandwidth_bytes_per_s * inference.decode_memory_efficiency,
        peak_bandwidth_bytes_per_s=rates.bandwidth_bytes_per_s,
        tensor_flops_per_s=peak * efficiency,
        gpus=gpus,
        kv_share=share if gpus > 1 else 1.0,
        link=gpu_link(gpu, gpus) if gpus > 1 else None,
    )
    notes = (
        f"bytes at {inference.decode_memory_efficiency:.0%} of DRAM bandwidth (the decode "
        f"share of data/throughput.json: {inference.source})",
        f"matrix products at {efficiency:.0%} of the {precision} peak (the throughput model's "
        f"fitted efficiency, {params.fitted_date})",
    )
    return out, notes
