"""The platform stand-in (audit/testproc/stand_in.py) on a stand-in of vLLM's CPU platform:
asked again only when refused for Triton, with vLLM's flag restored after."""

from __future__ import annotations

import sys
import types

import pytest

from audit.testproc import stand_in


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, refusal: str) -> tuple[types.ModuleType, list]:
    """A module shaped as vLLM's CPU platform whose check refuses with ``refusal``
    while ``vllm.triton_utils.HAS_TRITON`` is false; it records each call's flag."""
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.HAS_TRITON = False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.triton_utils", triton_utils)
    calls: list[tuple[bool, object]] = []

    class CpuPlatform:
        @classmethod
        def check_and_update_config(cls, vllm_config: object) -> None:
            """vLLM's own docstring."""
            calls.append((triton_utils.HAS_TRITON, vllm_config))  # type: ignore[attr-defined]
            if refusal and not triton_utils.HAS_TRITON:  # type: ignore[attr-defined]
                raise RuntimeError(refusal)

    module = types.ModuleType(stand_in.MODULE)
    module.CpuPlatform = CpuPlatform  # type: ignore[attr-defined]
    return module, calls


TRITON = "vLLM on x86 CPUs requires Triton (triton-cpu)."


def _wrapped(monkeypatch: pytest.MonkeyPatch, refusal: str) -> tuple[types.ModuleType, list]:
    module, calls = _fake_vllm(monkeypatch, refusal)
    stand_in.stand_in(module)
    return module, calls


def test_a_refusal_for_triton_alone_is_asked_again_as_a_triton_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, calls = _wrapped(monkeypatch, TRITON)
    module.CpuPlatform.check_and_update_config("config")
    assert calls == [(False, "config"), (True, "config")]
    assert sys.modules["vllm.triton_utils"].HAS_TRITON is False  # restored
    assert module.CpuPlatform.check_and_update_config.__doc__ == "vLLM's own docstring."


def test_a_check_that_does_not_refuse_runs_once_as_vllm_wrote_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, calls = _wrapped(monkeypatch, "")
    module.CpuPlatform.check_and_update_config("config")
    assert calls == [(False, "config")]


def test_any_other_refusal_is_vllms_to_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    module, calls = _wrapped(monkeypatch, "block size 7 is not supported")
    with pytest.raises(RuntimeError, match="block size 7"):
        module.CpuPlatform.check_and_update_config("config")
    assert calls == [(False, "config")]


def test_the_check_is_wrapped_once(monkeypatch: pytest.MonkeyPatch) -> None:
    module, calls = _wrapped(monkeypatch, TRITON)
    stand_in.stand_in(module)
    module.CpuPlatform.check_and_update_config("config")
    assert len(calls) == 2  # one refusal, one retry: not four


def test_installed_before_the_import_it_wraps_the_module_as_it_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pytest.TempPathFactory
) -> None:
    """The watch finds the module as the import system would and wraps it once loaded."""
    root = tmp_path / "pkgs"  # type: ignore[operator]
    platforms = root / "vllm" / "platforms"
    platforms.mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (platforms / "__init__.py").write_text("")
    (root / "vllm" / "triton_utils.py").write_text("HAS_TRITON = False\n")
    (platforms / "cpu.py").write_text(
        "from vllm import triton_utils\n"
        "class CpuPlatform:\n"
        "    @classmethod\n"
        "    def check_and_update_config(cls, vllm_config):\n"
        "        if not triton_utils.HAS_TRITON:\n"
        f"            raise RuntimeError({TRITON!r})\n"
    )
    for name in ("vllm", "vllm.platforms", "vllm.platforms.cpu", "vllm.triton_utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    stand_in.install()
    from vllm.platforms import cpu  # type: ignore[import-not-found]

    cpu.CpuPlatform.check_and_update_config(object())  # no refusal reaches the caller
    for name in ("vllm", "vllm.platforms", "vllm.platforms.cpu", "vllm.triton_utils"):
        sys.modules.pop(name, None)
