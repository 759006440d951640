"""``whichgpu bench`` as a user runs it: a real CPU bench stored and listed, errors as one
paragraph, and a bench stopped by Ctrl-C or killed outright leaving a readable store."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from whichgpu.schema import BenchResult
from whichgpu.store import ResultStore

MLP = "tests/fixtures/user_model.py:build"


def test_bench_on_the_cpu_finds_the_batch_measures_stores_and_lists() -> None:
    bench = run_cli(
        "bench",
        "--model",
        MLP,
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--find-max-batch",
        "--max-batch-resolution",
        "16",
        "--memory-limit",
        "0.0002",
        "--min-seconds",
        "0.5",
        "--min-iters",
        "3",
        "--json",
    )
    assert bench.returncode == 0, bench.stderr
    (doc,) = json.loads(bench.stdout)
    result = BenchResult.model_validate({k: v for k, v in doc.items() if k != "schema_version"})
    assert result.max_batch_size is not None and result.max_batch_size > 100
    assert result.max_batch_resolution == 16
    assert result.batch_size == result.max_batch_size and result.throughput
    assert result.memory_limit_bytes == int(0.0002 * 2**30)
    # stdout is the JSON alone; the progress went to stderr as plain lines (not a terminal)
    lines = bench.stderr.splitlines()
    assert lines and all(re.match(r"\[ *\d+\.\d s\] ", line) for line in lines), lines
    text = bench.stderr
    assert f"{MLP}: batch 1: probing" in text
    assert re.search(rf"{MLP}: batch 1: ran, peak .+ \(\d+\.\d s\)", text)
    assert re.search(r": batch \d+: out of memory \(live tensors reached", text)
    assert "timed step 1" in text and "counting FLOPs of one step" in text
    assert re.search(
        rf"measured {MLP} on .+: [\d,.]+ samples/s at batch {result.batch_size} \(eager\); "
        rf"median step [\d.e-]+ s over {result.iterations} timed steps",
        text,
    )
    listed = run_cli("results", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [d["id"] for d in json.loads(listed.stdout)] == [result.id]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["resnet50", "--batch-size", "8", "--find-max-batch"], "not both"),
        (["gpt2", "--mode", "inference", "--concurrency", "4", "--find-max-batch"], "not both"),
        (["resnet50", "--mode", "inference", "--context", "64"], "not a language model"),
        (["resnet50", "--device", "cpu", "--find-max-batch"], "needs --memory-limit"),
        (["resnet-5O", "--device", "cpu"], "Unknown workload 'resnet-5O'"),
        (["resnet50", "--device", "tpu"], "expected cuda, cuda:N, cpu or mps"),
        (["resnet50", "--no-store", "--store", "x.sqlite"], "not both"),
        (["resnet50", "--suite", "modren"], "expected one of lambda2020, modern"),
        ([], "Name the workloads to measure"),
    ],
)
def test_bench_usage_errors_are_one_paragraph(args: list[str], expected: str) -> None:
    result = run_cli("bench", *args)
    assert result.returncode == 2, result.stderr
    assert expected in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def test_the_suites_name_registered_workloads() -> None:
    from whichgpu.cli.bench import suites
    from whichgpu.workloads import get_workload

    found = suites()
    assert len(found["lambda2020"]) == 12
    for entries in found.values():
        for entry in entries:
            assert get_workload(entry.workload).info.name == entry.workload


def _start(store: Path, *workloads: str) -> subprocess.Popen[str]:
    """A bench of ``workloads`` on the simulated device, in its own process group. Each
    workload times its steps for 4 s, so that a signal sent when the first result is stored
    reaches the bench while the next one is still being measured, however busy the machine
    (at 1 s, a loaded CI host let the whole bench finish before the signal)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "whichgpu",
            "bench",
            *workloads,
            "--device",
            "fake",
            "--batch-size",
            "8",
            "--min-seconds",
            "4",
            "--min-iters",
            "3",
            "--store",
            str(store),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_results(store: Path, process: subprocess.Popen[str], count: int) -> None:
    deadline = time.monotonic() + 90
    while len(ResultStore(store).list()) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no result was stored in time"
        time.sleep(0.2)


