# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A connector cache reset must not re-offload sliding-window blocks that the
KV-cache manager has already freed and handed out again."""

import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    MockLoadStoreSpec,
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import create_model_runner_output
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
)
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_offload.base import GPULoadStoreSpec

pytestmark = pytest.mark.cpu_test


def _store_sources(runner: RequestRunner, req_id: str, job) -> list[tuple[int, int]]:
    """(block index, GPU block id) of each source block of a store job of a
    single-group request, found from the job's offload keys."""
    assert isinstance(job.src_spec, GPULoadStoreSpec)
    assert isinstance(job.dst_spec, MockLoadStoreSpec)
    [group_state] = runner.connector_scheduler._req_status[req_id].group_states
    chunks = sorted(
        group_state.offload_keys.index(key) for key in job.dst_spec.offload_keys
    )
    indices = [
        chunk * runner.blocks_per_chunk + i
        for chunk in chunks
        for i in range(runner.blocks_per_chunk)
    ]
    return list(zip(indices, job.src_spec.block_ids.tolist()))


# A pool of 3 (4) usable blocks, so that blocks freed by the window are
# handed back to the request within num_steps steps.
@pytest.mark.parametrize(
    "blocks_per_chunk, num_gpu_blocks, prompt_len, num_steps",
    [(1, 4, 8, 6), (3, 5, 16, 4)],
)
def test_reset_cache_does_not_store_reused_sliding_window_block(
    request_runner,
    blocks_per_chunk: int,
    num_gpu_blocks: int,
    prompt_len: int,
    num_steps: int,
):
    """Sliding-window models (Gemma 3/4, gpt-oss) under KV offloading, with
    `reset_prefix_cache(reset_connector=True)` called while a request runs.

    The request decodes past its window in a tight pool: the KV-cache manager
    frees an early block that left the window and hands it back to the same
    request for a later position. The connector's reset rewinds
    next_stored_chunk_idx to 0, so the next step re-offloads the early
    positions from the block ids the connector recorded for them. Each source
    block of a store must still back the position it is stored for.
    """
    block_size = 4
    runner = request_runner(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        async_scheduling=False,
        blocks_per_chunk=blocks_per_chunk,
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer0"],
                SlidingWindowSpec(
                    block_size=block_size,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=2 * block_size,
                ),
            )
        ],
        retention_interval=0,
    )
    runner.manager.prepare_store.side_effect = lambda keys, req_context: (
        generate_store_output(keys)
    )
    runner.new_request(token_ids=list(range(1, prompt_len + 1)))
    req_id = str(runner.req_id)
    scheduler = runner.scheduler
    for _ in range(num_steps):
        output = scheduler.schedule()
        scheduler.update_from_output(
            output, create_model_runner_output(scheduler.running, token_id=0)
        )

    # The connector still records an early block that now backs a later index.
    recorded = runner.connector_scheduler._req_status[req_id].group_states[0]
    [block_ids] = scheduler.kv_cache_manager.get_block_ids(req_id)
    assert any(
        block_id and block_id in block_ids[index + 1 :]
        for index, block_id in enumerate(recorded.block_ids)
    ), f"precondition: {recorded.block_ids=} {block_ids=}"

    # Fails for the GPU prefix cache (a request is running), still resets
    # the connector.
    scheduler.reset_prefix_cache(reset_connector=True)

    meta = scheduler.schedule().kv_connector_metadata
    assert isinstance(meta, OffloadingConnectorMetadata)
    [block_ids] = scheduler.kv_cache_manager.get_block_ids(req_id)
    for job_id, job in meta.store_jobs.items():
        for index, block_id in _store_sources(runner, req_id, job):
            # A freed block keeps its KV until it is reused (the fence flushes
            # the store first); one that backs another position does not.
            if block_id == 0 or block_id not in block_ids[index + 1 :]:
                continue
            raise AssertionError(
                f"request {req_id}: store job {job_id} reads GPU block "
                f"{block_id} for sliding-window block index {index}, but the "
                f"KV-cache manager freed that index (it holds block "
                f"{block_ids[index]} there) and block {block_id} now backs "
                f"block index {block_ids.index(block_id)}: the job stores that "
                f"position's KV under index {index}'s key"
            )
