/* kvr_cuda: the CUDA KV descriptor (create, read, check), its store-event table, and the CUDA backend's extras. */
#ifndef KVR_CUDA_H
#define KVR_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_proto.h"
#include "kvr_xfer.h"

/*
 * A worker whose KV memory is GPU memory attaches with a KV descriptor instead of a KV
 * memfd (format: ipc/kvr_proto.h, struct kvr_cuda_desc; why: docs/cuda.md). This module is
 * CUDA-free and always built: the actor side reads and checks a descriptor and its event
 * table; the worker side (tests, benches, workers that do not link libkvring — libkvring's
 * kvr_attach writes the same format itself) creates one. The CUDA backend (cuda.c, built
 * with -Dcuda) opens the blob that kvr_cuda_desc_read returns:
 *
 *     struct kvr_xfer_kvmem kv = {.kind = KVR_XFER_MEM_CUDA, .size = fd_size};
 *     kv.u.cuda.blob = blob; kv.u.cuda.blob_len = len; kv.u.cuda.device = -1; (by UUID)
 *
 * Errors are negative errno values; err/errlen (optional) get a one-line reason on failure.
 */

/* The blob kvr_cuda_desc_read returns and the CUDA backend opens: the header and the
 * ranges, nothing else (the event table stays in the fd). Checks magic, version, every
 * count, offset and reserved field, and that the ranges are non-empty, sorted by
 * kv_offset, disjoint, inside [0, kv_bytes) without overflow. fd_bytes (0 = unknown) is the
 * size of the fd the blob came from: kv_bytes and desc_bytes must not exceed it.
 * 0 or -EBADMSG. */
int kvr_cuda_desc_check(const void *blob, size_t len, uint64_t fd_bytes, char *err, size_t errlen);

/* Whether fd is a KV descriptor, and if so its checked blob.
 *   0        *ret_blob (malloc'd; the caller frees it) and *ret_len
 *   -ENOMSG  not a descriptor: the fd carries no write seal (F_SEAL_WRITE or
 *            F_SEAL_FUTURE_WRITE; a host KV memfd never does, the host backend maps it
 *            writable) or does not start with KVR_CUDA_DESC_MAGIC. Use the host backend.
 *   -EBADMSG a sealed fd that starts with the magic but does not check
 *   -errno   fstat / pread / malloc failed
 * Outputs untouched on failure. */
int kvr_cuda_desc_read(int fd, void **ret_blob, size_t *ret_len, char *err, size_t errlen);

/* ---- worker side ------------------------------------------------------------------------ */

struct kvr_cuda_export {
	int fd;                        /* the sealed descriptor memfd (send it; close it after) */
	uint64_t fd_bytes;             /* its size: max(kv_bytes, desc_bytes) */
	struct kvr_cuda_event *events; /* writable view of the event table (n_events entries) */
	uint32_t n_events;
	void *map;                     /* mapping of [0, desc_bytes) */
	size_t map_len;
};

/* Create a sealed KV descriptor: n ranges (sorted by kv_offset, disjoint, reserved 0),
 * a KV offset space of kv_bytes, the GPU's UUID, an event table of n_events entries
 * (0 or a power of two). 0 and *ret, -EINVAL (the ranges or sizes do not check; err says
 * why), -errno (memfd_create, ftruncate, mmap, sealing). *ret untouched on failure. */
int kvr_cuda_desc_create(const struct kvr_cuda_range *ranges, uint32_t n, uint64_t kv_bytes,
			 const uint8_t device_uuid[16], uint32_t n_events, struct kvr_cuda_export *ret, char *err,
			 size_t errlen);

/* Close the fd (if still open) and unmap. NULL-safe; idempotent. */
void kvr_cuda_export_close(struct kvr_cuda_export *x);

/* Publish the IPC event handle (KVR_CUDA_IPC_BYTES) of the STORE with this wire id in
 * entry wire % n_events (the handle first, then the wire id). The caller makes sure no
 * other store in flight uses that entry. -EINVAL when there is no table or wire is 0. */
int kvr_cuda_export_event(struct kvr_cuda_export *x, uint64_t wire, const void *handle);

/* ---- actor side: store events ----------------------------------------------------------- */

struct kvr_cuda_events {
	const struct kvr_cuda_event *tab;
	uint32_t n;
	void *map;
	size_t map_len;
};

/* Map a descriptor's event table read-only. 0, -ENOMSG (not a descriptor), -EBADMSG,
 * -errno. *ret untouched on failure. */
int kvr_cuda_events_map(int fd, struct kvr_cuda_events *ret);
void kvr_cuda_events_unmap(struct kvr_cuda_events *e); /* NULL-safe */

/* The dependency of the STORE with this wire id: *ret_dep = {KVR_XFER_DEP_CUDA_IPC_EVENT,
 * the handle}. -ENOENT when the entry does not hold that wire id (or changed while it was
 * read): fail the store, never copy without its event. */
int kvr_cuda_events_dep(const struct kvr_cuda_events *e, uint64_t wire, struct kvr_xfer_dep *ret_dep);

/* ---- CUDA backend extras (defined only in builds with the CUDA backend) ----------------- */

/* The last CUDA error this thread's backend calls met, "" when none: the backend returns
 * -errno and does not log; a caller that logs adds this ("cudaIpcOpenMemHandle: invalid
 * resource handle"). */
const char *kvr_xfer_cuda_last_error(void);

/* How long this process's registration of the arena at base took (its chunks, the device
 * address check), ns; 0 when it is not registered here. The cost tools/gpu-check.sh shows. */
uint64_t kvr_xfer_cuda_arena_reg_ns(const void *base);

/* Copy method, per context, chosen at open from env KVR_CUDA_COPY (docs/cuda.md):
 *   auto (default)  few or large runs: one cudaMemcpyAsync per run; many small runs:
 *                   one cudaMemcpyBatchAsync (CUDA >= 12.8), else per run
 *   memcpy | batch | kernel   force one (kernel: the gather/scatter kernel, when built) */
enum kvr_cuda_copy_mode {
	KVR_CUDA_COPY_AUTO = 0,
	KVR_CUDA_COPY_MEMCPY = 1,
	KVR_CUDA_COPY_BATCH = 2,
	KVR_CUDA_COPY_KERNEL = 3,
};

#endif
