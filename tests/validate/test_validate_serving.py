"""Published serving measurements against ``predict --serving`` (``whichgpu.validate.serving``)."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources

import pytest

import whichgpu.api as wg
from whichgpu.schema import ReferenceThroughputCase
from whichgpu.validate.serving import (
    FITTED_QUANTITIES,
    QUANTITIES,
    by_publication,
    fit_serving,
    fitted_rows,
    serving_rows,
    serving_throughput,
)
from whichgpu.validate.summary import SOURCES
from whichgpu.workloads import run_config


def test_every_row_names_a_catalog_gpu_a_workload_and_a_known_quantity() -> None:
    rows = serving_rows()
    assert len(rows) >= 10
    catalog = wg.load_catalog()
    for row in rows:
        assert catalog.resolve(row.gpu) is not None
        assert row.quantity in QUANTITIES and row.value > 0
        assert row.engine in ("vllm", "tensorrt-llm", "compiled")
    assert "serving" in SOURCES


def test_a_row_with_its_requests_is_the_simulated_benchmark_run_with_a_time_error() -> None:
    (row,) = [
        r
        for r in serving_rows()
        if r.source_id == "musgrave-vllm-a100" and r.concurrency == 1 and r.quantity == "tpot_ms"
    ]
    assert row.requests == 20  # vllm bench serve --num-prompts 20 x concurrency
    (case,) = serving_throughput([row])
    (estimate,) = wg.predict(
        "llama-3.1-8b",
        gpus=["a100-40gb"],
        serving="vllm",
        mode="inference",
        concurrency=1,
        context=1024,
        new_tokens=128,
        requests=20,
    )
    speed = estimate.serving_speed
    assert speed is not None and speed.benchmark is not None
    assert speed.benchmark.mean_tpot_s is not None
    assert case.quantity == "TPOT ms"
    assert case.predicted == pytest.approx(speed.benchmark.mean_tpot_s * 1000)
    assert case.error == pytest.approx(row.value / case.predicted - 1)  # positive: faster


def test_a_row_of_varying_lengths_is_the_steady_state() -> None:
    (row,) = [r for r in serving_rows() if r.source_id == "lambda-vllm-benchmark"]
    assert row.requests is None and row.statistic == "median"
    (case,) = serving_throughput([row])
    (estimate,) = wg.predict(
        row.workload,
        gpus=[row.gpu],
        serving="vllm",
        mode="inference",
        concurrency=row.concurrency,
        context=row.input_tokens,
        new_tokens=row.output_tokens,
    )
    speed = estimate.serving_speed
    assert speed is not None and speed.tpot_s is not None and speed.benchmark is None
    assert case.predicted == pytest.approx(speed.tpot_s * 1000)


def test_an_unbounded_row_is_predicted_at_the_most_the_engine_holds() -> None:
    row = next(r for r in serving_rows() if r.concurrency is None and r.workload == "llama-3.1-8b")
    (case,) = serving_throughput([row])
    (estimate,) = wg.predict(
        row.workload,
        gpus=[row.gpu],
        serving=row.engine,
        quantization="fp8",
        kv_cache_dtype=row.kv_cache_dtype,
        mode="inference",
        concurrency=1,
        context=row.input_tokens,
        new_tokens=row.output_tokens,
    )
    assert estimate.serving_speed is not None
    assert case.run.batch_size == estimate.serving_speed.max_concurrency
    assert case.predicted is not None and case.error == pytest.approx(
        case.predicted / row.value - 1
    )


def test_a_compiled_decoding_row_is_predict_compile_of_the_request() -> None:
    """torchao's batch-1 compiled decoding: predict --compile (no engine) with the row's
    quantization; its generated tokens/s over the whole request, prefill included."""
    (row,) = [
        r
        for r in serving_rows()
        if r.engine == "compiled" and r.gpu == "h100-sxm" and r.quantization == "int4"
    ]
    assert row.output_tokens == 200
    row = replace(row, output_tokens=128)  # the shipped trace's length: the same path, no trace
    (case,) = serving_throughput([row])
    (estimate,) = wg.predict(
        "llama-3.1-8b",
        gpus=["h100-sxm"],
        mode="inference",
        compile=True,
        quantization="int4",
        concurrency=1,
        context=row.input_tokens,
        new_tokens=row.output_tokens,
    )
    assert case.quantity == "compiled decoding tokens/s"
    assert case.predicted == pytest.approx(estimate.throughput)
    assert case.error == pytest.approx(case.predicted / row.value - 1)


def test_a_first_token_latency_row_is_one_prompt_prefilled_alone() -> None:
    """TensorRT-LLM 0.9.0's low-latency table: batch 1, one output token, so the TTFT of a
    run of one request is its prompt's prefill step and nothing else."""
    (row,) = [
        r
        for r in serving_rows()
        if r.source_id == "trtllm-performance-v0.9"
        and r.gpu == "a100-sxm4-80gb"
        and r.workload == "mistral-7b"
        and r.input_tokens == 2048
    ]
    assert (row.concurrency, row.requests, row.output_tokens) == (1, 1, 1)
    # asked of a smaller model in bf16, whose eager step is quicker to trace: the same path
    row = replace(row, workload="llama-3.2-1b", precision="bf16")
    (case,) = serving_throughput([row])
    (estimate,) = wg.predict(
        "llama-3.2-1b",
        gpus=["a100-sxm4-80gb"],
        serving="tensorrt-llm",
        mode="inference",
        concurrency=1,
        context=2048,
        new_tokens=1,
    )
    speed = estimate.serving_speed
    assert speed is not None and case.predicted is not None
    assert case.predicted == pytest.approx(speed.ttft_s * 1000, rel=1e-6)
    assert case.publication == "trtllm-performance-v0.9"


