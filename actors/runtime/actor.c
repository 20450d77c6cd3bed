/* The common actor runtime: argument parsing, segment attach, readiness, control rings, event loop. */
#include "kvr_actor.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_log.h"
#include "kvr_time.h"
#include "watch.h"

#define BURST 32                       /* messages taken from one ring before the next one */
#define MAX_SLEEP_NS 1000000000ll      /* wake at least once a second to refresh the heartbeat */
#define POPULATE_POLL_NS 20000000ll    /* populate waiting for kvringd's prefault: look this often */

/* The signal handler's view: a flag, and the waiter it bumps so a wait that is about to
 * start returns at once instead of sleeping through the signal. */
static volatile sig_atomic_t term_flag;
static struct kvr_waiter *volatile term_waiter;

static void on_term(int sig)
{
	(void)sig;
	term_flag = 1;
	struct kvr_waiter *w = term_waiter;
	if (w) {
		atomic_fetch_add_explicit(&w->seq, 1, memory_order_release);
		/* a futex wait already queued in io_uring (watch.c) does not see the bump by
		 * itself: wake it (a syscall, async-signal-safe) */
		kvr_futex_wake(&w->seq);
	}
}

struct actor_args {
	int ctl_fd, arena_fd, ready_fd;
	int actor;
	int slots_fd; /* -1 when not given */
	unsigned n_kv, n_kv_bytes, n_group;
	unsigned n_areas;
	unsigned area_slot[KVR_CTL_MAX_CLIENTS], area_fd[KVR_CTL_MAX_CLIENTS]; /* the client areas it serves (kvr_ctl.h) */
	int kv_fd[KVR_ACTOR_MAX_KV];
	uint64_t kv_bytes[KVR_ACTOR_MAX_KV];
	unsigned group[KVR_ACTOR_MAX_KV];
};

/* "3,7,11" -> out[0..*n): at most cap numbers, each <= max; 0 or -EINVAL (none, or a bad one) */
static int parse_list(const char *s, unsigned long max, unsigned cap, unsigned *out, unsigned *n)
{
	*n = 0;
	while (*s) {
		char *end;
		errno = 0;
		unsigned long v = strtoul(s, &end, 10);
		if (errno || end == s || *s == '-' || v > max || *n == cap)
			return -EINVAL;
		out[(*n)++] = (unsigned)v;
		if (*end == ',' && end[1])
			end++;
		else if (*end)
			return -EINVAL;
		s = end;
	}
	return *n ? 0 : -EINVAL;
}

/* "0:12,3:15" -> client area slot:fd pairs; 0 or -EINVAL */
static int parse_areas(const char *s, struct actor_args *a)
{
	a->n_areas = 0;
	while (*s) {
		char *end;
		errno = 0;
		unsigned long slot = strtoul(s, &end, 10), fd;
		if (errno || end == s || *s == '-' || slot >= KVR_CTL_MAX_CLIENTS || *end != ':' ||
		    a->n_areas == KVR_CTL_MAX_CLIENTS)
			return -EINVAL;
		s = end + 1;
		fd = strtoul(s, &end, 10);
		if (errno || end == s || *s == '-' || fd > INT_MAX)
			return -EINVAL;
		a->area_slot[a->n_areas] = (unsigned)slot;
		a->area_fd[a->n_areas++] = (unsigned)fd;
		if (*end == ',' && end[1])
			end++;
		else if (*end)
			return -EINVAL;
		s = end;
	}
	return a->n_areas ? 0 : -EINVAL;
}

