"""Whether a test file of the series reads as vLLM's own: its two SPDX lines, the
``cpu_test`` mark vLLM's CPU job selects, no import of fence-audit, and vLLM's ruff
configuration (its lint rules and its formatter) clean."""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Sequence
from pathlib import Path

SPDX = (
    "# SPDX-License-Identifier: Apache-2.0",
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
)
# top-level modules of this project (and of its fence suite) a vLLM test must not import
OURS = ("audit", "fence_", "vllm_oracle_plugin")


def problems(path: Path) -> list[str]:
    """What keeps ``path`` from reading as one of vLLM's test files; none when it does."""
    text = path.read_text(encoding="utf-8")
    found = []
    if tuple(text.splitlines()[:2]) != SPDX:
        found.append("does not start with vLLM's two SPDX lines")
    tree = ast.parse(text, filename=str(path))
    if "pytest.mark.cpu_test" not in ast.unparse(tree):
        found.append("carries no pytest.mark.cpu_test (vLLM's CPU job selects by it)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name == "audit" or name.startswith(("audit.", *OURS[1:])):
                found.append(
                    f"imports {name}, which is fence-audit's, not vLLM's (line {node.lineno})"
                )
    return found


def ruff_problems(ruff: str, tree: Path, files: Sequence[str]) -> list[str]:
    """vLLM's ruff configuration (the tree's ``pyproject.toml``) on ``files`` (paths
    from the tree's root): lint, then the formatter's check. The tree holds ``vllm/``
    and ``tests/`` as vLLM's checkout does, so ruff sorts imports as it does there."""
    found = []
    for command in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        done = subprocess.run(
            [ruff, *command, *files], cwd=tree, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            lines = [line for line in done.stdout.splitlines() if line.strip()]
            found.append(f"ruff {command[0]}: " + (lines[0] if lines else done.stderr.strip()))
    return found
