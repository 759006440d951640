"""``fit --fast``: the closed form's estimate on a GPU against the traced path, its refusals,
its CLI, and that it needs no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from whichgpu.api import fit
from whichgpu.errors import UsageError
from whichgpu.estimate import closed_form as cf
from whichgpu.estimate.closed_form import CrossCheckRow
from whichgpu.estimate.fast import METHOD
from whichgpu.report import json_doc, terminal
from whichgpu.schema import RunConfig

FACTOR = cf.load_coefficients().reserved_factor
SMALLEST_RATIO = 0.957
"""The smallest ratio of traced reserved bytes to closed-form allocated bytes on the stored
profiles (``scripts/calibrate_closed_form.py`` prints it beside the largest, the factor)."""
UPPER = 1.34
"""Fast / traced device total at most: a point can be up to ``FACTOR / SMALLEST_RATIO``
(+33.3 %) above its trace."""
GPUS = ["rtx-4090", "a100-sxm4-80gb", "h100-sxm"]

SMALL_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def test_the_factor_is_the_largest_ratio_and_above_one() -> None:
    assert 1.0 < FACTOR <= UPPER * SMALLEST_RATIO
    assert "--fit" in cf.load_coefficients().reserved_provenance
    assert cf.reserved_bytes(1000) == round(1000 * FACTOR)


@pytest.mark.parametrize(
    ("workload", "batch_size", "seq_len"),
    [
        ("llama-3.2-1b", 1, 2048),
        ("llama-3.2-1b", 16, 512),
        ("llama-3.1-8b", 4, 2048),
        ("qwen2.5-7b", 2, 1024),
        ("gpt2-large", 4, 1024),
        ("bert-base", 32, 512),
    ],
)
def test_fast_is_never_below_the_trace_and_within_the_stated_margin(
    workload: str, batch_size: int, seq_len: int
) -> None:
    options: dict[str, Any] = {"batch_size": batch_size, "seq_len": seq_len, "gpus": GPUS}
    traced = {e.gpu: e for e in fit(workload, **options)}
    fast = {e.gpu: e for e in fit(workload, fast=True, **options)}
    for gpu, f in fast.items():
        t = traced[gpu]
        assert f.method == METHOD
        assert t.device_total_bytes * 0.99 <= f.device_total_bytes <= UPPER * t.device_total_bytes
        assert f.capacity_bytes == t.capacity_bytes
        assert f.overheads["cuda_context"] == t.overheads["cuda_context"]
        assert f.overheads["cublas_workspaces"] == t.overheads["cublas_workspaces"]
        assert sum(f.breakdown.values()) == f.device_total_bytes
        assert f.headroom_bytes == f.capacity_bytes - f.device_total_bytes


@pytest.mark.parametrize(
    ("workload", "seq_len"), [("llama-3.2-1b", 2048), ("gpt2-large", 1024), ("bert-base", 512)]
)
def test_largest_batch_is_safe_and_close(workload: str, seq_len: int) -> None:
    traced = {e.gpu: e.max_batch_size for e in fit(workload, seq_len=seq_len, gpus=GPUS)}
    for e in fit(workload, seq_len=seq_len, gpus=GPUS, fast=True):
        assert e.max_batch_size <= traced[e.gpu]
        assert e.max_batch_size >= int(0.7 * traced[e.gpu])
        if e.max_batch_size:
            assert e.fits
            assert e.next_batch_device_total_bytes is not None
            assert e.next_batch_device_total_bytes > e.capacity_bytes


def test_max_seq_len_is_searched_at_a_given_batch() -> None:
    (e,) = fit("llama-3.2-1b", gpus=["a100-sxm4-80gb"], batch_size=1, seq_len=512, fast=True)
    assert e.max_seq_len is not None and e.max_seq_len > 2048
    assert e.max_seq_len_capped is False
    (g,) = fit("gpt2", gpus=["a100-sxm4-80gb"], batch_size=1, seq_len=512, fast=True)
    assert (g.max_seq_len, g.max_seq_len_capped) == (1024, True)  # GPT-2's 1024 positions


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"method": "qlora"}, "LoRA/QLoRA"),
        ({"method": "lora"}, "LoRA/QLoRA"),
        ({"checkpointing": True}, "checkpointing"),
        ({"mode": "inference"}, "training steps only"),
        ({"gpu_count": 2}, "one GPU"),
        ({"precision": "fp32"}, "GPT-2 under AMP"),
    ],
)
def test_refusals_are_usage_errors_with_the_reason(options: dict[str, Any], reason: str) -> None:
    with pytest.raises(UsageError, match=reason) as info:
        fit("gpt2", gpus=["a100-sxm4-80gb"], fast=True, **options)
    assert "Drop --fast" in str(info.value)


def test_refuses_workloads_without_a_covered_config(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not resnet50"):
        fit("resnet50", gpus=["a100-sxm4-80gb"], fast=True)
    with pytest.raises(UsageError, match="mixture-of-experts"):
        path = tmp_path / "mixtral.json"
        path.write_text(json.dumps(cf.workload_config("mixtral-8x7b")))
        fit(config=path, gpus=["a100-sxm4-80gb"], fast=True)
    with pytest.raises(UsageError, match="causal language models"):
        path = tmp_path / "cls.json"
        path.write_text(json.dumps(SMALL_LLAMA))
        fit(config=path, task="seq-cls", gpus=["a100-sxm4-80gb"], fast=True)


def test_a_user_config_needs_no_torch(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_LLAMA))
    code = (
        "import sys, json\n"
        "sys.modules['torch'] = None\n"
        "import whichgpu.api as wg\n"
        f"(e,) = wg.fit(config={str(path)!r}, gpus=['rtx-4090'], seq_len=1024, fast=True)\n"
        "assert e.method.startswith('closed form'), e.method\n"
        "assert e.max_batch_size > 0 and e.fits\n"
        "print(json.dumps([e.max_batch_size, e.device_total_bytes]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    batch, total = json.loads(out.stdout)
    allocated = cf.estimate(SMALL_LLAMA, RunConfig(), batch, 1024).peak_allocated_bytes
    assert total > cf.reserved_bytes(allocated)


def test_cli_fit_fast_json() -> None:
    result = run_cli(
        "fit", "llama-3.2-1b", "--fast", "--gpu", "a100-sxm4-80gb", "--seq-len", "1024", "--json"
    )
    assert result.returncode == 0, result.stderr
    (doc,) = json.loads(result.stdout)
    assert doc["method"].startswith("closed form (no trace)")
    assert doc["max_batch_size"] > 0
    assert any("reserved" in a and "1." in a for a in doc["assumptions"])
    text = run_cli("fit", "llama-3.2-1b", "--fast", "--gpu", "a100-sxm4-80gb")
    assert text.returncode == 0, text.stderr
    assert "closed form" in text.stdout
    refused = run_cli("fit", "llama-3.2-1b", "--fast", "--method", "qlora", "--gpu", "4090")
    assert refused.returncode != 0
    assert "Drop --fast" in refused.stderr


def _rows() -> list[CrossCheckRow]:
    return cf.cross_check(["gpt2"], points=[(1, 512), (4, 1024)])


def test_validate_closed_form_views() -> None:
    rows = _rows()
    assert all(r.reserved_error >= 0 for r in rows)
    doc = json_doc.closed_form_check_doc(rows)
    assert len(doc["points"]) == 2
    assert doc["reserved_error_min"] == min(r.reserved_error for r in rows)
    assert doc["relative_error_max"] == max(r.relative_error for r in rows)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(terminal.closed_form_check_view(rows))
    assert "fit --fast" in console.export_text()


def test_validate_closed_form_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    from whichgpu.cli import main

    rows = _rows()
    monkeypatch.setattr(cf, "cross_check", lambda: rows)
    assert main(["validate", "closed-form", "--json"]) == 0
    assert main(["validate", "closed-form"]) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": -4096}, "cannot describe a model: hidden"),
        ({"num_key_value_heads": 5}, "not a multiple of the KV heads"),
        ({"hidden_size": None}, "no 'hidden_size'|not a whole number"),
        ({"vocab_size": "many"}, "not a whole number"),
    ],
)
def test_fast_refuses_a_config_whose_sizes_cannot_be_a_model(
    change: dict[str, object], message: str
) -> None:
    from whichgpu.errors import WhichGpuError
    from whichgpu.estimate.closed_form import parse_config
    from whichgpu.workloads.hf import read_config

    config = {**read_config("llama-3.2-1b"), **change}
    if change.get("hidden_size", 0) is None:
        del config["hidden_size"]
    with pytest.raises(WhichGpuError, match=message):
        parse_config(config)
