/* stage_common: what the loader and storer stages share — the worker's geometry, its KV memory, chunked copies. */
#ifndef KVR_STAGE_COMMON_H
#define KVR_STAGE_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr_actor.h"
#include "kvr_geometry.h"
#include "kvr_slots.h"
#include "kvr_cuda.h"
#include "kvr_xfer.h"

/* A reply ring that stays full this long means the client stopped reading: the reply is
 * dropped and logged (the client's own timeout has long fired by then). */
#define STAGE_REPLY_TIMEOUT_NS (5ull * 1000000000ull)


struct stage_worker {
	struct kvr_actor *a;
	unsigned worker;              /* worker slot served */
	unsigned lane;                /* its TP lane */
	struct kvr_geometry geom;     /* as it attached */
	struct kvr_slot_table *slots;
	struct kvr_xfer *xfer;
	struct kvr_xfer_region *regions;
	struct kvr_xfer_layout layout;
	struct kvr_xfer_run *runs;
	size_t cap_runs;
	uint32_t chunk_blocks;        /* blocks per staging lease */
	uint32_t pool_leases;         /* leases in this direction's pool */
	struct kvr_ring *req, *rep;
	bool cuda;                    /* the worker's KV memory is GPU memory (CUDA IPC) */
	struct kvr_cuda_events events;/* CUDA: the producer events of its stores */
};

/* Set up for the worker this actor serves (its actor index's worker slot): read its
 * geometry from the control segment, open the transfer backend on its KV memory, size the
 * staging pool from staging.ceiling_bytes * pool_percent / 100 (at least one lease), and
 * find the request/reply rings (printf patterns taking the worker slot). */
int stage_worker_open(struct kvr_actor *a, struct stage_worker *sw, const char *req_fmt, const char *rep_fmt,
		      unsigned pool_percent);
void stage_worker_close(struct stage_worker *sw);

/* Copy n blocks between the worker's blocks and the slots at slot_offs, one staging lease
 * (chunk_blocks blocks) at a time, waiting for each lease's copies to complete before
 * reusing it. Every copy waits for `ready` first (NULL: nothing to wait for; CUDA stores:
 * the producer's event, of which each submission takes its own reference). Sums the stats
 * into *st. 0 or -errno (nothing more is copied after one). */
int stage_copy_chunks(struct stage_worker *sw, uint32_t dir, const uint32_t *blocks, const uint64_t *slot_offs,
		      uint32_t n, const struct kvr_xfer_dep *ready, struct kvr_xfer_stats *st);

/* Answer a request: the result message `type` (body of body_len bytes) followed, when
 * n_failed > 0, by the failed engine block ids as KVR_MSG_BLOCKS. Counts the request and its
 * failed blocks, records its latency (first_ns = arrival of its first message) in the
 * stage's histogram (exported as kvring_load/store_duration_seconds), and drops the reply
 * with one log line when the client has not read its ring for STAGE_REPLY_TIMEOUT_NS. */
void stage_reply(struct stage_worker *sw, unsigned type, uint64_t wire, int status, const void *body,
		 size_t body_len, const uint32_t *failed, uint32_t n_failed, uint64_t first_ns);

/* Whether a wire request id was addressed to this incarnation of the actor. */
bool stage_wire_current(const struct kvr_actor *a, uint64_t wire);

#endif
