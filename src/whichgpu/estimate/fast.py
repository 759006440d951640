"""``fit --fast``: the memory estimate on a GPU from the closed form, without a trace.

The traced path (``whichgpu.estimate.memory``) replays a step's allocations through a model
of the caching allocator. This one answers from a Hugging Face config alone
(``whichgpu.estimate.closed_form``), for what the closed form covers, and needs neither
torch nor a stored profile:

1. The step's peak allocated bytes at the batch and length asked about: the closed form.
2. The allocator's peak reserved bytes: that times the fitted ``reserved_factor``
   (``closed_form.reserved_bytes``), plus the segments of the same cuBLAS workspaces the
   traced path replays (``memory.workspace_sizes``, ``memory.workspace_reserved_bytes``).
3. The same terms outside the allocator (``memory.outside_allocator``) and the same capacity
   (``memory.capacity_of``); the largest batch and sequence length by the same search
   (``memory.largest_within``).

The factor is the largest ratio seen on the stored profiles, so the answer errs high:
``validate closed-form`` prints by how much.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from whichgpu.catalog.query import Catalog
from whichgpu.errors import UnsupportedWorkload, UsageError
from whichgpu.estimate import closed_form as cf
from whichgpu.estimate.allocator import round_request
from whichgpu.estimate.attention import AttentionExtra, step_attention_extra
from whichgpu.estimate.memory import (
    MAX_BATCH_LIMIT,
    MAX_SEQ_LIMIT,
    capacity_of,
    largest_within,
    outside_allocator,
    workspace_reserved_bytes,
    workspace_sizes,
)
from whichgpu.schema import (
    GpuSpec,
    MemoryCategory,
    MemoryEstimate,
    OpRecord,
    RunConfig,
    SoftwareStack,
)

METHOD = "closed form (no trace): the step's peak allocated bytes from the model config"
"""``MemoryEstimate.method`` of every fast estimate (the workload's name follows it)."""

_CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")


_ATTENTION_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "bf16-pure": "bfloat16"}
"""The dtype attention runs in under each precision (fp32 otherwise)."""


def _attention_extra(
    shape: cf.TransformerShape, run: RunConfig, gpu: GpuSpec, batch: int, length: int
) -> AttentionExtra:
    """What the attention of ``shape``'s blocks needs on ``gpu`` beyond the fused kernel the
    closed form assumes: the calls as the tracer records them (causal without a mask for the
    language models, BERT with its padding mask), one forward and one backward per block.
    Nothing for the stand-ins whose closed form counts materialised scores."""
    if shape.materialised_attention:
        return AttentionExtra(0, 0, (), "")
    bert = shape.family == "bert"
    dims = (batch, shape.heads, shape.kv_heads, length, length, shape.head_dim)
    call = (*dims, int(not bert), int(bert))
    dtype = _ATTENTION_DTYPE.get(run.precision, "float32")
    ops = [
        OpRecord(
            name=f"aten._scaled_dot_product_flash_attention_for_cpu{suffix}",
            kind="attention",
            phase=phase,
            flops=0,
            bytes_read=0,
            bytes_written=0,
            dtype=dtype,
            attention=call,
        )
        for _ in range(shape.layers)
        for phase, suffix in (("forward", ""), ("backward", "_backward"))
    ]
    dropout = shape.family in ("gpt2", "bert")
    return step_attention_extra(gpu, ops, training=True, dropout=dropout)


def check_covered(config: Mapping[str, Any], run: RunConfig) -> None:
    """Raise ``UsageError`` with the reason when the closed form does not answer ``run`` of
    ``config``; the message points to the traced path."""
    try:
        shape = cf.parse_config(config)
        if shape.family != "bert" and not shape.architecture.endswith(_CAUSAL_HEADS):
            raise UnsupportedWorkload(
                f"The closed form covers causal language models of this family, not "
                f"{shape.architecture}."
            )
        if run.gpus != 1:
            raise UnsupportedWorkload("The closed form covers one GPU (--gpus 1) only.")
        if run.optimizer == "paged-adamw-8bit":
            raise UnsupportedWorkload(
                "The closed form does not cover --optimizer paged-adamw-8bit: its state in CUDA "
                "unified memory (outside the caching allocator) is sized from the traced step."
            )
        cf.estimate(config, run, 1, 1)
    except UnsupportedWorkload as exc:
        raise UsageError(f"--fast: {exc} Drop --fast to trace the step.") from exc


