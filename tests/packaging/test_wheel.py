"""The wheel, from build to a running cache: tools/build-wheel.sh, a fresh venv, kvringd.

1. tools/build-wheel.sh builds one wheel; its files are exactly the Python package,
   libkvring, kvringd, kvring-inspect and the six actors (executables mode 0755), byte for
   byte the release build's, each matching its RECORD line (sha256, size); its
   entry_points.txt is client/python/pyproject.toml's vLLM plugin;
2. ``python3 -m venv`` + ``pip install --no-index`` of it: kvringd and kvring-inspect are
   the venv's bin/ (first on the venv's PATH), the actors its libexec/kvring/;
3. ``kvringd --version`` and ``--check-config`` from the venv: the effective config names
   our socket; a bad key exits 2 naming it;
4. kvringd started from the venv with no actor_dir (config and socket in the work
   directory) becomes ready; its lookup actor is the venv's executable;
5. the wheel's kvring from the venv's python (wheel_client.py): store, lookup, load with
   the bytes compared, a scheduler's lease, the loader and storer the venv's executables;
6. SIGTERM: kvringd exits 0.

Prints the wheel build time and pip install + kvringd ready (goal: < 60 s; logged, not judged).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time
import zipfile
from pathlib import Path

import pkgtest as pt
from pkgtest import check

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def check_wheel(whl: Path) -> None:
    version = pt.package_version()
    di, data = f"kvring-{version}.dist-info", f"kvring-{version}.data/data"
    pkg = pt.SRC / "client" / "python" / "kvring"
    py = {f"kvring/{p.relative_to(pkg).as_posix()}" for p in pkg.rglob("*.py") if "__pycache__" not in p.parts}
    binaries = {
        f"{data}/bin/kvringd": pt.WHEEL_BUILD / "supervisor" / "kvringd",
        f"{data}/bin/kvring-inspect": pt.WHEEL_BUILD / "tools" / "inspect" / "kvring-inspect",
        "kvring/lib/libkvring.so.0": pt.WHEEL_BUILD / "client" / "libkvring.so.0",
    }
    for k in pt.ACTORS:
        binaries[f"{data}/libexec/kvring/kvring-{k}"] = pt.WHEEL_BUILD / "actors" / k / f"kvring-{k}"
    meta = {f"{di}/{n}" for n in ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt", "RECORD")}
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
        want = py | set(binaries) | meta
        check(names == want, f"wheel files: extra {sorted(names - want)}, missing {sorted(want - names)}")
        for n in py:
            check(zf.read(n) == (pkg / n.removeprefix("kvring/")).read_bytes(), f"{n} differs from the checkout")
        for n, f in binaries.items():
            check(zf.read(n) == f.read_bytes(), f"{n} is not {f}")
            mode = zf.getinfo(n).external_attr >> 16
            want_mode = 0o100644 if n.endswith(".so.0") else 0o100755
            check(mode == want_mode, f"{n}: mode {oct(mode)}, want {oct(want_mode)}")
        record = zf.read(f"{di}/RECORD").decode().splitlines()
        check(len(record) == len(names), f"RECORD has {len(record)} lines for {len(names)} files")
        for line in record:
            n, h, size = line.rsplit(",", 2)
            if n == f"{di}/RECORD":
                check(h == size == "", f"RECORD's own line {line!r}")
                continue
            b = zf.read(n)
            digest = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
            check(h == f"sha256={digest}" and int(size) == len(b), f"RECORD line {line!r} does not match {n}")
        eps = zf.read(f"{di}/entry_points.txt").decode()
        wheel = zf.read(f"{di}/WHEEL").decode()
        metadata = zf.read(f"{di}/METADATA").decode()
    project = tomllib.loads((pt.SRC / "client/python/pyproject.toml").read_text())["project"]
    plugin = project["entry-points"]["vllm.general_plugins"]
    check(plugin == {"kvring": "kvring.vllm_plugin:register"}, f"pyproject's vLLM plugin entry point: {plugin}")
    check(eps == "[vllm.general_plugins]\nkvring = kvring.vllm_plugin:register\n", f"entry_points.txt: {eps!r}")
    check("Root-Is-Purelib: false\n" in wheel and "Tag: py3-none-linux_" in wheel, f"WHEEL: {wheel!r}")
    check(f"Version: {version}\n" in metadata and 'Requires-Dist: vllm ; extra == "vllm"' in metadata, metadata)
    check("Requires-Dist: vllm\n" not in metadata, "vllm is a hard dependency of the wheel")


def main(d: Path) -> None:
    whl, build_s = pt.build_wheel(d / "wheelhouse")
    pt.log(f"wheel build (tools/build-wheel.sh): {build_s:.1f} s -> {whl.name}, {whl.stat().st_size} bytes")
    check_wheel(whl)

    venv = pt.Venv(d / "venv", whl)
    pt.log(f"python3 -m venv: {venv.create_s:.1f} s; pip install --no-index: {venv.install_s:.1f} s")
    for name in pt.PACKAGE_FILES:
        found = shutil.which(name, path=venv.env()["PATH"])
        check(found == str(venv.bin(name)), f"{name} on the venv's PATH is {found}, want {venv.bin(name)}")
    for k in pt.ACTORS:
        exe = venv.path / "libexec" / "kvring" / f"kvring-{k}"
        check(exe.is_file() and exe.stat().st_mode & 0o111 == 0o111, f"{exe} is not an executable file")
    check(venv.out(["kvringd", "--version"]) == f"kvringd {pt.package_version()}", "kvringd --version")

    sock = str(d / "kvring.sock")
    cfg = d / "check.json"
    cfg.write_text(json.dumps({"instance": {"socket": sock}, "l1": {"capacity_bytes": "64MiB"}}))
    eff = json.loads(venv.out(["kvringd", "--check-config", str(cfg)]))
    check(eff["instance"]["socket"] == sock, f"--check-config: instance.socket {eff['instance']['socket']}")
    check(eff["instance"]["actor_dir"] == "", f"--check-config: actor_dir {eff['instance']['actor_dir']!r}")
    check(not Path(sock).exists(), "--check-config started something")
    cfg.write_text(json.dumps({"instance": {"sockt": sock}}))
    bad = venv.run(["kvringd", "--check-config", str(cfg)])
    check(bad.returncode == 2 and "sockt" in bad.stderr, f"--check-config of a bad key: {bad.returncode} {bad.stderr}")

    t0 = time.monotonic()
    kv = pt.start_kvringd(venv, d)
    ready_s = time.monotonic() - t0
    try:
        check(kv.config["instance"].get("actor_dir") is None, "the test config names an actor_dir")
        lookup = Path(f"/proc/{kv.actor_pid('lookup')}/exe").resolve()
        check(lookup == venv.path / "libexec" / "kvring" / "kvring-lookup", f"the lookup actor runs {lookup}")
        total = venv.create_s + venv.install_s + ready_s
        pt.log(
            f"kvringd ready: {ready_s:.2f} s; pip install + kvringd ready: {venv.install_s + ready_s:.1f} s "
            f"(with the venv's creation {total:.1f} s; goal < 60 s)"
        )
        r = venv.run([str(venv.python), str(pt.HERE / "wheel_client.py"), kv.socket, str(venv.path)])
        check(r.returncode == 0, f"wheel_client.py exited {r.returncode}:\n{r.stdout}{r.stderr}\n{kv.log_tail()}")
        seen = json.loads(r.stdout.splitlines()[-1])
        pt.log(f"the wheel's kvring: {seen['library']}; actors {sorted(seen['actors'])} from the venv")
    finally:
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    pt.run(main)
