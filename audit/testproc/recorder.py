"""The baseline recorder: a pytest plugin that gives each test its coverage context and
records each test's outcome (:class:`audit.core.protocol.Outcomes`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import coverage
import pytest

from audit.core.protocol import Outcomes, TestOutcome, TestResult

FAILURE_LINES = 30  # of a red test's report, its last ones (where the error is)


@dataclass(slots=True)
class _Tally:
    """One test's outcome as its phases (setup, call, teardown) report in."""

    outcome: TestOutcome = TestOutcome.PASSED
    duration_s: float = 0.0
    failure: str = ""


class Recorder:
    """A pytest plugin: switches coverage contexts and records outcomes."""

    def __init__(self, cov: coverage.Coverage) -> None:
        self.cov = cov
        self.collected = 0
        self.tests: dict[str, _Tally] = {}
        self.collection_errors: list[tuple[str, str]] = []  # (node id, report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # Setup, call and teardown all count for the test: fixtures build the scheduler.
        self.cov.switch_context(item.nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        del nodeid
        self.cov.switch_context("")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = len(session.items)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collection_errors.append((report.nodeid, _last_lines(report.longreprtext)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self.tests.setdefault(report.nodeid, _Tally())
        test.duration_s += report.duration
        if report.failed:
            test.outcome = TestOutcome.FAILED if report.when == "call" else TestOutcome.ERROR
            test.failure = test.failure or _last_lines(report.longreprtext)
        elif report.skipped and test.outcome is TestOutcome.PASSED:
            wasxfail = hasattr(report, "wasxfail")
            test.outcome = TestOutcome.XFAILED if wasxfail else TestOutcome.SKIPPED

    def restart(self, cov: coverage.Coverage) -> None:
        """Record afresh, into ``cov`` (in a fork that runs a part of the baseline)."""
        self.cov = cov
        self.tests = {}

    def add(self, results: Iterable[Outcomes], order: tuple[str, ...]) -> None:
        """Take in the outcomes the forks recorded; keep the tests in ``order``."""
        for outcomes in results:
            for test in outcomes.tests:
                self.tests[test.test_id] = _Tally(test.outcome, test.duration_s, test.failure)
        rank = {test_id: index for index, test_id in enumerate(order)}
        self.tests = dict(sorted(self.tests.items(), key=lambda kv: rank.get(kv[0], len(rank))))

    @property
    def red(self) -> bool:
        return any(t.outcome.is_red for t in self.tests.values())

    def outcomes(self, exit_code: int, order: tuple[str, ...] = ()) -> Outcomes:
        return Outcomes(
            exit_code=exit_code,
            collected=self.collected,
            collection_errors=tuple(self.collection_errors),
            tests=tuple(
                TestResult(test_id, t.outcome, t.duration_s, t.failure)
                for test_id, t in self.tests.items()
            ),
            order=order,
        )


class Select:
    """Keep only the listed test ids, in the listed order (one collection per file,
    where passing each node id on the command line would collect its file again)."""

    def __init__(self, test_ids: tuple[str, ...]) -> None:
        self.test_ids = test_ids

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        by_id = {item.nodeid: item for item in items}
        kept = [by_id[t] for t in self.test_ids if t in by_id]
        config.hook.pytest_deselected(
            items=[i for i in items if i.nodeid not in set(self.test_ids)]
        )
        items[:] = kept


def _last_lines(text: str) -> str:
    return "\n".join(text.splitlines()[-FAILURE_LINES:])
