"""Speculative decoding on the real scheduler: drafts scheduled, rejected ones rolled
back, and what the content model makes of the KV a rejected draft leaves in its slot.

The engine plays vLLM's n-gram speculation (:class:`fence_harness.Speculation`):
after each step it hands the scheduler draft tokens, and the step that verifies them
accepts a prefix of them. These tests fix the drafts and their fate, so that each
program is one sequence; ``SpeculativeMachine`` (fence_machines.py) draws them.
"""

from __future__ import annotations

from inspect import getsource

import pytest
from fence_config import LOOKAHEAD_HASHES
from fence_contents import Rejected
from fence_findings import has_bug
from fence_harness import ContentViolation, FenceEngine, Speculation
from fence_plant import plant
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)

# The final store's commit point (vLLM 0.30.0 on): a finished request stores its
# tokens less the last, whose slot under speculative decoding holds a rejected draft.
COMMIT_POINT = "max(req.num_prompt_tokens, req.num_tokens - 1)"
# vLLM 0.34.0 on also caps it at the tokens computed: min(req.num_computed_tokens, ...)
ALSO_COMPUTED = "req.num_computed_tokens,"
# vLLM 0.28.0-0.29.0 store up to the last token as shipped
# (docs/vllm-bug-final-store-uncomputed-token.md)
STORES_PAST_IT = has_bug("final-store-uncomputed-token")


def _rejecting(**options: object) -> FenceEngine:
    """Full attention, 4-token blocks; after every step two drafts per request, and
    the target model accepts none of them."""
    never = Speculation(2, lambda req_id, step: 2, lambda req_id, step, drafts: 0)
    return FenceEngine(retention_interval=None, speculation=never, **options)  # type: ignore[arg-type]


def test_rejected_drafts_are_rolled_back_and_stay_in_their_slots() -> None:
    e = _rejecting(num_gpu_blocks=16)
    r = e.add_request(list(range(7)), max_tokens=3)
    prefill = e.step()  # positions 0-6; samples position 7's token
    assert prefill.output.scheduled_spec_decode_tokens == {}
    verify = e.step()  # position 7, and drafts for positions 8 and 9
    assert len(verify.output.scheduled_spec_decode_tokens[r]) == 2
    assert verify.output.num_scheduled_tokens[r] == 3
    # both drafts rejected: the scheduler counts position 7 computed, not 8 and 9
    assert e.requests[r].num_computed_tokens == 8
    # block 2 (positions 8-11) was written by the two rejected drafts alone
    block = e.block_tables()[(r, 0, 2)]
    assert e.contents.gpu[block] == Rejected(r, 0, 2)
    e.run()
    e.drain()
    assert e.requests[r].is_finished()
    assert e.contents.violations == []
    assert e.fence == {}
    # the final store keeps to the commit point: blocks 0 and 1, not block 2
    stored = {index for req, group, index in e.stored_positions() if req == r}
    assert stored == {0, 1}


def _last_token_after_rejected_drafts() -> tuple[FenceEngine, str]:
    """A 6-token prompt answered with two tokens: the second comes from a step whose
    two drafts (positions 7 and 8) were both rejected, so position 7's slot, the
    last of block 1, holds a rejected draft when the request finishes."""
    e = _rejecting(num_gpu_blocks=16, tolerate=())
    return e, e.add_request(list(range(6)), max_tokens=2)


@pytest.mark.skipif(STORES_PAST_IT, reason="this vLLM stores past the commit point as shipped")
def test_the_final_store_leaves_out_the_block_a_rejected_draft_ends() -> None:
    e, r = _last_token_after_rejected_drafts()
    e.run()
    e.drain()
    assert e.contents.violations == []
    stored = {index for req, group, index in e.stored_positions() if req == r}
    assert stored == {0}


