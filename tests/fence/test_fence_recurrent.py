"""Partial-tail and aligned-boundary stores (Mamba "align" groups): fenced at creation.

These stores read copy-on-write hand-off blocks that belong to no request's table,
so they are fenced when created (A4, A5) and leave the fence when they complete.
The harness's engine has no Mamba model runner, so this is the unit layer (fence
brief §13): the real ``OffloadingConnectorScheduler`` over a full-attention plus
Mamba "align" layout, fed scheduler outputs that carry boundary-state hand-offs
(``fence_recurrent``), and RecurrentMachine's random workloads over it.
"""

from __future__ import annotations

import pytest
from fence_oracle import FenceViolation, check_state
from fence_plant import plant
from fence_profiles import run_machine
from fence_recurrent import (
    BLOCK,
    HAS_BOUNDARY_STORES,
    RecurrentMachine,
    _hand_offs,
    recurrent_scheduler,
)
from hypothesis import Phase, settings
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy, get_request_block_hasher
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request


class Recurrent:
    """The connector's scheduler side, one request, and a step counter."""

    def __init__(self) -> None:
        self.sched = recurrent_scheduler()
        request = Request(
            request_id="req",
            prompt_token_ids=list(range(30)),
            sampling_params=SamplingParams(max_tokens=4, ignore_eos=True),
            pooling_params=None,
            block_hasher=get_request_block_hasher(4, sha256),
        )
        self.sched.on_new_request(request)
        state = self.sched._req_status["req"]
        state.group_states[0].block_ids[:] = [11, 12]  # full attention: its table
        state.group_states[1].block_ids[:] = [0, 21]  # Mamba: only the running state
        self.step = 0

    def check(self) -> None:
        self.step += 1
        found = check_state(self.sched, self.step)
        if found:
            raise FenceViolation(found)

    def hand_off(self, block_id: int, tokens: int) -> int:
        """A step whose scheduler hands off the Mamba state at ``tokens`` in
        ``block_id``; returns the store job it creates."""
        output = _hand_offs({"req": [(1, block_id, tokens)]})
        meta = self.sched.build_connector_meta(output)
        self.check()
        (job,) = meta.store_jobs
        return job

    def complete(self, job: int) -> None:
        meta = OffloadingWorkerMetadata(completed_jobs={job: 1})
        self.sched.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=meta))
        self.check()


def test_a_partial_tail_store_stays_fenced_until_it_completes() -> None:
    """A partial-tail store alone (every release since 0.28.0 has them): it fences
    the attention block and the copy-on-write block it reads, and its completion
    removes both (M-A7)."""
    r = Recurrent()
    tail = r.hand_off(99, 28)
    assert r.sched._block_id_to_pending_jobs == {12: {tail}, 99: {tail}}
    assert r.sched._jobs[tail].is_store
    r.complete(tail)
    assert r.sched._block_id_to_pending_jobs == {}
    assert not r.sched._jobs


@pytest.mark.skipif(
    not HAS_BOUNDARY_STORES,
    reason="this vLLM has no aligned-boundary stores (_build_aligned_boundary_store_jobs, "
    "vLLM 0.29.0 on): a hand-off on a block boundary stores nothing",
)
@pytest.mark.parametrize("first", ["partial tail", "boundary"])
def test_hand_off_stores_stay_fenced_until_they_complete(first: str) -> None:
    """Each hand-off store fences exactly its source blocks, and its completion
    removes exactly those, whichever completes first (M-A7; a store registered as a
    load, or with its source list dropped, leaves entries behind)."""
    r = Recurrent()
    tail = r.hand_off(99, 28)  # mid-block: a partial tail (attention block 12, CoW 99)
    boundary = r.hand_off(98, 16)  # on a block boundary: the aligned-boundary store
    assert r.sched._block_id_to_pending_jobs == {12: {tail}, 99: {tail}, 98: {boundary}}
    assert r.sched._jobs[tail].is_store
    assert r.sched._jobs[boundary].is_store

    order = [tail, boundary] if first == "partial tail" else [boundary, tail]
    r.complete(order[0])
    remaining = {98: {boundary}} if order[0] == tail else {12: {tail}, 99: {tail}}
    assert r.sched._block_id_to_pending_jobs == remaining
    r.complete(order[1])
    assert r.sched._block_id_to_pending_jobs == {}
    assert not r.sched._jobs


