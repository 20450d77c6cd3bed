/* libkvring: attach to kvringd, hash prompts into block keys, submit lookups/loads/stores over the rings. */
#include <kvring/kvring.h>
#include <kvring/msg.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvr_config.h"
#include "kvr_ctl.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_grow.h"
#include "kvr_keys.h"
#include "kvr_list.h"
#include "kvr_proto.h"
#include "kvr_ring.h"
#include "kvr_segment.h"
#include "kvr_time.h"

/* The public API (kvring.h): the only symbols libkvring exports. The library is built with
 * -fvisibility=hidden and client/libkvring.map; every name marked here is listed there. */
#define KVR_EXPORT __attribute__((visibility("default")))

/*
 * Wire request ids carry the generation of the actor the client addressed in their top
 * 16 bits, then the worker slot's attach generation (16 bits), then a sequence (32 bits).
 * An actor answers a request of another generation with -ESTALE and does no work for it,
 * so a request submitted to an actor that restarted is never executed by its successor
 * behind the client's back (the client has already failed it). The attach generation makes
 * a reply left in a reply ring by the slot's previous owner unmatchable.
 */
#define MEMO_MAX 1024          /* lookups remembered for a following load */
#define WAIT_SLICE_NS 20000000 /* re-check actor liveness this often while waiting */
#define SUP_CHECK_NS 10000000  /* look at the attach socket at most this often (kvringd alive?) */
#define DEAD_FENCE_NS 5000000000ull /* kvringd died: wait this long at most for its actors to exit */

struct memo {
	uint64_t req_id;
	uint32_t n;
	bool lease;                 /* from kvr_lease_take: its load's completion ends our part of it */
	struct kvr_msg_slot *slots;
};

struct pending {
	uint64_t wire_id;
	uint64_t req_id;
	uint32_t op;       /* enum kvr_op */
	uint32_t actor;    /* actor index it was sent to */
	uint32_t gen;      /* that actor's generation at submit */
	uint32_t n_blocks;
	uint32_t *blocks;  /* engine block ids, to report them all when the actor dies */
	uint64_t submit_ns;
	/* reply assembly */
	bool have_result;
	struct kvr_completion done;
	uint32_t *failed;
	uint32_t failed_total, failed_got;
	uint32_t ev_plus1; /* CUDA store: its event-table entry + 1; 0 = none */
	uint32_t cancel_plus1; /* cancelled: its entry in our area's cancel table + 1; 0 = none */
	bool lease;        /* a load of a lease (req_id is the lease id): report LEASE_DONE */
};

struct kvr_client {
	int sock;                 /* the attach connection, open while attached */
	bool sup_gone;            /* it closed: kvringd exited (or was killed); every call fails */
	uint64_t sup_checked_ns;  /* when the socket was last looked at */
	struct kvr_segment ctl_seg;
	struct kvr_ctl *ctl;
	struct kvr_ctl_rings rings; /* our views of its rings (we use our six) */
	struct kvr_attach_info info;
	struct kvr_geometry geom;
	kvr_key ns;
	bool sched;               /* a scheduler client: lookups and leases only */
	unsigned worker;          /* worker slot (scheduler: scheduler slot) */
	int64_t timeout_ns;
	struct kvr_ring *lk_req, *lk_rep, *ld_req, *ld_rep, *st_req, *st_rep;
	struct kvr_waiter *waiter;
	uint64_t next_wire;

	struct memo memo[MEMO_MAX];
	unsigned memo_next;

	struct pending *pend;
	unsigned n_pend, cap_pend;

	struct kvr_completion *done;      /* completed, not yet polled */
	uint32_t **done_failed;           /* their failed-id arrays (owned) */
	unsigned n_done, cap_done;
	uint32_t **handed;                /* failed arrays handed out by the last poll */
	unsigned n_handed;

	kvr_key *keys;                    /* scratch */
	size_t cap_keys;

	/* CUDA KV memory only (docs/cuda.md): our writable view of the KV descriptor's
	 * store-event table, and which store's wire id holds each entry (0 = free). */
	void *cuda_map;
	size_t cuda_map_len;
	struct kvr_cuda_event *cuda_ev;
	uint64_t *cuda_ev_owner;

	uint64_t cancel_owner[KVR_AREA_CANCEL_MAX]; /* wire id each cancel-table entry holds, 0 = free */

	char err[256];
};

