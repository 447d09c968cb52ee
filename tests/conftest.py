"""Shared fixtures of fence-audit's own tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project_root() -> Path:
    return ROOT


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private download cache, so a test never reads or fills the user's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FENCE_AUDIT_CACHE", str(cache))
    return cache


def shared_cache() -> Path:
    """The real cache, for tests that need vLLM's sdist (fetched at most once)."""
    from audit.config import default_cache_dir

    return Path(os.environ.get("FENCE_AUDIT_CACHE", default_cache_dir()))
