/* libkvring: what an inference worker links to store and load KV blocks through kvringd. */
#ifndef KVRING_KVRING_H
#define KVRING_KVRING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Life of a worker (one per GPU rank):
 *
 *   kvr_attach()      connect to kvringd, describe the geometry and share the KV memory;
 *   kvr_lookup()      tokens -> how many leading tokens are cached (whole blocks);
 *   kvr_load()        copy the matched blocks into the engine's block ids (asynchronous);
 *   kvr_store()       copy a finished request's blocks out (asynchronous; call it once the
 *                     engine reports the blocks final — it is the "final" mark);
 *   kvr_poll()/kvr_wait()  collect completions;
 *   kvr_detach()
 *
 * Errors: every call returns 0 (or a count) or a negative errno; kvr_last_error() gives a
 * one-line reason for the last failure on this client. No call blocks longer than the
 * attach timeout. A dead or restarting actor surfaces as an error completion (-EPIPE for
 * the requests it had), never a hang. So does kvringd's death, seen through the attach
 * connection (kept open while attached) within about 20 ms: every request in flight
 * completes with -EPIPE (all its blocks failed), a kvr_lookup() in progress returns
 * -EPIPE, and from then on every call returns -EPIPE at once (kvr_poll()/kvr_wait() once
 * those completions were collected): detach and attach again.
 *
 * Threading: a client is used by one thread at a time (the engine's worker thread).
 *
 * Fences — when the engine's KV memory is its own again. kvring's loader and storer read
 * and write the worker's KV memory (the memfd or the GPU allocations it shared at attach)
 * from their own processes. The engine's half of the contract: it does not write a block
 * it passed to kvr_store(), nor read or hand to another request a block it passed to
 * kvr_load(), until kvring says the operation is over, which is exactly:
 *
 *   - its completion was returned by kvr_poll()/kvr_wait() — success, failure or
 *     -ECANCELED alike; the -EPIPE completions that follow an actor's or kvringd's death
 *     come only once that actor's process has exited (kvringd's death: up to 5 s);
 *   - or kvr_detach() returned 0 (every operation of this worker is over).
 *
 * kvring's half: after that point nothing of the operation reads or writes the memory
 * (on CUDA the copies' events completed), and a store whose copy was not whole by then —
 * cancelled, its worker detached or died — is never committed: no other worker is ever
 * served bytes the engine wrote after it let the memory go. A worker killed while another
 * process keeps its memory mapped: its stores are not committed once its process exited
 * (the storer checks a pidfd of it before each copy chunk and before the commit); its
 * loader stops before the next chunk, so that process waits for kvringd to free the
 * worker's slot (kvring-inspect) before reusing the memory.
 *
 * A failed load leaves the failed blocks undefined (they may be partly written: a loader
 * killed mid-copy, a cancel between two chunks): the engine recomputes them. Blocks not
 * listed failed hold exactly the stored bytes; blocks not in the request are never written.
 */

struct kvr_client;
struct kvr_geometry; /* <kvring/kvr_geometry.h>: layout, validation */
struct kvr_lookup_result; /* below */

/*
 * CUDA KV memory (docs/cuda.md). The geometry's region offsets index one KV offset space;
 * on a GPU that space is made of ranges, each a piece of one CUDA allocation exported with
 * cudaIpcGetMemHandle (torch: storage._share_cuda_() gives the handle and the offset).
 * kvr_attach puts them in a sealed KV descriptor the loader and storer open with
 * cudaIpcOpenMemHandle; libkvring itself does not link CUDA.
 */
struct kvr_cuda_kv_range {
	uint8_t ipc_handle[64]; /* cudaIpcMemHandle_t of the allocation (of its base address) */
	uint64_t alloc_offset;  /* the range's first byte, from the allocation's base */
	uint64_t kv_offset;     /* where the range lies in the KV offset space */
	uint64_t bytes;         /* > 0 */
};

struct kvr_cuda_kv {
	uint8_t device_uuid[16];                 /* cudaDeviceProp.uuid of the GPU holding the KV */
	uint32_t n_ranges;                       /* 1..4096, sorted by kv_offset, not overlapping */
	const struct kvr_cuda_kv_range *ranges;
};

struct kvr_attach_opts {
	const char *socket;                  /* kvringd socket; NULL = default */
	const struct kvr_geometry *geometry; /* this rank's KV layout */
	int kv_fd;                           /* host backend: memfd holding the KV memory, open
					      * read-write, created with MFD_ALLOW_SEALING (not
					      * MFD_HUGETLB): kvringd seals it against shrinking at
					      * attach so a truncation cannot fault an actor, and
					      * refuses anything else, naming why (kvr_last_error) */
	uint64_t kv_bytes;                   /* its size */
	int64_t timeout_ms;                  /* per-call ceiling; 0 = 10000 */
	const struct kvr_cuda_kv *cuda_kv;   /* NULL: host KV memory (kv_fd). Else the KV memory is
					      * GPU memory: kv_fd is ignored, kv_bytes is the size of
					      * the KV offset space the ranges and geometry index */
	const char *engine_id;               /* the engine this worker belongs to: one worker per
					      * (engine, TP rank, DCP rank); NULL = "default".
					      * 1..KVR_ENGINE_ID_MAX-1 bytes of [A-Za-z0-9._:-] */
	const char *model_ns;                /* model namespace: engines with equal model_ns (and
					      * the instance's geometry) share blocks, others share
					      * none; NULL = the instance's model.model_id.
					      * 1..KVR_MODEL_NS_MAX-1 printable bytes */
};

#define KVR_ENGINE_ID_MAX 48
#define KVR_MODEL_NS_MAX 64

int kvr_attach(const struct kvr_attach_opts *opts, struct kvr_client **ret_client);

/*
 * Detach and free c (NULL: nothing). A worker's detach is fenced: it returns once kvringd
 * reports that this worker's loader, storer and DCP gather actor have exited, so nothing
 * of any load or store can still read or write its KV memory — stores not yet committed
 * never will be, loads still copying stopped. Idle: a few milliseconds; mid-copy: within
 * one copy chunk plus the actors' exit. 0, or (c is freed either way; the reason in
 * kvr_last_error(NULL)): -ETIMEDOUT kvringd did not confirm within the attach timeout
 * (an actor that does not stop: kvringd kills it 5 s after asking; the memory may be
 * touched until then), -EPIPE/-ECONNRESET kvringd gone and its actors did not exit in
 * time. A scheduler client detaches at once (it has no memory to fence).
 */
int kvr_detach(struct kvr_client *c);

/* The reason for the last error on c (never NULL; "" when none). With c NULL: why the
 * last kvr_attach() of the calling thread failed (it leaves no client to ask). */
const char *kvr_last_error(const struct kvr_client *c);

/* Worker slot and TP lane assigned at attach. */
unsigned kvr_worker_slot(const struct kvr_client *c);

/* Tokens per block of the instance (every lookup, lease and store counts whole blocks). */
unsigned kvr_block_tokens(const struct kvr_client *c);

/*
 * Scheduler clients (an engine's scheduler, e.g. vLLM's): attach without KV memory and
 * without a worker slot, only to look prefixes up and lease what they found for the
 * engine's workers. One scheduler slot each (instance.max_schedulers).
 *
 *   kvr_attach_scheduler()  engine_id + model_ns as for a worker (same namespace rules);
 *   kvr_lease()             lookup that pins the matched blocks, every lane, under
 *                           (engine, lease_id) until released (below);
 *   kvr_lease_release()     the request finished (or will not load): drop the lease.
 *
 * A worker of the same engine loads a lease with kvr_lease_take() + kvr_load(): exactly the
 * leased blocks, which cannot be evicted meanwhile. A lease ends when `loaders` workers
 * reported their load complete (libkvring does that when kvr_poll() returns the load's
 * completion), when the scheduler releases it, or when its ttl passes (the blocks become
 * evictable again; a later kvr_lease_take() gets -ENOENT). kvring-inspect counts them.
 */
struct kvr_sched_opts {
	const char *socket;    /* NULL = default */
	const char *engine_id; /* NULL = "default" */
	const char *model_ns;  /* NULL = the instance's model.model_id */
	int64_t timeout_ms;    /* per-call ceiling; 0 = 10000 */
};

int kvr_attach_scheduler(const struct kvr_sched_opts *opts, struct kvr_client **ret_client);

struct kvr_lease_opts {
	uint32_t loaders;      /* workers that will load it (e.g. TP ranks); 0 = the model's tp_size */
	uint32_t ttl_ms;       /* lease ends this long after it was granted; 0 = 30000 */
};

/*
 * Look tokens up and lease the longest visible prefix (blocks on L2 are promoted to L1
 * first, as for kvr_lookup) under lease_id, replacing an earlier lease of that id. ret:
 * matched_tokens/_blocks/l2_blocks and timings as for kvr_lookup (index_ns is the lookup
 * actor's work); pending_blocks: how many blocks right after the match a store (of any
 * engine of this namespace) is writing now — ask again shortly instead of recomputing them
 * (prefill/decode on one node, docs/engines.md). A lease of 0 blocks is not kept. -EINVAL bad arguments or a worker client,
 * -ENOSPC the lease table is full (lookup.max_leases; the prefix is not leased and
 * matched is 0), -ETIMEDOUT, -EPIPE.
 */
int kvr_lease(struct kvr_client *c, uint64_t lease_id, const uint32_t *tokens, size_t n_tokens, const void *extra,
	      size_t extra_len, const struct kvr_lease_opts *opts, struct kvr_lookup_result *ret);

/* Drop lease_id (no reply; a lease already gone is fine). Waits for room in a full request
 * ring up to the client's timeout. 0, -EINVAL on a worker client, -ETIMEDOUT (the lease
 * then ends by its ttl), -EPIPE. */
int kvr_lease_release(struct kvr_client *c, uint64_t lease_id);

/*
 * Worker side: fetch this rank's slots of lease_id (granted to a scheduler of this
 * worker's engine) for a following kvr_load(c, lease_id, ...), as kvr_lookup would have
 * remembered them. ret->matched_blocks: the leased blocks. -ENOENT no such lease (it ended,
 * or the lookup actor restarted: recompute), -EINVAL on a scheduler client.
 */
int kvr_lease_take(struct kvr_client *c, uint64_t lease_id, struct kvr_lookup_result *ret);

/*
 * Tokens among the first n_tokens of a sequence that this rank holds. Without DCP that is
 * n_tokens; a DCP rank (dcp_size D, interleave I) holds the tokens t with (t / I) mod D ==
 * its dcp_rank, so one canonical block of block_tokens tokens is block_tokens / D tokens
 * in the rank's engine block. Size a rank's KV allocations with this, not with the
 * global count (seed 003). Keys, lookups and the block lists of kvr_load()/kvr_store()
 * stay global: one engine block id per canonical block.
 */
size_t kvr_rank_tokens(const struct kvr_client *c, size_t n_tokens);

/*
 * Why a lease matched no further (struct kvr_lookup_result.miss_reason): the diagnosis of
 * the first block after the match. Stable numbers (they are in /metrics as names and in
 * the Python binding). A reason is what the lookup actor saw, never a promise:
 *   NONE          every block asked for matched;
 *   NEVER_STORED  no trace of the block: never stored under this namespace (or under
 *                 another model/weights/geometry, whose keys differ), or it left so long
 *                 ago that kvring forgot;
 *   EVICTED       it was in L1 and was evicted, and is not on L2 (or its L2 file was
 *                 evicted/deleted too);
 *   IN_FLIGHT     a store is writing it right now (ask again shortly: pending_blocks);
 *   QUORUM        some TP ranks stored their lane, not every rank (the commit quorum is
 *                 incomplete: a rank failed or has not stored yet);
 *   L2_FAILED     it is on L2, but reading it back failed (a damaged or vanished file, an
 *                 I/O error, no answer in time, the disk actor's ring full too long);
 *   NO_ROOM       it is on L2, but no L1 slot could be freed for its promotion (every
 *                 block pinned or written back not yet).
 */
enum kvr_miss_reason {
	KVR_MISS_NONE = 0,
	KVR_MISS_NEVER_STORED = 1,
	KVR_MISS_EVICTED = 2,
	KVR_MISS_IN_FLIGHT = 3,
	KVR_MISS_QUORUM = 4,
	KVR_MISS_L2_FAILED = 5,
	KVR_MISS_NO_ROOM = 6,
	KVR_MISS_REASONS = 7,
};

static inline const char *kvr_miss_reason_name(unsigned r)
{
	static const char *const names[KVR_MISS_REASONS] = {"none",   "never_stored", "evicted",  "in_flight",
							     "quorum", "l2_failed",    "no_room"};
	return r < KVR_MISS_REASONS ? names[r] : "unknown";
}

struct kvr_lookup_result {
	uint32_t matched_tokens;  /* leading tokens whose blocks are stored on every rank */
	uint32_t matched_blocks;
	uint32_t l2_blocks;       /* of those, blocks read from the disk tier (L2) into L1 for this lookup */
	uint64_t hash_ns;         /* client-side key hashing */
	uint64_t index_ns;        /* lookup actor's index work */
	uint64_t roundtrip_ns;    /* request + reply through the rings */
	uint32_t pending_blocks;  /* kvr_lease only: blocks right after the match that a store is
				   * writing now (they become visible when it commits); 0 otherwise */
	uint32_t miss_reason;     /* kvr_lease only: enum kvr_miss_reason of the first block not
				   * matched (KVR_MISS_NONE when all were) */
};

/*
 * Synchronous lookup of a prompt: computes the chained block keys from tokens (+ extra
 * key bytes, e.g. a LoRA id) and asks the lookup actor for the longest visible prefix.
 * Remembers the matched slots under req_id for a following kvr_load(). Only whole blocks
 * count. -EINVAL bad arguments, -ETIMEDOUT, -EPIPE lookup actor restarted.
 */
int kvr_lookup(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens, const void *extra,
	       size_t extra_len, struct kvr_lookup_result *ret);

/*
 * Load the first n_blocks matched blocks of req_id's last lookup into the engine's
 * blocks block_ids[0..n). Asynchronous: completes through kvr_poll(). n_blocks must not
 * exceed the matched blocks (-ERANGE); every block id must be < num_blocks (-ERANGE).
 */
int kvr_load(struct kvr_client *c, uint64_t req_id, const uint32_t *block_ids, size_t n_blocks);

/*
 * kvr_load, ordered by layer: the loader copies layer 0 of every block, then layer 1, ...,
 * and says after each layer how many are in place, so the engine's forward pass can start
 * on the first layers while later ones still copy (kvr_wait_layers). The completion is
 * still the load's one result, as for kvr_load: a load that fails at any layer fails every
 * block, and the engine recomputes them. Where the geometry has nothing to order by (a DCP
 * rank, a cross-layer layout), and beyond 64 layered loads in flight on this client, it is
 * a plain kvr_load whose layers are all in place at its completion.
 */
int kvr_load_layered(struct kvr_client *c, uint64_t req_id, const uint32_t *block_ids, size_t n_blocks);

/*
 * Wait until layers 0..n_layers-1 of every load in flight on this client are in place in
 * the KV memory: a layered load's as its loader says, a plain load's (kvr_load) once it
 * completed. A completed load counts as in place here whether it succeeded or not: its
 * completion, from kvr_poll()/kvr_wait(), says which. Returns 0,
 * -ETIMEDOUT (kvr_last_error names the layers), -EINTR, -EINVAL on a scheduler client.
 */
int kvr_wait_layers(struct kvr_client *c, uint32_t n_layers, int64_t timeout_ms);

/*
 * Store the full blocks of tokens[0..n_tokens) from the engine's blocks block_ids (one per
 * full block). Blocks already stored on this rank's lane are not copied again. With
 * require_full, n_tokens must be a multiple of block_tokens (-EINVAL).
 */
int kvr_store(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens, const void *extra,
	      size_t extra_len, const uint32_t *block_ids, size_t n_blocks);

/*
 * kvr_store for CUDA KV memory that a GPU stream may still be writing: the storer's copy
 * waits (on the GPU) for ipc_event, a cudaIpcEventHandle_t (64 bytes) of an event created
 * with cudaEventInterprocess | cudaEventDisableTiming and recorded after the KV was
 * written; NULL = no wait (the caller synchronised). Each call carries its own event, so
 * several stores under one request id are independent. CUDA allows no use of an imported
 * event once its exporter destroyed it: keep the event until this store's completion is
 * polled. -EINVAL on a client attached without cuda_kv; -EBUSY when 1024 stores with
 * events are in flight. Otherwise as kvr_store.
 */
int kvr_store_cuda(struct kvr_client *c, uint64_t req_id, const uint32_t *tokens, size_t n_tokens, const void *extra,
		   size_t extra_len, const uint32_t *block_ids, size_t n_blocks, const void *ipc_event);

enum kvr_op { KVR_OP_LOAD_DONE = 1, KVR_OP_STORE_DONE = 2 };

struct kvr_load_diag {
	uint64_t bytes;
	uint32_t copies;
	uint32_t runs;
	uint64_t queue_ns;   /* time the request waited in the loader before its first copy */
	uint64_t copy_ns;
	uint32_t l1_hits;    /* blocks served from L1 */
	uint32_t l2_reads;   /* blocks read from L2 first */
	uint64_t total_ns;   /* submit to completion, measured by the client */
};

struct kvr_completion {
	uint64_t req_id;
	uint32_t op;              /* enum kvr_op */
	int32_t status;           /* 0, or -errno (-EIO: some blocks failed, listed below) */
	uint32_t n_blocks;
	uint32_t n_failed;
	const uint32_t *failed;   /* engine block ids not restored / not stored; valid until the next poll */
	uint32_t n_stored;        /* store: newly stored blocks */
	uint32_t n_present;       /* store: blocks that were already stored */
	struct kvr_load_diag diag;
};

/* Collect up to max completions without blocking; returns how many (0..max) or -errno
 * (-EPIPE: kvringd is gone and every completion was collected). */
int kvr_poll(struct kvr_client *c, struct kvr_completion *ret, unsigned max);
/* As kvr_poll, waiting up to timeout_ms for at least one (0 = return at once). */
int kvr_wait(struct kvr_client *c, struct kvr_completion *ret, unsigned max, int64_t timeout_ms);

/* Requests submitted and not yet completed. */
unsigned kvr_inflight(const struct kvr_client *c);

/*
 * Cancel every load and store of req_id in flight on this worker client. Asynchronous: each
 * completes through kvr_poll() as usual, and that completion is the fence — from then on
 * nothing of it touches the KV memory. A cancelled load stops before its next copy chunk
 * (status -ECANCELED, every block listed failed: those already written are undefined, the
 * engine recomputes them); a cancelled store stops before its next chunk or its commit and
 * commits nothing (-ECANCELED, every block failed). One that finished first completes with
 * its own result. Returns how many requests were in flight under req_id (0: none: there is
 * nothing to wait for), -EBUSY when 64 cancels are outstanding (collect completions and
 * call again), -EINVAL on a scheduler client.
 */
int kvr_cancel(struct kvr_client *c, uint64_t req_id);

#ifdef __cplusplus
}
#endif
#endif
