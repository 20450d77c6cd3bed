/* The lookup actor's side of L2: the on-disk set, write-through, and promotions with deferred replies. */
#include "l2tier.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_slots.h"
#include "kvr_time.h"

#define SEND_TIMEOUT_NS (2ull * 1000000000ull)
#define NO_LANE 0xffffu

enum { B_OK = 0, B_WAIT = 1, B_FAIL = 2, B_PROMOTED = 3 }; /* per block of a promotion */

/* (key, lane) set: open addressing, linear probing, tombstones. */
struct l2ent {
	uint64_t lo, hi;
	uint16_t lane;
	uint8_t used, dead;
};

struct pend {                 /* one promotion per worker (its client's lookup is synchronous) */
	bool active;
	uint32_t seq;
	uint64_t wire;
	unsigned lane;
	uint32_t n;               /* blocks the reply may cover */
	uint32_t waiting;
	struct kvr_index_ref *refs;
	uint8_t *state;
	uint32_t cap;
	uint64_t index_ns;
};

struct read {                 /* an L2_READ in flight */
	bool used;
	uint32_t rseq;
	unsigned worker, lane;
	uint32_t pseq, block;
	uint32_t slot, epoch;
	unsigned disk;
	uint32_t disk_gen;
	bool orphan;              /* its disk actor died: abort once its successor drained */
};

struct l2tier {
	struct kvr_actor *a;
	struct kvr_index *idx;
	unsigned n_disks;
	struct kvr_ring *req[L2T_MAX_DISKS], *rep[L2T_MAX_DISKS];
	unsigned disk_actor[L2T_MAX_DISKS];
	uint32_t disk_gen[L2T_MAX_DISKS];
	bool synced[L2T_MAX_DISKS];   /* the answer to our last L2_SYNC is complete */
	struct l2ent *set;
	uint32_t set_cap, set_n, set_dead;
	struct pend *pend;
	unsigned n_workers;
	struct read *reads;
	uint32_t n_reads, cap_reads, rseq;
	uint32_t pseq;
	unsigned writes_inflight;
};

static uint64_t mix(kvr_key k, unsigned lane)
{
	uint64_t h = k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)lane << 48);
	h ^= h >> 31;
	return h * 0xbf58476d1ce4e5b9ull;
}

static struct l2ent *set_find(const struct l2tier *t, kvr_key k, unsigned lane, bool for_insert)
{
	if (!t->set_cap)
		return NULL;
	uint32_t mask = t->set_cap - 1, i = (uint32_t)mix(k, lane) & mask;
	struct l2ent *tomb = NULL;
	for (uint32_t n = 0; n < t->set_cap; n++, i = (i + 1) & mask) {
		struct l2ent *e = &t->set[i];
		if (!e->used)
			return for_insert ? (tomb ? tomb : e) : NULL;
		if (e->dead) {
			if (!tomb)
				tomb = e;
			continue;
		}
		if (e->lo == k.lo && e->hi == k.hi && e->lane == lane)
			return e;
	}
	return for_insert ? tomb : NULL;
}

static int set_grow(struct l2tier *t)
{
	uint32_t cap = t->set_cap ? t->set_cap * 2 : 1024;
	struct l2ent *old = t->set, *n = calloc(cap, sizeof(*n));
	if (!n)
		return -ENOMEM;
	uint32_t old_cap = t->set_cap;
	t->set = n;
	t->set_cap = cap;
	t->set_n = t->set_dead = 0;
	for (uint32_t i = 0; i < old_cap; i++)
		if (old[i].used && !old[i].dead) {
			struct l2ent *e = set_find(t, (kvr_key){old[i].lo, old[i].hi}, old[i].lane, true);
			*e = old[i];
			t->set_n++;
		}
	free(old);
	return 0;
}

static void set_add(struct l2tier *t, kvr_key k, unsigned lane)
{
	if ((t->set_n + t->set_dead + 1) * 2 > t->set_cap && set_grow(t))
		return; /* out of memory: the block is simply not known to be on disk */
	struct l2ent *e = set_find(t, k, lane, true);
	if (!e || (e->used && !e->dead))
		return;
	if (e->dead)
		t->set_dead--;
	*e = (struct l2ent){.lo = k.lo, .hi = k.hi, .lane = (uint16_t)lane, .used = 1};
	t->set_n++;
}

