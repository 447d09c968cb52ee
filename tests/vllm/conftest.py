"""Tests against the real vLLM (the configured release, installed) and its own fence tests:
all marked ``vllm``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/vllm/" in item.nodeid:
            item.add_marker(pytest.mark.vllm)
