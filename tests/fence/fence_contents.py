"""The content model: what each GPU and CPU block holds, as tags, and the checks on them.

The forward pass writes, into each block it computes, a tag naming the tokens the
block holds (the request's block hash once the block is full). A store job reads
tags; a load writes them. So a test can ask the question the fence exists for — was
a block overwritten while a store was still reading it? — without trusting the
scheduler's own bookkeeping (:class:`ContentViolation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fence_findings import at_least

if TYPE_CHECKING:
    from fence_harness import FenceEngine
    from fence_transfers import Transfer
    from vllm.v1.core.sched.output import SchedulerOutput


# A vLLM bug (0.28.0-0.33.0) the harness can tolerate (FenceEngine(tolerate=...)), so that
# random workloads keep hunting for others: a request preempted by an async step while
# its last token was in flight finishes with that token, and the connector builds its
# final store from the blocks the preemption freed (docs/vllm-bug-preempted-final-store.md).
PREEMPTED_THEN_FINISHED = "store of a request finished after its preemption"

# A vLLM 0.28.0-0.29.0 bug the harness can tolerate likewise: a finished request's final
# store counts its last sampled token as computed (``num_tokens``, not
# ``num_tokens - 1``), so it stores the block that token ends although no forward pass
# ever wrote the token's KV (docs/vllm-bug-final-store-uncomputed-token.md).
FINAL_TOKEN_UNCOMPUTED = "final store of a block whose last token was never computed"


# A vLLM bug (0.30.0-0.33.0) the harness can tolerate likewise: a finished request's
# store reconsiders its final sliding-window tail and reads positions below its store
# progress, where the connector never zeroes the ids of blocks vLLM has since handed
# on (docs/vllm-bug-final-sliding-window-tail.md). Only those reads are tolerated (the
# ledger's ``stale_tail_reads``): the job's other blocks are checked as usual.
FINAL_SLIDING_WINDOW_TAIL = "final store of a sliding-window tail from a block handed on"

# A vLLM bug (0.28.0-0.32.0) the harness can tolerate likewise: a sliding-window chunk
# is stored without its null block, so its slot keeps what it held before, and a later
# hit whose window reads that block loads it
# (docs/vllm-bug-reachable-null-block-chunk-stored.md). Only such loads are tolerated:
# a slot the chunk's latest store left unwritten; any other wrong load fails as usual.
UNSTORED_SLOT = "load of a CPU slot its chunk's store left unwritten"

# A vLLM bug (0.33.0-0.34.0) the harness can tolerate likewise: in a mixed layout whose
# sliding-window chunks are shorter than full attention's, the window group cuts a
# CPU-tier hit off the full-attention chunk boundary, where the store's reachability
# assumes every hit ends, and the hit's window loads a slot the store left out: never
# written (0.33.0) or a null placeholder's zeros (0.34.0)
# (docs/vllm-bug-unaligned-hybrid-hit-reads-unstored-block.md). Only such loads are
# tolerated: a sliding-window slot of that kind, by a load whose full-attention blocks
# end off a chunk boundary, with no EAGLE drafter that drops a hit's last block (one
# under lookahead hashes does not: FenceEngine.eagle_drop); any other wrong load fails
# as usual.
UNALIGNED_HIT = "load of a slot left out, by a hit cut off the full-attention chunk boundary"

# A vLLM bug (0.33.0-0.34.0) the harness can tolerate likewise: under a sparse
# checkpoint retention (vLLM's default, 0, or a periodic one), the store's reachability
# keeps only the blocks a hit at the request's own replay boundary (and at each
# segment's end) reads, and stores a sliding-window chunk without a null block it calls
# unreachable; a later request whose hit ends on an earlier chunk reads it
# (docs/vllm-bug-sparse-retention-shorter-hit-reads-unstored-block.md). Only such
# loads are tolerated: a sliding-window slot its chunk's store left out, never written
# (0.33.0) or a null placeholder's zeros (0.34.0), under such a retention, with no EAGLE
# drafter that drops a hit's last block; any other wrong load fails as usual.
SHORTER_HIT = "load of a window slot left out, by a hit short of a sparse retention's boundary"

# A vLLM bug (0.28.0-0.34.0) of the same shape with an EAGLE drafter: its group gives back
# the last chunk of a CPU-tier hit, so the hit ends a chunk short of any boundary the
# store's reachability kept, and its window reads a block the store left out
# (docs/vllm-bug-eagle-popped-chunk-reads-unstored-block.md). Tolerated likewise: such a
# slot, under a sparse retention, where the sliding-window group is the drafter's and
# drops a hit's last block (not under 0.34.0's lookahead hashes, which pop nothing).
EAGLE_POPPED = "load of a window slot left out, by an EAGLE hit that gave back a chunk"


# vLLM 0.34.0 on copies a stored chunk's null blocks too, as placeholders that keep the
# chunk's later blocks at their offsets in the CPU chunk: the null block is zeroed, and
# never fenced. Before, a store read no null block.
NULL_PLACEHOLDERS = at_least("0.34.0")
# What the CPU slot of a null placeholder holds: no block's data.
NULL = "the null block's zeros"


class ContentViolation(AssertionError):
    """A block was overwritten while a store still read it, or a store read wrong data."""


# What a block holds: a block hash (bytes), or (request, block index, tokens computed)
# as written by a forward pass, which resolves to the hash once the block is full.
Tag = Any


@dataclass(frozen=True)
class Untracked:
    """What a CPU slot holds after a store tolerated as a known vLLM bug (``label``):
    data the model does not track, so a load of it is that bug's too."""

    label: str


