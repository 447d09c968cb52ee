"""A results file is believed only when it is one: ``fence-audit gate`` and ``report``
on a tampered, damaged, foreign or interrupted ``audit.json`` (issue 13, items 2, 7, 8).

Each case runs the real CLI on a file built from ``tests/unit/data/results.json``, with
an empty pyproject.toml (the built-in configuration), and checks the exit code and the
one line that says what is wrong; none may end in a traceback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from audit.baseline.coverage_map import write_coverage_map, write_regions
from audit.cli import main
from audit.core.errors import ExitCode
from audit.core.protocol import MutantStatus
from audit.mutation.equivalents import Equivalent, apply_equivalents
from audit.mutation.mutants import OutOfRegion
from audit.rendering.markdown_report import render_summary
from audit.results.report_model import load_results
from audit.results.scores import write_audit
from audit.results.view import EquivalentRecord
from audit.setup import model
from audit.setup.regions import Region, Span

DATA = Path(__file__).parents[1] / "unit" / "data" / "results.json"
VLLM_TEST = "tests/test_fence.py::test_register[a<b]"


def document() -> dict[str, Any]:
    """The hand-written results file: regions population and removal, 9 mutants."""
    loaded: dict[str, Any] = json.loads(DATA.read_text())
    return loaded


def add_up(audit: dict[str, Any]) -> dict[str, Any]:
    """Store the tallies the mutants make, as `fence-audit mutate` writes them."""

    def tally(mutants: list[dict[str, Any]]) -> dict[str, Any]:
        counts = Counter(m["status"] for m in mutants)
        judged = counts["killed"] + counts["survived"] + counts["timeout"]
        by_vllm = [m for m in mutants if m["status"] == "killed"]
        return {
            **{s: counts[s] for s in ("killed", "survived", "timeout", "no_tests", "error")},
            **{"equivalent": counts["equivalent"], "judged": judged},
            "score": round(100 * counts["killed"] / judged, 2) if judged else None,
            "killed_by_vllm": len(
                [m for m in by_vllm if not m["killed_by"].startswith("project/")]
            ),
        }

    audit["score"] = tally(audit["mutants"])
    for name, region in audit["regions"].items():
        region.update(tally([m for m in audit["mutants"] if m["region"] == name]))
    return audit


def all_killed(count: int = 20) -> dict[str, Any]:
    """The population region with ``count`` mutants, every one killed: 100%."""
    audit = document()
    template = audit["mutants"][0]  # killed by a test of vLLM's
    others = [m for m in audit["mutants"] if m["region"] != "population"]
    population = [{**template, "id": f"m{i}", "killed_by": VLLM_TEST} for i in range(count)]
    audit["mutants"] = population + others
    return add_up(audit)


def save(tmp_path: Path, audit: dict[str, Any], name: str = "audit.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(audit))
    return path


def cli(tmp_path: Path, command: str, results: Path, *args: str) -> int:
    config = tmp_path / "pyproject.toml"
    # the built-in configuration; nothing of this project's
    config.write_text("[tool.fence-audit]\n")
    reports = ["--reports", str(tmp_path / "reports")] if command == "report" else []
    return main([command, "--config", str(config), *reports, "--results", str(results), *args])


def said(capsys: pytest.CaptureFixture[str]) -> str:
    """The error's one line on stderr; never a traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("fence-audit: "), err
    assert err.count("\n") == 1, err
    return err


