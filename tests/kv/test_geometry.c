/* Geometry tests: validation table with exact reasons, presets, lane/block sizes, capacity, namespace. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_proto.h"

/* kvr_geometry_namespace of glm-4-9b-chat-1m, TP 2, 128-token blocks, id
 * "THUDM/glm-4-9b-chat-1m", no salt. */
#define GOLDEN_NS_GLM "4b545b91d64e0666d2a2ccdf1c615bff"

TestSuite(geometry);

/* 2 layers x (K, V), 1 head of 8 x bf16, 16-token blocks, 4 blocks: 256-byte pages,
 * regions at 0, 1024, 2048, 3072: KV memory of 4096 bytes. */
static struct kvr_geometry small_geom(void)
{
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 2, 1, 8, 2, 16, 4), 0);
	return g;
}

static void set_region(struct kvr_geometry *g, unsigned i, uint64_t off, uint64_t stride, uint32_t page, uint32_t sem)
{
	struct kvr_region r = {.offset = off, .stride = stride, .page_bytes = page, .sem_bytes = sem};
	cr_assert_eq(kvr_geometry_set_region(g, i, &r), 0);
}

static void m_none(struct kvr_geometry *g) { (void)g; }
static void m_version(struct kvr_geometry *g) { g->version = 2; }
static void m_layers(struct kvr_geometry *g) { g->layers = 0; }
static void m_heads(struct kvr_geometry *g) { g->kv_heads = 0; }
static void m_dim(struct kvr_geometry *g) { g->head_dim = 0; }
static void m_dtype(struct kvr_geometry *g) { g->dtype_bytes = 3; }
static void m_bt(struct kvr_geometry *g) { g->block_tokens = 0; }
static void m_tp_size(struct kvr_geometry *g) { g->tp_size = 17; }
static void m_tp_rank(struct kvr_geometry *g) { g->tp_size = 2; g->tp_rank = 2; }
static void m_dcp_size(struct kvr_geometry *g) { g->dcp_size = 0; }
static void m_dcp_rank(struct kvr_geometry *g) { g->dcp_size = 2; g->dcp_rank = 2; }
static void m_dcp_il(struct kvr_geometry *g) { g->dcp_interleave = 0; }
static void m_dcp_il_7(struct kvr_geometry *g) { g->dcp_interleave = 7; }
static void m_dcp_il_big(struct kvr_geometry *g) { g->dcp_interleave = 64; } /* > block_tokens 16 */
static void m_dcp_il_dcp(struct kvr_geometry *g) { g->dcp_size = 2; g->dcp_interleave = 8; } /* 16 = 2 x 8 */
static void m_attn(struct kvr_geometry *g) { g->attention = 7; }
static void m_layout(struct kvr_geometry *g) { g->layout = 0; }
static void m_nblocks(struct kvr_geometry *g) { g->num_blocks = 0; }
static void m_reserved(struct kvr_geometry *g) { g->reserved = 1; }
static void m_nreg0(struct kvr_geometry *g) { g->n_regions = 0; }
static void m_nreg_big(struct kvr_geometry *g) { g->n_regions = 1025; }
static void m_nreg_layers(struct kvr_geometry *g) { g->n_regions = 3; }
static void m_unused(struct kvr_geometry *g) { g->page_bytes[100] = 1; }
static void m_page0(struct kvr_geometry *g) { g->page_bytes[2] = 0; }
static void m_sem0(struct kvr_geometry *g) { g->sem_bytes[1] = 0; }
static void m_sem_gt(struct kvr_geometry *g) { g->sem_bytes[0] = 300; }
static void m_page_stride(struct kvr_geometry *g) { set_region(g, 3, 3072, 2048, 4096, 4096); }
static void m_kv_small(struct kvr_geometry *g) { g->num_blocks = 5; }
static void m_overlap0(struct kvr_geometry *g) { set_region(g, 1, 128, 256, 256, 256); }
static void m_overlap_later(struct kvr_geometry *g)
{
	/* block 0: [0,256) and [256,512) touch; block 1: [1024,1280) and [1152,1408) overlap */
	g->layers = 1;
	g->n_regions = 2;
	memset(&g->page_bytes[2], 0, 2 * sizeof(g->page_bytes[0]));
	memset(&g->sem_bytes[2], 0, 2 * sizeof(g->sem_bytes[0]));
	memset(&g->stride[2], 0, 2 * sizeof(g->stride[0]));
	memset(&g->offset_lo[2], 0, 2 * sizeof(g->offset_lo[0]));
	set_region(g, 0, 0, 1024, 256, 256);
	set_region(g, 1, 256, 896, 256, 256);
}
static void m_interleaved(struct kvr_geometry *g)
{
	/* K and V of each block side by side (a FlashInfer-like layout): valid */
	set_region(g, 0, 0, 512, 256, 256);
	set_region(g, 1, 256, 512, 256, 256);
	set_region(g, 2, 2048, 512, 256, 256);
	set_region(g, 3, 2304, 512, 256, 256);
}
static void m_cross(struct kvr_geometry *g)
{
	/* cross-layer: one 1024-byte region per block (valid) */
	g->layout = KVR_LAYOUT_CROSS_LAYER;
	memset(g->page_bytes, 0, sizeof(g->page_bytes));
	memset(g->sem_bytes, 0, sizeof(g->sem_bytes));
	memset(g->stride, 0, sizeof(g->stride));
	memset(g->offset_lo, 0, sizeof(g->offset_lo));
	g->n_regions = 1;
	set_region(g, 0, 0, 1024, 1000, 960);
}
static void m_mla(struct kvr_geometry *g) { g->attention = KVR_ATTN_MLA; }
static void m_one_block(struct kvr_geometry *g) { g->num_blocks = 1; set_region(g, 0, 0, 0, 256, 256); }

