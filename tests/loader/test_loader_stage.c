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

/* The client sends LOAD items[0..n) under generation gen; the loader is stepped; the
 * LOAD_DONE is decoded and the failed block ids (BLOCKS) taken into failed. */
static struct kvr_msg_load_done load(uint32_t gen, const struct kvr_msg_load_item *items, uint32_t n,
				     uint32_t *failed)
{
	uint64_t wire = kvr_wire_make(gen, seq++);
	cr_assert_eq(kvr_list_send(req, KVR_MSG_LOAD, wire, 0, items, n, 0), 0);
	cr_assert_geq(step_msgs(&e, req), 1);
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
	cr_assert_eq(kvr_ring_count(rep), 0, "nothing more");
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
