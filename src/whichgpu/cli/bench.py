"""``whichgpu bench``: measure workloads on this machine's GPU (or CPU), and keep the results."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, Protocol, TextIO

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from whichgpu.cli import options as o
from whichgpu.cli import requests as r
from whichgpu.cli.output import emit, emit_error, emit_json, error_message
from whichgpu.cli.results import StoreOption
from whichgpu.errors import (
    BenchError,
    GpuLookupError,
    UsageError,
    WhichGpuError,
    WorkloadError,
)
from whichgpu.schema import BenchResult

if TYPE_CHECKING:
    from rich.console import RenderableType

    from whichgpu.bench.distributed import TorchrunGroup
    from whichgpu.bench.engine import EngineBenchResult
    from whichgpu.bench.jobs import BenchProgress

EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class SuiteEntry:
    """A workload of a suite, with the settings the suite runs it at (unless the user gives
    others)."""

    workload: str
    """Registered workload."""
    precision: str | None = None
    """Precision (None: the run's)."""
    seq_len: int | None = None
    """Sequence length (None: the workload's default)."""


def suites() -> dict[str, tuple[SuiteEntry, ...]]:
    """The named suites: ``lambda2020`` (the twelve models of Lambda's 2020 table, at the
    settings ``validate`` reads them with) and ``modern`` (models people train today)."""
    from whichgpu.validate.lambda2020 import LAMBDA_MODELS

    return {
        "lambda2020": tuple(
            SuiteEntry(m.workload, m.precision, m.seq_len) for m in LAMBDA_MODELS.values()
        ),
        "modern": tuple(
            SuiteEntry(name)
            for name in ("resnet50", "vit-b-16", "bert-base", "gpt2", "llama-3.2-1b")
        ),
    }


def bench(
    ctx: typer.Context,
    workloads: Annotated[
        Optional[list[str]],  # noqa: UP045 - typer needs Optional at runtime on Python 3.10
        typer.Argument(
            help="Named workloads to measure (see `whichgpu workloads`), e.g. resnet50 gpt2.",
            show_default=False,
        ),
    ] = None,
    suite: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--suite",
            help="A named set of workloads: lambda2020 (Lambda's 2020 table, at its settings) "
            "or modern (resnet50, vit-b-16, bert-base, gpt2, llama-3.2-1b).",
        ),
    ] = None,
    config: o.ConfigOption = None,
    model: o.ModelOption = None,
    task: o.TaskOption = None,
    device: Annotated[
        str,
        typer.Option(
            "--device",
            help="cuda, cuda:N, cpu or mps (Apple silicon). fake is a simulated device for "
            "trying the harness.",
        ),
    ] = "cuda",
    mode: o.ModeOption = None,
    precision: o.PrecisionOption = None,
    fp8_recipe: o.Fp8RecipeOption = None,
    batch_size: o.BatchOption = None,
    seq_len: o.SeqOption = None,
    optimizer: o.OptimizerOption = None,
    optimizer_impl: o.OptimizerImplOption = None,
    loss_kernel: o.LossKernelOption = None,
    checkpointing: o.CheckpointingOption = False,
    checkpointing_policy: o.CheckpointingPolicyOption = None,
    method: o.MethodOption = None,
    lora_rank: o.LoraRankOption = None,
    lora_targets: o.LoraTargetsOption = None,
    context: o.ContextOption = None,
    new_tokens: o.NewTokensOption = None,
    concurrency: o.BenchConcurrencyOption = None,
    gpus: o.BenchGpusOption = None,
    find_max_batch: Annotated[
        bool,
        typer.Option(
            "--find-max-batch",
            help="Search the largest batch that runs, and measure at it: from whichgpu's own "
            "prediction where a stored profile gives one (galloping), else doubling from 1; then "
            "bisection. The notes say how far the prediction was off.",
        ),
    ] = False,
    max_batch_resolution: Annotated[
        int,
        typer.Option(
            "--max-batch-resolution",
            min=1,
            help="Stop the search when the largest batch is known to within N (1 = exact).",
        ),
    ] = 1,
    find_max_seq_len: Annotated[
        bool,
        typer.Option(
            "--find-max-seq-len",
            help="Search the longest sequence that runs at the batch, and measure at it.",
        ),
    ] = False,
    memory_limit: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--memory-limit",
            help="GiB a step may use: sizes for a smaller card (about its memory less the CUDA "
            "context), and gives the CPU a search limit (counted as live tensor bytes).",
            metavar="GIB",
        ),
    ] = None,
    compile: Annotated[
        bool, typer.Option("--compile", help="Measure the model under torch.compile.")
    ] = False,
    channels_last: Annotated[
        bool,
        typer.Option("--channels-last", help="Channels-last images and weights (CNNs)."),
    ] = False,
    min_seconds: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--min-seconds", help="Seconds of timed steps, at least (default 5)."),
    ] = None,
    min_iters: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--min-iters", help="Timed steps, at least (default 10)."),
    ] = None,
    timeout: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            "--timeout",
            help="Stop a probe or measurement that makes no progress (builds nothing, finishes "
            "no step) for this many seconds (default 600).",
            metavar="S",
        ),
    ] = None,
    serving: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--serving",
            help="With --mode inference: measure a causal language model served by vLLM "
            "(`pip install vllm`, CUDA) instead: a burst of --concurrency requests of "
            "--context random token ids, --new-tokens each, random weights (no download); "
            "burst TTFT, TPOT and output tokens/s, beside whichgpu's prediction. Not stored.",
            show_default=False,
        ),
    ] = None,
    store: StoreOption = None,
    no_store: Annotated[bool, typer.Option("--no-store", help="Do not keep the results.")] = False,
    json: o.JsonOption = False,
) -> None:
    """Measure workloads on this machine: largest batch, throughput, memory, power, MFU.

    Each workload is built with random weights and fed synthetic data. With --find-max-batch
    the largest batch is searched first, each probe in a process of its own (running out of
    memory, hanging or crashing ends that process, not the bench). The step is then warmed up
    until its time is steady and timed for at least --min-iters steps and --min-seconds
    seconds; the result has the median step time and its spread, throughput in the
    workload's unit, peak memory, GPU power, clocks and temperature (NVML), MFU against the
    catalog's peak, and the machine and software it ran with. With --gpus N the GPUs of this
    node then train together (DDP) and the scaling efficiency is reported.

    Every result is stored as soon as it is measured (`whichgpu results list`); Ctrl-C stops
    the bench and keeps what finished.

    Under torchrun (across nodes) every torchrun process is one rank measuring its own
    device (cuda:LOCAL_RANK, or the CPU) with all the others (DDP); rank 0 alone prints,
    stores and shows progress. --gpus, --find-max-batch, --find-max-seq-len and --mode
    inference are refused there.

    With --serving vllm a causal language model is measured through vLLM's offline engine
    (optional: `pip install vllm` on a CUDA machine) instead of whichgpu's own step: a burst
    of --concurrency requests arriving together, timed with one token and with --new-tokens;
    the result (burst TTFT, TPOT, output tokens/s, and whichgpu's prediction beside them) is
    printed, not stored.

    Examples:

      whichgpu bench resnet50 --precision fp32 --find-max-batch

      whichgpu bench --suite modern --device cuda:1 --json

      whichgpu bench llama-3.2-1b --seq-len 2048 --find-max-batch --memory-limit 21.5

      whichgpu bench bert-base --gpus 4 --batch-size 32

      whichgpu bench --model my_model.py:build --device cpu --find-max-batch --memory-limit 2

      whichgpu bench llama-3.2-1b --serving vllm --mode inference --context 1024
      --new-tokens 128 --concurrency 32

      torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500
      -m whichgpu bench llama-3.2-1b --batch-size 4
    """
    from whichgpu.bench.distributed import torchrun_group

    group = torchrun_group(os.environ)
    if serving is not None:
        if group is not None:
            raise UsageError("--serving under torchrun: the engine starts its own processes.")
        _bench_engine(ctx, workloads, config, model, serving, json)
        return
    if group is not None and not group.is_leader:
        with _as_rank(group):
            _bench_as_rank(ctx, group, workloads, suite, config, model, store, no_store)
        return
    _bench(ctx, workloads, suite, config, model, device, store, no_store, json)


