"""Helpers of the tests against real vLLM: the command line, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FENCE_TESTS = "vllm:tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def fence_audit(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Result:
    """``python -m audit ARGS`` in the lean environment this test runs in."""
    process = subprocess.run(
        [sys.executable, "-m", "audit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    return Result(process.returncode, process.stdout, process.stderr)
