"""``whichgpu report --serving ENGINE``: the engine's figures in the speed section, the TPOT
(TTFT, prefill only) against concurrency chart and the cost per million tokens chart; every
value drawn is the estimates' own, and a report without an engine has no serving section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.report.html import render_html, report_doc
from whichgpu.report.serving_charts import (
    LATENCY_GPUS,
    NO_PRICE,
    cost_chart,
    latency_chart,
    served,
)
from whichgpu.report_data import ReportData

MODEL = "llama-3.2-1b"
GPUS = ("l4", "rtx-4090", "h100-sxm")
ASK = ("--mode", "inference", "--concurrency", "8")


def _chart(page: str, name: str) -> str:
    """The SVG of the chart ``name`` in the page."""
    match = re.search(rf'<svg [^>]*data-chart="{name}".*?</svg>', page, re.S)
    assert match is not None, f"no {name} chart"
    return match.group(0)


def _report(**asked: object) -> ReportData:
    return wg.report(MODEL, mode="inference", concurrency=8, gpus=list(GPUS), **asked)  # type: ignore[arg-type]


def test_cli_report_serving_writes_both_charts_with_the_estimates_values(
    tmp_path: Path,
) -> None:
    out = tmp_path / "serve.html"
    gpus = [a for g in GPUS for a in ("--gpu", g)]
    done = run_cli("report", MODEL, *ASK, *gpus, "--serving", "vllm", "--rent", "--out", str(out))
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert '<div id="serving">' in page and 'href="#serving"' in page
    assert 'id="serving-table"' in page
    latency = _chart(page, "serving-latency")
    cost = _chart(page, "serving-cost")
    assert re.search(r"<title>TPOT against concurrency: vLLM", latency)
    assert re.search(r"<title>\$ per million output tokens per GPU: vLLM", cost)

    # the same question through the API: every point drawn is an estimate's TPOT
    data = _report(serving="vllm", acquire="rent")
    pairs = served(data)
    assert {e.gpu for e, _ in pairs} == {"l4", "rtx-4090", "h100-sxm"}
    expected = {
        (e.gpu_name, p.concurrency): p.tpot_s * 1000
        for e, s in pairs[:LATENCY_GPUS]
        for p in s.by_concurrency
        if p.tpot_s is not None
    }
    drawn = {}
    for gpu, body in re.findall(r'<g class="curve" data-gpu="([^"]+)">(.*?)</g>', latency, re.S):
        name = next(e.gpu_name for e, _ in pairs if e.gpu == gpu)
        for level, value in re.findall(r'data-concurrency="(\d+)" data-value="([^"]+)"', body):
            drawn[(name, int(level))] = float(value)
    assert drawn.keys() == expected.keys()
    for key, value in expected.items():
        assert drawn[key] == pytest.approx(value, rel=1e-12)
    # the tooltips say each point's TPOT, and the asked concurrency is among them
    assert all(s.concurrency in {p.concurrency for p in s.by_concurrency} for _, s in pairs)
    assert re.search(r"<title>[^<]*: concurrency 8, TPOT [\d.]+ ms", latency)

    # the cost bars are the estimates' $ per million output tokens (or "no price")
    for _, s in pairs:
        if s.usd_per_million_output_tokens is None:
            assert f">{NO_PRICE}</text>" in cost
        else:
            assert f'data-value="{s.usd_per_million_output_tokens!r}"' in cost


def test_serving_table_shows_the_engine_figures_per_gpu() -> None:
    data = _report(serving="vllm", acquire="rent")
    page = render_html(data)
    table = page[page.index('id="serving-table"') :]
    table = table[: table.index("</table>")]
    for heading in ("TTFT ms", "TPOT ms", "output tokens/s", "$ / M output tokens"):
        assert f">{heading}</th>" in table
    for e, s in served(data):
        assert f">{e.gpu_name}</td>" in table
        assert s.tpot_s is not None
        assert f'data-v="{s.tpot_s!r}"' in table
        assert f'data-v="{s.ttft_s!r}"' in table
    # the JSON carries the same figures
    doc = report_doc(data)
    assert all(t["serving_speed"] is not None for t in doc["throughput"])
    assert doc["provenance"]["run"]["serving"] == "vllm"


def test_prefill_only_shows_ttft_and_prompt_token_cost() -> None:
    data = _report(serving="vllm", acquire="rent", new_tokens=0)
    pairs = served(data)
    assert pairs and all(s.tpot_s is None for _, s in pairs)
    latency = latency_chart(data)
    assert "<title>TTFT against concurrency: vLLM" in latency
    assert "TPOT" not in latency
    first = pairs[0][1]
    for p in first.by_concurrency:
        assert f'data-concurrency="{p.concurrency}" data-value="{p.ttft_s * 1000!r}"' in latency
    cost = cost_chart(data)
    assert "<title>$ per million prompt tokens per GPU" in cost
    if first.usd_per_million_prompt_tokens is not None:
        assert f'data-value="{first.usd_per_million_prompt_tokens!r}"' in cost
    page = render_html(data)
    assert ">TTFT ms (latency)</th>" in page and ">$ / M prompt tokens</th>" in page
    assert "generate no token" in page


def test_a_gpu_without_a_price_is_listed_not_drawn() -> None:
    data = _report(serving="vllm", acquire="rent")
    e, s = served(data)[0]
    bare = s.model_copy(update={"usd_per_million_output_tokens": None, "price_source": None})
    estimates = tuple(
        t.model_copy(update={"serving_speed": bare}) if t.gpu == e.gpu else t
        for t in data.throughput
    )
    cost = cost_chart(data.model_copy(update={"throughput": estimates}))
    row = re.search(rf"<g class=\"datum\"><title>{re.escape(e.gpu_name)}: no rent.*?</g>", cost)
    assert row is not None
    assert NO_PRICE in row.group(0) and '<rect class="bar"' not in row.group(0)


def test_a_tpot_target_in_the_estimates_is_a_dashed_line() -> None:
    data = _report(serving="vllm", acquire="rent")
    estimates = tuple(
        t.model_copy(
            update={"serving_speed": t.serving_speed.model_copy(update={"target_tpot_s": 0.01})}
        )
        if t.serving_speed is not None
        else t
        for t in data.throughput
    )
    latency = latency_chart(data.model_copy(update={"throughput": estimates}))
    assert re.search(r'<line class="target"[^>]*stroke-dasharray', latency)
    assert "target TPOT 10.0 ms (--tpot-ms)" in latency
    assert 'class="target"' not in latency_chart(data)


def test_no_serving_section_without_an_engine() -> None:
    data = _report(acquire="rent")
    assert not served(data)
    page = render_html(data)
    assert 'id="serving"' not in page and "serving-latency" not in page
    assert "serving-cost" not in page and 'href="#serving"' not in page


def test_single_serving_chart_needs_an_engine(tmp_path: Path) -> None:
    done = run_cli(
        "report",
        MODEL,
        *ASK,
        "--gpu",
        "l4",
        "--format",
        "svg",
        "--chart",
        "serving-latency",
        "--out",
        str(tmp_path / "x.svg"),
    )
    assert done.returncode != 0
    assert "--serving vllm" in done.stderr


def test_compiled_decoding_of_quantized_weights_holds_them_in_the_memory_section() -> None:
    """Without an engine, --compile --quantization int4: the memory section is fit's with the
    stored weights, as the ranking's."""
    data = _report(compile=True, quantization="int4", acquire="buy")
    (plain,) = wg.fit(MODEL, gpus=["h100-sxm"], mode="inference", concurrency=8, compile=True)
    held = next(m for m in data.memory if m.gpu == "h100-sxm")
    assert held.breakdown["weights"] < plain.breakdown["weights"]
    assert any(a.startswith("weights stored as int4") for a in held.assumptions)
