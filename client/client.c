/* libkvring: a client from attach to detach: attach (a worker or a scheduler), watch kvringd and our
 * actors, detach. Its requests are requests.c's; client.h is what the two share. */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvr_build_config.h"
#include "kvr_config.h"
#include "kvr_ctl.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_proto.h"
#include "kvr_ring.h"
#include "kvr_ring_names.h"
#include "kvr_segment.h"
#include "kvr_time.h"

#define SUP_CHECK_NS 10000000  /* look at the attach socket at most this often (kvringd alive?) */
#define DEAD_FENCE_NS 5000000000ull /* kvringd died: wait this long at most for its actors to exit */

static void client_free(struct kvr_client *c);
int client_fail(struct kvr_client *c, int rc, const char *fmt, ...)
{
	if (c) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->err, sizeof(c->err), fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* Why the last kvr_attach() of this thread failed: the client it built is gone by then. */
static __thread char attach_err[256];

KVR_EXPORT const char *kvr_last_error(const struct kvr_client *c)
{
	return c ? c->err : attach_err;
}

KVR_EXPORT unsigned kvr_worker_slot(const struct kvr_client *c)
{
	return c->worker;
}

KVR_EXPORT unsigned kvr_block_tokens(const struct kvr_client *c)
{
	return c->geom.block_tokens;
}

KVR_EXPORT size_t kvr_rank_tokens(const struct kvr_client *c, size_t n_tokens)
{
	return (size_t)kvr_dcp_rank_tokens(n_tokens, c->geom.dcp_size, c->geom.dcp_interleave, c->geom.dcp_rank);
}

KVR_EXPORT unsigned kvr_inflight(const struct kvr_client *c)
{
	return c->n_pend;
}

static struct kvr_ring *ring_named(struct kvr_client *c, const char *fmt)
{
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), fmt, c->worker);
	int i = kvr_ctl_find_ring(c->ctl, name);
	return i < 0 ? NULL : kvr_ctl_ring(&c->rings, (unsigned)i);
}

uint32_t client_actor_gen(const struct kvr_client *c, unsigned actor)
{
	return atomic_load(&kvr_ctl_actor(c->ctl, actor)->generation);
}

bool client_actor_alive(const struct kvr_client *c, unsigned actor, uint32_t gen)
{
	const struct kvr_actor_ent *e = kvr_ctl_actor(c->ctl, actor);
	return atomic_load(&e->generation) == gen && atomic_load(&e->state) == KVR_ACTOR_READY;
}

/* Whether the incarnation `gen` of an actor may still run, and so still copy for a request
 * sent to it: a stopping actor finishes what it is copying before it exits. Only once it
 * is gone (its slot restarted, backing off, given up, or stopped with no process) are its
 * requests failed — the fence of an actor's death (docs/api.md). */
bool client_actor_may_run(const struct kvr_client *c, unsigned actor, uint32_t gen)
{
	const struct kvr_actor_ent *e = kvr_ctl_actor(c->ctl, actor);
	if (atomic_load(&e->generation) != gen)
		return false;
	uint32_t st = atomic_load(&e->state);
	return st == KVR_ACTOR_READY || (st == KVR_ACTOR_STOPPING && atomic_load(&e->pid) > 0);
}

/* Wait until the processes of our loader and storer (a DCP rank's: its group's gather
 * actor) have exited, up to deadline: kvringd died and they die with it (parent-death
 * signal), but a copy may be under way until they have. 0, or -ETIMEDOUT. */
static int await_actors_exit(struct kvr_client *c, uint64_t deadline)
{
	unsigned actors[2] = {c->info.loader_actor, c->info.storer_actor};
	int rc = 0;
	for (unsigned k = 0; k < 2 && !c->sched; k++) {
		pid_t pid = atomic_load(&kvr_ctl_actor(c->ctl, actors[k])->pid);
		int fd = pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
		if (fd < 0)
			continue; /* not running, or already gone (ESRCH) */
		for (;;) {
			uint64_t now = kvr_now_ns();
			struct pollfd p = {.fd = fd, .events = POLLIN};
			int n = poll(&p, 1, now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000));
			if (n == 1)
				break;
			if (n < 0 && errno == EINTR)
				continue;
			rc = -ETIMEDOUT;
			break;
		}
		close(fd);
	}
	return rc;
}

