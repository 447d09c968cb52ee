"""Real vLLM liveness bugs this suite found, kept as expected failures: a finished load
stranded behind a waiting head, so that the engine stops, and sliding-window chunks a
store never offers the CPU tier, which the liveness checks (``fence_oracle``: L2, L3)
name. ``test_vllm_bugs.py`` keeps the bugs that load or store the wrong data.

Each is written up for vLLM's maintainers in ``docs/`` and registered in
``docs/findings.toml`` with the releases that have it; ``known_bug`` makes its tests
strict expected failures on those releases only. When vLLM fixes one, its test
starts to pass there, ``xfail_strict`` turns that into a failure, and the registry
says which release fixed it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fence_config import LOOKAHEAD_HASHES
from fence_findings import VLLM_VERSION, at_least, has_bug, known_bug
from fence_harness import (
    STRANDED_FINISHED_LOAD,
    ContentViolation,
    FenceEngine,
    Speculation,
)
from fence_machines import FenceMachine, replay
from fence_oracle import (
    DRAFTED_CHUNK_ZEROED,
    FINISHED_CHUNK_ZEROED,
    HIT_TAKEN_FOR_REUSED,
    RESUMED_FRONTIER,
    FenceOracle,
    ReplayLiveness,
    WindowLiveness,
)
from fence_plant import plant
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)


def _stranded_program() -> FenceMachine:
    """A hunt's program on 0.30.0 (2026-12-05, seed 3344945474): one rank, full
    attention, chunks of one block, dense retention, async scheduling, every transfer
    held until released, a pool sized for the longest request alone; six requests at
    once, three of them sharing a prefix and two another. The hunt's tier held 8
    chunks; full, it evicted one of two chunks of one store, the one first in the set
    of keys the job keeps, so whether the program stranded a load depended on the process's
    string hash seed. This tier has room for every chunk: it strands one under every
    seed tried (0-5 on 0.28.0 to 0.30.0)."""
    state = replay(FenceMachine, cpu_chunks=16, layout="full", retention=None, seed=1)
    state.step(steps=10)
    a, d = tuple(range(1, 9)), tuple(range(100, 112))
    state.add_request(max_tokens=1, prefix=a, remote_blocks=0, tail=0)
    state.add_request(max_tokens=8, prefix=d, remote_blocks=0, tail=9)
    state.add_request(max_tokens=2, prefix=d, remote_blocks=0, tail=4)
    state.add_request(max_tokens=1, prefix=a, remote_blocks=0, tail=0)
    state.add_request(max_tokens=1, prefix=a, remote_blocks=0, tail=9)
    state.add_request(max_tokens=1, prefix=(), remote_blocks=0, tail=0)
    return state


@known_bug(
    "stranded-finished-load",
    raises=AssertionError,
    reason="the waiting loop ends at a head that gets no blocks, and never reaches the "
    "request behind it whose load has finished",
)
def test_a_finished_load_is_not_stranded_behind_a_waiting_head() -> None:
    state = _stranded_program()
    engine = state.engine
    assert engine is not None
    engine.tolerate = frozenset()  # the machine tolerates it where the registry lists it
    engine.drain()
    assert engine.fence == {}


def test_tolerating_the_stranded_load_ends_only_its_drain() -> None:
    """The random workloads tolerate this bug where the registry lists it: the drain
    ends in its shape and records it. Where it is fixed the program drains."""
    state = _stranded_program()
    engine = state.engine
    assert engine is not None
    state.teardown()
    if not has_bug("stranded-finished-load"):
        assert engine.stranded is None
        assert engine.known_bug_hits == []
        assert engine.fence == {}
        return
    assert engine.known_bug_hits == [(STRANDED_FINISHED_LOAD, -1)]
    assert engine.stranded is not None
    assert "no blocks) heads the waiting queues" in engine.stranded
    assert "finished loading" in engine.stranded
    assert engine.scheduler.has_unfinished_requests()  # stopped, not drained


def test_a_drain_stranded_without_tolerance_names_the_shape() -> None:
    """Untolerated, the same drain fails, and its message gives the shape."""
    state = _stranded_program()
    engine = state.engine
    assert engine is not None
    engine.tolerate = frozenset()
    if not has_bug("stranded-finished-load"):
        engine.drain()
        assert engine.stranded_load() is None
        return
    with pytest.raises(AssertionError, match=r"did not drain .*finished loading"):
        engine.drain()


def _promoted_program() -> FenceMachine:
    """A program of the random workloads on 0.30.0 (2026-12-07; a search for this shape
    with the EAGLE programs' core config, then shrunk by hand): one rank, full
    attention alone with an EAGLE drafter's config (the core scheduler reserves a
    lookahead slot and drops the last block of a hit), chunks of one block, sync
    scheduling, a pool sized for the longest request alone without the drafter's
    lookahead slot (as the machine sized it when it found this). r9 and r13 load CPU-tier
    hits, r13 (preempted before) is promoted to PREEMPTED in a pass whose allocation
    for it then fails, and r10, which holds nothing, heads the queue for good.
    Measured on 0.30.0 under string hash seeds 0, 1 and 2; 0.28.0, 0.29.0 and 0.31.0
    on drain it."""
    a, d = tuple(range(1, 9)), tuple(range(100, 112))
    state = replay(
        FenceMachine,
        async_scheduling=False,
        cpu_chunks=8,
        delays=[0, None, None, 0, None, None],
        eagle=True,
        enabled=[False, False, True, True],
        layout="full",
        seed=7456,
        spare_blocks=-1,  # the pool as found: sized without the lookahead slot
        window_blocks=2,
    )

    def add(**drawn: Any) -> None:
        state.add_request(remote_blocks=0, **drawn)

    add(max_tokens=2, prefix=(), tail=3)
    add(max_tokens=5, prefix=a[:4], tail=0)
    add(max_tokens=3, prefix=(), tail=2)
    add(max_tokens=2, prefix=(), tail=3)
    state.step(steps=3)
    add(max_tokens=1, prefix=a[:4], tail=0)
    add(max_tokens=7, prefix=d, tail=2)
    add(max_tokens=4, prefix=d, tail=0)
    add(max_tokens=9, prefix=(), tail=8)
    add(max_tokens=8, prefix=(), tail=0)
    add(max_tokens=4, prefix=d, tail=5)
    state.step(steps=7)
    add(max_tokens=1, prefix=a[:4], tail=0)
    state.step(steps=10)
    add(max_tokens=2, prefix=(), tail=3)
    state.step(steps=5)
    add(max_tokens=1, prefix=d, tail=0)
    add(max_tokens=4, prefix=(), tail=9)
    state.step(steps=8)
    return state


def _strands_on_0_30_only(state: FenceMachine, shape: str) -> None:
    """Where ``state``'s program strands (0.30.0): untolerated, the drain fails and
    names ``shape``'s head; the engine is in ``shape``; tolerated, the drain ends
    there and records the hit. Elsewhere the program drains."""
    engine = state.engine
    assert engine is not None
    if VLLM_VERSION.split("+", 1)[0] != "0.30.0":
        state.teardown()
        assert engine.stranded is None
        assert engine.fence == {}
        return
    assert has_bug("stranded-finished-load")
    engine.tolerate = frozenset()
    with pytest.raises(AssertionError, match=re.escape(shape.split(" heads", 1)[0])):
        engine.drain()
    assert engine.stranded_load() == shape
    engine.tolerate = frozenset({STRANDED_FINISHED_LOAD})
    engine.drain()
    assert (engine.stranded, engine.known_bug_hits) == (shape, [(STRANDED_FINISHED_LOAD, -1)])


def test_a_load_promoted_then_stranded_is_the_same_bug() -> None:
    """The registered shape covers a loaded request already promoted: where this
    program strands (0.30.0) the tolerance ends its drain and names r13 as promoted;
    untolerated, the drain fails and says so. Elsewhere it drains."""
    _strands_on_0_30_only(
        _promoted_program(),
        "r10 (WAITING, no blocks) heads the waiting queues, and r9, r13 (promoted to "
        "PREEMPTED) behind it, holding blocks, finished loading",
    )


def _promoted_head_program() -> FenceMachine:
    """A program of the random workloads on 0.30.0 (2026-12-07, the same search as
    :func:`_promoted_program`, shrunk by hand): one replicated layout of two ranks,
    full attention alone with an EAGLE drafter's config, chunks of two blocks, async
    scheduling, a producer-only connector, a pool sized for the longest request alone
    without the drafter's lookahead slot (as the machine sized it when it found this).
    r10 (preempted before) loads a CPU-tier hit and is promoted to PREEMPTED, holding
    its blocks, in a pass whose allocation for it fails: the lookahead slot takes one
    block more than the 2 left free. r2, behind it, has finished its own load and holds
    the blocks r10 needs. Measured on 0.30.0 under string hash seeds 0, 1 and 2;
    0.28.0, 0.29.0 and 0.31.0 on drain it."""
    a, d = tuple(range(1, 9)), tuple(range(100, 112))
    state = replay(
        FenceMachine,
        blocks_per_chunk=2,
        cpu_chunks=24,
        delays=[None, None, 4, None],
        eagle=True,
        enabled=[False, False, True, False],
        kv_role="kv_producer",
        layout="full",
        ranks="replicated",
        remote_source=True,
        second_worker_lag=1,
        seed=2368,
        spare_blocks=-1,  # the pool as found: sized without the lookahead slot
    )

    def add(**drawn: Any) -> None:
        state.add_request(remote_blocks=0, **drawn)

    add(max_tokens=9, prefix=a[:4], tail=3)
    state.step(steps=1)
    state.step(steps=1)
    state.step(steps=2)
    add(max_tokens=2, prefix=a, tail=8)
    state.follow_up(tail=0, wait=2)
    add(max_tokens=10, prefix=a, tail=6)
    state.step(steps=1)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=0, wait=2)
    add(max_tokens=1, prefix=(), tail=8)
    state.follow_up(tail=0, wait=1)
    add(max_tokens=1, prefix=(), tail=9)
    state.follow_up(tail=0, wait=2)
    state.follow_up(tail=0, wait=4)
    state.step(steps=4)
    state.follow_up(tail=0, wait=3)
    state.step(steps=1)
    add(max_tokens=1, prefix=d, tail=0)
    state.step(steps=4)
    state.step(steps=3)
    state.follow_up(tail=3, wait=2)
    add(max_tokens=3, prefix=d, tail=2)
    add(max_tokens=6, prefix=d, tail=5)
    add(max_tokens=1, prefix=a, tail=4)
    state.follow_up(tail=0, wait=2)
    state.step(steps=3)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=0, wait=1)
    state.follow_up(tail=0, wait=1)
    state.step(steps=2)
    state.follow_up(tail=0, wait=4)
    return state


def test_a_promoted_load_heading_the_queue_is_the_same_bug() -> None:
    """The registered shape covers a head that is itself a promoted load, holding the
    blocks its load gave it: where this program strands (0.30.0) the tolerance ends
    its drain and names both loads; untolerated, the drain fails and says so.
    Elsewhere it drains."""
    _strands_on_0_30_only(
        _promoted_head_program(),
        "r10 (promoted to PREEMPTED, holding blocks) heads the waiting queues, and r2 "
        "behind it, holding blocks, finished loading",
    )


WINDOW_ZEROING_REPORT = "docs/vllm-bug-window-zeroing-drops-live-chunks.md"
NULL_CHUNK_REPORT = "docs/vllm-bug-reachable-null-block-chunk-stored.md"


def _window_engine(
    liveness: WindowLiveness | None = None, retention: int | None = None, **kwargs: Any
) -> FenceEngine:
    """One sliding-window group of 4-token blocks under ``retention`` (by default
    dense: a CPU-tier hit may end on any chunk boundary), a tier with room for every
    chunk; with ``liveness`` attached before the first step."""
    checks = [FenceOracle(), *([liveness] if liveness else [])]
    e = FenceEngine(layout="sliding", retention_interval=retention, post_step_fns=checks, **kwargs)
    if liveness is not None:
        liveness.attach(e)
    return e


def _c_after_a_reset(e: FenceEngine, tokens: int) -> None:
    """Once every transfer is done, the GPU prefix cache alone is reset and c sends
    a's first ``tokens`` tokens and one new token: c's hit can come only from the CPU
    tier. Runs c to its end."""
    e.drain()
    assert e.reset_gpu_cache()
    e.add_request([*e.requests["a"].all_token_ids[:tokens], 3000], 1, req_id="c")
    e.drain()


def _c_loads_a_s_first_chunk(e: FenceEngine, chunk_tokens: int) -> None:
    """c sends a's first chunk (:func:`_c_after_a_reset`): it loads only if a's chunk
    is in the tier."""
    _c_after_a_reset(e, chunk_tokens)
    assert any(job.req_id == "c" for job in e.ledger.load_jobs.values()), (
        "c loaded nothing: a's first chunk never reached the CPU tier"
    )


def _a_then_b(b_prefix: range, liveness: WindowLiveness | None = None) -> FenceEngine:
    """Chunks of three blocks (12 tokens), a window of two blocks. a's prompt is 11
    tokens, so its first chunk's key waits for its first output token; b arrives
    one step later, opening with ``b_prefix``: a's first 8 tokens, or others."""
    e = _window_engine(liveness, window_blocks=2, blocks_per_chunk=3, num_gpu_blocks=40)
    e.add_request([*range(1, 9), 1000, 1001, 1002], 3, req_id="a")
    e.step()
    e.add_request([*b_prefix, 2000], 1, req_id="b")
    return e


