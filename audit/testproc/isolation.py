"""What the test process does before vLLM is imported: the overlay and the network guard.

The overlay serves chosen modules from other files in place of the installed ones:
with ``--vllm-src`` the audited module comes from the checkout while the rest of
vLLM is the installed package; the benchmark's fresh process per mutant serves a
mutated copy the same way. Nothing on disk is modified; only the import is
redirected. (The audit's own mutants never go through it: they swap a function's
code in the live process, :mod:`audit.testproc.codeswap`.)
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import importlib.util
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


class StartOnImport(importlib.abc.MetaPathFinder):
    """Calls ``start`` once, as ``module`` is about to be imported, and finds nothing:
    the finders after it import the module as they would have.

    The baseline's coverage starts so: its tracer would otherwise see every call of
    the thousands of modules vLLM and torch import before the measured one (on
    vLLM 0.33.0, 9.0 s of import against 6.4 s untraced), while the measured
    module's own import still runs traced.
    """

    def __init__(self, module: str, start: Callable[[], object]) -> None:
        self.module = module
        self.start = start
        self.started = False

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == self.module:
            self.now()
        return None

    def now(self) -> None:
        """Start, if not yet started."""
        if not self.started:
            self.started = True
            self.start()

    def remove(self) -> None:
        """Start if nothing started it, and step out of the imports (not from inside
        one: the import system iterates ``sys.meta_path`` while it calls us)."""
        self.now()
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def start_on_import(module: str, start: Callable[[], object]) -> StartOnImport:
    """Call ``start`` as ``module`` is imported: at once if it already is, or if
    ``module`` is empty."""
    finder = StartOnImport(module, start)
    if not module or module in sys.modules:
        finder.now()
    else:
        sys.meta_path.insert(0, finder)
    return finder


def install_overlay(files: Mapping[str, Path]) -> OverlayFinder:
    """Put an overlay first on ``sys.meta_path``; call before the modules are imported."""
    already = [name for name in files if name in sys.modules]
    if already:
        raise RuntimeError(f"overlay installed after {already[0]} was imported")
    finder = OverlayFinder(files)
    sys.meta_path.insert(0, finder)
    return finder


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so that a killed audit
    (SIGKILL leaves no chance to clean up) leaves no test process or fork behind.
    Elsewhere a no-op: orphans then finish and write only complete verdicts."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return


class NetworkBlocked(OSError):
    """Raised in the test process when code tries to open a network connection."""


def block_network() -> None:
    """Refuse every outgoing connection except Unix sockets and loopback."""
    original_connect = socket.socket.connect
    original_connect_ex = socket.socket.connect_ex

    def check(sock: Any, address: Any) -> None:
        if sock.family != socket.AF_UNIX and not _is_loopback(address):
            raise NetworkBlocked(
                f"fence-audit: network access is blocked during the audit (connect to {address!r})"
            )

    def connect(sock: Any, address: Any) -> None:
        check(sock, address)
        original_connect(sock, address)

    def connect_ex(sock: Any, address: Any) -> int:
        check(sock, address)
        return original_connect_ex(sock, address)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]


def _is_loopback(address: Any) -> bool:
    host = address[0] if isinstance(address, tuple) else address
    return host in ("localhost", "127.0.0.1", "::1") or str(host).startswith("127.")
