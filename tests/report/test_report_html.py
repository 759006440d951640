"""``whichgpu report``: the gathered data, the JSON document, the HTML page and single charts.

The page is checked without a browser here (parsed with ``html.parser``): charts with data
points, tables, nothing fetched from elsewhere, user strings escaped. ``test_report_browser``
opens it in a real browser.
"""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.cli import main
from whichgpu.report.charts import CHARTS, Bar, bar_chart, chart_svg, text_width
from whichgpu.report.html import Cell, Column, html_table, render_html, report_doc
from whichgpu.report_data import ReportData

HOSTILE = '<script>alert("x")</script>&"\''


@pytest.fixture(scope="module")
def data() -> ReportData:
    """A small report: two GPUs, rented, a job size."""
    return wg.report(
        "bert-base",
        gpus=["4090", "a100-80gb"],
        seq_len=128,
        acquire="rent",
        epochs=1,
        dataset_size=100_000,
    )


class _Page(HTMLParser):
    """Every start tag with its attributes, the text of scripts, and the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.scripts if self._in_script else self.text).append(data)


def parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


def test_report_data_gathers_every_section(data: ReportData) -> None:
    assert data.ranking.ranking, "a candidate is ranked"
    assert {p.gpu for p in data.speeds} == {"rtx-4090", "a100-sxm4-80gb"}
    ref = next(p for p in data.speeds if p.gpu == data.reference)
    assert ref.relative == pytest.approx(1.0)
    for p in data.speeds:
        assert p.relative_low <= p.relative <= p.relative_high
    assert len(data.memory) == 2
    assert any(t.price_kind == "cloud" for t in data.value)
    assert data.provenance.catalog_version == "v1"
    assert 0 < data.provenance.throughput_error_band < 1
    # BERT-Base's speed was measured (Lambda 2020): its band is that of a new GPU
    assert data.provenance.throughput_error_basis == "leave one GPU out"
    assert data.provenance.price_dates


def test_json_document_keys_are_stable(data: ReportData) -> None:
    """Golden: the top-level keys of ``report --json`` (a change here is a format change)."""
    doc = report_doc(data)
    assert sorted(doc) == [
        "breakeven",
        "breakeven_count",
        "breakeven_gpu",
        "memory",
        "notes",
        "provenance",
        "ranking",
        "reference",
        "reference_name",
        "results",
        "results_count",
        "run",
        "schema_version",
        "speeds",
        "throughput",
        "title",
        "value",
        "workload",
    ]
    assert sorted(doc["speeds"][0]) == [
        "batch_size",
        "gpu",
        "gpu_name",
        "high",
        "low",
        "relative",
        "relative_high",
        "relative_low",
        "source",
        "throughput",
        "throughput_unit",
    ]
    assert sorted(doc["provenance"]) == [
        "catalog_version",
        "generated_at",
        "memory_method",
        "price_dates",
        "run",
        "schema_version",
        "store",
        "throughput_error_band",
        "throughput_error_basis",
        "throughput_fitted_date",
        "throughput_fitted_on",
        "throughput_model",
        "tool_version",
        "user_prices",
    ]
    json.dumps(doc)


GOLDEN_TABLE = (
    '<div class="table-wrap"><table class="sortable" id="t1"><caption>GPUs &lt;b&gt;</caption>'
    '<thead><tr><th scope="col" class="txt label" data-type="txt">GPU</th>'
    '<th scope="col" class="num" data-type="num">speed</th></tr></thead><tbody>\n'
    '<tr><td class="txt label">RTX &lt;4090&gt;</td><td class="num" data-v="11.5">11.5</td>'
    "</tr>\n"
    '<tr><td class="txt label">A100 &amp; co</td><td class="num">-</td></tr>\n'
    "</tbody></table></div>"
)


def test_table_renderer_golden() -> None:
    """Golden: the sortable table markup for a fixed input (escaping, sort keys, alignment)."""
    table = html_table(
        [Column("GPU", label=True), Column("speed", numeric=True)],
        [[Cell("RTX <4090>"), Cell("11.5", 11.5)], [Cell("A100 & co"), Cell("-")]],
        "GPUs <b>",
        "t1",
    )
    assert table == GOLDEN_TABLE


def test_page_is_self_contained_with_charts_and_tables(data: ReportData) -> None:
    page = parse(render_html(data))
    for tag, attrs in page.tags:
        for key in ("src", "href", "action", "poster", "data"):
            value = attrs.get(key)
            if value is not None and tag != "rect":
                assert value.startswith("#"), f"<{tag} {key}={value!r}> points outside the page"
        assert tag not in ("link", "iframe", "img", "object", "embed", "base"), tag
    assert "@import" not in "".join(page.text) and "url(" not in render_html(data)
    charts = [a for t, a in page.tags if t == "svg"]
    names = {a.get("data-chart") for a in charts}
    assert {"throughput", "batch", "memory", "value", "rent", "breakeven"} <= names
    bars = [a for t, a in page.tags if t == "rect" and "bar" in (a.get("class") or "")]
    assert len(bars) >= 8 and all(float(a["data-value"] or 0) >= 0 for a in bars)
    points = [a for t, a in page.tags if t == "circle" and a.get("class") == "point"]
    assert points, "the break-even curve has its points"
    tables = [a.get("id") for t, a in page.tags if t == "table"]
    assert {"ranking", "speeds", "memory-table", "price-dates"} <= set(tables)
    section_ids = [a.get("id") for t, a in page.tags if t == "section"]
    assert section_ids[0] == "answer" and section_ids[-1] == "provenance"
    text = " ".join(page.text)
    assert data.ranking.answer in text
    assert "What the predictions assume" in text
    shared = set.intersection(*(set(t.assumptions) for t in data.throughput))
    assert all(a in text for a in shared)


def test_hostile_model_name_is_text(data: ReportData) -> None:
    hostile = data.model_copy(update={"title": HOSTILE})
    rendered = render_html(hostile)
    page = parse(rendered)
    assert len(page.scripts) == 1 and "alert" not in page.scripts[0]
    assert HOSTILE in "".join(page.text)
    assert "<script>alert" not in rendered


def test_single_charts_are_svg_documents(data: ReportData) -> None:
    for name in ("throughput", "batch", "memory", "rent", "breakeven"):
        svg = chart_svg(data, name)
        assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"'), name
        assert svg.endswith("</svg>")
        assert "<title>" in svg
    with pytest.raises(LookupError):
        chart_svg(data, "pie")
    # no curve: the error says why, from the report's own note
    note = "Cloud against own for GeForce RTX 4090: no cloud price."
    without = data.model_copy(update={"breakeven": None, "notes": (note,)})
    with pytest.raises(LookupError, match="for GeForce RTX 4090: no cloud price"):
        chart_svg(without, "breakeven")


def test_cli_writes_report_and_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    args = ["report", "bert-base", "--gpu", "4090", "--gpu", "3090", "--seq-len", "128"]
    assert main([*args, "--out", str(out)]) == 0
    assert "r.html" in capsys.readouterr().out
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    svg = tmp_path / "m.svg"
    assert main([*args, "--format", "svg", "--chart", "memory", "--out", str(svg)]) == 0
    assert svg.read_text(encoding="utf-8").startswith("<svg")
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"] == "bert-base"
    assert main([*args, "--format", "gif"]) == 2
    capsys.readouterr()
    assert main([*args, "--chart", "memory"]) == 2  # a chart is for svg/png only
    assert "--chart picks the one chart" in capsys.readouterr().err


def test_report_out_writes_through_links_and_refuses_what_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["report", "bert-base", "--gpu", "4090", "--seq-len", "128", "--out"]
    target = tmp_path / "target.html"
    target.write_text("old", encoding="utf-8")
    link = tmp_path / "link.html"
    link.symlink_to(target.name)
    assert main([*args, str(link)]) == 0
    assert link.is_symlink() and target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    capsys.readouterr()
    assert main([*args, str(tmp_path)]) == 2
    assert "is a folder, not a file" in capsys.readouterr().err
    assert main([*args, str(target / "below-a-file.html")]) == 2
    assert "Cannot write" in capsys.readouterr().err


def test_results_section_from_the_store(tmp_path: Path) -> None:
    """--results with an empty store says so; the section is there either way."""
    store = tmp_path / "results.sqlite"
    with_results = wg.report(
        "bert-base", gpus=["4090"], seq_len=128, results=True, store=store, acquire="rent"
    )
    assert with_results.results is None and with_results.provenance.store == str(store)
    assert any("no results" in n for n in with_results.notes)
    assert 'id="results"' in render_html(with_results)


def test_results_section_says_which_setting_each_row_measured(tmp_path: Path) -> None:
    from tests.store.test_store import make_result
    from whichgpu.schema import RunConfig
    from whichgpu.store import ResultStore

    store = ResultStore(tmp_path / "results.sqlite")
    lora = RunConfig(precision="bf16", batch_size=8, seq_len=512, method="lora", checkpointing=True)
    store.add(make_result(workload="llama-3.2-1b", batch_size=8, seq_len=512, run=lora))
    store.add(make_result(workload="llama-3.2-1b", batch_size=8, seq_len=512, minutes=1,
                          run=lora.model_copy(update={"method": "full"})))  # fmt: skip
    data = wg.report(
        "bert-base", gpus=["4090"], seq_len=128, results=True, store=store.path, acquire="rent"
    )
    assert data.results is not None
    labels = [row.label for row in data.results.rows]
    assert labels == [
        "llama-3.2-1b bf16 seq 512 checkpointing",
        "llama-3.2-1b bf16 lora seq 512 checkpointing",
    ]
    page = render_html(data)
    assert all(html.escape(label) in page for label in labels)


def test_speeds_at_a_given_batch_are_labelled_with_it(tmp_path: Path) -> None:
    from tests.store.test_store import make_result
    from whichgpu.store import ResultStore

    given = wg.report("bert-base", gpus=["4090", "a100-80gb"], seq_len=128, batch_size=2)
    page = render_html(given)
    assert "at batch 2" in page and "(sequences/s, batch 2)" in page
    assert "largest that fits" not in page and "at its largest batch" not in page
    assert all(c.batch_size == 2 for c in given.ranking.ranking)
    searched = render_html(wg.report("bert-base", gpus=["4090"], seq_len=128))
    assert "at its largest batch" in searched and "batch = largest that fits" in searched
    # stored results: a given batch is not a largest batch, and 0 means not even 1 fitted
    store = ResultStore(tmp_path / "results.sqlite")
    store.add(make_result(workload="resnet50", gpu="rtx-4090", max_batch_size=None))
    store.add(make_result(workload="resnet50", gpu="rtx-3090", device_name="NVIDIA GeForce "
                          "RTX 3090", max_batch_size=0, throughput=None))  # fmt: skip
    data = wg.report("resnet50", gpus=["4090"], results=True, store=store.path)
    assert data.results is not None
    batches = render_html(data).split('id="results-batch"')[1].split("</table>")[0]
    assert ">256<" not in batches  # the given batch of the 4090 run
    assert ">0<" in batches


def test_report_asks_the_question_recommend_asks(tmp_path: Path) -> None:
    page = tmp_path / "kaggle.html"
    result = run_cli(
        "report", "--for", "kaggle", "--used", "--vendor", "nvidia", "--sort", "throughput",
        "--min-batch", "32", "--out", str(page),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = wg.report(preset="kaggle", used=True, sort="throughput", min_batch=32)
    assert data.ranking.preset == "kaggle" and data.ranking.metric == "throughput"
    assert data.ranking.workload == "vit-b-16"
    assert all(c.max_batch_size >= 32 for c in data.ranking.ranking)
    assert "vit-b-16" in page.read_text(encoding="utf-8")
    # the speeds are of the preset's run: its workload, on the ranked GPUs
    assert {p.gpu for p in data.speeds} >= {c.gpu for c in data.ranking.ranking}


def _settings_listed(page: str) -> list[str]:
    """The names the provenance lists under the run's settings (its second list)."""
    run_list = page.split('<div class="two">')[1].split("</dl><dl>")[1].split("</dl>")[0]
    return re.findall(r"<dt>(.*?)</dt>", run_list)


