/* kvring-bench workload: the plan, synthetic prompts, per-block content seeds and the checkable byte pattern. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "bench.h"
#include "kvr_log.h"
#include "kvr_dcp.h"
#include "rvalue.h"

#define GOLDEN 0x9e3779b97f4a7c15ull
#define VOCAB 151936u                     /* Qwen's vocabulary: token ids stay realistic */
#define CHAIN_SEED 0x6b7672696e672d62ull  /* "kvring-b" */
#define PREFIX_TAG 0x7072656669780000ull  /* "prefix" */
#define TAIL_TAG 0x7461696c00000000ull    /* "tail" */

/* splitmix64's output function. */
static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Word i of the splitmix64 stream seeded by seed (counter form: any word in O(1)). */
static inline uint64_t stream_word(uint64_t seed, uint64_t i)
{
	return mix64(seed + (i + 1) * GOLDEN);
}

/* Geometry of rank 0 under (dcp, interleave), validated, and what it makes of one block. */
static int layout_make(const struct bench_opts *o, const struct bench_plan *pl, uint32_t dcp, uint32_t il,
		       struct bench_layout *ret, struct kvr_geometry *ret_g, char *err, size_t errlen)
{
	struct kvr_geometry g;
	int rc = bench_rank_geometry(o, pl, 0, dcp, il, &g);
	if (rc)
		return kvr_errf(err, errlen, -EINVAL, "--model %s with --tp %u --dcp %u --block-tokens %u: no geometry (%s; the TP "
			    "size of a lane, tp / dcp, must divide the %u KV heads or be a multiple of them)", o->model, o->tp,
			    dcp, o->block_tokens, strerror(-rc), pl->preset->kv_heads_total);
	char why[KVR_GEOM_ERR_MAX];
	if (kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), why, sizeof(why)))
		return kvr_errf(err, errlen, -EINVAL, "--model %s, dcp %u, interleave %u: invalid geometry: %s", o->model, dcp, il, why);
	size_t cap = kvr_dcp_lane_max_runs(&g);
	struct kvr_dcp_run *runs = calloc(cap ? cap : 1, sizeof(*runs));
	if (!runs)
		return kvr_errf(err, errlen, -EINVAL, "out of memory");
	int n = kvr_dcp_lane_runs(&g, 0, 0, runs, cap, why, sizeof(why));
	uint64_t longest = 0;
	for (int k = 0; k < n; k++)
		longest = runs[k].len > longest ? runs[k].len : longest;
	free(runs);
	if (n <= 0)
		return kvr_errf(err, errlen, -EINVAL, "--model %s, dcp %u, interleave %u: no copy runs: %s", o->model, dcp, il,
			    n ? why : "none");
	*ret = (struct bench_layout){.dcp = dcp, .interleave = il, .groups = o->tp / dcp,
				     .rank_bytes = kvr_geometry_lane_bytes(&g), .kv_bytes = kvr_geometry_kv_extent(&g),
				     .runs = (uint32_t)n, .run_bytes = longest};
	*ret_g = g;
	return 0;
}

