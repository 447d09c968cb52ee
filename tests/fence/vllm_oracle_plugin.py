"""A pytest plugin: vLLM's own offloading tests, with the fence oracle after every step.

vLLM's ``RequestRunner._run`` (``tests/v1/kv_connector/unit/offloading_connector/
utils.py``) takes a ``post_step_fn`` that it calls after each step's
``update_from_output()``. This plugin wraps ``_run`` so that every run also checks
:func:`fence_oracle.check_state` there, after the test's own ``post_step_fn``; no vLLM
test is edited. Load it with ``-p vllm_oracle_plugin`` (``tests/fence`` on the path).

Only the state-level invariants apply (I1 a/b, I5-I10): vLLM's runner does not say
what each ``schedule()`` handed out, which the step-level checks need.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

import pytest
from fence_oracle import FenceViolation, check_state

RUNNER_MODULE = "tests.v1.kv_connector.unit.offloading_connector.utils"


def pytest_collection_finish(session: pytest.Session) -> None:
    utils = sys.modules.get(RUNNER_MODULE)
    runner = getattr(utils, "RequestRunner", None)
    if runner is None or getattr(runner._run, "fence_oracle", False):
        return
    original = runner._run

    def _run(
        self: Any,
        decoded_tokens: list[int],
        complete_transfers: bool,
        post_step_fn: Callable[[], None] | None = None,
    ) -> None:
        steps = itertools.count(1)

        def checked() -> None:
            if post_step_fn is not None:
                post_step_fn()
            found = check_state(self.connector_scheduler, next(steps))
            if found:
                raise FenceViolation(found)

        original(self, decoded_tokens, complete_transfers, post_step_fn=checked)

    _run.fence_oracle = True  # type: ignore[attr-defined]
    runner._run = _run
