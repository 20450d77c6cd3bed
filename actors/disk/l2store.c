/* l2store: the L2 index (hash + LRU), byte accounting, eviction and requests over the uring engine; open, close. */
#include "l2store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_log.h"
#include "kvr_time.h"
#include "l2store_int.h"

#define NONE UINT32_MAX

enum ent_state {
	E_FREE = 0,
	E_WRITING,    /* a put is writing it: not readable, not evictable */
	E_PRESENT,    /* on disk, in the LRU */
	E_EVICTING,   /* its unlink is queued or in flight */
};

struct ent {
	kvr_key key;
	uint32_t lane;
	uint32_t gen;      /* changes on every reuse of the entry: stale completions are ignored */
	uint32_t prev, next; /* LRU links (next: free list too) */
	uint8_t state;
};

enum req_kind {
	R_FREE = 0,
	R_PUT,
	R_GET,
	R_UNLINK,          /* an eviction, a removal or a bad file */
};

struct req {
	uint8_t kind;
	uint32_t ent, gen;
	uint64_t tag;      /* the caller's */
	uint32_t next_free;
};

static int fifo_push(struct fifo *f, const void *x)
{
	if (f->n == f->cap) {
		size_t ncap = f->cap ? f->cap * 2 : 64;
		uint8_t *nv = malloc(ncap * f->item);
		if (!nv)
			return -ENOMEM;
		for (size_t i = 0; i < f->n; i++)
			memcpy(nv + i * f->item, (uint8_t *)f->v + ((f->head + i) % f->cap) * f->item, f->item);
		free(f->v);
		f->v = nv;
		f->cap = ncap;
		f->head = 0;
	}
	memcpy((uint8_t *)f->v + ((f->head + f->n) % f->cap) * f->item, x, f->item);
	f->n++;
	return 0;
}

static bool fifo_pop(struct fifo *f, void *x)
{
	if (!f->n)
		return false;
	memcpy(x, (uint8_t *)f->v + f->head * f->item, f->item);
	f->head = (f->head + 1) % f->cap;
	f->n--;
	return true;
}

struct unlink_item {
	uint32_t ent, gen;
};

/* ---- index ----------------------------------------------------------------------------- */

static inline uint32_t hash(kvr_key k, uint32_t lane)
{
	uint64_t h = k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)lane * 0xc2b2ae3d27d4eb4full);
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return (uint32_t)h;
}

static uint32_t find(const struct kvr_l2_store *s, kvr_key k, uint32_t lane)
{
	for (uint32_t i = hash(k, lane) & s->tab_mask;; i = (i + 1) & s->tab_mask) {
		uint32_t v = s->tab[i];
		if (!v)
			return NONE;
		const struct ent *e = &s->ents[v - 1];
		if (e->lane == lane && kvr_key_eq(e->key, k))
			return v - 1;
	}
}

static void tab_put(uint32_t *tab, uint32_t mask, const struct ent *ents, uint32_t idx)
{
	uint32_t i = hash(ents[idx].key, ents[idx].lane) & mask;
	while (tab[i])
		i = (i + 1) & mask;
	tab[i] = idx + 1;
}

/* Remove entry idx from the table (backward-shift deletion keeps probe runs intact). */
static void tab_del(struct kvr_l2_store *s, uint32_t idx)
{
	uint32_t i = hash(s->ents[idx].key, s->ents[idx].lane) & s->tab_mask;
	while (s->tab[i] != idx + 1)
		i = (i + 1) & s->tab_mask;
	uint32_t j = i;
	for (;;) {
		s->tab[i] = 0;
		for (;;) {
			j = (j + 1) & s->tab_mask;
			if (!s->tab[j])
				return;
			const struct ent *e = &s->ents[s->tab[j] - 1];
			uint32_t home = hash(e->key, e->lane) & s->tab_mask;
			/* may the element at j move to the hole at i? only if home is not in (i, j] */
			if (i <= j ? (home <= i || home > j) : (home <= i && home > j))
				break;
		}
		s->tab[i] = s->tab[j];
		i = j;
	}
}

