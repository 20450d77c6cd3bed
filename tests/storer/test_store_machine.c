/* The storer's store pipe (actors/storer/store_pipe.c) stepped one message, pass, tick or timer at a time over an in-memory control segment, with an injected clock. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "../runtime/step_test.h"

#include "kvr_actor.h"
#include "kvr_ctl.h"
#include "kvr_geometry.h"
#include "kvr_keys.h"
#include "kvr_list.h"
#include "kvr_ring_names.h"
#include "kvr_slots.h"
#include "kvr_time.h"
#include "store_path.h"
#include "watch.h"

/*
 * No processes: the test builds what a storer sees — a control segment with the lookup
 * actor's and the storer's entries and worker 0's store and commit rings, a slot table, an
 * arena, the worker's KV memory (a memfd holding a known pattern, opened by
 * stage_worker_open as kvring-storer opens it), a struct kvr_actor filled by hand — and
 * opens the real stage_worker / stage_store / stage_store_pipe over it. The test plays the
 * other two parties: the worker (it hands complete STOREs to stage_store_pipe_submit, as
 * storer.c does, and reads STORE_DONE + BLOCKS off store.rep.0) and the lookup actor (it
 * takes ALLOC / COMMIT / RESET off commit.req.0, allocates and commits slots it chooses in
 * the slot table, and answers on commit.rep.0 when and in the order it likes). The
 * runtime's part is step(): hand commit.rep.0 to stage_store_pipe_reply, run due timers
 * (kvr_watch_dispatch), then stage_store_pipe_pass — the order of kvr_actor_main's pass.
 * The clock is the test's `now`, given to pass, tick and the timers.
 *
 * One thing is not a step: stage_store_open sends a RESET and waits for its answer
 * (await_lookup), so setup answers that one RESET from a helper thread.
 *
 * Geometry: vLLM layer-major, 2 layers x (K, V), 16 tokens x 1 head x 64 dims x 2 bytes:
 * 4 pages of 2 KiB per block, an 8 KiB lane. Staging: ceiling 8 lanes, load_percent 50,
 * one lane a lease: a store pool of 4 leases, so the pipe's depth is 4.
 */

#define MW 1
#define STORER KVR_ACTOR_IX_STORER(0)
#define N_ACTORS (STORER + 1)
#define N_SLOTS 64
#define LAYERS 2
#define HEAD_DIM 64
#define BT 16
#define NUM_BLOCKS 64
#define CREQ_CAP 64
#define MAXN 16 /* blocks per store in these tests */
#define GEN 1   /* the storer's and the lookup actor's generation */
#define UNTOUCHED 0xa5
#define MS 1000000ull

static struct kvr_segment ctl_seg = {.fd = -1}, slots_seg = {.fd = -1};
static struct kvr_actor act;
static struct kvr_actor_stats stats;
static struct kvr_slot_table *st;
static struct kvr_geometry geom;
static uint64_t lane_bytes, kv_bytes;
static int kv_fd = -1;
static uint8_t *kv;
static struct kvr_ring *srep, *creq, *crep;
static struct stage_worker sw;
static struct stage_store ss;
static struct stage_store_pipe pipe_;
static bool worker_open, store_open, pipe_open;
static uint64_t now;      /* the injected clock */
static uint64_t lc_ns;    /* timeouts.lookup_call_ms: the pipe's deadline for every answer */

/* ---- the instance --------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void add_io(const char *name, bool input)
{
	int i = kvr_ctl_find_ring(act.ctl, name);
	cr_assert_geq(i, 0, "ring %s", name);
	struct kvr_actor_ring *r = input ? &act.inputs[act.n_inputs++] : &act.outputs[act.n_outputs++];
	*r = (struct kvr_actor_ring){.ring = kvr_ctl_ring(&act.rings, (unsigned)i), .index = i};
}

/* stage_store_open's RESET, answered by the lookup actor's stand-in. */
struct reset_answer {
	int rc;
	struct kvr_msg req;
};

static void *answer_open_reset(void *arg)
{
	struct reset_answer *ra = arg;
	ra->rc = kvr_ring_dequeue(creq, &ra->req, 10000 * (int64_t)MS);
	if (ra->rc)
		return NULL;
	struct kvr_msg_commit_rep r = {0};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_COMMIT_REP, 0, ra->req.hdr.req_id, 0, &r, sizeof(r));
	ra->rc = kvr_ring_enqueue(crep, &m, 10000 * (int64_t)MS);
	return NULL;
}

