#!/usr/bin/env bash
# A throwaway Redis Cluster on loopback for the remote tier's tests: start, stop, kill and restart its nodes.
#
#   redis-cluster.sh start DIR [--masters N] [--replicas R] [--base-port P]
#       N*(1+R) redis-server processes (N >= 3, default 3; R default 1; ports P.. default
#       7000), node i in DIR/<P+i>/ (redis.conf, nodes.conf, redis.pid, redis.log); the
#       cluster made by redis-cli --cluster create; waits (<= 30 s) until it is settled
#       (as wait, below), then prints the masters' addresses (host:port), one per line, on
#       stdout. Everything else goes to stderr.
#   redis-cluster.sh stop DIR          every server of DIR: SIGTERM, SIGKILL after 10 s; waits until gone
#   redis-cluster.sh kill DIR PORT     kill -9 one node (its replica takes over after ~2 s)
#   redis-cluster.sh restart DIR PORT  start that node again from its redis.conf and nodes.conf
#   redis-cluster.sh wait DIR [SECS]   wait (default 30 s) until settled again: every running node says
#                                      cluster_state:ok, all 16384 slots assigned, every slot owner
#                                      running, every replica in sync (after kill: the failover)
#   redis-cluster.sh masters DIR       print the masters' addresses (as start does)
#   redis-cluster.sh free-base N [SEED]  print a base port P such that P..P+N-1 and their bus
#                                      ports (+10000) are free, all below the kernel's ephemeral
#                                      range (so no outgoing connection can take one meanwhile);
#                                      SEED (default: our pid) varies the first one tried
#
# Exit status: 0; 1 on failure (with a message); 2 on a usage error; 77 when redis-server or
# redis-cli is missing (meson's skip: tools/install-deps.sh installs redis-server and
# redis-tools). Works as root and with no network but loopback.
set -euo pipefail

HOST=127.0.0.1
WAIT_S=30
TERM_S=10

die() { echo "redis-cluster.sh: $*" >&2; exit 1; }
usage() {
	awk 'NR >= 3 && !/^#/ { exit } NR >= 3 { sub(/^# ?/, ""); print }' "$0" >&2
	exit 2
}

need_redis() {
	local p
	for p in redis-server redis-cli; do
		if ! command -v "$p" >/dev/null 2>&1; then
			echo "redis-cluster.sh: $p not found (apt-get install redis-server redis-tools); skipping" >&2
			exit 77
		fi
	done
}

cli() { # cli PORT ARGS...: one command to one node, short timeouts
	timeout 5 redis-cli -h "$HOST" -p "$1" "${@:2}" 2>/dev/null
}

# The pid of the redis-server of node dir $1 (named by its port), or nothing when it is not
# running: a stale pidfile, or its pid reused by another program, counts as not running.
# redis-server retitles itself "redis-server 127.0.0.1:<port> [cluster]".
node_pid() {
	local pidf="$1/redis.pid" port pid
	port=$(basename "$1")
	[ -s "$pidf" ] || return 0
	pid=$(<"$pidf")
	[[ "$pid" =~ ^[0-9]+$ ]] || return 0
	[ -r "/proc/$pid/comm" ] && [ "$(<"/proc/$pid/comm")" = "redis-server" ] || return 0
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE -- ":$port( |\$)" && echo "$pid"
	return 0
}

# Wait up to $2 s until pid $1 is gone. 0 when gone.
wait_gone() {
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.1
	done
	! kill -0 "$1" 2>/dev/null
}

