"""Run one workload step — for real or under fake tensors — while a ``Recorder`` watches.

Training: two steps of forward, loss, backward, optimizer step and ``zero_grad``, so the
second step (the one whose operators are kept) runs with optimizer state present, as every
step after the first does. Inference: a prefill forward pass without gradients, then one
decode step with the KV cache for language models.

Kernel choices that depend on the device are made explicit here and written into the profile:
the optimizer implementation is ``foreach`` (PyTorch's default on CUDA; the CPU default would
differ), and autocast follows the CPU autocast rules with the target dtype.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from whichgpu.errors import UnsupportedWorkload
from whichgpu.schema import RunConfig, StepProfile, WorkloadInfo
from whichgpu.trace.recorder import Recorder
from whichgpu.workloads.base import BuiltWorkload, Workload

_AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def check_supported(run: RunConfig) -> None:
    """Raise ``UnsupportedWorkload`` for configurations the tracer cannot run (yet), with why."""
    if run.method in ("lora", "qlora"):
        raise UnsupportedWorkload(
            f"Tracing --method {run.method} is not built yet (it needs the LoRA wrappers); "
            "trace --method full for now."
        )
    if run.optimizer == "adamw-8bit":
        raise UnsupportedWorkload(
            "Tracing --optimizer adamw-8bit needs bitsandbytes' 8-bit optimizer, which is not "
            "supported yet; use adamw, adafactor or sgd."
        )
    if run.precision == "fp8":
        raise UnsupportedWorkload("Tracing --precision fp8 is not supported yet.")


def make_optimizer(run: RunConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer of a run, with the implementation CUDA would use by default."""
    if run.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if run.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if run.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3, foreach=True)
    raise UnsupportedWorkload(f"Optimizer '{run.optimizer}' is not supported.")


@contextlib.contextmanager
def _autocast(run: RunConfig) -> Iterator[None]:
    dtype = _AMP_DTYPES.get(run.precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type="cpu", dtype=dtype):
        yield


def _train_steps(
    rec: Recorder, built: BuiltWorkload, run: RunConfig, batch_size: int, seq_len: int | None
) -> None:
    model = built.model
    if run.checkpointing:
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if enable is None:
            raise UnsupportedWorkload("This model has no gradient checkpointing switch.")
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(run, params)
    for step in (0, 1):
        rec.step = step
        rec.phase = "setup"
        batch = built.make_batch(batch_size, seq_len)
        for leaf in torch.utils._pytree.tree_flatten(dict(batch))[0]:
            if isinstance(leaf, torch.Tensor):
                rec.mark(leaf, "input")
        rec.phase = "forward"
        with _autocast(run):
            loss = built.loss(model, batch)
        rec.end_forward()
        rec.phase = "backward"
        loss.backward()  # type: ignore[no-untyped-call]
        del loss, batch
        for p in params:
            if p.grad is not None:
                rec.mark(p.grad, "gradient")
        rec.phase = "optimizer"
        optimizer.step()
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    rec.mark(value, "optimizer")
        optimizer.zero_grad(set_to_none=True)


def _inference_steps(
    rec: Recorder, built: BuiltWorkload, run: RunConfig, batch_size: int, seq_len: int | None
) -> None:
    model = built.model
    model.eval()
    for step in (0, 1):
        rec.step = step
        rec.phase = "setup"
        batch = built.make_batch(batch_size, seq_len)
        rec.phase = "forward"
        with torch.no_grad(), _autocast(run):
            out = model(**{k: v for k, v in batch.items() if k != "labels"})
        rec.end_forward()
        del out, batch


def _attention_choice(rec: Recorder) -> str:
    """Which attention kernel the traced model used (on CUDA, SDPA would pick by GPU)."""
    names = sorted({op.name for op in rec.ops if op.kind == "attention"})
    if names:
        return f"sdpa ({', '.join(names)}; traced on the CPU)"
    return "none or eager (matmul + softmax)"


def trace_built(
    workload: WorkloadInfo, built: BuiltWorkload, run: RunConfig, *, fake: bool = True
) -> StepProfile:
    """Trace steps of an already built workload (``fake``: under the active fake mode)."""
    batch_size = run.batch_size or workload.default_batch_size
    seq_len = (run.seq_len or workload.default_seq_len) if workload.is_sequence_model else None
    started = time.perf_counter()
    rec = Recorder()
    with rec:
        for p in built.model.parameters():
            rec.mark(p, "parameter")
        for b in built.model.buffers():
            rec.mark(b, "buffer")
        if run.mode == "train":
            _train_steps(rec, built, run, batch_size, seq_len)
        else:
            _inference_steps(rec, built, run, batch_size, seq_len)
    params = list(built.model.parameters())
    resolved = run.model_copy(update={"batch_size": batch_size, "seq_len": seq_len})
    return StepProfile(
        workload=workload.name,
        run=resolved,
        batch_size=batch_size,
        seq_len=seq_len,
        units_per_step=batch_size * built.units_per_sample(seq_len),
        throughput_unit=workload.throughput_unit,
        params_total=sum(p.numel() for p in params),
        params_trainable=sum(p.numel() for p in params if p.requires_grad),
        ops=tuple(rec.ops),
        events=tuple(rec.events()),
        choices={
            "optimizer_impl": "foreach" if run.mode == "train" else "none",
            "autocast": f"cpu rules, {run.precision}" if run.precision in _AMP_DTYPES else "off",
            "attention": _attention_choice(rec),
            "tensors": "fake" if fake else "real (cpu)",
        },
        trace_seconds=time.perf_counter() - started,
        torch_version=torch.__version__,
    )


def trace_step(workload: Workload, run: RunConfig, *, fake: bool = True) -> StepProfile:
    """Build ``workload`` for ``run`` and trace its step; ``fake=False`` runs it for real."""
    check_supported(run)
    context: Any
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        context = FakeTensorMode(allow_non_fake_inputs=False)
    else:
        context = contextlib.nullcontext()
    with context:
        built = workload.build(run)
        return trace_built(workload.info, built, run, fake=fake)