@dataclass(frozen=True)
class Rejected:
    """What a block holds that only rejected draft tokens wrote (block ``index`` of
    ``group`` of ``req_id``): KV of tokens the request never has."""

    req_id: str
    group: int
    index: int


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
        # CPU chunk id -> the slots its latest store wrote (the others keep old data)
        self.written: dict[int, set[int]] = {}
        # GPU block id -> the step that last wrote it and what it wrote (the oracle's
        # prefix-hit test)
        self.written_at: dict[int, tuple[int, Tag]] = {}
        self.violations: list[str] = []

    def _fail(self, message: str) -> None:
        # Raised by the engine at the end of the step: raising here, inside the
        # worker connector's calls, would leave its queues half-updated.
        self.violations.append(message)

    def expected_tag(self, req_id: str, group: int, index: int) -> Tag:
        """The hash of the prefix that ends with block ``index`` of ``group`` (hashes
        are chained, at the hash block size, which divides every group's)."""
        per_block = self.engine.group_block_sizes[group] // self.engine.hash_block_size
        return self.engine.requests[req_id].block_hashes[(index + 1) * per_block - 1]

    def _tolerated_preempted_store(self, job_id: int) -> bool:
        """Whether ``job_id`` is a store of PREEMPTED_THEN_FINISHED, tolerated: it
        reads freed blocks, so what it reads and writes is not tracked."""
        known = job_id in self.engine.stores_after_preemption
        return known and PREEMPTED_THEN_FINISHED in self.engine.tolerate

    def check_store_source(self, transfer: Transfer, step: int) -> None:
        job = self.engine.store_jobs[transfer.job_id]
        if self._tolerated_preempted_store(transfer.job_id):
            # A known vLLM bug: recorded, not reported again.
            self.engine.known_bug_hits.append((PREEMPTED_THEN_FINISHED, transfer.job_id))
            return
        stale = self.engine.tolerated_stale_reads(transfer.job_id)
        for group, index, block_id, _ in self.engine.ledger.places(transfer):
            if (group, index) in stale:
                # A known vLLM bug: recorded; the block is not this job's to check.
                self.engine.known_bug_hits.append((FINAL_SLIDING_WINDOW_TAIL, transfer.job_id))
                continue
            where = f"request {job.req_id}, group {group}, block index {index}"
            if block_id == 0 and NULL_PLACEHOLDERS:
                continue  # a placeholder: its slot gets NULL (finish_store)
            if block_id == 0:
                self._fail(
                    f"step {step}: store job {transfer.job_id} reads the null block ({where})"
                )
                continue
            expected = self.expected_tag(job.req_id, group, index)
            actual = self.resolve(self.gpu.get(block_id))
            if (
                actual != expected
                and FINAL_TOKEN_UNCOMPUTED in self.engine.tolerate
                and self._lacks_only_the_final_token(job.req_id, group, index, actual)
            ):
                self.engine.known_bug_hits.append((FINAL_TOKEN_UNCOMPUTED, transfer.job_id))
            elif actual != expected:
                self._fail(
                    f"step {step}: store job {transfer.job_id} reads block {block_id} "
                    f"({where}) but it holds {_show(actual)}, not the data of its key "
                    f"{_show(expected)}"
                )
            self.reading.setdefault(block_id, []).append(
                StoreRead(transfer.job_id, expected, where)
            )

    def _lacks_only_the_final_token(self, req_id: str, group: int, index: int, tag: Tag) -> bool:
        """Whether block ``index`` of ``req_id`` was written by its own forward pass
        up to all but its last token, and that token is the request's final one,
        sampled but never computed (see FINAL_TOKEN_UNCOMPUTED)."""
        if not isinstance(tag, tuple) or tag[:3] != (req_id, group, index):
            return False
        end = (index + 1) * self.engine.group_block_sizes[group]
        request = self.engine.requests[req_id]
        return bool(request.is_finished() and tag[3] == end - 1 == request.num_tokens - 1)

    def finish_store(self, transfer: Transfer, step: int) -> None:
        places = list(self.engine.ledger.places(transfer))
        for chunk in {address[0] for *_, address in places}:
            self.written[chunk] = set()
        untracked = self._tolerated_preempted_store(transfer.job_id)
        for _, _index, block_id, address in places:
            self.written[address[0]].add(address[1])
            if untracked:
                self.cpu[address] = Untracked(PREEMPTED_THEN_FINISHED)
                continue
            if block_id == 0 and NULL_PLACEHOLDERS:
                self.cpu[address] = NULL
                continue
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
        self.written_at[block_id] = (step, tag)

    def _cut_off_alignment(self, places: list[tuple[int, int, int, tuple[int, int]]]) -> bool:
        """Whether a load's places are those of UNALIGNED_HIT's hit: a mixed layout
        (full attention, then a sliding window of shorter chunks), no EAGLE drafter
        dropping a hit's last block, and the full-attention blocks loaded end off a
        full-attention chunk."""
        engine = self.engine
        sizes = engine.group_block_sizes
        if engine.layout != "mixed" or engine.eagle_drop or sizes[1] >= sizes[0]:
            return False
        ends = [(index + 1) * sizes[0] for group, index, *_ in places if group == 0]
        return bool(ends) and max(ends) % (sizes[0] * engine.blocks_per_chunk) != 0

    def _sparse_window_groups(self) -> frozenset[int]:
        """The groups where SHORTER_HIT's and EAGLE_POPPED's loads happen: the
        sliding-window group under a sparse retention (the default, 0, or a periodic
        one); none under dense retention."""
        engine = self.engine
        if engine.retention_interval is None or engine.layout == "full":
            return frozenset()
        return frozenset({0 if engine.layout == "sliding" else 1})

    def apply_load(self, transfer: Transfer, step: int) -> None:
        job = self.engine.load_jobs[transfer.job_id]
        places = list(self.engine.ledger.places(transfer))
        unaligned = UNALIGNED_HIT in self.engine.tolerate and self._cut_off_alignment(places)
        # the known bug whose loads bring a window slot a sparse retention's store
        # left out, for this engine, and its groups where tolerated
        left_out = EAGLE_POPPED if self.engine.eagle_drop else SHORTER_HIT
        sparse = self._sparse_window_groups() if left_out in self.engine.tolerate else ()
        for group, index, block_id, address in places:
            if block_id == 0 and NULL_PLACEHOLDERS:
                continue  # into the null block, which nothing reads
            expected = self.expected_tag(job.req_id, group, index)
            loaded = self.cpu.get(address)
            unstored = address[1] not in self.written.get(address[0], ())
            if isinstance(loaded, Untracked):
                # A known vLLM bug's store wrote the slot: recorded, not reported again.
                self.engine.known_bug_hits.append((loaded.label, transfer.job_id))
            elif loaded != expected and (unstored or loaded == NULL) and group in sparse:
                # A known vLLM bug: recorded, not reported again.
                self.engine.known_bug_hits.append((left_out, transfer.job_id))
            elif loaded != expected and unstored and UNSTORED_SLOT in self.engine.tolerate:
                # A known vLLM bug: recorded, not reported again.
                self.engine.known_bug_hits.append((UNSTORED_SLOT, transfer.job_id))
            elif loaded != expected and (unstored or loaded == NULL) and unaligned and group == 1:
                # A known vLLM bug: recorded, not reported again.
                self.engine.known_bug_hits.append((UNALIGNED_HIT, transfer.job_id))
            elif loaded != expected:
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

    def forward(
        self,
        output: SchedulerOutput,
        step: int,
        accepted: Mapping[str, int] | None = None,
        shift: Mapping[str, int] | None = None,
    ) -> None:
        """The forward pass: write each computed block's tag. Of a request's
        scheduled draft tokens, those past the first ``accepted[request]`` are
        rejected: their positions hold KV of tokens the request never has, so a block
        they alone write holds :class:`Rejected`, and one they share with accepted
        positions is written only up to the last accepted one. ``shift[request]``:
        the rejected drafts of the step before that the scheduler still counts
        computed (an async step), by which the tokens land lower than it counts."""
        accepted = accepted or {}
        shift = shift or {}
        for req_id, n in output.num_scheduled_tokens.items():
            request = self.engine.requests[req_id]
            end = request.num_computed_tokens - shift.get(req_id, 0)
            start = end - n
            drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
            valid = end - drafts + accepted.get(req_id, 0)  # the accepted positions' end
            tables = self.engine.scheduler.kv_cache_manager.get_block_ids(req_id)
            for group, table in enumerate(tables):
                bs = self.engine.group_block_sizes[group]
                for index in range(start // bs, (end - 1) // bs + 1):
                    tag: Tag = (
                        (req_id, group, index, valid)
                        if index * bs < valid
                        else Rejected(req_id, group, index)
                    )
                    if index < len(table) and table[index] != 0:
                        self.write(table[index], tag, step, f"the forward pass of {req_id}")


def _show(tag: Tag) -> str:
    if isinstance(tag, bytes):
        return f"hash {tag.hex()[:8]}"
    return repr(tag)
