"""Live tensor bytes during a step: the memory measure and the memory limit of the CPU and MPS.

Neither device has an allocator whose peak PyTorch reports or whose size can be capped, so
``LiveBytes`` counts memory itself: a ``TorchDispatchMode`` that adds the bytes of each new
storage an operator returns and subtracts them when the storage is freed (a weak reference's
callback), starting from the storages that exist before the step (parameters, buffers, the
batch, optimizer state). Views share their base's storage and are counted once. Past the limit
it raises ``StepOutOfMemory`` at the allocating operator, as a capped allocator would.

The count is exact for tensors and the same on every run (so a search is repeatable); what it
leaves out — the allocator's caching and fragmentation, library workspaces, the interpreter —
is the difference between it and the process's resident memory. Runs only in child processes.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from whichgpu.bench.devices.protocol import MemoryPeaks, StepOutOfMemory

METHOD = "live tensor storage bytes (dispatch-mode count, no allocator caching)"


class LiveBytes(TorchDispatchMode):
    """Counts live storage bytes while active; raises ``StepOutOfMemory`` past ``limit_bytes``."""

    def __init__(self, baseline: Iterable[torch.Tensor], limit_bytes: int | None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.limit_bytes = limit_bytes
        self.current_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, tuple[int, weakref.ref[Any]]] = {}
        for tensor in baseline:
            self._track(tensor, check=False)
        self.baseline_bytes = self.current_bytes
        self._check()

    def _track(self, tensor: torch.Tensor, *, check: bool = True) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
            return
        key = id(storage)
        if key in self._live:
            return
        size = int(storage.nbytes())
        self._live[key] = (size, weakref.ref(storage, functools.partial(self._free, key, size)))
        self.current_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        if check:
            self._check()

    def _free(self, key: int, size: int, _ref: object = None) -> None:
        if self._live.pop(key, None) is not None:
            self.current_bytes -= size

    def _check(self) -> None:
        if self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
            raise StepOutOfMemory(
                f"live tensors reached {self.current_bytes} B, more than the limit of "
                f"{self.limit_bytes} B"
            )

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return out


@contextlib.contextmanager
def live_bytes(
    baseline: Iterable[torch.Tensor], limit_bytes: int | None
) -> Iterator[Callable[[], MemoryPeaks]]:
    """Count live bytes of the steps run inside; yields a function returning the peaks."""
    mode = LiveBytes(baseline, limit_bytes)

    def read() -> MemoryPeaks:
        return MemoryPeaks(allocated_bytes=mode.peak_bytes, reserved_bytes=None, method=METHOD)

    with mode:
        yield read
