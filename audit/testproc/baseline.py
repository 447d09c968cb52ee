"""The baseline run: pytest under coverage, one coverage context per test.

In the hermetic environment the parent prepares, it measures only the target
file(s) and lets :class:`.recorder.Recorder` name each test's context by its pytest
node id and record every test's outcome. Then the process stays: the session is
collected, vLLM imported and every test of the suite has run once, which is exactly
the warm process the mutants need. With coverage stopped it waits for one command
on its command pipe: judge mutants from a spec file (:mod:`.loop`), or exit.
"""

from __future__ import annotations

import json
from pathlib import Path

import coverage
import pytest

from audit.protocol import (
    BaselineDone,
    BaselineSpec,
    MutationSpec,
    PlainRunSpec,
    read_spec,
    to_json,
)
from audit.testproc import loop
from audit.testproc.channel import emit, read_command
from audit.testproc.recorder import Recorder, Select


class Serve:
    """A pytest plugin: the baseline run loop, then mutants on request, one session."""

    def __init__(self, spec: BaselineSpec, cov: coverage.Coverage, recorder: Recorder) -> None:
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
        if self.recorder.collection_errors:
            code = int(pytest.ExitCode.INTERRUPTED)
        elif not self.recorder.collected:
            code = int(pytest.ExitCode.NO_TESTS_COLLECTED)
        else:
            red = self.recorder.red
            code = int(pytest.ExitCode.TESTS_FAILED if red else pytest.ExitCode.OK)
        write_outcomes(self.spec, self.recorder, code)
        emit(BaselineDone(code))
        if code != 0 or self.spec.command_fd is None:
            return True
        command = read_command(self.spec.command_fd)
        if command.action == "mutate":
            # The mutants run with coverage off and outcomes no longer recorded.
            session.config.pluginmanager.unregister(self.recorder)
            # Native tracebacks, as a new executor process would use: pytest's long
            # style costs ~0.5 s per killed mutant.
            session.config.option.tbstyle = "native"
            spec = read_spec(Path(command.spec))
            assert isinstance(spec, MutationSpec)
            loop.MutantLoop(spec).judge_all(session, warm_up=False)
        return True


def write_outcomes(spec: BaselineSpec, recorder: Recorder, exit_code: int) -> None:
    Path(spec.outcomes).write_text(json.dumps(to_json(recorder.outcomes(exit_code)), indent=1))


def run(spec: BaselineSpec) -> int:
    """The baseline under coverage; kept warm for the mutants when the spec has a pipe."""
    cov = coverage.Coverage(
        data_file=spec.data_file, branch=True, include=list(spec.include), config_file=False
    )
    recorder = Recorder(cov)
    serve = Serve(spec, cov, recorder)
    cov.start()
    try:
        exit_code = int(pytest.main(list(spec.pytest_args), plugins=[recorder, serve]))
    finally:
        if not serve.saved:
            cov.stop()
            cov.save()
    if not Path(spec.outcomes).is_file():  # pytest stopped before the run loop
        write_outcomes(spec, recorder, exit_code)
    return exit_code


def run_plain(spec: PlainRunSpec) -> int:
    """The selected tests once, unmeasured (the benchmark's fresh process per mutant)."""
    return int(pytest.main(list(spec.pytest_args), plugins=[Select(spec.select)]))
