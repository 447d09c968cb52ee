"""An engine loop around the real vLLM scheduler and OffloadingConnector, for fence tests.

What is real: vLLM's ``Scheduler`` (or ``AsyncScheduler``), its KV-cache manager and
block pool, the scheduler-side ``OffloadingConnector`` (the fence lives there), the
worker-side ``OffloadingConnector`` (queueing, popping and flushing of jobs) and the
CPU tier's ``CPUOffloadingManager`` (lookups, LRU eviction, a store refused when the
tier is full). What is fake: only the transfer worker, :class:`FakeTransferWorker`,
which moves no bytes but records every transfer and completes it when the test says.

The harness also models the *contents* of GPU blocks: the forward pass writes, into
each block it computes, a tag naming the tokens the block holds (the request's block
hash once the block is full). A store job reads tags; a load writes them. So a test
can ask the question the fence exists for — was a block overwritten while a store
was still reading it? — without trusting the scheduler's own bookkeeping
(:class:`ContentViolation`).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import fence_remote
import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector,
    MultiKVConnectorMetadata,
    MultiKVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    TransferJob,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.forward_context import ForwardContext
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    resolve_cache_hit_alignment_tokens,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

Layout = Literal["full", "sliding", "mixed"]
# A completion delay in engine steps after submission (0: completes in the step it is
# submitted, after that step's forward pass), or None: held until released.
Delay = int | None

MODEL = "facebook/opt-125m"  # its config.json only; no weights, no tokenizer


# A vLLM 0.33.0 bug the harness can tolerate (FenceEngine(tolerate=...)), so that
# random workloads keep hunting for others: a request preempted by an async step while
# its last token was in flight finishes with that token, and the connector builds its
# final store from the blocks the preemption freed (docs/vllm-bug-preempted-final-store.md).
PREEMPTED_THEN_FINISHED = "store of a request finished after its preemption"


class ContentViolation(AssertionError):
    """A block was overwritten while a store still read it, or a store read wrong data."""


# ---------------------------------------------------------------------------------
# The fake transfer worker and the offloading spec that hands it out
# ---------------------------------------------------------------------------------


@dataclass
class Transfer:
    job_id: int
    is_store: bool
    gpu: GPULoadStoreSpec
    cpu: CPULoadStoreSpec
    remaining: Delay


class FakeTransferWorker(OffloadingWorker):
    """Records transfers and completes them on the harness's schedule; copies tags only."""

    def __init__(self) -> None:
        self.engine: FenceEngine | None = None  # set by the engine once both exist
        self.in_flight: dict[int, Transfer] = {}
        self.done: list[TransferResult] = []
        self.submitted: dict[int, Transfer] = {}  # every transfer ever submitted
        self.flushed: set[int] = set()  # job ids passed to wait()
        self.order: list[tuple[str, int]] = []  # ("submit"|"wait", job id), in order

    def _submit(self, job_id: int, is_store: bool, gpu: Any, cpu: Any) -> bool:
        assert self.engine is not None
        assert isinstance(gpu, GPULoadStoreSpec)
        assert isinstance(cpu, CPULoadStoreSpec)
        if job_id in self.submitted:
            raise AssertionError(f"job {job_id} submitted twice to the worker")
        transfer = Transfer(job_id, is_store, gpu, cpu, self.engine.delay_of(job_id))
        self.in_flight[job_id] = transfer
        self.submitted[job_id] = transfer
        self.order.append(("submit", job_id))
        if is_store:
            self.engine.contents.check_store_source(transfer, self.engine.step_no)
        else:
            self.engine.contents.apply_load(transfer, self.engine.step_no)
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self._submit(job_id, True, src_spec, dst_spec)

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        return self._submit(job_id, False, dst_spec, src_spec)

    def _complete(self, job_id: int) -> None:
        transfer = self.in_flight.pop(job_id)
        assert self.engine is not None
        if transfer.is_store:
            self.engine.contents.finish_store(transfer, self.engine.step_no)
        self.done.append(TransferResult(job_id=job_id, success=True))

    def wait(self, job_ids: set[int]) -> None:
        for job_id in sorted(job_ids):
            self.order.append(("wait", job_id))
            self.flushed.add(job_id)
            if job_id in self.in_flight:
                self._complete(job_id)
            elif job_id not in self.submitted:
                raise AssertionError(f"wait() on job {job_id}, which was never submitted")

    def tick(self) -> None:
        """One step of transfer progress: complete what is due."""
        for job_id, transfer in sorted(self.in_flight.items()):
            if transfer.remaining is None:
                continue
            if transfer.remaining <= 0:
                self._complete(job_id)
            else:
                transfer.remaining -= 1

    def release(self) -> None:
        """Let every held transfer (delay None) complete at the next tick."""
        for transfer in self.in_flight.values():
            transfer.remaining = 0

    def get_finished(self) -> list[TransferResult]:
        done, self.done = self.done, []
        return done


