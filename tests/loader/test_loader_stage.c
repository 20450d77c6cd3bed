/* The loader's stage (actors/loader/loader.c) stepped one message at a time over an in-memory control segment, a slot table, an arena and a host KV memfd (tests/runtime/step_stage.h). */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include <kvring/msg.h>

#include "../runtime/step_stage.h"

#include "kvr_geometry.h"
#include "kvr_keys.h"
#include "kvr_time.h"

/*
 * The stage is reached by compiling loader.c into this test (its stage is static; its
 * main() is renamed). init opens the real stage_worker over the worker's KV memory — a
 * memfd, the host backend — and the arena; the test commits slots in the slot table
 * itself (as the lookup actor would), writes a known pattern into their arena bytes, plays
 * the worker's client on load.req.0 / load.rep.0 and compares the KV memory byte for byte.
 *
 * Geometry: vLLM layer-major, 2 layers x (K, V), 16 tokens x 1 head x 64 dims x 2 bytes:
 * 4 pages of 2 KiB per block, an 8 KiB lane (as tests/storer/test_store_machine.c).
 */
int loader_actor_main(int argc, char **argv);
#define main loader_actor_main
#include "../../actors/loader/loader.c"
#undef main

#define LOADER KVR_ACTOR_IX_LOADER(0)
#define N_ACTORS (KVR_ACTOR_IX_STORER(0) + 1)
#define N_SLOTS 16
#define NUM_BLOCKS 64
#define GEN 1
#define UNTOUCHED 0xa5

static struct step_env e;
static struct kvr_slot_table *st;
static struct kvr_geometry geom;
static uint64_t lane_bytes, kv_bytes;
static uint8_t *kv;
static struct kvr_ring *req, *rep;
static uint64_t seq = 1;

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void setup(void)
{
	step_spec_ctl(&e, LOADER, "loader.0");
	step_spec(&e, 64, KVR_EP_CLIENT(0), LOADER, "load.req.0");
	step_spec(&e, 64, LOADER, KVR_EP_CLIENT(0), "load.rep.0");
	step_build(&e, "loader.0", N_ACTORS, 1, LOADER, KVR_ACTOR_LOADER, kvr_now_ns());
	e.act.ent->index = 0;
	atomic_store(&e.act.ent->generation, GEN);
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&geom, 2, 1, 64, 2, 16, NUM_BLOCKS), 0);
	lane_bytes = kvr_geometry_lane_bytes(&geom);
	kv_bytes = kvr_geometry_kv_extent(&geom);
	memcpy(kvr_ctl_worker_geometry(e.act.ctl, 0), &geom, sizeof(geom));
	e.act.cfg.staging.ceiling_bytes = 8 * lane_bytes;
	e.act.cfg.staging.load_percent = 50;
	e.act.cfg.staging.buffer_bytes = 0;
	st = step_slots(&e, N_SLOTS, lane_bytes, 1, 1);
	step_arena(&e, UNTOUCHED);
	kv = step_kv(&e, kv_bytes);
	memset(kv, 0, kv_bytes);
	req = step_ring(&e, "load.req.0");
	rep = step_ring(&e, "load.rep.0");
	step_init(&e, &loader_stage);
}

static void teardown(void)
{
	step_close(&e);
	st = NULL;
	kv = NULL;
}

TestSuite(loader_stage, .init = setup, .fini = teardown, .timeout = 30);

/* Slot s committed (lane 0) with a pattern of its own in its arena bytes; returns its epoch. */
static uint32_t commit_slot(uint32_t s)
{
	uint64_t in[2] = {11, s};
	uint32_t epoch;
	cr_assert_eq(kvr_slot_alloc(st, s, kvr_key_hash(in, sizeof(in)), 0, 0, &epoch), 0);
	uint64_t *d = kvr_slot_data(st, e.act.arena_seg.base, s);
	for (uint64_t i = 0; i < lane_bytes / 8; i++)
		d[i] = splitmix(((uint64_t)s << 32) ^ i);
	cr_assert_eq(kvr_slot_commit(st, s, epoch), 0);
	return epoch;
}

