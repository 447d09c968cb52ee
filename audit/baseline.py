"""Baseline: the fence suite under coverage, one context per test, in a test process.

The test process (:mod:`audit.testproc`) runs in the hermetic environment of
:mod:`audit.hermetic`; its whole output goes to ``reports/logs/baseline.log``. A red
baseline or an empty selection stops the audit here, before any mutant.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from audit.config import Config, SuitePath
from audit.errors import BaselineFailed, ConfigError, NoTestsSelected
from audit.hermetic import child_environment, prepare_hf_home
from audit.model import BaselineRun, Target
from audit.protocol import (
    PROJECT_PREFIX,
    BaselineDone,
    BaselineSpec,
    Command,
    Outcomes,
    from_json,
    parse_event,
    to_json,
    write_spec,
)
from audit.sources import TestSource

PYTEST_NO_TESTS_COLLECTED = 5


@dataclass(frozen=True, slots=True)
class Suite:
    """The selected test paths, inside a staged suite root that pytest runs from."""

    source: TestSource
    root: Path  # the staged root: tests/ (vLLM's) and project/ (this repository)
    paths: tuple[str, ...]  # relative to root; node ids keep any ::test part
    selection: tuple[str, ...]  # the configured entries (and plugins), for messages
    plugins: tuple[Path, ...] = ()  # pytest plugin files, inside root


def stage_suite(
    config: Config, source: TestSource, entries: tuple[SuitePath, ...], work: Path
) -> Suite:
    """Lay out one root holding vLLM's tests and this project's, then select paths.

    ``tests/`` mirrors vLLM's tests folder by symlinks, all but its root
    ``conftest.py`` (LLM runners, media assets: heavy, and not needed by the fence
    suite); ``project`` links to this repository. Test ids are then stable and
    short (``tests/v1/...::test_x``, ``project/tests/fence/...``), and vLLM's own
    ``vllm/`` folder, in a checkout, never lands on ``sys.path``.
    """
    root = work / "suite"
    if root.exists():
        shutil.rmtree(root)
    (root / "tests").mkdir(parents=True)
    for child in (source.root / "tests").iterdir():
        if child.name not in ("conftest.py", "__pycache__"):
            (root / "tests" / child.name).symlink_to(child)
    (root / "project").symlink_to(config.project_dir)

    paths: list[str] = []
    for entry in entries:
        prefix = "" if entry.root == "vllm" else PROJECT_PREFIX
        file_part, sep, test_part = entry.path.partition("::")  # a node id selects one test
        if (root / prefix / file_part).exists():
            paths.append(f"{prefix}{file_part}{sep}{test_part}")
        elif not entry.optional:
            base = source.root if entry.root == "vllm" else config.project_dir
            raise ConfigError(
                f"suite path {entry} does not exist",
                details={
                    "looked in": str(base / file_part),
                    "vLLM tests": source.origin,
                    "next": "fix [tool.fence-audit.suite] paths or --suite",
                },
            )
    plugins = tuple(_stage_plugin(root, config, source, entry) for entry in config.plugins)
    selection = (*(str(e) for e in entries), *(f"plugin {e}" for e in config.plugins))
    return Suite(source, root, tuple(paths), selection, plugins)


def _stage_plugin(root: Path, config: Config, source: TestSource, entry: SuitePath) -> Path:
    path = root / ("" if entry.root == "vllm" else "project") / entry.path
    if path.suffix != ".py" or not path.is_file():
        base = source.root if entry.root == "vllm" else config.project_dir
        raise ConfigError(
            f"pytest plugin {entry} is not a Python file",
            details={
                "looked in": str(base / entry.path),
                "next": "fix [tool.fence-audit.suite] plugins or --plugin (one .py file each)",
            },
        )
    return path


class WarmSession:
    """The test process after its baseline: warm, waiting for mutants or for exit.

    It has imported vLLM, collected the suite and run every test once; judging
    mutants in it saves a second process the import, the collection and the
    warm-up. Close it when done (or let :func:`run_baseline` do so).
    """

    def __init__(self, process: subprocess.Popen[str], commands: int, log: Path) -> None:
        self.process = process
        self._commands = commands
        self.log = log
        self.open = True

    def lines(self) -> Iterator[str]:
        """The process's output, line by line, until it exits."""
        assert self.process.stdout is not None
        # Not ``yield from``: closing this generator early would close the pipe too.
        for line in self.process.stdout:  # noqa: UP028
            yield line

    def send(self, command: Command) -> None:
        self.open = False
        try:
            with os.fdopen(self._commands, "w") as channel:
                channel.write(json.dumps(to_json(command)) + "\n")
        except BrokenPipeError:  # the process is gone already; close() collects it
            pass

    def close(self) -> None:
        """End the process and collect it. Unused, it is only waiting for a command:
        its outcomes and coverage data are saved, so it is killed rather than left to
        spend seconds on pytest's teardown."""
        if self.open:
            self.open = False
            self.process.kill()
            os.close(self._commands)
        with self.log.open("a") as out:
            for line in self.lines():
                out.write(line)
        self.process.wait()


