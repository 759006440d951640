"""Shared fixtures, and the automatic skipping of hardware tests.

Tests marked ``gpu`` need a CUDA device and ``multigpu`` two of them; they are skipped, with
the reason shown, where the hardware (or torch) is missing. They are never selected by ``-k``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fresh_trace_cache: gets an empty trace cache of its own, not the run's shared one "
        "(tests of tracing and of the cache)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs_gpu = [i for i in items if "gpu" in i.keywords or "multigpu" in i.keywords]
    if not needs_gpu:
        return
    count = _cuda_device_count()
    for item in needs_gpu:
        if "multigpu" in item.keywords and count < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ CUDA GPUs, found {count}"))
        elif "gpu" in item.keywords and count < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU, found none"))


@pytest.fixture(scope="session")
def _shared_trace_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One trace cache for the whole run, shared by the parallel workers (the cache writes its
    files atomically): a profile is keyed by everything its trace depends on, whichgpu's own
    code included, so a cached profile is the one a new trace would give, and tracing the
    same model and run again in each test only costs time (most of the suite's, before)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's folder sits in the run's
        base = base.parent
    return base / "trace-cache"


@pytest.fixture(autouse=True)
def _isolated_config(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    _shared_trace_cache: Path,
) -> Iterator[Path]:
    """Never read or write the real user's config, results or trace cache: point them at a temp
    folder. The trace cache is the run's shared one (``_shared_trace_cache``), except for a
    test marked ``fresh_trace_cache``: one that checks what tracing or the cache itself does
    gets a cache of its own, empty."""
    config = tmp_path / "config"
    fresh = request.node.get_closest_marker("fresh_trace_cache") is not None
    cache = tmp_path / "cache" if fresh else _shared_trace_cache
    monkeypatch.setenv("WHICHGPU_CONFIG_DIR", str(config))
    monkeypatch.setenv("WHICHGPU_CACHE_DIR", str(cache))
    monkeypatch.delenv("WHICHGPU_NO_CACHE", raising=False)
    monkeypatch.setenv("WHICHGPU_STORE", str(tmp_path / "results.sqlite"))
    monkeypatch.delenv("WHICHGPU_PRICES", raising=False)
    monkeypatch.delenv("WHICHGPU_DEBUG", raising=False)
    monkeypatch.delenv("WHICHGPU_STALE_AFTER", raising=False)
    monkeypatch.delenv("WHICHGPU_LIVE_PRICES", raising=False)
    yield config


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m whichgpu ARGS`` in a child process, as a user would who pipes its output
    (the terminal width of the test runner, which parallel workers set, is not passed on)."""
    inherited = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    full_env = {**inherited, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "whichgpu", *args],
        capture_output=True,
        text=True,
        env=full_env,
        check=False,
        timeout=timeout_s,
    )
