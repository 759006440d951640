"""Devices a bench runs on: a small protocol, CUDA, CPU and MPS, and a simulated device.

The parent process makes a ``Device`` from ``--device`` (``parse_device``). Devices are frozen
dataclasses, so they pickle into each child process, where ``open_session`` builds the step
on them and returns a ``Session``: run a step, synchronise, measure memory, count FLOPs.

Memory, per device (``memory_tracker``):

- CUDA: PyTorch's caching allocator counts it. ``--memory-limit`` becomes
  ``torch.cuda.set_per_process_memory_fraction(limit / total)``, so the allocator itself
  refuses to reserve more (``torch.OutOfMemoryError``, as on a smaller card); peaks are
  ``max_memory_allocated`` and ``max_memory_reserved``.
- CPU: there is no allocator to cap. A light dispatch mode (``tensor_memory.LiveBytes``) counts
  the bytes of every live tensor storage — the parameters, buffers and batch that exist
  before the step, and every storage an operator creates, until it is freed — and raises the
  typed out-of-memory error as soon as the count passes the limit, at the allocation, as an
  allocator would. The peak is that count's maximum: exact and repeatable, but blind to
  allocator caching and fragmentation (the CPU allocator returns memory at once).
- MPS: the same count as the CPU (MPS keeps no peak statistics); ``--memory-limit`` also
  sets ``torch.mps.set_per_process_memory_fraction``.
- Fake: a simulated capacity, ``fixed + bytes_per_unit x batch x seq_len``; it can also be
  told to fail at a size (non-monotonic), hang, crash or raise, for the harness's tests.

Nothing here imports torch at module level; the torch devices import it in their methods,
which run only in child processes.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from whichgpu.errors import BenchError, UsageError
from whichgpu.schema import DeviceKind
from whichgpu.units import GIB, MIB

from .flops import FlopCount
from .jobs import BenchProgress, PrecisionState, StepSpec

if TYPE_CHECKING:
    import torch

Report = Callable[[BenchProgress], None]
"""Where a child sends its progress."""


class StepOutOfMemory(Exception):
    """A step needed more memory than the device (or ``--memory-limit``) has.

    Raised in child processes only; the probe turns it into the ``OutOfMemory`` outcome.
    """


@dataclass(frozen=True)
class MemoryPeaks:
    """Peak memory of the steps a tracker watched."""

    allocated_bytes: int | None
    """Peak bytes held by tensors."""
    reserved_bytes: int | None
    """Peak bytes the caching allocator held (None without one)."""
    method: str
    """How they were measured."""


@dataclass(frozen=True)
class DeviceFacts:
    """What a device says about itself."""

    name: str
    """Name it reports."""
    uuid: str | None
    """GPU UUID."""
    count: int
    """Devices of this kind visible."""
    memory_total_bytes: int | None
    """Memory the runtime reports as total."""
    notes: tuple[str, ...] = ()
    """What could not be read, and why."""


@dataclass(frozen=True)
class NvmlTarget:
    """The GPU NVML should watch: its UUID (preferred) or its CUDA index."""

    uuid: str | None
    """``GPU-…`` UUID."""
    index: int
    """CUDA device index (used when the UUID is unknown)."""


class Session(Protocol):
    """A step built on a device, ready to run (in a child process)."""

    @property
    def units_per_step(self) -> int:
        """Throughput units one step processes."""
        ...

    @property
    def samples_per_step(self) -> int:
        """Samples one step processes."""
        ...

    @property
    def compiled(self) -> bool:
        """Whether ``torch.compile`` was applied."""
        ...

    @property
    def channels_last(self) -> bool:
        """Whether channels-last was applied."""
        ...

    @property
    def notes(self) -> tuple[str, ...]:
        """What the reader should know about how the step was built."""
        ...

    def step(self) -> None:
        """One step (raises ``StepOutOfMemory``)."""

    def synchronize(self) -> None:
        """Wait for the device to finish queued work."""

    def memory_steps(self, steps: int) -> MemoryPeaks:
        """Run ``steps`` steps watching memory; raise ``StepOutOfMemory`` past the limit."""
        ...

    def run_peaks(self) -> MemoryPeaks:
        """Peak memory over the whole session so far."""
        ...

    def flops_per_step(self) -> FlopCount:
        """Model FLOPs of one step and how they were obtained (never raises: a count that
        fails gives none, with the reason)."""
        ...

    def precision_state(self) -> PrecisionState:
        """Numeric settings in force."""
        ...

    def agree(self, seconds: float) -> float:
        """The step time every rank decides on (the slowest rank's)."""
        ...

    def clock(self) -> float:
        """The time in seconds that step times are measured with (``time.perf_counter`` on a
        real device; the simulated device's own clock, which its steps advance)."""
        ...

    def nvml_target(self) -> NvmlTarget | None:
        """The GPU to sample through NVML (None off CUDA)."""
        ...

    def close(self) -> None:
        """Release what the session holds (process groups)."""


class Device(Protocol):
    """Where a bench runs."""

    @property
    def kind(self) -> DeviceKind:
        """``cuda``, ``cpu``, ``mps`` or ``fake``."""
        ...

    @property
    def spec(self) -> str:
        """The device as a run names it (``cuda:0``, ``cpu``)."""
        ...

    def for_rank(self, rank: int) -> Device:
        """The device of rank ``rank`` of a multi-GPU run starting at this one."""
        ...

    def describe(self) -> DeviceFacts:
        """Name, UUID, count and memory (in a child process; raises ``UsageError`` when the
        device is not there)."""
        ...

    def open_session(self, spec: StepSpec, report: Report) -> Session:
        """Build ``spec`` on this device (in a child process)."""
        ...


# --- torch devices ---------------------------------------------------------------------------


def _oom_message(exc: BaseException) -> str:
    """The first line of an out-of-memory error (the allocator's own account)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_OOM_TEXT = re.compile(r"out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED", re.I)


class _TorchDevice(abc.ABC):
    """What CUDA, CPU and MPS share: a session is a ``bench.session.TorchSession``."""

    index: int

    @property
    @abc.abstractmethod
    def kind(self) -> DeviceKind:
        """Which kind of device."""

    @property
    @abc.abstractmethod
    def spec(self) -> str:
        """The torch device string (``cuda:0``, ``cpu``, ``mps``)."""

    def torch_device(self) -> torch.device:
        import torch

        return torch.device(self.spec)

    def select(self) -> None:
        """Make this the current device of the process (nothing to do by default)."""
        return None

    def limit_memory(self, limit_bytes: int | None) -> str | None:
        """Apply ``--memory-limit`` where the runtime can; returns how (for the notes)."""
        return None

    def synchronize(self) -> None:
        """Wait for queued work (nothing is queued by default)."""
        return None

    def memory_tracker(
        self, baseline: Sequence[torch.Tensor], limit_bytes: int | None
    ) -> contextlib.AbstractContextManager[Callable[[], MemoryPeaks]]:
        """A context that watches the steps run in it; it yields a function returning the
        peaks, and raises ``StepOutOfMemory`` when ``limit_bytes`` is passed."""
        from whichgpu.bench.tensor_memory import live_bytes

        return live_bytes(baseline, limit_bytes)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the runtime running out of memory."""
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
        return isinstance(exc, RuntimeError) and bool(_OOM_TEXT.search(str(exc)))

    def nvml_target(self) -> NvmlTarget | None:
        return None

    def open_session(self, spec: StepSpec, report: Report) -> Session:
        from whichgpu.bench.session import TorchSession

        return TorchSession(self, spec, report)


@dataclass(frozen=True)
class CudaDevice(_TorchDevice):
    """An NVIDIA GPU through CUDA (``cuda:N``)."""

    index: int = 0
    """CUDA device index."""

    @property
    def kind(self) -> DeviceKind:
        return "cuda"

    @property
    def spec(self) -> str:
        return f"cuda:{self.index}"

    def for_rank(self, rank: int) -> Device:
        return CudaDevice(self.index + rank)

    def select(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise UsageError(_no_cuda_message(torch))
        if torch.cuda._is_in_bad_fork():
            raise BenchError(
                "CUDA was initialised in the process the bench forks its children from; run "
                "the bench from a fresh process."
            )
        count = torch.cuda.device_count()
        if self.index >= count:
            raise UsageError(
                f"--device {self.spec}: only {count} CUDA device(s) are visible "
                f"(cuda:0 to cuda:{count - 1})."
            )
        torch.cuda.set_device(self.index)

    def limit_memory(self, limit_bytes: int | None) -> str | None:
        import torch

        if limit_bytes is None:
            return None
        total = torch.cuda.get_device_properties(self.index).total_memory
        if limit_bytes >= total:
            return f"--memory-limit is above the GPU's {total} B; the GPU's own memory applies"
        torch.cuda.set_per_process_memory_fraction(limit_bytes / total, self.index)
        return (
            "memory limit: torch.cuda.set_per_process_memory_fraction caps what the caching "
            "allocator may reserve (the CUDA context is outside it)"
        )

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)

    def memory_tracker(
        self, baseline: Sequence[torch.Tensor], limit_bytes: int | None
    ) -> contextlib.AbstractContextManager[Callable[[], MemoryPeaks]]:
        return _allocator_peaks(self.index, limit_bytes)

    def nvml_target(self) -> NvmlTarget | None:
        return NvmlTarget(uuid=_cuda_uuid(self.index), index=self.index)

    def describe(self) -> DeviceFacts:
        import torch

        self.select()
        props = torch.cuda.get_device_properties(self.index)
        return DeviceFacts(
            name=str(props.name),
            uuid=_cuda_uuid(self.index),
            count=torch.cuda.device_count(),
            memory_total_bytes=int(props.total_memory),
        )


def _no_cuda_message(torch: Any) -> str:
    build = torch.version.cuda
    why = (
        f"this torch ({torch.__version__}) is a CPU build"
        if build is None
        else f"torch {torch.__version__} (CUDA {build}) finds no GPU or no working driver"
    )
    return (
        f"--device cuda: no CUDA GPU is available ({why}). Measure on the CPU with "
        "--device cpu (or --device mps on Apple silicon)."
    )


def _cuda_uuid(index: int) -> str | None:
    """``GPU-…``, as NVML and nvidia-smi print it (None if torch does not say)."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


@contextlib.contextmanager
def _allocator_peaks(index: int, limit_bytes: int | None) -> Iterator[Callable[[], MemoryPeaks]]:
    import torch

    torch.cuda.synchronize(index)
    torch.cuda.reset_peak_memory_stats(index)
    peaks = MemoryPeaks(None, None, "cuda caching allocator")

    def read() -> MemoryPeaks:
        return peaks

    yield read
    torch.cuda.synchronize(index)
    peaks = MemoryPeaks(
        allocated_bytes=int(torch.cuda.max_memory_allocated(index)),
        reserved_bytes=int(torch.cuda.max_memory_reserved(index)),
        method="torch.cuda.max_memory_allocated / max_memory_reserved",
    )
    reserved = peaks.reserved_bytes
    if limit_bytes is not None and reserved is not None and reserved > limit_bytes:
        raise StepOutOfMemory(
            f"reserved {peaks.reserved_bytes} B, more than the limit of {limit_bytes} B"
        )


@dataclass(frozen=True)
class CpuDevice(_TorchDevice):
    """The host CPU."""

    index: int = 0
    """Rank of a multi-process CPU run (the CPU is one device)."""

    @property
    def kind(self) -> DeviceKind:
        return "cpu"

    @property
    def spec(self) -> str:
        return "cpu"

    def torch_device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    def for_rank(self, rank: int) -> Device:
        return CpuDevice(rank)

    def limit_memory(self, limit_bytes: int | None) -> str | None:
        if limit_bytes is None:
            return None
        return (
            "memory limit (CPU): live tensor bytes counted at every allocation by a dispatch "
            "mode; out of memory when the count passes the limit"
        )

    def describe(self) -> DeviceFacts:
        from whichgpu.bench.environment import cpu_model, physical_memory_bytes

        return DeviceFacts(
            name=cpu_model() or "cpu",
            uuid=None,
            count=1,
            memory_total_bytes=physical_memory_bytes(),
        )


@dataclass(frozen=True)
class MpsDevice(_TorchDevice):
    """Apple silicon through Metal Performance Shaders."""

    index: int = 0
    """Always 0 (one GPU)."""

    @property
    def kind(self) -> DeviceKind:
        return "mps"

    @property
    def spec(self) -> str:
        return "mps"

    def for_rank(self, rank: int) -> Device:
        if rank:
            raise UsageError("MPS is one GPU; --gpus does not apply.")
        return self

    def select(self) -> None:
        import torch

        if not torch.backends.mps.is_available():
            raise UsageError(
                "--device mps: MPS is not available (it needs Apple silicon, macOS 12.3 or "
                "later and a torch built with MPS). Measure on the CPU with --device cpu."
            )

    def limit_memory(self, limit_bytes: int | None) -> str | None:
        import torch

        if limit_bytes is None:
            return None
        recommended = int(torch.mps.recommended_max_memory())
        if recommended > 0:
            torch.mps.set_per_process_memory_fraction(min(2.0, limit_bytes / recommended))
        return (
            "memory limit (MPS): live tensor bytes counted at every allocation by a dispatch "
            "mode, and torch.mps.set_per_process_memory_fraction"
        )

    def synchronize(self) -> None:
        import torch

        torch.mps.synchronize()

    def describe(self) -> DeviceFacts:
        import torch

        from whichgpu.bench.environment import cpu_model

        self.select()
        return DeviceFacts(
            name=f"{cpu_model() or 'Apple'} GPU (MPS)",
            uuid=None,
            count=1,
            memory_total_bytes=int(torch.mps.recommended_max_memory()) or None,
            notes=("MPS memory total is Metal's recommended working set size",),
        )


# --- the simulated device -------------------------------------------------------------------


@dataclass(frozen=True)
class FakeDevice:
    """A simulated device: memory and step time are formulas, failures are on request.

    One step of ``units = batch x (seq_len or 1)`` needs ``fixed_bytes + bytes_per_unit x
    units`` and takes ``step_base_s + step_per_unit_s x units`` seconds, the first
    ``slow_steps`` steps ``slow_factor`` times longer (as compilation and autotuning make them),
    each with a relative ``noise`` (seeded). The step sleeps that long (so timeouts are real),
    but its time is measured on the session's simulated clock (``FakeSession.clock``), which
    the step advances by exactly that much: the timings do not depend on how busy the machine
    is.
    """

    capacity_bytes: int = 16 * GIB
    """Memory of the device."""
    fixed_bytes: int = 1 * GIB
    """Memory of a step at any size (weights, gradients, optimizer state)."""
    bytes_per_unit: int = 64 * MIB
    """Memory per sample (times the sequence length, when there is one)."""
    step_base_s: float = 0.002
    """Time of a step at any size, s."""
    step_per_unit_s: float = 0.0001
    """Time per unit, s."""
    noise: float = 0.0
    """Relative standard deviation of step times."""
    slow_steps: int = 0
    """Steps at the start that are slow."""
    slow_factor: float = 10.0
    """How much slower they are."""
    oom_batches: frozenset[int] = field(default_factory=frozenset)
    """Batch sizes that run out of memory although they fit (non-monotonic memory)."""
    hang_from_batch: int | None = None
    """Batches at least this large hang forever."""
    crash_from_batch: int | None = None
    """Batches at least this large kill their process."""
    crash_with_signal: bool = False
    """Crash by SIGSEGV (else ``os._exit(3)``)."""
    fail_from_batch: int | None = None
    """Batches at least this large raise an ordinary error."""
    flops_per_unit: float | None = None
    """FLOPs per unit, for MFU tests."""
    name: str = "fake"
    """Name it reports."""
    index: int = 0
    """Rank of a multi-process run."""

    @property
    def kind(self) -> DeviceKind:
        return "fake"

    @property
    def spec(self) -> str:
        return "fake"

    def for_rank(self, rank: int) -> Device:
        return dataclasses.replace(self, index=rank)

    def describe(self) -> DeviceFacts:
        return DeviceFacts(
            name=self.name, uuid=None, count=1, memory_total_bytes=self.capacity_bytes
        )

    def memory_bytes(self, batch_size: int, seq_len: int | None) -> int:
        """Bytes one step needs."""
        return self.fixed_bytes + self.bytes_per_unit * batch_size * (seq_len or 1)

    def step_time_s(self, batch_size: int, seq_len: int | None) -> float:
        """Seconds one steady step takes (before noise)."""
        return self.step_base_s + self.step_per_unit_s * batch_size * (seq_len or 1)

    def open_session(self, spec: StepSpec, report: Report) -> Session:
        return FakeSession(self, spec)


class FakeSession:
    """A ``FakeDevice``'s step: sleeps, simulated memory, failures on request."""

    def __init__(self, device: FakeDevice, spec: StepSpec) -> None:
        info = spec.workload.resolve().info
        self._device = device
        self._spec = spec
        self._steps = 0
        self._random = random.Random(spec.batch_size * 1000 + device.index)
        seq = spec.seq_len if info.is_sequence_model else None
        per_sample = seq if info.throughput_unit == "tokens" and seq else 1
        self._units = spec.batch_size * per_sample
        self._need = device.memory_bytes(spec.batch_size, seq)
        self._seconds = device.step_time_s(spec.batch_size, seq)
        limit = spec.memory_limit_bytes or device.capacity_bytes
        self._capacity = min(device.capacity_bytes, limit)
        self._peak: int | None = None
        self._now_s = 0.0

    @property
    def units_per_step(self) -> int:
        return self._units

    @property
    def samples_per_step(self) -> int:
        return self._spec.batch_size

    @property
    def compiled(self) -> bool:
        return False

    @property
    def channels_last(self) -> bool:
        return False

    @property
    def notes(self) -> tuple[str, ...]:
        return ("simulated device: memory and step time are formulas, not measurements",)

    def step(self) -> None:
        batch = self._spec.batch_size
        device = self._device
        if device.hang_from_batch is not None and batch >= device.hang_from_batch:
            threading.Event().wait()
        if device.crash_from_batch is not None and batch >= device.crash_from_batch:
            if device.crash_with_signal:
                os.kill(os.getpid(), signal.SIGSEGV)
            os._exit(3)
        if device.fail_from_batch is not None and batch >= device.fail_from_batch:
            raise ValueError(f"simulated failure at batch {batch}")
        if batch in device.oom_batches or self._need > self._capacity:
            raise StepOutOfMemory(f"simulated: a step needs {self._need} B of {self._capacity} B")
        self._peak = self._need
        self._steps += 1
        seconds = self._seconds
        if self._steps <= device.slow_steps:
            seconds *= device.slow_factor
        if device.noise:
            seconds *= max(0.0, 1.0 + self._random.gauss(0.0, device.noise))
        time.sleep(seconds)
        self._now_s += seconds

    def clock(self) -> float:
        """Simulated seconds: the sum of the steps' times so far (not the wall clock)."""
        return self._now_s

    def synchronize(self) -> None:
        return None

    def memory_steps(self, steps: int) -> MemoryPeaks:
        for _ in range(steps):
            self.step()
        return self.run_peaks()

    def run_peaks(self) -> MemoryPeaks:
        if self._peak is None:
            return MemoryPeaks(None, None, "simulated")
        reserved = -(-self._peak // (2 * MIB)) * 2 * MIB
        return MemoryPeaks(self._peak, reserved, "simulated")

    def flops_per_step(self) -> FlopCount:
        per_unit = self._device.flops_per_unit
        if per_unit is None:
            return FlopCount(None, "FLOPs: the simulated device was given none (flops_per_unit)")
        return FlopCount(per_unit * self._units, "FLOPs: simulated (flops_per_unit x units)")

    def precision_state(self) -> PrecisionState:
        return PrecisionState()

    def agree(self, seconds: float) -> float:
        return seconds

    def nvml_target(self) -> NvmlTarget | None:
        return None

    def close(self) -> None:
        return None


# --- parsing ---------------------------------------------------------------------------------

_CUDA = re.compile(r"cuda(?::(\d+))?")


def parse_device(text: str) -> Device:
    """The device ``--device`` names: ``cuda``, ``cuda:N``, ``cpu``, ``mps`` or ``fake``."""
    name = text.strip().lower()
    match = _CUDA.fullmatch(name)
    if match:
        return CudaDevice(int(match.group(1) or 0))
    if name == "cpu":
        return CpuDevice()
    if name == "mps":
        return MpsDevice()
    if name == "fake":
        return FakeDevice()
    raise UsageError(
        f"--device {text}: expected cuda, cuda:N, cpu or mps (or fake, the simulated device)."
    )
