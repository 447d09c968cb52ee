"""An engine loop around the real vLLM scheduler and OffloadingConnector, for fence tests.

What is real: vLLM's ``Scheduler`` (or ``AsyncScheduler``), its KV-cache manager and
block pool, the scheduler-side ``OffloadingConnector`` (the fence lives there), the
worker-side ``OffloadingConnector`` (queueing, popping and flushing of jobs) and the
CPU tier's ``CPUOffloadingManager`` (lookups, LRU eviction, a store refused when the
tier is full). What is fake: only the transfer worker, :class:`FakeTransferWorker`,
which moves no bytes but records every transfer and completes it when the test says.

The harness also models the *contents* of blocks (``fence_contents``), so a test can
ask the question the fence exists for — was a block overwritten while a store was
still reading it? — without trusting the scheduler's own bookkeeping
(:class:`ContentViolation`).

:class:`FenceEngine` is the tests' one entry point; its parts, one module each:

* ``fence_config``: vLLM's configs and the KV-cache groups of a layout;
* ``fence_scheduler``: the scheduler and the connector's scheduler side, requests;
* ``fence_workers``: the worker-role connector as a model runner drives it, and the
  second rank of a two-worker engine;
* ``fence_transfers``: the fake transfer worker and the offloading spec that hands it out;
* ``fence_contents``: the content model;
* ``fence_ledger``: the jobs and steps recorded, and the queries over them;
* ``fence_remote``: the second connector of ``remote_source`` engines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import fence_remote
from fence_config import Layout, Role, engine_config, vllm_config
from fence_contents import (
    EAGLE_POPPED,
    FINAL_SLIDING_WINDOW_TAIL,
    FINAL_TOKEN_UNCOMPUTED,
    PREEMPTED_THEN_FINISHED,
    SHORTER_HIT,
    UNALIGNED_HIT,
    UNSTORED_SLOT,
    Contents,
    ContentViolation,
)
from fence_findings import has_bug
from fence_ledger import JobLedger, StepRecord
from fence_scheduler import SchedulerSide
from fence_transfers import Delay, FakeTransferWorker, FenceOffloadingSpec
from fence_workers import Speculation, WorkerSide
from vllm.v1.request import RequestStatus

# What an EAGLE engine given no Speculation plays: a drafter of one draft token that
# proposes nothing (vLLM's dynamic speculation can propose zero drafts); under async
# scheduling vLLM still schedules its one placeholder draft a step, which the target
# model then rejects.
IDLE_DRAFTER = Speculation(1, lambda _r, _s: 0, lambda _r, _s, _d: 0)

__all__ = [
    "EAGLE_POPPED",
    "FINAL_SLIDING_WINDOW_TAIL",
    "FINAL_TOKEN_UNCOMPUTED",
    "IDLE_DRAFTER",
    "PREEMPTED_THEN_FINISHED",
    "RELEASE_TOLERANCE",
    "SHORTER_HIT",
    "STRANDED_FINISHED_LOAD",
    "UNALIGNED_HIT",
    "UNSTORED_SLOT",
    "ContentViolation",
    "Delay",
    "FakeTransferWorker",
    "FenceEngine",
    "FenceOffloadingSpec",
    "Layout",
    "Plan",
    "Speculation",
    "StepRecord",
    "vllm_config",
]


# The known vLLM bugs an engine tolerates unless told otherwise (``tolerate=``): on a
# release the registry lists for final-store-uncomputed-token (vLLM 0.28.0-0.29.0),
# every finished request whose length is a whole number of blocks stores a block
# whose last token was never computed. Failing every workload that meets it would
# leave those releases without a fence test; so engines there record it in
# ``known_bug_hits`` instead, and test_vllm_bugs.py keeps it as a strict expected
# failure with ``tolerate=()``. Elsewhere this is empty: the engine is strict.
RELEASE_TOLERANCE: frozenset[str] = (
    frozenset({FINAL_TOKEN_UNCOMPUTED}) if has_bug("final-store-uncomputed-token") else frozenset()
)

# A vLLM bug (0.28.0-0.30.0, reported upstream in 2026-09): the waiting loop serves the
# queue of skipped requests from its head and ends at the first request that gets no
# blocks, so a request behind it whose load has finished, holding its blocks, is never
# promoted (or, promoted in a step whose allocation failed, never scheduled); with
# nothing running, nothing frees a block, and the engine stops
# (docs/vllm-bug-stranded-finished-load.md). A drain that meets it on a release with
# the bug, where the engine tolerates it, ends there and records it.
STRANDED_FINISHED_LOAD = "a finished load stranded behind a waiting head that gets no blocks"


@dataclass
class Plan:
    """A request to run: its prompt, how many tokens it generates, when it arrives."""

    prompt: Sequence[int]
    max_tokens: int
    arrive_at: int = 0
    req_id: str | None = None
    abort_at: int | None = None  # abort after this many steps since arrival


class _Arrivals:
    """The plans of one :meth:`FenceEngine.run`: each request added at its step, and
    aborted at its step if it has one."""

    def __init__(self, plans: Sequence[Plan]) -> None:
        self.waiting = sorted(plans, key=lambda p: p.arrive_at)
        self.aborts: dict[str, int] = {}  # request -> the step of the run that aborts it

    def apply(self, engine: FenceEngine, now: int) -> None:
        while self.waiting and self.waiting[0].arrive_at <= now:
            plan = self.waiting.pop(0)
            req_id = engine.add_request(plan.prompt, plan.max_tokens, plan.req_id)
            if plan.abort_at is not None:
                self.aborts[req_id] = plan.abort_at + now
        for req_id, when in list(self.aborts.items()):
            if when <= now and not engine.requests[req_id].is_finished():
                engine.abort(req_id)
                del self.aborts[req_id]


class FenceEngine:
    """vLLM's scheduler and the OffloadingConnector (both roles), stepped by hand.

    Each :meth:`step` is one engine step as a GPU model runner does it: schedule,
    worker ``handle_preemptions`` (submit, then wait on flushed jobs), start loads,
    the forward pass, ``wait_for_save`` (queue this step's stores), transfer
    progress, ``get_finished`` and ``update_from_output``. Then every
    ``post_step_fn`` runs.
    """

    def __init__(
        self,
        *,
        block_size: int = 4,
        sliding_block_size: int | None = None,
        num_gpu_blocks: int = 16,
        layout: Layout = "full",
        window_blocks: int = 2,
        blocks_per_chunk: int = 1,
        async_scheduling: bool = False,
        cpu_chunks: int = 64,
        workers: int = 1,
        second_worker_lag: int = 1,
        second_rank_writes: bool = True,
        delay: Delay | Callable[[int, bool], Delay] = 0,
        max_num_batched_tokens: int = 64,
        request_level: bool = False,
        remote_source: bool = False,
        kv_role: Role = "kv_both",
        retention_interval: int | None = 0,
        eagle: bool = False,
        lookahead_hashes: bool = False,
        speculation: Speculation | None = None,
        tolerate: Sequence[str] | None = None,
        post_step_fns: Sequence[Callable[[FenceEngine], None]] = (),
        strict_contents: bool = True,
    ) -> None:
        self.blocks_per_chunk = blocks_per_chunk
        self.async_scheduling = async_scheduling
        if eagle and speculation is None:
            speculation = IDLE_DRAFTER
        self.speculation = speculation
        self.layout = layout
        self.eagle = eagle
        self.retention_interval = retention_interval
        self.workers = workers
        self.second_worker_lag = second_worker_lag
        self.remote_source = remote_source
        self._delay = delay
        self.post_step_fns: list[Callable[[FenceEngine], None]] = list(post_step_fns)
        self.strict_contents = strict_contents
        # None: the known bugs of this release (RELEASE_TOLERANCE)
        self.tolerate = RELEASE_TOLERANCE if tolerate is None else frozenset(tolerate)
        self.known_bug_hits: list[tuple[str, int]] = []
        self.step_no = 0
        self._violations_seen = 0
        # a step raised: vLLM's objects are as the failure left them, half a step done
        # (a store submitted whose deferred list was never cleared), so stepping on
        # would raise about the harness's own leftovers and hide the failure
        self.broken = False
        # the engine stopped in STRANDED_FINISHED_LOAD, tolerated: its shape, else None
        self.stranded: str | None = None

        config = engine_config(
            layout=layout,
            block_size=block_size,
            sliding_block_size=sliding_block_size,
            window_blocks=window_blocks,
            eagle=eagle,
            lookahead_hashes=lookahead_hashes,
            num_gpu_blocks=num_gpu_blocks,
            retention_interval=retention_interval,
            blocks_per_chunk=blocks_per_chunk,
            async_scheduling=async_scheduling,
            cpu_chunks=cpu_chunks,
            workers=workers,
            max_num_batched_tokens=max_num_batched_tokens,
            request_level=request_level,
            remote_source=remote_source,
            kv_role=kv_role,
            spec_tokens=speculation.tokens if speculation else 0,
        )
        self.vllm_config = config.vllm
        # the tokens after each block its hash covers: vLLM 0.34.0's lookahead block
        # hashes, where asked and every connector takes them (vLLM keeps them off
        # under the second connector); 0 for the legacy hashes
        self.hash_lookahead_tokens = config.hash_lookahead_tokens
        self.group_block_sizes = config.group_block_sizes
        self.hash_block_size = config.hash_block_size
        self.ledger = JobLedger(blocks_per_chunk, config.final_tail_groups)
        self.scheduler_side = SchedulerSide(
            config, self.ledger, async_scheduling=async_scheduling, remote_source=remote_source
        )
        if remote_source:
            fence_remote.ENGINE = self  # its worker side writes through self.contents
        self.worker_side = WorkerSide(
            config,
            self.scheduler_side.requests,
            self.ledger.load_jobs,
            remote_source=remote_source,
            workers=workers,
            second_worker_lag=second_worker_lag,
            second_rank_writes=second_rank_writes,
        )
        self.worker = self.worker_side.worker
        self.worker.engine = self
        self.contents = Contents(self)

        # The parts' state, read by tests and the oracle (no part rebinds these).
        self.scheduler = self.scheduler_side.scheduler
        self.connector = self.scheduler_side.connector
        self.requests = self.scheduler_side.requests
        self.worker_connector = self.worker_side.connector
        self.store_jobs = self.ledger.store_jobs
        self.load_jobs = self.ledger.load_jobs
        self.job_places = self.ledger.job_places
        self.stores_after_preemption = self.ledger.stores_after_preemption
        self.history = self.ledger.history

    def tolerated_stale_reads(self, job_id: int) -> set[tuple[int, int]]:
        """The (group, block index) places of store ``job_id`` that only the tolerated
        final-tail bug reads (FINAL_SLIDING_WINDOW_TAIL); none unless tolerated."""
        if FINAL_SLIDING_WINDOW_TAIL not in self.tolerate:
            return set()
        return self.ledger.stale_tail_reads.get(job_id, set())

    def delay_of(self, job_id: int) -> Delay:
        return (
            self._delay(job_id, job_id in self.store_jobs) if callable(self._delay) else self._delay
        )

    @property
    def fence(self) -> dict[int, set[int]]:
        return self.scheduler_side.fence

    @property
    def lookahead_hashes(self) -> bool:
        """Whether the lookahead block hashes ran (vLLM 0.34.0)."""
        return self.hash_lookahead_tokens > 0

    @property
    def eagle_drop(self) -> bool:
        """Whether an EAGLE drafter drops a hit's last block: under the legacy hashes;
        under the lookahead ones its group keeps it."""
        return self.eagle and not self.lookahead_hashes

    @property
    def reset_since_last_step(self) -> bool:
        return self.scheduler_side.reset_since_last_step

    # -- requests ------------------------------------------------------------------

    def add_request(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        req_id: str | None = None,
        remote_tokens: int = 0,
    ) -> str:
        """Add a request; with ``remote_tokens``, the remote source (``remote_source``
        engines) loads its first that many tokens asynchronously."""
        return self.scheduler_side.add_request(prompt, max_tokens, req_id, remote_tokens)

    def abort(self, req_id: str) -> None:
        self.scheduler_side.abort(req_id)

    def preempt_all(self) -> None:
        """Preempt every running request now, as the engine's
        reset_prefix_cache(reset_running_requests=True) does (it also empties the GPU
        prefix cache); the next schedule() reports them preempted."""
        self.scheduler_side.preempt_all()

    def reset_gpu_cache(self) -> bool:
        """The engine's reset_prefix_cache() (the GPU prefix cache alone, not the
        connector's), between steps; it does nothing and returns False while a request
        holds blocks."""
        return self.scheduler_side.reset_gpu_cache()

    def reset_cache(self) -> bool:
        """The engine's reset_prefix_cache(reset_connector=True), between steps.

        Not twice without a step between: the connector keeps the first reset's
        flush set for the next step and asserts it is empty on the second reset.
        """
        return self.scheduler_side.reset_cache()

    # -- stepping ------------------------------------------------------------------

    def step(self) -> StepRecord:
        self.step_no += 1
        try:
            record = self.scheduler_side.schedule(self.step_no)
            runner_output = self.worker_side.execute(
                record.output,
                self.step_no,
                self.contents,
                self.speculation,
                behind=self.scheduler_side.output_pending,
            )
            self.scheduler_side.update(record.output, runner_output)
            self.worker_side.counted()
            # the engine core's post-step: an async step's drafts stay with the runner
            # (the scheduler schedules placeholders for them)
            if self.speculation is not None and not self.async_scheduling:
                drafts = self.worker_side.drafts(record.output, self.step_no, self.speculation)
                self.scheduler.update_draft_token_ids(drafts)
            for fn in self.post_step_fns:
                fn(self)
        except BaseException:
            self.broken = True
            raise
        fresh = self.contents.violations[self._violations_seen :]
        self._violations_seen = len(self.contents.violations)
        if fresh and self.strict_contents:
            raise ContentViolation("\n".join(fresh))
        return record

    def run(self, plans: Sequence[Plan] = (), *, max_steps: int = 500) -> list[StepRecord]:
        """Step until every planned request has finished and every transfer has
        completed or is held (see :meth:`drain` to release them); requests arrive at
        their ``arrive_at`` step (counted from this call)."""
        records: list[StepRecord] = []
        arrivals = _Arrivals(plans)
        start = self.step_no
        for _ in range(max_steps):
            arrivals.apply(self, self.step_no - start)
            if not arrivals.waiting and not self.scheduler.has_unfinished_requests():
                self.scheduler_side.flush_async_output()
                if not self.busy() or self.worker_side.held_only(self.connector._jobs.keys()):
                    break  # done, or only held transfers left
            records.append(self.step())
        else:
            raise AssertionError(f"the engine did not settle within {max_steps} steps")
        self.scheduler_side.flush_async_output()
        return records

    def drain(self, max_steps: int = 300) -> None:
        """Release every held transfer and step until the engine is idle: within
        ``max_steps`` for the transfers, plus twice the tokens the unfinished requests
        have left to compute (:meth:`work`). A queue of sixty requests in a tight pool
        runs one at a time, so a fixed number of steps would call it stuck; an engine
        that really is (a request never scheduled, a job never completed) exceeds any
        bound."""
        budget = max_steps + 2 * self.work()
        taken = 0
        while not self._idle():
            if taken == budget:
                stranded = self.stranded_load()
                if stranded and STRANDED_FINISHED_LOAD in self.tolerate:
                    self.stranded = stranded  # a known vLLM bug: recorded, not reported again
                    self.known_bug_hits.append((STRANDED_FINISHED_LOAD, -1))
                    return
                raise AssertionError(
                    f"the engine did not drain within {budget} steps ({max_steps} for the "
                    "transfers, and twice the tokens its requests had left)"
                    + (f"; {stranded}" if stranded else "")
                )
            self.step()
            taken += 1

    def stranded_load(self) -> str | None:
        """The shape of STRANDED_FINISHED_LOAD, if the engine is in it now: nothing
        running and no transfer in flight, and in the waiting queues (the skipped ones
        first, as FCFS serves them) a request whose load has finished behind a head
        that holds no blocks, or that holds only what its own finished load gave it;
        else None.

        The loaded request is either still WAITING_FOR_REMOTE_KVS, its id among the
        finished receives, or already promoted (to WAITING, or PREEMPTED if it was
        preempted before) in a pass whose allocation for it then failed: a waiting
        request that holds blocks got them from an asynchronous load, the only
        allocation that leaves a request waiting. The head can be such a promoted
        load too: its allocation fails on every pass while the loads behind it keep
        the blocks it needs."""
        scheduler = self.scheduler
        if scheduler.running or self.worker_side.busy():
            return None
        skipped = getattr(scheduler, "skipped_waiting", None) or ()  # 0.30.0 and before
        queued = [*skipped, *scheduler.waiting]
        if not queued:
            return None
        head, *behind = queued
        manager = scheduler.kv_cache_manager
        if head.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            return None
        holds = any(manager.get_block_ids(head.request_id))  # a promoted load's blocks
        finished = getattr(scheduler, "finished_recving_kv_req_ids", set())
        loaded = []
        for q in behind:
            if q.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if q.request_id in finished:
                    loaded.append(q.request_id)
            elif q.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) and any(
                manager.get_block_ids(q.request_id)
            ):
                loaded.append(f"{q.request_id} (promoted to {q.status.name})")
        if not loaded:
            return None
        status = head.status.name
        label = f"promoted to {status}, holding blocks" if holds else f"{status}, no blocks"
        return (
            f"{head.request_id} ({label}) heads the waiting queues, and "
            f"{', '.join(loaded)} behind it, holding blocks, finished loading"
        )

    def _idle(self) -> bool:
        """Every held transfer released, and nothing left to step for."""
        self.worker.release()
        if self.busy():
            return False
        self.scheduler_side.flush_async_output()
        return not self.busy()

    def work(self) -> int:
        """The tokens the unfinished requests have left at most, computed once each:
        their prompts and their outputs."""
        return sum(
            q.num_prompt_tokens + q.max_tokens
            for q in self.requests.values()
            if not q.is_finished()
        )

    def busy(self) -> bool:
        """Whether the engine would take another step: requests, or the connector's
        pending work (in-flight jobs, a reset's unreported flushes), or transfers."""
        return bool(
            self.scheduler.has_requests() or self.connector._jobs or self.worker_side.busy()
        )

    # -- what happened -------------------------------------------------------------

    def block_tables(self) -> dict[tuple[str, int, int], int]:
        """(request, group, block index) -> GPU block id, as the KV-cache manager has them."""
        return self.scheduler_side.block_tables()

    def stored_positions(self) -> set[tuple[str, int, int]]:
        """(request, group, block index) of every block a completed store read."""
        in_flight = self.worker.in_flight
        submitted = self.worker.submitted.values()
        return self.ledger.positions(
            t for t in submitted if t.is_store and t.job_id not in in_flight
        )

    def loaded_positions(self) -> set[tuple[str, int, int]]:
        return self.ledger.positions(t for t in self.worker.submitted.values() if not t.is_store)

    def flushed_jobs(self) -> set[int]:
        return set(self.worker.flushed)
