/* store_pipe: the store pipe — several stores of one worker (or one DCP group) in flight, moved on by the actor loop. */
#include "store_path.h"
#include "store_path_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_grow.h"
#include "kvr_log.h"
#include "kvr_time.h"

/*
 * The pipelined store path (the storer's and the gather actor's; the contract is in store_path.h,
 * the steps of one store atop store_path.c). One pass of the actor loop (stage_store_pipe_pass)
 * moves every job as far as it can without waiting:
 *
 *   answer   finished jobs at the head of the FIFO, in order;
 *   ALLOC    for the first QUEUED job of the window, when no ALLOC is outstanding — sent
 *            before the copy below, so the lookup actor allocates job k+1 while job k copies;
 *   COMMIT   for COPIED jobs whose predecessors all committed (or are done);
 *   copy     one job whose slots are known, then the steps above again. One copy a pass:
 *            the loop serves the reply rings between two copies.
 *
 * Replies (commit.rep) arrive through stage_store_pipe_reply: an ALLOC_REP or COMMIT_REP
 * is matched to its job by request id; anything else of this ring is a late reply to an
 * abandoned request and dropped (a late ALLOC_REP first asks for a RESET, see store_path.h).
 * Deadlines are one timer, armed for the earliest outstanding request and, while any is
 * outstanding, every 50 ms for the lookup actor's generation (the storer's slow tick
 * checks both too, in case no timer could be armed; an idle storer does not wake for it).
 */

enum job_state {
	JOB_QUEUED, /* accepted: waits for its turn to ALLOC (and, beyond the window, for room) */
	JOB_ALLOC,  /* ALLOC sent: at most one job of a pipe */
	JOB_SLOTS,  /* ALLOC_REP in: WRITING slots to copy into */
	JOB_COPYING,/* its copy in flight: chunks submitted and reaped pass by pass */
	JOB_COPIED, /* every block in its slot: COMMIT once every earlier job committed */
	JOB_COMMIT, /* COMMIT sent */
	JOB_DONE,   /* result known: answered once every earlier job was */
};

struct stage_store_job {
	enum job_state state;
	struct stage_store_req rq[KVR_ACTOR_MAX_KV];         /* rank r's STORE; rq[r].items = items[r] */
	struct kvr_msg_store_item *items[KVR_ACTOR_MAX_KV]; /* copies of the STOREs' items */
	struct kvr_msg_slot *written;     /* the slots to copy and commit (n_copy) */
	uint32_t *pos;                    /* their positions in the request */
	uint64_t *slot_offs;
	uint32_t *blocks[KVR_ACTOR_MAX_KV]; /* rank r's engine block ids of the copied positions */
	uint32_t *fail_pos;               /* positions not stored (n_fail) */
	uint32_t *pres_pos;               /* positions answered PRESENT (present) */
	uint32_t *failed;                 /* block ids not stored, for the reply */
	uint32_t cap;                     /* of every array above */
	uint32_t n_copy, present, n_fail, committed;
	bool present_lost;                /* an earlier job failed: its slots may be what PRESENT
					   * meant, so those positions are reported failed */
	bool just_failed;                 /* failed by the fault being handled (present_suspects) */
	int status;                       /* DONE: 0 (the counts say), or every block failed */
	uint64_t id;                      /* its outstanding ALLOC or COMMIT */
	uint64_t deadline;                /* ... is overdue then */
	uint64_t start_ns;                /* its ALLOC went out: the end of its queue time */
	struct kvr_xfer_dep ready[KVR_ACTOR_MAX_KV];         /* CUDA: rank r's producer event ... */
	const struct kvr_xfer_dep *readyp[KVR_ACTOR_MAX_KV]; /* ... &ready[r], or NULL: none */
	struct kvr_xfer_stats st[KVR_ACTOR_MAX_KV];
	struct stage_copy copy;           /* COPYING: its chunks */
};

#define JOB_KEEP_ITEMS 4096 /* a FIFO entry keeps buffers for this many blocks between stores */

static struct stage_store_job *job_at(const struct stage_store_pipe *p, unsigned i)
{
	return p->jobs[(p->head + i) % p->cap_jobs];
}

static unsigned window(const struct stage_store_pipe *p)
{
	return p->n < p->depth ? p->n : p->depth;
}

/* Holds slots it has not yet sent a COMMIT for: a RESET would abort them under it. */
static bool holds_slots(const struct stage_store_job *j)
{
	return j->state == JOB_ALLOC || j->state == JOB_SLOTS || j->state == JOB_COPYING || j->state == JOB_COPIED;
}

/* A COPYING job leaves that state (its slots are about to be RESET, or it stops): what it
 * submitted completes first — a RESET slot may be handed to anyone, and a copy still in
 * flight must not write into it then. Waits only for copies in flight (CUDA; the host
 * backend completes inside submit), on this fault path alone. */
static void job_stop_copy(struct stage_store_job *j)
{
	if (j->state != JOB_COPYING)
		return;
	if (!j->copy.rc)
		j->copy.rc = -ECANCELED;
	while (stage_copy_reap(&j->copy, true) == 1)
		;
	memcpy(j->st, j->copy.st, sizeof(j->st));
	j->state = JOB_SLOTS;
}

