"""The host CPU. There is no allocator to cap: a light dispatch mode
(``tensor_memory.LiveBytes``) counts the bytes of every live tensor storage — the parameters,
buffers and batch that exist before the step, and every storage an operator creates, until it
is freed — and raises the typed out-of-memory error as soon as the count passes the limit, at
the allocation, as an allocator would. The peak is that count's maximum: exact and
repeatable, but blind to allocator caching and fragmentation (the CPU allocator returns
memory at once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from whichgpu.bench.devices.protocol import Device, DeviceFacts
from whichgpu.bench.devices.torch_device import TorchDevice
from whichgpu.schema import DeviceKind

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CpuDevice(TorchDevice):
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
