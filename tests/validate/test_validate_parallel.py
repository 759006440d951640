"""Published tensor- and pipeline-parallel training against ``predict``
(``whichgpu.validate.parallel``)."""

from __future__ import annotations

import dataclasses

import pytest

from whichgpu.estimate.throughput import load_parameters
from whichgpu.schema import ReferenceThroughputCase
from whichgpu.validate.parallel import (
    ParallelRow,
    left_out_rows,
    parallel_rows,
    parallel_throughput,
    split_ratios,
)
from whichgpu.validate.summary import SOURCE_SETTINGS, SOURCE_TITLES, SOURCES, chosen_sources
from whichgpu.validate.throughput import validate_throughput
from whichgpu.validate.timing import UNFIT_NOTE, predict_even_if_unfit
from whichgpu.workloads import run_config


def _row(source: str, model: str, gpu: str, **match: object) -> ParallelRow:
    """The first row of ``source`` for ``model`` on ``gpu`` (with the fields ``match``)."""
    return next(
        r
        for r in parallel_rows()
        if (r.source_id, r.model, r.gpu) == (source, model, gpu)
        and all(getattr(r, k) == v for k, v in match.items())
    )


def test_the_table_parses_with_its_counts_and_empty_cells() -> None:
    rows = parallel_rows()
    assert len(rows) == 45
    assert "parallel" in SOURCES and "parallel" in SOURCE_TITLES and "parallel" in SOURCE_SETTINGS
    assert chosen_sources(["parallel", "serving"]) == ("serving", "parallel")
    row = _row("mbridge-perf-25.09", "llama-3.1-70b", "h100-sxm")
    assert (row.gpus, row.tp, row.pp, row.cp, row.vp, row.ep, row.dp) == (64, 4, 8, 1, 5, 1, 2)
    assert (row.micro_batch, row.global_batch, row.seq_len) == (1, 128, 8192)
    assert row.precision == "fp8" and row.tokens_per_s_per_gpu == 1619.0
    assert row.layout == "TP4 PP8 VP5 DP2" and row.model_parallel
    longseq = [r for r in rows if r.source_id == "nemo-longseq-25.04rc2"]
    assert len(longseq) == 8
    assert all(r.micro_batch is None and r.tokens_per_s_per_gpu is None for r in longseq)
    assert all(r.vp is None and r.ep is None for r in longseq)
    for r in rows:  # each row's split covers its GPUs
        assert r.dp * r.tp * r.pp * (r.cp or 1) == r.gpus, r.case


def test_every_row_is_compared_or_left_out_with_a_reason() -> None:
    rows = parallel_rows()
    out = left_out_rows(rows)
    assert all(why for _, why in out)
    left = {id(r) for r, _ in out}
    compared = [r for r in rows if id(r) not in left]
    assert len(compared) + len(out) == len(rows)
    # 16 GB200 rows in one NVL72 rack; 8 context parallel; 5 long-sequence rows read from
    # TFLOP/s; 2 Mixtral rows with expert parallel 8
    assert len(compared) == 11 + 16 + 8 + 5 + 2
    assert {r.gpu for r in compared} == {"h100-sxm", "b200", "gb200"}
    experts = [r for r in compared if (r.ep or 1) > 1]
    assert [(r.model, r.ep, r.run().expert_parallel) for r in experts] == [
        ("mixtral-8x7b", 8, 8)
    ] * 2
    assert all("grouped products in bf16" in r.settings() for r in experts)
    assert sum((r.cp or 1) > 1 for r in compared) == 8 + 3
    assert sum(r.derived for r in compared) == 5
    for r, why in out:
        assert r.source_id == "nemo-longseq-25.04rc2"  # 256K to 1024K
        assert r.seq_len > 131072 and "beyond llama-3.1-8b's 131,072 positions" in why


def test_grad_accum_is_the_global_batch_over_micro_batch_times_dp() -> None:
    assert _row("mbridge-perf-25.09", "llama-3.1-70b", "h100-sxm").grad_accum() == 64
    assert _row("mbridge-perf-26.02", "llama-3.1-70b", "h100-sxm").grad_accum() == 128
    assert _row("mbridge-perf-25.11", "llama-3.1-8b", "h100-sxm").grad_accum() == 16
    b200 = _row("mbridge-perf-25.11", "llama-3.1-8b", "b200")
    assert b200.grad_accum() == 8 and not b200.left_out_reasons()
    run = b200.run()
    assert (run.grad_accum, run.batch_size, run.data_parallel()) == (8, 2, 8)
    assert run.global_batch_size() == b200.global_batch == 128
    split = _row("mbridge-perf-25.09", "llama-3.1-70b", "h100-sxm").run()
    assert (split.tensor_parallel, split.pipeline_parallel, split.virtual_stages) == (4, 8, 5)
    assert split.data_parallel() == 2 and split.global_batch_size() == 128
    uneven = dataclasses.replace(b200, global_batch=100)  # 100 / (2 x 8)
    assert uneven.grad_accum() is None
    assert any("not a whole number" in why for why in uneven.left_out_reasons())


