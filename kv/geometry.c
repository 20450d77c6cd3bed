/* Geometry: region table validation with exact reasons, per-lane and per-block sizes, vLLM layouts, namespace. */
#include "kvr_log.h"
#include "kvr_geometry.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvr_ctl.h"
#include "kvr_dcp.h"
#include "kvr_proto.h"

_Static_assert(sizeof(struct kvr_geometry) <= KVR_PROTO_PAYLOAD_MAX, "the geometry is the attach payload");
_Static_assert(sizeof(struct kvr_geometry) <= KVR_CTL_GEOM_BYTES, "the geometry fits its control-segment area");
_Static_assert(KVR_CTL_GEOM_BYTES % 64 == 0, "control-segment geometry areas stay 64-byte aligned");
/* the limits that travel together: a lane per TP rank, a worker per rank (and a pin counter
 * per worker in every slot: l1/slots.c) */
_Static_assert(KVR_MAX_TP <= KVR_CTL_MAX_WORKERS, "every rank of a TP group attaches as one worker");

int kvr_geometry_set_region(struct kvr_geometry *g, unsigned i, const struct kvr_region *r)
{
	if (!g || !r || i >= KVR_GEOM_MAX_REGIONS)
		return -EINVAL;
	if (r->offset >= KVR_GEOM_MAX_OFFSET || r->stride > UINT32_MAX)
		return -ERANGE;
	g->offset_lo[i] = (uint32_t)r->offset;
	g->offset_hi[i] = (uint16_t)(r->offset >> 32);
	g->stride[i] = (uint32_t)r->stride;
	g->page_bytes[i] = r->page_bytes;
	g->sem_bytes[i] = r->sem_bytes;
	return 0;
}

/* Regions per layer in a layer-major table (1 or 2), 0 when n_regions does not fit. */
static unsigned per_layer(const struct kvr_geometry *g)
{
	if (g->layout != KVR_LAYOUT_LAYER_MAJOR || !g->layers)
		return 0;
	if (g->n_regions == g->layers)
		return 1;
	if (g->n_regions == 2 * g->layers)
		return 2;
	return 0;
}

char *kvr_geometry_region_name(const struct kvr_geometry *g, unsigned i, char *buf, size_t len)
{
	unsigned per = per_layer(g);
	if (per == 2)
		snprintf(buf, len, "layer %u %s", i / 2, i % 2 ? "V" : "K");
	else if (per == 1)
		snprintf(buf, len, "layer %u", i);
	else if (g->layout == KVR_LAYOUT_CROSS_LAYER)
		snprintf(buf, len, "cross-layer %u", i);
	else
		snprintf(buf, len, "region %u", i);
	return buf;
}

/* The integer interval of b in [0, n) where A + B*b < 0, as [*lo, *hi]; false when empty. */
static bool neg_interval(__int128 A, __int128 B, __int128 n, __int128 *lo, __int128 *hi)
{
	*lo = 0;
	*hi = n - 1;
	if (B == 0)
		return A < 0;
	if (B > 0) {
		/* B*b <= -A-1  <=>  b <= floor((-A-1)/B) */
		__int128 num = -A - 1;
		__int128 q = num >= 0 ? num / B : -((-num + B - 1) / B);
		if (q < *hi)
			*hi = q;
	} else {
		/* (-B)*b >= A+1  <=>  b >= ceil((A+1)/(-B)) */
		__int128 num = A + 1, d = -B;
		__int128 q = num >= 0 ? (num + d - 1) / d : -((-num) / d);
		if (q > *lo)
			*lo = q;
	}
	return *lo <= *hi;
}

/* First block in which regions i and j overlap, or -1. Region r of block b is
 * [o_r + b*s_r, o_r + b*s_r + p_r); they overlap iff start_i < end_j and start_j < end_i,
 * two conditions linear in b, so the blocks where both hold form one interval. */
