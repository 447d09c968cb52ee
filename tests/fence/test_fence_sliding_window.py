"""Sliding-window filtering: which blocks are stored, and which stale ids never are.

The store and load sets below were pinned on vLLM 0.33.0 (as vLLM's own tests pin
theirs): a change in them is a change in what the connector offloads, to be looked
at, not silently accepted. vLLM 0.28.0 and 0.29.0 offload by an older rule, with
sets of their own, pinned on both (``PINNED_BEFORE_RETENTION``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fence_findings import at_least, fixed
from fence_harness import FenceEngine, Plan, StepRecord
from fence_oracle import FenceOracle
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)

A = list(range(1, 25))  # 24 tokens: 6 blocks of 4


def _finish_a(max_tokens: int, layout: str = "sliding", **options: object) -> FenceEngine:
    """Request a (a 24-token prompt) runs to its end with its first store held until
    its last decode step: with a one-chunk CPU tier, a's other stores are refused
    meanwhile (``prepare_store`` returns None) while its window moves on."""
    e = FenceEngine(
        layout=layout,  # type: ignore[arg-type]
        window_blocks=2,
        delay=lambda job_id, is_store: None if job_id == 0 else 0,
        post_step_fns=[FenceOracle()],
        **options,  # type: ignore[arg-type]
    )
    e.add_request(A, max_tokens, req_id="a")
    while not e.requests["a"].is_finished():
        if len(e.requests["a"].output_token_ids) >= max_tokens - 1:
            e.worker.release()
        e.step()
    return e


def _run_a_then_b(
    layout: str, blocks_per_chunk: int, async_scheduling: bool, cpu_chunks: int
) -> FenceEngine:
    """a as in :func:`_finish_a` (4 new tokens); then the GPU prefix cache is emptied
    and b, with a's prompt, looks a up in the CPU tier."""
    e = _finish_a(
        4,
        layout,
        num_gpu_blocks=8 if layout == "sliding" else 16,
        blocks_per_chunk=blocks_per_chunk,
        cpu_chunks=cpu_chunks,
        max_num_batched_tokens=4 * blocks_per_chunk,
        async_scheduling=async_scheduling,
    )
    e.drain()
    assert e.scheduler.reset_prefix_cache()
    e.add_request(A, 2, req_id="b")
    e.run()
    e.drain()
    assert e.fence == {}
    assert not e.connector._jobs
    return e


def _full(request: str, indices: range) -> list[tuple[str, int, int]]:
    return [(request, 0, i) for i in indices]


PINNED = {
    # (layout, blocks per chunk, async, CPU chunks): (stored, loaded)
    ("sliding", 1, False, 1): (
        [("a", 0, 3), ("a", 0, 4), ("b", 0, 3), ("b", 0, 4)],
        [],
    ),
    ("sliding", 1, False, 16): ([("a", 0, 3), ("a", 0, 4)], [("b", 0, 3), ("b", 0, 4)]),
    ("sliding", 1, True, 1): ([("a", 0, 3), ("b", 0, 4)], []),
    ("sliding", 2, False, 1): ([("a", 0, 2), ("a", 0, 3)], [("b", 0, 2), ("b", 0, 3)]),
    ("sliding", 2, True, 16): ([("a", 0, 2), ("a", 0, 3)], [("b", 0, 2), ("b", 0, 3)]),
    ("mixed", 1, False, 1): ([("a", 0, 0), ("b", 0, 1)], []),
    ("mixed", 1, True, 16): (
        [*_full("a", range(6)), ("a", 1, 3), ("a", 1, 4)],
        [*_full("b", range(5)), ("b", 1, 3), ("b", 1, 4)],
    ),
    ("mixed", 2, False, 16): (
        [*_full("a", range(6)), ("a", 1, 2), ("a", 1, 3)],
        [*_full("b", range(4)), ("b", 1, 2), ("b", 1, 3)],
    ),
}


