"""Training with a micro-batch split across GPUs: what tensor, pipeline and context parallelism
add to a step.

A run of ``gpus`` GPUs with ``tensor_parallel`` T and ``pipeline_parallel`` P holds ``gpus /
(T x P)`` copies of the model side by side (data parallel, as ``estimate.data_parallel``
times it); each copy is split into P stages of consecutive layers, and each stage's layers
over T GPUs of one node. One GPU runs its stage's share of every operator (the busiest
stage's, ``sharding.stage_work_share``) at 1/T of its FLOPs and bytes, and launches every
kernel of its stage. Tensor parallel with sequence parallel exchanges a micro-batch's hidden states
four times per layer and micro-step (an all-gather before and a reduce-scatter after the
attention and the MLP, forward and backward: the volume of four all-reduces), plus two more
per recomputed layer, over the node's link; nothing of it hides behind compute (no
asynchronous tensor parallel). The 1F1B pipeline schedule runs a step's M micro-batches in
``M + P - 1`` micro-batch times, so each stage idles for ``P - 1`` of them (the bubble), and
sends a micro-batch's hidden states forward and their gradient back at every stage boundary,
over the NIC when the stages are on different nodes; the interleaved schedule (V chunks of
layers per GPU) cuts the bubble to ``(P - 1) / V`` and sends V times as often. Where each GPU
sits follows Megatron-LM's order (tensor parallel innermost, then data parallel, then
pipeline stages): the data-parallel copies of a GPU exchange over the node's link while they
fit in one node, and over the network otherwise. Context parallel over C GPUs gives each 1/C
of every sequence's tokens and passes keys and values around a ring beside attention
(``context_ring``). What is refused, and why: ``plan_refusal``. The method and its sources:
docs/throughput.md, "Tensor and pipeline parallel training" and "Context parallel".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from whichgpu.estimate.data_parallel import (
    Link,
    LinkData,
    all_reduce_s,
    get_fabric,
    gpu_link,
    link_domain,
    load_links,
    span_link,
)
from whichgpu.estimate.serving import attention_heads, kv_heads, layer_shape
from whichgpu.schema import GpuSpec, RunConfig

TENSOR_EXCHANGES_PER_LAYER = 4
"""All-reduce volumes a tensor-parallel layer exchanges per micro-step: one after the attention
and one after the MLP in the forward pass, the same two in the backward pass (Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
arXiv 2104.04473, section 3.3; with sequence parallel each is an all-gather and a
reduce-scatter of the same volume: Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", arXiv 2205.05198, section 4.2.2)."""
RECOMPUTED_EXCHANGES_PER_LAYER = 2
"""The forward pass's two exchanges again, for a layer whose activations are recomputed."""


def plan_refusal(
    config: Mapping[str, Any], run: RunConfig, links: LinkData | None = None
) -> str | None:
    """Why the model of ``config`` (a Hugging Face ``config.json``) cannot train under
    ``run``'s tensor- and pipeline-parallel split as whichgpu models it (None: it can).
    Tensor parallel stays within one node, whose link carries its per-layer exchanges (the
    network between nodes is several times slower), and splits the attention heads and the
    key/value heads evenly (Megatron-LM requires both to divide by it); pipeline parallel
    needs a layer per stage at least; context parallel over C GPUs cuts each sequence into 2C
    equal chunks (Megatron-Core requires the length to divide by 2C)."""
    data = links or load_links()
    t, p = run.tensor_parallel, run.pipeline_parallel
    node = data.max_gpus_per_node
    if t > node:
        return (
            f"tensor parallel {t} would span nodes (a node holds {node} GPUs); its four "
            "exchanges per layer need the node's own link, so keep it within a node and split "
            "across nodes by pipeline stages or data parallel"
        )
    if t > 1:
        heads, kv = attention_heads(config), kv_heads(config)
        if heads % t or kv % t:
            fits = [n for n in (2, 4, 8) if n <= node and heads % n == 0 and kv % n == 0]
            return (
                f"its {heads} attention heads ({kv} key/value heads) do not split evenly over "
                f"{t} GPUs; tensor-parallel degrees that do: "
                + (", ".join(str(n) for n in fits) or "none")
            )
    c = run.context_parallel
    if c > 1:
        layer_shape(config)  # a model without layers and heads raises, as for the others
        kv_heads(config)
        if run.seq_len is None:
            return "context parallel splits sequences, and this workload takes none"
    if c > 1 and run.seq_len is not None and run.seq_len % (2 * c):
        fits = [n for n in (2, 4, 8, 16, 32) if run.seq_len % (2 * n) == 0]
        return (
            f"context parallel {c} cuts each sequence into {2 * c} equal chunks (two a GPU, "
            f"balancing causal attention), and {run.seq_len:,} tokens do not divide into them; "
            f"context-parallel degrees that do: {', '.join(map(str, fits)) or 'none'}"
        )
    if p > 1:
        layers, _ = layer_shape(config)
        v = run.virtual_stages
        if p * v > layers:
            chunks = f"{p} pipeline stages" + (f" of {v} virtual stages" if v > 1 else "")
            return f"{chunks} need at least {p * v} layers, and the model has {layers}"
        if v > 1 and layers % (p * v):
            return (
                f"the interleaved schedule splits the {layers} layers into {p} x {v} equal "
                f"chunks, which {layers} does not divide into (Megatron-LM requires it)"
            )
    return None


@dataclass(frozen=True)
class ModelParallelStep:
    """What tensor and pipeline parallelism add to one optimizer step on one GPU."""

    tensor_s: float
    """Tensor-parallel exchanges over the step's micro-batches (none hidden)."""
    send_s: float
    """Pipeline sends of hidden states and their gradients over the step's micro-batches."""
    bubble_s: float
    """The pipeline's idle time: ``P - 1`` micro-batch times of this stage."""
    tensor_link: Link | None
    """The link of the tensor-parallel exchanges (None without tensor parallel)."""
    stage_link: str | None
    """The link between pipeline stages, in words (None without pipeline parallel)."""
    context_s: float = 0.0
    """Context parallel: the ring's passes of keys and values (and of their gradients) over
    the step's micro-batches, as far as they outlast the attention they run beside."""
    context_link: str | None = None
    """The link the context-parallel ring runs over, in words (None without it)."""
    context_hidden: float = 1.0
    """Share of the ring's time hidden behind attention (1: all of it)."""

    @property
    def added_s(self) -> float:
        """All of it: time the step takes beyond its compute."""
        return self.tensor_s + self.send_s + self.bubble_s + self.context_s


def model_parallel_step(
    micro_s: float,
    run: RunConfig,
    gpu: GpuSpec,
    *,
    tokens: int,
    hidden_bytes_per_token: int,
    layers: int,
    links: LinkData | None = None,
    kv_bytes_per_token: float = 0.0,
    attention_s: tuple[float, float] = (0.0, 0.0),
    gemm_s: float = 0.0,
) -> ModelParallelStep:
    """The tensor-parallel exchanges, pipeline sends, context-parallel ring and bubble of one
    optimizer step of ``run`` on ``gpu``: ``micro_s`` is one micro-batch's forward and
    backward on this GPU (its share of the stage's work), ``tokens`` a micro-batch's tokens
    (all of each sequence's, before context parallel splits them), ``layers`` the whole
    model's (a stage holds ``ceil(layers / P)``); for context parallel,
    ``kv_bytes_per_token`` is one token's keys and values in one layer as this GPU holds
    them (its tensor-parallel share of the heads) and ``attention_s`` this GPU's attention
    time in one micro-batch's forward and backward passes; with ``tensor_parallel_overlap``,
    ``gemm_s`` is this GPU's matrix-product time in them, which a layer's exchanges run
    beside."""
    data = links or load_links()
    t, p, m = run.tensor_parallel, run.pipeline_parallel, run.grad_accum
    v = run.virtual_stages
    stage_layers = -(-layers // p)
    micro_bytes = tokens * hidden_bytes_per_token / run.context_parallel
    tensor_link = None
    per_micro_tensor = 0.0
    if t > 1:
        tensor_link = gpu_link(gpu, t, data)
        exchanges = TENSOR_EXCHANGES_PER_LAYER + _recomputed_exchanges(run)
        per_layer = exchanges * all_reduce_s(micro_bytes, t, tensor_link, data)
        if run.tensor_parallel_overlap:  # beside the layer's matrix products: what outlasts them
            per_layer = max(0.0, per_layer - gemm_s / stage_layers)
        per_micro_tensor = stage_layers * per_layer
    per_micro_send = 0.0
    stage_link = None
    if p > 1:
        rate, stage_link = _stage_rate(gpu, run, data)
        # forward: hidden states to the next stage; backward: their gradient to the previous;
        # interleaved, a micro-batch passes every GPU v times
        per_micro_send = 2 * v * micro_bytes / rate
    per_micro_context = 0.0
    context_link = None
    hidden = 1.0
    if run.context_parallel > 1:
        ring = context_ring(run, gpu, tokens, kv_bytes_per_token, stage_layers, attention_s, data)
        per_micro_context, context_link, hidden = ring.exposed_s, ring.link, ring.hidden
    # interleaved 1F1B: the bubble is (p - 1) micro-batch times of one chunk, 1/v of a stage
    bubble_s = (p - 1) / v * (micro_s + per_micro_tensor + per_micro_send + per_micro_context)
    return ModelParallelStep(
        tensor_s=m * per_micro_tensor,
        send_s=m * per_micro_send,
        bubble_s=bubble_s,
        tensor_link=tensor_link,
        stage_link=stage_link,
        context_s=m * per_micro_context,
        context_link=context_link,
        context_hidden=hidden,
    )


@dataclass(frozen=True)
class ContextRing:
    """The context-parallel ring of one micro-batch on one GPU."""

    ring_s: float
    """The passes' time on the link, forward and backward."""
    exposed_s: float
    """What of it outlasts the attention it overlaps, layer by layer and pass by pass."""
    link: str
    """The link, in words."""

    @property
    def hidden(self) -> float:
        """Share of the ring's time hidden behind attention."""
        return 1.0 - self.exposed_s / self.ring_s if self.ring_s > 0 else 1.0


def context_ring(
    run: RunConfig,
    gpu: GpuSpec,
    tokens: int,
    kv_bytes_per_token: float,
    layers: int,
    attention_s: tuple[float, float],
    links: LinkData | None = None,
) -> ContextRing:
    """The ring of keys and values context parallel over C GPUs runs in each of ``layers``
    layers for one micro-batch of ``tokens`` (ring attention: Liu et al., "Ring Attention with
    Blockwise Transformers for Near-Infinite Context", arXiv 2310.01889; Megatron-Core's
    context parallel passes the chunks peer to peer the same way). Each GPU holds 1/C of the
    tokens; in the forward pass it passes C - 1 chunks of keys and values on (one chunk's
    bytes: ``tokens / C x kv_bytes_per_token``) while it computes attention with the chunk it
    has; in the backward pass the chunks go round again with their gradients, twice the bytes;
    a recomputed layer's forward passes them once more. Each pass overlaps the attention it
    feeds, so only what outlasts the layer's attention (``attention_s`` over the layers) is
    added. The GPUs of a ring sit ``tensor_parallel`` apart (Megatron-LM's order: tensor
    innermost, then context), so the ring stays in the node (or NVLink domain) while
    ``T x C`` GPUs fit in it, at the node link's rate NCCL reaches, and otherwise crosses the
    network at the GPU's own NIC's."""
    c = run.context_parallel
    rate, words = span_link(gpu, run.tensor_parallel * c, run.network, links)
    pass_s = (c - 1) * tokens / c * kv_bytes_per_token / rate  # one layer, one pass
    recomputed = recomputed_layers(run)
    forward, backward = (s / layers for s in attention_s)
    # a recomputed layer's attention runs in the backward phase beside its own ring pass
    forward_exposed = max(0.0, pass_s - forward)
    backward_exposed = max(0.0, (2 + recomputed) * pass_s - backward)
    return ContextRing(
        ring_s=layers * (3 + recomputed) * pass_s,
        exposed_s=layers * (forward_exposed + backward_exposed),
        link=words,
    )


def recomputed_layers(run: RunConfig) -> float:
    """Share of the layers whose forward pass the backward repeats (``full``: all;
    ``every-N``: one in N); none for ``selective``, which keeps attention's outputs."""
    every = run.checkpointing_every_layers()
    if every is None or run.checkpointing_policy == "selective":
        return 0.0
    return 1 / every


def _recomputed_exchanges(run: RunConfig) -> float:
    """Exchanges per layer that recomputation repeats: the forward's two for every
    recomputed layer (``full``: all; ``every-N``: one in N); none for ``selective``, which
    recomputes only the cheap operators between the exchanges."""
    return RECOMPUTED_EXCHANGES_PER_LAYER * recomputed_layers(run)


def _stage_rate(gpu: GpuSpec, run: RunConfig, data: LinkData) -> tuple[float, str]:
    """The rate (bytes/s) a pipeline stage sends to the next at, and the link in words: the
    node's link while the whole run is in one node (or one NVLink domain, ``link_domain``);
    the sending GPU's own NIC otherwise (the stages of a run across nodes are whole nodes, or
    some boundary crosses one)."""
    return span_link(gpu, run.gpus, run.network, data)


def data_parallel_link(gpu: GpuSpec, run: RunConfig, links: LinkData | None = None) -> Link:
    """The link a GPU's data-parallel copies (with the context-parallel GPUs of each, which
    reduce the same gradients) exchange gradients over under ``run``'s split: the node's own
    while tensor-parallel groups x copies fit in one node (or one NVLink
    domain, ``link_domain``), else the network,
    whose NICs in a node carry as many rings side by side as the node holds GPUs of one
    copy's group (``node / T``, at least one)."""
    data = links or load_links()
    node = data.max_gpus_per_node
    dp, t = run.state_group(), run.tensor_parallel
    inside = gpu_link(gpu, min(link_domain(gpu, data), max(2, dp * t)), data)
    if dp * t <= link_domain(gpu, data):
        return inside
    fabric = get_fabric(run.network, data)
    who = "copies" if run.context_parallel == 1 else "GPUs"
    per_node = max(1, node // t)
    share = data.bus_efficiency["network"]
    nic = per_node * fabric.bytes_per_s_per_gpu
    bound = "the network" if nic * share < inside.bus_bytes_per_s else "the node's link"
    return Link(
        kind="network",
        description=f"{dp} {who} over {fabric.id} ({fabric.gbit_per_s_per_gpu:,.0f} Gb/s per "
        f"GPU, {per_node} per node in each ring); {bound} sets the pace",
        peak_bytes_per_s=min(nic, inside.peak_bytes_per_s),
        bus_bytes_per_s=min(nic * share, inside.bus_bytes_per_s),
    )


def model_parallel_note(run: RunConfig, step: ModelParallelStep, share: float) -> str:
    """What the prediction assumed of the split, in words (``share``: the heaviest stage's
    share of the model's work)."""
    parts = [f"{run.model_parallel_words()} ({run.data_parallel()} data-parallel copies)"]
    if step.tensor_link is not None:
        hidden = (
            "beside the layer's matrix products, only what outlasts them added (Megatron's "
            "--tp-comm-overlap, async tensor parallel)"
            if run.tensor_parallel_overlap
            else "none of it hidden behind compute (no asynchronous tensor parallel)"
        )
        parts.append(
            f"each GPU runs 1/{run.tensor_parallel} of every operator of its stage and "
            f"exchanges hidden states {TENSOR_EXCHANGES_PER_LAYER} times a layer (plus the "
            f"recomputed ones) over {step.tensor_link.description}, {hidden}"
        )
    if step.stage_link is not None:
        p, v, m = run.pipeline_parallel, run.virtual_stages, run.grad_accum
        schedule = f"interleaved 1F1B ({v} chunks a GPU)" if v > 1 else "1F1B"
        idle = (p - 1) / v
        parts.append(
            f"the busiest of {p} stages (the last) sets the pace ({share:.1%} of the model's "
            f"work); {schedule} over {m} micro-batches idles {idle:g} micro-batch times a step (a "
            f"bubble of {idle / (m + idle):.0%}); hidden states cross stages over "
            f"{step.stage_link}"
        )
    if step.context_link is not None:
        c = run.context_parallel
        parts.append(
            f"context parallel over {c} GPUs: each runs 1/{c} of every sequence's tokens "
            f"through the forward and backward passes (attention's score blocks shared evenly "
            f"by balanced causal chunks) and the whole optimizer step; keys and values pass "
            f"around the ring over {step.context_link}, {c - 1} chunks a layer and pass, "
            "twice in the backward pass (with their gradients), beside the attention they "
            f"feed: {step.context_hidden:.0%} of it hidden; the gradients are reduced over the "
            f"{run.state_group()} GPUs that hold the same weights"
        )
    return "; ".join(parts)