@known_bug(
    "prefix-hit-taken-for-reused-window-block",
    raises=AssertionError,
    reason=(
        "b's GPU prefix-cache hit on a's blocks 1 and 2 puts them among the step's new "
        "blocks, the connector zeroes them in a's pending chunk as if reused, and the "
        f"chunk, holding a reachable null block, is never stored (see {WINDOW_ZEROING_REPORT})"
    ),
)
@known_bug(
    "reachable-null-block-chunk-stored",
    raises=ContentViolation,
    reason=(
        "a's chunk 0 is stored with the zeroed block 2 left unwritten, and c's hit "
        f"loads that slot (see {NULL_CHUNK_REPORT})"
    ),
)
def test_a_window_chunk_whose_blocks_another_request_hits_is_still_offloaded() -> None:
    """b shares a's first 8 tokens, so the GPU prefix cache hands b a's blocks 1 and 2
    while a still holds block 2 in its window. Sharing changes nothing a's chunk 0
    holds: the tier should still get it, and c's hit load it."""
    _c_loads_a_s_first_chunk(_a_then_b(range(1, 9)), 12)


def test_a_window_chunk_no_other_request_hits_is_offloaded() -> None:
    """The case next to the bug, clean on every release: b shares nothing with a."""
    _c_loads_a_s_first_chunk(_a_then_b(range(50, 58)), 12)


