"""The harness's own checks, tested. The liveness checks L3 (``ReplayLiveness``) and L4
(``SegmentLiveness``), on engines built by hand: what each holds vLLM to (kept on every
release), that each names the chunks a planted store leaves out, and that each leaves
alone a chunk vLLM skips by design. And the random workloads' programs: a seed deals
the same ones in every process.
"""

from __future__ import annotations

from typing import Any

import pytest
from fence_config import Layout
from fence_findings import VLLM_VERSION, at_least, fixed, has_bug
from fence_harness import FenceEngine
from fence_oracle import (
    FenceOracle,
    ReplayLiveness,
    SegmentLiveness,
)
from fence_plant import plant, plant_retention_taken_for_default
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)


def test_the_programs_draw_no_constant_from_local_code() -> None:
    """A seed deals the same programs in every process: Hypothesis's pool of constants
    from local modules (fence-audit's package, loaded here in full) stays empty."""
    from hypothesis.internal.conjecture import providers

    import audit.cli  # noqa: F401  (local code, full of constants)

    assert len(providers._get_local_constants()) == 0


# L3 (ReplayLiveness) on one request under vLLM's default retention: a's 17-token prompt,
# chunks of two 4-token blocks, a window of two blocks. Its replay boundary is token 16,
# so the same prompt sent again can hit 16 tokens, ending on a's window chunk 1.
REPLAY_PROMPT = list(range(1, 18))


def _a_alone(layout: Layout, liveness: ReplayLiveness) -> FenceEngine:
    """a runs to its end, ``liveness`` attached before the first step."""
    e = FenceEngine(
        layout=layout,
        window_blocks=2,
        blocks_per_chunk=2,
        num_gpu_blocks=40,
        post_step_fns=[FenceOracle(), liveness],
    )
    liveness.attach(e)
    e.add_request(REPLAY_PROMPT, 2, req_id="a")
    e.drain()
    return e


@pytest.mark.parametrize("layout", ["sliding", "mixed"])
def test_a_prompt_sent_again_under_default_retention_hits_its_replay_boundary(
    layout: Layout,
) -> None:
    """What L3 holds vLLM to, kept on every release: a's window chunk ending at its
    replay boundary reaches the tier, and c, with a's prompt once the GPU prefix cache
    is emptied, loads its first 16 tokens from there."""
    liveness = ReplayLiveness(0 if layout == "sliding" else 1, 8, 8, 2, coarse=False)
    e = _a_alone(layout, liveness)
    assert set(liveness.computed_at["a"]) == {1}  # the replay chunk alone is held
    assert liveness.check(e) == []
    assert e.reset_gpu_cache()
    e.add_request(REPLAY_PROMPT, 1, req_id="c")
    e.drain()
    assert e.ledger.hits("c") == [16]