def test_fsdp_is_read_from_the_notes_else_the_distributed_optimizer_zero1() -> None:
    assert _row("mbridge-perf-25.11", "llama-3.1-8b", "h100-sxm").sharding == "fsdp"  # FSDP on
    assert _row("mbridge-perf-25.11", "llama-3.1-8b", "b200").sharding == "zero1"  # FSDP=0
    assert _row("mbridge-perf-25.11", "llama-3.1-70b", "gb200").sharding == "fsdp"
    assert _row("mbridge-perf-26.02", "llama-3.1-70b", "gb200", tp=1).sharding == "fsdp"
    assert _row("nemo-perf-25.04", "llama-3.1-70b", "gb200").sharding == "fsdp"  # FSDP=1
    assert _row("nemo-perf-25.04", "llama-3.1-8b", "gb200").sharding == "zero1"  # FSDP=0 (DDP)
    assert _row("nemo-perf-25.02", "llama-3.1-8b", "b200").sharding == "zero1"  # not mentioned


def test_a_context_parallel_row_is_predicted_with_its_split() -> None:
    row = _row("nemo-perf-24.07", "llama-3.1-8b", "h100-sxm")
    assert row.cp == 2 and row.left_out_reasons() == [] and row.model_parallel
    run = row.run()
    assert (run.context_parallel, run.data_parallel(), run.state_group()) == (2, 4, 8)
    assert run.grad_accum == 32 and run.global_batch_size() == row.global_batch == 128
    (case,) = parallel_throughput([row])
    assert case.predicted is not None and case.error is not None
    assert case.error == pytest.approx(case.predicted / 12036 - 1)
    assert case.note.startswith("8 GPUs, CP2 DP4, micro-batch 1, grad_accum 32, L8192")
    # at 8,192 tokens the ring hides behind attention over NVLink: per GPU, the same speed as
    # the eight GPUs each running whole sequences (to the launches of the smaller kernels)
    plain = dataclasses.replace(row, cp=1, dp=8)
    (whole,) = parallel_throughput([plain])
    assert whole.predicted is not None
    assert case.predicted == pytest.approx(whole.predicted, rel=0.01)
    # the long-sequence study's rows give TFLOP/s only; those beyond the model's positions are
    # listed, unpredicted, with why
    beyond = [r for r in parallel_rows() if r.seq_len > 131072]
    assert len(beyond) == 3 and all(r.tokens_per_s_per_gpu is None for r in beyond)
    cases = parallel_throughput(beyond)
    assert len(cases) == 3 and all(c.predicted is None for c in cases)
    assert all("beyond llama-3.1-8b's 131,072 positions" in c.note for c in cases)


def test_a_small_model_is_compared_with_predict() -> None:
    h100 = _row("mbridge-perf-25.11", "llama-3.1-8b", "h100-sxm")
    b200 = _row("mbridge-perf-25.11", "llama-3.1-8b", "b200")
    cases = parallel_throughput([h100, b200])
    assert [c.case for c in cases] == [
        "mbridge-perf-25.11 llama-3.1-8b DP8",
        "mbridge-perf-25.11 llama-3.1-8b DP8",
    ]
    run = run_config(
        mode="train",
        gpus=8,
        grad_accum=16,
        seq_len=8192,
        batch_size=1,
        precision="fp8",
        sharding="fsdp",
        compile=True,  # Transformer Engine's fused kernels, as a compiled step's
    )
    estimate, fits = predict_even_if_unfit("llama-3.1-8b", "h100-sxm", run)
    assert estimate.throughput is not None
    case = cases[0]
    assert case.predicted is not None and case.error is not None
    assert case.run == run and case.gpu == "h100-sxm" and case.quantity == "tokens/s per GPU"
    assert case.predicted == pytest.approx(estimate.throughput / 8)
    assert case.error == pytest.approx(case.predicted / 14451 - 1)
    assert case.fits == fits and (UNFIT_NOTE in case.note) == (not fits)
    assert case.note.startswith("8 GPUs, DP8, micro-batch 1, grad_accum 16, L8192, fp8, fsdp")
    assert -0.8 < case.error < 0.8  # a prediction of the right order, either way
    assert case.note.endswith("fused kernels as --compile") or UNFIT_NOTE in case.note
    assert any(a.startswith("torch.compile (inductor") for a in estimate.assumptions)
    other = cases[1]
    assert other.run.sharding == "zero1" and other.run.batch_size == 2
    assert other.predicted is not None and other.predicted > case.predicted  # B200 is faster


