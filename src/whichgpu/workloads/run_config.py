"""Validated run configurations: options that cannot work together fail with the reason."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.schema import RunConfig, WorkloadInfo


def run_config(**options: Any) -> RunConfig:
    """A ``RunConfig`` from user options (None = default), checked for consistency."""
    given = {k: v for k, v in options.items() if v is not None}
    if "lora_targets" in given and isinstance(given["lora_targets"], str):
        given["lora_targets"] = tuple(
            t.strip() for t in given["lora_targets"].split(",") if t.strip()
        )
    try:
        run = RunConfig(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"--{field.replace('_', '-')}: {err['msg']}.") from exc
    for name in ("batch_size", "seq_len", "context", "new_tokens", "lora_rank", "concurrency"):
        value = getattr(run, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {value}.")
    if run.mode == "train":
        for name in ("context", "new_tokens"):
            if getattr(run, name) is not None:
                raise UsageError(f"--{name.replace('_', '-')} applies to --mode inference only.")
        if run.concurrency != 1:
            raise UsageError("--concurrency applies to --mode inference only.")
    else:
        if run.method != "full":
            raise UsageError("--method lora/qlora is a way of training; use --mode train.")
        if run.checkpointing:
            raise UsageError("--checkpointing saves memory in training only; drop it.")
    if run.method == "full" and run.lora_targets:
        raise UsageError("--lora-targets needs --method lora or qlora.")
    return run


def check_for_workload(run: RunConfig, info: WorkloadInfo) -> None:
    """Reject options that do not apply to this workload."""
    if run.seq_len is not None and not info.is_sequence_model:
        if info.family == "user":
            raise UnsupportedWorkload(
                f"{info.name} declares no sequence length, so --seq-len does not apply; mark "
                "the function with @model_defaults(seq_len=N) (from whichgpu.workloads)."
            )
        raise UnsupportedWorkload(
            f"{info.name} takes fixed-size {info.input_desc} inputs; --seq-len does not apply."
        )
    if (
        run.mode == "inference"
        and info.throughput_unit != "tokens"
        and (run.context or run.new_tokens)
    ):
        raise UnsupportedWorkload(
            f"{info.name} is not a language model; --context and --new-tokens do not apply."
        )
