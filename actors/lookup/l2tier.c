/* l2tier: the lookup actor's side of L2 — the on-disk set kept, write-through, promotions with deferred replies. */
#include "l2tier.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <kvring/kvring.h>

#include "clients.h"
#include "kvr_grow.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_ring_names.h"
#include "kvr_slots.h"
#include "kvr_time.h"
#include "l2set.h"

#define NO_LANE 0xffffu
#define RM_DISK L2T_MAX_DISKS /* read.disk of a read from the shared tier */

enum { B_OK = 0, B_WAIT = 1, B_FAIL = 2, B_PROMOTED = 3 }; /* per block of a promotion */

struct pend {                 /* one promotion per worker (its client's lookup is synchronous) */
	bool active;
	uint32_t seq;
	uint64_t wire;
	unsigned lane;
	uint32_t n;               /* blocks decided so far (the reply covers a prefix of them) */
	uint32_t total;           /* blocks it may still extend to */
	const kvr_key *keys;      /* the worker's lookup keys (valid while it waits: one lookup at a time) */
	bool stalled;             /* waiting for room: in L1 (write-back: demotions) or in a full
				   * disk.req / remote.req ring (retried when a read ends, a write is
				   * answered, and from the tick) */
	uint64_t deadline;        /* stop stalling then */
	uint32_t waiting;
	uint32_t rm_waiting;      /* of those, reads from the shared tier */
	uint32_t rm_window;       /* how many may be: 1 at first, doubled by each hit up to
				   * L2T_RM_WINDOW (a prompt the cluster lacks costs one read and
				   * one slot, a long one it has is read ahead) */
	struct kvr_index_ref *refs;
	uint8_t *state;
	uint8_t *pinned;          /* refs[i] pinned (KVR_PIN_LOOKUP) until the reply: later
				   * allocations of the same promotion must not evict it */
	uint32_t cap;
	uint64_t index_ns;
	uint8_t why;              /* enum kvr_miss_reason: why the extension stopped short (0: not
				   * for a reason of the tier: the next block is not on disk) */
};

struct read {                 /* an L2_READ in flight */
	bool used;
	uint32_t rseq;
	unsigned worker, lane;
	uint32_t pseq, block;
	uint32_t slot, epoch;
	unsigned disk;
	uint32_t disk_gen;
	uint64_t sent_ns;         /* when it was sent: unanswered after timeouts.l2_answer_ms, it is lost */
};

/* A disk actor answers every request, but an answer can be lost: it drops a reply it could
 * not send within its 5 s (our ring stayed full while we were blocked on a worker). A read
 * or write unanswered this long is given up (a read: its promotion slot aborted, safe while
 * an I/O may still land in it — it drains) or sent again (a write: duplicates cost nothing). */
#define ANSWER_SCAN_NS (1000000000ull)

/* Write queue: every lane to be written to L2 waits here until its disk actor answered.
 * A lane with a write queued or sent cannot be evicted (evict_veto), so no write is ever
 * skipped: a full disk ring only delays it (backpressure reaches ALLOCs through
 * writes_inflight), and a disk actor that died has its unanswered writes sent again to its
 * successor (a write of a lane already on disk is answered PRESENT, costing nothing). */
enum { WQ_NONE = 0, WQ_QUEUED = 1, WQ_SENT = 2 };

struct wq_ent {
	uint8_t state;            /* WQ_* */
	uint32_t epoch;           /* the epoch the write was queued for */
	uint32_t next;            /* WQ_QUEUED: the next slot in its disk's FIFO (KVR_SLOT_NONE last) */
	uint64_t sent_ns;         /* when it was sent (WQ_SENT) */
};

struct wfifo {                /* WQ_QUEUED slots of one disk actor, in commit order, linked by next */
	uint32_t head, tail, n;
};

struct l2tier {
	struct kvr_actor *a;
	struct kvr_index *idx;
	unsigned n_disks;
	struct kvr_ring *req[L2T_MAX_DISKS], *rep[L2T_MAX_DISKS];
	unsigned disk_actor[L2T_MAX_DISKS];
	uint32_t disk_gen[L2T_MAX_DISKS];
	bool synced[L2T_MAX_DISKS];   /* the answer to our last L2_SYNC is complete */
	bool sync_due[L2T_MAX_DISKS]; /* an L2_SYNC found disk.req full: sent again from the tick */
	bool wake_due[L2T_MAX_DISKS]; /* sent to quietly since the last l2t_wake */
	struct l2set set;             /* the (key, lane) pairs on disk */
	struct pend *pend;
	unsigned n_workers;
	struct read *reads;
	uint32_t n_reads, cap_reads, rseq;
	uint32_t pseq;
	unsigned writes_inflight;     /* lanes in the write queue (queued or sent) */
	struct wq_ent *wq;            /* [n_slots]: each slot's place in the write queue */
	struct wfifo fifo[L2T_MAX_DISKS];
	uint32_t *requeue;            /* [n_slots] scratch: a dead disk actor's writes, sorted */
	uint64_t last_scan_ns;        /* last look for lost answers */
	uint64_t *seen_access;        /* [n_slots]: each slot's last_access when touch_used last looked */
	uint32_t touch_cursor;        /* the slot touch_used looks at next */
	uint32_t n_slots;
	bool has_rm;              /* remote.cluster: the shared tier (remote actor) */
	struct kvr_ring *rm_req, *rm_rep;
	unsigned rm_actor;
	uint32_t rm_gen;
	bool write_back;          /* l2.mode "write-back": written when L1 must make room */
	bool read_only;           /* l2.read_only: nothing is ever written (write_back is false) */
};

/* The clock of every decision here (sent times, deadlines, lost answers): the actor loop's
 * `now` of the pass that runs us (kvr_actor.now_ns), so a stepped test sets the time. The
 * blocking sends below keep the real clock for their own deadline. */
static uint64_t now_of(const struct l2tier *t)
{
	return t->a->now_ns;
}

bool l2t_has(const struct l2tier *t, kvr_key key, unsigned lane)
{
	return t && l2set_has(&t->set, key, lane);
}