def _case(row: ParallelRow, predicted: float) -> ReferenceThroughputCase:
    return ReferenceThroughputCase(
        source="parallel",
        case=row.case,
        workload=row.model,
        gpu=row.gpu,
        run=run_config(mode="train", gpus=row.gpus),
        quantity="tokens/s per GPU",
        measured=row.tokens_per_s_per_gpu or 0.0,
        predicted=predicted,
        error=predicted / (row.tokens_per_s_per_gpu or 1.0) - 1,
    )


def test_the_summary_gives_the_split_over_data_parallel_ratio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    split = _row("mbridge-perf-25.09", "llama-3.1-70b", "h100-sxm")
    plain = _row("mbridge-perf-25.09", "llama-3.1-8b", "h100-sxm")
    lone = _row("mbridge-perf-26.02", "llama-3.1-70b", "h100-sxm")  # no DP row on its page
    b200 = _row("mbridge-perf-25.09", "llama-3.1-8b", "b200")  # the same case on another GPU
    assert b200.case == plain.case
    cases = [_case(split, 800.0), _case(plain, 8000.0), _case(b200, 20000.0), _case(lone, 900.0)]
    (ratio,) = split_ratios(cases)
    assert ratio == (
        "mbridge-perf-25.09 h100-sxm: 70B TP4 PP8 VP5 / 8B DP8 measured "
        f"{1619 / 14079:.3f}, predicted 0.100"
    )
    import whichgpu.validate.parallel as parallel

    monkeypatch.setattr(parallel, "parallel_throughput", lambda progress=None: cases)
    validation = validate_throughput(load_parameters(), sources=("parallel",))
    assert validation.sources == ("parallel",) and len(validation.references) == 4
    (summary,) = validation.summaries_by_source
    assert summary.source == "parallel" and summary.cases == 4
    assert summary.mean_error == pytest.approx(
        sum(c.error for c in cases if c.error is not None) / 4
    )
    assert ratio in summary.note and "3 rows left out (their notes say why)" in summary.note
    assert "without a published tokens/s" not in summary.note  # every row gives or implies one


def test_nvidia_counts_attention_whole_in_nemo_tables_and_halved_in_megatron_bridge() -> None:
    from whichgpu.validate.parallel import model_flops_per_token
    from whichgpu.workloads.hf import read_config

    both = [
        r
        for r in parallel_rows()
        if r.tokens_per_s_per_gpu and r.model_tflops_per_gpu and r.model.startswith("llama")
    ]
    assert len(both) >= 30
    for row in both:
        per_token = row.model_tflops_per_gpu * 1e12 / row.tokens_per_s_per_gpu  # type: ignore[operator]
        causal = row.source_id.startswith("mbridge-")
        counted = model_flops_per_token(read_config(row.model), row.seq_len, causal=causal)
        assert per_token == pytest.approx(counted, rel=0.003), row.case


def test_a_long_sequence_row_is_read_from_its_tflops_and_predicted() -> None:
    from whichgpu.validate.parallel import DERIVED_NOTE, model_flops_per_token
    from whichgpu.workloads.hf import read_config

    row = next(
        r for r in parallel_rows() if r.source_id == "nemo-longseq-25.04rc2" and r.seq_len == 32768
    )
    assert row.tokens_per_s_per_gpu is None and row.derived and row.cp == 2
    counted = model_flops_per_token(read_config("llama-3.1-8b"), 32768, causal=False)
    assert row.measured_tokens_per_s() == pytest.approx(1624e12 / counted)
    assert row.micro_batch_run() == 1 and row.grad_accum() == 128 // 4
    (case,) = parallel_throughput([row])
    assert case.predicted is not None and case.measured == row.measured_tokens_per_s()
    assert DERIVED_NOTE in case.note
