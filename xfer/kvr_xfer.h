/* kvr_xfer: moving KV bytes between a worker's KV memory and L1 arena slots (plan, exact copy, backends). */
#ifndef KVR_XFER_H
#define KVR_XFER_H

#include <stddef.h>
#include <stdint.h>

/*
 * Three layers, each usable on its own:
 *
 *   1. The copy planner (plan.c): a worker's KV layout (a region table) + a list of
 *      (block id, slot offset) pairs -> a short list of copy runs {kv_off, slot_off, len},
 *      every range validated, runs coalesced where they are contiguous on both sides.
 *   2. The exact copy (copy.c): kvr_copy(), correct for any length and alignment.
 *   3. Backends (xfer.c dispatch, host.c, cuda.c): open the worker's KV memory,
 *      submit runs in one direction, complete them asynchronously by ticket.
 *
 * Slot layout (the contract every producer and consumer of an arena slot follows): a
 * lane's block in a slot is the concatenation of every region's page, in region order.
 * The slot offset of region r is the sum of page_bytes of regions 0..r-1; the lane's block
 * occupies kvr_xfer_slot_bytes() bytes starting at its slot offset. Every declared page
 * byte is transferred, opaque tails included; bytes between a page's end and the next
 * block's page (stride - page_bytes) are never read or written.
 *
 * Errors are negative errno values. Functions that can say which block was wrong take an
 * optional struct kvr_xfer_err *err, written only on failure (the opposite of a ret_*
 * parameter, which is written only on success).
 */

/* ---- 1. Layout and planner ------------------------------------------------------------ */

#define KVR_XFER_MAX_REGIONS 4096u

/* One region of the worker's KV memory: block b's page lies at offset + b * stride and is
 * page_bytes long. A layer's K cache, its V cache, a cross-layer block, an opaque state
 * tensor: each is one region. Same fields, order and meaning as include/kvring/kvr_geometry.h's
 * struct kvr_region, so the glue is a field-by-field copy. */
struct kvr_xfer_region {
	uint64_t offset;     /* byte offset of block 0's page in the KV memory */
	uint64_t stride;     /* bytes from block b's page to block b+1's page */
	uint32_t page_bytes; /* declared bytes per block, opaque tail included; > 0, <= stride */
	uint32_t sem_bytes;  /* semantic payload at the page start, <= page_bytes (0: unknown);
			      * informational: the planner always moves all page_bytes */
};
_Static_assert(sizeof(struct kvr_xfer_region) == 24, "region table entry");

struct kvr_xfer_layout {
	const struct kvr_xfer_region *regions;
	uint32_t n_regions;  /* 1..KVR_XFER_MAX_REGIONS */
	uint32_t num_blocks; /* valid block ids are 0..num_blocks-1 */
	uint64_t kv_size;    /* bytes of the worker's KV memory */
	uint64_t arena_size; /* bytes of the arena that slot offsets index */
};

/* One copy: len bytes between KV memory offset kv_off and arena offset slot_off. */
struct kvr_xfer_run {
	uint64_t kv_off;
	uint64_t slot_off;
	uint64_t len;
};
_Static_assert(sizeof(struct kvr_xfer_run) == 24, "copy run");

/* What was wrong, for a caller that must report exactly which block failed. */
enum kvr_xfer_err_what {
	KVR_XFER_E_NONE = 0,
	KVR_XFER_E_ARG,          /* NULL pointer, n_regions 0 or too many, num_blocks 0 */
	KVR_XFER_E_REGION,       /* region: page_bytes 0, page_bytes > stride, sem_bytes > page_bytes */
	KVR_XFER_E_REGION_RANGE, /* region: its last block's page ends beyond kv_size (-ERANGE) */
	KVR_XFER_E_BLOCK_ID,     /* block id >= num_blocks (-ERANGE) */
	KVR_XFER_E_SLOT_RANGE,   /* slot offset + slot bytes beyond arena_size (-ERANGE) */
	KVR_XFER_E_KV_OVERLAP,   /* two pages overlap in KV memory: duplicate block id, or
				  * regions that overlap each other (-EINVAL) */
	KVR_XFER_E_SLOT_OVERLAP, /* two blocks' slot ranges overlap in the arena (-EINVAL) */
	KVR_XFER_E_NOSPC,        /* more runs than cap (-ENOSPC) */
	KVR_XFER_E_TOO_BIG,      /* n_blocks * n_regions does not fit an int (-E2BIG) */
};

#define KVR_XFER_NONE_IDX 0xffffffffu

