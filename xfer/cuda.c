/* CUDA transfer backend: worker KV memory by CUDA IPC handles <-> the registered arena, on the actor's own streams. */
#include "kvr_cuda.h"
#include "kvr_hostreg.h"
#include "kvr_xfer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "kvr_time.h"

/*
 * One context = one worker's KV memory (every range of its descriptor opened with
 * cudaIpcOpenMemHandle; the driver reference-counts a handle opened twice) + the arena
 * (registered once per process with cudaHostRegister, portable and mapped, in chunks of
 * at most 64 GiB — kvr_hostreg.h — so a slot is the DMA source/target) + two streams of our own (stores: device to host; loads: host to
 * device) + per ticket slot a completion event (blocking sync: waiting sleeps, it never
 * spins), a start event for timing, and the imported producer event we hold until the
 * copy has completed.
 */

/* auto: batch / kernel only when there are at least this many pieces and they are small */
#define BATCH_MIN_PIECES 8u
#define BATCH_MAX_AVG (1u << 20)
/* kernel: pieces are cut to at most this many bytes (a multiple of 16: alignment kept) */
#define KERNEL_CHUNK (64u << 10)
#define KERNEL_THREADS 256u

#ifdef KVR_XFER_HAVE_CUDA_KERNEL
/* xfer/copy_kernel.cu */
struct kvr_cuda_piece {
	uint64_t dst, src, len;
};
int kvr_cuda_launch_copy(const struct kvr_cuda_piece *pieces, unsigned n, unsigned grid, unsigned threads,
			 cudaStream_t stream);
#else
struct kvr_cuda_piece {
	uint64_t dst, src, len;
};
#endif

static __thread char last_err[160];

const char *kvr_xfer_cuda_last_error(void)
{
	return last_err;
}

