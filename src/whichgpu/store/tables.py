"""Lambda-style tables of stored results: ``pivot_results`` arranges them as rows of workload
settings and columns of devices (``device_label``), the newest result per cell, with
throughputs relative to a reference device (``ResultPivot``, ``PivotRow``, ``PivotCell``).
"""

from __future__ import annotations

import builtins
from collections import defaultdict
from collections.abc import Iterable, Sequence

from whichgpu.errors import UsageError
from whichgpu.schema import BenchResult
from whichgpu.store.records import _Record, _utc_text


class PivotCell(_Record):
    """One workload on one device in the Lambda-style tables: the newest result for it."""

    result_id: str
    """Id of the result shown."""
    batch_size: int
    """Batch per device the throughput was measured at."""
    max_batch_size: int | None
    """Largest batch that ran, when it was searched."""
    throughput: float | None
    """Units per second over all devices of the run (None if the run did not fit)."""
    relative_throughput: float | None
    """Throughput over the reference device's in the same row (None without one)."""
    results: int
    """Stored results for this workload and device; the newest is shown."""


class PivotRow(_Record):
    """One workload setting across devices: the run options that change the speed (mode,
    method, precision, sequence length, optimizer, checkpointing) are the same in a row."""

    workload: str
    """Workload measured."""
    mode: str
    """``train`` or ``inference``."""
    method: str
    """``full``, ``lora`` or ``qlora``."""
    precision: str
    """Precision of the runs."""
    seq_len: int | None
    """Tokens per sequence (sequence models)."""
    optimizer: str
    """Optimizer of the runs."""
    checkpointing: bool
    """Whether the runs used gradient checkpointing."""
    throughput_unit: str
    """Unit of the throughputs (``images/s`` …)."""
    cells: dict[str, PivotCell]
    """Per device label (see ``device_label``), the devices this row was measured on."""

    @property
    def label(self) -> str:
        """The setting in words: workload and precision, then what differs from a full AMP
        training run with AdamW (``llama-3.1-8b bf16 qlora seq 2048 checkpointing``)."""
        words = [self.workload, self.precision]
        if self.method != "full":
            words.append(self.method)
        if self.mode != "train":
            words.append(self.mode)
        if self.seq_len:
            words.append(f"seq {self.seq_len}")
        if self.mode == "train" and self.optimizer != "adamw":
            words.append(self.optimizer)
        if self.checkpointing:
            words.append("checkpointing")
        return " ".join(words)


class ResultPivot(_Record):
    """Results arranged as Lambda's tables: rows of workloads, columns of devices."""

    devices: tuple[str, ...]
    """Column labels (see ``device_label``): the reference, then by name and device count."""
    rows: tuple[PivotRow, ...]
    """One per workload setting, by name."""
    reference: str | None
    """Device the relative throughputs are divided by (None when nothing has a throughput)."""
    reference_chosen: bool
    """Whether the caller named the reference (else it is the device measured most)."""
    notes: tuple[str, ...]
    """What the reader should know (newest-result rule, rows without the reference)."""


def device_label(result: BenchResult) -> str:
    """How tables name a result's device: its catalog id (else the name the device reports),
    prefixed ``Nx`` for a run on N devices."""
    base = result.gpu or result.device_name
    return f"{result.n_gpus}x {base}" if result.n_gpus > 1 else base


def _newest(results: Sequence[BenchResult]) -> BenchResult:
    return max(results, key=lambda r: (_utc_text(r.created_at), r.id))


def _pick_reference(reference: str, names: dict[str, set[str]], n_gpus: dict[str, int]) -> str:
    """The device column a user's reference names: exact (any of its names), else a part."""
    key = reference.strip().casefold()
    for matches in (
        [d for d, known in names.items() if key in known],
        [d for d, known in names.items() if any(key in name for name in known)],
    ):
        if len(matches) == 1:
            return matches[0]
        single = [d for d in matches if n_gpus[d] == 1]
        if len(single) == 1:
            return single[0]
        if matches:
            raise UsageError(
                f"The reference '{reference}' matches several measured devices: "
                f"{', '.join(sorted(matches))}. Name one of them."
            )
    listed = ", ".join(sorted(names)) or "none"
    raise UsageError(
        f"No measured device matches the reference '{reference}'. Devices with results: {listed}."
    )


