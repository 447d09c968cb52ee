"""The model runner's side of a fence engine: the worker-role connector, driven as a
GPU model runner drives it, and the fake second rank of a two-worker engine.

:class:`WorkerSide` builds the worker-role OffloadingConnector (or MultiConnector,
with :class:`fence_remote.RemoteKVSource`), registers its KV caches, finds the
:class:`fence_transfers.FakeTransferWorker` vLLM built for it, and executes a step:
preemptions, loads, the forward pass, stores, transfer progress and the output.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, KeysView, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fence_remote
import torch
from fence_config import EngineConfig
from fence_transfers import FakeTransferWorker, FenceOffloadingSpec
from vllm.config import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
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
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.forward_context import ForwardContext
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request

if TYPE_CHECKING:
    from fence_contents import Contents

_TAKES_INDEX = "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding as the model runner plays it: after each step a drafter
    proposes ``drafts(request, step)`` tokens (at most ``tokens``, vLLM's
    ``num_speculative_tokens``) for each request of the batch, and in the step that
    verifies them the target model accepts the first ``accepted(request, step,
    drafts)`` of them. A rejected draft's KV stays in its slot until a later step
    writes that position again (the content model tracks it)."""

    tokens: int
    drafts: Callable[[str, int], int]
    accepted: Callable[[str, int, int], int]


