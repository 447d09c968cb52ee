"""The hub's answer on a model's safetensors, given offline: no answer, without a wait.

From a ``ModelConfig`` whose config ties its word embeddings (``facebook/opt-125m``,
which vLLM's test utilities build), vLLM asks the hub for the checkpoint's safetensors
metadata (``huggingface_hub.HfApi.get_safetensors_metadata``), to learn whether it
ships an ``lm_head`` of its own. In the hermetic test process the hub is offline
(:mod:`audit.core.hermetic`): huggingface_hub refuses, vLLM takes the refusal for a
transient failure, waits 2 s and asks again (``with_retry``, once per process and
model: the answer is cached), then falls back to the local cache, where the private
HF home holds the model's config.json and no weights, and goes on without an answer.

Offline, asking again cannot help. This plugin makes the hub's refusal the one vLLM
takes as definitive (``NotASafetensorsRepoError``): vLLM goes straight to the same
fallback, which reads the local cache as before, and reaches the same result without
the wait (on vLLM 0.33.0, ``checkpoint_has_lm_head`` is None either way: 0.11 s instead
of 2.15 s). It answers so only while the hub is offline (``HF_HUB_OFFLINE``); online,
the hub is asked as before. Nothing on disk changes.

It is a pytest plugin (``-p audit.testproc.offline_hub``), in every test process the
audit starts and in mutmut's runs of the benchmark, so both executors see the same
vLLM. It imports nothing itself: it waits for huggingface_hub's API module.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from audit.testproc.imports import when_imported

MODULE = "huggingface_hub.hf_api"
METHOD = "get_safetensors_metadata"
_MARK = "_fence_audit_offline_hub"


def pytest_configure(config: pytest.Config) -> None:
    install()


def install() -> None:
    """Answer offline now if huggingface_hub's API is imported, else once it is."""
    when_imported(MODULE, answer_offline)


def answer_offline(module: ModuleType) -> None:
    """Wrap ``module.HfApi.get_safetensors_metadata`` (once)."""
    api = getattr(module, "HfApi", None)
    original = vars(api).get(METHOD) if isinstance(api, type) else None
    if callable(original) and not getattr(original, _MARK, False):
        setattr(api, METHOD, _offline_answer(original))


def _offline_answer(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_safetensors_metadata(self: Any, repo_id: str, *args: Any, **kwargs: Any) -> Any:
        if not _offline():
            return original(self, repo_id, *args, **kwargs)
        errors = importlib.import_module("huggingface_hub.errors")
        raise errors.NotASafetensorsRepoError(
            f"fence-audit: the hub is offline; {repo_id!r}'s safetensors are read from "
            "the local cache only"
        )

    setattr(get_safetensors_metadata, _MARK, True)
    return get_safetensors_metadata


def _offline() -> bool:
    constants = importlib.import_module("huggingface_hub.constants")
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))
