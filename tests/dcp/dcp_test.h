/* Helpers for the DCP tests and bench: brute-force rank pages from a canonical block, applying copy runs. */
#ifndef DCP_TEST_H
#define DCP_TEST_H

#include <stdint.h>
#include <string.h>

#include "kvr_dcp.h"
#include "kvr_xfer.h"

/*
 * Brute force, independent of kvr_dcp.c: rank r's page of a region is every global token
 * t of the block, in increasing order, whose owner ((t / I) mod D, spelled out as a loop
 * over periods) is r, one row each, then the rank's tail.
 */
static inline int bf_owner(uint64_t t, uint32_t d, uint32_t il)
{
	/* walk periods instead of using the division-modulo formula */
	uint64_t in_period = t % ((uint64_t)d * il);
	uint32_t r = 0;
	while (in_period >= il) {
		in_period -= il;
		r++;
	}
	return (int)r;
}

/* Write rank r's rows of the canonical rows `canon` (block_tokens rows) to page; returns
 * the rows written. */
static inline uint64_t bf_rank_rows(uint8_t *page, const uint8_t *canon, uint32_t row, uint32_t block_tokens,
				    uint32_t d, uint32_t il, uint32_t r)
{
	uint64_t j = 0;
	for (uint64_t t = 0; t < block_tokens; t++)
		if (bf_owner(t, d, il) == (int)r)
			memcpy(page + j++ * row, canon + t * row, row);
	return j;
}

/* Copy every run: dir KVR_XFER_KV_TO_SLOT (gather) or KVR_XFER_SLOT_TO_KV (scatter), with
 * the exact copy the host backend uses. */
static inline void apply_runs(uint8_t *kv, uint8_t *slot, const struct kvr_dcp_run *runs, int n, int dir)
{
	for (int i = 0; i < n; i++) {
		if (dir == KVR_XFER_KV_TO_SLOT)
			kvr_copy(slot + runs[i].slot_off, kv + runs[i].kv_off, runs[i].len);
		else
			kvr_copy(kv + runs[i].kv_off, slot + runs[i].slot_off, runs[i].len);
	}
}

#endif