def _a_filled_as_b_hits(b_prefix: range, liveness: WindowLiveness | None = None) -> FenceEngine:
    """vLLM's default retention (0), chunks of one block, a window of one, 7 tokens a
    step. a's 9-token prompt: its first step computes 7 tokens, its second the last
    two, which fill block 1 and so a's replay chunk (tokens 4-7, ending at the replay
    boundary 8). b, 13 tokens opening with ``b_prefix``, arrives for a's second step
    and is scheduled after a in it; its own replay chunk is its third (tokens 8-11)."""
    e = _window_engine(
        liveness, retention=0, window_blocks=1, blocks_per_chunk=1, max_num_batched_tokens=7
    )
    e.add_request([*range(1, 9), 1000], 2, req_id="a")
    e.step()
    e.add_request([*b_prefix, *range(2000, 2005)], 1, req_id="b")
    return e


def _c_hits_a_s_replay_chunk(e: FenceEngine) -> None:
    """c sends a's first 8 tokens (:func:`_c_after_a_reset`), so its replay boundary
    is a's: its hit reaches 8 tokens only if a's replay chunk is in the tier (the chunk
    before it is not, by vLLM's design: no boundary of a ends it)."""
    _c_after_a_reset(e, 8)
    assert e.ledger.hits("c") == [8], "c did not hit a's replay chunk in the CPU tier"


