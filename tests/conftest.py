"""Shared fixtures of fence-audit's own tests."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Helpers shared by all test folders (fake_index, kernel) import by module name.
sys.path.insert(0, str(Path(__file__).parent))
from fake_index import FakeIndex

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project_root() -> Path:
    return ROOT


@pytest.fixture
def fake_index() -> Iterator[Callable[[str], FakeIndex]]:
    """Start fake package indexes on loopback; all are shut down after the test."""
    started: list[FakeIndex] = []

    def start(version: str) -> FakeIndex:
        started.append(FakeIndex(version))
        return started[-1]

    yield start
    for index in started:
        index.close()


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C raises KeyboardInterrupt here and in every process the tests start.

    A shell starts a command put in the background (`cmd &`, no job control) with
    SIGINT ignored, and an ignored signal stays ignored across exec: the tests that
    interrupt a process (a judging fork, a finalizer) then saw nothing happen. A Python
    handler is reset to the default on exec, so the processes started from here get
    Python's own handler again."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bless",
        action="store_true",
        help="rewrite the golden report files from the current renderers (then review the diff)",
    )


@pytest.fixture
def bless(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--bless"))
