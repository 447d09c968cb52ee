"""Targeted fence scenarios: each names the bug it is there to catch.

Every engine here runs the oracle after every step and checks block contents, so a
scenario fails on the first broken invariant even before its own assertions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from fence_findings import known_bug
from fence_harness import ContentViolation, FenceEngine, Plan
from fence_oracle import FenceOracle, FenceViolation, check_state

BOTH = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def engine(**options: Any) -> FenceEngine:
    return FenceEngine(post_step_fns=[FenceOracle()], **options)


def jobs_of(e: FenceEngine, req_id: str) -> set[int]:
    return {j for j, job in e.store_jobs.items() if job.req_id == req_id}


def blocks_of(e: FenceEngine, job_id: int) -> set[int]:
    return {int(b) for b in e.store_jobs[job_id].src_spec.block_ids}


def held_for(*req_ids: str, engine_ref: list[FenceEngine]) -> Callable[[int, bool], int | None]:
    """A delay policy: stores of ``req_ids`` are held, everything else completes."""

    def delay(job_id: int, is_store: bool) -> int | None:
        job = engine_ref[0].store_jobs.get(job_id)
        return None if job is not None and job.req_id in req_ids else 0

    return delay


# --- population and flush ----------------------------------------------------------


@BOTH
def test_blocks_of_a_finished_request_are_flushed_when_reused(async_scheduling: bool) -> None:
    """A3 registers a finished request's in-flight stores; reuse flushes them (M-A3, M-B1)."""
    e = engine(num_gpu_blocks=3, delay=None, async_scheduling=async_scheduling)
    e.run([Plan(range(1, 9), 1, req_id="a")])
    (job,) = jobs_of(e, "a")
    assert e.worker.in_flight.keys() == {job}
    assert dict(e.fence.items()) == {key: {job} for key in blocks_of(e, job)}

    e.run([Plan(range(50, 58), 1, req_id="b")])
    assert job in e.flushed_jobs()
    assert ("a", 0, 0) in e.stored_positions()
    assert ("a", 0, 1) in e.stored_positions()
    e.drain()
    assert e.fence == {}
    assert not e.connector._jobs


def _finish_then_admit(delay_b: int) -> tuple[FenceEngine, int]:
    """Request a finishes; its last block's store is built one step later (async
    scheduling: the finished-request path, A2). Request b arrives ``delay_b`` steps
    after that build and takes a's freed blocks."""
    e = engine(num_gpu_blocks=5, delay=None, async_scheduling=True)
    e.add_request(range(1, 8), 2, req_id="a")
    while not e.requests["a"].is_finished():
        e.step()
    before = set(e.store_jobs)
    if delay_b == 0:
        e.add_request(range(50, 62), 1, req_id="b")
    record = e.step()
    (late,) = {j for j in set(e.store_jobs) - before if e.store_jobs[j].req_id == "a"}
    assert e.requests["a"].is_finished()
    assert e.store_jobs[late].req_id == "a"
    if delay_b:
        for _ in range(delay_b - 1):
            e.step()
        e.add_request(range(50, 62), 1, req_id="b")
        record = e.step()
    assert blocks_of(e, late) & set(record.allocated), "b did not take a's block"
    return e, late


def test_store_built_after_finish_is_flushed_in_the_step_its_block_is_reused() -> None:
    """A2's inline flush: the block is handed out by the very step that builds the
    store, so the store must run before that step's forward pass (M-A6, M-B8)."""
    e, late = _finish_then_admit(0)
    record = e.history[-1]
    assert late in record.jobs_to_flush
    assert late not in record.store_jobs or late in e.worker.flushed
    submits = [i for i, (what, job) in enumerate(e.worker.order) if job == late]
    assert [e.worker.order[i][0] for i in submits] == ["submit", "wait"]
    e.drain()
    assert e.fence == {}


def test_store_built_after_finish_is_fenced_for_a_later_reuse() -> None:
    """A2's registration: the store built after finish is in the fence at once, so a
    reuse one step later still flushes it (M-A5, the pre-#48596 code)."""
    e, late = _finish_then_admit(1)
    assert late in e.history[-1].jobs_to_flush
    assert late in e.flushed_jobs()
    e.drain()
    assert e.fence == {}


