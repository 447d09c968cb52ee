"""Shared fixtures of fence-audit's own tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Helpers shared by all test folders (fake_index, kernel) import by module name.
sys.path.insert(0, str(Path(__file__).parent))
from fake_index import FakeIndex

ROOT = Path(__file__).resolve().parents[1]
# The cache of the fence-audit runs these tests start, apart from the user's (see
# pytest_configure); $FENCE_AUDIT_CACHE, when set, is used instead.
TEST_CACHE = ROOT / ".pytest_cache" / "fence-audit" / "cache"
# Of its entries, those a test run makes for itself (keyed by its temporary folders,
# mostly): what the session did not use goes when it ends. Downloads stay.
SESSION_KINDS = ("verdicts", "mutations", "baselines", "leftovers")
_STARTED = pytest.StashKey[float]()


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
    if not os.environ.get("FENCE_AUDIT_CACHE"):
        config.stash[_STARTED] = time.time()
        _seed(TEST_CACHE)
        os.environ["FENCE_AUDIT_CACHE"] = str(TEST_CACHE)


def _seed(cache: Path) -> None:
    """The tests' cache gets the downloads the user's cache already holds (vLLM's
    sdists with their digests, Stryker's schema), copied: nothing is written there,
    and nothing is fetched twice. Baselines and verdicts made by the tests' runs stay
    out of the user's cache, where they were never read again and misled a later
    audit's "why the baseline ran again"."""
    from audit.core import cache as caches
    from audit.setup.config import default_cache_dir

    caches.mark(cache)  # the tests' cache is fence-audit's: its runs may prune it
    user = default_cache_dir()
    wanted = [*sorted((user / "sdist").glob("vllm-*.tar.gz")), *(user / "schemas").glob("*")]
    for found in wanted:
        digest = found.with_name(found.name + ".sha256")
        for path in (found, digest) if digest.is_file() else (found,):
            mine = cache / path.relative_to(user)
            if path.is_file() and not mine.exists():
                mine.parent.mkdir(parents=True, exist_ok=True)
                partial = mine.with_name(f".{mine.name}.seed.tmp")
                shutil.copyfile(path, partial)
                partial.replace(mine)


def pytest_unconfigure(config: pytest.Config) -> None:
    """What the tests' runs made in their cache and this session did not use goes
    (fence-audit's own prune): the cache does not grow with every session."""
    started = config.stash.get(_STARTED, None)
    if started is not None:
        from audit.core import cache
        from audit.core.errors import ConfigError

        # another session's run still using the cache keeps it as it is, for now
        with contextlib.suppress(ConfigError):
            cache.prune(TEST_CACHE, 0, now=started, kinds=SESSION_KINDS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bless",
        action="store_true",
        help="rewrite the golden report files from the current renderers (then review the diff)",
    )


@pytest.fixture
def bless(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--bless"))
