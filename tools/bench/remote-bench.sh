#!/usr/bin/env bash
# kvring's shared tier against redis-benchmark on the same Redis Cluster in the same run: remote write/read GB/s of 5 MiB lanes.
#
#   remote-bench.sh [--bench PATH] [--requests N] [--clients C] [--json FILE] [--huge-pages N] [-- KVRING-BENCH-ARGS...]
#
# Starts a 3-master Redis Cluster (no replicas) on loopback in a temp dir on free ports
# (tools/redis-cluster.sh), then, in this order:
#   1. redis-benchmark --cluster -d V -n N -c C -P 1 --csv against it, V the byte size of
#      one kvring value (one lane of one block + its 128-byte header, asked of kvring-bench
#      --dry-run), C = remote.max_inflight of kvring (default 4), on keys like kvring's:
#      SET of a fresh key each time (-r 10^9: Redis allocates every value anew, as for
#      kvring's distinct blocks), then GET over GET_KEYS keys per master written before
#      (-r GET_KEYS; every one checked to hold V bytes, so no GET reads a nil). For
#      reference also its default, one key per client overwritten and read again (Redis
#      reuses the value's memory, the value stays in cache): shown, not compared;
#   2. FLUSHALL on every master;
#   3. kvring-bench --spawn --remote <masters> (two instances: A stores, B loads every block
#      from the cluster, A loads from its L1) with the same C as --remote-inflight;
#   4. FLUSHALL, and redis-benchmark again (1.): the baseline brackets kvring's run, so a
#      machine that got busier or quieter meanwhile shows as two different baselines;
# prints "remote write: X GB/s vs redis SET Y GB/s = ratio" (Y the mean of the two
# redis-benchmark runs, both shown), the same for reads, and B's per-prompt lookup + load
# latency against A's, and stops the cluster whatever happened.
#
# Workload (override after --): llama-3.1-8b at TP 1 with 40-token blocks = 5 MiB a lane
# (32 layers x K,V x 8 heads x 128 x bf16 = 128 KiB a token), 8 prompts x 8 blocks of
# their own (no shared prefix: 64 lanes, 320 MiB), every prompt stored at once
# (--concurrency 8: the pattern is generated before the first store, so nothing but kvring
# competes with the write-through), loaded one at a time (--warm-concurrency 1: each
# prompt's latency alone). The same 64 lanes as 2 prompts x 32 blocks (-- --input-len 1280
# --prompts 2) give the same ratios (docs/benchmarks.md): the lookup's read-ahead window
# (1, 2, 4 ... 16 blocks) opens fast enough for 8-block prompts.
#
#   --bench PATH    kvring-bench (default: $KVR_BUILD_ROOT/tools/bench/kvring-bench, else
#                   build/tools/bench/kvring-bench of the source tree)
#   --requests N    redis-benchmark -n (default 256: 1.3 GB each way, each run)
#   --clients C     redis-benchmark -c and kvring's --remote-inflight (default 4)
#   --json FILE     both tools' figures and the ratios as one JSON document
#   --huge-pages N  (root) reserve at least N 2 MiB huge pages for the run (vm.nr_hugepages,
#                   set back at exit), so both kvringd map their arenas in huge pages
#                   (l1.huge_pages, true by default, falls back to 4 KiB pages when none
#                   are free: every process then fills its page tables for each slot it
#                   first touches, a quarter of the remote actor's time in a fresh
#                   instance). 600 covers the default workload's two arenas.
#
# Exit status: 0 when everything ran and kvring-bench verified every byte (a ratio below a
# goal is printed, never a failure); 1 on a failure; 2 on a usage error; 77 when
# redis-server, redis-cli or redis-benchmark is missing (meson's skip).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=${KVR_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
rc_sh="$src/tools/redis-cluster.sh"
bench=""
requests=256
clients=4
json_out=""
huge=""
extra=()

