/* remote: the remote tier actor (kvring-remote) — promotion reads and write-throughs of L1 blocks against a Redis Cluster. */
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>

#include <kvring/msg.h>

#include "kvr_actor.h"
#include "kvr_backlog.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_time.h"
#include "rcluster.h"
#include "rvalue.h"

/*
 * The lookup actor sends this actor the disk tier's messages on "remote.req" and gets the
 * disk tier's answers on "remote.rep" (docs/cluster.md):
 *
 *   L2_READ  (key, lane, slot, epoch)  a promotion: the slot is WRITING, allocated by the
 *            lookup actor. One pipelined round trip to the master of the key's hash slot:
 *            EXISTS of every lane's value (a block counts only when all TP lanes are in
 *            the cluster), then GET of the asked lane. The value is checked (rvalue.h:
 *            magic, header checksum, namespace, key, lane, length, payload checksum)
 *            BEFORE a byte reaches the slot; then copied in and answered READ_DONE 0. A
 *            lane missing is -ENOENT, a value that fails its check -EBADMSG (both a miss,
 *            never served), anything else (no node, connection, timeout) another -errno.
 *   L2_WRITE (key, lane, slot, epoch)  write-through of a COMMITTED slot: SET of header +
 *            payload (+ EX remote.ttl_s). No answer: the lookup actor does not wait for
 *            the shared tier (it is a cache; a write that fails is counted here).
 *
 * Slot safety: a slot is pinned (KVR_PIN_REMOTE) from the check of its state and epoch to
 * the end of the copy — for a read until the bytes are in, for a write until hiredis has
 * copied them into its output buffer (one copy: the payload is appended straight from the
 * slot to the formatted command, no intermediate buffer). A restarted remote actor drops
 * its predecessor's pins (its process, and so its copies, ended).
 *
 * Cluster: the slot map comes from CLUSTER SLOTS (rcluster.h), asked at start (bounded by
 * timeout_ms, before readiness) and again every RM_REFRESH_NS, after a MOVED and after a
 * node is lost. One connection per master, pipelined; MOVED updates the map and resends,
 * ASK resends once after ASKING. A request unanswered after remote.timeout_ms closes its
 * connection (a pipelined connection cannot drop one request): everything in flight there
 * fails, and the node is reconnected with backoff. remote.max_inflight bounds the
 * requests in flight; beyond it requests wait (in order) with the input ring held.
 *
 * Nothing here blocks after init: the sockets are runtime fd watches, hiredis runs from
 * their callbacks, deadlines from the tick.
 */

#define RM_TICK_NS (10ull * 1000000ull)
#define RM_REFRESH_NS (5ull * 1000000000ull)
#define RM_REFRESH_SOON_NS (100ull * 1000000ull) /* after a request found no usable node */
#define RM_BACKOFF_MIN_MS 50u
#define RM_BACKOFF_MAX_MS 2000u
#define RM_MAX_REDIRECTS 3u
#define RM_READ_BURST 16u     /* socket reads per fd callback, RM_READ_CHUNK each */
#define RM_READ_CHUNK (1u << 20)
#define RM_NONE 0xffffffffu

/* A GET's value is checked and copied into its slot straight from hiredis's read buffer,
 * while the reply is parsed (create_string below): no reply object holds a second copy. */
enum { LAND_NONE = 0, LAND_OK = 1, LAND_BAD = 2, LAND_STALE = 3 };

enum node_state { N_DOWN = 0, N_CONNECTING = 1, N_UP = 2 };

struct rnode {
	redisAsyncContext *ac;
	int watch;                /* runtime fd watch of ac's socket, -1 */
	uint32_t events;          /* what hiredis asked to wait for */
	enum node_state st;
	uint64_t since_ns;        /* CONNECTING since */
	uint64_t retry_ns;        /* DOWN: no connect before */
	uint32_t backoff_ms;
	bool timed_out;           /* being closed for a request past its deadline */
	bool broken;              /* a command was cut short in the output buffer: close it */
};

struct rreq {
	uint16_t type;            /* KVR_MSG_L2_READ / KVR_MSG_L2_WRITE; 0 = free */
	uint16_t lane;
	uint32_t slot, epoch;
	uint64_t req_id;
	kvr_key key;
	unsigned node;
	uint64_t first_ns;        /* when the request was taken */
	uint64_t sent_ns;         /* when its commands went to node */
	uint32_t gen;             /* bumped per send: answers to an earlier send are ignored */
	uint8_t redirects;
	bool asking;
	bool parked;              /* no usable node for it yet: sent again from the tick until
				   * timeout_ms after first_ns (a failover, a map being refreshed) */
	long long exists;         /* EXISTS answer of this send, -1 none */
	uint8_t landed;           /* LAND_*: what the reply parser did with this GET's value */
	uint8_t reason;           /* LAND_BAD: enum kvr_rv_reason */
	uint32_t next_free;
};

struct remote {
	struct kvr_actor *a;
	struct kvr_slot_table *slots;
	struct kvr_ring *in, *out;
	struct kvr_l2_ident id;
	unsigned lanes;
	char ttl[16];             /* "" = no EX */
	uint64_t timeout_ns, send_timeout_ns;
	struct kvr_rc_map map;
	struct rnode nodes[KVR_RC_MAX_NODES];
	unsigned n_seeds;         /* nodes[0..n_seeds) are remote.cluster's seeds */
	struct rreq *reqs;
	unsigned n_reqs, inflight;
	uint32_t free_req;
	bool refreshing;
	unsigned refresh_node;
	uint64_t next_refresh_ns;
	unsigned seed_rr;
	struct kvr_backlog wait;  /* requests that found every request slot in use */
	uint64_t dropped;
	uint64_t bad_logged_ns;
	bool closing;             /* fini: nothing is parked any more */
	bool map_dirty;           /* publish(): recount masters and covered slots */
	char rbuf[RM_READ_CHUNK]; /* socket reads before hiredis's reader takes them */
	bool is_master[KVR_RC_MAX_NODES];
	unsigned covered;
};

static struct remote *R; /* hiredis's adapter hooks get only the node */

/* ---- stats -------------------------------------------------------------------------------- */