static int grow(struct kvr_l2_store *s)
{
	if (s->free_ent == NONE && s->n_ents == s->cap_ents) {
		uint32_t ncap = s->cap_ents ? s->cap_ents * 2 : 1024;
		if (ncap > (1u << 30))
			return -ENOMEM;
		struct ent *ne = realloc(s->ents, (size_t)ncap * sizeof(*ne));
		if (!ne)
			return -ENOMEM;
		s->ents = ne;
		s->cap_ents = ncap;
	}
	uint64_t live = s->present + s->writing + s->evicting + 1;
	if (live * 10 > (uint64_t)(s->tab_mask + 1) * 7) {
		uint32_t nsize = (s->tab_mask + 1) * 2;
		uint32_t *nt = calloc(nsize, sizeof(*nt));
		if (!nt)
			return -ENOMEM;
		for (uint32_t i = 0; i <= s->tab_mask; i++)
			if (s->tab[i])
				tab_put(nt, nsize - 1, s->ents, s->tab[i] - 1);
		free(s->tab);
		s->tab = nt;
		s->tab_mask = nsize - 1;
	}
	return 0;
}

/* A new entry in the table (call grow() first). */
static uint32_t ent_new(struct kvr_l2_store *s, kvr_key k, uint32_t lane, enum ent_state st)
{
	uint32_t idx;
	if (s->free_ent != NONE) {
		idx = s->free_ent;
		s->free_ent = s->ents[idx].next;
	} else {
		idx = s->n_ents++;
		s->ents[idx].gen = 0;
	}
	struct ent *e = &s->ents[idx];
	e->key = k;
	e->lane = lane;
	e->gen++;
	e->prev = e->next = NONE;
	e->state = (uint8_t)st;
	tab_put(s->tab, s->tab_mask, s->ents, idx);
	return idx;
}

static void ent_free(struct kvr_l2_store *s, uint32_t idx)
{
	tab_del(s, idx);
	struct ent *e = &s->ents[idx];
	e->state = E_FREE;
	e->gen++;
	e->next = s->free_ent;
	s->free_ent = idx;
}

static void lru_remove(struct kvr_l2_store *s, uint32_t idx)
{
	struct ent *e = &s->ents[idx];
	if (e->prev != NONE)
		s->ents[e->prev].next = e->next;
	else
		s->lru_head = e->next;
	if (e->next != NONE)
		s->ents[e->next].prev = e->prev;
	else
		s->lru_tail = e->prev;
	e->prev = e->next = NONE;
}

static void lru_push(struct kvr_l2_store *s, uint32_t idx)
{
	struct ent *e = &s->ents[idx];
	e->prev = s->lru_tail;
	e->next = NONE;
	if (s->lru_tail != NONE)
		s->ents[s->lru_tail].next = idx;
	else
		s->lru_head = idx;
	s->lru_tail = idx;
}

static void lru_touch(struct kvr_l2_store *s, uint32_t idx)
{
	if (s->lru_tail == idx)
		return;
	lru_remove(s, idx);
	lru_push(s, idx);
}

int kvr_l2_index_add_present(struct kvr_l2_store *s, kvr_key key, uint32_t lane)
{
	int rc = grow(s);
	if (rc)
		return rc;
	uint32_t idx = ent_new(s, key, lane, E_PRESENT);
	lru_push(s, idx);
	s->present++;
	return 0;
}

/* ---- requests and evictions ------------------------------------------------------------ */

static uint32_t req_new(struct kvr_l2_store *s, enum req_kind kind, uint32_t ent, uint64_t tag)
{
	uint32_t r = s->free_req; /* the caller checked that the engine (and so a req) is free */
	s->free_req = s->reqs[r].next_free;
	s->reqs[r] = (struct req){.kind = (uint8_t)kind, .ent = ent, .gen = s->ents[ent].gen, .tag = tag};
	s->reqs_busy++;
	return r;
}

static void req_free(struct kvr_l2_store *s, uint32_t r)
{
	s->reqs[r].kind = R_FREE;
	s->reqs[r].next_free = s->free_req;
	s->free_req = r;
	s->reqs_busy--;
}

static bool engine_free(const struct kvr_l2_store *s)
{
	return kvr_l2io_busy(s->io) < s->qd;
}

/* cfg.report_gone: queue a GONE completion for an entry leaving the index. */
static int report_gone(struct kvr_l2_store *s, const struct ent *e, uint8_t reason)
{
	if (!s->cfg.report_gone)
		return 0;
	struct kvr_l2_done g = {.key = e->key, .lane = e->lane, .kind = KVR_L2_GONE, .reason = reason};
	return fifo_push(&s->done, &g);
}

