# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
from collections.abc import Iterator
from unittest.mock import MagicMock

import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    MockLoadStoreSpec,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import (
    EOS_TOKEN_ID,
    create_model_runner_output,
    create_vllm_config,
)
from vllm import SamplingParams
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    TransferJob,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LookupResult, OffloadKey
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

pytestmark = pytest.mark.cpu_test

BLOCKS_PER_CHUNK = 2

# A CPU slot: (chunk key, block offset inside the chunk).
Slot = tuple[OffloadKey, int]


def _make_scheduler(
    kv_cache_groups: list[KVCacheGroupSpec], retention_interval: int | None
) -> Scheduler:
    """A scheduler with the OffloadingConnector (MockOffloadingSpec) over
    groups of different block sizes. RequestRunner asserts one block size
    when blocks_per_chunk > 1, so this test builds the layout itself."""
    vllm_config = create_vllm_config(
        block_size=min(g.kv_cache_spec.block_size for g in kv_cache_groups),
        max_num_batched_tokens=1000,
        disable_hybrid_kv_cache_manager=False,
    )
    vllm_config.cache_config.prefix_cache_retention_interval = retention_interval
    vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "MockOffloadingSpec",
            "spec_module_path": "tests.v1.kv_connector.unit.offloading_connector.utils",  # noqa: E501
            "blocks_per_chunk": BLOCKS_PER_CHUNK,
            "offload_prompt_only": False,
        },
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=40, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups
    )
    vllm_config.cache_config.num_gpu_blocks = 40
    block_size, hash_block_size = resolve_kv_cache_block_sizes(
        kv_cache_config, vllm_config
    )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        hash_block_size=hash_block_size,
    )


