/* Index tests: quorum visibility, suffix-only allocation, eviction rules, rebuild, LRU order, S3-FIFO. */
#include <criterion/criterion.h>

#include <errno.h>
#include <string.h>

#include "kvr_index.h"
#include "../l1/l1_test.h"

static struct kvr_segment seg = {.fd = -1};
static struct kvr_slot_table *t;
static struct kvr_index *idx;

static void teardown(void)
{
	kvr_index_free(idx);
	idx = NULL;
	kvr_segment_close(&seg);
}

TestSuite(index, .fini = teardown);
TestSuite(policy);

static void make(uint32_t n_slots, uint32_t tp, uint32_t quorum, const char *policy)
{
	cr_assert_eq(l1_table(n_slots, tp, quorum, &seg, &t), 0);
	cr_assert_eq(kvr_index_new(t, policy, &idx), 0);
}

/* keys of prompt p: block i is l1_key(p, i) */
static void prompt(uint64_t p, uint32_t n, kvr_key *out)
{
	for (uint32_t i = 0; i < n; i++)
		out[i] = l1_key(p, i);
}

/* Allocate and commit lane `lane` of keys; asserts every key was allocated or present. */
static void store(const kvr_key *keys, uint32_t n, unsigned lane, unsigned owner)
{
	struct kvr_index_ref r[256];
	struct kvr_index_alloc_stats st;
	cr_assert_eq(kvr_index_alloc(idx, keys, n, lane, owner, r, &st), 0);
	cr_assert_eq(st.noroom, 0);
	for (uint32_t i = 0; i < n; i++)
		if (r[i].slot != KVR_INDEX_PRESENT)
			cr_assert_geq(kvr_index_commit(idx, lane, r[i].slot, r[i].epoch), 0);
}

static void store1(kvr_key k)
{
	store(&k, 1, 0, 0);
}

static bool has(kvr_key k)
{
	struct kvr_index_block b;
	return kvr_index_get(idx, k, &b) == 0;
}

static int match1(kvr_key k)
{
	return kvr_index_match(idx, &k, 1, 0, NULL);
}

Test(index, quorum)
{
	make(16, 2, 2, "lru");
	kvr_key k[4];
	prompt(1, 4, k);
	struct kvr_index_ref r0[4], r1[4], m[4];
	cr_assert_eq(kvr_index_alloc(idx, k, 4, 0, 0, r0, NULL), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(kvr_index_commit(idx, 0, r0[i].slot, r0[i].epoch), 0, "lane 0 alone: not visible");
	cr_assert_eq(kvr_index_match(idx, k, 4, 0, m), 0, "lane 0 committed, lane 1 not -> 0");
	cr_assert_eq(kvr_index_match(idx, k, 4, 1, m), 0);

	cr_assert_eq(kvr_index_alloc(idx, k, 4, 1, 1, r1, NULL), 0);
	cr_assert_eq(kvr_index_match(idx, k, 4, 0, m), 0, "lane 1 allocated but writing");
	cr_assert_eq(kvr_index_commit(idx, 1, r1[0].slot, r1[0].epoch), 1, "became visible");
	cr_assert_eq(kvr_index_commit(idx, 1, r1[1].slot, r1[1].epoch), 1);
	cr_assert_eq(kvr_index_match(idx, k, 4, 0, m), 2);
	cr_assert_eq(kvr_index_commit(idx, 1, r1[3].slot, r1[3].epoch), 1);
	cr_assert_eq(kvr_index_match(idx, k, 4, 0, m), 2, "block 2 missing: the run stops there");
	cr_assert_eq(kvr_index_commit(idx, 1, r1[2].slot, r1[2].epoch), 1);
	cr_assert_eq(kvr_index_match(idx, k, 4, 1, m), 4);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(m[i].slot, r1[i].slot, "lane 1's slots");
		cr_assert_eq(m[i].epoch, r1[i].epoch);
		cr_assert_eq(kvr_slot_at(t, m[i].slot)->lane, 1);
	}
	cr_assert_eq(kvr_index_match(idx, k, 4, 0, m), 4);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(m[i].slot, r0[i].slot, "lane 0's slots");

	struct kvr_index_block b;
	cr_assert_eq(kvr_index_get(idx, k[2], &b), 0);
	cr_assert_eq(b.alloc_mask, 3);
	cr_assert_eq(b.commit_mask, 3);
	cr_assert(b.visible);
	cr_assert_eq(b.slot[0], r0[2].slot);
	cr_assert_eq(b.slot[1], r1[2].slot);
	cr_assert_eq(b.slot[2], KVR_SLOT_NONE);

	struct kvr_index_stats s;
	kvr_index_stats(idx, &s);
	cr_assert_eq(s.blocks, 4);
	cr_assert_eq(s.visible, 4);
	cr_assert_eq(s.free_slots, 8);
	cr_assert_eq(s.lanes, 2);
	cr_assert_str_eq(s.policy, "lru");

	/* errors */
	cr_assert_eq(kvr_index_match(idx, k, 4, 2, m), -EINVAL, "lane >= lanes");
	cr_assert_eq(kvr_index_alloc(idx, k, 4, 2, 0, r0, NULL), -EINVAL);
	cr_assert_eq(kvr_index_alloc(idx, k, 4, 0, 16, r0, NULL), -EINVAL);
	cr_assert_eq(kvr_index_commit(idx, 0, r0[0].slot, r0[0].epoch), -ESTALE, "double commit");
	cr_assert_eq(kvr_index_commit(idx, 0, 16, 1), -EINVAL, "slot out of range");
}

