"""``predict``: the operator-time model, its fit, the CLI, and the validation."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.api import predict
from whichgpu.catalog import load_catalog
from whichgpu.errors import UsageError
from whichgpu.estimate.throughput import (
    OpTable,
    error_band,
    error_band_basis,
    gpu_rates,
    load_parameters,
    matrix_engines,
    merge_repeats,
    step_time,
    with_values,
)
from whichgpu.schema import RunConfig
from whichgpu.validate.throughput import (
    CaseBatch,
    bandwidth,
    baseline_errors,
    fit_parameters,
    lambda_cases,
    summarize,
)


def _table(kinds: list[str], dtypes: list[str], flops: list[float], moved: list[float]) -> OpTable:
    return OpTable(
        kinds=tuple(kinds),
        dtypes=tuple(dtypes),
        flops=np.array(flops, dtype=float),
        bytes_moved=np.array(moved, dtype=float),
        units_per_step=1,
        batch_size=1,
        seq_len=None,
        is_matrix=np.array([k in ("gemm", "conv", "attention") for k in kinds]),
        is_half=np.array([d in ("float16", "bfloat16") for d in dtypes]),
        is_fp32=np.array([d == "float32" for d in dtypes]),
        phases=np.array(["forward"] * len(kinds)),
    )


def test_engines_follow_precision_and_what_the_gpu_has() -> None:
    catalog = load_catalog()
    table = _table(["gemm", "gemm"], ["bfloat16", "float32"], [1e12, 1e12], [0, 0])
    a100 = gpu_rates(catalog.resolve("a100-sxm4-80gb"))
    peak, tensor = matrix_engines(table, a100, "bf16")
    assert list(tensor) == [True, False]
    assert peak[0] == a100.bf16_tensor_flops_per_s and peak[1] == a100.vector_flops_per_s
    peak, tensor = matrix_engines(table, a100, "tf32")
    assert peak[1] == a100.tf32_flops_per_s and tensor[1]
    pascal = gpu_rates(catalog.resolve("gtx-1080-ti"))  # no tensor cores: FP32 units
    peak, tensor = matrix_engines(table, pascal, "fp16")
    assert not tensor.any() and (peak == pascal.vector_flops_per_s).all()


def test_step_time_is_the_larger_of_compute_and_memory_per_operator() -> None:
    catalog = load_catalog()
    rates = gpu_rates(catalog.resolve("h100-sxm"))
    params = with_values(load_parameters(), np.array([0.5, 0.5, 0.5, 1.0, 1e-6]))
    big = _table(["gemm"], ["bfloat16"], [1e15], [1e6])
    assert rates.bf16_tensor_flops_per_s is not None
    work = 1e15 / rates.sm_count
    expected = 1e15 / (rates.bf16_tensor_flops_per_s * 0.5 * work / (work + 1.0))
    assert step_time(big, rates, "bf16", params).step_time_s == pytest.approx(expected)
    stream = _table(["elementwise"], ["bfloat16"], [0], [1e10])
    t = step_time(stream, rates, "bf16", params)
    assert t.step_time_s == pytest.approx(1e10 / (rates.bandwidth_bytes_per_s * 0.5))
    assert t.memory_s == t.step_time_s
    tiny = _table(["elementwise"], ["bfloat16"], [0], [8])
    assert step_time(tiny, rates, "bf16", params).launch_s == pytest.approx(1e-6)


def test_merging_repeated_operators_keeps_the_step_time() -> None:
    table = _table(
        ["gemm", "elementwise", "gemm", "elementwise", "gemm"],
        ["bfloat16"] * 5,
        [1e12, 0, 1e12, 0, 1e9],
        [1e6, 1e8, 1e6, 1e8, 1e3],
    )
    merged = merge_repeats(table)
    assert len(merged.kinds) == 3 and merged.weights.tolist() == [2.0, 2.0, 1.0]
    rates = gpu_rates(load_catalog().resolve("rtx-4090"))
    whole = step_time(table, rates, "bf16", load_parameters())
    fast = step_time(merged, rates, "bf16", load_parameters())
    assert fast.step_time_s == pytest.approx(whole.step_time_s)
    assert fast.flops == pytest.approx(whole.flops)
    assert fast.memory_s == pytest.approx(whole.memory_s)


def test_fit_recovers_constants_it_generated() -> None:
    cases, _ = lambda_cases()
    workloads = sorted({c.workload for c in cases})
    truth = replace(
        with_values(load_parameters(), np.array([0.6, 0.7, 0.5, 2e7, 5e-6])),
        workload_factors={w: 0.7 + 0.05 * i for i, w in enumerate(workloads)},
        workload_host_shares={w: 0.4 * (i % 3) for i, w in enumerate(workloads)},
    )
    synthetic = [replace(c, measured=c.predicted(truth)) for c in cases[::3]]
    fitted = fit_parameters(synthetic, load_parameters())
    errors = [c.predicted(fitted) / c.measured - 1 for c in synthetic]
    assert summarize("fit", errors).mape < 0.02
    # without the host time the same constants cannot reproduce the runs
    no_host = replace(truth, workload_host_shares=dict.fromkeys(workloads, 0.0))
    missed = [c.predicted(no_host) / c.measured - 1 for c in synthetic]
    assert summarize("no host", missed).mape > 0.1


def test_the_fits_batched_times_are_the_step_times_of_each_case() -> None:
    cases, _ = lambda_cases()
    params = load_parameters()
    on_gpu, on_reference = CaseBatch.of(cases).times_per_unit(params)
    assert on_gpu * [c.modelled(params) for c in cases] == pytest.approx(np.ones(len(cases)))
    assert on_reference == pytest.approx([c.reference_time(params) for c in cases])
    # the reference is the same GPU for every case: a step's time there tracks its work alone
    same = [i for i, c in enumerate(cases) if c.gpu.id == params.host_reference_gpu]
    assert same and on_gpu[same] == pytest.approx(on_reference[same])


def test_a_measured_run_adds_host_time_that_a_prediction_leaves_out() -> None:
    params = load_parameters()
    cases, _ = lambda_cases()
    case = next(c for c in cases if c.workload == "yolov3" and c.gpu.id == "titan-rtx")
    share = params.host_share("yolov3", case.family)
    assert 0 < share == params.workload_host_shares["yolov3"]
    gpu_only = case.modelled(params) * params.speed_factor("yolov3", case.family)
    assert case.predicted(params) == pytest.approx(
        gpu_only / (1 + share * case.reference_time(params) * case.modelled(params))
    )
    (estimate,) = predict(
        "yolov3", gpus=["titan-rtx"], batch_size=case.table.batch_size, precision=case.precision
    )
    # predict times today's code: the GPU step without the 2020 run's speed factor
    factor = params.prediction_factor("yolov3", case.family)
    assert estimate.throughput == pytest.approx(case.modelled(params) * factor)
    assert any("outside the GPU" in a and f"{share:.0%}" in a for a in estimate.assumptions)
    assert params.host_share("mine", "something-new") == params.type_host_shares["default"]


def test_a_workload_without_its_own_factor_takes_its_types_and_the_wider_band() -> None:
    params = load_parameters()
    assert "bert-base" in params.workload_factors
    assert "bert-large" not in params.workload_factors
    assert params.speed_factor("bert-base", "encoders") == params.workload_factors["bert-base"]
    assert params.speed_factor("bert-large", "encoders") == params.type_factors["language"]
    assert params.speed_factor("mine", "something-new") == params.type_factors["default"]
    assert error_band(params, "bert-large", "encoders") > error_band(
        params, "bert-base", "encoders"
    )
    assert "never measured" in params.factor_origin("bert-large", "encoders")
    assert error_band_basis(params, "bert-base") == "leave one GPU out"
    assert error_band_basis(params, "bert-large") == "leave one model out"


def test_shipped_constants_are_the_fit_of_the_shipped_cases() -> None:
    cases, left_out = lambda_cases()
    assert len(cases) + len(left_out) == 87  # rows of the table with a throughput
    shipped = load_parameters()
    refit = fit_parameters(cases, shipped)
    assert np.allclose(np.log(refit.vector), np.log(shipped.vector), atol=0.05)
    for workload, factor in shipped.workload_factors.items():
        assert refit.workload_factors[workload] == pytest.approx(factor, rel=0.05)
        share = shipped.workload_host_shares[workload]
        assert refit.workload_host_shares[workload] == pytest.approx(share, abs=0.05)
    assert 0 < shipped.error_bands["default"] < shipped.unseen_error_bands["default"] < 1
    assert summarize("bw", baseline_errors(cases, bandwidth)).mape > 0


def test_predict_ranks_gpus_and_marks_what_does_not_fit() -> None:
    estimates = predict("llama-3.2-1b", gpus=["rtx-4090", "h100-sxm", "a100-sxm4-80gb"])
    assert [e.gpu for e in estimates] == ["h100-sxm", "a100-sxm4-80gb", "rtx-4090"]
    fast, _, none = estimates
    assert fast.fits and fast.throughput and fast.low < fast.throughput < fast.high  # type: ignore[operator]
    assert fast.throughput_unit == "tokens/s" and 0.05 < fast.mfu < 0.9  # type: ignore[operator]
    assert not none.fits and none.throughput is None
    (fixed,) = predict("resnet50", gpus=["rtx-3090"], batch_size=32, precision="fp32")
    assert fixed.batch_size == 32 and fixed.step_time_s is not None


def test_cli_predict_json_and_errors() -> None:
    result = run_cli("predict", "resnet50", "--gpu", "3090", "--gpu", "4090", "--json")
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    keys = {"gpu", "batch_size", "step_time_s", "throughput", "throughput_unit", "low", "high"}
    assert keys | {"fits", "n_gpus", "scaling_efficiency"} <= set(docs[0])
    assert docs[0]["throughput"] >= docs[1]["throughput"]
    bad = run_cli("predict", "resnet50", "--gpu", "rtx-9999")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stdout == ""
    precision = run_cli("predict", "resnet50", "--gpu", "3090", "--precision", "fp9")
    assert precision.returncode == 2 and "--precision" in precision.stderr


def test_predict_needs_no_torch_for_a_named_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    (estimate,) = predict("bert-base", gpus=["a100-sxm4-80gb"])
    assert estimate.throughput is not None


def test_cli_validate_throughput_reports_held_out_errors_and_baselines() -> None:
    own = ("--source", "lambda2020", "--source", "own")  # the others: test_validate_references
    # the first run of whichgpu's own measurements traces their steps: a minute, more on CI
    result = run_cli("validate", "throughput", *own, "--json", timeout_s=400)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    methods = [s["method"] for s in doc["summaries"]]
    assert methods[0] == "whichgpu, leave one GPU out" and any("bandwidth" in m for m in methods)
    assert all(s["cases"] == len(doc["cases"]) for s in doc["summaries"])
    assert len(doc["seed_checks"]) == 4 and doc["left_out"]
    # whichgpu's own benches on an H200 are the shipped GPU measurements: GPT-2 (2026-11-26),
    # Llama 3.2 1B at its largest batch and serving 16 and 64 sequences (2026-11-27); and
    # (2026-11-27, later) Llama 3.1 8B's layers eager, compiled and fp8, Llama 3.2 1B at 8
    # eager (twice), checkpointed (twice) and compiled
    shipped = sorted((m["workload"], m["gpu"], m["run"]["batch_size"]) for m in doc["measured"])
    assert shipped == [
        ("gpt2", "h200-sxm", 8),
        *[("llama-3.1-8b-8layers.json", "h200-sxm", 4)] * 3,
        *[("llama-3.2-1b", "h200-sxm", 8)] * 5,
        ("llama-3.2-1b", "h200-sxm", 15),
        ("llama-3.2-1b", "h200-sxm", 16),
        ("llama-3.2-1b", "h200-sxm", 64),
    ]
    assert doc["measured_summary"] is not None
    # compiled runs are predicted compiled, with the masked attention of their transformers
    # 5.17 (--stack pytorch2-cuda12-transformers-5.17), and counted
    compiled = [m for m in doc["measured"] if m["run"]["compile"]]
    assert len(compiled) == 3 and all(abs(m["error"]) < 0.1 for m in compiled)
    assert all("transformers 5.17.0 builds a dense causal mask" in m["note"] for m in compiled)
    assert doc["measured_summary"]["cases"] == len(doc["measured"])
    ratios = doc["speed_ratios"]
    assert len(ratios) == 3 and any(r.startswith("fp8 over bf16") for r in ratios)
    assert any("measured 1.194x, predicted 1.1" in r for r in ratios)
    assert sum("compiled over eager" in r and "predicted 1." in r for r in ratios) == 2
    text = run_cli("validate", "throughput", "--source", "own").stdout  # the rendering
    assert "own GPU measurements (out of sample)" in text and "Speed ratios: " in text


def test_own_gpu_measurements_are_compared_with_predict_of_the_same_run() -> None:
    from tests.store.test_store import make_fake_result, make_result
    from whichgpu.validate.measured import compare_throughputs
    from whichgpu.validate.throughput import validate_throughput

    measured = make_result()  # ResNet-50, bf16, batch 256 on an RTX 4090: 1,432.7 images/s
    compiled = make_result(compiled=True, throughput=1700.0)
    too_big = make_result(batch_size=4096, run=RunConfig(batch_size=4096))
    cases = compare_throughputs([measured, make_fake_result(), compiled, too_big])
    assert [c.result_id for c in cases] == [measured.id, compiled.id, too_big.id]  # GPUs only
    (direct,) = predict("resnet50", gpus=["rtx-4090"], batch_size=256)
    first = cases[0]
    assert direct.throughput is not None and first.predicted == pytest.approx(direct.throughput)
    assert first.error == pytest.approx(direct.throughput / 1432.7 - 1)
    assert first.low is not None and first.high is not None
    assert first.low <= first.predicted <= first.high
    assert first.measured_mfu == 0.412 and first.predicted_mfu == direct.mfu and not first.note
    # the compiled run is predicted compiled (fused kernels in place of eager's operators),
    # on the stack of its transformers 4.46.3, which masks a compiled step's attention
    second = cases[1]
    assert second.run.compile and second.predicted is not None and first.predicted is not None
    assert second.predicted > first.predicted and second.error is not None
    assert "--stack pytorch2-cuda12-transformers-5.17" in second.note
    # calibrating on it corrects the compiled prediction, not the eager one
    (calibrated,) = predict(
        "resnet50", gpus=["rtx-4090"], compile=True, batch_size=256, calibrate=compiled
    )
    assert calibrated.throughput == pytest.approx(1700.0)
    assert f"against {second.predicted:,.0f} predicted" in (calibrated.calibrated_on or "")
    assert cases[2].predicted is None and cases[2].error is None
    assert "does not fit on rtx-4090" in cases[2].note
    # validate throughput summarises them beside Lambda's table
    validation = validate_throughput(
        load_parameters(), measurements=[measured, too_big], sources=("lambda2020", "own")
    )
    summary = validation.measured_summary
    assert summary is not None and summary.cases == 1
    assert summary.mape == pytest.approx(abs(direct.throughput / 1432.7 - 1))


def test_inference_of_a_language_model_is_prefill_then_decode_steps() -> None:
    h100, h200 = (
        wg.predict(
            "llama-3.1-8b",
            gpus=[gpu],
            mode="inference",
            context=1024,
            new_tokens=128,
            concurrency=4,
        )[0]
        for gpu in ("h100-sxm", "h200-sxm")
    )
    for e in (h100, h200):
        assert e.throughput_unit == "tokens/s" and e.batch_size == 4
        assert e.prefill_s is not None and e.decode_step_s is not None
        assert e.step_time_s == pytest.approx(e.prefill_s + 128 * e.decode_step_s)
        assert e.throughput == pytest.approx(4 * 128 / e.step_time_s)
    # decode streams weights and cache: it speeds up with bandwidth (4.8 vs 3.35 TB/s, same
    # compute), by less than the ratio since the launch floor of the eager ops does not
    assert h100.decode_step_s is not None and h200.decode_step_s is not None
    assert 1.1 < h100.decode_step_s / h200.decode_step_s < 4.8 / 3.35


def test_compiled_decoding_streams_without_the_dispatch_floor() -> None:
    """--compile with inference: the decode steps replay a CUDA graph (transformers' generate on
    a static cache), so at one sequence they stream the weights at the bandwidth share alone,
    while the prefill stays eager."""
    asked = {"mode": "inference", "context": 512, "new_tokens": 128, "concurrency": 1}
    eager, compiled = (
        {
            gpu: wg.predict("llama-3.1-8b", gpus=[gpu], compile=c, **asked)[0]  # type: ignore[arg-type]
            for gpu in ("h100-sxm", "h200-sxm")
        }
        for c in (False, True)
    )
    for gpu in ("h100-sxm", "h200-sxm"):
        assert compiled[gpu].prefill_s == eager[gpu].prefill_s
        assert compiled[gpu].decode_step_s < eager[gpu].decode_step_s  # type: ignore[operator]
        assert any(a.startswith("compiled decoding (--compile)") for a in compiled[gpu].assumptions)
        assert "compiled decoding" in compiled[gpu].run.describe()
    # memory bound: the step follows the bandwidth (4.8 vs 3.35 TB/s), the eager one does not
    h100, h200 = (compiled[g].decode_step_s for g in ("h100-sxm", "h200-sxm"))
    assert h100 is not None and h200 is not None
    assert h100 / h200 == pytest.approx(4.8 / 3.35, rel=0.03)
    plain = (eager[g].decode_step_s for g in ("h100-sxm", "h200-sxm"))
    assert next(plain) / next(plain) < 1.2  # type: ignore[operator]


def test_compiled_inference_of_a_model_that_does_not_generate_is_refused() -> None:
    cli = run_cli("predict", "resnet50", "--mode", "inference", "--compile", "--gpu", "a100-80gb")
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert "resnet50 does not generate" in cli.stderr and "drop --compile" in cli.stderr


def test_compile_leaves_out_gpus_too_old_for_triton() -> None:
    """inductor's Triton kernels need compute capability 7.0: a Pascal card cannot compile."""
    asked = {"mode": "inference", "context": 256, "new_tokens": 128, "concurrency": 1}
    both = wg.predict("llama-3.2-1b", gpus=["tesla-p40", "rtx-3090"], compile=True, **asked)  # type: ignore[arg-type]
    assert [e.gpu for e in both] == ["rtx-3090"]
    why = "Tesla P40 (compute capability 6.1) cannot run torch.compile"
    assert any(why in n for n in both.notes)
    assert wg.predict("llama-3.2-1b", gpus=["tesla-p40"], **asked)  # type: ignore[arg-type]
    cli = run_cli("fit", "llama-3.2-1b", "--compile", "--gpu", "p40", "--seq-len", "256")
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert "GPUTooOldForTriton" in cli.stderr and "drop --compile" in cli.stderr


