/* storer stage: copy one worker's finished KV blocks into L1 slots and commit them (STORE -> STORE_DONE). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_actor.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_time.h"
#include "stage_common.h"

/*
 * One storer per attached worker. A STORE lists (block key, engine block id) pairs of
 * blocks the engine reported final (the client sends a store only then). The storer:
 *
 *   1. ALLOC  asks the lookup actor for a slot per key on its lane. Keys already stored on
 *             this lane come back PRESENT (suffix-only: a prompt sharing a cached prefix
 *             copies only its new blocks), keys with no evictable room come back NOROOM;
 *   2. copies the worker's blocks into the allocated (WRITING) slots, one staging lease
 *             at a time, through the transfer backend;
 *   3. COMMIT tells the lookup actor which slots are complete; a block becomes visible
 *             once every lane of its TP group committed (the quorum);
 *   4. replies STORE_DONE with the counts and the block ids that were not stored.
 *
 * Requests are handled one after the other, so commits follow producer order.
 *
 * If the lookup actor restarts while a store waits for it, the store fails (-EPIPE) and
 * the storer sends RESET, which aborts every WRITING slot of this worker: nothing half
 * written can become visible. The storer also sends RESET when it starts, for slots a
 * previous incarnation left WRITING.
 */

#define LOOKUP_TIMEOUT_NS (10ull * 1000000000ull)

struct storer {
	struct stage_worker sw;
	struct kvr_ring *commit_req, *commit_rep;
	unsigned lookup_actor;
	struct kvr_list_asm req;
	struct kvr_list_asm alloc_rep;
	struct kvr_msg_key *keys;
	struct kvr_msg_slot *written;  /* slots copied, to commit */
	uint32_t *blocks;
	uint64_t *slot_offs;
	uint32_t *failed;
	uint32_t cap;
	uint64_t next_id;
};

static int grow(struct storer *s, uint32_t n)
{
	if (n <= s->cap)
		return 0;
	void *p;
	if (!(p = realloc(s->keys, n * sizeof(*s->keys))))
		return -ENOMEM;
	s->keys = p;
	if (!(p = realloc(s->written, n * sizeof(*s->written))))
		return -ENOMEM;
	s->written = p;
	if (!(p = realloc(s->blocks, n * sizeof(*s->blocks))))
		return -ENOMEM;
	s->blocks = p;
	if (!(p = realloc(s->slot_offs, n * sizeof(*s->slot_offs))))
		return -ENOMEM;
	s->slot_offs = p;
	if (!(p = realloc(s->failed, n * sizeof(*s->failed))))
		return -ENOMEM;
	s->failed = p;
	s->cap = n;
	return 0;
}

/* Wait for the lookup actor's reply to request id `id` on commit.rep. Messages of earlier
 * (abandoned) requests are skipped. -EPIPE when the lookup actor restarted meanwhile. */
static int await_lookup(struct storer *s, uint64_t id, uint32_t lookup_gen, struct kvr_msg *ret)
{
	uint64_t deadline = kvr_now_ns() + LOOKUP_TIMEOUT_NS;
	for (;;) {
		int rc = kvr_ring_dequeue(s->commit_rep, ret, 20000000);
		if (rc == 0) {
			if (ret->hdr.req_id == id)
				return 0;
			continue;
		}
		if (rc != -ETIMEDOUT && rc != -EINTR)
			return rc;
		if (s->sw.a->stopping)
			return -ECANCELED;
		struct kvr_actor_ent *le = kvr_ctl_actor(s->sw.a->ctl, s->lookup_actor);
		if (atomic_load(&le->generation) != lookup_gen)
			return -EPIPE;
		if (kvr_now_ns() >= deadline)
			return -ETIMEDOUT;
	}
}

/* RESET: abort this worker's WRITING slots. Waits for the lookup actor's answer. */
static int reset_lane(struct storer *s)
{
	struct kvr_actor_ent *le = kvr_ctl_actor(s->sw.a->ctl, s->lookup_actor);
	uint32_t gen = atomic_load(&le->generation);
	uint64_t id = ++s->next_id;
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_RESET, 0, id, 0, NULL, 0);
	int rc = kvr_msg_send(s->commit_req, &m, kvr_now_ns() + LOOKUP_TIMEOUT_NS);
	if (!rc)
		rc = await_lookup(s, id, gen, &m);
	struct kvr_msg_commit_rep r;
	if (!rc && kvr_msg_decode_commit_rep(&m, &r))
		rc = -EPROTO;
	if (!rc && r.status)
		rc = r.status;
	return rc;
}

