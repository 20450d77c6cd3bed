"""vLLM + kvringd: a cold run stores, the same prompt again loads, a half-shared prompt hits half.

One kvringd (L1 only), one vLLM engine with KvringConnector and vLLM's own prefix cache
off, so every cached token vLLM reports came from kvring:

1. cold: three prompts (10 and 6 blocks + a partial block, and exactly 4 blocks); nothing
   cached; their full prompt blocks are stored once the requests finish (waited for on
   kvringd's counter);
2. warm: the same prompts hit every full block (num_cached_tokens >= prompt - one block);
   the prompt of whole blocks hits all but its last token, which vLLM computes over the
   last block loaded whole; all give the cold run's tokens with logprobs within 1e-4;
3. a prompt sharing the first half (5 blocks) of the first prompt hits exactly those.
"""

from __future__ import annotations

from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    kv = kt.Kvringd(d)
    eng = kt.Engine(d, "a", kv_transfer_config=kt.connector_config(kv.socket))
    with kt.serving(kv, eng):
        p1 = kt.prompt(1, 10 * BLOCK + 7)
        p2 = kt.prompt(2, 6 * BLOCK + 20)
        p3 = kt.prompt(3, 4 * BLOCK)
        cold = eng.generate([p1, p2, p3])
        for o in cold:
            check(o["num_cached_tokens"] == 0, f"cold run hit {o['num_cached_tokens']} tokens")
        stored = kv.wait_metric("kvring_store_blocks_total", 20, result="stored")
        kt.log(f"cold: stored {stored:.0f} blocks")

        warm = eng.generate([p1, p2, p3])
        for i, (c, w, p) in enumerate(zip(cold, warm, [p1, p2, p3])):
            want = min(len(p) // BLOCK * BLOCK, len(p) - 1)  # vLLM computes the last token
            check(
                w["num_cached_tokens"] >= len(p) - BLOCK and w["num_cached_tokens"] == want,
                f"prompt {i}: warm run hit {w['num_cached_tokens']} of {len(p)} tokens, want {want}",
            )
            check(c["tokens"] == w["tokens"], f"prompt {i}: warm tokens {w['tokens']} != cold {c['tokens']}")
            delta = kt.max_logprob_delta(c, w)
            check(delta <= 1e-4, f"prompt {i}: logprobs differ by {delta:.3g} (> 1e-4)")
            kt.log(f"prompt {i}: hit {w['num_cached_tokens']}/{len(p)}, tokens equal, max logprob delta {delta:.2g}")
        loaded = kv.metric("kvring_load_blocks_total", result="loaded")
        check(loaded >= 16, f"kvringd loaded {loaded:.0f} blocks, want >= 16")

        half = p1[: 5 * BLOCK] + kt.prompt(3, 5 * BLOCK + 7)
        h = eng.generate([half])[0]
        check(
            h["num_cached_tokens"] == 5 * BLOCK,
            f"half-shared prompt hit {h['num_cached_tokens']} tokens, want {5 * BLOCK}",
        )
        kt.log(f"half-shared prompt hit {h['num_cached_tokens']}/{len(half)}")


if __name__ == "__main__":
    kt.run(main)