static void set_del(struct l2tier *t, kvr_key k, unsigned lane)
{
	struct l2ent *e = set_find(t, k, lane, false);
	if (!e)
		return;
	e->dead = 1;
	t->set_n--;
	t->set_dead++;
}

bool l2t_has(const struct l2tier *t, kvr_key key, unsigned lane)
{
	return t && set_find(t, key, lane, false) != NULL;
}

static unsigned route(const struct l2tier *t, kvr_key k)
{
	return (unsigned)(k.hi % t->n_disks);
}

static int send_l2(struct l2tier *t, unsigned disk, unsigned type, uint64_t id, kvr_key k, unsigned lane,
		   uint32_t slot, uint32_t epoch)
{
	struct kvr_msg_l2 b = {.key_lo = k.lo, .key_hi = k.hi, .slot = slot, .epoch = epoch, .lane = (uint16_t)lane};
	struct kvr_msg m;
	kvr_msg_build(&m, type, 0, id, 0, type == KVR_MSG_L2_SYNC ? NULL : &b, type == KVR_MSG_L2_SYNC ? 0 : sizeof(b));
	return type == KVR_MSG_L2_WRITE ? kvr_ring_try_enqueue(t->req[disk], &m) /* write-through never stalls lookups */
					: kvr_msg_send(t->req[disk], &m, kvr_now_ns() + SEND_TIMEOUT_NS);
}

int l2t_open(struct kvr_actor *a, struct kvr_index *idx, struct l2tier **ret)
{
	*ret = NULL;
	unsigned n = a->cfg.l2.n_dirs;
	if (!n)
		return 0;
	if (n > L2T_MAX_DISKS)
		return -EINVAL;
	struct l2tier *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->a = a;
	t->idx = idx;
	t->n_disks = n;
	t->n_workers = a->ctl->max_workers;
	t->pend = calloc(t->n_workers, sizeof(*t->pend));
	if (!t->pend || set_grow(t)) {
		l2t_close(t);
		return -ENOMEM;
	}
	for (unsigned d = 0; d < n; d++) {
		t->req[d] = kvr_actor_ring_w(a, "disk.req.%u", d);
		t->rep[d] = kvr_actor_ring_w(a, "disk.rep.%u", d);
		t->disk_actor[d] = 1 + 2 * a->ctl->max_workers + d;
		if (!t->req[d] || !t->rep[d] || t->disk_actor[d] >= a->ctl->max_actors) {
			l2t_close(t);
			return -ENOENT;
		}
		t->disk_gen[d] = atomic_load(&kvr_ctl_actor(a->ctl, t->disk_actor[d])->generation);
		(void)send_l2(t, d, KVR_MSG_L2_SYNC, 0, (kvr_key){0, 0}, 0, 0, 0);
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
	}
	free(t->pend);
	free(t->reads);
	free(t->set);
	free(t);
}

void l2t_committed(struct l2tier *t, kvr_key key, unsigned lane, uint32_t slot, uint32_t epoch)
{
	if (!t || l2t_has(t, key, lane))
		return;
	/* Pin the slot for the disk actor now, before anything can evict it: it unpins when
	 * the write is done. (We are the evictor, so this pin cannot race an eviction.) */
	if (kvr_slot_pin(t->a->slots, slot, epoch, KVR_L2_PIN_WORKER)) {
		kvr_actor_count(t->a, KVR_STAT_LK_L2_WRITES_SKIPPED, 1);
		return;
	}
	if (send_l2(t, route(t, key), KVR_MSG_L2_WRITE, 0, key, lane, slot, epoch)) {
		(void)kvr_slot_unpin(t->a->slots, slot, KVR_L2_PIN_WORKER);
		kvr_actor_count(t->a, KVR_STAT_LK_L2_WRITES_SKIPPED, 1);
		return;
	}
	t->writes_inflight++;
}

unsigned l2t_writes_inflight(const struct l2tier *t)
{
	return t ? t->writes_inflight : 0;
}