/* Remember what CUDA said and map it to an errno. */
static int cu_err(cudaError_t e, const char *what)
{
	snprintf(last_err, sizeof(last_err), "%s: %s", what, cudaGetErrorString(e));
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
		return -EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorInsufficientDriver:
		return -ENODEV;
	case cudaErrorInvalidResourceHandle:
	case cudaErrorMapBufferObjectFailed:
		return -EBADF;
	case cudaErrorNotSupported:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* ---- arena registration: once per process and arena, reference-counted ------------------ */

#define MAX_REG 16

static struct {
	void *base;
	uint64_t size;
	unsigned refs;
	struct kvr_hostreg reg; /* its chunks, and which of them we registered (the rest were
				 * registered by someone else: never unregistered by us) */
	uint64_t reg_ns;        /* how long registering took */
} regs[MAX_REG];
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

/* The registrar of kvr_hostreg: one chunk, portable (every context) and mapped. */
static int reg_chunk(void *ctx, void *p, uint64_t n)
{
	(void)ctx;
	cudaError_t e = cudaHostRegister(p, (size_t)n, cudaHostRegisterPortable | cudaHostRegisterMapped);
	if (e == cudaErrorHostMemoryAlreadyRegistered) {
		(void) cudaGetLastError(); /* not sticky, but clear it */
		return 1;
	}
	if (e != cudaSuccess) {
		int rc = cu_err(e, "cudaHostRegister(arena chunk)");
		char what[96];
		snprintf(what, sizeof(what), "cudaHostRegister of an arena chunk of %llu MiB at %p",
			 (unsigned long long)(n >> 20), p);
		snprintf(last_err, sizeof(last_err), "%s: %s", what, cudaGetErrorString(e));
		return rc;
	}
	return 0;
}

static void unreg_chunk(void *ctx, void *p, uint64_t n)
{
	(void)ctx;
	(void)n;
	(void) cudaHostUnregister(p);
}

static const struct kvr_hostreg_ops reg_ops = {.reg = reg_chunk, .unreg = unreg_chunk};

uint64_t kvr_xfer_cuda_arena_reg_ns(const void *base)
{
	uint64_t ns = 0;
	pthread_mutex_lock(&reg_lock);
	for (int i = 0; i < MAX_REG; i++)
		if (regs[i].refs && regs[i].base == base)
			ns = regs[i].reg_ns;
	pthread_mutex_unlock(&reg_lock);
	return ns;
}

static int arena_register(void *base, uint64_t size)
{
	int rc = 0, freei = -1;

	pthread_mutex_lock(&reg_lock);
	for (int i = 0; i < MAX_REG; i++) {
		if (regs[i].refs && regs[i].base == base) {
			if (regs[i].size != size) {
				snprintf(last_err, sizeof(last_err), "arena %p registered with %llu bytes, now %llu",
					 base, (unsigned long long)regs[i].size, (unsigned long long)size);
				rc = -EINVAL;
			} else {
				regs[i].refs++;
			}
			goto out;
		}
		if (!regs[i].refs && freei < 0)
			freei = i;
	}
	if (freei < 0) {
		snprintf(last_err, sizeof(last_err), "more than %d arenas registered in one process", MAX_REG);
		rc = -ENOSPC;
		goto out;
	}
	/* once per process, in chunks (one registration of a very large arena fails);
	 * KVR_CUDA_REG_CHUNK_GIB sets the chunk (tools/gpu-check.sh measures several) */
	uint64_t chunk = KVR_HOSTREG_CHUNK;
	const char *env = getenv("KVR_CUDA_REG_CHUNK_GIB");
	if (env && *env && strtoull(env, NULL, 10) > 0)
		chunk = strtoull(env, NULL, 10) << 30;
	uint64_t t0 = kvr_now_ns();
	struct kvr_hostreg reg;
	if ((rc = kvr_hostreg_register(base, size, chunk, &reg_ops, &reg)))
		goto out;
	/* a slot's device address is base's plus its offset only if every chunk maps where UVA
	 * puts it: check each chunk (the kernel copies address the arena as one range) */
	void *dev0 = NULL;
	for (uint32_t i = 0; i < reg.n && !rc; i++) {
		void *dev = NULL;
		uint8_t *p = (uint8_t *)base + (uint64_t)i * reg.chunk;
		cudaError_t e = cudaHostGetDevicePointer(&dev, p, 0);
		if (e != cudaSuccess) {
			rc = cu_err(e, "cudaHostGetDevicePointer(arena chunk)");
		} else if (i == 0) {
			dev0 = dev;
		} else if ((uint8_t *)dev != (uint8_t *)dev0 + (uint64_t)i * reg.chunk) {
			snprintf(last_err, sizeof(last_err),
				 "arena chunk %u maps at device address %p, not %p: the arena is not one device range",
				 i, dev, (void *)((uint8_t *)dev0 + (uint64_t)i * reg.chunk));
			rc = -EOPNOTSUPP;
		}
	}
	if (rc) {
		kvr_hostreg_unregister(&reg, &reg_ops);
		goto out;
	}
	regs[freei].base = base;
	regs[freei].size = size;
	regs[freei].refs = 1;
	regs[freei].reg = reg;
	regs[freei].reg_ns = kvr_now_ns() - t0;
out:
	pthread_mutex_unlock(&reg_lock);
	return rc;
}

static void arena_unregister(void *base)
{
	pthread_mutex_lock(&reg_lock);
	for (int i = 0; i < MAX_REG; i++) {
		if (regs[i].refs && regs[i].base == base) {
			if (--regs[i].refs == 0)
				kvr_hostreg_unregister(&regs[i].reg, &reg_ops);
			if (regs[i].refs == 0)
				regs[i] = (typeof(regs[i])){0};
			break;
		}
	}
	pthread_mutex_unlock(&reg_lock);
}

/* ---- context ------------------------------------------------------------------------------ */

struct range {
	uint64_t kv_off, bytes;
	uint8_t *dev;  /* device address of kv_off (the opened base + alloc_offset) */
	void *base;    /* what cudaIpcOpenMemHandle returned (to close) */
};

struct cslot {
	int busy;
	cudaEvent_t start, done; /* created at open */
	cudaEvent_t dep;         /* the producer's event, imported; NULL when none */
	uint64_t submit_ns;
	struct kvr_xfer_stats st;
	struct kvr_cuda_piece *pieces; /* kernel arguments: pinned, mapped; reused when the slot is free */
	size_t cap_pieces;
};

struct cuda_xfer {
	int device;
	int mode;              /* enum kvr_cuda_copy_mode */
	int batch_ok;          /* cudaMemcpyBatchAsync usable (built and not refused by the driver) */
	uint8_t *arena;        /* host address */
	uint8_t *arena_dev;    /* the same bytes as the device sees them (mapped registration) */
	uint64_t arena_size;
	int arena_registered;
	struct range *ranges;
	uint32_t n_ranges;
	cudaStream_t stream[2]; /* [0] stores (D2H), [1] loads (H2D) */
	struct cslot slots[KVR_XFER_MAX_INFLIGHT];
	/* scratch for one submission */
	struct kvr_cuda_piece *scratch;
	void **dsts;
	const void **srcs;
	size_t *sizes;
	size_t cap_scratch;
};

static int read_mode(void)
{
	const char *m = getenv("KVR_CUDA_COPY");
	if (!m || !*m || !strcmp(m, "auto"))
		return KVR_CUDA_COPY_AUTO;
	if (!strcmp(m, "memcpy"))
		return KVR_CUDA_COPY_MEMCPY;
	if (!strcmp(m, "batch"))
		return KVR_CUDA_COPY_BATCH;
	if (!strcmp(m, "kernel"))
		return KVR_CUDA_COPY_KERNEL;
	return -1;
}

/* The device to use: the ordinal given (checked against the descriptor's UUID unless it
 * is all zero), or, with device < 0, the visible device whose UUID matches. */
static int pick_device(int want, const uint8_t uuid[16], int *ret_dev)
{
	static const uint8_t zero[16];
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess)
		return cu_err(e, "cudaGetDeviceCount");
	if (n <= 0) {
		snprintf(last_err, sizeof(last_err), "no CUDA device");
		return -ENODEV;
	}
	for (int d = 0; d < n; d++) {
		struct cudaDeviceProp p;
		if (want >= 0 && d != want)
			continue;
		e = cudaGetDeviceProperties(&p, d);
		if (e != cudaSuccess)
			return cu_err(e, "cudaGetDeviceProperties");
		if (!memcmp(uuid, zero, 16) || !memcmp(p.uuid.bytes, uuid, 16)) {
			if (want < 0 && !memcmp(uuid, zero, 16) && n > 1) {
				snprintf(last_err, sizeof(last_err),
					 "descriptor names no device UUID and %d devices are visible", n);
				return -ENODEV;
			}
			*ret_dev = d;
			return 0;
		}
		if (want >= 0)
			break;
	}
	if (want >= 0)
		snprintf(last_err, sizeof(last_err), "device %d is not the GPU that holds the KV memory (UUID differs)",
			 want);
	else
		snprintf(last_err, sizeof(last_err), "none of the %d visible devices has the KV memory's UUID", n);
	return -ENODEV;
}

