"""The Python binding finds every function it calls in the built libkvring.so (no kvringd, no vLLM).

Collects the kvr_ names client/python/kvring calls (`lib.NAME`, `self._lib.NAME`,
`_lib.library().NAME`, `self._fn("NAME")`) and the prototypes _lib.py declares, then loads the
library the way the binding does (KVRING_LIB) and resolves each: every called name must have a
prototype and every prototype must resolve. library() itself also checks the geometry ABI
through kvr_geometry_fill_vllm_layer_major and kvr_geometry_set_region. Exit 0 pass, 1 fail.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path


def called_names(pkg: Path) -> set[str]:
    call = re.compile(r"(?:\blib|\b_lib|\)|\bself\._lib)\.(kvr_\w+)\b|_fn\(\s*\"(kvr_\w+)\"")
    names = set()
    for py in pkg.rglob("*.py"):
        for m in call.finditer(py.read_text()):
            names.add(m.group(1) or m.group(2))
    return names


def sanitizer_runtimes(lib: Path) -> list[str]:
    """Paths of the sanitizer runtimes lib needs (ASan, UBSan), as the compiler finds them."""
    out = subprocess.run(["readelf", "-d", str(lib)], check=True, capture_output=True, text=True).stdout
    names = [n for n in re.findall(r"Shared library: \[([^\]]+)\]", out) if re.match(r"lib(asan|ubsan|tsan)\.", n)]
    cc = os.environ.get("CC", "cc")
    return [subprocess.run([cc, f"-print-file-name={n}"], check=True, capture_output=True, text=True).stdout.strip()
            for n in names]


def main() -> int:
    build = Path(os.environ["KVR_BUILD_ROOT"])
    src = Path(os.environ["KVR_SOURCE_ROOT"])
    lib_path = build / "client" / "libkvring.so"
    pkg = src / "client" / "python" / "kvring"
    runtimes = sanitizer_runtimes(lib_path)
    if runtimes and not os.environ.get("KVR_SANITIZER_PRELOADED"):
        # a sanitizer build's library needs its runtime loaded first: run again with it
        # preloaded (python3's own allocations are not ours to leak-check)
        env = dict(os.environ, LD_PRELOAD=" ".join(runtimes), KVR_SANITIZER_PRELOADED="1")
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
        return subprocess.run([sys.executable, __file__], env=env).returncode
    os.environ["KVRING_LIB"] = str(lib_path)
    sys.path.insert(0, str(pkg.parent))
    from kvring import _lib  # noqa: E402 (after the path is set)

    failures = []
    called = called_names(pkg)
    protos = set(_lib._PROTOS)
    if not called or not protos:
        failures.append(f"found {len(called)} called names and {len(protos)} prototypes: the scan is broken")
    if called - protos:
        failures.append(f"called without a prototype in _lib.py: {' '.join(sorted(called - protos))}")

    lib = _lib.library()  # raises on a missing required symbol or a geometry ABI mismatch
    if _lib.library_path() != str(lib_path):
        failures.append(f"the binding loaded {_lib.library_path()}, not {lib_path}")
    raw = ctypes.CDLL(str(lib_path))
    missing = sorted(n for n in protos | called if not hasattr(raw, n))
    if missing:
        failures.append(f"not exported by {lib_path}: {' '.join(missing)}")
    if any(not _lib.has_symbol(n) for n in protos):
        failures.append("has_symbol() denies a declared prototype")
    # negative control: a function the library has but does not export is not found
    if hasattr(raw, "kvr_config_defaults") or _lib.has_symbol("kvr_msg_build"):
        failures.append("an internal function (kvr_config_defaults / kvr_msg_build) resolves")
    if lib.kvr_geometry_kv_extent(ctypes.byref(_lib.Geometry())) != 0:
        failures.append("kvr_geometry_kv_extent of an empty geometry is not 0")

    print(f"{lib_path}: {len(called)} names called by the binding, {len(protos)} prototypes, all resolved"
          if not failures else f"{lib_path}:")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
