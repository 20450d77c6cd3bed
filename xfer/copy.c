/* Exact byte copy for KV pages of any width and alignment; non-temporal stores for mid-size copies. */
#include "kvr_xfer.h"

#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/*
 * kvr_copy is glibc's memcpy except for 1 MiB <= len <= 16 MiB, where it streams the body
 * with non-temporal stores (kvr_copy_nt). memcpy already picks AVX/ERMS paths, copies head
 * and tail with unaligned moves that stay inside the buffer, and switches to its own
 * non-temporal loop above a cache-derived threshold (19.9 MiB on the 48 MiB-L3 dev box).
 * Below that threshold it writes through the cache, paying a read-for-ownership per line
 * of a destination nobody reads soon (an arena slot, a KV block the GPU/engine consumes
 * later). copy_bench on the dev box (docs/transfer.md): streaming wins 1.3-1.6x from 1 to
 * 16 MiB, hot or cold; it loses below 1 MiB when the data is cache-resident (the fence
 * and the bypass cost more than the copy) and at 64 MiB against glibc's own NT loop.
 * Re-run copy_bench on new hardware before changing the bounds.
 */
#define NT_MIN (1ull << 20)
#define NT_MAX (16ull << 20)
#define STREAM_RUN_MIN 4096u

void kvr_copy(void *dst, const void *src, size_t len)
{
	if (len == 0)
		return;
#if defined(__x86_64__)
	if (len >= NT_MIN && len <= NT_MAX) {
		kvr_copy_nt(dst, src, len);
		return;
	}
#endif
	memcpy(dst, src, len);
}

/* Within a streaming transfer every run is cold on both sides (copy_bench: 64 KiB pages of
 * a 400 MiB layer-major store), so streaming stores pay from 4 KiB; below that the
 * head/tail and the fence dominate. */
void kvr_copy_stream(void *dst, const void *src, size_t len)
{
#if defined(__x86_64__)
	if (len >= STREAM_RUN_MIN && len <= NT_MAX) {
		kvr_copy_nt(dst, src, len);
		return;
	}
#endif
	kvr_copy(dst, src, len);
}

#if defined(__x86_64__)
void kvr_copy_nt(void *dst, const void *src, size_t len)
{
	unsigned char *d = dst;
	const unsigned char *s = src;
	size_t head;

	if (len < 256) {
		if (len)
			memcpy(dst, src, len);
		return;
	}
	/* Head: plain copy up to the first 16-byte aligned destination byte. */
	head = (16 - ((uintptr_t)d & 15)) & 15;
	memcpy(d, s, head);
	d += head;
	s += head;
	len -= head;

	/* Body: 64 bytes per iteration, unaligned loads, aligned streaming stores. */
	while (len >= 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s + 0));
		__m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
		_mm_stream_si128((__m128i *)(void *)(d + 0), a);
		_mm_stream_si128((__m128i *)(void *)(d + 16), b);
		_mm_stream_si128((__m128i *)(void *)(d + 32), c);
		_mm_stream_si128((__m128i *)(void *)(d + 48), e);
		d += 64;
		s += 64;
		len -= 64;
	}
	/* Streaming stores are weakly ordered: fence before anyone publishes these bytes. */
	_mm_sfence();
	/* Tail: fewer than 64 bytes. */
	memcpy(d, s, len);
}
#else
void kvr_copy_nt(void *dst, const void *src, size_t len)
{
	if (len)
		memcpy(dst, src, len);
}
#endif
