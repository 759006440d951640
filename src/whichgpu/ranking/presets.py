"""The seed guides' personas as ready-made questions (``whichgpu recommend --for ID``).

A preset chooses a representative workload, run options and constraints (``presets.yaml``);
the ranking itself comes from the data. Flags the user gives win over a preset's values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from whichgpu.errors import UsageError, unknown_name_message


@dataclass(frozen=True)
class Preset:
    """A persona's question."""

    id: str
    """Name given to ``--for``."""
    label: str
    """Who it is for."""
    workload: str
    """Registered workload standing for the persona's models."""
    run: dict[str, Any] = field(default_factory=dict)
    """Run options (precision, method, seq_len, mode, context, concurrency …)."""
    question: dict[str, Any] = field(default_factory=dict)
    """Constraints: ``mode``, ``budget_usd``, ``min_batch``, ``gpus``, a job size, ``vendor``."""
    rationale: str = ""
    """Why this workload and these constraints."""
    guide_2020: str = ""
    """What the 2020 guide advised this persona (for comparison only)."""
    source: str = ""
    """Where the persona and its needs come from."""
    vendor_rationale: str = ""
    """Why the preset keeps to one maker's GPUs (``question["vendor"]``), if it does."""


_QUESTION_KEYS = (
    "mode",
    "budget_usd",
    "within_hours",
    "min_batch",
    "gpus",
    "hours",
    "samples",
    "tokens",
    "vendor",
)


@cache
def shipped_presets() -> tuple[Preset, ...]:
    """The presets shipped with whichgpu."""
    ref = resources.files("whichgpu.ranking").joinpath("presets.yaml")
    doc = yaml.safe_load(ref.read_text(encoding="utf-8"))
    return tuple(
        Preset(
            id=str(item["id"]),
            label=str(item["label"]),
            workload=str(item["workload"]),
            run=dict(item.get("run", {})),
            question={k: item[k] for k in _QUESTION_KEYS if k in item},
            rationale=str(item.get("rationale", "")),
            guide_2020=str(item.get("guide_2020", "")),
            source=str(item.get("source", "")),
            vendor_rationale=str(item.get("vendor_rationale", "")),
        )
        for item in doc["presets"]
    )


def get_preset(preset_id: str) -> Preset:
    """The preset ``preset_id``; an unknown one lists the known ones."""
    presets = shipped_presets()
    for preset in presets:
        if preset.id == preset_id.strip().lower():
            return preset
    ids = [p.id for p in presets]
    close = [i for i in ids if i.startswith(preset_id[:2].lower())]
    raise UsageError(
        unknown_name_message("preset", preset_id, close, "Presets: " + ", ".join(ids) + ".")
    )