/* l2: an L2 tier configured (the lookup actor may then hold an ALLOC: can_hold). */
static void build(bool l2)
{
	struct kvr_ctl_ring_spec specs[4] = {
		{.name = "store.req.0", .capacity = 64, .producer = (int16_t)KVR_EP_CLIENT(0), .consumer = STORER},
		{.name = "store.rep.0", .capacity = 256, .producer = STORER, .consumer = (int16_t)KVR_EP_CLIENT(0)},
		{.name = "commit.req.0", .capacity = CREQ_CAP, .producer = STORER, .consumer = KVR_ACTOR_IX_LOOKUP},
		{.name = "commit.rep.0", .capacity = 256, .producer = KVR_ACTOR_IX_LOOKUP, .consumer = STORER},
	};
	size_t sz = kvr_ctl_memsize(N_ACTORS, MW, specs, 4, 64);
	char name[64];
	snprintf(name, sizeof(name), "kvr-test-storemach-%d", (int)getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_CTL, sz, 1, 0, &ctl_seg), 0);
	cr_assert_eq(kvr_ctl_init(&ctl_seg, N_ACTORS, MW, specs, 4, "{}"), 0);
	memset(&act, 0, sizeof(act));
	cr_assert_eq(kvr_ctl_attach(&ctl_seg, &act.ctl, &act.rings), 0);
	act.stats = &stats;
	act.index = STORER;
	act.ent = kvr_ctl_actor(act.ctl, STORER);
	act.ent->kind = KVR_ACTOR_STORER;
	atomic_store(&act.ent->generation, GEN);
	kvr_ctl_actor(act.ctl, KVR_ACTOR_IX_LOOKUP)->kind = KVR_ACTOR_LOOKUP;
	atomic_store(&kvr_ctl_actor(act.ctl, KVR_ACTOR_IX_LOOKUP)->generation, GEN);
	atomic_store(&act.ctl->n_actors, N_ACTORS);
	add_io("store.req.0", true);
	add_io("commit.rep.0", true);
	add_io("store.rep.0", false);
	add_io("commit.req.0", false);
	srep = kvr_actor_ring(&act, "store.rep.0");
	creq = kvr_actor_ring(&act, "commit.req.0");
	crep = kvr_actor_ring(&act, "commit.rep.0");

	kvr_config_defaults(&act.cfg);
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&geom, LAYERS, 1, HEAD_DIM, 2, BT, NUM_BLOCKS), 0);
	lane_bytes = kvr_geometry_lane_bytes(&geom);
	kv_bytes = kvr_geometry_kv_extent(&geom);
	memcpy(kvr_ctl_worker_geometry(act.ctl, 0), &geom, sizeof(geom));
	act.cfg.staging.ceiling_bytes = 8 * lane_bytes;
	act.cfg.staging.load_percent = 50;
	act.cfg.staging.buffer_bytes = 0; /* a lease is one block */
	if (l2) {
		act.cfg.l2.n_dirs = 1;
		snprintf(act.cfg.l2.dirs[0], sizeof(act.cfg.l2.dirs[0]), "/nonexistent/l2");
		act.cfg.l2.capacity_bytes = 1 << 30;
	}
	lc_ns = kvr_ms_to_ns(act.cfg.timeouts.lookup_call_ms);

	snprintf(name, sizeof(name), "kvr-test-storemach-slots-%d", (int)getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_SLOTS, kvr_slots_memsize(N_SLOTS), 1, 0, &slots_seg), 0);
	struct kvr_slots_config sc = {.n_slots = N_SLOTS, .lane_bytes = lane_bytes, .ns = {7, 7}, .block_tokens = BT,
				      .tp_size = 1, .quorum = 1};
	cr_assert_eq(kvr_slots_init(slots_seg.base, slots_seg.size, &sc, &st), 0);
	act.slots = st;
	snprintf(name, sizeof(name), "kvr-test-storemach-arena-%d", (int)getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_ARENA, kvr_slots_arena_memsize(N_SLOTS, lane_bytes), 1, 0,
					&act.arena_seg), 0);
	memset((uint8_t *)act.arena_seg.base + st->arena_data_off, UNTOUCHED, (size_t)N_SLOTS * st->slot_bytes);

	/* the worker's KV memory: every 8-byte word distinct, so a page copied from the wrong
	 * block, region or offset cannot compare equal */
	kv_fd = memfd_create("kvr-test-storemach-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(kv_fd, 0);
	cr_assert_eq(ftruncate(kv_fd, (off_t)kv_bytes), 0);
	kv = mmap(NULL, kv_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, kv_fd, 0);
	cr_assert_neq(kv, MAP_FAILED);
	for (uint64_t i = 0; i < kv_bytes / 8; i++)
		((uint64_t *)kv)[i] = splitmix(i ^ 0x5704e5ull);

	(void)unsetenv("KVRING_STORE_DEPTH");
	now = kvr_now_ns(); /* from the real clock: see the end of this file */
	act.now_ns = now;
	cr_assert_eq(stage_worker_open(&act, &sw, 0, kv_fd, kv_bytes, KVR_RING_STORE_REQ, KVR_RING_STORE_REP,
				       100 - act.cfg.staging.load_percent), 0);
	worker_open = true;
	cr_assert_eq(sw.pool_leases, 4, "a store pool of 4 leases");
	cr_assert_eq(sw.chunk_blocks, 1);

	pthread_t th;
	struct reset_answer ra = {0};
	cr_assert_eq(pthread_create(&th, NULL, answer_open_reset, &ra), 0);
	int rc = stage_store_open(&ss, &act, 0, sw.lane);
	cr_assert_eq(pthread_join(th, NULL), 0);
	cr_assert_eq(rc, 0);
	store_open = true;
	cr_assert_eq(ra.rc, 0);
	cr_assert_eq(ra.req.hdr.type, KVR_MSG_RESET, "stage_store_open resets its lane first");
	cr_assert_eq(kvr_ring_count(creq), 0);
	cr_assert_eq(kvr_ring_count(crep), 0, "its answer was taken");

	struct stage_worker *swp = &sw;
	cr_assert_eq(stage_store_pipe_open(&pipe_, &ss, &swp, 1), 0);
	pipe_open = true;
	cr_assert_eq(pipe_.depth, 4);
	cr_assert_eq(pipe_.can_hold, l2);
}

static void teardown(void)
{
	/* a test that failed half-way may leave stores in flight: close waits for the lookup
	 * actor at most lookup_call_ms */
	act.cfg.timeouts.lookup_call_ms = 100;
	if (pipe_open)
		stage_store_pipe_close(&pipe_);
	if (worker_open)
		stage_worker_close(&sw);
	if (store_open)
		stage_store_close(&ss);
	pipe_open = worker_open = store_open = false;
	kvr_watch_close(&act);
	if (kv && kv != MAP_FAILED)
		(void)munmap(kv, kv_bytes);
	kv = NULL;
	if (kv_fd >= 0)
		(void)close(kv_fd);
	kv_fd = -1;
	kvr_segment_close(&act.arena_seg);
	kvr_segment_close(&slots_seg);
	kvr_segment_close(&ctl_seg);
	memset(&stats, 0, sizeof(stats));
}

TestSuite(store_machine, .fini = teardown, .timeout = 30);

static uint64_t stat(unsigned s)
{
	return atomic_load(&stats.c[s]);
}

static uint32_t held(void)
{
	return atomic_load(&act.ent->held);
}

/* ---- the worker ----------------------------------------------------------------------- */

struct store {
	uint64_t wire;
	uint32_t n;
	struct kvr_msg_store_item items[MAXN];
};
static struct store S[12];

static kvr_key key_of(unsigned p, unsigned i)
{
	uint64_t in[2] = {p, i};
	return kvr_key_hash(in, sizeof(in));
}

/* Store p: n blocks, keys of prompt p, engine blocks first, first + 1, ... Returns what
 * stage_store_pipe_submit returned (the window is full). */
static bool submit(unsigned p, uint32_t n, uint32_t first)
{
	struct store *s = &S[p];
	cr_assert_leq(n, MAXN);
	s->wire = kvr_wire_make(GEN, 100 + p);
	s->n = n;
	for (uint32_t i = 0; i < n; i++) {
		kvr_key k = key_of(p, i);
		s->items[i] = (struct kvr_msg_store_item){.key = {k.lo, k.hi}, .block = first + i};
	}
	struct stage_store_req rq = {.wire = s->wire, .first_ns = now, .n = n, .items = s->items};
	return stage_store_pipe_submit(&pipe_, &rq);
}

struct done {
	uint64_t wire;
	struct kvr_msg_store_done d;
	uint32_t failed[MAXN];
};

/* The next STORE_DONE on store.rep.0 (and its failed block ids); false when there is none. */
static bool take_done(struct done *ret)
{
	struct kvr_msg m;
	if (kvr_ring_try_dequeue(srep, &m))
		return false;
	cr_assert_eq(m.hdr.type, KVR_MSG_STORE_DONE, "the worker got a %s", kvr_msg_type_name(m.hdr.type));
	cr_assert_eq(kvr_msg_decode_store_done(&m, &ret->d), 0);
	ret->wire = m.hdr.req_id;
	if (!ret->d.n_failed)
		return true;
	struct kvr_list_asm l;
	kvr_list_asm_init(&l, KVR_MSG_BLOCKS);
	int fed;
	do {
		cr_assert_eq(kvr_ring_try_dequeue(srep, &m), 0, "the failed ids follow at once");
		fed = kvr_list_feed(&l, &m);
	} while (fed == 0);
	cr_assert_eq(fed, 1);
	cr_assert_eq(l.req_id, ret->wire);
	cr_assert_eq(l.total, ret->d.n_failed);
	cr_assert_leq(l.total, MAXN);
	memcpy(ret->failed, l.items, l.total * sizeof(uint32_t));
	kvr_list_asm_free(&l);
	return true;
}