static int parse_int(const char *s, int *ret)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > INT_MAX)
		return -EINVAL;
	*ret = (int)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct actor_args *ret)
{
	static const struct option opts[] = {
		{"ctl-fd", required_argument, NULL, 'c'},
		{"arena-fd", required_argument, NULL, 'a'},
		{"actor", required_argument, NULL, 'i'},
		{"ready-fd", required_argument, NULL, 'r'},
		{"slots-fd", required_argument, NULL, 's'},
		{"kv-fd", required_argument, NULL, 'k'},
		{"kv-bytes", required_argument, NULL, 'b'},
		{"group", required_argument, NULL, 'g'},
		{"areas", required_argument, NULL, 'A'},
		{0},
	};
	struct actor_args a = {.ctl_fd = -1, .arena_fd = -1, .ready_fd = -1, .actor = -1, .slots_fd = -1};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		int *dst;
		switch (c) {
		case 'c':
			dst = &a.ctl_fd;
			break;
		case 'a':
			dst = &a.arena_fd;
			break;
		case 'i':
			dst = &a.actor;
			break;
		case 'r':
			dst = &a.ready_fd;
			break;
		case 's':
			dst = &a.slots_fd;
			break;
		case 'k':
			if (a.n_kv == KVR_ACTOR_MAX_KV)
				return -EINVAL;
			dst = &a.kv_fd[a.n_kv++];
			break;
		case 'b': {
			char *end;
			errno = 0;
			unsigned long long v = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || !v || a.n_kv_bytes == KVR_ACTOR_MAX_KV)
				return -EINVAL;
			a.kv_bytes[a.n_kv_bytes++] = v;
			continue;
		}
		case 'g': /* workers */
			if (parse_list(optarg, KVR_CTL_MAX_WORKERS - 1, KVR_ACTOR_MAX_KV, a.group, &a.n_group))
				return -EINVAL;
			continue;
		case 'A':
			if (parse_areas(optarg, &a))
				return -EINVAL;
			continue;
		default:
			return -EINVAL;
		}
		if (parse_int(optarg, dst))
			return -EINVAL;
	}
	if (optind != argc || a.ctl_fd < 0 || a.arena_fd < 0 || a.actor < 0 || a.ready_fd < 0 ||
	    a.n_kv != a.n_kv_bytes || (a.n_group && a.n_group != a.n_kv))
		return -EINVAL;
	*ret = a;
	return 0;
}

struct kvr_ring *kvr_actor_ring_w(const struct kvr_actor *a, const char *fmt, unsigned worker)
{
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), fmt, worker);
	return kvr_actor_ring(a, name);
}

struct kvr_ring *kvr_actor_ring(const struct kvr_actor *a, const char *name)
{
	int idx = kvr_ctl_find_ring(a->ctl, name);
	if (idx < 0)
		return NULL;
	for (unsigned i = 0; i < a->n_inputs; i++)
		if (a->inputs[i].index == idx)
			return a->inputs[i].ring;
	for (unsigned i = 0; i < a->n_outputs; i++)
		if (a->outputs[i].index == idx)
			return a->outputs[i].ring;
	return NULL;
}

static void reject(struct kvr_actor *a, struct kvr_ring *r)
{
	kvr_actor_count(a, KVR_STAT_MALFORMED, 1);
	/* rejected lives on the consumer's line: we are its only writer */
	atomic_fetch_add_explicit(&r->shm->rejected, 1, memory_order_relaxed);
}

/* Attach every ring the directory assigns to us; the control rings are remembered apart. */
static int attach_rings(struct kvr_actor *a)
{
	unsigned n = atomic_load(&a->ctl->n_rings);
	pid_t me = getpid();
	for (unsigned i = 0; i < n; i++) {
		const struct kvr_ring_ent *e = kvr_ctl_ring_ent(a->ctl, i);
		struct kvr_ring *r = kvr_ctl_ring(&a->rings, i);
		if (e->consumer == (int)a->index) {
			kvr_ring_claim_consumer(r, me);
			if (i == a->ent->ctl_in) {
				a->ctl_in = r;
				continue;
			}
			if (a->n_inputs == KVR_ACTOR_MAX_RINGS)
				return -E2BIG;
			a->inputs[a->n_inputs++] = (struct kvr_actor_ring){r, (int)i};
		} else if (e->producer == (int)a->index) {
			kvr_ring_claim_producer(r, me);
			if (i == a->ent->ctl_out) {
				a->ctl_out = r;
				continue;
			}
			if (a->n_outputs == KVR_ACTOR_MAX_RINGS)
				return -E2BIG;
			a->outputs[a->n_outputs++] = (struct kvr_actor_ring){r, (int)i};
		}
	}
	return a->ctl_in && a->ctl_out ? 0 : -ENOENT;
}

