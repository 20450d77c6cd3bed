"""Harness of the packaging suite: the wheel, a fresh venv holding it, kvringd from the venv.

- `build_wheel()`: tools/build-wheel.sh into the test's work directory, its binaries built in
  $KVR_BUILD_ROOT/wheel (a release build of its own: minutes the first time, incremental
  afterwards);
- `Venv`: ``python3 -m venv`` + ``pip install --no-index <wheel>``, timed; `run()` runs a
  command in it with the environment a user of the venv has (its bin/ first on PATH);
- `start_kvringd()`: the vLLM suite's `kvtest.Kvringd` (a private socket, config and log
  in the work directory, the tiny model's geometry, ready = kvring-inspect says "running"),
  but the kvringd and kvring-inspect of the venv;
- `run()`: a test's main(workdir) with a verdict line; exit 0/1 (77: skipped).

Environment: KVR_BUILD_ROOT / KVR_SOURCE_ROOT as meson sets them (defaults: this checkout's
build/ and root); KVR_KEEP_LOGS=1 keeps the work directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = Path(os.environ.get("KVR_SOURCE_ROOT", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("KVR_BUILD_ROOT", SRC / "build"))
WHEEL_BUILD = BUILD / "wheel"
HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(SRC / "tests" / "vllm"))
import kvtest  # noqa: E402  (the vLLM suite's harness: Kvringd, TestFailure, check)

TestFailure = kvtest.TestFailure
check = kvtest.check
PACKAGE_FILES = ("kvringd", "kvring-inspect")
ACTORS = ("lookup", "loader", "storer", "disk", "gather", "remote")


def log(*a: Any) -> None:
    print("[packaging-test]", *a, file=sys.stderr, flush=True)


def proto_version(header: Path) -> int:
    """KVR_PROTO_VERSION as a kvr_proto.h defines it."""
    m = re.findall(r"^#define KVR_PROTO_VERSION (\d+)u", header.read_text(), re.M)
    check(len(m) == 1, f"{header}: {len(m)} definitions of KVR_PROTO_VERSION")
    return int(m[0])


def package_version() -> str:
    m = re.search(r'^__version__ = "([^"]+)"', (SRC / "client/python/kvring/__init__.py").read_text(), re.M)
    assert m
    return m.group(1)


def build_wheel(out: Path) -> tuple[Path, float]:
    """(the wheel, seconds tools/build-wheel.sh took)."""
    t0 = time.monotonic()
    r = subprocess.run(
        [str(SRC / "tools" / "build-wheel.sh"), "--build-dir", str(WHEEL_BUILD), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    dt = time.monotonic() - t0
    if r.returncode:
        raise TestFailure(f"tools/build-wheel.sh exited {r.returncode}:\n{r.stderr[-4000:]}")
    lines = r.stdout.split()
    check(len(lines) == 1, f"build-wheel.sh printed {r.stdout!r}, want the wheel's path alone")
    whl = Path(lines[0])
    check(whl.is_file() and whl.parent == out.resolve(), f"build-wheel.sh named {whl}, not a wheel in {out}")
    return whl, dt


class Venv:
    """A fresh venv with the wheel installed from the file alone (pip --no-index)."""

    def __init__(self, path: Path, wheel: Path, python: str = sys.executable) -> None:
        self.path = path
        t0 = time.monotonic()
        subprocess.run([python, "-m", "venv", str(path)], check=True, capture_output=True)
        self.create_s = time.monotonic() - t0
        self.python = path / "bin" / "python"
        t0 = time.monotonic()
        r = subprocess.run(
            [str(self.python), "-m", "pip", "install", "--no-index", "--disable-pip-version-check", str(wheel)],
            capture_output=True,
            text=True,
            env=self.env(),
        )
        self.install_s = time.monotonic() - t0
        if r.returncode:
            raise TestFailure(f"pip install --no-index {wheel.name} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        self.site = Path(self.out([str(self.python), "-c", purelib]))

    def env(self, **extra: str) -> dict[str, str]:
        """A shell of the activated venv: its bin/ first on PATH, VIRTUAL_ENV set, no
        PYTHONPATH (nothing of the source tree), KVRING_LIB unset."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVRING_LIB", "PYTHONHOME")}
        env["PATH"] = f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = str(self.path)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def run(self, argv: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        """argv in the venv (cwd: the venv, so nothing of the checkout is importable)."""
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env(**env), cwd=self.path)

    def out(self, argv: list[str], **env: str) -> str:
        r = self.run(argv, **env)
        if r.returncode:
            raise TestFailure(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r.stdout.strip()


def start_kvringd(venv: Venv, workdir: Path, **kw: Any) -> kvtest.Kvringd:
    """kvtest's Kvringd, started from the venv's bin/ (kvringd finds its actors there)."""
    kvtest.KVRINGD = venv.bin("kvringd")
    kvtest.INSPECT = venv.bin("kvring-inspect")
    return kvtest.Kvringd(workdir, **kw)


def run(main: Any) -> None:
    """Run main(workdir); exit 0/1 with a verdict line and the time it took."""
    name = Path(sys.argv[0]).stem
    base = BUILD / "packaging-test-work"
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    t0 = time.monotonic()
    try:
        main(d)
    except TestFailure as e:
        log(f"FAIL {name} after {time.monotonic() - t0:.1f} s: {e}")
        log(f"(work directory kept: {d})")
        sys.exit(1)
    log(f"PASS {name} in {time.monotonic() - t0:.1f} s")
    if os.environ.get("KVR_KEEP_LOGS"):
        log(f"(work directory kept: {d})")
    else:
        shutil.rmtree(d, ignore_errors=True)
