/* DCP: the token split rule, rank-local token counts and copy runs between rank pages and canonical blocks. */
#include "kvr_log.h"
#include "kvr_dcp.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

uint64_t kvr_dcp_rank_tokens(uint64_t n_tokens, uint32_t dcp_size, uint32_t interleave, uint32_t rank)
{
	if (!dcp_size || !interleave || rank >= dcp_size)
		return 0;
	uint64_t period = (uint64_t)dcp_size * interleave; /* < 2^64: both < 2^32 */
	uint64_t full = n_tokens / period, rem = n_tokens % period;
	uint64_t start = (uint64_t)rank * interleave; /* rank's first token in a period */
	uint64_t part = rem > start ? rem - start : 0;
	return full * interleave + (part < interleave ? part : interleave);
}

int kvr_dcp_check(uint32_t block_tokens, uint32_t dcp_size, uint32_t interleave, char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!dcp_size || dcp_size > KVR_DCP_MAX)
		return kvr_errf(err, errlen, -EINVAL, "dcp_size: %u (must be 1..%u)", dcp_size, KVR_DCP_MAX);
	if (!interleave)
		return kvr_errf(err, errlen, -EINVAL, "dcp_interleave: must be > 0");
	if (!block_tokens)
		return kvr_errf(err, errlen, -EINVAL, "block_tokens: must be > 0");
	uint64_t period = (uint64_t)dcp_size * interleave;
	if (dcp_size > 1 && block_tokens % period)
		return kvr_errf(err, errlen, -EINVAL,
			"dcp: block_tokens %u is not a multiple of dcp_size %u x dcp_interleave %u = %llu (in block 0 "
			"rank 0 would hold %llu tokens, rank %u %llu)",
			block_tokens, dcp_size, interleave, (unsigned long long)period,
			(unsigned long long)kvr_dcp_rank_tokens(block_tokens, dcp_size, interleave, 0), dcp_size - 1,
			(unsigned long long)kvr_dcp_rank_tokens(block_tokens, dcp_size, interleave, dcp_size - 1));
	return 0;
}

uint64_t kvr_dcp_canonical_page_bytes(uint32_t row_bytes, uint32_t tail_bytes, uint32_t block_tokens, uint32_t dcp_size)
{
	uint64_t rows = (uint64_t)block_tokens * row_bytes, tails = (uint64_t)dcp_size * tail_bytes, sum;
	return __builtin_add_overflow(rows, tails, &sum) ? UINT64_MAX : sum;
}

size_t kvr_dcp_max_runs(uint32_t block_tokens, uint32_t dcp_size, uint32_t interleave)
{
	if (kvr_dcp_check(block_tokens, dcp_size, interleave, NULL, 0))
		return 0;
	if (dcp_size == 1)
		return 1;
	return block_tokens / ((size_t)dcp_size * interleave) + 1;
}

/*
 * Run emitter: runs are produced in increasing kv_off and slot_off order; one that starts
 * where the previous one ends on both sides extends it. A dry emitter (runs NULL) only
 * counts, so the callers can refuse a short cap before writing anything; the count is
 * never below what the writing pass produces.
 */
struct emit {
	struct kvr_dcp_run *runs; /* NULL: count only */
	size_t n;
	struct kvr_dcp_run cur;
	bool have;
};

static void emit_flush(struct emit *e)
{
	if (!e->have)
		return;
	if (e->runs)
		e->runs[e->n] = e->cur;
	e->n++;
	e->have = false;
}

static void emit_add(struct emit *e, uint64_t kv_off, uint64_t slot_off, uint64_t len)
{
	if (!len)
		return;
	if (e->have && e->cur.kv_off + e->cur.len == kv_off && e->cur.slot_off + e->cur.len == slot_off) {
		e->cur.len += len;
		return;
	}
	emit_flush(e);
	e->cur = (struct kvr_dcp_run){.kv_off = kv_off, .slot_off = slot_off, .len = len};
	e->have = true;
}

/* One region's page; arguments checked by the caller (rule, rank, sem = n * row, no
 * overflow of kv_off + page_bytes or slot_off + canonical page). Local rows k*I..k*I+I-1
 * are global rows (k*D + rank)*I.., so run k starts rank*I rows into the canonical page
 * and the next one D*I rows further. */