/*
 * Is kvringd gone? The attach connection stays open for as long as we are attached and
 * kvringd never writes on it unasked, so a hang-up on it means kvringd exited — however
 * it died, the kernel closes its end. Its actors die with it (parent-death signal) but
 * nobody marks them dead in the actor table, so this is the only way to know. A poll()
 * of the socket, at most every SUP_CHECK_NS: every wait loop below re-checks once per
 * WAIT_SLICE_NS slice, so a call in flight fails within about 20 ms.
 */
bool client_sup_gone(struct kvr_client *c)
{
	if (c->sup_gone)
		return true;
	uint64_t now = kvr_now_ns();
	if (now - c->sup_checked_ns < SUP_CHECK_NS)
		return false;
	c->sup_checked_ns = now;
	struct pollfd p = {.fd = c->sock, .events = POLLRDHUP};
	if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL))) {
		c->sup_gone = true;
		/* the fence: nothing is reported failed (and so the engine's again) while an actor
		 * of ours may still be copying */
		if (c->ctl && c->n_pend && await_actors_exit(c, now + DEAD_FENCE_NS))
			snprintf(c->err, sizeof(c->err), "kvringd is gone and our loader or storer did not exit "
				 "within %llu ms: failing our requests anyway", DEAD_FENCE_NS / 1000000);
	}
	return c->sup_gone;
}

uint64_t client_wire_id(struct kvr_client *c, uint32_t gen)
{
	return kvr_wire_make(gen, ++c->next_wire);
}

/* ---- attach ----------------------------------------------------------------------------- */

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* CUDA KV memory: the KV descriptor (kvr_proto.h) that travels instead of a KV memfd. A
 * sealed memfd of max(kv_bytes, descriptor) bytes (kvringd checks its size like any KV
 * memfd); we keep a writable mapping of its event table. Returns the fd or -errno. */
