"""The test process: pytest under coverage, one coverage context per test.

Run as ``python -m audit._child SPEC.json`` by :mod:`audit.baseline`, in the
hermetic environment it prepares. It installs the import overlay and the network
guard before anything imports vLLM, measures only the target file(s), names each
test's context by its pytest node id, and writes every test's outcome to JSON.

Then it stays: the session is collected, vLLM imported and every test of the
suite has run once, which is exactly the warm process the mutant executor needs
(:mod:`audit._executor`). With coverage stopped, it waits for one command on its
command pipe: judge mutants from a spec file, or exit.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import coverage
import pytest

from audit import _executor, hermetic, overlay

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


class Serve:
    """A pytest plugin: the baseline run loop, then mutants on request, one session."""

    def __init__(self, spec: dict[str, Any], cov: coverage.Coverage, recorder: Recorder) -> None:
        self.spec = spec
        self.cov = cov
        self.recorder = recorder
        self.saved = False  # the coverage data, once the baseline is done

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if not self.recorder.collection_errors:
            items = session.items
            for index, item in enumerate(items):
                nextitem = items[index + 1] if index + 1 < len(items) else None
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        self.cov.stop()
        self.cov.save()
        self.saved = True
        red = any(t["outcome"] in ("failed", "error") for t in self.recorder.tests.values())
        if self.recorder.collection_errors:
            code = int(pytest.ExitCode.INTERRUPTED)
        elif not self.recorder.collected:
            code = int(pytest.ExitCode.NO_TESTS_COLLECTED)
        else:
            code = int(pytest.ExitCode.TESTS_FAILED if red else pytest.ExitCode.OK)
        write_outcomes(self.spec, self.recorder, code)
        _executor.emit({"event": "baseline_done", "exit_code": code})
        if code != 0:
            return True
        with os.fdopen(self.spec["command_fd"], "r") as commands:
            command = json.loads(commands.readline() or '{"command": "exit"}')
        if command["command"] == "mutate":
            # The mutants run with coverage off and outcomes no longer recorded.
            session.config.pluginmanager.unregister(self.recorder)
            # Native tracebacks, as a new executor process would use: pytest's long
            # style costs ~0.5 s per killed mutant.
            session.config.option.tbstyle = "native"
            mutation_spec = json.loads(Path(command["spec"]).read_text())
            _executor.MutationLoop(mutation_spec).judge_all(session, warm_up=False)
        return True


def write_outcomes(spec: dict[str, Any], recorder: Recorder, exit_code: int) -> None:
    outcomes = {
        "exit_code": exit_code,
        "collected": recorder.collected,
        "collection_errors": recorder.collection_errors,
        "tests": recorder.tests,
    }
    Path(spec["outcomes"]).write_text(json.dumps(outcomes, indent=1))


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
    serve = Serve(spec, cov, recorder) if spec.get("command_fd") is not None else None
    cov.start()
    try:
        plugins = [recorder] if serve is None else [recorder, serve]
        exit_code = int(pytest.main(spec["pytest_args"], plugins=plugins))
    finally:
        if serve is None or not serve.saved:
            cov.stop()
            cov.save()
    if spec.get("command_fd") is None or not Path(spec["outcomes"]).is_file():
        write_outcomes(spec, recorder, exit_code)
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