node_dirs() { # every node directory of cluster dir $1, by port
	local d
	for d in "$1"/*/; do
		d=${d%/}
		[ -f "$d/redis.conf" ] && [[ "$(basename "$d")" =~ ^[0-9]+$ ]] && echo "$d"
	done | sort -V
}

abs_dir() { # the absolute path of directory $1 (created when missing)
	mkdir -p "$1"
	(cd "$1" && pwd -P)
}

write_conf() { # write_conf NODEDIR PORT
	cat >"$1/redis.conf" <<EOF
# written by tools/redis-cluster.sh
port $2
bind $HOST
protected-mode no
daemonize yes
dir $1
pidfile $1/redis.pid
logfile $1/redis.log
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 2000
# a replica fails over however long it was cut off (tests kill masters at any time)
cluster-replica-validity-factor 0
# a (re)started replica syncs at once, not after the default 5 s
repl-diskless-sync-delay 0
appendonly no
save ""
maxmemory 1gb
maxmemory-policy allkeys-lru
EOF
}

# Start the server of node dir $1 on port $2 and wait until it answers PING. 0, or 1 with a
# message.
start_node() {
	local d="$1" port="$2" pid i
	pid=$(node_pid "$d")
	if [ -n "$pid" ]; then
		echo "redis-cluster.sh: node $port is already running (pid $pid)" >&2
		return 1
	fi
	rm -f "$d/redis.pid"
	# anything listening there (a connect succeeds): another cluster's node or another program
	if timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$port" 2>/dev/null; then
		echo "redis-cluster.sh: port $port is in use" >&2
		return 1
	fi
	local log_lines=0
	[ -f "$d/redis.log" ] && log_lines=$(wc -l <"$d/redis.log")
	if ! redis-server "$d/redis.conf" >/dev/null; then
		echo "redis-cluster.sh: redis-server on port $port failed to start (see $d/redis.log)" >&2
		return 1
	fi
	for ((i = 0; i < WAIT_S * 10; i++)); do
		if [ -n "$(node_pid "$d")" ] && [ "$(cli "$port" ping)" = "PONG" ]; then
			return 0
		fi
		# the daemon exits before writing its pidfile when it cannot listen or load its config
		if tail -n +$((log_lines + 1)) "$d/redis.log" 2>/dev/null | grep -qE 'Failed listening|Could not create server|FATAL|Fatal error'; then
			break
		fi
		sleep 0.1
	done
	tail -n +$((log_lines + 1)) "$d/redis.log" | tail -5 >&2 || true
	echo "redis-cluster.sh: node $port did not come up (see $d/redis.log)" >&2
	return 1
}

# Whether node $1 is settled: cluster_state:ok, every slot assigned, $2 nodes known (not
# checked when $2 is empty), every master that owns slots in its view one of the running
# ports in $3 (space-separated), and, when it is a replica, in sync with its master. The
# owner check is what makes a wait after a kill -9 wait for the failover: until the node
# timeout has passed, the dead master still owns its slots and the state still says ok.
node_ok() {
	local info owners p
	info=$(cli "$1" cluster info | tr -d '\r') || return 1
	grep -qx 'cluster_state:ok' <<<"$info" && grep -qx 'cluster_slots_assigned:16384' <<<"$info" || return 1
	[ -z "$2" ] || grep -qx "cluster_known_nodes:$2" <<<"$info" || return 1
	# CLUSTER NODES: id addr@cport flags master ping pong epoch link slot...
	owners=$(cli "$1" cluster nodes | tr -d '\r' |
		awk '$3 ~ /master/ && NF >= 9 { sub(/@.*/, "", $2); sub(/.*:/, "", $2); print $2 }') || return 1
	[ -n "$owners" ] || return 1
	for p in $owners; do
		[[ " $3 " == *" $p "* ]] || return 1
	done
	# a replica: linked to its master and done with its first sync (a replica promoted
	# before that would come up empty)
	info=$(cli "$1" info replication | tr -d '\r') || return 1
	if grep -qx 'role:slave' <<<"$info"; then
		grep -qx 'master_link_status:up' <<<"$info" && grep -qx 'master_sync_in_progress:0' <<<"$info"
	fi
}

# Wait up to $2 s until every running node of cluster dir $1 is ok (known nodes = $3 when given).
wait_ok() {
	local dir="$1" secs="$2" known="${3:-}" i d port all running
	for ((i = 0; i < secs * 5; i++)); do
		running=""
		while read -r d; do
			[ -z "$(node_pid "$d")" ] || running+=" $(basename "$d")"
		done < <(node_dirs "$dir")
		all=1
		[ -n "$running" ] || all=0
		for port in $running; do
			node_ok "$port" "$known" "$running" || { all=0; break; }
		done
		[ "$all" = 1 ] && return 0
		sleep 0.2
	done
	return 1
}

# The masters that own slots, as host:port, by port, asked of the first running node.
masters() {
	local dir="$1" d port
	while read -r d; do
		port=$(basename "$d")
		[ -n "$(node_pid "$d")" ] || continue
		# CLUSTER NODES: id addr@cport flags master ping pong epoch state slots...
		cli "$port" cluster nodes | tr -d '\r' |
			awk '$3 ~ /master/ && $3 !~ /fail/ && NF >= 9 { sub(/@.*/, "", $2); print $2 }' | sort -t: -k2 -n
		return 0
	done < <(node_dirs "$dir")
	die "no node of $dir is running"
}

