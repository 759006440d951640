"""Step profiles as exact polynomials of batch size and sequence length, and their file format.

A traced step is a fixed sequence of operators and allocations whose *sizes* depend on the
batch size ``b`` and the sequence length ``L``: an activation is ``b x L x hidden x 2`` bytes,
an attention score matrix ``b x heads x L x L x 2``, a weight does not change at all. Every
integer of a profile (each allocation's size; each operator's FLOPs, bytes and GEMM/conv/
attention dimensions) is therefore a polynomial in ``b`` and ``L`` of low degree:

- sequence models: ``c0 + c1 L + c2 L^2 + b (c3 + c4 L + c5 L^2)`` — six coefficients, found
  from traces at two batch sizes x three sequence lengths;
- fixed-size inputs (images): ``c0 + b c1`` — from traces at two batch sizes.

``whichgpu.trace.scaling`` traces the grid, checks that every trace has the same operators
and allocations in the same order, solves for the coefficients exactly (rationals), and
confirms them against one more trace off the grid. The result, a ``ScalableProfile``, answers
for any ``(b, L)`` without torch: named workloads ship one per stored run configuration
(``whichgpu.profiles.stored``, written by ``scripts/make_profiles.py``). The coefficients are
exact where the model's code is polynomial in the sizes — verified at the check point, and
reported as ``check_point`` — so sizes between and beyond the traced points are exact too
unless the model switches code paths there (say, a sliding attention window); ``trace_points``
say what was traced.

This module is pure Python + numpy; it never imports torch.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, get_args

import numpy as np
import numpy.typing as npt

from whichgpu.errors import UsageError
from whichgpu.files import write_json_gz_atomically
from whichgpu.schema import (
    AllocEvent,
    OpKind,
    OpRecord,
    Phase,
    RunConfig,
    StepProfile,
    TensorCategory,
    ThroughputUnit,
)

FORMAT = "whichgpu-scalable-profile"
FORMAT_VERSION = 1
"""Bumped whenever the stored layout changes (stored files are then regenerated)."""

SEQUENCE_BASIS = ("1", "L", "L2", "b", "bL", "bL2")
"""Monomials of a sequence model's polynomials."""
FIXED_BASIS = ("1", "b")
"""Monomials of a fixed-input model's polynomials."""

CATEGORIES: tuple[TensorCategory, ...] = get_args(TensorCategory)
"""Category codes of the stored event table: index = code, in ``TensorCategory``'s order
(new categories are appended there, so older files keep their meaning)."""

EventArray = npt.NDArray[np.int64]
"""Event table columns: op_index, storage, alloc (0/1), category code, step, size polynomial."""


def monomials(basis: tuple[str, ...], batch_size: int, seq_len: int | None) -> list[int]:
    """Values of the basis monomials at ``(batch_size, seq_len)``."""
    b = batch_size
    length = seq_len or 0
    table = {
        "1": 1,
        "L": length,
        "L2": length * length,
        "b": b,
        "bL": b * length,
        "bL2": b * length * length,
    }
    return [table[m] for m in basis]


@dataclass(frozen=True)
class Polynomials:
    """A table of distinct polynomials, shared by every field that has the same one."""

    basis: tuple[str, ...]
    """Monomials (``SEQUENCE_BASIS`` or ``FIXED_BASIS``)."""
    numerators: tuple[tuple[int, ...], ...]
    """Per polynomial, the coefficient numerators over ``basis``."""
    denominators: tuple[int, ...]
    """Per polynomial, the common denominator of its coefficients (mostly 1)."""

    def __len__(self) -> int:
        return len(self.numerators)

    def values(self, batch_size: int, seq_len: int | None) -> npt.NDArray[np.int64]:
        """Every polynomial at ``(batch_size, seq_len)``, rounded to the nearest integer."""
        numerators, denominators, whole = self._exact_arrays
        point = np.array(monomials(self.basis, batch_size, seq_len), dtype=object)
        totals = numerators.dot(point)  # Python integers: exact at any size
        rounded = np.where(whole, totals, (2 * totals + denominators) // (2 * denominators))
        try:
            out: npt.NDArray[np.int64] = rounded.astype(np.int64)
        except OverflowError:
            raise UsageError(
                f"A step at batch {batch_size:,}"
                + (f", length {seq_len:,}" if seq_len else "")
                + " counts more bytes and FLOPs than 64-bit integers hold: far beyond any GPU "
                "machine. Ask about a smaller batch or length."
            ) from None
        return out

    @functools.cached_property
    def _exact_arrays(
        self,
    ) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.object_], npt.NDArray[np.bool_]]:
        """Numerators and denominators as arrays of Python integers, and which polynomials
        have integer coefficients (built once)."""
        numerators = np.array(self.numerators, dtype=object).reshape(len(self), len(self.basis))
        denominators = np.array(self.denominators, dtype=object)
        return numerators, denominators, np.array([d == 1 for d in self.denominators])