static void emit_region(struct emit *e, uint32_t row_bytes, uint32_t sem_bytes, uint32_t tail_bytes,
			uint32_t block_tokens, uint32_t dcp_size, uint32_t interleave, uint32_t rank, uint64_t kv_off,
			uint64_t slot_off)
{
	if (dcp_size == 1) {
		/* every token, in order, then the one tail: the page as it is */
		emit_add(e, kv_off, slot_off, (uint64_t)sem_bytes + tail_bytes);
		return;
	}
	uint64_t groups = (uint64_t)block_tokens / dcp_size / interleave;
	if (!e->runs) {
		/* With D > 1 no two of these runs touch in the canonical page (other ranks' rows lie
		 * between two groups, the tail sits after every row, and the first run of the next
		 * region starts rank*I rows or more into its page): count instead of walking. */
		emit_flush(e);
		e->n += groups + (tail_bytes ? 1 : 0);
		return;
	}
	uint64_t len = (uint64_t)interleave * row_bytes, step = len * dcp_size;
	uint64_t kv = kv_off, slot = slot_off + (uint64_t)rank * len;
	for (uint64_t k = 0; k < groups; k++, kv += len, slot += step)
		emit_add(e, kv, slot, len);
	emit_add(e, kv_off + sem_bytes, slot_off + (uint64_t)block_tokens * row_bytes + (uint64_t)rank * tail_bytes,
		 tail_bytes);
}

int kvr_dcp_runs(const struct kvr_region *region, uint32_t row_bytes, uint32_t block_tokens, uint32_t dcp_size,
		 uint32_t interleave, uint32_t rank, uint64_t kv_block_off, uint64_t slot_block_off,
		 struct kvr_dcp_run *runs, size_t cap)
{
	if (!region || !runs || !row_bytes || kvr_dcp_check(block_tokens, dcp_size, interleave, NULL, 0) ||
	    rank >= dcp_size)
		return -EINVAL;
	uint64_t n = kvr_dcp_rank_tokens(block_tokens, dcp_size, interleave, rank);
	if (region->sem_bytes != n * row_bytes || region->page_bytes < region->sem_bytes)
		return -EINVAL;
	uint32_t tail = region->page_bytes - region->sem_bytes;
	uint64_t canon = kvr_dcp_canonical_page_bytes(row_bytes, tail, block_tokens, dcp_size), end;
	if (__builtin_add_overflow(kv_block_off, (uint64_t)region->page_bytes, &end) ||
	    __builtin_add_overflow(slot_block_off, canon, &end))
		return -EOVERFLOW;

	struct emit e = {0};
	emit_region(&e, row_bytes, region->sem_bytes, tail, block_tokens, dcp_size, interleave, rank, kv_block_off,
		    slot_block_off);
	emit_flush(&e);
	if (e.n > cap)
		return -ENOSPC;
	e = (struct emit){.runs = runs};
	emit_region(&e, row_bytes, region->sem_bytes, tail, block_tokens, dcp_size, interleave, rank, kv_block_off,
		    slot_block_off);
	emit_flush(&e);
	return (int)e.n;
}

/* ---- a whole lane ----------------------------------------------------------------------- */

/* Row bytes of region i for g's rank (1 when dcp_size is 1: the page is copied whole), 0
 * when sem_bytes is not whole rows. */
static uint32_t region_row_bytes(const struct kvr_geometry *g, unsigned i)
{
	if (g->dcp_size == 1)
		return 1;
	uint64_t n = kvr_dcp_rank_tokens(g->block_tokens, g->dcp_size, g->dcp_interleave, g->dcp_rank);
	if (!n || g->sem_bytes[i] % n)
		return 0;
	return (uint32_t)(g->sem_bytes[i] / n);
}

static bool lane_shape_ok(const struct kvr_geometry *g)
{
	return g && g->n_regions && g->n_regions <= KVR_GEOM_MAX_REGIONS && g->dcp_rank < g->dcp_size &&
	       !kvr_dcp_check(g->block_tokens, g->dcp_size, g->dcp_interleave, NULL, 0);
}

