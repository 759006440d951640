"""Validated run configurations: options that cannot work together fail with the reason."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from pydantic import ValidationError

from whichgpu.errors import NotSplittable, UnsupportedWorkload, UsageError, option
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
            "every-2) or selective (attention and every other matmul's outputs kept, the rest "
            "recomputed)."
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
    split = [
        given.get(n, 1)
        for n in ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel")
    ]
    if "gpus" not in given and all(isinstance(n, int) and n >= 1 for n in split):
        count = math.prod(split)
        # a split without a GPU count: one copy of the model on as many GPUs (expert
        # parallel: as many copies as the experts are spread over)
        if count > 1:
            given["gpus"] = count
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
        "tensor_parallel",
        "pipeline_parallel",
        "virtual_stages",
        "context_parallel",
        "expert_parallel",
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
        for name in (
            "tensor_parallel",
            "pipeline_parallel",
            "virtual_stages",
            "context_parallel",
            "expert_parallel",
        ):
            if name in given and given[name] != 1:
                raise UsageError(
                    f"{option(name)} splits a training run; inference on "
                    f"{option('gpu_count')} N GPUs is served tensor parallel across them "
                    f"already. Drop {option(name)}."
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
    if run.fp8_recipe != "tensorwise" and run.precision != "fp8":
        raise UsageError(
            f"{option('fp8_recipe')} {run.fp8_recipe} is a scaling recipe of fp8 training; it "
            f"needs {option('precision')} fp8."
        )
    if run.fp8_all_gather:
        _check_fp8_all_gather(run)
    if run.tensor_parallel_overlap and run.tensor_parallel == 1:
        raise UsageError(
            f"{option('tensor_parallel_overlap')} overlaps tensor parallel's exchanges with the "
            f"matrix products; give {option('tensor_parallel')} 2 or more, or drop it."
        )
    if run.virtual_stages > 1 and run.pipeline_parallel == 1:
        raise UsageError(
            f"{option('virtual_stages')} interleaves a pipeline's stages; give "
            f"{option('pipeline_parallel')} 2 or more, or drop it."
        )
    if run.model_parallel() > 1:
        _check_model_parallel(run)
    if run.expert_parallel > 1:
        _check_expert_parallel(run)
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


def _check_fp8_all_gather(run: RunConfig) -> None:
    """Refuse fp8 all-gather where nothing is gathered in fp8: without fp8 training, without
    a sharding that gathers parameters, or with no other data-parallel GPU to gather from."""
    flag = option("fp8_all_gather")
    if run.precision != "fp8":
        raise UsageError(
            f"{flag} gathers fp8 training's converted weights in fp8; it needs "
            f"{option('precision')} fp8."
        )
    if run.sharding not in ("zero3", "fsdp", "hsdp"):
        raise UsageError(
            f"{flag} changes what FSDP gathers; {option('sharding')} {run.sharding} gathers no "
            f"parameters. Use {option('sharding')} fsdp (or zero3, hsdp), or drop {flag}."
        )
    if run.data_parallel() < 2:
        raise UsageError(
            f"{flag}: with one data-parallel copy FSDP gathers nothing; give "
            f"{option('gpu_count')} 2 or more data-parallel GPUs, or drop {flag}."
        )
    if run.fp8_recipe != "tensorwise":
        raise UsageError(
            f"{flag} gathers weights cast with one scale per tensor; torchao's "
            f"{run.fp8_recipe} scaling gathers them in bf16. Use {option('fp8_recipe')} "
            f"tensorwise, or drop {flag}."
        )


def split_options(run: RunConfig) -> str:
    """The options that split ``run``'s micro-batch over GPUs, as an error names them
    (``--tensor-parallel and --context-parallel``)."""
    names = [
        option(name)
        for name in ("tensor_parallel", "pipeline_parallel", "context_parallel")
        if getattr(run, name) > 1
    ]
    return " and ".join(names) or option("tensor_parallel")


def _check_model_parallel(run: RunConfig) -> None:
    """Refuse a tensor- or pipeline-parallel plan that cannot run as asked, or that the
    estimates do not model, with the reason (what the model's shape must allow is checked
    against its config, ``estimate.model_parallel.plan_refusal``)."""
    split = run.model_parallel()
    words = run.model_parallel_words()
    if run.gpus % split:
        raise NotSplittable(
            f"{words} runs each micro-batch on {split} GPUs, and "
            f"{option('gpu_count')} {run.gpus} is not a multiple of {split}: use "
            f"{option('gpu_count')} "
            + " or ".join(
                str(n)
                for n in sorted(
                    {split * max(1, run.gpus // split), split * (run.gpus // split + 1)}
                )
            )
            + "."
        )
    if run.pipeline_parallel > run.grad_accum:
        raise UsageError(
            f"{option('pipeline_parallel')} {run.pipeline_parallel} runs a step as micro-batches "
            f"flowing through {run.pipeline_parallel} stages (1F1B), and needs at least one "
            f"micro-batch per stage: give {option('grad_accum')} {run.pipeline_parallel} or more "
            f"(the micro-batches of a step; {option('grad_accum')} {run.grad_accum} would leave "
            "stages idle for most of it)."
        )
    if run.virtual_stages > 1 and run.grad_accum % run.pipeline_parallel:
        raise UsageError(
            f"The interleaved schedule ({option('virtual_stages')} {run.virtual_stages}) runs "
            f"micro-batches in groups of {run.pipeline_parallel}, one per stage: give "
            f"{option('grad_accum')} a multiple of {run.pipeline_parallel} (Megatron-LM "
            "requires it too)."
        )
    if run.method != "full":
        raise UsageError(
            f"{words} is modelled for full training only; {option('method')} {run.method} "
            "trains a few adapter weights, and a model that needs splitting for LoRA is "
            f"better served by {option('sharding')} fsdp. Drop {split_options(run)}, or use "
            f"{option('method')} full."
        )
    if run.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        raise UsageError(
            f"{words} is modelled with PyTorch's optimizers; bitsandbytes' 8-bit optimizers "
            "are not run tensor or pipeline parallel by the frameworks that split models "
            f"(Megatron-LM, torchtitan). Use {option('optimizer')} adamw."
        )


def _check_expert_parallel(run: RunConfig) -> None:
    """Refuse an expert-parallel plan that cannot run as asked, or that the estimates do not
    model, with the reason (what the model must allow, routed experts that divide evenly, is
    checked against its config: ``estimate.expert_parallel.plan_refusal``)."""
    e, copies = run.expert_parallel, run.data_parallel()
    if copies % e:
        fits = [n for n in range(2, copies + 1) if copies % n == 0 and n <= 64]
        raise NotSplittable(
            f"{option('expert_parallel')} {e} spreads each layer's experts over {e} "
            f"data-parallel copies, and the run has {copies} (its {run.gpus} GPUs"
            + (f" over {run.model_parallel()} per micro-batch" if run.model_parallel() > 1 else "")
            + f"): give {option('gpu_count')} a multiple of {e * run.model_parallel()}"
            + (f", or an expert-parallel degree of {', '.join(map(str, fits[:6]))}" if fits else "")
            + "."
        )
    if run.tensor_parallel > 1:
        raise UsageError(
            f"{option('expert_parallel')} with {option('tensor_parallel')} is not modelled "
            "(the frameworks then split the experts' tokens and weights over the tensor-parallel "
            f"GPUs too); use {option('tensor_parallel')} 1, or drop {option('expert_parallel')}."
        )
    if run.sharding == "hsdp":
        raise UsageError(
            f"{option('expert_parallel')} with {option('sharding')} hsdp is not modelled; use "
            "ddp, zero1, zero2, zero3 or fsdp."
        )
    if run.method != "full":
        raise UsageError(
            f"{option('expert_parallel')} is modelled for full training only; "
            f"{option('method')} {run.method} trains a few adapter weights."
        )
    if run.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        raise UsageError(
            f"{option('expert_parallel')} is modelled with PyTorch's optimizers; use "
            f"{option('optimizer')} adamw."
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
