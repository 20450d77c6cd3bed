/* Block-key tests: chained hash against a reference, prefix property, extra keys, formatting, speed. */
#include <criterion/criterion.h>

#include <errno.h>
#include <string.h>
#include <xxhash.h>

#include "kvr_keys.h"
#include "../ipc/ipc_test.h"

TestSuite(keys);

static const kvr_key NS = {0x0123456789abcdefull, 0xfedcba9876543210ull};

/* k_i = XXH3_128(k_{i-1} || tokens of block i || extra), assembled naively. */
static size_t reference_chain(kvr_key ns, const uint32_t *tok, size_t n_tok, uint32_t bt, const void *extra,
			      size_t extra_len, kvr_key *out)
{
	size_t n = n_tok / bt, len = 16 + (size_t)bt * 4 + extra_len;
	uint8_t *buf = malloc(len);
	cr_assert_not_null(buf);
	kvr_key prev = ns;
	for (size_t i = 0; i < n; i++) {
		memcpy(buf, &prev.lo, 8);
		memcpy(buf + 8, &prev.hi, 8);
		memcpy(buf + 16, tok + i * bt, (size_t)bt * 4);
		if (extra_len)
			memcpy(buf + 16 + (size_t)bt * 4, extra, extra_len);
		XXH128_hash_t h = XXH3_128bits(buf, len);
		prev = (kvr_key){h.low64, h.high64};
		out[i] = prev;
	}
	free(buf);
	return n;
}

static uint32_t *random_tokens(struct rng *seed, size_t n)
{
	uint32_t *t = malloc(n * sizeof(*t));
	cr_assert_not_null(t);
	for (size_t i = 0; i < n; i++)
		t[i] = (uint32_t)(rng_next(seed) % 152064); /* a vocabulary size */
	return t;
}

Test(keys, matches_reference)
{
	struct rng seed = {test_seed("keys.matches_reference")};
	uint32_t *tok = random_tokens(&seed, 20000);
	uint8_t extra[9000];
	for (size_t i = 0; i < sizeof(extra); i++)
		extra[i] = (uint8_t)rng_next(&seed);
	static const struct {
		uint32_t bt;
		size_t n_tok, extra_len;
	} cases[] = {
		{128, 10000, 0}, {16, 10000, 0}, {128, 10000, 8}, {16, 1000, 40},
		{2048, 20000, 0},   /* 16 + 8192 bytes: the streaming path */
		{128, 10000, 9000}, /* a large extra: the streaming path */
		{1, 50, 0}, {128, 127, 0},
	};
	kvr_key got[20000], want[20000];
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		size_t n = reference_chain(NS, tok, cases[c].n_tok, cases[c].bt, extra, cases[c].extra_len, want);
		int rc = kvr_keys_chain(NS, tok, cases[c].n_tok, cases[c].bt, extra, cases[c].extra_len, got, 20000);
		cr_assert_eq(rc, (int)n, "case %zu: %d keys, want %zu", c, rc, n);
		cr_assert_eq(rc, (int)(cases[c].n_tok / cases[c].bt));
		for (size_t i = 0; i < n; i++)
			cr_assert(kvr_key_eq(got[i], want[i]), "case %zu key %zu", c, i);
	}
	free(tok);
}

Test(keys, prefix_property)
{
	struct rng seed = {test_seed("keys.prefix_property")};
	uint32_t *a = random_tokens(&seed, 10000);
	uint32_t *b = malloc(10000 * sizeof(*b));
	memcpy(b, a, 10000 * sizeof(*b));
	kvr_key ka[78], kb[78];
	cr_assert_eq(kvr_keys_chain(NS, a, 10000, 128, NULL, 0, ka, 78), 78);

	/* same first blocks (and a different tail) -> same first keys */
	for (size_t i = 7 * 128; i < 10000; i++)
		b[i] = a[i] + 1;
	cr_assert_eq(kvr_keys_chain(NS, b, 10000, 128, NULL, 0, kb, 78), 78);
	for (int i = 0; i < 7; i++)
		cr_assert(kvr_key_eq(ka[i], kb[i]), "shared block %d", i);
	for (int i = 7; i < 78; i++)
		cr_assert_not(kvr_key_eq(ka[i], kb[i]), "block %d", i);

	/* one token changed in block 3 -> keys 0..2 equal, 3.. all differ */
	memcpy(b, a, 10000 * sizeof(*b));
	b[3 * 128 + 77] ^= 1;
	cr_assert_eq(kvr_keys_chain(NS, b, 10000, 128, NULL, 0, kb, 78), 78);
	for (int i = 0; i < 3; i++)
		cr_assert(kvr_key_eq(ka[i], kb[i]), "block %d before the change", i);
	for (int i = 3; i < 78; i++)
		cr_assert_not(kvr_key_eq(ka[i], kb[i]), "block %d from the change on", i);

	/* a shorter prompt: keys of its full blocks equal the longer one's */
	cr_assert_eq(kvr_keys_chain(NS, a, 1000, 128, NULL, 0, kb, 78), 7);
	for (int i = 0; i < 7; i++)
		cr_assert(kvr_key_eq(ka[i], kb[i]));

	/* extra keys (a LoRA id) change every key; another namespace too */
	uint32_t lora = 3;
	cr_assert_eq(kvr_keys_chain(NS, a, 10000, 128, &lora, sizeof(lora), kb, 78), 78);
	for (int i = 0; i < 78; i++)
		cr_assert_not(kvr_key_eq(ka[i], kb[i]), "extra: block %d", i);
	kvr_key lora3[78];
	memcpy(lora3, kb, sizeof(kb));
	lora = 4;
	cr_assert_eq(kvr_keys_chain(NS, a, 10000, 128, &lora, sizeof(lora), kb, 78), 78);
	for (int i = 0; i < 78; i++)
		cr_assert_not(kvr_key_eq(lora3[i], kb[i]), "lora 3 vs 4: block %d", i);
	kvr_key ns2 = {NS.lo + 1, NS.hi};
	cr_assert_eq(kvr_keys_chain(ns2, a, 10000, 128, NULL, 0, kb, 78), 78);
	for (int i = 0; i < 78; i++)
		cr_assert_not(kvr_key_eq(ka[i], kb[i]), "namespace: block %d", i);
	/* the same tokens as 16-token blocks: no key equal to a 128-token key */
	kvr_key k16[625];
	cr_assert_eq(kvr_keys_chain(NS, a, 10000, 16, NULL, 0, k16, 625), 625);
	for (int i = 0; i < 625; i++)
		for (int j = 0; j < 78; j++)
			cr_assert_not(kvr_key_eq(k16[i], ka[j]));
	free(a);
	free(b);
}

