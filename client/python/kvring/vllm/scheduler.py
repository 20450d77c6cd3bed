"""The scheduler half of the connector: which tokens kvring holds, and what to store.

Runs in vLLM's scheduler (EngineCore) process, attached to kvringd as a *scheduler
client*: no KV memory, no worker slot (kvr_attach_scheduler). For every waiting request
vLLM asks how many of its prompt tokens kvring can supply (get_num_new_matched_tokens);
the answer is a **lookup lease**: kvringd pins the matched blocks under (engine,
lease id) so that, when vLLM schedules the request, its workers load exactly those
blocks, which cannot be evicted in between. The lease ends when every worker's load
completed, when the request finishes (request_finished releases it) or by its ttl.

A request's full prompt blocks are stored by the step that computes them: when a step's
forward pass completes a prompt (build_connector_meta sees its prefill end in this step),
the store goes into that step's metadata as a *save*, and the workers submit it right
after the forward pass (wait_for_save), not a step later. A prefill engine answering with
max_tokens=1 thus has its prompt's store in flight before its response leaves, whatever
its next step is (docs/vllm.md, prefill and decode). Requests that loaded from kvring
are stored once final instead (request_finished, deferred to the next step's start), as
are requests that finish before their prefill completes: a load that fails is reported
only after the step's forward pass ran over it, and with tensor parallelism one rank
cannot know another's failed. Either way vLLM keeps the blocks allocated (the "delay
free" answer of request_finished) until every worker reported the store's copy complete
(get_finished -> finished_sending -> update_connector_output here), and a request
vLLM preempts while its store is in flight is fenced: the workers wait for that store
before the step's forward pass may reuse its blocks.

Rules kept here:
- kvring holds whole blocks, and vLLM must compute at least the last prompt token to
  sample from: every full block of the prompt is leased, vLLM is told at most
  prompt_len - 1 tokens, and the block holding the last token is loaded whole (vLLM
  recomputes that one token over it). A fully stored 8k prompt then computes 1 token, not
  a block of them;
- loads are synchronous (the workers finish them before the forward pass), so a failed
  block is reported in the same step and vLLM recomputes from it
  (kv_load_failure_policy="recompute");
- kvringd going away is a miss, never an error: the scheduler attaches again at most
  every reattach_interval_ms (and at once when a call finds the instance gone).
"""

from __future__ import annotations

import array
import errno
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..client import KvringError, Scheduler
from .config import ConnectorConfig
from .metadata import KvringConnectorMetadata, LoadSpec, StoreSpec, lease_id, store_id
from .reattach import ReattachLog

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.request import Request

__all__ = ["SchedulerSide", "request_extra"]

log = logging.getLogger("vllm.kvring")  # under vllm: its handler and format

# kvringd without a model section answers a scheduler EAGAIN until a worker attached: ask
# again this soon, not after reattach_interval_ms (a worker attaches at its next load or store)
EAGAIN_RETRY_S = 0.02


def request_extra(request: Request) -> bytes | None:
    """Key bytes besides the tokens: what makes equal token ids hold different KV (a LoRA
    adapter, a cache salt, multimodal inputs behind placeholder tokens)."""
    parts = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        parts.append(b"lora=" + str(getattr(lora, "lora_name", None) or getattr(lora, "lora_int_id", "")).encode())
    salt = getattr(request, "cache_salt", None)
    if salt:
        parts.append(b"salt=" + str(salt).encode())
    mm = getattr(request, "mm_features", None)
    if mm:
        parts.append(b"mm=" + ",".join(str(getattr(f, "identifier", f)) for f in mm).encode())
    return b"\0".join(parts) if parts else None


STATS_EVERY_S = 60  # lease statistics at most this often (INFO)
WAIT_POLL_S = 0.002  # a request waiting for a store leases again at most this often (vLLM asks every step)


@dataclass
class _Lease:
    lease_id: int
    matched: int  # tokens leased (whole blocks, <= the cap)
    local: int  # tokens vLLM had computed itself when it asked