static unsigned route(const struct l2tier *t, kvr_key k)
{
	return kvr_key_disk(k, t->n_disks);
}

static int send_l2(struct l2tier *t, unsigned disk, unsigned type, uint64_t id, kvr_key k, unsigned lane,
		   uint32_t slot, uint32_t epoch)
{
	struct kvr_msg_l2 b = {.key_lo = k.lo, .key_hi = k.hi, .slot = slot, .epoch = epoch, .lane = (uint16_t)lane};
	struct kvr_msg m;
	kvr_msg_build(&m, type, 0, id, 0, type == KVR_MSG_L2_SYNC ? NULL : &b, type == KVR_MSG_L2_SYNC ? 0 : sizeof(b));
	/* nothing waits for room: the write queue retries, a promotion stalls (extend_more),
	 * an L2_SYNC is sent again from the tick (sync_disk). Quiet: a promotion sends a read
	 * per lane and block, and a wake each would hand the CPU to the disk actor per read
	 * where the two share one; l2t_wake wakes it once, at the end of the pass. */
	int rc = kvr_ring_try_enqueue_quiet(t->req[disk], &m);
	if (rc == 0)
		t->wake_due[disk] = true;
	return rc;
}

void l2t_wake(struct l2tier *t)
{
	for (unsigned d = 0; t && d < t->n_disks; d++)
		if (t->wake_due[d]) {
			t->wake_due[d] = false;
			kvr_ring_wake_consumer(t->req[d]);
		}
}

/* Ask disk d for its list (at start, after its restart); again from the tick while its ring is full. */
static void sync_disk(struct l2tier *t, unsigned d)
{
	t->sync_due[d] = send_l2(t, d, KVR_MSG_L2_SYNC, 0, (kvr_key){0, 0}, 0, 0, 0) != 0;
}

/* The eviction veto: a block with a lane in the write queue stays (its write must find it),
 * and with write-back a block may leave L1 only once every lane it holds is on disk. A lane
 * it does not hold (no rank stored it, or that store failed) has nothing to lose: waiting
 * for it on disk kept such half-stored blocks in L1 for good, until an L1 full of them
 * refused every store (demotion finds nothing left to write). */
static bool evict_veto_hook(void *ctx, kvr_key key, const uint32_t *lane_slots)
{
	struct l2tier *t = ctx;
	const unsigned lanes = kvr_slots_lanes_max(t->a->slots); /* NONE past the block's own */
	for (unsigned l = 0; l < lanes; l++)
		if (lane_slots[l] != KVR_SLOT_NONE && t->wq[lane_slots[l]].state != WQ_NONE)
			return false;
	if (!t->write_back)
		return true;
	for (unsigned l = 0; l < lanes; l++)
		if (lane_slots[l] != KVR_SLOT_NONE && !l2t_has(t, key, l))
			return false;
	return true;
}

/* ---- the write queue ---------------------------------------------------------------------- */

/* Lanes in the write queue (queued or sent) changed by d: the gauge follows at once, so
 * inspect and /metrics never show writes that are done. */
static void inflight_add(struct l2tier *t, int d)
{
	t->writes_inflight = (unsigned)((int)t->writes_inflight + d);
	atomic_store_explicit(&t->a->stats->c[KVR_STAT_LK_L2_WRITES_QUEUED], t->writes_inflight, memory_order_relaxed);
}

/* Append slot to disk d's FIFO (a slot is in at most one FIFO, once: only while QUEUED). */
static void wq_push(struct l2tier *t, unsigned d, uint32_t slot)
{
	struct wfifo *f = &t->fifo[d];
	t->wq[slot].next = KVR_SLOT_NONE;
	if (f->n++)
		t->wq[f->tail].next = slot;
	else
		f->head = slot;
	f->tail = slot;
}

/* Send what the disk actor's ring takes, in order. */
static void wq_pump(struct l2tier *t, unsigned d)
{
	struct wfifo *f = &t->fifo[d];
	struct kvr_slot_table *st = t->a->slots;
	while (f->n) {
		uint32_t s = f->head;
		const struct kvr_slot *sl = kvr_slot_at(st, s);
		if (t->wq[s].state == WQ_QUEUED) {
			if (kvr_slot_state(st, s) != KVR_SLOT_COMMITTED || kvr_slot_epoch(st, s) != t->wq[s].epoch) {
				/* cannot happen while the veto holds; never write another block's bytes */
				kvr_warn("l2 write of slot %u dropped: the slot changed while queued", s);
				kvr_actor_count(t->a, KVR_STAT_LK_L2_WRITES_SKIPPED, 1);
				t->wq[s].state = WQ_NONE;
				inflight_add(t, -1);
			} else if (send_l2(t, d, KVR_MSG_L2_WRITE, 0, sl->key, sl->lane, s, t->wq[s].epoch)) {
				return; /* ring full: the next WRITE_DONE or tick sends it */
			} else {
				t->wq[s].state = WQ_SENT;
				t->wq[s].sent_ns = now_of(t);
			}
		}
		f->head = t->wq[s].next;
		f->n--;
	}
}

static int cmp_commit_seq(const void *a, const void *b, void *arg)
{
	const struct kvr_slot_table *st = arg;
	uint32_t x = kvr_slot_at(st, *(const uint32_t *)a)->commit_seq, y = kvr_slot_at(st, *(const uint32_t *)b)->commit_seq;
	return x < y ? -1 : x > y;
}

/* Disk actor d died: what it had taken off its ring is lost. Queue every unanswered write
 * of d again, in commit order (the successor answers duplicates PRESENT). */
static void wq_requeue(struct l2tier *t, unsigned d)
{
	struct kvr_slot_table *st = t->a->slots;
	uint32_t n = 0, *order = t->requeue;
	for (uint32_t s = 0; s < t->n_slots; s++)
		if (t->wq[s].state != WQ_NONE && route(t, kvr_slot_at(st, s)->key) == d)
			order[n++] = s;
	qsort_r(order, n, sizeof(*order), cmp_commit_seq, st);
	t->fifo[d].n = 0;
	for (uint32_t i = 0; i < n; i++) {
		t->wq[order[i]].state = WQ_QUEUED;
		wq_push(t, d, order[i]);
	}
	if (n)
		kvr_warn("disk.%u restarted: %u unanswered L2 writes queued again", d, n);
}