static void cuda_close(void *priv)
{
	struct cuda_xfer *x = priv;

	if (!x)
		return;
	(void) cudaSetDevice(x->device);
	for (uint32_t i = 0; i < KVR_XFER_MAX_INFLIGHT; i++) {
		struct cslot *s = &x->slots[i];
		if (s->busy) /* the dispatcher waits first; this is the error path of open */
			(void) cudaEventSynchronize(s->done);
		if (s->dep)
			(void) cudaEventDestroy(s->dep);
		if (s->start)
			(void) cudaEventDestroy(s->start);
		if (s->done)
			(void) cudaEventDestroy(s->done);
		if (s->pieces)
			(void) cudaFreeHost(s->pieces);
	}
	for (int i = 0; i < 2; i++)
		if (x->stream[i])
			(void) cudaStreamDestroy(x->stream[i]);
	/* Close every import even when the device is in an error state: a restarted actor or
	 * the next worker must not find stale mappings. */
	for (uint32_t i = 0; i < x->n_ranges; i++)
		if (x->ranges[i].base)
			(void) cudaIpcCloseMemHandle(x->ranges[i].base);
	if (x->arena_registered)
		arena_unregister(x->arena);
	free(x->ranges);
	free(x->scratch);
	free(x->dsts);
	free(x->srcs);
	free(x->sizes);
	free(x);
	(void) cudaGetLastError();
}

