"""How the CLI writes: JSON documents to stdout, tables to the terminal, errors to stderr."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.text import Text

from whichgpu.errors import NamesOptions, UsageError
from whichgpu.report.json_doc import dumps


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout, and nothing else. A figure that came out infinite or
    undefined (from inputs out of range) is refused rather than written as invalid JSON."""
    try:
        text = dumps(data)
    except ValueError as exc:
        raise UsageError(
            "The answer holds a figure that is infinite or undefined, so it cannot be written "
            "as JSON: an input is out of range (a rate, a power or a duration too large?). "
            "Give values of a realistic size."
        ) from exc
    sys.stdout.write(text + "\n")


FLAG_OF_FIELD = {
    "gpu_count": "--gpus",
    "budget_usd": "--budget",
    "within_hours": "--within",
    "memory_limit_gib": "--memory-limit",
    "tensor_parallel_overlap": "--tp-overlap",
}
"""The options whose flag is not the API's keyword in kebab case (``batch_size`` is
``--batch-size``)."""


def flag(field: str) -> str:
    """The CLI's flag for the API keyword ``field`` (``batch_size`` → ``--batch-size``)."""
    return FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))


def error_message(exc: BaseException) -> str:
    """An error's message as the CLI shows it: the options it names written as flags."""
    return exc.message_as(flag) if isinstance(exc, NamesOptions) else str(exc)


def emit_json_error(message: str, kind: str, exit_code: int, field: str | None = None) -> None:
    """With ``--json``, a failure is a JSON document too: ``{"error": {...}}`` on stdout (the
    paragraph also goes to stderr), so a script that parses stdout always gets JSON;
    ``field``: the option it is about, as the API's keyword (None: none in particular)."""
    error = {"message": message, "kind": kind, "exit_code": exit_code, "field": field}
    sys.stdout.write(dumps({"error": error}) + "\n")


PIPE_WIDTH = 160
"""Columns used when stdout is a pipe or file and $COLUMNS is unset (rich would use 80)."""


def emit(renderable: RenderableType) -> None:
    """Render to the terminal (plain text, and wide, when stdout is not a terminal)."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    Console(soft_wrap=False, width=width).print(renderable)


def emit_error(message: str) -> None:
    """One paragraph on stderr, prefixed so it reads as an error in any log."""
    text = Text.assemble(("error:", "bold red"), " ", message)  # the message as written:
    Console(stderr=True, highlight=False, soft_wrap=True).print(text, emoji=False)  # no markup


@contextlib.contextmanager
def progress_note(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr while a long step runs, with what it is doing now: the context
    yields a function that sets that (silent when stderr is not a terminal)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda _now: None
        return
    with console.status(message + " …") as status:

        def now(text: str) -> None:
            status.update(f"{message}: {escape(text)} …")

        yield now
