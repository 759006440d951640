"""GPU name resolution: from what people type (``3090``, ``NVIDIA A100-SXM4-80GB``) to a record.

Names are compared after ``normalize`` (lower case, brand words and punctuation dropped), so
``RTX 3090``, ``rtx3090`` and ``NVIDIA GeForce RTX 3090`` meet. Each record answers to its id, its
name, its aliases and the short form of its name (``3090`` for ``RTX 3090``). A key owned by
several records (``A100``) is ambiguous on purpose and raises ``AmbiguousGpu`` with the
candidates, unless the caller narrows it (e.g. by the memory size a device reports) or one of
the records is *the* card of the family (``default_variant`` in the data: ``RTX 3080`` is the
10 GB card, the 12 GB one a later refresh); then that one is taken and ``resolve_noted`` says
which variant the name was read as. An unknown name raises ``UnknownGpu`` with close
suggestions.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from whichgpu.errors import AmbiguousGpu, UnknownGpu
from whichgpu.schema import GpuSpec

_BRAND_WORDS = frozenset({"nvidia", "geforce", "amd", "intel", "google", "apple", "tesla"})
_TOKEN = re.compile(r"[a-z0-9]+")
MEMORY_MATCH_TOLERANCE = 0.1
"""Relative tolerance when a reported memory size narrows an ambiguous name."""


def exact_key(name: str) -> str:
    """Lower-case letters and digits only, brand words kept: how full names are matched first."""
    return "".join(_TOKEN.findall(name.lower()))


def normalize(name: str) -> str:
    """Lower-case, drop brand words and punctuation: ``NVIDIA GeForce RTX 3090`` -> ``rtx3090``."""
    tokens = [t for t in _TOKEN.findall(name.lower()) if t not in _BRAND_WORDS]
    return "".join(tokens)


def _short_form(name: str) -> str | None:
    """``RTX 3090`` -> ``3090``, ``GTX 1080 Ti`` -> ``1080ti``; None when there is no short form."""
    tokens = [t for t in _TOKEN.findall(name.lower()) if t not in _BRAND_WORDS]
    if len(tokens) >= 2 and tokens[0] in ("rtx", "gtx") and tokens[1][0].isdigit():
        return "".join(tokens[1:])
    return None


def alias_keys(spec: GpuSpec) -> set[str]:
    """Every normalised key that names this record."""
    keys = {normalize(spec.id), normalize(spec.name)}
    keys.update(normalize(a) for a in spec.aliases)
    short = _short_form(spec.name)
    if short:
        keys.add(short)
    keys.discard("")
    return keys


class NameIndex:
    """Maps names to the records they name.

    A name is looked up first exactly as written in the data (case and punctuation aside:
    ``NVIDIA H200`` is the NVML name of the SXM part), then in normalised form (brand words
    dropped: ``H200`` is the family name of both H200 variants).
    """

    def __init__(self, gpus: Iterable[GpuSpec]) -> None:
        self._by_id: dict[str, GpuSpec] = {}
        owners: dict[str, list[str]] = {}
        exact: dict[str, list[str]] = {}
        for spec in gpus:
            self._by_id[spec.id] = spec
            for key in sorted(alias_keys(spec)):
                owners.setdefault(key, []).append(spec.id)
            for name in sorted({spec.name, *spec.aliases}):
                ids = exact.setdefault(exact_key(name), [])
                if spec.id not in ids:
                    ids.append(spec.id)
        self._owners: Mapping[str, tuple[str, ...]] = MappingProxyType(
            {k: tuple(v) for k, v in owners.items()}
        )
        self._exact: Mapping[str, tuple[str, ...]] = MappingProxyType(
            {k: tuple(v) for k, v in exact.items()}
        )

    def resolve(self, query: str, *, memory_gb: float | None = None) -> GpuSpec:
        """The one record ``query`` names; ``memory_gb`` (of one device, as it reports itself)
        narrows a family name to a variant."""
        return self.resolve_noted(query, memory_gb=memory_gb)[0]

    def resolve_noted(
        self, query: str, *, memory_gb: float | None = None
    ) -> tuple[GpuSpec, str | None]:
        """The one record ``query`` names, and a note when a family name was read as its
        default variant (``RTX 3080 means the 10 GB card; …``); ``memory_gb`` (of one device,
        as it reports itself) narrows a family name to a variant first."""
        query = query.strip()
        if query in self._by_id:
            return self._by_id[query], None
        exact = self._exact.get(exact_key(query), ())
        if len(exact) == 1:
            return self._by_id[exact[0]], None
        ids = self._owners.get(normalize(query), ())
        if not ids:
            raise UnknownGpu(query, self.suggest(query))
        narrowed: tuple[str, ...] = ()
        if len(ids) > 1 and memory_gb is not None:
            narrowed = tuple(
                i
                for i in ids
                if (mem := self._by_id[i].one_device().memory_gb) is not None
                and abs(mem - memory_gb) <= MEMORY_MATCH_TOLERANCE * mem
            )
            ids = narrowed or ids
        if len(ids) == 1:
            return self._by_id[ids[0]], None
        defaults = [i for i in ids if self._by_id[i].default_variant]
        if len(defaults) == 1 and (memory_gb is None or narrowed):
            chosen = self._by_id[defaults[0]]
            others = "; ".join(
                f"the {self._memory(i)} is {i}" if self._memory(i) else f"{i} is another"
                for i in ids
                if i != chosen.id
            )
            note = (
                f"'{query}' means the {self._memory(chosen.id) or chosen.name} card "
                f"({chosen.id}, the original {chosen.name}); {others}."
            )
            return chosen, note
        raise AmbiguousGpu(query, [(i, self._by_id[i].name) for i in ids])

    def _memory(self, gpu_id: str) -> str:
        """``12 GB``: the memory that tells a record from its family's other variants."""
        memory = self._by_id[gpu_id].one_device().memory_gb
        return f"{memory:g} GB" if memory is not None else ""

    def suggest(self, query: str, limit: int = 5) -> list[str]:
        """Close matches for an unknown name, as ``id (name)`` strings, best first."""
        key = normalize(query)
        if not key:
            return []
        found: list[str] = []
        # a name that holds the whole query ("5060 Ti" -> "5060 Ti 16GB") first, then names
        # a few edits away, then names the query holds
        longer = sorted((k for k in self._owners if key in k), key=len)
        close = difflib.get_close_matches(key, list(self._owners), n=limit * 3, cutoff=0.6)
        within = sorted((k for k in self._owners if len(k) >= 3 and k in key), key=len)
        for k in [*longer, *close, *within]:
            for gpu_id in self._owners[k]:
                if gpu_id not in found:
                    found.append(gpu_id)
        return [f"{i} ({self._by_id[i].name})" for i in found[:limit]]