static int cuda_desc_create(struct kvr_client *c, const struct kvr_attach_opts *o)
{
	const struct kvr_cuda_kv *k = o->cuda_kv;
	_Static_assert(sizeof(k->ranges->ipc_handle) == KVR_CUDA_IPC_BYTES, "IPC handle size");
	if (!k->ranges || !k->n_ranges || k->n_ranges > KVR_CUDA_MAX_RANGES)
		return client_fail(c, -EINVAL, "cuda_kv: %u ranges (must be 1..%u)", k->n_ranges, KVR_CUDA_MAX_RANGES);
	for (uint32_t i = 0; i < k->n_ranges; i++) {
		const struct kvr_cuda_kv_range *r = &k->ranges[i];
		uint64_t end, aend;
		if (!r->bytes || __builtin_add_overflow(r->kv_offset, r->bytes, &end) || end > o->kv_bytes ||
		    __builtin_add_overflow(r->alloc_offset, r->bytes, &aend) ||
		    (i && r->kv_offset < k->ranges[i - 1].kv_offset + k->ranges[i - 1].bytes))
			return client_fail(c, -EINVAL, "cuda_kv range %u [%llu, +%llu): empty, beyond kv_bytes %llu, or not "
				    "after range %u", i, (unsigned long long)r->kv_offset, (unsigned long long)r->bytes,
				    (unsigned long long)o->kv_bytes, i ? i - 1 : 0);
	}
	struct kvr_cuda_desc d = {.magic = KVR_CUDA_DESC_MAGIC, .version = KVR_CUDA_DESC_VERSION,
				  .n_ranges = k->n_ranges, .n_events = KVR_CUDA_EVENTS, .kv_bytes = o->kv_bytes,
				  .ranges_off = sizeof(d), .worker_pid = (int32_t)getpid()};
	memcpy(d.device_uuid, k->device_uuid, sizeof(d.device_uuid));
	d.events_off = round_up(d.ranges_off + (uint64_t)d.n_ranges * sizeof(struct kvr_cuda_range), 64);
	d.desc_bytes = round_up(d.events_off + (uint64_t)d.n_events * sizeof(struct kvr_cuda_event), 4096);
	uint64_t fd_bytes = o->kv_bytes > d.desc_bytes ? o->kv_bytes : d.desc_bytes;

	c->cuda_ev_owner = calloc(KVR_CUDA_EVENTS, sizeof(*c->cuda_ev_owner));
	if (!c->cuda_ev_owner)
		return client_fail(c, -ENOMEM, "out of memory");
	int fd = memfd_create("kvring-cuda-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING), rc;
	if (fd < 0)
		return client_fail(c, -errno, "cuda_kv: memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)fd_bytes) < 0) {
		rc = client_fail(c, -errno, "cuda_kv: ftruncate: %s", strerror(errno));
		goto fail;
	}
	void *map = mmap(NULL, (size_t)d.desc_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		rc = client_fail(c, -errno, "cuda_kv: mmap: %s", strerror(errno));
		goto fail;
	}
	c->cuda_map = map;
	c->cuda_map_len = (size_t)d.desc_bytes;
	c->cuda_ev = (struct kvr_cuda_event *)((uint8_t *)map + d.events_off);
	memcpy(map, &d, sizeof(d));
	struct kvr_cuda_range *out = (struct kvr_cuda_range *)((uint8_t *)map + d.ranges_off);
	for (uint32_t i = 0; i < k->n_ranges; i++) {
		memcpy(out[i].handle, k->ranges[i].ipc_handle, KVR_CUDA_IPC_BYTES);
		out[i].alloc_offset = k->ranges[i].alloc_offset;
		out[i].kv_offset = k->ranges[i].kv_offset;
		out[i].bytes = k->ranges[i].bytes;
	}
	/* Our mapping stays writable (the event table); nobody maps it writable again, nobody
	 * resizes it. A loader without CUDA support fails to map it instead of writing to it. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0) {
		rc = client_fail(c, -errno, "cuda_kv: sealing the descriptor: %s", strerror(errno));
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return rc;
}

/* The engine identity record both attaches send; the strings are checked by kvringd too. */
static int engine_fill(struct kvr_attach_engine *e, const char *engine_id, const char *model_ns, char *err,
		       size_t errlen)
{
	memset(e, 0, sizeof(*e));
	if (engine_id && strlen(engine_id) >= sizeof(e->engine_id)) {
		snprintf(err, errlen, "attach: engine_id is %zu bytes, at most %zu", strlen(engine_id),
			 sizeof(e->engine_id) - 1);
		return -EINVAL;
	}
	if (model_ns && strlen(model_ns) >= sizeof(e->model_ns)) {
		snprintf(err, errlen, "attach: model_ns is %zu bytes, at most %zu", strlen(model_ns),
			 sizeof(e->model_ns) - 1);
		return -EINVAL;
	}
	if (engine_id)
		memcpy(e->engine_id, engine_id, strlen(engine_id));
	if (model_ns)
		memcpy(e->model_ns, model_ns, strlen(model_ns));
	return 0;
}
_Static_assert(KVR_ENGINE_ID_MAX == sizeof(((struct kvr_attach_engine *)0)->engine_id), "engine id size");
_Static_assert(KVR_MODEL_NS_MAX == sizeof(((struct kvr_attach_engine *)0)->model_ns), "model ns size");

/* Receive kvringd's answer to an attach: a reply with status 0, exactly want_fds fds and the
 * attach info (into c->info, c->worker, c->ns). On failure every fd received is closed and
 * kvr_last_error says why. */
static int recv_attach_reply(struct kvr_client *c, unsigned want_fds, int *fds)
{
	struct kvr_proto_rep rep;
	unsigned nfds = 0;
	int rc;
	ssize_t n = kvr_proto_recv(c->sock, &rep, sizeof(rep), fds, KVR_PROTO_MAX_FDS, &nfds);
	if (n <= 0)
		return client_fail(c, n ? (int)n : -ECONNRESET, "attach reply: %s", n ? strerror((int)-n) : "connection closed");
	/* magic and version lead every record of every protocol version: a kvringd of another
	 * version refused our request ("malformed request") and said which version it speaks */
	if ((size_t)n >= offsetof(struct kvr_proto_rep, status) && rep.magic == KVR_PROTO_MAGIC &&
	    rep.version != KVR_PROTO_VERSION) {
		rc = client_fail(c, -EPROTO,
				 "attach: kvringd at %s speaks protocol %u, this libkvring %s speaks %u: upgrade kvringd "
				 "or libkvring so both match",
				 c->sock_path, rep.version, KVR_VERSION, KVR_PROTO_VERSION);
	} else if ((size_t)n < offsetof(struct kvr_proto_rep, payload) || rep.magic != KVR_PROTO_MAGIC) {
		rc = client_fail(c, -EPROTO, "attach reply: malformed");
	} else if (rep.status < 0) {
		rep.reason[sizeof(rep.reason) - 1] = 0;
		rc = client_fail(c, rep.status, "attach refused: %s", rep.reason);
	} else if (nfds != want_fds || rep.payload_len != sizeof(c->info)) {
		rc = client_fail(c, -EPROTO, "attach reply: expected %u fds and attach info, got %u fds", want_fds, nfds);
	} else {
		memcpy(&c->info, rep.payload, sizeof(c->info));
		c->worker = rep.worker;
		c->ns = (kvr_key){.lo = c->info.ns_lo, .hi = c->info.ns_hi};
		return 0;
	}
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	return rc;
}

/*
 * Map what kvringd handed over: fds[0] the control segment, read-only (the actor table, the
 * directory, the other clients' places, where it reads zeros), fds[1] this client's own
 * area, read-write (its rings and its waiter; kvr_ctl.h): that of our client slot, worker
 * slot c->worker, or a scheduler's, after the workers' (KVR_EP_CLIENT).
 * Closes both fds.
 */
static int map_instance(struct kvr_client *c, int *fds, bool sched)
{
	unsigned slot = c->worker;
	int rc = kvr_segment_map(fds[0], KVR_SEG_CTL, 0, &c->ctl_seg);
	if (!rc && sched)
		slot += ((const struct kvr_ctl *)c->ctl_seg.base)->max_workers;
	if (!rc)
		rc = kvr_ctl_map_area(&c->ctl_seg, slot, fds[1], 1);
	if (!rc)
		rc = kvr_ctl_attach_client(&c->ctl_seg, slot, &c->ctl, &c->rings);
	close(fds[0]);
	close(fds[1]);
	if (rc) {
		kvr_segment_close(&c->ctl_seg);
		c->ctl = NULL;
		return client_fail(c, rc, "attach: cannot map the instance's control segment (client slot %u): %s", slot,
				   strerror(-rc));
	}
	return 0;
}

/* A client not attached yet (no socket, no segment), or NULL (attach_err set). */
static struct kvr_client *client_new(int64_t timeout_ms)
{
	struct kvr_client *c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(attach_err, sizeof(attach_err), "attach: out of memory");
		return NULL;
	}
	c->sock = -1;
	c->ctl_seg.fd = -1;
	c->timeout_ns = (timeout_ms > 0 ? timeout_ms : 10000) * 1000000ll;
	return c;
}

/* Connect c to kvringd's socket (NULL: the default configuration's). 0 or -errno, reason set. */
static int client_connect(struct kvr_client *c, const char *socket)
{
	const char *path = socket ? socket : KVR_CONFIG_DEFAULT_SOCKET;
	snprintf(c->sock_path, sizeof(c->sock_path), "%s", path);
	c->sock = kvr_proto_connect(path);
	return c->sock < 0 ? client_fail(c, c->sock, "cannot connect to %s: %s", path, strerror(-c->sock)) : 0;
}

/* Find our six rings in the control segment and claim our ends of them. 0 or -EPROTO, reason set. */
static int attach_rings(struct kvr_client *c)
{
	c->lk_req = ring_named(c, KVR_RING_LOOKUP_REQ);
	c->lk_rep = ring_named(c, KVR_RING_LOOKUP_REP);
	c->ld_req = ring_named(c, KVR_RING_LOAD_REQ);
	c->ld_rep = ring_named(c, KVR_RING_LOAD_REP);
	c->st_req = ring_named(c, KVR_RING_STORE_REQ);
	c->st_rep = ring_named(c, KVR_RING_STORE_REP);
	if (!c->lk_req || !c->lk_rep || !c->ld_req || !c->ld_rep || !c->st_req || !c->st_rep)
		return client_fail(c, -EPROTO, "attach: the instance has no rings for worker slot %u", c->worker);
	pid_t me = getpid();
	kvr_ring_claim_producer(c->lk_req, me);
	kvr_ring_claim_producer(c->ld_req, me);
	kvr_ring_claim_producer(c->st_req, me);
	kvr_ring_claim_consumer(c->lk_rep, me);
	kvr_ring_claim_consumer(c->ld_rep, me);
	kvr_ring_claim_consumer(c->st_rep, me);
	c->waiter = &kvr_ctl_area(c->ctl, c->worker)->waiter;
	return 0;
}

/* kvringd starts our loader and storer on attach (a DCP rank's storer: its group's gather
 * actor, once the group is complete): wait until they serve. 0, -EPIPE or -ETIMEDOUT, reason set. */
static int await_stages(struct kvr_client *c)
{
	int rc;
	uint64_t deadline = kvr_now_ns() + (uint64_t)c->timeout_ns;
	for (;;) {
		uint32_t ls = atomic_load(&kvr_ctl_actor(c->ctl, c->info.loader_actor)->state);
		uint32_t ss = atomic_load(&kvr_ctl_actor(c->ctl, c->info.storer_actor)->state);
		if (ls == KVR_ACTOR_READY && ss == KVR_ACTOR_READY)
			return 0;
		if (client_sup_gone(c))
			return client_fail(c, -EPIPE, "attach: %s", SUP_GONE_WHY);
		if (ls == KVR_ACTOR_FAILED || ss == KVR_ACTOR_FAILED || kvr_now_ns() >= deadline) {
			if (c->info.group_ranks > 1 && ss == KVR_ACTOR_FAILED)
				rc = client_fail(c, -EPIPE, "attach: the DCP group's gather actor FAILED (it kept crashing; "
						 "kvringd's log says why)");
			else if (c->info.group_ranks > 1)
				rc = client_fail(c, -ETIMEDOUT, "attach: loader %s, the DCP group's gather actor %s after %lld ms: "
						 "it starts once all %u ranks of the group attached", kvr_actor_state_name(ls),
						 kvr_actor_state_name(ss), (long long)(c->timeout_ns / 1000000),
						 c->info.group_ranks);
			else if (ls == KVR_ACTOR_FAILED || ss == KVR_ACTOR_FAILED)
				rc = client_fail(c, -EPIPE, "attach: our %s FAILED (it kept crashing; kvringd's log says why)",
						 ls == KVR_ACTOR_FAILED ? "loader" : "storer");
			else
				rc = client_fail(c, -ETIMEDOUT, "attach: loader %s, storer %s after %lld ms",
						 kvr_actor_state_name(ls), kvr_actor_state_name(ss),
						 (long long)(c->timeout_ns / 1000000));
			return rc;
		}
		/* kvringd wakes this word on every state change of the actor (supervisor/actors.c) */
		unsigned waiting = ls != KVR_ACTOR_READY ? c->info.loader_actor : c->info.storer_actor;
		uint32_t seen = waiting == c->info.loader_actor ? ls : ss;
		uint64_t now = kvr_now_ns(), left = deadline > now ? deadline - now : 0;
		(void)kvr_futex_wait(&kvr_ctl_actor(c->ctl, waiting)->state, seen,
				     (int64_t)(left < 50000000ull ? left : 50000000ull));
	}
}

KVR_EXPORT int kvr_attach(const struct kvr_attach_opts *opts, struct kvr_client **ret_client)
{
	attach_err[0] = 0;
	if (!opts || !opts->geometry || (!opts->cuda_kv && opts->kv_fd < 0) || !opts->kv_bytes || !ret_client) {
		snprintf(attach_err, sizeof(attach_err), "attach: missing geometry, KV memory or result pointer");
		return -EINVAL;
	}
	struct kvr_client *c = client_new(opts->timeout_ms);
	if (!c)
		return -ENOMEM;
	int rc;
	char err[KVR_GEOM_ERR_MAX];
	if (kvr_geometry_validate(opts->geometry, opts->kv_bytes, err, sizeof(err))) {
		rc = client_fail(c, -EINVAL, "geometry: %s", err);
		goto err;
	}
	c->geom = *opts->geometry;
	int kv_fd = opts->kv_fd;
	if (opts->cuda_kv && (kv_fd = rc = cuda_desc_create(c, opts)) < 0)
		goto err;

	if ((rc = client_connect(c, opts->socket))) {
		if (opts->cuda_kv)
			close(kv_fd);
		goto err;
	}
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_ATTACH,
				    .payload_len = sizeof(struct kvr_geometry) + sizeof(struct kvr_attach_engine)};
	memcpy(req.payload, opts->geometry, sizeof(struct kvr_geometry));
	struct kvr_attach_engine eng;
	if ((rc = engine_fill(&eng, opts->engine_id, opts->model_ns, c->err, sizeof(c->err)))) {
		if (opts->cuda_kv)
			close(kv_fd);
		goto err;
	}
	memcpy(req.payload + sizeof(struct kvr_geometry), &eng, sizeof(eng));
	rc = kvr_proto_send(c->sock, &req, sizeof(req), &kv_fd, 1);
	if (opts->cuda_kv)
		close(kv_fd); /* kvringd holds its own now */
	if (rc) {
		rc = client_fail(c, rc, "attach request: %s", strerror(-rc));
		goto err;
	}
	int fds[KVR_PROTO_MAX_FDS];
	if ((rc = recv_attach_reply(c, 2, fds)))
		goto err;
	/* The client gets only the control segment, read-only, and its own area of it; the
	 * arena and the slot table are the actors' business, and never handed to a worker. */
	if (c->worker >= KVR_CTL_MAX_WORKERS) {
		close(fds[0]);
		close(fds[1]);
		rc = client_fail(c, -EPROTO, "attach: worker slot %u out of range", c->worker);
		goto err;
	}
	if ((rc = map_instance(c, fds, false)))
		goto err;
	if (c->worker >= c->ctl->max_workers) {
		rc = client_fail(c, -EPROTO, "attach: worker slot %u out of range", c->worker);
		goto err;
	}
	/* Wire ids unique across the attaches of this worker slot (include/kvring/msg.h: the
	 * attach generation in bits 32..47): a reply its previous owner never read (it died with
	 * a request in flight) can still sit in a reply ring, and must never be taken for the
	 * answer to one of ours — its slots hold another prompt's KV. */
	c->next_wire = (uint64_t)(kvr_ctl_worker(c->ctl, c->worker)->generation & 0xffff) << 32;
	if ((rc = attach_rings(c)) || (rc = await_stages(c)))
		goto err;
	*ret_client = c;
	return 0;

err:
	snprintf(attach_err, sizeof(attach_err), "%s", c->err);
	client_free(c); /* nothing was submitted: nothing to fence */
	return rc;
}

