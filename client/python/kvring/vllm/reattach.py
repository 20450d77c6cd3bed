"""What the connector logs while kvringd is away: the first failed attach, then a count.

Both halves of the connector try to attach again at most every reattach_interval_ms while
kvringd is down. Logging every try was one warning per second per half (37 lines in 35 s of
a restart); an operator needs the first failure, a reminder while it lasts, and the end:

    kvring: TP rank 0 attach to /tmp/kvring.sock failed (...); trying again every 1000 ms
    kvring: TP rank 0 still cannot attach to /tmp/kvring.sock: 60 tries in 60 s (last: ...)
    kvring: TP rank 0 attached to kvringd at /tmp/kvring.sock again after 75 failed tries in 75.2 s
"""

from __future__ import annotations

import logging
import time

REMIND_S = 60.0  # while attaching keeps failing, one reminder this often


class ReattachLog:
    def __init__(self, log: logging.Logger, who: str, socket: str, interval_ms: int) -> None:
        self.log, self.who, self.socket, self.interval_ms = log, who, socket, interval_ms
        self.failures = 0
        self.since = 0.0
        self.reminded = 0.0

    def failed(self, err: object) -> None:
        now = time.monotonic()
        self.failures += 1
        if self.failures == 1:
            self.since = self.reminded = now
            self.log.warning(
                "kvring: %s attach to %s failed (%s); trying again every %d ms",
                self.who,
                self.socket,
                err,
                self.interval_ms,
            )
        elif now - self.reminded >= REMIND_S:
            self.reminded = now
            self.log.warning(
                "kvring: %s still cannot attach to %s: %d tries in %.0f s (last: %s)",
                self.who,
                self.socket,
                self.failures,
                now - self.since,
                err,
            )

    def attached(self, detail: str = "") -> None:
        if self.failures:
            self.log.warning(
                "kvring: %s attached to kvringd at %s again%s after %d failed tries in %.1f s",
                self.who,
                self.socket,
                detail,
                self.failures,
                time.monotonic() - self.since,
            )
        else:
            self.log.warning("kvring: %s attached to kvringd at %s again%s", self.who, self.socket, detail)
        self.failures = 0
