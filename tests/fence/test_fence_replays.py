"""Programs the hunt (``nox -s hunt``) or the random workloads met, kept and replayed.

Each starts its machine with ``fence_machines.replay``, naming only where its start
differs from ``fence_machines.PROGRAM_START``, then takes the shrunk program's steps.
Most met a fault of the harness, fixed, and are kept so that it stays fixed; the others
meet a known vLLM bug, a strict expected failure where the registry lists it
(``known_bug``), or check the tolerance the random workloads give it there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import fence_machines
import pytest
from fence_config import LOOKAHEAD_HASHES
from fence_contents import NULL_PLACEHOLDERS
from fence_findings import has_bug, known_bug
from fence_harness import (
    PREEMPTED_THEN_FINISHED,
    UNALIGNED_HIT,
    UNSTORED_SLOT,
    ContentViolation,
    FenceEngine,
)
from fence_machines import (
    PREFIXES,
    FenceMachine,
    RemoteWindowMachine,
    Segments,
    SpeculativeMachine,
    WindowMachine,
    replay,
)
from fence_oracle import (
    DRAFTED_CHUNK_ZEROED,
    RESUMED_FRONTIER,
    FenceViolation,
    ReplayLiveness,
    SegmentLiveness,
    StoreLiveness,
    WindowLiveness,
)
from fence_plant import fixes_touching
from fence_tolerance import PREEMPT_ALL, REMOTE_WINDOW


def test_an_eagle_program_s_pool_holds_its_longest_request_and_its_lookahead() -> None:
    """A hunt's program (0.33.0, 2026-12-07, round 55, seed 4180066628), shrunk: an
    EAGLE drafter of three draft tokens and one 31-token request. Its last steps need
    its tokens and the drafter's 3 lookahead slots, 9 blocks of 4 tokens; a pool sized
    for the longest request alone held 8, and the request was preempted for ever (the
    drain stopped). The pool now counts the lookahead (_fitting_pool)."""
    state = replay(SpeculativeMachine, eagle=True, layout="full", spec_tokens=3)
    state.add_request(max_tokens=9, prefix=tuple(range(100, 112)), remote_blocks=0, tail=10)
    engine = state.engine
    assert engine is not None
    state.teardown()
    assert [q.is_finished() for q in engine.requests.values()] == [True]
    assert engine.scheduler.num_lookahead_tokens == 3


@pytest.mark.parametrize("layout", ["full", "sliding"])
@pytest.mark.parametrize("seed", [0, 1])
def test_an_eagle_program_runs_the_lookahead_hashes_when_its_seed_is_odd(
    layout: str, seed: int
) -> None:
    """On a release with lookahead block hashes (0.34.0 on), an EAGLE program of odd
    seed runs them and is held to a liveness check (L1 in the full layout, L3 under
    the default retention in a sliding-window one); one of even seed runs vLLM's
    fallback, with no liveness check (its drafter drops a hit's last block). On older
    releases every EAGLE program runs the fallback."""
    state = replay(
        FenceMachine,
        async_scheduling=False,
        cpu_chunks=4,
        eagle=True,
        layout=layout,
        seed=seed,
        window_blocks=2,
    )
    engine = state.engine
    assert engine is not None
    lookahead = LOOKAHEAD_HASHES and seed == 1
    assert engine.lookahead_hashes is lookahead
    assert engine.eagle_drop is not lookahead
    liveness = {"full": StoreLiveness, "sliding": ReplayLiveness}[layout]
    assert isinstance(state.liveness, liveness) if lookahead else state.liveness is None
    state.add_request(max_tokens=3, prefix=PREFIXES[3], remote_blocks=0, tail=5)
    state.teardown()
    assert all(request.is_finished() for request in engine.requests.values())


@pytest.mark.skipif(not REMOTE_WINDOW, reason="RemoteWindowMachine does not run on this release")
def test_a_long_queue_in_a_tight_pool_drains() -> None:
    """A hunt's program (2026-12-05, seed 2204860933): 59 requests queued at once in a
    pool with no spare block, then the teardown's drain. They run almost one at a
    time: the drain needed 300 steps then (the scheduler without the async flag), as
    many as a fixed budget gave it, so the harness called a working engine stuck. The
    drain's budget grows with the tokens the requests have left: given 50 steps for
    the transfers, this drain takes several times that."""
    state = replay(
        RemoteWindowMachine,
        blocks_per_chunk=2,
        cpu_chunks=4,
        enabled=[False, True, False, False],
        retention=None,
        window_blocks=3,
    )
    A, B, C = PREFIXES[1], PREFIXES[3], PREFIXES[2]
    # fmt: off
    queue = [  # (prefix, tail, max_tokens, remote_blocks)
        (A, 7, 9, 0), (A, 8, 9, 0), (A, 4, 7, 0), (A, 4, 1, 0), (A, 4, 1, 0), (A, 4, 1, 0),
        (A, 4, 7, 0), (A, 4, 1, 0), (A, 10, 7, 0), (A, 4, 7, 0), (A, 5, 6, 0), (A, 4, 7, 0),
        (B, 4, 7, 0), (A, 8, 6, 0), (A, 5, 8, 0), (A, 4, 3, 0), (B, 4, 5, 0), (A, 4, 7, 0),
        (A, 4, 7, 0), (B, 4, 7, 0), (A, 4, 7, 0), (A, 7, 6, 0), (A, 10, 8, 0), (A, 4, 7, 0),
        (A, 6, 5, 0), (A, 8, 6, 0), (A, 4, 2, 0), (A, 10, 10, 0), (A, 4, 1, 0), (A, 5, 10, 0),
        (A, 4, 1, 8), (A, 4, 8, 0), (B, 8, 3, 0), (A, 4, 7, 0), (B, 8, 5, 0), (B, 8, 8, 0),
        (A, 10, 4, 0), (A, 10, 9, 0), (B, 8, 8, 0), (A, 8, 1, 0), (A, 5, 9, 5), (B, 6, 1, 0),
        (A, 8, 4, 0), (A, 4, 3, 0), (A, 4, 2, 0), (A, 4, 7, 0), (A, 5, 10, 0), (A, 7, 7, 0),
        (A, 4, 7, 0), (B, 5, 6, 0), (C, 7, 3, 0), (A, 7, 4, 0), (A, 4, 2, 0), (C, 4, 9, 0),
        (B, 5, 5, 0), (B, 7, 6, 0), (A, 5, 7, 3), (A, 5, 1, 0), (A, 5, 4, 0),
    ]
    # fmt: on
    for prefix, tail, max_tokens, remote_blocks in queue:
        state.add_request(
            prefix=prefix, tail=tail, max_tokens=max_tokens, remote_blocks=remote_blocks
        )
        state.no_content_violation()
    engine = state.engine
    assert engine is not None
    before = engine.step_no
    engine.drain(max_steps=50)  # 50 steps for the transfers: the queue's budget is its own
    assert engine.step_no - before > 4 * 50  # what a fixed budget of 50 would not allow
    state.teardown()  # drained: the fence is empty, every store offered


def test_a_request_finished_while_preempted_is_held_to_the_chunks_it_kept() -> None:
    """A hunt's program on 0.34.0 (2026-12-05, seed 2622142995): async scheduling, a
    producer-only connector, a pool with no spare block. r6 computes its chunk 1 in
    step 33; in step 34 schedule() preempts it, freeing its blocks, and step 33's
    output then finishes it. Nothing can store chunk 1 from blocks that are no longer
    r6's (0.34.0 stores none; earlier releases store it from the freed block, the
    known preempted-final-store), and L1 asked for it."""
    state = replay(
        FenceMachine,
        cpu_chunks=2,
        enabled=[False, True, False, False],
        kv_role="kv_producer",
        layout="full",
    )
    a = PREFIXES[1]
    state.step(steps=4)
    state.add_request(max_tokens=1, prefix=(), remote_blocks=0, tail=0)
    state.step(steps=2)
    state.add_request(max_tokens=1, prefix=a, remote_blocks=0, tail=0)
    state.step(steps=18)
    state.add_request(max_tokens=5, prefix=(), remote_blocks=0, tail=0)
    state.add_request(max_tokens=1, prefix=a, remote_blocks=0, tail=0)
    state.follow_up(tail=0, wait=4)
    state.add_request(max_tokens=5, prefix=(), remote_blocks=0, tail=0)
    state.add_request(max_tokens=6, prefix=(), remote_blocks=0, tail=4)
    state.step(steps=1)
    state.follow_up(tail=3, wait=1)
    engine = state.engine
    assert engine is not None
    state.teardown()
    finished_while_preempted = [
        r
        for r, q in engine.requests.items()
        if q.is_finished() and q.num_preemptions and q.num_computed_tokens == 0
    ]
    assert finished_while_preempted == ["r6"]


def _chunk_skipping_program() -> FenceMachine:
    """A hunt's program on 0.34.0 (2026-12-05, seed 1250963677), up to its store job 1:
    a mixed layout of 4-token full-attention and 2-token sliding-window blocks, a
    one-block window, chunks of two blocks, dense retention (the hunt's, on a release
    with sparse-retention-shorter-hit), async scheduling, two requests."""
    state = replay(
        FenceMachine,
        block_sizes=(4, 2),
        blocks_per_chunk=2,
        cpu_chunks=4,
        enabled=[False, False, False, True],
        retention=None,
    )
    state.add_request(max_tokens=1, prefix=(), remote_blocks=0, tail=8)
    state.add_request(max_tokens=5, prefix=PREFIXES[1], remote_blocks=0, tail=5)
    state.step(steps=2)
    return state


def test_a_store_that_skips_a_chunk_places_each_chunk_whole() -> None:
    """From vLLM 0.34.0 a store copies each chunk whole, null blocks as placeholders,
    and skips the chunks it need not store. In the hunt's program r1's store job 1
    copies sliding-window chunks 1 and 3 ([0, 14] and [0, 15]) and skips chunk 2
    ([0, 16]). The ledger placed each block at the first index holding its id, so the
    second null block went to chunk 2: the job spanned five chunks where its CPU spec
    has four, and the harness raised IndexError. Each chunk is now placed whole."""
    state = _chunk_skipping_program()
    engine = state.engine
    assert engine is not None
    state.release_held()
    state.step(steps=4)
    for job_id, places in engine.ledger.job_places.items():
        job = engine.ledger.store_jobs.get(job_id)
        if job is None:
            continue
        chunks = {(group, index // 2) for group, index, _ in places}
        assert len(chunks) == len(job.dst_spec.block_ids), (job_id, places)
    # the hunt's program as vLLM 0.34.0 runs it: a fix of how the connector zeroes ids
    # or picks the chunks to store (docs/upstream/) changes what job 1 copies
    as_released = not any(map(fixes_touching, ("_update_req_states", "_build_store_jobs")))
    if NULL_PLACEHOLDERS and as_released:
        assert [p for p in engine.ledger.job_places[1] if p[0] == 1] == [
            (1, 2, 0),
            (1, 3, 14),
            (1, 6, 0),
            (1, 7, 15),
        ]
    state.teardown()


def test_teardown_leaves_an_engine_whose_step_raised_as_it_is() -> None:
    """A step that raised leaves vLLM half a step on (a store submitted whose
    deferred list was never cleared); the teardown's drain would then fail on that
    ("job 1 submitted twice to the worker") and Hypothesis would report the drain's
    error in place of the step's. The teardown steps no more."""
    state = _chunk_skipping_program()
    engine = state.engine
    assert engine is not None
    execute = engine.worker_side.execute

    def fails_once(*args: Any, **kwargs: Any) -> Any:
        engine.worker_side.execute = execute  # type: ignore[method-assign]
        raise RuntimeError("a step's failure")

    engine.worker_side.execute = fails_once  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="a step's failure"):
        state.step(steps=1)
    steps = engine.step_no
    state.teardown()
    assert engine.broken
    assert engine.step_no == steps


