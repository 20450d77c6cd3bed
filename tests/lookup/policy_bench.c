/* Eviction-policy bench: replays a bench-like block trace through the index at several cache sizes, LRU vs S3-FIFO. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_index.h"
#include "kvr_time.h"
#include "../l1/l1_test.h"

/*
 * The trace, in blocks (chained keys, as kvring computes them):
 *   - 8 system prompts of 12 blocks, the shared prefix of every conversation;
 *   - 600 conversations (documents + chat), 8..40 blocks after their system prompt, chosen
 *     with Zipf(1.0) popularity: popular ones repeat; 30% of repeats are a follow-up turn
 *     that appends 2 new blocks to that conversation;
 *   - 15% one-off scans: a unique 60..100-block document nobody asks for again.
 * Each request is a lookup (leading hits counted) followed by a store of its blocks
 * (suffix-only) and their commit, exactly as the lookup actor will see them.
 */

#define N_REQ 20000
#define N_SYS 8
#define SYS_BLOCKS 12
#define N_CONV 600
#define MAX_TURNS 20

struct trace {
	kvr_key *keys;
	uint32_t *off; /* request r is keys[off[r] .. off[r+1]) */
	uint32_t n_req;
	uint64_t n_keys, unique;
};

static kvr_key chain(kvr_key prev, uint64_t a, uint64_t b)
{
	uint64_t in[4] = {prev.lo, prev.hi, a, b};
	return kvr_key_hash(in, sizeof(in));
}

