/* rtier: the remote tier's requests — a promotion (EXISTS + GET into its slot) or a write-through (SET from its slot), from the lookup actor's message to its answer. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvr_log.h"
#include "kvr_segment.h"
#include "kvr_time.h"
#include "remote.h"

/*
 * A request (struct rreq, one of remote.max_inflight) holds its slot pinned (KVR_PIN_REMOTE)
 * from the check of the slot's state and epoch to the end of the copy. Its commands are one
 * struct rout queued on the master of the key's hash slot (rm_route, rm_node_push); its
 * replies come back through rm_req_reply, a GET's value through the rm_get_* streaming
 * callbacks straight into the slot. A request whose node is lost is parked and sent again
 * from the tick while its time (remote.timeout_ms from when it was taken) is not up.
 */

#define RM_MAX_REDIRECTS 3u

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

void rm_send_read_done(struct remote *r, const struct rreq *q, int status)
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
	rm_count(r, KVR_STAT_MSGS_OUT, 1);
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
	rm_send_read_done(r, q, status);
	req_put(r, i);
}

static void write_done(struct remote *r, uint32_t i, bool ok)
{
	struct rreq *q = &r->reqs[i];
	if (ok) {
		rm_count(r, KVR_STAT_RM_WRITES, 1);
		rm_count(r, KVR_STAT_RM_BYTES_OUT, r->id.lane_bytes);
		kvr_hist_observe(kvr_stats_hist(r->a->stats, KVR_STAT_RM_HIST_SET), kvr_now_ns() - q->first_ns);
	} else {
		rm_count(r, KVR_STAT_RM_WRITE_ERRORS, 1);
	}
	req_put(r, i);
}

void rm_req_fail(struct remote *r, uint32_t i, int err)
{
	if (r->reqs[i].type == KVR_MSG_L2_READ) {
		rm_count(r, KVR_STAT_RM_READ_ERRORS, 1);
		read_done(r, i, err);
	} else {
		write_done(r, i, false);
	}
}

/* ---- a GET's value straight into its slot ------------------------------------------------- */

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

/* The identity a value of slot's block must carry: the instance's, with the slot's block
 * size where the instance holds several (no model section: r->id.block_tokens 0). */
