"""The fault-injection suite: one test per bad input or fault a careless or hostile
user can cause (issue 13), each ending in one line, the README's exit code, and
nothing lost. Tests that need the real vLLM are marked ``vllm``."""

from __future__ import annotations

import sys
from pathlib import Path

# fence_helpers (run the CLI, a private cache holding vLLM's tests) is shared with
# tests/vllm, the toy target's harness with tests/integration.
sys.path.insert(0, str(Path(__file__).parents[1] / "vllm"))
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
