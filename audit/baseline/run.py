"""Baseline: the fence suite under coverage, one context per test, in a test process.

The test process (:mod:`audit.testproc`) runs in the hermetic environment of
:mod:`audit.core.hermetic`; its whole output goes to ``reports/logs/baseline.log``. A red
baseline or an empty selection stops the audit here, before any mutant.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from coverage import CoverageData

from audit.baseline.cache import CachedBaseline, Rerun
from audit.core.errors import BaselineFailed, NoTestsSelected
from audit.core.protocol import (
    BaselineDone,
    BaselineSpec,
    Outcomes,
    TestOutcome,
    from_json,
    parse_event,
    write_spec,
)
from audit.setup.config import Config
from audit.setup.findings import Finding, sort_red
from audit.setup.model import BaselineRun, Target
from audit.setup.session import WarmSession, pytest_args, spawn
from audit.setup.suite import Suite

PYTEST_TESTS_FAILED = 1
PYTEST_NO_TESTS_COLLECTED = 5


def start_baseline(
    config: Config,
    suite: Suite,
    target: Target,
    work: Path,
    findings: tuple[Finding, ...] = (),
    version: str = "",
    meanwhile: Callable[[], object] | None = None,
    workers: int = 1,
    rerun: Rerun | None = None,
) -> tuple[BaselineRun, WarmSession | None]:
    """Run the suite once under coverage; raise unless every selected test is green or
    fails as a known bug of this vLLM ``version`` (a finding, :mod:`audit.setup.findings`).

    On success the test process stays, warm, as a :class:`WarmSession`. ``meanwhile``
    is called once the test process has started: work of this process that needs no
    baseline, done while the test process imports vLLM (which takes most of a core
    for seconds) instead of after it. ``workers``: the tests are dealt to that many
    processes, the test process and forks of it taken once the suite is collected.
    ``rerun``:
    only its test files run; the other tests' outcomes and coverage are its entry's.
    """
    logs = config.reports_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log = logs / "baseline.log"
    data_file = work / "baseline.coverage"
    data_file.unlink(missing_ok=True)
    outcomes_file = work / "baseline-outcomes.json"
    outcomes_file.unlink(missing_ok=True)
    read_end, write_end = os.pipe()

    spec = BaselineSpec(
        # With a checkout, only the target module is served from it; the rest of
        # vLLM is the installed package.
        overlay={target.module: str(target.path)} if suite.source.checkout else {},
        include=(str(target.path),),
        measure_from=target.module,
        data_file=str(data_file),
        outcomes=str(outcomes_file),
        pytest_args=tuple(pytest_args(suite, work)),
        command_fd=read_end,
        workers=workers,
        run_only=rerun.files if rerun is not None else (),
    )
    spec_file = work / "baseline-spec.json"
    write_spec(spec_file, spec)

    started = time.monotonic()
    with log.open("w") as out:
        out.write(f"# vLLM tests: {suite.source.origin}\n# selection: {suite.selection}\n")
        if rerun is not None:
            out.write(
                f"# only {', '.join(rerun.files)} run again ({'; '.join(rerun.why)}); the "
                f"other tests are read from the baseline cache ({rerun.kept.log.parent})\n"
            )
        process = spawn(config, suite, spec_file, pass_fds=(read_end,))
        os.close(read_end)
        session = WarmSession(process, write_end, log)
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                session.close()
                raise
        returncode: int | None = None
        for line in session.lines():
            out.write(line)
            event = parse_event(line)
            if isinstance(event, BaselineDone):
                returncode = event.exit_code
                break
    duration = time.monotonic() - started
    if returncode is None:  # the process ended before the end of its baseline
        session.open = False
        os.close(write_end)
        returncode = process.wait()
    try:
        run = _check_outcomes(returncode, outcomes_file, suite, target, data_file, log, duration)
        if rerun is not None:
            order = from_json(Outcomes, json.loads(outcomes_file.read_text())).order
            run = _with_kept(run, rerun, order)
            returncode = run.exit_code
        run = _sort_findings(run, returncode, findings, version)
    except BaseException:
        session.close()
        raise
    return run, session


def cached_baseline(
    cached: CachedBaseline,
    config: Config,
    target: Target,
    work: Path,
    findings: tuple[Finding, ...] = (),
    version: str = "",
) -> BaselineRun:
    """A baseline read back from the cache (:mod:`audit.baseline.cache`): its coverage
    data and log laid out where a run puts them; its red tests sorted again."""
    logs = config.reports_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    data_file = work / "baseline.coverage"
    shutil.copyfile(cached.coverage, data_file)
    log = logs / "baseline.log"
    log.write_text(
        f"# read from the baseline cache ({cached.log.parent}): the inputs are those of "
        "the run logged below\n" + cached.log.read_text(encoding="utf-8", errors="replace")
    )
    run = BaselineRun(
        target=target,
        tests=cached.tests,
        data_file=data_file,
        log=log,
        duration_s=cached.duration_s,
        exit_code=cached.exit_code,
    )
    return _sort_findings(run, cached.exit_code, findings, version)


def run_baseline(
    config: Config,
    suite: Suite,
    target: Target,
    work: Path,
    findings: tuple[Finding, ...] = (),
    version: str = "",
    workers: int = 1,
) -> BaselineRun:
    """The baseline alone: the test process exits when it is done."""
    run, session = start_baseline(config, suite, target, work, findings, version, workers=workers)
    if session is not None:
        session.close()
    return run


def _check_outcomes(
    returncode: int,
    outcomes_file: Path,
    suite: Suite,
    target: Target,
    data_file: Path,
    log: Path,
    duration: float,
) -> BaselineRun:
    if not outcomes_file.is_file():
        raise BaselineFailed(
            f"the test process ended (exit {returncode}) before reporting any outcome",
            details={"log": str(log), "next": "read the log's last lines"},
        )
    outcomes = from_json(Outcomes, json.loads(outcomes_file.read_text()))
    if outcomes.collection_errors:
        first = outcomes.collection_errors[0]
        raise BaselineFailed(
            f"the fence suite failed to collect ({len(outcomes.collection_errors)} errors)",
            details={
                "first error": first[0] or "(session)",
                "log": str(log),
                "next": "fix the import error; a suite that does not load guards nothing",
            },
        )
    if outcomes.collected == 0 or returncode == PYTEST_NO_TESTS_COLLECTED:
        raise NoTestsSelected(
            "the test selection collected no test",
            details={
                "selection": ", ".join(suite.selection),
                "log": str(log),
                "next": "check [tool.fence-audit.suite] paths or --suite",
            },
        )
    tests = tuple(
        dataclasses.replace(test, duration_s=round(test.duration_s, 6)) for test in outcomes.tests
    )
    return BaselineRun(
        target=target,
        tests=tests,
        data_file=data_file,
        log=log,
        duration_s=duration,
        exit_code=returncode,
    )


def _with_kept(run: BaselineRun, rerun: Rerun, order: tuple[str, ...]) -> BaselineRun:
    """``run`` (the rerun files' tests) completed by the kept entry's other tests: their
    outcomes, and their coverage contexts copied into the run's data file."""
    again = set(rerun.files)
    kept = [t for t in rerun.kept.tests if t.test_id.partition("::")[0] not in again]
    data = CoverageData(basename=str(run.data_file))
    data.read()
    old = CoverageData(basename=str(rerun.kept.coverage))
    old.read()
    for test in kept:
        old.set_query_contexts([f"^{re.escape(test.test_id)}$"])
        arcs = {f: old.arcs(f) or [] for f in old.measured_files()}
        data.set_context(test.test_id)
        data.add_arcs({f: a for f, a in arcs.items() if a})
    data.write()
    rank = {test_id: index for index, test_id in enumerate(order)}  # the collection's
    tests = sorted((*kept, *run.tests), key=lambda t: rank.get(t.test_id, len(rank)))
    red = any(t.outcome.is_red for t in tests)
    return dataclasses.replace(
        run, tests=tuple(tests), exit_code=PYTEST_TESTS_FAILED if red else run.exit_code
    )


def _sort_findings(
    run: BaselineRun, returncode: int, findings: tuple[Finding, ...], version: str
) -> BaselineRun:
    """Keep the red tests that are findings of this release; any other stops the audit."""
    red = [t.test_id for t in run.tests if t.outcome.is_red]
    xfailed = [t.test_id for t in run.tests if t.outcome == TestOutcome.XFAILED]
    known = sort_red(red, xfailed, findings, version)
    explained = {t for found in known.found for t in found.failed}
    pytest_ok = returncode in (0, PYTEST_NO_TESTS_COLLECTED) or (
        returncode == PYTEST_TESTS_FAILED and red and set(red) <= explained
    )
    if not known.unexplained and not known.unlisted and pytest_ok:
        return dataclasses.replace(run, findings=known.found)
    failing = [*known.unexplained, *(test for test, _ in known.unlisted)]
    names = ", ".join(failing[:10]) or f"(pytest exit {returncode})"
    more = f" (and {len(failing) - 10} more)" if len(failing) > 10 else ""
    details = {"failed": names + more, "log": str(run.log)}
    if known.unlisted:
        test, finding = known.unlisted[0]
        details["finding"] = (
            f"{test} is a test of finding {finding.id!r} ({finding.doc}), which "
            f"docs/findings.toml does not list for vLLM {version or '(unknown)'}"
        )
    details["next"] = (
        "fix or deselect the failing tests (mutants are judged only against a green "
        "baseline); if the release has a real vLLM bug, write it up and register it in "
        'the findings file (see DESIGN.md, "Findings")'
    )
    raise BaselineFailed(
        f"the baseline failed before any mutant was applied "
        f"({len(failing)} of {len(run.tests)} tests failed)",
        details=details,
    )
