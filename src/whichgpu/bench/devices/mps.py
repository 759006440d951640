"""Apple silicon through Metal Performance Shaders. Memory is the CPU's count of live tensor
bytes (MPS keeps no peak statistics); ``--memory-limit`` also sets
``torch.mps.set_per_process_memory_fraction``."""

from __future__ import annotations

from dataclasses import dataclass

from whichgpu.bench.devices.protocol import Device, DeviceFacts
from whichgpu.bench.devices.torch_device import TorchDevice
from whichgpu.errors import UsageError
from whichgpu.schema import DeviceKind


@dataclass(frozen=True)
class MpsDevice(TorchDevice):
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