static int64_t first_overlap(const struct kvr_region *ri, const struct kvr_region *rj, uint32_t nb)
{
	__int128 lo1, hi1, lo2, hi2;
	__int128 oi = ri->offset, oj = rj->offset, si = ri->stride, sj = rj->stride;
	if (!neg_interval(oi - oj - rj->page_bytes, si - sj, nb, &lo1, &hi1))
		return -1;
	if (!neg_interval(oj - oi - ri->page_bytes, sj - si, nb, &lo2, &hi2))
		return -1;
	__int128 lo = lo1 > lo2 ? lo1 : lo2, hi = hi1 < hi2 ? hi1 : hi2;
	return lo <= hi ? (int64_t)lo : -1;
}

/* The model and parallelism fields: layers, heads, dtype, block, TP. */
static int validate_shape(const struct kvr_geometry *g, char *err, size_t errlen)
{
	if (g->version != KVR_GEOMETRY_VERSION)
		return kvr_errf(err, errlen, -EINVAL, "version: %u (expected %u)", g->version, KVR_GEOMETRY_VERSION);
	if (!g->layers)
		return kvr_errf(err, errlen, -EINVAL, "layers: must be > 0");
	if (!g->kv_heads)
		return kvr_errf(err, errlen, -EINVAL, "kv_heads: must be > 0");
	if (!g->head_dim)
		return kvr_errf(err, errlen, -EINVAL, "head_dim: must be > 0");
	if (g->dtype_bytes != 1 && g->dtype_bytes != 2 && g->dtype_bytes != 4)
		return kvr_errf(err, errlen, -EINVAL, "dtype_bytes: %u (must be 1, 2 or 4)", g->dtype_bytes);
	if (!g->block_tokens)
		return kvr_errf(err, errlen, -EINVAL, "block_tokens: must be > 0");
	if (!g->tp_size || g->tp_size > KVR_MAX_TP)
		return kvr_errf(err, errlen, -EINVAL, "tp_size: %u (must be 1..%u)", g->tp_size, KVR_MAX_TP);
	if (g->tp_rank >= g->tp_size)
		return kvr_errf(err, errlen, -EINVAL, "tp_rank: %u >= tp_size %u", g->tp_rank, g->tp_size);
	return 0;
}

/* The decode-context-parallel fields: size, rank, interleave and the token split they make. */
static int validate_dcp(const struct kvr_geometry *g, char *err, size_t errlen)
{
	if (!g->dcp_size)
		return kvr_errf(err, errlen, -EINVAL, "dcp_size: must be > 0");
	if (g->dcp_size > KVR_DCP_MAX)
		return kvr_errf(err, errlen, -EINVAL, "dcp_size: %u (must be 1..%u)", g->dcp_size, KVR_DCP_MAX);
	if (g->dcp_rank >= g->dcp_size)
		return kvr_errf(err, errlen, -EINVAL, "dcp_rank: %u >= dcp_size %u", g->dcp_rank, g->dcp_size);
	if (!g->dcp_interleave)
		return kvr_errf(err, errlen, -EINVAL, "dcp_interleave: must be > 0");
	/* Without DCP the interleave means nothing: anything but 1 is a caller that mixed up its
	 * layout (or meant a dcp_size it did not set), refused here rather than ignored. */
	if (g->dcp_size == 1 && g->dcp_interleave != 1)
		return kvr_errf(err, errlen, -EINVAL, "dcp_interleave: %u with dcp_size 1 (without DCP it must be 1)",
			    g->dcp_interleave);
	/* every rank must hold the same tokens of every block (kvr_dcp.h proves the rule) */
	if (kvr_dcp_check(g->block_tokens, g->dcp_size, g->dcp_interleave, err, errlen))
		return -EINVAL;
	return 0;
}