KVR_EXPORT int kvr_attach_scheduler(const struct kvr_sched_opts *opts, struct kvr_client **ret_client)
{
	attach_err[0] = 0;
	if (!opts || !ret_client) {
		snprintf(attach_err, sizeof(attach_err), "attach: missing options or result pointer");
		return -EINVAL;
	}
	struct kvr_client *c = client_new(opts->timeout_ms);
	if (!c)
		return -ENOMEM;
	c->sched = true;
	int rc, fds[KVR_PROTO_MAX_FDS];
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION,
				    .op = KVR_OP_ATTACH_SCHED, .payload_len = sizeof(struct kvr_attach_engine)};
	struct kvr_attach_engine eng;
	if ((rc = engine_fill(&eng, opts->engine_id, opts->model_ns, c->err, sizeof(c->err))))
		goto err;
	memcpy(req.payload, &eng, sizeof(eng));
	if ((rc = client_connect(c, opts->socket)))
		goto err;
	if ((rc = kvr_proto_send(c->sock, &req, offsetof(struct kvr_proto_req, payload) + req.payload_len, NULL, 0))) {
		rc = client_fail(c, rc, "attach request: %s", strerror(-rc));
		goto err;
	}
	if ((rc = recv_attach_reply(c, 2, fds)))
		goto err;
	c->geom.block_tokens = c->info.block_tokens;
	if (c->worker >= KVR_CTL_MAX_SCHEDULERS) {
		close(fds[0]);
		close(fds[1]);
		rc = client_fail(c, -EPROTO, "attach: scheduler slot %u out of range", c->worker);
		goto err;
	}
	if ((rc = map_instance(c, fds, true)))
		goto err;
	if (!c->geom.block_tokens || c->worker >= c->ctl->max_schedulers ||
	    c->info.lookup_actor >= c->ctl->max_actors) {
		rc = client_fail(c, -EPROTO, "attach: scheduler slot %u or attach info out of range", c->worker);
		goto err;
	}
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), KVR_RING_SCHED_REQ, c->worker);
	int i = kvr_ctl_find_ring(c->ctl, name);
	c->lk_req = i < 0 ? NULL : kvr_ctl_ring(&c->rings, (unsigned)i);
	snprintf(name, sizeof(name), KVR_RING_SCHED_REP, c->worker);
	i = kvr_ctl_find_ring(c->ctl, name);
	c->lk_rep = i < 0 ? NULL : kvr_ctl_ring(&c->rings, (unsigned)i);
	if (!c->lk_req || !c->lk_rep) {
		rc = client_fail(c, -EPROTO, "attach: the instance has no rings for scheduler slot %u", c->worker);
		goto err;
	}
	struct kvr_worker_ent *se = kvr_ctl_sched(c->ctl, c->worker);
	c->next_wire = (uint64_t)(se->generation & 0xffff) << 32;
	kvr_ring_claim_producer(c->lk_req, getpid());
	kvr_ring_claim_consumer(c->lk_rep, getpid());
	c->waiter = &kvr_ctl_area(c->ctl, c->ctl->max_workers + c->worker)->waiter;
	*ret_client = c;
	return 0;
