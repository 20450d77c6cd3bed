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

cleanup() { "$rc_sh" stop "$dir" >/dev/null 2>&1; rm -rf "$dir"; }
trap cleanup EXIT

# free ports below the ephemeral range; a port taken between the check and the start (another
# test's server) fails the start: then again on other ports, twice at most
for attempt in 1 2 3; do
	base=$("$rc_sh" free-base 6 $(( $$ + attempt * 7919 ))) || exit 1
	masters=$("$rc_sh" start "$dir" --masters 3 --replicas 1 --base-port "$base")
	st=$?
	[ $st -eq 0 ] && break
	if [ $st -eq 77 ]; then
		echo "with-cluster.sh: redis-server is not installed (tools/install-deps.sh): skipped" >&2
		exit 77
	fi
	"$rc_sh" stop "$dir" >/dev/null 2>&1
	rm -rf "${dir:?}"/*
	[ $attempt -lt 3 ] && echo "with-cluster.sh: the cluster did not start on $base..: again on other ports" >&2
done
[ $st -eq 0 ] || exit $st
export KVR_TEST_CLUSTER=$(echo "$masters" | paste -sd, -)
export KVR_TEST_CLUSTER_DIR=$dir
export KVR_REDIS_CLUSTER_SH=$rc_sh
echo "with-cluster.sh: cluster $KVR_TEST_CLUSTER in $dir" >&2
"$@"