def test_a_load_of_a_tolerated_store_s_chunk_is_tolerated_too() -> None:
    """A hunt's program on 0.31.0 (2026-12-06, seed 157577034): a producer-only
    connector, async scheduling, one sliding-window group, a tier of one chunk. r3 is
    preempted with its last token in flight and finishes; its store (job 0) is the
    known preempted-final-store, tolerated, so the model did not track what it wrote.
    r4's hit then loads that chunk (job 1), which the model read as never written and
    reported. Such a load is the same bug's: recorded, not reported (0.28.0-0.33.0);
    0.34.0 builds no such store."""
    state = replay(
        FenceMachine, kv_role="kv_producer", layout="sliding", retention=None, window_blocks=3
    )
    state.add_request(max_tokens=6, prefix=PREFIXES[1], remote_blocks=0, tail=0)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=0, wait=2)
    state.add_request(max_tokens=10, prefix=(), remote_blocks=0, tail=8)
    state.follow_up(tail=0, wait=2)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=2, wait=1)
    state.add_request(max_tokens=1, prefix=(), remote_blocks=0, tail=8)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=1, wait=1)
    engine = state.engine
    assert engine is not None
    state.teardown()
    assert engine.contents.violations == []
    hits = {job for label, job in engine.known_bug_hits if label == PREEMPTED_THEN_FINISHED}
    loads = hits & engine.ledger.load_jobs.keys()
    if has_bug("preempted-final-store"):
        assert hits - loads  # the store itself
        assert loads  # and the load of what it wrote
    else:
        assert not hits