static void count(struct remote *r, unsigned s, uint64_t by)
{
	kvr_actor_count(r->a, s, by);
}

static void gauge(struct remote *r, unsigned s, uint64_t v)
{
	atomic_store_explicit(&r->a->stats->c[s], v, memory_order_relaxed);
}

/* The map changed (CLUSTER SLOTS, MOVED): publish() looks at its 16384 slots again. */
static void map_changed(struct remote *r)
{
	r->map_dirty = true;
}

static void publish(struct remote *r)
{
	if (r->map_dirty) {
		memset(r->is_master, 0, sizeof(r->is_master));
		for (unsigned s = 0; s < KVR_RC_SLOTS; s++)
			if (r->map.owner[s] != KVR_RC_NONE)
				r->is_master[r->map.owner[s]] = true;
		r->covered = kvr_rc_map_covered(&r->map);
		r->map_dirty = false;
	}
	unsigned masters = 0, up = 0;
	for (unsigned n = 0; n < r->map.n_nodes; n++)
		if (r->is_master[n]) {
			masters++;
			up += r->nodes[n].st == N_UP;
		}
	gauge(r, KVR_STAT_RM_NODES, masters);
	gauge(r, KVR_STAT_RM_NODES_UP, up);
	gauge(r, KVR_STAT_RM_INFLIGHT, r->inflight);
	gauge(r, KVR_STAT_RM_SLOTS_COVERED, r->covered);
}

/* ---- answers to the lookup actor ---------------------------------------------------------- */

/* The connection of request i's node went without an answer (a connect that failed, a
 * node that died): park it (sent again from the tick, to where the map then says) while
 * its time is not up; true when parked. A request whose node was closed for being late is
 * not parked: its time is up. */
static bool park_after_loss(struct remote *r, uint32_t i)
{
	struct rreq *q = &r->reqs[i];
	if (r->closing || r->nodes[q->node].timed_out || kvr_now_ns() - q->first_ns >= r->timeout_ns)
		return false;
	q->parked = true;
	q->asking = false;
	q->gen++; /* nothing more of that send is ours */
	return true;
}

static void send_read_done(struct remote *r, const struct rreq *q, int status)
{
	struct kvr_msg_l2 b = {.key_lo = q->key.lo, .key_hi = q->key.hi, .slot = q->slot, .epoch = q->epoch,
			       .lane = q->lane, .status = status};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_L2_READ_DONE, status < 0 ? KVR_MSGF_ERROR : 0, q->req_id, 0, &b, sizeof(b));
	int rc = kvr_msg_send(r->out, &m, kvr_now_ns() + r->send_timeout_ns);
	if (rc) {
		if (!r->dropped++)
			kvr_warn("remote.rep: READ_DONE dropped (%s); the lookup actor stopped reading", strerror(-rc));
		return;
	}
	count(r, KVR_STAT_MSGS_OUT, 1);
}

/* ---- requests ----------------------------------------------------------------------------- */

static uint32_t req_get(struct remote *r)
{
	uint32_t i = r->free_req;
	if (i == RM_NONE)
		return i;
	r->free_req = r->reqs[i].next_free;
	r->inflight++;
	return i;
}

static void req_put(struct remote *r, uint32_t i)
{
	r->reqs[i].type = 0;
	r->reqs[i].gen++;
	r->reqs[i].next_free = r->free_req;
	r->free_req = i;
	r->inflight--;
}

static void *priv_of(const struct remote *r, uint32_t i)
{
	return (void *)(uintptr_t)(((uint64_t)r->reqs[i].gen << 32) | i);
}

/* The request a callback's privdata names, or RM_NONE when it is stale (answered, resent). */
static uint32_t req_of(const struct remote *r, void *priv)
{
	uint64_t v = (uint64_t)(uintptr_t)priv;
	uint32_t i = (uint32_t)v;
	if (i >= r->n_reqs || !r->reqs[i].type || r->reqs[i].gen != (uint32_t)(v >> 32))
		return RM_NONE;
	return i;
}

static bool slot_holds(const struct remote *r, const struct rreq *q)
{
	const struct kvr_slot *s = kvr_slot_at(r->slots, q->slot);
	return s->key.lo == q->key.lo && s->key.hi == q->key.hi && s->lane == q->lane;
}

/* A read ended: the pin goes, the answer goes. */
static void read_done(struct remote *r, uint32_t i, int status)
{
	struct rreq *q = &r->reqs[i];
	(void)kvr_slot_unpin(r->slots, q->slot, KVR_PIN_REMOTE);
	send_read_done(r, q, status);
	req_put(r, i);
}

static void write_done(struct remote *r, uint32_t i, bool ok)
{
	struct rreq *q = &r->reqs[i];
	if (ok) {
		count(r, KVR_STAT_RM_WRITES, 1);
		count(r, KVR_STAT_RM_BYTES_OUT, r->id.lane_bytes);
		kvr_hist_observe(kvr_stats_hist(r->a->stats, KVR_STAT_RM_HIST_SET), kvr_now_ns() - q->first_ns);
	} else {
		count(r, KVR_STAT_RM_WRITE_ERRORS, 1);
	}
	req_put(r, i);
}

static void req_fail(struct remote *r, uint32_t i, int err)
{
	if (r->reqs[i].type == KVR_MSG_L2_READ) {
		count(r, KVR_STAT_RM_READ_ERRORS, 1);
		read_done(r, i, err);
	} else {
		write_done(r, i, false);
	}
}

/* ---- values straight into their slots -------------------------------------------------------- */

static void on_get(redisAsyncContext *ac, void *reply, void *priv);
static redisReplyObjectFunctions *hiredis_fn; /* hiredis's own reply functions (its reader's default) */
static redisReplyObjectFunctions land_fn;     /* the same with create_string */

/* Check value[0..len) of read q and copy its payload into q's slot: LAND_OK, LAND_BAD (q->reason
 * says why) or LAND_STALE (the slot is no longer the allocation asked for). */
