"""Run one workload step — for real or under fake tensors — while a ``Recorder`` watches.

Training: two steps of forward, loss, backward, optimizer step and ``zero_grad``, so the
second step (the one whose operators are kept) runs with optimizer state present, as every
step after the first does. With gradient accumulation (``grad_accum`` > 1) the kept step is
the last micro-step of an optimizer step: the first step's ``zero_grad`` keeps the gradients
(zeroed, as the earlier micro-steps leave them allocated), so they are present through the
kept step's forward and backward, which adds into them; its optimizer step and
``zero_grad(set_to_none=True)`` end the accumulation. The earlier micro-steps are the same
operators without the optimizer step (``estimate.prediction`` times them so). The batch and
the loss stay alive until the step ends, as in a training loop, which holds both through the
optimizer step. Inference: a prefill forward pass
without gradients, then one decode step with the KV cache for language models.

Kernel choices that depend on the device are made explicit here and written into the profile:
the optimizer implementation is ``foreach`` (PyTorch's default on CUDA; the CPU default would
differ), autocast runs ``torch.autocast("cpu")`` with CUDA's operator table
(``whichgpu.trace.cuda_autocast``: CUDA runs ``pow``, ``softmax``, ``layer_norm`` … in 32-bit
where the CPU's table leaves them in 16-bit), ``F.dropout`` runs
CUDA's one-kernel ``native_dropout`` (a one-byte mask) instead of the CPU's three passes over
a mask in the input's dtype, and ``F.scaled_dot_product_attention`` with dropout runs without
it, so that the CPU traces its fused kernel (which has no dropout) as CUDA runs its flash or
memory-efficient kernel (which apply the dropout inside); the CPU would otherwise fall back
to the math path and materialise the scores, dropout mask and probabilities that no CUDA
kernel keeps. Workloads that stand for fairseq's ``--fp16`` train as its ``FP16Optimizer``
(``_Fp16Master``).

``kernels="cpu"`` traces the CPU's own dropout and attention instead: the step the CPU runs,
against which the CPU's live-tensor measurements check the tracer itself
(``whichgpu.validate.measured``).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.schema import RunConfig, StepProfile, WorkloadInfo
from whichgpu.trace.cuda_autocast import cuda_autocast_rules
from whichgpu.trace.optim8bit import IMPLEMENTATION as ADAMW_8BIT_IMPLEMENTATION
from whichgpu.trace.optim8bit import AdamW8bit
from whichgpu.trace.recorder import Recorder
from whichgpu.workloads.base import BuiltWorkload, Workload, enable_checkpointing
from whichgpu.workloads.finetune import apply_method, count_parameters, method_choices
from whichgpu.workloads.hf import (
    chunked_cross_entropy_loss,
    experts_choice,
    fused_cross_entropy_loss,
    fused_linear_cross_entropy_loss,
    quiet_transformers,
)
from whichgpu.workloads.run_config import DEFAULT_NEW_TOKENS

_AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

Kernels = Literal["cuda", "cpu"]
"""Whose dropout and attention kernels a trace follows: CUDA's (what every GPU estimate
needs) or the CPU's (what a CPU step really runs)."""


def check_supported(run: RunConfig) -> None:
    """Raise ``UnsupportedWorkload`` for configurations the tracer cannot run (yet), with why."""
    if run.precision == "fp8":
        raise UnsupportedWorkload("Tracing --precision fp8 is not supported yet.")