@known_bug(
    "prefix-hit-taken-for-reused-window-block",
    raises=AssertionError,
    reason=(
        "b's GPU prefix-cache hit on a's block 1, filled in the same step, puts it among "
        "the step's new blocks; the connector zeroes it in a's pending chunk as if "
        "reused, and the chunk, its last block zero, is never stored; b's replay chunk "
        f"is a later one (see {WINDOW_ZEROING_REPORT})"
    ),
)
def test_a_replay_chunk_another_request_hits_as_it_fills_is_still_offloaded() -> None:
    """b shares a's first 8 tokens and is scheduled right after a's step that fills
    block 1, so the GPU prefix cache hands b that block at once. Sharing changes
    nothing a's replay chunk holds: the tier should still get it, and c hit it
    (vLLM's default retention, where no other request's store offers it)."""
    _c_hits_a_s_replay_chunk(_a_filled_as_b_hits(range(1, 9)))


def test_a_replay_chunk_no_other_request_hits_is_offloaded() -> None:
    """The case next to the bug, clean on every release: b shares nothing with a."""
    _c_hits_a_s_replay_chunk(_a_filled_as_b_hits(range(50, 58)))


@pytest.mark.parametrize("b_prefix", ["a-s-first-8", "its-own"])
@pytest.mark.parametrize("tolerated", ["nothing", "its-bug"])
def test_the_replay_check_names_a_replay_chunk_taken_for_reused(
    b_prefix: str, tolerated: str
) -> None:
    """L3 on that program: where the release drops a's replay chunk, the check names
    it, unless the engine tolerates the bug, which is then recorded as met. With b on
    tokens of its own, and where the release stores the chunk, it finds nothing."""
    tolerate = [HIT_TAKEN_FOR_REUSED] if tolerated == "its-bug" else []
    liveness = ReplayLiveness(0, 4, 4, 1, coarse=False, tolerate=tolerate)
    shares = b_prefix == "a-s-first-8"
    e = _a_filled_as_b_hits(range(1, 9) if shares else range(50, 58), liveness)
    e.drain()
    found = liveness.check(e)
    met = [hit for hit, _ in e.known_bug_hits if hit == HIT_TAKEN_FOR_REUSED]
    if not (shares and has_bug("prefix-hit-taken-for-reused-window-block")):
        assert (found, met) == ([], [])
    elif tolerate:
        assert (found, met) == ([], [HIT_TAKEN_FOR_REUSED])
    else:
        assert met == []
        assert [v.invariant for v in found] == [ReplayLiveness.INVARIANT]
        assert "request a finished" in found[0].message
        assert "chunks [1]" in found[0].message


def _a_finishes_beside_b(pool: int, liveness: WindowLiveness | None = None) -> FenceEngine:
    """Chunks of one block, a window of one, async scheduling. a's one-token prompt
    and 4 tokens out: its computed tokens fill block 0, whose key comes with the
    token after it, so the chunk is left to a's final store, built the step after a
    finishes. b's 12-token prompt waits for blocks meanwhile; in a pool of ``pool``
    blocks (the null one among them)."""
    e = _window_engine(
        liveness, window_blocks=1, blocks_per_chunk=1, async_scheduling=True, num_gpu_blocks=pool
    )
    e.add_request([1000], 4, req_id="a")
    e.add_request(list(range(2000, 2012)), 3, req_id="b")
    return e


