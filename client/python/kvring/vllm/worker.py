"""The worker half of the connector: KV memory, loads before the forward, stores after it.

Runs in every vLLM worker process (one per TP rank), attached to kvringd as a *worker*
of the engine: kvringd starts a loader and a storer for it that copy blocks directly
between the L1 arena and this rank's KV memory.

Life of a worker:
1. ``get_mem_pool_context()`` -> `MemfdKvPool` (CPU): vLLM's KV allocation lands in a
   memfd (GPU: vLLM allocates as usual and the CUDA allocations are exported instead).
2. ``register_kv_caches()`` -> the geometry from the real tensors, then kvr_attach with
   the memfd (GPU: the IPC handles). A failure here stops vLLM from starting, with the
   reason.
3. Every step, ``start_load_kv()``: for each request the scheduler leased, kvr_lease_take
   + kvr_load into the request's blocks, then wait for those loads (vLLM runs the forward
   right after, reading them). Blocks that did not load are reported by
   ``get_block_ids_with_load_errors()`` in the same step; vLLM then recomputes from the
   first of them.
   With layered loads (``layered_loads``, docs/vllm.md) start_load_kv only submits them
   (kvr_load_layered) and returns; ``wait_for_layer_load(layer)``, which vLLM calls before
   each attention layer, waits until that layer of every load is in place, and the last
   layer's wait collects the completions as the plain step does.
4. Every step, ``wait_for_save()``, right after the forward pass: the prompts that pass
   completed are stored (the metadata's *saves*), in the step that computed them; on CUDA
   the store's event is recorded after the forward's kernels. Deferred stores (requests
   that finished; the metadata's *stores*) are submitted at the step's start
   (``handle_preemptions()``, before the forward; else at the next hook). Stores complete
   in the background.
5. ``get_finished()``: a finished request whose store completed is reported as
   finished_sending, and vLLM frees its blocks. A request vLLM preempted while its store
   is in flight is fenced in ``handle_preemptions()``: its blocks are back in vLLM's pool
   and the step's forward may write them, so the store must end first (done, failed, or
   cancelled after timeout_ms and its cancel answered).

kvringd going away (or restarting) fails the calls with EPIPE: the worker detaches, every
store in flight is reported finished (nothing is stored), loads fail (recomputed), and
it attaches again with the same KV memory and geometry — at once when the next call
needs it, then at most every reattach_interval_ms.

Fences (docs/api.md): a request's blocks are handed back to vLLM only once kvring said
nothing of its load or store can touch them any more — its completion came (success,
failure, -ECANCELED, or the -EPIPE libkvring reports once a dead actor or kvringd's actors
have exited), or a fenced detach returned. A load a live loader has not finished within
timeout_ms is cancelled (kvr_cancel: it stops before its next copy chunk) and its blocks
recomputed once the cancel completed, before the forward pass reads them; a store not
finished within timeout_ms is cancelled and its blocks freed when the cancel completed
(nothing of it is committed). Shutdown cancels what is left and detaches, fenced.
"""

from __future__ import annotations

import collections
import errno
import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from ..client import Completion, CudaKv, KvringError, Worker
from .config import ConnectorConfig
from .kvmem import (
    DerivedGeometry,
    KvLayoutError,
    LayerView,
    MemfdKvPool,
    SharedStorage,
    cuda_ranges,
    derive_geometry,
    device_uuid,
)
from .metadata import KvringConnectorMetadata, LoadSpec, StoreSpec
from .reattach import ReattachLog

STATS_EVERY_S = 60  # a summary of the load steps at most this often (INFO)
# layered_loads "auto": what measured faster per KV memory backend (docs/benchmarks.md,
# "Layer-ordered loads"); CUDA: on, the reason the feature exists (the copy of later layers
# overlaps the forward pass of earlier ones), not yet measured on a GPU
LAYERED_DEFAULT = {"cpu": False, "cuda": True}

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = ["WorkerSide"]

log = logging.getLogger("vllm.kvring")  # under vllm: its handler and format


