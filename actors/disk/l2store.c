/* l2store: the L2 index (hash + LRU), byte accounting, eviction and start-up adoption over the uring engine. */
#include "l2store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_grow.h"
#include "kvr_log.h"
#include "kvr_time.h"

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

/* A growable FIFO of fixed-size items. */
struct fifo {
	void *v;
	size_t item, cap, head, n;
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

struct kvr_l2_store {
	struct kvr_l2_store_config cfg;
	char *dir;                 /* <root>/<ns hex> */
	int dir_fd, lock_fd;
	struct kvr_l2io *io;
	unsigned qd;               /* data-path ops in flight (cfg.queue_depth <= the engine's depth) */
	unsigned io_qd;            /* the engine's depth (adoption uses all of it) */
	uint64_t fb;               /* bytes of one file */
	/* index */
	struct ent *ents;
	uint32_t n_ents, cap_ents, free_ent;
	uint32_t *tab;             /* open addressing, linear probing: entry index + 1, 0 = empty */
	uint32_t tab_mask;
	uint32_t lru_head, lru_tail; /* head = least recently used */
	uint64_t present, writing, evicting; /* files per state */
	/* requests in the engine */
	struct req *reqs;
	uint32_t free_req;
	unsigned reqs_busy;
	struct fifo unlinks;       /* struct unlink_item: evictions waiting for an engine op */
	struct fifo done;          /* struct kvr_l2_done: completions not yet returned */
	struct kvr_l2io_done *iobuf;
	struct kvr_l2_store_stats st;
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
	if (!s || !src || lane >= s->cfg.lanes)
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
	rc = kvr_l2io_write(s->io, key, lane, src, r);
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
	int rc = kvr_l2io_read(s->io, key, lane, dst, r);
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
			return fifo_push(&s->done, &out);
		}
		s->st.get_misses++;
		s->st.dropped[d->reason < KVR_L2_R_MAX ? d->reason : KVR_L2_R_IO]++;
		if (same && e->state == E_PRESENT) {
			/* gone behind our back: nothing to unlink; read-only: never served again, but
			 * the file stays where it is */
			if (d->res == -ENOENT || s->cfg.read_only) {
				if (d->res != -ENOENT)
					s->st.bad_kept++;
				int rc = report_gone(s, e, d->reason);
				if (rc)
					return rc;
				lru_remove(s, rq.ent);
				s->present--;
				ent_free(s, rq.ent);
			} else { /* bad or unreadable: never served again */
				int rc = evict(s, rq.ent, d->reason);
				if (rc)
					return rc;
			}
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

/* ---- adoption -------------------------------------------------------------------------- */

struct cand {
	kvr_key key;
	uint32_t lane;
	int64_t mtime_ns;  /* probed; before the probe: the inode number (probe order) */
};

enum adopt_tag { T_PROBE = 1, T_UNLINK = 2 };

struct adopt {
	struct kvr_l2_store *s;
	struct kvr_l2_adopt_stats *st;
	struct cand *probe;        /* names to probe */
	size_t n_probe, cap_probe, next_probe;
	struct cand *ok;           /* probed fine */
	size_t n_ok;
	char **tmp;                /* leftovers to remove by name */
	size_t n_tmp, cap_tmp, next_tmp;
	struct cand *del;          /* (key, lane) files to remove */
	size_t n_del, cap_del, next_del;
};

static int push_cand(struct cand **v, size_t *n, size_t *cap, struct cand c)
{
	if (KVR_GROW(*v, *cap, *n + 1, 1024))
		return -ENOMEM;
	(*v)[(*n)++] = c;
	return 0;
}

static int push_tmp(struct adopt *a, const char *name)
{
	if (KVR_GROW(a->tmp, a->cap_tmp, a->n_tmp + 1, 64))
		return -ENOMEM;
	char *c = strdup(name);
	if (!c)
		return -ENOMEM;
	a->tmp[a->n_tmp++] = c;
	return 0;
}

/* Read the directory and sort every entry into probe, tmp (remove), delete or foreign. */
static int adopt_scan(struct adopt *a)
{
	struct kvr_l2_store *s = a->s;
	DIR *d = kvr_l2_opendir(s->dir_fd);
	if (!d)
		return -errno;
	int rc = 0;
	struct dirent *de;
	while ((errno = 0, de = readdir(d))) {
		const char *n = de->d_name;
		if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, KVR_L2_LOCK_NAME))
			continue;
		a->st->entries++;
		kvr_key key;
		uint32_t lane;
		if (kvr_l2_is_tmp_name(n) || !strncmp(n, ".kvr.probe.", 11)) {
			if (de->d_type != DT_DIR) {
				a->st->rejected[KVR_L2_R_TMP]++;
				if (s->cfg.read_only)
					a->st->left_in_place++;
				else
					rc = push_tmp(a, n);
			} else {
				a->st->rejected[KVR_L2_R_NOTREG]++;
				a->st->left_alone++;
			}
		} else if (kvr_l2_name_parse(n, &key, &lane)) {
			a->st->rejected[KVR_L2_R_FOREIGN]++;
			a->st->left_alone++;
		} else if (de->d_type == DT_DIR) {
			a->st->rejected[KVR_L2_R_NOTREG]++;
			a->st->left_alone++;
		} else if (lane >= s->cfg.lanes) {
			a->st->rejected[KVR_L2_R_LANE]++;
			if (s->cfg.read_only)
				a->st->left_in_place++;
			else
				rc = push_cand(&a->del, &a->n_del, &a->cap_del, (struct cand){key, lane, 0});
		} else {
			rc = push_cand(&a->probe, &a->n_probe, &a->cap_probe, (struct cand){key, lane, (int64_t)de->d_ino});
		}
		if (rc)
			break;
	}
	if (!rc && errno)
		rc = -errno;
	closedir(d);
	return rc;
}

