#!/usr/bin/env bash
# The README's main job: build kvring, run kvringd on its default config, store and load a workload through it, stop it.
#
#   ./tools/demo.sh            (fresh Debian 12 clone, as root or with sudo; nothing by hand)
#
# Steps: install the Debian packages (tools/install-deps.sh), meson setup build (if missing) and
# ninja, start build/supervisor/kvringd on its embedded default config in the background, show
# kvring-inspect of the running instance, run kvring-bench against it with a workload that fits
# the default L1 with room (a cold phase stores every prompt, a warm phase loads them back and
# checks every byte, both measured against memcpy), show kvring-inspect again, then SIGTERM
# kvringd and require exit status 0. Exits non-zero when any step fails. The bench's results
# stay in $BUILD/bench/: bench-l1.json and bench-l1.png (latency CDFs and throughput against
# memcpy, drawn with gnuplot).
set -euo pipefail

cd "$(dirname "$(readlink -f "$0")")/.."
BUILD=${BUILD:-build}

say() { printf '\n==> %s\n' "$*"; }

say "dependencies (tools/install-deps.sh)"
./tools/install-deps.sh

say "build ($BUILD)"
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD"
ninja -C "$BUILD"

KVRINGD=$BUILD/supervisor/kvringd
INSPECT=$BUILD/tools/inspect/kvring-inspect
BENCH=$BUILD/tools/bench/kvring-bench
for f in "$KVRINGD" "$INSPECT" "$BENCH"; do
  [ -x "$f" ] || { echo "demo: $f was not built" >&2; exit 1; }
done

WORK=$(mktemp -d "/tmp/kvring-demo.$$.XXXXXX")
KVRINGD_PID=""
cleanup() {
  if [ -n "$KVRINGD_PID" ] && kill -0 "$KVRINGD_PID" 2>/dev/null; then
    kill -TERM "$KVRINGD_PID" 2>/dev/null || true
    wait "$KVRINGD_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

say "the embedded default configuration (kvringd --check-config on {})"
echo '{}' > "$WORK/empty.json"
"$KVRINGD" --check-config "$WORK/empty.json" > "$WORK/effective.json"
# The default binds no model: kvringd lays L1 out for the first worker that attaches, here
# kvring-bench's qwen3-8b at TP 1 with 128-token blocks (the engine's geometry, not the config's).
read -r SOCKET L1_BYTES < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(c["instance"]["socket"], c["l1"]["capacity_bytes"])' "$WORK/effective.json")
PRESET=qwen3-8b BLOCK_TOKENS=128 TP=1
echo "socket $SOCKET, no model section: the bench's $PRESET, tp $TP, $BLOCK_TOKENS-token blocks, L1 $L1_BYTES bytes"

# The workload: prompts of 8 blocks sharing a 4-block prefix; as many prompts (1..8) as keep the
# distinct blocks + 25% within 60% of L1, so every block stays resident and the warm phase must
# hit 100%.
INPUT_LEN=$((8 * BLOCK_TOKENS))
PREFIX_LEN=$((4 * BLOCK_TOKENS))
WORKLOAD=(--model "$PRESET" --tp "$TP" --block-tokens "$BLOCK_TOKENS" --input-len "$INPUT_LEN"
          --prefix-len "$PREFIX_LEN" --concurrency 2)
"$BENCH" "${WORKLOAD[@]}" --prompts 1 --dry-run --quiet --json "$WORK/plan.json"
PROMPTS=$(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["plan"]
cap, blk = int(sys.argv[2]), p["block_bytes"]
shared, own = p["prefix_blocks"], p["full_blocks_per_prompt"] - p["prefix_blocks"]
n = int((cap * 0.6 / 1.25 / blk - shared) // own)
print(max(0, min(8, n)))' "$WORK/plan.json" "$L1_BYTES")
if [ "$PROMPTS" -lt 1 ]; then
  echo "demo: the default L1 ($L1_BYTES bytes) cannot hold one $INPUT_LEN-token prompt of $PRESET" >&2
  exit 1
fi

say "start kvringd (default config) in the background"
if [ -S "$SOCKET" ] && python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' \
     "$SOCKET" 2>/dev/null; then
  echo "demo: another kvringd already serves $SOCKET; stop it first" >&2
  exit 1
fi
"$KVRINGD" > "$WORK/kvringd.log" 2>&1 &
KVRINGD_PID=$!
for _ in $(seq 200); do
  [ -S "$SOCKET" ] && break
  if ! kill -0 "$KVRINGD_PID" 2>/dev/null; then
    echo "demo: kvringd exited during start-up:" >&2
    cat "$WORK/kvringd.log" >&2
    exit 1
  fi
  sleep 0.05
done
[ -S "$SOCKET" ] || { echo "demo: kvringd did not create $SOCKET within 10 s" >&2; cat "$WORK/kvringd.log" >&2; exit 1; }
echo "kvringd pid $KVRINGD_PID, socket $SOCKET"

say "kvring-inspect (before)"
"$INSPECT" --socket "$SOCKET"

say "kvring-bench: $PROMPTS prompts x $INPUT_LEN tokens, shared prefix $PREFIX_LEN"
RESULTS=$BUILD/bench
mkdir -p "$RESULTS"
rm -f "$RESULTS/bench-l1.json" "$RESULTS/bench-l1.png"
BENCH_RC=0
"$BENCH" --socket "$SOCKET" "${WORKLOAD[@]}" --prompts "$PROMPTS" --json "$RESULTS/bench-l1.json" \
  --plot "$RESULTS/bench-l1.png" || BENCH_RC=$?

say "kvring-inspect (after)"
"$INSPECT" --socket "$SOCKET" || true

say "stop kvringd (SIGTERM)"
kill -TERM "$KVRINGD_PID"
KVRINGD_RC=0
wait "$KVRINGD_PID" || KVRINGD_RC=$?
KVRINGD_PID=""
echo "kvringd exited with status $KVRINGD_RC"
if [ "$KVRINGD_RC" -ne 0 ]; then
  echo "demo: kvringd log:" >&2
  tail -n 40 "$WORK/kvringd.log" >&2
fi

echo
[ -f "$RESULTS/bench-l1.json" ] && echo "results: $RESULTS/bench-l1.json"
[ -f "$RESULTS/bench-l1.png" ] && echo "plot:    $RESULTS/bench-l1.png"

if [ "$BENCH_RC" -ne 0 ] || [ "$KVRINGD_RC" -ne 0 ]; then
  echo "demo: FAILED (kvring-bench exit $BENCH_RC, kvringd exit $KVRINGD_RC)" >&2
  exit 1
fi
echo
echo "demo: OK — every loaded block matched byte for byte; kvringd drained and exited 0"