/* The copy mode from KVR_CUDA_COPY, refused when unknown or when this build or runtime
 * cannot do it (last_err says why). */
static int pick_copy_mode(struct cuda_xfer *x)
{
	x->mode = read_mode();
	if (x->mode < 0) {
		snprintf(last_err, sizeof(last_err), "KVR_CUDA_COPY=%s: want auto, memcpy, batch or kernel",
			 getenv("KVR_CUDA_COPY"));
		return -EINVAL;
	}
#ifndef KVR_XFER_HAVE_CUDA_KERNEL
	if (x->mode == KVR_CUDA_COPY_KERNEL) {
		snprintf(last_err, sizeof(last_err), "KVR_CUDA_COPY=kernel: this build has no kernel (nvcc not found)");
		return -EOPNOTSUPP;
	}
#endif
#if CUDART_VERSION >= 12080
	x->batch_ok = 1;
#endif
	if (x->mode == KVR_CUDA_COPY_BATCH && !x->batch_ok) {
		snprintf(last_err, sizeof(last_err), "KVR_CUDA_COPY=batch needs CUDA >= 12.8");
		return -EOPNOTSUPP;
	}
	return 0;
}

/* The device that holds the KV memory made current, and the arena registered with it and
 * mapped into its address space. */
static int attach_device(struct cuda_xfer *x, const struct kvr_xfer_arena *arena, int want,
			 const uint8_t uuid[16])
{
	cudaError_t e;
	int rc;

	if ((rc = pick_device(want, uuid, &x->device)))
		return rc;
	if ((e = cudaSetDevice(x->device)) != cudaSuccess)
		return cu_err(e, "cudaSetDevice");
	if ((rc = arena_register(arena->base, arena->size)))
		return rc;
	x->arena_registered = 1;
	void *adev = NULL;
	if ((e = cudaHostGetDevicePointer(&adev, arena->base, 0)) != cudaSuccess)
		return cu_err(e, "cudaHostGetDevicePointer(arena)");
	x->arena_dev = adev;
	return 0;
}

/* Each of the worker's KV ranges imported from its IPC handle (x->n_ranges counts those
 * open, so the close path closes exactly them). */
static int import_ranges(struct cuda_xfer *x, const struct kvr_cuda_range *r, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		cudaIpcMemHandle_t h;
		void *base = NULL;
		_Static_assert(sizeof(h) == KVR_CUDA_IPC_BYTES, "IPC memory handle size");
		memcpy(&h, r[i].handle, sizeof(h));
		cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
		if (e != cudaSuccess)
			return cu_err(e, "cudaIpcOpenMemHandle");
		x->ranges[i] = (struct range){.kv_off = r[i].kv_offset, .bytes = r[i].bytes, .base = base,
					      .dev = (uint8_t *)base + r[i].alloc_offset};
		x->n_ranges = i + 1;
	}
	return 0;
}

/* The two copy streams and each in-flight slot's start and done events. */
static int create_streams(struct cuda_xfer *x)
{
	cudaError_t e;

	for (int i = 0; i < 2; i++)
		if ((e = cudaStreamCreateWithFlags(&x->stream[i], cudaStreamNonBlocking)) != cudaSuccess)
			return cu_err(e, "cudaStreamCreateWithFlags");
	for (uint32_t i = 0; i < KVR_XFER_MAX_INFLIGHT; i++) {
		if ((e = cudaEventCreateWithFlags(&x->slots[i].start, cudaEventDefault)) != cudaSuccess ||
		    (e = cudaEventCreateWithFlags(&x->slots[i].done, cudaEventBlockingSync)) != cudaSuccess)
			return cu_err(e, "cudaEventCreateWithFlags");
	}
	return 0;
}

