"""Step time and throughput of a profiled step on any catalog GPU: a calibrated roofline.

Over 600 lines because the operator table, the engines of its operators and the step time are
one model, which ``scripts/fit_throughput.py`` fits and ``predict`` evaluates with the same code.

Each operator of the step takes the largest of its compute time (FLOPs over its engine's
fitted share of the peak, with a small-problem ramp), its memory time (bytes over the fitted
share of DRAM bandwidth) and a launch floor, and the step takes the sum; the peaks come from
the catalog, the fitted constants, speed factors and host shares from ``data/throughput.json``.
Pure Python + numpy: no torch.

The formulas, speed factors and fit: docs/throughput.md, "The roofline" and the sections after.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from whichgpu.errors import MissingRates
from whichgpu.estimate.fp8 import CAST_OPS
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.schema import GpuSpec, Precision, SoftwareStack
from whichgpu.units import GB, tflops_to_flops

Engine = Literal["tensor", "tf32", "vector"]
"""Where a matrix operator runs: FP16/BF16 tensor cores, TF32 tensor cores, FP32 vector units."""

MATRIX_KINDS = ("gemm", "conv", "attention")
"""Operator kinds that run on the matrix engines; all others are bandwidth bound."""
FUSED_PHASES = ("forward", "backward")
"""The phases of a training step ``torch.compile`` compiles (the optimizer step runs eager)."""
EXPERT_OPS = ("aten._grouped_mm",)
"""The operators that run a mixture-of-experts layer's experts (transformers' grouped
experts: one grouped GEMM over the experts the tokens were routed to)."""

_HALF = ("float16", "bfloat16")
_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
Rate = float | npt.NDArray[np.float64]
"""A GPU figure: one number, or one per operator of a table that stacks several GPUs."""
PARAMETERS_FILE = "throughput.json"


@dataclass(frozen=True)
class FitCoverage:
    """What the measurements of the fit covered: where a prediction is an extrapolation."""

    architectures: tuple[str, ...] = ()
    """GPU architectures of the fitted runs (``GpuSpec.architecture``); empty: not recorded."""
    tensor_runs: int = 0
    """Fitted runs whose matrix operators ran on tensor cores."""
    tensor_workloads: tuple[str, ...] = ()
    """The workloads of those runs."""
    tensor_precisions: tuple[str, ...] = ()
    """Their precisions."""
    tensor_architectures: tuple[str, ...] = ()
    """Their GPUs' architectures."""

    def architecture_note(self, architecture: str | None) -> str | None:
        """Why a prediction on a GPU of ``architecture`` is an extrapolation (None: it is not,
        or the coverage is unknown)."""
        if not self.architectures or architecture in self.architectures:
            return None
        return (
            f"no {architecture or 'such'} GPU was among the fitted runs (only "
            f"{', '.join(self.architectures)}): the constants carry over through the "
            "catalog's peaks, bandwidth and SM count, and the band is the error measured on "
            "those generations"
        )

    def tensor_note(self, precision: str) -> str | None:
        """What the tensor-core efficiency of a ``precision`` run rests on (None: coverage
        unknown)."""
        if not self.architectures:
            return None
        if not self.tensor_runs:
            return "no fitted run used tensor cores: their efficiency is the prior's"
        note = (
            f"the tensor-core efficiency rests on {self.tensor_runs} fitted runs of "
            f"{', '.join(self.tensor_workloads)} ({', '.join(self.tensor_precisions)} on "
            f"{', '.join(self.tensor_architectures)})"
        )
        if precision not in self.tensor_precisions:
            note += f"; {precision} is taken to reach the same share of its own peak"
        return note


@dataclass(frozen=True)
class PerfParameters:
    """The fitted constants of the operator-time model, with where they come from."""

    tensor_efficiency: float
    """Fraction of the FP16/BF16/TF32 tensor peak that large matrix operators reach."""
    vector_efficiency: float
    """Fraction of the FP32 vector peak that large FP32 matrix operators reach."""
    memory_efficiency: float
    """Fraction of DRAM bandwidth that streaming operators reach."""
    half_work_flops_per_sm: float
    """Work per SM (FLOPs) at which a matrix operator reaches half its efficiency."""
    launch_s: float
    """Shortest time of any operator: the host dispatch of one eager PyTorch operator, s."""
    fitted_on: str
    """What the constants were fitted on."""
    method: str
    """How (the script and the loss)."""
    fitted_date: str
    """When."""
    error_bands: dict[str, float]
    """Validation error (leave-one-GPU-out, absolute relative error, P80) by workload type
    (``vision``, ``language``); ``default`` for everything else."""
    calibrated_error_bands: dict[str, float] = field(default_factory=dict)
    """The same, for a prediction corrected by a measurement on another GPU
    (``predict --calibrate``); empty when not validated."""
    unseen_error_bands: dict[str, float] = field(default_factory=dict)
    """The same for a workload without a fitted speed factor (leave-one-model-out error);
    empty: ``error_bands`` serve."""
    workload_factors: dict[str, float] = field(default_factory=dict)
    """Measured over modelled speed of each fitted workload (by workload id)."""
    type_factors: dict[str, float] = field(default_factory=dict)
    """The speed factor of a workload type (``vision``, ``language``, ``default``), for
    workloads without their own."""
    host_reference_gpu: str = ""
    """Catalog id of the GPU whose modelled time scales the host time of a measured run."""
    workload_host_shares: dict[str, float] = field(default_factory=dict)
    """Host time per unit of each fitted workload's measured runs, as a share of its modelled
    GPU time per unit on ``host_reference_gpu`` (see ``host_share``)."""
    type_host_shares: dict[str, float] = field(default_factory=dict)
    """The same for a workload type, for workloads without their own."""
    coverage: FitCoverage = field(default_factory=FitCoverage)
    """What the fitted runs covered (architectures, tensor-core runs)."""
    batch_norm_round_s: float = 0.0
    """Time of one round of PyTorch's native batch-norm kernels: one load per thread of a
    block, the kernel's loop over a channel (``batch_norm_serial_s``); 0: not modelled."""
    misaligned_efficiency: float = 1.0
    """Share of its engine's rate that a 16-bit matrix operator reaches when one of its
    dimensions is not a multiple of 8 elements (``misaligned_matrix``): cuBLAS and cuDNN fall
    back to kernels without 16-byte vector loads (and, on Hopper, without TMA and wgmma)."""
    today_sources: tuple[str, ...] = ()
    """The measurement sets on today's software the constants were fitted on (empty: only
    Lambda's 2020 table); with any, a prediction takes no speed factor (``prediction_factor``)."""

    def speed_factor(self, workload: str, family: str) -> float:
        """The factor a prediction of ``workload`` (of ``family``) is multiplied by."""
        found = self.workload_factors.get(workload)
        if found is not None:
            return found
        return self.type_factors.get(workload_type(family), self.type_factors.get("default", 1.0))

    def prediction_factor(self, workload: str, family: str) -> float:
        """The factor ``predict`` multiplies a step by: 1 where the constants were fitted on
        runs of today's software (``today_sources``), whose code is what a user runs now;
        Lambda's 2020 speed factors describe the 2020 frameworks' code (TensorFlow 1,
        Darknet, fairseq) and are kept for reproducing that table. Else ``speed_factor``."""
        return 1.0 if self.today_sources else self.speed_factor(workload, family)

    def prediction_factor_origin(self, workload: str, family: str) -> str:
        """Where ``prediction_factor`` comes from, in words."""
        if self.today_sources:
            return (
                "x1.00: no speed factor; the constants are fitted on today's PyTorch runs ("
                + ", ".join(self.today_sources)
                + ") beside Lambda's 2020 table, whose per-workload factors describe the 2020 "
                "frameworks' code"
            )
        return self.factor_origin(workload, family)

    def factor_origin(self, workload: str, family: str) -> str:
        """Where ``speed_factor`` comes from, in words."""
        factor = self.speed_factor(workload, family)
        if workload in self.workload_factors:
            return f"x{factor:.2f}: this workload's speed factor, fitted on its measured runs"
        return (
            f"x{factor:.2f}: the speed factor of {workload_type(family)} workloads (this one "
            "was never measured)"
        )

    def host_share(self, workload: str, family: str) -> float:
        """The host time of a measured run of ``workload``: the time per unit it spent outside
        the GPU (reading and decoding its dataset, the framework's host work), which does not
        shrink on a faster GPU, as a share of its modelled GPU time per unit on
        ``host_reference_gpu``. Predictions of a GPU step on synthetic data leave it out; the
        fit and the validation, which reproduce measured runs, add it."""
        found = self.workload_host_shares.get(workload)
        if found is not None:
            return found
        shares = self.type_host_shares
        return shares.get(workload_type(family), shares.get("default", 0.0))

    @property
    def vector(self) -> npt.NDArray[np.float64]:
        """The fitted values in a fixed order (for the fit)."""
        return np.array(
            [
                self.tensor_efficiency,
                self.vector_efficiency,
                self.memory_efficiency,
                self.half_work_flops_per_sm,
                self.launch_s,
            ]
        )


