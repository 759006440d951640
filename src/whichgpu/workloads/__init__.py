"""Workloads: named models (and the user's own), how to build them, and run configurations.

Listing and describing workloads never imports torch; building one does.
"""

from __future__ import annotations

from pathlib import Path

from whichgpu.errors import UsageError
from whichgpu.workloads.base import BuiltWorkload, Workload
from whichgpu.workloads.config_tasks import TASK_CLASS_SUFFIX, Task, task_choices
from whichgpu.workloads.registry import all_workloads, get_workload
from whichgpu.workloads.run_config import check_for_workload, run_config
from whichgpu.workloads.user import (
    UserModel,
    UserModelError,
    config_workload,
    model_defaults,
    model_workload,
)

__all__ = [
    "BuiltWorkload",
    "UserModel",
    "UserModelError",
    "Workload",
    "all_workloads",
    "check_for_workload",
    "get_workload",
    "model_defaults",
    "run_config",
    "select_workload",
]


def select_workload(
    name: str | None, config: Path | None, task: Task | None = None, *, model: str | None = None
) -> Workload:
    """The workload a command names: a registered one, the user's ``--config`` or ``--model``.

    A name that is plainly one of the user's own (``FILE.py:FUNCTION`` or ``module:FUNCTION``,
    or a ``.json`` file) is taken as ``--model`` / ``--config``: no registered name has a colon
    or ends in ``.json``.
    """
    if name is not None and config is None and model is None:
        if ":" in name:
            model, name = name, None
        elif name.endswith(".json"):
            config, name = Path(name), None
    if sum(given is not None for given in (name, config, model)) != 1:
        raise UsageError(
            "Name one workload (e.g. `resnet50`), or give --config FILE or --model "
            "FILE.py:FUNCTION: exactly one of them."
        )
    if task is not None and config is None:
        raise UsageError("--task applies to --config only.")
    if task is not None and task not in TASK_CLASS_SUFFIX:
        raise UsageError(f"--task: '{task}' is not one of {task_choices()}.")
    if config is not None:
        return config_workload(config, task)
    if model is not None:
        return model_workload(model)
    assert name is not None
    return get_workload(name)
