"""``whichgpu results``: list, show, export, import and delete stored benchmark results, and
print them as Lambda-style tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from whichgpu.cli import options as o
from whichgpu.cli.output import emit, emit_json
from whichgpu.report import results as view
from whichgpu.schema import SCHEMA_VERSION
from whichgpu.settings import ENV_STORE
from whichgpu.store import ResultStore, pivot_results

StoreOption = Annotated[
    Optional[Path],  # noqa: UP045 - typer needs Optional at runtime on Python 3.10
    typer.Option(
        "--store",
        help=(
            f"The results store, a SQLite file. Default: ${ENV_STORE}, else results.sqlite in "
            "$XDG_DATA_HOME/whichgpu (~/.local/share/whichgpu)."
        ),
        metavar="FILE",
        show_default=False,
    ),
]
_FILTERS = "Filters"
WorkloadFilter = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--workload", "-w", help="Only this workload.", rich_help_panel=_FILTERS),
]
GpuFilter = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--gpu",
        "-g",
        help="Only results on this catalog GPU (any name `whichgpu show` knows: 4090, h200-sxm).",
        rich_help_panel=_FILTERS,
    ),
]
DeviceFilter = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--device",
        help="Only devices whose reported name contains this (ignoring case): 'H200', 'Ryzen'. "
        "Works for devices the catalog does not know.",
        rich_help_panel=_FILTERS,
    ),
]
IdArgument = Annotated[
    str,
    typer.Argument(
        help="A result id, or enough of its start to name one result (the 8 characters "
        "`whichgpu results list` shows will do).",
        show_default=False,
    ),
]
FormatOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--format",
        help="json or csv (default: from the file's extension).",
        show_default=False,
    ),
]

results_app = typer.Typer(
    help=(
        "The benchmark results stored on this machine: list them, show one, move them between "
        "machines as JSON or CSV, delete one, and print Lambda-style tables (largest batch, "
        "throughput relative to a reference device).\n\n"
        "Results live in one SQLite file: $XDG_DATA_HOME/whichgpu/results.sqlite "
        f"(~/.local/share/whichgpu/results.sqlite) unless ${ENV_STORE} or --store names another. "
        "To merge the results of several machines, run `whichgpu results export FILE` on each "
        "and `whichgpu results import FILE` on one; importing the same file twice adds nothing."
        "\n\nExamples:\n\n"
        "  whichgpu results list --gpu 4090 --limit 5\n\n"
        "  whichgpu results show 3f9c2a1b\n\n"
        "  whichgpu results export lab-01.json          # or .csv\n\n"
        "  whichgpu results import lab-02.json\n\n"
        "  whichgpu results table --reference 3090"
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def _gpu_id(gpu: str | None) -> str | None:
    """A user's GPU name as the catalog id results are stored under (raises Unknown/Ambiguous)."""
    if gpu is None:
        return None
    from whichgpu.catalog import load_catalog

    return load_catalog().resolve(gpu).id


@results_app.command("list")
def list_results(
    workload: WorkloadFilter = None,
    gpu: GpuFilter = None,
    device: DeviceFilter = None,
    limit: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--limit", "-n", min=1, help="Only the newest N results."),
    ] = None,
    store: StoreOption = None,
    json: o.JsonOption = False,
) -> None:
    """List stored results, newest first: what ran where, how fast, with how much memory.

    The id column shows the first 8 characters of each id; give them to `whichgpu results show`
    or `delete`. Throughput is over all devices of a run; the step time is the median of the
    timed steps, ± their interquartile range; peak reserved is what PyTorch's caching allocator
    held; MFU is model FLOPs over the GPU's dense peak for the precision.

    Examples:

      whichgpu results list

      whichgpu results list --workload resnet50 --gpu 4090

      whichgpu results list --device h200 --limit 5 --json
    """
    results_store = ResultStore(store)
    found = results_store.list(workload=workload, gpu=_gpu_id(gpu), device=device, limit=limit)
    if json:
        emit_json(view.results_doc(found))
        return
    if not found:
        filtered = any(v is not None for v in (workload, gpu, device))
        emit(
            Text(
                f"No results{' match' if filtered else ''} in {results_store.path}. "
                "`whichgpu bench WORKLOAD` measures one; `whichgpu results import FILE` adds "
                "results exported on another machine."
            )
        )
        return
    count = f"{len(found)} result{'s' if len(found) != 1 else ''}"
    emit(view.results_table(found, f"{count} in {results_store.path}, newest first"))


@results_app.command("show")
def show_result(
    result_id: IdArgument, store: StoreOption = None, json: o.JsonOption = False
) -> None:
    """Show every field of one stored result: the measurement, the run, the environment.

    Examples:

      whichgpu results show 3f9c2a1b

      whichgpu results show 3f9c --json > result.json     # importable elsewhere
    """
    result = ResultStore(store).get(result_id)
    if json:
        emit_json(view.result_doc(result))
        return
    emit(view.result_detail(result))