static const struct kvr_l2_ident *slot_ident(const struct remote *r, uint32_t slot, struct kvr_l2_ident *buf)
{
	if (r->id.block_tokens)
		return &r->id;
	*buf = r->id;
	buf->block_tokens = kvr_slot_at(r->slots, slot)->block_tokens;
	return buf;
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
bool rm_get_begin(void *ctx, uint64_t len)
{
	struct rnode *n = ctx;
	const struct rout *h = n->head;
	if (!h || (h == n->wr && !h->off) || h->req == RM_NONE || h->got >= h->n_kinds || h->kinds[h->got] != K_GET)
		return false; /* not a GET's (or a reply to nothing sent: rx_reply refuses it) */
	struct rreq *q = &n->r->reqs[h->req];
	n->sink = h->req;
	n->sink_off = 0;
	n->sink_len = len;
	q->landed = q->lanes > 1 && q->exists != (long long)q->lanes ? LAND_SKIP : LAND_NONE;
	return true;
}

void *rm_get_dest(void *ctx, size_t *room)
{
	struct rnode *n = ctx;
	struct rreq *q = &n->r->reqs[n->sink];
	if (q->landed != LAND_NONE)
		return NULL; /* a miss, a bad header or a stale slot: the rest is dropped */
	if (n->sink_off < sizeof(q->vhdr)) {
		if (*room > sizeof(q->vhdr) - n->sink_off)
			*room = sizeof(q->vhdr) - n->sink_off;
		return (char *)&q->vhdr + n->sink_off;
	}
	return (char *)kvr_slot_data(n->r->slots, n->r->a->arena_seg.base, q->slot) + (n->sink_off - sizeof(q->vhdr));
}

void rm_get_wrote(void *ctx, size_t len)
{
	struct rnode *n = ctx;
	struct rreq *q = &n->r->reqs[n->sink];
	bool hdr_done = n->sink_off < sizeof(q->vhdr) && n->sink_off + len >= sizeof(q->vhdr);
	n->sink_off += len;
	if (!hdr_done || q->landed != LAND_NONE)
		return;
	/* the header is in: every check but the payload checksum, before a byte reaches the slot */
	unsigned reason;
	struct kvr_l2_ident id;
	if (kvr_rv_check_hdr(&q->vhdr, n->sink_len, slot_ident(n->r, q->slot, &id), q->key, q->lane, &reason)) {
		q->landed = LAND_BAD;
		q->reason = (uint8_t)reason;
	} else if (!slot_current(n->r, q)) {
		q->landed = LAND_STALE;
	} else {
		slot_map(n->r, q->slot);
	}
}

/* The streamed value is complete: its verdict. */
void rm_get_end(struct rnode *n)
{
	struct rreq *q = &n->r->reqs[n->sink];
	n->sink = RM_NONE;
	if (q->landed != LAND_NONE)
		return;
	if (n->sink_len < sizeof(q->vhdr)) { /* all of it was header bytes, and too few */
		q->landed = LAND_BAD;
		q->reason = KVR_RV_R_SHORT;
	} else if (kvr_rv_check_payload(&q->vhdr, kvr_slot_data(n->r->slots, n->r->a->arena_seg.base, q->slot))) {
		q->landed = LAND_BAD;
		q->reason = KVR_RV_R_PAYLOAD_CSUM;
	} else {
		q->landed = slot_current(n->r, q) ? LAND_OK : LAND_STALE;
	}
}

/* ---- sending ------------------------------------------------------------------------------ */

/* Send request i (again): 0, or -errno when it cannot go now: -EHOSTUNREACH / -ENOTCONN
 * (no usable node: the caller parks it), -ESTALE (a write whose slot changed). */
static int req_send(struct remote *r, uint32_t i)
{
	struct rreq *q = &r->reqs[i];
	char name[KVR_RV_KEY_MAX];
	size_t len = kvr_rv_key_fmt(name, sizeof(name), r->id.ns, q->key, q->lane);
	if (!q->asking) {
		q->node = rm_route(r, name, len);
		if (q->node == RM_NONE) {
			rm_refresh_soon(r);
			return -EHOSTUNREACH;
		}
	}
	struct rnode *n = rm_node_ctx(r, q->node);
	if (!n) {
		rm_refresh_soon(r); /* its master is down: a replica may have taken over */
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
		(void)rm_fmt_cmd(e->pre, &e->pre_len, 1, asking, asking_l);
		e->kinds[e->n_kinds++] = K_ASKING;
	}
	if (q->type == KVR_MSG_L2_READ) {
		if (q->lanes > 1) {
			const char *argv[1 + KVR_CTL_MAX_WORKERS];
			size_t argl[1 + KVR_CTL_MAX_WORKERS];
			char names[KVR_CTL_MAX_WORKERS][KVR_RV_KEY_MAX];
			argv[0] = "EXISTS";
			argl[0] = 6;
			for (unsigned l = 0; l < q->lanes; l++) {
				argl[1 + l] = kvr_rv_key_fmt(names[l], sizeof(names[l]), r->id.ns, q->key, l);
				argv[1 + l] = names[l];
			}
			(void)rm_fmt_cmd(e->pre, &e->pre_len, 1 + q->lanes, argv, argl); /* RM_PRE_MAX holds it */
			e->kinds[e->n_kinds++] = K_EXISTS;
		}
		const char *argv[2] = {"GET", name};
		size_t argl[2] = {3, len};
		(void)rm_fmt_cmd(e->pre, &e->pre_len, 2, argv, argl);
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
		struct kvr_l2_ident id;
		kvr_rv_hdr_build(&e->hdr, slot_ident(r, q->slot, &id), q->key, q->lane, e->payload);
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
	rm_node_push(r, n, e);
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
		rm_count(r, KVR_STAT_RM_REPLY_ERRORS, 1);
		return false;
	}
	if (!to.host[0])
		memcpy(to.host, r->map.nodes[q->node].host, sizeof(to.host));
	rm_count(r, ask ? KVR_STAT_RM_ASK : KVR_STAT_RM_MOVED, 1);
	if (q->redirects++ >= RM_MAX_REDIRECTS)
		return false;
	int ni = ask ? kvr_rc_map_node(&r->map, to.host, to.port) : kvr_rc_map_set(&r->map, slot, to.host, to.port);
	if (ni < 0)
		return false;
	if (!ask) {
		rm_map_changed(r);
		r->next_refresh_ns = 0; /* more of the map has likely moved */
	}
	q->asking = ask;
	q->node = (unsigned)ni;
	return req_send(r, i) == 0;
}

/* ---- replies ------------------------------------------------------------------------------ */

static void on_get(struct remote *r, uint32_t i, const redisReply *rp)
{
	struct rreq *q = &r->reqs[i];
	if (!rp && park_after_loss(r, i))
		return;
	if (!rp) {
		rm_req_fail(r, i, -ETIMEDOUT);
		return;
	}
	if (rp->type == REDIS_REPLY_ERROR) {
		if (!redirect(r, i, rp))
			rm_req_fail(r, i, -EPROTO);
		return;
	}
	if (rp->type == REDIS_REPLY_NIL || (q->lanes > 1 && q->exists != (long long)q->lanes)) {
		rm_count(r, KVR_STAT_RM_MISSES, 1);
		read_done(r, i, -ENOENT);
		return;
	}
	if (rp->type != REDIS_REPLY_STRING || q->landed == LAND_BAD || q->landed == LAND_NONE) {
		rm_count(r, KVR_STAT_RM_BAD_VALUES, 1);
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
		rm_count(r, KVR_STAT_RM_READ_ERRORS, 1);
		read_done(r, i, -ESTALE);
		return;
	}
	/* LAND_OK: verified and in the slot */
	rm_count(r, KVR_STAT_RM_HITS, 1);
	rm_count(r, KVR_STAT_RM_BYTES_IN, r->id.lane_bytes);
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

void rm_req_reply(struct remote *r, uint32_t req, uint8_t kind, const redisReply *rp)
{
	switch (kind) {
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

/* ---- requests from the lookup actor ------------------------------------------------------- */

/* Send request i, or park it while no node can take it (retried from the tick until
 * timeout_ms after it was taken), or end it. */
void rm_send_or_park(struct remote *r, uint32_t i)
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
		rm_count(r, KVR_STAT_RM_WRITES_STALE, 1);
		req_put(r, i);
		return;
	}
	rm_req_fail(r, i, rc == -ENOTCONN || rc == -EHOSTUNREACH ? -ETIMEDOUT : rc);
}

/* 0 when started or answered, -EAGAIN when every request slot is in use. */
static int handle(struct remote *r, const struct kvr_msg *m, const struct kvr_msg_l2 *b)
{
	bool read = m->hdr.type == KVR_MSG_L2_READ;
	struct rreq t = {.type = m->hdr.type, .lane = b->lane, .slot = b->slot, .epoch = b->epoch,
			 .req_id = m->hdr.req_id, .key = {b->key_lo, b->key_hi}, .first_ns = kvr_now_ns()};
	if (b->slot >= r->slots->n_slots || b->lane >= r->lanes) {
		if (read)
			rm_send_read_done(r, &t, -EINVAL);
		return 0;
	}
	if (read) {
		rm_count(r, KVR_STAT_RM_READS, 1);
		/* held until the read ended: the slot cannot be reused under the copy */
		if (kvr_slot_pin_remote(r->slots, b->slot, b->epoch, KVR_SLOT_WRITING)) {
			rm_count(r, KVR_STAT_RM_READ_ERRORS, 1);
			rm_send_read_done(r, &t, -ESTALE);
			return 0;
		}
		/* the block's lanes: the table's quorum, or (several) its slot's, set at allocation */
		t.lanes = (uint8_t)kvr_slot_block_lanes(r->slots, b->slot);
		int bad = !slot_holds(r, &t) ? -ESTALE : !t.lanes || b->lane >= t.lanes ? -EINVAL : 0;
		if (bad) {
			(void)kvr_slot_unpin(r->slots, b->slot, KVR_PIN_REMOTE);
			rm_count(r, KVR_STAT_RM_READ_ERRORS, 1);
			rm_send_read_done(r, &t, bad);
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
	rm_send_or_park(r, i);
	return 0;
}

/* kvr_backlog's start: a request decoded when it arrived (on_msg checked it). */
int rm_req_start(void *ctx, const struct kvr_msg *m)
{
	struct kvr_msg_l2 b;
	(void)kvr_msg_decode_l2(m, 0, &b);
	return handle(ctx, m, &b);
}
