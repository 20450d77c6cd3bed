"""Typed Python clients of kvringd: a `Worker` (one per engine rank) and a `Scheduler`.

These wrap libkvring's C API (include/kvring/kvring.h, the contract) one call for one
call; they add no threads, no queues and no retries. Every failing call raises
`KvringError`, whose ``errno`` is the C call's negative return negated and whose message
is ``kvr_last_error()``'s one-line reason (e.g. ``"geometry mismatch: block_tokens 16, the
instance serves 32 (model.block_tokens)"``).

    with Worker(geometry, kv_fd, kv_bytes, socket="/tmp/kvring.sock") as w:
        hit = w.lookup(req, tokens)                 # synchronous
        w.load(req, block_ids[:hit.matched_blocks]) # asynchronous
        for c in w.wait(timeout_ms=1000):            # completions
            ...

A client is used by one thread at a time (libkvring's rule). Tokens and block ids may be
any sequence of ints, an ``array.array('I')`` or a contiguous 32-bit numpy array/torch CPU
tensor (passed without a copy).
"""

from __future__ import annotations

import array
import ctypes
import errno as _errno
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _lib
from ._lib import Geometry

__all__ = [
    "MISS_REASONS",
    "KvringError",
    "ProtocolMismatch",
    "LookupResult",
    "LoadDiag",
    "Completion",
    "CudaKvRange",
    "Worker",
    "Scheduler",
    "OP_LOAD",
    "OP_STORE",
]

OP_LOAD = _lib.KVR_OP_LOAD_DONE
OP_STORE = _lib.KVR_OP_STORE_DONE


class KvringError(OSError):
    """A libkvring call failed: ``errno`` (positive) and kvr_last_error's reason."""

    def __init__(self, errno: int, message: str):
        super().__init__(errno, message)

    def __str__(self) -> str:
        name = _errno.errorcode.get(self.errno or 0, str(self.errno))
        return f"[{name}] {self.strerror}"


class ProtocolMismatch(KvringError):
    """Attach refused because kvringd speaks another protocol version (errno EPROTO).

    ``kvringd_protocol`` and ``protocol`` are the two versions (kvr_proto.h's
    KVR_PROTO_VERSION of each side); the message says which to upgrade.
    """

    def __init__(self, socket: str, kvringd_protocol: int, protocol: int, library_version: str):
        from . import __version__  # the package is fully imported by the time anyone attaches

        self.socket = socket
        self.kvringd_protocol = kvringd_protocol
        self.protocol = protocol
        msg = (
            f"kvringd at {socket} speaks protocol {kvringd_protocol}, this kvring {__version__} speaks "
            f"{protocol}: upgrade kvringd (or the kvring package) so both match"
        )
        if library_version != __version__:  # KVRING_LIB or KVR_BUILD_ROOT chose another build
            msg += f" (its libkvring {library_version} is {_lib.library_path()})"
        super().__init__(_errno.EPROTO, msg)


# libkvring's reason for a version mismatch at attach (client/client.c, recv_attach_reply)
_MISMATCH = re.compile(r"kvringd at (.+) speaks protocol (\d+), this libkvring (\S+) speaks (\d+)")


def _attach_error(rc: int, what: str, socket: str | None) -> KvringError:
    """The exception of a failed kvr_attach / kvr_attach_scheduler (its reason is
    kvr_last_error(NULL): the client is gone)."""
    reason = _lib.library().kvr_last_error(None).decode(errors="replace")
    m = _MISMATCH.search(reason) if rc == -_errno.EPROTO else None
    if m:
        return ProtocolMismatch(m.group(1), int(m.group(2)), int(m.group(4)), m.group(3))
    return KvringError(-rc, f"{what} to {socket or 'the default socket'}: {reason or os.strerror(-rc)}")


# enum kvr_miss_reason (include/kvring/kvring.h), by number
MISS_REASONS = ("none", "never_stored", "evicted", "in_flight", "quorum", "l2_failed", "no_room")


