"""Where whichgpu keeps the user's files, and the environment variables that move them.

One place for paths and variable names, so no other module reads the environment. Nothing is
created or read at import time.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_PRICES = "WHICHGPU_PRICES"
"""Path of the user's price override file (default: ``<config dir>/prices.csv``)."""
ENV_CONFIG_DIR = "WHICHGPU_CONFIG_DIR"
"""Overrides the whole config directory."""
ENV_STORE = "WHICHGPU_STORE"
"""Path of the benchmark results store (default: ``<data dir>/results.sqlite``)."""
ENV_CACHE_DIR = "WHICHGPU_CACHE_DIR"
"""Path of the cache of traced profiles (default: ``$XDG_CACHE_HOME/whichgpu``)."""
ENV_NO_CACHE = "WHICHGPU_NO_CACHE"
"""Any non-empty value turns the cache of traced profiles off (every question traces anew)."""
ENV_STALE_AFTER = "WHICHGPU_STALE_AFTER"
"""Age in days after which a price is stale: ``DAYS`` for every price, or ``CLOUD,STREET``."""
ENV_LIVE_PRICES = "WHICHGPU_LIVE_PRICES"
"""Path of the cloud rates written by ``whichgpu prices update`` (default:
``<config dir>/live-prices.csv``)."""
ENV_DEBUG = "WHICHGPU_DEBUG"
"""Any non-empty value makes the CLI show tracebacks."""


def config_dir() -> Path:
    """``$WHICHGPU_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/whichgpu``, else ``~/.config/whichgpu``."""
    explicit = os.environ.get(ENV_CONFIG_DIR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "whichgpu"


def data_dir() -> Path:
    """``$XDG_DATA_HOME/whichgpu``, else ``~/.local/share/whichgpu`` (results live here)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "whichgpu"


def store_path() -> Path:
    """The benchmark results store: ``$WHICHGPU_STORE``, else ``<data dir>/results.sqlite``."""
    explicit = os.environ.get(ENV_STORE)
    if explicit:
        return Path(explicit).expanduser()
    return data_dir() / "results.sqlite"


def cache_dir() -> Path:
    """``$WHICHGPU_CACHE_DIR``, else ``$XDG_CACHE_HOME/whichgpu``, else ``~/.cache/whichgpu``
    (profiles traced on this machine; safe to delete)."""
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "whichgpu"


def cache_disabled() -> bool:
    """Whether the user turned the cache of traced profiles off through the environment."""
    return bool(os.environ.get(ENV_NO_CACHE))


def user_prices_path() -> Path | None:
    """The user's price override file to read: the one ``$WHICHGPU_PRICES`` names (also when it
    does not exist, so that reading it reports the mistyped path), else ``prices.csv`` in the
    config directory when it exists, else None."""
    explicit = os.environ.get(ENV_PRICES)
    if explicit:
        return Path(explicit).expanduser()
    default = config_dir() / "prices.csv"
    return default if default.is_file() else None


def debug_enabled() -> bool:
    """Whether the user asked for tracebacks through the environment."""
    return bool(os.environ.get(ENV_DEBUG))


def stale_after_setting() -> str | None:
    """``$WHICHGPU_STALE_AFTER`` as given (None when unset or empty)."""
    return os.environ.get(ENV_STALE_AFTER) or None


def live_prices_path() -> Path:
    """Where ``whichgpu prices update`` writes cloud rates and every command reads them:
    ``$WHICHGPU_LIVE_PRICES``, else ``<config dir>/live-prices.csv``."""
    explicit = os.environ.get(ENV_LIVE_PRICES)
    if explicit:
        return Path(explicit).expanduser()
    return config_dir() / "live-prices.csv"