Test(keys, limits_and_errors)
{
	uint32_t tok[300] = {0};
	kvr_key k[4] = {{0}};
	cr_assert_eq(kvr_keys_chain(NS, tok, 300, 128, NULL, 0, k, 4), 2, "partial block has no key");
	cr_assert_eq(kvr_keys_chain(NS, tok, 300, 16, NULL, 0, k, 4), 4, "max_keys");
	cr_assert_eq(kvr_keys_chain(NS, tok, 0, 16, NULL, 0, k, 4), 0);
	cr_assert_eq(kvr_keys_chain(NS, tok, 300, 16, NULL, 0, NULL, 0), 0);
	cr_assert_eq(kvr_keys_chain(NS, tok, 300, 0, NULL, 0, k, 4), -EINVAL);
	cr_assert_eq(kvr_keys_chain(NS, NULL, 300, 16, NULL, 0, k, 4), -EINVAL);
	cr_assert_eq(kvr_keys_chain(NS, tok, 300, 16, NULL, 4, k, 4), -EINVAL);
	cr_assert_eq(kvr_keys_chain(NS, tok, 300, 16, NULL, 0, NULL, 4), -EINVAL);
	/* all-zero tokens still give non-zero, distinct keys */
	cr_assert_eq(kvr_keys_chain(NS, tok, 300, 16, NULL, 0, k, 4), 4);
	for (int i = 0; i < 4; i++) {
		cr_assert_not(kvr_key_is_zero(k[i]));
		for (int j = 0; j < i; j++)
			cr_assert_not(kvr_key_eq(k[i], k[j]));
	}
}

Test(keys, format_and_parse)
{
	char buf[KVR_KEY_FMT_LEN];
	cr_assert_str_eq(kvr_key_fmt(NS, buf), "fedcba98765432100123456789abcdef");
	cr_assert_str_eq(kvr_key_fmt((kvr_key){0, 0}, buf), "00000000000000000000000000000000");
	cr_assert_str_eq(kvr_key_fmt((kvr_key){1, 0}, buf), "00000000000000000000000000000001");
	kvr_key k;
	cr_assert_eq(kvr_key_parse("FEDCBA98765432100123456789abcdef", &k), 0);
	cr_assert(kvr_key_eq(k, NS));
	kvr_key keep = {7, 7};
	cr_assert_eq(kvr_key_parse("fedcba98765432100123456789abcde", &keep), -EINVAL, "31 chars");
	cr_assert_eq(kvr_key_parse("fedcba98765432100123456789abcdeg", &keep), -EINVAL, "not hex");
	cr_assert_eq(kvr_key_parse("fedcba98765432100123456789abcdef0", &keep), -EINVAL, "33 chars");
	cr_assert(keep.lo == 7 && keep.hi == 7, "untouched on failure");
	cr_assert(kvr_key_is_zero((kvr_key){0, 0}));
	cr_assert_not(kvr_key_is_zero((kvr_key){0, 1}));
	cr_assert(kvr_key_eq(kvr_key_hash("abc", 3), kvr_key_hash("abc", 3)));
}

/* A 10,000-token prompt chained 2,000 times: every round gives the same 78 keys (no state
 * carried between calls); the time is printed for docs/geometry.md, not asserted (the
 * machine is shared: timing goals live in benchmarks). */
Test(keys, chain_10k_tokens_repeatable)
{
	struct rng seed = {test_seed("keys.chain_10k_tokens_repeatable")};
	uint32_t *tok = random_tokens(&seed, 10000);
	kvr_key first[78], k[78];
	enum { ROUNDS = 2000 };
	cr_assert_eq(kvr_keys_chain(NS, tok, 10000, 128, NULL, 0, first, 78), 78);
	uint64_t best = UINT64_MAX, t0 = kvr_now_ns();
	for (int r = 0; r < ROUNDS; r++) {
		uint64_t a = kvr_now_ns();
		cr_assert_eq(kvr_keys_chain(NS, tok, 10000, 128, NULL, 0, k, 78), 78);
		uint64_t d = kvr_now_ns() - a;
		if (d < best)
			best = d;
		cr_assert_eq(memcmp(k, first, sizeof(k)), 0, "round %d gave other keys", r);
	}
	uint64_t mean = (kvr_now_ns() - t0) / ROUNDS;
	fprintf(stderr, "keys: 10,000 tokens -> 78 keys of 128: mean %.2f us, best %.2f us (budget 20 us)\n",
		mean / 1e3, best / 1e3);
	free(tok);
}
