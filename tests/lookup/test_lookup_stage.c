/* The lookup actor's stage (actors/lookup/lookup.c) stepped one message, pass or tick at a time over an in-memory control segment (tests/runtime/step_stage.h). */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include <kvring/kvring.h>
#include <kvring/msg.h>

#include "../runtime/step_stage.h"

#include "kvr_keys.h"
#include "kvr_time.h"

/*
 * The stage is reached by compiling lookup.c into this test (its functions and its struct
 * kvr_stage are static; its main() is renamed so the test's Criterion main stands): the
 * test calls lookup_stage's init, on_msg, on_pass and on_tick itself, plays the workers'
 * clients, their storers and a scheduler on the rings, and reads the slot table.
 * Replies that find room go straight onto the reader's ring (kvr_outbox_send); the stage
 * stamps its outboxes and ALLOC and lease deadlines with the pass's clock (act.now_ns,
 * kvr_actor_now): it starts at the real CLOCK_MONOTONIC, and every later `now` is that plus
 * what the test says.
 */
int lookup_actor_main(int argc, char **argv);
#define main lookup_actor_main
#include "../../actors/lookup/lookup.c"
#undef main

#define MW 2          /* worker slots */
#define N_SLOTS 32
#define LANE_BYTES 4096
#define GEN 1         /* the lookup actor's generation */
#define SEC 1000000000ull

static struct step_env e;
static struct kvr_slot_table *st;
static uint64_t t0;
static uint64_t seq = 1;

static void setup(void)
{
	t0 = kvr_now_ns();
	step_spec_ctl(&e, 0, "lookup");
	for (unsigned w = 0; w < MW; w++) {
		int storer = 1 + 2 * (int)w + 1;
		step_spec(&e, 256, KVR_EP_CLIENT(w), 0, KVR_RING_LOOKUP_REQ, w);
		step_spec(&e, 256, 0, KVR_EP_CLIENT(w), KVR_RING_LOOKUP_REP, w);
		step_spec(&e, 256, storer, 0, KVR_RING_COMMIT_REQ, w);
		step_spec(&e, 256, 0, storer, KVR_RING_COMMIT_REP, w);
	}
	step_spec(&e, 64, KVR_EP_CLIENT(MW), 0, "sched.req.0");
	step_spec(&e, 64, 0, KVR_EP_CLIENT(MW), "sched.rep.0");
	step_build(&e, "lookup", 1 + 2 * MW, MW, 0, KVR_ACTOR_LOOKUP, t0);
	atomic_store(&e.act.ent->generation, GEN);
	e.act.cfg.instance.max_schedulers = 1;
	st = step_slots(&e, N_SLOTS, LANE_BYTES, 1, 1);
	step_init(&e, &lookup_stage);
}

static void teardown(void)
{
	step_close(&e);
	st = NULL;
}

TestSuite(lookup_stage, .init = setup, .fini = teardown, .timeout = 30);

static struct lookup *l_of(void)
{
	return e.act.data;
}

static kvr_key key_of(unsigned p, unsigned i)
{
	uint64_t in[2] = {p, i};
	return kvr_key_hash(in, sizeof(in));
}

static struct kvr_ring *ring_w(const char *fmt, unsigned w)
{
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), fmt, w);
	return step_ring(&e, name);
}

/* Send list `type` of items on r (every message of it) under a fresh wire id; returns it. */
static uint64_t send_list(struct kvr_ring *r, unsigned type, uint8_t lane, const void *items, uint32_t total)
{
	uint64_t wire = kvr_wire_make(GEN, seq++);
	cr_assert_eq(kvr_list_send(r, type, wire, lane, items, total, 0), 0);
	return wire;
}

/* Take list `type` (total items) off r into items; asserts its wire id. */
static void take_list(struct kvr_ring *r, unsigned type, uint64_t wire, void *items, size_t item_size,
		      uint32_t total)
{
	cr_assert_eq(item_size, kvr_msg_list_item_size(type), "items of a %s", kvr_msg_type_name(type));
	uint32_t got = 0;
	while (got < total) {
		struct kvr_msg m = step_take(r, type);
		struct kvr_msg_list_hdr h;
		cr_assert_eq(kvr_msg_decode_list(&m, type, &h), 0);
		cr_assert_eq(m.hdr.req_id, wire);
		cr_assert_eq(h.total, total);
		kvr_msg_list_items(&m, items); /* it places message seq's items itself */
		got += h.count;
	}
	cr_assert_eq(got, total);
}

