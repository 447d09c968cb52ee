"""The reports, rendered from a fixed hand-written results file.

Golden files hold the expected HTML, Markdown and JUnit. On a mismatch the actual
output is saved beside the test's temporary folder and its path printed; after a
deliberate change, re-bless with ``nox -s tests -- tests/unit/test_reports.py --bless``
and review the diff of ``tests/unit/golden/``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from audit import __version__
from audit.cli import main
from audit.core.errors import ConfigError, ExitCode
from audit.core.protocol import MutantStatus
from audit.core.text import INVISIBLE
from audit.rendering.html_report import render_index, render_region
from audit.rendering.junit_report import render_junit
from audit.rendering.markdown_report import render_summary
from audit.rendering.reports import write_reports
from audit.results.report_model import load_results
from audit.results.view import AuditResults, SecondJudgement

DATA = Path(__file__).parent / "data" / "results.json"
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def results() -> AuditResults:
    return load_results(DATA)


def scrub(text: str) -> str:
    """Volatile values out: the version of the fence-audit that renders."""
    return text.replace(f"fence-audit {__version__}", "fence-audit VERSION")


def check_golden(name: str, actual: str, bless: bool, tmp_path: Path) -> None:
    gold = GOLDEN / name
    actual = scrub(actual)
    if bless:
        gold.write_text(actual)
        return
    if not gold.is_file() or gold.read_text() != actual:
        saved = tmp_path / "actual" / name
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(actual)
        pytest.fail(f"{name} differs from {gold}; actual output saved in {saved} (--bless)")


def test_index_html_matches_golden(results: AuditResults, bless: bool, tmp_path: Path) -> None:
    check_golden("index.html", render_index(results), bless, tmp_path)


def test_region_page_matches_golden(results: AuditResults, bless: bool, tmp_path: Path) -> None:
    page = render_region(results, results.region("removal"))
    check_golden("region-removal.html", page, bless, tmp_path)


def test_a_line_s_covering_tests_are_listed_once_before_its_mutants(
    results: AuditResults,
) -> None:
    page = render_region(results, results.region("removal"))
    on_line = [m for m in results.mutants_of("removal") if m.line == 12]
    assert len(on_line) == 2
    rows = re.findall(r'<tr class="mutants">.*?</td></tr>', page, re.S)
    (row,) = [r for r in rows if 'id="tests-L12"' in r]
    assert row.count("test_remove</code>") == 1  # listed once, for both
    assert row.count('<a href="#tests-L12">') == 2  # each mutant points to it
    assert row.index('id="tests-L12"') < row.index('<details class="mutant')


def test_summary_matches_golden(results: AuditResults, bless: bool, tmp_path: Path) -> None:
    check_golden("summary.md", render_summary(results), bless, tmp_path)


def test_summary_with_compare_matches_golden(
    results: AuditResults, bless: bool, tmp_path: Path
) -> None:
    check_golden("summary-compare.md", render_summary(results, older(tmp_path)), bless, tmp_path)


def test_junit_matches_golden(results: AuditResults, bless: bool, tmp_path: Path) -> None:
    check_golden("junit.xml", render_junit(results), bless, tmp_path)


def older(tmp_path: Path) -> AuditResults:
    """The fixture as an earlier run: one survivor was killed, one mutant is new since.

    Built as a view, not read from a file: its tallies are set by hand (population 3
    killed of 3, removal and overall as now), as summary-compare.md was rendered with.
    Its mutants do not add up to them, so ``load_results`` would refuse such a file."""
    results = load_results(DATA)
    mutants = [m for m in results.mutants if m.id != "catalogue:removal-early"]
    killer = "tests/test_fence.py::test_remove"
    mutants[1] = dataclasses.replace(mutants[1], status=MutantStatus.KILLED, killed_by=killer)
    regions = tuple(
        dataclasses.replace(r, tally=dataclasses.replace(r.tally, killed=3, survived=0))
        if r.name == "population"
        else r
        for r in results.regions
    )
    return dataclasses.replace(
        results, path=tmp_path / "old.json", mutants=tuple(mutants), regions=regions
    )


def test_compare_lists_changed_new_and_score_change(results: AuditResults, tmp_path: Path) -> None:
    summary = render_summary(results, older(tmp_path))
    assert "| `Fence.register:swap_op@3:29-3:36#1` | killed | survived |" in summary
    assert "| `catalogue:removal-early` | (absent) | survived |" in summary
    assert "| population | 66.7% | 33.3% | 2 | 1 | 0 | 0 | 0 | 4/4 | 2/2 | -33.3 |" in summary


def test_untrusted_text_is_shown_as_text_never_markup(results: AuditResults) -> None:
    pages = render_index(results) + "".join(render_region(results, r) for r in results.regions)
    assert "<script>" not in pages
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in pages
    assert "<b>not bold</b>" not in pages
    assert "if block &lt; 0 and job &amp; 1:" in pages
    assert "test_register[a&lt;b]" in pages
    assert "&lt;set()&gt;" in pages  # a failure message


def test_catalogue_shows_expected_and_actual_killer_and_stale_entries(
    results: AuditResults,
) -> None:
    page = render_index(results)
    section = page[page.index('id="catalogue"') : page.index('id="mutants"')]
    assert "Catalogue entries (3, 1 stale)" in section
    assert (
        "STALE: no statement of Fence.register contains &#x27;check()&#x27; &amp; more" in section
    )
    assert "only this project&#x27;s did" in section
    summary = render_summary(results)
    assert "### Stale catalogue entries (1)" in summary
    assert "### Catalogue entries against expectation (2)" in summary


def test_equivalents_are_shown_with_reasons_and_flags(results: AuditResults) -> None:
    page = render_index(results)
    section = page[page.index('id="equivalents"') : page.index('id="mutants"')]
    assert "Equivalent mutants (2)" in section
    assert "adding it once &amp; &lt;nothing&gt; changes." in section
    assert '<span class="flag">killed</span>' in section
    summary = render_summary(results)
    assert "### Equivalent mutants (2)" in summary
    assert "`Fence.remove:swap_op@3:15-3:24#0`: killed." in summary
    region = render_region(results, results.region("population"))
    assert "equivalent, because" in region


def test_vllm_alone_score_counts_only_kills_by_vllm_tests(results: AuditResults) -> None:
    population = results.region("population")
    assert population.tally.killed == 2
    assert population.killed_by_vllm == 1
    assert population.vllm_score == pytest.approx(100 / 3)


def test_junit_lists_each_mutant_and_survivors_as_failures(results: AuditResults) -> None:
    root = ET.fromstring(render_junit(results))
    cases = root.findall(".//testcase")
    assert len(cases) == len(results.mutants) + len(results.stale())
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert failed == {m.id for m in results.mutants if m.status.value in ("survived", "timeout")}
    assert root.get("failures") == "3"
    assert root.get("errors") == "1"
    assert root.get("skipped") == "3"  # no tests, the equivalent, the stale catalogue entry


def test_index_shows_score_with_its_denominator(results: AuditResults) -> None:
    page = render_index(results)
    assert '<p id="score">50.0%</p>' in page
    assert "3 killed of 6 judged (killed + survived + timeout: 3 + 2 + 1)" in page
    assert "1 with no covering test, 1 errors" in page
    # survivors come before every other mutant
    assert page.index('id="survivors"') < page.index('id="mutants"')


def test_every_mutant_link_points_at_an_anchor_on_its_region_page(
    results_on_disk: AuditResults, tmp_path: Path
) -> None:
    results = results_on_disk
    written = write_reports(results, tmp_path)
    index = written.index.read_text()
    links = re.findall(r'href="(regions/[^"#]+)#([^"]+)"', index)
    assert len(links) == len(results.mutants) + len(
        [m for m in results.mutants if m.origin == "catalogue"]
    )
    for page, anchor in links:
        assert f'id="{anchor}"' in (tmp_path / page).read_text()


@pytest.mark.parametrize(
    ("results", "says"),
    [
        (lambda good: good[:500], "not valid JSON"),
        (lambda good: json.dumps({**json.loads(good), "format": 1}), "format 1"),
    ],
    ids=["cut short", "an old format"],
)
def test_the_report_command_on_a_damaged_results_file_leaves_earlier_reports_untouched(
    results_on_disk: AuditResults,
    tmp_path: Path,
    results: Callable[[str], str],
    says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    reports = tmp_path / "reports"
    write_reports(results_on_disk, reports)
    before = {p: p.read_bytes() for p in reports.rglob("*") if p.is_file()}
    damaged = tmp_path / "audit.json"
    damaged.write_text(results(DATA.read_text()))
    config = tmp_path / "pyproject.toml"  # not this project's: nothing of it leaks in
    config.write_text("[tool.fence-audit]\n")
    argv = ["report", "--config", str(config), "--reports", str(reports)]
    assert main([*argv, "--results", str(damaged)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert says in err, err
    assert err.count("\n") == 1, err
    assert {p: p.read_bytes() for p in reports.rglob("*") if p.is_file()} == before


def test_a_failing_renderer_writes_nothing(
    results_on_disk: AuditResults, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import audit.rendering.reports

    def broken(*args: object) -> str:
        raise RuntimeError("renderer bug")

    monkeypatch.setattr(audit.rendering.reports, "render_junit", broken)
    with pytest.raises(RuntimeError):
        write_reports(results_on_disk, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def test_pages_need_no_network(results_on_disk: AuditResults, tmp_path: Path) -> None:
    written = write_reports(results_on_disk, tmp_path)
    for page in [written.index, *written.regions]:
        text = page.read_text()
        assert not re.search(r'(src|href)="(https?:)?//', text), page
        assert "<script" not in text
        assert "<link" not in text


def test_golden_files_are_current() -> None:
    """Every golden file belongs to a test above (a stale one would test nothing)."""
    names = {p.name for p in GOLDEN.iterdir()}
    assert names == {
        "index.html",
        "region-removal.html",
        "summary.md",
        "summary-compare.md",
        "junit.xml",
    }


def test_mutants_of_another_module_get_their_own_section(tmp_path: Path) -> None:
    document = json.loads(DATA.read_text())
    worker = document["mutants"][3]  # a removal mutant, moved to another module
    worker.update(module="toypkg.worker", path="/src/toypkg/worker.py", line=900)
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(document))
    results = load_results(path)
    page = render_region(results, results.region("removal"))
    section = page[page.index("<h2>In <code>toypkg.worker</code></h2>") :]
    assert f'id="{results.mutants[3].anchor}"' in section
    assert "Mutants outside the functions shown" not in page


def test_tests_stopped_as_hung_are_read_back_and_shown(tmp_path: Path) -> None:
    document = json.loads(DATA.read_text())
    killed = next(m for m in document["mutants"] if m["status"] == "killed")
    hung = "tests/test_fence.py::test_drain > 0.5s of CPU"
    killed["hung"] = [hung]  # as a verdict writes it: test id, then why
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(document))
    results = load_results(path)
    (mutant,) = [m for m in results.mutants if m.id == killed["id"]]
    assert mutant.hung == (hung,)
    page = render_region(results, results.region(mutant.region))
    assert "tests stopped as hung" in page
    assert "test_drain &gt; 0.5s of CPU" in page


HOSTILE_ID = "tests/t.py::test_y[` <img src=x> [click](https://evil.example) @octocat `]"
HOSTILE_FAILURE = (
    "\x1b[31mE  assert 1 == 2\x1b[0m \x00\x0c \ud800 \u202eevil\n```\n<img src=x>\n```"
)


def hostile(results: AuditResults) -> AuditResults:
    """The fixture's mutants with a test's worst legal text: ANSI colours, NUL, a form
    feed, a lone surrogate, a right-to-left override, backticks and a closing fence;
    the survivor also has a deep look that killed it, with such a killer and failure."""
    mutants = []
    deep = SecondJudgement(MutantStatus.KILLED, HOSTILE_ID, HOSTILE_FAILURE, 3.0)
    for m in results.mutants:
        if m.status is MutantStatus.KILLED:
            changed = dataclasses.replace(m, killed_by=HOSTILE_ID, failure=HOSTILE_FAILURE)
        elif m.status is MutantStatus.SURVIVED:
            diff = m.diff + "+\x0c" + HOSTILE_FAILURE
            changed = dataclasses.replace(m, diff=diff, deep=deep)
        else:
            changed = dataclasses.replace(m, failure=HOSTILE_FAILURE)
        mutants.append(changed)
    return dataclasses.replace(results, mutants=tuple(mutants), deep_look=("deep", 60.0))


def test_a_test_s_control_characters_are_shown_escaped_in_every_report(
    results: AuditResults,
) -> None:
    view = hostile(results)
    junit = render_junit(view)
    ET.fromstring(junit.split("\n", 1)[1])  # well-formed XML 1.0
    pages = render_index(view) + "".join(render_region(view, r) for r in view.regions)
    summary = render_summary(view)
    for text in (junit, pages, summary):
        assert not INVISIBLE.search(text), repr(INVISIBLE.search(text))
        assert "\\x1b[31m" in text or "\\x1b" in text
    assert "\\u202eevil" in pages
    assert "<img" not in pages


def test_backticks_in_a_test_id_or_a_failure_stay_inside_their_code(
    results: AuditResults,
) -> None:
    """A pytest id keeps backticks; a failure may hold a fence: neither closes the code
    around it in the pull-request comment, so nothing in it renders as a link, an
    image or a mention."""
    summary = render_summary(hostile(results))
    assert f"``` {HOSTILE_ID} ```" in summary or f"`` {HOSTILE_ID} ``" in summary
    outside = re.sub(r"(`+) .*? \1|(`{4,})[a-z]*\n.*?\n\2", "", summary, flags=re.S)
    assert "<img" not in outside
    assert "](https://evil.example)" not in outside
    assert "@octocat" not in outside


def test_a_lone_surrogate_is_written_as_its_escape(
    results_on_disk: AuditResults, tmp_path: Path
) -> None:
    view = hostile(results_on_disk)
    written = write_reports(view, tmp_path / "hostile", None)
    assert "\\ud800" in written.summary.read_text(encoding="utf-8")


def test_a_region_name_that_is_a_path_is_refused(tmp_path: Path) -> None:
    document = json.loads(DATA.read_text())
    document["regions"] = {
        ("../../victim" if k == "removal" else k): v for k, v in document["regions"].items()
    }
    for mutant in document["mutants"]:
        if mutant["region"] == "removal":
            mutant["region"] = "../../victim"
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"regions\.\.\./\.\./victim: not a region name"):
        load_results(path)