def refused(tmp_path: Path, audit: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    """``gate`` on ``audit``: exit 1, and its line."""
    code = cli(tmp_path, "gate", save(tmp_path, audit), "--fail-under-region", "population=50")
    line = said(capsys)
    assert code == ExitCode.USAGE == 1, line
    return line


def test_survivors_under_a_stored_100_percent_fail_the_gate_and_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    honest = save(tmp_path, all_killed(), "honest.json")
    assert cli(tmp_path, "gate", honest, "--fail-under-region", "population=100") == 0
    capsys.readouterr()
    tampered = all_killed()
    for mutant in tampered["mutants"][:20]:  # turned to survived; the tallies left at 100%
        mutant.update(status="survived", killed_by=None, failure=None)
    path = save(tmp_path, tampered)
    assert cli(tmp_path, "gate", path, "--fail-under-region", "population=100") == 1
    assert said(capsys).startswith(
        "fence-audit: the results file does not add up: "
        "regions.population.killed: the file says 20, its mutants say 0"
    )
    assert cli(tmp_path, "report", path) == 1
    err = capsys.readouterr().err
    assert "regions.population.survived" in err  # the details name the other fields
    assert not (tmp_path / "reports" / "index.html").exists()  # no "100.0%" page


def set_at(audit: dict[str, Any], where: tuple[str | int, ...], value: object) -> None:
    body: Any = audit
    for key in where[:-1]:
        body = body[key]
    body[where[-1]] = value


def says(field: str, stored: str, actual: str) -> str:
    return f"{field}: the file says {stored}, its mutants say {actual}"


# Each stored tally field, per region and overall, set to what its mutants do not make
# (where, the value), and the line's field, the value as shown and what the mutants make.
DISAGREEING = [
    (("regions", "population", "killed"), 5, says("regions.population.killed", "5", "2")),
    (("regions", "removal", "survived"), 0, says("regions.removal.survived", "0", "1")),
    (("regions", "removal", "timeout"), 0, says("regions.removal.timeout", "0", "1")),
    (("regions", "removal", "no_tests"), 0, says("regions.removal.no_tests", "0", "1")),
    (("regions", "removal", "error"), 0, says("regions.removal.error", "0", "1")),
    (("regions", "population", "equivalent"), 0, says("regions.population.equivalent", "0", "1")),
    (("regions", "population", "judged"), 2, says("regions.population.judged", "2", "3")),
    (("regions", "population", "score"), 100.0, says("regions.population.score", "100", "66.67")),
    (("regions", "removal", "score"), None, says("regions.removal.score", "null", "33.33")),
    (
        ("regions", "population", "killed_by_vllm"),
        2,
        says("regions.population.killed_by_vllm", "2", "1"),
    ),
    (("score", "killed"), 4, says("score.killed", "4", "3")),
    (("score", "judged"), 5, says("score.judged", "5", "6")),
    (("score", "score"), 60.0, says("score.score", "60", "50")),
    (("score", "killed_by_vllm"), 3, says("score.killed_by_vllm", "3", "2")),
    # an interrupted run's count of mutants judged: the file holds 9
    (("incomplete",), {"judged": 5, "of": 20}, says("incomplete.judged", "5", "9")),
]


@pytest.mark.parametrize(
    ("where", "value", "message"),
    DISAGREEING,
    ids=[message.partition(":")[0] for _, _, message in DISAGREEING],
)
def test_every_stored_count_and_score_must_be_what_the_mutants_make(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: tuple[str, ...],
    value: object,
    message: str,
) -> None:
    audit = document()
    set_at(audit, where, value)
    assert refused(tmp_path, audit, capsys).startswith(
        f"fence-audit: the results file does not add up: {message}"
    )


# A field of the wrong type, range or reference: (where, the value, what the line says).
DAMAGED = {
    "a null overall score": (("score",), None, "score: expected an object, got null"),
    "a negative count": (
        ("regions", "population", "survived"),
        -1,
        "regions.population.survived: expected at least 0, got -1",
    ),
    "a count of the wrong type": (
        ("score", "killed"),
        "3",
        "score.killed: expected a whole number, got a string",
    ),
    "an unknown status": (
        ("mutants", 4, "status"),
        "zombie",
        "mutants[4].status: 'zombie' is not one of "
        "killed, survived, timeout, no_tests, error, equivalent",
    ),
    "a test index out of range": (
        ("source", "functions", 1, "lines", 2, "tests"),
        [2, 99],
        "source.functions[1].lines[2].tests[1]: "
        "test index 99 is out of range (the file lists 4 tests)",
    ),
    "empty regions, which passed every check as not checked": (
        ("regions",),
        {},
        "regions: no region (every run judges at least one)",
    ),
    "a mutant of a region the file does not have": (
        ("mutants", 1, "region"),
        "flush",
        "mutants[1].region: 'flush' is not in regions (population, removal)",
    ),
    "an unexpected field (a typo of survived)": (
        ("regions", "removal", "survivors"),
        0,
        "regions.removal.survivors: unexpected field",
    ),
    "a mutant listed twice": (
        ("mutants", 8, "id"),
        "Fence.register:swap_op@3:15-3:24#0",
        "mutants[8].id: 'Fence.register:swap_op@3:15-3:24#0' is also mutants[0]",
    ),
    "a duration that is not a number": (
        ("duration_s",),
        float("nan"),
        "duration_s: expected a finite number from 0 to 1,000,000,000, got nan",
    ),
    "an unknown equivalence state": (
        ("equivalents", 0, "state"),
        "<b>fine</b>",
        "equivalents[0].state: '<b>fine</b>' is not one of "
        "applied, expired, killed, not survived, absent",
    ),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_results_file_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    where, value, message = DAMAGED[case]
    audit = document()
    set_at(audit, where, value)
    assert refused(tmp_path, audit, capsys).startswith(
        f"fence-audit: the results file is damaged: {message}"
    )


def test_empty_regions_are_refused_even_with_no_mutant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = document()
    audit["regions"] = {}
    audit["mutants"] = []
    add_up(audit)  # nothing to disagree with: still no run fence-audit writes
    assert refused(tmp_path, audit, capsys).startswith(
        "fence-audit: the results file is damaged: "
        "regions: no region (every run judges at least one) (file: "
    )


def test_a_folder_given_as_results_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    assert cli(tmp_path, "gate", folder) == 1
    assert said(capsys).startswith("fence-audit: ")


def target_of(tmp_path: Path) -> model.Target:
    source = tmp_path / "fence.py"
    source.write_text(
        "class Fence:\n    def register(self, job, blocks):\n        for block in blocks:\n"
        "            self.jobs.add(job)\n"
    )
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    return model.Target("toypkg.fence", source, source, digest)


def test_a_coverage_map_given_as_results_is_named_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = target_of(tmp_path)
    path = tmp_path / "coverage-map.json"
    write_coverage_map(
        model.CoverageMap(target, "0.33.0", {3: (VLLM_TEST,)}, {VLLM_TEST: 0.1}), path
    )
    assert cli(tmp_path, "gate", path) == 1
    assert said(capsys).startswith(
        "fence-audit: coverage-map.json is a coverage map, not the results of `fence-audit mutate`"
    )
    regions = tmp_path / "regions.json"
    run = model.BaselineRun(target, (), tmp_path / ".coverage", tmp_path / "baseline.log", 1.0)
    write_regions((region_coverage(),), run, regions)
    assert cli(tmp_path, "report", regions) == 1
    assert said(capsys).startswith(
        "fence-audit: regions.json is a region coverage file (regions.json), not the results "
        "of `fence-audit mutate`"
    )


def region_coverage() -> model.RegionCoverage:
    return model.RegionCoverage(
        "population",
        "registration",
        ("Fence.register",),
        (("Fence.register", 3, 4),),
        model.Fraction(2, 2),
        model.Fraction(1, 1),
        (),
        (VLLM_TEST,),
    )


def written(tmp_path: Path, incomplete: tuple[int, int] | None = None) -> Path:
    """audit.json as ``results.write_audit`` writes it: one killed mutant of 3."""
    target = target_of(tmp_path)
    mutant = model.Mutant(
        "Fence.register:swap_op@1:8-1:11#0",
        "mutmut",
        "population",
        "Fence.register",
        "swap_op",
        0,
        3,
        (3,),
        "--- a\n+++ b\n",
        (),
        (VLLM_TEST,),
    )
    verdict = model.MutantResult(
        mutant.id, MutantStatus.KILLED, VLLM_TEST, "assert", (VLLM_TEST,), 0.1
    )
    path = tmp_path / "audit.json"
    write_audit(
        path,
        target=target,
        vllm_version="0.33.0",
        suite={"tests_from": "sdist", "paths": ["vllm:tests/test_fence.py"]},
        mutants=(mutant,),
        verdicts={mutant.id: verdict},
        out_of_region=(OutOfRegion("Fence.register:x@2:0-2:1#0", "Fence.register", 4),),
        regions=(Region("population", "registration", (Span("Fence.register", 3, 4, ""),)),),
        coverage=(region_coverage(),),
        coverage_map=model.CoverageMap(target, "0.33.0", {3: (VLLM_TEST,)}, {VLLM_TEST: 0.1}),
        line_coverage={3: "covered", 4: "covered"},
        started_at="2026-12-01T00:00:00+00:00",
        duration_s=1.0,
        equivalents=[{"id": "x", "state": "absent", "reason": "r", "reviewed": "today"}],
        incomplete=incomplete,
    )
    return path


def test_what_write_audit_writes_reads_back_and_a_complete_run_has_no_incomplete_field(
    tmp_path: Path,
) -> None:
    path = written(tmp_path)
    assert "incomplete" not in json.loads(path.read_text())
    results = load_results(path)
    assert results.incomplete is None
    assert (results.overall.killed, results.overall.judged, results.out_of_region) == (1, 1, 1)


def test_a_mutant_gives_its_tests_as_places_in_the_file_s_tests(tmp_path: Path) -> None:
    written_file = json.loads(written(tmp_path).read_text())
    assert written_file["format"] == 3
    assert written_file["tests"] == [VLLM_TEST]
    (mutant,) = written_file["mutants"]
    assert (mutant["covered_by"], mutant["tests_run"], mutant["killed_by"]) == ([0], [0], VLLM_TEST)
    (read,) = load_results(tmp_path / "audit.json").mutants
    assert (read.covered_by, read.tests_run) == ((VLLM_TEST,), 1)


def by_place(audit: dict[str, Any]) -> dict[str, Any]:
    """``audit`` (format 2, tests named) as format 3 writes it: tests by their place."""
    place = {test: number for number, test in enumerate(audit["tests"])}
    for mutant in audit["mutants"]:
        for key in ("covered_by", "tests_run"):
            mutant[key] = [place[test] for test in mutant[key]]
    return {**audit, "format": 3}


def test_a_format_2_file_reads_as_the_same_run_written_as_format_3(tmp_path: Path) -> None:
    old = load_results(save(tmp_path, document(), "old.json"))
    new = load_results(save(tmp_path, by_place(document()), "new.json"))
    assert any(m.covered_by for m in old.mutants)
    assert dataclasses.replace(new, path=old.path) == old


OUT_OF_PLACE = {
    "an index past the tests": (
        ("covered_by", [4]),
        "mutants[0].covered_by[0]: test index 4 is out of range (the file lists 4 tests)",
    ),
    "a name in format 3": (
        ("tests_run", ["t.py::a"]),
        "mutants[0].tests_run[0]: expected a whole number, got a string",
    ),
}


@pytest.mark.parametrize("case", OUT_OF_PLACE)
def test_a_format_3_mutant_s_tests_must_be_places_in_the_file_s_tests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    (key, value), message = OUT_OF_PLACE[case]
    audit = by_place(document())
    audit["mutants"][0][key] = value
    line = refused(tmp_path, audit, capsys)
    assert line.startswith(f"fence-audit: the results file is damaged: {message}")


def test_a_results_file_of_another_format_says_which_formats_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(tmp_path, {**document(), "format": 4}, capsys)
    assert line.startswith(
        "fence-audit: the results file has format 4; this fence-audit reads format 2 and 3"
    )


def test_the_gate_refuses_an_interrupted_run_with_13_and_the_reports_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = written(tmp_path, incomplete=(1, 3))
    assert json.loads(path.read_text())["incomplete"] == {"judged": 1, "of": 3}
    assert cli(tmp_path, "gate", path) == ExitCode.INCOMPLETE == 13
    assert said(capsys).startswith(
        "fence-audit: the results are incomplete: the run was interrupted after 1 of 3 "
        "mutants; the gate cannot pass on them"
    )
    assert cli(tmp_path, "report", path) == 0
    reports = tmp_path / "reports"
    banner = "the run was interrupted after 1 of 3 mutants; run"
    assert (
        f"Incomplete: {banner} <code>fence-audit mutate</code> again to resume."
        in (reports / "index.html").read_text()
    )
    assert (
        f"**Incomplete**: {banner} `fence-audit mutate` again to resume."
        in (reports / "summary.md").read_text()
    )


def test_summary_md_escapes_the_vllm_version_and_the_equivalence_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = document()
    audit["vllm_version"] = "0.33.0 <img src=x onerror=alert(1)> | x"
    assert cli(tmp_path, "report", save(tmp_path, audit)) == 0
    summary = (tmp_path / "reports" / "summary.md").read_text()
    assert summary.splitlines()[0].endswith(
        "(vLLM 0.33.0 &lt;img src=x onerror=alert(1)&gt; \\| x)"
    )
    assert "<img" not in summary
    # A state the file cannot hold (it is refused on read), rendered from the view.
    results = load_results(DATA)
    odd = EquivalentRecord("Fence.remove:x@1:0-1:1#0", "<b>gone</b> | now", "why", "")
    summary = render_summary(dataclasses.replace(results, equivalents=(odd,)))
    assert "- `Fence.remove:x@1:0-1:1#0`: &lt;b&gt;gone&lt;/b&gt; \\| now. why" in summary


def test_with_region_the_equivalents_of_other_regions_are_not_flagged_absent() -> None:
    flush = Region("flush", "", (Span("S._build_connector_meta", 10, 12, ""),))
    records = [
        Equivalent("S._build_connector_meta:swap_op@4:1-4:2#0", "h", "flush's", "today"),
        Equivalent("catalogue:flush-early", "h", "a catalogue entry's", "today"),
        Equivalent("S._remove_pending_job:swap_op@1:1-1:2#0", "h", "gone", "today"),
    ]
    # `--region removal`: flush left out, and none of the three mutants in the run
    _, states = apply_equivalents([], {}, {}, records, left_out=(flush,))
    assert [(s["id"], s["state"]) for s in states] == [(records[2].id, "absent")]
    # a run of every region: each missing record is flagged
    _, states = apply_equivalents([], {}, {}, records)
    assert [s["state"] for s in states] == ["absent"] * 3


@pytest.mark.parametrize(
    ("held", "says"),
    [
        ([], "the results file holds a list, not the object `fence-audit mutate` writes"),
        (None, "the results file holds null, not the object"),
        ("hi", "the results file holds a string, not the object"),
        ({}, "the results file has no format field: not an audit.json of fence-audit's"),
    ],
    ids=["a list", "null", "a string", "an object without format"],
)
def test_a_file_that_is_no_audit_json_at_all_says_what_it_holds(
    tmp_path: Path, held: object, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(held))
    assert cli(tmp_path, "gate", path) == ExitCode.USAGE
    assert said(capsys).startswith(f"fence-audit: {says}")


def test_a_missing_file_to_compare_with_is_named_as_the_compare_option_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = save(tmp_path, document())
    assert cli(tmp_path, "report", results, "--compare", str(tmp_path / "old.json")) == 1
    assert said(capsys).startswith(f"fence-audit: --compare: no results file (file: {tmp_path}")