@results_app.command("export")
def export_results(
    file: Annotated[
        Path,
        typer.Argument(help="File to write: FILE.json or FILE.csv.", show_default=False),
    ],
    fmt: FormatOption = None,
    workload: WorkloadFilter = None,
    gpu: GpuFilter = None,
    device: DeviceFilter = None,
    store: StoreOption = None,
    json: o.JsonOption = False,
) -> None:
    """Write stored results (oldest first) to a JSON or CSV file, to keep or to merge elsewhere.

    JSON holds {"schema_version": N, "results": [...]}, each result with every field. CSV has
    one row per result: a column per measured figure, the run, per-rank figures, notes and
    environment as JSON text (run_json, per_rank_json, notes_json, environment_json), and
    schema_version; it reads back exactly. The file is written whole or not at all; an
    existing file of that name is replaced, unless no result would be written (check --store
    and the filters), or it is the results store or another SQLite database (refused).

    Examples:

      whichgpu results export lab-01.json

      whichgpu results export h200.csv --gpu h200-sxm

      whichgpu results export all.data --format json
    """
    summary = ResultStore(store).export(
        file, fmt, workload=workload, gpu=_gpu_id(gpu), device=device
    )
    if json:
        emit_json(view.export_doc(summary))
        return
    emit(
        Text(
            f"Exported {summary.results} result{'s' if summary.results != 1 else ''} to "
            f"{summary.path} ({summary.format}, schema version {SCHEMA_VERSION})."
        )
    )


@results_app.command("import")
def import_results(
    file: Annotated[
        Path,
        typer.Argument(
            help="A file `whichgpu results export` wrote (.json or .csv), or what "
            "`results list --json` / `results show --json` printed.",
            show_default=False,
        ),
    ],
    fmt: FormatOption = None,
    store: StoreOption = None,
    json: o.JsonOption = False,
) -> None:
    """Add the results of an exported file to the store (to merge machines' results).

    Every record is checked first: if one is invalid, the error names the record (JSON) or
    line (CSV) and the field, and nothing is imported. Results already stored (same id, same
    values) are left as they are, so importing a file twice adds nothing the second time.
    Results on GPUs this whichgpu's catalog does not know (written by a newer whichgpu) are
    kept, with a note: predictions cannot use them.

    Examples:

      whichgpu results import lab-02.json

      whichgpu results import h200.csv --store team.sqlite
    """
    results_store = ResultStore(store)
    summary = results_store.import_file(file, fmt)
    if json:
        emit_json(view.import_doc(summary))
        return
    emit(
        Text(
            f"Imported {summary.path} into {results_store.path}: {summary.added} added, "
            f"{summary.already_present} already present (of {summary.records} in the file)."
        )
    )
    if summary.unknown_gpu_results:
        count, one = summary.unknown_gpu_results, len(summary.unknown_gpus) == 1
        emit(
            Text(
                f"Note: {count} result{'s name' if count != 1 else ' names'} "
                f"{'a GPU' if one else 'GPUs'} this whichgpu's catalog does not know "
                f"({', '.join(summary.unknown_gpus)}): kept in the store, but not used for "
                "predictions (recommend, report, predict --calibrate). A newer whichgpu may "
                f"know {'it' if one else 'them'}: pip install --upgrade whichgpu.",
                style="dim",
            )
        )


@results_app.command("delete")
def delete_result(
    result_id: IdArgument, store: StoreOption = None, json: o.JsonOption = False
) -> None:
    """Delete one stored result and print what was deleted.

    With --json the deleted result is printed as `results show --json` prints it, so it can
    be imported back. To keep everything first: `whichgpu results export backup.json`.

    Examples:

      whichgpu results delete 3f9c2a1b

      whichgpu results delete 3f9c --json > deleted.json
    """
    result = ResultStore(store).delete(result_id)
    if json:
        emit_json(view.result_doc(result))
        return
    emit(view.results_table([result], "Deleted"))


@results_app.command("table")
def table(
    reference: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--reference",
            "-r",
            help="The device throughputs are divided by: a catalog id (rtx-4090), the name a "
            "device reports ('NVIDIA H200'), or a unique part of either. Default: the device "
            "measured on the most workloads.",
            show_default=False,
        ),
    ] = None,
    workload: WorkloadFilter = None,
    store: StoreOption = None,
    json: o.JsonOption = False,
) -> None:
    """Lambda-style tables of the stored results: largest batch and throughput per device.

    A row is a workload at one precision (and method, mode, sequence length, optimizer,
    checkpointing), a column a
    device (2x rtx-4090 for a two-GPU run). Three tables: the largest batch that ran (when it
    was searched), the throughput (with the batch it ran at), and the throughput relative to
    the reference device, as Lambda's GPU benchmarks print them. Where a workload was measured
    more than once on a device the newest result is used, and a note says so.

    Examples:

      whichgpu results table

      whichgpu results table --reference 3090

      whichgpu results table --workload resnet50 --json
    """
    found = ResultStore(store).list(workload=workload)
    pivot = pivot_results(found, reference)
    if json:
        emit_json(view.pivot_doc(pivot))
        return
    emit(view.lambda_tables(pivot))
