"""vLLM's tests run the way vLLM runs them, in a tree (:mod:`.trees`), with outcomes read
back per test.

One pytest process per run, in the tree, under vLLM's own pytest configuration (its
``pyproject.toml`` from the release's sdist: its markers, so ``-m cpu_test`` selects
as vLLM's CPU job does) and the hermetic environment every test process of the audit
gets (:mod:`audit.core.hermetic`). The tree is first on ``sys.path``, so ``import vllm``
finds the tree's patched ``vllm/`` when it has one and the installed package when it
has none. Outcomes come from pytest's JUnit XML: per test id, passed, failed (with
the first line of what failed), skipped or error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from audit.core.hermetic import child_environment, prepare_hf_home
from audit.setup.session import TEST_PROCESS_PLUGINS

PASSED, FAILED, SKIPPED, ERROR = "passed", "failed", "skipped", "error"


@dataclass(frozen=True, slots=True)
class TestOutcome:
    __test__ = False  # not a pytest test class

    test_id: str  # pytest's node id, from the tree's root
    outcome: str  # passed | failed | skipped | error
    message: str  # what failed (its assertion's first lines), "" when it passed
    seconds: float = 0.0  # pytest's time for it (setup, call and teardown)


@dataclass(frozen=True, slots=True)
class TestRun:
    __test__ = False

    outcomes: tuple[TestOutcome, ...]
    exit_code: int
    seconds: float
    log: Path

    def by_id(self) -> dict[str, TestOutcome]:
        return {o.test_id: o for o in self.outcomes}

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes if o.outcome == outcome)

    def by_file(self) -> dict[str, tuple[int, float]]:
        """Per test file, in file order: its tests, and pytest's time summed over them."""
        files: dict[str, tuple[int, float]] = {}
        for o in self.outcomes:
            name = o.test_id.split("::", 1)[0]
            tests, seconds = files.get(name, (0, 0.0))
            files[name] = (tests + 1, seconds + o.seconds)
        return files


def run_tests(
    tree: Path,
    selection: Sequence[str],
    *,
    cache_dir: Path,
    models: tuple[str, ...],
    log: Path,
    extra_args: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
) -> TestRun:
    """Run ``selection`` (paths or node ids from the tree's root) in ``tree``."""
    junit = log.with_suffix(".xml")
    junit.unlink(missing_ok=True)
    env = child_environment(environment or os.environ, prepare_hf_home(cache_dir, models))
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    command = [
        sys.executable,
        "-m",
        "pytest",
        *selection,
        "-c",
        str(tree / "pyproject.toml"),
        f"--rootdir={tree}",
        f"--confcutdir={tree / 'tests/v1/kv_connector/unit'}",
        "-p",
        "no:cacheprovider",
        *TEST_PROCESS_PLUGINS,
        f"--junitxml={junit}",
        "-q",
        *extra_args,
    ]
    started = time.monotonic()
    code = run_logged(command, log=log, env=env, cwd=tree)
    seconds = time.monotonic() - started
    return TestRun(read_junit(junit) if junit.is_file() else (), code, seconds, log)


def run_logged(
    command: Sequence[str], *, log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> int:
    """Run ``command``, its output (stderr too) into ``log`` after the command line
    itself; its exit code."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        return subprocess.run(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode


def read_junit(junit: Path) -> tuple[TestOutcome, ...]:
    """Per test case of pytest's JUnit XML: its node id and outcome."""
    outcomes = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parts = classname.split(".")
        # classname is the module's dotted path (and a class), name the function
        module = next((i for i in range(len(parts), 0, -1) if parts[i - 1].startswith("test_")), 0)
        test_id = "/".join(parts[:module]) + ".py::" + "::".join([*parts[module:], name])
        outcome, message = PASSED, ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = FAILED if child.tag == "failure" else ERROR
                message = child.get("message", "") or (child.text or "")
                break
            if child.tag == "skipped":
                outcome, message = SKIPPED, child.get("message", "")
        seconds = float(case.get("time", "0") or 0)
        outcomes.append(TestOutcome(test_id, outcome, message.strip(), seconds))
    return tuple(outcomes)
