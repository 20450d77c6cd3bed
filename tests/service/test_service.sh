#!/bin/sh
# shellcheck disable=SC2154 # bindir, cfg_socket, ...: assigned by the evals of python3's output below
# The installed service (issue 27, docs/service.md): meson install the build into a temporary
# DESTDIR; check the layout (kvringd, every actor, kvring-inspect, libkvring, the headers,
# kvring.service, the default config and environment file) and the unit (systemd-analyze
# verify where there is one, and what the unit must say); `kvringd --check-config` on the
# installed default config; then start the unit's own ExecStart= as systemd would expand it,
# wait until the socket answers (kvring-inspect from the install, and a scheduler attach
# through the Python binding over the installed libkvring, with the socket the connector
# resolves), SIGTERM it and check exit 0, no socket and no actor left.
#
# What differs from systemd, and why: the paths are under DESTDIR (the executable, the
# environment file, instance.actor_dir so the installed actors run); the test's config is
# the installed one with instance.socket moved from /run/kvring (RuntimeDirectory=) into a
# temporary directory made as systemd makes it, metrics.listen on a free port (9464 may be
# taken on a shared machine) and l1.prefault "off" (the arena is sparse: nothing is faulted
# in). It reaches kvringd through the unit's EnvironmentFile, as an operator's would.
# Needs KVR_BUILD_ROOT and KVR_SOURCE_ROOT (tests/meson.build sets them). Exit 0 pass, 1 fail.
set -eu

t0=$(date +%s)
say() { printf 'test_service: [%s s] %s\n' "$(($(date +%s) - t0))" "$*" >&2; }
fail() {
	say "FAIL: $*"
	[ -s "${log:-/nonexistent}" ] && { say "kvringd's log:"; cat "$log" >&2; }
	exit 1
}

command -v python3 >/dev/null 2>&1 || { say "SKIP: no python3"; exit 77; }
build=${KVR_BUILD_ROOT:?}
src=${KVR_SOURCE_ROOT:?}
here=$src/tests/service
tmp=$(mktemp -d /tmp/kvr-service-XXXXXX)
pid=
log=
npid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	[ -z "$npid" ] || kill "$npid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# ---- install ----------------------------------------------------------------------------
dest=$tmp/root
DESTDIR=$dest meson install -C "$build" --no-rebuild >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log" >&2; fail "meson install failed"; }

# the configured directories, absolute (meson allows either form)
eval "$(meson introspect --buildoptions "$build" | python3 -c '
import json, os, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
p = o["prefix"]
for k in ("bindir", "libexecdir", "libdir", "includedir", "sysconfdir"):
    print(f"{k}={os.path.join(p, o[k])}")
u = o.get("systemdunitdir", "")
print("unitdir=" + (u if u else os.path.join(p, "lib/systemd/system")))
')"
say "prefix dirs: bindir=$bindir libexecdir=$libexecdir sysconfdir=$sysconfdir unitdir=$unitdir"

# ---- the layout -------------------------------------------------------------------------
must_exec() { if [ ! -f "$dest$1" ] || [ ! -x "$dest$1" ]; then fail "$1 is not installed (or not executable)"; fi; }
must_file() { [ -f "$dest$1" ] || fail "$1 is not installed"; }
must_exec "$bindir/kvringd"
must_exec "$bindir/kvring-inspect"
# every actor kind kvringd starts (supervisor/actors.c, sup_find_executables)
for k in lookup loader storer disk gather remote; do
	must_exec "$libexecdir/kvring/kvring-$k"
done
must_file "$libdir/libkvring.so.0"
for h in kvring.h kvr_geometry.h; do
	must_file "$includedir/kvring/$h"
done
# the internal headers stay in the tree (tests/client/test_install.sh checks the full list)
for h in msg.h kvr_keys.h; do
	[ ! -e "$dest$includedir/kvring/$h" ] || fail "$includedir/kvring/$h is installed: it is not libkvring's API"
done
unit=$dest$unitdir/kvring.service
must_file "$sysconfdir/kvring/kvringd.json"
must_file "$sysconfdir/default/kvring"
[ "$unitdir" != no ] || { say "SKIP: built with -Dsystemdunitdir=no: no unit to check"; exit 77; }
must_file "$unitdir/kvring.service"

