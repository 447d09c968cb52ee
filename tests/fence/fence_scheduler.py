"""The engine core's side of a fence engine: vLLM's scheduler and its connector.

:class:`SchedulerSide` holds the real ``Scheduler`` (or ``AsyncScheduler``), the
OffloadingConnector's scheduler side (where the fence lives) and the requests; it
adds, aborts and preempts requests, resets the prefix cache, schedules a step
(recording what it handed out) and takes the model runner's output back.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import fence_remote
from fence_config import EngineConfig, retention_environment
from fence_ledger import MOVED_BLOCKS_ZEROED, JobLedger, StepRecord
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector,
    MultiKVConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager


class SchedulerSide:
    """The scheduler, the connector's scheduler side, the requests; each step's record
    goes to ``ledger``."""

    def __init__(
        self,
        config: EngineConfig,
        ledger: JobLedger,
        *,
        async_scheduling: bool,
        remote_source: bool,
    ) -> None:
        self.async_scheduling = async_scheduling
        self.ledger = ledger
        scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
        with retention_environment(config):
            self.scheduler = scheduler_cls(
                vllm_config=config.vllm,
                kv_cache_config=config.kv_cache,
                log_stats=False,
                structured_output_manager=StructuredOutputManager(config.vllm),
                block_size=config.scheduler_block_size,
                hash_block_size=config.hash_block_size,
            )
        self.connector = _offloading_scheduler(self.scheduler.connector, remote_source)
        # the connector's block lists as the step's stores were built (None: the lists
        # as the step leaves them serve)
        self._built_lists: dict[str, list[list[int]]] | None = None
        if MOVED_BLOCKS_ZEROED:
            self._keep_lists_as_stores_are_built()
        self.requests: dict[str, Request] = {}
        self.reset_since_last_step = False
        self._ids = itertools.count()
        self._pending_output: tuple[SchedulerOutput, ModelRunnerOutput] | None = None
        init_none_hash(sha256)
        # vLLM 0.34.0 on: the hashes cover the tokens the config's lookahead says (the
        # engine core builds its hasher so)
        lookahead = config.hash_lookahead_tokens
        self._hasher = get_request_block_hasher(
            config.hash_block_size, sha256, *((lookahead,) if lookahead else ())
        )

    def _keep_lists_as_stores_are_built(self) -> None:
        """draft-completed-window-chunk-dropped, fixed: the connector zeroes the ids of
        blocks handed on in a step only after that step's stores are built (they read
        them, flushed); the ledger places each store's blocks by the lists as they were
        then. The class's method is looked up at each call (a test may plant a bug in
        it)."""
        connector = self.connector

        def build_store_jobs(*args: object, **kwargs: object) -> object:
            jobs = type(connector)._build_store_jobs(connector, *args, **kwargs)
            self._built_lists = {
                r: [list(g.block_ids) for g in s.group_states]
                for r, s in connector._req_status.items()
            }
            return jobs

        connector._build_store_jobs = build_store_jobs  # type: ignore[method-assign]

    @property
    def fence(self) -> dict[int, set[int]]:
        return self.connector._block_id_to_pending_jobs

    # -- requests ------------------------------------------------------------------

    def add_request(
        self, prompt: Sequence[int], max_tokens: int, req_id: str | None, remote_tokens: int
    ) -> str:
        req_id = req_id if req_id is not None else f"r{next(self._ids)}"
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        request = Request(
            request_id=req_id,
            prompt_token_ids=list(prompt),
            sampling_params=params,
            pooling_params=None,
            block_hasher=self._hasher,
        )
        if remote_tokens:
            request.kv_transfer_params = {fence_remote.PARAM: remote_tokens}
        self.requests[req_id] = request
        self.scheduler.add_request(request)
        return req_id

    def abort(self, req_id: str) -> None:
        self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    def preempt_all(self) -> None:
        # A scheduler that defers freeing (a consumer connector, a step in flight)
        # cannot reset while that step holds blocks, and raises: the engine resets
        # only once it is idle (its pause completes the steps in flight first).
        if self.scheduler.defer_block_free:
            self.flush_async_output()
        self.scheduler.reset_prefix_cache(reset_running_requests=True)

    def reset_gpu_cache(self) -> bool:
        self.flush_async_output()
        return self.scheduler.reset_prefix_cache()

    def reset_cache(self) -> bool:
        if self.reset_since_last_step:
            raise ValueError("reset_cache twice without a step between")
        self.flush_async_output()
        done = self.scheduler.reset_prefix_cache(reset_connector=True)
        self.reset_since_last_step = True
        return done

    # -- a step --------------------------------------------------------------------

    def block_tables(self) -> dict[tuple[str, int, int], int]:
        tables: dict[tuple[str, int, int], int] = {}
        managers = self.scheduler.kv_cache_manager.coordinator.single_type_managers
        for group, manager in enumerate(managers):
            for req_id, blocks in manager.req_to_blocks.items():
                for index, block in enumerate(blocks):
                    if block.block_id != 0:
                        tables[(req_id, group, index)] = block.block_id
        return tables

    def schedule(self, step: int) -> StepRecord:
        """``schedule()``, recorded with the blocks it handed out and the fence and the
        requests' jobs as it found them."""
        before = self.block_tables()
        fence_before = {b: frozenset(j) for b, j in self.fence.items()}
        jobs_before = {r: frozenset(s.transfer_jobs) for r, s in self.connector._req_status.items()}
        stored_before = {
            r: tuple(g.next_stored_chunk_idx for g in s.group_states)
            for r, s in self.connector._req_status.items()
        }
        output = self.scheduler.schedule()
        tables = self.block_tables()
        allocated: dict[int, set[tuple[str, int, int]]] = {}
        for key, block in tables.items():
            if before.get(key) != block:
                allocated.setdefault(block, set()).add(key)
        full_meta = output.kv_connector_metadata
        meta = (
            full_meta.metadata[0] if isinstance(full_meta, MultiKVConnectorMetadata) else full_meta
        )
        assert isinstance(meta, OffloadingConnectorMetadata)
        record = StepRecord(
            step=step,
            output=output,
            store_jobs=dict(meta.store_jobs),
            load_jobs=dict(meta.load_jobs),
            jobs_to_flush=set(meta.jobs_to_flush or ()),
            allocated=allocated,
            fence_before=fence_before,
            jobs_before=jobs_before,
            tables=tables,
            stored_before=stored_before,
            after_reset=self.reset_since_last_step,
        )
        self.ledger.add(record, self.requests, self.connector._req_status, self._built_lists)
        self._built_lists = None if self._built_lists is None else {}
        self.reset_since_last_step = False
        return record

    def update(self, output: SchedulerOutput, runner_output: ModelRunnerOutput) -> None:
        """``update_from_output``; with async scheduling, a step late (as the engine
        core does, the next step being scheduled before this one's output is in)."""
        if self.async_scheduling:
            self.flush_async_output()
            self._pending_output = (output, runner_output)
        else:
            self.scheduler.update_from_output(output, runner_output)

    @property
    def output_pending(self) -> bool:
        """Whether the last step's output is not taken yet (async scheduling)."""
        return self._pending_output is not None

    def flush_async_output(self) -> None:
        if self._pending_output is not None:
            output, runner_output = self._pending_output
            self._pending_output = None
            self.scheduler.update_from_output(output, runner_output)


def _offloading_scheduler(
    connector: KVConnectorBase_V1 | None, remote_source: bool
) -> OffloadingConnectorScheduler:
    """The OffloadingConnector's scheduler side."""
    if remote_source:  # MultiConnector: the OffloadingConnector, then the remote
        assert isinstance(connector, MultiConnector)
        connector = fence_remote.first_connector(connector)
    assert isinstance(connector, OffloadingConnector)
    assert connector.connector_scheduler is not None
    return connector.connector_scheduler