@dataclass(frozen=True)
class LookupResult:
    """What a lookup or lease found (struct kvr_lookup_result)."""

    matched_tokens: int
    matched_blocks: int
    l2_blocks: int
    hash_ns: int
    index_ns: int
    roundtrip_ns: int
    pending_blocks: int = 0  # lease only: blocks after the match a store is writing now
    miss_reason: int = 0  # lease only: enum kvr_miss_reason of the first block not matched (MISS_REASONS)

    @property
    def miss(self) -> str:
        """The miss reason's name: 'none' when every block matched (kvring.h, enum kvr_miss_reason)."""
        return MISS_REASONS[self.miss_reason] if self.miss_reason < len(MISS_REASONS) else "unknown"

    @classmethod
    def _from(cls, r: _lib.LookupResult) -> LookupResult:
        return cls(
            r.matched_tokens,
            r.matched_blocks,
            r.l2_blocks,
            r.hash_ns,
            r.index_ns,
            r.roundtrip_ns,
            r.pending_blocks,
            r.miss_reason,
        )


@dataclass(frozen=True)
class LoadDiag:
    """Per-load diagnostics (struct kvr_load_diag)."""

    bytes: int
    copies: int
    runs: int
    queue_ns: int
    copy_ns: int
    l1_hits: int
    l2_reads: int
    total_ns: int


@dataclass(frozen=True)
class Completion:
    """One finished load or store (struct kvr_completion, its failed list copied)."""

    req_id: int
    op: int  # OP_LOAD or OP_STORE
    status: int  # 0 or -errno (-EIO: some blocks failed, see `failed`)
    n_blocks: int
    failed: tuple[int, ...]  # engine block ids not restored / not stored
    n_stored: int
    n_present: int
    diag: LoadDiag

    @property
    def is_load(self) -> bool:
        return self.op == OP_LOAD

    @property
    def ok(self) -> bool:
        return self.status == 0 and not self.failed


@dataclass(frozen=True)
class CudaKvRange:
    """One piece of a CUDA allocation in the KV offset space (struct kvr_cuda_kv_range)."""

    ipc_handle: bytes  # cudaIpcMemHandle_t of the allocation's base, 64 bytes
    alloc_offset: int  # the range's first byte from the allocation's base
    kv_offset: int  # where the range lies in the KV offset space
    nbytes: int


@dataclass
class CudaKv:
    """GPU KV memory for `Worker`: the device's uuid and the ranges (struct kvr_cuda_kv)."""

    device_uuid: bytes  # 16 bytes, cudaDeviceProp.uuid
    ranges: list[CudaKvRange] = field(default_factory=list)

    def to_c(self) -> tuple[_lib.CudaKv, Any]:
        """The C descriptor and the array it points to (keep both alive while in use)."""
        if len(self.device_uuid) != 16:
            raise ValueError(f"device_uuid must be 16 bytes, got {len(self.device_uuid)}")
        if not 1 <= len(self.ranges) <= 4096:
            raise ValueError(f"a CUDA KV descriptor takes 1..4096 ranges, got {len(self.ranges)}")
        arr = (_lib.CudaKvRange * len(self.ranges))()
        prev_end = 0
        for i, r in enumerate(sorted(self.ranges, key=lambda r: r.kv_offset)):
            if len(r.ipc_handle) != 64:
                raise ValueError(f"range {i}: an IPC handle is 64 bytes, got {len(r.ipc_handle)}")
            if r.nbytes <= 0:
                raise ValueError(f"range {i}: bytes must be > 0")
            if r.kv_offset < prev_end:
                raise ValueError(f"range {i} at KV offset {r.kv_offset} overlaps the previous one (ends {prev_end})")
            prev_end = r.kv_offset + r.nbytes
            ctypes.memmove(arr[i].ipc_handle, r.ipc_handle, 64)
            arr[i].alloc_offset = r.alloc_offset
            arr[i].kv_offset = r.kv_offset
            arr[i].bytes = r.nbytes
        desc = _lib.CudaKv()
        ctypes.memmove(desc.device_uuid, self.device_uuid, 16)
        desc.n_ranges = len(self.ranges)
        desc.ranges = ctypes.cast(arr, ctypes.POINTER(_lib.CudaKvRange))
        return desc, arr


# ---- argument conversion ---------------------------------------------------------------

_U32P = ctypes.POINTER(ctypes.c_uint32)


