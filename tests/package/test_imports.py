"""``import whichgpu`` and every non-torch module work without torch (it is blocked here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

NON_TORCH_MODULES = [
    "whichgpu",
    "whichgpu.units",
    "whichgpu.errors",
    "whichgpu.schema",
    "whichgpu.settings",
    "whichgpu.catalog",
    "whichgpu.catalog.audit",
    "whichgpu.catalog.compare",
    "whichgpu.workloads",
    "whichgpu.estimate.profile_summary",
    "whichgpu.report.json_doc",
    "whichgpu.report.terminal",
    "whichgpu.report.results",
    "whichgpu.report.cost",
    "whichgpu.report.recommend",
    "whichgpu.report.html",
    "whichgpu.report.notebook",
    "whichgpu.report_data",
    "whichgpu.tabular",
    "whichgpu.estimate.data_parallel",
    "whichgpu.estimate.prediction",
    "whichgpu.store",
    "whichgpu.cost",
    "whichgpu.ranking.rank",
    "whichgpu.ranking.presets",
    "whichgpu.ranking.question",
    "whichgpu.bench",
    "whichgpu.api",
    "whichgpu.cli",
]

PROGRAM = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import importlib
for name in {modules!r}:
    importlib.import_module(name)
from whichgpu.cli import main
for args in (
    ["gpus", "--json"],
    ["fit", "resnet50", "--gpu", "4090", "--json"],
    ["predict", "bert-base", "--gpu", "4090", "--json"],
    ["recommend", "resnet50", "--gpu", "4090", "--gpu", "3090", "--json"],
    ["cost", "breakeven", "--gpu", "4090", "--cloud-rate", "0.5", "--json"],
    ["results", "list", "--json"],
    ["cache", "list", "--json"],
    ["report", "resnet50", "--gpu", "4090", "--gpu", "3090", "--out", "{out}"],
):
    code = main(args)
    assert code == 0, (args, code)
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
"""


def test_non_torch_modules_import_and_run_without_torch(tmp_path: Path) -> None:
    """The catalog, fit/predict/recommend of named workloads, cost, results and the trace cache
    need no torch."""
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(modules=NON_TORCH_MODULES, out=tmp_path / "r.html")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_import_is_light() -> None:
    """Importing the package (and the workload registry, which the CLI lists) reads no data and
    pulls in neither torch nor numpy."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, whichgpu, whichgpu.workloads; "
            "print(sorted(m for m in ('torch', 'numpy', 'yaml') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout.strip() == "[]"
