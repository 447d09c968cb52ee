"""Log capture in a fork: pytest's handler, attached once per test instead of six times.

pytest's logging plugin attaches two capturing handlers to the root logger and to
every non-propagating logger around each of a test's three phases, and scans all
loggers each time (about 950 once vLLM and torch are imported). In a fork that runs a
mutant's covering tests that was about a tenth of the fork's CPU. What a verdict
needs from the plugin is what a test can observe: a log call that cannot be
formatted raises into the code under test (pytest's handler re-raises, where
logging's own handlers only print), and ``caplog``. So, in a fork whose tests do not
use ``caplog`` and where no log level or live logging is configured, the plugin is
unregistered and its report handler is attached around each whole test instead: the
same handler class and formatter, on the same loggers, scanned once per test. The
captured text is dropped after each test; a verdict keeps the traceback only.
Otherwise pytest's plugin runs as it always does.

The scan itself is costly in a fork: it takes a reference to each of the ~950 logger
objects, each on a page shared with the warm parent, so about 830 pages are copied on
write (3-4 ms), in every fork, for its first test. So the warm process scans once
before its first fork (:func:`settle`), and the first capture in each fork attaches to
what that scan found: the fork starts in the state the parent scanned, no test has run
in it yet, and a logger added since would show in the count of loggers (then the fork
scans). Each further test in a fork scans as before: a test may have made a logger
non-propagating.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager

import pytest
from _pytest.logging import LoggingPlugin, _LiveLoggingNullHandler, catching_logs

Capture = Callable[[], AbstractContextManager[object]]
PLUGIN = "logging-plugin"  # the name pytest registers its LoggingPlugin under

# The warm process's scan (settle): how many loggers there were, and those a capture
# attaches to. The first capture after it takes it; empty once taken, or before.
_SETTLED: list[tuple[int, tuple[logging.Logger, ...]]] = []


def per_test_capture(items: Iterable[pytest.Item]) -> Capture:
    """What to wrap each of ``items`` in: one capture of its whole run, or nothing
    when pytest's own per-phase capture has to stay (see the module's docstring)."""
    items = list(items)
    if not items:
        return contextlib.nullcontext
    manager = items[0].config.pluginmanager
    plugin = manager.get_plugin(PLUGIN)
    if not isinstance(plugin, LoggingPlugin) or not replaceable(plugin, items):
        return contextlib.nullcontext
    manager.unregister(plugin)
    handler = plugin.report_handler

    @contextlib.contextmanager
    def capture() -> Iterator[object]:
        loggers = _take_settled()
        with catching_logs(handler) if loggers is None else _attached(handler, loggers):
            try:
                yield handler
            finally:
                handler.reset()

    return capture


def settle() -> None:
    """Scan the loggers now, in the warm process, for the first capture in each fork."""
    root = logging.getLogger()
    loggers = root.manager.loggerDict
    silent = (
        logger
        for logger in loggers.values()
        if isinstance(logger, logging.Logger) and not logger.propagate and logger is not root
    )
    _SETTLED[:] = [(len(loggers), (root, *silent))]


def _take_settled() -> tuple[logging.Logger, ...] | None:
    """The settled loggers, for the first capture after :func:`settle` (None after it,
    or when a logger was added since)."""
    if not _SETTLED:
        return None
    count, loggers = _SETTLED.pop()
    return loggers if count == len(logging.getLogger().manager.loggerDict) else None


@contextlib.contextmanager
def _attached(handler: logging.Handler, loggers: tuple[logging.Logger, ...]) -> Iterator[None]:
    """``handler`` on ``loggers`` while the block runs, as pytest's catching_logs
    attaches it (no level set) to the loggers its scan finds."""
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def replaceable(plugin: LoggingPlugin, items: list[pytest.Item]) -> bool:
    """Whether nothing these tests can see depends on the per-phase capture."""
    return (
        plugin.log_level is None
        and isinstance(plugin.log_cli_handler, _LiveLoggingNullHandler)
        and not any("caplog" in getattr(item, "fixturenames", ()) for item in items)
    )