ENGINE_REFUSES = {
    "suite": "--suite",
    "find_max_batch": "--find-max-batch",
    "find_max_seq_len": "--find-max-seq-len",
    "memory_limit": "--memory-limit",
    "compile": "--compile",
    "channels_last": "--channels-last",
    "min_seconds": "--min-seconds",
    "min_iters": "--min-iters",
    "timeout": "--timeout",
    "store": "--store",
}
"""The flags of whichgpu's own bench that a measurement through a serving engine takes no
value from (the engine sizes, compiles and times itself; nothing is stored)."""


def _bench_engine(
    ctx: typer.Context,
    workloads: list[str] | None,
    config: Path | None,
    model: str | None,
    serving: str,
    json: bool,
) -> None:
    """``bench --serving``: one language model measured through the engine, printed (never
    stored)."""
    from whichgpu.api import answer_bench_engine
    from whichgpu.api.requests import EngineBenchRequest, Target

    given = r.parameters(ctx)
    refused = [name for key, name in ENGINE_REFUSES.items() if given.get(key) not in (None, False)]
    if refused:
        raise UsageError(
            f"{', '.join(refused)} with --serving: the engine is measured as it serves (a "
            "burst of --concurrency requests), and the result is not stored; drop "
            f"{'it' if len(refused) == 1 else 'them'}."
        )
    names = workloads or []
    if len(names) > 1 or (names and (config is not None or model is not None)):
        raise UsageError(
            "--serving measures one language model: name one workload, or give --config."
        )
    if not names and config is None and model is None:
        raise UsageError(
            "Name the language model to serve (e.g. `whichgpu bench llama-3.2-1b --serving "
            "vllm --mode inference`), or give --config FILE."
        )
    request = EngineBenchRequest(
        Target(names[0] if names else None, config, given["task"], model),
        r.run_options(ctx),
        engine=serving,
        gpu_count=given["gpus"],
        device=given["device"],
    )
    stderr = Console(stderr=True, highlight=False)

    def progress(message: str) -> None:
        stderr.print(f"[dim]{escape(serving)}: {escape(message)} …[/]")

    result = answer_bench_engine(request, progress=progress)
    if json:
        emit_json(result.model_dump(mode="json"))
    else:
        emit(_engine_view(result))
    stderr.print("[dim]Not stored: the results store keeps whichgpu's own bench measurements.[/]")


