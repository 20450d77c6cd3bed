/* kvring/kvr_geometry.h: the geometry a worker attaches with (struct kvr_geometry) and the five helpers
 * libkvring exports for it (libkvring.map); kv/kvr_geometry.h adds what only kvringd and its tools use. */
#ifndef KVRING_KVR_GEOMETRY_H
#define KVRING_KVR_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>

/*
 * A worker describes its KV memory with struct kvr_geometry when it attaches (the struct is
 * the attach payload, byte for byte, so it has a fixed layout and no pointers). One block
 * of the engine (block_tokens tokens) is spread over n_regions regions; region r of block b
 * is the byte range
 *
 *     [offset_r + b * stride_r, offset_r + b * stride_r + page_bytes_r)
 *
 * of the worker's KV memory. page_bytes is transferred whole (it may exceed sem_bytes, the
 * semantic KV payload: the rest is a model-owned opaque tail that kvring copies without
 * interpreting). One rank's lane of a block is the concatenation of its regions' pages in
 * region order: that is what an L1 slot holds.
 *
 * Layouts:
 *   KVR_LAYOUT_LAYER_MAJOR  one region per layer and role: 2 per layer (K then V) for
 *                           MHA/GQA as in vLLM's flash-attn layout, or 1 per layer (MLA
 *                           latent, or K and V interleaved inside one page);
 *                           n_regions = layers * (1 or 2), region r is layer r / per_layer.
 *   KVR_LAYOUT_CROSS_LAYER  one region per block holding every layer (n_regions >= 1).
 *
 * The region table is stored compactly (structure of arrays, 18 bytes a region):
 * KVR_GEOM_MAX_REGIONS = 1024 regions (512 layers x K,V: Llama-3.1-405B's 126, Qwen3-235B's
 * 94 and GLM-4.5's 92 with room to spare) make an 18.5 KiB record, the attach payload;
 * offsets are 48-bit (256 TiB) and strides 32-bit (4 GiB a block). Read and write regions
 * only through kvr_geometry_region() / kvr_geometry_set_region(), which use the natural
 * struct kvr_region. docs/geometry.md explains the choice.
 *
 * kv_heads is per rank. For MLA every rank holds the same latent cache: kv_heads is the
 * latent head count (1), head_dim the latent width (kv_lora_rank + rope dim), one rank
 * stores and every rank loads.
 */

#define KVR_GEOMETRY_VERSION 1u
#define KVR_GEOM_MAX_REGIONS 1024
#define KVR_MAX_TP 16                       /* lanes per block (a lane is one TP rank's shard) */
#define KVR_GEOM_MAX_OFFSET (1ull << 48)    /* exclusive */
#define KVR_GEOM_ERR_MAX 160                /* a reason always fits a proto reply reason */

enum kvr_attention {
	KVR_ATTN_MHA = 1, /* MHA / GQA / MQA: each TP rank holds its own KV heads */
	KVR_ATTN_MLA = 2, /* multi-head latent attention: every rank holds the same latent */
};

enum kvr_layout {
	KVR_LAYOUT_LAYER_MAJOR = 1,
	KVR_LAYOUT_CROSS_LAYER = 2,
};

/* One region, natural form (what the accessors return and take). */
struct kvr_region {
	uint64_t offset;     /* of block 0, from the start of the worker's KV memory */
	uint64_t stride;     /* bytes between consecutive blocks */
	uint32_t page_bytes; /* declared bytes per block, transferred whole */
	uint32_t sem_bytes;  /* semantic KV bytes at the start of the page (<= page_bytes) */
};

struct kvr_geometry {
	uint32_t version;        /* KVR_GEOMETRY_VERSION */
	uint32_t layers;
	uint32_t kv_heads;       /* per rank (MLA: latent heads, 1) */
	uint32_t head_dim;       /* elements per head (MLA: latent width) */
	uint32_t dtype_bytes;    /* 1 (fp8), 2 (bf16/fp16), 4 (fp32) */
	uint32_t block_tokens;
	uint32_t tp_size, tp_rank;
	uint32_t dcp_size, dcp_rank, dcp_interleave;
	uint32_t attention;      /* enum kvr_attention */
	uint32_t layout;         /* enum kvr_layout */
	uint32_t num_blocks;     /* the engine's KV blocks */
	uint32_t n_regions;      /* 1..KVR_GEOM_MAX_REGIONS */
	uint32_t reserved;       /* 0 */
	/* region table, structure of arrays; entries >= n_regions are zero */
	uint32_t page_bytes[KVR_GEOM_MAX_REGIONS];
	uint32_t sem_bytes[KVR_GEOM_MAX_REGIONS];
	uint32_t stride[KVR_GEOM_MAX_REGIONS];
	uint32_t offset_lo[KVR_GEOM_MAX_REGIONS];
	uint16_t offset_hi[KVR_GEOM_MAX_REGIONS];
};