int l2t_open(struct kvr_actor *a, struct kvr_index *idx, struct l2tier **ret)
{
	*ret = NULL;
	unsigned n = a->cfg.l2.n_dirs;
	if (!n && !a->cfg.remote.n_cluster)
		return 0;
	if (n > L2T_MAX_DISKS)
		return -EINVAL;
	struct l2tier *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->a = a;
	t->idx = idx;
	t->n_disks = n;
	t->read_only = a->cfg.l2.read_only;
	/* read-only: no demotion and no eviction veto; an evicted block is on disk or gone */
	t->write_back = n && !t->read_only && a->cfg.l2.write_back;
	/* requesters: worker slots, then one per (scheduler slot, lane): a lease promotes
	 * every lane at once, each through its own entry (L2T_LEASE_REQUESTER) */
	t->n_workers = a->ctl->max_workers + a->ctl->max_schedulers * kvr_slots_lanes_max(a->slots);
	t->n_slots = a->slots->n_slots;
	t->pend = calloc(t->n_workers, sizeof(*t->pend));
	t->wq = calloc(t->n_slots, sizeof(*t->wq));
	t->requeue = calloc(t->n_slots, sizeof(*t->requeue));
	/* nothing to keep fresh on disks we never write (read-only) or without disks */
	t->seen_access = n && !t->read_only ? calloc(t->n_slots, sizeof(*t->seen_access)) : NULL;
	if (!t->pend || !t->wq || !t->requeue || (n && !t->read_only && !t->seen_access) || l2set_open(&t->set)) {
		l2t_close(t);
		return -ENOMEM;
	}
	if (!t->read_only)
		kvr_index_set_evict_hook(idx, evict_veto_hook, t);
	for (unsigned d = 0; d < n; d++) {
		t->req[d] = kvr_actor_ring_w(a, KVR_RING_DISK_REQ, d);
		t->rep[d] = kvr_actor_ring_w(a, KVR_RING_DISK_REP, d);
		t->disk_actor[d] = KVR_ACTOR_IX_DISK(a->ctl->max_workers, d);
		if (!t->req[d] || !t->rep[d] || t->disk_actor[d] >= a->ctl->max_actors) {
			l2t_close(t);
			return -ENOENT;
		}
		t->disk_gen[d] = atomic_load(&kvr_ctl_actor(a->ctl, t->disk_actor[d])->generation);
		sync_disk(t, d);
	}
	if (a->cfg.remote.n_cluster) {
		t->has_rm = true;
		t->rm_req = kvr_actor_ring(a, KVR_RING_REMOTE_REQ);
		t->rm_rep = kvr_actor_ring(a, KVR_RING_REMOTE_REP);
		t->rm_actor = KVR_ACTOR_IX_REMOTE(a->ctl->max_workers, n);
		if (!t->rm_req || !t->rm_rep || t->rm_actor >= a->ctl->max_actors ||
		    kvr_ctl_actor(a->ctl, t->rm_actor)->kind != KVR_ACTOR_REMOTE) {
			l2t_close(t);
			return -ENOENT;
		}
		t->rm_gen = atomic_load(&kvr_ctl_actor(a->ctl, t->rm_actor)->generation);
	}
	/* Learn what the disks hold before we serve (we are not ready yet: kvringd admits no
	 * worker), so the first lookups after a restart already see L2. Adoption of a large
	 * directory takes a while: wait up to most of the ready timeout, then serve anyway
	 * (the rest of the answer is taken in as it comes). */
	uint64_t ready_ns = (uint64_t)a->cfg.supervisor.ready_timeout_ms * 1000000ull;
	uint64_t deadline = kvr_now_ns() + (ready_ns > 1000000000ull ? ready_ns - 1000000000ull : ready_ns / 2);
	for (unsigned d = 0; d < n; d++) {
		while (!t->synced[d] && kvr_now_ns() < deadline && !a->stopping) {
			struct kvr_msg m;
			struct l2t_done unused;
			if (t->sync_due[d])
				sync_disk(t, d);
			if (kvr_ring_dequeue(t->rep[d], &m, 50000000) == 0)
				(void)l2t_on_msg(t, t->rep[d], &m, &unused);
		}
		if (!t->synced[d])
			kvr_warn("disk.%u has not listed its blocks yet: serving, L2 hits follow as it does", d);
	}
	*ret = t;
	return 0;
}

void l2t_close(struct l2tier *t)
{
	if (!t)
		return;
	for (unsigned w = 0; t->pend && w < t->n_workers; w++) {
		free(t->pend[w].refs);
		free(t->pend[w].state);
		free(t->pend[w].pinned);
	}
	free(t->pend);
	free(t->wq);
	free(t->requeue);
	free(t->seen_access);
	free(t->reads);
	l2set_close(&t->set);
	free(t);
}

static void write_lane(struct l2tier *t, kvr_key key, uint32_t slot, uint32_t epoch);
static void write_through_missing(struct l2tier *t, unsigned d);
static int lost_answers(struct l2tier *t, uint64_t now, struct l2t_done *done);

/* Write-through to the shared tier: the remote actor copies the slot under its own pin
 * and drops the write if the slot changed meanwhile; no answer comes back. */
static void rm_write(struct l2tier *t, kvr_key key, unsigned lane, uint32_t slot, uint32_t epoch)
{
	struct kvr_msg_l2 b = {.key_lo = key.lo, .key_hi = key.hi, .slot = slot, .epoch = epoch, .lane = (uint16_t)lane};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_L2_WRITE, 0, 0, 0, &b, sizeof(b));
	bool sent = kvr_ring_try_enqueue(t->rm_req, &m) == 0;
	kvr_actor_count(t->a, sent ? KVR_STAT_LK_RM_WRITES : KVR_STAT_LK_RM_WRITES_SKIPPED, 1);
}

