"""The published recipe runs (``validate.recipes``): read as published, asked of ``fit`` and
``predict`` as they ran, summarised per quantity; answered from stored profiles and partitions."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit
from whichgpu.units import GIB
from whichgpu.validate.memory import validate_memory
from whichgpu.validate.recipes import SOURCE, recipe_runs, recipes_memory, recipes_throughput
from whichgpu.validate.timing import fit_options


def test_rows_are_read_as_published() -> None:
    runs = {r.run.precision: r for r in recipe_runs()}
    assert set(runs) == {"bf16", "fp8"}
    for r in runs.values():
        assert r.workload == "llama-3.1-8b" and r.gpu == "h100-sxm"
        run = r.run
        assert (run.gpus, run.sharding, run.batch_size, run.seq_len) == (8, "fsdp", 1, 8192)
        assert run.compile and run.checkpointing and run.checkpointing_policy == "selective"
    assert runs["bf16"].tokens_per_s_per_gpu == 6150
    assert runs["bf16"].peak_reserved_bytes == round(47.65 * GIB)
    assert runs["fp8"].tokens_per_s_per_gpu == 7689.5


@pytest.fixture(scope="module")
def memory_cases() -> list[object]:
    return recipes_memory()


def test_memory_is_fit_of_the_run(memory_cases: list[object]) -> None:
    bf16 = next(r for r in recipe_runs() if r.run.precision == "bf16")
    (estimate,) = fit(bf16.workload, gpus=[bf16.gpu], **fit_options(bf16.run))
    case = memory_cases[0]
    assert case.source == SOURCE and case.case == bf16.id  # type: ignore[attr-defined]
    assert case.predicted_reserved_bytes == estimate.peak_reserved_bytes  # type: ignore[attr-defined]
    error = estimate.peak_reserved_bytes / bf16.peak_reserved_bytes - 1
    assert case.reserved_error == pytest.approx(error)  # type: ignore[attr-defined]
    # compiled and selectively checkpointed, the runs' memory is within a few per cent
    for c in memory_cases:
        assert abs(c.reserved_error) < 0.03  # type: ignore[attr-defined]


def test_throughput_is_predict_per_gpu() -> None:
    cases = recipes_throughput()
    assert [c.quantity for c in cases] == ["tokens/s per GPU"] * 2
    for c in cases:
        assert c.predicted is not None and c.error == pytest.approx(c.predicted / c.measured - 1)
        assert c.fits


def test_summaries_and_cli() -> None:
    only = validate_memory(sources=(SOURCE,))
    assert len(only.recipe_runs) == 2 and only.sources == (SOURCE,)
    (line,) = only.summaries
    assert line.source == SOURCE and line.quantity == "peak reserved per GPU" and line.cases == 2
    result = run_cli("validate", "throughput", "--source", SOURCE, "--json")
    assert result.returncode == 0, result.stderr
    assert '"recipes"' in result.stdout and "tokens/s per GPU" in result.stdout
