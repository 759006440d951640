"""Inference of a language model: KV-cache bytes per token, and a serving engine's answer.

Two policies, on one GPU or on N tensor-parallel ones (``--gpus N``):

- plain PyTorch / transformers generation (the default of ``fit --mode inference``): the
  traced step itself — weights, a static KV cache for ``context + new_tokens`` tokens per
  sequence, the prefill's activations — replayed through the allocator model by
  ``whichgpu.estimate.memory``; this module only adds the KV-cache figures;
- a serving engine with a paged KV cache (``fit --serving vllm``): the engine takes a
  fraction of the card, loads the weights, runs one profiling forward pass and gives all that
  is left to KV-cache blocks (``serving_estimate``).

Pure Python: the figures come from the model's config and the stored or traced profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from whichgpu.schema import (
    MemoryEstimate,
    Precision,
    ServingEngine,
    ServingEstimate,
    SoftwareStack,
)

_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "bf16-pure": 2}
"""Bytes per element of weights and KV cache in inference, by ``--precision``: fp16/bf16
inference holds its weights (and so its cache) in the half dtype (``workloads.hf.weight_dtype``)."""


def serving_dtype_bytes(precision: Precision) -> int:
    """Bytes per weight and KV-cache element of an inference run at ``precision``."""
    if precision not in _DTYPE_BYTES:
        raise ValueError(f"no inference dtype for --precision {precision}")
    return _DTYPE_BYTES[precision]


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a Hugging Face ``config.json``: its ``text_config`` where
    it has one (a multimodal model's), else the config itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def layer_shape(config: Mapping[str, Any]) -> tuple[int, int]:
    """``(layers, hidden size)`` of a Hugging Face ``config.json`` (GPT-2's names too)."""
    config = text_config(config)
    layers = int(config.get("num_hidden_layers") or config["n_layer"])
    return layers, int(config.get("hidden_size") or config["n_embd"])


def attention_heads(config: Mapping[str, Any]) -> int:
    """Attention (query) heads of a Hugging Face ``config.json`` (GPT-2's ``n_head``)."""
    config = text_config(config)
    return int(config.get("num_attention_heads") or config["n_head"])


def kv_heads(config: Mapping[str, Any]) -> int:
    """Key/value heads of a Hugging Face ``config.json`` (``num_key_value_heads``; the
    attention heads without GQA)."""
    return int(text_config(config).get("num_key_value_heads") or attention_heads(config))


def routed_experts(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """(experts each token is routed to, experts per layer) of a mixture-of-experts config
    (Mixtral's ``num_experts_per_tok`` of ``num_local_experts``, Qwen-MoE's ``num_experts``);
    None for a dense model."""
    config = text_config(config)
    total = config.get("num_local_experts") or config.get("num_experts")
    active = config.get("num_experts_per_tok")
    if not total or not active:
        return None
    return int(active), int(total)


def experts_read_share(routed: tuple[int, int] | None, tokens: int) -> float:
    """Expected share of a layer's expert weights that ``tokens`` tokens read between them,
    each routed to ``active`` of ``total`` experts, uniformly and independently:
    ``1 - (1 - active/total) ** tokens`` (a decode step of one sequence of Mixtral reads 2 of
    8 experts; of 16 sequences, nearly all). 1 for a dense model. Real routers favour some
    experts, so fewer are read: the share errs high (slow)."""
    if routed is None:
        return 1.0
    active, total = routed
    return 1.0 - (1.0 - min(active, total) / total) ** max(tokens, 1)


def tensor_parallel_refusal(config: Mapping[str, Any], gpus: int) -> str | None:
    """Why ``gpus`` GPUs cannot serve the model of ``config`` tensor parallel (None: they
    can). Serving engines split the attention heads evenly, so their count must divide by the
    GPUs; the KV heads must too, or (fewer KV heads than GPUs) divide the GPUs, each KV head
    then replicated (vLLM's checks of its model configuration)."""
    if gpus <= 1:
        return None
    heads, kv = attention_heads(config), kv_heads(config)
    splits = [n for n in range(2, heads + 1) if heads % n == 0 and (kv % n == 0 or n % kv == 0)]
    if heads % gpus == 0 and (kv % gpus == 0 or gpus % kv == 0):
        return None
    return (
        f"its {heads} attention heads ({kv} key/value heads) do not split evenly over {gpus} "
        "GPUs, which tensor-parallel serving needs; GPU counts that work: "
        + ", ".join(str(n) for n in splits[:8])
    )


def kv_heads_on_one_gpu(kv_head_count: int, gpus: int) -> int:
    """KV heads one of ``gpus`` tensor-parallel GPUs holds: ``ceil(kv_heads / gpus)``. With
    fewer KV heads than GPUs (GQA) every GPU keeps a whole head, as vLLM replicates them; a
    split that does not divide evenly is rounded up, the safe side."""
    return -(-kv_head_count // gpus)


def kv_on_one_gpu(kv_bytes: int, kv_head_count: int, gpus: int) -> int:
    """The part of ``kv_bytes`` (a KV cache, or its bytes per token) one of ``gpus``
    tensor-parallel GPUs holds: its share of the KV heads (``kv_heads_on_one_gpu``)."""
    if gpus <= 1:
        return kv_bytes
    return kv_bytes * kv_heads_on_one_gpu(kv_head_count, gpus) // kv_head_count


def kv_bytes_per_token(config: Mapping[str, Any], dtype_bytes: int) -> int:
    """Keys and values of one token over all layers: ``layers x 2 x kv_heads x head_dim x
    dtype_bytes``, from a Hugging Face ``config.json`` (GQA-aware: ``num_key_value_heads``;
    GPT-2's ``n_layer``/``n_head``/``n_embd`` names too; a ``text_config`` is looked into)."""
    config = text_config(config)
    layers, hidden = layer_shape(config)
    head_dim = int(config.get("head_dim") or hidden // attention_heads(config))
    return layers * 2 * kv_heads(config) * head_dim * dtype_bytes


def serving_estimate(
    engine: ServingEngine,
    stack: SoftwareStack,
    *,
    capacity_bytes: int,
    weights_bytes: int,
    activation_peak_bytes: int,
    kv_per_token_bytes: int,
    tokens_per_sequence: int,
    gpus: int = 1,
) -> ServingEstimate:
    """The engine's KV-cache budget on a GPU of ``capacity_bytes`` and the sequences it holds:
    as many as the blocks allow, up to the scheduler's cap on running sequences
    (``engine.max_sequences``; the caller gives the engine as it runs on that GPU,
    ``ServingEngine.on_gpu``).

    ``budget = floor(utilization x capacity) - weights - activation peak - non-torch`` (the
    CUDA context of ``stack``, and its NCCL buffers when ``gpus`` > 1); an engine whose
    fraction is of the free memory (TensorRT-LLM) keeps ``utilization x (capacity - weights -
    activation peak - non-torch)``. Blocks of
    ``engine.block_size_tokens`` tokens; each sequence of ``tokens_per_sequence`` tokens holds
    ``ceil(tokens / block)`` blocks.

    ``activation_peak_bytes`` is the profiling pass of one chunk of ``engine.profile_tokens``
    tokens on one GPU, whole; tensor parallel over ``gpus`` GPUs each runs 1/``gpus`` of it
    (the split layers' intermediates, as engines shard them).

    ``gpus`` > 1 (tensor parallel): every byte figure is one GPU's — ``weights_bytes`` and
    ``kv_per_token_bytes`` its share — and each block holds the same tokens on every GPU, so
    the engine's blocks are one GPU's.
    """
    non_torch = stack.cuda_context_bytes + (stack.nccl_bytes_per_gpu if gpus > 1 else 0)
    # the profiling pass is one chunk of the engine's token budget; tensor parallel, each GPU
    # runs its 1/N of the split layers' activations
    activation_peak_bytes = -(-activation_peak_bytes // max(gpus, 1))
    if engine.memory_fraction_of == "free":  # a fraction of what the model leaves free
        free = capacity_bytes - weights_bytes - activation_peak_bytes - non_torch
        kv_budget = math.floor(engine.gpu_memory_utilization * max(free, 0))
        kv_budget = kv_budget if free > 0 else free
        engine_budget = weights_bytes + activation_peak_bytes + non_torch + kv_budget
    elif engine.memory_fraction_of == "static":  # weights and KV cache; the rest is kept back
        engine_budget = math.floor(engine.gpu_memory_utilization * (capacity_bytes - non_torch))
        kv_budget = engine_budget - weights_bytes
    else:
        engine_budget = math.floor(engine.gpu_memory_utilization * capacity_bytes)
        kv_budget = engine_budget - weights_bytes - activation_peak_bytes - non_torch
    block_bytes = engine.block_size_tokens * kv_per_token_bytes
    blocks = max(0, kv_budget) // block_bytes
    per_sequence = math.ceil(tokens_per_sequence / engine.block_size_tokens)
    cap = engine.max_sequences
    held = blocks // per_sequence
    capped = (
        (
            f"the scheduler runs at most {cap} sequences at once on this GPU (the engine's "
            f"default max_num_seqs / max_batch_size); the KV cache would hold {held}",
        )
        if held > cap
        else ()
    )
    return ServingEstimate(
        engine=engine.id,
        engine_label=engine.label,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        memory_fraction_of=engine.memory_fraction_of,
        engine_budget_bytes=engine_budget,
        weights_bytes=weights_bytes,
        activation_peak_bytes=activation_peak_bytes,
        profile_tokens=engine.profile_tokens,
        non_torch_bytes=non_torch,
        kv_cache_budget_bytes=kv_budget,
        kv_bytes_per_token=kv_per_token_bytes,
        block_size_tokens=engine.block_size_tokens,
        kv_blocks=blocks,
        tokens_per_sequence=tokens_per_sequence,
        blocks_per_sequence=per_sequence,
        max_concurrency=min(held, cap),
        gpus=gpus,
        assumptions=(
            f"{engine.label}: "
            + _fraction_note(engine)
            + f", KV blocks of {engine.block_size_tokens} "
            + ("token" if engine.block_size_tokens == 1 else "tokens"),
            (
                "activations and CUDA graphs: the memory the fraction leaves out, as the engine "
                "reserves it (not traced)"
                if engine.memory_fraction_of == "static"
                else f"activation peak = the traced prefill of one sequence of "
                f"{engine.profile_tokens} tokens (the engine's profiling pass of "
                "max_num_batched_tokens), less its weights and KV cache; it includes the cuBLAS "
                "workspaces"
            ),
            f"non-torch memory = the CUDA context of the stack ({stack.label})"
            + (" and its NCCL buffers" if gpus > 1 else ""),
            *(
                (
                    f"tensor parallel over {gpus} GPUs: each holds 1/{gpus} of the weights and "
                    "its share of the KV heads (a whole head where there are fewer KV heads "
                    f"than GPUs) and 1/{gpus} of the profiling pass's activations (one chunk of "
                    f"{engine.profile_tokens} tokens, split as the layers are; the hidden states "
                    "between layers are whole on each GPU, a few MiB); the engine has the "
                    "blocks of one GPU",
                )
                if gpus > 1
                else ()
            ),
            f"running sequences: at most what the KV blocks hold and the scheduler's cap of "
            f"{cap} on this GPU",
            *capped,
            (
                "the sampler's logits of many sequences and prefix caching are not modelled"
                if engine.memory_fraction_of == "static"
                else "CUDA graphs, the sampler's logits of many sequences and prefix caching "
                "are not modelled"
            ),
        ),
    )


def _fraction_note(engine: ServingEngine) -> str:
    """What the engine's memory fraction is of, in words."""
    share = f"{engine.gpu_memory_utilization:g}"
    if engine.memory_fraction_of == "free":
        return (
            f"gpu_memory_utilization {share} of the memory the weights, activations and "
            "context leave free"
        )
    if engine.memory_fraction_of == "static":  # the fraction follows from its reserve
        graphs = (
            f", CUDA graphs up to {engine.cuda_graph_max_batch} sequences"
            if engine.cuda_graph_max_batch is not None
            else ""
        )
        return (
            f"mem_fraction_static {share} of the memory free before the weights load holds the "
            f"weights and the KV cache (this GPU's default: {engine.prefill_chunk_tokens}-token "
            f"steps{graphs}; the rest of the memory kept back for activations and CUDA graphs)"
        )
    return f"gpu_memory_utilization {share} of the CUDA total"


def with_engine_storage(
    estimate: MemoryEstimate,
    engine: ServingEngine,
    stack: SoftwareStack,
    *,
    weights_bytes: int,
    label: str | None = None,
    kv_per_token_bytes: int | None = None,
    kv_note: str | None = None,
) -> MemoryEstimate:
    """``estimate`` with its engine's answer (``estimate.serving``) sized again for weights of
    ``weights_bytes`` (the whole model, stored as ``label`` says: quantized weights; None:
    unquantized), each of the tensor-parallel GPUs holding ``1/gpus`` of them, and for a KV
    cache of ``kv_per_token_bytes`` per token on one GPU (None: as it was; an fp8 cache, as
    ``kv_note`` says); the profiling pass and the non-torch memory stay as they were.
    Unchanged without an engine answer. The plain-PyTorch figures of ``estimate`` stay those
    of the unquantized model and its 16-bit cache."""
    served = estimate.serving
    if served is None:
        return estimate
    gpus = max(served.gpus, 1)
    engine = engine.on_gpu(estimate.capacity_bytes / 2**30, estimate.gpu_name, gpus)
    again = serving_estimate(
        engine,
        stack,
        capacity_bytes=estimate.capacity_bytes,
        weights_bytes=-(-weights_bytes // gpus),
        # serving_estimate splits the pass over the GPUs again; it was split already
        activation_peak_bytes=served.activation_peak_bytes * gpus,
        kv_per_token_bytes=kv_per_token_bytes or served.kv_bytes_per_token,
        tokens_per_sequence=served.tokens_per_sequence,
        gpus=gpus,
    )
    labels = [served.engine_label]
    notes = list(again.assumptions)
    if label is not None:
        labels.append(label)
        notes.append(
            f"weights: {label}, {weights_bytes / 2**30:.2f} GiB in all (linear layers "
            "quantized with their scales; embeddings, head, norms and routers in the "
            "serving dtype); the activations of the profiling pass stay in the serving dtype"
            + ("" if kv_note else ", and so does the KV cache")
        )
    if kv_note is not None:
        labels.append("fp8 KV cache")
        notes.append(kv_note)
    again = again.model_copy(
        update={"engine_label": ", ".join(labels), "assumptions": tuple(notes)}
    )
    return estimate.model_copy(update={"serving": again})


def engine_verdict(estimate: MemoryEstimate) -> MemoryEstimate:
    """``estimate`` with its verdict taken from its serving engine's answer: it fits when the
    engine's KV cache holds the asked sequences (one, without a concurrency), and its largest
    concurrency is the engine's (``ServingEstimate.max_concurrency``). The memory figures stay
    plain PyTorch generation's at that concurrency, for comparison. Unchanged without an
    engine (``estimate.serving`` None)."""
    served = estimate.serving
    if served is None:
        return estimate
    asked = estimate.batch_size if estimate.batch_given else 1
    return estimate.model_copy(
        update={
            "fits": served.max_concurrency >= asked,
            "max_batch_size": served.max_concurrency,
            "max_batch_capped": False,
            "assumptions": (
                *estimate.assumptions,
                f"fits and the largest concurrency are {served.engine_label}'s: "
                f"{served.holds_words()}; the device, headroom and max-context figures are "
                "plain PyTorch generation's (the whole batch prefilled in one pass), for "
                "comparison",
            ),
        }
    )