static uint8_t land(struct remote *r, struct rreq *q, const char *value, size_t len)
{
	unsigned reason = KVR_RV_OK;
	if (kvr_rv_check(value, len, &r->id, q->key, q->lane, &reason) != 0) {
		q->reason = (uint8_t)reason;
		return LAND_BAD;
	}
	/* our pin kept the slot from reuse; the lookup actor may have aborted it meanwhile */
	if (kvr_slot_state(r->slots, q->slot) != KVR_SLOT_WRITING || kvr_slot_epoch(r->slots, q->slot) != q->epoch ||
	    !slot_holds(r, q))
		return LAND_STALE;
	memcpy(kvr_slot_data(r->slots, r->a->arena_seg.base, q->slot), value + KVR_RV_HDR_BYTES, r->id.lane_bytes);
	return LAND_OK;
}

/*
 * hiredis calls this for every bulk string it parses, with the bytes still in its read
 * buffer. The reply being parsed belongs to the first callback of the connection's list (a
 * pipeline answers in order); when that is one of our GETs, the value lands in the slot now
 * and the reply object carries no copy of it (str NULL, len kept). Anything else goes to
 * hiredis's own createString.
 */
static void *create_string(const redisReadTask *task, char *str, size_t len)
{
	struct rnode *n = task->privdata;
	const redisCallback *cb = n && n->ac ? n->ac->replies.head : NULL;
	if (!task->parent && task->type == REDIS_REPLY_STRING && cb && cb->fn == on_get) {
		uint32_t i = req_of(R, cb->privdata);
		struct rreq *q = i == RM_NONE ? NULL : &R->reqs[i];
		if (q && q->type == KVR_MSG_L2_READ && !(R->lanes > 1 && q->exists != (long long)R->lanes)) {
			redisReply *rp = calloc(1, sizeof(*rp));
			if (!rp)
				return NULL; /* hiredis reports out of memory and drops the connection */
			rp->type = REDIS_REPLY_STRING;
			rp->len = len;
			q->landed = land(R, q, str, len);
			return rp;
		}
	}
	return hiredis_fn->createString(task, str, len);
}

/* ---- connections -------------------------------------------------------------------------- */

static void node_fd(struct kvr_actor *a, int fd, uint32_t revents, void *arg);

static struct rnode *node_of(void *privdata)
{
	return privdata;
}

static void ev_set(struct rnode *n, uint32_t events)
{
	n->events = events;
	if (n->watch >= 0)
		kvr_actor_watch_events(R->a, n->watch, events);
}

static void ev_add_read(void *p) { ev_set(node_of(p), node_of(p)->events | POLLIN); }
static void ev_del_read(void *p) { ev_set(node_of(p), node_of(p)->events & ~(uint32_t)POLLIN); }
static void ev_add_write(void *p) { ev_set(node_of(p), node_of(p)->events | POLLOUT); }
static void ev_del_write(void *p) { ev_set(node_of(p), node_of(p)->events & ~(uint32_t)POLLOUT); }

/* hiredis frees the context (a failed connect, a dropped or closed connection): every
 * callback it still held has been called with a NULL reply before this. */
static void ev_cleanup(void *p)
{
	struct rnode *n = node_of(p);
	if (n->watch >= 0)
		kvr_actor_unwatch_fd(R->a, n->watch);
	n->watch = -1;
	n->ac = NULL;
	n->events = 0;
	n->st = N_DOWN;
	n->timed_out = false;
	n->broken = false;
	n->retry_ns = kvr_now_ns() + (uint64_t)n->backoff_ms * 1000000ull;
	n->backoff_ms = n->backoff_ms * 2 > RM_BACKOFF_MAX_MS ? RM_BACKOFF_MAX_MS : n->backoff_ms * 2;
	R->next_refresh_ns = 0; /* a node lost: its slots may have moved to a replica */
}

static void on_connect(const redisAsyncContext *ac, int status)
{
	struct rnode *n = ac->data;
	if (status != REDIS_OK) {
		count(R, KVR_STAT_RM_CONN_ERRORS, 1);
		kvr_warn("remote %s:%u: connect failed: %s", R->map.nodes[n - R->nodes].host,
			 R->map.nodes[n - R->nodes].port, ac->errstr);
		return; /* hiredis frees it: ev_cleanup */
	}
	n->st = N_UP;
	n->backoff_ms = RM_BACKOFF_MIN_MS;
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
	struct rnode *n = ac->data;
	if (status != REDIS_OK && !n->timed_out) {
		count(R, KVR_STAT_RM_CONN_ERRORS, 1);
		kvr_warn("remote %s:%u: connection lost: %s", R->map.nodes[n - R->nodes].host,
			 R->map.nodes[n - R->nodes].port, ac->errstr);
	}
}

static void on_auth(redisAsyncContext *ac, void *reply, void *priv)
{
	(void)priv;
	const redisReply *rp = reply;
	if (rp && rp->type == REDIS_REPLY_ERROR) {
		struct rnode *n = ac->data;
		kvr_err("remote %s:%u: AUTH refused: %s", R->map.nodes[n - R->nodes].host, R->map.nodes[n - R->nodes].port,
			rp->str);
		count(R, KVR_STAT_RM_REPLY_ERRORS, 1);
		n->backoff_ms = RM_BACKOFF_MAX_MS;
		redisAsyncDisconnect(ac);
	}
}

/* A connection to node n, started when there is none and its backoff has passed. Returns
 * its context (maybe still connecting: hiredis queues commands until it is up) or NULL. */