/* The slot's last use is one its file on disk already reflects (touch_used skips it). */
static void seen_now(struct l2tier *t, uint32_t slot)
{
	if (t->seen_access && slot < t->n_slots)
		t->seen_access[slot] = kvr_slot_at(t->a->slots, slot)->last_access;
}

void l2t_committed(struct l2tier *t, kvr_key key, unsigned lane, uint32_t slot, uint32_t epoch)
{
	if (!t)
		return;
	if (t->has_rm)
		rm_write(t, key, lane, slot, epoch);
	if (!t->n_disks || t->write_back || t->read_only || l2t_has(t, key, lane))
		return; /* on disk already: touch_used moves its file to the recent end */
	seen_now(t, slot); /* its write makes the newest file: no touch for this commit */
	write_lane(t, key, slot, epoch);
}

static void write_lane(struct l2tier *t, kvr_key key, uint32_t slot, uint32_t epoch)
{
	if (!t->n_disks || t->read_only || slot >= t->n_slots)
		return; /* the only sender of L2_WRITE: nothing is written in read-only mode */
	if (t->wq[slot].state != WQ_NONE)
		return; /* queued already (the slot cannot have changed: the veto keeps it) */
	/* No pin: the queue entry vetoes the eviction of this block (we are the evictor), and
	 * the disk actor pins the slot itself for the time its I/O is in flight. */
	t->wq[slot].state = WQ_QUEUED;
	t->wq[slot].epoch = epoch;
	inflight_add(t, 1);
	unsigned d = route(t, key);
	wq_push(t, d, slot);
	wq_pump(t, d);
}

unsigned l2t_writes_inflight(const struct l2tier *t)
{
	return t ? t->writes_inflight : 0;
}

unsigned l2t_demote(struct l2tier *t, unsigned want)
{
	if (!t || !t->write_back || !want)
		return 0;
	/* the `want` least recently used committed, unpinned lanes not on disk yet */
	enum { MAXD = 64 };
	uint32_t pick[MAXD];
	unsigned n = 0;
	if (want > MAXD)
		want = MAXD;
	struct kvr_slot_table *st = t->a->slots;
	for (uint32_t i = 0; i < st->n_slots; i++) {
		struct kvr_slot *s = kvr_slot_at(st, i);
		if (kvr_slot_state(st, i) != KVR_SLOT_COMMITTED || kvr_slot_pins(st, i) || t->wq[i].state != WQ_NONE ||
		    l2t_has(t, s->key, s->lane))
			continue;
		if (n < want) {
			pick[n++] = i;
			continue;
		}
		unsigned newest = 0; /* replace the most recent pick if this one is older */
		for (unsigned k = 1; k < n; k++)
			if (kvr_slot_at(st, pick[k])->last_access > kvr_slot_at(st, pick[newest])->last_access)
				newest = k;
		if (s->last_access < kvr_slot_at(st, pick[newest])->last_access)
			pick[newest] = i;
	}
	for (unsigned k = 0; k < n; k++) {
		struct kvr_slot *s = kvr_slot_at(st, pick[k]);
		write_lane(t, s->key, pick[k], kvr_slot_epoch(st, pick[k]));
	}
	return n;
}

static int read_new(struct l2tier *t, uint32_t *ret)
{
	for (uint32_t i = 0; i < t->n_reads; i++)
		if (!t->reads[i].used) {
			*ret = i;
			return 0;
		}
	if (KVR_GROW(t->reads, t->cap_reads, t->n_reads + 1, 256))
		return -ENOMEM;
	*ret = t->n_reads++;
	return 0;
}

static bool pend_grow(struct pend *p, uint32_t n)
{
	if (n <= p->cap)
		return true;
	struct kvr_index_ref *r = realloc(p->refs, n * sizeof(*r));
	if (r)
		p->refs = r;
	uint8_t *s = realloc(p->state, n);
	if (s)
		p->state = s;
	uint8_t *pn = realloc(p->pinned, n);
	if (pn)
		p->pinned = pn;
	if (!r || !s || !pn)
		return false;
	p->cap = n;
	return true;
}

/* Every lane of block key in L1 (committed) or on disk? */
static bool all_lanes_available(struct l2tier *t, kvr_key key, const struct kvr_index_block *b, bool have,
				unsigned lanes)
{
	for (unsigned l = 0; l < lanes; l++) {
		bool in_l1 = have && (b->commit_mask >> l & 1);
		if (!in_l1 && !l2t_has(t, key, l))
			return false;
	}
	return true;
}

static void unpin_all(struct l2tier *t, struct pend *p)
{
	for (uint32_t i = 0; i < p->n; i++)
		if (p->pinned[i]) {
			(void)kvr_slot_unpin(t->a->slots, p->refs[i].slot, KVR_PIN_LOOKUP);
			p->pinned[i] = 0;
		}
}

void l2t_cancel(struct l2tier *t, unsigned worker)
{
	if (!t || worker >= t->n_workers || !t->pend[worker].active)
		return;
	unpin_all(t, &t->pend[worker]);
	t->pend[worker].active = t->pend[worker].stalled = false;
}


/* The generation of the actor a read goes to, as it is now: not the one l2t_tick last
 * saw. The lookup actor starts before the disk and remote actors, so a read sent before
 * its first tick noticed them would otherwise carry generation 0 and be aborted by that
 * tick as if its actor had died (a short prefix, a slot read into for nothing). */
static uint32_t gen_now(const struct l2tier *t, unsigned actor)
{
	return atomic_load(&kvr_ctl_actor(t->a->ctl, actor)->generation);
}

static int rm_send_read(struct l2tier *t, uint64_t id, kvr_key k, unsigned lane, uint32_t slot, uint32_t epoch)
{
	struct kvr_msg_l2 b = {.key_lo = k.lo, .key_hi = k.hi, .slot = slot, .epoch = epoch, .lane = (uint16_t)lane};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_L2_READ, 0, id, 0, &b, sizeof(b));
	/* never waits: a full ring means the remote actor is saturated; the block is then a
	 * miss (the prefix ends here) rather than a lookup held up for every worker */
	return kvr_ring_try_enqueue(t->rm_req, &m);
}