/* Store p's answer comes next: status, counts, and the failed ids are its blocks at fail_pos. */
static void expect_done(unsigned p, int status, uint32_t stored, uint32_t present, const uint32_t *fail_pos,
			uint32_t n_failed)
{
	struct done d;
	cr_assert(take_done(&d), "store %u answered", p);
	cr_assert_eq(d.wire, S[p].wire, "answer %llx, expected store %u's (%llx): producer order",
		     (unsigned long long)d.wire, p, (unsigned long long)S[p].wire);
	cr_assert_eq(d.d.status, status, "store %u: status %d, expected %d", p, d.d.status, status);
	cr_assert_eq(d.d.n_blocks, S[p].n);
	cr_assert_eq(d.d.n_stored, stored, "store %u: %u stored", p, d.d.n_stored);
	cr_assert_eq(d.d.n_present, present);
	cr_assert_eq(d.d.n_failed, n_failed, "store %u: %u failed", p, d.d.n_failed);
	for (uint32_t k = 0; k < n_failed; k++)
		cr_assert_eq(d.failed[k], S[p].items[fail_pos[k]].block, "store %u: failed id %u", p, k);
	if (!status)
		cr_assert_eq(d.d.bytes, (uint64_t)stored * lane_bytes, "what it copied");
}

static void expect_no_done(const char *why)
{
	struct done d;
	cr_assert(!take_done(&d), "no answer yet (%s)", why);
}

/* ---- the lookup actor ----------------------------------------------------------------- */

struct lk_req {
	unsigned type;
	uint64_t id;
	uint8_t lane;
	uint32_t n;
	kvr_key keys[MAXN];             /* ALLOC */
	struct kvr_msg_slot slots[MAXN]; /* COMMIT */
};

/* The next whole request on commit.req.0 (a list read to its last message); false when the
 * ring is empty. */
static bool next_req(struct lk_req *r)
{
	struct kvr_msg m;
	if (kvr_ring_try_dequeue(creq, &m))
		return false;
	memset(r, 0, sizeof(*r));
	r->type = m.hdr.type;
	r->id = m.hdr.req_id;
	if (m.hdr.type == KVR_MSG_RESET) {
		cr_assert_eq(kvr_msg_decode_reset(&m), 0);
		return true;
	}
	cr_assert(m.hdr.type == KVR_MSG_ALLOC || m.hdr.type == KVR_MSG_COMMIT, "the lookup actor got a %s",
		  kvr_msg_type_name(m.hdr.type));
	struct kvr_list_asm l;
	kvr_list_asm_init(&l, m.hdr.type);
	int fed;
	while ((fed = kvr_list_feed(&l, &m)) == 0)
		cr_assert_eq(kvr_ring_try_dequeue(creq, &m), 0, "a list cut short in the ring");
	cr_assert_eq(fed, 1);
	cr_assert_leq(l.total, MAXN);
	r->n = l.total;
	r->lane = l.lane;
	if (r->type == KVR_MSG_ALLOC)
		memcpy(r->keys, l.items, l.total * sizeof(kvr_key));
	else
		memcpy(r->slots, l.items, l.total * sizeof(struct kvr_msg_slot));
	kvr_list_asm_free(&l);
	return true;
}

static struct lk_req expect_req(unsigned type)
{
	struct lk_req r;
	cr_assert(next_req(&r), "a %s was sent", kvr_msg_type_name(type));
	cr_assert_eq(r.type, type, "sent a %s, expected a %s", kvr_msg_type_name(r.type), kvr_msg_type_name(type));
	return r;
}

static void expect_no_req(const char *why)
{
	cr_assert_eq(kvr_ring_count(creq), 0, "nothing sent to the lookup actor (%s)", why);
}

/* An ALLOC for store p: its keys in its order, on the worker's lane. */
static struct lk_req expect_alloc(unsigned p)
{
	struct lk_req r = expect_req(KVR_MSG_ALLOC);
	cr_assert_eq(r.n, S[p].n, "ALLOC of store %u", p);
	cr_assert_eq(r.lane, sw.lane);
	for (uint32_t k = 0; k < r.n; k++)
		cr_assert(r.keys[k].lo == S[p].items[k].key.lo && r.keys[k].hi == S[p].items[k].key.hi,
			  "ALLOC of store %u: key %u", p, k);
	return r;
}

static void send_list(unsigned type, uint64_t id, uint8_t lane, const void *items, uint32_t n)
{
	for (uint32_t seq = 0, done = 0; done < n; seq++) {
		struct kvr_msg m;
		unsigned k = kvr_msg_build_list(&m, type, id, seq, lane, 0, items, n);
		cr_assert_gt(k, 0);
		done += k;
		cr_assert_eq(kvr_ring_try_enqueue(crep, &m), 0);
	}
}

static void send_commit_rep(uint64_t id, uint32_t committed)
{
	struct kvr_msg_commit_rep r = {.status = 0, .n_committed = committed, .n_visible = committed};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_COMMIT_REP, 0, id, 0, &r, sizeof(r));
	cr_assert_eq(kvr_ring_try_enqueue(crep, &m), 0);
}

/* Answer ALLOC r as the lookup actor does: slot_for[k] is the slot the test chooses for key k
 * (allocated WRITING for worker 0 on the lane, its new epoch in the answer), or
 * KVR_SLOT_NOROOM / KVR_SLOT_PRESENT. ret (may be NULL) gets the answer. */
static void answer_alloc(const struct lk_req *r, const uint32_t *slot_for, struct kvr_msg_slot *ret)
{
	struct kvr_msg_slot out[MAXN];
	for (uint32_t k = 0; k < r->n; k++) {
		out[k] = (struct kvr_msg_slot){.slot = slot_for[k], .epoch = 0};
		if (slot_for[k] < N_SLOTS)
			cr_assert_eq(kvr_slot_alloc(st, slot_for[k], r->keys[k], r->lane, 0, &out[k].epoch), 0,
				     "slot %u was free", slot_for[k]);
	}
	send_list(KVR_MSG_ALLOC_REP, r->id, r->lane, out, r->n);
	if (ret)
		memcpy(ret, out, r->n * sizeof(*out));
}

/* COMMIT r: every (slot, epoch) that is WRITING under that epoch becomes COMMITTED. */
static void answer_commit(const struct lk_req *r)
{
	uint32_t c = 0;
	for (uint32_t k = 0; k < r->n; k++)
		if (kvr_slot_commit(st, r->slots[k].slot, r->slots[k].epoch) == 0)
			c++;
	send_commit_rep(r->id, c);
}

