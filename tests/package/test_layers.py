"""The layer rules of ``docs/architecture.md`` hold: ``lint-imports`` keeps every contract of
``pyproject.toml``'s ``[tool.importlinter]``, and the layers name every part of the package,
so a new part cannot sit outside the rules."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("importlinter")


def test_import_contracts_are_kept(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    code = lint_imports(no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "0 broken" in out


def test_layers_name_every_part_of_the_package() -> None:
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = (c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    named = {part.strip() for layer in layers["layers"] for part in layer.split("|")}
    package = ROOT / "src" / "whichgpu"
    parts = {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    parts |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert parts == named
