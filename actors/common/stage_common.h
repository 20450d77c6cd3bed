/* stage_common: what the loader, storer and gather stages share — the worker's geometry, its KV memory, chunked copies. */
#ifndef KVR_STAGE_COMMON_H
#define KVR_STAGE_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr_actor.h"
#include "kvr_geometry.h"
#include "kvr_slots.h"
#include "kvr_cuda.h"
#include "kvr_dcp.h"
#include "kvr_list.h"
#include "kvr_outbox.h"
#include "kvr_xfer.h"

struct stage_worker {
	struct kvr_actor *a;
	unsigned worker;              /* worker slot served */
	unsigned lane;                /* the lane it loads and stores (TP lane; DCP: its group's) */
	struct kvr_geometry geom;     /* as it attached */
	struct kvr_slot_table *slots;
	struct kvr_xfer *xfer;
	struct kvr_xfer_region *regions;
	struct kvr_xfer_layout layout;
	struct kvr_xfer_run *runs;
	size_t cap_runs;
	bool dcp;                     /* a DCP rank: copies its shard to / from a canonical lane */
	struct kvr_dcp_run *dcp_runs; /* DCP: one block's runs */
	size_t cap_dcp;
	uint32_t *sorted;             /* DCP: a load chunk's block ids, to refuse duplicates */
	uint64_t *group_offs;         /* layered copies: a chunk's slot offsets of its layer group */
	size_t cap_group_offs;
	uint64_t rank_lane_bytes;     /* what one block of this rank moves */
	uint32_t chunk_blocks;        /* blocks per staging lease */
	uint32_t pool_leases;         /* leases in this direction's pool */
	struct kvr_ring *req, *rep;
	struct kvr_outbox out;        /* replies on rep: queued while the client's ring is full */
	bool out_open;
	bool cuda;                    /* the worker's KV memory is GPU memory (CUDA IPC) */
	struct kvr_cuda_events events;/* CUDA: the producer events of its stores */
	/* the fence (stage_fence): the worker as it was when this stage opened */
	uint32_t fence_gen;           /* its slot's attach generation */
	bool fence_attached;          /* its slot was ATTACHED (a stepped test's may be FREE) */
	int pidfd;                    /* the worker process (pidfd_open), -1: not watched */
	bool worker_dead;             /* its pidfd said it exited (sticky) */
	uint64_t fence_polled_ns;     /* when the pidfd was last polled */
};

/* Set up for worker slot `worker` whose KV memory is kv_fd (kv_bytes): read its geometry
 * from the control segment, open the transfer backend on its KV memory, size the staging
 * pool from staging.ceiling_bytes * pool_percent / 100 (at least one lease), and find the
 * request/reply rings (printf patterns taking the worker slot). */
int stage_worker_open(struct kvr_actor *a, struct stage_worker *sw, unsigned worker, int kv_fd, uint64_t kv_bytes,
		      const char *req_fmt, const char *rep_fmt, unsigned pool_percent);

/* Have the loop populate what sw copies between (kvr_actor_populate_add): its worker's KV
 * memory where it is mapped here (host backend; kv_write: the stage writes it, a loader)
 * and, with `arena`, the arena (arena_write: a storer), as far as kvringd faulted it in
 * (kvr_actor_populate_waiting). Best effort: logged, never fatal. */
void stage_populate(struct stage_worker *sw, bool arena, bool arena_write, bool kv_write);
void stage_worker_close(struct stage_worker *sw);

/*
 * The fence (docs/api.md, "Fences"): may a copy for request `wire` of sw's worker go on,
 * or a store of it be committed? Checked before every copy chunk and before a COMMIT. A
 * copy stops, and a store is not committed, once
 *
 *   -ECANCELED   its client cancelled it (kvr_cancel: the wire id is in the cancel table of
 *                the worker's area; wire 0 checks only the two below);
 *   -ESHUTDOWN   the worker detached (its slot left ATTACHED, or was attached again);
 *   -EOWNERDEAD  the worker process exited (its pidfd is readable): memory it shared with
 *                another process may already hold other data.
 *
 * 0: go on. The cancel table and the slot are read every call (a few dozen loads); the
 * pidfd is polled (a syscall) when `exact`, else at most every STAGE_FENCE_POLL_NS — so a
 * copy of many small chunks does not pay a syscall per chunk. A store's commit check is
 * exact: a store is never committed once its worker's exit can be seen.
 */
#define STAGE_FENCE_POLL_NS 1000000ull
int stage_fence(struct stage_worker *sw, uint64_t wire, bool exact);

/*
 * A chunked copy in flight: n blocks between the workers' blocks and the slots at
 * slot_offs for n_ranks ranks at once (a loader or storer: 1; a DCP group's store: every
 * rank, blocks[r] being rank r's engine block ids of the same slots), one staging lease
 * (chunk_blocks blocks) per chunk, up to the pool's leases (depth) of chunks in flight.
 * Every rank's copies of a chunk are submitted before any is reaped, so the ranks' copies
 * overlap (on CUDA: each rank's GPU over its own link). Rank r's copies wait for ready[r]
 * first (ready NULL or ready[r] NULL: nothing to wait for; CUDA stores: the producer's
 * event, of which each submission takes its own reference). Rank r's stats are added into
 * c->st[r]. Before each chunk every rank's fence is checked for request wire[r] (stage_fence,
 * not exact; wire NULL: not checked): a fenced copy issues nothing more and, once what it
 * issued is reaped, ends with the fence's error.
 *
 * It never blocks unless asked: a stage submits chunks with stage_copy_submit as its pass
 * allows and reaps them with stage_copy_reap(c, false) (kvr_xfer_poll; on CUDA the copies'
 * events are queried, never synchronized) — the loader runs several loads per worker so.
 * The host backend completes a chunk inside its submit. The copy is over when
 * stage_copy_over(): then nothing of it can still touch the worker's memory, and c->rc is
 * 0 or the first -errno (nothing more was copied after it). Everything the copy points at
 * must stay put until then.
 */
