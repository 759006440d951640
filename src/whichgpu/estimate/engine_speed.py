"""How fast a serving engine runs a language model: the speed model of ``predict --serving``.

Over 600 lines because the step model, the stored formats of quantized weights and of an fp8
KV cache with the engines' support for them, and the answers for decoding and prefill-only
requests all rest on the one step model.

Eager PyTorch generation (``estimate.prediction``) pays a host dispatch per operator, which a
batch-1 decode step of a 7B model spends most of its time on. Serving engines (vLLM,
TensorRT-LLM) replay a captured CUDA graph per decode step, so the step runs near the GPU's
roofline: its kernels one after another, each ``max(bytes it reads / achievable bandwidth,
FLOPs / achievable tensor rate)`` (the weight matrix products: the weights once and their
inputs and outputs; attention: every running sequence's KV cache up to its current length;
the elementwise kernels between them: bytes only). Prompts are prefilled in chunks of the
engine's token budget beside the other sequences' decodes. The achievable shares are the
throughput model's constants (``data/throughput.json``: the tensor efficiency; the decode
bandwidth share and the fp8 efficiency, fitted to published serving runs by
``scripts/fit_serving.py``); the model's shape comes from its ``config.json``; tensor
parallel adds two all-reduces per layer and step (``estimate.data_parallel``). Pure Python.

Quantized weights (``--quantization int8|int4|fp8``) are modelled from their bytes: the
linear layers' weights in the quantized format, scales and zero points included
(``WeightFormat``), the embeddings, head, norms and routers in the serving dtype; fp8 weights
with fp8 activations (W8A8) run their matrix products at the catalog's fp8 tensor peak x the
fitted fp8 efficiency where the engine has that path on the GPU (``quantized_path``, which
refuses a GPU or engine without one, with the reason). A mixture-of-experts model's decode
step reads the experts its tokens are routed to: ``E x (1 - (1 - k/E) ** tokens)`` of the ``E``
experts of a layer when each token picks ``k`` uniformly (``ModelShape.distinct_experts``);
its FLOPs are of the active parameters. An fp8 KV cache (``--kv-cache-dtype fp8``) is
modelled from its bytes too: one byte per key and value element, so the decode step reads half
the 16-bit cache's bytes; attention's FLOPs stay (``kv_cache_fp8_source`` says where the engine
has the path, and refuses where it has none).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from whichgpu.errors import UsageError, option
from whichgpu.estimate.data_parallel import Link, all_reduce_s, gpu_link
from whichgpu.estimate.serving import (
    attention_heads,
    experts_read_share,
    kv_heads,
    kv_heads_on_one_gpu,
    layer_shape,
    routed_experts,
    text_config,
)
from whichgpu.estimate.throughput import (
    GpuRates,
    load_inference_parameters,
    load_parameters,
    peak_flops_per_s,
)
from whichgpu.schema import (
    GpuSpec,
    Precision,
    ServingSpeed,
    ServingSpeedPoint,
    Vendor,
    decode_requests_per_s,
)
from whichgpu.units import tflops_to_flops

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
    """Bytes per activation and KV element (and per weight outside the quantized layers)."""
    experts: int = 0
    """Routed experts per layer of a mixture of experts (``E``); 0 for a dense model."""
    experts_per_token: int = 0
    """Experts each token is routed to (``k``); 0 for a dense model."""
    expert_params: int = 0
    """Parameters of one routed expert in one layer (its MLP)."""
    expert_bytes: int = 0
    """Bytes of one routed expert in one layer, in the weights' stored format."""

    def distinct_experts(self, tokens: float) -> float:
        """Expected distinct experts of one layer that ``tokens`` tokens are routed to, each
        picking ``k`` of ``E`` uniformly and independently: ``E x (1 - (1 - k/E) ** tokens)``
        (``estimate.serving.experts_read_share``). 0 for a dense model."""
        if self.experts <= 0:
            return 0.0
        routed = (self.experts_per_token, self.experts)
        return self.experts * experts_read_share(routed, max(math.ceil(tokens), 1))

    def weights_read_bytes(self, tokens: float) -> float:
        """Weight bytes a step of ``tokens`` tokens reads (whole model): all of a dense model;
        of a mixture of experts, everything but the routed experts, and of those the distinct
        ones the tokens are routed to, per layer."""
        if self.experts <= 0:
            return float(self.weights_bytes)
        all_experts = self.layers * self.experts * self.expert_bytes
        touched = self.layers * self.distinct_experts(tokens) * self.expert_bytes
        return self.weights_bytes - all_experts + touched

    def active_matmul_params(self) -> int:
        """Matrix-product parameters one token uses: all but the routed experts it is not
        sent to (``matmul_params`` of a dense model)."""
        idle = self.experts - self.experts_per_token
        return self.matmul_params - self.layers * max(idle, 0) * self.expert_params

    def head_params(self) -> int:
        """Parameters of the output head (``vocab x hidden``): a step runs it only for the
        tokens it samples from (``EngineSpeed.step``'s ``sampled``)."""
        return self.vocab * self.hidden

    def activation_bytes_per_token(self) -> int:
        """Bytes one token's activations move through the matrix products of a forward pass:
        each product reads its input and writes its output once (QKV, attention output,
        MLP projections per layer; the head's fp32 logits, for a token the step samples
        from)."""
        mlp_out = (2 if self.gated_mlp else 1) * self.intermediate
        mlps = max(self.experts_per_token, 1)  # a token runs k experts' MLPs
        per_layer = (
            self.hidden
            + self.q_width
            + 2 * self.kv_width  # QKV in, out
            + self.q_width
            + self.hidden  # attention output projection
            + mlps * (self.hidden + mlp_out)  # up (and gate)
            + mlps * (self.intermediate + self.hidden)  # down
        )
        return self.layers * per_layer * self.dtype_bytes + self.vocab * LOGIT_BYTES

    def elementwise_bytes_per_token(self) -> int:
        """Bytes one token moves through the elementwise kernels between the matrix products
        of a forward pass, per layer: two residual adds fused with RMSNorm (each reads the
        residual stream and the sublayer's output and writes both: 4 x hidden), the MLP's
        activation (gated: reads gate and up, writes their product, 3 x intermediate; else
        reads and writes it, 2 x intermediate; per routed expert a token runs) and the rotary
        embedding of queries and keys (read and written in place)."""
        mlps = max(self.experts_per_token, 1)
        activation = (3 if self.gated_mlp else 2) * self.intermediate * mlps
        per_layer = 2 * 4 * self.hidden + activation + 2 * (self.q_width + self.kv_width)
        return self.layers * per_layer * self.dtype_bytes

    def flops_per_token(self, attended: float) -> float:
        """FLOPs of one token attending over ``attended`` tokens: ``2 x active matmul params``
        plus attention's ``QK^T`` and ``PV``, ``4 x layers x q_width x attended``."""
        return 2.0 * self.active_matmul_params() + 4.0 * self.layers * self.q_width * attended


