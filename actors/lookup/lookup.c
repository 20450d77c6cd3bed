/* lookup stage: the prefix index — longest visible prefix, suffix-only slot allocation, commit quorum, eviction. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvring/kvring.h>

#include "clients.h"
#include "kvr_actor.h"
#include "kvr_index.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_outbox.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "l2tier.h"
#include "leases.h"

/*
 * One lookup actor per instance, the single writer of the slot table. Its index lives in
 * its heap and is rebuilt from the slot table when it starts, so a restart loses nothing
 * committed. It serves:
 *
 *   lookup.req.w   LOOKUP keys           -> LOOKUP_REP + SLOTS (the lane's slot per block)
 *   commit.req.w   ALLOC keys            -> ALLOC_REP (slot | PRESENT | NOROOM per key)
 *                  COMMIT (slot, epoch)  -> COMMIT_REP (committed, became visible)
 *                  RESET                 -> COMMIT_REP (this worker's WRITING slots aborted)
 *                  LEASE_TAKE id         -> LOOKUP_REP + SLOTS (its lane's slots of the lease)
 *                  LEASE_DONE id         (its load of the lease completed)
 *   sched.req.s    LEASE + LOOKUP keys   -> LEASE_REP (blocks leased; every lane pinned)
 *                  LEASE_RELEASE id      (the lease ends)
 *   ctl.lookup.in  WORKER_GONE w         (pins of w dropped, its WRITING slots aborted)
 *
 * Replies go through one outbox per reader ring (kvr_outbox.h): the actor never waits for
 * room in a reader's ring, so a worker that stops reading delays nobody else; what waits
 * for it longer than timeouts.reply_ms without the reader taking anything is dropped and
 * counted.
 */

/* reply and ALLOC deadlines: timeouts.reply_ms, timeouts.alloc_wait_ms (docs/config.md) */
#define REPLY_TIMEOUT_NS(a) kvr_ms_to_ns((a)->cfg.timeouts.reply_ms)


struct lk_worker {
	struct kvr_ring *lk_req, *lk_rep, *cm_req, *cm_rep;
	struct kvr_outbox lk_out, cm_out; /* replies waiting for room in lk_rep / cm_rep */
	struct kvr_list_asm lookup, alloc, commit;
	struct kvr_index_ref *alloc_refs; /* the answer to its ALLOC, built up while it waits */
	uint32_t cap_alloc_refs;
	bool alloc_waiting;               /* its ALLOC waits for L2 writes to unpin room */
	uint64_t alloc_deadline;
};

/* A scheduler slot: its lease request in assembly, then in progress while L2 promotes it
 * (every lane at once, each through its l2tier requester L2T_LEASE_REQUESTER). */
struct lk_sched {
	struct kvr_ring *req, *rep;
	struct kvr_outbox out;        /* replies waiting for room in rep */
	struct kvr_list_asm keys;
	struct kvr_msg_lease hdr;     /* the LEASE that announced the key list */
	uint64_t hdr_wire;            /* its wire id; 0 = none */
	bool promoting;               /* waiting for l2tier: `lanes_busy` lanes still promote */
	unsigned lanes;               /* lanes a block of its engine (lk_client_lanes), at its LEASE */
	unsigned lanes_busy;
	uint32_t promoted;            /* lane 0's blocks read from L2 for this lease */
	unsigned why;                 /* enum kvr_miss_reason a lane's promotion stopped for (0: none) */
};

struct lookup {
	struct kvr_index *idx;
	struct kvr_slot_table *slots;
	unsigned lanes;               /* the most lanes a block has (kvr_slots_lanes_max): scratch, requester ids */
	unsigned n_workers;
	struct lk_worker *w;
	struct kvr_index_ref *refs;
	uint32_t cap_refs;
	struct l2tier *l2;            /* NULL without an L2 tier */
	unsigned n_sched;
	struct lk_sched *sched;
	struct leases *leases;
	struct kvr_index_ref *lease_refs; /* lanes x keys scratch for a grant */
	size_t cap_lease_refs;
};

static void beat(void *ctx)
{
	kvr_actor_beat(ctx);
}

