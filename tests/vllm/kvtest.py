"""Harness of the vLLM suite: a real kvringd, real vLLM engines, a tiny model with real weights.

Pieces (each test script combines them):

- `tiny_model()`: a 2-layer Llama (hidden 512, 8 heads, 2 KV heads, head dim 64,
  vocab 32000, float32) with random weights from transformers' own initialisation under
  a fixed seed, saved as safetensors. With random weights the KV of a prompt decides the
  next tokens and their logprobs, so a missing or wrong load shows up in the outputs
  (weights from load_format="dummy" would not). Cached under build/ by a hash of the
  config, so the suite makes it once.
- `Kvringd`: kvringd as a real process on a private socket with the model's geometry;
  `metrics()` scrapes its /metrics, `wait_metric()` waits for a counter (the suite waits
  for events, it never sleeps to prove something), `inspect()` is kvring-inspect --json,
  `stop()` is SIGTERM (drain) and checks the exit status.
- `Engine`: one vLLM LLM in its own process (engine_main.py) driven over a pipe: start it
  with an engine config, `generate()` token-id prompts, read its log. Its own process
  means a test can run two engines at once, kill nothing but what it started, and bound
  every wait.

Environment: KVR_BUILD_ROOT / KVR_SOURCE_ROOT as meson sets them (defaults: this
checkout's build/ and root). Exit 77 means skipped (no vLLM venv).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SRC = Path(os.environ.get("KVR_SOURCE_ROOT", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("KVR_BUILD_ROOT", SRC / "build"))
KVRINGD = BUILD / "supervisor" / "kvringd"
INSPECT = BUILD / "tools" / "inspect" / "kvring-inspect"
PYPKG = SRC / "client" / "python"

BLOCK = 32  # vLLM block size = kvringd block_tokens (the CPU kernel wants multiples of 32)

MODEL_CONFIG = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    torch_dtype="float32",
)
MODEL_SEED = 1234


def log(*a: Any) -> None:
    print("[vllm-test]", *a, file=sys.stderr, flush=True)


class TestFailure(AssertionError):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise TestFailure(msg)


def skip_without_vllm(needs_vllm: bool = True) -> None:
    if needs_vllm:
        try:
            import vllm  # noqa: F401
        except Exception as e:  # noqa: BLE001
            log(f"SKIP: vLLM is not importable ({e}); tools/install-vllm.sh makes build/vllm-venv")
            sys.exit(77)
    for p in (KVRINGD, INSPECT, BUILD / "client" / "libkvring.so"):
        if not p.exists():
            log(f"FAIL: {p} is missing; build kvring first (ninja -C {BUILD})")
            sys.exit(1)


# ---- the model ------------------------------------------------------------------------------


def tiny_model() -> Path:
    """The model directory (config.json + model.safetensors), made once per config."""
    key = hashlib.sha256(json.dumps([MODEL_CONFIG, MODEL_SEED], sort_keys=True).encode()).hexdigest()[:16]
    d = BUILD / "vllm-test-models" / f"tiny-llama-{key}"
    if (d / "model.safetensors").exists() and (d / "config.json").exists():
        return d
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = Path(tempfile.mkdtemp(prefix="tiny-llama-", dir=d.parent if d.parent.exists() else None))
    d.parent.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(**{k: v for k, v in MODEL_CONFIG.items() if k != "architectures"})
    cfg.architectures = MODEL_CONFIG["architectures"]
    torch.manual_seed(MODEL_SEED)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(tmp, safe_serialization=True)
    try:
        tmp.rename(d)
    except OSError:  # another test made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"made the test model in {d}")
    return d


def prompt(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(10, 32000) for _ in range(n)]


# ---- kvringd ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, however it dies (a
    timeout's kill, an exception past the test's cleanup), so no kvringd outlives its test."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


class Kvringd:
    """kvringd as a child process with the tiny model's geometry on a private socket (model=False:
    no model section, the geometry comes from the first worker that attaches)."""

    def __init__(
        self,
        workdir: Path,
        *,
        tp_size: int = 1,
        l2_dir: Path | None = None,
        max_workers: int = 8,
        name: str = "kvringd",
        supervisor: dict[str, Any] | None = None,
        l1_bytes: str = "256MiB",
        model: bool = True,
    ) -> None:
        self.workdir = workdir
        self.socket = str(workdir / f"{name}.sock")
        self.port = free_port()
        self.config_path = workdir / f"{name}.json"
        self.log_path = workdir / f"{name}.log"
        cfg: dict[str, Any] = {
            "instance": {"socket": self.socket, "max_workers": max_workers, "log_level": "info"},
            "supervisor": {
                "restart_backoff_initial_ms": 20,
                "restart_backoff_max_ms": 200,
                "stable_after_ms": 200,
                "drain_timeout_ms": 10000,
            },
            "model": {
                "preset": "",
                "model_id": "kvring-test/tiny-llama",
                "layers": MODEL_CONFIG["num_hidden_layers"],
                "kv_heads": MODEL_CONFIG["num_key_value_heads"],
                "head_dim": MODEL_CONFIG["head_dim"],
                "dtype_bytes": 4,
                "block_tokens": BLOCK,
                "tp_size": tp_size,
                "kv_layout": "kv-fused",
            },
            "l1": {"capacity_bytes": l1_bytes, "huge_pages": False, "eviction": "lru"},
            "metrics": {"enabled": True, "listen": f"127.0.0.1:{self.port}"},
        }
        if not model:  # no model section: L1 is laid out for the first worker that attaches
            del cfg["model"]
        cfg["supervisor"].update(supervisor or {})
        if l2_dir is not None:
            cfg["l2"] = {
                "dirs": [str(l2_dir)],
                "capacity_bytes": "256MiB",
                "mode": "write-through",
                "durability": "batch",
            }
        self.config = cfg
        self.config_path.write_text(json.dumps(cfg, indent=2))
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self._logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(KVRINGD), "--config", str(self.config_path)],
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TestFailure(f"kvringd exited ({self.proc.returncode}) during start-up:\n{self.log_tail()}")
            if os.path.exists(self.socket):
                try:
                    if self.inspect()["instance"]["state"] == "running":
                        return
                except (subprocess.CalledProcessError, KeyError, json.JSONDecodeError):
                    pass
            time.sleep(0.05)
        raise TestFailure(f"kvringd did not come up on {self.socket} within 20 s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def inspect(self) -> dict[str, Any]:
        out = subprocess.run(
            [str(INSPECT), "--json", "--socket", self.socket], capture_output=True, timeout=10, check=True
        )
        return json.loads(out.stdout)

    def ring(self, name: str) -> dict[str, Any]:
        for r in self.inspect()["rings"]:
            if r["name"] == name:
                return r
        raise TestFailure(f"kvringd has no ring {name}")

    def worker_slots(self) -> list[dict[str, Any]]:
        return [w for w in self.inspect()["workers"] if w["state"] == "attached"]

    def actor_pid(self, name: str) -> int:
        for a in self.inspect()["actors"]:
            if a["name"] == name:
                return int(a["pid"])
        raise TestFailure(f"kvringd has no actor {name}")

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics: 'name{labels}' -> value (labels as printed)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for k, v in self.metrics().items():
            m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?$", k)
            if not m or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
            if all(have.get(a) == b for a, b in labels.items()):
                total += v
        return total

    def wait_metric(self, name: str, at_least: float, timeout: float = 30, **labels: str) -> float:
        deadline = time.monotonic() + timeout
        v = self.metric(name, **labels)
        while v < at_least:
            if time.monotonic() > deadline:
                raise TestFailure(f"{name}{labels} stayed at {v} < {at_least} for {timeout} s")
            time.sleep(0.05)
            v = self.metric(name, **labels)
        return v

    def wait_slots_quiet(self, timeout: float = 15) -> dict[str, Any]:
        """Wait until the slot table holds only free and committed slots and no pin (every
        load, store and lease of the test ended); fail naming what is left."""
        deadline = time.monotonic() + timeout
        while True:
            sl = self.inspect()["l1_slots"]
            busy = {k: sl[k] for k in ("writing", "evicting", "draining", "invalid") if sl[k]}
            busy.update({f"pins.{k}": v for k, v in sl["pins"].items() if v})
            if not busy:
                return sl
            if time.monotonic() > deadline:
                raise TestFailure(f"the slot table is not quiet after {timeout} s: {busy}")
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM (drain), wait, return the exit status (must be 0)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise TestFailure("kvringd did not exit within 30 s of SIGTERM") from None
        self._logf.close()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop (SIGTERM: drain; it must exit 0) and start again on the same socket and files."""
        rc = self.stop()
        check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{self.log_tail()}")
        self.start()


