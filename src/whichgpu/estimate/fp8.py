"""fp8 training (``--precision fp8``), derived from the bf16 AMP step rather than traced.

The recipes modelled are torchao's ``Float8Linear`` with dynamic scaling
(``convert_to_float8_training``): tensorwise (its default) and rowwise
(``RunConfig.fp8_recipe``). This module finds the linear layers it converts in a bf16 AMP
profile, writes the step with their fp8 weight copies and casts in place of autocast's 16-bit
ones, and under rowwise the backward products' rescaling kernels and the weights' second casts
(``fp8_profile``, ``fp8_linears``), and says which GPUs cannot run it (``fp8_refusal``);
everything else is the bf16 AMP step unchanged.

The method: docs/memory.md, "fp8 training" (memory); docs/throughput.md, "fp8 training" (time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from whichgpu.errors import UsageError, option
from whichgpu.profiles.scalable import CATEGORIES, Polynomials, ScalableProfile, StoredOp
from whichgpu.schema import GpuSpec, OpKind, Phase, RunConfig, Vendor

TRACED_PRECISION = "bf16"
"""The precision of the step an fp8 run is derived from (AMP over fp32 parameters)."""
FP8_ALIGNMENT = 16
"""Elements every fixed GEMM dimension of a converted linear is a multiple of
(``torch._scaled_mm``; torchao's README filter leaves other layers in bf16)."""
MIN_NVIDIA_CAPABILITY = (8, 9)
"""Lowest NVIDIA compute capability with fp8 tensor cores (Ada; Hopper is 9.0)."""
FP8_VENDORS = (Vendor.NVIDIA, Vendor.AMD)
"""Makers whose GPUs torchao's float8 training runs on (its README: NVIDIA and AMD)."""
FORWARD_DTYPE = "float8_e4m3fn"
BACKWARD_DTYPE = "float8_e5m2"
RECIPE = (
    "fp8 training: torchao Float8Linear, tensorwise dynamic scaling (e4m3 forward, e5m2 "
    "gradients), the linear layers' three GEMMs in fp8 but the last layer's; master weights, "
    "gradients, optimizer state, attention and other layers as bf16 AMP; casts as "
    "torch.compile fuses them (a max-abs pass and a cast per tensor); derived from the bf16 "
    "AMP step (whichgpu.estimate.fp8)"
)
ROWWISE_RECIPE = (
    "fp8 training: torchao Float8Linear, rowwise dynamic scaling (one scale per row or column, "
    "all e4m3), the linear layers' three GEMMs in fp8 but the last layer's: the forward's a "
    "CUTLASS rowwise kernel, timed at the fp8 rate (most shapes run at 90-100 % of the "
    "tensorwise kernel's, pytorch/pytorch issue #147971); the backward's two, which accumulate "
    "in full precision, cuBLAS's kernel followed by a rescaling kernel each that reads and "
    "writes the product (torchao's workaround for the slow CUTLASS kernel, issue #2184); the "
    "weight cast once for the forward and again for the grad-input product; master weights, "
    "gradients, optimizer state, attention and other layers as bf16 AMP; casts as "
    "torch.compile fuses them (a max-abs pass and a cast per tensor); derived from the bf16 "
    "AMP step (whichgpu.estimate.fp8)"
)
RECIPES = {"tensorwise": RECIPE, "rowwise": ROWWISE_RECIPE}
"""What each ``RunConfig.fp8_recipe`` stands for, as the profile's ``choices["fp8"]`` says."""


AMAX_OP = "whichgpu.fp8_amax"
"""The operator name of a cast's max-abs reduction (it writes the scale)."""
CAST_OP = "whichgpu.fp8_cast"
"""The operator name of a cast's scaled copy to fp8."""
RESCALE_OP = "whichgpu.fp8_rescale"
"""The operator name of rowwise scaling's rescaling of a backward product (its output times
the outer product of the two operands' scales, a kernel of its own under torch.compile)."""
CAST_OPS = (AMAX_OP, CAST_OP, RESCALE_OP)
"""The operators ``fp8_profile`` inserts: timed as ``torch.compile`` builds them already."""


class Fp8Refused(UsageError):
    """fp8 training cannot run on a GPU (or for a run); the message says why."""


def base_run(run: RunConfig) -> RunConfig:
    """The run whose step an fp8 run is derived from: the same run in bf16 AMP (itself for any
    other precision)."""
    if run.precision != "fp8":
        return run
    return run.model_copy(update={"precision": TRACED_PRECISION, "fp8_recipe": "tensorwise"})


def check_run(run: RunConfig) -> None:
    """Refuse an fp8 run the recipe does not cover: inference, LoRA/QLoRA."""
    if run.precision != "fp8":
        return
    if run.mode != "train":
        raise Fp8Refused(
            f"{option('precision')} fp8 is fp8 training (torchao Float8Linear); to serve fp8 "
            f"weights use {option('precision')} bf16 with {option('serving')} vllm "
            f"{option('quantization')} fp8."
        )
    if run.method != "full":
        raise Fp8Refused(
            f"{option('precision')} fp8 models full training; {option('method')} "
            f"{run.method} keeps frozen base weights whose fp8 path is not modelled."
        )


def fp8_refusal(gpu: GpuSpec) -> str | None:
    """Why ``gpu`` cannot train in fp8 (None: it can): no fp8 tensor rate in the catalog, a
    maker torchao's float8 does not run on, or an NVIDIA GPU before Ada."""
    device = gpu.one_device()
    if not device.fp8_tensor_tflops:
        return (
            f"{gpu.name} has no fp8 tensor cores (no fp8 tensor rate in the catalog): fp8 "
            "training needs NVIDIA Ada, Hopper or Blackwell (compute capability 8.9+) or AMD "
            "MI300 and later; use --precision bf16"
        )
    if device.vendor not in FP8_VENDORS:
        return (
            f"{gpu.name}: torchao's float8 training runs on NVIDIA and AMD GPUs only; use "
            "--precision bf16"
        )
    if device.vendor == Vendor.NVIDIA:
        cc = device.capability()
        if cc is not None and cc < MIN_NVIDIA_CAPABILITY:
            return (
                f"{gpu.name} (compute capability {device.compute_capability}) has no fp8 "
                "tensor cores (8.9+: Ada, Hopper, Blackwell); use --precision bf16"
            )
    return None


def check_gpu(gpu: GpuSpec) -> None:
    """``Fp8Refused`` where ``gpu`` cannot train in fp8 (``fp8_refusal``)."""
    reason = fp8_refusal(gpu)
    if reason is not None:
        raise Fp8Refused(f"--precision fp8 cannot train here: {reason}.")


@dataclass(frozen=True)
class Fp8Linears:
    """What the derivation found in a step: its converted GEMMs and weights."""

    gemms: int
    """Converted matrix products (forward, grad-input and grad-weight, recomputations)."""
    weights: int
    """Distinct converted weight shapes."""
    kept_shape: tuple[int, int] | None
    """The shape of the last linear layer, left in bf16."""


class _Table:
    """The profile's polynomials, extended with the ones the derivation needs."""

    def __init__(self, polys: Polynomials) -> None:
        self.basis = polys.basis
        self.numerators = list(polys.numerators)
        self.denominators = list(polys.denominators)
        self.one = polys.basis.index("1")
        pairs = zip(self.numerators, self.denominators, strict=True)
        self._index = {(n, d): i for i, (n, d) in enumerate(pairs)}

    def constant_of(self, index: int) -> int | None:
        """The value of polynomial ``index`` when it is a whole constant, else None."""
        nums = self.numerators[index]
        if any(c for j, c in enumerate(nums) if j != self.one):
            return None
        value = Fraction(nums[self.one], self.denominators[index])
        return int(value) if value.denominator == 1 else None

    def _add(self, nums: tuple[int, ...], den: int) -> int:
        g = math.gcd(den, *nums)
        key = (tuple(c // g for c in nums), den // g)
        found = self._index.get(key)
        if found is None:
            self.numerators.append(key[0])
            self.denominators.append(key[1])
            found = self._index[key] = len(self.numerators) - 1
        return found

    def scaled(self, index: int, factor: Fraction | int) -> int:
        """A polynomial ``factor`` times polynomial ``index``."""
        f = Fraction(factor)
        nums = tuple(c * f.numerator for c in self.numerators[index])
        return self._add(nums, self.denominators[index] * f.denominator)

    def constant(self, value: int) -> int:
        nums = tuple(value if j == self.one else 0 for j in range(len(self.basis)))
        return self._add(nums, 1)

    def polynomials(self) -> Polynomials:
        return Polynomials(self.basis, tuple(self.numerators), tuple(self.denominators))


@dataclass(frozen=True)
class _Gemm:
    index: int
    """Operator index in the steady step."""
    casts: tuple[int, ...]
    """Polynomials of the element counts of the operands cast to fp8 around it."""
    rescaled: int | None = None
    """Rowwise scaling's backward products: the polynomial of the product's output elements,
    which a rescaling kernel reads and writes again in bf16 (None: no rescaling)."""


GRAD_PAIR_OPS = 8
"""Operators at most between a linear layer's grad-weight and grad-input products: autograd
computes both in the layer's one backward node, one after the other."""


def _grad_input_products(
    found: list[tuple[int, tuple[int, int], str]], ops: tuple[StoredOp, ...]
) -> set[int]:
    """The operator indices of ``found``'s grad-input products: a backward-phase product with
    the tokens as its rows, next to a grad-weight product of the same weight. Another such
    product is a forward one recomputed by activation checkpointing."""
    pairs = set()
    for j, (i, shape, role) in enumerate(found):
        if role != "rows" or ops[i].phase == "forward":
            continue
        neighbours = found[max(j - 1, 0) : j] + found[j + 1 : j + 2]
        if any(
            r == "weight_grad" and s == shape and abs(x - i) <= GRAD_PAIR_OPS
            for x, s, r in neighbours
        ):
            pairs.add(i)
    return pairs


_DERIVED: dict[tuple[int, str], tuple[ScalableProfile, ScalableProfile, Fp8Linears]] = {}


def fp8_profile(profile: ScalableProfile, recipe: str = "tensorwise") -> ScalableProfile:
    """The fp8 training step derived from ``profile``, a bf16 AMP training step, under
    torchao's ``recipe`` (``RunConfig.fp8_recipe``; memoised)."""
    return _derive(profile, recipe)[0]


def fp8_linears(profile: ScalableProfile) -> Fp8Linears:
    """What ``fp8_profile`` converts in ``profile`` (the same layers under every recipe)."""
    return _derive(profile, "tensorwise")[1]


def _derive(profile: ScalableProfile, recipe: str) -> tuple[ScalableProfile, Fp8Linears]:
    if recipe not in RECIPES:
        raise UsageError(
            f"{option('fp8_recipe')} {recipe}: torchao's recipes modelled are {', '.join(RECIPES)}."
        )
    key = (id(profile), recipe)
    found = _DERIVED.get(key)
    if found is not None and found[0] is profile:
        return found[1], found[2]
    derived, linears = _build(profile, recipe)
    if len(_DERIVED) >= 16:
        _DERIVED.clear()
    _DERIVED[key] = (profile, derived, linears)
    return derived, linears


def _build(profile: ScalableProfile, recipe: str) -> tuple[ScalableProfile, Fp8Linears]:
    rowwise = recipe == "rowwise"
    table = _Table(profile.polynomials)
    events = profile.events
    casts_code = CATEGORIES.index("parameter_cast")
    parameter_code = CATEGORIES.index("parameter")
    if profile.run.mode != "train" or not (events[:, 3] == casts_code).any():
        raise Fp8Refused(
            f"fp8 training is derived from a bf16 AMP training step (autocast over fp32 "
            f"parameters); {profile.workload}'s step is not one."
        )
    first_step = events[:, 4] == events[:, 4].min()
    param_rows = np.flatnonzero(first_step & (events[:, 2] == 1) & (events[:, 3] == parameter_code))
    param_elements: set[int] = set()
    for row in param_rows.tolist():
        size = table.constant_of(int(events[row, 5]))
        if size is not None and size % 4 == 0:
            param_elements.add(size // 4)  # fp32 parameters under AMP

    # the matrix products with a parameter operand: (index, weight shape, role)
    found: list[tuple[int, tuple[int, int], str]] = []
    for i, op in enumerate(profile.ops):
        if op.kind != "gemm" or op.gemm_bmnk is None or op.dtype != "bfloat16":
            continue
        b, m, n, k = (table.constant_of(p) for p in op.gemm_bmnk)
        if b != 1:
            continue
        if m is None and n is not None and k is not None:
            shape, role = (n, k), "rows"  # forward or grad-input: tokens x weight
        elif k is None and m is not None and n is not None:
            shape, role = (m, n), "weight_grad"  # grad-weight: tokens are the inner dimension
        else:
            continue
        if shape[0] * shape[1] not in param_elements:
            continue
        if shape[0] % FP8_ALIGNMENT or shape[1] % FP8_ALIGNMENT:
            continue
        found.append((i, (min(shape), max(shape)), role))
    forward = [f for f in found if profile.ops[f[0]].phase == "forward"]
    if not forward:
        raise Fp8Refused(
            f"{profile.workload} has no linear layers that fp8 training converts (matrix "
            f"products with a weight whose dimensions are multiples of {FP8_ALIGNMENT})."
        )
    kept = forward[-1][1]  # the last linear layer stays bf16
    converted_shapes = {f[1] for f in found} - {kept}
    converted_elements = {a * b for a, b in converted_shapes} - {kept[0] * kept[1]}
    grad_inputs = _grad_input_products(found, profile.ops)

    ops = list(profile.ops)
    gemms: list[_Gemm] = []
    for i, shape, role in (f for f in found if f[1] in converted_shapes):
        op = ops[i]
        assert op.gemm_bmnk is not None
        _, m_at, n_at, k_at = op.gemm_bmnk
        m, n, k = (table.constant_of(p) for p in (m_at, n_at, k_at))
        # a checkpointed layer's recomputed forward product runs in the backward phase, and
        # runs as the forward one does
        backward = role == "weight_grad" or i in grad_inputs
        rescaled: int | None = None
        if role == "rows":
            assert k is not None and n is not None
            casts: tuple[int, ...] = (table.scaled(m_at, k),)  # the token-side operand
            if rowwise and backward:
                # the weight again, scaled along its other axis (torchao's
                # cast_config_weight_for_grad_input); the product rescaled after cuBLAS's
                casts += (table.constant(shape[0] * shape[1]),)
                rescaled = table.scaled(m_at, n)
        else:
            assert m is not None and n is not None
            casts = (table.scaled(k_at, m), table.scaled(k_at, n))
            if rowwise:
                rescaled = table.constant(m * n)
        gemms.append(_Gemm(i, casts, rescaled))
        dtype = FORWARD_DTYPE if not backward or rowwise else BACKWARD_DTYPE
        ops[i] = replace(op, dtype=dtype, bytes_read=table.scaled(op.bytes_read, Fraction(1, 2)))

    # autocast's 16-bit copies of the converted weights become fp8 copies (same lifetime);
    # the cast that makes each reads the fp32 weight twice (max-abs, cast) and writes half
    last = int(events[:, 4].max())
    offset = int(events[:, 0].max()) + 1 - len(ops)
    new_events = events.copy()
    recast: set[int] = set()
    for row in np.flatnonzero(events[:, 3] == casts_code).tolist():
        size = table.constant_of(int(events[row, 5]))
        if size is None or size % 2 or size // 2 not in converted_elements:
            continue
        new_events[row, 5] = table.scaled(int(events[row, 5]), Fraction(1, 2))
        if events[row, 2] == 1 and events[row, 4] == last:
            recast.add(int(events[row, 0]) - offset)
    for local in sorted(recast):
        if 0 <= local < len(ops):
            op = ops[local]
            ops[local] = replace(
                op,
                bytes_read=table.scaled(op.bytes_read, 2),
                bytes_written=table.scaled(op.bytes_written, Fraction(1, 2)),
            )

    zero = table.constant(0)
    scale_bytes = table.constant(4)
    inserted: dict[int, list[StoredOp]] = {}

    def cast_op(name: str, kind: OpKind, phase: Phase, elements: int, written: int) -> StoredOp:
        """One kernel of a cast: it reads the bf16 tensor of ``elements`` elements."""
        return StoredOp(
            name=name,
            kind=kind,
            phase=phase,
            dtype="bfloat16",
            flops=zero,
            bytes_read=table.scaled(elements, 2),
            bytes_written=written,
            gemm_bmnk=None,
            conv=None,
            attention=None,
        )

    for gemm in gemms:
        phase = ops[gemm.index].phase
        # each cast: a max-abs reduction (writes the scale), then the scaled 1-byte copy
        inserted[gemm.index] = [
            op
            for elements in gemm.casts
            for op in (
                cast_op(AMAX_OP, "reduction", phase, elements, scale_bytes),
                cast_op(CAST_OP, "elementwise", phase, elements, elements),
            )
        ]
        if gemm.rescaled is not None:
            # rowwise: the product's bf16 output read and written again, scaled (placed before
            # the product in the list; the step's time does not depend on the order)
            inserted[gemm.index].append(
                cast_op(
                    RESCALE_OP, "elementwise", phase, gemm.rescaled, table.scaled(gemm.rescaled, 2)
                )
            )

    # the new operator list, and where each old operator moved
    new_ops: list[StoredOp] = []
    moved = [0] * len(ops)
    for i, op in enumerate(ops):
        new_ops.extend(inserted.get(i, ()))
        moved[i] = len(new_ops)
        new_ops.append(op)
    total = len(new_ops) - len(ops)
    first_optimizer = next((i for i, op in enumerate(ops) if op.phase == "optimizer"), len(ops))

    def new_index(index: int, step: int) -> int:
        if index < 0:
            return index
        if step == last:
            local = index - offset
            return offset + (moved[local] if 0 <= local < len(ops) else local + total)
        if index < first_optimizer:
            return moved[index]
        return index + total

    # the fp8 copies: allocated around their product, freed after it (after its own events)
    storage = int(events[:, 1].max()) + 1
    by_gemm = {g.index: g for g in gemms}
    rows: list[list[int]] = []
    pending: dict[int, list[int]] = {}

    def flush(step: int, below: int) -> None:
        nonlocal storage
        queue = pending[step]
        while queue and queue[0] < below:
            g = by_gemm[queue.pop(0)]
            index = offset + moved[g.index] if step == last else moved[g.index]
            handles = []
            # the fp8 copies (a byte an element) and, rowwise, the rescaled bf16 product beside
            # the product it replaces
            sizes = [*g.casts, *([table.scaled(g.rescaled, 2)] if g.rescaled is not None else [])]
            for size in sizes:
                rows.append([index, storage, 1, CATEGORIES.index("temporary"), step, size])
                handles.append((storage, size))
                storage += 1
            for handle, size in handles:
                rows.append([index, handle, 0, CATEGORIES.index("temporary"), step, size])

    steps = sorted(set(events[:, 4].tolist()))
    for step in steps:
        pending[step] = sorted(by_gemm)
    for row in new_events.tolist():
        index, step = row[0], row[4]
        # the operator an event belongs to, in the steady step's numbering
        in_step = index if index < first_optimizer else len(ops)
        flush(step, index - offset if step == last else in_step)
        rows.append([new_index(index, step), *row[1:]])
    for step in steps:
        flush(step, len(ops) + 1)
    derived_events = np.array(rows, dtype=np.int64)
    derived_events.flags.writeable = False

    derived = replace(
        profile,
        run=profile.run.model_copy(update={"precision": "fp8", "fp8_recipe": recipe}),
        choices={**profile.choices, "fp8": RECIPES[recipe]},
        polynomials=table.polynomials(),
        events=derived_events,
        ops=tuple(new_ops),
    )
    return derived, Fp8Linears(len(gemms), len(converted_shapes), kept)
