"""Today's cloud rates, on request: gpuhunt's catalog of offers turned into dated catalog prices.

whichgpu never goes to the network unless the user asks. ``whichgpu prices update`` (or
``update_live_prices``) loads the catalog of cloud GPU offers that dstack's ``gpuhunt`` library
publishes (AWS, Azure, GCP, Lambda, RunPod, OCI, Nebius … by region, on-demand and spot), turns
every offer into a rate per GPU-hour of a catalog GPU, keeps the cheapest offer per GPU, kind,
provider, region and machine size, and writes them, dated today, to the live price file
(``settings.live_prices_path``) in the user price-file format. Every command then reads that
file over the shipped snapshot (``load_catalog``): a provider's live rates for a GPU replace
all of its shipped rates for that GPU, and a user's own price file still wins over both.
gpuhunt is an optional extra (``pip install 'whichgpu[live-prices]'``), imported only here and
only when asked; a missing extra or a failed download is a clear ``LivePricesError``. The
conversion (``offers_to_prices``) takes any objects with gpuhunt's offer fields, so the tests
run offline on recorded offers.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from whichgpu.catalog.names import NameIndex
from whichgpu.errors import AmbiguousGpu, GpuLookupError, UsageError
from whichgpu.files import write_atomically
from whichgpu.schema import FormFactor, GpuSpec, Price

INSTALL_HINT = "pip install 'whichgpu[live-prices]'"
"""How to get the optional extra that live prices need."""
LIVE_SOURCE = "gpuhunt"
"""The ``source`` of every live rate (the note names the instance)."""


class LivePricesError(UsageError):
    """Live prices cannot be fetched: the extra is not installed, or the download failed."""


class Offer(Protocol):
    """The fields of a gpuhunt ``CatalogItem`` that live prices read."""

    @property
    def provider(self) -> str: ...
    @property
    def instance_name(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def price(self) -> float: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def gpu_name(self) -> str | None: ...
    @property
    def gpu_memory(self) -> float | None: ...
    @property
    def spot(self) -> bool: ...


@dataclass(frozen=True)
class RecordedOffer:
    """One cloud offer as gpuhunt reports it (the tests' recorded offers; any object with
    these attributes will do)."""

    provider: str
    """gpuhunt's provider name (``aws``, ``lambdalabs``, ``runpod`` …)."""
    instance_name: str
    """The instance type (``p4de.24xlarge``)."""
    location: str
    """Region or zone."""
    price: float
    """USD per hour for the whole instance."""
    gpu_count: int
    """GPUs in the instance."""
    gpu_name: str | None
    """gpuhunt's GPU name (``A100``, ``H100``, ``L40S``)."""
    gpu_memory: float | None
    """GB of memory of one GPU."""
    spot: bool
    """Whether it is a spot (interruptible) offer."""


@dataclass(frozen=True)
class LivePriceUpdate:
    """What ``update_live_prices`` fetched and wrote."""

    path: Path
    """The live price file written."""
    as_of: dt.date
    """The date every rate carries."""
    prices: tuple[Price, ...]
    """The rates written (per GPU-hour), cheapest per GPU, kind, provider, region, machine size."""
    offers: int
    """Offers read from gpuhunt."""
    unmapped: tuple[str, ...]
    """gpuhunt GPU names (with memory) that name no single catalog GPU; their offers are left
    out."""


_PROVIDER_NAMES = {"lambdalabs": "lambda", "gcp": "gcp", "aws": "aws", "azure": "azure"}
"""gpuhunt provider names spelled as the shipped prices spell them."""


def _provider(name: str) -> str:
    name = name.strip().lower()
    return _PROVIDER_NAMES.get(name, name)


def _resolve(
    names: NameIndex, by_id: dict[str, GpuSpec], offer: Offer
) -> tuple[GpuSpec | None, str | None]:
    """The catalog GPU an offer rents, and a note when a form factor had to be read from the
    machine size; None where the name is unknown or stays ambiguous."""
    if not offer.gpu_name:
        return None, None
    memory = float(offer.gpu_memory) if offer.gpu_memory else None
    try:
        spec, _ = names.resolve_noted(offer.gpu_name, memory_gb=memory)
        return spec, None
    except AmbiguousGpu as exc:
        # an 8-GPU cloud node of A100 / H100 is built from SXM modules (HGX boards)
        if offer.gpu_count == 8:
            sxm = [
                by_id[i]
                for i, _ in exc.candidates
                if by_id[i].form_factor is FormFactor.SXM
                and (memory is None or by_id[i].memory_gb == memory)
            ]
            if len(sxm) == 1:
                return sxm[0], "read as the SXM module: an 8-GPU cloud node"
        return None, None
    except GpuLookupError:
        return None, None


