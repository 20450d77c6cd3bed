"""Where vLLM's KV cache lives, and how kvring is told: the memfd allocation hook and the
geometry derived from the KV tensors.

Host (CPU) workers. kvringd's loader and storer copy blocks straight between the L1 arena
and the worker's KV memory, so that memory must be a file descriptor kvringd can map: a
memfd created with MFD_ALLOW_SEALING. vLLM allocates the whole KV cache as ONE
``torch.zeros(size, dtype=torch.int8)`` inside the connector's ``get_mem_pool_context()``
(vllm/v1/worker/utils.py allocate_kv_cache) and then views it per layer. `MemfdKvPool` is
that context: while it is active, the first such 1-D int8 CPU allocation is answered with
a tensor over a shared mmap of a fresh memfd (zero-filled, as torch.zeros promises); every
other call goes to the real torch.zeros; the hook is removed on exit. The mmap stays open
as long as the pool object lives (the connector keeps it).

Geometry. `derive_geometry` then reads the layer tensors vLLM registers
(``register_kv_caches``) and turns their real shapes, strides and data pointers into
kvring's region table: one region per layer, block b of layer l at
``data_ptr(l) - base + b * stride(0)``, page = the bytes of one block of that layer
(vLLM's layer view is [blocks, kv_heads, block_tokens, K+V row] — K and V in one page,
kvringd's ``model.kv_layout: "kv-fused"``; a page may hold its rows heads-outer, HND, as
on the CPU, or tokens-outer, NHD: engines sharing a model namespace must use the same).
Anything else (pages that are not one dense run, layers outside the memfd, several KV
cache groups) is refused with a message saying what was found, rather than guessed at.

GPU workers (`cuda_ranges`). The same geometry, but offsets index a "KV offset space"
made of the CUDA allocations behind the tensors, each exported with
``storage._share_cuda_()`` (the allocation's cudaIpcMemHandle and the storage's offset
in it); libkvring passes them to the loader and storer (docs/cuda.md).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .. import _lib
from ..client import CudaKv, CudaKvRange
from ..geometry import RegionSpec, build_geometry, validate_geometry

__all__ = [
    "KvLayoutError",
    "MemfdKvPool",
    "LayerView",
    "DerivedGeometry",
    "derive_geometry",
    "cuda_ranges",
    "order_layers",
    "device_uuid",
]


log = logging.getLogger("vllm.kvring")


class KvLayoutError(ValueError):
    """vLLM's KV cache is laid out in a way this connector does not handle (says how)."""


# ---- the memfd allocation hook -----------------------------------------------------------


class MemfdKvPool:
    """Context manager that makes vLLM's single KV allocation land in a memfd.

    After the context: `fd` (the memfd, open read-write), `nbytes`, `base` (address of
    byte 0 in this process), `tensor` (the int8 tensor handed to vLLM). `fd` is None when
    vLLM allocated nothing matching inside the context.
    """

    def __init__(self, name: str = "kvring-kv") -> None:
        self.name = name
        self.fd: int | None = None
        self.nbytes = 0
        self.base = 0
        self.tensor: torch.Tensor | None = None
        self.prefault_s: float | None = None  # seconds the up-front allocation took (None: not done)
        self._mm: mmap.mmap | None = None
        self._orig: Callable[..., torch.Tensor] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _is_kv_alloc(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        """The byte count when this torch.zeros call is vLLM's flat int8 KV buffer on CPU."""
        if kwargs.get("dtype") is not torch.int8 or "out" in kwargs:
            return None
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type != "cpu":
            return None
        if kwargs.get("requires_grad") or kwargs.get("pin_memory"):
            return None
        size = args[0] if len(args) == 1 else (kwargs.get("size") if not args else None)
        if isinstance(size, (tuple, list, torch.Size)):
            size = size[0] if len(size) == 1 else None
        if isinstance(size, int) and size > 0:
            return size
        return None

    def _alloc(self, nbytes: int) -> torch.Tensor:
        fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, nbytes)
            self.prefault(fd, nbytes)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        t = torch.frombuffer(mm, dtype=torch.int8)  # zero-filled: a new memfd reads as zeros
        self.fd, self.nbytes, self._mm, self.tensor = fd, nbytes, mm, t
        self.base = t.data_ptr()
        return t

    def prefault(self, fd: int, nbytes: int) -> None:
        """Allocate every page of the KV memory now, as vLLM's own torch.zeros does by writing
        it, instead of at first touch. A page first touched by a load is allocated (and, in a
        VM with free page reporting, faulted in from the host) inside kvringd's copy: the
        first loads into such pages ran at 70 MB/s where the rest of the pass ran at 6 GB/s
        (docs/benchmarks.md, "KV memory allocated up front"). The pages read as zeros either
        way. Where the memory is not there (a cgroup limit), the pages stay lazy: logged."""
        t0 = time.perf_counter()
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            log.warning(
                "kvring: could not allocate the %d MiB of KV memory up front (%s): its pages are allocated "
                "at first touch, the first loads into them copy slower",
                nbytes >> 20,
                e.strerror,
            )
            return
        self.prefault_s = time.perf_counter() - t0

    def __enter__(self) -> MemfdKvPool:
        orig = torch.zeros
        self._orig = orig

        def zeros(*args: Any, **kwargs: Any) -> torch.Tensor:
            with self._lock:
                n = self._is_kv_alloc(args, kwargs) if self.fd is None else None
                if n is not None:
                    return self._alloc(n)
            return orig(*args, **kwargs)

        torch.zeros = zeros  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._orig is not None:
            torch.zeros = self._orig  # type: ignore[assignment]
            self._orig = None

    def close(self) -> None:
        """Drop the fd (the mapping lives on while vLLM's tensors refer to it)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---- geometry from the layer tensors -------------------------------------------------------


@dataclass(frozen=True)
class LayerView:
    """What the geometry needs of one layer's KV tensor."""

    name: str
    data_ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    elem_bytes: int
    storage_ptr: int  # address of the tensor's storage (its allocation piece)
    storage_bytes: int

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> LayerView:
        st = t.untyped_storage()
        return cls(name, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size(), st.data_ptr(), st.nbytes())