# ---- vLLM engines ---------------------------------------------------------------------------


def connector_config(sock: str, **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "KvringConnector",
        "kv_connector_module_path": "kvring.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": sock, "timeout_ms": 10000, **extra},
    }


class Engine:
    """One vLLM engine in its own process; requests over a pipe, its log in a file."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        *,
        kv_transfer_config: dict[str, Any] | None,
        tp: int = 1,
        threads_bind: str | None = None,
        llm_args: dict[str, Any] | None = None,
        start_timeout: float = 240,
        expect_failure: bool = False,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = workdir / f"engine-{name}.log"
        args = dict(
            model=str(tiny_model()),
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="float32",
            block_size=BLOCK,
            max_model_len=2048,
            enable_prefix_caching=False,
            tensor_parallel_size=tp,
            seed=0,
        )
        if kv_transfer_config is not None:
            args["kv_transfer_config"] = kv_transfer_config
        args.update(llm_args or {})
        extra_env, env = env, dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(PYPKG)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind or ("0|1" if tp == 2 else "0")
        env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        env["KVR_BUILD_ROOT"] = str(BUILD)
        env.update(extra_env or {})
        rfd, wfd = os.pipe()  # replies: engine -> test
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("engine_main.py")), json.dumps(args), str(wfd)],
            stdin=subprocess.PIPE,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            env=env,
            pass_fds=(wfd,),
            start_new_session=True,
        )
        os.close(wfd)
        self._rfd = rfd
        self._buf = b""
        self._t0 = time.monotonic()
        self.startup_s = 0.0
        self._start_timeout, self._expect_failure = start_timeout, expect_failure
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Wait for the engine to be up (or, with expect_failure, to have exited)."""
        msg = self._read(self._start_timeout, during="start-up")
        self.startup_s = time.monotonic() - self._t0
        if msg is None:
            if self._expect_failure:
                return
            raise TestFailure(f"engine {self.name} failed to start (exit {self.proc.returncode}):\n{self.log_tail()}")
        if self._expect_failure:
            self.close()
            raise TestFailure(f"engine {self.name} started although it should not have")
        log(f"engine {self.name} up in {self.startup_s:.1f} s")

    def _read(self, timeout: float, during: str) -> dict[str, Any] | None:
        """The next reply line, None when the engine exited; TestFailure on timeout."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise TestFailure(
                    f"engine {self.name}: no answer within {timeout:.0f} s ({during}):\n{self.log_tail()}"
                )
            r, _, _ = select.select([self._rfd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(self._rfd, 1 << 20)
                if not chunk:
                    self.proc.wait(30)
                    return None
                self._buf += chunk
            elif self.proc.poll() is not None:
                return None
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def generate(
        self, prompts: list[list[int]], max_tokens: int = 8, timeout: float = 180, **per_prompt: Any
    ) -> list[dict[str, Any]]:
        """Greedy outputs: per prompt {'tokens', 'logprobs', 'num_cached_tokens', 'ttft_s',
        'kv_transfer_params'}. per_prompt: kv_transfer_params=[...], cache_salt=[...]."""
        self.submit(prompts, max_tokens, **per_prompt)
        return self.result(timeout)

    def submit(self, prompts: list[list[int]], max_tokens: int = 8, **per_prompt: Any) -> None:
        """Send a generate request without waiting for it (`result` collects it)."""
        assert self.proc.stdin is not None
        req = {"prompts": prompts, "max_tokens": max_tokens, **per_prompt}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()

    def result(self, timeout: float = 180) -> list[dict[str, Any]]:
        msg = self._read(timeout, during="generate")
        if msg is None:
            raise TestFailure(
                f"engine {self.name} died during generate (exit {self.proc.returncode}):\n{self.log_tail()}"
            )
        if "error" in msg:
            raise TestFailure(f"engine {self.name}: {msg['error']}")
        return msg["outputs"]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def close(self, timeout: float = 60) -> None:
        """EOF on the engine's stdin (it shuts vLLM down), wait, kill if it does not end."""
        if self._rfd < 0:
            return
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.kill()
        self._logf.close()
        os.close(self._rfd)
        self._rfd = -1

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextmanager
def serving(kv: Kvringd, eng: "Engine") -> Iterator["Engine"]:
    """A test's body with kv and eng running. On the way out eng is closed and kvringd stopped
    (SIGTERM: drain); where the body passed, kvringd must have exited 0."""
    try:
        yield eng
    finally:
        eng.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