static int load_config(struct kvr_actor *a)
{
	char err[256];
	const struct kvr_ctl *c = a->ctl;
	char *json = strndup(kvr_ctl_config_json(c), c->config_len);
	if (!json)
		return -ENOMEM;
	int rc = kvr_config_parse(json, &a->cfg, err, sizeof(err));
	free(json);
	if (rc)
		kvr_err("embedded config does not parse: %s", err);
	return rc;
}

/* Steps 1-3 of the contract. Logs what failed; returns 0 or -errno. */
static int setup(struct kvr_actor *a, const struct actor_args *args)
{
	int rc = kvr_segment_map(args->ctl_fd, KVR_SEG_CTL, 1, &a->ctl_seg);
	if (rc) {
		kvr_err("cannot map the control segment (fd %d): %s", args->ctl_fd, strerror(-rc));
		return rc;
	}
	/* the areas of the clients it serves over their places: their rings are served from here
	 * (another client's place reads zeros: its rings are not ours) */
	for (unsigned i = 0; i < args->n_areas; i++)
		if ((rc = kvr_ctl_map_area(&a->ctl_seg, args->area_slot[i], (int)args->area_fd[i], 1))) {
			kvr_err("cannot map client area %u (fd %u): %s", args->area_slot[i], args->area_fd[i], strerror(-rc));
			return rc;
		}
	rc = kvr_ctl_attach(&a->ctl_seg, &a->ctl, &a->rings);
	if (rc) {
		kvr_err("control segment does not validate: %s", strerror(-rc));
		return rc;
	}
	if ((unsigned)args->actor >= atomic_load(&a->ctl->n_actors)) {
		kvr_err("actor %d is not in the actor table (%u actors)", args->actor, atomic_load(&a->ctl->n_actors));
		return -ENOENT;
	}
	a->index = (unsigned)args->actor;
	a->ent = kvr_ctl_actor(a->ctl, a->index);
	a->stats = kvr_ctl_stats(a->ctl, a->index);
	if (a->ent->kind != (uint32_t)a->stage->kind) {
		kvr_err("actor %u is a %s, not a %s", a->index, kvr_actor_kind_name(a->ent->kind), a->stage->name);
		return -EMEDIUMTYPE;
	}
	static char tag[KVR_ACTOR_NAME_MAX + 1];
	memcpy(tag, a->ent->name, KVR_ACTOR_NAME_MAX);
	tag[KVR_ACTOR_NAME_MAX] = 0;
	kvr_log_setup(tag, kvr_log_get_level());

	rc = load_config(a);
	if (rc)
		return rc;
	kvr_log_setup(tag, (enum kvr_log_level)a->cfg.instance.log_level_id);

	rc = kvr_segment_map(args->arena_fd, KVR_SEG_ARENA, 1, &a->arena_seg);
	if (rc) {
		kvr_err("cannot map the arena (fd %d): %s", args->arena_fd, strerror(-rc));
		return rc;
	}
	/* Not faulted in here: an actor is ready in the same time for any arena size. The
	 * stages that copy slots have the loop populate its page table once ready
	 * (populate.c); kvringd faults the pages themselves in (supervisor/prefault.c). */
	if (args->slots_fd >= 0) {
		rc = kvr_segment_map(args->slots_fd, KVR_SEG_SLOTS, 1, &a->slots_seg);
		if (!rc)
			rc = kvr_slots_attach(&a->slots_seg, &a->slots);
		if (rc) {
			kvr_err("cannot map the slot table (fd %d): %s", args->slots_fd, strerror(-rc));
			return rc;
		}
	}
	a->n_kv = args->n_kv;
	for (unsigned i = 0; i < args->n_kv; i++) {
		a->kv_fds[i] = args->kv_fd[i];
		a->kv_sizes[i] = args->kv_bytes[i];
	}
	a->n_group = args->n_group;
	for (unsigned i = 0; i < args->n_group; i++)
		a->group[i] = args->group[i];
	rc = attach_rings(a);
	if (rc) {
		kvr_err("cannot attach rings: %s", rc == -ENOENT ? "control rings missing" : strerror(-rc));
		return rc;
	}
	return 0;
}

