"""This project's fence suite: the real vLLM scheduler and connector, a fake worker.

vLLM's config objects read ``facebook/opt-125m``'s ``config.json`` from the Hugging
Face hub. Run by the audit, the suite already has an offline, private HF home; run
directly (``nox -s tests``, ``pytest tests/fence``), it gets one here, before vLLM
is imported, in pytest's cache folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from audit.testproc import offline_hub, stand_in

if os.environ.get("HF_HUB_OFFLINE") != "1":
    from audit.core.hermetic import child_environment, prepare_hf_home

    _cache = Path(__file__).resolve().parents[2] / ".pytest_cache" / "fence-audit"
    os.environ.update(
        child_environment(os.environ, prepare_hf_home(_cache, ("facebook/opt-125m",)))
    )

sys.path.insert(0, str(Path(__file__).parent))

# vLLM 0.34.0 refuses an x86 CPU without Triton; nothing here runs a model. And the
# offline hub's answer on safetensors, without vLLM's 2 s retry. (Run by the audit, its
# test process has both already.)
stand_in.install()
offline_hub.install()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/fence/" in item.nodeid:
            item.add_marker(pytest.mark.vllm)