FIT_FIELDS = (
    "tensor_efficiency",
    "vector_efficiency",
    "memory_efficiency",
    "half_work_flops_per_sm",
    "launch_s",
)


def _shipped_document() -> dict[str, Any]:
    """``data/throughput.json`` as read from the package."""
    ref = resources.files("whichgpu.estimate").joinpath("data").joinpath(PARAMETERS_FILE)
    doc: dict[str, Any] = json.loads(ref.read_text(encoding="utf-8"))
    return doc


def load_parameters() -> PerfParameters:
    """The shipped constants (``data/throughput.json``)."""
    doc = _shipped_document()
    values = doc["parameters"]
    return PerfParameters(
        **{name: float(values[name]) for name in FIT_FIELDS},
        fitted_on=str(doc["fitted_on"]),
        method=str(doc["method"]),
        fitted_date=str(doc["fitted_date"]),
        error_bands={str(k): float(v) for k, v in doc["error_bands"].items()},
        calibrated_error_bands=_floats(doc.get("calibrated_error_bands", {})),
        unseen_error_bands=_floats(doc.get("unseen_error_bands", {})),
        workload_factors=_floats(doc.get("workload_factors", {})),
        type_factors=_floats(doc.get("type_factors", {})),
        host_reference_gpu=str(doc["host_time"]["reference_gpu"]),
        workload_host_shares=_floats(doc.get("workload_host_shares", {})),
        type_host_shares=_floats(doc.get("type_host_shares", {})),
        coverage=_coverage(doc.get("coverage", {})),
        misaligned_efficiency=float(values.get("misaligned_efficiency", 1.0)),
        batch_norm_round_s=float(doc.get("batch_norm", {}).get("round_s", 0.0)),
        today_sources=tuple(str(t) for t in doc.get("today_sources", ())),
    )


@functools.lru_cache(maxsize=1)
def _shipped_misaligned_efficiency() -> float:
    return load_parameters().misaligned_efficiency


def _coverage(doc: dict[str, Any]) -> FitCoverage:
    return FitCoverage(
        architectures=tuple(str(a) for a in doc.get("architectures", ())),
        tensor_runs=int(doc.get("tensor_runs", 0)),
        tensor_workloads=tuple(str(w) for w in doc.get("tensor_workloads", ())),
        tensor_precisions=tuple(str(p) for p in doc.get("tensor_precisions", ())),
        tensor_architectures=tuple(str(a) for a in doc.get("tensor_architectures", ())),
    )


def _floats(values: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in values.items()}


@dataclass(frozen=True)
class FitPriors:
    """What the fit pulls the constants towards where the measurements say little (log-normal
    priors), and how far the speed factors may stray (``data/throughput.json``,
    ``fit_priors``)."""

    values: npt.NDArray[np.float64]
    """Prior value of each constant, in ``FIT_FIELDS`` order."""
    sd_log: npt.NDArray[np.float64]
    """Its standard deviation, in natural log."""
    data_sd_log: float
    """Expected scatter of one measurement about the model, in natural log."""
    workload_sd_log: float
    """Spread of workloads' factors about their type's, in natural log."""
    type_sd_log: float
    """Spread of the types' factors about 1, in natural log."""
    host_share_sd: float
    """Spread of workloads' host shares about their type's."""
    type_host_share_sd: float
    """Spread of the types' host shares about 0."""


def load_fit_priors() -> FitPriors:
    """The shipped priors of the fit."""
    doc = _shipped_document()["fit_priors"]
    return FitPriors(
        values=np.array([float(doc[name]["value"]) for name in FIT_FIELDS]),
        sd_log=np.array([float(doc[name]["sd_log"]) for name in FIT_FIELDS]),
        data_sd_log=float(doc["data_sd_log"]),
        workload_sd_log=float(doc["workload_sd_log"]),
        type_sd_log=float(doc["type_sd_log"]),
        host_share_sd=float(doc["host_share_sd"]),
        type_host_share_sd=float(doc["type_host_share_sd"]),
    )


@dataclass(frozen=True)
class InferenceParameters:
    """Constants of inference steps that the training fit does not cover."""

    decode_memory_efficiency: float
    """Fraction of DRAM bandwidth a decode step's streaming operators reach."""
    source: str
    """Where it comes from."""
    fp8_tensor_efficiency: float
    """Fraction of the catalog's fp8 tensor peak a serving engine's fp8 weight matrix products
    (W8A8) reach."""
    fp8_source: str
    """Where that comes from."""
    weight_only_bandwidth_ratio: Mapping[str, float]
    """By weight-only format (``int8``, ``int4``): the bandwidth its compiled products reach
    over a 16-bit product's (they widen the weights inside the kernel)."""
    weight_only_source: str
    """Where those ratios come from."""