class WorkerSide:
    def __init__(
        self,
        cfg: ConnectorConfig,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig | None,
        engine_id: str,
        tp_rank: int,
        tp_size: int,
    ) -> None:
        self.cfg = cfg
        self.engine_id = engine_id
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.block_size = int(vllm_config.cache_config.block_size)
        self.kv_cache_config = kv_cache_config
        self.device_type = str(getattr(vllm_config.device_config, "device_type", "cpu") or "cpu")
        self._pool: MemfdKvPool | None = None
        self._client: Worker | None = None
        self._attach_kw: dict[str, Any] | None = None
        self.derived: DerivedGeometry | None = None
        self._next_attach = 0.0
        self._reattach = ReattachLog(log, f"TP rank {self.tp_rank}", self.cfg.socket, self.cfg.reattach_interval_ms)
        self._load_errors: set[int] = set()
        self._stores: dict[int, str] = {}  # kvring store id -> vLLM request id, in flight
        self._store_t: dict[int, float] = {}  # store id -> when it was submitted (monotonic)
        self._cancelled: set[int] = set()  # store ids cancelled, completion not yet in
        self._events: dict[int, Any] = {}  # store id -> its CUDA IPC event (kept until completion)
        self._done: set[str] = set()  # stores completed (or given up), not yet reported
        self._finished: collections.OrderedDict[str, None] = collections.OrderedDict()  # finished, seen
        self._load_ns: list[int] = []  # per step with loads: start_load_kv's load time (submit to all done)
        self._step_bytes = 0  # the current load step's bytes and copy time (completions' diagnostics)
        self._step_copy_ns = 0
        self._stats_next = time.monotonic() + STATS_EVERY_S
        self._stats_mark = 0
        self._waiting: dict[int, LoadSpec] = {}  # this step's loads in flight, by lease id
        self._null = 0  # this step's null block
        self._stores_of: KvringConnectorMetadata | None = None  # the step whose deferred stores were submitted
        self.stats: collections.Counter[str] = collections.Counter()
        # layered loads: on for this worker, the layer index of each KV layer name, and the
        # step whose layered loads are in flight (its start and deadline), the layers of it
        # known in place, whether vLLM called wait_for_layer_load in it
        self._layered = False
        self._layer_index: dict[str, int] = {}
        self._layer_step: tuple[KvringConnectorMetadata, int, float] | None = None
        self._layers_ready = 0
        self._layer_waited = False

    # ---- KV memory and attach ----

    def mem_pool_context(self) -> MemfdKvPool | None:
        if self.device_type != "cpu":
            return None  # GPU: vLLM allocates as usual; register_kv_caches exports IPC handles
        if self._pool is not None:
            self._pool.close()
        self._pool = MemfdKvPool(name=f"kvring-kv-tp{self.tp_rank}")
        return self._pool

    def _num_blocks(self) -> int:
        cfg = self.kv_cache_config
        if cfg is None:
            raise KvLayoutError("vLLM gave the connector no KV cache config")
        groups = getattr(cfg, "kv_cache_groups", [])
        if len(groups) != 1:
            raise KvLayoutError(
                f"the model has {len(groups)} KV cache groups (hybrid attention); "
                "kvring handles one full-attention group"
            )
        return int(cfg.num_blocks)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if not kv_caches:
            raise KvLayoutError("vLLM registered no KV cache tensors")
        views = {n: LayerView.of(n, t) for n, t in kv_caches.items()}
        dev = next(iter(kv_caches.values())).device
        num_blocks = self._num_blocks()
        if dev.type == "cpu":
            pool = self._pool
            if pool is None or pool.fd is None:
                raise KvLayoutError(
                    "vLLM's KV cache was not allocated inside the connector's get_mem_pool_context() (no memfd "
                    "holds it), so kvringd cannot map it; this vLLM version allocates differently"
                )
            base, size = pool.base, pool.nbytes
            self.derived = derive_geometry(
                views,
                num_blocks=num_blocks,
                block_tokens=self.block_size,
                locate=lambda v: v.data_ptr - base,
                kv_bytes=size,
                tp_size=self.tp_size,
                tp_rank=self.tp_rank,
            )
            self._attach_kw = dict(kv_fd=pool.fd, kv_bytes=size, cuda_kv=None)
            if pool.prefault_s is not None:
                log.info(
                    "kvring: TP rank %d: %d MiB of KV memory allocated up front in %.0f ms",
                    self.tp_rank,
                    size >> 20,
                    pool.prefault_s * 1e3,
                )
        elif dev.type == "cuda":
            cuda_kv, where, size = self._export_cuda(kv_caches, dev)
            self.derived = derive_geometry(
                views,
                num_blocks=num_blocks,
                block_tokens=self.block_size,
                locate=lambda v: where[v.storage_ptr] + (v.data_ptr - v.storage_ptr) if v.storage_ptr in where else -1,
                kv_bytes=size,
                tp_size=self.tp_size,
                tp_rank=self.tp_rank,
            )
            self._attach_kw = dict(kv_fd=-1, kv_bytes=size, cuda_kv=cuda_kv)
        else:
            raise KvLayoutError(f"KV cache on a {dev.type} device: kvring serves CPU and CUDA workers")
        log.info("kvring: TP rank %d/%d KV memory: %s", self.tp_rank, self.tp_size, self.derived.describe())
        self._layer_index = {n: i for i, n in enumerate(self.derived.layer_names)}
        mode = self.cfg.layered_loads
        self._layered = mode == "on" or (mode == "auto" and LAYERED_DEFAULT.get(dev.type, False))
        # EAGAIN: kvringd lays L1 out again for this engine's block format (no engine was
        # attached, docs/engines.md), or lays it out for a sibling rank right now: a moment
        deadline = time.monotonic() + max(self.cfg.timeout_ms, 10000) / 1000
        while True:
            try:
                self._client = self._new_client()
                break
            except KvringError as e:
                if e.errno == errno.EAGAIN and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise RuntimeError(
                    f"kvring: TP rank {self.tp_rank} cannot attach to kvringd at {self.cfg.socket}: {e}"
                ) from e
        log.info(
            "kvring: TP rank %d attached to %s as worker slot %d (engine %s)",
            self.tp_rank,
            self.cfg.socket,
            self._client.slot,
            self.engine_id,
        )

    @staticmethod
    def _export_cuda(kv_caches: dict[str, torch.Tensor], dev: torch.device) -> tuple[CudaKv, dict[int, int], int]:
        storages = []
        for t in kv_caches.values():
            st = t.untyped_storage()
            storages.append((st.data_ptr(), SharedStorage.from_share_cuda(st._share_cuda_())))
        return cuda_ranges(storages, device_uuid(torch.cuda.get_device_properties(dev)))

    def _new_client(self) -> Worker:
        assert self.derived is not None and self._attach_kw is not None
        return Worker(
            self.derived.geometry,
            socket=self.cfg.socket,
            timeout_ms=self.cfg.timeout_ms,
            engine_id=self.engine_id,
            model_ns=self.cfg.model_ns,
            **self._attach_kw,
        )

    def _lost(self, e: KvringError) -> None:
        """kvringd went away: give up what is in flight (libkvring failed it) and detach."""
        if self._client is None:
            return
        log.warning(
            "kvring: TP rank %d lost kvringd (%s): %d stores given up; loads miss until it attaches again",
            self.tp_rank,
            e,
            len(self._stores),
        )
        self.stats["lost"] += 1
        self._done.update(self._stores.values())
        self._stores.clear()
        self._store_t.clear()
        self._cancelled.clear()
        self._events.clear()
        self._detach("kvringd went away")
        self._next_attach = 0.0

    def _detach(self, why: str) -> None:
        """Detach, fenced: when it returns 0 nothing of ours can touch the KV memory."""
        c, self._client = self._client, None
        self._next_attach = 0.0
        if c is not None and c.detach() < 0:
            log.error(
                "kvring: TP rank %d detached (%s) but kvringd did not confirm its loader and storer stopped: %s",
                self.tp_rank,
                why,
                c.detach_error,
            )
            self.stats["unfenced_detach"] += 1

    def _get_client(self, now: bool = False) -> Worker | None:
        if self._client is None and self.derived is not None and (now or time.monotonic() >= self._next_attach):
            try:
                self._client = self._new_client()
                self._reattach.attached(f" (worker slot {self._client.slot})")
                self.stats["reattached"] += 1
            except KvringError as e:
                self._next_attach = time.monotonic() + self.cfg.reattach_interval_ms / 1000
                self._reattach.failed(e)
        return self._client

    # ---- loads ----

    def _targets(self, spec: LoadSpec, null_block: int) -> list[int]:
        """Engine block per leased block: the null block for what vLLM holds itself."""
        own = list(spec.block_ids[spec.skip :])
        if self.cfg.test_wrong_blocks and len(own) >= 2:
            # Negative control: leased block i goes into the request's block i+1 and its
            # first block is left as it is. (Rotating the blocks would not do: attention
            # sums over the prefix's keys in any order, so a permuted prefix computes the
            # same thing; a shifted one misses a block and holds another twice.)
            own = own[1:]
        return [null_block] * spec.skip + own

    def _take_and_load(self, spec: LoadSpec, targets: list[int]) -> int:
        """Submit one lease's load; returns the blocks submitted (the rest failed)."""
        for attempt in (0, 1):
            c = self._get_client(now=attempt == 1)
            if c is None:
                return 0
            try:
                r = c.lease_take(spec.lease_id)
                n = min(r.matched_blocks, len(targets))
                if n:
                    c.load(spec.lease_id, targets[:n], layered=self._layered)
                return n
            except KvringError as e:
                if e.errno == errno.EPIPE:
                    if self._epipe(e) and attempt == 0:
                        continue  # kvringd restarted: attach to the new one, take the lease there
                    if self._client is not None:
                        log.warning("kvring: load of request %s: %s; recomputing", spec.req_id, e)
                elif e.errno == errno.ENOENT:
                    log.warning(
                        "kvring: lease of request %s is gone (%s): recomputing its %d blocks",
                        spec.req_id,
                        e,
                        len(targets) - spec.skip,
                    )
                else:
                    log.warning("kvring: load of request %s failed (%s): recomputing", spec.req_id, e)
                return 0
        return 0

    def handle_preemptions(self, meta: KvringConnectorMetadata) -> None:
        """The step's first hook (before its forward pass): fence the preempted requests'
        stores, then submit the deferred stores."""
        if meta.fence:
            self._fence(meta.fence)
        self._submit_deferred(meta)

    def start_load_kv(self, meta: KvringConnectorMetadata) -> None:
        self._submit_deferred(meta)
        if meta.loads and self._layered:
            self._layered_begin(meta)
        elif meta.loads:
            self._load(meta)

    # ---- layered loads: submitted at the step's start, waited for layer by layer ----

    def _layered_begin(self, meta: KvringConnectorMetadata) -> None:
        t0 = time.perf_counter_ns()
        self._step_bytes = self._step_copy_ns = 0
        self._submit_loads(meta)
        self._layer_step = (meta, t0, time.monotonic() + self.cfg.timeout_ms / 1000)
        self._layers_ready = 0
        self._layer_waited = False
        if not self._waiting:
            self._layered_end()

    def wait_for_layer_load(self, layer_name: str) -> None:
        """vLLM, before the attention of layer_name: return once that layer of every load of
        the step is in place. The last layer's call (or a layer kvring does not know) ends
        the step's loads as a plain step does: completions collected, late loads cancelled."""
        if self._layer_step is None:
            return
        self._layer_waited = True
        self.stats["layer_waits"] += 1
        i = self._layer_index.get(layer_name)
        if i is None or i + 1 >= len(self._layer_index):
            self._layered_end()
            return
        if i < self._layers_ready:
            return
        c = self._client
        left_ms = int((self._layer_step[2] - time.monotonic()) * 1000)
        if c is None or left_ms <= 0:
            self._layered_end()
            return
        try:
            c.wait_layers(i + 1, left_ms)
            self._layers_ready = i + 1
        except KvringError:
            self._layered_end()  # timed out (it cancels) or kvringd went away

    def _layered_end(self) -> None:
        step = self._layer_step
        if step is None:
            return
        self._layer_step = None
        meta, t0, _ = step
        if not self._layer_waited and self._waiting:
            # vLLM ran this step's forward without asking for a layer (a backend that does
            # not call wait_for_layer_load): what it read may not have landed. Fail the
            # step's loaded blocks (vLLM recomputes them and drops the step's result for
            # those requests) and load whole from now on.
            log.error(
                "kvring: TP rank %d: vLLM did not call wait_for_layer_load in a step with layered loads; "
                "their blocks are recomputed and layered_loads is off from now on",
                self.tp_rank,
            )
            for spec in self._waiting.values():
                self._fail_blocks(self._targets(spec, meta.null_block), meta.null_block)
            self._layered = False
        elif not self.stats["layered_steps"]:
            log.info(
                "kvring: TP rank %d: layered loads: the first step's %d loads were waited for layer by layer "
                "(%d layer waits, %d layers in place before the last)",
                self.tp_rank,
                len(self._waiting),
                self.stats["layer_waits"],
                self._layers_ready,
            )
        self.stats["layered_steps"] += 1
        try:
            self._collect_loads(meta, deadline=step[2])
        finally:
            self._load_done_step(meta, t0)

    def wait_for_save(self, meta: KvringConnectorMetadata) -> None:
        """After the step's forward pass: store the prompts it completed (in this step, not
        the next: a decode engine waiting for them waits for the copy alone)."""
        self._layered_end()  # layered loads no layer wait ended (normally the last layer's did)
        self._submit_deferred(meta)
        if meta.saves:
            self._store(meta.saves, same_step=True)

    def _submit_deferred(self, meta: KvringConnectorMetadata) -> None:
        """Submit the step's deferred stores once, at whichever hook of the step comes first."""
        if meta is self._stores_of:
            return
        self._stores_of = meta
        if meta.stores:
            self._store(meta.stores)

    def _load(self, meta: KvringConnectorMetadata) -> None:
        t0 = time.perf_counter_ns()
        self._step_bytes = self._step_copy_ns = 0
        try:
            self._submit_loads(meta)
            self._collect_loads(meta, deadline=time.monotonic() + self.cfg.timeout_ms / 1000)
        finally:
            self._load_done_step(meta, t0)

    def _load_done_step(self, meta: KvringConnectorMetadata, t0: int) -> None:
        """A step's loads are over: its time and bytes into the statistics."""
        self._waiting.clear()
        dt = time.perf_counter_ns() - t0
        self._load_ns.append(dt)
        if len(self._load_ns) > 20000:
            del self._load_ns[:10000]
            self._stats_mark = max(0, self._stats_mark - 10000)
        self.stats["load_bytes"] += self._step_bytes
        # what a slow step was made of: under concurrency several prompts load in one step
        log.debug(
            "kvring: TP rank %d step: %d loads, %d blocks, %.1f MiB in %.2f ms (copy %.2f ms)",
            self.tp_rank,
            len(meta.loads),
            sum(len(sp.block_ids) - sp.skip for sp in meta.loads),
            self._step_bytes / (1 << 20),
            dt / 1e6,
            self._step_copy_ns / 1e6,
        )
        self._periodic()

    def _periodic(self) -> None:
        """Every STATS_EVERY_S, what the last period's load steps took (vLLM kills its engine
        processes at exit, so a summary at shutdown alone is never seen under `vllm serve`)."""
        now = time.monotonic()
        if now < self._stats_next:
            return
        self._stats_next = now + STATS_EVERY_S
        recent = self._load_ns[self._stats_mark :]
        self._stats_mark = len(self._load_ns)
        if not recent:
            return
        s = sorted(recent)
        log.info(
            "kvring: TP rank %d: %d load steps in the last %d s: p50 %.2f ms, p99 %.2f ms, max %.2f ms; "
            "%d loads, %.1f MiB loaded in all",
            self.tp_rank,
            len(s),
            STATS_EVERY_S,
            s[len(s) // 2] / 1e6,
            s[min(len(s) - 1, (len(s) * 99) // 100)] / 1e6,
            s[-1] / 1e6,
            self.stats["loads"],
            self.stats["load_bytes"] / (1 << 20),
        )

    def _submit_loads(self, meta: KvringConnectorMetadata) -> None:
        """Take each lease of the step and submit its load; they wait in self._waiting."""
        self._null = meta.null_block
        waiting = self._waiting  # lease id -> spec; _handle() takes them out as they complete
        for spec in meta.loads:
            targets = self._targets(spec, meta.null_block)
            n = self._take_and_load(spec, targets)
            self._fail_blocks(targets[max(n, spec.skip) :], meta.null_block)
            if n and self._client is not None:
                waiting[spec.lease_id] = spec
                self.stats["loads"] += 1
                self.stats["load_blocks"] += n - spec.skip

    def _collect_loads(self, meta: KvringConnectorMetadata, deadline: float) -> None:
        """Wait for the step's loads until deadline; cancel (and wait for) what is late."""
        waiting = self._waiting
        while waiting:
            left = int((deadline - time.monotonic()) * 1000)
            c = self._client
            if c is None or left <= 0:
                break
            try:
                done = c.wait(min(left, 1000))
            except KvringError as e:
                self._lost(e)  # kvr_wait fails only once kvringd is gone and all was collected
                break
            for comp in done:
                self._handle(comp)
        if waiting and self._client is None:
            # kvringd went away meanwhile: libkvring failed these once its actors had exited
            # (a fenced detach otherwise): nothing of them can still land
            for spec in waiting.values():
                self._fail_blocks(self._targets(spec, meta.null_block), meta.null_block)
        elif waiting:
            self._cancel_loads(waiting, meta.null_block)

    def _cancel_loads(self, waiting: dict[int, LoadSpec], null_block: int) -> None:
        """Loads a live loader did not finish within timeout_ms: cancel them and wait for the
        cancels' completions (a load stops before its next copy chunk) — vLLM recomputes
        these blocks right after, and no late copy may land on them. A loader that answers
        nothing is killed by kvringd's health check, which fails its loads once it exited;
        should even that not come, a fenced detach ends it."""
        c = self._client
        assert c is not None
        for lid, spec in waiting.items():
            log.warning(
                "kvring: load of request %s not done within %d ms: cancelled, recomputing",
                spec.req_id,
                self.cfg.timeout_ms,
            )
            self._fail_blocks(self._targets(spec, null_block), null_block)
            try:
                c.cancel(lid)
            except KvringError as e:
                log.warning("kvring: cancel of the load of request %s: %s", spec.req_id, e)
        self.stats["late_loads"] += len(waiting)
        t0 = time.monotonic()
        deadline = t0 + max(self.cfg.timeout_ms / 1000, 30.0)
        while waiting and (c := self._client) is not None and time.monotonic() < deadline:
            try:
                for comp in c.wait(100):
                    self._handle(comp)
            except KvringError as e:
                self._lost(e)
        if waiting and self._client is not None:
            self._detach(f"{len(waiting)} cancelled loads not answered")
        self.stats["cancel_wait_ms"] += int((time.monotonic() - t0) * 1000)

    def _handle(self, comp: Completion) -> None:
        """Route one completion: a load of this step, a late load, or a store."""
        if not comp.is_load:
            self._store_done(comp)
            return
        spec = self._waiting.pop(comp.req_id, None)
        if spec is None:
            return  # a load whose step gave up on it
        self._step_bytes += comp.diag.bytes
        self._step_copy_ns += comp.diag.copy_ns
        if comp.failed:
            log.warning(
                "kvring: %d of %d blocks of request %s did not load (status %d): recomputing",
                len(comp.failed),
                comp.n_blocks,
                spec.req_id,
                comp.status,
            )
            self._fail_blocks(comp.failed, self._null)
        elif comp.status != 0:
            self._fail_blocks(self._targets(spec, self._null), self._null)

    def _epipe(self, e: KvringError) -> bool:
        """A call failed with EPIPE: kvringd is gone (detach; True), or only the actor it
        needed is restarting (keep the client: a detach would give up stores a live
        storer may still be copying; False). Completions are collected first, since
        libkvring says "gone" only once they were."""
        self._poll()
        c = self._client
        if c is None:
            return True
        if c.gone():
            self._lost(e)
            return True
        return False

    def _fail_blocks(self, blocks: Any, null_block: int) -> None:
        for b in blocks:
            if b != null_block:
                self._load_errors.add(int(b))

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        if out:
            self.stats["failed_blocks"] += len(out)
        return out

    # ---- stores ----

    def _store(self, specs: list[StoreSpec], same_step: bool = False) -> None:
        for spec in specs:
            c = self._get_client()
            if c is None:
                self._done.add(spec.req_id)
                continue
            try:
                if self._attach_kw and self._attach_kw.get("cuda_kv") is not None:
                    ev = torch.cuda.Event(interprocess=True, enable_timing=False)
                    ev.record()
                    c.store_cuda(spec.store_id, spec.token_ids, spec.block_ids, bytes(ev.ipc_handle()), spec.extra)
                    self._events[spec.store_id] = ev
                else:
                    c.store(spec.store_id, spec.token_ids, spec.block_ids, spec.extra)
                self._stores[spec.store_id] = spec.req_id
                self._store_t[spec.store_id] = time.monotonic()
                self.stats["stores"] += 1
                if same_step:
                    self.stats["same_step_stores"] += 1
            except KvringError as e:
                log.warning("kvring: store of request %s not submitted (%s)", spec.req_id, e)
                self._done.add(spec.req_id)
                if e.errno == errno.EPIPE:
                    self._epipe(e)

    def _fence(self, rids: list[str]) -> None:
        """Wait until no store of these (preempted) requests is in flight: vLLM has given
        their blocks back to its pool and this step's forward pass may write them. A store
        not done within timeout_ms is cancelled and its cancel waited for (nothing of it
        commits); should even that not be answered, a fenced detach ends it."""
        want = set(rids)
        left = [sid for sid, rid in self._stores.items() if rid in want]
        if not left:
            return
        self.stats["fenced_stores"] += len(left)
        t0 = time.monotonic()
        deadline = t0 + self.cfg.timeout_ms / 1000
        cancelled = False
        while left and (c := self._client) is not None:
            now = time.monotonic()
            if now >= deadline:
                if cancelled:
                    log.error(
                        "kvring: TP rank %d: %d stores of preempted requests not answered after their cancel",
                        self.tp_rank,
                        len(left),
                    )
                    # nothing of ours touches the KV memory once the fenced detach returned
                    self._done.update(self._stores.values())
                    self._stores.clear()
                    self._store_t.clear()
                    self._cancelled.clear()
                    self._events.clear()
                    self._detach("stores of preempted requests not answered")
                    break
                self._cancel_stores(self.cfg.timeout_ms / 1000, only=set(left))  # each waited that long
                cancelled = True
                deadline = now + max(self.cfg.timeout_ms / 1000, 30.0)
            try:
                for comp in c.wait(max(1, min(100, int((deadline - now) * 1000)))):
                    self._handle(comp)
            except KvringError as e:
                self._lost(e)
                break
            left = [sid for sid, rid in self._stores.items() if rid in want]
        self.stats["fence_wait_ms"] += int((time.monotonic() - t0) * 1000)

    def _store_done(self, comp: Completion) -> None:
        rid = self._stores.pop(comp.req_id, None)
        self._events.pop(comp.req_id, None)
        self._store_t.pop(comp.req_id, None)
        self._cancelled.discard(comp.req_id)
        if rid is None:
            return
        if comp.status == -errno.ECANCELED:
            self.stats["cancelled_stores"] += 1
        elif comp.status != 0 and comp.status != -errno.EIO:
            log.warning("kvring: store of request %s failed (status %d)", rid, comp.status)
        self.stats["stored_blocks"] += comp.n_stored
        self._done.add(rid)

    def _poll(self) -> None:
        """Collect what completed (never blocks); kvr_poll failing means kvringd is gone."""
        while (c := self._client) is not None:
            try:
                done = c.poll()
            except KvringError as e:
                self._lost(e)
                return
            if not done:
                return
            for comp in done:
                self._handle(comp)

    def _cancel_stores(self, older_than_s: float, only: set[int] | None = None) -> None:
        """Cancel the stores in flight longer than older_than_s (of `only`, when given):
        their blocks go back to vLLM when the cancel's completion comes (nothing of them
        committed), never before."""
        c = self._client
        if c is None:
            return
        now = time.monotonic()
        for sid, t in list(self._store_t.items()):
            if sid in self._cancelled or now - t < older_than_s or (only is not None and sid not in only):
                continue
            self._cancelled.add(sid)
            log.warning(
                "kvring: store of request %s not done within %.0f ms: cancelled",
                self._stores.get(sid),
                older_than_s * 1000,
            )
            try:
                c.cancel(sid)
            except KvringError as e:
                log.warning("kvring: cancel of store %#x: %s", sid, e)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        for rid in finished_req_ids:
            self._finished[rid] = None
        while len(self._finished) > 65536:  # ids of requests that stored nothing
            self._finished.popitem(last=False)
        self._poll()
        if self._client is None:
            # kvringd went away (or restarted): attach again now (at most every
            # reattach_interval_ms), not only at the next load or store. A restarted kvringd
            # without a model section lays L1 out for the first worker that attaches, and
            # answers this engine's scheduler only once one did.
            self._get_client()
        if self._store_t:
            self._cancel_stores(self.cfg.timeout_ms / 1000)
        ready = {rid for rid in self._done if rid in self._finished}
        for rid in ready:
            self._done.discard(rid)
            del self._finished[rid]
        return (ready or None), None

    def load_stats(self) -> dict[str, float]:
        """Steps with loads: how many, and p50/p99/max of the time start_load_kv spent on
        them (lease_take + load + waiting for the copies) in milliseconds."""
        s = sorted(self._load_ns)
        if not s:
            return {}
        return {
            "steps": len(s),
            "p50_ms": s[len(s) // 2] / 1e6,
            "p99_ms": s[min(len(s) - 1, len(s) * 99 // 100)] / 1e6,
            "max_ms": s[-1] / 1e6,
        }

    def shutdown(self) -> None:
        st = self.load_stats()
        log.info(
            "kvring: TP rank %d: %d loads (%d blocks, %d failed), %d stores (%d in the step that computed "
            "them, %d blocks stored)%s",
            self.tp_rank,
            self.stats["loads"],
            self.stats["load_blocks"],
            self.stats["failed_blocks"],
            self.stats["stores"],
            self.stats["same_step_stores"],
            self.stats["stored_blocks"],
            f"; load time per step p50 {st['p50_ms']:.2f} ms, p99 {st['p99_ms']:.2f} ms" if st else "",
        )
        # stores in flight get a moment to finish, then are cancelled; the detach is fenced
        # (it returns once nothing of ours can touch the KV memory vLLM is about to free)
        deadline = time.monotonic() + min(self.cfg.timeout_ms, 5000) / 1000
        cancelled = False
        while (c := self._client) is not None and self._stores and time.monotonic() < deadline + 5:
            if not cancelled and time.monotonic() >= deadline:
                self._cancel_stores(0.0)
                cancelled = True
            try:
                for comp in c.wait(100):
                    self._handle(comp)
            except KvringError:
                break
        self._detach("engine shutdown")
        if self._pool is not None:
            self._pool.close()
