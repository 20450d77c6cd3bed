"""vLLM's general plugin of kvring: registers `KvringConnector` by name.

An installed kvring (the wheel, or ``pip install [-e] client/python``) declares this entry
point in ``pyproject.toml``:

    [project.entry-points."vllm.general_plugins"]
    kvring = "kvring.vllm_plugin:register"

vLLM calls `register()` in every process it starts (the API server, the engine core, each
worker) before it builds a KV connector, so

    --kv-transfer-config '{"kv_connector":"KvringConnector","kv_role":"kv_both"}'

needs no ``kv_connector_module_path``. The registration is lazy on vLLM's side (a module
path and a class name: ``kvring.vllm.connector`` is imported only when an engine uses the
connector) and idempotent: vLLM may load plugins more than once per process, and a second
kvring on ``sys.path`` (an editable install beside a wheel) registers nothing again.

This module sits outside ``kvring.vllm`` on purpose: importing that package imports the
connector and vLLM's connector base. Plain ``import kvring`` imports neither this module
nor vLLM nor torch.

With ``VLLM_PLUGINS`` set (vLLM's allowlist of plugins), it must name ``kvring``.
"""

from __future__ import annotations

CONNECTOR_NAME = "KvringConnector"
CONNECTOR_MODULE = "kvring.vllm.connector"

__all__ = ["CONNECTOR_NAME", "CONNECTOR_MODULE", "register"]


def register() -> bool:
    """Register `KvringConnector` with vLLM's KVConnectorFactory, once.

    Returns True when this call registered it, False when a connector of that name was
    registered already (by an earlier call, or by another copy of kvring).
    """
    # vLLM is importing us: its factory module is light next to what vLLM has loaded already
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if CONNECTOR_NAME in getattr(KVConnectorFactory, "_registry", {}):
        return False
    try:
        KVConnectorFactory.register_connector(CONNECTOR_NAME, CONNECTOR_MODULE, CONNECTOR_NAME)
    except ValueError:  # "already registered": lost a race with another registration
        return False
    return True