@dataclass
class DerivedGeometry:
    geometry: _lib.Geometry
    layers: int
    kv_heads: int  # per rank
    head_dim: int
    dtype_bytes: int
    block_tokens: int
    num_blocks: int
    page_bytes: int
    stride_bytes: int
    layer_names: list[str]
    order: str  # "HND" or "NHD": the page's inner order

    def describe(self) -> str:
        return (
            f"{self.layers} layers x {self.kv_heads} KV heads x {self.head_dim} head dim, "
            f"{self.dtype_bytes}-byte elements, {self.block_tokens}-token blocks, {self.num_blocks} blocks, "
            f"page {self.page_bytes} B ({self.order}) every {self.stride_bytes} B "
            "(kv-fused: K and V in one page per layer)"
        )


def order_layers(names: list[str]) -> list[str]:
    """Layer names in model order (their layer index), ties and non-numbered names last."""

    def key(n: str) -> tuple[int, int, str]:
        nums = [int(p) for p in n.split(".") if p.isdigit()]
        return (0, nums[0], n) if nums else (1, 0, n)

    return sorted(names, key=key)


def derive_geometry(
    views: Mapping[str, LayerView],
    *,
    num_blocks: int,
    block_tokens: int,
    locate: Callable[[LayerView], int],
    kv_bytes: int,
    tp_size: int,
    tp_rank: int,
) -> DerivedGeometry:
    """kvring's geometry of vLLM's per-layer KV views [B, H, N, C] inside one KV memory of
    kv_bytes bytes; locate(view) is where the view's first byte lies in it (host: its
    address minus the memfd mapping's; GPU: see `cuda_ranges`), or < 0 when it is not in it.

    B is num_blocks manager blocks, or num_blocks * r kernel blocks when vLLM splits each
    block into r kernel blocks of block_tokens / r tokens (they must then be dense).
    Layers that alias one tensor (KV sharing) are counted once.
    """
    seen: dict[int, str] = {}
    names = []
    for n in order_layers(list(views)):
        if views[n].data_ptr in seen:
            continue  # a layer that reuses another's KV cache
        seen[views[n].data_ptr] = n
        names.append(n)
    if not names:
        raise KvLayoutError("vLLM registered no KV cache tensors")
    if len(names) > _lib.KVR_GEOM_MAX_REGIONS:
        raise KvLayoutError(f"{len(names)} KV layers; kvring describes at most {_lib.KVR_GEOM_MAX_REGIONS}")

    first = views[names[0]]
    regions: list[RegionSpec] = []
    page_bytes = stride_bytes = 0
    order = ""
    for n in names:
        v = views[n]
        if v.shape != first.shape or v.strides != first.strides or v.elem_bytes != first.elem_bytes:
            raise KvLayoutError(
                f"layer {n}: KV view {list(v.shape)} strides {list(v.strides)} differs from layer {names[0]}'s "
                f"{list(first.shape)} {list(first.strides)}: kvring needs one page size for every layer"
            )
        if len(v.shape) != 4:
            raise KvLayoutError(
                f"layer {n}: KV view of shape {list(v.shape)}; expected vLLM's [blocks, kv_heads, block_tokens, K+V]"
            )
        b, h, t, c = v.shape
        sb, sh, st, sc = v.strides
        # one kernel block of one layer must be one dense run: heads outside tokens (HND,
        # vLLM's CPU layout) or tokens outside heads (NHD, e.g. VLLM_KV_CACHE_LAYOUT=LBNHC)
        if sc == 1 and st == c and sh == t * c:
            order = "HND"
        elif sc == 1 and sh == c and st == h * c:
            order = "NHD"
        else:
            raise KvLayoutError(
                f"layer {n}: KV view {list(v.shape)} has strides {list(v.strides)}; kvring copies whole pages and "
                f"needs each block of a layer dense, as [kv_heads, block_tokens, row] (strides [*, {t * c}, {c}, 1]) "
                f"or [block_tokens, kv_heads, row] (strides [*, {c}, {h * c}, 1])"
            )
        if b % num_blocks:
            raise KvLayoutError(f"layer {n}: {b} blocks in the KV view is not a multiple of vLLM's {num_blocks} blocks")
        ratio = b // num_blocks
        kpage = h * t * c * v.elem_bytes
        if ratio > 1 and sb * v.elem_bytes != kpage:
            raise KvLayoutError(
                f"layer {n}: {ratio} kernel blocks per block are not adjacent (stride {sb * v.elem_bytes} B, "
                f"page {kpage} B)"
            )
        if ratio * t != block_tokens:
            raise KvLayoutError(
                f"layer {n}: {ratio} x {t}-token kernel blocks do not make vLLM's {block_tokens}-token block"
            )
        page = ratio * kpage
        stride = ratio * sb * v.elem_bytes
        if num_blocks > 1 and stride < page:
            raise KvLayoutError(f"layer {n}: blocks overlap (stride {stride} B < page {page} B)")
        off = locate(v)
        end = off + (num_blocks - 1) * stride + page
        if off < 0 or end > kv_bytes:
            raise KvLayoutError(
                f"layer {n}: its KV cache (at {v.data_ptr:#x}, {end - off} bytes) is not inside kvring's "
                f"{kv_bytes}-byte KV memory: vLLM did not allocate it inside the connector's get_mem_pool_context()"
            )
        page_bytes, stride_bytes = page, stride
        regions.append(RegionSpec(offset=off, stride=stride, page_bytes=page))

    b, h, t, c = first.shape
    if c % 2:
        raise KvLayoutError(f"KV row of {c} elements cannot hold equal K and V halves")
    head_dim = c // 2
    g = build_geometry(
        layers=len(names),
        kv_heads=h,
        head_dim=head_dim,
        dtype_bytes=first.elem_bytes,
        block_tokens=block_tokens,
        num_blocks=num_blocks,
        regions=regions,
        tp_size=tp_size,
        tp_rank=tp_rank,
    )
    validate_geometry(g, kv_bytes)
    return DerivedGeometry(
        g, len(names), h, head_dim, first.elem_bytes, block_tokens, num_blocks, page_bytes, stride_bytes, names, order
    )


