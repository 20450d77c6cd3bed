/* kvr_dcp: decode-context-parallel shard layout math: which tokens a rank holds, copy runs to the canonical block. */
#ifndef KVR_DCP_H
#define KVR_DCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_geometry.h"

/*
 * Decode context parallelism (DCP) splits a sequence's KV over D ranks by token: rank r of
 * D holds the global tokens t with (t / I) mod D == r (I = interleave; I = 1 is the strided
 * layout, I > 1 gives each rank runs of I consecutive tokens). Each rank keeps its tokens
 * in its own pages in local order (local token j is the j-th token it holds).
 *
 * The canonical block is what kvring stores: block_tokens tokens in global order, so a
 * block stored under one (D, I) loads under another. block_tokens is the canonical block
 * size (the tokens one key covers); a rank's page of that block holds
 * kvr_dcp_rank_tokens(block_tokens, D, I, r) = block_tokens / D tokens.
 *
 * Rule (kvr_dcp_check): D == 1, or block_tokens % (D * I) == 0. It is necessary and
 * sufficient for every rank to hold the same number of tokens (block_tokens / D) of EVERY
 * block, so a rank's local pages line up with canonical blocks. Sufficient: the owner
 * pattern repeats every D*I tokens, so each block starts at the same phase and holds
 * block_tokens / (D*I) whole periods, I tokens of each rank per period. Necessary: with
 * block_tokens = k*D*I + s, 0 < s < D*I, block 0 gives rank 0 k*I + min(s, I) tokens and
 * rank D-1 k*I + max(0, s - (D-1)*I), and min(s, I) > max(0, s - (D-1)*I) for D >= 2.
 *
 * Pages: a rank's page of a region is token-major: local token j's row (row_bytes) at
 * j * row_bytes, rank_tokens rows (= sem_bytes), then an optional opaque tail of
 * page_bytes - sem_bytes bytes that belongs to the whole page. Canonical page of a region:
 *
 *     [ block_tokens rows in global order ][ tail of rank 0 ] ... [ tail of rank D-1 ]
 *
 * that is block_tokens * row_bytes + D * tail bytes. Rows are layout-independent; a tail
 * is opaque state the model computed over ITS rank's tokens, so kvring cannot split or
 * merge it: each rank's tail is kept, byte for byte, at its rank's place. A block whose
 * regions have tails therefore loads only under the layout it was stored under
 * (kvr_dcp_layout_compatible); with D = 1 the canonical page is the plain page (rows,
 * tail), exactly the non-DCP slot layout. The alternative, refusing tails under DCP, would
 * refuse the production case seed 002 reports (an FP8 index-cache tail on every MLA page at
 * TP4/DCP4); dropping the tail is the bug it reports.
 *
 * Copy runs: kvr_dcp_runs() maps one rank's page of one region to its canonical page in a
 * slot. I consecutive local rows are I consecutive global rows: one run of I * row_bytes;
 * runs contiguous on both sides are merged (D = 1: one run for rows and tail). A page's
 * runs come out in increasing kv_off and slot_off order; no two runs overlap on either
 * side; the same runs serve both directions (gather: kv -> slot, scatter: slot -> kv).
 *
 * Errors are negative errno values; outputs are untouched on failure.
 */

#define KVR_DCP_MAX 16u /* ranks of one DCP group (DCP ranks are TP ranks: <= KVR_MAX_TP) */

/* One copy between a rank's KV memory and the arena. Same fields, order and meaning as
 * xfer/kvr_xfer.h's struct kvr_xfer_run, so a stage copies it field by field. */
struct kvr_dcp_run {
	uint64_t kv_off;
	uint64_t slot_off;
	uint64_t len;
};
_Static_assert(sizeof(struct kvr_dcp_run) == 24, "copy run");

/* The rank holding global token t under (D, I): (t / I) mod D. D, I >= 1. */
static inline uint32_t kvr_dcp_owner(uint64_t t, uint32_t dcp_size, uint32_t interleave)
{
	return (uint32_t)((t / interleave) % dcp_size);
}

/* Position in the block (global order) of rank r's local token j (block obeys the rule):
 * ((j / I) * D + r) * I + j mod I. */