def test_a_recompute_short_of_the_last_token_samples_nothing() -> None:
    """A hunt's program on 0.33.0 (2026-12-06, seed 438847523): sync scheduling, the
    second connector, cache resets that preempt every running request. In step 23 r7
    (8 prompt tokens, 12 tokens, preempted with none computed) is recomputed 11 tokens
    short of its last one. vLLM's model runner discards what it samples for a request
    whose tokens the step leaves uncomputed; the harness's runner sampled a token
    anyway (it asked only whether the prompt was computed), so r7 finished at its
    length cap with token 11 never computed, and its final store read block 2 holding
    tokens 8-10 only. On 0.33.0 the content model reported that store."""
    state = replay(
        FenceMachine,
        async_scheduling=False,
        blocks_per_chunk=3,
        cpu_chunks=6,
        enabled=[False, True, True, True],
        layout="full",
        remote_source=True,
        spare_blocks=12,
    )
    a, b = PREFIXES[2], PREFIXES[1]
    state.add_request(max_tokens=10, prefix=a, remote_blocks=1, tail=6)
    state.follow_up(tail=0, wait=2)
    state.add_request(max_tokens=6, prefix=(), remote_blocks=0, tail=0)
    for wait in (1, 2, 3, 2):
        state.follow_up(tail=0, wait=wait)
    state.follow_up(tail=2, wait=1)
    state.follow_up(tail=0, wait=2)
    state.add_request(max_tokens=9, prefix=(), remote_blocks=1, tail=6)
    if PREEMPT_ALL:
        state.preempt_all()
    state.follow_up(tail=0, wait=4)
    state.release_held()
    state.add_request(max_tokens=6, prefix=(), remote_blocks=0, tail=7)
    state.add_request(max_tokens=6, prefix=b, remote_blocks=0, tail=0)
    state.follow_up(tail=2, wait=1)
    state.follow_up(tail=0, wait=4)
    if PREEMPT_ALL:
        state.preempt_all()
    state.reset_cache()
    engine = state.engine
    assert engine is not None
    state.teardown()
    assert engine.contents.violations == []
    # every request that finished computing had computed all but its last token
    finished = [q for q in engine.requests.values() if q.is_finished() and q.num_computed_tokens]
    assert finished
    assert [q.request_id for q in finished if q.num_computed_tokens < q.num_tokens - 1] == []


