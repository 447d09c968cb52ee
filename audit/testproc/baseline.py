"""The baseline run: pytest under coverage, one coverage context per test.

In the hermetic environment the parent prepares, it measures only the target
file(s), from the moment the target is imported (:class:`.isolation.StartOnImport`),
and lets :class:`.recorder.Recorder` name each test's context by its pytest node id
and record every test's outcome. Then the process stays: the session is
collected, vLLM imported and every test of the suite has run once, which is exactly
the warm process the mutants need. With coverage stopped it waits for one command
on its command pipe: judge mutants from a spec file (:mod:`.loop`), or exit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import coverage
import pytest

from audit.core.protocol import (
    BaselineDone,
    BaselineSpec,
    MutationSpec,
    Outcomes,
    PlainRunSpec,
    TestOutcome,
    TestResult,
    from_json,
    read_spec,
    to_json,
)
from audit.testproc import heap, isolation, loop
from audit.testproc.channel import emit, read_command
from audit.testproc.recorder import Recorder, Select


class Serve:
    """A pytest plugin: the baseline run loop, then mutants on request, one session."""

    def __init__(
        self,
        spec: BaselineSpec,
        cov: coverage.Coverage,
        recorder: Recorder,
        measuring: isolation.StartOnImport,
    ) -> None:
        self.spec = spec
        self.cov = cov
        self.recorder = recorder
        self.measuring = measuring  # coverage started as the target is imported
        self.saved = False  # the coverage data, once the baseline is done
        self.unwarmed: list[pytest.Item] = []  # tests only a fork ran: warmed on demand
        self.order: tuple[str, ...] = ()  # every collected test, when only some run

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        self.measuring.remove()  # started by now, even if no test module imported the target
        heap.stop_freezing()  # the tests' objects are collected as CPython does
        parts: list[Part] = []
        if not self.recorder.collection_errors:
            items, left = list(session.items), []
            order = tuple(item.nodeid for item in items)
            if self.spec.run_only:
                self.order = order
                wanted = set(self.spec.run_only)
                items = [item for item in items if _file(item) in wanted]
                left = [item for item in session.items if _file(item) not in wanted]
            mine, *theirs = deal(items, self.spec.workers)
            # The forks are taken before any test runs here: each starts from the
            # collected session alone, as a mutant's fork does.
            parts = [self.fork(index, dealt) for index, dealt in enumerate(theirs, start=1)]
            try:
                run_items(mine)
            except BaseException:  # interrupted: no fork outlives this process's run
                for part in parts:
                    os.kill(part.pid, signal.SIGKILL)
                    os.waitpid(part.pid, 0)
                raise
            results = [part.outcomes(part.wait()) for part in parts]
            for part, outcomes in zip(parts, results, strict=True):
                sys.__stdout__.write(part.report(outcomes) + "\n")  # type: ignore[union-attr]
            self.recorder.add(results, order)
            self.unwarmed = unwarmed(mine, theirs)
            if self.spec.run_only:  # and the tests read from the cache, never run here
                self.unwarmed += unwarmed(mine + self.unwarmed, [left])
        self.cov.stop()
        self.cov.save()
        self.saved = True
        merge_coverage(self.spec.data_file, [part.data_file for part in parts])
        if self.recorder.collection_errors:
            code = int(pytest.ExitCode.INTERRUPTED)
        elif not self.recorder.collected:
            code = int(pytest.ExitCode.NO_TESTS_COLLECTED)
        else:
            red = self.recorder.red
            code = int(pytest.ExitCode.TESTS_FAILED if red else pytest.ExitCode.OK)
        write_outcomes(self.spec, self.recorder, code, self.order)
        emit(BaselineDone(code))
        if code != 0 or self.spec.command_fd is None:
            return True
        # The audit now builds its coverage map and its mutants' jobs (1.8 s on vLLM
        # 0.33.0's scheduler tests): time in which this process, idle, moves to huge
        # pages, so that even a run of a few mutants forks cheaply (.loop).
        megabytes, seconds = loop.collapse_memory()
        command = read_command(self.spec.command_fd)
        if command.action == "mutate":
            # The mutants run with coverage off and outcomes no longer recorded.
            session.config.pluginmanager.unregister(self.recorder)
            # Native tracebacks, as a new executor process would use: pytest's long
            # style costs ~0.5 s per killed mutant.
            session.config.option.tbstyle = "native"
            # The functions only a fork ran: their one-time work is done here.
            warmed = loop.warm_up(self.unwarmed, len(session.items))
            warmed = dataclasses.replace(warmed, huge_mb=megabytes, huge_s=seconds)
            spec = read_spec(Path(command.spec))
            assert isinstance(spec, MutationSpec)
            loop.MutantLoop(spec).judge_all(session, warmed=warmed)
        return True

    def fork(self, index: int, items: list[pytest.Item]) -> Part:
        """Run ``items`` in a fork of this process, measured by a coverage of its own."""
        part = Part(
            index,
            pid=0,
            data_file=f"{self.spec.data_file}.part{index}",
            outcomes_file=f"{self.spec.outcomes}.part{index}",
            tests=tuple(item.nodeid for item in items),
        )
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
        pid = os.fork()
        if pid:
            return dataclasses.replace(part, pid=pid)
        code = 1
        try:
            isolation.die_with_parent()
            # Silent: the parent writes this part's account to the log (:meth:`Part.report`).
            reporter = items[0].config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                items[0].config.pluginmanager.unregister(reporter)
            # The parent's measurement is the parent's: this fork's own starts empty.
            self.cov.stop()
            cov = measurement(self.spec, part.data_file)
            self.recorder.restart(cov)
            cov.start()
            run_items(items)
            cov.stop()
            cov.save()
            outcomes = self.recorder.outcomes(0)
            Path(part.outcomes_file).write_text(json.dumps(to_json(outcomes)))
            code = 0
        finally:
            os._exit(code)


@dataclass(frozen=True, slots=True)
class Part:
    """The tests of the baseline one fork ran, and where it left their results."""

    index: int
    pid: int
    data_file: str
    outcomes_file: str
    tests: tuple[str, ...]

    def wait(self) -> int:
        """The fork's exit status, once it has ended."""
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])

    def lost(self, exit_status: int) -> Outcomes:
        why = (
            f"the baseline's fork {self.index} ended with exit status {exit_status} "
            "before it wrote its outcomes"
        )
        return Outcomes(
            exit_code=int(pytest.ExitCode.INTERNAL_ERROR),
            collected=len(self.tests),
            collection_errors=(),
            tests=tuple(TestResult(t, TestOutcome.ERROR, 0.0, why) for t in self.tests),
        )

    def report(self, outcomes: Outcomes) -> str:
        """This part's account for the log: its tests by outcome, and each red one's end."""
        counts = Counter(test.outcome.value for test in outcomes.tests)
        tally = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        lines = [f"\n# fork {self.index} of the baseline ran {len(self.tests)} tests: {tally}"]
        for test in outcomes.tests:
            if test.outcome.is_red:
                lines += [f"# {test.outcome.value}: {test.test_id}", test.failure]
        return "\n".join(lines)

    def outcomes(self, exit_status: int) -> Outcomes:
        """What the fork recorded; every test of it an error if it wrote nothing."""
        path = Path(self.outcomes_file)
        if not path.is_file():
            return self.lost(exit_status)
        outcomes = from_json(Outcomes, json.loads(path.read_text()))
        path.unlink()
        return outcomes