/* The storer of worker w allocates keys[0..n) on lane 0: the ALLOC stepped in, its
 * ALLOC_REP taken off commit.rep.w into ret; every key must get a slot. */
static void alloc(unsigned w, const kvr_key *keys, uint32_t n, struct kvr_msg_slot *ret)
{
	struct kvr_ring *req = ring_w(KVR_RING_COMMIT_REQ, w);
	uint64_t wire = send_list(req, KVR_MSG_ALLOC, 0, keys, n);
	cr_assert_geq(step_msgs(&e, req), 1);
	take_list(ring_w(KVR_RING_COMMIT_REP, w), KVR_MSG_ALLOC_REP, wire, ret, sizeof(*ret), n);
	for (uint32_t i = 0; i < n; i++) {
		cr_assert_lt(ret[i].slot, N_SLOTS, "key %u: slot %x", i, ret[i].slot);
		const struct kvr_slot *s = kvr_slot_at(st, ret[i].slot);
		cr_assert_eq(atomic_load(&s->state), KVR_SLOT_WRITING);
		cr_assert_eq(s->owner, w);
		cr_assert_eq(s->epoch, ret[i].epoch);
		cr_assert(kvr_key_eq(s->key, keys[i]), "slot %u holds key %u", ret[i].slot, i);
	}
}

/* The storer of worker w commits slots[0..n): COMMIT stepped, its COMMIT_REP decoded. */
static struct kvr_msg_commit_rep commit(unsigned w, const struct kvr_msg_slot *slots, uint32_t n)
{
	struct kvr_ring *req = ring_w(KVR_RING_COMMIT_REQ, w);
	uint64_t wire = send_list(req, KVR_MSG_COMMIT, 0, slots, n);
	cr_assert_geq(step_msgs(&e, req), 1);
	struct kvr_msg m = step_take(ring_w(KVR_RING_COMMIT_REP, w), KVR_MSG_COMMIT_REP);
	cr_assert_eq(m.hdr.req_id, wire);
	struct kvr_msg_commit_rep r;
	cr_assert_eq(kvr_msg_decode_commit_rep(&m, &r), 0);
	return r;
}

/* Worker w's client looks keys[0..n) up: LOOKUP stepped, LOOKUP_REP (+ SLOTS) taken. */
static struct kvr_msg_lookup_rep lookup(unsigned w, const kvr_key *keys, uint32_t n, struct kvr_msg_slot *ret)
{
	struct kvr_ring *req = ring_w(KVR_RING_LOOKUP_REQ, w), *rep = ring_w(KVR_RING_LOOKUP_REP, w);
	uint64_t wire = send_list(req, KVR_MSG_LOOKUP, 0, keys, n);
	cr_assert_geq(step_msgs(&e, req), 1);
	struct kvr_msg m = step_take(rep, KVR_MSG_LOOKUP_REP);
	cr_assert_eq(m.hdr.req_id, wire);
	struct kvr_msg_lookup_rep r;
	cr_assert_eq(kvr_msg_decode_lookup_rep(&m, &r), 0);
	if (r.matched)
		take_list(rep, KVR_MSG_SLOTS, wire, ret, sizeof(*ret), r.matched);
	cr_assert_eq(kvr_ring_count(rep), 0, "nothing more");
	return r;
}

/* The scheduler asks for lease `id` over keys[0..n): LEASE + LOOKUP stepped, LEASE_REP taken. */
static struct kvr_msg_lookup_rep lease(uint64_t id, uint32_t ttl_ms, const kvr_key *keys, uint32_t n)
{
	struct kvr_ring *req = step_ring(&e, "sched.req.0"), *rep = step_ring(&e, "sched.rep.0");
	uint64_t wire = kvr_wire_make(GEN, seq++);
	struct kvr_msg_lease b = {.lease_id = id, .ttl_ms = ttl_ms, .loaders = 1, .n_keys = n};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE, 0, wire, 0, &b, sizeof(b));
	cr_assert_eq(kvr_ring_try_enqueue(req, &m), 0);
	cr_assert_eq(kvr_list_send(req, KVR_MSG_LOOKUP, wire, 0, keys, n, 0), 0);
	cr_assert_geq(step_msgs(&e, req), 2);
	m = step_take(rep, KVR_MSG_LEASE_REP);
	cr_assert_eq(m.hdr.req_id, wire);
	struct kvr_msg_lookup_rep r;
	cr_assert_eq(kvr_msg_decode_lease_rep(&m, &r), 0);
	return r;
}