@pytest.mark.parametrize("layout", ["sliding", "mixed"])
def test_the_replay_check_names_a_replay_chunk_never_offered(
    monkeypatch: pytest.MonkeyPatch, layout: Layout
) -> None:
    """A connector that offers the tier nothing: L3 names a's replay chunk, and c's
    lookup finds nothing there."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "_build_store_jobs",
        "new_offload_keys.append(offload_key)",
        "pass",
    )
    liveness = ReplayLiveness(0 if layout == "sliding" else 1, 8, 8, 2, coarse=False)
    e = _a_alone(layout, liveness)
    found = liveness.check(e)
    assert [v.invariant for v in found] == [ReplayLiveness.INVARIANT]
    assert "request a finished" in found[0].message
    assert "chunks [1], each ending at its replay boundary" in found[0].message


# L3 at a shared-prefix junction: a's 33-token prompt (its replay boundary is token 32),
# then b with a's first 24 tokens and 16 of its own, in the mixed layout (both groups'
# blocks of 4 tokens, chunks of two, a window of two). Under the default retention the
# window group kept only a's replay tail, so b's GPU prefix hit of full attention runs
# past the window group's: the junction is token 24, and b's window chunk 2 ends there.
JUNCTION_A = list(range(1, 34))
JUNCTION_B = [*range(1, 25), *range(500, 516)]


def _b_past_a_s_junction(liveness: ReplayLiveness) -> FenceEngine:
    """a, then b, each run to its end, then the GPU prefix cache alone is emptied."""
    e = FenceEngine(
        layout="mixed",
        window_blocks=2,
        blocks_per_chunk=2,
        num_gpu_blocks=80,
        post_step_fns=[FenceOracle(), liveness],
    )
    liveness.attach(e)
    for req_id, prompt in (("a", JUNCTION_A), ("b", JUNCTION_B)):
        e.add_request(prompt, 2, req_id=req_id)
        e.drain()
    assert e.reset_gpu_cache()
    return e


def test_a_shared_prefix_junction_under_default_retention_reaches_the_tier() -> None:
    """What L3 holds vLLM to at a junction, kept on every release: c, sharing b's first
    24 tokens once the GPU prefix cache is emptied, loads them all from the tier. From
    vLLM 0.30.0 on b computes its window from token 0 and the connector pins the
    junction (before, the GPU hit covers the window too, and every chunk is stored)."""
    liveness = ReplayLiveness(1, 8, 8, 2, coarse=False)
    e = _b_past_a_s_junction(liveness)
    if at_least("0.30.0"):
        assert e.requests["b"].shared_prefix_boundary == 24
        assert set(liveness.computed_at["b"]) == {2, 3}  # the junction's, the replay's
    assert liveness.check(e) == []
    e.add_request([*range(1, 25), 900, 901], 1, req_id="c")
    e.drain()
    assert e.ledger.hits("c") == [24]


@pytest.mark.skipif(
    not at_least("0.30.0"), reason=f"vLLM {VLLM_VERSION}: the connector pins no junction"
)
def test_the_replay_check_names_a_junction_chunk_never_offered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mask that keeps the replay boundary but not the junction: L3 names b's window
    chunk 2, which no check saw before (c then hits nothing)."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "_build_store_jobs",
        "reachable_boundaries += (req.shared_prefix_boundary,)",
        "pass",
    )
    liveness = ReplayLiveness(1, 8, 8, 2, coarse=False)
    e = _b_past_a_s_junction(liveness)
    found = liveness.check(e)
    assert [v.invariant for v in found] == [ReplayLiveness.INVARIANT]
    assert "request b finished" in found[0].message
    assert "chunks [2], each ending at" in found[0].message


@pytest.mark.parametrize("coarse", [True, False], ids=["coarse", "as-if-exact"])
def test_a_replay_chunk_a_coarse_mask_skips_for_its_null_block_is_not_reported(
    coarse: bool,
) -> None:
    """Full-attention blocks of 4 tokens beside window blocks of 8 (a window of one),
    chunks of three blocks: the hit alignment (12 tokens) is no multiple of the
    window's block, so vLLM's mask calls every window block reachable. a's 30-token
    prompt runs in two pieces (20 tokens, then 10); when the second, which computes the
    replay boundary (token 24), is scheduled, the window has left block 0, and the
    store skips window chunk 0 for its null block, by design. L3 leaves it alone
    (``coarse``); held to it as if the mask were exact, it would report the chunk
    where the release skips it."""
    liveness = ReplayLiveness(1, 24, 12, 3, coarse=coarse)
    e = _fine_full_coarse_window(
        liveness, blocks_per_chunk=3, num_gpu_blocks=60, max_num_batched_tokens=20
    )
    e.add_request(list(range(1, 31)), 2, req_id="a")
    e.drain()
    assert [record.output.num_scheduled_tokens.get("a") for record in e.history[:2]] == [20, 10]
    # sparse-retention-shorter-hit-reads-unstored-block, fixed: the store skips a chunk
    # holding a null block that a hit at any aligned boundary reads, and ReplayLiveness
    # leaves such a chunk out whatever ``coarse`` says (here every block is reachable)
    dense = fixed("sparse-retention-shorter-hit-reads-unstored-block")
    _a_s_chunk_0_reported_only_if_held(e, liveness, held=not coarse and not dense)


def _fine_full_coarse_window(liveness: ReplayLiveness, **options: Any) -> FenceEngine:
    """The mixed layout with full-attention blocks of 4 tokens beside window blocks of 8
    and a window of one, ``liveness`` attached before the first step."""
    e = FenceEngine(
        layout="mixed",
        block_size=4,
        sliding_block_size=8,
        window_blocks=1,
        post_step_fns=[FenceOracle(), liveness],
        **options,
    )
    liveness.attach(e)
    return e


def _a_s_chunk_0_reported_only_if_held(
    e: FenceEngine, liveness: ReplayLiveness, *, held: bool
) -> None:
    """a's window chunk 0 is skipped by design (a release with
    reachable-null-block-chunk-stored stores it without its null block); ``liveness``
    reports it where the release skips it and the check is ``held`` to it, and
    nothing else."""
    skipped = liveness.keys["a"][0] not in liveness.offered_by["a"]
    assert skipped is not has_bug("reachable-null-block-chunk-stored")
    found = liveness.check(e)
    if held and skipped:
        assert [v.invariant for v in found] == [liveness.INVARIANT]
    else:
        assert found == []


# L4 (SegmentLiveness) under a periodic retention of 16 tokens: a's 45-token prompt in
# the mixed layout (both groups' blocks of 4 tokens, chunks of two, a window of two). The
# mask keeps the window's tail at the end of each 16-token segment (tokens 16 and 32,
# chunks 1 and 3) and at the replay boundary (token 44, down to the alignment: 40,
# chunk 4).
SEGMENT_PROMPT = list(range(1, 46))


def _a_under_segments(liveness: SegmentLiveness, retention: int = 16) -> FenceEngine:
    """a runs to its end under ``retention``, ``liveness`` attached, then the GPU prefix
    cache alone is emptied and c sends a's first 20 tokens and two more."""
    e = FenceEngine(
        layout="mixed",
        window_blocks=2,
        blocks_per_chunk=2,
        num_gpu_blocks=60,
        retention_interval=retention,
        post_step_fns=[FenceOracle(), liveness],
    )
    liveness.attach(e)
    e.add_request(SEGMENT_PROMPT, 2, req_id="a")
    e.drain()
    assert set(liveness.computed_at["a"]) == {1, 3, 4}
    assert e.reset_gpu_cache()
    e.add_request([*SEGMENT_PROMPT[:20], 900, 901], 1, req_id="c")
    e.drain()
    return e


