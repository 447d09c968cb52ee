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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager

import pytest
from _pytest.logging import LoggingPlugin, _LiveLoggingNullHandler, catching_logs

Capture = Callable[[], AbstractContextManager[object]]
PLUGIN = "logging-plugin"  # the name pytest registers its LoggingPlugin under


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
        with catching_logs(handler):
            try:
                yield handler
            finally:
                handler.reset()

    return capture


def replaceable(plugin: LoggingPlugin, items: list[pytest.Item]) -> bool:
    """Whether nothing these tests can see depends on the per-phase capture."""
    return (
        plugin.log_level is None
        and isinstance(plugin.log_cli_handler, _LiveLoggingNullHandler)
        and not any("caplog" in getattr(item, "fixturenames", ()) for item in items)
    )