static void keys_of(unsigned p, unsigned n, kvr_key *ret)
{
	for (unsigned i = 0; i < n; i++)
		ret[i] = key_of(p, i);
}

/* Stored blocks are found: ALLOC -> WRITING, COMMIT -> COMMITTED (quorum 1: visible), then
 * another worker's LOOKUP matches exactly that prefix with exactly those slots. */
Test(lookup_stage, alloc_commit_lookup)
{
	kvr_key keys[6];
	keys_of(1, 6, keys);
	struct kvr_msg_slot got[6], found[6];
	alloc(0, keys, 4, got);
	for (unsigned i = 0; i < 4; i++)
		for (unsigned j = 0; j < i; j++)
			cr_assert_neq(got[i].slot, got[j].slot, "one slot per block");
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_ALLOCATED), 4);

	/* a block still WRITING is not visible */
	struct kvr_msg_lookup_rep r = lookup(1, keys, 6, found);
	cr_assert_eq(r.status, 0);
	cr_assert_eq(r.matched, 0);

	struct kvr_msg_commit_rep c = commit(0, got, 4);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.n_committed, 4);
	cr_assert_eq(c.n_visible, 4);
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(atomic_load(&kvr_slot_at(st, got[i].slot)->state), KVR_SLOT_COMMITTED);

	r = lookup(1, keys, 6, found);
	cr_assert_eq(r.status, 0);
	cr_assert_eq(r.matched, 4);
	cr_assert_eq(r.lane, 0);
	for (unsigned i = 0; i < 4; i++) {
		cr_assert_eq(found[i].slot, got[i].slot, "block %u", i);
		cr_assert_eq(found[i].epoch, got[i].epoch, "block %u", i);
	}
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LOOKUPS), 2);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_KEYS), 12);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_MATCHED), 4);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_MISSED), 6 + 2);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_COMMITTED), 4);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_VISIBLE), 4);

	/* the same keys again: PRESENT, nothing new allocated */
	struct kvr_ring *req = ring_w(KVR_RING_COMMIT_REQ, 1);
	uint64_t wire = send_list(req, KVR_MSG_ALLOC, 0, keys, 2);
	cr_assert_eq(step_msgs(&e, req), 1);
	struct kvr_msg_slot again[2];
	take_list(ring_w(KVR_RING_COMMIT_REP, 1), KVR_MSG_ALLOC_REP, wire, again, sizeof(again[0]), 2);
	cr_assert_eq(again[0].slot, KVR_INDEX_PRESENT);
	cr_assert_eq(again[1].slot, KVR_INDEX_PRESENT);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_ALLOCATED), 4);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_PRESENT), 2);
}

/* Another worker cannot commit a worker's WRITING slots; a stale wire id is answered -ESTALE. */
Test(lookup_stage, commit_owner_and_stale)
{
	kvr_key keys[2];
	keys_of(2, 2, keys);
	struct kvr_msg_slot got[2];
	alloc(0, keys, 2, got);
	struct kvr_msg_commit_rep c = commit(1, got, 2);
	cr_assert_eq(c.n_committed, 0, "not worker 1's slots");
	cr_assert_eq(atomic_load(&kvr_slot_at(st, got[0].slot)->state), KVR_SLOT_WRITING);

	struct kvr_ring *req = ring_w(KVR_RING_LOOKUP_REQ, 0), *rep = ring_w(KVR_RING_LOOKUP_REP, 0);
	uint64_t wire = kvr_wire_make(GEN + 1, seq++); /* meant for another incarnation */
	cr_assert_eq(kvr_list_send(req, KVR_MSG_LOOKUP, wire, 0, keys, 2, 0), 0);
	cr_assert_eq(step_msgs(&e, req), 1);
	struct kvr_msg m = step_take(rep, KVR_MSG_LOOKUP_REP);
	struct kvr_msg_lookup_rep r;
	cr_assert_eq(kvr_msg_decode_lookup_rep(&m, &r), 0);
	cr_assert_eq(r.status, -ESTALE);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_STALE), 1);
}

