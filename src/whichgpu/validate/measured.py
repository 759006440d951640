"""whichgpu's own measurements (``data/measured/*.json``) against the predictions of the same runs.

The files are ``whichgpu results export`` documents written by ``scripts/measure_reference.py``:
``whichgpu bench`` results, each with the machine and software it ran on. For every result
the same run is predicted and compared:

- on a CUDA GPU, ``fit`` for the result's catalog GPU at its batch: peak allocated and
  reserved bytes (PyTorch's counters) and the device total (what NVML saw in use); and, when
  the bench searched the largest batch without a cap, ``fit``'s largest batch;
- on the CPU, which has no caching allocator, the traced step's peak of live tensor bytes
  against the live bytes the bench counted, and, for a search under ``--memory-limit``, the
  largest batch whose traced peak stays under the cap.

Throughput (``compare_throughputs``, for ``validate throughput``): each CUDA measurement of a
catalog GPU against ``predict``'s throughput of the same run on that GPU, with the software
stack of the result's transformers (``stack_of``: a compiled step's attention depends on it).
The predictor's constants are fitted on Lambda's 2020 table only, so these cases are out of
sample.

The CPU cases check the tracer against real execution (the step's tensors, their sizes and
lifetimes); only the GPU cases check the allocator model and the overheads outside it. For
that, a CPU case is predicted from a trace of the CPU's own dropout and attention kernels
(``trace_step(kernels="cpu")``), shipped next to the measurements in ``cpu-kernels/`` by the
script that measured them; the profiles every GPU estimate uses follow CUDA's kernels, whose
dropout keeps a one-byte mask where the CPU keeps one in the input's dtype. Without a
CPU-kernel profile the CUDA-kernel one is used, and the case says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whichgpu.errors import UsageError
from whichgpu.estimate.memory import largest_live_batch
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.profiles.stored import profile_key
from whichgpu.schema import (
    BenchResult,
    MeasuredMemoryCase,
    MeasuredThroughputCase,
    RunConfig,
    Verdict,
)
from whichgpu.store import read_results_file

if TYPE_CHECKING:  # importlib.abc's home of Traversable moves in later Pythons
    from importlib.abc import Traversable

MEASURED_DIR = "measured"
"""Folder of the shipped measurements, under ``validate/data``."""

CPU_KERNEL_DIR = "cpu-kernels"
"""Folder, under ``MEASURED_DIR``, of the profiles traced with the CPU's kernels for the CPU
measurements (file stems: ``stored.profile_key``)."""


MASK_FIXED_TRANSFORMERS = (5, 18)
"""The first transformers release whose compiled models pass ``is_causal`` to SDPA, not a
dense mask (``SoftwareStack.compiled_causal_mask``)."""
MASKED_STACK = "pytorch2-cuda12-transformers-5.17"
"""The stack of a result measured with an earlier transformers."""


def stack_of(result: BenchResult) -> str | None:
    """The software stack ``result`` ran on, as far as a prediction depends on it: the
    masked-attention stack where its transformers is older than ``MASK_FIXED_TRANSFORMERS``,
    else the default (None)."""
    version = result.environment.libraries.get("transformers")
    if version is None:
        return None
    parts = [int(p) for p in version.split(".")[:2] if p.isdigit()]
    return MASKED_STACK if tuple(parts) < MASK_FIXED_TRANSFORMERS else None


def measured_dir() -> Traversable:
    """The package folder of the shipped measurements."""
    return resources.files("whichgpu.validate").joinpath("data").joinpath(MEASURED_DIR)


def cpu_kernel_profile(workload: str, run: RunConfig) -> ScalableProfile | None:
    """The shipped CPU-kernel profile of ``workload`` for ``run``, or None."""
    ref = measured_dir().joinpath(CPU_KERNEL_DIR).joinpath(profile_key(workload, run) + ".json.gz")
    if not ref.is_file():
        return None
    with resources.as_file(ref) as path:
        return ScalableProfile.load(Path(path))


def shipped_measurements() -> list[BenchResult]:
    """Every shipped measurement, in file order (files by name)."""
    folder = measured_dir()
    if not folder.is_dir():
        return []
    results: list[BenchResult] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            with resources.as_file(entry) as path:
                results += [r for _, r in read_results_file(Path(path), "json")]
    return results


def verdict(measured: int, predicted: int) -> Verdict:
    """A predicted largest batch against the measured one."""
    if predicted == measured:
        return "exact"
    return "conservative" if predicted < measured else "too high"


def compare_measurements(
    results: list[BenchResult], progress: Callable[[str], None] | None = None
) -> list[MeasuredMemoryCase]:
    """Each result against the prediction of its run (results of other devices, or of
    workloads that are not named, are left out)."""
    cases = []
    for result in results:
        if progress is not None:
            progress(f"{result.workload} on {result.device_name}")
        if result.environment.device_kind == "cpu":
            cases.append(_on_cpu(result))
        elif result.environment.device_kind == "cuda" and result.gpu is not None:
            cases.append(_on_cuda(result))
    return cases


def _base(result: BenchResult) -> dict[str, Any]:
    return {
        "result_id": result.id,
        "workload": result.workload,
        "device_name": result.device_name,
        "device_kind": result.environment.device_kind,
        "gpu": result.gpu,
        "run": _measured_run(result),
        "measured_allocated_bytes": result.peak_allocated_bytes or 0,
        "memory_limit_bytes": result.memory_limit_bytes,
        "measured_max_batch": result.max_batch_size,
    }


def _profile(result: BenchResult) -> ScalableProfile:
    from whichgpu.api import scalable_profile
    from whichgpu.workloads import get_workload

    profile, _ = scalable_profile(get_workload(result.workload), result.run)
    return profile


def _on_cpu(result: BenchResult) -> MeasuredMemoryCase:
    own = cpu_kernel_profile(result.workload, result.run)
    profile = own or _profile(result)
    seq_len = result.seq_len if profile.is_sequence_model else None
    predicted = profile.live_peak_bytes(result.batch_size, seq_len)
    fields: dict[str, Any] = {}
    limit = result.memory_limit_bytes
    if result.max_batch_size is not None and limit is not None:
        largest = largest_live_batch(profile, limit, seq_len)
        fields = {
            "predicted_max_batch": largest,
            "max_batch_verdict": verdict(result.max_batch_size, largest),
        }
    note = (
        "CPU: live tensor bytes of the step, traced vs counted (no caching allocator, no "
        "device overheads)"
    )
    if own is not None:
        note += "; traced with the CPU's own dropout and attention kernels"
    elif any(op.name == "aten.native_dropout" for op in profile.ops):
        note += (
            "; a model with dropout: the CPU keeps a mask in the input's dtype where CUDA's "
            "native_dropout (which the trace models) keeps one byte per element, so the CPU "
            "holds more once activations make the peak"
        )
    return MeasuredMemoryCase(
        **_base(result), predicted_allocated_bytes=predicted, **fields, note=note
    )


CONFIG_DIR = "configs"
"""Folder, under ``MEASURED_DIR``, of the model configs of measurements made with ``--config``
(a result names its config file as its workload)."""


@contextlib.contextmanager
def _workload_of(result: BenchResult) -> Iterator[dict[str, Any]]:
    """The keyword that names ``result``'s workload to ``fit``/``predict``: its name, or, for
    a model measured from a config file, that file as shipped in ``CONFIG_DIR``."""
    if not result.workload.endswith(".json"):
        yield {"workload": result.workload}
        return
    shipped = measured_dir().joinpath(CONFIG_DIR).joinpath(result.workload)
    if not shipped.is_file():
        raise UsageError(
            f"measurement {result.id} was made with the config {result.workload}, which is not "
            f"shipped in validate/data/{MEASURED_DIR}/{CONFIG_DIR}."
        )
    with resources.as_file(shipped) as path:
        yield {"config": Path(path)}


def _measured_run(result: BenchResult) -> RunConfig:
    """The run ``result`` measured: compiled where it says so (results of before
    ``RunConfig.compile`` say it in ``BenchResult.compiled`` only)."""
    return result.run.model_copy(update={"compile": True}) if result.compiled else result.run


def _fit_options(run: RunConfig) -> dict[str, Any]:
    """``api.fit`` keyword arguments for ``run``."""
    options = run.model_dump(exclude_defaults=True)  # a default is not an option given
    options["gpu_count"] = options.pop("gpus", 1)
    return options


def _on_cuda(result: BenchResult) -> MeasuredMemoryCase:
    from whichgpu.api import fit

    assert result.gpu is not None
    options = _fit_options(_measured_run(result))  # compiled: fit --compile
    with _workload_of(result) as named:
        (at_batch,) = fit(**named, gpus=[result.gpu], **options)
        if result.max_batch_size is not None and result.memory_limit_bytes is None:
            (largest,) = fit(**named, gpus=[result.gpu], **{**options, "batch_size": None})
    fields: dict[str, Any] = {}
    note = "CUDA: fit for the catalog GPU at the measured batch, default software stack"
    if result.compiled:
        note += "; compiled: fit --compile"
    if result.max_batch_size is not None:
        if result.memory_limit_bytes is None:
            fields = {
                "predicted_max_batch": largest.max_batch_size,
                "max_batch_verdict": verdict(result.max_batch_size, largest.max_batch_size),
            }
        else:
            note += "; the largest batch was searched under a memory cap: not compared"
    return MeasuredMemoryCase(
        **_base(result),
        predicted_allocated_bytes=at_batch.peak_allocated_bytes,
        measured_reserved_bytes=result.peak_reserved_bytes,
        predicted_reserved_bytes=at_batch.peak_reserved_bytes,
        measured_device_bytes=result.device_used_bytes,
        predicted_device_bytes=at_batch.device_total_bytes,
        **fields,
        note=note,
    )


def measured_cases(progress: Callable[[str], None] | None = None) -> list[MeasuredMemoryCase]:
    """The shipped measurements against the predictions of their runs."""
    return compare_measurements(shipped_measurements(), progress)


def compare_throughputs(
    results: list[BenchResult], progress: Callable[[str], None] | None = None
) -> list[MeasuredThroughputCase]:
    """Each measurement on a catalog CUDA GPU against ``predict`` of the same run on it."""
    from whichgpu.api import predict

    cases = []
    for result in results:
        if (
            result.environment.device_kind != "cuda"
            or result.gpu is None
            or result.throughput is None
        ):
            continue
        if progress is not None:
            progress(f"{result.workload} on {result.gpu}")
        run = _measured_run(result)
        stack = stack_of(result)
        base: dict[str, Any] = {
            "result_id": result.id,
            "workload": result.workload,
            "gpu": result.gpu,
            "run": run,
            "unit": result.throughput_unit,
            "measured": result.throughput,
            "measured_mfu": result.mfu,
        }
        differs = []
        if result.channels_last:
            differs.append("measured channels-last")
        try:
            with _workload_of(result) as named:
                (estimate,) = predict(**named, gpus=[result.gpu], stack=stack, **_fit_options(run))
        except UsageError as exc:
            cases.append(MeasuredThroughputCase(**base, predicted=None, note=str(exc)))
            continue
        predicted = estimate.throughput
        if result.compiled and stack is not None:
            version = result.environment.libraries["transformers"]
            differs.append(
                f"predicted with --stack {stack}: its transformers {version} builds "
                "a dense causal mask under torch.compile"
            )
        if predicted is None or estimate.throughput_unit != result.throughput_unit:
            note = (
                f"predict: batch {result.batch_size} does not fit on {result.gpu}"
                if predicted is None
                else f"predict counts {estimate.throughput_unit}, the bench "
                f"{result.throughput_unit}"
            )
            cases.append(MeasuredThroughputCase(**base, predicted=None, note=note))
            continue
        cases.append(
            MeasuredThroughputCase(
                **base,
                predicted=predicted,
                low=estimate.low,
                high=estimate.high,
                predicted_mfu=estimate.mfu,
                error=predicted / result.throughput - 1,
                note="; ".join(differs),
            )
        )
    return cases


def speed_ratios(cases: Sequence[MeasuredThroughputCase]) -> list[str]:
    """What fp8 and torch.compile gave in whichgpu's own measurements, against ``predict``:
    for each pair of cases of one workload, GPU and size that differ only in precision (fp8
    over bf16, compiled alike) or only in compilation, the measured speed ratio and the
    predicted one."""

    def key(c: MeasuredThroughputCase) -> tuple[Any, ...]:
        r = c.run
        return (c.workload, c.gpu, r.batch_size, r.seq_len, r.checkpointing, r.mode)

    out: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    for fast in cases:
        for slow in cases:
            if key(fast) != key(slow) or fast is slow:
                continue
            size = f"{fast.workload} at {fast.run.batch_size} x {fast.run.seq_len} on {fast.gpu}"
            same_compile = fast.run.compile == slow.run.compile
            runs = (fast.run.precision, slow.run.precision, fast.run.compile, slow.run.compile)
            pair = (key(fast), runs)
            if pair in seen:
                continue
            if same_compile and (fast.run.precision, slow.run.precision) == ("fp8", "bf16"):
                how = "both compiled" if fast.run.compile else "both eager"
                label = f"fp8 over bf16, {size}, {how}"
            elif fast.run.precision == slow.run.precision and fast.run.compile > slow.run.compile:
                label = f"compiled over eager, {size}, {fast.run.precision}"
            else:
                continue
            seen.add(pair)
            measured = fast.measured / slow.measured
            line = f"{label}: measured {measured:.3f}x"
            if fast.predicted and slow.predicted:
                predicted = fast.predicted / slow.predicted
                line += f", predicted {predicted:.3f}x ({predicted / measured - 1:+.1%})"
            out.append(line)
    return out