# ---- comparisons ---------------------------------------------------------------------------


def cold_run(eng: "Engine", p: list[int], name: str = "cold run") -> dict[str, Any]:
    """Prompt p's first run on eng: nothing of it may come from a cache. Returns the result."""
    cold = eng.generate([p])[0]
    check(cold["num_cached_tokens"] == 0, f"{name} hit {cold['num_cached_tokens']} tokens")
    return cold


def warm_equal(eng: "Engine", name: str, p: list[int], cold: dict[str, Any], block: int = BLOCK) -> dict[str, Any]:
    """Run prompt p again on eng: it must hit every full block (of `block` tokens, eng's block
    size) and give the cold run's tokens, its logprobs within 1e-4. Returns the warm result."""
    warm = eng.generate([p])[0]
    full = (len(p) // block) * block
    check(warm["num_cached_tokens"] == full, f"{name}: warm hit {warm['num_cached_tokens']}, want {full}")
    check(warm["tokens"] == cold["tokens"], f"{name}: warm tokens {warm['tokens']} != cold {cold['tokens']}")
    delta = max_logprob_delta(cold, warm)
    check(delta <= 1e-4, f"{name}: logprobs differ by {delta:.3g} (> 1e-4)")
    return warm


def max_logprob_delta(a: dict[str, Any], b: dict[str, Any]) -> float:
    if a["tokens"] != b["tokens"]:
        return math.inf
    return max((abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])), default=0.0)


