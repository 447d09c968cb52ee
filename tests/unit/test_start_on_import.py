"""The baseline's coverage starts as the measured module is imported."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from audit.testproc.isolation import start_on_import


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "startpkg").mkdir()
    (tmp_path / "startpkg" / "__init__.py").write_text("")
    (tmp_path / "startpkg" / "before.py").write_text("VALUE = 1\n")
    (tmp_path / "startpkg" / "target.py").write_text("from startpkg.before import VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "startpkg"
    for name in [n for n in sys.modules if n.startswith("startpkg")]:
        del sys.modules[name]


def test_start_comes_with_the_target_and_only_once(package: str) -> None:
    calls: list[str] = []
    finder = start_on_import(f"{package}.target", lambda: calls.append("start"))
    try:
        importlib.import_module(f"{package}.before")
        assert calls == []
        module = importlib.import_module(f"{package}.target")
        assert calls == ["start"]
        assert module.VALUE == 1
        importlib.reload(module)
        assert calls == ["start"]
    finally:
        finder.remove()
    assert finder not in sys.meta_path
    assert calls == ["start"]


def test_a_target_never_imported_starts_when_the_finder_steps_out(package: str) -> None:
    calls: list[str] = []
    finder = start_on_import(f"{package}.target", lambda: calls.append("start"))
    assert calls == []
    finder.remove()
    assert calls == ["start"]
    assert finder not in sys.meta_path


def test_a_target_already_imported_or_none_starts_at_once(package: str) -> None:
    importlib.import_module(f"{package}.target")
    calls: list[str] = []
    start_on_import(f"{package}.target", lambda: calls.append("imported")).remove()
    start_on_import("", lambda: calls.append("none")).remove()
    assert calls == ["imported", "none"]
