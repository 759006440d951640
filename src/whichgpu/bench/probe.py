"""Run bench work in child processes, with a timeout, and get back a typed outcome.

Every probe and every measurement runs in a process of its own, so that running out of
memory, a hang, a crash of the interpreter or a broken CUDA context ends that process and
never the harness. The child sends progress and then one outcome through a pipe:

- ``Ran``: it finished; carries what the task returned;
- ``OutOfMemory``: the step needed more memory than the device or the limit allows
  (``torch.OutOfMemoryError`` on CUDA and MPS, the live-tensor count on the CPU);
- ``Failed``: the task raised; carries the error's kind, message and traceback.

The parent adds the outcomes a child cannot send:

- ``TimedOut``: no progress for ``timeout_s`` seconds (each progress message restarts the
  clock, so a slow step is not a hang); the child is killed;
- ``Crashed``: the child exited without an outcome (a signal such as SIGSEGV or the kernel's
  SIGKILL when memory ran out, or ``os._exit``).

Children start from a fork server (Linux) that has imported torch and transformers once (for
torch devices; ``prepare``), so a child starts in a fraction of a second instead of importing
them again; the fork server never touches a GPU, so each child initialises CUDA afresh (the
server asks NVML, not the driver, whether CUDA is there, when an import asks).
Elsewhere (macOS, Windows) children are spawned. A child ignores Ctrl-C (the parent stops
it), and exits if its parent disappears. The parent waits on the pipes and the process
sentinels; it never polls in a busy loop.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Generic, Literal, TypeVar, Union

from whichgpu.bench.devices.protocol import StepOutOfMemory
from whichgpu.bench.jobs import BenchProgress
from whichgpu.errors import (
    CudaForkPoisoned,
    NamesOptions,
    UsageError,
    WhichGpuError,
    WorkloadError,
)

T = TypeVar("T")
J = TypeVar("J")


@dataclass(frozen=True)
class Ran(Generic[T]):
    """The task finished."""

    value: T
    """What it returned."""
    seconds: float
    """Its time in the child, s."""


@dataclass(frozen=True)
class OutOfMemory:
    """The step did not fit."""

    detail: str
    """The runtime's (or the limit's) own account."""
    seconds: float
    """Time until it failed, s."""


@dataclass(frozen=True)
class TimedOut:
    """No progress for ``timeout_s``; the child was killed."""

    timeout_s: float
    """The limit."""
    last: str
    """The last thing the child said it was doing."""


@dataclass(frozen=True)
class Crashed:
    """The child ended without sending an outcome."""

    exitcode: int | None
    """Its exit code (negative: the signal that ended it)."""
    detail: str
    """What ended it, in words."""


FailureKind = Literal["usage", "workload", "bench", "fork", "error"]


@dataclass(frozen=True)
class Failed:
    """The task raised an error."""

    kind: FailureKind
    """``usage`` (bad options), ``workload`` (it cannot run as asked), ``bench`` (a harness
    error with a message for the user), ``fork`` (CUDA unusable in a child forked from a
    process that had initialised it: the job is run again in a spawned child) or ``error``
    (anything else)."""
    message: str
    """``Type: message`` for ``error``; the message itself otherwise."""
    traceback: str
    """The child's traceback."""


Outcome = Union[Ran[T], OutOfMemory, TimedOut, Crashed, Failed]  # noqa: UP007 - generic alias
"""What running a task in a child process gives."""

Report = Callable[[BenchProgress], None]
"""Where a task sends progress."""

LIGHT_PRELOAD = ("__main__", "whichgpu.bench.worker")
"""What the fork server imports for children of the simulated device."""
TORCH_PRELOAD = (
    *LIGHT_PRELOAD,
    "whichgpu.bench.quiet_imports",
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "whichgpu.bench.session",
)
"""What it imports for children of a torch device (those installed): the imports a child
would otherwise repeat, several seconds each time."""

_preload: tuple[str, ...] | None = None
"""The fork server's preload, decided once per process (the server lives as long as it)."""


def prepare(device_kind: str) -> None:
    """Choose what the fork server preloads for the children to come: torch and transformers
    for a torch device, nothing heavy for the simulated one. The first choice of a process
    holds (its fork server then runs until the process ends); a later choice only changes
    how fast children start, never what they do."""
    global _preload
    if _preload is None:
        _preload = LIGHT_PRELOAD if device_kind == "fake" else TORCH_PRELOAD


PROGRESS_INTERVAL_S = 0.2
"""Least time between two progress messages of the same stage."""
TEARDOWN_S = 60.0
"""How long a child that sent its outcome may take to exit (CUDA teardown) before it is
killed."""


def describe(outcome: Outcome[Any]) -> str:
    """An outcome in a few words."""
    if isinstance(outcome, Ran):
        return f"ran ({outcome.seconds:.1f} s)"
    if isinstance(outcome, OutOfMemory):
        return f"out of memory ({outcome.detail})"
    if isinstance(outcome, TimedOut):
        return f"timed out: no progress for {outcome.timeout_s:g} s (last: {outcome.last})"
    if isinstance(outcome, Crashed):
        return f"crashed: {outcome.detail}"
    return f"failed: {outcome.message}"