def _linear_params(cfg: Mapping[str, Any], shape: ModelShape) -> tuple[int, int]:
    """``(parameters of the decoder layers' linear layers, parameters of one routed expert)``:
    the weights a quantization scheme stores quantized (attention projections and MLPs, every
    expert's; not the embeddings, head, norms or router)."""
    attention = shape.hidden * (shape.q_width + 2 * shape.kv_width) + shape.q_width * shape.hidden
    projections = 3 if shape.gated_mlp else 2
    routed = routed_experts(cfg)
    if routed is None:
        return shape.layers * (attention + projections * shape.hidden * shape.intermediate), 0
    expert = projections * shape.hidden * shape.intermediate  # a MoE shape's is one expert's
    shared = projections * shape.hidden * int(cfg.get("shared_expert_intermediate_size") or 0)
    return shape.layers * (attention + routed[1] * expert + shared), expert


def model_shape(
    config: Mapping[str, Any],
    weights_bytes: int,
    kv_bytes_per_token: int,
    dtype_bytes: int,
    weight_format: WeightFormat | None = None,
) -> ModelShape:
    """The shape of the model of a Hugging Face ``config.json`` (GPT-2's names too), its
    ``weights_bytes`` (in the serving dtype) stored as ``weight_format`` says (None: as they
    are): the linear layers' weights in the quantized format, the rest in the serving dtype."""
    cfg = text_config(config)
    layers, hidden = layer_shape(cfg)
    heads = attention_heads(cfg)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    gated = "intermediate_size" in cfg
    intermediate = int(cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * hidden)
    vocab = int(cfg.get("vocab_size") or 0)
    tied = bool(cfg.get("tie_word_embeddings", "n_embd" in cfg))  # GPT-2 ties its head
    params = weights_bytes // dtype_bytes
    routed = routed_experts(cfg)
    dense = ModelShape(
        layers=layers,
        hidden=hidden,
        q_width=heads * head_dim,
        kv_width=kv_heads(cfg) * head_dim,
        intermediate=int(cfg.get("moe_intermediate_size") or intermediate)
        if routed
        else intermediate,
        gated_mlp=gated,
        vocab=vocab,
        matmul_params=params if tied else params - vocab * hidden,
        weights_bytes=weights_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        dtype_bytes=dtype_bytes,
    )
    linear, expert = _linear_params(cfg, dense)
    linear = min(linear, dense.matmul_params)
    per_weight = float(dtype_bytes)
    stored = weights_bytes
    if weight_format is not None:
        per_weight = weight_format.bytes_per_weight(hidden)
        stored = weights_bytes - linear * dtype_bytes + math.ceil(linear * per_weight)
    return replace(
        dense,
        weights_bytes=stored,
        experts=routed[1] if routed else 0,
        experts_per_token=routed[0] if routed else 0,
        expert_params=expert,
        expert_bytes=math.ceil(expert * per_weight),
    )


Quantization = Literal["int8", "int4", "fp8"]
"""A quantization of the served weights (``--quantization``)."""

QUANTIZATIONS: tuple[Quantization, ...] = ("int8", "int4", "fp8")


@dataclass(frozen=True)
class WeightFormat:
    """How a quantization scheme stores the linear layers' weights: ``bits_per_weight`` each,
    and per group of ``group_size`` weights along the input (None: per output channel) one
    scale of ``scale_bytes`` and a zero point of ``zero_bits``."""

    quantization: Quantization
    """The scheme's ``--quantization`` value."""
    label: str
    """The scheme in words."""
    bits_per_weight: int
    """Bits of one stored weight."""
    group_size: int | None
    """Weights sharing one scale along the input; None: one scale per output channel."""
    scale_bytes: int
    """Bytes of one scale."""
    zero_bits: int
    """Bits of one group's zero point (0: symmetric, none stored)."""

    def bytes_per_weight(self, in_features: int) -> float:
        """Bytes one weight takes, its share of the scales and zero points included, in a
        matrix of ``in_features`` inputs."""
        group = self.group_size or max(in_features, 1)
        return self.bits_per_weight / 8 + (self.scale_bytes + self.zero_bits / 8) / group