static redisAsyncContext *node_ctx(struct remote *r, unsigned ni)
{
	struct rnode *n = &r->nodes[ni];
	if (n->ac)
		return n->ac;
	uint64_t now = kvr_now_ns();
	if (now < n->retry_ns)
		return NULL;
	const struct kvr_rc_node *addr = &r->map.nodes[ni];
	redisAsyncContext *ac = redisAsyncConnect(addr->host, addr->port);
	if (!ac || ac->err) {
		count(r, KVR_STAT_RM_CONN_ERRORS, 1);
		kvr_warn("remote %s:%u: cannot connect: %s", addr->host, addr->port, ac ? ac->errstr : "out of memory");
		if (ac)
			redisAsyncFree(ac);
		n->retry_ns = now + (uint64_t)n->backoff_ms * 1000000ull;
		return NULL;
	}
	ac->data = n;
	ac->ev.data = n;
	ac->ev.addRead = ev_add_read;
	ac->ev.delRead = ev_del_read;
	ac->ev.addWrite = ev_add_write;
	ac->ev.delWrite = ev_del_write;
	ac->ev.cleanup = ev_cleanup;
	n->watch = kvr_actor_watch_fd(r->a, ac->c.fd, POLLOUT, node_fd, n); /* POLLOUT: the connect completes */
	if (n->watch < 0) {
		kvr_err("remote %s:%u: cannot watch the socket: %s", addr->host, addr->port, strerror(-n->watch));
		ac->ev.cleanup = NULL;
		redisAsyncFree(ac);
		n->watch = -1;
		n->retry_ns = now + (uint64_t)RM_BACKOFF_MAX_MS * 1000000ull;
		return NULL;
	}
	if (!hiredis_fn) {
		hiredis_fn = ac->c.reader->fn;
		land_fn = *hiredis_fn;
		land_fn.createString = create_string;
	}
	ac->c.reader->fn = &land_fn;
	ac->c.reader->privdata = n;
	ac->c.reader->maxbuf = 0; /* keep the read buffer between values (hiredis frees it above 16 KiB idle) */
	n->events = POLLOUT;
	n->ac = ac;
	n->st = N_CONNECTING;
	n->since_ns = now;
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	const struct kvr_config *cfg = &r->a->cfg;
	if (cfg->remote.password[0]) {
		if (cfg->remote.user[0])
			(void)redisAsyncCommand(ac, on_auth, NULL, "AUTH %s %s", cfg->remote.user, cfg->remote.password);
		else
			(void)redisAsyncCommand(ac, on_auth, NULL, "AUTH %s", cfg->remote.password);
	}
	return ac;
}

/* Close node n's connection now (from the tick, never inside a hiredis callback). */
static void node_close(struct remote *r, unsigned ni, bool timed_out)
{
	struct rnode *n = &r->nodes[ni];
	if (!n->ac)
		return;
	n->timed_out = timed_out;
	redisAsyncFree(n->ac); /* callbacks with NULL replies, then ev_cleanup */
}

static void node_fd(struct kvr_actor *a, int fd, uint32_t revents, void *arg)
{
	(void)a;
	struct rnode *n = arg;
	if (!n->ac)
		return;
	if (revents & (POLLOUT | POLLERR | POLLHUP))
		redisAsyncHandleWrite(n->ac);
	if (!n->ac || !(revents & (POLLIN | POLLERR | POLLHUP)))
		return;
	/* hiredis reads 16 KiB per call (a 5 MiB value would be 320 wake-ups and reads): what
	 * the socket holds is read here in RM_READ_CHUNK pieces and fed to hiredis's reader
	 * (its public redisReaderFeed); then hiredis's own read (EAGAIN, or EOF and errors
	 * handled its way) runs the callbacks of every reply now complete */
	redisReader *rd = n->ac->c.reader;
	for (unsigned k = 0; k < RM_READ_BURST; k++) {
		ssize_t got = read(fd, R->rbuf, RM_READ_CHUNK);
		if (got <= 0)
			break; /* EAGAIN, EOF or an error: hiredis's read below sees it too */
		if (redisReaderFeed(rd, R->rbuf, (size_t)got) != REDIS_OK)
			break; /* out of memory: hiredis's read below reports it */
		if ((size_t)got < RM_READ_CHUNK)
			break;
	}
	redisAsyncHandleRead(n->ac);
}

/* ---- the slot map -------------------------------------------------------------------------- */

static void on_slots(redisAsyncContext *ac, void *reply, void *priv)
{
	(void)priv;
	struct remote *r = R;
	const redisReply *rp = reply;
	struct rnode *n = ac->data;
	unsigned ni = (unsigned)(n - r->nodes);
	r->refreshing = false;
	if (!rp)
		return;
	if (rp->type == REDIS_REPLY_ERROR) {
		count(r, KVR_STAT_RM_REPLY_ERRORS, 1);
		kvr_warn("remote %s:%u: CLUSTER SLOTS: %s", r->map.nodes[ni].host, r->map.nodes[ni].port, rp->str);
		return;
	}
	unsigned before = kvr_rc_map_covered(&r->map);
	int rc = kvr_rc_map_from_slots(&r->map, rp, r->map.nodes[ni].host);
	if (rc) {
		kvr_warn("remote %s:%u: CLUSTER SLOTS reply refused: %s", r->map.nodes[ni].host, r->map.nodes[ni].port,
			 strerror(-rc));
		return;
	}
	count(r, KVR_STAT_RM_REFRESHES, 1);
	map_changed(r);
	unsigned now_cov = kvr_rc_map_covered(&r->map);
	if (now_cov != before)
		kvr_info("remote: slot map from %s:%u: %u of %u slots served", r->map.nodes[ni].host,
			 r->map.nodes[ni].port, now_cov, KVR_RC_SLOTS);
	publish(r);
}

/* Ask a node for the slot map: one that is up (the last one asked first), else the next
 * seed or known node that may be connected. */
static void refresh(struct remote *r, uint64_t now)
{
	if (r->refreshing || now < r->next_refresh_ns)
		return;
	r->next_refresh_ns = now + RM_REFRESH_NS;
	unsigned pick = RM_NONE;
	for (unsigned k = 0; k < r->map.n_nodes && pick == RM_NONE; k++) {
		unsigned ni = (r->refresh_node + k) % r->map.n_nodes;
		if (r->nodes[ni].st == N_UP)
			pick = ni;
	}
	for (unsigned k = 0; k < r->map.n_nodes && pick == RM_NONE; k++) {
		unsigned ni = (r->seed_rr + k) % r->map.n_nodes;
		if (now >= r->nodes[ni].retry_ns) {
			pick = ni;
			r->seed_rr = ni + 1;
		}
	}
	if (pick == RM_NONE)
		return;
	redisAsyncContext *ac = node_ctx(r, pick);
	if (ac && redisAsyncCommand(ac, on_slots, NULL, "CLUSTER SLOTS") == REDIS_OK) {
		r->refreshing = true;
		r->refresh_node = pick;
	}
}

