"""Engines of two KV geometries, block sizes and TP sizes on one kvringd with no model section: each hits its own prefixes.

kvringd starts with no model section, an L1 of 16 slots (64 KiB each) and an L2 directory.
Engine A runs the tiny model (2 layers, 2 KV heads of 64 elements, 32-token blocks, TP 1);
engine B a variant with 4 layers of 2 KV heads of 32 elements, 64-token blocks and TP 2 (one
KV head a rank: another geometry, block size and lane count a block, the same 64 KiB block
lane). Both attach at once; L1 is laid out for the first worker's lane and shared by slots,
each engine keying its blocks in its own block size, each block with its own lanes: A's and
B's cold runs (9 blocks of 1 lane, 4 of 2) and another of A's leave L1 evicting under the
other's stores (write-through keeps every lane on disk). Every warm run hits every full block of
its own prompts, from L1 or L2, with the cold run's tokens and logprobs, and never the other
model's. kvringd is then stopped and started again (still no model section): after one
request each lets the workers attach again, both engines' prompts hit from the adopted files.
"""

from __future__ import annotations

from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check

LANE = 64 * 1024  # A: 2 x (2 x 32 x 2 x 64 x 4) bytes; B, a rank: 4 x (1 x 64 x 2 x 32 x 4)
BLOCK_B = 2 * BLOCK  # B's block size
TP_B = 2  # B's TP size: lanes a block
SLOTS = 16


def main(d: Path) -> None:
    l2 = d / "l2"
    l2.mkdir()
    kv = kt.Kvringd(d, l2_dir=l2, model=False, l1_bytes=str(4096 + SLOTS * LANE))
    variant = kt.tiny_model_variant(kt.MODEL_SEED + 7, num_hidden_layers=4, head_dim=32)
    cfg = kt.connector_config(kv.socket, reattach_interval_ms=200)
    a = kt.Engine(d, "A", kv_transfer_config=cfg, threads_bind="0", wait=False)
    b = kt.Engine(
        d, "B", kv_transfer_config=cfg, tp=TP_B, wait=False,
        llm_args={"model": str(variant), "block_size": BLOCK_B},
    )
    try:
        a.wait_started()
        b.wait_started()
        ns_a, ns_b = kt.engine_namespace(a), kt.engine_namespace(b)
        check(ns_a != ns_b, f"two models, one namespace {ns_a!r}")
        n = 9 * BLOCK + 3
        pa1, pa2, pb1 = kt.prompt(71, n), kt.prompt(72, n), kt.prompt(71, n)  # pb1: pa1's tokens, B's model
        cold_a1 = a.generate([pa1])[0]
        cold_b1 = b.generate([pb1])[0]
        cold_a2 = a.generate([pa2])[0]
        for name, c in (("A1", cold_a1), ("B1", cold_b1), ("A2", cold_a2)):
            check(c["num_cached_tokens"] == 0, f"{name}'s cold run hit {c['num_cached_tokens']} tokens")
        stored = 2 * (n // BLOCK) + TP_B * (n // BLOCK_B)  # lanes: 9 + 4 x 2 + 9
        kv.wait_metric("kvring_store_blocks_total", stored, result="stored")
        kv.wait_metric("kvring_l2_blocks_total", stored, op="write", result="ok")
        check(
            kv.metric("kvring_evictions_total", reason="capacity") >= stored - SLOTS,
            f"{stored} blocks in {SLOTS} slots evicted fewer than {stored - SLOTS}",
        )

        kt.warm_equal(a, "A2", pa2, cold_a2)
        kt.warm_equal(b, "B1", pb1, cold_b1, block=BLOCK_B)
        kt.warm_equal(a, "A1", pa1, cold_a1)  # some of it back from L2
        check(kv.metric("kvring_l2_blocks_total", op="read", result="ok") >= 1, "no block came back from L2")
        m = kv.metrics()
        for ns in (ns_a, ns_b):
            slots = m.get(f'kvring_model_l1_slots{{model="{ns}"}}', 0)
            check(slots > 0, f"model {ns}: {slots} L1 slots (metrics: kvring_model_l1_slots)")

        rc = kv.stop()
        check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")
        kv.start()
        a.generate([kt.prompt(73, 2 * BLOCK + 1)])  # the workers attach again
        b.generate([kt.prompt(74, 2 * BLOCK + 1)])
        reads0 = kv.metric("kvring_l2_blocks_total", op="read", result="ok")
        kt.warm_equal(b, "B1 after the restart", pb1, cold_b1, block=BLOCK_B)
        kt.warm_equal(a, "A2 after the restart", pa2, cold_a2)
        reads = kv.metric("kvring_l2_blocks_total", op="read", result="ok") - reads0
        want = n // BLOCK + TP_B * (n // BLOCK_B)
        check(reads >= want, f"after the restart {reads:.0f} blocks came from L2, want >= {want}")
        kv.wait_slots_quiet()
        kt.log(
            f"two geometries, block sizes and TP sizes on one kvringd without a model section: every warm run "
            f"hit its own blocks (9 of 32 tokens, TP 1; 4 of 64, TP 2), "
            f"tokens equal; after a restart both from L2 ({reads:.0f} reads)"
        )
    finally:
        a.close()
        b.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
