#!/usr/bin/env bash
# ThreadSanitizer run of kvring's own programs: kvringd (with its /metrics thread), every actor and libkvring.
#
# Builds a separate tree (build-tsan: -Db_sanitize=thread -Db_lundef=false) and runs a
# process-level workload directly — Criterion's runner does not start under TSan:
#   kvringd with metrics, an L2 directory and 2 worker slots, /metrics, /status and / scraped
#   all along by curl;
#   kvring-bench --tp 2 (two libkvring rank processes: store, lookup, load, verify), with
#   --allow-misses: L1 holds under half of the workload, so a block can be evicted between
#   its lookup and its load (reported failed; what was loaded is still checked byte for byte);
#   kill -9 of the lookup and the disk actor (kvringd records the deaths and restarts them
#   while /metrics reads the actor table); the bench again; SIGTERM (drain, exit 0).
# Every program runs with TSAN_OPTIONS=halt_on_error=1:exitcode=66: the first race ends it
# with 66. The run fails on any "WARNING: ThreadSanitizer" in any output, on a program's
# exit status, or on an actor exiting with 66; the report is printed.
#
# Usage: tools/tsan.sh [--build-dir DIR] [--keep]
#   exit 0: clean; 1: a race or a failure (the logs are kept); 77: no TSan toolchain here.
# GCC does not model atomic_thread_fence under TSan (-Wtsan); the two fences are on the CUDA
# store-event path (client/requests.c submit, xfer/cuda_desc.c), which this host workload never runs.
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
bdir="$src/build-tsan"
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) bdir=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tsan.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

say() { printf 'tsan.sh: %s\n' "$*" >&2; }

# ---- build ------------------------------------------------------------------------------
# exit 77 (meson: skipped) where the tools are missing, not a failure of kvring
for cmd in meson ninja cc curl pgrep python3; do
  command -v "$cmd" >/dev/null || { say "skipped: $cmd not found"; exit 77; }
done
probe=$(mktemp /tmp/kvr-tsan-probe-XXXXXX)
if ! echo 'int main(void) { return 0; }' | cc -fsanitize=thread -x c - -o "$probe" 2>/dev/null || ! "$probe"; then
  rm -f "$probe"
  say "skipped: cc -fsanitize=thread does not build or run here (libtsan missing?)"
  exit 77
fi
rm -f "$probe"
if [ ! -f "$bdir/build.ninja" ]; then
  meson setup "$bdir" "$src" -Db_sanitize=thread -Db_lundef=false -Dcuda=disabled -Diceoryx=disabled \
    -Dc_args=-Wno-tsan >/dev/null
fi
targets=(supervisor/kvringd actors/lookup/kvring-lookup actors/loader/kvring-loader actors/storer/kvring-storer
         actors/disk/kvring-disk actors/gather/kvring-gather tools/bench/kvring-bench)
ninja -C "$bdir" "${targets[@]}" >/dev/null

