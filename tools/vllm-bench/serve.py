"""vllm-bench --serve: real `vllm serve` measured by `vllm bench serve`, the way users measure.

Per row one OpenAI server (`vllm serve`, its own process group, the bench model with the
word-level tokenizer bench_model.py adds, the same CPU binding as the one-request mode)
and `vllm bench serve` run twice against it with the same prompts (its random dataset,
one seed): a cold pass, then a warm pass.

  row       server(s)                                          what a warm pass shows
  baseline  no connector, prefix cache off                     the noise floor (a repeat)
  kvring    KvringConnector -> a kvringd of its own, no prefix cache    loads from kvringd's L1
  lmcache   LMCacheMPConnector -> `lmcache server`, no prefix cache     loads from LMCache
  prefix    vLLM's own prefix cache, no connector              the KV never left the engine
  evict     as kvring, kvringd's L1 a third of the working set, an L2 directory (--evict)
                                                               loads mostly promoted from L2
  pd        P and D servers, both KvringConnector -> one kvringd, a proxy in this
            process: the prompt to P with max_tokens=1, P's kv_transfer_params to D (--pd)
                                                               D's decode TTFT
  two       two servers of two models (the bench model, A, and GEOMETRY_B: 4 layers, head
            dim 32), both KvringConnector -> ONE kvringd started without a model section
            (--two-models). B's cold pass runs first, then A's cold and warm passes (the
            row's), then B's warm pass: A's warm TTFT against the kvring row's is the
            price of a second model on the node
  twosep    as two, but each server with a kvringd of its own (--two-models): two against
            twosep is the price of sharing one kvringd, the second server's own load aside

Before the cold pass each server answers warm-up requests (unrelated prompts, twice: the
first forward of a fresh engine costs seconds; the second pass exercises the connector's
load). Between passes kvring rows wait until kvringd's stores have landed (its counters
stop moving); every row idles --settle seconds.

Per pass it keeps `vllm bench serve`'s own result (--save-result --save-detailed: every
request's TTFT and generated text), the servers' /metrics before and after (vLLM's
prompt tokens by source: computed, local cache hit, external KV transfer) and kvringd's
(lookups, matched / requested tokens, L1 hits, L2 promotions and writes). serve_report.py
turns that into the table, the goal ratios and the plot.

Not measured here: anything on a GPU; the numbers are vLLM's CPU build on the machine the
bench runs on.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import bench_model
import serve_report
from engine_run import KVRING_COUNTERS, wait_stores_settled
from services import (
    ForeignCpu,
    Kvringd,
    LmcacheServer,
    ServiceError,
    foreign_vllm,
    free_port,
    metric_sum,
    parse_metrics,
    scrape,
    wait_for_quiet,
)

__all__ = ["SERVE_ROWS", "main"]

SERVE_ROWS = ("baseline", "kvring", "lmcache", "prefix", "evict", "pd", "two", "twosep")
PASSES = ("cold", "warm")
SERVED_NAME = "bench-llama"
KVRING_ROWS = ("kvring", "evict", "pd", "two", "twosep")
TWO_ROWS = ("two", "twosep")
OTHER_PASSES = ("other-cold", "other-warm")  # the two row's model B, before and after A's passes

# kvringd counters a serving pass records: the one-request mode's and the tiers'
SERVE_COUNTERS = dict(
    KVRING_COUNTERS,
    # kvring_l1_hits_total: matched blocks that were in L1; matched_blocks also counts
    # those promoted from L2 for the request (l2_reads)
    l1_hits=("kvring_l1_hits_total", {}),
    matched_blocks=("kvring_lookup_matched_blocks_total", {}),
    l1_misses=("kvring_l1_misses_total", {}),
    evictions=("kvring_evictions_total", {}),
    l2_reads=("kvring_l2_blocks_total", {"op": "read", "result": "ok"}),
    l2_read_failed=("kvring_l2_blocks_total", {"op": "read", "result": "failed"}),
    l2_writes=("kvring_l2_blocks_total", {"op": "write", "result": "ok"}),
    l2_write_failed=("kvring_l2_blocks_total", {"op": "write", "result": "failed"}),
    l2_files=("kvring_l2_files", {}),
)

# vLLM server counters (its /metrics)
VLLM_COUNTERS = {
    "prompt_tokens": ("vllm:prompt_tokens_total", {}),
    "computed_tokens": ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
    "local_cache_tokens": ("vllm:prompt_tokens_by_source_total", {"source": "local_cache_hit"}),
    "external_tokens": ("vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"}),
    "requests": ("vllm:request_success_total", {}),
}


def say(*a: Any) -> None:
    print(*a, flush=True)


def kvringd_counters(url: str) -> dict[str, float]:
    samples = scrape(url)
    return {k: metric_sum(samples, name, **labels) for k, (name, labels) in SERVE_COUNTERS.items()}


def vllm_counters(server: VllmServer) -> dict[str, float]:
    samples = server.metrics()
    return {k: metric_sum(samples, name, **labels) for k, (name, labels) in VLLM_COUNTERS.items()}


def delta(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    if a is None or b is None:
        return None
    return {k: b[k] - a[k] for k in b}


# ---- processes -----------------------------------------------------------------------------


def _group_members(pgid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # state ppid pgrp ...
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out


def end_group(proc: subprocess.Popen[bytes], timeout: float = 60) -> int | None:
    """SIGTERM to the process group proc leads, wait for proc (at most timeout), then
    SIGKILL whatever of the group is left and wait until it is gone. Returns proc's status."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + 20
    while _group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # a killed process is gone once its parent (init) reaps it
    return proc.returncode


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when this process dies, however it dies, so no
    server outlives the bench (its own process group keeps it out of the bench's)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


class VllmServer:
    """`vllm serve` in a process group of its own; ready when /health answers 200."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, port: int):
        self.name, self.argv, self.env, self.log_path, self.port = name, argv, env, log_path, port
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = self._t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise ServiceError(f"vllm serve ({self.name}) exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.startup_s = time.monotonic() - self._t0
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServiceError(f"vllm serve ({self.name}) not ready within {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return parse_metrics(r.read().decode())

    def stop(self) -> int | None:
        return end_group(self.proc) if self.proc is not None else None

    def log_tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def complete(base_url: str, prompt: str, max_tokens: int, timeout: float = 300) -> dict[str, Any]:
    """One greedy /v1/completions request (not streamed); the response's JSON."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "skip_special_tokens": False,
    }
    req = urllib.request.Request(
        base_url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


# ---- the P/D proxy ---------------------------------------------------------------------------


class PdProxy:
    """A prefill/decode proxy in this process, the pattern of vLLM's disaggregated-serving
    examples (toy_proxy_server.py): a completion request goes to P with max_tokens=1, not
    streamed; P's response carries the connector's kv_transfer_params ({"kvring":
    {"stored_tokens": N}}); the request goes on to D with those params and D's stream is
    passed back. Every other path goes to D. Per request it keeps P's time, D's time to
    its first streamed byte (the decode TTFT) and both servers' cached-token counts."""

    def __init__(self, prefill_url: str, decode_url: str):
        self.p, self.d = prefill_url, decode_url
        self.port = free_port()
        self.records: list[dict[str, Any]] = []
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> None:
        self._thread = threading.Thread(target=self._run, name="pd-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise ServiceError(f"the P/D proxy did not start: {self._error}")

    def take_records(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
        return out

    def _run(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

        async def setup() -> Any:
            self.session = ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=3600))
            app = web.Application(client_max_size=64 << 20)
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_route("*", "/{tail:.*}", self._passthrough)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            return runner

        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            runner = loop.run_until_complete(setup())
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.run_until_complete(self.session.close())
        loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    async def _passthrough(self, request: Any) -> Any:
        from aiohttp import web

        async with self.session.request(
            request.method, self.d + request.path_qs, data=await request.read(), headers={"Content-Type": "application/json"}
        ) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    async def _completions(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        rec: dict[str, Any] = {}
        t0 = time.perf_counter()
        pbody = dict(body, max_tokens=1, stream=False)
        for k in ("stream_options", "min_tokens", "max_completion_tokens"):
            pbody.pop(k, None)
        # what vLLM's toy proxy sends a prefill engine; KvringConnector reads none of it
        pbody["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
        async with self.session.post(self.p + "/v1/completions", json=pbody) as r:
            if r.status != 200:
                return web.Response(status=r.status, body=await r.read(), content_type="application/json")
            pj = await r.json()
        t1 = time.perf_counter()
        rec["prefill_s"] = t1 - t0
        rec["kv_transfer_params"] = pj.get("kv_transfer_params")
        rec["prefill_cached_tokens"] = ((pj.get("usage") or {}).get("prompt_tokens_details") or {}).get(
            "cached_tokens"
        )
        dbody = dict(body, kv_transfer_params=pj.get("kv_transfer_params"))
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        raw = bytearray()
        async with self.session.post(self.d + "/v1/completions", json=dbody) as r:
            async for chunk in r.content.iter_any():
                if "decode_ttft_s" not in rec:
                    rec["decode_ttft_s"] = time.perf_counter() - t1
                raw += chunk
                await resp.write(chunk)
            rec["decode_status"] = r.status
        await resp.write_eof()
        rec["decode_s"] = time.perf_counter() - t1
        for line in bytes(raw).decode(errors="replace").splitlines():
            if line.startswith("data: {"):
                try:
                    u = json.loads(line[6:]).get("usage")
                except ValueError:
                    continue
                if u:
                    rec["decode_cached_tokens"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
                    rec["prompt_tokens"] = u.get("prompt_tokens")
        self.records.append(rec)
        return resp


# ---- one row -------------------------------------------------------------------------------


def base_env(args: Any, bind: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": str(args.kv_space_gib),
            "VLLM_CPU_OMP_THREADS_BIND": bind,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [args.pythonpath, str(REPO / "client" / "python"), env.get("PYTHONPATH")])
            ),
            "KVR_BUILD_ROOT": str(args.build),
            "LMCACHE_TRACK_USAGE": "false",
            "LMCACHE_DISABLE_BANNER": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def serve_argv(
    args: Any, port: int, prefix_cache: bool, kv_transfer: dict[str, Any] | None, model: Path | None = None
) -> list[str]:
    argv = [
        str(Path(sys.executable).parent / "vllm"),
        "serve",
        str(model or args.model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--block-size",
        str(args.block_size),
        "--max-model-len",
        str(args.input_len + args.output_len + 64),
        "--seed",
        "0",
        "--enable-prompt-tokens-details",
        "--enable-prefix-caching" if prefix_cache else "--no-enable-prefix-caching",
    ]
    if kv_transfer is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer)]
    return argv


def bench_argv(args: Any, base_url: str, result_dir: Path, name: str, model: Path | None = None) -> list[str]:
    return [
        str(Path(sys.executable).parent / "vllm"),
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--model",
        SERVED_NAME,
        "--tokenizer",
        str(model or args.model),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--num-prompts",
        str(args.num_prompts),
        "--max-concurrency",
        str(args.concurrency),
        "--request-rate",
        "inf",
        "--seed",
        str(args.seed),
        "--temperature",
        "0",
        # the bench's own first request (prompt 0 before the run) would store prompt 0
        # before the cold pass; this tool waits for /health itself
        "--ready-check-timeout-sec",
        "0",
        # tokens 0-2 are special: keep them in the texts compared
        "--extra-body",
        '{"skip_special_tokens": false}',
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        f"{name}.json",
        "--disable-tqdm",
    ]


def kvring_transfer(socket: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": "KvringConnector",
        "kv_connector_module_path": "kvring.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": socket, **extra},
    }


def warmup_prompts(args: Any) -> list[str]:
    """Not measured: --warmup prompts of --input-len random words, none shared with the
    bench's (its random dataset's prompts are runs of consecutive ids)."""
    rng = random.Random(args.seed + 1_000_003)
    vocab = bench_model.GEOMETRY["vocab_size"]
    return [
        " ".join(bench_model.word(rng.randrange(3, vocab)) for _ in range(args.input_len)) for _ in range(args.warmup)
    ]


class Row:
    """The processes of one row, started in order and ended in reverse whatever happens."""

    def __init__(self, name: str, args: Any):
        self.name, self.args = name, args
        self.dir = args.out / "rows" / name
        self.kvringd: Kvringd | None = None
        self.kvringd_b: Kvringd | None = None  # the twosep row: model B's own kvringd
        self.lmcache: LmcacheServer | None = None
        self.servers: list[VllmServer] = []
        self.proxy: PdProxy | None = None
        self.info: dict[str, Any] = {}
        self.other_url: str | None = None  # the two row: model B's server

    def server(
        self, tag: str, bind: str, prefix_cache: bool, kv: dict[str, Any] | None, model: Path | None = None
    ) -> VllmServer:
        port = free_port()
        s = VllmServer(
            f"{self.name}-{tag}",
            serve_argv(self.args, port, prefix_cache, kv, model),
            base_env(self.args, bind),
            self.args.out / "logs" / f"serve-{self.name}-{tag}.log",
            port,
        )
        self.servers.append(s)
        return s

    def start(self) -> str:
        """Start everything; the URL the bench talks to."""
        a = self.args
        g = bench_model.GEOMETRY
        model = {
            "layers": g["num_hidden_layers"],
            "kv_heads": g["num_key_value_heads"],
            "head_dim": g["head_dim"],
            "dtype_bytes": 4,
        }
        extra = json.loads(a.kvring_extra)
        if self.name in KVRING_ROWS:
            l1 = a.kvring_l1
            l2 = None
            if self.name == "evict":
                l1 = str(a.evict_l1_bytes)
                l2 = self.dir / "l2"
                if l2.exists():
                    import shutil

                    shutil.rmtree(l2)  # a warm pass must find only this run's stores
                l2.mkdir(parents=True)
            self.kvringd = Kvringd(
                a.build,
                self.dir / "kvringd",
                block_tokens=a.block_size,
                l1_bytes=l1,
                model=None if self.name in TWO_ROWS else model,  # no model section: any model
                l2_dir=l2,
            )
            if self.name == "twosep":
                self.kvringd_b = Kvringd(
                    a.build, self.dir / "kvringd-b", block_tokens=a.block_size, l1_bytes=l1, model=None
                )
                self.kvringd_b.start()
            self.kvringd.start()
            self.info["kvringd_config"] = self.kvringd.config
        if self.name == "baseline":
            servers = [self.server("engine", a.bind, False, None)]
        elif self.name == "prefix":
            servers = [self.server("engine", a.bind, True, None)]
        elif self.name in ("kvring", "evict"):
            assert self.kvringd is not None
            servers = [self.server("engine", a.bind, False, kvring_transfer(self.kvringd.socket, extra))]
        elif self.name == "lmcache":
            self.lmcache = LmcacheServer(
                Path(sys.executable).parent, self.dir / "lmcache", chunk_size=a.lmcache_chunk, l1_size_gb=a.lmcache_l1_gb
            )
            self.lmcache.start()
            self.info["lmcache_argv"] = self.lmcache.argv
            kv = {
                "kv_connector": "LMCacheMPConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.host": "tcp://localhost", "lmcache.mp.port": self.lmcache.port},
            }
            servers = [self.server("engine", a.bind, False, kv)]
        elif self.name in TWO_ROWS:
            assert self.kvringd is not None
            kv = kvring_transfer(self.kvringd.socket, extra)
            kv_b = kvring_transfer(self.kvringd_b.socket, extra) if self.kvringd_b else kv
            servers = [self.server("A", a.bind, False, kv), self.server("B", a.bind, False, kv_b, a.model_b)]
            self.other_url = servers[1].url
        elif self.name == "pd":
            assert self.kvringd is not None
            kv = kvring_transfer(self.kvringd.socket, dict(extra, store_wait_ms=a.store_wait_ms))
            pb, db = a.pd_bind
            servers = [self.server("P", pb, False, kv), self.server("D", db, False, kv)]
        else:
            raise ValueError(self.name)
        for s in servers:  # started together, waited for one after the other
            s.start()
        for s in servers:
            s.wait_ready(a.start_timeout)
        self.info["servers"] = {s.name: {"argv": s.argv, "startup_s": s.startup_s, "log": str(s.log_path)} for s in servers}
        self.info["bind"] = {s.name: s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in servers}
        if self.name == "pd":
            self.proxy = PdProxy(servers[0].url, servers[1].url)
            self.proxy.start()
            return self.proxy.url
        return servers[0].url

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        for s in reversed(self.servers):
            self.info.setdefault("exit_status", {})[s.name] = s.stop()
        if self.lmcache is not None:
            self.info["lmcache_exit_status"] = self.lmcache.stop()
        for tag, k in (("", self.kvringd), ("_b", self.kvringd_b)):
            if k is not None:
                self.info[f"kvringd{tag}_exit_status"] = k.stop()
                self.info[f"kvringd{tag}_log_tail"] = k.log_tail(10)

    def counters(self) -> dict[str, Any]:
        c: dict[str, Any] = {"vllm": {s.name: vllm_counters(s) for s in self.servers}}
        if self.kvringd is not None:
            c["kvringd"] = kvringd_counters(self.kvringd.metrics_url)
        if self.kvringd_b is not None:  # the node's kvring: both instances' counters summed
            b = kvringd_counters(self.kvringd_b.metrics_url)
            c["kvringd"] = {k: v + b.get(k, 0.0) for k, v in c["kvringd"].items()}
        return c

    def settle(self) -> dict[str, Any] | None:
        time.sleep(self.args.settle)  # idle between passes, as the one-request mode does
        if self.kvringd_b is not None:
            wait_stores_settled(self.kvringd_b.metrics_url)
        if self.kvringd is not None:
            return wait_stores_settled(self.kvringd.metrics_url)
        return None


def run_bench(
    args: Any, row: Row, url: str, name: str, cpu: ForeignCpu, disturbed: dict[int, str], model: Path | None = None
) -> dict[str, Any]:
    """One `vllm bench serve` pass; its result JSON plus counters around it."""
    rdir = args.out / "results"
    rdir.mkdir(parents=True, exist_ok=True)
    res_path = rdir / f"{row.name}-{name}.json"
    res_path.unlink(missing_ok=True)
    argv = bench_argv(args, url, rdir, f"{row.name}-{name}", model)
    before = row.counters()
    t0 = time.monotonic()
    log_path = args.out / "logs" / f"bench-{row.name}-{name}.log"
    env = base_env(args, args.bind)
    env.pop("VLLM_CPU_OMP_THREADS_BIND")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        rc = None
        try:
            while time.monotonic() - t0 < args.pass_timeout:
                try:
                    rc = proc.wait(2)
                    break
                except subprocess.TimeoutExpired:
                    disturbed.update(foreign_vllm())
                    cpu.sample()
        finally:
            end_group(proc, timeout=5)
    wall = time.monotonic() - t0
    after = row.counters()
    rec: dict[str, Any] = {"name": name, "argv": argv, "wall_s": round(wall, 2), "log": str(log_path)}
    rec["vllm"] = {k: delta(before["vllm"][k], after["vllm"][k]) for k in after["vllm"]}
    if "kvringd" in after:
        rec["kvringd"] = delta(before["kvringd"], after["kvringd"])
        rec["kvringd_after"] = after["kvringd"]
    if row.proxy is not None:
        rec["proxy"] = row.proxy.take_records()
    if rc is None:
        raise ServiceError(f"vllm bench serve ({row.name} {name}) timed out after {args.pass_timeout:.0f} s")
    if rc != 0 or not res_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise ServiceError(f"vllm bench serve ({row.name} {name}) exited with {rc}:\n{tail}")
    res = json.loads(res_path.read_text())
    keep = (
        "duration completed failed total_input_tokens total_output_tokens request_throughput output_throughput "
        "total_token_throughput input_lens output_lens ttfts latencies generated_texts errors mean_ttft_ms "
        "median_ttft_ms p50_ttft_ms p99_ttft_ms std_ttft_ms mean_tpot_ms p99_tpot_ms mean_e2el_ms p99_e2el_ms "
        "max_concurrency"
    ).split()
    rec["bench"] = {k: res.get(k) for k in keep}
    rec["result_file"] = str(res_path)
    return rec


def run_row(name: str, args: Any) -> dict[str, Any]:
    say(f"\n== {name}")
    quiet = wait_for_quiet(args.wait_max, say=say, max_cpu=args.max_foreign_cpu) if args.wait_max > 0 else None
    row = Row(name, args)
    res: dict[str, Any] = {"row": name, "ok": False, "passes": [], "quiet": quiet}
    t0 = time.monotonic()
    cpu = ForeignCpu()
    disturbed: dict[int, str] = {}
    try:
        url = row.start()
        res["startup_s"] = round(time.monotonic() - t0, 1)
        say(f"  up in {res['startup_s']:.0f} s; warm-up")
        t = time.monotonic()
        warm = warmup_prompts(args)
        for _ in range(2):
            for u in filter(None, (url, row.other_url)):
                for p in warm:
                    complete(u, p, args.output_len)
            row.settle()
        if row.proxy is not None:
            row.proxy.take_records()
        res["warmup_s"] = round(time.monotonic() - t, 1)
        plan = [(ph, url, res["passes"], None) for ph in PASSES]
        if row.other_url is not None:  # model B: cold before A's passes, warm after them
            res["other_passes"] = []
            b_cold, b_warm = ((ph, row.other_url, res["other_passes"], args.model_b) for ph in OTHER_PASSES)
            plan = [b_cold, *plan, b_warm]
        last: list[dict[str, Any]] | None = None
        for ph, u, into, model in plan:
            if last:
                last[-1]["settle"] = row.settle()
            say(f"  {ph} pass: {args.num_prompts} prompts x {args.input_len} tokens, concurrency {args.concurrency}")
            rec = run_bench(args, row, u, ph, cpu, disturbed, model)
            b = rec["bench"]
            say(
                f"    mean TTFT {b['mean_ttft_ms']:.1f} ms, p99 {b['p99_ttft_ms']:.1f} ms, "
                f"{b['completed']}/{args.num_prompts} completed in {b['duration']:.1f} s"
            )
            into.append(rec)
            last = into
            if b["completed"] != args.num_prompts:
                errs = sorted({e for e in (b.get("errors") or []) if e})
                raise ServiceError(f"{ph} pass: {b['completed']}/{args.num_prompts} requests completed: {errs[:3]}")
        if row.kvringd is not None and last:
            last[-1]["settle"] = row.settle()
        res["ok"] = True
    except (ServiceError, OSError, ValueError) as e:
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        row.stop()
    wall = time.monotonic() - t0
    cpu.sample()
    res["row_wall_s"] = round(wall, 1)
    res["info"] = row.info
    res["foreign_cpu_s"] = round(cpu.seconds(), 2)
    res["foreign_cpu_busiest"] = cpu.busiest()
    res["disturbed_by"] = [f"{p} {c}" for p, c in sorted(disturbed.items())][:8]
    if cpu.seconds() > args.max_foreign_cpu * wall:
        res["disturbed_by"].append(
            f"other processes used {cpu.seconds():.1f} CPU s in {wall:.0f} s "
            f"(> {args.max_foreign_cpu:.0%} of a core): {'; '.join(cpu.busiest(2))}"
        )
    if res["ok"]:
        say(f"  ok in {wall:.0f} s")
    else:
        say(f"  FAILED: {res.get('error')}")
    return res


# ---- main ----------------------------------------------------------------------------------


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through every Row.stop()


def main(args: Any, versions: dict[str, str], machine: dict[str, Any], command: str) -> int:
    os.environ["KVR_BENCH_ROOT_PID"] = str(os.getpid())
    signal.signal(signal.SIGTERM, _terminated)
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    bench_model.ensure_model(args.model)
    bench_model.ensure_tokenizer(args.model)
    args.model_b = None
    if set(TWO_ROWS) & set(args.rows):  # the second model: its own directory beside the first
        args.model_b = args.model.with_name(args.model.name + "-b")
        bench_model.ensure_model(args.model_b, bench_model.GEOMETRY_B)
        bench_model.ensure_tokenizer(args.model_b)
    working_set = args.num_prompts * args.input_len * bench_model.kv_bytes_per_token()
    args.evict_l1_bytes = max(working_set // 3 // (1 << 20), 1) << 20
    say(
        f"vllm-bench --serve: {args.num_prompts} prompts x {args.input_len} tokens (vllm bench serve, random dataset, "
        f"seed {args.seed}), {args.output_len} output tokens, concurrency {args.concurrency}, rows "
        f"{','.join(args.rows)}; VLLM_CPU_OMP_THREADS_BIND={args.bind}, block size {args.block_size}; KV working set "
        f"{working_set / (1 << 20):.0f} MiB"
    )
    results: dict[str, Any] = {}
    for name in args.rows:
        earlier = []
        while True:
            res = run_row(name, args)
            if not (res.get("ok") and res.get("disturbed_by")) or len(earlier) >= args.retries:
                break
            say(f"  disturbed by {res['disturbed_by'][0][:100]}: measuring {name} again")
            earlier.append({"disturbed_by": res["disturbed_by"], "row_wall_s": res.get("row_wall_s")})
        res["disturbed_attempts"] = earlier
        results[name] = res
    doc = {
        "schema": "serve-1",
        "command": command,
        "machine": machine,
        "versions": versions,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": {
            "geometry": bench_model.GEOMETRY,
            "seed": bench_model.SEED,
            "kv_bytes_per_token": bench_model.kv_bytes_per_token(),
            "working_set_bytes": working_set,
            **({"geometry_b": bench_model.GEOMETRY_B} if args.model_b else {}),
        },
        "rows": results,
    }
    doc["summary"] = serve_report.summarize(doc)
    doc["run_s"] = round(time.monotonic() - t_start, 1)
    out_json = args.out / "vllm-bench-serve.json"
    out_json.write_text(json.dumps(doc, indent=1))
    say("")
    say(serve_report.table(doc))
    if not args.no_plot:
        try:
            how = serve_report.plot(doc, args.plot, args.out)
            say(f"\nplot: {args.plot} ({how})")
        except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
            say(f"\nplot: not written ({e})")
    say(f"json: {out_json}\nrun time: {doc['run_s']:.0f} s")
    return 0 if doc["summary"]["all_ok"] else 1


def report_only(path: Path, args: Any) -> int:
    doc = json.loads(path.read_text())
    doc["summary"] = serve_report.summarize(doc)
    path.write_text(json.dumps(doc, indent=1))
    say(serve_report.table(doc))
    if not args.no_plot:
        png = args.plot if args.plot.name != "vllm-bench.png" else path.with_name("vllm-bench-serve.png")
        say(f"\nplot: {png} ({serve_report.plot(doc, png, path.parent)})")
    return 0 if doc["summary"]["all_ok"] else 1
