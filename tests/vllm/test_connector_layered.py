"""The connector's worker half with layered loads, driven step by step, no vLLM engine.

A real kvringd (the tiny model's geometry) and the connector's `WorkerSide` over a memfd KV
memory laid out as vLLM's CPU backend lays it out (per-layer [blocks, heads, tokens, K+V]
views, tests/vllm/test_kvmem.py's `vllm_views`); a `kvring.Scheduler` of the same engine
leases the prompts, as the scheduler half would. Each step is played as vLLM's model runner
plays it (kv_connector_model_runner_mixin: start_load_kv before the forward, then
wait_for_layer_load per attention layer, then wait_for_save):

1. layered_loads "on", a step that waits for layer 0 then layer 1: after each wait that
   layer of every loaded block holds the stored bytes, byte for byte; the step reports no
   load error and counts 2 layer waits;
2. a step whose forward never calls wait_for_layer_load (an attention backend that does
   not): wait_for_save fails every block the step loaded (vLLM recomputes them and drops
   the step's result), and layered loads are off from then on — the next step's load is a
   whole one, in place when start_load_kv returns.
"""

from __future__ import annotations

import types
from pathlib import Path

import torch

import kvtest as kt
from kvtest import BLOCK, check
from test_kvmem import vllm_views

import kvring
from kvring.vllm import config as kcfg
from kvring.vllm.kvmem import MemfdKvPool
from kvring.vllm.metadata import KvringConnectorMetadata, LoadSpec, StoreSpec, store_id
from kvring.vllm.worker import WorkerSide

LAYERS = kt.MODEL_CONFIG["num_hidden_layers"]
HEADS = kt.MODEL_CONFIG["num_key_value_heads"]
ROW = 2 * kt.MODEL_CONFIG["head_dim"]  # K and V of one token and head, float32
NB = 64
PAGE = HEADS * BLOCK * ROW * 4
ENGINE = "layered-unit"


def layer_page(raw: torch.Tensor, layer: int, block: int) -> bytes:
    off = layer * NB * PAGE + block * PAGE  # layer-major: vllm_views(block_major=False)
    return raw[off : off + PAGE].numpy().tobytes()


def worker(sock: str, mode: str) -> tuple[WorkerSide, torch.Tensor]:
    cfg = kcfg.parse({"socket": sock, "layered_loads": mode, "timeout_ms": 5000})
    vcfg = types.SimpleNamespace(
        cache_config=types.SimpleNamespace(block_size=BLOCK), device_config=types.SimpleNamespace(device_type="cpu")
    )
    kvc = types.SimpleNamespace(kv_cache_groups=[object()], num_blocks=NB)
    ws = WorkerSide(cfg, vcfg, kvc, ENGINE, 0, 1)
    with ws.mem_pool_context():
        raw = torch.zeros(LAYERS * NB * PAGE, dtype=torch.int8)
    ws.register_kv_caches(vllm_views(raw, LAYERS, NB, HEADS, BLOCK, ROW, block_major=False))
    return ws, raw


def store(ws: WorkerSide, raw: torch.Tensor, seed: int, src: list[int]) -> list[int]:
    """Fill src with a pattern of its own, store it under a fresh prompt; the prompt."""
    g = torch.Generator().manual_seed(seed)
    for b in src:
        for layer in range(LAYERS):
            off = layer * NB * PAGE + b * PAGE
            raw[off : off + PAGE] = torch.randint(-128, 127, (PAGE,), dtype=torch.int8, generator=g)
    tokens = kt.prompt(seed, len(src) * BLOCK)
    rid = f"store-{seed}"
    ws._store([StoreSpec(rid, store_id(rid), tokens, src, None)])
    while rid not in ws._done:
        for comp in ws._client.wait(1000):
            ws._handle(comp)
    return tokens


def lease(sched: kvring.Scheduler, tokens: list[int], lid: int, n: int) -> None:
    r = sched.lease(lid, tokens)
    check(r.matched_blocks == n, f"lease {lid}: {r.matched_blocks} blocks matched, want {n}")


def main(d: Path) -> None:
    kv = kt.Kvringd(d)
    ws, raw = worker(kv.socket, "on")
    sched = kvring.Scheduler(socket=kv.socket, engine_id=ENGINE)
    names = [f"model.layers.{layer}.self_attn.attn" for layer in range(LAYERS)]
    try:
        check(ws._layered, "layered_loads 'on' did not turn layered loads on")
        src, dst = [1, 2, 3, 4], [20, 21, 22, 23]
        tokens = store(ws, raw, 7, src)

        # 1. layer by layer
        lease(sched, tokens, 101, 4)
        meta = KvringConnectorMetadata(loads=[LoadSpec("r1", 101, dst, 0, 4 * BLOCK)], null_block=0)
        ws.start_load_kv(meta)
        check(ws._layer_step is not None, "start_load_kv did not leave the step's layered loads in flight")
        for layer, name in enumerate(names):
            ws.wait_for_layer_load(name)
            for s, t in zip(src, dst):
                check(
                    layer_page(raw, layer, t) == layer_page(raw, layer, s),
                    f"after wait_for_layer_load({name}): block {t} layer {layer} is not block {s}'s",
                )
        ws.wait_for_save(meta)
        errs = ws.get_block_ids_with_load_errors()
        check(not errs, f"load errors {errs}")
        check(ws._layer_step is None and ws.stats["layered_steps"] == 1, "the layered step did not end")
        check(ws.stats["layer_waits"] == LAYERS, f"{ws.stats['layer_waits']} layer waits, want {LAYERS}")
        kt.log(f"layered step: {LAYERS} layer waits, every layer byte-exact after its wait")

        # 2. a forward that never asks for a layer
        lease(sched, tokens, 102, 4)
        dst2 = [30, 31, 32, 33]
        meta2 = KvringConnectorMetadata(loads=[LoadSpec("r2", 102, dst2, 0, 4 * BLOCK)], null_block=0)
        ws.start_load_kv(meta2)
        ws.wait_for_save(meta2)  # the forward ran without wait_for_layer_load
        errs = ws.get_block_ids_with_load_errors()
        check(errs == set(dst2), f"a step never waited for: load errors {sorted(errs)}, want {dst2}")
        check(not ws._layered, "layered loads still on after a step vLLM never waited for")
        kt.log(f"unwaited layered step: blocks {sorted(errs)} failed (recomputed), layered loads off")

        # ... and the next step loads whole: in place when start_load_kv returns
        lease(sched, tokens, 103, 4)
        dst3 = [40, 41, 42, 43]
        meta3 = KvringConnectorMetadata(loads=[LoadSpec("r3", 103, dst3, 0, 4 * BLOCK)], null_block=0)
        ws.start_load_kv(meta3)
        check(ws._layer_step is None, "a layered step after layered loads were turned off")
        for s, t in zip(src, dst3):
            for layer in range(LAYERS):
                check(layer_page(raw, layer, t) == layer_page(raw, layer, s), f"whole load: block {t} layer {layer}")
        ws.wait_for_save(meta3)
        check(not ws.get_block_ids_with_load_errors(), "the whole load failed")
        kt.log("next step: a whole load, byte-exact")
    finally:
        sched.detach()
        ws.shutdown()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main, needs_vllm=True)