/* RESET: abort every WRITING slot of worker 0. Returns how many. */
static unsigned answer_reset(const struct lk_req *r)
{
	unsigned n = 0;
	for (uint32_t s = 0; s < N_SLOTS; s++)
		if (kvr_slot_state(st, s) == KVR_SLOT_WRITING && kvr_slot_at(st, s)->owner == 0) {
			cr_assert_eq(kvr_slot_abort(st, s, kvr_slot_epoch(st, s)), 0);
			n++;
		}
	send_commit_rep(r->id, 0);
	return n;
}

/* ---- the runtime ---------------------------------------------------------------------- */

/* One pass of the storer's loop at `now`: replies on commit.rep.0, due timers, on_pass. */
static int step(bool *ret_room)
{
	act.now_ns = now;
	struct kvr_msg m;
	while (kvr_ring_try_dequeue(crep, &m) == 0)
		cr_assert_eq(stage_store_pipe_reply(&pipe_, &m, now), 0, "a %s of commit.rep.0 rejected",
			     kvr_msg_type_name(m.hdr.type));
	(void)kvr_watch_dispatch(&act, now);
	bool room;
	int rc = stage_store_pipe_pass(&pipe_, now, &room);
	if (ret_room)
		*ret_room = room;
	return rc;
}

/* The pipe stamps what it sends after a copy with the real clock, not the pass's `now`
 * (the first defect at the end of this file): a message queued in the outbox then carries
 * a real-clock time, and kvr_outbox_flush's unsigned now - since_ns would read an injected
 * clock behind it as 2^64 ns later. A test that steps on with queued output after a copy
 * moves its clock up to the real one first. */
static void catch_up(void)
{
	uint64_t r = kvr_now_ns();
	if (now < r)
		now = r;
}

/* ---- what the slots hold -------------------------------------------------------------- */

/* Slot `slot` holds engine block `block`'s lane: every region's page, in region order,
 * byte for byte. */
static void assert_slot_holds(uint32_t slot, uint32_t block)
{
	const uint8_t *d = kvr_slot_data(st, act.arena_seg.base, slot);
	cr_assert_not_null(d);
	uint64_t at = 0;
	for (unsigned r = 0; r < geom.n_regions; r++) {
		struct kvr_region g = kvr_geometry_region(&geom, r);
		const uint8_t *src = kv + g.offset + (uint64_t)block * g.stride;
		for (uint32_t b = 0; b < g.page_bytes; b++)
			if (d[at + b] != src[b])
				cr_assert_fail("slot %u, region %u, byte %u: %#x, block %u has %#x", slot, r, b, d[at + b],
					       block, src[b]);
		at += g.page_bytes;
	}
	cr_assert_eq(at, lane_bytes);
}

static void assert_slot_untouched(uint32_t slot)
{
	const uint8_t *d = kvr_slot_data(st, act.arena_seg.base, slot);
	for (uint64_t b = 0; b < st->slot_bytes; b++)
		if (d[b] != UNTOUCHED)
			cr_assert_fail("slot %u byte %llu was written", slot, (unsigned long long)b);
}

static unsigned count_state(uint32_t state)
{
	unsigned n = 0;
	for (uint32_t s = 0; s < N_SLOTS; s++)
		n += kvr_slot_state(st, s) == state;
	return n;
}

/* The pipe is empty and quiet: nothing pending, nothing queued, nothing left to say. */
static void assert_quiet(void)
{
	cr_assert_eq(stage_store_pipe_pending(&pipe_), 0);
	cr_assert_eq(held(), 0);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 0);
	cr_assert(!kvr_outbox_pending(&pipe_.out));
	bool room;
	cr_assert_eq(step(&room), KVR_PASS_IDLE);
	cr_assert(room);
	expect_no_req("quiet");
	expect_no_done("quiet");
	cr_assert_eq(count_state(KVR_SLOT_WRITING), 0, "no slot left WRITING");
}

/* ---- 1. four stores in flight; commits and answers in producer order -------------------- */

/*
 * Depth 4: five stores of one worker; the first four are in the window (the gauge says 4,
 * the fifth waits: no ALLOC for it until the first is answered). At most one ALLOC is
 * outstanding (the lookup actor assembles one per worker), so ALLOCs cannot be answered
 * out of order; the test holds every COMMIT_REP instead, which puts all four stores past
 * their copy at once (four COMMITs out, in producer order), then answers the COMMITs out of
 * order (2, 3, 0, 1): the STORE_DONEs still come 0, 1, 2, 3. Each slot the test handed out
 * holds exactly its block's bytes.
 */
Test(store_machine, four_stores_in_flight_commit_and_answer_in_producer_order)
{
	build(false);
	enum { N = 5, PER = 2 };
	/* the slots the lookup actor hands out: scattered, not in key order */
	static const uint32_t slot_for[N][PER] = {{40, 3}, {17, 55}, {8, 9}, {63, 0}, {21, 30}};
	struct kvr_msg_slot given[N][PER];
	for (unsigned p = 0; p < N; p++)
		cr_assert_eq(submit(p, PER, 10 + 7 * p), p >= 3, "submit %u: window full from the 4th", p);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 4, "four in the window");
	cr_assert_eq(held(), 5, "all five held for kvringd's drain");
	cr_assert_eq(stage_store_pipe_pending(&pipe_), 5);
	expect_no_req("submit only queues");

	bool room;
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	cr_assert(!room);
	struct lk_req a = expect_alloc(0);
	expect_no_req("one ALLOC outstanding at a time");
	cr_assert_eq(step(&room), KVR_PASS_IDLE, "nothing moves without an answer");
	expect_no_req("still one ALLOC");

	struct lk_req commits[4];
	for (unsigned p = 0; p < 4; p++) {
		answer_alloc(&a, slot_for[p], given[p]);
		cr_assert_eq(step(&room), KVR_PASS_MOVED);
		/* the next store's ALLOC went out before this one's copy and COMMIT */
		if (p + 1 < 4)
			a = expect_alloc(p + 1);
		commits[p] = expect_req(KVR_MSG_COMMIT);
		cr_assert_eq(commits[p].n, PER);
		for (unsigned k = 0; k < PER; k++) {
			cr_assert_eq(commits[p].slots[k].slot, given[p][k].slot, "store %u commits its own slots", p);
			cr_assert_eq(commits[p].slots[k].epoch, given[p][k].epoch);
		}
		expect_no_req("the 5th store waits behind the window");
	}
	for (unsigned p = 1; p < 4; p++)
		cr_assert_neq(commits[p].id, commits[p - 1].id);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 4, "4 stores past their copy at once");
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT_MAX), 4);
	expect_no_done("no COMMIT answered");
	cr_assert_eq(count_state(KVR_SLOT_WRITING), 8);
	for (unsigned p = 0; p < 4; p++)
		for (unsigned k = 0; k < PER; k++)
			assert_slot_holds(slot_for[p][k], S[p].items[k].block);

	/* COMMITs answered out of order: 2 and 3 first — nothing can be answered before 0 */
	answer_commit(&commits[2]);
	answer_commit(&commits[3]);
	cr_assert_eq(step(&room), KVR_PASS_IDLE);
	expect_no_done("store 0 is not done");
	expect_no_req("the window is still full");
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 4);
	answer_commit(&commits[0]);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	cr_assert(!room, "stores 1-4 fill the window again");
	expect_done(0, 0, PER, 0, NULL, 0);
	expect_no_done("store 1 is not done: 2 and 3 wait behind it");
	a = expect_alloc(4); /* the 5th entered the window */
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 4);
	cr_assert_eq(held(), 4);
	answer_commit(&commits[1]);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	cr_assert(room);
	for (unsigned p = 1; p < 4; p++)
		expect_done(p, 0, PER, 0, NULL, 0);
	expect_no_done("store 4 is in flight");
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 1);

	answer_alloc(&a, slot_for[4], given[4]);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	struct lk_req c4 = expect_req(KVR_MSG_COMMIT);
	answer_commit(&c4);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	expect_done(4, 0, PER, 0, NULL, 0);

	for (unsigned p = 0; p < N; p++)
		for (unsigned k = 0; k < PER; k++) {
			cr_assert_eq(kvr_slot_state(st, slot_for[p][k]), KVR_SLOT_COMMITTED);
			assert_slot_holds(slot_for[p][k], S[p].items[k].block);
		}
	cr_assert_eq(count_state(KVR_SLOT_COMMITTED), N * PER);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), N);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), N * PER);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 0);
	cr_assert_eq(stat(KVR_STAT_XF_BYTES), N * PER * lane_bytes);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT_MAX), 4, "never more than the depth");
	assert_quiet();
}