Test(index, commit_checks_lane_and_epoch)
{
	make(8, 2, 2, "lru");
	kvr_key k = l1_key(7, 0);
	struct kvr_index_ref r;
	cr_assert_eq(kvr_index_alloc(idx, &k, 1, 1, 0, &r, NULL), 0);
	cr_assert_eq(kvr_index_commit(idx, 0, r.slot, r.epoch), -EINVAL, "another lane's slot");
	cr_assert_eq(kvr_index_commit(idx, 1, r.slot, r.epoch + 1), -ESTALE, "wrong epoch");
	cr_assert_eq(kvr_index_commit(idx, 1, (r.slot + 1) % 8, 1), -ESTALE, "untracked slot");
	cr_assert_eq(kvr_slot_state(t, r.slot), KVR_SLOT_WRITING, "nothing changed");
	cr_assert_eq(kvr_index_commit(idx, 1, r.slot, r.epoch), 0, "lane 1 of 2: not visible yet");
	cr_assert_eq(kvr_slot_state(t, r.slot), KVR_SLOT_COMMITTED);
}

Test(index, mla_single_lane)
{
	make(8, 2, 1, "s3fifo");
	kvr_key k[3];
	prompt(2, 3, k);
	struct kvr_index_ref r[3];
	cr_assert_eq(kvr_index_alloc(idx, k, 3, 1, 0, r, NULL), -EINVAL, "one lane: lane 1 does not exist");
	cr_assert_eq(kvr_index_alloc(idx, k, 3, 0, 0, r, NULL), 0);
	cr_assert_eq(kvr_index_commit(idx, 0, r[0].slot, r[0].epoch), 1, "quorum 1: visible at once");
	cr_assert_eq(kvr_index_match(idx, k, 3, 0, NULL), 1);
}

Test(index, suffix_only_allocation)
{
	make(64, 1, 1, "lru");
	kvr_key a[10], b[10];
	prompt(1, 10, a);
	store(a, 10, 0, 0);
	/* b shares 7 of 10 blocks with a */
	memcpy(b, a, 7 * sizeof(kvr_key));
	for (int i = 7; i < 10; i++)
		b[i] = l1_key(2, i);
	cr_assert_eq(kvr_index_match(idx, b, 10, 0, NULL), 7);
	struct kvr_index_ref r[10];
	struct kvr_index_alloc_stats st;
	cr_assert_eq(kvr_index_alloc(idx, b, 10, 0, 0, r, &st), 0);
	cr_assert_eq(st.allocated, 3);
	cr_assert_eq(st.present, 7);
	cr_assert_eq(st.noroom, 0);
	cr_assert_eq(st.evicted, 0);
	for (int i = 0; i < 7; i++)
		cr_assert_eq(r[i].slot, KVR_INDEX_PRESENT, "block %d present", i);
	for (int i = 7; i < 10; i++) {
		cr_assert_lt(r[i].slot, 64);
		cr_assert_eq(kvr_slot_state(t, r[i].slot), KVR_SLOT_WRITING);
		cr_assert(kvr_key_eq(kvr_slot_at(t, r[i].slot)->key, b[i]));
	}
	/* a concurrent store of the same prompt: the writing lanes are present too */
	struct kvr_index_ref r2[10];
	cr_assert_eq(kvr_index_alloc(idx, b, 10, 0, 1, r2, &st), 0);
	cr_assert_eq(st.allocated, 0);
	cr_assert_eq(st.present, 10);
	struct kvr_slot_counts c;
	kvr_slots_counts(t, &c);
	cr_assert_eq(c.by_state[KVR_SLOT_COMMITTED], 10);
	cr_assert_eq(c.by_state[KVR_SLOT_WRITING], 3);
}

Test(index, abort_frees_and_drops_block)
{
	make(4, 2, 2, "lru");
	kvr_key k = l1_key(3, 0);
	struct kvr_index_ref r0, r1;
	cr_assert_eq(kvr_index_alloc(idx, &k, 1, 0, 0, &r0, NULL), 0);
	cr_assert_eq(kvr_index_alloc(idx, &k, 1, 1, 1, &r1, NULL), 0);
	cr_assert_eq(kvr_index_commit(idx, 0, r0.slot, r0.epoch), 0);
	cr_assert_eq(kvr_index_abort(idx, r1.slot, r1.epoch + 1), -ESTALE);
	cr_assert_eq(kvr_index_abort(idx, r1.slot, r1.epoch), 0);
	cr_assert_eq(kvr_index_abort(idx, r1.slot, r1.epoch), -ESTALE, "already aborted");
	cr_assert_eq(kvr_slot_state(t, r1.slot), KVR_SLOT_FREE);
	struct kvr_index_block b;
	cr_assert_eq(kvr_index_get(idx, k, &b), 0, "lane 0 still holds it");
	cr_assert_eq(b.alloc_mask, 1);
	cr_assert_eq(b.commit_mask, 1);
	cr_assert_not(b.visible);
	cr_assert_eq(kvr_index_match(idx, &k, 1, 0, NULL), 0);

	/* a writing block whose only lane aborts disappears */
	kvr_key k2 = l1_key(3, 1);
	cr_assert_eq(kvr_index_alloc(idx, &k2, 1, 0, 0, &r0, NULL), 0);
	cr_assert_eq(kvr_index_abort(idx, r0.slot, r0.epoch), 0);
	cr_assert_eq(kvr_index_get(idx, k2, &b), -ENOENT);
	struct kvr_index_stats s;
	kvr_index_stats(idx, &s);
	cr_assert_eq(s.blocks, 1);
	cr_assert_eq(s.free_slots, 3);
}