def _u32_array(values: Any) -> tuple[Any, int, Any]:
    """(pointer, count, keep-alive) for a sequence of uint32 values.

    A buffer of 4-byte items (array('I'/'i'), numpy uint32/int32, a torch CPU int32
    tensor via .numpy()) is passed as is; anything else is copied into an array('I').
    """
    if hasattr(values, "numpy") and hasattr(values, "is_contiguous"):  # a torch tensor
        values = values.numpy()
    try:
        mv = memoryview(values)
    except TypeError:
        mv = None
    if mv is not None and mv.itemsize == 4 and mv.format in ("I", "i", "=I", "=i", "<I", "<i") and mv.c_contiguous:
        n = mv.nbytes // 4
        if n == 0:
            return None, 0, None
        buf = (ctypes.c_char * mv.nbytes).from_buffer(mv) if not mv.readonly else None
        if buf is None:  # read-only buffers cannot be from_buffer'd: copy
            arr = array.array("I", mv.cast("B").cast("I"))
            addr, n = arr.buffer_info()
            return ctypes.cast(addr, _U32P), n, arr
        return ctypes.cast(buf, _U32P), n, (buf, mv)
    arr = array.array("I", values)
    addr, n = arr.buffer_info()
    return (ctypes.cast(addr, _U32P) if n else None), n, arr


def _extra(extra: bytes | None) -> tuple[Any, int]:
    if not extra:
        return None, 0
    return ctypes.c_char_p(extra), len(extra)