# vLLM 0.28.0-0.29.0 offer a sliding-window chunk for storing if it lies in the
# trailing window of its full-attention segment (is_store_reachable_swa_chunk); the
# checkpoint retention and the reachable-block mask (_reachable_store_block_mask) came
# in 0.30.0. So those releases store more of a's chunks, and b loads other ones. Each
# set was checked by the content model and the oracle (the final store of a's block
# index 6 there is final-store-uncomputed-token, tolerated on those releases).
RETENTION_AWARE_STORES = hasattr(OffloadingConnectorScheduler, "_reachable_store_block_mask")
PINNED_BEFORE_RETENTION = {
    ("sliding", 1, False, 1): ([("a", 0, 0), ("b", 0, 1)], [("b", 0, 0)]),
    ("sliding", 1, False, 16): (_full("a", range(7)), [("b", 0, 4), ("b", 0, 5)]),
    ("sliding", 1, True, 1): ([("a", 0, 0), ("b", 0, 1)], [("b", 0, 0)]),
    ("sliding", 2, False, 1): (
        [("a", 0, 0), ("a", 0, 1), *_full("b", range(2, 6))],
        [("b", 0, 0), ("b", 0, 1)],
    ),
    ("sliding", 2, True, 16): (_full("a", range(6)), [("b", 0, 4), ("b", 0, 5)]),
    ("mixed", 1, False, 1): ([], []),
    ("mixed", 1, True, 16): (
        [*_full("a", range(7)), *[("a", 1, i) for i in range(7)]],
        [*_full("b", range(6)), ("b", 1, 4), ("b", 1, 5)],
    ),
    ("mixed", 2, False, 16): (
        [*_full("a", range(6)), *[("a", 1, i) for i in range(6)]],
        [*_full("b", range(6)), ("b", 1, 4), ("b", 1, 5)],
    ),
}
assert PINNED_BEFORE_RETENTION.keys() == PINNED.keys()
# vLLM 0.34.0 offers b's sliding-window chunks 0 and 1 in one store (0.33.0 offered
# chunk 0 alone, found it in the tier, then chunk 1): a one-chunk tier refuses the pair
# (prepare_store returns None), so b stores nothing there. The oracle and the content
# model pass either way; only what the tier keeps differs.
if at_least("0.34.0"):
    PINNED = {**PINNED, ("mixed", 1, False, 1): ([("a", 0, 0)], [])}


@pytest.mark.parametrize(
    ("case", "expected"),
    (PINNED if RETENTION_AWARE_STORES else PINNED_BEFORE_RETENTION).items(),
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) and len(v) == 4 else "",
)
def test_stored_and_loaded_blocks_are_pinned(case: tuple, expected: tuple) -> None:
    e = _run_a_then_b(*case)
    stored, loaded = expected
    assert sorted(e.stored_positions()) == stored
    assert sorted(e.loaded_positions()) == loaded


def _the_step_and_its_predecessor(
    records: list[StepRecord], is_it: Callable[[StepRecord], bool]
) -> tuple[StepRecord, StepRecord]:
    """The only step ``is_it`` picks, and the step before it (whose tables show the
    block ids as they were when that step began)."""
    (step,) = [r for r in records if is_it(r)]
    return records[records.index(step) - 1], step


