"""How the baseline deals its tests to the test process and its forks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.testproc.baseline import deal, unwarmed


@dataclass(frozen=True)
class Item:
    nodeid: str


def ids(parts: list[list[Any]]) -> list[list[str]]:
    return [[item.nodeid for item in part] for part in parts]


ITEMS: list[Any] = [Item(f"t.py::f[{i}]") for i in range(5)] + [Item("t.py::g"), Item("u.py::h")]


def test_without_costs_the_tests_are_dealt_in_turn() -> None:
    assert ids(deal(ITEMS, 2)) == [
        ["t.py::f[0]", "t.py::f[2]", "t.py::f[4]", "u.py::h"],
        ["t.py::f[1]", "t.py::f[3]", "t.py::g"],
    ]
    assert ids(deal(ITEMS, 1)) == [[item.nodeid for item in ITEMS]]
    assert len(deal(ITEMS[:2], 4)) == 2  # never a process without a test


def test_a_function_only_forks_ran_is_warmed_once() -> None:
    mine, theirs = deal(ITEMS, 2)
    assert [item.nodeid for item in unwarmed(mine, [theirs])] == ["t.py::g"]
