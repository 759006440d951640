"""``whichgpu gpus``: list the catalog, filtered and sorted."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from whichgpu.catalog import load_catalog
from whichgpu.cli.options import JsonOption, PricesOption
from whichgpu.cli.output import emit, emit_json
from whichgpu.report import json_doc, terminal
from whichgpu.schema import Segment, Vendor


def gpus(
    query: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="Part of a name or alias, e.g. 4090, a100, 'rtx 6000'."),
    ] = None,
    vendor: Annotated[Optional[Vendor], typer.Option(help="Only this vendor.")] = None,  # noqa: UP045
    min_memory: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--min-memory", help="Only GPUs with at least this much memory, GB as sold."),
    ] = None,
    segment: Annotated[Optional[Segment], typer.Option(help="Only this segment.")] = None,  # noqa: UP045
    arch: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--arch", help="Only this architecture (Ampere, Hopper, Ada Lovelace, CDNA3 …)."
        ),
    ] = None,
    sort: Annotated[
        str,
        typer.Option(
            help="Sort by a spec field: numbers and dates largest first (memory_gb, "
            "memory_bandwidth_gbps, fp16_tensor_tflops, tdp_w, launch_date …), text A-Z (name).",
        ),
    ] = "launch_date",
    json: JsonOption = False,
    prices: PricesOption = None,
) -> None:
    """List the GPU catalog: memory, bandwidth, tensor rates, power and launch price.

    The AMP rate is FP16/BF16 with FP32 accumulate — what mixed-precision training gets: on the
    tensor cores (GeForce cards run it at half their headline FP16 rate), and on GPUs without
    them (Pascal, GTX 16) the FP32 rate. Every figure has a source:
    `whichgpu show GPU` prints them.

    Examples:

      whichgpu gpus                                # everything, newest first

      whichgpu gpus --min-memory 24 --sort memory_bandwidth_gbps

      whichgpu gpus a100 --json                    # all A100 variants as JSON

      whichgpu gpus --vendor amd --segment datacenter
    """
    from whichgpu.api import gpus as find_gpus

    found = find_gpus(
        query,
        vendor=vendor,
        segment=segment,
        arch=arch,
        min_memory_gb=min_memory,
        sort=sort,
        prices=prices,
    )
    if json:
        emit_json(json_doc.gpu_rows(found))
        return
    catalog = load_catalog(prices)  # the title's catalog size and version
    title = f"{len(found)} of {len(catalog)} GPUs (catalog {catalog.version}), sorted by {sort}"
    emit(terminal.gpu_table(found, title))
