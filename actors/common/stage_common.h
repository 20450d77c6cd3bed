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

/* A reply ring that stays full this long means the client stopped reading: the reply is
 * dropped and logged (the client's own timeout has long fired by then). */


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
	uint64_t rank_lane_bytes;     /* what one block of this rank moves */
	uint32_t chunk_blocks;        /* blocks per staging lease */
	uint32_t pool_leases;         /* leases in this direction's pool */
	struct kvr_ring *req, *rep;
	bool cuda;                    /* the worker's KV memory is GPU memory (CUDA IPC) */
	struct kvr_cuda_events events;/* CUDA: the producer events of its stores */
};

/* Set up for worker slot `worker` whose KV memory is kv_fd (kv_bytes): read its geometry
 * from the control segment, open the transfer backend on its KV memory, size the staging
 * pool from staging.ceiling_bytes * pool_percent / 100 (at least one lease), and find the
 * request/reply rings (printf patterns taking the worker slot). */
int stage_worker_open(struct kvr_actor *a, struct stage_worker *sw, unsigned worker, int kv_fd, uint64_t kv_bytes,
		      const char *req_fmt, const char *rep_fmt, unsigned pool_percent);
void stage_worker_close(struct stage_worker *sw);

/* Copy n blocks between the workers' blocks and the slots at slot_offs for n_ranks ranks
 * at once (a storer or loader: 1; a DCP group's store: every rank, blocks[r] being rank
 * r's engine block ids of the same slots), one staging lease (chunk_blocks blocks) at a
 * time, every rank's copies of a chunk submitted before any is waited for, each lease
 * waited for before it is reused. Rank r's copies wait for ready[r] first (ready NULL or
 * ready[r] NULL: nothing to wait for; CUDA stores: the producer's event, of which each
 * submission takes its own reference). Adds rank r's stats into st[r]. 0 or -errno
 * (nothing more is copied after one). */
int stage_copy_chunks(struct stage_worker *const *sw, unsigned n_ranks, uint32_t dir, const uint32_t *const *blocks,
		      const uint64_t *slot_offs, uint32_t n, const struct kvr_xfer_dep *const *ready,
		      struct kvr_xfer_stats *st);

/* Answer a request: the result message `type` (body of body_len bytes) followed, when
 * n_failed > 0, by the failed engine block ids as KVR_MSG_BLOCKS. Counts the request and its
 * failed blocks, records its latency (first_ns = arrival of its first message) in the
 * stage's histogram (exported as kvring_load/store_duration_seconds), and drops the reply
 * with one log line when the client has not read its ring for timeouts.reply_ms. */
void stage_reply(struct stage_worker *sw, unsigned type, uint64_t wire, int status, const void *body,
		 size_t body_len, const uint32_t *failed, uint32_t n_failed, uint64_t first_ns);

/* Whether a wire request id was addressed to this incarnation of the actor. */
bool stage_wire_current(const struct kvr_actor *a, uint64_t wire);

/* ---- the load path (stage_paths.c): LOAD -> pin, copy slots to KV, unpin -> LOAD_DONE ---- */

struct stage_load {
	struct kvr_list_asm req;
	uint32_t *blocks;          /* engine block ids to copy */
	uint64_t *slot_offs;       /* their slots' arena offsets */
	uint32_t *slots;           /* pinned slot indices */
	uint32_t *failed;          /* block ids not restored */
	uint32_t cap;
};

void stage_load_init(struct stage_load *ld);
void stage_load_fini(struct stage_load *ld);
/* Drop every pin of sw's worker (a previous incarnation died holding them: its loads were
 * failed by the client when it saw the restart). Returns how many. */
unsigned stage_drop_pins(struct stage_worker *sw);
/* Feed one message of sw->req; a complete LOAD is executed and answered on sw->rep.
 * 0, or -EBADMSG (the runtime counts it). */
int stage_load_feed(struct stage_worker *sw, struct stage_load *ld, const struct kvr_msg *m);

/* ---- the store path: ALLOC -> copy every rank's shard -> COMMIT -> STORE_DONE ---------- */

/* One rank's STORE: blocks the engine reported final, keys in producer order. */
struct stage_store_req {
	uint64_t wire;
	uint8_t flags;                          /* KVR_STOREF_* */
	uint64_t first_ns;                      /* arrival of its first message */
	uint32_t n;
	const struct kvr_msg_store_item *items; /* key + engine block id */
};

