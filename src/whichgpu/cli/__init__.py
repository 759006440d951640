"""The ``whichgpu`` command line: parse, call one library function, render.

Each command lives in its own module. ``main`` runs the app and turns failures into a
one-paragraph message on stderr with exit code 1 (a runtime failure) or 2 (bad usage or an
unknown GPU), never a traceback unless ``--debug`` (or ``WHICHGPU_DEBUG=1``) is given.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Annotated, Optional

import typer

from whichgpu.bench.quiet_imports import quiet_import_noise
from whichgpu.catalog.freshness import set_stale_after
from whichgpu.cli.bench import bench
from whichgpu.cli.cache import cache_app
from whichgpu.cli.compare import compare
from whichgpu.cli.cost import cost_app
from whichgpu.cli.fit import fit
from whichgpu.cli.gpus import gpus
from whichgpu.cli.output import emit_error, emit_json_error, error_message
from whichgpu.cli.predict import predict
from whichgpu.cli.prices import prices_app
from whichgpu.cli.profile import profile
from whichgpu.cli.recommend import recommend
from whichgpu.cli.report import report
from whichgpu.cli.results import results_app
from whichgpu.cli.show import show
from whichgpu.cli.validate import validate_app
from whichgpu.cli.workloads import workloads
from whichgpu.errors import (
    GpuLookupError,
    NamesOptions,
    PriceFileError,
    UsageError,
    WhichGpuError,
    WorkloadError,
)
from whichgpu.settings import debug_enabled
from whichgpu.version import __version__

EXIT_FAILURE = 1
EXIT_USAGE = 2

app = typer.Typer(
    name="whichgpu",
    help=(
        "Which GPU should you buy or rent for your model, and what will it give you?\n\n"
        "Start with `whichgpu gpus` (the catalog), `whichgpu show 4090` (one GPU with sources) "
        "and `whichgpu compare 3090 4090 5090`; then `whichgpu fit`, `predict` and `recommend` "
        "for your model, `cost` for what owning costs, and `bench` to measure your own GPU. "
        "Every command takes --json."
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("gpus")(gpus)
app.command("show")(show)
app.command("compare")(compare)
app.command("workloads")(workloads)
app.command("profile")(profile)
app.command("fit")(fit)
app.command("predict")(predict)
app.command("recommend")(recommend)
app.command("report")(report)
app.add_typer(cost_app, name="cost")
app.add_typer(prices_app, name="prices")
app.command("bench")(bench)
app.add_typer(results_app, name="results")
app.add_typer(cache_app, name="cache")
app.add_typer(validate_app, name="validate")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"whichgpu {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    stale_after: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional at runtime on Python 3.10
        typer.Option(
            "--stale-after",
            help="Flag prices older than DAYS as stale (DAYS for every price, or CLOUD,STREET; "
            "default 90,180; also $WHICHGPU_STALE_AFTER), e.g. whichgpu --stale-after 30 "
            "recommend ...",
            metavar="DAYS",
        ),
    ] = None,
) -> None:
    """Root options (``--version``, ``--debug``: handled in ``main``)."""
    if stale_after is not None:
        set_stale_after(stale_after)


def _is_parser_error(exc: Exception) -> bool:
    """A usage error of the argument parser (click's, or the copy newer typer versions carry)."""
    return callable(getattr(exc, "show", None)) and hasattr(exc, "exit_code")


LARGEST_INPUT = 1e18
"""No number a user gives (dollars, hours, watts, tokens) is meaningful beyond this; larger
ones only overflow the arithmetic into infinities."""


NAME_OPTIONS = frozenset({"--calibrate", "--store", "--config", "--prices", "--out", "-o"})
"""Options whose value is a name (a stored result's id, a file or folder), never a number,
whatever it looks like: a result id such as ``49227e32`` reads as 4.9e36."""


def check_numbers(args: Sequence[str]) -> None:
    """Refuse an option value that is a number no option can use: NaN, an infinity, or one
    beyond ``LARGEST_INPUT`` (each would come out as 'nan' or 'inf' in the answer). Only
    option values are read (``--budget nan``, ``--hours=inf``): a positional argument such as
    a result id (``12e45f0a``) is a name, whatever it looks like, and so is the value of an
    option that takes names (``NAME_OPTIONS``: ``--calibrate 49227e32``)."""
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg:
            option, _, value = arg.partition("=")
        elif i > 0 and args[i - 1].startswith("-") and "=" not in args[i - 1]:
            option, value = args[i - 1], arg
        else:
            continue
        if option in NAME_OPTIONS:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if not (math.isfinite(number) and abs(number) <= LARGEST_INPUT):
            raise UsageError(
                f"{option}: '{value}' is not a number whichgpu can use: give a finite value of "
                f"a realistic size (at most {LARGEST_INPUT:.0e})."
            )


def _fail(message: str, kind: str, code: int, json_mode: bool, field: str | None = None) -> int:
    emit_error(message)
    if json_mode:
        emit_json_error(message, kind, code, field)
    return code


def _failed(exc: WhichGpuError, code: int, json_mode: bool) -> int:
    """A whichgpu error on stderr (and stdout under --json), its options named as flags."""
    field = exc.field if isinstance(exc, NamesOptions) else None
    return _fail(error_message(exc), type(exc).__name__, code, json_mode, field)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code. With ``--json``, a failure also writes
    ``{"error": {"message", "kind", "exit_code", "field"}}`` to stdout."""
    args = list(sys.argv[1:] if argv is None else argv)
    quiet_import_noise()
    debug = "--debug" in args or debug_enabled()
    json_mode = "--json" in args
    try:
        check_numbers(args)
        result = app(args=args, prog_name="whichgpu", standalone_mode=False)
    except typer.Abort:
        return _fail("Interrupted.", "Interrupted", 130, json_mode)
    except (GpuLookupError, UsageError, PriceFileError, WorkloadError) as exc:
        if debug:
            raise
        return _failed(exc, EXIT_USAGE, json_mode)
    except WhichGpuError as exc:
        if debug:
            raise
        return _failed(exc, EXIT_FAILURE, json_mode)
    except Exception as exc:
        if _is_parser_error(exc):
            exc.show()  # type: ignore[attr-defined]
            code = int(getattr(exc, "exit_code", EXIT_USAGE))
            if json_mode:
                shown = getattr(exc, "format_message", None)
                emit_json_error(shown() if callable(shown) else str(exc), "UsageError", code)
            return code
        if debug:
            raise
        return _fail(
            f"Internal error ({type(exc).__name__}: {exc}). This is a bug in whichgpu; "
            "rerun with --debug for the traceback and report it.",
            "InternalError",
            EXIT_FAILURE,
            json_mode,
        )
    return result if isinstance(result, int) else 0