def _window_slid_past_program(*, strict: bool) -> FenceMachine:
    """The 0.31.0 hunt's program below, up to its teardown; ``strict``: without the
    machine's tolerance of the loads of unwritten slots."""
    state = replay(
        FenceMachine,
        blocks_per_chunk=2,
        cpu_chunks=3,
        delays=[0],
        layout="sliding",
        retention=None,
        spare_blocks=12,
        window_blocks=3,
    )
    assert state.engine is not None
    if strict:
        state.engine.tolerate = state.engine.tolerate - {UNSTORED_SLOT}
    a, d = PREFIXES[1], PREFIXES[3]
    state.add_request(max_tokens=1, prefix=(), remote_blocks=0, tail=0)
    state.step(steps=1)
    state.add_request(max_tokens=8, prefix=a, remote_blocks=0, tail=2)
    state.add_request(max_tokens=10, prefix=d, remote_blocks=0, tail=2)
    state.step(steps=1)
    state.step(steps=1)
    state.step(steps=1)
    state.step(steps=3)
    state.add_request(max_tokens=9, prefix=a, remote_blocks=0, tail=0)
    state.add_request(max_tokens=10, prefix=(), remote_blocks=0, tail=6)
    state.follow_up(tail=0, wait=3)
    state.step(steps=1)
    state.follow_up(tail=0, wait=1)
    state.step(steps=4)
    state.add_request(max_tokens=6, prefix=(), remote_blocks=0, tail=9)
    state.add_request(max_tokens=5, prefix=(), remote_blocks=0, tail=10)
    state.follow_up(tail=2, wait=1)
    state.add_request(max_tokens=4, prefix=d, remote_blocks=0, tail=5)
    state.follow_up(tail=3, wait=1)
    state.step(steps=1)
    state.follow_up(tail=0, wait=4)
    state.step(steps=1)
    return state


