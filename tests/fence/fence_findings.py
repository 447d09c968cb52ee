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

from audit.setup.findings import fixed_findings

REGISTRY = Path(__file__).resolve().parents[2] / "docs" / "findings.toml"
FINDINGS: dict[str, dict[str, Any]] = {
    entry["id"]: entry for entry in tomllib.loads(REGISTRY.read_text())["finding"]
}
VLLM_VERSION = version("vllm")
# Findings whose fix the vLLM under test carries although its release has the bug: set
# by the upstream checks, which run this suite on a release with vLLM patched
# (docs/upstream/; $FENCE_AUDIT_FIXED_FINDINGS, read as the audit reads it).
FIXED = fixed_findings()


def at_least(release: str) -> bool:
    """Whether the installed vLLM is ``release`` or later (by its major and minor)."""

    def minor(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("+", 1)[0].split(".")[:2])

    return minor(VLLM_VERSION) >= minor(release)


def has_bug(finding_id: str) -> bool:
    """Whether the vLLM under test has it: its release is one the registry lists for
    it, and no fix of it is applied (``$FENCE_AUDIT_FIXED_FINDINGS``)."""
    if finding_id in FIXED:
        return False
    releases = FINDINGS[finding_id]["releases"]
    return VLLM_VERSION.split("+", 1)[0] in releases


def fixed(finding_id: str) -> bool:
    """Whether the vLLM under test carries a fix of it: its release is one the registry
    lists for it (so it has the bug as released), and the fix is applied
    (``$FENCE_AUDIT_FIXED_FINDINGS``, docs/upstream/). The checks that encode that
    release's own rule (where a fix changes it on purpose) follow the fixed rule only
    then; on any release as released this is False."""
    releases = FINDINGS[finding_id]["releases"]
    return finding_id in FIXED and VLLM_VERSION.split("+", 1)[0] in releases


def known_bug(finding_id: str, *, raises: Any, reason: str) -> pytest.MarkDecorator:
    entry = FINDINGS[finding_id]
    return pytest.mark.xfail(
        condition=has_bug(finding_id),
        raises=raises,
        strict=True,
        reason=f"vLLM {VLLM_VERSION} has {finding_id} ({entry['doc']}): {reason}",
    )
