"""Hermetic test runs: no network, no user Hugging Face cache, a fixed vLLM platform.

vLLM's test utilities build ``ModelConfig(model="facebook/opt-125m")``, which asks
the Hugging Face hub for ``config.json``. The audit answers that offline from a
private HF home in its cache, seeded with nothing but that file (no weights, no
tokenizer), and the test process runs with every hub switched to offline mode
and outgoing connections refused (:func:`audit.testproc.isolation.block_network`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from audit.core.errors import ConfigError

# A fixed, obviously synthetic revision: the snapshot is ours, not the hub's.
REVISION = "0" * 40

# Variables that could point the child at the user's own caches or credentials.
_DROPPED = (
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TRANSFORMERS_CACHE",
    "HF_DATASETS_CACHE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_ENDPOINT",
    "VLLM_CACHE_ROOT",
    "VLLM_CONFIG_ROOT",
)


def prepare_hf_home(cache_dir: Path, models: tuple[str, ...]) -> Path:
    """A Hugging Face home holding only the config.json of each model in ``models``."""
    home = cache_dir / "hf-home"
    for model in models:
        config = _model_config(model)
        repo = home / "hub" / f"models--{model.replace('/', '--')}"
        snapshot = repo / "snapshots" / REVISION / "config.json"
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        if not snapshot.is_file() or snapshot.read_text() != text:
            snapshot.write_text(text)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
    return home


def child_environment(base: Mapping[str, str], hf_home: Path) -> dict[str, str]:
    """The environment of a test process: offline, CPU platform, private HF home.

    vLLM's own cache and config roots (``~/.cache/vllm``, ``~/.config/vllm`` by
    default) move beside the private HF home, so nothing is written under the
    user's home.
    """
    env = {k: v for k, v in base.items() if k not in _DROPPED}
    env.update(
        {
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HOME": str(hf_home),
            "VLLM_CACHE_ROOT": str(hf_home.parent / "vllm-home" / "cache"),
            "VLLM_CONFIG_ROOT": str(hf_home.parent / "vllm-home" / "config"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # Neither the installed vLLM nor a checkout gets __pycache__ written into it.
            "PYTHONDONTWRITEBYTECODE": "1",
            # One compute thread: the executor forks the warm test process, and a fork
            # after torch (OpenMP, MKL) started its thread pool can deadlock the child
            # in C code, beyond any signal (vLLM's test_worker.py does tensor work).
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            # One string hash seed: vLLM iterates sets of request ids (a step's
            # preempted_req_ids, say) in hash order, and a mutant that only matters in
            # some orders would be killed in one run and survive a resumed one.
            "PYTHONHASHSEED": "0",
        }
    )
    return env


def check_offline_models(models: tuple[str, ...]) -> None:
    """Every model has its offline config.json: checked before anything runs."""
    for model in models:
        _model_config(model)


def _model_config(model: str) -> dict[str, Any]:
    name = f"data/hf/{model.replace('/', '--')}.json"
    resource = resources.files("audit").joinpath(name)
    if not resource.is_file():
        known = sorted(
            p.name.removesuffix(".json").replace("--", "/")
            for p in resources.files("audit").joinpath("data/hf").iterdir()
        )
        raise ConfigError(
            f"no offline config for Hugging Face model {model!r}",
            details={
                "known": ", ".join(known),
                "next": f"add audit/{name} (its config.json only) or drop it from "
                "[tool.fence-audit.suite] offline-models",
            },
        )
    data: dict[str, Any] = json.loads(resource.read_text(encoding="utf-8"))
    return data
