"""``validate memory``: every Lambda 2020 case is predicted and judged on its grid."""

from __future__ import annotations

import json

from rich.console import Console, RenderableType

from tests.conftest import run_cli
from whichgpu.api import fit
from whichgpu.estimate.memory import largest_live_batch
from whichgpu.profiles.stored import load_stored
from whichgpu.report.terminal import measured_memory_view
from whichgpu.schema import BenchResult
from whichgpu.units import GIB
from whichgpu.validate.measured import (
    compare_measurements,
    cpu_kernel_profile,
    shipped_measurements,
    verdict,
)
from whichgpu.validate.memory import compare, on_grid
from whichgpu.workloads import run_config


def run_rich(renderable: RenderableType) -> str:
    console = Console(width=200, record=True)
    with console.capture() as captured:
        console.print(renderable)
    return captured.get()


def test_grid_rounding_and_steps() -> None:
    powers = [2**k for k in range(12)]
    assert on_grid(13, powers) == (8, 3)
    assert compare(8, 13, powers) == (8, 0, "exact")
    assert compare(16, 13, powers) == (8, -1, "conservative")
    assert compare(4, 13, powers) == (8, 1, "too high")
    tokens = [2000, 3584, 8000, 16000]
    assert compare(3584, 6016, tokens)[2] == "exact"
    assert compare(8000, 17664, tokens)[:2] == (16000, 1)
    assert compare(0, 0, powers)[2] == "exact"  # neither could run it


def test_cli_validate_memory_json() -> None:
    # every reference but the H200's, which traces two runs nothing ships a profile for
    sources = ("--source", "lambda2020", "--source", "own", "--source", "llm-foundry")
    # the compiled runs of the own measurements trace AOTAutograd's partitions: minutes on CI
    result = run_cli("validate", "memory", *sources, "--json", timeout_s=400)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["sources"] == ["lambda2020", "own", "llm-foundry"]
    assert len(doc["fsdp_runs"]) == 27 and doc["gpu_runs"] == []
    assert doc["summaries"][0]["source"] == "lambda2020"
    assert {s["source"] for s in doc["summaries"]} == {"lambda2020", "own", "llm-foundry"}
    assert len(doc["cases"]) == 96
    assert doc["compared"] == 96, [c for c in doc["cases"] if c["verdict"] == "skipped"]
    assert (
        doc["exact"] + doc["too_high"] + doc["conservative_by_one"] + doc["conservative_more"]
        == doc["compared"]
    )
    assert any("fp32" in a for a in doc["assumptions"])
    assert all(c["framework"] for c in doc["cases"])
    evidenced = [
        c
        for c in doc["cases"]
        if c["verdict"] == "too high"
        and (
            c["measured_max_batch"] == 0
            or (c["framework"].startswith("PyTorch") and not c["batches_set_by_hand"])
        )
    ]
    assert doc["too_high_evidenced"] == len(evidenced) <= doc["too_high"]
    by_hand = {c["model"] for c in doc["cases"] if c["batches_set_by_hand"]}
    assert by_hand == {"Transformer Big", "Conv. Seq2Seq", "unsupMT", "BERT Finetune"}


def test_cli_validate_memory_table() -> None:
    result = run_cli(
        "validate", "memory", "--source", "lambda2020", "--source", "own", timeout_s=400
    )
    assert result.returncode == 0, result.stderr
    assert "Summary per reference" in result.stdout and "llm-foundry" not in result.stdout
    assert "cases compared" in result.stdout and "Assumptions" in result.stdout
    assert "whichgpu's own measurements" in result.stdout
    assert "CPU live-tensor peak" in result.stdout


def test_largest_batch_under_a_cap_and_verdicts() -> None:
    profile = load_stored("resnet50", run_config(precision="fp32"))
    assert profile is not None
    for limit_gib in (1, 2, 7.5, 40):
        limit = round(limit_gib * GIB)
        largest = largest_live_batch(profile, limit, None)
        assert largest >= 1
        assert profile.live_peak_bytes(largest, None) <= limit
        assert profile.live_peak_bytes(largest + 1, None) > limit
    assert largest_live_batch(profile, profile.live_peak_bytes(1, None) - 1, None) == 0
    assert largest_live_batch(profile, profile.live_peak_bytes(1, None), None) == 1
    assert [verdict(8, p) for p in (8, 7, 9)] == ["exact", "conservative", "too high"]