def same_output(a: dict[str, Any], b: dict[str, Any], tol: float = 1e-4) -> bool:
    return a["tokens"] == b["tokens"] and max_logprob_delta(a, b) <= tol


def workdir(name: str) -> Path:
    base = BUILD / "vllm-test-work"
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    return d


def run(main: Any, needs_vllm: bool = True) -> None:
    """Run a test's main(workdir); exit 0/1 with a one-line verdict and the time it took."""
    skip_without_vllm(needs_vllm)
    name = Path(sys.argv[0]).stem
    d = workdir(name)
    t0 = time.monotonic()
    try:
        main(d)
    except TestFailure as e:
        log(f"FAIL {name} after {time.monotonic() - t0:.1f} s: {e}")
        log(f"(logs in {d})")
        sys.exit(1)
    log(f"PASS {name} in {time.monotonic() - t0:.1f} s")
    if os.environ.get("KVR_KEEP_LOGS"):
        log(f"(logs kept in {d})")
    else:
        shutil.rmtree(d, ignore_errors=True)


# ---- model namespaces (issue 22) ------------------------------------------------------------


def tiny_model_seeded(seed: int) -> Path:
    """The tiny model's config with the random weights of another seed (same geometry, same
    safetensors header and size, other values), made once per seed like tiny_model()."""
    if seed == MODEL_SEED:
        return tiny_model()
    return tiny_model_variant(seed)


def tiny_model_variant(seed: int, **config: Any) -> Path:
    """The tiny model with `config` changed (e.g. num_hidden_layers=4, head_dim=32: another KV
    geometry) and the random weights of `seed`, made once per (config, seed)."""
    mc = dict(MODEL_CONFIG, **config)
    key = hashlib.sha256(json.dumps([mc, seed], sort_keys=True).encode()).hexdigest()[:16]
    d = BUILD / "vllm-test-models" / f"tiny-llama-{key}"
    if (d / "model.safetensors").exists() and (d / "config.json").exists():
        return d
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tiny-llama-", dir=d.parent))
    cfg = LlamaConfig(**{k: v for k, v in mc.items() if k != "architectures"})
    cfg.architectures = mc["architectures"]
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(tmp, safe_serialization=True)
    try:
        tmp.rename(d)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"made the test model (seed {seed}, {config or 'the tiny config'}) in {d}")
    return d


def engine_namespace(engine: Engine) -> str:
    """The model namespace an engine's connector attached with (its start-up INFO line)."""
    m = re.search(r"kvring: engine \S+: model namespace '([^']+)'", engine.log_text())
    if not m:
        raise TestFailure(f"engine {engine.name} logged no model namespace:\n{engine.log_tail()}")
    return m.group(1)
