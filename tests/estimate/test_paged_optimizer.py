"""Paged 8-bit AdamW (``--optimizer paged-adamw-8bit``, ``whichgpu.estimate.paged``): its large
states in CUDA unified memory, outside the caching allocator's replay and the device total;
the part that does not fit beside the step paged over PCIe each optimizer step."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit
from whichgpu.api.step import ask, predictor
from whichgpu.catalog import load_catalog
from whichgpu.errors import UsageError
from whichgpu.estimate.paged import paged_out_bytes, paging_seconds, pcie_bytes_per_s
from whichgpu.estimate.throughput import gpu_rates
from whichgpu.units import GIB
from whichgpu.workloads.registry import get_workload
from whichgpu.workloads.run_config import run_config

GPU = "rtx-4090"
SEQ = 256


def _fit(optimizer: str, **extra: object):  # type: ignore[no-untyped-def]
    return fit("gpt2", gpus=[GPU], optimizer=optimizer, seq_len=SEQ, **extra)[0]


def test_state_outside_the_device_total() -> None:
    plain, paged = _fit("adamw-8bit", batch_size=4), _fit("paged-adamw-8bit", batch_size=4)
    assert plain.paged_state_bytes == 0 and paged.paged_state_bytes > 0
    # the same state: what adamw-8bit holds on the device is what the paged one splits into
    # unified memory (large parameters' uint8 states) and the device (absmax, small ones)
    assert paged.paged_state_bytes + paged.breakdown["optimizer"] == plain.breakdown["optimizer"]
    assert paged.paged_state_bytes == pytest.approx(plain.breakdown["optimizer"], rel=0.03)
    assert sum(paged.breakdown.values()) == paged.device_total_bytes
    assert paged.device_total_bytes < plain.device_total_bytes
    assert paged.paged_out_bytes == 0  # a 24 GB card has room for gpt2's state
    assert any("unified memory" in a for a in paged.assumptions)
    # ZeRO-1 splits the optimizer state over the GPUs as ZeRO-2 does, the paged part too
    for sharding in ("zero1", "zero2"):
        split = _fit("paged-adamw-8bit", batch_size=4, gpu_count=4, sharding=sharding)
        assert split.paged_state_bytes == pytest.approx(paged.paged_state_bytes / 4, rel=0.01)


def test_largest_batch_at_least_adamw_8bit() -> None:
    plain, paged = _fit("adamw-8bit"), _fit("paged-adamw-8bit")
    assert paged.max_batch_size >= plain.max_batch_size
    assert paged.fits
    assert paged.paged_out_bytes == paged_out_bytes(paged.paged_state_bytes, paged.headroom_bytes)


def test_paged_out_when_no_room() -> None:
    too_big = _fit("paged-adamw-8bit", batch_size=4096)
    assert not too_big.fits and too_big.headroom_bytes < 0
    assert too_big.paged_out_bytes == too_big.paged_state_bytes > 0
    assert paged_out_bytes(3 * GIB, GIB) == 2 * GIB
    assert paged_out_bytes(GIB, 2 * GIB) == 0
    assert paged_out_bytes(GIB, -GIB) == GIB


def test_pcie_time_added_to_the_optimizer_phase() -> None:
    gpu = load_catalog().get(GPU)
    rate = pcie_bytes_per_s(gpu)
    assert rate == pytest.approx(1.969e9 * (gpu.pcie_lanes or 16))  # PCIe 4.0
    assert paging_seconds(0, gpu) == 0.0
    assert paging_seconds(GIB, gpu) == pytest.approx(2 * GIB / (0.5 * rate))  # half the link
    assert paging_seconds(GIB, gpu.model_copy(update={"pcie_gen": None})) is None

    run = run_config(optimizer="paged-adamw-8bit", seq_len=SEQ, batch_size=4)
    asked = ask(get_workload("gpt2"), run, gpus=[GPU], stack=None, config=None, progress=None)
    memory = _fit("paged-adamw-8bit", batch_size=4)
    timer = predictor(asked.chosen, asked.step)
    rates = gpu_rates(gpu, asked.software)
    resident = timer.on_gpu(gpu, rates, memory)
    paged = timer.on_gpu(gpu, rates, memory.model_copy(update={"paged_out_bytes": GIB}))
    assert resident.step_time_s is not None and paged.step_time_s is not None
    assert paged.step_time_s - resident.step_time_s == pytest.approx(2 * GIB / (0.5 * rate))
    assert paged.time_shares["paging"] > 0 and "paging" not in resident.time_shares
    assert any("crosses PCIe" in a and "fast side" in a for a in paged.assumptions)


def test_refused_off_nvidia() -> None:
    with pytest.raises(UsageError, match="unified memory"):
        fit("gpt2", gpus=["mi300x"], optimizer="paged-adamw-8bit", seq_len=SEQ, batch_size=1)
    both = fit("gpt2", gpus=[GPU, "mi300x"], optimizer="paged-adamw-8bit", seq_len=SEQ)
    assert [e.gpu for e in both] == [GPU]
    assert any("is left out" in n and "unified memory" in n for n in both.notes)


def test_optimizer_impl_and_fast_refused() -> None:
    with pytest.raises(UsageError, match="bitsandbytes' own kernels"):
        fit("gpt2", gpus=[GPU], optimizer="paged-adamw-8bit", optimizer_impl="fused")


def test_cli_fit_json() -> None:
    done = run_cli("fit", "gpt2", "--optimizer", "paged-adamw-8bit", "--gpu", GPU, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)[0]
    assert answer["run"]["optimizer"] == "paged-adamw-8bit"
    assert answer["paged_state_bytes"] > 0
    assert answer["fits"]