static int lookup_init(struct kvr_actor *a)
{
	struct lookup *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	kvr_actor_set_data(a, l);
	l->slots = a->slots;
	if (!l->slots)
		return -EINVAL;
	l->lanes = kvr_slots_lanes_max(l->slots);
	/* Lookup pins have one owner, us: whatever a predecessor left is its own (promotions
	 * it was waiting for) and goes now, before the index looks at what is evictable. */
	uint64_t dropped = 0;
	for (uint32_t s = 0; s < l->slots->n_slots; s++)
		dropped += kvr_slot_drop_pins(l->slots, s, KVR_PIN_LOOKUP);
	if (dropped) {
		kvr_actor_count(a, KVR_STAT_LK_PINS_RELEASED, dropped);
		kvr_warn("released %llu lookup pins left by the previous lookup actor", (unsigned long long)dropped);
	}
	int rc = kvr_index_new(l->slots, a->cfg.l1.eviction, &l->idx);
	if (rc) {
		kvr_err("index: %s", strerror(-rc));
		return rc;
	}
	kvr_index_set_progress(l->idx, beat, a);
	struct kvr_index_stats st;
	kvr_index_stats(l->idx, &st);
	kvr_info("index rebuilt from the slot table: %u blocks (%u visible), %u free slots, %u draining, policy %s",
		 st.blocks, st.visible, st.free_slots, kvr_index_draining(l->idx), st.policy);
	l->n_workers = a->ctl->max_workers;
	l->w = calloc(l->n_workers, sizeof(*l->w));
	if (!l->w)
		return -ENOMEM;
	for (unsigned i = 0; i < l->n_workers; i++) {
		struct lk_worker *w = &l->w[i];
		w->lk_req = kvr_actor_ring_w(a, KVR_RING_LOOKUP_REQ, i);
		w->lk_rep = kvr_actor_ring_w(a, KVR_RING_LOOKUP_REP, i);
		w->cm_req = kvr_actor_ring_w(a, KVR_RING_COMMIT_REQ, i);
		w->cm_rep = kvr_actor_ring_w(a, KVR_RING_COMMIT_REP, i);
		if (!w->lk_req || !w->lk_rep || !w->cm_req || !w->cm_rep) {
			kvr_err("rings of worker slot %u missing", i);
			return -ENOENT;
		}
		kvr_outbox_init(&w->lk_out, w->lk_rep);
		kvr_outbox_init(&w->cm_out, w->cm_rep);
		kvr_list_asm_init(&w->lookup, KVR_MSG_LOOKUP);
		kvr_list_asm_init(&w->alloc, KVR_MSG_ALLOC);
		kvr_list_asm_init(&w->commit, KVR_MSG_COMMIT);
	}
	l->n_sched = a->cfg.instance.max_schedulers;
	l->sched = calloc(l->n_sched ? l->n_sched : 1, sizeof(*l->sched));
	l->leases = leases_new(l->slots, a->cfg.l1.max_leases);
	if (!l->sched || !l->leases)
		return -ENOMEM;
	for (unsigned i = 0; i < l->n_sched; i++) {
		struct lk_sched *sc = &l->sched[i];
		sc->req = kvr_actor_ring_w(a, KVR_RING_SCHED_REQ, i);
		sc->rep = kvr_actor_ring_w(a, KVR_RING_SCHED_REP, i);
		if (!sc->req || !sc->rep) {
			kvr_err("rings of scheduler slot %u missing", i);
			return -ENOENT;
		}
		kvr_outbox_init(&sc->out, sc->rep);
		kvr_list_asm_init(&sc->keys, KVR_MSG_LOOKUP);
	}
	int rc2 = l2t_open(a, l->idx, &l->l2);
	if (rc2) {
		kvr_err("L2 tier: %s", strerror(-rc2));
		return rc2;
	}
	return 0;
}

static void lookup_fini(struct kvr_actor *a)
{
	struct lookup *l = a->data;
	if (!l)
		return;
	for (unsigned i = 0; l->w && i < l->n_workers; i++) {
		kvr_list_asm_free(&l->w[i].lookup);
		kvr_list_asm_free(&l->w[i].alloc);
		kvr_list_asm_free(&l->w[i].commit);
		kvr_outbox_free(&l->w[i].lk_out);
		kvr_outbox_free(&l->w[i].cm_out);
		free(l->w[i].alloc_refs);
	}
	free(l->w);
	for (unsigned i = 0; l->sched && i < l->n_sched; i++) {
		kvr_list_asm_free(&l->sched[i].keys);
		kvr_outbox_free(&l->sched[i].out);
	}
	free(l->sched);
	leases_free(l->leases);
	free(l->lease_refs);
	free(l->refs);
	l2t_close(l->l2);
	kvr_index_free(l->idx);
	free(l);
}

static struct kvr_index_ref *refs(struct lookup *l, uint32_t n)
{
	if (n > l->cap_refs) {
		struct kvr_index_ref *r = realloc(l->refs, n * sizeof(*r));
		if (!r)
			return NULL;
		l->refs = r;
		l->cap_refs = n;
	}
	return l->refs;
}

/* n reply messages for `who` were dropped: its reader took nothing for timeouts.reply_ms
 * (or its outbox overflowed). One line per occurrence, not per message. */
static void dropped(struct kvr_actor *a, const char *who, unsigned i, uint32_t n)
{
	if (!n)
		return;
	kvr_actor_count(a, KVR_STAT_LK_REPLIES_DROPPED, n);
	kvr_err("%s %u does not read its replies: %u reply messages dropped", who, i, n);
}

static void send_lookup_rep_refs(struct kvr_actor *a, struct lookup *l, unsigned wi, uint64_t wire, int status,
				 uint32_t matched, uint32_t promoted, unsigned lane, uint64_t index_ns,
				 const struct kvr_index_ref *slot_refs)
{
	struct lk_worker *w = &l->w[wi];
	struct kvr_msg_lookup_rep r = {.status = status, .matched = matched, .lane = lane, .promoted = promoted,
				       .index_ns = index_ns};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LOOKUP_REP, (matched ? KVR_MSGF_MORE : 0) | (status ? KVR_MSGF_ERROR : 0), wire, 0,
		      &r, sizeof(r));
	uint64_t now = kvr_actor_now(a);
	_Static_assert(sizeof(struct kvr_index_ref) == sizeof(struct kvr_msg_slot), "slot wire format");
	int rc = kvr_outbox_send(&w->lk_out, &m, now);
	if (matched && kvr_outbox_send_list(&w->lk_out, KVR_MSG_SLOTS, wire, 0, 0, slot_refs, matched, now))
		rc = -ENOBUFS;
	if (rc)
		dropped(a, "worker", wi, 1);
}

static void send_lookup_rep(struct kvr_actor *a, struct lookup *l, unsigned wi, uint64_t wire, int status,
			    uint32_t matched, unsigned lane, uint64_t index_ns)
{
	send_lookup_rep_refs(a, l, wi, wire, status, matched, 0, lane, index_ns, l->refs);
}

static void lease_l2_done(struct kvr_actor *a, struct lookup *l, unsigned si, const struct l2t_done *d);

/* A lookup that waited for promotions from L2 is answered now. */
static void l2_done_reply(struct kvr_actor *a, struct lookup *l, const struct l2t_done *d)
{
	if (d->worker >= l->n_workers) {
		lease_l2_done(a, l, (d->worker - l->n_workers) / l->lanes, d);
		return;
	}
	kvr_actor_count(a, KVR_STAT_LK_MATCHED, d->matched);
	lk_client_count(a, d->worker, 0, 0, d->matched);
	send_lookup_rep_refs(a, l, d->worker, d->wire, 0, d->matched, d->promoted, d->lane, d->index_ns, d->refs);
}