static void serve_ping(struct kvr_actor *a, const struct kvr_msg *m)
{
	struct kvr_msg_ping ping;
	if (kvr_msg_decode_ping(m, &ping)) {
		reject(a, a->ctl_in);
		return;
	}
	struct kvr_msg_pong pong = {.sent_ns = ping.sent_ns, .nonce = ping.nonce, .pid = getpid(),
				    .handled = a->handled};
	struct kvr_msg rep;
	kvr_msg_build(&rep, KVR_MSG_PONG, 0, m->hdr.req_id, 0, &pong, sizeof(pong));
	a->handled++;
	kvr_actor_count(a, KVR_STAT_PINGS, 1);
	/* Never block on the supervisor: a full ctl.out only costs it a missed ping. */
	if (kvr_ring_try_enqueue(a->ctl_out, &rep) == 0)
		kvr_actor_count(a, KVR_STAT_MSGS_OUT, 1);
}

/* Drain ctl.in; returns the messages taken. */
static unsigned serve_ctl(struct kvr_actor *a)
{
	struct kvr_msg m;
	unsigned n = 0;
	while (!a->stopping && kvr_ring_try_dequeue(a->ctl_in, &m) == 0) {
		n++;
		kvr_actor_count(a, KVR_STAT_MSGS_IN, 1);
		switch (m.hdr.type) {
		case KVR_MSG_PING:
			serve_ping(a, &m);
			break;
		case KVR_MSG_STOP:
			if (kvr_msg_decode_stop(&m)) {
				reject(a, a->ctl_in);
				break;
			}
			kvr_info("stop requested");
			a->stopping = 1;
			break;
		default:
			if (a->stage->on_msg(a, a->ctl_in, &m) == 0)
				a->handled++;
			else
				reject(a, a->ctl_in);
		}
	}
	return n;
}

/* One pass over the inputs, at most BURST messages each; returns the messages taken. */
static unsigned serve_inputs(struct kvr_actor *a)
{
	unsigned n = 0;
	struct kvr_msg m[BURST];
	for (unsigned i = 0; i < a->n_inputs && !a->stopping; i++) {
		struct kvr_ring *r = a->inputs[i].ring;
		if (a->inputs[i].held || !kvr_ring_count(r))
			continue;
		/* busy from before the burst is taken until its last message is handled: drain
		 * waits for it (the ring may already be empty) */
		atomic_store_explicit(&a->ent->busy, 1, memory_order_seq_cst);
		unsigned got = kvr_ring_dequeue_burst(r, m, BURST);
		for (unsigned k = 0; k < got; k++) {
			kvr_actor_count(a, KVR_STAT_MSGS_IN, 1);
			if (a->stage->on_msg(a, r, &m[k]) == 0)
				a->handled++;
			else
				reject(a, r);
		}
		atomic_store_explicit(&a->ent->busy, 0, memory_order_release);
		n += got;
	}
	return n;
}

static int have_work(const struct kvr_actor *a)
{
	if (kvr_ring_count(a->ctl_in))
		return 1;
	for (unsigned i = 0; i < a->n_inputs; i++)
		if (!a->inputs[i].held && kvr_ring_count(a->inputs[i].ring))
			return 1;
	return 0;
}

