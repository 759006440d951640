"""fit --compile: the activations inductor's partitioner does not save leave the passes' peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit
from whichgpu.errors import UsageError
from whichgpu.trace.compiled import compiled_activations
from whichgpu.workloads import run_config
from whichgpu.workloads.user import config_workload

TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
SIZES = {"batch_size": 4, "seq_len": 64}


@pytest.fixture(scope="module")
def eager_and_compiled() -> tuple[object, object]:
    (eager,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], **SIZES)
    (compiled,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **SIZES)
    return eager, compiled


def test_compiled_peak_is_the_eager_one_less_what_min_cut_does_not_save(
    eager_and_compiled: tuple[object, object],
) -> None:
    eager, compiled = eager_and_compiled
    saved = compiled_activations(
        config_workload(TINY_LLAMA), run_config(**SIZES), SIZES["batch_size"], SIZES["seq_len"]
    )
    cut = eager.peak_allocated_bytes - compiled.peak_allocated_bytes  # type: ignore[attr-defined]
    # never more than the partitioner leaves out, and here the passes' peak decides
    assert 0 < cut <= saved.saved_bytes_difference
    assert cut == pytest.approx(saved.saved_bytes_difference, rel=0.01)
    assert compiled.peak_reserved_bytes == eager.peak_reserved_bytes - cut  # type: ignore[attr-defined]
    assert compiled.breakdown["activations"] == eager.breakdown["activations"] - cut  # type: ignore[attr-defined]
    assert compiled.max_batch_size >= eager.max_batch_size  # type: ignore[attr-defined]
    assert compiled.run.compile and "torch.compile" in compiled.run.describe()  # type: ignore[attr-defined]
    assert any("min_cut_rematerialization_partition" in a for a in compiled.assumptions)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "inference"}, "a compiled inference step is not modelled"),
        ({"checkpointing": True}, "inside checkpointed layers is not modelled"),
    ],
)
def test_compile_refuses_what_it_does_not_model(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **options)


def test_cli_fit_compile_json() -> None:
    cli = run_cli(
        *("fit", "--config", str(TINY_LLAMA), "--gpu", "h100-sxm", "--batch-size", "4"),
        *("--seq-len", "64", "--compile", "--json"),
    )
    assert cli.returncode == 0, cli.stderr
    (row,) = json.loads(cli.stdout)
    assert row["run"]["compile"] is True
    assert any(a.startswith("torch.compile: ") for a in row["assumptions"])
    refused = run_cli("fit", "--config", str(TINY_LLAMA), "--compile", "--checkpointing")
    assert refused.returncode == 2 and "--compile with --checkpointing" in refused.stderr
