/* Copy planner: region table + (block id, slot offset) pairs -> validated, coalesced copy runs. */
#include "kvr_xfer.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(struct kvr_xfer_err *err, int rc, uint32_t what, uint32_t index, uint32_t block_id, uint32_t region)
{
	if (err)
		*err = (struct kvr_xfer_err){ .what = what, .index = index, .block_id = block_id, .region = region };
	return rc;
}

int kvr_xfer_layout_check(const struct kvr_xfer_layout *layout, struct kvr_xfer_err *err)
{
	const uint32_t none = KVR_XFER_NONE_IDX;

	if (!layout || !layout->regions || layout->n_regions == 0 || layout->n_regions > KVR_XFER_MAX_REGIONS ||
	    layout->num_blocks == 0)
		return fail(err, -EINVAL, KVR_XFER_E_ARG, none, none, none);

	for (uint32_t r = 0; r < layout->n_regions; r++) {
		const struct kvr_xfer_region *g = &layout->regions[r];
		uint64_t last, end;

		if (g->sem_bytes > g->page_bytes || g->page_bytes == 0 ||
		    (layout->num_blocks > 1 && g->page_bytes > g->stride))
			return fail(err, -EINVAL, KVR_XFER_E_REGION, none, none, r);
		if (__builtin_mul_overflow((uint64_t)(layout->num_blocks - 1), g->stride, &last) ||
		    __builtin_add_overflow(last, g->offset, &end) || __builtin_add_overflow(end, g->page_bytes, &end) ||
		    end > layout->kv_size)
			return fail(err, -ERANGE, KVR_XFER_E_REGION_RANGE, none, none, r);
	}
	return 0;
}

uint64_t kvr_xfer_slot_bytes(const struct kvr_xfer_layout *layout)
{
	if (kvr_xfer_layout_check(layout, NULL) < 0)
		return 0;
	return kvr_xfer_region_slot_offset(layout, layout->n_regions);
}

uint64_t kvr_xfer_region_slot_offset(const struct kvr_xfer_layout *layout, uint32_t r)
{
	uint64_t off = 0;

	if (!layout || !layout->regions)
		return 0;
	for (uint32_t i = 0; i < r && i < layout->n_regions; i++)
		off += layout->regions[i].page_bytes;
	return off;
}

size_t kvr_xfer_plan_max_runs(uint32_t n_regions, size_t n_blocks)
{
	size_t n;

	if (__builtin_mul_overflow((size_t)n_regions, n_blocks, &n))
		return SIZE_MAX;
	return n;
}

static int by_kv(const void *pa, const void *pb)
{
	const struct kvr_xfer_run *a = pa, *b = pb;

	if (a->kv_off != b->kv_off)
		return a->kv_off < b->kv_off ? -1 : 1;
	return (a->slot_off > b->slot_off) - (a->slot_off < b->slot_off);
}

static int by_slot(const void *pa, const void *pb)
{
	const struct kvr_xfer_run *a = pa, *b = pb;

	if (a->slot_off != b->slot_off)
		return a->slot_off < b->slot_off ? -1 : 1;
	return (a->kv_off > b->kv_off) - (a->kv_off < b->kv_off);
}

/* True when b starts where a ends, on both sides. */
static inline int follows(const struct kvr_xfer_run *a, const struct kvr_xfer_run *b)
{
	return a->kv_off + a->len == b->kv_off && a->slot_off + a->len == b->slot_off;
}

/* Sort runs by one side (unless already sorted), merge neighbours contiguous on both
 * sides, and return the index of the first run that overlaps its predecessor on that side
 * (0 if none: run 0 never overlaps a predecessor). *n shrinks by the merges. */
