/* hostreg: register a large host range with a registrar in chunks (CUDA's cudaHostRegister fails on one huge range). */
#include "kvr_hostreg.h"

#include <errno.h>
#include <stddef.h>

/*
 * One cudaHostRegister of the whole arena fails on large hosts (vLLM #51080: a 512 GiB
 * range is refused) and pins everything in one long call (about 0.1 s per GB). The arena
 * is registered as consecutive chunks instead, each at most `chunk` bytes and a multiple
 * of KVR_HOSTREG_ALIGN; at most KVR_HOSTREG_MAX_CHUNKS chunks (a larger arena gets larger
 * chunks). The registrar is a parameter so the chunking is tested without a GPU.
 */

uint64_t kvr_hostreg_chunk_bytes(uint64_t size, uint64_t chunk)
{
	if (!size)
		return 0;
	if (chunk < KVR_HOSTREG_ALIGN)
		chunk = KVR_HOSTREG_ALIGN;
	chunk -= chunk % KVR_HOSTREG_ALIGN;
	uint64_t min = (size + KVR_HOSTREG_MAX_CHUNKS - 1) / KVR_HOSTREG_MAX_CHUNKS;
	min = (min + KVR_HOSTREG_ALIGN - 1) / KVR_HOSTREG_ALIGN * KVR_HOSTREG_ALIGN;
	return chunk < min ? min : chunk;
}

uint32_t kvr_hostreg_count(uint64_t size, uint64_t chunk)
{
	uint64_t c = kvr_hostreg_chunk_bytes(size, chunk);
	return c ? (uint32_t)((size + c - 1) / c) : 0;
}

int kvr_hostreg_register(void *base, uint64_t size, uint64_t chunk, const struct kvr_hostreg_ops *ops,
			 struct kvr_hostreg *ret)
{
	if (!base || !size || !ops || !ops->reg || !ops->unreg || !ret)
		return -EINVAL;
	*ret = (struct kvr_hostreg){.base = base, .size = size, .chunk = kvr_hostreg_chunk_bytes(size, chunk)};
	uint8_t *p = base;
	for (uint64_t off = 0; off < size; off += ret->chunk) {
		uint64_t n = size - off < ret->chunk ? size - off : ret->chunk;
		int rc = ops->reg(ops->ctx, p + off, n);
		if (rc < 0) {
			kvr_hostreg_unregister(ret, ops);
			*ret = (struct kvr_hostreg){0};
			return rc;
		}
		if (rc == 0)
			ret->ours |= 1ull << ret->n;
		ret->n++;
	}
	return 0;
}

void kvr_hostreg_unregister(const struct kvr_hostreg *r, const struct kvr_hostreg_ops *ops)
{
	if (!r || !r->base || !ops)
		return;
	for (uint32_t i = r->n; i-- > 0;) {
		if (!(r->ours >> i & 1))
			continue; /* registered by someone else: theirs to undo */
		uint64_t off = (uint64_t)i * r->chunk;
		uint64_t n = r->size - off < r->chunk ? r->size - off : r->chunk;
		ops->unreg(ops->ctx, (uint8_t *)r->base + off, n);
	}
}
