"""The gate: does a saved run meet the thresholds? Reads only the results file.

Each check compares a percentage with its threshold the way coverage.py's
``should_fail_under`` does: thresholds lie in 0-100, a score is rounded to two
decimals before it is compared, and 100 means exactly 100. A run fails with
``SCORE_BELOW_THRESHOLD`` (2); when every failing check would pass if the timeouts
had been killed, with ``TIMEOUTS_ONLY`` (3), so CI can tell a slow mutant from a
weak test. The results of an interrupted run fail with ``INCOMPLETE`` (13), and so
do one shard's (``mutate --shard K/N``): its scores are of a part of the run, which
says nothing of the fence; ``fence-audit merge`` puts the shards together, then gates.

A pull-request run (``--since``) judges only the changed code: a region it holds no
mutant of has nothing to check (not a failure), and the group of the changed code
outside every region is checked only when a threshold names it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from audit.core.errors import ConfigError, ExitCode, ResultsIncomplete
from audit.mutation.changes import OUTSIDE
from audit.mutation.scope import APART
from audit.results.scores import Tally
from audit.results.view import AuditResults
from audit.setup.config import GateThresholds
from audit.setup.model import Fraction, percent_text


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # "score", "score of flush", "line coverage of flush"
    value: float | None  # the measured percentage; None: nothing to measure
    threshold: float
    detail: str  # the numbers behind the value, e.g. "154 killed of 169"
    passed: bool
    passed_without_timeouts: bool  # would pass if every timeout had been killed

    def render(self) -> str:
        shown = percent_text(self.value, 2)  # two decimals: what is compared (_at_least)
        verdict = "ok" if self.passed else "FAILED"
        return f"{self.name}: {shown} ({self.detail}), required {self.threshold:g}%: {verdict}"


@dataclass(frozen=True, slots=True)
class GateResult:
    checks: tuple[Check, ...]
    not_run: tuple[str, ...] = ()  # regions with a threshold but not in this run
    overall_skipped: bool = False  # a threshold for the overall score, but a partial run
    # A pull-request run: regions with a threshold but no changed code (and the overall
    # score, when no region holds changed code): nothing to check.
    unchanged: tuple[str, ...] = ()
    overall_unchanged: bool = False

    @property
    def exit_code(self) -> ExitCode:
        failed = [c for c in self.checks if not c.passed]
        if not failed:
            return ExitCode.OK
        if all(c.passed_without_timeouts for c in failed):
            return ExitCode.TIMEOUTS_ONLY
        return ExitCode.SCORE_BELOW_THRESHOLD

    def render(self) -> str:
        lines = [f"fence-audit: gate: {check.render()}" for check in self.checks]
        if self.overall_skipped:
            lines.append("fence-audit: gate: score: not checked (the run left out some regions)")
        lines += [
            f"fence-audit: gate: score of {name}: not checked (the run left it out)"
            for name in self.not_run
        ]
        if self.overall_unchanged:
            lines.append("fence-audit: gate: score: not checked (no changed code in the regions)")
        lines += [
            f"fence-audit: gate: score of {name}: not checked (no changed code in it)"
            for name in self.unchanged
        ]
        return "\n".join(lines)


def check_region_names(thresholds: GateThresholds, known: Collection[str], results: Path) -> None:
    """Every region ``thresholds`` names is ``known`` (configured, or in the
    ``results``): another is a typo, a ConfigError."""
    unknown = sorted(name for name, _ in thresholds.regions if name not in known)
    if unknown:
        raise ConfigError(
            f"the gate names region {unknown[0]!r}, which is neither configured nor in the results",
            details={
                "results": str(results),
                "regions": ", ".join(sorted(known)) or "none",
                "next": "fix [tool.fence-audit.gate.regions] or --fail-under-region",
            },
        )


def evaluate(
    results: AuditResults, thresholds: GateThresholds, regions: Iterable[str] = ()
) -> GateResult:
    """Check ``results``; ``regions`` are the configured region names (a threshold
    naming none of them, nor a region of the results, is a typo: a ConfigError).
    Results of an interrupted run never pass (ResultsIncomplete, exit 13): the mutants
    not yet judged are not in them, so their scores say nothing about the suite."""
    if results.incomplete is not None:
        judged, total = results.incomplete
        raise ResultsIncomplete(
            f"the results are incomplete: the run was interrupted after {judged} of "
            f"{total} mutants; the gate cannot pass on them",
            details={
                "results": str(results.path),
                "next": "run `fence-audit mutate` again to resume, then the gate",
            },
        )
    if results.shard is not None:
        raise ResultsIncomplete(
            f"the results are one shard of a run ({results.shard.described()}); the gate "
            "cannot pass on a part of the run",
            details={
                "results": str(results.path),
                "next": "`fence-audit merge` every shard's audit.json: it writes the run's "
                "and runs the gate on it",
            },
        )
    present = {region.name for region in results.regions}
    configured = set(regions)
    check_region_names(thresholds, present | configured, results.path)
    not_run = tuple(name for name, _ in thresholds.regions if name not in present)
    checks = []
    # The overall threshold speaks of every configured region: a run that left some
    # out (--region) has no overall score to compare.
    partial = bool(configured - present)
    # A pull-request run: what holds no changed code has nothing to check.
    empty = {r.name for r in results.regions if results.since and not results.mutants_of(r.name)}
    unchanged = tuple(name for name, t in thresholds.regions if t > 0 and name in empty)
    overall_unchanged = bool(results.since) and all(m.region == OUTSIDE for m in results.mutants)
    if thresholds.fail_under > 0 and not partial and not overall_unchanged:
        checks.append(_score_check("score", results.overall, thresholds.fail_under))
    for name, threshold in thresholds.regions:
        if threshold > 0 and name in present and name not in empty:
            tally = results.region(name).tally
            checks.append(_score_check(f"score of {name}", tally, threshold))
    if thresholds.min_line_coverage > 0:
        for region in results.regions:
            if region.name in APART:  # outside the fence: shown, not gated
                continue
            percent = region.lines.percent
            passed = percent is None or _at_least(percent, thresholds.min_line_coverage)
            checks.append(
                Check(
                    name=f"line coverage of {region.name}",
                    value=percent,
                    threshold=thresholds.min_line_coverage,
                    detail=f"{region.lines.covered} of {region.lines.total} lines",
                    passed=passed,
                    passed_without_timeouts=passed,
                )
            )
    return GateResult(
        tuple(checks),
        not_run,
        thresholds.fail_under > 0 and partial,
        unchanged,
        thresholds.fail_under > 0 and not partial and overall_unchanged,
    )


def _score_check(name: str, tally: Tally, threshold: float) -> Check:
    score = tally.score
    detail = f"{tally.killed} killed of {tally.judged} judged"
    if tally.timeout:
        detail += f", {tally.timeout} timed out"
    # Nothing judged is no evidence: it fails any threshold above 0.
    passed = score is not None and _at_least(score, threshold)
    optimistic = Fraction(tally.killed + tally.timeout, tally.judged).percent
    passed_without_timeouts = optimistic is not None and _at_least(optimistic, threshold)
    return Check(name, score, threshold, detail, passed, passed or passed_without_timeouts)


def _at_least(value: float, threshold: float) -> bool:
    if threshold >= 100:
        return value >= 100
    return round(value, 2) >= threshold