def fast_estimate_on_gpu(
    config: Mapping[str, Any],
    run: RunConfig,
    gpu: GpuSpec,
    catalog: Catalog,
    stack: SoftwareStack,
    *,
    workload: str,
    seq_limit: int | None = None,
    search_seq_len: bool = True,
) -> MemoryEstimate:
    """The memory estimate of a training step of ``config`` on ``gpu``, from the closed form.

    As ``memory.estimate_on_gpu``: with ``run.batch_size`` the figures are for that batch,
    the largest batch beside them and the largest sequence length at that batch (up to
    ``seq_limit``); without it the largest batch that fits is the headline. ``run.seq_len``
    must be set. Raises ``UsageError`` for what the closed form does not cover.
    """
    check_covered(config, run)
    seq_len = run.seq_len
    if seq_len is None:
        raise UsageError("A sequence length is needed for this workload (--seq-len).")
    coefficients = cf.load_coefficients()
    capacity = capacity_of(gpu, catalog)
    workspaces = workspace_sizes(gpu, stack, run.mode)
    workspace_bytes = workspace_reserved_bytes(workspaces)
    outside = outside_allocator(stack, gpus=run.gpus)
    outside_bytes = sum(outside.values())

    shape = cf.parse_config(config)

    def attention(batch: int, length: int) -> AttentionExtra:
        return _attention_extra(shape, run, gpu, batch, length)

    def reserved(batch: int, length: int) -> int:
        allocated = cf.estimate(config, run, batch, length).peak_allocated_bytes
        extra = attention(batch, length).total_bytes
        return cf.reserved_bytes(allocated) + workspace_bytes + extra

    max_batch, capped = largest_within(
        lambda batch: reserved(batch, seq_len), capacity.bytes - outside_bytes, MAX_BATCH_LIMIT
    )
    batch = run.batch_size or max(max_batch, 1)
    step = cf.estimate(config, run, batch, seq_len)
    kernels = attention(batch, seq_len)
    peak_reserved = (
        cf.reserved_bytes(step.peak_allocated_bytes) + workspace_bytes + kernels.total_bytes
    )
    total = peak_reserved + outside_bytes
    after_forward = step.peak_phase in ("forward_end", "backward_start")
    breakdown: dict[MemoryCategory, int] = {
        "weights": step.weights_bytes,
        "gradients": 0 if after_forward else step.gradients_bytes,
        "optimizer": step.optimizer_bytes,
        "activations": step.activations_bytes if after_forward else 0,
    }
    breakdown["temporaries"] = step.peak_allocated_bytes - sum(breakdown.values())
    breakdown["overhead"] = total - step.peak_allocated_bytes
    workspace_rounded = sum(round_request(w) for w in workspaces)
    overheads = {
        **outside,
        "cublas_workspaces": workspace_rounded,
        "allocator_rounding_and_cache": peak_reserved
        - step.peak_allocated_bytes
        - workspace_rounded
        - kernels.total_bytes,
        **({"attention_kernels": kernels.total_bytes} if kernels.total_bytes else {}),
    }
    next_total = None if capped or max_batch == 0 else reserved(max_batch + 1, seq_len)
    max_seq: tuple[int, bool] | None = None
    if search_seq_len and run.batch_size is not None:
        max_seq = largest_within(
            lambda length: reserved(batch, length) + outside_bytes,
            capacity.bytes,
            seq_limit or MAX_SEQ_LIMIT,
            {seq_len: total},
        )
    return MemoryEstimate(
        gpu=gpu.id,
        gpu_name=gpu.name,
        workload=workload,
        run=run.model_copy(update={"batch_size": batch, "seq_len": seq_len}),
        batch_size=batch,
        seq_len=seq_len,
        fits=total <= capacity.bytes,
        max_batch_size=max_batch,
        max_batch_capped=capped,
        batch_given=run.batch_size is not None,
        gpus=run.gpus,
        sharding=run.sharding,
        max_seq_len=max_seq[0] if max_seq else None,
        max_seq_len_capped=max_seq[1] if max_seq else False,
        peak_allocated_bytes=step.peak_allocated_bytes,
        peak_reserved_bytes=peak_reserved,
        device_total_bytes=total,
        capacity_bytes=capacity.bytes,
        capacity_note=capacity.note,
        headroom_bytes=capacity.bytes - total,
        next_batch_device_total_bytes=None if next_total is None else next_total + outside_bytes,
        breakdown=breakdown,
        overheads=overheads,
        assumptions=(
            f"software stack: {stack.label}",
            "one training process on the GPU, nothing else resident",
            f"peak allocated bytes from the closed form ({step.family} family, peak at "
            f"{step.peak_phase.replace('_', ' ')}), lifted by its safety fraction "
            f"{coefficients.safety_fraction:.1%}",
            f"peak reserved = {coefficients.reserved_factor:.3f} x allocated + the cuBLAS "
            f"workspaces' segments: the largest ratio on the stored profiles, so the answer "
            f"errs high ({coefficients.reserved_provenance})",
            "PyTorch caching allocator with default settings; its last-resort cache flush is "
            "not counted on",
            "`whichgpu validate closed-form` prints the error against the traced path",
            *(
                (
                    f"attention runs on {', '.join(kernels.backends)} on this GPU "
                    f"({kernels.reason}): {kernels.total_bytes / 2**30:.2f} GiB beyond the "
                    "fused kernel the closed form assumes are counted",
                )
                if kernels.total_bytes
                else ()
            ),
        ),
        method=METHOD,
    )
