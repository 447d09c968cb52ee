"""The warm process's heap, kept out of the collector's full walks while it is built.

Importing vLLM and torch and collecting the suite builds a heap of some 620,000
objects the cyclic collector tracks, and CPython walks all of its oldest generation
each time that generation has grown by a quarter. On vLLM 0.33.0's scheduler tests that
was 11 full collections, 1.5-1.7 s of the 7.0-7.6 s from the test process's start to
its run loop, on the critical path of every audit.

So while the test process imports and collects (from :func:`freeze_while_building` to
:func:`stop_freezing`, as its run loop starts), each full collection ends by freezing
what survived it (``gc.freeze``): it moves to the permanent generation, and the next
full collection walks only what came after. The same run: 14 full collections,
0.25-0.30 s; to the run loop, 5.6-6.0 s.

What is frozen is never collected again: modules, classes, functions and the collected
session, which live as long as the process anyway, and whatever cyclic garbage had
survived a full collection before it became garbage. No test runs under it: the
freezing stops when the run loop starts, so what a test makes is collected as it would
have been (a test that collects and looks at a weak reference sees what it would).
Each fork freezes everything it inherits anyway (:mod:`.judge`). It is the fork
executor's, like the huge pages: mutmut's runs in the benchmark go without it.
"""

from __future__ import annotations

import gc
from typing import Any


def freeze_while_building() -> None:
    """From now on, freeze what survives each full collection (once, however often
    asked), until :func:`stop_freezing`."""
    if _after_collection not in gc.callbacks:
        gc.callbacks.append(_after_collection)


def stop_freezing() -> None:
    """Collect as CPython does again (the run loop starts); nothing if not freezing."""
    if _after_collection in gc.callbacks:
        gc.callbacks.remove(_after_collection)


def _after_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()
