"""Act on a module as it is imported, without importing it ahead of its time.

The test process's plugins (:mod:`.stand_in`, :mod:`.offline_hub`) adjust one thing
each in a library the suite imports: they wait for its module, so a test process that
never imports it pays nothing, and the suite's own import order is left as it was.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` now if ``name`` is imported, else once its import has
    run (once per name and callback, however often this is asked)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    watch = next((f for f in sys.meta_path if isinstance(f, _Watch) and f.name == name), None)
    if watch is None:
        watch = _Watch(name)
        sys.meta_path.insert(0, watch)
    if callback not in watch.callbacks:
        watch.callbacks.append(callback)


class _Watch(importlib.abc.MetaPathFinder):
    """Finds one module as the other finders do, and wraps its loading."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.callbacks: list[Callback] = []

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _Watch) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader: Any = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module
        callbacks = list(self.callbacks)

        def exec_module(module: ModuleType) -> None:
            execute(module)
            for callback in callbacks:
                callback(module)

        loader.exec_module = exec_module  # this spec's own loader object
        return spec
