"""The processes vllm-bench runs next to vLLM: kvringd, LMCache's MP server, and the check
that no other vLLM is running while it measures.

- `Kvringd`: kvringd on a private socket, configured for the bench model (block size =
  vLLM's), /metrics on a free local port, optionally an L2 directory under its L1;
  `metrics()` scrapes it, `stop()` is SIGTERM.
- `LmcacheServer`: `lmcache server` (LMCache 0.5.6 MP mode, ZMQ) on free local ports.
- `foreign_vllm()`: pids of vLLM processes that are not this bench's (neither its ancestors
  nor its descendants), e.g. another session's tests; `wait_for_quiet()` polls until there
  are none, because two vLLMs on a 2-core machine would disturb each other's timings.

Everything here is a real process; nothing is simulated.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = [
    "ForeignCpu",
    "Kvringd",
    "LmcacheServer",
    "ServiceError",
    "foreign_vllm",
    "free_port",
    "metric_sum",
    "parse_metrics",
    "wait_for_quiet",
]


class ServiceError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# ---- other vLLM processes on the machine -------------------------------------------------


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            # pid (comm) state ppid ...: comm may hold spaces and parentheses
            out[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return out


def foreign_vllm(root_pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, command line) of processes matching vllm|EngineCore outside root_pid's family.

    The family is root_pid, its ancestors (the shell that started the bench) and its
    descendants (the bench's own engines and servers). root_pid defaults to the bench's
    main process (KVR_BENCH_ROOT_PID, set by vllm_bench.py) or this process.
    """
    root = root_pid or int(os.environ.get("KVR_BENCH_ROOT_PID", os.getpid()))
    ppid = _ppid_map()
    family = {root}
    p = root
    while p in ppid and ppid[p] > 0:  # ancestors
        p = ppid[p]
        family.add(p)
    children: dict[int, list[int]] = {}
    for c, par in ppid.items():
        children.setdefault(par, []).append(c)
    stack = [root]
    while stack:  # descendants
        for c in children.get(stack.pop(), []):
            if c not in family:
                family.add(c)
                stack.append(c)
    out = []
    for pid in ppid:
        if pid in family:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        cmd = b" ".join(argv).decode(errors="replace").strip()
        if cmd and _is_vllm(argv, cmd):
            out.append((pid, cmd[:160]))
    return out


def _is_vllm(argv: list[bytes], cmd: str) -> bool:
    """A process that runs vLLM: EngineCore, or a Python (or vllm/lmcache) program naming vllm.

    Other programs whose arguments merely contain the word (`git add tests/vllm`, a
    kvringd whose config lies under build/vllm-test-work/, grep) are not.
    """
    if "EngineCore" in cmd:
        return True
    exe = os.path.basename(argv[0].decode(errors="replace")) if argv else ""
    if exe in ("vllm", "lmcache"):
        return True
    return exe.startswith("python") and re.search(r"vllm", cmd) is not None


def _jiffies(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return None


class ForeignCpu:
    """CPU time used by processes outside the bench's family, sampled now and then.

    `sample()` adds what every such process used since the previous sample (a process new
    since then counts with all its time). A process that starts and ends between two
    samples is missed, so this is a lower bound.
    """

    def __init__(self, root_pid: int | None = None):
        self.root = root_pid or int(os.environ.get("KVR_BENCH_ROOT_PID", os.getpid()))
        self.hz = os.sysconf("SC_CLK_TCK")
        self.last: dict[int, int] = {}
        self.total = 0
        self.top: dict[int, list[Any]] = {}
        self.sample(first=True)

    def _family(self, ppid: dict[int, int]) -> set[int]:
        fam = {self.root}
        p = self.root
        while p in ppid and ppid[p] > 0:
            p = ppid[p]
            fam.add(p)
        children: dict[int, list[int]] = {}
        for c, par in ppid.items():
            children.setdefault(par, []).append(c)
        stack = [self.root]
        while stack:
            for c in children.get(stack.pop(), []):
                if c not in fam:
                    fam.add(c)
                    stack.append(c)
        return fam

    def sample(self, first: bool = False) -> None:
        ppid = _ppid_map()
        fam = self._family(ppid)
        now: dict[int, int] = {}
        for pid in ppid:
            if pid in fam:
                continue
            j = _jiffies(pid)
            if j is None:
                continue
            now[pid] = j
            d = j - self.last.get(pid, 0) if pid in self.last or first else j
            if first:
                continue
            if d > 0:
                self.total += d
                if pid not in self.top:
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
                    except OSError:
                        cmd = "?"
                    self.top[pid] = [0, cmd]
                self.top[pid][0] += d
        self.last = now

    def seconds(self) -> float:
        return self.total / self.hz

    def busiest(self, n: int = 3) -> list[str]:
        top = sorted(self.top.items(), key=lambda kv: -kv[1][0])[:n]
        return [f"{pid} {v[0] / self.hz:.1f}s {v[1]}" for pid, v in top]


def wait_for_quiet(max_wait_s: float, poll_s: float = 10.0, say: Any = print, max_cpu: float = 0.05) -> dict[str, Any]:
    """Wait (at most max_wait_s) until no foreign vLLM runs and, over 5 s, other processes
    used at most max_cpu of one core. Returns what was seen."""
    t0 = time.monotonic()
    seen: list[tuple[int, str]] = []
    busy_said = False
    while True:
        others = foreign_vllm()
        if not others:
            cpu = ForeignCpu()
            time.sleep(5)
            cpu.sample()
            if cpu.seconds() <= max_cpu * 5:
                return {"waited_s": round(time.monotonic() - t0, 1), "gave_up": False, "seen": seen[:5]}
            if not busy_said:
                say(f"  waiting for the machine to be quiet: {'; '.join(cpu.busiest(2))}")
                busy_said = True
            others = [(0, f"other processes used {cpu.seconds():.1f} CPU s in 5 s")]
        elif not seen:
            say(
                f"  waiting for other vLLM processes to end: {', '.join(str(p) for p, _ in others[:6])}"
                f" ({others[0][1][:90]})"
            )
        seen = others
        if time.monotonic() - t0 >= max_wait_s:
            say(f"  gave up waiting after {max_wait_s:.0f} s; measuring next to {len(others)} foreign processes")
            return {"waited_s": round(time.monotonic() - t0, 1), "gave_up": True, "seen": others[:5]}
        time.sleep(poll_s)


# ---- /metrics ------------------------------------------------------------------------------


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), v))
    return out