def _engine_view(result: EngineBenchResult) -> RenderableType:
    """The engine measurement as a table (measured beside predicted), then its notes."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from whichgpu.numbers import significant

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{significant(seconds * 1e3)} ms"

    on = result.gpu_name if result.gpus == 1 else f"{result.gpus} x {result.gpu_name}"
    table = Table(
        title=(
            f"{escape(result.workload)} through {result.engine} {escape(result.engine_version)} "
            f"on {escape(on)}: {result.precision}, context {result.context:,}, "
            f"{result.new_tokens:,} new tokens, {result.concurrency:,} request(s) at once"
        ),
        title_justify="left",
    )
    table.add_column("")
    table.add_column("measured (a burst)", justify="right")
    table.add_column("predicted (whichgpu)", justify="right")
    table.add_row("burst TTFT", ms(result.burst_ttft_s), ms(result.predicted_burst_ttft_s))
    table.add_row("TPOT", ms(result.tpot_s), ms(result.predicted_tpot_s))
    table.add_row(
        "output tokens/s",
        significant(result.output_tokens_per_s),
        significant(result.predicted_output_tokens_per_s),
    )
    notes = Text("\n".join(f"- {note}" for note in result.notes), style="dim")
    return Group(table, notes)


def _bench_as_rank(
    ctx: typer.Context,
    group: TorchrunGroup,
    workloads: list[str] | None,
    suite: str | None,
    config: Path | None,
    model: str | None,
    store: Path | None,
    no_store: bool,
) -> None:
    """A torchrun rank other than 0: measure with the others and hand rank 0 the figures;
    nothing on stdout, no progress, nothing stored (rank 0 does all three)."""
    from whichgpu.api import answer_bench

    if store is not None and no_store:
        raise UsageError("Give --store FILE or --no-store, not both.")
    entries = _entries(workloads, suite, config, model)
    failed = False
    for entry in entries:
        request = r.bench_request(
            ctx,
            entry.workload if entry is not _OWN else None,
            precision=entry.precision,
            seq_len=entry.seq_len,
        )
        try:
            answer_bench(request)
        except (BenchError, WorkloadError) as exc:  # as rank 0 does: the others go on
            if len(entries) == 1:
                raise
            failed = True
            emit_error(f"rank {group.rank}: {entry.workload}: {error_message(exc)}")
    if failed:
        raise typer.Exit(1)


@contextlib.contextmanager
def _as_rank(group: TorchrunGroup) -> Iterator[None]:
    """A torchrun rank other than 0 fails on stderr only, its rank named (stdout stays
    empty, even under --json: rank 0's document is the run's)."""
    try:
        yield
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except WhichGpuError as exc:
        emit_error(f"rank {group.rank}: {error_message(exc)}")
        usage = isinstance(exc, (UsageError, WorkloadError, GpuLookupError))
        raise typer.Exit(2 if usage else 1) from None


def _bench(
    ctx: typer.Context,
    workloads: list[str] | None,
    suite: str | None,
    config: Path | None,
    model: str | None,
    device: str,
    store: Path | None,
    no_store: bool,
    json: bool,
) -> None:
    """The bench of one process (rank 0 of a torchrun group): progress on stderr, each result
    stored as it is measured, then all of them on stdout."""
    from whichgpu.api import answer_bench
    from whichgpu.store import ResultStore

    if store is not None and no_store:
        raise UsageError("Give --store FILE or --no-store, not both.")
    entries = _entries(workloads, suite, config, model)
    results_store = None if no_store else ResultStore(store)
    if results_store is not None:
        results_store.list(limit=1)  # a file that is not a store fails now, not after a bench
    finished: list[BenchResult] = []
    failures: list[str] = []
    interrupted = False
    with _progress() as show:

        def keep(result: BenchResult) -> None:
            if results_store is not None:
                results_store.add(result)
            finished.append(result)
            show.finished(result)

        def measure(entry: SuiteEntry) -> None:
            """Bench one entry; with several entries, a failure is reported and the others
            go on."""
            from whichgpu.bench.jobs import BenchProgress

            label = entry.workload if entry is not _OWN else str(model or config)
            show.update(BenchProgress("start", f"starting on --device {device}", workload=label))
            try:
                request = r.bench_request(  # the suite's precision and length, unless given
                    ctx,
                    entry.workload if entry is not _OWN else None,
                    precision=entry.precision,
                    seq_len=entry.seq_len,
                )
                answer_bench(request, progress=show.update, on_result=keep)
            except (BenchError, WorkloadError) as exc:
                if len(entries) == 1:
                    raise
                failures.append(entry.workload)
                show.print_error(f"{entry.workload}: {exc}")

        try:
            for entry in entries:
                measure(entry)
        except KeyboardInterrupt:
            interrupted = True
    _render(finished, json)
    where = f" in {results_store.path}" if results_store is not None else ""
    if interrupted:
        emit_error(
            f"Interrupted. {len(finished)} finished result(s) kept{where if finished else ''}."
        )
        raise typer.Exit(EXIT_INTERRUPTED)
    if finished and results_store is not None and not json:
        Console(stderr=True, highlight=False).print(
            f"[dim]Stored {len(finished)} result(s){where} (`whichgpu results list`).[/]"
        )
    if failures:
        raise typer.Exit(1)


_OWN = SuiteEntry("--config/--model")
"""The entry of the user's own model."""