static int job_grow(struct stage_store_job *j, uint32_t n, unsigned n_ranks)
{
	if (n <= j->cap)
		return 0;
	for (unsigned r = 0; r < n_ranks; r++)
		if (kvr_realloc_n(&j->items[r], n, sizeof(*j->items[r])) ||
		    kvr_realloc_n(&j->blocks[r], n, sizeof(*j->blocks[r])))
			return -ENOMEM;
	if (kvr_realloc_n(&j->written, n, sizeof(*j->written)) || kvr_realloc_n(&j->pos, n, sizeof(*j->pos)) ||
	    kvr_realloc_n(&j->slot_offs, n, sizeof(*j->slot_offs)) || kvr_realloc_n(&j->fail_pos, n, sizeof(*j->fail_pos)) ||
	    kvr_realloc_n(&j->pres_pos, n, sizeof(*j->pres_pos)) || kvr_realloc_n(&j->failed, n, sizeof(*j->failed)))
		return -ENOMEM;
	j->cap = n;
	return 0;
}

static void job_free(struct stage_store_job *j)
{
	for (unsigned r = 0; r < KVR_ACTOR_MAX_KV; r++) {
		free(j->items[r]);
		free(j->blocks[r]);
	}
	free(j->written);
	free(j->pos);
	free(j->slot_offs);
	free(j->fail_pos);
	free(j->pres_pos);
	free(j->failed);
	memset(j, 0, sizeof(*j));
}

/* Room for one more job: the FIFO of pointers doubles, unwrapped; a job never moves (its
 * copy points into it), and its entry keeps its buffers between stores. */
static int pipe_grow(struct stage_store_pipe *p)
{
	if (p->n < p->cap_jobs)
		return 0;
	unsigned cap = p->cap_jobs * 2;
	struct stage_store_job **q = calloc(cap, sizeof(*q));
	if (!q)
		return -ENOMEM;
	for (unsigned i = 0; i < cap; i++) {
		q[i] = i < p->cap_jobs ? job_at(p, i) : calloc(1, sizeof(**q));
		if (!q[i]) {
			while (i-- > p->cap_jobs)
				free(q[i]);
			free(q);
			return -ENOMEM;
		}
	}
	free(p->jobs);
	p->jobs = q;
	p->cap_jobs = cap;
	p->head = 0;
	return 0;
}

static uint64_t lookup_call_ns(const struct stage_store_pipe *p)
{
	return LOOKUP_TIMEOUT_NS(p->ss->a);
}

/* The gauges and what kvringd's drain waits for; before any reply that changed them. */
static void pipe_gauges(struct stage_store_pipe *p)
{
	struct kvr_actor *a = p->ss->a;
	unsigned w = window(p);
	if (w > p->inflight_max)
		p->inflight_max = w;
	atomic_store_explicit(&a->stats->c[KVR_STAT_XF_STORES_INFLIGHT], w, memory_order_relaxed);
	atomic_store_explicit(&a->stats->c[KVR_STAT_XF_STORES_INFLIGHT_MAX], p->inflight_max, memory_order_relaxed);
	kvr_actor_set_held(a, p->n + p->waiting);
}

static void job_finish(struct stage_store_job *j, int status)
{
	j->status = status;
	j->state = JOB_DONE;
	j->deadline = 0;
}

/* job_finish for a job a fault takes down while it held slots or waited for the lookup
 * actor: present_suspects() looks at the jobs behind it. */
static void job_fault(struct stage_store_job *j, int status)
{
	job_stop_copy(j);
	job_finish(j, status);
	j->just_failed = j->start_ns != 0; /* it had asked for slots */
}

/* STORE_DONE for a finished job to every rank: the counts, or (status) every block failed;
 * rank r's own block ids. A DCP group stores one canonical block per key: blocks count once. */
static void job_reply(struct stage_store_pipe *p, struct stage_store_job *j)
{
	uint32_t stored = 0, present = 0, n_failed = 0;
	int status = j->status;
	if (!status) {
		present = j->present_lost ? 0 : j->present;
		stored = j->committed;
		kvr_actor_count(p->ss->a, KVR_STAT_XF_BLOCKS, stored);
		kvr_actor_count(p->ss->a, KVR_STAT_XF_PRESENT_BLOCKS, present);
	}
	for (unsigned r = 0; r < p->n_ranks; r++) {
		const struct stage_store_req *rq = &j->rq[r];
		const struct kvr_msg_store_item *items = j->items[r];
		int st = status;
		n_failed = 0;
		if (status) {
			if (items) /* else no room to list them: the status fails all */
				for (uint32_t i = 0; i < rq->n; i++)
					j->failed[n_failed++] = items[i].block;
		} else {
			for (uint32_t k = 0; k < j->n_fail; k++)
				j->failed[n_failed++] = items[j->fail_pos[k]].block;
			if (j->present_lost)
				for (uint32_t k = 0; k < j->present; k++)
					j->failed[n_failed++] = items[j->pres_pos[k]].block;
			st = n_failed ? -EIO : 0;
		}
		kvr_actor_count(p->ss->a, KVR_STAT_XF_BYTES, j->st[r].bytes);
		/* queued until its ALLOC went out */
		stage_store_send_done(p->sw[r], rq, st, stored, present, j->failed, n_failed, &j->st[r], j->start_ns);
	}
	kvr_debug("store %llx: %u blocks x %u ranks, %u stored, %u present, %u failed (%d)",
		  (unsigned long long)j->rq[0].wire, j->rq[0].n, p->n_ranks, stored, present, n_failed, status);
}

