"""kvringd restarted between the cold and the warm run, L2 on: the warm run hits from disk.

kvringd runs with one L2 directory in write-through mode. The cold run's blocks are stored
(L1) and written through to L2 (both waited for on kvringd's counters); kvringd is then
stopped with SIGTERM (it drains and exits 0) and started again on the same socket and
directory, so its L1 is empty and everything it can serve comes from the files it adopts.
The vLLM engine keeps running across the restart: its scheduler and worker find the old
instance gone (EPIPE) and attach to the new one. The warm run must hit every full block
but the last one, read them from L2 (kvring_l2_blocks_total{op="read",result="ok"} of the
new instance), and produce the cold run's tokens and logprobs.
"""

from __future__ import annotations

from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    l2 = d / "l2"
    l2.mkdir()
    kv = kt.Kvringd(d, l2_dir=l2)
    eng = kt.Engine(d, "l2", kv_transfer_config=kt.connector_config(kv.socket, reattach_interval_ms=200))
    try:
        p = kt.prompt(21, 9 * BLOCK + 3)
        cold = eng.generate([p])[0]
        check(cold["num_cached_tokens"] == 0, f"cold run hit {cold['num_cached_tokens']} tokens")
        kv.wait_metric("kvring_store_blocks_total", 9, result="stored")
        kv.wait_metric("kvring_l2_blocks_total", 9, op="write", result="ok")
        rc = kv.stop()
        check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")
        kv.start()
        files = kv.metric("kvring_l2_files")
        check(files >= 9, f"the restarted kvringd serves {files:.0f} L2 files, want >= 9")

        warm = eng.generate([p])[0]
        check(
            warm["num_cached_tokens"] == 9 * BLOCK,
            f"warm run after the restart hit {warm['num_cached_tokens']} tokens, want {9 * BLOCK}",
        )
        reads = kv.metric("kvring_l2_blocks_total", op="read", result="ok")
        check(reads >= 9, f"the restarted kvringd read {reads:.0f} blocks from L2, want >= 9")
        check(cold["tokens"] == warm["tokens"], f"warm tokens {warm['tokens']} != cold {cold['tokens']}")
        delta = kt.max_logprob_delta(cold, warm)
        check(delta <= 1e-4, f"logprobs differ by {delta:.3g} (> 1e-4)")
        kv.wait_slots_quiet()  # the promotions, the lease and the load left no pin or open slot
        kt.log(
            f"after the restart: hit {warm['num_cached_tokens']}/{len(p)} from L2 ({reads:.0f} block reads), "
            f"tokens equal, max logprob delta {delta:.2g}"
        )
        check(
            "attached to kvringd at" in eng.log_text() and "again" in eng.log_text(),
            "the engine's log does not say it attached to the restarted kvringd",
        )
    finally:
        eng.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
