"""The upstream checks, in order: what ``nox -s upstream`` verifies of the series.

1. Every patch applies to the release alone, and the series applies in order, a
   fix's rebased patch in place of its own where it has one (else
   :class:`~audit.core.errors.PatchDoesNotApply`, before any test runs).
2. Each finding's vLLM-idiom test fails on the release as it is, with an assertion
   (not an error); vLLM's offloading folder with the gap tests passes there, each
   file timed (the cost of running it in vLLM's CPU job).
3. Each finding's test passes with its own patch.
4. With every patch applied, vLLM's whole offloading test folder passes, the series'
   files in it.
5. The audit of the patched scheduler (``mutate --vllm-src`` on the patched tree, the
   full suite, the fixed findings declared fixed) kills every in-region mutant, and
   the project's tests of the fixed findings pass there (the audit lists none of them).
6. The hunt (the fence suite's random workloads) on the patched vLLM, time-boxed,
   raises nothing.
7. The audit of the release with vLLM's suite plus the gap tests (no ``tests/fence``):
   its score, per region, against vLLM's suite alone (the release's own audit).

Each check is a :class:`Check`; the steps that run a program keep its log. The
installed vLLM is hashed against pip's RECORD after every step that ran vLLM.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.core.environment import installed_vllm, module_relpath, verify_untouched
from audit.core.protocol import PROJECT_PREFIX
from audit.setup.config import VLLM_VERSION_ENV
from audit.setup.findings import FIXED_ENV, Finding
from audit.upstream.idiom import problems, ruff_problems
from audit.upstream.runs import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    TestOutcome,
    TestRun,
    run_logged,
    run_tests,
)
from audit.upstream.series import Fix, Series
from audit.upstream.trees import TEST_FOLDER, patched_files
from audit.upstream.workspace import Workspace

SCHEDULER_SUITE = (
    f"vllm:{TEST_FOLDER}/test_scheduler.py",
    f"vllm:{TEST_FOLDER}/test_worker.py",
)
REGIONS = ("population", "flush", "removal", "sliding_window")
GAP_TARGET = 99.0  # the share of in-region mutants vLLM's suite plus the gap tests kill


@dataclass(frozen=True, slots=True)
class Check:
    step: str  # what was checked, as the page's column names it
    ok: bool
    detail: str  # one line: what was measured
    finding: str = ""  # the finding it belongs to ("" for the series as a whole)
    log: str = ""  # the program's log, relative to the upstream reports folder


@dataclass(frozen=True, slots=True)
class Score:
    """One audit's scores: overall and per region, killed of judged."""

    killed: int
    judged: int
    regions: dict[str, tuple[int, int]]  # region -> (killed, judged)
    vllm_killed: int  # killed by a test of vLLM's suite (the "vLLM alone" column)
    vllm_regions: dict[str, int]

    @staticmethod
    def percent(killed: int, judged: int) -> float:
        return 100.0 * killed / judged if judged else 0.0


@dataclass(slots=True)
class Outcome:
    release: str
    checks: list[Check] = field(default_factory=list)
    release_score: Score | None = None  # the release's audit (vLLM alone beside it)
    gap_score: Score | None = None  # vLLM's suite plus the gap tests
    patched_score: Score | None = None  # the patched scheduler, full suite
    failures: dict[str, str] = field(default_factory=dict)  # finding -> its test's message
    # vLLM's offloading test folder on the release with the gap tests: per file, its
    # tests and pytest's seconds; and the whole run's wall time (the CI proposal's cost)
    folder_times: dict[str, tuple[int, float]] = field(default_factory=dict)
    folder_wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


@dataclass(frozen=True, slots=True)
class Options:
    ruff: str = ""  # ruff's executable, for vLLM's lint and format checks ("": left out)
    hunt_seconds: int = 300
    audit: bool = True  # steps 5 and 7 (the audits); off: the tests only
    hunt: bool = True  # step 6


def run_checks(
    workspace: Workspace,
    series: Series,
    reports: Path,
    options: Options,
    registry: Mapping[str, Finding],
    say: Callable[[str], None] = print,
) -> Outcome:
    """Every check, in order (the module's docstring); the outcome holds each."""
    steps = _Steps(workspace, series, reports, registry, Outcome(release=workspace.release))
    say("upstream: 1. the patches apply to the release, alone and in order")
    steps.build_trees()
    steps.idiom(options.ruff)
    say(f"upstream: 2. each finding's test fails on vLLM {workspace.release} as released")
    steps.on_the_release()
    say("upstream: 2b. vLLM's offloading test folder on the release, timed per file")
    steps.release_folder()
    say("upstream: 3. each finding's test passes with its patch")
    steps.with_each_patch()
    say("upstream: 4. with every patch, vLLM's whole offloading test folder passes")
    steps.whole_folder()
    if options.audit:
        say("upstream: 5. the patched scheduler's audit, full suite")
        steps.patched_audit()
    if options.hunt:
        say(f"upstream: 6. the hunt on the patched vLLM, {options.hunt_seconds} s")
        steps.hunt(options.hunt_seconds)
    if options.audit and series.gap_tests:
        say("upstream: 7. the release's audit, and vLLM's suite plus the gap tests")
        steps.gap_score()
    return steps.outcome


