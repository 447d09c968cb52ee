"""Sliding-window filtering: which blocks are stored, and which stale ids never are.

The store and load sets below were pinned on vLLM 0.33.0 (as vLLM's own tests pin
theirs): a change in them is a change in what the connector offloads, to be looked
at, not silently accepted.
"""

from __future__ import annotations

import pytest
from fence_harness import FenceEngine
from fence_oracle import FenceOracle

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


@pytest.mark.parametrize(
    ("case", "expected"),
    PINNED.items(),
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) and len(v) == 4 else "",
)
def test_stored_and_loaded_blocks_are_pinned(case: tuple, expected: tuple) -> None:
    e = _run_a_then_b(*case)
    stored, loaded = expected
    assert sorted(e.stored_positions()) == stored
    assert sorted(e.loaded_positions()) == loaded


def test_zeroing_covers_finished_requests_waiting_on_their_last_store() -> None:
    """The zeroing walks every tracked request, not only the scheduled ones (M-D5).

    a finishes; the next step builds its last sliding-window store (for block index
    4, its store refused earlier while the one-chunk CPU tier was busy) and, in the
    same step, hands that block to b. a is not scheduled in that step, so only a
    walk over every tracked request zeroes the stale id and keeps it out of a's
    store. (Found by a search over 1440 small workloads; this is one that needs it.)
    """
    e = _finish_a(5, num_gpu_blocks=7, cpu_chunks=1, max_num_batched_tokens=16)
    tail = list(e.connector._req_status["a"].group_states[0].block_ids)
    e.add_request(range(500, 516), 2, req_id="b")
    record = e.step()
    assert tail[4] in record.allocated, "b did not take the block of a's unstored chunk"
    assert ("a", 0, 4) not in set(e.stored_positions())
    e.drain()
    assert ("a", 0, 4) not in e.stored_positions()


def test_request_level_store_skips_null_blocks_inside_a_chunk() -> None:
    """A tier that wants every chunk (REQUEST_LEVEL) gets b's prefix hits stored too.
    b's sliding-window table holds the null block before its window, so one of b's
    3-block chunks is [null, x, y]: the store keeps x and y, and never reads, stores
    or fences the null block (M-A9; the chunk loop must skip a null block, not stop)."""
    e = FenceEngine(
        num_gpu_blocks=10,
        layout="sliding",
        window_blocks=2,
        blocks_per_chunk=3,
        max_num_batched_tokens=12,
        request_level=True,
        post_step_fns=[FenceOracle()],
    )
    e.add_request(A, 1, req_id="a")
    e.run()
    e.add_request([*A, *range(900, 908)], 3, req_id="b")  # a's prompt: GPU prefix hits
    e.run()
    e.drain()
    assert sorted(e.stored_positions()) == [
        ("a", 0, 0),
        ("a", 0, 1),
        ("a", 0, 2),
        ("b", 0, 4),
        ("b", 0, 5),
    ]