def start_baseline(
    config: Config, suite: Suite, target: Target, work: Path
) -> tuple[BaselineRun, WarmSession | None]:
    """Run the suite once under coverage; raise unless every selected test is green.

    On success the test process stays, warm, as a :class:`WarmSession`.
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
        data_file=str(data_file),
        outcomes=str(outcomes_file),
        pytest_args=tuple(pytest_args(suite, work)),
        command_fd=read_end,
    )
    spec_file = work / "baseline-spec.json"
    write_spec(spec_file, spec)

    started = time.monotonic()
    with log.open("w") as out:
        out.write(f"# vLLM tests: {suite.source.origin}\n# selection: {suite.selection}\n")
        process = spawn(config, suite, spec_file, pass_fds=(read_end,))
        os.close(read_end)
        session = WarmSession(process, write_end, log)
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
    except BaseException:
        session.close()
        raise
    return run, session


def run_baseline(config: Config, suite: Suite, target: Target, work: Path) -> BaselineRun:
    """The baseline alone: the test process exits when it is done."""
    run, session = start_baseline(config, suite, target, work)
    if session is not None:
        session.close()
    return run


def spawn(
    config: Config, suite: Suite, spec_file: Path, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[str]:
    """Start a test process (``python -m audit.testproc SPEC``): hermetic, in the suite
    root, its output (stderr included) on a text pipe."""
    hf_home = prepare_hf_home(config.cache_dir, config.offline_models)
    env = child_environment(os.environ, hf_home)
    if suite.plugins:  # each plugin imports by its module name, and its neighbours too
        folders = [str(p.parent) for p in suite.plugins]
        env["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, "-m", "audit.testproc", str(spec_file)],
        cwd=suite.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        pass_fds=pass_fds,
    )


def pytest_args(suite: Suite, work: Path) -> list[str]:
    """How the test processes (baseline and executor) invoke pytest on the suite."""
    ini = work / "pytest.ini"
    # An empty ini of our own: the suite is not configured by this project's pytest
    # settings (--strict-markers would reject vLLM's unregistered marks).
    ini.write_text("[pytest]\n")
    return [
        *suite.paths,
        "-c",
        str(ini),
        f"--rootdir={suite.root}",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestUnknownMarkWarning",
        "-q",
        *(arg for plugin in suite.plugins for arg in ("-p", plugin.stem)),
    ]


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
    red = [t for t in tests if t.outcome.is_red]
    if red or returncode not in (0, PYTEST_NO_TESTS_COLLECTED):
        names = "\n    ".join(t.test_id for t in red[:10]) or f"(pytest exit {returncode})"
        more = f" (and {len(red) - 10} more)" if len(red) > 10 else ""
        raise BaselineFailed(
            f"the baseline failed before any mutant was applied "
            f"({len(red)} of {len(tests)} tests failed)",
            details={
                "failed": names + more,
                "log": str(log),
                "next": "fix or deselect the failing tests; mutants are judged only "
                "against a green baseline",
            },
        )
    return BaselineRun(
        target=target, tests=tests, data_file=data_file, log=log, duration_s=duration
    )
