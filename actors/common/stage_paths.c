/* The load and store paths the loader, the storer and the DCP gather actor share: pin/copy/unpin, alloc/copy/commit. */
#include "stage_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_grow.h"
#include "kvr_log.h"
#include "kvr_time.h"

/*
 * Loads. A LOAD lists (slot, epoch, engine block id) triples the client got from its
 * lookup. For each block the path pins the slot for this worker — which fails if the slot
 * was evicted or reused since the lookup (its epoch moved on) — copies the pinned slots
 * into the worker's blocks through the transfer backend, in chunks of one staging lease
 * so a large request streams through the load pool, and unpins. The reply names exactly
 * the block ids not restored. A DCP rank's copy takes its own tokens out of the
 * canonical lane (stage_copy_chunks plans with kvr_dcp_lane_runs).
 *
 * Requests carry the generation of the actor the client addressed (wire id >> 48): one
 * addressed to an earlier incarnation is answered -ESTALE without touching anything,
 * because the client already failed it when that incarnation died.
 */

void stage_load_init(struct stage_load *ld)
{
	memset(ld, 0, sizeof(*ld));
	kvr_list_asm_init(&ld->req, KVR_MSG_LOAD);
}

void stage_load_fini(struct stage_load *ld)
{
	if (!ld)
		return;
	kvr_list_asm_free(&ld->req);
	free(ld->blocks);
	free(ld->slot_offs);
	free(ld->slots);
	free(ld->failed);
	memset(ld, 0, sizeof(*ld));
}

unsigned stage_drop_pins(struct stage_worker *sw)
{
	unsigned dropped = 0;
	for (uint32_t i = 0; i < sw->slots->n_slots; i++)
		while (kvr_slot_unpin(sw->slots, i, sw->worker) == 0)
			dropped++;
	return dropped;
}

static int load_grow(struct stage_load *ld, uint32_t n)
{
	if (n <= ld->cap)
		return 0;
	if (kvr_realloc_n(&ld->blocks, n, sizeof(*ld->blocks)) || kvr_realloc_n(&ld->slot_offs, n, sizeof(*ld->slot_offs)) ||
	    kvr_realloc_n(&ld->slots, n, sizeof(*ld->slots)) || kvr_realloc_n(&ld->failed, n, sizeof(*ld->failed)))
		return -ENOMEM;
	ld->cap = n;
	return 0;
}

static void load_reply(struct stage_worker *sw, struct stage_load *ld, uint64_t wire, int status, uint32_t n_blocks,
		       uint32_t n_failed, const struct kvr_xfer_stats *st, uint64_t queue_ns)
{
	struct kvr_msg_load_done d = {
		.status = status,
		.n_blocks = n_blocks,
		.n_failed = n_failed,
		.copies = st ? (uint32_t)st->copies : 0,
		.bytes = st ? st->bytes : 0,
		.copy_ns = st ? st->copy_ns : 0,
		.runs = st ? (uint32_t)st->runs : 0,
		.queue_us = (uint32_t)(queue_ns / 1000),
	};
	stage_reply(sw, KVR_MSG_LOAD_DONE, wire, status, &d, sizeof(d), ld->failed, n_failed, ld->req.first_ns);
}