/* Engine block `block` of the KV memory holds slot s's lane: every region's page in order. */
static void assert_block_holds(uint32_t block, uint32_t s)
{
	const uint8_t *d = kvr_slot_data(st, e.act.arena_seg.base, s);
	uint64_t at = 0;
	for (unsigned r = 0; r < geom.n_regions; r++) {
		struct kvr_region g = kvr_geometry_region(&geom, r);
		cr_assert_eq(memcmp(kv + g.offset + (uint64_t)block * g.stride, d + at, g.page_bytes), 0,
			     "block %u region %u is not slot %u's", block, r, s);
		at += g.page_bytes;
	}
	cr_assert_eq(at, lane_bytes);
}

/* LOAD_DONEs waiting on load.rep (BLOCKS lists not counted). */
static unsigned done_count(void)
{
	unsigned n = 0;
	struct kvr_msg m;
	for (uint32_t i = 0; kvr_ring_peek(rep, i, &m) == 0; i++)
		n += m.hdr.type == KVR_MSG_LOAD_DONE;
	return n;
}

static void assert_block_zero(uint32_t block)
{
	for (unsigned r = 0; r < geom.n_regions; r++) {
		struct kvr_region g = kvr_geometry_region(&geom, r);
		const uint8_t *p = kv + g.offset + (uint64_t)block * g.stride;
		for (uint32_t b = 0; b < g.page_bytes; b++)
			if (p[b])
				cr_assert_fail("block %u region %u byte %u was written", block, r, b);
	}
}

static struct kvr_msg_load_done take_done(uint64_t wire, uint32_t *failed);

/* The client sends LOAD items[0..n) under generation gen: its wire id. */
static uint64_t send_load(uint32_t gen, const struct kvr_msg_load_item *items, uint32_t n)
{
	uint64_t wire = kvr_wire_make(gen, seq++);
	cr_assert_eq(kvr_list_send(req, KVR_MSG_LOAD, wire, 0, items, n, 0), 0);
	return wire;
}

/* Step passes until `answers` LOAD_DONEs wait on load.rep (a load's copy goes one pass of
 * chunks at a time); returns the passes it took. */
static unsigned passes_until_answered(unsigned answers)
{
	unsigned passes = 0;
	for (; done_count() < answers; passes++) {
		cr_assert_lt(passes, 1000, "%u of %u loads answered after 1000 passes", done_count(), answers);
		(void)step_pass(&e, kvr_now_ns());
	}
	return passes;
}

/* The client sends LOAD items[0..n) under generation gen; the loader is stepped until it
 * answers; the LOAD_DONE is decoded and the failed block ids (BLOCKS) taken into failed. */
static struct kvr_msg_load_done load(uint32_t gen, const struct kvr_msg_load_item *items, uint32_t n,
				     uint32_t *failed)
{
	uint64_t wire = send_load(gen, items, n);
	cr_assert_geq(step_msgs(&e, req), 1);
	passes_until_answered(1);
	return take_done(wire, failed);
}

/* The LOAD_DONE of request wire, next on load.rep, decoded; its failed block ids (BLOCKS)
 * taken into failed. */
static struct kvr_msg_load_done take_done(uint64_t wire, uint32_t *failed)
{
	struct kvr_msg m = step_take(rep, KVR_MSG_LOAD_DONE);
	cr_assert_eq(m.hdr.req_id, wire);
	struct kvr_msg_load_done d;
	cr_assert_eq(kvr_msg_decode_load_done(&m, &d), 0);
	cr_assert_eq(!!(m.hdr.flags & KVR_MSGF_MORE), d.n_failed > 0);
	uint32_t got = 0;
	while (got < d.n_failed) {
		struct kvr_msg b = step_take(rep, KVR_MSG_BLOCKS);
		struct kvr_msg_list_hdr h;
		cr_assert_eq(kvr_msg_decode_list(&b, KVR_MSG_BLOCKS, &h), 0);
		cr_assert_eq(h.total, d.n_failed);
		kvr_msg_list_items(&b, failed + got);
		got += h.count;
	}
	return d;
}