/* ---- 2. an ALLOC answered NOROOM fails that store only ---------------------------------- */

/*
 * The lookup actor has no "ALLOC failed" status: a key it finds no room for comes back
 * KVR_SLOT_NOROOM (lookup.c alloc_try / alloc_reply; every key when kvr_index_alloc fails).
 * Store 1 gets NOROOM for every key: answered -EIO, nothing stored, both ids failed, no
 * COMMIT, no RESET; store 0 before it and store 2 after it complete; store 2 gets NOROOM
 * for one key of three and stores the other two.
 */
Test(store_machine, an_alloc_answered_noroom_fails_only_that_store)
{
	build(false);
	static const uint32_t s0[2] = {5, 6}, s1[2] = {KVR_SLOT_NOROOM, KVR_SLOT_NOROOM},
			      s2[3] = {12, KVR_SLOT_NOROOM, 13};
	cr_assert(!submit(0, 2, 1));
	cr_assert(!submit(1, 2, 3));
	cr_assert(!submit(2, 3, 5));
	bool room;
	(void)step(&room);
	struct lk_req a = expect_alloc(0);
	answer_alloc(&a, s0, NULL);
	(void)step(&room);
	a = expect_alloc(1);
	struct lk_req c0 = expect_req(KVR_MSG_COMMIT);
	answer_alloc(&a, s1, NULL);
	(void)step(&room);
	/* store 1 is done (nothing to copy or commit) but answered after store 0 */
	a = expect_alloc(2);
	expect_no_req("no COMMIT and no RESET for the NOROOM store");
	expect_no_done("store 0 is not committed yet");
	answer_commit(&c0);
	answer_alloc(&a, s2, NULL);
	(void)step(&room);
	expect_done(0, 0, 2, 0, NULL, 0);
	static const uint32_t all[2] = {0, 1}, second[1] = {1};
	expect_done(1, -EIO, 0, 0, all, 2);
	struct lk_req c2 = expect_req(KVR_MSG_COMMIT);
	cr_assert_eq(c2.n, 2, "only the two keys that got a slot");
	cr_assert_eq(c2.slots[0].slot, 12);
	cr_assert_eq(c2.slots[1].slot, 13);
	answer_commit(&c2);
	(void)step(&room);
	expect_done(2, -EIO, 2, 0, second, 1);

	assert_slot_holds(5, S[0].items[0].block);
	assert_slot_holds(6, S[0].items[1].block);
	assert_slot_holds(12, S[2].items[0].block);
	assert_slot_holds(13, S[2].items[2].block);
	cr_assert_eq(count_state(KVR_SLOT_COMMITTED), 4);
	cr_assert_eq(count_state(KVR_SLOT_FREE), N_SLOTS - 4);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 3);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 4);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 3);
	assert_quiet();
}

/* ---- 2b. the commit answer, not a later look at the slot table, says what was stored ---- */

/*
 * Store 0's two slots commit (the lookup actor answers 2 of 2) and, before the storer reads
 * that answer, the lookup actor evicts one of them and hands it to worker 1 (a full arena:
 * any ALLOC may take the coldest COMMITTED slot). The store was still stored whole: answered
 * 0, two blocks stored, none failed (it used to read the slot table again and answer -EIO
 * with "lookup reported 2 commits, the slot table shows 1"). Store 1's first slot is
 * reclaimed before its COMMIT (the lookup actor refuses it: 1 of 2): that block, and only
 * it, is answered failed.
 */
Test(store_machine, a_slot_evicted_after_its_commit_still_counts_as_stored)
{
	build(false);
	static const uint32_t s0[2] = {20, 21}, s1[2] = {30, 31};
	cr_assert(!submit(0, 2, 0));
	cr_assert(!submit(1, 2, 10));
	bool room;
	(void)step(&room);
	struct lk_req a = expect_alloc(0);
	answer_alloc(&a, s0, NULL);
	(void)step(&room);
	a = expect_alloc(1);
	struct lk_req c0 = expect_req(KVR_MSG_COMMIT);
	answer_commit(&c0);
	uint32_t ep = kvr_slot_epoch(st, 21);
	cr_assert_eq(kvr_slot_evict_begin(st, 21, ep), 0);
	cr_assert_eq(kvr_slot_evict(st, 21, ep), 0);
	uint32_t ep1;
	cr_assert_eq(kvr_slot_alloc(st, 21, key_of(99, 0), 0, 1, &ep1), 0, "slot 21 reused by worker 1");
	(void)step(&room);
	expect_done(0, 0, 2, 0, NULL, 0);

	answer_alloc(&a, s1, NULL);
	(void)step(&room);
	struct lk_req c1 = expect_req(KVR_MSG_COMMIT);
	cr_assert_eq(kvr_slot_abort(st, 30, c1.slots[0].epoch), 0, "slot 30 reclaimed before its COMMIT");
	answer_commit(&c1);
	(void)step(&room);
	static const uint32_t first[1] = {0};
	expect_done(1, -EIO, 1, 0, first, 1);
	assert_slot_holds(20, S[0].items[0].block);
	assert_slot_holds(31, S[1].items[1].block);
	cr_assert_eq(kvr_slot_state(st, 30), KVR_SLOT_FREE);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 3);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 1);
	cr_assert_eq(kvr_slot_abort(st, 21, ep1), 0); /* worker 1's slot: not this pipe's */
	assert_quiet();
}

