"""``whichgpu prices``: refresh cloud rates on request, from gpuhunt's catalog of offers.

``whichgpu prices update`` is the only command that goes to the network, and only because the
user ran it: it loads gpuhunt's current catalog of cloud GPU offers (the optional extra
``whichgpu[live-prices]``), turns the offers into dated rates per GPU-hour of catalog GPUs
(``catalog.live``) and writes them to the live price file, which every other command then
reads over the shipped snapshot.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from whichgpu.catalog import load_catalog
from whichgpu.catalog.live import update_live_prices
from whichgpu.cli import options as o
from whichgpu.cli.output import emit, emit_json
from whichgpu.schema import SCHEMA_VERSION, Price
from whichgpu.settings import ENV_LIVE_PRICES, live_prices_path

prices_app = typer.Typer(
    help=(
        "Prices: refresh the cloud rates the other commands use.\n\n"
        "Examples:\n\n"
        "  pip install 'whichgpu[live-prices]'\n\n"
        "  whichgpu prices update                    # every provider gpuhunt lists\n\n"
        "  whichgpu prices update --provider aws --provider lambdalabs"
    ),
    no_args_is_help=True,
)


@prices_app.command("update")
def update(
    provider: Annotated[
        Optional[list[str]],  # noqa: UP045 - typer needs Optional at runtime on Python 3.10
        typer.Option(
            "--provider",
            help="Only this gpuhunt provider (aws, azure, gcp, lambdalabs, runpod, oci, nebius "
            "...); repeatable. Default: every provider in gpuhunt's catalog.",
        ),
    ] = None,
    json: o.JsonOption = False,
) -> None:
    """Fetch today's cloud GPU rates (gpuhunt) and write them, dated, for every command to use.

    Needs the optional extra: pip install 'whichgpu[live-prices]'. The rates go to
    ~/.config/whichgpu/live-prices.csv (or $WHICHGPU_LIVE_PRICES); a provider's fetched rates
    for a GPU replace its shipped ones, and your own price file (--prices) still wins. Delete
    the file to go back to the shipped snapshot.
    """
    catalog = load_catalog([])
    result = update_live_prices(live_prices_path(), catalog.all(), providers=provider or ())
    if json:
        emit_json(
            {
                "path": str(result.path),
                "as_of": result.as_of.isoformat(),
                "offers": result.offers,
                "rates": len(result.prices),
                "gpus": sorted({p.gpu_id for p in result.prices}),
                "unmapped_gpu_names": list(result.unmapped),
                "schema_version": SCHEMA_VERSION,
            }
        )
        return
    table = Table(header_style="bold", title=f"Cheapest on-demand rate per GPU, {result.as_of}")
    for column in ("GPU", "provider", "region", "$/GPU-h", "GPUs/machine"):
        table.add_column(column, justify="right" if column == "$/GPU-h" else "left")
    cheapest: dict[str, Price] = {}
    for p in result.prices:
        if p.kind == "cloud-on-demand" and (
            p.gpu_id not in cheapest or p.usd < cheapest[p.gpu_id].usd
        ):
            cheapest[p.gpu_id] = p
    for gpu_id, p in sorted(cheapest.items()):
        table.add_row(
            gpu_id,
            p.provider or "",
            p.region or "",
            f"{p.usd:,.3f}",
            "/".join(str(n) for n in p.instance_gpus or ()),
        )
    emit(table)
    left = f"; names not in the catalog: {', '.join(result.unmapped)}" if result.unmapped else ""
    emit(
        f"{len(result.prices)} rates of {len({p.gpu_id for p in result.prices})} GPUs from "
        f"{result.offers} offers written to {result.path} (${ENV_LIVE_PRICES} moves it){left}."
    )