static void load_execute(struct stage_worker *sw, struct stage_load *ld)
{
	const struct kvr_msg_load_item *items = ld->req.items;
	uint32_t n = ld->req.total;
	uint64_t wire = ld->req.req_id, queue_ns = kvr_now_ns() - ld->req.first_ns;
	if (load_grow(ld, n)) {
		load_reply(sw, ld, wire, -ENOMEM, n, 0, NULL, queue_ns); /* no room to list them: the status fails all */
		return;
	}
	if (!stage_wire_current(sw->a, wire)) {
		for (uint32_t i = 0; i < n; i++)
			ld->failed[i] = items[i].block;
		load_reply(sw, ld, wire, -ESTALE, n, n, NULL, queue_ns);
		return;
	}

	/* Pin: from here until the unpin below the slots cannot be evicted or reused. */
	uint32_t n_ok = 0, n_failed = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = items[i].slot;
		bool ok = s < sw->slots->n_slots && items[i].block < sw->geom.num_blocks &&
			  kvr_slot_at(sw->slots, s)->lane == sw->lane &&
			  kvr_slot_pin(sw->slots, s, items[i].epoch, sw->worker) == 0;
		if (!ok) {
			ld->failed[n_failed++] = items[i].block;
			continue;
		}
		ld->blocks[n_ok] = items[i].block;
		ld->slots[n_ok] = s;
		ld->slot_offs[n_ok] = sw->slots->arena_data_off + (uint64_t)s * sw->slots->slot_bytes;
		n_ok++;
	}

	struct kvr_xfer_stats st = {0};
	const uint32_t *blocks = ld->blocks;
	int rc = stage_copy_chunks(&sw, 1, KVR_XFER_SLOT_TO_KV, &blocks, ld->slot_offs, n_ok, NULL, &st);
	for (uint32_t i = 0; i < n_ok; i++)
		(void)kvr_slot_unpin(sw->slots, ld->slots[i], sw->worker);
	if (rc) {
		/* Nothing of this request can be trusted in the worker's blocks: fail them all. */
		kvr_warn("load %llx: copy failed: %s", (unsigned long long)wire, strerror(-rc));
		n_failed = 0;
		for (uint32_t i = 0; i < n; i++)
			ld->failed[n_failed++] = items[i].block;
		load_reply(sw, ld, wire, rc, n, n_failed, &st, queue_ns);
		return;
	}
	kvr_actor_count(sw->a, KVR_STAT_XF_BLOCKS, n_ok);
	kvr_actor_count(sw->a, KVR_STAT_XF_BYTES, st.bytes);
	kvr_debug("load %llx: %u blocks, %u failed, %llu bytes, %llu runs, copy %llu us", (unsigned long long)wire, n,
		  n_failed, (unsigned long long)st.bytes, (unsigned long long)st.runs,
		  (unsigned long long)(st.copy_ns / 1000));
	load_reply(sw, ld, wire, n_failed ? -EIO : 0, n, n_failed, &st, queue_ns);
}

int stage_load_feed(struct stage_worker *sw, struct stage_load *ld, const struct kvr_msg *m)
{
	int rc = kvr_list_feed(&ld->req, m);
	if (rc < 0)
		return -EBADMSG;
	if (rc == 1)
		load_execute(sw, ld);
	return 0;
}

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
 */

#define LOOKUP_TIMEOUT_NS(a) kvr_ms_to_ns((a)->cfg.timeouts.lookup_call_ms)
#define AWAIT_SLICE_NS 20000000 /* re-check the lookup actor's generation this often while waiting */

static int store_grow(struct stage_store *ss, uint32_t n)
{
	if (n <= ss->cap)
		return 0;
	if (kvr_realloc_n(&ss->keys, n, sizeof(*ss->keys)) || kvr_realloc_n(&ss->written, n, sizeof(*ss->written)) ||
	    kvr_realloc_n(&ss->pos, n, sizeof(*ss->pos)) || kvr_realloc_n(&ss->slot_offs, n, sizeof(*ss->slot_offs)) ||
	    kvr_realloc_n(&ss->blocks, (size_t)n * KVR_ACTOR_MAX_KV, sizeof(*ss->blocks)) ||
	    kvr_realloc_n(&ss->fail_pos, n, sizeof(*ss->fail_pos)) || kvr_realloc_n(&ss->failed, n, sizeof(*ss->failed)))
		return -ENOMEM;
	ss->cap = n;
	return 0;
}

/* One message of a list to the lookup actor, waiting for room in AWAIT_SLICE_NS slices and
 * beating between them: a storer streaming a 60,000-key list is busy, not stuck. */
static int send_beating(void *ctx, struct kvr_ring *r, const struct kvr_msg *m, uint64_t deadline)
{
	struct kvr_actor *a = ctx;
	for (;;) {
		uint64_t now = kvr_now_ns(), until = now + AWAIT_SLICE_NS < deadline ? now + AWAIT_SLICE_NS : deadline;
		int rc = kvr_msg_send(r, m, until);
		kvr_actor_beat(a);
		if (rc != -ETIMEDOUT || until >= deadline)
			return rc;
		if (a->stopping)
			return -ECANCELED;
	}
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
		if (atomic_load(&kvr_ctl_actor(ss->a->ctl, 0)->generation) != lookup_gen)
			return -EPIPE;
		if (kvr_now_ns() >= deadline)
			return -ETIMEDOUT;
	}
}