static void do_lookup(struct kvr_actor *a, struct lookup *l, unsigned wi)
{
	struct kvr_list_asm *q = &l->w[wi].lookup;
	uint64_t wire = q->req_id;
	unsigned lane = q->lane;
	if (!kvr_wire_for(wire, atomic_load(&a->ent->generation))) {
		kvr_actor_count(a, KVR_STAT_LK_STALE, 1);
		send_lookup_rep(a, l, wi, wire, -ESTALE, 0, lane, 0);
		return;
	}
	if (lane >= lk_client_lanes(a, wi)) {
		send_lookup_rep(a, l, wi, wire, -EINVAL, 0, lane, 0);
		return;
	}
	if (!refs(l, q->total)) {
		send_lookup_rep(a, l, wi, wire, -ENOMEM, 0, lane, 0);
		return;
	}
	uint64_t t0 = kvr_now_ns();
	int n = kvr_index_match(l->idx, q->items, q->total, lane, l->refs);
	uint64_t dt = kvr_now_ns() - t0;
	if (n < 0) {
		send_lookup_rep(a, l, wi, wire, n, 0, lane, dt);
		return;
	}
	kvr_actor_count(a, KVR_STAT_LK_LOOKUPS, 1);
	kvr_actor_count(a, KVR_STAT_LK_KEYS, q->total);
	lk_client_count(a, wi, 1, q->total, 0);
	/* L1 hits and misses are counted on the L1 prefix; blocks L2 adds are counted as
	 * matched when their promotion completes */
	kvr_actor_count(a, KVR_STAT_LK_MISSED, q->total - (uint64_t)n);
	kvr_actor_count(a, KVR_STAT_LK_L1_HITS, (uint64_t)n);
	int ext = l2t_extend(l->l2, wi, wire, lane, q->items, q->total, (uint32_t)n, l->refs, dt);
	if (ext == -EINPROGRESS)
		return; /* answered (and its matched blocks counted) when the promotions finish */
	kvr_actor_count(a, KVR_STAT_LK_MATCHED, (uint64_t)ext);
	lk_client_count(a, wi, 0, 0, (uint64_t)ext);
	send_lookup_rep(a, l, wi, wire, 0, (uint32_t)ext, lane, dt);
}

static void send_commit_rep(struct kvr_actor *a, struct lookup *l, unsigned wi, uint64_t id, int status,
			    uint32_t committed, uint32_t visible)
{
	struct kvr_msg_commit_rep r = {.status = status, .n_committed = committed, .n_visible = visible};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_COMMIT_REP, status ? KVR_MSGF_ERROR : 0, id, 0, &r, sizeof(r));
	if (kvr_outbox_send(&l->w[wi].cm_out, &m, kvr_actor_now(a)))
		dropped(a, "worker", wi, 1);
}


static void alloc_reply(struct kvr_actor *a, struct lookup *l, unsigned wi)
{
	struct lk_worker *w = &l->w[wi];
	struct kvr_list_asm *q = &w->alloc;
	for (uint32_t i = 0; i < q->total; i++)
		if (w->alloc_refs[i].slot == KVR_INDEX_NOROOM)
			kvr_actor_count(a, KVR_STAT_LK_NOROOM, 1);
	w->alloc_waiting = false;
	if (kvr_outbox_send_list(&w->cm_out, KVR_MSG_ALLOC_REP, q->req_id, q->lane, 0, w->alloc_refs, q->total,
				 kvr_actor_now(a)))
		dropped(a, "worker", wi, 1);
}

/* Slots of ALLOCs being answered (wi's, and every one waiting for room): WRITING, but
 * nobody writes them before their ALLOC_REP goes out. */
static uint32_t alloc_held(const struct lookup *l, unsigned wi)
{
	uint32_t n = 0;
	for (unsigned v = 0; v < l->n_workers; v++) {
		const struct lk_worker *w = &l->w[v];
		if (v != wi && !w->alloc_waiting)
			continue;
		for (uint32_t i = 0; i < w->alloc.total; i++)
			n += w->alloc_refs[i].slot != KVR_INDEX_NOROOM && w->alloc_refs[i].slot != KVR_INDEX_PRESENT;
	}
	return n;
}

/* Whether a store (or a promotion) is writing into L1 besides the ALLOCs being answered:
 * once committed its slots are evictable. A scan of the slot table, on the no-room path
 * only. */
static bool others_writing(const struct lookup *l, unsigned wi)
{
	uint32_t writing = 0, held = alloc_held(l, wi);
	for (uint32_t s = 0; s < l->slots->n_slots && writing <= held; s++)
		writing += kvr_slot_state(l->slots, s) == KVR_SLOT_WRITING;
	return writing > held;
}

/* Allocate what is still NOROOM in the worker's ALLOC. When nothing is evictable only
 * because slots are pinned by write-throughs to L2, or are WRITING for other stores (and
 * promotions) that will commit them, the reply waits for those (each L2_WRITE_DONE,
 * L2_READ_DONE, COMMIT and RESET retries) up to timeouts.alloc_wait_ms: a full L1 is
 * backpressure, not a failed store. */
