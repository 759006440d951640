"""Options shared by several commands, declared once so every command spells them the same."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")
]

PricesOption = Annotated[
    Optional[list[Path]],  # noqa: UP045 - typer needs Optional at runtime on Python 3.10
    typer.Option(
        "--prices",
        help=(
            "A CSV of your own prices (columns gpu_id,kind,usd,per,provider,region,as_of,source,"
            "note; see docs/prices.md). Its rows replace the catalog's rows with the same GPU, "
            "kind, provider and region, and add the others. Repeatable. Default: "
            "~/.config/whichgpu/prices.csv (or $WHICHGPU_PRICES) when it exists."
        ),
        metavar="FILE",
    ),
]