@known_bug(
    "reachable-null-block-chunk-stored",
    raises=ContentViolation,
    reason="a chunk is stored with the null block the window slid past, and a later "
    "hit loads that slot unwritten",
)
def test_a_window_slid_past_a_chunk_s_first_block_leaves_no_slot_unwritten() -> None:
    """A hunt's program on 0.31.0 (2026-12-05, seed 302697075), with dense retention:
    the registered reachable-null-block-chunk-stored without a second connector. With
    async scheduling a request's window slides past its first block, which the
    sliding-window manager nulls; on 0.28.0-0.32.0 its store then writes a chunk of
    two blocks from that one block short (store job 11: GPU blocks 6, 17, 19 into two
    CPU chunks), leaving a slot of CPU chunk 0 as an earlier store wrote it, and r12's
    hit loads it into its block 0. vLLM 0.33.0 stores only the chunk without a null
    block. Under vLLM's default retention it fails on 0.33.0 and 0.34.0 too (the
    registered sparse-retention-shorter-hit-reads-unstored-block); with sync
    scheduling it passes on 0.30.0-0.34.0."""
    # the machine tolerates it where the registry lists it: not here
    _window_slid_past_program(strict=True).teardown()


def _unaligned_hit_program(*, strict: bool) -> FenceMachine:
    """A hunt's program on 0.34.0 (2026-12-06, seed 708388464, round 112), up to its
    teardown, with dense retention as the hunt sets it: a mixed layout of 4-token
    full-attention blocks and 2-token sliding-window blocks, the second connector
    loading the first two requests, then a third whose CPU-tier hit the window's
    shorter chunks cut to 4 tokens (docs/findings.toml:
    unaligned-hybrid-hit-reads-unstored-block). ``strict``: without the machine's
    tolerance of that bug's loads."""
    state = replay(
        FenceMachine,
        block_sizes=(4, 2),
        blocks_per_chunk=2,
        cpu_chunks=6,
        delays=[0],
        remote_source=True,
        retention=None,
        window_blocks=3,
    )
    assert state.engine is not None
    if strict:
        state.engine.tolerate = state.engine.tolerate - {UNALIGNED_HIT}
    state.add_request(max_tokens=1, prefix=PREFIXES[1], remote_blocks=8, tail=5)
    state.add_request(max_tokens=1, prefix=PREFIXES[2], remote_blocks=2, tail=5)
    state.step(steps=1)
    state.step(steps=1)
    state.step(steps=3)
    state.add_request(max_tokens=1, prefix=PREFIXES[1], remote_blocks=0, tail=1)
    state.step(steps=1)
    return state


@known_bug(
    "unaligned-hybrid-hit-reads-unstored-block",
    raises=ContentViolation,
    reason=(
        "the third request's hit, cut to 4 tokens by the window's shorter chunks, loads "
        "the window's slot the second request's store left out"
    ),
)
def test_a_hit_cut_off_the_full_attention_chunk_loads_only_stored_slots() -> None:
    """The hunt's program, strict: a strict expected failure where the registry lists
    the bug, clean elsewhere (before 0.33.0 the machine runs it without the second
    connector, REMOTE_SOURCE)."""
    _unaligned_hit_program(strict=True).teardown()


@pytest.mark.parametrize(
    ("program", "label", "finding"),
    [
        (_window_slid_past_program, UNSTORED_SLOT, "reachable-null-block-chunk-stored"),
        (_unaligned_hit_program, UNALIGNED_HIT, "unaligned-hybrid-hit-reads-unstored-block"),
    ],
    ids=["unstored-slot", "unaligned-hit"],
)
def test_a_tolerance_covers_only_its_bug_s_loads(
    program: Callable[..., FenceMachine], label: str, finding: str
) -> None:
    """The random workloads tolerate a known bug where the registry lists it: its
    hunt's program, run with the tolerance, records each load of the slot the store
    left out under the bug's label, and ends with every fence check passed. Elsewhere
    nothing is tolerated, and the program passes."""
    state = program(strict=False)
    engine = state.engine
    assert engine is not None
    state.teardown()
    hits = [job for hit_label, job in engine.known_bug_hits if hit_label == label]
    assert engine.contents.violations == []
    if not has_bug(finding):
        assert label not in engine.tolerate
        assert hits == []
        return
    assert hits  # each a load job that brought in a slot its store left out
    assert all(job in engine.ledger.load_jobs for job in hits)
    assert engine.fence == {}


