"""``whichgpu workloads``: the registry of named workloads."""

from __future__ import annotations

from whichgpu.cli.options import JsonOption
from whichgpu.cli.output import emit, emit_json
from whichgpu.report import json_doc, terminal
from whichgpu.workloads import all_workloads


def workloads(json: JsonOption = False) -> None:
    """List the named workloads: family, task, parameters, default input, throughput unit.

    Any of them can be given to profile, fit, predict, recommend, report and bench; the
    default input is what a run uses without --batch-size or --seq-len (fit, predict,
    recommend and report search the largest batch that fits instead). Your own model is
    `--config path/to/config.json` (a Hugging Face config) or `--model path/to/file.py:function`
    (any PyTorch model; see docs/workloads.md).

    Examples:

      whichgpu workloads

      whichgpu workloads --json
    """
    infos = [w.info for w in all_workloads()]
    if json:
        emit_json(json_doc.workload_rows(infos))
        return
    emit(terminal.workload_table(infos))