/* Attention kind, page layout, block count and the shape of the region table. */
static int validate_layout(const struct kvr_geometry *g, char *err, size_t errlen)
{
	if (g->attention != KVR_ATTN_MHA && g->attention != KVR_ATTN_MLA)
		return kvr_errf(err, errlen, -EINVAL, "attention: %u (must be %u (mha) or %u (mla))", g->attention, KVR_ATTN_MHA,
			    KVR_ATTN_MLA);
	if (g->layout != KVR_LAYOUT_LAYER_MAJOR && g->layout != KVR_LAYOUT_CROSS_LAYER)
		return kvr_errf(err, errlen, -EINVAL, "layout: %u (must be %u (layer-major) or %u (cross-layer))", g->layout,
			    KVR_LAYOUT_LAYER_MAJOR, KVR_LAYOUT_CROSS_LAYER);
	if (g->dcp_size > 1 && g->layout != KVR_LAYOUT_LAYER_MAJOR)
		return kvr_errf(err, errlen, -EINVAL, "layout: %u (DCP splits pages by token: dcp_size %u needs layer-major pages)",
			    g->layout, g->dcp_size);
	if (!g->num_blocks)
		return kvr_errf(err, errlen, -EINVAL, "num_blocks: must be > 0");
	if (g->reserved)
		return kvr_errf(err, errlen, -EINVAL, "reserved: must be 0");
	if (!g->n_regions || g->n_regions > KVR_GEOM_MAX_REGIONS)
		return kvr_errf(err, errlen, -EINVAL, "n_regions: %u (must be 1..%u)", g->n_regions, KVR_GEOM_MAX_REGIONS);
	if (g->layout == KVR_LAYOUT_LAYER_MAJOR && !per_layer(g))
		return kvr_errf(err, errlen, -EINVAL, "n_regions: %u (layer-major needs layers %u x 1 or x 2)", g->n_regions,
			    g->layers);
	for (unsigned i = g->n_regions; i < KVR_GEOM_MAX_REGIONS; i++)
		if (g->page_bytes[i] || g->sem_bytes[i] || g->stride[i] || g->offset_lo[i] || g->offset_hi[i])
			return kvr_errf(err, errlen, -EINVAL, "region %u: beyond n_regions %u but not zero", i, g->n_regions);
	return 0;
}

/* One region on its own: sizes, DCP rows, stride, and its last block inside kv_bytes. */
static int validate_region(const struct kvr_geometry *g, unsigned i, uint64_t kv_bytes, char *err, size_t errlen)
{
	char name[32];
	struct kvr_region r = kvr_geometry_region(g, i);
	kvr_geometry_region_name(g, i, name, sizeof(name));
	if (!r.page_bytes)
		return kvr_errf(err, errlen, -EINVAL, "region %u (%s): page_bytes must be > 0", i, name);
	if (!r.sem_bytes)
		return kvr_errf(err, errlen, -EINVAL, "region %u (%s): sem_bytes must be > 0", i, name);
	if (r.sem_bytes > r.page_bytes)
		return kvr_errf(err, errlen, -EINVAL, "region %u (%s): sem_bytes %u > page_bytes %u", i, name, r.sem_bytes,
			    r.page_bytes);
	uint64_t dcp_tokens = kvr_dcp_rank_tokens(g->block_tokens, g->dcp_size, g->dcp_interleave, g->dcp_rank);
	if (g->dcp_size > 1 && r.sem_bytes % dcp_tokens)
		return kvr_errf(err, errlen, -EINVAL, "region %u (%s): sem_bytes %u is not whole rows of the %" PRIu64
			    " tokens DCP rank %u holds", i, name, r.sem_bytes, dcp_tokens, g->dcp_rank);
	if (g->num_blocks > 1 && r.page_bytes > r.stride)
		return kvr_errf(err, errlen, -EINVAL, "region %u (%s): page_bytes %u > stride %" PRIu64, i, name,
			    r.page_bytes, r.stride);
	unsigned __int128 end = (unsigned __int128)r.offset +
				(unsigned __int128)(g->num_blocks - 1) * r.stride + r.page_bytes;
	if (end > kv_bytes) {
		if (end > UINT64_MAX)
			return kvr_errf(err, errlen, -EINVAL, "region %u (%s): block %u ends past 2^64 > kv_bytes %" PRIu64,
				    i, name, g->num_blocks - 1, kv_bytes);
		return kvr_errf(err, errlen, -EINVAL, "region %u (%s): block %u ends at %" PRIu64 " > kv_bytes %" PRIu64,
			    i, name, g->num_blocks - 1, (uint64_t)end, kv_bytes);
	}
	return 0;
}