def metric_sum(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return parse_metrics(r.read().decode())


# ---- kvringd -------------------------------------------------------------------------------


class Kvringd:
    """kvringd with the bench model's geometry on a private socket, /metrics on; with model
    None, no model section: it serves any engine that names its model (docs/engines.md)."""

    def __init__(
        self,
        build: Path,
        workdir: Path,
        *,
        block_tokens: int,
        l1_bytes: str,
        model: dict[str, int] | None,
        l2_dir: Path | None = None,
        l2_bytes: str = "4GiB",
    ):
        self.bin = build / "supervisor" / "kvringd"
        self.inspect_bin = build / "tools" / "inspect" / "kvring-inspect"
        self.dir = workdir
        self.socket = str(workdir / "kvring.sock")
        self.port = free_port()
        self.log_path = workdir / "kvringd.log"
        self.config: dict[str, Any] = {"instance": {"socket": self.socket}}
        if model is not None:
            self.config["model"] = {
                "preset": "",
                "model_id": "bench-llama",
                "layers": model["layers"],
                "kv_heads": model["kv_heads"],
                "head_dim": model["head_dim"],
                "dtype_bytes": model["dtype_bytes"],
                "block_tokens": block_tokens,
                "tp_size": 1,
                "kv_layout": "kv-fused",
            }
        self.config["l1"] = {"capacity_bytes": l1_bytes}
        self.config["metrics"] = {"enabled": True, "listen": f"127.0.0.1:{self.port}"}
        if l2_dir is not None:
            # the disk tier under L1: every committed block written through, so a block
            # evicted from L1 is promoted back from here (docs/l2.md)
            self.config["l1"]["eviction"] = "lru"
            self.config["l2"] = {
                "dirs": [str(l2_dir)],
                "capacity_bytes": l2_bytes,
                "mode": "write-through",
                "durability": "batch",
            }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self, timeout: float = 30) -> None:
        if not self.bin.exists():
            raise ServiceError(f"{self.bin} is missing: build kvring first (meson setup build; ninja -C build)")
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "kvringd.json"
        cfg.write_text(json.dumps(self.config, indent=1))
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen(
                [str(self.bin), "--config", str(cfg)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise ServiceError(f"kvringd exited with {self.proc.returncode}:\n{_log_tail(self.log_path)}")
            try:
                st = self.inspect()
                # The arena is faulted in by a background thread after start; measuring
                # while it runs would charge that CPU to the first requests.
                if st["instance"]["state"] == "running" and st.get("arena", {}).get("prefault") != "running":
                    break
            except (subprocess.SubprocessError, ValueError, KeyError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServiceError(f"kvringd not ready within {timeout} s:\n{_log_tail(self.log_path)}")
            time.sleep(0.2)
        scrape(self.metrics_url)  # /metrics answers too

    def inspect(self) -> dict[str, Any]:
        out = subprocess.run(
            [str(self.inspect_bin), "--json", "--socket", self.socket], capture_output=True, timeout=10, check=True
        )
        return json.loads(out.stdout)

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        return scrape(self.metrics_url)

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, n: int = 30) -> str:
        return _log_tail(self.log_path, n)


# ---- LMCache's MP server -------------------------------------------------------------------


class LmcacheServer:
    """`lmcache server` (MP mode): the KV store LMCacheMPConnector talks to over ZMQ."""

    def __init__(self, venv_bin: Path, workdir: Path, *, chunk_size: int, l1_size_gb: float):
        self.bin = venv_bin / "lmcache"
        self.port = free_port()
        self.http_port = free_port()
        self.log_path = workdir / "lmcache-server.log"
        self.dir = workdir
        self.argv = [
            str(self.bin),
            "server",
            "--host",
            "localhost",
            "--port",
            str(self.port),
            "--chunk-size",
            str(chunk_size),
            "--l1-size-gb",
            str(l1_size_gb),
            "--eviction-policy",
            "LRU",
            "--supported-transfer-mode",
            "auto",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        if not self.bin.exists():
            raise ServiceError(f"{self.bin} is missing (tools/install-vllm.sh installs LMCache 0.5.6)")
        self.dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, LMCACHE_DISABLE_BANNER="1", LMCACHE_TRACK_USAGE="false")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise ServiceError(f"lmcache server exited with {self.proc.returncode}:\n{_log_tail(self.log_path)}")
            if "cache server is running" in self.log_path.read_text(errors="replace"):
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        return
            if time.monotonic() > deadline:
                raise ServiceError(f"lmcache server not listening within {timeout} s:\n{_log_tail(self.log_path)}")
            time.sleep(0.5)

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # its clean shutdown path
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, n: int = 30) -> str:
        return _log_tail(self.log_path, n)


if __name__ == "__main__":
    for pid, cmd in foreign_vllm():
        print(pid, cmd)
    sys.exit(0)