def _group_gone(group: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture
def ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """Children start with Ctrl-C at its default, as a terminal's foreground command does. A
    shell starts a background job with SIGINT ignored, and a child inherits that (Python
    then installs no KeyboardInterrupt handler), so the test must not depend on how the test
    run itself was started."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_as_in_a_terminal")
def test_ctrl_c_stops_cleanly_and_keeps_what_finished(tmp_path: Path) -> None:
    store = tmp_path / "results.sqlite"
    process = _start(store, "resnet50", "vit-b-16", "bert-base")
    _wait_for_results(store, process, 1)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Interrupted" in err and "Traceback" not in err
    kept = ResultStore(store).list()
    assert 1 <= len(kept) < 3
    printed = json.loads(out)  # the finished results are printed
    assert [d["id"] for d in printed] == [r.id for r in reversed(kept)]
    assert _group_gone(process.pid), "child processes outlived the bench"


def test_a_killed_bench_leaves_a_readable_store(tmp_path: Path) -> None:
    """SIGKILL to the bench mid-run: the store holds what finished, and the bench's child
    processes notice their parent is gone and exit."""
    store = tmp_path / "results.sqlite"
    process = _start(store, "resnet50", "vit-b-16", "bert-base")
    _wait_for_results(store, process, 1)
    process.kill()
    process.communicate(timeout=60)
    kept = ResultStore(store).list()  # each one is validated as it is read
    assert 1 <= len(kept) < 3 and all(isinstance(r, BenchResult) for r in kept)
    with sqlite3.connect(store) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert _group_gone(process.pid), "child processes outlived the bench"


def test_a_workload_named_and_in_the_suite_is_measured_once() -> None:
    from whichgpu.cli.bench import SuiteEntry, _entries

    entries = _entries(["resnet50"], "modern", None, None)
    assert entries.count(SuiteEntry("resnet50")) == 1 and entries[0] == SuiteEntry("resnet50")


def test_plain_progress_shows_every_stage_and_a_heartbeat_while_steps_repeat() -> None:
    """Off a terminal each event is a line, but the per-step events of warm-up and timing,
    which come every step, only when their stage starts and then every HEARTBEAT_S."""
    from whichgpu.bench.jobs import BenchProgress
    from whichgpu.cli.bench import HEARTBEAT_S, _Lines

    now = [100.0]
    stream = io.StringIO()
    lines = _Lines(stream, clock=lambda: now[0])

    def event(stage: str, message: str, after_s: float) -> None:
        now[0] += after_s
        lines.update(BenchProgress(stage, message, workload="gpt2"))

    event("search", "batch 8: probing", 1.0)
    event("search", "batch 8: out of memory (12.0 s)", 12.0)
    event("warmup", "warm-up step 3", 1.0)
    event("warmup", "warm-up step 4", 1.0)  # repeated within the heartbeat: not shown
    event("timing", "timed step 1", 1.0)
    event("timing", "timed step 2", HEARTBEAT_S / 2)
    event("timing", "timed step 3", HEARTBEAT_S / 2 + 0.1)  # a heartbeat's worth later
    event("flops", "counting FLOPs of one step", 0.5)
    lines.print_error("bert-base: out of patience")
    assert stream.getvalue().splitlines() == [
        "[    1.0 s] gpt2: batch 8: probing",
        "[   13.0 s] gpt2: batch 8: out of memory (12.0 s)",
        "[   14.0 s] gpt2: warm-up step 3",
        "[   16.0 s] gpt2: timed step 1",
        f"[{16.0 + HEARTBEAT_S + 0.1:7.1f} s] gpt2: timed step 3",
        f"[{16.6 + HEARTBEAT_S:7.1f} s] gpt2: counting FLOPs of one step",
        f"[{16.6 + HEARTBEAT_S:7.1f} s] error: bert-base: out of patience",
    ]