def test_a_hunt_s_eagle_program_under_default_retention_keeps_every_check() -> None:
    """A hunt's program on 0.34.0 (2026-12-06, seed 1233607946), the first hunt to
    draw the default retention on sliding-window layouts there: a mixed layout of
    4-token full-attention blocks and 2-token blocks of the drafter's sliding window,
    a request preempted and readmitted with a CPU-tier hit. Its load brings a window
    slot the store left out (0.33.0: never written; 0.34.0: a null placeholder's
    zeros), the shape of eagle-popped-chunk-reads-unstored-block, and passes with the
    same program without EAGLE, or with dense retention. On 0.28.0, 0.29.0, 0.33.0
    and 0.34.0 it meets that shape and the machine tolerates it (EAGLE_TOLERANCE); on
    0.30.0-0.32.0 the load is clean: r1's first store copies the window block the
    popped hit reads there (six blocks; five on 0.29.0 and 0.33.0). That block is in
    the GPU prefix cache there, so when r1's window frees it vLLM's pool hands r2
    other blocks first; elsewhere it is not cached, r2 takes it in the same step,
    and the connector zeroes it in r1's pending chunk (the doc's last section)."""
    state = replay(
        FenceMachine,
        block_sizes=(4, 2),
        blocks_per_chunk=2,
        cpu_chunks=3,
        delays=[None, None, None, None, None, None, 0],
        eagle=True,
        enabled=[False, False, True, False],
        window_blocks=3,
    )
    engine = state.engine
    assert engine is not None
    state.add_request(max_tokens=1, prefix=(), remote_blocks=0, tail=0)
    state.add_request(max_tokens=4, prefix=PREFIXES[3], remote_blocks=0, tail=0)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=1, wait=2)
    state.preempt_all()
    state.step(steps=1)
    state.teardown()
    assert engine.contents.violations == []


# The two programs that cycled start alike but for their actions: async scheduling, the
# second connector, full attention, vLLM's default retention, one worker, a pool with no
# spare block, a tier of eight chunks.
def _cycling_program() -> FenceMachine:
    """A hunt's program (2026-12-05, seed 1421017081), before its teardown. With the
    scheduler's async flag off (the harness's fault then), three requests preempted
    one another 515 times each in 3,086 steps and the drain never ended."""
    state = replay(
        FenceMachine,
        cpu_chunks=8,
        enabled=[False, True, False, True],
        layout="full",
        remote_source=True,
    )
    a, b = PREFIXES[1], PREFIXES[3]
    state.add_request(max_tokens=4, prefix=a, remote_blocks=0, tail=8)
    state.step(steps=1)
    state.follow_up(tail=0, wait=3)
    state.follow_up(tail=3, wait=1)
    state.step(steps=1)
    state.follow_up(tail=0, wait=4)
    state.add_request(max_tokens=8, prefix=b, remote_blocks=0, tail=2)
    state.step(steps=2)
    state.release_held()
    state.add_request(max_tokens=1, prefix=a, remote_blocks=0, tail=0)
    state.add_request(max_tokens=2, prefix=(), remote_blocks=0, tail=4)
    state.step(steps=4)
    state.release_held()
    state.step(steps=4)
    state.add_request(max_tokens=1, prefix=(), remote_blocks=0, tail=0)
    return state


def _cycle_with_a_waiter() -> FenceMachine:
    """Another hunt's program (2026-12-05, seed 1421017090), before its teardown. With
    the flag off, two requests preempted each other 633 times in 3,170 steps while a
    third waited behind them, never scheduled."""
    state = replay(
        FenceMachine,
        cpu_chunks=8,
        enabled=[True, False, False, True],
        layout="full",
        remote_source=True,
    )
    a, b = PREFIXES[1], PREFIXES[3]
    state.add_request(max_tokens=3, prefix=(), remote_blocks=0, tail=7)
    state.follow_up(tail=0, wait=1)
    state.add_request(max_tokens=6, prefix=a, remote_blocks=0, tail=1)
    state.follow_up(tail=0, wait=1)
    for max_tokens, prefix, tail in [(1, (), 0), (1, (), 5), (2, a, 8), (2, b, 4), (1, (), 5)]:
        state.add_request(max_tokens=max_tokens, prefix=prefix, remote_blocks=0, tail=tail)
    state.add_request(max_tokens=1, prefix=(), remote_blocks=0, tail=9)
    return state


@pytest.mark.parametrize("program", [_cycling_program, _cycle_with_a_waiter])
def test_programs_that_cycled_without_the_async_flag_drain(
    program: Callable[[], FenceMachine],
) -> None:
    """The scheduler defers freeing the blocks of the step in flight (it has the flag,
    and the connector is a consumer), so a request preempted with its token in
    flight keeps its blocks until that step is done: the programs drain."""
    state = program()
    assert state.engine is not None
    assert state.engine.scheduler.defer_block_free
    state.teardown()


