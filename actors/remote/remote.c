/* remote: the remote tier actor (kvring-remote) — promotion reads and write-throughs of L1 blocks against a Redis Cluster. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include <kvring/msg.h>

#include "kvr_log.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "remote.h"

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
/*
 * Files: this one is the actor (its stage callbacks, init and exit, the stats it publishes);
 * rtier.c one request from message to answer (the value checks, the pins, redirects);
 * rconn.c the connections (sockets, output queues, reply framing); rmap.c the slot map
 * (discovery, refreshes, routing). remote.h holds the state they share; rcluster.c,
 * rvalue.c and resp.c are the pure pieces (routing, the value format, RESP framing) the
 * unit tests drive without a cluster.
 */

#define RM_TICK_NS (10ull * 1000000ull)
#define RM_FINI_FLUSH_NS (1000ull * 1000000ull) /* at exit, queued answers wait this long for room */

/* ---- stats -------------------------------------------------------------------------------- */

static void gauge(struct remote *r, unsigned s, uint64_t v)
{
	atomic_store_explicit(&r->a->stats->c[s], v, memory_order_relaxed);
}

void rm_publish(struct remote *r)
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

/* ---- the stage ---------------------------------------------------------------------------- */

/* Queued answers to the ring; those that waited send_timeout_ns are dropped (the lookup
 * actor stopped reading: counted in out_q.dropped, logged once). */
