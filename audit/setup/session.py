"""The test process as fence-audit sees it: started, spoken to, kept warm, ended.

The other side of the process boundary is :mod:`audit.testproc`; what crosses it is
:mod:`audit.core.protocol`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from audit.core.hermetic import child_environment, prepare_hf_home
from audit.core.protocol import Command, to_json
from audit.setup.config import Config
from audit.setup.suite import Suite


class WarmSession:
    """The test process after its baseline: warm, waiting for mutants or for exit.

    It has imported vLLM, collected the suite and run every test once; judging
    mutants in it saves a second process the import, the collection and the
    warm-up. Close it when done (:func:`audit.baseline.run.run_baseline` does).
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


# The plugins of every test process the audit starts, and of mutmut's in the benchmark:
# vLLM 0.34.0's CPU platform refuses a host without Triton (testproc/stand_in.py); the
# offline hub's answer on safetensors, without vLLM's 2 s retry (testproc/offline_hub.py).
TEST_PROCESS_PLUGINS = ("-p", "audit.testproc.stand_in", "-p", "audit.testproc.offline_hub")


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
        *TEST_PROCESS_PLUGINS,
        *(arg for plugin in suite.plugins for arg in ("-p", plugin.stem)),
    ]