@pytest.mark.skipif(
    not HAS_BOUNDARY_STORES,
    reason="this vLLM does not collect block copies (kv_cache_block_copies, vLLM 0.29.0 on)",
)
def test_a_copy_on_write_destination_is_not_stored_as_a_window_block() -> None:
    """A block copy's destination is a fresh block: a sliding-window position that
    still names it must not be stored from it once the copy has written it. (On
    vLLM with the upstream series, docs/upstream/, this kills the
    `_update_req_states` mutant that leaves copy destinations out of the step's
    fresh blocks: the prefix-hit fix zeroes only fresh ids.)

    A hybrid layout: full attention, Mamba "align" and a one-block sliding window.
    The request has computed 60 of its 64 prompt tokens and this step computes the
    last 4. Its window has moved past block index 2 (tokens 32-47), so the manager
    freed that block (33) and, in the same step, makes it the destination of a
    copy-on-write copy of the Mamba state. The connector's copy of the window table
    still names 33 at index 2. A store of index 2 may read 33 only if the worker
    runs it before this step's copy and forward pass, that is, if it is flushed;
    otherwise it stores the copied Mamba state as that position's KV.
    """
    sched = recurrent_scheduler(window_blocks=1)
    request = Request(
        request_id="req",
        prompt_token_ids=list(range(64)),
        sampling_params=SamplingParams(max_tokens=4, ignore_eos=True),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )
    sched.on_new_request(request)
    state = sched._req_status["req"]
    state.group_states[0].block_ids[:] = [11, 12, 13, 14]
    state.group_states[1].block_ids[:] = [0, 0, 0, 21]  # Mamba: the running state
    state.group_states[2].block_ids[:] = [31, 32, 33, 34]
    request.num_computed_tokens = 60
    output = SchedulerOutput.make_empty()
    output.num_scheduled_tokens = {"req": 4}
    output.total_num_scheduled_tokens = 4
    output.scheduled_cached_reqs.req_ids = ["req"]
    output.scheduled_cached_reqs.new_block_ids = [None]
    output.kv_cache_block_copies = [KVCacheBlockCopy(21, 33)]
    meta = sched.build_connector_meta(output)
    found = check_state(sched, 1)
    if found:
        raise FenceViolation(found)
    unflushed = [
        job_id
        for job_id, job in meta.store_jobs.items()
        if 33 in job.src_spec.block_ids.tolist() and job_id not in meta.jobs_to_flush
    ]
    assert not unflushed, (
        f"store jobs {unflushed} read block 33 for the request's sliding-window block "
        "index 2 after the manager made 33 this step's copy destination, and are not "
        "flushed: they would store the copied Mamba state as that position's KV"
    )


def test_random_recurrent_workloads_keep_every_fence_invariant() -> None:
    run_machine(RecurrentMachine)


def plant_uncollected_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """For this test only: the step's block copies are left out of its allocations
    (catalogue: flush-no-cow-collection), a bug only a Mamba layout reaches."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "_update_req_states",
        "for copy in scheduler_output.kv_cache_block_copies or ():",
        "for copy in ():",
    )


@pytest.mark.skipif(
    not HAS_BOUNDARY_STORES,
    reason="this vLLM does not collect block copies (kv_cache_block_copies, vLLM 0.29.0 on)",
)
def test_random_recurrent_workloads_find_a_planted_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI budget finds a copy-on-write copy written over a block a store still
    reads (plant_uncollected_copies). Same programs as the ci profile, without
    shrinking."""
    plant_uncollected_copies(monkeypatch)
    budget = settings(
        settings.get_profile("ci"),
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
    )
    with pytest.raises((FenceViolation, AssertionError)) as caught:
        run_machine(RecurrentMachine, budget)
    assert "flush on reuse" in str(caught.value) or "did not drain" in str(caught.value)