/* Four leased slots loaded into blocks 5, 9, 10, 40: each block's bytes are its slot's, the
 * rest of the KV memory untouched, LOAD_DONE counts 4 blocks and their bytes, pins dropped. */
Test(loader_stage, load_copies_bytes)
{
	uint32_t slots[4] = {2, 3, 7, 15}, blocks[4] = {5, 9, 10, 40};
	struct kvr_msg_load_item items[4];
	for (unsigned i = 0; i < 4; i++)
		items[i] = (struct kvr_msg_load_item){.slot = slots[i], .epoch = commit_slot(slots[i]), .block = blocks[i]};
	uint32_t failed[4];
	struct kvr_msg_load_done d = load(GEN, items, 4, failed);
	cr_assert_eq(kvr_ring_count(rep), 0, "nothing more");
	cr_assert_eq(d.status, 0);
	cr_assert_eq(d.n_blocks, 4);
	cr_assert_eq(d.n_failed, 0);
	cr_assert_eq(d.bytes, 4 * lane_bytes);
	for (unsigned i = 0; i < 4; i++) {
		assert_block_holds(blocks[i], slots[i]);
		cr_assert_eq(kvr_slot_state(st, slots[i]), KVR_SLOT_COMMITTED);
		cr_assert_eq(kvr_slot_pins(st, slots[i]), 0, "unpinned after the copy");
	}
	assert_block_zero(0);
	assert_block_zero(6);
	assert_block_zero(41);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_BLOCKS), 4);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_BYTES), 4 * lane_bytes);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_REQUESTS), 1);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_FAILED_BLOCKS), 0);
}

/* A slot reused since the lookup (its epoch moved on), a free one and a block past the
 * worker's blocks fail by block id (-EIO, BLOCKS); the good one is copied. */
Test(loader_stage, load_fails_by_block)
{
	uint32_t e1 = commit_slot(1), e4 = commit_slot(4);
	struct kvr_msg_load_item items[4] = {
		{.slot = 1, .epoch = e1, .block = 3},
		{.slot = 4, .epoch = e4 + 1, .block = 4},       /* reused since */
		{.slot = 6, .epoch = 1, .block = 8},            /* never committed */
		{.slot = 1, .epoch = e1, .block = NUM_BLOCKS},  /* not one of the worker's blocks */
	};
	uint32_t failed[4];
	struct kvr_msg_load_done d = load(GEN, items, 4, failed);
	cr_assert_eq(d.status, -EIO);
	cr_assert_eq(d.n_blocks, 4);
	cr_assert_eq(d.n_failed, 3);
	cr_assert_eq(failed[0], 4);
	cr_assert_eq(failed[1], 8);
	cr_assert_eq(failed[2], NUM_BLOCKS);
	cr_assert_eq(d.bytes, lane_bytes);
	assert_block_holds(3, 1);
	assert_block_zero(4);
	assert_block_zero(8);
	cr_assert_eq(kvr_slot_pins(st, 1), 0);
	cr_assert_eq(kvr_slot_pins(st, 4), 0);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_FAILED_BLOCKS), 3);
}

/* A LOAD addressed to another incarnation: -ESTALE, every block failed, nothing copied. */
Test(loader_stage, load_stale_generation)
{
	uint32_t e2 = commit_slot(2);
	struct kvr_msg_load_item items[1] = {{.slot = 2, .epoch = e2, .block = 7}};
	uint32_t failed[1];
	struct kvr_msg_load_done d = load(GEN + 1, items, 1, failed);
	cr_assert_eq(d.status, -ESTALE);
	cr_assert_eq(d.n_failed, 1);
	cr_assert_eq(failed[0], 7);
	cr_assert_eq(d.bytes, 0);
	assert_block_zero(7);
	cr_assert_eq(kvr_slot_pins(st, 2), 0);
}

/* Eight loads in flight at once (the window): a 12-block load sent first and seven 1-block
 * loads behind it. The pool has 4 leases of one block, so the big load takes several passes
 * and the small ones, copied round robin beside it, are answered before it — each answer
 * byte-exact, every pin dropped; while the window is full the request ring is held. */
