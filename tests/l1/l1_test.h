/* Helpers shared by the L1 tests: seeds, a small PRNG, slot-table segments, synthetic keys. */
#ifndef KVR_L1_TEST_H
#define KVR_L1_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#include "kvr_keys.h"
#include "kvr_segment.h"
#include "kvr_slots.h"
#include "kvr_time.h"

/* The seed of a randomised test: KVR_TEST_SEED if set, random otherwise. Always printed. */
static inline uint64_t l1_seed(const char *test)
{
	uint64_t seed = 0;
	const char *env = getenv("KVR_TEST_SEED");
	if (env && *env)
		seed = strtoull(env, NULL, 0);
	else if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
		seed = kvr_now_ns() ^ ((uint64_t)getpid() << 32);
	fprintf(stderr, "%s: seed %llu (repeat with KVR_TEST_SEED=%llu)\n", test, (unsigned long long)seed,
		(unsigned long long)seed);
	return seed;
}

/* splitmix64 */
static inline uint64_t l1_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A distinct, well-mixed key for (a, b). */
static inline kvr_key l1_key(uint64_t a, uint64_t b)
{
	uint64_t in[2] = {a, b};
	return kvr_key_hash(in, sizeof(in));
}

/* A slot table in a fresh KVR_SEG_SLOTS segment (memfd named with the pid). */
static inline int l1_table(uint32_t n_slots, uint32_t tp_size, uint32_t quorum, struct kvr_segment *ret_seg,
			   struct kvr_slot_table **ret_t)
{
	char name[64];
	snprintf(name, sizeof(name), "kvr-test-slots-%d", (int)getpid());
	int rc = kvr_segment_create(name, KVR_SEG_SLOTS, kvr_slots_memsize(n_slots), 1, 0, ret_seg);
	if (rc)
		return rc;
	struct kvr_slots_config cfg = {
		.n_slots = n_slots,
		.lane_bytes = 5000,
		.ns = {0x1234, 0x5678},
		.block_tokens = 16,
		.tp_size = tp_size,
		.quorum = quorum,
	};
	rc = kvr_slots_init(ret_seg->base, ret_seg->size, &cfg, ret_t);
	if (rc)
		kvr_segment_close(ret_seg);
	return rc;
}

#endif