/* ---- 3. an answer that never comes ------------------------------------------------------ */

/*
 * The ALLOC of store 0 is taken and not answered. The pipe's timer polls every 50 ms
 * (LOOKUP_POLL_NS) and is armed at the deadline once it is nearer: lookup_call_ms after
 * the ALLOC went out. 1 ns before it nothing happens; at it the store fails -ETIMEDOUT
 * (every block listed), a RESET goes out, and store 1's ALLOC follows it (no L2: the
 * lookup actor never holds an ALLOC). The lookup actor was only slow: it takes commit.req
 * in order — the late ALLOC (two slots WRITING), the RESET (aborts them), store 1's ALLOC —
 * and answers all three. The late answer is dropped (the pipe never copies into its
 * slots, never answers store 0 twice) and, as it may name WRITING slots, asks for one more
 * RESET, sent behind store 1's COMMIT once no store holds uncommitted slots.
 */
Test(store_machine, an_alloc_never_answered_fails_at_lookup_call_ms_and_its_late_answer_is_dropped)
{
	build(false);
	cr_assert(!submit(0, 2, 1));
	cr_assert(!submit(1, 2, 3));
	uint64_t t0 = now;
	bool room;
	(void)step(&room);
	struct lk_req late = expect_alloc(0);
	cr_assert_eq(kvr_watch_deadline(&act), t0 + 50 * MS, "polls the lookup actor's generation every 50 ms");
	now = t0 + lc_ns - 1;
	(void)step(&room);
	expect_no_done("1 ns before lookup_call_ms");
	expect_no_req("1 ns before lookup_call_ms");
	cr_assert_eq(kvr_watch_deadline(&act), t0 + lc_ns, "armed at the ALLOC's deadline");
	cr_assert_eq(stage_store_pipe_pending(&pipe_), 2);

	now = t0 + lc_ns; /* the timer fires */
	(void)step(&room);
	static const uint32_t all[2] = {0, 1};
	expect_done(0, -ETIMEDOUT, 0, 0, all, 2);
	struct lk_req reset = expect_req(KVR_MSG_RESET);
	struct lk_req a1 = expect_alloc(1);
	expect_no_req("RESET, then store 1's ALLOC");

	/* the slow lookup actor, in ring order */
	static const uint32_t late_slots[2] = {20, 21}, s1[2] = {30, 31};
	answer_alloc(&late, late_slots, NULL);
	cr_assert_eq(answer_reset(&reset), 2, "the RESET aborts what the late ALLOC allocated");
	answer_alloc(&a1, s1, NULL);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	assert_slot_untouched(20);
	assert_slot_untouched(21);
	struct lk_req c1 = expect_req(KVR_MSG_COMMIT);
	cr_assert_eq(c1.slots[0].slot, 30);
	struct lk_req reset2 = expect_req(KVR_MSG_RESET);
	cr_assert_neq(reset2.id, reset.id);
	expect_no_req("one RESET for the late answer");
	expect_no_done("store 1 not committed");
	answer_commit(&c1);
	cr_assert_eq(answer_reset(&reset2), 0);
	(void)step(&room);
	expect_done(1, 0, 2, 0, NULL, 0);
	expect_no_done("store 0 answered once");

	/* a later answer to a request no store waits for (a duplicate COMMIT_REP): taken, not
	 * rejected, and dropped */
	answer_commit(&c1);
	(void)step(&room);
	expect_no_done("a duplicate COMMIT_REP answers nothing");
	assert_slot_holds(30, S[1].items[0].block);
	assert_slot_holds(31, S[1].items[1].block);
	cr_assert_eq(kvr_slot_state(st, 20), KVR_SLOT_FREE);
	cr_assert_eq(kvr_slot_state(st, 21), KVR_SLOT_FREE);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 2);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 2);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 2);
	cr_assert_eq(stat(KVR_STAT_MALFORMED), 0, "late answers are dropped, not counted malformed");
	assert_quiet();
}

/*
 * With an L2 tier the lookup actor may hold an ALLOC (waiting for room) up to
 * alloc_wait_ms; a second ALLOC must not reach it while it holds an abandoned one. Here the
 * slow tick (stage_store_pipe_tick, the storer's fallback) ends store 0 at lookup_call_ms;
 * store 1's ALLOC then waits — not on the next pass, not a second later — until the
 * abandoned ALLOC's answer arrives (the lookup actor answers a held ALLOC when the RESET
 * behind it comes in); that answer asks for a RESET, which goes out before store 1's ALLOC.
 */
Test(store_machine, with_l2_an_abandoned_alloc_bars_the_next_until_its_answer)
{
	build(true);
	cr_assert(!submit(0, 2, 1));
	cr_assert(!submit(1, 2, 3));
	uint64_t t0 = now;
	bool room;
	(void)step(&room);
	struct lk_req held_alloc = expect_alloc(0);
	now = t0 + lc_ns - 1;
	stage_store_pipe_tick(&pipe_, now);
	expect_no_req("not overdue yet");
	now = t0 + lc_ns;
	stage_store_pipe_tick(&pipe_, now);
	struct lk_req reset = expect_req(KVR_MSG_RESET);
	expect_no_req("the tick sends only the RESET");
	(void)step(&room);
	static const uint32_t all[2] = {0, 1};
	expect_done(0, -ETIMEDOUT, 0, 0, all, 2);
	expect_no_req("store 1's ALLOC waits: the lookup actor may hold store 0's");
	now += 1000 * MS;
	(void)step(&room);
	stage_store_pipe_tick(&pipe_, now);
	expect_no_req("still barred a second later");

	/* the lookup actor answers the held ALLOC (NOROOM: nothing freed) as the RESET arrives */
	static const uint32_t noroom[2] = {KVR_SLOT_NOROOM, KVR_SLOT_NOROOM};
	answer_alloc(&held_alloc, noroom, NULL);
	cr_assert_eq(answer_reset(&reset), 0);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	struct lk_req reset2 = expect_req(KVR_MSG_RESET);
	cr_assert_neq(reset2.id, reset.id);
	struct lk_req a1 = expect_alloc(1);
	expect_no_req("RESET, then store 1's ALLOC");
	cr_assert_eq(answer_reset(&reset2), 0);
	static const uint32_t s1[2] = {2, 4};
	answer_alloc(&a1, s1, NULL);
	(void)step(&room);
	struct lk_req c1 = expect_req(KVR_MSG_COMMIT);
	answer_commit(&c1);
	(void)step(&room);
	expect_done(1, 0, 2, 0, NULL, 0);
	assert_slot_holds(2, S[1].items[0].block);
	assert_slot_holds(4, S[1].items[1].block);
	assert_quiet();
}

/* The same barrier when the abandoned ALLOC is never answered: it lasts lookup_call_ms
 * from the abandonment at most (stale_cap), on the injected clock. */
