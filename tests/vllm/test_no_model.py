"""kvringd with no model section: the engine's own geometry is what L1 is laid out for.

kvringd starts from a config that has an instance, L1 and L2 but no "model" (the embedded
default binds none): nothing is laid out and no lookup actor runs until the engine's worker
attaches with its KV geometry (vLLM's CPU layout, fp32, 16-token blocks). The cold run stores,
the warm run hits every full block but the last, with the cold run's tokens and logprobs.
kvringd is then stopped and started again, still without a model: after the restart a
scheduler finds no geometry until a worker attaches again (the first request of the engine
after the restart is a miss, docs/engines.md), so a first request of another prompt lets the
worker attach; the warm run then hits from the adopted L2 files.
"""

from __future__ import annotations

from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    l2 = d / "l2"
    l2.mkdir()
    kv = kt.Kvringd(d, l2_dir=l2, model=False)
    snap = kv.inspect()
    check(snap["l1_slots"] is None, f"L1 laid out before any worker attached: {snap['l1_slots']}")
    eng = kt.Engine(d, "nomodel", kv_transfer_config=kt.connector_config(kv.socket, reattach_interval_ms=200))
    with kt.serving(kv, eng):
        p = kt.prompt(31, 9 * BLOCK + 3)
        cold = kt.cold_run(eng, p)
        kv.wait_metric("kvring_store_blocks_total", 9, result="stored")
        slots = kv.inspect()["l1_slots"]
        check(slots is not None and slots["committed"] >= 9, f"L1 after the cold run: {slots}")
        check("L1 laid out for the geometry of engine" in kv.log_tail(200), "kvringd did not log the binding")

        warm = kt.warm_equal(eng, "warm", p, cold)

        kv.wait_metric("kvring_l2_blocks_total", 9, op="write", result="ok")
        kv.restart()
        check(kv.inspect()["l1_slots"] is None, "the restarted kvringd laid L1 out before a worker attached")
        eng.generate([kt.prompt(32, 2 * BLOCK + 1)])  # the worker attaches again (and binds L1)
        again = kt.warm_equal(eng, "after the restart", p, cold)
        reads = kv.metric("kvring_l2_blocks_total", op="read", result="ok")
        check(reads >= 9, f"the restarted kvringd read {reads:.0f} blocks from L2, want >= 9")
        kv.wait_slots_quiet()
        kt.log(
            f"no model section: warm hit {warm['num_cached_tokens']}/{len(p)}, after a restart "
            f"{again['num_cached_tokens']} from L2 ({reads:.0f} reads), tokens and logprobs equal"
        )


if __name__ == "__main__":
    kt.run(main)
