"""`KvringConnector`: vLLM's KVConnectorBase_V1 backed by a kvringd instance on the node.

vLLM creates the connector twice: once in the scheduler process (role SCHEDULER) and once
in every worker process (role WORKER). This class only routes vLLM's hooks to the half
that owns them — `SchedulerSide` (scheduler.py: lookup leases, which stores when) or
`WorkerSide` (worker.py: KV memory, loads, stores) — and the two halves share nothing but
the per-step metadata (metadata.py). Load it with

    LLM(model=..., kv_transfer_config={
        "kv_connector": "KvringConnector",
        "kv_connector_module_path": "kvring.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/tmp/kvring.sock"},
    })

docs/vllm.md describes the options, the scheduler/worker split and what happens on
failures.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from . import config as _config
from . import namespace as _namespace
from .metadata import KvringConnectorMetadata
from .scheduler import SchedulerSide
from .worker import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["KvringConnector", "KvringConnectorMetadata"]

log = logging.getLogger("vllm.kvring")  # under vllm: its handler and format


def _engine_id(vllm_config: VllmConfig, cfg: _config.ConnectorConfig) -> str:
    if cfg.engine_id:
        return cfg.engine_id
    eid = str(vllm_config.kv_transfer_config.engine_id or "default")
    return "".join(ch if ch.isalnum() or ch in "._:-" else "-" for ch in eid)[:47]


def _tp() -> tuple[int, int]:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


class KvringConnector(KVConnectorBase_V1):
    """KV offload to kvringd: prefix hits load from its L1/L2 tiers, computed prompts store."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.cfg = _config.parse(vllm_config.kv_transfer_config.kv_connector_extra_config)
        self.engine_id = _engine_id(vllm_config, self.cfg)
        # The model namespace both halves attach with: model_ns when given, else derived
        # from the model, its weights and the KV format (namespace.py), the same string in
        # the scheduler and every worker (kvringd refuses an engine whose clients differ).
        self.namespace = _namespace.derive(vllm_config, self.cfg, kv_cache_config)
        self.cfg = dataclasses.replace(self.cfg, model_ns=self.namespace.ns)
        ns = self.namespace
        if role == KVConnectorRole.SCHEDULER:
            log.info("kvring: engine %s: %s", self.engine_id, ns.describe())
        else:
            log.debug("kvring: engine %s: %s", self.engine_id, ns.describe())
        if not ns.explicit and ns.fingerprint is None and role == KVConnectorRole.SCHEDULER:
            log.warning(
                "kvring: the weights of %r were not fingerprinted (%s): the model namespace %r is made of the "
                "model's name and revision only, so engines of that name share kvring blocks whatever weights "
                "they run. Point vLLM at the model's local directory, or set model_ns in "
                "kv_connector_extra_config",
                vllm_config.model_config.model,
                ns.why_no_fingerprint,
                ns.ns,
            )
        if not os.path.exists(self.cfg.socket):
            raise RuntimeError(
                f"kvring: kvringd socket {self.cfg.socket} does not exist ({self.cfg.socket_from}): start kvringd "
                "with that instance.socket (or the kvring service), or point the connector at its socket "
                "(kv_connector_extra_config.socket or $KVRING_SOCKET)"
            )
        pc = vllm_config.parallel_config
        if getattr(pc, "pipeline_parallel_size", 1) > 1:
            raise RuntimeError("kvring: pipeline parallelism is not supported by KvringConnector")
        if getattr(pc, "decode_context_parallel_size", 1) > 1:
            raise RuntimeError("kvring: decode context parallelism is not supported by KvringConnector yet")
        if self.cfg.test_wrong_blocks:
            log.warning("kvring: test_wrong_blocks is on: every load goes to the WRONG blocks (a negative control)")
        self._sched: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._sched = SchedulerSide(self.cfg, vllm_config, self.engine_id)
        else:
            rank, size = _tp()
            self._worker = WorkerSide(self.cfg, vllm_config, kv_cache_config, self.engine_id, rank, size)

    # kvring is a best-effort cache: a store that did not happen is a later miss, never
    # something a preempted request must wait for
    @property
    def requires_kv_delivery(self) -> bool:
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return None

    # ---- worker side ----

    def _w(self) -> WorkerSide:
        assert self._worker is not None, "a worker-side hook was called on the scheduler's connector"
        return self._worker

    def get_mem_pool_context(self) -> AbstractContextManager | None:
        return self._w().mem_pool_context()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._w().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvringConnectorMetadata)
        self._w().start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # layered loads: wait for this layer of the step's loads; else start_load_kv
        # returned once they were in place and this returns at once
        self._w().wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return  # stores are whole blocks of every layer, submitted once the forward pass ended (wait_for_save)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(kv_connector_metadata, KvringConnectorMetadata)
        self._w().handle_preemptions(kv_connector_metadata)

    def wait_for_save(self) -> None:
        # the prompts this step's forward pass completed are stored now, in this step; the
        # copies complete in the background and get_finished reports them
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvringConnectorMetadata)
        self._w().wait_for_save(meta)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._w().get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._w().get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._sched is not None:
            self._sched.shutdown()

    # ---- scheduler side ----

    def _s(self) -> SchedulerSide:
        assert self._sched is not None, "a scheduler-side hook was called on a worker's connector"
        return self._sched

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        self._s().bind_null_block(int(gpu_block_pool.null_block.block_id))

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)  # binds the block pool (bind_gpu_block_pool)
        self._s().bind_kv_cache_manager(kv_cache_manager)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._s().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self._s().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._s().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        self._s().update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._s().request_finished(request, block_ids)

    def has_pending_block_frees(self) -> bool:
        return self._sched is not None and self._sched.has_pending_block_frees()