/* Promote blocks of worker's lookup from p->n on: a block whose lanes are all in L1 or on
 * disk continues the prefix; the requester's lane is read from disk into a slot of its own.
 * Stops at the first block that cannot be had. With write-back, a full L1 first writes its
 * least recent blocks out: the promotion stalls until they are on disk (l2t_on_msg retries).
 * A read that finds its ring full stalls the promotion too (never a wait in the send, which
 * held up every worker's lookup, never a prefix cut short by a busy disk) until
 * timeouts.alloc_wait_ms after the lookup began. */
/* Requester `worker` as a client (clients.h): a worker, or the scheduler of a lease's lane
 * (L2T_LEASE_REQUESTER, over the table's most lanes a block). Its model, block size and
 * lanes tag the slots it is promoted into (lk_client_tag). */
static unsigned requester(const struct l2tier *t, unsigned worker)
{
	unsigned mw = t->a->ctl->max_workers;
	return worker < mw ? worker : mw + (worker - mw) / kvr_slots_lanes_max(t->a->slots);
}

static void extend_more(struct l2tier *t, unsigned worker)
{
	struct pend *p = &t->pend[worker];
	const struct kvr_slot_tag tag = lk_client_tag(t->a, requester(t, worker));
	unsigned lanes = tag.lanes, lane = p->lane;
	p->stalled = false;
	while (p->n < p->total) {
		uint32_t i = p->n;
		kvr_key key = p->keys[i];
		struct kvr_index_block b;
		bool have = kvr_index_get(t->idx, key, &b) == 0;
		bool in_l1 = have && (b.commit_mask >> lane & 1);
		/* not every lane in L1 or L2: the shared tier may have the block (it checks every
		 * lane), read ahead at most the window (rm_window); else the prefix ends here */
		bool from_rm = !all_lanes_available(t, key, &b, have, lanes);
		if (from_rm && (!t->has_rm || in_l1))
			break;
		if (from_rm && p->rm_waiting >= p->rm_window)
			return; /* goes on when one of them is answered (read_ended) */
		if (in_l1) {
			uint32_t sl = b.slot[lane];
			p->refs[i] = (struct kvr_index_ref){.slot = sl, .epoch = kvr_slot_epoch(t->a->slots, sl)};
			p->state[i] = B_OK;
			p->pinned[i] = kvr_slot_pin(t->a->slots, sl, p->refs[i].epoch, KVR_PIN_LOOKUP) == 0;
			p->n++;
			continue;
		}
		struct kvr_index_ref r;
		struct kvr_index_alloc_stats st = {0};
		/* the promotion slot is the lookup actor's, not the worker's: a worker that dies or
		 * resets its storer cannot free a slot an L2 read is filling */
		if (kvr_index_alloc_tagged(t->idx, &key, 1, lane, &tag, KVR_SLOT_OWNER_LOOKUP, &r, &st) ||
		    r.slot == KVR_INDEX_PRESENT) {
			p->why = KVR_MISS_IN_FLIGHT; /* PRESENT: a store or promotion holds this lane */
			break;
		}
		kvr_actor_count(t->a, KVR_STAT_LK_EVICTED, st.evicted);
		if (r.slot == KVR_INDEX_NOROOM) {
			if (t->write_back && now_of(t) < p->deadline &&
			    (t->writes_inflight || l2t_demote(t, p->total - i))) {
				p->stalled = true;
				return;
			}
			p->why = KVR_MISS_NO_ROOM;
			break;
		}
		uint32_t ri;
		if (read_new(t, &ri)) {
			(void)kvr_index_abort(t->idx, r.slot, r.epoch);
			p->why = KVR_MISS_NO_ROOM; /* every read entry in use */
			break;
		}
		unsigned d = from_rm ? RM_DISK : route(t, key);
		struct read *rd = &t->reads[ri];
		*rd = (struct read){.used = true, .rseq = ++t->rseq, .worker = worker, .lane = lane, .pseq = p->seq,
				    .block = i, .slot = r.slot, .epoch = r.epoch, .disk = d,
				    .disk_gen = gen_now(t, from_rm ? t->rm_actor : t->disk_actor[d]), .sent_ns = now_of(t)};
		uint64_t id = (uint64_t)rd->rseq << 32 | ri;
		int src = from_rm ? rm_send_read(t, id, key, lane, r.slot, r.epoch)
				  : send_l2(t, d, KVR_MSG_L2_READ, id, key, lane, r.slot, r.epoch);
		if (src) {
			rd->used = false;
			(void)kvr_index_abort(t->idx, r.slot, r.epoch);
			if (src == -EAGAIN && now_of(t) < p->deadline) {
				kvr_actor_count(t->a, KVR_STAT_LK_L2_RING_STALLS, 1);
				p->stalled = true; /* the ring is full: go on when there is room */
				return;
			}
			p->why = KVR_MISS_L2_FAILED; /* the tier's ring stayed full */
			break;
		}
		p->refs[i] = r;
		p->state[i] = B_WAIT;
		p->pinned[i] = 0;
		p->waiting++;
		p->rm_waiting += from_rm;
		p->n++;
	}
	p->total = p->n; /* nothing more to extend to */
}

