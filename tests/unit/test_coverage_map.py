"""The coverage map and region coverage, from coverage data recorded in-process."""

from __future__ import annotations

import importlib.util
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import coverage

from audit.baseline import coverage_map
from audit.core.protocol import TestOutcome, TestResult
from audit.setup.model import BaselineRun, Target
from audit.setup.region_specs import RegionSpec, Selection, StatementSelector
from audit.setup.regions import resolve_regions

SOURCE = textwrap.dedent(
    """\
    def register(fence, job, blocks):
        for block in blocks:
            if block == 0:
                continue
            fence.setdefault(block, set()).add(job)


    def remove(fence, job, blocks):
        for block in blocks:
            fence[block].discard(job)
            if not fence[block]:
                del fence[block]


    def untested(fence):
        fence.clear()
    """
)
REGIONS = (
    RegionSpec("population", "", (Selection("register"),)),
    RegionSpec("removal", "", (Selection("remove", (StatementSelector("del fence[block]"),)),)),
    RegionSpec("reset", "", (Selection("untested"),)),
)


def record(
    tmp_path: Path, name: str, source: str, tests: dict[str, Callable[[ModuleType], object]]
) -> BaselineRun:
    """``source`` imported as ``name`` under coverage, then each of ``tests`` run in a
    context of its own (its id), as the test process records the baseline."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    data_file = tmp_path / "data.coverage"
    cov = coverage.Coverage(
        data_file=str(data_file), branch=True, include=[str(path)], config_file=False
    )
    cov.start()
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for test_id, body in tests.items():
        cov.switch_context(test_id)
        body(module)
    cov.switch_context("")
    cov.stop()
    cov.save()
    results = tuple(
        # durations 0.5, 0.25, ...: each test's own, for the map's duration checks
        TestResult(test_id, TestOutcome.PASSED, 0.5 / (i + 1))
        for i, test_id in enumerate(tests)
    )
    return BaselineRun(
        Target(name, path, path, "0" * 64), results, data_file, tmp_path / "log", 1.0
    )


def recorded_run(tmp_path: Path) -> BaselineRun:
    """Two 'tests' run under coverage with a context each, as the test process does."""
    fence: dict[int, set[int]] = {}

    def removes(module: ModuleType) -> None:
        module.register(fence, 2, [6])
        module.remove(fence, 2, [6])

    return record(
        tmp_path,
        "toyfence",
        SOURCE,
        {
            "t.py::test_register": lambda module: module.register(fence, 1, [0, 5]),
            "t.py::test_remove": removes,
        },
    )


def test_line_map_names_exactly_the_tests_that_ran_each_line(tmp_path: Path) -> None:
    cmap = coverage_map.build_coverage_map(recorded_run(tmp_path), "toy")
    assert cmap.lines[4] == ("t.py::test_register",)  # `continue` only for block 0
    assert cmap.lines[5] == ("t.py::test_register", "t.py::test_remove")
    assert cmap.lines[12] == ("t.py::test_remove",)
    assert 16 not in cmap.lines
    assert 1 not in cmap.lines  # the def line ran at import, in the empty context
    assert cmap.durations == {"t.py::test_register": 0.5, "t.py::test_remove": 0.25}


def test_region_counts_lines_branches_and_tests(tmp_path: Path) -> None:
    run = recorded_run(tmp_path)
    regions = resolve_regions(SOURCE, REGIONS, filename="toyfence.py")
    population, removal, reset = coverage_map.region_coverage(run, regions)
    assert (population.lines.covered, population.lines.total) == (4, 4)
    # `for` (more blocks / done) and `if` (skip / register): all four exits taken
    assert (population.branches.covered, population.branches.total) == (4, 4)
    assert population.tests == ("t.py::test_register", "t.py::test_remove")
    assert (removal.lines.covered, removal.lines.total, removal.branches.total) == (1, 1, 0)
    assert (reset.lines.covered, reset.lines.total, reset.missed_lines) == (0, 1, (16,))
    assert reset.tests == ()


def test_coverage_map_file_is_versioned_and_indexed(tmp_path: Path) -> None:
    import json

    cmap = coverage_map.build_coverage_map(recorded_run(tmp_path), "toy")
    coverage_map.write_coverage_map(cmap, tmp_path / "map.json")
    data = json.loads((tmp_path / "map.json").read_text())
    assert data["format"] == 1
    tests = [t["id"] for t in data["tests"]]
    assert [tests[i] for i in data["lines"]["12"]] == ["t.py::test_remove"]
    assert not list(tmp_path.glob("*.tmp"))


def test_region_table_lists_every_region_with_its_counts(tmp_path: Path) -> None:
    regions = resolve_regions(SOURCE, REGIONS, filename="toyfence.py")
    table = coverage_map.format_table(coverage_map.region_coverage(recorded_run(tmp_path), regions))
    rows = table.splitlines()
    assert rows[0].split() == ["region", "functions", "lines", "branches", "tests"]
    assert rows[2].split()[:3] == ["population", "1", "4/4"]
    assert rows[4].split()[:3] == ["reset", "1", "0/1"]


MULTILINE = textwrap.dedent(
    """\
    def admit(fence, block, job, strict):
        if (
            block in fence
            and job in fence[block]
        ):
            return fence.setdefault(
                block,
                set(),
            )
        if strict and (
            job
            > 3
        ):
            raise ValueError(job)
        return None
    """
)


def coverage_py_figures(data_file: Path, path: Path, lines: set[int]) -> tuple[int, ...]:
    """Lines covered and total, branches covered and total, of ``lines`` of ``path``, as
    coverage.py's own JSON report counts them (the statement's first line; every exit
    of a line with more than one)."""
    import json

    cov = coverage.Coverage(data_file=str(data_file), branch=True, config_file=False)
    cov.load()
    out = data_file.with_suffix(".json")
    cov.json_report(outfile=str(out), include=[str(path)])
    (report,) = json.loads(out.read_text())["files"].values()
    executed = set(report["executed_lines"]) & lines
    missing = set(report["missing_lines"]) & lines
    taken = [a for a in report["executed_branches"] if a[0] in lines]
    not_taken = [a for a in report["missing_branches"] if a[0] in lines]
    return len(executed), len(executed | missing), len(taken), len(taken) + len(not_taken)


def test_multi_line_statements_count_as_coverage_py_counts_them(tmp_path: Path) -> None:
    """A multi-line condition or call is one statement, known by its first line: the
    tracer may report only its inner lines, and the region's figures still equal
    coverage.py's own analysis of the same data (the `if (` line is covered)."""

    def admits(module: ModuleType) -> None:
        module.admit({1: {7}}, 1, 7, strict=False)
        module.admit({}, 2, 1, strict=True)

    run = record(tmp_path, "toyadmit", MULTILINE, {"t.py::test_admit": admits})
    path, data_file = run.target.path, run.data_file
    spec_ = RegionSpec("admission", "", (Selection("admit"),))
    (region,) = resolve_regions(MULTILINE, (spec_,), filename="toyadmit.py")
    (measured,) = coverage_map.region_coverage(run, (region,))
    ours = (
        measured.lines.covered,
        measured.lines.total,
        measured.branches.covered,
        measured.branches.total,
    )
    assert ours == coverage_py_figures(data_file, path, set(region.lines))
    assert measured.missed_lines == (14,)  # only the raise; `if (` (2) and `if strict` (9) ran
    statuses = coverage_map.line_coverage(run)
    assert statuses[2] == "covered"
    assert statuses[6] == "covered"
    assert measured.tests == ("t.py::test_admit",)