static const struct vcase {
	const char *name;
	void (*mut)(struct kvr_geometry *);
	uint64_t kv_bytes;
	const char *reason; /* NULL: valid */
} vcases[] = {
	{"good", m_none, 4096, NULL},
	{"good interleaved K/V", m_interleaved, 4096, NULL},
	{"good cross-layer", m_cross, 4096, NULL},
	{"good mla", m_mla, 4096, NULL},
	{"good one block, stride 0", m_one_block, 4096, NULL},
	{"kv memory larger than needed", m_none, 1 << 20, NULL},
	{"version", m_version, 4096, "version: 2 (expected 1)"},
	{"layers", m_layers, 4096, "layers: must be > 0"},
	{"kv_heads", m_heads, 4096, "kv_heads: must be > 0"},
	{"head_dim", m_dim, 4096, "head_dim: must be > 0"},
	{"dtype", m_dtype, 4096, "dtype_bytes: 3 (must be 1, 2 or 4)"},
	{"block_tokens", m_bt, 4096, "block_tokens: must be > 0"},
	{"tp_size", m_tp_size, 4096, "tp_size: 17 (must be 1..16)"},
	{"tp_rank", m_tp_rank, 4096, "tp_rank: 2 >= tp_size 2"},
	{"dcp_size", m_dcp_size, 4096, "dcp_size: must be > 0"},
	{"dcp_rank", m_dcp_rank, 4096, "dcp_rank: 2 >= dcp_size 2"},
	{"dcp_interleave", m_dcp_il, 4096, "dcp_interleave: must be > 0"},
	{"dcp_interleave 7 without DCP", m_dcp_il_7, 4096, "dcp_interleave: 7 with dcp_size 1 (without DCP it must be 1)"},
	{"dcp_interleave > block_tokens without DCP", m_dcp_il_big, 4096,
	 "dcp_interleave: 64 with dcp_size 1 (without DCP it must be 1)"},
	{"good dcp_interleave 8 under DCP 2", m_dcp_il_dcp, 4096, NULL},
	{"attention", m_attn, 4096, "attention: 7 (must be 1 (mha) or 2 (mla))"},
	{"layout", m_layout, 4096, "layout: 0 (must be 1 (layer-major) or 2 (cross-layer))"},
	{"num_blocks", m_nblocks, 4096, "num_blocks: must be > 0"},
	{"reserved", m_reserved, 4096, "reserved: must be 0"},
	{"n_regions 0", m_nreg0, 4096, "n_regions: 0 (must be 1..1024)"},
	{"n_regions 1025", m_nreg_big, 4096, "n_regions: 1025 (must be 1..1024)"},
	{"n_regions vs layers", m_nreg_layers, 4096, "n_regions: 3 (layer-major needs layers 2 x 1 or x 2)"},
	{"unused entry", m_unused, 4096, "region 100: beyond n_regions 4 but not zero"},
	{"page 0", m_page0, 4096, "region 2 (layer 1 K): page_bytes must be > 0"},
	{"sem 0", m_sem0, 4096, "region 1 (layer 0 V): sem_bytes must be > 0"},
	{"sem > page", m_sem_gt, 4096, "region 0 (layer 0 K): sem_bytes 300 > page_bytes 256"},
	{"page > stride", m_page_stride, 1 << 20, "region 3 (layer 1 V): page_bytes 4096 > stride 2048"},
	{"kv too small", m_none, 4095, "region 3 (layer 1 V): block 3 ends at 4096 > kv_bytes 4095"},
	{"kv too small, 5 blocks", m_kv_small, 4096, "region 3 (layer 1 V): block 4 ends at 4352 > kv_bytes 4096"},
	{"overlap in block 0", m_overlap0, 4096,
	 "region 0 (layer 0 K) and region 1 (layer 0 V) overlap in block 0: [0, 256) and [128, 384)"},
	{"overlap in block 1 only", m_overlap_later, 4096,
	 "region 0 (layer 0 K) and region 1 (layer 0 V) overlap in block 1: [1024, 1280) and [1152, 1408)"},
};