def test_shipped_cpu_measurements_match_the_traced_live_peak() -> None:
    on_cpu = [r for r in shipped_measurements() if r.environment.device_kind == "cpu"]
    cpu = compare_measurements(on_cpu)
    assert {c.workload for c in cpu} >= {"resnet50", "vit-b-16", "yolov3", "bert-base", "gpt2"}
    runs = {(c.run.method, c.run.checkpointing, c.run.precision, c.run.optimizer) for c in cpu}
    assert {m for m, *_ in runs} >= {"full", "lora", "qlora"}
    assert {o for *_, o in runs} >= {"adamw", "adamw-8bit", "sgd", "adafactor"}
    assert any(ckpt for _, ckpt, *_ in runs) and any(p == "bf16-pure" for *_, p, _ in runs)
    served = [c for c in cpu if c.run.mode == "inference" and c.run.context is not None]
    assert [c.workload for c in served] == ["gpt2"]  # a request batch with a KV cache
    assert {c.workload for c in cpu if c.run.mode == "inference"} >= {"resnet50", "bert-base"}
    for case in cpu:
        # predicted from a trace of the CPU's own kernels, shipped with the measurements:
        # the same tensors, to the byte
        assert "CPU's own dropout and attention kernels" in case.note, case
        assert case.predicted_allocated_bytes == case.measured_allocated_bytes, case
    searched = [c for c in cpu if c.measured_max_batch is not None]
    assert {c.workload for c in searched} == {"resnet50", "bert-base", "gpt2"}
    for case in searched:
        assert case.max_batch_verdict == "exact", case


def bert_base_training_at_batch_4() -> BenchResult:
    """The shipped CPU measurement of BERT-Base's AdamW training step at batch 4."""
    (result,) = [
        r
        for r in shipped_measurements()
        if r.workload == "bert-base"
        and r.max_batch_size is None
        and r.run.optimizer == "adamw"
        and r.run.mode == "train"
    ]
    return result


def test_without_a_cpu_kernel_profile_a_cpu_case_says_the_trace_follows_cuda() -> None:
    bert = bert_base_training_at_batch_4()
    other_run = bert.run.model_copy(update={"precision": "bf16"})  # no CPU-kernel profile
    assert cpu_kernel_profile("bert-base", other_run) is None
    (case,) = compare_measurements([bert.model_copy(update={"run": other_run})])
    assert "CPU's own" not in case.note and "one byte per element" in case.note


def test_a_cuda_measurement_is_compared_with_fit_for_its_gpu() -> None:
    cpu = bert_base_training_at_batch_4()
    gib = 2**30
    on_gpu = cpu.model_copy(
        update={
            "gpu": "rtx-4090",
            "device_name": "NVIDIA GeForce RTX 4090",
            "max_batch_size": 60,
            "peak_reserved_bytes": 3 * gib,
            "device_used_bytes": 4 * gib,
            "environment": cpu.environment.model_copy(update={"device_kind": "cuda"}),
        }
    )
    (case,) = compare_measurements([on_gpu])
    run = cpu.run
    (at_batch,) = fit(
        "bert-base",
        gpus=["rtx-4090"],
        precision=run.precision,
        seq_len=run.seq_len,
        batch_size=run.batch_size,
    )
    (largest,) = fit("bert-base", gpus=["rtx-4090"], precision=run.precision, seq_len=run.seq_len)
    assert case.predicted_allocated_bytes == at_batch.peak_allocated_bytes
    assert case.predicted_reserved_bytes == at_batch.peak_reserved_bytes
    assert case.predicted_device_bytes == at_batch.device_total_bytes
    assert case.measured_reserved_bytes == 3 * gib and case.measured_device_bytes == 4 * gib
    assert case.predicted_max_batch == largest.max_batch_size
    assert case.max_batch_verdict == verdict(60, largest.max_batch_size)
    view = run_rich(measured_memory_view([case]))
    assert "peak reserved within 5 % or 256 MiB" in view and "rtx-4090" in view
    assert "none shipped yet" in run_rich(measured_memory_view([]))
