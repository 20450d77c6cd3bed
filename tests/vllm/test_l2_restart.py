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
    with kt.serving(kv, eng):
        p = kt.prompt(21, 9 * BLOCK + 3)
        cold = kt.cold_run(eng, p)
        kv.wait_metric("kvring_store_blocks_total", 9, result="stored")
        kv.wait_metric("kvring_l2_blocks_total", 9, op="write", result="ok")
        kv.restart()
        files = kv.metric("kvring_l2_files")
        check(files >= 9, f"the restarted kvringd serves {files:.0f} L2 files, want >= 9")

        warm = kt.warm_equal(eng, "warm run after the restart", p, cold)
        reads = kv.metric("kvring_l2_blocks_total", op="read", result="ok")
        check(reads >= 9, f"the restarted kvringd read {reads:.0f} blocks from L2, want >= 9")
        delta = kt.max_logprob_delta(cold, warm)
        kv.wait_slots_quiet()  # the promotions, the lease and the load left no pin or open slot
        kt.log(
            f"after the restart: hit {warm['num_cached_tokens']}/{len(p)} from L2 ({reads:.0f} block reads), "
            f"tokens equal, max logprob delta {delta:.2g}"
        )
        check(
            "attached to kvringd at" in eng.log_text() and "again" in eng.log_text(),
            "the engine's log does not say it attached to the restarted kvringd",
        )


if __name__ == "__main__":
    kt.run(main)
