#!/usr/bin/env bash
# tools/gpu-check.sh: the GPU checks of the CUDA transfer backend, on a machine with a GPU:
# build with -Dcuda=enabled, run the meson suite "gpu", run gpu_bench (pinned cudaMemcpy
# peak vs kvring's arena <-> KV copies, same sizes, same run; one 10,000-token GLM-4-9B
# prompt at TP 1), print a table. About 2-4 minutes on one H200 (ceiling 8). Exit 0 when
# everything passed, 1 when a step failed, 2 when there is no usable GPU (said clearly).
#
#   tools/gpu-check.sh                 build dir build-gpu
#   BUILD=build-x tools/gpu-check.sh   another build dir
#   REPS=20 tools/gpu-check.sh         bench repetitions (default 10)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUILD=${BUILD:-build-gpu}
REPS=${REPS:-10}
LOG=${LOG:-$BUILD/gpu-check.log}
export KVR_BUILD_ROOT="$PWD/$BUILD"
t_start=$(date +%s)
declare -a rows=()

say() { printf 'gpu-check: %s\n' "$*"; }
die() { say "FAIL: $1"; exit "${2:-1}"; }
row() { rows+=("$(printf '%-34s %-6s %6ss  %s' "$1" "$2" "$3" "${4:-}")"); }
table() {
	printf '\n%-34s %-6s %7s  %s\n' "step" "result" "time" "detail"
	printf '%s\n' "${rows[@]}"
	printf 'total %ss\n' "$(($(date +%s) - t_start))"
}

# ---- preflight: the toolkit and a GPU ------------------------------------------------------
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] ||
	die "nvcc not found (install the CUDA Toolkit or put /usr/local/cuda/bin on PATH)"
if command -v nvidia-smi >/dev/null 2>&1; then
	gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
	say "GPU: ${gpu}"
else
	say "nvidia-smi not found: relying on the CUDA runtime's device count"
fi

# ---- build -----------------------------------------------------------------------------------
t=$(date +%s)
if [ -f "$BUILD/build.ninja" ]; then
	meson setup --reconfigure "$BUILD" -Dcuda=enabled >/dev/null || die "meson setup $BUILD -Dcuda=enabled failed"
else
	meson setup "$BUILD" -Dcuda=enabled >/dev/null || die "meson setup $BUILD -Dcuda=enabled failed"
fi
mkdir -p "$(dirname "$LOG")"
: >"$LOG"
if ! timeout 300 ninja -C "$BUILD" >>"$LOG" 2>&1; then
	tail -30 "$LOG"
	die "build failed (log: $LOG)"
fi
row "build (-Dcuda=enabled)" ok "$(($(date +%s) - t))" "$BUILD"

# ---- a GPU must be there: no GPU is a clear failure here, not a skip ------------------------
probe=$("$BUILD/tests/gpu/gpu_worker" --probe 2>&1)
case $? in
0) say "CUDA: ${probe}" ;;
77)
	row "GPU probe" FAIL 0 "$probe"
	table
	die "no usable GPU (${probe}): the GPU checks need one; nothing was tested" 2
	;;
*) die "gpu_worker --probe failed: ${probe}" ;;
esac

# ---- the gpu suite ------------------------------------------------------------------------
t=$(date +%s)
timeout 360 meson test -C "$BUILD" --suite gpu --print-errorlogs --num-processes 1 >>"$LOG" 2>&1
rc=$?
read -r n_ok n_fail n_skip < <(python3 - "$BUILD/meson-logs/testlog.json" <<'PY'
import json, sys
ok = fail = skip = 0
try:
    for line in open(sys.argv[1]):
        r = json.loads(line).get("result")
        if r == "OK": ok += 1
        elif r == "SKIP": skip += 1
        else: fail += 1
except OSError:
    fail = 1
print(ok, fail, skip)
PY
)
if [ "$rc" -eq 0 ] && [ "$n_fail" -eq 0 ] && [ "$n_skip" -eq 0 ]; then
	row "meson test --suite gpu" ok "$(($(date +%s) - t))" "$n_ok passed"
	suite_ok=1
else
	# with a GPU present a skip is a failure too
	row "meson test --suite gpu" FAIL "$(($(date +%s) - t))" \
		"$n_ok passed, $n_fail failed, $n_skip skipped (log: $LOG)"
	grep -E '^\[(FAIL|----)\]|Assertion|Synthesis|gpu_worker op' "$LOG" | tail -40
	suite_ok=0
fi

# ---- the bandwidth bench --------------------------------------------------------------------
t=$(date +%s)
bench_out=$(timeout 240 "$BUILD/tests/gpu/gpu_bench" --reps "$REPS" --tokens 10000 --preset glm-4-9b-chat-1m \
	--tp 1 --block 128 2>&1)
brc=$?
printf '%s\n' "$bench_out" | tee -a "$LOG"
if [ "$brc" -eq 0 ]; then
	row "gpu_bench" ok "$(($(date +%s) - t))" "tables above"
	bench_ok=1
else
	row "gpu_bench" FAIL "$(($(date +%s) - t))" "exit $brc (log: $LOG)"
	bench_ok=0
fi

# ---- arena registration at scale (issue 26: chunked cudaHostRegister) ---------------------------
# the largest arena this host can pin beside everything else: half its memory, at most 256 GiB
mem_gib=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
reg_gib=$((mem_gib / 2 > 256 ? 256 : mem_gib / 2))
t=$(date +%s)
reg_out=$(KVR_CUDA_REG_CHUNK_GIB=16 timeout 240 "$BUILD/tests/gpu/gpu_bench" --reps 1 --tokens 1024 \
	--preset glm-4-9b-chat-1m --tp 1 --block 128 --reg-gib "$reg_gib" 2>&1)
rrc=$?
printf '%s\n' "$reg_out" | grep -E 'arena registration|FAIL|gpu_bench:' | tee -a "$LOG"
if [ "$rrc" -eq 0 ]; then
	row "arena registration ${reg_gib} GiB" ok "$(($(date +%s) - t))" "$(printf '%s\n' "$reg_out" | grep -o '[0-9.]* ms (.*' | head -1)"
else
	row "arena registration ${reg_gib} GiB" FAIL "$(($(date +%s) - t))" "exit $rrc (log: $LOG)"
	bench_ok=0
fi

table
if [ "$suite_ok" -ne 1 ] || [ "$bench_ok" -ne 1 ]; then
	die "see the table above"
fi
say "all GPU checks passed"
