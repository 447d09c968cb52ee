"""The HTML report in a real headless Chromium: what a person sees, and no script error.

Chromium comes from the system (Debian's ``chromium``; ``nox -s tests`` installs it
when it is missing) or ``$FENCE_AUDIT_CHROMIUM``. The screenshot is kept in
``reports/screenshots/`` (or ``$FENCE_AUDIT_SCREENSHOTS``) for CI to show.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Browser, find_chromium

from audit.core import outputs
from audit.rendering.reports import Written, write_reports
from audit.results.view import AuditResults

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        pytest.fail(
            "no Chromium found: install Debian's chromium (nox -s tests does) or set "
            "FENCE_AUDIT_CHROMIUM; deselect with -m 'not browser' to run without it"
        )
    chromium = Browser(executable)
    yield chromium
    chromium.close()


@pytest.fixture
def report(results_on_disk: AuditResults, tmp_path: Path) -> Written:
    return write_reports(results_on_disk, tmp_path)


def screenshots() -> Path:
    if folder := os.environ.get("FENCE_AUDIT_SCREENSHOTS"):
        return Path(folder)
    # Listed in the reports folder's manifest: the audit then still takes the folder.
    outputs.claim(ROOT / "reports", "screenshots/")
    return ROOT / "reports" / "screenshots"


def test_index_shows_score_regions_and_survivors(browser: Browser, report: Written) -> None:
    browser.open(report.index)
    assert browser.visible_text("#score") == "50.0%"
    summary = browser.visible_text("#summary")
    assert "3 killed of 6 judged" in summary
    survivors = browser.visible_text("#survivors")
    assert "Survivors (2)" in survivors
    assert "Fence.register:swap_op@3:29-3:36#1" in survivors
    assert "removal at the first worker's report" in survivors
    assert browser.evaluate("document.querySelectorAll('#picture rect').length") > 0
    shot = browser.screenshot(screenshots() / "index.png")
    assert shot.stat().st_size > 10_000
    assert browser.script_errors() == []


def test_clicking_a_survivor_opens_its_details_on_the_region_page(
    browser: Browser, report: Written
) -> None:
    browser.open(report.index)
    browser.click("#survivors a")
    browser.wait_for("Page.loadEventFired")
    assert browser.evaluate("location.pathname").endswith("/regions/population.html")
    anchor = browser.evaluate("location.hash.slice(1)")
    selector = f"details[id='{anchor}'] > summary"
    assert browser.evaluate(f'document.querySelector("{selector}").parentElement.open') is False
    browser.click(selector)
    assert browser.evaluate(f'document.querySelector("{selector}").parentElement.open') is True
    shown = browser.visible_text(f"details[id='{anchor}']")
    assert "survived" in shown
    assert "+            if block < 0 and job | 1:  # </pre><script>alert(1)</script>" in shown
    assert "tests that cover the line\nlisted above line 6's mutants" in shown
    assert browser.visible_text("#tests-L6 > summary") == "2 tests cover line 6"
    browser.click(f"details[id='{anchor}'] a[href='#tests-L6']")
    assert browser.evaluate("location.hash") == "#tests-L6"
    browser.screenshot(screenshots() / "region-expanded.png")
    assert browser.script_errors() == []


def test_killed_mutant_shows_its_killer_and_failure(browser: Browser, report: Written) -> None:
    browser.open(report.regions[0])
    selector = "details.mutant.killed > summary"
    browser.click(selector)
    shown = browser.visible_text("details.mutant.killed")
    assert "killed by\ntests/test_fence.py::test_register[a<b]" in shown
    assert "AssertionError: assert {1} == <set()>" in shown
    assert browser.script_errors() == []