static inline uint64_t kvr_dcp_global_token(uint64_t j, uint32_t dcp_size, uint32_t interleave, uint32_t rank)
{
	return ((j / interleave) * dcp_size + rank) * interleave + j % interleave;
}

/* Whether blocks of block_tokens tokens split under (dcp_size, interleave): 0, or -EINVAL
 * and one line in err (NUL-terminated when errlen > 0), first failure wins:
 *   "dcp_size: 0 (must be 1..16)", "dcp_interleave: must be > 0", "block_tokens: must be > 0",
 *   "dcp: block_tokens 24 is not a multiple of dcp_size 2 x dcp_interleave 16 = 32
 *    (in block 0 rank 0 would hold 16 tokens, rank 1 8)" */
int kvr_dcp_check(uint32_t block_tokens, uint32_t dcp_size, uint32_t interleave, char *err, size_t errlen);

/* Tokens among the first n_tokens (global positions 0..n_tokens-1) that rank r holds; any
 * n_tokens, a partial block too (block capacity checks use it: a rank's page of a full
 * block holds kvr_dcp_rank_tokens(block_tokens, ...) tokens, not block_tokens).
 * 0 when dcp_size or interleave is 0 or rank >= dcp_size. */
uint64_t kvr_dcp_rank_tokens(uint64_t n_tokens, uint32_t dcp_size, uint32_t interleave, uint32_t rank);

/* Canonical page bytes of a region whose rank pages hold row_bytes rows and tail_bytes of
 * tail: block_tokens * row_bytes + dcp_size * tail_bytes. */
uint64_t kvr_dcp_canonical_page_bytes(uint32_t row_bytes, uint32_t tail_bytes, uint32_t block_tokens,
				      uint32_t dcp_size);

/* Runs kvr_dcp_runs() may write for one region: 1 when dcp_size is 1, else
 * block_tokens / (dcp_size * interleave) + 1 (row groups and the tail); 0 when the
 * arguments break the rule. */
size_t kvr_dcp_max_runs(uint32_t block_tokens, uint32_t dcp_size, uint32_t interleave);

/*
 * Copy runs between rank `rank`'s page of one region of one block and that region's
 * canonical page in a slot.
 *   region          the rank's region: page_bytes (rows + tail) and sem_bytes (rows) are
 *                   read; sem_bytes must equal kvr_dcp_rank_tokens(block_tokens, ...) *
 *                   row_bytes; offset and stride are not read (kv_block_off says where).
 *   row_bytes       one token's row (heads * head_dim * dtype bytes; MLA: the latent
 *                   record, e.g. 1152 or 656); any width, odd ones included.
 *   kv_block_off    offset of this block's page in the rank's KV memory
 *                   (region offset + block id * stride).
 *   slot_block_off  offset of this region's canonical page in the arena.
 * Writes at most cap runs and returns how many (>= 1), or
 *   -EINVAL  the rule fails (kvr_dcp_check says why), rank >= dcp_size, row_bytes 0, NULL
 *            region or runs, sem_bytes != rank tokens * row_bytes, page_bytes < sem_bytes
 *   -ENOSPC  cap < the runs needed (kvr_dcp_max_runs() always suffices); runs[] untouched
 *   -EOVERFLOW  an offset past 2^64
 */
int kvr_dcp_runs(const struct kvr_region *region, uint32_t row_bytes, uint32_t block_tokens, uint32_t dcp_size,
		 uint32_t interleave, uint32_t rank, uint64_t kv_block_off, uint64_t slot_block_off,
		 struct kvr_dcp_run *runs, size_t cap);

/* ---- a whole lane: what a gather stage calls ------------------------------------------ */

/* Canonical bytes of one lane of a block for geometry g (a DCP rank's geometry): the sum
 * over regions of kvr_dcp_canonical_page_bytes(), row_bytes = sem_bytes / rank tokens.
 * Equals kvr_geometry_lane_bytes(g) when dcp_size is 1. 0 when g breaks the rule. */
uint64_t kvr_dcp_canonical_lane_bytes(const struct kvr_geometry *g);

/* Offset of region i's canonical page inside a canonical lane (sum of earlier ones; 0
 * when g breaks the rule). */