/* PRESENT -> EVICTING: out of the LRU, its unlink queued (and reported GONE with reason). */
static int evict(struct kvr_l2_store *s, uint32_t idx, uint8_t reason)
{
	struct ent *e = &s->ents[idx];
	struct unlink_item it = {idx, e->gen};
	int rc = fifo_push(&s->unlinks, &it);
	if (rc)
		return rc;
	rc = report_gone(s, e, reason);
	if (rc) {
		s->unlinks.n--; /* undo the push just made */
		return rc;
	}
	lru_remove(s, idx);
	e->state = E_EVICTING;
	s->present--;
	s->evicting++;
	return 0;
}

/* Hand queued unlinks to the engine while it has room. */
static void issue_unlinks(struct kvr_l2_store *s)
{
	struct unlink_item it;
	while (s->unlinks.n && engine_free(s)) {
		fifo_pop(&s->unlinks, &it);
		struct ent *e = &s->ents[it.ent];
		if (e->gen != it.gen || e->state != E_EVICTING)
			continue;
		uint32_t r = req_new(s, R_UNLINK, it.ent, 0);
		if (kvr_l2io_unlink(s->io, e->key, e->lane, r)) { /* not expected: the engine had room */
			req_free(s, r);
			(void)fifo_push(&s->unlinks, &it);
			return;
		}
	}
}

/* ---- public API ------------------------------------------------------------------------ */

int kvr_l2_store_put(struct kvr_l2_store *s, kvr_key key, uint32_t lane, const void *src, uint64_t tag)
{
	return kvr_l2_store_put_as(s, key, lane, 0, src, tag);
}

int kvr_l2_store_put_as(struct kvr_l2_store *s, kvr_key key, uint32_t lane, uint32_t block_tokens, const void *src,
			uint64_t tag)
{
	if (!s || !src || lane >= s->cfg.lanes)
		return -EINVAL;
	uint32_t own = s->cfg.ident.block_tokens; /* 0: a store of several block sizes */
	if (own ? block_tokens && block_tokens != own : !block_tokens)
		return -EINVAL;
	if (s->cfg.read_only) {
		s->st.puts_refused++;
		return -EROFS;
	}
	if (kvr_l2io_direct(s->io) && ((uintptr_t)src & (KVR_L2_ALIGN - 1)))
		return -EINVAL;
	uint32_t idx = find(s, key, lane);
	if (idx != NONE) {
		struct ent *e = &s->ents[idx];
		if (e->state == E_PRESENT) {
			lru_touch(s, idx);
			s->st.puts_present++;
			return KVR_L2_PRESENT;
		}
		if (e->state == E_WRITING) {
			s->st.puts_inflight++;
			return KVR_L2_INFLIGHT;
		}
		return -EAGAIN; /* being evicted: its unlink must land before the name is reused */
	}
	if (s->fb > s->cfg.capacity_bytes) {
		s->st.puts_nospace++;
		return -ENOSPC;
	}
	if (!engine_free(s))
		return -EAGAIN;
	/* room: evict least recently used present files until one more file fits */
	while ((s->present + s->writing + 1) * s->fb > s->cfg.capacity_bytes) {
		if (s->lru_head == NONE) {
			s->st.puts_nospace++;
			return -EAGAIN; /* only writes in flight hold the space */
		}
		int rc = evict(s, s->lru_head, KVR_L2_R_OVER_CAP);
		if (rc)
			return rc;
		s->st.evictions++;
	}
	int rc = grow(s);
	if (rc)
		return rc;
	idx = ent_new(s, key, lane, E_WRITING);
	uint32_t r = req_new(s, R_PUT, idx, tag);
	rc = kvr_l2io_write_as(s->io, key, lane, block_tokens, src, r);
	if (rc) {
		req_free(s, r);
		ent_free(s, idx);
		return rc;
	}
	s->writing++;
	s->st.puts++;
	return 0;
}

int kvr_l2_store_get(struct kvr_l2_store *s, kvr_key key, uint32_t lane, void *dst, uint64_t tag)
{
	return kvr_l2_store_get_as(s, key, lane, 0, dst, tag);
}