class WorkerSide:
    """The worker-role connector, its KV caches registered, and the fake worker it
    found; ``requests`` and ``load_jobs`` are the engine's, read as the runner would."""

    def __init__(
        self,
        config: EngineConfig,
        requests: Mapping[str, Request],
        load_jobs: Mapping[int, TransferJob],
        *,
        remote_source: bool,
        workers: int,
        second_worker_lag: int,
        second_rank_writes: bool = True,
    ) -> None:
        self.requests = requests
        # per request of the last step executed, the drafts it rejected, and the
        # tokens the scheduler counted computed at that step's end (those drafts
        # among them, until it takes the step's output: see counted())
        self.rejected: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        worker_cls = MultiConnector if remote_source else OffloadingConnector
        self.connector = worker_cls(config.vllm, KVConnectorRole.WORKER, config.kv_cache)
        caches = {
            name: torch.zeros(
                config.num_gpu_blocks, 2, g.kv_cache_spec.block_size, 1, 1, dtype=torch.float32
            )
            for g in config.kv_cache.kv_cache_groups
            for name in g.layer_names
        }
        with set_current_vllm_config(config.vllm):
            self.connector.register_kv_caches(caches)
        offloading = (
            fence_remote.first_connector(self.connector)
            if isinstance(self.connector, MultiConnector)
            else self.connector
        )
        assert isinstance(offloading, OffloadingConnector)
        assert offloading.connector_worker is not None
        spec = offloading.connector_worker.spec
        assert isinstance(spec, FenceOffloadingSpec)
        self.worker: FakeTransferWorker = spec.worker
        replica = (
            _non_writer_rank(offloading.connector_worker, config, caches)
            if workers > 1 and not second_rank_writes
            else None
        )
        self.second_rank = (
            SecondRank(second_worker_lag, load_jobs, remote_source, replica)
            if workers > 1
            else None
        )
        self._ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})

    def reports_pending(self) -> bool:
        """Whether the second rank has yet to report a job the first one has."""
        return bool(self.second_rank and self.second_rank.echo)

    def busy(self) -> bool:
        """Transfers in flight, or reports still due."""
        return bool(self.worker.in_flight or self.reports_pending())

    def held_only(self, jobs: KeysView[int]) -> bool:
        """Nothing can progress without the test: no report is due, every transfer in
        flight is held, and every one of the connector's ``jobs`` is in flight."""
        return (
            not self.reports_pending()
            and all(t.remaining is None for t in self.worker.in_flight.values())
            and not (jobs - self.worker.in_flight.keys())
        )

    def execute(
        self,
        output: SchedulerOutput,
        step: int,
        contents: Contents,
        speculation: Speculation | None = None,
        *,
        behind: bool = False,
    ) -> ModelRunnerOutput:
        """One step, in the model runner's order. ``behind``: the scheduler has not
        taken the previous step's output yet (an async step), so it counts that
        step's rejected drafts as computed: the runner, which knows them, computes
        each request's tokens that many positions lower (:attr:`rejected`)."""
        shift = self._shift(output) if behind else {}
        # how many of its scheduled drafts the target model accepts, per request
        accepted = {
            req_id: speculation.accepted(req_id, step, len(drafts)) if speculation else 0
            for req_id, drafts in output.scheduled_spec_decode_tokens.items()
        }
        self.rejected = {
            req_id: len(drafts) - accepted[req_id]
            for req_id, drafts in output.scheduled_spec_decode_tokens.items()
        }
        meta = output.kv_connector_metadata
        assert meta is not None
        if self.second_rank is not None:
            # its own copy, as every rank deserializes its own: rank 0 pops from it
            self.second_rank.handle_preemptions(meta)
        self.connector.handle_preemptions(meta)
        self.connector.bind_connector_metadata(meta)
        self.connector.start_load_kv(self._ctx)
        contents.forward(output, step, accepted, shift)
        self.connector.wait_for_save()
        self.worker.tick()
        finished_sending, finished_recving = self.connector.get_finished(output.finished_req_ids)
        worker_meta = self.connector.build_connector_worker_meta()
        self.connector.clear_connector_metadata()
        if self.second_rank is not None:
            worker_meta, finished_recving = self.second_rank.report(
                worker_meta, finished_recving, step
            )
        kv_output = KVConnectorOutput(
            finished_sending=finished_sending or None,
            finished_recving=finished_recving or None,
            kv_connector_worker_meta=worker_meta,
        )
        return self._runner_output(output, kv_output, accepted, shift)

    def counted(self) -> None:
        """Once the step's output went to the scheduler (async: the step before's),
        note the tokens it counts computed for each request that rejected drafts."""
        self.counts = {r: self.requests[r].num_computed_tokens for r in self.rejected}

    def _shift(self, output: SchedulerOutput) -> dict[str, int]:
        """Per request of this step, the drafts the step before rejected that the
        scheduler still counts computed: those of a request this step goes on from
        where the step before left its count (one preempted between, say, starts
        again from its real tokens)."""
        return {
            req_id: self.rejected[req_id]
            for req_id, n in output.num_scheduled_tokens.items()
            if self.rejected.get(req_id)
            and self.requests[req_id].num_computed_tokens - n == self.counts.get(req_id)
        }

    def drafts(self, output: SchedulerOutput, step: int, speculation: Speculation) -> DraftTokenIds:
        """The drafter's proposals after step ``step``, for each request of its batch
        (the scheduler ignores those of a request still in its prefill)."""
        req_ids = [r for r in output.num_scheduled_tokens if not self.requests[r].is_finished()]
        proposed = []
        for req_id in req_ids:
            first = self.requests[req_id].num_tokens  # the first position drafted
            count = speculation.drafts(req_id, step)
            proposed.append([_draft(req_id, p) for p in range(first, first + count)])
        return DraftTokenIds(req_ids=req_ids, draft_token_ids=proposed)

    def _runner_output(
        self,
        output: SchedulerOutput,
        kv_output: KVConnectorOutput,
        accepted: Mapping[str, int],
        shift: Mapping[str, int],
    ) -> ModelRunnerOutput:
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            request = self.requests[req_id]
            computed = request.num_computed_tokens
            if computed < request.num_tokens:
                # a chunk of the prompt, or of a preempted request's recompute that
                # stops short of its last token: vLLM's model runner discards what it
                # samples for a request whose tokens this step leaves uncomputed
                sampled.append([])
            elif req_id in accepted:
                # the drafts it accepts, then the target model's own next token (an
                # async step's drafts are placeholders here: the runner's own ids)
                drafts = len(output.scheduled_spec_decode_tokens[req_id])
                kept = accepted[req_id]
                bonus = computed - shift.get(req_id, 0) - drafts + kept  # its position
                kept_drafts = [_draft(req_id, p) for p in range(bonus - kept, bonus)]
                sampled.append([*kept_drafts, _token(req_id, bonus)])
            else:
                sampled.append([_token(req_id, computed)])
        # vLLM 0.28.0-0.33.0 also take each request's index; 0.34.0 reads it off req_ids
        index = {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}} if _TAKES_INDEX else {}
        return ModelRunnerOutput(
            req_ids=req_ids,
            **index,
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=kv_output,
        )


def _non_writer_rank(
    first: OffloadingConnectorWorker | None, config: EngineConfig, caches: dict[str, torch.Tensor]
) -> OffloadingConnectorWorker | None:
    """Rank 1 of a replicated layout (a pure-MLA model's ranks hold the same bytes, and
    only rank 0 writes the shared host copy): vLLM's own worker-side connector,
    which acknowledges every store without running it. None on a release that has no
    non-writer ranks (its worker has no ``_is_store_writer``)."""
    assert first is not None
    spec_config = first.spec.config
    if not hasattr(spec_config, "replicated_layout") or not hasattr(spec_config, "parallel"):
        return None
    replica_config = dataclasses.replace(
        spec_config,
        replicated_layout=True,
        parallel=dataclasses.replace(spec_config.parallel, rank=1),
    )
    replica = OffloadingConnectorWorker(
        FenceOffloadingSpec(replica_config), config.vllm, config.kv_cache
    )
    if getattr(replica, "_is_store_writer", True):
        return None
    with set_current_vllm_config(config.vllm):
        replica.register_kv_caches(caches)
    return replica