/* At start, before readiness: ask the seeds in turn (blocking, timeout_ms each). */
static void discover(struct remote *r)
{
	struct timeval tv = {.tv_sec = r->timeout_ns / 1000000000ull, .tv_usec = (r->timeout_ns % 1000000000ull) / 1000};
	const struct kvr_config *cfg = &r->a->cfg;
	for (unsigned s = 0; s < r->n_seeds; s++) {
		const struct kvr_rc_node *addr = &r->map.nodes[s];
		redisContext *c = redisConnectWithTimeout(addr->host, addr->port, tv);
		if (!c || c->err) {
			kvr_warn("remote %s:%u: %s", addr->host, addr->port, c ? c->errstr : "out of memory");
			redisFree(c);
			continue;
		}
		(void)redisSetTimeout(c, tv);
		redisReply *rp = NULL;
		if (cfg->remote.password[0]) {
			rp = cfg->remote.user[0] ? redisCommand(c, "AUTH %s %s", cfg->remote.user, cfg->remote.password)
						 : redisCommand(c, "AUTH %s", cfg->remote.password);
			bool ok = rp && rp->type != REDIS_REPLY_ERROR;
			if (!ok)
				kvr_err("remote %s:%u: AUTH refused: %s", addr->host, addr->port, rp ? rp->str : c->errstr);
			freeReplyObject(rp);
			if (!ok) {
				redisFree(c);
				continue;
			}
		}
		rp = redisCommand(c, "CLUSTER SLOTS");
		int rc = !rp ? -EIO : rp->type == REDIS_REPLY_ERROR ? -EPROTO
								  : kvr_rc_map_from_slots(&r->map, rp, addr->host);
		if (rc)
			kvr_warn("remote %s:%u: CLUSTER SLOTS: %s", addr->host, addr->port,
				 !rp ? c->errstr : rp->type == REDIS_REPLY_ERROR ? rp->str : strerror(-rc));
		freeReplyObject(rp);
		redisFree(c);
		if (rc == 0) {
			count(r, KVR_STAT_RM_REFRESHES, 1);
			map_changed(r);
			r->next_refresh_ns = kvr_now_ns() + RM_REFRESH_NS;
			kvr_info("remote: slot map from %s:%u, %u of %u slots served",
				 addr->host, addr->port, kvr_rc_map_covered(&r->map), KVR_RC_SLOTS);
			return;
		}
	}
	kvr_warn("remote: no seed of remote.cluster answered CLUSTER SLOTS: every request misses until one does");
}

/* ---- sending ------------------------------------------------------------------------------- */

static void on_exists(redisAsyncContext *ac, void *reply, void *priv);
static void on_get(redisAsyncContext *ac, void *reply, void *priv);
static void on_set(redisAsyncContext *ac, void *reply, void *priv);

/* Where key's hash slot lives: a node index, or RM_NONE (the map has no master for it). */
static unsigned route(struct remote *r, const char *name, size_t len)
{
	unsigned s = kvr_rc_key_slot(name, len);
	return r->map.owner[s] == KVR_RC_NONE ? RM_NONE : r->map.owner[s];
}

static void refresh_soon(struct remote *r)
{
	uint64_t soon = kvr_now_ns() + RM_REFRESH_SOON_NS;
	if (r->next_refresh_ns > soon)
		r->next_refresh_ns = soon;
}

/* Send request i (again): 0, or -errno when it cannot go now: -EHOSTUNREACH / -ENOTCONN
 * (no usable node: the caller parks it), -ESTALE (a write whose slot changed). */
static int req_send(struct remote *r, uint32_t i)
{
	struct rreq *q = &r->reqs[i];
	char name[KVR_RV_KEY_MAX];
	size_t len = kvr_rv_key_fmt(name, sizeof(name), r->id.ns, q->key, q->lane);
	if (!q->asking) {
		q->node = route(r, name, len);
		if (q->node == RM_NONE) {
			refresh_soon(r);
			return -EHOSTUNREACH;
		}
	}
	redisAsyncContext *ac = node_ctx(r, q->node);
	if (!ac) {
		refresh_soon(r); /* its master is down: a replica may have taken over */
		return -ENOTCONN;
	}
	q->gen++;
	q->exists = -1;
	q->landed = LAND_NONE;
	q->sent_ns = kvr_now_ns();
	if (q->asking && redisAsyncCommand(ac, NULL, NULL, "ASKING") != REDIS_OK)
		return -ENOTCONN;
	if (q->type == KVR_MSG_L2_READ) {
		if (r->lanes > 1) {
			const char *argv[1 + KVR_CTL_MAX_WORKERS];
			size_t argl[1 + KVR_CTL_MAX_WORKERS];
			char names[KVR_CTL_MAX_WORKERS][KVR_RV_KEY_MAX];
			argv[0] = "EXISTS";
			argl[0] = 6;
			for (unsigned l = 0; l < r->lanes; l++) {
				argl[1 + l] = kvr_rv_key_fmt(names[l], sizeof(names[l]), r->id.ns, q->key, l);
				argv[1 + l] = names[l];
			}
			if (redisAsyncCommandArgv(ac, on_exists, priv_of(r, i), (int)(1 + r->lanes), argv, argl) != REDIS_OK)
				return -ENOTCONN;
		}
		const char *argv[2] = {"GET", name};
		size_t argl[2] = {3, len};
		return redisAsyncCommandArgv(ac, on_get, priv_of(r, i), 2, argv, argl) == REDIS_OK ? 0 : -ENOTCONN;
	}
	/* SET name <header + payload> [EX ttl]: the command is formatted up to the value's
	 * length, then the header and the payload are appended to hiredis's output buffer
	 * straight from the slot, under our pin, and the pin goes (the bytes are copied) */
	if (kvr_slot_pin_remote(r->slots, q->slot, q->epoch, KVR_SLOT_COMMITTED))
		return -ESTALE;
	if (!slot_holds(r, q)) {
		(void)kvr_slot_unpin(r->slots, q->slot, KVR_PIN_REMOTE);
		return -ESTALE;
	}
	const void *data = kvr_slot_data(r->slots, r->a->arena_seg.base, q->slot);
	struct kvr_rv_hdr h;
	kvr_rv_hdr_build(&h, &r->id, q->key, q->lane, data);
	uint64_t vlen = KVR_RV_HDR_BYTES + r->id.lane_bytes;
	char pre[256];
	int plen = snprintf(pre, sizeof(pre), "*%d\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%llu\r\n", r->ttl[0] ? 5 : 3, len,
			    name, (unsigned long long)vlen);
	int rc = redisAsyncFormattedCommand(ac, on_set, priv_of(r, i), pre, (size_t)plen);
	if (rc == REDIS_OK) {
		/* room for the whole value at once, not by doubling while it is appended */
		sds ob = sdsMakeRoomFor(ac->c.obuf, sizeof(h) + r->id.lane_bytes + 64);
		ob = ob ? sdscatlen(ob, &h, sizeof(h)) : NULL;
		ob = ob ? sdscatlen(ob, data, r->id.lane_bytes) : NULL;
		ob = ob ? sdscatlen(ob, "\r\n", 2) : NULL;
		if (ob && r->ttl[0]) {
			char tail[64];
			int tl = snprintf(tail, sizeof(tail), "$2\r\nEX\r\n$%zu\r\n%s\r\n", strlen(r->ttl), r->ttl);
			ob = sdscatlen(ob, tail, (size_t)tl);
		}
		if (!ob) {
			/* sdscatlen left the buffer as it was, a command cut short in it: nothing
			 * after it can be understood, the connection is closed at the next tick */
			kvr_err("remote: out of memory appending a value: closing the connection");
			r->nodes[q->node].broken = true;
		} else {
			ac->c.obuf = ob;
		}
	}
	(void)kvr_slot_unpin(r->slots, q->slot, KVR_PIN_REMOTE);
	return rc == REDIS_OK ? 0 : -ENOTCONN;
}

