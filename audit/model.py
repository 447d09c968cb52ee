"""The data that crosses stages: frozen, slotted dataclasses, and the file formats.

Every file the audit writes carries a format version. History:

- coverage-map.json, regions.json: format 1 (first release).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

COVERAGE_MAP_FORMAT = 1
REGIONS_FORMAT = 1

# How a test process marks its events (JSON) in its stdout, among pytest's own output.
PROGRESS = "@@fence-audit "


class TestOutcome(StrEnum):
    __test__ = False  # not a pytest test class
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"

    @property
    def is_red(self) -> bool:
        return self in (TestOutcome.FAILED, TestOutcome.ERROR)


@dataclass(frozen=True, slots=True)
class TestResult:
    __test__ = False  # not a pytest test class
    test_id: str  # pytest node id
    outcome: TestOutcome
    duration_s: float
    failure: str = ""  # the last lines of pytest's report, when red


@dataclass(frozen=True, slots=True)
class Target:
    """The audited module: where its code is read from, and the installed file."""

    module: str
    path: Path  # the file whose lines are measured and mutated
    installed_path: Path
    sha256: str  # of ``path``


@dataclass(frozen=True, slots=True)
class BaselineRun:
    target: Target
    tests: tuple[TestResult, ...]
    data_file: Path  # coverage.py data, one context per test id
    log: Path
    duration_s: float


@dataclass(frozen=True, slots=True)
class Count:
    covered: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 * self.covered / self.total if self.total else 100.0


@dataclass(frozen=True, slots=True)
class RegionCoverage:
    name: str
    description: str
    functions: tuple[str, ...]
    spans: tuple[tuple[str, int, int], ...]  # (function, first line, last line)
    lines: Count
    branches: Count
    missed_lines: tuple[int, ...]
    tests: tuple[str, ...]  # test ids whose context executed a line of the region


@dataclass(frozen=True, slots=True)
class CoverageMap:
    """Line -> test ids that executed it, for the target file (the mutation stage's input)."""

    target: Target
    vllm_version: str
    lines: dict[int, tuple[str, ...]] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)


class MutantStatus(StrEnum):
    KILLED = "killed"
    SURVIVED = "survived"
    TIMEOUT = "timeout"
    NO_TESTS = "no_tests"  # no test of the suite executes the mutated lines
    ERROR = "error"  # the mutant could not be judged (crash, does not compile, ...)
    EQUIVALENT = "equivalent"  # survived or reached by no test, and reviewed as equivalent


@dataclass(frozen=True, slots=True)
class LineEdit:
    """Replace lines ``start..end`` (1-based, inclusive; ``end = start - 1`` inserts)."""

    start: int
    end: int
    new_lines: tuple[str, ...]


def apply_edits(source: str, edits: tuple[LineEdit, ...]) -> str:
    """``source`` with ``edits`` applied; line numbers refer to the original."""
    lines = source.splitlines(keepends=True)
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        lines[edit.start - 1 : edit.end] = [text + "\n" for text in edit.new_lines]
    return "".join(lines)


@dataclass(frozen=True, slots=True)
class Mutant:
    """One mutant of the audited module, ready to judge."""

    id: str  # stable: function qualname, operator, position relative to the function
    origin: str  # "mutmut" or "catalogue"
    region: str  # "" when outside every region
    function: str
    operator: str
    ordinal: int  # the generator's own number for it within its function (mutmut's)
    line: int  # where the mutated code starts, in the audited source
    changed_lines: tuple[int, ...]
    diff: str
    edits: tuple[LineEdit, ...]  # applied to the audited source (or to ``path``)
    covered_by: tuple[str, ...]  # test ids that executed a changed line in the baseline
    # Another module than the target (catalogue entries of the worker's flush handling):
    # its dotted name and file. Empty: the target module.
    module: str = ""
    path: str = ""


@dataclass(frozen=True, slots=True)
class MutantResult:
    id: str
    status: MutantStatus
    killed_by: str = ""  # test id
    failure: str = ""  # the first lines of the killing test's failure, or the error
    tests_run: tuple[str, ...] = ()
    duration_s: float = 0.0
    cached: bool = False


PROJECT_PREFIX = "project/"  # test ids of this project's suite (see baseline.stage_suite)


def is_project_test(test_id: str) -> bool:
    return test_id.startswith(PROJECT_PREFIX)
