"""What a training step is made of, for the tracer and the bench alike: the optimizer in the
implementation a run asks for, the loss, autocast to the run's half dtype, the checkpointing
policy's contexts, and fairseq's ``--fp16`` (an fp16 model with a flat fp32 master copy)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch

from whichgpu.errors import UnsupportedWorkload
from whichgpu.recipe.optim8bit import AdamW8bit
from whichgpu.schema import RunConfig, TensorCategory
from whichgpu.workloads.base import BuiltWorkload
from whichgpu.workloads.hf import (
    chunked_cross_entropy_loss,
    fused_cross_entropy_loss,
    fused_linear_cross_entropy_loss,
)

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
"""The half dtype autocast runs a precision in (the other precisions run without autocast);
fp8 training is bf16 AMP around its fp8 linear layers (``recipe.fp8``)."""

Kernels = Literal["cuda", "cpu"]
"""Whose dropout and attention kernels a step follows: CUDA's (what every GPU estimate
needs) or the CPU's (what a CPU step really runs)."""


def make_optimizer(run: RunConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer of a run, in the implementation it asks for (``foreach`` by default, as
    CUDA picks it); ``in-backward``: an ``InBackwardOptimizer``, which updates each parameter
    during the backward pass.

    ``adamw-8bit`` is bitsandbytes' ``AdamW8bit`` rebuilt in plain PyTorch (``optim8bit``).
    """
    if not params:
        raise UnsupportedWorkload(
            "The model has no trainable parameters, so a training step has nothing to update: "
            "check that the model's layers are registered as submodules (an nn.Module "
            "attribute or nn.ModuleList, not a plain list), or use --mode inference."
        )
    if run.optimizer_impl == "in-backward":
        return InBackwardOptimizer(run, params)
    return _optimizer(run, params)


def _optimizer(run: RunConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """``make_optimizer``'s optimizer over ``params`` (``in-backward``: one parameter's, run
    as a loop over its one parameter)."""
    # foreach=True: one kernel per operation over all parameters; False: a loop over them;
    # fused=True: one kernel per parameter group (foreach then stays unset, as torch asks)
    impl = run.optimizer_impl
    foreach = {"foreach": True, "for-loop": False, "fused": None, "in-backward": False}[impl]
    fused = True if impl == "fused" else None
    if run.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach, fused=fused)
    if run.optimizer in ("adamw-8bit", "paged-adamw-8bit"):  # paged: same state, other memory
        return AdamW8bit(params, lr=1e-4)
    if run.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach, fused=fused)
    if run.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3, foreach=foreach)
    raise UnsupportedWorkload(f"Optimizer '{run.optimizer}' is not supported.")


class InBackwardOptimizer(torch.optim.Optimizer):
    """The optimizer step in the backward pass (``--optimizer-impl in-backward``), as
    PyTorch's tutorial "How to save memory by fusing the optimizer step into the backward
    pass" and torchtune's ``optimizer_in_bwd`` run it: one optimizer per parameter (the run's,
    ``foreach=False`` as the tutorial builds it), stepped by the parameter's
    ``register_post_accumulate_grad_hook`` as soon as its gradient is accumulated, which then
    drops that gradient (``zero_grad(set_to_none=True)``). No full set of gradients ever
    exists: at most the gradients the backward pass has produced and not yet handed to an
    update.

    To a training loop it is an ordinary optimizer: ``step`` does nothing (the updates ran in
    the backward pass), ``zero_grad`` finds no gradients, and ``state`` holds every
    parameter's state (the per-parameter optimizers share this one table), so the tracer and
    the bench read it as they read any optimizer's. Gradient accumulation (the gradients must
    persist across micro-steps), a ``GradScaler`` (it checks all gradients for infinities
    before any update) and data-parallel gradient averaging (it runs after the backward
    pass) cannot run with it: ``whichgpu.workloads.run_config`` refuses them."""

    def __init__(self, run: RunConfig, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, {})
        self.optimizers: dict[torch.nn.Parameter, torch.optim.Optimizer] = {}
        self._handles = []
        for param in params:
            optimizer = _optimizer(run, [param])
            optimizer.state = self.state  # one table: each writes only its parameter's
            self.optimizers[param] = optimizer
            update = param.register_post_accumulate_grad_hook
            self._handles.append(update(self._update))  # type: ignore[no-untyped-call]

    def _update(self, param: torch.Tensor) -> None:
        """The hook: update ``param`` with its accumulated gradient, then drop the gradient."""
        optimizer = self.optimizers[param]  # type: ignore[index]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Nothing: every parameter was updated in the backward pass."""
        del closure


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


@contextlib.contextmanager
def autocast(run: RunConfig, device_type: str) -> Iterator[None]:
    """``torch.autocast`` on ``device_type`` to the run's half dtype (``AMP_DTYPES``); nothing
    for the other precisions. The tracer autocasts on the CPU (with CUDA's operator table
    when it traces for a GPU), the bench on the device it measures."""
    dtype = AMP_DTYPES.get(run.precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device_type, dtype=dtype):
        yield


SELECTIVE_SAVED_OPS = ("mm", "addmm", "_scaled_dot_product_")
"""Operators whose outputs a ``selective`` checkpoint keeps (by name, ``aten.`` dropped; a
name ending in ``_`` covers every operator it begins, here every fused attention kernel:
flash, memory-efficient, cuDNN, the CPU's), of the matrix products (``SELECTIVE_COUNTED_OPS``)
every other one; everything else is recomputed in the backward. This is torchtitan's ``op``
mode ("saves output of all compute ops, except every second mm", its
``activation_checkpoint.py``), whose models' linear layers have no bias; a linear with one
runs ``addmm``, counted here as an ``mm``."""
SELECTIVE_COUNTED_OPS = ("mm", "addmm")
"""The matrix products a ``selective`` checkpoint counts: the 2nd, 4th, … of each layer's
forward (and, counted the same way, of its recomputation) are recomputed."""


