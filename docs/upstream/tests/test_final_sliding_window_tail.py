# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A finished request's final store may reconsider its final sliding-window
tail below next_stored_chunk_idx. It must not read block ids the KV-cache
manager has freed and handed out again since."""

from collections.abc import Callable

import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    MockLoadStoreSpec,
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID, create_vllm_config
from vllm import SamplingParams
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

pytestmark = pytest.mark.cpu_test

# r0 decodes past its prompt and finishes; r2 (r0's prompt and two more
# tokens) arrives meanwhile and waits for room.
PROMPT_R0 = list(range(1, 12))
PROMPT_R2 = list(range(1, 14))
OUTPUT_LEN_R0 = 5


def _hybrid_groups(swa_window: int) -> list[KVCacheGroupSpec]:
    """Full attention on 8-token blocks, sliding window on 4-token blocks."""
    kwargs = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)
    return [
        KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=8, **kwargs)),
        KVCacheGroupSpec(
            ["swa"],
            SlidingWindowSpec(block_size=4, sliding_window=swa_window, **kwargs),
        ),
    ]


def _make_scheduler(blocks_per_chunk: int, num_gpu_blocks: int) -> Scheduler:
    """RequestRunner refuses blocks_per_chunk > 1 with per-group block sizes:
    the same engine scheduler and MockOffloadingSpec, built directly."""
    vllm_config = create_vllm_config(
        block_size=4, max_num_batched_tokens=1000, disable_hybrid_kv_cache_manager=False
    )
    vllm_config.scheduler_config.async_scheduling = False
    vllm_config.cache_config.prefix_cache_retention_interval = None
    vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
    vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "MockOffloadingSpec",
            "spec_module_path": "tests.v1.kv_connector.unit.offloading_connector.utils",  # noqa: E501
            "blocks_per_chunk": blocks_per_chunk,
            "offload_prompt_only": False,
        },
    )
    vllm_config.num_hash_lookahead_tokens = (
        vllm_config._resolve_num_hash_lookahead_tokens()
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_gpu_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=_hybrid_groups(swa_window=4),
    )
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


def _run_until_final_store(
    scheduler: Scheduler, add_request: Callable[[str, list[int]], None]
) -> tuple[SchedulerOutput, list[tuple[list[int], ...]]]:
    """Step until the step that builds r0's final store. Returns its output and
    r0's block tables, one per step it ran."""
    connector_scheduler = scheduler.connector.connector_scheduler
    connector_scheduler.manager.prepare_store.side_effect = lambda keys, req_context: (
        generate_store_output(keys)
    )
    add_request("r0", PROMPT_R0)
    tables = []
    for step in range(20):
        if step == 2:
            add_request("r2", PROMPT_R2)
        output = scheduler.schedule()
        if "r0" in output.finished_req_ids:
            return output, tables
        tables.append(scheduler.kv_cache_manager.get_block_ids("r0"))
        running = scheduler.running
        sampled = [
            [EOS_TOKEN_ID]
            if req.request_id == "r0" and req.num_output_tokens == OUTPUT_LEN_R0 - 1
            else [0]
            for req in running
        ]
        scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=[req.request_id for req in running],
                sampled_token_ids=sampled,
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=None,
            ),
        )
    raise AssertionError("r0 did not finish")


def _store_sources(
    connector_scheduler: OffloadingConnectorScheduler, job
) -> list[tuple[int, int, int]]:
    """(group, block index, GPU block id) of each source block of a store job,
    found from the job's offload keys."""
    assert isinstance(job.src_spec, GPULoadStoreSpec)
    assert isinstance(job.dst_spec, MockLoadStoreSpec)
    blocks_per_chunk = connector_scheduler.config.blocks_per_chunk
    group_states = connector_scheduler._req_status[job.req_id].group_states
    block_ids = iter(job.src_spec.block_ids.tolist())
    sources = []
    for group, group_state in enumerate(group_states):
        offload_keys = group_state.offload_keys
        for chunk in sorted(
            offload_keys.index(key)
            for key in job.dst_spec.offload_keys
            if key in offload_keys
        ):
            for index in range(
                chunk * blocks_per_chunk, (chunk + 1) * blocks_per_chunk
            ):
                sources.append((group, index, next(block_ids)))
    return sources