# ---- CUDA: the KV offset space from the tensors' allocations ----------------------------------


@dataclass(frozen=True)
class SharedStorage:
    """What ``storage._share_cuda_()`` says about one CUDA storage (the first four fields
    of its tuple: device, cudaIpcMemHandle bytes, storage bytes, offset in the allocation)."""

    device: int
    ipc_handle: bytes
    nbytes: int
    alloc_offset: int

    @classmethod
    def from_share_cuda(cls, share: tuple[Any, ...]) -> SharedStorage:
        device, handle, size, offset = share[0], share[1], share[2], share[3]
        if not isinstance(handle, (bytes, bytearray)) or len(handle) != 64:
            raise KvLayoutError(f"_share_cuda_() gave a {type(handle).__name__} handle, not 64 bytes")
        return cls(int(device), bytes(handle), int(size), int(offset))


def cuda_ranges(storages: list[tuple[int, SharedStorage]], device_uuid: bytes) -> tuple[CudaKv, dict[int, int], int]:
    """The KV offset space of CUDA storages given as (storage data_ptr, SharedStorage):
    storages laid end to end, 4 KiB aligned, in address order.

    Returns the descriptor, storage data_ptr -> its kv_offset, and the space's size; a
    layer view then lies at where[v.storage_ptr] + (v.data_ptr - v.storage_ptr).
    """
    ranges = []
    where: dict[int, int] = {}
    kv = 0
    for ptr, s in sorted(storages, key=lambda x: x[0]):
        if ptr in where:
            continue
        where[ptr] = kv
        ranges.append(CudaKvRange(ipc_handle=s.ipc_handle, alloc_offset=s.alloc_offset, kv_offset=kv, nbytes=s.nbytes))
        kv += (s.nbytes + 4095) // 4096 * 4096
    return CudaKv(device_uuid=device_uuid, ranges=ranges), where, kv


def device_uuid(props: Any) -> bytes:
    """The 16 bytes of cudaDeviceProp.uuid from torch's device properties (torch shows
    it as text, "58fd..." or "GPU-58fd..."; some builds give an object with .bytes)."""
    raw = getattr(props.uuid, "bytes", None)
    if isinstance(raw, (bytes, bytearray)) and len(raw) == 16:
        return bytes(raw)
    text = str(props.uuid)
    for prefix in ("GPU-", "MIG-"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    try:
        return uuid.UUID(text).bytes
    except ValueError as e:
        raise KvLayoutError(f"cannot read the GPU's uuid from torch ({text!r})") from e


@contextmanager
def no_hook() -> Iterator[None]:
    """A context that does nothing (GPU workers allocate as vLLM always does)."""
    yield
