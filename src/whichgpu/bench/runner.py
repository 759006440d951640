"""``run_bench``: find the size if asked, measure, and return ``BenchResult``s.

Over 600 lines because it is one flow in order (inspect, search, measure, ranks), each stage
with the checks of the options it reads; its stages are already in the modules it calls.

A bench of one workload, in order, every step in child processes (``probe``):

1. **Inspect** the device (once; ``inspect``): is it there, what is it, what software.
2. **Search**, if asked: the largest batch (``--find-max-batch``) or the largest sequence length
   at the batch (``--find-max-seq-len``) by ``search.search_largest``, each probe a process of
   its own that builds the step and runs two steps under the memory limit.
3. **Measure** one device: warm-up, timing, memory, NVML, FLOPs (``worker.measure_task``).
4. With ``--gpus N``: measure N ranks together (DDP) and ``distributed.aggregate`` them; the
   scaling efficiency is against step 3, at the same per-GPU batch.

Under torchrun (``BenchOptions.torchrun``) every torchrun process runs ``run_bench``: each
measures its own device (``LOCAL_RANK``) in a child that joins the torchrun group, the ranks'
measurements are gathered on rank 0, and rank 0 alone then measures one device by itself for
the scaling efficiency and returns the results (the other ranks return none).

Each result goes to ``on_result`` as soon as it exists (so a caller can store it before the
next one starts). The catalog id of the GPU and the MFU are not known here (bench knows no
catalog): ``whichgpu.api.bench`` fills them in.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from whichgpu.bench.devices.protocol import Device
from whichgpu.bench.distributed import (
    AGGREGATION_RULES,
    Aggregate,
    TorchrunGroup,
    aggregate,
    rendezvous_address,
    scaling_efficiency,
)
from whichgpu.bench.environment import with_precision
from whichgpu.bench.jobs import (
    BenchProgress,
    GroupSpec,
    Inspection,
    InspectJob,
    MeasureJob,
    Measurement,
    ProbeJob,
    StepSpec,
    WorkloadRef,
)
from whichgpu.bench.probe import (
    Failed,
    Outcome,
    OutOfMemory,
    Ran,
    TimedOut,
    describe,
    prepare,
    run_in_child,
    run_in_children,
)
from whichgpu.bench.search import SearchResult, Verdict, search_largest
from whichgpu.bench.timing import TimingRule
from whichgpu.bench.worker import inspect_task, measure_ranks_task, measure_task, probe_task
from whichgpu.errors import (
    BenchError,
    BenchTimeout,
    UnsupportedWorkload,
    UsageError,
    WhichGpuError,
    option,
)
from whichgpu.schema import BenchEnvironment, BenchResult, RunConfig, WorkloadInfo
from whichgpu.units import GIB, KIB, MIB

MAX_BATCH = 1 << 20
"""Upper bound of a batch search."""
MAX_SEQ_LEN = 1 << 20
"""Upper bound of a sequence-length search when the model states no limit."""

Progress = Callable[[BenchProgress], None]
"""Receives what the bench is doing."""


@dataclass(frozen=True)
class BenchOptions:
    """How to bench (what to run is the ``RunConfig``)."""

    find_max_batch: bool = False
    """Search the largest batch, and measure at it."""
    max_batch_resolution: int = 1
    """Resolution of that search (1 = exact)."""
    find_max_seq_len: bool = False
    """Search the largest sequence length at the batch, and measure at it."""
    memory_limit_bytes: int | None = None
    """Memory the step may use (``--memory-limit``)."""
    compile: bool = False
    """Measure under ``torch.compile`` (probes run eager)."""
    channels_last: bool = False
    """Channels-last layout for CNNs."""
    rule: TimingRule = field(default_factory=TimingRule)
    """Warm-up and timing rule."""
    timeout_s: float = 600.0
    """Longest a child may go without progress (building the model, finishing a step)."""
    sample_period_s: float = 0.1
    """NVML sampling period."""
    probe_steps: int = 2
    """Steps each probe runs."""
    batch_guess: Callable[[BenchEnvironment, int | None], int | None] | None = None
    """A prediction of the largest batch on the inspected device at a sequence length (or
    None when there is none), from which the batch search starts instead of from 1. The API
    passes whichgpu's memory estimate; whatever it says, the answer is still found by
    probing, and is always a size seen to run."""
    seq_len_guess: Callable[[BenchEnvironment, int], int | None] | None = None
    """The same for the longest sequence at a batch size: where the length search starts
    instead of at the workload's default length."""
    torchrun: TorchrunGroup | None = None
    """The torchrun group this process is a rank of (``distributed.torchrun_group``), or
    None. A group of more than one process measures every rank's device together, and
    only rank 0 gets results."""