/* No two regions share a byte in any block; the first pair that does is named. */
static int validate_overlaps(const struct kvr_geometry *g, char *err, size_t errlen)
{
	char name[32], name2[32];
	for (unsigned i = 0; i < g->n_regions; i++) {
		struct kvr_region ri = kvr_geometry_region(g, i);
		for (unsigned j = i + 1; j < g->n_regions; j++) {
			struct kvr_region rj = kvr_geometry_region(g, j);
			int64_t b = first_overlap(&ri, &rj, g->num_blocks);
			if (b < 0)
				continue;
			uint64_t si = ri.offset + (uint64_t)b * ri.stride, sj = rj.offset + (uint64_t)b * rj.stride;
			return kvr_errf(err, errlen, -EINVAL,
				    "region %u (%s) and region %u (%s) overlap in block %" PRId64 ": [%" PRIu64
				    ", %" PRIu64 ") and [%" PRIu64 ", %" PRIu64 ")",
				    i, kvr_geometry_region_name(g, i, name, sizeof(name)), j,
				    kvr_geometry_region_name(g, j, name2, sizeof(name2)), b, si, si + ri.page_bytes, sj,
				    sj + rj.page_bytes);
		}
	}
	return 0;
}

int kvr_geometry_validate(const struct kvr_geometry *g, uint64_t kv_bytes, char *err, size_t errlen)
{
	int rc;
	if (err && errlen)
		err[0] = '\0';
	if (!g)
		return kvr_errf(err, errlen, -EINVAL, "geometry: missing");
	if ((rc = validate_shape(g, err, errlen)) || (rc = validate_dcp(g, err, errlen)) ||
	    (rc = validate_layout(g, err, errlen)))
		return rc;
	for (unsigned i = 0; i < g->n_regions; i++)
		if ((rc = validate_region(g, i, kv_bytes, err, errlen)))
			return rc;
	return validate_overlaps(g, err, errlen);
}

uint64_t kvr_geometry_lane_bytes(const struct kvr_geometry *g)
{
	uint64_t sum = 0;
	unsigned n = g->n_regions < KVR_GEOM_MAX_REGIONS ? g->n_regions : KVR_GEOM_MAX_REGIONS;
	for (unsigned i = 0; i < n; i++)
		sum += g->page_bytes[i];
	return sum;
}

uint32_t kvr_geometry_lanes(const struct kvr_geometry *g)
{
	return g->attention == KVR_ATTN_MLA ? 1 : g->tp_size;
}

uint64_t kvr_geometry_block_bytes_all_ranks(const struct kvr_geometry *g)
{
	return kvr_geometry_lane_bytes(g) * kvr_geometry_lanes(g);
}

uint64_t kvr_geometry_kv_extent(const struct kvr_geometry *g)
{
	uint64_t max = 0;
	unsigned n = g->n_regions < KVR_GEOM_MAX_REGIONS ? g->n_regions : KVR_GEOM_MAX_REGIONS;
	for (unsigned i = 0; i < n && g->num_blocks; i++) {
		struct kvr_region r = kvr_geometry_region(g, i);
		uint64_t end = r.offset + (uint64_t)(g->num_blocks - 1) * r.stride + r.page_bytes;
		if (end > max)
			max = end;
	}
	return max;
}

/* Fill regions for `layers` layers of `per` consecutive [num_blocks, page] tensors each. */
static int fill_tensors(struct kvr_geometry *g, uint32_t layers, uint32_t per, uint64_t page, uint32_t num_blocks)
{
	if (page > UINT32_MAX)
		return -ERANGE;
	uint64_t tensor = page * num_blocks; /* < 2^64: both factors < 2^32 */
	unsigned n = layers * per;
	if ((unsigned __int128)tensor * n > KVR_GEOM_MAX_OFFSET)
		return -ERANGE;
	for (unsigned i = 0; i < n; i++) {
		struct kvr_region r = {.offset = tensor * i, .stride = page, .page_bytes = (uint32_t)page,
				       .sem_bytes = (uint32_t)page};
		int rc = kvr_geometry_set_region(g, i, &r);
		if (rc)
			return rc;
	}
	g->n_regions = n;
	return 0;
}