int kvr_l2_store_get_as(struct kvr_l2_store *s, kvr_key key, uint32_t lane, uint32_t block_tokens, void *dst,
			uint64_t tag)
{
	if (!s || !dst || lane >= s->cfg.lanes)
		return -EINVAL;
	if (kvr_l2io_direct(s->io) && ((uintptr_t)dst & (KVR_L2_ALIGN - 1)))
		return -EINVAL;
	uint32_t idx = find(s, key, lane);
	if (idx == NONE || s->ents[idx].state != E_PRESENT) {
		s->st.get_misses++;
		return -ENOENT;
	}
	if (!engine_free(s))
		return -EAGAIN;
	uint32_t r = req_new(s, R_GET, idx, tag);
	int rc = kvr_l2io_read_as(s->io, key, lane, block_tokens, dst, r);
	if (rc) {
		req_free(s, r);
		return rc;
	}
	lru_touch(s, idx);
	s->st.gets++;
	return 0;
}

bool kvr_l2_store_contains(const struct kvr_l2_store *s, kvr_key key, uint32_t lane)
{
	uint32_t idx = find(s, key, lane);
	return idx != NONE && s->ents[idx].state == E_PRESENT;
}

bool kvr_l2_store_touch(struct kvr_l2_store *s, kvr_key key, uint32_t lane)
{
	uint32_t idx = s ? find(s, key, lane) : NONE;
	if (idx == NONE || s->ents[idx].state != E_PRESENT)
		return false;
	lru_touch(s, idx);
	return true;
}

bool kvr_l2_store_writing(const struct kvr_l2_store *s, kvr_key key, uint32_t lane)
{
	uint32_t idx = find(s, key, lane);
	return idx != NONE && s->ents[idx].state == E_WRITING;
}

int kvr_l2_store_remove(struct kvr_l2_store *s, kvr_key key, uint32_t lane)
{
	if (s->cfg.read_only) {
		s->st.puts_refused++;
		return -EROFS;
	}
	uint32_t idx = find(s, key, lane);
	if (idx == NONE || s->ents[idx].state == E_EVICTING)
		return -ENOENT;
	if (s->ents[idx].state == E_WRITING)
		return -EBUSY;
	int rc = evict(s, idx, KVR_L2_OK);
	if (rc)
		return rc;
	s->st.removed++;
	issue_unlinks(s);
	return 0;
}

static void get_failed(struct kvr_l2_store *s, unsigned reason)
{
	s->st.get_misses++;
	s->st.dropped[reason < KVR_L2_R_MAX ? reason : KVR_L2_R_IO]++;
}

/* A get of present entry idx failed with res (-errno) for reason: counted, and the entry
 * leaves the index. Gone behind our back: nothing to unlink; read-only: never served
 * again, but the file stays where it is; else bad or unreadable: removed. */
static int drop_after_read(struct kvr_l2_store *s, uint32_t idx, int res, unsigned reason)
{
	struct ent *e = &s->ents[idx];
	get_failed(s, reason);
	if (res == -ENOENT || s->cfg.read_only) {
		if (res != -ENOENT)
			s->st.bad_kept++;
		int rc = report_gone(s, e, (uint8_t)reason);
		if (rc)
			return rc;
		lru_remove(s, idx);
		s->present--;
		ent_free(s, idx);
		return 0;
	}
	return evict(s, idx, (uint8_t)reason);
}

int kvr_l2_store_verify(struct kvr_l2_store *s, struct kvr_l2_done *d, const void *dst)
{
	if (!s || !d || !d->unverified)
		return 0;
	d->unverified = false;
	if (kvr_l2_payload_hash(dst, s->cfg.ident.lane_bytes) == d->payload_xxh3)
		return 0;
	d->res = -EBADMSG;
	d->reason = KVR_L2_R_PAYLOAD_CSUM;
	s->st.get_hits--; /* counted a hit when it completed */
	if (d->ent < s->n_ents && s->ents[d->ent].gen == d->ent_gen && s->ents[d->ent].state == E_PRESENT)
		return drop_after_read(s, d->ent, d->res, d->reason);
	get_failed(s, d->reason); /* the entry left the index meanwhile */
	return 0;
}

