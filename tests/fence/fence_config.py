"""vLLM's configuration for a fence engine, built as vLLM's engine core builds it.

:func:`vllm_config` is the ``VllmConfig`` (the OffloadingConnector over
:class:`fence_transfers.FenceOffloadingSpec`, optionally under MultiConnector beside
:class:`fence_remote.RemoteKVSource`); :func:`engine_config` adds the KV-cache groups
of a layout and the block sizes the engine core resolves from them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import fence_remote
import fence_transfers
import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowSpec,
)

try:
    # vLLM 0.32.0 on: the engine core also resolves the prefix-cache hit alignment and
    # writes it, with the hash block size, into the KVCacheConfig. vLLM 0.28.0-0.31.0
    # have neither the function nor the two fields: there the connector derives its
    # hash size from the groups itself, and the scheduler gets it as an argument.
    from vllm.v1.core.kv_cache_utils import resolve_cache_hit_alignment_tokens
except ImportError:
    resolve_cache_hit_alignment_tokens = None

# The prefix-cache checkpoint retention of sliding-window groups. vLLM 0.29.0 on: a
# CacheConfig field (default 0), copied into the KVCacheConfig for the KV-cache
# manager; the connector reads the CacheConfig's (0.30.0 on). vLLM 0.28.0 has neither
# field: only the KV-cache coordinator reads it, from the environment variable
# VLLM_PREFIX_CACHE_RETENTION_INTERVAL (unset: dense), which it refuses for a model
# without a sliding-window or Mamba group (see :func:`retention_environment`).
RETENTION_ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
RETENTION_IN_CONFIG = "prefix_cache_retention_interval" in {
    f.name for f in dataclasses.fields(CacheConfig)
}
_KV_CACHE_CONFIG_FIELDS = {f.name for f in dataclasses.fields(KVCacheConfig)}

# A KV-cache tensor names its layers and their strides from vLLM 0.29.0 on; vLLM 0.28.0
# names the layers that share it (``shared_by``). See :func:`kv_cache_tensor`.
_KV_CACHE_TENSOR_FIELDS = {f.name for f in dataclasses.fields(KVCacheTensor)}

# vLLM 0.34.0 on can fold the token an EAGLE drafter reads after a block into the
# block's hash (lookahead block hashes, its default where every connector supports
# them), in place of dropping the last block of a prefix-cache hit. See :func:`vllm_config`.
# (vLLM 0.33.0 has them too, but keeps the legacy hashes under any KV connector.)
LOOKAHEAD_HASHES = hasattr(KVConnectorBase_V1, "supports_lookahead_block_hashes")

Layout = Literal["full", "sliding", "mixed"]
# The connector's role. A consumer (``kv_both``, what vLLM's examples give the
# OffloadingConnector) makes an engine with steps in flight defer freeing a request's
# blocks until those steps are done (the scheduler's ``defer_block_free``); a
# producer-only connector (``kv_producer``) does not. The OffloadingConnector itself
# reads no role: it stores and loads alike under both.
Role = Literal["kv_both", "kv_producer"]

MODEL = "facebook/opt-125m"  # its config.json only; no weights, no tokenizer


@dataclass(frozen=True)
class EngineConfig:
    """What the scheduler and the worker side are built from."""

    vllm: VllmConfig
    kv_cache: KVCacheConfig
    num_gpu_blocks: int
    group_block_sizes: list[int]  # per KV-cache group
    scheduler_block_size: int  # the lcm of the groups' block sizes
    hash_block_size: int  # their gcd: block hashes are chained at this size
    retention_interval: int | None  # sliding-window checkpoint retention (None: dense)

    @property
    def hash_lookahead_tokens(self) -> int:
        """The tokens after each block its hash covers (vLLM 0.34.0's lookahead block
        hashes, as the config resolved them); 0: the legacy hashes, and every release
        before 0.33.0, which has no such field."""
        return getattr(self.vllm, "num_hash_lookahead_tokens", 0)

    @property
    def final_tail_groups(self) -> frozenset[int]:
        """The groups whose final tail a finished request's store may reconsider:
        sliding-window groups other than an EAGLE drafter's."""
        return frozenset(
            i
            for i, g in enumerate(self.kv_cache.kv_cache_groups)
            if isinstance(g.kv_cache_spec, SlidingWindowSpec) and not g.is_eagle_group
        )


@contextmanager
def retention_environment(config: EngineConfig) -> Iterator[None]:
    """Where the release reads the checkpoint retention from the environment (vLLM
    0.28.0), set it there while the scheduler (and its KV-cache coordinator) is
    built; elsewhere, nothing to do: the configs carry it."""
    sliding = any(
        isinstance(g.kv_cache_spec, (SlidingWindowSpec, MambaSpec))
        for g in config.kv_cache.kv_cache_groups
    )
    if RETENTION_IN_CONFIG or config.retention_interval is None or not sliding:
        yield
        return
    old = os.environ.get(RETENTION_ENV)
    os.environ[RETENTION_ENV] = str(config.retention_interval)
    try:
        yield
    finally:
        if old is None:
            del os.environ[RETENTION_ENV]
        else:
            os.environ[RETENTION_ENV] = old