def test_a_final_store_past_the_commit_point_reads_a_rejected_draft(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit point dropped (vLLM 0.28.0-0.29.0 ship that; 0.34.0 on has a second
    cap, at the tokens computed, dropped too): the finished request's store copies
    block 1, whose last slot the rejected draft wrote, and the content model names
    the block."""
    if not STORES_PAST_IT:
        past = "max(req.num_prompt_tokens, req.num_tokens)"
        build = OffloadingConnectorScheduler._build_store_jobs
        also = [(ALSO_COMPUTED, "req.num_tokens,")] if ALSO_COMPUTED in getsource(build) else []
        plant(
            monkeypatch,
            OffloadingConnectorScheduler,
            "_build_store_jobs",
            COMMIT_POINT,
            past,
            *also,
        )
    e, r = _last_token_after_rejected_drafts()
    e.run()  # ends as the request finishes; its final store is built in the next step
    with pytest.raises(ContentViolation) as caught:
        e.drain()
    assert f"({r!r}, 0, 1, 7), not the data of its key" in str(caught.value)


def _a_stored(async_scheduling: bool, **options: object) -> FenceEngine:
    """A sliding-window engine (4-token blocks, a window of 4) that has run request a,
    a 13-token prompt and 2 tokens, to the end; ``options`` as FenceEngine's."""
    e = FenceEngine(
        layout="sliding",
        window_blocks=4,
        num_gpu_blocks=32,
        async_scheduling=async_scheduling,
        **options,  # type: ignore[arg-type]
    )
    e.add_request(list(range(1, 14)), 2, req_id="a")
    e.drain()
    return e


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_an_eagle_engine_s_scheduler_runs_as_an_eagle_drafter_s(async_scheduling: bool) -> None:
    """An EAGLE engine gives the core scheduler the drafter's speculative config: it
    reserves a lookahead slot, and drops the last block of a prefix-cache hit (that
    block's last drafter slot was written from the token after it, which the hit does
    not cover). b shares a's first 12 tokens, three 4-token blocks: without EAGLE its
    hit is those 12 tokens, with EAGLE 8."""
    hits = {}
    for eagle in (False, True):
        e = _a_stored(async_scheduling, eagle=eagle)
        e.add_request([*range(1, 13), 99, 98], 2, req_id="b")
        (new,) = e.step().output.scheduled_new_reqs
        hits[eagle] = (new.num_computed_tokens, e.scheduler.num_lookahead_tokens)
        e.drain()
    assert hits == {False: (12, 0), True: (8, 1)}


@pytest.mark.skipif(not LOOKAHEAD_HASHES, reason="lookahead block hashes: vLLM 0.34.0 on")
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_lookahead_hashes_keep_a_hit_s_last_block_when_the_token_after_it_agrees(
    async_scheduling: bool,
) -> None:
    """With lookahead block hashes (vLLM 0.34.0's default for an EAGLE drafter), a
    block's hash covers the token after it, which the drafter's KV at the block's last
    position reads, and no hit block is dropped. a's 13-token prompt is stored; b
    shares its first 12 tokens, and its 13th token is a's (kept: 12 tokens hit) or
    another (8). The same from the CPU tier once the GPU prefix cache is reset (the
    connector's lookup, then its load). Without them, vLLM's fallback, 8 always."""
    hits = {}
    for lookahead in (False, True):
        for cpu_tier in (False, True):
            for token in (13, 99):
                e = _a_stored(async_scheduling, eagle=True, lookahead_hashes=lookahead)
                assert e.lookahead_hashes is lookahead
                assert e.connector.use_lookahead_block_hashes is lookahead
                if cpu_tier:
                    assert e.reset_gpu_cache()
                e.add_request([*range(1, 13), token, 98], 2, req_id="b")
                output = e.step().output
                if cpu_tier:  # b waits on its load, its hit counted computed
                    hits[lookahead, cpu_tier, token] = e.requests["b"].num_computed_tokens
                else:  # b's GPU hit is computed as it is scheduled
                    (new,) = output.scheduled_new_reqs
                    hits[lookahead, cpu_tier, token] = new.num_computed_tokens
                loads = [job for job in e.ledger.load_jobs.values() if job.req_id == "b"]
                assert len(loads) == int(cpu_tier)
                e.drain()
                assert e.contents.violations == []
    kept = {(True, cpu_tier, 13): 12 for cpu_tier in (False, True)}
    assert hits == {key: kept.get(key, 8) for key in hits}
    assert len(hits) == 8