/* One engine completion: update the index; queue the caller's completion if it has one. */
static int on_io_done(struct kvr_l2_store *s, const struct kvr_l2io_done *d)
{
	struct req rq = s->reqs[d->tag];
	req_free(s, (uint32_t)d->tag);
	struct ent *e = &s->ents[rq.ent];
	bool same = e->gen == rq.gen;
	struct kvr_l2_done out = {.tag = rq.tag, .key = d->key, .lane = d->lane, .reason = d->reason, .res = d->res};
	switch (rq.kind) {
	case R_PUT:
		/* a WRITING entry is never evicted or removed, so it is still ours */
		s->writing--;
		if (d->res == 0) {
			e->state = E_PRESENT;
			s->present++;
			lru_push(s, rq.ent);
		} else {
			ent_free(s, rq.ent);
			s->st.puts_failed++;
		}
		out.kind = KVR_L2_PUT;
		return fifo_push(&s->done, &out);
	case R_GET:
		out.kind = KVR_L2_GET;
		if (d->res == 0) {
			s->st.get_hits++;
			out.unverified = d->unverified;
			out.payload_xxh3 = d->payload_xxh3;
			out.ent = rq.ent;
			out.ent_gen = rq.gen;
			return fifo_push(&s->done, &out);
		}
		if (same && e->state == E_PRESENT) {
			int rc = drop_after_read(s, rq.ent, d->res, d->reason);
			if (rc)
				return rc;
		} else {
			get_failed(s, d->reason);
		}
		return fifo_push(&s->done, &out);
	case R_UNLINK:
		if (d->res)
			s->st.unlink_errors++;
		if (same && e->state == E_EVICTING) {
			s->evicting--;
			ent_free(s, rq.ent);
		}
		return 0;
	}
	return 0;
}

unsigned kvr_l2_store_pending(const struct kvr_l2_store *s)
{
	return s->reqs_busy + (unsigned)s->unlinks.n;
}

/* Queue the unlinks that wait for room, then reap what the engine finished — waiting for
 * at least one when want_more and anything is in flight (*ret_waited says whether) — and
 * account each. The number reaped, or -errno. */
static int reap_once(struct kvr_l2_store *s, bool want_more, bool *ret_waited)
{
	issue_unlinks(s);
	bool wait = want_more && kvr_l2io_busy(s->io) > 0;
	*ret_waited = wait;
	int n = kvr_l2io_reap(s->io, s->iobuf, s->io_qd, wait ? 1 : 0);
	for (int i = 0; i < n; i++) {
		int rc = on_io_done(s, &s->iobuf[i]);
		if (rc)
			return rc;
	}
	return n;
}

int kvr_l2_store_poll(struct kvr_l2_store *s, struct kvr_l2_done *ret, unsigned max, unsigned min_done)
{
	if (!s || (max && !ret))
		return -EINVAL;
	if (min_done > max)
		min_done = max;
	for (;;) {
		bool wait;
		int n = reap_once(s, s->done.n < min_done, &wait);
		if (n < 0)
			return n;
		if (s->done.n >= min_done || (!kvr_l2io_busy(s->io) && !s->unlinks.n))
			break;
		if (!n && !wait)
			break;
	}
	unsigned out = 0;
	while (out < max && fifo_pop(&s->done, &ret[out]))
		out++;
	return (int)out;
}

int kvr_l2_store_flush(struct kvr_l2_store *s)
{
	for (;;) {
		bool waited;
		int n = reap_once(s, true, &waited);
		if (n < 0)
			return n;
		if (!waited && !kvr_l2io_busy(s->io))
			return 0; /* nothing was in flight after the unlinks were queued: flushed */
	}
}

int kvr_l2_store_event_fd(struct kvr_l2_store *s)
{
	return kvr_l2io_event_fd(s->io);
}

void kvr_l2_store_stats(const struct kvr_l2_store *s, struct kvr_l2_store_stats *ret)
{
	*ret = s->st;
	ret->capacity_bytes = s->cfg.capacity_bytes;
	ret->file_bytes = s->fb;
	ret->files = s->present;
	ret->used_bytes = (s->present + s->writing) * s->fb;
	ret->writing_bytes = s->writing * s->fb;
	ret->evicting_bytes = s->evicting * s->fb;
	kvr_l2io_stats(s->io, &ret->io);
	ret->direct = kvr_l2io_direct(s->io);
	ret->read_only = s->cfg.read_only;
}

unsigned kvr_l2_store_lru(const struct kvr_l2_store *s, kvr_key *ret_keys, uint32_t *ret_lanes, unsigned max)
{
	unsigned n = 0;
	for (uint32_t i = s->lru_head; i != NONE && n < max; i = s->ents[i].next, n++) {
		ret_keys[n] = s->ents[i].key;
		ret_lanes[n] = s->ents[i].lane;
	}
	return n;
}

