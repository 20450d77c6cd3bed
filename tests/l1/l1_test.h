/* Helpers shared by the L1 tests: slot-table segments and synthetic keys (seeds and the PRNG: tests/ipc/ipc_test.h). */
#ifndef KVR_L1_TEST_H
#define KVR_L1_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "../ipc/ipc_test.h"
#include "kvr_keys.h"
#include "kvr_segment.h"
#include "kvr_slots.h"

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
