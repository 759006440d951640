"""The bench harness: search, timing rule, child processes, aggregation, environment, and real
runs on the CPU (and, where there is one, a GPU).

Most of the harness is exercised on the simulated ``FakeDevice`` (memory and step time are
formulas, failures come on request), in real child processes; the CPU runs build a small
``--model`` and check the harness against the step run in this process.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import run_cli
from whichgpu.bench import (
    BenchOptions,
    CpuDevice,
    FakeDevice,
    TimingRule,
    WorkloadRef,
    probe,
    run_bench,
)
from whichgpu.bench.devices import StepOutOfMemory
from whichgpu.bench.distributed import AGGREGATION_RULES, aggregate
from whichgpu.bench.environment import capture
from whichgpu.bench.jobs import MeasureJob, Measurement, PrecisionState, ProbeJob, StepSpec
from whichgpu.bench.nvml import PowerSummary
from whichgpu.bench.probe import (
    NVML_CUDA_CHECK,
    Crashed,
    Failed,
    OutOfMemory,
    Ran,
    TimedOut,
    prepare,
    run_in_child,
    start_method,
)
from whichgpu.bench.runner import inspect
from whichgpu.bench.search import Verdict, search_largest
from whichgpu.bench.timing import Timing, interquartile_range, is_steady, measure
from whichgpu.bench.worker import measure_task, probe_task
from whichgpu.errors import CudaForkPoisoned, UnsupportedWorkload, UsageError
from whichgpu.schema import BenchResult
from whichgpu.units import GIB, KIB, MIB
from whichgpu.workloads import run_config, select_workload

MLP = "tests/fixtures/user_model.py:build"
"""Linear(32, 64), ReLU, Linear(64, 10): a step takes milliseconds on the CPU."""
MLP_FLOPS_PER_SAMPLE = 2 * (2 * (32 * 64 + 64 * 10) + 64 * 10)
"""Forward GEMMs, their weight gradients, and the input gradient of the second layer."""
QUICK = TimingRule(min_iters=3, min_seconds=0.2)


@pytest.fixture(autouse=True, scope="module")
def _children_preload_torch() -> None:
    """Whichever test starts the first child, the fork server preloads torch for all."""
    prepare("cpu")


# --- search (pure) --------------------------------------------------------------------------


def fake_probe(device: FakeDevice, seq_len: int | None = None) -> Callable[[int], Verdict]:
    """The probe a search would get from ``device``, without child processes."""

    def probe(batch: int) -> Verdict:
        if (
            batch in device.oom_batches
            or device.memory_bytes(batch, seq_len) > device.capacity_bytes
        ):
            return Verdict(False, "out of memory")
        return Verdict(True, "ran")

    return probe


def fits(device: FakeDevice, seq_len: int | None = None) -> int:
    return (device.capacity_bytes - device.fixed_bytes) // (device.bytes_per_unit * (seq_len or 1))


@pytest.mark.parametrize("capacity_mib", [1, 2, 3, 5, 64, 100, 127, 128, 129, 1000, 4097])
def test_search_finds_the_exact_largest_batch(capacity_mib: int) -> None:
    device = FakeDevice(capacity_bytes=capacity_mib * MIB, fixed_bytes=0, bytes_per_unit=MIB)
    found = search_largest(fake_probe(device))
    assert found.largest == capacity_mib == fits(device)
    assert found.smallest_failure == capacity_mib + 1
    assert len(found.probes) <= 2 * capacity_mib.bit_length() + 2
    assert found.notes == ()


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=5000),
    fixed=st.integers(min_value=0, max_value=300),
    resolution=st.integers(min_value=1, max_value=64),
)
def test_search_to_a_resolution_returns_a_size_that_runs_within_it(
    capacity: int, fixed: int, resolution: int
) -> None:
    device = FakeDevice(
        capacity_bytes=(capacity + fixed) * KIB, fixed_bytes=fixed * KIB, bytes_per_unit=KIB
    )
    truth = fits(device)
    found = search_largest(fake_probe(device), resolution=resolution)
    assert found.largest is not None
    assert truth - resolution < found.largest <= truth
    assert fake_probe(device)(found.largest).runs
    ran = {p.size for p in found.probes if p.verdict.runs}
    assert found.largest == max(ran)


def test_search_guard_goes_past_a_failure_below_sizes_that_run() -> None:
    device = FakeDevice(
        capacity_bytes=100 * MIB, fixed_bytes=0, bytes_per_unit=MIB, oom_batches=frozenset({4})
    )
    found = search_largest(fake_probe(device))
    assert found.largest == 100
    assert any("non-monotonic" in note and "batch 4" in note for note in found.notes)


@settings(max_examples=80, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=5000),
    fixed=st.integers(min_value=0, max_value=300),
    guess=st.integers(min_value=1, max_value=12000),
    resolution=st.integers(min_value=1, max_value=16),
)
def test_search_from_a_guess_finds_what_doubling_finds(
    capacity: int, fixed: int, guess: int, resolution: int
) -> None:
    device = FakeDevice(
        capacity_bytes=(capacity + fixed) * KIB, fixed_bytes=fixed * KIB, bytes_per_unit=KIB
    )
    truth = fits(device)
    found = search_largest(fake_probe(device), resolution=resolution, guess=guess)
    assert found.largest is not None and found.guess == guess
    assert truth - resolution < found.largest <= truth
    assert found.smallest_failure is not None and found.smallest_failure > truth
    ran = {p.size for p in found.probes if p.verdict.runs}
    assert found.largest == max(ran)  # only a size seen to run is the answer
    assert found.probes[0].size == guess
    # galloping: about twice the doublings the guess's error needs, plus the guard
    error = abs(truth - guess) // resolution + 1
    assert len(found.probes) <= 2 * error.bit_length() + 3


@pytest.mark.parametrize(
    ("guess", "probed"),
    [
        (100, [100, 101, 202]),  # right: it runs, the next fails, the guard confirms
        (97, [97, 98, 100, 104, 208, 102, 101]),  # low: gallop up, then bisect
        (103, [103, 102, 100, 101]),  # high: gallop down, then bisect
    ],
)
def test_search_gallops_from_the_guess(guess: int, probed: list[int]) -> None:
    device = FakeDevice(capacity_bytes=100 * MIB, fixed_bytes=0, bytes_per_unit=MIB)
    found = search_largest(fake_probe(device), guess=guess)
    assert found.largest == 100 and found.smallest_failure == 101
    assert [p.size for p in found.probes] == probed


def test_search_from_a_guess_when_nothing_fits_or_all_fits() -> None:
    never = FakeDevice(capacity_bytes=GIB, fixed_bytes=2 * GIB)
    found = search_largest(fake_probe(never), guess=40)
    assert found.largest is None and found.smallest_failure == 1
    assert [p.size for p in found.probes] == [40, 39, 37, 33, 25, 9, 1]
    roomy = FakeDevice(capacity_bytes=GIB, fixed_bytes=0, bytes_per_unit=KIB)
    capped = search_largest(fake_probe(roomy), guess=5000, upper=64)
    assert capped.largest == 64 and capped.reached_upper and capped.guess == 64
    assert [p.size for p in capped.probes] == [64]


def test_search_batch_one_out_of_memory_does_not_fit() -> None:
    device = FakeDevice(capacity_bytes=GIB, fixed_bytes=2 * GIB)
    found = search_largest(fake_probe(device))
    assert found.largest is None
    assert found.smallest_failure == 1
    assert [p.size for p in found.probes] == [1]


def test_search_sequence_length_shrinks_then_bisects_and_stops_at_the_bound() -> None:
    device = FakeDevice(capacity_bytes=GIB, fixed_bytes=0, bytes_per_unit=KIB)
    batch = 8

    def probe(seq: int) -> Verdict:
        return Verdict(device.memory_bytes(batch, seq) <= device.capacity_bytes, "")

    shrunk = search_largest(probe, start=2**20, upper=2**21, what="seq_len")
    assert shrunk.largest == GIB // (KIB * batch)  # 131072 tokens
    grown = search_largest(probe, start=1024, upper=4096, what="seq_len")
    assert grown.largest == 4096 and grown.reached_upper and grown.smallest_failure is None


def test_search_takes_a_timeout_above_a_size_that_ran_as_the_limit() -> None:
    def probe(batch: int) -> Verdict:
        if batch >= 24:
            return Verdict(False, "timed out", unusual=True)
        return Verdict(True, "ran")

    found = search_largest(probe)
    assert found.largest == 23
    assert 64 not in {p.size for p in found.probes}  # no look-past after a timeout
    assert any("timed out; taken as the limit" in note for note in found.notes)


# --- timing (fake clock) ----------------------------------------------------------------------


class FakeClock:
    """Steps that take the given times, on a clock that only they move."""

    def __init__(self, times: Callable[[int], float]) -> None:
        self.now = 0.0
        self.steps = 0
        self.times = times

    def clock(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.times(self.steps)
        self.steps += 1


def test_warmup_ends_when_two_windows_agree_then_timing_runs_to_both_minimums() -> None:
    warm = [5.0, 1.0, 1.0, 1.0, 0.5]  # compile, then slow steps, then steady at 0.125
    fake = FakeClock(lambda i: warm[i] if i < len(warm) else 0.125)
    rule = TimingRule(min_iters=5, min_seconds=1.0)
    timing = measure(fake.step, lambda: None, rule, clock=fake.clock)
    assert timing.steady
    # after the first step: 1, 1, 1, .5, then .125: the windows (.5, .125, .125) and
    # (.125, .125, .125) agree at the fifth .125, the tenth step
    assert timing.warmup_iterations == 10
    assert timing.iterations == 8  # 1.0 s of 0.125 s steps, more than the 5 steps asked
    assert timing.median_s == 0.125 and timing.iqr_s == 0.0 and timing.measured_s == 1.0
    steady = FakeClock(lambda i: 0.125)
    many = measure(
        steady.step, lambda: None, TimingRule(min_iters=20, min_seconds=1.0), clock=steady.clock
    )
    assert many.iterations == 20


def test_warmup_stops_at_its_limits_and_never_cuts_the_first_step() -> None:
    alternating = FakeClock(lambda i: 1.0 if i % 2 else 2.0)  # never steady
    rule = TimingRule(min_iters=2, min_seconds=0.0, warmup_max_iters=12, warmup_max_s=1e9)
    timing = measure(alternating.step, lambda: None, rule, clock=alternating.clock)
    assert not timing.steady and timing.warmup_iterations == 12
    compile_first = FakeClock(lambda i: 1000.0 if i == 0 else (1.0 if i % 2 else 2.0))
    rule = TimingRule(min_iters=2, min_seconds=0.0, warmup_max_iters=100, warmup_max_s=5.0)
    timing = measure(compile_first.step, lambda: None, rule, clock=compile_first.clock)
    assert not timing.steady
    assert timing.warmup_iterations == 5  # 1000 s, then 1 + 2 + 1 + 2 >= 5 s after it


def test_timing_decides_on_the_agreed_step_time() -> None:
    own = FakeClock(lambda i: 0.125)
    rule = TimingRule(min_iters=1, min_seconds=1.0)
    timing = measure(own.step, lambda: None, rule, clock=own.clock, agree=lambda t: 2 * t)
    assert timing.iterations == 4  # the slowest rank's 0.25 s steps reach 1 s after 4
    assert timing.median_s == 0.125  # this rank's own times are kept


def test_statistics_and_steadiness() -> None:
    assert interquartile_range([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0
    assert interquartile_range([3.0]) == 0.0
    assert is_steady([9.0, 1.0, 1.0, 1.0, 1.02, 1.0, 1.01], window=3, tolerance=0.05)
    assert not is_steady([9.0, 1.0, 1.0, 1.0, 1.2, 1.2, 1.2], window=3, tolerance=0.05)
    assert not is_steady([1.0] * 6, window=3, tolerance=0.05)  # the first step never counts


# --- aggregation of ranks (pure) ------------------------------------------------------------


def measurement(
    rank: int, step_s: float, peak: int, power_w: float, energy_j: float
) -> Measurement:
    times = (step_s * 0.9, step_s, step_s, step_s * 1.1, step_s)
    return Measurement(
        rank=rank,
        timing=Timing(times_s=times, warmup_times_s=(1.0, 1.0), steady=True),
        warmup_extra=2,
        units_per_step=400,
        samples_per_step=4,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=peak + 10,
        memory_method="test",
        power=PowerSummary(samples=5, power_w=power_w, energy_j=energy_j, temperature_c=60 + rank),
        flops_per_step=1e9,
        flops_method="test",
        precision=PrecisionState(),
        compiled=False,
        channels_last=False,
    )


def test_aggregation_rules() -> None:
    ranks = [measurement(1, 0.2, 20, 150.0, 20.0), measurement(0, 0.1, 10, 100.0, 10.0)]
    combined = aggregate(ranks)
    assert combined.step_time_s == 0.2  # the slowest rank paces the step
    assert combined.throughput == pytest.approx(800 / 0.2)
    assert combined.step_time_iqr_s == pytest.approx(interquartile_range(ranks[0].timing.times_s))
    assert combined.peak_allocated_bytes == 20 and combined.peak_reserved_bytes == 30
    assert combined.power_w == 250.0 and combined.temperature_c == 61
    assert combined.energy_j_per_sample == pytest.approx(30.0 / (5 * 4 * 2))
    assert combined.warmup_iterations == 4 and combined.iterations == 5
    assert [r["rank"] for r in combined.per_rank] == [0.0, 1.0]
    assert combined.per_rank[1]["step_time_s"] == 0.2
    alone = aggregate(ranks[1:])
    assert alone.per_rank == () and alone.throughput == pytest.approx(400 / 0.1)
    assert len(AGGREGATION_RULES) == 5


# --- child processes ------------------------------------------------------------------------


def fake_spec(batch: int, workload: str = "resnet50") -> StepSpec:
    return StepSpec(WorkloadRef.of(workload), run_config(batch_size=batch), batch, None)


def test_a_probe_that_runs_or_runs_out_of_memory() -> None:
    device = FakeDevice(capacity_bytes=GIB, fixed_bytes=0, bytes_per_unit=MIB)
    ran = run_in_child(probe_task, ProbeJob(device, fake_spec(8)), timeout_s=60)
    assert isinstance(ran, Ran) and ran.value.peak_allocated_bytes == 8 * MIB
    oom = run_in_child(probe_task, ProbeJob(device, fake_spec(2048)), timeout_s=60)
    assert isinstance(oom, OutOfMemory) and "needs" in oom.detail


def test_a_hung_probe_times_out_within_the_timeout() -> None:
    started = time.monotonic()
    outcome = run_in_child(
        probe_task, ProbeJob(FakeDevice(hang_from_batch=1), fake_spec(4)), timeout_s=1.5
    )
    assert isinstance(outcome, TimedOut) and outcome.timeout_s == 1.5
    assert time.monotonic() - started < 1.5 + 5.0


@pytest.mark.parametrize(("signal_crash", "code"), [(False, 3), (True, -signal.SIGSEGV)])
def test_a_crashed_probe_is_an_outcome(signal_crash: bool, code: int) -> None:
    device = FakeDevice(crash_from_batch=1, crash_with_signal=signal_crash)
    outcome = run_in_child(probe_task, ProbeJob(device, fake_spec(4)), timeout_s=30)
    assert isinstance(outcome, Crashed) and outcome.exitcode == code
    if signal_crash:
        assert "SIGSEGV" in outcome.detail


def test_an_error_in_the_child_is_a_typed_failure() -> None:
    device = FakeDevice(fail_from_batch=1)
    outcome = run_in_child(probe_task, ProbeJob(device, fake_spec(4)), timeout_s=30)
    assert isinstance(outcome, Failed) and outcome.kind == "error"
    assert outcome.message.startswith("ValueError: simulated failure")
    assert "Traceback" in outcome.traceback
    unknown = run_in_child(probe_task, ProbeJob(device, fake_spec(4, "resnet-5O")), timeout_s=30)
    assert isinstance(unknown, Failed) and unknown.kind == "workload"


def poisoned_in_a_forked_child(job: int, report: object) -> tuple[str, int]:
    """A task that fails as a child forked from a CUDA-initialised server would: children of
    the fork server carry its NVML switch, spawned ones do not."""
    del report
    if os.environ.get(NVML_CUDA_CHECK) == "1":
        raise CudaForkPoisoned("simulated: CUDA initialised in the fork server")
    return ("spawned", job)


@pytest.mark.skipif(start_method() != "forkserver", reason="children are spawned here anyway")
def test_children_are_spawned_once_a_forked_one_finds_cuda_unusable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probe, "_spawn_only", False)  # restored after the test
    said: list[str] = []
    first = run_in_child(poisoned_in_a_forked_child, 1, timeout_s=60, on_progress=said.append)
    assert isinstance(first, Ran) and first.value == ("spawned", 1)
    assert [p.message for p in said] == ["simulated: CUDA initialised in the fork server"]
    assert probe._spawn_only  # and every later child of this process is spawned at once
    again = run_in_child(poisoned_in_a_forked_child, 2, timeout_s=60)
    assert isinstance(again, Ran) and again.value == ("spawned", 2)
    assert NVML_CUDA_CHECK not in os.environ  # the parent's environment is as it was


def test_progress_keeps_a_slow_child_alive() -> None:
    """The timeout is silence, not total time: 0.25 s steps under a 1 s timeout finish."""
    device = FakeDevice(step_base_s=0.25, step_per_unit_s=0.0)
    job = MeasureJob(device, fake_spec(1), TimingRule(min_iters=3, min_seconds=0.0, window=1))
    seen: list[str] = []
    started = time.monotonic()
    outcome = run_in_child(
        measure_task, job, timeout_s=1.0, on_progress=lambda e: seen.append(e.stage)
    )
    assert isinstance(outcome, Ran), outcome
    assert time.monotonic() - started > 1.0
    assert {"warmup", "timing"} <= set(seen)


# --- the runner on the simulated device ------------------------------------------------------


def test_bench_finds_the_largest_batch_and_measures_it() -> None:
    device = FakeDevice()  # 1 GiB fixed + 64 MiB per image
    options = BenchOptions(find_max_batch=True, memory_limit_bytes=4 * GIB, rule=QUICK)
    seen: list[str] = []
    stored: list[BenchResult] = []
    results = run_bench(
        WorkloadRef.of("resnet50"),
        run_config(precision="fp32"),
        device,
        options,
        progress=lambda e: seen.append(e.stage),
        on_result=stored.append,
    )
    assert stored == results and len(results) == 1
    result = results[0]
    assert result.max_batch_size == result.batch_size == 48  # (4 - 1) GiB / 64 MiB
    assert result.max_batch_resolution == 1 and result.memory_limit_bytes == 4 * GIB
    assert result.run.batch_size == 48 and result.workload == "resnet50"
    assert result.throughput_unit == "images/s" and result.device == "fake"
    assert result.step_time_s == pytest.approx(device.step_time_s(48, None), rel=0.5)
    assert result.throughput == pytest.approx(48 / result.step_time_s)
    assert result.iterations >= 3 and result.warmup_iterations >= 9
    assert result.peak_allocated_bytes == device.memory_bytes(48, None)
    assert result.environment.device_kind == "fake" and result.gpu is None
    assert any("doubling then bisection, exact" in n for n in result.notes)
    assert {"inspect", "search", "timing", "done"} <= set(seen)


@pytest.mark.parametrize(("guess", "verdict"), [(48, "exact (+0)"), (45, "conservative (-3)")])
def test_bench_starts_its_search_at_a_guess(guess: int, verdict: str) -> None:
    device = FakeDevice()  # 1 GiB fixed + 64 MiB per image: 48 fit in 4 GiB
    asked: list[int | None] = []

    def batch_guess(environment: object, seq_len: int | None) -> int:
        asked.append(seq_len)
        return guess

    options = BenchOptions(
        find_max_batch=True, memory_limit_bytes=4 * GIB, rule=QUICK, batch_guess=batch_guess
    )
    (result,) = run_bench(WorkloadRef.of("resnet50"), run_config(), device, options)
    assert result.max_batch_size == 48 and asked == [None]
    (note,) = [n for n in result.notes if n.startswith("largest batch")]
    assert f"galloping from whichgpu's predicted {guess}" in note
    assert f"the prediction was {verdict}" in note
    probes = int(note.split(" probes")[0].rsplit(" ", 1)[-1])
    assert probes <= 7  # doubling from 1 takes 13 here


def test_bench_without_a_usable_guess_doubles_from_one() -> None:
    options = BenchOptions(
        find_max_batch=True,
        memory_limit_bytes=4 * GIB,
        rule=QUICK,
        batch_guess=lambda environment, seq_len: 0,  # predicted not to fit at all
    )
    (result,) = run_bench(WorkloadRef.of("resnet50"), run_config(), FakeDevice(), options)
    assert result.max_batch_size == 48
    assert any("doubling then bisection, exact" in n for n in result.notes)


def test_the_api_guesses_the_largest_batch_from_a_stored_profile() -> None:
    from whichgpu.api import _batch_guesser, fit
    from whichgpu.estimate.memory import largest_live_batch
    from whichgpu.profiles.stored import load_stored
    from whichgpu.schema import BenchEnvironment
    from whichgpu.workloads import get_workload

    def env(kind: str, name: str) -> BenchEnvironment:
        return BenchEnvironment.model_construct(
            device_kind=kind, device_name=name, memory_total_bytes=150 * 10**9
        )

    fp32 = run_config(precision="fp32")
    on_cpu = _batch_guesser(get_workload("resnet50"), fp32, 2.0)
    assert on_cpu is not None
    profile = load_stored("resnet50", fp32)
    assert profile is not None
    assert on_cpu(env("cpu", "x86_64"), None) == largest_live_batch(profile, 2 * GIB, None)
    assert on_cpu(env("cuda", "NVIDIA H200"), None) is None  # a capped CUDA search: no guess
    gpt2 = run_config(precision="bf16", seq_len=1024)
    on_gpu = _batch_guesser(get_workload("gpt2"), gpt2, None)
    assert on_gpu is not None
    (expected,) = fit("gpt2", gpus=["h200-sxm"], precision="bf16", seq_len=512)
    assert on_gpu(env("cuda", "NVIDIA H200"), 512) == expected.max_batch_size > 0
    assert on_gpu(env("cuda", "Mystery GPU 9000"), 512) is None
    assert on_gpu(env("mps", "Apple M3"), 512) is None
    user = select_workload(None, None, model=MLP)
    assert _batch_guesser(user, fp32, 2.0) is None  # a user's model: no stored profile


def test_the_api_guesses_the_longest_sequence_from_a_stored_profile() -> None:
    from whichgpu.api import _seq_len_guesser, fit
    from whichgpu.estimate.memory import longest_live_seq
    from whichgpu.profiles.stored import load_stored
    from whichgpu.schema import BenchEnvironment
    from whichgpu.workloads import get_workload

    def env(kind: str, name: str) -> BenchEnvironment:
        return BenchEnvironment.model_construct(
            device_kind=kind, device_name=name, memory_total_bytes=150 * 10**9
        )

    bf16 = run_config(precision="bf16")
    on_gpu = _seq_len_guesser(get_workload("llama-3.2-1b"), bf16, None)
    assert on_gpu is not None
    (expected,) = fit("llama-3.2-1b", gpus=["h200-sxm"], batch_size=1, precision="bf16")
    assert on_gpu(env("cuda", "NVIDIA H200"), 1) == expected.max_seq_len
    assert expected.max_seq_len is not None and expected.max_seq_len > 4096
    fp32 = run_config(precision="fp32")
    on_cpu = _seq_len_guesser(get_workload("bert-base"), fp32, 3.0)
    assert on_cpu is not None
    profile = load_stored("bert-base", fp32)
    assert profile is not None
    longest = on_cpu(env("cpu", "x86_64"), 4)
    assert longest is not None and 1 <= longest < 512  # within BERT's position table
    assert profile.live_peak_bytes(4, longest) <= 3 * GIB < profile.live_peak_bytes(4, longest + 1)
    assert longest_live_seq(profile, 100 * GIB, 4, 512) == 512  # the table, not the memory


def test_bench_of_a_step_that_never_fits() -> None:
    device = FakeDevice(fixed_bytes=8 * GIB)
    options = BenchOptions(find_max_batch=True, memory_limit_bytes=4 * GIB, rule=QUICK)
    (result,) = run_bench(WorkloadRef.of("resnet50"), run_config(), device, options)
    assert result.throughput is None and result.step_time_s is None
    assert result.max_batch_size == 0 and result.batch_size == 1 and result.iterations == 0
    assert result.notes[-1].startswith("does not fit: batch 1 out of memory")


def test_bench_takes_a_crash_above_a_size_that_ran_as_the_limit() -> None:
    device = FakeDevice(crash_from_batch=11)
    options = BenchOptions(find_max_batch=True, rule=QUICK)
    (result,) = run_bench(WorkloadRef.of("resnet50"), run_config(), device, options)
    assert result.max_batch_size == 10
    assert any("crashed" in n and "taken as the limit" in n for n in result.notes)


def test_bench_finds_the_longest_sequence_at_a_batch() -> None:
    device = FakeDevice(capacity_bytes=GIB, fixed_bytes=0, bytes_per_unit=MIB)
    options = BenchOptions(find_max_seq_len=True, rule=QUICK)
    (result,) = run_bench(WorkloadRef.of("gpt2"), run_config(batch_size=2), device, options)
    assert result.max_seq_len == result.seq_len == 512  # 1 GiB / (2 x 1 MiB)
    assert result.run.seq_len == 512 and result.throughput_unit == "tokens/s"
    assert result.throughput == pytest.approx(2 * 512 / result.step_time_s)


def test_bench_starts_its_length_search_at_a_guess() -> None:
    device = FakeDevice(capacity_bytes=GIB, fixed_bytes=0, bytes_per_unit=MIB)
    asked: list[int] = []

    def seq_len_guess(environment: object, batch_size: int) -> int:
        asked.append(batch_size)
        return 500

    options = BenchOptions(find_max_seq_len=True, rule=QUICK, seq_len_guess=seq_len_guess)
    (result,) = run_bench(WorkloadRef.of("gpt2"), run_config(batch_size=2), device, options)
    assert result.max_seq_len == 512 and asked == [2]
    (note,) = [n for n in result.notes if n.startswith("largest seq_len")]
    assert "galloping from whichgpu's predicted 500" in note
    assert "the prediction was conservative (-12)" in note


def test_bench_is_repeatable_to_a_few_percent() -> None:
    device = FakeDevice(step_base_s=0.01, step_per_unit_s=0.0, noise=0.03)
    rule = TimingRule(min_iters=15, min_seconds=0.2)
    medians = [
        run_bench(
            WorkloadRef.of("resnet50"), run_config(batch_size=4), device, BenchOptions(rule=rule)
        )[0].step_time_s
        for _ in range(2)
    ]
    assert medians[0] == pytest.approx(medians[1], rel=0.05)


def test_bench_on_several_devices_aggregates_and_scales() -> None:
    results = run_bench(
        WorkloadRef.of("resnet50"),
        run_config(batch_size=8, gpus=2),
        FakeDevice(),
        BenchOptions(rule=QUICK),
    )
    one, two = results
    assert (one.n_gpus, two.n_gpus) == (1, 2) and one.run.gpus == 1 and two.run.gpus == 2
    assert len(two.per_rank) == 2 and one.per_rank == ()
    # the simulated device times its steps on its own clock: exact whatever the machine's load
    assert two.scaling_efficiency == pytest.approx(1.0, rel=1e-9)
    assert any("step time = the slowest rank's median" in n for n in two.notes)


def test_bench_refuses_options_that_cannot_work_together() -> None:
    fake, ref = FakeDevice(), WorkloadRef.of("resnet50")
    with pytest.raises(UsageError, match="not both"):
        run_bench(ref, run_config(batch_size=4), fake, BenchOptions(find_max_batch=True))
    with pytest.raises(UsageError, match="needs --memory-limit"):
        run_bench(ref, run_config(), CpuDevice(), BenchOptions(find_max_batch=True))
    with pytest.raises(UsageError, match="DDP"):
        run_bench(ref, run_config(gpus=2, sharding="zero3"), fake)


def test_a_missing_device_is_a_usage_error_with_advice() -> None:
    from whichgpu.bench.devices import CudaDevice

    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is present")
    except ImportError:
        pytest.skip("torch is not installed")
    with pytest.raises(UsageError, match="--device cpu"):
        inspect(CudaDevice())


# --- environment and real CPU runs ---------------------------------------------------------


def test_environment_capture_on_the_cpu() -> None:
    inspection = capture(CpuDevice())
    env = inspection.environment
    assert env.device_kind == "cpu" and env.device_name
    assert env.cpu_count == os.cpu_count() and env.host and env.python_version
    assert env.torch_version and "transformers" in env.libraries
    assert env.memory_total_bytes and env.memory_total_bytes > GIB
    assert env.driver_version is None and env.cuda_version is None and env.device_uuid is None


def test_a_real_cpu_bench_finds_the_exact_batch_under_the_limit() -> None:
    limit = 200 * KIB
    options = BenchOptions(find_max_batch=True, memory_limit_bytes=limit, rule=QUICK)
    (result,) = run_bench(
        WorkloadRef.of(model=MLP), run_config(precision="fp32"), CpuDevice(), options
    )
    batch = result.max_batch_size
    assert batch is not None and result.batch_size == batch and result.workload == MLP
    assert result.peak_allocated_bytes is not None and result.peak_allocated_bytes <= limit
    assert result.flops_per_step == MLP_FLOPS_PER_SAMPLE * batch
    assert result.throughput is not None and result.throughput > 0
    assert result.environment.device_kind == "cpu" and result.environment.amp_dtype is None
    assert any("live tensor" in n for n in result.notes)

    def steps(size: int) -> int | None:  # the same step in this process, under the same count
        spec = StepSpec(
            WorkloadRef.of(model=MLP),
            run_config(precision="fp32", batch_size=size),
            size,
            None,
            memory_limit_bytes=limit,
        )
        session = CpuDevice().open_session(spec, lambda event: None)
        try:
            return session.memory_steps(2).allocated_bytes
        except StepOutOfMemory:
            return None

    assert steps(batch) == result.peak_allocated_bytes
    assert steps(batch + 1) is None


def test_a_real_cpu_bench_serves_a_language_model_as_the_tracer_does() -> None:
    from whichgpu.estimate.profile_summary import live_peak
    from whichgpu.schema import BenchResult
    from whichgpu.trace import trace_step
    from whichgpu.workloads.user import config_workload

    config = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
    cli = run_cli(
        *("bench", "--config", str(config), "--device", "cpu", "--mode", "inference"),
        *("--context", "32", "--new-tokens", "4", "--concurrency", "3"),
        *("--min-seconds", "0.2", "--no-store", "--json"),
    )
    assert cli.returncode == 0, cli.stderr
    (row,) = json.loads(cli.stdout)
    result = BenchResult.model_validate({k: v for k, v in row.items() if k != "schema_version"})
    assert (result.batch_size, result.seq_len) == (3, 32)
    assert (result.run.context, result.run.new_tokens) == (32, 4)
    # a step is a whole request: 3 sequences x 4 generated tokens
    assert result.throughput is not None and result.step_time_s is not None
    assert result.throughput * result.step_time_s == pytest.approx(3 * 4)
    assert any("static KV cache" in n for n in result.notes)
    # measured eager (nothing compiled the model), and said so in the result and the output
    assert not result.compiled and any(n.startswith("eager: ") for n in result.notes)
    assert re.search(r"measured .*tiny-llama\.json on .+ at batch 3 \(eager\)", cli.stderr)
    # the same tensors as the traced prefill and decode step, to the byte
    traced = trace_step(config_workload(config), result.run, kernels="cpu")
    assert result.peak_allocated_bytes == live_peak(traced)[0]


TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"


def test_a_real_cpu_bench_runs_each_checkpointing_policy_as_the_tracer_does() -> None:
    from whichgpu.estimate.profile_summary import live_peak
    from whichgpu.trace import trace_step
    from whichgpu.workloads.user import config_workload

    peaks: dict[str, int] = {}
    for policy in ("none", "full", "every-2", "selective"):
        options = {} if policy == "none" else {"checkpointing_policy": policy}
        run = run_config(batch_size=2, seq_len=64, precision="fp32", **options)
        (result,) = run_bench(
            WorkloadRef.of(config=str(TINY_LLAMA)), run, CpuDevice(), BenchOptions(rule=QUICK)
        )
        assert result.run.checkpointing is (policy != "none")
        assert result.peak_allocated_bytes is not None
        peaks[policy] = result.peak_allocated_bytes
        traced = live_peak(trace_step(config_workload(TINY_LLAMA), result.run, kernels="cpu"))[0]
        assert result.peak_allocated_bytes == pytest.approx(traced, rel=0.03), policy
    # what each policy keeps: all (none) > a layer's inputs and matmul outputs > every
    # layer's input only (full); every-2 checkpoints one of the two layers
    assert peaks["none"] > peaks["every-2"] > peaks["full"]
    assert peaks["none"] > peaks["selective"] > peaks["full"]


def test_a_real_cpu_bench_of_fp8_training_converts_the_linear_layers() -> None:
    cli = run_cli(
        *("bench", "--config", str(TINY_LLAMA), "--device", "cpu", "--precision", "fp8"),
        *("--batch-size", "2", "--seq-len", "32", "--min-seconds", "0.2", "--no-store", "--json"),
    )
    assert cli.returncode == 0, cli.stderr
    (row,) = json.loads(cli.stdout)
    result = BenchResult.model_validate({k: v for k, v in row.items() if k != "schema_version"})
    assert result.run.precision == "fp8" and result.environment.amp_dtype == "bfloat16"
    # two layers x (q, k, v, o, gate, up, down); the output projection stays bf16
    assert any(
        n.startswith("fp8: 14 linear layers run torchao's Float8Linear") for n in result.notes
    )
    assert any("torchao emulates" in n for n in result.notes)
    assert any("fp8 without --compile" in n for n in result.notes)
    assert "torchao" in result.environment.libraries
    assert "Failed to load" not in cli.stderr and "register_constant" not in cli.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--mode", "inference"), "serving in fp8 is --quantization fp8 in predict"),
        (("--method", "lora"), "not of --method lora's adapters"),
    ],
)
def test_bench_refuses_fp8_it_cannot_measure(options: tuple[str, ...], message: str) -> None:
    cli = run_cli(
        *("bench", "--config", str(TINY_LLAMA), "--device", "cpu", "--precision", "fp8"),
        *options,
        "--no-store",
    )
    assert cli.returncode == 2 and message in cli.stderr and "Traceback" not in cli.stderr


def test_a_real_two_process_cpu_run(tmp_path: Path) -> None:
    results = run_bench(
        WorkloadRef.of(model="tests/fixtures/user_model.py:build_sequence"),
        run_config(precision="fp32", batch_size=16, gpus=2),
        CpuDevice(),
        BenchOptions(rule=QUICK, timeout_s=120),  # a deadlocked rank fails in minutes
    )
    _, two = results
    assert two.n_gpus == 2 and len(two.per_rank) == 2
    assert two.scaling_efficiency is not None and two.throughput is not None
    assert {r["units_per_step"] for r in two.per_rank} == {16 * 16}


# --- the API ------------------------------------------------------------------------------


def test_api_bench_fills_catalog_gpu_and_mfu() -> None:
    from whichgpu.api import _bench_on_catalog, bench
    from whichgpu.catalog import load_catalog
    from whichgpu.estimate.throughput import gpu_rates, peak_flops_per_s

    (result,) = bench("resnet50", device="fake", batch_size=4, min_seconds=0.1, min_iters=2)
    assert result.gpu is None and result.mfu is None
    assert any("not a CUDA GPU" in n for n in result.notes)
    as_gpu = result.model_copy(
        update={
            "device_name": "NVIDIA H200",
            "flops_per_step": 1e12,
            "step_time_s": 0.01,
            "environment": result.environment.model_copy(update={"device_kind": "cuda"}),
        }
    )
    filled = _bench_on_catalog(as_gpu)
    peak = peak_flops_per_s(gpu_rates(load_catalog().get("h200-sxm")), "bf16")
    assert filled.gpu == "h200-sxm"
    assert filled.mfu == pytest.approx(1e12 / 0.01 / peak)
    unknown = _bench_on_catalog(as_gpu.model_copy(update={"device_name": "Mystery GPU 9000"}))
    assert unknown.gpu is None and unknown.mfu is None
    assert any("not in the catalog" in n for n in unknown.notes)
    assert result.created_at.tzinfo is dt.timezone.utc


def test_bench_modules_import_without_torch() -> None:
    program = (
        "import sys; sys.modules['torch'] = None\n"
        "import whichgpu.bench, whichgpu.bench.runner, whichgpu.bench.worker, whichgpu.cli.bench\n"
        "from whichgpu.cli import main\n"
        "assert main(['bench', '--help']) == 0\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


# --- GPUs (skipped without CUDA) --------------------------------------------------------------


@pytest.mark.gpu
def test_a_real_gpu_bench() -> None:
    from whichgpu.bench import CudaDevice

    options = BenchOptions(
        find_max_batch=True, memory_limit_bytes=GIB // 4, rule=QUICK, max_batch_resolution=64
    )
    (result,) = run_bench(
        WorkloadRef.of(model=MLP), run_config(precision="tf32"), CudaDevice(), options
    )
    env = result.environment
    assert env.device_kind == "cuda" and env.cuda_version and env.driver_version
    assert env.device_uuid and env.device_uuid.startswith("GPU-")
    assert env.tf32_matmul is True and env.tf32_cudnn is True
    assert result.peak_reserved_bytes is not None and result.peak_reserved_bytes <= GIB // 4
    assert result.flops_per_step and result.throughput


@pytest.mark.gpu
def test_a_gpu_out_of_memory_is_typed() -> None:
    from whichgpu.bench import CudaDevice

    spec = StepSpec(
        WorkloadRef.of(model=MLP),
        run_config(precision="fp32", batch_size=1 << 16),
        1 << 16,
        None,
        memory_limit_bytes=MIB,
    )
    outcome = run_in_child(probe_task, ProbeJob(CudaDevice(), spec), timeout_s=120)
    assert isinstance(outcome, OutOfMemory)


@pytest.mark.multigpu
def test_a_real_two_gpu_run() -> None:
    from whichgpu.bench import CudaDevice

    _, two = run_bench(
        WorkloadRef.of(model=MLP),
        run_config(batch_size=256, gpus=2),
        CudaDevice(),
        BenchOptions(rule=QUICK),
    )
    assert two.n_gpus == 2 and two.scaling_efficiency is not None
    assert two.environment.interconnect


def test_seq_len_search_of_a_model_without_one_says_how_to_declare_it() -> None:
    fixture = Path(__file__).parents[1] / "fixtures" / "user_model.py"
    options = BenchOptions(find_max_seq_len=True, rule=QUICK)
    target = WorkloadRef.of(model=f"{fixture}:build")
    with pytest.raises(UnsupportedWorkload, match=r"declares no sequence length.*@model_defaults"):
        run_bench(target, run_config(batch_size=2), FakeDevice(), options)
    with pytest.raises(UnsupportedWorkload, match="takes fixed-size 3x224x224 image inputs"):
        run_bench(WorkloadRef.of("resnet50"), run_config(batch_size=2), FakeDevice(), options)


def test_inference_on_several_gpus_is_refused_before_anything_runs() -> None:
    device = FakeDevice()
    run = run_config(mode="inference", gpus=2, context=64, new_tokens=4)
    with pytest.raises(UsageError, match="tensor parallel over them is not measured"):
        run_bench(WorkloadRef.of("gpt2"), run, device, BenchOptions(rule=QUICK))


def test_the_bench_tells_variants_that_share_an_nvml_name_apart_by_memory() -> None:
    from whichgpu.catalog import load_catalog
    from whichgpu.units import bytes_to_gb

    catalog = load_catalog([])
    for mib, expected in ((10_014.72, "rtx-3080-10gb"), (12_288, "rtx-3080-12gb")):
        device = FakeDevice(name="NVIDIA GeForce RTX 3080", capacity_bytes=int(mib * 2**20))
        env = capture(device).environment
        assert env.memory_total_bytes is not None
        # as api.bench maps a device to its catalog GPU: its name and its total memory
        gpu = catalog.resolve(env.device_name, memory_gb=bytes_to_gb(env.memory_total_bytes))
        assert gpu.id == expected


def test_the_fake_devices_step_time_is_its_formula_not_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from whichgpu.bench.devices import fake as devices

    slept: list[float] = []
    real_sleep = time.sleep

    def overslept(seconds: float) -> None:  # a loaded machine wakes up late
        slept.append(seconds)
        real_sleep(seconds * 3)

    monkeypatch.setattr(devices.time, "sleep", overslept)
    fake = FakeDevice()
    spec = StepSpec(WorkloadRef.of("resnet50"), run_config(batch_size=8), 8, None)
    session = fake.open_session(spec, lambda _: None)
    timing = measure(session.step, session.synchronize, QUICK, clock=session.clock)
    assert slept
    assert timing.median_s == pytest.approx(fake.step_time_s(8, None), rel=1e-12)
