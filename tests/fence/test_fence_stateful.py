"""The random workloads: each state machine of ``fence_machines`` run under the profile
``HYPOTHESIS_PROFILE`` names when the test runs (``fence_profiles``), and the planted
bugs the CI budget finds with them: the catalogue's, and a connector that leaves chunks
unoffered, which only the liveness checks see.

The machines, their draws and the hunt's registry of them: ``fence_machines``; what
they tolerate on each release: ``fence_tolerance``. The programs hunts kept, replayed:
``test_fence_replays.py``; the harness's own checks: ``test_fence_harness_checks.py``.
"""

from __future__ import annotations

import fence_machines
import pytest
from fence_findings import VLLM_VERSION, at_least
from fence_harness import ContentViolation
from fence_machines import (
    PERIODIC_RETENTION,
    FenceMachine,
    PeriodicMachine,
    RemoteWindowMachine,
    SpeculativeMachine,
    WindowMachine,
)
from fence_oracle import (
    FenceViolation,
    ReplayLiveness,
    SegmentLiveness,
    StoreLiveness,
    WindowLiveness,
)
from fence_plant import plant, plant_retention_taken_for_default
from fence_profiles import run_machine
from fence_tolerance import REMOTE_WINDOW
from hypothesis import Phase, settings
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)


def test_random_workloads_keep_every_fence_invariant() -> None:
    run_machine(FenceMachine)


def test_random_workloads_keep_every_fence_invariant_under_periodic_retention() -> None:
    run_machine(PeriodicMachine)


def test_random_workloads_keep_every_fence_invariant_with_speculative_decoding() -> None:
    run_machine(SpeculativeMachine)


def test_random_workloads_in_the_window_layouts() -> None:
    run_machine(WindowMachine)


def test_random_workloads_in_the_window_layouts_under_periodic_retention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """WindowMachine's programs, each under a periodic retention of one or two of its
    coarsest chunks, where SegmentLiveness (L4) holds them (a hunt deals these among
    the others)."""
    monkeypatch.setattr(fence_machines, "WINDOW_RETENTION", PERIODIC_RETENTION)
    run_machine(WindowMachine)


@pytest.mark.skipif(
    not REMOTE_WINDOW,
    reason=f"vLLM {VLLM_VERSION}: a known bug stops every program of this machine "
    "(docs/findings.toml: reachable-null-block-chunk-stored or multiconnector-allocation-unseen)",
)
def test_random_workloads_with_an_external_load_past_the_window() -> None:
    run_machine(RemoteWindowMachine)


def _ci_unshrunk() -> settings:
    """The CI profile's examples, its first failure reported unshrunk."""
    ci = settings.get_profile("ci")
    return settings(ci, phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False)


def test_random_workloads_find_a_planted_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI budget is enough to find a real fence bug: request_finished forgets to
    fence a finished request's in-flight stores (M-A3). Same examples and program
    length as the CI profile; only the shrinking of the failure is skipped."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "request_finished",
        "self._block_id_to_pending_jobs.setdefault(bid, set()).add(job_id)",
        "pass",
    )
    with pytest.raises((FenceViolation, ContentViolation)) as caught:
        run_machine(FenceMachine, _ci_unshrunk())
    assert "I7 registered iff finished" in str(caught.value) or "overwritten" in str(caught.value)