def test_final_store_skips_a_last_block_handed_on_in_the_same_step() -> None:
    """The zeroing walks every tracked request, not only the scheduled ones (M-D5),
    and up to the last block a request holds (catalogue:
    sliding-window-window-skips-last).

    Async scheduling, dense retention, chunks of two blocks. r0 (19-token prompt, 6
    new tokens) ends at 24 computed tokens: its last chunk (block indices 4 and 5) is
    left for its final store. In the step that builds that store, r0 is not
    scheduled and vLLM hands r0's block index 5 to r2. Only the zeroing keeps it
    out of the store: a store job created in that step is not flushed, so it would
    read the block after r2's forward pass wrote it. (Found by a search over 500
    random workloads with dense retention.)
    """
    e = FenceEngine(
        layout="sliding",
        window_blocks=3,
        blocks_per_chunk=2,
        async_scheduling=True,
        num_gpu_blocks=7,
        retention_interval=None,
        post_step_fns=[FenceOracle()],
    )
    records = e.run(
        [
            Plan(range(200, 219), 6, req_id="r0"),
            Plan(range(100, 112), 5, arrive_at=2, req_id="r3"),
            Plan(range(100, 108), 4, arrive_at=4, req_id="r2"),
        ]
    )
    e.drain()
    before, final = _the_step_and_its_predecessor(
        records, lambda r: "r0" in r.output.finished_req_ids
    )
    last_block = before.tables[("r0", 0, 5)]
    assert ("r2", 0, 1) in final.allocated.get(last_block, ()), (
        "r2 did not take the block of r0's last block index in r0's final step"
    )
    if fixed("finished-window-chunk-dropped"):
        # The fix (docs/upstream/finished-window-chunk-dropped.md) zeroes no id of a
        # finished request: its final store reads the chunk whole and is flushed in
        # that step, before r2's forward pass writes the block (the content model
        # checks what it read).
        flushed = [j for j, job in final.store_jobs.items() if job.req_id == "r0"]
        assert flushed
        assert set(flushed) <= final.jobs_to_flush
        assert {("r0", 0, 4), ("r0", 0, 5)} <= e.stored_positions()
        return
    assert ("r0", 0, 5) not in e.stored_positions()
    assert ("r0", 0, 4) not in e.stored_positions()


def test_a_chunk_whose_last_block_is_null_is_not_stored() -> None:
    """A chunk is offered for storing only if its last block is not null, even when
    the null block is one no hit can need (catalogue:
    sliding-window-no-null-last-block-skip).

    An EAGLE drafter's sliding-window group, chunks of three blocks, vLLM's default
    retention. r0 (10-token prompt, 3 new tokens) ends with one chunk, never stored
    while it ran (its stores wait on a slow worker). When r0 finishes, vLLM hands
    its block indices 1 and 2 to r1, so the connector zeroes them: the chunk is
    [block, null, null]. With the EAGLE shift only block index 0 is reachable, so
    the null blocks are unreachable and the reachable one is intact; the connector
    still skips the whole chunk, as its comment says (a null last block means a
    skipped or stale chunk). Storing block 0 alone would not corrupt anything: this
    pins 0.33.0's rule. (Found by a search over 500 random EAGLE workloads.)
    """
    e = FenceEngine(
        layout="sliding",
        window_blocks=3,
        blocks_per_chunk=3,
        num_gpu_blocks=6,
        delay=3,
        eagle=True,
        post_step_fns=[FenceOracle()],
    )
    records = e.run(
        [
            Plan(range(0, 10), 3, arrive_at=2, req_id="r0"),
            Plan(range(100, 115), 7, arrive_at=4, req_id="r1"),
        ]
    )
    e.drain()
    before, final = _the_step_and_its_predecessor(
        records, lambda r: "r0" in r.output.finished_req_ids
    )
    handed = {before.tables[("r0", 0, i)] for i in (1, 2)}
    assert handed <= final.allocated.keys(), "r1 did not take r0's block indices 1 and 2"
    expected = [("r1", 0, 0), ("r1", 0, 1), ("r1", 0, 2)]
    if fixed("finished-window-chunk-dropped"):
        # The fix (docs/upstream/finished-window-chunk-dropped.md) zeroes no id of a
        # finished request: r0's final store reads its chunk whole, flushed before r1
        # writes the blocks it took. The null-last-block rule is not reached here.
        expected = [("r0", 0, 0), ("r0", 0, 1), ("r0", 0, 2), *expected]
        flushed = [j for j, job in final.store_jobs.items() if job.req_id == "r0"]
        assert flushed
        assert set(flushed) <= final.jobs_to_flush
    assert sorted(e.stored_positions()) == expected


