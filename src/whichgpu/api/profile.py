"""``profile``: one step of a workload traced on the CPU with fake tensors, summarised.

The raw material of ``fit`` and ``predict``: parameters, FLOPs, bytes moved, the operator mix
and the peak of live tensor bytes by category (``estimate.profile_summary``). Tracing needs
the ``torch`` extra.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from whichgpu.api.requests import ProfileRequest, Target
from whichgpu.api.step import select_target
from whichgpu.estimate.profile_summary import summarize
from whichgpu.schema import ProfileSummary
from whichgpu.workloads import check_for_workload, run_config


def profile(
    workload: str | None = None,
    *,
    config: Path | str | None = None,
    task: str | None = None,
    model: str | None = None,
    progress: Callable[[str], None] | None = None,
    **run_options: Any,
) -> ProfileSummary:
    """One step of the workload traced on the CPU (nothing downloaded, no GPU) and
    summarised. ``run_options`` are the run configuration, as for ``fit``; those left out take
    their defaults (the workload's batch and length).

    The keywords become a ``ProfileRequest``, answered by ``answer_profile``.
    """
    request = ProfileRequest(Target(workload, config, task, model), run_config(**run_options))
    return answer_profile(request, progress=progress)


def answer_profile(
    request: ProfileRequest, *, progress: Callable[[str], None] | None = None
) -> ProfileSummary:
    """``profile``'s answer to a typed request; ``progress`` hears the workload's name as
    its step is traced."""
    from whichgpu.trace import trace_step

    chosen = select_target(request.target)
    check_for_workload(request.run, chosen.info)
    if progress is not None:
        progress(chosen.info.name)
    return summarize(trace_step(chosen, request.run))
