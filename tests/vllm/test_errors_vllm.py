"""Each way the audit refuses to go on: its own message and its documented exit code."""

from __future__ import annotations

import os
from pathlib import Path

from fence_helpers import VLLM_VERSION, fence_audit

from audit.core.errors import ExitCode


def pyproject(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.fence-audit]\n" + body)
    return path


def test_unknown_region_function(tmp_path: Path) -> None:
    config = pyproject(
        tmp_path,
        """
[tool.fence-audit.regions.removal]
[[tool.fence-audit.regions.removal.select]]
function = "OffloadingConnectorScheduler._remove_pending_jobs"
""",
    )
    result = fence_audit("regions", "--config", str(config), cwd=tmp_path)
    assert result.returncode == ExitCode.REGION_UNRESOLVED == 6
    assert "1 region anchor does not resolve" in result.stderr
    assert "removal: no function OffloadingConnectorScheduler._remove_pending_jobs" in result.stderr
    assert "closest: OffloadingConnectorScheduler._remove_pending_job (line " in result.stderr
    assert not (tmp_path / "reports").exists()


def test_installed_version_differs_from_configured(tmp_path: Path) -> None:
    config = pyproject(tmp_path, 'vllm-version = "0.32.0"\n')
    result = fence_audit("coverage", "--config", str(config), cwd=tmp_path)
    assert result.returncode == ExitCode.ENVIRONMENT == 7
    assert f"installed vLLM is {VLLM_VERSION}, but the audit is configured for 0.32.0" in (
        result.stderr
    )
    assert not (tmp_path / "reports").exists()


def test_no_sdist_in_cache_and_no_network(tmp_path: Path) -> None:
    env = {**os.environ, "FENCE_AUDIT_INDEX_URL": "http://127.0.0.1:9/simple"}
    result = fence_audit(
        "coverage", "--cache-dir", str(tmp_path / "empty-cache"), cwd=tmp_path, env=env
    )
    assert result.returncode == ExitCode.SOURCE_UNAVAILABLE == 8
    assert "not in the cache and the package index is unreachable" in result.stderr


def test_sdist_hash_mismatch(tmp_path: Path, fake_index) -> None:  # type: ignore[no-untyped-def]
    index = fake_index(VLLM_VERSION)
    index.digest = "f" * 64  # the index publishes a digest the file does not have
    env = {**os.environ, "FENCE_AUDIT_INDEX_URL": index.url}
    result = fence_audit("coverage", "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path, env=env)
    assert result.returncode == ExitCode.SOURCE_INTEGRITY == 9
    assert "does not match the sha256 the package index publishes" in result.stderr
    assert "f" * 64 in result.stderr
    assert not (tmp_path / "cache" / "tests").exists()


def test_red_baseline(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_red.py").write_text("def test_red():\n    assert False\n")
    config = pyproject(tmp_path, "")
    result = fence_audit(
        "coverage", "--config", str(config), "--suite", "project:tests/test_red.py", cwd=tmp_path
    )
    assert result.returncode == ExitCode.BASELINE_FAILED == 4
    assert "the baseline failed before any mutant was applied (1 of 1 tests failed)" in (
        result.stderr
    )
    assert "test_red.py::test_red" in result.stderr
    assert str(tmp_path / "reports" / "logs" / "baseline.log") in result.stderr


def test_selection_that_collects_no_test(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_nothing.py").write_text("X = 1\n")
    config = pyproject(tmp_path, "")
    result = fence_audit(
        "coverage",
        "--config",
        str(config),
        "--suite",
        "project:tests/test_nothing.py",
        cwd=tmp_path,
    )
    assert result.returncode == ExitCode.NO_TESTS_SELECTED == 5
    assert "the test selection collected no test" in result.stderr