WEIGHT_FORMATS: dict[Quantization, WeightFormat] = {
    # AutoAWQ's default: 4-bit weights, groups of 128, an fp16 scale and a 4-bit zero point
    # per group (GPTQ's 4-bit checkpoints: the same, its act-order index aside)
    "int4": WeightFormat("int4", "int4 weight-only (AWQ/GPTQ W4A16)", 4, 128, 2, 4),
    # GPTQ 8-bit, symmetric (no zero points stored), groups of 128
    "int8": WeightFormat("int8", "int8 weight-only (GPTQ W8A16)", 8, 128, 2, 0),
    # fp8 e4m3 weights with one fp32 scale per output channel (llm-compressor's FP8_DYNAMIC;
    # vLLM's online fp8 keeps one per tensor: fewer bytes still)
    "fp8": WeightFormat("fp8", "fp8 weights", 8, None, 4, 0),
}
"""The stored formats of ``--quantization``: see docs/serving.md for their sources."""

COMPILED_WEIGHT_FORMATS: dict[Quantization, WeightFormat] = {
    # torchao Int4WeightOnlyConfig: uint4 in groups of 128 along the input, a bf16 scale and a
    # bf16 zero point per group (tinygemm's scales_and_zeros), run by aten._weight_int4pack_mm
    "int4": WeightFormat("int4", "int4 weight-only (torchao, tinygemm)", 4, 128, 2, 16),
    # torchao Int8WeightOnlyConfig: int8 with one bf16 scale per output channel, widened to
    # 16 bits inside the kernel inductor generates for the product
    "int8": WeightFormat("int8", "int8 weight-only (torchao)", 8, None, 2, 0),
}
"""How compiled decoding (``--compile``, no engine) stores quantized weights: torchao's
weight-only configurations, as gpt-fast and transformers' ``TorchAoConfig`` apply them."""

TINYGEMM_MIN_CAPABILITY = (8, 0)
"""The oldest NVIDIA GPU tinygemm's int4 product is built for: ``aten/src/ATen/native/cuda/
int4mm.cu`` compiles its kernels only for ``__CUDA_ARCH__ >= 800`` (bf16 tensor-core
instructions)."""


def compiled_quantization_refusal(quantization: Quantization, gpu: GpuSpec) -> str | None:
    """Why compiled decoding cannot run ``quantization`` on ``gpu`` (None: it can): a format
    torchao's weight-only path does not have (fp8: a serving engine's), int4 off NVIDIA or
    before Ampere (tinygemm)."""
    fmt = COMPILED_WEIGHT_FORMATS.get(quantization)
    if fmt is None:
        return (
            f"compiled decoding models torchao's weight-only {', '.join(COMPILED_WEIGHT_FORMATS)}; "
            f"{quantization} weights are modelled for serving engines: use {option('serving')} "
            "vllm or tensorrt-llm"
        )
    if quantization != "int4":
        return None
    capability = gpu.capability() if gpu.vendor == Vendor.NVIDIA else None
    if capability is not None and capability >= TINYGEMM_MIN_CAPABILITY:
        return None
    what = (
        f"compute capability {gpu.compute_capability}"
        if gpu.vendor == Vendor.NVIDIA
        else f"a {gpu.vendor.value} GPU"
    )
    return (
        f"{gpu.name} ({what}) cannot run {fmt.label}: tinygemm's int4 kernels are built for "
        "NVIDIA compute capability 8.0 and later (int4mm.cu); use int8"
    )


@dataclass(frozen=True)
class QuantizedPath:
    """How an engine runs quantized weights on one GPU."""

    format: WeightFormat
    """How the weights are stored."""
    fp8_activations: bool
    """W8A8: the weight matrix products run on the GPU's fp8 tensor cores; otherwise the
    weights are widened to 16 bits inside the kernel and multiplied at the 16-bit rate."""
    label: str
    """The path in words (``fp8 W8A8 on fp8 tensor cores``)."""
    source: str
    """Where the engine's support for it on this GPU is documented."""


@dataclass(frozen=True)
class _EngineSupport:
    """On which GPUs an engine runs a quantization (its published support matrix)."""

    weight_only_capability: tuple[int, int] | None
    """Lowest NVIDIA compute capability of the weight-only kernels; None: no such path."""
    w8a8_capability: tuple[int, int] | None = None
    """Lowest NVIDIA compute capability of fp8 W8A8 (the GPU must also have fp8 tensor
    rates in the catalog); None: no W8A8 path."""
    w8a8_amd: bool = False
    """Whether fp8 W8A8 runs on AMD GPUs with fp8 tensor rates."""
    source: str = ""
    """Where the support is documented."""


_VLLM_HARDWARE = (
    "vLLM quantization 'Supported Hardware' table (docs.vllm.ai, v0.11.2 docs, read 2026-11-27)"
)
_VLLM_FP8 = (
    "vLLM 'FP8 W8A8' page: fp8 compute on compute capability 8.9+, weight-only W8A16 via FP8 "
    "Marlin from 8.0 (vLLM PR #5975, merged 2024-07-03)"
)
_TRTLLM = (
    "TensorRT-LLM support matrix (0.18 docs: FP8 on SM89/SM90, INT8/INT4 from SM80) and "
    "TensorRT Model Optimizer support matrix (W4A16 AWQ: Ampere and later), read 2026-11-27"
)

