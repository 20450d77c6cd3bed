"""The loader actor killed during a warm load: vLLM neither crashes nor hangs, recomputes.

To kill the loader while it holds the load (not before, not after), the test freezes it
first (SIGSTOP), sends the warm request, waits until the load request is in the loader's
ring (kvring-inspect: load.req.<slot> enqueued one more), then kills it (SIGKILL).
libkvring fails the load (EPIPE, every block), the connector reports those blocks to vLLM
(get_block_ids_with_load_errors) and vLLM, with kv_load_failure_policy="recompute",
recomputes them. The test checks:

- the request completes, with the cold run's tokens and logprobs (within 1e-4);
- vLLM logged that it recovered from the load failure, and the connector that blocks did
  not load;
- kvringd restarted the loader, and the next warm run loads again (kvringd counts the
  loaded blocks) with the same output.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    kv = kt.Kvringd(d)
    eng = kt.Engine(d, "kill", kv_transfer_config=kt.connector_config(kv.socket))
    stopped = 0
    try:
        p = kt.prompt(31, 12 * BLOCK + 9)
        cold = eng.generate([p])[0]
        kv.wait_metric("kvring_store_blocks_total", 12, result="stored")
        workers = kv.worker_slots()
        check(len(workers) == 1, f"{len(workers)} workers attached, want 1")
        slot = workers[0]["slot"]
        loader = f"loader.{slot}"
        pid = kv.actor_pid(loader)
        ring = f"load.req.{slot}"
        before = kv.ring(ring)["enqueued"]

        os.kill(pid, signal.SIGSTOP)
        stopped = pid
        eng.submit([p])
        deadline = time.monotonic() + 60
        while kv.ring(ring)["enqueued"] <= before:
            check(time.monotonic() < deadline, f"the warm load never reached {ring}")
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        stopped = 0
        kt.log(f"killed {loader} (pid {pid}) holding the warm load")
        warm = eng.result(timeout=120)[0]
        check(eng.proc.poll() is None, "vLLM exited after the loader was killed")
        check(
            cold["tokens"] == warm["tokens"], f"tokens after the failed load {warm['tokens']} != cold {cold['tokens']}"
        )
        delta = kt.max_logprob_delta(cold, warm)
        check(delta <= 1e-4, f"logprobs after the failed load differ by {delta:.3g}")
        text = eng.log_text()
        check("Recovered from KV load failure" in text, "vLLM did not log recovering from the load failure")
        check("did not load" in text, "the connector did not report the failed blocks")

        new_pid = kv.actor_pid(loader)
        deadline = time.monotonic() + 30
        while not new_pid or new_pid == pid:
            check(time.monotonic() < deadline, f"kvringd did not restart {loader}")
            time.sleep(0.05)
            new_pid = kv.actor_pid(loader)
        loaded = kv.metric("kvring_load_blocks_total", result="loaded")
        again = eng.generate([p])[0]
        check(again["num_cached_tokens"] == 12 * BLOCK, f"after the restart the hit is {again['num_cached_tokens']}")
        kv.wait_metric("kvring_load_blocks_total", loaded + 12, result="loaded")
        check(kt.same_output(cold, again), "the load after the loader's restart gave other outputs")
        kv.wait_slots_quiet()  # the killed load's pins and its lease ended with nothing left behind
        kt.log(
            f"loader killed mid-load: recomputed, tokens equal (delta {delta:.2g}); {loader} restarted "
            f"(pid {new_pid}) and the next warm run loaded 12 blocks"
        )
    finally:
        if stopped:
            os.kill(stopped, signal.SIGKILL)
        eng.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
