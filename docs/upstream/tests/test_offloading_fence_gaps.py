# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Invariants of the offloading scheduler's block-reuse fence.

``_block_id_to_pending_jobs`` maps a GPU block to the in-flight store jobs that
read it. A block handed out again while such a job runs must flush the job
before the step's forward pass overwrites it, and a job leaves the fence only
once every worker has reported it.
"""

import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.test_scheduler import (
    _make_partial_tail_request,
    _make_partial_tail_scheduler,
)
from tests.v1.kv_connector.unit.offloading_connector.utils import (
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID, create_model_runner_output
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import KVConnectorBlockState, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.outputs import KVConnectorOutput

pytestmark = pytest.mark.cpu_test


def _store_everything(runner: RequestRunner) -> None:
    runner.manager.prepare_store.side_effect = lambda keys, req_context: (
        generate_store_output(keys)
    )


def _report(
    scheduler: OffloadingConnectorScheduler, job_id: int, count: int = 1
) -> None:
    """One worker's report that ``job_id`` is done."""
    scheduler.update_connector_output(
        KVConnectorOutput(
            kv_connector_worker_meta=OffloadingWorkerMetadata(
                completed_jobs={job_id: count}
            )
        )
    )


class _Engine:
    """Steps a RequestRunner as EngineCore does under async scheduling
    (step N+1 is scheduled before step N's output is processed).

    RequestRunner.run() drives requests to an EOS token; these tests need a
    request that stops at max_tokens, whose last block is stored only in the
    step after it finishes (vLLM #48596).

    Every step checks that no store job reads a block the same step handed to
    another request unless the job is flushed before the forward pass.
    """

    def __init__(self, runner: RequestRunner):
        self.runner = runner
        self.store_jobs: dict[int, str] = {}
        self.store_sources: dict[int, list[int]] = {}
        self.worker_calls: list[tuple[str, int]] = []
        self._unprocessed: tuple | None = None

        build_connector_meta = runner.scheduler_connector.build_connector_meta

        def checked_build_connector_meta(scheduler_output: SchedulerOutput):
            meta = build_connector_meta(scheduler_output)
            assert isinstance(meta, OffloadingConnectorMetadata)
            self._check_no_store_reads_a_reused_block(scheduler_output, meta)
            return meta

        runner.scheduler_connector.build_connector_meta = checked_build_connector_meta

        # Record the worker-side order of submissions and flush waits.
        handler = runner.offloading_spec.handler
        submit_store, wait = handler.submit_store, handler.wait

        def recording_submit_store(job_id, device_ptrs, dst_spec):
            self.worker_calls.append(("submit", job_id))
            return submit_store(job_id, device_ptrs, dst_spec)

        def recording_wait(job_ids: set[int]) -> None:
            self.worker_calls.extend(("wait", job_id) for job_id in sorted(job_ids))
            wait(job_ids)

        handler.submit_store = recording_submit_store
        handler.wait = recording_wait

    def _check_no_store_reads_a_reused_block(
        self, scheduler_output: SchedulerOutput, meta: OffloadingConnectorMetadata
    ) -> None:
        new_owner: dict[int, str] = {}
        for new_req in scheduler_output.scheduled_new_reqs:
            for group_block_ids in new_req.block_ids:
                new_owner.update(dict.fromkeys(group_block_ids, new_req.req_id))
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_block_ids in zip(cached.req_ids, cached.new_block_ids):
            for group_block_ids in new_block_ids or ():
                new_owner.update(dict.fromkeys(group_block_ids, req_id))
        new_owner.pop(0, None)

        for job_id, job in meta.store_jobs.items():
            req_id = self.runner.connector_scheduler._jobs[job_id].req_id
            self.store_jobs[job_id] = req_id
            assert isinstance(job.src_spec, GPULoadStoreSpec)
            self.store_sources[job_id] = job.src_spec.block_ids.tolist()
            for position, block_id in enumerate(self.store_sources[job_id]):
                owner = new_owner.get(block_id, req_id)
                assert owner == req_id or job_id in meta.jobs_to_flush, (
                    f"store job {job_id} of request {req_id} reads block "
                    f"{block_id} (source position {position}), which this step "
                    f"hands to request {owner}, and the job is not flushed: it "
                    f"would copy request {owner}'s KV"
                )

    def add_request(self, token_ids: list[int], max_tokens: int) -> str:
        self.runner.new_request(token_ids=token_ids)
        req_id = str(self.runner.req_id)
        self.runner.scheduler.requests[req_id].max_tokens = max_tokens
        return req_id

    def step(self, complete_transfers: bool = False) -> OffloadingConnectorMetadata:
        runner = self.runner
        scheduler_output = runner.scheduler.schedule()
        meta = scheduler_output.kv_connector_metadata
        assert isinstance(meta, OffloadingConnectorMetadata)

        worker = runner.worker_connector
        worker.handle_preemptions(meta)
        worker.bind_connector_metadata(meta)
        worker.start_load_kv(runner._dummy_ctx)
        if complete_transfers:
            runner.offloading_spec.complete_transfers()
        worker.wait_for_save()
        results = worker.get_transfer_results(scheduler_output.finished_req_ids)
        worker_meta = worker.build_connector_worker_meta()
        worker.clear_connector_metadata()
        output = create_model_runner_output(
            reqs=[
                runner.scheduler.requests[req_id]
                for req_id in scheduler_output.num_scheduled_tokens
            ],
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            kv_connector_worker_meta=worker_meta or OffloadingWorkerMetadata(),
            failed_recving=results.failed_recving,
        )
        if self._unprocessed is not None:
            runner.scheduler.update_from_output(*self._unprocessed)
        self._unprocessed = (scheduler_output, output)
        return meta

    def is_finished(self, req_id: str) -> bool:
        return req_id not in self.runner.scheduler.requests

    def drain(self) -> None:
        scheduler = self.runner.scheduler
        for _ in range(20):
            if (
                self._unprocessed is None
                and not scheduler.requests
                and not scheduler.finished_req_ids
                and not self.runner.connector_scheduler._jobs
            ):
                return
            self.step(complete_transfers=True)
            if not scheduler.requests:
                assert self._unprocessed is not None
                scheduler.update_from_output(*self._unprocessed)
                self._unprocessed = None
        raise AssertionError("the engine did not drain in 20 steps")


