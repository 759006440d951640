"""The tasks a bench child process runs: inspect the device, probe a size, measure a step.

Each is a top-level function ``task(job, report)`` (so it pickles by name), run through
``probe.run_in_child``. They import nothing heavy themselves: a torch device imports torch
when it builds its session, the simulated device never does.
"""

from __future__ import annotations

import time

from whichgpu.bench.devices.protocol import Report, Session
from whichgpu.bench.environment import capture
from whichgpu.bench.jobs import (
    BenchProgress,
    Inspection,
    InspectJob,
    MeasureJob,
    Measurement,
    ProbeJob,
    ProbeReport,
)
from whichgpu.bench.nvml import NvmlSampler
from whichgpu.bench.timing import measure


def inspect_task(job: InspectJob, report: Report) -> Inspection:
    """Is the device there, and what machine and software run it?"""
    report(BenchProgress("inspect", f"looking at {job.device.spec}"))
    return capture(job.device, job.n_devices)


def probe_task(job: ProbeJob, report: Report) -> ProbeReport:
    """Build the step and run ``job.steps`` steps watching memory (``StepOutOfMemory`` when it
    does not fit)."""
    session = job.device.open_session(job.step, report)
    try:
        report(BenchProgress("probe", f"running {job.steps} steps at batch {job.step.batch_size}"))
        started = time.perf_counter()
        peaks = session.memory_steps(job.steps)
        seconds = time.perf_counter() - started
    finally:
        session.close()
    return ProbeReport(
        peak_allocated_bytes=peaks.allocated_bytes,
        peak_reserved_bytes=peaks.reserved_bytes,
        seconds=seconds,
    )


_RANK_SESSIONS: list[object] = []
"""The sessions of multi-GPU ranks, kept alive until the child process ends (from the fork
server it ends with ``os._exit``, running no destructors). Freeing a DDP model frees its
reducer and then the gloo process group, whose destructor joins gloo's worker thread while
holding the GIL; if that thread is still releasing its last work, which needs the GIL, the two
wait on each other for ever."""

MEMORY_STEPS = 2
"""Steps run first, watching memory (they count as warm-up)."""


def measure_task(job: MeasureJob, report: Report) -> Measurement:
    """Build the step; run two steps watching memory; warm up and time by ``job.rule`` while
    NVML samples; count one step's FLOPs."""
    session = job.device.open_session(job.step, report)
    try:
        return _measure(session, job, report)
    finally:
        _close(session, job)


def measure_ranks_task(job: MeasureJob, report: Report) -> tuple[Measurement, ...]:
    """``measure_task`` as one rank of a torchrun group (``job.step.group``, joined through
    ``env://``), then every rank's measurement gathered on rank 0: rank 0 returns them all,
    in rank order, the other ranks nothing."""
    from whichgpu.bench.session import TorchSession
    from whichgpu.errors import UsageError

    group = job.step.group
    if group is None:
        raise ValueError("measure_ranks_task needs the rank's group")
    session = job.device.open_session(job.step, report)
    try:
        if not isinstance(session, TorchSession):
            raise UsageError(
                f"--device {job.device.spec} cannot join a torchrun group: use cuda or cpu."
            )
        mine = _measure(session, job, report)
        report(BenchProgress("ranks", f"gathering the {group.world_size} ranks' figures"))
        gathered = session.gather(mine)
    finally:
        _close(session, job)
    if gathered is None:
        return ()
    return tuple(m for m in gathered if isinstance(m, Measurement))


def _close(session: Session, job: MeasureJob) -> None:
    session.close()
    if job.step.group is not None:
        _RANK_SESSIONS.append(session)


def _measure(session: Session, job: MeasureJob, report: Report) -> Measurement:
    """A built session's measurement (``measure_task``)."""
    rank = job.step.group.rank if job.step.group is not None else 0
    report(BenchProgress("warmup", "first steps (memory)"))
    session.memory_steps(MEMORY_STEPS)
    sampler = NvmlSampler(session.nvml_target(), job.sample_period_s)

    def on_step(stage: str, done: int, fraction: float | None) -> None:
        if stage == "warmup":
            report(BenchProgress("warmup", f"warm-up step {done + MEMORY_STEPS}"))
        else:
            report(BenchProgress("timing", f"timed step {done}", fraction))

    timing = measure(
        session.step,
        session.synchronize,
        job.rule,
        clock=session.clock,
        agree=session.agree,
        on_step=on_step,
        on_timing_start=sampler.start,
    )
    power = sampler.stop()
    peaks = session.run_peaks()
    report(BenchProgress("flops", "counting FLOPs of one step"))
    flops = session.flops_per_step()
    return Measurement(
        rank=rank,
        timing=timing,
        warmup_extra=MEMORY_STEPS,
        units_per_step=session.units_per_step,
        samples_per_step=session.samples_per_step,
        peak_allocated_bytes=peaks.allocated_bytes,
        peak_reserved_bytes=peaks.reserved_bytes,
        memory_method=peaks.method,
        power=power,
        flops_per_step=flops.flops_per_step,
        flops_method=flops.method,
        precision=session.precision_state(),
        compiled=session.compiled,
        channels_last=session.channels_last,
        notes=session.notes,
    )