int kvr_actor_hold_input(struct kvr_actor *a, struct kvr_ring *r, bool hold)
{
	for (unsigned i = 0; i < a->n_inputs; i++)
		if (a->inputs[i].ring == r) {
			a->inputs[i].held = hold;
			return 0;
		}
	return -ENOENT;
}

/* Spin until an input has work or the deadline passes; true when work arrived. */
static bool spin_for_work(const struct kvr_actor *a, uint64_t deadline)
{
	for (unsigned i = 1;; i++) {
		if (have_work(a) || term_flag)
			return true;
		if ((i & 63) == 0 && kvr_now_ns() >= deadline)
			return false;
		kvr_cpu_relax();
	}
}

/*
 * What the loop sleeps on: its own waiter first (every ring kvringd and other actors share
 * with it points there, and SIGTERM bumps it), then each ring of a client's it serves — the
 * consumer waiter of an input a client produces, the producer waiter of an output a client
 * consumes: those keep their own (ipc/ctl.c, point_waiters), so that a client never
 * writes an actor's waiter. Held inputs are left out (their messages wait anyway).
 * Returns the count, at most KVR_WAITERS_MAX (the rest are polled: the sleep is capped).
 */
static unsigned sleep_set(struct kvr_actor *a, struct kvr_waiter **ws, bool *capped)
{
	struct kvr_waiter *own = &a->ent->waiter;
	unsigned n = 0;
	*capped = false;
	ws[n++] = own;
	for (unsigned i = 0; i < a->n_inputs; i++) {
		struct kvr_waiter *w = kvr_ring_consumer_waiter(a->inputs[i].ring);
		if (w == own || a->inputs[i].held)
			continue;
		if (n == KVR_WAITERS_MAX)
			*capped = true;
		else
			ws[n++] = w;
	}
	for (unsigned i = 0; i < a->n_outputs; i++) {
		struct kvr_waiter *w = kvr_ring_producer_waiter(a->outputs[i].ring);
		if (w == own)
			continue;
		if (n == KVR_WAITERS_MAX)
			*capped = true;
		else
			ws[n++] = w;
	}
	return n;
}

/* Sleep on the set (after kvr_waiter_prepare of each): one futex_waitv, or io_uring's wait
 * when the stage watches fds (it covers the first waiter only: with more, the sleep is cut
 * to KVR_WATCH_FALLBACK_NS and the rings are looked at after it). */
static void sleep_on(struct kvr_actor *a, struct kvr_waiter **ws, const uint32_t *seen, unsigned n, bool capped,
		     int64_t timeout)
{
	static bool no_waitv;
	if ((n > 1 || capped) && (kvr_watch_uses_uring(a) || no_waitv || capped) &&
	    (timeout < 0 || timeout > KVR_WATCH_FALLBACK_NS))
		timeout = KVR_WATCH_FALLBACK_NS;
	if (kvr_watch_uses_uring(a)) {
		(void)kvr_watch_sleep(a, ws[0], seen[0], timeout);
		return;
	}
	if (!no_waitv && n > 1) {
		int rc = kvr_waiters_wait(ws, seen, n, timeout);
		if (rc != -ENOSYS)
			return;
		no_waitv = true;
		kvr_warn("this kernel has no futex_waitv (Linux < 5.16): rings of clients are looked at every %lld us",
			 (long long)(KVR_WATCH_FALLBACK_NS / 1000));
		if (timeout < 0 || timeout > KVR_WATCH_FALLBACK_NS)
			timeout = KVR_WATCH_FALLBACK_NS;
	}
	(void)kvr_waiter_wait(ws[0], seen[0], timeout);
}

