"""kvring's vLLM integration: `KvringConnector`, a KVConnectorBase_V1.

    kv_transfer_config={"kv_connector": "KvringConnector",
                        "kv_connector_module_path": "kvring.vllm.connector", ...}

Modules: connector (the class vLLM loads), scheduler (its scheduler-process half), worker
(its worker-process half), metadata (what travels between them each step), kvmem (the
memfd allocation hook and the geometry derived from vLLM's KV tensors), config
(kv_connector_extra_config). docs/vllm.md is the user's guide.
"""

from .connector import KvringConnector

__all__ = ["KvringConnector"]
