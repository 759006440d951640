"""The simulated device the harness's tests run on: a capacity of ``fixed + bytes_per_unit x
batch x seq_len``, step times by formula on a simulated clock, and failures on request (a
size that runs out of memory although it fits, a hang, a crash, an error)."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field

from whichgpu.bench.devices.protocol import (
    Device,
    DeviceFacts,
    MemoryPeaks,
    NvmlTarget,
    Report,
    Session,
    StepOutOfMemory,
)
from whichgpu.bench.flops import FlopCount
from whichgpu.bench.jobs import PrecisionState, StepSpec
from whichgpu.schema import DeviceKind
from whichgpu.units import GIB, MIB


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