class RequestLevelCPUManager(CPUOffloadingManager):
    """The CPU tier, asking for every chunk of every request (``REQUEST_LEVEL``), as a
    tier that needs a request's whole KV context does: prefix hits are stored too."""

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        super().on_new_request(req_context)
        return RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL)


class FenceOffloadingSpec(OffloadingSpec):
    """The real CPU tier's manager (scheduler side) and the fake worker (worker side)."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        self._manager: OffloadingManager | None = None
        self.worker = FakeTransferWorker()

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            manager_cls = (
                RequestLevelCPUManager
                if self.extra_config.get("request_level")
                else CPUOffloadingManager
            )
            self._manager = manager_cls(
                num_chunks=int(self.extra_config["cpu_chunks"]), cache_policy="lru"
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        return self.worker


# ---------------------------------------------------------------------------------
# Block contents
# ---------------------------------------------------------------------------------


# What a block holds: a block hash (bytes), or (request, block index, tokens computed)
# as written by a forward pass, which resolves to the hash once the block is full.
Tag = Any


@dataclass
class StoreRead:
    job_id: int
    expected: Tag
    where: str  # "request r, group g, block i"


class Contents:
    """GPU and CPU contents as tags; every write is checked against in-flight stores."""

    def __init__(self, engine: FenceEngine) -> None:
        self.engine = engine
        self.gpu: dict[int, Tag] = {}
        self.cpu: dict[tuple[int, int], Tag] = {}  # (chunk id, block within chunk)
        self.reading: dict[int, list[StoreRead]] = {}  # block id -> stores reading it
        self.violations: list[str] = []

    def _fail(self, message: str) -> None:
        # Raised by the engine at the end of the step: raising here, inside the
        # worker connector's calls, would leave its queues half-updated.
        self.violations.append(message)

    def _positions(self, transfer: Transfer) -> Iterable[tuple[int, int, int, tuple[int, int]]]:
        """(group, block index in the request, GPU block id, CPU address) per block: the
        CPU spec lists one chunk per offload key, in the order of the blocks."""
        bpc = self.engine.blocks_per_chunk
        chunk_ids = [int(c) for c in transfer.cpu.block_ids]
        ordinal, last = -1, None
        for group, index, block_id in self.engine.job_places[transfer.job_id]:
            if (group, index // bpc) != last:
                ordinal, last = ordinal + 1, (group, index // bpc)
            yield group, index, block_id, (chunk_ids[ordinal], index % bpc)

    def expected_tag(self, req_id: str, group: int, index: int) -> Tag:
        """The hash of the prefix that ends with block ``index`` of ``group`` (hashes
        are chained, at the hash block size, which divides every group's)."""
        per_block = self.engine.group_block_sizes[group] // self.engine.hash_block_size
        return self.engine.requests[req_id].block_hashes[(index + 1) * per_block - 1]

    def check_store_source(self, transfer: Transfer, step: int) -> None:
        job = self.engine.store_jobs[transfer.job_id]
        known = transfer.job_id in self.engine.stores_after_preemption
        if known and PREEMPTED_THEN_FINISHED in self.engine.tolerate:
            # A known vLLM bug: recorded, not reported again.
            self.engine.known_bug_hits.append((PREEMPTED_THEN_FINISHED, transfer.job_id))
            return
        for group, index, block_id, _ in self._positions(transfer):
            where = f"request {job.req_id}, group {group}, block index {index}"
            if block_id == 0:
                self._fail(
                    f"step {step}: store job {transfer.job_id} reads the null block ({where})"
                )
                continue
            expected = self.expected_tag(job.req_id, group, index)
            actual = self.resolve(self.gpu.get(block_id))
            if actual != expected:
                self._fail(
                    f"step {step}: store job {transfer.job_id} reads block {block_id} "
                    f"({where}) but it holds {_show(actual)}, not the data of its key "
                    f"{_show(expected)}"
                )
            self.reading.setdefault(block_id, []).append(
                StoreRead(transfer.job_id, expected, where)
            )

    def finish_store(self, transfer: Transfer, step: int) -> None:
        for _, _index, block_id, address in self._positions(transfer):
            reads = self.reading.get(block_id, [])
            for read in [r for r in reads if r.job_id == transfer.job_id]:
                reads.remove(read)
                self.cpu[address] = read.expected
            if not reads:
                self.reading.pop(block_id, None)

    def resolve(self, tag: Tag) -> Tag:
        """A block written by a forward pass holds its request's block hash once the
        block is full (with async scheduling the hash is known a step later)."""
        if isinstance(tag, tuple):
            req_id, group, index, end = tag
            size = self.engine.group_block_sizes[group]
            hashes = len(self.engine.requests[req_id].block_hashes)
            if (
                end >= (index + 1) * size
                and (index + 1) * size <= hashes * self.engine.hash_block_size
            ):
                return self.expected_tag(req_id, group, index)
        return tag

    def write(self, block_id: int, tag: Tag, step: int, by: str) -> None:
        for read in self.reading.get(block_id, ()):
            if read.expected != self.resolve(tag):
                self._fail(
                    f"step {step}: block {block_id} overwritten by {by} while store job "
                    f"{read.job_id} still reads it ({read.where}): the fence did not "
                    f"flush job {read.job_id}"
                )
        self.gpu[block_id] = tag

    def apply_load(self, transfer: Transfer, step: int) -> None:
        job = self.engine.load_jobs[transfer.job_id]
        for group, index, block_id, address in self._positions(transfer):
            expected = self.expected_tag(job.req_id, group, index)
            loaded = self.cpu.get(address)
            if loaded != expected:
                self._fail(
                    f"step {step}: load job {transfer.job_id} brings {_show(loaded)} into "
                    f"block {block_id} (request {job.req_id}, block index {index}), "
                    f"expected {_show(expected)}"
                )
            self.write(block_id, expected, step, f"load job {transfer.job_id}")

    def remote_load(
        self, req_id: str, start: int, end: int, tables: tuple[list[int], ...], step: int
    ) -> None:
        """Another connector loads tokens ``[start, end)`` of ``req_id`` (whole blocks)."""
        for group, table in enumerate(tables):
            bs = self.engine.group_block_sizes[group]
            for index in range(start // bs, end // bs):
                if index < len(table) and table[index] != 0:
                    tag = self.expected_tag(req_id, group, index)
                    self.write(table[index], tag, step, f"a remote load for {req_id}")

    def forward(self, output: SchedulerOutput, step: int) -> None:
        """The forward pass: write each computed block's tag."""
        for req_id, n in output.num_scheduled_tokens.items():
            request = self.engine.requests[req_id]
            end = request.num_computed_tokens
            start = end - n
            tables = self.engine.scheduler.kv_cache_manager.get_block_ids(req_id)
            for group, table in enumerate(tables):
                bs = self.engine.group_block_sizes[group]
                for index in range(start // bs, (end - 1) // bs + 1):
                    tag = (req_id, group, index, end)
                    if index < len(table) and table[index] != 0:
                        self.write(table[index], tag, step, f"the forward pass of {req_id}")


def _show(tag: Tag) -> str:
    if isinstance(tag, bytes):
        return f"hash {tag.hex()[:8]}"
    return repr(tag)


# ---------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """What one engine step did, for expectations and for the oracle."""

    step: int
    output: SchedulerOutput
    store_jobs: dict[int, TransferJob]
    load_jobs: dict[int, TransferJob]
    jobs_to_flush: set[int]
    # GPU block id -> the (request, group, block index) places it was handed to this step
    allocated: dict[int, set[tuple[str, int, int]]]
    fence_before: dict[int, frozenset[int]]  # the fence as schedule() found it
    jobs_before: dict[str, frozenset[int]]  # each tracked request's jobs, likewise
    tables: dict[tuple[str, int, int], int]  # (request, group, index) -> block, after it


@dataclass
class Plan:
    """A request to run: its prompt, how many tokens it generates, when it arrives."""

    prompt: Sequence[int]
    max_tokens: int
    arrive_at: int = 0
    req_id: str | None = None
    abort_at: int | None = None  # abort after this many steps since arrival


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
        delay: Delay | Callable[[int, bool], Delay] = 0,
        max_num_batched_tokens: int = 64,
        request_level: bool = False,
        remote_source: bool = False,
        retention_interval: int | None = 0,
        eagle: bool = False,
        tolerate: Sequence[str] = (),
        post_step_fns: Sequence[Callable[[FenceEngine], None]] = (),
        strict_contents: bool = True,
    ) -> None:
        self.blocks_per_chunk = blocks_per_chunk
        self.async_scheduling = async_scheduling
        self.layout = layout
        self.workers = workers
        self.second_worker_lag = second_worker_lag
        self._delay = delay
        self.post_step_fns: list[Callable[[FenceEngine], None]] = list(post_step_fns)
        self.strict_contents = strict_contents
        self.step_no = 0
        self.requests: dict[str, Request] = {}
        self.store_jobs: dict[int, TransferJob] = {}
        self.load_jobs: dict[int, TransferJob] = {}
        # job id -> (group, block index in the request, GPU block id), per source block
        self.job_places: dict[int, list[tuple[int, int, int]]] = {}
        self.tolerate = frozenset(tolerate)
        self.stores_after_preemption: set[int] = set()  # built with no computed KV left
        self.known_bug_hits: list[tuple[str, int]] = []
        self.history: list[StepRecord] = []
        self.reset_since_last_step = False
        self._violations_seen = 0
        self._ids = itertools.count()
        self._pending_output: tuple[SchedulerOutput, ModelRunnerOutput] | None = None
        self._echo: list[tuple[int, int]] = []  # (due step, job id) of the second worker
        self._held_recving: dict[int, str] = {}  # load job -> request, until rank 2 reports

        if sliding_block_size not in (None, block_size) and layout != "mixed":
            raise ValueError(
                f"sliding_block_size={sliding_block_size} differs from block_size="
                f"{block_size}, which needs two groups: use layout='mixed'"
            )
        groups = _kv_cache_groups(
            layout, block_size, window_blocks, eagle, sliding_block_size or block_size
        )
        self.group_block_sizes = [g.kv_cache_spec.block_size for g in groups]
        config = vllm_config(
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            blocks_per_chunk=blocks_per_chunk,
            async_scheduling=async_scheduling,
            cpu_chunks=cpu_chunks,
            workers=workers,
            max_num_batched_tokens=max_num_batched_tokens,
            request_level=request_level,
            remote_source=remote_source,
            retention_interval=retention_interval,
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=num_gpu_blocks,
            kv_cache_tensors=[
                KVCacheTensor(
                    size=g.kv_cache_spec.page_size_bytes * num_gpu_blocks,
                    layers=list(g.layer_names),
                    layer_stride=g.kv_cache_spec.page_size_bytes * num_gpu_blocks,
                    block_stride=g.kv_cache_spec.page_size_bytes,
                )
                for g in groups
            ],
            kv_cache_groups=groups,
            # as vLLM's kv_cache_planning does: the KV-cache manager and the
            # connector read the same retention
            prefix_cache_retention_interval=retention_interval,
        )
        # as vLLM's engine core does: with several block sizes, the scheduler steps in
        # their lcm and hashes in their gcd
        scheduler_block_size, self.hash_block_size = resolve_kv_cache_block_sizes(
            kv_cache_config, config
        )
        kv_cache_config.hash_block_size = self.hash_block_size
        kv_cache_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
            kv_cache_config, config, scheduler_block_size, self.hash_block_size
        )
        self.vllm_config = config
        scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
        self.scheduler = scheduler_cls(
            vllm_config=config,
            kv_cache_config=kv_cache_config,
            log_stats=False,
            structured_output_manager=StructuredOutputManager(config),
            block_size=scheduler_block_size,
            hash_block_size=self.hash_block_size,
        )
        self.remote_source = remote_source
        self.connector = self._scheduler_side()
        self.worker_connector = self._worker_side(config, kv_cache_config, num_gpu_blocks)
        self.contents = Contents(self)

        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(self.hash_block_size, sha256)
        self._ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})

    def _scheduler_side(self) -> OffloadingConnectorScheduler:
        connector = self.scheduler.connector
        if self.remote_source:  # MultiConnector: the OffloadingConnector, then the remote
            assert isinstance(connector, MultiConnector)
            connector = connector.sub_connectors[0]
            fence_remote.ENGINE = self
        assert isinstance(connector, OffloadingConnector)
        assert connector.connector_scheduler is not None
        return connector.connector_scheduler

    def _worker_side(
        self, config: VllmConfig, kv_cache_config: KVCacheConfig, num_gpu_blocks: int
    ) -> OffloadingConnector | MultiConnector:
        """The worker-role connector, its KV caches registered; finds the fake worker."""
        worker_cls = MultiConnector if self.remote_source else OffloadingConnector
        worker_connector = worker_cls(config, KVConnectorRole.WORKER, kv_cache_config)
        caches = {
            name: torch.zeros(
                num_gpu_blocks, 2, g.kv_cache_spec.block_size, 1, 1, dtype=torch.float32
            )
            for g in kv_cache_config.kv_cache_groups
            for name in g.layer_names
        }
        with set_current_vllm_config(config):
            worker_connector.register_kv_caches(caches)
        offloading = (
            worker_connector.sub_connectors[0]
            if isinstance(worker_connector, MultiConnector)
            else worker_connector
        )
        assert isinstance(offloading, OffloadingConnector)
        assert offloading.connector_worker is not None
        spec = offloading.connector_worker.spec
        assert isinstance(spec, FenceOffloadingSpec)
        self.worker = spec.worker
        self.worker.engine = self
        return worker_connector

    # -- configuration hooks -----------------------------------------------------

    def delay_of(self, job_id: int) -> Delay:
        return (
            self._delay(job_id, job_id in self.store_jobs) if callable(self._delay) else self._delay
        )

    @property
    def fence(self) -> dict[int, set[int]]:
        return self.connector._block_id_to_pending_jobs

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
        """Preempt every running request now, as the engine's
        reset_prefix_cache(reset_running_requests=True) does (it also empties the GPU
        prefix cache); the next schedule() reports them preempted."""
        self.scheduler.reset_prefix_cache(reset_running_requests=True)

    def reset_cache(self) -> bool:
        """The engine's reset_prefix_cache(reset_connector=True), between steps.

        Not twice without a step between: the connector keeps the first reset's
        flush set for the next step and asserts it is empty on the second reset.
        """
        if self.reset_since_last_step:
            raise ValueError("reset_cache twice without a step between")
        self._flush_async_output()
        done = self.scheduler.reset_prefix_cache(reset_connector=True)
        self.reset_since_last_step = True
        return done

    def _held_only(self) -> bool:
        """Nothing can progress without the test: every transfer left is held."""
        return (
            not self._echo
            and all(t.remaining is None for t in self.worker.in_flight.values())
            and not (self.connector._jobs.keys() - self.worker.in_flight.keys())
        )

    def busy(self) -> bool:
        """Whether the engine would take another step: requests, or the connector's
        pending work (in-flight jobs, a reset's unreported flushes), or transfers."""
        return bool(
            self.scheduler.has_requests()
            or self.connector._jobs
            or self.worker.in_flight
            or self._echo
        )

    def drain(self, max_steps: int = 300) -> None:
        """Release every held transfer and step until the engine is idle."""
        for _ in range(max_steps):
            self.worker.release()
            if not self.busy():
                self._flush_async_output()
                if not self.busy():
                    return
            self.step()
        raise AssertionError(f"the engine did not drain within {max_steps} steps")

    # -- stepping ------------------------------------------------------------------

    def block_tables(self) -> dict[tuple[str, int, int], int]:
        tables: dict[tuple[str, int, int], int] = {}
        managers = self.scheduler.kv_cache_manager.coordinator.single_type_managers
        for group, manager in enumerate(managers):
            for req_id, blocks in manager.req_to_blocks.items():
                for index, block in enumerate(blocks):
                    if block.block_id != 0:
                        tables[(req_id, group, index)] = block.block_id
        return tables

    def step(self) -> StepRecord:
        self.step_no += 1
        step = self.step_no
        before = self.block_tables()
        fence_before = {b: frozenset(j) for b, j in self.fence.items()}
        jobs_before = {r: frozenset(s.transfer_jobs) for r, s in self.connector._req_status.items()}
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
        )
        self.store_jobs.update(meta.store_jobs)
        self.load_jobs.update(meta.load_jobs)
        for job_id, job in meta.store_jobs.items():
            request = self.requests[job.req_id]
            if (
                request.is_finished()
                and request.num_preemptions
                and not request.num_computed_tokens
            ):
                self.stores_after_preemption.add(job_id)
            status = self.connector._req_status[job.req_id]
            lists = [g.block_ids for g in status.group_states]
            self.job_places[job_id] = spec_places(job.src_spec, lists)
        for job_id, job in meta.load_jobs.items():
            self.job_places[job_id] = spec_places(job.dst_spec)
        self.history.append(record)
        self.reset_since_last_step = False

        # The worker side, in the model runner's order.
        assert full_meta is not None
        self.worker_connector.handle_preemptions(full_meta)
        self.worker_connector.bind_connector_metadata(full_meta)
        self.worker_connector.start_load_kv(self._ctx)
        self.contents.forward(output, step)
        self.worker_connector.wait_for_save()
        self.worker.tick()
        finished_sending, finished_recving = self.worker_connector.get_finished(
            output.finished_req_ids
        )
        worker_meta = self.worker_connector.build_connector_worker_meta()
        self.worker_connector.clear_connector_metadata()
        worker_meta, finished_recving = self._second_worker(worker_meta, finished_recving)

        runner_output = self._runner_output(
            output,
            KVConnectorOutput(
                finished_sending=finished_sending or None,
                finished_recving=finished_recving or None,
                kv_connector_worker_meta=worker_meta,
            ),
        )
        if self.async_scheduling:
            self._flush_async_output()
            self._pending_output = (output, runner_output)
        else:
            self.scheduler.update_from_output(output, runner_output)
        for fn in self.post_step_fns:
            fn(self)
        fresh = self.contents.violations[self._violations_seen :]
        self._violations_seen = len(self.contents.violations)
        if fresh and self.strict_contents:
            raise ContentViolation("\n".join(fresh))
        return record

    def _flush_async_output(self) -> None:
        if self._pending_output is not None:
            output, runner_output = self._pending_output
            self._pending_output = None
            self.scheduler.update_from_output(output, runner_output)

    def _second_worker(
        self, meta: KVConnectorWorkerMetadata | None, recving: set[str] | None
    ) -> tuple[Any, set[str] | None]:
        """With two workers, a second rank reports each job ``second_worker_lag``
        steps after the first (it ran the same transfer, a little slower). A request
        whose load finished counts as loaded only once both ranks have said so, as
        vLLM's output aggregator does. Under MultiConnector, the OffloadingConnector's
        part of the metadata is the first."""
        if self.workers == 1:
            return meta, recving
        multi = meta if isinstance(meta, MultiKVConnectorWorkerMetadata) else None
        own = multi.metadata[0] if multi is not None else meta
        assert own is None or isinstance(own, OffloadingWorkerMetadata)
        for job_id in own.completed_jobs if own else ():
            self._echo.append((self.step_no + self.second_worker_lag, job_id))
        recving = set(recving or ())
        for job_id, job in self.load_jobs.items():
            if job.req_id in recving and any(j == job_id for _, j in self._echo):
                recving.discard(job.req_id)
                self._held_recving[job_id] = job.req_id
        due = [job for when, job in self._echo if when <= self.step_no]
        self._echo = [(when, job) for when, job in self._echo if when > self.step_no]
        recving.update(self._held_recving.pop(job) for job in due if job in self._held_recving)
        if due:
            echo = OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(due, 1))
            own = own.aggregate(echo) if own else echo
        if not self.remote_source:
            return own, recving or None
        others = multi.metadata[1:] if multi is not None else (None,)
        if own is None and not any(others):
            return None, recving or None
        return MultiKVConnectorWorkerMetadata(metadata=(own, *others)), recving or None

    def _runner_output(
        self, output: SchedulerOutput, kv_output: KVConnectorOutput
    ) -> ModelRunnerOutput:
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            request = self.requests[req_id]
            computed = request.num_computed_tokens
            if computed < request.num_prompt_tokens:
                sampled.append([])  # a chunk of the prompt: nothing sampled yet
            else:
                sampled.append([_token(req_id, computed)])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=kv_output,
        )

    def run(self, plans: Sequence[Plan] = (), *, max_steps: int = 500) -> list[StepRecord]:
        """Step until every planned request has finished and every transfer has
        completed or is held (see :meth:`drain` to release them); requests arrive at
        their ``arrive_at`` step (counted from this call)."""
        records: list[StepRecord] = []
        waiting = sorted(plans, key=lambda p: p.arrive_at)
        start = self.step_no
        arrived: dict[str, int] = {}
        for _ in range(max_steps):
            now = self.step_no - start
            while waiting and waiting[0].arrive_at <= now:
                plan = waiting.pop(0)
                req_id = self.add_request(plan.prompt, plan.max_tokens, plan.req_id)
                if plan.abort_at is not None:
                    arrived[req_id] = plan.abort_at + now
            for req_id, when in list(arrived.items()):
                if when <= now and not self.requests[req_id].is_finished():
                    self.abort(req_id)
                    del arrived[req_id]
            if not waiting and not self.scheduler.has_unfinished_requests():
                self._flush_async_output()
                if not self.busy() or self._held_only():
                    break
            records.append(self.step())
        else:
            raise AssertionError(f"the engine did not settle within {max_steps} steps")
        self._flush_async_output()
        return records

    # -- what happened -------------------------------------------------------------

    def stored_positions(self) -> set[tuple[str, int, int]]:
        """(request, group, block index) of every block a completed store read."""
        return self._positions(lambda t: t.is_store and t.job_id not in self.worker.in_flight)

    def loaded_positions(self) -> set[tuple[str, int, int]]:
        return self._positions(lambda t: not t.is_store)

    def flushed_jobs(self) -> set[int]:
        return set(self.worker.flushed)

    def _positions(self, keep: Callable[[Transfer], bool]) -> set[tuple[str, int, int]]:
        found: set[tuple[str, int, int]] = set()
        for transfer in self.worker.submitted.values():
            if not keep(transfer):
                continue
            jobs = self.store_jobs if transfer.is_store else self.load_jobs
            req_id = jobs[transfer.job_id].req_id
            for group, index, _, _ in self.contents._positions(transfer):
                found.add((req_id, group, index))
        return found


