"""The test process: pytest under coverage, one coverage context per test.

Run as ``python -m audit._child SPEC.json`` by :mod:`audit.baseline`, in the
hermetic environment it prepares. It installs the import overlay and the network
guard before anything imports vLLM, measures only the target file(s), names each
test's context by its pytest node id, and writes every test's outcome to JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import coverage
import pytest

from audit import hermetic, overlay

FAILURE_LINES = 30


class Recorder:
    """A pytest plugin: switches coverage contexts and records outcomes."""

    def __init__(self, cov: coverage.Coverage) -> None:
        self.cov = cov
        self.collected = 0
        self.tests: dict[str, dict[str, Any]] = {}
        self.collection_errors: list[dict[str, str]] = []

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
            self.collection_errors.append(
                {"nodeid": report.nodeid, "failure": _first_lines(report.longreprtext)}
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self.tests.setdefault(
            report.nodeid, {"outcome": "passed", "duration_s": 0.0, "failure": ""}
        )
        test["duration_s"] += report.duration
        if report.failed:
            test["outcome"] = "failed" if report.when == "call" else "error"
            test["failure"] = test["failure"] or _first_lines(report.longreprtext)
        elif report.skipped and test["outcome"] == "passed":
            test["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"


class Select:
    """Keep only the listed test ids, in the listed order (one collection per file,
    where passing each node id on the command line would collect its file again)."""

    def __init__(self, test_ids: list[str] | None) -> None:
        self.test_ids = test_ids

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if self.test_ids is None:
            return
        by_id = {item.nodeid: item for item in items}
        kept = [by_id[t] for t in self.test_ids if t in by_id]
        config.hook.pytest_deselected(
            items=[i for i in items if i.nodeid not in set(self.test_ids)]
        )
        items[:] = kept


def _first_lines(text: str) -> str:
    return "\n".join(text.splitlines()[-FAILURE_LINES:])


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    if spec["overlay"]:
        overlay.install({name: Path(file) for name, file in spec["overlay"].items()})
    hermetic.block_network()
    if not spec.get("coverage", True):
        # A plain run (the benchmark's fresh process per mutant): no measurement.
        return int(pytest.main(spec["pytest_args"], plugins=[Select(spec.get("select"))]))
    cov = coverage.Coverage(
        data_file=spec["data_file"],
        branch=True,
        include=spec["include"],
        config_file=False,
    )
    recorder = Recorder(cov)
    cov.start()
    try:
        exit_code = int(pytest.main(spec["pytest_args"], plugins=[recorder]))
    finally:
        cov.stop()
        cov.save()
    outcomes = {
        "exit_code": exit_code,
        "collected": recorder.collected,
        "collection_errors": recorder.collection_errors,
        "tests": recorder.tests,
    }
    Path(spec["outcomes"]).write_text(json.dumps(outcomes, indent=1))
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
