/* remote: the remote tier actor (kvring-remote) — promotion reads and write-throughs of L1 blocks against a Redis Cluster. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <kvring/msg.h>

#include "kvr_actor.h"
#include "kvr_backlog.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_outbox.h"
#include "kvr_segment.h"
#include "kvr_time.h"
#include "rcluster.h"
#include "resp.h"
#include "rvalue.h"

/*
 * The lookup actor sends this actor the disk tier's messages on "remote.req" and gets the
 * disk tier's answers on "remote.rep" (docs/cluster.md):
 *
 *   L2_READ  (key, lane, slot, epoch)  a promotion: the slot is WRITING, allocated by the
 *            lookup actor. One pipelined round trip to the master of the key's hash slot:
 *            EXISTS of every lane's value (a block counts only when all TP lanes are in
 *            the cluster), then GET of the asked lane. The value's header is checked
 *            (rvalue.h: magic, header checksum, namespace, key, lane, length) BEFORE a
 *            byte reaches the slot; the payload is then read from the socket straight into
 *            the slot and its checksum compared before the answer: READ_DONE 0. A lane
 *            missing is -ENOENT, a value that fails a check -EBADMSG (both a miss, never
 *            served: the slot stays WRITING and the lookup actor frees it), anything else
 *            (no node, connection, timeout) another -errno.
 *   L2_WRITE (key, lane, slot, epoch)  write-through of a COMMITTED slot: SET of header +
 *            payload (+ EX remote.ttl_s). No answer: the lookup actor does not wait for
 *            the shared tier (it is a cache; a write that fails is counted here).
 *
 * Slot safety: a slot is pinned (KVR_PIN_REMOTE) from the check of its state and epoch to
 * the end of the copy — for a read until the bytes are in, for a write until the kernel
 * has taken the payload (writev straight from the slot: no copy in this process). A
 * restarted remote actor drops its predecessor's pins (its process, and so its copies,
 * ended).
 *
 * Connections are kvring's own (hiredis 0.14's async client copies every value into its
 * output buffer and every reply through its reader): one non-blocking TCP socket per
 * master, commands pipelined from an output queue with writev, replies framed by resp.c —
 * a GET's value streams into its slot, every other reply is parsed by hiredis's reader
 * (redisReader: the RESP parser only, no connection). The start-up discovery uses hiredis's
 * blocking client.
 *
 * Cluster: the slot map comes from CLUSTER SLOTS (rcluster.h), asked at start (bounded by
 * timeout_ms, before readiness) and again every RM_REFRESH_NS, after a MOVED and after a
 * node is lost. MOVED updates the map and resends, ASK resends once after ASKING. A
 * request unanswered after remote.timeout_ms closes its connection (a pipelined
 * connection cannot drop one request): everything in flight there fails, and the node is
 * reconnected with backoff. remote.max_inflight bounds the requests in flight; beyond it
 * requests wait (in order) with the input ring held.
 *
 * Nothing here blocks after init (but getaddrinfo for a host name that is not an address,
 * as hiredis did): the sockets are runtime fd watches, deadlines come from the tick.
 */

#define RM_TICK_NS (10ull * 1000000ull)
#define RM_REFRESH_NS (5ull * 1000000000ull)
#define RM_REFRESH_SOON_NS (100ull * 1000000ull) /* after a request found no usable node */
#define RM_BACKOFF_MIN_MS 50u
#define RM_BACKOFF_MAX_MS 2000u
#define RM_MAX_REDIRECTS 3u
#define RM_READ_CHUNK (256u << 10)   /* socket reads of replies that are not streamed */
#define RM_DIRECT_MIN (16u << 10)    /* a streamed value with this much left is read straight into its slot */
#define RM_READ_BUDGET (64ull << 20) /* bytes read per fd callback: the other nodes and the ring get a turn */
#define RM_IOV_MAX 64u
#define RM_NONE 0xffffffffu
#define RM_FINI_FLUSH_NS (1000ull * 1000000ull) /* at exit, queued answers wait this long for room */

/* What a GET's streamed value did (resp.h streams it while the reply is read). */
enum { LAND_NONE = 0, LAND_OK = 1, LAND_BAD = 2, LAND_STALE = 3, LAND_SKIP = 4 };

enum node_state { N_DOWN = 0, N_CONNECTING = 1, N_UP = 2 };

/* The replies one queued command block expects, in order. */
enum rkind { K_ASKING = 1, K_EXISTS, K_GET, K_SET, K_AUTH, K_SLOTS };

/* ASKING + EXISTS of every lane + GET, or the head of a SET, formatted in RESP. */
#define RM_PRE_MAX (64u + (KVR_CTL_MAX_WORKERS + 2u) * (KVR_RV_KEY_MAX + 16u))

