#!/usr/bin/env bash
# Runs a test program against a real 3-master Redis Cluster (one replica each) started for it on loopback.
#
#   with-cluster.sh PROGRAM [ARGS...]
#
# Starts the cluster (tools/redis-cluster.sh) in a temp dir on free ports, exports
# KVR_TEST_CLUSTER (the masters, "host:port,host:port,...") and KVR_TEST_CLUSTER_DIR (for
# redis-cluster.sh kill/restart/wait), runs PROGRAM, stops the cluster whatever happened and
# exits with PROGRAM's status. Exits 77 (skip) only when redis-server cannot be found.
set -uo pipefail

src=${KVR_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
rc_sh="$src/tools/redis-cluster.sh"
dir=$(mktemp -d /tmp/kvr-cluster.XXXXXX)

# a base port whose 6 ports and their bus ports (+10000) are free
base=""
for try in $(seq 0 40); do
	p=$((20000 + (($$ + try * 97) % 400) * 10))
	busy=0
	for i in 0 1 2 3 4 5; do
		for q in $((p + i)) $((p + i + 10000)); do
			if (exec 3<>"/dev/tcp/127.0.0.1/$q") 2>/dev/null; then busy=1; fi
		done
	done
	if [ $busy = 0 ]; then base=$p; break; fi
done
[ -n "$base" ] || { echo "with-cluster.sh: no free ports" >&2; exit 1; }

cleanup() { "$rc_sh" stop "$dir" >/dev/null 2>&1; rm -rf "$dir"; }
trap cleanup EXIT

masters=$("$rc_sh" start "$dir" --masters 3 --replicas 1 --base-port "$base")
st=$?
if [ $st -ne 0 ]; then
	[ $st -eq 77 ] && echo "with-cluster.sh: redis-server is not installed (tools/install-deps.sh): skipped" >&2
	exit $st
fi
export KVR_TEST_CLUSTER=$(echo "$masters" | paste -sd, -)
export KVR_TEST_CLUSTER_DIR=$dir
export KVR_REDIS_CLUSTER_SH=$rc_sh
echo "with-cluster.sh: cluster $KVR_TEST_CLUSTER in $dir" >&2
"$@"
