"""Validated run configurations: options that cannot work together fail with the reason."""

from __future__ import annotations

import difflib
import re
from typing import Any

from pydantic import ValidationError

from whichgpu.errors import UnsupportedWorkload, UsageError, option
from whichgpu.schema import CHECKPOINTING_POLICY_PATTERN, RunConfig, WorkloadInfo
from whichgpu.schema import DEFAULT_NEW_TOKENS as DEFAULT_NEW_TOKENS  # re-exported: its old home

LARGEST_SIZE = 2**24
"""Largest batch, length, rank or count a run may give (16,777,216): past it no GPU machine
holds the step, and the arithmetic of a stored profile would overflow."""


def inference_context(info: WorkloadInfo, run: RunConfig) -> tuple[int, int]:
    """``(context, new_tokens)`` of a language model's inference run, defaults filled in.

    ``context`` is ``--context`` (or ``--seq-len``), else the workload's default sequence length
    shortened so that context plus new tokens fits ``max_seq_len`` — what the tracer does too
    (``whichgpu.recipe.generation.serving_sizes``). A given context that does not fit is refused.
    ``new_tokens`` 0 (prefill-only requests: embedding, classification, scoring) stays 0; only
    a run that gives none takes ``DEFAULT_NEW_TOKENS``.
    """
    new_tokens = DEFAULT_NEW_TOKENS if run.new_tokens is None else run.new_tokens
    context = run.context or run.seq_len
    limit = info.max_seq_len
    if context is None:
        context = info.default_seq_len or 2048
        if limit is not None:
            context = min(context, limit - new_tokens)
    if limit is not None and (context < 1 or context + new_tokens > limit):
        raise UnsupportedWorkload(
            f"{info.name} has {limit} positions; a context of {context} tokens plus "
            f"{new_tokens} new tokens does not fit. Shorten {option('context')} or "
            f"{option('new_tokens')}."
        )
    return context, new_tokens


def _keyword(name: str) -> str:
    """The option of ``RunConfig`` field ``name`` as errors name it (see ``errors.option``):
    the API's keyword, which is the field's name but for ``gpus`` (``gpu_count=``)."""
    return option("gpu_count" if name == "gpus" else name)


def _checkpointing_policy(given: dict[str, Any]) -> str:
    """The checkpointing policy of user options, checked and normalised (``every-1`` is
    ``full``); a policy given alone turns checkpointing on, one given with checkpointing
    turned off is refused."""
    policy = str(given["checkpointing_policy"]).strip().lower()
    if not re.fullmatch(CHECKPOINTING_POLICY_PATTERN, policy):
        raise UsageError(
            f"{option('checkpointing_policy')} {given['checkpointing_policy']!r} is not a "
            "policy: use full (every layer recomputed), every-N (every N-th layer, e.g. "
            "every-2) or selective (matmul and attention outputs kept, the rest recomputed)."
        )
    if given.get("checkpointing") is False and policy != "full":
        raise UsageError(
            f"{option('checkpointing_policy')} {policy} needs {option('checkpointing')}, "
            "which was turned off: turn it on, or drop the policy."
        )
    given.setdefault("checkpointing", True)
    return "full" if policy == "every-1" else policy


def _unknown_option(name: str) -> str:
    """What to say of a keyword that is no run option: the nearest run options' names, and
    where the question's own keywords (``budget_usd``, ``gpus``, ...) are listed."""
    near = difflib.get_close_matches(name, list(RunConfig.model_fields), n=2, cutoff=0.6)
    hint = f" Did you mean {' or '.join(option(n) for n in near)}?" if near else ""
    return (
        f"{option(name)} is not an option of a run.{hint} The run options are the fields of "
        "whichgpu.RunConfig; a function's own keywords (budget_usd, gpus, ...) are in its help()."
    )


