"""Run one workload step — for real or under fake tensors — while a ``Recorder`` watches.

The step is the recipe's (``whichgpu.recipe``: optimizer, loss, autocast, checkpointing, fp16
master weights, generation with a KV cache); this module runs it as the trace needs it (two
training steps, the second kept; inference as a prefill and one decode step) and makes the
kernel choices that depend on the device explicit for a GPU: CUDA's autocast table, CUDA's
dropout kernel, fused attention with dropout traced as CUDA's fused kernels (``kernels="cpu"``
keeps the CPU's own). Why each choice, and what the kept step holds, is in ``docs/memory.md``
("The traced step").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.recipe.generation import (
    ServingSizes,
    generation_arguments,
    prompt_ids,
    serving_sizes,
    static_cache,
)
from whichgpu.recipe.optim8bit import IMPLEMENTATION as ADAMW_8BIT_IMPLEMENTATION
from whichgpu.recipe.optim8bit import PAGED_IMPLEMENTATION, PAGED_MIN_ELEMENTS, PAGED_STATES
from whichgpu.recipe.training import (
    AMP_DTYPES,
    Fp16Master,
    Kernels,
    autocast,
    checkpoint_contexts,
    fp16_master,
    make_optimizer,
    step_loss,
    to_fp16,
)
from whichgpu.schema import RunConfig, StepProfile, WorkloadInfo
from whichgpu.trace.cuda_autocast import cuda_autocast_rules
from whichgpu.trace.recorder import Recorder
from whichgpu.workloads.base import BuiltWorkload, Workload, enable_checkpointing
from whichgpu.workloads.finetune import apply_method, count_parameters, method_choices
from whichgpu.workloads.hf import experts_choice, quiet_transformers


def check_supported(run: RunConfig) -> None:
    """Raise ``UnsupportedWorkload`` for configurations the tracer cannot run (yet), with why."""
    if run.precision == "fp8":
        raise UnsupportedWorkload("Tracing --precision fp8 is not supported yet.")


class _CudaDropout(torch.overrides.TorchFunctionMode):
    """Dropout as PyTorch runs it on CUDA.

    ``F.dropout`` in training becomes ``torch.native_dropout``, the one kernel CUDA runs
    (output and a one-byte mask); on the CPU, ``F.dropout`` would instead draw a mask in the
    input's dtype and apply it in three passes. With ``fused_attention``,
    ``F.scaled_dot_product_attention`` is called with ``dropout_p=0`` and the largest dropout
    asked for is noted (see the module's docstring).
    """

    def __init__(self, *, fused_attention: bool) -> None:
        super().__init__()
        self.fused_attention = fused_attention
        self.dropout_p = 0.0

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.nn.functional.dropout:
            return _native_dropout(*args, **kwargs)
        if func is torch.nn.functional.scaled_dot_product_attention and self.fused_attention:
            args = tuple(args)
            if len(args) > SDPA_DROPOUT_ARG:
                self.dropout_p = max(self.dropout_p, float(args[SDPA_DROPOUT_ARG]))
                args = (*args[:SDPA_DROPOUT_ARG], 0.0, *args[SDPA_DROPOUT_ARG + 1 :])
            elif "dropout_p" in kwargs:
                self.dropout_p = max(self.dropout_p, float(kwargs["dropout_p"]))
                kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)


def _native_dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor:
    """``F.dropout`` with CUDA's kernel (``torch.native_dropout``) where it applies."""
    if not training or p == 0 or inplace:
        return torch.nn.functional.dropout(input, p, training, inplace)
    out: torch.Tensor = torch.native_dropout(input, p, True)[0]
    return out


SDPA_DROPOUT_ARG = 4
"""Position of ``dropout_p`` in ``scaled_dot_product_attention(query, key, value, attn_mask,
dropout_p, ...)``."""


def _train_steps(
    rec: Recorder,
    built: BuiltWorkload,
    run: RunConfig,
    batch_size: int,
    seq_len: int | None,
    kernel_mode: Callable[[], contextlib.AbstractContextManager[Any]],
) -> None:
    """Two training steps; ``kernel_mode`` makes the mode the forward pass runs under, which
    the recomputation of a checkpointed segment (in the backward pass, where the outer mode
    does not reach) must run under too, or it would compute a different step."""
    model = built.model
    if run.checkpointing:
        enable_checkpointing(
            model,
            None if run.checkpointing_policy == "full" else run.checkpointing_every_layers(),
            use_reentrant=False,
            context_fn=checkpoint_contexts(run, kernel_mode),
        )
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    master = Fp16Master(params, rec.mark) if fp16_master(built, run) else None
    optimizer = make_optimizer(run, master.params if master else params)
    for step in (0, 1):
        rec.step = step
        rec.phase = "setup"
        batch = built.make_batch(batch_size, seq_len)
        for leaf in torch.utils._pytree.tree_flatten(dict(batch))[0]:
            if isinstance(leaf, torch.Tensor):
                rec.mark(leaf, "input")
        rec.phase = "forward"
        with contextlib.nullcontext() if master else autocast(run, "cpu"):
            loss = step_loss(built, run, model, batch)
        rec.end_forward()
        rec.phase = "backward"
        loss.backward()  # type: ignore[no-untyped-call]
        for p in params:
            if p.grad is not None:
                rec.mark(p.grad, "gradient")
        rec.phase = "optimizer"
        if master:
            master.gradients_in()
        optimizer.step()
        paged = run.optimizer == "paged-adamw-8bit"
        for param, state in optimizer.state.items():
            # bitsandbytes' paged optimizers put a large parameter's two states in unified
            # memory, outside the caching allocator (recipe.optim8bit.PAGED_MIN_ELEMENTS)
            in_unified = paged and param.numel() >= PAGED_MIN_ELEMENTS
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    unified = in_unified and key in PAGED_STATES
                    rec.mark(value, "paged_optimizer" if unified else "optimizer")
        if master:
            master.parameters_out()
        # accumulating: the first step's gradients stay (zeroed), as after an earlier
        # micro-step, so the kept step runs with them present and adds into them
        keep = master is not None or (run.grad_accum > 1 and step == 0)
        optimizer.zero_grad(set_to_none=not keep)
        if master:
            for p in params:
                p.grad = None
        del loss, batch  # a training loop holds both until its next iteration


def _inference_steps(
    rec: Recorder,
    built: BuiltWorkload,
    run: RunConfig,
    batch_size: int,
    seq_len: int | None,
    serving: ServingSizes | None = None,
) -> dict[str, str]:
    """Inference, twice (step 1 is kept): a causal LM serves (``_serve``), any other model
    runs one forward pass without gradients. Returns the kernel choices it made."""
    model = built.model
    model.eval()
    choices: dict[str, str] = {}
    for step in (0, 1):
        rec.step = step
        if serving is not None:
            choices = _serve(rec, model, run, serving)
            continue
        rec.phase = "setup"
        batch = built.make_batch(batch_size, seq_len)
        for leaf in torch.utils._pytree.tree_flatten(dict(batch))[0]:
            if isinstance(leaf, torch.Tensor):
                rec.mark(leaf, "input")
        rec.phase = "forward"
        with torch.no_grad(), autocast(run, "cpu"):
            out = built.infer(model, batch)
        rec.end_forward()
        del out, batch
    return choices


def _serve(
    rec: Recorder, model: torch.nn.Module, run: RunConfig, serving: ServingSizes
) -> dict[str, str]:
    """One request batch as a server runs it: prefill, then one decode step.

    The KV cache is transformers' ``StaticCache``, allocated whole for ``context + new``
    tokens when the prefill first writes to it, as a serving engine reserves it up front. For
    memory this means the trace holds the request's full cache from the prefill on: the
    memory a server must have for it. (A ``DynamicCache`` would grow by concatenation, token by
    token, reaching that size only at the last token, with a second copy of a layer's keys
    or values during each concatenation; its decode step would attend over the tokens so far.)
    The prefill runs ``context`` tokens of every sequence and samples the first new token
    (greedy); the decode step feeds that token and samples the next, attending over all
    ``context + new`` slots of the cache with a mask, as a static cache does (a paged engine
    reads only the filled slots: about ``context + new / 2`` on average over a generation).
    Only the last position's logits are computed (``logits_to_keep=1``, as ``generate`` does).
    """
    rec.phase = "setup"
    ids = prompt_ids(model, serving)
    rec.mark(ids, "input")
    cache = static_cache(model, serving)
    step = generation_arguments(model, cache)
    with torch.no_grad(), autocast(run, "cpu"):
        rec.phase = "prefill"
        out = model(input_ids=ids, **step)
        token = out.logits[:, -1:].argmax(dim=-1)
        del out
        choices = _kv_cache_choice(rec, cache, serving)
        rec.phase = "decode"
        out = model(input_ids=token, **step)
        token = out.logits[:, -1:].argmax(dim=-1)
        del out, token
    rec.end_forward()  # what outlives the request's steps: the KV cache (and the prompt)
    del ids, cache
    return choices


def _kv_cache_choice(rec: Recorder, cache: Any, serving: ServingSizes) -> dict[str, str]:
    """Mark the cache's key and value tensors (category ``activation``: they live across the
    steps of a request) and describe the cache policy and its size."""
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    for tensor in tensors:
        rec.mark(tensor, "activation")
    total_bytes = sum(t.numel() * t.element_size() for t in tensors)
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) == 1:
        sequences, kv_heads, slots, head_dim = next(iter(shapes))
        size = (
            f"2 x {len(cache.layers)} layers x {kv_heads} kv heads x {slots} tokens "
            f"(context {serving.context_tokens} + new {serving.new_tokens}) x {head_dim} "
            f"head dim x {tensors[0].element_size()} B x {sequences} sequences"
        )
    else:  # sliding-window layers hold fewer slots
        size = f"{len(tensors)} key/value tensors of {len(cache.layers)} layers"
    return {
        "kv_cache": f"static, allocated whole at prefill: {size} = {total_bytes} B",
        "decode": (
            f"one step of {serving.sequences} sequences x 1 token over all "
            f"{serving.context_tokens + serving.new_tokens} cache slots (masked); "
            "units_per_step counts its new tokens"
        ),
    }


