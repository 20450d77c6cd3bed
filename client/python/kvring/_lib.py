"""The ctypes layer over libkvring.so: library lookup, C struct mirrors, function prototypes.

Nothing here is meant for engines to use directly (`kvring.client` wraps it): this module
only knows how to find the shared library, what its structs look like and which argument
types each exported function takes. No compiler is needed at run time.

Where the library is found, first match wins:

1. ``$KVRING_LIB``: the path of ``libkvring.so`` itself;
2. ``lib/libkvring.so.0`` inside this package: the copy an installed wheel brings
   (``tools/build-wheel.sh``, docs/packaging.md), built from the same tree as this Python
   code. A source checkout has none, so there the order below is unchanged;
3. ``$KVR_BUILD_ROOT/client/libkvring.so`` (what meson sets for the test suites);
4. ``build/client/libkvring.so`` under the repository this package sits in
   (``client/python/kvring`` -> repository root three levels up);
5. ``libkvring.so.0`` through the dynamic linker (an installed kvring).

The struct mirrors follow ``include/kvring/kvring.h`` and ``kv/kvr_geometry.h``
field for field. ``struct kvr_geometry`` is the attach payload, byte for byte, so its
mirror is checked against the library when the library is loaded (`_check_geometry_abi`):
a kvring built with another region table size is refused with a message naming both sizes
instead of sending a garbled geometry.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

__all__ = [
    "KVR_GEOM_MAX_REGIONS",
    "KVR_GEOMETRY_VERSION",
    "KVR_ENGINE_ID_MAX",
    "KVR_MODEL_NS_MAX",
    "KVR_ATTN_MHA",
    "KVR_ATTN_MLA",
    "KVR_LAYOUT_LAYER_MAJOR",
    "KVR_LAYOUT_CROSS_LAYER",
    "KVR_OP_LOAD_DONE",
    "KVR_OP_STORE_DONE",
    "Geometry",
    "Region",
    "CudaKvRange",
    "CudaKv",
    "AttachOpts",
    "SchedOpts",
    "LeaseOpts",
    "LookupResult",
    "LoadDiag",
    "Completion",
    "library",
    "library_path",
    "has_symbol",
]

# ---- constants (kvr_geometry.h, kvring.h) --------------------------------------------

KVR_GEOMETRY_VERSION = 1
KVR_GEOM_MAX_REGIONS = 1024  # kv/kvr_geometry.h: 512 layers x K, V
KVR_ENGINE_ID_MAX = 48
KVR_MODEL_NS_MAX = 64

KVR_ATTN_MHA = 1
KVR_ATTN_MLA = 2
KVR_LAYOUT_LAYER_MAJOR = 1
KVR_LAYOUT_CROSS_LAYER = 2

KVR_OP_LOAD_DONE = 1
KVR_OP_STORE_DONE = 2

_u8, _u16, _u32, _i32 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int32
_u64, _i64 = ctypes.c_uint64, ctypes.c_int64
_R = KVR_GEOM_MAX_REGIONS


# ---- struct mirrors ---------------------------------------------------------------------


class Region(ctypes.Structure):
    """struct kvr_region: one region in natural form (what kvr_geometry_set_region takes)."""

    _fields_ = [("offset", _u64), ("stride", _u64), ("page_bytes", _u32), ("sem_bytes", _u32)]


class Geometry(ctypes.Structure):
    """struct kvr_geometry: a 64-byte header, then the region table as structure of arrays.

    Write regions with `set_region` (which calls the library's kvr_geometry_set_region,
    so the 48-bit offset split stays the library's business).
    """

    _fields_ = [
        ("version", _u32),
        ("layers", _u32),
        ("kv_heads", _u32),
        ("head_dim", _u32),
        ("dtype_bytes", _u32),
        ("block_tokens", _u32),
        ("tp_size", _u32),
        ("tp_rank", _u32),
        ("dcp_size", _u32),
        ("dcp_rank", _u32),
        ("dcp_interleave", _u32),
        ("attention", _u32),
        ("layout", _u32),
        ("num_blocks", _u32),
        ("n_regions", _u32),
        ("reserved", _u32),
        ("page_bytes", _u32 * _R),
        ("sem_bytes", _u32 * _R),
        ("stride", _u32 * _R),
        ("offset_lo", _u32 * _R),
        ("offset_hi", _u16 * _R),
    ]

    def region(self, i: int) -> tuple[int, int, int, int]:
        """(offset, stride, page_bytes, sem_bytes) of region i."""
        return (
            (self.offset_hi[i] << 32) | self.offset_lo[i],
            self.stride[i],
            self.page_bytes[i],
            self.sem_bytes[i],
        )


class CudaKvRange(ctypes.Structure):
    """struct kvr_cuda_kv_range: one piece of a CUDA allocation in the KV offset space."""

    _fields_ = [
        ("ipc_handle", _u8 * 64),
        ("alloc_offset", _u64),
        ("kv_offset", _u64),
        ("bytes", _u64),
    ]


class CudaKv(ctypes.Structure):
    """struct kvr_cuda_kv: the GPU holding the KV memory and its ranges."""

    _fields_ = [
        ("device_uuid", _u8 * 16),
        ("n_ranges", _u32),
        ("ranges", ctypes.POINTER(CudaKvRange)),
    ]


class AttachOpts(ctypes.Structure):
    """struct kvr_attach_opts (worker attach)."""

    _fields_ = [
        ("socket", ctypes.c_char_p),
        ("geometry", ctypes.POINTER(Geometry)),
        ("kv_fd", ctypes.c_int),
        ("kv_bytes", _u64),
        ("timeout_ms", _i64),
        ("cuda_kv", ctypes.POINTER(CudaKv)),
        ("engine_id", ctypes.c_char_p),
        ("model_ns", ctypes.c_char_p),
    ]


class SchedOpts(ctypes.Structure):
    """struct kvr_sched_opts (scheduler attach)."""

    _fields_ = [
        ("socket", ctypes.c_char_p),
        ("engine_id", ctypes.c_char_p),
        ("model_ns", ctypes.c_char_p),
        ("timeout_ms", _i64),
    ]


class LeaseOpts(ctypes.Structure):
    """struct kvr_lease_opts."""

    _fields_ = [("loaders", _u32), ("ttl_ms", _u32)]


class LookupResult(ctypes.Structure):
    """struct kvr_lookup_result."""

    _fields_ = [
        ("matched_tokens", _u32),
        ("matched_blocks", _u32),
        ("l2_blocks", _u32),
        ("hash_ns", _u64),
        ("index_ns", _u64),
        ("roundtrip_ns", _u64),
        ("pending_blocks", _u32),
        ("miss_reason", _u32),
    ]


class LoadDiag(ctypes.Structure):
    """struct kvr_load_diag."""

    _fields_ = [
        ("bytes", _u64),
        ("copies", _u32),
        ("runs", _u32),
        ("queue_ns", _u64),
        ("copy_ns", _u64),
        ("l1_hits", _u32),
        ("l2_reads", _u32),
        ("total_ns", _u64),
    ]


class Completion(ctypes.Structure):
    """struct kvr_completion (its `failed` array is valid until the next poll)."""

    _fields_ = [
        ("req_id", _u64),
        ("op", _u32),
        ("status", _i32),
        ("n_blocks", _u32),
        ("n_failed", _u32),
        ("failed", ctypes.POINTER(_u32)),
        ("n_stored", _u32),
        ("n_present", _u32),
        ("diag", LoadDiag),
    ]


# ---- the library ------------------------------------------------------------------------

_P = ctypes.POINTER
_client_p = ctypes.c_void_p
_u32_p = _P(_u32)

# name -> (restype, argtypes). Functions marked optional may be absent from an older
# library; calling one then raises ENOSYS naming it (kvring.client does that).
_PROTOS: dict[str, tuple[object, list[object]]] = {
    "kvr_attach": (ctypes.c_int, [_P(AttachOpts), _P(_client_p)]),
    "kvr_detach": (ctypes.c_int, [_client_p]),
    "kvr_cancel": (ctypes.c_int, [_client_p, _u64]),
    "kvr_last_error": (ctypes.c_char_p, [_client_p]),
    "kvr_worker_slot": (ctypes.c_uint, [_client_p]),
    "kvr_inflight": (ctypes.c_uint, [_client_p]),
    "kvr_rank_tokens": (ctypes.c_size_t, [_client_p, ctypes.c_size_t]),
    "kvr_lookup": (
        ctypes.c_int,
        [_client_p, _u64, _u32_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, _P(LookupResult)],
    ),
    "kvr_load": (ctypes.c_int, [_client_p, _u64, _u32_p, ctypes.c_size_t]),
    "kvr_load_layered": (ctypes.c_int, [_client_p, _u64, _u32_p, ctypes.c_size_t]),
    "kvr_wait_layers": (ctypes.c_int, [_client_p, _u32, _i64]),
    "kvr_store": (
        ctypes.c_int,
        [_client_p, _u64, _u32_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, _u32_p, ctypes.c_size_t],
    ),
    "kvr_store_cuda": (
        ctypes.c_int,
        [
            _client_p,
            _u64,
            _u32_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            _u32_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
        ],
    ),
    "kvr_poll": (ctypes.c_int, [_client_p, _P(Completion), ctypes.c_uint]),
    "kvr_wait": (ctypes.c_int, [_client_p, _P(Completion), ctypes.c_uint, _i64]),
    # engines, schedulers and leases (DESIGN.md 7b)
    "kvr_block_tokens": (ctypes.c_uint, [_client_p]),
    "kvr_attach_scheduler": (ctypes.c_int, [_P(SchedOpts), _P(_client_p)]),
    "kvr_lease": (
        ctypes.c_int,
        [
            _client_p,
            _u64,
            _u32_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            _P(LeaseOpts),
            _P(LookupResult),
        ],
    ),
    "kvr_lease_release": (ctypes.c_int, [_client_p, _u64]),
    "kvr_lease_take": (ctypes.c_int, [_client_p, _u64, _P(LookupResult)]),
    # geometry helpers (kv/kvr_geometry.h, linked into libkvring)
    "kvr_geometry_set_region": (ctypes.c_int, [_P(Geometry), ctypes.c_uint, _P(Region)]),
    "kvr_geometry_validate": (ctypes.c_int, [_P(Geometry), _u64, ctypes.c_char_p, ctypes.c_size_t]),
    "kvr_geometry_lane_bytes": (_u64, [_P(Geometry)]),
    "kvr_geometry_kv_extent": (_u64, [_P(Geometry)]),
    "kvr_geometry_fill_vllm_layer_major": (
        ctypes.c_int,
        [_P(Geometry), _u32, _u32, _u32, _u32, _u32, _u32],
    ),
}

_REQUIRED = (
    "kvr_attach",
    "kvr_detach",
    "kvr_cancel",
    "kvr_last_error",
    "kvr_lookup",
    "kvr_load",
    "kvr_store",
    "kvr_poll",
    "kvr_wait",
    "kvr_inflight",
    "kvr_geometry_set_region",
    "kvr_geometry_validate",
    "kvr_geometry_fill_vllm_layer_major",
)

# where a wheel puts its libkvring (tools/mkwheel.py writes it there)
BUNDLED = Path(__file__).resolve().parent / "lib" / "libkvring.so.0"

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: str | None = None


def _candidates() -> list[str]:
    out: list[str] = []
    env = os.environ.get("KVRING_LIB")
    if env:
        return [env]  # an explicit choice is not second-guessed
    out.append(str(BUNDLED))
    root = os.environ.get("KVR_BUILD_ROOT")
    if root:
        out.append(str(Path(root) / "client" / "libkvring.so"))
    repo = Path(__file__).resolve().parents[3]
    out.append(str(repo / "build" / "client" / "libkvring.so"))
    return out


def library_path() -> str:
    """The path of the libkvring that `library()` loads (or would load)."""
    if _lib_path is not None:
        return _lib_path
    for p in _candidates():
        if os.path.exists(p):
            return p
    found = ctypes.util.find_library("kvring")
    if found:
        return found
    raise OSError(
        "libkvring.so not found: install the kvring wheel, set KVRING_LIB to its path, or "
        "KVR_BUILD_ROOT to the meson build directory (tried " + ", ".join(_candidates()) + " and the dynamic linker)"
    )


def library() -> ctypes.CDLL:
    """Load libkvring once, declare every prototype, check the geometry ABI."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        lib = ctypes.CDLL(path)
        missing = [n for n in _REQUIRED if not hasattr(lib, n)]
        if missing:
            raise OSError(f"{path} is not libkvring: it lacks {', '.join(missing)}")
        for name, (res, args) in _PROTOS.items():
            if hasattr(lib, name):
                fn = getattr(lib, name)
                fn.restype = res
                fn.argtypes = args
        _check_geometry_abi(lib, path)
        _lib, _lib_path = lib, path
        return lib


def has_symbol(name: str) -> bool:
    """Whether the loaded libkvring exports `name` (newer API pieces may be missing)."""
    return hasattr(library(), name)


def _check_geometry_abi(lib: ctypes.CDLL, path: str) -> None:
    """Prove the Geometry mirror has the C struct's size and offsets.

    kvr_geometry_fill_vllm_layer_major assigns the whole struct (`*g = tmp`), so the C
    struct's extent is exactly what it writes. It fills a buffer with a sentinel tail: a
    larger C struct would overwrite the sentinel; the last region's offset_hi, which a
    smaller C struct would not reach, is set through kvr_geometry_set_region and read back.
    """
    size = ctypes.sizeof(Geometry)
    expect = 64 + 18 * KVR_GEOM_MAX_REGIONS
    if size != expect:  # the mirror itself is wrong: a bug in this file
        raise AssertionError(f"Geometry mirror is {size} bytes, kvr_geometry.h says {expect}")
    buf = (ctypes.c_uint8 * (size + 64))(*([0xA5] * (size + 64)))
    g = Geometry.from_buffer(buf)
    rc = lib.kvr_geometry_fill_vllm_layer_major(ctypes.byref(g), 2, 1, 8, 2, 16, 4)
    if rc != 0:
        raise OSError(f"{path}: kvr_geometry_fill_vllm_layer_major failed ({rc}) on a valid geometry")
    tail = bytes(buf[size:])
    if tail != b"\xa5" * 64:
        raise OSError(
            f"{path}: struct kvr_geometry is larger than {size} bytes (its region table is not "
            f"{KVR_GEOM_MAX_REGIONS} entries): this kvring Python package does not match the library"
        )
    if g.n_regions != 4 or g.page_bytes[1] != 16 * 8 * 2 or g.version != KVR_GEOMETRY_VERSION:
        raise OSError(f"{path}: struct kvr_geometry fields are not where kvr_geometry.h puts them")
    last = KVR_GEOM_MAX_REGIONS - 1
    r = Region(offset=(7 << 32) | 5, stride=64, page_bytes=32, sem_bytes=32)
    if lib.kvr_geometry_set_region(ctypes.byref(g), last, ctypes.byref(r)) != 0:
        raise OSError(f"{path}: kvr_geometry_set_region refused region {last}")
    if g.offset_hi[last] != 7 or g.offset_lo[last] != 5 or g.stride[last] != 64:
        raise OSError(
            f"{path}: struct kvr_geometry's region table is not {KVR_GEOM_MAX_REGIONS} entries "
            "(region offsets land elsewhere): this kvring Python package does not match the library"
        )
    if bytes(buf[size:]) != b"\xa5" * 64:
        raise OSError(f"{path}: kvr_geometry_set_region wrote past a {size}-byte struct kvr_geometry")