def inspect(device: Device, n_devices: int = 1, *, timeout_s: float = 600.0) -> Inspection:
    """The device's environment, read in a child process (``UsageError`` if it is not there)."""
    prepare(device.kind)
    outcome = run_in_child(inspect_task, InspectJob(device, n_devices), timeout_s=timeout_s)
    if isinstance(outcome, Ran):
        inspection: Inspection = outcome.value
        return inspection
    raise _error(outcome, f"looking at --device {device.spec}")


def run_bench(
    target: WorkloadRef,
    run: RunConfig,
    device: Device,
    options: BenchOptions | None = None,
    *,
    inspection: Inspection | None = None,
    progress: Progress | None = None,
    on_result: Callable[[BenchResult], None] | None = None,
) -> list[BenchResult]:
    """Bench one workload on ``device``: one result, or two with ``run.gpus`` > 1 (one GPU,
    then all of them)."""
    options = options or BenchOptions()
    prepare(device.kind)
    info = target.resolve().info
    if target.label is not None:
        info = info.model_copy(update={"name": target.label})

    def say(event: BenchProgress) -> None:
        if progress is not None:
            progress(dataclasses.replace(event, workload=info.name))

    _check(run, info, options, device)
    group = options.torchrun if options.torchrun and options.torchrun.world_size > 1 else None
    if group is not None and not group.is_leader:
        _measure_as_rank(target, info, run, device, options, group)
        return []
    if options.torchrun is not None:  # this process measures its own device: LOCAL_RANK's
        device = device.for_rank(options.torchrun.local_rank)
    if inspection is None:
        say(BenchProgress("inspect", f"looking at {device.spec}"))
        n_devices = group.local_world_size if group is not None else run.gpus
        inspection = inspect(device, n_devices, timeout_s=options.timeout_s)
    environment = inspection.environment
    if run.gpus > 1 and device.kind == "cuda" and run.gpus > environment.device_count:
        raise UsageError(
            f"--gpus {run.gpus}: only {environment.device_count} CUDA device(s) are visible."
        )
    bench = _Bench(target, info, run, device, options, environment, say)
    notes = list(inspection.notes)
    batch, seq = _sizes(info, run)
    found_batch = found_seq = None
    if options.find_max_batch:
        search = bench.search_batch(seq)
        notes.extend(_search_notes(search, "batch", options))
        if search.largest is None:
            result = bench.unfit(
                1, seq, notes, f"does not fit: batch 1 {_last(search)}", {"max_batch_size": 0}
            )
            _emit(on_result, result)
            return [result]
        batch = found_batch = search.largest
    if options.find_max_seq_len:
        assert seq is not None
        search = bench.search_seq_len(batch, seq)
        notes.extend(_search_notes(search, "seq_len", options))
        if search.largest is None:
            result = bench.unfit(
                batch,
                1,
                notes,
                f"does not fit: seq_len 1 {_last(search)}",
                {"max_batch_size": found_batch, "max_seq_len": 0},
            )
            _emit(on_result, result)
            return [result]
        seq = found_seq = search.largest
    sizes = {"max_batch_size": found_batch, "max_seq_len": found_seq}
    if group is not None:
        results = bench.measure_torchrun(batch, seq, notes, sizes, group)
        for result in results:
            _emit(on_result, result)
        return results
    one = bench.measure(batch, seq, notes, sizes)
    _emit(on_result, one)
    results = [one]
    if run.gpus > 1 and one.throughput is not None:
        many = bench.measure_group(batch, seq, notes, sizes, one.throughput)
        _emit(on_result, many)
        results.append(many)
    return results


