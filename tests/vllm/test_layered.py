"""vLLM + kvringd with layered loads on: the forward pass starts on a layer once it is in place.

One kvringd (L1 only), one engine with `layered_loads: "on"` (the connector's CPU default is
off: docs/benchmarks.md) and vLLM's prefix cache off:

1. cold: two prompts (12 blocks + a partial one, 8 blocks exactly) are computed and stored;
2. warm: the same prompts load through kvr_load_layered; vLLM calls wait_for_layer_load
   before each attention layer and the connector waits for that layer alone (its log says
   so for the first layered step: one wait per layer, layers in place before the last); the
   outputs equal the cold run's (tokens, logprobs within 1e-4) and every full block hit.
(That the loader copies layer by layer and publishes each layer is tests/loader's and
tests/client's: stepped one chunk at a time, and through a real kvringd.)
"""

from __future__ import annotations

import re
from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    kv = kt.Kvringd(d)
    eng = kt.Engine(d, "a", kv_transfer_config=kt.connector_config(kv.socket, layered_loads="on"))
    try:
        p1 = kt.prompt(11, 12 * BLOCK + 9)
        p2 = kt.prompt(12, 8 * BLOCK)
        cold = eng.generate([p1, p2])
        for o in cold:
            check(o["num_cached_tokens"] == 0, f"cold run hit {o['num_cached_tokens']} tokens")
        stored = kv.wait_metric("kvring_store_blocks_total", 20, result="stored")
        kt.log(f"cold: stored {stored:.0f} blocks")

        warm = eng.generate([p1, p2])
        for i, (c, w, p) in enumerate(zip(cold, warm, [p1, p2])):
            want = min(len(p) // BLOCK * BLOCK, len(p) - 1)
            check(w["num_cached_tokens"] == want, f"prompt {i}: warm hit {w['num_cached_tokens']} tokens, want {want}")
            check(c["tokens"] == w["tokens"], f"prompt {i}: warm tokens {w['tokens']} != cold {c['tokens']}")
            delta = kt.max_logprob_delta(c, w)
            check(delta <= 1e-4, f"prompt {i}: logprobs differ by {delta:.3g} (> 1e-4)")
            kt.log(f"prompt {i}: hit {w['num_cached_tokens']}/{len(p)}, tokens equal, max logprob delta {delta:.2g}")
        m = re.search(
            r"layered loads: the first step's (\d+) loads were waited for layer by layer "
            r"\((\d+) layer waits, (\d+) layers in place before the last\)",
            eng.log_text(),
        )
        check(m is not None, f"the connector did not report a layered step:\n{eng.log_tail()}")
        loads, waits, before_last = (int(g) for g in m.groups())
        layers = kt.MODEL_CONFIG["num_hidden_layers"]
        check(loads >= 1 and waits == layers, f"first layered step: {loads} loads, {waits} layer waits, want {layers}")
        check(before_last == layers - 1, f"{before_last} layers in place before the last, want {layers - 1}")
        check("did not call wait_for_layer_load" not in eng.log_text(), "the connector fell back to whole loads")
        loaded = kv.metric("kvring_load_blocks_total", result="loaded")
        check(loaded >= 20, f"kvringd loaded {loaded:.0f} blocks, want >= 20")
        kt.log(f"first layered step: {loads} loads, {waits} layer waits; {loaded:.0f} blocks loaded")
    finally:
        eng.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