err:
	snprintf(attach_err, sizeof(attach_err), "%s", c->err);
	client_free(c); /* nothing was submitted: nothing to fence */
	return rc;
}

/*
 * The detach fence: ask kvringd to detach us and wait for its answer, which it gives once
 * our loader, storer and gather actor have exited (supervisor/attach.c answer_fence). With
 * kvringd gone, wait for those processes ourselves. 0, or -errno with c->err set.
 */
static int detach_fenced(struct kvr_client *c)
{
	uint64_t deadline = kvr_now_ns() + (uint64_t)c->timeout_ns;
	if (client_sup_gone(c))
		return await_actors_exit(c, deadline) ?
			       client_fail(c, -ETIMEDOUT, "detach: kvringd is gone and our loader or storer did not exit "
					   "within %lld ms", (long long)(c->timeout_ns / 1000000)) : 0;
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_DETACH};
	int rc = kvr_proto_send(c->sock, &req, offsetof(struct kvr_proto_req, payload), NULL, 0);
	if (rc)
		return client_fail(c, rc, "detach: request not sent: %s", strerror(-rc));
	for (;;) {
		uint64_t now = kvr_now_ns();
		struct pollfd p = {.fd = c->sock, .events = POLLIN};
		int n = now >= deadline ? 0 : poll(&p, 1, (int)((deadline - now + 999999) / 1000000));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return client_fail(c, -ETIMEDOUT, "detach: kvringd did not confirm within %lld ms that our loader and "
					   "storer stopped (kvringd's log says which still runs); our KV memory may still be "
					   "read or written", (long long)(c->timeout_ns / 1000000));
		struct kvr_proto_rep rep;
		ssize_t got = kvr_proto_recv(c->sock, &rep, sizeof(rep), NULL, 0, NULL);
		if (got <= 0) {
			/* kvringd died meanwhile: its actors die with it */
			c->sup_gone = true;
			return await_actors_exit(c, deadline) ?
				       client_fail(c, -ETIMEDOUT, "detach: kvringd died and our loader or storer did not exit "
						   "within %lld ms", (long long)(c->timeout_ns / 1000000)) : 0;
		}
		if ((size_t)got < offsetof(struct kvr_proto_rep, payload) || rep.magic != KVR_PROTO_MAGIC)
			return client_fail(c, -EPROTO, "detach: malformed answer");
		if (rep.status < 0) {
			rep.reason[sizeof(rep.reason) - 1] = 0;
			return client_fail(c, rep.status, "detach refused: %s", rep.reason);
		}
		return 0;
	}
}