def test_inference_of_other_models_is_one_forward_pass() -> None:
    train = wg.predict("resnet50", gpus=["a100-80gb"], batch_size=64)[0]
    infer = wg.predict("resnet50", gpus=["a100-80gb"], batch_size=64, mode="inference")[0]
    assert infer.throughput is not None and train.throughput is not None
    assert 2 < infer.throughput / train.throughput < 5  # backward is about twice forward
    with pytest.raises(UsageError, match="tensor parallel"):  # copies, not a split model
        wg.predict("resnet50", gpus=["h100-sxm"], mode="inference", gpu_count=2)


def test_a_measurement_on_one_gpu_calibrates_every_gpu(tmp_path: Path) -> None:
    from tests.store.test_store import make_result
    from whichgpu.store import ResultStore

    plain = {e.gpu: e for e in wg.predict("resnet50", gpus=["rtx-4090", "a100-80gb"])}
    measured = make_result(workload="resnet50", gpu="rtx-4090", batch_size=128, throughput=900.0)
    calibrated = {
        e.gpu: e for e in wg.predict("resnet50", gpus=["rtx-4090", "a100-80gb"], calibrate=measured)
    }
    ratio = {g: calibrated[g].throughput / plain[g].throughput for g in plain}  # type: ignore[operator]
    assert ratio["rtx-4090"] == pytest.approx(ratio["a100-sxm4-80gb"])  # one factor for every GPU
    assert all(e.calibrated_on and "x" in e.calibrated_on for e in calibrated.values())
    # at the measured batch the corrected prediction is the measurement
    at_batch = wg.predict("resnet50", gpus=["rtx-4090"], batch_size=128, calibrate=measured)[0]
    assert at_batch.throughput == pytest.approx(900.0)
    # the same through a stored id and through an exported file, on the command line
    store = tmp_path / "results.sqlite"
    ResultStore(store).add(measured)
    exported = tmp_path / "mine.json"
    ResultStore(store).export(exported)
    for source in (measured.id[:8], str(exported)):
        result = run_cli(
            "predict",
            "resnet50",
            "--gpu",
            "4090",
            "--batch-size",
            "128",
            "--calibrate",
            source,
            "--store",
            str(store),
            "--json",
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)[0]["throughput"] == pytest.approx(900.0)
    # a measurement of another run is refused with what to do
    other = make_result(workload="resnet50", gpu="rtx-4090", precision="fp32")
    with pytest.raises(UsageError, match="whichgpu bench") as refused:
        wg.predict("resnet50", gpus=["rtx-4090"], calibrate=other)
    assert f"Given: {other.id[:8]} has precision fp32, not bf16." in str(refused.value)
    cpu = make_result(workload="resnet50", gpu=None, device_name="AMD EPYC 7B13")
    with pytest.raises(UsageError, match="ran on AMD EPYC 7B13, not a catalog GPU"):
        wg.predict("resnet50", gpus=["rtx-4090"], calibrate=cpu)


