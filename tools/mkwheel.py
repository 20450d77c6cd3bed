#!/usr/bin/env python3
"""Assembles the kvring wheel from a configured meson build directory (tools/build-wheel.sh).

    mkwheel.py --source SRC --build-dir BUILD --out OUTDIR [--jobs N]

It builds, with ninja, only what the wheel ships, then writes one wheel (a zip, PEP 427)
with nothing but the standard library:

- ``kvring/``: the Python package of client/python/kvring (binding + vLLM connector + the
  vLLM plugin), and ``kvring/lib/libkvring.so.0`` (kvring._lib finds it there);
- ``kvring-V.data/data/bin/``: kvringd and kvring-inspect (pip puts them in the
  environment's bin/, on its PATH);
- ``kvring-V.data/data/libexec/kvring/``: every actor executable meson installs into
  libexecdir/kvring (kvringd looks in <its dir>/../libexec/kvring/);
- ``kvring-V.dist-info/``: METADATA and entry_points.txt from client/python/pyproject.toml
  (one home for name, version, dependencies and the vLLM plugin's entry point).

The three versions (meson project, pyproject, kvring.__version__) must agree. The shipped
binaries link only system libraries; one that needs libkvring must find it through an
$ORIGIN-relative RUNPATH, and none may name a directory of the build tree (both checked).
Prints the wheel's path last.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

BIN = ("kvringd", "kvring-inspect")
ACTORS = ("lookup", "loader", "storer", "disk", "gather", "remote")  # sup_find_executables' kinds
LIBRARY = "kvring"  # the shared library target (libkvring.so.0)


def die(msg: str) -> None:
    print(f"mkwheel: {msg}", file=sys.stderr)
    sys.exit(1)


def targets(build: Path) -> dict[str, dict]:
    """Installed meson targets by name (meson-info/intro-targets.json)."""
    intro = json.loads((build / "meson-info" / "intro-targets.json").read_text())
    return {t["name"]: t for t in intro if t.get("installed")}


def elf_dynamic(path: Path) -> tuple[list[str], list[str]]:
    """(NEEDED libraries, RPATH/RUNPATH entries) of an ELF file, from readelf -d."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", out)
    paths: list[str] = []
    for p in re.findall(r"\((?:RPATH|RUNPATH)\).*\[(.*)\]", out):
        paths += p.split(":")
    return needed, paths


def check_elf(path: Path, build: Path) -> None:
    needed, paths = elf_dynamic(path)
    inside = [p for p in paths if p.startswith(str(build)) or p.startswith(str(build.resolve()))]
    if inside:
        die(f"{path.name} has the build-tree RUNPATH {':'.join(inside)}: it would not run once installed")
    if "libkvring.so.0" in needed and not any(p.startswith("$ORIGIN") for p in paths):
        die(f"{path.name} needs libkvring.so.0 but has no $ORIGIN-relative RUNPATH to find the wheel's copy")


def versions(src: Path, build: Path, project: dict) -> str:
    meson_v = json.loads((build / "meson-info" / "intro-projectinfo.json").read_text())["version"]
    py_v = project["version"]
    init = (src / "client" / "python" / "kvring" / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', init, re.M)
    pkg_v = m.group(1) if m else "?"
    if not meson_v == py_v == pkg_v:
        die(
            f"versions differ: meson.build {meson_v}, client/python/pyproject.toml {py_v}, "
            f"kvring/__init__.py __version__ {pkg_v}"
        )
    return py_v


def metadata(project: dict, version: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project.get('description', '')}",
        "License: Apache-2.0",
    ]
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    for dep in project.get("dependencies", []):
        lines.append(f"Requires-Dist: {dep}")
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for dep in deps:
            lines.append(f'Requires-Dist: {dep} ; extra == "{extra}"')
    return "\n".join(lines) + "\n\n" + (project.get("description", "") + "\n")


