"""GPU power, clocks, temperature and utilisation while a bench times, through NVML.

``NvmlSampler`` is a thread that reads the GPU every ``period_s`` while the timed steps run
(``pynvml``, from the ``nvidia-ml-py`` package). Energy comes from the GPU's own energy
counter (``nvmlDeviceGetTotalEnergyConsumption``, Volta and later) read at the start and the
end, else from the mean sampled power times the time. Without NVML, a GPU or the package, the
summary has no samples and says why; nothing fails. ``gpu_facts`` reads what does not change
during a run: driver, power limit, the link between GPUs, other processes on the GPU.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from whichgpu.bench.devices.protocol import NvmlTarget


@dataclass(frozen=True)
class PowerSummary:
    """What NVML read while the steps were timed."""

    samples: int = 0
    """Readings taken."""
    seconds: float = 0.0
    """Time between the first and the last reading, s."""
    power_w: float | None = None
    """Mean board power, W."""
    energy_j: float | None = None
    """Energy over the timed steps, J."""
    energy_method: str | None = None
    """``energy counter`` or ``mean power x time``."""
    sm_clock_mhz: float | None = None
    """Mean SM clock, MHz."""
    temperature_c: float | None = None
    """Highest temperature, °C."""
    utilization: float | None = None
    """Mean utilisation (fraction)."""
    used_bytes: int | None = None
    """Most device memory in use (all processes, the CUDA context included)."""
    notes: tuple[str, ...] = field(default=())
    """Why figures are missing."""


@dataclass(frozen=True)
class GpuFacts:
    """NVML's account of a GPU that does not change while it runs."""

    driver_version: str | None = None
    """NVIDIA driver version."""
    power_limit_w: float | None = None
    """Power limit in force, W."""
    interconnect: str | None = None
    """How the GPUs of a multi-GPU run are linked."""
    notes: tuple[str, ...] = field(default=())
    """What could not be read, and other processes found on the GPU."""


def _pynvml() -> Any:
    """The initialised ``pynvml`` module; raises with a reason when there is none."""
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("nvidia-ml-py is not installed") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise RuntimeError(f"NVML did not start ({exc})") from exc
    return pynvml


def _handle(nvml: Any, target: NvmlTarget) -> Any:
    if target.uuid:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(target.uuid)
        except Exception:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(target.index)


class NvmlSampler:
    """Samples one GPU from ``start()`` to ``stop()`` in a background thread."""

    def __init__(self, target: NvmlTarget | None, period_s: float = 0.1) -> None:
        self._target = target
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self._power: list[float] = []
        self._clock: list[float] = []
        self._temperature: list[float] = []
        self._utilization: list[float] = []
        self._used: list[int] = []
        self._energy_start: int | None = None
        self._started = 0.0
        self._last = 0.0
        self._notes: list[str] = []

    def start(self) -> None:
        """Begin sampling (no-op without a GPU or NVML)."""
        if self._target is None:
            self._notes.append("no NVML readings: not an NVIDIA GPU")
            return
        try:
            self._nvml = _pynvml()
            self._handle = _handle(self._nvml, self._target)
        except Exception as exc:
            self._notes.append(f"no NVML readings: {exc}")
            self._nvml = None
            return
        try:
            self._energy_start = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:
            self._energy_start = None
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="whichgpu-nvml", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self._read()
            if self._stop.wait(self._period_s):
                return

    def _read(self) -> None:
        nvml, handle = self._nvml, self._handle
        self._last = time.perf_counter()
        _sample(self._power, lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        _sample(self._clock, lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
        _sample(
            self._temperature,
            lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        )
        _sample(self._utilization, lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        _sample(self._used, lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).used))

    def stop(self) -> PowerSummary:
        """Stop sampling and summarise."""
        if self._thread is None:
            return PowerSummary(notes=tuple(self._notes))
        self._stop.set()
        self._thread.join()
        self._read()
        seconds = self._last - self._started
        energy: float | None = None
        method: str | None = None
        if self._energy_start is not None:
            try:
                end = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
                energy, method = (end - self._energy_start) / 1000.0, "energy counter"
            except Exception:
                energy = None
        power = statistics.fmean(self._power) if self._power else None
        if energy is None and power is not None:
            energy, method = power * seconds, "mean power x time"
        return PowerSummary(
            samples=len(self._power),
            seconds=seconds,
            power_w=power,
            energy_j=energy,
            energy_method=method,
            sm_clock_mhz=statistics.fmean(self._clock) if self._clock else None,
            temperature_c=max(self._temperature) if self._temperature else None,
            utilization=statistics.fmean(self._utilization) if self._utilization else None,
            used_bytes=max(self._used) if self._used else None,
            notes=tuple(self._notes),
        )


_TOPOLOGY = {
    0: "same board",
    10: "PCIe, one switch",
    20: "PCIe, several switches",
    30: "PCIe, through the host bridge",
    40: "PCIe, through the CPU (same NUMA node)",
    50: "PCIe, across CPU sockets",
}
"""NVML's topology levels (``NVML_TOPOLOGY_*``), in words."""


def gpu_facts(targets: Sequence[NvmlTarget]) -> GpuFacts:
    """Driver, power limit (of the first GPU), interconnect (between the first two), and other
    processes using the GPUs."""
    if not targets:
        return GpuFacts()
    try:
        nvml = _pynvml()
        handles = [_handle(nvml, t) for t in targets]
    except Exception as exc:
        return GpuFacts(notes=(f"driver and power limit unknown: {exc}",))
    notes: list[str] = []
    driver = _text(_try(nvml.nvmlSystemGetDriverVersion))
    limit_mw = _try(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handles[0]))
    interconnect = _interconnect(nvml, handles) if len(handles) > 1 else None
    for index, handle in enumerate(handles):
        processes = _try(lambda h=handle: nvml.nvmlDeviceGetComputeRunningProcesses(h)) or []
        others = [p for p in processes if getattr(p, "pid", None) != os.getpid()]
        if others:
            notes.append(
                f"{len(others)} other process(es) were using GPU {targets[index].index}: "
                "results may be slower than the GPU alone"
            )
    return GpuFacts(
        driver_version=driver,
        power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
        interconnect=interconnect,
        notes=tuple(notes),
    )


def _interconnect(nvml: Any, handles: Sequence[Any]) -> str | None:
    links = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        state = _try(lambda link=link: nvml.nvmlDeviceGetNvLinkState(handles[0], link))
        if state:
            links += 1
    level = _try(lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(handles[0], handles[1]))
    generation = _try(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handles[0]))
    width = _try(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handles[0]))
    pcie = f"PCIe gen {generation} x{width}" if generation and width else "PCIe"
    path = _TOPOLOGY.get(int(level)) if level is not None else None
    if links:
        return f"NVLink ({links} links active on GPU 0); {pcie}" + (f", {path}" if path else "")
    if path is None:
        return pcie if generation else None
    return f"{pcie}, {path}"


_T = TypeVar("_T")


def _sample(values: list[_T], read: Callable[[], _T]) -> None:
    """Append one reading (a metric this GPU does not report is left out)."""
    try:
        values.append(read())
    except Exception:
        return


def _try(read: Any) -> Any:
    try:
        return read()
    except Exception:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
