"""The FLOPs of one bench step, for its MFU: counted over a real step, else from the trace.

A measured step's FLOPs are counted by running one eager step under torch's
``FlopCounterMode``, with whichgpu's formulas (``counter_formulas``) for the operators whose
formula torch lacks or gets wrong: the fused attention kernels, grouped-query attention
included (torch before 2.13 asserts when key and value have fewer heads than the query, as
every Llama 3, Qwen or Mistral model calls ``scaled_dot_product_attention`` with
``enable_gqa=True``; the work is that of attention with the query's head count), the CPU's
fused attention (absent from torch's table) and a grouped convolution's backward pass (torch
ignores ``groups`` in the weight gradient).

The count must never cost the measurement: when the counted step fails for any reason (a
formula that asserts on shapes it does not know, running out of memory under the counter),
the FLOPs are those of whichgpu's trace of the same step on fake tensors
(``whichgpu.trace.trace_step``), and when that fails too the result has no FLOPs and no MFU.
``FlopCount.method`` says which, and why, for the result's notes.

The shape formulas need no torch; ``counter_formulas`` and the counting import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from whichgpu.attention_flops import Shape, attention_backward_flops, attention_flops

if TYPE_CHECKING:
    from whichgpu.recipe.training import Kernels
    from whichgpu.schema import RunConfig, StepProfile
    from whichgpu.workloads.base import Workload

COUNTED = (
    "FLOPs: torch.utils.flop_counter over one eager step, with whichgpu's formulas for fused "
    "attention (grouped-query attention counted at the query's head count) and grouped "
    "convolutions' backward"
)
"""How a counted step's FLOPs were obtained (the result's note)."""


@dataclass(frozen=True)
class FlopCount:
    """The FLOPs of one step on one device, and how they were obtained."""

    flops_per_step: float | None
    """Model FLOPs of one step (None: they could not be counted; the result has no MFU)."""
    method: str
    """How they were obtained, or why there are none: one line for the result's notes."""


_ATTENTION = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_attention_math_for_mps",
)
"""The fused attention operators, all ``(query, key, value, ...)`` in ``(b, h, s, d)``
layout; each backward (``NAME_backward``, where torch has one) takes ``(grad_out, query, key,
value, ...)``. Those an installed torch lacks are skipped."""


def counter_formulas() -> dict[Any, Callable[..., int]]:
    """``FlopCounterMode``'s ``custom_mapping``: whichgpu's formulas for every fused attention
    operator of the installed torch (``attention_flops``, ``attention_backward_flops``) and
    for ``convolution_backward`` (each requested gradient costs what the forward does; torch
    ignores ``groups`` in the weight gradient). The counter calls them with shapes."""
    import torch

    aten = torch.ops.aten

    def forward(query: Shape, key: Shape, value: Shape, *args: Any, **kwargs: Any) -> int:
        return attention_flops(query, key, value)

    def backward(
        grad_out: Shape, query: Shape, key: Shape, value: Shape, *args: Any, **kwargs: Any
    ) -> int:
        return attention_backward_flops(grad_out, query, key, value)

    def conv_backward(grad_out: Shape, x: Shape, weight: Shape, *args: Any, **kwargs: Any) -> int:
        output_mask = args[7]
        per_gradient = 2 * math.prod(grad_out) * math.prod(weight[1:])
        return int(per_gradient * (int(bool(output_mask[0])) + int(bool(output_mask[1]))))

    formulas: dict[Any, Callable[..., int]] = {aten.convolution_backward: conv_backward}
    for name in _ATTENTION:
        if hasattr(aten, name):
            formulas[getattr(aten, name)] = forward
        if hasattr(aten, f"{name}_backward"):
            formulas[getattr(aten, f"{name}_backward")] = backward
    return formulas


def count_flops(step: Callable[[], None]) -> int:
    """FLOPs of ``step()``, run under torch's FLOP counter with ``counter_formulas``."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=counter_formulas())
    with counter:
        step()
    return int(counter.get_total_flops())


def traced_flops(
    workload: Workload, run: RunConfig, kernels: Kernels, new_tokens: int | None
) -> int:
    """FLOPs of the bench's step from whichgpu's trace of it on fake tensors (no memory of
    the device is used). A served request (``new_tokens`` not None) is the traced prefill
    and ``new_tokens`` decode steps (the trace records one: with a static cache every
    decode step has the same shapes); anything else is the traced step's total."""
    from whichgpu.trace import trace_step

    return step_flops(trace_step(workload, run, kernels=kernels), new_tokens)


def step_flops(profile: StepProfile, new_tokens: int | None) -> int:
    """The FLOPs of a bench step in ``profile`` (see ``traced_flops``)."""
    if new_tokens is None:
        return int(profile.flops_per_step)
    prefill = sum(op.flops for op in profile.ops if op.phase == "prefill")
    decode = sum(op.flops for op in profile.ops if op.phase == "decode")
    return int(prefill + new_tokens * decode)


def flop_count(
    count: Callable[[], int], trace: Callable[[], int], report: Callable[[str], None]
) -> FlopCount:
    """The step's FLOPs: ``count()``'s (``COUNTED``); if it raises, ``trace()``'s; if that
    raises too, none. ``report`` hears what is being done (progress for a person)."""
    try:
        return FlopCount(float(count()), COUNTED)
    except Exception as exc:
        counter_error = _describe(exc)
    report(f"the FLOP counter failed ({counter_error}); taking the FLOPs from the trace")
    try:
        flops = trace()
    except Exception as exc:
        return FlopCount(
            None,
            f"FLOPs: not counted, so no MFU: torch's FLOP counter failed over one eager step "
            f"({counter_error}) and so did whichgpu's trace of the step ({_describe(exc)}); "
            "the measurement itself is unaffected",
        )
    return FlopCount(
        float(flops),
        f"FLOPs: whichgpu's trace of the step on fake tensors, because torch's FLOP counter "
        f"failed over one eager step ({counter_error}); the measurement itself is unaffected",
    )


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
