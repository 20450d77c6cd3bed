/* DCP layout tests: the split rule and rank counts against brute force, copy runs, cross-layout, tails, presets. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ipc/ipc_test.h"
#include "dcp_test.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"

TestSuite(dcp);

#define GUARD 64
#define GUARD_BYTE 0xa5

static void fill_random(uint8_t *p, size_t n, struct rng *r)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t v = rng_next(r);
		memcpy(p + i, &v, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)rng_next(r);
}

/* First byte in [p, p+n) that is not b, or -1. */
static long first_not(const uint8_t *p, size_t n, uint8_t b)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != b)
			return (long)i;
	return -1;
}

/* First differing byte, or -1. */
static long first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return (long)i;
	return -1;
}

/* ---- the rule and the counts ------------------------------------------------------- */

/* Does every block of block_tokens give every rank the same count (block_tokens / D) and
 * the same owner pattern as block 0? Blocks 0..D*I-1 cover every phase of the pattern. */
static bool bf_uniform(uint32_t bt, uint32_t d, uint32_t il)
{
	if (bt % d)
		return false;
	uint64_t period = (uint64_t)d * il;
	for (uint64_t b = 0; b < period; b++) {
		uint32_t count[KVR_DCP_MAX] = {0};
		for (uint64_t k = 0; k < bt; k++) {
			int o = bf_owner(b * bt + k, d, il);
			if (o != bf_owner(k, d, il))
				return false;
			count[o]++;
		}
		for (uint32_t r = 0; r < d; r++)
			if (count[r] != bt / d)
				return false;
	}
	return true;
}

Test(dcp, rule_matches_bruteforce)
{
	static const uint32_t ds[] = {1, 2, 3, 4, 8, 16};
	unsigned accepted = 0, rejected = 0;
	for (uint32_t bt = 1; bt <= 160; bt += bt < 48 ? 1 : 16) {
		for (unsigned di = 0; di < sizeof(ds) / sizeof(ds[0]); di++) {
			for (uint32_t il = 1; il <= bt + 2; il += il < 20 ? 1 : 37) {
				uint32_t d = ds[di];
				char err[KVR_GEOM_ERR_MAX];
				bool ok = kvr_dcp_check(bt, d, il, err, sizeof(err)) == 0;
				bool want = d == 1 || bf_uniform(bt, d, il);
				cr_assert_eq(ok, want, "block %u D %u I %u: check says %d (%s), brute force %d", bt, d,
					     il, ok, err, want);
				cr_assert_eq(ok, err[0] == '\0');
				if (ok)
					accepted++;
				else
					rejected++;
				cr_assert_eq(kvr_dcp_max_runs(bt, d, il) > 0, ok);
			}
		}
	}
	cr_assert_gt(accepted, 500);
	cr_assert_gt(rejected, 500);
	fprintf(stderr, "dcp rule: %u layouts accepted, %u rejected, all as brute force says\n", accepted, rejected);
}

