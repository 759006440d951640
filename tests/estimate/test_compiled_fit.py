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


def test_compiled_decoding_holds_what_the_eager_request_holds() -> None:
    asked = {"mode": "inference", "context": 64, "new_tokens": 8, "concurrency": 2}
    (eager,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], **asked)
    (compiled,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **asked)
    assert compiled.peak_reserved_bytes == eager.peak_reserved_bytes
    assert compiled.max_batch_size == eager.max_batch_size
    assert "compiled decoding" in compiled.run.describe()


def test_compile_refuses_inference_of_a_model_that_does_not_generate() -> None:
    with pytest.raises(UsageError, match="does not generate, and its compiled forward pass"):
        fit("resnet50", gpus=["h100-sxm"], compile=True, mode="inference")


@pytest.mark.parametrize("policy", ["full", "selective", "every-2"])
def test_compiled_and_checkpointed(policy: str) -> None:
    """The checkpointed step's peak less what the partition of the checkpointed step (its
    regions tagged) does not save: less than the eager checkpointed step, never less than
    the compiled step without checkpointing keeps."""
    asked = {**SIZES, "checkpointing_policy": policy}
    (eager,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], **asked)
    (compiled,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **asked)
    (plain,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **SIZES)
    saved = compiled_activations(
        config_workload(TINY_LLAMA),
        run_config(**SIZES, checkpointing=True, checkpointing_policy=policy),
        SIZES["batch_size"],
        SIZES["seq_len"],
    )
    cut = eager.peak_allocated_bytes - compiled.peak_allocated_bytes
    assert cut == pytest.approx(saved.saved_bytes_difference, rel=0.01)
    assert compiled.breakdown["activations"] < plain.breakdown["activations"]
    assert compiled.run.checkpointing and compiled.run.compile
    assert any("inside the checkpointed layers" in a for a in compiled.assumptions)


def test_compiled_saving_on_data_parallel_gpus_not_on_split_ones() -> None:
    """Each data-parallel GPU runs the whole step on its own micro-batch, so a compiled step
    saves there what it saves on one GPU; where tensor parallel splits the micro-batch's
    activations the eager memory is given, and the assumptions say so."""
    for sharding in ("ddp", "fsdp"):
        asked = {**SIZES, "gpu_count": 2, "sharding": sharding}
        (eager,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], **asked)
        (compiled,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **asked)
        cut = eager.peak_allocated_bytes - compiled.peak_allocated_bytes
        assert cut > 0
        assert compiled.breakdown["activations"] == eager.breakdown["activations"] - cut
    split = {**SIZES, "gpu_count": 2, "tensor_parallel": 2}
    (eager,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], **split)
    (compiled,) = fit(config=TINY_LLAMA, gpus=["h100-sxm"], compile=True, **split)
    assert compiled.peak_allocated_bytes == eager.peak_allocated_bytes
    assert any("tensor, pipeline or context parallel" in a for a in compiled.assumptions)


def test_cli_fit_compile_json() -> None:
    cli = run_cli(
        *("fit", "--config", str(TINY_LLAMA), "--gpu", "h100-sxm", "--batch-size", "4"),
        *("--seq-len", "64", "--compile", "--json"),
    )
    assert cli.returncode == 0, cli.stderr
    (row,) = json.loads(cli.stdout)
    assert row["run"]["compile"] is True
    assert any(a.startswith("torch.compile: ") for a in row["assumptions"])
    both = run_cli(
        *("fit", "--config", str(TINY_LLAMA), "--gpu", "h100-sxm", "--batch-size", "4"),
        *("--seq-len", "64", "--compile", "--checkpointing-policy", "selective", "--json"),
    )
    assert both.returncode == 0, both.stderr
    (row,) = json.loads(both.stdout)
    assert row["run"]["compile"] and row["run"]["checkpointing_policy"] == "selective"
