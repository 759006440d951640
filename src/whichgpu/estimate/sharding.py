"""Data-parallel training on N GPUs: one step's allocations as one GPU (rank) of N sees them.

A stored or traced profile is the step of a single process. Training on ``N`` GPUs of a node
runs that step on every GPU with its own batch, and the strategy (``ddp``, ``zero2``,
``zero3``/``fsdp``) decides what each GPU holds besides: this module rewrites the event stream
into the stream of one rank — gradient buckets, ``1/N`` shards, gathered units, and under AMP
ZeRO's and FSDP's 16-bit working parameters in place of autocast's casts — which
``whichgpu.estimate.memory`` replays through the allocator model like any other. ``N = 1``
leaves the stream unchanged. Pure Python; never imports torch.

The method and its sources: docs/memory.md, "Training on N GPUs" and its "Sharding".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from whichgpu.schema import Phase, Sharding, TensorCategory
from whichgpu.units import GIB, MIB

DDP_BUCKET_CAP_BYTES = 25 * MIB
"""DDP's ``bucket_cap_mb`` default (25 MiB)."""
DDP_FIRST_BUCKET_BYTES = 1 * MIB
"""DDP's first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``)."""
ZERO_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's ``reduce_bucket_size`` default, in elements."""
SHARD_GRANULE_BYTES = 8
"""Shards are counted in granules of this size (a multiple of every element size)."""
TRACED_PARAMETER_BYTES = 4
"""Element size of the parameters of an AMP trace (fp32)."""
WORKING_PARAMETER_BYTES = 2
"""Element size of ZeRO's and FSDP's mixed-precision working parameters (bf16/fp16)."""
FP8_GATHERED_BYTES = 1
"""Element size of a weight FSDP gathers in fp8 (``Parallel.fp8_gather``)."""

Event = tuple[int, int, bool, TensorCategory]
"""One allocation or free as the allocator replays it: handle, bytes, alloc, category."""
Added = tuple[tuple[int, TensorCategory], ...]
"""Allocations a strategy adds: bytes and category of each."""

_ADDED_HANDLES = -(1 << 40)
"""Handles of allocations this module adds count down from here (clear of traced storages and
of the workspaces, which use small negative handles)."""


@dataclass(frozen=True)
class Parallel:
    """How many GPUs train together and what they split between them."""

    gpus: int = 1
    """GPUs the model state is split over (for ``hsdp``, those of one node: its shard group;
    ``data_parallel.memory_parallel``)."""
    sharding: Sharding = "ddp"
    """Strategy (see docs/memory.md, "Training on N GPUs")."""
    tensor: int = 1
    """GPUs each layer is split over (tensor parallel with sequence parallel), before the
    data-parallel split: each holds 1/``tensor`` of the model state and of the activations."""
    pipeline: int = 1
    """Pipeline stages the layers are split into; a GPU holds its stage's share of the model
    state (``stage_share``) and, under 1F1B with a micro-batch per stage in flight on the
    first stage, one micro-batch's activations of every layer."""
    virtual: int = 1
    """Chunks of layers per GPU under the interleaved schedule: the first stage then holds
    ``1 + (P - 1) / (P V)`` times the activations of plain 1F1B."""
    fp8_gather: bool = False
    """ZeRO-3/FSDP gather the repeated blocks' weights in fp8 (fp8 training's all-gather):
    one byte a weight in the gathered units."""
    context: int = 1
    """GPUs each sequence is split over (context parallel): each holds 1/``context`` of every
    activation and the whole model state, which it shares with the others as data-parallel
    copies do (``gpus`` counts them)."""
    expert: int = 1
    """Data-parallel copies each layer's routed experts are spread over (expert parallel):
    each holds 1/``expert`` of them."""
    expert_fraction: float = 0.0
    """The routed experts' share of the model's parameters (``expert`` > 1)."""

    @property
    def expert_share(self) -> float:
        """Share of the model state one GPU holds of what it holds whole under expert parallel:
        everything but the routed experts, and 1/``expert`` of those (1 without it)."""
        return 1.0 - self.expert_fraction * (1.0 - 1.0 / self.expert)

    @property
    def model_parallel(self) -> bool:
        """Whether a micro-batch is split (tensor, pipeline or context parallel)."""
        return self.tensor > 1 or self.pipeline > 1 or self.context > 1


