"""An NVIDIA GPU through CUDA (``cuda:N``). PyTorch's caching allocator counts the memory:
``--memory-limit`` becomes ``torch.cuda.set_per_process_memory_fraction(limit / total)``, so
the allocator itself refuses to reserve more (``torch.OutOfMemoryError``, as on a smaller
card); peaks are ``max_memory_allocated`` and ``max_memory_reserved``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from whichgpu.bench.devices.protocol import (
    Device,
    DeviceFacts,
    MemoryPeaks,
    NvmlTarget,
    StepOutOfMemory,
)
from whichgpu.bench.devices.torch_device import TorchDevice
from whichgpu.errors import CudaForkPoisoned, UsageError
from whichgpu.schema import DeviceKind

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CudaDevice(TorchDevice):
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
            raise CudaForkPoisoned(
                "CUDA was initialised in the process the bench forks its children from (an "
                "import that touches the GPU); the bench spawns its children instead."
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
