"""One vLLM engine for the vLLM suite, driven by kvtest.Engine over a pipe.

    python engine_main.py '<LLM kwargs as JSON>' <reply fd>

Builds ``vllm.LLM(**kwargs)``, writes {"ready": true} to the reply fd, then answers each
request line on stdin ({"prompts": [[token ids]...], "max_tokens": N}) with one reply
line: per prompt the greedy output tokens, their logprobs, vLLM's num_cached_tokens, the
time to first token (from vLLM's request metrics when it has them) and the connector's
kv_transfer_params. A request line may also carry, per prompt, "kv_transfer_params" (as a
P/D proxy passes them on) and "cache_salt". EOF on stdin
shuts the engine down. vLLM's own logs go to stdout/stderr (the test's log file), so the
reply channel is a separate fd.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _ttft(out) -> float | None:
    """Seconds from the request's arrival to its first token (vLLM's own measure,
    RequestStateStats.first_token_latency); None unless the LLM has disable_log_stats=False."""
    m = getattr(out, "metrics", None)
    ft = getattr(m, "first_token_latency", None) if m is not None else None
    return float(ft) if ft else None


def main() -> None:
    args = json.loads(sys.argv[1])
    reply = os.fdopen(int(sys.argv[2]), "w", buffering=1)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**args)
    reply.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        max_tokens = int(req.get("max_tokens", 8))
        # optional per prompt: kv_transfer_params (what a P/D proxy passes from a prefill's
        # output to the decode request) and a cache salt (a prompt no cache shares)
        kvp = req.get("kv_transfer_params") or [None] * len(req["prompts"])
        salts = req.get("cache_salt") or [None] * len(req["prompts"])
        sps = [
            SamplingParams(
                temperature=0,
                max_tokens=max_tokens,
                logprobs=1,
                extra_args={"kv_transfer_params": k} if k is not None else None,
            )
            for k in kvp
        ]
        prompts = [
            TokensPrompt(prompt_token_ids=p, cache_salt=salt) if salt else TokensPrompt(prompt_token_ids=p)
            for p, salt in zip(req["prompts"], salts)
        ]
        try:
            t0 = time.monotonic()
            outs = llm.generate(prompts, sps, use_tqdm=False)
            wall = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails with it
            reply.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
            continue
        res = []
        for o in outs:
            c = o.outputs[0]
            lps = [float(lp[t].logprob) for lp, t in zip(c.logprobs or [], c.token_ids)]
            res.append(
                {
                    "tokens": list(c.token_ids),
                    "logprobs": lps,
                    "num_cached_tokens": int(o.num_cached_tokens or 0),
                    "ttft_s": _ttft(o),
                    "kv_transfer_params": getattr(o, "kv_transfer_params", None),
                }
            )
        reply.write(json.dumps({"outputs": res, "wall_s": wall}) + "\n")
    del llm


if __name__ == "__main__":
    main()
