"""The GPU catalog: sourced specs, aliases and dated prices, loaded from versioned data files.

>>> from whichgpu.catalog import load_catalog
>>> catalog = load_catalog()
>>> catalog.resolve("3090").id
'rtx-3090'

``load_catalog`` reads the shipped data once per process (cached) and lays over it the cloud
rates fetched by ``whichgpu prices update`` (``whichgpu.settings.live_prices_path``, when that
file exists; a provider's live rates for a GPU replace its shipped ones) and then the user's
price file: ``prices_files`` given explicitly, else the default user file
(``whichgpu.settings.user_prices_path``) when it exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from whichgpu.catalog.loader import (
    DATA_DIR,
    DATA_VERSION,
    CatalogData,
    read_data_dir,
    read_price_csv,
)
from whichgpu.catalog.names import NameIndex
from whichgpu.catalog.query import Catalog, merge_prices, sort_gpus
from whichgpu.schema import Price
from whichgpu.settings import live_prices_path, user_prices_path

__all__ = ["Catalog", "load_catalog", "read_user_prices", "sort_gpus"]


@lru_cache(maxsize=1)
def _shipped() -> CatalogData:
    return read_data_dir(DATA_DIR)


def read_user_prices(paths: Sequence[Path], data: CatalogData | None = None) -> tuple[Price, ...]:
    """Read user price files (same columns as the shipped ones; free-text sources allowed, and a
    ``gpu_id`` may be any GPU name the commands accept, such as ``4090``)."""
    data = data or _shipped()
    ids = [g.id for g in data.gpus]
    names = NameIndex(data.gpus)
    prices: list[Price] = []
    for path in paths:
        prices.extend(read_price_csv(path, ids, data.sources, user=True, names=names))
    return tuple(prices)


def load_catalog(prices_files: Sequence[Path | str] | Path | str | None = None) -> Catalog:
    """The shipped catalog with user prices laid over it.

    ``prices_files=None`` uses the user's file (``settings.user_prices_path``: the one
    ``$WHICHGPU_PRICES`` names, where a missing file is an error, else the default one if it
    exists); an explicit list (possibly empty) uses exactly those files, and a missing one is
    an error. One path alone is a list of one.
    """
    data = _shipped()
    if isinstance(prices_files, str | Path):
        prices_files = [prices_files]
    if prices_files is None:
        default = user_prices_path()
        paths = [default] if default is not None else []
    else:
        paths = [Path(p).expanduser() for p in prices_files]
    user = read_user_prices(paths, data)
    live_file = live_prices_path()
    if live_file.is_file():
        live = read_user_prices([live_file], data)
        covered = {(p.gpu_id, p.kind, p.provider) for p in live}
        data = replace(
            data,
            prices=tuple(p for p in data.prices if (p.gpu_id, p.kind, p.provider) not in covered),
        )
        user = merge_prices(live, user)
    return Catalog(data, DATA_VERSION, user)