static void send_reset(struct stage_store_pipe *p, uint64_t now)
{
	struct kvr_msg m;
	p->reset_id = ++p->ss->next_id;
	kvr_msg_build(&m, KVR_MSG_RESET, 0, p->reset_id, 0, NULL, 0);
	if (p->stale_id && !p->stale_reset_id)
		p->stale_reset_id = p->reset_id; /* its answer bounds the wait for the stale ALLOC */
	if (kvr_outbox_send(&p->out, &m, now))
		kvr_err("worker %u: RESET of its lane dropped (outbox full)", p->ss->owner);
	p->reset_wanted = false;
}

/* The job's ALLOC is given up: the lookup actor may still hold it (see stage_common.h). */
static void abandon_alloc(struct stage_store_pipe *p, const struct stage_store_job *j, uint64_t now)
{
	if (j->state != JOB_ALLOC || !p->can_hold)
		return;
	p->stale_id = j->id;
	p->stale_reset_id = 0; /* the next RESET sent */
	p->stale_cap = now + lookup_call_ns(p);
	p->stale_until = UINT64_MAX;
}

/* Whether an abandoned ALLOC still bars new ones. */
static bool stale_alloc(struct stage_store_pipe *p, uint64_t now)
{
	if (p->stale_id && (now >= p->stale_cap || now >= p->stale_until)) {
		kvr_debug("worker %u: the abandoned ALLOC %llx was not answered: going on", p->ss->owner,
			  (unsigned long long)p->stale_id);
		p->stale_id = 0;
	}
	return p->stale_id != 0;
}

/* Jobs failed out of turn: a later job's PRESENT answers may have meant their slots (the
 * lookup actor answers PRESENT for a lane another store is still writing). Those later jobs
 * report their PRESENT positions failed: at worst a block that is stored elsewhere. */
static void present_suspects(struct stage_store_pipe *p)
{
	bool after_failed = false;
	for (unsigned i = 0; i < p->n; i++) {
		struct stage_store_job *j = job_at(p, i);
		if (j->just_failed) {
			j->just_failed = false;
			after_failed = true;
			continue;
		}
		if (after_failed && !j->status && j->state != JOB_QUEUED && j->state != JOB_ALLOC && j->present)
			j->present_lost = true;
	}
}

/* RESET the lane after `cause` failed (NULL: jobs already finished by the caller): every
 * other job holding uncommitted slots loses them and fails too. */
static void lane_reset(struct stage_store_pipe *p, struct stage_store_job *cause, int status, uint64_t now)
{
	unsigned others = 0;
	for (unsigned i = 0; i < p->n; i++) {
		struct stage_store_job *j = job_at(p, i);
		if (j == cause) {
			abandon_alloc(p, j, now);
			job_fault(j, status);
		} else if (holds_slots(j)) {
			abandon_alloc(p, j, now);
			job_fault(j, -EAGAIN); /* not -ECANCELED: that says its client cancelled it */
			others++;
		}
	}
	if (others)
		kvr_warn("worker %u: lane reset: %u other store%s in flight failed with it", p->ss->owner, others,
			 others == 1 ? "" : "s");
	present_suspects(p);
	send_reset(p, now);
}

/* A restart of the lookup actor: what it was asked is lost (or answered by its successor,
 * which the jobs do not wait for). Returns whether it restarted. */
static bool check_lookup(struct stage_store_pipe *p, uint64_t now)
{
	uint32_t gen = atomic_load(&kvr_ctl_actor(p->ss->a->ctl, KVR_ACTOR_IX_LOOKUP)->generation);
	if (gen == p->lookup_gen)
		return false;
	p->lookup_gen = gen;
	unsigned failed = 0;
	for (unsigned i = 0; i < p->n; i++) {
		struct stage_store_job *j = job_at(p, i);
		if (j->state != JOB_QUEUED && j->state != JOB_DONE) {
			abandon_alloc(p, j, now);
			job_fault(j, -EPIPE);
			failed++;
		}
	}
	kvr_warn("worker %u: the lookup actor restarted: %u store%s in flight failed, lane reset", p->ss->owner, failed,
		 failed == 1 ? "" : "s");
	present_suspects(p);
	/* an abandoned ALLOC not wholly in the ring can never be held by the new lookup actor */
	for (uint32_t k = 0; p->stale_id && k < p->out.n; k++)
		if (p->out.q[(p->out.head + k) % p->out.cap].hdr.req_id == p->stale_id)
			p->stale_id = 0;
	(void)kvr_outbox_clear(&p->out); /* requests of failed jobs: not for the new lookup actor */
	send_reset(p, now);
	return true;
}