def deal(items: list[pytest.Item], workers: int) -> list[list[pytest.Item]]:
    """The collected tests dealt to ``workers`` processes in turn, each part in order.

    In turn, not by duration: a test's parametrizations sit side by side, so each
    process runs some of nearly every test function, and this one, which the mutants'
    forks start from, has paid nearly every function's one-time work (imports,
    caches). Dealt by duration (longest first), the mutant phase of `nox -s bench`
    took 56.4 s against 22.5 s.
    """
    workers = max(1, min(workers, len(items)))
    return [items[index::workers] for index in range(workers)]


def run_items(items: list[pytest.Item]) -> None:
    for index, item in enumerate(items):
        nextitem = items[index + 1] if index + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)


def unwarmed(mine: list[pytest.Item], theirs: list[list[pytest.Item]]) -> list[pytest.Item]:
    """One test of each test function that only forks ran: the mutants' forks start
    from this process, and a function's first run pays one-time work (imports)."""
    ran = {_function(item) for item in mine}
    chosen: dict[str, pytest.Item] = {}
    for items in theirs:
        for item in items:
            name = _function(item)
            if name not in ran:
                chosen.setdefault(name, item)
    return list(chosen.values())


def _function(item: pytest.Item) -> str:
    return item.nodeid.partition("[")[0]


def _file(item: pytest.Item) -> str:
    return item.nodeid.partition("::")[0]


def merge_coverage(data_file: str, parts: list[str]) -> None:
    """Add each fork's measurement to this process's data file, then remove it."""
    if not parts:
        return
    data = coverage.CoverageData(basename=data_file)
    data.read()
    for part in parts:
        path = Path(part)
        if path.is_file():
            other = coverage.CoverageData(basename=part)
            other.read()
            data.update(other)
            path.unlink()
    data.write()


def write_outcomes(
    spec: BaselineSpec, recorder: Recorder, exit_code: int, order: tuple[str, ...] = ()
) -> None:
    outcomes = recorder.outcomes(exit_code, order)
    Path(spec.outcomes).write_text(json.dumps(to_json(outcomes), indent=1))


def measurement(spec: BaselineSpec, data_file: str) -> coverage.Coverage:
    """The coverage that measures the spec's files into ``data_file`` (not started)."""
    return coverage.Coverage(
        data_file=data_file, branch=True, include=list(spec.include), config_file=False
    )


def run(spec: BaselineSpec) -> int:
    """The baseline under coverage; kept warm for the mutants when the spec has a pipe."""
    cov = measurement(spec, spec.data_file)
    recorder = Recorder(cov)
    serve = Serve(spec, cov, recorder, isolation.start_on_import(spec.measure_from, cov.start))
    try:
        exit_code = int(pytest.main(list(spec.pytest_args), plugins=[recorder, serve]))
    finally:
        if not serve.saved:
            serve.measuring.remove()  # pytest stopped before its run loop: save what ran
            cov.stop()
            cov.save()
    if not Path(spec.outcomes).is_file():  # pytest stopped before the run loop
        write_outcomes(spec, recorder, exit_code)
    return exit_code


def run_plain(spec: PlainRunSpec) -> int:
    """The selected tests once, unmeasured (the benchmark's fresh process per mutant)."""
    return int(pytest.main(list(spec.pytest_args), plugins=[Select(spec.select)]))
