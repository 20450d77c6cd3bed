"""Prefill/decode on one node: the decode engine is served from the prefill engine's store.

Engine P runs its EngineCore in the test's engine process (VLLM_ENABLE_V1_MULTIPROCESSING=0):
it steps only while LLM.generate has unfinished requests, so once a generate call returned
it runs no step at all. First P prefills one prompt with max_tokens=1 and is left idle: the
store of its prompt was submitted by the step whose forward pass computed it (the
connector's wait_for_save), so it commits with P idle — kvringd's stored-block count reaches
the prompt's full blocks — and D, given P's kv_transfer_params, leases once (no "ask again
later"), loads every full block and decodes the tokens of a cold run. (With the store
deferred to P's next step, it would never commit while P is idle.)

Then engine P (the prefill engine) answers 16 prompts with max_tokens=1 while its storer holds
every copy (KVRING_TEST_STORE_HOLD: a store's slots are allocated, WRITING, not committed),
so the prefill's outputs come back with their stores still in flight — the moment a P/D
proxy sends the request on. Engine D (the decode engine) gets the 16 prompts at once with
the kv_transfer_params P's outputs carry ({"kvring": {"stored_tokens": N}}), exactly as
vLLM's P/D proxies pass them on. Every one of D's requests leases while nothing of its
prefix is committed; the connector answers vLLM "ask again later" (None) instead of
recomputing. The hold is lifted: every decode hits every full block, and its tokens and
logprobs equal a cold single-engine run of the same prompt (made before, under a cache
salt, so it shares nothing).

Then the producer dies: P prefills 4 more prompts with the hold on, D gets them, P is
killed -9. P's stores are never committed (its worker is gone, its slots aborted); D's
requests wait at most store_wait_ms and recompute — no hang, tokens equal to the cold run
— and the slot table ends quiet.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check

# P's EngineCore inside its engine process (no EngineCore process): it steps only inside LLM.generate
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

N = 16
FULL = 4  # full blocks per prompt
WAIT_MS = 3000


def compare(what: str, outs: list[dict], refs: list[dict], want_cached: int) -> float:
    worst = 0.0
    for i, (o, r) in enumerate(zip(outs, refs)):
        check(
            o["num_cached_tokens"] == want_cached,
            f"{what} {i}: {o['num_cached_tokens']} tokens from kvring, want {want_cached}",
        )
        check(o["tokens"] == r["tokens"], f"{what} {i}: tokens {o['tokens']} != cold {r['tokens']}")
        worst = max(worst, kt.max_logprob_delta(o, r))
    check(worst <= 1e-4, f"{what}: logprobs differ from the cold run by {worst:.3g}")
    return worst


def main(d: Path) -> None:
    hold = d / "store-hold"
    os.environ["KVRING_TEST_STORE_HOLD"] = str(hold)  # kvringd's storers inherit it
    kv = kt.Kvringd(d)
    del os.environ["KVRING_TEST_STORE_HOLD"]
    cfg = kt.connector_config(kv.socket, store_wait_ms=WAIT_MS)
    p = kt.Engine(d, "P", kv_transfer_config=cfg, threads_bind="0", wait=False, env=IN_PROCESS)
    dec = kt.Engine(d, "D", kv_transfer_config=cfg, threads_bind="1", wait=False)
    try:
        p.wait_started()
        dec.wait_started()
        prompts = [kt.prompt(700 + i, FULL * BLOCK + 5 + i) for i in range(N + 4)]
        one = kt.prompt(900, FULL * BLOCK + 7)
        # the cold reference: the same prompts under a cache salt (other keys: nothing shared)
        refs = p.generate(prompts + [one], max_tokens=8, cache_salt=["cold-reference"] * (len(prompts) + 1))
        check(all(r["num_cached_tokens"] == 0 for r in refs), "the salted reference run hit something")
        ref_one = refs.pop()
        stored = (len(prompts) + 1) * FULL
        # P is idle from here on: these stores were submitted by the steps that computed them
        kv.wait_metric("kvring_store_blocks_total", stored, result="stored")

        # ---- P prefills one prompt and stays idle: its store commits without another step ----
        pre = p.generate([one], max_tokens=1)[0]
        params = pre.get("kv_transfer_params") or {}
        check(
            params.get("kvring", {}).get("stored_tokens") == FULL * BLOCK,
            f"prefill: kv_transfer_params {params!r}, want kvring.stored_tokens {FULL * BLOCK}",
        )
        check(pre["tokens"][0] == ref_one["tokens"][0], "prefill: first token differs from the cold run")
        t0 = time.monotonic()
        stored += FULL
        kv.wait_metric("kvring_store_blocks_total", stored, result="stored")
        commit_s = time.monotonic() - t0
        asked = kv.metric("kvring_lookup_requests_total")
        in_flight = kv.metric("kvring_miss_tokens_total", reason="in_flight")
        out = dec.generate([one], max_tokens=8, kv_transfer_params=[pre["kv_transfer_params"]])[0]
        compare("decode of the idle prefill's prompt", [out], [ref_one], FULL * BLOCK)
        lookups = kv.metric("kvring_lookup_requests_total") - asked
        check(lookups == 1, f"the decode leased {lookups} times, want once (no 'ask again later')")
        check(
            kv.metric("kvring_miss_tokens_total", reason="in_flight") == in_flight,
            "the decode's lease found blocks in flight",
        )
        kt.log(
            f"idle prefill: its {FULL} blocks committed {commit_s * 1e3:.0f} ms after its response with P running "
            f"no step; the decode leased once and loaded {FULL * BLOCK} tokens, tokens equal to the cold run"
        )

        # ---- P/D with the prefill's stores in flight ----
        hold.touch()
        pre = p.generate(prompts[:N], max_tokens=1)
        for i, o in enumerate(pre):
            params = o.get("kv_transfer_params") or {}
            check(
                params.get("kvring", {}).get("stored_tokens") == FULL * BLOCK,
                f"prefill {i}: kv_transfer_params {params!r}, want kvring.stored_tokens {FULL * BLOCK}",
            )
            check(o["tokens"][0] == refs[i]["tokens"][0], f"prefill {i}: first token differs from the cold run")
        check(kv.inspect()["l1_slots"]["writing"] > 0, "the prefill's stores are not in flight (nothing WRITING)")
        asked = kv.metric("kvring_lookup_requests_total")
        t0 = time.monotonic()
        dec.submit(prompts[:N], max_tokens=8, kv_transfer_params=[o["kv_transfer_params"] for o in pre])
        # every decode request asked once (and was told to wait) while nothing was committed
        kv.wait_metric("kvring_lookup_requests_total", asked + N)
        check(kv.metric("kvring_store_blocks_total", result="stored") == stored, "a held store committed")
        waited = kv.metric("kvring_miss_tokens_total", reason="in_flight")
        check(waited >= N * FULL * BLOCK, f"kvring_miss_tokens_total{{reason=in_flight}} = {waited}: the decode's "
              "leases did not see the stores in flight")
        hold.unlink()
        outs = dec.result()
        pd_s = time.monotonic() - t0
        delta = compare("decode", outs, refs[:N], FULL * BLOCK)
        kt.log(
            f"P/D: {N}/{N} decode requests served from the prefill's stores (held, then committed), "
            f"{FULL * BLOCK} tokens each, tokens equal to the cold run (logprob delta {delta:.2g}), {pd_s:.1f} s"
        )
        kv.wait_metric("kvring_store_blocks_total", stored + N * FULL, result="stored")

        # ---- the producer dies with its stores in flight ----
        hold.touch()
        late = prompts[N:]
        pre = p.generate(late, max_tokens=1)
        asked = kv.metric("kvring_lookup_requests_total")
        t0 = time.monotonic()
        dec.submit(late, max_tokens=8, kv_transfer_params=[o["kv_transfer_params"] for o in pre])
        kv.wait_metric("kvring_lookup_requests_total", asked + len(late))
        p.kill()
        outs = dec.result()
        waited = time.monotonic() - t0
        hold.unlink()
        compare("decode after the producer's death", outs, refs[N:], 0)
        check(waited < WAIT_MS / 1000 + 60, f"the decode took {waited:.1f} s")
        kv.wait_slots_quiet()
        kt.log(
            f"producer killed -9 with {len(late)} stores in flight: the decode recomputed after {waited:.1f} s "
            f"(store_wait_ms {WAIT_MS}), tokens equal, slot table quiet"
        )
    finally:
        p.close()
        dec.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