/* Fail every job whose ALLOC or COMMIT is overdue, and reset the lane once for them. */
static void expire(struct stage_store_pipe *p, uint64_t now)
{
	unsigned n = 0;
	for (unsigned i = 0; i < p->n; i++) {
		struct stage_store_job *j = job_at(p, i);
		if ((j->state == JOB_ALLOC || j->state == JOB_COMMIT) && j->deadline <= now) {
			kvr_warn("store %llx: %s not answered within %u ms", (unsigned long long)j->rq[0].wire,
				 j->state == JOB_ALLOC ? "allocation" : "commit", p->ss->a->cfg.timeouts.lookup_call_ms);
			abandon_alloc(p, j, now);
			job_fault(j, -ETIMEDOUT);
			n++;
		}
	}
	if (n)
		lane_reset(p, NULL, 0, now);
}

static void on_deadline(struct kvr_actor *a, uint64_t now, void *arg)
{
	(void)a;
	struct stage_store_pipe *p = arg;
	p->timer = -1;
	p->timer_at = 0;
	(void)check_lookup(p, now);
	expire(p, now);
}

/* One timer while anything waits for the lookup actor: at its earliest deadline, and at
 * least every LOOKUP_POLL_NS to see a restart of the lookup actor soon (an idle storer
 * arms none). */
#define LOOKUP_POLL_NS (50ull * 1000000ull)
static void arm_timer(struct stage_store_pipe *p, uint64_t now)
{
	uint64_t at = UINT64_MAX;
	for (unsigned i = 0; i < p->n; i++) {
		const struct stage_store_job *j = job_at(p, i);
		if ((j->state == JOB_ALLOC || j->state == JOB_COMMIT) && j->deadline < at)
			at = j->deadline;
	}
	if (p->stale_id) {
		uint64_t until = p->stale_until < p->stale_cap ? p->stale_until : p->stale_cap;
		at = until < at ? until : at;
	}
	if (at != UINT64_MAX && at > now + LOOKUP_POLL_NS)
		at = now + LOOKUP_POLL_NS;
	if (p->timer >= 0 && (p->timer_at == at || (at != UINT64_MAX && p->timer_at <= at)))
		return; /* armed early enough */
	if (p->timer >= 0)
		kvr_actor_timer_stop(p->ss->a, p->timer);
	p->timer = -1;
	p->timer_at = 0;
	if (at == UINT64_MAX)
		return;
	int id = kvr_actor_timer_start(p->ss->a, at, on_deadline, p);
	if (id >= 0) { /* else the tick finds it overdue */
		p->timer = id;
		p->timer_at = at;
	}
}

/* Answer finished jobs at the head, in order. */
static bool answer(struct stage_store_pipe *p)
{
	bool moved = false;
	while (p->n && job_at(p, 0)->state == JOB_DONE) {
		struct stage_store_job *j = job_at(p, 0);
		p->head = (p->head + 1) % p->cap_jobs;
		p->n--;
		pipe_gauges(p); /* before the reply: whoever reads them after it sees this store gone */
		job_reply(p, j);
		if (j->cap > JOB_KEEP_ITEMS)
			job_free(j); /* a huge store's buffers are not kept for the next one */
		moved = true;
	}
	return moved;
}

/* The ALLOC of the first QUEUED job of the window, when none is outstanding. */
static bool start_alloc(struct stage_store_pipe *p, uint64_t now)
{
	struct stage_store *ss = p->ss;
	bool moved = false;
	if (p->reset_wanted)
		return false; /* no new slots until the RESET went out */
	if (stale_alloc(p, now))
		return false; /* the lookup actor may still hold an abandoned ALLOC */
	for (unsigned i = 0; i < window(p); i++) {
		struct stage_store_job *j = job_at(p, i);
		if (j->state == JOB_ALLOC)
			return moved;
		if (j->state != JOB_QUEUED)
			continue;
		int rc = 0;
		for (unsigned r = 0; r < p->n_ranks && !rc; r++)
			rc = stage_fence(p->sw[r], j->rq[r].wire, false);
		if (!rc)
			rc = j->items[0] ? stage_store_check(ss, p->sw, j->rq, p->n_ranks, j->ready, j->readyp) : -ENOMEM;
		if (rc) {
			if (stage_store_fenced(rc))
				kvr_actor_count(ss->a, KVR_STAT_XF_FENCED, 1);
			job_finish(j, rc);
			moved = true;
			continue;
		}
		uint32_t n = j->rq[0].n;
		if (n > p->cap_keys) {
			if (kvr_realloc_n(&p->keys, n, sizeof(*p->keys))) {
				job_finish(j, -ENOMEM);
				moved = true;
				continue;
			}
			p->cap_keys = n;
		}
		for (uint32_t k = 0; k < n; k++)
			p->keys[k] = j->items[0][k].key;
		j->id = ++ss->next_id;
		j->start_ns = now;
		j->deadline = now + lookup_call_ns(p);
		j->state = JOB_ALLOC;
		if (kvr_outbox_send_list(&p->out, KVR_MSG_ALLOC, j->id, (uint8_t)ss->lane, 0, p->keys, n, now)) {
			/* part of it may be in the ring: the lookup actor sees an incomplete list */
			kvr_err("store %llx: ALLOC dropped (outbox full)", (unsigned long long)j->rq[0].wire);
			job_finish(j, -ENOBUFS);
			p->reset_wanted = true;
		}
		return true;
	}
	return moved;
}