die() { echo "remote-bench.sh: $*" >&2; exit 1; }
usage() {
	awk 'NR >= 3 && !/^#/ { exit } NR >= 3 { sub(/^# ?/, ""); print }' "$0" >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case "$1" in
	--bench) [ $# -ge 2 ] || usage; bench=$2; shift 2 ;;
	--requests) [ $# -ge 2 ] || usage; requests=$2; shift 2 ;;
	--clients) [ $# -ge 2 ] || usage; clients=$2; shift 2 ;;
	--json) [ $# -ge 2 ] || usage; json_out=$2; shift 2 ;;
	--huge-pages) [ $# -ge 2 ] || usage; huge=$2; shift 2 ;;
	--) shift; extra=("$@"); break ;;
	-h | --help) usage ;;
	*) echo "remote-bench.sh: unknown argument $1" >&2; usage ;;
	esac
done
[[ "$requests" =~ ^[1-9][0-9]*$ ]] || { echo "remote-bench.sh: --requests $requests: not a count" >&2; exit 2; }
[[ "$clients" =~ ^[1-9][0-9]*$ ]] || { echo "remote-bench.sh: --clients $clients: not a count" >&2; exit 2; }
if [ -z "$bench" ]; then
	if [ -n "${KVR_BUILD_ROOT:-}" ]; then bench="$KVR_BUILD_ROOT/tools/bench/kvring-bench"
	else bench="$src/build/tools/bench/kvring-bench"; fi
fi
[ -x "$bench" ] || die "kvring-bench not found at $bench (build it, or give --bench PATH)"
for p in redis-server redis-cli redis-benchmark; do
	if ! command -v "$p" >/dev/null 2>&1; then
		echo "remote-bench.sh: $p not found (apt-get install redis-server redis-tools): skipped" >&2
		exit 77
	fi
done
command -v python3 >/dev/null 2>&1 || die "python3 not found (it reads the JSON)"

workload=(--model llama-3.1-8b --tp 1 --block-tokens 40 --input-len 320 --prefix-len 0 --prompts 8
	--concurrency 8 --warm-concurrency 1)
workload+=("${extra[@]}")

# the value size kvring writes, from the plan (no server needed)
plan=$("$bench" --spawn --remote 127.0.0.1:1 --remote-inflight "$clients" "${workload[@]}" --dry-run --quiet --json -) ||
	die "kvring-bench --dry-run refused the workload"
value_bytes=$(python3 -c 'import json,sys; print(int(json.load(sys.stdin)["plan"]["remote_value_bytes"]))' <<<"$plan") ||
	die "no plan.remote_value_bytes in kvring-bench's JSON"

dir=$(mktemp -d /tmp/kvr-remote-bench.XXXXXX)
out=$(mktemp /tmp/kvr-remote-bench.XXXXXX.json)
huge_before=""
cleanup() {
	"$rc_sh" stop "$dir" >/dev/null 2>&1
	rm -rf "$dir" "$out"
	[ -z "$huge_before" ] || echo "$huge_before" >/proc/sys/vm/nr_hugepages 2>/dev/null
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if [ -n "$huge" ]; then
	[[ "$huge" =~ ^[0-9]+$ ]] || die "--huge-pages $huge: not a count"
	have=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null) || die "--huge-pages: no /proc/sys/vm/nr_hugepages"
	if [ "$have" -lt "$huge" ]; then
		echo "$huge" >/proc/sys/vm/nr_hugepages 2>/dev/null || die "--huge-pages: cannot set vm.nr_hugepages (not root?)"
		huge_before=$have
	fi
	echo "huge pages: $(awk '/^HugePages_Free/ { print $2 }' /proc/meminfo) free of $(cat /proc/sys/vm/nr_hugepages)" \
		"(vm.nr_hugepages was $have)"
fi