static void alloc_try(struct kvr_actor *a, struct lookup *l, unsigned wi)
{
	struct lk_worker *w = &l->w[wi];
	struct kvr_list_asm *q = &w->alloc;
	const kvr_key *keys = q->items;
	uint32_t first = 0;
	while (first < q->total && w->alloc_refs[first].slot != KVR_INDEX_NOROOM)
		first++;
	if (first < q->total) {
		struct kvr_index_alloc_stats st = {0};
		const struct kvr_slot_tag tag = lk_client_tag(a, wi);
		if (kvr_index_alloc_tagged(l->idx, keys + first, q->total - first, q->lane, &tag, wi, w->alloc_refs + first,
					   &st))
			for (uint32_t i = first; i < q->total; i++)
				w->alloc_refs[i] = (struct kvr_index_ref){.slot = KVR_INDEX_NOROOM};
		kvr_actor_count(a, KVR_STAT_LK_ALLOCATED, st.allocated);
		kvr_actor_count(a, KVR_STAT_LK_PRESENT, st.present);
		atomic_fetch_add_explicit(&lk_client_model(a, wi)->stored, st.allocated, memory_order_relaxed);
		kvr_actor_count(a, KVR_STAT_LK_EVICTED, st.evicted);
		unsigned noroom = 0;
		for (uint32_t i = first; i < q->total; i++)
			noroom += w->alloc_refs[i].slot == KVR_INDEX_NOROOM;
		/* write-back: make room by writing the least recent blocks out (they become
		 * evictable when on disk), then wait like for any write */
		if (noroom && !l2t_writes_inflight(l->l2))
			(void)l2t_demote(l->l2, noroom);
		if (noroom && kvr_actor_now(a) < w->alloc_deadline &&
		    (l2t_writes_inflight(l->l2) || others_writing(l, wi))) {
			w->alloc_waiting = true;
			return;
		}
	}
	alloc_reply(a, l, wi);
}

static void do_alloc(struct kvr_actor *a, struct lookup *l, unsigned wi)
{
	struct lk_worker *w = &l->w[wi];
	struct kvr_list_asm *q = &w->alloc;
	if (q->total > w->cap_alloc_refs) {
		struct kvr_index_ref *r = realloc(w->alloc_refs, q->total * sizeof(*r));
		if (!r)
			return; /* out of memory: the storer times out and resets */
		w->alloc_refs = r;
		w->cap_alloc_refs = q->total;
	}
	for (uint32_t i = 0; i < q->total; i++)
		w->alloc_refs[i] = (struct kvr_index_ref){.slot = KVR_INDEX_NOROOM};
	if (q->lane >= lk_client_lanes(a, wi)) {
		alloc_reply(a, l, wi);
		return;
	}
	w->alloc_deadline = kvr_actor_now(a) + kvr_ms_to_ns(a->cfg.timeouts.alloc_wait_ms);
	alloc_try(a, l, wi);
}

/* Room may have freed (an L2 write finished, or time passed): retry waiting ALLOCs. */
static void alloc_retry_all(struct kvr_actor *a, struct lookup *l)
{
	for (unsigned wi = 0; wi < l->n_workers; wi++)
		if (l->w[wi].alloc_waiting)
			alloc_try(a, l, wi);
}

static void do_commit(struct kvr_actor *a, struct lookup *l, unsigned wi)
{
	struct kvr_list_asm *q = &l->w[wi].commit;
	const struct kvr_msg_slot *items = q->items;
	uint32_t committed = 0, visible = 0;
	for (uint32_t i = 0; i < q->total; i++) {
		if (i % KVR_INDEX_PROGRESS_KEYS == KVR_INDEX_PROGRESS_KEYS - 1)
			kvr_actor_beat(a);
		/* Only the owner's own WRITING slots: another worker cannot commit them. */
		if (items[i].slot < l->slots->n_slots && kvr_slot_at(l->slots, items[i].slot)->owner != wi)
			continue;
		int rc = kvr_index_commit(l->idx, q->lane, items[i].slot, items[i].epoch);
		if (rc >= 0) {
			committed++;
			l2t_committed(l->l2, kvr_slot_at(l->slots, items[i].slot)->key, q->lane, items[i].slot,
				      items[i].epoch);
		}
		if (rc == 1)
			visible++;
	}
	kvr_actor_count(a, KVR_STAT_LK_COMMITTED, committed);
	kvr_actor_count(a, KVR_STAT_LK_VISIBLE, visible);
	send_commit_rep(a, l, wi, q->req_id, 0, committed, visible);
}

/* ---- leases ------------------------------------------------------------------------------ */

static bool wire_current(struct kvr_actor *a, uint64_t wire)
{
	return kvr_wire_for(wire, atomic_load(&a->ent->generation));
}

static void send_lease_rep(struct kvr_actor *a, struct lookup *l, unsigned si, uint64_t wire, int status,
			   uint32_t matched, uint32_t promoted, uint32_t pending, unsigned miss, uint64_t index_ns)
{
	struct kvr_msg_lookup_rep r = {.status = status, .matched = matched, .promoted = promoted,
				       .pending = pending, .miss = miss, .index_ns = index_ns};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE_REP, status ? KVR_MSGF_ERROR : 0, wire, 0, &r, sizeof(r));
	if (kvr_outbox_send(&l->sched[si].out, &m, kvr_actor_now(a)))
		dropped(a, "scheduler", si, 1);
}

static void lease_gauge(struct kvr_actor *a, struct lookup *l)
{
	atomic_store_explicit(&a->stats->c[KVR_STAT_LK_LEASES], leases_count(l->leases), memory_order_relaxed);
}

/*
 * Of keys[0..n) (the blocks right after a lease's match), how many lead in a row with a
 * lane being written now (WRITING under a store of any engine of this namespace, or a
 * promotion) — blocks that become visible within a store's time unless it fails. The
 * connector asks again later instead of recomputing them (prefill/decode on one node:
 * the decode engine's lease arrives while the prefill engine's store is still copying).
 * A block with committed lanes and none in flight (a rank that never stored) is not
 * pending: nothing will complete it.
 */
static uint32_t blocks_in_flight(const struct lookup *l, const kvr_key *keys, uint32_t n)
{
	uint32_t i = 0;
	struct kvr_index_block b;
	while (i < n && kvr_index_get(l->idx, keys[i], &b) == 0 && !b.visible && (b.alloc_mask & ~b.commit_mask))
		i++;
	return i;
}

/*
 * Why the block after a lease's match did not match (enum kvr_miss_reason), from what the
 * lookup actor sees of it now: a lane being written (a store in flight), lanes committed
 * but not every one (quorum), the reason this lease's promotion stopped (a failed read, no
 * room), on disk on some lanes only (quorum), remembered as evicted, or nothing at all.
 */