def _calls_for(engine: _Engine, job_id: int) -> list[str]:
    return [call for call, job in engine.worker_calls if job == job_id]


@pytest.mark.parametrize("reuse_delay", [0, 1])
def test_final_store_after_finish_is_fenced_and_flushed_on_reuse(
    request_runner, reuse_delay: int
):
    """A request that stops at max_tokens under async scheduling has its last
    full block stored by the step after it finishes, from a block it has
    already freed. That store must be in the fence from its creation and be
    flushed -- submitted, then waited on, exactly once -- as soon as the block
    is handed out again: in the very step that builds it (reuse_delay=0) or
    in a later one (reuse_delay=1).
    """
    runner = request_runner(block_size=4, num_gpu_blocks=5, async_scheduling=True)
    _store_everything(runner)
    engine = _Engine(runner)
    scheduler = runner.connector_scheduler

    req_a = engine.add_request(list(range(1, 8)), max_tokens=2)
    while not engine.is_finished(req_a):
        engine.step()
    jobs_before = set(engine.store_jobs)
    if reuse_delay == 0:
        req_b = engine.add_request(list(range(50, 62)), max_tokens=1)
    build_meta = engine.step()
    [final_job] = [
        job_id
        for job_id in set(engine.store_jobs) - jobs_before
        if engine.store_jobs[job_id] == req_a
    ]
    final_blocks = engine.store_sources[final_job]
    assert scheduler._jobs[final_job].deferred_fence_block_ids == final_blocks
    for block_id in final_blocks:
        assert final_job in scheduler._block_id_to_pending_jobs.get(block_id, ()), (
            f"block {block_id} of request {req_a}'s final store (job {final_job}) "
            f"is not fenced: {scheduler._block_id_to_pending_jobs}"
        )

    reuse_meta = build_meta
    if reuse_delay:
        assert final_job not in build_meta.jobs_to_flush
        req_b = engine.add_request(list(range(50, 62)), max_tokens=1)
        reuse_meta = engine.step()
    b_blocks = set(runner.scheduler.kv_cache_manager.get_block_ids(req_b)[0])
    assert b_blocks & set(final_blocks), "request b did not take a's freed block"
    assert reuse_meta.jobs_to_flush == {final_job}, (
        f"request {req_b} takes block(s) {sorted(b_blocks & set(final_blocks))} "
        f"that request {req_a}'s final store (job {final_job}) still reads, but "
        f"the step flushes {reuse_meta.jobs_to_flush}"
    )

    engine.drain()
    assert _calls_for(engine, final_job) == ["submit", "wait"], (
        f"job {final_job} must be submitted once, then waited on: {engine.worker_calls}"
    )
    for job_id in engine.store_jobs:
        assert _calls_for(engine, job_id).count("submit") == 1, (
            f"store job {job_id} submitted {_calls_for(engine, job_id)}"
        )
    assert scheduler._block_id_to_pending_jobs == {}
    assert not scheduler._jobs