base=$("$rc_sh" free-base 3) || die "no free ports"
masters=$("$rc_sh" start "$dir" --masters 3 --replicas 0 --base-port "$base") || die "the cluster did not start"
seeds=$(paste -sd, <<<"$masters")
first_port=${masters%%$'\n'*}
first_port=${first_port##*:}

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
echo "machine: $(nproc) CPUs (${cpu:-unknown}), $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)," \
	"Linux $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cluster: $seeds (3 masters, no replicas, $(redis-server --version | awk '{ print $3 }'))"
echo "value: $value_bytes bytes; redis-benchmark -n $requests -c $clients -P 1; kvring max_inflight $clients"

flush() {
	local m
	for m in $masters; do
		[ "$(timeout 10 redis-cli -h "${m%:*}" -p "${m##*:}" flushall 2>/dev/null)" = "OK" ] || die "FLUSHALL on $m failed"
	done
}

GET_KEYS=16 # keys per master the GET baseline reads (48 x 5 MiB: out of cache, like kvring's 64 lanes)

# redis-benchmark -t $1 with extra options $3..; its rps into the variable named $2.
# --cluster spreads its clients over the masters, each on keys of its own node
# (key:{tag}:__rand_int__).
rb_run() {
	local t=$1 var=$2 csv rps
	shift 2
	csv=$(timeout 300 redis-benchmark --cluster -h 127.0.0.1 -p "$first_port" -t "$t" -d "$value_bytes" \
		-c "$clients" -P 1 --csv "$@" 2>&1) || { echo "$csv" >&2; die "redis-benchmark failed"; }
	rps=$(awk -F'","' -v t="${t^^}" '$1 == "\"" t { print $2 }' <<<"$csv")
	[ -n "$rps" ] || { echo "$csv" >&2; die "no ${t^^} row in redis-benchmark's CSV"; }
	printf -v "$var" '%s' "$rps"
}

# The keys redis-benchmark left on the masters: each must hold value_bytes (a GET of a
# missing key would be fast and wrong); echoes their number per master, "n1 n2 n3".
rb_keys() {
	local m h pt key len n out=""
	for m in $masters; do
		h=${m%:*} pt=${m##*:} n=0
		for key in $(timeout 10 redis-cli -h "$h" -p "$pt" --scan --pattern 'key:*' 2>/dev/null); do
			len=$(timeout 10 redis-cli -h "$h" -p "$pt" strlen "$key" 2>/dev/null)
			[ "$len" = "$value_bytes" ] || die "redis-benchmark's $key on $m holds $len bytes, not $value_bytes"
			n=$((n + 1))
		done
		out+="$n "
	done
	echo "${out% }"
}

# redis-benchmark once, on an empty cluster: $set_rps (fresh keys), $get_rps (GET_KEYS
# written keys per master), $set1k_rps / $get1k_rps (its default: one key per client).
redis_bench() {
	local counts c tries populate_rps
	flush
	rb_run set set_rps -n "$requests" -r 1000000000
	flush
	# every key the GETs can pick written first (random picks: repeat until all are there)
	for tries in 1 2 3 4 5; do
		rb_run set populate_rps -n $((GET_KEYS * 24)) -r "$GET_KEYS"
		counts=$(rb_keys)
		for c in $counts; do [ "$c" -ge "$GET_KEYS" ] || continue 2; done
		break
	done
	for c in $counts; do [ "$c" -ge "$GET_KEYS" ] || die "the GET baseline's keys were not all written ($counts)"; done
	rb_run get get_rps -n "$requests" -r "$GET_KEYS"
	flush
	rb_run set set1k_rps -n "$requests"
	rb_run get get1k_rps -n "$requests"
	local one=$(rb_keys)
	echo "redis-benchmark: SET $set_rps/s (fresh keys), GET $get_rps/s (keys per master: $counts, each" \
		"$value_bytes bytes); one key per client ($one): SET $set1k_rps/s, GET $get1k_rps/s"
}

# 1. redis-benchmark
redis_bench
set1=$set_rps get1=$get_rps set1k1=$set1k_rps get1k1=$get1k_rps

# 2. an empty cluster for kvring
flush

# 3. kvring
"$bench" --spawn --remote "$seeds" --remote-inflight "$clients" "${workload[@]}" --no-plot --json "$out"
st=$?
[ -s "$out" ] || die "kvring-bench wrote no JSON (exit $st)"

# 4. redis-benchmark again, on an empty cluster
redis_bench
set2=$set_rps get2=$get_rps set1k2=$set1k_rps get1k2=$get1k_rps

python3 - "$out" "$set1" "$get1" "$set2" "$get2" "$value_bytes" "$requests" "$clients" "$st" "$seeds" "${json_out:-}" \
	"$set1k1" "$get1k1" "$set1k2" "$get1k2" "$GET_KEYS" <<'EOF'
import json, sys
path, set1, get1, set2, get2, value, n, c, st, seeds, json_out, s1k1, g1k1, s1k2, g1k2, gkeys = sys.argv[1:]
k = json.load(open(path))
rm = k.get("remote") or {}
value = int(value)
gb = lambda rps: float(rps) * value / 1e9
sets, gets = [gb(set1), gb(set2)], [gb(get1), gb(get2)]
redis_set, redis_get = sum(sets) / 2, sum(gets) / 2
wr = rm.get("write", {}).get("gbps", 0.0)
rd = rm.get("read", {}).get("gbps", 0.0)
ratio = lambda a, b: a / b if b > 0 else 0.0
goal = 0.8
def line(what, mine, cmd, theirs, runs):
    r = ratio(mine, theirs)
    print(f"remote {what}: {mine:.3f} GB/s vs redis {cmd} {theirs:.3f} GB/s = {r:.2f} "
          f"(goal >= {goal}: {'met' if r >= goal else 'missed'}; redis before/after {runs[0]:.3f}/{runs[1]:.3f})")
    return r
one_key = {"set_gbps_runs": [gb(s1k1), gb(s1k2)], "get_gbps_runs": [gb(g1k1), gb(g1k2)]}
print()
wr_ratio = line("write", wr, "SET", redis_set, sets)
rd_ratio = line("read", rd, "GET", redis_get, gets)
print(f"(redis-benchmark on one key per client, not compared: SET {sum(one_key['set_gbps_runs']) / 2:.3f} GB/s, "
      f"GET {sum(one_key['get_gbps_runs']) / 2:.3f} GB/s)")
b = rm.get("b_warm", {}).get("latency_ns", {})
a = rm.get("a_warm", {}).get("latency_ns", {})
ms = lambda v: v / 1e6
print(f"warm per prompt (lookup + load of {k['plan']['full_blocks_per_prompt']} blocks): "
      f"B from the cluster p50 {ms(b.get('p50', 0)):.2f} ms p99 {ms(b.get('p99', 0)):.2f} ms, "
      f"A from L1 p50 {ms(a.get('p50', 0)):.2f} ms p99 {ms(a.get('p99', 0)):.2f} ms "
      f"(B/A p50 {rm.get('p50_ratio', 0):.1f}x, p99 {rm.get('p99_ratio', 0):.1f}x)")
print(f"B's warm phase end to end (lookups with their promotions + loads into engine memory): "
      f"{rm.get('b_warm', {}).get('gbps', 0):.3f} GB/s")
if json_out:
    doc = {"tool": "remote-bench.sh", "cluster": seeds.split(","), "value_bytes": value,
           "redis_benchmark": {"requests": int(n), "clients": int(c), "pipeline": 1,
                               "set_keys": "fresh (-r 1000000000)", "get_keys_per_master": int(gkeys),
                               "one_key_per_client": one_key,
                               "set_rps": [float(set1), float(set2)], "get_rps": [float(get1), float(get2)],
                               "set_gbps_runs": sets, "get_gbps_runs": gets,
                               "set_gbps": redis_set, "get_gbps": redis_get},
           "write_ratio": wr_ratio, "read_ratio": rd_ratio, "goal_ratio_min": goal,
           "kvring_bench_exit": int(st), "kvring_bench": k}
    with open(json_out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
EOF
[ $? -eq 0 ] || die "cannot read kvring-bench's JSON"
[ "$st" -eq 0 ] || die "kvring-bench failed (exit $st): see above"
exit 0
