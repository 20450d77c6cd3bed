/* libkvring: the requests of an attached client: lookups, leases, loads, stores and cancels over the
 * rings, and their completions (kvr_poll, kvr_wait). Attaching and detaching are client.c's. */
#include "client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_ctl.h"
#include "kvr_grow.h"
#include "kvr_keys.h"
#include "kvr_list.h"
#include "kvr_ring.h"
#include "kvr_time.h"

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

/* A layered load completed or failed: its progress-table entry is free again. */
static void progress_release(struct kvr_client *c, const struct pending *p)
{
	if (!p->prog_plus1)
		return;
	unsigned e = p->prog_plus1 - 1;
	if (c->prog_owner[e] == p->wire_id) {
		atomic_store_explicit(&kvr_ctl_area(c->ctl, c->worker)->progress[e].wire, 0, memory_order_release);
		c->prog_owner[e] = 0;
	}
}

void client_pending_free(struct pending *p)
{
	free(p->blocks);
	free(p->failed);
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
	progress_release(c, p);
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
	bool gone = client_sup_gone(c);
	for (unsigned i = 0; i < c->n_pend;) {
		struct pending *p = &c->pend[i];
		if (!gone && client_actor_may_run(c, p->actor, p->gen))
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
		return client_fail(c, -EPIPE, "%s", SUP_GONE_WHY);
	return (int)n;
}

/* Sleep on our area's waiter until something may have changed — a reply on our load or
 * store ring, or (ready) a layer published — for at most WAIT_SLICE_NS and never past the
 * deadline (the caller re-checks actor liveness between naps). 0, or -EINTR. */
static int nap(struct kvr_client *c, uint64_t now, uint64_t deadline, bool (*ready)(struct kvr_client *, uint32_t),
	       uint32_t arg)
{
	uint32_t seen = kvr_waiter_prepare(c->waiter);
	int rc = 0;
	if (!kvr_ring_count(c->ld_rep) && !kvr_ring_count(c->st_rep) && !(ready && ready(c, arg))) {
		uint64_t left = deadline - now;
		rc = kvr_waiter_wait(c->waiter, seen, (int64_t)(left < WAIT_SLICE_NS ? left : WAIT_SLICE_NS));
	}
	kvr_waiter_finish(c->waiter);
	return rc == -EINTR ? -EINTR : 0;
}

KVR_EXPORT int kvr_wait(struct kvr_client *c, struct kvr_completion *ret, unsigned max, int64_t timeout_ms)
{
	uint64_t deadline = kvr_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
	for (;;) {
		int n = kvr_poll(c, ret, max);
		if (n != 0 || !max)
			return n;
		uint64_t now = kvr_now_ns();
		if (now >= deadline || c->sched) /* nothing ever completes on a scheduler client */
			return 0;
		if (nap(c, now, deadline, NULL, 0) == -EINTR)
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
		if (client_sup_gone(c))
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
		return client_fail(c, -E2BIG, "prompt of %zu tokens has more than %u blocks", n_tokens, KVR_MSG_MAX_LIST);
	if (want > c->cap_keys) {
		kvr_key *k = realloc(c->keys, want * sizeof(*k));
		if (!k)
			return client_fail(c, -ENOMEM, "out of memory");
		c->keys = k;
		c->cap_keys = want;
	}
	int n = kvr_keys_chain(c->ns, tokens, n_tokens, c->geom.block_tokens, extra, extra_len, c->keys, want);
	if (n < 0)
		return client_fail(c, n, "hashing the prompt: %s", strerror(-n));
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
			return client_fail(c, rc, "%s: %s", what, strerror(-rc));
		if (client_sup_gone(c))
			return client_fail(c, -EPIPE, "%s: %s; treat as a miss", what, SUP_GONE_WHY);
		if (!client_actor_alive(c, actor, gen))
			return client_fail(c, -EPIPE, "%s: the lookup actor restarted; treat as a miss", what);
		if (kvr_now_ns() >= deadline)
			return client_fail(c, -ETIMEDOUT, "%s: no reply within %lld ms", what, (long long)(c->timeout_ns / 1000000));
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
				rc = client_fail(c, -EPROTO, "%s: malformed reply", what);
				goto out;
			}
			have = true;
			if (r->status == -ESTALE) { /* a new incarnation answered its dead predecessor's request */
				rc = client_fail(c, -EPIPE, "%s: the lookup actor restarted; treat as a miss", what);
				goto out;
			}
			if (r->status == -ENOENT) {
				rc = client_fail(c, -ENOENT, "%s: no such lease (it ended, or the lookup actor restarted): "
						 "compute the blocks", what);
				goto out;
			}
			if (r->status < 0) {
				rc = client_fail(c, r->status, "%s: %s", what, strerror(-r->status));
				goto out;
			}
			if (r->matched > max_matched || r->lane != c->info.lane) {
				rc = client_fail(c, -EPROTO, "%s: reply does not match the request", what);
				goto out;
			}
			if (!r->matched)
				break;
			slots = calloc(r->matched, sizeof(*slots));
			if (!slots) {
				rc = client_fail(c, -ENOMEM, "out of memory");
				goto out;
			}
			continue;
		}
		struct kvr_msg_list_hdr h;
		if (kvr_msg_decode_list(&m, KVR_MSG_SLOTS, &h) || h.total != r->matched) {
			rc = client_fail(c, -EPROTO, "%s: malformed slot list", what);
			goto out;
		}
		kvr_msg_list_items(&m, slots);
		got += h.count;
		if (!(m.hdr.flags & KVR_MSGF_MORE))
			break;
	}
	if (r->matched && got != r->matched) {
		rc = client_fail(c, -EPROTO, "%s: slot list incomplete", what);
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
	uint32_t gen = client_actor_gen(c, actor);
	if (client_sup_gone(c))
		return client_fail(c, -EPIPE, "%s: %s", what, SUP_GONE_WHY);
	if (!client_actor_alive(c, actor, gen))
		return client_fail(c, -EPIPE, "%s: the lookup actor is not running (state %s)", what,
				   kvr_actor_state_name(atomic_load(&kvr_ctl_actor(c->ctl, actor)->state)));
	*ret_gen = gen;
	return 0;
}

