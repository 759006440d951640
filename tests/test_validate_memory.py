"""``validate memory``: every Lambda 2020 case is predicted and judged on its grid."""

from __future__ import annotations

import json

from tests.conftest import run_cli
from whichgpu.validate.memory import compare, on_grid


def test_grid_rounding_and_steps() -> None:
    powers = [2**k for k in range(12)]
    assert on_grid(13, powers) == (8, 3)
    assert compare(8, 13, powers) == (8, 0, "exact")
    assert compare(16, 13, powers) == (8, -1, "conservative")
    assert compare(4, 13, powers) == (8, 1, "too high")
    tokens = [2000, 3584, 8000, 16000]
    assert compare(3584, 6016, tokens)[2] == "exact"
    assert compare(8000, 17664, tokens)[:2] == (16000, 1)
    assert compare(0, 0, powers)[2] == "exact"  # neither could run it


def test_cli_validate_memory_json() -> None:
    result = run_cli("validate", "memory", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["cases"]) == 96
    assert doc["compared"] == 96, [c for c in doc["cases"] if c["verdict"] == "skipped"]
    assert (
        doc["exact"] + doc["too_high"] + doc["conservative_by_one"] + doc["conservative_more"]
        == doc["compared"]
    )
    assert any("fp32" in a for a in doc["assumptions"])
    assert all(c["framework"] for c in doc["cases"])
    evidenced = [
        c
        for c in doc["cases"]
        if c["verdict"] == "too high"
        and (
            c["measured_max_batch"] == 0
            or (c["framework"].startswith("PyTorch") and not c["batches_set_by_hand"])
        )
    ]
    assert doc["too_high_evidenced"] == len(evidenced) <= doc["too_high"]
    by_hand = {c["model"] for c in doc["cases"] if c["batches_set_by_hand"]}
    assert by_hand == {"Transformer Big", "Conv. Seq2Seq", "unsupMT", "BERT Finetune"}


def test_cli_validate_memory_table() -> None:
    result = run_cli("validate", "memory")
    assert result.returncode == 0, result.stderr
    assert "cases compared" in result.stdout and "Assumptions" in result.stdout
