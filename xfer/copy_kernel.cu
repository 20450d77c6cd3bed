/* Gather/scatter kernel of the CUDA backend: many small pieces in one launch, exact for any width and alignment. */
#include <cuda_runtime.h>
#include <stdint.h>

/* Same layout as struct kvr_cuda_piece in cuda.c: one copy of len bytes, device-visible
 * addresses (the arena through its mapped registration, the KV memory through its IPC
 * mapping). The host cuts pieces to at most 64 KiB, a multiple of 16, so alignment is kept. */
struct kvr_cuda_piece {
	uint64_t dst, src, len;
};

/* Copy [0, len) of one piece with every thread of the block. */
template <typename T>
__device__ static void copy_words(uint8_t *d, const uint8_t *s, uint64_t len)
{
	/* head: bytes up to the first T-aligned destination byte (d and s are co-aligned) */
	uint64_t head = (sizeof(T) - ((uintptr_t)d & (sizeof(T) - 1))) & (sizeof(T) - 1);
	if (head > len)
		head = len;
	for (uint64_t i = threadIdx.x; i < head; i += blockDim.x)
		d[i] = s[i];
	uint64_t words = (len - head) / sizeof(T);
	T *dw = (T *)(d + head);
	const T *sw = (const T *)(s + head);
	for (uint64_t i = threadIdx.x; i < words; i += blockDim.x)
		dw[i] = sw[i];
	for (uint64_t i = head + words * sizeof(T) + threadIdx.x; i < len; i += blockDim.x)
		d[i] = s[i];
}

/* One block per piece (grid-stride over pieces). Vectorised (16 bytes) when source and
 * destination share their alignment modulo 16, 4 bytes when they share it modulo 4,
 * bytewise otherwise: a 561-byte row at any offset is exact, and no byte outside
 * [dst, dst + len) is written. */
__global__ void kvr_copy_pieces(const kvr_cuda_piece *pieces, unsigned n)
{
	for (unsigned p = blockIdx.x; p < n; p += gridDim.x) {
		kvr_cuda_piece pc = pieces[p];
		uint8_t *d = (uint8_t *)(uintptr_t)pc.dst;
		const uint8_t *s = (const uint8_t *)(uintptr_t)pc.src;
		uintptr_t mis = (uintptr_t)d ^ (uintptr_t)s;
		if ((mis & 15) == 0)
			copy_words<uint4>(d, s, pc.len);
		else if ((mis & 3) == 0)
			copy_words<uint32_t>(d, s, pc.len);
		else
			copy_words<uint8_t>(d, s, pc.len);
	}
}

/* Launch on stream; returns the cudaError_t of the launch (as int, for C callers). */
extern "C" int kvr_cuda_launch_copy(const kvr_cuda_piece *pieces, unsigned n, unsigned grid, unsigned threads,
				    cudaStream_t stream)
{
	if (n == 0)
		return (int)cudaSuccess;
	kvr_copy_pieces<<<grid, threads, 0, stream>>>(pieces, n);
	return (int)cudaGetLastError();
}