def load_inference_parameters() -> InferenceParameters:
    """The shipped inference constants (``data/throughput.json``, ``inference``)."""
    doc = _shipped_document()["inference"]
    ratios = dict(doc["weight_only_bandwidth_ratio"])
    return InferenceParameters(
        decode_memory_efficiency=float(doc["decode_memory_efficiency"]),
        source=str(doc["source"]),
        fp8_tensor_efficiency=float(doc["fp8_tensor_efficiency"]),
        fp8_source=str(doc["fp8_source"]),
        weight_only_bandwidth_ratio={k: float(v) for k, v in ratios.items() if k != "source"},
        weight_only_source=str(ratios["source"]),
    )


def with_values(params: PerfParameters, values: npt.NDArray[np.float64]) -> PerfParameters:
    """``params`` with the fitted fields replaced by ``values`` (in ``FIT_FIELDS`` order)."""
    (tensor, vector, memory, half_work, launch) = (float(v) for v in values)
    return replace(
        params,
        tensor_efficiency=tensor,
        vector_efficiency=vector,
        memory_efficiency=memory,
        half_work_flops_per_sm=half_work,
        launch_s=launch,
    )


@dataclass(frozen=True)
class OpTable:
    """The operators of one step at one size, as arrays (one entry per operator)."""

    kinds: tuple[str, ...]
    """Operator kind."""
    dtypes: tuple[str, ...]
    """Dtype of the first input."""
    flops: npt.NDArray[np.float64]
    """FLOPs."""
    bytes_moved: npt.NDArray[np.float64]
    """Bytes read + written."""
    units_per_step: int
    """Throughput units the step processes."""
    batch_size: int
    """Batch size."""
    seq_len: int | None
    """Sequence length."""
    is_matrix: npt.NDArray[np.bool_]
    """Which operators run on a matrix engine."""
    is_half: npt.NDArray[np.bool_]
    """Which operators take FP16/BF16 inputs."""
    is_fp32: npt.NDArray[np.bool_]
    """Which operators take FP32 inputs."""
    phases: npt.NDArray[np.str_]
    """Where in the step each operator runs (``forward``, ``backward``, ``decode`` …)."""
    counts: npt.NDArray[np.float64] | None = None
    """How many identical operators each row stands for (None: one each; see
    ``merge_repeats``)."""
    is_experts: npt.NDArray[np.bool_] | None = None
    """Which operators run a mixture-of-experts layer's experts (None: none)."""
    misaligned: npt.NDArray[np.bool_] | None = None
    """Which 16-bit matrix operators have a dimension that is not a multiple of 8 elements
    (16 bytes: ``misaligned_matrix``), so they run at ``PerfParameters.misaligned_efficiency``
    of their engine's rate (None: none)."""
    serial: SerialWork | None = None
    """The bf16 batch norms' per-channel loops (``native_batch_norm_serial``; None: none)."""
    fusible: npt.NDArray[np.bool_] | None = None
    """Which operators a compiled step fuses into inductor's kernels (``FUSED_PHASES``, not a
    matrix engine's, not an fp8 cast; ``estimate.compiled``); None: none."""

    @property
    def weights(self) -> npt.NDArray[np.float64]:
        """``counts``, or ones."""
        return self.counts if self.counts is not None else np.ones(len(self.kinds))


@dataclass(frozen=True)
class SerialWork:
    """Per operator, the latency-bound loop of PyTorch's native batch-norm kernels (zeros for
    the other operators): see ``NATIVE_BATCH_NORM_PASSES``."""

    rounds: npt.NDArray[np.float64]
    """Rounds of the loop one block runs over its channel (passes x N x S / threads)."""
    blocks: npt.NDArray[np.float64]
    """Blocks (one per channel)."""
    then_streams: npt.NDArray[np.bool_]
    """Whether a bandwidth-bound kernel follows the loop (the forward's normalisation), whose
    time adds to it; else the loop does all the operator's traffic."""

    def rows(self, rows: npt.NDArray[np.intp]) -> SerialWork:
        """The entries of ``rows``."""
        return SerialWork(self.rounds[rows], self.blocks[rows], self.then_streams[rows])

    @staticmethod
    def concat(parts: Sequence[SerialWork]) -> SerialWork:
        """One ``SerialWork`` of many tables' operators, in order."""
        return SerialWork(
            np.concatenate([p.rounds for p in parts]),
            np.concatenate([p.blocks for p in parts]),
            np.concatenate([p.then_streams for p in parts]),
        )


def serial_work(table: OpTable, precision: str) -> SerialWork:
    """``table.serial`` as it runs at ``precision``, zeros where there is none: an fp16 run
    (a bf16 profile answers it) normalises in cuDNN, whose fp32 weights AMP keeps."""
    n = len(table.kinds)
    if table.serial is None or precision == "fp16":
        return SerialWork(np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool))
    return table.serial


def merge_repeats(table: OpTable) -> OpTable:
    """``table`` with identical operators (the layers of a deep model) as one row each and
    their count: the same step time, computed many times faster (the fit's inner loop)."""
    experts = (
        table.is_experts.tolist() if table.is_experts is not None else [False] * len(table.kinds)
    )
    misaligned = (
        table.misaligned.tolist() if table.misaligned is not None else [False] * len(table.kinds)
    )
    serial = (
        list(zip(table.serial.rounds.tolist(), table.serial.blocks.tolist(), strict=True))
        if table.serial is not None
        else [(0.0, 0.0)] * len(table.kinds)
    )
    fusible = table.fusible.tolist() if table.fusible is not None else [False] * len(table.kinds)
    keys = list(
        zip(
            table.kinds,
            table.dtypes,
            table.flops.tolist(),
            table.bytes_moved.tolist(),
            table.phases.tolist(),
            experts,
            misaligned,
            serial,
            fusible,
            strict=True,
        )
    )
    first: dict[tuple[str, str, float, float, str, bool, bool, tuple[float, float], bool], int] = {}
    counts: dict[int, float] = {}
    for i, key in enumerate(keys):
        row = first.setdefault(key, i)
        counts[row] = counts.get(row, 0.0) + float(table.weights[i])
    rows = np.array(sorted(counts), dtype=np.intp)
    return select_rows(table, rows, np.array([counts[i] for i in rows]))


def select_rows(
    table: OpTable, rows: npt.NDArray[np.intp], counts: npt.NDArray[np.float64] | None
) -> OpTable:
    """The operators ``rows`` of ``table``, each standing for ``counts`` of them."""
    return OpTable(
        kinds=tuple(table.kinds[i] for i in rows),
        dtypes=tuple(table.dtypes[i] for i in rows),
        flops=table.flops[rows],
        bytes_moved=table.bytes_moved[rows],
        units_per_step=table.units_per_step,
        batch_size=table.batch_size,
        seq_len=table.seq_len,
        is_matrix=table.is_matrix[rows],
        is_half=table.is_half[rows],
        is_fp32=table.is_fp32[rows],
        phases=table.phases[rows],
        counts=counts,
        is_experts=None if table.is_experts is None else table.is_experts[rows],
        misaligned=None if table.misaligned is None else table.misaligned[rows],
        serial=None if table.serial is None else table.serial.rows(rows),
        fusible=None if table.fusible is None else table.fusible[rows],
    )