# ---- the default config -----------------------------------------------------------------
"$dest$bindir/kvringd" --check-config "$dest$sysconfdir/kvring/kvringd.json" >"$tmp/effective.json" 2>"$tmp/check.err" ||
	{ cat "$tmp/check.err" >&2; fail "kvringd --check-config refuses the installed default config"; }
eval "$(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print("cfg_socket=" + c["instance"]["socket"])
print("cfg_mode=" + str(c["instance"]["socket_mode"]))
print("cfg_drain_ms=" + str(c["supervisor"]["drain_timeout_ms"]))
print("cfg_metrics=" + ("on" if c["metrics"]["enabled"] else "off") + "," + c["metrics"]["listen"])
print("cfg_l2=" + str(len(c["l2"]["dirs"])))
print("cfg_no_model=" + ("yes" if c["model"]["preset"] == "" and c["model"]["layers"] == 0 else "no"))
' "$tmp/effective.json")"
[ "$cfg_socket" = /run/kvring/kvring.sock ] || fail "the default config's socket is $cfg_socket, not /run/kvring/kvring.sock"
[ "$cfg_metrics" = on,127.0.0.1:9464 ] || fail "the default config's metrics: $cfg_metrics, want on,127.0.0.1:9464"
[ "$cfg_l2" = 0 ] || fail "the default config has $cfg_l2 L2 dirs, want an L1-only instance"
[ "$cfg_no_model" = yes ] || fail "the default config names a model: it must serve whatever model attaches first"
grep -q "no model section" "$tmp/check.err" || fail "--check-config does not say the default config has no model"
say "default config: socket $cfg_socket (mode $cfg_mode), drain $cfg_drain_ms ms, metrics $cfg_metrics, L1 only"

# ---- the unit ---------------------------------------------------------------------------
eval "$(python3 "$here/unit.py" shell "$unit" Type KillSignal KillMode Restart RuntimeDirectory \
	RuntimeDirectoryMode TimeoutStopSec LimitMEMLOCK User ExecStart)"
if command -v systemd-analyze >/dev/null 2>&1; then
	# verify a copy whose install paths point into the DESTDIR (it checks that the executable
	# exists); it exits 0 on unknown keys and bad values but prints them: any output fails
	sed "s|$bindir/|$dest$bindir/|g; s|$sysconfdir/|$dest$sysconfdir/|g" "$unit" >"$tmp/kvring.service"
	systemd-analyze verify --man=no "$tmp/kvring.service" >"$tmp/verify.log" 2>&1 ||
		{ cat "$tmp/verify.log" >&2; fail "systemd-analyze verify failed"; }
	[ ! -s "$tmp/verify.log" ] || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify complains"; }
	say "systemd-analyze verify: clean"
else
	say "no systemd-analyze here: the unit is only parsed"
fi
type=$unit_Type
case "$type" in
simple | exec) ;;
notify) grep -q NOTIFY_SOCKET "$dest$bindir/kvringd" || fail "Type=notify, but kvringd never reads NOTIFY_SOCKET" ;;
*) fail "Type=$type" ;;
esac
[ "$unit_KillSignal" = SIGTERM ] || fail "KillSignal=$unit_KillSignal, want SIGTERM (kvringd drains on it)"
[ "$unit_KillMode" = mixed ] || fail "KillMode=$unit_KillMode, want mixed (SIGTERM to kvringd alone: it stops its actors)"
[ "$unit_Restart" = on-failure ] || fail "Restart=$unit_Restart, want on-failure"
rundir=$unit_RuntimeDirectory
[ "/run/$rundir" = "$(dirname "$cfg_socket")" ] ||
	fail "RuntimeDirectory=$rundir, but the default config's socket is $cfg_socket"
stop_s=$unit_TimeoutStopSec
case "$stop_s" in *[!0-9]* | '') fail "TimeoutStopSec=$stop_s: want plain seconds" ;; esac
# the drain, then the actors' STOP -> SIGTERM (2 s) -> SIGKILL (5 s) deadline
[ "$stop_s" -ge $((cfg_drain_ms / 1000 + 5)) ] ||
	fail "TimeoutStopSec=$stop_s does not cover drain_timeout_ms $cfg_drain_ms + 5 s"
[ "$unit_LimitMEMLOCK" = infinity ] || fail "LimitMEMLOCK=$unit_LimitMEMLOCK, want infinity"
say "unit: Type=$type, KillMode=mixed, TimeoutStopSec=$stop_s, RuntimeDirectory=$rundir, User=$unit_User"

