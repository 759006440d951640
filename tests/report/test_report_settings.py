"""``whichgpu report`` with the training settings: each is taken by the API and the CLI, the
page's header states it (so a reader knows the numbers assume it), ``report --json`` carries
it, and where it changes memory the reported memory differs from the default run's.

The workload is ``tests/fixtures/tiny-llama.json`` (two layers of hidden 64) on one GPU, so
each traced step takes a second or two on the CPU.
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from typing import Any

import pytest

import whichgpu.api as wg
from whichgpu.cli import main
from whichgpu.report.html import render_html, report_doc
from whichgpu.report_data import ReportData

TINY = Path(__file__).parents[1] / "fixtures" / "tiny-llama.json"
ASKED: dict[str, Any] = {"config": TINY, "seq_len": 128, "gpus": ["h100-sxm"], "top": 1}


def _report(**options: Any) -> ReportData:
    return wg.report(**ASKED, **options)


@functools.cache
def _default() -> ReportData:
    """The run without any setting, once per process (every test compares with it)."""
    return _report()


def _header(page: str) -> str:
    """The text under the page's title: the run in words."""
    found = re.search(r"<header><h1>.*?</h1><p>(.*?)</p></header>", page)
    assert found, "the page has its header"
    return html.unescape(found.group(1))


def _memory(data: ReportData) -> tuple[int, int]:
    """The reported largest batch and the peak allocated at it, on the H100."""
    (m,) = data.memory
    return m.max_batch_size, m.peak_allocated_bytes


SETTINGS = [
    pytest.param({"precision": "fp8"}, "train, fp8, adamw", True, id="fp8"),
    pytest.param({"compile": True}, ", torch.compile,", True, id="compile"),
    pytest.param(
        {"checkpointing_policy": "every-2"},
        "gradient checkpointing (every 2nd layer)",
        True,
        id="checkpointing-policy",
    ),
    pytest.param({"loss_kernel": "chunked"}, "chunked cross-entropy", True, id="loss-kernel"),
    pytest.param({"optimizer": "adamw-8bit"}, "train, bf16, adamw-8bit,", True, id="optimizer"),
    pytest.param({"optimizer_impl": "fused"}, "bf16, adamw (fused),", False, id="optimizer-impl"),
    pytest.param(
        {"grad_accum": 4, "batch_size": 8},
        "gradient accumulation 4, sequence length 128, "
        "global batch = micro-batch x 4 accumulated x 1 GPU = 32",
        False,
        id="global-batch",
    ),
    pytest.param(
        {"gpu_count": 8, "sharding": "fsdp"},
        "8 GPUs data parallel (FSDP, parameters, gradients and optimizer state sharded), "
        "global batch = micro-batch x 1 accumulated x 8 GPUs",
        True,
        id="gpus-sharding",
    ),
]


@pytest.mark.parametrize(("options", "stated", "changes_memory"), SETTINGS)
def test_report_states_each_training_setting(
    options: dict[str, Any], stated: str, changes_memory: bool
) -> None:
    default = _default()
    data = _report(**options)
    page = render_html(data)
    assert stated in _header(page)
    assert stated not in _header(render_html(default))
    run = report_doc(data)["run"]
    for key, value in options.items():  # report --json carries the run as asked
        assert run["gpus" if key == "gpu_count" else key] == value
    if changes_memory:
        assert _memory(data) != _memory(default)


def test_sharded_memory_is_per_gpu_of_the_machine() -> None:
    """With --gpus 8 --sharding fsdp the memory section answers for one GPU of eight (the
    ranking's largest batch), not for one GPU alone."""
    data = _report(gpu_count=8, sharding="fsdp")
    (lead,) = data.ranking.ranking
    assert lead.count == 8
    assert data.memory[0].max_batch_size == lead.max_batch_size
    assert data.memory[0].max_batch_size != _default().memory[0].max_batch_size
    page = render_html(data)
    assert "fits on each GPU of 8 working together (FSDP" in page
    ranking = page.split('id="ranking"')[1].split("</table>")[0]
    assert ">global batch</th>" in ranking
    assert f">{lead.batch_size * 8}</td>" in ranking


def test_cli_report_takes_the_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    args = ["report", "--config", str(TINY), "--seq-len", "128", "--gpu", "h100-sxm"]
    args += ["--top", "1", "--gpus", "8", "--sharding", "zero2", "--grad-accum", "2"]
    args += ["--batch-size", "4", "--precision", "fp8", "--checkpointing-policy", "selective"]
    assert main([*args, "--out", str(out)]) == 0
    header = _header(out.read_text(encoding="utf-8"))
    assert header.startswith("train, fp8, adamw, gradient checkpointing (selective")
    assert "8 GPUs data parallel (ZeRO-2, gradients and optimizer state sharded)" in header
    assert "global batch = micro-batch x 2 accumulated x 8 GPUs = 64" in header
    capsys.readouterr()
    # more GPUs than one machine: a cluster of machines of 8, named with its fabric
    assert main([*args, "--gpus", "16", "--network", "ib-hdr", "--out", str(out)]) == 0
    header = _header(out.read_text(encoding="utf-8"))
    assert "16 GPUs in 2 machines of 8 joined by ib-hdr, data parallel (ZeRO-2" in header
    assert "x 16 GPUs = 128" in header


def test_a_cluster_is_ranked_and_its_break_even_is_one_machines() -> None:
    """Beyond one machine: the ranking's cluster, memory per GPU of it under its sharding,
    and the break-even of one of its machines (both sides scale with the machines), said."""
    data = _report(gpu_count=16, sharding="hsdp", acquire="buy")
    (lead,) = data.ranking.ranking
    assert (lead.count, lead.machines) == (16, 2)
    assert data.breakeven_count == 8
    assert any("the break-even of one machine of 8" in n for n in data.notes)
    assert data.memory[0].max_batch_size == lead.max_batch_size
    page = render_html(data)
    assert "16 GPUs in 2 machines of 8 joined by" in _header(page)


def test_a_model_that_fits_only_sharded_is_timed_on_the_gpus_together() -> None:
    """Llama 3.1 8B under FSDP fits eight H100s but not one: the speed shown is of the eight
    together (the run asked), and a dollar buys each GPU's share of it."""
    asked = {"gpus": ["h100-sxm"], "gpu_count": 8, "sharding": "fsdp", "seq_len": 2048, "top": 1}
    data = wg.report("llama-3.1-8b", **asked)
    (speed,) = data.speeds
    (together,) = wg.predict(
        "llama-3.1-8b",
        gpus=["h100-sxm"],
        gpu_count=8,
        sharding="fsdp",
        seq_len=2048,
        batch_size=data.ranking.ranking[0].batch_size,
    )
    assert together.throughput is not None
    assert speed.throughput == pytest.approx(together.throughput)
    assert any("sharded over them (fsdp)" in n for n in data.notes)
