"""The real vLLM bugs of docs/findings.toml, as pytest markers for their tests.

``known_bug(ID, ...)`` is a strict expected failure on the releases the registry
lists for that bug, and nothing elsewhere: there the test guards the fixed code like
any other. The registry is the one place that says which release has which bug.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

REGISTRY = Path(__file__).resolve().parents[2] / "docs" / "findings.toml"
FINDINGS: dict[str, dict[str, Any]] = {
    entry["id"]: entry for entry in tomllib.loads(REGISTRY.read_text())["finding"]
}
VLLM_VERSION = version("vllm")


def at_least(release: str) -> bool:
    """Whether the installed vLLM is ``release`` or later (by its major and minor)."""

    def minor(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("+", 1)[0].split(".")[:2])

    return minor(VLLM_VERSION) >= minor(release)


def has_bug(finding_id: str) -> bool:
    """Whether the installed vLLM is one of the releases the registry lists for it."""
    releases = FINDINGS[finding_id]["releases"]
    return VLLM_VERSION.split("+", 1)[0] in releases


def known_bug(finding_id: str, *, raises: Any, reason: str) -> pytest.MarkDecorator:
    entry = FINDINGS[finding_id]
    return pytest.mark.xfail(
        condition=has_bug(finding_id),
        raises=raises,
        strict=True,
        reason=f"vLLM {VLLM_VERSION} has {finding_id} ({entry['doc']}): {reason}",
    )