@known_bug(
    "finished-window-chunk-dropped",
    raises=AssertionError,
    reason=(
        "the step that builds a's final store hands a's freed block 1 to b, the "
        "connector zeroes it in a's pending chunk as if reused, and the chunk is never "
        f"stored; full attention stores it with a same-step flush (see {WINDOW_ZEROING_REPORT})"
    ),
)
def test_a_finished_request_s_last_window_chunk_is_offloaded_though_its_block_moves_on() -> None:
    """A pool of 3 usable blocks: b can run only once a has finished, and takes a's
    block for its third. The block still holds a's chunk in the step b gets it."""
    _c_loads_a_s_first_chunk(_a_finishes_beside_b(4), 4)


def test_a_finished_request_s_last_window_chunk_is_offloaded_from_a_roomy_pool() -> None:
    """The case next to the bug, clean on every release: b gets fresh blocks."""
    _c_loads_a_s_first_chunk(_a_finishes_beside_b(40), 4)


# The two findings' programs and their neighbours, as WindowLiveness (L2) meets them:
# (build, chunk blocks, the bug's tolerance label, whether this release drops a's chunk
# 0); a neighbour has no label and drops nothing.
WINDOW_PROGRAMS = {
    "b-hits-a": (
        lambda live: _a_then_b(range(1, 9), live),
        3,
        HIT_TAKEN_FOR_REUSED,
        # the zeroed blocks come before the chunk's last: a release that stores a chunk
        # with a reachable null block stores it so (the slot unwritten), not drops it
        has_bug("prefix-hit-taken-for-reused-window-block")
        and not has_bug("reachable-null-block-chunk-stored"),
    ),
    "b-apart": (lambda live: _a_then_b(range(50, 58), live), 3, None, False),
    "block-moves-on": (
        lambda live: _a_finishes_beside_b(4, live),
        1,
        FINISHED_CHUNK_ZEROED,
        has_bug("finished-window-chunk-dropped"),
    ),
    "roomy-pool": (lambda live: _a_finishes_beside_b(40, live), 1, None, False),
}


@pytest.mark.parametrize("program", list(WINDOW_PROGRAMS))
@pytest.mark.parametrize("tolerated", ["nothing", "its-bug", "the-other-bug"])
def test_the_window_liveness_check_names_each_dropped_chunk(program: str, tolerated: str) -> None:
    """L2 on the findings' programs: where the release drops a's chunk 0, the check
    names it, unless the engine tolerates that very bug, which is then recorded as
    met; tolerating the other one hides nothing. On the neighbouring programs, and
    where the release stores the chunk, it finds nothing."""
    build, blocks, label, drops = WINDOW_PROGRAMS[program]
    other = {HIT_TAKEN_FOR_REUSED: FINISHED_CHUNK_ZEROED}.get(label, HIT_TAKEN_FOR_REUSED)
    tolerate = {"nothing": (), "its-bug": (label,), "the-other-bug": (other,)}[tolerated]
    chunk = 4 * blocks
    # a window of two blocks in chunks of three, or of one in chunks of one (coarse)
    coarse = blocks == 1
    liveness = WindowLiveness(
        0, chunk, chunk, blocks, coarse=coarse, tolerate=[t for t in tolerate if t]
    )
    e = build(liveness)
    e.drain()
    found = liveness.check(e)
    labels = (HIT_TAKEN_FOR_REUSED, FINISHED_CHUNK_ZEROED)
    met = [hit for hit, _ in e.known_bug_hits if hit in labels]
    if not drops:
        assert (found, met) == ([], [])
    elif tolerated == "its-bug":
        assert (found, met) == ([], [label])
    else:
        assert met == []
        assert [v.invariant for v in found] == [WindowLiveness.INVARIANT]
        assert "request a finished" in found[0].message
        assert "[0]" in found[0].message