static void init_common(struct kvr_geometry *g, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
			uint32_t dtype_bytes, uint32_t block_tokens, uint32_t num_blocks, uint32_t attention)
{
	memset(g, 0, sizeof(*g));
	g->version = KVR_GEOMETRY_VERSION;
	g->layers = layers;
	g->kv_heads = kv_heads;
	g->head_dim = head_dim;
	g->dtype_bytes = dtype_bytes;
	g->block_tokens = block_tokens;
	g->tp_size = 1;
	g->dcp_size = 1;
	g->dcp_interleave = 1;
	g->attention = attention;
	g->layout = KVR_LAYOUT_LAYER_MAJOR;
	g->num_blocks = num_blocks;
}

/* An MHA/GQA layer-major geometry whose layers are `per_layer` tensors (2: K then V; 1: K and
 * V rows in one page) of rows_per_block * kv_heads * head_dim elements a block each. */
static int fill_mha(struct kvr_geometry *g, uint32_t layers, unsigned per_layer, uint32_t kv_heads,
		    uint32_t head_dim, uint32_t dtype_bytes, uint32_t block_tokens, uint32_t num_blocks)
{
	if (!g || !layers || !kv_heads || !head_dim || !dtype_bytes || !block_tokens || !num_blocks ||
	    layers > KVR_GEOM_MAX_REGIONS / per_layer)
		return -EINVAL;
	struct kvr_geometry tmp;
	init_common(&tmp, layers, kv_heads, head_dim, dtype_bytes, block_tokens, num_blocks, KVR_ATTN_MHA);
	/* one page: a block's rows of one tensor (fused: K and V rows) */
	uint64_t page = (uint64_t)(3 - per_layer) * block_tokens * kv_heads * head_dim; /* < 2^64 */
	if (page > UINT32_MAX / dtype_bytes)
		return -ERANGE;
	int rc = fill_tensors(&tmp, layers, per_layer, page * dtype_bytes, num_blocks);
	if (rc)
		return rc;
	*g = tmp;
	return 0;
}

int kvr_geometry_fill_vllm_layer_major(struct kvr_geometry *g, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
				       uint32_t dtype_bytes, uint32_t block_tokens, uint32_t num_blocks)
{
	return fill_mha(g, layers, 2, kv_heads, head_dim, dtype_bytes, block_tokens, num_blocks);
}

int kvr_geometry_fill_vllm_fused(struct kvr_geometry *g, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
				 uint32_t dtype_bytes, uint32_t block_tokens, uint32_t num_blocks)
{
	return fill_mha(g, layers, 1, kv_heads, head_dim, dtype_bytes, block_tokens, num_blocks);
}

int kvr_geometry_fill_vllm_mla(struct kvr_geometry *g, uint32_t layers, uint32_t latent_dim, uint32_t dtype_bytes,
			       uint32_t block_tokens, uint32_t num_blocks)
{
	if (!g || !layers || !latent_dim || !dtype_bytes || !block_tokens || !num_blocks ||
	    layers > KVR_GEOM_MAX_REGIONS)
		return -EINVAL;
	struct kvr_geometry tmp;
	init_common(&tmp, layers, 1, latent_dim, dtype_bytes, block_tokens, num_blocks, KVR_ATTN_MLA);
	uint64_t page = (uint64_t)block_tokens * latent_dim;
	if (page > UINT32_MAX / dtype_bytes)
		return -ERANGE;
	int rc = fill_tensors(&tmp, layers, 1, page * dtype_bytes, num_blocks);
	if (rc)
		return rc;
	*g = tmp;
	return 0;
}

/* ---- namespace -------------------------------------------------------------------------- */

static void put_u32(XXH3_state_t *st, uint32_t v)
{
	uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
	(void)XXH3_128bits_update(st, b, sizeof(b));
}

static void put_str(XXH3_state_t *st, const char *s)
{
	size_t len = strlen(s);
	put_u32(st, (uint32_t)len);
	(void)XXH3_128bits_update(st, s, len);
}

