"""Measurements on an NVIDIA H200 (2026-11-26 and 2026-11-27, an independent training loop)
against ``fit`` and ``predict`` of the same runs.

The data (``data/measured/h200-2026-11*/groundtruth.jsonl``, provenance in the READMEs beside
them) are training steps of whichgpu's workloads measured by a plain PyTorch loop written for
the check, not by whichgpu's harness: peak allocated and reserved bytes, the memory NVML saw in
use, the mean step time, and largest batches found by a search exact to 1. The second session
ran the loop's cases the first had not reached (GPT-2 XL, Llama 3.2 3B in AMP, pure bf16 and
LoRA, BERT-Large fine-tuning for sequence classification, two more largest batches). Each run is
asked of ``fit`` and ``predict`` for the catalog's ``h200-sxm`` with the run's precision,
batch, sequence length and checkpointing (the mapping the measurements were first compared
with). Errors are ``predicted / measured - 1``; a speed error is ``measured step time /
predicted - 1`` (positive: predicted faster).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from whichgpu.errors import WhichGpuError
from whichgpu.schema import ReferenceMemoryCase, ReferenceThroughputCase, RunConfig
from whichgpu.validate.timing import UNFIT_NOTE, fit_options, predict_even_if_unfit
from whichgpu.workloads import run_config

SOURCE = "h200-2026-11"
"""The reference's id in ``validate`` results."""

GPU = "h200-sxm"
"""The catalog GPU measured: one H200 SXM (132 SMs, 60 MiB L2; README)."""

DATA_DIRS = (("measured", "h200-2026-11"), ("measured", "h200-2026-11-27"))
"""Folders of the measurements, under ``validate/data``: one per session on the GPU."""

DATA_FILE = "groundtruth.jsonl"
"""One JSON object per line: the environment (``"case": "env"``), then one per case."""

CUDNN_CASE = "resnet50 fp32 b64"
"""The case whose peaks cuDNN's algorithm search dominates (README: with ``cudnn.benchmark``
on a 141 GB card, workspaces a small card would not get)."""


@dataclass(frozen=True)
class H200Case:
    """One line of ``groundtruth.jsonl``: a run at a batch, or a largest-batch search."""

    case: str
    """The case's name in the file (``gpt2 bf16 s1024 b8``, ``max batch gpt2 bf16 s1024``)."""
    workload: str
    """The named workload whose shipped config the loop built, or the config file's stem."""
    run: RunConfig
    """The run (batch size None for a largest-batch search)."""
    peak_allocated_bytes: int | None = None
    """``torch.cuda.max_memory_allocated`` over 3 steps."""
    peak_reserved_bytes: int | None = None
    """``torch.cuda.max_memory_reserved`` over the same steps."""
    nvml_used_bytes: int | None = None
    """NVML's memory in use right after them (context included; current, not peak)."""
    step_s: float | None = None
    """Mean time of 10 steps after 3 warm-ups, s."""
    max_batch: int | None = None
    """The largest batch that ran two full steps (largest-batch cases)."""
    config: Path | None = None
    """The config file the loop built with a task head (``task`` in the file), shipped beside
    the measurements; None for a named workload."""
    task: str | None = None
    """That config's task (``seq-cls``: ``AutoModelForSequenceClassification``)."""
    session: str = "h200-2026-11"
    """The folder of the measurements (one per session on the GPU): the throughput fit uses
    the first session's cases only, so the second's are out of its sample."""

    @property
    def target(self) -> dict[str, Any]:
        """``api.fit`` / ``api.predict`` arguments naming what was measured."""
        if self.config is None:
            return {"workload": self.workload}
        return {"workload": None, "config": self.config, "task": self.task}


def _record_run(record: dict[str, Any]) -> RunConfig:
    """The run of one line: precision, batch, sequence length and checkpointing as measured."""
    options: dict[str, Any] = {"precision": record["precision"]}
    if record.get("batch") is not None and "max_batch" not in record:
        options["batch_size"] = int(record["batch"])
    if record.get("seq"):
        options["seq_len"] = int(record["seq"])
    if record.get("checkpointing"):
        options["checkpointing"] = True
    if record.get("method") == "lora":
        # peft's LoraConfig(r, target_modules) as the loop built it
        options.update(
            method="lora",
            lora_rank=int(record["lora_rank"]),
            lora_targets=tuple(record["lora_targets"]),
        )
    return run_config(**options)


