"""Trace a deep model with a few of its layers and extend its step to the full depth.

A transformer whose N layers are alike repeats itself in its traced step, so tracing all N
layers at each grid size takes minutes and tells nothing new. This module traces such a
model with 4, 5 and 6 of its layers (``DEPTHS``), lines up the 4- and 5-layer traces, writes
the step for N layers and checks the rule exactly against the 6-layer trace; anything else
raises ``DepthNotExtendable`` and the caller traces the model whole.

The method and its limits: docs/workloads.md, "Deep models: traced with a few layers".
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from whichgpu.errors import WorkloadError
from whichgpu.recipe.training import Kernels
from whichgpu.schema import AllocEvent, OpRecord, RunConfig, StepProfile
from whichgpu.trace.recorder import canonical_events
from whichgpu.trace.step import trace_step
from whichgpu.workloads.base import Workload

DEPTHS = (4, 5, 6)
"""Layers traced: the rule is learned from the first two and checked on the third."""
MIN_LAYERS = 32
"""Fewer layers than this are traced whole: the three small traces would not save time."""
ALIGN_CALLS_MAX = 20_000
"""Search budget of a line-up (differences resolved, choices retried); a model that needs more
is traced whole."""


class DepthNotExtendable(WorkloadError):
    """The model's layers differ, or its traces at ``DEPTHS`` layers do not follow one rule."""


@dataclass(frozen=True)
class DepthPlan:
    """A model that can be traced at small depth and extended."""

    layers: int
    """Its full number of layers."""
    params_total: int
    """Parameters of the full model (before any fine-tuning method), the extension's check."""


def depth_plan(workload: Workload, run: RunConfig) -> DepthPlan:
    """Whether ``workload`` can be traced at small depth for ``run``; raises
    ``DepthNotExtendable`` saying why not."""
    layers = workload.layers
    if workload.build_with_layers is None or layers is None:
        raise DepthNotExtendable(f"{workload.info.name} has no layer count to vary.")
    if layers < MIN_LAYERS:
        raise DepthNotExtendable(f"{workload.info.name} has only {layers} layers.")
    from transformers.initialization import no_init_weights

    try:
        with torch.device("meta"), no_init_weights():
            model = workload.build_with_layers(run, layers).model
    except Exception as exc:  # the whole trace will say what is wrong, if anything
        raise DepthNotExtendable(f"{workload.info.name} could not be built on meta: {exc}") from exc
    problem = _unlike_layers(model, layers)
    if problem is not None:
        raise DepthNotExtendable(f"{workload.info.name}: {problem}")
    return DepthPlan(layers=layers, params_total=sum(p.numel() for p in model.parameters()))


def trace_extended(
    workload: Workload, run: RunConfig, plan: DepthPlan, *, kernels: Kernels = "cuda"
) -> StepProfile:
    """The step of ``workload`` with all ``plan.layers`` layers, from traces of ``DEPTHS``."""
    small, larger, check = (
        trace_step(workload, run, kernels=kernels, layers=depth) for depth in DEPTHS
    )
    _same_apart_from_depth(small, larger, check)
    rule = DepthRule.learn(small, larger)
    written = rule.write(DEPTHS[2])
    difference = _first_difference(written, check)
    if difference is not None:
        raise DepthNotExtendable(
            f"{workload.info.name}: the {DEPTHS[2]}-layer trace does not follow the rule of "
            f"the {DEPTHS[0]}- and {DEPTHS[1]}-layer traces ({difference})."
        )
    full = rule.write(plan.layers)
    if run.method == "full" and full.params_total != plan.params_total:
        raise DepthNotExtendable(
            f"{workload.info.name}: {full.params_total:,} parameters extended, the model has "
            f"{plan.params_total:,}."
        )
    seconds = small.trace_seconds + larger.trace_seconds + check.trace_seconds
    return full.model_copy(
        update={
            "choices": {
                **full.choices,
                "layers": (
                    f"traced with {DEPTHS[0]}, {DEPTHS[1]} and {DEPTHS[2]} of its "
                    f"{plan.layers} layers, which are alike, and extended to {plan.layers} "
                    f"(the extension reproduces the {DEPTHS[2]}-layer trace exactly)"
                ),
            },
            "trace_seconds": seconds,
        }
    )


# --- the layers are alike ---------------------------------------------------------------


def _unlike_layers(model: torch.nn.Module, layers: int) -> str | None:
    """Why the model's ``layers`` layers are not alike, or None when they are."""
    types = getattr(getattr(model, "config", None), "layer_types", None)
    if isinstance(types, list | tuple) and len(set(types)) > 1:
        return f"its layers are of {len(set(types))} types ({', '.join(sorted(set(types)))})."
    stack = next(
        (
            m
            for m in model.modules()
            if isinstance(m, torch.nn.ModuleList | torch.nn.Sequential) and len(m) == layers
        ),
        None,
    )
    if stack is None:
        return f"no stack of {layers} layers among its modules."
    first = _signature(stack[0], 0)
    for index, layer in enumerate(stack):
        if _signature(layer, index) != first:
            return f"layer {index} differs from layer 0."
    return None


