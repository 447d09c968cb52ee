"""The offline hub's answer (audit/testproc/offline_hub.py) on huggingface_hub's own
HfApi: definitive while the hub is offline, the hub's own call otherwise."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import NotASafetensorsRepoError

from audit.testproc import offline_hub

REPO = "facebook/opt-125m"


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """HfApi's method replaced by one that records each repo asked (restored after)."""
    calls: list[str] = []

    def get_safetensors_metadata(self: HfApi, repo_id: str, **kwargs: object) -> str:
        calls.append(repo_id)
        return "the hub's answer"

    monkeypatch.setattr(HfApi, offline_hub.METHOD, get_safetensors_metadata)
    return calls


def test_offline_the_answer_is_definitive_and_the_hub_is_not_asked(
    monkeypatch: pytest.MonkeyPatch, asked: list[str]
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    offline_hub.answer_offline(sys.modules[offline_hub.MODULE])
    with pytest.raises(NotASafetensorsRepoError, match="read from the local cache only"):
        HfApi().get_safetensors_metadata(REPO)
    assert asked == []


def test_online_the_hub_is_asked(monkeypatch: pytest.MonkeyPatch, asked: list[str]) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    offline_hub.answer_offline(sys.modules[offline_hub.MODULE])
    assert HfApi().get_safetensors_metadata(REPO, revision="main") == "the hub's answer"
    assert asked == [REPO]


def test_wrapped_once_however_often_installed(
    monkeypatch: pytest.MonkeyPatch, asked: list[str]
) -> None:
    module = sys.modules[offline_hub.MODULE]
    offline_hub.answer_offline(module)
    wrapped = vars(HfApi)[offline_hub.METHOD]
    offline_hub.install()  # the module is imported: at once, and no second wrapper
    assert vars(HfApi)[offline_hub.METHOD] is wrapped
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    HfApi().get_safetensors_metadata(REPO)
    assert asked == [REPO]


def test_without_it_the_offline_hub_refuses_with_a_connection_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the plugin is for: huggingface_hub's own refusal, a connection error, is
    one vLLM takes for transient (it waits 2 s and asks again)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    original = vars(HfApi)[offline_hub.METHOD]
    monkeypatch.setattr(HfApi, offline_hub.METHOD, getattr(original, "__wrapped__", original))
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="offline"):
        HfApi().get_safetensors_metadata(REPO)
    assert time.monotonic() - started < 5  # refused offline, not after a network timeout


def test_installed_before_the_import_it_wraps_the_api_as_it_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, asked: list[str]
) -> None:
    """A stand-in package whose ``hf_api`` module defines ``HfApi``: imported after
    ``install``, it comes out wrapped."""
    package = tmp_path / "huggingface_hub"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hf_api.py").write_text(
        "class HfApi:\n"
        "    def get_safetensors_metadata(self, repo_id, **kwargs):\n"
        "        return 'asked ' + repo_id\n"
    )
    for name in ("huggingface_hub", offline_hub.MODULE):
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    offline_hub.install()
    fake = types.SimpleNamespace(HF_HUB_OFFLINE=False)
    monkeypatch.setitem(sys.modules, "huggingface_hub.constants", fake)
    from huggingface_hub.hf_api import HfApi as Loaded  # the stand-in's

    assert getattr(vars(Loaded)[offline_hub.METHOD], offline_hub._MARK)
    assert Loaded().get_safetensors_metadata(REPO) == f"asked {REPO}"
    fake.HF_HUB_OFFLINE = True
    with pytest.raises(NotASafetensorsRepoError):
        Loaded().get_safetensors_metadata(REPO)
