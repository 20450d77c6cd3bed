"""What the connector logs while kvringd is away: the first failure, a reminder, the end.

kvring.vllm.reattach.ReattachLog is what both halves of the connector call on every failed
and every successful attach (they try again every reattach_interval_ms). Before it, a
35-second kvringd restart logged 37 warnings. Driven here with a real logging.Logger and
counted: 500 failed tries log one warning, a reminder comes once REMIND_S passed, and the
attach that ends it names how many tries failed. Needs no vLLM (the module is loaded from
its file: importing kvring.vllm would import vLLM).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import kvtest as kt
from kvtest import check


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main(d: Path) -> None:
    path = kt.PYPKG / "kvring" / "vllm" / "reattach.py"
    spec = importlib.util.spec_from_file_location("kvr_reattach", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    log = logging.getLogger("kvring-test-reattach")
    log.propagate = False
    cap = Capture()
    log.addHandler(cap)
    log.setLevel(logging.INFO)

    r = mod.ReattachLog(log, "TP rank 0", "/tmp/x.sock", 1000)
    for i in range(500):
        r.failed(f"connect: No such file or directory ({i})")
    check(len(cap.lines) == 1, f"500 failed tries logged {len(cap.lines)} lines: {cap.lines[:3]}")
    check("trying again every 1000 ms" in cap.lines[0], cap.lines[0])
    mod.REMIND_S = 0.0  # the next failure is past the reminder period
    r.failed("connect: No such file or directory (500)")
    check(len(cap.lines) == 2 and "still cannot attach" in cap.lines[1] and "501 tries" in cap.lines[1], cap.lines)
    r.attached(" (worker slot 3)")
    check(len(cap.lines) == 3, cap.lines)
    check("again (worker slot 3) after 501 failed tries" in cap.lines[2], cap.lines[2])
    # a later outage starts over: its first failure is logged again
    mod.REMIND_S = 60.0
    r.failed("gone")
    r.failed("gone")
    check(len(cap.lines) == 4 and "failed (gone)" in cap.lines[3], cap.lines)
    r.attached()
    check("after 2 failed tries" in cap.lines[4], cap.lines)
    kt.log("reattach log: 500 failures -> 1 line, a reminder after REMIND_S, the end names the count")


if __name__ == "__main__":
    kt.run(main, needs_vllm=False)