Test(geometry, validate_table)
{
	for (size_t i = 0; i < sizeof(vcases) / sizeof(vcases[0]); i++) {
		const struct vcase *c = &vcases[i];
		struct kvr_geometry g = small_geom();
		c->mut(&g);
		char err[KVR_GEOM_ERR_MAX];
		memset(err, 'x', sizeof(err));
		int rc = kvr_geometry_validate(&g, c->kv_bytes, err, sizeof(err));
		if (!c->reason) {
			cr_expect_eq(rc, 0, "%s: rc %d (%s)", c->name, rc, err);
			cr_expect_str_eq(err, "", "%s", c->name);
		} else {
			cr_expect_eq(rc, -EINVAL, "%s: rc %d", c->name, rc);
			cr_expect_str_eq(err, c->reason, "%s", c->name);
		}
	}
}

Test(geometry, kv_bytes_exact_and_small_err_buffer)
{
	/* the exact boundary: the last region ends at 4096 */
	struct kvr_geometry g = small_geom();
	cr_assert_eq(kvr_geometry_kv_extent(&g), 4096);
	cr_assert_eq(kvr_geometry_validate(&g, 4096, NULL, 0), 0);
	char err[8];
	cr_assert_eq(kvr_geometry_validate(&g, 4095, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "region ", "truncated, NUL-terminated");
	cr_assert_eq(kvr_geometry_validate(NULL, 4096, err, sizeof(err)), -EINVAL);
}

Test(geometry, set_region_limits)
{
	struct kvr_geometry g = small_geom();
	struct kvr_region r = {.offset = (1ull << 48) - 1, .stride = UINT32_MAX, .page_bytes = 7, .sem_bytes = 5};
	cr_assert_eq(kvr_geometry_set_region(&g, 159, &r), 0);
	struct kvr_region back = kvr_geometry_region(&g, 159);
	cr_assert_eq(back.offset, (1ull << 48) - 1);
	cr_assert_eq(back.stride, UINT32_MAX);
	cr_assert_eq(back.page_bytes, 7);
	cr_assert_eq(back.sem_bytes, 5);
	r.offset = 1ull << 48;
	cr_assert_eq(kvr_geometry_set_region(&g, 0, &r), -ERANGE);
	r.offset = 0;
	r.stride = 1ull << 32;
	cr_assert_eq(kvr_geometry_set_region(&g, 0, &r), -ERANGE);
	cr_assert_eq(kvr_geometry_set_region(&g, KVR_GEOM_MAX_REGIONS, &r), -EINVAL);
	cr_assert_eq(kvr_geometry_region(&g, 0).stride, 256, "untouched on failure");
}

Test(geometry, layout_fits_attach_payload)
{
	cr_assert_eq(sizeof(struct kvr_geometry), 64 + 18 * 1024);
	cr_assert_leq(sizeof(struct kvr_geometry) + sizeof(struct kvr_attach_engine), KVR_PROTO_PAYLOAD_MAX);
}

Test(geometry, vllm_layer_major_regions)
{
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 3, 2, 64, 2, 16, 10), 0);
	uint64_t page = 16 * 2 * 64 * 2, tensor = page * 10;
	cr_assert_eq(g.n_regions, 6);
	for (unsigned i = 0; i < 6; i++) {
		struct kvr_region r = kvr_geometry_region(&g, i);
		cr_assert_eq(r.offset, tensor * i, "region %u", i);
		cr_assert_eq(r.stride, page);
		cr_assert_eq(r.page_bytes, page);
		cr_assert_eq(r.sem_bytes, page);
	}
	cr_assert_eq(kvr_geometry_kv_extent(&g), tensor * 6);
	cr_assert_eq(kvr_geometry_validate(&g, tensor * 6, NULL, 0), 0);
	cr_assert_eq(g.tp_size, 1);
	cr_assert_eq(g.dcp_size, 1);
	cr_assert_eq(g.dcp_interleave, 1);
	cr_assert_eq(g.layout, KVR_LAYOUT_LAYER_MAJOR);
	cr_assert_eq(g.attention, KVR_ATTN_MHA);
	cr_assert_eq(kvr_geometry_lane_bytes(&g), page * 6);

	char name[32];
	cr_assert_str_eq(kvr_geometry_region_name(&g, 5, name, sizeof(name)), "layer 2 V");
	cr_assert_str_eq(kvr_geometry_region_name(&g, 2, name, sizeof(name)), "layer 1 K");

	struct kvr_geometry keep = g;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 513, 2, 64, 2, 16, 10), -EINVAL, "1026 regions");
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 0, 2, 64, 2, 16, 10), -EINVAL);
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 2, 1 << 16, 1 << 16, 2, 16, 10), -ERANGE, "page > 4 GiB");
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 80, 8, 128, 2, 128, 1u << 31), -ERANGE, "past 2^48");
	cr_assert_eq(memcmp(&g, &keep, sizeof(g)), 0, "untouched on failure");
}

