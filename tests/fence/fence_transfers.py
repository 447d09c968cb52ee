"""The one fake part of the harness: the transfer worker, and the offloading spec that
hands it to the real OffloadingConnector (worker side) beside the CPU tier's real
manager (scheduler side).

:class:`FakeTransferWorker` moves no bytes: it records every transfer, copies block
tags through the engine's content model (:class:`fence_contents.Contents`) and
completes each transfer when the test says (a delay in steps, or held).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

if TYPE_CHECKING:
    from fence_harness import FenceEngine

# The CPU tier's capacity, in offload chunks: vLLM 0.30.0 on names it ``num_chunks``;
# vLLM 0.28.0-0.29.0 name the same count ``num_blocks`` (one CPU block per chunk).
_CPU_CAPACITY = (
    "num_chunks"
    if "num_chunks" in inspect.signature(CPUOffloadingManager.__init__).parameters
    else "num_blocks"
)

# A completion delay in engine steps after submission (0: completes in the step it is
# submitted, after that step's forward pass), or None: held until released.
Delay = int | None


@dataclass
class Transfer:
    job_id: int
    is_store: bool
    gpu: GPULoadStoreSpec
    cpu: CPULoadStoreSpec
    remaining: Delay


class FakeTransferWorker(OffloadingWorker):
    """Records transfers and completes them on the harness's schedule; copies tags only."""

    def __init__(self) -> None:
        self.engine: FenceEngine | None = None  # set by the engine once both exist
        self.in_flight: dict[int, Transfer] = {}
        self.done: list[TransferResult] = []
        self.submitted: dict[int, Transfer] = {}  # every transfer ever submitted
        self.flushed: set[int] = set()  # job ids passed to wait()
        self.order: list[tuple[str, int]] = []  # ("submit"|"wait", job id), in order
        self.kv_caches: CanonicalKVCaches | None = None  # the ones the spec was handed

    def _gpu_spec(self, spec: Any) -> GPULoadStoreSpec:
        """The GPU side of a transfer as block ids. vLLM 0.28.0-0.33.0 hand the worker
        the GPU spec itself; 0.34.0 hands it the blocks' device pointers (for each data
        reference of each group, the tensor's address plus the block id times its row
        stride), which this reads back from each group's first reference."""
        if isinstance(spec, GPULoadStoreSpec):
            return spec
        assert self.kv_caches is not None, "device pointers, but no KV caches registered"
        ids: list[int] = []
        offset = 0
        counts = zip(spec.group_block_counts, spec.group_data_ref_counts, strict=True)
        for group, (count, refs) in enumerate(counts):
            if count:
                ref = self.kv_caches.group_data_refs[group][0]
                tensor = self.kv_caches.tensors[ref.tensor_idx].tensor
                base, stride = tensor.data_ptr(), tensor.stride(0)
                ids += [(int(p) - base) // stride for p in spec.ptrs[offset : offset + count]]
            offset += count * refs
        groups, firsts = list(spec.group_block_counts), list(spec.block_indices)
        return GPULoadStoreSpec(ids, group_sizes=groups, block_indices=firsts)

    def _submit(self, job_id: int, is_store: bool, gpu: Any, cpu: Any) -> bool:
        assert self.engine is not None
        gpu = self._gpu_spec(gpu)
        assert isinstance(cpu, CPULoadStoreSpec)
        if job_id in self.submitted:
            raise AssertionError(f"job {job_id} submitted twice to the worker")
        transfer = Transfer(job_id, is_store, gpu, cpu, self.engine.delay_of(job_id))
        self.in_flight[job_id] = transfer
        self.submitted[job_id] = transfer
        self.order.append(("submit", job_id))
        if is_store:
            self.engine.contents.check_store_source(transfer, self.engine.step_no)
        else:
            self.engine.contents.apply_load(transfer, self.engine.step_no)
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self._submit(job_id, True, src_spec, dst_spec)

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        return self._submit(job_id, False, dst_spec, src_spec)

    def _complete(self, job_id: int) -> None:
        transfer = self.in_flight.pop(job_id)
        assert self.engine is not None
        if transfer.is_store:
            self.engine.contents.finish_store(transfer, self.engine.step_no)
        self.done.append(TransferResult(job_id=job_id, success=True))

    def wait(self, job_ids: set[int]) -> None:
        for job_id in sorted(job_ids):
            self.order.append(("wait", job_id))
            self.flushed.add(job_id)
            if job_id in self.in_flight:
                self._complete(job_id)
            elif job_id not in self.submitted:
                raise AssertionError(f"wait() on job {job_id}, which was never submitted")

    def tick(self) -> None:
        """One step of transfer progress: complete what is due."""
        for job_id, transfer in sorted(self.in_flight.items()):
            if transfer.remaining is None:
                continue
            if transfer.remaining <= 0:
                self._complete(job_id)
            else:
                transfer.remaining -= 1

    def release(self) -> None:
        """Let every held transfer (delay None) complete at the next tick."""
        for transfer in self.in_flight.values():
            transfer.remaining = 0

    def get_finished(self) -> list[TransferResult]:
        done, self.done = self.done, []
        return done


class ReplicaTransferWorker(OffloadingWorker):
    """The transfer worker of a non-writer rank (a replicated layout's rank > 0).

    Its blocks are byte-identical to rank 0's, which alone writes the shared copy:
    the connector acknowledges the rank's stores without handing them here, and
    the harness echoes rank 0's loads for it (:class:`fence_workers.SecondRank`).
    So it is only ever asked to wait, on jobs rank 0 runs."""

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        raise AssertionError(f"a non-writer rank submitted store job {job_id}")

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        raise AssertionError(f"load job {job_id} reached the non-writer rank's worker")

    def wait(self, job_ids: set[int]) -> None:
        return None

    def get_finished(self) -> list[TransferResult]:
        return []


class RequestLevelCPUManager(CPUOffloadingManager):
    """The CPU tier, asking for every chunk of every request (``REQUEST_LEVEL``), as a
    tier that needs a request's whole KV context does: prefix hits are stored too."""

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        super().on_new_request(req_context)
        return RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL)


class FenceOffloadingSpec(OffloadingSpec):
    """The real CPU tier's manager (scheduler side) and the fake worker (worker side)."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        self._manager: OffloadingManager | None = None
        self.worker = FakeTransferWorker()
        # as vLLM's CPU spec does when its ranks share one host copy: the connector
        # then lets only rank 0 write it
        # (vLLM 0.28.0-0.32.0 configs may lack the field)
        self.replicated_layout = bool(getattr(config, "replicated_layout", False))

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            manager_cls = (
                RequestLevelCPUManager
                if self.extra_config.get("request_level")
                else CPUOffloadingManager
            )
            capacity = {_CPU_CAPACITY: int(self.extra_config["cpu_chunks"])}
            self._manager = manager_cls(cache_policy="lru", **capacity)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if (
            self.replicated_layout
            and getattr(self.config, "parallel", None)
            and self.config.parallel.rank
        ):
            return ReplicaTransferWorker()
        self.worker.kv_caches = kv_caches
        return self.worker