struct stage_copy {
	unsigned n_ranks;
	uint32_t dir;
	uint32_t n;
	const uint64_t *slot_offs;
	struct stage_worker *sw[KVR_ACTOR_MAX_KV];
	const uint32_t *blocks[KVR_ACTOR_MAX_KV];
	const struct kvr_xfer_dep *ready[KVR_ACTOR_MAX_KV];
	uint64_t wire[KVR_ACTOR_MAX_KV];
	bool fence;              /* wire given: the fence is checked */
	struct kvr_xfer_stats st[KVR_ACTOR_MAX_KV]; /* rank r's, summed over its chunks */
	uint32_t chunk, depth;   /* blocks per chunk; chunks in flight at most */
	uint32_t done;           /* blocks of the current layer group submitted */
	uint32_t groups;         /* layer groups copied one after another (stage_copy_layered); 1: all at once */
	uint32_t group;          /* the group being submitted */
	uint32_t groups_done;    /* groups whose every chunk was reaped without an error */
	uint32_t head, inflight; /* the chunks in flight: tickets[head..head+inflight) mod depth */
	int rc;
	uint32_t ends_group[KVR_XFER_MAX_INFLIGHT]; /* a chunk in flight that ends group g: g + 1, else 0 */
	uint64_t tickets[KVR_XFER_MAX_INFLIGHT][KVR_ACTOR_MAX_KV];
};

/* Set c up (nothing is submitted yet): the arrays of pointers are copied into c (c may
 * move; what they point at may not), the stats start at zero (c->st). 0 or -EINVAL
 * (n_ranks out of range). */
int stage_copy_start(struct stage_copy *c, struct stage_worker *const *sw, unsigned n_ranks, uint32_t dir,
		     const uint32_t *const *blocks, const uint64_t *slot_offs, uint32_t n,
		     const struct kvr_xfer_dep *const *ready, const uint64_t *wire);
/*
 * Layer-ordered copy (a layered load, kvr_load_layered): copy layer group 0 of every block,
 * then group 1, ..., each chunk one group of up to chunk * groups blocks (the bytes of one
 * lease); c->groups_done says how many groups are in place. A group is layer l of a
 * layer-major geometry (its regions l * per_layer .. (l + 1) * per_layer - 1). Call right
 * after stage_copy_start; returns the groups (the geometry's layers), or 1 where the copy
 * cannot be ordered by layer (one rank of a layer-major geometry with whole pages only: not
 * a DCP rank, not a cross-layer layout) and stays one group.
 */
uint32_t stage_copy_layered(struct stage_copy *c);
/* Whether another chunk may be submitted now (no error, blocks left, a lease free). */
bool stage_copy_can_submit(const struct stage_copy *c);
/* Check the fence and submit the next chunk for every rank. true when a chunk went in
 * flight (a failed one too: it is reaped like the others), false when none could. */
bool stage_copy_submit(struct stage_copy *c);
/* Reap the oldest chunk in flight: 1 reaped, 0 none in flight, -EAGAIN still copying
 * (wait: block until it is done instead). A failed copy sets c->rc. */
int stage_copy_reap(struct stage_copy *c, bool wait);
/* A stage whose copies are in flight (CUDA) and that has nothing else to do polls them
 * this often (kvr_actor_poll_within): their completion wakes nobody. */
#define STAGE_COPY_POLL_NS 20000ull

static inline bool stage_copy_over(const struct stage_copy *c)
{
	return !c->inflight && (c->rc || (c->done == c->n && c->group + 1 >= c->groups));
}

/* Answer a request: the result message `type` (body of body_len bytes) followed, when
 * n_failed > 0, by the failed engine block ids as KVR_MSG_BLOCKS. Counts the request and its
 * failed blocks, records its latency (first_ns = arrival of its first message) in the
 * stage's histogram (exported as kvring_load/store_duration_seconds). Never waits: a reply
 * that finds the client's ring full is queued in sw->out (kvr_outbox.h), in order, and sent
 * by stage_worker_pass as room appears. */
void stage_reply(struct stage_worker *sw, unsigned type, uint64_t wire, int status, const void *body,
		 size_t body_len, const uint32_t *failed, uint32_t n_failed, uint64_t first_ns);

/* Flush sw's queued replies (call it from the stage's on_pass). Replies the client has not
 * taken for timeouts.reply_ms are dropped and logged once (its own timeout fired long
 * before). Returns enum kvr_pass: WAITING while replies wait for room. */
int stage_worker_pass(struct stage_worker *sw, uint64_t now);

/* Whether a wire request id was addressed to this incarnation of the actor. */
bool stage_wire_current(const struct kvr_actor *a, uint64_t wire);

#endif