def run_config(**options: Any) -> RunConfig:
    """A ``RunConfig`` from user options (None = default), checked for consistency; an error
    names the option it is about (``UsageError.field``) as the API's keyword."""
    given = {k: v for k, v in options.items() if v is not None}
    if "lora_targets" in given and isinstance(given["lora_targets"], str):
        given["lora_targets"] = tuple(
            t.strip() for t in given["lora_targets"].split(",") if t.strip()
        )
    if "checkpointing_policy" in given:
        given["checkpointing_policy"] = _checkpointing_policy(given)
    unknown = sorted(set(given) - set(RunConfig.model_fields))
    if unknown:
        raise UsageError(_unknown_option(unknown[0]))
    try:
        run = RunConfig(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{_keyword(field)}: {err['msg']}.") from exc
    for name in (
        "batch_size",
        "seq_len",
        "context",
        "new_tokens",
        "lora_rank",
        "concurrency",
        "gpus",
        "grad_accum",
    ):
        value = getattr(run, name)
        if name == "new_tokens" and value == 0:  # prefill-only requests (inference only)
            continue
        if value is not None and value < 1:
            least = " (or 0: prefill-only requests)" if name == "new_tokens" else ""
            raise UsageError(f"{_keyword(name)} must be at least 1{least}, not {value}.")
        if value is not None and value > LARGEST_SIZE:
            raise UsageError(
                f"{_keyword(name)} {value:,} is beyond any GPU machine: at most {LARGEST_SIZE:,}."
            )
    if run.mode == "train":
        for name in ("context", "new_tokens", "concurrency"):
            if name in given:
                raise UsageError(f"{_keyword(name)} applies to {option('mode')} inference only.")
    else:
        if "concurrency" in given:  # the batch of an inference run: one given is one asked for
            if run.batch_size is not None and run.batch_size != run.concurrency:
                raise UsageError(
                    f"In inference the batch is the {option('concurrency')} sequences served "
                    f"at once; {option('batch_size')} {run.batch_size} disagrees with "
                    f"{option('concurrency')} {run.concurrency}. Give one of them."
                )
            run = run.model_copy(update={"batch_size": run.concurrency})
        if run.method != "full":
            raise UsageError(
                f"{option('method')} lora/qlora is a way of training; use {option('mode')} train."
            )
        if run.checkpointing:
            which = "checkpointing_policy" if "checkpointing_policy" in given else "checkpointing"
            raise UsageError(f"{option(which)} saves memory in training only; drop it.")
        if run.sharding != "ddp":
            raise UsageError(
                f"{option('sharding')} {run.sharding} splits training state; it applies to "
                f"{option('mode')} train only."
            )
        for name in ("optimizer", "optimizer_impl", "loss_kernel", "grad_accum"):
            if name in given:
                raise UsageError(
                    f"{_keyword(name)} applies to training; inference has no optimizer step "
                    "and no loss."
                )
        if "seq_len" in given and "context" in given and run.seq_len != run.context:
            raise UsageError(
                f"{option('seq_len')} {run.seq_len} and {option('context')} {run.context} "
                f"disagree: in inference the prompt length is {option('context')} (a model "
                f"that does not generate takes {option('seq_len')}). Give one of them."
            )
    if run.optimizer in ("adamw-8bit", "paged-adamw-8bit") and run.optimizer_impl != "foreach":
        raise UsageError(
            f"{option('optimizer_impl')} applies to PyTorch's optimizers; {run.optimizer} runs "
            f"bitsandbytes' own kernels. Drop {option('optimizer_impl')}."
        )
    if run.optimizer == "adafactor" and run.optimizer_impl == "fused":
        raise UsageError(
            f"PyTorch's Adafactor has no fused kernel: {option('optimizer_impl')} foreach or "
            "for-loop."
        )
    if run.optimizer_impl == "in-backward":
        _check_in_backward(run)
    if run.method == "full" and run.lora_targets:
        raise UsageError(f"{option('lora_targets')} needs {option('method')} lora or qlora.")
    if run.method == "full" and "lora_rank" in given:
        raise UsageError(f"{option('lora_rank')} needs {option('method')} lora or qlora.")
    return run


def _check_in_backward(run: RunConfig) -> None:
    """Refuse what cannot run with the optimizer step in the backward pass, where each
    parameter is updated, and its gradient dropped, as soon as the gradient is ready."""
    impl = f"{option('optimizer_impl')} in-backward"
    if run.grad_accum > 1:
        raise UsageError(
            f"{impl} updates each parameter as soon as its gradient is ready, but "
            f"{option('grad_accum')} {run.grad_accum} keeps the gradients across micro-steps "
            "until one update: use one or the other."
        )
    if run.precision == "fp16":
        raise UsageError(
            f"{impl} cannot run with {option('precision')} fp16: its GradScaler checks every "
            "gradient for infinities before any parameter is updated, and the updates in the "
            f"backward pass happen before the last gradient exists. Use {option('precision')} "
            "bf16."
        )
    if run.gpus > 1:
        raise UsageError(
            f"{impl} is modelled on one GPU only: with {option('gpus')} {run.gpus} the "
            f"gradients are averaged (or, with {option('sharding')} zero2/fsdp, "
            "reduce-scattered) across GPUs before an update, which the traced one-GPU step, "
            "updating each parameter with its local gradient in the backward pass, does not "
            "contain. Use one GPU or another implementation."
        )


def check_for_workload(run: RunConfig, info: WorkloadInfo) -> None:
    """Reject options that do not apply to this workload."""
    if run.seq_len is not None and not info.is_sequence_model:
        if info.family == "user" and "--model" in info.task:  # not a --config image model
            raise UnsupportedWorkload(
                f"{info.name} declares no sequence length, so {option('seq_len')} does not "
                "apply; mark the function with @model_defaults(seq_len=N) (from "
                "whichgpu.workloads)."
            )
        raise UnsupportedWorkload(
            f"{info.name} takes fixed-size {info.input_desc} inputs; {option('seq_len')} does "
            "not apply."
        )
    limit = info.max_seq_len
    if (
        run.mode == "train"
        and run.seq_len is not None
        and limit is not None
        and run.seq_len > limit
    ):
        raise UnsupportedWorkload(
            f"{info.name} has {limit:,} positions, so it cannot train on sequences of "
            f"{run.seq_len:,} tokens (its position limit, max_position_embeddings). Use "
            f"{option('seq_len')} {limit} or less, or a {option('config')} whose "
            "max_position_embeddings is longer."
        )
    if (
        run.mode == "inference"
        and info.throughput_unit != "tokens"
        and (run.context or run.new_tokens is not None)
    ):
        raise UnsupportedWorkload(
            f"{info.name} is not a language model; {option('context')} and "
            f"{option('new_tokens')} do not apply."
        )