def _drafts_complete_a_window_chunk(
    liveness: WindowLiveness, drafts: int = 2, lookahead: bool = False
) -> FenceEngine:
    """The mixed layout, full attention in 4-token blocks and a one-block window of
    2-token blocks, chunks of one block, dense retention, a pool of 8 blocks;
    ``drafts`` drafts a step, all accepted. r0, a 2-token prompt answered with 6
    tokens: step 2 computes position 2 and the drafts at 3 and 4, so window chunk 1
    (positions 2-3), which a hit ending at token 4 reads, is complete once step 2 has
    run. Step 3 computes from position 5, whose window starts at 4: the window frees
    chunk 1's block in that step's allocation, before the connector builds the step's
    store, and r1 (a 4-token prompt arriving then) is allocated it in the same step.

    ``lookahead``: an EAGLE drafter under vLLM 0.34.0's lookahead block hashes, and a
    3-token prompt: step 2 computes position 3, chunk 1's last, itself, with the drafts
    at 4 and 5; chunk 1's hash covers position 4, so its key waits for that draft."""
    accept_all = Speculation(2, lambda req_id, step: drafts, lambda req_id, step, n: n)
    e = FenceEngine(
        layout="mixed",
        block_size=4,
        sliding_block_size=2,
        window_blocks=1,
        num_gpu_blocks=8,
        retention_interval=None,
        eagle=lookahead,
        lookahead_hashes=lookahead,
        speculation=accept_all,
        post_step_fns=[liveness],
    )
    liveness.attach(e)
    e.add_request([0, 1, 2] if lookahead else [0, 1], max_tokens=6)
    e.step()
    e.step()
    e.add_request([100, 101, 102, 103], max_tokens=1)
    e.run()
    e.drain()
    return e


# the draft a window chunk's key waits for: its last token, or under vLLM 0.34.0's
# lookahead block hashes the token after it
DRAFTED_KEYS = [
    False,
    pytest.param(
        True,
        marks=pytest.mark.skipif(not LOOKAHEAD_HASHES, reason="lookahead hashes: 0.34.0 on"),
    ),
]


@known_bug(
    "draft-completed-window-chunk-dropped",
    raises=AssertionError,
    reason="the store caps a running request at its tokens, which the step's drafts "
    "are not yet, and the next step's window frees the chunk's block, handed on at once",
)
@pytest.mark.parametrize("lookahead", DRAFTED_KEYS, ids=["last-token", "lookahead"])
def test_a_window_chunk_completed_by_accepted_drafts_is_offered(lookahead: bool) -> None:
    liveness = WindowLiveness(1, 2, 4, 1, coarse=False)
    e = _drafts_complete_a_window_chunk(liveness, lookahead=lookahead)
    assert liveness.check(e) == []


@pytest.mark.parametrize("lookahead", DRAFTED_KEYS, ids=["last-token", "lookahead"])
def test_tolerating_a_dropped_drafted_chunk_hides_only_that_chunk(lookahead: bool) -> None:
    """Where the release drops it, tolerating the bug records chunk 1 as met and
    reports nothing; without drafts the same answer keeps every chunk, tolerated or
    not, so the tolerance holds only for a chunk a draft completed (under the lookahead
    hashes chunk 3 too: its key waits for step 3's drafts, and its block stays)."""
    tolerated = WindowLiveness(1, 2, 4, 1, coarse=False, tolerate=[DRAFTED_CHUNK_ZEROED])
    e = _drafts_complete_a_window_chunk(tolerated, lookahead=lookahead)
    assert tolerated.check(e) == []
    met = [label for label, _ in e.known_bug_hits if label == DRAFTED_CHUNK_ZEROED]
    assert met == (
        [DRAFTED_CHUNK_ZEROED] if has_bug("draft-completed-window-chunk-dropped") else []
    )
    assert tolerated.drafted == {"r0": {1, 3} if lookahead else {1}}
    plain = WindowLiveness(1, 2, 4, 1, coarse=False, tolerate=[DRAFTED_CHUNK_ZEROED])
    e = _drafts_complete_a_window_chunk(plain, drafts=0, lookahead=lookahead)
    met = [label for label, _ in e.known_bug_hits if label == DRAFTED_CHUNK_ZEROED]
    assert (plain.check(e), met, plain.drafted) == ([], [], {})


RESUMED_JUNCTION_REPORT = "docs/vllm-bug-resumed-junction-chunk-never-offered.md"


def _r_resumed_at_a_new_junction(liveness: ReplayLiveness | None = None) -> FenceEngine:
    """The mixed layout, both groups' blocks of 4 tokens, chunks of one block, a window
    of one, async scheduling, vLLM's default retention, a pool of 17 blocks (the null
    one among them: the longest request fits alone). a (tokens 1-8 and one more), b (12
    others) and r (tokens 1-4) arrive together, and all run to their end. r finds
    nothing cached and computes its window chunk 0, which its replay boundary (token 3)
    does not reach; the pool runs out and r is preempted. Looked up again, its full
    attention hits a's first block and its window group does not: r's junction is
    token 4, where that chunk ends."""
    checks = [FenceOracle(), *([liveness] if liveness else [])]
    e = FenceEngine(
        layout="mixed",
        block_size=4,
        sliding_block_size=4,
        window_blocks=1,
        blocks_per_chunk=1,
        async_scheduling=True,
        num_gpu_blocks=17,
        post_step_fns=checks,
    )
    if liveness is not None:
        liveness.attach(e)
    e.add_request([*range(1, 9), 1000], 2, req_id="a")
    e.add_request(list(range(100, 112)), 2, req_id="b")
    e.add_request([1, 2, 3, 4], 2, req_id="r")
    e.drain()
    assert e.requests["r"].num_preemptions == 1
    assert e.requests["r"].shared_prefix_boundary == 4
    return e


