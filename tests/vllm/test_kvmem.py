"""Connector pieces that need no vLLM engine: config, memfd hook, geometry, CUDA descriptors.

- `config.parse`: an unknown key, a wrong type and a value out of range are refused
  naming the key;
- `MemfdKvPool`: inside the context vLLM's KV allocation (one 1-D int8 torch.zeros on
  the CPU) is a zero-filled tensor over a memfd that another mapping of the fd sees
  writes through; any other torch.zeros is torch's; torch.zeros is restored on exit;
- `derive_geometry`: from per-layer views laid out as vLLM lays them (layer-major and
  block-major, with and without kernel-block splitting, pages HND and NHD) the regions
  are exactly the byte ranges of each block of each layer (checked by writing distinct
  values through the view and reading the memfd at the region's offset); pages that are
  not one dense run, the wrong block size and tensors outside the memfd are refused with
  a reason;
- CUDA (no GPU needed): `SharedStorage.from_share_cuda` reads torch's _share_cuda_()
  tuple, `cuda_ranges` lays storages out in one KV offset space, `CudaKv.to_c` builds
  struct kvr_cuda_kv byte for byte, and libkvring's own check of the descriptor refuses a
  range past kv_bytes with its reason;
- the request-id hashes are stable (the scheduler and worker processes must agree).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from pathlib import Path

import kvtest as kt
import torch
from kvtest import check

import kvring
from kvring.vllm import config as kcfg
from kvring.vllm.kvmem import (
    KvLayoutError,
    LayerView,
    MemfdKvPool,
    SharedStorage,
    cuda_ranges,
    derive_geometry,
    device_uuid,
)
from kvring.vllm.metadata import lease_id, store_id


def refused(fn, needle: str, exc: type[BaseException] = Exception) -> str:
    try:
        fn()
    except exc as e:  # noqa: PERF203
        check(needle in str(e), f"refusal {e!r} does not say {needle!r}")
        return str(e)
    raise kt.TestFailure(f"accepted, want a refusal naming {needle!r}")


def test_config() -> None:
    c = kcfg.parse({"socket": "/tmp/x.sock", "engine_id": "e-1", "timeout_ms": 500, "test_wrong_blocks": False})
    check(c.socket == "/tmp/x.sock" and c.engine_id == "e-1" and c.timeout_ms == 500, f"parsed {c}")
    check(kcfg.parse(None) == kcfg.ConnectorConfig(), "defaults")
    refused(lambda: kcfg.parse({"sockt": "/x"}), "unknown key 'sockt'", kcfg.ConfigError)
    refused(lambda: kcfg.parse({"timeout_ms": "5"}), "timeout_ms: must be an integer", kcfg.ConfigError)
    refused(lambda: kcfg.parse({"timeout_ms": 0}), "timeout_ms: out of range", kcfg.ConfigError)
    refused(lambda: kcfg.parse({"socket": "rel.sock"}), "socket: must be an absolute path", kcfg.ConfigError)
    refused(lambda: kcfg.parse({"engine_id": "has space"}), "engine_id", kcfg.ConfigError)
    refused(lambda: kcfg.parse({"test_wrong_blocks": 1}), "test_wrong_blocks: must be true or false", kcfg.ConfigError)


def test_pool() -> None:
    orig = torch.zeros
    with MemfdKvPool() as pool:
        other = torch.zeros(16, dtype=torch.float32)
        kv = torch.zeros(1 << 20, dtype=torch.int8, device="cpu")
        again = torch.zeros(64, dtype=torch.int8)
    check(torch.zeros is orig, "torch.zeros not restored")
    check(pool.fd is not None and pool.nbytes == 1 << 20, f"pool: fd {pool.fd}, {pool.nbytes} bytes")
    # allocated up front, before anything touched it (a load never lands on a fresh page)
    held = os.fstat(pool.fd).st_blocks * 512
    check(held == 1 << 20 and pool.prefault_s is not None, f"the memfd holds {held} bytes of pages, want 1 MiB")
    check(kv.data_ptr() == pool.base and kv.numel() == 1 << 20 and not kv.any(), "the KV tensor is not the memfd's")
    check(
        other.dtype == torch.float32 and again.numel() == 64 and again.data_ptr() != pool.base,
        "other allocations went to the memfd",
    )
    kv[12345] = 77
    check(os.pread(pool.fd, 1, 12345) == bytes([77]), "a write through the tensor is not in the memfd")
    os.pwrite(pool.fd, bytes([5]), 999)
    check(int(kv[999]) == 5, "a write to the memfd is not seen through the tensor")
    pool.close()


def vllm_views(
    raw: torch.Tensor,
    layers: int,
    blocks: int,
    heads: int,
    tokens: int,
    row: int,
    block_major: bool,
    ratio: int = 1,
    nhd: bool = False,
    row_stride: int = 0,
) -> dict[str, torch.Tensor]:
    """Per-layer [B*ratio, H, N/ratio, C] float32 views of raw, as vLLM's create_kv_cache_views
    makes them: logical order always [B, H, N, C]; physically heads outside tokens (HND)
    or, with nhd, tokens outside heads; row_stride > row pads every row (not dense)."""
    page = heads * tokens * row * 4
    if block_major:
        layer_stride, block_stride = page, layers * page
    else:
        layer_stride, block_stride = blocks * page, page
    kt_tokens = tokens // ratio
    rs = row_stride or row
    inner = (rs, heads * rs) if nhd else (kt_tokens * rs, rs)  # strides of H and N
    out = {}
    f = raw.view(torch.float32)
    for layer in range(layers):
        out[f"model.layers.{layer}.self_attn.attn"] = torch.as_strided(
            f,
            (blocks * ratio, heads, kt_tokens, row),
            ((block_stride // ratio) // 4, *inner, 1),
            (layer * layer_stride) // 4,
        )
    return out


def test_geometry() -> None:
    layers, blocks, heads, tokens, row = 2, 6, 2, 32, 128
    page = heads * tokens * row * 4
    cases = [(bm, r, nhd) for bm in (False, True) for r in (1, 2) for nhd in (False, True) if not (bm and r > 1)]
    for block_major, ratio, nhd in cases:  # (vLLM itself refuses kernel splitting of block-outer layouts)
        with MemfdKvPool() as pool:
            raw = torch.zeros(layers * blocks * page, dtype=torch.int8)
        views = vllm_views(raw, layers, blocks, heads, tokens, row, block_major, ratio, nhd)
        lv = {n: LayerView.of(n, t) for n, t in views.items()}
        dg = derive_geometry(
            lv,
            num_blocks=blocks,
            block_tokens=tokens,
            locate=lambda v: v.data_ptr - pool.base,
            kv_bytes=pool.nbytes,
            tp_size=1,
            tp_rank=0,
        )
        g = dg.geometry
        check(
            g.n_regions == layers and g.block_tokens == tokens and g.kv_heads == heads and g.head_dim == row // 2,
            f"header: {dg.describe()}",
        )
        check(dg.order == ("NHD" if nhd else "HND"), f"page order {dg.order}")
        mm = mmap.mmap(pool.fd, pool.nbytes)
        for li, t in enumerate(views.values()):
            off, stride, pb, _ = g.region(li)
            check(pb == page, f"region {li}: page {pb}, want {page}")
            for b in (0, blocks - 1):
                tb = t.unflatten(0, (blocks, ratio))[b]  # [ratio, H, N, C]
                tb.copy_(torch.arange(tb.numel(), dtype=torch.float32).reshape(tb.shape) + li * 1e6 + b * 1e4)
                got = mm[off + b * stride : off + b * stride + pb]
                phys = tb.permute(0, 2, 1, 3) if nhd else tb  # the page's memory order
                want = phys.contiguous().numpy().tobytes()
                check(
                    got == want,
                    f"layer {li} block {b} (block_major={block_major}, ratio={ratio}, nhd={nhd}): the "
                    "region's bytes are not the view's block",
                )
        mm.close()
        pool.close()
    # refusals
    with MemfdKvPool() as pool:
        raw = torch.zeros(layers * blocks * page, dtype=torch.int8)
    views = vllm_views(raw, layers, blocks, heads, tokens, row, False)
    lv = {n: LayerView.of(n, t) for n, t in views.items()}
    loc = lambda v: v.data_ptr - pool.base  # noqa: E731
    refused(
        lambda: derive_geometry(
            lv, num_blocks=blocks, block_tokens=tokens, locate=loc, kv_bytes=pool.nbytes // 2, tp_size=1, tp_rank=0
        ),
        "not inside kvring's",
        KvLayoutError,
    )
    padded = vllm_views(raw, layers, blocks // 2, heads, tokens, row - 8, False, row_stride=row)
    pv = {n: LayerView.of(n, t) for n, t in padded.items()}
    refused(
        lambda: derive_geometry(
            pv, num_blocks=blocks // 2, block_tokens=tokens, locate=loc, kv_bytes=pool.nbytes, tp_size=1, tp_rank=0
        ),
        "needs each block of a layer dense",
        KvLayoutError,
    )
    refused(
        lambda: derive_geometry(
            lv, num_blocks=blocks, block_tokens=16, locate=loc, kv_bytes=pool.nbytes, tp_size=1, tp_rank=0
        ),
        "16-token block",
        KvLayoutError,
    )
    pool.close()


def test_cuda(sock: str) -> None:
    h1, h2 = bytes(range(64)), bytes(range(64, 128))
    share = (0, h1, 1 << 20, 4096, b"ref", 0, b"ev", False)  # torch's _share_cuda_() tuple shape
    s1 = SharedStorage.from_share_cuda(share)
    check((s1.device, s1.ipc_handle, s1.nbytes, s1.alloc_offset) == (0, h1, 1 << 20, 4096), f"{s1}")
    refused(lambda: SharedStorage.from_share_cuda((0, "nope", 1, 0)), "not 64 bytes", KvLayoutError)
    s2 = SharedStorage(0, h2, 5000, 0)
    uuid16 = bytes(range(200, 216))
    ck, where, size = cuda_ranges([(0x7000_0000, s2), (0x1000_0000, s1)], uuid16)
    check(where == {0x1000_0000: 0, 0x7000_0000: 1 << 20}, f"kv offsets {where}")
    check(size == (1 << 20) + 8192, f"KV offset space {size} bytes")
    desc, arr = ck.to_c()
    check(bytes(desc.device_uuid) == uuid16 and desc.n_ranges == 2, "descriptor header")
    check(
        bytes(desc.ranges[0].ipc_handle) == h1
        and desc.ranges[0].alloc_offset == 4096
        and desc.ranges[0].kv_offset == 0
        and desc.ranges[0].bytes == 1 << 20,
        "range 0",
    )
    check(
        bytes(desc.ranges[1].ipc_handle) == h2 and desc.ranges[1].kv_offset == 1 << 20 and desc.ranges[1].bytes == 5000,
        "range 1",
    )
    check(
        ctypes.sizeof(kvring._lib.CudaKvRange) == 88 and ctypes.sizeof(kvring._lib.CudaKv) == 32,
        "struct kvr_cuda_kv(_range) sizes",
    )
    overlap = kvring.CudaKv(uuid16, [kvring.CudaKvRange(h1, 0, 0, 8192), kvring.CudaKvRange(h2, 0, 4096, 8192)])
    refused(overlap.to_c, "overlaps", ValueError)
    # a layer view on the "GPU" located through the ranges
    lv = {
        "model.layers.0.attn": LayerView(
            "model.layers.0.attn", 0x7000_0000, (1, 1, 32, 8), (256, 256, 8, 1), 4, 0x7000_0000, 5000
        )
    }
    dg = derive_geometry(
        lv,
        num_blocks=1,
        block_tokens=32,
        kv_bytes=size,
        tp_size=1,
        tp_rank=0,
        locate=lambda v: where[v.storage_ptr] + v.data_ptr - v.storage_ptr,
    )
    check(dg.geometry.region(0)[0] == 1 << 20, f"GPU layer's region at {dg.geometry.region(0)[0]}")

    class Props:  # what torch.cuda.get_device_properties() shows of the uuid
        def __init__(self, u: object) -> None:
            self.uuid = u

    u = "58fd1c4e-0a1b-4c2d-8e9f-0123456789ab"
    check(
        device_uuid(Props(u)) == device_uuid(Props("GPU-" + u)) == bytes.fromhex(u.replace("-", "")),
        "device uuid from torch's text",
    )
    # libkvring checks the descriptor before anything reaches kvringd
    bad = kvring.CudaKv(uuid16, [kvring.CudaKvRange(h1, 0, 0, size + 1)])
    try:
        kvring.Worker(dg.geometry, -1, size, socket=sock, cuda_kv=bad, timeout_ms=2000)
    except kvring.KvringError as e:
        check(e.errno == errno.EINVAL and "cuda_kv range 0" in str(e), f"refusal: {e}")
    else:
        raise kt.TestFailure("libkvring accepted a CUDA range past kv_bytes")


def test_ids() -> None:
    # fixed values: blake2b, not Python's per-process salted hash()
    check(lease_id("req-1") == 0x9BA1DFA66B6A3312, f"lease_id('req-1') = {lease_id('req-1'):#x}")
    check(store_id("req-1") == 0xF51256AECE9A8BFF, f"store_id('req-1') = {store_id('req-1'):#x}")
    check(lease_id("req-2") != lease_id("req-1"), "ids of two requests collide")


def main(d: Path) -> None:
    test_config()
    test_pool()
    test_geometry()
    kv = kt.Kvringd(d)
    try:
        test_cuda(kv.socket)
    finally:
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc}")
    test_ids()


if __name__ == "__main__":
    kt.run(main, needs_vllm=True)