static int flush_out(struct remote *r, uint64_t now)
{
	return kvr_outbox_pass(&r->out_q, now, r->send_timeout_ns) ? KVR_PASS_WAITING : KVR_PASS_IDLE;
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
	if (kvr_backlog_offer(&r->wait, m, rm_req_start, r)) { /* cannot happen: the input is held well before */
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
		kvr_backlog_retry(&r->wait, rm_req_start, r);
	rm_settle(r);
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
	rm_settle(r);
	for (unsigned ni = 0; ni < r->map.n_nodes; ni++) {
		struct rnode *n = &r->nodes[ni];
		bool slow_connect = n->st == N_CONNECTING && now - n->since_ns > r->timeout_ns;
		if (n->fd < 0 || (!late[ni] && !slow_connect))
			continue;
		rm_count(r, KVR_STAT_RM_TIMEOUTS, 1);
		kvr_warn("remote %s:%u: %s after %u ms: connection closed, reconnecting", r->map.nodes[ni].host,
			 r->map.nodes[ni].port, slow_connect ? "no connect" : "a request unanswered",
			 a->cfg.remote.timeout_ms);
		rm_node_down(r, ni, true);
	}
	rm_refresh(r, now);
	for (uint32_t i = 0; i < r->n_reqs; i++)
		if (r->reqs[i].type && r->reqs[i].parked)
			rm_send_or_park(r, i);
	if (r->wait.n && r->free_req != RM_NONE)
		kvr_backlog_retry(&r->wait, rm_req_start, r);
	rm_settle(r);
	rm_publish(r);
	account(r);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

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

/* remote.cluster's seeds, the first nodes of the map: 0 or -errno (logged). */
static int add_seeds(struct remote *r, const struct kvr_config *cfg)
{
	kvr_rc_map_init(&r->map);
	for (unsigned s = 0; s < cfg->remote.n_cluster; s++) {
		struct kvr_rc_node n;
		int rc = kvr_rc_node_parse(cfg->remote.cluster[s], &n);
		if (!rc)
			rc = kvr_rc_map_node(&r->map, n.host, n.port);
		if (rc < 0) {
			kvr_err("remote.cluster[%u] \"%s\": %s", s, cfg->remote.cluster[s], strerror(-rc));
			return rc;
		}
	}
	r->n_seeds = r->map.n_nodes;
	return 0;
}

/* The request table (all of it free), the reply reader and the mapped-slot bits: 0 or
 * -ENOMEM (what was allocated is freed by the caller). */
static int alloc_tables(struct remote *r, uint32_t n_reqs)
{
	r->n_reqs = n_reqs;
	r->reqs = calloc(r->n_reqs, sizeof(*r->reqs));
	r->reader = redisReaderCreate();
	r->mapped = calloc(r->slots->n_slots / 8 + 1, 1);
	if (!r->reqs || !r->reader || !r->mapped)
		return -ENOMEM;
	for (uint32_t i = 0; i < r->n_reqs; i++)
		r->reqs[i].next_free = i + 1 < r->n_reqs ? i + 1 : RM_NONE;
	r->free_req = 0;
	return 0;
}

/* What the actor knows from its slot table and its config. */
static void set_params(struct remote *r, struct kvr_actor *a)
{
	const struct kvr_config *cfg = &a->cfg;
	r->map_dirty = true;
	r->a = a;
	r->slots = a->slots;
	r->lanes = kvr_slots_lanes_max(a->slots); /* the most a block has: each read's own, q->lanes */
	r->id = (struct kvr_l2_ident){.ns = a->slots->ns, .fingerprint = a->slots->ns,
				      .block_tokens = a->slots->block_tokens, .lane_bytes = a->slots->slot_bytes};
	r->timeout_ns = kvr_ms_to_ns(cfg->remote.timeout_ms);
	r->send_timeout_ns = kvr_ms_to_ns(cfg->timeouts.reply_ms);
	if (cfg->remote.ttl_s)
		snprintf(r->ttl, sizeof(r->ttl), "%u", cfg->remote.ttl_s);
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
	set_params(r, a);
	r->in = kvr_actor_ring(a, KVR_RING_REMOTE_REQ);
	r->out = kvr_actor_ring(a, KVR_RING_REMOTE_REP);
	int rc = -ENOENT;
	if (!r->in || !r->out) {
		kvr_err("rings %s / %s missing from the ring directory", KVR_RING_REMOTE_REQ, KVR_RING_REMOTE_REP);
		goto fail;
	}
	kvr_backlog_init(&r->wait, a, r->in);
	kvr_outbox_init(&r->out_q, r->out);
	rc = r->lanes > KVR_CTL_MAX_WORKERS ? -EINVAL : add_seeds(r, cfg);
	if (rc)
		goto fail;
	rm_nodes_init(r);
	rc = alloc_tables(r, cfg->remote.max_inflight);
	if (rc)
		goto fail;
	drop_stale_pins(r);
	rm_discover(r);
	rm_publish(r);
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
	return rc;
}

static void remote_fini(struct kvr_actor *a)
{
	struct remote *r = a->data;
	if (!r)
		return;
	r->closing = true;
	for (unsigned ni = 0; ni < r->map.n_nodes; ni++)
		rm_node_down(r, ni, false); /* what is in flight fails and is answered */
	for (uint32_t i = 0; i < r->n_reqs; i++)
		if (r->reqs[i].type) /* parked: no node had it */
			rm_req_fail(r, i, -ECANCELED);
	struct kvr_msg m;
	while (kvr_backlog_take(&r->wait, &m)) { /* never started: answered as failed */
		struct kvr_msg_l2 b;
		(void)kvr_msg_decode_l2(&m, 0, &b);
		if (m.hdr.type == KVR_MSG_L2_READ) {
			struct rreq t = {.lane = b.lane, .slot = b.slot, .epoch = b.epoch, .req_id = m.hdr.req_id,
					 .key = {b.key_lo, b.key_hi}};
			rm_send_read_done(r, &t, -ECANCELED);
		}
	}
	(void)kvr_outbox_drain(&r->out_q, RM_FINI_FLUSH_NS); /* the answers still queued: a while to be taken */
	rm_publish(r);
	if (r->out_q.dropped)
		kvr_warn("%llu messages to the lookup actor dropped", (unsigned long long)r->out_q.dropped);
	kvr_outbox_free(&r->out_q);
	for (unsigned n = 0; n < KVR_RC_MAX_NODES; n++)
		kvr_resp_fini(&r->nodes[n].rx);
	redisReaderFree(r->reader);
	free(r->mapped);
	free(r->reqs);
	free(r);
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
