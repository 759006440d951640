"""bf16 batch norm's latency-bound per-channel loops in the speed model (``estimate.throughput``).

PyTorch runs batch norm on a bf16 input with its own kernels, which loop over each channel in
one block (measured on an H200: 30 of ResNet-50's 55 ms step). The tracer records each batch
norm's (N, C, H·W); the model times the loop from it; fp16 under AMP (cuDNN) is not affected.
"""

from __future__ import annotations

import numpy as np
import pytest

from whichgpu.catalog import load_catalog
from whichgpu.estimate.throughput import (
    NATIVE_BATCH_NORM_PASSES,
    SerialWork,
    batch_norm_serial_s,
    gpu_rates,
    load_parameters,
    op_table,
    step_time,
)
from whichgpu.profiles.scalable import _decode_ops, _encode_ops
from whichgpu.profiles.stored import load_stored
from whichgpu.workloads import run_config


def _resnet() -> object:
    profile = load_stored("resnet50", run_config(precision="bf16"))
    assert profile is not None
    return profile


def test_the_stored_resnet_profile_records_every_batch_norms_shape() -> None:
    profile = _resnet()
    norms = [op for op in profile.ops if op.name in NATIVE_BATCH_NORM_PASSES]  # type: ignore[attr-defined]
    assert len(norms) == 106 and all(op.norm is not None for op in norms)
    values = profile.polynomials.values(128, None)  # type: ignore[attr-defined]
    stem = [int(values[i]) for i in norms[0].norm]
    assert stem == [128, 64, 112 * 112]  # the stem's batch norm at batch 128


def test_loop_time_is_rounds_times_waves_times_the_round() -> None:
    serial = SerialWork(
        rounds=np.array([1568.0, 98.0, 0.0]),
        blocks=np.array([64.0, 1024.0, 0.0]),
        then_streams=np.array([False, False, False]),
    )
    # 132 SMs hold 528 blocks of 512 threads: 1,024 channels take two waves
    seconds = batch_norm_serial_s(serial, 132, 6e-7)
    assert seconds == pytest.approx([1568 * 6e-7, 2 * 98 * 6e-7, 0.0])


def test_bf16_batch_norm_costs_its_loops_and_fp16_does_not() -> None:
    profile = _resnet()
    table = op_table(profile, 128, None)  # type: ignore[arg-type]
    assert table.serial is not None and int((table.serial.rounds > 0).sum()) == 106
    params = load_parameters()
    assert params.batch_norm_round_s == pytest.approx(6e-7)
    rates = gpu_rates(load_catalog().resolve("h200-sxm"))
    bf16 = step_time(table, rates, "bf16", params)
    fp16 = step_time(table, rates, "fp16", params)  # cuDNN: the bandwidth-bound model
    loops = float(batch_norm_serial_s(table.serial, rates.sm_count, 6e-7).sum())
    # the measured batch-norm time of this step on the H200 was 29.9 ms
    assert 0.025 < loops < 0.035
    assert bf16.step_time_s - fp16.step_time_s > 0.6 * loops


def test_profiles_stored_before_the_shape_was_recorded_still_load() -> None:
    profile = _resnet()
    doc = _encode_ops(profile.ops)  # type: ignore[attr-defined]
    assert any(len(row) == 11 for row in doc["rows"])
    old = {"strings": doc["strings"], "rows": [row[:10] for row in doc["rows"]]}
    ops = _decode_ops(old)
    assert all(op.norm is None for op in ops) and len(ops) == len(doc["rows"])
