"""The registry of named workloads: lookup by slug, with near misses resolved or suggested."""

from __future__ import annotations

import difflib
import re

from whichgpu.errors import UnknownWorkload
from whichgpu.workloads.base import Workload

_REGISTRY: dict[str, Workload] = {}
_FAMILIES_LOADED = False


def register(workload: Workload) -> Workload:
    """Add a workload (family modules call this at import)."""
    name = workload.info.name
    if name in _REGISTRY:
        raise ValueError(f"workload '{name}' is registered twice")
    _REGISTRY[name] = workload
    return workload


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def all_workloads() -> list[Workload]:
    """Every registered workload, in registration order."""
    _load_families()
    return list(_REGISTRY.values())


def get_workload(name: str) -> Workload:
    """The workload named ``name``; ``ResNet-50`` and ``llama3.1-8b`` find their slugs."""
    _load_families()
    if name in _REGISTRY:
        return _REGISTRY[name]
    by_key = {_key(n): w for n, w in _REGISTRY.items()}
    if _key(name) in by_key:
        return by_key[_key(name)]
    close = difflib.get_close_matches(_key(name), list(by_key), n=5, cutoff=0.6)
    raise UnknownWorkload(name, [by_key[k].info.name for k in close])


def _load_families() -> None:
    """Import the family modules once; each registers its workloads."""
    global _FAMILIES_LOADED
    if _FAMILIES_LOADED:
        return
    _FAMILIES_LOADED = True
    from whichgpu.workloads import (  # noqa: F401
        diffusion,
        encoders,
        llm,
        seed_detection,
        seed_gan,
        seed_nasnet,
        seed_translation,
        vision,
    )