@dataclass(frozen=True)
class _OpColumns:
    """What of a profile's operators does not depend on the size (``op_table``'s static
    part, built once per profile)."""

    flops: npt.NDArray[np.intp]
    bytes_read: npt.NDArray[np.intp]
    bytes_written: npt.NDArray[np.intp]
    kinds: tuple[str, ...]
    dtypes: tuple[str, ...]
    is_matrix: npt.NDArray[np.bool_]
    is_half: npt.NDArray[np.bool_]
    is_fp32: npt.NDArray[np.bool_]
    phases: npt.NDArray[np.str_]
    is_experts: npt.NDArray[np.bool_]
    gemm: list[tuple[int, tuple[int, ...]]]
    """``(row, polynomial indices of (batch, M, N, K))`` of the 16-bit matrix multiplies."""
    convs: list[tuple[int, tuple[int, ...], bool, int]]
    """``(row, polynomial indices of the shape, is backward, element bytes)`` of the
    convolutions (16-bit: 2 bytes)."""
    extra_reads: npt.NDArray[np.float64]
    """Extra reads of each operator's inputs, as a multiple of its traced input bytes
    (``EXTRA_READS``: kernels that pass over their inputs more than once)."""
    norms: list[tuple[int, tuple[int, ...], int]]
    """``(row, polynomial indices of (N, C, S), passes)`` of the bf16 batch norms that run
    PyTorch's native kernels (``NATIVE_BATCH_NORM_PASSES``)."""
    fusible: npt.NDArray[np.bool_]
    """``OpTable.fusible``."""


_COLUMNS: dict[int, tuple[ScalableProfile, _OpColumns]] = {}
"""``_OpColumns`` by ``id`` of the profile, which the entry keeps alive (so the id is not
reused while it is here)."""


def _op_columns(profile: ScalableProfile) -> _OpColumns:
    found = _COLUMNS.get(id(profile))
    if found is not None and found[0] is profile:
        return found[1]
    ops = profile.ops
    columns = _OpColumns(
        flops=np.array([op.flops for op in ops], dtype=np.intp),
        bytes_read=np.array([op.bytes_read for op in ops], dtype=np.intp),
        bytes_written=np.array([op.bytes_written for op in ops], dtype=np.intp),
        kinds=tuple(op.kind for op in ops),
        dtypes=tuple(op.dtype for op in ops),
        is_matrix=np.array([op.kind in MATRIX_KINDS for op in ops], dtype=bool),
        is_half=np.array([op.dtype in _HALF for op in ops], dtype=bool),
        is_fp32=np.array([op.dtype == "float32" for op in ops], dtype=bool),
        phases=np.array([op.phase for op in ops]),
        is_experts=np.array([op.name in EXPERT_OPS for op in ops], dtype=bool),
        gemm=[
            (i, op.gemm_bmnk)
            for i, op in enumerate(ops)
            if op.gemm_bmnk is not None and op.dtype in _HALF and op.kind in MATRIX_KINDS
        ],
        convs=[
            (i, op.conv, op.phase == "backward", _ELEMENT_BYTES[op.dtype])
            for i, op in enumerate(ops)
            if op.conv is not None and op.dtype in _ELEMENT_BYTES and op.kind == "conv"
        ],
        extra_reads=np.array([EXTRA_READS.get(op.name, 0.0) for op in ops], dtype=np.float64),
        norms=[
            (i, op.norm, NATIVE_BATCH_NORM_PASSES[op.name])
            for i, op in enumerate(ops)
            if op.norm is not None
            and op.dtype == "bfloat16"
            and op.name in NATIVE_BATCH_NORM_PASSES
        ],
        fusible=np.array(
            [
                op.kind not in MATRIX_KINDS and op.phase in FUSED_PHASES and op.name not in CAST_OPS
                for op in ops
            ],
            dtype=bool,
        ),
    )
    if len(_COLUMNS) >= 16:
        _COLUMNS.clear()
    _COLUMNS[id(profile)] = (profile, columns)
    return columns


def op_table(profile: ScalableProfile, batch_size: int, seq_len: int | None) -> OpTable:
    """The steady-state step's operators at ``(batch_size, seq_len)``."""
    values = profile.polynomials.values(batch_size, seq_len).astype(np.float64)
    columns = _op_columns(profile)
    bytes_read = values[columns.bytes_read]
    moved = bytes_read + values[columns.bytes_written]
    # kernels' own traffic beyond their operands' (see ``EXTRA_READS``, ``layout_bytes``)
    moved = moved + columns.extra_reads * bytes_read
    misaligned = np.zeros(len(columns.kinds), dtype=bool)
    for row, dims in columns.gemm:
        misaligned[row] = misaligned_matrix([int(values[i]) for i in dims[1:]])
    written = values[columns.bytes_written]
    for row, shape_at, backward, element in columns.convs:
        shape = [int(values[i]) for i in shape_at]
        spatial = (len(shape) - 5) // 2
        half = element == 2
        if half:
            misaligned[row] = misaligned_matrix([shape[1], shape[2 + spatial]])
            moved[row] += layout_bytes(shape, backward)
        if backward:
            moved[row] += backward_split_bytes(shape, element, half, float(written[row]))
    return OpTable(
        kinds=columns.kinds,
        dtypes=columns.dtypes,
        flops=values[columns.flops],
        bytes_moved=moved,
        units_per_step=int(values[profile.units_per_step]),
        batch_size=batch_size,
        seq_len=seq_len,
        is_matrix=columns.is_matrix,
        is_half=columns.is_half,
        is_fp32=columns.is_fp32,
        phases=columns.phases,
        is_experts=columns.is_experts,
        misaligned=misaligned,
        serial=_serial_work(columns, values),
        fusible=columns.fusible,
    )