/* An error reply: MOVED / ASK are followed (at most RM_MAX_REDIRECTS times); true when the
 * request was sent again. */
static bool redirect(struct remote *r, uint32_t i, const redisReply *rp)
{
	struct rreq *q = &r->reqs[i];
	bool ask;
	unsigned slot;
	struct kvr_rc_node to;
	if (kvr_rc_parse_redirect(rp->str, rp->len, &ask, &slot, &to) != 0) {
		count(r, KVR_STAT_RM_REPLY_ERRORS, 1);
		return false;
	}
	if (!to.host[0])
		memcpy(to.host, r->map.nodes[q->node].host, sizeof(to.host));
	count(r, ask ? KVR_STAT_RM_ASK : KVR_STAT_RM_MOVED, 1);
	if (q->redirects++ >= RM_MAX_REDIRECTS)
		return false;
	int ni = ask ? kvr_rc_map_node(&r->map, to.host, to.port) : kvr_rc_map_set(&r->map, slot, to.host, to.port);
	if (ni < 0)
		return false;
	if (!ask) {
		map_changed(r);
		r->next_refresh_ns = 0; /* more of the map has likely moved */
	}
	q->asking = ask;
	q->node = (unsigned)ni;
	return req_send(r, i) == 0;
}

static void on_exists(redisAsyncContext *ac, void *reply, void *priv)
{
	(void)ac;
	uint32_t i = req_of(R, priv);
	const redisReply *rp = reply;
	if (i != RM_NONE && rp && rp->type == REDIS_REPLY_INTEGER)
		R->reqs[i].exists = rp->integer;
}

static void on_get(redisAsyncContext *ac, void *reply, void *priv)
{
	(void)ac;
	struct remote *r = R;
	uint32_t i = req_of(r, priv);
	if (i == RM_NONE)
		return;
	struct rreq *q = &r->reqs[i];
	const redisReply *rp = reply;
	if (!rp) { /* the connection went: timed out or lost */
		if (!park_after_loss(r, i))
			req_fail(r, i, r->nodes[q->node].timed_out ? -ETIMEDOUT : -ECONNRESET);
		return;
	}
	if (rp->type == REDIS_REPLY_ERROR) {
		if (!redirect(r, i, rp))
			req_fail(r, i, -EPROTO);
		return;
	}
	if (rp->type == REDIS_REPLY_NIL || (r->lanes > 1 && q->exists != (long long)r->lanes)) {
		count(r, KVR_STAT_RM_MISSES, 1);
		read_done(r, i, -ENOENT);
		return;
	}
	unsigned reason = KVR_RV_OK;
	uint8_t landed = q->landed;
	if (landed == LAND_NONE && rp->type == REDIS_REPLY_STRING && rp->str) /* parsed before this read was ours */
		landed = land(r, q, rp->str, rp->len);
	if (landed == LAND_BAD)
		reason = q->reason;
	if (rp->type != REDIS_REPLY_STRING || landed == LAND_BAD || landed == LAND_NONE) {
		count(r, KVR_STAT_RM_BAD_VALUES, 1);
		uint64_t now = kvr_now_ns();
		if (now - r->bad_logged_ns > 1000000000ull || !r->bad_logged_ns) {
			char name[KVR_RV_KEY_MAX];
			(void)kvr_rv_key_fmt(name, sizeof(name), r->id.ns, q->key, q->lane);
			kvr_warn("remote %s: value refused (%s, %zu bytes): a miss", name,
				 rp->type != REDIS_REPLY_STRING ? "not a string" : kvr_rv_reason_name(reason), (size_t)rp->len);
			r->bad_logged_ns = now;
		}
		read_done(r, i, -EBADMSG);
		return;
	}
	if (landed == LAND_STALE) {
		count(r, KVR_STAT_RM_READ_ERRORS, 1);
		read_done(r, i, -ESTALE);
		return;
	}
	/* LAND_OK: verified and in the slot */
	count(r, KVR_STAT_RM_HITS, 1);
	count(r, KVR_STAT_RM_BYTES_IN, r->id.lane_bytes);
	kvr_hist_observe(kvr_stats_hist(r->a->stats, KVR_STAT_RM_HIST_GET), kvr_now_ns() - q->first_ns);
	read_done(r, i, 0);
}