static int storer_init(struct kvr_actor *a)
{
	struct storer *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	kvr_actor_set_data(a, s);
	int rc = stage_worker_open(a, &s->sw, "store.req.%u", "store.rep.%u", 100 - a->cfg.staging.load_percent);
	if (rc)
		return rc;
	s->commit_req = kvr_actor_ring_w(a, "commit.req.%u", s->sw.worker);
	s->commit_rep = kvr_actor_ring_w(a, "commit.rep.%u", s->sw.worker);
	if (!s->commit_req || !s->commit_rep)
		return -ENOENT;
	s->lookup_actor = 0;
	s->next_id = (uint64_t)kvr_now_ns() << 8; /* ids unique across incarnations */
	kvr_list_asm_init(&s->req, KVR_MSG_STORE);
	kvr_list_asm_init(&s->alloc_rep, KVR_MSG_ALLOC_REP);
	rc = reset_lane(s);
	if (rc)
		kvr_warn("worker %u: RESET of its lane: %s (continuing)", s->sw.worker, strerror(-rc));
	return 0;
}

static void storer_fini(struct kvr_actor *a)
{
	struct storer *s = a->data;
	if (!s)
		return;
	stage_worker_close(&s->sw);
	kvr_list_asm_free(&s->req);
	kvr_list_asm_free(&s->alloc_rep);
	free(s->keys);
	free(s->written);
	free(s->blocks);
	free(s->slot_offs);
	free(s->failed);
	free(s);
}

static void reply(struct storer *s, uint64_t wire, int status, uint32_t n, uint32_t stored, uint32_t present,
		  uint32_t n_failed, const struct kvr_xfer_stats *st, uint64_t queue_ns)
{
	struct kvr_msg_store_done d = {
		.status = status,
		.n_blocks = n,
		.n_stored = stored,
		.n_present = present,
		.n_failed = n_failed,
		.copies = st ? (uint32_t)st->copies : 0,
		.bytes = st ? st->bytes : 0,
		.copy_ns = st ? st->copy_ns : 0,
		.queue_us = (uint32_t)(queue_ns / 1000),
	};
	stage_reply(&s->sw, KVR_MSG_STORE_DONE, wire, status, &d, sizeof(d), s->failed, n_failed, s->req.first_ns);
}

static void fail_all(struct storer *s, uint64_t wire, int status, uint64_t queue_ns)
{
	const struct kvr_msg_store_item *items = s->req.items;
	uint32_t n = s->req.total;
	for (uint32_t i = 0; i < n; i++)
		s->failed[i] = items[i].block;
	reply(s, wire, status, n, 0, 0, n, NULL, queue_ns);
}