_SUPPORT: dict[tuple[str, Quantization], _EngineSupport] = {
    # GPTQ kernels from Volta (AWQ from Turing, Marlin from Ampere)
    ("vllm", "int4"): _EngineSupport((7, 0), source=_VLLM_HARDWARE),
    ("vllm", "int8"): _EngineSupport((7, 0), source=_VLLM_HARDWARE),
    ("vllm", "fp8"): _EngineSupport((8, 0), (8, 9), w8a8_amd=True, source=_VLLM_FP8),
    ("tensorrt-llm", "int4"): _EngineSupport((8, 0), source=_TRTLLM),
    ("tensorrt-llm", "int8"): _EngineSupport((8, 0), source=_TRTLLM),
    ("tensorrt-llm", "fp8"): _EngineSupport(None, (8, 9), source=_TRTLLM),
}


class QuantizationRefused(UsageError):
    """An engine cannot run a quantization on a GPU; the message says why."""


def quantized_path(
    engine_id: str, engine_label: str, quantization: Quantization, gpu: GpuSpec
) -> QuantizedPath:
    """How ``engine_id`` runs ``quantization`` on ``gpu``: fp8 as W8A8 where the GPU has fp8
    tensor rates in the catalog and the engine that path, else weight-only where the engine's
    kernels run on the GPU's compute capability; ``QuantizationRefused`` (with the reason)
    where neither."""
    fmt = WEIGHT_FORMATS[quantization]
    name = engine_label.split(",")[0]
    rule = _SUPPORT.get((engine_id, quantization))
    if rule is None:
        others = sorted({engine for engine, q in _SUPPORT if q == quantization})
        raise QuantizationRefused(
            f"{name}: {fmt.label} are not modelled for this engine; {option('serving')} "
            f"{' or '.join(others)} models them."
        )
    found = gpu.capability()
    capability = found if gpu.vendor == Vendor.NVIDIA else None
    nvidia = capability is not None
    fp8_cores = bool(gpu.one_device().fp8_tensor_tflops)
    w8a8 = rule.w8a8_capability
    if (
        w8a8 is not None
        and fp8_cores
        and (
            (capability is not None and capability >= w8a8)
            or (gpu.vendor == Vendor.AMD and rule.w8a8_amd)
        )
    ):
        return QuantizedPath(
            fmt, True, f"{fmt.label}, fp8 activations (W8A8) on fp8 tensor cores", rule.source
        )
    weight_only = rule.weight_only_capability
    if weight_only is not None and capability is not None and capability >= weight_only:
        widened = " (W8A16)" if quantization == "fp8" else ""
        return QuantizedPath(
            fmt, False, f"{fmt.label}{widened}, widened to 16 bits in the kernel", rule.source
        )
    needs = []
    if rule.w8a8_capability is not None:
        needs.append(
            "fp8 tensor cores (NVIDIA compute capability "
            f"{'.'.join(map(str, rule.w8a8_capability))}+{', or AMD' if rule.w8a8_amd else ''})"
        )
    if rule.weight_only_capability is not None:
        needs.append(
            "an NVIDIA GPU of compute capability "
            f"{'.'.join(map(str, rule.weight_only_capability))}+ for the weight-only kernels"
        )
    what = (
        f"compute capability {gpu.compute_capability}" if nvidia else f"a {gpu.vendor.value} GPU"
    ) + ("" if fp8_cores else " without fp8 tensor rates in the catalog")
    raise QuantizationRefused(
        f"{name} cannot run {fmt.label} on {gpu.name} ({what}): it needs "
        f"{' or '.join(needs)} ({rule.source})."
    )


KvCacheDtype = Literal["auto", "fp8"]
"""How a serving engine stores its KV cache (``--kv-cache-dtype``): ``auto`` in the serving
dtype, ``fp8`` in fp8 e4m3, one byte per element."""

KV_CACHE_DTYPES: tuple[KvCacheDtype, ...] = ("auto", "fp8")

KV_FP8_BYTES = 1
"""Bytes of one fp8 KV-cache element. The engines keep one fp32 scale per tensor (vLLM also
per KV head) per layer beside the cache, a few bytes per layer, not per token: left out."""


@dataclass(frozen=True)
class _KvFp8Support:
    """On which GPUs an engine keeps its KV cache in fp8 (its documentation)."""

    nvidia_capability: tuple[int, int]
    """Lowest NVIDIA compute capability."""
    amd: bool
    """Whether AMD GPUs (ROCm) have the path."""
    source: str
    """Where it is documented, and what could not be confirmed."""


_KV_FP8_SUPPORT: dict[str, _KvFp8Support] = {
    "vllm": _KvFp8Support(
        (7, 0),
        True,
        "vLLM 'Quantized KV Cache' page (docs.vllm.ai/en/latest/features/quantization/"
        "quantized_kvcache/): kv_cache_dtype fp8_e4m3 'supported on CUDA 11.8+ and ROCm (AMD "
        "GPUs)', no compute capability named; the 7.0 floor is vLLM's own for CUDA, and vLLM PR "
        "#2279 (fp8 KV cache) was tested on Volta and Ampere, converting with bit operations "
        "before Hopper",
    ),
    "tensorrt-llm": _KvFp8Support(
        (8, 9),
        False,
        "TensorRT-LLM quantization page (nvidia.github.io/TensorRT-LLM/features/"
        "quantization.html: KvCacheConfig(dtype='fp8')) and its 0.18 support matrix (FP8 on "
        "Hopper SM90 and Ada SM89 only, none on Ampere); no separate fp8-KV hardware table found",
    ),
}


