"""Real vLLM fence bugs this suite found, kept as expected failures.

Each is written up for vLLM's maintainers in ``docs/`` and registered in
``docs/findings.toml`` with the releases that have it; ``known_bug`` makes its tests
strict expected failures on those releases only. When vLLM fixes one, its test
starts to pass there, ``xfail_strict`` turns that into a failure, and the registry
says which release fixed it.
"""

from __future__ import annotations

import inspect

import pytest
from fence_config import Role
from fence_findings import fixed, has_bug, known_bug
from fence_harness import (
    EAGLE_POPPED,
    FINAL_SLIDING_WINDOW_TAIL,
    PREEMPTED_THEN_FINISHED,
    RELEASE_TOLERANCE,
    SHORTER_HIT,
    UNALIGNED_HIT,
    ContentViolation,
    FenceEngine,
    Plan,
)
from fence_oracle import (
    FenceOracle,
    FenceViolation,
)
from fence_plant import plant
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)

REPORT = "docs/vllm-bug-reset-sliding-window.md"
# vLLM 0.30.0 on filters sliding-window stores by the checkpoint retention
RETENTION_AWARE_STORES = hasattr(OffloadingConnectorScheduler, "_reachable_store_block_mask")


RETENTION = pytest.mark.parametrize("retention", [0, None], ids=["retention-0", "retention-dense"])


def _sliding_window_request_past_its_window(
    async_scheduling: bool, layout: str, retention: int | None
) -> FenceEngine:
    """One request on a sliding-window group (window: 2 blocks of 4 tokens) in a
    pool of 3 usable blocks (9 beside a full-attention group), with vLLM's default
    checkpoint retention (0) or dense retention (None). Its prompt's first block
    (id 1) is stored; decoding moves the window on, vLLM frees block 1, and hands
    it back to the same request for a later position. The connector's copy of the
    request's block ids still holds 1 at position 0: harmless while position 0
    counts as stored."""
    e = FenceEngine(
        num_gpu_blocks=4 if layout == "sliding" else 10,
        layout=layout,  # type: ignore[arg-type]
        window_blocks=2,
        async_scheduling=async_scheduling,
        retention_interval=retention,
        post_step_fns=[FenceOracle()],
    )
    e.add_request(range(1, 9), 16, req_id="a")
    stored_first = e.connector._req_status["a"].group_states[-1].block_ids
    for _ in range(40):
        e.step()
        sliding = e.scheduler.kv_cache_manager.get_block_ids("a")[-1]
        if stored_first[0] in sliding[1:]:
            return e  # the block of position 0 now backs a later position
    raise AssertionError("the pool never handed position 0's block back")