Test(geometry, presets)
{
	cr_assert_str_eq(kvr_preset_list(), "glm-4-9b-chat-1m, qwen3-8b, qwen3-32b, llama-3.1-8b, llama-3.1-70b, "
					    "deepseek-v2-lite, deepseek-v3, deepseek-v3.2-fp8, qwen2.5-72b");
	cr_assert_eq(kvr_preset_count(), 9);
	cr_assert_null(kvr_preset_find("gpt-5"));
	cr_assert_null(kvr_preset_find(NULL));
	cr_assert_null(kvr_preset_at(9));

	static const struct {
		const char *name;
		uint32_t tp, layers, heads, regions;
		uint64_t lane, all;
	} rows[] = {
		/* GLM-4-9B TP2 block 128: 40 x 2 x (128 tok x 2 heads x 128 x 2 B = 65,536) */
		{"glm-4-9b-chat-1m", 2, 40, 2, 80, 5242880, 10485760},
		{"glm-4-9b-chat-1m", 1, 40, 4, 80, 10485760, 10485760},
		{"glm-4-9b-chat-1m", 8, 40, 1, 80, 2621440, 20971520}, /* heads replicated */
		{"qwen3-8b", 1, 36, 8, 72, 18874368, 18874368},
		{"qwen3-8b", 2, 36, 4, 72, 9437184, 18874368},
		{"llama-3.1-8b", 1, 32, 8, 64, 16777216, 16777216},
		{"llama-3.1-70b", 8, 80, 1, 160, 5242880, 41943040},
		{"qwen3-32b", 4, 64, 2, 128, 8388608, 33554432},
		/* MLA: 27 x 128 x 576 x 2 B, one lane whatever the TP size */
		{"deepseek-v2-lite", 8, 27, 1, 27, 3981312, 3981312},
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const struct kvr_preset *p = kvr_preset_find(rows[i].name);
		cr_assert_not_null(p, "%s", rows[i].name);
		struct kvr_geometry g;
		cr_assert_eq(kvr_preset_geometry(p, rows[i].tp, rows[i].tp - 1, 128, 100, &g), 0, "%s", rows[i].name);
		cr_expect_eq(g.layers, rows[i].layers, "%s", rows[i].name);
		cr_expect_eq(g.kv_heads, rows[i].heads, "%s tp %u", rows[i].name, rows[i].tp);
		cr_expect_eq(g.n_regions, rows[i].regions, "%s", rows[i].name);
		cr_expect_eq(g.tp_size, rows[i].tp);
		cr_expect_eq(g.tp_rank, rows[i].tp - 1);
		cr_expect_eq(kvr_geometry_lane_bytes(&g), rows[i].lane, "%s tp %u", rows[i].name, rows[i].tp);
		cr_expect_eq(kvr_geometry_block_bytes_all_ranks(&g), rows[i].all, "%s tp %u", rows[i].name, rows[i].tp);
		char err[KVR_GEOM_ERR_MAX];
		cr_expect_eq(kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), err, sizeof(err)), 0, "%s: %s",
			     rows[i].name, err);
	}

	const struct kvr_preset *glm = kvr_preset_find("glm-4-9b-chat-1m");
	cr_assert_str_eq(glm->hf_id, "THUDM/glm-4-9b-chat-1m");
	cr_assert_eq(glm->kv_heads_total, 4);
	cr_assert_eq(glm->head_dim, 128);
	cr_assert_eq(glm->dtype_bytes, 2);
	struct kvr_geometry g;
	cr_assert_eq(kvr_preset_geometry(glm, 3, 0, 128, 100, &g), -EINVAL, "4 heads over 3 ranks");
	cr_assert_eq(kvr_preset_geometry(glm, 2, 2, 128, 100, &g), -EINVAL, "rank 2 of 2");
	cr_assert_eq(kvr_preset_geometry(glm, 2, 0, 0, 100, &g), -EINVAL);
	cr_assert_eq(kvr_preset_geometry(glm, 2, 0, 128, 0, &g), -EINVAL);
	cr_assert_eq(kvr_preset_geometry(glm, 2, 1, 16, 100, &g), 0);
	cr_assert_eq(kvr_geometry_region(&g, 0).page_bytes, 16 * 2 * 128 * 2, "16-token blocks");
}

