"""The recurrent layout at the unit layer, and RecurrentMachine, its random workloads.

Partial-tail and aligned-boundary stores (Mamba "align" groups) read copy-on-write
hand-off blocks that belong to no request's table. The harness's engine has no Mamba
model runner, so this layout is driven at the unit layer (fence brief §13): the real
``OffloadingConnectorScheduler`` over a full-attention plus Mamba "align" layout
(:func:`recurrent_scheduler`), fed scheduler outputs that carry boundary-state
hand-offs (:func:`_hand_offs`). ``test_fence_recurrent.py`` holds its tests;
``fence_machines.MACHINES`` registers the machine for the hunt.
"""

from __future__ import annotations

import dataclasses

import torch
from fence_harness import FenceOffloadingSpec, vllm_config
from fence_oracle import FenceViolation, Violation, check_state
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    KVCacheBlockCopy,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched import output as sched_output
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

BLOCK = 16

# How a step's scheduler output hands the connector a recurrent group's boundary
# state, per release:
# - vLLM 0.30.0 on: ``kv_connector_block_state``, a ``KVConnectorBlockState`` with
#   ``req_ids`` and ``resolve_block_ids`` beside ``boundary_state_offloads``;
# - vLLM 0.29.0: the same class with a ``block_ids`` dict in place of those two;
# - vLLM 0.28.0: no such class; ``partial_tail_offloads`` carries the hand-offs of
#   partial tails only (mid-block boundaries), and a hand-off on a block boundary has
#   no store at all: ``_build_aligned_boundary_store_jobs`` came in 0.29.0.
BLOCK_STATE = getattr(sched_output, "KVConnectorBlockState", None)
HAS_BOUNDARY_STORES = hasattr(OffloadingConnectorScheduler, "_build_aligned_boundary_store_jobs")


def _hand_offs(handoffs: dict[str, list[tuple[int, int, int]]]) -> SchedulerOutput:
    output = SchedulerOutput.make_empty()
    if BLOCK_STATE is None:  # 0.28.0
        output.partial_tail_offloads = handoffs  # type: ignore[attr-defined]
        return output
    fields = {f.name for f in dataclasses.fields(BLOCK_STATE)}
    ids: dict[str, object] = (
        {"req_ids": set(), "resolve_block_ids": {}.__getitem__}
        if "resolve_block_ids" in fields
        else {"block_ids": {}}  # 0.29.0
    )
    output.kv_connector_block_state = BLOCK_STATE(boundary_state_offloads=handoffs, **ids)
    return output


def recurrent_scheduler(window_blocks: int | None = None) -> OffloadingConnectorScheduler:
    """The real connector scheduler over a full-attention plus Mamba "align" layout
    (64 GPU blocks of ``BLOCK`` tokens), partial tails on; with ``window_blocks``, a
    sliding-window group of that many blocks after them (group 2), hits in whole
    blocks and no partial tails."""
    config = vllm_config(block_size=BLOCK, num_gpu_blocks=64)
    if window_blocks is None:
        config.cache_config.prefix_match_unit = 4  # fine-grained hits: partial tails
    common = {"num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    sliding = (
        []
        if window_blocks is None
        else [
            KVCacheGroupSpec(
                ["sliding"],
                SlidingWindowSpec(
                    block_size=BLOCK,
                    sliding_window=window_blocks * BLOCK,
                    **common,  # type: ignore[arg-type]
                ),
            )
        ]
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["full"],
                FullAttentionSpec(block_size=BLOCK, **common),  # type: ignore[arg-type]
            ),
            KVCacheGroupSpec(
                ["mamba"],
                MambaSpec(
                    block_size=BLOCK,
                    shapes=((1, 1),),
                    dtypes=(torch.float32,),
                    mamba_cache_mode="align",
                ),
            ),
            *sliding,
        ],
    )
    spec = FenceOffloadingSpec(build_offloading_config(config, kv_cache_config))
    sched = OffloadingConnectorScheduler(spec, config, kv_cache_config)
    assert sched.config.supports_partial_tail == (window_blocks is None)
    init_none_hash(sha256)
    return sched


