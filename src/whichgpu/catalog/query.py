"""The catalog as a queryable object: GPUs, names, sources and prices (with user overrides).

A ``Catalog`` is built once from validated data (``loader``) and answers questions; it never
reads files itself. User prices replace shipped prices with the same (GPU, kind, provider,
region) and add the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from whichgpu.catalog.loader import CatalogData
from whichgpu.catalog.names import NameIndex, normalize
from whichgpu.catalog.sorting import parse_sort_key, sort_listing
from whichgpu.errors import UsageError
from whichgpu.schema import GpuSpec, Price, PriceKind, Segment, Source, Vendor

_LOG = logging.getLogger("whichgpu.catalog")
"""Where the note on a family name read as its default variant goes (a warning: on stderr when
logging is not configured, never on stdout)."""


def _price_key(price: Price) -> tuple[str, str, str | None, str | None]:
    return (price.gpu_id, price.kind, price.provider, price.region)


def merge_prices(shipped: Iterable[Price], user: Iterable[Price]) -> tuple[Price, ...]:
    """Shipped prices with user prices laid over them (same key replaces, new key adds)."""
    user = tuple(user)
    replaced = {_price_key(p) for p in user}
    kept = [p for p in shipped if _price_key(p) not in replaced]
    return (*kept, *user)


@dataclass(frozen=True)
class PurchaseChoice:
    """The price ``Catalog.purchase_choice`` chose for buying one GPU, and why."""

    price: Price
    """The chosen price (its ``kind`` says new, used or launch)."""
    reason: str
    """Why this one: ``newest used price, below the newest new one ($2,500, 2026-02-01)``."""


def _cite(price: Price) -> str:
    return f"${price.usd:,.0f}, {price.as_of}"


class Catalog:
    """GPU records, their sources and their prices, with name resolution."""

    def __init__(self, data: CatalogData, version: str, user_prices: Sequence[Price] = ()) -> None:
        self.version = version
        """Data folder version (``v1``)."""
        self.sources: dict[str, Source] = dict(data.sources)
        """Source key -> document."""
        self._gpus = data.gpus
        self._by_id = {g.id: g for g in data.gpus}
        self._names = NameIndex(data.gpus)
        self._noted: set[str] = set()
        self._prices = merge_prices(data.prices, user_prices)

    def __len__(self) -> int:
        return len(self._gpus)

    def all(self) -> tuple[GpuSpec, ...]:
        """Every record, in data-file order."""
        return self._gpus

    def get(self, gpu_id: str) -> GpuSpec:
        """The record with this exact id (``KeyError`` if none)."""
        return self._by_id[gpu_id]

    def resolve(self, name: str, *, memory_gb: float | None = None) -> GpuSpec:
        """The record a user's name means (see ``names``); raises Unknown/AmbiguousGpu, and
        ``UsageError`` for a name that is not a string (``4090`` given as a number)."""
        if not isinstance(name, str):
            raise UsageError(
                f"A GPU is named by a string, such as '4090' or 'h100-sxm', not {name!r}."
            )
        spec, note = self._names.resolve_noted(name, memory_gb=memory_gb)
        if note is not None and note not in self._noted:
            self._noted.add(note)
            _LOG.warning("note: %s", note)
        return spec

    def resolve_noted(
        self, name: str, *, memory_gb: float | None = None
    ) -> tuple[GpuSpec, str | None]:
        """``resolve``, with the note saying which variant a family name was read as (``RTX
        3080 means the 10 GB card; …``), None where the name named one record."""
        self.resolve(name, memory_gb=memory_gb)  # the same checks and errors
        return self._names.resolve_noted(name, memory_gb=memory_gb)

    def search(
        self,
        query: str | None = None,
        *,
        vendor: Vendor | None = None,
        segment: Segment | None = None,
        architecture: str | None = None,
        min_memory_gb: float | None = None,
    ) -> list[GpuSpec]:
        """Records matching every given filter; ``query`` matches any part of a name or alias,
        ``architecture`` the start of one (``ada``: Ada Lovelace; ``blackwell``: Blackwell
        and Blackwell Ultra; ``cdna``: every CDNA)."""
        key = normalize(query) if query else ""
        found: list[GpuSpec] = []
        for spec in self._gpus:
            if vendor is not None and spec.vendor is not vendor:
                continue
            if segment is not None and spec.segment is not segment:
                continue
            if architecture and not normalize(spec.architecture or "").startswith(
                normalize(architecture)
            ):
                continue
            if min_memory_gb is not None and (spec.memory_gb or 0.0) < min_memory_gb:
                continue
            if key and not any(key in normalize(n) for n in (spec.id, spec.name, *spec.aliases)):
                continue
            found.append(spec)
        return found

    def prices(self, gpu_id: str, kind: PriceKind | None = None) -> list[Price]:
        """All prices of one GPU (optionally of one kind), newest first."""
        rows = [p for p in self._prices if p.gpu_id == gpu_id and (kind is None or p.kind == kind)]
        return sorted(rows, key=lambda p: (p.as_of, -p.usd), reverse=True)

    def purchase_choice(self, gpu_id: str, used: bool | None = None) -> PurchaseChoice | None:
        """The price a buyer would pay today, with the reason it was chosen.

        ``used``: None (the default, as ``recommend``): the lower of the newest ``new`` and the
        newest ``used`` price (new where they are equal); True: the newest used price only;
        False: the newest new price only. Without any of those, the launch MSRP; None where
        there is no price at all.
        """
        new = self._newest(gpu_id, "new") if used is not True else None
        second_hand = self._newest(gpu_id, "used") if used is not False else None
        if new is not None and second_hand is not None:
            if second_hand.usd < new.usd:
                return PurchaseChoice(
                    second_hand, f"newest used price, below the newest new one ({_cite(new)})"
                )
            return PurchaseChoice(
                new, f"newest new price, not above the newest used one ({_cite(second_hand)})"
            )
        if new is not None:
            only = (
                "newest new price (new only)"
                if used is False
                else "newest new price; no used price"
            )
            return PurchaseChoice(new, only)
        if second_hand is not None:
            only = "newest used price (used only)" if used else "newest used price; no new price"
            return PurchaseChoice(second_hand, only)
        launch = self._newest(gpu_id, "launch")
        if launch is None:
            return None
        missing = {None: "no new or used price", True: "no used price", False: "no new price"}
        return PurchaseChoice(launch, f"launch MSRP: {missing[used]}")

    def purchase_price(self, gpu_id: str, used: bool | None = None) -> Price | None:
        """The price a buyer would pay today (``purchase_choice``'s price): by default the
        lower of the newest new and newest used price; ``used=True`` used only, ``used=False``
        new only; else the launch MSRP."""
        choice = self.purchase_choice(gpu_id, used)
        return choice.price if choice is not None else None

    def _newest(self, gpu_id: str, kind: PriceKind) -> Price | None:
        rows = self.prices(gpu_id, kind)
        return rows[0] if rows else None

    def cheapest_cloud_price(
        self, gpu_id: str, *, spot: bool = False, gpus: int | None = None
    ) -> Price | None:
        """The lowest on-demand (or spot) rate per GPU-hour among the providers.

        ``gpus``: only rates offered for that many GPUs in one machine (``Price.offered_for``);
        None: any machine size, the per-GPU-hour rate however it is rented.
        """
        rows = self.prices(gpu_id, "cloud-spot" if spot else "cloud-on-demand")
        if gpus is not None:
            rows = [p for p in rows if p.offered_for(gpus)]
        return min(rows, key=lambda p: p.usd) if rows else None


def sort_gpus(gpus: Iterable[GpuSpec], field: str, catalog: Catalog | None = None) -> list[GpuSpec]:
    """Sort by a key of ``whichgpu gpus --sort`` (see ``sorting``): a spec field (numbers and
    dates largest/newest first, text A-Z) or ``price``, ``rent``, ``freshness``, ``memory``;
    unknowns last. The price keys read ``catalog``'s prices (None: the default catalog, with
    the user's price file)."""
    key = parse_sort_key(field)
    if key.uses_prices and catalog is None:
        from whichgpu.catalog import load_catalog

        catalog = load_catalog()
    return [row.spec for row in sort_listing(gpus, key, catalog)]
