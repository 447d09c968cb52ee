# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
from collections.abc import Iterator

import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    MockLoadStoreSpec,
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID, create_model_runner_output
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    TransferJob,
)
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LookupResult, OffloadKey

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 4
BLOCKS_PER_CHUNK = 2

# A CPU slot: (chunk key, block offset inside the chunk).
Slot = tuple[OffloadKey, int]


def _slots(job: TransferJob) -> Iterator[tuple[Slot, int, int]]:
    """Yield (CPU slot, GPU block id, block index in the request) for each
    block a transfer moves. Keys and GPU blocks come group after group, and a
    group's first block sits at block_indices[g] % BLOCKS_PER_CHUNK in its
    first chunk."""
    if isinstance(job.src_spec, GPULoadStoreSpec):
        gpu_spec, cpu_spec = job.src_spec, job.dst_spec
    else:
        gpu_spec, cpu_spec = job.dst_spec, job.src_spec
    assert isinstance(gpu_spec, GPULoadStoreSpec)
    assert isinstance(cpu_spec, MockLoadStoreSpec)
    assert gpu_spec.block_indices is not None
    block_ids = gpu_spec.block_ids.tolist()
    first_key = first_block = 0
    for size, start in zip(gpu_spec.group_sizes, gpu_spec.block_indices):
        offsets = range(start % BLOCKS_PER_CHUNK, start % BLOCKS_PER_CHUNK + size)
        for i, offset in enumerate(offsets):
            key = cpu_spec.offload_keys[first_key + offset // BLOCKS_PER_CHUNK]
            yield (
                (key, offset % BLOCKS_PER_CHUNK),
                block_ids[first_block + i],
                start + i,
            )
        first_key += -(-offsets.stop // BLOCKS_PER_CHUNK) if size else 0
        first_block += size


def _run_to_eos(runner: RequestRunner) -> list[TransferJob]:
    """Step the scheduler alone (no worker: transfers stay in flight), every
    request sampling EOS at once, and return the transfers it issued."""
    jobs: list[TransferJob] = []
    scheduler = runner.scheduler
    while scheduler.requests or scheduler.finished_req_ids:
        output = scheduler.schedule()
        meta = output.kv_connector_metadata
        jobs += [*meta.store_jobs.values(), *meta.load_jobs.values()]
        if not scheduler.running:
            break  # only a request waiting for its load is left
        scheduler.update_from_output(
            output,
            create_model_runner_output(scheduler.running, token_id=EOS_TOKEN_ID),
        )
    return jobs


@pytest.mark.parametrize("retention_interval", [0, 16, None])
def test_shorter_hit_does_not_load_null_placeholder(
    request_runner, retention_interval: int | None
):
    """A CPU-tier hit must never load a slot its chunk's store copied from the
    null block.

    Sliding-window models (Gemma 3/4, gpt-oss) offloaded with
    blocks_per_chunk > 1 under the default prefix_cache_retention_interval=0
    (or a periodic one). Request A gets its first 16 tokens without computing
    them (here a GPU prefix hit; in production also a MultiConnector's other
    connector), so its sliding-window block 0 is the null block. Sparse
    retention keeps only the window before A's replay boundary (token 16,
    blocks 1-3), so A's store offers chunk 0 = [null, block 1] with block 0 as
    a zeroed placeholder. Request B shares only A's first 12 tokens: its CPU
    hit ends at token 8, and its window before token 8 reads block 0 from that
    placeholder. Dense retention (None) keeps chunk 0 out of the tier.
    """
    runner = request_runner(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=40,
        async_scheduling=False,
        blocks_per_chunk=BLOCKS_PER_CHUNK,
        retention_interval=retention_interval,
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["swa"],
                SlidingWindowSpec(
                    block_size=BLOCK_SIZE,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=3 * BLOCK_SIZE,
                ),
            )
        ],
    )
    stored_keys: set[OffloadKey] = set()

    def store(keys, req_context):
        stored_keys.update(keys)
        return generate_store_output(keys)

    runner.manager.lookup.side_effect = lambda key, req_context: (
        LookupResult.HIT if key in stored_keys else LookupResult.MISS
    )
    prompt = list(range(100, 112)) + list(range(1000, 1005))

    # Warm only the GPU prefix cache with the 17-token prompt.
    runner.manager.prepare_store.side_effect = lambda keys, req_context: (
        generate_store_output([])
    )
    runner.new_request(token_ids=prompt)
    runner.run(decoded_tokens=[EOS_TOKEN_ID])

    # A hits 16 tokens on the GPU, so its sliding-window block 0 is null.
    runner.manager.prepare_store.side_effect = store
    runner.new_request(token_ids=prompt, req_id="A")
    written: dict[Slot, int] = {}
    for job in _run_to_eos(runner):
        for slot, block_id, _ in _slots(job):
            written[slot] = block_id

    # B shares A's first 12 tokens; the GPU prefix cache no longer has them.
    assert runner.scheduler.reset_prefix_cache()
    runner.new_request(token_ids=prompt[:12], req_id="B")
    for job in _run_to_eos(runner):
        if isinstance(job.src_spec, GPULoadStoreSpec):
            continue
        for slot, block_id, index in _slots(job):
            assert slot in written and written[slot] != 0, (
                f"request {job.req_id} loads its sliding-window block {index} "
                f"(GPU block {block_id}) from CPU chunk {index // BLOCKS_PER_CHUNK}"
                f", offset {slot[1]}, which A's store "
                + (
                    "copied from the null block (GPU block 0): zeros instead "
                    "of the KV of tokens "
                    f"{index * BLOCK_SIZE}-{(index + 1) * BLOCK_SIZE - 1}"
                    if slot in written
                    else "never wrote"
                )
            )