KVR_EXPORT int kvr_lookup(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens,
			  const void *extra, size_t extra_len, struct kvr_lookup_result *ret)
{
	if (!c || !ret || (!tokens && n_tokens) || (!extra && extra_len))
		return client_fail(c, -EINVAL, "lookup: NULL argument");
	if (c->sched)
		return client_fail(c, -EINVAL, "lookup: a scheduler client leases (kvr_lease), it does not load");
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
	uint64_t wire = client_wire_id(c, gen), deadline = t1 + (uint64_t)c->timeout_ns;
	_Static_assert(sizeof(kvr_key) == sizeof(struct kvr_msg_key), "key wire format");
	rc = send_list(c, c->lk_req, KVR_MSG_LOOKUP, wire, (uint8_t)c->info.lane, 0, c->keys, (uint32_t)nk, deadline);
	if (rc)
		return client_fail(c, rc, "lookup: sending the request: %s", strerror(-rc));
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

KVR_EXPORT int kvr_lease(struct kvr_client *c, uint64_t lease_id, const uint32_t *tokens, size_t n_tokens,
			 const void *extra, size_t extra_len, const struct kvr_lease_opts *opts,
			 struct kvr_lookup_result *ret)
{
	if (!c || !ret || (!tokens && n_tokens) || (!extra && extra_len))
		return client_fail(c, -EINVAL, "lease: NULL argument");
	if (!c->sched)
		return client_fail(c, -EINVAL, "lease: a worker client looks up (kvr_lookup) or takes a lease (kvr_lease_take)");
	/* every TP rank loads (MLA: each the same lane) */
	uint32_t loaders = opts && opts->loaders ? opts->loaders : kvr_ctl_sched(c->ctl, c->worker)->tp_size;
	uint32_t ttl = opts && opts->ttl_ms ? opts->ttl_ms : 30000;
	if (loaders > KVR_MSG_LEASE_MAX_LOADERS || ttl > KVR_MSG_LEASE_MAX_TTL_MS)
		return client_fail(c, -EINVAL, "lease: loaders %u (at most %u) or ttl_ms %u (at most %u) out of range", loaders,
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
	uint64_t wire = client_wire_id(c, gen), deadline = t1 + (uint64_t)c->timeout_ns;
	struct kvr_msg_lease b = {.lease_id = lease_id, .ttl_ms = ttl, .loaders = loaders, .n_keys = (uint32_t)nk};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE, 0, wire, 0, &b, sizeof(b));
	if ((rc = send_msg(c, c->lk_req, &m, deadline)) ||
	    (rc = send_list(c, c->lk_req, KVR_MSG_LOOKUP, wire, 0, 0, c->keys, (uint32_t)nk, deadline)))
		return client_fail(c, rc, "lease: sending the request: %s", strerror(-rc));
	if ((rc = await_reply(c, "lease", c->info.lookup_actor, gen, wire, deadline, &m)))
		return rc;
	struct kvr_msg_lookup_rep r;
	if (kvr_msg_decode_lease_rep(&m, &r) || r.matched > nk)
		return client_fail(c, -EPROTO, "lease: malformed reply");
	if (r.status == -ESTALE)
		return client_fail(c, -EPIPE, "lease: the lookup actor restarted; treat as a miss");
	if (r.status == -ENOSPC)
		return client_fail(c, -ENOSPC, "lease: the lease table is full (l1.max_leases): nothing leased");
	if (r.status < 0)
		return client_fail(c, r.status, "lease: %s", strerror(-r.status));
	if (r.pending > nk - r.matched)
		return client_fail(c, -EPROTO, "lease: malformed reply (%u pending blocks after %u of %zu)", r.pending,
				   r.matched, nk);
	ret->matched_blocks = r.matched;
	ret->l2_blocks = r.promoted;
	ret->matched_tokens = r.matched * c->geom.block_tokens;
	ret->pending_blocks = r.pending;
	ret->miss_reason = r.miss;
	ret->index_ns = r.index_ns;
	ret->roundtrip_ns = kvr_now_ns() - t1;
	return 0;
}

KVR_EXPORT int kvr_lease_release(struct kvr_client *c, uint64_t lease_id)
{
	if (!c || !c->sched)
		return client_fail(c, -EINVAL, "lease release: not a scheduler client");
	if (client_sup_gone(c))
		return client_fail(c, -EPIPE, "lease release: %s", SUP_GONE_WHY);
	struct kvr_msg_lease b = {.lease_id = lease_id};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE_RELEASE, 0, 0, 0, &b, sizeof(b));
	/* a burst of releases (a step that finished many requests) waits for the lookup actor
	 * to make room, as any request does; only a ring that stays full fails */
	int rc = send_msg(c, c->lk_req, &m, kvr_now_ns() + (uint64_t)c->timeout_ns);
	if (rc)
		return client_fail(c, rc, "lease release: %s; the lease ends by its ttl", strerror(-rc));
	return 0;
}

