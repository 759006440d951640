"""The typed requests of ``whichgpu.api.requests``: the run options mirror ``RunConfig``, and
the keyword functions answer what their request answers."""

from __future__ import annotations

from dataclasses import fields

import pytest

from whichgpu.api import FitRequest, RunOptions, Target, answer_fit, fit
from whichgpu.errors import UsageError
from whichgpu.schema import RunConfig


def test_run_options_name_every_run_config_field_but_the_gpu_count() -> None:
    assert {f.name for f in fields(RunOptions)} == set(RunConfig.model_fields) - {"gpus"}


def test_run_options_are_checked_into_a_run_config() -> None:
    options = RunOptions.of({"precision": "fp32", "batch_size": 8, "lora_targets": None})
    assert options.given() == {"precision": "fp32", "batch_size": 8}
    run = options.config(gpus=2)
    assert (run.precision, run.batch_size, run.gpus) == ("fp32", 8, 2)


def test_run_options_refuse_a_keyword_that_is_no_run_option() -> None:
    with pytest.raises(UsageError) as caught:
        RunOptions.of({"bogus": 1})
    assert caught.value.field == "bogus"


def test_the_keyword_function_answers_what_its_request_answers() -> None:
    by_keyword = fit("resnet50", gpus=["rtx-4090"], precision="fp32")
    request = FitRequest(
        Target("resnet50"), RunOptions(precision="fp32").config(), gpus=["rtx-4090"]
    )
    assert [e.model_dump() for e in answer_fit(request)] == [e.model_dump() for e in by_keyword]