class SecondRank:
    """A second worker rank: it reports each job ``lag`` steps after the first (it ran
    the same transfer, a little slower). A request whose load finished counts as
    loaded only once both ranks have said so, as vLLM's output aggregator does.

    With ``replica`` (a non-writer rank, see :func:`_non_writer_rank`), stores are
    that real connector's business: it acknowledges them itself, at once, flushed
    ones included (``handle_preemptions``); only loads are echoed."""

    def __init__(
        self,
        lag: int,
        load_jobs: Mapping[int, TransferJob],
        remote_source: bool,
        replica: OffloadingConnectorWorker | None = None,
    ):
        self.lag = lag
        self.load_jobs = load_jobs
        self.remote_source = remote_source
        self.replica = replica
        self.replica_meta: OffloadingConnectorMetadata | None = None
        self.echo: list[tuple[int, int]] = []  # (due step, job id), not yet reported
        self.held_recving: dict[int, str] = {}  # load job -> request, until it reports

    def handle_preemptions(self, meta: KVConnectorMetadata) -> None:
        """The step's metadata reaches the rank: a non-writer runs its flushes."""
        if self.replica is None:
            return
        own = meta.metadata[0] if isinstance(meta, MultiKVConnectorMetadata) else meta
        assert isinstance(own, OffloadingConnectorMetadata)
        flush = own.jobs_to_flush
        self.replica_meta = OffloadingConnectorMetadata(
            load_jobs=dict(own.load_jobs),
            store_jobs=dict(own.store_jobs),
            jobs_to_flush=set(flush) if flush is not None else None,
        )
        self.replica.handle_preemptions(self.replica_meta)

    def _replica_reports(self) -> OffloadingWorkerMetadata | None:
        """The non-writer's acknowledgements of this step's stores (``wait_for_save``)."""
        if self.replica is None or self.replica_meta is None:
            return None
        self.replica.prepare_store_kv(self.replica_meta)
        self.replica_meta = None
        return self.replica.build_connector_worker_meta()

    def report(
        self, meta: KVConnectorWorkerMetadata | None, recving: set[str] | None, step: int
    ) -> tuple[Any, set[str] | None]:
        """Both ranks' worker metadata and finished loads, from the first rank's.
        Under MultiConnector, the OffloadingConnector's part of the metadata is the
        first."""
        multi = meta if isinstance(meta, MultiKVConnectorWorkerMetadata) else None
        own = multi.metadata[0] if multi is not None else meta
        assert own is None or isinstance(own, OffloadingWorkerMetadata)
        for job_id in own.completed_jobs if own else ():
            if self.replica is None or job_id in self.load_jobs:
                self.echo.append((step + self.lag, job_id))
        recving = set(recving or ())
        for job_id, job in self.load_jobs.items():
            if job.req_id in recving and any(j == job_id for _, j in self.echo):
                recving.discard(job.req_id)
                self.held_recving[job_id] = job.req_id
        due = [job for when, job in self.echo if when <= step]
        self.echo = [(when, job) for when, job in self.echo if when > step]
        recving.update(self.held_recving.pop(job) for job in due if job in self.held_recving)
        if due:
            echo = OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(due, 1))
            own = own.aggregate(echo) if own else echo
        acknowledged = self._replica_reports()
        if acknowledged is not None:
            own = own.aggregate(acknowledged) if own else acknowledged
        if not self.remote_source:
            return own, recving or None
        others = multi.metadata[1:] if multi is not None else (None,)
        if own is None and not any(others):
            return None, recving or None
        return MultiKVConnectorWorkerMetadata(metadata=(own, *others)), recving or None


def _token(req_id: str, position: int) -> int:
    """A deterministic, request-specific token: outputs of different requests differ."""
    return 1000 + zlib.crc32(f"{req_id}:{position}".encode()) % 20000  # not hash(): seeded


def _draft(req_id: str, position: int) -> int:
    """A draft token, never the one :func:`_token` gives that position: a rejected
    draft's KV differs from the accepted token's."""
    return 30000 + zlib.crc32(f"{req_id}:{position}".encode()) % 20000