def test_flush_takes_every_job_fencing_a_reused_block() -> None:
    """Several jobs can fence one block; a reuse flushes all of them, not one (M-B3).

    The second job is set by hand, next to a real one (§13's unit layer): in this
    harness two live stores never read the same block on their own.
    """
    e = engine(num_gpu_blocks=3, delay=None)
    e.run([Plan(range(1, 9), 1, req_id="a")])
    (job,) = jobs_of(e, "a")
    sched = e.connector
    twin = sched._generate_job_id()
    sched._jobs[twin] = dataclasses.replace(sched._jobs[job])
    sched._req_status["a"].transfer_jobs.add(twin)
    for block in blocks_of(e, job):
        sched._block_id_to_pending_jobs[block].add(twin)

    e.add_request(range(50, 58), 1, req_id="b")
    output = e.scheduler.schedule()
    assert output.kv_connector_metadata.jobs_to_flush >= {job, twin}


# --- removal -----------------------------------------------------------------------


@BOTH
def test_reset_cache_clears_the_fence_and_ignores_late_completions(async_scheduling: bool) -> None:
    """reset_cache empties the fence; completions of the jobs it flushed are stale and
    never touch it (M-C6, M-C7)."""
    e = engine(num_gpu_blocks=3, delay=None, async_scheduling=async_scheduling)
    e.run([Plan(range(1, 9), 1, req_id="a")])
    assert e.fence
    e.reset_cache()
    assert e.fence == {}
    assert not e.connector._jobs
    assert check_state(e.connector, e.step_no, reset_pending=True) == []
    e.run([Plan(range(50, 58), 1, req_id="b")])
    e.drain()
    assert e.fence == {}
    assert jobs_of(e, "a") <= e.flushed_jobs()


@BOTH
def test_fence_entries_stay_until_every_worker_reports(async_scheduling: bool) -> None:
    """With two workers a job completes at the second report, and only then leaves
    the fence (M-C8; ``pending_count > 1``)."""
    e = engine(
        num_gpu_blocks=3,
        delay=None,
        workers=2,
        second_worker_lag=2,
        async_scheduling=async_scheduling,
    )
    e.run([Plan(range(1, 9), 1, req_id="a")])
    (job,) = jobs_of(e, "a")
    e.worker.release()
    e.step()  # the first worker reports
    e.step()
    assert job not in e.worker.in_flight
    assert all(job in jobs for jobs in e.fence.values())
    assert e.fence
    e.drain()
    assert e.fence == {}
    assert not e.connector._jobs


@known_bug(
    "reset-preempt-reload",
    raises=AssertionError,
    reason=(
        "the requests preempted by the reset that hit the CPU tier are reloaded in the "
        "same step; the preemption flush then takes the new load job for a store and "
        "its assertion fails (see docs/vllm-bug-reset-preempt-reload.md)"
    ),
)
def test_every_preempted_request_is_flushed() -> None:
    """Preemption flushes the stores of every preempted request, also when another
    preempted request has nothing in flight (the loop must ``continue``, not stop).

    Preempted requests come as a set, in no fixed order: with one request holding
    stores among six, a loop that stops early goes unnoticed only if that request
    happens to come first; eight rounds make that chance negligible (6^-8). The
    other five requests' stores have completed, so they come back in the same step
    with a load from the CPU tier, which the flush must leave out.
    """
    _preempt_six_in_eight_rounds(other_prompt=8)


def test_every_preempted_request_is_flushed_when_none_is_reloaded() -> None:
    """The same, with the other five requests' prompts shorter than a block: they
    store nothing, so they come back with no load, and their transfer jobs are
    empty. It keeps the loop's ``continue`` guarded on releases where a reload in
    the preemption step trips docs/vllm-bug-reset-preempt-reload.md."""
    _preempt_six_in_eight_rounds(other_prompt=2)


