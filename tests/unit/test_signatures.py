"""A builtin's text signature parsed once per warm process (audit/testproc/signatures.py):
inspect's own answers, no copy of sys.modules after the first, no object kept alive."""

from __future__ import annotations

import gc
import inspect
import math
import os
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from audit.testproc import signatures


class Plain:
    """A class with object's constructor, as vLLM's mocked OffloadingManager has."""


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """The wrap installed on inspect for one test (inspect's own parser restored
    after); returns inspect's own parser."""
    original = inspect._signature_fromstr  # type: ignore[attr-defined]
    monkeypatch.setattr(inspect, "_signature_fromstr", original)
    assert signatures.install()
    return original


def copies_of_sys_modules(call: Callable[[], object]) -> int:
    """How often ``call`` copies sys.modules."""
    copies = 0

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        nonlocal copies
        if event == "c_call" and getattr(arg, "__self__", None) is sys.modules:
            copies += getattr(arg, "__name__", "") == "copy"

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return copies


BUILTINS: list[Callable[..., Any]] = [
    object.__init__,
    Plain().__init__,  # bound to an instance
    dict.get,
    {}.get,
    sorted,
    math.log,  # no text signature: inspect raises, the same way
    os.getcwd,  # bound to its module
    int.to_bytes,
]


@pytest.mark.parametrize("builtin", BUILTINS, ids=repr)
def test_the_signature_is_inspects_own(
    installed: Callable[..., Any], builtin: Callable[..., Any]
) -> None:
    def answer() -> object:
        try:
            return inspect.signature(builtin)
        except ValueError as error:
            return f"ValueError: {error}"

    wrapped = answer()
    assert answer() == wrapped
    inspect._signature_fromstr = installed  # type: ignore[attr-defined]
    assert answer() == wrapped


def test_sys_modules_is_copied_on_the_first_parse_only(installed: Callable[..., Any]) -> None:
    assert copies_of_sys_modules(lambda: inspect.signature(Plain)) == 1
    assert copies_of_sys_modules(lambda: inspect.signature(Plain)) == 0
    assert copies_of_sys_modules(lambda: inspect.signature(Plain().__init__)) == 1
    assert copies_of_sys_modules(lambda: inspect.signature(Plain().__init__)) == 0


def test_without_the_wrap_every_parse_copies() -> None:
    """What the wrap saves: inspect itself copies sys.modules on every parse."""
    assert copies_of_sys_modules(lambda: inspect.signature(Plain)) == 1
    assert copies_of_sys_modules(lambda: inspect.signature(Plain)) == 1


def test_a_bound_object_is_not_kept_alive(installed: Callable[..., Any]) -> None:
    instance = Plain()
    inspect.signature(instance.__init__)
    gone = weakref.ref(instance)
    del instance
    gc.collect()
    assert gone() is None


def test_a_failed_parse_is_not_kept_and_fails_again(installed: Callable[..., Any]) -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match="invalid signature"):
            inspect._signature_fromstr(inspect.Signature, Plain(), "($self, a=no_such_name)")  # type: ignore[attr-defined]


def test_a_callable_whose_module_cannot_be_read_is_parsed_as_before(
    installed: Callable[..., Any],
) -> None:
    class Odd:
        @property
        def __module__(self) -> str:  # type: ignore[override]
            raise RuntimeError("no module here")

    for parse in (inspect._signature_fromstr, installed):  # type: ignore[attr-defined]
        with pytest.raises(RuntimeError, match="no module here"):
            parse(inspect.Signature, Odd(), "($self, /)")


def test_installed_once_however_often_asked(installed: Callable[..., Any]) -> None:
    wrapped = inspect._signature_fromstr  # type: ignore[attr-defined]
    assert signatures.install()
    assert inspect._signature_fromstr is wrapped  # type: ignore[attr-defined]
    assert wrapped is not installed


def test_without_inspects_parser_nothing_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(inspect, "_signature_fromstr")
    assert not signatures.install()
    assert not hasattr(inspect, "_signature_fromstr")
