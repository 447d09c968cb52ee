"""``fence-audit catalogue check`` against the installed (configured) vLLM: no test runs."""

from __future__ import annotations

import shutil
from pathlib import Path

from fence_helpers import fence_audit

from audit.core.errors import ExitCode


def test_every_catalogue_entry_applies_to_the_installed_vllm(project_root: Path) -> None:
    result = fence_audit("catalogue", "check", cwd=project_root)
    assert result.returncode == 0, result.stdout + result.stderr
    entries = len(list((project_root / "mutants" / "catalogue").glob("*.toml")))
    assert entries >= 30
    assert f"fence-audit: {entries} ok; no entry is stale" in result.stdout
    assert "STALE" not in result.stdout


def test_an_entry_that_no_longer_applies_is_reported_stale(
    project_root: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "catalogue"
    folder.mkdir()
    shutil.copy(project_root / "mutants" / "catalogue" / "flush-no-main-check.toml", folder)
    text = (project_root / "mutants" / "catalogue" / "removal-keeps-empty-keys.toml").read_text()
    # As after an upstream rename: the anchored statement is gone.
    (folder / "removal-keeps-empty-keys.toml").write_text(
        text.replace('statement = "if not pending:"', 'statement = "if not waiting_jobs:"')
    )
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f'[tool.fence-audit]\ncatalogue = "{folder}"\n')
    result = fence_audit("catalogue", "check", "--config", str(pyproject), cwd=tmp_path)
    assert result.returncode == ExitCode.CATALOGUE_STALE == 12
    assert "STALE    removal-keeps-empty-keys" in result.stdout
    assert "contains 'if not waiting_jobs:'" in result.stdout
    assert "ok       flush-no-main-check" in result.stdout