def test_a_drain_out_of_steps_fails() -> None:
    """A drain given no budget beyond one step fails, naming its budget."""
    state = _cycling_program()
    assert state.engine is not None
    engine = state.engine
    engine.work = lambda: 0  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="did not drain within 1 steps"):
        engine.drain(max_steps=1)


def test_a_chunk_a_coarse_mask_skips_for_its_null_block_is_not_reported() -> None:
    """A hunt's program on 0.33.0 (2026-12-06, seed 1158054695), with dense retention
    as the hunt sets it: full-attention blocks of 4 tokens beside sliding-window blocks
    of 8, chunks of three blocks, so the hit alignment (12 tokens) is no multiple of
    the window's block and vLLM's mask calls every window block reachable. In the step
    r1 hits r0's first 8 tokens, r0's window has left its first window block: the
    position is null, and r0's final store skips its window chunk 0, as vLLM means it
    to. WindowLiveness (L2) must leave that chunk alone (``coarse``); before it did, it
    reported it (a hunt on 0.34.0 met the same with chunks of two blocks)."""
    state = replay(
        FenceMachine,
        async_scheduling=False,
        block_sizes=(4, 8),
        blocks_per_chunk=3,
        enabled=[False, False, False, True],
        retention=None,
        window_blocks=2,
    )
    assert isinstance(state.liveness, WindowLiveness)
    state.add_request(max_tokens=10, prefix=PREFIXES[3], remote_blocks=0, tail=3)
    state.step(steps=5)
    for _ in range(6):
        state.release_held()
    state.step(steps=4)
    state.add_request(max_tokens=1, prefix=PREFIXES[3], remote_blocks=0, tail=0)
    state.teardown()


def _tear_down_a_known_bug_s_program(
    state: FenceMachine, label: str, meets: Callable[[FenceEngine], bool], strict: bool, named: str
) -> None:
    """Tear down a known bug's kept program and check its liveness check's answer.
    Where the program ``meets`` the bug (asked of the drained engine), the check records
    it as met (``label``) or, ``strict`` (its tolerance emptied), names it: one
    violation matching ``named``. Elsewhere it finds and records nothing."""
    engine = state.engine
    assert engine is not None
    found = []
    try:
        state.teardown()
    except FenceViolation as error:
        found.append(str(error))
    met = [hit for hit, _ in engine.known_bug_hits if hit == label]
    if strict and meets(engine):
        assert (len(found), met) == (1, [])
        assert re.search(named, found[0])
    else:
        assert (found, met) == ([], [label] if meets(engine) else [])


@pytest.mark.parametrize("strict", [False, True], ids=["tolerant", "strict"])
def test_a_window_chunk_whose_hash_waits_for_a_draft_is_held_as_draft_completed(
    strict: bool,
) -> None:
    """A hunt's program on 0.34.0 (2026-12-07, seed 194225281, round 14): an EAGLE
    drafter under vLLM 0.34.0's lookahead block hashes (its seed is odd), two drafts a
    step, 4-token full-attention blocks beside 2-token window blocks (a window of one),
    chunks of one block, a tier of one chunk. r2's step 5 computes token 11, the last
    of window chunk 5, and accepts drafts 12 and 13. The chunk's hash covers token 12,
    a draft of that step, so its key comes a step later, when the window has moved past
    its block and zeroed it: the chunk is never offered. That is
    draft-completed-window-chunk-dropped with the token after the chunk as the draft;
    L2 records it as that bug where the release has it, and strict, names r2's chunk.
    Without the lookahead hashes (every other release) the group keeps a trailing chunk
    back and L2 is off."""
    state = replay(
        SpeculativeMachine,
        async_scheduling=False,
        block_sizes=(4, 2),
        eagle=True,
        enabled=[False, False, True, True],
        retention=None,
        seed=65535,
    )
    engine = state.engine
    assert engine is not None
    assert engine.lookahead_hashes == LOOKAHEAD_HASHES
    if not LOOKAHEAD_HASHES:
        assert state.liveness is None
    elif strict:
        assert isinstance(state.liveness, WindowLiveness)
        state.liveness.tolerate = frozenset()
    for max_tokens, prefix, tail in [
        (2, (), 0), (7, (), 0), (8, (), 7), (2, (), 0), (1, tuple(range(100, 112)), 9),
    ]:  # fmt: skip
        state.add_request(max_tokens=max_tokens, prefix=prefix, remote_blocks=0, tail=tail)
    _tear_down_a_known_bug_s_program(
        state,
        DRAFTED_CHUNK_ZEROED,
        lambda _: LOOKAHEAD_HASHES and has_bug("draft-completed-window-chunk-dropped"),
        strict,
        r"request r2 finished, .* chunks \[5\], each ending",
    )