cmd_start() {
	local dir="" masters_n=3 replicas=1 base=7000
	[ $# -ge 1 ] || usage
	dir="$1"; shift
	while [ $# -gt 0 ]; do
		case "$1" in
		--masters) masters_n="${2:-}"; shift 2 || usage ;;
		--replicas) replicas="${2:-}"; shift 2 || usage ;;
		--base-port) base="${2:-}"; shift 2 || usage ;;
		*) usage ;;
		esac
	done
	[[ "$masters_n" =~ ^[0-9]+$ && "$replicas" =~ ^[0-9]+$ && "$base" =~ ^[0-9]+$ ]] || usage
	[ "$masters_n" -ge 3 ] || die "--masters must be >= 3 (redis-cli --cluster create needs 3 masters)"
	local total=$((masters_n * (1 + replicas)))
	if [ "$base" -lt 1 ] || [ $((base + total - 1)) -gt 55535 ]; then
		die "ports $base..$((base + total - 1)) out of range (the cluster bus uses port + 10000)"
	fi
	need_redis
	dir=$(abs_dir "$dir")
	local d
	while read -r d; do
		[ -z "$(node_pid "$d")" ] || die "$dir has running servers (redis-cluster.sh stop $dir first)"
	done < <(node_dirs "$dir")

	# a fresh cluster: no nodes.conf of an earlier one
	local i port addrs=()
	for ((i = 0; i < total; i++)); do
		port=$((base + i))
		d="$dir/$port"
		rm -rf "$d"
		mkdir -p "$d"
		write_conf "$d" "$port"
	done
	for ((i = 0; i < total; i++)); do
		port=$((base + i))
		if ! start_node "$dir/$port" "$port"; then
			cmd_stop "$dir" >/dev/null 2>&1 || true
			exit 1
		fi
		addrs+=("$HOST:$port")
	done
	if ! timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$replicas" --cluster-yes \
		>"$dir/create.log" 2>&1; then
		cat "$dir/create.log" >&2
		cmd_stop "$dir" >/dev/null 2>&1 || true
		die "redis-cli --cluster create failed"
	fi
	if ! wait_ok "$dir" "$WAIT_S" "$total"; then
		for d in $(node_dirs "$dir"); do
			echo "$(basename "$d"): $(cli "$(basename "$d")" cluster info | tr -d '\r' | grep -E 'state|assigned|known' | tr '\n' ' ')" >&2
		done
		cmd_stop "$dir" >/dev/null 2>&1 || true
		die "the cluster was not ok within ${WAIT_S} s"
	fi
	masters "$dir"
}

cmd_stop() {
	[ $# -eq 1 ] || usage
	local dir="$1" d pid pids=()
	[ -d "$dir" ] || die "no directory $dir"
	dir=$(abs_dir "$dir")
	while read -r d; do
		pid=$(node_pid "$d")
		if [ -n "$pid" ]; then
			pids+=("$pid")
			kill -TERM "$pid" 2>/dev/null || true
		fi
	done < <(node_dirs "$dir")
	[ ${#pids[@]} -gt 0 ] || return 0
	for pid in "${pids[@]}"; do
		wait_gone "$pid" "$TERM_S" || kill -KILL "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait_gone "$pid" 5 || die "pid $pid survived SIGKILL"
	done
	while read -r d; do rm -f "$d/redis.pid"; done < <(node_dirs "$dir")
}

node_dir_of() { # node_dir_of DIR PORT: the node directory, or die
	[[ "$2" =~ ^[0-9]+$ ]] || usage
	local d
	d="$(abs_dir "$1")/$2"
	[ -f "$d/redis.conf" ] || die "no node $2 in $1"
	echo "$d"
}

cmd_kill() {
	[ $# -eq 2 ] || usage
	local d pid
	d=$(node_dir_of "$1" "$2")
	pid=$(node_pid "$d")
	[ -n "$pid" ] || die "node $2 is not running"
	kill -KILL "$pid"
	wait_gone "$pid" 5 || die "pid $pid survived SIGKILL"
	rm -f "$d/redis.pid"
}

cmd_restart() {
	[ $# -eq 2 ] || usage
	need_redis
	local d
	d=$(node_dir_of "$1" "$2")
	start_node "$d" "$2" || exit 1
}

cmd_wait() {
	if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
	local secs="${2:-$WAIT_S}"
	[[ "$secs" =~ ^[0-9]+$ ]] || usage
	need_redis
	wait_ok "$(abs_dir "$1")" "$secs" || die "the cluster in $1 was not ok within $secs s"
}

cmd_masters() {
	[ $# -eq 1 ] || usage
	need_redis
	masters "$(abs_dir "$1")"
}

cmd_free_base() {
	if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
	local n="$1" seed="${2:-$$}" lo hi p busy try
	[[ "$n" =~ ^[0-9]+$ ]] && [[ "$seed" =~ ^[0-9]+$ ]] || usage
	read -r lo _ </proc/sys/net/ipv4/ip_local_port_range
	hi=$((lo - 10000 - n)) # the highest base whose bus ports stay below the ephemeral range
	[ "$hi" -gt 10000 ] || die "no port range below the ephemeral ports ($lo..)"
	for try in $(seq 0 60); do
		p=$((10000 + ((seed + try * 97) * 10) % (hi - 10000)))
		busy=0
		for i in $(seq 0 $((n - 1))); do
			for q in $((p + i)) $((p + i + 10000)); do
				if (exec 3<>"/dev/tcp/$HOST/$q") 2>/dev/null; then busy=1; fi
			done
		done
		if [ $busy = 0 ]; then
			echo "$p"
			return 0
		fi
	done
	die "no free base port for $n nodes"
}

[ $# -ge 1 ] || usage
cmd="$1"; shift
case "$cmd" in
start) cmd_start "$@" ;;
stop) cmd_stop "$@" ;;
kill) cmd_kill "$@" ;;
restart) cmd_restart "$@" ;;
wait) cmd_wait "$@" ;;
masters) cmd_masters "$@" ;;
free-base) cmd_free_base "$@" ;;
-h | --help | help) usage ;;
*) usage ;;
esac
