"""The data that crosses stages: frozen, slotted dataclasses, and the file formats.

Every file the audit writes carries a format version. History:

- coverage-map.json, regions.json: format 1 (first release).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from audit.core.protocol import LineEdit, MutantStatus, TestResult
from audit.setup.findings import Found

COVERAGE_MAP_FORMAT = 1
REGIONS_FORMAT = 1


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
    # real vLLM bugs this release has, by the tests they fail: left out of the mutant phase
    findings: tuple[Found, ...] = ()
    exit_code: int = 0  # pytest's

    @property
    def finding_tests(self) -> frozenset[str]:
        """Tests red on the unmutated code because of a finding: they judge no mutant."""
        return frozenset(t for found in self.findings for t in found.failed)


@dataclass(frozen=True, slots=True)
class Fraction:
    """``covered`` of ``total``: lines, branches, killed mutants of those judged."""

    covered: int
    total: int

    @property
    def percent(self) -> float | None:
        """None for 0 of 0: nothing to measure. A caller that shows something else
        there (the coverage table prints an empty region as 100%) says so itself."""
        return 100.0 * self.covered / self.total if self.total else None


def percent_text(percent: float | None, decimals: int = 1) -> str:
    """A percentage as every report and table prints it; "n/a" when there is none."""
    return "n/a" if percent is None else f"{percent:.{decimals}f}%"


def fraction_text(fraction: Fraction, empty: float | None = None) -> str:
    """``covered/total (P%)`` in whole percents; 0 of 0 shows ``empty`` (None: n/a)."""
    percent = empty if fraction.percent is None else fraction.percent
    return f"{fraction.covered}/{fraction.total} ({percent_text(percent, 0)})"


@dataclass(frozen=True, slots=True)
class RegionCoverage:
    name: str
    description: str
    functions: tuple[str, ...]
    spans: tuple[tuple[str, int, int], ...]  # (function, first line, last line)
    lines: Fraction
    branches: Fraction
    missed_lines: tuple[int, ...]
    tests: tuple[str, ...]  # test ids whose context executed a line of the region


@dataclass(frozen=True, slots=True)
class CoverageMap:
    """Line -> test ids that executed it, for the target file (the mutation stage's input)."""

    target: Target
    vllm_version: str
    lines: dict[int, tuple[str, ...]] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)


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
    hung: tuple[str, ...] = ()  # tests stopped as hung before the verdict (see Verdict)