def test_finished_sliding_window_tail_is_not_stored_from_a_reused_block(
    request_runner,
):
    """Sliding-window KV (e.g. Gemma 3, gpt-oss) with a one-block window.

    Request a stops at max_tokens; its last sliding-window block is freed at
    finish and, the pool being full, handed to waiting request b in the step
    that builds a's final store. b's forward pass overwrites it before the
    worker submits that store, so the store must not read it unflushed
    (checked by _Engine at every step), whichever request's table records it.
    """
    block_size = 4
    runner = request_runner(
        block_size=block_size,
        num_gpu_blocks=4,
        async_scheduling=True,
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                SlidingWindowSpec(
                    block_size=block_size,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=block_size,
                ),
            )
        ],
    )
    _store_everything(runner)
    engine = _Engine(runner)

    req_a = engine.add_request([1], max_tokens=4)
    engine.step()
    req_b = engine.add_request(list(range(50, 62)), max_tokens=1)
    a_blocks = set(runner.scheduler.kv_cache_manager.get_block_ids(req_a)[0])
    while not engine.is_finished(req_a):
        engine.step()
    engine.step()
    b_blocks = set(runner.scheduler.kv_cache_manager.get_block_ids(req_b)[0])
    assert a_blocks & b_blocks - {0}, "request b did not take a's block"
    engine.drain()
    assert runner.connector_scheduler._block_id_to_pending_jobs == {}


def test_null_block_in_a_stored_sliding_window_chunk_is_not_fenced(request_runner):
    """A chunk of 3 sliding-window blocks whose first block the window has
    freed keeps the null block as a placeholder in the store's source list;
    the fence holds only the live blocks the job reads, and empties when the
    job completes."""
    block_size = 4
    runner = request_runner(
        block_size=block_size,
        num_gpu_blocks=10,
        blocks_per_chunk=3,
        async_scheduling=False,
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["swa"],
                SlidingWindowSpec(
                    block_size=block_size,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=2 * block_size,
                ),
            )
        ],
    )
    scheduler = runner.connector_scheduler
    runner.new_request(token_ids=[0] * (9 * block_size))
    runner.manager.prepare_store.return_value = None
    for _ in range(2):
        output = runner.scheduler.schedule()
        runner.scheduler.update_from_output(
            output, create_model_runner_output(runner.scheduler.running, token_id=0)
        )
    _store_everything(runner)
    meta = runner.scheduler.schedule().kv_connector_metadata
    assert isinstance(meta, OffloadingConnectorMetadata)
    [(job_id, job)] = meta.store_jobs.items()
    assert isinstance(job.src_spec, GPULoadStoreSpec)
    src_blocks = job.src_spec.block_ids.tolist()
    assert 0 in src_blocks, f"expected a null placeholder in {src_blocks}"
    live_blocks = [block_id for block_id in src_blocks if block_id != 0]

    assert scheduler._jobs[job_id].fenced_block_ids == live_blocks
    assert scheduler._block_id_to_pending_jobs == dict.fromkeys(live_blocks, {job_id})
    _report(scheduler, job_id)
    assert scheduler._block_id_to_pending_jobs == {}


def test_fence_holds_until_every_worker_reports_and_reset_clears_it(
    request_runner,
):
    """With two workers (TP=2) a store leaves the fence only at the second
    worker's report; a cache reset empties the fence of in-flight stores at
    once, and their late reports leave it empty."""
    runner = request_runner(
        block_size=4, num_gpu_blocks=10, async_scheduling=False, worker_count=2
    )
    _store_everything(runner)
    scheduler = runner.connector_scheduler

    def finish_with_store_in_flight(token: int) -> tuple[int, list[int]]:
        runner.new_request(token_ids=[token] * 8)
        runner.run(decoded_tokens=[EOS_TOKEN_ID], complete_transfers=False)
        [(job_id, job)] = scheduler._jobs.items()
        assert job.pending_count == 2
        block_ids = job.deferred_fence_block_ids
        assert block_ids
        assert scheduler._block_id_to_pending_jobs == dict.fromkeys(block_ids, {job_id})
        return job_id, block_ids

    job_id, block_ids = finish_with_store_in_flight(token=1)
    _report(scheduler, job_id)
    assert scheduler._jobs[job_id].pending_count == 1
    assert scheduler._block_id_to_pending_jobs == dict.fromkeys(block_ids, {job_id}), (
        f"job {job_id} left the fence after one of its two workers reported"
    )
    runner.manager.complete_store.assert_not_called()
    _report(scheduler, job_id)
    assert scheduler._block_id_to_pending_jobs == {}
    assert job_id not in scheduler._jobs

    job_id, _ = finish_with_store_in_flight(token=2)
    scheduler.reset_cache()
    assert scheduler._block_id_to_pending_jobs == {}, (
        "reset_cache left the fence of flushed job(s) in place"
    )
    _report(scheduler, job_id, count=2)
    assert scheduler._block_id_to_pending_jobs == {}