static int read_new(struct l2tier *t, uint32_t *ret)
{
	for (uint32_t i = 0; i < t->n_reads; i++)
		if (!t->reads[i].used) {
			*ret = i;
			return 0;
		}
	if (t->n_reads == t->cap_reads) {
		uint32_t cap = t->cap_reads ? t->cap_reads * 2 : 256;
		struct read *r = realloc(t->reads, cap * sizeof(*r));
		if (!r)
			return -ENOMEM;
		t->reads = r;
		t->cap_reads = cap;
	}
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
	if (!r || !s)
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

int l2t_extend(struct l2tier *t, unsigned worker, uint64_t wire, unsigned lane, const kvr_key *keys, uint32_t total,
	       uint32_t matched, struct kvr_index_ref *refs, uint64_t index_ns)
{
	if (!t || matched >= total || worker >= t->n_workers)
		return (int)matched;
	struct pend *p = &t->pend[worker];
	if (p->active) {
		/* the client gave up on its previous lookup: answer nothing more for it; its reads
		 * finish on their own (orphaned, committed or aborted as they complete) */
		p->active = false;
	}
	if (!pend_grow(p, total))
		return (int)matched;
	unsigned lanes = t->a->slots->quorum;
	uint32_t seq = ++t->pseq, waiting = 0, i;
	for (i = 0; i < matched; i++)
		p->state[i] = B_OK;
	for (i = matched; i < total; i++) {
		struct kvr_index_block b;
		bool have = kvr_index_get(t->idx, keys[i], &b) == 0;
		if (!all_lanes_available(t, keys[i], &b, have, lanes))
			break;
		if (have && (b.commit_mask >> lane & 1)) {
			uint32_t s = b.slot[lane];
			refs[i] = (struct kvr_index_ref){.slot = s, .epoch = kvr_slot_epoch(t->a->slots, s)};
			p->state[i] = B_OK;
			continue;
		}
		/* promote this lane: a slot of our own, filled from disk */
		struct kvr_index_ref r;
		struct kvr_index_alloc_stats st = {0};
		if (kvr_index_alloc(t->idx, &keys[i], 1, lane, worker, &r, &st) || r.slot == KVR_INDEX_PRESENT ||
		    r.slot == KVR_INDEX_NOROOM)
			break;
		kvr_actor_count(t->a, KVR_STAT_LK_EVICTED, st.evicted);
		uint32_t ri;
		if (read_new(t, &ri)) {
			(void)kvr_index_abort(t->idx, r.slot, r.epoch);
			break;
		}
		unsigned d = route(t, keys[i]);
		struct read *rd = &t->reads[ri];
		*rd = (struct read){.used = true, .rseq = ++t->rseq, .worker = worker, .lane = lane, .pseq = seq, .block = i,
				    .slot = r.slot, .epoch = r.epoch, .disk = d, .disk_gen = t->disk_gen[d]};
		uint64_t id = (uint64_t)rd->rseq << 32 | ri;
		if (send_l2(t, d, KVR_MSG_L2_READ, id, keys[i], lane, r.slot, r.epoch)) {
			rd->used = false;
			(void)kvr_index_abort(t->idx, r.slot, r.epoch);
			break;
		}
		refs[i] = r;
		p->state[i] = B_WAIT;
		waiting++;
	}
	if (!waiting)
		return (int)i;
	p->active = true;
	p->seq = seq;
	p->wire = wire;
	p->lane = lane;
	p->n = i;
	p->waiting = waiting;
	p->index_ns = index_ns;
	memcpy(p->refs, refs, (size_t)i * sizeof(*refs));
	return -EINPROGRESS;
}

static void finish(struct l2tier *t, unsigned w, struct l2t_done *done)
{
	struct pend *p = &t->pend[w];
	uint32_t m = 0, promoted = 0;
	while (m < p->n && (p->state[m] == B_OK || p->state[m] == B_PROMOTED))
		promoted += p->state[m++] == B_PROMOTED;
	p->active = false;
	*done = (struct l2t_done){.worker = w, .wire = p->wire, .lane = p->lane, .matched = m, .promoted = promoted,
				  .refs = p->refs, .index_ns = p->index_ns};
}

/* A read ended (status 0: verified bytes in the slot). Returns 1 when its promotion finished. */
static int read_ended(struct l2tier *t, uint32_t ri, int status, struct l2t_done *done)
{
	struct read *rd = &t->reads[ri];
	bool ok = false;
	if (status == 0) {
		ok = kvr_index_commit(t->idx, rd->lane, rd->slot, rd->epoch) >= 0;
		kvr_actor_count(t->a, ok ? KVR_STAT_LK_L2_READS : KVR_STAT_LK_L2_READ_FAILS, 1);
	} else {
		(void)kvr_index_abort(t->idx, rd->slot, rd->epoch);
		kvr_actor_count(t->a, KVR_STAT_LK_L2_READ_FAILS, 1);
	}
	rd->used = false;
	struct pend *p = &t->pend[rd->worker];
	if (!p->active || p->seq != rd->pseq || rd->block >= p->n || p->state[rd->block] != B_WAIT)
		return 0;
	p->state[rd->block] = ok ? B_PROMOTED : B_FAIL;
	if (--p->waiting)
		return 0;
	finish(t, rd->worker, done);
	return 1;
}

int l2t_on_msg(struct l2tier *t, struct kvr_ring *ring, const struct kvr_msg *m, struct l2t_done *done)
{
	if (!t)
		return 1;
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
			set_add(t, k, b.lane);
		if (b.flags & KVR_L2F_LAST) {
			t->synced[d] = true;
			kvr_info("disk.%u synced: %u block lanes on disk in all", d, t->set_n);
		}
		return 0;
	case KVR_MSG_L2_GONE:
		set_del(t, k, b.lane);
		return 0;
	case KVR_MSG_L2_WRITE_DONE:
		if (t->writes_inflight)
			t->writes_inflight--;
		if (b.status == 0) {
			set_add(t, k, b.lane);
			kvr_actor_count(t->a, KVR_STAT_LK_L2_WRITES, 1);
		} else {
			kvr_actor_count(t->a, KVR_STAT_LK_L2_WRITE_FAILS, 1);
		}
		return 0;
	case KVR_MSG_L2_READ_DONE: {
		uint32_t ri = (uint32_t)m->hdr.req_id;
		if (ri >= t->n_reads || !t->reads[ri].used || t->reads[ri].rseq != (uint32_t)(m->hdr.req_id >> 32) ||
		    t->reads[ri].slot != b.slot || t->reads[ri].epoch != b.epoch)
			return 0; /* a read we already gave up on */
		if (b.status)
			set_del(t, k, b.lane); /* missing or bad on disk: it is not there any more */
		return read_ended(t, ri, b.status, done) ? 2 : 0;
	}
	default:
		return -EBADMSG;
	}
}

