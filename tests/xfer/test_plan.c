/* Tests for the copy planner: coalescing table, range and overlap errors, randomised oracle check. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvr_xfer.h"

#define MAXR 4
#define MAXB 8
#define NONE KVR_XFER_NONE_IDX

struct plan_case {
	const char *name;
	uint32_t n_regions;
	struct kvr_xfer_region regions[MAXR];
	uint32_t num_blocks;
	uint64_t kv_size;
	uint64_t arena_size;
	uint32_t n;
	uint32_t ids[MAXB];
	uint64_t slots[MAXB];
	int rc;                 /* expected runs, or -errno */
	uint32_t what, index, block, region; /* expected err on failure */
	uint32_t n_expect;      /* runs listed in expect (0: do not compare runs one by one) */
	struct kvr_xfer_run expect[MAXB];
};

static struct kvr_xfer_layout layout_of(const struct plan_case *c)
{
	return (struct kvr_xfer_layout){
		.regions = c->regions,
		.n_regions = c->n_regions,
		.num_blocks = c->num_blocks,
		.kv_size = c->kv_size,
		.arena_size = c->arena_size,
	};
}

/* Oracle: apply the runs (KV -> arena) to random KV bytes and compare with the arena built
 * page by page from the slot-layout contract. Also checks sortedness and disjointness. */
static void check_against_oracle(const struct kvr_xfer_layout *l, const uint32_t *ids, const uint64_t *slots,
				 size_t n, const struct kvr_xfer_run *runs, int n_runs, uint64_t bytes)
{
	unsigned char *kv = malloc(l->kv_size), *got = calloc(1, l->arena_size), *want = calloc(1, l->arena_size);
	unsigned char *kv_used = calloc(1, l->kv_size), *slot_used = calloc(1, l->arena_size);
	uint64_t sum = 0;

	cr_assert(kv && got && want && kv_used && slot_used);
	for (uint64_t i = 0; i < l->kv_size; i++)
		kv[i] = (unsigned char)(i * 131 + 7 + (i >> 8));

	for (int k = 0; k < n_runs; k++) {
		const struct kvr_xfer_run *r = &runs[k];
		cr_assert(r->len > 0, "run %d empty", k);
		cr_assert(r->kv_off + r->len <= l->kv_size && r->slot_off + r->len <= l->arena_size,
			  "run %d out of range", k);
		if (k > 0)
			cr_assert(runs[k - 1].kv_off + runs[k - 1].len <= r->kv_off, "runs %d,%d not sorted/disjoint",
				  k - 1, k);
		for (uint64_t b = 0; b < r->len; b++) {
			cr_assert(!slot_used[r->slot_off + b], "slot byte %lu written twice",
				  (unsigned long)(r->slot_off + b));
			slot_used[r->slot_off + b] = 1;
			cr_assert(!kv_used[r->kv_off + b]);
			kv_used[r->kv_off + b] = 1;
		}
		memcpy(got + r->slot_off, kv + r->kv_off, r->len);
		sum += r->len;
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t s = slots[i];
		for (uint32_t r = 0; r < l->n_regions; r++) {
			const struct kvr_xfer_region *g = &l->regions[r];
			memcpy(want + s, kv + g->offset + (uint64_t)ids[i] * g->stride, g->page_bytes);
			s += g->page_bytes;
		}
	}
	cr_assert_eq(sum, bytes, "sum of runs %lu != reported bytes %lu", (unsigned long)sum, (unsigned long)bytes);
	cr_assert_eq(bytes, n * kvr_xfer_slot_bytes(l));
	cr_assert(memcmp(got, want, l->arena_size) == 0, "arena differs from the slot-layout oracle");
	free(kv);
	free(got);
	free(want);
	free(kv_used);
	free(slot_used);
}