@pytest.mark.parametrize(
    ("old", "new", "invariants", "machine"),
    [
        # stores nothing: no safety invariant breaks (nothing is stored, so nothing is
        # loaded or read stale)
        pytest.param(
            "new_offload_keys.append(offload_key)",
            "pass",
            (StoreLiveness.INVARIANT, WindowLiveness.INVARIANT, ReplayLiveness.INVARIANT),
            "FenceMachine",
            id="stores-nothing",
        ),
        # mutmut's == 0 -> == 1 in the chunk loop: every chunk whose last block is GPU
        # block 1, the first the pool hands out, is skipped; a later request with the
        # same prefix offers its key from another block, so "offered by anyone" would
        # pass, and L1 wants the request's own offer or an earlier one (SpeculativeMachine:
        # on 0.28.0-0.32.0 FenceMachine's first program to fail now breaks L2 instead)
        pytest.param(
            "if block_id == 0:\n                    continue\n",
            "if block_id == 1:\n                    continue\n",
            (StoreLiveness.INVARIANT,),
            "SpeculativeMachine",
            id="skips-block-1-offered-later",
        ),
        # mutmut's continue -> break there: a null last block (a sliding-window group's
        # block before a hit's window) ends the loop, and the group's later chunks,
        # the ones the request computed, are never offered; only L2 sees it, in the
        # programs of the machine that keeps to its layouts
        pytest.param(
            "if block_id == 0:\n                    continue\n",
            "if block_id == 0:\n                    break\n",
            (WindowLiveness.INVARIANT,),
            "WindowMachine",
            id="window-chunks-after-a-null-one",
        ),
        # under vLLM's default retention, the mask keeps no replay boundary: no
        # sliding-window chunk is reachable, and none is stored (vLLM 0.30.0 on; before,
        # the connector stored by an older rule with no boundaries); only L3 sees it
        pytest.param(
            "reachable_boundaries = (req.num_prompt_tokens - 1,)",
            "reachable_boundaries = ()",
            (ReplayLiveness.INVARIANT,),
            "FenceMachine",
            id="no-replay-boundary",
            marks=pytest.mark.skipif(
                not at_least("0.30.0"),
                reason=f"vLLM {VLLM_VERSION}: the connector keeps no replay boundary",
            ),
        ),
    ],
)
def test_random_workloads_see_a_connector_that_skips_stores(
    monkeypatch: pytest.MonkeyPatch,
    old: str,
    new: str,
    invariants: tuple[str, ...],
    machine: str,
) -> None:
    """Liveness: the random workloads see a connector that leaves chunks unoffered to
    the tier, through StoreLiveness (L1), WindowLiveness (L2) or ReplayLiveness (L3).
    Same examples as the CI profile, without shrinking."""
    plant(monkeypatch, OffloadingConnectorScheduler, "_build_store_jobs", old, new)
    with pytest.raises(FenceViolation) as caught:
        run_machine(getattr(fence_machines, machine), _ci_unshrunk())
    assert any(invariant in str(caught.value) for invariant in invariants)


@pytest.mark.skipif(
    not at_least("0.30.0"), reason=f"vLLM {VLLM_VERSION}: the connector reads no retention"
)
def test_random_workloads_under_periodic_retention_see_segment_chunks_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that takes a periodic retention for the default one: WindowMachine's
    programs under periodic retention see it, through SegmentLiveness (L4). Same
    examples as the CI profile, without shrinking."""
    plant_retention_taken_for_default(monkeypatch)
    monkeypatch.setattr(fence_machines, "WINDOW_RETENTION", PERIODIC_RETENTION)
    with pytest.raises(FenceViolation) as caught:
        run_machine(WindowMachine, _ci_unshrunk())
    assert SegmentLiveness.INVARIANT in str(caught.value)


@pytest.mark.skipif(not REMOTE_WINDOW, reason="RemoteWindowMachine does not run on this release")
def test_random_workloads_find_a_chunk_stored_with_a_reachable_null_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CI budget finds the catalogue's sliding-window-no-reachable-null-skip, which
    FenceMachine's programs left alive: the store offers the tier a chunk whose
    reachable block is null, and a later hit loads that block unwritten. Same examples
    as the CI profile, without shrinking."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "_build_store_jobs",
        "group_state.block_ids[chunk_start + b] == 0",
        "False",
    )
    with pytest.raises(ContentViolation) as caught:
        run_machine(RemoteWindowMachine, _ci_unshrunk())
    assert "brings" in str(caught.value)


def test_random_workloads_find_a_non_writer_rank_that_never_acknowledges_a_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CI budget reaches the one fence bug on the worker's side of the catalogue
    (worker-non-writer-never-acks): rank 1 of a replicated layout drops a store it is
    told to flush in the step that created it, without acknowledging it, so the job
    never completes and the fence keeps its blocks. That needs the replicated layout
    and a same-step flush in one program. SpeculativeMachine's programs meet it
    (FenceMachine's met it in an EAGLE program, until EAGLE programs got the drafter's
    speculative config, which changed that program). Same examples as the CI profile,
    without shrinking."""
    plant(
        monkeypatch,
        OffloadingConnectorWorker,
        "handle_preemptions",
        "self._connector_worker_meta.mark_completed(job_id)\n",
        "pass\n",
    )
    with pytest.raises(AssertionError, match="did not drain"):
        run_machine(SpeculativeMachine, _ci_unshrunk())
