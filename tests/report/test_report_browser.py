"""The HTML report in a real headless browser: it renders, fetches nothing, escapes names.

The browser is Chromium driven by Playwright (``pip install playwright``, part of the ``dev``
extra). Its own Chromium is used when ``playwright install chromium`` has fetched it (``make
install`` tries), else a Chromium of the system (``chromium``, ``chromium-headless-shell``,
``google-chrome`` on the PATH, or ``$WHICHGPU_CHROMIUM``). Where neither exists the test is
skipped and says why; ``test_report_html`` checks the same page without a browser.

A screenshot of the page is saved to ``tests/artifacts/report.png`` for a person to look at.
The layout is checked at a desktop (1280 px) and a phone (420 px) width: the page never scrolls
sideways (a wide table scrolls in its own box), no table cell's content overflows its column,
at the desktop width every table fits the page and a GPU name takes two lines at most, and no
chart's text reaches outside the chart. Where a check fails, the page at that width is saved
as ``tests/artifacts/report-<width>px.png`` and the failure names it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import whichgpu.api as wg
from whichgpu.report.html import render_html

ARTIFACTS = Path(__file__).parents[1] / "artifacts"
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">'
SYSTEM_BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")


def _launch(playwright: Any) -> Any:
    """A headless Chromium: Playwright's own, else one on this system; skip if there is none."""
    problems = []
    try:
        return playwright.chromium.launch()
    except Exception as exc:  # its browser was never downloaded
        problems.append(f"Playwright's Chromium: {str(exc).splitlines()[0]}")
    candidates = [os.environ.get("WHICHGPU_CHROMIUM")] + [shutil.which(n) for n in SYSTEM_BROWSERS]
    for path in candidates:
        if path:
            try:
                return playwright.chromium.launch(executable_path=path)
            except Exception as exc:
                problems.append(f"{path}: {str(exc).splitlines()[0]}")
    pytest.skip(
        "no headless browser could be started ("
        + "; ".join(problems or ["none found"])
        + "). Run `python -m playwright install chromium` or install a Chromium package."
    )


def test_report_renders_offline_in_a_browser(tmp_path: Path) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    data = wg.report(
        "bert-large",
        gpus=["4090", "3090", "a100-80gb", "h100-sxm"],
        seq_len=512,
        acquire="rent",
        epochs=10,
        dataset_size=1_000_000,
    )
    page_file = tmp_path / "report.html"
    page_file.write_text(render_html(data.model_copy(update={"title": HOSTILE})), "utf-8")
    errors: list[str] = []
    outside: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = _launch(playwright)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def guard(route: Any) -> None:
                if route.request.url.startswith("file:"):
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()

            page.route("**/*", guard)
            page.goto(page_file.as_uri())
            page.wait_for_load_state("load")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)

            assert errors == [], errors
            assert outside == [], f"the page asked the network for {outside}"
            charts = page.eval_on_selector_all(
                "svg.chart",
                "els => els.map(e => [e.dataset.chart, "
                "e.querySelectorAll('rect.bar, circle.point').length, "
                "e.getBoundingClientRect().width])",
            )
            names = {name for name, _, _ in charts}
            assert {"throughput", "batch", "memory", "rent", "breakeven"} <= names, charts
            for name, points, width in charts:
                assert points > 0 and width > 100, (name, points, width)
            assert page.locator("table.sortable").count() >= 4
            assert page.evaluate("window.__pwned === undefined")
            assert HOSTILE in page.locator("h1").inner_text()
            first = page.locator("#speeds tbody tr td").first.inner_text()
            page.locator("#speeds thead th").first.click()
            page.locator("#speeds thead th").first.click()
            assert page.locator("#speeds thead th").first.get_attribute("aria-sort")
            assert page.locator("#speeds tbody tr").count() == len(data.speeds)
            assert first
        finally:
            browser.close()


LAYOUT_PROBLEMS = """() => {
  const problems = [];
  const scroller = document.scrollingElement;
  if (scroller.scrollWidth > window.innerWidth) {
    problems.push(`the page scrolls sideways: ${scroller.scrollWidth} px wide in a `
      + `${window.innerWidth} px window`);
  }
  const main = document.querySelector("main");
  const style = getComputedStyle(main);
  const contentRight = main.getBoundingClientRect().right - parseFloat(style.paddingRight);
  const desktop = window.innerWidth >= 1000;
  for (const table of document.querySelectorAll("table")) {
    const box = table.closest(".table-wrap") || table;
    if (box.getBoundingClientRect().right > contentRight + 1) {
      problems.push(`table #${table.id} reaches past the page's column`);
    }
    if (desktop && table.getBoundingClientRect().right > contentRight + 1) {
      problems.push(`table #${table.id} is wider than the page's column at desktop width`);
    }
    for (const cell of table.querySelectorAll("th, td")) {
      if (cell.scrollWidth > cell.clientWidth + 1) {
        problems.push(`a cell of #${table.id} overflows its column: `
          + `"${cell.textContent.slice(0, 40)}" needs ${cell.scrollWidth} px of `
          + `${cell.clientWidth}`);
      }
    }
    if (desktop) {
      for (const cell of table.querySelectorAll("td.label")) {
        const cs = getComputedStyle(cell);
        const line = parseFloat(cs.lineHeight) || 1.5 * parseFloat(cs.fontSize);
        const text = cell.getBoundingClientRect().height
          - parseFloat(cs.paddingTop) - parseFloat(cs.paddingBottom);
        if (text > 2 * line + 1) {
          problems.push(`"${cell.textContent}" in #${table.id} wraps onto `
            + `${Math.round(text / line)} lines`);
        }
      }
    }
  }
  for (const svg of document.querySelectorAll("svg.chart")) {
    const view = svg.viewBox.baseVal;
    for (const text of svg.querySelectorAll("text")) {
      const b = text.getBBox();
      if (b.x < view.x - 0.5 || b.y < view.y - 0.5 || b.x + b.width > view.x + view.width + 0.5
          || b.y + b.height > view.y + view.height + 0.5) {
        problems.push(`chart ${svg.dataset.chart}: "${text.textContent.slice(0, 40)}" is `
          + `clipped (${Math.round(b.x)} to ${Math.round(b.x + b.width)} of `
          + `${view.width})`);
      }
    }
  }
  return problems;
}"""


@pytest.mark.parametrize("width", [1280, 420])
def test_report_layout_at_desktop_and_phone_width(tmp_path: Path, width: int) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    data = wg.report(
        "bert-large",
        gpus=["4090", "3090", "a100-80gb", "h100-sxm", "rtx-pro-6000-blackwell"],
        seq_len=512,
        acquire="rent",
        epochs=10,
        dataset_size=1_000_000,
    )
    page_file = tmp_path / "report.html"
    page_file.write_text(render_html(data), "utf-8")
    with sync_api.sync_playwright() as playwright:
        browser = _launch(playwright)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(page_file.as_uri())
            page.wait_for_load_state("load")
            problems = page.evaluate(LAYOUT_PROBLEMS)
            if problems:
                ARTIFACTS.mkdir(exist_ok=True)
                shot = ARTIFACTS / f"report-{width}px.png"
                page.screenshot(path=str(shot), full_page=True)
                problems.append(f"screenshot: {shot}")
            assert problems == [], "\n".join(problems)
        finally:
            browser.close()