static void execute(struct kvr_actor *a, struct storer *s)
{
	const struct kvr_msg_store_item *items = s->req.items;
	uint32_t n = s->req.total;
	uint64_t wire = s->req.req_id, queue_ns = kvr_now_ns() - s->req.first_ns;
	if (grow(s, n)) {
		reply(s, wire, -ENOMEM, n, 0, 0, 0, NULL, queue_ns);
		return;
	}
	if (!stage_wire_current(a, wire)) {
		fail_all(s, wire, -ESTALE, queue_ns);
		return;
	}
	/* CUDA: the copy must wait for the event the worker recorded after writing the KV */
	struct kvr_xfer_dep dep, *ready = NULL;
	if (s->req.flags & KVR_STOREF_CUDA_EVENT) {
		if (!s->sw.cuda || kvr_cuda_events_dep(&s->sw.events, wire, &dep)) {
			fail_all(s, wire, -ENOENT, queue_ns);
			return;
		}
		ready = &dep;
	}
	for (uint32_t i = 0; i < n; i++) {
		s->keys[i] = items[i].key;
		if (items[i].block >= s->sw.geom.num_blocks) {
			fail_all(s, wire, -ERANGE, queue_ns);
			return;
		}
	}

	/* 1. allocate */
	struct kvr_actor_ent *le = kvr_ctl_actor(a->ctl, s->lookup_actor);
	uint32_t lgen = atomic_load(&le->generation);
	uint64_t id = ++s->next_id;
	int rc = kvr_list_send(s->commit_req, KVR_MSG_ALLOC, id, (uint8_t)s->sw.lane, s->keys, n,
			       kvr_now_ns() + LOOKUP_TIMEOUT_NS);
	int fed = 0;
	while (!rc && fed != 1) {
		struct kvr_msg m;
		rc = await_lookup(s, id, lgen, &m);
		if (rc)
			break;
		fed = kvr_list_feed(&s->alloc_rep, &m);
		if (fed < 0 || (fed == 1 && s->alloc_rep.total != n))
			rc = -EPROTO;
	}
	if (rc) {
		kvr_warn("store %llx: allocation failed: %s", (unsigned long long)wire, strerror(-rc));
		fail_all(s, wire, rc == -ECANCELED ? -EPIPE : rc, queue_ns);
		(void)reset_lane(s);
		return;
	}

	/* 2. copy into the WRITING slots */
	const struct kvr_msg_slot *alloc = s->alloc_rep.items;
	uint32_t n_copy = 0, present = 0, n_failed = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (alloc[i].slot == KVR_SLOT_PRESENT) {
			present++;
		} else if (alloc[i].slot == KVR_SLOT_NOROOM || alloc[i].slot >= s->sw.slots->n_slots) {
			s->failed[n_failed++] = items[i].block;
		} else {
			s->written[n_copy] = alloc[i];
			s->blocks[n_copy] = items[i].block;
			s->slot_offs[n_copy] = s->sw.slots->arena_data_off + (uint64_t)alloc[i].slot * s->sw.slots->slot_bytes;
			n_copy++;
		}
	}
	struct kvr_xfer_stats st = {0};
	rc = stage_copy_chunks(&s->sw, KVR_XFER_KV_TO_SLOT, s->blocks, s->slot_offs, n_copy, ready, &st);
	if (rc) {
		kvr_warn("store %llx: copy failed: %s", (unsigned long long)wire, strerror(-rc));
		fail_all(s, wire, rc, queue_ns);
		(void)reset_lane(s); /* aborts the WRITING slots: nothing partial becomes visible */
		return;
	}

	/* 3. commit */
	uint32_t committed = 0;
	if (n_copy) {
		id = ++s->next_id;
		rc = kvr_list_send(s->commit_req, KVR_MSG_COMMIT, id, (uint8_t)s->sw.lane, s->written, n_copy,
				   kvr_now_ns() + LOOKUP_TIMEOUT_NS);
		struct kvr_msg m;
		if (!rc)
			rc = await_lookup(s, id, lgen, &m);
		struct kvr_msg_commit_rep cr;
		if (!rc && kvr_msg_decode_commit_rep(&m, &cr))
			rc = -EPROTO;
		if (rc) {
			kvr_warn("store %llx: commit failed: %s", (unsigned long long)wire, strerror(-rc));
			fail_all(s, wire, rc == -ECANCELED ? -EPIPE : rc, queue_ns);
			(void)reset_lane(s);
			return;
		}
		/* The slot table is the truth: a slot is ours if it is COMMITTED under our epoch
		 * (the lookup actor may have refused one it reclaimed meanwhile). */
		for (uint32_t i = 0; i < n_copy; i++) {
			uint32_t sl = s->written[i].slot;
			if (kvr_slot_state(s->sw.slots, sl) == KVR_SLOT_COMMITTED &&
			    kvr_slot_epoch(s->sw.slots, sl) == s->written[i].epoch)
				committed++;
			else
				s->failed[n_failed++] = s->blocks[i];
		}
		if (committed != cr.n_committed)
			kvr_warn("store %llx: lookup reported %u commits, the slot table shows %u", (unsigned long long)wire,
				 cr.n_committed, committed);
	}
	kvr_actor_count(a, KVR_STAT_XF_BLOCKS, committed);
	kvr_actor_count(a, KVR_STAT_XF_BYTES, st.bytes);
	kvr_actor_count(a, KVR_STAT_XF_PRESENT_BLOCKS, present);
	kvr_debug("store %llx: %u blocks, %u stored, %u present, %u failed, %llu bytes", (unsigned long long)wire, n,
		  committed, present, n_failed, (unsigned long long)st.bytes);
	reply(s, wire, n_failed ? -EIO : 0, n, committed, present, n_failed, &st, queue_ns);
}

static int storer_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct storer *s = a->data;
	if (ring == s->commit_rep)
		return 0; /* a late reply of a request we gave up on */
	if (ring != s->sw.req)
		return -EBADMSG;
	int rc = kvr_list_feed(&s->req, m);
	if (rc < 0)
		return -EBADMSG;
	if (rc == 1)
		execute(a, s);
	return 0;
}

static const struct kvr_stage storer_stage = {
	.name = "storer",
	.kind = KVR_ACTOR_STORER,
	.init = storer_init,
	.on_msg = storer_on_msg,
	.fini = storer_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &storer_stage);
}