# ---- run ----------------------------------------------------------------------------------
tmp=$(mktemp -d /tmp/kvr-tsan-XXXXXX)
kpid="" spid=""
cleanup() {
  [ -n "$spid" ] && kill "$spid" 2>/dev/null || true
  [ -n "$kpid" ] && kill -9 "$kpid" 2>/dev/null || true
  if [ "$keep" = 1 ]; then say "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
metrics="http://127.0.0.1:$port/metrics"
mkdir -p "$tmp/l2"
cat >"$tmp/kvring.json" <<EOF
{
  "instance": {"socket": "$tmp/kvring.sock", "max_workers": 2, "log_level": "info"},
  "supervisor": {"health_interval_ms": 1000, "stable_after_ms": 100, "restart_backoff_initial_ms": 10,
                 "ready_timeout_ms": 30000, "drain_timeout_ms": 30000},
  "model": {"preset": "qwen3-8b", "block_tokens": 16, "tp_size": 2},
  "l1": {"capacity_bytes": "256MiB", "huge_pages": false},
  "l2": {"dirs": ["$tmp/l2"], "capacity_bytes": "1GiB", "durability": "none"},
  "metrics": {"enabled": true, "listen": "127.0.0.1:$port"}
}
EOF

export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
t_start=$SECONDS

report() { # print every TSan report and what else failed; exit 1
  say "FAILED: $*"
  for f in "$tmp"/*.log; do
    if grep -q "ThreadSanitizer" "$f"; then
      say "--- $(basename "$f")"
      sed -n '/WARNING: ThreadSanitizer/,/^=\{10,\}$/p' "$f" >&2
    fi
  done
  for f in "$tmp"/bench*.log; do
    [ -s "$f" ] && { say "--- $(basename "$f") (last 15 lines)"; tail -n 15 "$f" >&2; }
  done
  say "--- kvringd.log (last 30 lines)"; tail -n 30 "$tmp/kvringd.log" >&2 || true
  say "FAILED: $* (logs: $tmp)"
  keep=1
  exit 1
}

# wait_metric REGEX SECONDS: until a scrape matches
wait_metric() {
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    curl -sf "$metrics" 2>/dev/null | grep -Eq "$1" && return 0
    kill -0 "$kpid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

"$bdir/supervisor/kvringd" --config "$tmp/kvring.json" >"$tmp/kvringd.log" 2>&1 &
kpid=$!
wait_metric '^kvring_actor_up\{actor="lookup"\} 1' 60 || report "kvringd did not come up"
wait_metric '^kvring_actor_up\{actor="disk.0"\} 1' 60 || report "the disk actor did not come up"

# the scraper: the metrics thread reads the actor table while the main loop writes it
# /metrics, /status and the status page: the three readers of the listener's snapshot (the
# engine table kvringd's main loop copies to it under the /metrics lock)
( while [ ! -e "$tmp/stop" ]; do
    for page in metrics status ""; do curl -sf -o /dev/null "http://127.0.0.1:$port/$page" || true; done
    sleep 0.01
  done ) &
spid=$!

bench() { # bench NAME: one kvring-bench run against the instance
  "$bdir/tools/bench/kvring-bench" --socket "$tmp/kvring.sock" --model qwen3-8b --tp 2 --block-tokens 16 \
    --prompts 8 --input-len 512 --prefix-len 256 --concurrency 2 --timeout-ms 60000 --no-plot --quiet --allow-misses \
    >"$tmp/$1.log" 2>&1 || report "kvring-bench ($1) exited $?"
}
bench bench1

# deaths and restarts while /metrics is being scraped
for actor in lookup disk; do
  pid=$(pgrep -P "$kpid" -x "kvring-$actor" | head -n 1) || report "no kvring-$actor child of kvringd"
  kill -9 "$pid"
done
wait_metric '^kvring_actor_restarts_total\{actor="lookup"\} [1-9]' 60 || report "lookup not restarted"
wait_metric '^kvring_actor_up\{actor="lookup"\} 1' 60 || report "lookup not back"
wait_metric '^kvring_actor_restarts_total\{actor="disk\.0"\} [1-9]' 60 || report "disk.0 not restarted"
wait_metric '^kvring_actor_up\{actor="disk\.0"\} 1' 60 || report "disk.0 not back"
bench bench2

kill -TERM "$kpid"
set +e
wait "$kpid"
krc=$?
set -e
kpid=""
touch "$tmp/stop"
wait "$spid" 2>/dev/null || true
spid=""

grep -q "ThreadSanitizer" "$tmp"/*.log && report "ThreadSanitizer reported a problem"
grep -q "exited with code 66" "$tmp/kvringd.log" && report "an actor exited 66 (TSan)"
[ "$krc" = 0 ] || report "kvringd exited $krc after SIGTERM"
say "clean: kvringd, $(grep -c ' started (pid' "$tmp/kvringd.log") actor starts, 2 bench runs (tp 2), $(grep -c 'restarting' "$tmp/kvringd.log") restarts under /metrics scrapes, in $((SECONDS - t_start)) s"
