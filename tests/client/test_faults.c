/* Integrity under faults (issue 11): kvringd killed mid-call, bad KV memory at attach, idle connections. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"
#include "kvr_time.h"

static struct ct_env env;

/* Actor processes a test saw: killed in teardown, so a test that fails because they
 * outlived kvringd (a stopped actor, deaf to SIGTERM) does not leave them behind. */
static pid_t seen[KVR_CTL_MAX_ACTORS];
static unsigned n_seen;

static void setup(void)
{
	ct_init(&env);
	n_seen = 0;
}

static void teardown(void)
{
	for (unsigned i = 0; i < n_seen; i++)
		if (h_pid_alive(seen[i]))
			(void)kill(seen[i], SIGKILL);
	ct_fini(&env);
}

TestSuite(faults, .init = setup, .fini = teardown, .timeout = 60);


#define TAG(prompt, i) (1000ull * (prompt) + (i) + 1)

static uint64_t ms_since(uint64_t t0)
{
	return (kvr_now_ns() - t0) / 1000000;
}

/* Record the pid of every running actor (the actor table of the INSPECT mapping). */
static void record_actor_pids(void)
{
	unsigned n = atomic_load(&env.h.ctl->n_actors);
	for (unsigned i = 0; i < n; i++) {
		pid_t p = atomic_load(&kvr_ctl_actor(env.h.ctl, i)->pid);
		if (p > 0 && n_seen < KVR_CTL_MAX_ACTORS)
			seen[n_seen++] = p;
	}
}

/* ---- defect 6: kvringd dies, nobody notices --------------------------------------------- */

struct lookup_call {
	struct kvr_client *c;
	const uint32_t *tokens;
	int rc;
	uint64_t end_ns;
};

static void *lookup_thread(void *arg)
{
	struct lookup_call *l = arg;
	struct kvr_lookup_result res;
	l->rc = kvr_lookup(l->c, 99, l->tokens, 64, NULL, 0, &res);
	l->end_ns = kvr_now_ns();
	return NULL;
}

/* Collect completions until `want` arrived or kvr_wait says more never will. */
static unsigned collect(struct ct_rank *r, struct ct_done *d, unsigned want, int *ret_last)
{
	unsigned got = 0;
	int n = 0;
	while (got < want) {
		struct kvr_completion c;
		n = kvr_wait(r->c, &c, 1, 5000);
		if (n != 1)
			break;
		cr_assert(c.n_failed <= CT_MAX_FAILED);
		d[got].c = c;
		memcpy(d[got].failed, c.failed, c.n_failed * sizeof(uint32_t));
		d[got].c.failed = d[got].failed;
		got++;
	}
	*ret_last = n;
	return got;
}

/*
 * kill -9 of kvringd while both ranks have calls in flight: rank 0 a load and a store its
 * stopped loader and storer hold; rank 1 a store whose storer is inside its handler,
 * waiting for the stopped lookup actor's ALLOC reply, and a synchronous lookup the stopped
 * lookup actor holds. Then:
 *  - every actor process is gone within a second (parent-death SIGKILL; with SIGTERM the
 *    stopped ones would never go and storer.1 would wait out its 10 s lookup timeout);
 *  - every call fails -EPIPE within a second (the client sees the attach socket close),
 *    not after its 5 s timeout: the load and stores as completions listing every block,
 *    the lookup as its return value; later calls fail -EPIPE at once.
 */
