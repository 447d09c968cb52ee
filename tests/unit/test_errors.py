"""How an error reads: one line, whatever its details hold."""

from __future__ import annotations

from audit.core.errors import BaselineFailed, ConfigError


def test_an_error_is_one_line_what_where_then_next() -> None:
    error = ConfigError(
        "--jobs is 0: give 1 or more",
        details={"next": "pass --jobs 2", "config": "command line", "file": "pyproject.toml"},
    )
    assert error.render() == (
        "fence-audit: --jobs is 0: give 1 or more (config: command line; file: pyproject.toml)"
        "; next: pass --jobs 2"
    )
    assert ConfigError("no details").render() == "fence-audit: no details"


def test_a_detail_that_spans_lines_is_joined() -> None:
    error = BaselineFailed(
        "the baseline failed",
        details={"first failure": "Traceback:\n  File 'x.py'\n\n  AssertionError"},
    )
    assert error.render() == (
        "fence-audit: the baseline failed (first failure: Traceback: File 'x.py' AssertionError)"
    )