@dataclass(frozen=True)
class StoredOp:
    """An operator of a scalable profile: its labels, and polynomial indices for its numbers."""

    name: str
    """ATen operator."""
    kind: OpKind
    """Operator kind."""
    phase: Phase
    """Phase of the step."""
    dtype: str
    """Dtype of its first input."""
    flops: int
    """Polynomial index of its FLOPs."""
    bytes_read: int
    """Polynomial index of its bytes read."""
    bytes_written: int
    """Polynomial index of its bytes written."""
    gemm_bmnk: tuple[int, ...] | None
    """Polynomial indices of (batch, M, N, K), for matrix multiplies."""
    conv: tuple[int, ...] | None
    """Polynomial indices of the convolution shape, for convolutions."""
    attention: tuple[int, ...] | None
    """Polynomial indices of the attention shape, for attention operators."""
    norm: tuple[int, ...] | None = None
    """Polynomial indices of a batch norm's (N, C, S) (``OpRecord.norm``); None in profiles
    stored before it was recorded."""


@dataclass(frozen=True)
class ScalableProfile:
    """A workload's step for every batch size and sequence length, without torch."""

    workload: str
    """Workload name."""
    run: RunConfig
    """Run configuration traced (``batch_size`` and ``seq_len`` left open)."""
    is_sequence_model: bool
    """Whether ``seq_len`` is a variable."""
    throughput_unit: ThroughputUnit
    """Unit of throughput."""
    params_total: int
    """All parameters."""
    params_trainable: int
    """Trainable parameters."""
    choices: dict[str, str]
    """Kernel choices in effect while tracing."""
    torch_version: str
    """torch version that traced the grid."""
    polynomials: Polynomials
    """The distinct polynomials that the fields below index."""
    units_per_step: int
    """Polynomial index of throughput units per step."""
    events: EventArray
    """Allocation/free events (see ``EventArray``), both traced steps, in order."""
    ops: tuple[StoredOp, ...]
    """Operators of the steady-state step."""
    trace_points: tuple[tuple[int, int | None], ...]
    """``(batch_size, seq_len)`` points the polynomials were solved from."""
    check_point: tuple[int, int | None]
    """The off-grid point whose trace the polynomials reproduced exactly."""
    trace_seconds: float
    """Wall time of all the traces."""

    def event_sizes(self, batch_size: int, seq_len: int | None) -> npt.NDArray[np.int64]:
        """Size in bytes of every event at ``(batch_size, seq_len)``."""
        values = self.polynomials.values(batch_size, seq_len)
        return values[self.events[:, 5]]

    def live_peak_bytes(self, batch_size: int, seq_len: int | None) -> int:
        """Peak of live tensor bytes over the traced steps at ``(batch_size, seq_len)``: what
        the tensors themselves hold at the worst moment, before any allocator rounding or
        caching (``profile_summary.live_peak`` of ``at``, without building it)."""
        sizes = self.event_sizes(batch_size, seq_len)
        signed = np.where(self.events[:, 2] == 1, sizes, -sizes)
        return int(max(0, np.cumsum(signed).max(initial=0)))

    def at(self, batch_size: int, seq_len: int | None) -> StepProfile:
        """The full ``StepProfile`` at one size (operators and events as objects)."""
        values = self.polynomials.values(batch_size, seq_len)

        def pick(indices: tuple[int, ...] | None) -> tuple[int, ...] | None:
            return None if indices is None else tuple(int(values[i]) for i in indices)

        ops = tuple(
            OpRecord(
                name=op.name,
                kind=op.kind,
                phase=op.phase,
                flops=int(values[op.flops]),
                bytes_read=int(values[op.bytes_read]),
                bytes_written=int(values[op.bytes_written]),
                dtype=op.dtype,
                gemm_bmnk=pick(op.gemm_bmnk),
                conv=pick(op.conv),
                norm=pick(op.norm),
                attention=pick(op.attention),
            )
            for op in self.ops
        )
        sizes = values[self.events[:, 5]]
        events = tuple(
            AllocEvent(
                op_index=int(row[0]),
                storage=int(row[1]),
                size_bytes=int(size),
                alloc=bool(row[2]),
                category=CATEGORIES[int(row[3])],
                step=int(row[4]),
            )
            for row, size in zip(self.events, sizes, strict=True)
        )
        resolved = self.run.model_copy(update={"batch_size": batch_size, "seq_len": seq_len})
        return StepProfile(
            workload=self.workload,
            run=resolved,
            batch_size=batch_size,
            seq_len=seq_len,
            units_per_step=int(values[self.units_per_step]),
            throughput_unit=self.throughput_unit,
            params_total=self.params_total,
            params_trainable=self.params_trainable,
            ops=ops,
            events=events,
            choices={**self.choices, "profile": "stored, evaluated at this size"},
            trace_seconds=0.0,
            torch_version=self.torch_version,
        )

    # --- storage -------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """A JSON-able document (written gzip-compressed by ``save``)."""
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "workload": self.workload,
            "run": self.run.model_dump(mode="json"),
            "is_sequence_model": self.is_sequence_model,
            "throughput_unit": self.throughput_unit,
            "params_total": self.params_total,
            "params_trainable": self.params_trainable,
            "choices": self.choices,
            "torch_version": self.torch_version,
            "basis": list(self.polynomials.basis),
            "numerators": [list(c) for c in self.polynomials.numerators],
            "denominators": list(self.polynomials.denominators),
            "units_per_step": self.units_per_step,
            "events": _delta_encode(self.events),
            "ops": _encode_ops(self.ops),
            "trace_points": [list(p) for p in self.trace_points],
            "check_point": list(self.check_point),
            "trace_seconds": round(self.trace_seconds, 2),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ScalableProfile:
        """Inverse of ``to_json``; raises ``ValueError`` on another format or version."""
        if doc.get("format") != FORMAT or doc.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"not a {FORMAT} v{FORMAT_VERSION} document "
                f"(format={doc.get('format')!r}, version={doc.get('version')!r})"
            )
        polys = Polynomials(
            basis=tuple(doc["basis"]),
            numerators=tuple(tuple(int(c) for c in row) for row in doc["numerators"]),
            denominators=tuple(int(d) for d in doc["denominators"]),
        )
        return cls(
            workload=doc["workload"],
            run=RunConfig.model_validate(doc["run"]),
            is_sequence_model=bool(doc["is_sequence_model"]),
            throughput_unit=doc["throughput_unit"],
            params_total=int(doc["params_total"]),
            params_trainable=int(doc["params_trainable"]),
            choices=dict(doc["choices"]),
            torch_version=doc["torch_version"],
            polynomials=polys,
            units_per_step=int(doc["units_per_step"]),
            events=_delta_decode(doc["events"]),
            ops=_decode_ops(doc["ops"]),
            trace_points=tuple(_point(p) for p in doc["trace_points"]),
            check_point=_point(doc["check_point"]),
            trace_seconds=float(doc["trace_seconds"]),
        )

    def save(self, path: Path) -> None:
        """Write gzip-compressed JSON atomically (``files.write_json_gz_atomically``)."""
        write_json_gz_atomically(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> ScalableProfile:
        """Read a file written by ``save``."""
        with gzip.open(path, "rb") as fh:
            return cls.from_json(json.loads(fh.read()))


def _point(p: list[Any]) -> tuple[int, int | None]:
    return (int(p[0]), None if p[1] is None else int(p[1]))


def _delta_encode(events: EventArray) -> list[list[int]]:
    """Columns, op_index and storage as differences (they mostly grow by small steps)."""
    cols = events.T.tolist()
    for c in (0, 1):
        col = cols[c]
        cols[c] = [col[0]] + [b - a for a, b in itertools.pairwise(col)] if col else []
    return [list(map(int, c)) for c in cols]


def _delta_decode(cols: list[list[int]]) -> EventArray:
    arr = np.array(cols, dtype=np.int64).reshape(6, -1)
    arr[0] = np.cumsum(arr[0])
    arr[1] = np.cumsum(arr[1])
    return np.ascontiguousarray(arr.T)


def _encode_ops(ops: tuple[StoredOp, ...]) -> dict[str, Any]:
    names: dict[str, int] = {}
    rows = []
    for op in ops:
        labels = [names.setdefault(s, len(names)) for s in (op.name, op.kind, op.phase, op.dtype)]
        shape = [-1 if v is None else list(v) for v in (op.gemm_bmnk, op.conv, op.attention)]
        if op.norm is not None:  # an eleventh column, only where there is one
            shape.append(list(op.norm))
        rows.append([*labels, op.flops, op.bytes_read, op.bytes_written, *shape])
    return {"strings": list(names), "rows": rows}


def _decode_ops(doc: dict[str, Any]) -> tuple[StoredOp, ...]:
    strings = doc["strings"]

    def shape(v: Any) -> tuple[int, ...] | None:
        return None if v == -1 else tuple(int(x) for x in v)

    return tuple(
        StoredOp(
            name=strings[r[0]],
            kind=strings[r[1]],
            phase=strings[r[2]],
            dtype=strings[r[3]],
            flops=int(r[4]),
            bytes_read=int(r[5]),
            bytes_written=int(r[6]),
            gemm_bmnk=shape(r[7]),
            conv=shape(r[8]),
            attention=shape(r[9]),
            norm=shape(r[10]) if len(r) > 10 else None,
        )
        for r in doc["rows"]
    )


def solve_polynomials(
    basis: tuple[str, ...],
    points: list[tuple[int, int | None]],
    samples: list[tuple[int, ...]],
) -> tuple[Polynomials, list[int]]:
    """Exact polynomials through ``samples`` (one value per point each); and their indices.

    ``points`` must make the monomial matrix square and invertible. Identical sample tuples
    share one polynomial.
    """
    matrix = [[Fraction(x) for x in monomials(basis, b, s)] for b, s in points]
    inverse = _invert(matrix)
    common = math.lcm(*(x.denominator for row in inverse for x in row))
    integer_inverse = [[int(x * common) for x in row] for row in inverse]
    table: dict[tuple[int, ...], int] = {}
    numerators: list[tuple[int, ...]] = []
    denominators: list[int] = []
    index: list[int] = []
    for sample in samples:
        found = table.get(sample)
        if found is None:
            coeffs = [
                sum(w * y for w, y in zip(row, sample, strict=True)) for row in integer_inverse
            ]
            g = math.gcd(common, *coeffs)
            numerators.append(tuple(c // g for c in coeffs))
            denominators.append(common // g)
            found = table[sample] = len(numerators) - 1
        index.append(found)
    return Polynomials(basis, tuple(numerators), tuple(denominators)), index


def _invert(matrix: list[list[Fraction]]) -> list[list[Fraction]]:
    """Gauss-Jordan inverse over the rationals."""
    n = len(matrix)
    aug = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if aug[r][col] != 0), None)
        if pivot is None:
            raise ValueError("trace points do not determine the polynomials (singular grid)")
        aug[col], aug[pivot] = aug[pivot], aug[col]
        scale = aug[col][col]
        aug[col] = [x / scale for x in aug[col]]
        for r in range(n):
            if r != col and aug[r][col] != 0:
                factor = aug[r][col]
                aug[r] = [a - factor * b for a, b in zip(aug[r], aug[col], strict=True)]
    return [row[n:] for row in aug]