def test_settings_that_do_not_apply_are_not_listed(data: ReportData) -> None:
    """A full fine-tune lists no LoRA rank, a run without checkpointing no policy, training no
    concurrency or context, one GPU no sharding; the settings a run uses are all there."""
    assert data.run.mode == "train" and data.run.method == "full"
    listed = _settings_listed(render_html(data))
    assert {"lora_rank", "checkpointing_policy", "concurrency", "sharding"}.isdisjoint(listed)
    assert {"precision", "optimizer", "method", "checkpointing", "gpus"} <= set(listed)
    # ``report --json`` keeps every setting
    assert "lora_rank" in report_doc(data)["provenance"]["run"]
    lora = data.run.model_copy(update={"method": "qlora", "checkpointing": True, "gpus": 2})
    listed = _settings_listed(render_html(data.model_copy(update={"run": lora})))
    assert {"lora_rank", "checkpointing_policy", "sharding"} <= set(listed)
    serving = data.run.model_copy(update={"mode": "inference"})
    listed = _settings_listed(render_html(data.model_copy(update={"run": serving})))
    assert {"optimizer", "method", "lora_rank", "grad_accum", "checkpointing"}.isdisjoint(listed)
    assert "concurrency" in listed


def _css(page: str) -> str:
    return page.split("<style>")[1].split("</style>")[0]