def entry_points(project: dict) -> str:
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    out = []
    for group, eps in groups.items():
        out.append(f"[{group}]")
        out += [f"{name} = {value}" for name, value in eps.items()]
        out.append("")
    return "\n".join(out)


def platform_tag() -> str:
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


class Wheel:
    """A wheel being written: files with their modes, RECORD kept as they are added."""

    def __init__(self, path: Path, epoch: int) -> None:
        self.zf = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.record: list[str] = []
        self.date = time.gmtime(max(epoch, 315532800))[:6]  # zip cannot say before 1980

    def add(self, name: str, data: bytes, executable: bool = False) -> None:
        zi = zipfile.ZipInfo(name, self.date)
        zi.external_attr = ((0o100755 if executable else 0o100644) & 0xFFFF) << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(zi, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append(f"{name},sha256={digest},{len(data)}")

    def close(self, record_name: str) -> None:
        self.record.append(f"{record_name},,")
        zi = zipfile.ZipInfo(record_name, self.date)
        zi.external_attr = (0o100644 & 0xFFFF) << 16
        self.zf.writestr(zi, "\n".join(self.record) + "\n", compress_type=zipfile.ZIP_DEFLATED)
        self.zf.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    src, build = a.source.resolve(), a.build_dir.resolve()

    project = tomllib.loads((src / "client" / "python" / "pyproject.toml").read_text())["project"]
    version = versions(src, build, project)
    name = project["name"]

    tg = targets(build)
    want = list(BIN) + [f"kvring-{k}" for k in ACTORS] + [LIBRARY]
    missing = [t for t in want if t not in tg]
    if missing:
        die(f"the meson build defines no installed target {', '.join(missing)}")
    outputs = [tg[t]["filename"][0] for t in want]
    ninja = ["ninja", "-C", str(build), f"-j{a.jobs}"] + [os.path.relpath(o, build) for o in outputs]
    if subprocess.run(ninja, stdout=sys.stderr).returncode:  # stdout is the wheel's path alone
        die(f"building the wheel's binaries failed: {' '.join(ninja)}")

    data = f"{name}-{version}.data/data"
    files: list[tuple[str, Path, bool]] = []  # wheel path, file, executable
    for t in BIN:
        files.append((f"{data}/bin/{t}", Path(tg[t]["filename"][0]), True))
    for k in ACTORS:
        t = tg[f"kvring-{k}"]
        # meson installs the actors in libexecdir/kvring: keep that relative place
        if not t["install_filename"][0].endswith(f"/libexec/kvring/kvring-{k}"):
            die(f"kvring-{k} installs to {t['install_filename'][0]}, not <prefix>/libexec/kvring/")
        files.append((f"{data}/libexec/kvring/kvring-{k}", Path(t["filename"][0]), True))
    files.append((f"{name}/lib/libkvring.so.0", Path(tg[LIBRARY]["filename"][0]), False))
    for _, f, _ in files:
        check_elf(f, build)

    pkg = src / "client" / "python" / "kvring"
    py = sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)

    tag = f"py3-none-{platform_tag()}"
    a.out.mkdir(parents=True, exist_ok=True)
    whl = a.out / f"{name}-{version}-{tag}.whl"
    tmp = whl.with_name(whl.name + ".part")
    w = Wheel(tmp, int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))
    for p in py:
        w.add(f"{name}/{p.relative_to(pkg).as_posix()}", p.read_bytes())
    for arc, f, exe in files:
        w.add(arc, f.read_bytes(), executable=exe)
    di = f"{name}-{version}.dist-info"
    w.add(f"{di}/METADATA", metadata(project, version).encode())
    w.add(
        f"{di}/WHEEL",
        f"Wheel-Version: 1.0\nGenerator: kvring tools/mkwheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    )
    w.add(f"{di}/entry_points.txt", entry_points(project).encode())
    w.add(f"{di}/top_level.txt", f"{name}\n".encode())
    w.close(f"{di}/RECORD")
    os.replace(tmp, whl)
    print(whl)


if __name__ == "__main__":
    main()
