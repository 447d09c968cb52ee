"""The warm process's heap frozen as it is built (audit/testproc/heap.py): what survives
a full collection is frozen until the run loop starts, and collected as before after."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from audit.testproc import heap


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The test starts and ends with nothing frozen and no callback of heap's."""
    heap.stop_freezing()
    gc.unfreeze()
    yield
    heap.stop_freezing()
    gc.unfreeze()


def test_what_survives_a_full_collection_is_frozen(unfrozen: None) -> None:
    heap.freeze_while_building()
    survivor = Node()
    gc.collect()
    assert gc.get_freeze_count() > 0
    # frozen: garbage from now on, and no full collection frees it
    gone = weakref.ref(survivor)
    del survivor
    gc.collect()
    assert gone() is not None


def test_a_young_collection_freezes_nothing(unfrozen: None) -> None:
    heap.freeze_while_building()
    gc.collect(0)
    gc.collect(1)
    assert gc.get_freeze_count() == 0


def test_after_the_run_loop_starts_garbage_is_collected_as_before(unfrozen: None) -> None:
    heap.freeze_while_building()
    heap.stop_freezing()
    survivor = Node()
    gc.collect()
    assert gc.get_freeze_count() == 0
    gone = weakref.ref(survivor)
    del survivor
    gc.collect()
    assert gone() is None


def test_installed_once_and_stopped_once(unfrozen: None) -> None:
    before = len(gc.callbacks)
    heap.freeze_while_building()
    heap.freeze_while_building()
    assert len(gc.callbacks) == before + 1
    heap.stop_freezing()
    heap.stop_freezing()
    assert len(gc.callbacks) == before