@known_bug(
    "resumed-junction-chunk-never-offered",
    raises=AssertionError,
    reason=(
        "r's new junction ends its window chunk 0, below the store frontier r kept "
        f"through its preemption: the chunk is never offered (see {RESUMED_JUNCTION_REPORT})"
    ),
)
def test_a_resumed_request_s_new_junction_reaches_the_tier() -> None:
    """What the GPU prefix cache pins at r's junction reaches the tier too: c, sending
    tokens 1-4 and two more once the GPU prefix cache alone is emptied, loads all four
    from there (vLLM 0.28.0 and 0.29.0 store the chunk in r's first run, by an older
    rule)."""
    e = _r_resumed_at_a_new_junction()
    assert e.reset_gpu_cache()
    e.add_request([1, 2, 3, 4, 77, 78], 1, req_id="c")
    e.drain()
    assert e.ledger.hits("c") == [4]


@pytest.mark.parametrize("tolerated", [False, True], ids=["nothing", "its-bug"])
def test_the_replay_check_names_a_resumed_junction_left_behind(tolerated: bool) -> None:
    """L3 on the same program holds r's window chunk 0 for its junction alone. Where
    the release never offers it, L3 names it, unless it tolerates that very bug, which
    is then recorded as met; where the release offers it, L3 finds nothing."""
    liveness = ReplayLiveness(
        1, 4, 4, 1, coarse=False, tolerate=[RESUMED_FRONTIER] if tolerated else []
    )
    e = _r_resumed_at_a_new_junction(liveness)
    # before vLLM 0.30.0 r's first run stores the chunk by an older rule, and r's
    # second run loads it from the tier: there it holds nothing
    assert set(liveness.computed_at.get("r", {})) == ({0} if at_least("0.30.0") else set())
    assert [at for _, at in liveness.kept["r"]] == [1]
    found = liveness.check(e)
    met = [hit for hit, _ in e.known_bug_hits if hit == RESUMED_FRONTIER]
    if not has_bug("resumed-junction-chunk-never-offered"):
        assert (found, met) == ([], [])
    elif tolerated:
        assert (found, met) == ([], [RESUMED_FRONTIER])
    else:
        assert met == []
        assert [v.invariant for v in found] == [ReplayLiveness.INVARIANT]
        assert "request r finished" in found[0].message
        assert "chunks [0], each ending at" in found[0].message


def _r_resumed_below_its_first_hit(liveness: ReplayLiveness | None = None) -> FenceEngine:
    """The mixed layout, both groups' blocks of 4 tokens, chunks of one block, a window
    of one, vLLM's default retention, a CPU tier of 8 chunks. p (tokens 100-111 and two
    more) runs alone and stores its chunks up to its replay boundary, token 12. With the
    GPU prefix cache emptied, r (tokens 100-111, replay boundary 8) hits p's chunks in
    the tier, and its store frontier moves past them. q (16 other tokens) arrives as r
    decodes, and its store takes the tier's room from p's chunks. The engine preempts
    both (``reset_prefix_cache(reset_running_requests=True)``) and q is aborted: r is
    looked up anew, finds nothing, and computes every token from the first."""
    checks = [FenceOracle(), *([liveness] if liveness else [])]
    e = FenceEngine(
        layout="mixed",
        block_size=4,
        sliding_block_size=4,
        window_blocks=1,
        blocks_per_chunk=1,
        cpu_chunks=8,
        post_step_fns=checks,
    )
    if liveness is not None:
        liveness.attach(e)
    e.add_request([*range(100, 112), 1028, 1029], 1, req_id="p")
    e.drain()
    assert e.reset_gpu_cache()
    e.add_request(list(range(100, 112)), 8, req_id="r")
    while e.requests["r"].num_output_tokens == 0:
        e.step()
    e.add_request(list(range(500, 516)), 4, req_id="q")
    assert set(e.step().output.num_scheduled_tokens) == {"r", "q"}
    # q's store is built (before vLLM 0.30.0 a step after its prefill) and done
    e.step()
    e.step()
    sampled = e.requests["r"].num_tokens
    e.preempt_all()
    e.abort("q")
    e.drain()
    assert e.requests["r"].num_preemptions == 1
    # its second run computes its prompt and the tokens it had sampled at once
    assert max(record.output.num_scheduled_tokens.get("r", 0) for record in e.history) == sampled
    return e


RESUMED_FRONTIER_REPORT = "docs/vllm-bug-resumed-frontier-skips-recomputed-chunks.md"


