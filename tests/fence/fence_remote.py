"""A second KV connector beside the OffloadingConnector, under vLLM's MultiConnector.

``RemoteKVSource`` stands in for another KV source (a prefill peer, a remote cache):
it claims the first ``remote_tokens`` tokens of a request whose ``kv_transfer_params``
say so, loads them asynchronously, and reports the load finished one step later. Its
worker side moves no bytes: like the harness's transfer worker, it writes block tags
(:class:`fence_contents.Contents`), so that a load into a block that a store still reads
is caught.

Under MultiConnector the OffloadingConnector sees such a request with
``num_external_tokens == 0``: the case of vLLM issue #46951, where the blocks a load
goes into must still be collected for the fence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

PARAM = "remote_tokens"
# The engine this process steps; its Contents receive the loads' writes.
ENGINE: Any = None


def first_connector(multi: Any) -> Any:
    """The first of a MultiConnector's connectors (the OffloadingConnector, here).
    vLLM 0.30.0 on exposes them as ``sub_connectors``; vLLM 0.28.0-0.29.0 only as the
    private ``_connectors`` list, the same objects."""
    connectors = getattr(multi, "sub_connectors", None)
    return (connectors if connectors is not None else multi._connectors)[0]


@dataclass
class RemoteLoads(KVConnectorMetadata):
    # request id -> (first token, end token, block ids per KV-cache group)
    loads: dict[str, tuple[int, int, tuple[list[int], ...]]] = field(default_factory=dict)


class RemoteKVSource(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._claimed: dict[str, int] = {}  # request id -> its first remote token
        self._pending: dict[str, tuple[int, int, tuple[list[int], ...]]] = {}
        self._loading: list[str] = []  # worker side: loads started, reported next step

    # -- scheduler side ----------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tokens = int((request.kv_transfer_params or {}).get(PARAM, 0))
        if request.request_id in self._claimed or tokens <= num_computed_tokens:
            return 0, False
        self._claimed[request.request_id] = num_computed_tokens  # after local prefix hits
        return tokens - num_computed_tokens, True

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens > 0:
            start = self._claimed[request.request_id]
            self._pending[request.request_id] = (
                start,
                start + num_external_tokens,
                tuple(list(ids) for ids in blocks.get_block_ids()),
            )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = RemoteLoads(loads=self._pending)
        self._pending = {}
        return meta

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    # -- worker side -------------------------------------------------------------------

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, RemoteLoads)
        for req_id, (start, end, tables) in meta.loads.items():
            ENGINE.contents.remote_load(req_id, start, end, tables, ENGINE.step_no)
            self._loading.append(req_id)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done, self._loading = set(self._loading), []
        return None, done or None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        return None
