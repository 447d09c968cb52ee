"""Real vLLM 0.33.0 fence bugs this suite found, kept as expected failures.

Each is written up for vLLM's maintainers in ``docs/``; when vLLM fixes one, its
test starts to pass, ``xfail_strict`` turns that into a failure, and the marker
comes off.
"""

from __future__ import annotations

import pytest
from fence_harness import PREEMPTED_THEN_FINISHED, ContentViolation, FenceEngine
from fence_oracle import FenceOracle

REPORT = "docs/vllm-bug-reset-sliding-window.md"


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


@pytest.mark.xfail(
    raises=ContentViolation,
    strict=True,
    reason=(
        "vLLM 0.33.0: _reset_cache rewinds next_stored_chunk_idx to 0 for running "
        "requests, but sliding-window block ids below the old start were never zeroed "
        "when vLLM freed and re-allocated them; the re-offload stores another "
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


@pytest.mark.xfail(
    raises=ContentViolation,
    strict=True,
    reason=f"the same vLLM 0.33.0 bug, with chunks of three blocks (see {REPORT})",
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


@pytest.mark.xfail(
    raises=ContentViolation,
    strict=True,
    reason=(
        "vLLM 0.33.0: with async scheduling, a request preempted while its last token "
        "is in flight finishes with that token; the connector then builds its final "
        "store from the blocks the preemption freed, which another request has "
        f"already overwritten (see {PREEMPTION_REPORT})"
    ),
)
def test_final_store_of_a_request_finished_after_its_preemption_reads_its_own_data() -> None:
    """Found by the stateful tests (long profile). Async scheduling, a pool of 8
    usable blocks: r2 (3-token prompt, 2 new tokens) is preempted at step 3, before
    step 2's output (its last token) is applied; block 8, its block 0, goes to r1
    and r1's forward pass writes it. The output then finishes r2, and at step 4 the
    connector stores r2's block 0, from block 8."""
    _preempted_then_finished().drain()


def _preempted_then_finished(tolerate: tuple[str, ...] = ()) -> FenceEngine:
    e = FenceEngine(
        num_gpu_blocks=9,
        async_scheduling=True,
        cpu_chunks=2,
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
    e = _preempted_then_finished(tolerate=(PREEMPTED_THEN_FINISHED,))
    e.drain()
    (hit,) = e.known_bug_hits
    assert hit[0] == PREEMPTED_THEN_FINISHED
    assert e.store_jobs[hit[1]].req_id == "r2"
    assert e.contents.violations == []
    assert e.fence == {}
