"""The platform stand-in: vLLM's check for a model runner's kernels, answered for a host
that has them.

From 0.34.0 on, vLLM's CPU platform refuses any configuration on an x86 CPU without
Triton ("vLLM on x86 CPUs requires Triton (triton-cpu)"): its model runner needs
Triton's kernels there. Nothing the audit runs has a model runner (the GPU worker is
the tests' fake, as in vLLM's own tests), and the generic wheel on PyPI cannot see a
triton-cpu build anyway (vLLM accepts one only in its own ``+cpu`` builds). So when
that check refuses for that reason alone, it is asked again with vLLM's flag saying
Triton is there; everything else the check does (block sizes, cache settings) runs as
vLLM wrote it. A release whose check does not refuse is left alone. Nothing on disk
changes.

It is a pytest plugin (``-p audit.testproc.stand_in``, in every test process the
audit starts) and :func:`install` (this project's fence suite run directly, the hunt).
It imports nothing of vLLM's itself: it waits for vLLM's CPU platform module to be
imported, so a test process that never imports vLLM pays nothing.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from audit.testproc.imports import when_imported

MODULE = "vllm.platforms.cpu"
REFUSAL = "requires Triton"  # in the message of the RuntimeError vLLM raises
FLAG = "HAS_TRITON"  # vllm.triton_utils' answer, read by the check when it runs
_MARK = "_fence_audit_stand_in"


def pytest_configure(config: pytest.Config) -> None:
    install()


def install() -> None:
    """Stand in for the check now if vLLM's CPU platform is imported, else once it is."""
    when_imported(MODULE, stand_in)


def stand_in(module: ModuleType) -> None:
    """Wrap ``module.CpuPlatform.check_and_update_config`` (once)."""
    platform = getattr(module, "CpuPlatform", None)
    check = vars(platform).get("check_and_update_config") if platform is not None else None
    original = getattr(check, "__func__", None)
    if original is None or getattr(original, _MARK, False):
        return

    def check_and_update_config(cls: type, vllm_config: object) -> None:
        try:
            original(cls, vllm_config)
            return
        except RuntimeError as error:
            if REFUSAL not in str(error):
                raise
        # Refused for Triton alone, before the check changed anything: ask again.
        triton_utils = importlib.import_module("vllm.triton_utils")
        saved = getattr(triton_utils, FLAG)
        setattr(triton_utils, FLAG, True)
        try:
            original(cls, vllm_config)
        finally:
            setattr(triton_utils, FLAG, saved)

    setattr(check_and_update_config, _MARK, True)
    check_and_update_config.__doc__ = original.__doc__
    assert platform is not None
    platform.check_and_update_config = classmethod(check_and_update_config)
