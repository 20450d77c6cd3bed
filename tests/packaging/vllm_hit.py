"""tests/vllm/test_hit.py, run by the fresh venv's python against the wheel (test_vllm_hit.py).

    vllm_hit.py VENV

What changes against the vLLM suite's run of test_hit.main:
- kvringd and kvring-inspect are VENV's (kvringd finds its actors in VENV/libexec/kvring);
- the connector config names "KvringConnector" and no kv_connector_module_path: vLLM's
  KVConnectorFactory knows it only through the wheel's vllm.general_plugins entry point;
- the engine's PYTHONPATH holds VENV's site-packages, never the checkout's client/python.
Checked besides test_hit's own checks: this process imports kvring from VENV without vLLM
or torch; vLLM does not know the name before the plugin's register(), which is
idempotent; every process of the engine that maps a libkvring maps the wheel's
(VENV/.../kvring/lib/libkvring.so.0), and there is at least one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

venv = Path(sys.argv[1]).resolve()
src = Path(os.environ["KVR_SOURCE_ROOT"])
sys.path.insert(0, str(src / "tests" / "vllm"))

import kvring  # noqa: E402

import kvtest as kt  # noqa: E402
import test_hit  # noqa: E402

kt.check(Path(kvring.__file__).resolve().is_relative_to(venv), f"kvring imported from {kvring.__file__}")
kt.check("vllm" not in sys.modules and "torch" not in sys.modules, "import kvring imported vllm or torch")
site = Path(kvring.__file__).resolve().parents[1]
wheel_lib = site / "kvring" / "lib" / "libkvring.so.0"

kt.KVRINGD = venv / "bin" / "kvringd"
kt.INSPECT = venv / "bin" / "kvring-inspect"
kt.PYPKG = site  # kt.Engine puts PYPKG first on the engine's PYTHONPATH

_connector_config = kt.connector_config


def connector_config(sock: str, **extra):
    cfg = _connector_config(sock, **extra)
    del cfg["kv_connector_module_path"]
    return cfg


kt.connector_config = connector_config

mapped: dict[int, set[str]] = {}  # engine process -> libkvring files it maps


class Engine(kt.Engine):
    def generate(self, *a, **kw):
        out = super().generate(*a, **kw)
        # every process of the engine's session (the engine, EngineCore, workers)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.getsid(int(pid)) != self.proc.pid:
                    continue
                with open(f"/proc/{pid}/maps") as f:
                    rows = [ln.split(None, 5) for ln in f if "libkvring" in ln]
                libs = {r[5].strip() for r in rows if len(r) == 6}
            except (OSError, ProcessLookupError):
                continue
            if libs:
                mapped.setdefault(int(pid), set()).update(libs)
        return out


kt.Engine = Engine


def main(d: Path) -> None:
    from kvring import vllm_plugin
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    # this process has not loaded vLLM's plugins: without the plugin vLLM has no such name
    try:
        KVConnectorFactory.get_connector_class_by_name("KvringConnector")
    except ValueError as e:
        kt.log(f"before the plugin: {e}")
    else:
        raise kt.TestFailure("vLLM knows KvringConnector before kvring's plugin registered it")
    first = vllm_plugin.register()
    again = vllm_plugin.register()
    kt.check(first and not again, f"register() gave {first}, then {again}: want True, then False")
    kt.check(KVConnectorFactory.get_connector_class_by_name("KvringConnector").__module__ == "kvring.vllm.connector",
             "KvringConnector is not kvring's")  # fmt: skip
    test_hit.main(d)
    kt.check(mapped, "no process of the engine maps a libkvring")
    for pid, libs in mapped.items():
        kt.check(libs == {str(wheel_lib)}, f"engine process {pid} maps {sorted(libs)}, want only {wheel_lib}")
    kt.log(f"engine processes {sorted(mapped)} map the wheel's {wheel_lib}")


if __name__ == "__main__":
    kt.run(main)