def offers_to_prices(
    offers: Iterable[Offer], gpus: Sequence[GpuSpec], as_of: dt.date
) -> tuple[tuple[Price, ...], int, tuple[str, ...]]:
    """Rates per GPU-hour of catalog GPUs from cloud offers: (prices, offers read, unmapped
    names). The cheapest offer per GPU, kind, provider, region and machine size is kept, one
    row each (a rate for 2-GPU machines is not one for a single GPU)."""
    names = NameIndex(gpus)
    by_id = {g.id: g for g in gpus}
    best: dict[tuple[str, str, str, str, int], Price] = {}
    unmapped: set[str] = set()
    count = 0
    for offer in offers:
        count += 1
        if not offer.gpu_count or offer.gpu_count <= 0 or not offer.price or offer.price <= 0:
            continue
        spec, how = _resolve(names, by_id, offer)
        if spec is None:
            if offer.gpu_name:
                mem = f" {offer.gpu_memory:g}GB" if offer.gpu_memory else ""
                unmapped.add(f"{offer.gpu_name}{mem}")
            continue
        kind = "cloud-spot" if offer.spot else "cloud-on-demand"
        provider = _provider(offer.provider)
        per_gpu = float(offer.price) / offer.gpu_count
        note = (
            f"{offer.instance_name} ${float(offer.price):,.4g}/h / {offer.gpu_count} GPUs; "
            f"gpuhunt catalog (dstack) read {as_of}"
        )
        if how:
            note += f"; {how}"
        key = (spec.id, kind, provider, offer.location or "", offer.gpu_count)
        if key in best and best[key].usd <= per_gpu:
            continue
        best[key] = Price(
            gpu_id=spec.id,
            kind=kind,
            usd=round(per_gpu, 4),
            per="hour",
            provider=provider,
            region=offer.location or None,
            as_of=as_of,
            source=LIVE_SOURCE,
            note=note,
            instance_gpus=(offer.gpu_count,),
            user=True,
        )
    prices = tuple(sorted(best.values(), key=lambda p: (p.gpu_id, p.kind, p.usd)))
    return prices, count, tuple(sorted(unmapped))


def prices_csv(prices: Sequence[Price], fetched: dt.date) -> str:
    """The live prices as a user price file (``docs/prices.md``), with a dated header."""
    out = io.StringIO()
    out.write(
        f"# Cloud rates per GPU-hour from gpuhunt's catalog, fetched {fetched} by "
        "`whichgpu prices update`. Refresh: run it again. Delete this file to use the shipped "
        "snapshot only.\n"
    )
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        [
            "gpu_id",
            "kind",
            "usd",
            "per",
            "provider",
            "region",
            "as_of",
            "source",
            "note",
            "instance_gpus",
        ]
    )
    for p in prices:
        writer.writerow(
            [
                p.gpu_id,
                p.kind,
                f"{p.usd:g}",
                p.per,
                p.provider or "",
                p.region or "",
                p.as_of.isoformat(),
                p.source,
                p.note or "",
                " ".join(str(n) for n in p.instance_gpus or ()),
            ]
        )
    return out.getvalue()


def fetch_offers(providers: Sequence[str] = ()) -> list[Any]:
    """gpuhunt's current offers (downloads its catalog; the only network access whichgpu
    makes, and only when asked). Raises ``LivePricesError`` without the extra or offline."""
    try:
        import gpuhunt  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise LivePricesError(
            f"Live cloud prices need the optional extra: {INSTALL_HINT}. Without it, whichgpu "
            "uses its shipped, dated prices (and your own: --prices, see docs/prices.md)."
        ) from exc
    try:
        catalog = gpuhunt.Catalog(balance_resources=False, auto_reload=False)
        catalog.load()
        wanted = [p.lower() for p in providers] or None
        return list(catalog.query(provider=wanted, min_gpu_count=1))
    except (OSError, ValueError) as exc:
        raise LivePricesError(
            f"Could not download gpuhunt's catalog of cloud offers ({exc}). Are you offline? "
            "The shipped and previously fetched prices are unchanged."
        ) from exc
    except Exception as exc:  # gpuhunt's own errors (GPUHuntError) and the like
        raise LivePricesError(
            f"gpuhunt could not load its catalog of cloud offers: {exc}. The shipped and "
            "previously fetched prices are unchanged."
        ) from exc


def update_live_prices(
    path: Path,
    gpus: Sequence[GpuSpec],
    *,
    offers: Iterable[Offer] | None = None,
    providers: Sequence[str] = (),
    today: dt.date | None = None,
) -> LivePriceUpdate:
    """Fetch offers (or use the given ones), convert them and write the live price file."""
    as_of = today or dt.date.today()
    rows = fetch_offers(providers) if offers is None else offers
    prices, count, unmapped = offers_to_prices(rows, gpus, as_of)
    if not prices:
        raise LivePricesError(
            f"gpuhunt returned {count} offers, none of a GPU in the catalog; {path} is unchanged."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    text = prices_csv(prices, as_of).encode("utf-8")
    write_atomically(path, lambda fh: fh.write(text))
    return LivePriceUpdate(path=path, as_of=as_of, prices=prices, offers=count, unmapped=unmapped)