static int fail(struct kvr_client *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void client_free(struct kvr_client *c);
static int fail(struct kvr_client *c, int rc, const char *fmt, ...)
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

static uint32_t actor_gen(const struct kvr_client *c, unsigned actor)
{
	return atomic_load(&kvr_ctl_actor(c->ctl, actor)->generation);
}

static bool actor_alive(const struct kvr_client *c, unsigned actor, uint32_t gen)
{
	const struct kvr_actor_ent *e = kvr_ctl_actor(c->ctl, actor);
	return atomic_load(&e->generation) == gen && atomic_load(&e->state) == KVR_ACTOR_READY;
}

/* Whether the incarnation `gen` of an actor may still run, and so still copy for a request
 * sent to it: a stopping actor finishes what it is copying before it exits. Only once it
 * is gone (its slot restarted, backing off, given up, or stopped with no process) are its
 * requests failed — the fence of an actor's death (docs/api.md). */
static bool actor_may_run(const struct kvr_client *c, unsigned actor, uint32_t gen)
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
static bool sup_gone(struct kvr_client *c)
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

#define SUP_GONE_WHY "kvringd is gone (the attach socket closed): detach and attach again"

static uint64_t wire_id(struct kvr_client *c, uint32_t gen)
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
		return fail(c, -EINVAL, "cuda_kv: %u ranges (must be 1..%u)", k->n_ranges, KVR_CUDA_MAX_RANGES);
	for (uint32_t i = 0; i < k->n_ranges; i++) {
		const struct kvr_cuda_kv_range *r = &k->ranges[i];
		uint64_t end, aend;
		if (!r->bytes || __builtin_add_overflow(r->kv_offset, r->bytes, &end) || end > o->kv_bytes ||
		    __builtin_add_overflow(r->alloc_offset, r->bytes, &aend) ||
		    (i && r->kv_offset < k->ranges[i - 1].kv_offset + k->ranges[i - 1].bytes))
			return fail(c, -EINVAL, "cuda_kv range %u [%llu, +%llu): empty, beyond kv_bytes %llu, or not "
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
		return fail(c, -ENOMEM, "out of memory");
	int fd = memfd_create("kvring-cuda-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING), rc;
	if (fd < 0)
		return fail(c, -errno, "cuda_kv: memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)fd_bytes) < 0) {
		rc = fail(c, -errno, "cuda_kv: ftruncate: %s", strerror(errno));
		goto fail;
	}
	void *map = mmap(NULL, (size_t)d.desc_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		rc = fail(c, -errno, "cuda_kv: mmap: %s", strerror(errno));
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
		rc = fail(c, -errno, "cuda_kv: sealing the descriptor: %s", strerror(errno));
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
		return fail(c, n ? (int)n : -ECONNRESET, "attach reply: %s", n ? strerror((int)-n) : "connection closed");
	if ((size_t)n < offsetof(struct kvr_proto_rep, payload) || rep.magic != KVR_PROTO_MAGIC ||
	    rep.version != KVR_PROTO_VERSION) {
		rc = fail(c, -EPROTO, "attach reply: malformed");
	} else if (rep.status < 0) {
		rep.reason[sizeof(rep.reason) - 1] = 0;
		rc = fail(c, rep.status, "attach refused: %s", rep.reason);
	} else if (nfds != want_fds || rep.payload_len != sizeof(c->info)) {
		rc = fail(c, -EPROTO, "attach reply: expected %u fds and attach info, got %u fds", want_fds, nfds);
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
		return fail(c, rc, "attach: cannot map the instance's control segment (client slot %u): %s", slot,
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
	c->sock = kvr_proto_connect(path);
	return c->sock < 0 ? fail(c, c->sock, "cannot connect to %s: %s", path, strerror(-c->sock)) : 0;
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
		rc = fail(c, -EINVAL, "geometry: %s", err);
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
		rc = fail(c, rc, "attach request: %s", strerror(-rc));
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
		rc = fail(c, -EPROTO, "attach: worker slot %u out of range", c->worker);
		goto err;
	}
	if ((rc = map_instance(c, fds, false)))
		goto err;
	if (c->worker >= c->ctl->max_workers) {
		rc = fail(c, -EPROTO, "attach: worker slot %u out of range", c->worker);
		goto err;
	}
	/* Wire ids unique across the attaches of this worker slot: a reply its previous owner
	 * never read (it died with a request in flight) can still sit in a reply ring, and must
	 * never be taken for the answer to one of ours — its slots hold another prompt's KV. */
	c->next_wire = (uint64_t)(kvr_ctl_worker(c->ctl, c->worker)->generation & 0xffff) << 32;
	c->lk_req = ring_named(c, "lookup.req.%u");
	c->lk_rep = ring_named(c, "lookup.rep.%u");
	c->ld_req = ring_named(c, "load.req.%u");
	c->ld_rep = ring_named(c, "load.rep.%u");
	c->st_req = ring_named(c, "store.req.%u");
	c->st_rep = ring_named(c, "store.rep.%u");
	if (!c->lk_req || !c->lk_rep || !c->ld_req || !c->ld_rep || !c->st_req || !c->st_rep) {
		rc = fail(c, -EPROTO, "attach: the instance has no rings for worker slot %u", c->worker);
		goto err;
	}
	pid_t me = getpid();
	kvr_ring_claim_producer(c->lk_req, me);
	kvr_ring_claim_producer(c->ld_req, me);
	kvr_ring_claim_producer(c->st_req, me);
	kvr_ring_claim_consumer(c->lk_rep, me);
	kvr_ring_claim_consumer(c->ld_rep, me);
	kvr_ring_claim_consumer(c->st_rep, me);
	c->waiter = &kvr_ctl_area(c->ctl, c->worker)->waiter;

	/* kvringd starts our loader and storer on attach (a DCP rank's storer: its group's gather
	 * actor, once the group is complete): wait until they serve. */
	uint64_t deadline = kvr_now_ns() + (uint64_t)c->timeout_ns;
	for (;;) {
		uint32_t ls = atomic_load(&kvr_ctl_actor(c->ctl, c->info.loader_actor)->state);
		uint32_t ss = atomic_load(&kvr_ctl_actor(c->ctl, c->info.storer_actor)->state);
		if (ls == KVR_ACTOR_READY && ss == KVR_ACTOR_READY)
			break;
		if (sup_gone(c)) {
			rc = fail(c, -EPIPE, "attach: %s", SUP_GONE_WHY);
			goto err;
		}
		if (ls == KVR_ACTOR_FAILED || ss == KVR_ACTOR_FAILED || kvr_now_ns() >= deadline) {
			if (c->info.group_ranks > 1 && ss == KVR_ACTOR_FAILED)
				rc = fail(c, -EPIPE, "attach: the DCP group's gather actor FAILED (it kept crashing; "
					  "kvringd's log says why)");
			else if (c->info.group_ranks > 1)
				rc = fail(c, -ETIMEDOUT, "attach: loader %s, the DCP group's gather actor %s after %lld ms: "
					  "it starts once all %u ranks of the group attached", kvr_actor_state_name(ls),
					  kvr_actor_state_name(ss), (long long)(c->timeout_ns / 1000000),
					  c->info.group_ranks);
			else if (ls == KVR_ACTOR_FAILED || ss == KVR_ACTOR_FAILED)
				rc = fail(c, -EPIPE, "attach: our %s FAILED (it kept crashing; kvringd's log says why)",
					  ls == KVR_ACTOR_FAILED ? "loader" : "storer");
			else
				rc = fail(c, -ETIMEDOUT, "attach: loader %s, storer %s after %lld ms",
					  kvr_actor_state_name(ls), kvr_actor_state_name(ss),
					  (long long)(c->timeout_ns / 1000000));
			goto err;
		}
		/* kvringd wakes this word on every state change of the actor (supervisor/actors.c) */
		unsigned waiting = ls != KVR_ACTOR_READY ? c->info.loader_actor : c->info.storer_actor;
		uint32_t seen = waiting == c->info.loader_actor ? ls : ss;
		uint64_t now = kvr_now_ns(), left = deadline > now ? deadline - now : 0;
		(void)kvr_futex_wait(&kvr_ctl_actor(c->ctl, waiting)->state, seen,
				     (int64_t)(left < 50000000ull ? left : 50000000ull));
	}
	*ret_client = c;
	return 0;

err:
	snprintf(attach_err, sizeof(attach_err), "%s", c->err);
	client_free(c); /* nothing was submitted: nothing to fence */
	return rc;
}

/* A CUDA store's event-table entry is free again once the store completed or failed. */
static void ev_release(struct kvr_client *c, const struct pending *p)
{
	if (p->ev_plus1 && c->cuda_ev_owner[p->ev_plus1 - 1] == p->wire_id)
		c->cuda_ev_owner[p->ev_plus1 - 1] = 0;
}

/* A cancelled request completed: its cancel-table entry is free again. */
static void cancel_release(struct kvr_client *c, const struct pending *p)
{
	if (!p->cancel_plus1)
		return;
	unsigned e = p->cancel_plus1 - 1;
	if (c->cancel_owner[e] == p->wire_id) {
		atomic_store_explicit(&kvr_ctl_area(c->ctl, c->worker)->cancel[e], 0, memory_order_release);
		c->cancel_owner[e] = 0;
	}
}

static void pending_free(struct pending *p)
{
	free(p->blocks);
	free(p->failed);
}

/*
 * The detach fence: ask kvringd to detach us and wait for its answer, which it gives once
 * our loader, storer and gather actor have exited (supervisor/server.c answer_fence). With
 * kvringd gone, wait for those processes ourselves. 0, or -errno with c->err set.
 */
static int detach_fenced(struct kvr_client *c)
{
	uint64_t deadline = kvr_now_ns() + (uint64_t)c->timeout_ns;
	if (sup_gone(c))
		return await_actors_exit(c, deadline) ?
			       fail(c, -ETIMEDOUT, "detach: kvringd is gone and our loader or storer did not exit "
				    "within %lld ms", (long long)(c->timeout_ns / 1000000)) : 0;
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_DETACH};
	int rc = kvr_proto_send(c->sock, &req, offsetof(struct kvr_proto_req, payload), NULL, 0);
	if (rc)
		return fail(c, rc, "detach: request not sent: %s", strerror(-rc));
	for (;;) {
		uint64_t now = kvr_now_ns();
		struct pollfd p = {.fd = c->sock, .events = POLLIN};
		int n = now >= deadline ? 0 : poll(&p, 1, (int)((deadline - now + 999999) / 1000000));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return fail(c, -ETIMEDOUT, "detach: kvringd did not confirm within %lld ms that our loader and "
				    "storer stopped (kvringd's log says which still runs); our KV memory may still be "
				    "read or written", (long long)(c->timeout_ns / 1000000));
		struct kvr_proto_rep rep;
		ssize_t got = kvr_proto_recv(c->sock, &rep, sizeof(rep), NULL, 0, NULL);
		if (got <= 0) {
			/* kvringd died meanwhile: its actors die with it */
			c->sup_gone = true;
			return await_actors_exit(c, deadline) ?
				       fail(c, -ETIMEDOUT, "detach: kvringd died and our loader or storer did not exit "
					    "within %lld ms", (long long)(c->timeout_ns / 1000000)) : 0;
		}
		if ((size_t)got < offsetof(struct kvr_proto_rep, payload) || rep.magic != KVR_PROTO_MAGIC)
			return fail(c, -EPROTO, "detach: malformed answer");
		if (rep.status < 0) {
			rep.reason[sizeof(rep.reason) - 1] = 0;
			return fail(c, rep.status, "detach refused: %s", rep.reason);
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
		pending_free(&c->pend[i]);
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

/* ---- completions ------------------------------------------------------------------------ */

static int push_done(struct kvr_client *c, const struct kvr_completion *d, uint32_t *failed)
{
	unsigned cap_failed = c->cap_done; /* done and done_failed grow together */
	if (KVR_GROW(c->done_failed, cap_failed, c->n_done + 1, 64) || KVR_GROW(c->done, c->cap_done, c->n_done + 1, 64))
		return -ENOMEM;
	c->done[c->n_done] = *d;
	c->done_failed[c->n_done] = failed;
	c->n_done++;
	return 0;
}

static void remove_pending(struct kvr_client *c, unsigned i)
{
	c->pend[i] = c->pend[--c->n_pend];
}

static int find_pending(struct kvr_client *c, uint64_t wire_id)
{
	for (unsigned i = 0; i < c->n_pend; i++)
		if (c->pend[i].wire_id == wire_id)
			return (int)i;
	return -1;
}

static void lease_done(struct kvr_client *c, uint64_t lease_id, int status);

static void finish_pending(struct kvr_client *c, unsigned i)
{
	struct pending *p = &c->pend[i];
	if (p->lease && !c->sup_gone)
		lease_done(c, p->req_id, p->done.status);
	p->done.diag.total_ns = kvr_now_ns() - p->submit_ns;
	p->done.n_failed = p->failed_total;
	p->done.failed = NULL;
	if (push_done(c, &p->done, p->failed) == 0)
		p->failed = NULL;
	ev_release(c, p);
	cancel_release(c, p);
	free(p->blocks);
	free(p->failed);
	remove_pending(c, i);
}

/* Complete pending request i as failed with `status`, every one of its blocks listed. */
static void fail_pending(struct kvr_client *c, unsigned i, int status)
{
	struct pending *p = &c->pend[i];
	p->done.status = status;
	p->done.n_blocks = p->n_blocks;
	free(p->failed);
	p->failed = p->blocks;
	p->blocks = NULL;
	p->failed_total = p->n_blocks;
	finish_pending(c, i);
}

/* Fail every request addressed to an actor that restarted or died, or to any actor once
 * kvringd is gone: all their blocks. */
static void reap_dead(struct kvr_client *c)
{
	bool gone = sup_gone(c);
	for (unsigned i = 0; i < c->n_pend;) {
		struct pending *p = &c->pend[i];
		if (!gone && actor_may_run(c, p->actor, p->gen))
			i++;
		else
			fail_pending(c, i, -EPIPE);
	}
}

/* One message from a loader or storer reply ring. Unknown wire ids (a request already
 * failed because its actor restarted) are dropped. */
static void handle_reply(struct kvr_client *c, struct kvr_ring *ring, const struct kvr_msg *m)
{
	int i = find_pending(c, m->hdr.req_id);
	if (i < 0) {
		atomic_fetch_add_explicit(&ring->shm->rejected, 1, memory_order_relaxed);
		return;
	}
	struct pending *p = &c->pend[i];
	if (!p->have_result) {
		if (p->op == KVR_OP_LOAD_DONE) {
			struct kvr_msg_load_done r;
			if (kvr_msg_decode_load_done(m, &r))
				goto bad;
			p->done.status = r.status;
			p->done.n_blocks = r.n_blocks;
			p->failed_total = r.n_failed;
			p->done.diag.bytes = r.bytes;
			p->done.diag.copies = r.copies;
			p->done.diag.runs = r.runs;
			p->done.diag.copy_ns = r.copy_ns;
			p->done.diag.queue_ns = (uint64_t)r.queue_us * 1000;
			p->done.diag.l1_hits = r.n_blocks - r.n_failed;
		} else {
			struct kvr_msg_store_done r;
			if (kvr_msg_decode_store_done(m, &r))
				goto bad;
			p->done.status = r.status;
			p->done.n_blocks = r.n_blocks;
			p->done.n_stored = r.n_stored;
			p->done.n_present = r.n_present;
			p->failed_total = r.n_failed;
			p->done.diag.bytes = r.bytes;
			p->done.diag.copies = r.copies;
			p->done.diag.copy_ns = r.copy_ns;
			p->done.diag.queue_ns = (uint64_t)r.queue_us * 1000;
		}
		/* -ESTALE: a new incarnation answered a request its dead predecessor had (it did
		 * nothing): that is the dead actor's failure, reported as such. */
		if (p->done.status == -ESTALE)
			p->done.status = -EPIPE;
		p->have_result = true;
		if (p->failed_total) {
			p->failed = calloc(p->failed_total, sizeof(uint32_t));
			if (!p->failed)
				p->failed_total = 0;
		}
		if (!p->failed_total)
			finish_pending(c, (unsigned)i);
		return;
	}
	struct kvr_msg_list_hdr h;
	if (kvr_msg_decode_list(m, KVR_MSG_BLOCKS, &h) || h.total != p->failed_total)
		goto bad;
	kvr_msg_list_items(m, p->failed);
	p->failed_got += h.count;
	if (!(m->hdr.flags & KVR_MSGF_MORE))
		finish_pending(c, (unsigned)i);
	return;
bad:
	/* A malformed reply: count it; the request fails as a whole (never trusted). */
	atomic_fetch_add_explicit(&ring->shm->rejected, 1, memory_order_relaxed);
	fail_pending(c, (unsigned)i, -EPROTO);
}

static void drain_replies(struct kvr_client *c)
{
	struct kvr_msg m[32];
	struct kvr_ring *rings[2] = {c->ld_rep, c->st_rep};
	for (int r = 0; r < 2; r++) {
		unsigned n;
		if (!rings[r])
			continue; /* a scheduler client */
		while ((n = kvr_ring_dequeue_burst(rings[r], m, 32)) > 0)
			for (unsigned k = 0; k < n; k++)
				handle_reply(c, rings[r], &m[k]);
	}
}

KVR_EXPORT int kvr_poll(struct kvr_client *c, struct kvr_completion *ret, unsigned max)
{
	if (!c || (!ret && max))
		return -EINVAL;
	for (unsigned i = 0; i < c->n_handed; i++)
		free(c->handed[i]);
	c->n_handed = 0;
	drain_replies(c);
	reap_dead(c);
	unsigned n = c->n_done < max ? c->n_done : max;
	if (n) {
		uint32_t **h = realloc(c->handed, n * sizeof(*h));
		if (!h)
			return -ENOMEM;
		c->handed = h;
	}
	for (unsigned i = 0; i < n; i++) {
		ret[i] = c->done[i];
		ret[i].failed = c->done_failed[i];
		c->handed[c->n_handed++] = c->done_failed[i];
	}
	if (n) {
		memmove(c->done, c->done + n, (c->n_done - n) * sizeof(*c->done));
		memmove(c->done_failed, c->done_failed + n, (c->n_done - n) * sizeof(*c->done_failed));
		c->n_done -= n;
	}
	/* kvringd is gone and every completion (the failed requests) has been handed out:
	 * nothing will ever complete again, so say so instead of returning 0 forever */
	if (!n && !c->n_done && c->sup_gone)
		return fail(c, -EPIPE, "%s", SUP_GONE_WHY);
	return (int)n;
}

KVR_EXPORT int kvr_wait(struct kvr_client *c, struct kvr_completion *ret, unsigned max, int64_t timeout_ms)
{
	uint64_t deadline = kvr_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
	for (;;) {
		int n = kvr_poll(c, ret, max);
		if (n != 0 || !max)
			return n;
		uint64_t now = kvr_now_ns();
		if (now >= deadline)
			return 0;
		uint32_t seen = kvr_waiter_prepare(c->waiter);
		if (c->sched) {
			kvr_waiter_finish(c->waiter);
			return 0; /* nothing ever completes on a scheduler client */
		}
		if (kvr_ring_count(c->ld_rep) || kvr_ring_count(c->st_rep)) {
			kvr_waiter_finish(c->waiter);
			continue;
		}
		uint64_t left = deadline - now;
		int rc = kvr_waiter_wait(c->waiter, seen, (int64_t)(left < WAIT_SLICE_NS ? left : WAIT_SLICE_NS));
		kvr_waiter_finish(c->waiter);
		if (rc == -EINTR)
			return -EINTR;
	}
}

/* ---- sending ----------------------------------------------------------------------------- */

/* Enqueue one message; while the ring is full keep draining our reply rings (a loader
 * blocked on a full reply ring must not deadlock against us) until the deadline. */
static int send_msg(void *ctx, struct kvr_ring *r, const struct kvr_msg *m, uint64_t deadline)
{
	struct kvr_client *c = ctx;
	for (;;) {
		int rc = kvr_ring_try_enqueue(r, m);
		if (rc == 0)
			return 0;
		drain_replies(c);
		if (sup_gone(c))
			return -EPIPE;
		uint64_t now = kvr_now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		rc = kvr_ring_enqueue(r, m, 1000000);
		if (rc == 0)
			return 0;
		if (rc != -ETIMEDOUT)
			return rc;
	}
}

static int send_list(struct kvr_client *c, struct kvr_ring *r, unsigned type, uint64_t wire, uint8_t lane,
		     uint8_t flags, const void *items, uint32_t total, uint64_t deadline)
{
	return kvr_list_send_ex(r, type, wire, lane, flags, items, total, deadline, send_msg, c);
}

static int hash_keys(struct kvr_client *c, const uint32_t *tokens, size_t n_tokens, const void *extra,
		     size_t extra_len, size_t *ret_n)
{
	size_t want = n_tokens / c->geom.block_tokens;
	if (want > KVR_MSG_MAX_LIST)
		return fail(c, -E2BIG, "prompt of %zu tokens has more than %u blocks", n_tokens, KVR_MSG_MAX_LIST);
	if (want > c->cap_keys) {
		kvr_key *k = realloc(c->keys, want * sizeof(*k));
		if (!k)
			return fail(c, -ENOMEM, "out of memory");
		c->keys = k;
		c->cap_keys = want;
	}
	int n = kvr_keys_chain(c->ns, tokens, n_tokens, c->geom.block_tokens, extra, extra_len, c->keys, want);
	if (n < 0)
		return fail(c, n, "hashing the prompt: %s", strerror(-n));
	*ret_n = (size_t)n;
	return 0;
}

/* ---- lookup ------------------------------------------------------------------------------ */

static struct memo *memo_find(struct kvr_client *c, uint64_t req_id)
{
	for (unsigned i = 0; i < MEMO_MAX; i++)
		if (c->memo[i].slots && c->memo[i].req_id == req_id)
			return &c->memo[i];
	return NULL;
}

/* The next message answering `wire` on the lookup reply ring (a scheduler's: its sched.rep).
 * Stale answers to earlier, timed-out requests are skipped. -EPIPE when kvringd or the lookup
 * actor is gone, -ETIMEDOUT at the deadline (kvr_last_error says which, prefixed by what). */
static int await_reply(struct kvr_client *c, const char *what, unsigned actor, uint32_t gen, uint64_t wire,
		       uint64_t deadline, struct kvr_msg *ret)
{
	for (;;) {
		int rc = kvr_ring_dequeue(c->lk_rep, ret, WAIT_SLICE_NS);
		if (rc == 0 && ret->hdr.req_id == wire)
			return 0;
		if (rc == 0)
			continue;
		if (rc != -ETIMEDOUT && rc != -EINTR)
			return fail(c, rc, "%s: %s", what, strerror(-rc));
		if (sup_gone(c))
			return fail(c, -EPIPE, "%s: %s; treat as a miss", what, SUP_GONE_WHY);
		if (!actor_alive(c, actor, gen))
			return fail(c, -EPIPE, "%s: the lookup actor restarted; treat as a miss", what);
		if (kvr_now_ns() >= deadline)
			return fail(c, -ETIMEDOUT, "%s: no reply within %lld ms", what, (long long)(c->timeout_ns / 1000000));
	}
}

/* Wait for the LOOKUP_REP (+ SLOTS) answering `wire` on the lookup reply ring (a lookup or
 * a LEASE_TAKE). Stale replies of an earlier, timed-out request are skipped. *ret_slots:
 * r->matched slots (NULL when none), the caller's to free. */
static int await_slots(struct kvr_client *c, const char *what, unsigned actor, uint32_t gen, uint64_t wire,
		       uint64_t deadline, uint32_t max_matched, struct kvr_msg_lookup_rep *r,
		       struct kvr_msg_slot **ret_slots)
{
	struct kvr_msg_slot *slots = NULL;
	uint32_t got = 0;
	bool have = false;
	int rc;
	*ret_slots = NULL;
	memset(r, 0, sizeof(*r));
	for (;;) {
		struct kvr_msg m;
		if ((rc = await_reply(c, what, actor, gen, wire, deadline, &m)))
			goto out;
		if (!have) {
			if (kvr_msg_decode_lookup_rep(&m, r)) {
				rc = fail(c, -EPROTO, "%s: malformed reply", what);
				goto out;
			}
			have = true;
			if (r->status == -ESTALE) { /* a new incarnation answered its dead predecessor's request */
				rc = fail(c, -EPIPE, "%s: the lookup actor restarted; treat as a miss", what);
				goto out;
			}
			if (r->status == -ENOENT) {
				rc = fail(c, -ENOENT, "%s: no such lease (it ended, or the lookup actor restarted): "
					  "compute the blocks", what);
				goto out;
			}
			if (r->status < 0) {
				rc = fail(c, r->status, "%s: %s", what, strerror(-r->status));
				goto out;
			}
			if (r->matched > max_matched || r->lane != c->info.lane) {
				rc = fail(c, -EPROTO, "%s: reply does not match the request", what);
				goto out;
			}
			if (!r->matched)
				break;
			slots = calloc(r->matched, sizeof(*slots));
			if (!slots) {
				rc = fail(c, -ENOMEM, "out of memory");
				goto out;
			}
			continue;
		}
		struct kvr_msg_list_hdr h;
		if (kvr_msg_decode_list(&m, KVR_MSG_SLOTS, &h) || h.total != r->matched) {
			rc = fail(c, -EPROTO, "%s: malformed slot list", what);
			goto out;
		}
		kvr_msg_list_items(&m, slots);
		got += h.count;
		if (!(m.hdr.flags & KVR_MSGF_MORE))
			break;
	}
	if (r->matched && got != r->matched) {
		rc = fail(c, -EPROTO, "%s: slot list incomplete", what);
		goto out;
	}
	*ret_slots = slots;
	slots = NULL;
	rc = 0;
out:
	free(slots);
	return rc;
}

/* Remember matched slots under req_id for a following kvr_load (takes slots). */
static void memo_put(struct kvr_client *c, uint64_t req_id, uint32_t n, bool lease, struct kvr_msg_slot *slots)
{
	struct memo *mm = &c->memo[c->memo_next++ % MEMO_MAX];
	free(mm->slots);
	*mm = (struct memo){.req_id = req_id, .n = n, .lease = lease, .slots = slots};
}

static void memo_forget(struct kvr_client *c, uint64_t req_id)
{
	struct memo *old = memo_find(c, req_id);
	if (old) {
		free(old->slots);
		old->slots = NULL;
	}
}

/* The lookup actor is ours to ask: 0 and its generation, or -EPIPE (kvr_last_error set). */
static int lookup_actor_gen(struct kvr_client *c, const char *what, uint32_t *ret_gen)
{
	unsigned actor = c->info.lookup_actor;
	uint32_t gen = actor_gen(c, actor);
	if (sup_gone(c))
		return fail(c, -EPIPE, "%s: %s", what, SUP_GONE_WHY);
	if (!actor_alive(c, actor, gen))
		return fail(c, -EPIPE, "%s: the lookup actor is not running (state %s)", what,
			    kvr_actor_state_name(atomic_load(&kvr_ctl_actor(c->ctl, actor)->state)));
	*ret_gen = gen;
	return 0;
}

KVR_EXPORT int kvr_lookup(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens,
			  const void *extra, size_t extra_len, struct kvr_lookup_result *ret)
{
	if (!c || !ret || (!tokens && n_tokens) || (!extra && extra_len))
		return fail(c, -EINVAL, "lookup: NULL argument");
	if (c->sched)
		return fail(c, -EINVAL, "lookup: a scheduler client leases (kvr_lease), it does not load");
	memset(ret, 0, sizeof(*ret));
	uint64_t t0 = kvr_now_ns();
	size_t nk;
	int rc = hash_keys(c, tokens, n_tokens, extra, extra_len, &nk);
	if (rc)
		return rc;
	uint64_t t1 = kvr_now_ns();
	ret->hash_ns = t1 - t0;
	memo_forget(c, req_id);
	if (nk == 0)
		return 0;

	uint32_t gen;
	if ((rc = lookup_actor_gen(c, "lookup", &gen)))
		return rc;
	uint64_t wire = wire_id(c, gen), deadline = t1 + (uint64_t)c->timeout_ns;
	_Static_assert(sizeof(kvr_key) == sizeof(struct kvr_msg_key), "key wire format");
	rc = send_list(c, c->lk_req, KVR_MSG_LOOKUP, wire, (uint8_t)c->info.lane, 0, c->keys, (uint32_t)nk, deadline);
	if (rc)
		return fail(c, rc, "lookup: sending the request: %s", strerror(-rc));
	struct kvr_msg_lookup_rep r;
	struct kvr_msg_slot *slots;
	if ((rc = await_slots(c, "lookup", c->info.lookup_actor, gen, wire, deadline, (uint32_t)nk, &r, &slots)))
		return rc;
	ret->matched_blocks = r.matched;
	ret->l2_blocks = r.promoted;
	ret->matched_tokens = r.matched * c->geom.block_tokens;
	ret->index_ns = r.index_ns;
	ret->roundtrip_ns = kvr_now_ns() - t1;
	if (r.matched)
		memo_put(c, req_id, r.matched, false, slots);
	return 0;
}

/* ---- leases (docs/architecture.md: scheduler and workers) ---------------------------------- */

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
		rc = fail(c, rc, "attach request: %s", strerror(-rc));
		goto err;
	}
	if ((rc = recv_attach_reply(c, 2, fds)))
		goto err;
	c->geom.block_tokens = c->info.block_tokens;
	if (c->worker >= KVR_CTL_MAX_SCHEDULERS) {
		close(fds[0]);
		close(fds[1]);
		rc = fail(c, -EPROTO, "attach: scheduler slot %u out of range", c->worker);
		goto err;
	}
	if ((rc = map_instance(c, fds, true)))
		goto err;
	if (!c->geom.block_tokens || c->worker >= c->ctl->max_schedulers ||
	    c->info.lookup_actor >= c->ctl->max_actors) {
		rc = fail(c, -EPROTO, "attach: scheduler slot %u or attach info out of range", c->worker);
		goto err;
	}
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), "sched.req.%u", c->worker);
	int i = kvr_ctl_find_ring(c->ctl, name);
	c->lk_req = i < 0 ? NULL : kvr_ctl_ring(&c->rings, (unsigned)i);
	snprintf(name, sizeof(name), "sched.rep.%u", c->worker);
	i = kvr_ctl_find_ring(c->ctl, name);
	c->lk_rep = i < 0 ? NULL : kvr_ctl_ring(&c->rings, (unsigned)i);
	if (!c->lk_req || !c->lk_rep) {
		rc = fail(c, -EPROTO, "attach: the instance has no rings for scheduler slot %u", c->worker);
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

KVR_EXPORT int kvr_lease(struct kvr_client *c, uint64_t lease_id, const uint32_t *tokens, size_t n_tokens,
			 const void *extra, size_t extra_len, const struct kvr_lease_opts *opts,
			 struct kvr_lookup_result *ret)
{
	if (!c || !ret || (!tokens && n_tokens) || (!extra && extra_len))
		return fail(c, -EINVAL, "lease: NULL argument");
	if (!c->sched)
		return fail(c, -EINVAL, "lease: a worker client looks up (kvr_lookup) or takes a lease (kvr_lease_take)");
	/* every TP rank loads (MLA: each the same lane) */
	uint32_t loaders = opts && opts->loaders ? opts->loaders : kvr_ctl_sched(c->ctl, c->worker)->tp_size;
	uint32_t ttl = opts && opts->ttl_ms ? opts->ttl_ms : 30000;
	if (loaders > KVR_MSG_LEASE_MAX_LOADERS || ttl > KVR_MSG_LEASE_MAX_TTL_MS)
		return fail(c, -EINVAL, "lease: loaders %u (at most %u) or ttl_ms %u (at most %u) out of range", loaders,
			    KVR_MSG_LEASE_MAX_LOADERS, ttl, KVR_MSG_LEASE_MAX_TTL_MS);
	memset(ret, 0, sizeof(*ret));
	uint64_t t0 = kvr_now_ns();
	size_t nk;
	int rc = hash_keys(c, tokens, n_tokens, extra, extra_len, &nk);
	if (rc)
		return rc;
	uint64_t t1 = kvr_now_ns();
	ret->hash_ns = t1 - t0;
	if (nk == 0)
		return kvr_lease_release(c, lease_id) == -EPIPE ? -EPIPE : 0; /* nothing to lease: drop an older one */
	uint32_t gen;
	if ((rc = lookup_actor_gen(c, "lease", &gen)))
		return rc;
	uint64_t wire = wire_id(c, gen), deadline = t1 + (uint64_t)c->timeout_ns;
	struct kvr_msg_lease b = {.lease_id = lease_id, .ttl_ms = ttl, .loaders = loaders, .n_keys = (uint32_t)nk};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE, 0, wire, 0, &b, sizeof(b));
	if ((rc = send_msg(c, c->lk_req, &m, deadline)) ||
	    (rc = send_list(c, c->lk_req, KVR_MSG_LOOKUP, wire, 0, 0, c->keys, (uint32_t)nk, deadline)))
		return fail(c, rc, "lease: sending the request: %s", strerror(-rc));
	if ((rc = await_reply(c, "lease", c->info.lookup_actor, gen, wire, deadline, &m)))
		return rc;
	struct kvr_msg_lookup_rep r;
	if (kvr_msg_decode_lease_rep(&m, &r) || r.matched > nk)
		return fail(c, -EPROTO, "lease: malformed reply");
	if (r.status == -ESTALE)
		return fail(c, -EPIPE, "lease: the lookup actor restarted; treat as a miss");
	if (r.status == -ENOSPC)
		return fail(c, -ENOSPC, "lease: the lease table is full (l1.max_leases): nothing leased");
	if (r.status < 0)
		return fail(c, r.status, "lease: %s", strerror(-r.status));
	ret->matched_blocks = r.matched;
	ret->l2_blocks = r.promoted;
	ret->matched_tokens = r.matched * c->geom.block_tokens;
	ret->index_ns = r.index_ns;
	ret->roundtrip_ns = kvr_now_ns() - t1;
	return 0;
}

KVR_EXPORT int kvr_lease_release(struct kvr_client *c, uint64_t lease_id)
{
	if (!c || !c->sched)
		return fail(c, -EINVAL, "lease release: not a scheduler client");
	if (sup_gone(c))
		return fail(c, -EPIPE, "lease release: %s", SUP_GONE_WHY);
	struct kvr_msg_lease b = {.lease_id = lease_id};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE_RELEASE, 0, 0, 0, &b, sizeof(b));
	/* a burst of releases (a step that finished many requests) waits for the lookup actor
	 * to make room, as any request does; only a ring that stays full fails */
	int rc = send_msg(c, c->lk_req, &m, kvr_now_ns() + (uint64_t)c->timeout_ns);
	if (rc)
		return fail(c, rc, "lease release: %s; the lease ends by its ttl", strerror(-rc));
	return 0;
}

KVR_EXPORT int kvr_lease_take(struct kvr_client *c, uint64_t lease_id, struct kvr_lookup_result *ret)
{
	if (!c || !ret)
		return fail(c, -EINVAL, "lease take: NULL argument");
	if (c->sched)
		return fail(c, -EINVAL, "lease take: a scheduler client does not load");
	memset(ret, 0, sizeof(*ret));
	memo_forget(c, lease_id);
	uint32_t gen;
	int rc;
	if ((rc = lookup_actor_gen(c, "lease take", &gen)))
		return rc;
	uint64_t t1 = kvr_now_ns(), wire = wire_id(c, gen), deadline = t1 + (uint64_t)c->timeout_ns;
	struct kvr_msg_lease b = {.lease_id = lease_id, .lane = (uint16_t)c->info.lane};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE_TAKE, 0, wire, 0, &b, sizeof(b));
	if ((rc = send_msg(c, c->lk_req, &m, deadline)))
		return fail(c, rc, "lease take: sending the request: %s", strerror(-rc));
	struct kvr_msg_lookup_rep r;
	struct kvr_msg_slot *slots;
	if ((rc = await_slots(c, "lease take", c->info.lookup_actor, gen, wire, deadline, KVR_MSG_MAX_LIST, &r,
			      &slots)))
		return rc;
	ret->matched_blocks = r.matched;
	ret->matched_tokens = r.matched * c->geom.block_tokens;
	ret->roundtrip_ns = kvr_now_ns() - t1;
	if (r.matched)
		memo_put(c, lease_id, r.matched, true, slots);
	return 0;
}

/* Our load of a lease completed: tell the lookup actor (no reply). A full ring only delays
 * the lease's end to its ttl. */
static void lease_done(struct kvr_client *c, uint64_t lease_id, int status)
{
	struct kvr_msg_lease b = {.lease_id = lease_id, .lane = (uint16_t)c->info.lane, .status = status};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE_DONE, 0, 0, 0, &b, sizeof(b));
	(void)kvr_ring_try_enqueue(c->lk_req, &m);
}

/* ---- load and store ---------------------------------------------------------------------- */

static int add_pending(struct kvr_client *c, const struct pending *p)
{
	if (KVR_GROW(c->pend, c->cap_pend, c->n_pend + 1, 64))
		return -ENOMEM;
	c->pend[c->n_pend++] = *p;
	return 0;
}

static int check_blocks(struct kvr_client *c, const char *what, const uint32_t *block_ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (block_ids[i] >= c->geom.num_blocks)
			return fail(c, -ERANGE, "%s: block id %u at position %zu out of range (num_blocks %u)", what,
				    block_ids[i], i, c->geom.num_blocks);
	return 0;
}

/* Register a pending request before sending it, so replies that arrive while we send
 * (we drain replies when a ring is full) find it. */
static int submit(struct kvr_client *c, uint32_t op, unsigned actor, uint64_t req_id, const uint32_t *block_ids,
		  size_t n, const void *ipc_event, uint64_t *ret_wire)
{
	uint32_t gen = actor_gen(c, actor);
	if (sup_gone(c))
		return fail(c, -EPIPE, "%s: %s", op == KVR_OP_LOAD_DONE ? "load" : "store", SUP_GONE_WHY);
	if (!actor_alive(c, actor, gen))
		return fail(c, -EPIPE, "%s actor is not running (state %s)", op == KVR_OP_LOAD_DONE ? "loader" : "storer",
			    kvr_actor_state_name(atomic_load(&kvr_ctl_actor(c->ctl, actor)->state)));
	struct pending p = {.wire_id = wire_id(c, gen), .req_id = req_id, .op = op, .actor = actor, .gen = gen,
			    .n_blocks = (uint32_t)n, .submit_ns = kvr_now_ns()};
	if (ipc_event) {
		/* The storer finds the event in entry wire % KVR_CUDA_EVENTS: take a wire id whose
		 * entry no store in flight holds. */
		unsigned tries = 0;
		while (c->cuda_ev_owner[p.wire_id & (KVR_CUDA_EVENTS - 1)]) {
			if (++tries > KVR_CUDA_EVENTS)
				return fail(c, -EBUSY, "store: %u stores with CUDA events in flight", KVR_CUDA_EVENTS);
			p.wire_id = wire_id(c, gen);
		}
		uint32_t e = (uint32_t)(p.wire_id & (KVR_CUDA_EVENTS - 1));
		struct kvr_cuda_event *ent = &c->cuda_ev[e];
		/* handle first, wire id last (release): the storer checks the wire id */
		__atomic_store_n(&ent->wire, 0, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_RELEASE);
		memcpy(ent->handle, ipc_event, KVR_CUDA_IPC_BYTES);
		__atomic_store_n(&ent->wire, p.wire_id, __ATOMIC_RELEASE);
		c->cuda_ev_owner[e] = p.wire_id;
		p.ev_plus1 = e + 1;
	}
	p.done.req_id = req_id;
	p.done.op = op;
	p.blocks = malloc(n * sizeof(uint32_t));
	if (!p.blocks) {
		ev_release(c, &p);
		return fail(c, -ENOMEM, "out of memory");
	}
	memcpy(p.blocks, block_ids, n * sizeof(uint32_t));
	if (add_pending(c, &p)) {
		ev_release(c, &p);
		free(p.blocks);
		return fail(c, -ENOMEM, "out of memory");
	}
	*ret_wire = p.wire_id;
	return 0;
}

/* A request that could not be sent completely fails now, with all its blocks. */
static void abort_submit(struct kvr_client *c, uint64_t wire)
{
	int i = find_pending(c, wire);
	if (i >= 0) {
		ev_release(c, &c->pend[i]);
		pending_free(&c->pend[i]);
		remove_pending(c, (unsigned)i);
	}
}

KVR_EXPORT int kvr_cancel(struct kvr_client *c, uint64_t req_id)
{
	if (!c)
		return -EINVAL;
	if (c->sched || !c->ctl)
		return fail(c, -EINVAL, "cancel: a scheduler client has no loads or stores");
	drain_replies(c); /* what already completed is not cancelled: its completion says so */
	struct kvr_client_area *ar = kvr_ctl_area(c->ctl, c->worker);
	int n = 0;
	for (unsigned i = 0; i < c->n_pend; i++) {
		struct pending *p = &c->pend[i];
		if (p->req_id != req_id)
			continue;
		n++;
		if (p->cancel_plus1)
			continue; /* cancelled before */
		unsigned e = 0;
		while (e < KVR_AREA_CANCEL_MAX && c->cancel_owner[e])
			e++;
		if (e == KVR_AREA_CANCEL_MAX)
			return fail(c, -EBUSY, "cancel: %u cancels outstanding (wait for their completions)",
				    KVR_AREA_CANCEL_MAX);
		c->cancel_owner[e] = p->wire_id;
		p->cancel_plus1 = e + 1;
		/* the actor reads it before its next copy chunk or commit (stage_fence) */
		atomic_store_explicit(&ar->cancel[e], p->wire_id, memory_order_release);
	}
	return n;
}

KVR_EXPORT int kvr_load(struct kvr_client *c, uint64_t req_id, const uint32_t *block_ids, size_t n_blocks)
{
	if (!c || (!block_ids && n_blocks) || !n_blocks)
		return fail(c, -EINVAL, "load: no blocks");
	if (c->sched)
		return fail(c, -EINVAL, "load: a scheduler client does not load");
	struct memo *mm = memo_find(c, req_id);
	if (!mm)
		return fail(c, -ENOENT, "load: request %llu has no matched blocks (lookup first)",
			    (unsigned long long)req_id);
	if (n_blocks > mm->n)
		return fail(c, -ERANGE, "load: %zu blocks requested but only %u matched", n_blocks, mm->n);
	int rc = check_blocks(c, "load", block_ids, n_blocks);
	if (rc)
		return rc;
	struct kvr_msg_load_item *items = malloc(n_blocks * sizeof(*items));
	if (!items)
		return fail(c, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n_blocks; i++)
		items[i] = (struct kvr_msg_load_item){.slot = mm->slots[i].slot, .epoch = mm->slots[i].epoch,
						      .block = block_ids[i]};
	uint64_t wire;
	rc = submit(c, KVR_OP_LOAD_DONE, c->info.loader_actor, req_id, block_ids, n_blocks, NULL, &wire);
	if (!rc) {
		c->pend[find_pending(c, wire)].lease = mm->lease;
		rc = send_list(c, c->ld_req, KVR_MSG_LOAD, wire, 0, 0, items, (uint32_t)n_blocks,
			       kvr_now_ns() + (uint64_t)c->timeout_ns);
		if (rc) {
			abort_submit(c, wire);
			rc = fail(c, rc, "load: sending the request: %s", strerror(-rc));
		}
	}
	free(items);
	if (!rc) { /* the slots are consumed: a second load needs a new lookup */
		free(mm->slots);
		mm->slots = NULL;
	}
	return rc;
}

static int store(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens, const void *extra,
		 size_t extra_len, const uint32_t *block_ids, size_t n_blocks, const void *ipc_event)
{
	if (!c || (!tokens && n_tokens) || (!block_ids && n_blocks) || (!extra && extra_len))
		return fail(c, -EINVAL, "store: NULL argument");
	if (c->sched)
		return fail(c, -EINVAL, "store: a scheduler client does not store");
	size_t full = n_tokens / c->geom.block_tokens;
	if (n_blocks != full)
		return fail(c, -EINVAL, "store: %zu tokens make %zu full blocks of %u but %zu block ids were given",
			    n_tokens, full, c->geom.block_tokens, n_blocks);
	if (!n_blocks)
		return fail(c, -EINVAL, "store: fewer than %u tokens: nothing to store", c->geom.block_tokens);
	int rc = check_blocks(c, "store", block_ids, n_blocks);
	if (rc)
		return rc;
	size_t nk;
	if ((rc = hash_keys(c, tokens, n_tokens, extra, extra_len, &nk)))
		return rc;
	struct kvr_msg_store_item *items = malloc(nk * sizeof(*items));
	if (!items)
		return fail(c, -ENOMEM, "out of memory");
	for (size_t i = 0; i < nk; i++) {
		items[i].key = (struct kvr_msg_key){.lo = c->keys[i].lo, .hi = c->keys[i].hi};
		items[i].block = block_ids[i];
	}
	uint64_t wire;
	rc = submit(c, KVR_OP_STORE_DONE, c->info.storer_actor, req_id, block_ids, n_blocks, ipc_event, &wire);
	if (!rc) {
		rc = send_list(c, c->st_req, KVR_MSG_STORE, wire, 0, ipc_event ? KVR_STOREF_CUDA_EVENT : 0, items,
			       (uint32_t)nk, kvr_now_ns() + (uint64_t)c->timeout_ns);
		if (rc) {
			abort_submit(c, wire);
			rc = fail(c, rc, "store: sending the request: %s", strerror(-rc));
		}
	}
	free(items);
	return rc;
}

KVR_EXPORT int kvr_store(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens,
			 const void *extra, size_t extra_len, const uint32_t *block_ids, size_t n_blocks)
{
	return store(c, req_id, tokens, n_tokens, extra, extra_len, block_ids, n_blocks, NULL);
}

KVR_EXPORT int kvr_store_cuda(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens,
			      const void *extra, size_t extra_len, const uint32_t *block_ids, size_t n_blocks,
			      const void *ipc_event)
{
	if (c && ipc_event && !c->cuda_ev)
		return fail(c, -EINVAL, "store: a CUDA event on a client attached without CUDA KV memory");
	return store(c, req_id, tokens, n_tokens, extra, extra_len, block_ids, n_blocks, ipc_event);
}