static int cuda_open(const struct kvr_xfer_kvmem *kv, const struct kvr_xfer_arena *arena, void **ret_priv)
{
	struct kvr_cuda_desc d;
	struct cuda_xfer *x;
	int rc;

	if (kv->kind != KVR_XFER_MEM_CUDA || !kv->u.cuda.blob || !arena->base)
		return -EINVAL;
	rc = kvr_cuda_desc_check(kv->u.cuda.blob, kv->u.cuda.blob_len, kv->size, last_err, sizeof(last_err));
	if (rc)
		return -EINVAL;
	memcpy(&d, kv->u.cuda.blob, sizeof(d));
	const struct kvr_cuda_range *r = (const void *)((const uint8_t *)kv->u.cuda.blob + d.ranges_off);

	x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	if ((rc = pick_copy_mode(x))) {
		free(x);
		return rc;
	}
	x->arena = arena->base;
	x->arena_size = arena->size;
	x->ranges = calloc(d.n_ranges, sizeof(*x->ranges));
	if (!x->ranges) {
		free(x);
		return -ENOMEM;
	}
	if ((rc = attach_device(x, arena, kv->u.cuda.device, d.device_uuid)) ||
	    (rc = import_ranges(x, r, d.n_ranges)) || (rc = create_streams(x))) {
		cuda_close(x);
		return rc;
	}
	last_err[0] = 0;
	*ret_priv = x;
	return 0;
}

/* The range holding KV byte off, by binary search; NULL when off is in no range. */
static const struct range *range_at(const struct cuda_xfer *x, uint64_t off)
{
	uint32_t lo = 0, hi = x->n_ranges;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct range *r = &x->ranges[mid];
		if (off < r->kv_off)
			hi = mid;
		else if (off - r->kv_off >= r->bytes)
			lo = mid + 1;
		else
			return r;
	}
	return NULL;
}

/* Split runs at range boundaries into pieces {dst, src, len} for direction dir (and, for
 * the kernel, into chunks of at most KERNEL_CHUNK). With out == NULL only counts. -ERANGE
 * when a byte of a run lies in no range. */
static int pieces(const struct cuda_xfer *x, uint32_t dir, const struct kvr_xfer_run *runs, size_t n, uint64_t chunk,
		  struct kvr_cuda_piece *out, int dev_view, size_t *ret_n)
{
	size_t k = 0;
	const uint8_t *host = dev_view ? x->arena_dev : x->arena;

	for (size_t i = 0; i < n; i++) {
		uint64_t kv = runs[i].kv_off, slot = runs[i].slot_off, left = runs[i].len;
		while (left) {
			const struct range *r = range_at(x, kv);
			if (!r) {
				snprintf(last_err, sizeof(last_err), "KV byte %llu lies in no range of the descriptor",
					 (unsigned long long)kv);
				return -ERANGE;
			}
			uint64_t len = r->kv_off + r->bytes - kv;
			if (len > left)
				len = left;
			for (uint64_t done = 0; done < len;) {
				uint64_t l = len - done > chunk ? chunk : len - done;
				if (out) {
					uint64_t d = (uint64_t)(uintptr_t)(r->dev + (kv - r->kv_off) + done);
					uint64_t h = (uint64_t)(uintptr_t)(host + slot + done);
					out[k] = dir == KVR_XFER_KV_TO_SLOT ? (struct kvr_cuda_piece){h, d, l}
									    : (struct kvr_cuda_piece){d, h, l};
				}
				k++;
				done += l;
			}
			kv += len;
			slot += len;
			left -= len;
		}
	}
	*ret_n = k;
	return 0;
}

static int grow_scratch(struct cuda_xfer *x, size_t n)
{
	if (n <= x->cap_scratch)
		return 0;
	struct kvr_cuda_piece *p = realloc(x->scratch, n * sizeof(*p));
	if (!p)
		return -ENOMEM;
	x->scratch = p;
	void **d = realloc(x->dsts, n * sizeof(*d));
	if (!d)
		return -ENOMEM;
	x->dsts = d;
	const void **s = realloc(x->srcs, n * sizeof(*s));
	if (!s)
		return -ENOMEM;
	x->srcs = s;
	size_t *z = realloc(x->sizes, n * sizeof(*z));
	if (!z)
		return -ENOMEM;
	x->sizes = z;
	x->cap_scratch = n;
	return 0;
}

