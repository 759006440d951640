"""``whichgpu cache``: the profiles traced on this machine and kept for the next question."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from whichgpu.cli import options as o
from whichgpu.cli.output import emit, emit_json
from whichgpu.schema import SCHEMA_VERSION
from whichgpu.settings import ENV_CACHE_DIR, ENV_NO_CACHE, cache_dir
from whichgpu.workloads.profile_cache import KeptTrace, clear_cache, kept_traces

cache_app = typer.Typer(
    help=(
        "The trace cache: profiles of models traced on this machine (your --config or --model, "
        "or a named workload with a run nothing ships for), kept so that the next fit, predict, "
        "recommend or report of the same model and run answers at once.\n\n"
        f"It lives in $XDG_CACHE_HOME/whichgpu (~/.cache/whichgpu) unless ${ENV_CACHE_DIR} "
        f"names another folder; ${ENV_NO_CACHE}=1 turns it off. A trace is used only by the "
        "whichgpu, Python, torch and transformers it was made with, and only while the model's "
        "config (or the code in its folder) is unchanged; files unused for 60 days are "
        "deleted when a new trace is kept. Deleting any of it is always safe.\n\n"
        "Examples:\n\n"
        "  whichgpu cache list\n\n"
        "  whichgpu cache clear --stale          # only what this installation cannot use\n\n"
        "  whichgpu cache list --json"
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB" if n_bytes >= 2**20 else f"{n_bytes / 2**10:,.0f} KiB"


def _doc(kept: KeptTrace) -> dict[str, object]:
    return {
        "file": str(kept.path),
        "workload": kept.workload,
        "run": kept.run,
        "size_bytes": kept.size_bytes,
        "last_used": kept.last_used.isoformat(),
        "current": kept.current,
    }


@cache_app.command("list")
def list_cache(json: o.JsonOption = False) -> None:
    """List the kept traces, most recently used first: the model, the run, the size, and
    whether this installation can still use it.

    Examples:

      whichgpu cache list

      whichgpu cache list --json
    """
    found = kept_traces()
    folder = cache_dir()
    if json:
        emit_json(
            {
                "folder": str(folder),
                "traces": [_doc(k) for k in found],
                "schema_version": SCHEMA_VERSION,
            }
        )
        return
    if not found:
        emit(Text(f"No traces kept in {folder}."))
        return
    total = sum(k.size_bytes for k in found)
    count = f"{len(found)} trace{'s' if len(found) != 1 else ''}"
    table = Table(title=f"{count} in {folder} ({_mib(total)})", title_justify="left")
    for column in ("workload", "run", "size", "last used", "usable"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for k in found:
        table.add_row(
            k.workload,
            k.run,
            _mib(k.size_bytes),
            k.last_used.strftime("%Y-%m-%d %H:%M UTC"),
            "yes" if k.current else "no (another version)",
        )
    emit(table)


@cache_app.command("clear")
def clear(
    stale: Annotated[
        bool,
        typer.Option(
            "--stale",
            help="Only the traces this installation can no longer use (made by another "
            "version of whichgpu, Python, torch or transformers).",
        ),
    ] = False,
    json: o.JsonOption = False,
) -> None:
    """Delete the kept traces (all, or with --stale the unusable ones); the next question
    about a model traces it again.

    Examples:

      whichgpu cache clear

      whichgpu cache clear --stale --json
    """
    count, freed = clear_cache(stale_only=stale)
    if json:
        emit_json(
            {
                "folder": str(cache_dir()),
                "deleted": count,
                "freed_bytes": freed,
                "schema_version": SCHEMA_VERSION,
            }
        )
        return
    what = ("unusable trace" if stale else "trace") + ("s" if count != 1 else "")
    emit(Text(f"Deleted {count} {what} ({_mib(freed)}) from {cache_dir()}."))