int l2t_tick(struct l2tier *t, struct l2t_done *done)
{
	if (!t)
		return 0;
	for (unsigned d = 0; d < t->n_disks; d++) {
		struct kvr_actor_ent *e = kvr_ctl_actor(t->a->ctl, t->disk_actor[d]);
		uint32_t gen = atomic_load(&e->generation);
		if (gen != t->disk_gen[d]) {
			/* it died: what it had taken off its ring will never be answered */
			for (uint32_t i = 0; i < t->n_reads; i++)
				if (t->reads[i].used && t->reads[i].disk == d && t->reads[i].disk_gen != gen)
					t->reads[i].orphan = true;
			t->disk_gen[d] = gen;
			t->synced[d] = false;
			t->writes_inflight = 0; /* approximate after a death: an ALLOC waits at most its deadline */
			(void)send_l2(t, d, KVR_MSG_L2_SYNC, 0, (kvr_key){0, 0}, 0, 0, 0);
		}
		/* abort orphans once the successor drained the old requests: it can no longer
		 * write into their slots */
		bool drained = atomic_load(&e->state) == KVR_ACTOR_READY && !kvr_ring_count(t->req[d]) &&
			       !atomic_load(&e->busy);
		for (uint32_t i = 0; drained && i < t->n_reads; i++) {
			struct read *rd = &t->reads[i];
			if (rd->used && rd->orphan && rd->disk == d && read_ended(t, i, -EPIPE, done))
				return 1;
		}
	}
	return 0;
}