#ifdef KVR_XFER_HAVE_CUDA_KERNEL
/* The slot's kernel argument table: pinned, mapped host memory the kernel reads. */
static int grow_pieces(struct cslot *s, size_t n)
{
	if (n <= s->cap_pieces)
		return 0;
	size_t cap = s->cap_pieces ? s->cap_pieces : 256;
	while (cap < n)
		cap *= 2;
	void *p = NULL;
	cudaError_t e = cudaHostAlloc(&p, cap * sizeof(struct kvr_cuda_piece),
				      cudaHostAllocMapped | cudaHostAllocPortable);
	if (e != cudaSuccess)
		return cu_err(e, "cudaHostAlloc(kernel arguments)");
	if (s->pieces)
		(void) cudaFreeHost(s->pieces);
	s->pieces = p;
	s->cap_pieces = cap;
	return 0;
}
#endif

#ifdef KVR_XFER_HAVE_CUDA_KERNEL
/* The copies as one gather/scatter kernel launch on stream st, its argument table in the
 * slot's pinned pieces. Returns 1 or -errno. */
static int enqueue_kernel(struct cuda_xfer *x, struct cslot *s, uint32_t dir, const struct kvr_xfer_run *runs,
			  size_t n, cudaStream_t st, int *ret_started)
{
	size_t nk;
	int rc;
	if ((rc = pieces(x, dir, runs, n, KERNEL_CHUNK, NULL, 1, &nk)) || (rc = grow_pieces(s, nk)))
		return rc;
	(void) pieces(x, dir, runs, n, KERNEL_CHUNK, s->pieces, 1, &nk);
	void *pdev = NULL;
	cudaError_t e = cudaHostGetDevicePointer(&pdev, s->pieces, 0);
	if (e != cudaSuccess)
		return cu_err(e, "cudaHostGetDevicePointer(kernel arguments)");
	unsigned grid = nk < 65535 ? (unsigned)nk : 65535;
	e = (cudaError_t)kvr_cuda_launch_copy(pdev, (unsigned)nk, grid, KERNEL_THREADS, st);
	if (e != cudaSuccess)
		return cu_err(e, "copy kernel launch");
	*ret_started = 1;
	return 1;
}
#endif

#if CUDART_VERSION >= 12080
/* The np pieces in x's scratch arrays as one cudaMemcpyBatchAsync on stream st. Returns 1,
 * 0 when the driver cannot batch in auto mode (batching is off from then on: the caller
 * copies piece by piece), or -errno. */
static int enqueue_batch(struct cuda_xfer *x, uint32_t dir, size_t np, cudaStream_t st, int *ret_started)
{
	struct cudaMemcpyAttributes attr = {
		.srcAccessOrder = cudaMemcpySrcAccessOrderStream,
		.flags = cudaMemcpyFlagPreferOverlapWithCompute,
	};
	attr.srcLocHint.type = dir == KVR_XFER_KV_TO_SLOT ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
	attr.srcLocHint.id = dir == KVR_XFER_KV_TO_SLOT ? x->device : 0;
	attr.dstLocHint.type = dir == KVR_XFER_KV_TO_SLOT ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
	attr.dstLocHint.id = dir == KVR_XFER_KV_TO_SLOT ? 0 : x->device;
	size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
	cudaError_t e = cudaMemcpyBatchAsync((void *const *)x->dsts, (const void *const *)x->srcs, x->sizes, np,
					     &attr, &attr_idx, 1, st);
#else
	size_t fail_idx = SIZE_MAX;
	cudaError_t e = cudaMemcpyBatchAsync((void **)x->dsts, (void **)x->srcs, x->sizes, np, &attr, &attr_idx,
					     1, &fail_idx, st);
#endif
	if (e == cudaSuccess) {
		*ret_started = 1;
		return 1;
	}
	if (x->mode == KVR_CUDA_COPY_BATCH ||
	    (e != cudaErrorNotSupported && e != cudaErrorCallRequiresNewerDriver))
		return cu_err(e, "cudaMemcpyBatchAsync");
	/* auto: the driver cannot batch; per-run copies from now on */
	(void) cudaGetLastError();
	x->batch_ok = 0;
	return 0;
}
#endif

/* The np pieces in x's scratch arrays as one cudaMemcpyAsync each on stream st. Returns np
 * or -errno. */
