/* store_path: a store's lane (open, RESET, close), its replies, and the checks of a STORE, an ALLOC_REP and a COMMIT_REP. */
#include "store_path.h"
#include "store_path_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_grow.h"
#include "kvr_log.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"

/*
 * Stores. For one block list (the same keys from every rank of the request's group):
 *
 *   1. ALLOC  asks the lookup actor for a slot per key on the lane. Keys already stored on
 *             this lane come back PRESENT (suffix-only: a prompt sharing a cached prefix
 *             copies only its new blocks), keys with no evictable room come back NOROOM;
 *   2. copies every rank's blocks into the allocated (WRITING) slots, one staging lease
 *             at a time, through that rank's transfer context (a DCP rank writes its own
 *             tokens' rows and its tail into the canonical lane, see kvr_dcp.h);
 *   3. COMMIT tells the lookup actor which slots are complete; a block becomes visible
 *             once every lane of its TP group committed (the quorum);
 *   4. replies STORE_DONE with the counts and the block ids that were not stored.
 *
 * If the lookup actor restarts while a store waits for it, the store fails (-EPIPE) and
 * RESET aborts every WRITING slot of the owner worker: nothing half written can become
 * visible. stage_store_open() sends RESET too, for slots a previous incarnation left.
 *
 * The storer and the gather actor run these steps as a pipeline of several stores driven by
 * their loops (stage_store_pipe_*, store_pipe.c), no handler waiting: a slot is committed only
 * after its whole copy, the slot table decides what was committed, and any failure aborts
 * the worker's WRITING slots with RESET. Only stage_store_open waits for the lookup actor
 * (its RESET, before the actor is ready).
 */

static int store_grow(struct stage_store *ss, uint32_t n)
{
	if (n <= ss->cap)
		return 0;
	if (kvr_realloc_n(&ss->failed, n, sizeof(*ss->failed)))
		return -ENOMEM;
	ss->cap = n;
	return 0;
}

/* Wait for the lookup actor's reply to request id `id` on commit.rep. Messages of earlier
 * (abandoned) requests are skipped. -EPIPE when the lookup actor restarted meanwhile. */
static int await_lookup(struct stage_store *ss, uint64_t id, uint32_t lookup_gen, struct kvr_msg *ret)
{
	uint64_t deadline = kvr_now_ns() + LOOKUP_TIMEOUT_NS(ss->a);
	for (;;) {
		int rc = kvr_ring_dequeue(ss->commit_rep, ret, AWAIT_SLICE_NS);
		kvr_actor_beat(ss->a); /* a long answer streams in: busy, not stuck */
		if (rc == 0) {
			if (ret->hdr.req_id == id)
				return 0;
			continue;
		}
		if (rc != -ETIMEDOUT && rc != -EINTR)
			return rc;
		if (ss->a->stopping)
			return -ECANCELED;
		if (atomic_load(&kvr_ctl_actor(ss->a->ctl, KVR_ACTOR_IX_LOOKUP)->generation) != lookup_gen)
			return -EPIPE;
		if (kvr_now_ns() >= deadline)
			return -ETIMEDOUT;
	}
}

/* RESET: abort the owner worker's WRITING slots. Waits for the lookup actor's answer. */
static int reset_lane(struct stage_store *ss)
{
	uint32_t gen = atomic_load(&kvr_ctl_actor(ss->a->ctl, KVR_ACTOR_IX_LOOKUP)->generation);
	uint64_t id = ++ss->next_id;
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_RESET, 0, id, 0, NULL, 0);
	int rc = kvr_msg_send(ss->commit_req, &m, kvr_now_ns() + LOOKUP_TIMEOUT_NS(ss->a));
	if (!rc)
		rc = await_lookup(ss, id, gen, &m);
	struct kvr_msg_commit_rep r;
	if (!rc && kvr_msg_decode_commit_rep(&m, &r))
		rc = -EPROTO;
	if (!rc && r.status)
		rc = r.status;
	return rc;
}

int stage_store_open(struct stage_store *ss, struct kvr_actor *a, unsigned owner, unsigned lane)
{
	memset(ss, 0, sizeof(*ss));
	ss->a = a;
	ss->owner = owner;
	ss->lane = lane;
	ss->commit_req = kvr_actor_ring_w(a, KVR_RING_COMMIT_REQ, owner);
	ss->commit_rep = kvr_actor_ring_w(a, KVR_RING_COMMIT_REP, owner);
	if (!ss->commit_req || !ss->commit_rep) {
		kvr_err("worker %u: commit rings not found", owner);
		return -ENOENT;
	}
	ss->next_id = (uint64_t)kvr_now_ns() << 8; /* ids unique across incarnations */
	kvr_list_asm_init(&ss->alloc_rep, KVR_MSG_ALLOC_REP);
	int rc = reset_lane(ss);
	if (rc)
		kvr_warn("worker %u: RESET of its lane: %s (continuing)", owner, strerror(-rc));
	return 0;
}

void stage_store_close(struct stage_store *ss)
{
	if (!ss)
		return;
	kvr_list_asm_free(&ss->alloc_rep);
	free(ss->failed);
	memset(ss, 0, sizeof(*ss));
}