static uint64_t region_canonical(const struct kvr_geometry *g, unsigned i)
{
	if (g->dcp_size == 1)
		return g->page_bytes[i];
	uint32_t row = region_row_bytes(g, i);
	if (!row || g->page_bytes[i] < g->sem_bytes[i])
		return 0;
	return kvr_dcp_canonical_page_bytes(row, g->page_bytes[i] - g->sem_bytes[i], g->block_tokens, g->dcp_size);
}

uint64_t kvr_dcp_canonical_lane_bytes(const struct kvr_geometry *g)
{
	if (!lane_shape_ok(g))
		return 0;
	uint64_t sum = 0;
	for (unsigned i = 0; i < g->n_regions; i++) {
		uint64_t c = region_canonical(g, i);
		if (!c || __builtin_add_overflow(sum, c, &sum))
			return 0;
	}
	return sum;
}

uint64_t kvr_dcp_canonical_region_offset(const struct kvr_geometry *g, unsigned i)
{
	if (!lane_shape_ok(g))
		return 0;
	uint64_t sum = 0;
	for (unsigned k = 0; k < i && k < g->n_regions; k++)
		sum += region_canonical(g, k);
	return sum;
}

size_t kvr_dcp_lane_max_runs(const struct kvr_geometry *g)
{
	if (!lane_shape_ok(g))
		return 0;
	return (size_t)g->n_regions * kvr_dcp_max_runs(g->block_tokens, g->dcp_size, g->dcp_interleave);
}

/* Emit the lane's runs into e; 0 or -errno with the reason in err. */
static int emit_lane(struct emit *e, const struct kvr_geometry *g, uint32_t block_id, uint64_t slot_off, char *err,
		     size_t errlen)
{
	uint64_t at = slot_off;
	for (unsigned i = 0; i < g->n_regions; i++) {
		struct kvr_region r = kvr_geometry_region(g, i);
		uint32_t row = region_row_bytes(g, i);
		if (!row)
			return kvr_errf(err, errlen, -EINVAL,
				    "region %u: sem_bytes %u is not whole rows of the %llu tokens DCP rank %u "
				    "holds",
				    i, r.sem_bytes,
				    (unsigned long long)kvr_dcp_rank_tokens(g->block_tokens, g->dcp_size,
									    g->dcp_interleave, g->dcp_rank),
				    g->dcp_rank);
		if (r.page_bytes < r.sem_bytes)
			return kvr_errf(err, errlen, -EINVAL, "region %u: sem_bytes %u > page_bytes %u", i, r.sem_bytes,
				    r.page_bytes);
		uint64_t canon = region_canonical(g, i), kv, end;
		if (__builtin_mul_overflow((uint64_t)block_id, r.stride, &kv) ||
		    __builtin_add_overflow(kv, r.offset, &kv) ||
		    __builtin_add_overflow(kv, (uint64_t)r.page_bytes, &end) || __builtin_add_overflow(at, canon, &end))
			return -EOVERFLOW;
		if (g->dcp_size == 1)
			emit_add(e, kv, at, r.page_bytes);
		else
			emit_region(e, row, r.sem_bytes, r.page_bytes - r.sem_bytes, g->block_tokens, g->dcp_size,
				    g->dcp_interleave, g->dcp_rank, kv, at);
		at = end;
	}
	emit_flush(e);
	return 0;
}

int kvr_dcp_lane_runs(const struct kvr_geometry *g, uint32_t block_id, uint64_t slot_off, struct kvr_dcp_run *runs,
		      size_t cap, char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!g || !runs)
		return kvr_errf(err, errlen, -EINVAL, "geometry or runs: missing");
	if (!g->n_regions || g->n_regions > KVR_GEOM_MAX_REGIONS)
		return kvr_errf(err, errlen, -EINVAL, "n_regions: %u (must be 1..%u)", g->n_regions, KVR_GEOM_MAX_REGIONS);
	if (g->dcp_rank >= g->dcp_size)
		return kvr_errf(err, errlen, -EINVAL, "dcp_rank: %u >= dcp_size %u", g->dcp_rank, g->dcp_size);
	int rc = kvr_dcp_check(g->block_tokens, g->dcp_size, g->dcp_interleave, err, errlen);
	if (rc)
		return rc;
	if (block_id >= g->num_blocks)
		return kvr_errf(err, errlen, -EINVAL, "block %u: >= num_blocks %u", block_id, g->num_blocks);

	struct emit e = {0};
	rc = emit_lane(&e, g, block_id, slot_off, err, errlen);
	if (rc)
		return rc;
	if (e.n > cap) {
		(void)kvr_errf(err, errlen, -EINVAL, "%zu runs needed, room for %zu", e.n, cap);
		return -ENOSPC;
	}
	e = (struct emit){.runs = runs};
	rc = emit_lane(&e, g, block_id, slot_off, err, errlen);
	return rc ? rc : (int)e.n;
}