static size_t sort_merge_check(struct kvr_xfer_run *runs, size_t *n, int kv_side)
{
	size_t i, out;
	int sorted = 1;

	for (i = 1; i < *n && sorted; i++)
		sorted = kv_side ? by_kv(&runs[i - 1], &runs[i]) <= 0 : by_slot(&runs[i - 1], &runs[i]) <= 0;
	if (!sorted)
		qsort(runs, *n, sizeof(*runs), kv_side ? by_kv : by_slot);

	for (out = 0, i = 1; i < *n; i++) {
		if (follows(&runs[out], &runs[i]))
			runs[out].len += runs[i].len;
		else
			runs[++out] = runs[i];
	}
	*n = out + 1;

	for (i = 1; i < *n; i++) {
		const struct kvr_xfer_run *p = &runs[i - 1], *c = &runs[i];
		if (kv_side ? p->kv_off + p->len > c->kv_off : p->slot_off + p->len > c->slot_off)
			return i;
	}
	return 0;
}

/* The (index, block, region) whose page starts at KV offset kv (a run always starts at a
 * page start); the last index wins, so a duplicate id names its second occurrence. */
static int blame_kv(const struct kvr_xfer_layout *l, const uint32_t *ids, size_t n, uint64_t kv,
		    struct kvr_xfer_err *err)
{
	uint32_t region = KVR_XFER_NONE_IDX, block = KVR_XFER_NONE_IDX, index = KVR_XFER_NONE_IDX;

	for (uint32_t r = 0; r < l->n_regions && region == KVR_XFER_NONE_IDX; r++) {
		const struct kvr_xfer_region *g = &l->regions[r];
		if (kv < g->offset)
			continue;
		uint64_t d = kv - g->offset;
		uint64_t b = g->stride ? d / g->stride : 0;
		if (b < l->num_blocks && d - b * g->stride == 0) {
			region = r;
			block = (uint32_t)b;
		}
	}
	for (size_t i = 0; i < n; i++)
		if (ids[i] == block)
			index = (uint32_t)i;
	return fail(err, -EINVAL, KVR_XFER_E_KV_OVERLAP, index, block, region);
}

/* The last (index, region) whose slot range holds arena offset s. */
static int blame_slot(const struct kvr_xfer_layout *l, const uint32_t *ids, const uint64_t *slots, size_t n,
		      uint64_t slot_bytes, uint64_t s, struct kvr_xfer_err *err)
{
	uint32_t index = KVR_XFER_NONE_IDX, block = KVR_XFER_NONE_IDX, region = KVR_XFER_NONE_IDX;

	for (size_t i = 0; i < n; i++)
		if (s >= slots[i] && s - slots[i] < slot_bytes)
			index = (uint32_t)i;
	if (index != KVR_XFER_NONE_IDX) {
		uint64_t d = s - slots[index], off = 0;
		block = ids[index];
		for (uint32_t r = 0; r < l->n_regions; off += l->regions[r].page_bytes, r++)
			if (d >= off && d - off < l->regions[r].page_bytes) {
				region = r;
				break;
			}
	}
	return fail(err, -EINVAL, KVR_XFER_E_SLOT_OVERLAP, index, block, region);
}

int kvr_xfer_plan(const struct kvr_xfer_layout *layout, const uint32_t *block_ids, const uint64_t *slot_offsets,
		  size_t n_blocks, struct kvr_xfer_run *runs, size_t cap, uint64_t *ret_bytes,
		  struct kvr_xfer_err *err)
{
	const uint32_t none = KVR_XFER_NONE_IDX;
	uint64_t slot_bytes, total;
	size_t n = 0, bad;
	int rc;

	rc = kvr_xfer_layout_check(layout, err);
	if (rc < 0)
		return rc;
	if (n_blocks == 0) {
		if (ret_bytes)
			*ret_bytes = 0;
		return 0;
	}
	if (!block_ids || !slot_offsets || !runs)
		return fail(err, -EINVAL, KVR_XFER_E_ARG, none, none, none);
	if (kvr_xfer_plan_max_runs(layout->n_regions, n_blocks) > INT_MAX)
		return fail(err, -E2BIG, KVR_XFER_E_TOO_BIG, none, none, none);

	slot_bytes = kvr_xfer_region_slot_offset(layout, layout->n_regions);

