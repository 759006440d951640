"""How ``torch.compile`` changes a training step's time, as the roofline prices it.

A compiled step runs the non-matrix operators of its forward and backward passes
(elementwise, normalisation, reductions, copies and casts, the loss) as the few kernels
inductor fuses them into, each reading its inputs from DRAM once and writing only what leaves
it, where eager PyTorch runs one kernel per operator. ``trace.compiled`` finds those kernels
(AOTAutograd's min-cut partition of the step on fake tensors, grouped as inductor fuses it);
this module puts them in the step's operator table in place of the fusible operators
(``OpTable.fusible``), so each is timed like any operator: its bytes at the fitted memory
efficiency, never under the launch floor. Matrix products and attention are library kernels
in both and keep their eager time, except where the run's transformers builds a dense causal
mask under compilation (``SoftwareStack.compiled_causal_mask``): SDPA then computes every block
of the score matrix where eager's causal kernel skips the upper half, twice the work. The
optimizer step runs eager. Pure Python + numpy; the method and its validation:
docs/throughput.md, "torch.compile".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from whichgpu.estimate.throughput import FUSED_PHASES, OpTable, SerialWork, select_rows
from whichgpu.schema import GpuSpec, RunConfig, Vendor
from whichgpu.units import GB

TRITON_MIN_CAPABILITY = (7, 0)
"""The oldest NVIDIA GPU inductor compiles for: its kernels are Triton's, and torch raises
``GPUTooOldForTriton`` ("Triton only supports devices of CUDA Capability >= 7.0",
``torch/_inductor/exc.py``) on an older one."""


def compile_refusal(run: RunConfig, gpu: GpuSpec) -> str | None:
    """Why ``run``'s ``torch.compile`` cannot run on ``gpu`` (None: the run is not compiled, or
    it can, as far as known): an NVIDIA GPU older than ``TRITON_MIN_CAPABILITY``."""
    if not run.compile:
        return None
    device = gpu.one_device()
    capability = device.capability()
    if device.vendor != Vendor.NVIDIA or capability is None:
        return None
    if capability >= TRITON_MIN_CAPABILITY:
        return None
    return (
        f"{gpu.name} (compute capability {device.compute_capability}) cannot run torch.compile: "
        "inductor's kernels are Triton's, which need compute capability 7.0 or later (torch "
        "raises GPUTooOldForTriton); drop --compile"
    )


FUSED_KIND = "fused"
"""The operator kind of an inductor kernel in a compiled step's table."""
MASKED_ATTENTION_WORK = 2.0
"""Attention's work with a dense causal mask over eager's ``is_causal`` kernel: of n x n
blocks the causal kernel computes those on and below the diagonal, (n + 1) / 2n of them
(FlashAttention-2, arXiv 2307.08691, section 3.1.1), a masked one all and masks the scores:
2n / (n + 1), 2 for a long sequence (1.88 at 2,048 tokens in blocks of 128)."""


@dataclass(frozen=True)
class FusedKernels:
    """The kernels a compiled step's fusible operators run as, at one size of the step."""

    phases: tuple[str, ...]
    """``forward`` or ``backward``, per kernel."""
    bytes_moved: npt.NDArray[np.float64]
    """DRAM bytes each kernel reads and writes."""
    flops: npt.NDArray[np.float64]
    """Vector work of each (one operation per element per fused operator)."""

    def __post_init__(self) -> None:
        if not len(self.phases) == len(self.bytes_moved) == len(self.flops):
            raise ValueError("one phase, byte count and FLOP count per kernel")
        if any(phase not in FUSED_PHASES for phase in self.phases):
            raise ValueError(f"fused kernels run in {FUSED_PHASES} only")

    @property
    def total_bytes(self) -> float:
        """DRAM bytes of all the kernels."""
        return float(self.bytes_moved.sum())


def _fusible(table: OpTable) -> npt.NDArray[np.bool_]:
    """``table.fusible``; an error for a table that does not say (not from ``op_table``)."""
    if table.fusible is None:
        raise ValueError("the table does not say which operators a compiled step fuses")
    return table.fusible


def compiled_table(table: OpTable, kernels: FusedKernels, *, masked_attention: bool) -> OpTable:
    """``table``, an eager training step's operators, as the compiled step runs them: its
    fusible operators (``OpTable.fusible``) left out, ``kernels`` added as one row each
    (``FUSED_KIND``, no matrix engine), and with ``masked_attention`` the attention operators
    of the forward and backward passes counted ``MASKED_ATTENTION_WORK`` times."""
    kept_rows = np.flatnonzero(~_fusible(table))
    weights = table.weights[kept_rows]
    if masked_attention:
        attention = np.array([table.kinds[i] == "attention" for i in kept_rows], dtype=bool)
        compiled = np.isin(table.phases[kept_rows], FUSED_PHASES)
        weights = np.where(attention & compiled, weights * MASKED_ATTENTION_WORK, weights)
    kept = select_rows(table, kept_rows, weights)
    n = len(kernels.phases)
    half = bool(table.is_half[_fusible(table)].any())
    none = np.zeros(n, dtype=bool)
    return OpTable(
        kinds=kept.kinds + (FUSED_KIND,) * n,
        dtypes=kept.dtypes + (("bfloat16" if half else "float32"),) * n,
        flops=np.concatenate([kept.flops, kernels.flops]),
        bytes_moved=np.concatenate([kept.bytes_moved, kernels.bytes_moved]),
        units_per_step=table.units_per_step,
        batch_size=table.batch_size,
        seq_len=table.seq_len,
        is_matrix=np.concatenate([kept.is_matrix, none]),
        is_half=np.concatenate([kept.is_half, np.full(n, half)]),
        is_fp32=np.concatenate([kept.is_fp32, np.full(n, not half)]),
        phases=np.concatenate([kept.phases, np.array(kernels.phases, dtype=kept.phases.dtype)])
        if n
        else kept.phases,
        counts=np.concatenate([kept.weights, np.ones(n)]),
        is_experts=None if kept.is_experts is None else np.concatenate([kept.is_experts, none]),
        misaligned=None if kept.misaligned is None else np.concatenate([kept.misaligned, none]),
        serial=None
        if kept.serial is None
        else SerialWork.concat([kept.serial, SerialWork(np.zeros(n), np.zeros(n), none)]),
        fusible=np.concatenate([np.zeros(len(kept.kinds), dtype=bool), none]),
    )


def compiled_note(eager: OpTable, kernels: FusedKernels, *, masked: bool) -> str:
    """What the time of a compiled step assumes, with its numbers: ``eager``'s fusible operators
    and their bytes against ``kernels``."""
    fused = _fusible(eager)
    weights = eager.weights[fused]
    eager_gb = float((eager.bytes_moved[fused] * weights).sum()) / GB
    note = (
        f"torch.compile (inductor, default mode): the forward and backward passes' "
        f"{weights.sum():,.0f} non-matrix operators ({eager_gb:,.1f} GB of DRAM traffic in "
        f"eager) run as {len(kernels.phases):,} fused kernels "
        f"({kernels.total_bytes / GB:,.1f} GB; AOTAutograd's min-cut partition traced on fake "
        "tensors, grouped as inductor fuses), each timed as an operator (bytes at the fitted "
        "memory efficiency, the launch floor); matrix products, attention and the optimizer "
        "step as eager; no CUDA graphs"
    )
    if masked:
        note += (
            "; attention with a dense causal mask, as transformers before 5.18 builds it "
            "under torch.compile (this stack): every block computed, twice eager's causal work"
        )
    return note