KVR_EXPORT int kvr_lease_take(struct kvr_client *c, uint64_t lease_id, struct kvr_lookup_result *ret)
{
	if (!c || !ret)
		return client_fail(c, -EINVAL, "lease take: NULL argument");
	if (c->sched)
		return client_fail(c, -EINVAL, "lease take: a scheduler client does not load");
	memset(ret, 0, sizeof(*ret));
	memo_forget(c, lease_id);
	uint32_t gen;
	int rc;
	if ((rc = lookup_actor_gen(c, "lease take", &gen)))
		return rc;
	uint64_t t1 = kvr_now_ns(), wire = client_wire_id(c, gen), deadline = t1 + (uint64_t)c->timeout_ns;
	struct kvr_msg_lease b = {.lease_id = lease_id, .lane = (uint16_t)c->info.lane};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE_TAKE, 0, wire, 0, &b, sizeof(b));
	if ((rc = send_msg(c, c->lk_req, &m, deadline)))
		return client_fail(c, rc, "lease take: sending the request: %s", strerror(-rc));
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
			return client_fail(c, -ERANGE, "%s: block id %u at position %zu out of range (num_blocks %u)", what,
					   block_ids[i], i, c->geom.num_blocks);
	return 0;
}

/* Register a pending request before sending it, so replies that arrive while we send
 * (we drain replies when a ring is full) find it. */