Test(store_machine, with_l2_an_abandoned_alloc_never_answered_bars_the_next_for_lookup_call_ms)
{
	build(true);
	cr_assert(!submit(0, 1, 1));
	cr_assert(!submit(1, 1, 2));
	uint64_t t0 = now;
	bool room;
	(void)step(&room);
	(void)expect_alloc(0);
	now = t0 + lc_ns;
	stage_store_pipe_tick(&pipe_, now);
	struct lk_req reset = expect_req(KVR_MSG_RESET);
	(void)step(&room);
	static const uint32_t all[1] = {0};
	expect_done(0, -ETIMEDOUT, 0, 0, all, 1);
	uint64_t abandoned = now;
	now = abandoned + lc_ns - 1;
	(void)step(&room);
	expect_no_req("barred until lookup_call_ms after the abandonment");
	now = abandoned + lc_ns;
	(void)step(&room);
	struct lk_req a1 = expect_alloc(1);
	cr_assert_eq(answer_reset(&reset), 0);
	static const uint32_t s1[1] = {9};
	answer_alloc(&a1, s1, NULL);
	(void)step(&room);
	struct lk_req c1 = expect_req(KVR_MSG_COMMIT);
	answer_commit(&c1);
	(void)step(&room);
	expect_done(1, 0, 1, 0, NULL, 0);
	assert_slot_holds(9, S[1].items[0].block);
	assert_quiet();
}

/* ---- 4. a full commit.req ---------------------------------------------------------------- */

static unsigned fill_ring(struct kvr_ring *r, uint32_t room)
{
	return step_fill_ring(r, room, KVR_MSG_PING);
}

static void drain_fillers(struct kvr_ring *r, unsigned n)
{
	step_drain_fillers(r, n, KVR_MSG_PING);
}

/*
 * commit.req with room for one message: store 0's ALLOC (6 keys: 3 messages) puts its first
 * message in the ring and the other two in the pipe's outbox; the pass returns at once
 * (nothing waits for room), a pass with nothing new says WAITING. The test takes the
 * fillers: the next pass moves the rest, and the lookup actor reads one whole ALLOC in
 * order. Its COMMIT then finds the ring full again (none of the room is left) and waits in
 * the outbox the same way.
 */
Test(store_machine, a_full_commit_ring_queues_requests_in_the_outbox_instead_of_blocking)
{
	build(false);
	static const uint32_t slots[6] = {50, 51, 52, 53, 54, 55};
	unsigned fill = fill_ring(creq, 1);
	cr_assert(!submit(0, 6, 20));
	uint64_t t = kvr_now_ns();
	bool room;
	cr_assert_eq(step(&room), KVR_PASS_MOVED, "the ALLOC was sent, in part to the outbox");
	cr_assert_lt(kvr_now_ns() - t, 1000 * MS, "the pass did not wait for room");
	cr_assert_eq(kvr_ring_free(creq), 0);
	cr_assert_eq(pipe_.out.n, 2, "ALLOC messages 1 and 2 wait in the outbox");
	cr_assert_eq(step(&room), KVR_PASS_WAITING, "nothing moved, output waits for room");
	cr_assert_eq(pipe_.out.n, 2);
	drain_fillers(creq, fill);
	cr_assert_eq(kvr_ring_count(creq), 1, "the ALLOC's first message");
	cr_assert_eq(step(&room), KVR_PASS_MOVED, "the outbox moved to the ring");
	cr_assert(!kvr_outbox_pending(&pipe_.out));
	struct lk_req a = expect_alloc(0);
	expect_no_req("one ALLOC, whole");

	fill = fill_ring(creq, 0);
	answer_alloc(&a, slots, NULL);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	cr_assert_eq(pipe_.out.n, 2, "the COMMIT (6 slots: 2 messages) waits in the outbox");
	for (unsigned k = 0; k < 6; k++)
		assert_slot_holds(slots[k], S[0].items[k].block);
	catch_up();
	cr_assert_eq(step(&room), KVR_PASS_WAITING);
	drain_fillers(creq, fill);
	expect_no_req("the COMMIT is not in the ring until a pass");
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	struct lk_req c = expect_req(KVR_MSG_COMMIT);
	cr_assert_eq(c.n, 6);
	for (unsigned k = 0; k < 6; k++)
		cr_assert_eq(c.slots[k].slot, slots[k]);
	answer_commit(&c);
	(void)step(&room);
	expect_done(0, 0, 6, 0, NULL, 0);
	cr_assert_eq(pipe_.out.queued, 4, "4 messages waited in the outbox");
	cr_assert_eq(pipe_.out.dropped, 0);
	assert_quiet();
}

/*
 * A ring that never frees: the ALLOC waits in the outbox; at lookup_call_ms the store fails
 * -ETIMEDOUT (its RESET queues behind the ALLOC), and one pass later (the outbox's own
 * timeout: waited more than lookup_call_ms) both are dropped: nothing half sent reaches the
 * lookup actor once it reads again — only a fresh RESET (anything dropped may have left
 * allocated slots WRITING: the lane is reset once no job holds slots). The next store
 * goes through.
 */
Test(store_machine, a_commit_ring_that_never_frees_fails_the_store_and_drops_its_requests)
{
	build(false);
	unsigned fill = fill_ring(creq, 0);
	cr_assert(!submit(0, 2, 1));
	uint64_t t0 = now;
	bool room;
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	cr_assert_eq(pipe_.out.n, 1);
	now = t0 + lc_ns;
	(void)step(&room);
	static const uint32_t all[2] = {0, 1};
	expect_done(0, -ETIMEDOUT, 0, 0, all, 2);
	cr_assert_eq(pipe_.out.n, 2, "the ALLOC and the RESET behind it");
	now += 1;
	(void)step(&room);
	cr_assert_eq(pipe_.out.dropped, 2);
	cr_assert_eq(pipe_.out.n, 1, "a fresh RESET waits for room");
	drain_fillers(creq, fill);
	(void)step(&room);
	struct lk_req r;
	cr_assert(next_req(&r) && r.type == KVR_MSG_RESET, "the dropped ALLOC never reaches the lookup actor: a RESET does");
	(void)answer_reset(&r);
	(void)step(&room);
	expect_no_req("nothing else was sent");

	cr_assert(!submit(1, 2, 3));
	(void)step(&room);
	struct lk_req a = expect_alloc(1);
	static const uint32_t s1[2] = {1, 2};
	answer_alloc(&a, s1, NULL);
	(void)step(&room);
	struct lk_req c = expect_req(KVR_MSG_COMMIT);
	answer_commit(&c);
	(void)step(&room);
	expect_done(1, 0, 2, 0, NULL, 0);
	assert_slot_holds(1, S[1].items[0].block);
	assert_slot_holds(2, S[1].items[1].block);
	assert_quiet();
}

/* ---- defects the stepped test found (fixed in the store path; kept as regressions) ---------- */