_Setting = tuple[str, str, str, str, int, str, bool]
"""A pivot row's key: workload, mode, method, precision, sequence length (0: none), optimizer,
checkpointing."""


def pivot_results(results: Iterable[BenchResult], reference: str | None = None) -> ResultPivot:
    """Arrange results as Lambda's tables: per workload setting and device, the newest result's
    largest batch, throughput, and throughput relative to ``reference``.

    A row is a workload at one mode, method, precision, sequence length, optimizer and
    checkpointing setting; a column is a device (see ``device_label``). Where a workload was
    measured several times on a device, the newest result is used and the notes say so.
    ``reference`` is matched against the devices' labels, catalog ids and reported names
    (ignoring case; a unique part will do, and a single-GPU device wins over multi-GPU runs of
    it); without one, the device with the most measured throughputs is the reference (on a
    tie, the one with fewer devices, then by name). Raises
    ``UsageError`` when ``reference`` matches no device, or several.
    """
    groups: dict[_Setting, dict[str, builtins.list[BenchResult]]]
    groups = defaultdict(lambda: defaultdict(builtins.list))
    names: dict[str, set[str]] = defaultdict(set)
    n_gpus: dict[str, int] = {}
    bases: dict[str, str] = {}
    for r in results:
        label = device_label(r)
        run = r.run
        setting = (
            r.workload,
            run.mode,
            run.method,
            r.precision,
            r.seq_len or 0,
            run.optimizer,
            run.checkpointing,
        )
        groups[setting][label].append(r)
        names[label] |= {label.casefold(), r.device_name.casefold()}
        if r.gpu:
            names[label].add(r.gpu.casefold())
        n_gpus[label] = r.n_gpus
        bases[label] = r.gpu or r.device_name
    newest = {key: {d: _newest(rs) for d, rs in cells.items()} for key, cells in groups.items()}

    chosen = reference is not None
    if reference is not None:
        ref: str | None = _pick_reference(reference, names, n_gpus)
    else:
        measured: dict[str, int] = defaultdict(int)
        for cells in newest.values():
            for d, r in cells.items():
                if r.throughput:
                    measured[d] += 1
        ref = min(measured, key=lambda d: (-measured[d], n_gpus[d], d)) if measured else None

    rows: builtins.list[PivotRow] = []
    repeated: builtins.list[str] = []
    missing_ref = 0
    for key in sorted(newest):
        workload, mode, method, precision, seq_len, optimizer, checkpointing = key
        cells = newest[key]
        ref_result = cells.get(ref) if ref is not None else None
        base = ref_result.throughput if ref_result is not None else None
        if ref is not None and not base:
            missing_ref += 1
        row_cells: dict[str, PivotCell] = {}
        for d in sorted(cells):
            r = cells[d]
            count = len(groups[key][d])
            if count > 1:
                repeated.append(f"{workload} {precision} on {d} ({count} results)")
            row_cells[d] = PivotCell(
                result_id=r.id,
                batch_size=r.batch_size,
                max_batch_size=r.max_batch_size,
                throughput=r.throughput,
                relative_throughput=(
                    r.throughput / base if r.throughput is not None and base else None
                ),
                results=count,
            )
        first = next(iter(cells.values()))
        rows.append(
            PivotRow(
                workload=workload,
                mode=mode,
                method=method,
                precision=precision,
                seq_len=seq_len or None,
                optimizer=optimizer,
                checkpointing=checkpointing,
                throughput_unit=first.throughput_unit,
                cells=row_cells,
            )
        )

    notes: builtins.list[str] = []
    if repeated:
        notes.append("Measured more than once, the newest result used: " + "; ".join(repeated[:8]))
        if len(repeated) > 8:
            notes[-1] += f"; and {len(repeated) - 8} more"
    if ref is not None and missing_ref:
        notes.append(
            f"{missing_ref} of {len(rows)} rows have no throughput on {ref}, so no relative "
            "throughput"
        )
    devices = sorted(names, key=lambda d: (d != ref, bases[d], n_gpus[d]))
    return ResultPivot(
        devices=tuple(devices),
        rows=tuple(rows),
        reference=ref,
        reference_chosen=chosen,
        notes=tuple(notes),
    )