def test_a_prefix_under_periodic_retention_hits_its_segment_s_end() -> None:
    """What L4 holds vLLM to, kept on every release: under a retention of 16 tokens,
    a's window chunks at the segments' ends reach the tier, and c loads its first 16
    tokens from there (under the default retention it would hit nothing: no boundary
    of a's is at 16)."""
    liveness = SegmentLiveness(1, 8, 8, 2, 16, 2, coarse=False)
    e = _a_under_segments(liveness)
    assert liveness.check(e) == []
    assert e.ledger.hits("c") == [16]


@pytest.mark.parametrize("tails", [1, 0], ids=["as-vllm", "as-if-no-tail"])
def test_a_segment_chunk_vllm_skips_for_a_reachable_null_block_is_not_reported(
    tails: int,
) -> None:
    """Full-attention blocks of 4 tokens beside window blocks of 8 (a window of one),
    chunks of two blocks, a retention of 16 tokens. a's 13-token prompt: its replay
    boundary (12, down to the 8-token alignment: 8) keeps the tail of window block 0,
    inside chunk 0, whose end is the first segment's. By the time the store passes over
    chunk 0 (its key waits for a's 16th token), the window has left block 0 and b,
    waiting for blocks in a pool of 14, has it: vLLM 0.33.0 on skips the chunk for that
    reachable null block, by design. L4 leaves it out; held to it as if the mask kept no
    tail (``window_blocks`` 0), it reports the chunk where the release skips it."""
    liveness = SegmentLiveness(1, 16, 8, 2, 16, tails, coarse=False)
    e = _fine_full_coarse_window(
        liveness, blocks_per_chunk=2, retention_interval=16, num_gpu_blocks=14
    )
    e.add_request(list(range(1, 14)), 6, req_id="a")
    e.step()
    e.add_request(list(range(100, 120)), 3, req_id="b")
    e.drain()
    assert liveness.computed_at["a"].keys() == {0}
    assert liveness.nulls_passed["a"] == {0: {0}}
    _a_s_chunk_0_reported_only_if_held(e, liveness, held=not tails)


@pytest.mark.skipif(
    not at_least("0.30.0"), reason=f"vLLM {VLLM_VERSION}: the connector reads no retention"
)
def test_the_segment_check_names_the_segment_chunks_a_store_leaves_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that takes a periodic retention for the default one keeps only the
    replay boundary's chunk: L4 names a's chunks 1 and 3, and c hits nothing."""
    plant_retention_taken_for_default(monkeypatch)
    liveness = SegmentLiveness(1, 8, 8, 2, 16, 2, coarse=False)
    e = _a_under_segments(liveness)
    found = liveness.check(e)
    assert [v.invariant for v in found] == [SegmentLiveness.INVARIANT]
    assert "request a finished" in found[0].message
    assert "chunks [1, 3], each ending at a segment boundary" in found[0].message
    assert e.ledger.hits("c") == [0]