Test(index, eviction_skips_pinned_and_writing)
{
	make(4, 1, 1, "lru");
	kvr_key A = l1_key(1, 0), B = l1_key(2, 0), C = l1_key(3, 0), D = l1_key(4, 0), E = l1_key(5, 0),
		F = l1_key(6, 0), G = l1_key(7, 0);
	struct kvr_index_ref ra, rb, r;
	struct kvr_index_alloc_stats st;
	/* A committed and pinned, B writing, C and D committed; LRU order A B C D */
	cr_assert_eq(kvr_index_alloc(idx, &A, 1, 0, 0, &ra, NULL), 0);
	cr_assert_eq(kvr_index_commit(idx, 0, ra.slot, ra.epoch), 1);
	cr_assert_eq(kvr_index_alloc(idx, &B, 1, 0, 0, &rb, NULL), 0);
	store1(C);
	store1(D);
	cr_assert_eq(kvr_slot_pin(t, ra.slot, ra.epoch, 3), 0);

	cr_assert_eq(kvr_index_alloc(idx, &E, 1, 0, 0, &r, &st), 0);
	cr_assert_eq(st.evicted, 1);
	cr_assert_eq(st.allocated, 1);
	cr_assert(has(A) && has(B) && !has(C) && has(D), "C, the oldest evictable, went");
	struct kvr_index_ref rf;
	cr_assert_eq(kvr_index_alloc(idx, &F, 1, 0, 0, &rf, &st), 0);
	cr_assert(has(A) && has(B) && !has(D), "then D");
	/* A pinned, B/E/F writing: nothing evictable */
	cr_assert_eq(kvr_index_alloc(idx, &G, 1, 0, 0, &r, &st), 0);
	cr_assert_eq(r.slot, KVR_INDEX_NOROOM);
	cr_assert_eq(st.noroom, 1);
	cr_assert_eq(st.evicted, 0);
	cr_assert(has(A) && has(B) && has(E) && has(F) && !has(G));
	cr_assert_eq(kvr_slot_state(t, ra.slot), KVR_SLOT_COMMITTED);
	cr_assert_eq(kvr_slot_state(t, rb.slot), KVR_SLOT_WRITING);

	/* unpinned, A is evictable again */
	cr_assert_eq(kvr_slot_unpin(t, ra.slot, 3), 0);
	cr_assert_eq(kvr_index_alloc(idx, &G, 1, 0, 0, &r, &st), 0);
	cr_assert_eq(st.evicted, 1);
	cr_assert(!has(A) && has(G));
	struct kvr_index_stats s;
	kvr_index_stats(idx, &s);
	cr_assert_eq(s.evictions, 3);
	cr_assert_eq(s.noroom, 1);
}

Test(index, eviction_takes_all_lanes_and_spares_own_request)
{
	make(4, 2, 2, "lru");
	kvr_key A = l1_key(1, 0), B = l1_key(2, 0);
	store(&A, 1, 0, 0);
	store(&A, 1, 1, 1);
	store(&B, 1, 0, 0);
	store(&B, 1, 1, 1);
	/* full: a new block evicts A (both lanes) and takes one of its slots */
	kvr_key C[2] = {l1_key(3, 0), l1_key(3, 1)};
	struct kvr_index_ref r[2];
	struct kvr_index_alloc_stats st;
	cr_assert_eq(kvr_index_alloc(idx, C, 1, 0, 0, r, &st), 0);
	cr_assert_eq(st.evicted, 1);
	cr_assert(!has(A) && has(B));
	struct kvr_index_stats s;
	kvr_index_stats(idx, &s);
	cr_assert_eq(s.free_slots, 1, "both of A's lanes freed, one reused");

	/* keys of the request itself are never victims: storing [B, X0, X1] with only B
	 * evictable (C is writing) answers NOROOM for X1 and keeps B */
	kvr_key req[3] = {B, l1_key(4, 0), l1_key(4, 1)};
	struct kvr_index_ref rr[3];
	cr_assert_eq(kvr_index_alloc(idx, req, 3, 0, 0, rr, &st), 0);
	cr_assert_eq(rr[0].slot, KVR_INDEX_PRESENT);
	cr_assert_lt(rr[1].slot, 4, "the last free slot");
	cr_assert_eq(rr[2].slot, KVR_INDEX_NOROOM);
	cr_assert_eq(st.evicted, 0, "C has a writing lane; B is in the request");
	cr_assert(has(B));
}