static int enqueue_memcpy(struct cuda_xfer *x, uint32_t dir, size_t np, cudaStream_t st, int *ret_started)
{
	enum cudaMemcpyKind kind = dir == KVR_XFER_KV_TO_SLOT ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
	for (size_t i = 0; i < np; i++) {
		cudaError_t e = cudaMemcpyAsync(x->dsts[i], x->srcs[i], x->sizes[i], kind, st);
		if (e != cudaSuccess)
			return cu_err(e, "cudaMemcpyAsync");
		*ret_started = 1;
	}
	return (int)np;
}

/* Enqueue the copies on stream st. Returns the copy calls/launches issued (>= 1) or -errno;
 * *ret_started says whether anything was enqueued before a failure. */
static int enqueue(struct cuda_xfer *x, struct cslot *s, uint32_t dir, const struct kvr_xfer_run *runs, size_t n,
		   uint64_t bytes, cudaStream_t st, int *ret_started)
{
	size_t np;
	int rc = pieces(x, dir, runs, n, UINT64_MAX, NULL, 0, &np);
	int mode = x->mode;

	*ret_started = 0;
	if (rc)
		return rc;
	if (mode == KVR_CUDA_COPY_AUTO)
		mode = np >= BATCH_MIN_PIECES && bytes / np < BATCH_MAX_AVG && x->batch_ok ? KVR_CUDA_COPY_BATCH
											  : KVR_CUDA_COPY_MEMCPY;
#ifdef KVR_XFER_HAVE_CUDA_KERNEL
	if (mode == KVR_CUDA_COPY_KERNEL)
		return enqueue_kernel(x, s, dir, runs, n, st, ret_started);
#else
	(void) s;
#endif
	if ((rc = grow_scratch(x, np)))
		return rc;
	/* Host side by its host address: the copy engines take the registered pointer. */
	(void) pieces(x, dir, runs, n, UINT64_MAX, x->scratch, 0, &np);
	for (size_t i = 0; i < np; i++) {
		x->dsts[i] = (void *)(uintptr_t)x->scratch[i].dst;
		x->srcs[i] = (const void *)(uintptr_t)x->scratch[i].src;
		x->sizes[i] = (size_t)x->scratch[i].len;
	}
#if CUDART_VERSION >= 12080
	if (mode == KVR_CUDA_COPY_BATCH && (rc = enqueue_batch(x, dir, np, st, ret_started)))
		return rc;
#endif
	return enqueue_memcpy(x, dir, np, st, ret_started);
}

static int cuda_submit(void *priv, uint32_t slot, uint32_t dir, const struct kvr_xfer_run *runs, size_t n,
		       const struct kvr_xfer_dep *ready, struct kvr_xfer_stats *ret_stats)
{
	struct cuda_xfer *x = priv;
	struct cslot *s = &x->slots[slot];
	cudaStream_t st = x->stream[dir == KVR_XFER_KV_TO_SLOT ? 0 : 1];
	uint64_t bytes = 0;
	cudaError_t e;
	int rc, started = 0;

	(void) ret_stats;
	if (s->busy)
		return -EBUSY;
	if (ready->kind != KVR_XFER_DEP_NONE &&
	    (ready->kind != KVR_XFER_DEP_CUDA_IPC_EVENT || ready->len != sizeof(cudaIpcEventHandle_t)))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		bytes += runs[i].len;
	if ((e = cudaSetDevice(x->device)) != cudaSuccess)
		return cu_err(e, "cudaSetDevice");

	uint64_t t0 = kvr_now_ns();
	if (ready->kind == KVR_XFER_DEP_CUDA_IPC_EVENT) {
		/* Our own reference to the producer's event: the worker may destroy its own right
		 * after this returns; we destroy ours once this ticket's copy completed. */
		cudaIpcEventHandle_t h;
		_Static_assert(sizeof(h) == KVR_CUDA_IPC_BYTES, "IPC event handle size");
		memcpy(&h, ready->blob, sizeof(h));
		if ((e = cudaIpcOpenEventHandle(&s->dep, h)) != cudaSuccess) {
			s->dep = NULL;
			return cu_err(e, "cudaIpcOpenEventHandle");
		}
		if ((e = cudaStreamWaitEvent(st, s->dep, 0)) != cudaSuccess) {
			rc = cu_err(e, "cudaStreamWaitEvent");
			goto fail;
		}
	}
	if ((e = cudaEventRecord(s->start, st)) != cudaSuccess) {
		rc = cu_err(e, "cudaEventRecord(start)");
		goto fail;
	}
	rc = enqueue(x, s, dir, runs, n, bytes, st, &started);
	if (rc < 0)
		goto fail;
	s->st = (struct kvr_xfer_stats){.bytes = bytes, .runs = n, .copies = (uint64_t)rc};
	if ((e = cudaEventRecord(s->done, st)) != cudaSuccess) {
		rc = cu_err(e, "cudaEventRecord(done)");
		goto fail;
	}
	s->submit_ns = t0;
	s->busy = 1;
	return 0;
fail:
	/* Nothing may stay in flight behind an error: the slot is reused at once. */
	if (started)
		(void) cudaStreamSynchronize(st);
	if (s->dep) {
		(void) cudaEventDestroy(s->dep);
		s->dep = NULL;
	}
	return rc;
}