def _sizes(info: WorkloadInfo, run: RunConfig) -> tuple[int, int | None]:
    """Batch and sequence length of the step. A language model's inference serves
    ``--concurrency`` sequences of ``--context`` tokens (``--batch-size`` and ``--seq-len``
    name the same), as ``whichgpu.recipe.generation.serving_sizes`` reads them."""
    batch = run.batch_size or info.default_batch_size
    seq = run.seq_len or info.default_seq_len
    if run.mode == "inference":
        if run.concurrency != 1:
            batch = run.batch_size or run.concurrency
        seq = run.context or seq
    return batch, seq if info.is_sequence_model else None


def _emit(on_result: Callable[[BenchResult], None] | None, result: BenchResult) -> None:
    if on_result is not None:
        on_result(result)


def _step_spec(
    target: WorkloadRef,
    run: RunConfig,
    options: BenchOptions,
    batch: int,
    seq: int | None,
    *,
    probe: bool = False,
) -> StepSpec:
    """The step at ``batch`` x ``seq`` on one device (probes run eager: compiling per size
    costs minutes, and compiled steps usually need less memory than eager ones)."""
    return StepSpec(
        workload=target,
        run=run.model_copy(update={"batch_size": batch, "seq_len": seq, "gpus": 1}),
        batch_size=batch,
        seq_len=seq,
        compile=options.compile and not probe,
        channels_last=options.channels_last,
        memory_limit_bytes=options.memory_limit_bytes,
    )


def _rank_job(
    target: WorkloadRef,
    run: RunConfig,
    device: Device,
    options: BenchOptions,
    group: TorchrunGroup,
    batch: int,
    seq: int | None,
) -> MeasureJob:
    """This torchrun rank's measurement on ``device`` (its own, ``LOCAL_RANK``'s), in the
    group torchrun made."""
    spec = dataclasses.replace(
        _step_spec(target, run, options, batch, seq),
        group=GroupSpec(
            group.rank,
            group.world_size,
            "env://",
            options.timeout_s,
            local_world_size=group.local_world_size,
        ),
    )
    return MeasureJob(device, spec, options.rule, options.sample_period_s)


def _measure_as_rank(
    target: WorkloadRef,
    info: WorkloadInfo,
    run: RunConfig,
    device: Device,
    options: BenchOptions,
    group: TorchrunGroup,
) -> None:
    """A torchrun rank other than 0: measure this rank's device with the others, and hand
    the figures to rank 0 (which reports them); an error if it could not."""
    batch, seq = _sizes(info, run)
    own = device.for_rank(group.local_rank)
    job = _rank_job(target, run, own, options, group, batch, seq)
    outcome = run_in_child(measure_ranks_task, job, timeout_s=options.timeout_s)
    where = f"rank {group.rank} (--device {job.device.spec}) measuring {info.name}"
    if isinstance(outcome, OutOfMemory):
        raise BenchError(
            f"{where} at batch {batch}: out of memory ({outcome.detail}); DDP adds gradient "
            "buckets, so the one-GPU batch may not fit: try a smaller --batch-size"
        )
    if not isinstance(outcome, Ran):
        raise _error(outcome, where)