class _Steps:
    """The checks' shared state: the trees, where logs go, what was measured."""

    def __init__(
        self,
        workspace: Workspace,
        series: Series,
        reports: Path,
        registry: Mapping[str, Finding],
        outcome: Outcome,
    ) -> None:
        self.workspace = workspace
        self.series = series
        self.reports = reports
        self.registry = registry
        self.outcome = outcome
        self.logs = reports / "logs"
        self.target = module_relpath(workspace.config.target)
        self.patches = list(dict.fromkeys(fix.in_series for fix in series.fixes))
        self.fixed = ",".join(fix.finding for fix in series.fixes)
        self.trees: dict[str, Path] = {}
        # what is hashed against pip's RECORD after each run: the target, every patched file
        self.installed = sorted(
            {workspace.config.target}
            | {
                relpath.removesuffix(".py").replace("/", ".")
                for fix in series.fixes
                for relpath in patched_files(fix.patch)
            }
        )

    def check(self, step: str, ok: bool, detail: str, finding: str = "", log: str = "") -> None:
        self.outcome.checks.append(Check(step, ok, detail, finding, log))

    def tests(self, tree: Path, selection: Sequence[str], name: str) -> TestRun:
        config = self.workspace.config
        run = run_tests(
            tree, selection, cache_dir=config.cache_dir, models=config.offline_models,
            log=self.logs / f"{name}.log",
        )  # fmt: skip
        vllm = installed_vllm(self.workspace.release)
        for module in self.installed:
            verify_untouched(vllm, module)
        return run

    def build_trees(self) -> None:
        """Step 1: every tree the tests need; a patch that does not apply stops here."""
        tree, series = self.workspace.tree, self.series
        for fix in series.fixes:
            self.trees[fix.finding] = tree(
                f"fix-{fix.finding}", [series.tests_dir / fix.test_file], [fix.patch]
            )
        self.trees["series"] = tree(
            "series", series.test_files(), self.patches, vllm_files=[self.target]
        )
        self.trees["release"] = tree("release", series.test_files())
        rebased = sum(fix.rebased is not None for fix in series.fixes)
        self.check(
            "patches apply",
            True,
            f"each of {len(series.fixes)} alone on the release; the series in order"
            + (f" ({rebased} rebased on the fixes before them)" if rebased else ""),
        )

    def idiom(self, ruff: str) -> None:
        """Step 1, continued: each test file reads as vLLM's, its ruff configuration too."""
        tree = self.trees["series"]
        for path in self.series.test_files():
            found = problems(path)
            if ruff:
                found += ruff_problems(ruff, tree, [f"{TEST_FOLDER}/{path.name}"])
            detail = "; ".join(found) or (
                "SPDX, cpu_test, no fence-audit import"
                + (", vLLM's ruff check and format" if ruff else " (ruff not run)")
            )
            finding = next((f.finding for f in self.series.fixes if f.test_file == path.name), "")
            self.check(f"in vLLM's idiom: {path.name}" if not finding else "in vLLM's idiom",
                       not found, detail, finding)  # fmt: skip

    def on_the_release(self) -> None:
        """Step 2: the finding tests fail on the release, the gap tests pass."""
        gap_files = [f"{TEST_FOLDER}/{name}" for name in self.series.gap_tests]
        nodes = [_node(fix) for fix in self.series.fixes]
        run = self.tests(self.trees["release"], [*nodes, *gap_files], "release")
        log = _rel(run.log, self.reports)
        for fix in self.series.fixes:
            cases = _cases(run, fix)
            failing = [c for c in cases if c.outcome == FAILED]
            # an error (setup, collection) is no failure of the test's assertion
            failed = bool(failing) and not any(c.outcome == ERROR for c in cases)
            result = failing[0] if failing else (cases[0] if cases else None)
            self.outcome.failures[fix.finding] = result.message if result else ""
            detail = _said(result, FAILED) + (
                f" ({len(failing)} of {len(cases)} cases fail)" if len(cases) > 1 else ""
            )
            self.check("fails on the release", failed, detail, fix.finding, log)
        gaps = [o for o in run.outcomes if o.test_id.split("::")[0] in gap_files]
        passed = sum(o.outcome == PASSED for o in gaps)
        ok = not gap_files or (bool(gaps) and passed == len(gaps))
        self.check("gap tests pass on the release", ok, f"{passed} of {len(gaps)} passed", log=log)

    def release_folder(self) -> None:
        """Step 2, continued: vLLM's folder with the gap tests (no finding's test) passes
        on the release, each file timed: what a CPU job running it would cost."""
        tree = self.workspace.tree(
            "release-folder", [self.series.tests_dir / n for n in self.series.gap_tests]
        )
        run = self.tests(tree, [TEST_FOLDER], "release-folder")
        self.outcome.folder_times = {
            name.rsplit("/", 1)[-1]: counted for name, counted in run.by_file().items()
        }
        self.outcome.folder_wall_s = run.seconds
        ok, detail = _folder(run)
        detail += f", {run.seconds:.0f} s wall"
        log = _rel(run.log, self.reports)
        self.check("offloading folder and gap tests pass on the release", ok, detail, log=log)

    def with_each_patch(self) -> None:
        """Step 3: each finding's test passes with its own patch alone."""
        for fix in self.series.fixes:
            run = self.tests(self.trees[fix.finding], [_node(fix)], f"fix-{fix.finding}")
            cases = _cases(run, fix)
            passed = bool(cases) and all(c.outcome == PASSED for c in cases)
            result = next((c for c in cases if c.outcome != PASSED), cases[0] if cases else None)
            detail = _said(result, PASSED) + (f" ({len(cases)} cases)" if len(cases) > 1 else "")
            log = _rel(run.log, self.reports)
            self.check("passes with its patch", passed, detail, fix.finding, log)

    def whole_folder(self) -> None:
        """Step 4: vLLM's offloading tests, the series' among them, with every patch."""
        run = self.tests(self.trees["series"], [TEST_FOLDER], "series-folder")
        ok, detail = _folder(run)
        self.check(
            "offloading folder passes, all patches", ok, detail, log=_rel(run.log, self.reports)
        )

    def patched_audit(self) -> None:
        """Step 5: the full suite's audit of the patched scheduler."""
        code, document = _audit(
            self.workspace, self.reports / "patched", ["--vllm-src", str(self.trees["series"])],
            {FIXED_ENV: self.fixed}, self.logs / "patched-audit.log",
        )  # fmt: skip
        self.outcome.patched_score = _score(document)
        _patched_checks(self.outcome, self.series, code, document, self.registry)

    def hunt(self, seconds: int) -> None:
        """Step 6: the hunt with the patched vLLM first on the path."""
        vllm_tree = self.workspace.tree("series-vllm", patches=self.patches, tests=False)
        code = _hunt(self.workspace, self.reports, vllm_tree, self.fixed, seconds)
        said = {0: "nothing raised", 14: "the machine raised: see hunt/hunt.md"}
        detail = said.get(code, f"exit {code}") + f" ({seconds} s time box)"
        self.check("hunt on the patched vLLM", code == 0, detail, log="logs/hunt.log")

    def gap_score(self) -> None:
        """Step 7: vLLM's suite alone (the release's audit) and with the gap tests."""
        workspace, series = self.workspace, self.series
        _, document = _audit(
            workspace, self.reports / "release", [], {}, self.logs / "release-audit.log"
        )
        self.outcome.release_score = _score(document)
        gap_tree = workspace.tree(
            "gaps", [series.tests_dir / n for n in series.gap_tests], vllm_files=[self.target]
        )
        suites = [*SCHEDULER_SUITE, *(f"vllm:{TEST_FOLDER}/{n}" for n in series.gap_tests)]
        code, document = _audit(
            workspace, self.reports / "gaps",
            ["--vllm-src", str(gap_tree), *(a for s in suites for a in ("--suite", s))],
            {}, self.logs / "gaps-audit.log",
        )  # fmt: skip
        self.outcome.gap_score = score = _score(document)
        share = Score.percent(score.killed, score.judged) if score else 0.0
        detail = f"{score.killed} of {score.judged} ({share:.1f}%)" if score else f"exit {code}"
        ok = score is not None and share >= GAP_TARGET
        self.check(f"vLLM + gap tests kill at least {GAP_TARGET:g}%", ok, detail,
                   log="logs/gaps-audit.log")  # fmt: skip