const char *kvr_l2_store_dir(const struct kvr_l2_store *s)
{
	return s->dir;
}

/* ---- open / close ---------------------------------------------------------------------- */

/* The store's fields from cfg, its key table, request and I/O tables, and its namespace
 * directory's path (hex: the directory's name under the root). */
static int store_init(struct kvr_l2_store *s, const struct kvr_l2_store_config *cfg, char *hex)
{
	s->cfg = *cfg;
	s->cfg.root = NULL;
	s->dir_fd = s->lock_fd = -1;
	s->fb = kvr_l2_file_bytes(cfg->ident.lane_bytes);
	s->free_ent = s->lru_head = s->lru_tail = NONE;
	s->unlinks.item = sizeof(struct unlink_item);
	s->done.item = sizeof(struct kvr_l2_done);
	s->tab_mask = 1023;
	s->tab = calloc(s->tab_mask + 1, sizeof(*s->tab));
	s->qd = cfg->queue_depth;
	s->io_qd = cfg->queue_depth > KVR_L2_ADOPT_DEPTH ? cfg->queue_depth : KVR_L2_ADOPT_DEPTH;
	s->reqs = calloc(cfg->queue_depth, sizeof(*s->reqs));
	s->iobuf = calloc(s->io_qd, sizeof(*s->iobuf));
	if (!s->tab || !s->reqs || !s->iobuf ||
	    asprintf(&s->dir, "%s/%s", cfg->root, kvr_l2_ns_dir_fmt(cfg->ident.ns, hex)) < 0) {
		s->dir = NULL;
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < cfg->queue_depth; i++)
		s->reqs[i].next_free = i + 1 < cfg->queue_depth ? i + 1 : NONE;
	s->free_req = 0;
	return 0;
}

/* The store's io_uring engine over its directory and the arena. */
static int open_io(struct kvr_l2_store *s, const struct kvr_l2_store_config *cfg)
{
	struct kvr_l2io_config icfg = {
		.dir_fd = s->dir_fd,
		.ident = cfg->ident,
		.queue_depth = s->io_qd,
		.durability = cfg->durability,
		.io_mode = cfg->io_mode,
		.arena = cfg->arena,
		.arena_bytes = cfg->arena_bytes,
		.arena_data_off = cfg->arena_data_off,
		.slot_bytes = cfg->slot_bytes,
		.read_only = cfg->read_only,
		.defer_verify = cfg->defer_verify,
		.join_header = cfg->join_header,
	};
	return kvr_l2io_open(&icfg, &s->io);
}

int kvr_l2_store_open(const struct kvr_l2_store_config *cfg, struct kvr_l2_adopt_stats *ret_adopt,
		      struct kvr_l2_store **ret)
{
	if (!cfg || !ret || !cfg->root || !cfg->lanes || cfg->lanes > KVR_L2_MAX_LANE + 1 || !cfg->capacity_bytes ||
	    !cfg->ident.lane_bytes || !kvr_l2_file_bytes(cfg->ident.lane_bytes) || !cfg->queue_depth ||
	    cfg->queue_depth > KVR_L2IO_MAX_QD)
		return -EINVAL;
	struct kvr_l2_store *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	struct kvr_l2_adopt_stats ast = {0};
	char hex[KVR_KEY_FMT_LEN];
	int rc = store_init(s, cfg, hex);
	if (!rc)
		rc = kvr_l2_dir_open(s, cfg, hex, &ast);
	if (!rc)
		rc = open_io(s, cfg);
	if (!rc && !ast.no_dir)
		rc = kvr_l2_adopt(s, &ast);
	if (rc) {
		kvr_l2_store_close(s);
		return rc;
	}
	if (ret_adopt)
		*ret_adopt = ast;
	*ret = s;
	return 0;
}

void kvr_l2_store_close(struct kvr_l2_store *s)
{
	if (!s)
		return;
	if (s->io) {
		/* let queued evictions land so the files on disk match what a restart adopts */
		(void)kvr_l2_store_flush(s);
		kvr_l2io_close(s->io);
	}
	if (s->lock_fd >= 0)
		close(s->lock_fd); /* releases the flock */
	if (s->dir_fd >= 0)
		close(s->dir_fd);
	free(s->dir);
	free(s->ents);
	free(s->tab);
	free(s->reqs);
	free(s->iobuf);
	free(s->unlinks.v);
	free(s->done.v);
	free(s);
}