Test(index, noroom_gap_ends_the_chain)
{
	make(2, 1, 1, "lru");
	kvr_key k[4];
	prompt(9, 4, k);
	struct kvr_index_ref r[4];
	struct kvr_index_alloc_stats st;
	cr_assert_eq(kvr_index_alloc(idx, k, 4, 0, 0, r, &st), 0);
	cr_assert_lt(r[0].slot, 2);
	cr_assert_lt(r[1].slot, 2);
	cr_assert_eq(r[2].slot, KVR_INDEX_NOROOM);
	cr_assert_eq(r[3].slot, KVR_INDEX_NOROOM);
	cr_assert_eq(st.allocated, 2);
	cr_assert_eq(st.noroom, 2);
}

Test(index, release_worker)
{
	make(8, 2, 2, "lru");
	kvr_key k[2];
	prompt(5, 2, k);
	struct kvr_index_ref r0[2], r1[2], m[2];
	store(k, 2, 0, 0);                                   /* worker 0: lane 0 committed */
	cr_assert_eq(kvr_index_alloc(idx, k, 2, 1, 1, r1, NULL), 0); /* worker 1: lane 1 writing */
	cr_assert_eq(kvr_index_commit(idx, 1, r1[0].slot, r1[0].epoch), 1);
	cr_assert_eq(kvr_index_match(idx, k, 2, 1, m), 1);
	cr_assert_eq(kvr_slot_pin(t, m[0].slot, m[0].epoch, 1), 0);

	struct kvr_slots_release rel;
	cr_assert_eq(kvr_index_release_worker(idx, 1, &rel), 0);
	cr_assert_eq(rel.aborted, 1);
	cr_assert_eq(rel.pins, 1);
	cr_assert_eq(rel.unpinned_slots, 1);
	cr_assert_eq(kvr_slot_state(t, r1[1].slot), KVR_SLOT_FREE);
	cr_assert_eq(kvr_slot_pins(t, m[0].slot), 0);
	cr_assert_eq(kvr_index_match(idx, k, 2, 0, NULL), 1, "block 1 stays invisible");
	struct kvr_index_block b;
	cr_assert_eq(kvr_index_get(idx, k[1], &b), 0);
	cr_assert_eq(b.alloc_mask, 1);
	cr_assert_eq(b.slot[1], KVR_SLOT_NONE);

	/* the new worker on that rank stores lane 1 of block 1 again: not "present" */
	struct kvr_index_alloc_stats st;
	cr_assert_eq(kvr_index_alloc(idx, k, 2, 1, 2, r0, &st), 0);
	cr_assert_eq(st.present, 1);
	cr_assert_eq(st.allocated, 1);
	cr_assert_eq(kvr_index_commit(idx, 1, r0[1].slot, r0[1].epoch), 1);
	cr_assert_eq(kvr_index_match(idx, k, 2, 0, NULL), 2);

	/* abort_owner (a storer restart) leaves pins alone */
	kvr_key x = l1_key(6, 0);
	struct kvr_index_ref rx;
	cr_assert_eq(kvr_index_alloc(idx, &x, 1, 0, 2, &rx, NULL), 0);
	cr_assert_eq(kvr_index_match(idx, k, 1, 0, m), 1);
	cr_assert_eq(kvr_slot_pin(t, m[0].slot, m[0].epoch, 2), 0);
	cr_assert_eq(kvr_index_abort_owner(idx, 2), 1);
	cr_assert_eq(kvr_slot_pins(t, m[0].slot), 1);
	cr_assert_eq(kvr_index_get(idx, x, &b), -ENOENT);
}

/* ---- rebuild ---------------------------------------------------------------------------- */

struct snap {
	int match[2];
	struct kvr_index_ref slots[2][16];
};

static void snapshot(const kvr_key (*prompts)[16], int n_prompts, struct snap *out)
{
	for (int p = 0; p < n_prompts; p++)
		for (unsigned lane = 0; lane < 2; lane++)
			out[p].match[lane] = kvr_index_match(idx, prompts[p], 16, lane, out[p].slots[lane]);
}

