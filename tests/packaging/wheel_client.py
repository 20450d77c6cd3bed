"""Run by test_wheel.py with the fresh venv's python: the wheel's kvring against kvringd.

    wheel_client.py SOCKET VENV

- `import kvring` comes from VENV (not the checkout), loads the wheel's own libkvring
  (kvring/lib/libkvring.so.0, with $KVR_BUILD_ROOT still set as the suites set it), and
  imports neither vLLM nor torch; the vLLM plugin's entry point is registered;
- a worker attaches with a memfd of 8 blocks of the tiny model's kv-fused geometry,
  stores blocks 0..3 (a distinct byte pattern each), looks the prompt up (4 blocks) and
  loads it into blocks 4..7: their bytes equal blocks 0..3 exactly;
- its loader and storer (and kvringd's lookup actor) run the wheel's executables from
  VENV/libexec/kvring (their /proc/PID/exe, as kvring-inspect lists the pids);
- a scheduler of the same engine leases the prompt: 4 blocks.
Prints one JSON line of what it saw; exits 1 naming the first thing that is wrong.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

LAYERS, HEADS, HEAD_DIM, DT, BLOCK, NUM_BLOCKS = 2, 2, 64, 4, 32, 8
PAGE = 2 * BLOCK * HEADS * HEAD_DIM * DT


def check(cond: bool, msg: str) -> None:
    if not cond:
        print(f"wheel_client: {msg}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    sock, venv = sys.argv[1], Path(sys.argv[2]).resolve()
    import kvring

    check(Path(kvring.__file__).resolve().is_relative_to(venv), f"kvring imported from {kvring.__file__}, not {venv}")
    check("vllm" not in sys.modules and "torch" not in sys.modules, "import kvring imported vllm or torch")
    lib = Path(kvring.library_path()).resolve()
    check(lib == Path(kvring.__file__).resolve().parent / "lib" / "libkvring.so.0", f"libkvring from {lib}")
    eps = [(e.name, e.value) for e in md.entry_points(group="vllm.general_plugins")]
    check(eps == [("kvring", "kvring.vllm_plugin:register")], f"vllm.general_plugins entry points: {eps}")
    import kvring.vllm_plugin  # noqa: F401  (its import alone must not import vLLM either)

    check("vllm" not in sys.modules, "importing kvring.vllm_plugin imported vllm")

    regions = [
        kvring.RegionSpec(offset=layer * NUM_BLOCKS * PAGE, stride=PAGE, page_bytes=PAGE) for layer in range(LAYERS)
    ]
    geom = kvring.build_geometry(
        layers=LAYERS, kv_heads=HEADS, head_dim=HEAD_DIM, dtype_bytes=DT, block_tokens=BLOCK,
        num_blocks=NUM_BLOCKS, regions=regions,
    )  # fmt: skip
    kv_bytes = LAYERS * NUM_BLOCKS * PAGE
    fd = os.memfd_create("kvring-wheel", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, kv_bytes)
    mm = mmap.mmap(fd, kv_bytes)

    def block(b: int) -> bytes:
        return b"".join(mm[(la * NUM_BLOCKS + b) * PAGE : (la * NUM_BLOCKS + b + 1) * PAGE] for la in range(LAYERS))

    for b in range(4):
        for la in range(LAYERS):
            off = (la * NUM_BLOCKS + b) * PAGE
            mm[off : off + PAGE] = bytes((b * 31 + la * 7 + i) & 0xFF for i in range(256)) * (PAGE // 256)
    tokens = [(i * 7919) % 31991 + 1 for i in range(4 * BLOCK)]

    def wait(w: kvring.Worker, op: int) -> kvring.Completion:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for c in w.wait(200):
                if c.op == op:
                    return c
        check(False, f"no completion of op {op} within 10 s")
        raise AssertionError

    exes: dict[str, str] = {}
    with kvring.Worker(geom, fd, kv_bytes, socket=sock, engine_id="wheel") as w:
        slot = w.slot
        w.store(1, tokens, [0, 1, 2, 3])
        c = wait(w, kvring.OP_STORE)
        check(c.status == 0 and c.n_stored == 4 and not c.failed, f"store: {c}")
        hit = w.lookup(2, tokens)
        check(hit.matched_blocks == 4 and hit.matched_tokens == 4 * BLOCK, f"lookup: {hit}")
        w.load(2, [4, 5, 6, 7])
        c = wait(w, kvring.OP_LOAD)
        check(c.status == 0 and not c.failed, f"load: {c}")
        for b in range(4):
            check(block(4 + b) == block(b), f"block {4 + b} does not hold block {b}'s bytes after the load")
        snap = json.loads(
            subprocess.run(["kvring-inspect", "--json", "--socket", sock], capture_output=True, check=True).stdout
        )
        for a in snap["actors"]:
            if a["state"] == "ready":
                exes[a["name"]] = os.readlink(f"/proc/{a['pid']}/exe")
        with kvring.Scheduler(socket=sock, engine_id="wheel") as s:
            r = s.lease(3, tokens, loaders=1, ttl_ms=1000)
            check(r.matched_blocks == 4, f"scheduler lease matched {r.matched_blocks} blocks, want 4")
            s.lease_release(3)
    for name in ("lookup", f"loader.{slot}", f"storer.{slot}"):
        check(name in exes, f"actor {name} not ready while the worker was attached: {sorted(exes)}")
    for name, exe in exes.items():
        kind = name.split(".")[0]
        check(
            Path(exe) == venv / "libexec" / "kvring" / f"kvring-{kind}",
            f"actor {name} runs {exe}, not the wheel's {venv}/libexec/kvring/kvring-{kind}",
        )
    print(json.dumps({"kvring": kvring.__file__, "library": str(lib), "actors": exes}))


if __name__ == "__main__":
    main()