struct kvr_xfer_err {
	uint32_t what;     /* enum kvr_xfer_err_what */
	uint32_t index;    /* position in block_ids[] of the offending block, or KVR_XFER_NONE_IDX */
	uint32_t block_id; /* that block's id, or KVR_XFER_NONE_IDX */
	uint32_t region;   /* region involved, or KVR_XFER_NONE_IDX */
};

/* Validate a layout on its own (the planner does it too, on every call): -EINVAL with
 * E_ARG / E_REGION, -ERANGE with E_REGION_RANGE (region index in err->region). Every page
 * of every block id < num_blocks then lies inside [0, kv_size). Overlap between different
 * regions is caught per plan (E_KV_OVERLAP), for the blocks that plan touches. */
int kvr_xfer_layout_check(const struct kvr_xfer_layout *layout, struct kvr_xfer_err *err);

/* Bytes of one lane's block in a slot: the sum of every region's page_bytes. The layout
 * must have passed kvr_xfer_layout_check (0 otherwise). */
uint64_t kvr_xfer_slot_bytes(const struct kvr_xfer_layout *layout);

/* Offset of region r's page inside a lane's block in a slot (sum of earlier page_bytes). */
uint64_t kvr_xfer_region_slot_offset(const struct kvr_xfer_layout *layout, uint32_t r);

/* A cap that always suffices for kvr_xfer_plan: n_regions * n_blocks (SIZE_MAX on overflow). */
size_t kvr_xfer_plan_max_runs(uint32_t n_regions, size_t n_blocks);

/*
 * Plan the copies for n_blocks blocks: block block_ids[i] of the worker's KV memory <->
 * this lane's block at arena offset slot_offsets[i] (slot layout above).
 *
 * Writes at most cap runs to runs[] and returns their count (>= 0; 0 when n_blocks is 0).
 * *ret_bytes (may be NULL) gets the total bytes, n_blocks * kvr_xfer_slot_bytes().
 *
 * Runs that are contiguous on BOTH sides are merged, whatever order the blocks came in:
 * consecutive block ids with stride == page_bytes into consecutive slots, consecutive
 * regions of a cross-layer layout, reversed id lists into reversed slots. Runs come out
 * sorted by kv_off; no two overlap on either side, so they may run in any order or all
 * at once.
 *
 * Errors (runs[] contents unspecified, *ret_bytes untouched, *err says which block):
 *   -EINVAL  bad layout or arguments; a duplicate block id or overlapping regions
 *            (E_KV_OVERLAP); two blocks whose slot ranges overlap (E_SLOT_OVERLAP)
 *   -ERANGE  a block id >= num_blocks (E_BLOCK_ID), a slot range beyond the arena
 *            (E_SLOT_RANGE), a region beyond the KV memory (E_REGION_RANGE)
 *   -ENOSPC  more than cap runs even after merging (cap kvr_xfer_plan_max_runs() suffices)
 *   -E2BIG   n_blocks * n_regions > INT_MAX
 */
int kvr_xfer_plan(const struct kvr_xfer_layout *layout, const uint32_t *block_ids, const uint64_t *slot_offsets,
		  size_t n_blocks, struct kvr_xfer_run *runs, size_t cap, uint64_t *ret_bytes,
		  struct kvr_xfer_err *err);

/* Static name of an enum kvr_xfer_err_what ("block id out of range", ...). */
const char *kvr_xfer_err_str(uint32_t what);

/* "block id out of range: block 17 (index 3), region 2" into buf (always NUL-terminated
 * when len > 0). Returns what snprintf returns. */
int kvr_xfer_err_format(const struct kvr_xfer_err *err, char *buf, size_t len);

/* ---- 2. Exact copy -------------------------------------------------------------------- */

/* Copy len bytes from src to dst (non-overlapping). Exact for any length and any
 * alignment of either side: reads only [src, src+len), writes only [dst, dst+len).
 * len 0 touches nothing. This is the host backend's copy: memcpy, except 1..16 MiB on
 * x86-64, which goes through kvr_copy_nt (copy_bench measured it faster there; copy.c).
 * Returns with every byte stored and globally ordered before any later store. */
void kvr_copy(void *dst, const void *src, size_t len);

/* The same contract, for one run of a transfer that moves >= 1 MiB in all: the bytes will
 * not be read again soon, so 4 KiB..16 MiB runs take kvr_copy_nt, others kvr_copy. The
 * host backend uses it for submissions of >= KVR_XFER_STREAM_MIN bytes. */
#define KVR_XFER_STREAM_MIN (1ull << 20)
void kvr_copy_stream(void *dst, const void *src, size_t len);