def _entries(
    workloads: list[str] | None, suite: str | None, config: Path | None, model: str | None
) -> list[SuiteEntry]:
    """What to measure, in order: the named workloads, then the suite's; or the user's model."""
    named = [SuiteEntry(name) for name in workloads or []]
    if suite is not None:
        known = suites()
        if suite not in known:
            raise UsageError(f"--suite {suite}: expected one of {', '.join(known)}.")
        named.extend(known[suite])
    if config is not None or model is not None:
        if named:
            raise UsageError(
                "Name workloads (or a --suite), or give --config or --model: not both."
            )
        return [_OWN]
    if not named:
        raise UsageError(
            "Name the workloads to measure (e.g. `whichgpu bench resnet50`), a --suite, or "
            "--config FILE / --model FILE.py:FUNCTION for your own model."
        )
    return list(dict.fromkeys(named))  # a workload named and in the suite alike runs once


def _render(results: list[BenchResult], json: bool) -> None:
    from whichgpu.report import results as view

    if json:
        emit_json(view.results_doc(results))
    elif results:
        emit(view.results_table(results, f"{len(results)} result(s) measured"))


class _Display(Protocol):
    """Where the bench's progress and finished results are shown, on stderr."""

    def update(self, event: BenchProgress) -> None:
        """What the bench is doing now."""

    def finished(self, result: BenchResult) -> None:
        """A result, as soon as it is measured (or found not to fit)."""

    def print_error(self, message: str) -> None:
        """One workload of several failed (the others go on)."""


