# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LookupResult, OffloadKey

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 2
BLOCKS_PER_CHUNK = 2
GROUP_NAMES = ("full-attention", "sliding-window")


def _null_filled_slot_reads(
    runner: RequestRunner, store_reqs: list[str], load_reqs: list[str]
) -> list[str]:
    """Replay the mock worker's transfers in job order and describe every load
    that fills a GPU block from a CPU slot (chunk key, block offset in the
    chunk) whose store copied the null block (GPU block 0) into it.
    ``store_reqs`` / ``load_reqs``: the requests of the stores / loads, in
    job order."""
    # slot -> "job N, request R" of the store that filled it from the null block
    null_filled: dict[tuple[OffloadKey, int], str] = {}
    bad_reads: list[str] = []
    reqs = {True: iter(store_reqs), False: iter(load_reqs)}
    transfers = runner.offloading_spec.handler.transfer_specs
    for job_id, (src_spec, dst_spec) in sorted(transfers.items()):
        is_store = isinstance(src_spec, GPULoadStoreSpec)
        req_id = next(reqs[is_store])
        gpu_spec = src_spec if is_store else dst_spec
        keys = iter((dst_spec if is_store else src_spec).offload_keys)
        block_ids = gpu_spec.block_ids.tolist()
        pos = 0
        for group_idx, (size, first) in enumerate(
            zip(gpu_spec.group_sizes, gpu_spec.block_indices)
        ):
            for logical_idx in range(first, first + size):
                if logical_idx == first or logical_idx % BLOCKS_PER_CHUNK == 0:
                    key = next(keys)
                slot = (key, logical_idx % BLOCKS_PER_CHUNK)
                block_id = block_ids[pos]
                pos += 1
                if is_store:
                    if block_id == 0:
                        null_filled[slot] = f"job {job_id}, request {req_id}"
                    else:
                        null_filled.pop(slot, None)
                elif slot in null_filled:
                    first_token = logical_idx * BLOCK_SIZE
                    bad_reads.append(
                        f"request {req_id} (load job {job_id}) fills its "
                        f"{GROUP_NAMES[group_idx]} block {logical_idx} (GPU "
                        f"block {block_id}, tokens {first_token}-"
                        f"{first_token + BLOCK_SIZE - 1}) from slot {slot[1]} "
                        f"of a chunk whose store ({null_filled[slot]}) "
                        "copied the null block there: it loads zeros, not "
                        "the KV of those tokens"
                    )
    return bad_reads


def test_eagle_popped_hit_loads_only_stored_blocks(request_runner):
    """An EAGLE lookup pops a whole chunk, but the store's reachability mask
    allows for a one-block EAGLE peek, so a chunk holding a null block the
    popped hit's window reads is stored and later loaded.

    Hybrid model (full attention + sliding window, e.g. Gemma 3) whose EAGLE
    drafter KV is in the sliding-window group, legacy block hashes
    (disable_lookahead_block_hashes, or a MultiConnector peer without
    lookahead support), blocks_per_chunk=2 and the default
    prefix_cache_retention_interval=0.

    a hits p's first 8 tokens in the GPU prefix cache, so its sliding-window
    block 0 is null. a's store keeps chunk 0 (blocks 0-1) with block 0 left
    as a null placeholder: the mask only keeps the window before a's replay
    boundary (token 8) plus one peek block. b shares those 8 tokens, its
    lookup hits chunks 0-1 and pops chunk 1, so b's hit ends at token 4 and
    its window reads block 0 from the placeholder slot.
    """
    spec_kwargs = dict(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    runner = request_runner(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=64,
        async_scheduling=False,
        blocks_per_chunk=BLOCKS_PER_CHUNK,
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], FullAttentionSpec(**spec_kwargs)),
            KVCacheGroupSpec(
                ["swa"],
                SlidingWindowSpec(**spec_kwargs, sliding_window=6),
                is_eagle_group=True,
            ),
        ],
        retention_interval=0,
    )
    stored: set[OffloadKey] = set()
    store_reqs: list[str] = []
    load_reqs: list[str] = []

    def prepare_store(keys, req_context):
        if req_context.req_id == "p":
            return None  # the CPU tier is full while p runs
        stored.update(keys)
        store_reqs.append(req_context.req_id)
        return generate_store_output(keys)

    def prepare_load(keys, req_context):
        load_reqs.append(req_context.req_id)
        return mock_prepare_load(keys, req_context)

    mock_prepare_load = runner.manager.prepare_load
    runner.manager.prepare_load = prepare_load
    runner.manager.prepare_store.side_effect = prepare_store
    runner.manager.lookup.side_effect = lambda key, req_context: (
        LookupResult.HIT if key in stored else LookupResult.MISS
    )

    shared = list(range(1, 9))
    runner.new_request(shared + [100], req_id="p")
    runner._run(decoded_tokens=[EOS_TOKEN_ID], complete_transfers=True)
    runner.new_request(shared + [200, 201, 202], req_id="a")
    runner._run(decoded_tokens=[7, 7, EOS_TOKEN_ID], complete_transfers=True)
    assert runner.scheduler.reset_prefix_cache()
    runner.new_request(shared + [300, 301, 302, 303], req_id="b")
    runner._run(decoded_tokens=[EOS_TOKEN_ID], complete_transfers=True)

    bad_reads = _null_filled_slot_reads(runner, store_reqs, load_reqs)
    assert not bad_reads, "\n".join(bad_reads)
