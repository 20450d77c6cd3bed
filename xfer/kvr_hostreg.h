/* kvr_hostreg: chunked host-memory registration (the CUDA backend's arena; CUDA-free, unit-tested with a stand-in). */
#ifndef KVR_HOSTREG_H
#define KVR_HOSTREG_H

#include <stdint.h>

#define KVR_HOSTREG_ALIGN (2ull << 20)   /* chunk boundaries: huge-page aligned */
#define KVR_HOSTREG_CHUNK (64ull << 30)  /* default chunk: far below where one registration fails */
#define KVR_HOSTREG_MAX_CHUNKS 64u       /* a larger range gets larger chunks */

struct kvr_hostreg_ops {
	/* register [p, p+n): 0 done (ours to undo), 1 it was registered already (not ours), <0 -errno */
	int (*reg)(void *ctx, void *p, uint64_t n);
	void (*unreg)(void *ctx, void *p, uint64_t n);
	void *ctx;
};

struct kvr_hostreg {
	void *base;
	uint64_t size, chunk; /* chunk: every chunk's size but the last one's */
	uint32_t n;           /* chunks registered */
	uint64_t ours;        /* bit i: chunk i registered by us */
};

/* The chunk size used for a range of size bytes asked to be cut at chunk (aligned down to
 * KVR_HOSTREG_ALIGN, at least that, and large enough for KVR_HOSTREG_MAX_CHUNKS chunks). */
uint64_t kvr_hostreg_chunk_bytes(uint64_t size, uint64_t chunk);
/* How many chunks that makes. */
uint32_t kvr_hostreg_count(uint64_t size, uint64_t chunk);

/* Register [base, base+size) chunk after chunk in address order. On a failure the chunks
 * registered so far are unregistered (in reverse) and the registrar's error is returned;
 * *ret is then zeroed. 0 or -errno (-EINVAL: bad arguments). */
int kvr_hostreg_register(void *base, uint64_t size, uint64_t chunk, const struct kvr_hostreg_ops *ops,
			 struct kvr_hostreg *ret);
/* Unregister the chunks kvr_hostreg_register registered itself, last first. */
void kvr_hostreg_unregister(const struct kvr_hostreg *r, const struct kvr_hostreg_ops *ops);

#endif