def test_predict_says_when_attention_falls_back_to_the_math_path() -> None:
    turing, ada = (wg.predict("gpt2", gpus=[gpu], seq_len=1024)[0] for gpu in ("2080ti", "4090"))
    assert any("math path" in a for a in turing.assumptions)
    assert not any("math path" in a for a in ada.assumptions)


def test_the_shipped_fit_records_what_its_runs_covered() -> None:
    cases, _ = lambda_cases()
    coverage = load_parameters().coverage
    lambda_architectures = {str(c.gpu.architecture) for c in cases}
    # Lambda's Pascal and Turing, and today's runs: the H200 and llm-foundry's A100 and H100
    assert set(coverage.architectures) == lambda_architectures | {"Ampere", "Hopper"}
    tensor = [c for c in cases if c.engines[1].any()]
    assert coverage.tensor_runs > len(tensor) > 0
    assert set(coverage.tensor_workloads) > {c.workload for c in tensor}


def test_assumptions_of_many_gpus_are_shared_then_each_gpus_own() -> None:
    hopper, turing = (wg.predict("gpt2", gpus=[gpu], seq_len=1024)[0] for gpu in ("b200", "2080ti"))
    merged = hopper.merged_assumptions([hopper, turing])
    shared = [a for a in hopper.assumptions if a in turing.assumptions]
    assert list(merged[: len(shared)]) == shared
    own = merged[len(shared) :]
    assert any(a.startswith("B200: no Blackwell GPU") for a in own)
    assert any(a.startswith("GeForce RTX 2080 Ti: attention falls back") for a in own)
    assert len(merged) == len(set(merged)) and hopper.merged_assumptions([]) == ()


