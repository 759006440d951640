"""Summaries of a traced step: FLOPs, bytes, operator mix, and the live-tensor peak.

Pure Python over a ``StepProfile``: works on stored profiles without torch.
"""

from __future__ import annotations

from collections import Counter

from whichgpu.schema import ProfileSummary, StepProfile, TensorCategory


def live_peak(profile: StepProfile) -> tuple[int, dict[TensorCategory, int]]:
    """Peak of live tensor bytes over the trace, and its breakdown by category at the peak."""
    live: Counter[TensorCategory] = Counter()
    total = peak = 0
    at_peak: dict[TensorCategory, int] = {}
    for event in profile.events:
        delta = event.size_bytes if event.alloc else -event.size_bytes
        live[event.category] += delta
        total += delta
        if total > peak:
            peak = total
            at_peak = {k: v for k, v in live.items() if v}
    return peak, at_peak


def summarize(profile: StepProfile) -> ProfileSummary:
    """The numbers ``whichgpu profile`` prints."""
    flops = profile.flops_per_step
    nbytes = profile.bytes_per_step
    by_kind_flops: Counter[str] = Counter()
    by_kind_bytes: Counter[str] = Counter()
    by_kind_count: Counter[str] = Counter()
    forward_flops = 0
    for op in profile.ops:
        by_kind_flops[op.kind] += op.flops
        by_kind_bytes[op.kind] += op.bytes_read + op.bytes_written
        by_kind_count[op.kind] += 1
        if op.phase == "forward":
            forward_flops += op.flops
    op_mix = {
        kind: {
            "flops_share": by_kind_flops[kind] / flops if flops else 0.0,
            "bytes_share": by_kind_bytes[kind] / nbytes if nbytes else 0.0,
            "count": float(by_kind_count[kind]),
        }
        for kind in sorted(by_kind_count, key=lambda k: -by_kind_flops[k])
    }
    peak, at_peak = live_peak(profile)
    return ProfileSummary(
        workload=profile.workload,
        batch_size=profile.batch_size,
        seq_len=profile.seq_len,
        params_total=profile.params_total,
        params_trainable=profile.params_trainable,
        flops_per_step=flops,
        flops_per_sample=flops / profile.batch_size,
        forward_flops_per_sample=forward_flops / profile.batch_size,
        bytes_per_step=nbytes,
        units_per_step=profile.units_per_step,
        throughput_unit=profile.throughput_unit,
        op_mix=op_mix,
        peak_live_bytes=peak,
        peak_live_by_category=dict(at_peak),
        choices=dict(profile.choices),
        trace_seconds=profile.trace_seconds,
    )