/* The same contract, always with non-temporal stores for the 16-byte aligned body
 * (x86-64 SSE2; memcpy elsewhere and below 256 bytes), ending in a store fence so the
 * bytes are ordered before any later release store. Exported for tests and copy_bench. */
void kvr_copy_nt(void *dst, const void *src, size_t len);

/* ---- 3. Backends ---------------------------------------------------------------------- */

enum kvr_xfer_dir {
	KVR_XFER_KV_TO_SLOT = 1, /* store: worker KV memory -> arena */
	KVR_XFER_SLOT_TO_KV = 2, /* load: arena -> worker KV memory */
};

enum kvr_xfer_mem_kind {
	KVR_XFER_MEM_HOST = 1, /* KV memory is a memfd the actor maps; copies are kvr_copy */
	KVR_XFER_MEM_CUDA = 2, /* KV memory is GPU memory named by CUDA IPC handles */
};

/* The worker's KV memory, as the actor receives it at attach. */
struct kvr_xfer_kvmem {
	uint32_t kind;   /* enum kvr_xfer_mem_kind */
	uint32_t reserved;
	uint64_t size;   /* bytes; region offsets and run kv_off index [0, size) */
	union {
		struct {
			int fd;          /* memfd; the caller keeps it (the backend maps it, keeps no fd) */
			uint32_t pad;
			uint64_t offset; /* KV byte 0 lies at this offset in the fd */
		} host;
		struct {
			const void *blob; /* IPC handle(s) and their layout; format owned by the CUDA
					   * backend; read during open only */
			uint32_t blob_len;
			int32_t device;   /* CUDA device ordinal the actor uses */
		} cuda;
	} u;
};

/* The arena as this actor mapped it; it must stay mapped until kvr_xfer_close. */
struct kvr_xfer_arena {
	void *base;
	uint64_t size;
};

/* What a copy waits for before it may read its source. */
enum kvr_xfer_dep_kind {
	KVR_XFER_DEP_NONE = 0,           /* ready now (host: the ring message that carried the
					  * request already ordered the producer's writes) */
	KVR_XFER_DEP_CUDA_IPC_EVENT = 1, /* blob = cudaIpcEventHandle_t of the producer's event */
};

#define KVR_XFER_DEP_BLOB 64

struct kvr_xfer_dep {
	uint32_t kind; /* enum kvr_xfer_dep_kind */
	uint32_t len;  /* bytes of blob in use */
	uint8_t blob[KVR_XFER_DEP_BLOB];
};
_Static_assert(sizeof(struct kvr_xfer_dep) == 72, "dependency");

/* Per submission (and, summed, per kvr_xfer). Maps onto the LOAD_DONE / STORE_DONE
 * diagnostics of include/kvring/msg.h. */
struct kvr_xfer_stats {
	uint64_t bytes;    /* bytes moved */
	uint64_t runs;     /* copy runs submitted */
	uint64_t copies;   /* copy operations issued (host: one per run; CUDA: calls/launches) */
	uint64_t queue_ns; /* submit -> copy start (waiting on `ready` and earlier work) */
	uint64_t copy_ns;  /* copy start -> completion */
};

struct kvr_xfer_totals {
	uint64_t submitted; /* tickets handed out */
	uint64_t completed; /* tickets reaped with success */
	uint64_t failed;    /* tickets reaped with an error */
	struct kvr_xfer_stats sum; /* over completed tickets */
};

/* Tickets a kvr_xfer holds between submit and the poll/wait that reaps them. */
#define KVR_XFER_MAX_INFLIGHT 64u

/*
 * Backend operations. Implementations see only validated input: the dispatch layer
 * (xfer.c) checks every run against the KV and arena sizes, n >= 1, dir and dep kind,
 * before it calls submit. slot (0..KVR_XFER_MAX_INFLIGHT-1) names the submission while it
 * is in flight; the backend keeps whatever it needs per slot (CUDA: its event, its own
 * reference to the producer's event) until poll/wait report it done.
 *
 * open    import the KV memory, register the arena. 0 and *ret_priv, or -errno.
 * close   release everything; called only when no slot is in flight. NULL-safe.
 * submit  start the copy of runs[0..n) (runs is read during the call only; the caller may
 *         reuse it at once) after `ready` is satisfied. The backend takes its own reference
 *         to `ready` and holds it until the copy completed. Returns 1 when the copy
 *         already completed (*ret_stats filled), 0 when it is in flight, -errno when
 *         nothing was started (-EOPNOTSUPP: a dependency kind it cannot honour).
 * poll    0 done (*ret_stats filled, slot free again), -EAGAIN in flight, other -errno:
 *         the copy failed (slot free again).
 * wait    as poll, blocking up to timeout_ns (< 0: forever); -ETIMEDOUT when still in flight.
 */
