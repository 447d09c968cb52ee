"""The hunt's tests (``nox -s hunt``): beside the fence suite, not in it, so that the
audit (which runs ``tests/fence``) does not judge mutants with a test of a tool.

They need what the fence suite's conftest gives its tests: ``tests/fence`` importable
and, run directly, an offline Hugging Face home before vLLM is imported. That conftest
is run here as it is, once.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

runpy.run_path(str(Path(__file__).resolve().parents[1] / "fence" / "conftest.py"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/hunt/" in item.nodeid:
            item.add_marker(pytest.mark.vllm)