def start_method() -> str:
    """``forkserver`` on Linux, ``spawn`` elsewhere."""
    if sys.platform.startswith("linux") and "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return "spawn"


def _context() -> Any:  # a SpawnContext or ForkServerContext (typeshed's BaseContext lacks
    # ``Process``, and ForkServerContext does not exist on Windows)
    method = start_method()
    if _spawn_only:
        method = "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        prepare("cuda")
        assert _preload is not None
        context.set_forkserver_preload(list(_preload))
        _start_forkserver_deaf_to_ctrl_c()
    return context


def _start_forkserver_deaf_to_ctrl_c() -> None:
    """Start the fork server (if it is not running) with Ctrl-C ignored, as it ignores it once
    its preloaded imports are done: a Ctrl-C during those imports (torch takes seconds) would
    print its traceback. The parent stops the bench; the server and its children (which
    inherit the ignoring, and set it themselves) are stopped by it."""
    from multiprocessing import forkserver

    with _nvml_cuda_check():
        if threading.current_thread() is not threading.main_thread():
            forkserver.ensure_running()
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # kept across the server's exec
        try:
            forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGINT, previous)


NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""PyTorch's switch that makes ``torch.cuda.is_available()`` and ``device_count()`` ask NVML
instead of initialising the CUDA driver."""


@contextlib.contextmanager
def _nvml_cuda_check() -> Iterator[None]:
    """Start the fork server with ``NVML_CUDA_CHECK`` set (unless the user set it): libraries
    ask ``torch.cuda.is_available()`` as they are imported (torchao does, and transformers
    imports torchao where it is installed), and without the switch that call initialises the
    driver in the server, so that every child forked from it finds CUDA unusable. The parent's
    own environment is left as it was."""
    if NVML_CUDA_CHECK in os.environ:
        yield
        return
    os.environ[NVML_CUDA_CHECK] = "1"
    try:
        yield
    finally:
        os.environ.pop(NVML_CUDA_CHECK, None)


def run_in_child(
    task: Callable[[J, Report], T],
    job: J,
    *,
    timeout_s: float,
    on_progress: Report | None = None,
) -> Outcome[T]:
    """Run ``task(job, report)`` in a child process; its outcome."""
    return run_in_children(task, [job], timeout_s=timeout_s, on_progress=on_progress)[0]


def run_in_children(
    task: Callable[[J, Report], T],
    jobs: Sequence[J],
    *,
    timeout_s: float,
    on_progress: Report | None = None,
) -> list[Outcome[T]]:
    """Run ``task`` on each job, each in its own child process, all at once (the ranks of a
    multi-GPU run); their outcomes, in order. When one fails, the others are stopped: they
    would wait forever for it in a collective. Children that found CUDA unusable after the
    fork (``Failed("fork")``: an import in the fork server initialised it) are run again,
    spawned, and so is every child after them in this process."""
    global _spawn_only
    outcomes = _run_in_children(task, jobs, timeout_s=timeout_s, on_progress=on_progress)
    if _spawn_only or not any(isinstance(o, Failed) and o.kind == "fork" for o in outcomes):
        return outcomes
    _spawn_only = True
    if on_progress is not None:
        on_progress(BenchProgress("inspect", f"{_fork_failure(outcomes)}"))
    return _run_in_children(task, jobs, timeout_s=timeout_s, on_progress=on_progress)


_spawn_only = False
"""Whether this process spawns its children (set once a forked one found CUDA unusable)."""


def _fork_failure(outcomes: Sequence[Outcome[Any]]) -> str:
    return next(o.message for o in outcomes if isinstance(o, Failed) and o.kind == "fork")


def _run_in_children(
    task: Callable[[J, Report], T],
    jobs: Sequence[J],
    *,
    timeout_s: float,
    on_progress: Report | None,
) -> list[Outcome[T]]:
    context = _context()
    children: list[_Child[T]] = []
    try:
        for job in jobs:
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=_child_main,
                args=(sender, task, job, os.getpid()),
                daemon=True,
                name="whichgpu-bench",
            )
            with _ctrl_c_deferred():  # a started child is always one we will stop
                process.start()
                children.append(_Child(process, receiver, time.monotonic() + timeout_s))
            sender.close()
        _supervise(children, timeout_s, on_progress)
    finally:
        for child in children:
            child.finish()
    return [child.outcome for child in children if child.outcome is not None]


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back until the block is done, where signals can be masked."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    mask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        mask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _Child(Generic[T]):
    """A child process seen from the parent."""

    def __init__(self, process: BaseProcess, receiver: Connection, deadline: float) -> None:
        self.process = process
        self.receiver = receiver
        self.deadline = deadline
        self.outcome: Outcome[T] | None = None
        self.last = "starting"

    def read(self, timeout_s: float, on_progress: Report | None) -> None:
        """Take every message waiting; an exit without an outcome is a crash."""
        while self.outcome is None:
            try:
                if not self.receiver.poll():
                    break
                kind, payload = self.receiver.recv()
            except (EOFError, OSError):
                self.outcome = self._crashed()
                return
            if kind == "progress":
                self.deadline = time.monotonic() + timeout_s
                self.last = payload.message
                if on_progress is not None:
                    on_progress(payload)
            else:
                self.outcome = payload
        if self.outcome is None and not self.process.is_alive() and not self.receiver.poll():
            self.outcome = self._crashed()

    def _crashed(self) -> Crashed:
        self.process.join(5)
        code = self.process.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = " (the system may have run out of memory)" if -code == signal.SIGKILL else ""
            return Crashed(code, f"killed by {name} while {self.last}{hint}")
        return Crashed(code, f"exited with code {code} without a result while {self.last}")

    def finish(self) -> None:
        """Make sure the process is gone and its pipe closed."""
        if self.process.is_alive():
            if isinstance(self.outcome, Ran):
                self.process.join(TEARDOWN_S)
            if self.process.is_alive():
                self.process.kill()
        self.process.join()
        self.receiver.close()
        self.process.close()


def _supervise(children: list[_Child[T]], timeout_s: float, on_progress: Report | None) -> None:
    while True:
        pending = [c for c in children if c.outcome is None]
        if not pending:
            return
        failed = [i for i, c in enumerate(children) if c.outcome is not None and not _ran(c)]
        if failed and len(children) > 1:
            first = children[failed[0]]
            assert first.outcome is not None
            for child in pending:
                child.outcome = Failed(
                    "bench",
                    f"stopped because rank {failed[0]} {describe(first.outcome)}",
                    "",
                )
            return
        now = time.monotonic()
        for child in pending:
            if now >= child.deadline:
                child.outcome = TimedOut(timeout_s, child.last)
        pending = [c for c in pending if c.outcome is None]
        if not pending:
            continue
        waitables: list[Any] = [c.receiver for c in pending] + [c.process.sentinel for c in pending]
        wait(waitables, timeout=max(0.0, min(c.deadline for c in pending) - now))
        for child in pending:
            child.read(timeout_s, on_progress)


def _ran(child: _Child[Any]) -> bool:
    return isinstance(child.outcome, Ran)


# --- the child's side ------------------------------------------------------------------------


def _child_main(sender: Connection, task: Callable[[J, Report], Any], job: J, parent: int) -> None:
    """Entry point of a child process: run the task, send progress and the outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent)
    started = time.monotonic()
    last_sent: dict[str, float] = {}

    def report(event: BenchProgress) -> None:
        now = time.monotonic()
        if now - last_sent.get(event.stage, -PROGRESS_INTERVAL_S) < PROGRESS_INTERVAL_S:
            return
        last_sent[event.stage] = now
        _send(sender, ("progress", event))

    outcome: Outcome[Any]
    try:
        outcome = Ran(task(job, report), time.monotonic() - started)
    except StepOutOfMemory as exc:
        outcome = OutOfMemory(str(exc), time.monotonic() - started)
    except Exception as exc:
        outcome = _failure(exc)
    try:
        _send(sender, ("result", outcome))
    except Exception as exc:  # the value did not pickle
        _send(sender, ("result", _failure(exc)))
    sender.close()


