"""``whichgpu show``: one GPU's full spec sheet with sources, aliases and prices."""

from __future__ import annotations

from typing import Annotated

import typer

from whichgpu.catalog import load_catalog
from whichgpu.cli.options import JsonOption, PricesOption
from whichgpu.cli.output import emit, emit_json
from whichgpu.report import json_doc, terminal


def show(
    gpu: Annotated[
        str, typer.Argument(help="A GPU name, alias or catalog id, e.g. 3090, H100-SXM.")
    ],
    json: JsonOption = False,
    prices: PricesOption = None,
) -> None:
    """Show every catalog field of one GPU, where each value comes from, and all its prices.

    Confidence says how far to trust a value: datasheet or whitepaper (the vendor printed it),
    secondary (a third-party database), derived (computed; the method is shown), estimate.

    Examples:

      whichgpu show 3090

      whichgpu show "NVIDIA A100-SXM4-80GB" --json

      whichgpu show h100-sxm --prices my-quotes.csv
    """
    catalog = load_catalog(prices)
    spec = catalog.resolve(gpu)
    rows = catalog.prices(spec.id)
    if json:
        emit_json(json_doc.gpu_sheet(spec, rows, catalog.sources, catalog.version))
        return
    emit(terminal.gpu_sheet(spec, rows, catalog.sources))