def test_predict_says_when_it_extrapolates_to_a_new_generation_or_engine() -> None:
    coverage = replace(
        load_parameters().coverage,
        architectures=("Turing",),
        tensor_runs=6,
        tensor_workloads=("convs2s",),
        tensor_precisions=("fp16",),
        tensor_architectures=("Turing",),
    )
    assert coverage.architecture_note("Turing") is None
    note = coverage.architecture_note("Hopper")
    assert note is not None and "no Hopper GPU" in note and "only Turing" in note
    assert "bf16 is taken to reach" in (coverage.tensor_note("bf16") or "")
    assert "taken to reach" not in (coverage.tensor_note("fp16") or "x taken to reach")
    assert replace(coverage, architectures=()).architecture_note("Hopper") is None

    hopper, turing = (wg.predict("gpt2", gpus=[gpu], seq_len=1024)[0] for gpu in ("b200", "2080ti"))
    assert any("no Blackwell GPU" in a for a in hopper.assumptions)
    assert any("tensor-core efficiency rests on" in a for a in hopper.assumptions)
    assert not any("GPU was among the fitted runs" in a for a in turing.assumptions)
    shown = run_cli("predict", "gpt2", "--gpu", "b200", "--gpu", "2080ti", "--seq-len", "1024")
    text = " ".join(shown.stdout.split())
    assert shown.returncode == 0, shown.stderr
    assert "B200: no Blackwell GPU" in text and "GeForce RTX 2080 Ti: attention falls" in text


