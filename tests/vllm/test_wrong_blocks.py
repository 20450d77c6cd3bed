"""Negative control: a connector that loads the wrong blocks must fail the suite's check.

The suite decides "the load was right" by comparing a warm run's tokens and logprobs
with the cold run's. This test proves that comparison can see a bad load: the connector's
test-only switch `test_wrong_blocks` loads leased block i into the request's block i+1
and leaves its first block unloaded, without telling vLLM. (A mere permutation of the
prefix's blocks would not be wrong enough: attention sums over the keys in any order,
so it computes the same thing up to rounding.) The warm run still reports
the hit (num_cached_tokens) and kvringd still counts the loads, yet its output must differ
from the cold run's; if it did not, the other tests' equality would prove nothing.
"""

from __future__ import annotations

from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    kv = kt.Kvringd(d)
    eng = kt.Engine(d, "wrong", kv_transfer_config=kt.connector_config(kv.socket, test_wrong_blocks=True))
    with kt.serving(kv, eng):
        p = kt.prompt(11, 8 * BLOCK + 5)
        cold = kt.cold_run(eng, p)
        kv.wait_metric("kvring_store_blocks_total", 8, result="stored")
        warm = eng.generate([p])[0]
        check(
            warm["num_cached_tokens"] == 8 * BLOCK,
            f"warm run hit {warm['num_cached_tokens']} tokens, want {8 * BLOCK} (the bad load must happen)",
        )
        loaded = kv.metric("kvring_load_blocks_total", result="loaded")
        check(loaded == 7, f"kvringd loaded {loaded:.0f} blocks, want 7 (8 leased, one left out)")
        delta = kt.max_logprob_delta(cold, warm)
        check(
            not kt.same_output(cold, warm),
            f"loading every block into the wrong place left tokens {warm['tokens']} and logprobs within "
            f"{delta:.3g} of the cold run: the suite's check cannot see a bad load",
        )
        kt.log(
            f"wrong blocks: tokens {'differ' if cold['tokens'] != warm['tokens'] else 'equal'}, "
            f"max logprob delta {delta:.3g} (the check fails, as it must)"
        )


if __name__ == "__main__":
    kt.run(main)