static void run_loop(struct kvr_actor *a)
{
	const struct kvr_stage *st = a->stage;
	uint64_t next_tick = st->tick_ns ? kvr_now_ns() + st->tick_ns : UINT64_MAX;
	struct kvr_waiter *ws[KVR_WAITERS_MAX];
	uint32_t seen[KVR_WAITERS_MAX];
	bool had_work = false;

	while (!a->stopping) {
		if (term_flag) {
			kvr_info("SIGTERM: stopping");
			a->stopping = 1;
			break;
		}
		a->now_ns = kvr_now_ns();
		unsigned n = serve_ctl(a);
		n += serve_inputs(a);
		uint64_t now = kvr_now_ns();
		a->now_ns = now;
		n += kvr_watch_dispatch(a, now);
		if (now >= next_tick) {
			st->on_tick(a, now);
			next_tick += st->tick_ns;
			if (next_tick <= now) /* we fell behind: do not fire a burst of late ticks */
				next_tick = now + st->tick_ns;
		}
		a->poll_ns = 0;
		int pass = st->on_pass ? st->on_pass(a, now) : KVR_PASS_IDLE;
		bool output_waits = pass != KVR_PASS_IDLE;
		atomic_store_explicit(&a->ent->heartbeat_ns, now, memory_order_relaxed);
		if (n || pass == KVR_PASS_MOVED || a->stopping) {
			had_work = true;
			continue;
		}
		/* Adaptive wait: right after work, spin briefly (rings.spin_ns) for the next
		 * message — a request streaming in several bursts then costs no futex round trip
		 * per burst; only then announce the sleep. An idle actor does not spin. */
		if (had_work && spin_for_work(a, now + a->cfg.rings.spin_ns))
			continue;
		had_work = false;
		/* nothing to do: one chunk of the background populate, then the rings again */
		if (kvr_actor_populate_step(a))
			continue;

		bool capped;
		unsigned nw = sleep_set(a, ws, &capped);
		for (unsigned i = 0; i < nw; i++)
			seen[i] = kvr_waiter_prepare(ws[i]);
		if (have_work(a) || term_flag || (output_waits && st->on_pass(a, kvr_now_ns()) == KVR_PASS_MOVED)) {
			for (unsigned i = 0; i < nw; i++)
				kvr_waiter_finish(ws[i]);
			continue;
		}
		int64_t timeout = MAX_SLEEP_NS;
		now = kvr_now_ns();
		uint64_t wake_at = kvr_watch_deadline(a);
		if (next_tick < wake_at)
			wake_at = next_tick;
		if (wake_at != UINT64_MAX)
			timeout = wake_at > now ? (int64_t)(wake_at - now) : 0;
		if (timeout > MAX_SLEEP_NS)
			timeout = MAX_SLEEP_NS;
		if (output_waits && timeout > KVR_ACTOR_OUTPUT_POLL_NS)
			timeout = KVR_ACTOR_OUTPUT_POLL_NS; /* a reader's ring may have room again */
		if (output_waits && a->poll_ns && timeout > (int64_t)a->poll_ns)
			timeout = (int64_t)a->poll_ns; /* work in flight completes without waking us */
		if (kvr_actor_populate_waiting(a) && timeout > POPULATE_POLL_NS)
			timeout = POPULATE_POLL_NS; /* kvringd's prefault gets further meanwhile */
		/* woken, timed out or interrupted: all re-check */
		sleep_on(a, ws, seen, nw, capped, timeout);
		for (unsigned i = 0; i < nw; i++)
			kvr_waiter_finish(ws[i]);
		kvr_actor_count(a, KVR_STAT_LOOP_WAKEUPS, 1);
	}
}

static void release_rings(struct kvr_actor *a)
{
	pid_t me = getpid();
	for (unsigned i = 0; i < a->n_inputs; i++)
		atomic_compare_exchange_strong(&a->inputs[i].ring->shm->cons_pid, &me, 0);
	for (unsigned i = 0; i < a->n_outputs; i++)
		atomic_compare_exchange_strong(&a->outputs[i].ring->shm->prod_pid, &me, 0);
}

