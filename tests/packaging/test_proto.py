"""A client and a kvringd of different protocol versions: each side says so, by number.

    test_proto.py LIBKVRING_PROTO_NEXT KVR_PROTO_NEXT_H

kvringd is the wheel's, started from a fresh venv (kvr_proto.h's KVR_PROTO_VERSION, V);
the other side speaks V + 1 for real:

1. an attach record of version V + 1 on kvringd's socket: kvringd answers a reply of
   magic KVRP, version V, status -EPROTO, "malformed request", then closes the
   connection, logs it, and keeps serving;
2. the wheel's kvring package with KVRING_LIB set to a libkvring built from this tree's
   client.c with KVR_PROTO_VERSION V + 1 (meson builds it beside this test): a scheduler
   and a worker attach both raise kvring.ProtocolMismatch, errno EPROTO, "kvringd at
   <socket> speaks protocol V, this kvring X.Y.Z speaks V+1: upgrade kvringd (or the kvring
   package) so both match", and libkvring's own reason names both versions too;
3. the same package with its own libkvring attaches both to the same kvringd.
"""

from __future__ import annotations

import errno
import json
import socket
import struct
import sys
from pathlib import Path

import pkgtest as pt
from pkgtest import check

MAGIC = 0x4B565250  # "KVRP"
OP_ATTACH_SCHED = 4
REP_HDR = struct.Struct("<IIiIIIII")  # struct kvr_proto_rep up to reason
REASON_MAX = 160


def raw_attach(sock_path: str, version: int) -> tuple[tuple, str, bytes]:
    """Send an ATTACH_SCHED record of `version`; (reply header, reason, what came after)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(10)
        s.connect(sock_path)
        s.send(struct.pack("<IIII", MAGIC, version, OP_ATTACH_SCHED, 0))
        rep = s.recv(1 << 16)
        after = s.recv(1 << 16)  # b"": kvringd closed the connection
    check(len(rep) >= REP_HDR.size + REASON_MAX, f"reply of {len(rep)} bytes")
    hdr = REP_HDR.unpack_from(rep)
    reason = rep[REP_HDR.size : REP_HDR.size + REASON_MAX].split(b"\0", 1)[0].decode()
    return hdr, reason, after


def main(d: Path) -> None:
    lib_next, h_next = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    v = pt.proto_version(pt.SRC / "ipc" / "kvr_proto.h")
    v_next = pt.proto_version(h_next)
    check(v_next == v + 1, f"{h_next} says protocol {v_next}, want {v + 1}")
    whl, build_s = pt.build_wheel(d / "wheelhouse")
    venv = pt.Venv(d / "venv", whl)
    pt.log(f"wheel {build_s:.1f} s, venv {venv.create_s:.1f} s, pip install {venv.install_s:.1f} s")
    kv = pt.start_kvringd(venv, d)
    try:
        # 1. kvringd and a record of the next version
        hdr, reason, after = raw_attach(kv.socket, v + 1)
        magic, version, status = hdr[0], hdr[1], hdr[2]
        check(magic == MAGIC and version == v, f"reply magic {magic:#x} version {version}, want {MAGIC:#x} {v}")
        check(status == -errno.EPROTO and reason == "malformed request", f"reply status {status}, {reason!r}")
        check(after == b"", f"kvringd kept the connection open after refusing it ({after!r})")
        check("malformed request from pid" in kv.log_path.read_text(), f"kvringd logged:\n{kv.log_tail()}")
        check(kv.inspect()["instance"]["state"] == "running", "kvringd is not running after the refusal")
        pt.log(f"kvringd (protocol {v}) answered a protocol {v + 1} record: version {version}, {reason!r}")

        # 2. the package over a libkvring of the next version
        sock = kv.socket
        r = venv.run([str(venv.python), str(pt.HERE / "proto_client.py"), sock], KVRING_LIB=str(lib_next))
        check(r.returncode == 0, f"proto_client.py exited {r.returncode}:\n{r.stdout}{r.stderr}")
        got = json.loads(r.stdout.splitlines()[-1])
        check(Path(got["library"]) == lib_next, f"KVRING_LIB not used: {got['library']}")
        want = (
            f"kvringd at {sock} speaks protocol {v}, this kvring {got['version']} speaks {v + 1}: "
            "upgrade kvringd (or the kvring package) so both match"
        )
        for kind in ("scheduler", "worker"):
            e = got[kind]
            check(not e["ok"] and e["class"] == "ProtocolMismatch", f"{kind} attach: {e}")
            check(e["errno"] == errno.EPROTO, f"{kind} attach: errno {e['errno']}, want EPROTO")
            check(e["message"] == want, f"{kind} attach says {e['message']!r}\nwant {want!r}")
            check((e["kvringd_protocol"], e["protocol"]) == (v, v + 1), f"{kind} attach versions: {e}")
            check(
                f"kvringd at {sock} speaks protocol {v}, this libkvring {got['version']} speaks {v + 1}"
                in e["c_reason"],
                f"libkvring's reason: {e['c_reason']!r}",
            )
        pt.log(f"a protocol {v + 1} client: {got['scheduler']['message']}")
        pt.log(f"libkvring's reason: {got['scheduler']['c_reason']}")

        # 3. the wheel's own libkvring: both attach
        r = venv.run([str(venv.python), str(pt.HERE / "proto_client.py"), sock])
        check(r.returncode == 0, f"proto_client.py exited {r.returncode}:\n{r.stdout}{r.stderr}")
        got = json.loads(r.stdout.splitlines()[-1])
        check(Path(got["library"]).is_relative_to(venv.path), f"library {got['library']} is not the wheel's")
        check(got["scheduler"] == {"ok": True} and got["worker"] == {"ok": True}, f"same version: {got}")
    finally:
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")


if __name__ == "__main__":
    pt.run(main)
