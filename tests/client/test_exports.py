"""libkvring.so exports exactly the API listed in client/libkvring.map, and needs no libcjson.

Reads the version script's global: list, compares it with `nm -D --defined-only` of the built
library (every symbol must carry the map's version node) and prints both differences; then
checks the library's DT_NEEDED entries name no libcjson. Exit 0 pass, 1 fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def map_symbols(path: Path) -> tuple[str, set[str]]:
    """(version node, its global: names) of a version script with one node."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    m = re.fullmatch(r"\s*([\w.]+)\s*\{\s*global:(.*?)local:\s*\*\s*;\s*\}\s*;\s*", text, flags=re.S)
    if not m:
        raise SystemExit(f"{path}: not a one-node version script `NODE {{ global: ...; local: *; }};`")
    names = [n.strip() for n in m.group(2).split(";") if n.strip()]
    bad = [n for n in names if not re.fullmatch(r"kvr_\w+", n)]
    if bad:
        raise SystemExit(f"{path}: not kvr_ function names: {bad}")
    if len(names) != len(set(names)):
        raise SystemExit(f"{path}: a name is listed twice")
    return m.group(1), set(names)


def exported(lib: Path) -> list[tuple[str, str, str]]:
    """(type, name, version) of every defined dynamic symbol."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True).stdout
    syms = []
    for line in out.splitlines():
        f = line.split()
        kind, full = f[-2], f[-1]
        name, _, version = full.partition("@@") if "@@" in full else full.partition("@")
        syms.append((kind, name, version))
    return syms


def needed(lib: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def compare(syms: list[tuple[str, str, str]], node: str, want: set[str]) -> list[str]:
    """What differs between the exported symbols and the map (empty: nothing)."""
    failures = []
    # the version node itself shows up as an absolute symbol; everything else is a function
    got = {name for kind, name, _ in syms if not (kind == "A" and name == node)}
    if got - want:
        failures.append(f"exported but not in libkvring.map: {' '.join(sorted(got - want))}")
    if want - got:
        failures.append(f"in libkvring.map but not exported: {' '.join(sorted(want - got))}")
    unversioned = sorted(name for kind, name, ver in syms if name in got and ver != node)
    if unversioned:
        failures.append(f"not under version {node}: {' '.join(unversioned)}")
    not_text = sorted(name for kind, name, _ in syms if name in got and kind != "T")
    if not_text:
        failures.append(f"exported symbols that are not functions: {' '.join(not_text)}")
    return failures


def main() -> int:
    build = Path(os.environ["KVR_BUILD_ROOT"])
    src = Path(os.environ["KVR_SOURCE_ROOT"])
    lib = build / "client" / "libkvring.so"
    node, want = map_symbols(src / "client" / "libkvring.map")
    syms = exported(lib)
    failures = compare(syms, node, want)

    # negative control: the comparison sees one name missing from, or added to, the map
    one = min(want)
    if not any(one in f for f in compare(syms, node, want - {one})):
        failures.append(f"control: a map without {one} was not told apart")
    if not any("kvr_not_exported" in f for f in compare(syms, node, want | {"kvr_not_exported"})):
        failures.append("control: a map with kvr_not_exported was not told apart")

    deps = needed(lib)
    if any("cjson" in d for d in deps):
        failures.append(f"libkvring needs libcjson at run time: NEEDED {' '.join(deps)}")

    print(f"{lib}: {len(syms)} dynamic symbols defined, map {node}: {len(want)} names; NEEDED {' '.join(deps)}")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
