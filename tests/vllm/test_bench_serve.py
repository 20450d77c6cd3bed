"""The serving bench in small (issue 25): `tools/vllm-bench --serve` end to end.

Two rows, baseline (no connector) and kvring (KvringConnector -> a kvringd the tool
starts), each a real `vllm serve` measured by two runs of `vllm bench serve` (random
dataset: 4 prompts x 512 tokens, 4 output tokens, --max-concurrency 2): a cold pass, then
a warm pass with the same prompts. The tool runs as its users run it (a process of its
own; it starts and ends every server); this test reads the JSON it writes and checks:

- every request of every pass completed (4/4, none failed) and the tool exited 0;
- outputs: the baseline's second pass equals its first, kvring's cold pass equals the
  baseline's, kvring's warm pass equals its cold pass and the baseline's (4/4 each, the
  generated texts of all 4 tokens, special tokens kept);
- the cold pass found nothing in kvringd (4 lookups, 0 of 2,048 tokens matched) and
  computed every prompt token; the warm pass hit every block (kvringd: 2,048 of 2,048
  tokens matched, 16 blocks loaded) and vLLM took all but the last token of each prompt
  from the connector (4 x 511 = 2,044 external tokens, none computed beyond those 4);
- the baseline hit nothing in either pass (no connector, no prefix cache).

Timings are printed, not checked: a machine shared with other jobs moves them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import kvtest as kt
from kvtest import check

TOOL = kt.SRC / "tools" / "vllm-bench" / "vllm_bench.py"
PROMPTS, LEN, OUT, CONC = 4, 512, 4, 2
BLOCK = 128  # the bench model's block size (the tool's --block-size default)
TIMEOUT = 780  # the tool's whole run; meson's timeout for the test is 900 s


def run_tool(d: Path) -> tuple[int, str]:
    argv = [
        sys.executable,
        str(TOOL),
        "--serve",
        "--rows",
        "baseline,kvring",
        "--num-prompts",
        str(PROMPTS),
        "--input-len",
        str(LEN),
        "--output-len",
        str(OUT),
        "--concurrency",
        str(CONC),
        "--out",
        str(d),
        "--build",
        str(kt.BUILD),
        # the bench model with its tokenizer, made once next to the suite's other models
        "--model",
        str(kt.BUILD / "vllm-test-models" / "bench-llama-serve"),
        "--wait-max",
        "0",
        "--retries",
        "0",
        "--settle",
        "0.5",
        "--start-timeout",
        "300",
        "--pass-timeout",
        "300",
        "--no-plot",
    ]
    log_path = d / "tool.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            # SIGTERM unwinds the tool through its clean-ups (every server's process group)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise kt.TestFailure(f"the tool ran over {TIMEOUT} s:\n{tail(log_path)}") from None
    return rc, tail(log_path, 40)


def tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def main(d: Path) -> None:
    rc, out = run_tool(d)
    doc_path = d / "vllm-bench-serve.json"
    check(doc_path.exists(), f"the tool wrote no JSON (exit {rc}):\n{out}")
    doc = json.loads(doc_path.read_text())
    rows, S = doc["rows"], doc["summary"]["rows"]
    for name in ("baseline", "kvring"):
        check(rows[name].get("ok"), f"row {name} failed: {rows[name].get('error')}\n{out}")
        for p in rows[name]["passes"]:
            b = p["bench"]
            check(b["completed"] == PROMPTS and not b["failed"],
                  f"{name} {p['name']}: {b['completed']} completed, {b['failed']} failed")
            check(b["total_input_tokens"] == PROMPTS * LEN,
                  f"{name} {p['name']}: {b['total_input_tokens']} prompt tokens, want {PROMPTS * LEN}")
    check(rc == 0, f"the tool exited {rc}:\n{out}")

    def match(row: str, ph: str, what: str) -> None:
        m = S[row]["passes"][ph][what]
        check(m["n"] == PROMPTS and m["same"] == PROMPTS,
              f"{row} {ph} {what}: {m['same']}/{m['n']} outputs equal (mismatched {m['mismatched']})")

    match("baseline", "warm", "match_vs_cold")
    match("kvring", "cold", "match_vs_baseline")
    match("kvring", "warm", "match_vs_cold")
    match("kvring", "warm", "match_vs_baseline")

    cold, warm = rows["kvring"]["passes"]
    kc, kw = cold["kvringd"], warm["kvringd"]
    check(kc["lookups"] == PROMPTS and kc["matched_tokens"] == 0 and kc["requested_tokens"] == PROMPTS * LEN,
          f"cold pass: kvringd {kc['lookups']:.0f} lookups, {kc['matched_tokens']:.0f}/{kc['requested_tokens']:.0f} "
          "tokens matched; want 4 lookups, nothing matched")
    ec = cold["vllm"]["kvring-engine"]
    check(ec["computed_tokens"] == PROMPTS * LEN and ec["external_tokens"] == 0,
          f"cold pass: vLLM computed {ec['computed_tokens']:.0f}, took {ec['external_tokens']:.0f} from kvring")
    # the cold pass's stores, landed by the time the warm pass starts (the tool waits for them)
    before = cold["kvringd_after"]["stored_blocks"] - kc["stored_blocks"]
    stored = cold["settle"]["counters"]["stored_blocks"] - before
    check(stored == PROMPTS * LEN // BLOCK,
          f"the cold pass stored {stored:.0f} blocks before the warm pass, want {PROMPTS * LEN // BLOCK}")
    check(kw["matched_tokens"] == kw["requested_tokens"] == PROMPTS * LEN,
          f"warm pass: kvringd matched {kw['matched_tokens']:.0f} of {kw['requested_tokens']:.0f} tokens, "
          f"want all {PROMPTS * LEN}")
    check(kw["loaded_blocks"] == PROMPTS * LEN // BLOCK and kw["load_failed_blocks"] == 0,
          f"warm pass: {kw['loaded_blocks']:.0f} blocks loaded ({kw['load_failed_blocks']:.0f} failed), "
          f"want {PROMPTS * LEN // BLOCK}")
    ew = warm["vllm"]["kvring-engine"]
    check(ew["external_tokens"] == PROMPTS * (LEN - 1) and ew["computed_tokens"] == PROMPTS,
          f"warm pass: vLLM took {ew['external_tokens']:.0f} tokens from kvring and computed "
          f"{ew['computed_tokens']:.0f}; want {PROMPTS * (LEN - 1)} and {PROMPTS}")
    for p in rows["baseline"]["passes"]:
        e = p["vllm"]["baseline-engine"]
        check(e["external_tokens"] == 0 and e["local_cache_tokens"] == 0,
              f"baseline {p['name']}: {e['external_tokens'] + e['local_cache_tokens']:.0f} tokens not computed")
    t = {f"{r} {p}": st["ttft_mean_s"] * 1e3 for r in S for p, st in S[r]["passes"].items()}
    kt.log("mean TTFT ms: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()))
    kt.log(f"outputs 4/4 equal everywhere; kvring warm: {kw['matched_tokens']:.0f}/{kw['requested_tokens']:.0f} "
           f"tokens matched, {kw['loaded_blocks']:.0f} blocks loaded; tool ran {doc['run_s']:.0f} s")


if __name__ == "__main__":
    kt.run(main)