Test(dcp, check_reasons)
{
	char err[KVR_GEOM_ERR_MAX];
	cr_assert_eq(kvr_dcp_check(16, 2, 16, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err,
			 "dcp: block_tokens 16 is not a multiple of dcp_size 2 x dcp_interleave 16 = 32 (in block 0 "
			 "rank 0 would hold 16 tokens, rank 1 0)");
	cr_assert_eq(kvr_dcp_check(24, 2, 8, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err,
			 "dcp: block_tokens 24 is not a multiple of dcp_size 2 x dcp_interleave 8 = 16 (in block 0 "
			 "rank 0 would hold 16 tokens, rank 1 8)");
	cr_assert_eq(kvr_dcp_check(128, 0, 1, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "dcp_size: 0 (must be 1..16)");
	cr_assert_eq(kvr_dcp_check(128, 17, 1, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "dcp_size: 17 (must be 1..16)");
	cr_assert_eq(kvr_dcp_check(128, 2, 0, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "dcp_interleave: must be > 0");
	cr_assert_eq(kvr_dcp_check(0, 2, 1, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "block_tokens: must be > 0");
	/* without DCP the interleave does not matter; the examples of the brief */
	cr_assert_eq(kvr_dcp_check(16, 1, 128, err, sizeof(err)), 0);
	cr_assert_str_eq(err, "");
	cr_assert_eq(kvr_dcp_check(128, 8, 16, NULL, 0), 0);
	cr_assert_eq(kvr_dcp_check(128, 8, 128, NULL, 0), -EINVAL);
	cr_assert_eq(kvr_dcp_check(16, 8, 2, NULL, 0), 0);
	cr_assert_eq(kvr_dcp_check(16, 8, 16, NULL, 0), -EINVAL);
}

Test(dcp, rank_tokens_bruteforce)
{
	static const uint32_t ds[] = {1, 2, 3, 4, 8, 16};
	static const uint32_t ils[] = {1, 2, 3, 16, 128};
	for (unsigned di = 0; di < 6; di++)
		for (unsigned ii = 0; ii < 5; ii++) {
			uint32_t d = ds[di], il = ils[ii];
			uint64_t count[KVR_DCP_MAX] = {0};
			for (uint64_t n = 0; n <= 300; n++) {
				uint64_t sum = 0;
				for (uint32_t r = 0; r < d; r++) {
					uint64_t got = kvr_dcp_rank_tokens(n, d, il, r);
					cr_assert_eq(got, count[r], "n %llu D %u I %u rank %u: %llu, brute force %llu",
						     (unsigned long long)n, d, il, r, (unsigned long long)got,
						     (unsigned long long)count[r]);
					sum += got;
				}
				cr_assert_eq(sum, n);
				if (n < 300)
					count[bf_owner(n, d, il)]++;
			}
			/* local j -> global, both ways */
			if (d > 1 && 128 % (d * il) == 0)
				for (uint32_t r = 0; r < d; r++)
					for (uint64_t j = 0; j < 128 / d; j++) {
						uint64_t t = kvr_dcp_global_token(j, d, il, r);
						cr_assert_eq(kvr_dcp_owner(t, d, il), r);
						cr_assert_eq(bf_owner(t, d, il), (int)r);
						cr_assert_eq(kvr_dcp_rank_tokens(t, d, il, r), j,
							     "t %llu is local %llu", (unsigned long long)t,
							     (unsigned long long)j);
					}
		}
	/* a large count: every rank of 8 with interleave 16 holds 1/8 of 2^40 tokens */
	cr_assert_eq(kvr_dcp_rank_tokens(1ull << 40, 8, 16, 7), 1ull << 37);
	cr_assert_eq(kvr_dcp_rank_tokens(100, 0, 1, 0), 0);
	cr_assert_eq(kvr_dcp_rank_tokens(100, 2, 0, 0), 0);
	cr_assert_eq(kvr_dcp_rank_tokens(100, 2, 1, 2), 0);
	/* a partial block: 70 tokens at D 4, I 16: rank 0 holds tokens 0..15 and 64..69 */
	cr_assert_eq(kvr_dcp_rank_tokens(70, 4, 16, 0), 16 + 6);
	cr_assert_eq(kvr_dcp_rank_tokens(70, 4, 16, 1), 16);
	cr_assert_eq(kvr_dcp_rank_tokens(70, 4, 16, 3), 16);
}

/* ---- one region: runs against brute force ------------------------------------------ */

Test(dcp, runs_match_bruteforce)
{
	static const uint32_t bts[] = {16, 128};
	static const uint32_t ds[] = {1, 2, 4, 8};
	static const uint32_t rows[] = {1, 2, 561, 576, 4095, 4097};
	struct rng rng = {test_seed("dcp::runs_match_bruteforce")};
	unsigned checked = 0, refused = 0;

	for (unsigned bi = 0; bi < 2; bi++)
		for (unsigned wi = 0; wi < 6; wi++) {
			uint32_t bt = bts[bi], row = rows[wi];
			uint64_t canon_bytes = (uint64_t)bt * row;
			/* canonical blocks sit at slot offset GUARD + 3, rank pages at GUARD + 5 (odd on
			 * purpose): src holds the truth (scatter source), gat receives the gather */
			const uint64_t soff = GUARD + 3, koff = GUARD + 5;
			const size_t slot_len = canon_bytes + 2 * GUARD + 3, kv_len = canon_bytes + 2 * GUARD + 5;
			uint8_t *truth = malloc(canon_bytes), *want = malloc(canon_bytes);
			uint8_t *src = malloc(slot_len), *gat = malloc(slot_len), *kv = malloc(kv_len);
			cr_assert(truth && want && src && gat && kv);
			fill_random(truth, canon_bytes, &rng);
			memset(src, GUARD_BYTE, slot_len);
			memcpy(src + soff, truth, canon_bytes);
			const uint32_t ils[] = {1, 2, 16, bt};
			for (unsigned di = 0; di < 4; di++)
				for (unsigned ii = 0; ii < 4; ii++) {
					uint32_t d = ds[di], il = ils[ii];
					struct kvr_dcp_run runs[160];
					if (kvr_dcp_check(bt, d, il, NULL, 0)) {
						struct kvr_region reg = {.page_bytes = row, .sem_bytes = row};
						cr_assert_eq(kvr_dcp_runs(&reg, row, bt, d, il, 0, 0, 0, runs, 160),
							     -EINVAL);
						refused++;
						continue;
					}
					memset(gat, GUARD_BYTE, slot_len);
					for (uint32_t r = 0; r < d; r++) {
						uint64_t n = kvr_dcp_rank_tokens(bt, d, il, r);
						cr_assert_eq(n, bt / d);
						struct kvr_region reg = {.page_bytes = (uint32_t)(n * row),
									 .sem_bytes = (uint32_t)(n * row)};
						int nr = kvr_dcp_runs(&reg, row, bt, d, il, r, koff, soff, runs, 160);
						/* I consecutive rows are one run; D = 1 is the page in one */
						int expect = d == 1 ? 1 : (int)(bt / (d * il));
						cr_assert_eq(nr, expect, "B %u D %u I %u row %u rank %u: %d runs", bt,
							     d, il, row, r, nr);
						cr_assert_leq((size_t)nr, kvr_dcp_max_runs(bt, d, il));
						uint64_t sum = 0;
						for (int i = 0; i < nr; i++) {
							if (d > 1)
								cr_assert_eq(runs[i].len, (uint64_t)il * row);
							if (i)
								cr_assert(runs[i].kv_off > runs[i - 1].kv_off &&
									  runs[i].slot_off > runs[i - 1].slot_off);
							sum += runs[i].len;
						}
						cr_assert_eq(sum, n * row);

						/* scatter: canonical -> the rank's page, guards untouched */
						memset(kv, GUARD_BYTE, kv_len);
						apply_runs(kv, src, runs, nr, KVR_XFER_SLOT_TO_KV);
						cr_assert_eq(bf_rank_rows(want, truth, row, bt, d, il, r), n);
						long at = first_diff(kv + koff, want, n * row);
						cr_assert_eq(at, -1, "B %u D %u I %u row %u rank %u: page byte %ld", bt,
							     d, il, row, r, at);
						cr_assert_eq(first_not(kv, koff, GUARD_BYTE), -1);
						cr_assert_eq(first_not(kv + koff + n * row, kv_len - koff - n * row,
								       GUARD_BYTE),
							     -1, "scatter wrote past the page");

						/* gather that page into the canonical block being assembled */
						apply_runs(kv, gat, runs, nr, KVR_XFER_KV_TO_SLOT);
						checked++;
					}
					long at = first_diff(gat + soff, truth, canon_bytes);
					cr_assert_eq(at, -1, "gather B %u D %u I %u row %u: canonical byte %ld", bt, d,
						     il, row, at);
					cr_assert_eq(first_not(gat, soff, GUARD_BYTE), -1);
					cr_assert_eq(first_not(gat + soff + canon_bytes, GUARD, GUARD_BYTE), -1);
				}
			cr_assert_eq(first_not(src, soff, GUARD_BYTE), -1, "the scatter source was only read");
			cr_assert_eq(first_diff(src + soff, truth, canon_bytes), -1);
			free(truth);
			free(want);
			free(src);
			free(gat);
			free(kv);
		}
	fprintf(stderr, "dcp runs: %u rank pages byte-exact both ways, %u layouts refused\n", checked, refused);
	/* per row width: block 16 holds 32 rank pages over 10 accepted layouts (6 refused),
	 * block 128 46 over 13 (3 refused) */
	cr_assert_eq(checked, 6 * (32 + 46));
	cr_assert_eq(refused, 6 * (6 + 3));
}

Test(dcp, runs_arguments)
{
	struct kvr_dcp_run runs[8], keep[8];
	memset(runs, 0x77, sizeof(runs));
	memcpy(keep, runs, sizeof(runs));
	struct kvr_region reg = {.page_bytes = 8 * 561 + 37, .sem_bytes = 8 * 561};
	/* 16 tokens, D 2, I 1: 8 rows a rank, 8 row runs + the tail */
	cr_assert_eq(kvr_dcp_max_runs(16, 2, 1), 9);
	cr_assert_eq(kvr_dcp_runs(&reg, 561, 16, 2, 1, 1, 0, 0, runs, 8), -ENOSPC);
	cr_assert_eq(memcmp(runs, keep, sizeof(runs)), 0, "runs untouched on failure");
	cr_assert_eq(kvr_dcp_runs(&reg, 561, 16, 2, 1, 2, 0, 0, runs, 8), -EINVAL, "rank >= D");
	cr_assert_eq(kvr_dcp_runs(&reg, 0, 16, 2, 1, 0, 0, 0, runs, 8), -EINVAL, "row 0");
	cr_assert_eq(kvr_dcp_runs(&reg, 560, 16, 2, 1, 0, 0, 0, runs, 8), -EINVAL, "sem is not rank rows x row");
	cr_assert_eq(kvr_dcp_runs(NULL, 561, 16, 2, 1, 0, 0, 0, runs, 8), -EINVAL);
	cr_assert_eq(kvr_dcp_runs(&reg, 561, 16, 2, 1, 0, 0, 0, NULL, 8), -EINVAL);
	cr_assert_eq(kvr_dcp_runs(&reg, 561, 16, 2, 16, 0, 0, 0, runs, 8), -EINVAL, "the rule");
	cr_assert_eq(kvr_dcp_runs(&reg, 561, 16, 2, 1, 0, UINT64_MAX - 100, 0, runs, 9), -EOVERFLOW);
	cr_assert_eq(kvr_dcp_runs(&reg, 561, 16, 2, 1, 0, 0, UINT64_MAX - 8000, runs, 9), -EOVERFLOW);
	cr_assert_eq(memcmp(runs, keep, sizeof(runs)), 0, "runs untouched on failure");
	struct kvr_region bad = {.page_bytes = 100, .sem_bytes = 8 * 561};
	cr_assert_eq(kvr_dcp_runs(&bad, 561, 16, 2, 1, 0, 0, 0, runs, 8), -EINVAL, "page < sem");

	/* rank 1's 9 runs: row t = 2j + 1 of the canonical rows, then its tail after rank 0's */
	struct kvr_dcp_run all[9];
	cr_assert_eq(kvr_dcp_runs(&reg, 561, 16, 2, 1, 1, 1000, 50000, all, 9), 9);
	for (unsigned j = 0; j < 8; j++) {
		cr_assert_eq(all[j].kv_off, 1000 + j * 561);
		cr_assert_eq(all[j].slot_off, 50000 + (2 * j + 1) * 561);
		cr_assert_eq(all[j].len, 561);
	}
	cr_assert_eq(all[8].kv_off, 1000 + 8 * 561);
	cr_assert_eq(all[8].slot_off, 50000 + 16 * 561 + 37);
	cr_assert_eq(all[8].len, 37);
	cr_assert_eq(kvr_dcp_canonical_page_bytes(561, 37, 16, 2), 16 * 561 + 2 * 37);
	cr_assert_eq(kvr_dcp_canonical_page_bytes(UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX), UINT64_MAX);
	/* D 1: rows and tail are one run whatever the interleave */
	struct kvr_region whole = {.page_bytes = 16 * 561 + 37, .sem_bytes = 16 * 561};
	cr_assert_eq(kvr_dcp_runs(&whole, 561, 16, 1, 7, 0, 5, 9, all, 1), 1);
	cr_assert(all[0].kv_off == 5 && all[0].slot_off == 9 && all[0].len == 16 * 561 + 37);
}

/* ---- a whole lane: heterogeneous regions, store under one layout, load under others ---- */

#define N_REG 6
static const uint32_t het_rows[N_REG] = {1, 2, 561, 576, 4095, 4097};

/* Rank geometry of the heterogeneous model: 6 layers, one region each with het_rows[l]
 * bytes a token (+ tail bytes), block_tokens bt, pages with a 48-byte gap between blocks. */
static struct kvr_geometry het_geom(uint32_t bt, uint32_t d, uint32_t il, uint32_t r, uint32_t num_blocks,
				    uint32_t tail)
{
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_mla(&g, N_REG, 8, 1, bt, num_blocks), 0);
	g.dcp_size = d;
	g.dcp_rank = r;
	g.dcp_interleave = il;
	uint64_t n = kvr_dcp_rank_tokens(bt, d, il, r), off = 0;
	for (unsigned i = 0; i < N_REG; i++) {
		uint32_t sem = (uint32_t)(n * het_rows[i]), page = sem + tail;
		struct kvr_region reg = {.offset = off, .stride = page + 48, .page_bytes = page, .sem_bytes = sem};
		cr_assert_eq(kvr_geometry_set_region(&g, i, &reg), 0);
		off += (uint64_t)(page + 48) * num_blocks + 16;
	}
	char err[KVR_GEOM_ERR_MAX];
	cr_assert_eq(kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), err, sizeof(err)), 0, "%s", err);
	return g;
}

struct rank_mem {
	struct kvr_geometry g;
	uint8_t *kv;
	uint64_t bytes;
};

static void rank_open(struct rank_mem *m, uint32_t bt, uint32_t d, uint32_t il, uint32_t r, uint32_t tail)
{
	m->g = het_geom(bt, d, il, r, 4, tail);
	m->bytes = kvr_geometry_kv_extent(&m->g) + GUARD;
	m->kv = malloc(m->bytes);
	cr_assert(m->kv);
	memset(m->kv, GUARD_BYTE, m->bytes);
}

/* The page of region i of block b of rank memory m. */
static uint8_t *rank_page(const struct rank_mem *m, unsigned i, uint32_t b)
{
	struct kvr_region reg = kvr_geometry_region(&m->g, i);
	return m->kv + reg.offset + (uint64_t)b * reg.stride;
}

/* Everything of m except block b's pages still holds GUARD_BYTE. */
static void assert_only_block(const struct rank_mem *m, uint32_t b, const char *what)
{
	uint64_t at = 0;
	for (unsigned i = 0; i < N_REG; i++) {
		uint64_t start = rank_page(m, i, b) - m->kv;
		long bad = first_not(m->kv + at, start - at, GUARD_BYTE);
		cr_assert_eq(bad, -1, "%s: byte %llu outside block %u's pages was written", what,
			     (unsigned long long)(at + (uint64_t)bad), b);
		at = start + m->g.page_bytes[i];
	}
	cr_assert_eq(first_not(m->kv + at, m->bytes - at, GUARD_BYTE), -1, "%s: past the last page", what);
}

/* Run the lane runs of rank memory m, block b, canonical lane at slot + slot_off. */
static void lane_copy(struct rank_mem *m, uint32_t b, uint8_t *slot, uint64_t slot_off, int dir)
{
	struct kvr_dcp_run runs[N_REG * 130];
	char err[KVR_GEOM_ERR_MAX];
	cr_assert_leq(kvr_dcp_lane_max_runs(&m->g), N_REG * 130);
	int n = kvr_dcp_lane_runs(&m->g, b, slot_off, runs, kvr_dcp_lane_max_runs(&m->g), err, sizeof(err));
	cr_assert_gt(n, 0, "lane runs: %d %s", n, err);
	apply_runs(m->kv, slot, runs, n, dir);
}

Test(dcp, cross_layout_heterogeneous)
{
	const uint32_t bt = 128;
	struct rng rng = {test_seed("dcp::cross_layout_heterogeneous")};
	/* the truth: canonical rows of every region of one block */
	uint64_t canon = 0, reg_off[N_REG];
	for (unsigned i = 0; i < N_REG; i++) {
		reg_off[i] = canon;
		canon += (uint64_t)bt * het_rows[i];
	}
	uint8_t *truth = malloc(canon);
	uint8_t *slot = malloc(canon + 2 * GUARD);
	cr_assert(truth && slot);
	fill_random(truth, canon, &rng);

	/* the engine under D 2, I 16 holds block 1 on each rank (brute force from the truth) */
	struct rank_mem st[2];
	for (uint32_t r = 0; r < 2; r++) {
		rank_open(&st[r], bt, 2, 16, r, 0);
		cr_assert_eq(kvr_dcp_canonical_lane_bytes(&st[r].g), canon);
		for (unsigned i = 0; i < N_REG; i++)
			cr_assert_eq(
				bf_rank_rows(rank_page(&st[r], i, 1), truth + reg_off[i], het_rows[i], bt, 2, 16, r),
				64);
	}
	/* store: gather both shards into one canonical lane */
	memset(slot, GUARD_BYTE, canon + 2 * GUARD);
	for (uint32_t r = 0; r < 2; r++)
		lane_copy(&st[r], 1, slot, GUARD, KVR_XFER_KV_TO_SLOT);
	long at = first_diff(slot + GUARD, truth, canon);
	cr_assert_eq(at, -1, "canonical byte %ld", at);
	cr_assert_eq(first_not(slot, GUARD, GUARD_BYTE), -1);
	cr_assert_eq(first_not(slot + GUARD + canon, GUARD, GUARD_BYTE), -1);
	for (uint32_t r = 0; r < 2; r++) {
		assert_only_block(&st[r], 1, "gather source");
		free(st[r].kv);
	}

	/* load under other layouts into block 2: each rank gets what that layout holds */
	static const uint32_t layouts[][2] = {{4, 1}, {1, 1}, {8, 16}, {2, 2}, {4, 32}, {2, 16}, {16, 8}};
	uint8_t *want = malloc((size_t)bt * 4097);
	cr_assert(want);
	for (unsigned li = 0; li < sizeof(layouts) / sizeof(layouts[0]); li++) {
		uint32_t d = layouts[li][0], il = layouts[li][1];
		for (uint32_t r = 0; r < d; r++) {
			struct rank_mem m;
			rank_open(&m, bt, d, il, r, 0);
			cr_assert_eq(kvr_dcp_canonical_lane_bytes(&m.g), canon);
			for (unsigned i = 0; i < N_REG; i++)
				cr_assert_eq(kvr_dcp_canonical_region_offset(&m.g, i), reg_off[i]);
			lane_copy(&m, 2, slot, GUARD, KVR_XFER_SLOT_TO_KV);
			for (unsigned i = 0; i < N_REG; i++) {
				uint64_t n = bf_rank_rows(want, truth + reg_off[i], het_rows[i], bt, d, il, r);
				cr_assert_eq(n, bt / d);
				at = first_diff(rank_page(&m, i, 2), want, n * het_rows[i]);
				cr_assert_eq(at, -1, "D %u I %u rank %u region %u (row %u): byte %ld", d, il, r, i,
					     het_rows[i], at);
			}
			assert_only_block(&m, 2, "scatter target");
			free(m.kv);
		}
	}
	/* the slot was only read */
	cr_assert_eq(first_diff(slot + GUARD, truth, canon), -1);
	free(want);
	free(truth);
	free(slot);
}

Test(dcp, lane_runs_merge_and_errors)
{
	/* D 1: a layer-major layout whose pages are consecutive merges into one run */
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_mla(&g, 3, 576, 2, 16, 1), 0);
	struct kvr_dcp_run runs[8];
	char err[KVR_GEOM_ERR_MAX];
	cr_assert_eq(kvr_dcp_canonical_lane_bytes(&g), kvr_geometry_lane_bytes(&g));
	cr_assert_eq(kvr_dcp_lane_runs(&g, 0, 4096, runs, 8, err, sizeof(err)), 1, "%s", err);
	cr_assert(runs[0].kv_off == 0 && runs[0].slot_off == 4096 && runs[0].len == 3 * 16 * 1152);

	/* with several blocks the pages of one block are apart: one run a region */
	cr_assert_eq(kvr_geometry_fill_vllm_mla(&g, 3, 576, 2, 16, 4), 0);
	cr_assert_eq(kvr_dcp_lane_runs(&g, 2, 0, runs, 8, err, sizeof(err)), 3);
	for (unsigned i = 0; i < 3; i++)
		cr_assert(runs[i].kv_off == i * 4 * 18432ull + 2 * 18432 && runs[i].slot_off == i * 18432ull &&
			  runs[i].len == 18432);

	cr_assert_eq(kvr_dcp_lane_runs(&g, 4, 0, runs, 8, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "block 4: >= num_blocks 4");
	cr_assert_eq(kvr_dcp_lane_runs(&g, 0, 0, runs, 2, err, sizeof(err)), -ENOSPC);
	cr_assert_str_eq(err, "3 runs needed, room for 2");
	g.dcp_size = 2;
	g.dcp_interleave = 16;
	cr_assert_eq(kvr_dcp_lane_runs(&g, 0, 0, runs, 8, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err,
			 "dcp: block_tokens 16 is not a multiple of dcp_size 2 x dcp_interleave 16 = 32 (in block 0 "
			 "rank 0 would hold 16 tokens, rank 1 0)");
	cr_assert_eq(kvr_dcp_canonical_lane_bytes(&g), 0);
	cr_assert_eq(kvr_dcp_lane_max_runs(&g), 0);
	g.dcp_interleave = 1;
	g.sem_bytes[1] = 8 * 1152 + 1; /* not whole rows of 8 tokens */
	cr_assert_eq(kvr_dcp_lane_runs(&g, 0, 0, runs, 8, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "region 1: sem_bytes 9217 is not whole rows of the 8 tokens DCP rank 0 holds");
	g.dcp_rank = 2;
	cr_assert_eq(kvr_dcp_lane_runs(&g, 0, 0, runs, 8, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "dcp_rank: 2 >= dcp_size 2");
}

/* ---- opaque page tails ---------------------------------------------------------------- */

#define TAIL 37

/* Gather the ranks' pages of block 0 (regions as given: rows + tail, or rows only for the
 * seed-002 bug) into slot, then scatter into fresh rank memories; returns the first byte of
 * rank r's region i page (rows and tail) that did not come back, or -1. */
static long tail_round_trip(struct rank_mem *src, struct rank_mem *dst, uint32_t d, uint8_t *slot, uint64_t canon,
			    bool drop_tail, unsigned *bad_rank, unsigned *bad_region)
{
	memset(slot, GUARD_BYTE, canon + 2 * GUARD);
	for (uint32_t r = 0; r < d; r++) {
		struct kvr_geometry g = src[r].g;
		if (drop_tail) /* the layout from the semantic shape alone: page = sem */
			for (unsigned i = 0; i < N_REG; i++)
				g.page_bytes[i] = g.sem_bytes[i];
		struct rank_mem view = {.g = g, .kv = src[r].kv, .bytes = src[r].bytes};
		lane_copy(&view, 0, slot, GUARD, KVR_XFER_KV_TO_SLOT);
	}
	for (uint32_t r = 0; r < d; r++) {
		struct kvr_geometry g = dst[r].g;
		if (drop_tail)
			for (unsigned i = 0; i < N_REG; i++)
				g.page_bytes[i] = g.sem_bytes[i];
		struct rank_mem view = {.g = g, .kv = dst[r].kv, .bytes = dst[r].bytes};
		lane_copy(&view, 0, slot, GUARD, KVR_XFER_SLOT_TO_KV);
	}
	for (uint32_t r = 0; r < d; r++)
		for (unsigned i = 0; i < N_REG; i++) {
			long at =
				first_diff(rank_page(&dst[r], i, 0), rank_page(&src[r], i, 0), src[r].g.page_bytes[i]);
			if (at >= 0) {
				*bad_rank = r;
				*bad_region = i;
				return at;
			}
		}
	return -1;
}

Test(dcp, tail_round_trip_and_dropped_tail)
{
	const uint32_t bt = 16;
	struct rng rng = {test_seed("dcp::tail_round_trip_and_dropped_tail")};
	static const uint32_t layouts[][2] = {{1, 1}, {2, 1}, {2, 8}, {4, 1}, {4, 2}, {8, 2}};
	for (unsigned li = 0; li < sizeof(layouts) / sizeof(layouts[0]); li++) {
		uint32_t d = layouts[li][0], il = layouts[li][1];
		struct rank_mem src[8], dst[8];
		for (uint32_t r = 0; r < d; r++) {
			rank_open(&src[r], bt, d, il, r, TAIL);
			rank_open(&dst[r], bt, d, il, r, TAIL);
			for (unsigned i = 0; i < N_REG; i++) {
				uint8_t *p = rank_page(&src[r], i, 0);
				fill_random(p, src[r].g.page_bytes[i], &rng);
				for (uint32_t k = 0; k < src[r].g.page_bytes[i]; k++)
					p[k] ^= p[k] == GUARD_BYTE; /* a lost byte always shows */
			}
		}
		uint64_t canon = kvr_dcp_canonical_lane_bytes(&src[0].g), rows = 0;
		for (unsigned i = 0; i < N_REG; i++)
			rows += (uint64_t)bt * het_rows[i];
		cr_assert_eq(canon, rows + (uint64_t)N_REG * d * TAIL, "a tail per rank per region");
		uint8_t *slot = malloc(canon + 2 * GUARD);
		cr_assert(slot);

		/* walking run k of every rank, then run k + 1, tiles the canonical lane front to
		 * back without a gap (what a gather stage does, kvr_dcp.h) */
		static struct kvr_dcp_run lr[8][N_REG * 20];
		int nk = -1;
		for (uint32_t r = 0; r < d; r++) {
			int n = kvr_dcp_lane_runs(&src[r].g, 0, 1000, lr[r], N_REG * 20, NULL, 0);
			cr_assert_gt(n, 0);
			cr_assert(nk < 0 || n == nk, "D %u: rank %u has %d runs, rank 0 %d", d, r, n, nk);
			nk = n;
		}
		uint64_t pos = 1000;
		for (int k = 0; k < nk; k++)
			for (uint32_t r = 0; r < d; r++) {
				cr_assert_eq(lr[r][k].slot_off, pos, "D %u I %u run %d rank %u", d, il, k, r);
				pos += lr[r][k].len;
			}
		cr_assert_eq(pos, 1000 + canon);

		unsigned br = 0, bg = 0;
		long at = tail_round_trip(src, dst, d, slot, canon, false, &br, &bg);
		cr_assert_eq(at, -1, "D %u I %u: rank %u region %u byte %ld did not round-trip", d, il, br, bg, at);
		/* in the canonical page the tails follow the rows, in rank order */
		for (uint32_t r = 0; r < d; r++)
			for (unsigned i = 0; i < N_REG; i++) {
				uint64_t tail_at = GUARD + kvr_dcp_canonical_region_offset(&src[r].g, i) +
						   (uint64_t)bt * het_rows[i] + r * TAIL;
				cr_assert_eq(
					memcmp(slot + tail_at, rank_page(&src[r], i, 0) + src[r].g.sem_bytes[i], TAIL),
					0, "D %u rank %u region %u: tail in the canonical page", d, r, i);
			}
		cr_assert_eq(first_not(slot + GUARD + canon, GUARD, GUARD_BYTE), -1);

		/* seed 002: the transfer view built from sem_bytes alone loses the tail, and the
		 * round-trip check above catches it at the tail's first byte */
		for (uint32_t r = 0; r < d; r++)
			memset(dst[r].kv, GUARD_BYTE, dst[r].bytes);
		uint64_t canon_sem = rows;
		at = tail_round_trip(src, dst, d, slot, canon_sem, true, &br, &bg);
		cr_assert_eq(at, (long)src[0].g.sem_bytes[0],
			     "D %u I %u: a dropped tail must fail the round trip at "
			     "byte %u, got %ld",
			     d, il, src[0].g.sem_bytes[0], at);
		cr_assert_eq(br, 0);
		cr_assert_eq(bg, 0);
		cr_assert_eq(first_not(rank_page(&dst[0], 0, 0) + src[0].g.sem_bytes[0], TAIL, GUARD_BYTE), -1,
			     "the tail was never written");

		for (uint32_t r = 0; r < d; r++) {
			free(src[r].kv);
			free(dst[r].kv);
		}
		free(slot);
	}

	/* tails bind a block to its layout; rows alone do not */
	cr_assert(kvr_dcp_layout_compatible(true, 2, 1, 2, 1));
	cr_assert_not(kvr_dcp_layout_compatible(true, 2, 1, 4, 1));
	cr_assert_not(kvr_dcp_layout_compatible(true, 2, 1, 2, 16));
	cr_assert(kvr_dcp_layout_compatible(true, 1, 1, 1, 16));
	cr_assert_not(kvr_dcp_layout_compatible(true, 1, 1, 2, 1));
	cr_assert(kvr_dcp_layout_compatible(false, 2, 16, 4, 1));
	cr_assert(kvr_dcp_layout_compatible(false, 1, 1, 8, 2));
}

/* ---- geometry validation under DCP ---------------------------------------------------- */

Test(dcp, geometry_validate_dcp)
{
	struct kvr_geometry g;
	char err[KVR_GEOM_ERR_MAX];
	/* MLA, 2 layers, 16-token canonical blocks, D 2: a rank's page holds 8 rows of 1152 */
	cr_assert_eq(kvr_geometry_fill_vllm_mla(&g, 2, 576, 2, 8, 4), 0);
	g.block_tokens = 16;
	g.dcp_size = 2;
	g.dcp_rank = 1;
	uint64_t kv = kvr_geometry_kv_extent(&g);
	cr_assert_eq(kvr_geometry_validate(&g, kv, err, sizeof(err)), 0, "%s", err);

	struct kvr_geometry b = g;
	b.dcp_interleave = 16;
	cr_assert_eq(kvr_geometry_validate(&b, kv, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err,
			 "dcp: block_tokens 16 is not a multiple of dcp_size 2 x dcp_interleave 16 = 32 (in block 0 "
			 "rank 0 would hold 16 tokens, rank 1 0)");
	b = g;
	b.dcp_size = 17;
	cr_assert_eq(kvr_geometry_validate(&b, kv, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "dcp_size: 17 (must be 1..16)");
	b = g;
	b.layout = KVR_LAYOUT_CROSS_LAYER;
	cr_assert_eq(kvr_geometry_validate(&b, kv, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "layout: 2 (DCP splits pages by token: dcp_size 2 needs layer-major pages)");
	b = g;
	b.sem_bytes[1] = 1001;
	cr_assert_eq(kvr_geometry_validate(&b, kv, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "region 1 (layer 1): sem_bytes 1001 is not whole rows of the 8 tokens DCP rank 1 holds");
	/* without DCP the rows rule does not apply ... */
	b = g;
	b.dcp_size = 1;
	b.dcp_rank = 0;
	b.sem_bytes[1] = 1001;
	cr_assert_eq(kvr_geometry_validate(&b, kv, err, sizeof(err)), 0, "%s", err);
	/* ... and an interleave means nothing: anything but 1 is refused (issue 22), even one
	 * that would split the block */
	b.dcp_interleave = 16;
	cr_assert_eq(kvr_geometry_validate(&b, kv, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "dcp_interleave: 16 with dcp_size 1 (without DCP it must be 1)");
}

/* ---- presets -------------------------------------------------------------------------- */

Test(dcp, presets_general_geometry)
{
	char err[KVR_GEOM_ERR_MAX];
	struct kvr_geometry g;

	/* DeepSeek-V3: 61 layers of one 576-element bf16 latent: 1152-byte rows */
	const struct kvr_preset *v3 = kvr_preset_find("deepseek-v3");
	cr_assert(v3);
	cr_assert_eq(kvr_preset_geometry(v3, 8, 5, 64, 100, &g), 0);
	cr_assert_eq(kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(g.n_regions, 61);
	cr_assert_eq(g.page_bytes[0], 64 * 1152);
	cr_assert_eq(kvr_geometry_lane_bytes(&g), 4497408ull);
	cr_assert_eq(kvr_geometry_lanes(&g), 1);

	/* DeepSeek-V3.2 fp8_ds_mla: 656-byte rows + a 132-byte-a-token indexer tail per page */
	const struct kvr_preset *f8 = kvr_preset_find("deepseek-v3.2-fp8");
	cr_assert(f8);
	cr_assert_eq(kvr_preset_geometry(f8, 4, 0, 64, 10, &g), 0);
	cr_assert_eq(kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), err, sizeof(err)), 0, "%s", err);
	for (unsigned i = 0; i < 61; i++) {
		struct kvr_region r = kvr_geometry_region(&g, i);
		cr_assert_eq(r.sem_bytes, 64 * 656);
		cr_assert_eq(r.page_bytes, 64 * 656 + 64 * 132);
		cr_assert_eq(r.stride, r.page_bytes);
		cr_assert_eq(r.offset, (uint64_t)i * 10 * r.page_bytes);
	}
	cr_assert_eq(kvr_geometry_lane_bytes(&g), 3076352ull);
	/* at DCP 4 a rank's page holds 16 rows and the tail of its 16 tokens (2112 bytes); the
	 * canonical lane keeps four tails a page: the same bytes as the DCP 1 lane */
	struct kvr_geometry d4 = g;
	d4.dcp_size = 4;
	d4.dcp_rank = 3;
	for (unsigned i = 0; i < 61; i++) {
		struct kvr_region r = {.offset = (uint64_t)i * 10 * (16 * 788),
				       .stride = 16 * 788,
				       .page_bytes = 16 * 788,
				       .sem_bytes = 16 * 656};
		cr_assert_eq(kvr_geometry_set_region(&d4, i, &r), 0);
	}
	cr_assert_eq(kvr_geometry_validate(&d4, kvr_geometry_kv_extent(&d4), err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvr_dcp_canonical_lane_bytes(&d4), 3076352ull);
	cr_assert_eq(kvr_dcp_lane_max_runs(&d4), 61 * (64 / 4 + 1));

	/* Qwen2.5-72B at TP 4: 80 layers x (K, V), 2 KV heads a rank of 128 bf16 */
	const struct kvr_preset *q = kvr_preset_find("qwen2.5-72b");
	cr_assert(q);
	cr_assert_eq(kvr_preset_geometry(q, 4, 3, 128, 50, &g), 0);
	cr_assert_eq(kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(g.n_regions, 160);
	cr_assert_eq(g.kv_heads, 2);
	cr_assert_eq(g.page_bytes[159], 128 * 2 * 128 * 2);
	cr_assert_eq(kvr_geometry_lane_bytes(&g), 10485760ull);
	cr_assert_eq(kvr_geometry_block_bytes_all_ranks(&g), 41943040ull);
	cr_assert_eq(kvr_preset_geometry(q, 3, 0, 128, 50, &g), -EINVAL, "8 heads do not split over 3 ranks");

	/* every preset builds and validates at 16 and 128 tokens */
	for (unsigned i = 0; i < kvr_preset_count(); i++) {
		const struct kvr_preset *p = kvr_preset_at(i);
		for (uint32_t bt = 16; bt <= 128; bt *= 8) {
			cr_assert_eq(kvr_preset_geometry(p, p->attention == KVR_ATTN_MLA ? 1 : p->kv_heads_total, 0, bt,
							 3, &g),
				     0, "%s", p->name);
			cr_assert_eq(kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), err, sizeof(err)), 0,
				     "%s: %s", p->name, err);
			cr_assert_eq(g.page_bytes[0] - g.sem_bytes[0], bt * p->tail_per_token, "%s", p->name);
		}
	}
	cr_assert(strstr(kvr_preset_list(), "deepseek-v3, deepseek-v3.2-fp8, qwen2.5-72b"));
}