Test(index, rebuild_equals_original)
{
	struct rng seed = {test_seed("index.rebuild_equals_original")};
	make(256, 2, 2, "lru");
	enum { NP = 24 };
	kvr_key prompts[NP][16];
	for (int p = 0; p < NP; p++) {
		/* prompts share prefixes: prompt p starts with the first (p % 5) * 3 blocks of prompt 0 */
		int shared = (p % 5) * 3;
		for (int i = 0; i < 16; i++)
			prompts[p][i] = i < shared ? l1_key(0, i) : l1_key(1000 + p, i);
	}
	/* random stores: some lanes committed, some aborted, some left writing */
	for (int round = 0; round < 60; round++) {
		int p = (int)(rng_next(&seed) % NP);
		unsigned lane = (unsigned)(rng_next(&seed) % 2);
		uint32_t n = 1 + (uint32_t)(rng_next(&seed) % 16);
		struct kvr_index_ref r[16];
		cr_assert_eq(kvr_index_alloc(idx, prompts[p], n, lane, lane, r, NULL), 0);
		for (uint32_t i = 0; i < n; i++) {
			if (r[i].slot >= KVR_INDEX_NOROOM)
				continue;
			uint64_t x = rng_next(&seed) % 10;
			if (x < 7)
				cr_assert_geq(kvr_index_commit(idx, lane, r[i].slot, r[i].epoch), 0);
			else if (x < 9)
				cr_assert_eq(kvr_index_abort(idx, r[i].slot, r[i].epoch), 0);
		}
	}
	struct kvr_index_stats s1, s2;
	kvr_index_stats(idx, &s1);
	cr_assert_gt(s1.visible, 0);
	struct snap before[NP], after[NP];
	snapshot(prompts, NP, before);
	struct kvr_index_block blocks[NP][16];
	int present[NP][16];
	for (int p = 0; p < NP; p++)
		for (int i = 0; i < 16; i++)
			present[p][i] = kvr_index_get(idx, prompts[p][i], &blocks[p][i]);

	/* the lookup actor restarts: its index is gone, the table stays */
	kvr_index_free(idx);
	idx = NULL;
	cr_assert_eq(kvr_index_new(t, "lru", &idx), 0);
	kvr_index_stats(idx, &s2);
	cr_assert_eq(s2.blocks, s1.blocks);
	cr_assert_eq(s2.visible, s1.visible);
	cr_assert_eq(s2.free_slots, s1.free_slots);
	snapshot(prompts, NP, after);
	for (int p = 0; p < NP; p++) {
		for (int lane = 0; lane < 2; lane++) {
			cr_assert_eq(after[p].match[lane], before[p].match[lane], "prompt %d lane %d", p, lane);
			for (int i = 0; i < before[p].match[lane]; i++) {
				cr_assert_eq(after[p].slots[lane][i].slot, before[p].slots[lane][i].slot);
				cr_assert_eq(after[p].slots[lane][i].epoch, before[p].slots[lane][i].epoch);
			}
		}
		for (int i = 0; i < 16; i++) {
			struct kvr_index_block b;
			cr_assert_eq(kvr_index_get(idx, prompts[p][i], &b), present[p][i]);
			if (present[p][i])
				continue;
			cr_assert_eq(b.alloc_mask, blocks[p][i].alloc_mask, "prompt %d block %d", p, i);
			cr_assert_eq(b.commit_mask, blocks[p][i].commit_mask);
			cr_assert_eq(memcmp(b.slot, blocks[p][i].slot, sizeof(b.slot)), 0);
		}
	}
	/* writing lanes survive too: their commit works against the new index */
	for (uint32_t s = 0; s < t->n_slots; s++)
		if (kvr_slot_state(t, s) == KVR_SLOT_WRITING)
			cr_assert_geq(kvr_index_commit(idx, kvr_slot_at(t, s)->lane, s, kvr_slot_epoch(t, s)), 0);
	struct kvr_slot_counts c;
	kvr_slots_counts(t, &c);
	cr_assert_eq(c.by_state[KVR_SLOT_WRITING], 0);
}

Test(index, rebuild_keeps_recency_and_drops_strays)
{
	make(4, 1, 1, "lru");
	kvr_key A = l1_key(1, 0), B = l1_key(2, 0), C = l1_key(3, 0);
	store1(A);
	store1(B);
	store1(C);
	cr_assert_eq(match1(A), 1); /* order now B, C, A */
	/* a stray: a slot of another block size */
	uint32_t ep;
	cr_assert_eq(kvr_slot_alloc(t, 3, l1_key(9, 9), 0, 0, &ep), 0);
	cr_assert_eq(kvr_slot_commit(t, 3, ep), 0);
	kvr_slot_at(t, 3)->block_tokens = 128;

	kvr_index_free(idx);
	cr_assert_eq(kvr_index_new(t, "lru", &idx), 0);
	struct kvr_index_stats s;
	kvr_index_stats(idx, &s);
	cr_assert_eq(s.blocks, 3);
	cr_assert_eq(s.free_slots, 1);
	cr_assert_eq(kvr_index_rebuild(idx, t), 3, "rebuild returns the block count");
	cr_assert_eq(kvr_slot_state(t, 3), KVR_SLOT_FREE, "the stray was released");
	kvr_key D = l1_key(4, 0), E = l1_key(5, 0), F = l1_key(6, 0);
	store1(D); /* the free slot */
	store1(E);
	cr_assert(!has(B) && has(C) && has(A), "B was least recent before the restart");
	store1(F);
	cr_assert(!has(C) && has(A));
}

/* ---- policies ----------------------------------------------------------------------------- */

Test(index, lru_exact_order)
{
	make(4, 1, 1, "lru");
	kvr_key A = l1_key(1, 0), B = l1_key(2, 0), C = l1_key(3, 0), D = l1_key(4, 0), E = l1_key(5, 0),
		F = l1_key(6, 0), G = l1_key(7, 0);
	store1(A);
	store1(B);
	store1(C);
	store1(D);
	cr_assert_eq(match1(A), 1);
	cr_assert_eq(match1(C), 1);
	/* LRU order, oldest first: B D A C */
	store1(E);
	cr_assert(!has(B) && has(A) && has(C) && has(D) && has(E));
	store1(F);
	cr_assert(!has(D) && has(A) && has(C));
	cr_assert_eq(match1(E), 1); /* order: A C F E */
	store1(G);
	cr_assert(!has(A) && has(C) && has(E) && has(F) && has(G));
	store1(A);
	cr_assert(!has(C) && has(E) && has(F) && has(G) && has(A));
}