def test_the_catalog_at_two_gpus_leaves_out_what_the_catalog_cannot_time() -> None:
    # AWS's A10G has no PCIe generation (nor a fast link) in the catalog: several of it
    # cannot be timed
    pairs = predict("resnet50", gpu_count=2)
    ids = {e.gpu for e in pairs}
    assert "h100-sxm" in ids and "a10g" not in ids
    # ... and says so
    assert any("A10G" in note and "pcie_gen" in note for note in pairs.notes)
    assert "a10g" in {e.gpu for e in predict("resnet50")}
    with pytest.raises(UsageError, match="no PCIe generation"):
        predict("resnet50", gpus=["a10g"], gpu_count=2)


def test_no_speed_factor_takes_a_step_past_the_gpus_peaks() -> None:
    # predictions take no factor now (the constants are fitted for today's runs), but a factor
    # above 1 on top of the fitted efficiencies still stops at the peaks
    from whichgpu.estimate.prediction import _faster
    from whichgpu.estimate.throughput import StepTime

    step = StepTime(1.0, 0.8, 0.1, 0.1, {"backward": 0.6}, 1e12, 1.0)
    capped, note = _faster(step, 4.0, 0.5)
    assert capped.step_time_s == 0.5 and capped.phase_s["backward"] == 0.3
    assert note and "past the GPU's peak rates" in note[0]
    free, none = _faster(step, 1.5, 0.5)
    assert free.step_time_s == pytest.approx(1 / 1.5) and not none
    (plain,) = predict("bert-base", gpus=["rtx-4090"], seq_len=128)
    assert not any("past the GPU's peak rates" in a for a in plain.assumptions)


def test_tensor_parallel_decode_still_launches_every_kernel() -> None:
    ask = {"gpus": ["h100-sxm"], "mode": "inference", "context": 4096, "concurrency": 8}
    (one,) = predict("llama-3.1-8b", **ask)
    (eight,) = predict("llama-3.1-8b", gpu_count=8, **ask)
    assert one.decode_step_s is not None and eight.decode_step_s is not None
    launch_one = one.time_shares["launch"] * one.step_time_s
    launch_eight = eight.time_shares["launch"] * eight.step_time_s
    # not divided by 8; more operators become launch-bound once their work is split
    assert launch_one <= launch_eight < 1.1 * launch_one
    assert one.decode_step_s / 8 < eight.decode_step_s < one.decode_step_s


def test_a_decode_step_of_a_mixture_of_experts_reads_the_routed_experts_only() -> None:
    from whichgpu.estimate.serving import experts_read_share

    assert experts_read_share(None, 1) == 1.0
    assert experts_read_share((2, 8), 1) == pytest.approx(0.25)
    assert experts_read_share((2, 8), 2) == pytest.approx(1 - 0.75**2)
    assert experts_read_share((2, 8), 64) == pytest.approx(1.0, abs=1e-6)

    ask = {"mode": "inference", "context": 1024, "new_tokens": 128, "gpus": ["h200-sxm"]}
    one = wg.predict("mixtral-8x7b", concurrency=1, **ask)[0]
    many = wg.predict("mixtral-8x7b", concurrency=64, **ask)[0]
    assert one.decode_step_s is not None and many.decode_step_s is not None
    assert any("mixture of experts" in a and "2/8" in a for a in one.assumptions)
    # one sequence streams a quarter of the experts' weights (bf16), 64 nearly all: the
    # difference is at least the three quarters left unread, at the peak bandwidth
    config = wg.read_config("mixtral-8x7b")
    expert_bytes = (
        2 * config["num_hidden_layers"] * config["num_local_experts"]
        * 3 * config["hidden_size"] * config["intermediate_size"]
    )  # fmt: skip
    bandwidth = load_catalog().resolve("h200-sxm").memory_bandwidth_gbps
    assert bandwidth is not None
    unread_s = 0.75 * expert_bytes / (bandwidth * 1e9)
    assert many.decode_step_s - one.decode_step_s > unread_s
    dense = wg.predict("llama-3.1-8b", concurrency=1, **ask)[0]
    assert not any("mixture of experts" in a for a in dense.assumptions)


def test_bf16_on_a_gpu_without_bf16_tensor_cores_says_fp16_would_use_them() -> None:
    bf16 = {e.gpu: e for e in wg.predict("resnet50", gpus=["v100-sxm2-32gb", "a100-80gb"])}
    fp16 = wg.predict("resnet50", gpus=["v100-sxm2-32gb"], precision="fp16")[0]
    volta = bf16["tesla-v100-sxm2-32gb"]
    assert any("FP16 tensor cores but none for BF16" in a for a in volta.assumptions)
    assert not any("none for BF16" in a for a in fp16.assumptions)
    assert not any("none for BF16" in a for a in bf16["a100-sxm4-80gb"].assumptions)
    assert volta.throughput is not None and fp16.throughput is not None
    assert fp16.throughput > 1.5 * volta.throughput
    ranking = wg.recommend("resnet50", gpus=["2080ti"])
    assert ranking.ranking
    for c in ranking.ranking:
        assert any("none for BF16" in r for r in c.reasons)