void stage_store_send_done(struct stage_worker *sw, const struct stage_store_req *rq, int status, uint32_t stored,
			   uint32_t present, const uint32_t *failed, uint32_t n_failed, const struct kvr_xfer_stats *st,
			   uint64_t start_ns)
{
	uint64_t start = start_ns ? start_ns : kvr_now_ns();
	struct kvr_msg_store_done d = {
		.status = status,
		.n_blocks = rq->n,
		.n_stored = stored,
		.n_present = present,
		.n_failed = n_failed,
		.copies = st ? (uint32_t)st->copies : 0,
		.bytes = st ? st->bytes : 0,
		.copy_ns = st ? st->copy_ns : 0,
		.queue_us = (uint32_t)((start - rq->first_ns) / 1000),
	};
	stage_reply(sw, KVR_MSG_STORE_DONE, rq->wire, status, &d, sizeof(d), failed, n_failed, rq->first_ns);
}

static void store_reply(struct stage_store *ss, struct stage_worker *sw, const struct stage_store_req *rq, int status,
			uint32_t stored, uint32_t present, uint32_t n_failed, const struct kvr_xfer_stats *st)
{
	stage_store_send_done(sw, rq, status, stored, present, ss->failed, n_failed, st, 0);
}

void stage_store_fail(struct stage_store *ss, struct stage_worker *sw, const struct stage_store_req *rq, int status)
{
	if (store_grow(ss, rq->n)) {
		store_reply(ss, sw, rq, -ENOMEM, 0, 0, 0, NULL); /* no room to list them: the status fails all */
		return;
	}
	for (uint32_t i = 0; i < rq->n; i++)
		ss->failed[i] = rq->items[i].block;
	store_reply(ss, sw, rq, status, 0, 0, rq->n, NULL);
}

int stage_store_check(struct stage_store *ss, struct stage_worker *const *sw, const struct stage_store_req *rq,
		      unsigned n_ranks, struct kvr_xfer_dep *ready, const struct kvr_xfer_dep **readyp)
{
	uint32_t n = rq[0].n;
	if (ss->a->cfg.l2.read_only) {
		/* serving a legacy store: nothing new is stored, in L1 or on disk */
		if (!ss->refused_ro++)
			kvr_warn("stores refused: this instance serves its L2 store read-only (l2.read_only)");
		return -EROFS;
	}
	for (unsigned r = 0; r < n_ranks; r++) {
		if (!stage_wire_current(ss->a, rq[r].wire))
			return -ESTALE;
		if (rq[r].n != n)
			return -EPROTO;
		for (uint32_t i = 0; i < n; i++)
			if (rq[r].items[i].block >= sw[r]->geom.num_blocks)
				return -ERANGE;
		/* CUDA: the copy must wait for the event the worker recorded after writing the KV */
		readyp[r] = NULL;
		if (rq[r].flags & KVR_STOREF_CUDA_EVENT) {
			if (!sw[r]->cuda || kvr_cuda_events_dep(&sw[r]->events, rq[r].wire, &ready[r]))
				return -ENOENT;
			readyp[r] = &ready[r];
		}
	}
	return 0;
}

void stage_store_sort_alloc(const struct kvr_slot_table *t, const struct kvr_msg_slot *alloc, uint32_t n,
			    struct kvr_msg_slot *written, uint32_t *pos, uint64_t *slot_offs, uint32_t *fail_pos,
			    uint32_t *pres_pos, uint32_t *ret_copy, uint32_t *ret_present, uint32_t *ret_fail)
{
	uint32_t n_copy = 0, present = 0, n_fail = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (alloc[i].slot == KVR_SLOT_PRESENT) {
			if (pres_pos)
				pres_pos[present] = i;
			present++;
		} else if (alloc[i].slot == KVR_SLOT_NOROOM || alloc[i].slot >= t->n_slots) {
			fail_pos[n_fail++] = i;
		} else {
			written[n_copy] = alloc[i];
			pos[n_copy] = i;
			slot_offs[n_copy] = t->arena_data_off + (uint64_t)alloc[i].slot * t->slot_bytes;
			n_copy++;
		}
	}
	*ret_copy = n_copy;
	*ret_present = present;
	*ret_fail = n_fail;
}

/*
 * The lookup actor's count is the answer when it says every slot committed: by the time the
 * storer reads this reply the lookup actor may already have evicted a committed slot (an
 * ALLOC of another worker, a full arena) and handed it out again, so re-reading the slot
 * table then would call a stored block failed. When the count is short the answer does not
 * say which were refused (a slot reclaimed before its COMMIT); the slot table decides then,
 * and a slot that is no longer COMMITTED under our epoch counts as failed — conservative:
 * the worker stores that block again, nothing wrong is served.
 */
uint32_t stage_store_commit_outcome(const struct kvr_slot_table *t, const struct kvr_msg_slot *written,
				    const uint32_t *pos, uint32_t n_copy, uint32_t reported, uint32_t *fail_pos,
				    uint32_t *n_fail)
{
	if (reported == n_copy)
		return n_copy;
	uint32_t committed = 0;
	for (uint32_t k = 0; k < n_copy; k++) {
		uint32_t sl = written[k].slot;
		if (committed < reported && kvr_slot_state(t, sl) == KVR_SLOT_COMMITTED &&
		    kvr_slot_epoch(t, sl) == written[k].epoch)
			committed++;
		else
			fail_pos[(*n_fail)++] = pos[k];
	}
	return committed;
}