static int submit(struct kvr_client *c, uint32_t op, unsigned actor, uint64_t req_id, const uint32_t *block_ids,
		  size_t n, const void *ipc_event, uint64_t *ret_wire)
{
	uint32_t gen = client_actor_gen(c, actor);
	if (client_sup_gone(c))
		return client_fail(c, -EPIPE, "%s: %s", op == KVR_OP_LOAD_DONE ? "load" : "store", SUP_GONE_WHY);
	if (!client_actor_alive(c, actor, gen))
		return client_fail(c, -EPIPE, "%s actor is not running (state %s)", op == KVR_OP_LOAD_DONE ? "loader" : "storer",
				   kvr_actor_state_name(atomic_load(&kvr_ctl_actor(c->ctl, actor)->state)));
	struct pending p = {.wire_id = client_wire_id(c, gen), .req_id = req_id, .op = op, .actor = actor, .gen = gen,
			    .n_blocks = (uint32_t)n, .submit_ns = kvr_now_ns()};
	if (ipc_event) {
		/* The storer finds the event in entry wire % KVR_CUDA_EVENTS: take a wire id whose
		 * entry no store in flight holds. */
		unsigned tries = 0;
		while (c->cuda_ev_owner[p.wire_id & (KVR_CUDA_EVENTS - 1)]) {
			if (++tries > KVR_CUDA_EVENTS)
				return client_fail(c, -EBUSY, "store: %u stores with CUDA events in flight", KVR_CUDA_EVENTS);
			p.wire_id = client_wire_id(c, gen);
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
		return client_fail(c, -ENOMEM, "out of memory");
	}
	memcpy(p.blocks, block_ids, n * sizeof(uint32_t));
	if (add_pending(c, &p)) {
		ev_release(c, &p);
		free(p.blocks);
		return client_fail(c, -ENOMEM, "out of memory");
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
		progress_release(c, &c->pend[i]);
		client_pending_free(&c->pend[i]);
		remove_pending(c, (unsigned)i);
	}
}

KVR_EXPORT int kvr_cancel(struct kvr_client *c, uint64_t req_id)
{
	if (!c)
		return -EINVAL;
	if (c->sched || !c->ctl)
		return client_fail(c, -EINVAL, "cancel: a scheduler client has no loads or stores");
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
			return client_fail(c, -EBUSY, "cancel: %u cancels outstanding (wait for their completions)",
					   KVR_AREA_CANCEL_MAX);
		c->cancel_owner[e] = p->wire_id;
		p->cancel_plus1 = e + 1;
		/* the actor reads it before its next copy chunk or commit (stage_fence) */
		atomic_store_explicit(&ar->cancel[e], p->wire_id, memory_order_release);
	}
	return n;
}

/* A free entry of our area's progress table for a layered load's wire id: written layers 0,
 * then the wire id (release), before the LOAD goes out. With every entry in use the load
 * goes out plain (its layers are in place at its completion). */
static void progress_take(struct kvr_client *c, struct pending *p)
{
	unsigned e = 0;
	while (e < KVR_AREA_LAYERED_MAX && c->prog_owner[e])
		e++;
	if (e == KVR_AREA_LAYERED_MAX)
		return;
	struct kvr_load_progress *ent = &kvr_ctl_area(c->ctl, c->worker)->progress[e];
	atomic_store_explicit(&ent->layers, 0, memory_order_relaxed);
	atomic_store_explicit(&ent->wire, p->wire_id, memory_order_release);
	c->prog_owner[e] = p->wire_id;
	p->prog_plus1 = e + 1;
}

static int load(struct kvr_client *c, uint64_t req_id, const uint32_t *block_ids, size_t n_blocks, bool layered)
{
	if (!c || (!block_ids && n_blocks) || !n_blocks)
		return client_fail(c, -EINVAL, "load: no blocks");
	if (c->sched)
		return client_fail(c, -EINVAL, "load: a scheduler client does not load");
	struct memo *mm = memo_find(c, req_id);
	if (!mm)
		return client_fail(c, -ENOENT, "load: request %llu has no matched blocks (lookup first)",
				   (unsigned long long)req_id);
	if (n_blocks > mm->n)
		return client_fail(c, -ERANGE, "load: %zu blocks requested but only %u matched", n_blocks, mm->n);
	int rc = check_blocks(c, "load", block_ids, n_blocks);
	if (rc)
		return rc;
	struct kvr_msg_load_item *items = malloc(n_blocks * sizeof(*items));
	if (!items)
		return client_fail(c, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n_blocks; i++)
		items[i] = (struct kvr_msg_load_item){.slot = mm->slots[i].slot, .epoch = mm->slots[i].epoch,
						      .block = block_ids[i]};
	uint64_t wire;
	rc = submit(c, KVR_OP_LOAD_DONE, c->info.loader_actor, req_id, block_ids, n_blocks, NULL, &wire);
	if (!rc) {
		struct pending *p = &c->pend[find_pending(c, wire)];
		p->lease = mm->lease;
		if (layered)
			progress_take(c, p);
		rc = send_list(c, c->ld_req, KVR_MSG_LOAD, wire, 0, 0, items, (uint32_t)n_blocks,
			       kvr_now_ns() + (uint64_t)c->timeout_ns);
		if (rc) {
			abort_submit(c, wire);
			rc = client_fail(c, rc, "load: sending the request: %s", strerror(-rc));
		}
	}
	free(items);
	if (!rc) { /* the slots are consumed: a second load needs a new lookup */
		free(mm->slots);
		mm->slots = NULL;
	}
	return rc;
}