def test_tf32_is_never_slower_than_fp32_and_helps_only_where_its_rate_is_higher() -> None:
    ask = {"seq_len": 128, "batch_size": 32, "gpus": ["3090", "a100-80gb"]}
    tf32 = {e.gpu: e.throughput for e in wg.predict("bert-large", precision="tf32", **ask)}
    fp32 = {e.gpu: e.throughput for e in wg.predict("bert-large", precision="fp32", **ask)}
    # an RTX 3090 rates TF32 tensor and FP32 alike (35.6 TFLOPS): the same speed
    assert tf32["rtx-3090"] == pytest.approx(fp32["rtx-3090"])
    a100_tf32, a100_fp32 = tf32["a100-sxm4-80gb"], fp32["a100-sxm4-80gb"]
    assert a100_tf32 is not None and a100_fp32 is not None and a100_tf32 > 2 * a100_fp32


def test_a_named_gpu_the_catalog_cannot_time_is_answered_as_unknown_beside_the_others() -> None:
    both = wg.predict("gpt2", gpus=["h100-sxm", "tpu-v5p"])
    by_id = {e.gpu: e for e in both}
    assert by_id["h100-sxm"].throughput is not None
    tpu = by_id["tpu-v5p"]
    assert tpu.throughput is None and tpu.fits
    assert tpu.speed_unknown is not None and "sm_count" in tpu.speed_unknown
    result = run_cli("predict", "gpt2", "--gpu", "h100-sxm", "--gpu", "tpu-v5p")
    assert result.returncode == 0 and "unknown" in result.stdout
    with pytest.raises(UsageError, match="sm_count"):  # asked about it alone: an error
        wg.predict("gpt2", gpus=["tpu-v5p"])


def test_the_whole_catalog_says_which_gpus_it_leaves_out_and_why() -> None:
    ranked = wg.predict("gpt2")
    ids = {e.gpu for e in ranked}
    assert "tpu-v5p" not in ids and all(e.throughput is not None for e in ranked)
    # a GPU it fits on but cannot time is named with what the catalog lacks ...
    untimed = [note for note in ranked.notes if "Cloud TPU v5p" in note]
    assert len(untimed) == 1 and "fp32_tflops, sm_count" in untimed[0]
    assert ranked[:3].notes == ranked.notes  # a slice keeps them
    shown = run_cli("predict", "gpt2")
    assert shown.returncode == 0
    assert "Cloud TPU v5p" in " ".join(shown.stdout.split())
    # ... and a model no single GPU holds is pointed at sharding
    nothing = wg.predict("llama-3.1-70b")
    assert list(nothing) == []
    assert "does not fit on them" in nothing.notes[0] and "--sharding fsdp" in nothing.notes[1]
    shown = run_cli("predict", "llama-3.1-70b")
    assert shown.returncode == 0 and "--sharding fsdp" in shown.stdout


def test_a_calibration_file_that_is_not_measurements_says_so(tmp_path: Path) -> None:
    broken = tmp_path / "measured.json"
    broken.write_text('{"results": [')
    with pytest.raises(UsageError, match="cannot be read as measurements") as caught:
        wg.predict("resnet50", gpus=["4090"], calibrate=broken)
    assert "Nothing was imported" not in str(caught.value)


def test_a_16_bit_gemm_off_the_16_byte_alignment_is_marked_and_runs_slower() -> None:
    from whichgpu.estimate.throughput import misaligned_matrix, op_table
    from whichgpu.workloads import get_workload, run_config

    assert misaligned_matrix([8192, 50257, 768]) and not misaligned_matrix([8192, 50304, 768])
    assert not misaligned_matrix([1, 64, 64])  # a dimension of 1 is no stride
    gpt2, _ = wg.scalable_profile(get_workload("gpt2"), run_config(precision="bf16"))
    table = op_table(gpt2, 2, 128)
    assert table.misaligned is not None and int(table.misaligned.sum()) == 3  # the head's GEMMs
    h200 = gpu_rates(load_catalog().resolve("h200-sxm"))
    raw, _ = matrix_engines(table, h200, "bf16", 1.0)
    slow, _ = matrix_engines(table, h200, "bf16", 0.5)
    assert np.allclose(slow, np.where(table.misaligned, raw * 0.5, raw))
    # fp32 runs on the vector units, which need no alignment
    fp32, _ = wg.scalable_profile(get_workload("gpt2"), run_config(precision="fp32"))
    table32 = op_table(fp32, 2, 128)
    assert table32.misaligned is not None and not table32.misaligned.any()
    merged = merge_repeats(table)
    assert merged.misaligned is not None
    assert merged.weights[merged.misaligned].sum() == 3  # two identical rows merged into one


def test_attention_kernels_of_amperes_instructions_run_at_the_stacks_share_on_hopper() -> None:
    from whichgpu.catalog.stacks import get_stack

    catalog = load_catalog()
    table = _table(["gemm", "attention"], ["bfloat16", "bfloat16"], [1e12, 1e12], [0, 0])
    foundry = get_stack("llm-foundry-2023")
    assert foundry.hopper_attention_percent == 50
    h100 = gpu_rates(catalog.resolve("h100-sxm"), foundry)
    assert h100.attention_rate_share == 0.5
    peak, _ = matrix_engines(table, h100, "bf16")
    assert peak[0] == h100.bf16_tensor_flops_per_s and peak[1] == peak[0] * 0.5
    # an Ampere GPU runs the same kernel at its own rate; today's stack is Hopper's own
    assert gpu_rates(catalog.resolve("a100-sxm4-80gb"), foundry).attention_rate_share == 1.0
    assert gpu_rates(catalog.resolve("h100-sxm"), get_stack()).attention_rate_share == 1.0
    # through predict: slower on the H100 under that stack, unchanged on the A100
    options = {"batch_size": 4, "seq_len": 1024, "precision": "bf16"}
    hopper = [
        predict("gpt2", gpus=["h100-sxm"], stack=stack, **options)[0].throughput
        for stack in (None, "llm-foundry-2023")
    ]
    ampere = [
        predict("gpt2", gpus=["a100-sxm4-80gb"], stack=stack, **options)[0].throughput
        for stack in (None, "llm-foundry-2023")
    ]
    assert hopper[0] is not None and hopper[1] is not None and hopper[1] < hopper[0]
    assert ampere[0] == ampere[1]