/*
 * One block of commands in a node's output queue: pre, then (a SET) the value's header,
 * its payload straight from the slot and post. It stays queued, in order, until its last
 * reply is in (a pipeline answers in order, so the queue is also the list of replies to
 * come); `off` bytes of it are written.
 */
struct rout {
	struct rout *next;
	uint32_t req;             /* its request, RM_NONE for the node's own (AUTH, CLUSTER SLOTS) */
	uint8_t kinds[3], n_kinds, got;
	bool pinned;              /* a SET: KVR_PIN_REMOTE on slot until its payload is written */
	uint32_t slot;
	uint64_t len, off;
	const void *payload;
	uint64_t payload_len;
	struct kvr_rv_hdr hdr;
	uint16_t pre_len, post_len;
	char post[64];
	char pre[RM_PRE_MAX];
};

struct rnode {
	int fd;                   /* -1: no connection */
	int watch;                /* runtime fd watch of fd, -1 */
	uint32_t events;
	enum node_state st;
	uint64_t since_ns;        /* CONNECTING since */
	uint64_t retry_ns;        /* DOWN: no connect before */
	uint32_t backoff_ms;
	bool timed_out;           /* being closed for a request past its deadline */
	int broken;               /* -errno: the connection failed where it could not be closed (a
				   * write from a callback); closed at the end of the callback or tick */
	struct rout *head, *wr, *tail; /* queue: head awaits replies, wr is the first not written */
	struct kvr_resp rx;
	uint32_t sink;            /* the request whose GET value is streaming, RM_NONE */
	uint64_t sink_off, sink_len;
	struct rout auth, slots;
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
	uint32_t gen;             /* bumped per send and end: stale privdata is told apart */
	uint8_t redirects;
	bool asking;
	bool parked;              /* no usable node for it yet: sent again from the tick until
				   * timeout_ms after first_ns (a failover, a map being refreshed) */
	bool queued;              /* out is in a node's queue */
	long long exists;         /* EXISTS answer of this send, -1 none */
	uint8_t landed;           /* LAND_*: what the streamed value did */
	uint8_t reason;           /* LAND_BAD: enum kvr_rv_reason */
	uint32_t next_free;
	struct kvr_rv_hdr vhdr;   /* a GET's value header, as it arrived */
	struct rout out;
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
	struct kvr_outbox out_q;  /* answers that found remote.rep full: no handler waits for room */
	uint64_t set_refusals;    /* SETs the cluster refused since the last "SET refused" line */
	uint64_t set_logged_ns;   /* that line (log_due: at most one a second) ... */
	uint64_t bad_logged_ns;   /* ... and the last "value refused" line */
	bool closing;             /* fini: nothing is parked any more */
	bool map_dirty;           /* publish(): recount masters and covered slots */
	redisReader *reader;      /* parses the replies that are not streamed */
	char rbuf[RM_READ_CHUNK];
	bool is_master[KVR_RC_MAX_NODES];
	unsigned covered;
	uint8_t *mapped;          /* a bit per slot: its pages are in this process's page tables */
};

static struct remote *R; /* the resp callbacks get only the node */

/* ---- stats -------------------------------------------------------------------------------- */

/* A failure that can repeat for every request (a value refused, a SET refused) is logged
 * at most once a second: true when its line is due now (and *last_ns set), else it is only
 * counted. A master stopped for a second must not write a line per block. */
static bool log_due(uint64_t *last_ns, uint64_t now)
{
	if (*last_ns && now - *last_ns < 1000000000ull)
		return false;
	*last_ns = now;
	return true;
}

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

static const char *node_host(const struct remote *r, const struct rnode *n)
{
	return r->map.nodes[n - r->nodes].host;
}

static unsigned node_port(const struct remote *r, const struct rnode *n)
{
	return r->map.nodes[n - r->nodes].port;
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
	/* never waits: a full ring queues the answer, on_pass sends it as room appears */
	if (kvr_outbox_send(&r->out_q, &m, kvr_now_ns())) {
		if (r->out_q.dropped == 1) /* the first drop: out_q.dropped counts them all */
			kvr_warn("remote.rep: READ_DONE dropped (%s)", strerror(ENOBUFS));
		return;
	}
	count(r, KVR_STAT_MSGS_OUT, 1);
}

/* Queued answers to the ring; those that waited send_timeout_ns are dropped (the lookup
 * actor stopped reading: counted in out_q.dropped, logged once). */