# ---- start the unit's command -----------------------------------------------------------
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run=$tmp/run/$rundir # what systemd makes of RuntimeDirectory=, mode RuntimeDirectoryMode=
mkdir -p "$run"
chmod "${unit_RuntimeDirectoryMode:-0755}" "$run" # systemd's default is 0755
python3 "$here/unit.py" config "$dest$sysconfdir/kvring/kvringd.json" "$tmp/kvringd.json" "$run" \
	"$dest$libexecdir/kvring" "$port" || fail "cannot write the test config"
echo "KVRINGD_CONFIG=$tmp/kvringd.json" >>"$dest$sysconfdir/default/kvring"
sock=$run/$(basename "$cfg_socket")

python3 "$here/unit.py" execstart "$unit" "$dest" >"$tmp/argv" || fail "cannot read ExecStart="
say "ExecStart: $unit_ExecStart"
set --
while IFS= read -r a; do set -- "$@" "$a"; done <"$tmp/argv"
say "runs: $*"
[ "$1" = "$dest$bindir/kvringd" ] || fail "ExecStart runs $1, not the installed kvringd"
log=$tmp/kvringd.log
notify=
if [ "$type" = notify ]; then
	# systemd's side of sd_notify: a datagram socket in NOTIFY_SOCKET, every message logged
	notify=$tmp/notify.sock
	python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
open(sys.argv[2], "w").close()
while True:
    with open(sys.argv[2], "ab") as f:
        f.write(s.recv(4096) + b"\n")
' "$notify" "$tmp/notify.log" &
	npid=$!
	until [ -e "$tmp/notify.log" ]; do sleep 0.02; done
fi
# wait_notify LINE S: the listener wrote LINE down within S seconds, or fail (kvringd sends
# before the event the caller saw; the listener may still be writing it down)
wait_notify() {
	local deadline=$(($(date +%s) + $2))
	until grep -qx "$1" "$tmp/notify.log"; do
		[ "$(date +%s)" -lt "$deadline" ] || fail "$3 ($(cat "$tmp/notify.log"))"
		sleep 0.02
	done
}
NOTIFY_SOCKET=$notify "$@" 2>"$log" &
pid=$!

