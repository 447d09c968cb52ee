# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A GPU prefix-cache hit on a running request's sliding-window blocks must not
make that request drop the chunk holding them from its offload."""

from collections.abc import Callable

import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_offload.base import LookupResult, OffloadKey

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 4


def _sliding_window_runner(
    request_runner,
    async_scheduling: bool,
    window_blocks: int,
    blocks_per_chunk: int,
    retention_interval: int | None,
) -> tuple[RequestRunner, set[OffloadKey]]:
    """A runner with a single sliding-window group whose CPU tier holds exactly
    the keys offered to prepare_store (returned as the second element)."""
    runner = request_runner(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=100,
        blocks_per_chunk=blocks_per_chunk,
        async_scheduling=async_scheduling,
        retention_interval=retention_interval,
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["swa"],
                SlidingWindowSpec(
                    block_size=BLOCK_SIZE,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=window_blocks * BLOCK_SIZE,
                ),
            )
        ],
    )
    offered: set[OffloadKey] = set()

    def prepare_store(keys, req_context):
        offered.update(keys)
        return generate_store_output(keys)

    runner.manager.prepare_store.side_effect = prepare_store
    runner.manager.lookup.side_effect = lambda key, req_context: (
        LookupResult.HIT if key in offered else LookupResult.MISS
    )
    return runner, offered


def _fail_if_chunk_skipped(
    runner: RequestRunner, req_id: str, chunk_idx: int, offered: set[OffloadKey]
) -> Callable[[], None]:
    """A post_step_fn that fails as soon as request ``req_id`` moves its store
    index past chunk ``chunk_idx`` without offering that chunk to the CPU tier."""
    blocks_per_chunk = runner.blocks_per_chunk
    span = slice(chunk_idx * blocks_per_chunk, (chunk_idx + 1) * blocks_per_chunk)
    kv_cache_manager = runner.scheduler.kv_cache_manager
    seen: list[int] = []

    def check() -> None:
        req_status = runner.connector_scheduler._req_status.get(req_id)
        if req_status is None:
            return
        state = req_status.group_states[0]
        if state.next_stored_chunk_idx <= chunk_idx:
            seen[:] = state.block_ids[span]
            return
        if state.offload_keys[chunk_idx] in offered:
            return
        live_blocks = (
            kv_cache_manager.get_block_ids(req_id)[0][span]
            if req_id in runner.scheduler.requests
            else "nothing (freed)"
        )
        sharers = {
            other: block_ids
            for other in runner.scheduler.requests
            if other != req_id
            for block_ids in kv_cache_manager.get_block_ids(other)
            if (set(seen) - {0}) & set(block_ids)
        }
        raise AssertionError(
            f"request {req_id} skipped sliding-window chunk {chunk_idx} without "
            f"offering it to the CPU tier: the connector's copy of its GPU blocks "
            f"reads {state.block_ids[span]} instead of {seen}, while the KV cache "
            f"manager maps {live_blocks} to request {req_id}; requests sharing "
            f"those blocks through the GPU prefix cache: {sharers}"
        )

    return check


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_prefix_cache_hit_keeps_replay_chunk_offloaded(
    request_runner, async_scheduling: bool
):
    """Default retention (prefix_cache_retention_interval=0), as a Gemma 3 or
    gpt-oss deployment with CPU offloading runs it: request 0's 9-token prompt
    is prefilled over two steps (chunked prefill), the second filling GPU block 2
    and so its replay chunk (tokens 4-7). Request 1, scheduled in that second
    step, shares those 8 tokens and gets block 2 from the GPU prefix cache. The
    connector must still offload request 0's replay chunk: request 1 only reads
    the block, and nothing else stores that chunk under this retention."""
    runner, offered = _sliding_window_runner(
        request_runner,
        async_scheduling,
        window_blocks=1,
        blocks_per_chunk=1,
        retention_interval=0,
    )
    # Chunked prefill: 7 tokens a step.
    runner.scheduler.max_num_scheduled_tokens = 7
    check = _fail_if_chunk_skipped(runner, "0", 1, offered)

    runner.new_request(token_ids=[*range(1, 9), 1000])
    runner.run(decoded_tokens=[], post_step_fn=check)
    runner.new_request(token_ids=[*range(1, 9), *range(2000, 2005)])
    runner.run(
        decoded_tokens=[7, 7, EOS_TOKEN_ID],
        # Request 0's replay chunk (block offset 1) and request 1's (offset 2).
        expected_stored=(1, 2),
        post_step_fn=check,
    )

    runner.scheduler.reset_prefix_cache()
    runner.new_request(token_ids=[*range(1, 9), 9])
    runner.run(decoded_tokens=[EOS_TOKEN_ID], expected_loaded=(1,))


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_prefix_cache_hit_keeps_dense_window_chunk_offloaded(
    request_runner, async_scheduling: bool
):
    """Dense retention (prefix_cache_retention_interval=None) with 3 blocks per
    chunk: request 0 prefills 11 tokens into GPU blocks 1-3; chunk 0 (tokens
    0-11) is keyed by its first output token. In the next step request 1 shares
    its first 8 tokens and gets blocks 1 and 2 from the GPU prefix cache, while
    request 0 decodes token 11 with block 2 still in its window. Chunk 0 must
    still be offloaded, and a later request with the same 12 tokens load it."""
    runner, offered = _sliding_window_runner(
        request_runner,
        async_scheduling,
        window_blocks=2,
        blocks_per_chunk=3,
        retention_interval=None,
    )
    check = _fail_if_chunk_skipped(runner, "0", 0, offered)

    prompt = [*range(1, 9), 1000, 1001, 1002]
    runner.new_request(token_ids=prompt)
    runner.run(decoded_tokens=[7], post_step_fn=check)
    runner.new_request(token_ids=[*range(1, 9), 2000])
    runner.run(
        decoded_tokens=[7, 7, EOS_TOKEN_ID],
        expected_stored=(0, 1, 2),
        post_step_fn=check,
    )

    runner.scheduler.reset_prefix_cache()
    runner.new_request(token_ids=[*prompt, 7, 9])
    runner.run(decoded_tokens=[EOS_TOKEN_ID], expected_loaded=(1, 2))