class SchedulerSide:
    def __init__(self, cfg: ConnectorConfig, vllm_config: VllmConfig, engine_id: str) -> None:
        self.cfg = cfg
        self.engine_id = engine_id
        self.block_size = int(vllm_config.cache_config.block_size)
        self.loaders = int(vllm_config.parallel_config.tensor_parallel_size)
        self._client: Scheduler | None = None
        self._next_attach = 0.0
        self._tokens: dict[str, array.array] = {}  # prompt tokens as uint32, per waiting request
        self._leases: dict[str, _Lease] = {}  # granted, not yet allocated by vLLM
        self._leased: set[str] = set()  # requests that may hold a lease at kvringd
        self._loaded: dict[str, int] = {}  # tokens a request got from kvring
        self._load_blocks: dict[str, set[int]] = {}  # its engine blocks that a load filled
        self._loads: list[LoadSpec] = []
        self._stores: list[StoreSpec] = []  # deferred (request_finished), for the next step
        self._saves: list[StoreSpec] = []  # prompts this step completes, stored right after it
        self._reqs: dict[str, Request] = {}  # scheduled, not finished
        self._saved: dict[str, int] = {}  # requests whose prompt a save stored: its tokens
        self._kv_manager: KVCacheManager | None = None
        self._storing: set[str] = set()  # requests whose blocks vLLM holds for our store
        self.store_stats = {"same_step": 0, "deferred": 0, "fenced": 0}
        self._null_block = 0
        self._lease_ns: list[int] = []  # recent kvr_lease call times, for the shutdown line
        self._waiting: dict[str, float] = {}  # requests waiting for a store in flight: since (monotonic)
        self._wait_poll: dict[str, float] = {}  # when a waiting request may lease again
        self.wait_stats = {"waited": 0, "served": 0, "timed_out": 0}
        self._stats_next = time.monotonic() + STATS_EVERY_S
        self._stats_mark = 0
        self._missed_logged = False
        self._reattach = ReattachLog(log, "scheduler", cfg.socket, cfg.reattach_interval_ms)
        self._attach(first=True)

    # ---- the kvringd connection ----

    def _attach(self, first: bool = False) -> Scheduler | None:
        try:
            c = Scheduler(
                socket=self.cfg.socket,
                engine_id=self.engine_id,
                model_ns=self.cfg.model_ns,
                timeout_ms=self.cfg.timeout_ms,
            )
        except KvringError as e:
            # EAGAIN: kvringd has no model section and no worker attached yet (it lays L1 out
            # for the first worker's geometry, after a restart too). The workers attach before
            # the scheduler in vLLM, and again at their next load or store: one of this engine
            # is about to, so this is no failure at start, and the next request asks again
            # soon (EAGAIN_RETRY_S) rather than after reattach_interval_ms of misses.
            if first and e.errno != errno.EAGAIN:
                raise RuntimeError(f"kvring: scheduler cannot attach to kvringd at {self.cfg.socket}: {e}") from e
            wait = self.cfg.reattach_interval_ms / 1000
            if e.errno == errno.EAGAIN:
                wait = min(wait, EAGAIN_RETRY_S)
            self._next_attach = time.monotonic() + wait
            self._reattach.failed(e)
            return None
        bt = c.block_tokens
        if bt != self.block_size:
            c.detach()
            msg = (
                f"kvring: kvringd at {self.cfg.socket} serves {bt}-token blocks (model.block_tokens), vLLM uses "
                f"block_size {self.block_size}: start vLLM with block_size={bt} or kvringd with block_tokens "
                f"{self.block_size}"
            )
            if first:
                raise RuntimeError(msg)
            log.error("%s", msg)
            self._next_attach = time.monotonic() + self.cfg.reattach_interval_ms / 1000
            return None
        if not first:
            self._reattach.attached()
        self._client = c
        self._leased.clear()  # a new instance holds none of our old leases
        return c

    def _lost(self, e: KvringError) -> None:
        if self._client is not None:
            log.warning("kvring: scheduler lost kvringd (%s); lookups miss until it attaches again", e)
            self._client.detach()
            self._client = None
            self._next_attach = 0.0  # the first retry is immediate

    def _gone(self, e: KvringError) -> bool:
        """EPIPE: kvringd is gone (detach; True), or only its lookup actor restarted (this
        call is a miss, the client stays; False)."""
        c = self._client
        if c is not None and not c.gone():
            return False
        self._lost(e)
        return True

    def _get_client(self) -> Scheduler | None:
        if self._client is None and time.monotonic() >= self._next_attach:
            self._attach()
        return self._client

    # ---- vLLM's scheduler-side hooks ----

    def bind_null_block(self, block_id: int) -> None:
        self._null_block = block_id

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        self._kv_manager = kv_cache_manager  # a save's engine blocks, at build_connector_meta

    def _prompt(self, request: Request) -> array.array:
        a = self._tokens.get(request.request_id)
        if a is None:
            a = array.array("I", request.prompt_token_ids or ())
            self._tokens[request.request_id] = a
        return a

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        bs = self.block_size
        cap = (request.num_prompt_tokens // bs) * bs  # lease every full block of the prompt
        if request.prompt_token_ids is None or min(cap, request.num_tokens - 1) <= num_computed_tokens:
            self._drop_lease(rid)
            return 0, False
        if rid in self._waiting and time.monotonic() < self._wait_poll.get(rid, 0.0):
            return None, False  # waiting for a store: look again at most every WAIT_POLL_S
        tokens = memoryview(self._prompt(request))[:cap]
        lid = lease_id(rid)
        extra = request_extra(request)
        r = None
        for attempt in (0, 1):
            c = self._get_client()
            if c is None:
                return 0, False
            t0 = time.perf_counter_ns()
            try:
                r = c.lease(lid, tokens, extra, loaders=self.loaders, ttl_ms=self.cfg.lease_ttl_ms)
                break
            except KvringError as e:
                if e.errno == errno.EPIPE and self._gone(e) and attempt == 0:
                    continue  # kvringd restarted: attach to the new one and ask once more
                if e.errno != errno.EPIPE and not self._missed_logged:
                    log.warning("kvring: lease of request %s failed (%s): treated as a miss", rid, e)
                    self._missed_logged = True
                return 0, False
            finally:
                self._note_lease_time(time.perf_counter_ns() - t0)
        assert r is not None
        self._leased.add(rid)
        if self._wait_for_store(request, r, cap):
            self._drop_lease(rid)
            return None, False  # vLLM asks again on a later step; nothing is computed meanwhile
        if log.isEnabledFor(logging.DEBUG):
            # what a lease cost the scheduler's step: promotions from L2 are waited for here
            log.debug(
                "kvring: request %s: %d of %d tokens matched (%d blocks promoted from L2) in %.2f ms "
                "(hashing %.2f ms, lookup actor %.2f ms)%s",
                rid,
                r.matched_tokens,
                cap,
                r.l2_blocks,
                r.roundtrip_ns / 1e6,
                r.hash_ns / 1e6,
                r.index_ns / 1e6,
                f"; the next block: {r.miss}" if r.miss_reason else "",
            )
        # at least the last token is vLLM's to compute; the block holding it is loaded whole
        matched = min(r.matched_tokens, cap, request.num_tokens - 1)
        if matched <= num_computed_tokens:
            self._drop_lease(rid)
            return 0, False
        self._leases[rid] = _Lease(lid, matched, num_computed_tokens)
        return matched - num_computed_tokens, False

    def _wait_for_store(self, request: Request, r: Any, cap: int) -> bool:
        """Whether to answer "ask again later" instead of recomputing what a store in flight
        is about to make visible (prefill/decode on one node, docs/vllm.md): the lease found
        blocks right after its match that a store is writing now (r.pending_blocks), or the
        request names, in its kv_transfer_params, a prefill engine's store that covers more
        than the lease matched. Bounded by store_wait_ms from the first time it waited; a
        producer that died leaves the blocks uncommitted, and the request then recomputes."""
        rid = request.request_id
        bs = self.block_size
        want = 0
        params = getattr(request, "kv_transfer_params", None)
        if isinstance(params, dict) and isinstance(params.get("kvring"), dict):
            try:
                want = min(int(params["kvring"].get("stored_tokens", 0)) // bs * bs, cap)
            except (TypeError, ValueError):
                want = 0
        behind = r.pending_blocks > 0 or r.matched_tokens < want
        since = self._waiting.get(rid)
        if not behind or self.cfg.store_wait_ms <= 0:
            if since is not None:
                del self._waiting[rid]
                self._wait_poll.pop(rid, None)
                self.wait_stats["served"] += 1
                log.debug(
                    "kvring: request %s waited %.1f ms for a store in flight: %d tokens matched",
                    rid,
                    (time.monotonic() - since) * 1e3,
                    r.matched_tokens,
                )
            return False
        now = time.monotonic()
        self._wait_poll[rid] = now + WAIT_POLL_S  # only a waiting request has a poll time
        if since is None:
            self._waiting[rid] = now
            self.wait_stats["waited"] += 1
            log.debug(
                "kvring: request %s: %d tokens matched, %d blocks being stored, %d tokens announced: waiting",
                rid,
                r.matched_tokens,
                r.pending_blocks,
                want,
            )
            return True
        if (now - since) * 1e3 < self.cfg.store_wait_ms:
            return True
        del self._waiting[rid]
        self._wait_poll.pop(rid, None)
        self.wait_stats["timed_out"] += 1
        log.info(
            "kvring: request %s waited %d ms (store_wait_ms) for a store that did not commit: %d of %d tokens "
            "matched, the rest is recomputed",
            rid,
            self.cfg.store_wait_ms,
            r.matched_tokens,
            max(want, r.matched_tokens + r.pending_blocks * bs),
        )
        return False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        rid = request.request_id
        self._reqs[rid] = request
        lease = self._leases.pop(rid, None)
        if num_external_tokens <= 0 or lease is None:
            if lease is not None:
                self._drop_lease(rid)
            return
        bs = self.block_size
        end = min(lease.local + num_external_tokens, lease.matched)
        n_blocks = -(-end // bs)
        block_ids = list(blocks.get_block_ids()[0][:n_blocks])
        if len(block_ids) < n_blocks:
            log.error(
                "kvring: request %s has %d blocks for a %d-block load; not loading", rid, len(block_ids), n_blocks
            )
            self._drop_lease(rid)
            return
        self._loads.append(LoadSpec(rid, lease.lease_id, block_ids, lease.local // bs, num_external_tokens))
        self._loaded[rid] = end
        self._load_blocks[rid] = set(block_ids[lease.local // bs :])

    def build_connector_meta(self, scheduler_output: Any) -> KvringConnectorMetadata:
        self._plan_saves(scheduler_output)
        # a preempted request's blocks go back to vLLM's pool now, and this step's forward
        # pass may write them: a save still reading them must end before it
        fence = [rid for rid in getattr(scheduler_output, "preempted_req_ids", None) or () if rid in self._saved]
        self.store_stats["fenced"] += len(fence)
        meta = KvringConnectorMetadata(
            loads=self._loads, stores=self._stores, saves=self._saves, fence=fence, null_block=self._null_block
        )
        self._loads, self._stores, self._saves = [], [], []
        return meta

    def _plan_saves(self, scheduler_output: Any) -> None:
        """The prompts whose prefill this step completes: their full blocks are stored right
        after its forward pass (wait_for_save). Not for a request that loaded from kvring
        (its store waits for request_finished: see the module's docstring) nor one stored
        already (a preempted request computes its prompt again)."""
        mgr = self._kv_manager
        if mgr is None:
            return
        bs = self.block_size
        for rid, n_sched in scheduler_output.num_scheduled_tokens.items():
            request = self._reqs.get(rid)
            if request is None or rid in self._saved or rid in self._loaded or request.prompt_token_ids is None:
                continue
            # vLLM advances num_computed_tokens after build_connector_meta: here it is what
            # the step starts from, and the step computes n_sched tokens more
            done, prompt = request.num_computed_tokens, request.num_prompt_tokens
            if not done < prompt <= done + n_sched:
                continue
            block_ids = mgr.get_block_ids(rid)[0]
            n = min((prompt // bs) * bs, len(block_ids) * bs)
            if n <= 0:
                continue  # no full block: nothing to store, as at request_finished
            tokens = self._prompt(request)
            self._saves.append(
                StoreSpec(rid, store_id(rid), tokens[:n].tolist(), list(block_ids[: n // bs]), request_extra(request))
            )
            self._saved[rid] = n
            self.store_stats["same_step"] += 1

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._waiting.pop(rid, None)
        self._wait_poll.pop(rid, None)
        self._leases.pop(rid, None)
        self._drop_lease(rid)
        tokens = self._tokens.pop(rid, None)
        loaded = self._loaded.pop(rid, 0)
        self._load_blocks.pop(rid, None)
        self._reqs.pop(rid, None)
        saved = self._saved.pop(rid, 0)
        if saved:
            # the step that computed its prompt stored it (a save): nothing to store again,
            # but the save may still be reading the blocks, so vLLM frees them only once
            # every worker reported it finished (which they do once it completed)
            self._storing.add(rid)
            return True, {"kvring": {"stored_tokens": saved}}
        bs = self.block_size
        n = (min(request.num_prompt_tokens, request.num_computed_tokens) // bs) * bs
        n = min(n, len(block_ids) * bs)
        if n <= -(-loaded // bs) * bs or request.prompt_token_ids is None:
            return False, None  # nothing kvring does not hold already (a loaded partial block is whole)
        if tokens is None:
            tokens = array.array("I", request.prompt_token_ids)
        self._stores.append(
            StoreSpec(rid, store_id(rid), tokens[:n].tolist(), list(block_ids[: n // bs]), request_extra(request))
        )
        self._storing.add(rid)
        self.store_stats["deferred"] += 1
        # what a decode engine given these params (vLLM's P/D proxies pass a prefill's
        # kv_transfer_params on) waits for instead of recomputing: docs/vllm.md
        return True, {"kvring": {"stored_tokens": n}}

    def update_connector_output(self, connector_output: Any) -> None:
        for rid in connector_output.finished_sending or ():
            self._storing.discard(rid)
        bad = getattr(connector_output, "invalid_block_ids", None)
        if bad:
            # a request whose load failed recomputes its prefix: store it again at the end
            for rid, blocks in self._load_blocks.items():
                if not blocks.isdisjoint(bad):
                    self._loaded[rid] = 0

    def has_pending_block_frees(self) -> bool:
        return bool(self._storing)

    def _drop_lease(self, rid: str) -> None:
        if rid not in self._leased:
            return
        self._leased.discard(rid)
        c = self._client
        if c is None:
            return
        try:
            c.lease_release(lease_id(rid))
        except KvringError as e:
            if e.errno == errno.EPIPE:
                self._gone(e)
            # otherwise the lease ends by its ttl

    def _note_lease_time(self, ns: int) -> None:
        self._lease_ns.append(ns)
        if len(self._lease_ns) > 20000:
            del self._lease_ns[:10000]
            self._stats_mark = max(0, self._stats_mark - 10000)
        now = time.monotonic()
        if now >= self._stats_next:
            # vLLM kills EngineCore at exit: the shutdown line alone is never seen under `vllm serve`
            self._stats_next = now + STATS_EVERY_S
            st = self.lease_stats(self._lease_ns[self._stats_mark :])
            self._stats_mark = len(self._lease_ns)
            w = self.wait_stats
            log.info(
                "kvring: scheduler: %d leases in the last %d s: p50 %.1f us, p99 %.1f us, max %.1f us; "
                "%d requests waited for a store in flight (%d served from it, %d gave up)",
                st["n"],
                STATS_EVERY_S,
                st["p50_us"],
                st["p99_us"],
                st["max_us"],
                w["waited"],
                w["served"],
                w["timed_out"],
            )

    def lease_stats(self, sample: list[int] | None = None) -> dict[str, float]:
        """p50/p99/max of recent lease calls in microseconds (what get_num_new_matched_tokens costs)."""
        s = sorted(self._lease_ns if sample is None else sample)
        if not s:
            return {}
        return {
            "n": len(s),
            "p50_us": s[len(s) // 2] / 1000,
            "p99_us": s[min(len(s) - 1, len(s) * 99 // 100)] / 1000,
            "max_us": s[-1] / 1000,
        }

    def shutdown(self) -> None:
        st = self.lease_stats()
        if st:
            log.info(
                "kvring: scheduler made %d leases: p50 %.1f us, p99 %.1f us, max %.1f us",
                st["n"],
                st["p50_us"],
                st["p99_us"],
                st["max_us"],
            )
        s = self.store_stats
        if s["same_step"] or s["deferred"]:
            log.info(
                "kvring: scheduler planned %d stores in the step that computed the prompt, %d at request_finished; "
                "%d preempted requests fenced",
                s["same_step"],
                s["deferred"],
                s["fenced"],
            )
        w = self.wait_stats
        if w["waited"]:
            log.info(
                "kvring: %d requests waited for a store in flight: %d served from it, %d gave up after store_wait_ms",
                w["waited"],
                w["served"],
                w["timed_out"],
            )
        if self._client is not None:
            self._client.detach()
            self._client = None