# exited: a zombie child (state Z) or gone
exited() { ! [ -e "/proc/$1" ] || [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" = Z ]; }
inspect() { "$dest$bindir/kvring-inspect" --socket "$sock" --json; }
# prints the instance's state; exit 0 once it serves attaches (no model: no L1 and no actor
# before the first worker, the lookup actor not started yet)
instance_running() {
	python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(j["instance"]["state"])
sys.exit(0 if j["instance"]["state"] == "running" and j["l1_slots"] is None and
         all(a["state"] == "idle" for a in j["actors"]) else 1)
' "$tmp/inspect.json"
}
deadline=$(($(date +%s) + 20))
until [ -S "$sock" ] && inspect >"$tmp/inspect.json" 2>"$tmp/inspect.err" && state=$(instance_running); do
	exited "$pid" && fail "kvringd exited before its socket answered"
	[ "$(date +%s)" -lt "$deadline" ] || { cat "$tmp/inspect.err" >&2; fail "$sock did not answer within 20 s"; }
	sleep 0.05
done
say "$sock answers kvring-inspect (instance $state, L1 not laid out: no model section)"
if [ -n "$notify" ]; then
	# READY=1 is sent once the instance serves attaches, before or as the socket answered
	wait_notify READY=1 5 "Type=notify, but kvringd sent no READY=1"
	for a in $(cat "/proc/$pid/task/$pid/children"); do
		! tr '\0' '\n' <"/proc/$a/environ" | grep -q '^NOTIFY_SOCKET=' || fail "actor pid $a inherited NOTIFY_SOCKET"
	done
	say "sd_notify: READY=1 received; no actor inherited NOTIFY_SOCKET"
fi
[ "$(stat -c %a "$sock")" = "$(printf %o "$cfg_mode")" ] || [ "$(stat -c %a "$sock")" = "${cfg_mode#0}" ] ||
	fail "the socket's mode is $(stat -c %a "$sock"), the config says $cfg_mode"

# a worker attaches (the tiny model's kv-fused geometry, 32-token blocks): L1 is laid out for
# it and the actors start; then a scheduler of its engine attaches as the connector would:
# the socket from the connector's resolution ($KVRING_SOCKET here), libkvring from the install
# a sanitizer build's libkvring needs its runtimes loaded first into python3 (whose own
# allocations are not ours to leak-check): preload what the library links
preload=""
for n in $(readelf -d "$dest$libdir/libkvring.so.0" | sed -n 's/.*Shared library: \[\(lib\(asan\|ubsan\)\.[^]]*\)\].*/\1/p'); do
	preload="$preload $(cc -print-file-name="$n")"
done
LD_PRELOAD=${preload# } ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 \
KVRING_SOCKET=$sock KVRING_LIB=$dest$libdir/libkvring.so.0 PYTHONPATH=$src/client/python \
	python3 - "$src/client/python/kvring/vllm/config.py" "$pid" "$dest$libexecdir/kvring/" <<'PY' ||
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("kvr_vllm_config", sys.argv[1])
cfg = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = cfg  # config.py alone: kvring.vllm would import vLLM
spec.loader.exec_module(cfg)
c = cfg.parse({})
assert c.socket == os.environ["KVRING_SOCKET"] and c.socket_from == "$KVRING_SOCKET", c
import kvring
assert kvring.library_path() == os.environ["KVRING_LIB"], kvring.library_path()
LAYERS, HEADS, HEAD_DIM, DT, BLOCK, NB = 2, 2, 64, 4, 32, 8
PAGE = 2 * BLOCK * HEADS * HEAD_DIM * DT
regions = [kvring.RegionSpec(offset=la * NB * PAGE, stride=PAGE, page_bytes=PAGE) for la in range(LAYERS)]
geom = kvring.build_geometry(layers=LAYERS, kv_heads=HEADS, head_dim=HEAD_DIM, dtype_bytes=DT, block_tokens=BLOCK,
                             num_blocks=NB, regions=regions)
fd = os.memfd_create("kvring-service-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
os.ftruncate(fd, LAYERS * NB * PAGE)
with kvring.Worker(geom, fd, LAYERS * NB * PAGE, socket=c.socket, engine_id="service-test",
                   model_ns="service-test/tiny") as w:
    # the actors kvringd started for it are the installed ones
    kids = open(f"/proc/{sys.argv[2]}/task/{sys.argv[2]}/children").read().split()
    assert kids, "kvringd started no actor for the first worker"
    for a in kids:
        exe = os.readlink(f"/proc/{a}/exe")
        assert exe.startswith(sys.argv[3]), f"actor pid {a} runs {exe}, not an installed actor"
    with kvring.Scheduler(socket=c.socket, engine_id="service-test", model_ns="service-test/tiny") as s:
        bt = s.block_tokens
assert bt == BLOCK, bt
print(f"test_service: a worker and a scheduler attached at {c.socket} ({c.socket_from}), L1 laid out for "
      f"{bt}-token blocks, {len(kids)} installed actors", file=sys.stderr)
PY
	fail "worker and scheduler attach failed"

# metrics are on, where the config says
python3 -c '
import sys, urllib.request
sys.exit(0 if b"kvring_" in urllib.request.urlopen(sys.argv[1], timeout=5).read() else 1)
' "http://127.0.0.1:$port/metrics" || fail "/metrics on 127.0.0.1:$port does not answer"

# ---- stop = drain -----------------------------------------------------------------------
actors=$(cat "/proc/$pid/task/$pid/children") # the lookup actor, at least: L1 is laid out
[ -n "$actors" ] || fail "kvringd has no child process after a worker attached"
kill -TERM "$pid"
deadline=$(($(date +%s) + stop_s))
until exited "$pid"; do
	[ "$(date +%s)" -lt "$deadline" ] || fail "kvringd did not exit within TimeoutStopSec=$stop_s after SIGTERM"
	sleep 0.05
done
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "kvringd exited $rc after SIGTERM, want 0"
[ ! -e "$sock" ] || fail "$sock is still there after kvringd exited"
for a in $actors; do
	[ ! -e "/proc/$a" ] || fail "actor pid $a outlived kvringd"
done
grep -q 'draining' "$log" || fail "kvringd did not log its drain"
[ -z "$notify" ] || wait_notify STOPPING=1 10 "kvringd drained without STOPPING=1" # sent before it exited
say "ok: SIGTERM drained, exit 0, socket removed, no actor left"