def _folder(run: TestRun) -> tuple[bool, str]:
    """Whether a folder's run is green (every test passed or skipped), and its counts."""
    bad = [o for o in run.outcomes if o.outcome not in (PASSED, SKIPPED)]
    detail = (
        f"{run.count(PASSED)} passed, {run.count(SKIPPED)} skipped, "
        f"{len(bad)} failed or errors" + (f" (first: {bad[0].test_id})" if bad else "")
    )
    return run.exit_code == 0 and not bad and bool(run.outcomes), detail


def _node(fix: Fix) -> str:
    return f"{TEST_FOLDER}/{fix.test}"


def _cases(run: TestRun, fix: Fix) -> list[TestOutcome]:
    """The outcomes of ``fix``'s test: the node, each of its parameters, or each test of
    its file when it names a file."""
    node = _node(fix)
    return [
        o for o in run.outcomes
        if o.test_id == node or o.test_id.startswith((node + "[", node + "::"))
    ]  # fmt: skip


def _said(result: TestOutcome | None, wanted: str) -> str:
    """One line on a test's outcome: its message's first line when it is ``wanted``."""
    if result is None:
        return "not run (a collection error? see the log)"
    first = (result.message.splitlines() or [""])[0]
    if result.outcome == wanted:
        return first or wanted
    return f"{result.outcome}, not {wanted}" + (f": {first}" if first else "")