def test_a_chunk_whose_last_block_was_handed_on_is_not_stored_at_abort() -> None:
    """A chunk whose last block id the connector zeroed is not stored, even when its
    other block is one a hit can read (catalogue:
    sliding-window-no-null-last-block-skip, on the patched scheduler too).

    An EAGLE drafter's group with a one-token window, one-token blocks, chunks of two
    blocks. r0 (5-token prompt) decodes three tokens. Each step vLLM frees the blocks
    behind the window and hands one back: the id of block index 5 goes to index 7, so
    the connector zeroes index 5, while the id of index 4 stays free and unchanged.
    r0 is then aborted, and its final store considers chunk 2, [id, null]. The EAGLE
    peek makes index 4 (the chunk's first block) reachable and index 5 not, so the
    checks on reachable null blocks let it through: only the rule on the last block
    keeps it out, as the connector's comment says (a null last block is a skip or a
    stale entry). This is the one layout where that rule decides after the upstream
    fixes: with a window of two tokens or more, a chunk with a reachable block has a
    reachable last block. (Found by a search over random one-token-window workloads.)
    """
    e = FenceEngine(
        layout="sliding",
        block_size=1,
        window_blocks=1,
        blocks_per_chunk=2,
        eagle=True,
        num_gpu_blocks=14,
        post_step_fns=[FenceOracle()],
    )
    e.add_request(range(5), 8, req_id="r0")
    for _ in range(4):
        e.step()
    chunk = e.connector._req_status["r0"].group_states[0].block_ids[4:6]
    assert chunk[0] != 0, f"r0's chunk 2 is {chunk}, not [id, null]"
    assert chunk[1] == 0, f"r0's chunk 2 is {chunk}, not [id, null]"
    e.abort("r0")
    e.run()
    e.drain()
    stored = {i for (r, _g, i) in e.stored_positions() if r == "r0"}
    assert not stored & {4, 5}, f"r0's chunk 2 ({chunk}) was stored: {sorted(stored)}"


def test_a_null_block_inside_a_stored_chunk_is_neither_read_nor_fenced() -> None:
    """The per-block loop skips a null block and goes on with the chunk's other
    blocks (M-A9; catalogue: population-registers-null-block).

    A one-block window, chunks of three blocks, a REQUEST_LEVEL tier. r1 finishes,
    then r0 (16-token prompt) prefills in two 8-token steps. In the second, vLLM frees
    r0's block index 0 (out of the window) and hands the same block back to r0 for
    index 2, so the connector zeroes index 0: chunk 0 is [null, x, y], and its null
    block is unreachable. The store reads x and y; block 0 never enters the job's
    lists or the fence (the oracle's I8c). (Found by a search over 150 random
    workloads.)
    """
    e = FenceEngine(
        layout="sliding",
        window_blocks=1,
        blocks_per_chunk=3,
        num_gpu_blocks=10,
        cpu_chunks=8,
        delay=3,
        max_num_batched_tokens=8,
        request_level=True,
        post_step_fns=[FenceOracle()],
    )
    records = e.run(
        [
            Plan(range(0, 7), 2, arrive_at=2, req_id="r1"),
            Plan(range(100, 116), 3, arrive_at=4, req_id="r0"),
        ]
    )
    e.drain()
    before, first = _the_step_and_its_predecessor(
        records, lambda r: any(j.req_id == "r0" for j in r.store_jobs.values())
    )
    assert ("r0", 0, 2) in first.allocated[before.tables[("r0", 0, 0)]], (
        "r0's block index 0 did not come back to it as index 2"
    )
    assert sorted(e.stored_positions()) == [("r0", 0, 1), ("r0", 0, 2)]
