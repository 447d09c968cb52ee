"""Serve chosen modules from other files, in place of the installed ones.

Used in the test process only: with ``--vllm-src`` the audited module is loaded
from the checkout while the rest of vLLM comes from the installed package (and,
in the mutation stage, a mutated copy is served the same way). Nothing on disk
is modified; only the import is redirected.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType


class OverlayFinder(importlib.abc.MetaPathFinder):
    def __init__(self, files: Mapping[str, Path]) -> None:
        self.files = dict(files)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        if file.name == "__init__.py":  # a package: its submodules are searched beside it
            return importlib.util.spec_from_file_location(
                fullname, file, submodule_search_locations=[str(file.parent)]
            )
        return importlib.util.spec_from_file_location(fullname, file)


def install(files: Mapping[str, Path]) -> OverlayFinder:
    """Put an overlay first on ``sys.meta_path``; call before the modules are imported."""
    already = [name for name in files if name in sys.modules]
    if already:
        raise RuntimeError(f"overlay installed after {already[0]} was imported")
    finder = OverlayFinder(files)
    sys.meta_path.insert(0, finder)
    return finder
