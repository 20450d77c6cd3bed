/* kvring-bench workload: the plan, synthetic prompts, per-block content seeds and the checkable byte pattern. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <xxhash.h>

#include "bench.h"

#define GOLDEN 0x9e3779b97f4a7c15ull
#define VOCAB 151936u                     /* Qwen's vocabulary: token ids stay realistic */
#define CHAIN_SEED 0x6b7672696e672d62ull  /* "kvring-b" */
#define PREFIX_TAG 0x7072656669780000ull  /* "prefix" */

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	if (errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

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

int bench_plan_make(const struct bench_opts *o, struct bench_plan *ret, char *err, size_t errlen)
{
	struct bench_plan pl = {0};
	if (o->evict && !o->spawn)
		return fail(err, errlen, "--evict needs --spawn: it sizes L1 small and gives kvringd an L2 directory");
	if (o->dcp)
		return fail(err, errlen, "--dcp: the decode-context-parallel workload is not implemented yet");
	pl.preset = kvr_preset_find(o->model);
	if (!pl.preset)
		return fail(err, errlen, "--model: unknown preset \"%s\" (known: %s)", o->model, kvr_preset_list());
	if (o->input_len < o->block_tokens)
		return fail(err, errlen, "--input-len %u is shorter than one block (%u tokens): nothing to store",
			    o->input_len, o->block_tokens);
	if (o->prefix_len > o->input_len)
		return fail(err, errlen, "--prefix-len %u is longer than --input-len %u", o->prefix_len, o->input_len);
	pl.full_blocks = o->input_len / o->block_tokens;
	pl.blocks_per_prompt = (o->input_len + o->block_tokens - 1) / o->block_tokens;
	uint64_t inflight = o->concurrency < o->prompts ? o->concurrency : o->prompts;
	uint64_t nb = inflight * pl.blocks_per_prompt;
	if (nb > UINT32_MAX)
		return fail(err, errlen, "%llu engine blocks per rank: too many (lower --concurrency or --input-len)",
			    (unsigned long long)nb);
	pl.num_blocks = (uint32_t)nb;
	pl.prefix_blocks = o->prefix_len / o->block_tokens;

	struct kvr_geometry g;
	int rc = kvr_preset_geometry(pl.preset, o->tp, 0, o->block_tokens, pl.num_blocks, &g);
	if (rc)
		return fail(err, errlen, "--model %s with --tp %u --block-tokens %u: no geometry (%s; TP must divide the "
			    "%u KV heads or be a multiple of them)", o->model, o->tp, o->block_tokens, strerror(-rc),
			    pl.preset->kv_heads_total);
	pl.lanes = kvr_geometry_lanes(&g);
	pl.lane_bytes = kvr_geometry_lane_bytes(&g);
	pl.block_bytes = kvr_geometry_block_bytes_all_ranks(&g);
	pl.kv_bytes = kvr_geometry_kv_extent(&g);
	pl.unique_blocks = (uint64_t)pl.prefix_blocks + (uint64_t)o->prompts * (pl.full_blocks - pl.prefix_blocks);
	pl.unique_bytes = pl.unique_blocks * pl.block_bytes;
	*ret = pl;
	return 0;
}

int bench_rank_geometry(const struct bench_opts *o, const struct bench_plan *pl, uint32_t rank,
			struct kvr_geometry *ret)
{
	return kvr_preset_geometry(pl->preset, o->tp, rank, o->block_tokens, pl->num_blocks, ret);
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

uint64_t bench_block_seed(uint64_t content_seed, uint32_t rank, bool mla)
{
	return mix64(content_seed ^ (mla ? 0 : ((uint64_t)rank + 1) * GOLDEN));
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

void bench_block_fill(const struct kvr_geometry *g, uint8_t *kv, uint32_t block, uint64_t seed)
{
	uint64_t pos = 0;
	for (unsigned r = 0; r < g->n_regions; r++) {
		uint32_t len;
		uint8_t *p = page_of(g, kv, block, r, &len);
		bench_pattern_fill(seed, pos, p, len);
		pos += len;
	}
}

bool bench_block_check(const struct kvr_geometry *g, const uint8_t *kv, uint32_t block, uint64_t seed)
{
	uint64_t pos = 0;
	for (unsigned r = 0; r < g->n_regions; r++) {
		uint32_t len;
		const uint8_t *p = page_of(g, kv, block, r, &len);
		if (bench_pattern_check(seed, pos, p, len) >= 0)
			return false;
		pos += len;
	}
	return true;
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