	/* Validate every block before planning any, so the first bad index is the one named. */
	for (size_t i = 0; i < n_blocks; i++) {
		uint64_t end;
		if (block_ids[i] >= layout->num_blocks)
			return fail(err, -ERANGE, KVR_XFER_E_BLOCK_ID, (uint32_t)i, block_ids[i], none);
		if (__builtin_add_overflow(slot_offsets[i], slot_bytes, &end) || end > layout->arena_size)
			return fail(err, -ERANGE, KVR_XFER_E_SLOT_RANGE, (uint32_t)i, block_ids[i], none);
	}

	/* Emit pages in (block, region) order, merging each into the previous run when the two
	 * are contiguous on both sides in either order. The layout check bounds every
	 * offset + id * stride + page_bytes by kv_size: no overflow below. */
	for (size_t i = 0; i < n_blocks; i++) {
		uint64_t s = slot_offsets[i];
		for (uint32_t r = 0; r < layout->n_regions; r++) {
			const struct kvr_xfer_region *g = &layout->regions[r];
			struct kvr_xfer_run page = {
				.kv_off = g->offset + (uint64_t)block_ids[i] * g->stride,
				.slot_off = s,
				.len = g->page_bytes,
			};
			s += g->page_bytes;
			if (n > 0 && follows(&runs[n - 1], &page)) {
				runs[n - 1].len += page.len;
			} else if (n > 0 && follows(&page, &runs[n - 1])) {
				runs[n - 1].kv_off = page.kv_off;
				runs[n - 1].slot_off = page.slot_off;
				runs[n - 1].len += page.len;
			} else {
				if (n == cap)
					return fail(err, -ENOSPC, KVR_XFER_E_NOSPC, (uint32_t)i, block_ids[i], r);
				runs[n++] = page;
			}
		}
	}

	/* Slot side first, then KV side, so the runs end sorted by kv_off. Sorting also merges
	 * what the streaming pass could not see (permuted id lists). */
	bad = sort_merge_check(runs, &n, 0);
	if (bad)
		return blame_slot(layout, block_ids, slot_offsets, n_blocks, slot_bytes, runs[bad].slot_off, err);
	bad = sort_merge_check(runs, &n, 1);
	if (bad)
		return blame_kv(layout, block_ids, n_blocks, runs[bad].kv_off, err);

	total = slot_bytes * n_blocks;
	if (ret_bytes)
		*ret_bytes = total;
	return (int)n;
}

const char *kvr_xfer_err_str(uint32_t what)
{
	switch (what) {
	case KVR_XFER_E_NONE:
		return "no error";
	case KVR_XFER_E_ARG:
		return "bad arguments";
	case KVR_XFER_E_REGION:
		return "bad region (page_bytes 0 or larger than stride, or sem_bytes larger than page_bytes)";
	case KVR_XFER_E_REGION_RANGE:
		return "region extends beyond the KV memory";
	case KVR_XFER_E_BLOCK_ID:
		return "block id out of range";
	case KVR_XFER_E_SLOT_RANGE:
		return "slot range beyond the arena";
	case KVR_XFER_E_KV_OVERLAP:
		return "pages overlap in KV memory (duplicate block id or overlapping regions)";
	case KVR_XFER_E_SLOT_OVERLAP:
		return "slot ranges overlap";
	case KVR_XFER_E_NOSPC:
		return "more copy runs than the caller's capacity";
	case KVR_XFER_E_TOO_BIG:
		return "too many blocks x regions";
	}
	return "unknown error";
}

int kvr_xfer_err_format(const struct kvr_xfer_err *err, char *buf, size_t len)
{
	char idx[24] = "", reg[24] = "";

	if (!err)
		return snprintf(buf, len, "no error");
	if (err->index != KVR_XFER_NONE_IDX)
		snprintf(idx, sizeof(idx), " (index %u)", err->index);
	if (err->region != KVR_XFER_NONE_IDX)
		snprintf(reg, sizeof(reg), ", region %u", err->region);
	if (err->block_id != KVR_XFER_NONE_IDX)
		return snprintf(buf, len, "%s: block %u%s%s", kvr_xfer_err_str(err->what), err->block_id, idx, reg);
	return snprintf(buf, len, "%s%s%s", kvr_xfer_err_str(err->what), idx, reg);
}