def _saves_output(name: str) -> bool:
    """Whether a ``selective`` checkpoint may keep the output of operator ``name`` (``mm``;
    of the matrix products, every other one: ``selective_policy``)."""
    return any(
        name.startswith(saved) if saved.endswith("_") else name == saved
        for saved in SELECTIVE_SAVED_OPS
    )


def selective_policy() -> Callable[..., Any]:
    """A ``create_selective_checkpoint_contexts`` policy for one checkpointed layer: keep the
    outputs of ``SELECTIVE_SAVED_OPS`` but every second matrix product, counted apart in the
    forward and in the recomputation (so both pick the same ones), recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        name = str(getattr(op, "_opname", op.__name__.split(".")[0]))
        if name in SELECTIVE_COUNTED_OPS:
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return (
            CheckpointPolicy.MUST_SAVE if _saves_output(name) else CheckpointPolicy.PREFER_RECOMPUTE
        )

    return policy


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
    the outputs of ``SELECTIVE_SAVED_OPS`` (of the matrix products every other one) in the
    forward and replays them in the recomputation (``create_selective_checkpoint_contexts``,
    one policy per checkpointed call, as torchtitan makes one)."""
    if run.checkpointing_policy != "selective":
        return lambda: (contextlib.nullcontext(), kernel_mode())

    def contexts() -> tuple[Any, Any]:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        forward, recompute = create_selective_checkpoint_contexts(  # type: ignore[no-untyped-call]
            selective_policy()
        )
        return forward, _entered(recompute, kernel_mode())

    return contexts


def compiled_checkpoint_contexts(run: RunConfig) -> Callable[[], tuple[Any, Any]]:
    """``torch.utils.checkpoint``'s ``context_fn`` for a checkpointed run as ``torch.compile``
    traces it: every policy through ``create_selective_checkpoint_contexts`` (``full`` with a
    policy that always prefers recomputation, as torch's ``tag_activation_checkpoint`` turns a
    plain checkpoint into one), so that the operators of each checkpointed call are tagged in
    the traced graph with their policy (``node.meta["recompute"]``) and with the call's own
    ``ac_graph_id``, the tags AOTAutograd's partitioners honour. Each call's tags end with it
    (the caching mode writes them into ``torch.fx.traceback.current_meta``, which
    ``tag_activation_checkpoint`` scopes with ``preserve_node_meta``; here the forward mode
    restores it on exit). Traced with ``torch.fx.traceback.preserve_node_meta()`` on, under
    AOTAutograd; the recomputation itself is the partitioner's, so no kernel mode is needed."""
    from torch.fx import traceback as fx_traceback
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        _CachingTorchDispatchMode,
        create_selective_checkpoint_contexts,
    )

    class Region(_CachingTorchDispatchMode):  # type: ignore[no-untyped-call]
        """The forward pass of one checkpointed call: its operators tagged, the tags undone
        when the call ends."""

        def __enter__(self) -> Any:
            self.outside = dict(fx_traceback.current_meta)
            fx_traceback.current_meta["ac_graph_id"] = self.ac_graph_id
            return super().__enter__()  # type: ignore[no-untyped-call]

        def __exit__(self, *exc: Any) -> Any:
            try:
                return super().__exit__(*exc)  # type: ignore[no-untyped-call]
            finally:
                fx_traceback.current_meta.clear()
                fx_traceback.current_meta.update(self.outside)

    def recompute_all(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        del ctx, op, args, kwargs
        return CheckpointPolicy.PREFER_RECOMPUTE

    calls = itertools.count(1)

    def contexts() -> tuple[Any, Any]:
        policy = selective_policy() if run.checkpointing_policy == "selective" else recompute_all
        forward, recompute = create_selective_checkpoint_contexts(  # type: ignore[no-untyped-call]
            policy
        )
        region = Region(policy, forward.storage)
        region.ac_graph_id = next(calls)  # the call's own region (set here for any torch)
        return region, recompute

    return contexts


def to_fp16(model: torch.nn.Module) -> None:
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


def fp16_master(built: BuiltWorkload, run: RunConfig) -> bool:
    """Whether this run trains as fairseq's ``--fp16`` (``BuiltWorkload.fp16_master_weights``)."""
    return built.fp16_master_weights and run.precision == "fp16" and run.method == "full"


def _unmarked(tensor: torch.Tensor, category: TensorCategory) -> None:
    del tensor, category


class Fp16Master:
    """fairseq's ``FP16Optimizer`` (``fairseq/optim/fp16_optimizer.py``, as of its 2019
    releases), restated: the fp16 model's parameters copied into one flat fp32 buffer, whose
    ``.grad`` is a second flat fp32 buffer kept for the whole run; after backward the fp16
    gradients are copied into it, the optimizer steps on the fp32 buffer, and the result is
    copied back into the fp16 parameters. ``mark`` hears the two buffers with their
    categories (``optimizer``, ``gradient``): the tracer's ``Recorder.mark``."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        mark: Callable[[torch.Tensor, TensorCategory], None] = _unmarked,
    ) -> None:
        self.fp16 = params
        total = sum(p.numel() for p in params)
        flat = torch.empty(total, dtype=torch.float32, device=params[0].device)
        offset = 0
        for p in params:
            flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
            offset += p.numel()
        self.flat = torch.nn.Parameter(flat)
        self.flat.grad = torch.zeros_like(flat)
        mark(self.flat, "optimizer")
        mark(self.flat.grad, "gradient")
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