@known_bug(
    "resumed-frontier-skips-recomputed-chunks",
    raises=AssertionError,
    reason=(
        "r's second run computes its chunks again below the store frontier its first "
        "run's hit left, and none is offered; the tier has lost them "
        f"(see {RESUMED_FRONTIER_REPORT})"
    ),
)
def test_a_request_resumed_without_its_hit_offers_its_replay_chunk() -> None:
    """What r's second run computes at its replay boundary reaches the tier: c,
    sending tokens 100-111 and two more once the GPU prefix cache alone is emptied,
    loads the first 8 from there."""
    e = _r_resumed_below_its_first_hit()
    assert e.reset_gpu_cache()
    e.add_request([*range(100, 112), 77, 78], 1, req_id="c")
    e.drain()
    assert e.ledger.hits("c") == [8]


@pytest.mark.parametrize("tolerated", [False, True], ids=["nothing", "its-bug"])
def test_the_replay_check_names_a_replay_chunk_left_below_a_first_hit(tolerated: bool) -> None:
    """L3 on the same program holds r's window chunk 1 (its replay boundary) to the
    tier, computed in r's second run alone. Where the release never offers it, L3
    names it, unless it tolerates that very bug, which is then recorded as met. Before
    vLLM 0.30.0 p offers every window chunk, r's replay chunk among them: L3, which asks
    only that some store offered it first, finds nothing there (the tier's loss shows in
    c's miss)."""
    liveness = ReplayLiveness(
        1, 4, 4, 1, coarse=False, tolerate=[RESUMED_FRONTIER] if tolerated else []
    )
    e = _r_resumed_below_its_first_hit(liveness)
    found = liveness.check(e)
    met = [hit for hit, _ in e.known_bug_hits if hit == RESUMED_FRONTIER]
    if not (has_bug("resumed-frontier-skips-recomputed-chunks") and at_least("0.30.0")):
        assert (found, met) == ([], [])
        return
    [(preempted, kept)] = liveness.kept["r"]
    assert kept == 4  # past the replay chunk: the first run's hit, then its decoding
    assert liveness.computed_at["r"][1] >= preempted
    if tolerated:
        assert (found, met) == ([], [RESUMED_FRONTIER])
    else:
        assert met == []
        assert [v.invariant for v in found] == [ReplayLiveness.INVARIANT]
        assert "chunks [1], each ending at" in found[0].message


@pytest.mark.skipif(at_least("0.33.0"), reason="vLLM 0.33.0 on has the reset this test puts in")
def test_with_the_restart_s_reset_a_request_resumed_without_its_hit_offers_its_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM 0.33.0's fix put into an older release (a lookup anew sends the store
    frontier back to chunk 0): c hits 8 tokens, as on 0.33.0. What makes c miss there
    is the kept frontier, nothing else of the program."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "get_num_new_matched_tokens",
        "group_state.block_ids.clear()",
        "group_state.block_ids.clear(); group_state.next_stored_chunk_idx = 0",
    )
    e = _r_resumed_below_its_first_hit()
    assert e.reset_gpu_cache()
    e.add_request([*range(100, 112), 77, 78], 1, req_id="c")
    e.drain()
    [hit] = e.ledger.hits("c")
    assert hit >= 8  # 8 tokens; 12 on vLLM 0.30.0


# The two resumed programs: each one's builder, what L3 names once 0.33.0's fix is
# taken out (on 0.34.0 the second also names chunk 0, at the junction r's second lookup
# finds there), and the prompt of c, which then hits nothing
RESUMED_PROGRAMS = {
    "new-junction": (_r_resumed_at_a_new_junction, r"\[0\]", [1, 2, 3, 4, 77, 78]),
    "below-first-hit": (_r_resumed_below_its_first_hit, r"\[(0, )?1\]", [*range(100, 112), 77, 78]),
}


@pytest.mark.skipif(
    not at_least("0.33.0"), reason="the fix this test takes out comes with vLLM 0.33.0"
)
@pytest.mark.parametrize("program", sorted(RESUMED_PROGRAMS))
def test_without_the_restart_s_reset_the_replay_check_names_what_r_left_out(
    monkeypatch: pytest.MonkeyPatch, program: str
) -> None:
    """vLLM 0.33.0's fix taken out (a lookup anew no longer sends the store frontier
    back to chunk 0): L3 names the chunk r's second run left out, and c hits nothing."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "get_num_new_matched_tokens",
        "group_state.next_stored_chunk_idx = 0",
        "pass",
    )
    build, chunks, prompt = RESUMED_PROGRAMS[program]
    liveness = ReplayLiveness(1, 4, 4, 1, coarse=False)
    e = build(liveness)
    found = liveness.check(e)
    assert [v.invariant for v in found] == [ReplayLiveness.INVARIANT]
    assert re.search(f"chunks {chunks}, each ending at", found[0].message)
    assert e.reset_gpu_cache()
    e.add_request(prompt, 1, req_id="c")
    e.drain()
    assert e.ledger.hits("c") == [0]
