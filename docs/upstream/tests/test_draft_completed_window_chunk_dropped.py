# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
from itertools import chain

import pytest
import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID, create_vllm_config
from vllm.config import SpeculativeConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import OffloadKey, get_offload_group_idx
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput

pytestmark = pytest.mark.cpu_test

SWA_GROUP = 1
SWA_BLOCK_SIZE = 2


def _step(
    runner: RequestRunner, num_drafts: int, eos_at: dict[str, int]
) -> list[tuple[int, str, list[OffloadKey], bool, list[str]]]:
    """One synchronous engine step in which the target model accepts every
    scheduled draft, then the drafter proposes ``num_drafts`` tokens per
    request (RequestRunner's own model runner output samples one token and
    no drafts). A request samples EOS once it reaches ``eos_at`` tokens.
    Returns the step's store jobs as (job id, request, chunk keys, flushed
    before this step's forward pass, other requests holding a source block)."""
    scheduler = runner.scheduler
    scheduler_output = scheduler.schedule()
    meta = scheduler_output.kv_connector_metadata
    holders = {
        req_id: set(
            chain.from_iterable(scheduler.kv_cache_manager.get_block_ids(req_id))
        )
        for req_id in scheduler_output.num_scheduled_tokens
    }
    stores = []
    for job_id, job in meta.store_jobs.items():
        src_block_ids = set(job.src_spec.block_ids.tolist()) - {0}
        held_by = [
            req_id
            for req_id, block_ids in holders.items()
            if req_id != job.req_id and src_block_ids & block_ids
        ]
        flushed = job_id in meta.jobs_to_flush
        stores.append((job_id, job.req_id, job.dst_spec.offload_keys, flushed, held_by))

    worker = runner.worker_connector
    worker.handle_preemptions(meta)
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(runner._dummy_ctx)
    runner.offloading_spec.complete_transfers()
    worker.wait_for_save()
    results = worker.get_transfer_results(scheduler_output.finished_req_ids)
    worker_meta = worker.build_connector_worker_meta() or OffloadingWorkerMetadata()
    worker.clear_connector_metadata()

    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        tokens = [*scheduler_output.scheduled_spec_decode_tokens.get(req_id, ()), 1]
        if scheduler.requests[req_id].num_tokens + len(tokens) >= eos_at[req_id]:
            tokens[-1] = EOS_TOKEN_ID
        sampled.append(tokens)
    scheduler.update_from_output(
        scheduler_output,
        ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=KVConnectorOutput(
                finished_sending=results.finished_sending,
                finished_recving=results.finished_recving,
                kv_connector_worker_meta=worker_meta,
            ),
        ),
    )
    running = [req_id for req_id in req_ids if req_id in scheduler.requests]
    scheduler.update_draft_token_ids(
        DraftTokenIds(running, [[2] * num_drafts for _ in running])
    )
    return stores


def _speculative_config(mtp: bool) -> SpeculativeConfig:
    """Two draft tokens a step: ngram, or MTP with its drafter KV in the
    sliding-window group and vLLM's default lookahead block hashes."""
    spec = SpeculativeConfig(model="ngram", num_speculative_tokens=2)
    if mtp:
        spec.method = "mtp"
        spec.draft_model_config = create_vllm_config(
            hf_overrides={"n_predict": 2}
        ).model_config
    return spec


@pytest.mark.parametrize(
    "num_drafts,mtp",
    [(0, False), (2, False), (2, True)],
    ids=["no-drafts", "ngram", "mtp-lookahead-hashes"],
)
def test_window_chunk_completed_by_accepted_drafts_is_offloaded(
    request_runner, num_drafts: int, mtp: bool
):
    """A sliding-window chunk whose last token is an accepted draft is offered
    one step late, when its key exists, and by then the window has freed its
    block and handed it to another request: the chunk is never offloaded.

    Hybrid sliding-window model (e.g. Gemma 3, gpt-oss) with speculative
    decoding (ngram, EAGLE/MTP), synchronous scheduling, a full GPU pool.

    Full attention in 4-token blocks, a one-block window of 2-token blocks,
    blocks_per_chunk=1. Step 1 prefills r0 (2 tokens). Step 2 computes
    token 2 and the drafts at 3 and 4, all accepted: window chunk 1 (tokens
    2-3), which a hit ending at token 4 reads, is complete, but its key needs
    token 3, which is not among r0's tokens until the step's output. Step 3
    computes from token 5, so the window frees chunk 1's block, and the
    8-block pool hands it to r1 in the same step. Without drafts, step 3
    computes token 3 itself and the chunk is stored then. With MTP under
    lookahead block hashes, r0 has a 3-token prompt: step 2 computes token 3
    itself, but the chunk's key also covers token 4, a draft.
    """
    spec_kwargs = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)
    runner = request_runner(
        block_size=SWA_BLOCK_SIZE,
        num_gpu_blocks=8,
        async_scheduling=False,
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=4, **spec_kwargs)),
            KVCacheGroupSpec(
                ["swa"],
                SlidingWindowSpec(
                    block_size=SWA_BLOCK_SIZE, sliding_window=2, **spec_kwargs
                ),
                is_eagle_group=mtp,
            ),
        ],
        speculative_config=_speculative_config(mtp),
    )
    # key -> (request, group, chunk end token)
    chunks: dict[OffloadKey, tuple[str, int, int | None]] = {}

    def prepare_store(keys, req_context):
        for key in keys:
            chunks[key] = (
                req_context.req_id,
                get_offload_group_idx(key),
                req_context.get_offload_key_position(key),
            )
        return generate_store_output(keys)

    runner.manager.prepare_store.side_effect = prepare_store

    assert runner.connector_scheduler.use_lookahead_block_hashes == mtp
    eos_at = {"r0": 9, "r1": 6}
    runner.new_request([10, 11, 12] if mtp else [10, 11], req_id="r0")
    stores = _step(runner, num_drafts, eos_at)
    stores += _step(runner, num_drafts, eos_at)
    r0_window_blocks = runner.scheduler.kv_cache_manager.get_block_ids("r0")[1]
    runner.new_request([100, 101, 102, 103], req_id="r1")
    while runner.scheduler.requests or runner.connector_scheduler._jobs:
        stores += _step(runner, num_drafts, eos_at)

    r0_window_chunks = {
        end: (job_id, flushed, held_by)
        for job_id, req_id, keys, flushed, held_by in stores
        for key in keys
        for owner, group, end in [chunks[key]]
        if owner == "r0" and group == SWA_GROUP
    }
    block_id = r0_window_blocks[1]
    assert 4 in r0_window_chunks, (
        "request r0's sliding-window chunk 1 (tokens 2-3, GPU block "
        f"{block_id} at window position 1), which a hit ending at token 4 "
        "reads, was never offered to the CPU tier: its key needs a token that "
        "was still a draft when step 2 built its store, and step 3 freed the "
        "block and handed it on before building its own. r0's "
        "stored sliding-window chunks end at tokens "
        f"{sorted(r0_window_chunks)}"
    )
    job_id, flushed, held_by = r0_window_chunks[4]
    assert flushed or not held_by, (
        f"store job {job_id} copies r0's sliding-window chunk 1 from GPU "
        f"blocks that {held_by} got in the same step, without a flush before "
        "the forward pass that overwrites them"
    )
