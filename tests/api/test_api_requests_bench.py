"""``bench`` as a typed request: the keyword function answers what its ``BenchRequest``
answers (on the simulated ``fake`` device), and ``whichgpu bench`` builds the request the
keywords build."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from whichgpu.api import BenchRequest, RunOptions, Target, answer_bench, bench
from whichgpu.bench.probe import prepare
from whichgpu.cli import main
from whichgpu.errors import UnknownWorkload, UsageError
from whichgpu.schema import BenchResult
from whichgpu.tabular import ResultList

MEASURED_ANEW = {"id", "created_at"}
"""What two measurements of the same request differ in on the fake device."""


def _dump(result: BenchResult) -> dict[str, Any]:
    return result.model_dump(mode="json", exclude=MEASURED_ANEW)


def test_the_keyword_function_measures_what_its_request_measures_on_the_fake_device() -> None:
    prepare("cpu")  # the fork server the children start from, as the bench tests start it
    heard_by_keyword: list[BenchResult] = []
    by_keyword = bench(
        "resnet50",
        device="fake",
        batch_size=4,
        precision="fp32",
        min_seconds=0.1,
        min_iters=2,
        on_result=heard_by_keyword.append,
    )
    request = BenchRequest(
        Target("resnet50"),
        RunOptions(batch_size=4, precision="fp32"),
        device="fake",
        min_seconds=0.1,
        min_iters=2,
    )
    heard: list[BenchResult] = []
    answered = answer_bench(request, on_result=heard.append)
    assert len(answered) == len(by_keyword) == 1
    assert [_dump(r) for r in answered] == [_dump(r) for r in by_keyword]
    assert heard == list(answered) and heard_by_keyword == list(by_keyword)
    (result,) = answered
    assert (result.batch_size, result.run.precision, result.device) == (4, "fp32", "fake")
    assert any("not a CUDA GPU" in note for note in result.notes)  # filled in by the API


def test_the_workload_is_checked_before_the_run_options_it_does_not_take() -> None:
    with pytest.raises(UnknownWorkload):
        bench("resnet-5O", device="fake", lora_rank=8)
    with pytest.raises(UsageError) as caught:
        answer_bench(BenchRequest(Target("resnet50"), RunOptions(lora_rank=8), device="fake"))
    assert caught.value.field == "lora_rank"


def test_the_keyword_function_refuses_a_keyword_that_is_no_run_option() -> None:
    with pytest.raises(UsageError, match="bogus"):
        bench("resnet50", device="fake", bogus=1)


def test_the_timing_rule_is_checked_before_anything_runs() -> None:
    with pytest.raises(UsageError, match="--min-iters must be at least 1"):
        answer_bench(BenchRequest(Target("resnet50"), device="fake", min_iters=0))


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[BenchRequest]:
    """The requests ``whichgpu bench`` hands the API, which measures nothing."""
    requests: list[BenchRequest] = []

    def answer(request: BenchRequest, **_: Any) -> ResultList[BenchResult]:
        requests.append(request)
        return ResultList()

    monkeypatch.setattr("whichgpu.api.answer_bench", answer)
    return requests


def test_the_cli_builds_the_request_its_flags_say(asked: list[BenchRequest]) -> None:
    code = main(
        [
            "bench",
            "resnet50",
            "--device",
            "fake",
            "--gpus",
            "2",
            "--find-max-batch",
            "--max-batch-resolution",
            "4",
            "--find-max-seq-len",
            "--memory-limit",
            "8",
            "--compile",
            "--channels-last",
            "--min-seconds",
            "0.5",
            "--min-iters",
            "3",
            "--timeout",
            "30",
            "--precision",
            "fp16",
            "--no-store",
            "--json",
        ]
    )
    assert code == 0
    expected = BenchRequest(
        Target("resnet50"),
        RunOptions(precision="fp16", compile=True),  # --compile is the run's too
        gpu_count=2,
        device="fake",
        find_max_batch=True,
        max_batch_resolution=4,
        find_max_seq_len=True,
        memory_limit_gib=8.0,
        compile=True,
        channels_last=True,
        min_seconds=0.5,
        min_iters=3,
        timeout_s=30.0,
    )
    assert asked == [expected]
    defaults = BenchRequest(Target())
    unset = [
        f.name
        for f in fields(BenchRequest)
        if f.name not in ("target", "run")
        and getattr(expected, f.name) == getattr(defaults, f.name)
    ]
    assert unset == []  # every option of the request has a flag the builder reads


def test_the_cli_builds_the_request_of_the_users_own_model(asked: list[BenchRequest]) -> None:
    config = Path("tests/fixtures/tiny-llama.json")
    code = main(
        ["bench", "--config", str(config), "--task", "causal-lm", "--device", "fake", "--no-store"]
    )
    assert code == 0
    assert asked == [BenchRequest(Target(None, config, "causal-lm"), RunOptions(), device="fake")]


def test_a_suites_settings_apply_where_the_flags_give_none(asked: list[BenchRequest]) -> None:
    from whichgpu.cli.bench import suites

    entries = suites()["lambda2020"]
    assert main(["bench", "--suite", "lambda2020", "--device", "fake", "--no-store"]) == 0
    assert [r.target.workload for r in asked] == [e.workload for e in entries]
    assert [(r.run.precision, r.run.seq_len) for r in asked] == [
        (e.precision, e.seq_len) for e in entries
    ]
    asked.clear()
    given = ["--precision", "fp32", "--seq-len", "64", "--device", "fake", "--no-store"]
    assert main(["bench", "--suite", "lambda2020", *given]) == 0
    assert {(r.run.precision, r.run.seq_len) for r in asked} == {("fp32", 64)}