SINGLE_GPU = Parallel()
"""One GPU: the traced step as it is."""


@dataclass(frozen=True)
class ShardingPlan:
    """What one rank of ``parallel`` holds besides its share of the traced step."""

    parallel: Parallel
    """GPUs and strategy."""
    wrap: Added
    """Allocations made when the model is wrapped and kept: DDP buckets, the ZeRO-2 bucket and
    sharded parameters."""
    each_pass: Added
    """Allocations live from the start of each forward to the end of its backward (gathered
    parameters)."""
    each_backward: Added
    """Allocations live through each backward (unsharded gradients awaiting reduce-scatter)."""
    shard_parameters: bool
    """Parameters are split ``1/N``."""
    shard_gradients: bool
    """Gradients (and optimizer state and temporaries) are split ``1/N``."""
    copy_full_gradients: bool
    """Each full gradient is produced, copied into the reduce bucket and freed (ZeRO-2)."""
    assumptions: tuple[str, ...]
    """What the plan assumes, in words."""
    working_parameters: bool = False
    """16-bit working parameters replace autocast's casts: the casts are dropped, and whole
    parameters (ZeRO-2) and full gradients are held at 16 bits."""
    state_share: float = 1.0
    """Share of every model-state tensor (parameters, their casts, gradients, optimizer state
    and the optimizer's temporaries) one GPU holds before the data-parallel split: its
    pipeline stage's share over the tensor-parallel GPUs (1: the whole model)."""
    activation_share: float = 1.0
    """Share of every activation, input and forward or backward temporary one GPU holds
    (1/tensor-parallel GPUs; 1: all)."""
    shard_optimizer_state: bool = False
    """The optimizer state and the optimizer step's temporaries are split ``1/N`` although the
    gradients are not (ZeRO-1); with ``shard_gradients`` they are split anyway."""
    expert_share: float = 1.0
    """Share of each model-state tensor one GPU holds where the data-parallel strategy keeps it
    whole, under expert parallel (``Parallel.expert_share``); what ZeRO or FSDP shards 1/N stays
    1/N of the model (the experts' state is sharded over the N / E copies that hold them)."""

    @property
    def identity(self) -> bool:
        """Whether the stream is left as traced."""
        return self.parallel.gpus == 1 and self.state_share == 1 and self.activation_share == 1