struct kvr_xfer_backend {
	const char *name;
	uint32_t kind; /* enum kvr_xfer_mem_kind it opens */
	int (*open)(const struct kvr_xfer_kvmem *kv, const struct kvr_xfer_arena *arena, void **ret_priv);
	void (*close)(void *priv);
	int (*submit)(void *priv, uint32_t slot, uint32_t dir, const struct kvr_xfer_run *runs, size_t n,
		      const struct kvr_xfer_dep *ready, struct kvr_xfer_stats *ret_stats);
	int (*poll)(void *priv, uint32_t slot, struct kvr_xfer_stats *ret_stats);
	int (*wait)(void *priv, uint32_t slot, int64_t timeout_ns, struct kvr_xfer_stats *ret_stats);
	/* optional: where the KV memory is mapped in this process (host backend) */
	int (*mapping)(void *priv, void **ret_base, size_t *ret_len);
};

/* The host backend: submit copies synchronously (1 = done inside submit); that is the
 * production path for CPU KV memory. open maps the memfd shared read-write and seals it
 * against shrinking (F_SEAL_SHRINK), so a worker cannot make the actor fault by
 * truncating it; an fd that cannot be sealed (not a memfd, or sealed without SHRINK) is
 * refused with -EPERM. A CUDA dependency is refused with -EOPNOTSUPP. */
extern const struct kvr_xfer_backend kvr_xfer_host_backend;

/* The backend built for a memory kind, or NULL (CUDA in a build without CUDA). */
const struct kvr_xfer_backend *kvr_xfer_backend_for(uint32_t kind);

/* One open transfer context: one worker's KV memory <-> one arena. Used by one thread. */
struct kvr_xfer;

/* Where this context maps the KV memory in this process: 0 and the whole mapping (host
 * backend: the memfd, mapped read-write), -EOPNOTSUPP when it is not mapped here (CUDA).
 * For the actor's background populate. */
int kvr_xfer_mapping(const struct kvr_xfer *x, void **ret_base, size_t *ret_len);

/* Open the backend for kv->kind. -EINVAL bad arguments, -EOPNOTSUPP kind not built,
 * else the backend's error. *ret untouched on failure. */
int kvr_xfer_open(const struct kvr_xfer_kvmem *kv, const struct kvr_xfer_arena *arena, struct kvr_xfer **ret);

/* Wait for every copy still in flight (their results are dropped), then close. NULL-safe. */
void kvr_xfer_close(struct kvr_xfer *x);

/*
 * Submit runs in direction dir (enum kvr_xfer_dir) after `ready` (NULL = none). runs are
 * read during the call only; destinations must not overlap (kvr_xfer_plan guarantees it).
 * n == 0 gives a ticket that is already complete with zero stats.
 * Returns 0 and *ret_ticket (never 0), or:
 *   -EINVAL  bad arguments or dependency; -ERANGE a run outside the KV memory or arena
 *            (nothing copied); -EBUSY KVR_XFER_MAX_INFLIGHT tickets not yet reaped;
 *   -EOPNOTSUPP the backend cannot honour `ready`; else the backend's error.
 */
int kvr_xfer_submit(struct kvr_xfer *x, uint32_t dir, const struct kvr_xfer_run *runs, size_t n,
		    const struct kvr_xfer_dep *ready, uint64_t *ret_ticket);

/* Reap a ticket: 0 done (*ret_stats, may be NULL; the ticket is retired), -EAGAIN still in
 * flight, -ENOENT not a ticket of x or already reaped, other -errno: the copy failed
 * (ticket retired). */
int kvr_xfer_poll(struct kvr_xfer *x, uint64_t ticket, struct kvr_xfer_stats *ret_stats);

/* As kvr_xfer_poll, blocking up to timeout_ns (< 0: forever); -ETIMEDOUT if not done. */
int kvr_xfer_wait(struct kvr_xfer *x, uint64_t ticket, int64_t timeout_ns, struct kvr_xfer_stats *ret_stats);

/* Tickets submitted and not yet reaped. */
unsigned kvr_xfer_inflight(const struct kvr_xfer *x);

void kvr_xfer_get_totals(const struct kvr_xfer *x, struct kvr_xfer_totals *ret);

/* The backend's name ("host", "cuda"). */
const char *kvr_xfer_backend_name(const struct kvr_xfer *x);

#endif