int kvr_geometry_namespace(const struct kvr_geometry *g, const char *model_id, const char *cache_salt,
			   kvr_key *ret_ns)
{
	if (!g || !model_id || !ret_ns || !g->n_regions || g->n_regions > KVR_GEOM_MAX_REGIONS)
		return -EINVAL;
	if (strlen(model_id) > UINT32_MAX || (cache_salt && strlen(cache_salt) > UINT32_MAX))
		return -EINVAL;
	static const char tag[] = "kvring.namespace.v1";
	/* A DCP rank names the canonical block of its group; a block whose pages carry tails
	 * loads only under the layout it was stored under, so that layout joins the name. */
	struct kvr_geometry canon;
	uint32_t layout_d = 0, layout_i = 0;
	if (g->dcp_size > 1) {
		if (kvr_dcp_canonical_geometry(g, &canon, NULL, 0))
			return -EINVAL;
		if (kvr_geometry_has_tail(g)) {
			layout_d = g->dcp_size;
			layout_i = g->dcp_interleave;
		}
		g = &canon;
	}
	bool mla = g->attention == KVR_ATTN_MLA;

	XXH3_state_t st;
	XXH3_INITSTATE(&st);
	(void)XXH3_128bits_reset(&st);
	(void)XXH3_128bits_update(&st, tag, sizeof(tag)); /* with its NUL */
	put_str(&st, model_id);
	put_u32(&st, g->dtype_bytes);
	put_u32(&st, g->attention);
	put_u32(&st, g->layers);
	put_u32(&st, mla ? g->kv_heads : g->kv_heads * g->tp_size);
	put_u32(&st, g->head_dim);
	put_u32(&st, g->block_tokens);
	put_u32(&st, mla ? 0 : g->tp_size);
	put_u32(&st, g->n_regions);
	for (unsigned i = 0; i < g->n_regions; i++)
		put_u32(&st, g->page_bytes[i]);
	put_str(&st, cache_salt ? cache_salt : "");
	if (layout_d) {
		static const char dcp_tag[] = "dcp";
		(void)XXH3_128bits_update(&st, dcp_tag, sizeof(dcp_tag));
		put_u32(&st, layout_d);
		put_u32(&st, layout_i);
	}
	XXH128_hash_t h = XXH3_128bits_digest(&st);
	*ret_ns = (kvr_key){.lo = h.low64, .hi = h.high64};
	return 0;
}

/* ---- capacity ---------------------------------------------------------------------------- */

uint64_t kvr_capacity_blocks(uint64_t prompts, uint64_t tokens_per_prompt, uint32_t block_tokens)
{
	if (!block_tokens)
		return 0;
	uint64_t per = tokens_per_prompt / block_tokens + (tokens_per_prompt % block_tokens != 0);
	uint64_t r;
	if (__builtin_mul_overflow(prompts, per, &r))
		return UINT64_MAX;
	return r;
}

int kvr_capacity_bytes(const struct kvr_geometry *g, uint64_t prompts, uint64_t tokens_per_prompt,
		       uint64_t *ret_bytes)
{
	if (!g || !ret_bytes || !g->block_tokens)
		return -EINVAL;
	uint64_t blocks = kvr_capacity_blocks(prompts, tokens_per_prompt, g->block_tokens), r;
	if (blocks == UINT64_MAX || __builtin_mul_overflow(blocks, kvr_geometry_block_bytes_all_ranks(g), &r))
		return -EOVERFLOW;
	*ret_bytes = r;
	return 0;
}

int kvr_slots_namespace(uint64_t slot_bytes, const char *cache_salt, kvr_key *ret_ns)
{
	if (!slot_bytes || !ret_ns || (cache_salt && strlen(cache_salt) > UINT32_MAX))
		return -EINVAL;
	static const char tag[] = "kvring.slots.v2";
	XXH3_state_t st;
	XXH3_INITSTATE(&st);
	(void)XXH3_128bits_reset(&st);
	(void)XXH3_128bits_update(&st, tag, sizeof(tag)); /* with its NUL */
	put_u32(&st, (uint32_t)slot_bytes);
	put_u32(&st, (uint32_t)(slot_bytes >> 32));
	put_str(&st, cache_salt ? cache_salt : "");
	XXH128_hash_t h = XXH3_128bits_digest(&st);
	*ret_ns = (kvr_key){.lo = h.low64, .hi = h.high64};
	return 0;
}