Test(loader_stage, eight_loads_in_flight_complete_independently_out_of_order)
{
	cr_assert_eq(e.act.cfg.staging.ceiling_bytes * e.act.cfg.staging.load_percent / 100 / lane_bytes, 4);
	uint32_t epoch[N_SLOTS];
	for (uint32_t s = 0; s < N_SLOTS; s++)
		epoch[s] = commit_slot(s);
	struct kvr_msg_load_item big[12];
	for (uint32_t i = 0; i < 12; i++)
		big[i] = (struct kvr_msg_load_item){.slot = i, .epoch = epoch[i], .block = 20 + i};
	uint64_t wires[8];
	wires[0] = send_load(GEN, big, 12);
	for (uint32_t k = 1; k < 8; k++) {
		uint32_t s = 11 + k % 5; /* slots 12..15 and 11: some shared (a pin is a count) */
		struct kvr_msg_load_item one = {.slot = s, .epoch = epoch[s], .block = 40 + k};
		wires[k] = send_load(GEN, &one, 1);
	}
	cr_assert_geq(step_msgs(&e, req), 8);
	cr_assert(e.act.inputs[0].held, "load.req is held while 8 loads are in the window");
	cr_assert_eq(atomic_load(&e.act.ent->held), 8, "the jobs are reported held (a drain waits for them)");
	unsigned passes = passes_until_answered(8);
	cr_assert_gt(passes, 3, "the big load takes more than one pass of 4 chunks");
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_CHUNKS), 12 + 7);

	uint32_t failed[1];
	bool big_seen = false;
	for (unsigned i = 0; i < 8; i++) {
		struct kvr_msg m;
		cr_assert_eq(kvr_ring_peek(rep, 0, &m), 0);
		unsigned k = 0;
		while (k < 8 && wires[k] != m.hdr.req_id)
			k++;
		cr_assert_lt(k, 8, "an answer to a request that was not sent");
		if (i < 7)
			cr_assert_neq(k, 0, "answer %u is the 12-block load's: the small ones waited behind it", i);
		struct kvr_msg_load_done d = take_done(wires[k], failed);
		cr_assert_eq(d.status, 0);
		cr_assert_eq(d.n_failed, 0);
		cr_assert_eq(d.n_blocks, k ? 1 : 12);
		cr_assert_eq(d.bytes, (k ? 1 : 12) * lane_bytes);
		big_seen |= k == 0;
	}
	cr_assert(big_seen);
	cr_assert_eq(kvr_ring_count(rep), 0, "nothing more");
	for (uint32_t i = 0; i < 12; i++)
		assert_block_holds(20 + i, i);
	for (uint32_t k = 1; k < 8; k++)
		assert_block_holds(40 + k, 11 + k % 5);
	for (uint32_t s = 0; s < N_SLOTS; s++) {
		cr_assert_eq(kvr_slot_state(st, s), KVR_SLOT_COMMITTED);
		cr_assert_eq(kvr_slot_pins(st, s), 0, "slot %u unpinned", s);
	}
	cr_assert(!e.act.inputs[0].held, "released once the window emptied");
	cr_assert_eq(atomic_load(&e.act.ent->held), 0);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_REQUESTS), 8);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_BLOCKS), 12 + 7);
}

/* Three loads in flight, the middle one naming a slot reused since its lookup: it alone
 * fails, by block id; the two beside it are copied byte-exact. */
