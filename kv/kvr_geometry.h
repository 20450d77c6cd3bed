/* kvr_geometry: the geometry's internal half: region names, lanes, the fused and MLA layouts, the key
 * namespace, capacity and presets (the public half, struct kvr_geometry and what libkvring exports, is
 * include/kvring/kvr_geometry.h). */
#ifndef KVR_GEOMETRY_H
#define KVR_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>

#include <kvring/kvr_geometry.h>

#include "kvr_keys.h"

/* "layer 1 V", "layer 0 K", "layer 3" (one region per layer), "cross-layer 0". Returns buf. */
char *kvr_geometry_region_name(const struct kvr_geometry *g, unsigned i, char *buf, size_t len);

/* Lanes a block is stored in: tp_size for MHA, 1 for MLA (one rank stores). This is the
 * commit quorum. */
uint32_t kvr_geometry_lanes(const struct kvr_geometry *g);

/* Bytes of one block across every lane: lane bytes x kvr_geometry_lanes(). */
uint64_t kvr_geometry_block_bytes_all_ranks(const struct kvr_geometry *g);

/* vLLM's CPU layout (model.kv_layout "kv-fused"): one tensor per layer [num_blocks, kv_heads,
 * block_tokens, 2 * head_dim] holding K and V rows: one region per layer, page = stride =
 * 2*block_tokens*kv_heads*head_dim*dtype_bytes, region l at offset l*num_blocks*page. */
int kvr_geometry_fill_vllm_fused(struct kvr_geometry *g, uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
				 uint32_t dtype_bytes, uint32_t block_tokens, uint32_t num_blocks);

/* The same for vLLM's MLA layout: one tensor per layer [num_blocks, block_tokens,
 * latent_dim]; kv_heads = 1, head_dim = latent_dim, attention MLA. */
int kvr_geometry_fill_vllm_mla(struct kvr_geometry *g, uint32_t layers, uint32_t latent_dim, uint32_t dtype_bytes,
			       uint32_t block_tokens, uint32_t num_blocks);

/* The 128-bit key namespace: XXH3-128 over a canonical serialisation (docs/geometry.md) of
 * model_id, dtype_bytes, attention, layers, total KV heads (kv_heads * tp_size; MLA:
 * kv_heads), head_dim, block_tokens, tp_size (MHA only), the per-region page_bytes list,
 * and cache_salt (NULL = ""). Blocks under different block sizes, models, salts, TP sizes
 * or page layouts never share keys. A DCP rank (dcp_size > 1) names its group's canonical
 * block: the serialisation is that of kvr_dcp_canonical_geometry(g), so a rows-only block
 * has one name under every (D, I) and D = 1; when the pages carry opaque tails (which only
 * the storing layout can restore) "dcp", dcp_size and dcp_interleave follow the salt.
 * Returns 0, or -EINVAL (NULL g/model_id/ret, n_regions out of range, a DCP geometry
 * kvr_dcp_canonical_geometry refuses). */
int kvr_geometry_namespace(const struct kvr_geometry *g, const char *model_id, const char *cache_salt,
			   kvr_key *ret_ns);

/* The namespace of an instance without a model section (its slot table's, its L2 directory's
 * and the shared tier's): the slot format, not a model — XXH3-128 over "kvring.slots.v2\0",
 * slot_bytes (two uint32, low first) and cache_salt. Engines of several models, block sizes
 * and TP sizes share such an instance; each block's own key still carries its engine's
 * namespace (kvr_geometry_namespace: model, geometry, block size, TP size), so none is
 * served another's, and each slot records its block's size and lanes. (v1 also hashed one
 * block size and lane count: an instance of v1 held one of each.) 0 or -EINVAL. */
int kvr_slots_namespace(uint64_t slot_bytes, const char *cache_salt, kvr_key *ret_ns);

/* ---- capacity ------------------------------------------------------------------------- */

/* Blocks for `prompts` prompts of `tokens_per_prompt` tokens each: prompts *
 * ceil(tokens_per_prompt / block_tokens) (a partial last block still takes a slot).
 * 0 when block_tokens is 0; saturates at UINT64_MAX. */
uint64_t kvr_capacity_blocks(uint64_t prompts, uint64_t tokens_per_prompt, uint32_t block_tokens);

/* Bytes for that workload: blocks x kvr_geometry_block_bytes_all_ranks(g).
 * 0 or -EINVAL / -EOVERFLOW; *ret_bytes untouched on failure. */
int kvr_capacity_bytes(const struct kvr_geometry *g, uint64_t prompts, uint64_t tokens_per_prompt,
		       uint64_t *ret_bytes);

/* ---- presets (presets.c: a table, one row per model, with its config.json values) ----- */

struct kvr_preset {
	const char *name;        /* "qwen3-8b" */
	const char *hf_id;       /* "Qwen/Qwen3-8B": the default model id */
	uint32_t layers;
	uint32_t kv_heads_total; /* all ranks (MLA: 1) */
	uint32_t head_dim;       /* MLA: kv_lora_rank + qk_rope_head_dim */
	uint32_t dtype_bytes;
	uint32_t attention;      /* enum kvr_attention */
	uint32_t tail_per_token; /* opaque page tail after the rows, bytes per token of the page (0: none) */
};

/* The preset of that name, or NULL. */
const struct kvr_preset *kvr_preset_find(const char *name);

/* Every preset name, comma separated: "glm-4-9b-chat-1m, qwen3-8b, ..." (static string). */
const char *kvr_preset_list(void);

/* Number of presets and the i-th one (NULL when out of range). */
unsigned kvr_preset_count(void);
const struct kvr_preset *kvr_preset_at(unsigned i);

/* The vLLM layer-major geometry of rank tp_rank of tp_size. MHA: KV heads per rank =
 * kv_heads_total / tp_size; when tp_size > kv_heads_total each rank holds one replicated
 * head (tp_size must be a multiple of kv_heads_total, as vLLM requires). MLA: the latent,
 * whatever tp_size. A preset with tail_per_token gets page_bytes = stride = sem_bytes +
 * block_tokens * tail_per_token on every region (sem_bytes the rows).
 * Returns 0, or -EINVAL (tp_rank >= tp_size, heads that do not divide,
 * zero block_tokens/num_blocks) or what the fill functions return. */
int kvr_preset_geometry(const struct kvr_preset *p, uint32_t tp_size, uint32_t tp_rank, uint32_t block_tokens,
			uint32_t num_blocks, struct kvr_geometry *ret_geom);

#endif
