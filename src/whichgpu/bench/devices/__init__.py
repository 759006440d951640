"""Devices a bench runs on: the protocol (``protocol``: ``Device``, ``Session`` and the values
that cross them) apart from its implementations, one module per kind: ``cuda``, ``cpu``,
``mps`` (sharing ``torch_device``) and the simulated ``fake``. The parent process makes a
``Device`` from ``--device`` (``parse_device``). How each kind measures memory is in its
module and in ``docs/bench.md``. Nothing here imports torch at module level; the torch
devices import it in their methods, which run only in child processes.
"""

from __future__ import annotations

import re

from whichgpu.bench.devices.cpu import CpuDevice
from whichgpu.bench.devices.cuda import CudaDevice
from whichgpu.bench.devices.fake import FakeDevice, FakeSession
from whichgpu.bench.devices.mps import MpsDevice
from whichgpu.bench.devices.protocol import (
    Device,
    DeviceFacts,
    MemoryPeaks,
    NvmlTarget,
    Report,
    Session,
    StepOutOfMemory,
)
from whichgpu.bench.devices.torch_device import TorchDevice
from whichgpu.errors import UsageError

__all__ = [
    "CpuDevice",
    "CudaDevice",
    "Device",
    "DeviceFacts",
    "FakeDevice",
    "FakeSession",
    "MemoryPeaks",
    "MpsDevice",
    "NvmlTarget",
    "Report",
    "Session",
    "StepOutOfMemory",
    "TorchDevice",
    "parse_device",
]

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