def _check(run: RunConfig, info: WorkloadInfo, options: BenchOptions, device: Device) -> None:
    """Options that cannot be benched together, with the reason."""
    if run.precision == "fp8" and run.mode != "train":
        raise UnsupportedWorkload(
            f"{option('precision')} fp8 is fp8 training (torchao Float8Linear); serving in fp8 "
            f"is {option('quantization')} fp8 in predict, not something bench measures."
        )
    if run.precision == "fp8" and run.method != "full":
        raise UnsupportedWorkload(
            f"{option('precision')} fp8 is fp8 training of the full model (torchao "
            f"Float8Linear), not of {option('method')} {run.method}'s adapters."
        )
    if run.sharding != "ddp":
        raise UsageError(
            f"--sharding {run.sharding}: bench measures data parallel (DDP) runs only for now."
        )
    if run.grad_accum > 1:
        raise UsageError(
            f"{option('grad_accum')}: bench measures one step of --batch-size; an accumulated "
            "step is that many micro-steps and one update (predict times it so)."
        )
    if options.find_max_batch and run.batch_size is not None:
        raise UsageError("Give --batch-size or --find-max-batch, not both.")
    if options.find_max_batch and run.concurrency != 1:
        raise UsageError(
            "Give --concurrency or --find-max-batch (which searches the largest concurrency), "
            "not both."
        )
    if options.find_max_batch and options.find_max_seq_len:
        raise UsageError(
            "--find-max-seq-len searches the length at one batch (--batch-size, or the "
            "workload's default); it cannot be combined with --find-max-batch."
        )
    if options.find_max_seq_len and not info.is_sequence_model:
        if info.family == "user":
            raise UnsupportedWorkload(
                f"{info.name} declares no sequence length, so --find-max-seq-len does not "
                "apply; mark the function with @model_defaults(seq_len=N) (from "
                "whichgpu.workloads)."
            )
        raise UnsupportedWorkload(
            f"{info.name} takes fixed-size {info.input_desc} inputs; --find-max-seq-len "
            "does not apply."
        )
    if options.max_batch_resolution < 1:
        raise UsageError("--max-batch-resolution must be at least 1.")
    searching = options.find_max_batch or options.find_max_seq_len
    if searching and device.kind == "cpu" and options.memory_limit_bytes is None:
        raise UsageError(
            "On the CPU a search needs --memory-limit GIB: the CPU has no device memory to "
            "fill (the limit is checked against the step's live tensor bytes)."
        )
    if options.memory_limit_bytes is not None and not options.memory_limit_bytes > 0:
        raise UsageError("--memory-limit must be more than 0.")
    if options.torchrun is not None:
        _check_torchrun(run, options, device)
    if run.gpus > 1 and device.kind == "mps":
        raise UsageError("MPS is one GPU; --gpus does not apply.")
    if run.gpus > 1 and run.mode == "inference":
        raise UsageError(
            "bench runs several GPUs as data-parallel training; serving one model tensor "
            "parallel over them is not measured. Bench the inference on one GPU (drop "
            "--gpus), or use `whichgpu predict --mode inference --gpus N` for an estimate."
        )


def _check_torchrun(run: RunConfig, options: BenchOptions, device: Device) -> None:
    """What a bench under torchrun cannot do, with the way out."""
    if run.gpus > 1:
        raise UsageError(
            f"--gpus {run.gpus} under torchrun: the group is torchrun's (--nnodes x "
            "--nproc-per-node processes, one device each); drop --gpus."
        )
    if options.find_max_batch or options.find_max_seq_len:
        what = "--find-max-batch" if options.find_max_batch else "--find-max-seq-len"
        raise UsageError(
            f"{what} under torchrun: search on one GPU first (`whichgpu bench ... {what}` "
            "without torchrun), then measure the group at the size found (--batch-size, "
            "--seq-len)."
        )
    if run.mode == "inference":
        raise UsageError(
            "--mode inference under torchrun: bench runs a torchrun group as data-parallel "
            "training; bench inference on one GPU, without torchrun."
        )
    if device.kind not in ("cuda", "cpu"):
        raise UsageError(
            f"--device {device.spec} under torchrun: a torchrun group measures CUDA GPUs "
            "(NCCL) or the CPU (gloo)."
        )


