"""Two vLLM engines of the same model on one kvringd: the second hits the first's prefix.

Engine A and engine B run at the same time (one CPU core each), each attached with its
own engine id (vLLM's) and the model namespace the connector derives from the model (the
same files: the same namespace), so kvringd has two rank-0 workers attached at once.
A's cold run stores a prompt; B's run of the same prompt hits every full block A stored
and gives A's tokens and logprobs; B's prompt that extends A's prefix hits the prefix.
Finally scheduler clients of this test (the Python binding, no vLLM) show the namespace
rule: under the engines' namespace the prefix is there, under another namespace it is
not — kvringd's model.model_id (the binding's default) included: it is not the
connector's namespace.
"""

from __future__ import annotations

from pathlib import Path

import kvring
import kvtest as kt
from kvtest import BLOCK, check


def main(d: Path) -> None:
    kv = kt.Kvringd(d)
    # both start at once, one core each
    a = kt.Engine(d, "A", kv_transfer_config=kt.connector_config(kv.socket), threads_bind="0", wait=False)
    b = kt.Engine(d, "B", kv_transfer_config=kt.connector_config(kv.socket), threads_bind="1", wait=False)
    try:
        a.wait_started()
        b.wait_started()
        ns = kt.engine_namespace(a)
        ns_b = kt.engine_namespace(b)
        check(ns_b == ns, f"two engines of the same files: namespaces {ns!r} and {ns_b!r}")
        workers = kv.worker_slots()
        check(
            len(workers) == 2 and all(w["tp_rank"] == 0 for w in workers),
            f"attached workers: {workers}, want two rank-0 workers (one per engine)",
        )

        p = kt.prompt(51, 8 * BLOCK + 13)
        cold_a = a.generate([p])[0]
        check(cold_a["num_cached_tokens"] == 0, f"A's cold run hit {cold_a['num_cached_tokens']} tokens")
        kv.wait_metric("kvring_store_blocks_total", 8, result="stored")

        warm_b = b.generate([p])[0]
        check(
            warm_b["num_cached_tokens"] == 8 * BLOCK,
            f"engine B hit {warm_b['num_cached_tokens']} tokens of A's prompt, want {8 * BLOCK}",
        )
        check(cold_a["tokens"] == warm_b["tokens"], f"B's tokens {warm_b['tokens']} != A's {cold_a['tokens']}")
        delta = kt.max_logprob_delta(cold_a, warm_b)
        check(delta <= 1e-4, f"B's logprobs differ from A's by {delta:.3g}")

        longer = p[: 8 * BLOCK] + kt.prompt(52, 3 * BLOCK + 1)
        ext = b.generate([longer])[0]
        check(
            ext["num_cached_tokens"] == 8 * BLOCK,
            f"B's prompt extending A's prefix hit {ext['num_cached_tokens']}, want {8 * BLOCK}",
        )
        kt.log(
            f"engine B hit A's prefix: {warm_b['num_cached_tokens']}/{len(p)} tokens, tokens equal "
            f"(delta {delta:.2g}); an extension of it hit {ext['num_cached_tokens']}"
        )

        with kvring.Scheduler(socket=kv.socket, engine_id="probe-same", model_ns=ns) as s:
            same = s.lease(7, p, loaders=1, ttl_ms=1000)
            s.lease_release(7)
        with kvring.Scheduler(socket=kv.socket, engine_id="probe-other", model_ns="another-model") as s:
            other = s.lease(7, p, loaders=1, ttl_ms=1000)
        with kvring.Scheduler(socket=kv.socket, engine_id="probe-model-id") as s:  # kvringd's model_id
            model_id = s.lease(7, p, loaders=1, ttl_ms=1000)
        check(same.matched_blocks == 8, f"the engines' namespace holds {same.matched_blocks} blocks of A's prompt")
        check(other.matched_blocks == 0, f"another namespace sees {other.matched_blocks} blocks of A's prompt")
        check(model_id.matched_blocks == 0, f"kvringd's model_id sees {model_id.matched_blocks} blocks of A's prompt")
    finally:
        a.close()
        b.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