/* A lease over committed blocks then a WRITING one: matched 2, pending 1, IN_FLIGHT; over
 * committed blocks then an unknown one: NEVER_STORED. A worker takes the lease's slots. */
Test(lookup_stage, lease_pending_and_miss_reason)
{
	kvr_key keys[4];
	keys_of(3, 4, keys);
	struct kvr_msg_slot got[3], taken[2];
	alloc(0, keys, 3, got);
	struct kvr_msg_commit_rep c = commit(0, got, 2); /* block 2 stays WRITING */
	cr_assert_eq(c.n_committed, 2);

	struct kvr_msg_lookup_rep r = lease(7, 60000, keys, 4);
	cr_assert_eq(r.status, 0);
	cr_assert_eq(r.matched, 2);
	cr_assert_eq(r.pending, 1, "block 2 is being written");
	cr_assert_eq(r.miss, KVR_MISS_IN_FLIGHT);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LEASES_GRANTED), 1);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LEASES), 1);

	kvr_key other[3] = {keys[0], keys[1], key_of(99, 0)};
	r = lease(8, 60000, other, 3);
	cr_assert_eq(r.matched, 2);
	cr_assert_eq(r.pending, 0);
	cr_assert_eq(r.miss, KVR_MISS_NEVER_STORED);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LEASES), 2);

	/* worker 1 takes lease 7's lane-0 slots: exactly the committed ones */
	struct kvr_ring *req = ring_w(KVR_RING_LOOKUP_REQ, 1), *rep = ring_w(KVR_RING_LOOKUP_REP, 1);
	uint64_t wire = kvr_wire_make(GEN, seq++);
	struct kvr_msg_lease b = {.lease_id = 7};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_LEASE_TAKE, 0, wire, 0, &b, sizeof(b));
	cr_assert_eq(kvr_ring_try_enqueue(req, &m), 0);
	cr_assert_eq(step_msg(&e, req), 0);
	m = step_take(rep, KVR_MSG_LOOKUP_REP);
	cr_assert_eq(kvr_msg_decode_lookup_rep(&m, &r), 0);
	cr_assert_eq(r.status, 0);
	cr_assert_eq(r.matched, 2);
	take_list(rep, KVR_MSG_SLOTS, wire, taken, sizeof(taken[0]), 2);
	for (unsigned i = 0; i < 2; i++) {
		cr_assert_eq(taken[i].slot, got[i].slot);
		cr_assert_eq(taken[i].epoch, got[i].epoch);
	}
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LEASES_TAKEN), 1);

	/* its load done (one loader): lease 7 ends */
	b = (struct kvr_msg_lease){.lease_id = 7};
	kvr_msg_build(&m, KVR_MSG_LEASE_DONE, 0, kvr_wire_make(GEN, seq++), 0, &b, sizeof(b));
	cr_assert_eq(kvr_ring_try_enqueue(req, &m), 0);
	cr_assert_eq(step_msg(&e, req), 0);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LEASES_LOADED), 1);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LEASES), 1);

	/* lease 8 is not released: a tick past its ttl expires it */
	step_tick(&e, t0 + 3600 * SEC);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LEASES_EXPIRED), 1);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_LEASES), 0);
}

/* WORKER_GONE: the gone worker's WRITING slots are aborted (free again), another worker's stay;
 * a copy for an earlier attach is stale and touches nothing. */
