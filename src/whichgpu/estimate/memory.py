"""Peak GPU memory of a step, and the largest batch (or sequence) that fits, for any GPU.

Over 600 lines because the four steps of the method below and the largest-batch search share
the replay's memo and the stack's additions.

The method, in order:

1. The step's allocations and frees come from a ``ScalableProfile`` (stored for named
   workloads, or traced here) evaluated at the batch size and sequence length asked about.
2. The cuBLAS and cuBLASLt workspaces PyTorch allocates per (thread, stream) join them — one
   set for the forward thread, one for the autograd thread in training — with the sizes of the
   software stack (``catalog/data/v1/stacks``).
3. The stream is replayed through the model of the caching allocator
   (``whichgpu.estimate.allocator``): peak allocated and peak reserved bytes.
4. What the allocator never sees is added from the stack: the CUDA context, an allowance for
   the cuDNN workspace of convolutional models, and NCCL buffers when more than one GPU trains.
   The sum is the device total, which must not exceed the memory CUDA reports for the GPU.

The fit test uses the peak reserved bytes *without* the allocator's last-resort cache flush:
PyTorch may squeeze in a little more by flushing, but never less, so answers err on the safe
side. The largest batch is searched with that test; memory grows with the batch size, and the
search evaluates each size it needs exactly (a replay), never an extrapolation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from whichgpu.catalog.query import Catalog
from whichgpu.errors import UsageError
from whichgpu.estimate.allocator import CachingAllocator, round_request
from whichgpu.estimate.attention import AttentionExtra, step_attention_extra
from whichgpu.estimate.data_parallel import run_parallel
from whichgpu.estimate.expert_parallel import Experts
from whichgpu.estimate.paged import is_paged, memory_note, paged_out_bytes
from whichgpu.estimate.serving import kv_heads_on_one_gpu, kv_on_one_gpu, serving_estimate
from whichgpu.estimate.sharding import (
    SINGLE_GPU,
    TRACED_PARAMETER_BYTES,
    Parallel,
    ShardingPlan,
    event_phases,
    make_plan,
    rank_events,
    shard_bytes,
)
from whichgpu.profiles.scalable import CATEGORIES, ScalableProfile
from whichgpu.schema import (
    GpuSpec,
    MemoryCategory,
    MemoryEstimate,
    OpRecord,
    Phase,
    RunConfig,
    ServingEngine,
    ServingEstimate,
    SoftwareStack,
    TensorCategory,
    Vendor,
)
from whichgpu.units import GIB, MIB

MAX_BATCH_LIMIT = 65536
"""The batch search stops here (``max_batch_capped`` says so)."""
MAX_SEQ_LIMIT = 1 << 20
"""The sequence-length search stops here when the model names no position limit."""

SHORTER_SEQ_LADDER = tuple(sorted({2**k for k in range(6, 21)} | {3 * 2**k for k in range(5, 19)}))
"""The sequence lengths tried when not even one sequence fits at the asked length: powers of two
and 1.5 times them, from 64 (64, 96, 128, 192, 256, 384, 512, 768, 1024, …); the lengths
people choose, and few enough that every GPU of a software stack shares their replays."""

REPLAY_MODEL_VERSION = 2
"""Version of what ``StepMemory.replay`` returns for a given profile and key. Replays shipped
with the stored profiles (``whichgpu.estimate.replay_cache``) carry it and are ignored when it
differs: bump it with any change to ``estimate.allocator``, ``estimate.sharding``'s event
stream or ``StepMemory.replay`` that changes a result (the shipped-replays test recomputes a
sample of them, and fails on a change made without a bump), then run
``scripts/warm_replays.py``."""

ReplayKey = tuple[int, int | None, tuple[int, ...], Parallel]
"""What a replay depends on besides the profile: (batch size, sequence length, workspace
sizes, GPUs and sharding)."""

_ACTIVATION = CATEGORIES.index("activation")
_WEIGHTS = [CATEGORIES.index("parameter"), CATEGORIES.index("buffer")]

_BREAKDOWN: dict[TensorCategory, MemoryCategory] = {
    "parameter": "weights",
    "buffer": "weights",
    "gradient": "gradients",
    "optimizer": "optimizer",
    "input": "activations",
    "activation": "activations",
    "temporary": "temporaries",
    "parameter_cast": "weights",
    "paged_optimizer": "optimizer",  # never at the peak: the replay leaves it out
}
_PAGED: TensorCategory = "paged_optimizer"
_PASSES = ("forward", "backward")
"""The phases whose saved activations a compiled step keeps fewer of."""
"""Optimizer state in CUDA unified memory (``estimate.paged``): not the caching allocator's,
so the replay leaves it out."""


@dataclass(frozen=True)
class Capacity:
    """Memory a process can use on a GPU, and where that figure comes from."""

    bytes: int
    """Total CUDA reports (``cudaMemGetInfo``), bytes."""
    note: str
    """Measured (with the source) or how it was derived."""


def _memory_family(gpu: GpuSpec) -> str:
    kind = (gpu.memory_type or "").upper()
    return "HBM" if kind.startswith("HBM") else "GDDR" if kind.startswith("GDDR") else "other"


def capacity_of(gpu: GpuSpec, catalog: Catalog) -> Capacity:
    """CUDA's total for ``gpu``: catalogued, or the marketed size less the largest gap known
    among GPUs like it.

    "Like it" is the narrowest group with a measured total: the same maker, market segment and
    memory family (GDDR cards sold with ECC on lose about 6-8 % to it, GeForce cards and HBM
    parts 1-5 %), else the same maker, else any GPU. A package that appears as several
    devices (``GpuSpec.devices``) is one device's share: what one process can fill.
    """
    gpu = gpu.one_device()
    if gpu.memory_cuda_total_mib:
        prov = gpu.provenance.get("memory_cuda_total_mib")
        source = f" ({prov.source})" if prov else ""
        return Capacity(round(gpu.memory_cuda_total_mib * MIB), f"CUDA total, catalog{source}")
    if not gpu.memory_gb:
        raise UsageError(f"{gpu.name} has no memory size in the catalog; it cannot be estimated.")
    measured = [g for g in catalog.all() if g.memory_cuda_total_mib and g.memory_gb]
    family = _memory_family(gpu)
    groups = (
        (
            f"{gpu.segment.value} {family} GPUs of the same maker",
            [
                g
                for g in measured
                if g.vendor == gpu.vendor
                and g.segment == gpu.segment
                and _memory_family(g) == family
            ],
        ),
        ("GPUs of the same maker", [g for g in measured if g.vendor == gpu.vendor]),
        ("GPUs", measured),
    )
    label, like = next(((label, gs) for label, gs in groups if gs), ("", []))
    if not like:
        return Capacity(
            int(gpu.memory_gb * GIB * 0.95),
            "derived: marketed size less 5% (no GPU in the catalog has a measured total)",
        )
    gap = max(1 - (g.memory_cuda_total_mib or 0) * MIB / ((g.memory_gb or 1) * GIB) for g in like)
    how = (
        f"derived: marketed {gpu.memory_gb:g} GiB less {gap:.1%}, the largest gap between "
        f"marketed and CUDA-reported memory among {len(like)} catalogued {label}"
    )
    return Capacity(int(gpu.memory_gb * GIB * (1 - gap)), how)


@dataclass(frozen=True)
class Replay:
    """One replay of a step at one size."""

    peak_allocated_bytes: int
    """Peak of allocated block bytes."""
    peak_reserved_bytes: int
    """Peak of reserved segment bytes."""
    live_at_peak: dict[TensorCategory, int]
    """Exact tensor bytes by category when the allocated peak was reached."""
    outside_passes_peak_bytes: int | None = field(default=None, compare=False)
    """Peak of allocated block bytes outside the forward and backward passes (set-up and the
    optimizer step), where what a compiled step saves of the activations does not reach; None
    where not computed (a replay read from the shipped cache)."""


def workspace_sizes(gpu: GpuSpec, stack: SoftwareStack, mode: str) -> tuple[int, ...]:
    """The cuBLAS/cuBLASLt workspaces the allocator serves: per thread that runs GEMMs."""
    cublas = (
        stack.cublas_workspace_sm90_bytes
        if gpu.compute_capability == "9.0"
        else stack.cublas_workspace_bytes
    )
    threads = 2 if mode == "train" else 1
    return tuple(s for s in (cublas, stack.cublaslt_workspace_bytes) if s) * threads


def workspace_reserved_bytes(workspaces: tuple[int, ...]) -> int:
    """Segment bytes the allocator reserves for ``workspaces`` alone, allocated first as in a
    replay (each rounded and placed in its own segment size class)."""
    allocator = CachingAllocator()
    for i, nbytes in enumerate(workspaces):
        allocator.malloc(-1 - i, nbytes)
    return allocator.peak_reserved_bytes


ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
"""Bytes per element of a traced operator's tensors, by the dtype it recorded (a
convolution's activations, an attention call's keys and values)."""
CONTEXT_RING_CHUNKS = 4
"""Chunks of one layer's keys and values a context-parallel GPU holds beyond its own while
attention's backward runs: the chunk it works on, the next arriving, and the gradients of two
on their way (``StepMemory.context_ring_bytes``)."""


class StepMemory:
    """Replays of one profile, memoised by (batch size, sequence length, workspaces, GPUs and
    sharding); with more than one GPU each replay is of one GPU's stream
    (``whichgpu.estimate.sharding``)."""

    def __init__(
        self, profile: ScalableProfile, known: Mapping[ReplayKey, Replay] | None = None
    ) -> None:
        """``known``: replays of this very profile computed before (shipped with a stored
        profile, ``whichgpu.estimate.replay_cache``), used instead of replaying again."""
        self.profile = profile
        self._handles = profile.events[:, 1].tolist()
        self._allocs = profile.events[:, 2].astype(bool).tolist()
        self._categories = [CATEGORIES[c] for c in profile.events[:, 3].tolist()]
        self._phases = event_phases(
            profile.events[:, 0].tolist(),
            profile.events[:, 4].tolist(),
            [op.phase for op in profile.ops],
        )
        self._plans: dict[Parallel, ShardingPlan] = {}
        self._cache: dict[ReplayKey, Replay] = dict(known or {})
        self.live_replays = 0
        """Replays computed here (not memoised or known)."""
        self._max_batch: dict[tuple[int | None, tuple[int, ...], Parallel, int], tuple[int, bool]]
        self._max_batch = {}
        self._attention: dict[tuple[str | None, int, int | None, str], AttentionExtra] = {}
        self.has_convolutions = any(op.kind == "conv" for op in profile.ops)
        self._conv_ops = [
            (op.conv, ELEMENT_BYTES.get(op.dtype, 4))
            for op in profile.ops
            if op.kind == "conv" and op.conv is not None and op.phase == "forward"
        ]
        self._attention_ops = [
            op for op in profile.ops if op.kind == "attention" and op.attention is not None
        ]

    def state_sizes(self, category: TensorCategory) -> list[int]:
        """Sizes of the step's ``parameter``, ``gradient`` or ``paged_optimizer`` tensors
        allocated in its first step, in allocation order (they do not depend on the batch or
        the length)."""
        sizes = self.profile.event_sizes(1, 1 if self.profile.is_sequence_model else None)
        first = [i for i, step in enumerate(self.profile.events[:, 4].tolist()) if step == 0]
        return [int(sizes[i]) for i in first if self._allocs[i] and self._categories[i] == category]

    @cached_property
    def autocast_fp32_parameters(self) -> bool:
        """Whether the step is AMP over fp32 parameters: every parameter is 4 bytes a value and
        autocast casts them (``parameter_cast`` events)."""
        casts = CATEGORIES.index("parameter_cast")
        return (
            bool((self.profile.events[:, 3] == casts).any())
            and sum(self.state_sizes("parameter"))
            == TRACED_PARAMETER_BYTES * self.profile.params_total
        )

    def plan(self, parallel: Parallel) -> ShardingPlan:
        """What one GPU of ``parallel`` holds besides its share of the step (memoised)."""
        found = self._plans.get(parallel)
        if found is None:
            found = make_plan(
                parallel,
                self.state_sizes("parameter"),
                self.state_sizes("gradient"),
                self.profile.params_trainable,
                sixteen_bit_working=self.autocast_fp32_parameters,
            )
            self._plans[parallel] = found
        return found

    def paged_state_bytes(self, parallel: Parallel = SINGLE_GPU) -> int:
        """Optimizer state a paged optimizer keeps in unified memory on one GPU of
        ``parallel`` (split like the rest of the optimizer state where the sharding splits
        it); 0 without a paged optimizer."""
        sizes = self.state_sizes(_PAGED)
        plan = self.plan(parallel)
        if plan.shard_gradients or plan.shard_optimizer_state:
            return sum(shard_bytes(size, parallel.gpus) for size in sizes)
        return sum(sizes)

    def conv_workspace_bytes(self, batch_size: int, seq_len: int | None, percent: int) -> int:
        """The largest cuDNN workspace of the step's convolutions at this size: ``percent`` of
        the larger of a convolution's input and output bytes (``SoftwareStack.
        cudnn_workspace_percent``), which the traced stream, run on the CPU, does not hold. A
        workspace is allocated and freed around each call; the cache keeps about one largest
        block beyond the traced peak (measured: the software stack's note). 0 without
        convolutions."""
        if not self._conv_ops:
            return 0
        values = self.profile.polynomials.values(batch_size, seq_len)
        largest = 0.0
        for shape_at, element_bytes in self._conv_ops:
            shape = [int(values[i]) for i in shape_at]
            spatial = (len(shape) - 5) // 2
            batch, c_in, c_out = shape[0], shape[1], shape[2 + spatial]
            stride = max(1, shape[-2])
            sizes = shape[2 : 2 + spatial]
            x = batch * c_in * math.prod(sizes)
            y = batch * c_out * math.prod(-(-s // stride) for s in sizes)
            largest = max(largest, max(x, y) * element_bytes)
        return round(largest * percent / 100)

    def attention_extra(
        self, gpu: GpuSpec, batch_size: int, seq_len: int | None, precision: str
    ) -> AttentionExtra:
        """What the step's attention needs on ``gpu`` beyond the traced fused CPU kernels
        (``estimate.attention``): the math fallback's scores where no fused kernel takes the
        call, padding where a fused one needs it (memoised)."""
        key = (gpu.compute_capability, batch_size, seq_len, precision)
        found = self._attention.get(key)
        if found is not None:
            return found
        values = self.profile.polynomials.values(batch_size, seq_len)
        # a bf16 profile answers an fp16 run too: its attention then runs in fp16
        half = "float16" if precision == "fp16" else None
        records: dict[tuple[str, str, str, tuple[int, ...]], OpRecord] = {}
        ops = []
        for op in self._attention_ops:
            assert op.attention is not None
            call = (op.name, op.phase, op.dtype, op.attention)
            record = records.get(call)
            if record is None:  # the layers repeat the same few calls
                record = records[call] = OpRecord(
                    name=op.name,
                    kind=op.kind,
                    phase=op.phase,
                    flops=0,
                    bytes_read=0,
                    bytes_written=0,
                    dtype=half if half and op.dtype == "bfloat16" else op.dtype,
                    attention=tuple(int(values[i]) for i in op.attention),
                )
            ops.append(record)
        found = step_attention_extra(
            gpu,
            ops,
            training=self.profile.run.mode == "train",
            dropout="attention_dropout" in self.profile.choices,
        )
        self._attention[key] = found
        return found

    def context_ring_bytes(
        self, batch_size: int, seq_len: int | None, context: int, tensor: int = 1
    ) -> int:
        """What context parallel over ``context`` GPUs adds to one GPU's peak beyond its share
        of the traced step: the chunks of keys and values passing around the ring while one
        layer's attention runs. In the backward pass, the heaviest, a GPU holds the chunk it
        works on and the next one arriving, and the gradients of each chunk's keys and values
        on their way back: four chunks, each 1/``context`` of the layer's keys and values (of
        the largest attention call, at its dtype; its key/value heads split over ``tensor``
        GPUs, a whole head at least). 0 without context parallel or attention."""
        if context <= 1 or not self._attention_ops:
            return 0
        values = self.profile.polynomials.values(batch_size, seq_len)
        largest = 0
        for op in self._attention_ops:
            if op.phase != "forward" or op.attention is None:
                continue
            batch, _, kv_heads, _, kv_len, head_dim = (int(values[i]) for i in op.attention[:6])
            heads = -(-kv_heads // tensor)
            element = ELEMENT_BYTES.get(op.dtype, 4)
            largest = max(largest, 2 * batch * heads * kv_len * head_dim * element)
        return CONTEXT_RING_CHUNKS * round_request(-(-largest // context))

    def replay(
        self,
        batch_size: int,
        seq_len: int | None,
        workspaces: tuple[int, ...],
        parallel: Parallel = SINGLE_GPU,
        *,
        passes: bool = False,
    ) -> Replay:
        """Peak allocated/reserved bytes of the step at this size on one GPU of ``parallel``
        (memoised); ``passes``: also the peak outside the forward and backward passes
        (``Replay.outside_passes_peak_bytes``), replaying again where a known replay lacks
        it."""
        key = (batch_size, seq_len, workspaces, parallel)
        found = self._cache.get(key)
        if found is not None and (found.outside_passes_peak_bytes is not None or not passes):
            return found
        self.live_replays += 1
        sizes = self.profile.event_sizes(batch_size, seq_len).tolist()
        allocator = CachingAllocator()
        for i, nbytes in enumerate(workspaces):
            allocator.malloc(-1 - i, nbytes)
        phases: list[Phase] = []
        events = rank_events(
            self._handles,
            sizes,
            self._allocs,
            self._categories,
            self._phases,
            self.plan(parallel),
            phases,
        )
        # the allocator's peak is found in one pass that only remembers where it was; what was
        # live there, by category, is summed afterwards (cheaper than a copy at every new peak)
        malloc, free = allocator.malloc, allocator.free
        peak, peak_index = allocator.allocated_bytes, -1
        outside = 0
        for index, (handle, size, alloc, category) in enumerate(events):
            if size == 0 or category == _PAGED:  # unified memory: not the allocator's
                continue
            if alloc:
                malloc(handle, size)
                if allocator.allocated_bytes > peak:
                    peak, peak_index = allocator.allocated_bytes, index
                if phases[index] not in _PASSES:
                    outside = max(outside, allocator.allocated_bytes)
            else:
                free(handle)
        live: dict[TensorCategory, int] = dict.fromkeys(CATEGORIES, 0)
        for _, size, alloc, category in events[: peak_index + 1]:
            live[category] += size if alloc else -size
        at_peak = {k: v for k, v in live.items() if v and k != _PAGED}
        result = Replay(
            allocator.peak_allocated_bytes,
            allocator.peak_reserved_bytes,
            at_peak,
            outside,
        )
        self._cache[key] = result
        return result

    def replays(self) -> dict[ReplayKey, Replay]:
        """Every replay known so far, by key (a copy)."""
        return dict(self._cache)

    def max_batch(
        self,
        seq_len: int | None,
        workspaces: tuple[int, ...],
        parallel: Parallel,
        budget_bytes: int,
    ) -> tuple[int, bool]:
        """Largest batch whose peak reserved bytes fit ``budget_bytes`` (memoised; see
        ``largest_within``), and whether it is the search limit ``MAX_BATCH_LIMIT``.

        The powers of two up to the first that does not fit bracket the answer. They are the
        same sizes for every budget (replayed once), so the answer for one GPU does not depend
        on which other GPUs were asked about before it.
        """
        key = (seq_len, workspaces, parallel, budget_bytes)
        found = self._max_batch.get(key)
        if found is not None:
            return found

        def reserved(batch: int) -> int:
            return self.replay(batch, seq_len, workspaces, parallel).peak_reserved_bytes

        found = largest_batch(reserved, budget_bytes)
        self._max_batch[key] = found
        return found


_TENSOR_PARALLEL_NOTE = (
    "inference on {n} GPUs, tensor parallel (attention heads and MLP columns split, as serving "
    "engines do): each holds 1/{n} of the weights and {kv} of the {heads} KV heads' cache; "
    "activations and temporaries are counted whole on every GPU (safe side); NCCL buffers added"
)


def _tensor_parallel_note(gpus: int, kv_head_count: int) -> str:
    per_gpu = kv_heads_on_one_gpu(kv_head_count, gpus)
    share = f"1/{gpus}" if per_gpu * gpus == kv_head_count else f"{per_gpu} head(s)"
    return _TENSOR_PARALLEL_NOTE.format(n=gpus, kv=share, heads=kv_head_count)


def largest_batch(reserved: Callable[[int], int], budget_bytes: int) -> tuple[int, bool]:
    """Largest batch whose ``reserved(batch)`` fits ``budget_bytes``, and whether it is the
    search limit: the powers of two up to the first that does not fit bracket the answer (the
    same sizes for every budget), then ``largest_within`` closes in."""
    known: dict[int, int] = {}
    power = 1
    while power <= MAX_BATCH_LIMIT:
        known[power] = reserved(power)
        if known[power] > budget_bytes:
            break
        power *= 2
    return largest_within(reserved, budget_bytes, MAX_BATCH_LIMIT, known)


def tensor_parallel_saving(
    replay: Replay,
    profile: ScalableProfile,
    batch_size: int,
    seq_len: int | None,
    gpus: int,
    kv_head_count: int,
) -> int:
    """Bytes one of ``gpus`` tensor-parallel GPUs does not hold of a one-GPU inference step:
    all but 1/N of the weights at the peak, and of the KV cache all but its share of the
    ``kv_head_count`` KV heads (``serving.kv_on_one_gpu``); activations and temporaries are
    counted whole, which errs on the safe side."""
    if gpus <= 1:
        return 0
    kv = kv_cache_bytes(profile, batch_size, seq_len) or 0
    weights = replay.live_at_peak.get("parameter", 0)
    return weights * (gpus - 1) // gpus + kv - kv_on_one_gpu(kv, kv_head_count, gpus)


def outside_allocator(stack: SoftwareStack, *, gpus: int, groups: int = 1) -> dict[str, int]:
    """What the process holds outside the caching allocator, by name: the CUDA context and
    NCCL buffers when more than one GPU trains (each from ``stack``; one set per process
    group a GPU communicates in, ``groups``: data, tensor and pipeline parallel each have
    theirs). cuDNN's workspaces are served by the allocator (``StepMemory.
    conv_workspace_bytes``)."""
    outside = {"cuda_context": stack.cuda_context_bytes}
    if gpus > 1:
        outside["nccl_buffers"] = stack.nccl_bytes_per_gpu * max(1, groups)
    return outside


def largest_within(
    total_bytes: Callable[[int], int],
    budget_bytes: int,
    limit: int,
    known: Mapping[int, int] | None = None,
) -> tuple[int, bool]:
    """Largest ``n`` in ``[1, limit]`` with ``total_bytes(n) <= budget_bytes``.

    ``total_bytes`` must not decrease with ``n``; memory of a step is nearly affine in the
    batch, so the search interpolates between the tightest sizes known to fit and not to fit
    (starting from ``known``, sizes already evaluated, e.g. for another GPU), then checks the
    neighbour of each guess, which ends it in two evaluations when the guess is right. A round
    that does not halve the bracket is followed by a bisection, so a curve far from affine
    still costs O(log limit) evaluations.
    Returns ``(0, False)`` if 1 does not fit and ``(limit, True)`` if ``limit`` does.
    """
    values: dict[int, int] = dict(known or {})

    def value(n: int) -> int:
        found = values.get(n)
        if found is None:
            found = values[n] = total_bytes(n)
        return found

    if value(1) > budget_bytes:
        return 0, False
    lo = max(n for n, v in values.items() if v <= budget_bytes and n <= limit)
    above = [n for n, v in values.items() if v > budget_bytes and n > lo]
    hi = min(above) if above else None
    step = 0
    while hi is None:  # no size known not to fit: extrapolate from the two largest that do
        if lo >= limit:
            return limit, True
        below = [n for n in values if n < lo]
        if below:
            prev = max(below)
            slope = max(1.0, (value(lo) - value(prev)) / (lo - prev))
            probe = lo + int((budget_bytes - value(lo)) / slope) + 1
        else:
            probe = 2 * lo
        probe = min(limit, max(probe, lo + 2 * step, lo + 1))
        step = probe - lo
        if value(probe) <= budget_bytes:
            lo = probe
        else:
            hi = probe
    bisect = False
    while hi - lo > 1:
        width = hi - lo
        if bisect or value(hi) == value(lo):
            guess = (lo + hi) // 2
        else:
            share = (budget_bytes - value(lo)) / (value(hi) - value(lo))
            guess = min(hi - 1, max(lo + 1, lo + int(share * width)))
        if value(guess) <= budget_bytes:
            lo = guess
            if not bisect and lo + 1 < hi and value(lo + 1) > budget_bytes:
                hi = lo + 1
        else:
            hi = guess
            if not bisect and hi - 1 > lo and value(hi - 1) <= budget_bytes:
                lo = hi - 1
        bisect = not bisect and 2 * (hi - lo) > width
    return lo, False


def largest_live_batch(profile: ScalableProfile, limit_bytes: int, seq_len: int | None) -> int:
    """The largest batch whose traced live tensors (``live_peak_bytes``) stay within
    ``limit_bytes``, 0 if even 1 does not: what a run holds where no caching allocator
    stands between the tensors and the limit (the CPU under ``--memory-limit``)."""
    return largest_within(
        lambda batch: profile.live_peak_bytes(batch, seq_len), limit_bytes, MAX_BATCH_LIMIT
    )[0]


def longest_live_seq(
    profile: ScalableProfile, limit_bytes: int, batch_size: int, upper: int
) -> int:
    """The longest sequence up to ``upper`` whose traced live tensors at ``batch_size`` stay
    within ``limit_bytes``, 0 if even 1 token does not (see ``largest_live_batch``)."""
    return largest_within(
        lambda length: profile.live_peak_bytes(batch_size, length), limit_bytes, upper
    )[0]


def estimate_on_gpu(
    memory: StepMemory,
    run: RunConfig,
    gpu: GpuSpec,
    catalog: Catalog,
    stack: SoftwareStack,
    *,
    method: str,
    seq_limit: int | None = None,
    search_seq_len: bool = True,
    shorter_seq_when_unfit: bool = False,
    kv_per_token_bytes: int | None = None,
    kv_head_count: int | None = None,
    serving: ServingEngine | None = None,
    compiled_saving: Callable[[int, int | None], int] | None = None,
    experts: Experts | None = None,
    quantized: tuple[int, str] | None = None,
) -> MemoryEstimate:
    """The memory estimate of ``memory``'s step on ``gpu``.

    ``run.batch_size`` set: the figures are for that batch, and the largest batch is reported
    beside them, and for a sequence model the largest sequence length at that batch (searched
    up to ``seq_limit``, the model's position limit; skipped with ``search_seq_len=False``).
    Unset: the largest batch that fits is the headline (or 1 if none fits).

    ``run.gpus`` > 1: every figure is for one of the GPUs training together, each with its own
    batch, under ``run.sharding`` (``whichgpu.estimate.sharding``); under expert parallel
    ``experts`` are the model's routed experts, which each GPU holds 1/E of and whose tokens
    it sends out and takes in (``estimate.expert_parallel``).

    ``shorter_seq_when_unfit``: when not even batch 1 fits at a sequence model's length, the
    longest shorter length of ``SHORTER_SEQ_LADDER`` that does (``fits_at_seq_len``).

    Inference of a language model (a profile with a KV cache): the batch is the concurrency
    and ``seq_len`` the context; ``kv_per_token_bytes`` (from the model config) is reported,
    and ``serving`` adds that engine's paged-KV-cache answer (``estimate.serving``). With
    ``run.gpus`` > 1 the model is served tensor parallel and ``kv_head_count`` (the model's KV
    heads) says how its cache splits. ``quantized`` (compiled decoding of quantized weights):
    the bytes one GPU's weights hold less than in the serving dtype, and the format in words;
    the traced request holds them in 16 bits.
    """
    profile = memory.profile
    seq_len = run.seq_len if profile.is_sequence_model else None
    if profile.is_sequence_model and seq_len is None:
        raise UsageError("A sequence length is needed for this workload (--seq-len).")
    capacity = capacity_of(gpu, catalog)
    workspaces = workspace_sizes(gpu, stack, run.mode)
    groups = sum(
        n > 1
        for n in (
            run.data_parallel(),
            run.tensor_parallel,
            run.pipeline_parallel,
            run.context_parallel,
        )
    )
    outside = outside_allocator(stack, gpus=run.gpus, groups=groups)
    outside_bytes = sum(outside.values())
    tensor = run.mode == "inference" and run.gpus > 1
    expert_fraction = 0.0
    if experts is not None and run.expert_parallel > 1:
        expert_fraction = experts.fraction(profile.params_total)
    parallel = SINGLE_GPU if tensor else run_parallel(run, expert_fraction=expert_fraction)
    heads = kv_head_count or 1
    compiled = compiled_saving is not None and not parallel.model_parallel
    if tensor and kv_head_count is None:
        raise ValueError("tensor-parallel inference needs the model's KV heads (kv_head_count)")

    def kv_here(kv_bytes: int) -> int:
        """What this GPU holds of a KV cache (or of its bytes per token)."""
        return kv_on_one_gpu(kv_bytes, heads, run.gpus) if tensor else kv_bytes

    def saving(replay: Replay, batch: int, length: int | None) -> int:
        if not tensor:
            return 0
        return tensor_parallel_saving(replay, profile, batch, length, run.gpus, heads)

    def replay_at(batch: int, length: int | None) -> Replay:
        return memory.replay(batch, length, workspaces, parallel, passes=compiled)

    def compiled_cut(replay: Replay, batch: int, length: int | None) -> int:
        """What a compiled step leaves out of the peak: the activations it does not save, as
        far as the peak is in the forward and backward passes (never below the peak of the
        set-up and the optimizer step, which compilation leaves as it is)."""
        if not compiled or compiled_saving is None or replay.outside_passes_peak_bytes is None:
            return 0
        room = replay.peak_allocated_bytes - replay.outside_passes_peak_bytes
        return max(0, min(compiled_saving(batch, length), room))

    def ring_bytes(batch: int, length: int | None) -> int:
        return memory.context_ring_bytes(batch, length, run.context_parallel, run.tensor_parallel)

    def dispatch_bytes(batch: int, length: int | None) -> int:
        """Expert parallel: the buffer of this GPU's tokens on their way to their experts,
        beside the traced step's own (one layer's, while it runs)."""
        if expert_fraction == 0 or experts is None:
            return 0
        tokens = batch * (length or 1) // run.context_parallel
        return round_request(tokens * experts.dispatch_bytes_per_token())

    def attention_bytes(batch: int, length: int | None = seq_len) -> int:
        extra = memory.attention_extra(gpu, batch, length, run.precision).total_bytes
        return extra + ring_bytes(batch, length) + dispatch_bytes(batch, length)

    budget = capacity.bytes - outside_bytes
    smaller_weights = 0 if quantized is None else quantized[0]

    def reserved_at(batch: int, length: int | None = seq_len) -> int:
        """Peak reserved bytes on one GPU (of N tensor-parallel ones for inference), with what
        the GPU's attention kernels need beyond the traced step, and cuDNN's largest
        convolution workspace as far as the card has room for it: where it has none, PyTorch
        retries the convolution with an algorithm that needs less (``Conv_v7.cpp``), so a
        workspace never decides whether a batch fits."""
        replay = replay_at(batch, length)
        needed = (
            replay.peak_reserved_bytes
            - saving(replay, batch, length)
            - compiled_cut(replay, batch, length)
            - smaller_weights
            + attention_bytes(batch, length)
        )
        workspace = memory.conv_workspace_bytes(batch, length, stack.cudnn_workspace_percent)
        return needed + min(workspace, max(0, budget - needed))

    def device_total(batch: int) -> int:
        return reserved_at(batch) + outside_bytes

    # the extra does not depend on the batch's being zero or not, only on the GPU and length
    attention_differs = attention_bytes(1) > 0
    # cuDNN's workspace takes only the room a batch leaves (``reserved_at``), so it never moves
    # the largest batch: the memoised search over the replays answers for convolutions too
    if tensor or attention_differs or compiled:
        max_batch, capped = largest_batch(reserved_at, budget)
    else:  # what the quantized weights hold less leaves the same room at every batch
        max_batch, capped = memory.max_batch(
            seq_len, workspaces, parallel, budget + smaller_weights
        )
    batch = run.batch_size or max(max_batch, 1)
    replay = replay_at(batch, seq_len)
    cut = compiled_cut(replay, batch, seq_len)
    total = reserved_at(batch) + outside_bytes
    breakdown: dict[MemoryCategory, int] = dict.fromkeys(
        ("weights", "gradients", "optimizer", "activations", "temporaries"), 0
    )
    for category, nbytes in replay.live_at_peak.items():
        breakdown[_BREAKDOWN[category]] += nbytes
    if tensor:  # each GPU holds 1/N of the weights and its share of the KV cache (activation)
        n = run.gpus
        kv_total = kv_cache_bytes(profile, batch, seq_len) or 0
        breakdown["weights"] -= replay.live_at_peak.get("parameter", 0) * (n - 1) // n
        breakdown["activations"] -= kv_total - kv_here(kv_total)
    breakdown["activations"] -= cut
    breakdown["weights"] -= smaller_weights
    breakdown["overhead"] = total - sum(breakdown.values())
    attention = memory.attention_extra(gpu, batch, seq_len, run.precision)
    overheads = {
        **outside,
        "cublas_workspaces": sum(round_request(w) for w in workspaces),
        "allocator_rounding_and_cache": replay.peak_reserved_bytes
        - sum(replay.live_at_peak.values())
        - sum(round_request(w) for w in workspaces),
        **({"attention_kernels": attention.total_bytes} if attention.total_bytes else {}),
    }
    ring = ring_bytes(batch, seq_len)
    if ring:
        overheads["context_parallel_ring"] = ring
    dispatch = dispatch_bytes(batch, seq_len)
    if dispatch:
        overheads["expert_parallel_dispatch"] = dispatch
    attention_note: tuple[str, ...] = ()
    if attention.total_bytes:
        attention_note = (
            f"attention runs on {', '.join(attention.backends)} on this GPU "
            f"({attention.reason}): {attention.total_bytes / 2**30:.2f} GiB beyond the traced "
            "fused kernel are counted (the math fallback's scores and probabilities, or a "
            "fused kernel's padding)",
        )
    if ring:
        attention_note += (
            f"context parallel: {ring / 2**30:.2f} GiB of keys and values passing around the "
            f"ring are counted ({CONTEXT_RING_CHUNKS} chunks of one layer's, each 1/"
            f"{run.context_parallel} of the sequence's, while attention's backward runs)",
        )
    next_total = None if capped or max_batch == 0 else device_total(max_batch + 1)
    # a paged optimizer's state lives in unified memory beside all this (estimate.paged)
    paged_state = memory.paged_state_bytes(parallel) if is_paged(run) else 0
    paged_out = paged_out_bytes(paged_state, capacity.bytes - total)
    paged_note = (memory_note(paged_state, paged_out),) if is_paged(run) else ()
    shorter: int | None = None
    # only where not even one sample (one sequence) fits: when a larger asked batch does not,
    # the answer is the largest batch and the longest length at that batch, not this ladder
    if shorter_seq_when_unfit and seq_len is not None and max_batch == 0:
        shorter = _longest_on_ladder(
            lambda length: reserved_at(1, length) + outside_bytes, capacity.bytes, seq_len
        )
    max_seq: tuple[int, bool] | None = None
    if search_seq_len and seq_len is not None and run.batch_size is not None:

        def length_total(length: int) -> int:
            return reserved_at(batch, length) + outside_bytes

        known = {seq_len: total}
        if shorter is not None and batch == 1:  # a length the ladder found to fit
            known[shorter] = length_total(shorter)
        max_seq = largest_within(length_total, capacity.bytes, seq_limit or MAX_SEQ_LIMIT, known)
    kv_bytes = kv_cache_bytes(profile, batch, seq_len)
    served = None
    if serving is not None:
        if kv_bytes is None or kv_per_token_bytes is None or seq_len is None:
            raise UsageError("--serving answers inference of a language model only.")
        served = _serving(
            memory,
            serving,
            stack,
            capacity.bytes,
            workspaces,
            kv_here(kv_per_token_bytes),
            seq_len,
            run.gpus,
            new_tokens=run.new_tokens,
            gpu_name=gpu.name,
        )
    return MemoryEstimate(
        gpu=gpu.id,
        gpu_name=gpu.name,
        workload=profile.workload,
        run=run.model_copy(update={"batch_size": batch, "seq_len": seq_len}),
        batch_size=batch,
        seq_len=seq_len,
        fits=total <= capacity.bytes,
        max_batch_size=max_batch,
        max_batch_capped=capped,
        batch_given=run.batch_size is not None,
        gpus=run.gpus,
        sharding=run.sharding,
        max_seq_len=max_seq[0] if max_seq else None,
        max_seq_len_capped=max_seq[1] if max_seq else False,
        fits_at_seq_len=shorter,
        peak_allocated_bytes=replay.peak_allocated_bytes
        - saving(replay, batch, seq_len)
        - cut
        - smaller_weights,
        peak_reserved_bytes=total - outside_bytes,
        device_total_bytes=total,
        capacity_bytes=capacity.bytes,
        capacity_note=capacity.note,
        headroom_bytes=capacity.bytes - total,
        next_batch_device_total_bytes=next_total,
        breakdown=breakdown,
        overheads=overheads,
        assumptions=_device_caveat(gpu)
        + _assumptions(stack, memory, parallel)
        + attention_note
        + paged_note
        + (_tensor_parallel_note(run.gpus, heads),) * tensor
        + _compiled_note(compiled_saving is not None, compiled, cut, batch, run.checkpointing)
        + _quantized_note(quantized),
        method=method,
        kv_cache_bytes=None if kv_bytes is None else kv_here(kv_bytes),
        kv_bytes_per_token=(
            kv_here(kv_per_token_bytes)
            if kv_bytes is not None and kv_per_token_bytes is not None
            else None
        ),
        serving=served,
        paged_state_bytes=paged_state,
        paged_out_bytes=paged_out,
        experts_per_layer=None if experts is None else experts.experts,
    )


def _quantized_note(quantized: tuple[int, str] | None) -> tuple[str, ...]:
    """What the estimate assumed of quantized weights (nothing where there are none)."""
    if quantized is None:
        return ()
    smaller, label = quantized
    return (
        f"weights stored as {label}: {smaller / GIB:.2f} GiB less than the traced 16-bit "
        "request holds (the linear layers' weights with their scales and zero points; the "
        "embeddings, head and norms stay 16-bit), quantized before they reach the GPU (a "
        "quantized checkpoint, or quantized on the CPU: quantizing on the GPU first needs "
        "room for the 16-bit model)",
    )


def _compiled_note(
    asked: bool, applied: bool, cut: int, batch: int, checkpointed: bool
) -> tuple[str, ...]:
    """What the estimate assumed of ``torch.compile`` (nothing when it was not asked)."""
    if not asked:
        return ()
    if not applied:
        return (
            "torch.compile: its saving is not applied where a micro-batch is split over GPUs "
            "(tensor, pipeline or context parallel): the eager step's memory is given (more "
            "than a compiled step needs)",
        )
    regions = (
        "; inside the checkpointed layers it keeps what their policy keeps, as eager "
        "checkpointing does (torch.utils.checkpoint tags their operators for the partitioner), "
        "and the eager recomputation's transient peak is kept (a compiled one is smaller)"
        if checkpointed
        else ""
    )
    return (
        f"torch.compile: {cut / GIB:.2f} GiB of activations at batch {batch} left out of "
        "the forward and backward passes' peak: what inductor's partitioner "
        "(min_cut_rematerialization_partition) recomputes in the backward instead of saving, "
        "from AOTAutograd's joint graph of the step on fake tensors (bf16 AMP's for fp8)"
        f"{regions}; the set-up's and the optimizer step's peak as eager's, the allocator's "
        "cache as eager's",
    )


def _longest_on_ladder(total_bytes: Callable[[int], int], budget_bytes: int, below: int) -> int:
    """The longest length of ``SHORTER_SEQ_LADDER`` under ``below`` with ``total_bytes`` within
    ``budget_bytes`` (bisection over the ladder; memory grows with the length), 0 if none."""
    ladder = [n for n in SHORTER_SEQ_LADDER if n < below]
    lo, hi = -1, len(ladder)  # ladder[lo] fits (-1: none known), ladder[hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if total_bytes(ladder[mid]) <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return ladder[lo] if lo >= 0 else 0


def kv_cache_bytes(profile: ScalableProfile, batch_size: int, seq_len: int | None) -> int | None:
    """The static KV cache of an inference profile of a language model at this size (the
    tensors that outlive the request's steps, category ``activation``); None for others."""
    if "kv_cache" not in profile.choices:
        return None
    events = profile.events
    cache = (events[:, 2] == 1) & (events[:, 3] == _ACTIVATION) & (events[:, 4] == 1)
    return int(profile.event_sizes(batch_size, seq_len)[cache].sum())


def weights_bytes(profile: ScalableProfile) -> int:
    """Parameters and buffers of a profile (allocated once, before the steps)."""
    events = profile.events
    weights = (events[:, 2] == 1) & np.isin(events[:, 3], _WEIGHTS)
    return int(profile.event_sizes(1, None)[weights].sum())


def _serving(
    memory: StepMemory,
    engine: ServingEngine,
    stack: SoftwareStack,
    capacity_bytes: int,
    workspaces: tuple[int, ...],
    kv_per_token_bytes: int,
    context: int,
    gpus: int,
    *,
    new_tokens: int | None = None,
    gpu_name: str = "",
) -> ServingEstimate:
    """The engine's answer on one of ``gpus`` tensor-parallel GPUs (``kv_per_token_bytes``
    is that GPU's share); its profiling pass is the traced prefill of one sequence of
    ``engine.profile_tokens`` tokens (its own KV cache taken out again), counted whole. Each
    sequence holds ``context + new_tokens`` tokens of KV (the run's new tokens; None: the
    profile's): prefill-only requests (``new_tokens`` 0) their prompt's alone."""
    profile = memory.profile
    engine = engine.on_gpu(capacity_bytes / 2**30, gpu_name, gpus)  # that GPU's defaults
    tokens = engine.profile_tokens
    weights = weights_bytes(profile)
    pass_peak = memory.replay(1, tokens, workspaces).peak_allocated_bytes
    activation = pass_peak - weights - (kv_cache_bytes(profile, 1, tokens) or 0)
    return serving_estimate(
        engine,
        stack,
        capacity_bytes=capacity_bytes,
        weights_bytes=-(-weights // gpus),
        activation_peak_bytes=activation,
        kv_per_token_bytes=kv_per_token_bytes,
        tokens_per_sequence=context
        + (new_tokens if new_tokens is not None else (profile.run.new_tokens or 0)),
        gpus=gpus,
    )


_DEVICE_CAVEATS: dict[Vendor, str] = {
    Vendor.AMD: (
        "ROCm GPU sized with the CUDA model: PyTorch's HIP allocator is its CUDA caching "
        "allocator, but the HIP context, the rocBLAS/hipBLASLt and MIOpen workspaces are taken "
        "to be the CUDA stack's (not measured on ROCm)"
    ),
    Vendor.APPLE: (
        "Apple silicon sized as if it were a CUDA GPU of its memory, which it is not: MPS has "
        "no caching allocator like CUDA's, and the GPU shares that memory with the CPU and "
        "macOS, which lets it use only part of it (recommendedMaxWorkingSetSize): a rough "
        "guide only"
    ),
    Vendor.INTEL: (
        "Intel GPU sized with the CUDA model: PyTorch's XPU allocator follows the CUDA "
        "caching allocator, but the runtime's and oneDNN's memory are taken to be the CUDA "
        "stack's (not measured on XPU)"
    ),
    Vendor.GOOGLE: (
        "TPU sized as if it ran PyTorch's CUDA caching allocator, which it does not: XLA plans "
        "a step's memory when it compiles it (and may rematerialise activations), so this is a "
        "rough guide only"
    ),
}
"""What a memory estimate of a GPU that is not NVIDIA's assumes, by maker: the allocator model
and the overheads are those of PyTorch on CUDA."""


def _device_caveat(gpu: GpuSpec) -> tuple[str, ...]:
    caveat = _DEVICE_CAVEATS.get(gpu.vendor)
    notes = (caveat,) if caveat else ()
    return notes + split_package_note(gpu)


def split_package_note(gpu: GpuSpec) -> tuple[str, ...]:
    """What an answer about a package of several devices (an MI250X) says it is about: one of
    them, as one process sees it."""
    n = gpu.devices or 1
    if n == 1:
        return ()
    one = gpu.one_device()
    return (
        f"{gpu.name} appears to PyTorch as {n} devices of {one.memory_gb:g} GB each: the "
        f"answer is for one of them, as one process runs on it (--gpus {n} uses the whole "
        "package)",
    )


def _assumptions(stack: SoftwareStack, memory: StepMemory, parallel: Parallel) -> tuple[str, ...]:
    out = [
        f"software stack: {stack.label}",
        f"one {'training' if memory.profile.run.mode == 'train' else 'inference'} process on "
        "the GPU, nothing else resident",
        "PyTorch caching allocator with default settings; its last-resort cache flush is not "
        "counted on",
    ]
    if "kv_cache" in memory.profile.choices:
        run = memory.profile.run
        weights = "fp32" if run.precision in ("fp32", "tf32") else "the half dtype"
        out += [
            f"plain PyTorch / transformers generation: weights in {weights} ({run.precision}, "
            "no fp32 master copy), greedy sampling, one process serving `batch` sequences",
            "the whole context prefilled in one forward pass (no chunked prefill), logits of "
            "the last position only",
            f"static KV cache (transformers StaticCache) allocated whole at the prefill for "
            f"context + {run.new_tokens} new tokens per sequence, in the weights' dtype; then "
            "one decode step over it",
        ]
    if "fp8" in memory.profile.choices:  # the recipe (estimate.fp8)
        out.append(
            memory.profile.choices["fp8"]
            + "; autocast's 16-bit weight copies of the converted layers are fp8 copies"
        )
    attention = memory.profile.choices.get("attention", "")
    if "sdpa" in attention:
        out.append(
            "attention through a fused SDPA kernel (flash or memory-efficient), which does not "
            "keep the score matrix"
        )
    dropout = memory.profile.choices.get("attention_dropout")
    if dropout:
        out.append(f"attention dropout {dropout}")
    if memory.has_convolutions:
        out.append(
            f"cuDNN's convolution workspaces: the largest, {stack.cudnn_workspace_percent} % of "
            "its convolution's larger activation (measured on an H200), added to the peak "
            "reserved bytes, as the allocator's cache keeps about one beyond the traced step. "
            "With torch.backends.cudnn.benchmark on, the first steps try algorithms with "
            "workspaces as large as free memory allows, so a large card's max_memory_reserved "
            "reads higher (ResNet-50 fp32, batch 64, H200: 10.4 GiB against 6.6 estimated); on "
            "a small card cuDNN leaves out what does not fit"
        )
    if memory.profile.run.mode == "train":
        out.append(
            "the model's output (a language model's logits) held until the optimizer step has "
            "run, as a loop that keeps `outputs = model(**batch)` does; the Hugging Face Trainer "
            "frees it after the forward pass, and needs that much less"
        )
    if parallel.gpus > 1 or parallel.model_parallel:
        out += memory.plan(parallel).assumptions
        out.append(
            f"NCCL buffers of {stack.nccl_bytes_per_gpu // MIB} MiB per GPU for each process "
            "group it communicates in (an estimate)"
        )
    return tuple(out)