def test_pytorch_before_2_11_runs_flash_attention_2_on_hopper() -> None:
    """torch 2.5.1-2.8 and 2.10 from the CUDA 12 wheels dispatch SDPA to FlashAttention-2 on an H100
    (cuDNN's attention opt-in): the stack says so, and only Hopper's attention slows."""
    from whichgpu.catalog.stacks import get_stack

    flash = get_stack("pytorch2-cuda12-flash-attention-2")
    today = get_stack()
    assert flash.hopper_attention_percent == 52 and today.hopper_attention_percent == 100
    # every other figure is today's stack's
    differs = {
        k
        for k, v in flash.model_dump().items()
        if v != today.model_dump()[k] and k not in ("id", "label", "default", "provenance")
    }
    assert differs == {"hopper_attention_percent"}
    options = {"batch_size": 1, "seq_len": 4096, "precision": "bf16"}
    stacks = (None, "pytorch2-cuda12-flash-attention-2")
    h100 = [predict("llama-3.2-1b", gpus=["h100-sxm"], stack=s, **options)[0] for s in stacks]
    a100 = [predict("llama-3.2-1b", gpus=["a100-sxm4-80gb"], stack=s, **options)[0] for s in stacks]
    assert h100[0].throughput and h100[1].throughput
    assert h100[1].throughput < h100[0].throughput
    assert a100[0].throughput == a100[1].throughput


def test_a_card_held_below_its_boost_clock_runs_large_gemms_at_its_measured_rate() -> None:
    from whichgpu.estimate.engine_speed import engine_rates

    catalog = load_catalog()
    params = load_parameters()
    t4 = catalog.resolve("tesla-t4")
    assert t4.sustained_tensor_tflops is not None and t4.fp16_tensor_tflops is not None
    rates = gpu_rates(t4)
    assert rates.tensor_power_share == pytest.approx(
        t4.sustained_tensor_tflops / (params.tensor_efficiency * t4.fp16_tensor_tflops)
    )
    big = _table(["gemm", "elementwise"], ["float16", "float16"], [1e16, 0], [0, 1e9])
    step = step_time(big, rates, "fp16", params)
    work = 1e16 / rates.sm_count
    ramp = work / (work + params.half_work_flops_per_sm)
    gemm_s = 1e16 / (t4.sustained_tensor_tflops * 1e12 * ramp)
    stream_s = 1e9 / (rates.bandwidth_bytes_per_s * params.memory_efficiency)  # not held back
    assert step.step_time_s == pytest.approx(gemm_s + stream_s)
    # the MFU keeps the datasheet peak; a card without a measurement keeps its rate
    assert rates.tensor_flops_per_s == t4.fp16_tensor_tflops * 1e12
    assert gpu_rates(catalog.resolve("l40s")).tensor_power_share == 1.0
    l4 = catalog.resolve("l4")
    served, notes = engine_rates(l4, gpu_rates(l4), "bf16")
    assert served.tensor_flops_per_s == pytest.approx(l4.sustained_tensor_tflops * 1e12)
    assert any("power limit" in n for n in notes)
    (estimate,) = predict("gpt2", gpus=["tesla-t4"], precision="fp16", batch_size=2)
    assert any("cannot hold its boost clock" in a for a in estimate.assumptions)


def test_batch_norm_reads_twice_and_half_precision_nchw_convolutions_transpose() -> None:
    from whichgpu.estimate.throughput import (
        EXTRA_READS,
        backward_split_bytes,
        layout_bytes,
        op_table,
    )
    from whichgpu.workloads import get_workload, run_config

    # forward of a 3x3 conv, 64 -> 128 channels, stride 2, on 2 x 56 x 56: input and output
    # each read once and written once more in 2-byte elements
    x, y = 2 * 64 * 56 * 56, 2 * 128 * 28 * 28
    assert layout_bytes([2, 64, 56, 56, 128, 3, 3, 2, 1], False) == 4 * (x + y)
    assert layout_bytes([2, 64, 56, 56, 128, 3, 3, 2, 1], True) == 4 * (2 * x + y)
    for precision in ("bf16", "fp32"):
        profile, _ = wg.scalable_profile(get_workload("resnet50"), run_config(precision=precision))
        table = op_table(profile, 4, None)
        step = profile.at(4, None)
        for i, op in enumerate(step.ops):
            traced = op.bytes_read + op.bytes_written
            if op.name in EXTRA_READS:
                extra_read = EXTRA_READS[op.name] * op.bytes_read
                assert table.bytes_moved[i] == pytest.approx(traced + extra_read)
            elif op.kind == "conv":
                assert op.conv is not None
                backward = op.phase == "backward"
                half = precision == "bf16"
                extra = layout_bytes(list(op.conv), backward) if half else 0.0
                if backward:
                    element = 2 if half else 4
                    extra += backward_split_bytes(list(op.conv), element, half, op.bytes_written)
                assert table.bytes_moved[i] == pytest.approx(traced + extra)
            else:
                assert table.bytes_moved[i] == traced


