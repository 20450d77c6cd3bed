"""The connector's timeouts are fenced: a timed-out load or store is cancelled, and its
blocks go back to vLLM only when the cancel completed (issue 22).

One engine with timeout_ms 1500 on a real kvringd:

- load: the loader is frozen (SIGSTOP) with the warm load in its ring; the connector's
  wait for the step's loads times out, it cancels the load (kvr_cancel) and keeps waiting
  for the cancel's completion — vLLM's forward pass must not run while a late copy could
  still land in those blocks. The test sees the connector log the cancel, checks that the
  engine has not answered (it is held by the fence), then lets the loader go on: the loader
  meets the cancel before its first chunk (kvring_fenced_requests_total{direction="load"}
  goes to 1), the connector reports the blocks failed, vLLM recomputes, and the output
  equals the cold run's.
- store: the storer is frozen while a new prompt finishes; the connector cancels the store
  after timeout_ms (short requests that store nothing keep the engine stepping, as traffic
  would), and the store completes -ECANCELED once the storer goes on: fenced,
  nothing of it committed (kvring_store_blocks_total{result="stored"} unchanged, the next
  run of that prompt misses), and the run after that stores it as usual.
"""

from __future__ import annotations

import os
import re
import select
import signal
import time
from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def wait_log(eng: kt.Engine, needle: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while needle not in eng.log_text():
        check(time.monotonic() < deadline, f"the engine never logged {needle!r}:\n{eng.log_tail()}")
        time.sleep(0.05)


def answered(eng: kt.Engine) -> bool:
    """Whether the engine has written a reply line (without waiting)."""
    return b"\n" in eng._buf or bool(select.select([eng._rfd], [], [], 0)[0])


def main(d: Path) -> None:
    kv = kt.Kvringd(d)
    eng = kt.Engine(d, "fence", kv_transfer_config=kt.connector_config(kv.socket, timeout_ms=1500))
    stopped = 0
    try:
        p = kt.prompt(41, 10 * BLOCK + 7)
        cold = eng.generate([p])[0]
        kv.wait_metric("kvring_store_blocks_total", 10, result="stored")
        slot = kv.worker_slots()[0]["slot"]

        # ---- a load that times out
        loader = kv.actor_pid(f"loader.{slot}")
        ring = f"load.req.{slot}"
        before = kv.ring(ring)["enqueued"]
        os.kill(loader, signal.SIGSTOP)
        stopped = loader
        eng.submit([p])
        deadline = time.monotonic() + 60
        while kv.ring(ring)["enqueued"] <= before:
            check(time.monotonic() < deadline, f"the warm load never reached {ring}")
            time.sleep(0.02)
        wait_log(eng, "cancelled, recomputing")
        # the engine is held by the fence: the loader is stopped, so the cancel cannot have
        # completed, and without its completion the step may not go on to the forward pass
        check(not answered(eng), "vLLM answered while the cancelled load could still land")
        check(kv.metric("kvring_fenced_requests_total", direction="load") == 0, "the loader moved while stopped")
        os.kill(loader, signal.SIGCONT)
        stopped = 0
        warm = eng.result(timeout=120)[0]
        check(kt.same_output(cold, warm), "the recompute after a cancelled load gave other outputs")
        fenced = kv.wait_metric("kvring_fenced_requests_total", 1, direction="load")
        check(fenced == 1, f"{fenced} loads fenced, want 1")
        kt.log("a timed-out load: cancelled, the engine held until its completion, recomputed with equal output")

        # ---- a store that times out. Stores go out in the step that computed the prompt and
        # the connector looks at their age in get_finished(), once a step: short requests
        # (under one block: they store nothing) keep the engine stepping meanwhile.
        stored = kv.metric("kvring_store_blocks_total", result="stored")
        storer = kv.actor_pid(f"storer.{slot}")
        os.kill(storer, signal.SIGSTOP)
        stopped = storer
        q = kt.prompt(42, 6 * BLOCK + 3)
        cancelled = re.compile(r"store of request \S+ not done within 1500 ms: cancelled")
        # a store of the phase before that was slower than timeout_ms on a busy machine was
        # cancelled too: count, so that only q's cancel ends the wait
        seen = len(cancelled.findall(eng.log_text()))
        first = eng.generate([q])[0]
        fillers = 0
        deadline = time.monotonic() + 120
        while len(cancelled.findall(eng.log_text())) <= seen:
            check(time.monotonic() < deadline, f"the connector never cancelled the store:\n{eng.log_tail()}")
            eng.generate([kt.prompt(100 + fillers, BLOCK - 5)], max_tokens=4)
            fillers += 1
        os.kill(storer, signal.SIGCONT)
        stopped = 0
        fenced = kv.wait_metric("kvring_fenced_requests_total", 1, direction="store")
        check(fenced == 1, f"{fenced} stores fenced, want 1")
        check(
            kv.metric("kvring_store_blocks_total", result="stored") == stored,
            "a cancelled store committed blocks",
        )
        again = eng.generate([q])[0]
        check(again["num_cached_tokens"] == 0, f"the cancelled store's prompt hit {again['num_cached_tokens']} tokens")
        check(kt.same_output(first, again), "outputs differ between two cold runs")
        eng.generate([kt.prompt(99, BLOCK - 5)], max_tokens=4)  # more steps: `again`'s blocks are freed
        kv.wait_metric("kvring_store_blocks_total", stored + 6, result="stored")
        third = eng.generate([q])[0]
        check(third["num_cached_tokens"] == 6 * BLOCK, f"after a normal store the prompt hit {third['num_cached_tokens']}")
        check(kt.same_output(first, third), "the warm run after the cancelled store gave other outputs")
        kv.wait_slots_quiet()
        kt.log("a timed-out store: cancelled, nothing committed; the next store of the prompt landed and hit")
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        eng.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