def _slots(job: TransferJob) -> Iterator[tuple[int, Slot, int, int]]:
    """Yield (group, CPU slot, GPU block id, block index in the request) for
    each block a transfer moves. Keys and GPU blocks come group after group,
    and a group's first block sits at block_indices[g] % BLOCKS_PER_CHUNK in
    its first chunk."""
    if isinstance(job.src_spec, GPULoadStoreSpec):
        gpu_spec, cpu_spec = job.src_spec, job.dst_spec
    else:
        gpu_spec, cpu_spec = job.dst_spec, job.src_spec
    assert isinstance(gpu_spec, GPULoadStoreSpec)
    assert isinstance(cpu_spec, MockLoadStoreSpec)
    assert gpu_spec.block_indices is not None
    block_ids = gpu_spec.block_ids.tolist()
    first_key = first_block = 0
    for group, (size, start) in enumerate(
        zip(gpu_spec.group_sizes, gpu_spec.block_indices)
    ):
        offsets = range(start % BLOCKS_PER_CHUNK, start % BLOCKS_PER_CHUNK + size)
        for i, offset in enumerate(offsets):
            key = cpu_spec.offload_keys[first_key + offset // BLOCKS_PER_CHUNK]
            slot = (key, offset % BLOCKS_PER_CHUNK)
            yield group, slot, block_ids[first_block + i], start + i
        first_key += -(-offsets.stop // BLOCKS_PER_CHUNK) if size else 0
        first_block += size


def _run_to_eos(scheduler: Scheduler) -> list[TransferJob]:
    """Step the scheduler alone (no worker: transfers stay in flight), every
    request sampling EOS at once, and return the transfers it issued."""
    jobs: list[TransferJob] = []
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


@pytest.mark.parametrize("retention_interval", [None, 0])
def test_hit_cut_by_finer_window_chunk_does_not_load_null_placeholder(
    retention_interval: int | None,
):
    """A CPU-tier hit that a sliding-window group with smaller chunks cuts off
    the full-attention chunk boundary must not load a null placeholder.

    Hybrid models whose sliding-window blocks are smaller than their
    full-attention blocks (Gemma 4's 32/16 layout), offloaded with
    blocks_per_chunk > 1. Here full attention has 4-token blocks (8-token
    chunks, the store's alignment_tokens), the sliding window 2-token blocks
    (4-token chunks) and a 6-token window. Request B gets its first 8 tokens
    without computing them (a GPU prefix hit here; in production also a
    MultiConnector's other connector), so its window block 0 is null. At
    8-token boundaries no window reads that block, so B's store offers window
    chunk 0 = [null, block 1]. A (first 12 tokens not computed) leaves its
    window chunk 1 out of the tier. Request C shares A's first 8 tokens and
    B's first 4: full attention hits 8 tokens, the window group's chunk 1
    misses and its chunk 0 cuts the hit to 4 tokens, whose window reads B's
    placeholder. Both retentions: the default (0) and dense (None).
    """
    sizes = (4, 2)  # tokens per block: full attention, sliding window
    spec_kwargs = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)
    scheduler = _make_scheduler(
        [
            KVCacheGroupSpec(
                ["full"], FullAttentionSpec(block_size=sizes[0], **spec_kwargs)
            ),
            KVCacheGroupSpec(
                ["swa"],
                SlidingWindowSpec(block_size=sizes[1], sliding_window=6, **spec_kwargs),
            ),
        ],
        retention_interval,
    )
    assert isinstance(scheduler.connector, OffloadingConnector)
    manager = scheduler.connector.connector_scheduler.manager
    assert isinstance(manager, MagicMock)
    stored_keys: set[OffloadKey] = set()

    def store(keys, req_context):
        stored_keys.update(keys)
        return generate_store_output(keys)

    manager.lookup.side_effect = lambda key, req_context: (
        LookupResult.HIT if key in stored_keys else LookupResult.MISS
    )
    init_none_hash(sha256)
    block_hasher = get_request_block_hasher(sizes[1], sha256)

    def add_request(req_id: str, token_ids: list[int]) -> None:
        params = SamplingParams(max_tokens=10)
        params.update_from_generation_config({}, EOS_TOKEN_ID)
        scheduler.add_request(
            Request(req_id, token_ids, params, None, block_hasher=block_hasher)
        )

    prompt_a = list(range(1, 9)) + list(range(1000, 1005))
    prompt_b = [1, 2, 3, 4] + list(range(1005, 1010))

    # Warm only the GPU prefix cache with both prompts.
    manager.prepare_store.side_effect = lambda keys, req_context: generate_store_output(
        []
    )
    add_request("warm-A", prompt_a)
    add_request("warm-B", prompt_b)
    _run_to_eos(scheduler)

    # A hits 12 tokens and B 8 tokens on the GPU: their window blocks before
    # the window are null (A: 0-2, B: 0).
    manager.prepare_store.side_effect = store
    add_request("A", prompt_a)
    add_request("B", prompt_b)
    written: dict[Slot, tuple[str, int]] = {}
    for job in _run_to_eos(scheduler):
        for _, slot, block_id, _ in _slots(job):
            written[slot] = (job.req_id, block_id)

    # C's tokens 0-7 are A's, tokens 0-3 B's; the GPU cache no longer has them.
    assert scheduler.reset_prefix_cache()
    add_request("C", list(range(1, 9)) + [1010])
    for job in _run_to_eos(scheduler):
        if isinstance(job.src_spec, GPULoadStoreSpec):
            continue
        for group, slot, block_id, index in _slots(job):
            assert slot in written and written[slot][1] != 0, (
                f"request {job.req_id} loads its "
                f"{('full-attention', 'sliding-window')[group]} block {index} "
                f"(GPU block {block_id}, tokens {index * sizes[group]}-"
                f"{(index + 1) * sizes[group] - 1}) from CPU chunk "
                f"{index // BLOCKS_PER_CHUNK}, offset {slot[1]}, which "
                + (
                    f"{written[slot][0]}'s store copied from the null block "
                    "(GPU block 0): zeros instead of KV"
                    if slot in written
                    else "no store wrote"
                )
            )
