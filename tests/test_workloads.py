"""The workload registry, run configurations, and parameter counts against published ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from whichgpu.errors import UnknownWorkload, UnsupportedWorkload, UsageError
from whichgpu.schema import RunConfig
from whichgpu.workloads import all_workloads, check_for_workload, get_workload, run_config
from whichgpu.workloads.user import config_workload

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("typed", "slug"),
    [
        ("ResNet-50", "resnet50"),
        ("llama3.1-8b", "llama-3.1-8b"),
        ("GPT2-XL", "gpt2-xl"),
        ("vit_b_16", "vit-b-16"),
    ],
)
def test_near_misses_resolve(typed: str, slug: str) -> None:
    assert get_workload(typed).info.name == slug


def test_unknown_workload_suggests() -> None:
    with pytest.raises(UnknownWorkload) as err:
        get_workload("llama-3.1-9b")
    assert "llama-3.1-8b" in err.value.suggestions


def test_listing_does_not_import_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; "
        "from whichgpu.workloads import all_workloads; print(len(all_workloads()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 17


def test_every_workload_is_documented() -> None:
    for w in all_workloads():
        info = w.info
        assert info.description and info.task and info.params_source and info.reference
        assert info.is_sequence_model == (info.default_seq_len is not None)


# Parameter counts must equal the published ones exactly for transformers-built models: the
# figures are those of each model card's reference config (sources in each WorkloadInfo).
@pytest.mark.parametrize(
    "name", [w.info.name for w in all_workloads() if w.info.family in ("llm", "encoders", "vision")]
)
def test_parameter_count_matches_published(name: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    workload = get_workload(name)
    with FakeTensorMode():
        model = workload.build(RunConfig()).model
        count = sum(p.numel() for p in model.parameters())
    assert count == workload.info.params_published


def test_bf16_pure_builds_bf16_weights() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = get_workload("gpt2").build(RunConfig(precision="bf16-pure")).model
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "--batch-size must be at least 1"),
        ({"precision": "fp12"}, "--precision"),
        ({"context": 100}, "--mode inference only"),
        ({"mode": "inference", "method": "lora"}, "use --mode train"),
        ({"lora_targets": "q_proj"}, "--method lora or qlora"),
    ],
)
def test_run_options_that_cannot_work_together(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        run_config(**options)


def test_lora_targets_are_split() -> None:
    run = run_config(method="lora", lora_targets="q_proj, v_proj")
    assert run.lora_targets == ("q_proj", "v_proj")


def test_seq_len_does_not_apply_to_images() -> None:
    with pytest.raises(UnsupportedWorkload, match="--seq-len does not apply"):
        check_for_workload(RunConfig(seq_len=128), get_workload("resnet50").info)


def test_user_config(tmp_path: Path) -> None:
    workload = config_workload(FIXTURES / "tiny-llama.json")
    assert workload.info.task == "causal-lm" and workload.info.throughput_unit == "tokens"
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 3}')
    with pytest.raises(UsageError, match="model_type"):
        config_workload(bad)
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        config_workload(bad)