int bench_plan_make(const struct bench_opts *o, struct bench_plan *ret, char *err, size_t errlen)
{
	struct bench_plan pl = {0};
	if (o->evict && !o->spawn)
		return kvr_errf(err, errlen, -EINVAL, "--evict needs --spawn: it sizes L1 small and gives kvringd an L2 directory");
	pl.preset = kvr_preset_find(o->model);
	if (!pl.preset)
		return kvr_errf(err, errlen, -EINVAL, "--model: unknown preset \"%s\" (known: %s)", o->model, kvr_preset_list());
	if (o->input_len < o->block_tokens)
		return kvr_errf(err, errlen, -EINVAL, "--input-len %u is shorter than one block (%u tokens): nothing to store",
			    o->input_len, o->block_tokens);
	if (o->prefix_len > o->input_len)
		return kvr_errf(err, errlen, -EINVAL, "--prefix-len %u is longer than --input-len %u", o->prefix_len, o->input_len);
	pl.full_blocks = o->input_len / o->block_tokens;
	pl.blocks_per_prompt = (o->input_len + o->block_tokens - 1) / o->block_tokens;
	uint64_t inflight = o->concurrency < o->prompts ? o->concurrency : o->prompts;
	uint64_t nb = inflight * pl.blocks_per_prompt;
	if (nb > UINT32_MAX)
		return kvr_errf(err, errlen, -EINVAL, "%llu engine blocks per rank: too many (lower --concurrency or --input-len)",
			    (unsigned long long)nb);
	pl.num_blocks = (uint32_t)nb;
	pl.prefix_blocks = o->prefix_len / o->block_tokens;

	uint32_t ld_dcp = bench_load_dcp(o), ld_il = bench_load_interleave(o);
	if (o->dcp == 0 || o->tp % o->dcp || ld_dcp == 0 || o->tp % ld_dcp)
		return kvr_errf(err, errlen, -EINVAL, "--dcp %u / --load-dcp %u must divide --tp %u", o->dcp, ld_dcp, o->tp);
	bool mla = pl.preset->attention == KVR_ATTN_MLA;
	struct kvr_geometry g, gl;
	int rc = layout_make(o, &pl, o->dcp, o->interleave, &pl.st, &g, err, errlen);
	if (!rc)
		rc = layout_make(o, &pl, ld_dcp, ld_il, &pl.ld, &gl, err, errlen);
	if (rc)
		return rc;
	bool cross = ld_dcp != o->dcp || (ld_dcp > 1 && ld_il != o->interleave);
	if (cross && !mla && ld_dcp != o->dcp)
		return kvr_errf(err, errlen, -EINVAL, "--load-dcp %u with --dcp %u: %s is MHA/GQA, whose lanes are tp / dcp (%u, %u): "
			    "one instance serves one of them", ld_dcp, o->dcp, o->model, o->tp / o->dcp, o->tp / ld_dcp);
	bool tail = kvr_geometry_has_tail(&g);
	if (cross && !kvr_dcp_layout_compatible(tail, o->dcp, o->interleave, ld_dcp, ld_il))
		return kvr_errf(err, errlen, -EINVAL, "--load-dcp %u --load-interleave %u: %s has page tails, whose blocks load only "
			    "under the layout that stored them (dcp %u, interleave %u)", ld_dcp, ld_il, o->model, o->dcp,
			    o->interleave);
	pl.storing_groups = mla ? 1 : pl.st.groups;
	pl.lanes = kvr_geometry_lanes(&g) / (mla ? 1 : o->dcp);
	pl.lane_bytes = kvr_dcp_canonical_lane_bytes(&g);
	pl.block_bytes = pl.lane_bytes * pl.lanes;
	pl.kv_bytes = pl.st.kv_bytes > pl.ld.kv_bytes ? pl.st.kv_bytes : pl.ld.kv_bytes;
	pl.unique_blocks = (uint64_t)pl.prefix_blocks + (uint64_t)o->prompts * (pl.full_blocks - pl.prefix_blocks);
	pl.unique_bytes = pl.unique_blocks * pl.block_bytes;
	pl.remote_value_bytes = KVR_RV_HDR_BYTES + pl.lane_bytes;
	*ret = pl;
	return 0;
}

int bench_rank_geometry(const struct bench_opts *o, const struct bench_plan *pl, uint32_t rank, uint32_t dcp,
			uint32_t interleave, struct kvr_geometry *ret)
{
	if (!dcp || !interleave || o->tp % dcp || o->block_tokens % dcp || rank >= o->tp)
		return -EINVAL;
	bool mla = pl->preset->attention == KVR_ATTN_MLA;
	struct kvr_geometry g;
	/* a page holds the rank's block_tokens / D tokens; MHA: the D ranks of a group share their lane's heads */
	int rc = kvr_preset_geometry(pl->preset, mla ? o->tp : o->tp / dcp, mla ? rank : rank / dcp,
				     o->block_tokens / dcp, pl->num_blocks, &g);
	if (rc)
		return rc;
	g.block_tokens = o->block_tokens;
	g.tp_size = o->tp;
	g.tp_rank = rank;
	g.dcp_size = dcp;
	g.dcp_rank = rank % dcp;
	g.dcp_interleave = interleave;
	*ret = g;
	return 0;
}

void bench_prompt_tokens(const struct bench_opts *o, uint32_t p, uint32_t *ret_tokens)
{
	uint64_t ps = mix64(o->seed ^ PREFIX_TAG), own = mix64(mix64(o->seed) + (uint64_t)p + 1);
	for (uint32_t j = 0; j < o->input_len; j++)
		ret_tokens[j] = (uint32_t)(stream_word(j < o->prefix_len ? ps : own, j) % VOCAB);
}

void bench_content_seeds(const uint32_t *tokens, uint32_t n_blocks, uint32_t block_tokens, uint64_t *ret_seeds)
{
	uint64_t s = CHAIN_SEED;
	for (uint32_t i = 0; i < n_blocks; i++) {
		s = XXH3_64bits_withSeed(tokens + (size_t)i * block_tokens, (size_t)block_tokens * sizeof(uint32_t), s);
		ret_seeds[i] = s;
	}
}

uint64_t bench_block_seed(uint64_t content_seed, uint32_t lane, bool mla)
{
	return mix64(content_seed ^ (mla ? 0 : ((uint64_t)lane + 1) * GOLDEN));
}

uint64_t bench_tail_seed(uint64_t seed, uint32_t dcp, uint32_t interleave)
{
	return dcp <= 1 ? seed : mix64(seed ^ TAIL_TAG ^ ((uint64_t)dcp << 32 | interleave));
}

