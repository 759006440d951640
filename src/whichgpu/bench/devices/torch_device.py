"""What the torch devices (CUDA, CPU, MPS) share: a session is a ``bench.session.TorchSession``;
memory is the live tensor bytes (``bench.tensor_memory``) unless a device has an allocator to
ask; the runtime's out-of-memory errors are recognised. torch is imported in the methods only,
which run in child processes."""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from whichgpu.bench.devices.protocol import MemoryPeaks, NvmlTarget, Report, Session
from whichgpu.bench.jobs import StepSpec
from whichgpu.schema import DeviceKind

if TYPE_CHECKING:
    import torch


def _oom_message(exc: BaseException) -> str:
    """The first line of an out-of-memory error (the allocator's own account)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_OOM_TEXT = re.compile(r"out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED", re.I)


class TorchDevice(abc.ABC):
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
