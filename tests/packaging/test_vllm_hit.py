"""vLLM's hit test from a fresh venv holding the wheel, the connector named only "KvringConnector".

The wheel goes into a fresh venv (pip install --no-index); vLLM comes from the vLLM
suite's venv ($KVR_VLLM_VENV, default $KVR_BUILD_ROOT/vllm-venv; absent: exit 77, SKIP)
through a .pth file, without installing it again. Then vllm_hit.py runs with the fresh
venv's python: tests/vllm/test_hit.py's main against kvringd from the venv, with no
kv_connector_module_path (vLLM finds the connector through the wheel's plugin entry point).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pkgtest as pt
from pkgtest import check


def main(d: Path) -> None:
    vllm_venv = Path(os.environ.get("KVR_VLLM_VENV", pt.BUILD / "vllm-venv"))
    vpy = vllm_venv / "bin" / "python"
    whl, build_s = pt.build_wheel(d / "wheelhouse")
    pt.log(f"wheel build: {build_s:.1f} s")
    # the fresh venv on the vLLM venv's interpreter (its site-packages are for that Python)
    venv = pt.Venv(d / "venv", whl, python=str(vpy))
    pt.log(f"python -m venv: {venv.create_s:.1f} s; pip install --no-index: {venv.install_s:.1f} s")
    vsite = subprocess.run(
        [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    check(not (Path(vsite) / "kvring").exists(), f"the vLLM venv has a kvring of its own in {vsite}")
    (venv.site / "zz-vllm-venv.pth").write_text(vsite + "\n")  # after the venv's own packages
    r = subprocess.run(
        [str(venv.python), str(pt.HERE / "vllm_hit.py"), str(venv.path)],
        env=venv.env(KVR_BUILD_ROOT=str(pt.BUILD), KVR_SOURCE_ROOT=str(pt.SRC)),
        cwd=venv.path,
        timeout=1000,
    )
    check(r.returncode == 0, f"vllm_hit.py exited {r.returncode}")


if __name__ == "__main__":
    venv = Path(os.environ.get("KVR_VLLM_VENV", pt.BUILD / "vllm-venv"))
    if not (venv / "bin" / "python").exists():
        pt.log(f"SKIP: no vLLM venv at {venv} (tools/install-vllm.sh creates it)")
        sys.exit(77)
    pt.run(main)
