"""From the baseline's coverage data to what later stages read.

- the line -> test ids map of the target file (``reports/coverage-map.json``),
- per-region line and branch coverage and the tests that touch each region
  (``reports/regions.json``),
- coverage.py's own HTML with contexts shown (``reports/coverage/``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import coverage
from coverage.misc import join_regex
from coverage.parser import PythonParser

from audit.core.files import replaced_dir, write_json
from audit.core.outputs import claim, replaced_folder
from audit.setup.model import (
    COVERAGE_MAP_FORMAT,
    REGIONS_FORMAT,
    BaselineRun,
    CoverageMap,
    Fraction,
    RegionCoverage,
    fraction_text,
)
from audit.setup.regions import Region


def build_coverage_map(run: BaselineRun, vllm_version: str) -> CoverageMap:
    by_line = _measured(run).contexts
    left_out = run.finding_tests  # a finding's tests fail on the unmutated code: no judge
    lines = {
        line: tuple(sorted(c for c in contexts if c and c not in left_out))
        for line, contexts in sorted(by_line.items())
    }
    return CoverageMap(
        target=run.target,
        vllm_version=vllm_version,
        lines={line: tests for line, tests in lines.items() if tests},
        durations={t.test_id: t.duration_s for t in run.tests if t.test_id not in left_out},
    )


@dataclass(frozen=True, slots=True)
class _Measured:
    """The target's statements and possible arcs, and what the baseline executed, in
    coverage.py's terms: a statement is known by its first line, so a line the tracer
    saw inside a multi-line statement (the second line of an ``if (`` condition)
    counts for the statement, as coverage.py's own analysis and HTML count it."""

    statements: set[int]
    exits: dict[int, set[int]]  # statement -> the statements control may go to from it
    branch_lines: set[int]  # statements with more than one exit (coverage.py's branches)
    executed_lines: set[int]
    executed_arcs: set[tuple[int, int]]
    contexts: dict[int, list[str]]  # as the tracer saw the lines: the coverage map's key
    statement_contexts: dict[int, set[str]]  # by statement (first line)


def _measured(run: BaselineRun) -> _Measured:
    """What the baseline measured: read once per data file (as it is on disk now)."""
    stat = run.data_file.stat()
    return _read_measured(run.data_file, run.target.path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read_measured(data_file: Path, target: Path, mtime_ns: int, size: int) -> _Measured:
    # coverage.py's default exclusions, as its HTML (rendered with config_file=False)
    # applies them
    exclude = join_regex(coverage.Coverage(config_file=False).config.exclude_list)
    parser = PythonParser(filename=str(target), exclude=exclude)
    parser.parse_source()
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    exits: dict[int, set[int]] = defaultdict(set)
    for source, dest in parser.arcs():
        exits[source].add(dest)
    path = str(target)
    contexts = dict(data.contexts_by_lineno(path))
    statement_contexts: dict[int, set[str]] = defaultdict(set)
    for line, names in contexts.items():
        statement_contexts[parser.first_line(line)].update(names)
    return _Measured(
        statements=set(parser.statements),
        exits=exits,
        branch_lines={line for line, count in parser.exit_counts().items() if count > 1},
        executed_lines=parser.translate_lines(data.lines(path) or ()),
        executed_arcs=parser.translate_arcs(data.arcs(path) or ()),
        contexts=contexts,
        statement_contexts=statement_contexts,
    )


def render_html(run: BaselineRun, folder: Path) -> None:
    """coverage.py's HTML for the target file, contexts shown, into ``folder``; it
    touches nothing else (:class:`HtmlInBackground` runs it beside the mutants)."""
    _render(run.data_file, run.target.path, run.target.module, folder)


def _render(data_file: Path, target: Path, module: str, folder: Path) -> None:
    cov = coverage.Coverage(data_file=str(data_file), branch=True, config_file=False)
    cov.load()
    cov.html_report(
        directory=str(folder),
        include=[str(target)],
        show_contexts=True,
        title=f"fence-audit baseline: {module}",
    )


class HtmlInBackground:
    """The coverage HTML rendered by a process of its own at the lowest CPU priority,
    while the mutants are judged, then put in place by :meth:`finish`.

    It costs 0.7 s of one core on vLLM 0.33.0's scheduler, and it came between the
    baseline and the mutants: time both cores waited. At nice 19 the process takes
    what the judging leaves idle (its forks run at normal priority); whatever is
    left when the judging ends runs then. The process writes only its scratch folder;
    the reports folder and its list of what fence-audit wrote are touched by the
    caller alone (:meth:`finish`).

    A process, not a thread: CPython 3.11's ``ast`` module keeps one recursion count
    for the whole interpreter, so coverage.py parsing the target on a thread while
    the caller's thread parses too can fail with "AST constructor recursion depth
    mismatch" (CPython gh-106905). It did, once, in CI (2026-12-07, a toy shard
    run under load). The process has a session of its own: a Ctrl-C at the terminal,
    or a SIGTERM to the run's process group, stops the run, not the rendering, which
    ends on its own well within a second, and an interrupted run's :meth:`finish`
    still puts it in place, as the thread's did.
    """

    def __init__(self, run: BaselineRun, directory: Path, kept: Path | None, work: Path):
        self.run, self.directory, self.kept = run, directory, kept
        self.folder = work / "coverage-html"
        shutil.rmtree(self.folder, ignore_errors=True)  # in the scratch folder: ours
        self.done = False
        argv = [str(run.data_file), str(run.target.path), run.target.module, str(self.folder)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "audit.baseline.coverage_map", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.stderr = ""

    def wait(self) -> int:
        """Wait for the rendering; its exit code."""
        if self.process.returncode is None:
            _, self.stderr = self.process.communicate()
        return self.process.returncode

    def finish(self) -> None:
        """Wait for the rendering, then replace the reports' coverage folder (once)."""
        if self.done:
            return
        self.done = True
        if self.wait() != 0:
            lines = self.stderr.strip().splitlines() or [f"exit code {self.process.returncode}"]
            raise HtmlRenderError(f"coverage.py's HTML of the baseline failed: {lines[-1]}")
        write_html(self.run, self.directory, self.kept, rendered=self.folder)
        shutil.rmtree(self.folder, ignore_errors=True)


class HtmlRenderError(RuntimeError):
    """The background rendering of the coverage HTML failed (its last line of error)."""


def _main(argv: list[str]) -> int:
    """``python -m audit.baseline.coverage_map DATA_FILE TARGET MODULE FOLDER``: the rendering
    :class:`HtmlInBackground` starts, at the lowest CPU priority."""
    with contextlib.suppress(OSError):  # not allowed: normal priority, then
        os.nice(19)
    data_file, target, module, folder = argv
    try:
        _render(Path(data_file), Path(target), module, Path(folder))
    except Exception as error:  # one line for the caller, which raises it
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


def region_coverage(run: BaselineRun, regions: tuple[Region, ...]) -> tuple[RegionCoverage, ...]:
    measured = _measured(run)
    executed_lines, executed_arcs = measured.executed_lines, measured.executed_arcs
    contexts, exits = measured.statement_contexts, measured.exits
    branch_lines = measured.branch_lines

    result = []
    for region in regions:
        statements = sorted(measured.statements & region.lines)
        missed = tuple(line for line in statements if line not in executed_lines)
        branch_total = branch_covered = 0
        for line in branch_lines & set(statements):
            branch_total += len(exits[line])
            branch_covered += sum((line, dest) in executed_arcs for dest in exits[line])
        tests = sorted({c for line in statements for c in contexts.get(line, ()) if c})
        result.append(
            RegionCoverage(
                name=region.name,
                description=region.description,
                functions=region.functions,
                spans=tuple((s.function, s.start, s.end) for s in region.spans),
                lines=Fraction(covered=len(statements) - len(missed), total=len(statements)),
                branches=Fraction(covered=branch_covered, total=branch_total),
                missed_lines=missed,
                tests=tuple(tests),
            )
        )
    return tuple(result)


def line_coverage(run: BaselineRun) -> dict[int, str]:
    """Each statement line of the target: ``covered``, ``partly`` (run, but a branch
    from it never taken) or ``missed``; lines that are no statement are absent."""
    measured = _measured(run)
    executed, arcs, exits = measured.executed_lines, measured.executed_arcs, measured.exits
    status = {}
    for line in measured.statements:
        if line not in executed:
            status[line] = "missed"
        elif line in measured.branch_lines and any((line, d) not in arcs for d in exits[line]):
            status[line] = "partly"
        else:
            status[line] = "covered"
    return status


def write_coverage_map(cmap: CoverageMap, path: Path) -> None:
    test_ids = sorted({t for tests in cmap.lines.values() for t in tests} | set(cmap.durations))
    index = {test_id: i for i, test_id in enumerate(test_ids)}
    claim(path.parent, path.name)
    write_json(
        path,
        {
            "format": COVERAGE_MAP_FORMAT,
            "vllm_version": cmap.vllm_version,
            "target": {
                "module": cmap.target.module,
                "path": str(cmap.target.path),
                "sha256": cmap.target.sha256,
            },
            "tests": [
                {"id": test_id, "duration_s": cmap.durations.get(test_id, 0.0)}
                for test_id in test_ids
            ],
            # line number -> indices into "tests"
            "lines": {str(line): [index[t] for t in tests] for line, tests in cmap.lines.items()},
        },
    )


def write_regions(regions: tuple[RegionCoverage, ...], run: BaselineRun, path: Path) -> None:
    claim(path.parent, path.name)
    write_json(
        path,
        {
            "format": REGIONS_FORMAT,
            "target": {"module": run.target.module, "path": str(run.target.path)},
            "regions": {
                r.name: {
                    "description": r.description,
                    "functions": list(r.functions),
                    "spans": [{"function": f, "start": a, "end": b} for f, a, b in r.spans],
                    "lines": {"covered": r.lines.covered, "total": r.lines.total},
                    "branches": {"covered": r.branches.covered, "total": r.branches.total},
                    "missed_lines": list(r.missed_lines),
                    "tests": list(r.tests),
                }
                for r in regions
            },
        },
    )


def write_html(
    run: BaselineRun, directory: Path, kept: Path | None = None, rendered: Path | None = None
) -> None:
    """coverage.py's HTML for the target file, contexts shown, in ``directory`` (a folder
    of the reports folder); replaced atomically, and only what fence-audit wrote.

    ``kept``: the baseline cache's copy of this very HTML (the entry of the same
    data file and target): copied when it is there, else made and kept there.
    ``rendered``: a folder :func:`render_html` already filled for this run."""
    with replaced_folder(directory.parent, directory.name) as staging:
        if kept is not None and kept.is_dir():
            shutil.copytree(kept, staging, dirs_exist_ok=True)
            return
        if rendered is not None:
            shutil.copytree(rendered, staging, dirs_exist_ok=True)
        else:
            render_html(run, staging)
        if kept is not None and kept.parent.is_dir():
            with replaced_dir(kept) as keeping:
                shutil.copytree(staging, keeping, dirs_exist_ok=True)


def format_table(regions: tuple[RegionCoverage, ...]) -> str:
    header = ("region", "functions", "lines", "branches", "tests")
    rows = [
        (
            r.name,
            str(len(r.functions)),
            # A region with no statement (or no branch line) has nothing left unrun:
            # this table has always shown it as 100%, where the reports say n/a.
            fraction_text(r.lines, empty=100.0),
            fraction_text(r.branches, empty=100.0),
            str(len(r.tests)),
        )
        for r in regions
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    rule = "  ".join("-" * w for w in widths)
    title = "  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True))
    return "\n".join([title, rule, *lines])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