bool kvr_dcp_layout_compatible(bool has_tail, uint32_t dcp_size, uint32_t interleave, uint32_t dcp_size2,
			       uint32_t interleave2)
{
	if (!has_tail)
		return true;
	if (dcp_size != dcp_size2)
		return false;
	return dcp_size == 1 || interleave == interleave2;
}

/* ---- DCP groups and the canonical geometry ---------------------------------------------- */

int kvr_dcp_group_check(const struct kvr_geometry *g, char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!g || !g->dcp_size || !g->tp_size)
		return kvr_errf(err, errlen, -EINVAL, "geometry: missing or without tp_size/dcp_size");
	if (g->dcp_size == 1)
		return 0;
	if (g->tp_size % g->dcp_size)
		return kvr_errf(err, errlen, -EINVAL,
				"dcp_size: %u does not divide tp_size %u (a DCP group is dcp_size consecutive TP ranks)",
				g->dcp_size, g->tp_size);
	if (g->dcp_rank != g->tp_rank % g->dcp_size)
		return kvr_errf(err, errlen, -EINVAL,
				"dcp_rank: %u, but TP rank %u is DCP rank %u of its group (dcp_rank = tp_rank mod dcp_size %u)",
				g->dcp_rank, g->tp_rank, g->tp_rank % g->dcp_size, g->dcp_size);
	return 0;
}

bool kvr_geometry_has_tail(const struct kvr_geometry *g)
{
	for (unsigned i = 0; g && i < g->n_regions && i < KVR_GEOM_MAX_REGIONS; i++)
		if (g->page_bytes[i] != g->sem_bytes[i])
			return true;
	return false;
}

int kvr_dcp_canonical_geometry(const struct kvr_geometry *g, struct kvr_geometry *ret, char *err, size_t errlen)
{
	int rc = kvr_dcp_group_check(g, err, errlen);
	if (rc)
		return rc;
	if (!lane_shape_ok(g))
		return kvr_errf(err, errlen, -EINVAL, "dcp: block_tokens %u, dcp_size %u, dcp_interleave %u break the rule",
				g->block_tokens, g->dcp_size, g->dcp_interleave);
	struct kvr_geometry c = *g;
	c.dcp_size = 1;
	c.dcp_rank = 0;
	c.dcp_interleave = 1;
	if (g->attention != KVR_ATTN_MLA) {
		c.tp_size = g->tp_size / g->dcp_size;
		c.tp_rank = g->tp_rank / g->dcp_size;
	}
	uint64_t off = 0;
	for (unsigned i = 0; i < g->n_regions; i++) {
		uint64_t page = region_canonical(g, i);
		uint64_t rows = g->dcp_size == 1 ? g->sem_bytes[i] : (uint64_t)region_row_bytes(g, i) * g->block_tokens;
		if (!page || page > UINT32_MAX || rows > page)
			return kvr_errf(err, errlen, -EINVAL, "region %u: canonical page of %llu bytes does not fit 32 bits", i,
					(unsigned long long)page);
		struct kvr_region r = {.offset = off, .stride = page, .page_bytes = (uint32_t)page,
				       .sem_bytes = (uint32_t)rows};
		if (kvr_geometry_set_region(&c, i, &r))
			return kvr_errf(err, errlen, -EINVAL, "region %u: canonical offset %llu does not fit", i,
					(unsigned long long)off);
		off += page * g->num_blocks;
	}
	*ret = c;
	return 0;
}