/* A hot set hit often, then a scan of one-off blocks twice the cache: S3-FIFO keeps the hot
 * set, LRU loses it. */
static int scan_survivors(const char *policy)
{
	make(20, 1, 1, policy);
	kvr_key hot[5];
	prompt(1, 5, hot);
	for (int i = 0; i < 5; i++)
		store1(hot[i]);
	for (int r = 0; r < 3; r++)
		for (int i = 0; i < 5; i++)
			cr_assert_eq(match1(hot[i]), 1);
	for (int i = 0; i < 40; i++)
		store1(l1_key(100 + i, 0));
	int alive = 0;
	for (int i = 0; i < 5; i++)
		alive += has(hot[i]);
	teardown();
	return alive;
}

Test(index, s3fifo_scan_resistance)
{
	cr_assert_eq(scan_survivors("s3fifo"), 5, "S3-FIFO keeps the whole hot set through a scan");
	cr_assert_eq(scan_survivors("lru"), 0, "LRU loses it");
}

Test(index, unknown_policy)
{
	cr_assert_eq(l1_table(4, 1, 1, &seg, &t), 0);
	cr_assert_eq(kvr_index_new(t, "fifo", &idx), -EINVAL);
	cr_assert_null(idx);
	cr_assert_str_eq(kvr_policy_names(), "lru, s3fifo");
}

static bool all_ok(void *ctx, uint32_t e)
{
	(void)ctx;
	(void)e;
	return true;
}

static bool not_listed(void *ctx, uint32_t e)
{
	const uint32_t *deny = ctx;
	for (; *deny != KVR_SLOT_NONE; deny++)
		if (*deny == e)
			return false;
	return true;
}

Test(policy, s3fifo_ghost_readmits_to_main)
{
	struct kvr_policy *p;
	cr_assert_eq(kvr_policy_new("s3fifo", 16, 10, &p), 0);
	cr_assert_str_eq(kvr_policy_name(p), "s3fifo");
	for (uint32_t e = 0; e < 10; e++)
		kvr_policy_insert(p, e, l1_key(e, 0), false);
	uint32_t v = kvr_policy_victim(p, all_ok, NULL);
	cr_assert_eq(v, 0, "small FIFO: first in, first out");
	kvr_policy_remove(p, v, true);
	/* e0 comes back: its key is in the ghost, so it enters main and outlives e1..e9 */
	kvr_policy_insert(p, 0, l1_key(0, 0), false);
	for (uint32_t want = 1; want < 10; want++) {
		v = kvr_policy_victim(p, all_ok, NULL);
		cr_assert_eq(v, want);
		kvr_policy_remove(p, v, true);
	}
	cr_assert_eq(kvr_policy_victim(p, all_ok, NULL), 0);
	kvr_policy_remove(p, 0, true);
	cr_assert_eq(kvr_policy_victim(p, all_ok, NULL), KVR_SLOT_NONE, "empty");
	kvr_policy_free(p);
}

Test(policy, s3fifo_unevictable_and_frequency)
{
	struct kvr_policy *p;
	cr_assert_eq(kvr_policy_new("s3fifo", 8, 8, &p), 0);
	kvr_policy_insert(p, 0, l1_key(0, 0), true);
	kvr_policy_insert(p, 1, l1_key(1, 0), true);
	for (int i = 0; i < 3; i++)
		kvr_policy_hit(p, 1);
	/* main = [e0 (pinned), e1 (freq 3)]: e1 must still be found after its frequency runs out */
	uint32_t deny0[] = {0, KVR_SLOT_NONE};
	cr_assert_eq(kvr_policy_victim(p, not_listed, deny0), 1);
	uint32_t deny01[] = {0, 1, KVR_SLOT_NONE};
	cr_assert_eq(kvr_policy_victim(p, not_listed, deny01), KVR_SLOT_NONE, "nothing evictable");
	/* a hit entry in small is promoted, the cold one goes */
	kvr_policy_insert(p, 2, l1_key(2, 0), false);
	kvr_policy_insert(p, 3, l1_key(3, 0), false);
	kvr_policy_hit(p, 2);
	cr_assert_eq(kvr_policy_victim(p, all_ok, NULL), 3);
	kvr_policy_free(p);
}

Test(policy, lru_skips_unevictable)
{
	struct kvr_policy *p;
	cr_assert_eq(kvr_policy_new("lru", 8, 8, &p), 0);
	for (uint32_t e = 0; e < 4; e++)
		kvr_policy_insert(p, e, l1_key(e, 0), false);
	kvr_policy_hit(p, 0); /* order, oldest first: 1 2 3 0 */
	uint32_t deny[] = {1, 2, KVR_SLOT_NONE};
	cr_assert_eq(kvr_policy_victim(p, not_listed, deny), 3);
	cr_assert_eq(kvr_policy_victim(p, all_ok, NULL), 1, "skipped entries keep their place");
	kvr_policy_remove(p, 1, false);
	kvr_policy_remove(p, 1, false); /* removing twice is harmless */
	cr_assert_eq(kvr_policy_victim(p, all_ok, NULL), 2);
	kvr_policy_free(p);
	cr_assert_eq(kvr_policy_new("clock", 8, 8, &p), -EINVAL);
	cr_assert_eq(kvr_policy_new("lru", 0, 8, &p), -EINVAL);
	kvr_policy_free(NULL);
}