def _assert_final_store_reads_own_blocks(
    scheduler: Scheduler,
    output: SchedulerOutput,
    final_table: tuple[list[int], ...],
) -> None:
    meta = output.kv_connector_metadata
    assert isinstance(meta, OffloadingConnectorMetadata)
    # Where the other requests hold each block after this step's schedule().
    holders = {
        block_id: (req_id, group, index)
        for req_id in scheduler.requests
        for group, block_ids in enumerate(
            scheduler.kv_cache_manager.get_block_ids(req_id)
        )
        for index, block_id in enumerate(block_ids)
        if block_id
    }
    for job_id, job in meta.store_jobs.items():
        if job.req_id != "r0":
            continue
        sources = _store_sources(scheduler.connector.connector_scheduler, job)
        for group, index, block_id in sources:
            if block_id == 0:
                continue
            where = f"r0's group {group} block index {index}"
            own = final_table[group]
            if block_id in own and own.index(block_id) != index:
                raise AssertionError(
                    f"final store job {job_id} reads GPU block {block_id} for "
                    f"{where}, but when r0 finished it held block {own[index]} "
                    f"there and block {block_id} at index {own.index(block_id)}: "
                    "the job stores that position's KV under this one's key"
                )
            holder = holders.get(block_id)
            if (
                holder
                and holder[1:] != (group, index)
                and job_id not in (meta.jobs_to_flush)
            ):
                raise AssertionError(
                    f"final store job {job_id} reads GPU block {block_id} for "
                    f"{where}, but this step handed the block to {holder[0]} "
                    f"(group {holder[1]} block index {holder[2]}) and the job "
                    f"is not in jobs_to_flush: {holder[0]}'s forward pass "
                    "overwrites the block before the store copies it"
                )


def test_final_swa_tail_not_stored_from_block_reused_in_same_step(request_runner):
    """Hybrid models whose full-attention block is larger than their
    sliding-window block (the Gemma 4 layout), with dense checkpoint retention
    (`prefix_cache_retention_interval=None`).

    While r0 decodes, its sliding-window block index 2 is skipped as
    unreachable and next_stored_chunk_idx moves past it. r0 finishes; the next
    schedule() frees its blocks and hands index 2's block to r2. r0's final
    store then reconsiders its final tail (reconsider_final_swa_tail) down to
    index 2. Stale ids are only zeroed from next_stored_chunk_idx on, and the
    re-allocation flush check ran before the job existed.
    """
    runner: RequestRunner = request_runner(
        block_size=4,
        num_gpu_blocks=8,
        async_scheduling=False,
        kv_cache_groups=_hybrid_groups(swa_window=4),
        retention_interval=None,
    )

    def add_request(req_id: str, token_ids: list[int]) -> None:
        runner.new_request(token_ids=token_ids, req_id=req_id)

    output, tables = _run_until_final_store(runner.scheduler, add_request)
    [_, r2_swa_blocks] = runner.scheduler.kv_cache_manager.get_block_ids("r2")
    assert set(tables[-1][1]) & set(r2_swa_blocks) - {0}, (
        "precondition: r2 gets one of r0's last sliding-window blocks"
    )
    _assert_final_store_reads_own_blocks(runner.scheduler, output, tables[-1])


def test_final_swa_tail_not_stored_from_block_reused_earlier():
    """The same layout with offload chunks of three sliding-window blocks
    (`blocks_per_chunk=3`). While r0 decodes, the window frees its
    sliding-window block index 0 and the pool hands that block back to r0 for
    index 3. The connector keeps the old id at index 0, below
    next_stored_chunk_idx, so it is never zeroed; r0's final store reconsiders
    chunk 0 and reads it.
    """
    scheduler = _make_scheduler(blocks_per_chunk=3, num_gpu_blocks=9)
    init_none_hash(sha256)
    block_hasher = get_request_block_hasher(
        4, sha256, scheduler.num_hash_lookahead_tokens
    )

    def add_request(req_id: str, token_ids: list[int]) -> None:
        sampling_params = SamplingParams(max_tokens=1000)
        sampling_params.update_from_generation_config({}, EOS_TOKEN_ID)
        scheduler.add_request(
            Request(
                request_id=req_id,
                prompt_token_ids=token_ids,
                sampling_params=sampling_params,
                pooling_params=None,
                block_hasher=block_hasher,
            )
        )

    output, tables = _run_until_final_store(scheduler, add_request)
    first, last = tables[0][1], tables[-1][1]
    assert any(
        block_id and block_id in last[index + 1 :]
        for index, block_id in enumerate(first)
    ), "precondition: a block r0 held gets back to it for a later index"
    _assert_final_store_reads_own_blocks(scheduler, output, tables[-1])
