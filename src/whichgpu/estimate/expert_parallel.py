"""Expert-parallel training of a mixture of experts (``--expert-parallel E``): what it changes on
one GPU.

E data-parallel copies spread each layer's routed experts between them, each holding 1/E of
them (their weights, gradients and, where nothing shards it further, optimizer state); the rest
of the model stays on every copy. So of the model state a GPU holds whole it holds
``(1 - f) + f / E``, ``f`` the routed experts' share of the parameters; what ZeRO or FSDP
shards stays 1/N of the model (the other weights' state over the N copies, the experts' over
the N / E that hold the same ones), and the gradients a GPU reduces shrink as that state does.
Every token goes to the GPUs of its experts and comes back: an all-to-all of tokens x
experts-per-token x hidden 16-bit values before a layer's experts and one after (dispatch and
combine: Megatron-Core's ``alltoall`` token dispatcher, torchtitan's expert parallel), both
again in the backward pass with the gradients, and again for a recomputed layer; none of it is
overlapped with compute, as neither does by default. The experts' matrix products keep their
FLOPs per GPU (the routing taken as balanced, which auxiliary losses aim at). Pure Python: the
method, docs/memory.md and docs/throughput.md, "Expert parallel".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from whichgpu.estimate.data_parallel import LinkData, load_links, span_link
from whichgpu.estimate.serving import layer_shape, routed_experts, text_config
from whichgpu.schema import GpuSpec, RunConfig

DISPATCH_VALUE_BYTES = 2
"""Bytes of one value the all-to-all carries: the tokens' hidden states in 16 bits (also under
fp8 training, whose casts happen inside the experts' linear layers)."""
ALL_TO_ALLS_PER_PASS = 2
"""All-to-alls of one layer in one pass: dispatch to the experts and combine back."""
MLP_PROJECTIONS = 3
"""Weight matrices of one expert: the gated MLP's gate, up and down projections (Mixtral,
Qwen-MoE, DeepSeek)."""


@dataclass(frozen=True)
class Experts:
    """The routed experts of a mixture-of-experts config."""

    layers: int
    """Layers with routed experts (every layer: Mixtral's and Qwen-MoE's)."""
    experts: int
    """Routed experts per layer."""
    per_token: int
    """Experts each token is routed to."""
    hidden: int
    """Hidden size: the values of one token the all-to-all carries."""
    parameters: int
    """Parameters of every routed expert of every layer."""

    def fraction(self, params_total: int) -> float:
        """The routed experts' share of ``params_total`` parameters (at most 1)."""
        return min(1.0, self.parameters / params_total) if params_total > 0 else 0.0

    def dispatch_bytes_per_token(self) -> int:
        """Bytes of one token's trip to its experts (one all-to-all's payload per token)."""
        return self.per_token * self.hidden * DISPATCH_VALUE_BYTES


def experts_of(config: Mapping[str, Any]) -> Experts | None:
    """The routed experts of a Hugging Face ``config.json`` (Mixtral's ``num_local_experts``,
    Qwen-MoE's ``num_experts``, each expert an MLP of ``moe_intermediate_size`` or
    ``intermediate_size``); None for a dense model."""
    cfg = text_config(config)
    routed = routed_experts(cfg)
    if routed is None:
        return None
    per_token, experts = routed
    layers, hidden = layer_shape(cfg)
    width = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    return Experts(
        layers=layers,
        experts=experts,
        per_token=per_token,
        hidden=hidden,
        parameters=layers * experts * MLP_PROJECTIONS * hidden * width,
    )


def plan_refusal(config: Mapping[str, Any], run: RunConfig) -> str | None:
    """Why the model of ``config`` cannot train expert parallel as ``run`` asks (None: it
    can): it has no routed experts, or their count per layer does not divide by E."""
    e = run.expert_parallel
    if e <= 1:
        return None
    found = experts_of(config)
    if found is None:
        return "expert parallel spreads a mixture of experts' routed experts, and it has none"
    if found.experts % e:
        fits = [n for n in range(2, found.experts + 1) if found.experts % n == 0]
        return (
            f"its {found.experts} experts a layer do not split evenly over {e} GPUs; "
            f"expert-parallel degrees that do: {', '.join(map(str, fits)) or 'none'}"
        )
    return None


def exchange_share(fraction: float, expert: int, copies: int) -> float:
    """Bytes one GPU sends reducing its gradients under expert parallel over those without it
    (ring algorithms: ``2 (n - 1) / n`` of the reduced bytes among ``n`` GPUs): the other
    weights' gradients among the ``copies``, its experts' (``fraction / expert`` of the model)
    among the ``copies / expert`` that hold the same ones; 1 without expert parallel."""
    if expert <= 1 or copies <= 1:
        return 1.0

    def ring(n: int) -> float:
        return (n - 1) / n if n > 1 else 0.0

    return ((1 - fraction) * ring(copies) + fraction / expert * ring(copies // expert)) / ring(
        copies
    )


@dataclass(frozen=True)
class ExpertAllToAll:
    """The all-to-alls of expert parallel on one GPU over one optimizer step."""

    step_s: float
    """Their time, none hidden."""
    count: float
    """All-to-alls per layer and micro-batch: dispatch and combine in the forward pass, both
    in the backward, and again in a recomputed layer's forward."""
    bytes_each: float
    """Bytes one GPU sends to the others in one of them."""
    link: str
    """The link they cross, in words."""


def all_to_all(
    run: RunConfig,
    gpu: GpuSpec,
    experts: Experts,
    tokens: int,
    recomputed_share: float,
    links: LinkData | None = None,
) -> ExpertAllToAll:
    """The all-to-alls of one optimizer step on one GPU of ``run`` (``grad_accum``
    micro-batches of ``tokens`` tokens each on this GPU, over its pipeline stage's share of
    the layers; ``recomputed_share``: the share of layers whose forward the backward repeats).
    Each sends the ``(E - 1) / E`` of its tokens' trips that go to other GPUs. The E GPUs of a
    group sit ``context_parallel`` apart (Megatron-Core's order: context inside expert), so
    while ``C x E`` GPUs fit in the node (or NVLink domain) they cross its link at the rate
    NCCL reaches there, and otherwise the GPU's own NIC."""
    data = links or load_links()
    e = run.expert_parallel
    rate, words = span_link(gpu, run.context_parallel * e, run.network, data)
    each = tokens * experts.dispatch_bytes_per_token() * (e - 1) / e
    count = ALL_TO_ALLS_PER_PASS * (2 + recomputed_share)
    layers = -(-experts.layers // run.pipeline_parallel)
    per_call_s = max(each / rate, data.all_reduce_floor_s)
    return ExpertAllToAll(
        step_s=run.grad_accum * layers * count * per_call_s,
        count=count,
        bytes_each=each,
        link=words,
    )


def expert_note(run: RunConfig, fraction: float, moved: ExpertAllToAll) -> str:
    """What the prediction assumed of expert parallel, with its numbers."""
    e = run.expert_parallel
    return (
        f"expert parallel {e}: each GPU holds 1/{e} of every layer's routed experts "
        f"({fraction:.0%} of the parameters) and runs its own micro-batch through the rest; "
        f"its tokens reach their experts and come back by all-to-all, {moved.count:g} a layer "
        f"and micro-batch of {moved.bytes_each / 1e6:,.0f} MB sent each, over {moved.link}, "
        f"not overlapped: {moved.step_s * 1e3:,.1f} ms a step; the experts' gradients are "
        f"reduced among the {max(1, run.data_parallel() // e)} copies that hold the same "
        "ones; routing taken as balanced (the experts' matrix products at their FLOPs)"
    )