/* Defect 1 (issue 11): a promotion slot whose L2 read is in flight (I/O pin) is neither
 * given to the next allocation when its promotion is aborted, nor reclaimed by its
 * requester's death: it is the lookup actor's (owner), and an aborted one drains first. */
Test(index, aborted_slot_with_io_in_flight_is_not_reused)
{
	make(2, 1, 1, "lru");
	kvr_key a = l1_key(1, 0), b = l1_key(2, 0), c = l1_key(3, 0);
	struct kvr_index_ref ra, rb, rc;
	cr_assert_eq(kvr_index_alloc(idx, &a, 1, 0, KVR_SLOT_OWNER_LOOKUP, &ra, NULL), 0);
	cr_assert_lt(ra.slot, 2);
	cr_assert_eq(kvr_slot_pin_io(t, ra.slot, ra.epoch, KVR_SLOT_WRITING), 0, "the disk actor starts the read");
	cr_assert_eq(kvr_index_abort_owner(idx, 0), 0, "worker 0's reset does not touch the lookup's promotion");
	cr_assert_eq(kvr_index_release_worker(idx, 0, NULL), 0);
	cr_assert_eq(kvr_slot_state(t, ra.slot), KVR_SLOT_WRITING);

	cr_assert_eq(kvr_index_abort(idx, ra.slot, ra.epoch), 1, "aborted while the read is in flight");
	cr_assert_eq(kvr_slot_state(t, ra.slot), KVR_SLOT_DRAINING);
	cr_assert_eq(kvr_index_draining(idx), 1);
	cr_assert(!has(a));
	/* two stores: the first gets the other slot, the second finds no room (the draining slot
	 * is not free, and there is nothing evictable: b is still WRITING) */
	cr_assert_eq(kvr_index_alloc(idx, &b, 1, 0, 1, &rb, NULL), 0);
	cr_assert_neq(rb.slot, ra.slot, "the draining slot was handed out");
	cr_assert_eq(kvr_index_alloc(idx, &c, 1, 0, 1, &rc, NULL), 0);
	cr_assert_eq(rc.slot, KVR_INDEX_NOROOM);
	cr_assert_eq(kvr_index_reap(idx), 0, "still pinned");

	cr_assert_eq(kvr_slot_unpin(t, ra.slot, KVR_PIN_IO), 0, "the read completed");
	cr_assert_eq(kvr_index_alloc(idx, &c, 1, 0, 1, &rc, NULL), 0);
	cr_assert_eq(rc.slot, ra.slot, "reaped when the allocation needed it");
	cr_assert_eq(rc.epoch, ra.epoch + 1);
	cr_assert_eq(kvr_index_draining(idx), 0);
}

/* A lookup actor that died left promotion slots WRITING (owner lookup): its successor's
 * rebuild aborts them, and one with a read in flight drains instead of going free. */
Test(index, rebuild_aborts_a_dead_lookups_promotions)
{
	make(4, 1, 1, "lru");
	kvr_key a = l1_key(1, 0), b = l1_key(2, 0), w = l1_key(3, 0);
	struct kvr_index_ref ra, rb, rw;
	cr_assert_eq(kvr_index_alloc(idx, &a, 1, 0, KVR_SLOT_OWNER_LOOKUP, &ra, NULL), 0);
	cr_assert_eq(kvr_index_alloc(idx, &b, 1, 0, KVR_SLOT_OWNER_LOOKUP, &rb, NULL), 0);
	cr_assert_eq(kvr_index_alloc(idx, &w, 1, 0, 2, &rw, NULL), 0);
	cr_assert_eq(kvr_slot_pin_io(t, rb.slot, rb.epoch, KVR_SLOT_WRITING), 0);
	cr_assert_geq(kvr_index_rebuild(idx, t), 0);
	cr_assert_eq(kvr_slot_state(t, ra.slot), KVR_SLOT_FREE);
	cr_assert_eq(kvr_slot_state(t, rb.slot), KVR_SLOT_DRAINING);
	cr_assert_eq(kvr_slot_state(t, rw.slot), KVR_SLOT_WRITING, "a worker's store in progress is kept");
	cr_assert(!has(a) && !has(b) && has(w));
	cr_assert_eq(kvr_index_draining(idx), 1);
	cr_assert_eq(kvr_slot_drop_pins(t, rb.slot, KVR_PIN_IO), 1);
	cr_assert_eq(kvr_index_reap(idx), 1);
	cr_assert_eq(kvr_slot_state(t, rb.slot), KVR_SLOT_FREE);
}

/* A lookup actor killed in the middle of an eviction leaves a lane EVICTING (found by the
 * fault suite): its successor's rebuild returns it to COMMITTED — never left stuck, and never
 * freed with a pinner racing it — and the block is evictable again. */