def _hand_offs(entries: dict[str, list[tuple[int, int, int]]]) -> SchedulerOutput:
    """A step whose KV-cache manager hands off Mamba states, as
    (group_idx, copy-on-write block, boundary token) per request."""
    output = SchedulerOutput.make_empty()
    output.kv_connector_block_state = KVConnectorBlockState(
        req_ids=set(),
        resolve_block_ids={}.__getitem__,
        boundary_state_offloads=entries,
    )
    return output


def test_hand_off_stores_fence_their_sources_until_they_complete():
    """Hybrid attention + Mamba ("align" mode, e.g. Qwen3-Next, Nemotron-H).

    An aligned-boundary store fences its copy-on-write block; each partial-tail
    store fences the attention block and the copy-on-write block it reads.
    Two partial tails in the same 16-token attention block both fence it, and
    handing that block to a newly admitted request flushes both. Each store
    leaves the fence, as a completed store, when it completes.
    """
    scheduler = _make_partial_tail_scheduler()
    _make_partial_tail_request(scheduler)
    req_status = scheduler._req_status["req"]
    req_status.group_states[0].block_ids[:] = [11, 12]
    req_status.group_states[1].block_ids[:] = [0, 21]
    prepare_store = scheduler.manager.prepare_store
    prepare_store.side_effect = lambda keys, req_context: generate_store_output(keys)

    meta = scheduler.build_connector_meta(_hand_offs({"req": [(1, 98, 16)]}))
    assert isinstance(meta, OffloadingConnectorMetadata)
    [boundary] = meta.store_jobs
    meta = scheduler.build_connector_meta(_hand_offs({"req": [(1, 99, 20)]}))
    assert isinstance(meta, OffloadingConnectorMetadata)
    [tail_20] = meta.store_jobs
    meta = scheduler.build_connector_meta(_hand_offs({"req": [(1, 97, 28)]}))
    assert isinstance(meta, OffloadingConnectorMetadata)
    [tail_28] = meta.store_jobs

    expected_sources = {boundary: [98], tail_20: [12, 99], tail_28: [12, 97]}
    for job_id, sources in expected_sources.items():
        job = scheduler._jobs[job_id]
        assert job.is_store is True, f"hand-off job {job_id} is not a store"
        assert job.fenced_block_ids == sources, (
            f"hand-off store {job_id} fences {job.fenced_block_ids}, "
            f"but reads {sources}"
        )
    assert scheduler._block_id_to_pending_jobs == {
        98: {boundary},
        12: {tail_20, tail_28},
        99: {tail_20},
        97: {tail_28},
    }

    # A request admitted with no external tokens gets attention block 12.
    other = _make_partial_tail_request(scheduler, request_id="other")
    scheduler.update_state_after_alloc(
        other, KVCacheBlocks(blocks=([KVCacheBlock(block_id=12)], [])), 0
    )
    meta = scheduler.build_connector_meta(SchedulerOutput.make_empty())
    assert isinstance(meta, OffloadingConnectorMetadata)
    assert meta.jobs_to_flush == {tail_20, tail_28}, (
        f"block 12 is handed out while partial-tail stores {tail_20} and "
        f"{tail_28} read it, but the step flushes {meta.jobs_to_flush}"
    )

    complete_store = scheduler.manager.complete_store
    remaining = dict(scheduler._block_id_to_pending_jobs)
    for job_id in (tail_20, boundary, tail_28):
        keys = scheduler._jobs[job_id].keys
        _report(scheduler, job_id)
        assert complete_store.call_args.args[0] == keys, (
            f"store {job_id} completed, but the manager was not told so"
        )
        for block_id in expected_sources[job_id]:
            remaining[block_id] = remaining[block_id] - {job_id}
            if not remaining[block_id]:
                del remaining[block_id]
        assert scheduler._block_id_to_pending_jobs == remaining, (
            f"after store {job_id} completed"
        )
    assert complete_store.call_count == 3
    assert not scheduler._jobs