def _bstr(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


# ---- clients ---------------------------------------------------------------------------


class _Client:
    """What workers and schedulers share: the handle, errors, detach, context manager."""

    _kind = "client"

    def __init__(self) -> None:
        self._lib = _lib.library()
        self._c: ctypes.c_void_p | None = None
        self.detach_error = ""

    def _handle(self) -> ctypes.c_void_p:
        if self._c is None:
            raise KvringError(_errno.EBADF, f"this kvring {self._kind} is detached")
        return self._c

    def _error(self, rc: int, what: str) -> KvringError:
        reason = self._lib.kvr_last_error(self._c).decode(errors="replace") if self._c else ""
        reason = reason or os.strerror(-rc)
        word = what.split()[0]
        return KvringError(-rc, reason if reason.startswith(word) else f"{what}: {reason}")

    def _check(self, rc: int, what: str) -> int:
        if rc < 0:
            raise self._error(rc, what)
        return rc

    def _fn(self, name: str) -> Any:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise KvringError(
                _errno.ENOSYS, f"{_lib.library_path()} has no {name}: this libkvring is older than the Python package"
            )
        return fn

    @property
    def attached(self) -> bool:
        return self._c is not None

    def gone(self) -> bool:
        """Whether kvringd is gone (kvr_poll with nothing to collect: -EPIPE once the
        attach connection closed and every completion was handed out)."""
        if self._c is None:
            return True
        return self._lib.kvr_poll(self._c, None, 0) == -_errno.EPIPE

    @property
    def block_tokens(self) -> int:
        """Tokens per block of the instance."""
        return int(self._fn("kvr_block_tokens")(self._handle()))

    def detach(self) -> int:
        """Detach (idempotent). A worker's detach is fenced: it returns once nothing of its
        loads and stores can still read or write its KV memory (kvr_detach). Returns 0, or
        -errno when kvringd did not confirm that in time (`detach_error` says why); the
        client is detached either way."""
        self.detach_error = ""
        if self._c is None:
            return 0
        c, self._c = self._c, None
        rc = int(self._lib.kvr_detach(c))
        if rc < 0:
            self.detach_error = self._lib.kvr_last_error(None).decode(errors="replace") or os.strerror(-rc)
        return rc

    def close(self) -> int:
        return self.detach()

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __del__(self) -> None:
        try:
            self.detach()
        except Exception:
            pass


class Worker(_Client):
    """An attached worker: one engine rank with its KV memory shared with kvringd.

    Host KV memory: `kv_fd` is a memfd created with MFD_ALLOW_SEALING (kvringd seals it
    against shrinking at attach) of `kv_bytes` bytes. GPU KV memory: pass `cuda_kv`;
    `kv_bytes` is then the size of the KV offset space the geometry indexes.
    """

    _kind = "worker"

    def __init__(
        self,
        geometry: Geometry,
        kv_fd: int,
        kv_bytes: int,
        *,
        socket: str | None = None,
        timeout_ms: int = 0,
        engine_id: str | None = None,
        model_ns: str | None = None,
        cuda_kv: CudaKv | None = None,
    ) -> None:
        super().__init__()
        self.geometry = geometry
        self._keep: list[Any] = []
        opts = _lib.AttachOpts(
            socket=_bstr(socket),
            geometry=ctypes.pointer(geometry),
            kv_fd=kv_fd,
            kv_bytes=kv_bytes,
            timeout_ms=timeout_ms,
            engine_id=_bstr(engine_id),
            model_ns=_bstr(model_ns),
        )
        if cuda_kv is not None:
            desc, arr = cuda_kv.to_c()
            self._keep += [desc, arr]
            opts.cuda_kv = ctypes.pointer(desc)
        c = ctypes.c_void_p()
        rc = self._lib.kvr_attach(ctypes.byref(opts), ctypes.byref(c))
        if rc < 0:
            raise _attach_error(rc, "attach", socket)
        self._c = c
        self._cbuf = (_lib.Completion * 64)()

    @property
    def slot(self) -> int:
        """Worker slot assigned at attach."""
        return int(self._lib.kvr_worker_slot(self._handle()))

    @property
    def inflight(self) -> int:
        """Requests submitted and not yet completed."""
        return int(self._lib.kvr_inflight(self._handle()))

    def rank_tokens(self, n_tokens: int) -> int:
        """Tokens of the first n_tokens this rank holds (n_tokens without DCP)."""
        return int(self._lib.kvr_rank_tokens(self._handle(), n_tokens))

    def lookup(self, req_id: int, tokens: Sequence[int] | Any, extra: bytes | None = None) -> LookupResult:
        """Synchronous prefix lookup; remembers the match under req_id for `load`."""
        p, n, keep = _u32_array(tokens)
        e, elen = _extra(extra)
        r = _lib.LookupResult()
        self._check(self._lib.kvr_lookup(self._handle(), req_id, p, n, e, elen, ctypes.byref(r)), "lookup")
        del keep
        return LookupResult._from(r)

    def lease_take(self, lease_id: int) -> LookupResult:
        """Fetch this rank's slots of a scheduler's lease for a following `load(lease_id, ...)`.

        Raises KvringError(ENOENT) when the lease ended (recompute those tokens)."""
        r = _lib.LookupResult()
        self._check(self._fn("kvr_lease_take")(self._handle(), lease_id, ctypes.byref(r)), f"lease_take {lease_id:#x}")
        return LookupResult._from(r)

    def cancel(self, req_id: int) -> int:
        """Cancel req_id's loads and stores in flight (kvr_cancel). Each still completes
        through `poll`/`wait` (-ECANCELED, or its own result if it finished first), and that
        completion is the moment its blocks are the engine's again. Returns how many were
        in flight (0: nothing to wait for)."""
        return self._check(self._fn("kvr_cancel")(self._handle(), req_id), f"cancel {req_id:#x}")

    def load(self, req_id: int, block_ids: Sequence[int] | Any, layered: bool = False) -> None:
        """Load the first len(block_ids) matched blocks of req_id into those engine blocks
        (asynchronous: completes through `poll`/`wait`). With layered, the loader copies
        them layer by layer and `wait_layers` can return before the load completed
        (kvr_load_layered)."""
        p, n, keep = _u32_array(block_ids)
        if layered:
            self._check(self._fn("kvr_load_layered")(self._handle(), req_id, p, n), "load_layered")
        else:
            self._check(self._lib.kvr_load(self._handle(), req_id, p, n), "load")
        del keep

    def wait_layers(self, n_layers: int, timeout_ms: int) -> None:
        """Wait until layers 0..n_layers-1 of every layered load in flight are in place, or
        its load completed (its completion, from `poll`/`wait`, says how). Raises
        KvringError(ETIMEDOUT) (kvr_wait_layers)."""
        self._check(self._fn("kvr_wait_layers")(self._handle(), n_layers, timeout_ms), "wait_layers")

    def store(
        self,
        req_id: int,
        tokens: Sequence[int] | Any,
        block_ids: Sequence[int] | Any,
        extra: bytes | None = None,
    ) -> None:
        """Store the full blocks of tokens from those engine blocks (asynchronous)."""
        tp, tn, tkeep = _u32_array(tokens)
        bp, bn, bkeep = _u32_array(block_ids)
        e, elen = _extra(extra)
        self._check(self._lib.kvr_store(self._handle(), req_id, tp, tn, e, elen, bp, bn), "store")
        del tkeep, bkeep

    def store_cuda(
        self,
        req_id: int,
        tokens: Sequence[int] | Any,
        block_ids: Sequence[int] | Any,
        ipc_event: bytes | None,
        extra: bytes | None = None,
    ) -> None:
        """`store` for CUDA KV memory: the copy waits for ipc_event (64 bytes,
        cudaIpcEventHandle_t); keep the event alive until this store's completion."""
        if ipc_event is not None and len(ipc_event) != 64:
            raise ValueError(f"an IPC event handle is 64 bytes, got {len(ipc_event)}")
        tp, tn, tkeep = _u32_array(tokens)
        bp, bn, bkeep = _u32_array(block_ids)
        e, elen = _extra(extra)
        ev = ctypes.c_char_p(ipc_event) if ipc_event is not None else None
        self._check(
            self._fn("kvr_store_cuda")(self._handle(), req_id, tp, tn, e, elen, bp, bn, ev),
            "store_cuda",
        )
        del tkeep, bkeep

    def _collect(self, n: int) -> list[Completion]:
        out = []
        for i in range(n):
            c = self._cbuf[i]
            failed = tuple(c.failed[j] for j in range(c.n_failed)) if c.n_failed and c.failed else ()
            d = c.diag
            out.append(
                Completion(
                    c.req_id,
                    c.op,
                    c.status,
                    c.n_blocks,
                    failed,
                    c.n_stored,
                    c.n_present,
                    LoadDiag(d.bytes, d.copies, d.runs, d.queue_ns, d.copy_ns, d.l1_hits, d.l2_reads, d.total_ns),
                )
            )
        return out

    def poll(self) -> list[Completion]:
        """Completions ready now (never blocks). Raises EPIPE once kvringd is gone and
        every completion was collected."""
        n = self._check(self._lib.kvr_poll(self._handle(), self._cbuf, len(self._cbuf)), "poll")
        return self._collect(n)

    def wait(self, timeout_ms: int) -> list[Completion]:
        """As `poll`, waiting up to timeout_ms for at least one."""
        n = self._check(self._lib.kvr_wait(self._handle(), self._cbuf, len(self._cbuf), timeout_ms), "wait")
        return self._collect(n)


class Scheduler(_Client):
    """A scheduler client: no KV memory, no worker slot; looks prefixes up and leases them
    for the engine's workers (kvr_attach_scheduler)."""

    _kind = "scheduler"

    def __init__(
        self,
        *,
        socket: str | None = None,
        engine_id: str | None = None,
        model_ns: str | None = None,
        timeout_ms: int = 0,
    ) -> None:
        super().__init__()
        fn = self._fn("kvr_attach_scheduler")
        opts = _lib.SchedOpts(
            socket=_bstr(socket), engine_id=_bstr(engine_id), model_ns=_bstr(model_ns), timeout_ms=timeout_ms
        )
        c = ctypes.c_void_p()
        rc = fn(ctypes.byref(opts), ctypes.byref(c))
        if rc < 0:
            raise _attach_error(rc, "scheduler attach", socket)
        self._c = c

    def lease(
        self,
        lease_id: int,
        tokens: Sequence[int] | Any,
        extra: bytes | None = None,
        *,
        loaders: int = 0,
        ttl_ms: int = 0,
    ) -> LookupResult:
        """Look tokens up and pin the longest stored prefix under lease_id for `loaders`
        workers (0 = the model's tp_size), for at most ttl_ms (0 = 30 s)."""
        p, n, keep = _u32_array(tokens)
        e, elen = _extra(extra)
        opts = _lib.LeaseOpts(loaders=loaders, ttl_ms=ttl_ms)
        r = _lib.LookupResult()
        self._check(
            self._fn("kvr_lease")(self._handle(), lease_id, p, n, e, elen, ctypes.byref(opts), ctypes.byref(r)),
            f"lease {lease_id:#x}",
        )
        del keep
        return LookupResult._from(r)

    def lease_release(self, lease_id: int) -> None:
        """Drop a lease (a lease already gone is fine)."""
        self._check(self._fn("kvr_lease_release")(self._handle(), lease_id), f"lease_release {lease_id:#x}")