def _signature(layer: torch.nn.Module, index: int) -> list[tuple[Any, ...]]:
    """What makes a layer compute what it does: its modules' types, parameter and buffer
    shapes, and plain settings, with the attributes that hold its own index left out."""
    out: list[tuple[Any, ...]] = []
    for name, module in layer.named_modules():
        out.append((name, type(module).__qualname__))
        for key, p in module.named_parameters(recurse=False):
            out.append((name, key, tuple(p.shape), str(p.dtype), p.requires_grad))
        for key, b in module.named_buffers(recurse=False):
            out.append((name, key, tuple(b.shape), str(b.dtype)))
        for key, value in sorted(vars(module).items()):
            if key.startswith("_") or key == "training" or not _plain(value):
                continue
            if isinstance(value, int) and value == index and _names_an_index(key):
                continue
            out.append((name, key, value))
    return out


def _plain(value: object) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    return False


def _names_an_index(key: str) -> bool:
    return "idx" in key or "index" in key or key.startswith("layer")


# --- the rule ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    """An operator or event of a trace, as the line-up sees it."""

    key: tuple[Any, ...]
    """Labels and numbers: what lined-up entries share."""
    period: tuple[Any, ...]
    """What an inserted copy shares with the entries a block and two blocks beside it: the
    key, but for how far back a free's storage was made (one layer further each copy)."""
    loose: tuple[Any, ...]
    """What an entry whose numbers change with depth keeps: an operator's labels, an event's
    labels and size."""
    numbers: tuple[int, ...]
    """The numbers the rule extends."""


def _op_entries(profile: StepProfile) -> list[_Entry]:
    out = []
    for op in profile.ops:
        shapes = (op.gemm_bmnk, op.conv, op.attention, op.norm)
        loose = (
            op.name,
            op.kind,
            op.phase,
            op.dtype,
            *(-1 if s is None else len(s) for s in shapes),
        )
        numbers = (
            op.flops,
            op.bytes_read,
            op.bytes_written,
            *(n for s in shapes for n in (s or ())),
        )
        key = (*loose, *numbers)
        out.append(_Entry(key=key, period=key, loose=loose, numbers=numbers))
    return out


def _event_entries(profile: StepProfile) -> list[_Entry]:
    """Events with relative numbers: operators since the previous event, and for a free how
    many allocations back its storage was made (storages are numbered in allocation order)."""
    out = []
    allocations = 0
    previous_op = -1
    for event in canonical_events(profile.events):
        labels = (event.alloc, event.category, event.step)
        if event.alloc:
            if event.storage != allocations:
                raise DepthNotExtendable("storages are not numbered in allocation order.")
            back = 0
            allocations += 1
        else:
            back = allocations - event.storage
        numbers = (event.size_bytes, event.op_index - previous_op, back)
        previous_op = event.op_index
        out.append(
            _Entry(
                key=(*labels, *numbers),
                period=(*labels, *numbers[:2]),
                loose=(*labels, event.size_bytes),
                numbers=numbers,
            )
        )
    return out


@dataclass(frozen=True)
class _Step:
    """One step of a line-up: ``same`` (entry ``i`` of the small trace is entry ``j`` of the
    larger), or a block of ``k`` entries the larger trace inserts at ``j``, a copy of the block
    ``before`` it or ``after`` it (a run of frees sorted by storage puts the new layer's first)."""

    kind: Literal["same", "before", "after"]
    i: int
    j: int
    k: int = 1