/* COMMITs in job order: a COPIED job once every earlier job committed or finished. */
static bool send_commits(struct stage_store_pipe *p, uint64_t now)
{
	bool moved = false;
	for (unsigned i = 0; i < window(p); i++) {
		struct stage_store_job *j = job_at(p, i);
		if (j->state == JOB_QUEUED || j->state == JOB_ALLOC || j->state == JOB_SLOTS || j->state == JOB_COPYING)
			break;
		if (j->state != JOB_COPIED)
			continue;
		/* the fence after the copy: the worker detached, died or cancelled the store before
		 * this point — its blocks may have held other bytes by the end of the copy */
		int frc = 0;
		for (unsigned r = 0; r < p->n_ranks && !frc; r++)
			frc = stage_fence(p->sw[r], j->rq[r].wire, true);
		if (frc) {
			kvr_info("store %llx: not committed: %s", (unsigned long long)j->rq[0].wire, stage_store_fence_why(frc));
			kvr_actor_count(p->ss->a, KVR_STAT_XF_FENCED, 1);
			lane_reset(p, j, frc, now);
			moved = true;
			continue;
		}
		j->id = ++p->ss->next_id;
		j->deadline = now + lookup_call_ns(p);
		j->state = JOB_COMMIT;
		moved = true;
		if (kvr_outbox_send_list(&p->out, KVR_MSG_COMMIT, j->id, (uint8_t)p->ss->lane, 0, j->written, j->n_copy,
					 now)) {
			kvr_err("store %llx: COMMIT dropped (outbox full)", (unsigned long long)j->rq[0].wire);
			lane_reset(p, j, -ENOBUFS, now);
		}
	}
	return moved;
}

/* Copy the oldest job whose slots are known into them. */
/*
 * KVRING_TEST_STORE_HOLD=<file> (inherited from kvringd's environment): while <file>
 * exists, no store starts its copy — its slots stay allocated and WRITING, the actor's loop
 * goes on (pings, other messages, ALLOCs of the jobs behind it). A test so holds a store
 * between its allocation and its commit for as long as it likes (prefill/decode: a decode
 * engine's lease arrives while the prefill engine's store is in flight), then removes the
 * file. Unset: nothing of this runs.
 */
static bool store_held(void)
{
	static const char *path;
	static bool looked;
	if (!looked) {
		path = getenv("KVRING_TEST_STORE_HOLD");
		looked = true;
		if (path && *path)
			kvr_warn("KVRING_TEST_STORE_HOLD=%s: stores copy only while that file does not exist", path);
	}
	return path && *path && access(path, F_OK) == 0;
}

/* The copy's end: COPIED, or the job failed with the copy's error and the lane reset. */
static void copy_over(struct stage_store_pipe *p, struct stage_store_job *j, uint64_t now)
{
	int rc = j->copy.rc;
	memcpy(j->st, j->copy.st, sizeof(j->st));
	j->state = JOB_SLOTS;
	if (!rc) {
		j->state = JOB_COPIED;
		return;
	}
	if (stage_store_fenced(rc)) {
		kvr_info("store %llx: copy stopped after %llu bytes: %s", (unsigned long long)j->rq[0].wire,
			 (unsigned long long)j->st[0].bytes, stage_store_fence_why(rc));
		kvr_actor_count(p->ss->a, KVR_STAT_XF_FENCED, 1);
	} else {
		kvr_warn("store %llx: copy failed: %s", (unsigned long long)j->rq[0].wire, strerror(-rc));
	}
	lane_reset(p, j, rc, now); /* aborts the WRITING slots: nothing partial becomes visible */
}

/*
 * Copies, one job at a time in job order (commits go in that order anyway): the oldest job
 * whose slots are known starts its copy (stage_copy); each pass reaps its finished chunks
 * and submits the next, at most the store pool's leases in flight — no handler waits for a
 * copy (one that completes inside submit, the host backend's, is done in the pass that
 * starts it). Returns whether anything moved; *copying: chunks are in flight.
 */
static bool copy_step(struct stage_store_pipe *p, uint64_t now, bool *copying)
{
	struct stage_store_job *j = NULL;
	for (unsigned i = 0; i < window(p) && !j; i++)
		if (job_at(p, i)->state == JOB_COPYING || job_at(p, i)->state == JOB_SLOTS)
			j = job_at(p, i);
	*copying = false;
	if (!j)
		return false;
	bool moved = false;
	if (j->state == JOB_SLOTS) {
		p->held = store_held();
		if (p->held)
			return false;
		const uint32_t *blocks[KVR_ACTOR_MAX_KV];
		uint64_t wires[KVR_ACTOR_MAX_KV];
		for (unsigned r = 0; r < p->n_ranks; r++) {
			for (uint32_t k = 0; k < j->n_copy; k++)
				j->blocks[r][k] = j->items[r][j->pos[k]].block;
			blocks[r] = j->blocks[r];
			wires[r] = j->rq[r].wire;
		}
		(void)stage_copy_start(&j->copy, p->sw, p->n_ranks, KVR_XFER_KV_TO_SLOT, blocks, j->slot_offs, j->n_copy,
				       j->readyp, wires);
		j->state = JOB_COPYING;
		moved = true;
	}
	/* as far as it goes without waiting: the host backend copies inside submit, so its
	 * whole copy is one pass; CUDA chunks are left in flight for a later pass to reap */
	for (bool step = true; step;) {
		step = false;
		while (stage_copy_reap(&j->copy, false) == 1)
			step = true;
		/* a beat per chunk: the host backend copies inside submit, and a whole window of
		 * chunks could outlast 5 health intervals of 10 ms on a busy machine (a 60,000-block
		 * store did); busy, not stuck */
		while (stage_copy_submit(&j->copy)) {
			step = true;
			kvr_actor_beat(p->ss->a);
		}
		moved |= step;
	}
	if (stage_copy_over(&j->copy)) {
		copy_over(p, j, now);
		return true;
	}
	*copying = j->copy.inflight > 0;
	return moved;
}

