"""Trace a workload at a few sizes and solve its profile as polynomials of batch and length.

See ``whichgpu.profiles.scalable`` for the model. Grid: batch sizes 2 and 3 (see ``FIRST_BATCH``)
and, for sequence models, lengths ``L/4, L/2, 3L/4`` of the default ``L`` (not ``L`` itself:
at a model's largest length, slicing position tables becomes aliasing, a different operator);
the check point is ``(4, 3L/8)``; a chunked loss rounds ``L/8`` up to a multiple of its
chunks (``workloads.hf.loss_chunk_multiple``), so that every traced length splits equally.
Inference of a language model is the same grid with the batch as the sequences served at once
and the length as the context (prompt) tokens; the generated tokens stay fixed at the run's
``new_tokens``, so the KV cache of ``L + new_tokens`` slots is linear in ``L`` and the
polynomials stay exact. A model whose operator or allocation sequence differs between grid
points, or whose check trace differs from the polynomials, raises ``ProfileNotScalable``
naming the first difference.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from whichgpu.errors import WorkloadError
from whichgpu.profiles.scalable import (
    CATEGORIES,
    FIXED_BASIS,
    SEQUENCE_BASIS,
    Polynomials,
    ScalableProfile,
    StoredOp,
    solve_polynomials,
)
from whichgpu.recipe.training import Kernels
from whichgpu.schema import RunConfig, StepProfile
from whichgpu.trace import depth
from whichgpu.trace.recorder import canonical_events
from whichgpu.trace.step import trace_step
from whichgpu.workloads.base import Workload
from whichgpu.workloads.hf import loss_chunk_multiple
from whichgpu.workloads.run_config import DEFAULT_NEW_TOKENS

FIRST_BATCH = 2
"""Smallest traced batch. A batch of one is special: tensors with a dimension of one are often
contiguous where larger batches need a copy (``reshape`` after ``transpose``), and batch norm
cannot train on one value per channel. The polynomials at ``b = 1`` keep the copies of larger
batches, so they err on the safe side there."""


class ProfileNotScalable(WorkloadError):
    """The traces at different sizes do not line up as polynomials."""


def grid(workload: Workload, run: RunConfig, first_batch: int) -> list[tuple[int, int | None]]:
    """The trace points, then the check point last."""
    b0 = first_batch
    info = workload.info
    if not info.is_sequence_model:
        return [(b0, None), (b0 + 1, None), (b0 + 2, None)]
    length = run.seq_len or info.default_seq_len or 512
    if run.mode == "inference":  # the context; a language model's cache adds the new tokens
        length = run.context or length
        if info.max_seq_len is not None:
            length = min(length, info.max_seq_len - (run.new_tokens or DEFAULT_NEW_TOKENS))
    eighth = max(8, length // 8)
    multiple = loss_chunk_multiple(run.loss_kernel) if run.mode == "train" else 1
    rounded = -(-eighth // multiple) * multiple  # every traced length splits into equal chunks
    if info.max_seq_len is None or 6 * rounded < info.max_seq_len:
        eighth = rounded
    lengths = (2 * eighth, 4 * eighth, 6 * eighth)
    points: list[tuple[int, int | None]] = [(b, s) for b in (b0, b0 + 1) for s in lengths]
    return [*points, (b0 + 2, 3 * eighth)]


def _fields(profile: StepProfile) -> tuple[list[tuple[object, ...]], list[int]]:
    """The structure (labels that must match) and the numbers (that may scale) of a trace."""
    structure: list[tuple[object, ...]] = []
    numbers: list[int] = [profile.units_per_step]
    for event in canonical_events(profile.events):
        structure.append(("e", event.op_index, event.storage, event.alloc, event.category))
        numbers.append(event.size_bytes)
    for op in profile.ops:
        shapes = (op.gemm_bmnk, op.conv, op.attention, op.norm)
        structure.append(
            (
                "o",
                op.name,
                op.kind,
                op.phase,
                op.dtype,
                *(-1 if s is None else len(s) for s in shapes),
            )
        )
        numbers += [op.flops, op.bytes_read, op.bytes_written]
        for s in shapes:
            numbers += list(s or ())
    return structure, numbers


def _describe(structure: list[tuple[object, ...]], other: list[tuple[object, ...]]) -> str:
    if len(structure) != len(other):
        return f"{len(structure)} vs {len(other)} operators and allocations"
    for i, (a, b) in enumerate(zip(structure, other, strict=True)):
        if a != b:
            return f"entry {i}: {a} vs {b}"
    return "no difference"


def trace_scalable(
    workload: Workload,
    run: RunConfig,
    *,
    kernels: Kernels = "cuda",
    progress: Callable[[str], None] | None = None,
    extend_depth: bool = True,
) -> ScalableProfile:
    """Trace ``workload`` on its grid and return its exact polynomial profile (``kernels``:
    ``trace_step``'s; ``progress`` hears which grid point is being traced). A deep model whose
    layers are alike is traced with a few of them and extended to all (``whichgpu.trace.depth``)
    unless ``extend_depth`` is False; when the extension does not hold, it is traced whole."""
    started = time.perf_counter()
    points = grid(workload, run, FIRST_BATCH)
    traces = _extended_traces(workload, run, points, kernels, progress) if extend_depth else None
    if traces is None:
        traces = []
        for i, point in enumerate(points, 1):
            if progress is not None:
                progress(f"tracing {workload.info.name} at {_where(point)} ({i} of {len(points)})")
            traces.append(
                trace_step(workload, run.model_copy(update=_size(run, point)), kernels=kernels)
            )
    fields = [_fields(t) for t in traces]
    reference = fields[0][0]
    for point, (structure, _) in zip(points, fields, strict=True):
        if structure != reference:
            raise ProfileNotScalable(
                f"{workload.info.name}: the trace at batch {point[0]}, length {point[1]} "
                f"differs in structure from the one at {points[0]}: "
                f"{_describe(reference, structure)}. whichgpu traces the step at a few sizes "
                "and needs the same operators at each: a step that depends on its data's "
                "values (a .item() or .tolist() read, a branch or loop on a tensor, a "
                "data-dependent shape such as a mask's nonzero) runs different operators; "
                "keep such code out of the model and loss (compute it from sizes, or move it "
                "outside the training step)."
            )
    basis = SEQUENCE_BASIS if workload.info.is_sequence_model else FIXED_BASIS
    solve_points = points[:-1]
    samples = list(zip(*(numbers for _, numbers in fields[:-1]), strict=True))
    polys, index = solve_polynomials(basis, solve_points, samples)
    check_b, check_s = points[-1]
    predicted = polys.values(check_b, check_s)[index]
    measured = np.array(fields[-1][1], dtype=np.int64)
    if not np.array_equal(predicted, measured):
        bad = int(np.nonzero(predicted != measured)[0][0])
        raise ProfileNotScalable(
            f"{workload.info.name}: sizes are not polynomial in batch/length — at the check "
            f"point {points[-1]} number {bad} is {int(measured[bad])}, polynomials say "
            f"{int(predicted[bad])}."
        )
    return _assemble(workload, run, traces[0], polys, index, points, started)


def _extended_traces(
    workload: Workload,
    run: RunConfig,
    points: list[tuple[int, int | None]],
    kernels: Kernels,
    progress: Callable[[str], None] | None,
) -> list[StepProfile] | None:
    """The traces of every point from a few layers (``whichgpu.trace.depth``); None when the
    model cannot be, or is not, extended that way."""
    name = workload.info.name
    try:
        plan = depth.depth_plan(workload, run)
    except depth.DepthNotExtendable:
        return None
    depths = f"{depth.DEPTHS[0]}-{depth.DEPTHS[-1]} of its {plan.layers} layers"
    traces = []
    try:
        for i, point in enumerate(points, 1):
            if progress is not None:
                progress(f"tracing {name} at {_where(point)} ({i} of {len(points)}; {depths})")
            at = run.model_copy(update=_size(run, point))
            traces.append(depth.trace_extended(workload, at, plan, kernels=kernels))
    except depth.DepthNotExtendable as exc:
        if progress is not None:
            progress(f"{exc} Tracing all {plan.layers} layers instead.")
        return None
    return traces


def _where(point: tuple[int, int | None]) -> str:
    return f"batch {point[0]}" + ("" if point[1] is None else f", length {point[1]}")


def _size(run: RunConfig, point: tuple[int, int | None]) -> dict[str, int | None]:
    """The run at a grid point. Inference: the batch is the concurrency and the length the
    context, given as ``batch_size`` and ``seq_len`` (which the tracer reads so)."""
    if run.mode == "inference":
        return {"batch_size": point[0], "seq_len": point[1], "context": None, "concurrency": 1}
    return {"batch_size": point[0], "seq_len": point[1]}


def _assemble(
    workload: Workload,
    run: RunConfig,
    trace: StepProfile,
    polys: Polynomials,
    index: list[int],
    points: list[tuple[int, int | None]],
    started: float,
) -> ScalableProfile:
    cursor = iter(index)
    units = next(cursor)
    codes = {c: i for i, c in enumerate(CATEGORIES)}
    rows = [
        (e.op_index, e.storage, int(e.alloc), codes[e.category], e.step, next(cursor))
        for e in canonical_events(trace.events)
    ]
    ops = []
    for op in trace.ops:
        flops, read, written = next(cursor), next(cursor), next(cursor)
        shapes = [
            None if s is None else tuple(next(cursor) for _ in s)
            for s in (op.gemm_bmnk, op.conv, op.attention, op.norm)
        ]
        ops.append(
            StoredOp(
                name=op.name,
                kind=op.kind,
                phase=op.phase,
                dtype=op.dtype,
                flops=flops,
                bytes_read=read,
                bytes_written=written,
                gemm_bmnk=shapes[0],
                conv=shapes[1],
                attention=shapes[2],
                norm=shapes[3],
            )
        )
    open_run = run.model_copy(update={"batch_size": None, "seq_len": None})
    if run.mode == "inference":  # the sizes stay open; the generated tokens are fixed
        open_run = open_run.model_copy(
            update={"context": None, "concurrency": 1, "new_tokens": trace.run.new_tokens}
        )
    return ScalableProfile(
        workload=workload.info.name,
        run=open_run,
        is_sequence_model=workload.info.is_sequence_model,
        throughput_unit=workload.info.throughput_unit,
        params_total=trace.params_total,
        params_trainable=trace.params_trainable,
        choices={
            **{k: v for k, v in trace.choices.items() if k != "tensors"},
            **_open_sizes(trace),
        },
        torch_version=trace.torch_version,
        polynomials=polys,
        units_per_step=units,
        events=np.array(rows, dtype=np.int64).reshape(-1, 6),
        ops=tuple(ops),
        trace_points=tuple(points[:-1]),
        check_point=points[-1],
        trace_seconds=time.perf_counter() - started,
    )


def _open_sizes(trace: StepProfile) -> dict[str, str]:
    """Choices of an inference trace that name its sizes, said for every size instead."""
    if "kv_cache" not in trace.choices:
        return {}
    new = trace.run.new_tokens
    return {
        "kv_cache": (
            f"static (transformers StaticCache), allocated whole at prefill: 2 (K, V) x layers x "
            f"kv heads x (context + {new} new tokens) x head dim x dtype bytes x sequences"
        ),
        "decode": (
            f"one step of one token per sequence over all context + {new} cache slots (masked); "
            "units_per_step counts its new tokens"
        ),
    }
