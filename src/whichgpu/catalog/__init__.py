"""The GPU catalog: sourced specs, aliases and dated prices, loaded from versioned data files.

>>> from whichgpu.catalog import load_catalog
>>> catalog = load_catalog()
>>> catalog.resolve("3090").id
'rtx-3090'

``load_catalog`` reads the shipped data once per process (cached) and lays the user's price
file over it: ``prices_files`` given explicitly, else the default user file
(``whichgpu.settings.user_prices_path``) when it exists.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from whichgpu.catalog.loader import (
    DATA_DIR,
    DATA_VERSION,
    CatalogData,
    read_data_dir,
    read_price_csv,
)
from whichgpu.catalog.query import Catalog, sort_gpus
from whichgpu.schema import Price
from whichgpu.settings import ENV_PRICES, user_prices_path

__all__ = ["Catalog", "load_catalog", "read_user_prices", "sort_gpus"]


@lru_cache(maxsize=1)
def _shipped() -> CatalogData:
    return read_data_dir(DATA_DIR)


def read_user_prices(paths: Sequence[Path], data: CatalogData | None = None) -> tuple[Price, ...]:
    """Read user price files (same columns as the shipped ones; free-text sources allowed)."""
    data = data or _shipped()
    ids = [g.id for g in data.gpus]
    prices: list[Price] = []
    for path in paths:
        prices.extend(read_price_csv(path, ids, data.sources, user=True))
    return tuple(prices)


def load_catalog(prices_files: Sequence[Path | str] | None = None) -> Catalog:
    """The shipped catalog with user prices laid over it.

    ``prices_files=None`` uses the default user file if it exists, and ``$WHICHGPU_PRICES``
    when it is set (a missing file named there is an error, as a mistyped path would otherwise
    be ignored); an explicit list (possibly empty) uses exactly those files, and a missing one
    is an error.
    """
    data = _shipped()
    if prices_files is None:
        default = user_prices_path()
        named = bool(os.environ.get(ENV_PRICES))
        paths = [default] if default.is_file() or named else []
    else:
        paths = [Path(p).expanduser() for p in prices_files]
    return Catalog(data, DATA_VERSION, read_user_prices(paths, data))
