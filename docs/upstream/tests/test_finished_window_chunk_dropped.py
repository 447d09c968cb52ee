# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A finished request's last sliding-window chunk must be offloaded even when
the step that builds its final store hands the freed block to another request."""

from collections.abc import Callable

import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_offload.base import OffloadKey

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 4


def _fail_if_final_chunk_dropped(
    runner: RequestRunner, req_id: str, offered: set[OffloadKey]
) -> Callable[[], None]:
    """A post_step_fn that fails once the connector drops request ``req_id``'s
    state without chunk 0 having been offered to the CPU tier."""
    seen: dict[str, list] = {}

    def check() -> None:
        req_status = runner.connector_scheduler._req_status.get(req_id)
        if req_status is not None:
            state = req_status.group_states[0]
            seen["keys"] = state.offload_keys[:1]
            seen["blocks"] = state.block_ids[:1]
            return
        if not seen.get("keys") or seen["keys"][0] in offered:
            return
        [block_id] = seen["blocks"]
        holders = {
            other: block_ids
            for other in runner.scheduler.requests
            for block_ids in runner.scheduler.kv_cache_manager.get_block_ids(other)
            if block_id in block_ids
        }
        raise AssertionError(
            f"request {req_id} finished and its final store dropped its "
            f"sliding-window chunk 0 (GPU block {block_id}, block offset 0) "
            f"without offering it to the CPU tier ({len(offered)} keys offered, "
            f"none of them this chunk's). The step that built that store handed "
            f"block {block_id} to {holders}, whose forward pass had not written "
            f"it yet: it still held request {req_id}'s KV."
        )

    return check


def test_finished_request_window_chunk_offloaded_when_block_is_reused(
    request_runner,
):
    """Async scheduling (the default), a sliding-window model (e.g. gpt-oss, Gemma
    3) and a busy GPU KV pool. Request 0 (a one-token prompt, max_tokens=4) fills
    GPU block 1; the async scheduler stops scheduling it once its last token is
    in flight, so chunk 0's key (its 4th token) only arrives at finish and the
    chunk is left to the final store, built in the next step. Request 1 (12
    prompt tokens) waits for the whole 3-block pool and is scheduled in that
    step with block 1 among its new blocks. Block 1 still holds request 0's KV,
    so the final store must offload it, flushed before request 1's forward pass
    (as full attention does)."""
    runner = request_runner(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=4,
        async_scheduling=True,
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["swa"],
                SlidingWindowSpec(
                    block_size=BLOCK_SIZE,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=BLOCK_SIZE,
                ),
            )
        ],
    )
    offered: set[OffloadKey] = set()

    def prepare_store(keys, req_context):
        # Only request 0's chunks are of interest here.
        if req_context.req_id != "0":
            return generate_store_output([])
        offered.update(keys)
        return generate_store_output(keys)

    runner.manager.prepare_store.side_effect = prepare_store

    runner.new_request(token_ids=[1000])
    # RequestRunner ends requests on EOS; this one ends on its length.
    runner.scheduler.requests["0"].max_tokens = 4
    runner.new_request(token_ids=list(range(2000, 2012)))
    runner.run(
        decoded_tokens=[7, 7, 7, 7, 7, EOS_TOKEN_ID],
        # Block 1, which RequestRunner names by its new owner's offset by then.
        expected_stored=(2,),
        expected_flushed=(2,),
        post_step_fn=_fail_if_final_chunk_dropped(runner, "0", offered),
    )