def _preempt_six_in_eight_rounds(other_prompt: int) -> None:
    ref: list[FenceEngine] = []
    holders = [f"held{k}" for k in range(8)]
    e = engine(
        num_gpu_blocks=64, delay=held_for(*holders, engine_ref=ref), max_num_batched_tokens=256
    )
    ref.append(e)
    for round_ in range(8):
        base = 1000 * (round_ + 1)
        e.add_request(range(base, base + 8), 6, req_id=holders[round_])
        for k in range(5):
            start = base + 100 * (k + 1)
            e.add_request(range(start, start + other_prompt), 6, req_id=f"r{round_}.{k}")
        e.step()
        e.step()
        held = jobs_of(e, holders[round_])
        assert held
        assert held <= e.worker.in_flight.keys()
        e.preempt_all()
        record = e.step()
        assert holders[round_] in (record.output.preempted_req_ids or ())
        assert held <= record.jobs_to_flush
        e.drain()
    assert e.fence == {}


@known_bug(
    "multiconnector-allocation-unseen",
    raises=(FenceViolation, ContentViolation),
    reason=(
        "update_state_after_alloc returns on num_external_tokens == 0 before it "
        "collects the step's allocated blocks, so blocks another connector loads into "
        "are never checked against the fence "
        "(see docs/vllm-bug-multiconnector-allocation-unseen.md)"
    ),
)
@BOTH
def test_blocks_another_connector_loads_into_are_checked_against_the_fence(
    async_scheduling: bool,
) -> None:
    """Under MultiConnector another connector may load a request's tokens; the
    OffloadingConnector then sees the request with no external tokens of its own, and
    must still collect its blocks before returning (vLLM issue #46951, fixed by PR
    #47046): here b's remote load goes into a's freed blocks while a's store of them
    is still in flight."""
    e = engine(num_gpu_blocks=3, delay=None, remote_source=True, async_scheduling=async_scheduling)
    e.run([Plan(range(1, 9), 1, req_id="a")])
    (job,) = jobs_of(e, "a")
    assert e.fence
    e.add_request(range(50, 58), 1, req_id="b", remote_tokens=8)
    record = e.step()
    assert e.requests["b"].status.name == "WAITING_FOR_REMOTE_KVS"
    assert set(record.allocated) == blocks_of(e, job)
    assert job in record.jobs_to_flush
    e.drain()
    assert e.fence == {}


# --- the engine as vLLM configures it ------------------------------------------------


@known_bug(
    "reset-preempt-reload",
    raises=AssertionError,
    reason=(
        "a, preempted by the reset, is reloaded from the CPU tier in the same step; the "
        "preemption flush then takes its load job for a store and its assertion fails "
        "(see docs/vllm-bug-reset-preempt-reload.md)"
    ),
)
def test_two_requests_that_fit_alone_both_finish_under_async_scheduling() -> None:
    """Found by the hunt (async scheduling, a second connector, eight usable blocks):
    a has 24 tokens, all on the CPU tier, and b's prompt is there too; each fits alone,
    not both. An async load holds its blocks, so the running request, out of blocks,
    preempts itself. vLLM, with a kv_both connector, does not free the blocks of a step
    still in flight, which the config's async_scheduling tells it. The harness once
    lost that flag (docs/triage-async-scheduling.md): a was preempted with its token in
    flight, returned as it was, and a and b preempted each other for ever."""
    e = engine(num_gpu_blocks=9, cpu_chunks=16, delay=1, remote_source=True, async_scheduling=True)
    assert e.vllm_config.max_concurrent_batches == 2  # the scheduler sees async scheduling
    e.run([Plan(range(1, 9), 1, req_id="p")])  # b's prompt goes to the CPU tier
    e.add_request([*range(100, 112), *range(2000, 2007)], 8, req_id="a")
    for _ in range(5):
        e.step()
    e.preempt_all()  # a comes back from the CPU tier
    for _ in range(3):
        e.step()
    e.add_request(range(1, 9), 4, req_id="b")
    e.drain(max_steps=60)
    assert all(r.is_finished() for r in e.requests.values())
    assert e.fence == {}