Test(loader_stage, a_failed_load_fails_only_its_blocks)
{
	uint32_t e1 = commit_slot(1), e2 = commit_slot(2), e3 = commit_slot(3);
	struct kvr_msg_load_item x[2] = {{.slot = 1, .epoch = e1, .block = 10}, {.slot = 2, .epoch = e2, .block = 11}};
	struct kvr_msg_load_item y[2] = {{.slot = 3, .epoch = e3 + 1, .block = 12}, {.slot = 3, .epoch = e3 + 2, .block = 13}};
	struct kvr_msg_load_item z[1] = {{.slot = 3, .epoch = e3, .block = 14}};
	uint64_t wx = send_load(GEN, x, 2), wy = send_load(GEN, y, 2), wz = send_load(GEN, z, 1);
	cr_assert_eq(step_msgs(&e, req), 3);
	(void)passes_until_answered(3);
	uint32_t failed[2];
	/* y copies nothing: its answer comes on the first pass, before x's and z's */
	struct kvr_msg_load_done d = take_done(wy, failed);
	cr_assert_eq(d.status, -EIO);
	cr_assert_eq(d.n_failed, 2);
	cr_assert_eq(failed[0], 12);
	cr_assert_eq(failed[1], 13);
	cr_assert_eq(d.bytes, 0);
	d = take_done(wx, failed);
	cr_assert_eq(d.status, 0);
	cr_assert_eq(d.bytes, 2 * lane_bytes);
	d = take_done(wz, failed);
	cr_assert_eq(d.status, 0);
	cr_assert_eq(d.n_failed, 0);
	assert_block_holds(10, 1);
	assert_block_holds(11, 2);
	assert_block_holds(14, 3);
	assert_block_zero(12);
	assert_block_zero(13);
	for (uint32_t s = 1; s <= 3; s++)
		cr_assert_eq(kvr_slot_pins(st, s), 0);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_FAILED_BLOCKS), 2);
}

/* The client stops reading load.rep and it fills: the loader still takes loads and copies
 * them (no handler waits for room), its answers wait in the outbox in order, and reach the
 * client once it reads again. */
Test(loader_stage, a_full_reply_ring_holds_up_only_the_answers)
{
	struct kvr_msg filler;
	kvr_msg_build(&filler, KVR_MSG_PING, 0, 0, 0, NULL, 0);
	uint32_t filled = 0;
	while (kvr_ring_try_enqueue(rep, &filler) == 0)
		filled++;
	cr_assert_eq(filled, 64);
	uint32_t e5 = commit_slot(5), e6 = commit_slot(6);
	struct kvr_msg_load_item a[1] = {{.slot = 5, .epoch = e5, .block = 30}};
	struct kvr_msg_load_item b[1] = {{.slot = 6, .epoch = e6, .block = 31}};
	uint64_t wa = send_load(GEN, a, 1), wb = send_load(GEN, b, 1);
	cr_assert_eq(step_msgs(&e, req), 2);
	int pass = KVR_PASS_MOVED;
	for (unsigned i = 0; i < 10 && pass == KVR_PASS_MOVED; i++)
		pass = step_pass(&e, kvr_now_ns());
	cr_assert_eq(pass, KVR_PASS_WAITING, "answers wait for room (pass %d)", pass);
	assert_block_holds(30, 5);
	assert_block_holds(31, 6);
	cr_assert_eq(kvr_slot_pins(st, 5), 0, "unpinned though not yet answered");
	cr_assert_eq(atomic_load(&e.act.ent->held), 0, "nothing of the worker's is held but its answers");
	cr_assert_eq(kvr_ring_count(rep), 64);
	for (uint32_t i = 0; i < filled; i++)
		(void)step_take(rep, KVR_MSG_PING);
	cr_assert_eq(step_pass(&e, kvr_now_ns()), KVR_PASS_MOVED);
	uint32_t failed[1];
	cr_assert_eq(take_done(wa, failed).status, 0);
	cr_assert_eq(take_done(wb, failed).status, 0);
	cr_assert_eq(kvr_ring_count(rep), 0);
	cr_assert_eq(step_pass(&e, kvr_now_ns()), KVR_PASS_IDLE);
}

/* ---- layer-ordered loads ------------------------------------------------------------- */

/* Layer `layer` (regions 2*layer, 2*layer+1: its K and V) of engine block `block` holds slot s's
 * bytes for it (holds) or is still all zero (!holds). */