Test(geometry, capacity)
{
	cr_assert_eq(kvr_capacity_blocks(200, 10000, 128), 15800);
	cr_assert_eq(kvr_capacity_blocks(1, 128, 128), 1);
	cr_assert_eq(kvr_capacity_blocks(1, 129, 128), 2);
	cr_assert_eq(kvr_capacity_blocks(3, 0, 128), 0);
	cr_assert_eq(kvr_capacity_blocks(0, 10000, 128), 0);
	cr_assert_eq(kvr_capacity_blocks(5, 100, 0), 0);
	cr_assert_eq(kvr_capacity_blocks(200, 10000, 16), 125000);
	cr_assert_eq(kvr_capacity_blocks(UINT64_MAX, 1000, 1), UINT64_MAX, "saturates");

	struct kvr_geometry g;
	cr_assert_eq(kvr_preset_geometry(kvr_preset_find("glm-4-9b-chat-1m"), 2, 0, 128, 1000, &g), 0);
	uint64_t bytes = 0;
	cr_assert_eq(kvr_capacity_bytes(&g, 200, 10000, &bytes), 0);
	cr_assert_eq(bytes, 15800ull * 10485760ull); /* 165,675,008,000 */
	cr_assert_eq(bytes, 165675008000ull);
	uint64_t keep = 7;
	cr_assert_eq(kvr_capacity_bytes(&g, UINT64_MAX / 2, 10000, &keep), -EOVERFLOW);
	cr_assert_eq(keep, 7);
	cr_assert_eq(kvr_capacity_bytes(NULL, 1, 1, &keep), -EINVAL);
}

static kvr_key ns_of(const struct kvr_geometry *g, const char *model, const char *salt)
{
	kvr_key k;
	cr_assert_eq(kvr_geometry_namespace(g, model, salt, &k), 0);
	return k;
}