/* The slot's copy is complete (or failed): stats, drop the producer event, free the slot. */
static int slot_finish(struct cuda_xfer *x, struct cslot *s, cudaError_t status, struct kvr_xfer_stats *ret_stats)
{
	int rc = 0;

	if (status != cudaSuccess) {
		rc = cu_err(status, "copy");
	} else {
		float ms = 0;
		uint64_t total = kvr_now_ns() - s->submit_ns, copy_ns = 0;
		if (cudaEventElapsedTime(&ms, s->start, s->done) == cudaSuccess && ms > 0)
			copy_ns = (uint64_t)((double)ms * 1e6);
		else
			(void) cudaGetLastError();
		s->st.copy_ns = copy_ns;
		s->st.queue_ns = total > copy_ns ? total - copy_ns : 0;
		*ret_stats = s->st;
	}
	if (s->dep)
		(void) cudaEventDestroy(s->dep);
	s->dep = NULL;
	s->busy = 0;
	(void) x;
	return rc;
}

static int cuda_poll(void *priv, uint32_t slot, struct kvr_xfer_stats *ret_stats)
{
	struct cuda_xfer *x = priv;
	struct cslot *s = &x->slots[slot];

	if (!s->busy)
		return -EINVAL;
	(void) cudaSetDevice(x->device);
	cudaError_t e = cudaEventQuery(s->done);
	if (e == cudaErrorNotReady) {
		(void) cudaGetLastError();
		return -EAGAIN;
	}
	return slot_finish(x, s, e, ret_stats);
}

static int cuda_wait(void *priv, uint32_t slot, int64_t timeout_ns, struct kvr_xfer_stats *ret_stats)
{
	struct cuda_xfer *x = priv;
	struct cslot *s = &x->slots[slot];

	if (!s->busy)
		return -EINVAL;
	(void) cudaSetDevice(x->device);
	if (timeout_ns < 0) /* the event is blocking-sync: the thread sleeps in the driver */
		return slot_finish(x, s, cudaEventSynchronize(s->done), ret_stats);

	/* Bounded: poll with a growing sleep (20 us .. 1 ms), never a spin. */
	uint64_t deadline = kvr_now_ns() + (uint64_t)timeout_ns;
	long nap = 20000;
	for (;;) {
		cudaError_t e = cudaEventQuery(s->done);
		if (e != cudaErrorNotReady)
			return slot_finish(x, s, e, ret_stats);
		(void) cudaGetLastError();
		uint64_t now = kvr_now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		uint64_t left = deadline - now;
		struct timespec ts = {0, (long)(left < (uint64_t)nap ? left : (uint64_t)nap)};
		nanosleep(&ts, NULL);
		if (nap < 1000000)
			nap *= 2;
	}
}

const struct kvr_xfer_backend kvr_xfer_cuda_backend = {
	.name = "cuda",
	.kind = KVR_XFER_MEM_CUDA,
	.open = cuda_open,
	.close = cuda_close,
	.submit = cuda_submit,
	.poll = cuda_poll,
	.wait = cuda_wait,
};