static int flush_out(struct remote *r, uint64_t now)
{
	return kvr_outbox_pass(&r->out_q, now, r->send_timeout_ns) ? KVR_PASS_WAITING : KVR_PASS_IDLE;
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

/* ---- a GET's value straight into its slot ---------------------------------------------------- */

/* Before the first copy into or out of a slot in this process: its pages into our page
 * tables in one madvise, not one fault per 4 KiB page inside the socket copy (a fresh
 * instance otherwise spends a quarter of this actor's time in page faults; a slot stays
 * mapped once it was). Never at start: an arena of any size costs nothing until used. */
static void slot_map(struct remote *r, uint32_t slot)
{
	if (r->mapped[slot / 8] & (1u << (slot % 8)))
		return;
	r->mapped[slot / 8] |= (uint8_t)(1u << (slot % 8));
	(void)kvr_populate(kvr_slot_data(r->slots, r->a->arena_seg.base, slot), r->id.lane_bytes); /* best effort */
}

/* Is q's slot still the allocation it asked for? Our pin kept it from reuse; the lookup
 * actor may have aborted it meanwhile. */
static bool slot_current(const struct remote *r, const struct rreq *q)
{
	return kvr_slot_state(r->slots, q->slot) == KVR_SLOT_WRITING && kvr_slot_epoch(r->slots, q->slot) == q->epoch &&
	       slot_holds(r, q);
}

/* resp: a top-level bulk string begins. The reply at the head of the node's queue is a
 * GET's: stream it (into the slot, or nowhere when it cannot count); anything else is
 * captured. */
static bool rx_bulk_begin(void *ctx, uint64_t len)
{
	struct rnode *n = ctx;
	const struct rout *h = n->head;
	if (!h || (h == n->wr && !h->off) || h->req == RM_NONE || h->got >= h->n_kinds || h->kinds[h->got] != K_GET)
		return false; /* not a GET's (or a reply to nothing sent: rx_reply refuses it) */
	struct rreq *q = &R->reqs[h->req];
	n->sink = h->req;
	n->sink_off = 0;
	n->sink_len = len;
	q->landed = R->lanes > 1 && q->exists != (long long)R->lanes ? LAND_SKIP : LAND_NONE;
	return true;
}

static void *rx_bulk_dest(void *ctx, size_t *room)
{
	struct rnode *n = ctx;
	struct rreq *q = &R->reqs[n->sink];
	if (q->landed != LAND_NONE)
		return NULL; /* a miss, a bad header or a stale slot: the rest is dropped */
	if (n->sink_off < sizeof(q->vhdr)) {
		if (*room > sizeof(q->vhdr) - n->sink_off)
			*room = sizeof(q->vhdr) - n->sink_off;
		return (char *)&q->vhdr + n->sink_off;
	}
	return (char *)kvr_slot_data(R->slots, R->a->arena_seg.base, q->slot) + (n->sink_off - sizeof(q->vhdr));
}

static void rx_bulk_wrote(void *ctx, size_t len)
{
	struct rnode *n = ctx;
	struct rreq *q = &R->reqs[n->sink];
	bool hdr_done = n->sink_off < sizeof(q->vhdr) && n->sink_off + len >= sizeof(q->vhdr);
	n->sink_off += len;
	if (!hdr_done || q->landed != LAND_NONE)
		return;
	/* the header is in: every check but the payload checksum, before a byte reaches the slot */
	unsigned reason;
	if (kvr_rv_check_hdr(&q->vhdr, n->sink_len, &R->id, q->key, q->lane, &reason)) {
		q->landed = LAND_BAD;
		q->reason = (uint8_t)reason;
	} else if (!slot_current(R, q)) {
		q->landed = LAND_STALE;
	} else {
		slot_map(R, q->slot);
	}
}

/* The streamed value is complete: its verdict. */
static void rx_value_end(struct rnode *n)
{
	struct rreq *q = &R->reqs[n->sink];
	n->sink = RM_NONE;
	if (q->landed != LAND_NONE)
		return;
	if (n->sink_len < sizeof(q->vhdr)) { /* all of it was header bytes, and too few */
		q->landed = LAND_BAD;
		q->reason = KVR_RV_R_SHORT;
	} else if (kvr_rv_check_payload(&q->vhdr, kvr_slot_data(R->slots, R->a->arena_seg.base, q->slot))) {
		q->landed = LAND_BAD;
		q->reason = KVR_RV_R_PAYLOAD_CSUM;
	} else {
		q->landed = slot_current(R, q) ? LAND_OK : LAND_STALE;
	}
}

/* ---- connections -------------------------------------------------------------------------- */

static void node_fd(struct kvr_actor *a, int fd, uint32_t revents, void *arg);
static void dispatch(struct remote *r, struct rnode *n, uint32_t req, uint8_t kind, const redisReply *rp);
static int rx_reply(void *ctx, const char *raw, size_t len, bool streamed);

static const struct kvr_resp_ops rx_ops = {
	.bulk_begin = rx_bulk_begin,
	.bulk_dest = rx_bulk_dest,
	.bulk_wrote = rx_bulk_wrote,
	.reply = rx_reply,
};

static void ev_set(struct remote *r, struct rnode *n, uint32_t events)
{
	if (n->events == events)
		return;
	n->events = events;
	if (n->watch >= 0)
		kvr_actor_watch_events(r->a, n->watch, events);
}

/* Drop node n's connection (from outside its reply processing): every request queued
 * there is answered as if its reply were NULL (parked while its time is not up, else
 * failed), pins of unwritten SETs go. */
static void node_down(struct remote *r, unsigned ni, bool timed_out)
{
	struct rnode *n = &r->nodes[ni];
	if (n->fd < 0)
		return;
	if (n->watch >= 0)
		kvr_actor_unwatch_fd(r->a, n->watch);
	close(n->fd);
	n->fd = n->watch = -1;
	n->events = 0;
	n->st = N_DOWN;
	n->broken = 0;
	n->retry_ns = kvr_now_ns() + (uint64_t)n->backoff_ms * 1000000ull;
	n->backoff_ms = n->backoff_ms * 2 > RM_BACKOFF_MAX_MS ? RM_BACKOFF_MAX_MS : n->backoff_ms * 2;
	r->next_refresh_ns = 0; /* a node lost: its slots may have moved to a replica */
	kvr_resp_reset(&n->rx);
	n->sink = RM_NONE;
	struct rout *e = n->head;
	n->head = n->wr = n->tail = NULL;
	n->timed_out = timed_out;
	while (e) {
		struct rout *next = e->next;
		e->next = NULL;
		if (e->pinned) {
			(void)kvr_slot_unpin(r->slots, e->slot, KVR_PIN_REMOTE);
			e->pinned = false;
		}
		if (e->req != RM_NONE) {
			r->reqs[e->req].queued = false;
			dispatch(r, n, e->req, e->kinds[e->n_kinds - 1], NULL);
		} else if (e->kinds[0] == K_SLOTS) {
			r->refreshing = false;
		}
		e = next;
	}
	n->timed_out = false;
}

/* The first error of a connection seen where it cannot be closed: closed soon after. */
static void node_broke(struct rnode *n, int err)
{
	if (!n->broken)
		n->broken = err;
}

static void node_settle(struct remote *r, unsigned ni)
{
	struct rnode *n = &r->nodes[ni];
	if (n->fd < 0 || !n->broken)
		return;
	count(r, KVR_STAT_RM_CONN_ERRORS, 1);
	kvr_warn("remote %s:%u: connection lost: %s", node_host(r, n), node_port(r, n), strerror(-n->broken));
	node_down(r, ni, false);
}

/* Write what the queue holds, from n->wr on, without waiting. */
static void node_flush(struct remote *r, struct rnode *n)
{
	while (n->st == N_UP && n->wr && !n->broken) {
		struct iovec iov[RM_IOV_MAX];
		unsigned k = 0;
		for (struct rout *e = n->wr; e && k + 4 <= RM_IOV_MAX; e = e->next) {
			const struct {
				const void *p;
				uint64_t len;
			} part[4] = {{e->pre, e->pre_len},
				     {&e->hdr, e->payload ? sizeof(e->hdr) : 0},
				     {e->payload, e->payload_len},
				     {e->post, e->post_len}};
			uint64_t skip = e == n->wr ? e->off : 0;
			for (unsigned p = 0; p < 4; p++) {
				if (skip >= part[p].len) {
					skip -= part[p].len;
					continue;
				}
				iov[k++] = (struct iovec){(char *)part[p].p + skip, part[p].len - skip};
				skip = 0;
			}
		}
		ssize_t put = writev(n->fd, iov, (int)k);
		if (put < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				node_broke(n, -errno);
			break;
		}
		uint64_t left = (uint64_t)put;
		while (left && n->wr) {
			struct rout *e = n->wr;
			uint64_t take = e->len - e->off < left ? e->len - e->off : left;
			e->off += take;
			left -= take;
			if (e->off < e->len)
				break;
			if (e->pinned) { /* the kernel has the payload */
				(void)kvr_slot_unpin(r->slots, e->slot, KVR_PIN_REMOTE);
				e->pinned = false;
			}
			n->wr = e->next;
		}
	}
	uint32_t ev = n->st == N_CONNECTING ? POLLOUT : POLLIN | (n->wr ? POLLOUT : 0);
	ev_set(r, n, ev);
}

/* Queue e (its pre/post/payload set) on node n and write what can be written now. */
static void node_push(struct remote *r, struct rnode *n, struct rout *e)
{
	e->next = NULL;
	e->off = 0;
	e->got = 0;
	e->len = e->pre_len + (e->payload ? sizeof(e->hdr) + e->payload_len : 0) + e->post_len;
	if (n->tail)
		n->tail->next = e;
	else
		n->head = e;
	n->tail = e;
	if (!n->wr)
		n->wr = e;
	node_flush(r, n);
}

/* One command formatted by hiredis (redisFormatCommandArgv), appended to buf at *at; false
 * when it does not fit RM_PRE_MAX (it always does: keys and config strings are bounded). */
static bool fmt_cmd(char *buf, uint16_t *at, unsigned argc, const char *const *argv, const size_t *argl)
{
	char *cmd = NULL;
	int n = redisFormatCommandArgv(&cmd, (int)argc, (const char **)argv, argl);
	bool ok = n > 0 && (size_t)n <= RM_PRE_MAX - *at;
	if (ok) {
		memcpy(buf + *at, cmd, (size_t)n);
		*at = (uint16_t)(*at + n);
	}
	redisFreeCommand(cmd);
	return ok;
}

static void ctl_cmd(struct rout *e, uint8_t kind, unsigned argc, const char *const *argv)
{
	size_t argl[4];
	for (unsigned i = 0; i < argc; i++)
		argl[i] = strlen(argv[i]);
	memset(e, 0, offsetof(struct rout, pre));
	e->req = RM_NONE;
	e->kinds[0] = kind;
	e->n_kinds = 1;
	(void)fmt_cmd(e->pre, &e->pre_len, argc, argv, argl); /* AUTH / CLUSTER SLOTS: bounded by the config */
}

/* A socket to host:port, connecting (non-blocking). -errno on failure. */
static int tcp_start(const char *host, unsigned port)
{
	char ps[8];
	snprintf(ps, sizeof(ps), "%u", port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(host, ps, &hints, &ai);
	if (rc == EAI_NONAME) { /* a name, not an address: resolved (blocking) as hiredis did */
		hints.ai_flags = 0;
		rc = getaddrinfo(host, ps, &hints, &ai);
	}
	if (rc)
		return rc == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		freeaddrinfo(ai);
		return rc;
	}
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS) {
		rc = -errno;
		close(fd);
		freeaddrinfo(ai);
		return rc;
	}
	freeaddrinfo(ai);
	return fd;
}