def test_the_summary_of_a_quantity_breaks_down_by_publication() -> None:
    base = {"source": "serving", "workload": "gpt2", "gpu": "h100-sxm", "quantity": "TTFT ms"}
    run = run_config(mode="inference")
    cases = [
        ReferenceThroughputCase(
            **base, case=str(i), run=run, measured=1.0, predicted=1.0, error=e, publication=p
        )
        for i, (e, p) in enumerate([(0.1, "a"), (-0.3, "a"), (0.5, "b"), (0.2, "c")])
    ]
    assert by_publication(cases) == "a 2: 20.0%; b 1: 50.0%; c 1: 20.0%"
    assert by_publication(cases[:2]) == ""  # one publication: the summary says it all


def _cases(errors: list[tuple[float, str]]) -> list[ReferenceThroughputCase]:
    base = {"source": "serving", "workload": "gpt2", "gpu": "h100-sxm", "quantity": "TPOT ms"}
    run = run_config(mode="inference")
    return [
        ReferenceThroughputCase(
            **base, case=str(i), run=run, measured=1.0, predicted=1.0, error=e, publication=p
        )
        for i, (e, p) in enumerate(errors)
    ]


def test_the_serving_fit_keeps_the_least_log_error_and_leaves_each_source_out() -> None:
    # publication a fits (0.6, 0.7) best, b fits (0.7, 0.7); together (0.6, 0.7): a has more rows
    by_point = {
        (0.5, 0.7): _cases([(-0.2, "a"), (-0.2, "a"), (-0.3, "b")]),
        (0.6, 0.7): _cases([(0.0, "a"), (0.02, "a"), (-0.1, "b")]),
        (0.7, 0.7): _cases([(0.15, "a"), (0.15, "a"), (0.01, "b")]),
        (0.6, 0.5): _cases([(-0.1, "a"), (-0.1, "a"), (-0.2, "b")]),
    }
    fit = fit_serving(by_point)
    assert fit.point == (0.6, 0.7) and fit.rows == 3
    assert fit.in_sample == pytest.approx({"a": 0.01, "b": 0.1})
    # each publication is predicted at the point fitted to the other alone
    assert fit.held_out_point == {"a": (0.7, 0.7), "b": (0.6, 0.7)}
    assert fit.held_out == pytest.approx({"a": 0.15, "b": 0.1})
    assert fit.held_out_all == pytest.approx((0.15 + 0.15 + 0.1) / 3)


def test_the_serving_constants_are_fitted_to_throughput_and_tpot_rows_not_ttft() -> None:
    rows = fitted_rows()
    assert rows and all(r.quantity in FITTED_QUANTITIES for r in rows)
    assert "ttft_ms" not in FITTED_QUANTITIES
    assert len(rows) == sum(1 for r in serving_rows() if r.quantity != "ttft_ms")
    with pytest.raises(ValueError, match="no points"):
        fit_serving({})


def test_every_publication_of_the_table_is_described_in_its_readme() -> None:
    """A row's source, version and settings live in the README beside the table: each
    ``source_id`` has its entry there."""
    readme = resources.files("whichgpu.validate").joinpath("data", "serving", "README.md")
    text = readme.read_text(encoding="utf-8")
    for source_id in sorted({r.source_id for r in serving_rows()}):
        assert f"- `{source_id}`:" in text, source_id