Test(faults, kvringd_kill9_ends_actors_and_fails_calls)
{
	ct_start(&env, &ct_tiny_tp2, NULL);
	struct ct_rank *r0, *r1;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r0), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(ct_rank_open(&env, 1, 16, 0, &r1), 0, "%s", kvr_last_error(NULL));
	uint32_t tokens[64], t2[64], src[4] = {0, 1, 2, 3}, dst[4] = {4, 5, 6, 7}, src2[4] = {8, 9, 10, 11};
	ct_prompt(tokens, 64, 61);
	ct_prompt(t2, 64, 62);
	struct ct_rank *rk[2] = {r0, r1};
	for (unsigned k = 0; k < 2; k++) {
		for (uint32_t i = 0; i < 4; i++)
			ct_fill(rk[k], src[i], TAG(61, i));
		struct ct_done d;
		ct_store(rk[k], 1, tokens, 64, src, 4, &d);
		cr_assert_eq(d.c.status, 0);
	}
	cr_assert_eq(ct_lookup(r0, 2, tokens, 64), 4);

	/* rank 0: a load and a store that its stopped loader and storer hold */
	ct_stop_process(ct_actor_pid(&env, "loader.0"));
	ct_stop_process(ct_actor_pid(&env, "storer.0"));
	cr_assert_eq(kvr_load(r0->c, 2, dst, 4), 0, "%s", kvr_last_error(r0->c));
	cr_assert_eq(kvr_store(r0->c, 3, t2, 64, NULL, 0, src2, 4), 0, "%s", kvr_last_error(r0->c));
	cr_assert_eq(kvr_inflight(r0->c), 2);

	/* rank 1: the lookup actor stops; storer.1 takes a store, sends its ALLOC and holds the store */
	ct_stop_process(ct_actor_pid(&env, "lookup"));
	cr_assert_eq(kvr_store(r1->c, 3, t2, 64, NULL, 0, src2, 4), 0, "%s", kvr_last_error(r1->c));
	cr_assert(H_WAIT(kvr_ring_count(ct_ring(&env, "commit.req.1")) > 0, 2000),
		  "storer.1 did not send its ALLOC");
	/* no handler waits for the lookup actor: the store is state the storer holds (drain waits for it) */
	cr_assert(H_WAIT(atomic_load(&h_actor(&env.h, "storer.1")->held) == 1, 2000), "storer.1 does not hold the store");
	/* and a synchronous lookup the stopped lookup actor holds (4 keys: 2 LOOKUP messages) */
	struct lookup_call call = {.c = r1->c, .tokens = tokens, .rc = 1};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, lookup_thread, &call), 0);
	bool sent = H_WAIT(kvr_ring_count(ct_ring(&env, "lookup.req.1")) == 2, 2000);

	record_actor_pids();
	cr_assert_geq(n_seen, 5, "lookup, loader.0/1, storer.0/1 running");
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(kill(env.h.pid, SIGKILL), 0);
	cr_assert_neq(h_wait_exit(env.h.pid, 2000), -1);
	env.h.pid = 0;

	/* the client: every call in flight fails -EPIPE at once */
	pthread_join(th, NULL); /* bounded by the client's own 5 s timeout */
	cr_assert(sent, "the lookup's 2 messages were not sent");
	uint64_t lookup_ms = (call.end_ns - t0) / 1000000;
	cr_assert_eq(call.rc, -EPIPE, "lookup returned %d: %s", call.rc, kvr_last_error(r1->c));
	cr_assert(strstr(kvr_last_error(r1->c), "kvringd is gone"), "%s", kvr_last_error(r1->c));
	cr_assert_lt(lookup_ms, 1000, "lookup failed after %llu ms", (unsigned long long)lookup_ms);

	static struct ct_done d[4];
	int last;
	unsigned got = collect(r0, d, 2, &last);
	uint64_t r0_ms = ms_since(t0);
	cr_assert_eq(got, 2, "rank 0: %u of 2 completions within %llu ms (kvr_wait %d: %s)", got,
		     (unsigned long long)r0_ms, last, kvr_last_error(r0->c));
	cr_assert_lt(r0_ms, 1000, "rank 0's calls failed after %llu ms", (unsigned long long)r0_ms);
	for (unsigned i = 0; i < 2; i++) {
		bool load = d[i].c.op == KVR_OP_LOAD_DONE;
		const uint32_t *ids = load ? dst : src2;
		cr_assert_eq(d[i].c.status, -EPIPE, "%s: status %d", load ? "load" : "store", d[i].c.status);
		cr_assert_eq(d[i].c.req_id, load ? 2u : 3u);
		cr_assert_eq(d[i].c.n_failed, 4, "every block of the request is reported failed");
		for (unsigned b = 0; b < 4; b++)
			cr_assert_eq(d[i].failed[b], ids[b]);
	}
	cr_assert_neq(d[0].c.op, d[1].c.op, "one load and one store");
	for (unsigned b = 0; b < 4; b++) {
		char why[200] = "";
		cr_assert(ct_holds(r0, dst[b], CT_CANARY, why, sizeof(why)), "nothing was loaded: %s", why);
	}
	got = collect(r1, d, 1, &last);
	cr_assert_eq(got, 1, "rank 1's store: no completion (kvr_wait %d: %s)", last, kvr_last_error(r1->c));
	cr_assert_eq(d[0].c.status, -EPIPE);
	cr_assert_eq(d[0].c.n_failed, 4);
	cr_assert_eq(kvr_inflight(r0->c) + kvr_inflight(r1->c), 0);

	/* nothing more can complete: said at once, not after a timeout */
	uint64_t t1 = kvr_now_ns();
	struct kvr_completion c;
	cr_assert_eq(kvr_wait(r0->c, &c, 1, 5000), -EPIPE);
	cr_assert_lt(ms_since(t1), 100);
	cr_assert_eq(kvr_poll(r1->c, &c, 1), -EPIPE);
	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lookup(r0->c, 4, tokens, 64, NULL, 0, &res), -EPIPE);
	cr_assert_eq(kvr_store(r0->c, 5, tokens, 64, NULL, 0, src, 4), -EPIPE);
	cr_assert(strstr(kvr_last_error(r0->c), "kvringd is gone"), "%s", kvr_last_error(r0->c));
	cr_assert_lt(ms_since(t1), 100, "calls after kvringd's death fail at once");

	/* the actors: every process gone, the stopped ones too */
	for (unsigned i = 0; i < n_seen; i++) {
		bool gone = H_WAIT(!h_pid_alive(seen[i]), 1000);
		cr_assert(gone, "actor pid %d still alive %llu ms after kvringd was killed", (int)seen[i],
			  (unsigned long long)ms_since(t0));
	}
	fprintf(stderr, "faults/kvringd_kill9: lookup failed after %llu ms, rank 0's calls after %llu ms, "
		"%u actors gone after %llu ms\n", (unsigned long long)lookup_ms, (unsigned long long)r0_ms, n_seen,
		(unsigned long long)ms_since(t0));
}