static unsigned miss_reason(const struct lookup *l, const struct lk_sched *sc, unsigned lanes, kvr_key key)
{
	struct kvr_index_block b;
	if (kvr_index_get(l->idx, key, &b) == 0) {
		if (b.alloc_mask & ~b.commit_mask)
			return KVR_MISS_IN_FLIGHT;
		if (b.commit_mask)
			return KVR_MISS_QUORUM;
	}
	if (sc->why) /* this lease's promotion stopped here: a failed read (the file may be
		      * gone by now: a damaged one is deleted), no room */
		return sc->why;
	unsigned on_disk = 0;
	for (unsigned lane = 0; l->l2 && lane < lanes; lane++)
		on_disk += l2t_has(l->l2, key, lane);
	if (on_disk == lanes)
		return KVR_MISS_L2_FAILED;
	if (on_disk)
		return KVR_MISS_QUORUM;
	if (kvr_index_gone_recently(l->idx, key))
		return KVR_MISS_EVICTED;
	return KVR_MISS_NEVER_STORED;
}

/* Every lane's slots of the visible prefix now: pin them under the lease and answer. */
static void lease_finish(struct kvr_actor *a, struct lookup *l, unsigned si)
{
	struct lk_sched *sc = &l->sched[si];
	const kvr_key *keys = sc->keys.items;
	uint32_t total = sc->keys.total;
	uint16_t engine = kvr_ctl_sched(a->ctl, si)->engine;
	const unsigned lanes = sc->lanes; /* its engine's blocks' */
	sc->promoting = false;
	size_t need = (size_t)lanes * total;
	if (need > l->cap_lease_refs) {
		struct kvr_index_ref *r = realloc(l->lease_refs, need * sizeof(*r));
		if (!r) {
			send_lease_rep(a, l, si, sc->hdr_wire, -ENOMEM, 0, 0, 0, 0, 0);
			return;
		}
		l->lease_refs = r;
		l->cap_lease_refs = need;
	}
	uint64_t t0 = kvr_now_ns();
	int n = (int)total;
	for (unsigned lane = 0; lane < lanes && n > 0; lane++) {
		int got = kvr_index_match(l->idx, keys, total, lane, l->lease_refs + (size_t)lane * total);
		if (got < n)
			n = got < 0 ? 0 : got;
	}
	/* the lanes were matched against one list length: compact to n blocks a lane */
	for (unsigned lane = 1; lane < lanes && n > 0 && (uint32_t)n < total; lane++)
		memmove(l->lease_refs + (size_t)lane * (uint32_t)n, l->lease_refs + (size_t)lane * total,
			(size_t)n * sizeof(*l->lease_refs));
	uint64_t deadline = kvr_actor_now(a) + (uint64_t)sc->hdr.ttl_ms * 1000000ull;
	int got = leases_grant(l->leases, engine, sc->hdr.lease_id, (uint32_t)n, lanes, l->lease_refs,
			       sc->hdr.loaders, deadline);
	uint64_t dt = kvr_now_ns() - t0; /* matching every lane and pinning */
	kvr_actor_count(a, KVR_STAT_LK_LOOKUPS, 1);
	kvr_actor_count(a, KVR_STAT_LK_KEYS, total);
	lk_client_count(a, a->ctl->max_workers + si, 1, total, got > 0 ? (uint64_t)got : 0);
	/* counters before the reply: whoever reads them after the answer sees this lease */
	lease_gauge(a, l);
	if (got < 0) {
		kvr_actor_count(a, KVR_STAT_LK_LEASES_REFUSED, 1);
		send_lease_rep(a, l, si, sc->hdr_wire, got, 0, 0, 0, 0, dt);
	} else {
		if (got)
			kvr_actor_count(a, KVR_STAT_LK_LEASES_GRANTED, 1);
		kvr_actor_count(a, KVR_STAT_LK_MATCHED, (uint64_t)got);
		kvr_actor_count(a, KVR_STAT_LK_MISSED, total - (uint64_t)got);
		uint32_t promoted = sc->promoted < (uint32_t)got ? sc->promoted : (uint32_t)got;
		kvr_actor_count(a, KVR_STAT_LK_L1_HITS, (uint64_t)got - promoted);
		uint32_t pending = blocks_in_flight(l, keys + got, total - (uint32_t)got);
		unsigned why = (uint32_t)got < total ? miss_reason(l, sc, lanes, keys[got]) : KVR_MISS_NONE;
		if (why) {
			kvr_actor_count(a, KVR_STAT_LK_MISS_FIRST + why - 1, total - (uint64_t)got);
			kvr_actor_count(a, KVR_STAT_LK_MISS_TOKENS_FIRST + why - 1,
					(total - (uint64_t)got) * lk_client_block_tokens(a, a->ctl->max_workers + si));
		}
		send_lease_rep(a, l, si, sc->hdr_wire, 0, (uint32_t)got, promoted, pending, why, dt);
	}
}

static unsigned lease_requester(const struct lookup *l, unsigned si, unsigned lane)
{
	return L2T_LEASE_REQUESTER(l->n_workers, l->lanes, si, lane);
}

/* A new LEASE of this scheduler slot: the promotions of its previous one are its client's
 * no longer (it gave up on that answer); their reads finish on their own. */
static void lease_cancel(struct lookup *l, unsigned si)
{
	struct lk_sched *sc = &l->sched[si];
	if (sc->promoting)
		for (unsigned lane = 0; lane < sc->lanes; lane++)
			l2t_cancel(l->l2, lease_requester(l, si, lane));
	sc->promoting = false;
	sc->lanes_busy = 0;
}

/*
 * Extend the lease over L2 on every lane at once: each lane whose L1 prefix is shorter
 * than the key list promotes through its own l2tier requester, so the reads of all lanes
 * and blocks are in flight together (a lease over TP ranks promoted lane after lane, its
 * time growing with the lanes). Returns whether it waits for promotions; lease_l2_done
 * finishes the lease when the last lane is done.
 */
