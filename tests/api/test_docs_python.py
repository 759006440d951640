"""``docs/python.md`` runs: every ``python`` block, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("pandas")

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_walkthrough_has_examples() -> None:
    """The page keeps its runnable blocks (a change of fence would silently skip them)."""
    assert len(BLOCK.findall(DOC.read_text(encoding="utf-8"))) >= 6


def test_walkthrough_runs() -> None:
    """Each block runs after the ones before it, as cells of a notebook would."""
    namespace: dict[str, object] = {"__name__": "docs_python"}
    for number, code in enumerate(BLOCK.findall(DOC.read_text(encoding="utf-8")), start=1):
        exec(compile(code, f"{DOC.name} block {number}", "exec"), namespace)