/* ---- defect 8: bad KV memory at attach -------------------------------------------------- */


/* The geometry ct_rank_open would attach rank 0 of e->m with (16 blocks). */
static struct kvr_geometry rank0_geometry(const struct ct_env *e)
{
	struct kvr_geometry g;
	const struct ct_model *m = &e->m;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, m->layers, m->kv_heads / m->tp_size, m->head_dim,
							  m->dtype_bytes, m->block_tokens, 16), 0);
	g.tp_size = m->tp_size;
	g.tp_rank = 0;
	return g;
}

/* ATTACH over a new connection with kv as the KV memory; returns the reply's status and
 * its reason in why. The connection is closed, or kept in *ret_sock when given. */
static int raw_attach(const struct kvr_geometry *g, int kv, char *why, size_t whylen, int *ret_sock)
{
	int s = kvr_proto_connect(env.h.sock);
	cr_assert(s >= 0, "connect: %s", strerror(-s));
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_ATTACH,
				    .payload_len = sizeof(*g)};
	memcpy(req.payload, g, sizeof(*g));
	cr_assert_eq(kvr_proto_send(s, &req, offsetof(struct kvr_proto_req, payload) + sizeof(*g), &kv, 1), 0);
	static struct kvr_proto_rep rep;
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds = 0;
	memset(&rep, 0, sizeof(rep));
	ssize_t n = kvr_proto_recv(s, &rep, sizeof(rep), fds, KVR_PROTO_MAX_FDS, &n_fds);
	cr_assert_gt(n, 0, "no attach reply: %s", n ? strerror((int)-n) : "connection closed");
	for (unsigned i = 0; i < n_fds; i++)
		close(fds[i]);
	rep.reason[sizeof(rep.reason) - 1] = 0;
	snprintf(why, whylen, "%s", rep.reason);
	if (ret_sock)
		*ret_sock = s;
	else
		close(s);
	return rep.status;
}