class _LineUp:
    """How the larger trace is the small one with blocks inserted: a depth-first search,
    trying at each difference a copy of the block before, of the block after, then an entry
    whose numbers change with depth."""

    def __init__(self, small: Sequence[_Entry], larger: Sequence[_Entry]) -> None:
        self.small = small
        self.larger = larger

    def solve(self) -> list[_Step]:
        a, b = self.small, self.larger
        steps: list[_Step] = []
        choices: list[tuple[int, Iterator[tuple[list[_Step], int, int, int]]]] = []
        i = j = aligned_from = 0
        for _ in range(ALIGN_CALLS_MAX):
            while i < len(a) and j < len(b) and a[i].key == b[j].key:
                steps.append(_Step("same", i, j))
                i += 1
                j += 1
            if i == len(a) and j == len(b):
                return steps
            choices.append((len(steps), self._options(i, j, aligned_from)))
            while choices:
                mark, options = choices[-1]
                del steps[mark:]
                option = next(options, None)
                if option is not None:
                    taken, i, j, aligned_from = option
                    steps += taken
                    break
                choices.pop()
            else:
                raise DepthNotExtendable(
                    f"the traces at {DEPTHS[0]} and {DEPTHS[1]} layers do not line up as "
                    "inserted copies of a layer."
                )
        raise DepthNotExtendable("the line-up of the traces took too many steps.")

    def _options(
        self, i: int, j: int, aligned_from: int
    ) -> Iterator[tuple[list[_Step], int, int, int]]:
        """Ways to go on from a difference at ``small[i]``, ``larger[j]``, most likely first;
        ``larger[aligned_from:j]`` are lined up (a block can copy only lined-up entries).

        Longer blocks are tried first: the block inserted is a whole layer's, and a shorter
        run that repeats inside a layer (the same optimizer update of two alike parameters,
        Adafactor's per-parameter loop) can pass for a copy and line up the rest wrongly."""
        a, b = self.small, self.larger
        extra = (len(b) - j) - (len(a) - i)
        for k in range(min(extra, j - aligned_from, j // 2), 0, -1):
            if all(_progression(b[j + t], b[j - k + t], b[j - 2 * k + t]) for t in range(k)):
                yield [_Step("before", i, j, k)], i, j + k, j + k
        for k in range(min(extra, len(a) - i, (len(b) - j) // 3), 0, -1):
            if all(
                _progression(b[j + t], b[j + k + t], b[j + 2 * k + t])
                and b[j + k + t].key == a[i + t].key
                for t in range(k)
            ):
                same = [_Step("same", i + t, j + k + t) for t in range(k)]
                yield [_Step("after", i, j, k), *same], i + k, j + 2 * k, j + k
        if i < len(a) and j < len(b) and a[i].loose == b[j].loose:
            yield [_Step("same", i, j)], i + 1, j + 1, aligned_from


def _progression(copy: _Entry, next_one: _Entry, second: _Entry) -> bool:
    """Whether an entry of an inserted copy, of the block next to it and of the block next to
    that one are alike, their numbers advancing by the same step: the copies of a layer go on
    as the layers before them (a block next to the first or last layer, which can differ from
    the rest, is never copied)."""
    return copy.period == next_one.period == second.period and all(
        x - y == y - z
        for x, y, z in zip(copy.numbers, next_one.numbers, second.numbers, strict=True)
    )


@dataclass(frozen=True)
class _StreamRule:
    """The rule for one stream (operators or events): its line-up and both traces' entries."""

    small: Sequence[_Entry]
    larger: Sequence[_Entry]
    steps: Sequence[_Step]

    def write(self, extra_layers: int) -> Iterator[tuple[tuple[Any, ...], tuple[int, ...]]]:
        """Loose labels and numbers of every entry with ``extra_layers`` more layers than the
        small trace."""
        lined_up: dict[int, tuple[int, ...]] = {}  # larger index -> numbers when extended
        for step in self.steps:
            if step.kind == "same":
                low, high = self.small[step.i].numbers, self.larger[step.j].numbers
                lined_up[step.j] = tuple(
                    _at_depth(x, y, extra_layers) for x, y in zip(low, high, strict=True)
                )
        for step in self.steps:
            if step.kind == "same":
                yield self.larger[step.j].loose, lined_up[step.j]
                continue
            copies = range(1, extra_layers + 1)
            offset = -step.k if step.kind == "before" else step.k
            for copy in copies if step.kind == "before" else reversed(copies):
                for t in range(step.k):
                    entry = self.larger[step.j + t]
                    source = step.j + offset + t
                    advance = (
                        y - x
                        for x, y in zip(self.larger[source].numbers, entry.numbers, strict=True)
                    )
                    numbers = tuple(
                        n + copy * d for n, d in zip(lined_up[source], advance, strict=True)
                    )
                    yield entry.loose, numbers


@dataclass(frozen=True)
class DepthRule:
    """A step at any depth from its traces at ``DEPTHS[0]`` and ``DEPTHS[1]`` layers."""

    small: StepProfile
    ops: _StreamRule
    events: _StreamRule
    params: tuple[tuple[int, int], tuple[int, int]]
    """(total, trainable) at the two depths."""
    choices: tuple[dict[str, str], dict[str, str]]
    """Kernel choices at the two depths (some count layers: LoRA's adapted modules, the KV
    cache's size)."""

    @classmethod
    def learn(cls, small: StepProfile, larger: StepProfile) -> DepthRule:
        """Line up the two traces; raises ``DepthNotExtendable`` when they do not."""
        streams = []
        for entries in (_op_entries, _event_entries):
            a, b = entries(small), entries(larger)
            streams.append(_StreamRule(a, b, _LineUp(a, b).solve()))
        return cls(
            small=small,
            ops=streams[0],
            events=streams[1],
            params=(
                (small.params_total, small.params_trainable),
                (larger.params_total, larger.params_trainable),
            ),
            choices=(small.choices, larger.choices),
        )

    def write(self, layers: int) -> StepProfile:
        """The step with ``layers`` layers."""
        extra = layers - DEPTHS[0]
        if extra < 0:
            raise ValueError(f"cannot write fewer than {DEPTHS[0]} layers")
        ops = [_op(labels, numbers) for labels, numbers in self.ops.write(extra)]
        events = _events(self.events.write(extra))
        (total, trainable), (total_larger, trainable_larger) = self.params
        return self.small.model_copy(
            update={
                "ops": tuple(ops),
                "events": events,
                "params_total": _at_depth(total, total_larger, extra),
                "params_trainable": _at_depth(trainable, trainable_larger, extra),
                "choices": _extend_choices(*self.choices, extra),
            }
        )


def _at_depth(small: int, larger: int, extra_layers: int) -> int:
    """A number at the small depth and one layer more, extended by ``extra_layers`` layers:
    the rule's one assumption about a lined-up number, that it is affine in the depth."""
    return small + extra_layers * (larger - small)


def _extend_choices(
    small: dict[str, str], larger: dict[str, str], extra_layers: int
) -> dict[str, str]:
    """Choices with every number that changes with depth extended as the rule extends
    numbers (the words around must not change)."""
    if small.keys() != larger.keys():
        raise DepthNotExtendable("the traces at different depths made different choices.")
    out = {}
    for key, text in small.items():
        low, high = _NUMBER.split(text), _NUMBER.split(larger[key])
        if len(low) != len(high) or low[0::2] != high[0::2]:
            raise DepthNotExtendable(f"the traces at different depths differ in {key!r}.")
        low[1::2] = [
            str(_at_depth(int(x), int(y), extra_layers))
            for x, y in zip(low[1::2], high[1::2], strict=True)
        ]
        out[key] = "".join(low)
    return out


_NUMBER = re.compile(r"(\d+)")


def _op(labels: tuple[Any, ...], numbers: tuple[int, ...]) -> OpRecord:
    name, kind, phase, dtype, *lengths = labels
    rest = iter(numbers[3:])
    shapes = [None if n < 0 else tuple(next(rest) for _ in range(n)) for n in lengths]
    return OpRecord(
        name=name,
        kind=kind,
        phase=phase,
        dtype=dtype,
        flops=numbers[0],
        bytes_read=numbers[1],
        bytes_written=numbers[2],
        gemm_bmnk=shapes[0],
        conv=shapes[1],
        attention=shapes[2],
        norm=shapes[3],
    )


def _events(
    written: Iterator[tuple[tuple[Any, ...], tuple[int, ...]]],
) -> tuple[AllocEvent, ...]:
    """Events from their relative numbers, checked to be a well-formed trace."""
    out: list[AllocEvent] = []
    sizes: list[int] = []
    freed: set[int] = set()
    op_index = -1
    for (alloc, category, step, _), (size, ops_since, back) in written:
        op_index += ops_since
        if alloc:
            storage = len(sizes)
            sizes.append(size)
        else:
            storage = len(sizes) - back
            if not 0 <= storage < len(sizes) or storage in freed or sizes[storage] != size:
                raise DepthNotExtendable("the extended events free a storage they never made.")
            freed.add(storage)
        out.append(
            AllocEvent(
                op_index=op_index,
                storage=storage,
                size_bytes=size,
                alloc=alloc,
                category=category,
                step=step,
            )
        )
    events = tuple(out)
    if canonical_events(events) != events:
        raise DepthNotExtendable("the extended events are out of order.")
    return events


def _same_apart_from_depth(*traces: StepProfile) -> None:
    first = traces[0]
    for other in traces[1:]:
        for field in ("units_per_step", "batch_size", "seq_len", "run"):
            if getattr(other, field) != getattr(first, field):
                raise DepthNotExtendable(f"the traces at different depths differ in {field}.")


def _first_difference(written: StepProfile, traced: StepProfile) -> str | None:
    if (written.params_total, written.params_trainable) != (
        traced.params_total,
        traced.params_trainable,
    ):
        return "parameter counts"
    if written.choices != traced.choices:
        return "kernel choices"
    for what, mine, theirs in (
        ("operator", written.ops, traced.ops),
        ("event", written.events, canonical_events(traced.events)),
    ):
        if len(mine) != len(theirs):
            return f"{len(mine)} vs {len(theirs)} {what}s"
        for index, (x, y) in enumerate(zip(mine, theirs, strict=True)):
            if x != y:
                return f"{what} {index}"
    return None