static void assert_layer(uint32_t block, uint32_t s, unsigned layer, bool holds)
{
	const uint8_t *d = kvr_slot_data(st, e.act.arena_seg.base, s);
	uint64_t at = 0;
	for (unsigned r = 0; r < geom.n_regions; r++) {
		struct kvr_region g = kvr_geometry_region(&geom, r);
		const uint8_t *p = kv + g.offset + (uint64_t)block * g.stride;
		if (r / 2 == layer) {
			if (holds)
				cr_assert_eq(memcmp(p, d + at, g.page_bytes), 0, "block %u layer %u region %u is not slot %u's",
					     block, layer, r, s);
			else
				for (uint32_t b = 0; b < g.page_bytes; b++)
					if (p[b])
						cr_assert_fail("block %u layer %u region %u byte %u written early", block, layer,
							       r, b);
		}
		at += g.page_bytes;
	}
}

/* The client's side of kvr_load_layered: entry `ent` of its progress table names wire. */
static struct kvr_load_progress *progress_entry(unsigned ent, uint64_t wire)
{
	struct kvr_load_progress *p = &kvr_ctl_area(e.act.ctl, 0)->progress[ent];
	atomic_store(&p->layers, 0);
	atomic_store(&p->wire, wire);
	return p;
}

/* Four blocks whose wire id is in the progress table, one chunk per pass (a lease pool of
 * one; a layer's chunk is 2 blocks: one lease's bytes): layer 0 of every block lands first
 * while layer 1 stays untouched, the entry says 1, then 2, then the LOAD_DONE — byte-exact,
 * unpinned, counted as any load. */
Test(loader_stage, a_layered_load_lands_layer_by_layer)
{
	struct loader *l = e.act.data;
	l->sw.pool_leases = 1;
	uint32_t slots[4] = {1, 2, 3, 4}, blocks[4] = {7, 8, 20, 21};
	struct kvr_msg_load_item items[4];
	for (unsigned i = 0; i < 4; i++)
		items[i] = (struct kvr_msg_load_item){.slot = slots[i], .epoch = commit_slot(slots[i]), .block = blocks[i]};
	struct kvr_load_progress *p = progress_entry(5, kvr_wire_make(GEN, seq));
	uint64_t wire = send_load(GEN, items, 4);
	cr_assert_eq(atomic_load(&p->wire), wire);
	cr_assert_geq(step_msgs(&e, req), 1);

	cr_assert_eq(step_pass(&e, kvr_now_ns()), KVR_PASS_MOVED); /* layer 0 of blocks 7, 8 */
	cr_assert_eq(atomic_load(&p->layers), 0);
	assert_layer(7, 1, 0, true);
	assert_layer(20, 3, 0, false);
	assert_layer(7, 1, 1, false);
	cr_assert_eq(step_pass(&e, kvr_now_ns()), KVR_PASS_MOVED); /* layer 0 of blocks 20, 21 */
	cr_assert_eq(atomic_load(&p->layers), 1, "layer 0 of every block is in place");
	for (unsigned i = 0; i < 4; i++) {
		assert_layer(blocks[i], slots[i], 0, true);
		assert_layer(blocks[i], slots[i], 1, false);
		cr_assert_eq(kvr_slot_pins(st, slots[i]), 1, "pinned until the copy is over");
	}
	cr_assert_eq(done_count(), 0);
	(void)step_pass(&e, kvr_now_ns());
	cr_assert_eq(atomic_load(&p->layers), 1);
	(void)step_pass(&e, kvr_now_ns());
	cr_assert_eq(atomic_load(&p->layers), 2);
	passes_until_answered(1);
	uint32_t failed[4];
	struct kvr_msg_load_done d = take_done(wire, failed);
	cr_assert_eq(d.status, 0);
	cr_assert_eq(d.n_failed, 0);
	cr_assert_eq(d.bytes, 4 * lane_bytes);
	for (unsigned i = 0; i < 4; i++) {
		assert_block_holds(blocks[i], slots[i]);
		cr_assert_eq(kvr_slot_pins(st, slots[i]), 0);
		cr_assert_eq(kvr_slot_state(st, slots[i]), KVR_SLOT_COMMITTED);
	}
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_BLOCKS), 4);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_CHUNKS), 4, "4 chunks: 2 layers x 2 blocks' worth of one lease");
	assert_block_zero(6);
	assert_block_zero(22);
}