def _serial_work(columns: _OpColumns, values: npt.NDArray[np.float64]) -> SerialWork | None:
    """The per-channel loops of the step's native bf16 batch norms at these sizes."""
    if not columns.norms:
        return None
    n = len(columns.kinds)
    rounds, blocks = np.zeros(n), np.zeros(n)
    then_streams = np.zeros(n, dtype=bool)
    for row, shape_at, passes in columns.norms:
        batch, channels, spatial = (int(values[i]) for i in shape_at)
        rounds[row] = passes * -(-(batch * spatial) // BATCH_NORM_THREADS)
        blocks[row] = channels
        then_streams[row] = passes == 1
    return SerialWork(rounds, blocks, then_streams)


NATIVE_BATCH_NORM_PASSES = {
    "aten.native_batch_norm": 1,
    "aten._native_batch_norm_legit": 1,
    "aten._native_batch_norm_legit_functional": 1,
    "aten.native_batch_norm_backward": 2,
    "aten.batch_norm_backward": 2,
}
"""Batch norm in bf16 runs PyTorch's own CUDA kernels, not cuDNN's: ``_batch_norm_impl_index``
(``aten/src/ATen/native/Normalization.cpp``) takes cuDNN only when neither the input nor the
weight is bf16 (and fp16 only with an fp32 weight, as under AMP); the profiles of ResNet-50 in
AMP on an H200 show ``batch_norm_collect_statistics_kernel``, ``batch_norm_transform_input_kernel``
and ``batch_norm_backward_kernel`` (``validate/data/measured/h200-2026-11-27/probe``). For
channels-first inputs (the layout the traced models use) the statistics kernel and the backward
kernel run one block per channel (``aten/src/ATen/native/cuda/Normalization.cuh``), whose
threads walk the channel's N x S elements one load at a time: a latency-bound loop, not a
bandwidth-bound stream. The forward makes one such pass (the statistics), then normalises in a
bandwidth-bound kernel; the backward makes two (the reductions, then the input gradient).
Values: passes over the input."""

BATCH_NORM_THREADS = 512
"""Threads of one block of those kernels (``MAX_BLOCK_SIZE`` in ``Normalization.cuh``): one
round of a block's loop moves one element per thread."""

BATCH_NORM_BLOCKS_PER_SM = 4
"""Blocks of 512 threads one SM holds at once (2,048 resident threads per SM on every NVIDIA
architecture since Maxwell but Turing's 1,024 and Ada/Ampere GeForce's 1,536, where it is
taken as the same: a bound on the waves, which matter only past 4 x SMs channels)."""


def batch_norm_serial_s(
    serial: SerialWork, sm_count: float | npt.NDArray[np.float64], round_s: float
) -> npt.NDArray[np.float64]:
    """Seconds of each operator's latency-bound loop: rounds x waves of blocks x the time of
    one round (``PerfParameters.batch_norm_round_s``, measured)."""
    waves = np.ceil(serial.blocks / (np.asarray(sm_count) * BATCH_NORM_BLOCKS_PER_SM))
    return np.asarray(serial.rounds * waves * round_s, dtype=np.float64)


ALIGNMENT_ELEMENTS = 8
"""16-bit tensor-core GEMMs run their fast kernels only when every dimension is a multiple of
8 elements (16 bytes): NVIDIA, "Matrix Multiplication Background User's Guide", *Tensor Core
Requirements* (docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication),
and Hopper's TMA copies need 16-byte-aligned strides (CUDA C++ Programming Guide, *Tensor
Memory Access*). For convolutions the same holds for the channel counts (NVIDIA, "Convolutional
Layers User's Guide", *Channels In And Out*)."""


def misaligned_matrix(dims: list[int]) -> bool:
    """Whether a 16-bit matrix operator with these dimensions (M, N, K of a GEMM; channels in
    and out of a convolution) misses the tensor cores' 16-byte alignment
    (``ALIGNMENT_ELEMENTS``): GPT-2's 50,257-token vocabulary makes its language-model head
    such a GEMM, which is why nanoGPT pads it to 50,304 (karpathy/nanoGPT, model.py)."""
    return any(d % ALIGNMENT_ELEMENTS for d in dims if d > 1)


BATCH_NORM_OPS = (
    "aten.native_batch_norm",
    "aten.native_batch_norm_backward",
    "aten._native_batch_norm_legit",
    "aten._native_batch_norm_legit_functional",
    "aten.cudnn_batch_norm",
    "aten.cudnn_batch_norm_backward",
    "aten.batch_norm_backward",
)
"""Batch norm in training reads its inputs twice: once to reduce the batch statistics, once to
normalize (forward: ``batch_norm_collect_statistics_kernel`` then
``batch_norm_transform_input_kernel``; backward: ``batch_norm_backward_reduce_kernel`` then
``batch_norm_backward_elemt_kernel``, in PyTorch's ``aten/src/ATen/native/cuda/Normalization.cuh``;
cuDNN's kernels make the same two passes). The traced bytes count each input once, so the
op table adds one more read of them."""

LAYER_NORM_BACKWARD_OPS = ("aten.native_layer_norm_backward",)
"""Layer norm's backward reads its inputs twice: ``layer_norm_grad_input_kernel`` reads the
output gradient and the input for the input gradient, then ``GammaBetaBackward…Kernel`` reads
both again for the weight and bias gradients (PyTorch
``aten/src/ATen/native/cuda/layer_norm_kernel.cu``, ``LayerNormBackwardKernelImplInternal``).
Its forward (``vectorized_layer_norm_kernel``, Welford statistics of a row held in registers)
reads its input once."""

LOG_SOFTMAX_OPS = ("aten._log_softmax",)
"""Log-softmax over a row of more than 1,024 elements (a language model's vocabulary) runs
``cunn_SoftMaxForward``, which reads the row three times: its maximum, the sum of
exponentials, then the output (PyTorch ``aten/src/ATen/native/cuda/SoftMax.cu``; the
shared-memory variant that reads once needs the row in 48 KiB and a length divisible by the
vector width, which no vocabulary here meets, e.g. GPT-2's 50,257 fp32 logits, 196 KiB). Rows
of up to 1,024 elements (ImageNet's 1,000 classes) take the persistent kernel that reads once,
but those tensors are kilobytes, so one rule serves."""

LOG_SOFTMAX_BACKWARD_OPS = ("aten._log_softmax_backward_data",)
"""Its backward, ``cunn_SoftMaxBackward``, reads the output gradient twice (its sum, then the
input gradient) and the output once (same file): one more read of half its traced inputs."""

EXTRA_READS: dict[str, float] = {
    **dict.fromkeys(BATCH_NORM_OPS, 1.0),
    **dict.fromkeys(LAYER_NORM_BACKWARD_OPS, 1.0),
    **dict.fromkeys(LOG_SOFTMAX_OPS, 2.0),
    **dict.fromkeys(LOG_SOFTMAX_BACKWARD_OPS, 0.5),
}
"""Operators whose kernels read their inputs more than once: how many more reads, as a
multiple of the traced input bytes (the tracer counts each operand once)."""


def layout_bytes(conv: list[int], backward: bool) -> float:
    """Extra bytes of a 16-bit convolution on NCHW tensors (PyTorch's default layout, which
    the traced models use): tensor-core convolutions work on NHWC, so cuDNN transposes the
    activations it reads into NHWC and what it writes back to NCHW, one read and one write of
    each (NVIDIA, "Convolutional Layers User's Guide", *Tensor Layouts In Memory: NCHW vs
    NHWC*: NCHW inputs cost an automatic transpose; PyTorch's *channels last* tutorial). The
    forward moves the input and the output; the backward the input, the output gradient and
    the input gradient. ``conv`` is ``OpRecord.conv`` (N, C_in, spatial…, C_out, kernel…,
    stride, groups); elements of 2 bytes."""
    x, y = _conv_sizes(conv)
    moved = 2 * x + y if backward else x + y
    return 2 * 2 * moved


def _conv_sizes(conv: list[int]) -> tuple[float, float]:
    """Elements of a convolution's input and of its output (``OpRecord.conv``)."""
    spatial = (len(conv) - 5) // 2
    batch, c_in, c_out, stride = conv[0], conv[1], conv[2 + spatial], max(1, conv[-2])
    sizes = conv[2 : 2 + spatial]
    x = batch * c_in * float(np.prod(sizes))
    y = batch * c_out * float(np.prod([-(-s // stride) for s in sizes]))
    return x, y


def backward_split_bytes(
    conv: list[int], element_bytes: int, transposed: bool, written_bytes: float
) -> float:
    """Extra bytes of a convolution's backward that computes both gradients: it is two
    kernels, not one. PyTorch's ``convolution_backward`` on cuDNN runs the data gradient and
    the weight gradient as separate calls (``aten/src/ATen/native/cudnn/ConvShared.cpp``:
    ``cudnn_convolution_backward_input`` and ``cudnn_convolution_backward_weight``, cuDNN's
    ``BackwardData`` and ``BackwardFilter`` operations, each its own implicit GEMM), and each
    reads the output gradient dY: one more read of dY than the traced operands count. On NCHW
    16-bit tensors (``transposed``) each call also transposes dY to NHWC itself, one more read
    and write of it than ``layout_bytes`` counts. A backward that computes only the weight
    gradient (the first layer, whose input needs none: ``written_bytes`` below the input's
    size) is one kernel and moves nothing more."""
    x, y = _conv_sizes(conv)
    if written_bytes < x * element_bytes:
        return 0.0
    return element_bytes * y * (3.0 if transposed else 1.0)


def read_experts(table: OpTable, share: float) -> OpTable:
    """``table`` with its mixture-of-experts operators (``is_experts``) moving ``share`` of
    their bytes: the experts the step's tokens are routed to (``serving.experts_read_share``).
    Their bytes are the experts' weights where few tokens pass (a decode step), so the whole
    count is scaled; their FLOPs, counted for the routed tokens only, are unchanged."""
    if table.is_experts is None or share >= 1.0 or not table.is_experts.any():
        return table
    scale = np.where(table.is_experts, share, 1.0)
    return replace(table, bytes_moved=table.bytes_moved * scale)


def quantize_weights(
    table: OpTable,
    tokens: int,
    weight_ratio: float,
    head_elements: int,
    head_tokens: int,
    bandwidth_ratio: float = 1.0,
) -> OpTable:
    """``table`` with its weight products (``gemm`` rows) reading their weights at
    ``weight_ratio`` of their 16-bit bytes: quantized weights, widened inside the kernel, so
    the FLOPs and the rate stay. Each row runs ``tokens`` tokens through a K x N weight, so
    its FLOPs are 2 x tokens x K x N and its 16-bit weight bytes 2 x K x N = FLOPs / tokens.
    The kernel streams them at ``bandwidth_ratio`` of a 16-bit product's bandwidth, counted
    as that many more bytes at the same bandwidth. The output head (K x N =
    ``head_elements``: hidden x vocabulary, run on ``head_tokens``, the last position of each
    sequence) stays 16-bit, as the quantizers leave it. A mixture of experts' expert rows
    (``is_experts``) count every expert's weights for the tokens routed to a few, so their
    bytes, nearly all weights, are taken as the weights."""
    gemm = np.array([kind == "gemm" for kind in table.kinds], dtype=bool)
    head = np.isclose(table.flops / (2 * max(head_tokens, 1)), float(head_elements), rtol=1e-9)
    gemm &= ~head
    weight = np.minimum(table.flops / max(tokens, 1), table.bytes_moved)
    if table.is_experts is not None:  # a layer's experts: every expert's weights, few tokens
        weight = np.where(table.is_experts, table.bytes_moved, weight)
    stored = weight * weight_ratio / bandwidth_ratio
    return replace(
        table, bytes_moved=np.where(gemm, table.bytes_moved - weight + stored, table.bytes_moved)
    )


def split_work(table: OpTable, parts: int, attention_bytes_share: float | None = None) -> OpTable:
    """``table`` as one of ``parts`` GPUs runs it in tensor parallel: every operator, with
    1/``parts`` of its FLOPs and bytes (each GPU still launches every kernel). Attention
    operators move ``attention_bytes_share`` of their bytes instead (default 1/``parts``):
    their reads are the keys and values, and a GPU reads the KV heads it holds, which is more
    than 1/``parts`` where GQA has fewer KV heads than GPUs (``serving.kv_heads_on_one_gpu``)."""
    share = 1 / parts if attention_bytes_share is None else attention_bytes_share
    attention = np.array([kind == "attention" for kind in table.kinds], dtype=bool)
    bytes_share = np.where(attention, share, 1 / parts)
    return replace(table, flops=table.flops / parts, bytes_moved=table.bytes_moved * bytes_share)


def split_tokens(table: OpTable, parts: int) -> OpTable:
    """``table`` as one of ``parts`` GPUs runs it in context parallel, each with 1/``parts``
    of every sequence's tokens: the forward and backward passes' operators with 1/``parts``
    of their FLOPs and bytes (attention's too: balanced causal chunks give each GPU an equal
    share of the score blocks), the optimizer's whole (each GPU holds the whole model state);
    each GPU still launches every kernel. The weights a matrix product reads are divided with
    the rest, which is exact where the product is bound by its FLOPs, as at the lengths
    context parallel is used for."""
    return _divide_phases(table, ("forward", "backward"), parts)


def peak_limited_s(
    table: OpTable, rates: GpuRates, precision: Precision, engines: tuple[Any, Any] | None = None
) -> float:
    """The step at 100 % of every peak: each operator at its engine's FLOP rate or at the
    DRAM bandwidth, whichever is slower, and no launch cost. No real step is faster, so no
    speed factor may take a prediction below it."""
    peak, _ = engines or matrix_engines(table, rates, precision, 1.0)
    compute = np.where(table.is_matrix, table.flops / peak, 0.0)
    memory = table.bytes_moved / rates.bandwidth_bytes_per_s
    return float((np.maximum(compute, memory) * table.weights).sum())


SHARDED_OPTIMIZER = ("zero1", "zero2", "zero3", "fsdp", "hsdp")
"""Data-parallel shardings whose GPUs each update only their shard of the parameters: ZeRO
partitions the optimizer state (stage 1 onwards) so that "each data parallel process only
updates its partition" (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", SC'20, arXiv 1910.02054, section 5.1); FSDP's optimizer steps the
local flat-parameter shards (Zhao et al., "PyTorch FSDP", VLDB 2023, arXiv 2304.11277); HSDP
steps the shard of its node's shard group (``data_parallel.shard_group``)."""
EXCHANGE_EACH_MICRO_STEP = ("zero2", "zero3", "fsdp", "hsdp")
"""Data-parallel shardings that keep only their shard of the gradients, so that each
micro-step of gradient accumulation reduce-scatters its gradients (ZeRO-3/FSDP gather the
parameters again too); DDP (``no_sync``) and ZeRO-1, whose gradients stay whole, reduce them
once a step, behind the last micro-step's backward."""


def shard_optimizer(table: OpTable, parts: int) -> OpTable:
    """``table`` as one of ``parts`` GPUs runs it when the optimizer state is sharded
    (``SHARDED_OPTIMIZER``): the optimizer's operators with 1/``parts`` of their FLOPs and
    bytes (each GPU still launches them); the rest unchanged."""
    return _divide_phases(table, ("optimizer",), parts)


def _divide_phases(table: OpTable, phases: tuple[str, ...], parts: int) -> OpTable:
    """``table`` with the FLOPs and bytes of the operators of ``phases`` divided by ``parts``
    (``table`` itself for one part)."""
    if parts <= 1:
        return table
    share = np.where(np.isin(table.phases, phases), 1 / parts, 1.0)
    return replace(table, flops=table.flops * share, bytes_moved=table.bytes_moved * share)


def restrict(table: OpTable, phases: tuple[str, ...]) -> OpTable:
    """The operators of ``table`` that run in ``phases``."""
    rows = np.flatnonzero(np.isin(table.phases, phases))
    return select_rows(table, rows, None if table.counts is None else table.counts[rows])


@dataclass(frozen=True)
class GpuRates:
    """What the model needs of a GPU, in SI units per second."""

    tensor_flops_per_s: float | None
    """FP16 tensor peak with FP32 accumulate (None: no tensor cores)."""
    bf16_tensor_flops_per_s: float | None
    """BF16 tensor peak (None: no BF16 tensor cores)."""
    tf32_flops_per_s: float | None
    """TF32 tensor peak (None: no TF32)."""
    vector_flops_per_s: float
    """FP32 vector peak."""
    bandwidth_bytes_per_s: float
    """DRAM bandwidth."""
    sm_count: int
    """Streaming multiprocessors (compute units)."""
    fp8_tensor_flops_per_s: float | None = None
    """FP8 tensor peak, dense (None: no fp8 tensor cores); fp8 training's GEMMs
    (``estimate.fp8``)."""
    attention_rate_share: float = 1.0
    """The share of the tensor rate the software's fused attention kernels reach here against
    a kernel written for this GPU (``SoftwareStack.hopper_attention_percent`` on Hopper; 1
    elsewhere)."""
    tensor_power_share: float = 1.0
    """The share of its tensor peaks the card sustains under its power limit: where the catalog
    has a measured sustained matrix rate (``GpuSpec.sustained_tensor_tflops``), that rate over
    the fitted tensor efficiency x the 16-bit peak, at most 1; 1 elsewhere."""


def gpu_rates(gpu: GpuSpec, software: SoftwareStack | None = None) -> GpuRates:
    """The catalog figures the model uses, of one device (``GpuSpec.one_device``: what one
    process runs on), under ``software`` (None: kernels written for the GPU); ``UsageError``
    naming what is missing."""
    gpu = gpu.one_device()
    missing = [
        name
        for name in ("fp32_tflops", "memory_bandwidth_gbps", "sm_count")
        if getattr(gpu, name) is None
    ]
    if missing:
        raise MissingRates(
            f"{gpu.name} lacks {', '.join(missing)} in the catalog; its speed cannot be predicted.",
            tuple(missing),
        )
    assert gpu.fp32_tflops is not None and gpu.memory_bandwidth_gbps is not None
    assert gpu.sm_count is not None

    def rate(tflops: float | None) -> float | None:
        return None if tflops is None else tflops_to_flops(tflops)

    return GpuRates(
        tensor_flops_per_s=rate(gpu.fp16_tensor_tflops),
        bf16_tensor_flops_per_s=rate(gpu.bf16_tensor_tflops),
        tf32_flops_per_s=rate(gpu.tf32_tensor_tflops),
        vector_flops_per_s=tflops_to_flops(gpu.fp32_tflops),
        bandwidth_bytes_per_s=gpu.memory_bandwidth_gbps * GB,
        sm_count=gpu.sm_count,
        fp8_tensor_flops_per_s=rate(gpu.fp8_tensor_tflops),
        attention_rate_share=_attention_rate_share(gpu, software),
        tensor_power_share=_tensor_power_share(gpu),
    )


def _tensor_power_share(gpu: GpuSpec) -> float:
    """``GpuRates.tensor_power_share``: the measured sustained 16-bit matrix rate against what
    the model would reach at the datasheet peak (the fitted tensor efficiency x the peak), so
    that its large GEMMs run at the measured rate; 1 without a measurement or above it."""
    peak = gpu.fp16_tensor_tflops or gpu.bf16_tensor_tflops
    if gpu.sustained_tensor_tflops is None or not peak:
        return 1.0
    return min(1.0, gpu.sustained_tensor_tflops / (load_parameters().tensor_efficiency * peak))


def _attention_rate_share(gpu: GpuSpec, software: SoftwareStack | None) -> float:
    """``GpuRates.attention_rate_share`` of ``gpu`` under ``software``: the stack's Hopper
    figure on compute capability 9.x, 1 on every other GPU (no figure is known there)."""
    hopper = (gpu.compute_capability or "").split(".")[0] == "9"
    return software.hopper_attention_percent / 100 if software and hopper else 1.0


def matrix_engines(
    table: OpTable,
    rates: GpuRates,
    precision: Precision,
    misaligned_efficiency: float | None = None,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Per operator: the peak FLOP/s of the engine it runs on, and whether that is a tensor core.

    Half-precision matrix operators use the tensor cores of the run's half dtype (FP16 for
    ``fp16``, BF16 otherwise) where the GPU has them; otherwise (Pascal and older; BF16 before
    Ampere) PyTorch's kernels compute in FP32 on the vector units. FP32 matrix operators use
    TF32 tensor cores only under ``--precision tf32``, and only where they are faster than the
    FP32 units (not on GeForce Ampere and Ada, which rate both the same).

    A 16-bit matrix operator with a dimension off the 16-byte alignment (``table.misaligned``)
    reaches ``misaligned_efficiency`` of its tensor rate (default: the shipped constant). A
    fused attention operator reaches ``rates.attention_rate_share`` of its engine's rate (its
    kernel's instructions against the GPU's: Ampere's on Hopper run at about half). Every
    tensor-core operator runs at ``rates.tensor_power_share`` of its peak (a card that cannot
    hold its boost clock under its power limit).
    """
    n = len(table.kinds)
    peak = np.full(n, rates.vector_flops_per_s)
    tensor = np.zeros(n, dtype=bool)
    # The half-precision operators of a step are those autocast (or cast) to the run's half
    # dtype, so the precision names their engine: a bf16 profile answers an fp16 run too (the
    # same operators and bytes), and runs on the fp16 tensor rate.
    half_rate = rates.tensor_flops_per_s if precision == "fp16" else rates.bf16_tensor_flops_per_s
    if half_rate is not None:
        peak[table.is_half] = half_rate
        tensor[table.is_half] = True
        if table.misaligned is not None:
            share = (
                _shipped_misaligned_efficiency()
                if misaligned_efficiency is None
                else misaligned_efficiency
            )
            peak[table.misaligned & table.is_half] *= share
    # fp8 training's linear GEMMs (``estimate.fp8``) run on the fp8 tensor cores
    fp8 = np.array([d.startswith("float8") for d in table.dtypes], dtype=bool)
    if rates.fp8_tensor_flops_per_s is not None and fp8.any():
        peak[fp8] = rates.fp8_tensor_flops_per_s
        tensor[fp8] = True
    if rates.attention_rate_share != 1.0:
        attention = np.array([kind == "attention" for kind in table.kinds], dtype=bool)
        peak[attention & tensor] *= rates.attention_rate_share
    tf32 = rates.tf32_flops_per_s
    # GeForce Ampere and Ada rate TF32 at their FP32 rate: no faster engine, so the FP32 one
    if precision == "tf32" and tf32 is not None and tf32 > rates.vector_flops_per_s:
        peak[table.is_fp32] = tf32
        tensor[table.is_fp32] = True
    if rates.tensor_power_share != 1.0:
        peak[tensor] *= rates.tensor_power_share
    return peak, tensor


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one step, and where it goes."""

    step_time_s: float
    """Sum of the operator times."""
    matrix_s: float
    """Time of operators bound by matrix-engine throughput."""
    memory_s: float
    """Time of operators bound by DRAM bandwidth."""
    launch_s: float
    """Time of operators bound by the host's dispatch (too small to fill the GPU)."""
    phase_s: dict[str, float]
    """Time by phase of the step (``backward``: what a data-parallel exchange can hide behind;
    ``prefill`` and ``decode`` of an inference step)."""
    flops: float
    """FLOPs of the step."""
    tensor_flops_share: float
    """Share of the FLOPs that run on tensor cores."""


def operator_times(
    flops: npt.NDArray[np.float64],
    bytes_moved: npt.NDArray[np.float64],
    is_matrix: npt.NDArray[np.bool_],
    engine: tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]],
    rates: tuple[Rate, Rate, Rate],
    params: PerfParameters,
    serial: SerialWork | None = None,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per operator: its time (the larger of compute, memory and the launch floor), its
    compute time and its memory time, in seconds.

    ``engine`` is each operator's matrix-engine peak (FLOP/s) and whether that is a tensor
    core; ``rates`` is the GPU's FP32 vector peak (FLOP/s), DRAM bandwidth (B/s) and SM count,
    each a number or an array with one entry per operator (the fit stacks many GPUs' operators
    into one table). ``serial``: the native bf16 batch norms' latency-bound loops, whose time
    is their memory time (``batch_norm_serial_s``; added to the streaming pass that follows
    the forward's).
    """
    peak, tensor = engine
    vector_peak, bandwidth, sm_count = rates
    efficiency = np.where(tensor, params.tensor_efficiency, params.vector_efficiency)
    work_per_sm = flops / sm_count
    ramp = work_per_sm / (work_per_sm + params.half_work_flops_per_sm)
    with np.errstate(divide="ignore", invalid="ignore"):
        matrix_time = np.where(is_matrix & (flops > 0), flops / (peak * efficiency * ramp), 0.0)
    vector_time = np.where(~is_matrix, flops / (vector_peak * params.vector_efficiency), 0.0)
    compute = np.maximum(matrix_time, vector_time)
    memory = bytes_moved / (bandwidth * params.memory_efficiency)
    if serial is not None and params.batch_norm_round_s > 0:
        loop = batch_norm_serial_s(serial, sm_count, params.batch_norm_round_s)
        memory = np.where(serial.then_streams, memory + loop, np.maximum(memory, loop))
    return np.maximum(np.maximum(compute, memory), params.launch_s), compute, memory


def step_time(
    table: OpTable,
    rates: GpuRates,
    precision: Precision,
    params: PerfParameters,
    engines: tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]] | None = None,
) -> StepTime:
    """The predicted step time of ``table`` on a GPU with ``rates``.

    ``engines`` is ``matrix_engines(table, rates, precision)`` when the caller has it.
    """
    engines = engines or matrix_engines(table, rates, precision, params.misaligned_efficiency)
    matrix = table.is_matrix
    each, compute, memory = operator_times(
        table.flops,
        table.bytes_moved,
        matrix,
        engines,
        (rates.vector_flops_per_s, rates.bandwidth_bytes_per_s, rates.sm_count),
        params,
        serial_work(table, precision),
    )
    weights = table.weights
    times = each * weights
    bound_compute = (compute >= memory) & (compute >= params.launch_s)
    bound_memory = (memory > compute) & (memory >= params.launch_s)
    bound_launch = ~(bound_compute | bound_memory)
    total_flops = float((table.flops * weights).sum())
    tensor_flops = float((table.flops * weights)[engines[1] & matrix].sum())
    return StepTime(
        step_time_s=float(times.sum()),
        matrix_s=float(times[bound_compute].sum()),
        memory_s=float(times[bound_memory].sum()),
        launch_s=float(times[bound_launch].sum()),
        phase_s={str(ph): float(times[table.phases == ph].sum()) for ph in set(table.phases)},
        flops=total_flops,
        tensor_flops_share=tensor_flops / total_flops if total_flops else 0.0,
    )


def peak_flops_per_s(rates: GpuRates, precision: Precision) -> float:
    """The peak a step at ``precision`` is measured against (for MFU)."""
    if precision in ("fp16",) and rates.tensor_flops_per_s:
        return rates.tensor_flops_per_s
    # fp8 training is measured against the bf16 peak, as its MFU is usually reported
    if precision in ("bf16", "bf16-pure", "fp8") and rates.bf16_tensor_flops_per_s:
        return rates.bf16_tensor_flops_per_s
    if precision == "tf32" and rates.tf32_flops_per_s:
        return rates.tf32_flops_per_s
    return rates.vector_flops_per_s


def error_band(
    params: PerfParameters, workload: str, family: str, *, calibrated: bool = False
) -> float:
    """Relative half-width of the band of a prediction of ``workload`` (of ``family``):
    ``calibrated``, of one corrected by a measurement on another GPU; else of a new GPU for a
    workload with its own speed factor, of a new workload for any other."""
    kind = workload_type(family)
    if calibrated:
        bands = params.calibrated_error_bands
    elif workload in params.workload_factors:
        bands = params.error_bands
    else:
        bands = params.unseen_error_bands
    bands = bands or params.error_bands
    return bands.get(kind, bands["default"])


def error_band_basis(params: PerfParameters, workload: str, *, calibrated: bool = False) -> str:
    """Which validation ``error_band`` takes its band from, in words."""
    if calibrated:
        return "model left out, calibrated on one measured GPU"
    if workload in params.workload_factors:
        return "leave one GPU out"
    return "leave one model out"


def workload_type(family: str) -> str:
    """``vision`` or ``language`` (or ``default``) for the error bands."""
    if family in ("vision", "seed_detection", "seed_gan", "seed_nasnet", "diffusion"):
        return "vision"
    if family in ("llm", "encoders", "seed_translation"):
        return "language"
    return "default"