static bool lease_extend(struct lookup *l, unsigned si)
{
	struct lk_sched *sc = &l->sched[si];
	const kvr_key *keys = sc->keys.items;
	uint32_t total = sc->keys.total;
	sc->lanes_busy = 0;
	for (unsigned lane = 0; lane < sc->lanes; lane++) {
		if (!refs(l, total))
			break;
		int n = kvr_index_match(l->idx, keys, total, lane, l->refs);
		if (n < 0 || (uint32_t)n >= total)
			continue;
		int ext = l2t_extend(l->l2, lease_requester(l, si, lane), sc->hdr_wire, lane, keys, total, (uint32_t)n,
				     l->refs, 0);
		if (ext == -EINPROGRESS) {
			sc->lanes_busy++;
			continue;
		}
		if (lane == 0 && ext > n)
			sc->promoted = (uint32_t)(ext - n);
		if (!sc->why) /* decided at once: no room, the tier's ring full, ... */
			sc->why = l2t_last_why(l->l2, lease_requester(l, si, lane));
	}
	sc->promoting = sc->lanes_busy > 0;
	return sc->promoting;
}

static void lease_l2_done(struct kvr_actor *a, struct lookup *l, unsigned si, const struct l2t_done *d)
{
	if (si >= l->n_sched || !l->sched[si].promoting)
		return;
	struct lk_sched *sc = &l->sched[si];
	if (d->lane == 0)
		sc->promoted = d->promoted;
	if (!sc->why)
		sc->why = d->why;
	if (sc->lanes_busy && --sc->lanes_busy)
		return; /* other lanes still promote */
	sc->promoting = false;
	lease_finish(a, l, si);
}

static void do_lease(struct kvr_actor *a, struct lookup *l, unsigned si)
{
	struct lk_sched *sc = &l->sched[si];
	uint64_t wire = sc->keys.req_id;
	if (!sc->hdr_wire || sc->hdr_wire != wire || sc->hdr.n_keys != sc->keys.total) {
		kvr_actor_count(a, KVR_STAT_MALFORMED, 1);
		send_lease_rep(a, l, si, wire, -EPROTO, 0, 0, 0, 0, 0);
		sc->hdr_wire = 0;
		return;
	}
	if (!wire_current(a, wire)) {
		kvr_actor_count(a, KVR_STAT_LK_STALE, 1);
		send_lease_rep(a, l, si, wire, -ESTALE, 0, 0, 0, 0, 0);
		return;
	}
	sc->promoted = 0;
	sc->why = KVR_MISS_NONE;
	sc->lanes = lk_client_lanes(a, a->ctl->max_workers + si);
	if (!sc->lanes) {
		/* an engine with no lane count (kvringd writes it before the entry is ATTACHED) */
		kvr_actor_count(a, KVR_STAT_LK_LEASES_REFUSED, 1);
		send_lease_rep(a, l, si, wire, -EINVAL, 0, 0, 0, 0, 0);
		return;
	}
	if (l->l2 && lease_extend(l, si))
		return; /* lease_l2_done goes on */
	lease_finish(a, l, si);
}

static int on_sched_msg(struct kvr_actor *a, struct lookup *l, unsigned si, const struct kvr_msg *m)
{
	struct lk_sched *sc = &l->sched[si];
	struct kvr_msg_lease b;
	uint16_t engine = kvr_ctl_sched(a->ctl, si)->engine;
	switch (m->hdr.type) {
	case KVR_MSG_LEASE:
		if (kvr_msg_decode_lease(m, KVR_MSG_LEASE, &b))
			return -EBADMSG;
		lease_cancel(l, si); /* its client gave up on the previous one */
		sc->hdr = b;
		sc->hdr_wire = m->hdr.req_id;
		return 0;
	case KVR_MSG_LOOKUP: {
		if (m->hdr.seq == 0)
			lease_cancel(l, si);
		int rc = kvr_list_feed(&sc->keys, m);
		if (rc < 0)
			return -EBADMSG;
		if (rc == 1)
			do_lease(a, l, si);
		return 0;
	}
	case KVR_MSG_LEASE_RELEASE: {
		if (kvr_msg_decode_lease(m, KVR_MSG_LEASE_RELEASE, &b))
			return -EBADMSG;
		struct lease *ls = leases_find(l->leases, engine, b.lease_id);
		if (ls) {
			leases_end(l->leases, ls, LEASE_RELEASED);
			kvr_actor_count(a, KVR_STAT_LK_LEASES_RELEASED, 1);
			lease_gauge(a, l);
		}
		return 0;
	}
	default:
		return -EBADMSG;
	}
}

/* A worker's LEASE_TAKE / LEASE_DONE (its lookup.req ring). */
static int on_worker_lease(struct kvr_actor *a, struct lookup *l, unsigned wi, const struct kvr_msg *m)
{
	struct kvr_msg_lease b;
	if (kvr_msg_decode_lease(m, m->hdr.type, &b))
		return -EBADMSG;
	uint16_t engine = kvr_ctl_worker(a->ctl, wi)->engine;
	struct lease *ls = leases_find(l->leases, engine, b.lease_id);
	if (m->hdr.type == KVR_MSG_LEASE_DONE) {
		if (ls && ++ls->done >= ls->loaders) {
			leases_end(l->leases, ls, LEASE_LOADED);
			kvr_actor_count(a, KVR_STAT_LK_LEASES_LOADED, 1);
			lease_gauge(a, l);
		}
		return 0;
	}
	uint64_t wire = m->hdr.req_id;
	if (!wire_current(a, wire)) {
		kvr_actor_count(a, KVR_STAT_LK_STALE, 1);
		send_lookup_rep(a, l, wi, wire, -ESTALE, 0, b.lane, 0);
	} else if (!ls) {
		kvr_actor_count(a, KVR_STAT_LK_LEASES_MISSING, 1);
		send_lookup_rep(a, l, wi, wire, -ENOENT, 0, b.lane, 0);
	} else if (b.lane >= ls->lanes) {
		send_lookup_rep(a, l, wi, wire, -EINVAL, 0, b.lane, 0);
	} else {
		kvr_actor_count(a, KVR_STAT_LK_LEASES_TAKEN, 1);
		send_lookup_rep_refs(a, l, wi, wire, 0, ls->n, 0, b.lane, 0, ls->refs + (size_t)b.lane * ls->n);
	}
	return 0;
}