/* Cancelled once layer 0 is in place: the count stays 1 (layer 1 was never copied), the load
 * fails whole (-ECANCELED, every block listed), unpinned. */
Test(loader_stage, a_layered_load_cancelled_after_layer_0_fails_whole)
{
	struct loader *l = e.act.data;
	l->sw.pool_leases = 1;
	struct kvr_msg_load_item items[2] = {{.slot = 9, .epoch = commit_slot(9), .block = 11},
					     {.slot = 10, .epoch = commit_slot(10), .block = 12}};
	struct kvr_load_progress *p = progress_entry(0, kvr_wire_make(GEN, seq));
	uint64_t wire = send_load(GEN, items, 2);
	cr_assert_geq(step_msgs(&e, req), 1);
	(void)step_pass(&e, kvr_now_ns()); /* layer 0 of both: one chunk */
	cr_assert_eq(atomic_load(&p->layers), 1);
	atomic_store(&kvr_ctl_area(e.act.ctl, 0)->cancel[3], wire);
	passes_until_answered(1);
	uint32_t failed[2];
	struct kvr_msg_load_done d = take_done(wire, failed);
	cr_assert_eq(d.status, -ECANCELED);
	cr_assert_eq(d.n_failed, 2);
	cr_assert_eq(atomic_load(&p->layers), 1, "layer 1 never landed");
	assert_layer(11, 9, 0, true);
	assert_layer(11, 9, 1, false);
	assert_layer(12, 10, 1, false);
	cr_assert_eq(kvr_slot_pins(st, 9), 0);
	cr_assert_eq(kvr_slot_pins(st, 10), 0);
	cr_assert_eq(step_stat(&e, KVR_STAT_XF_FENCED), 1);
}

/* An entry the client gave up (its wire id cleared, as libkvring does when it failed the load
 * on its side) is never written: before the load started (then it is copied whole, as any
 * load) and half-way (later layers land in the blocks, not in the entry). */
Test(loader_stage, a_given_up_entry_is_not_written)
{
	struct kvr_msg_load_item items[1] = {{.slot = 12, .epoch = commit_slot(12), .block = 50}};
	struct kvr_load_progress *p = progress_entry(7, kvr_wire_make(GEN, seq));
	uint64_t wire = send_load(GEN, items, 1);
	cr_assert_geq(step_msgs(&e, req), 1);
	atomic_store(&p->wire, 0); /* before the loader started it: copied whole, no progress */
	passes_until_answered(1);
	uint32_t failed[1];
	cr_assert_eq(take_done(wire, failed).status, 0);
	assert_block_holds(50, 12);
	cr_assert_eq(atomic_load(&p->layers), 0);
	cr_assert_eq(atomic_load(&p->wire), 0);

	/* given up half-way: layer 0 was published, the client then cleared the entry; layer 1
	 * lands in its blocks (the load still completes) but is never published into it */
	struct loader *l = e.act.data;
	l->sw.pool_leases = 1;
	struct kvr_msg_load_item two[2] = {{.slot = 13, .epoch = commit_slot(13), .block = 51},
					   {.slot = 14, .epoch = commit_slot(14), .block = 52}};
	p = progress_entry(7, kvr_wire_make(GEN, seq));
	wire = send_load(GEN, two, 2);
	cr_assert_geq(step_msgs(&e, req), 1);
	(void)step_pass(&e, kvr_now_ns()); /* layer 0 of both: one chunk */
	cr_assert_eq(atomic_load(&p->layers), 1);
	atomic_store(&p->wire, 0);
	passes_until_answered(1);
	uint32_t failed2[2];
	cr_assert_eq(take_done(wire, failed2).status, 0);
	assert_block_holds(51, 13);
	assert_block_holds(52, 14);
	cr_assert_eq(atomic_load(&p->layers), 1, "layer 1 was published into an entry the client gave up");
	cr_assert_eq(kvr_slot_pins(st, 13), 0);
	cr_assert_eq(kvr_slot_pins(st, 14), 0);
}
