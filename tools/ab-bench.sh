#!/usr/bin/env bash
# Compare two revisions of kvring on the L1 data path, alternated in one session:
#
#   tools/ab-bench.sh [options] REV_A REV_B
#
# Builds each revision (git worktrees under build/ab/, the binaries kvring-bench --spawn
# runs), then runs kvring-bench --spawn on the same workload ROUNDS times, A and B
# alternated (A B A B ...), and prints every run, the medians, and B's medians as ratios of
# A's. This machine is noisy: a ratio only means something measured like this, side by
# side in one run. REV may be any git revision; "WORKTREE" is the working tree as it is
# (its build/ directory, built first).
#
# Options:
#   --rounds N        runs of each revision (default 3)
#   --workload W      demo: the demo's (qwen3-8b, 5 prompts x 1024 tokens, prefix 512);
#                     long: 2 prompts x 10,000 tokens, prefix 5,000 (default demo)
#   --hugepages N     reserve N 2 MiB huge pages (vm.nr_hugepages) for the run and give
#                     them back after (root); 0 = as the machine is (default)
#   --bench-args "…"  more kvring-bench arguments for both
#
# Prints per run: store GB/s (and kvring/memcpy), warm load time in ms (and kvring/memcpy).
# Exit status 0 when every run passed (kvring-bench exit 0), 1 otherwise, 2 bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ROUNDS=3
WORKLOAD=demo
HUGEPAGES=0
EXTRA=""
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=$2; shift 2 ;;
	--workload) WORKLOAD=$2; shift 2 ;;
	--hugepages) HUGEPAGES=$2; shift 2 ;;
	--bench-args) EXTRA=$2; shift 2 ;;
	-h|--help) sed -n '2,24p' "$0"; exit 0 ;;
	--*) echo "ab-bench: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -eq 2 ] || { echo "usage: tools/ab-bench.sh [options] REV_A REV_B (--help)" >&2; exit 2; }
case "$WORKLOAD" in
demo) WL=(--prompts 5 --input-len 1024 --prefix-len 512) ;;
long) WL=(--prompts 2 --input-len 10000 --prefix-len 5000) ;;
*) echo "ab-bench: --workload demo or long, not '$WORKLOAD'" >&2; exit 2 ;;
esac

TARGETS=(supervisor/kvringd tools/bench/kvring-bench actors/lookup/kvring-lookup actors/loader/kvring-loader
	actors/storer/kvring-storer actors/disk/kvring-disk actors/gather/kvring-gather
	actors/remote/kvring-remote)

# build REV -> prints the kvring-bench path
build_rev() {
	local rev=$1 dir
	if [ "$rev" = WORKTREE ]; then
		dir=$ROOT
		[ -f "$dir/build/build.ninja" ] || meson setup "$dir/build" >/dev/null || return 1
	else
		local sha
		sha=$(git rev-parse --short=12 "$rev^{commit}") || return 1
		dir=$ROOT/build/ab/$sha
		if [ ! -d "$dir" ]; then
			git worktree add --detach -f "$dir" "$sha" >/dev/null 2>&1 || return 1
		fi
		[ -f "$dir/build/build.ninja" ] || meson setup "$dir/build" >/dev/null || return 1
	fi
	ninja -C "$dir/build" "${TARGETS[@]}" >/dev/null || { ninja -C "$dir/build" "${TARGETS[@]}" | tail -20 >&2; return 1; }
	echo "$dir/build/tools/bench/kvring-bench"
}

A=$(build_rev "$1") || { echo "ab-bench: cannot build $1" >&2; exit 1; }
B=$(build_rev "$2") || { echo "ab-bench: cannot build $2" >&2; exit 1; }

OLD_HP=""
if [ "$HUGEPAGES" -gt 0 ]; then
	OLD_HP=$(cat /proc/sys/vm/nr_hugepages)
	echo "$HUGEPAGES" > /proc/sys/vm/nr_hugepages || { echo "ab-bench: cannot reserve huge pages" >&2; exit 1; }
	echo "huge pages: $(cat /proc/sys/vm/nr_hugepages) of 2 MiB reserved (asked $HUGEPAGES)"
fi
restore() { [ -n "$OLD_HP" ] && echo "$OLD_HP" > /proc/sys/vm/nr_hugepages; }
trap restore EXIT

OUT=$(mktemp -d /tmp/kvring-ab.XXXXXX)
echo "A = $1 ($A)"
echo "B = $2 ($B)"
echo "workload: ${WL[*]} $EXTRA; $ROUNDS rounds, A and B alternated"
fail=0
for i in $(seq "$ROUNDS"); do
	for who in A B; do
		bin=$A
		[ $who = B ] && bin=$B
		# shellcheck disable=SC2086
		if ! "$bin" --spawn "${WL[@]}" $EXTRA --json "$OUT/$who-$i.json" --no-plot --quiet >"$OUT/$who-$i.log" 2>&1; then
			echo "run $i $who: kvring-bench failed (log: $OUT/$who-$i.log)"
			fail=1
		fi
	done
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {"A": [], "B": []}
for i in range(1, rounds + 1):
    for who in "AB":
        try:
            d = json.load(open(f"{out}/{who}-{i}.json"))
        except (OSError, ValueError):
            continue
        c, w = d["cold"], d["warm"]
        r = (c["gbps"], c["ratio"], w["load_time_ns"] / 1e6, w["time_ratio"])
        runs[who].append(r)
        print(f"run {i} {who}: store {r[0]:5.2f} GB/s ({r[1]:.2f}x memcpy)   load {r[2]:7.1f} ms ({r[3]:.2f}x memcpy)")
med = {}
for who in "AB":
    if runs[who]:
        med[who] = [statistics.median(x[k] for x in runs[who]) for k in range(4)]
        m = med[who]
        print(f"median {who}: store {m[0]:5.2f} GB/s ({m[1]:.2f}x memcpy)   load {m[2]:7.1f} ms ({m[3]:.2f}x memcpy)")
if len(med) == 2:
    a, b = med["A"], med["B"]
    print(f"B / A: store throughput {b[0] / a[0]:.2f}x, load time {b[2] / a[2]:.2f}x")
PY
exit $fail