static void on_set(redisAsyncContext *ac, void *reply, void *priv)
{
	(void)ac;
	struct remote *r = R;
	uint32_t i = req_of(r, priv);
	if (i == RM_NONE)
		return;
	const redisReply *rp = reply;
	if (!rp && park_after_loss(r, i))
		return;
	if (rp && rp->type == REDIS_REPLY_ERROR) {
		if (redirect(r, i, rp))
			return;
		if (!r->dropped++ || rp->len < 200)
			kvr_warn("remote: SET refused: %s", rp->str);
	}
	write_done(r, i, rp && rp->type != REDIS_REPLY_ERROR);
}

/* ---- requests from the lookup actor --------------------------------------------------------- */

/* Send request i, or park it while no node can take it (retried from the tick until
 * timeout_ms after it was taken), or end it. */
static void send_or_park(struct remote *r, uint32_t i)
{
	struct rreq *q = &r->reqs[i];
	int rc = req_send(r, i);
	q->parked = false;
	if (rc == 0)
		return;
	if ((rc == -ENOTCONN || rc == -EHOSTUNREACH) && kvr_now_ns() - q->first_ns < r->timeout_ns) {
		q->parked = true;
		q->asking = false;
		return;
	}
	if (rc == -ESTALE && q->type == KVR_MSG_L2_WRITE) {
		count(r, KVR_STAT_RM_WRITES_STALE, 1);
		req_put(r, i);
		return;
	}
	req_fail(r, i, rc == -ENOTCONN || rc == -EHOSTUNREACH ? -ETIMEDOUT : rc);
}

/* 0 when started or answered, -EAGAIN when every request slot is in use. */
static int handle(struct remote *r, const struct kvr_msg *m, const struct kvr_msg_l2 *b)
{
	bool read = m->hdr.type == KVR_MSG_L2_READ;
	struct rreq t = {.type = m->hdr.type, .lane = b->lane, .slot = b->slot, .epoch = b->epoch,
			 .req_id = m->hdr.req_id, .key = {b->key_lo, b->key_hi}, .first_ns = kvr_now_ns()};
	if (b->slot >= r->slots->n_slots || b->lane >= r->lanes) {
		if (read)
			send_read_done(r, &t, -EINVAL);
		return 0;
	}
	if (read) {
		count(r, KVR_STAT_RM_READS, 1);
		/* held until the read ended: the slot cannot be reused under the copy */
		if (kvr_slot_pin_remote(r->slots, b->slot, b->epoch, KVR_SLOT_WRITING)) {
			count(r, KVR_STAT_RM_READ_ERRORS, 1);
			send_read_done(r, &t, -ESTALE);
			return 0;
		}
		if (!slot_holds(r, &t)) {
			(void)kvr_slot_unpin(r->slots, b->slot, KVR_PIN_REMOTE);
			count(r, KVR_STAT_RM_READ_ERRORS, 1);
			send_read_done(r, &t, -ESTALE);
			return 0;
		}
	}
	uint32_t i = req_get(r);
	if (i == RM_NONE) {
		if (read)
			(void)kvr_slot_unpin(r->slots, b->slot, KVR_PIN_REMOTE);
		return -EAGAIN;
	}
	uint32_t gen = r->reqs[i].gen;
	r->reqs[i] = t;
	r->reqs[i].gen = gen;
	r->reqs[i].next_free = RM_NONE;
	send_or_park(r, i);
	return 0;
}

/* kvr_backlog's start: a request decoded when it arrived (on_msg checked it). */
static int start(void *ctx, const struct kvr_msg *m)
{
	struct kvr_msg_l2 b;
	(void)kvr_msg_decode_l2(m, 0, &b);
	return handle(ctx, m, &b);
}

static void account(struct remote *r)
{
	kvr_actor_set_held(r->a, r->inflight + r->wait.n);
}

static int remote_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct remote *r = a->data;
	struct kvr_msg_l2 b;
	if (ring != r->in || kvr_msg_decode_l2(m, 0, &b) ||
	    (m->hdr.type != KVR_MSG_L2_READ && m->hdr.type != KVR_MSG_L2_WRITE))
		return -EBADMSG;
	if (kvr_backlog_offer(&r->wait, m, start, r)) { /* cannot happen: the input is held well before */
		kvr_err("%s dropped: %u requests already wait", kvr_msg_type_name(m->hdr.type), r->wait.n);
		return -EBADMSG;
	}
	account(r);
	return 0;
}

static int remote_on_pass(struct kvr_actor *a, uint64_t now_ns)
{
	struct remote *r = a->data;
	(void)now_ns;
	if (r->wait.n && r->free_req != RM_NONE)
		kvr_backlog_retry(&r->wait, start, r);
	account(r);
	return KVR_PASS_IDLE;
}

/* Deadlines: a request past timeout_ms closes its connection; a connect that takes longer
 * does too. Then the slot map, if due. */
