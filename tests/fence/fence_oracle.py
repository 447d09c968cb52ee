"""The fence's invariants, checked against the scheduler's state after every step.

Numbering follows the fence brief (§7): I1 coverage, I2 same-step completeness, I3
check ordering, I4 flush before overwrite, I5 exact bookkeeping, I6 no duplicates,
I7 deferred registration iff finished, I8 sliding-window hygiene, I9 loads never
register, I10 per-step sets are transient.

Two layers:

* :func:`check_state` needs only an ``OffloadingConnectorScheduler`` between steps,
  so it can follow any runner, vLLM's own included (I5 to I10, and I1 a and b).
* :class:`FenceOracle` is a ``post_step_fn`` for :class:`fence_harness.FenceEngine`;
  it adds the step-level checks that need to know what ``schedule()`` handed out
  (I1 c, I2, I3, I4).

A failure names the invariant, the step, the block and the job.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fence_findings import fixed

# Fixes of vLLM (docs/upstream/) that change on purpose a rule some check here encodes as
# the release has it: where the vLLM under test carries one (``fixed``: its release has
# the bug and the fix is applied), that check follows the fixed rule. On a release as
# released each is False and every check is as strict as before.
# prefix-hit-taken-for-reused-window-block: a block another request takes as a GPU
# prefix-cache hit keeps its content, so a store may still read it unflushed, and the
# connector no longer zeroes its id (only fresh allocations make an id stale).
PREFIX_HIT_FIXED = fixed("prefix-hit-taken-for-reused-window-block")
# finished-window-chunk-dropped: a finished request's sliding-window ids are no longer
# zeroed; its final store reads them and is flushed before the new owner writes them.
FINISHED_CHUNK_FIXED = fixed("finished-window-chunk-dropped")
# reset-sliding-window: a cache reset zeroes every sliding-window id below the store
# frontier it drops (they may be stale; the re-offload skips them).
RESET_ZEROES_FIXED = fixed("reset-sliding-window")
# sparse-retention-shorter-hit-reads-unstored-block: under a sparse retention (0 or
# periodic) the store skips a sliding-window chunk holding a null block that a hit at
# any aligned boundary reads (the dense mask), not only at a retained one.
SPARSE_NULLS_FIXED = fixed("sparse-retention-shorter-hit-reads-unstored-block")


@dataclass(frozen=True)
class Violation:
    invariant: str
    step: int
    message: str
    block: int | None = None
    job: int | None = None

    def __str__(self) -> str:
        where = "".join(
            f", {name} {value}"
            for name, value in (("block", self.block), ("job", self.job))
            if value is not None
        )
        return f"{self.invariant} at step {self.step}{where}: {self.message}"


class FenceViolation(AssertionError):
    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        shown = "\n  ".join(str(v) for v in violations[:8])
        more = f"\n  ... and {len(violations) - 8} more" if len(violations) > 8 else ""
        super().__init__(f"fence invariants broken:\n  {shown}{more}")


def check_state(sched: Any, step: int, *, reset_pending: bool = False) -> list[Violation]:
    """I1 (a, b), I5, I6, I7, I8 c, I9 and I10 on an OffloadingConnectorScheduler.

    ``reset_pending``: a ``reset_cache`` ran since the last ``build_connector_meta``,
    so its flush set is still waiting to be delivered (the one allowed carry-over).
    """
    checks = _StateChecks(sched, step)
    actual = checks.fence_entries()
    expected = checks.live_jobs()
    checks.compare(expected, actual)
    if sched._current_batch_jobs_to_flush and not reset_pending:
        leftover = sorted(sched._current_batch_jobs_to_flush)
        checks.add("I10 transient sets", f"jobs_to_flush survived the step: {leftover}")
    if sched._current_batch_load_jobs:
        checks.add("I10 transient sets", "this step's load jobs survived the step")
    return checks.found


class _StateChecks:
    def __init__(self, sched: Any, step: int) -> None:
        self.sched = sched
        self.step = step
        self.found: list[Violation] = []

    def add(
        self, invariant: str, message: str, block: int | None = None, job: int | None = None
    ) -> None:
        self.found.append(Violation(invariant, self.step, message, block, job))

    def fence_entries(self) -> set[tuple[int, int]]:
        """Each (block, job) the fence holds; I5, I8 c and I9 on the fence itself."""
        jobs: dict[int, Any] = self.sched._jobs
        actual: set[tuple[int, int]] = set()
        for block, job_ids in self.sched._block_id_to_pending_jobs.items():
            if block == 0:
                self.add("I8c null block", "the null block is in the fence", block)
            if not job_ids:
                self.add("I5 exact bookkeeping", "the fence keeps an empty set", block)
            for job_id in job_ids:
                actual.add((block, job_id))
                status = jobs.get(job_id)
                if status is None:
                    why = "the fence names a job that is no longer live"
                    self.add("I5 exact bookkeeping", why, block, job_id)
                elif job_id < self.sched._stale_job_threshold:
                    why = "the fence names a job from before a cache reset"
                    self.add("I5 exact bookkeeping", why, block, job_id)
                elif not status.is_store:
                    self.add("I9 loads never register", "a load job is in the fence", block, job_id)
        return actual

    def live_jobs(self) -> dict[tuple[int, int], str]:
        """Each (block, job) the fence must hold, and why; I6, I8 c, I9 on the jobs."""
        expected: dict[tuple[int, int], str] = {}
        for job_id, status in self.sched._jobs.items():
            fenced = list(status.fenced_block_ids or ())
            deferred = list(status.deferred_fence_block_ids or ())
            if not status.is_store:
                if fenced or deferred:
                    why = "a load job carries fence block lists"
                    self.add("I9 loads never register", why, job=job_id)
                continue
            self._lists(job_id, fenced, deferred)
            req_status = self.sched._req_status.get(status.req_id)
            if req_status is None:
                why = f"its request {status.req_id} is no longer tracked"
                self.add("I5 exact bookkeeping", why, job=job_id)
                continue
            if job_id not in req_status.transfer_jobs:
                why = f"request {status.req_id} does not list it"
                self.add("I5 exact bookkeeping", why, job=job_id)
            for block in fenced:
                expected[(block, job_id)] = "fenced at creation"
            if req_status.req.is_finished():
                for block in deferred:
                    expected[(block, job_id)] = f"deferred, request {status.req_id} finished"
        return expected

    def _lists(self, job_id: int, fenced: list[int], deferred: list[int]) -> None:
        for name, ids in (("fenced", fenced), ("deferred", deferred)):
            if len(set(ids)) != len(ids):
                dupes = sorted({b for b in ids if ids.count(b) > 1})
                self.add("I6 no duplicates", f"its {name} list repeats blocks {dupes}", job=job_id)
            if 0 in ids:
                self.add("I8c null block", f"its {name} list holds the null block", 0, job_id)
        for block in set(fenced) & set(deferred):
            why = "the block is in both its fenced and deferred lists"
            self.add("I6 no duplicates", why, block, job_id)

    def compare(self, expected: dict[tuple[int, int], str], actual: set[tuple[int, int]]) -> None:
        """I1 (a, b) and I7: the fence holds exactly what the live stores need."""
        for block, job_id in sorted(expected.keys() - actual):
            why = expected[(block, job_id)]
            invariant = "I1 coverage" if why.startswith("fenced") else "I7 registered iff finished"
            message = f"a live store reads it ({why}) but the fence does not hold it"
            self.add(invariant, message, block, job_id)
        for block, job_id in sorted(actual - expected.keys()):
            status = self.sched._jobs.get(job_id)
            if status is None or not status.is_store:
                continue  # reported by fence_entries
            if block in (status.deferred_fence_block_ids or ()):
                why = f"the fence holds a deferred block of request {status.req_id}, unfinished"
                self.add("I7 registered iff finished", why, block, job_id)
            else:
                why = "the fence holds a block the job does not read"
                self.add("I5 exact bookkeeping", why, block, job_id)


class FenceOracle:
    """A ``post_step_fn`` for :class:`fence_harness.FenceEngine`: every invariant,
    after every step. ``raise_now=False`` collects violations instead of raising."""

    def __init__(self, *, raise_now: bool = True) -> None:
        self.raise_now = raise_now
        self.violations: list[Violation] = []
        self.zeroing = ZeroingCheck()

    def __call__(self, engine: Any) -> None:
        record = engine.history[-1]
        found = check_state(
            engine.connector, record.step, reset_pending=engine.reset_since_last_step
        )
        found += self._check_step(engine, record)
        found += self.zeroing(engine.connector, record, engine)
        self.violations += found
        if found and self.raise_now:
            raise FenceViolation(found)

    def _check_step(self, engine: Any, record: Any) -> list[Violation]:
        found: list[Violation] = []
        step = record.step
        flushed = record.jobs_to_flush

        # I1 (b) + I2: a fenced block handed out this step flushes every job fencing it.
        for block, places in sorted(record.allocated.items()):
            for job_id in sorted(record.fence_before.get(block, ())):
                if job_id not in flushed:
                    found.append(
                        Violation(
                            "I1/I2 flush on reuse",
                            step,
                            f"handed to {_places(places)} while job {job_id} still stores "
                            "it, and the job is not in jobs_to_flush",
                            block,
                            job_id,
                        )
                    )
        # I1 (c): a preempted request's in-flight jobs are all flushed.
        for req_id in record.output.preempted_req_ids or ():
            for job_id in sorted(record.jobs_before.get(req_id, ())):
                if job_id in engine.store_jobs and job_id not in flushed:
                    found.append(
                        Violation(
                            "I1c preemption flush",
                            step,
                            f"request {req_id} was preempted but its store is not flushed",
                            job=job_id,
                        )
                    )
        # I3: a store created this step that reads a block its request no longer holds,
        # and that this step handed to another place, copies data the forward pass is
        # about to overwrite, unless flushed now. (A block shared through the prefix
        # cache, still held by the job's request, holds the same data: no hazard.)
        for job_id, job in sorted(record.store_jobs.items()):
            tolerated = engine.tolerated_stale_reads(job_id)
            for group, index, block in engine.job_places[job_id]:
                if (group, index) in tolerated:
                    continue  # a known vLLM bug the engine tolerates
                place = (job.req_id, group, index)
                others = record.allocated.get(block, set()) - {place}
                if PREFIX_HIT_FIXED:
                    # prefix-hit-taken-for-reused-window-block, fixed: a place that took
                    # the block as a GPU prefix-cache hit (the same data, never written
                    # by its new owner) is no reuse; any other place still is
                    others = {
                        o for o in others if not same_data_hit(engine, record, o, block, place)
                    }
                if others and record.tables.get(place) != block and job_id not in flushed:
                    found.append(
                        Violation(
                            "I3 same-step reuse",
                            step,
                            f"created this step reading {_places({place})}, but this step "
                            f"handed the block to {_places(others)} and the job is not flushed",
                            block,
                            job_id,
                        )
                    )
        # I4: every flushed job was submitted and has completed before the forward pass.
        for job_id in sorted(flushed):
            if job_id in engine.worker.in_flight:
                found.append(
                    Violation(
                        "I4 flush before overwrite", step, "flushed but still in flight", job=job_id
                    )
                )
        return found


def same_data_hit(
    engine: Any,
    record: Any,
    place: tuple[str, int, int],
    block: int,
    reader: tuple[str, int, int] | None = None,
) -> bool:
    """Whether ``place`` took ``block`` in this step as a GPU prefix-cache hit: the
    same data, which its new owner never writes. Judged on the content model, not on
    the connector's bookkeeping: the place lies wholly below the tokens its request had
    computed when the step scheduled it (its forward pass writes after them), no load
    of the step writes it, nothing wrote the block in the step but the forward pass of
    ``reader``'s request filling it there (a request scheduled after it in the step
    can hit a block it fills: vLLM caches it at schedule time), and the block holds
    the data of ``place``'s prefix to it and of ``reader``'s (the place that keeps the
    id: a store reads it there), which must be of the same group (the content model's
    tags name tokens, not layers; a hit in one group never returns another's block).
    Used only where prefix-hit-taken-for-reused-window-block is fixed."""
    if engine is None:
        return False
    req_id, group, index = place
    if reader is not None and reader[1] != group:
        return False  # another group's block: a hit there never returns it
    output = record.output
    starts = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
    # (a request not scheduled in the step, its blocks allocated for a load another
    # connector runs, has no forward pass in it; a later write of a place whose block
    # already holds that place's data, as checked below, writes the same data)
    if req_id in starts and (index + 1) * engine.group_block_sizes[group] > starts[req_id]:
        return False
    for job_id, job in record.load_jobs.items():
        if job.req_id == req_id and any(
            (g, i) == (group, index) for g, i, _ in engine.job_places.get(job_id, ())
        ):
            return False
    contents = engine.contents
    step, tag = contents.written_at.get(block, (None, None))
    if step == record.step and not (
        reader is not None and isinstance(tag, tuple) and tag[:3] == reader
    ):
        return False  # written in the step, other than by the reader's own forward pass
    held = contents.resolve(contents.gpu.get(block))
    try:
        expected = [contents.expected_tag(*p) for p in (place, reader) if p is not None]
    except IndexError:  # a prefix not hashed that far: no hit
        return False
    return held is not None and all(held == tag for tag in expected)


def _places(places: Iterable[tuple[str, int, int]]) -> str:
    return ", ".join(f"request {r} group {g} block index {i}" for r, g, i in sorted(places))


class ZeroingCheck:
    """I8b both ways, on each tracked request's sliding-window block lists.

    Safety: a pending position (from the store progress the step began with) does
    not keep the id of a block vLLM handed to another place this step. The content
    model sees a kept stale id only if a store then reads it; this sees it at once
    (catalogue: sliding-window-window-skips-last).

    Completeness: the connector forgets an id (zeroes it: its chunk is not stored)
    only when vLLM has just handed that block to another place, and it holds every
    id vLLM hands the request as vLLM hands it. A connector that zeroes too much is
    safe, so invisible to every other check: it only stores less (catalogue:
    sliding-window-zero-inverted, sliding-window-end-after-extend).

    The lists are compared with their copy from the previous step and with the
    KV-cache manager's tables, not with the connector's own bookkeeping.
    """

    def __init__(self) -> None:
        self.lists: dict[tuple[str, int], list[int]] = {}  # (request, group config) -> ids
        self.tables: dict[tuple[str, int, int], int] = {}  # the previous step's
        # each (request, group config)'s store frontier (next_stored_chunk_idx) and the
        # requests finished, as the previous step ended
        self.frontiers: dict[tuple[str, int], int] = {}
        self.finished: set[str] = set()

    def __call__(self, sched: Any, record: Any, engine: Any = None) -> list[Violation]:
        found = self._check(sched, record, engine)
        self.frontiers = {
            (req_id, i): group_state.next_stored_chunk_idx
            for req_id, status in sched._req_status.items()
            for i, group_state in enumerate(status.group_states)
        }
        if engine is not None:
            self.finished = {r for r, q in engine.requests.items() if q.is_finished()}
        return found

    def _check(self, sched: Any, record: Any, engine: Any) -> list[Violation]:
        configs = sched.config.kv_group_configs
        sliding = [i for i, c in enumerate(configs) if c.sliding_window_size_in_chunks is not None]
        if not sliding:
            return []
        full = _full_tables(record.output)
        handed = self._handed_out(record, full)
        # where each list's pending positions began when this step's schedule ran
        starts = {
            (req_id, i): progress[i] * sched.config.blocks_per_chunk
            for req_id, progress in record.stored_before.items()
            for i in sliding
        }
        # finished before this step's schedule ran: at the last step's end, or between
        # the two (a flush of async output), which this step's output reports
        finished = self.finished | set(record.output.finished_req_ids or ())
        # reset-sliding-window, fixed: a cache reset before this step zeroed each list
        # below the store frontier it dropped
        reset_below = {
            key: frontier * sched.config.blocks_per_chunk
            for key, frontier in self.frontiers.items()
            if RESET_ZEROES_FIXED and getattr(record, "after_reset", False)
        }
        found: list[Violation] = []
        lists: dict[tuple[str, int], list[int]] = {}
        for req_id, status in sched._req_status.items():
            for i in sliding:
                current = list(status.group_states[i].block_ids)
                lists[(req_id, i)] = current
                group = configs[i].group_idx
                previous = self.lists.get((req_id, i))
                if req_id in full or previous is None:
                    previous = []  # the whole list is this step's
                elif len(current) < len(previous):
                    continue  # rebuilt (a lookup clears it): not this check's business
                for j, block in enumerate(current):
                    place = (req_id, group, j)
                    if j >= len(previous):
                        given = record.tables.get(place, 0)
                        if block != given:
                            why = f"vLLM handed it block {given} there, the connector holds {block}"
                            found.append(self._violation(record.step, place, why, block))
                    elif block == previous[j]:
                        others = handed.get(block, set()) - {place}
                        if FINISHED_CHUNK_FIXED and req_id in finished:
                            # finished-window-chunk-dropped, fixed: a finished request's
                            # ids are kept for its final store, which is flushed (I3)
                            others = set()
                        if PREFIX_HIT_FIXED:
                            # prefix-hit-taken-for-reused-window-block, fixed: a prefix-
                            # cache hit of the block keeps its data; it is no reuse
                            others = {
                                o
                                for o in others
                                if not same_data_hit(engine, record, o, block, place)
                            }
                        if block and j >= starts.get((req_id, i), len(current)) and others:
                            why = (
                                f"its pending id {block} is kept though vLLM handed the block "
                                f"to {_places(others)} this step"
                            )
                            found.append(self._violation(record.step, place, why, block))
                    else:
                        old = previous[j]
                        if block == 0 and handed.get(old, set()) - {place}:
                            continue  # re-allocated elsewhere: zeroed as it must be
                        if block == 0 and j < reset_below.get((req_id, i), 0):
                            continue  # reset-sliding-window, fixed: below the dropped frontier
                        why = (
                            f"the connector changed its id {old} to {block}, but vLLM handed "
                            f"block {old} to no other place this step"
                        )
                        found.append(self._violation(record.step, place, why, old))
        self.lists = lists
        self.tables = record.tables
        return found

    def _handed_out(self, record: Any, full: set[str]) -> dict[int, set[tuple[str, int, int]]]:
        """Each block vLLM handed to a place since the previous step's schedule:
        in this schedule, or between steps (a deferred load's allocation); and every
        block of a whole table the step carries (``full``). That last is how the
        connector sees it (brief B.1): a request admitted once its remote load is in
        got its blocks steps ago, prefix hits shared with others among them, and a
        pending position holding one is zeroed (conservatively: same data)."""
        handed = {block: set(places) for block, places in record.allocated.items()}
        for place, block in record.tables.items():
            if self.tables.get(place) != block or place[0] in full:
                handed.setdefault(block, set()).add(place)
        return handed

    @staticmethod
    def _violation(step: int, place: tuple[str, int, int], why: str, block: int) -> Violation:
        return Violation(
            "I8b zeroing only what is handed on", step, f"{_places({place})}: {why}", block
        )


def _full_tables(output: Any) -> set[str]:
    """The requests whose whole block table this step's output carries (new and
    resumed ones): the connector rebuilds their lists."""
    cached = output.scheduled_cached_reqs
    resumed = getattr(cached, "resumed_req_ids", None)
    if resumed is None:  # older releases: a flag per request
        flags = getattr(cached, "resumed_from_preemption", ())
        resumed = {r for r, flag in zip(cached.req_ids, flags, strict=False) if flag}
    return {r.req_id for r in output.scheduled_new_reqs} | set(resumed)


def committed(engine: Any, request: Any) -> int:
    """The tokens of ``request`` whose KV a store may read once the step's output is
    in: those it computed. With speculative decoding (rejected drafts rolled back once
    the scheduler takes a step's output), at most all but its last token,
    vLLM's commit point: a request that stops inside a step's accepted drafts still
    counts as computed the drafts its output then drops on 0.30.0 (0.33.0 and 0.34.0
    count its tokens less the last), and the GPU prefix cache does not keep the block
    its last token ends, nor does the final store from 0.30.0 on (a scratch probe,
    2026-12-06: a 2-token prompt answered with 2 tokens, the second an accepted
    draft, on 0.28.0, 0.30.0, 0.33.0 and 0.34.0; 0.28.0's final store keeps it, as
    final-store-uncomputed-token has it store every last block)."""
    if engine.speculation is None:
        return int(request.num_computed_tokens)
    return min(request.num_computed_tokens, request.num_tokens - 1)


class StoreLiveness:
    """L1, a liveness check every other one lacks: a chunk a request computed is
    offered to the CPU tier. The invariants above are all safety (nothing is
    overwritten, fenced wrongly or read stale); a connector that stores nothing
    keeps every one of them, and so does one that skips chunks it should store.

    A ``post_step_fn``, attached before the first step. Per request it keeps the
    offload keys of its first group and the step in which each chunk was first
    computed; it records every key the connector hands the tier's ``prepare_store``,
    with the step of its first offer and the request that offered it (the store's
    request context). :meth:`check`, once the engine has drained, names each computed
    chunk of a request that finished (not aborted) that the request never offered
    itself and that no request had offered by the step in which this one computed it.
    The second clause admits the chunks a request did not compute itself: hits, from
    the CPU tier or the GPU prefix cache, on a chunk another request stored. It does not
    admit a chunk skipped and only later offered by another request sharing the prefix.

    Where it is sound, and so where the machine turns it on: one full-attention group
    (dense: vLLM's reachable mask keeps every block), no EAGLE drafter that drops a
    hit's last block (its group keeps a trailing block back; under vLLM 0.34.0's
    lookahead block hashes it does neither, and the check holds), no second connector
    (its loads are not the tier's); and only chunks that met no cache reset before their
    store was built (a reset drops pending chunks by design), and of a request that
    finished while preempted, only the chunks it still counts computed (the preemption
    freed the blocks that held the others).
    """

    INVARIANT = "L1 computed chunks are offered to the tier"
    WHAT = "its computed chunks {}"  # the chunks missing, as a message names them

    def __init__(self, chunk_tokens: int, group: int = 0) -> None:
        self.chunk_tokens = chunk_tokens
        self.group = group  # the connector's group whose chunks are held to the check
        self.keys: dict[str, list[Any]] = {}
        # per request, the chunks it is held to, each with the step it was computed in
        self.computed_at: dict[str, dict[int, int]] = {}
        self.excused: dict[str, int] = {}
        self.first_offer: dict[Any, int] = {}
        self.offered_by: dict[str, set[Any]] = {}

    def __call__(self, engine: Any) -> None:
        self._record_keys(engine)
        for req_id, request in engine.requests.items():
            steps = self.computed_at.setdefault(req_id, {})
            for chunk in range(len(steps), committed(engine, request) // self.chunk_tokens):
                steps[chunk] = engine.step_no

    def _record_keys(self, engine: Any) -> None:
        for req_id, status in engine.connector._req_status.items():
            keys = status.group_states[self.group].offload_keys
            if len(keys) > len(self.keys.get(req_id, ())):
                self.keys[req_id] = list(keys)

    def reset(self, engine: Any) -> None:
        """A cache reset: the chunks that the requests alive now, and the finished
        ones whose final store the connector has not built yet, have computed so far
        are not held to the check (the reset may drop their stores); chunks they
        compute after it are."""
        met = {r for r, q in engine.requests.items() if not q.is_finished()}
        for req_id in met | set(engine.connector._req_status):
            now = engine.requests[req_id].num_computed_tokens // self.chunk_tokens
            held = self.computed_at.get(req_id, {})
            self.excused[req_id] = max(max(held, default=-1) + 1, now)

    def attach(self, engine: Any) -> None:
        """Record the tier's offers from the engine's first step on (a post-step
        function would see only those after the first). The connector keeps its
        manager for its lifetime, so one wrapper serves every step."""
        manager = engine.connector.manager
        prepare_store = manager.prepare_store

        def recording(keys: Any, *args: Any, **kwargs: Any) -> Any:
            keys = list(keys)
            context = args[0] if args else kwargs.get("req_context")
            by = self.offered_by.setdefault(getattr(context, "req_id", None), set())
            by.update(keys)
            for key in keys:
                self.first_offer.setdefault(key, engine.step_no)
            return prepare_store(keys, *args, **kwargs)

        manager.prepare_store = recording

    def check(self, engine: Any) -> list[Violation]:
        from vllm.v1.request import RequestStatus

        done = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)
        found: list[Violation] = []
        for req_id, request in sorted(engine.requests.items()):
            if request.status not in done:
                continue
            keys = self.keys.get(req_id, [])
            limit = len(keys)
            if request.num_preemptions:
                # Finished while preempted: with a token in flight and nothing that
                # defers the free (a producer-only connector), a preemption frees the
                # blocks and the in-flight output then finishes the request. What the
                # blocks held went with them: only the chunks it still counts computed
                # (none) can be stored. vLLM 0.34.0 stores just those; earlier
                # releases store from the freed blocks (preempted-final-store).
                limit = min(limit, request.num_computed_tokens // self.chunk_tokens)
            own = self.offered_by.get(req_id, set())
            missing = [
                chunk
                for chunk, at in sorted(self.computed_at.get(req_id, {}).items())
                if self.excused.get(req_id, 0) <= chunk < limit
                and keys[chunk] not in own
                and self.first_offer.get(keys[chunk], at + 1) > at
            ]
            missing = self.reported(engine, req_id, missing)
            if missing:
                found.append(
                    Violation(
                        self.INVARIANT,
                        engine.step_no,
                        f"request {req_id} finished, but neither it nor an earlier store "
                        f"offered {self.WHAT.format(missing)} to the tier",
                    )
                )
        return found

    def reported(self, engine: Any, req_id: str, missing: list[int]) -> list[int]:
        """Of the chunks ``req_id`` left unoffered, those the check reports."""
        return missing


# Known vLLM bugs that drop a sliding-window chunk (WindowLiveness): a block the
# connector zeroed in a request's pending positions although it was never stale.
HIT_TAKEN_FOR_REUSED = "window chunk dropped: a block still held zeroed as if reused"
FINISHED_CHUNK_ZEROED = "window chunk dropped: a finished request's freed block zeroed"
# draft-completed-window-chunk-dropped: a chunk whose last token an accepted draft
# computed is first offered a step later, and the window has by then freed its block,
# handed it out again and zeroed it
DRAFTED_CHUNK_ZEROED = "window chunk dropped: completed by drafts, its block freed before the store"
# resumed-junction-chunk-never-offered: a resumed request keeps the store frontier of its
# first run, and a chunk it computes again below that frontier (at a junction its new
# lookup found, or at its replay boundary, below its first run's hit) is never offered
RESUMED_FRONTIER = "chunk never offered: computed again below a resumed request's store frontier"


class WindowLiveness(StoreLiveness):
    """L2, liveness for a sliding-window group: at each boundary where a CPU-tier hit
    can end (every multiple of both the hit alignment and the group's chunk, under
    dense retention), the group's chunk ending there is offered to the tier, by the
    request that computed its last token or by a store no later than that step.

    Dense retention promises a hit at every aligned boundary, and a hit at a boundary
    reads the window before it, whose last block is in that chunk; so does vLLM's
    reachability mask, which always keeps a boundary's last block. A chunk whose last
    token came from a hit (the CPU tier or the GPU prefix cache) is not held to it: a
    request's blocks before its hit's window are null, so the request that computed
    the chunk answers for it. Reset and preemption as in :class:`StoreLiveness`.

    ``coarse``: where vLLM's mask cannot tell which blocks a hit reads (the hit
    alignment is no multiple of the group's block, or a hit's window spans a whole
    segment), it calls every block reachable, and so skips every chunk holding a null
    block, by design. There a chunk in which the request's own block table held a null
    block while it ran is not held to the check.

    ``tolerate`` (labels above): where vLLM zeroes a block that is not stale, the chunk
    holding it is dropped; a missing chunk with such a block is recorded in the
    engine's ``known_bug_hits``, not reported. With :data:`DRAFTED_CHUNK_ZEROED`, so is
    a missing chunk whose last token was an accepted draft (the step scheduled it as a
    draft), or under vLLM 0.34.0's lookahead block hashes a token after it that its
    hash covers, and one of whose blocks was zeroed after the request let it go.
    """

    INVARIANT = "L2 sliding-window chunks at hit boundaries are offered to the tier"
    WHAT = "the sliding-window chunks {}, each ending where a hit can end,"

    def __init__(
        self,
        group: int,
        chunk_tokens: int,
        every: int,
        blocks_per_chunk: int,
        coarse: bool,
        tolerate: Iterable[str] = (),
    ) -> None:
        super().__init__(chunk_tokens, group)
        self.every = every
        self.blocks_per_chunk = blocks_per_chunk
        self.coarse = coarse
        # per request, the chunks its own block table held a null block in
        self.with_null: dict[str, set[int]] = {}
        self.tolerate = frozenset(tolerate)
        # per request, its connector-side block ids after the last step, whether it
        # had finished then, and the positions zeroed: position -> (still held, finished)
        self.block_ids: dict[str, list[int]] = {}
        self.finished: set[str] = set()
        self.zeroed: dict[str, dict[int, tuple[bool, bool]]] = {}
        # per request, the held chunks whose last token a draft computed
        self.drafted: dict[str, set[int]] = {}

    def __call__(self, engine: Any) -> None:
        self._record_keys(engine)
        self._record_zeroing(engine)
        if self.coarse:
            self._record_nulls(engine)
        output = engine.history[-1].output
        starts = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
        drafts = output.scheduled_spec_decode_tokens
        lookahead = engine.hash_lookahead_tokens
        for req_id, scheduled in output.num_scheduled_tokens.items():
            start = starts[req_id]
            end = start + scheduled
            if engine.speculation is not None:  # less the drafts this step rejected
                end = min(end, committed(engine, engine.requests[req_id]))
            # where the step's tokens that are not drafts end: a held chunk whose key
            # needs an accepted draft of this step (its last token, or under vLLM
            # 0.34.0's lookahead block hashes a token after it that its hash covers)
            # was completed by drafts, and its store waits for the next step
            own_end = start + scheduled - len(drafts.get(req_id, ()))
            held = self.computed_at.setdefault(req_id, {})
            for chunk in self._held_chunks(engine, req_id, start, end):
                held.setdefault(chunk, engine.step_no)
                if min((chunk + 1) * self.chunk_tokens + lookahead, end) > own_end:
                    self.drafted.setdefault(req_id, set()).add(chunk)

    def _held_chunks(self, engine: Any, req_id: str, start: int, end: int) -> Iterable[int]:
        """The chunks ending at a boundary whose last token this step computes for
        ``req_id``, whose tokens (start, end] it scheduled."""
        for k in range(start // self.every + 1, end // self.every + 1):
            yield k * self.every // self.chunk_tokens - 1

    def _record_nulls(self, engine: Any) -> None:
        """The chunks in which a request's own table held a null block once this step
        was scheduled (a finish in the same step empties it after): the positions
        below its last block that the table leaves out."""
        for req_id, positions in self._table_nulls(engine).items():
            nulls = self.with_null.setdefault(req_id, set())
            nulls.update(p // self.blocks_per_chunk for p in positions)

    def _table_nulls(self, engine: Any) -> dict[str, set[int]]:
        """Per request in this step's tables, the positions of the group below its last
        block that its table leaves out (its null blocks)."""
        places: dict[str, set[int]] = {}
        for req_id, group, position in engine.history[-1].tables:
            if group == self.group:
                places.setdefault(req_id, set()).add(position)
        return {r: {p for p in range(max(held)) if p not in held} for r, held in places.items()}

    def _record_zeroing(self, engine: Any) -> None:
        """Note each position the connector zeroed in this step: whether the request
        still held that block once the step was scheduled (the zeroing's moment), and
        whether the request had finished before the step. Positions of a finished
        request whose state went in this step count as zeroed if the step handed
        their blocks out."""
        record = engine.history[-1]
        # finished before the step: at the last one's end, or between the two (a
        # flush of async output), which this step's output reports
        finished = self.finished | set(record.output.finished_req_ids or ())
        for req_id, status in engine.connector._req_status.items():
            now = list(status.group_states[self.group].block_ids)
            before = self.block_ids.get(req_id, [])
            for position, (old, new) in enumerate(zip(before, now, strict=False)):
                if old and not new:
                    held = record.tables.get((req_id, self.group, position)) == old
                    zeroed = self.zeroed.setdefault(req_id, {})
                    zeroed[position] = (held, req_id in finished)
            self.block_ids[req_id] = now
        # A finished request's state goes in the step that builds its final store,
        # after the zeroing: what it zeroed is what the step handed out of its blocks.
        for req_id in set(self.block_ids) - set(engine.connector._req_status):
            before = self.block_ids.pop(req_id)
            if req_id in finished:
                zeroed = self.zeroed.setdefault(req_id, {})
                for position, block in enumerate(before):
                    if block and block in record.allocated:
                        zeroed[position] = (False, True)
        self.finished = {r for r, q in engine.requests.items() if q.is_finished()}

    def _dropped_by(
        self, shapes: Iterable[tuple[bool, bool] | None], drafted: bool = False
    ) -> str | None:
        """The tolerated bug that dropped a chunk, from how its positions were zeroed
        (still held, finished), in position order, and whether a draft computed its
        last token; None if none did."""
        for shape in shapes:
            if shape is None:
                continue
            held, finished = shape
            if held and HIT_TAKEN_FOR_REUSED in self.tolerate:
                return HIT_TAKEN_FOR_REUSED
            if finished and FINISHED_CHUNK_ZEROED in self.tolerate:
                return FINISHED_CHUNK_ZEROED
            if drafted and not held and DRAFTED_CHUNK_ZEROED in self.tolerate:
                return DRAFTED_CHUNK_ZEROED
        return None

    def reported(self, engine: Any, req_id: str, missing: list[int]) -> list[int]:
        """All but the chunks vLLM skips by design (``coarse``) and those a tolerated
        bug dropped, each of those recorded in the engine's ``known_bug_hits``."""
        zeroed = self.zeroed.get(req_id, {})
        left = []
        for chunk in sorted(set(missing) - self.with_null.get(req_id, set())):
            first = chunk * self.blocks_per_chunk
            label = self._dropped_by(
                (zeroed.get(p) for p in range(first, first + self.blocks_per_chunk)),
                drafted=chunk in self.drafted.get(req_id, ()),
            )
            if label is None:
                left.append(chunk)
            else:
                engine.known_bug_hits.append((label, -1))
        return left


class ReplayLiveness(WindowLiveness):
    """L3, liveness for a sliding-window group under vLLM's default checkpoint
    retention (0): the chunks ending at a request's reachable boundaries are offered
    to the tier. Under that retention vLLM's reachability mask keeps no segment tails,
    only the blocks a hit at each such boundary reads, down to the hit alignment:

    * the replay boundary, the prompt less its last token: where the same prompt sent
      again can hit at most, so that a user who repeats a prompt under vLLM's defaults
      loads its window from the tier;
    * the shared-prefix junction (``Request.shared_prefix_boundary``): where the
      request's GPU prefix-cache hit of full attention ran past the window group's,
      which had not kept that prefix; pinned so that the next request sharing it hits.
      A request preempted and resumed looks its prefix up again and can find a junction
      its first run did not have, past its replay boundary too (among its output
      tokens): the chunk ending there is held like any other.

    Held only where such a boundary also ends one of the group's chunks (a hit ends on
    a chunk of every group), and where the request computed the boundary's last token
    itself. The mask keeps the blocks a hit at the boundary reads, all of them in the
    request's window as that step computes them, so the chunk is offered even where an
    earlier block of it is null. ``coarse``: where the mask cannot tell which blocks a
    hit reads (the hit alignment is no multiple of the group's block), it calls every
    block reachable and skips a chunk holding a null block, by design; there a chunk in
    which the request's table held a null block once that step was scheduled (a
    prefill in pieces, whose window moved on between them) is not held. Reset,
    preemption and ``tolerate`` as in :class:`WindowLiveness`; with
    :data:`RESUMED_FRONTIER` tolerated, a chunk a request first computed after a
    preemption, below the store frontier its connector state kept through that
    preemption, is recorded, not reported (``resumed-junction-chunk-never-offered``:
    the frontier of a run that hit past its replay boundary, or the chunk at a
    junction found anew).
    """

    INVARIANT = "L3 the chunks at a request's reachable boundaries are offered to the tier"
    WHAT = "the sliding-window chunks {}, each ending at its replay boundary or a junction,"

    def __init__(
        self,
        group: int,
        chunk_tokens: int,
        alignment: int,
        blocks_per_chunk: int,
        coarse: bool,
        tolerate: Iterable[str] = (),
        *,
        window_blocks: int | None = None,
        any_null: bool = False,
    ) -> None:
        # L2's ``coarse`` leaves out every chunk a request's table ever held a null
        # block in; here only a held chunk as its last token is computed counts.
        # ``any_null``: L2's rule (where a fix skips every chunk holding a null block:
        # unaligned-hybrid-hit-reads-unstored-block, fixed, in a layout with finer
        # chunks than the alignment).
        super().__init__(
            group,
            chunk_tokens,
            math.lcm(alignment, chunk_tokens),
            blocks_per_chunk,
            coarse=any_null,
            tolerate=tolerate,
        )
        self.alignment = alignment
        self.skips_null_chunks = coarse
        # per request, each preemption's step and the chunk its connector state would
        # offer next as that step ended
        self.kept: dict[str, list[tuple[int, int]]] = {}
        # sparse-retention-shorter-hit-reads-unstored-block, fixed: the blocks before
        # each aligned boundary a hit there reads (``window_blocks``; None: unknown, so
        # every block); None where the fix is not applied
        self.dense_window: int | None = None
        if SPARSE_NULLS_FIXED:
            self.dense_window = alignment if window_blocks is None else window_blocks
        # per request: the store frontier last seen, the null positions of its table as
        # the store passed each chunk, those when it last ran (SegmentLiveness, and
        # ReplayLiveness where the fix above is applied)
        self.passed_at: dict[str, int] = {}
        self.nulls_passed: dict[str, dict[int, set[int]]] = {}
        self.nulls_last: dict[str, set[int]] = {}
        # per request, the step in which the store last passed each chunk (kept where
        # the fix above is applied: a frontier sent back is then followed)
        self.passed_in: dict[str, dict[int, int]] = {}

    def __call__(self, engine: Any) -> None:
        super().__call__(engine)
        for req_id in engine.history[-1].output.preempted_req_ids or ():
            status = engine.connector._req_status.get(req_id)
            if status is not None:
                at = status.group_states[self.group].next_stored_chunk_idx
                self.kept.setdefault(req_id, []).append((engine.step_no, at))
        if self.dense_window is not None or isinstance(self, SegmentLiveness):
            self._record_passed(engine)

    def _record_passed(self, engine: Any) -> None:
        """The null positions of each request's table as its store passed each chunk."""
        self.nulls_last.update(self._table_nulls(engine))
        for req_id, status in engine.connector._req_status.items():
            now = status.group_states[self.group].next_stored_chunk_idx
            passed = self.nulls_passed.setdefault(req_id, {})
            if self.dense_window is not None:
                # a frontier sent back (a lookup anew, a reset) passes its chunks again
                self.passed_at[req_id] = min(self.passed_at.get(req_id, 0), now)
            for chunk in range(self.passed_at.get(req_id, 0), now):
                # this step's table, or for a request no longer in the tables (the
                # final store of one that finished), its table when it last ran
                passed[chunk] = self.nulls_last.get(req_id, set())
                self.passed_in.setdefault(req_id, {})[chunk] = engine.step_no
            self.passed_at[req_id] = now

    def _skipped_for_a_dense_null(self, req_id: str, chunk: int) -> bool:
        """sparse-retention-shorter-hit-reads-unstored-block, fixed: whether the store
        last passed ``chunk`` with a null block a hit at some aligned boundary reads,
        once the request had computed the chunk (for a finished request's final store,
        by its table when it last ran)."""
        bpc = self.blocks_per_chunk
        passed_in = self.passed_in.get(req_id, {})
        if chunk in passed_in and passed_in[chunk] < self.computed_at[req_id][chunk]:
            return False  # passed before the request computed it: not why it is missing
        nulls = self.nulls_passed.get(req_id, {}).get(chunk, self.nulls_last.get(req_id, set()))
        return any(
            self._densely_reachable(p) for p in nulls & set(range(chunk * bpc, (chunk + 1) * bpc))
        )

    def _densely_reachable(self, position: int) -> bool:
        """sparse-retention-shorter-hit-reads-unstored-block, fixed: whether a hit at
        some aligned boundary reads ``position`` (vLLM's dense mask: the window's
        blocks before every multiple of the alignment)."""
        assert self.dense_window is not None
        block = self.chunk_tokens // self.blocks_per_chunk
        if self.alignment % block:
            return True  # the mask cannot tell: every block is reachable
        per_segment = self.alignment // block
        need = self.dense_window
        return need >= per_segment or position % per_segment >= per_segment - need

    def _held_chunks(self, engine: Any, req_id: str, start: int, end: int) -> Iterable[int]:
        request = engine.requests[req_id]
        # the junction as the step's schedule left it (0: none; vLLM 0.30.0 on)
        replay = (request.num_prompt_tokens - 1) // self.alignment * self.alignment
        junction = getattr(request, "shared_prefix_boundary", 0)
        junction = junction // self.alignment * self.alignment
        tables = engine.history[-1].tables
        for boundary in sorted({replay, junction}):
            if not start < boundary <= end or boundary % self.chunk_tokens:
                continue
            chunk = boundary // self.chunk_tokens - 1
            if not self._skipped_for_null(tables, req_id, chunk):
                yield chunk

    def _skipped_for_null(self, tables: Any, req_id: str, chunk: int) -> bool:
        """Under a coarse mask, whether ``req_id``'s table held a null block in
        ``chunk`` once this step was scheduled (vLLM then skips the chunk by design)."""
        first = chunk * self.blocks_per_chunk
        return self.skips_null_chunks and any(
            (req_id, self.group, p) not in tables
            for p in range(first, first + self.blocks_per_chunk)
        )

    def reported(self, engine: Any, req_id: str, missing: list[int]) -> list[int]:
        """As :meth:`WindowLiveness.reported`, less the tolerated chunks a resumed
        request computed again below the frontier it kept, each recorded. A chunk
        first computed before the preemption was judged by its run's own mask and
        stays reported.

        Where sparse-retention-shorter-hit-reads-unstored-block is fixed, a chunk that
        held a null block a hit at any aligned boundary reads, as the store passed it,
        is left out too: the fixed store skips it by design."""
        if self.dense_window is not None:
            missing = [c for c in missing if not self._skipped_for_a_dense_null(req_id, c)]
        left = super().reported(engine, req_id, missing)
        if RESUMED_FRONTIER not in self.tolerate:
            return left
        computed = self.computed_at.get(req_id, {})
        kept = self.kept.get(req_id, [])
        behind = {c for c in left if any(computed[c] >= s and c < at for s, at in kept)}
        engine.known_bug_hits.extend((RESUMED_FRONTIER, -1) for _ in behind)
        return [c for c in left if c not in behind]


class SegmentLiveness(ReplayLiveness):
    """L4, liveness for a sliding-window group under a periodic checkpoint retention
    (``prefix_cache_retention_interval`` k > 0, a multiple of the group's chunk): besides
    L3's reachable boundaries, vLLM's mask keeps the blocks a hit reads at the end of
    every k-token segment, so a hit can end there once the GPU prefix cache has let the
    prefix go. At each such boundary that is also one where a CPU-tier hit can end (a
    multiple of the hit alignment), the group's chunk ending there is offered to the
    tier, by the request that computed its last token or by an earlier store.

    By design vLLM stores no chunk holding a null block its mask calls reachable: the
    ``window_blocks`` blocks before a segment's end, or before a replay boundary or
    junction (down to the hit alignment). A chunk holding such a null block when the
    store passed over it (its request's table, once the step that moved the store's
    frontier past the chunk was scheduled; for a finished request's last store, its
    table when it last ran) is not held to the check. Measured: a replay boundary
    floored into a segment chunk's first block (an 8-token alignment, 16-token chunks,
    a one-block window), which the window had left, made vLLM 0.34.0 skip that chunk.

    ``coarse``: where vLLM's mask cannot tell which blocks a hit reads (the alignment is
    no multiple of the group's block, or a hit's window spans a whole segment), it calls
    every block reachable, as under dense retention. There, as for
    :class:`WindowLiveness`, a chunk in which the request's own table held a null block
    while it ran is not held to the check (L3's narrower rule left such a chunk reported,
    in a prefill of 24-token chunks of 8-token blocks).
    """

    INVARIANT = (
        "L4 the chunks at segment boundaries under periodic retention are offered to the tier"
    )
    WHAT = (
        "the sliding-window chunks {}, each ending at a segment boundary, its replay "
        "boundary or a junction,"
    )

    def __init__(
        self,
        group: int,
        chunk_tokens: int,
        alignment: int,
        blocks_per_chunk: int,
        interval: int,
        window_blocks: int,
        coarse: bool,
        tolerate: Iterable[str] = (),
    ) -> None:
        super().__init__(
            group,
            chunk_tokens,
            alignment,
            blocks_per_chunk,
            coarse=False,
            tolerate=tolerate,
            window_blocks=window_blocks,
        )
        self.interval = interval
        self.segment = math.lcm(interval, alignment, chunk_tokens)
        self.window_blocks = window_blocks
        self.coarse = coarse  # WindowLiveness's rule: every null block a table held
        # per request, the junctions it had (the nulls as the store passed each chunk:
        # ReplayLiveness._record_passed)
        self.junctions: dict[str, set[int]] = {}

    def __call__(self, engine: Any) -> None:
        super().__call__(engine)
        for req_id, request in engine.requests.items():
            if junction := getattr(request, "shared_prefix_boundary", 0):
                self.junctions.setdefault(req_id, set()).add(junction)

    def _held_chunks(self, engine: Any, req_id: str, start: int, end: int) -> Iterable[int]:
        held = set(super()._held_chunks(engine, req_id, start, end))
        for k in range(start // self.segment + 1, end // self.segment + 1):
            held.add(k * self.segment // self.chunk_tokens - 1)
        return sorted(held)

    def _reachable_positions(self, request: Any) -> set[int]:
        """The positions vLLM's mask calls reachable for ``request``: the window's
        blocks before each segment's end, its replay boundary and its junctions."""
        block = self.chunk_tokens // self.blocks_per_chunk
        aligned = {
            b // self.alignment * self.alignment
            for b in (request.num_prompt_tokens - 1, *self.junctions.get(request.request_id, ()))
        }
        ends = {*range(self.interval, request.num_tokens + 1, self.interval), *aligned}
        return {p for end in ends for p in range(end // block - self.window_blocks, end // block)}

    def reported(self, engine: Any, req_id: str, missing: list[int]) -> list[int]:
        """As :meth:`ReplayLiveness.reported`, less the chunks holding a reachable null
        block as the store passed them, which vLLM skips by design."""
        reachable = self._reachable_positions(engine.requests[req_id])
        passed = self.nulls_passed.get(req_id, {})
        last = self.nulls_last.get(req_id, set())
        bpc = self.blocks_per_chunk
        kept = [
            chunk
            for chunk in missing
            if not reachable & passed.get(chunk, last) & set(range(chunk * bpc, (chunk + 1) * bpc))
        ]
        return super().reported(engine, req_id, kept)