def test_convolution_backward_is_two_kernels_each_reading_the_output_gradient() -> None:
    from whichgpu.estimate.throughput import backward_split_bytes, op_table
    from whichgpu.workloads import get_workload, run_config

    # 3x3 conv, 64 -> 128 channels, stride 2, on 2 x 56 x 56: dY has 2 x 128 x 28 x 28
    # elements; dgrad and wgrad each read it (one more read), and on NCHW 16-bit tensors each
    # transposes it (one more read and write)
    conv = [2, 64, 56, 56, 128, 3, 3, 2, 1]
    x, y = 2 * 64 * 56 * 56, 2 * 128 * 28 * 28
    assert backward_split_bytes(conv, 2, True, 2.0 * x) == 2 * 3 * y
    assert backward_split_bytes(conv, 4, False, 4.0 * x) == 4 * y
    # the first layer's backward computes only the weight gradient: one kernel
    assert backward_split_bytes(conv, 2, True, 2.0 * 64 * 128 * 9) == 0.0
    profile, _ = wg.scalable_profile(get_workload("resnet50"), run_config(precision="bf16"))
    step = profile.at(4, None)
    table = op_table(profile, 4, None)
    first = next(i for i, op in enumerate(step.ops) if op.name == "aten.convolution_backward")
    # the backward order ends at the stem, whose input (the images) needs no gradient
    last = max(i for i, op in enumerate(step.ops) if op.name == "aten.convolution_backward")
    last_op = step.ops[last]
    assert last_op.conv is not None and last_op.conv[1] == 3
    assert backward_split_bytes(list(last_op.conv), 2, True, last_op.bytes_written) == 0.0
    # the first backward convolution (the last layer's) computes both gradients
    assert table.bytes_moved[first] > step.ops[first].bytes_read + step.ops[first].bytes_written


def test_multi_pass_kernels_read_their_inputs_again() -> None:
    from whichgpu.estimate.throughput import (
        BATCH_NORM_OPS,
        EXTRA_READS,
        LAYER_NORM_BACKWARD_OPS,
        LOG_SOFTMAX_BACKWARD_OPS,
        LOG_SOFTMAX_OPS,
        op_table,
    )
    from whichgpu.workloads import get_workload, run_config

    assert all(EXTRA_READS[name] == 1.0 for name in (*BATCH_NORM_OPS, *LAYER_NORM_BACKWARD_OPS))
    # cunn_SoftMaxForward: max, sum of exponentials, output (3 reads); backward: the output
    # gradient twice and the output once (4 reads of 2 traced inputs)
    assert EXTRA_READS[LOG_SOFTMAX_OPS[0]] == 2.0
    assert EXTRA_READS[LOG_SOFTMAX_BACKWARD_OPS[0]] == 0.5
    profile, _ = wg.scalable_profile(get_workload("gpt2"), run_config(precision="bf16"))
    table = op_table(profile, 2, 128)
    step = profile.at(2, 128)
    (row,) = [i for i, op in enumerate(step.ops) if op.name == LOG_SOFTMAX_OPS[0]]
    op = step.ops[row]
    assert table.bytes_moved[row] == 3 * op.bytes_read + op.bytes_written


def test_sharded_optimizer_steps_one_gpus_shard() -> None:
    from whichgpu.estimate.throughput import SHARDED_OPTIMIZER, op_table, shard_optimizer
    from whichgpu.workloads import get_workload, run_config

    assert set(SHARDED_OPTIMIZER) == {"zero1", "zero2", "zero3", "fsdp", "hsdp"}
    profile, _ = wg.scalable_profile(get_workload("gpt2"), run_config(precision="bf16"))
    table = op_table(profile, 2, 128)
    sharded = shard_optimizer(table, 8)
    optimizer = table.phases == "optimizer"
    assert optimizer.any() and (~optimizer).any()
    assert np.allclose(sharded.bytes_moved[optimizer], table.bytes_moved[optimizer] / 8)
    assert np.array_equal(sharded.bytes_moved[~optimizer], table.bytes_moved[~optimizer])
    assert shard_optimizer(table, 1) is table
    ddp, fsdp = (
        predict("gpt2", gpus=["h100-sxm"], gpu_count=8, batch_size=4, sharding=s)[0]
        for s in ("ddp", "fsdp")
    )
    assert ddp.step_time_s is not None and fsdp.step_time_s is not None
    # FSDP gathers parameters (more exchange, hidden behind the step) but steps 1/8 of AdamW
    assert fsdp.time_shares["memory"] * fsdp.step_time_s < (
        ddp.time_shares["memory"] * ddp.step_time_s
    )


def test_predictions_take_no_2020_speed_factor_once_fitted_on_todays_runs() -> None:
    params = load_parameters()
    assert params.today_sources
    assert params.prediction_factor("bert-base", "encoders") == 1.0
    assert "no speed factor" in params.prediction_factor_origin("bert-base", "encoders")
    old = replace(params, today_sources=())
    assert old.prediction_factor("bert-base", "encoders") == params.workload_factors["bert-base"]
    (e,) = predict("bert-large", gpus=["h100-sxm"], seq_len=128)
    assert any("x1.00: no speed factor" in a for a in e.assumptions)


def test_quantized_weights_are_read_in_their_format_but_the_head_and_the_rest() -> None:
    """quantize_weights: a weight product at 1 token reads K x N x 2 bytes in 16 bits, so its
    stored weight is FLOPs / tokens x the format's ratio, streamed at the kernel's share; the
    head (hidden x vocabulary) stays; an expert row's bytes are every expert's weights."""
    from dataclasses import replace as with_

    from whichgpu.estimate.throughput import quantize_weights

    hidden, vocab, k = 64, 1000, 128
    flops = [2.0 * k * k, 2.0 * hidden * vocab, 2.0 * k * k, 100.0]
    moved = [2.0 * k * k + 4 * k, 2.0 * hidden * vocab + 4000, 8 * 2.0 * k * k, 400.0]
    table = _table(["gemm", "gemm", "gemm", "elementwise"], ["bfloat16"] * 4, flops, moved)
    table = with_(table, is_experts=np.array([False, False, True, False]))
    out = quantize_weights(table, 1, 0.25, hidden * vocab, 1, bandwidth_ratio=0.5)
    assert out.bytes_moved[0] == pytest.approx(4 * k + 2.0 * k * k * 0.25 / 0.5)
    assert out.bytes_moved[1] == moved[1]  # the head
    assert out.bytes_moved[2] == pytest.approx(moved[2] * 0.25 / 0.5)  # all eight experts
    assert out.bytes_moved[3] == moved[3]
    assert np.array_equal(out.flops, table.flops)
