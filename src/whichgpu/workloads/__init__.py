"""Workloads: named models (and the user's own), how to build them, and run configurations.

Listing and describing workloads never imports torch; building one does.
"""

from __future__ import annotations

from pathlib import Path

from whichgpu.errors import UsageError
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.registry import all_workloads, get_workload
from whichgpu.workloads.run_config import check_for_workload, run_config
from whichgpu.workloads.user import Task, config_workload

__all__ = [
    "BuiltWorkload",
    "Workload",
    "all_workloads",
    "check_for_workload",
    "get_workload",
    "run_config",
    "select_workload",
]


def select_workload(name: str | None, config: Path | None, task: Task | None = None) -> Workload:
    """The workload a command names: a registered one, or the user's ``--config``."""
    if (name is None) == (config is None):
        raise UsageError("Name one workload (e.g. `resnet50`) or give --config FILE, not both.")
    if config is not None:
        return config_workload(config, task)
    assert name is not None
    return get_workload(name)