static void remote_on_tick(struct kvr_actor *a, uint64_t now)
{
	struct remote *r = a->data;
	bool late[KVR_RC_MAX_NODES] = {false};
	for (uint32_t i = 0; i < r->n_reqs; i++) {
		const struct rreq *q = &r->reqs[i];
		if (q->type && !q->parked && now > q->sent_ns && now - q->sent_ns > r->timeout_ns)
			late[q->node] = true;
	}
	for (unsigned ni = 0; ni < r->map.n_nodes; ni++) {
		struct rnode *n = &r->nodes[ni];
		bool slow_connect = n->st == N_CONNECTING && now - n->since_ns > r->timeout_ns;
		if (n->ac && n->broken) {
			node_close(r, ni, false);
			continue;
		}
		if (!n->ac || (!late[ni] && !slow_connect))
			continue;
		count(r, KVR_STAT_RM_TIMEOUTS, 1);
		kvr_warn("remote %s:%u: %s after %u ms: connection closed, reconnecting", r->map.nodes[ni].host,
			 r->map.nodes[ni].port, slow_connect ? "no connect" : "a request unanswered",
			 a->cfg.remote.timeout_ms);
		node_close(r, ni, true);
	}
	refresh(r, now);
	for (uint32_t i = 0; i < r->n_reqs; i++)
		if (r->reqs[i].type && r->reqs[i].parked)
			send_or_park(r, i);
	if (r->wait.n && r->free_req != RM_NONE)
		kvr_backlog_retry(&r->wait, start, r);
	publish(r);
	account(r);
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

/* Our predecessor's pins: it is dead and reaped (kvringd starts us only then), its copies
 * ended with it. */
static void drop_stale_pins(struct remote *r)
{
	uint32_t dropped = 0;
	for (uint32_t s = 0; s < r->slots->n_slots; s++)
		dropped += kvr_slot_drop_pins(r->slots, s, KVR_PIN_REMOTE);
	if (dropped)
		kvr_warn("released %u remote pins held by the previous remote actor", dropped);
}

static int remote_init(struct kvr_actor *a)
{
	const struct kvr_config *cfg = &a->cfg;
	if (!a->slots || !a->arena_seg.base) {
		kvr_err("no slot table or arena");
		return -EINVAL;
	}
	if (!cfg->remote.n_cluster) {
		kvr_err("remote.cluster is empty");
		return -EINVAL;
	}
	/* values are MiBs: keep freed buffers in the process instead of mapping and unmapping
	 * (and faulting in) several MiB per request */
	(void)mallopt(M_MMAP_THRESHOLD, 64 << 20);
	(void)mallopt(M_TRIM_THRESHOLD, 512 << 20);
	struct remote *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	R = r;
	r->map_dirty = true;
	r->a = a;
	r->slots = a->slots;
	r->lanes = a->slots->quorum;
	r->id = (struct kvr_l2_ident){.ns = a->slots->ns, .fingerprint = a->slots->ns,
				      .block_tokens = a->slots->block_tokens, .lane_bytes = a->slots->slot_bytes};
	r->timeout_ns = kvr_ms_to_ns(cfg->remote.timeout_ms);
	r->send_timeout_ns = kvr_ms_to_ns(cfg->timeouts.reply_ms);
	if (cfg->remote.ttl_s)
		snprintf(r->ttl, sizeof(r->ttl), "%u", cfg->remote.ttl_s);
	r->in = kvr_actor_ring(a, "remote.req");
	r->out = kvr_actor_ring(a, "remote.rep");
	int rc = -ENOENT;
	if (!r->in || !r->out) {
		kvr_err("rings remote.req / remote.rep missing from the ring directory");
		goto fail;
	}
	kvr_backlog_init(&r->wait, a, r->in);
	if (r->lanes > KVR_CTL_MAX_WORKERS) {
		rc = -EINVAL;
		goto fail;
	}
	kvr_rc_map_init(&r->map);
	for (unsigned s = 0; s < cfg->remote.n_cluster; s++) {
		struct kvr_rc_node n;
		rc = kvr_rc_node_parse(cfg->remote.cluster[s], &n);
		if (!rc)
			rc = kvr_rc_map_node(&r->map, n.host, n.port);
		if (rc < 0) {
			kvr_err("remote.cluster[%u] \"%s\": %s", s, cfg->remote.cluster[s], strerror(-rc));
			goto fail;
		}
	}
	r->n_seeds = r->map.n_nodes;
	for (unsigned n = 0; n < KVR_RC_MAX_NODES; n++)
		r->nodes[n] = (struct rnode){.watch = -1, .backoff_ms = RM_BACKOFF_MIN_MS};
	r->n_reqs = cfg->remote.max_inflight;
	r->reqs = calloc(r->n_reqs, sizeof(*r->reqs));
	rc = -ENOMEM;
	if (!r->reqs)
		goto fail;
	for (uint32_t i = 0; i < r->n_reqs; i++)
		r->reqs[i].next_free = i + 1 < r->n_reqs ? i + 1 : RM_NONE;
	r->free_req = 0;
	drop_stale_pins(r);
	discover(r);
	publish(r);
	kvr_info("serving the shared tier: %u seed%s, %u lanes of %llu bytes, timeout %u ms, %u in flight, ttl %s",
		 r->n_seeds, r->n_seeds == 1 ? "" : "s", r->lanes, (unsigned long long)r->id.lane_bytes,
		 cfg->remote.timeout_ms, r->n_reqs, r->ttl[0] ? r->ttl : "none");
	kvr_actor_set_data(a, r);
	return 0;
fail:
	free(r->reqs);
	free(r);
	R = NULL;
	return rc;
}

static void remote_fini(struct kvr_actor *a)
{
	struct remote *r = a->data;
	if (!r)
		return;
	r->closing = true;
	for (unsigned ni = 0; ni < r->map.n_nodes; ni++)
		node_close(r, ni, false); /* what is in flight fails and is answered */
	for (uint32_t i = 0; i < r->n_reqs; i++)
		if (r->reqs[i].type) /* parked: no node had it */
			req_fail(r, i, -ECANCELED);
	struct kvr_msg m;
	while (kvr_backlog_take(&r->wait, &m)) { /* never started: answered as failed */
		struct kvr_msg_l2 b;
		(void)kvr_msg_decode_l2(&m, 0, &b);
		if (m.hdr.type == KVR_MSG_L2_READ) {
			struct rreq t = {.lane = b.lane, .slot = b.slot, .epoch = b.epoch, .req_id = m.hdr.req_id,
					 .key = {b.key_lo, b.key_hi}};
			send_read_done(r, &t, -ECANCELED);
		}
	}
	publish(r);
	if (r->dropped)
		kvr_warn("%llu messages to the lookup actor dropped", (unsigned long long)r->dropped);
	free(r->reqs);
	free(r);
	R = NULL;
	kvr_actor_set_data(a, NULL);
}

static const struct kvr_stage remote_stage = {
	.name = "remote",
	.kind = KVR_ACTOR_REMOTE,
	.tick_ns = RM_TICK_NS,
	.init = remote_init,
	.on_msg = remote_on_msg,
	.on_tick = remote_on_tick,
	.on_pass = remote_on_pass,
	.fini = remote_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &remote_stage);
}