@pytest.mark.parametrize("store_owner", ["a", "b"])
def test_preemption_flushes_every_preempted_request_with_a_store(store_owner: str):
    """Two requests preempted in one step, only one with a store in flight:
    the store is flushed whichever of them the scheduler visits first
    (``preempted_req_ids`` is a set; the two cases cover both orders)."""
    scheduler = _make_partial_tail_scheduler()
    tables = {"a": ([11, 12], [0, 21]), "b": ([13, 14], [0, 22])}
    for req_id, (attention_blocks, mamba_blocks) in tables.items():
        _make_partial_tail_request(scheduler, request_id=req_id)
        req_status = scheduler._req_status[req_id]
        req_status.group_states[0].block_ids[:] = attention_blocks
        req_status.group_states[1].block_ids[:] = mamba_blocks
    prepare_store = scheduler.manager.prepare_store
    prepare_store.side_effect = lambda keys, req_context: generate_store_output(keys)
    meta = scheduler.build_connector_meta(_hand_offs({store_owner: [(1, 99, 20)]}))
    assert isinstance(meta, OffloadingConnectorMetadata)
    [job_id] = meta.store_jobs

    output = SchedulerOutput.make_empty()
    output.preempted_req_ids = {"a", "b"}
    meta = scheduler.build_connector_meta(output)
    assert isinstance(meta, OffloadingConnectorMetadata)
    assert meta.jobs_to_flush == {job_id}, (
        f"request {store_owner} is preempted with store {job_id} in flight, "
        f"but the step flushes {meta.jobs_to_flush}"
    )


def test_no_chunk_is_stored_from_a_null_last_block(request_runner):
    """An EAGLE/MTP drafter's sliding-window KV (a 3-block window), chunks of
    three blocks, ``prefix_cache_retention_interval=24``.

    A 60-token prompt prefills in two steps; the CPU tier refuses the first
    step's stores. At the second step the window frees block positions 0-8,
    last first, and the scheduler hands position 8's block back to the same
    request for a new position, so the connector's copy of the block table
    holds the null block at position 8. Of the chunk at positions 6-8 only
    position 6, the EAGLE peek past the 24-token boundary, can serve a hit,
    yet the chunk must not be stored: its key names the KV of its last block,
    which the null block does not hold.
    """
    block_size = 4
    blocks_per_chunk = 3
    runner = request_runner(
        block_size=block_size,
        num_gpu_blocks=16,
        blocks_per_chunk=blocks_per_chunk,
        async_scheduling=False,
        retention_interval=24,
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["draft"],
                SlidingWindowSpec(
                    block_size=block_size,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=3 * block_size,
                ),
                is_eagle_group=True,
            )
        ],
    )
    scheduler = runner.scheduler
    store_sources: dict[int, list[int]] = {}

    def step() -> None:
        output = scheduler.schedule()
        meta = output.kv_connector_metadata
        assert isinstance(meta, OffloadingConnectorMetadata)
        for job_id, job in meta.store_jobs.items():
            assert isinstance(job.src_spec, GPULoadStoreSpec)
            store_sources[job_id] = job.src_spec.block_ids.tolist()
        scheduler.update_from_output(
            output, create_model_runner_output(scheduler.running, token_id=0)
        )

    runner.new_request(token_ids=list(range(1, 61)))
    scheduler.max_num_scheduled_tokens = 48
    runner.manager.prepare_store.return_value = None
    step()
    block_at_8 = scheduler.kv_cache_manager.get_block_ids("0")[0][8]
    _store_everything(runner)
    step()
    blocks = scheduler.kv_cache_manager.get_block_ids("0")[0]
    assert block_at_8 in blocks[9:], (
        f"block {block_at_8} (position 8) did not come back to request 0: {blocks}"
    )

    assert store_sources, "request 0 stored nothing"
    for job_id, source in store_sources.items():
        for start in range(0, len(source), blocks_per_chunk):
            chunk = source[start : start + blocks_per_chunk]
            assert chunk[-1] != 0, (
                f"store job {job_id} of request 0 reads GPU blocks {source}: "
                f"its chunk {chunk} ends on the null block, so the chunk's key "
                f"is stored without the KV of its last block"
            )