# The random workloads of this layout. The engine-level machines (fence_machines.py)
# cannot reach these stores: the harness's engine has no Mamba model runner. This
# machine plays the KV-cache manager's side by hand, as the unit tests of
# test_fence_recurrent.py do, with the choices drawn at random: requests arrive with
# their tables, the scheduler hands off recurrent states mid-block (partial tails) and
# on block boundaries into copy-on-write blocks, the manager hands freed blocks (fenced
# or not) to new copies and to growing tables, requests finish, and the worker completes
# the stores in any order. After every call the fence must hold exactly what the live
# stores read (check_state), and a fenced block handed out again must flush every store
# that reads it.

POOL = range(1, 32)  # block 0 is the null block
MAX_PROMPT = 4 * BLOCK
MAX_REQUESTS = 3
# Swarm testing, as in fence_machines.py: each program enables a random subset
# of these, so that stores pile up on the fenced blocks of a program that completes
# none of them before a flush, or never finishes a request. (Reuse, what the fence
# is for, is always on.)
RECURRENT_ACTIONS = ("complete", "finish", "reset")


class RecurrentMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sched = recurrent_scheduler()
        self.step = 0
        self.requests: dict[str, Request] = {}  # live: not yet finished
        self.held: dict[str, list[int]] = {}  # each live request's blocks, both groups
        self.free = list(POOL)  # blocks no request holds, in the manager's free order
        self.finishing: set[str] = set()  # finished since the last step
        self.in_flight: set[int] = set()  # store jobs the worker still runs
        self.made = 0
        self.actions: frozenset[str] = frozenset(RECURRENT_ACTIONS)
        self.broken = False

    @initialize(
        enabled=st.lists(
            st.booleans(), min_size=len(RECURRENT_ACTIONS), max_size=len(RECURRENT_ACTIONS)
        )
    )
    def choose_actions(self, enabled: list[bool]) -> None:
        self.actions = frozenset(a for a, on in zip(RECURRENT_ACTIONS, enabled, strict=True) if on)

    def _fenced(self) -> set[int]:
        return set(self.sched._block_id_to_pending_jobs)

    def _check(self, found: list[Violation] | None = None, *, reset_pending: bool = False) -> None:
        found = found or check_state(self.sched, self.step, reset_pending=reset_pending)
        if found:
            self.broken = True  # teardown leaves the state as the failure left it
            raise FenceViolation(found)

    def _run_step(self, output: SchedulerOutput, handed: dict[int, str]) -> None:
        """One scheduler step: ``handed`` maps each block the manager hands to a new
        owner in it to that owner. The worker waits for the flushed stores before
        the forward pass, and reports them, with those that finished on their own,
        at the step's end."""
        self.step += 1
        output.finished_req_ids = set(self.finishing)
        before = {b: set(jobs) for b, jobs in self.sched._block_id_to_pending_jobs.items()}
        meta = self.sched.build_connector_meta(output)
        flushed = set(getattr(meta, "jobs_to_flush", ()) or ())
        for block, owner in sorted(handed.items()):
            missed = sorted(before.get(block, set()) - flushed)
            if missed:
                why = (
                    f"handed to {owner} while jobs {missed} still store it, and they are "
                    "not in jobs_to_flush"
                )
                self._check([Violation("I1/I2 flush on reuse", self.step, why, block, missed[0])])
        self._check()
        self.in_flight |= set(meta.store_jobs)
        self.finishing.clear()
        self._complete(flushed & self.in_flight)

    def _complete(self, jobs: set[int]) -> None:
        if not jobs:
            return
        self.in_flight -= jobs
        meta = OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(sorted(jobs), 1))
        self.sched.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=meta))
        self._check()

    def _take(self, data: st.DataObject, *, fenced_ok: bool) -> int | None:
        """A free block for a new owner; the fenced ones only where the step that
        hands it out tells the connector (``fenced_ok``)."""
        fenced = self._fenced()
        choices = [b for b in self.free if fenced_ok or b not in fenced]
        if not choices:
            return None
        # The manager reuses the blocks freed first; the draw favours the reuse the
        # fence is for: a fenced block, or one several stores read (rare otherwise).
        hazards = [b for b in choices if b in fenced]
        shared = [b for b in hazards if len(self.sched._block_id_to_pending_jobs[b]) > 1]
        kinds = {"first freed": choices[:1], "fenced": hazards, "shared": shared, "any": choices}
        kind = data.draw(st.sampled_from([k for k, blocks in kinds.items() if blocks]))
        block = data.draw(st.sampled_from(kinds[kind]))
        self.free.remove(block)
        return block

    @precondition(lambda self: len(self.requests) < MAX_REQUESTS)
    @rule(data=st.data(), length=st.integers(4, MAX_PROMPT))
    def add_request(self, data: st.DataObject, length: int) -> None:
        """A request with its tables: full attention holds every block of the
        prompt, Mamba only its running state (the null block before it)."""
        req_id = f"req-{self.made}"
        tokens = list(range(1000 * (self.made + 1), 1000 * (self.made + 1) + length))
        self.made += 1
        blocks = -(-length // BLOCK)
        taken = [self._take(data, fenced_ok=False) for _ in range(blocks + 1)]
        if None in taken:
            self.free += [b for b in taken if b is not None]
            return
        table = [b for b in taken if b is not None]
        request = Request(
            request_id=req_id,
            prompt_token_ids=tokens,
            sampling_params=SamplingParams(max_tokens=4, ignore_eos=True),
            pooling_params=None,
            block_hasher=get_request_block_hasher(4, sha256),
        )
        request.num_computed_tokens = length
        request.status = RequestStatus.RUNNING
        self.sched.on_new_request(request)
        state = self.sched._req_status[req_id]
        state.group_states[0].block_ids[:] = table[:blocks]
        state.group_states[1].block_ids[:] = [0] * (blocks - 1) + [table[blocks]]
        self.requests[req_id] = request
        self.held[req_id] = table

    @precondition(lambda self: bool(self.requests) and bool(self.free))
    @rule(data=st.data(), copy=st.booleans())
    def hand_off(self, data: st.DataObject, copy: bool) -> None:
        """The scheduler hands off a request's recurrent state at a token count
        (mid-block: a partial tail; on a boundary: an aligned-boundary store) in a
        copy-on-write block, which goes back to the free blocks after the step. With
        ``copy``, the step's block copies write that block (and the connector must
        flush a store still reading it); without, the manager picks an unfenced one."""
        req_id = data.draw(st.sampled_from(sorted(self.requests)))
        length = self.requests[req_id].num_prompt_tokens
        # vLLM 0.28.0 hands off mid-block states only (no aligned-boundary stores)
        points = [t for t in range(4, length + 1, 4) if HAS_BOUNDARY_STORES or t % BLOCK]
        if not points:
            return
        # now and then beside a store in flight: a second partial tail in an
        # attention block another store reads puts two jobs on one block
        fenced = self._fenced()
        beside = [t for t in points if t % BLOCK and self.held[req_id][t // BLOCK] in fenced]
        tokens = data.draw(st.sampled_from(data.draw(st.sampled_from([points, beside or points]))))
        block = self._take(data, fenced_ok=copy and HAS_BOUNDARY_STORES)
        if block is None:
            return
        output = _hand_offs({req_id: [(1, block, tokens)]})
        handed = {}
        if copy and HAS_BOUNDARY_STORES:
            output.kv_cache_block_copies = [KVCacheBlockCopy(self.held[req_id][-1], block)]
            handed[block] = f"a copy-on-write copy of {req_id}'s state"
        self._run_step(output, handed)
        self.free.append(block)

    @precondition(lambda self: bool(self.free))
    @rule(data=st.data(), how=st.sampled_from(["copy", "table"]))
    def reuse(self, data: st.DataObject, how: str) -> None:
        """The manager hands a free block, fenced or not, to a new owner: a block
        copy's destination (vLLM 0.29.0 on; the block is free again after the step)
        or a live request's growing attention table."""
        if how == "copy" and not HAS_BOUNDARY_STORES:
            return
        if how == "table" and not self.requests:
            return
        block = self._take(data, fenced_ok=True)
        assert block is not None
        output = SchedulerOutput.make_empty()
        if how == "copy":
            source = data.draw(st.sampled_from(sorted(self.held) or ["none"]))
            src = self.held[source][-1] if source in self.held else block
            output.kv_cache_block_copies = [KVCacheBlockCopy(src, block)]
            self._run_step(output, {block: "a copy-on-write copy"})
            self.free.append(block)
            return
        req_id = data.draw(st.sampled_from(sorted(self.requests)))
        cached = output.scheduled_cached_reqs
        cached.req_ids = [req_id]
        cached.new_block_ids = [([block], [])]
        self._run_step(output, {block: f"{req_id}'s attention table"})
        self.held[req_id].insert(-1, block)

    @precondition(lambda self: bool(self.requests) and "finish" in self.actions)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A request finishes: the connector is told before its blocks are freed,
        the next step names it finished, and the blocks go back to the free ones."""
        self._finish(data.draw(st.sampled_from(sorted(self.requests))))

    def _finish(self, req_id: str) -> None:
        request = self.requests.pop(req_id)
        request.status = RequestStatus.FINISHED_ABORTED
        self.sched.request_finished(request)
        self._check()
        self.finishing.add(req_id)
        self._run_step(SchedulerOutput.make_empty(), {})
        self.free += self.held.pop(req_id)

    def _shared_held(self) -> dict[str, list[int]]:
        """Each live request's fenced blocks: once it finishes, its final store
        reads them too (a partial tail's attention block then has two stores)."""
        fence = self.sched._block_id_to_pending_jobs
        shared = {req_id: [b for b in self.held[req_id] if b in fence] for req_id in self.requests}
        return {req_id: blocks for req_id, blocks in shared.items() if blocks}

    @precondition(lambda self: HAS_BOUNDARY_STORES and bool(self._shared_held()))
    @rule(data=st.data())
    def recycle(self, data: st.DataObject) -> None:
        """A request holding a fenced block finishes, and the next step hands that
        block to a block copy at once (the manager reuses what was freed
        last when nothing is cached in it): every one of those stores must be
        flushed. Without this, the random programs rarely freed such a block while
        its stores were in flight, and more rarely still handed it on."""
        shared = self._shared_held()
        req_id = data.draw(st.sampled_from(sorted(shared)))
        block = data.draw(st.sampled_from(shared[req_id]))
        self._finish(req_id)
        self.free.remove(block)
        output = SchedulerOutput.make_empty()
        output.kv_cache_block_copies = [KVCacheBlockCopy(block, block)]
        self._run_step(output, {block: "a copy-on-write copy"})
        self.free.append(block)

    @precondition(lambda self: bool(self.in_flight) and "complete" in self.actions)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        """The worker reports some of its stores done, in any order."""
        done = data.draw(st.sets(st.sampled_from(sorted(self.in_flight)), min_size=1))
        self._complete(done)

    @precondition(lambda self: "reset" in self.actions)
    @rule()
    def reset_cache(self) -> None:
        """The prefix caches are reset: every job in flight is discarded and flushed
        by the next step, whose workers report them done; their stale completions
        must not touch the jobs that follow."""
        self.sched.reset_cache()
        self._check(reset_pending=True)
        self._run_step(SchedulerOutput.make_empty(), {})

    @rule()
    def idle_step(self) -> None:
        self._run_step(SchedulerOutput.make_empty(), {})

    def teardown(self) -> None:
        if self.broken:
            return  # already failed: stepping on would only hide the failure
        for req_id in sorted(self.requests):
            request = self.requests.pop(req_id)
            request.status = RequestStatus.FINISHED_ABORTED
            self.sched.request_finished(request)
            self.finishing.add(req_id)
        self._run_step(SchedulerOutput.make_empty(), {})
        self._complete(set(self.in_flight))
        fence = self.sched._block_id_to_pending_jobs
        assert fence == {}, f"the fence did not drain: {fence}"
        assert not self.sched._jobs, f"jobs left: {sorted(self.sched._jobs)}"
