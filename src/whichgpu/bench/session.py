"""A workload's step on a torch device (CUDA, CPU, MPS), built and run in a child process.

The step is the one the tracer records, run for real: both build it from the step recipe
(``whichgpu.recipe``): the same optimizer and implementation (``make_optimizer``: ``foreach``
AdamW by default), the same fine-tuning wrappers (``apply_method``), the same checkpointing
switch, and autocast to the run's half dtype for ``fp16``/``bf16`` (on the device measured, not
the CPU rules the tracer uses). What a real training loop adds is added here: a ``GradScaler``
for ``fp16``, and ``zero_grad(set_to_none=True)`` after each optimizer step. The batch is
synthetic, made once and reused (no input pipeline is timed). Inference is one forward pass
under ``torch.inference_mode``; a causal language model's inference is a request batch served
as the tracer serves it (``whichgpu.recipe.generation``): a ``StaticCache`` for context + new
tokens, the prefill of the prompt (last position's logits only), then one greedy decode step
per new token, so a step generates ``sequences x new_tokens`` tokens.

Numeric settings on CUDA: ``fp32`` turns TF32 off for matmuls and cuDNN, ``tf32`` turns both
on, the other precisions keep torch's defaults; ``cudnn.benchmark`` is on (the warm-up absorbs
its autotuning). The settings actually in force are read back into the result.

Without ``--compile`` the step is eager, and stays so: every step runs with TorchDynamo
disabled, so nothing compiles the model behind the user's back (a library's own
``torch.compile``, as transformers' ``generate`` applies to a static cache, runs eagerly; the
bench calls the model, never ``generate``). A step's FLOPs are counted over one eager step,
else traced (``bench.flops``); the count never fails the measurement.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from whichgpu.bench.devices.protocol import MemoryPeaks, NvmlTarget, Report, StepOutOfMemory
from whichgpu.bench.devices.torch_device import TorchDevice
from whichgpu.bench.flops import FlopCount, count_flops, flop_count, traced_flops
from whichgpu.bench.jobs import BenchProgress, PrecisionState, StepSpec
from whichgpu.errors import UnsupportedWorkload
from whichgpu.recipe.fp8 import check_device as fp8_device_refusal
from whichgpu.recipe.fp8 import convert_to_fp8
from whichgpu.recipe.generation import (
    ServingSizes,
    generation_arguments,
    prompt_ids,
    serving_sizes,
    static_cache,
)
from whichgpu.recipe.training import (
    AMP_DTYPES,
    Kernels,
    autocast,
    checkpoint_contexts,
    make_optimizer,
    step_loss,
)
from whichgpu.schema import RunConfig
from whichgpu.workloads.base import enable_checkpointing
from whichgpu.workloads.finetune import apply_method
from whichgpu.workloads.hf import quiet_transformers

EAGER_NOTE = (
    "eager: the model ran without torch.compile, with TorchDynamo disabled during the steps "
    "so that nothing compiled it on the way (--compile measures it compiled)"
)
"""The note of a session without ``--compile``."""
COMPILED_NOTE = (
    "compiled: the model ran under torch.compile (default settings; the warm-up absorbs the "
    "compilation)"
)
"""The note of a session with ``--compile``."""
COMPILED_DECODING_NOTE = (
    "compiled decoding: the decode steps ran under torch.compile(mode='reduce-overhead') (CUDA "
    "graphs on a GPU; the warm-up absorbs the compilation and the capture), the prefill "
    "eagerly, as transformers' generate runs a static cache"
)
"""The note of a causal language model's inference session with ``--compile``."""


