"""Helpers of the tests against real vLLM: the command line, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from audit.setup.config import load_config

FENCE_TESTS = "vllm:tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"
# The vLLM these tests run against: the release the project configures (pyproject.toml's
# vllm-version, or $FENCE_AUDIT_VLLM_VERSION), installed in the environment they run in.
VLLM_VERSION = load_config(Path(__file__).resolve().parents[2] / "pyproject.toml").vllm_version


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


def private_cache(tmp_path: Path) -> Path:
    """A fresh cache holding only vLLM's extracted tests (copied from the shared cache).

    Mutant verdicts then start from nothing, and no download is needed.
    """
    import shutil

    shared = load_config().cache_dir
    tests = f"vllm-{VLLM_VERSION}"
    if not (shared / "tests" / tests).is_dir():  # a fresh machine: fetch it once
        fetched = fence_audit("fetch", cwd=Path.cwd())
        assert fetched.returncode == 0, fetched.stderr
    cache = tmp_path / "cache"
    shutil.copytree(shared / "tests" / tests, cache / "tests" / tests)
    (cache / "sdist").mkdir(parents=True)
    digest = f"vllm-{VLLM_VERSION}.tar.gz.sha256"
    shutil.copy(shared / "sdist" / digest, cache / "sdist" / digest)
    return cache