void bench_pattern_fill(uint64_t seed, uint64_t pos, void *dst, size_t len)
{
	uint8_t *d = dst;
	uint64_t w = pos / 8;
	unsigned skip = (unsigned)(pos % 8);
	if (skip && len) {
		uint64_t v = stream_word(seed, w++);
		size_t n = 8 - skip < len ? 8 - skip : len;
		memcpy(d, (const uint8_t *)&v + skip, n);
		d += n;
		len -= n;
	}
	for (; len >= 8; len -= 8, d += 8) {
		uint64_t v = stream_word(seed, w++);
		memcpy(d, &v, 8);
	}
	if (len) {
		uint64_t v = stream_word(seed, w);
		memcpy(d, &v, len);
	}
}

int64_t bench_pattern_check(uint64_t seed, uint64_t pos, const void *src, size_t len)
{
	const uint8_t *s = src;
	size_t off = 0;
	uint8_t want[8];
	while (off < len) {
		uint64_t p = pos + off, w = p / 8, v = stream_word(seed, w);
		unsigned skip = (unsigned)(p % 8);
		if (!skip && len - off >= 8) {
			uint64_t got;
			memcpy(&got, s + off, 8);
			if (got == v) {
				off += 8;
				continue;
			}
		}
		size_t n = 8 - skip < len - off ? 8 - skip : len - off;
		memcpy(want, (const uint8_t *)&v + skip, n);
		if (memcmp(s + off, want, n)) {
			for (size_t k = 0; k < n; k++)
				if (s[off + k] != want[k])
					return (int64_t)(off + k);
		}
		off += n;
	}
	return -1;
}

static uint8_t *page_of(const struct kvr_geometry *g, const uint8_t *kv, uint32_t block, unsigned r, uint32_t *ret_len)
{
	struct kvr_region reg = kvr_geometry_region(g, r);
	*ret_len = reg.page_bytes;
	return (uint8_t *)kv + reg.offset + (uint64_t)block * reg.stride;
}

/* Walk the pieces of engine block `block` (bench_block_fill's contract): for each run of
 * consecutive global rows and each tail, `fn` gets the page bytes, the pattern seed and the
 * canonical lane position. Stops at the first piece fn refuses (returns false). */
static bool walk_block(const struct kvr_geometry *g, const uint8_t *kv, uint32_t block, uint64_t seed,
		       bool (*fn)(uint8_t *p, uint64_t seed, uint64_t pos, uint32_t len))
{
	uint32_t d = g->dcp_size ? g->dcp_size : 1, il = g->dcp_interleave ? g->dcp_interleave : 1;
	uint32_t rt = g->block_tokens / d;
	uint64_t tseed = bench_tail_seed(seed, d, il), off = 0;
	for (unsigned i = 0; i < g->n_regions; i++) {
		uint32_t len;
		uint8_t *p = page_of(g, kv, block, i, &len);
		if (d == 1) { /* the canonical page is the page: one piece */
			if (!fn(p, seed, off, len))
				return false;
			off += len;
			continue;
		}
		uint32_t sem = g->sem_bytes[i], row = sem / rt, tail = len - sem;
		for (uint32_t j = 0; j < rt; j += il) { /* I local rows are I consecutive global rows */
			uint64_t t = kvr_dcp_global_token(j, d, il, g->dcp_rank);
			if (!fn(p + (uint64_t)j * row, seed, off + t * row, il * row))
				return false;
		}
		if (tail && !fn(p + sem, tseed, off + (uint64_t)g->block_tokens * row + (uint64_t)g->dcp_rank * tail, tail))
			return false;
		off += kvr_dcp_canonical_page_bytes(row, tail, g->block_tokens, d);
	}
	return true;
}

static bool fill_piece(uint8_t *p, uint64_t seed, uint64_t pos, uint32_t len)
{
	bench_pattern_fill(seed, pos, p, len);
	return true;
}

static bool check_piece(uint8_t *p, uint64_t seed, uint64_t pos, uint32_t len)
{
	return bench_pattern_check(seed, pos, p, len) < 0;
}

void bench_block_fill(const struct kvr_geometry *g, uint8_t *kv, uint32_t block, uint64_t seed)
{
	(void)walk_block(g, kv, block, seed, fill_piece);
}

bool bench_block_check(const struct kvr_geometry *g, const uint8_t *kv, uint32_t block, uint64_t seed)
{
	return walk_block(g, kv, block, seed, check_piece);
}

void bench_block_zero(const struct kvr_geometry *g, uint8_t *kv, uint32_t block)
{
	for (unsigned r = 0; r < g->n_regions; r++) {
		uint32_t len;
		uint8_t *p = page_of(g, kv, block, r, &len);
		memset(p, 0, len);
	}
}

bool bench_block_is_zero(const struct kvr_geometry *g, const uint8_t *kv, uint32_t block)
{
	for (unsigned r = 0; r < g->n_regions; r++) {
		uint32_t len;
		const uint8_t *p = page_of(g, kv, block, r, &len);
		if (len && (p[0] || memcmp(p, p + 1, len - 1)))
			return false;
	}
	return true;
}
