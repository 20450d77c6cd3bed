/* Eviction policies behind kvr_policy_* (kvr_index.h): LRU and S3-FIFO over entry ids, for the block index. */
#include "kvr_index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NONE KVR_SLOT_NONE

struct policy_ops {
	const char *name;
	void (*insert)(struct kvr_policy *p, uint32_t e, kvr_key key, bool warm);
	void (*hit)(struct kvr_policy *p, uint32_t e);
	void (*remove)(struct kvr_policy *p, uint32_t e, bool evicted);
	uint32_t (*victim)(struct kvr_policy *p, kvr_policy_evictable_fn ok, void *ctx);
};

/* A doubly linked FIFO/LRU list of entry ids through the policy's prev/next arrays;
 * head is the newest end, tail the eviction end. */
struct list {
	uint32_t head, tail, n;
};

enum { Q_NONE = 0, Q_SMALL = 1, Q_MAIN = 2 };

/* Ghost FIFO of evicted keys' fingerprints: a ring plus a multiset (open addressing with
 * a count per fingerprint) so "was this key evicted recently" is O(1). */
struct ghost {
	uint64_t *ring;
	uint32_t cap, pos, n;
	uint64_t *fp;   /* hash set slots: fingerprint (0 = empty) */
	uint32_t *cnt;
	uint32_t mask;
};

struct kvr_policy {
	const struct policy_ops *ops;
	uint32_t max_ents;
	uint32_t *prev, *next;
	uint8_t *queue; /* Q_* */
	uint8_t *freq;  /* s3fifo: 0..3 */
	struct list lru;         /* lru */
	struct list small, main; /* s3fifo */
	uint32_t small_target;
	struct ghost ghost;
	kvr_key *keys;  /* s3fifo: each entry's key, for the ghost when it is evicted */
};

static void list_push_head(struct kvr_policy *p, struct list *l, uint32_t e)
{
	p->prev[e] = NONE;
	p->next[e] = l->head;
	if (l->head != NONE)
		p->prev[l->head] = e;
	l->head = e;
	if (l->tail == NONE)
		l->tail = e;
	l->n++;
}

static void list_unlink(struct kvr_policy *p, struct list *l, uint32_t e)
{
	if (p->prev[e] != NONE)
		p->next[p->prev[e]] = p->next[e];
	else
		l->head = p->next[e];
	if (p->next[e] != NONE)
		p->prev[p->next[e]] = p->prev[e];
	else
		l->tail = p->prev[e];
	p->prev[e] = p->next[e] = NONE;
	l->n--;
}

static void list_init(struct list *l)
{
	*l = (struct list){.head = NONE, .tail = NONE, .n = 0};
}

/* ---- lru ---- */

static void lru_insert(struct kvr_policy *p, uint32_t e, kvr_key key, bool warm)
{
	(void)key;
	(void)warm;
	list_push_head(p, &p->lru, e);
	p->queue[e] = Q_MAIN;
}

static void lru_hit(struct kvr_policy *p, uint32_t e)
{
	if (p->queue[e] == Q_NONE || p->lru.head == e)
		return;
	list_unlink(p, &p->lru, e);
	list_push_head(p, &p->lru, e);
}

static void lru_remove(struct kvr_policy *p, uint32_t e, bool evicted)
{
	(void)evicted;
	if (p->queue[e] == Q_NONE)
		return;
	list_unlink(p, &p->lru, e);
	p->queue[e] = Q_NONE;
}

static uint32_t lru_victim(struct kvr_policy *p, kvr_policy_evictable_fn ok, void *ctx)
{
	for (uint32_t e = p->lru.tail; e != NONE; e = p->prev[e])
		if (ok(ctx, e))
			return e;
	return NONE;
}

/* ---- ghost ---- */

static uint64_t fingerprint(kvr_key k)
{
	uint64_t f = k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull);
	return f ? f : 1;
}