@RETENTION
@pytest.mark.parametrize("layout", ["sliding", "mixed"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_sliding_window_request_runs_clean_without_reset(
    async_scheduling: bool, layout: str, retention: int | None
) -> None:
    """The control: the same workload, no reset, no violation."""
    e = _sliding_window_request_past_its_window(async_scheduling, layout, retention)
    e.drain()
    assert e.fence == {}


@known_bug(
    "reset-sliding-window",
    # vLLM 0.28.0-0.29.0, mixed layout, retention 0: the re-offload reads a stale
    # sliding-window id that now backs a full-attention position of the same job, so
    # the oracle's I6 (one block in both of the job's lists) fails first
    raises=(FenceViolation, ContentViolation),
    reason=(
        "the connector's cache reset (_reset_cache; reset_cache before 0.33) rewinds "
        "next_stored_chunk_idx to 0 for running requests, but sliding-window block "
        "ids below the old start were never zeroed when vLLM freed and re-allocated "
        "them; the re-offload stores another "
        f"position's KV under position 0's key (see {REPORT})"
    ),
)
@RETENTION
@pytest.mark.parametrize("layout", ["sliding", "mixed"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_reset_cache_does_not_store_a_reused_sliding_window_block(
    async_scheduling: bool, layout: str, retention: int | None
) -> None:
    e = _sliding_window_request_past_its_window(async_scheduling, layout, retention)
    e.reset_cache()  # the engine's reset_prefix_cache(reset_connector=True)
    e.drain()


@known_bug(
    "reset-sliding-window",
    raises=ContentViolation,
    reason=f"the same bug, with chunks of three blocks (see {REPORT})",
)
def test_reset_cache_with_three_block_chunks_does_not_store_a_reused_block() -> None:
    """The same bug where a chunk spans three blocks: four steps into a 16-token prompt
    with 24 tokens to generate, block index 1's block already backs a later position
    when the reset rewinds the store progress to chunk 0."""
    e = FenceEngine(
        num_gpu_blocks=5,
        layout="sliding",
        window_blocks=2,
        blocks_per_chunk=3,
        max_num_batched_tokens=16,
        post_step_fns=[FenceOracle()],
    )
    e.add_request(range(1, 17), 24, req_id="a")
    for _ in range(4):
        e.step()
    e.reset_cache()
    e.drain()


PREEMPTION_REPORT = "docs/vllm-bug-preempted-final-store.md"


@known_bug(
    "preempted-final-store",
    raises=ContentViolation,
    reason=(
        "with async scheduling and a producer-only connector, a request preempted "
        "while its last token is in flight finishes with that token; the connector "
        "then builds its final store from the blocks the preemption freed, which "
        f"another request has already overwritten (see {PREEMPTION_REPORT})"
    ),
)
def test_final_store_of_a_request_finished_after_its_preemption_reads_its_own_data() -> None:
    """Found by the stateful tests (long profile). Async scheduling, a producer-only
    connector, a pool of 8 usable blocks: r2 (3-token prompt, 2 new tokens) is
    preempted at step 3, before step 2's output (its last token) is applied; block 8,
    its block 0, goes to r1 and r1's forward pass writes it. The output then finishes
    r2, and at step 4 the connector stores r2's block 0, from block 8."""
    _preempted_then_finished().drain()


def test_with_a_consumer_connector_the_same_program_stores_its_own_data() -> None:
    """The same program with the connector a consumer too (``kv_both``, as vLLM
    configures the OffloadingConnector): the scheduler defers freeing the blocks of
    a step in flight, and every store reads its own request's data (on 0.33.0 r2 is
    not even preempted: it finishes with the blocks it had)."""
    e = _preempted_then_finished(kv_role="kv_both")
    assert e.scheduler.defer_block_free
    e.drain()
    assert e.contents.violations == []
    assert e.fence == {}


def _preempted_then_finished(
    tolerate: tuple[str, ...] | None = None, kv_role: Role = "kv_producer"
) -> FenceEngine:
    e = FenceEngine(
        num_gpu_blocks=9,
        async_scheduling=True,
        cpu_chunks=2,
        kv_role=kv_role,
        tolerate=tolerate,
        post_step_fns=[FenceOracle()],
    )
    e.add_request(range(1000, 1006), 4, req_id="r0")
    e.add_request([*range(100, 112), *range(1006, 1013)], 3, req_id="r1")
    e.add_request(range(1013, 1016), 2, req_id="r2")
    e.run()
    return e


def test_tolerating_the_preemption_bug_skips_only_that_store() -> None:
    """The random workloads tolerate this bug; the tolerance covers exactly the store
    built for the request that finished after its preemption, and nothing else."""
    e = _preempted_then_finished(tolerate=(*RELEASE_TOLERANCE, PREEMPTED_THEN_FINISHED))
    e.drain()
    hits = [h for h in e.known_bug_hits if h[0] == PREEMPTED_THEN_FINISHED]
    if not has_bug("preempted-final-store"):
        assert hits == []  # the store is built from the request's own computed tokens
        assert e.contents.violations == []
        return
    (hit,) = hits
    assert e.store_jobs[hit[1]].req_id == "r2"
    assert e.contents.violations == []
    assert e.fence == {}


TAIL_REPORT = "docs/vllm-bug-final-sliding-window-tail.md"


def _final_tail_workload(**options: object) -> FenceEngine:
    """Full-attention blocks of 8 tokens, sliding-window blocks of 4 with a one-block
    window, dense checkpoint retention, a pool of 7 usable blocks. r0 (11-token
    prompt, 5 new tokens) decodes past its prompt; its sliding-window block index 2
    is skipped as unreachable while it runs. r2 (r0's prompt and 2 more tokens)
    waits for room and is admitted in the step after r0 finishes."""
    config: dict[str, object] = {
        "layout": "mixed",
        "block_size": 8,
        "sliding_block_size": 4,
        "window_blocks": 1,
        "num_gpu_blocks": 8,
        "retention_interval": None,
        "post_step_fns": [FenceOracle()],
        **options,
    }
    e = FenceEngine(**config)  # type: ignore[arg-type]
    e.run([Plan(range(0, 11), 5, req_id="r0"), Plan(range(0, 13), 4, arrive_at=2, req_id="r2")])
    e.drain()
    return e


@known_bug(
    "final-sliding-window-tail",
    raises=(FenceViolation, ContentViolation),
    reason=(
        "a finished request's reconsidered final sliding-window tail "
        "re-reads block ids below next_stored_chunk_idx, which the zeroing never "
        "scans; a block the same step handed to another request is stored after that "
        f"request's forward pass wrote it (see {TAIL_REPORT})"
    ),
)
def test_reconsidered_final_sliding_window_tail_is_not_stored_from_a_reused_block() -> None:
    """Fence brief 8.1, hazard (a). In the step after r0 finishes, vLLM hands r0's
    sliding-window block index 2 (block 5) to r2's index 3. r0's final store
    reconsiders its final tail and stores index 2 from block 5: not zeroed (below
    the store progress), not flushed (the flush check ran before the job existed,
    and sliding-window blocks get no inline flush). The oracle's I3 fails at that
    step; the content model then sees the job read r2's data under r0's key."""
    _final_tail_workload()


@known_bug(
    "final-sliding-window-tail",
    raises=ContentViolation,
    reason=f"the same bug, with a block re-used in an earlier step (see {TAIL_REPORT})",
)
def test_reconsidered_final_tail_is_not_stored_from_a_block_reused_earlier() -> None:
    """Fence brief 8.1, hazard (b). Chunks of three sliding-window blocks, 8 usable
    blocks. While r0 decodes, the window frees its sliding-window block index 0
    (block 3) and vLLM hands it back to r0 for index 3; the connector's copy keeps 3
    at index 0, below the store progress, so it is never zeroed. r0's final store
    reconsiders chunk 0 and reads block 3, which now holds r0's index 3."""
    _final_tail_workload(blocks_per_chunk=3, num_gpu_blocks=9)


def test_tolerating_the_final_tail_bug_skips_only_the_stale_reads() -> None:
    """The random workloads tolerate this bug; the tolerance covers exactly the
    reconsidered tail's read of the block vLLM handed on (r0's sliding-window block
    index 2): every other read of every store is checked."""
    e = _final_tail_workload(tolerate=(*RELEASE_TOLERANCE, FINAL_SLIDING_WINDOW_TAIL))
    assert e.contents.violations == []
    assert e.fence == {}
    if not has_bug("final-sliding-window-tail"):
        if fixed("final-sliding-window-tail") and fixed("finished-window-chunk-dropped"):
            # With the finished-window fix on top (docs/upstream/), a finished request's
            # ids are not zeroed (the final-tail fix's scan skips it): its reconsidered
            # tail reads the block vLLM hands on in that very step, and the store is
            # flushed before the new owner writes it (the content model checked it)
            for job, places in e.ledger.stale_tail_reads.items():
                [record] = [r for r in e.history if job in r.store_jobs]
                assert job in record.jobs_to_flush
                blocks = {b for g, i, b in e.job_places[job] if (g, i) in places}
                assert blocks <= record.allocated.keys()
            return
        assert not e.ledger.stale_tail_reads  # no tail is reconsidered there
        return
    ((job, places),) = e.ledger.stale_tail_reads.items()
    assert e.store_jobs[job].req_id == "r0"
    assert places == {(1, 2)}
    assert [h for h in e.known_bug_hits if h[0] == FINAL_SLIDING_WINDOW_TAIL] == [
        (FINAL_SLIDING_WINDOW_TAIL, job)
    ]


@pytest.mark.parametrize(
    "options",
    [{"retention_interval": 0}, {"sliding_block_size": 8}],
    ids=["retention-0", "equal-block-sizes"],
)
def test_final_tail_workload_runs_clean_without_a_reconsidered_tail(
    options: dict[str, object],
) -> None:
    """The controls: with vLLM's default retention (0), or with both groups on
    8-token blocks, no final tail is reconsidered and the same workload is clean."""
    e = _final_tail_workload(**options)
    assert e.fence == {}
    if RETENTION_AWARE_STORES:
        # vLLM 0.30.0 on: the retention-aware store filter skips index 2 while r0
        # runs. vLLM 0.28.0-0.29.0 have no such filter (no _reachable_store_block_mask)
        # and store it in an ordinary store while r0 still holds it: correct data, as
        # the content model checks, and no final tail is reconsidered.
        assert ("r0", 1, 2) not in e.stored_positions()


@known_bug(
    "final-sliding-window-tail",
    raises=ContentViolation,
    reason=f"the same bug, with chunks of two blocks (see {TAIL_REPORT})",
)
def test_reconsidered_final_tail_with_two_block_chunks() -> None:
    """16-token full-attention blocks and chunks of two 4-token sliding-window
    blocks: r0's final store reconsiders its block index 4, whose block vLLM has
    handed to r2, and reads r2's data. This case also tells apart the catalogue
    entry sliding-window-start-in-chunks (zeroing from the chunk index, not the
    block index): that zeroing reaches down to index 4 and hides the bug."""
    e = FenceEngine(
        layout="mixed",
        block_size=16,
        sliding_block_size=4,
        window_blocks=2,
        blocks_per_chunk=2,
        num_gpu_blocks=15,
        delay=3,
        max_num_batched_tokens=8,
        retention_interval=None,
        post_step_fns=[FenceOracle()],
    )
    e.run(
        [
            Plan(range(100, 111), 10, req_id="r1"),
            Plan(range(100, 122), 10, arrive_at=5, req_id="r0"),
            Plan(range(0, 17), 9, arrive_at=5, req_id="r2"),
        ]
    )
    e.drain()


UNCOMPUTED_REPORT = "docs/vllm-bug-final-store-uncomputed-token.md"


@known_bug(
    "final-store-uncomputed-token",
    raises=ContentViolation,
    reason=(
        "a finished request's final store counts up to num_tokens, its last sampled "
        "token included, whose KV no forward pass wrote; the block that token ends is "
        f"stored under the hash of the whole block (see {UNCOMPUTED_REPORT})"
    ),
)
@pytest.mark.parametrize(
    ("prompt", "max_tokens"), [(3, 1), (8, 4)], ids=["prefill-only", "after-decode"]
)
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_final_store_reads_only_computed_tokens(
    async_scheduling: bool, prompt: int, max_tokens: int
) -> None:
    """A request whose prompt and output make whole blocks (4-token blocks: 3 + 1,
    or 8 + 4) finishes with its last sampled token never computed: the forward pass
    wrote the last block only up to the token before. The final store must leave that
    block for a request that computes it; here, with the engine strict (no
    RELEASE_TOLERANCE), the content model sees the store read a block one token
    short of its key."""
    e = FenceEngine(async_scheduling=async_scheduling, tolerate=(), post_step_fns=[FenceOracle()])
    e.run([Plan(range(1, 1 + prompt), max_tokens, req_id="a")])
    e.drain()
    last = (prompt + max_tokens) // 4 - 1
    assert ("a", 0, last) not in e.stored_positions()


EAGLE_REPORT = "docs/vllm-bug-eagle-popped-chunk-reads-unstored-block.md"


def _hybrid_engine(
    *, eagle: bool = False, retention: int | None = 0, tolerate: tuple[str, ...] | None = None
) -> FenceEngine:
    """4-token full-attention blocks beside a sliding-window group of 2-token blocks (a
    window of 3 blocks, the drafter's when ``eagle``), chunks of two blocks (8 tokens
    for full attention, 4 for the window), the second connector of a MultiConnector,
    ``retention`` (0: vLLM's default checkpoint retention; None: dense); ``tolerate``
    as FenceEngine's."""
    return FenceEngine(
        tolerate=tolerate,
        layout="mixed",
        block_size=4,
        sliding_block_size=2,
        window_blocks=3,
        blocks_per_chunk=2,
        eagle=eagle,
        remote_source=True,
        retention_interval=retention,
        num_gpu_blocks=40,
        post_step_fns=[FenceOracle()],
    )


def _eagle_hit_after_an_external_load(
    *, eagle: bool, tolerate: tuple[str, ...] | None = None
) -> FenceEngine:
    """The hybrid engine, default retention. Another connector loads request a's first
    8 tokens, so the sliding-window manager backs only the window before token 8 and
    leaves the group's first blocks null. a's stores then offload the sliding-window
    chunks from there on. Once the GPU prefix cache alone is reset, b shares a's
    first 8 tokens and loads what the CPU tier has of them."""
    e = _hybrid_engine(eagle=eagle, tolerate=tolerate)
    e.add_request([*range(1, 9), 1000, 1001, 1002], 2, req_id="a", remote_tokens=8)
    e.drain()
    assert e.reset_gpu_cache()
    e.add_request([*range(1, 9), *range(2000, 2004)], 1, req_id="b")
    e.drain()
    assert _loaded(e, "b") or _hit_kept_out_by_the_unaligned_fix(e, "a"), "b loaded nothing"
    return e


def _loaded(e: FenceEngine, req_id: str) -> bool:
    return any(job.req_id == req_id for job in e.ledger.load_jobs.values())


def _hit_kept_out_by_the_unaligned_fix(e: FenceEngine, owner: str) -> bool:
    """unaligned-hybrid-hit-reads-unstored-block, fixed: the hybrid engine's window
    chunks (4 tokens) are finer than full attention's (8), so the fixed store keeps
    every window chunk holding a null block out of the tier, by design (its trade-off,
    docs/upstream/unaligned-hybrid-hit-reads-unstored-block.md): ``owner``'s window
    chunk 0, whose block 0 is null, is not stored, and the hit built on it is gone."""
    return fixed("unaligned-hybrid-hit-reads-unstored-block") and not any(
        (owner, 1, index) in e.stored_positions() for index in (0, 1)
    )


@known_bug(
    "eagle-popped-chunk-reads-unstored-block",
    raises=ContentViolation,
    reason=(
        "an EAGLE group's CPU-tier hit gives back one whole chunk, but the store's "
        "reachability mask allows for one block: a chunk stored with a null block "
        "the shorter hit's window reads is loaded with that block never written "
        f"(see {EAGLE_REPORT})"
    ),
)
def test_an_eagle_hit_loads_no_block_its_store_left_out() -> None:
    """a's sliding-window block 0 (tokens 0-1) is null, and a stores chunk 0
    (blocks 0 and 1) without it. b's hit of 8 tokens
    gives back the drafter's volatile chunk (4 tokens), so b loads tokens 0-3, and
    its window before token 4 reads block 0 from a CPU slot no store wrote."""
    _eagle_hit_after_an_external_load(eagle=True)


def _assert_only_b_s_loads_tolerated(e: FenceEngine, label: str, *, met: bool) -> None:
    """The engine drained with every check passed; where the bug was ``met``, the
    tolerance recorded some of b's loads and nothing else, elsewhere nothing."""
    hits = [job for hit, job in e.known_bug_hits if hit == label]
    assert e.contents.violations == []
    assert e.fence == {}
    if not met:
        assert hits == []
        return
    loads = [job for job, load in e.ledger.load_jobs.items() if load.req_id == "b"]
    assert hits
    assert set(hits) <= set(loads)


@pytest.mark.parametrize("eagle", [True, False], ids=["eagle", "no-eagle"])
def test_the_eagle_hit_s_tolerance_lets_through_its_load_alone(eagle: bool) -> None:
    """The random workloads tolerate this bug where the registry lists it
    (EAGLE_POPPED, every release): b's load of the slot a's store left out is recorded,
    not reported, and the fence drains. Without EAGLE the same tolerance records
    nothing: the load is clean."""
    e = _eagle_hit_after_an_external_load(eagle=eagle, tolerate=(EAGLE_POPPED,))
    # with the fix applied (docs/upstream/), no load meets the bug: nothing is recorded
    met = eagle and has_bug("eagle-popped-chunk-reads-unstored-block")
    _assert_only_b_s_loads_tolerated(e, EAGLE_POPPED, met=met)


def test_the_same_hit_without_eagle_loads_only_stored_blocks() -> None:
    """The case next to the bug, clean on every release: without EAGLE, b's hit ends
    at token 8, and its window (tokens 2-7) needs sliding-window blocks 1-3, all of
    which a stored."""
    e = _eagle_hit_after_an_external_load(eagle=False)
    assert e.contents.violations == []


SHORTER_HIT_REPORT = "docs/vllm-bug-sparse-retention-shorter-hit-reads-unstored-block.md"
NULL_CHUNK_REPORT = "docs/vllm-bug-reachable-null-block-chunk-stored.md"
NULL_CHUNK_REASON = (
    "no check keeps a chunk holding a null block out of the tier: chunk 0 is stored "
    f"without block 0, and b's hit loads it (see {NULL_CHUNK_REPORT})"
)


def _shorter_hit_after_an_external_load(
    retention: int | None, tolerate: tuple[str, ...] | None = None
) -> FenceEngine:
    """A sliding-window group of 4-token blocks, a window of 3 blocks (12 tokens),
    chunks of two blocks (8 tokens), ``retention`` (0: vLLM's default; None: dense).
    Another connector of a MultiConnector loads request a's first 16 tokens, so the
    sliding-window manager backs only the window before token 16 (blocks 1-3) and
    leaves block 0 null. Request b shares only a's first 12 tokens: no GPU prefix hit
    (block 0 was never cached), a CPU-tier hit of one chunk, and b's window before
    token 8 reads blocks 0 and 1, if the tier serves chunk 0 (found by
    RemoteWindowMachine, reduced by hand)."""
    e = FenceEngine(
        layout="sliding",
        block_size=4,
        window_blocks=3,
        blocks_per_chunk=2,
        remote_source=True,
        retention_interval=retention,
        num_gpu_blocks=40,
        post_step_fns=[FenceOracle()],
        tolerate=tolerate,
    )
    e.add_request([*range(100, 112), *range(1000, 1005)], 1, req_id="a", remote_tokens=16)
    e.drain()
    e.add_request(list(range(100, 112)), 1, req_id="b")
    e.drain()  # raises ContentViolation if a load brings a block no store wrote
    return e


@known_bug(
    "sparse-retention-shorter-hit-reads-unstored-block",
    raises=ContentViolation,
    reason=(
        "under the default checkpoint retention the store's reachability keeps only the "
        "tail before a's replay boundary, so chunk 0 is stored without its null block 0; "
        "b's CPU-tier hit ends at an earlier chunk boundary, whose window reads it "
        f"(see {SHORTER_HIT_REPORT})"
    ),
)
@known_bug(
    "reachable-null-block-chunk-stored",
    raises=ContentViolation,
    reason=NULL_CHUNK_REASON,
)
def test_a_shorter_hit_under_default_retention_loads_only_stored_blocks() -> None:
    """b's hit ends at token 8 and its window reads a's sliding-window block 0, which
    the other connector's load left null: the tier must not serve chunk 0 unless its
    store wrote that block."""
    _shorter_hit_after_an_external_load(retention=0)


@known_bug(
    "sparse-retention-shorter-hit-reads-unstored-block",
    raises=ContentViolation,
    reason=(
        "under a periodic retention of 16 tokens the store's reachability keeps the tails "
        "before token 16 and a's replay boundary, so chunk 0 is stored without its null "
        "block 0; b's CPU-tier hit ends at token 8, whose window reads it "
        f"(see {SHORTER_HIT_REPORT})"
    ),
)
@known_bug(
    "reachable-null-block-chunk-stored",
    raises=ContentViolation,
    reason=NULL_CHUNK_REASON,
)
def test_a_shorter_hit_under_periodic_retention_loads_only_stored_blocks() -> None:
    """The same sequence under a periodic retention of 16 tokens (two chunks): b's
    hit at token 8 is short of the first segment's end, as of a's replay boundary."""
    _shorter_hit_after_an_external_load(retention=16)


@known_bug(
    "reachable-null-block-chunk-stored",
    raises=ContentViolation,
    reason=NULL_CHUNK_REASON,
)
def test_a_shorter_hit_under_dense_retention_loads_only_stored_blocks() -> None:
    """The same sequence with dense retention: every chunk boundary is a boundary a hit
    may end at, so block 0 is reachable and chunk 0 must not be stored without it
    (vLLM 0.33.0's reachable-null skip)."""
    _shorter_hit_after_an_external_load(retention=None)


@pytest.mark.skipif(
    not has_bug("sparse-retention-shorter-hit-reads-unstored-block"),
    reason=f"tolerated only where the registry lists it (see {SHORTER_HIT_REPORT})",
)
@pytest.mark.parametrize(
    "retention", [0, 16, None], ids=["retention-0", "retention-16", "retention-dense"]
)
def test_the_shorter_hit_s_tolerance_lets_through_its_load_alone(retention: int | None) -> None:
    """The random workloads tolerate this bug where the registry lists it (SHORTER_HIT):
    under a sparse retention (the default or a periodic one) b's load of the slot a's
    store left out is recorded, not reported, and the fence drains; under dense
    retention, with the same tolerance, the sequence is clean and nothing is recorded."""
    e = _shorter_hit_after_an_external_load(retention, tolerate=(SHORTER_HIT,))
    _assert_only_b_s_loads_tolerated(e, SHORTER_HIT, met=retention is not None)


UNALIGNED_HIT_REPORT = "docs/vllm-bug-unaligned-hybrid-hit-reads-unstored-block.md"


def _hybrid_tier_after_two_external_loads(
    retention: int | None, tolerate: tuple[str, ...] | None = None
) -> FenceEngine:
    """The hybrid engine. Another connector loads a's first 12 tokens and b's first 8,
    so the sliding-window manager backs only the window before them. a's store leaves
    out its window chunk 1 (tokens 4-7), whose block 2 is null; b's stores its window
    chunk 0 (tokens 0-3) without block 0, which the store's reachability, at 8-token
    boundaries, says no hit reads. The GPU prefix cache alone is then reset, so that a
    later request's hit comes from the CPU tier (found by a hunt on 0.34.0, reduced by
    hand)."""
    e = _hybrid_engine(retention=retention, tolerate=tolerate)
    e.add_request([*range(1, 9), *range(1000, 1005)], 1, req_id="a", remote_tokens=12)
    e.add_request([1, 2, 3, 4, *range(1005, 1010)], 1, req_id="b", remote_tokens=8)
    e.drain()
    assert e.reset_gpu_cache()
    return e


@known_bug(
    "unaligned-hybrid-hit-reads-unstored-block",
    raises=ContentViolation,
    reason=(
        "the sliding-window group's 4-token chunks cut c's hit to 4 tokens, off the "
        "8-token boundary the store's reachability assumes; the window before token 4 "
        f"reads b's block 0, which b's store left out (see {UNALIGNED_HIT_REPORT})"
    ),
)
@known_bug(
    "reachable-null-block-chunk-stored",
    raises=ContentViolation,
    reason=(
        "no check keeps a chunk holding a null block out of the tier: a's window chunk 1 "
        "is stored without block 2, and c's 8-token hit reads it "
        f"(see {NULL_CHUNK_REPORT})"
    ),
)
@RETENTION
def test_a_hit_cut_by_a_finer_window_chunk_loads_only_stored_blocks(
    retention: int | None,
) -> None:
    """c shares a's first 8 tokens: full attention hits them all, but the window's
    chunk 1 is not in the tier, so its chunk 0 cuts the hit to tokens 0-3, whose window
    reads both of b's blocks 0 and 1. Either the hit stays on the full-attention chunk
    boundary (no hit here) or the tier holds what it serves."""
    e = _hybrid_tier_after_two_external_loads(retention)
    e.add_request([*range(1, 9), 1010], 1, req_id="c")
    e.drain()  # raises ContentViolation if a load brings a block no store wrote


@RETENTION
def test_the_same_tier_serves_an_aligned_hit_from_stored_blocks(retention: int | None) -> None:
    """The case next to the bug, clean on every release: c shares b's first 8 tokens,
    so its hit ends on the full-attention chunk boundary, and its window (tokens 2-7)
    reads b's blocks 1-3, all stored."""
    e = _hybrid_tier_after_two_external_loads(retention)
    e.add_request([1, 2, 3, 4, 1005, 1006, 1007, 1008, 2000], 1, req_id="c")
    e.drain()
    assert _loaded(e, "c") or _hit_kept_out_by_the_unaligned_fix(e, "b"), "c loaded nothing"
    assert e.contents.violations == []


@RETENTION
def test_the_unaligned_hit_tolerance_leaves_an_aligned_hit_to_fail(
    monkeypatch: pytest.MonkeyPatch, retention: int | None
) -> None:
    """The random workloads' tolerance of unaligned-hybrid-hit-reads-unstored-block
    (UNALIGNED_HIT) covers only a hit cut off the full-attention chunk. With the
    reachable-null skip planted out (where vLLM has it: 0.33.0 on; before, vLLM stores
    such a chunk itself), a's window chunk 1 is stored without its null block 2, so c's
    hit reaches token 8, on the boundary, and its window reads that slot: an engine
    tolerating UNALIGNED_HIT alone still fails."""
    skip = "group_state.block_ids[chunk_start + b] == 0"
    if skip in inspect.getsource(OffloadingConnectorScheduler._build_store_jobs):
        plant(monkeypatch, OffloadingConnectorScheduler, "_build_store_jobs", skip, "False")
    e = _hybrid_tier_after_two_external_loads(retention, tolerate=(UNALIGNED_HIT,))
    e.add_request([*range(1, 9), 1010], 1, req_id="c")
    with pytest.raises(ContentViolation, match=r"request c, block index 2\)"):
        e.drain()
    assert [label for label, _ in e.known_bug_hits if label == UNALIGNED_HIT] == []