@pytest.mark.parametrize("strict", [False, True], ids=["tolerant", "strict"])
def test_a_request_resumed_without_its_hit_is_held_to_its_replay_chunk(
    monkeypatch: pytest.MonkeyPatch, strict: bool
) -> None:
    """A hunt's program on 0.31.0 (2026-12-07, seed 2924330948, round 131): 4-token
    full-attention blocks beside 2-token window blocks (a window of two), chunks of one
    block, one spare block in the pool. r11 (tokens 100-111, replay boundary 8) hits
    12 tokens in the tier, runs one step and is preempted; it comes back to a tier that
    has let those chunks go and computes all of them again, but its store frontier
    stayed past them: its replay chunk (window chunk 3) is never offered, the known
    resumed-frontier-skips-recomputed-chunks. Where the program preempts r11 so on a
    release with that bug (0.31.0, 0.32.0; 0.30.0 schedules it otherwise), L3 records
    it as met, and strict, names it; elsewhere it finds nothing. Run under vLLM's
    default retention, the hunt's for seed 1."""
    monkeypatch.setattr(fence_machines, "WINDOW_RETENTION", [None, 0])
    state = replay(
        WindowMachine,
        async_scheduling=False,
        block_sizes=(4, 2),
        cpu_chunks=16,
        enabled=[False, False, False, True],
        seed=1,
        spare_blocks=1,
        window_blocks=2,
    )
    assert isinstance(state.liveness, ReplayLiveness)
    if strict:
        state.liveness.tolerate = frozenset()
    for _ in range(3):
        state.release_held()
    a, b, c = tuple(range(1, 9)), tuple(range(100, 112)), tuple(range(1, 5))
    for max_tokens, prefix, tail in [
        (3, a, 0), (4, a, 0), (1, b, 9), (9, c, 5), (1, a, 3), (6, (), 0),
        (6, a, 0), (5, (), 9), (6, a, 0), (5, (), 0), (4, b, 2), (2, b, 0),
    ]:  # fmt: skip
        state.add_request(max_tokens=max_tokens, prefix=prefix, remote_blocks=0, tail=tail)
    _tear_down_a_known_bug_s_program(
        state,
        RESUMED_FRONTIER,
        lambda engine: (
            has_bug("resumed-frontier-skips-recomputed-chunks")
            and engine.requests["r11"].num_preemptions > 0
        ),
        strict,
        r"request r11 finished, .* chunks \[3\], each ending",
    )


def test_a_resumed_request_s_final_store_skipping_a_reachable_null_block_is_not_reported() -> None:
    """A hunt's program on 0.34.0 (2026-12-06, seed 2127576981), under a retention of 16
    tokens: 4-token full-attention blocks beside 8-token window blocks (a window of
    one), chunks of two blocks, a pool with no spare block. r2 (13 prompt tokens, so a
    replay boundary of 8, inside window chunk 0) is preempted once its window has left
    block 0, comes back through the GPU prefix cache with block 0 null, and finishes;
    its final store passes over chunk 0, whose null block 0 the replay boundary reads,
    so vLLM 0.33.0 on skips it by design. L4 reported it: it took the null positions of
    a request no longer in the step's tables (the finished one's final store) as none,
    where it means the table the request last ran with."""
    state = replay(
        FenceMachine,
        block_sizes=(4, 8),
        blocks_per_chunk=2,
        cpu_chunks=2,
        delays=[0],
        retention=Segments(1),
        seed=2,
    )
    engine, liveness = state.engine, state.liveness
    assert engine is not None
    assert isinstance(liveness, SegmentLiveness)
    state.step(steps=2)
    state.add_request(max_tokens=4, prefix=(), remote_blocks=0, tail=0)
    state.step(steps=1)
    state.add_request(max_tokens=10, prefix=PREFIXES[1], remote_blocks=0, tail=0)
    state.step(steps=2)
    state.add_request(max_tokens=5, prefix=PREFIXES[1], remote_blocks=0, tail=5)
    for _ in range(7):
        state.step(steps=4)
    state.teardown()
    assert engine.requests["r2"].num_preemptions == 1
    offered = liveness.keys["r2"][0] in liveness.offered_by["r2"]
    assert offered is has_bug("reachable-null-block-chunk-stored")
    if not offered:  # skipped: block 0 was null when the final store passed chunk 0
        assert liveness.nulls_passed["r2"] == {0: {0}}