def _data_folder(parts: tuple[str, ...]) -> Path:
    ref = resources.files("whichgpu.validate").joinpath("data")
    for part in parts:
        ref = ref.joinpath(part)
    return Path(str(ref))


def h200_cases() -> list[H200Case]:
    """Every measured case of the files, in file order (the environment lines left out)."""
    cases = []
    for parts in DATA_DIRS:
        folder = _data_folder(parts)
        for line in (folder / DATA_FILE).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if record["case"] == "env":
                continue
            task = record.get("task")
            cases.append(
                H200Case(
                    case=record["case"],
                    workload=record["config"],
                    run=_record_run(record),
                    peak_allocated_bytes=record.get("peak_allocated"),
                    peak_reserved_bytes=record.get("peak_reserved"),
                    nvml_used_bytes=record.get("nvml_used"),
                    step_s=record.get("step_s"),
                    max_batch=record.get("max_batch"),
                    config=None if task is None else folder / f"{record['config']}.json",
                    task=task,
                    session=parts[-1],
                )
            )
    return cases


def h200_memory(
    cases: list[H200Case] | None = None, progress: Callable[[str], None] | None = None
) -> list[ReferenceMemoryCase]:
    """``fit`` for the H200 of every case: the peaks at the measured batch, or the largest
    batch (default: every case shipped)."""
    from whichgpu.api import fit

    out = []
    for c in h200_cases() if cases is None else cases:
        if progress is not None:
            progress(c.case)
        base: dict[str, Any] = {
            "source": SOURCE,
            "case": c.case,
            "workload": c.workload,
            "gpu": GPU,
            "run": c.run,
        }
        try:
            (estimate,) = fit(**c.target, gpus=[GPU], **fit_options(c.run))
        except WhichGpuError as exc:
            out.append(ReferenceMemoryCase(**base, note=f"fit failed: {exc}"))
            continue
        if c.max_batch is not None:
            out.append(
                ReferenceMemoryCase(
                    **base,
                    measured_max_batch=c.max_batch,
                    predicted_max_batch=estimate.max_batch_size,
                    would_oom=estimate.max_batch_size > c.max_batch,
                    note="largest batch: a search exact to 1, two full steps per size",
                )
            )
            continue
        measured = c.peak_reserved_bytes
        note = ""
        if c.case == CUDNN_CASE:
            note = "cuDNN's algorithm search (cudnn.benchmark) makes this peak"
        out.append(
            ReferenceMemoryCase(
                **base,
                measured_allocated_bytes=c.peak_allocated_bytes,
                predicted_allocated_bytes=estimate.peak_allocated_bytes,
                measured_reserved_bytes=measured,
                predicted_reserved_bytes=estimate.peak_reserved_bytes,
                measured_device_bytes=c.nvml_used_bytes,
                predicted_device_bytes=estimate.device_total_bytes,
                reserved_error=(estimate.peak_reserved_bytes / measured - 1 if measured else None),
                note=note,
            )
        )
    return out


def h200_throughput(
    cases: list[H200Case] | None = None, progress: Callable[[str], None] | None = None
) -> list[ReferenceThroughputCase]:
    """``predict``'s step time on the H200 of every timed case (default: every case shipped)."""
    out = []
    for c in h200_cases() if cases is None else cases:
        if c.step_s is None or c.run.batch_size is None:
            continue
        if progress is not None:
            progress(c.case)
        base: dict[str, Any] = {
            "source": SOURCE,
            "case": c.case,
            "workload": c.workload,
            "gpu": GPU,
            "run": c.run,
            "quantity": "s/step",
            "measured": c.step_s,
        }
        try:
            estimate, fits = predict_even_if_unfit(
                c.target["workload"], GPU, c.run, c.target.get("config"), c.task
            )
        except WhichGpuError as exc:
            out.append(ReferenceThroughputCase(**base, predicted=None, note=str(exc)))
            continue
        step_s = estimate.step_time_s
        out.append(
            ReferenceThroughputCase(
                **base,
                predicted=step_s,
                error=None if step_s is None else c.step_s / step_s - 1,
                predicted_mfu=estimate.mfu,
                fits=fits,
                note="" if fits else UNFIT_NOTE,
            )
        )
    return out
