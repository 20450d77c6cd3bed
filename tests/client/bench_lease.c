/* What a scheduler pays per lookup: kvr_lease + kvr_lease_release of a 10k-token prompt, p50/p99, next to a worker's kvr_lookup. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_harness.h"
#include "kvr_time.h"

/*
 * vLLM's scheduler asks for every waiting request on every step, so this call is on the
 * engine's critical path. The bench stores a 10,000-token prompt (625 blocks of 16 tokens:
 * the most keys a 10k prompt makes with vLLM's smallest block; every one matches), then
 * times N leases back to back, as a scheduler step asks for every waiting request (hash,
 * request through the ring, index match on every lane, pins, reply; released in rounds) and, in the same run, N worker lookups of the same prompt (no pins) — the
 * ratio says what the lease costs on top. Prints p50/p99/max in microseconds; asserts only
 * that every call matched the whole prompt (speed is never pass/fail).
 */

static struct ct_env env;
static void setup(void) { ct_init(&env); }
static void teardown(void) { ct_fini(&env); }
TestSuite(bench_lease, .init = setup, .fini = teardown, .timeout = 300);

#define BT 16
#define TOKENS 10000
#define N 2000

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void report(const char *what, uint64_t *ns, unsigned n)
{
	qsort(ns, n, sizeof(*ns), cmp_u64);
	printf("%-34s p50 %7.1f us  p99 %7.1f us  max %7.1f us  (n=%u)\n", what, ns[n / 2] / 1e3,
	       ns[(size_t)n * 99 / 100] / 1e3, ns[n - 1] / 1e3, n);
}

Test(bench_lease, scheduler_lease_10k_tokens)
{
	static const struct ct_model m = {.layers = 2, .kv_heads = 2, .head_dim = 16, .dtype_bytes = 2,
					  .block_tokens = BT, .tp_size = 1};
	ct_start(&env, &m, &(struct ct_opts){.l1_slots = 1024});
	struct ct_rank *r;
	const uint32_t nb = TOKENS / BT;
	cr_assert_eq(ct_rank_open(&env, 0, nb, 0, &r), 0);
	static uint32_t tokens[TOKENS], blocks[TOKENS / BT];
	ct_prompt(tokens, TOKENS, 3);
	for (uint32_t i = 0; i < nb; i++)
		blocks[i] = i;
	struct ct_done d;
	ct_store(r, 1, tokens, nb * BT, blocks, nb, &d);
	cr_assert_eq(d.c.status, 0);

	struct kvr_sched_opts so = {.socket = env.h.sock, .timeout_ms = 5000};
	struct kvr_client *s;
	cr_assert_eq(kvr_attach_scheduler(&so, &s), 0, "%s", kvr_last_error(NULL));
	static uint64_t lease_ns[N], look_ns[N], index_ns[N], hash_ns[N], rt_ns[N];
	struct kvr_lookup_result res;
	for (unsigned i = 0; i < 50; i++) /* warm up both paths */
		cr_assert_eq(kvr_lease(s, 7, tokens, TOKENS, NULL, 0, NULL, &res), 0);
	/* as vLLM's scheduler step does: one lease per waiting request, back to back (rounds of
	 * 100 requests, each released before the next round); then the worker lookups alike */
	for (unsigned i = 0; i < N; i++) {
		uint64_t t0 = kvr_now_ns();
		cr_assert_eq(kvr_lease(s, 1000 + i % 100, tokens, TOKENS, NULL, 0, NULL, &res), 0);
		lease_ns[i] = kvr_now_ns() - t0;
		index_ns[i] = res.index_ns;
		hash_ns[i] = res.hash_ns;
		rt_ns[i] = res.roundtrip_ns;
		cr_assert_eq(res.matched_blocks, nb);
		if (i % 100 == 99)
			for (unsigned k = 0; k < 100; k++)
				cr_assert_eq(kvr_lease_release(s, 1000 + k), 0);
	}
	for (unsigned i = 0; i < N; i++) {
		uint64_t t0 = kvr_now_ns();
		cr_assert_eq(kvr_lookup(r->c, 9, tokens, TOKENS, NULL, 0, &res), 0);
		look_ns[i] = kvr_now_ns() - t0;
		cr_assert_eq(res.matched_blocks, nb);
	}
	printf("scheduler lookup cost, %u-token prompt, %u blocks of %u tokens, all matched:\n", TOKENS, nb, BT);
	report("kvr_lease (hash+ring+index+pins)", lease_ns, N);
	report("  hashing the prompt (client)", hash_ns, N);
	report("  request + reply (rings)", rt_ns, N);
	report("  the lookup actor's index work", index_ns, N);
	report("worker kvr_lookup (no pins)", look_ns, N);
	printf("reply messages that waited in the lookup actor's outboxes: %llu\n",
	       (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_REPLIES_QUEUED));
	printf("lease p99 / lookup p99 = %.2f\n", (double)lease_ns[N * 99 / 100] / (double)look_ns[N * 99 / 100]);
	kvr_detach(s);
}