class KvCacheRefused(QuantizationRefused):
    """An engine cannot keep its KV cache in fp8 on a GPU; the message says why."""


def kv_cache_fp8_source(engine_id: str, engine_label: str, gpu: GpuSpec) -> str:
    """Where ``engine_id``'s fp8 KV cache on ``gpu`` is documented; ``KvCacheRefused`` (with
    the reason) where the engine has no such path on ``gpu``."""
    name = engine_label.split(",")[0]
    rule = _KV_FP8_SUPPORT.get(engine_id)
    if rule is None:
        raise KvCacheRefused(
            f"{name}: an fp8 KV cache is not modelled for this engine; {option('serving')} "
            f"{' or '.join(sorted(_KV_FP8_SUPPORT))} models it."
        )
    found = gpu.capability()
    if gpu.vendor == Vendor.NVIDIA and found is not None and found >= rule.nvidia_capability:
        return rule.source
    if gpu.vendor == Vendor.AMD and rule.amd:
        return rule.source
    what = (
        f"compute capability {gpu.compute_capability}"
        if gpu.vendor == Vendor.NVIDIA
        else f"a {gpu.vendor.value} GPU"
    )
    needs = "an NVIDIA GPU of compute capability " + ".".join(map(str, rule.nvidia_capability))
    needs += "+" + (" or an AMD GPU (ROCm)" if rule.amd else "")
    raise KvCacheRefused(
        f"{name} cannot keep its KV cache in fp8 on {gpu.name} ({what}): it needs {needs} "
        f"({rule.source})."
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
    matmul_flops_per_s: float | None = None
    """Achievable rate of the weight matrix products where it is not ``tensor_flops_per_s``
    (fp8 W8A8: the fp8 peak x the fitted fp8 efficiency); attention stays at the 16-bit rate."""


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


@dataclass(frozen=True)
class BurstTimes:
    """A burst of requests arriving together (``EngineSpeed.burst``)."""

    ttft_s: float
    """Time to first token of the burst's last request: the prefill of every prompt."""
    tpot_s: float
    """A decode step of all the requests together."""
    output_tokens_per_s: float
    """The burst's generated tokens over its wall time, prefill included."""


class EngineSpeed:
    """The engine's step times for one model on one GPU type (or N tensor-parallel GPUs)."""

    def __init__(
        self,
        shape: ModelShape,
        rates: EngineRates,
        *,
        chunk_tokens: int,
        whole_prompts: bool = False,
        reduce_s: Callable[[float, int, Link], float] = all_reduce_s,
    ) -> None:
        self.shape = shape
        self.rates = rates
        self.chunk_tokens = chunk_tokens
        self.whole_prompts = whole_prompts
        """The engine runs each prompt whole in one step (no chunked prefill; prompts no
        longer than ``chunk_tokens``): a step takes the waiting prompts that fit its budget
        whole, in arrival order."""
        self._reduce_s = reduce_s

    def step(
        self,
        tokens: float,
        attended_tokens: float,
        kv_read_tokens: float,
        sampled: float | None = None,
    ) -> StepCost:
        """A step running ``tokens`` tokens that attend over ``attended_tokens`` in all
        (summed over tokens) and read ``kv_read_tokens`` tokens of KV cache, of which
        ``sampled`` (default: all) produce a next token. Only those run the output head: a
        prompt's last token does, its earlier ones do not (vLLM and TensorRT-LLM compute
        logits at the positions they sample from), every decode token does.

        The step's kernels run one after another (a captured graph replays them in order), so
        its time is the sum of three kinds of kernel, each at its own roofline: the weight
        matrix products (the weights and their inputs and outputs against their FLOPs),
        attention (the KV cache it reads against its FLOPs) and the elementwise kernels
        between them (norms, residual adds, the activation, rotary embedding: bytes only)."""
        shape, rates, n = self.shape, self.rates, self.rates.gpus
        bandwidth = rates.bandwidth_bytes_per_s
        sampled = tokens if sampled is None else min(sampled, tokens)
        head, logit_bytes = shape.head_params(), shape.vocab * LOGIT_BYTES
        body_params = shape.active_matmul_params() - head
        matmul_flops = 2.0 * (body_params * tokens + head * sampled) / n
        attention_flops = 4.0 * shape.layers * shape.q_width * attended_tokens / n
        activation_bytes = (
            tokens * (shape.activation_bytes_per_token() - logit_bytes) + sampled * logit_bytes
        )
        matmul_bytes = (shape.weights_read_bytes(tokens) + activation_bytes) / n
        kv_bytes = kv_read_tokens * shape.kv_bytes_per_token * rates.kv_share
        elementwise_bytes = tokens * shape.elementwise_bytes_per_token() / n
        matmul_compute_s = matmul_flops / (rates.matmul_flops_per_s or rates.tensor_flops_per_s)
        attention_compute_s = attention_flops / rates.tensor_flops_per_s
        matmul_s = max(matmul_bytes / bandwidth, matmul_compute_s)
        attention_s = max(kv_bytes / bandwidth, attention_compute_s)
        seconds = matmul_s + attention_s + elementwise_bytes / bandwidth
        if n > 1 and rates.link is not None:  # two all-reduces of the hidden states per layer
            hidden_bytes = tokens * shape.hidden * shape.dtype_bytes
            seconds += 2 * shape.layers * self._reduce_s(hidden_bytes, n, rates.link)
        nbytes = matmul_bytes + kv_bytes + elementwise_bytes
        compute_s = matmul_compute_s + attention_compute_s
        return StepCost(
            seconds, nbytes, matmul_flops + attention_flops, nbytes / bandwidth >= compute_s
        )

    def decode(self, concurrency: int, context: int, new_tokens: int) -> StepCost:
        """One decode step of ``concurrency`` sequences, each at the generation's average
        length ``context + new_tokens / 2``."""
        length = context + new_tokens / 2
        return self.step(concurrency, concurrency * length, concurrency * length)

    def steady_step(
        self, concurrency: int, context: int, new_tokens: int
    ) -> tuple[StepCost, float]:
        """A step of the steady state and the prompt tokens it runs: every running sequence's
        decode token and, beside them, the prompts of the requests that take the finished
        ones' places. A request's prompt is prefilled once over its ``new_tokens`` steps, so
        ``concurrency x context / new_tokens`` prompt tokens a step on average, as far as the
        engine's token budget leaves room (the decode tokens go first); the prompt tokens
        attend over half their prompt on average and write their keys and values."""
        length = context + new_tokens / 2
        wanted = concurrency * context / new_tokens
        prompt = min(wanted, max(self.chunk_tokens - concurrency, 0))
        attended = concurrency * length + prompt * context / 2
        kv_read = concurrency * length + prompt
        finished = prompt / max(context, 1)  # prompts whose last token this step samples
        return self.step(concurrency + prompt, attended, kv_read, concurrency + finished), prompt

    def bandwidth_bound_s(self, concurrency: int, context: int, new_tokens: int) -> float:
        """The decode step's bytes at the full DRAM bandwidth (no compute, no exchange)."""
        step = self.decode(concurrency, context, new_tokens)
        return step.bytes_read / self.rates.peak_bandwidth_bytes_per_s

    def ttft(self, concurrency: int, context: int, new_tokens: int) -> float:
        """One request's prompt of ``context`` tokens prefilled in chunks: each step holds the
        other ``concurrency - 1`` sequences' decode tokens first, then as much of the prompt
        as the engine's token budget leaves (at least one token). An engine that runs prompts
        whole (``whole_prompts``) runs it in one step beside the decodes."""
        others = concurrency - 1
        length = context + new_tokens / 2  # where the other sequences are, on average
        if self.whole_prompts:
            return self._chunk_step(others, length, 0, context, last=True).seconds
        chunk = max(self.chunk_tokens - others, 1)
        done, seconds = 0, 0.0
        steps = math.ceil(context / chunk)
        if steps > 64:  # equal chunks: time a few and scale (attention grows linearly)
            first = self._chunk_step(others, length, 0, chunk, last=False).seconds
            final = self._chunk_step(others, length, (steps - 1) * chunk, chunk, last=True)
            return steps * (first + final.seconds) / 2
        while done < context:
            size = min(chunk, context - done)
            last = done + size >= context
            seconds += self._chunk_step(others, length, done, size, last=last).seconds
            done += size
        return seconds

    def burst(self, concurrency: int, context: int, new_tokens: int) -> BurstTimes:
        """``concurrency`` requests of ``context`` prompt tokens arriving together (an offline
        batch, or a benchmark's first wave): the engine prefills the prompts in steps of its
        token budget, then decodes all of them together, no prompt beside them. TTFT of the
        last request = the prefill steps; TPOT = a decode step of them all at the
        generation's average length; output tokens/s = ``concurrency x new_tokens`` over the
        prefill and the ``new_tokens - 1`` decode steps after it."""
        total = concurrency * context
        budget = max(self.chunk_tokens, 1)
        if self.whole_prompts:  # as many whole prompts a step as the budget holds
            budget = max(budget // context, 1) * context
        full, rest = divmod(total, budget)
        prefill_s = 0.0
        for tokens, count in ((budget, full), (rest, 1 if rest else 0)):
            if count:  # each prompt token attends over half its prompt on average
                step = self.step(tokens, tokens * context / 2, tokens, tokens / max(context, 1))
                prefill_s += count * step.seconds
        tpot = self.decode(concurrency, context, new_tokens).seconds
        wall = prefill_s + max(new_tokens - 1, 0) * tpot
        return BurstTimes(
            ttft_s=prefill_s,
            tpot_s=tpot,
            output_tokens_per_s=concurrency * new_tokens / wall,
        )

    def _chunk_step(
        self, others: int, length: float, done: int, size: int, *, last: bool
    ) -> StepCost:
        """A step of ``others`` decodes at ``length`` and a prompt chunk of ``size`` tokens
        after ``done`` prompt tokens (which it reads from the cache); the ``last`` chunk
        samples the request's first token."""
        attended = others * length + size * (done + size / 2)
        kv_read = others * length + done + size  # the chunk writes its own keys and values
        return self.step(others + size, attended, kv_read, others + (1 if last else 0))

    def point(self, concurrency: int, context: int, new_tokens: int) -> ServingSpeedPoint:
        """TTFT, TPOT and output tokens/s at ``concurrency`` in the steady state (of
        prefill-only requests, ``new_tokens`` 0: ``prefill_point``). TPOT is the steady
        state's step (``steady_step``: the decodes and the arriving prompts beside them), so
        the GPU's time per output token counts the prompts' work too; where the token budget
        leaves the prompts less room than the finished requests free, the prompts set the
        pace: requests/s = prompt tokens per step / (context x step time)."""
        if new_tokens == 0:
            return self.prefill_point(concurrency, context)
        step, prompt = self.steady_step(concurrency, context, new_tokens)
        tpot = step.seconds
        ttft = self.ttft(concurrency, context, new_tokens)
        if prompt < concurrency * context / new_tokens:  # the budget holds the prompts back
            requests_per_s = prompt / (context * tpot)
            output = requests_per_s * new_tokens
        else:
            requests_per_s = decode_requests_per_s(concurrency, ttft, tpot, new_tokens)
            output = concurrency / tpot
        return ServingSpeedPoint(
            concurrency=concurrency,
            ttft_s=ttft,
            tpot_s=tpot,
            output_tokens_per_s=output,
            requests_per_s=requests_per_s,
            prompt_tokens_per_s=requests_per_s * context,
        )

    def prefill_tokens_per_step(self, concurrency: int, context: int) -> int:
        """Prompt tokens one step of prefill-only requests runs: ``min(token budget,
        concurrency x context)`` (the engine fills its budget from the waiting prompts; one
        that runs prompts whole, with as many whole prompts as the budget holds)."""
        budget = self.chunk_tokens
        if self.whole_prompts:
            budget = max(budget // max(context, 1), 1) * context
        return max(min(budget, concurrency * context), 1)

    def prefill_step(self, concurrency: int, context: int) -> StepCost:
        """A step of prefill-only requests (``new_tokens`` 0) at ``concurrency``, steady state:
        ``prefill_tokens_per_step`` prompt tokens, each attending over half its prompt on
        average; it writes their keys and values and, where a prompt is longer than the step
        (chunked), reads the cached part before the chunk, ``(context - tokens) / 2`` on
        average."""
        tokens = self.prefill_tokens_per_step(concurrency, context)
        attended = tokens * context / 2
        kv_read = tokens + max(context - tokens, 0) / 2
        return self.step(tokens, attended, kv_read)

    def prefill_point(self, concurrency: int, context: int) -> ServingSpeedPoint:
        """Prefill-only requests at ``concurrency``: requests/s = tokens per step / (context x
        step time); the request's latency (its TTFT; no TPOT) by Little's law, ``concurrency
        / requests/s``: one step where the prompts fit the budget together, more (waiting for
        the budget) where they do not."""
        tokens = self.prefill_tokens_per_step(concurrency, context)
        step = self.prefill_step(concurrency, context)
        requests_per_s = tokens / (context * step.seconds)
        return ServingSpeedPoint(
            concurrency=concurrency,
            ttft_s=concurrency / requests_per_s,
            tpot_s=None,
            output_tokens_per_s=0.0,
            requests_per_s=requests_per_s,
            prompt_tokens_per_s=requests_per_s * context,
        )

    def within_targets(
        self,
        limit: int,
        context: int,
        new_tokens: int,
        targets_ms: tuple[float | None, float | None],
    ) -> int | None:
        """``largest_within`` for targets in milliseconds (TPOT, TTFT); None when neither is
        asked."""
        tpot_ms, ttft_ms = targets_ms
        if tpot_ms is None and ttft_ms is None:
            return None
        return self.largest_within(
            limit,
            context,
            new_tokens,
            tpot_s=None if tpot_ms is None else tpot_ms / 1000,
            ttft_s=None if ttft_ms is None else ttft_ms / 1000,
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

        if new_tokens == 0 and tpot_s is not None:
            raise UsageError(
                f"{option('tpot_ms')} is a target for generated tokens, and "
                f"{option('new_tokens')} 0 generates none: give {option('ttft_ms')} (the "
                "request's latency) instead."
            )

        def meets(c: int) -> bool:
            p = self.point(c, context, new_tokens)
            tpot_ok = tpot_s is None or (p.tpot_s is not None and p.tpot_s <= tpot_s)
            return tpot_ok and (ttft_s is None or p.ttft_s <= ttft_s)

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


def prefill_only_speed(
    speed: EngineSpeed,
    *,
    engine: str,
    engine_label: str,
    concurrency: int,
    context: int,
    max_concurrency: int | None,
    targets_ms: tuple[float | None, float | None] = (None, None),
    usd_per_gpu_hour: float | None = None,
    price_source: str | None = None,
    notes: tuple[str, ...] = (),
) -> ServingSpeed:
    """The engine's answer for prefill-only requests (``new_tokens`` 0: embedding,
    classification, scoring, reranking) of ``context`` prompt tokens at ``concurrency``, on
    ``speed``'s GPUs: requests/s and prompt tokens/s (``EngineSpeed.prefill_point``), the
    request's latency as its TTFT, no decode figures; the growth with the concurrency up to
    ``max_concurrency`` (the sequences of ``context`` tokens the engine's KV cache holds); with
    a ``--ttft-ms`` target (``targets_ms``; a TPOT target is refused) the largest concurrency
    meeting it; and, with a price per GPU-hour, $ per million prompt tokens and per thousand
    requests, kept busy. ``notes`` (the rates' and the weights' notes) go into the
    assumptions."""
    n = speed.rates.gpus
    _, ttft_ms = targets_ms
    limit = max_concurrency if max_concurrency is not None else concurrency
    within = speed.within_targets(limit, context, 0, targets_ms)
    at = speed.prefill_point(concurrency, context)
    step = speed.prefill_step(concurrency, context)
    tokens = speed.prefill_tokens_per_step(concurrency, context)
    assert at.requests_per_s is not None and at.prompt_tokens_per_s is not None
    per_million = per_thousand = None
    if usd_per_gpu_hour is not None:
        per_million = usd_per_gpu_hour * n / (at.prompt_tokens_per_s * 3600) * 1e6
        per_thousand = usd_per_gpu_hour * n / (at.requests_per_s * 3600) * 1e3
    shape = speed.shape
    moe: tuple[str, ...] = ()
    if shape.experts:
        moe = (
            f"mixture of experts: a step of {tokens} prompt tokens reads "
            f"{shape.distinct_experts(tokens):.2f} of the {shape.experts} experts per layer "
            f"(uniform, independent routing); FLOPs of the {shape.experts_per_token} active "
            "experts per token",
        )
    budget = speed.chunk_tokens
    queued = concurrency * context > budget
    return ServingSpeed(
        engine=engine,
        engine_label=engine_label,
        gpus=n,
        concurrency=concurrency,
        context=context,
        new_tokens=0,
        ttft_s=at.ttft_s,
        tpot_s=None,
        output_tokens_per_s=0.0,
        decode_bound=None,
        decode_bytes=None,
        decode_flops=None,
        bandwidth_bound_tpot_s=None,
        requests_per_s=at.requests_per_s,
        prompt_tokens_per_s=at.prompt_tokens_per_s,
        step_bound="memory" if step.memory_bound else "compute",
        max_concurrency=max_concurrency,
        by_concurrency=tuple(
            speed.prefill_point(c, context)
            for c in concurrency_ladder(concurrency, max_concurrency)
        ),
        target_tpot_s=None,
        target_ttft_s=None if ttft_ms is None else ttft_ms / 1000,
        max_concurrency_within_targets=within,
        usd_per_gpu_hour=usd_per_gpu_hour,
        usd_per_million_output_tokens=None,
        usd_per_million_prompt_tokens=per_million,
        usd_per_thousand_requests=per_thousand,
        price_source=price_source,
        assumptions=(
            f"{engine_label}: prefill-only requests (no new tokens: embedding, "
            "classification, scoring, reranking): the engine runs prefill steps only, no "
            "decode step and no TPOT",
            f"a step prefills min(the {budget}-token step budget, concurrency x context) = "
            f"{tokens} prompt tokens at concurrency {concurrency}; step time = the sum of its "
            "kernels, each at its roofline (matrix products, attention, elementwise kernels)"
            + (f", plus two all-reduces per layer over {n} GPUs" if n > 1 else "")
            + "; it reads the weights once, writes the prompt tokens' keys and values (and "
            "reads the cached start of a prompt longer than the step)",
            "requests/s = prompt tokens per step / (context x step time); TTFT = the "
            "request's latency = concurrency / requests/s (Little's law, steady state, a new "
            "request arriving as each finishes): "
            + (
                f"the {concurrency} prompts of {context} tokens exceed the step budget, so a "
                "request also waits for its turn"
                if queued
                else "the prompts fit one step together, so the latency is one step"
            ),
            f"memory: each sequence holds the KV cache of its {context} prompt tokens only "
            "(no decode tokens); the engine frees it when the request finishes",
            *moe,
            *notes,
            "cost per million prompt tokens (per thousand requests): the cheapest catalog "
            "on-demand rate for this machine size x GPUs / prompt tokens (requests) per hour "
            "at this concurrency, kept busy",
        ),
    )


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
    path: QuantizedPath | None = None,
) -> tuple[EngineRates, tuple[str, ...]]:
    """The achievable rates of ``gpus`` x ``gpu`` under an engine, and where they come from:
    the decode bandwidth share and the fitted tensor efficiency of ``data/throughput.json``;
    with an fp8 W8A8 ``path``, the weight matrix products at the catalog's fp8 tensor peak x
    the fitted fp8 efficiency (``inference.fp8_tensor_efficiency``)."""
    params = load_parameters()
    inference = load_inference_parameters()
    peak = peak_flops_per_s(rates, precision)
    on_vector = peak == rates.vector_flops_per_s  # no tensor cores for this precision
    efficiency = params.vector_efficiency if on_vector else params.tensor_efficiency
    if not on_vector:  # a card held below its boost clock by its power limit
        efficiency *= rates.tensor_power_share
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
    notes: tuple[str, ...] = (
        f"bytes at {inference.decode_memory_efficiency:.0%} of DRAM bandwidth (the decode "
        f"share of data/throughput.json: {inference.source})",
        f"matrix products at {efficiency:.0%} of the {precision} peak (the throughput model's "
        f"fitted efficiency, {params.fitted_date})",
    )
    if not on_vector and rates.tensor_power_share < 1.0:
        notes += (
            f"{gpu.name}: matrix products held to {rates.tensor_power_share:.0%} of that by its "
            f"power limit (the {gpu.sustained_tensor_tflops:g} TFLOPS it sustains, measured)",
        )
    fp8_tflops = gpu.one_device().fp8_tensor_tflops
    if path is not None and path.fp8_activations and fp8_tflops:
        out = replace(
            out,
            matmul_flops_per_s=tflops_to_flops(fp8_tflops)
            * inference.fp8_tensor_efficiency
            * rates.tensor_power_share,
        )
        notes += (
            f"weight matrix products at {inference.fp8_tensor_efficiency:.0%} of the catalog's "
            f"fp8 tensor peak ({inference.fp8_source}); attention at the {precision} rate",
        )
    return out, notes