int l2t_extend(struct l2tier *t, unsigned worker, uint64_t wire, unsigned lane, const kvr_key *keys, uint32_t total,
	       uint32_t matched, struct kvr_index_ref *refs, uint64_t index_ns)
{
	if (!t || matched >= total || worker >= t->n_workers)
		return (int)matched;
	struct pend *p = &t->pend[worker];
	/* a previous lookup still waiting: its client gave up; its reads finish on their own */
	l2t_cancel(t, worker);
	if (!pend_grow(p, total))
		return (int)matched;
	p->seq = ++t->pseq;
	p->wire = wire;
	p->lane = lane;
	p->keys = keys;
	p->total = total;
	p->n = matched;
	p->waiting = 0;
	p->rm_waiting = 0;
	p->rm_window = 1;
	p->index_ns = index_ns;
	p->why = KVR_MISS_NONE;
	p->deadline = now_of(t) + kvr_ms_to_ns(t->a->cfg.timeouts.alloc_wait_ms);
	memcpy(p->refs, refs, (size_t)matched * sizeof(*refs));
	memset(p->state, B_OK, matched);
	/* the L1 prefix too must survive the allocations of its promotions */
	for (uint32_t i = 0; i < matched; i++)
		p->pinned[i] = kvr_slot_pin(t->a->slots, refs[i].slot, refs[i].epoch, KVR_PIN_LOOKUP) == 0;
	extend_more(t, worker);
	if (!p->waiting && !p->stalled) { /* everything decided at once */
		memcpy(refs, p->refs, (size_t)p->n * sizeof(*refs));
		unpin_all(t, p);
		return (int)p->n;
	}
	p->active = true;
	return -EINPROGRESS;
}

static void finish(struct l2tier *t, unsigned w, struct l2t_done *done)
{
	struct pend *p = &t->pend[w];
	/* the reply goes out right after this, before any other allocation can evict */
	unpin_all(t, p);
	uint32_t m = 0, promoted = 0;
	while (m < p->n && (p->state[m] == B_OK || p->state[m] == B_PROMOTED))
		promoted += p->state[m++] == B_PROMOTED;
	p->active = false;
	uint8_t why = m < p->n && p->state[m] == B_FAIL ? KVR_MISS_L2_FAILED : p->why;
	*done = (struct l2t_done){.worker = w, .wire = p->wire, .lane = p->lane, .matched = m, .promoted = promoted,
				  .refs = p->refs, .index_ns = p->index_ns, .why = why};
}

/* A read ended (status 0: verified bytes in the slot). Returns 1 when its promotion finished. */
/*
 * A read was answered, so its request ring has room: every other promotion that stalled on
 * a full ring goes on now, not from the next tick (100 ms later). The lanes of a lease
 * promote at once, each through its own requester: without this, the lane that found the
 * ring filled by its sibling's reads waited for the tick, and a lease from L2 took 2-3x
 * longer than lane after lane. A promotion that so ends with nothing in flight is finished
 * by the tick (it answers one requester per call).
 */
static void resume_stalled(struct l2tier *t, unsigned except)
{
	for (unsigned w = 0; w < t->n_workers; w++) {
		struct pend *q = &t->pend[w];
		if (w != except && q->active && q->stalled && q->n < q->total)
			extend_more(t, w);
	}
}

static int read_ended(struct l2tier *t, uint32_t ri, int status, struct l2t_done *done)
{
	const struct read rd = t->reads[ri]; /* a copy: extend_more below may reuse the entry */
	bool ok = false, rm = rd.disk == RM_DISK;
	if (status == 0) {
		ok = kvr_index_commit(t->idx, rd.lane, rd.slot, rd.epoch) >= 0;
		kvr_actor_count(t->a, rm ? (ok ? KVR_STAT_LK_RM_READS : KVR_STAT_LK_RM_READ_FAILS)
				       : (ok ? KVR_STAT_LK_L2_READS : KVR_STAT_LK_L2_READ_FAILS), 1);
	} else {
		(void)kvr_index_abort(t->idx, rd.slot, rd.epoch);
		kvr_actor_count(t->a, rm ? KVR_STAT_LK_RM_READ_FAILS : KVR_STAT_LK_L2_READ_FAILS, 1);
	}
	t->reads[ri].used = false;
	if (ok && !rm) {
		seen_now(t, rd.slot); /* the read made its file the newest: no touch for it */
		/* promoted for a requester of this model: a file adopted at start is now known to be its */
		const struct kvr_slot *s = kvr_slot_at(t->a->slots, rd.slot);
		l2set_add(&t->set, s->key, rd.lane, s->model);
	}
	if (ok && rm) { /* from the shared tier: keep it on this node's disk too */
		const struct kvr_slot *s = kvr_slot_at(t->a->slots, rd.slot);
		if (!t->write_back && !l2t_has(t, s->key, rd.lane))
			write_lane(t, s->key, rd.slot, rd.epoch);
	}
	struct pend *p = &t->pend[rd.worker];
	if (!p->active || p->seq != rd.pseq || rd.block >= p->n || p->state[rd.block] != B_WAIT)
		return 0;
	p->state[rd.block] = ok ? B_PROMOTED : B_FAIL;
	if (ok)
		p->pinned[rd.block] = kvr_slot_pin(t->a->slots, rd.slot, rd.epoch, KVR_PIN_LOOKUP) == 0;
	p->waiting--;
	if (rm) {
		p->rm_waiting--;
		if (!ok) {
			p->total = p->n; /* nothing past a block the cluster lacks can count */
		} else if (p->n < p->total && !p->stalled) {
			p->rm_window = p->rm_window * 2 > L2T_RM_WINDOW ? L2T_RM_WINDOW : p->rm_window * 2;
			extend_more(t, rd.worker); /* the window moved: read further ahead */
		}
	}
	if (p->stalled && p->n < p->total)
		extend_more(t, rd.worker); /* an answer taken off a ring: room for the next read */
	resume_stalled(t, rd.worker);
	if (p->waiting || p->stalled)
		return 0;
	finish(t, rd.worker, done);
	return 1;
}

/* A READ_DONE of disk d or of the shared tier (d == RM_DISK). */
static int on_read_done(struct l2tier *t, unsigned d, const struct kvr_msg *m, const struct kvr_msg_l2 *b,
			struct l2t_done *done)
{
	uint32_t ri = (uint32_t)m->hdr.req_id;
	if (ri >= t->n_reads || !t->reads[ri].used || t->reads[ri].rseq != (uint32_t)(m->hdr.req_id >> 32) ||
	    t->reads[ri].slot != b->slot || t->reads[ri].epoch != b->epoch || t->reads[ri].disk != d)
		return 0; /* a read we already gave up on */
	if (d != RM_DISK && (b->flags & KVR_L2F_GONE))
		l2set_del(&t->set, (kvr_key){b->key_lo, b->key_hi}, b->lane); /* missing or bad on disk: not there any more */
	return read_ended(t, ri, b->status, done) ? 2 : 0;
}