def _attention_choice(rec: Recorder) -> str:
    """Which attention kernel the traced model used. The fused CPU kernel stands for SDPA; on
    CUDA, SDPA picks flash, memory-efficient, cuDNN or math per GPU, dtype and call, from the
    shapes recorded in ``OpRecord.attention`` (``whichgpu.estimate.attention``). Without it
    (eager attention, or SDPA with dropout, which the CPU kernel lacks) the scores are
    materialised by the traced matmul and softmax themselves."""
    names = sorted({op.name for op in rec.ops if op.kind == "attention"})
    if names:
        return (
            f"sdpa ({', '.join(names)}; traced on the CPU; the CUDA backend depends on the "
            "GPU: whichgpu.estimate.attention)"
        )
    return "none or eager (matmul + softmax)"


def trace_built(
    workload: WorkloadInfo,
    built: BuiltWorkload,
    run: RunConfig,
    *,
    fake: bool = True,
    kernels: Kernels = "cuda",
) -> StepProfile:
    """Trace steps of an already built workload (``fake``: under the active fake mode;
    ``kernels``: whose dropout and attention kernels, see the module's docstring)."""
    batch_size = run.batch_size or workload.default_batch_size
    seq_len = (run.seq_len or workload.default_seq_len) if workload.is_sequence_model else None
    serving = serving_sizes(workload, built, run)
    if serving is not None:
        batch_size, seq_len = serving.sequences, serving.context_tokens
    started = time.perf_counter()
    inference_choices: dict[str, str] = {}
    if run.mode == "train" and fp16_master(built, run):
        to_fp16(built.model)  # fairseq's --fp16 trains an fp16 model (recipe's Fp16Master)
    rec = Recorder()

    def kernel_mode() -> contextlib.AbstractContextManager[Any]:
        if kernels == "cuda":
            return _CudaDropout(fused_attention=built.fused_attention_dropout)
        return contextlib.nullcontext()

    fused = _CudaDropout(fused_attention=built.fused_attention_dropout)
    cuda_amp = kernels == "cuda" and run.precision in AMP_DTYPES
    with (
        rec,
        fused if kernels == "cuda" else contextlib.nullcontext(),
        cuda_autocast_rules() if cuda_amp else contextlib.nullcontext(),
        quiet_transformers(),
    ):
        for p in built.model.parameters():
            rec.mark(p, "parameter")
        for b in built.model.buffers():
            rec.mark(b, "buffer")
        if run.mode == "train":
            _train_steps(rec, built, run, batch_size, seq_len, kernel_mode)
        else:
            inference_choices = _inference_steps(rec, built, run, batch_size, seq_len, serving)
    params_total, params_trainable = count_parameters(built.model)
    resolved = run.model_copy(update={"batch_size": batch_size, "seq_len": seq_len})
    units_per_step = batch_size * built.units_per_sample(seq_len)
    if serving is not None:  # a decode step makes one token per sequence
        resolved = resolved.model_copy(
            update={"context": serving.context_tokens, "new_tokens": serving.new_tokens}
        )
        units_per_step = serving.sequences
    return StepProfile(
        workload=workload.name,
        run=resolved,
        batch_size=batch_size,
        seq_len=seq_len,
        units_per_step=units_per_step,
        throughput_unit=workload.throughput_unit,
        params_total=params_total,
        params_trainable=params_trainable,
        ops=tuple(rec.ops),
        events=tuple(rec.events()),
        choices={
            "optimizer_impl": (
                "none"
                if run.mode != "train"
                else ADAMW_8BIT_IMPLEMENTATION
                if run.optimizer == "adamw-8bit"
                else PAGED_IMPLEMENTATION
                if run.optimizer == "paged-adamw-8bit"
                else run.optimizer_impl
            ),
            "autocast": (
                "off: an fp16 model with fp32 master weights (fairseq's FP16Optimizer)"
                if run.mode == "train" and fp16_master(built, run)
                else f"cuda rules, {run.precision} (traced by torch.autocast('cpu') with "
                "CUDA's operator table: whichgpu.trace.cuda_autocast)"
                if cuda_amp
                else f"cpu rules, {run.precision}"
                if run.precision in AMP_DTYPES
                else "off"
            ),
            "attention": _attention_choice(rec),
            **(
                {
                    "grad_accum": "the last micro-step of an optimizer step: the gradients "
                    "of the earlier micro-steps present through forward and backward, "
                    "which adds into them"
                }
                if run.mode == "train" and run.grad_accum > 1
                else {}
            ),
            **(
                {
                    "kernels": "cpu: dropout draws a mask in the input's dtype; attention "
                    "with dropout runs the math path"
                }
                if kernels == "cpu"
                else {}
            ),
            **(
                {
                    "attention_dropout": f"p={fused.dropout_p:g}, applied inside the fused "
                    "kernel as on CUDA (traced without it; the kernel keeps only its random "
                    "state)"
                }
                if fused.dropout_p > 0
                else {}
            ),
            "tensors": "fake" if fake else "real (cpu)",
            **method_choices(run, built.model),
            **experts_choice((op.name for op in rec.ops), run.precision),
            **inference_choices,
        },
        trace_seconds=time.perf_counter() - started,
        torch_version=torch.__version__,
    )


def trace_step(
    workload: Workload,
    run: RunConfig,
    *,
    fake: bool = True,
    kernels: Kernels = "cuda",
    layers: int | None = None,
) -> StepProfile:
    """Build ``workload`` for ``run`` and trace its step; ``fake=False`` runs it for real,
    ``kernels="cpu"`` with the CPU's dropout and attention instead of CUDA's, ``layers`` with
    only that many of its layers (``Workload.build_with_layers``; ``whichgpu.trace.depth``)."""
    check_supported(run)
    build = workload.build
    if layers is not None:
        if workload.build_with_layers is None:
            raise UsageError(f"{workload.info.name} cannot be built with fewer layers.")
        build_with_layers = workload.build_with_layers

        def build(run: RunConfig) -> BuiltWorkload:
            return build_with_layers(run, layers)

    context: Any
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        context = FakeTensorMode(allow_non_fake_inputs=False)
    else:
        context = contextlib.nullcontext()
    with context:
        built = apply_method(build(run), run)
        return trace_built(workload.info, built, run, fake=fake, kernels=kernels)