/* page 64, 16 blocks, arena 4096 unless said otherwise */
#define R1(o, s, p) .n_regions = 1, .regions = { { o, s, p, 0 } }
static struct plan_case cases[] = {
	{ .name = "contiguous ids and slots -> one run", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024,
	  .arena_size = 4096, .n = 8, .ids = { 0, 1, 2, 3, 4, 5, 6, 7 },
	  .slots = { 0, 64, 128, 192, 256, 320, 384, 448 }, .rc = 1, .n_expect = 1, .expect = { { 0, 0, 512 } } },
	{ .name = "gapped stride -> one run per block", R1(0, 128, 64), .num_blocks = 16, .kv_size = 2048,
	  .arena_size = 4096, .n = 4, .ids = { 0, 1, 2, 3 }, .slots = { 0, 64, 128, 192 }, .rc = 4, .n_expect = 4,
	  .expect = { { 0, 0, 64 }, { 128, 64, 64 }, { 256, 128, 64 }, { 384, 192, 64 } } },
	{ .name = "gapped slots -> one run per block", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024,
	  .arena_size = 4096, .n = 4, .ids = { 0, 1, 2, 3 }, .slots = { 0, 128, 256, 384 }, .rc = 4 },
	{ .name = "two contiguous stretches", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024, .arena_size = 4096,
	  .n = 5, .ids = { 0, 1, 2, 5, 6 }, .slots = { 0, 64, 128, 192, 256 }, .rc = 2, .n_expect = 2,
	  .expect = { { 0, 0, 192 }, { 320, 192, 128 } } },
	{ .name = "cross-layer: consecutive regions and blocks merge", .n_regions = 4,
	  .regions = { { 0, 64, 16, 0 }, { 16, 64, 16, 0 }, { 32, 64, 16, 0 }, { 48, 64, 16, 0 } },
	  .num_blocks = 16, .kv_size = 1024, .arena_size = 4096, .n = 3, .ids = { 3, 4, 5 },
	  .slots = { 0, 64, 128 }, .rc = 1, .n_expect = 1, .expect = { { 192, 0, 192 } } },
	{ .name = "cross-layer: regions merge within each block", .n_regions = 4,
	  .regions = { { 0, 64, 16, 0 }, { 16, 64, 16, 0 }, { 32, 64, 16, 0 }, { 48, 64, 16, 0 } },
	  .num_blocks = 16, .kv_size = 1024, .arena_size = 4096, .n = 2, .ids = { 3, 5 }, .slots = { 0, 64 },
	  .rc = 2, .n_expect = 2, .expect = { { 192, 0, 64 }, { 320, 64, 64 } } },
	{ .name = "layer-major K,V: nothing merges", .n_regions = 2,
	  .regions = { { 0, 64, 64, 0 }, { 1024, 64, 64, 0 } }, .num_blocks = 16, .kv_size = 2048,
	  .arena_size = 4096, .n = 2, .ids = { 0, 1 }, .slots = { 0, 128 }, .rc = 4, .n_expect = 4,
	  .expect = { { 0, 0, 64 }, { 64, 128, 64 }, { 1024, 64, 64 }, { 1088, 192, 64 } } },
	{ .name = "reversed ids into ascending slots: no merge", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024,
	  .arena_size = 4096, .n = 4, .ids = { 3, 2, 1, 0 }, .slots = { 0, 64, 128, 192 }, .rc = 4, .n_expect = 4,
	  .expect = { { 0, 192, 64 }, { 64, 128, 64 }, { 128, 64, 64 }, { 192, 0, 64 } } },
	{ .name = "reversed ids into reversed slots: one run", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024,
	  .arena_size = 4096, .n = 4, .ids = { 3, 2, 1, 0 }, .slots = { 192, 128, 64, 0 }, .rc = 1, .n_expect = 1,
	  .expect = { { 0, 0, 256 } } },
	{ .name = "permuted ids into matching slots: one run", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024,
	  .arena_size = 4096, .n = 4, .ids = { 2, 0, 3, 1 }, .slots = { 1152, 1024, 1216, 1088 }, .rc = 1,
	  .n_expect = 1, .expect = { { 0, 1024, 256 } } },
	{ .name = "odd 561-byte pages at an odd offset", R1(7, 561, 561), .num_blocks = 4, .kv_size = 7 + 4 * 561,
	  .arena_size = 4096, .n = 4, .ids = { 0, 1, 2, 3 }, .slots = { 3, 564, 1125, 1686 }, .rc = 1,
	  .n_expect = 1, .expect = { { 7, 3, 2244 } } },
	{ .name = "declared page with opaque tail + 37-byte tail region", .n_regions = 2,
	  .regions = { { 0, 128, 100, 0 }, { 2048, 37, 37, 0 } }, .num_blocks = 16, .kv_size = 2048 + 16 * 37,
	  .arena_size = 4096, .n = 2, .ids = { 1, 2 }, .slots = { 0, 137 }, .rc = 4, .n_expect = 4,
	  .expect = { { 128, 0, 100 }, { 256, 137, 100 }, { 2085, 100, 37 }, { 2122, 237, 37 } } },
	{ .name = "single block, stride 0", R1(5, 0, 300), .num_blocks = 1, .kv_size = 305, .arena_size = 4096,
	  .n = 1, .ids = { 0 }, .slots = { 1000 }, .rc = 1, .n_expect = 1, .expect = { { 5, 1000, 300 } } },
	/* rejected */
	{ .name = "duplicate block id", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024, .arena_size = 4096,
	  .n = 3, .ids = { 1, 2, 1 }, .slots = { 0, 64, 128 }, .rc = -EINVAL, .what = KVR_XFER_E_KV_OVERLAP,
	  .index = 2, .block = 1, .region = 0 },
	{ .name = "overlapping slots", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024, .arena_size = 4096,
	  .n = 2, .ids = { 0, 2 }, .slots = { 0, 32 }, .rc = -EINVAL, .what = KVR_XFER_E_SLOT_OVERLAP, .index = 1,
	  .block = 2, .region = 0 },
	{ .name = "block id == num_blocks", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024, .arena_size = 4096,
	  .n = 3, .ids = { 0, 16, 99 }, .slots = { 0, 64, 128 }, .rc = -ERANGE, .what = KVR_XFER_E_BLOCK_ID,
	  .index = 1, .block = 16, .region = NONE },
	{ .name = "slot beyond the arena", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024, .arena_size = 256,
	  .n = 2, .ids = { 0, 1 }, .slots = { 0, 224 }, .rc = -ERANGE, .what = KVR_XFER_E_SLOT_RANGE, .index = 1,
	  .block = 1, .region = NONE },
	{ .name = "slot offset overflows", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1024, .arena_size = 4096,
	  .n = 1, .ids = { 3 }, .slots = { UINT64_MAX - 10 }, .rc = -ERANGE, .what = KVR_XFER_E_SLOT_RANGE,
	  .index = 0, .block = 3, .region = NONE },
	{ .name = "region beyond the KV memory", R1(0, 64, 64), .num_blocks = 16, .kv_size = 1000,
	  .arena_size = 4096, .n = 1, .ids = { 0 }, .slots = { 0 }, .rc = -ERANGE, .what = KVR_XFER_E_REGION_RANGE,
	  .index = NONE, .block = NONE, .region = 0 },
	{ .name = "region stride overflows", .n_regions = 2,
	  .regions = { { 0, 64, 64, 0 }, { 0, UINT64_MAX / 2, 64, 0 } },
	  .num_blocks = 4, .kv_size = UINT64_MAX, .arena_size = 4096, .n = 1, .ids = { 0 }, .slots = { 0 },
	  .rc = -ERANGE, .what = KVR_XFER_E_REGION_RANGE, .index = NONE, .block = NONE, .region = 1 },
	{ .name = "page larger than stride", R1(0, 32, 64), .num_blocks = 16, .kv_size = 1024, .arena_size = 4096,
	  .n = 1, .ids = { 0 }, .slots = { 0 }, .rc = -EINVAL, .what = KVR_XFER_E_REGION, .index = NONE,
	  .block = NONE, .region = 0 },
	{ .name = "empty page", R1(0, 32, 0), .num_blocks = 16, .kv_size = 1024, .arena_size = 4096, .n = 1,
	  .ids = { 0 }, .slots = { 0 }, .rc = -EINVAL, .what = KVR_XFER_E_REGION, .index = NONE, .block = NONE,
	  .region = 0 },
	{ .name = "regions overlap each other", .n_regions = 2, .regions = { { 0, 64, 64, 0 }, { 32, 64, 32, 0 } },
	  .num_blocks = 8, .kv_size = 1024, .arena_size = 4096, .n = 1, .ids = { 4 }, .slots = { 0 },
	  .rc = -EINVAL, .what = KVR_XFER_E_KV_OVERLAP, .index = 0, .block = 4, .region = 1 },
};

