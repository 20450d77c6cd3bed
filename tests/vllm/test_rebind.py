"""One kvringd without a model section serves a node's engines one block format after another.

Engine A (32-token blocks) stores a prompt and hits it warm, then shuts down. Engine B of the
same model with 64-token blocks comes next: nothing is attached, so kvringd gives up the L1
laid out for A's format and lays it out again for B's (B's first attach is answered EAGAIN
meanwhile and waits, docs/engines.md); B's warm run hits every full block of its own prompt,
with its cold run's tokens and logprobs. B shuts down and A's format comes back: a new A
engine gets L1 laid out for it once more and hits its prompt from the L2 files A left, with A's
cold tokens and logprobs.
"""

from __future__ import annotations

from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    l2 = d / "l2"
    l2.mkdir()
    kv = kt.Kvringd(d, l2_dir=l2, model=False)
    cfg = kt.connector_config(kv.socket, reattach_interval_ms=200)
    p, q = kt.prompt(41, 8 * BLOCK + 3), kt.prompt(42, 8 * BLOCK + 3)  # 8 blocks of 32, 4 of 64
    eng = kt.Engine(d, "a", kv_transfer_config=cfg)
    try:
        cold_a = kt.cold_run(eng, p, "A's cold run")
        kt.warm_equal(eng, "A warm", p, cold_a)
        kv.wait_metric("kvring_l2_blocks_total", 8, op="write", result="ok")
    finally:
        eng.close()
    eng = kt.Engine(d, "b", kv_transfer_config=cfg, llm_args={"block_size": 2 * BLOCK})
    try:
        log = kv.log_tail(400)
        check("is given up" in log and "L1 released" in log, f"kvringd did not lay L1 out again for B:\n{log}")
        cold_b = kt.cold_run(eng, q, "B's cold run")
        warm_b = kt.warm_equal(eng, "B warm (64-token blocks)", q, cold_b)
    finally:
        eng.close()
    eng = kt.Engine(d, "a2", kv_transfer_config=cfg)
    with kt.serving(kv, eng):
        again = kt.warm_equal(eng, "A again, from its format's L2 files", p, cold_a)
        reads = kv.metric("kvring_l2_blocks_total", op="read", result="ok")
        check(reads >= 8, f"A's prompt came back with {reads:.0f} L2 reads, want >= 8")
        kv.wait_slots_quiet()
        kt.log(
            f"rebind: A (32-token blocks) then B (64) then A again on one kvringd: B warm hit "
            f"{warm_b['num_cached_tokens']}/{len(q)}, A again {again['num_cached_tokens']}/{len(p)} from L2 "
            f"({reads:.0f} reads), tokens and logprobs equal"
        )


if __name__ == "__main__":
    kt.run(main)