def engine_config(
    *,
    layout: Layout,
    block_size: int,
    sliding_block_size: int | None,
    window_blocks: int,
    eagle: bool,
    num_gpu_blocks: int,
    retention_interval: int | None,
    **options: Any,
) -> EngineConfig:
    """The configs of an engine; ``options`` are the rest of :func:`vllm_config`'s."""
    if sliding_block_size not in (None, block_size) and layout != "mixed":
        raise ValueError(
            f"sliding_block_size={sliding_block_size} differs from block_size="
            f"{block_size}, which needs two groups: use layout='mixed'"
        )
    groups = kv_cache_groups(
        layout, block_size, window_blocks, eagle, sliding_block_size or block_size
    )
    group_block_sizes = [g.kv_cache_spec.block_size for g in groups]
    config = vllm_config(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        retention_interval=retention_interval,
        eagle=eagle,
        **options,
    )
    retention: dict[str, Any] = {}
    if "prefix_cache_retention_interval" in _KV_CACHE_CONFIG_FIELDS:
        # as vLLM's kv_cache_planning does: the KV-cache manager and the
        # connector read the same retention
        retention["prefix_cache_retention_interval"] = retention_interval
    kv_cache_config = KVCacheConfig(
        num_blocks=num_gpu_blocks,
        kv_cache_tensors=[kv_cache_tensor(g, num_gpu_blocks) for g in groups],
        kv_cache_groups=groups,
        **retention,
    )
    # as vLLM's engine core does: with several block sizes, the scheduler steps in
    # their lcm and hashes in their gcd
    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, config)
    if resolve_cache_hit_alignment_tokens is not None:  # 0.32.0 on (see the import)
        kv_cache_config.hash_block_size = hash_block_size
        kv_cache_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
            kv_cache_config, config, scheduler_block_size, hash_block_size
        )
    return EngineConfig(
        vllm=config,
        kv_cache=kv_cache_config,
        num_gpu_blocks=num_gpu_blocks,
        group_block_sizes=group_block_sizes,
        scheduler_block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        retention_interval=retention_interval,
    )


def kv_cache_tensor(group: KVCacheGroupSpec, num_gpu_blocks: int) -> KVCacheTensor:
    """One layer-outermost tensor for a group's one layer."""
    page = group.kv_cache_spec.page_size_bytes
    if "layers" in _KV_CACHE_TENSOR_FIELDS:  # vLLM 0.29.0 on: layers and their strides
        return KVCacheTensor(
            size=page * num_gpu_blocks,
            layers=list(group.layer_names),
            layer_stride=page * num_gpu_blocks,
            block_stride=page,
        )
    # vLLM 0.28.0: the layers that share the tensor, unpacked (no strides)
    return KVCacheTensor(size=page * num_gpu_blocks, shared_by=list(group.layer_names))  # type: ignore[call-arg]