/* A late ALLOC_REP (its job gave up), or a COMMIT or RESET the outbox dropped, may leave
 * WRITING slots nobody will commit: RESET once no job holds slots a RESET would take away. */
static bool reset_when_quiet(struct stage_store_pipe *p, uint64_t now)
{
	if (!p->reset_wanted)
		return false;
	for (unsigned i = 0; i < p->n; i++)
		if (holds_slots(job_at(p, i)))
			return false;
	kvr_info("worker %u: slots nobody will commit (a late allocation answer, a dropped request): lane reset",
		 p->ss->owner);
	send_reset(p, now);
	return true;
}

int stage_store_pipe_open(struct stage_store_pipe *p, struct stage_store *ss, struct stage_worker *const *sw,
			  unsigned n_ranks)
{
	memset(p, 0, sizeof(*p));
	p->ss = ss;
	p->timer = -1;
	if (!n_ranks || n_ranks > KVR_ACTOR_MAX_KV)
		return -EINVAL;
	p->n_ranks = n_ranks;
	unsigned leases = UINT32_MAX;
	for (unsigned r = 0; r < n_ranks; r++) {
		p->sw[r] = sw[r];
		if (sw[r]->pool_leases < leases)
			leases = sw[r]->pool_leases;
	}
	kvr_outbox_init(&p->out, ss->commit_req);
	unsigned depth = leases < STAGE_STORE_DEPTH_MAX ? leases : STAGE_STORE_DEPTH_MAX;
	if (!depth)
		depth = 1;
	const char *env = getenv("KVRING_STORE_DEPTH");
	if (env && *env) {
		char *end;
		unsigned long v = strtoul(env, &end, 10);
		if (*end || v < 1 || v > STAGE_STORE_DEPTH_MAX)
			kvr_warn("KVRING_STORE_DEPTH=%s ignored (want 1..%u)", env, STAGE_STORE_DEPTH_MAX);
		else if (v < depth)
			depth = (unsigned)v;
	}
	p->depth = depth;
	p->cap_jobs = 2 * STAGE_STORE_DEPTH_MAX;
	p->jobs = calloc(p->cap_jobs, sizeof(*p->jobs));
	if (!p->jobs)
		return -ENOMEM;
	for (unsigned i = 0; i < p->cap_jobs; i++)
		if (!(p->jobs[i] = calloc(1, sizeof(*p->jobs[i]))))
			return -ENOMEM; /* stage_store_pipe_close frees what there is */
	p->lookup_gen = atomic_load(&kvr_ctl_actor(ss->a->ctl, KVR_ACTOR_IX_LOOKUP)->generation);
	p->can_hold = ss->a->cfg.l2.n_dirs || ss->a->cfg.remote.n_cluster; /* lookup.c: alloc_try */
	/* a high-water mark over the actor's starts, as its counters are sums over them */
	p->inflight_max = (uint32_t)atomic_load(&ss->a->stats->c[KVR_STAT_XF_STORES_INFLIGHT_MAX]);
	kvr_info("worker %u: up to %u stores in flight (store pool of %u leases%s)", sw[0]->worker, depth, leases,
		 env && *env ? ", KVRING_STORE_DEPTH" : "");
	pipe_gauges(p);
	return 0;
}

/* Stopping (fini: the loop has ended): wait up to deadline for a message with id on
 * commit.rep, dropping the others. 0 or -ETIMEDOUT. */
static int await_id(struct stage_store *ss, uint64_t id, uint64_t deadline)
{
	for (;;) {
		struct kvr_msg m;
		uint64_t now = kvr_now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		int rc = kvr_ring_dequeue(ss->commit_rep, &m, (int64_t)(deadline - now < AWAIT_SLICE_NS ? deadline - now :
											     AWAIT_SLICE_NS));
		kvr_actor_beat(ss->a);
		if (rc == 0 && m.hdr.req_id == id)
			return 0;
	}
}

#define STOP_WAIT_NS (4000ull * 1000000ull) /* below kvringd's 5 s from STOP to SIGKILL */