ParameterizedTestParameters(xfer_plan, table)
{
	return cr_make_param_array(struct plan_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct plan_case *c, xfer_plan, table)
{
	struct kvr_xfer_layout l = layout_of(c);
	struct kvr_xfer_run runs[MAXB * MAXR];
	struct kvr_xfer_err err = { .what = 12345 };
	uint64_t bytes = 777;
	int rc;

	rc = kvr_xfer_plan(&l, c->ids, c->slots, c->n, runs, MAXB * MAXR, &bytes, &err);
	cr_assert_eq(rc, c->rc, "%s: rc %d, expected %d", c->name, rc, c->rc);
	if (rc < 0) {
		char msg[160];
		kvr_xfer_err_format(&err, msg, sizeof(msg));
		cr_assert_eq(bytes, 777, "%s: ret_bytes written on failure", c->name);
		cr_assert_eq(err.what, c->what, "%s: what %u (%s), expected %u", c->name, err.what, msg, c->what);
		cr_assert_eq(err.index, c->index, "%s: index %u, expected %u (%s)", c->name, err.index, c->index, msg);
		cr_assert_eq(err.block_id, c->block, "%s: block %u, expected %u", c->name, err.block_id, c->block);
		cr_assert_eq(err.region, c->region, "%s: region %u, expected %u", c->name, err.region, c->region);
		return;
	}
	cr_assert_eq(err.what, 12345, "%s: err written on success", c->name);
	for (uint32_t k = 0; k < c->n_expect; k++)
		cr_assert(runs[k].kv_off == c->expect[k].kv_off && runs[k].slot_off == c->expect[k].slot_off &&
				  runs[k].len == c->expect[k].len,
			  "%s: run %u = {%lu, %lu, %lu}, expected {%lu, %lu, %lu}", c->name, k,
			  (unsigned long)runs[k].kv_off, (unsigned long)runs[k].slot_off, (unsigned long)runs[k].len,
			  (unsigned long)c->expect[k].kv_off, (unsigned long)c->expect[k].slot_off,
			  (unsigned long)c->expect[k].len);
	check_against_oracle(&l, c->ids, c->slots, c->n, runs, rc, bytes);
}

Test(xfer_plan, empty_request)
{
	struct kvr_xfer_region g = { 0, 64, 64, 0 };
	struct kvr_xfer_layout l = { .regions = &g, .n_regions = 1, .num_blocks = 4, .kv_size = 256, .arena_size = 64 };
	uint64_t bytes = 5;

	cr_assert_eq(kvr_xfer_plan(&l, NULL, NULL, 0, NULL, 0, &bytes, NULL), 0);
	cr_assert_eq(bytes, 0);
}

Test(xfer_plan, bad_arguments)
{
	struct kvr_xfer_region g = { 0, 64, 64, 60 }, bad = { 0, 64, 64, 65 };
	struct kvr_xfer_layout l = { .regions = &g, .n_regions = 1, .num_blocks = 4, .kv_size = 256, .arena_size = 64 };
	struct kvr_xfer_run runs[4];
	struct kvr_xfer_err err;
	uint32_t id = 0;
	uint64_t slot = 0;

	cr_assert_eq(kvr_xfer_plan(NULL, &id, &slot, 1, runs, 4, NULL, &err), -EINVAL);
	cr_assert_eq(err.what, KVR_XFER_E_ARG);
	cr_assert_eq(kvr_xfer_plan(&l, NULL, &slot, 1, runs, 4, NULL, &err), -EINVAL);
	cr_assert_eq(kvr_xfer_plan(&l, &id, &slot, 1, NULL, 4, NULL, &err), -EINVAL);
	l.n_regions = 0;
	cr_assert_eq(kvr_xfer_layout_check(&l, &err), -EINVAL);
	l.n_regions = KVR_XFER_MAX_REGIONS + 1;
	cr_assert_eq(kvr_xfer_layout_check(&l, &err), -EINVAL);
	l.n_regions = 1;
	l.num_blocks = 0;
	cr_assert_eq(kvr_xfer_layout_check(&l, &err), -EINVAL);
	cr_assert_eq(kvr_xfer_slot_bytes(&l), 0);
	l.num_blocks = 4;
	l.regions = &bad;
	cr_assert_eq(kvr_xfer_layout_check(&l, &err), -EINVAL);
	cr_assert_eq(err.what, KVR_XFER_E_REGION);
	l.regions = &g;
	cr_assert_eq(kvr_xfer_layout_check(&l, &err), 0);
	cr_assert_eq(kvr_xfer_slot_bytes(&l), 64);
}

Test(xfer_plan, capacity)
{
	/* layer-major K,V: 2 blocks -> 4 runs */
	struct kvr_xfer_region g[2] = { { 0, 64, 64, 0 }, { 1024, 64, 64, 0 } };
	struct kvr_xfer_layout l = { .regions = g, .n_regions = 2, .num_blocks = 16, .kv_size = 2048,
				     .arena_size = 4096 };
	uint32_t ids[4] = { 0, 1 }, rev[4] = { 3, 2, 1, 0 }, perm[4] = { 2, 0, 3, 1 };
	uint64_t slots[4] = { 0, 128 }, rslots[4] = { 192, 128, 64, 0 }, pslots[4] = { 128, 0, 192, 64 };
	struct kvr_xfer_run runs[8];
	struct kvr_xfer_err err;
	struct kvr_xfer_region one = { 0, 64, 64, 0 };
	struct kvr_xfer_layout l1 = { .regions = &one, .n_regions = 1, .num_blocks = 16, .kv_size = 1024,
				      .arena_size = 4096 };

	cr_assert_eq(kvr_xfer_plan_max_runs(2, 2), 4);
	cr_assert_eq(kvr_xfer_plan_max_runs(0xffffffffu, SIZE_MAX), SIZE_MAX);
	cr_assert_eq(kvr_xfer_plan(&l, ids, slots, 2, runs, 4, NULL, &err), 4);
	cr_assert_eq(kvr_xfer_plan(&l, ids, slots, 2, runs, 3, NULL, &err), -ENOSPC);
	cr_assert_eq(err.what, KVR_XFER_E_NOSPC);
	/* A reversed list merges while streaming: one run fits a cap of one. */
	cr_assert_eq(kvr_xfer_plan(&l1, rev, rslots, 4, runs, 1, NULL, &err), 1);
	cr_assert_eq(runs[0].len, 256);
	/* A permuted list merges only in the sort pass: it needs the worst-case cap. */
	cr_assert_eq(kvr_xfer_plan(&l1, perm, pslots, 4, runs, 1, NULL, &err), -ENOSPC);
	cr_assert_eq(kvr_xfer_plan(&l1, perm, pslots, 4, runs, kvr_xfer_plan_max_runs(1, 4), NULL, &err), 1);
	cr_assert(runs[0].kv_off == 0 && runs[0].slot_off == 0 && runs[0].len == 256);
}

Test(xfer_plan, error_text)
{
	struct kvr_xfer_err e = { KVR_XFER_E_BLOCK_ID, 3, 17, NONE };
	char buf[128];

	kvr_xfer_err_format(&e, buf, sizeof(buf));
	cr_assert_str_eq(buf, "block id out of range: block 17 (index 3)");
	e = (struct kvr_xfer_err){ KVR_XFER_E_REGION_RANGE, NONE, NONE, 2 };
	kvr_xfer_err_format(&e, buf, sizeof(buf));
	cr_assert_str_eq(buf, "region extends beyond the KV memory, region 2");
	cr_assert_str_eq(kvr_xfer_err_str(999), "unknown error");
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t test_seed(void)
{
	const char *e = getenv("KVR_TEST_SEED");
	return e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
}

/* Random layouts (layer-major, cross-layer, gapped, odd widths) and random id/slot
 * assignments, checked against the page-by-page oracle; contiguous assignments must
 * collapse to one run per maximal stretch. */
Test(xfer_plan, randomised_against_oracle)
{
	uint64_t seed = test_seed(), s = seed;
	fprintf(stderr, "xfer_plan.randomised_against_oracle seed=%#lx (KVR_TEST_SEED to repeat)\n",
		(unsigned long)seed);

	for (int iter = 0; iter < 300; iter++) {
		struct kvr_xfer_region g[6];
		uint32_t nr = 1 + (uint32_t)(rng_next(&s) % 6), nb = 1 + (uint32_t)(rng_next(&s) % 24);
		uint32_t kind = (uint32_t)(rng_next(&s) % 3);
		uint64_t off = rng_next(&s) % 13, slot_bytes = 0;
		uint32_t page[6];

		for (uint32_t r = 0; r < nr; r++) {
			page[r] = 1 + (uint32_t)(rng_next(&s) % 70);
			slot_bytes += page[r];
		}
		if (kind == 0) { /* layer-major: each region its own array of blocks */
			for (uint32_t r = 0; r < nr; r++) {
				uint64_t stride = page[r] + (rng_next(&s) % 2 ? 0 : rng_next(&s) % 9);
				g[r] = (struct kvr_xfer_region){ off, stride, page[r], 0 };
				off += stride * nb + rng_next(&s) % 5;
			}
		} else { /* cross-layer: one block holds every region, maybe with gaps */
			uint64_t in = 0;
			for (uint32_t r = 0; r < nr; r++) {
				g[r] = (struct kvr_xfer_region){ off + in, 0, page[r], 0 };
				in += page[r] + (kind == 2 ? rng_next(&s) % 4 : 0);
			}
			for (uint32_t r = 0; r < nr; r++)
				g[r].stride = in;
			off += in * nb;
		}
		struct kvr_xfer_layout l = { .regions = g, .n_regions = nr, .num_blocks = nb, .kv_size = off + 3 };

		/* choose n distinct ids and n distinct slots */
		uint32_t n = 1 + (uint32_t)(rng_next(&s) % nb), ids[24], perm[24];
		uint64_t slots[24];
		for (uint32_t i = 0; i < nb; i++)
			perm[i] = i;
		for (uint32_t i = nb - 1; i > 0; i--) {
			uint32_t j = (uint32_t)(rng_next(&s) % (i + 1)), t = perm[i];
			perm[i] = perm[j];
			perm[j] = t;
		}
		int sorted = rng_next(&s) % 2;
		for (uint32_t i = 0; i < n; i++)
			ids[i] = sorted ? i : perm[i];
		int packed = rng_next(&s) % 2;
		uint64_t slot_stride = slot_bytes + (packed ? 0 : 1 + rng_next(&s) % 16);
		for (uint32_t i = 0; i < n; i++)
			slots[i] = 5 + (uint64_t)(sorted ? i : ids[i]) * slot_stride;
		l.arena_size = 5 + (uint64_t)nb * slot_stride;

		struct kvr_xfer_run runs[24 * 6];
		struct kvr_xfer_err err;
		uint64_t bytes = 0;
		int rc = kvr_xfer_plan(&l, ids, slots, n, runs, kvr_xfer_plan_max_runs(nr, n), &bytes, &err);
		cr_assert_geq(rc, 1, "iter %d (seed %#lx): rc %d what %u", iter, (unsigned long)seed, rc, err.what);
		cr_assert_leq((uint32_t)rc, n * nr);
		check_against_oracle(&l, ids, slots, n, runs, rc, bytes);

		/* Fully contiguous on both sides: layout packed (cross-layer without gaps, or one
		 * region with stride == page), ids sorted consecutive, slots packed => one run. */
		int kv_packed = (kind == 1) || (kind == 0 && nr == 1 && g[0].stride == g[0].page_bytes);
		if (kv_packed && sorted && packed)
			cr_assert_eq(rc, 1, "iter %d (seed %#lx): contiguous plan gave %d runs", iter,
				     (unsigned long)seed, rc);
		if (kind == 1 && !packed)
			cr_assert_eq((uint32_t)rc, n, "iter %d: cross-layer must merge within each block", iter);
	}
}