def kv_cache_groups(
    layout: Layout, block_size: int, window_blocks: int, eagle: bool, sliding_block_size: int
) -> list[KVCacheGroupSpec]:
    common = {"num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    full = KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=block_size, **common))  # type: ignore[arg-type]
    sliding = KVCacheGroupSpec(
        ["sliding"],
        SlidingWindowSpec(
            block_size=sliding_block_size,
            sliding_window=window_blocks * sliding_block_size,
            **common,  # type: ignore[arg-type]
        ),
        # an EAGLE drafter's group, as the model runner tags it (vllm_config gives the
        # scheduler the drafter's speculative config)
        is_eagle_group=eagle,
    )
    return {"full": [full], "sliding": [sliding], "mixed": [full, sliding]}[layout]


@functools.cache
def _model_config() -> ModelConfig:
    """The model's config, read once per process: every random program builds an
    engine, and reading and validating the same config.json for each is wasted work.

    Its word embeddings are marked untied. The harness loads no weights, and vLLM
    (0.33.0) asks of every config whose embeddings are tied whether the checkpoint
    has an ``lm_head`` of its own, looking for safetensors that are not there: about
    25 ms per engine, a tenth of the random workloads' time. Nothing the connector
    or the scheduler does reads the flag."""
    model = ModelConfig(model=MODEL, dtype="float16", seed=0)
    for config in (model.hf_config, model.hf_config.get_text_config()):
        config.tie_word_embeddings = False
    return model


def vllm_config(
    *,
    block_size: int,
    num_gpu_blocks: int,
    blocks_per_chunk: int = 1,
    async_scheduling: bool = False,
    cpu_chunks: int = 64,
    workers: int = 1,
    max_num_batched_tokens: int = 64,
    request_level: bool = False,
    remote_source: bool = False,
    retention_interval: int | None = 0,
    kv_role: Role = "kv_both",
    spec_tokens: int = 0,
    eagle: bool = False,
    lookahead_hashes: bool = False,
) -> VllmConfig:
    """A real vLLM config with the OffloadingConnector over
    :class:`fence_transfers.FenceOffloadingSpec`.

    The scheduler config keeps the ``async_scheduling`` asked for. vLLM's CPU
    platform turns the flag off as the config is built (it runs no model
    asynchronously), but the harness steps the engine as a GPU engine core does,
    one step in flight under the ``AsyncScheduler``, and the scheduler reads the flag
    to know that (docs/triage-async-scheduling.md).

    With ``spec_tokens``, speculative decoding of up to that many draft tokens per
    step, by vLLM's n-gram method (no draft model to load): the scheduler schedules
    the drafts the engine hands it (async: placeholders of its own) and takes back
    what the target model accepted.

    With ``eagle``, the speculative config is an EAGLE drafter's (one draft token
    unless ``spec_tokens`` says more), as the core scheduler reads it: it drops the
    last block of a prefix-cache hit for the drafter's group and reserves lookahead
    slots. vLLM builds an EAGLE config from a draft model's, which an offline run
    does not have, so the config is the n-gram one with its method set to ``eagle``
    after validation; the scheduler and the connector read only the method and the
    token count (the harness plays the model runner, drafter included).

    With ``lookahead_hashes`` (vLLM 0.34.0 on, EAGLE only), the drafter's config keeps
    vLLM's default: each block hash also covers the token after the block, which the
    drafter's KV at the block's last position reads, so a hit keeps its last block and a
    block's hash (hence its store) waits for that token. vLLM turns them off itself
    when a connector does not support them (the second connector here). Without it,
    the config disables them, vLLM's fallback: the last block of a hit is dropped."""
    if lookahead_hashes and not (eagle and LOOKAHEAD_HASHES):
        raise ValueError(
            "lookahead_hashes are an EAGLE drafter's (eagle=True), from vLLM 0.34.0 on: "
            "drop lookahead_hashes=True here"
        )
    if remote_source and kv_role != "kv_both":
        raise ValueError(
            f"remote_source loads KV from another connector, which a {kv_role} "
            "connector does not: use kv_role='kv_both'"
        )
    model = copy.deepcopy(_model_config())  # a config may change its model's
    scheduler = SchedulerConfig(
        max_num_seqs=min(16, max_num_batched_tokens),
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=4096,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        disable_hybrid_kv_cache_manager=False,
        async_scheduling=async_scheduling,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=True)
    cache.num_gpu_blocks = num_gpu_blocks
    if RETENTION_IN_CONFIG:  # vLLM 0.29.0 on (see retention_environment)
        cache.prefix_cache_retention_interval = retention_interval
    extra: dict[str, Any] = {
        "spec_name": fence_transfers.FenceOffloadingSpec.__name__,
        "spec_module_path": fence_transfers.__name__,
        "cpu_chunks": cpu_chunks,
        "offload_prompt_only": False,
        "request_level": request_level,
    }
    if blocks_per_chunk > 1:
        extra["blocks_per_chunk"] = blocks_per_chunk
    offloading = {
        "kv_connector": "OffloadingConnector",
        "kv_role": kv_role,
        "kv_connector_extra_config": extra,
    }
    remote = {
        "kv_connector": fence_remote.RemoteKVSource.__name__,
        "kv_connector_module_path": fence_remote.__name__,
        "kv_role": "kv_both",
    }
    transfer = (
        KVTransferConfig(
            kv_connector="MultiConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"connectors": [offloading, remote]},
        )
        if remote_source
        else KVTransferConfig(**offloading)  # type: ignore[arg-type]
    )
    config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=cache,
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=transfer,
    )
    config.parallel_config.world_size = workers
    config.scheduler_config.async_scheduling = async_scheduling
    if spec_tokens or eagle:
        tokens = spec_tokens or 1
        speculative = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=tokens,
            prompt_lookup_max=tokens,
            prompt_lookup_min=1,
            target_model_config=model,
            target_parallel_config=config.parallel_config,
        )
        if eagle:
            object.__setattr__(speculative, "method", "eagle")
            if LOOKAHEAD_HASHES:
                disable = not lookahead_hashes
                object.__setattr__(speculative, "disable_lookahead_block_hashes", disable)
        config.speculative_config = speculative
        if LOOKAHEAD_HASHES:
            # vLLM resolves the hashes' lookahead as it validates the config, which had
            # no speculative config then: resolve it again, as vLLM would with this one
            config.num_hash_lookahead_tokens = config._resolve_num_hash_lookahead_tokens()
    return config