/* Node ni with a connection (maybe still connecting: commands queue until it is up), or
 * NULL: none, and its backoff has not passed or the connect failed at once. */
static struct rnode *node_ctx(struct remote *r, unsigned ni)
{
	struct rnode *n = &r->nodes[ni];
	if (n->fd >= 0)
		return n;
	uint64_t now = kvr_now_ns();
	if (now < n->retry_ns)
		return NULL;
	const struct kvr_rc_node *addr = &r->map.nodes[ni];
	int fd = tcp_start(addr->host, addr->port);
	if (fd >= 0) {
		n->watch = kvr_actor_watch_fd(r->a, fd, POLLOUT, node_fd, n); /* POLLOUT: the connect completes */
		if (n->watch < 0) {
			kvr_err("remote %s:%u: cannot watch the socket: %s", addr->host, addr->port, strerror(-n->watch));
			close(fd);
			n->watch = -1;
			n->retry_ns = now + (uint64_t)RM_BACKOFF_MAX_MS * 1000000ull;
			return NULL;
		}
	} else {
		count(r, KVR_STAT_RM_CONN_ERRORS, 1);
		kvr_warn("remote %s:%u: cannot connect: %s", addr->host, addr->port, strerror(-fd));
		n->retry_ns = now + (uint64_t)n->backoff_ms * 1000000ull;
		return NULL;
	}
	n->fd = fd;
	n->events = POLLOUT;
	n->st = N_CONNECTING;
	n->since_ns = now;
	n->broken = 0;
	n->sink = RM_NONE;
	kvr_resp_reset(&n->rx);
	const struct kvr_config *cfg = &r->a->cfg;
	if (cfg->remote.password[0]) {
		const char *argv[3] = {"AUTH", cfg->remote.user[0] ? cfg->remote.user : cfg->remote.password,
				       cfg->remote.password};
		ctl_cmd(&n->auth, K_AUTH, cfg->remote.user[0] ? 3 : 2, argv);
		node_push(r, n, &n->auth);
	}
	return n;
}