Test(index, rebuild_finishes_an_interrupted_eviction)
{
	make(2, 1, 1, "lru");
	kvr_key a = l1_key(1, 0), b = l1_key(2, 0), c = l1_key(3, 0);
	store1(a);
	store1(b);
	struct kvr_index_block blk;
	cr_assert_eq(kvr_index_get(idx, a, &blk), 0);
	uint32_t s = blk.slot[0];
	cr_assert_eq(kvr_slot_evict_begin(t, s, kvr_slot_epoch(t, s)), 0, "the dead actor's half-done eviction");
	cr_assert_geq(kvr_index_rebuild(idx, t), 0);
	cr_assert_eq(kvr_slot_state(t, s), KVR_SLOT_COMMITTED);
	cr_assert(has(a));
	store1(c); /* needs a victim: the rebuilt a is the least recent */
	cr_assert(!has(a) && has(b) && has(c));
	struct kvr_slot_counts cnt;
	kvr_slots_counts(t, &cnt);
	cr_assert_eq(cnt.by_state[KVR_SLOT_EVICTING], 0);
	cr_assert_eq(cnt.by_state[KVR_SLOT_COMMITTED], 2);
}

/* Allocate and commit lane `lane` of key k for a block of `lanes` lanes (a table of several). */
static void store_lanes(kvr_key k, unsigned lane, unsigned lanes)
{
	struct kvr_index_ref r;
	struct kvr_index_alloc_stats st;
	const struct kvr_slot_tag tag = {.lanes = (uint8_t)lanes, .block_tokens = 16, .model = 2};
	cr_assert_eq(kvr_index_alloc_tagged(idx, &k, 1, lane, &tag, 0, &r, &st), 0);
	cr_assert_eq(st.allocated, 1);
	cr_assert_eq(kvr_slot_at(t, r.slot)->lanes, lanes, "the slot records its block's lanes");
	cr_assert(kvr_slot_at(t, r.slot)->block_tokens == 16 && kvr_slot_model(t, r.slot) == 2, "and the rest of its tag");
	cr_assert_geq(kvr_index_commit(idx, lane, r.slot, r.epoch), 0);
}

/*
 * A table of several quorums (quorum 0: engines of several TP sizes without a model
 * section): each block is visible once its own lanes are committed, a key keeps the lane
 * count it was first allocated with, and a rebuild gets every block's lane count back from
 * its slots (a slot without one is a stray).
 */
Test(index, a_table_of_several_quorums_gives_each_block_its_own)
{
	make(16, KVR_SLOT_MAX_WORKERS, 0, "lru");
	kvr_key a = l1_key(90, 0), b = l1_key(91, 0), c = l1_key(92, 0);
	struct kvr_index_ref r;
	cr_assert_eq(kvr_index_alloc(idx, &a, 1, 0, 0, &r, NULL), -EINVAL, "a block's lanes must be given");
	const struct kvr_slot_tag one = {.lanes = 1}, two = {.lanes = 2};
	cr_assert_eq(kvr_index_alloc_tagged(idx, &a, 1, 1, &one, 0, &r, NULL), -EINVAL, "lane 1 of a 1-lane block");
	cr_assert_eq(kvr_index_alloc_tagged(idx, &a, 1, 0, NULL, 0, &r, NULL), -EINVAL, "no tag");
	store_lanes(a, 0, 1); /* a TP-1 engine's block: visible with its one lane */
	cr_assert_eq(kvr_index_match(idx, &a, 1, 0, NULL), 1);
	cr_assert_eq(kvr_index_match(idx, &a, 1, 1, NULL), 0, "it has no lane 1");
	store_lanes(b, 0, 2); /* a TP-2 engine's: not before both */
	cr_assert_eq(kvr_index_match(idx, &b, 1, 0, NULL), 0);
	store_lanes(b, 1, 2);
	cr_assert_eq(kvr_index_match(idx, &b, 1, 0, NULL), 1);
	cr_assert_eq(kvr_index_match(idx, &b, 1, 1, NULL), 1);
	struct kvr_index_block blk;
	cr_assert_eq(kvr_index_get(idx, b, &blk), 0);
	cr_assert(blk.visible && blk.lanes == 2);
	struct kvr_index_alloc_stats st;
	cr_assert_eq(kvr_index_alloc_tagged(idx, &a, 1, 1, &two, 0, &r, &st), 0);
	cr_assert(r.slot == KVR_INDEX_NOROOM && st.noroom == 1, "a key keeps its block's lane count");
	store_lanes(c, 2, 4); /* one lane of four: stays invisible */

	/* a WRITING slot allocated untagged (not by the index: no lane count of its own) */
	uint32_t ep;
	cr_assert_eq(kvr_slot_alloc(t, 15, l1_key(93, 0), 0, 0, &ep), 0);
	cr_assert_eq(kvr_index_rebuild(idx, t), 3);
	cr_assert_eq(kvr_index_match(idx, &a, 1, 0, NULL), 1);
	cr_assert_eq(kvr_index_match(idx, &b, 1, 1, NULL), 1);
	cr_assert_eq(kvr_index_match(idx, &c, 1, 2, NULL), 0);
	cr_assert_eq(kvr_index_get(idx, c, &blk), 0);
	cr_assert(!blk.visible && blk.lanes == 4);
	cr_assert_eq(kvr_slot_state(t, 15), KVR_SLOT_FREE, "the untagged slot was released");
}
