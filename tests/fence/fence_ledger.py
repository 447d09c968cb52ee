"""What the engine recorded: every transfer job the connector built, where each job's
blocks are, and what each step did (:class:`StepRecord`), with the queries tests ask
of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fence_contents import NULL_PLACEHOLDERS
from fence_findings import fixed
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import TransferJob
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LoadStoreSpec

# draft-completed-window-chunk-dropped, fixed: a store may read a sliding-window block
# vLLM hands to another place in the same step (flushed before that step's forward pass),
# and the connector zeroes its id once it has built the step's stores: in the request's
# lists as the step leaves them, such a block's position holds 0. The scheduler side
# then keeps the lists as they were when the stores were built (SchedulerSide).
MOVED_BLOCKS_ZEROED = fixed("draft-completed-window-chunk-dropped")

if TYPE_CHECKING:
    from fence_transfers import Transfer
    from vllm.v1.request import Request


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
    # each tracked request's next_stored_chunk_idx per group, as schedule() found them
    stored_before: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    after_reset: bool = False  # a reset_cache ran since the step before


class JobLedger:
    """The jobs of every step's connector metadata, kept after the connector forgets them."""

    def __init__(self, blocks_per_chunk: int, tail_groups: frozenset[int] = frozenset()) -> None:
        self.blocks_per_chunk = blocks_per_chunk
        # the groups whose final tail a finished request's store may reconsider
        # (non-EAGLE sliding-window groups; see stale_tail_reads)
        self.tail_groups = tail_groups
        self.store_jobs: dict[int, TransferJob] = {}
        self.load_jobs: dict[int, TransferJob] = {}
        # job id -> (group, block index in the request, GPU block id), per source block
        self.job_places: dict[int, list[tuple[int, int, int]]] = {}
        self.stores_after_preemption: set[int] = set()  # built with no computed KV left
        # store job -> the (group, block index) it reads from a stale id below its
        # request's store progress (FINAL_SLIDING_WINDOW_TAIL in fence_contents)
        self.stale_tail_reads: dict[int, set[tuple[int, int]]] = {}
        self.history: list[StepRecord] = []

    def add(
        self,
        record: StepRecord,
        requests: Mapping[str, Request],
        req_status: Mapping[str, Any],
        built_lists: Mapping[str, list[list[int]]] | None = None,
    ) -> None:
        """A step's record and its jobs. A store's blocks are found in its request's
        block lists as the connector has them now (``req_status``), when it built it;
        or, where given, as they were once the step's stores were built
        (``built_lists``: MOVED_BLOCKS_ZEROED)."""
        self.store_jobs.update(record.store_jobs)
        self.load_jobs.update(record.load_jobs)
        for job_id, job in record.store_jobs.items():
            request = requests[job.req_id]
            if (
                request.is_finished()
                and request.num_preemptions
                and not request.num_computed_tokens
            ):
                self.stores_after_preemption.add(job_id)
            status = req_status[job.req_id]
            lists = [g.block_ids for g in status.group_states]
            if built_lists is not None and job.req_id in built_lists:
                lists = built_lists[job.req_id]
            self.job_places[job_id] = spec_places(
                job.src_spec, lists, self.blocks_per_chunk if NULL_PLACEHOLDERS else 0
            )
            if request.is_finished():
                stale = self._stale_tail(job.req_id, job_id, record)
                if stale:
                    self.stale_tail_reads[job_id] = stale
        for job_id, job in record.load_jobs.items():
            self.job_places[job_id] = spec_places(job.dst_spec)
        self.history.append(record)

    def _stale_tail(self, req_id: str, job_id: int, record: StepRecord) -> set[tuple[int, int]]:
        """The places a finished request's store reads below its store progress in a
        tail group, from a block vLLM has handed to another place since the request
        last held it there: the id the connector kept there is stale."""
        progress = record.stored_before.get(req_id, ())
        stale: set[tuple[int, int]] = set()
        for group, index, block in self.job_places[job_id]:
            below = group in self.tail_groups and index < progress[group] * self.blocks_per_chunk
            if below and self._handed_on(block, (req_id, group, index), record):
                stale.add((group, index))
        return stale

    def _handed_on(self, block: int, place: tuple[str, int, int], record: StepRecord) -> bool:
        """Whether ``block`` went to another place after ``place`` last held it
        (``record``, not yet in the history, is the latest step)."""
        for step in [record, *reversed(self.history)]:
            if step.tables.get(place) == block:
                return False
            if step.allocated.get(block, set()) - {place}:
                return True
        return False

    def places(self, transfer: Transfer) -> Iterable[tuple[int, int, int, tuple[int, int]]]:
        """(group, block index in the request, GPU block id, CPU address) per block: the
        CPU spec lists one chunk per offload key, in the order of the blocks."""
        bpc = self.blocks_per_chunk
        chunk_ids = [int(c) for c in transfer.cpu.block_ids]
        ordinal, last = -1, None
        for group, index, block_id in self.job_places[transfer.job_id]:
            if (group, index // bpc) != last:
                ordinal, last = ordinal + 1, (group, index // bpc)
            yield group, index, block_id, (chunk_ids[ordinal], index % bpc)

    def hits(self, req_id: str) -> list[int]:
        """The tokens ``req_id`` had computed (its hits) each time it was scheduled anew."""
        return [
            new.num_computed_tokens
            for record in self.history
            for new in record.output.scheduled_new_reqs
            if new.req_id == req_id
        ]

    def positions(self, transfers: Iterable[Transfer]) -> set[tuple[str, int, int]]:
        """(request, group, block index) of every block the ``transfers`` moved."""
        found: set[tuple[str, int, int]] = set()
        for transfer in transfers:
            jobs = self.store_jobs if transfer.is_store else self.load_jobs
            req_id = jobs[transfer.job_id].req_id
            for group, index, block_id, _ in self.places(transfer):
                if block_id != 0:  # a null placeholder (vLLM 0.34.0 on) moves no data
                    found.add((req_id, group, index))
        return found


def spec_places(
    spec: LoadStoreSpec, lists: Sequence[Sequence[int]] | None = None, whole_chunks: int = 0
) -> list[tuple[int, int, int]]:
    """(group, block index in the request, GPU block id) of each block of a GPU spec.

    ``block_indices`` gives the index of each group's first block. A store may skip
    chunks in between (unreachable or null sliding-window chunks), so its later blocks
    are found in ``lists``, the request's block ids per group as the connector had
    them when it built the store; without ``lists`` the blocks are taken as contiguous.

    ``whole_chunks``: the blocks per chunk where a store copies each of its chunks
    whole, null blocks included as placeholders (vLLM 0.34.0 on). A null block's id
    then names no one place (a sliding-window list holds many), so each chunk's blocks
    are placed together, at the first chunk of the list that holds them all. Before,
    a store lists no null block, and each id names its one place.
    """
    assert isinstance(spec, GPULoadStoreSpec)
    ids = [int(b) for b in spec.block_ids]
    places: list[tuple[int, int, int]] = []
    offset = 0
    for group, (size, first) in enumerate(zip(spec.group_sizes, spec.block_indices, strict=True)):
        blocks = ids[offset : offset + size]
        offset += size
        if lists is None:
            places += [(group, first + i, block) for i, block in enumerate(blocks)]
        elif whole_chunks:
            places += _chunk_places(group, first, blocks, lists[group], whole_chunks)
        else:
            index = first
            for block in blocks:
                while lists[group][index] != block:
                    index += 1
                places.append((group, index, block))
                index += 1
    return places


def _chunk_places(
    group: int, first: int, blocks: Sequence[int], held: Sequence[int], per_chunk: int
) -> list[tuple[int, int, int]]:
    """Each whole chunk of ``blocks`` at the first chunk of ``held``, from ``first`` on,
    that holds the same ids in the same order."""
    places: list[tuple[int, int, int]] = []
    index = first
    for start in range(0, len(blocks), per_chunk):
        chunk = list(blocks[start : start + per_chunk])
        while list(held[index : index + len(chunk)]) != chunk:
            index += per_chunk
            if index >= len(held):
                raise AssertionError(
                    f"group {group}: a stored chunk {chunk} is nowhere in the request's "
                    f"blocks {list(held)} from index {first} on"
                )
        places += [(group, index + i, block) for i, block in enumerate(chunk)]
        index += per_chunk
    return places