/* The socket connected (or failed to). */
static void node_connected(struct remote *r, unsigned ni)
{
	struct rnode *n = &r->nodes[ni];
	int err = 0;
	socklen_t el = sizeof(err);
	if (getsockopt(n->fd, SOL_SOCKET, SO_ERROR, &err, &el))
		err = errno;
	if (err) {
		count(r, KVR_STAT_RM_CONN_ERRORS, 1);
		kvr_warn("remote %s:%u: connect failed: %s", node_host(r, n), node_port(r, n), strerror(err));
		node_down(r, ni, false);
		return;
	}
	n->st = N_UP;
	n->backoff_ms = RM_BACKOFF_MIN_MS;
	node_flush(r, n);
}

/* resp: a reply is complete; it belongs to the head of the queue. */
static int rx_reply(void *ctx, const char *raw, size_t len, bool streamed)
{
	struct rnode *n = ctx;
	struct remote *r = R;
	struct rout *h = n->head;
	if (!h || (h == n->wr && (!h->off || h->got + 1 == h->n_kinds))) {
		node_broke(n, -EPROTO); /* a reply to nothing we sent (or to a command not all sent) */
		return 1;
	}
	uint8_t kind = h->kinds[h->got++];
	uint32_t req = h->req;
	if (h->got == h->n_kinds) { /* its last reply: off the queue before anything resends it */
		n->head = h->next;
		if (n->tail == h)
			n->tail = NULL;
		h->next = NULL;
		if (req != RM_NONE)
			r->reqs[req].queued = false;
	}
	if (streamed) {
		rx_value_end(n);
		redisReply v = {.type = REDIS_REPLY_STRING, .len = len};
		dispatch(r, n, req, kind, &v);
		return n->broken ? 1 : 0;
	}
	void *rp = NULL;
	if (redisReaderFeed(r->reader, raw, len) != REDIS_OK || redisReaderGetReply(r->reader, &rp) != REDIS_OK ||
	    !rp) {
		/* cannot happen for a reply resp framed; the reader may be unusable: start anew */
		redisReaderFree(r->reader);
		r->reader = redisReaderCreate();
		node_broke(n, r->reader ? -EPROTO : -ENOMEM);
		return 1;
	}
	dispatch(r, n, req, kind, rp);
	freeReplyObject(rp);
	return n->broken ? 1 : 0;
}

