"""Which forks may attach pytest's log handler once per test (testproc/logs.py)."""

from __future__ import annotations

import logging

import pytest
from _pytest.logging import LoggingPlugin

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