Test(geometry, namespace)
{
	const struct kvr_preset *glm = kvr_preset_find("glm-4-9b-chat-1m");
	const char *id = "THUDM/glm-4-9b-chat-1m";
	struct kvr_geometry g128, g16, g;
	kvr_key k0;
	cr_assert_eq(kvr_preset_geometry(glm, 2, 0, 128, 1000, &g128), 0);
	cr_assert_eq(kvr_preset_geometry(glm, 2, 0, 16, 1000, &g16), 0);
	kvr_key base = ns_of(&g128, id, "");

	/* Golden value: changing the serialisation orphans every stored block (L2 files). */
	char hex[KVR_KEY_FMT_LEN];
	fprintf(stderr, "namespace glm-4-9b-chat-1m tp2 block128: %s\n", kvr_key_fmt(base, hex));
	cr_assert_str_eq(hex, GOLDEN_NS_GLM);

	cr_assert(kvr_key_eq(ns_of(&g128, id, NULL), base), "NULL salt is the empty salt");
	cr_assert_not(kvr_key_eq(ns_of(&g16, id, ""), base), "block 16 vs 128");
	cr_assert_not(kvr_key_eq(ns_of(&g128, "THUDM/glm-4-9b-chat", ""), base), "other model id");
	cr_assert_not(kvr_key_eq(ns_of(&g128, id, "tenant-a"), base), "other salt");
	cr_assert_not(kvr_key_eq(ns_of(&g128, id, "tenant-a"), ns_of(&g128, id, "tenant-b")), "salts differ");

	/* other TP: the same per-rank geometry but 4 ranks, and the TP1 geometry */
	g = g128;
	g.tp_size = 4;
	cr_assert_not(kvr_key_eq(ns_of(&g, id, ""), base), "tp 4 vs 2");
	cr_assert_eq(kvr_preset_geometry(glm, 1, 0, 128, 1000, &g), 0);
	cr_assert_not(kvr_key_eq(ns_of(&g, id, ""), base), "tp 1 vs 2");

	g = g128;
	g.dtype_bytes = 1;
	cr_assert_not(kvr_key_eq(ns_of(&g, id, ""), base), "fp8");
	g = g128;
	g.page_bytes[7] += 4096;
	cr_assert_not(kvr_key_eq(ns_of(&g, id, ""), base), "an opaque tail changes the page list");

	/* every rank of one group, any engine memory size or DCP layout: the same namespace */
	cr_assert_eq(kvr_preset_geometry(glm, 2, 1, 128, 1000, &g), 0);
	cr_assert(kvr_key_eq(ns_of(&g, id, ""), base), "rank 1 = rank 0");
	cr_assert_eq(kvr_preset_geometry(glm, 2, 0, 128, 77, &g), 0);
	cr_assert(kvr_key_eq(ns_of(&g, id, ""), base), "num_blocks does not enter");
	/* A DCP rank names its group's canonical block: TP 4 with DCP 2 is two groups of two
	 * ranks, each rank holding 64 of a 128-token block's tokens for the same 2 KV heads as
	 * a TP 2 rank: the canonical lane and the namespace are TP 2's. */
	for (uint32_t t = 0; t < 4; t++) {
		cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 40, 2, 128, 2, 64, 1000), 0);
		g.block_tokens = 128;
		g.tp_size = 4;
		g.tp_rank = t;
		g.dcp_size = 2;
		g.dcp_rank = t % 2;
		cr_assert(kvr_key_eq(ns_of(&g, id, ""), base), "DCP 2 at TP 4 (rank %u) = TP 2", t);
		struct kvr_geometry c;
		cr_assert_eq(kvr_dcp_canonical_geometry(&g, &c, NULL, 0), 0);
		cr_assert_eq(c.tp_size, 2);
		cr_assert_eq(c.tp_rank, t / 2);
		cr_assert_eq(kvr_geometry_lane_bytes(&c), kvr_geometry_lane_bytes(&g128));
	}
	g.dcp_rank = 0; /* TP rank 3 is DCP rank 1 of its group: refused, named */
	char why[160];
	struct kvr_geometry c;
	cr_assert_eq(kvr_dcp_canonical_geometry(&g, &c, why, sizeof(why)), -EINVAL);
	cr_assert_str_eq(why, "dcp_rank: 0, but TP rank 3 is DCP rank 1 of its group (dcp_rank = tp_rank mod dcp_size 2)");
	cr_assert_eq(kvr_geometry_namespace(&g, id, "", &k0), -EINVAL);

	/* MLA: tp size does not enter (one latent for every rank) */
	const struct kvr_preset *ds = kvr_preset_find("deepseek-v2-lite");
	struct kvr_geometry m1, m8;
	cr_assert_eq(kvr_preset_geometry(ds, 1, 0, 64, 100, &m1), 0);
	cr_assert_eq(kvr_preset_geometry(ds, 8, 5, 64, 100, &m8), 0);
	cr_assert(kvr_key_eq(ns_of(&m1, "ds", ""), ns_of(&m8, "ds", "")), "MLA tp 1 = tp 8");

	kvr_key k = {1, 2};
	cr_assert_eq(kvr_geometry_namespace(&g128, NULL, "", &k), -EINVAL);
	(void)k0;
	g = g128;
	g.n_regions = 0;
	cr_assert_eq(kvr_geometry_namespace(&g, id, "", &k), -EINVAL);
	cr_assert(k.lo == 1 && k.hi == 2, "untouched on failure");
}
