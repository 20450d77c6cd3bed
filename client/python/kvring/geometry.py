"""Building and checking a worker's KV geometry (struct kvr_geometry) from Python.

A worker tells kvringd at attach where every block's bytes are in its KV memory: per
region (a layer's page, or its K and V pages) the offset of block 0, the stride between
blocks and the page size (kv/kvr_geometry.h has the full story). `build_geometry`
fills the struct through the library's own setters and `validate_geometry` runs the
library's validator, so Python never re-implements either.
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Sequence
from dataclasses import dataclass

from . import _lib
from ._lib import Geometry
from .client import KvringError

__all__ = ["RegionSpec", "build_geometry", "validate_geometry", "lane_bytes", "kv_extent", "Geometry"]


@dataclass(frozen=True)
class RegionSpec:
    """One region: bytes [offset + b*stride, + page_bytes) of block b (sem_bytes of them
    the semantic KV rows; the rest an opaque tail that is copied whole)."""

    offset: int
    stride: int
    page_bytes: int
    sem_bytes: int = 0  # 0 = page_bytes


def build_geometry(
    *,
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    block_tokens: int,
    num_blocks: int,
    regions: Sequence[RegionSpec],
    tp_size: int = 1,
    tp_rank: int = 0,
    attention: int = _lib.KVR_ATTN_MHA,
    layout: int = _lib.KVR_LAYOUT_LAYER_MAJOR,
    dcp_size: int = 1,
    dcp_rank: int = 0,
    dcp_interleave: int = 1,
) -> Geometry:
    """A complete geometry (not yet validated: see `validate_geometry`)."""
    lib = _lib.library()
    if not 1 <= len(regions) <= _lib.KVR_GEOM_MAX_REGIONS:
        raise KvringError(
            errno.EINVAL, f"geometry: {len(regions)} regions, kvring takes 1..{_lib.KVR_GEOM_MAX_REGIONS}"
        )
    g = Geometry()
    g.version = _lib.KVR_GEOMETRY_VERSION
    g.layers, g.kv_heads, g.head_dim, g.dtype_bytes = layers, kv_heads, head_dim, dtype_bytes
    g.block_tokens, g.num_blocks = block_tokens, num_blocks
    g.tp_size, g.tp_rank = tp_size, tp_rank
    g.dcp_size, g.dcp_rank, g.dcp_interleave = dcp_size, dcp_rank, dcp_interleave
    g.attention, g.layout = attention, layout
    g.n_regions = len(regions)
    for i, r in enumerate(regions):
        cr = _lib.Region(
            offset=r.offset, stride=r.stride, page_bytes=r.page_bytes, sem_bytes=r.sem_bytes or r.page_bytes
        )
        rc = lib.kvr_geometry_set_region(ctypes.byref(g), i, ctypes.byref(cr))
        if rc < 0:
            raise KvringError(
                -rc,
                f"geometry region {i}: offset {r.offset} / stride {r.stride} out of range "
                "(offsets < 2^48, strides < 2^32)",
            )
    return g


def validate_geometry(g: Geometry, kv_bytes: int) -> None:
    """kvr_geometry_validate: raise KvringError(EINVAL, reason) when g is not valid for a
    KV memory of kv_bytes bytes."""
    lib = _lib.library()
    err = ctypes.create_string_buffer(_lib_err_max())
    rc = lib.kvr_geometry_validate(ctypes.byref(g), kv_bytes, err, len(err))
    if rc < 0:
        raise KvringError(-rc, "geometry: " + err.value.decode(errors="replace"))


def lane_bytes(g: Geometry) -> int:
    """Bytes one rank stores per block (the sum of its pages)."""
    return int(_lib.library().kvr_geometry_lane_bytes(ctypes.byref(g)))


def kv_extent(g: Geometry) -> int:
    """Smallest KV memory that holds every region's last block."""
    return int(_lib.library().kvr_geometry_kv_extent(ctypes.byref(g)))


def _lib_err_max() -> int:
    return 256  # KVR_GEOM_ERR_MAX is 160; a little room