uint64_t kvr_dcp_canonical_region_offset(const struct kvr_geometry *g, unsigned i);

/* Runs kvr_dcp_lane_runs() may write: the sum of kvr_dcp_max_runs() over regions. */
size_t kvr_dcp_lane_max_runs(const struct kvr_geometry *g);

/*
 * Runs for every region of block block_id of rank g->dcp_rank (a validated geometry:
 * kvr_geometry_validate() == 0) against the canonical lane at arena offset slot_off,
 * regions in order (kvr_dcp_canonical_region_offset), slot_off increasing. Runs
 * contiguous on both sides are merged across regions too (only possible with D = 1).
 * Returns the count, or -EINVAL (block_id >= num_blocks, the rule, a sem_bytes that is
 * not whole rows; one line in err), -ENOSPC (runs untouched), -EOVERFLOW.
 *
 * For a gather stage: with D > 1 every rank of a group (same pages, other dcp_rank) gets
 * the same number of runs, and run k of rank r lies before run k of rank r + 1, which lies
 * before run k + 1 of rank 0: walking k, then the ranks, writes (gather) or reads
 * (scatter) the canonical lane front to back (docs/benchmarks.md measures that order).
 */
int kvr_dcp_lane_runs(const struct kvr_geometry *g, uint32_t block_id, uint64_t slot_off, struct kvr_dcp_run *runs,
		      size_t cap, char *err, size_t errlen);

/* Whether a block stored under (dcp_size, interleave) can be loaded under (dcp_size2,
 * interleave2): always when no region has a tail (rows are canonical); with tails only
 * under the same layout (interleave does not matter when dcp_size is 1). */
bool kvr_dcp_layout_compatible(bool has_tail, uint32_t dcp_size, uint32_t interleave, uint32_t dcp_size2,
			       uint32_t interleave2);

/* ---- DCP groups: what kvringd and the gather actor use -------------------------------- */

/*
 * A DCP group is dcp_size consecutive TP ranks (vLLM's rule): TP rank t is DCP rank
 * t mod D of group t / D. Every rank of a group holds 1/D of the tokens of the same
 * KV heads (MLA: of the same latent), so one canonical lane is assembled from the D
 * ranks' shards: lane t / D under MHA/GQA (tp_size / D lanes), lane 0 under MLA.
 */

/* 0, or -EINVAL with one line: "dcp_size: 3 does not divide tp_size 4 (...)",
 * "dcp_rank: 1, but TP rank 2 is DCP rank 0 of its group (...)". D = 1 always passes. */
int kvr_dcp_group_check(const struct kvr_geometry *g, char *err, size_t errlen);

/* The group of a rank (tp_rank / dcp_size) and the lane its group stores. */
static inline uint32_t kvr_dcp_group_index(const struct kvr_geometry *g)
{
	return g->tp_rank / g->dcp_size;
}
static inline uint32_t kvr_dcp_lane(const struct kvr_geometry *g)
{
	return g->attention == KVR_ATTN_MLA ? 0 : g->tp_rank / g->dcp_size;
}

/* Whether any region's page carries an opaque tail (page_bytes > sem_bytes). */
bool kvr_geometry_has_tail(const struct kvr_geometry *g);

/*
 * The canonical geometry of a validated rank geometry g: what one stored block of its
 * group looks like, as a non-DCP geometry (dcp 1/0/1). Every region's page becomes its
 * canonical page (kvr_dcp_canonical_page_bytes; sem_bytes = block_tokens rows), MHA's
 * tp_size / tp_rank become the group's (tp_size / D, tp_rank / D: the lanes), MLA keeps
 * them. Offsets and strides describe a packed layer-major layout, not the worker's
 * memory: the result is for comparing with the instance's model (fields, lane bytes,
 * kvr_geometry_namespace), not for copying. D = 1: g itself, offsets repacked.
 * 0, or -EINVAL (kvr_dcp_group_check's reasons, a canonical page past 32 bits).
 */
int kvr_dcp_canonical_geometry(const struct kvr_geometry *g, struct kvr_geometry *ret, char *err, size_t errlen);

#endif
