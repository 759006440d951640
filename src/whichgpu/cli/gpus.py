"""``whichgpu gpus``: list the catalog, filtered and sorted (by a spec field or a price).

Sorted by a price (``--sort price``, ``rent``, ``freshness``; see ``whichgpu.catalog.sorting``),
the listing says which price ordered each GPU: the table gains its amount and its kind, market
and date (flagged when stale), and each JSON row a ``sort_price`` object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from whichgpu.catalog import Catalog, load_catalog
from whichgpu.catalog.freshness import stale_note, stale_policy
from whichgpu.catalog.sorting import (
    DEFAULT_SORT,
    SORT_KEYS_HELP,
    SortedGpu,
    SortKey,
    parse_sort_key,
    sort_listing,
)
from whichgpu.cli.options import JsonOption, PricesOption
from whichgpu.cli.output import emit, emit_json
from whichgpu.report import json_doc, terminal
from whichgpu.report.layout import Column, FittedTable
from whichgpu.schema import Price, Segment, Vendor


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
        typer.Option(help=f"Order of the listing: {SORT_KEYS_HELP}.", metavar="KEY"),
    ] = DEFAULT_SORT,
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

      whichgpu gpus --min-memory 40 --sort price   # cheapest to buy first

      whichgpu gpus --sort rent                    # cheapest to rent first
    """
    from whichgpu.api import gpus as find_gpus

    key = parse_sort_key(sort)  # a bad key fails before anything is read
    found = find_gpus(
        query,
        vendor=vendor,
        segment=segment,
        arch=arch,
        min_memory_gb=min_memory,
        sort=key.field or DEFAULT_SORT,  # price keys re-sort below, ties in the default order
        prices=prices,
    )
    catalog = load_catalog(prices)  # the prices a price key reads; the title's catalog size
    listing = sort_listing(found, key, catalog)
    specs = [row.spec for row in listing]
    if json:
        rows = json_doc.gpu_rows(specs)
        if key.uses_prices:
            for doc, row in zip(rows, listing, strict=True):
                doc["sort_price"] = _price_json(row.price, catalog)
        emit_json(rows)
        return
    title = (
        f"{len(found)} of {len(catalog)} GPUs (catalog {catalog.version}), "
        f"sorted by {key.description}"
    )
    table = terminal.gpu_table(specs, title)
    if key.uses_prices:
        table = _with_sort_prices(table, listing, key)
    emit(table)


_PRICE_HEADERS = {"buy": "buy\nUSD", "rent": "rent\nUSD/GPU-h", "freshness": "newest price\nUSD"}


def _price_amount(price: Price | None, key: SortKey) -> str:
    """The amount: USD per unit, or per GPU-hour (marked ``/h`` where a column mixes both)."""
    if price is None:
        return "—"
    if price.per != "hour":
        return terminal.fmt(price.usd)
    return f"{price.usd:.2f}/h" if key.basis == "freshness" else f"{price.usd:.2f}"


def _price_origin(price: Price | None) -> str:
    """``used, ebay, 2026-05-28`` — and ``STALE`` when older than the threshold for its kind."""
    if price is None:
        return "—"
    kind = "launch MSRP" if price.kind == "launch" else price.kind
    parts = [kind, *([price.provider] if price.provider else []), price.as_of.isoformat()]
    text = ", ".join(parts)
    return f"{text}, STALE" if stale_policy().is_stale(price) else text


def _with_sort_prices(
    table: FittedTable, listing: Sequence[SortedGpu], key: SortKey
) -> FittedTable:
    """The listing's table with the price each GPU was ordered by, and a note on stale ones."""
    columns = [
        *table.columns,
        Column(_PRICE_HEADERS[key.basis], "right", no_wrap=True),
        Column("price from\n(kind, market, date)", no_wrap=True),
    ]
    rows = [
        (*cells, _price_amount(row.price, key), _price_origin(row.price))
        for cells, row in zip(table.rows, listing, strict=True)
    ]
    used = [row.price for row in listing if row.price is not None]
    note = stale_note(used)
    caption = escape(note) if note else None  # the note's [extra] is text, not markup
    return FittedTable(columns, rows, title=table.title, caption=caption)


def _price_json(price: Price | None, catalog: Catalog) -> dict[str, Any] | None:
    """``sort_price`` of a JSON row: the price (as ``show --json`` gives it) with its age."""
    if price is None:
        return None
    doc = json_doc.price_doc(price, catalog.sources)
    policy = stale_policy()
    doc["age_days"] = policy.age_days(price)
    doc["stale"] = policy.is_stale(price)
    return doc
