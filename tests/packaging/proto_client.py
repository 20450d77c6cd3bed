"""Run by test_proto.py with the fresh venv's python: attach to kvringd as a scheduler and
as a worker, and print one JSON line of what each attach gave (ok, or the exception's
class, errno, message and versions, and libkvring's own reason).

    proto_client.py SOCKET
"""

from __future__ import annotations

import json
import os
import sys

import kvring
from kvring import _lib

LAYERS, HEADS, HEAD_DIM, DT, BLOCK, NUM_BLOCKS = 2, 2, 64, 4, 32, 8
PAGE = 2 * BLOCK * HEADS * HEAD_DIM * DT


def attempt(make) -> dict:
    try:
        with make():
            return {"ok": True}
    except kvring.KvringError as e:
        return {
            "ok": False,
            "class": type(e).__name__,
            "errno": e.errno,
            "message": e.strerror,
            "kvringd_protocol": getattr(e, "kvringd_protocol", None),
            "protocol": getattr(e, "protocol", None),
            "c_reason": _lib.library().kvr_last_error(None).decode(),
        }


def main() -> None:
    sock = sys.argv[1]
    regions = [
        kvring.RegionSpec(offset=layer * NUM_BLOCKS * PAGE, stride=PAGE, page_bytes=PAGE) for layer in range(LAYERS)
    ]
    geom = kvring.build_geometry(
        layers=LAYERS, kv_heads=HEADS, head_dim=HEAD_DIM, dtype_bytes=DT, block_tokens=BLOCK,
        num_blocks=NUM_BLOCKS, regions=regions,
    )  # fmt: skip
    fd = os.memfd_create("kvring-proto", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, LAYERS * NUM_BLOCKS * PAGE)
    out = {
        "library": kvring.library_path(),
        "kvring": kvring.__file__,
        "version": kvring.__version__,
        "scheduler": attempt(lambda: kvring.Scheduler(socket=sock, engine_id="proto")),
        "worker": attempt(lambda: kvring.Worker(geom, fd, LAYERS * NUM_BLOCKS * PAGE, socket=sock, engine_id="proto")),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