def shard_bytes(nbytes: int, gpus: int) -> int:
    """One rank's bytes of an ``nbytes`` tensor split ``gpus`` ways, padded up (see module)."""
    if gpus == 1:
        return nbytes
    granules = -(-nbytes // SHARD_GRANULE_BYTES)
    return -(-granules // gpus) * SHARD_GRANULE_BYTES


def ddp_buckets(gradient_bytes: Sequence[int]) -> tuple[int, ...]:
    """DDP's bucket sizes for gradients becoming ready in this order (first bucket smaller)."""
    buckets: list[int] = []
    current = 0
    cap = DDP_FIRST_BUCKET_BYTES
    for nbytes in gradient_bytes:
        current += nbytes
        if current >= cap:
            buckets.append(current)
            current = 0
            cap = DDP_BUCKET_CAP_BYTES
    if current:
        buckets.append(current)
    return tuple(buckets)


def repeated_block(sizes: Sequence[int]) -> tuple[int, int]:
    """``(bytes of one block, number of blocks)`` of the run of repeating sizes that covers
    the most bytes (``(0, 0)`` when nothing repeats); the shortest period wins a tie."""
    n = len(sizes)
    prefix = [0, *itertools.accumulate(sizes)]
    best_covered, best = 0, (0, 0)
    for period in range(1, n // 2 + 1):
        run = 0
        for j in range(n - period + 1):
            if j < n - period and sizes[j] == sizes[j + period]:
                run += 1
                continue
            copies = (run + period) // period
            if copies >= 2:
                start = j - run
                block = prefix[start + period] - prefix[start]
                if copies * block > best_covered:
                    best_covered, best = copies * block, (block, copies)
            run = 0
    return best


def stage_share(parameter_bytes: Sequence[int], stages: int) -> float:
    """Share of the model's parameters on the heaviest of ``stages`` pipeline stages, from the
    parameter sizes in model order: whole repeated blocks (layers) split as evenly as they go,
    ``ceil(blocks / stages)`` on the fullest stage, and the rest of the model (the root) split
    in two: its largest tensor (a language model's embedding) on the first stage and the
    remainder (its output layer and final norm) on the last; where the output layer shares the
    embedding's weights, the last stage holds a copy, which the larger part covers. 1 for one
    stage, or when no block repeats (nothing to split by layer)."""
    parts = _model_parts(parameter_bytes)
    if stages <= 1 or parts is None:
        return 1.0
    block, blocks, first, rest = parts
    heaviest = -(-blocks // stages) * block + max(first, rest)
    return min(1.0, heaviest / sum(parameter_bytes))


def fp8_gathered_share(parameter_bytes: Sequence[int]) -> float:
    """Share of the model's parameters FSDP gathers in fp8 under fp8 all-gather: its repeated
    blocks (layers), whose linear weights fp8 training converts; 0 when none repeats."""
    parts = _model_parts(parameter_bytes)
    if parts is None:
        return 0.0
    block, blocks, _, _ = parts
    return block * blocks / sum(parameter_bytes)


def _model_parts(parameter_bytes: Sequence[int]) -> tuple[int, int, int, int] | None:
    """``(block, blocks, first, rest)`` of a model's parameter sizes in model order: its
    repeated block's bytes and count (``repeated_block``), and the rest of the model split
    into its largest tensor (a language model's embedding) and the remainder; None when no
    block repeats."""
    block, blocks = repeated_block(parameter_bytes)
    if blocks == 0:
        return None
    root = sum(parameter_bytes) - block * blocks
    first = min(max(parameter_bytes), root)
    return block, blocks, first, root - first


def stage_work_share(parameter_bytes: Sequence[int], stages: int) -> float:
    """Share of the model's matrix work on the busiest of ``stages`` pipeline stages, from the
    parameter sizes in model order (as ``stage_share``): a layer's work goes with its weights,
    the embedding's lookup does none, and the output layer's product is the last stage's,
    with its own weights or, where it shares the embedding's (the rest of the model beyond the
    embedding is less than half of it), with those. So the last stage, with ``ceil(blocks /
    stages)`` blocks and the output layer, is the busiest. 1 for one stage, or when no block
    repeats."""
    parts = _model_parts(parameter_bytes)
    if stages <= 1 or parts is None:
        return 1.0
    block, blocks, first, rest = parts
    output = first if rest < first / 2 else rest  # tied: the embedding's weights again
    return min(1.0, (-(-blocks // stages) * block + output) / (block * blocks + output))


def model_parallel_shares(
    parallel: Parallel, parameter_bytes: Sequence[int]
) -> tuple[float, float, tuple[str, ...]]:
    """``(state_share, activation_share, notes)`` of one GPU of ``parallel``'s tensor- and
    pipeline-parallel split (see ``ShardingPlan``); ``(1, 1, ())`` without one."""
    if not parallel.model_parallel:
        return 1.0, 1.0, ()
    t, p, v, c = parallel.tensor, parallel.pipeline, parallel.virtual, parallel.context
    stage = stage_share(parameter_bytes, p)
    # the interleaved schedule's first stage holds more micro-batches in flight (Korthikanti
    # et al., "Reducing Activation Recomputation in Large Transformer Models", arXiv
    # 2205.05198, section 4.2.3: L (1 + (p - 1) / (p m)) layers' activations, m chunks)
    in_flight = 1 + (p - 1) / (p * v) if v > 1 else 1.0
    notes: list[str] = []
    if t > 1:
        notes.append(
            f"tensor parallel over {t} GPUs with sequence parallel (Megatron-LM's "
            "--sequence-parallel, torchtitan's default): each GPU holds 1/"
            f"{t} of every layer's weights, gradients and optimizer state (attention heads and "
            "MLP columns split; the embedding and output layer split by vocabulary) and 1/"
            f"{t} of every activation (the norms' and residuals' split along the sequence; the "
            "logits split by vocabulary, the loss computed on the shards)"
        )
    if p > 1:
        notes.append(
            f"pipeline parallel in {p} stages, 1F1B: the heaviest stage holds {stage:.1%} of "
            "the model state (its layers, and the embedding or the output layer); the first "
            f"stage keeps {p} micro-batches' activations of its 1/{p} of the layers, which is "
            "one micro-batch's activations of every layer, counted here with the embedding's "
            "and the logits' (which sit on the first and last stage) on the same GPU (safe "
            "side)"
        )
    if v > 1:
        notes.append(
            f"interleaved schedule, {v} chunks of layers per GPU: the first stage keeps "
            f"{in_flight:.3f} times that in flight (Korthikanti et al. 2022, section 4.2.3)"
        )
    if c > 1:
        notes.append(
            f"context parallel over {c} GPUs: each holds 1/{c} of every sequence's tokens (two "
            f"of {2 * c} chunks, so causal attention's work is even) and so 1/{c} of every "
            "activation, the attention's saved outputs included (the keys and values it "
            "receives around the ring are counted apart); the whole model state on each, "
            "shared with the data-parallel copies"
        )
    return stage / t, in_flight / (t * c), tuple(notes)


def _model_parallel_bytes(nbytes: int, share: float) -> int:
    """One GPU's bytes of an ``nbytes`` tensor of which it holds ``share``, padded up."""
    if share >= 1 or nbytes == 0:
        return nbytes
    return -(-math.ceil(nbytes * share) // SHARD_GRANULE_BYTES) * SHARD_GRANULE_BYTES


_MODEL_STATE = frozenset(
    ("parameter", "parameter_cast", "gradient", "optimizer", "paged_optimizer")
)
"""Categories a model-parallel split divides like the model state."""
_PER_SAMPLE = frozenset(("activation", "input", "temporary"))
"""Categories it divides like the activations (the optimizer's temporaries excepted)."""


def model_parallel_sizes(
    handles: Sequence[int],
    sizes: Sequence[int],
    allocs: Sequence[bool],
    categories: Sequence[TensorCategory],
    phases: Sequence[Phase],
    plan: ShardingPlan,
) -> list[int]:
    """The sizes of the traced events on one GPU of ``plan``'s model-parallel split: model
    state by ``state_share``, activations by ``activation_share``; a free takes the size its
    allocation was given. Buffers stay whole (every GPU holds them)."""
    if plan.state_share == 1 and plan.activation_share == 1:
        return list(sizes)
    given: dict[int, int] = {}
    out: list[int] = []
    for handle, size, alloc, category, now in zip(
        handles, sizes, allocs, categories, phases, strict=True
    ):
        if not alloc:
            out.append(given.pop(handle, size))
            continue
        if category in _MODEL_STATE or (category == "temporary" and now == "optimizer"):
            part = _model_parallel_bytes(size, plan.state_share)
        elif category in _PER_SAMPLE:
            part = _model_parallel_bytes(size, plan.activation_share)
        else:
            part = size
        given[handle] = part
        out.append(part)
    return out


def working_bytes(nbytes: int) -> int:
    """Bytes of the 16-bit working copy of ``nbytes`` of fp32 parameters (or gradients)."""
    return nbytes * WORKING_PARAMETER_BYTES // TRACED_PARAMETER_BYTES


def make_plan(
    parallel: Parallel,
    parameter_bytes: Sequence[int],
    gradient_bytes: Sequence[int],
    trainable_params: int,
    *,
    sixteen_bit_working: bool = False,
) -> ShardingPlan:
    """The plan for ``parallel`` from the step's parameter sizes (model order) and gradient
    sizes (order they become ready), both in bytes, and the count of trainable parameters.
    ``sixteen_bit_working``: the trace is AMP with every parameter fp32 and autocast casting
    them, so ZeRO and FSDP train 16-bit working parameters instead (see the module)."""
    state, activations, split_notes = model_parallel_shares(parallel, parameter_bytes)
    if parallel.model_parallel:
        plan = make_plan(
            replace(parallel, tensor=1, pipeline=1, virtual=1, context=1),
            [_model_parallel_bytes(b, state) for b in parameter_bytes],
            [_model_parallel_bytes(b, state) for b in gradient_bytes],
            math.ceil(trainable_params * state),
            sixteen_bit_working=sixteen_bit_working,
        )
        dp_notes = plan.assumptions
        if parallel.gpus == 1:
            dp_notes = ("no data-parallel copies: nothing more is split",)
        return replace(
            plan,
            parallel=parallel,
            state_share=state,
            activation_share=activations,
            assumptions=split_notes + dp_notes,
        )
    n, how = parallel.gpus, parallel.sharding
    if parallel.expert > 1:
        return _with_experts(
            parallel,
            parameter_bytes,
            gradient_bytes,
            trainable_params,
            sixteen_bit_working=sixteen_bit_working,
        )
    label = {
        "ddp": "DDP",
        "zero1": "ZeRO-1",
        "zero2": "ZeRO-2",
        "zero3": "ZeRO-3",
        "fsdp": "FSDP (FULL_SHARD)",
        "hsdp": "HSDP (FSDP HYBRID_SHARD: sharded within each node, replicated across nodes)",
    }
    if n == 1:
        note = "one GPU: nothing is split"
        if how != "ddp":
            note += " (FSDP runs as NO_SHARD at world size 1)"
        return ShardingPlan(parallel, (), (), (), False, False, False, (note,))
    head = f"{label[how]} on {n} GPUs; batch per GPU (global batch {n} x batch)"
    if how == "hsdp":  # n is one node's shard group; the replicas are the other nodes
        head = f"{label[how]}: shards over the {n} GPUs of a node; batch per GPU"
    working = sixteen_bit_working and how != "ddp"
    precision_note = (
        "mixed precision as DeepSpeed's bf16/fp16 modes, Megatron-Core's distributed optimizer "
        "and FSDP's MixedPrecision run it: 16-bit working parameters against an fp32 master "
        "shard, so no per-operator autocast copies of the weights"
    )
    half = working_bytes if working else (lambda nbytes: nbytes)
    if how == "ddp":
        buckets = ddp_buckets(gradient_bytes)
        note = (
            f"DDP gradient buckets hold a copy of every gradient ({_gib(sum(buckets))} GiB in "
            f"{len(buckets)} buckets: first {DDP_FIRST_BUCKET_BYTES // MIB} MiB, then "
            f"{DDP_BUCKET_CAP_BYTES // MIB} MiB; gradient_as_bucket_view off)"
        )
        wrap: Added = tuple((b, "gradient") for b in buckets)
        return ShardingPlan(parallel, wrap, (), (), False, False, False, (head, note))
    total_gradients = sum(gradient_bytes)
    if how in ("zero1", "zero2"):
        # the fp32 master partition (a 1/N shard of the trainable parameters) and DeepSpeed's
        # reduce bucket, at the gradients' element size, at most all of them
        element_bytes = -(-half(total_gradients) // max(trainable_params, 1))
        bucket = min(ZERO_REDUCE_BUCKET_ELEMENTS * element_bytes, half(total_gradients))
        master = sum(shard_bytes(g, n) for g in gradient_bytes)
        bucket_note = (
            f"full gradients pass through a reduce bucket of {_gib(bucket)} GiB (DeepSpeed "
            f"reduce_bucket_size {ZERO_REDUCE_BUCKET_ELEMENTS:,} elements, "
            "contiguous_gradients), held for the run"
        )
        precision = (precision_note,) if working else ()
        if how == "zero1":  # the gradients whole too, and an fp32 shard of them
            whole = "16-bit parameters and gradients" if working else "parameters and gradients"
            notes: tuple[str, ...] = (
                head,
                *precision,
                f"optimizer state and its temporaries split 1/{n}; {whole} whole on every GPU, "
                f"reduced once a step; a 1/{n} shard of the trainable parameters and one of "
                f"their gradients ({_gib(master)} GiB each: the master partition and its fp32 "
                "gradients), held for the run",
                bucket_note + " (Megatron-Core reduces its gradient buffer in place and needs "
                "none: the safe side)",
            )
            zero1: Added = ((master, "parameter"), (master, "gradient"), (bucket, "gradient"))
            wrap = tuple((b, c) for b, c in zero1 if b)
            return ShardingPlan(
                parallel, wrap, (), (), False, False, False, notes, working,
                shard_optimizer_state=True,
            )  # fmt: skip
        whole = "16-bit parameters" if working else "parameters"
        notes = (
            head,
            *precision,
            f"gradients, optimizer state and its temporaries split 1/{n}; {whole} whole on "
            f"every GPU plus a 1/{n} shard of the trainable ones ({_gib(master)} GiB: the "
            "master partition / sharded flat parameter)",
            bucket_note,
        )
        zero2: Added = ((master, "parameter"), (bucket, "gradient"))
        wrap = tuple((b, c) for b, c in zero2 if b)
        return ShardingPlan(parallel, wrap, (), (), False, True, True, notes, working)
    block, blocks = repeated_block(parameter_bytes)
    root = sum(parameter_bytes) - block * blocks
    grad_block, grad_blocks = repeated_block(gradient_bytes)
    grad_root = total_gradients - grad_block * grad_blocks
    if blocks:
        unit = (
            f"units: {blocks} repeated blocks of {_gib(block)} GiB (found as repeating "
            f"parameter sizes) and a root of {_gib(root)} GiB (every other parameter)"
        )
    else:
        unit = "no repeated block found: every parameter counts as one root unit"
    # fp8 all-gather: the blocks' linear weights (nearly all of a block) gathered in fp8; the
    # root (embedding, output layer), which fp8 training leaves in 16 bits, as before
    unit_block = (
        block * FP8_GATHERED_BYTES // TRACED_PARAMETER_BYTES if parallel.fp8_gather else half(block)
    )
    gathered = tuple(b for b in (half(root), unit_block, unit_block) if b)
    unsharded = tuple(half(b) for b in (grad_root, grad_block) if b)
    bits = "16-bit " if working else ""
    fp8_note = (
        (
            "fp8 all-gather: the blocks' weights gathered at 1 byte each (their norms' few "
            "weights counted so too), the root at 16 bits",
        )
        if parallel.fp8_gather
        else ()
    )
    notes = (
        head,
        *((precision_note,) if working else ()),
        f"parameters, gradients, optimizer state and its temporaries split 1/{n}",
        unit,
        f"{bits}parameters gathered through each forward and backward: the root plus the "
        f"current and the prefetched block ({_gib(sum(gathered))} GiB)",
        f"unsharded {bits}gradients through backward: the root's plus one block's "
        f"({_gib(sum(unsharded))} GiB) until their reduce-scatter",
        *fp8_note,
    )
    each_pass: Added = tuple((b, "parameter") for b in gathered)
    each_backward: Added = tuple((b, "gradient") for b in unsharded)
    return ShardingPlan(parallel, (), each_pass, each_backward, True, True, False, notes, working)


def _with_experts(
    parallel: Parallel,
    parameter_bytes: Sequence[int],
    gradient_bytes: Sequence[int],
    trainable_params: int,
    *,
    sixteen_bit_working: bool,
) -> ShardingPlan:
    """The data-parallel plan of ``parallel`` under expert parallel: the plan without it, with
    what that holds whole (DDP's buckets, ZeRO's reduce bucket, FSDP's gathered and unsharded
    units) at the share of the model an expert-parallel GPU holds (the routed experts, in the
    repeated blocks, 1/E of theirs), and ``expert_share`` for the rank's whole state."""
    plain = make_plan(
        replace(parallel, expert=1, expert_fraction=0.0),
        parameter_bytes,
        gradient_bytes,
        trainable_params,
        sixteen_bit_working=sixteen_bit_working,
    )
    share = parallel.expert_share
    block, blocks = repeated_block(parameter_bytes)
    experts_bytes = parallel.expert_fraction * sum(parameter_bytes)
    # a gathered or unsharded unit is a block (a layer) with its experts, or the root without
    block_share = (
        1.0 - min(1.0, experts_bytes / (block * blocks)) * (1.0 - 1.0 / parallel.expert)
        if blocks
        else share
    )

    def blocks_at_share(added: Added, root: int) -> Added:
        """``added``, the root's unit first where there is one, with the blocks' units at
        ``block_share``."""
        return tuple(
            (b if i == 0 and root else _model_parallel_bytes(b, block_share), c)
            for i, (b, c) in enumerate(added)
        )

    if plain.shard_parameters:  # FSDP / ZeRO-3: the root whole, the blocks at their share
        grad_block, grad_blocks = repeated_block(gradient_bytes)
        each_pass = blocks_at_share(plain.each_pass, sum(parameter_bytes) - block * blocks)
        each_backward = blocks_at_share(
            plain.each_backward, sum(gradient_bytes) - grad_block * grad_blocks
        )
        wrap = plain.wrap
    else:  # DDP's buckets, ZeRO's reduce bucket: a share of the gradients they hold
        each_pass, each_backward = plain.each_pass, plain.each_backward
        wrap = tuple(
            (_model_parallel_bytes(b, share) if c == "gradient" else b, c) for b, c in plain.wrap
        )
    note = (
        f"expert parallel {parallel.expert}: the routed experts are "
        f"{parallel.expert_fraction:.0%} of the parameters and each GPU holds 1/"
        f"{parallel.expert} of them, so what it holds whole is {share:.1%} of the model's "
        "state; what is sharded stays 1/N of it (the experts' over the copies that hold them)"
    )
    return replace(
        plain,
        parallel=parallel,
        wrap=wrap,
        each_pass=each_pass,
        each_backward=each_backward,
        expert_share=share,
        assumptions=(*plain.assumptions, note),
    )


def rank_events(
    handles: Sequence[int],
    sizes: Sequence[int],
    allocs: Sequence[bool],
    categories: Sequence[TensorCategory],
    phases: Sequence[Phase],
    plan: ShardingPlan,
    rank_phases: list[Phase] | None = None,
) -> list[Event]:
    """The events of one rank under ``plan``, from the traced step's events (parallel lists):
    first its model-parallel share of each (``model_parallel_sizes``), then the data-parallel
    strategy's rewrite. ``rank_phases``, when given, receives the phase of each event returned
    (an added buffer's: the phase of the traced event it came before)."""
    if plan.identity:
        if rank_phases is not None:
            rank_phases.extend(phases)
        return list(zip(handles, sizes, allocs, categories, strict=True))
    sizes = model_parallel_sizes(handles, sizes, allocs, categories, phases, plan)
    out: list[Event] = []
    added = itertools.count(_ADDED_HANDLES, -1)
    resized: dict[int, int] = {}
    live_pass: list[Event] = []
    live_backward: list[Event] = []
    wrapped = False
    phase: Phase | None = None
    n = plan.parallel.gpus

    def allocate(extra: Added, into: list[Event]) -> None:
        for nbytes, category in extra:
            event = (next(added), nbytes, True, category)
            out.append(event)
            into.append(event)

    def release(held: list[Event]) -> None:
        out.extend((h, nbytes, False, c) for h, nbytes, _, c in held)
        held.clear()

    def whole(nbytes: int) -> int:
        """What one GPU holds of a state tensor it keeps whole (expert parallel: its share)."""
        return _model_parallel_bytes(nbytes, plan.expert_share)

    for handle, size, alloc, category, now in zip(
        handles, sizes, allocs, categories, phases, strict=True
    ):
        if rank_phases is not None:  # what the previous traced event added
            rank_phases.extend([phase or now] * (len(out) - len(rank_phases)))
        if not wrapped and category not in ("parameter", "buffer"):
            allocate(plan.wrap, [])
            wrapped = True
        if now != phase:
            phase = now
            if now == "forward" and not live_pass:
                allocate(plan.each_pass, live_pass)
            elif now == "backward" and not live_backward:
                allocate(plan.each_backward, live_backward)
            elif now in ("optimizer", "setup"):
                release(live_backward)
                release(live_pass)
        if category == "parameter_cast" and plan.working_parameters:
            continue
        if not alloc:
            out.append((handle, resized.pop(handle, size), False, category))
            continue
        if category == "parameter" and plan.working_parameters and not plan.shard_parameters:
            resized[handle] = whole(working_bytes(size))
            out.append((handle, resized[handle], True, category))
            continue
        if category == "gradient" and plan.working_parameters and not plan.shard_gradients:
            resized[handle] = whole(working_bytes(size))  # ZeRO-1: at the 16-bit parameters'
            out.append((handle, resized[handle], True, category))
            continue
        state = plan.shard_gradients or plan.shard_optimizer_state
        shard = (
            (category == "parameter" and plan.shard_parameters)
            or (category == "gradient" and plan.shard_gradients)
            or (category in ("optimizer", "paged_optimizer") and state)
            or (category == "temporary" and now == "optimizer" and state)
        )
        if not shard or size == 0:
            of_model = category in _MODEL_STATE or (category == "temporary" and now == "optimizer")
            if of_model and plan.expert_share < 1 and size:
                resized[handle] = whole(size)
                size = resized[handle]
            out.append((handle, size, True, category))
            continue
        part = shard_bytes(size, n)
        resized[handle] = part
        if category == "gradient" and plan.copy_full_gradients:
            full = next(added)
            full_bytes = whole(working_bytes(size) if plan.working_parameters else size)
            out.append((full, full_bytes, True, category))
            out.append((handle, part, True, category))
            out.append((full, full_bytes, False, category))
        else:
            out.append((handle, part, True, category))
    if rank_phases is not None:
        rank_phases.extend([phase or "setup"] * (len(out) - len(rank_phases)))
    return out


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f}"


def event_phases(
    op_indices: Sequence[int], steps: Sequence[int], op_phases: Sequence[Phase]
) -> list[Phase]:
    """The phase of each event, from the operator that made it.

    Operators are recorded for the last traced step only, and operator indices count across
    steps. An earlier step runs the same operators up to its optimizer (whose first step also
    creates the state), so its events map onto the same phases; events before any operator are
    ``setup``.
    """
    if not op_indices:
        return []
    if not op_phases:
        return ["setup"] * len(op_indices)
    last = max(steps)
    offset = max(op_indices) + 1 - len(op_phases)
    first_optimizer = next((i for i, p in enumerate(op_phases) if p == "optimizer"), len(op_phases))
    out: list[Phase] = []
    for index, step in zip(op_indices, steps, strict=True):
        if index < 0:
            out.append("setup")
        elif step != last and index >= first_optimizer:
            out.append("optimizer")
        else:
            local = index - offset if step == last else index
            out.append(op_phases[min(max(local, 0), len(op_phases) - 1)])
    return out
