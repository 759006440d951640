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

from whichgpu.report.json_doc import dumps


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout, and nothing else."""
    sys.stdout.write(dumps(data) + "\n")


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
