"""kvring: Python binding of libkvring (the kvringd client library) and the vLLM connector.

- `kvring.Worker`, `kvring.Scheduler`: the two kinds of kvringd clients (client.py);
- `kvring.build_geometry`, `kvring.validate_geometry`: describe a worker's KV memory;
- `kvring.vllm.KvringConnector`: vLLM's KVConnectorBase_V1 over them (imports vLLM only
  when that subpackage is imported);
- `kvring.vllm_plugin`: vLLM's ``vllm.general_plugins`` entry point of an installed kvring,
  registering the connector under the name ``KvringConnector`` (imported by vLLM, not here);
- `kvring.ProtocolMismatch`: the attach error when kvringd speaks another protocol version.

The binding is ctypes over ``libkvring.so`` (found as `kvring._lib.library_path` says: the
wheel's own copy when installed from it, docs/packaging.md), so nothing is compiled when
the package is installed or imported.
"""

from ._lib import (
    KVR_ATTN_MHA,
    KVR_ATTN_MLA,
    KVR_LAYOUT_CROSS_LAYER,
    KVR_LAYOUT_LAYER_MAJOR,
    Geometry,
    library_path,
)
from .client import (
    OP_LOAD,
    OP_STORE,
    Completion,
    CudaKv,
    CudaKvRange,
    KvringError,
    LoadDiag,
    LookupResult,
    ProtocolMismatch,
    Scheduler,
    Worker,
)
from .geometry import RegionSpec, build_geometry, kv_extent, lane_bytes, validate_geometry

__all__ = [
    "KVR_ATTN_MHA",
    "KVR_ATTN_MLA",
    "KVR_LAYOUT_CROSS_LAYER",
    "KVR_LAYOUT_LAYER_MAJOR",
    "OP_LOAD",
    "OP_STORE",
    "Completion",
    "CudaKv",
    "CudaKvRange",
    "Geometry",
    "KvringError",
    "LoadDiag",
    "LookupResult",
    "ProtocolMismatch",
    "RegionSpec",
    "Scheduler",
    "Worker",
    "build_geometry",
    "kv_extent",
    "lane_bytes",
    "library_path",
    "validate_geometry",
]

__version__ = "0.1.0"