static uint32_t zipf(const double *cdf, uint32_t n, struct rng *seed)
{
	double u = (double)(rng_next(seed) >> 11) / (double)(1ull << 53);
	uint32_t lo = 0, hi = n - 1;
	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;
		if (cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Distinct keys in the trace (an open-addressing set). */
static uint64_t count_unique(const kvr_key *keys, uint64_t n)
{
	uint64_t cap = 1;
	while (cap < 2 * n)
		cap <<= 1;
	kvr_key *set = calloc(cap, sizeof(*set));
	if (!set)
		return 0;
	uint64_t u = 0;
	for (uint64_t i = 0; i < n; i++) {
		for (uint64_t h = keys[i].lo & (cap - 1);; h = (h + 1) & (cap - 1)) {
			if (kvr_key_is_zero(set[h])) {
				set[h] = keys[i];
				u++;
				break;
			}
			if (kvr_key_eq(set[h], keys[i]))
				break;
		}
	}
	free(set);
	return u;
}

static int make_trace(struct rng seed, struct trace *tr)
{
	double cdf[N_CONV], sum = 0;
	for (uint32_t i = 0; i < N_CONV; i++)
		sum += 1.0 / (i + 1);
	double acc = 0;
	for (uint32_t i = 0; i < N_CONV; i++) {
		acc += 1.0 / (i + 1) / sum;
		cdf[i] = acc;
	}
	cdf[N_CONV - 1] = 1.0;

	uint32_t conv_len[N_CONV], turns[N_CONV] = {0};
	for (uint32_t i = 0; i < N_CONV; i++)
		conv_len[i] = 8 + (uint32_t)(rng_next(&seed) % 33);
	size_t cap = (size_t)N_REQ * (SYS_BLOCKS + 40 + 2 * MAX_TURNS + 100);
	tr->keys = malloc(cap * sizeof(*tr->keys));
	tr->off = malloc((N_REQ + 1) * sizeof(*tr->off));
	if (!tr->keys || !tr->off)
		return -ENOMEM;
	const kvr_key ns = {0x6b7672696e67, 1};
	uint64_t k = 0;
	for (uint32_t r = 0; r < N_REQ; r++) {
		tr->off[r] = (uint32_t)k;
		kvr_key prev = ns;
		if (rng_next(&seed) % 100 < 15) {
			uint32_t n = 60 + (uint32_t)(rng_next(&seed) % 41);
			for (uint32_t i = 0; i < n; i++)
				tr->keys[k++] = prev = chain(prev, 0x5ca0000000ull + r, i);
			continue;
		}
		uint32_t c = zipf(cdf, N_CONV, &seed);
		if (turns[c] < MAX_TURNS && rng_next(&seed) % 100 < 30)
			turns[c]++;
		uint32_t s = c % N_SYS;
		for (uint32_t i = 0; i < SYS_BLOCKS; i++)
			tr->keys[k++] = prev = chain(prev, 0x5050000000ull + s, i);
		uint32_t body = conv_len[c] + 2 * turns[c];
		for (uint32_t i = 0; i < body; i++)
			tr->keys[k++] = prev = chain(prev, 0xc0000000ull + c, i);
	}
	tr->off[N_REQ] = (uint32_t)k;
	tr->n_req = N_REQ;
	tr->n_keys = k;
	tr->unique = count_unique(tr->keys, k);
	return tr->unique ? 0 : -ENOMEM;
}

struct result {
	uint64_t hits, evictions, noroom;
	double us_per_req;
};

static int replay(const struct trace *tr, uint32_t n_slots, const char *policy, struct result *res)
{
	size_t sz = kvr_slots_memsize(n_slots);
	void *mem = aligned_alloc(64, (sz + 63) & ~(size_t)63);
	if (!mem)
		return -ENOMEM;
	memset(mem, 0, sz);
	struct kvr_slot_table *t;
	struct kvr_slots_config cfg = {.n_slots = n_slots, .lane_bytes = 4096, .block_tokens = 128, .tp_size = 1,
				       .quorum = 1};
	struct kvr_index *idx = NULL;
	struct kvr_index_ref *refs = malloc(256 * sizeof(*refs));
	int rc = refs ? kvr_slots_init(mem, sz, &cfg, &t) : -ENOMEM;
	if (!rc)
		rc = kvr_index_new(t, policy, &idx);
	if (rc)
		goto out;
	*res = (struct result){0};
	uint64_t t0 = kvr_now_ns();
	for (uint32_t r = 0; r < tr->n_req; r++) {
		const kvr_key *keys = tr->keys + tr->off[r];
		uint32_t n = tr->off[r + 1] - tr->off[r];
		int m = kvr_index_match(idx, keys, n, 0, NULL);
		if (m < 0) {
			rc = m;
			goto out;
		}
		res->hits += (uint64_t)m;
		struct kvr_index_alloc_stats st;
		rc = kvr_index_alloc(idx, keys, n, 0, 0, refs, &st);
		if (rc)
			goto out;
		for (uint32_t i = 0; i < n; i++) {
			if (refs[i].slot >= KVR_INDEX_NOROOM)
				continue;
			rc = kvr_index_commit(idx, 0, refs[i].slot, refs[i].epoch);
			if (rc < 0)
				goto out;
		}
		res->evictions += st.evicted;
		res->noroom += st.noroom;
	}
	res->us_per_req = (double)(kvr_now_ns() - t0) / 1e3 / tr->n_req;
	rc = 0;
out:
	kvr_index_free(idx);
	free(refs);
	free(mem);
	return rc;
}

int main(void)
{
	uint64_t seed = 42;
	const char *env = getenv("KVR_TEST_SEED");
	if (env && *env)
		seed = strtoull(env, NULL, 0);
	struct trace tr;
	if (make_trace((struct rng){seed}, &tr)) {
		fprintf(stderr, "policy_bench: out of memory\n");
		return 1;
	}
	/* an infinite cache misses only a block's first appearance */
	uint64_t inf_hits = 0;
	struct result inf;
	if (replay(&tr, (uint32_t)tr.unique, "lru", &inf)) {
		fprintf(stderr, "policy_bench: replay failed\n");
		return 1;
	}
	inf_hits = inf.hits;
	printf("policy_bench: seed %llu (KVR_TEST_SEED), %u requests, %llu blocks, %llu distinct\n",
	       (unsigned long long)seed, tr.n_req, (unsigned long long)tr.n_keys, (unsigned long long)tr.unique);
	printf("infinite cache: hit ratio %.2f%% (%llu evictions)\n\n", 100.0 * inf_hits / tr.n_keys,
	       (unsigned long long)inf.evictions);
	printf("%12s %8s | %9s %9s | %10s %10s | %8s %8s\n", "cache blocks", "% dist.", "lru hit%", "s3 hit%",
	       "lru evict", "s3 evict", "lru us/r", "s3 us/r");
	static const double frac[] = {0.01, 0.02, 0.05, 0.10, 0.20, 0.40};
	int bad = inf.evictions != 0;
	for (size_t i = 0; i < sizeof(frac) / sizeof(frac[0]); i++) {
		uint32_t n = (uint32_t)(tr.unique * frac[i]);
		struct result lru, s3;
		if (replay(&tr, n, "lru", &lru) || replay(&tr, n, "s3fifo", &s3)) {
			fprintf(stderr, "policy_bench: replay failed at %u blocks\n", n);
			return 1;
		}
		printf("%12u %7.0f%% | %8.2f%% %8.2f%% | %10llu %10llu | %8.2f %8.2f\n", n, frac[i] * 100,
		       100.0 * lru.hits / tr.n_keys, 100.0 * s3.hits / tr.n_keys, (unsigned long long)lru.evictions,
		       (unsigned long long)s3.evictions, lru.us_per_req, s3.us_per_req);
		/* no policy can beat the infinite cache, and a full cache must evict */
		if (lru.hits > inf_hits || s3.hits > inf_hits || !lru.evictions || !s3.evictions)
			bad = 1;
	}
	free(tr.keys);
	free(tr.off);
	if (bad)
		fprintf(stderr, "policy_bench: inconsistent counts\n");
	return bad;
}
