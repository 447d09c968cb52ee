"""The releases page: each release's audit.json read back and shown side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser import Browser, find_chromium

from audit.core.errors import ConfigError, ExitCode
from audit.rendering.releases import collect, main, write_pages

DATA = Path(__file__).parent / "data" / "results.json"


def release(folder: Path, version: str, **changes: object) -> None:
    document = json.loads(DATA.read_text())
    document["vllm_version"] = version
    document.update(changes)
    (folder / version).mkdir(parents=True)
    (folder / version / "audit.json").write_text(json.dumps(document))


@pytest.fixture
def releases(tmp_path: Path) -> Path:
    folder = tmp_path / "releases"
    document = json.loads(DATA.read_text())
    carried = [
        {**c, "state": "carried", "reason": "in f, 'x' comes after 'y'"}
        if c["id"] == "catalogue:flush-check-moved"
        else c
        for c in document["catalogue"]
    ]
    finding = {
        "id": "reset-bug",
        "title": "a reset stores the wrong KV",
        "doc": "docs/vllm-bug-reset.md",
        "releases": ["0.33.0"],
        "tests": ["project/tests/fence/test_b.py::test_reset"],
        "left_out": [],
    }
    release(folder, "0.33.0", findings=[finding])
    release(folder, "0.10.0", catalogue=carried)  # ordered as a release, not as text
    (folder / "0.28.0").mkdir()
    (folder / "0.28.0" / "status.json").write_text('{"exit_code": 4}')
    (folder / "notes").mkdir()  # not a release: ignored
    return folder


def test_rows_are_releases_in_order_with_what_stopped_an_audit(releases: Path) -> None:
    rows = collect(releases)
    assert [r.version for r in rows] == ["0.10.0", "0.28.0", "0.33.0"]
    assert rows[1].state == "audit stopped: baseline failed (exit 4)"
    assert rows[0].carried == ("catalogue:flush-check-moved",)
    assert rows[0].catalogue == {"applied": 2, "stale": 0, "carried": 1, "not yet": 0}
    assert rows[2].findings[0]["id"] == "reset-bug"
    assert rows[2].score == 50.0
    assert rows[2].judged == 6


def test_the_three_pages_are_written(releases: Path) -> None:
    assert main([str(releases)]) == 0
    table = (releases / "releases.md").read_text()
    assert "| 0.28.0 | audit stopped: baseline failed (exit 4) |" in table
    assert "reset-bug (`docs/vllm-bug-reset.md`)" in table
    assert "- 0.10.0: `catalogue:flush-check-moved`" in table
    assert [r["version"] for r in json.loads((releases / "releases.json").read_text())] == [
        "0.10.0",
        "0.28.0",
        "0.33.0",
    ]


def test_a_folder_without_any_release_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no release audit") as info:
        write_pages(tmp_path)
    assert info.value.exit_code == ExitCode.USAGE
    assert main([str(tmp_path)]) == ExitCode.USAGE


@pytest.mark.browser
def test_the_releases_page_in_a_browser(releases: Path) -> None:
    executable = find_chromium()
    if executable is None:
        pytest.fail("no Chromium found: install Debian's chromium (nox -s tests does)")
    (index,) = [p for p in write_pages(releases) if p.name == "index.html"]
    browser = Browser(executable)
    try:
        browser.open(index)
        rows = browser.evaluate("document.querySelectorAll('#releases tbody tr').length")
        assert rows == 3
        assert browser.evaluate("document.querySelectorAll('#score-chart circle').length") == 4
        text = browser.visible_text("#releases")
        assert "audit stopped: baseline failed (exit 4)" in text
        assert "carried: catalogue:flush-check-moved" in text
        link = "document.querySelector('#releases a').getAttribute('href')"
        assert browser.evaluate(link) == "0.10.0/index.html"
        assert browser.script_errors() == []
    finally:
        browser.close()


def test_each_release_says_how_it_stands_since_its_standing(releases: Path, tmp_path: Path) -> None:
    """0.33.0 as recorded (unchanged), 0.10.0 with a mutant its standing records as
    killed now alive (worse, naming the test that killed it), a release with no
    standing (none)."""
    from audit.results.report_model import load_results
    from audit.results.standing import of_results, record

    standings = tmp_path / "standings"
    for version in ("0.33.0", "0.10.0"):
        results = load_results(releases / version / "audit.json")
        alive = {m.id: "accepted" for m in results.mutants if m.status.value != "killed"}
        accepted = of_results(results, alive)
        if version == "0.10.0":
            survivor = next(iter(accepted.alive))
            accepted.killed[survivor] = "tests/test_fence.py::test_it"
            del accepted.alive[survivor]
        record(standings, accepted)
    release(releases, "0.34.0")
    rows = {row.version: row for row in collect(releases, standings)}
    assert rows["0.33.0"].standing == "unchanged"
    assert rows["0.34.0"].standing == "no standing"
    assert rows["0.10.0"].standing == "worse"
    assert "tests/test_fence.py::test_it killed it" in rows["0.10.0"].standing_notes[0]
    assert main([str(releases), "--standings", str(standings)]) == 0
    table = (releases / "releases.md").read_text()
    assert "| worse; worse: Fence." in table
    assert "killed it in the standing; accepted alive: " in table
    assert "(accepted) |" in table  # an accepted survivor shows why it is accepted