static int ghost_init(struct ghost *g, uint32_t cap)
{
	memset(g, 0, sizeof(*g));
	if (!cap)
		return 0;
	uint32_t slots = 4;
	while (slots < 2 * cap)
		slots <<= 1;
	g->ring = calloc(cap, sizeof(*g->ring));
	g->fp = calloc(slots, sizeof(*g->fp));
	g->cnt = calloc(slots, sizeof(*g->cnt));
	if (!g->ring || !g->fp || !g->cnt)
		return -ENOMEM;
	g->cap = cap;
	g->mask = slots - 1;
	return 0;
}

static void ghost_free(struct ghost *g)
{
	free(g->ring);
	free(g->fp);
	free(g->cnt);
}

static uint32_t ghost_find(const struct ghost *g, uint64_t f)
{
	for (uint32_t i = (uint32_t)f & g->mask;; i = (i + 1) & g->mask) {
		if (!g->fp[i] || g->fp[i] == f)
			return i;
	}
}

static bool ghost_has(const struct ghost *g, kvr_key k)
{
	if (!g->cap)
		return false;
	return g->fp[ghost_find(g, fingerprint(k))] != 0;
}

static void ghost_del(struct ghost *g, uint64_t f)
{
	uint32_t i = ghost_find(g, f);
	if (!g->fp[i] || --g->cnt[i])
		return;
	/* backward-shift deletion keeps every probe chain unbroken */
	uint32_t j = i;
	for (;;) {
		g->fp[i] = 0;
		g->cnt[i] = 0;
		for (;;) {
			j = (j + 1) & g->mask;
			if (!g->fp[j])
				return;
			uint32_t home = (uint32_t)g->fp[j] & g->mask;
			/* move j into the hole at i unless its home lies cyclically in (i, j] */
			if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
				continue;
			break;
		}
		g->fp[i] = g->fp[j];
		g->cnt[i] = g->cnt[j];
		i = j;
	}
}

static void ghost_add(struct ghost *g, kvr_key k)
{
	if (!g->cap)
		return;
	uint64_t f = fingerprint(k);
	if (g->n == g->cap)
		ghost_del(g, g->ring[g->pos]);
	else
		g->n++;
	g->ring[g->pos] = f;
	g->pos = (g->pos + 1) % g->cap;
	uint32_t i = ghost_find(g, f);
	g->fp[i] = f;
	g->cnt[i]++;
}

/* ---- s3fifo ---- */

static void s3_insert(struct kvr_policy *p, uint32_t e, kvr_key key, bool warm)
{
	p->keys[e] = key;
	p->freq[e] = 0;
	if (warm || ghost_has(&p->ghost, key)) {
		list_push_head(p, &p->main, e);
		p->queue[e] = Q_MAIN;
	} else {
		list_push_head(p, &p->small, e);
		p->queue[e] = Q_SMALL;
	}
}

static void s3_hit(struct kvr_policy *p, uint32_t e)
{
	if (p->queue[e] != Q_NONE && p->freq[e] < 3)
		p->freq[e]++;
}

/* Only blocks evicted from the small queue enter the ghost (they were never hit). */
static void s3_remove(struct kvr_policy *p, uint32_t e, bool evicted)
{
	uint8_t q = p->queue[e];
	if (q == Q_NONE)
		return;
	list_unlink(p, q == Q_SMALL ? &p->small : &p->main, e);
	if (evicted && q == Q_SMALL)
		ghost_add(&p->ghost, p->keys[e]);
	p->queue[e] = Q_NONE;
	p->freq[e] = 0;
}