_Static_assert(sizeof(struct kvr_geometry) == 64 + 18 * KVR_GEOM_MAX_REGIONS, "geometry layout");
_Static_assert(offsetof(struct kvr_geometry, page_bytes) == 64, "geometry layout");
_Static_assert(offsetof(struct kvr_geometry, offset_hi) == 64 + 16 * KVR_GEOM_MAX_REGIONS, "geometry layout");

/* Region i (< n_regions) in natural form. */
static inline struct kvr_region kvr_geometry_region(const struct kvr_geometry *g, unsigned i)
{
	return (struct kvr_region){
		.offset = (uint64_t)g->offset_hi[i] << 32 | g->offset_lo[i],
		.stride = g->stride[i],
		.page_bytes = g->page_bytes[i],
		.sem_bytes = g->sem_bytes[i],
	};
}

/* Store region i (< KVR_GEOM_MAX_REGIONS; does not change n_regions). -ERANGE when the
 * offset is >= 2^48 or the stride >= 2^32, -EINVAL when i is out of range. */
int kvr_geometry_set_region(struct kvr_geometry *g, unsigned i, const struct kvr_region *r);

/* Check every field. kv_bytes is the size of the worker's KV memory: every region's last
 * block must end inside it. Checks: version, layers/kv_heads/head_dim/block_tokens/
 * num_blocks > 0, dtype_bytes in {1,2,4}, tp_rank < tp_size <= KVR_MAX_TP, dcp_rank <
 * dcp_size <= KVR_DCP_MAX, dcp_interleave >= 1 (exactly 1 when dcp_size is 1: without DCP it
 * means nothing), attention and layout known, n_regions matches the layout, reserved and
 * unused region entries zero, and per region: 0 < sem_bytes <= page_bytes, page_bytes <=
 * stride (when num_blocks > 1), last block inside kv_bytes, no two regions of the same block
 * overlap (for any block). Under DCP (dcp_size > 1; block_tokens
 * is the canonical block, a rank's pages hold block_tokens / dcp_size tokens, kvr_dcp.h):
 * block_tokens % (dcp_size * dcp_interleave) == 0, layer-major layout, and every region's
 * sem_bytes whole rows of the rank's tokens.
 * Returns 0, or -EINVAL with one line naming the field or region and the numbers in err
 * (always NUL-terminated when errlen > 0), e.g.
 *   "region 3 (layer 1 V): page_bytes 4096 > stride 2048"
 *   "layers: must be > 0" */
int kvr_geometry_validate(const struct kvr_geometry *g, uint64_t kv_bytes, char *err, size_t errlen);

/* Bytes one rank stores per block: the sum of page_bytes. */
uint64_t kvr_geometry_lane_bytes(const struct kvr_geometry *g);

/* Smallest KV memory size that holds every region's last block (0 when n_regions is 0). */
uint64_t kvr_geometry_kv_extent(const struct kvr_geometry *g);

/* Build a complete geometry for vLLM's standard MHA layout: per layer a K tensor then a V
 * tensor, consecutive, each [num_blocks, block_tokens, kv_heads, head_dim] of dtype_bytes:
 * page = stride = block_tokens*kv_heads*head_dim*dtype_bytes, sem = page, region 2l (K) at
 * offset 2l*num_blocks*page, region 2l+1 (V) at (2l+1)*num_blocks*page.
 * Initialises *g completely with tp_size 1, tp_rank 0, dcp 1/0/1: set those afterwards.
 * Returns 0, -EINVAL (a zero argument, 2*layers > KVR_GEOM_MAX_REGIONS) or -ERANGE (a page
 * over 4 GiB or offsets past 2^48). *g untouched on failure. */
int kvr_geometry_fill_vllm_layer_major(struct kvr_geometry *g, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
				       uint32_t dtype_bytes, uint32_t block_tokens, uint32_t num_blocks);

#endif
