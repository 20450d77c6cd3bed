/* store_path: the store path the storer and the DCP gather actor run (ALLOC -> copy -> COMMIT -> STORE_DONE). */
#ifndef KVR_STORE_PATH_H
#define KVR_STORE_PATH_H

#include <stdbool.h>
#include <stdint.h>

#include "stage_common.h"

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
	uint32_t *failed;                         /* stage_store_fail: one rank's block ids */
	uint32_t cap;
	uint64_t refused_ro;                      /* stores refused under l2.read_only (logged once) */
};

/* Talk to the lookup actor over worker `owner`'s commit rings for `lane`; sends RESET
 * (aborts slots a previous incarnation left WRITING). 0 or -errno. */
int stage_store_open(struct stage_store *ss, struct kvr_actor *a, unsigned owner, unsigned lane);
void stage_store_close(struct stage_store *ss);

/* Answer one rank's request with `status`, every block failed, nothing stored. */
void stage_store_fail(struct stage_store *ss, struct stage_worker *sw, const struct stage_store_req *rq, int status);

/* ---- the store pipe: several stores of one worker (or one DCP group) in flight ---------- */

/*
 * The storer and the gather actor run their stores through a pipe. A job is one block
 * list from n_ranks ranks (a storer: one; a DCP group: every rank's STORE of the same keys,
 * rank r's served by sw[r]): one slot per key on ss->lane (suffix-only: PRESENT keys are
 * not copied), every rank's shard of each allocated block copied into it (a block is never
 * committed with a shard missing: any rank's copy failing fails the job for every rank),
 * one commit, and each rank answered on its own ring with the same counts and its own
 * failed block ids. An instance with l2.read_only answers every store -EROFS. Each job
 * goes
 *
 *   QUEUED -> ALLOC sent -> slots known -> copying -> copied -> COMMIT sent -> done -> answered
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
 * both RESET the lane. So does a fence (stage_fence: the store cancelled by its client, its
 * worker detached or died), checked before the ALLOC, before every copy chunk and before
 * the COMMIT: the job fails with the fence's error (-ECANCELED, -ESHUTDOWN, -EOWNERDEAD)
 * and nothing of it is committed. RESET aborts every WRITING slot of the worker, also those of the
 * other jobs that hold allocated, uncommitted slots: those jobs are failed at the same time
 * (-EAGAIN, every block listed) and never copy into their slots again — a RESET slot
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
 * waiting for room (L2 writes; or, with any tier, other stores' WRITING slots to commit).
 * With an L2 or remote tier (can_hold) a new ALLOC must not reach it while it holds an
 * abandoned one (its assembler would be overwritten under the waiting allocation):
 * after abandoning an ALLOC the pipe sends no ALLOC until that ALLOC's late answer arrived,
 * or alloc_wait_ms after the answer to the RESET sent behind it (the lookup actor had it by
 * then), or lookup_call_ms at most. Without one, the lookup actor holds an ALLOC only
 * while other stores' slots are WRITING, and a new ALLOC (seq 0) makes it answer the held
 * one first (lookup.c, on_commit_req): the late answer asks for a RESET as above.
 *
 * KVRING_STORE_DEPTH=N (environment of kvringd, inherited by its storers; 1..8) lowers the
 * depth: a benchmark and diagnostic knob (1 = one store at a time, as before the pipe).
 */

#define STAGE_STORE_DEPTH_MAX 8

struct stage_store_job; /* store_pipe.c */

struct stage_store_pipe {
	struct stage_store *ss;
	struct stage_worker *sw[KVR_ACTOR_MAX_KV]; /* rank r's worker (a storer: one) */
	unsigned n_ranks;
	struct kvr_outbox out;         /* requests waiting for room in ss->commit_req */
	struct stage_store_job **jobs; /* FIFO: n jobs from head, in arrival order (never moved) */
	unsigned head, n, cap_jobs;
	unsigned depth;                /* jobs in the window; later ones wait (a burst overshot) */
	struct kvr_msg_key *keys;      /* scratch: an ALLOC's key list */
	uint32_t cap_keys;
	uint32_t lookup_gen;           /* generation of the lookup actor the jobs talk to */
	uint64_t reset_id;             /* last RESET sent (its answer is only logged) */
	bool reset_wanted;             /* a late ALLOC_REP: RESET once no job holds slots */
	bool held;                     /* a copy waits for the test hold (KVRING_TEST_STORE_HOLD) */
	bool can_hold;                 /* the lookup actor may hold an ALLOC (an L2 or remote tier) */
	uint64_t stale_id;             /* an abandoned ALLOC it may still hold (0: none) ... */
	uint64_t stale_reset_id;       /* ... the RESET sent behind it ... */
	uint64_t stale_cap, stale_until; /* ... and until when no new ALLOC goes out */
	int timer;                     /* the earliest deadline's timer, -1 none */
	uint64_t timer_at;
	uint32_t inflight_max;         /* high-water mark of the window */
	unsigned waiting;              /* requests its owner holds outside the pipe (held count) */
};

/* Open the pipe for the stores of n_ranks ranks (sw[r]: rank r's worker; a storer: 1) over
 * ss (stage_store_open done). The depth is the ranks' store pool (pool_leases) capped at
 * STAGE_STORE_DEPTH_MAX and by KVRING_STORE_DEPTH. 0, -EINVAL or -ENOMEM. */
int stage_store_pipe_open(struct stage_store_pipe *p, struct stage_store *ss, struct stage_worker *const *sw,
			  unsigned n_ranks);
/* Stopping (fini): answer every job still in the pipe -ESHUTDOWN (every block failed) and
 * free it. With stores in flight it first leaves nothing in commit.req that could allocate
 * after kvringd's WORKER_GONE: it waits (at most 4 s, below kvringd's SIGKILL) for an ALLOC
 * the lookup actor has, and sends a RESET behind everything. */
void stage_store_pipe_close(struct stage_store_pipe *p);
/* A complete store: rq[r] is rank r's STORE (the same keys in every rank's; their items
 * are copied). Returns true when the window is full: the caller holds its input until
 * stage_store_pipe_pass() says there is room. */
bool stage_store_pipe_submit(struct stage_store_pipe *p, const struct stage_store_req *rq);
/* One message of ss->commit_rep, at now_ns (the actor's clock: a->now_ns). 0, or -EBADMSG
 * (not a reply type of this ring). */
int stage_store_pipe_reply(struct stage_store_pipe *p, const struct kvr_msg *m, uint64_t now_ns);
/* Move the jobs on: send what can be sent, copy one job, answer finished jobs in order.
 * Returns KVR_PASS_* (struct kvr_stage.on_pass); *ret_room: the window has room again. */
int stage_store_pipe_pass(struct stage_store_pipe *p, uint64_t now_ns, bool *ret_room);
/* Periodic: the lookup actor's generation, overdue answers. */
void stage_store_pipe_tick(struct stage_store_pipe *p, uint64_t now_ns);
/* n requests its owner holds outside the pipe (a DCP store waiting for its group's other
 * ranks): kvringd's drain waits for them with the pipe's jobs (kvr_actor_set_held). */
void stage_store_pipe_set_waiting(struct stage_store_pipe *p, unsigned n);
/* Jobs accepted and not answered (the window and what waits behind it). */
static inline unsigned stage_store_pipe_pending(const struct stage_store_pipe *p)
{
	return p->n;
}

#endif