Test(lookup_stage, worker_gone_aborts_writing)
{
	kvr_key k0[1], k1[3];
	keys_of(4, 1, k0);
	keys_of(5, 3, k1);
	struct kvr_msg_slot s0[1], s1[3];
	alloc(0, k0, 1, s0);
	alloc(1, k1, 3, s1);

	struct kvr_worker_ent *we = kvr_ctl_worker(e.act.ctl, 1);
	atomic_store(&we->state, KVR_WORKER_DETACHING);
	we->generation = 5;
	struct kvr_msg_worker_gone g = {.worker = 1, .generation = 4, .area_fd = -1};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_WORKER_GONE, 0, 0, 0, &g, sizeof(g));
	cr_assert_eq(kvr_ring_try_enqueue(e.act.ctl_in, &m), 0);
	cr_assert_eq(step_msg(&e, e.act.ctl_in), 0);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_STALE), 1, "generation 4 is not the detaching attach");
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_WORKERS_GONE), 0);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(atomic_load(&kvr_slot_at(st, s1[i].slot)->state), KVR_SLOT_WRITING);

	g.generation = 5;
	kvr_msg_build(&m, KVR_MSG_WORKER_GONE, 0, 0, 0, &g, sizeof(g));
	cr_assert_eq(kvr_ring_try_enqueue(e.act.ctl_in, &m), 0);
	cr_assert_eq(step_msg(&e, e.act.ctl_in), 0);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_WORKERS_GONE), 1);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_ABORTED), 3);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(atomic_load(&kvr_slot_at(st, s1[i].slot)->state), KVR_SLOT_FREE, "slot %u", s1[i].slot);
	cr_assert_eq(atomic_load(&kvr_slot_at(st, s0[0].slot)->state), KVR_SLOT_WRITING, "worker 0's slot stays");
	cr_assert_eq(atomic_load(&we->gone_ack), 5);

	/* worker 0 can still commit its own */
	struct kvr_msg_commit_rep c = commit(0, s0, 1);
	cr_assert_eq(c.n_committed, 1);
	cr_assert_eq(atomic_load(&kvr_slot_at(st, s0[0].slot)->state), KVR_SLOT_COMMITTED);
}

/* RESET from worker 0's storer: its WRITING slots aborted, COMMIT_REP status 0. */
Test(lookup_stage, reset_aborts_own)
{
	kvr_key k[2];
	keys_of(6, 2, k);
	struct kvr_msg_slot s[2];
	alloc(0, k, 2, s);
	struct kvr_ring *req = ring_w(KVR_RING_COMMIT_REQ, 0);
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_RESET, 0, 77, 0, NULL, 0);
	cr_assert_eq(kvr_ring_try_enqueue(req, &m), 0);
	cr_assert_eq(step_msg(&e, req), 0);
	m = step_take(ring_w(KVR_RING_COMMIT_REP, 0), KVR_MSG_COMMIT_REP);
	cr_assert_eq(m.hdr.req_id, 77);
	struct kvr_msg_commit_rep c;
	cr_assert_eq(kvr_msg_decode_commit_rep(&m, &c), 0);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_ABORTED), 2);
	for (unsigned i = 0; i < 2; i++)
		cr_assert_eq(atomic_load(&kvr_slot_at(st, s[i].slot)->state), KVR_SLOT_FREE);
}

/* A reply to a full ring waits in the outbox: the pass says WAITING, moves it once the reader
 * took its fillers; one that waits past timeouts.reply_ms is dropped and counted. */
Test(lookup_stage, reply_backpressure)
{
	kvr_key k[1];
	keys_of(7, 1, k);
	struct kvr_ring *req = ring_w(KVR_RING_LOOKUP_REQ, 0), *rep = ring_w(KVR_RING_LOOKUP_REP, 0);
	unsigned n = step_fill_ring(rep, 0, KVR_MSG_PONG);
	uint64_t wire = send_list(req, KVR_MSG_LOOKUP, 0, k, 1);
	cr_assert_eq(step_msgs(&e, req), 1);
	/* the stage stamped the queued reply with kvr_now_ns(): the pass's clock is read after
	 * the message, as the loop reads it after serving its inputs */
	cr_assert_eq(step_pass(&e, kvr_now_ns()), KVR_PASS_WAITING);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_REPLIES_QUEUED), 1);
	step_drain_fillers(rep, n, KVR_MSG_PONG);
	cr_assert_eq(step_pass(&e, kvr_now_ns()), KVR_PASS_MOVED);
	struct kvr_msg m = step_take(rep, KVR_MSG_LOOKUP_REP);
	cr_assert_eq(m.hdr.req_id, wire);
	cr_assert_eq(step_pass(&e, kvr_now_ns()), KVR_PASS_IDLE);

	n = step_fill_ring(rep, 0, KVR_MSG_PONG);
	send_list(req, KVR_MSG_LOOKUP, 0, k, 1);
	cr_assert_eq(step_msgs(&e, req), 1);
	uint64_t late = kvr_now_ns() + kvr_ms_to_ns(e.act.cfg.timeouts.reply_ms) + SEC;
	cr_assert_eq(step_pass(&e, late), KVR_PASS_MOVED, "the outbox emptied (by dropping)");
	cr_assert_eq(step_pass(&e, late), KVR_PASS_IDLE, "nothing waits");
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_REPLIES_DROPPED), 1);
	step_drain_fillers(rep, n, KVR_MSG_PONG);
	cr_assert_eq(kvr_ring_count(rep), 0);
}