/*
 * The clock (was a defect): stage_store_pipe_pass took `now` but, after a copy, read the
 * real clock for the COMMIT's deadline, the outbox's queue time and the timer, and
 * stage_store_pipe_reply read the real clock for the alloc_wait_ms barrier after a RESET
 * answer. Both now use the clock they are given (the actor's): the COMMIT of a store copied
 * lookup_call_ms / 2 into the injected clock is not overdue lookup_call_ms / 4 too early.
 */
Test(store_machine, a_commit_deadline_follows_the_injected_clock)
{
	build(false);
	cr_assert(!submit(0, 1, 1));
	uint64_t t0 = now;
	bool room;
	(void)step(&room);
	struct lk_req a = expect_alloc(0);
	now = t0 + lc_ns / 2;
	static const uint32_t s0[1] = {3};
	answer_alloc(&a, s0, NULL);
	(void)step(&room); /* copies, sends the COMMIT at now: its deadline is now + lookup_call_ms */
	struct lk_req c = expect_req(KVR_MSG_COMMIT);
	now = t0 + lc_ns + lc_ns / 4;
	stage_store_pipe_tick(&pipe_, now);
	(void)step(&room);
	expect_no_done("the COMMIT went out lookup_call_ms * 3/4 ago on the pipe's clock: not overdue");
	answer_commit(&c);
	(void)step(&room);
	expect_done(0, 0, 1, 0, NULL, 0);
	assert_quiet();
}

/*
 * A RESET lost with the outbox (was a defect): a store whose COMMIT waits in the outbox (the
 * lookup actor took nothing from commit.req: alive but not reading it) fails at
 * lookup_call_ms and queues its RESET behind the COMMIT; on the next pass the outbox's own
 * timeout (kvr_outbox_flush in stage_store_pipe_pass, store_pipe.c, same
 * lookup_call_ms) drops both. Its slots, allocated by an ALLOC the lookup actor did take,
 * stayed WRITING for good (and later ALLOCs of those keys were answered PRESENT: reported
 * present, never stored). Now anything the outbox drops makes the pipe reset the lane once
 * no job holds slots: a RESET reaches commit.req once the ring has room again.
 */
Test(store_machine, a_reset_dropped_with_the_outbox_is_sent_again)
{
	build(false);
	cr_assert(!submit(0, 2, 1));
	uint64_t t0 = now;
	bool room;
	(void)step(&room);
	struct lk_req a = expect_alloc(0);
	unsigned fill = fill_ring(creq, 0);
	static const uint32_t s0[2] = {1, 2};
	answer_alloc(&a, s0, NULL);
	(void)step(&room);
	cr_assert_eq(pipe_.out.n, 1, "the COMMIT waits for room");
	now = t0 + 2 * lc_ns + 2; /* past the COMMIT's deadline and the outbox's timeout */
	(void)step(&room);
	static const uint32_t all[2] = {0, 1};
	expect_done(0, -ETIMEDOUT, 0, 0, all, 2);
	/* the timer failed the store and queued its RESET behind the COMMIT; the pass's flush
	 * then dropped both */
	cr_assert_eq(pipe_.out.dropped, 2, "the outbox dropped the COMMIT and the RESET");
	drain_fillers(creq, fill);
	cr_assert_eq(kvr_slot_state(st, 1), KVR_SLOT_WRITING);
	for (unsigned i = 0; i < 3; i++) {
		now += 1000 * MS;
		stage_store_pipe_tick(&pipe_, now);
		(void)step(&room);
	}
	struct lk_req r;
	cr_assert(next_req(&r) && r.type == KVR_MSG_RESET,
		  "slots 1 and 2 are WRITING with no store holding them: the lane must be reset");
	(void)answer_reset(&r);
	(void)step(&room);
	assert_quiet();
}

/*
 * The injected clock starts at the real clock (kvr_now_ns at build) and only moves ahead of
 * it: the store path's blocking calls at open and close (the RESET at open, the STOP wait)
 * still read the real clock, and kvr_outbox_flush computes now - since_ns unsigned, so a
 * message queued on one clock and flushed on another that is behind it would look 2^64 ns
 * old. Each test keeps the deadlines it
 * asserts on the injected clock: ALLOC deadlines (set by start_alloc from the pass's `now`),
 * the stale-ALLOC cap (set by the tick's), and answers delivered before the timers run
 * (step(): the runtime's order), so a COMMIT deadline taken from the real clock is never
 * what a test depends on.
 */

/* ---- 5. a full store.rep ------------------------------------------------------------------- */

/*
 * The worker stops reading store.rep and it fills. The pipe goes on: store 0 is allocated,
 * copied and committed, its STORE_DONE waits in the worker's outbox (stage_reply never waits
 * for room), and store 1 behind it is allocated, copied and committed too. Once the worker
 * reads again, stage_worker_pass (the storer's on_pass) delivers both answers, in order.
 */
Test(store_machine, a_full_reply_ring_holds_up_only_the_answers)
{
	build(false);
	static const uint32_t slot_for[2][2] = {{12, 13}, {14, 15}};
	unsigned fill = fill_ring(srep, 0);
	cr_assert(!submit(0, 2, 30));
	cr_assert(!submit(1, 2, 40));
	bool room;
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	struct lk_req a = expect_alloc(0);
	answer_alloc(&a, slot_for[0], NULL);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	a = expect_alloc(1); /* store 1's ALLOC went out before store 0's copy and COMMIT */
	struct lk_req c0 = expect_req(KVR_MSG_COMMIT);
	answer_alloc(&a, slot_for[1], NULL);
	answer_commit(&c0);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	cr_assert_eq(sw.out.n, 1, "store 0's STORE_DONE waits in the outbox");
	struct lk_req c1 = expect_req(KVR_MSG_COMMIT);
	cr_assert_eq(c1.n, 2);
	answer_commit(&c1);
	cr_assert_eq(step(&room), KVR_PASS_MOVED);
	for (unsigned p = 0; p < 2; p++)
		for (unsigned k = 0; k < 2; k++) {
			assert_slot_holds(slot_for[p][k], S[p].items[k].block);
			cr_assert_eq(kvr_slot_state(st, slot_for[p][k]), KVR_SLOT_COMMITTED);
		}
	cr_assert_eq(sw.out.n, 2, "both STORE_DONEs wait in the outbox");
	cr_assert_eq(kvr_ring_count(srep), fill, "none of them in the full ring");
	cr_assert_eq(held(), 0, "nothing of the worker's is held but its answers");
	catch_up();
	cr_assert_eq(stage_worker_pass(&sw, now), KVR_PASS_WAITING, "answers wait for room");
	drain_fillers(srep, fill);
	cr_assert_eq(stage_worker_pass(&sw, now), KVR_PASS_MOVED);
	cr_assert_eq(sw.out.n, 0);
	expect_done(0, 0, 2, 0, NULL, 0);
	expect_done(1, 0, 2, 0, NULL, 0);
	assert_quiet();
}