/* Close and free a client: its socket (kvringd sees the close: releases our leases, stops
 * our actors), its mappings, its memory. No fence: what kvr_detach adds. */
static void client_free(struct kvr_client *c)
{
	if (c->sock >= 0)
		close(c->sock); /* kvringd sees the close: releases our leases, stops our actors */
	kvr_segment_close(&c->ctl_seg);
	for (unsigned i = 0; i < MEMO_MAX; i++)
		free(c->memo[i].slots);
	for (unsigned i = 0; i < c->n_pend; i++)
		client_pending_free(&c->pend[i]);
	free(c->pend);
	for (unsigned i = 0; i < c->n_done; i++)
		free(c->done_failed[i]);
	for (unsigned i = 0; i < c->n_handed; i++)
		free(c->handed[i]);
	free(c->handed);
	free(c->done);
	free(c->done_failed);
	free(c->keys);
	if (c->cuda_map)
		munmap(c->cuda_map, c->cuda_map_len);
	free(c->cuda_ev_owner);
	free(c);
}

KVR_EXPORT int kvr_detach(struct kvr_client *c)
{
	if (!c)
		return 0;
	int rc = 0;
	if (c->sock >= 0 && c->ctl && !c->sched) {
		rc = detach_fenced(c);
		if (rc)
			snprintf(attach_err, sizeof(attach_err), "%s", c->err); /* c is gone: kvr_last_error(NULL) */
	}
	client_free(c);
	return rc;
}
