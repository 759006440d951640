"""The typed requests of the sizing commands and ``bench`` (``whichgpu.api.requests``), built
in one place from a command's parsed parameters (``ctx.params``, by the parameter names of
``cli.options``), so that every command spells a target, a run and a question alike: a new
run option is a ``RunOptions`` field, an alias in ``cli.options`` and a parameter of the
commands that take it.

The API is imported on first use, which keeps ``whichgpu --help`` light.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from whichgpu.api.requests import BenchRequest, RecommendRequest, RunOptions, Target


def parameters(ctx: typer.Context) -> dict[str, Any]:
    """The command's parsed parameters, a repeatable option given no times as None (click
    keeps an empty tuple, which the command itself receives as None)."""
    return {name: None if value == () else value for name, value in ctx.params.items()}


def target(ctx: typer.Context) -> Target:
    """What the command is asked about: its workload argument, ``--config`` (with
    ``--task``) or ``--model``."""
    from whichgpu.api.requests import Target

    given = parameters(ctx)
    return Target(
        workload=given.get("workload"),
        config=given.get("config"),
        task=given.get("task"),
        model=given.get("model"),
    )


def run_options(ctx: typer.Context) -> RunOptions:
    """The run options the command takes, as given; ``--checkpointing``, ``--compile``,
    ``--fp8-all-gather`` or ``--tp-overlap`` left off is no choice (a preset's may apply), so
    it is not given."""
    from whichgpu.api.requests import RunOptions

    given = parameters(ctx)
    options = {f.name: given[f.name] for f in fields(RunOptions) if f.name in given}
    for switch in ("checkpointing", "compile", "fp8_all_gather", "tensor_parallel_overlap"):
        if options.get(switch) is False:
            options[switch] = None
    return RunOptions(**options)


def recommend_request(ctx: typer.Context) -> RecommendRequest:
    """The question of ``recommend`` and ``report`` (which asks it too), from their shared
    flags: ``--buy``/``--rent``, ``--budget``, ``--within``, ``--gpus`` (GPUs per machine),
    ``--gpu`` (candidates) and the job's size …; ``--serving``, ``--quantization`` and
    ``--kv-cache-dtype`` where the command has them."""
    from whichgpu.api.requests import RecommendRequest

    given = parameters(ctx)
    return RecommendRequest(
        target(ctx),
        run_options(ctx),
        preset=given["preset"],
        acquire="rent" if given["rent"] else "buy" if given["buy"] else None,
        budget_usd=given["budget"],
        within_hours=given["within"],
        used=given["used"],
        gpu_only=given["gpu_only"],
        provider=given["provider"],
        gpu_count=given["gpus"],
        gpus=given["gpu"],
        vendor=given["vendor"],
        hours=given["hours"],
        samples=given["samples"],
        tokens=given["tokens"],
        epochs=given["epochs"],
        dataset_size=given["dataset_size"],
        min_batch=given["min_batch"],
        region=given["region"],
        top=given["top"],
        sort=given["sort"],
        serving=given.get("serving"),
        quantization=given.get("quantization"),
        kv_cache_dtype=given.get("kv_cache_dtype"),
        stack=given["stack"],
        store=given["store"],
        prices=given["prices"],
    )


def bench_request(
    ctx: typer.Context,
    workload: str | None,
    *,
    precision: str | None = None,
    seq_len: int | None = None,
) -> BenchRequest:
    """The measurement ``bench`` asks for of one workload it names (None: the user's model,
    ``--config`` with ``--task``, or ``--model``), from its flags: ``--device``, ``--gpus``
    (GPUs of this node), the searches, ``--memory-limit``, the timing rule …; a suite's
    ``precision`` and ``seq_len`` for the workload apply where the flags give none."""
    from whichgpu.api.requests import BenchRequest, Target

    given = parameters(ctx)
    run = run_options(ctx)
    return BenchRequest(
        Target(workload, given["config"], given["task"], given["model"]),
        replace(run, precision=run.precision or precision, seq_len=run.seq_len or seq_len),
        gpu_count=given["gpus"],
        device=given["device"],
        find_max_batch=given["find_max_batch"],
        max_batch_resolution=given["max_batch_resolution"],
        find_max_seq_len=given["find_max_seq_len"],
        memory_limit_gib=given["memory_limit"],
        compile=given["compile"],
        channels_last=given["channels_last"],
        min_seconds=given["min_seconds"],
        min_iters=given["min_iters"],
        timeout_s=given["timeout"],
    )
