"""Which forks may attach pytest's log handler once per test (testproc/logs.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from _pytest.logging import LogCaptureHandler, LoggingPlugin, catching_logs

from audit.testproc import logs


def plugin_of(request: pytest.FixtureRequest) -> LoggingPlugin:
    plugin = request.config.pluginmanager.get_plugin(logs.PLUGIN)
    assert isinstance(plugin, LoggingPlugin)
    return plugin


def test_tests_that_do_not_read_the_log_get_one_capture_per_test(
    request: pytest.FixtureRequest,
) -> None:
    assert logs.replaceable(plugin_of(request), [request.node])


def test_a_test_that_reads_the_log_keeps_pytest_s_capture(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    assert not logs.replaceable(plugin_of(request), [request.node])


def test_a_configured_log_level_keeps_pytest_s_capture(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = plugin_of(request)
    # the level pytest would set on the root logger around each phase
    monkeypatch.setattr(plugin, "log_level", logging.INFO)
    assert not logs.replaceable(plugin, [request.node])


@pytest.fixture
def silent_logger() -> Iterator[logging.Logger]:
    """A non-propagating logger: pytest's capture attaches to it as well as to the root."""
    logger = logging.getLogger("fence-audit-test.silent")
    logger.propagate = False
    yield logger
    logger.propagate = True


def scanned_by_pytest() -> list[logging.Logger]:
    """The loggers pytest's own capture attaches its handler to, now."""
    with catching_logs(LogCaptureHandler()) as handler:
        return [
            logger
            for logger in logging.Logger.manager.loggerDict.values()
            if isinstance(logger, logging.Logger) and handler in logger.handlers
        ] + [logging.getLogger()]


def test_the_settled_scan_is_pytest_s_and_is_taken_once(silent_logger: logging.Logger) -> None:
    logs.settle()
    taken = logs._take_settled()
    assert taken is not None
    assert silent_logger in taken
    assert set(taken) == set(scanned_by_pytest())
    assert logs._take_settled() is None  # a further test scans as pytest does


def test_a_logger_added_after_the_scan_makes_the_fork_scan(silent_logger: logging.Logger) -> None:
    logs.settle()
    logging.getLogger("fence-audit-test.added-after-the-scan")
    assert logs._take_settled() is None


def test_the_settled_capture_raises_what_pytest_s_raises(silent_logger: logging.Logger) -> None:
    """A log call that cannot be formatted raises into the test, on a non-propagating
    logger too: pytest's handler re-raises."""
    logs.settle()
    loggers = logs._take_settled()
    assert loggers is not None
    handler = LogCaptureHandler()
    with logs._attached(handler, loggers), pytest.raises(TypeError):
        silent_logger.error("%d blocks", "not a number")
    assert handler not in silent_logger.handlers
    assert handler not in logging.getLogger().handlers