/*
 * The storer stops (its worker left, or a drain ran out of time) with stores in flight.
 * Once it has exited kvringd sends WORKER_GONE, which the lookup actor may take before
 * what is still in commit.req: an ALLOC taken after it would leave WRITING slots of a
 * worker that is gone. So unsent requests are dropped, an ALLOC the lookup actor has (or
 * will take from the ring) is waited for — it may hold one waiting for room — and a RESET
 * goes behind everything: taken after that ALLOC, it aborts what the ALLOC allocated and
 * whatever our stores hold. The waits are bounded by STOP_WAIT_NS (a stopped lookup actor
 * answers nothing; the RESET left in the ring still runs when it goes on).
 */
static void settle_lookup(struct stage_store_pipe *p)
{
	struct stage_store *ss = p->ss;
	bool busy = p->stale_id || kvr_outbox_pending(&p->out);
	uint64_t wait_id = p->stale_id;
	for (unsigned i = 0; i < p->n; i++) {
		const struct stage_store_job *j = job_at(p, i);
		busy |= j->state != JOB_QUEUED && j->state != JOB_DONE;
		if (j->state == JOB_ALLOC) {
			bool sent = true; /* all of it in the ring */
			for (uint32_t k = 0; k < p->out.n && sent; k++)
				sent = p->out.q[(p->out.head + k) % p->out.cap].hdr.req_id != j->id;
			if (sent)
				wait_id = j->id;
		}
	}
	if (!busy)
		return;
	uint64_t lc = lookup_call_ns(p), deadline = kvr_now_ns() + (lc < STOP_WAIT_NS ? lc : STOP_WAIT_NS);
	(void)kvr_outbox_clear(&p->out);
	int rc = wait_id ? await_id(ss, wait_id, deadline) : 0;
	/* the RESET goes whatever the wait gave: behind the ALLOC in the ring it aborts what that
	 * ALLOC allocates, even after WORKER_GONE */
	struct kvr_msg m;
	uint64_t id = ++ss->next_id;
	kvr_msg_build(&m, KVR_MSG_RESET, 0, id, 0, NULL, 0);
	int src = kvr_msg_send(ss->commit_req, &m, deadline > kvr_now_ns() ? deadline : kvr_now_ns() + AWAIT_SLICE_NS);
	if (!src && !rc)
		rc = await_id(ss, id, deadline);
	if (src)
		kvr_err("worker %u: stopping without a RESET behind its stores (%s): slots the lookup actor allocates "
			"for them stay WRITING until this worker slot's next storer starts", ss->owner, strerror(-src));
	else if (rc)
		kvr_warn("worker %u: stopping before the lookup actor answered (%s); the RESET left behind the "
			 "stores reclaims their slots when it runs", ss->owner, strerror(-rc));
}

void stage_store_pipe_close(struct stage_store_pipe *p)
{
	if (!p || !p->jobs)
		return;
	if (p->timer >= 0)
		kvr_actor_timer_stop(p->ss->a, p->timer);
	for (unsigned i = 0; i < p->n; i++)
		job_stop_copy(job_at(p, i)); /* nothing of ours copies into a slot the RESET below frees */
	settle_lookup(p);
	for (unsigned i = 0; i < p->n; i++) {
		struct stage_store_job *j = job_at(p, i);
		if (j->state != JOB_DONE)
			job_finish(j, -ESHUTDOWN); /* stopping (drain timed out, or the worker left): answered */
	}
	(void)answer(p);
	for (unsigned i = 0; i < p->cap_jobs; i++) {
		if (p->jobs[i])
			job_free(p->jobs[i]);
		free(p->jobs[i]);
	}
	free(p->jobs);
	free(p->keys);
	kvr_outbox_free(&p->out);
	kvr_actor_set_held(p->ss->a, 0);
	memset(p, 0, sizeof(*p));
	p->timer = -1;
}

bool stage_store_pipe_submit(struct stage_store_pipe *p, const struct stage_store_req *rq)
{
	if (pipe_grow(p)) {
		/* out of memory: answered at once (the only answer out of producer order) */
		for (unsigned r = 0; r < p->n_ranks; r++)
			stage_store_fail(p->ss, p->sw[r], &rq[r], -ENOMEM);
		return p->n >= p->depth;
	}
	struct stage_store_job *j = job_at(p, p->n);
	j->state = JOB_QUEUED;
	j->status = 0;
	j->n_copy = j->present = j->n_fail = j->committed = 0;
	j->present_lost = j->just_failed = false;
	j->id = j->deadline = j->start_ns = 0;
	memset(j->readyp, 0, sizeof(j->readyp));
	memset(j->st, 0, sizeof(j->st));
	bool room = !job_grow(j, rq[0].n ? rq[0].n : 1, p->n_ranks);
	if (!room)
		job_free(j); /* start_alloc fails it -ENOMEM (items NULL), in its turn */
	for (unsigned r = 0; r < p->n_ranks; r++) {
		j->rq[r] = rq[r];
		if (room && rq[r].n <= j->cap)
			memcpy(j->items[r], rq[r].items, (size_t)rq[r].n * sizeof(*j->items[r]));
		j->rq[r].items = j->items[r];
	}
	p->n++;
	pipe_gauges(p);
	return p->n >= p->depth;
}

void stage_store_pipe_set_waiting(struct stage_store_pipe *p, unsigned n)
{
	p->waiting = n;
	pipe_gauges(p);
}