/* Set an adopted block file that the probe found with other permission bits to 0600 (an older kvring wrote
 * it 0644, or it was copied in). Through a descriptor opened without following a symlink, so only the file
 * the probe checked is changed. 0 or -errno. */
static int fix_file_mode(struct kvr_l2_store *s, kvr_key key, uint32_t lane)
{
	char name[KVR_L2_NAME_MAX];
	struct stat st;
	int fd = openat(s->dir_fd, kvr_l2_name_fmt(key, lane, name),
			O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fstat(fd, &st) ? -errno : !S_ISREG(st.st_mode) ? -EBADMSG : fchmod(fd, 0600) ? -errno : 0;
	close(fd);
	return rc;
}

static void adopt_on_done(struct adopt *a, const struct kvr_l2io_done *d)
{
	struct kvr_l2io_done f;

	if ((d->tag >> 56) == T_UNLINK) {
		if (d->res == 0)
			a->st->deleted++;
		return;
	}
	if (d->res == 0 && d->mode != 0600 && !a->s->cfg.read_only) {
		int rc = fix_file_mode(a->s, d->key, d->lane);
		if (rc == 0) {
			a->st->modes_fixed++;
		} else {
			f = *d;
			f.res = rc;
			f.reason = rc == -ENOENT ? KVR_L2_R_VANISHED : KVR_L2_R_MODE;
			d = &f;
		}
	}
	if (d->res == 0) {
		a->ok[a->n_ok++] = (struct cand){d->key, d->lane, d->mtime_ns};
		return;
	}
	a->st->rejected[d->reason < KVR_L2_R_MAX ? d->reason : KVR_L2_R_IO]++;
	if (d->reason == KVR_L2_R_NOTREG || d->reason == KVR_L2_R_VANISHED) {
		if (d->reason == KVR_L2_R_NOTREG)
			a->st->left_alone++;
		return;
	}
	/* ours by name, but not a block of this configuration: remove it (a failed push only
	 * leaves the file for the next start); read-only: leave it */
	if (a->s->cfg.read_only) {
		a->st->left_in_place++;
		return;
	}
	(void)push_cand(&a->del, &a->n_del, &a->cap_del, (struct cand){d->key, d->lane, 0});
}

/* Run every queued probe and unlink through the engine, queue_depth at a time. */
static int adopt_pump(struct adopt *a)
{
	struct kvr_l2_store *s = a->s;
	struct kvr_l2io *io = s->io;
	unsigned qd = kvr_l2io_queue_depth(io);
	for (;;) {
		while (kvr_l2io_busy(io) < qd) {
			int rc;
			if (a->next_tmp < a->n_tmp) {
				rc = kvr_l2io_unlink_name(io, a->tmp[a->next_tmp], (kvr_key){0, 0}, 0,
							  (uint64_t)T_UNLINK << 56);
				a->next_tmp++;
			} else if (a->next_del < a->n_del) {
				struct cand *c = &a->del[a->next_del++];
				rc = kvr_l2io_unlink(io, c->key, c->lane, (uint64_t)T_UNLINK << 56);
			} else if (a->next_probe < a->n_probe) {
				struct cand *c = &a->probe[a->next_probe++];
				rc = kvr_l2io_probe(io, c->key, c->lane, (uint64_t)T_PROBE << 56);
			} else {
				break;
			}
			if (rc)
				return rc;
		}
		if (!kvr_l2io_busy(io))
			return 0;
		int n = kvr_l2io_reap(io, s->iobuf, qd, 1);
		if (n < 0)
			return n;
		for (int i = 0; i < n; i++)
			adopt_on_done(a, &s->iobuf[i]);
	}
}

static int cand_newest_first(const void *pa, const void *pb)
{
	const struct cand *x = pa, *y = pb;
	if (x->mtime_ns != y->mtime_ns)
		return x->mtime_ns > y->mtime_ns ? -1 : 1;
	if (x->key.hi != y->key.hi)
		return x->key.hi > y->key.hi ? -1 : 1;
	if (x->key.lo != y->key.lo)
		return x->key.lo > y->key.lo ? -1 : 1;
	return x->lane > y->lane ? -1 : x->lane < y->lane;
}

static int cand_by_ino(const void *pa, const void *pb)
{
	const struct cand *x = pa, *y = pb;
	return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

static int adopt(struct kvr_l2_store *s, struct kvr_l2_adopt_stats *st)
{
	uint64_t t0 = kvr_now_ns();
	struct adopt a = {.s = s, .st = st};
	int rc = adopt_scan(&a);
	if (rc)
		goto out;
	/* probe in inode order: on a cold cache the inode tables and headers are read nearly in
	 * disk order instead of at random */
	if (a.n_probe)
		qsort(a.probe, a.n_probe, sizeof(*a.probe), cand_by_ino);
	a.ok = malloc((a.n_probe ? a.n_probe : 1) * sizeof(*a.ok));
	if (!a.ok) {
		rc = -ENOMEM;
		goto out;
	}
	rc = adopt_pump(&a);
	if (rc)
		goto out;
	/* newest first: keep while it fits, delete the older rest */
	if (a.n_ok)
		qsort(a.ok, a.n_ok, sizeof(*a.ok), cand_newest_first);
	uint64_t keep = s->cfg.capacity_bytes / s->fb;
	if (keep > a.n_ok)
		keep = a.n_ok;
	for (size_t i = keep; i < a.n_ok; i++) {
		st->rejected[KVR_L2_R_OVER_CAP]++;
		if (s->cfg.read_only) {
			st->left_in_place++;
			continue;
		}
		rc = push_cand(&a.del, &a.n_del, &a.cap_del, a.ok[i]);
		if (rc)
			goto out;
	}
	/* oldest first into the LRU */
	for (size_t i = keep; i-- > 0;) {
		rc = grow(s);
		if (rc)
			goto out;
		uint32_t idx = ent_new(s, a.ok[i].key, a.ok[i].lane, E_PRESENT);
		lru_push(s, idx);
		s->present++;
	}
	st->adopted = keep;
	st->adopted_bytes = keep * s->fb;
	rc = adopt_pump(&a); /* the over-cap and bad files (none when read-only) */
out:
	for (size_t i = 0; i < a.n_tmp; i++)
		free(a.tmp[i]);
	free(a.tmp);
	free(a.probe);
	free(a.ok);
	free(a.del);
	st->elapsed_ns = kvr_now_ns() - t0;
	return rc;
}

/* ---- open / close ---------------------------------------------------------------------- */

static int flock_busy(int fd, int op)
{
	if (flock(fd, op | LOCK_NB) == 0)
		return 0;
	return errno == EWOULDBLOCK ? -EBUSY : -errno;
}

/* The instance lock (see the header): a writable store holds KVR_L2_LOCK_NAME (created if
 * needed) and the namespace directory exclusively; a read-only one holds both shared (the
 * lock file only when it exists: it is not created). */
static int lock_dir(struct kvr_l2_store *s)
{
	if (s->cfg.read_only) {
		int rc = flock_busy(s->dir_fd, LOCK_SH);
		if (rc)
			return rc;
		s->lock_fd = openat(s->dir_fd, KVR_L2_LOCK_NAME, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (s->lock_fd < 0)
			return errno == ENOENT ? 0 : -errno;
		return flock_busy(s->lock_fd, LOCK_SH);
	}
	s->lock_fd = openat(s->dir_fd, KVR_L2_LOCK_NAME, O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (s->lock_fd < 0)
		return -errno;
	int rc = flock_busy(s->lock_fd, LOCK_EX);
	return rc ? rc : flock_busy(s->dir_fd, LOCK_EX);
}

/* fd's permission bits made exactly mode (an existing file or directory may have any): 0 and *ret_was (its
 * bits before) and *ret_fixed, or -EACCES when it is not ours to change (EPERM), another -errno. */
static int fix_mode(int fd, mode_t mode, uint32_t *ret_was, bool *ret_fixed)
{
	struct stat st;

	*ret_fixed = false;
	if (fstat(fd, &st))
		return -errno;
	*ret_was = st.st_mode & 07777;
	if ((st.st_mode & 07777) == mode)
		return 0;
	if (fchmod(fd, mode))
		return errno == EPERM ? -EACCES : -errno;
	*ret_fixed = true;
	return 0;
}

/* A writable store's permissions (see the header): the namespace directory 0700, the lock file 0600, each
 * change logged (a block file a reader of another uid could read is a leak of the KV cache). */
static int fix_dir_modes(struct kvr_l2_store *s, struct kvr_l2_adopt_stats *st)
{
	uint32_t was = 0;
	bool fixed;
	int rc = fix_mode(s->dir_fd, 0700, &was, &fixed);
	if (rc) {
		kvr_err("l2 %s: namespace directory has mode %04o and cannot be set to 0700: %s", s->dir,
			(unsigned)was, strerror(-rc));
		return rc;
	}
	if (fixed) {
		st->dir_mode_fixed = true;
		st->dir_mode_was = was;
		kvr_warn("l2 %s: namespace directory had mode %04o: now 0700", s->dir, (unsigned)was);
	}
	rc = fix_mode(s->lock_fd, 0600, &was, &fixed);
	if (rc) {
		kvr_err("l2 %s/%s: mode %04o cannot be set to 0600: %s", s->dir, KVR_L2_LOCK_NAME, (unsigned)was,
			strerror(-rc));
		return rc;
	}
	if (fixed)
		kvr_warn("l2 %s/%s: had mode %04o: now 0600", s->dir, KVR_L2_LOCK_NAME, (unsigned)was);
	return 0;
}

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

/* The namespace directory opened (made first unless read-only), locked and its modes fixed; a
 * read-only store whose directory does not exist holds the root instead (ast->no_dir). */
static int open_ns_dir(struct kvr_l2_store *s, const struct kvr_l2_store_config *cfg, const char *hex,
		       struct kvr_l2_adopt_stats *ast)
{
	int rc = 0;
	int root_fd = open(cfg->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0)
		return -errno;
	if (!cfg->read_only && mkdirat(root_fd, hex, 0700) && errno != EEXIST) {
		rc = -errno;
		goto out;
	}
	s->dir_fd = openat(root_fd, hex, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (s->dir_fd < 0 && errno == ENOENT && cfg->read_only) {
		/* nothing stored under this namespace: serve nothing; the engine gets the root
		 * (it never opens a file there: the index stays empty) */
		ast->no_dir = true;
		s->dir_fd = root_fd;
		root_fd = -1;
	} else if (s->dir_fd < 0) {
		rc = -errno;
	} else {
		rc = lock_dir(s);
		if (!rc && !cfg->read_only)
			rc = fix_dir_modes(s, ast);
	}
out:
	if (root_fd >= 0)
		close(root_fd);
	return rc;
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
	};
	return kvr_l2io_open(&icfg, &s->io);
}

/* The block files on disk adopted, and the mode fixes adoption made logged. */
static int adopt_logged(struct kvr_l2_store *s, struct kvr_l2_adopt_stats *ast)
{
	int rc = adopt(s, ast);
	if (rc)
		return rc;
	if (ast->modes_fixed)
		kvr_warn("l2 %s: %llu block files had modes other than 0600: now 0600", s->dir,
			 (unsigned long long)ast->modes_fixed);
	if (ast->rejected[KVR_L2_R_MODE])
		kvr_warn("l2 %s: %llu block files could not be set to 0600: not adopted, removed", s->dir,
			 (unsigned long long)ast->rejected[KVR_L2_R_MODE]);
	return 0;
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
		rc = open_ns_dir(s, cfg, hex, &ast);
	if (!rc)
		rc = open_io(s, cfg);
	if (!rc && !ast.no_dir)
		rc = adopt_logged(s, &ast);
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
