"""One row of vllm-bench: one vLLM engine, its phases, per-request numbers -> a JSON file.

    python engine_run.py SPEC.json RESULT.json

vllm_bench.py runs this in a process of its own for every row (so every engine starts
fresh, a crash fails one row and not the run, and the engine's processes are all ended
with it). SPEC holds the LLM() arguments, the prompts (token ids), the phases and where
kvringd's /metrics are; the environment (VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND,
PYTHONPATH) is set by the parent.

Per row: start the engine (timed), warm it up (the warm-up prompts twice, not measured:
the first forward of a fresh engine costs seconds), then every phase runs its prompts
one request at a time, in order:

- TTFT of a request = vLLM's own `RequestOutput.metrics.first_token_latency` (the
  frontend's time from the request's arrival to its first token; the engine is built with
  disable_log_stats=False so that it is filled in). With one request in flight there is
  no queueing, so this is the prefill (plus any KV load) of that prompt. The wall time of
  the generate() call and the engine core's scheduled -> first token time are kept too.
- Output: the generated token ids and the logprob of each (temperature 0, logprobs=1).
- num_cached_tokens: tokens vLLM did not compute (its prefix cache plus a connector's).
- kvring rows: kvringd's counters before and after the phase (/metrics).

Between phases the engine idles `settle_s`; with `wait_stores` it also waits until
kvringd's store counters stop moving (deferred stores have landed) so that the next phase
finds what the previous one stored.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from services import foreign_vllm, metric_sum, scrape

KVRING_COUNTERS = {
    # name in the result: (metric, labels)
    "lookups": ("kvring_lookup_requests_total", {}),
    "requested_tokens": ("kvring_requested_tokens_total", {}),
    "matched_tokens": ("kvring_matched_tokens_total", {}),
    "stored_blocks": ("kvring_store_blocks_total", {"result": "stored"}),
    "present_blocks": ("kvring_store_blocks_total", {"result": "present"}),
    "store_failed_blocks": ("kvring_store_blocks_total", {"result": "failed"}),
    "loaded_blocks": ("kvring_load_blocks_total", {"result": "loaded"}),
    "load_failed_blocks": ("kvring_load_blocks_total", {"result": "failed"}),
    "load_bytes": ("kvring_bytes_total", {"direction": "load"}),
    "store_bytes": ("kvring_bytes_total", {"direction": "store"}),
    "loads": ("kvring_load_duration_seconds_count", {}),
    "load_seconds": ("kvring_load_duration_seconds_sum", {}),
    "stores": ("kvring_store_duration_seconds_count", {}),
    "store_seconds": ("kvring_store_duration_seconds_sum", {}),
    "leases_held": ("kvring_leases", {}),
}


PER_REQUEST = ("lookups", "matched_tokens", "loaded_blocks", "load_failed_blocks", "loads", "load_seconds")


def kvring_counters(url: str | None) -> dict[str, float] | None:
    if not url:
        return None
    samples = scrape(url)
    return {k: metric_sum(samples, name, **labels) for k, (name, labels) in KVRING_COUNTERS.items()}


def wait_stores_settled(url: str, timeout: float = 30.0, quiet: float = 1.0) -> dict[str, Any]:
    """Wait until kvringd's store counters have not moved for `quiet` s and no lease is held."""
    t0 = time.monotonic()
    last = None
    since = t0
    while True:
        c = kvring_counters(url)
        assert c is not None
        key = (c["stored_blocks"], c["present_blocks"], c["store_failed_blocks"], c["stores"])
        now = time.monotonic()
        if key != last:
            last, since = key, now
        elif now - since >= quiet and c["leases_held"] == 0:
            return {"waited_s": round(now - t0, 3), "timed_out": False, "counters": c}
        if now - t0 > timeout:
            return {"waited_s": round(now - t0, 3), "timed_out": True, "counters": c}
        time.sleep(0.1)


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out_path = Path(sys.argv[2])
    result: dict[str, Any] = {"row": spec["row"], "ok": False, "error": None, "phases": [], "pid": os.getpid()}

    def save() -> None:
        out_path.write_text(json.dumps(result))

    try:
        t0 = time.perf_counter()
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(model=spec["model"], **spec["llm"])
        result["startup_s"] = time.perf_counter() - t0
        result["block_size"] = llm.llm_engine.vllm_config.cache_config.block_size
        sp = SamplingParams(
            temperature=0.0, max_tokens=spec["max_tokens"], logprobs=1, detokenize=False, ignore_eos=True
        )
        prompts = spec["prompts"]
        url = spec.get("metrics_url")

        def one(tokens: list[int]) -> dict[str, Any]:
            t = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=tokens)], sp, use_tqdm=False)[0]
            wall = time.perf_counter() - t
            comp = out.outputs[0]
            m = out.metrics
            lps = [d[tok].logprob for tok, d in zip(comp.token_ids, comp.logprobs or [])]
            return {
                "ttft_s": m.first_token_latency if m is not None and m.first_token_latency > 0 else None,
                "engine_prefill_s": (m.first_token_ts - m.scheduled_ts) if m is not None and m.scheduled_ts else None,
                "wall_s": wall,
                "num_cached_tokens": out.num_cached_tokens,
                "tokens": list(comp.token_ids),
                "logprobs": lps,
            }

        # Warm-up: the prompts twice (with a connector the second pass loads), then idle.
        t = time.perf_counter()
        result["warmup"] = []
        for _ in range(2):
            result["warmup"].append([one(w) for w in spec["warmup"]])
            time.sleep(spec.get("settle_s", 2.0))
            if url and spec.get("wait_stores"):
                wait_stores_settled(url)
        result["warmup_s"] = time.perf_counter() - t

        for i, ph in enumerate(spec["phases"]):
            if i:
                time.sleep(spec.get("settle_s", 2.0))
                if url and spec.get("wait_stores"):
                    result["phases"][-1]["settle"] = wait_stores_settled(url)
            rec: dict[str, Any] = {
                "name": ph["name"],
                "foreign_before": foreign_vllm(),
                "loadavg_before": os.getloadavg(),
                "kvring_before": kvring_counters(url),
                "requests": [],
            }
            result["phases"].append(rec)
            t = time.perf_counter()
            c0 = rec["kvring_before"]
            for pid in ph["prompt_ids"]:
                r = one(prompts[pid]["tokens"])
                r["id"] = pid
                if url:
                    # kvringd's counters after each request (scraped between requests,
                    # outside every timing): its loads happen in the request's first step.
                    c1 = kvring_counters(url)
                    r["kvring"] = {k: c1[k] - c0[k] for k in PER_REQUEST}
                    c0 = c1
                rec["requests"].append(r)
            rec["wall_s"] = time.perf_counter() - t
            rec["kvring_after"] = kvring_counters(url)
            rec["foreign_after"] = foreign_vllm()
            rec["loadavg_after"] = os.getloadavg()
            save()
        if url and spec.get("wait_stores"):
            result["phases"][-1]["settle"] = wait_stores_settled(url)
        result["ok"] = True
    except BaseException as e:  # noqa: BLE001 - a failed row is reported with its error
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()[-4000:]
    save()
    sys.stdout.flush()
    # The engine's own processes are ended by vLLM's atexit handler; the parent kills the
    # process group if anything is left.
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