def make_optimizer(run: RunConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer of a run, in the implementation it asks for (``foreach`` by default, as
    CUDA picks it).

    ``adamw-8bit`` is bitsandbytes' ``AdamW8bit`` rebuilt in plain PyTorch (``optim8bit``).
    """
    if not params:
        raise UnsupportedWorkload(
            "The model has no trainable parameters, so a training step has nothing to update: "
            "check that the model's layers are registered as submodules (an nn.Module "
            "attribute or nn.ModuleList, not a plain list), or use --mode inference."
        )
    # foreach=True: one kernel per operation over all parameters; False: a loop over them;
    # fused=True: one kernel per parameter group (foreach then stays unset, as torch asks)
    foreach = {"foreach": True, "for-loop": False, "fused": None}[run.optimizer_impl]
    fused = True if run.optimizer_impl == "fused" else None
    if run.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach, fused=fused)
    if run.optimizer == "adamw-8bit":
        return AdamW8bit(params, lr=1e-4)
    if run.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach, fused=fused)
    if run.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3, foreach=foreach)
    raise UnsupportedWorkload(f"Optimizer '{run.optimizer}' is not supported.")


def step_loss(
    built: BuiltWorkload, run: RunConfig, model: torch.nn.Module, batch: Any
) -> torch.Tensor:
    """The training step's loss: the workload's own, or a language model's cross-entropy by
    ``loss_kernel`` (``workloads.hf``): ``fused``, one fused kernel over its logits;
    ``chunked``, torchtune's chunked cross-entropy; ``fused-linear``, Liger's fused output
    projection and cross-entropy. The tracer and the bench both take the loss from here."""
    if run.loss_kernel == "fused":
        return fused_cross_entropy_loss(model, batch)
    if run.loss_kernel == "chunked":
        return chunked_cross_entropy_loss(model, batch)
    if run.loss_kernel == "fused-linear":
        return fused_linear_cross_entropy_loss(model, batch)
    return built.loss(model, batch)


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


@contextlib.contextmanager
def _autocast(run: RunConfig) -> Iterator[None]:
    dtype = _AMP_DTYPES.get(run.precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type="cpu", dtype=dtype):
        yield


SELECTIVE_SAVED_OPS = ("mm", "addmm", "_scaled_dot_product_")
"""Operators whose outputs a ``selective`` checkpoint keeps (by name, ``aten.`` dropped; a
name ending in ``_`` covers every operator it begins, here every fused attention kernel:
flash, memory-efficient, cuDNN, the CPU's). torchtitan's ``op`` mode keeps these (and, of
matrix multiplications, every other one); everything else is recomputed in the backward."""


def _saves_output(name: str) -> bool:
    """Whether a ``selective`` checkpoint keeps the output of operator ``name`` (``mm``)."""
    return any(
        name.startswith(saved) if saved.endswith("_") else name == saved
        for saved in SELECTIVE_SAVED_OPS
    )


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """``create_selective_checkpoint_contexts``' policy: keep the outputs of
    ``SELECTIVE_SAVED_OPS``, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    del ctx, args, kwargs
    name = str(getattr(op, "_opname", op.__name__.split(".")[0]))
    return CheckpointPolicy.MUST_SAVE if _saves_output(name) else CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def _entered(*managers: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    """All of ``managers``, entered in order."""
    with contextlib.ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield


def checkpoint_contexts(
    run: RunConfig, kernel_mode: Callable[[], contextlib.AbstractContextManager[Any]]
) -> Callable[[], tuple[Any, Any]]:
    """``torch.utils.checkpoint``'s ``context_fn`` for a checkpointed run: the recomputation
    runs under ``kernel_mode`` (as the forward pass did); a ``selective`` policy also keeps
    the outputs of ``SELECTIVE_SAVED_OPS`` in the forward and replays them in the
    recomputation (``create_selective_checkpoint_contexts``)."""
    if run.checkpointing_policy != "selective":
        return lambda: (contextlib.nullcontext(), kernel_mode())

    def contexts() -> tuple[Any, Any]:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        forward, recompute = create_selective_checkpoint_contexts(  # type: ignore[no-untyped-call]
            _selective_policy
        )
        return forward, _entered(recompute, kernel_mode())

    return contexts


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
    master = _Fp16Master(rec, params) if _fp16_master(built, run) else None
    optimizer = make_optimizer(run, master.params if master else params)
    for step in (0, 1):
        rec.step = step
        rec.phase = "setup"
        batch = built.make_batch(batch_size, seq_len)
        for leaf in torch.utils._pytree.tree_flatten(dict(batch))[0]:
            if isinstance(leaf, torch.Tensor):
                rec.mark(leaf, "input")
        rec.phase = "forward"
        with contextlib.nullcontext() if master else _autocast(run):
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
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    rec.mark(value, "optimizer")
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


def _to_fp16(model: torch.nn.Module) -> None:
    """``model.half()`` by replacing each floating parameter and buffer (shared ones stay
    shared); ``half()`` itself cannot swap fake tensors that others hold weak references to."""
    converted: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, value in table.items():
                if value is None or not value.is_floating_point():
                    continue
                found = converted.get(id(value))
                if found is None:
                    half = value.detach().to(torch.float16)
                    if isinstance(value, torch.nn.Parameter):
                        half = torch.nn.Parameter(half, requires_grad=value.requires_grad)
                    found = converted[id(value)] = half
                table[name] = found  # type: ignore[assignment]


def _fp16_master(built: BuiltWorkload, run: RunConfig) -> bool:
    """Whether this run trains as fairseq's ``--fp16`` (``BuiltWorkload.fp16_master_weights``)."""
    return built.fp16_master_weights and run.precision == "fp16" and run.method == "full"


class _Fp16Master:
    """fairseq's ``FP16Optimizer`` (``fairseq/optim/fp16_optimizer.py``, as of its 2019
    releases), restated: the fp16 model's parameters copied into one flat fp32 buffer, whose
    ``.grad`` is a second flat fp32 buffer kept for the whole run; after backward the fp16
    gradients are copied into it, the optimizer steps on the fp32 buffer, and the result is
    copied back into the fp16 parameters."""

    def __init__(self, rec: Recorder, params: list[torch.nn.Parameter]) -> None:
        self.fp16 = params
        total = sum(p.numel() for p in params)
        flat = torch.empty(total, dtype=torch.float32, device=params[0].device)
        offset = 0
        for p in params:
            flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
            offset += p.numel()
        self.flat = torch.nn.Parameter(flat)
        self.flat.grad = torch.zeros_like(flat)
        rec.mark(self.flat, "optimizer")
        rec.mark(self.flat.grad, "gradient")
        self.params = [self.flat]

    def gradients_in(self) -> None:
        """Copy the fp16 gradients into the flat fp32 gradient buffer."""
        grad = self.flat.grad
        assert grad is not None
        offset = 0
        for p in self.fp16:
            n = p.numel()
            if p.grad is not None:
                grad[offset : offset + n].copy_(p.grad.reshape(-1))
            offset += n

    def parameters_out(self) -> None:
        """Copy the updated fp32 parameters back into the fp16 model."""
        offset = 0
        with torch.no_grad():
            for p in self.fp16:
                n = p.numel()
                p.copy_(self.flat[offset : offset + n].view_as(p))
                offset += n


@dataclass(frozen=True)
class ServingSizes:
    """The sizes of a causal language model's inference trace (from ``RunConfig``).

    The batch is the ``concurrency`` sequences served at once: every sequence is prefilled
    together, then each decode step produces one token per sequence, so a decode step yields
    ``sequences`` tokens. ``--batch-size`` is accepted as another name for it.
    """

    sequences: int
    """Sequences served at once: the batch of the prefill and of every decode step."""
    context_tokens: int
    """Prompt tokens per sequence: the prefill length."""
    new_tokens: int
    """Tokens generated per sequence; the KV cache holds ``context_tokens + new_tokens``."""


def generates_with_kv_cache(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a decoder-only transformers model that generates with a KV cache.

    transformers' own test: ``can_generate()`` is true for the ``*ForCausalLM`` classes (and
    GPT-2's ``LMHeadModel``) and false for encoders (BERT, ViT) and plain PyTorch models;
    encoder-decoder models generate too but need encoder outputs, so they are left out.
    """
    can_generate = getattr(model, "can_generate", None)
    config = getattr(model, "config", None)
    if not callable(can_generate) or config is None:
        return False
    return bool(can_generate()) and not getattr(config, "is_encoder_decoder", False)


def serving_sizes(
    workload: WorkloadInfo, built: BuiltWorkload, run: RunConfig
) -> ServingSizes | None:
    """The prefill and decode sizes of an inference run of a causal LM; None for other runs.

    ``context`` defaults to ``seq_len`` if given, else to the workload's default sequence
    length, shortened so that context plus ``new_tokens`` (default ``DEFAULT_NEW_TOKENS``) fits
    the model's ``max_position_embeddings``; a given context that does not fit is refused.
    """
    if run.mode != "inference":
        return None
    if not generates_with_kv_cache(built.model):
        if run.context is not None or run.new_tokens is not None:
            raise UnsupportedWorkload(
                f"{workload.name} does not generate tokens with a KV cache; --context and "
                "--new-tokens apply to causal language models only."
            )
        return None
    if run.batch_size is not None and run.concurrency not in (1, run.batch_size):
        raise UsageError(
            "For language-model inference the batch is the --concurrency sequences served at "
            f"once; --batch-size {run.batch_size} disagrees with --concurrency "
            f"{run.concurrency}. Give one of them."
        )
    if run.context is not None and run.seq_len is not None and run.context != run.seq_len:
        raise UsageError(
            "--seq-len is the context of an inference run; give --context or --seq-len, not both."
        )
    sequences = run.concurrency if run.concurrency != 1 else (run.batch_size or 1)
    new_tokens = run.new_tokens or DEFAULT_NEW_TOKENS
    config: Any = built.model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    max_positions: int | None = getattr(text_config, "max_position_embeddings", None)
    context = run.context or run.seq_len
    if context is None:
        context = workload.default_seq_len or 2048
        if max_positions is not None:
            context = min(context, max_positions - new_tokens)
    if max_positions is not None and (context < 1 or context + new_tokens > max_positions):
        raise UnsupportedWorkload(
            f"{workload.name} has {max_positions} positions; a context of {context} tokens "
            f"plus {new_tokens} new tokens does not fit. Shorten --context or --new-tokens."
        )
    return ServingSizes(sequences=sequences, context_tokens=context, new_tokens=new_tokens)


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
        with torch.no_grad(), _autocast(run):
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
    with torch.no_grad(), _autocast(run):
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


def prompt_ids(model: torch.nn.Module, serving: ServingSizes) -> torch.Tensor:
    """Random prompt token ids, ``sequences x context``, on the model's device."""
    config: Any = model.config
    vocab_size = int(config.get_text_config().vocab_size)
    device = next(model.parameters()).device
    shape = (serving.sequences, serving.context_tokens)
    return torch.randint(0, vocab_size, shape, device=device)


def static_cache(model: torch.nn.Module, serving: ServingSizes) -> Any:
    """A request's KV cache: transformers' ``StaticCache`` for context + new tokens."""
    from transformers import StaticCache

    config: Any = model.config
    return StaticCache(config=config, max_cache_len=serving.context_tokens + serving.new_tokens)


def generation_arguments(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword arguments of one generation step with ``cache``, as ``generate`` passes them.

    The cache goes under the name the model's ``forward`` takes: ``cache`` from transformers
    5.24 on, ``past_key_values`` before it (5.24 still accepts the old name but warns that it
    goes away in 5.40). Only the last position's logits are asked for where the model can
    (``logits_to_keep=1``). The tracer and the bench build their steps from this one helper,
    so both run the same step on every supported transformers.
    """
    name = "cache" if takes_argument(model, "cache") else "past_key_values"
    arguments: dict[str, Any] = {name: cache, "use_cache": True}
    if takes_argument(model, "logits_to_keep"):
        arguments["logits_to_keep"] = 1
    return arguments


def takes_argument(model: torch.nn.Module, argument: str) -> bool:
    """Whether ``model.forward`` has a parameter named ``argument``."""
    return argument in inspect.signature(model.forward).parameters


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
    if run.mode == "train" and _fp16_master(built, run):
        _to_fp16(built.model)  # fairseq's --fp16 trains an fp16 model (see _Fp16Master)
    rec = Recorder()

    def kernel_mode() -> contextlib.AbstractContextManager[Any]:
        if kernels == "cuda":
            return _CudaDropout(fused_attention=built.fused_attention_dropout)
        return contextlib.nullcontext()

    fused = _CudaDropout(fused_attention=built.fused_attention_dropout)
    cuda_amp = kernels == "cuda" and run.precision in _AMP_DTYPES
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
                else "foreach"
            ),
            "autocast": (
                "off: an fp16 model with fp32 master weights (fairseq's FP16Optimizer)"
                if run.mode == "train" and _fp16_master(built, run)
                else f"cuda rules, {run.precision} (traced by torch.autocast('cpu') with "
                "CUDA's operator table: whichgpu.trace.cuda_autocast)"
                if cuda_amp
                else f"cpu rules, {run.precision}"
                if run.precision in _AMP_DTYPES
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
