"""The closed-form transformer path: exact parameter counts and model states, the step peak
against the replayed stored (traced) profiles, and no torch on import."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from whichgpu.errors import UnsupportedWorkload
from whichgpu.estimate import closed_form as cf
from whichgpu.estimate.memory import StepMemory
from whichgpu.profiles.stored import load_stored
from whichgpu.schema import RunConfig
from whichgpu.workloads.registry import get_workload

AMP = RunConfig(precision="bf16")


@pytest.mark.parametrize("workload", [*cf.closed_form_workloads(), "mixtral-8x7b"])
def test_parameter_count_is_exact(workload: str) -> None:
    shape = cf.parse_config(cf.workload_config(workload))
    profile = load_stored(workload, AMP)
    assert profile is not None
    assert cf.parameter_count(shape) == profile.params_total
    assert cf.parameter_count(shape) == get_workload(workload).info.params_published


def test_model_states_per_parameter() -> None:
    shape = cf.parse_config(cf.workload_config("llama-3.2-1b"))
    p = cf.parameter_count(shape)

    def per_param(**options: object) -> int:
        s = cf.model_states(shape, RunConfig.model_validate(options))
        total = s.weights_bytes + s.gradients_bytes + s.optimizer_bytes
        assert total % p == 0
        return total // p

    assert per_param(precision="bf16") == 16  # fp32 weights, grads, m, v
    assert per_param(precision="fp32") == 16
    assert per_param(precision="bf16-pure") == 8
    assert per_param(precision="bf16", optimizer="sgd") == 12  # one momentum buffer
    assert per_param(precision="bf16-pure", optimizer="sgd") == 6


def test_adamw_8bit_state_is_two_bytes_plus_absmax_blocks() -> None:
    shape = cf.parse_config(cf.workload_config("llama-3.2-1b"))
    states = cf.model_states(shape, RunConfig(precision="bf16", optimizer="adamw-8bit"))
    expected = 0
    for t in cf.parameter_tensors(shape):
        n = t.numel
        each = 2 * n + 8 * math.ceil(n / 256) if n >= 4096 else 8 * n
        expected += each * t.count
    assert states.optimizer_bytes == expected
    assert 2 < states.optimizer_bytes / states.params_total < 2.04


def test_lora_trains_only_the_adapters() -> None:
    shape = cf.parse_config(cf.workload_config("llama-3.2-1b"))
    states = cf.model_states(shape, RunConfig(precision="bf16", method="lora", lora_rank=16))
    # rank 16 on q, k, v, o, gate, up, down of 16 layers (a traced run gives the same count)
    assert states.params_trainable == 11_272_192
    assert states.optimizer_bytes == 8 * states.params_trainable


@pytest.mark.parametrize(
    ("workload", "precision", "batch_size", "seq_len"),
    [
        ("llama-3.2-1b", "bf16", 4, 2048),
        ("llama-3.1-8b", "bf16", 1, 512),
        ("qwen2.5-7b", "bf16", 16, 2048),
        ("gpt2", "bf16", 1, 512),
        ("gpt2-large", "bf16", 4, 1024),
        ("bert-base", "fp32", 4, 512),
        ("bert-squad", "bf16", 1, 384),
    ],
)
def test_peak_within_calibrated_tolerance_of_the_trace(
    workload: str, precision: str, batch_size: int, seq_len: int
) -> None:
    run = RunConfig(precision=precision)
    profile = load_stored(workload, run)
    assert profile is not None
    traced = StepMemory(profile).replay(batch_size, seq_len, ()).peak_allocated_bytes
    closed = cf.estimate(cf.workload_config(workload), run, batch_size, seq_len)
    assert traced <= closed.peak_allocated_bytes <= 1.05 * traced
    assert closed.peak_allocated_bytes == closed.phases[closed.peak_phase]


def test_cross_check_rows() -> None:
    rows = cf.cross_check(["gpt2"], points=[(2, 256)])
    assert len(rows) == 1
    row = rows[0]
    assert row.profile == "gpt2_train_bf16_adamw"
    assert 0 <= row.relative_error < 0.05
    assert row.relative_error == row.closed_form_bytes / row.traced_bytes - 1


def test_refuses_what_it_does_not_cover() -> None:
    with pytest.raises(UnsupportedWorkload, match="mixture-of-experts"):
        cf.estimate(cf.workload_config("mixtral-8x7b"), AMP, 1, 512)
    with pytest.raises(UnsupportedWorkload, match="model_type 'resnet'"):
        cf.parse_config(cf.workload_config("resnet50"))
    with pytest.raises(UnsupportedWorkload, match="LoRA"):
        cf.estimate(cf.workload_config("gpt2"), RunConfig(method="lora"), 1, 512)


def test_closed_form_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from whichgpu.estimate import closed_form as cf\n"
        "from whichgpu.schema import RunConfig\n"
        "cf.estimate(cf.workload_config('llama-3.2-1b'), RunConfig(), 1, 512)\n"
        "assert 'torch' not in sys.modules\n"
        "assert 'numpy' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_attention_is_fused_except_in_the_lambda_stand_ins() -> None:
    # bert-base stands for Lambda's TensorFlow BERT, whose scores were materialised: its
    # activations grow with the square of the length; bert-large (and any user config) runs
    # the fused kernel, whose saved bytes are linear in it.
    for workload, quadratic in (("bert-base", True), ("bert-large", False), ("gpt2", False)):
        config = cf.workload_config(workload)
        shape = cf.parse_config(config)
        assert shape.materialised_attention is quadratic
        terms = cf.activation_terms(shape, AMP)
        assert (terms.per_layer_token_position_bytes > 0) is quadratic
    user = dict(cf.workload_config("bert-base"))
    user.pop(cf.MATERIALISED_ATTENTION_KEY)
    assert not cf.parse_config(user).materialised_attention
