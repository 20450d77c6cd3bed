"""Bad kv_connector_extra_config: vLLM refuses to start, naming what is wrong, within bounds.

Two engines that must not start:

1. an unknown key (a typo, ``sockt``): the connector refuses the configuration and the
   message names the key (and lists the known ones);
2. a socket path where no kvringd listens: the message names the path.

Each must exit (non-zero) within 180 s, with the reason in its log; a hang or a start
without offload would fail the test.
"""

from __future__ import annotations

from pathlib import Path

import kvtest as kt
from kvtest import check


def refused(d: Path, name: str, extra: dict) -> kt.Engine:
    kvc = kt.connector_config("/unused")
    kvc["kv_connector_extra_config"] = extra
    return kt.Engine(
        d,
        name,
        kv_transfer_config=kvc,
        start_timeout=180,
        expect_failure=True,
        wait=False,
        threads_bind="0" if name == "typo" else "1",
    )


def check_refusal(eng: kt.Engine, needle: str) -> None:
    eng.wait_started()
    rc = eng.proc.returncode
    eng.close()
    check(rc not in (0, None), f"engine {eng.name} exited {rc}, want a failure")
    text = eng.log_text()
    check(needle in text, f"engine {eng.name}'s log does not name {needle!r}:\n{eng.log_tail()}")
    line = next(ln for ln in text.splitlines() if needle in ln)
    kt.log(f"{eng.name}: refused in {eng.startup_s:.1f} s (exit {rc}): {line.strip()[-160:]}")


def main(d: Path) -> None:
    kv = kt.Kvringd(d)
    missing = str(d / "no-kvringd-here.sock")
    # both at once, one core each: they fail independently
    typo = refused(d, "typo", {"sockt": kv.socket})
    nosock = refused(d, "nosocket", {"socket": missing})
    try:
        check_refusal(typo, "unknown key 'sockt'")
        check_refusal(nosock, f"kvringd socket {missing} does not exist")
    finally:
        typo.kill()
        nosock.kill()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    kt.run(main)
