"""``whichgpu compare``: several GPUs side by side, with ratios to the first."""

from __future__ import annotations

from typing import Annotated

import typer

from whichgpu.catalog import load_catalog
from whichgpu.catalog.compare import compare as compare_gpus
from whichgpu.cli.options import JsonOption, PricesOption
from whichgpu.cli.output import emit, emit_json
from whichgpu.report import json_doc, terminal


def compare(
    gpus: Annotated[
        list[str], typer.Argument(help="Two or more GPU names; the first is the baseline.")
    ],
    json: JsonOption = False,
    prices: PricesOption = None,
) -> None:
    """Compare GPUs side by side on what decides deep-learning speed and value.

    Rows: memory, bandwidth, the AMP rate (FP16/BF16 with FP32 accumulate: tensor cores, else
    the FP32 units), TF32, FP8, FP32, L2, power, purchase price (the lower of the newest new
    and used, else launch), the cheapest cloud on-demand rate, and tensor TFLOPS and bandwidth
    per $1,000. Each value of the second and later GPUs carries its ratio to the first. These
    are spec ratios: `whichgpu predict` estimates real speed for your model.

    Examples:

      whichgpu compare 2080ti 3090 4090

      whichgpu compare a100-sxm4-80gb h100-sxm h200-sxm --json
    """
    catalog = load_catalog(prices)
    specs = [catalog.resolve(name) for name in gpus]
    result = compare_gpus(catalog, specs)
    if json:
        emit_json(json_doc.comparison_doc(result))
        return
    emit(terminal.comparison_table(result))