def spec_places(
    spec: LoadStoreSpec, lists: Sequence[Sequence[int]] | None = None
) -> list[tuple[int, int, int]]:
    """(group, block index in the request, GPU block id) of each block of a GPU spec.

    ``block_indices`` gives the index of each group's first block. A store may skip
    chunks in between (unreachable or null sliding-window chunks), so its later blocks
    are found in ``lists``, the request's block ids per group as the connector had
    them when it built the store; without ``lists`` the blocks are taken as contiguous.
    """
    assert isinstance(spec, GPULoadStoreSpec)
    ids = [int(b) for b in spec.block_ids]
    places: list[tuple[int, int, int]] = []
    offset = 0
    for group, (size, first) in enumerate(zip(spec.group_sizes, spec.block_indices, strict=True)):
        index = first
        for block in ids[offset : offset + size]:
            if lists is not None:
                while lists[group][index] != block:
                    index += 1
            places.append((group, index, block))
            index += 1
        offset += size
    return places


def _token(req_id: str, position: int) -> int:
    """A deterministic, request-specific token: outputs of different requests differ."""
    return 1000 + zlib.crc32(f"{req_id}:{position}".encode()) % 20000  # not hash(): seeded


def _kv_cache_groups(
    layout: Layout, block_size: int, window_blocks: int, eagle: bool, sliding_block_size: int
) -> list[KVCacheGroupSpec]:
    common = {"num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    full = KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=block_size, **common))  # type: ignore[arg-type]
    sliding = KVCacheGroupSpec(
        ["sliding"],
        SlidingWindowSpec(
            block_size=sliding_block_size,
            sliding_window=window_blocks * sliding_block_size,
            **common,  # type: ignore[arg-type]
        ),
        # an EAGLE drafter's group, as the model runner tags it; no drafter runs
        is_eagle_group=eagle,
    )
    return {"full": [full], "sliding": [sliding], "mixed": [full, sliding]}[layout]


def vllm_config(
    *,
    block_size: int,
    num_gpu_blocks: int,
    blocks_per_chunk: int = 1,
    async_scheduling: bool = False,
    cpu_chunks: int = 64,
    workers: int = 1,
    max_num_batched_tokens: int = 64,
    request_level: bool = False,
    remote_source: bool = False,
    retention_interval: int | None = 0,
) -> VllmConfig:
    """A real vLLM config with the OffloadingConnector over :class:`FenceOffloadingSpec`."""
    model = ModelConfig(model=MODEL, dtype="float16", seed=0)
    scheduler = SchedulerConfig(
        max_num_seqs=min(16, max_num_batched_tokens),
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=4096,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        disable_hybrid_kv_cache_manager=False,
        async_scheduling=async_scheduling,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=True)
    cache.num_gpu_blocks = num_gpu_blocks
    cache.prefix_cache_retention_interval = retention_interval
    extra: dict[str, Any] = {
        "spec_name": FenceOffloadingSpec.__name__,
        "spec_module_path": __name__,
        "cpu_chunks": cpu_chunks,
        "offload_prompt_only": False,
        "request_level": request_level,
    }
    if blocks_per_chunk > 1:
        extra["blocks_per_chunk"] = blocks_per_chunk
    offloading = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }
    remote = {
        "kv_connector": fence_remote.RemoteKVSource.__name__,
        "kv_connector_module_path": fence_remote.__name__,
        "kv_role": "kv_both",
    }
    transfer = (
        KVTransferConfig(
            kv_connector="MultiConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"connectors": [offloading, remote]},
        )
        if remote_source
        else KVTransferConfig(**offloading)  # type: ignore[arg-type]
    )
    config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=cache,
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=transfer,
    )
    config.parallel_config.world_size = workers
    return config