int stage_store_pipe_reply(struct stage_store_pipe *p, const struct kvr_msg *m, uint64_t now)
{
	struct stage_store_job *j = NULL;
	if (m->hdr.type == KVR_MSG_ALLOC_REP) {
		for (unsigned i = 0; i < window(p) && !j; i++)
			if (job_at(p, i)->state == JOB_ALLOC)
				j = job_at(p, i);
		if (!j || m->hdr.req_id != j->id) {
			if (m->hdr.req_id == p->stale_id)
				p->stale_id = 0; /* the lookup actor is done with it */
			if (m->hdr.seq == 0)
				p->reset_wanted = true; /* its slots may be WRITING with nobody to commit them */
			return 0;
		}
		struct kvr_list_asm *l = &p->ss->alloc_rep;
		int fed = kvr_list_feed(l, m);
		if (fed < 0 || (fed == 1 && l->total != j->rq[0].n)) {
			kvr_warn("store %llx: bad allocation answer", (unsigned long long)j->rq[0].wire);
			j->state = JOB_SLOTS; /* answered: the lookup actor no longer holds it */
			lane_reset(p, j, -EPROTO, now);
			return fed < 0 ? -EBADMSG : 0;
		}
		if (fed == 0)
			return 0;
		stage_store_sort_alloc(p->sw[0]->slots, l->items, j->rq[0].n, j->written, j->pos, j->slot_offs,
				       j->fail_pos, j->pres_pos, &j->n_copy, &j->present, &j->n_fail);
		j->deadline = 0;
		j->state = JOB_SLOTS;
		if (!j->n_copy)
			job_finish(j, 0); /* every key PRESENT or NOROOM: nothing to copy or commit */
		return 0;
	}
	if (m->hdr.type != KVR_MSG_COMMIT_REP)
		return -EBADMSG;
	for (unsigned i = 0; i < window(p) && !j; i++)
		if (job_at(p, i)->state == JOB_COMMIT && job_at(p, i)->id == m->hdr.req_id)
			j = job_at(p, i);
	struct kvr_msg_commit_rep cr;
	if (kvr_msg_decode_commit_rep(m, &cr)) {
		if (j) {
			kvr_warn("store %llx: bad commit answer", (unsigned long long)j->rq[0].wire);
			lane_reset(p, j, -EPROTO, now);
		}
		return -EBADMSG;
	}
	if (!j) {
		if (m->hdr.req_id == p->reset_id && cr.status)
			kvr_warn("worker %u: RESET of its lane: %s", p->ss->owner, strerror(-cr.status));
		if (p->stale_id && m->hdr.req_id == p->stale_reset_id && p->stale_until == UINT64_MAX)
			p->stale_until = now + kvr_ms_to_ns(p->ss->a->cfg.timeouts.alloc_wait_ms);
		return 0; /* a RESET's answer, or a late one */
	}
	j->committed = stage_store_commit_outcome(p->sw[0]->slots, j->written, j->pos, j->n_copy, cr.n_committed,
						  j->fail_pos, &j->n_fail);
	if (j->committed != j->n_copy)
		kvr_warn("store %llx: %u of %u slots committed (lookup reported %u)", (unsigned long long)j->rq[0].wire,
			 j->committed, j->n_copy, cr.n_committed);
	job_finish(j, 0);
	return 0;
}

int stage_store_pipe_pass(struct stage_store_pipe *p, uint64_t now, bool *ret_room)
{
	bool moved = check_lookup(p, now);
	uint32_t before = p->out.n;
	uint32_t dropped = kvr_outbox_flush(&p->out, now, lookup_call_ns(p));
	if (dropped) {
		kvr_err("worker %u: the lookup actor took nothing for %u ms: %u request messages dropped", p->ss->owner,
			p->ss->a->cfg.timeouts.lookup_call_ms, dropped);
		/* a dropped COMMIT or RESET leaves slots the lookup actor allocated WRITING with
		 * nobody to commit them: reset the lane once no job holds slots */
		p->reset_wanted = true;
	}
	moved |= p->out.n != before;
	bool copying = false;
	for (int copies = 0;; copies++) {
		bool step;
		do {
			step = answer(p);
			step |= start_alloc(p, now);
			step |= send_commits(p, now);
			step |= reset_when_quiet(p, now);
			moved |= step;
		} while (step);
		if (copies == 1 || !copy_step(p, now, &copying))
			break;
		moved = true; /* `now` stays the pass's clock: a deadline set after the copy is
			       * early by the copy's length, never late */
	}
	arm_timer(p, now);
	pipe_gauges(p);
	*ret_room = p->n < p->depth;
	if (moved)
		return KVR_PASS_MOVED;
	if (copying)
		kvr_actor_poll_within(p->ss->a, STAGE_COPY_POLL_NS); /* a copy's completion is polled */
	return kvr_outbox_pending(&p->out) || p->held || copying ? KVR_PASS_WAITING : KVR_PASS_IDLE;
}

void stage_store_pipe_tick(struct stage_store_pipe *p, uint64_t now)
{
	(void)check_lookup(p, now);
	expire(p, now);
}