struct stage_store {
	struct kvr_actor *a;
	struct kvr_ring *commit_req, *commit_rep; /* to / from the lookup actor */
	unsigned owner;                           /* worker slot whose commit rings these are */
	unsigned lane;
	uint64_t next_id;
	struct kvr_list_asm alloc_rep;
	struct kvr_msg_key *keys;
	struct kvr_msg_slot *written;             /* slots copied, to commit */
	uint32_t *pos;                            /* their positions in the request */
	uint64_t *slot_offs;
	uint32_t *blocks;                         /* per rank (cap apart): block ids of the copied positions */
	uint32_t *fail_pos;                       /* positions not stored */
	uint32_t *failed;                         /* one rank's block ids of those */
	uint32_t cap;
	uint64_t run_ns;                          /* when the store being run began (0: none) */
	uint64_t refused_ro;                      /* stores refused under l2.read_only (logged once) */
};

/* Talk to the lookup actor over worker `owner`'s commit rings for `lane`; sends RESET
 * (aborts slots a previous incarnation left WRITING). 0 or -errno. */
int stage_store_open(struct stage_store *ss, struct kvr_actor *a, unsigned owner, unsigned lane);
void stage_store_close(struct stage_store *ss);

/*
 * Store one block list from n_ranks ranks: rank r's request rq[r] is served by sw[r]. The
 * requests list the same keys in the same order (a storer: n_ranks 1; a DCP group: every
 * rank's shard of each block). Allocates one slot per key on ss->lane (suffix-only:
 * PRESENT keys are not copied), copies every rank's shard of each allocated block into
 * it, commits, and answers each rank on its own ring with the same counts and its own
 * failed block ids. Any rank's copy failing fails the whole request for every rank and
 * aborts the slots: a block is never committed with a missing shard. An instance with
 * l2.read_only answers every store -EROFS, every block failed.
 */
void stage_store_run(struct stage_store *ss, struct stage_worker *const *sw, const struct stage_store_req *rq,
		     unsigned n_ranks);

/* Answer one rank's request with `status`, every block failed, nothing stored. */
void stage_store_fail(struct stage_store *ss, struct stage_worker *sw, const struct stage_store_req *rq, int status);

/* ---- the pipelined store path (the storer): several stores of one worker in flight ------ */

/*
 * stage_store_run() above serves one store at a time and waits for the lookup actor; the
 * gather actor keeps it (a DCP group's store needs every rank's request first). The storer
 * runs its stores through a pipe instead: each STORE is a job,
 *
 *   QUEUED -> ALLOC sent -> slots known -> copied -> COMMIT sent -> done -> answered
 *
 * driven by the actor loop, no handler waiting for the lookup actor. At most `depth` jobs
 * are in the pipe's window (the store pool's leases, at most STAGE_STORE_DEPTH_MAX); at
 * most one ALLOC is outstanding (the lookup actor assembles one ALLOC per worker), and the
 * next job's ALLOC goes out as soon as the previous ALLOC_REP arrived, so the lookup
 * actor's allocation of job k+1 overlaps the copy of job k. COMMITs go out and STORE_DONEs
 * are answered in job (producer) order. Requests to the lookup actor go through an outbox
 * (kvr_outbox.h): sending never waits for room in commit.req.
 *
 * Failures: an ALLOC or COMMIT unanswered for timeouts.lookup_call_ms fails its job
 * (-ETIMEDOUT, every block listed), a copy error fails its job with the copy's error, and
 * both RESET the lane. RESET aborts every WRITING slot of the worker, also those of the
 * other jobs that hold allocated, uncommitted slots: those jobs are failed at the same time
 * (-ECANCELED, every block listed) and never copy into their slots again — a RESET slot
 * may be handed to anyone. Jobs whose COMMIT went out before the RESET keep their answer
 * (the lookup actor takes commit.req in order). A restart of the lookup actor (its
 * generation, checked every pass and every 50 ms while a job waits for it) fails every job
 * past QUEUED with -EPIPE and RESETs. A reply to an abandoned ALLOC may name slots
 * allocated after a RESET: it asks for one more RESET, sent once no job holds uncommitted
 * slots. The lookup actor answers PRESENT for a lane another store is still writing, so a
 * job behind one that failed this way reports its PRESENT blocks failed (-EIO). Never
 * wrong bytes: at worst a block that is stored is reported failed.
 *
 * Stats: KVR_STAT_XF_STORES_INFLIGHT (gauge) counts the jobs in the window — accepted, not
 * answered, at most `depth`; stores a burst delivered after the window filled wait behind
 * it, counted in kvr_actor_set_held() (kvringd's drain waits for all) but not in the gauge —
 * and KVR_STAT_XF_STORES_INFLIGHT_MAX its high-water mark over the actor's starts.
 *
 * The lookup actor keeps one ALLOC per worker and may hold it up to timeouts.alloc_wait_ms
 * waiting for room (only with an L2 or remote tier). A new ALLOC must not reach it while it
 * holds an abandoned one (its assembler would be overwritten under the waiting allocation):
 * after abandoning an ALLOC the pipe sends no ALLOC until that ALLOC's late answer arrived,
 * or alloc_wait_ms after the answer to the RESET sent behind it (the lookup actor had it by
 * then), or lookup_call_ms at most.
 *
 * KVRING_STORE_DEPTH=N (environment of kvringd, inherited by its storers; 1..8) lowers the
 * depth: a benchmark and diagnostic knob (1 = one store at a time, as before the pipe).
 */