static void node_fd(struct kvr_actor *a, int fd, uint32_t revents, void *arg)
{
	(void)a;
	struct remote *r = R;
	struct rnode *n = arg;
	unsigned ni = (unsigned)(n - r->nodes);
	if (n->fd != fd)
		return;
	if (n->st == N_CONNECTING) {
		if (revents & (POLLOUT | POLLERR | POLLHUP))
			node_connected(r, ni);
		return;
	}
	if (revents & POLLOUT)
		node_flush(r, n);
	if (!(revents & (POLLIN | POLLERR | POLLHUP)))
		goto out;
	/* a streamed value is read straight into its slot; everything else through rbuf and resp */
	for (uint64_t budget = RM_READ_BUDGET; budget && !n->broken;) {
		uint64_t left = kvr_resp_stream_left(&n->rx);
		ssize_t got;
		if (left >= RM_DIRECT_MIN) {
			size_t room = left > budget ? (size_t)budget : (size_t)left;
			void *dst = rx_bulk_dest(n, &room);
			if (!dst) {
				dst = r->rbuf;
				room = room < sizeof(r->rbuf) ? room : sizeof(r->rbuf);
			}
			got = read(fd, dst, room);
			if (got > 0) {
				kvr_resp_streamed(&n->rx, (size_t)got);
				budget -= (uint64_t)got < budget ? (uint64_t)got : budget;
				continue;
			}
		} else {
			got = read(fd, r->rbuf, sizeof(r->rbuf));
			if (got > 0) {
				int rc = kvr_resp_feed(&n->rx, r->rbuf, (size_t)got);
				if (rc < 0)
					node_broke(n, rc);
				budget -= (uint64_t)got < budget ? (uint64_t)got : budget;
				continue;
			}
		}
		if (got == 0) {
			node_broke(n, -ECONNRESET); /* the server closed the connection */
			break;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			node_broke(n, -errno);
		break;
	}
out:
	node_settle(r, ni);
}

/* ---- the slot map -------------------------------------------------------------------------- */

static void on_slots(struct remote *r, struct rnode *n, const redisReply *rp)
{
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

static void on_auth(struct remote *r, struct rnode *n, const redisReply *rp)
{
	if (rp && rp->type == REDIS_REPLY_ERROR) {
		kvr_err("remote %s:%u: AUTH refused: %s", node_host(r, n), node_port(r, n), rp->str);
		count(r, KVR_STAT_RM_REPLY_ERRORS, 1);
		n->backoff_ms = RM_BACKOFF_MAX_MS;
		node_broke(n, -EACCES);
	}
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
	struct rnode *n = node_ctx(r, pick);
	if (!n)
		return;
	static const char *const argv[2] = {"CLUSTER", "SLOTS"};
	ctl_cmd(&n->slots, K_SLOTS, 2, argv);
	r->refreshing = true;
	r->refresh_node = pick;
	node_push(r, n, &n->slots);
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
	struct rnode *n = node_ctx(r, q->node);
	if (!n) {
		refresh_soon(r); /* its master is down: a replica may have taken over */
		return -ENOTCONN;
	}
	struct rout *e = &q->out;
	memset(e, 0, offsetof(struct rout, pre));
	e->req = i;
	q->gen++;
	q->exists = -1;
	q->landed = LAND_NONE;
	q->sent_ns = kvr_now_ns();
	if (q->asking) {
		static const char *const asking[1] = {"ASKING"};
		static const size_t asking_l[1] = {6};
		(void)fmt_cmd(e->pre, &e->pre_len, 1, asking, asking_l);
		e->kinds[e->n_kinds++] = K_ASKING;
	}
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
			(void)fmt_cmd(e->pre, &e->pre_len, 1 + r->lanes, argv, argl); /* RM_PRE_MAX holds it */
			e->kinds[e->n_kinds++] = K_EXISTS;
		}
		const char *argv[2] = {"GET", name};
		size_t argl[2] = {3, len};
		(void)fmt_cmd(e->pre, &e->pre_len, 2, argv, argl);
		e->kinds[e->n_kinds++] = K_GET;
	} else {
		/* SET name <header + payload> [EX ttl]: the command up to the value's length, then
		 * the header and the payload straight from the slot, written under our pin */
		if (kvr_slot_pin_remote(r->slots, q->slot, q->epoch, KVR_SLOT_COMMITTED))
			return -ESTALE;
		if (!slot_holds(r, q)) {
			(void)kvr_slot_unpin(r->slots, q->slot, KVR_PIN_REMOTE);
			return -ESTALE;
		}
		slot_map(r, q->slot);
		e->payload = kvr_slot_data(r->slots, r->a->arena_seg.base, q->slot);
		e->payload_len = r->id.lane_bytes;
		e->pinned = true;
		e->slot = q->slot;
		kvr_rv_hdr_build(&e->hdr, &r->id, q->key, q->lane, e->payload);
		int w = snprintf(e->pre + e->pre_len, RM_PRE_MAX - e->pre_len, "*%d\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%llu\r\n",
				 r->ttl[0] ? 5 : 3, len, name,
				 (unsigned long long)(KVR_RV_HDR_BYTES + r->id.lane_bytes));
		e->pre_len = (uint16_t)(e->pre_len + w);
		w = snprintf(e->post, sizeof(e->post), "\r\n");
		if (r->ttl[0])
			w += snprintf(e->post + w, sizeof(e->post) - (size_t)w, "$2\r\nEX\r\n$%zu\r\n%s\r\n", strlen(r->ttl),
				      r->ttl);
		e->post_len = (uint16_t)w;
		e->kinds[e->n_kinds++] = K_SET;
	}
	q->queued = true;
	node_push(r, n, e);
	return 0;
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

static void on_get(struct remote *r, uint32_t i, const redisReply *rp)
{
	struct rreq *q = &r->reqs[i];
	if (!rp && park_after_loss(r, i))
		return;
	if (!rp) {
		req_fail(r, i, -ETIMEDOUT);
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
	if (rp->type != REDIS_REPLY_STRING || q->landed == LAND_BAD || q->landed == LAND_NONE) {
		count(r, KVR_STAT_RM_BAD_VALUES, 1);
		if (log_due(&r->bad_logged_ns, kvr_now_ns())) {
			char name[KVR_RV_KEY_MAX];
			(void)kvr_rv_key_fmt(name, sizeof(name), r->id.ns, q->key, q->lane);
			kvr_warn("remote %s: value refused (%s, %zu bytes): a miss", name,
				 rp->type != REDIS_REPLY_STRING ? "not a string" : kvr_rv_reason_name(q->reason),
				 (size_t)rp->len);
		}
		read_done(r, i, -EBADMSG);
		return;
	}
	if (q->landed == LAND_STALE) {
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

static void on_set(struct remote *r, uint32_t i, const redisReply *rp)
{
	if (!rp && park_after_loss(r, i))
		return;
	if (rp && rp->type == REDIS_REPLY_ERROR) {
		if (redirect(r, i, rp))
			return;
		/* each is counted (write_errors); the line says how many went unlogged before it */
		if (log_due(&r->set_logged_ns, kvr_now_ns())) {
			if (r->set_refusals)
				kvr_warn("remote: SET refused: %.200s (and %llu more since the last such line)", rp->str,
					 (unsigned long long)r->set_refusals);
			else
				kvr_warn("remote: SET refused: %.200s", rp->str);
			r->set_refusals = 0;
		} else {
			r->set_refusals++;
		}
	}
	write_done(r, i, rp && rp->type != REDIS_REPLY_ERROR);
}

/* A reply (NULL: the connection went first) of kind for request req (RM_NONE: node n's own). */
static void dispatch(struct remote *r, struct rnode *n, uint32_t req, uint8_t kind, const redisReply *rp)
{
	switch (kind) {
	case K_AUTH:
		on_auth(r, n, rp);
		return;
	case K_SLOTS:
		on_slots(r, n, rp);
		return;
	case K_ASKING:
		return; /* an ASKING refused shows in the reply after it */
	case K_EXISTS:
		if (rp && rp->type == REDIS_REPLY_INTEGER)
			r->reqs[req].exists = rp->integer;
		return;
	case K_GET:
		on_get(r, req, rp);
		return;
	case K_SET:
		on_set(r, req, rp);
		return;
	}
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

/* Connections that broke while a request was being sent (outside their fd callback). */
static void settle_all(struct remote *r)
{
	for (unsigned ni = 0; ni < r->map.n_nodes; ni++)
		node_settle(r, ni);
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
	if (r->wait.n && r->free_req != RM_NONE)
		kvr_backlog_retry(&r->wait, start, r);
	settle_all(r);
	account(r);
	return flush_out(r, now_ns);
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
	settle_all(r);
	for (unsigned ni = 0; ni < r->map.n_nodes; ni++) {
		struct rnode *n = &r->nodes[ni];
		bool slow_connect = n->st == N_CONNECTING && now - n->since_ns > r->timeout_ns;
		if (n->fd < 0 || (!late[ni] && !slow_connect))
			continue;
		count(r, KVR_STAT_RM_TIMEOUTS, 1);
		kvr_warn("remote %s:%u: %s after %u ms: connection closed, reconnecting", r->map.nodes[ni].host,
			 r->map.nodes[ni].port, slow_connect ? "no connect" : "a request unanswered",
			 a->cfg.remote.timeout_ms);
		node_down(r, ni, true);
	}
	refresh(r, now);
	for (uint32_t i = 0; i < r->n_reqs; i++)
		if (r->reqs[i].type && r->reqs[i].parked)
			send_or_park(r, i);
	if (r->wait.n && r->free_req != RM_NONE)
		kvr_backlog_retry(&r->wait, start, r);
	settle_all(r);
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
	/* it reads and writes slots: populated in the loop */
	(void)kvr_actor_populate_add(a, a->arena_seg.base, a->arena_seg.size, true, "arena");
	if (!cfg->remote.n_cluster) {
		kvr_err("remote.cluster is empty");
		return -EINVAL;
	}
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
	kvr_outbox_init(&r->out_q, r->out);
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
	for (unsigned n = 0; n < KVR_RC_MAX_NODES; n++) {
		r->nodes[n] = (struct rnode){.fd = -1, .watch = -1, .backoff_ms = RM_BACKOFF_MIN_MS, .sink = RM_NONE};
		kvr_resp_init(&r->nodes[n].rx, &rx_ops, &r->nodes[n]);
	}
	r->n_reqs = cfg->remote.max_inflight;
	r->reqs = calloc(r->n_reqs, sizeof(*r->reqs));
	r->reader = redisReaderCreate();
	r->mapped = calloc(r->slots->n_slots / 8 + 1, 1);
	rc = -ENOMEM;
	if (!r->reqs || !r->reader || !r->mapped)
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
	if (r->reader)
		redisReaderFree(r->reader);
	free(r->mapped);
	kvr_outbox_free(&r->out_q);
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
		node_down(r, ni, false); /* what is in flight fails and is answered */
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
	(void)kvr_outbox_drain(&r->out_q, RM_FINI_FLUSH_NS); /* the answers still queued: a while to be taken */
	publish(r);
	if (r->out_q.dropped)
		kvr_warn("%llu messages to the lookup actor dropped", (unsigned long long)r->out_q.dropped);
	kvr_outbox_free(&r->out_q);
	for (unsigned n = 0; n < KVR_RC_MAX_NODES; n++)
		kvr_resp_fini(&r->nodes[n].rx);
	redisReaderFree(r->reader);
	free(r->mapped);
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
