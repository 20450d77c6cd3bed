"""Tensor parallelism 2 on the CPU: both ranks attach, store their lane, load it, tokens equal.

kvringd serves the model with model.tp_size 2: a block is stored in two lanes, one per
rank (each rank holds one of the two KV heads), and committed only when both lanes are.
The vLLM engine runs two worker processes (VLLM_CPU_OMP_THREADS_BIND='0|1'); each rank's
connector attaches as a worker of the same engine with its TP rank. The scheduler leases
for two loaders. Checks: two workers attached with ranks 0 and 1; the cold run stores
every full block on both ranks; the warm run hits, both ranks load (kvringd counts two
loaded lanes per block) and the output equals the cold run's.
"""

from __future__ import annotations

from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    kv = kt.Kvringd(d, tp_size=2)
    eng = kt.Engine(d, "tp2", kv_transfer_config=kt.connector_config(kv.socket), tp=2)
    with kt.serving(kv, eng):
        ranks = sorted((w["tp_rank"], w["tp_size"]) for w in kv.worker_slots())
        check(ranks == [(0, 2), (1, 2)], f"attached workers (tp_rank, tp_size): {ranks}, want both ranks of 2")
        p = kt.prompt(41, 7 * BLOCK + 11)
        cold = kt.cold_run(eng, p)
        kv.wait_metric("kvring_store_blocks_total", 2 * 7, result="stored")
        warm = kt.warm_equal(eng, "warm", p, cold)
        loaded = kv.wait_metric("kvring_load_blocks_total", 2 * 7, result="loaded")
        delta = kt.max_logprob_delta(cold, warm)
        kt.log(
            f"TP 2: hit {warm['num_cached_tokens']}/{len(p)}, {loaded:.0f} lanes loaded (both ranks), "
            f"tokens equal, max logprob delta {delta:.2g}"
        )


if __name__ == "__main__":
    kt.run(main)