class _Bars:
    """Progress bars on stderr, for a terminal."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._tasks: dict[str, Any] = {}

    def update(self, event: BenchProgress) -> None:
        name = event.workload or "bench"
        if name not in self._tasks:
            self._tasks[name] = self._progress.add_task(name, total=1.0)
        task = self._tasks[name]
        text = f"[bold]{escape(name)}[/] {escape(event.message)}"
        if event.fraction is None:
            self._progress.update(task, description=text)
        else:
            self._progress.update(task, description=text, completed=event.fraction)

    def finished(self, result: BenchResult) -> None:
        if result.throughput is None:
            line = f"[yellow]✗[/] {escape(result.workload)}: {escape(_unfit_reason(result))}"
        else:
            line = f"[green]✓[/] {escape(_measured(result))}"
        self._progress.console.print(line, highlight=False)

    def print_error(self, message: str) -> None:
        self._progress.console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)


HEARTBEAT_S = 10.0
"""Plain progress: while steps repeat (warm-up, timing), a line at most this often."""
_REPEATING = frozenset({"warmup", "timing"})
"""Stages that report every step."""


class _Lines:
    """Progress as plain lines on stderr, for a log or a pipe (stderr is not a terminal, as
    under ``--json > file`` or a job runner), each with the seconds since the bench began:
    every probe and its outcome (ran, out of memory, timed out) with its time, each stage of
    a measurement, a line every ``HEARTBEAT_S`` while steps repeat, and each result with its
    step time. stdout is left to the results (the JSON document under ``--json``)."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._clock = clock
        self._started = clock()
        self._stage: dict[str, str] = {}
        self._last_line_at = self._started

    def update(self, event: BenchProgress) -> None:
        name = event.workload or "bench"
        now = self._clock()
        repeated = event.stage in _REPEATING and self._stage.get(name) == event.stage
        if repeated and now - self._last_line_at < HEARTBEAT_S:
            return
        self._stage[name] = event.stage
        self._write(f"{name}: {event.message}")

    def finished(self, result: BenchResult) -> None:
        if result.throughput is None:
            self._write(f"{result.workload}: did not fit: {_unfit_reason(result)}")
        else:
            self._write(f"measured {_measured(result)}")

    def print_error(self, message: str) -> None:
        self._write(f"error: {message}")

    def _write(self, text: str) -> None:
        self._last_line_at = self._clock()
        elapsed = self._last_line_at - self._started
        self._stream.write(f"[{elapsed:7.1f} s] {text}\n")
        self._stream.flush()


def _measured(result: BenchResult) -> str:
    """A measured result in one line: throughput, batch, eager or compiled, step time."""
    assert result.throughput is not None and result.step_time_s is not None
    how = "compiled" if result.compiled else "eager"
    return (
        f"{result.workload} on {result.device_name}: {result.throughput:,.1f} "
        f"{result.throughput_unit} at batch {result.batch_size} ({how}); median step "
        f"{result.step_time_s:.4g} s over {result.iterations} timed steps "
        f"({result.measured_s:.1f} s, after {result.warmup_iterations} warm-up steps)"
    )


def _unfit_reason(result: BenchResult) -> str:
    return next((n for n in result.notes if "out of memory" in n), "did not fit")


@contextlib.contextmanager
def _progress() -> Iterator[_Display]:
    """Bars when stderr is a terminal, plain lines otherwise (never silent: a long bench in a
    log shows what it is doing)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield _Lines(sys.stderr)
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        yield _Bars(progress)