int l2t_on_msg(struct l2tier *t, struct kvr_ring *ring, const struct kvr_msg *m, struct l2t_done *done)
{
	if (!t)
		return 1;
	if (t->has_rm && ring == t->rm_rep) {
		struct kvr_msg_l2 b;
		if (kvr_msg_decode_l2(m, 0, &b) || m->hdr.type != KVR_MSG_L2_READ_DONE)
			return -EBADMSG; /* the remote actor answers reads only */
		return on_read_done(t, RM_DISK, m, &b, done);
	}
	unsigned d;
	for (d = 0; d < t->n_disks && ring != t->rep[d]; d++)
		;
	if (d == t->n_disks)
		return 1;
	struct kvr_msg_l2 b;
	if (kvr_msg_decode_l2(m, 0, &b))
		return -EBADMSG;
	kvr_key k = {.lo = b.key_lo, .hi = b.key_hi};
	switch (m->hdr.type) {
	case KVR_MSG_L2_HAVE:
		if (b.lane != NO_LANE)
			l2set_add(&t->set, k, b.lane, L2SET_UNKNOWN); /* files say nothing of their model */
		if (b.flags & KVR_L2F_LAST) {
			t->synced[d] = true;
			kvr_info("disk.%u synced: %u block lanes on disk in all", d, t->set.n);
			write_through_missing(t, d);
		}
		return 0;
	case KVR_MSG_L2_GONE:
		l2set_del(&t->set, k, b.lane);
		kvr_index_remember_gone(t->idx, k); /* a later miss says "evicted", not "never stored" */
		return 0;
	case KVR_MSG_L2_WRITE_DONE: {
		bool ours = b.slot < t->n_slots && t->wq[b.slot].state == WQ_SENT && t->wq[b.slot].epoch == b.epoch;
		if (ours) {
			t->wq[b.slot].state = WQ_NONE;
			inflight_add(t, -1);
		}
		wq_pump(t, d);
		if (b.status == 0) {
			/* the slot still holds what we wrote (the veto kept it): its model is the lane's */
			l2set_add(&t->set, k, b.lane, ours ? kvr_slot_at(t->a->slots, b.slot)->model : L2SET_UNKNOWN);
			kvr_actor_count(t->a, KVR_STAT_LK_L2_WRITES, ours ? 1 : 0);
		} else if (ours) {
			kvr_actor_count(t->a, KVR_STAT_LK_L2_WRITE_FAILS, 1);
		} /* else the answer to a write sent twice (after a disk actor restart) or by our
		   * predecessor: the write that counts was answered already */
		/* room may have freed: promotions that waited for it go on */
		for (unsigned w = 0; w < t->n_workers; w++) {
			struct pend *p = &t->pend[w];
			if (!p->active || !p->stalled)
				continue;
			extend_more(t, w);
			if (!p->stalled && !p->waiting) {
				finish(t, w, done);
				return 2; /* one per message; l2t_tick finishes any other */
			}
		}
		return 0;
	}
	case KVR_MSG_L2_READ_DONE:
		return on_read_done(t, d, m, &b, done);
	default:
		return -EBADMSG;
	}
}

unsigned l2t_last_why(const struct l2tier *t, unsigned worker)
{
	return t && worker < t->n_workers ? t->pend[worker].why : KVR_MISS_NONE;
}

/*
 * Whether the actor whose generation we last saw as `seen` and now see as `now` may have
 * taken messages off its ring that no incarnation will answer. kvringd bumps a generation
 * when it spawns the actor, and it spawns the lookup actor before the tiers: a lookup actor
 * that read 0 then sees the first incarnation (1) start — that one reads everything we sent
 * from the beginning of its ring, nothing is lost. Taken for a restart, the first start
 * re-synced the whole directory (every L2_HAVE twice: a test counted 194 answers for 97)
 * and failed promotions in flight with -EPIPE.
 */
static bool gen_lost_messages(uint32_t seen, uint32_t now)
{
	return now != seen && !(seen == 0 && now == 1);
}

/*
 * L2's LRU follows the reads it serves, and a lane used in L1 is never read from L2: on its
 * own, the file of a prefix hot in L1 would age on disk and be among the first evicted — the
 * hottest prefixes the ones a restart (L1 starts empty) no longer finds. So each tick looks
 * at the next L2T_TOUCH_WINDOW slots of the table: a committed lane hit or committed again
 * since the last look (its last_access moved) whose file is on disk is sent as an L2_TOUCH
 * (the disk actor moves the file to the recent end; no answer). Off the lookup path: a hit
 * costs nothing more than its last_access stamp; a table of 1M slots is gone through in 25 s
 * at 10 ticks a second. A full disk ring ends the look; it goes on from there next tick.
 */
#define L2T_TOUCH_WINDOW 4096u

static void touch_used(struct l2tier *t)
{
	if (!t->seen_access)
		return;
	struct kvr_slot_table *st = t->a->slots;
	for (uint32_t k = 0; k < L2T_TOUCH_WINDOW && k < t->n_slots; k++) {
		uint32_t s = t->touch_cursor;
		const struct kvr_slot *sl = kvr_slot_at(st, s);
		if (kvr_slot_state(st, s) == KVR_SLOT_COMMITTED && sl->last_access != t->seen_access[s]) {
			if (l2t_has(t, sl->key, sl->lane)) {
				if (send_l2(t, route(t, sl->key), KVR_MSG_L2_TOUCH, 0, sl->key, sl->lane, 0, 0))
					return;
				kvr_actor_count(t->a, KVR_STAT_LK_L2_TOUCHES, 1);
			}
			t->seen_access[s] = sl->last_access;
		}
		t->touch_cursor = s + 1 < t->n_slots ? s + 1 : 0;
	}
}