/* RESET: abort the owner worker's WRITING slots. Waits for the lookup actor's answer. */
static int reset_lane(struct stage_store *ss)
{
	uint32_t gen = atomic_load(&kvr_ctl_actor(ss->a->ctl, 0)->generation);
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
	ss->commit_req = kvr_actor_ring_w(a, "commit.req.%u", owner);
	ss->commit_rep = kvr_actor_ring_w(a, "commit.rep.%u", owner);
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
	free(ss->keys);
	free(ss->written);
	free(ss->pos);
	free(ss->slot_offs);
	free(ss->blocks);
	free(ss->fail_pos);
	free(ss->failed);
	memset(ss, 0, sizeof(*ss));
}

static void store_reply(struct stage_store *ss, struct stage_worker *sw, const struct stage_store_req *rq, int status,
			uint32_t stored, uint32_t present, uint32_t n_failed, const struct kvr_xfer_stats *st)
{
	uint64_t start = ss->run_ns ? ss->run_ns : kvr_now_ns();
	struct kvr_msg_store_done d = {
		.status = status,
		.n_blocks = rq->n,
		.n_stored = stored,
		.n_present = present,
		.n_failed = n_failed,
		.copies = st ? (uint32_t)st->copies : 0,
		.bytes = st ? st->bytes : 0,
		.copy_ns = st ? st->copy_ns : 0,
		.queue_us = (uint32_t)((start - rq->first_ns) / 1000), /* until its store began */
	};
	stage_reply(sw, KVR_MSG_STORE_DONE, rq->wire, status, &d, sizeof(d), ss->failed, n_failed, rq->first_ns);
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

static void fail_ranks(struct stage_store *ss, struct stage_worker *const *sw, const struct stage_store_req *rq,
		       unsigned n_ranks, int status)
{
	for (unsigned r = 0; r < n_ranks; r++)
		stage_store_fail(ss, sw[r], &rq[r], status);
	ss->run_ns = 0;
}

/* Checks before anything is allocated: 0, or the status that fails every rank. Fills
 * ready[r] / readyp[r] with rank r's producer event (CUDA). */
static int store_precheck(struct stage_store *ss, struct stage_worker *const *sw, const struct stage_store_req *rq,
			  unsigned n_ranks, struct kvr_xfer_dep *ready, const struct kvr_xfer_dep **readyp)
{
	uint32_t n = rq[0].n;
	if (store_grow(ss, n))
		return -ENOMEM;
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

void stage_store_run(struct stage_store *ss, struct stage_worker *const *sw, const struct stage_store_req *rq,
		     unsigned n_ranks)
{
	struct kvr_xfer_dep ready[KVR_ACTOR_MAX_KV];
	const struct kvr_xfer_dep *readyp[KVR_ACTOR_MAX_KV];
	struct kvr_xfer_stats st[KVR_ACTOR_MAX_KV];
	if (!n_ranks || n_ranks > KVR_ACTOR_MAX_KV)
		return;
	ss->run_ns = kvr_now_ns();
	int rc = store_precheck(ss, sw, rq, n_ranks, ready, readyp);
	if (rc) {
		fail_ranks(ss, sw, rq, n_ranks, rc);
		return;
	}
	uint32_t n = rq[0].n;
	for (uint32_t i = 0; i < n; i++)
		ss->keys[i] = rq[0].items[i].key;

	/* 1. allocate */
	uint32_t lgen = atomic_load(&kvr_ctl_actor(ss->a->ctl, 0)->generation);
	uint64_t id = ++ss->next_id;
	rc = kvr_list_send_ex(ss->commit_req, KVR_MSG_ALLOC, id, (uint8_t)ss->lane, 0, ss->keys, n,
			      kvr_now_ns() + LOOKUP_TIMEOUT_NS(ss->a), send_beating, ss->a);
	int fed = 0;
	while (!rc && fed != 1) {
		struct kvr_msg m;
		rc = await_lookup(ss, id, lgen, &m);
		if (rc)
			break;
		fed = kvr_list_feed(&ss->alloc_rep, &m);
		if (fed < 0 || (fed == 1 && ss->alloc_rep.total != n))
			rc = -EPROTO;
	}
	if (rc) {
		kvr_warn("store %llx: allocation failed: %s", (unsigned long long)rq[0].wire, strerror(-rc));
		fail_ranks(ss, sw, rq, n_ranks, rc == -ECANCELED ? -EPIPE : rc);
		(void)reset_lane(ss);
		return;
	}

	/* 2. copy every rank's shard into the WRITING slots */
	const struct kvr_msg_slot *alloc = ss->alloc_rep.items;
	uint32_t n_copy = 0, present = 0, n_fail = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (alloc[i].slot == KVR_SLOT_PRESENT) {
			present++;
		} else if (alloc[i].slot == KVR_SLOT_NOROOM || alloc[i].slot >= sw[0]->slots->n_slots) {
			ss->fail_pos[n_fail++] = i;
		} else {
			ss->written[n_copy] = alloc[i];
			ss->pos[n_copy] = i;
			ss->slot_offs[n_copy] = sw[0]->slots->arena_data_off + (uint64_t)alloc[i].slot * sw[0]->slots->slot_bytes;
			n_copy++;
		}
	}
	memset(st, 0, sizeof(st));
	const uint32_t *blocks[KVR_ACTOR_MAX_KV];
	for (unsigned r = 0; r < n_ranks; r++) {
		uint32_t *b = ss->blocks + (size_t)r * ss->cap;
		for (uint32_t k = 0; k < n_copy; k++)
			b[k] = rq[r].items[ss->pos[k]].block;
		blocks[r] = b;
	}
	rc = stage_copy_chunks(sw, n_ranks, KVR_XFER_KV_TO_SLOT, blocks, ss->slot_offs, n_copy, readyp, st);
	if (rc) {
		kvr_warn("store %llx: copy failed: %s", (unsigned long long)rq[0].wire, strerror(-rc));
		fail_ranks(ss, sw, rq, n_ranks, rc);
		(void)reset_lane(ss); /* aborts the WRITING slots: nothing partial becomes visible */
		return;
	}

	/* 3. commit */
	uint32_t committed = 0;
	if (n_copy) {
		id = ++ss->next_id;
		rc = kvr_list_send_ex(ss->commit_req, KVR_MSG_COMMIT, id, (uint8_t)ss->lane, 0, ss->written, n_copy,
				      kvr_now_ns() + LOOKUP_TIMEOUT_NS(ss->a), send_beating, ss->a);
		struct kvr_msg m;
		if (!rc)
			rc = await_lookup(ss, id, lgen, &m);
		struct kvr_msg_commit_rep cr;
		if (!rc && kvr_msg_decode_commit_rep(&m, &cr))
			rc = -EPROTO;
		if (rc) {
			kvr_warn("store %llx: commit failed: %s", (unsigned long long)rq[0].wire, strerror(-rc));
			fail_ranks(ss, sw, rq, n_ranks, rc == -ECANCELED ? -EPIPE : rc);
			(void)reset_lane(ss);
			return;
		}
		/* The slot table is the truth: a slot is ours if it is COMMITTED under our epoch
		 * (the lookup actor may have refused one it reclaimed meanwhile). */
		for (uint32_t k = 0; k < n_copy; k++) {
			uint32_t sl = ss->written[k].slot;
			if (kvr_slot_state(sw[0]->slots, sl) == KVR_SLOT_COMMITTED &&
			    kvr_slot_epoch(sw[0]->slots, sl) == ss->written[k].epoch)
				committed++;
			else
				ss->fail_pos[n_fail++] = ss->pos[k];
		}
		if (committed != cr.n_committed)
			kvr_warn("store %llx: lookup reported %u commits, the slot table shows %u",
				 (unsigned long long)rq[0].wire, cr.n_committed, committed);
	}

	/* 4. answer every rank (blocks count once: a DCP group stores one canonical block) */
	kvr_actor_count(ss->a, KVR_STAT_XF_BLOCKS, committed);
	kvr_actor_count(ss->a, KVR_STAT_XF_PRESENT_BLOCKS, present);
	for (unsigned r = 0; r < n_ranks; r++) {
		for (uint32_t k = 0; k < n_fail; k++)
			ss->failed[k] = rq[r].items[ss->fail_pos[k]].block;
		kvr_actor_count(ss->a, KVR_STAT_XF_BYTES, st[r].bytes);
		store_reply(ss, sw[r], &rq[r], n_fail ? -EIO : 0, committed, present, n_fail, &st[r]);
	}
	ss->run_ns = 0;
	kvr_debug("store %llx: %u blocks x %u ranks, %u stored, %u present, %u failed", (unsigned long long)rq[0].wire, n,
		  n_ranks, committed, present, n_fail);
}
