/* rmap: the remote actor's slot map kept current — discovery at start, CLUSTER SLOTS refreshes, a key routed to its master. */
#include <errno.h>
#include <string.h>
#include <sys/time.h>

#include "kvr_log.h"
#include "kvr_time.h"
#include "remote.h"

/*
 * The slot map (struct kvr_rc_map, rcluster.h: pure parsing) comes from CLUSTER SLOTS,
 * asked at start (rm_discover: hiredis's blocking client, bounded by timeout_ms, before
 * readiness) and again every RM_REFRESH_NS, after a MOVED (rtier.c) and after a node is
 * lost (rconn.c). r->map.nodes[] is also the list of nodes rconn.c connects to:
 * remote.cluster's seeds first, then every node a map or a redirect named.
 */

#define RM_REFRESH_NS (5ull * 1000000000ull)
#define RM_REFRESH_SOON_NS (100ull * 1000000ull) /* after a request found no usable node */

void rm_on_slots(struct remote *r, struct rnode *n, const redisReply *rp)
{
	unsigned ni = (unsigned)(n - r->nodes);
	r->refreshing = false;
	if (!rp)
		return;
	if (rp->type == REDIS_REPLY_ERROR) {
		rm_count(r, KVR_STAT_RM_REPLY_ERRORS, 1);
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
	rm_count(r, KVR_STAT_RM_REFRESHES, 1);
	rm_map_changed(r);
	unsigned now_cov = kvr_rc_map_covered(&r->map);
	if (now_cov != before)
		kvr_info("remote: slot map from %s:%u: %u of %u slots served", r->map.nodes[ni].host,
			 r->map.nodes[ni].port, now_cov, KVR_RC_SLOTS);
	rm_publish(r);
}

/* Ask a node for the slot map: one that is up (the last one asked first), else the next
 * seed or known node that may be connected. */
void rm_refresh(struct remote *r, uint64_t now)
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
	struct rnode *n = rm_node_ctx(r, pick);
	if (!n)
		return;
	static const char *const argv[2] = {"CLUSTER", "SLOTS"};
	rm_ctl_cmd(&n->slots, K_SLOTS, 2, argv);
	r->refreshing = true;
	r->refresh_node = pick;
	rm_node_push(r, n, &n->slots);
}

/* At start, before readiness: ask the seeds in turn (blocking, timeout_ms each). */
void rm_discover(struct remote *r)
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
			rm_count(r, KVR_STAT_RM_REFRESHES, 1);
			rm_map_changed(r);
			r->next_refresh_ns = kvr_now_ns() + RM_REFRESH_NS;
			kvr_info("remote: slot map from %s:%u, %u of %u slots served",
				 addr->host, addr->port, kvr_rc_map_covered(&r->map), KVR_RC_SLOTS);
			return;
		}
	}
	kvr_warn("remote: no seed of remote.cluster answered CLUSTER SLOTS: every request misses until one does");
}

/* Where key's hash slot lives: a node index, or RM_NONE (the map has no master for it). */
unsigned rm_route(struct remote *r, const char *name, size_t len)
{
	unsigned s = kvr_rc_key_slot(name, len);
	return r->map.owner[s] == KVR_RC_NONE ? RM_NONE : r->map.owner[s];
}

void rm_refresh_soon(struct remote *r)
{
	uint64_t soon = kvr_now_ns() + RM_REFRESH_SOON_NS;
	if (r->next_refresh_ns > soon)
		r->next_refresh_ns = soon;
}
