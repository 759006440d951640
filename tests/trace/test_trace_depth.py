"""Tracing a deep model with a few layers and extending it: the extension must be the very
trace of the whole model, and anything the rule cannot explain must be traced whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from whichgpu.api import scalable_profile
from whichgpu.schema import RunConfig, StepProfile
from whichgpu.trace import depth
from whichgpu.trace.depth import DepthNotExtendable, DepthPlan, depth_plan, trace_extended
from whichgpu.trace.recorder import canonical_events
from whichgpu.trace.scaling import trace_scalable
from whichgpu.trace.step import trace_step
from whichgpu.workloads.base import Workload
from whichgpu.workloads.run_config import run_config
from whichgpu.workloads.user import config_workload

TINY_LLAMA = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
LAYERS = 9


@pytest.fixture
def deep_llama(tmp_path: Path) -> Workload:
    """The tiny Llama with ``LAYERS`` layers."""
    config = json.loads(TINY_LLAMA.read_text(encoding="utf-8"))
    path = tmp_path / "deep-llama.json"
    path.write_text(json.dumps({**config, "num_hidden_layers": LAYERS}), encoding="utf-8")
    return config_workload(path)


@pytest.fixture
def few_layers_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(depth, "MIN_LAYERS", LAYERS)


def _as_traced(profile: StepProfile, like: StepProfile) -> StepProfile:
    """A full trace as an extended one reads: frees in canonical order, the extension's note."""
    return profile.model_copy(
        update={
            "events": canonical_events(profile.events),
            "choices": {**profile.choices, "layers": like.choices["layers"]},
            "trace_seconds": like.trace_seconds,
        }
    )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"method": "lora"},
        {"checkpointing": True, "precision": "bf16-pure"},
        {"optimizer": "adamw-8bit", "precision": "fp32"},
        {"optimizer": "adafactor"},
        {"mode": "inference", "new_tokens": 8, "concurrency": 2, "context": 48},
    ],
    ids=[
        "amp-adamw",
        "lora",
        "checkpointing-bf16-pure",
        "adamw-8bit-fp32",
        "adafactor",  # a loop per parameter: repeats inside a layer
        "inference",
    ],
)
def test_extended_trace_is_the_full_trace(
    deep_llama: Workload, few_layers_enough: None, options: dict[str, Any]
) -> None:
    sizes = {} if options.get("mode") == "inference" else {"batch_size": 2, "seq_len": 48}
    run = run_config(**sizes, **options)
    plan = depth_plan(deep_llama, run)
    assert plan.layers == LAYERS
    extended = trace_extended(deep_llama, run, plan)
    full = trace_step(deep_llama, run)
    assert extended == _as_traced(full, extended)
    assert f"of its {LAYERS} layers" in extended.choices["layers"]


def test_deep_model_profile_says_it_was_extended(
    deep_llama: Workload, few_layers_enough: None
) -> None:
    heard: list[str] = []
    profile, how = scalable_profile(deep_llama, run_config(seq_len=64), progress=heard.append)
    assert "extended to 9" in profile.choices["layers"]
    assert how == f"traced; {profile.choices['layers']}"
    assert all(f"4-6 of its {LAYERS} layers" in message for message in heard)
    assert profile.params_total == sum(
        p.numel() for p in deep_llama.build(run_config()).model.parameters()
    )


def test_a_model_the_rule_does_not_explain_is_traced_whole(
    deep_llama: Workload, few_layers_enough: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> StepProfile:
        raise DepthNotExtendable("the 6-layer trace does not follow the rule.")

    monkeypatch.setattr(depth, "trace_extended", refuse)
    heard: list[str] = []
    profile = trace_scalable(deep_llama, run_config(seq_len=64), progress=heard.append)
    assert "layers" not in profile.choices
    assert any(f"Tracing all {LAYERS} layers instead" in message for message in heard)
    assert profile.params_total == depth_plan(deep_llama, RunConfig()).params_total


def test_shallow_models_are_traced_whole(deep_llama: Workload) -> None:
    with pytest.raises(DepthNotExtendable, match="only 9 layers"):
        depth_plan(deep_llama, RunConfig())


def test_layers_of_different_types_are_not_extended(
    tmp_path: Path, few_layers_enough: None
) -> None:
    config = {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": 256,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "use_sliding_window": True,
        "sliding_window": 16,
        "max_window_layers": 3,
    }
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(DepthNotExtendable, match="types"):
        depth_plan(config_workload(path), RunConfig())


def test_a_layer_unlike_the_others_is_found() -> None:
    layers = torch.nn.ModuleList(torch.nn.Linear(4, 4, device="meta") for _ in range(LAYERS))
    assert depth._unlike_layers(torch.nn.Sequential(layers), LAYERS) is None
    layers[5] = torch.nn.Linear(4, 8, device="meta")
    assert depth._unlike_layers(torch.nn.Sequential(layers), LAYERS) == (
        "layer 5 differs from layer 0."
    )


def test_a_layer_index_is_not_a_difference() -> None:
    class Block(torch.nn.Module):
        def __init__(self, layer_idx: int, window: int | None) -> None:
            super().__init__()
            self.layer_idx = layer_idx
            self.window = window

    alike = torch.nn.ModuleList(Block(i, None) for i in range(LAYERS))
    assert depth._unlike_layers(torch.nn.Sequential(alike), LAYERS) is None
    mixed = torch.nn.ModuleList(Block(i, 16 if i % 3 else None) for i in range(LAYERS))
    assert depth._unlike_layers(torch.nn.Sequential(mixed), LAYERS) == (
        "layer 1 differs from layer 0."
    )


def test_plan_counts_the_full_model(deep_llama: Workload, few_layers_enough: None) -> None:
    plan = depth_plan(deep_llama, RunConfig())
    built = deep_llama.build(RunConfig()).model
    assert plan == DepthPlan(layers=LAYERS, params_total=sum(p.numel() for p in built.parameters()))
