"""How a GPU listing is ordered (``whichgpu gpus --sort KEY``): by a spec field or by a price.

A sort key is one of the named keys below, or any spec field (``memory_bandwidth_gbps``,
``tdp_w`` …; numbers and dates largest first, text A-Z):

- ``price``: the buy price, cheapest first: the newest ``new`` street price, else the newest
  ``used`` one, else the launch MSRP (``Catalog.purchase_price``, the price ``compare`` uses);
- ``rent``: the cheapest cloud on-demand rate per GPU-hour, any machine size
  (``Catalog.cheapest_cloud_price``);
- ``freshness``: the most recently observed street or cloud price first (a launch MSRP is dated
  at the launch and says nothing about today, so it does not count);
- ``memory``: memory as sold, largest first (``memory_gb``);
- ``name``: A-Z;
- ``launch_date``: newest first (the default order of ``whichgpu gpus``).

GPUs without the figure a key sorts by come last, in the order they had. A price key says which
price it used for each GPU (``SortedGpu.price``), so a listing can show it with its date.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from whichgpu.errors import UsageError, option
from whichgpu.schema import GpuSpec, Price

if TYPE_CHECKING:
    from whichgpu.catalog.query import Catalog

SortBasis = Literal["spec", "buy", "rent", "freshness"]
"""What a key orders by: a spec field, the buy price, the cheapest rent, the newest price."""

SORTABLE_TEXT_FIELDS = ("id", "name", "vendor", "segment", "architecture")
"""Spec fields sorted as text, A-Z."""
_UNSORTABLE_FIELDS = ("provenance", "aliases", "notes")
DEFAULT_SORT = "launch_date"
"""The order of ``whichgpu gpus`` when no ``--sort`` is given."""


@dataclass(frozen=True)
class SortKey:
    """A parsed ``--sort`` value."""

    name: str
    """The key as the user named it (``price``, ``memory``, ``tdp_w``)."""
    basis: SortBasis
    """What it orders by."""
    field: str | None
    """The spec field, for ``basis == "spec"``; None for the price keys."""
    description: str
    """The order in words, for a listing's title (``buy price, cheapest first …``)."""

    @property
    def uses_prices(self) -> bool:
        """Whether the order comes from the prices (and needs the catalog's price table)."""
        return self.basis != "spec"


NAMED_KEYS: dict[str, SortKey] = {
    "price": SortKey(
        "price",
        "buy",
        None,
        "price: the buy price (the lower of the newest new and used street prices, else "
        "launch MSRP), cheapest first",
    ),
    "rent": SortKey(
        "rent", "rent", None, "rent: the cheapest cloud on-demand rate per GPU-hour, cheapest first"
    ),
    "freshness": SortKey(
        "freshness",
        "freshness",
        None,
        "freshness: the most recently observed street or cloud price first",
    ),
    "memory": SortKey("memory", "spec", "memory_gb", "memory, largest first"),
    "name": SortKey("name", "spec", "name", "name, A-Z"),
    DEFAULT_SORT: SortKey(DEFAULT_SORT, "spec", DEFAULT_SORT, "launch date, newest first"),
}
"""The keys with a name of their own; any other spec field is a key too."""

SORT_KEYS_HELP = (
    "price (buy price: the lower of the newest new and used street prices, else launch MSRP; "
    "cheapest first), "
    "rent (cheapest cloud on-demand rate per GPU-hour), freshness (most recently observed price "
    "first), memory (largest first), name (A-Z), launch_date (newest first, the default), or "
    "any numeric spec field such as memory_bandwidth_gbps, fp16_tensor_tflops or tdp_w "
    "(largest first)"
)
"""The keys in words, for ``--help`` and error messages."""


def parse_sort_key(text: str) -> SortKey:
    """The sort key ``text`` names; ``UsageError`` (naming the valid keys) for any other."""
    if not isinstance(text, str):
        raise UsageError(
            f"{option('sort')} is the name of a sort key, such as 'price', not {text!r}."
        )
    key = text.strip().lower()
    if key in NAMED_KEYS:
        return NAMED_KEYS[key]
    if key in GpuSpec.model_fields and key not in _UNSORTABLE_FIELDS:
        order = "A-Z" if key in SORTABLE_TEXT_FIELDS else "largest first"
        return SortKey(key, "spec", key, f"{key}, {order}")
    raise UsageError(f"Cannot sort by '{text}' ({option('sort')}). Use {SORT_KEYS_HELP}.")


@dataclass(frozen=True)
class SortedGpu:
    """One GPU of a sorted listing, with the price it was ordered by."""

    spec: GpuSpec
    """The GPU."""
    price: Price | None
    """The price a price key ordered it by (None for a spec key, or where it has none)."""


def sort_price(catalog: Catalog, gpu_id: str, key: SortKey) -> Price | None:
    """The price ``key`` orders the GPU ``gpu_id`` by (None for a spec key or no such price)."""
    if key.basis == "buy":
        return catalog.purchase_price(gpu_id)
    if key.basis == "rent":
        return catalog.cheapest_cloud_price(gpu_id)
    if key.basis == "freshness":
        observed = [p for p in catalog.prices(gpu_id) if p.kind != "launch"]
        return observed[0] if observed else None  # ``prices`` lists the newest first
    return None


def _spec_order(specs: list[GpuSpec], field: str) -> list[GpuSpec]:
    if field in SORTABLE_TEXT_FIELDS:
        return sorted(specs, key=lambda g: str(getattr(g, field) or "").lower())
    present = [g for g in specs if getattr(g, field) is not None]
    missing = [g for g in specs if getattr(g, field) is None]
    return sorted(present, key=lambda g: getattr(g, field), reverse=True) + missing


def sort_listing(
    specs: Iterable[GpuSpec], key: SortKey, catalog: Catalog | None
) -> list[SortedGpu]:
    """``specs`` in the order of ``key``, each with the price it was ordered by; GPUs without
    that figure last, in their given order. A price key needs the ``catalog`` whose prices it
    reads (a spec key reads none)."""
    specs = list(specs)
    if key.basis == "spec":
        assert key.field is not None
        return [SortedGpu(g, None) for g in _spec_order(specs, key.field)]
    if catalog is None:
        raise ValueError(f"sorting by {key.name} reads the prices of a catalog; none was given")
    rows = [SortedGpu(g, sort_price(catalog, g.id, key)) for g in specs]
    priced = [r for r in rows if r.price is not None]
    unpriced = [r for r in rows if r.price is None]
    if key.basis == "freshness":
        priced.sort(key=lambda r: _price(r).as_of, reverse=True)  # stable: ties keep their order
    else:
        priced.sort(key=lambda r: _price(r).usd)
    return priced + unpriced


def _price(row: SortedGpu) -> Price:
    assert row.price is not None
    return row.price