/* Worker 1 takes every slot WRITING (s1), then worker 0 sends an ALLOC of n0 keys of its
 * own: it is not answered, it waits for room. Returns its wire id. */
static uint64_t alloc_behind_full_l1(struct kvr_msg_slot *s1, uint32_t n0)
{
	kvr_key k1[N_SLOTS], k0[N_SLOTS];
	keys_of(1, N_SLOTS, k1);
	keys_of(0, n0, k0);
	alloc(1, k1, N_SLOTS, s1);
	struct kvr_ring *req0 = ring_w(KVR_RING_COMMIT_REQ, 0);
	uint64_t wire = send_list(req0, KVR_MSG_ALLOC, 0, k0, n0);
	cr_assert_geq(step_msgs(&e, req0), 1);
	cr_assert_eq(kvr_ring_count(ring_w(KVR_RING_COMMIT_REP, 0)), 0, "answered although worker 1's stores "
		     "will commit");
	cr_assert(l_of()->w[0].alloc_waiting);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_NOROOM), 0);
	return wire;
}

/* L1 full of worker 1's WRITING slots: worker 0's ALLOC is not answered NOROOM at once but
 * waits, and gets its slots (evicting committed lanes) the moment worker 1 commits — a full
 * L1 is backpressure, not a failed store. */
Test(lookup_stage, an_alloc_waits_for_other_stores_to_commit)
{
	struct kvr_msg_slot s1[N_SLOTS], s0[4];
	uint64_t wire = alloc_behind_full_l1(s1, 4);
	struct kvr_msg_commit_rep r = commit(1, s1, N_SLOTS);
	cr_assert_eq(r.n_committed, N_SLOTS);
	take_list(ring_w(KVR_RING_COMMIT_REP, 0), KVR_MSG_ALLOC_REP, wire, s0, sizeof(*s0), 4);
	for (unsigned i = 0; i < 4; i++) {
		cr_assert_lt(s0[i].slot, N_SLOTS, "key %u: %x", i, s0[i].slot);
		cr_assert_eq(kvr_slot_state(st, s0[i].slot), KVR_SLOT_WRITING);
		cr_assert_eq(kvr_slot_at(st, s0[i].slot)->owner, 0);
	}
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_EVICTED), 4, "four of worker 1's committed lanes made room");
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_NOROOM), 0);
	r = commit(0, s0, 4);
	cr_assert_eq(r.n_committed, 4);
}

/* The same wait ends at timeouts.alloc_wait_ms when nobody commits: answered NOROOM by key. */
Test(lookup_stage, an_alloc_waiting_for_room_is_answered_noroom_at_its_deadline)
{
	struct kvr_msg_slot s1[N_SLOTS], s0[2];
	uint64_t wire = alloc_behind_full_l1(s1, 2);
	struct kvr_ring *rep0 = ring_w(KVR_RING_COMMIT_REP, 0);
	step_tick(&e, t0 + kvr_ms_to_ns(e.act.cfg.timeouts.alloc_wait_ms) / 2);
	cr_assert_eq(kvr_ring_count(rep0), 0, "still within alloc_wait_ms");
	step_tick(&e, t0 + kvr_ms_to_ns(e.act.cfg.timeouts.alloc_wait_ms) + 1);
	take_list(rep0, KVR_MSG_ALLOC_REP, wire, s0, sizeof(*s0), 2);
	cr_assert_eq(s0[0].slot, KVR_SLOT_NOROOM);
	cr_assert_eq(s0[1].slot, KVR_SLOT_NOROOM);
	cr_assert_eq(step_stat(&e, KVR_STAT_LK_NOROOM), 2);
	for (unsigned i = 0; i < N_SLOTS; i++)
		cr_assert_eq(kvr_slot_state(st, s1[i].slot), KVR_SLOT_WRITING, "worker 1's slots untouched");
}