/* The fallback when the slot gets no fresh area (give_fresh_area): the gone worker's two rings
 * here (we are their one actor endpoint, its client is gone) laid out again in place, so what
 * it left in them — scribbled indices included — never reaches the next worker of the slot
 * (kvr_ctl_ring_reset). kvringd resets its other rings, once its loader and storer exited. */
static void reset_client_rings(struct kvr_actor *a, unsigned w)
{
	static const char *const fmts[] = {KVR_RING_LOOKUP_REQ, KVR_RING_LOOKUP_REP};
	for (unsigned k = 0; k < 2; k++) {
		char name[KVR_RING_NAME_MAX];
		snprintf(name, sizeof(name), fmts[k], w);
		int i = kvr_ctl_find_ring(a->ctl, name);
		int rc = i < 0 ? i : kvr_ctl_ring_reset(a->ctl, (unsigned)i, a->cfg.rings.spin_ns);
		if (rc)
			kvr_warn("worker %u gone: cannot reset ring %s: %s", w, name, strerror(-rc));
	}
}

/* The gone worker's slot gets a fresh client area (kvringd made it, g->area_fd is kvringd's
 * descriptor of it): mapped over the old one at the same address, so our views of its rings
 * stay valid and whatever the gone worker left in the old one — or still writes there, if it
 * lives on — reaches nobody. Said in area_ack, before the gone_ack kvringd waits for. If it
 * cannot be mapped, the old area's rings we serve are laid out again in place. */
static void give_fresh_area(struct kvr_actor *a, const struct kvr_msg_worker_gone *g)
{
	int rc = -ENOENT;
	if (g->area_fd >= 0) {
		char p[64];
		snprintf(p, sizeof(p), "/proc/%d/fd/%d", (int)a->ctl->supervisor_pid, g->area_fd);
		int fd = open(p, O_RDWR | O_CLOEXEC);
		rc = fd < 0 ? -errno : kvr_ctl_map_area(&a->ctl_seg, g->worker, fd, 1);
		if (fd >= 0)
			(void)close(fd);
		if (!rc) {
			atomic_store_explicit(&kvr_ctl_worker(a->ctl, g->worker)->area_ack, g->generation,
					      memory_order_release);
			return;
		}
		kvr_warn("worker %u gone: cannot map its slot's fresh area (%s): %s; its rings are reset in place",
			 g->worker, p, strerror(-rc));
	}
	reset_client_rings(a, g->worker);
}

/* WORKER_GONE from kvringd: release what the worker held, then acknowledge. */
static int on_worker_gone(struct kvr_actor *a, struct lookup *l, const struct kvr_msg *m)
{
	struct kvr_msg_worker_gone g;
	if (kvr_msg_decode_worker_gone(m, &g) || g.worker >= l->n_workers)
		return -EBADMSG;
	/* kvringd sends it again to a restarted lookup actor (the first may have died with
	 * its predecessor). It is ours to handle only while the slot waits for it
	 * (DETACHING, that attach's generation); a copy handled before is stale — the slot
	 * went free on our answer and may serve a new worker now, whose rings and slots
	 * must not be touched. */
	const struct kvr_worker_ent *we = kvr_ctl_worker(a->ctl, g.worker);
	if (atomic_load(&we->state) != KVR_WORKER_DETACHING || g.generation != we->generation) {
		kvr_actor_count(a, KVR_STAT_LK_STALE, 1);
		kvr_info("worker %u gone (generation %u): stale, the slot is %s at generation %u", g.worker,
			 g.generation, atomic_load(&we->state) == KVR_WORKER_DETACHING ? "detaching" : "not detaching",
			 we->generation);
		return 0;
	}
	struct kvr_slots_release rel = {0};
	l2t_cancel(l->l2, g.worker); /* no reply goes to a dead worker's ring (its reads finish) */
	(void)kvr_outbox_clear(&l->w[g.worker].lk_out);
	(void)kvr_outbox_clear(&l->w[g.worker].cm_out);
	kvr_index_release_worker(l->idx, g.worker, &rel);
	kvr_actor_count(a, KVR_STAT_LK_WORKERS_GONE, 1);
	kvr_actor_count(a, KVR_STAT_LK_ABORTED, rel.aborted);
	kvr_info("worker %u gone: %u pins dropped on %u slots, %u unfinished slots reclaimed (%u wait for I/O)",
		 g.worker, rel.pins, rel.unpinned_slots, rel.aborted, rel.draining);
	give_fresh_area(a, &g);
	/* kvringd frees the worker slot once it sees this (kvr_worker_ent.gone_ack) */
	atomic_store_explicit(&kvr_ctl_worker(a->ctl, g.worker)->gone_ack, g.generation, memory_order_release);
	alloc_retry_all(a, l); /* its slots went free */
	return 0;
}

/* A message of worker wi's lookup.req: a lookup (list) or its lease's take / done. */
static int on_lookup_req(struct kvr_actor *a, struct lookup *l, unsigned wi, const struct kvr_msg *m)
{
	struct lk_worker *w = &l->w[wi];
	if (m->hdr.type == KVR_MSG_LEASE_TAKE || m->hdr.type == KVR_MSG_LEASE_DONE)
		return on_worker_lease(a, l, wi, m);
	if (m->hdr.seq == 0)
		l2t_cancel(l->l2, wi); /* its keys buffer is about to be reused */
	int rc = kvr_list_feed(&w->lookup, m);
	if (rc < 0)
		return -EBADMSG;
	if (rc == 1)
		do_lookup(a, l, wi);
	return 0;
}