static int install_signals(void)
{
	struct sigaction sa = {.sa_handler = on_term}; /* no SA_RESTART: the futex wait returns -EINTR */
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL) || sigaction(SIGINT, &sa, NULL))
		return -errno;
	struct sigaction ign = {.sa_handler = SIG_IGN};
	sigemptyset(&ign.sa_mask);
	if (sigaction(SIGPIPE, &ign, NULL))
		return -errno;
	/* kvringd blocks these for its signalfd; exec keeps the mask: unblock ours */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGHUP);
	return sigprocmask(SIG_UNBLOCK, &set, NULL) ? -errno : 0;
}

int kvr_actor_main(int argc, char **argv, const struct kvr_stage *stage)
{
	struct actor_args args;
	static struct kvr_actor actor; /* large (ring tables): not on the stack */
	struct kvr_actor *a = &actor;
	int rc, exit_code = 1;

	kvr_log_setup(stage->name, KVR_LOG_INFO);
	*a = (struct kvr_actor){.stage = stage, .ctl_seg = {.fd = -1}, .arena_seg = {.fd = -1}, .slots_seg = {.fd = -1}};
	if (!stage->on_msg || (stage->tick_ns && !stage->on_tick)) {
		kvr_err("stage %s is incomplete", stage->name);
		return 1;
	}
	if (parse_args(argc, argv, &args)) {
		kvr_err("usage: kvring-%s --ctl-fd N --arena-fd N --actor I --ready-fd N [--slots-fd N] "
			"[--areas SLOT:FD,...] [--kv-fd N --kv-bytes N]... [--group W,W,...]", stage->name);
		return 1;
	}
	rc = install_signals();
	if (rc) {
		kvr_err("cannot install signal handlers: %s", strerror(-rc));
		goto out;
	}
	rc = setup(a, &args);
	/* kvr_segment_map keeps its own descriptors: the inherited ones are not needed */
	(void)close(args.ctl_fd);
	(void)close(args.arena_fd);
	if (args.slots_fd >= 0)
		(void)close(args.slots_fd);
	for (unsigned i = 0; i < args.n_areas; i++)
		(void)close((int)args.area_fd[i]);
	if (rc)
		goto out;
	term_waiter = &a->ent->waiter;
	atomic_store(&a->ent->populated, 0); /* this incarnation's populate, registered by init */
	atomic_store(&a->ent->populate_total, 0);

	a->now_ns = kvr_now_ns(); /* init runs before the first pass */
	if (stage->init) {
		rc = stage->init(a);
		if (rc) {
			kvr_err("stage %s init failed: %s", stage->name, strerror(-rc));
			goto out;
		}
	}
	ssize_t wr;
	do
		wr = write(args.ready_fd, "R", 1);
	while (wr < 0 && errno == EINTR);
	if (wr != 1) {
		kvr_err("cannot signal readiness on fd %d: %s", args.ready_fd,
			wr < 0 ? strerror(errno) : "short write");
		if (stage->fini)
			stage->fini(a);
		goto out;
	}
	(void)close(args.ready_fd);
	args.ready_fd = -1;
	kvr_debug("ready: %u input rings, %u output rings", a->n_inputs, a->n_outputs);

	run_loop(a);
	if (stage->fini)
		stage->fini(a);
	release_rings(a);
	exit_code = 0;
out:
	term_waiter = NULL;
	kvr_watch_close(a);
	kvr_actor_populate_free(a);
	if (args.ready_fd >= 0)
		(void)close(args.ready_fd);
	for (unsigned i = 0; i < a->n_kv; i++)
		(void)close(a->kv_fds[i]);
	kvr_segment_close(&a->slots_seg);
	kvr_segment_close(&a->arena_seg);
	kvr_segment_close(&a->ctl_seg);
	return exit_code;
}