static int kv_memfd(const char *name, unsigned flags, uint64_t bytes)
{
	int fd = memfd_create(name, MFD_CLOEXEC | flags);
	if (fd >= 0 && ftruncate(fd, (off_t)bytes) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int reopen(int fd, int flags)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	int r = open(p, flags | O_CLOEXEC);
	cr_assert(r >= 0, "reopen %s: %s", p, strerror(errno));
	return r;
}

struct bad_kv {
	const char *what;
	int fd;             /* -1: not available here (the row is skipped, and said so) */
	int status;
	const char *reason; /* a part of the reason the reply must carry */
};

/*
 * Every kind of KV memory an actor could not map safely is refused at attach with a reason
 * that names it, before any actor runs: no loader or storer starts, nothing restarts, the
 * instance stays running. A memfd without F_SEAL_SHRINK is sealed by the attach, so it can
 * never be truncated afterwards. Then a good worker attaches and round-trips exact bytes.
 */
Test(faults, bad_kv_memory_refused_at_attach)
{
	ct_start(&env, &ct_tiny, &(struct ct_opts){.max_workers = 2});
	struct kvr_geometry g = rank0_geometry(&env);
	uint64_t need = kvr_geometry_kv_extent(&g);

	unsigned n_act = atomic_load(&env.h.ctl->n_actors);
	uint32_t restarts0[KVR_CTL_MAX_ACTORS], gen0[KVR_CTL_MAX_ACTORS];
	for (unsigned i = 0; i < n_act; i++) {
		restarts0[i] = __atomic_load_n(&kvr_ctl_actor(env.h.ctl, i)->restarts, __ATOMIC_RELAXED);
		gen0[i] = atomic_load(&kvr_ctl_actor(env.h.ctl, i)->generation);
	}

	char path[160];
	snprintf(path, sizeof(path), "%s/kv.file", env.h.dir);
	int file = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	cr_assert(file >= 0 && ftruncate(file, (off_t)need) == 0);
	/* a file on tmpfs answers F_GET_SEALS (sealed F_SEAL_SEAL); anywhere else it fails */
	bool on_tmpfs = fcntl(file, F_GET_SEALS) >= 0;
	const char *file_why = on_tmpfs ? "cannot be sealed against shrinking" : "is not a memfd";
	int good = kv_memfd("kv-good", MFD_ALLOW_SEALING, need);
	cr_assert(good >= 0);
	int write_sealed = kv_memfd("kv-wsealed", MFD_ALLOW_SEALING, need);
	cr_assert(write_sealed >= 0 && fcntl(write_sealed, F_ADD_SEALS, F_SEAL_WRITE) == 0);
	int seal_sealed = kv_memfd("kv-ssealed", MFD_ALLOW_SEALING, need);
	cr_assert(seal_sealed >= 0 && fcntl(seal_sealed, F_ADD_SEALS, F_SEAL_SEAL) == 0);
	/* hugetlb: a memfd of whole 2 MiB pages (none need to be free: nothing maps it) */
	int huge = kv_memfd("kv-huge", MFD_ALLOW_SEALING | MFD_HUGETLB, (need + (2u << 20) - 1) & ~((2ull << 20) - 1));
	struct bad_kv rows[] = {
		{"a regular file", file, on_tmpfs ? -EPERM : -EBADF, file_why},
		{"an O_PATH descriptor", reopen(good, O_PATH), -EBADF, "O_PATH descriptor"},
		{"a read-only descriptor", reopen(good, O_RDONLY), -EBADF, "open read-only: it must be open read-write"},
		{"a memfd without MFD_ALLOW_SEALING", kv_memfd("kv-nosealing", 0, need), -EPERM,
		 "cannot be sealed against shrinking (F_SEAL_SHRINK"},
		{"a memfd sealed F_SEAL_SEAL without F_SEAL_SHRINK", seal_sealed, -EPERM,
		 "cannot be sealed against shrinking (F_SEAL_SHRINK"},
		{"a memfd sealed against writes", write_sealed, -EPERM, "sealed against writes (F_SEAL_WRITE)"},
		{"a hugetlb memfd", huge, -EINVAL, "hugetlbfs memfd (MFD_HUGETLB): not supported"},
		{"a memfd one byte too small", kv_memfd("kv-small", MFD_ALLOW_SEALING, need - 1), -EINVAL,
		 "ends at"},
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct bad_kv *b = &rows[i];
		if (b->fd < 0) {
			fprintf(stderr, "faults/bad_kv_memory: %s: not available here (%s), skipped\n", b->what,
				strerror(errno));
			continue;
		}
		char why[KVR_PROTO_REASON_MAX];
		int st = raw_attach(&g, b->fd, why, sizeof(why), NULL);
		cr_assert_eq(st, b->status, "%s: status %d (%s), want %d; reason: %s", b->what, st, strerror(-st),
			     b->status, why);
		cr_assert(strstr(why, b->reason), "%s: reason \"%s\" does not say \"%s\"", b->what, why, b->reason);
		cr_assert(h_log_contains(&env.h, why), "%s: kvringd did not log the refusal", b->what);
		close(b->fd);
	}
	/* nothing started, nothing restarted, nothing degraded */
	for (unsigned i = 0; i < n_act; i++) {
		const struct kvr_actor_ent *a = kvr_ctl_actor(env.h.ctl, i);
		cr_assert_eq(__atomic_load_n(&a->restarts, __ATOMIC_RELAXED), restarts0[i], "%s restarted", a->name);
		cr_assert_eq(atomic_load(&a->generation), gen0[i], "%s was started by a refused attach", a->name);
	}
	cr_assert_eq(atomic_load(&env.h.ctl->state), KVR_INST_RUNNING);
	for (unsigned w = 0; w < 2; w++)
		cr_assert_eq(atomic_load(&kvr_ctl_worker(env.h.ctl, w)->state), KVR_WORKER_FREE);

	/* a good memfd that was not sealed: the attach seals it, so it can never shrink now */
	char why[KVR_PROTO_REASON_MAX];
	int sock;
	cr_assert_eq(fcntl(good, F_GET_SEALS) & F_SEAL_SHRINK, 0);
	cr_assert_eq(raw_attach(&g, good, why, sizeof(why), &sock), 0, "good memfd refused: %s", why);
	cr_assert(fcntl(good, F_GET_SEALS) & F_SEAL_SHRINK, "the attach did not seal it against shrinking");
	cr_assert_eq(ftruncate(good, 4096), -1, "the KV memory could be truncated after attach");
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(ftruncate(good, (off_t)need + 4096), 0, "growing stays allowed");
	struct kvr_actor_ent *ld = h_actor(&env.h, "loader.0");
	cr_assert(H_WAIT(atomic_load(&ld->state) == KVR_ACTOR_READY, 3000), "loader.0 not ready: %s",
		  kvr_actor_state_name(atomic_load(&ld->state)));
	close(sock);
	close(good);
	cr_assert(H_WAIT(atomic_load(&kvr_ctl_worker(env.h.ctl, 0)->state) == KVR_WORKER_FREE, 6000));

	/* a worker through libkvring: attaches and moves exact bytes */
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	uint32_t tokens[64], src[4] = {0, 1, 2, 3}, dst[4] = {7, 6, 5, 4};
	ct_prompt(tokens, 64, 81);
	for (uint32_t i = 0; i < 4; i++)
		ct_fill(r, src[i], TAG(81, i));
	struct ct_done d;
	ct_store(r, 1, tokens, 64, src, 4, &d);
	cr_assert_eq(d.c.status, 0);
	cr_assert_eq(d.c.n_stored, 4);
	cr_assert_eq(ct_lookup(r, 2, tokens, 64), 4);
	ct_load(r, 2, dst, 4, &d);
	cr_assert_eq(d.c.status, 0);
	cr_assert_eq(d.c.n_failed, 0);
	for (uint32_t i = 0; i < 4; i++) {
		char w[200] = "";
		cr_assert(ct_holds(r, dst[i], TAG(81, i), w, sizeof(w)), "loaded block %u: %s", dst[i], w);
	}
	for (unsigned i = 0; i < n_act; i++) {
		const struct kvr_actor_ent *a = kvr_ctl_actor(env.h.ctl, i);
		cr_assert_eq(__atomic_load_n(&a->restarts, __ATOMIC_RELAXED), restarts0[i], "%s restarted", a->name);
	}
	cr_assert_eq(atomic_load(&env.h.ctl->state), KVR_INST_RUNNING);
}

/* ---- defect 10: idle connections lock out every attach ---------------------------------- */

#define N_IDLE 130         /* more than kvringd's SUP_MAX_CONNS (128) */
#define ATTACH_TIMEOUT_MS 2500

/*
 * 130 peers connect and never send a thing. A real worker (libkvring) attaching after them
 * gets in at once — the oldest idle connections are closed to make room — instead of
 * "too many connections"; every idle one is closed, none before attach_timeout_ms; the
 * worker's own connection stays open past the timeout and it stores and loads.
 */
Test(faults, idle_connections_do_not_lock_out_attach)
{
	char sup_extra[64];
	snprintf(sup_extra, sizeof(sup_extra), ", \"attach_timeout_ms\": %d", ATTACH_TIMEOUT_MS);
	ct_start(&env, &ct_tiny, &(struct ct_opts){.sup_extra = sup_extra});
	static struct pollfd idle[N_IDLE];
	uint64_t t_connect = 0;
	for (unsigned i = 0; i < N_IDLE; i++) {
		int fd = kvr_proto_connect(env.h.sock);
		cr_assert(fd >= 0, "connection %u: %s", i, strerror(-fd));
		idle[i] = (struct pollfd){.fd = fd, .events = POLLRDHUP};
		t_connect = kvr_now_ns(); /* of the newest */
	}

	uint64_t t0 = kvr_now_ns();
	struct ct_rank *r;
	int rc = ct_rank_open(&env, 0, 16, 0, &r);
	uint64_t attach_ms = ms_since(t0);
	cr_assert_eq(rc, 0, "a worker could not attach behind %d idle connections: %s", N_IDLE, kvr_last_error(NULL));
	cr_assert_lt(attach_ms, ATTACH_TIMEOUT_MS, "attach took %llu ms: it waited for the idle timeout",
		     (unsigned long long)attach_ms);
	cr_assert(h_log_contains(&env.h, "connection limit (128) reached: closed"));

	/* every idle connection is closed: the oldest for room at once, the rest at the timeout */
	unsigned closed = 0;
	uint64_t newest_hup_ms = 0, deadline = kvr_now_ns() + (ATTACH_TIMEOUT_MS + 3000) * 1000000ull;
	while (closed < N_IDLE && kvr_now_ns() < deadline) {
		int n = poll(idle, N_IDLE, 100);
		cr_assert_geq(n, 0);
		for (unsigned i = 0; i < N_IDLE && n > 0; i++) {
			if (idle[i].fd < 0 || !(idle[i].revents & (POLLHUP | POLLRDHUP)))
				continue;
			if (i == N_IDLE - 1)
				newest_hup_ms = ms_since(t_connect);
			close(idle[i].fd);
			idle[i].fd = -1; /* poll ignores it now */
			closed++;
		}
	}
	for (unsigned i = 0; i < N_IDLE; i++)
		if (idle[i].fd >= 0)
			close(idle[i].fd);
	cr_assert_eq(closed, N_IDLE, "%u of %d idle connections closed within %d ms", closed, N_IDLE,
		     ATTACH_TIMEOUT_MS + 3000);
	cr_assert_geq(newest_hup_ms, ATTACH_TIMEOUT_MS, "the newest idle connection was closed after %llu ms",
		      (unsigned long long)newest_hup_ms);
	char line[96];
	snprintf(line, sizeof(line), "that did not attach within %d ms (supervisor.attach_timeout_ms", ATTACH_TIMEOUT_MS);
	cr_assert(h_log_contains(&env.h, line), "kvringd did not log: %s", line);

	/* the attached worker was not closed: still attached, and it works */
	cr_assert_eq(atomic_load(&kvr_ctl_worker(env.h.ctl, r->worker)->state), KVR_WORKER_ATTACHED);
	uint32_t tokens[32], src[2] = {0, 1}, dst[2] = {5, 4};
	ct_prompt(tokens, 32, 91);
	ct_fill(r, 0, TAG(91, 0));
	ct_fill(r, 1, TAG(91, 1));
	struct ct_done d;
	ct_store(r, 1, tokens, 32, src, 2, &d);
	cr_assert_eq(d.c.status, 0);
	cr_assert_eq(ct_lookup(r, 2, tokens, 32), 2);
	ct_load(r, 2, dst, 2, &d);
	cr_assert_eq(d.c.status, 0);
	for (uint32_t i = 0; i < 2; i++) {
		char w[200] = "";
		cr_assert(ct_holds(r, dst[i], TAG(91, i), w, sizeof(w)), "loaded block %u: %s", dst[i], w);
	}
	fprintf(stderr, "faults/idle_connections: attach behind %d idle connections took %llu ms; the newest idle "
		"one was closed after %llu ms (timeout %d ms)\n", N_IDLE, (unsigned long long)attach_ms,
		(unsigned long long)newest_hup_ms, ATTACH_TIMEOUT_MS);
}
