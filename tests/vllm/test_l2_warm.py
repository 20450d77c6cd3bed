"""Warm from L2 under vLLM: an L1 smaller than the workload, and the disk actor killed mid-promotion.

kvringd runs with an L1 of 2 MiB (31 blocks of the tiny model, 64 KiB each) and an L2
directory in write-through mode; the workload is 6 prompts of 8 full blocks (48 blocks, half
again L1). The cold pass stores every prompt (all 48 written through); the warm pass asks
for them again in the same order, so under LRU each prompt's blocks left L1 before it is
asked for again and come back from disk: every warm request hits every full block, L2 reads are counted
(kvring_l2_blocks_total{op="read",result="ok"}), and tokens and logprobs equal the cold
pass (seed 004's "evict" validation: both tiers active, each counted).

Then the disk actor is killed while it holds a promotion: the disk actor's read gate
(KVRING_TEST_READ_GATE, actors/disk/disk.c) makes the next L2 read wait on a FIFO, the
test sees it held (held.log), kills the disk actor (SIGKILL) and removes the FIFO. The
lookup actor ends the promotion (-EPIPE), the lease covers only what is resident, vLLM
recomputes the rest: the request completes with the cold pass's tokens, nothing hangs,
the slot table ends quiet, kvringd restarted the disk actor, and a later warm request is
served from L2 again.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check

PROMPTS = 6
FULL = 8


def main(d: Path) -> None:
    l2 = d / "l2"
    l2.mkdir()
    gate = d / "gate"
    gate.mkdir()
    os.environ["KVRING_TEST_READ_GATE"] = str(gate)  # the disk actor inherits it; no FIFO yet: reads run
    # 2 MiB, not less: with 16 slots a prompt's store (8 blocks) could meet the previous
    # prompt's store still WRITING its 8 and no L2 write in flight to wait for, and get
    # NOROOM for a block (a store in flight is not room the lookup actor waits for)
    kv = kt.Kvringd(d, l2_dir=l2, l1_bytes="2MiB")
    del os.environ["KVRING_TEST_READ_GATE"]
    eng = kt.Engine(d, "l2warm", kv_transfer_config=kt.connector_config(kv.socket))
    try:
        prompts = [kt.prompt(400 + i, FULL * BLOCK + 7) for i in range(PROMPTS)]
        cold = [eng.generate([p])[0] for p in prompts]
        check(all(c["num_cached_tokens"] == 0 for c in cold), "the cold pass hit something")
        kv.wait_metric("kvring_store_blocks_total", PROMPTS * FULL, result="stored")
        kv.wait_metric("kvring_l2_blocks_total", PROMPTS * FULL, op="write", result="ok")
        slots = kv.inspect()["l1_slots"]
        total = sum(slots[k] for k in ("free", "writing", "committed", "evicting", "draining"))
        check(total < PROMPTS * FULL * 2 / 3, f"L1 has {total} slots: not smaller than the workload ({PROMPTS * FULL})")

        reads0 = kv.metric("kvring_l2_blocks_total", op="read", result="ok")
        warm = [eng.generate([p])[0] for p in prompts]
        worst = 0.0
        for i, (c, w) in enumerate(zip(cold, warm)):
            check(w["num_cached_tokens"] == FULL * BLOCK, f"warm {i} hit {w['num_cached_tokens']}, want {FULL * BLOCK}")
            check(w["tokens"] == c["tokens"], f"warm {i}: tokens {w['tokens']} != cold {c['tokens']}")
            worst = max(worst, kt.max_logprob_delta(c, w))
        check(worst <= 1e-4, f"warm logprobs differ from cold by {worst:.3g}")
        reads = kv.metric("kvring_l2_blocks_total", op="read", result="ok") - reads0
        check(reads >= PROMPTS * FULL - total, f"only {reads:.0f} blocks came from L2")
        kt.log(
            f"warm from L2: {PROMPTS}/{PROMPTS} prompts hit {FULL * BLOCK} tokens each with an L1 of {total} "
            f"slots for {PROMPTS * FULL} blocks; {reads:.0f} block reads from L2; tokens equal (delta {worst:.2g})"
        )
        kv.wait_slots_quiet()

        # ---- the disk actor dies holding a promotion ----
        disk_pid = kv.actor_pid("disk.0")
        held = gate / "held.log"  # every L2 read appends a line, held or not: count the new ones
        before = len(held.read_text().splitlines()) if held.exists() else 0
        os.mkfifo(gate / "gate")
        eng.submit([prompts[0]])  # on disk only: the warm pass's later prompts took L1
        deadline = time.monotonic() + 60
        while len(held.read_text().splitlines()) <= before:
            check(time.monotonic() < deadline, "no L2 read reached the gate within 60 s")
            time.sleep(0.02)
        os.kill(disk_pid, signal.SIGKILL)
        os.unlink(gate / "gate")  # the next disk actor reads freely
        out = eng.result()
        check(out[0]["tokens"] == cold[0]["tokens"], f"after the kill: tokens {out[0]['tokens']} != cold")
        check(kt.max_logprob_delta(cold[0], out[0]) <= 1e-4, "after the kill: logprobs differ")
        check(
            out[0]["num_cached_tokens"] < FULL * BLOCK,
            f"the request hit {out[0]['num_cached_tokens']} tokens although its promotion was killed",
        )
        kv.wait_slots_quiet()
        deadline = time.monotonic() + 30
        while True:
            try:
                if kv.actor_pid("disk.0") not in (0, disk_pid):
                    break
            except kt.TestFailure:
                pass
            check(time.monotonic() < deadline, "kvringd did not restart the disk actor")
            time.sleep(0.05)
        # a later warm request of a prompt that is on disk only is promoted by the new disk actor
        again = eng.generate([prompts[1]])[0]
        check(again["num_cached_tokens"] == FULL * BLOCK, f"after the restart: hit {again['num_cached_tokens']}")
        check(again["tokens"] == cold[1]["tokens"], "after the restart: tokens differ")
        kv.wait_slots_quiet()
        kt.log(
            f"disk actor killed holding a promotion: the request recomputed (hit {out[0]['num_cached_tokens']}), "
            "tokens equal, slot table quiet; the restarted disk actor serves L2 again"
        )
    finally:
        eng.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
