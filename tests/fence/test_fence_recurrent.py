"""Partial-tail and aligned-boundary stores (Mamba "align" groups): fenced at creation.

These stores read copy-on-write hand-off blocks that belong to no request's table,
so they are fenced when created (A4, A5) and leave the fence when they complete.
The harness's engine has no Mamba model runner, so this is the unit layer (fence
brief §13): the real ``OffloadingConnectorScheduler`` over a full-attention plus
Mamba "align" layout, fed scheduler outputs that carry boundary-state hand-offs.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fence_harness import FenceOffloadingSpec, vllm_config
from fence_oracle import FenceViolation, check_state
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched import output as sched_output
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

BLOCK = 16

# How a step's scheduler output hands the connector a recurrent group's boundary
# state, per release:
# - vLLM 0.30.0 on: ``kv_connector_block_state``, a ``KVConnectorBlockState`` with
#   ``req_ids`` and ``resolve_block_ids`` beside ``boundary_state_offloads``;
# - vLLM 0.29.0: the same class with a ``block_ids`` dict in place of those two;
# - vLLM 0.28.0: no such class; ``partial_tail_offloads`` carries the hand-offs of
#   partial tails only (mid-block boundaries), and a hand-off on a block boundary has
#   no store at all: ``_build_aligned_boundary_store_jobs`` came in 0.29.0.
BLOCK_STATE = getattr(sched_output, "KVConnectorBlockState", None)
HAS_BOUNDARY_STORES = hasattr(OffloadingConnectorScheduler, "_build_aligned_boundary_store_jobs")


def _hand_offs(handoffs: dict[str, list[tuple[int, int, int]]]) -> SchedulerOutput:
    output = SchedulerOutput.make_empty()
    if BLOCK_STATE is None:  # 0.28.0
        output.partial_tail_offloads = handoffs  # type: ignore[attr-defined]
        return output
    fields = {f.name for f in dataclasses.fields(BLOCK_STATE)}
    ids: dict[str, object] = (
        {"req_ids": set(), "resolve_block_ids": {}.__getitem__}
        if "resolve_block_ids" in fields
        else {"block_ids": {}}  # 0.29.0
    )
    output.kv_connector_block_state = BLOCK_STATE(boundary_state_offloads=handoffs, **ids)
    return output


class Recurrent:
    """The connector's scheduler side, one request, and a step counter."""

    def __init__(self) -> None:
        config = vllm_config(block_size=BLOCK, num_gpu_blocks=64)
        config.cache_config.prefix_match_unit = 4  # fine-grained hits: partial tails
        kv_cache_config = KVCacheConfig(
            num_blocks=64,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["full"],
                    FullAttentionSpec(
                        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32
                    ),
                ),
                KVCacheGroupSpec(
                    ["mamba"],
                    MambaSpec(
                        block_size=BLOCK,
                        shapes=((1, 1),),
                        dtypes=(torch.float32,),
                        mamba_cache_mode="align",
                    ),
                ),
            ],
        )
        spec = FenceOffloadingSpec(build_offloading_config(config, kv_cache_config))
        self.sched = OffloadingConnectorScheduler(spec, config, kv_cache_config)
        assert self.sched.config.supports_partial_tail
        init_none_hash(sha256)
        request = Request(
            request_id="req",
            prompt_token_ids=list(range(30)),
            sampling_params=SamplingParams(max_tokens=4, ignore_eos=True),
            pooling_params=None,
            block_hasher=get_request_block_hasher(4, sha256),
        )
        self.sched.on_new_request(request)
        state = self.sched._req_status["req"]
        state.group_states[0].block_ids[:] = [11, 12]  # full attention: its table
        state.group_states[1].block_ids[:] = [0, 21]  # Mamba: only the running state
        self.step = 0

    def check(self) -> None:
        self.step += 1
        found = check_state(self.sched, self.step)
        if found:
            raise FenceViolation(found)

    def hand_off(self, block_id: int, tokens: int) -> int:
        """A step whose scheduler hands off the Mamba state at ``tokens`` in
        ``block_id``; returns the store job it creates."""
        output = _hand_offs({"req": [(1, block_id, tokens)]})
        meta = self.sched.build_connector_meta(output)
        self.check()
        (job,) = meta.store_jobs
        return job

    def complete(self, job: int) -> None:
        meta = OffloadingWorkerMetadata(completed_jobs={job: 1})
        self.sched.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=meta))
        self.check()


def test_a_partial_tail_store_stays_fenced_until_it_completes() -> None:
    """A partial-tail store alone (every release since 0.28.0 has them): it fences
    the attention block and the copy-on-write block it reads, and its completion
    removes both (M-A7)."""
    r = Recurrent()
    tail = r.hand_off(99, 28)
    assert r.sched._block_id_to_pending_jobs == {12: {tail}, 99: {tail}}
    assert r.sched._jobs[tail].is_store
    r.complete(tail)
    assert r.sched._block_id_to_pending_jobs == {}
    assert not r.sched._jobs


@pytest.mark.skipif(
    not HAS_BOUNDARY_STORES,
    reason="this vLLM has no aligned-boundary stores (_build_aligned_boundary_store_jobs, "
    "vLLM 0.29.0 on): a hand-off on a block boundary stores nothing",
)
@pytest.mark.parametrize("first", ["partial tail", "boundary"])
def test_hand_off_stores_stay_fenced_until_they_complete(first: str) -> None:
    """Each hand-off store fences exactly its source blocks, and its completion
    removes exactly those, whichever completes first (M-A7; a store registered as a
    load, or with its source list dropped, leaves entries behind)."""
    r = Recurrent()
    tail = r.hand_off(99, 28)  # mid-block: a partial tail (attention block 12, CoW 99)
    boundary = r.hand_off(98, 16)  # on a block boundary: the aligned-boundary store
    assert r.sched._block_id_to_pending_jobs == {12: {tail}, 99: {tail}, 98: {boundary}}
    assert r.sched._jobs[tail].is_store
    assert r.sched._jobs[boundary].is_store

    order = [tail, boundary] if first == "partial tail" else [boundary, tail]
    r.complete(order[0])
    remaining = {98: {boundary}} if order[0] == tail else {12: {tail}, 99: {tail}}
    assert r.sched._block_id_to_pending_jobs == remaining
    r.complete(order[1])
    assert r.sched._block_id_to_pending_jobs == {}
    assert not r.sched._jobs
