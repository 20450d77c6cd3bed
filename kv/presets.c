/* Model presets: KV geometry of known models as data, one row per model with its config.json values. */
#include "kvr_geometry.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

/*
 * Each row: preset name, Hugging Face id, and the config.json keys it comes from.
 * head_dim is config "head_dim" where present, else hidden_size / num_attention_heads
 * (GLM: "kv_channels"). MLA rows store the latent: kv_lora_rank + qk_rope_head_dim.
 */
static const struct kvr_preset presets[] = {
	/* THUDM/glm-4-9b-chat-1m: num_layers 40, multi_query_group_num 4, kv_channels 128,
	 * torch_dtype bfloat16 (2 KV heads per rank at TP 2) */
	{"glm-4-9b-chat-1m", "THUDM/glm-4-9b-chat-1m", 40, 4, 128, 2, KVR_ATTN_MHA},
	/* Qwen/Qwen3-8B: num_hidden_layers 36, num_key_value_heads 8, head_dim 128, bfloat16 */
	{"qwen3-8b", "Qwen/Qwen3-8B", 36, 8, 128, 2, KVR_ATTN_MHA},
	/* Qwen/Qwen3-32B: num_hidden_layers 64, num_key_value_heads 8, head_dim 128, bfloat16 */
	{"qwen3-32b", "Qwen/Qwen3-32B", 64, 8, 128, 2, KVR_ATTN_MHA},
	/* meta-llama/Llama-3.1-8B-Instruct: num_hidden_layers 32, num_key_value_heads 8,
	 * hidden_size 4096 / num_attention_heads 32 = 128, bfloat16 */
	{"llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 32, 8, 128, 2, KVR_ATTN_MHA},
	/* meta-llama/Llama-3.1-70B-Instruct: num_hidden_layers 80, num_key_value_heads 8,
	 * hidden_size 8192 / num_attention_heads 64 = 128, bfloat16 (160 regions: the maximum) */
	{"llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 80, 8, 128, 2, KVR_ATTN_MHA},
	/* deepseek-ai/DeepSeek-V2-Lite: num_hidden_layers 27, MLA kv_lora_rank 512 +
	 * qk_rope_head_dim 64 = 576 latent, bfloat16 */
	{"deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 27, 1, 576, 2, KVR_ATTN_MLA},
	/* deepseek-ai/DeepSeek-V3: num_hidden_layers 61, MLA kv_lora_rank 512 + qk_rope_head_dim 64
	 * = 576 latent, bfloat16 KV (1152-byte rows) */
	{"deepseek-v3", "deepseek-ai/DeepSeek-V3", 61, 1, 576, 2, KVR_ATTN_MLA},
	/* deepseek-ai/DeepSeek-V3.2-Exp with vLLM's fp8_ds_mla KV cache: 61 layers; a token's row is
	 * a 656-byte record (512 fp8 latent + 4 fp32 scales, one per 128 values + 64 bf16 rope),
	 * written as head_dim 656 of 1 byte. Each page carries an opaque tail of the DSA indexer's
	 * keys for its tokens: index_head_dim 128 fp8 + one fp32 scale = 132 bytes a token (the
	 * per-page index-cache tail of seed 002). vLLM runs it with 64-token blocks. */
	{"deepseek-v3.2-fp8", "deepseek-ai/DeepSeek-V3.2-Exp", 61, 1, 656, 1, KVR_ATTN_MLA, 132},
	/* Qwen/Qwen2.5-72B-Instruct: num_hidden_layers 80, num_key_value_heads 8 (GQA; 2 per rank
	 * at TP 4), hidden_size 8192 / num_attention_heads 64 = 128, bfloat16 */
	{"qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", 80, 8, 128, 2, KVR_ATTN_MHA},
};

#define N_PRESETS (sizeof(presets) / sizeof(presets[0]))

const struct kvr_preset *kvr_preset_find(const char *name)
{
	if (!name)
		return NULL;
	for (unsigned i = 0; i < N_PRESETS; i++)
		if (!strcmp(presets[i].name, name))
			return &presets[i];
	return NULL;
}

unsigned kvr_preset_count(void)
{
	return N_PRESETS;
}

const struct kvr_preset *kvr_preset_at(unsigned i)
{
	return i < N_PRESETS ? &presets[i] : NULL;
}

static char list_buf[512];
static pthread_once_t list_once = PTHREAD_ONCE_INIT;

static void build_list(void)
{
	size_t off = 0;
	for (unsigned i = 0; i < N_PRESETS; i++) {
		size_t len = strlen(presets[i].name);
		if (off + len + 3 > sizeof(list_buf))
			break;
		if (i) {
			memcpy(list_buf + off, ", ", 2);
			off += 2;
		}
		memcpy(list_buf + off, presets[i].name, len);
		off += len;
	}
	list_buf[off] = '\0';
}

const char *kvr_preset_list(void)
{
	(void)pthread_once(&list_once, build_list);
	return list_buf;
}

/* Append a tail of `tail` bytes to every region's page of a vLLM layout built by the fill
 * functions (consecutive [num_blocks, page] tensors): page = stride = rows + tail. */
static int add_tail(struct kvr_geometry *g, uint64_t tail)
{
	struct kvr_geometry t = *g;
	for (unsigned i = 0; i < t.n_regions; i++) {
		uint64_t page = (uint64_t)t.sem_bytes[i] + tail;
		if (page > UINT32_MAX || (unsigned __int128)page * t.num_blocks * (i + 1) > KVR_GEOM_MAX_OFFSET)
			return -ERANGE;
		struct kvr_region r = {.offset = page * t.num_blocks * i, .stride = page, .page_bytes = (uint32_t)page,
				       .sem_bytes = t.sem_bytes[i]};
		int rc = kvr_geometry_set_region(&t, i, &r);
		if (rc)
			return rc;
	}
	*g = t;
	return 0;
}

int kvr_preset_geometry(const struct kvr_preset *p, uint32_t tp_size, uint32_t tp_rank, uint32_t block_tokens,
			uint32_t num_blocks, struct kvr_geometry *ret_geom)
{
	if (!p || !ret_geom || !tp_size || tp_size > KVR_MAX_TP || tp_rank >= tp_size || !block_tokens ||
	    !num_blocks)
		return -EINVAL;
	struct kvr_geometry g;
	int rc;
	if (p->attention == KVR_ATTN_MLA) {
		rc = kvr_geometry_fill_vllm_mla(&g, p->layers, p->head_dim, p->dtype_bytes, block_tokens, num_blocks);
	} else {
		uint32_t heads;
		if (p->kv_heads_total % tp_size == 0)
			heads = p->kv_heads_total / tp_size;
		else if (tp_size % p->kv_heads_total == 0)
			heads = 1; /* vLLM replicates KV heads when TP exceeds them */
		else
			return -EINVAL;
		rc = kvr_geometry_fill_vllm_layer_major(&g, p->layers, heads, p->head_dim, p->dtype_bytes, block_tokens,
							num_blocks);
	}
	if (rc)
		return rc;
	if (p->tail_per_token) {
		rc = add_tail(&g, (uint64_t)block_tokens * p->tail_per_token);
		if (rc)
			return rc;
	}
	g.tp_size = tp_size;
	g.tp_rank = tp_rank;
	*ret_geom = g;
	return 0;
}