class TorchSession:
    """A built step on a torch device (see the module docstring for what a step is)."""

    def __init__(self, device: TorchDevice, spec: StepSpec, report: Report) -> None:
        run = spec.run
        if run.precision == "fp8":
            capability = None
            if device.kind == "cuda":
                capability = torch.cuda.get_device_capability(device.index)
            why = fp8_device_refusal(device.kind, capability)
            if why is not None:
                raise UnsupportedWorkload(why)
        self._device = device
        self._spec = spec
        self._report = report
        self._notes: list[str] = []
        self._memory: MemoryPeaks | None = None
        self._group = spec.group
        device.select()
        if spec.group is not None and device.kind == "cpu":
            here = spec.group.local_world_size or spec.group.world_size
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // here))
        limit_note = device.limit_memory(spec.memory_limit_bytes)
        if limit_note:
            self._notes.append(limit_note)
        if device.kind == "cuda":
            _set_cuda_precision(run.precision)
        self._amp_dtype = AMP_DTYPES.get(run.precision)
        self._notes.extend(_run_notes(spec))
        workload = spec.workload.resolve()
        report(BenchProgress("build", f"building {workload.info.name} (batch {spec.batch_size})"))
        target = device.torch_device()
        try:
            with torch.device(target):
                built = apply_method(workload.build(_built_as(run)), run)
                model = built.model.to(target)
                if run.precision == "fp8":
                    self._notes.append(convert_to_fp8(model, run.fp8_recipe))
                    if device.kind == "cpu":
                        self._notes.append(
                            "fp8 on the CPU: torchao emulates the fp8 matrix products in "
                            "higher precision, so the memory is fp8 training's but the time "
                            "is not"
                        )
                self._serving = serving_sizes(workload.info, built, run)
                if self._serving is None:
                    batch = built.make_batch(spec.batch_size, spec.seq_len)
                else:
                    batch = {"input_ids": prompt_ids(model, self._serving)}
            batch = tree_map(lambda x: x.to(target) if isinstance(x, torch.Tensor) else x, batch)
        except Exception as exc:
            if device.is_out_of_memory(exc):
                raise StepOutOfMemory(f"building the model: {_first_line(exc)}") from None
            raise
        self._built = built
        if run.mode == "train" and run.checkpointing:
            enable_checkpointing(  # the run's policy, applied as the tracer applies it
                model,
                None if run.checkpointing_policy == "full" else run.checkpointing_every_layers(),
                use_reentrant=False,
                context_fn=checkpoint_contexts(run, contextlib.nullcontext),
            )
        self._channels_last = False
        if spec.channels_last:
            if any(isinstance(m, torch.nn.Conv2d) for m in model.modules()):
                model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
                batch = tree_map(_channels_last_image, batch)
                self._channels_last = True
            else:
                self._notes.append("--channels-last ignored: the model has no 2-D convolutions")
        self._batch: dict[str, Any] = dict(batch)
        self._tensors = [*model.parameters(), *model.buffers(), *_tensors(self._batch)]
        if spec.group is not None and run.mode == "train":
            model = self._join_group(model, spec)
        self._eager = model
        self._model: torch.nn.Module = model
        self._cache: Any = None
        """Compiled decoding's one KV cache, reset for each request (``_inference_step``)."""
        self._compiled = False
        if spec.compile and self._serving is not None:  # as generate runs a static cache
            self._model = torch.compile(model, mode="reduce-overhead")  # type: ignore[assignment]
            self._compiled = True
            self._notes.append(COMPILED_DECODING_NOTE)
        elif spec.compile:
            self._model = torch.compile(model)  # type: ignore[assignment]
            self._compiled = True
            self._notes.append(COMPILED_NOTE)
        else:
            self._notes.append(EAGER_NOTE)
        self._optimizer: torch.optim.Optimizer | None = None
        self._scaler: Any = None
        if run.mode == "train":
            params = [p for p in model.parameters() if p.requires_grad]
            self._optimizer = make_optimizer(run, params)
            if run.precision == "fp16":
                self._scaler = torch.amp.GradScaler(device.kind)
        self._units = spec.batch_size * built.units_per_sample(spec.seq_len)
        if self._serving is not None:  # a step generates new_tokens per sequence
            self._units = self._serving.sequences * self._serving.new_tokens

    # --- construction helpers -----------------------------------------------------------

    def _join_group(self, model: torch.nn.Module, spec: StepSpec) -> torch.nn.Module:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        group = spec.group
        assert group is not None
        backend = "nccl" if self._device.kind == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            init_method=group.address,
            rank=group.rank,
            world_size=group.world_size,
            timeout=dt.timedelta(seconds=group.timeout_s),
        )
        ids = [self._device.index] if self._device.kind == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    # --- the Session protocol ---------------------------------------------------------------

    @property
    def units_per_step(self) -> int:
        return self._units

    @property
    def samples_per_step(self) -> int:
        return self._spec.batch_size

    @property
    def compiled(self) -> bool:
        return self._compiled

    @property
    def channels_last(self) -> bool:
        return self._channels_last

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self._notes)

    def step(self) -> None:
        self._guarded(self._model)

    def synchronize(self) -> None:
        self._device.synchronize()

    def memory_steps(self, steps: int) -> MemoryPeaks:
        # a dispatch-mode count cannot see inside compiled graphs: it watches the eager step
        counts_tensors = self._device.kind in ("cpu", "mps")
        model = self._eager if counts_tensors else self._model
        if counts_tensors and self._compiled:
            self._notes.append(
                "memory: measured on the eager step (compiled graphs hide their tensors from "
                "the count); compiled steps usually need less"
            )
        baseline = [*self._tensors, *_tensors(self._optimizer_state())]
        with self._device.memory_tracker(baseline, self._spec.memory_limit_bytes) as read:
            for _ in range(steps):
                self._guarded(model)
            self.synchronize()
        self._memory = read()
        return self._memory

    def run_peaks(self) -> MemoryPeaks:
        if self._device.kind == "cuda":
            index = self._device.index
            return MemoryPeaks(
                allocated_bytes=int(torch.cuda.max_memory_allocated(index)),
                reserved_bytes=int(torch.cuda.max_memory_reserved(index)),
                method="torch.cuda.max_memory_allocated / max_memory_reserved over the run",
            )
        return self._memory or MemoryPeaks(None, None, "not measured")

    def flops_per_step(self) -> FlopCount:
        """One eager step's FLOPs (``bench.flops``): counted, else traced, never an error."""
        kernels: Kernels = "cuda" if self._device.kind == "cuda" else "cpu"
        new_tokens = None if self._serving is None else self._serving.new_tokens

        def counted() -> int:
            try:
                return count_flops(lambda: self._guarded(self._eager))
            finally:
                self.synchronize()

        def traced() -> int:
            return traced_flops(self._spec.workload.resolve(), self._spec.run, kernels, new_tokens)

        return flop_count(counted, traced, lambda text: self._report(BenchProgress("flops", text)))

    def precision_state(self) -> PrecisionState:
        amp = None if self._amp_dtype is None else str(self._amp_dtype).removeprefix("torch.")
        if self._device.kind != "cuda":
            return PrecisionState(amp_dtype=amp)
        return PrecisionState(
            tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
            tf32_cudnn=bool(torch.backends.cudnn.allow_tf32),
            amp_dtype=amp,
        )

    def agree(self, seconds: float) -> float:
        if self._group is None:
            return seconds
        import torch.distributed as dist

        where = self._device.torch_device() if self._device.kind == "cuda" else "cpu"
        value = torch.tensor([seconds], dtype=torch.float64, device=where)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    def clock(self) -> float:
        return time.perf_counter()

    def nvml_target(self) -> NvmlTarget | None:
        return self._device.nvml_target()

    def gather(self, value: object) -> list[object] | None:
        """Every rank's ``value``, in rank order, on rank 0 (None on the others); ``[value]``
        outside a group. Every rank of the group must call it."""
        if self._group is None:
            return [value]
        import torch.distributed as dist

        gathered: list[object] | None = (
            [None] * self._group.world_size if self._group.rank == 0 else None
        )
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def close(self) -> None:
        if self._group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    # --- the step ----------------------------------------------------------------------

    def _optimizer_state(self) -> list[Any]:
        if self._optimizer is None:
            return []
        return [v for state in self._optimizer.state.values() for v in state.values()]

    def _guarded(self, model: torch.nn.Module) -> None:
        """One step; the runtime's out-of-memory errors become ``StepOutOfMemory``. An eager
        session runs it with TorchDynamo disabled, so nothing compiles the model on the way
        (a library's own ``torch.compile`` runs its function eagerly)."""
        try:
            with quiet_transformers(), self._eager_only():
                if self._optimizer is None:
                    self._inference_step(model)
                else:
                    self._train_step(model, self._optimizer)
        except Exception as exc:
            cause = self._out_of_memory_in(exc)
            if cause is None:
                raise
            if isinstance(cause, StepOutOfMemory):
                raise StepOutOfMemory(str(cause)) from None
            raise StepOutOfMemory(_first_line(cause)) from None

    def _out_of_memory_in(self, exc: BaseException) -> BaseException | None:
        """The out-of-memory error in ``exc``'s chain (a user's loss function may wrap it)."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            if isinstance(current, StepOutOfMemory) or self._device.is_out_of_memory(current):
                return current
            current = current.__cause__ or current.__context__
        return None

    def _train_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        with self._autocast():
            loss = step_loss(self._built, self._spec.run, model, self._batch)
        if self._scaler is not None:
            self._scaler.scale(loss).backward()
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _inference_step(self, model: torch.nn.Module) -> None:
        with torch.inference_mode(), self._autocast():
            if self._serving is None:
                self._built.infer(model, self._batch)
            else:  # the prefill eager, as generate runs it; the decode steps on ``model``
                cache = None
                if model is not self._eager:  # compiled: one cache, reset, as generate keeps it
                    if self._cache is None:
                        self._cache = static_cache(self._eager, self._serving)
                    else:
                        self._cache.reset()
                    cache = self._cache
                _serve(self._eager, model, self._batch["input_ids"], self._serving, cache)

    def _eager_only(self) -> contextlib.AbstractContextManager[Any]:
        if self._compiled:
            return contextlib.nullcontext()
        return torch._dynamo.config.patch(disable=True)  # type: ignore[no-any-return]

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        return autocast(self._spec.run, self._device.kind)


def _set_cuda_precision(precision: str) -> None:
    if precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True


def _run_notes(spec: StepSpec) -> list[str]:
    """What the reader should know about how this run configuration is executed."""
    run = spec.run
    notes = []
    if run.mode == "inference":
        notes.append(
            "inference: one forward pass per step under torch.inference_mode (causal language "
            "models: a request batch served with a static KV cache, prefill then one greedy "
            "decode step per new token; throughput counts the generated tokens)"
        )
    if run.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        notes.append(
            f"{run.optimizer} runs whichgpu's plain-PyTorch rebuild of bitsandbytes' AdamW8bit "
            "(same memory, not its fused kernels; paged: its state in ordinary device memory, "
            "not unified memory): its time is not representative"
        )
    if run.method == "qlora":
        notes.append(
            "qlora dequantises NF4 weights with plain PyTorch operators (same memory as "
            "bitsandbytes, not its kernels): its time is not representative"
        )
    if run.precision == "fp16" and run.mode == "train":
        notes.append("fp16: torch.amp.GradScaler (dynamic loss scaling), as AMP training uses")
    if run.precision == "fp8" and not spec.compile:
        notes.append(
            "fp8 without --compile: torchao's scaling and casts run as separate eager kernels; "
            "torchao's float8 training is made to run under torch.compile, which fuses them "
            "(whichgpu's estimate assumes it does)"
        )
    return notes


def _built_as(run: RunConfig) -> RunConfig:
    """The run a model is built for: fp8 training builds the bf16 AMP model (fp32 weights)
    whose linear layers ``recipe.fp8`` then converts."""
    if run.precision == "fp8":
        return run.model_copy(update={"precision": "bf16"})
    return run


def _serve(
    prefill: torch.nn.Module,
    decode: torch.nn.Module,
    ids: torch.Tensor,
    serving: ServingSizes,
    cache: Any = None,
) -> None:
    """One request batch: a static cache for context + new tokens (``cache``, emptied, where
    given), the prefill on ``prefill``, then a greedy decode step per new token on ``decode``
    (the same model, or it compiled) (the tracer's ``_serve``, run to the end of the request).
    A compiled decode keeps one cache across requests, as ``generate`` does: a new cache's
    tensors at new addresses would make CUDA graphs record again."""
    if cache is None:
        cache = static_cache(prefill, serving)
    step = generation_arguments(prefill, cache)
    out = prefill(input_ids=ids, **step)
    token = out.logits[:, -1:].argmax(dim=-1)
    del out
    for _ in range(serving.new_tokens):
        out = decode(input_ids=token, **step)
        token = out.logits[:, -1:].argmax(dim=-1)
        del out


def _tensors(value: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)]


def _channels_last_image(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    return value


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