class _Bench:
    """One workload's bench: the probes, the measurements and the results they make."""

    def __init__(
        self,
        target: WorkloadRef,
        info: WorkloadInfo,
        run: RunConfig,
        device: Device,
        options: BenchOptions,
        environment: BenchEnvironment,
        say: Progress,
    ) -> None:
        self.target = target
        self.info = info
        self.run = run
        self.device = device
        self.options = options
        self.environment = environment
        self.say = say
        self._probes_ran = 0

    def spec(self, batch: int, seq: int | None, *, probe: bool = False) -> StepSpec:
        """The step at ``batch`` x ``seq`` (``_step_spec``)."""
        return _step_spec(self.target, self.run, self.options, batch, seq, probe=probe)

    # --- search ---------------------------------------------------------------------------

    def search_batch(self, seq: int | None) -> SearchResult:
        guess = None
        if self.options.batch_guess is not None:
            guess = self._usable(self.options.batch_guess(self.environment, seq), "batch")
        return search_largest(
            lambda size: self.probe(size, seq, "batch", size),
            start=1,
            resolution=self.options.max_batch_resolution,
            upper=MAX_BATCH,
            what="batch",
            guess=guess,
        )

    def search_seq_len(self, batch: int, seq: int) -> SearchResult:
        upper = self.info.max_seq_len or MAX_SEQ_LEN
        guess = None
        if self.options.seq_len_guess is not None:
            guess = self._usable(self.options.seq_len_guess(self.environment, batch), "seq_len")
        return search_largest(
            lambda size: self.probe(batch, size, "seq_len", size),
            start=min(seq, upper),
            resolution=self.options.max_batch_resolution,
            upper=upper,
            what="seq_len",
            guess=guess,
        )

    def _usable(self, guess: int | None, what: str) -> int | None:
        """A predicted size to start a search from, said in the progress; a prediction that
        nothing fits is not one (probing from the bottom says so quickest)."""
        if guess is None or guess < 1:
            return None
        self.say(BenchProgress("search", f"starting at the predicted largest {what} {guess}"))
        return guess

    def probe(self, batch: int, seq: int | None, what: str, size: int) -> Verdict:
        self.say(BenchProgress("search", f"{what} {size}: probing"))
        job = ProbeJob(self.device, self.spec(batch, seq, probe=True), self.options.probe_steps)
        started = time.monotonic()
        outcome = run_in_child(
            probe_task, job, timeout_s=self.options.timeout_s, on_progress=self.say
        )
        verdict = self._verdict(outcome, f"{what} {size}")
        seconds = time.monotonic() - started
        self.say(BenchProgress("search", f"{what} {size}: {verdict.detail} ({seconds:.1f} s)"))
        return verdict

    def _verdict(self, outcome: Outcome[Any], where: str) -> Verdict:
        """A probe's outcome as the search reads it. Out of memory is the limit; so are a
        timeout, a crash or an error once a smaller size has run (noted); before any size
        ran they are errors, as are bad options."""
        if isinstance(outcome, Ran):
            self._probes_ran += 1
            peak = outcome.value.peak_reserved_bytes or outcome.value.peak_allocated_bytes
            return Verdict(True, "ran" if peak is None else f"ran, peak {_size(peak)}")
        if isinstance(outcome, OutOfMemory):
            return Verdict(False, f"out of memory ({outcome.detail})")
        if isinstance(outcome, Failed) and outcome.kind in ("usage", "workload"):
            raise _error(outcome, where)
        if self._probes_ran:
            return Verdict(False, describe(outcome), unusual=True)
        raise _error(outcome, where)

    # --- measurement --------------------------------------------------------------------------

    def measure(
        self,
        batch: int,
        seq: int | None,
        notes: list[str],
        sizes: dict[str, int | None],
    ) -> BenchResult:
        self.say(BenchProgress("build", f"measuring at batch {batch}"))
        job = MeasureJob(
            self.device, self.spec(batch, seq), self.options.rule, self.options.sample_period_s
        )
        started = time.monotonic()
        outcome = run_in_child(
            measure_task, job, timeout_s=self.options.timeout_s, on_progress=self.say
        )
        if isinstance(outcome, OutOfMemory):
            return self.unfit(
                batch, seq, notes, f"the measurement ran out of memory ({outcome.detail})", sizes
            )
        if not isinstance(outcome, Ran):
            raise _error(outcome, f"measuring {self.info.name} at batch {batch}")
        measurement: Measurement = outcome.value
        seconds = time.monotonic() - started
        self.say(BenchProgress("done", f"batch {batch}: measured ({seconds:.1f} s)", 1.0))
        return self.result(batch, seq, [measurement], notes, sizes)

    def measure_group(
        self,
        batch: int,
        seq: int | None,
        notes: list[str],
        sizes: dict[str, int | None],
        one_gpu_throughput: float,
    ) -> BenchResult:
        n = self.run.gpus
        self.say(BenchProgress("ranks", f"measuring {n} devices together at batch {batch}"))
        address = rendezvous_address()
        jobs = [
            MeasureJob(
                self.device.for_rank(rank),
                dataclasses.replace(
                    self.spec(batch, seq),
                    group=GroupSpec(rank, n, address, self.options.timeout_s),
                ),
                self.options.rule,
                self.options.sample_period_s,
            )
            for rank in range(n)
        ]
        outcomes = run_in_children(
            measure_task, jobs, timeout_s=self.options.timeout_s, on_progress=self.say
        )
        memory = [o for o in outcomes if isinstance(o, OutOfMemory)]
        if memory:
            return self.unfit(
                batch,
                seq,
                notes,
                f"out of memory with {n} GPUs under DDP ({memory[0].detail}); DDP adds gradient "
                "buckets, so the one-GPU batch may not fit: try a smaller --batch-size",
                sizes,
                n_gpus=n,
            )
        failed = [o for o in outcomes if not isinstance(o, Ran)]
        if failed:
            raise _error(failed[0], f"measuring {self.info.name} on {n} devices")
        measurements = [o.value for o in outcomes if isinstance(o, Ran)]
        result = self.result(batch, seq, measurements, notes, sizes)
        assert result.throughput is not None
        return result.model_copy(
            update={
                "scaling_efficiency": scaling_efficiency(result.throughput, one_gpu_throughput, n)
            }
        )

    def measure_torchrun(
        self,
        batch: int,
        seq: int | None,
        notes: list[str],
        sizes: dict[str, int | None],
        group: TorchrunGroup,
    ) -> list[BenchResult]:
        """Rank 0 under torchrun: measure its device together with every other rank, gather
        their figures, then measure its device alone (the other ranks have ended, so none
        waits on it) for the scaling efficiency. The one-device result, then the group's."""
        n = group.world_size
        self.say(BenchProgress("ranks", f"measuring {n} ranks together at batch {batch}"))
        job = _rank_job(self.target, self.run, self.device, self.options, group, batch, seq)
        started = time.monotonic()
        outcome = run_in_child(
            measure_ranks_task, job, timeout_s=self.options.timeout_s, on_progress=self.say
        )
        group_notes = [*notes, f"torchrun: {group.describe()}; DDP over the torchrun group"]
        if isinstance(outcome, OutOfMemory):
            return [
                self.unfit(
                    batch,
                    seq,
                    group_notes,
                    f"out of memory on rank 0 with {n} ranks under DDP ({outcome.detail}); DDP "
                    "adds gradient buckets, so the one-GPU batch may not fit: try a smaller "
                    "--batch-size",
                    sizes,
                    n_gpus=n,
                )
            ]
        if not isinstance(outcome, Ran):
            raise _error(outcome, f"measuring {self.info.name} on rank 0 of {n}")
        measurements: tuple[Measurement, ...] = outcome.value
        if len(measurements) != n:
            raise BenchError(
                f"measuring {self.info.name} under torchrun: rank 0 gathered "
                f"{len(measurements)} ranks' figures of {n}"
            )
        seconds = time.monotonic() - started
        self.say(BenchProgress("done", f"{n} ranks at batch {batch}: measured ({seconds:.1f} s)"))
        many = self.result(batch, seq, list(measurements), group_notes, sizes)
        baseline = f"the one-GPU baseline of a torchrun run of {n} ranks (rank 0 alone)"
        one = self.measure(batch, seq, [*notes, baseline], sizes)
        if one.throughput is None or many.throughput is None:
            why = next((x for x in reversed(one.notes) if "out of memory" in x), "no throughput")
            note = f"no scaling efficiency: rank 0's one-GPU baseline did not run ({why})"
            return [one, many.model_copy(update={"notes": (*many.notes, note)})]
        note = (
            "scaling efficiency: against the one-GPU throughput rank 0 measured alone right "
            "after the group run (the other ranks had ended), at the same per-GPU batch"
        )
        efficiency = scaling_efficiency(many.throughput, one.throughput, n)
        return [
            one,
            many.model_copy(
                update={"scaling_efficiency": efficiency, "notes": (*many.notes, note)}
            ),
        ]

    # --- results ------------------------------------------------------------------------------

    def _base(self, batch: int, seq: int | None, n_gpus: int) -> dict[str, Any]:
        return {
            "id": uuid.uuid4().hex,
            "workload": self.info.name,
            "run": self.run.model_copy(
                update={"batch_size": batch, "seq_len": seq, "gpus": n_gpus}
            ),
            "device": self.device.spec,
            "device_name": self.environment.device_name,
            "gpu": None,
            "n_gpus": n_gpus,
            "precision": self.run.precision,
            "batch_size": batch,
            "seq_len": seq,
            "max_batch_resolution": (
                self.options.max_batch_resolution
                if self.options.find_max_batch or self.options.find_max_seq_len
                else None
            ),
            "memory_limit_bytes": self.options.memory_limit_bytes,
            "throughput_unit": f"{self.info.throughput_unit}/s",
            "created_at": dt.datetime.now(dt.timezone.utc),
        }

    def unfit(
        self,
        batch: int,
        seq: int | None,
        notes: list[str],
        why: str,
        sizes: dict[str, int | None] | None = None,
        *,
        n_gpus: int = 1,
    ) -> BenchResult:
        """A result for a step that did not fit: no throughput, the reason in the notes."""
        self.say(BenchProgress("done", why, 1.0))
        return BenchResult(
            **self._base(batch, seq, n_gpus),
            **(sizes or {}),
            compiled=False,
            channels_last=False,
            throughput=None,
            step_time_s=None,
            step_time_iqr_s=None,
            iterations=0,
            warmup_iterations=0,
            measured_s=0.0,
            notes=(*notes, why),
            environment=self.environment,
        )

    def result(
        self,
        batch: int,
        seq: int | None,
        measurements: list[Measurement],
        notes: list[str],
        sizes: dict[str, int | None],
    ) -> BenchResult:
        """A measured result (one rank, or several aggregated)."""
        combined = aggregate(measurements)
        first = min(measurements, key=lambda m: m.rank)
        n = len(measurements)
        return BenchResult(
            **self._base(batch, seq, n),
            **sizes,
            compiled=first.compiled,
            channels_last=first.channels_last,
            throughput=combined.throughput,
            step_time_s=combined.step_time_s,
            step_time_iqr_s=combined.step_time_iqr_s,
            iterations=combined.iterations,
            warmup_iterations=combined.warmup_iterations,
            measured_s=combined.measured_s,
            peak_allocated_bytes=combined.peak_allocated_bytes,
            peak_reserved_bytes=combined.peak_reserved_bytes,
            device_used_bytes=combined.device_used_bytes,
            power_w=combined.power_w,
            energy_j_per_sample=combined.energy_j_per_sample,
            sm_clock_mhz=combined.sm_clock_mhz,
            temperature_c=combined.temperature_c,
            utilization=combined.utilization,
            flops_per_step=combined.flops_per_step,
            per_rank=combined.per_rank,
            notes=tuple(self._measurement_notes(notes, first, combined, n)),
            environment=with_precision(self.environment, first.precision),
        )

    def _measurement_notes(
        self, notes: list[str], first: Measurement, combined: Aggregate, n: int
    ) -> list[str]:
        rule = self.options.rule
        out = [*notes, *first.notes]
        out.append(f"timing: {rule.describe()}")
        if not first.timing.steady:
            out.append(
                f"warm-up did not settle within {rule.warmup_max_iters} steps or "
                f"{rule.warmup_max_s:g} s: the step times were still changing when timing began"
            )
        out.append(f"memory: {first.memory_method}")
        out.extend(first.power.notes)
        if first.power.energy_method:
            out.append(f"energy: {first.power.energy_method}")
        if n > 1:
            out.extend(f"{n} GPUs: {rule_text}" for rule_text in AGGREGATION_RULES)
        out.append(first.flops_method)
        return out