#define STAGE_STORE_DEPTH_MAX 8

struct stage_store_job; /* stage_paths.c */

struct stage_store_pipe {
	struct stage_store *ss;
	struct stage_worker *sw;
	struct kvr_outbox out;         /* requests waiting for room in ss->commit_req */
	struct stage_store_job *jobs;  /* FIFO: n jobs from head, in arrival order */
	unsigned head, n, cap_jobs;
	unsigned depth;                /* jobs in the window; later ones wait (a burst overshot) */
	struct kvr_msg_key *keys;      /* scratch: an ALLOC's key list */
	uint32_t cap_keys;
	uint32_t lookup_gen;           /* generation of the lookup actor the jobs talk to */
	uint64_t reset_id;             /* last RESET sent (its answer is only logged) */
	bool reset_wanted;             /* a late ALLOC_REP: RESET once no job holds slots */
	bool can_hold;                 /* the lookup actor may hold an ALLOC (an L2 or remote tier) */
	uint64_t stale_id;             /* an abandoned ALLOC it may still hold (0: none) ... */
	uint64_t stale_reset_id;       /* ... the RESET sent behind it ... */
	uint64_t stale_cap, stale_until; /* ... and until when no new ALLOC goes out */
	int timer;                     /* the earliest deadline's timer, -1 none */
	uint64_t timer_at;
	uint32_t inflight_max;         /* high-water mark of the window */
};

/* Open the pipe for sw's stores over ss (stage_store_open done). The depth is sw's store
 * pool (pool_leases) capped at STAGE_STORE_DEPTH_MAX and by KVRING_STORE_DEPTH. 0 or -ENOMEM. */
int stage_store_pipe_open(struct stage_store_pipe *p, struct stage_store *ss, struct stage_worker *sw);
/* Stopping (fini): answer every job still in the pipe -ESHUTDOWN (every block failed) and
 * free it. With stores in flight it first leaves nothing in commit.req that could allocate
 * after kvringd's WORKER_GONE: it waits (at most 4 s, below kvringd's SIGKILL) for an ALLOC
 * the lookup actor has, and sends a RESET behind everything. */
void stage_store_pipe_close(struct stage_store_pipe *p);
/* A complete STORE (rq's items are copied). Returns true when the window is full: the
 * caller holds its input until stage_store_pipe_pass() says there is room. */
bool stage_store_pipe_submit(struct stage_store_pipe *p, const struct stage_store_req *rq);
/* One message of ss->commit_rep. 0, or -EBADMSG (not a reply type of this ring). */
int stage_store_pipe_reply(struct stage_store_pipe *p, const struct kvr_msg *m);
/* Move the jobs on: send what can be sent, copy one job, answer finished jobs in order.
 * Returns KVR_PASS_* (struct kvr_stage.on_pass); *ret_room: the window has room again. */
int stage_store_pipe_pass(struct stage_store_pipe *p, uint64_t now_ns, bool *ret_room);
/* Periodic: the lookup actor's generation, overdue answers. */
void stage_store_pipe_tick(struct stage_store_pipe *p, uint64_t now_ns);
/* Jobs accepted and not answered (the window and what waits behind it). */
static inline unsigned stage_store_pipe_pending(const struct stage_store_pipe *p)
{
	return p->n;
}

#endif