/* A message of worker wi's commit.req (its storer or gather actor): ALLOC, COMMIT, RESET. */
static int on_commit_req(struct kvr_actor *a, struct lookup *l, unsigned wi, const struct kvr_msg *m)
{
	struct lk_worker *w = &l->w[wi];
	int rc;
	switch (m->hdr.type) {
	case KVR_MSG_ALLOC:
		/* one ALLOC per worker is assembled at a time: one still waiting for room is
		 * answered with what it has before the next reuses its assembler (its
		 * storer moved on; feeding over it would size the refs for the wrong list) */
		if (w->alloc_waiting && m->hdr.seq == 0)
			alloc_reply(a, l, wi);
		if ((rc = kvr_list_feed(&w->alloc, m)) < 0)
			return -EBADMSG;
		if (rc == 1)
			do_alloc(a, l, wi);
		return 0;
	case KVR_MSG_COMMIT:
		if ((rc = kvr_list_feed(&w->commit, m)) < 0)
			return -EBADMSG;
		if (rc == 1) {
			do_commit(a, l, wi);
			alloc_retry_all(a, l); /* committed slots are evictable */
		}
		return 0;
	case KVR_MSG_RESET:
		if (kvr_msg_decode_reset(m))
			return -EBADMSG;
		if (w->alloc_waiting) /* answered now: nothing more is allocated for it after the reset */
			alloc_reply(a, l, wi);
		rc = kvr_index_abort_owner(l->idx, wi);
		kvr_actor_count(a, KVR_STAT_LK_ABORTED, rc > 0 ? (uint64_t)rc : 0);
		if (rc > 0)
			kvr_info("worker %u storer reset: %d unfinished slots reclaimed", wi, rc);
		send_commit_rep(a, l, wi, m->hdr.req_id, rc < 0 ? rc : 0, 0, 0);
		if (rc > 0)
			alloc_retry_all(a, l); /* its slots went free */
		return 0;
	default:
		return -EBADMSG;
	}
}

static int lookup_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct lookup *l = a->data;
	struct l2t_done done;
	int l2rc = l2t_on_msg(l->l2, ring, m, &done);
	if (l2rc == 2)
		l2_done_reply(a, l, &done);
	if (l2rc != 1) {
		if (m->hdr.type == KVR_MSG_L2_READ_DONE)
			kvr_index_reap(l->idx); /* an aborted promotion's read may have ended */
		if (m->hdr.type == KVR_MSG_L2_WRITE_DONE || m->hdr.type == KVR_MSG_L2_READ_DONE)
			alloc_retry_all(a, l); /* a slot became evictable or free */
		return l2rc == -EBADMSG ? -EBADMSG : 0;
	}
	if (ring == a->ctl_in)
		return on_worker_gone(a, l, m);
	for (unsigned wi = 0; wi < l->n_workers; wi++) {
		if (ring == l->w[wi].lk_req)
			return on_lookup_req(a, l, wi, m);
		if (ring == l->w[wi].cm_req)
			return on_commit_req(a, l, wi, m);
	}
	for (unsigned si = 0; si < l->n_sched; si++)
		if (ring == l->sched[si].req)
			return on_sched_msg(a, l, si, m);
	return -EBADMSG;
}

static void lookup_on_tick(struct kvr_actor *a, uint64_t now)
{
	struct lookup *l = a->data;
	unsigned expired = leases_expire(l->leases, now);
	if (expired) {
		kvr_actor_count(a, KVR_STAT_LK_LEASES_EXPIRED, expired);
		lease_gauge(a, l);
	}
	struct l2t_done done;
	while (l2t_tick(l->l2, &done) == 1)
		l2_done_reply(a, l, &done);
	kvr_index_reap(l->idx); /* aborted slots whose I/O ended are free again */
	alloc_retry_all(a, l); /* ALLOCs past their deadline are answered NOROOM */
	atomic_store_explicit(&a->stats->c[KVR_STAT_LK_DRAINING], kvr_index_draining(l->idx), memory_order_relaxed);
}

/* Every pass of the loop: move waiting replies to their readers' rings. */
/* Flush one outbox: dropped messages reported; *moved when something went out. */
static void flush(struct kvr_actor *a, struct kvr_outbox *ob, const char *who, unsigned i, uint64_t now,
		  bool *pending, bool *moved)
{
	if (!kvr_outbox_pending(ob))
		return;
	uint32_t before = ob->n;
	dropped(a, who, i, kvr_outbox_flush(ob, now, REPLY_TIMEOUT_NS(a)));
	*moved |= ob->n != before;
	*pending |= kvr_outbox_pending(ob);
}

static int lookup_on_pass(struct kvr_actor *a, uint64_t now)
{
	struct lookup *l = a->data;
	bool pending = false, moved = false;
	uint64_t queued = 0;
	for (unsigned i = 0; i < l->n_workers; i++) {
		flush(a, &l->w[i].lk_out, "worker", i, now, &pending, &moved);
		flush(a, &l->w[i].cm_out, "worker", i, now, &pending, &moved);
		queued += l->w[i].lk_out.queued + l->w[i].cm_out.queued;
	}
	for (unsigned i = 0; i < l->n_sched; i++) {
		flush(a, &l->sched[i].out, "scheduler", i, now, &pending, &moved);
		queued += l->sched[i].out.queued;
	}
	atomic_store_explicit(&a->stats->c[KVR_STAT_LK_REPLIES_QUEUED], queued, memory_order_relaxed);
	l2t_wake(l->l2); /* the L2 requests of this pass, one wake per disk actor */
	return moved ? KVR_PASS_MOVED : pending ? KVR_PASS_WAITING : KVR_PASS_IDLE;
}

static const struct kvr_stage lookup_stage = {
	.name = "lookup",
	.kind = KVR_ACTOR_LOOKUP,
	.tick_ns = 100000000, /* L2 housekeeping */
	.init = lookup_init,
	.on_msg = lookup_on_msg,
	.on_tick = lookup_on_tick,
	.on_pass = lookup_on_pass,
	.fini = lookup_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &lookup_stage);
}