def _search_notes(search: SearchResult, what: str, options: BenchOptions) -> list[str]:
    resolution = "exact" if search.resolution == 1 else f"to within {search.resolution}"
    limit = (
        f", under a limit of {_size(options.memory_limit_bytes)}"
        if options.memory_limit_bytes is not None
        else ""
    )
    how = (
        "doubling then bisection"
        if search.guess is None
        else f"galloping from whichgpu's predicted {search.guess}, then bisection"
    )
    note = (
        f"largest {what}: {how}, {resolution}{limit}: "
        f"{len(search.probes)} probe{'s' * (len(search.probes) != 1)}, each "
        f"{options.probe_steps} step{'s' * (options.probe_steps != 1)} in its own process"
    )
    if search.guess is not None and search.largest is not None and search.resolution == 1:
        off = search.guess - search.largest
        verdict = "exact" if off == 0 else ("too high" if off > 0 else "conservative")
        note += f"; the prediction was {verdict} ({off:+d})"
    if search.reached_upper:
        note += f"; stopped at the search's upper bound ({search.largest})"
    return [note, *search.notes]


def _size(n_bytes: float) -> str:
    """Bytes in the largest binary unit that keeps a number above 1."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n_bytes >= unit:
            return f"{n_bytes / unit:.3g} {name}"
    return f"{n_bytes:.0f} B"


def _last(search: SearchResult) -> str:
    return search.probes[-1].verdict.detail if search.probes else "was not tried"


def _error(outcome: Outcome[Any], where: str) -> WhichGpuError:
    """The error a failed outcome becomes, for the user."""
    if isinstance(outcome, Failed):
        if outcome.kind == "usage":
            return UsageError(outcome.message)
        if outcome.kind == "workload":
            return UnsupportedWorkload(outcome.message)
        if outcome.kind == "bench":
            return BenchError(outcome.message)
        return BenchError(f"{where}: {outcome.message}{_innermost(outcome.traceback)}")
    if isinstance(outcome, TimedOut):
        return BenchTimeout(
            f"{where}: {describe(outcome)}. Raise --timeout if a step really takes that long."
        )
    return BenchError(f"{where}: {describe(outcome)}")


def _innermost(trace: str) -> str:
    """`` (at FILE:LINE)``: where in the child the error was raised, if the traceback says."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    if not frames:
        return ""
    path, line = frames[-1]
    return f" (at {path}:{line})"