def _send(sender: Connection, message: tuple[str, Any]) -> None:
    """Send to the parent; if it stopped listening (it was interrupted), end quietly."""
    try:
        sender.send(message)
    except (BrokenPipeError, ConnectionResetError):
        os._exit(0)


def _failure(exc: Exception) -> Failed:
    trace = traceback.format_exc()
    # an error naming options crosses as its template, so the parent's front end names them
    message = exc.template if isinstance(exc, NamesOptions) else str(exc)
    if isinstance(exc, CudaForkPoisoned):
        return Failed("fork", message, trace)
    if isinstance(exc, UsageError):
        return Failed("usage", message, trace)
    if isinstance(exc, WorkloadError):
        return Failed("workload", message, trace)
    if isinstance(exc, WhichGpuError):
        return Failed("bench", str(exc), trace)
    return Failed("error", f"{type(exc).__name__}: {exc}".strip(), trace)


def _exit_with_parent(parent: int) -> None:
    """A daemon thread that ends this process when the harness is gone (SIGKILL leaves no
    chance to stop children; a hung child would otherwise run on)."""
    original = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            gone = os.getppid() != original
            if not gone:
                try:
                    os.kill(parent, 0)
                except ProcessLookupError:
                    gone = True
                except PermissionError:
                    pass
            if gone:
                os._exit(1)

    threading.Thread(target=watch, name="whichgpu-parent-watch", daemon=True).start()
