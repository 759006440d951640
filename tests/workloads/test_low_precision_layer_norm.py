"""llm-foundry's ``low_precision_layernorm`` (``workloads.hf.low_precision_layer_norms``).

A config with ``"norm_type": "low_precision_layernorm"`` (the MPT models of llm-foundry's
benchmark table) runs its layer norms in the autocast dtype with autocast off, as llm-foundry's
``LPLayerNorm`` does; CUDA autocast's own table runs ``layer_norm`` in fp32.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from whichgpu.estimate.profile_summary import live_peak
from whichgpu.schema import RunConfig
from whichgpu.trace import trace_step
from whichgpu.workloads.user import config_workload

TINY_GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "vocab_size": 512,
    "n_positions": 128,
    "n_embd": 128,
    "n_layer": 2,
    "n_head": 4,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def _config(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / f"gpt2-{len(extra)}.json"
    path.write_text(json.dumps({**TINY_GPT2, **extra}), encoding="utf-8")
    return path


def test_layer_norms_run_in_bf16_under_autocast_and_keep_less(tmp_path: Path) -> None:
    run = RunConfig(precision="bf16", batch_size=4, seq_len=64)
    plain = trace_step(config_workload(_config(tmp_path)), run)
    low = trace_step(config_workload(_config(tmp_path, norm_type="low_precision_layernorm")), run)
    norms = [op for op in low.ops if "layer_norm" in op.name and op.phase == "forward"]
    assert norms and {op.dtype for op in norms} == {"bfloat16"}
    plain_norms = [op for op in plain.ops if "layer_norm" in op.name and op.phase == "forward"]
    assert {op.dtype for op in plain_norms} == {"float32"}  # CUDA autocast's table
    assert live_peak(low) < live_peak(plain)


def test_without_autocast_the_norm_is_the_plain_one() -> None:
    from torch import nn

    from whichgpu.workloads.hf import low_precision_layer_norms

    model = nn.Sequential(nn.LayerNorm(8))
    x = torch.randn(3, 8)
    expected = model(x)
    low_precision_layer_norms(model)
    assert torch.allclose(model(x), expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16