KVR_EXPORT int kvr_load(struct kvr_client *c, uint64_t req_id, const uint32_t *block_ids, size_t n_blocks)
{
	return load(c, req_id, block_ids, n_blocks, false);
}

KVR_EXPORT int kvr_load_layered(struct kvr_client *c, uint64_t req_id, const uint32_t *block_ids, size_t n_blocks)
{
	return load(c, req_id, block_ids, n_blocks, true);
}

/* Whether every load in flight has at least n layers in place: a layered one by its
 * progress entry, a plain one never before it completed (a completed load has left
 * c->pend: its completion tells how it ended). */
static bool layers_in_place(struct kvr_client *c, uint32_t n)
{
	const struct kvr_client_area *ar = kvr_ctl_area(c->ctl, c->worker);
	for (unsigned i = 0; i < c->n_pend; i++) {
		const struct pending *p = &c->pend[i];
		if (p->done.op != KVR_OP_LOAD_DONE)
			continue;
		if (!p->prog_plus1 ||
		    atomic_load_explicit(&ar->progress[p->prog_plus1 - 1].layers, memory_order_acquire) < n)
			return false;
	}
	return true;
}

KVR_EXPORT int kvr_wait_layers(struct kvr_client *c, uint32_t n_layers, int64_t timeout_ms)
{
	if (!c)
		return -EINVAL;
	if (c->sched || !c->ctl)
		return client_fail(c, -EINVAL, "wait_layers: a scheduler client has no loads");
	uint64_t deadline = kvr_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
	for (;;) {
		drain_replies(c);
		reap_dead(c);
		if (layers_in_place(c, n_layers))
			return 0;
		uint64_t now = kvr_now_ns();
		if (now >= deadline)
			return client_fail(c, -ETIMEDOUT, "wait_layers: %u layers not in place within %lld ms", n_layers,
					   (long long)timeout_ms);
		if (nap(c, now, deadline, layers_in_place, n_layers) == -EINTR)
			return -EINTR;
	}
}

static int store(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens, const void *extra,
		 size_t extra_len, const uint32_t *block_ids, size_t n_blocks, const void *ipc_event)
{
	if (!c || (!tokens && n_tokens) || (!block_ids && n_blocks) || (!extra && extra_len))
		return client_fail(c, -EINVAL, "store: NULL argument");
	if (c->sched)
		return client_fail(c, -EINVAL, "store: a scheduler client does not store");
	size_t full = n_tokens / c->geom.block_tokens;
	if (n_blocks != full)
		return client_fail(c, -EINVAL, "store: %zu tokens make %zu full blocks of %u but %zu block ids were given",
				   n_tokens, full, c->geom.block_tokens, n_blocks);
	if (!n_blocks)
		return client_fail(c, -EINVAL, "store: fewer than %u tokens: nothing to store", c->geom.block_tokens);
	int rc = check_blocks(c, "store", block_ids, n_blocks);
	if (rc)
		return rc;
	size_t nk;
	if ((rc = hash_keys(c, tokens, n_tokens, extra, extra_len, &nk)))
		return rc;
	struct kvr_msg_store_item *items = malloc(nk * sizeof(*items));
	if (!items)
		return client_fail(c, -ENOMEM, "out of memory");
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
			rc = client_fail(c, rc, "store: sending the request: %s", strerror(-rc));
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
		return client_fail(c, -EINVAL, "store: a CUDA event on a client attached without CUDA KV memory");
	return store(c, req_id, tokens, n_tokens, extra, extra_len, block_ids, n_blocks, ipc_event);
}
