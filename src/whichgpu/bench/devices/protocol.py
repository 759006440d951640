"""The device protocol of the bench, and the values that cross it.

A ``Device`` is where a bench runs (``cuda``, ``cpu``, ``mps`` or the simulated ``fake``);
devices are frozen dataclasses, so they pickle into each child process, where
``open_session`` builds the step on them and returns a ``Session``: run a step, synchronise,
measure memory, count FLOPs. The implementations are the other modules of this package; this
one imports none of them, nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from whichgpu.bench.flops import FlopCount
from whichgpu.bench.jobs import BenchProgress, PrecisionState, StepSpec
from whichgpu.schema import DeviceKind

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