def _patched_checks(
    outcome: Outcome,
    series: Series,
    code: int,
    document: dict[str, Any] | None,
    registry: Mapping[str, Finding],
) -> None:
    score = outcome.patched_score
    killed_all = code == 0 and score is not None and score.killed == score.judged
    outcome.checks.append(
        Check(
            "patched audit kills every mutant",
            killed_all,
            (f"{score.killed} of {score.judged} killed" if score else "no results")
            + f" (exit {code})",
            log="logs/patched-audit.log",
        )
    )
    listed = {f["id"] for f in (document or {}).get("findings", [])}
    ran = (document or {}).get("tests", [])
    for fix in series.fixes:
        # the baseline was green (the audit ran), so each registered test it ran passed
        finding = registry[fix.finding]
        passed = [t for t in ran if finding.exposes(t)]
        missing = [t for t in finding.tests if not any(finding.exposes(r) and
                   r.removeprefix(PROJECT_PREFIX).startswith(t) for r in passed)]  # fmt: skip
        still = fix.finding in listed
        ok = document is not None and not still and not missing
        detail = (
            "no results" if document is None
            else "still a finding there" if still
            else f"{missing[0]} did not run" if missing
            else f"no longer a finding: its {len(passed)} tests pass"
        )  # fmt: skip
        outcome.checks.append(
            Check("project's tests pass, patched", ok, detail, fix.finding,
                  "logs/patched-audit.log")
        )  # fmt: skip


def _audit(
    workspace: Workspace,
    reports: Path,
    args: Sequence[str],
    env: dict[str, str],
    log: Path,
) -> tuple[int, dict[str, Any] | None]:
    """``fence-audit mutate`` in a process of its own; its exit code and audit.json."""
    command = [sys.executable, "-m", "audit", "mutate", "--reports", str(reports), *args]
    code = run_logged(
        command, log=log, env={**os.environ, VLLM_VERSION_ENV: workspace.release, **env}
    )
    results = reports / "audit.json"
    try:
        document = json.loads(results.read_text()) if code in (0, 2) else None
    except (OSError, ValueError):
        document = None
    return code, document


def _hunt(workspace: Workspace, reports: Path, vllm_tree: Path, fixed: str, seconds: int) -> int:
    """The hunt with the patched ``vllm/`` of ``vllm_tree`` first on the path."""
    runner = Path(__file__).resolve().parents[2] / "tests" / "fence" / "fence_hunt.py"
    log = reports / "logs" / "hunt.log"
    command = [sys.executable, str(runner), "--seconds", str(seconds), "--seed", "0",
               "--reports", str(reports / "hunt")]  # fmt: skip
    path = os.pathsep.join([str(vllm_tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, VLLM_VERSION_ENV: workspace.release, FIXED_ENV: fixed, "PYTHONPATH": path}
    return run_logged(command, log=log, env=env)


def _score(document: dict[str, Any] | None) -> Score | None:
    if not document:
        return None
    score = document["score"]
    regions = document.get("regions", {})
    return Score(
        killed=score["killed"],
        judged=score["judged"],
        regions={n: (r["killed"], r["judged"]) for n, r in regions.items() if n in REGIONS},
        vllm_killed=score.get("killed_by_vllm", 0),
        vllm_regions={n: r.get("killed_by_vllm", 0) for n, r in regions.items() if n in REGIONS},
    )


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