int l2t_tick(struct l2tier *t, struct l2t_done *done)
{
	if (!t)
		return 0;
	uint64_t now = now_of(t);
	for (unsigned w = 0; w < t->n_workers; w++) {
		struct pend *p = &t->pend[w];
		if (!p->active)
			continue;
		if (p->stalled && now >= p->deadline) {
			p->stalled = false; /* no room came: answer what we have */
			p->total = p->n;
		} else if (p->stalled) {
			extend_more(t, w);
		}
		if (!p->stalled && !p->waiting) {
			finish(t, w, done);
			return 1;
		}
	}
	for (unsigned d = 0; d < t->n_disks; d++) {
		struct kvr_actor_ent *e = kvr_ctl_actor(t->a->ctl, t->disk_actor[d]);
		uint32_t gen = atomic_load(&e->generation);
		if (gen != t->disk_gen[d] && !gen_lost_messages(t->disk_gen[d], gen)) {
			t->disk_gen[d] = gen; /* its first start */
		} else if (gen != t->disk_gen[d]) {
			/* It died: what it had taken off its ring will never be answered. Its reads
			 * are aborted now: a slot it may still be reading into keeps its I/O pin and
			 * waits in DRAINING until the successor released its predecessor's pins, so
			 * nothing is reused early. Its writes are sent again. */
			t->disk_gen[d] = gen;
			t->synced[d] = false;
			wq_requeue(t, d);
			sync_disk(t, d);
			for (uint32_t i = 0; i < t->n_reads; i++) {
				struct read *rd = &t->reads[i];
				if (rd->used && rd->disk == d && gen_lost_messages(rd->disk_gen, gen) &&
				    read_ended(t, i, -EPIPE, done))
					return 1;
			}
		}
		if (t->sync_due[d])
			sync_disk(t, d);
		wq_pump(t, d);
	}
	if (t->has_rm) {
		uint32_t gen = atomic_load(&kvr_ctl_actor(t->a->ctl, t->rm_actor)->generation);
		if (gen != t->rm_gen && !gen_lost_messages(t->rm_gen, gen)) {
			t->rm_gen = gen; /* its first start */
		} else if (gen != t->rm_gen) {
			/* the remote actor died: its reads are aborted (a slot it may still have been
			 * copying into keeps its remote pin, DRAINING, until the successor drops it) */
			t->rm_gen = gen;
			for (uint32_t i = 0; i < t->n_reads; i++) {
				struct read *rd = &t->reads[i];
				if (rd->used && rd->disk == RM_DISK && gen_lost_messages(rd->disk_gen, gen) &&
				    read_ended(t, i, -EPIPE, done))
					return 1;
			}
		}
	}
	touch_used(t);
	if (t->n_disks)
		lk_models_publish_l2(t->a, t->set.by_model, L2SET_UNKNOWN);
	return lost_answers(t, now, done);
}

/* Whether a request sent at sent_ns is unanswered for timeouts.l2_answer_ms at now. A
 * request sent after `now` was read (the tick's clock is taken before the pass sends what
 * a restart queued again) is not: without the check, now - sent_ns wraps and every such
 * write was sent a second time, whose PRESENT answer then came before the real one. */
static bool overdue(const struct l2tier *t, uint64_t sent_ns, uint64_t now)
{
	return now > sent_ns && now - sent_ns >= kvr_ms_to_ns(t->a->cfg.timeouts.l2_answer_ms);
}

/* Reads and writes whose answer never came (timeouts.l2_answer_ms), once a second. */
static int lost_answers(struct l2tier *t, uint64_t now, struct l2t_done *done)
{
	if (now - t->last_scan_ns < ANSWER_SCAN_NS)
		return 0;
	t->last_scan_ns = now;
	for (uint32_t i = 0; i < t->n_reads; i++) {
		struct read *rd = &t->reads[i];
		if (!rd->used || !overdue(t, rd->sent_ns, now))
			continue;
		kvr_actor_count(t->a, KVR_STAT_LK_L2_ANSWERS_LOST, 1);
		kvr_warn("disk.%u: the L2 read of slot %u unanswered for %u ms: given up (its answer was lost)", rd->disk,
			 rd->slot, t->a->cfg.timeouts.l2_answer_ms);
		if (read_ended(t, i, -ETIMEDOUT, done)) {
			t->last_scan_ns = 0; /* one promotion finished per call: look again at once */
			return 1;
		}
	}
	bool again[L2T_MAX_DISKS] = {false};
	for (uint32_t s = 0; s < t->n_slots; s++) {
		if (t->wq[s].state != WQ_SENT || !overdue(t, t->wq[s].sent_ns, now))
			continue;
		unsigned d = route(t, kvr_slot_at(t->a->slots, s)->key);
		t->wq[s].state = WQ_QUEUED;
		wq_push(t, d, s);
		again[d] = true;
		kvr_actor_count(t->a, KVR_STAT_LK_L2_ANSWERS_LOST, 1);
	}
	for (unsigned d = 0; d < t->n_disks; d++)
		if (again[d]) {
			kvr_warn("disk.%u: L2 writes unanswered for %u ms: sent again", d, t->a->cfg.timeouts.l2_answer_ms);
			wq_pump(t, d);
		}
	return 0;
}

/* Write-through: after a sync (our start, or the disk actor's restart) every committed lane
 * routed to disk d that is not on disk is written — writes a lookup actor that died had
 * queued are not lost. */
static void write_through_missing(struct l2tier *t, unsigned d)
{
	if (t->write_back || t->read_only)
		return;
	struct kvr_slot_table *st = t->a->slots;
	unsigned n = 0;
	for (uint32_t s = 0; s < t->n_slots; s++) {
		const struct kvr_slot *sl = kvr_slot_at(st, s);
		if (kvr_slot_state(st, s) != KVR_SLOT_COMMITTED || route(t, sl->key) != d || t->wq[s].state != WQ_NONE ||
		    l2t_has(t, sl->key, sl->lane))
			continue;
		write_lane(t, sl->key, s, kvr_slot_epoch(st, s));
		n++;
	}
	if (n)
		kvr_info("disk.%u: %u committed lanes not on disk written through", d, n);
}
