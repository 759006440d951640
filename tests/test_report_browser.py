"""The HTML report in a real headless browser: it renders, fetches nothing, escapes names.

The browser is Chromium driven by Playwright (``pip install playwright``, part of the ``dev``
extra). Its own Chromium is used when ``playwright install chromium`` has fetched it (``make
install`` tries), else a Chromium of the system (``chromium``, ``chromium-headless-shell``,
``google-chrome`` on the PATH, or ``$WHICHGPU_CHROMIUM``). Where neither exists the test is
skipped and says why; ``test_report_html`` checks the same page without a browser.

A screenshot of the page is saved to ``tests/artifacts/report.png`` for a person to look at.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import whichgpu.api as wg
from whichgpu.report.html import render_html

ARTIFACTS = Path(__file__).parent / "artifacts"
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