static uint32_t s3_victim(struct kvr_policy *p, kvr_policy_evictable_fn ok, void *ctx)
{
	/* Every step promotes (bounded by the small queue), decrements a frequency (bounded
	 * by 3 per entry) or skips an entry the caller cannot evict; a queue is given up on
	 * after a full round of consecutive skips, so the loop ends. */
	uint32_t small_skips = 0, main_skips = 0;
	bool small_blocked = false, main_blocked = false;
	for (;;) {
		bool small_ok = p->small.n && !small_blocked, main_ok = p->main.n && !main_blocked;
		if (!small_ok && !main_ok)
			return NONE;
		bool use_small = small_ok && (p->small.n >= p->small_target || !main_ok);
		if (use_small) {
			uint32_t t = p->small.tail;
			list_unlink(p, &p->small, t);
			if (p->freq[t]) {
				/* accessed while in small: promote to main */
				p->freq[t] = 0;
				list_push_head(p, &p->main, t);
				p->queue[t] = Q_MAIN;
				small_skips = 0;
				main_blocked = false;
				main_skips = 0;
				continue;
			}
			list_push_head(p, &p->small, t);
			if (ok(ctx, t))
				return t;
			if (++small_skips >= p->small.n)
				small_blocked = true;
		} else {
			uint32_t t = p->main.tail;
			list_unlink(p, &p->main, t);
			list_push_head(p, &p->main, t);
			if (p->freq[t]) {
				p->freq[t]--;
				main_skips = 0;
				continue;
			}
			if (ok(ctx, t))
				return t;
			if (++main_skips >= p->main.n)
				main_blocked = true;
		}
	}
}

/* ---- common ---- */

static const struct policy_ops lru_ops = {"lru", lru_insert, lru_hit, lru_remove, lru_victim};

static const struct policy_ops s3_ops = {"s3fifo", s3_insert, s3_hit, s3_remove, s3_victim};

static const struct policy_ops *const all_ops[] = {&lru_ops, &s3_ops};

const char *kvr_policy_names(void)
{
	return "lru, s3fifo";
}

int kvr_policy_new(const char *name, uint32_t max_ents, uint32_t capacity, struct kvr_policy **ret)
{
	if (!name || !ret || !max_ents || !capacity || max_ents == NONE)
		return -EINVAL;
	const struct policy_ops *ops = NULL;
	for (unsigned i = 0; i < sizeof(all_ops) / sizeof(all_ops[0]); i++)
		if (!strcmp(all_ops[i]->name, name))
			ops = all_ops[i];
	if (!ops)
		return -EINVAL;
	bool s3 = ops == &s3_ops;
	struct kvr_policy *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->ops = ops;
	p->max_ents = max_ents;
	p->prev = malloc((size_t)max_ents * sizeof(*p->prev));
	p->next = malloc((size_t)max_ents * sizeof(*p->next));
	p->queue = calloc(max_ents, 1);
	p->freq = calloc(max_ents, 1);
	list_init(&p->lru);
	list_init(&p->small);
	list_init(&p->main);
	p->small_target = capacity / 10 ? capacity / 10 : 1;
	int rc = 0;
	if (s3) {
		p->keys = calloc(max_ents, sizeof(*p->keys));
		rc = p->keys ? ghost_init(&p->ghost, capacity - p->small_target) : -ENOMEM;
	}
	if (!p->prev || !p->next || !p->queue || !p->freq || rc) {
		kvr_policy_free(p);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < max_ents; i++)
		p->prev[i] = p->next[i] = NONE;
	*ret = p;
	return 0;
}

void kvr_policy_free(struct kvr_policy *p)
{
	if (!p)
		return;
	free(p->prev);
	free(p->next);
	free(p->queue);
	free(p->freq);
	ghost_free(&p->ghost);
	free(p->keys);
	free(p);
}

const char *kvr_policy_name(const struct kvr_policy *p)
{
	return p->ops->name;
}

void kvr_policy_insert(struct kvr_policy *p, uint32_t ent, kvr_key key, bool warm)
{
	if (ent < p->max_ents && p->queue[ent] == Q_NONE)
		p->ops->insert(p, ent, key, warm);
}

void kvr_policy_hit(struct kvr_policy *p, uint32_t ent)
{
	if (ent < p->max_ents)
		p->ops->hit(p, ent);
}

void kvr_policy_remove(struct kvr_policy *p, uint32_t ent, bool evicted)
{
	if (ent < p->max_ents)
		p->ops->remove(p, ent, evicted);
}

uint32_t kvr_policy_victim(struct kvr_policy *p, kvr_policy_evictable_fn evictable, void *ctx)
{
	return p->ops->victim(p, evictable, ctx);
}
