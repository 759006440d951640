"""``validate``'s references measured outside whichgpu: the H200 measurements and llm-foundry's
published MPT runs, each against ``fit`` and ``predict``, and the summary per reference."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit, predict
from whichgpu.errors import UsageError
from whichgpu.profiles.scalable import ScalableProfile
from whichgpu.validate.h200 import h200_cases, h200_memory, h200_throughput
from whichgpu.validate.llm_foundry import (
    PROFILE_DIR,
    _data,
    _profile_stem,
    compared_runs,
    config_file,
    foundry_memory,
    foundry_runs,
    foundry_throughput,
    validated_runs,
)
from whichgpu.validate.memory import validate_memory
from whichgpu.validate.summary import SOURCES, chosen_sources, error_summary


def test_h200_cases_map_to_runs() -> None:
    cases = h200_cases()
    assert len(cases) == 22  # the environment lines are not cases
    searched = [c for c in cases if c.max_batch is not None]
    assert [(c.workload, c.max_batch, c.run.batch_size) for c in searched] == [
        ("gpt2", 82, None),
        ("llama-3.2-1b", 15, None),
        ("resnet50", 3294, None),
        ("bert-large", 185, None),
    ]
    by_name = {c.case: c for c in cases}
    lora = by_name["llama-3.2-3b bf16-pure s768 b4 lora32 qv"].run
    assert (lora.method, lora.lora_rank, lora.lora_targets) == ("lora", 32, ("q_proj", "v_proj"))
    seqcls = by_name["bert-large-seqcls fp32 s512 b4"]
    assert seqcls.config is not None and seqcls.config.is_file() and seqcls.task == "seq-cls"
    assert seqcls.target == {"workload": None, "config": seqcls.config, "task": "seq-cls"}
    assert by_name["llama-3.2-1b bf16 s2048 b8 gc"].run.checkpointing
    assert by_name["llama-3.2-1b bf16-pure s2048 b8"].run.precision == "bf16-pure"
    resnet = by_name["resnet50 fp32 b64"].run
    assert (resnet.precision, resnet.batch_size, resnet.seq_len) == ("fp32", 64, None)
    gpt2 = by_name["gpt2 bf16 s1024 b8"]
    assert gpt2.peak_reserved_bytes == 15252586496 and gpt2.step_s == pytest.approx(0.0605731)


def test_h200_cases_are_compared_with_fit_and_predict_for_the_h200() -> None:
    by_name = {c.case: c for c in h200_cases()}
    chosen = [by_name["gpt2 bf16 s1024 b8"], by_name["max batch gpt2 bf16 s1024"]]
    at_batch, largest = h200_memory(chosen)
    (direct,) = fit("gpt2", gpus=["h200-sxm"], precision="bf16", seq_len=1024, batch_size=8)
    assert at_batch.predicted_reserved_bytes == direct.peak_reserved_bytes
    assert at_batch.predicted_device_bytes == direct.device_total_bytes
    assert at_batch.reserved_error == pytest.approx(direct.peak_reserved_bytes / 15252586496 - 1)
    (searched,) = fit("gpt2", gpus=["h200-sxm"], precision="bf16", seq_len=1024)
    assert largest.measured_max_batch == 82
    assert largest.predicted_max_batch == searched.max_batch_size
    assert largest.would_oom == (searched.max_batch_size > 82)
    (timed,) = h200_throughput(chosen)  # the largest-batch case has no time
    (speed,) = predict("gpt2", gpus=["h200-sxm"], precision="bf16", seq_len=1024, batch_size=8)
    assert speed.step_time_s is not None and timed.predicted == speed.step_time_s
    assert timed.error == pytest.approx(0.0605730638 / speed.step_time_s - 1)


def test_llm_foundry_table_and_configs_agree() -> None:
    rows = foundry_runs()
    assert len(rows) == 119 and {r.n_gpus for r in rows} == {8, 16, 32, 64}
    compared = compared_runs()  # on one node: the rows the constants are fitted on
    assert len(compared) == 14 and all(r.n_gpus == 8 and r.network is None for r in compared)
    # on 16 to 64 H100s: nodes of 8 on the default fabric (the README names none)
    across = [r for r in validated_runs() if not r.one_node]
    assert len(across) == 13 and {r.gpu for r in across} == {"h100-sxm"}
    assert all(r.network is None and r.run.gpus == r.n_gpus for r in across)
    assert {r.model for r in across} == {"mpt-30b", "mpt-13b", "mpt-3b", "mpt-1b", "mpt-760m"}
    assert {r.gpu for r in compared} == {"a100-sxm4-80gb", "h100-sxm"}
    assert all(r.seq_len == 2048 and r.precision == "amp_bf16" for r in compared)
    assert [r.activation_checkpointing for r in compared].count(True) == 2  # mpt-30b
    for model in {r.model for r in rows}:
        with config_file(model) as path:
            doc = json.loads(path.read_text())
        d, layers = doc["n_embd"], doc["n_layer"]
        assert doc["vocab_size"] == 50368 and doc["n_positions"] == 2048
        for r in rows:
            if r.model == model:  # GPT-2's count with the row's positions, to the parameter
                expected = 50368 * d + r.seq_len * d + layers * (12 * d * d + 13 * d) + 2 * d
                assert r.num_params == expected, r


def test_llm_foundry_profiles_are_shipped_for_every_compared_run() -> None:
    for r in compared_runs():
        ref = _data().joinpath(PROFILE_DIR).joinpath(_profile_stem(r.model, r.run) + ".json.gz")
        assert ref.is_file(), r.case
        with resources.as_file(ref) as path:
            profile = ScalableProfile.load(Path(path))
        assert profile.params_total == r.num_params and profile.workload == r.model


def test_llm_foundry_runs_are_asked_of_fit_and_predict_on_eight_gpus() -> None:
    run = next(r for r in compared_runs() if r.model == "mpt-125m")
    (case,) = foundry_memory([run])  # answers from the shipped profile, placed in the cache
    with config_file("mpt-125m") as path:
        (direct,) = fit(
            config=path,
            gpus=["a100-sxm4-80gb"],
            precision="bf16",
            batch_size=run.micro_batch_size,
            seq_len=2048,
            gpu_count=8,
            sharding="fsdp",
            optimizer_impl="for-loop",  # Composer's DecoupledAdamW
            loss_kernel="fused",  # the MPT models' fused cross-entropy
        )
    assert (case.run.optimizer_impl, case.run.loss_kernel) == ("for-loop", "fused")
    assert case.run.gpus == 8 and case.run.sharding == "fsdp"
    assert case.fits == direct.fits and case.predicted_max_batch == direct.max_batch_size
    (timed,) = foundry_throughput([run])
    assert timed.quantity == "tokens/s per GPU" and timed.measured == 142830
    assert timed.predicted is not None and timed.error is not None
    assert timed.error == pytest.approx(timed.predicted / 142830 - 1)
    assert timed.fits == direct.fits and ("timed as if it fitted" in timed.note) != direct.fits


def test_summaries_and_source_choice() -> None:
    s = error_summary("h200-2026-11", "peak reserved", [-0.1, 0.3, -0.2])
    assert s.cases == 3 and s.mean_abs_error == pytest.approx(0.2)
    assert s.mean_error == pytest.approx(0.0) and s.worst_error == pytest.approx(0.3)
    assert error_summary("own", "speed", []).mean_abs_error is None
    assert chosen_sources(None) == SOURCES
    assert chosen_sources(["llm-foundry", "lambda2020"]) == ("lambda2020", "llm-foundry")
    with pytest.raises(UsageError, match="h200-2026-11"):
        chosen_sources(["h100"])
    only = validate_memory(sources=("llm-foundry",))
    assert only.cases == () and only.measured == () and only.gpu_runs == ()
    assert len(only.fsdp_runs) == 27 and only.sources == ("llm-foundry",)
    (line,) = only.summaries
    refused = sum(c.fits is False for c in only.fsdp_runs)
    assert line.cases == 27 and line.note.startswith(f"{refused} of 27 runs that ran")


def test_cli_validate_memory_rejects_an_unknown_source() -> None:
    result = run_cli("validate", "memory", "--source", "nope", "--json")
    assert result.returncode == 2 and "lambda2020" in result.stderr
    assert "error" in json.loads(result.stdout)


def test_llm_foundry_rows_on_several_nodes_are_predicted_on_their_fabric() -> None:
    import dataclasses

    run = next(r for r in validated_runs() if r.model == "mpt-760m" and r.n_gpus == 16)
    assert run.case == "mpt-760m 16x h100_80gb s2048 mb24"
    (timed,) = foundry_throughput([run])
    assert timed.run.gpus == 16 and timed.run.network is None  # the default fabric
    assert timed.measured == 68551 and timed.predicted is not None
    # the A100 table's runs on several nodes had its RoCE fabric
    roce = dataclasses.replace(run, table="A100 80GB with 1600 Gbps node-node interconnect (RoCE)")
    assert roce.network == "roce-1600" and roce.run.network == "roce-1600"
    assert dataclasses.replace(roce, n_gpus=8).run.network is None