def test_page_reflows_on_a_phone_and_tables_scroll_in_their_own_box(data: ReportData) -> None:
    page = render_html(data)
    css = _css(page)
    assert re.search(r"@media \(max-width:\s*\d+px\)\{", css), "a narrow-screen layout"
    assert ".table-wrap{overflow-x:auto" in css
    # every table sits in its scrolling box, so a wide one never widens the page
    assert page.count("<table") == page.count('<div class="table-wrap"><table') > 0
    # headings may wrap (a heading kept on one line is what pushed the table past the page)
    assert not re.search(r"(^|\})th\{[^}]*white-space:nowrap", css)
    main_rule = re.search(r"main\{[^}]*\}", css)
    assert main_rule and "overflow-wrap:break-word" in main_rule.group(0)


def test_long_names_wrap_in_tables_and_fit_the_charts(data: ReportData) -> None:
    css = _css(render_html(data))
    label = re.search(r"td\.label\{([^}]*)\}", css)
    assert label and "overflow-wrap:anywhere" in label.group(1) and "min-width" in label.group(1)
    page = render_html(data)
    assert page.count('<td class="txt label">') >= len(data.ranking.ranking) + len(data.speeds)
    long = "RTX PRO 6000 Blackwell Workstation Edition <b>"
    svg = bar_chart([Bar(long, 1.0, "tip"), Bar("A100", 2.5, "tip")], "t", "axis", "x")
    _assert_text_inside(svg)
    assert html.escape(long) in svg, "a shortened label keeps the whole name as its tooltip"


def _assert_text_inside(svg: str) -> None:
    """Every text of the chart, at its estimated width, lies inside the viewBox."""
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    width = float(root.attrib["viewBox"].split()[2])
    for text in root.iter(f"{ns}text"):
        spans = [(s.attrib["x"], s.text or "") for s in text.iter(f"{ns}tspan")]
        if not spans:
            spans = [(text.attrib["x"], text.text or "")]
        bold = text.attrib.get("font-weight") == "600"
        anchor = text.attrib.get("text-anchor", "start")
        for x, content in spans:
            w = text_width(content, bold=bold)
            left = float(x) - {"start": 0, "middle": w / 2, "end": w}[anchor]
            assert left >= 0 and left + w <= width, (content, left, left + w, width)


def test_chart_text_and_legends_stay_inside_the_charts(data: ReportData) -> None:
    """The memory chart's legend ("overhead" was cut at the right edge) and every other text
    of every chart fits its chart at a generous estimate of its width."""
    for name in CHARTS:
        if name == "value":
            continue  # this report rents
        _assert_text_inside(chart_svg(data, name))
    memory = chart_svg(data, "memory")
    assert all(f">{kind}</text>" in memory for kind in ("weights", "temporaries", "overhead"))
