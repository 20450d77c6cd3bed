/* Block index: key -> lanes map over the slot table, quorum visibility, suffix-only allocation; its eviction
 * policy is policy.c's (kvr_policy_*). */
#include "kvr_index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvring/msg.h"

_Static_assert(sizeof(struct kvr_index_ref) == sizeof(struct kvr_msg_slot), "index ref is a message slot item");
_Static_assert(KVR_INDEX_PRESENT == KVR_SLOT_PRESENT && KVR_INDEX_NOROOM == KVR_SLOT_NOROOM, "alloc sentinels");

#define NONE KVR_SLOT_NONE

struct ent {
	kvr_key key;
	uint16_t alloc_mask, commit_mask;
	uint16_t full;        /* commit_mask when visible: one bit per lane of the block */
	uint32_t mark;        /* == idx->stamp while an alloc call protects it from eviction */
	uint64_t last_access; /* rebuild only */
};

struct kvr_index {
	struct kvr_slot_table *t;
	uint32_t n_slots, lanes; /* lanes: the most a block has (kvr_slots_lanes_max), ent_slots' stride */
	uint32_t quorum;         /* the table's, or 0: each block its own (ent.full) */
	char policy_name[16];
	struct kvr_policy *pol;

	struct ent *ents;      /* [n_slots]: a block holds at least one slot */
	uint32_t *ent_slots;   /* [n_slots * lanes]: slot of lane l of entry e, NONE if none */
	uint32_t *free_ents, n_free_ents;
	uint32_t *htab, hmask; /* open addressing, linear probing: entry ids, NONE empty */
	uint32_t *slot_ent;    /* [n_slots]: the entry a tracked slot belongs to, or NONE */
	uint32_t *free_slots, n_free_slots;
	uint32_t *draining, n_draining; /* aborted slots whose I/O is still in flight (DRAINING) */
	uint32_t stamp;
	uint64_t evictions, noroom;
	kvr_index_evict_hook_fn evict_hook; /* may veto an eviction (write-back: not on disk yet) */
	void *evict_hook_ctx;
	kvr_index_progress_fn progress;     /* a beat every KVR_INDEX_PROGRESS_KEYS keys */
	void *progress_ctx;
	uint64_t *gone;        /* [KVR_INDEX_GONE_SLOTS]: keys (lo ^ hi) of blocks that left, direct-mapped */
};

static inline void progress(const struct kvr_index *idx, uint32_t i)
{
	if (idx->progress && i % KVR_INDEX_PROGRESS_KEYS == KVR_INDEX_PROGRESS_KEYS - 1)
		idx->progress(idx->progress_ctx);
}

static inline uint32_t *lane_slot(const struct kvr_index *idx, uint32_t e, unsigned lane)
{
	return &idx->ent_slots[(size_t)e * idx->lanes + lane];
}

static uint32_t h_find(const struct kvr_index *idx, kvr_key k)
{
	for (uint32_t i = (uint32_t)k.lo & idx->hmask;; i = (i + 1) & idx->hmask) {
		uint32_t e = idx->htab[i];
		if (e == NONE)
			return NONE;
		if (kvr_key_eq(idx->ents[e].key, k))
			return e;
	}
}

static void h_insert(struct kvr_index *idx, uint32_t e)
{
	uint32_t i = (uint32_t)idx->ents[e].key.lo & idx->hmask;
	while (idx->htab[i] != NONE)
		i = (i + 1) & idx->hmask;
	idx->htab[i] = e;
}

static void h_delete(struct kvr_index *idx, uint32_t e)
{
	uint32_t i = (uint32_t)idx->ents[e].key.lo & idx->hmask;
	while (idx->htab[i] != e)
		i = (i + 1) & idx->hmask;
	/* backward-shift deletion, as in the ghost */
	uint32_t j = i;
	for (;;) {
		idx->htab[i] = NONE;
		for (;;) {
			j = (j + 1) & idx->hmask;
			if (idx->htab[j] == NONE)
				return;
			uint32_t home = (uint32_t)idx->ents[idx->htab[j]].key.lo & idx->hmask;
			if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
				continue;
			break;
		}
		idx->htab[i] = idx->htab[j];
		i = j;
	}
}

static uint16_t lanes_mask(unsigned lanes)
{
	return (uint16_t)((1u << lanes) - 1);
}

static bool visible(const struct ent *en)
{
	return en->alloc_mask && en->commit_mask == en->full;
}

/* A new entry for a block of `lanes` lanes. */
static uint32_t ent_new(struct kvr_index *idx, kvr_key key, unsigned lanes)
{
	if (!idx->n_free_ents)
		return NONE;
	uint32_t e = idx->free_ents[--idx->n_free_ents];
	idx->ents[e] = (struct ent){.key = key, .full = lanes_mask(lanes)};
	for (unsigned l = 0; l < idx->lanes; l++)
		*lane_slot(idx, e, l) = NONE;
	h_insert(idx, e);
	return e;
}

/* Forget entry e (its lanes must already be released). */
static void ent_drop(struct kvr_index *idx, uint32_t e, bool evicted)
{
	kvr_policy_remove(idx->pol, e, evicted);
	h_delete(idx, e);
	idx->ents[e].alloc_mask = idx->ents[e].commit_mask = 0;
	idx->free_ents[idx->n_free_ents++] = e;
}

static void slot_release(struct kvr_index *idx, uint32_t s)
{
	idx->slot_ent[s] = NONE;
	idx->free_slots[idx->n_free_slots++] = s;
}

/* An aborted slot: free now, or once its I/O is done (kvr_index_reap). The draining list
 * also holds evicted lanes whose final step met a pinner backing off (still EVICTING). */
static void slot_aborted(struct kvr_index *idx, uint32_t s, int abort_rc)
{
	idx->slot_ent[s] = NONE;
	if (abort_rc == 1)
		idx->draining[idx->n_draining++] = s;
	else if (abort_rc == 0)
		idx->free_slots[idx->n_free_slots++] = s;
}

unsigned kvr_index_reap(struct kvr_index *idx)
{
	unsigned n = 0;
	for (uint32_t k = 0; idx && k < idx->n_draining;) {
		uint32_t s = idx->draining[k];
		int rc = kvr_slot_state(idx->t, s) == KVR_SLOT_EVICTING
				 ? kvr_slot_evict(idx->t, s, kvr_slot_epoch(idx->t, s))
				 : kvr_slot_drained(idx->t, s);
		if (rc == -EBUSY) {
			k++;
			continue;
		}
		idx->draining[k] = idx->draining[--idx->n_draining];
		if (rc == 0) {
			idx->free_slots[idx->n_free_slots++] = s;
			n++;
		}
	}
	return n;
}

unsigned kvr_index_draining(const struct kvr_index *idx)
{
	return idx ? idx->n_draining : 0;
}

static bool block_pinned(const struct kvr_index *idx, uint32_t e)
{
	for (unsigned l = 0; l < idx->lanes; l++) {
		uint32_t s = *lane_slot(idx, e, l);
		if (s != NONE && kvr_slot_pins(idx->t, s))
			return true;
	}
	return false;
}

static bool evictable(void *ctx, uint32_t e)
{
	struct kvr_index *idx = ctx;
	const struct ent *en = &idx->ents[e];
	return en->mark != idx->stamp && en->alloc_mask == en->commit_mask && !block_pinned(idx, e) &&
	       (!idx->evict_hook || idx->evict_hook(idx->evict_hook_ctx, en->key, lane_slot(idx, e, 0)));
}

void kvr_index_set_evict_hook(struct kvr_index *idx, kvr_index_evict_hook_fn fn, void *ctx)
{
	idx->evict_hook = fn;
	idx->evict_hook_ctx = ctx;
}

void kvr_index_set_progress(struct kvr_index *idx, kvr_index_progress_fn fn, void *ctx)
{
	idx->progress = fn;
	idx->progress_ctx = ctx;
}

/* Evict a block chosen by the policy: all its lanes go back to the free list. A loader
 * may pin a lane between the policy's check and the eviction (loaders pin in their own
 * process); then the lanes already moved to EVICTING go back to COMMITTED and the next
 * victim is tried. */
static int evict_one(struct kvr_index *idx)
{
	for (int attempt = 0; attempt < 8; attempt++) {
		uint32_t e = kvr_policy_victim(idx->pol, evictable, idx);
		if (e == NONE)
			return -ENOSPC;
		unsigned begun = 0;
		bool busy = false;
		for (unsigned l = 0; l < idx->lanes && !busy; l++) {
			uint32_t s = *lane_slot(idx, e, l);
			if (s == NONE)
				continue;
			if (kvr_slot_evict_begin(idx->t, s, kvr_slot_epoch(idx->t, s)) == 0)
				begun |= 1u << l;
			else
				busy = true;
		}
		if (busy) {
			for (unsigned l = 0; l < idx->lanes; l++)
				if (begun & (1u << l)) {
					uint32_t s = *lane_slot(idx, e, l);
					(void)kvr_slot_evict_cancel(idx->t, s, kvr_slot_epoch(idx->t, s));
				}
			idx->ents[e].mark = idx->stamp; /* not again during this request */
			continue;
		}
		for (unsigned l = 0; l < idx->lanes; l++) {
			uint32_t s = *lane_slot(idx, e, l);
			if (s == NONE)
				continue;
			if (kvr_slot_evict(idx->t, s, kvr_slot_epoch(idx->t, s)) == 0) {
				slot_release(idx, s);
			} else {
				/* a loader's pin came between evict_begin and evict: it backs off (the slot
				 * is EVICTING, it pins only COMMITTED), so the slot is freed by a later reap,
				 * never reused before (found by faults_stress: a slot left EVICTING) */
				idx->slot_ent[s] = NONE;
				idx->draining[idx->n_draining++] = s;
			}
			*lane_slot(idx, e, l) = NONE;
		}
		kvr_index_remember_gone(idx, idx->ents[e].key);
		ent_drop(idx, e, true);
		idx->evictions++;
		return 0;
	}
	return -ENOSPC;
}

/*
 * What left: a direct-mapped table of the keys of blocks evicted from L1 (and, through
 * l2tier, deleted from L2), so that a lookup's miss can say "evicted" rather than "never
 * stored". A newer key overwrites an older one in its cell: the memory is of roughly the
 * last KVR_INDEX_GONE_SLOTS departures, and a block that left long ago reads as never
 * stored — a reason is a diagnosis, never a decision.
 */
static uint64_t gone_tag(kvr_key key)
{
	uint64_t t = key.lo ^ key.hi;
	return t ? t : 1; /* 0 marks an empty cell */
}

void kvr_index_remember_gone(struct kvr_index *idx, kvr_key key)
{
	uint64_t t = gone_tag(key);
	idx->gone[t & (KVR_INDEX_GONE_SLOTS - 1)] = t;
}

void kvr_index_forget_gone(struct kvr_index *idx, kvr_key key)
{
	uint64_t t = gone_tag(key);
	if (idx->gone[t & (KVR_INDEX_GONE_SLOTS - 1)] == t)
		idx->gone[t & (KVR_INDEX_GONE_SLOTS - 1)] = 0;
}

bool kvr_index_gone_recently(const struct kvr_index *idx, kvr_key key)
{
	uint64_t t = gone_tag(key);
	return idx->gone[t & (KVR_INDEX_GONE_SLOTS - 1)] == t;
}

static int index_alloc_arrays(struct kvr_index *idx, uint32_t n_slots, uint32_t lanes)
{
	uint32_t hsize = 4;
	while (hsize < 2 * n_slots)
		hsize <<= 1;
	idx->ents = calloc(n_slots, sizeof(*idx->ents));
	idx->ent_slots = malloc((size_t)n_slots * lanes * sizeof(*idx->ent_slots));
	idx->free_ents = malloc((size_t)n_slots * sizeof(*idx->free_ents));
	idx->htab = malloc((size_t)hsize * sizeof(*idx->htab));
	idx->slot_ent = malloc((size_t)n_slots * sizeof(*idx->slot_ent));
	idx->free_slots = malloc((size_t)n_slots * sizeof(*idx->free_slots));
	idx->draining = malloc((size_t)n_slots * sizeof(*idx->draining));
	idx->gone = calloc(KVR_INDEX_GONE_SLOTS, sizeof(*idx->gone));
	if (!idx->ents || !idx->ent_slots || !idx->free_ents || !idx->htab || !idx->slot_ent || !idx->free_slots ||
	    !idx->draining || !idx->gone)
		return -ENOMEM;
	idx->hmask = hsize - 1;
	return 0;
}

int kvr_index_new(struct kvr_slot_table *t, const char *policy, struct kvr_index **ret)
{
	if (!t || !policy || !ret || !t->n_slots || t->n_slots >= NONE - 1 || !kvr_slots_lanes_max(t) ||
	    kvr_slots_lanes_max(t) > KVR_INDEX_MAX_LANES || strlen(policy) >= sizeof(((struct kvr_index *)0)->policy_name))
		return -EINVAL;
	struct kvr_index *idx = calloc(1, sizeof(*idx));
	if (!idx)
		return -ENOMEM;
	idx->t = t;
	idx->n_slots = t->n_slots;
	idx->lanes = kvr_slots_lanes_max(t);
	idx->quorum = t->quorum;
	strcpy(idx->policy_name, policy);
	int rc = index_alloc_arrays(idx, idx->n_slots, idx->lanes);
	if (rc < 0)
		goto fail;
	rc = kvr_index_rebuild(idx, t);
	if (rc < 0)
		goto fail;
	*ret = idx;
	return 0;
fail:
	kvr_index_free(idx);
	return rc;
}

void kvr_index_free(struct kvr_index *idx)
{
	if (!idx)
		return;
	kvr_policy_free(idx->pol);
	free(idx->ents);
	free(idx->ent_slots);
	free(idx->free_ents);
	free(idx->htab);
	free(idx->slot_ent);
	free(idx->free_slots);
	free(idx->draining);
	free(idx->gone);
	free(idx);
}

/* Return a slot that cannot belong to a block to FREE, unless pinned or EVICTING. */
static void release_stray(struct kvr_slot_table *t, uint32_t s)
{
	uint32_t st = kvr_slot_state(t, s), ep = kvr_slot_epoch(t, s);
	if (st == KVR_SLOT_WRITING)
		(void)kvr_slot_abort(t, s, ep);
	else if (st == KVR_SLOT_COMMITTED)
		(void)kvr_slot_evict(t, s, ep); /* -EBUSY when pinned: it stays, untracked */
}

static int cmp_recency(const void *a, const void *b, void *arg)
{
	const struct ent *ents = arg;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	if (ents[x].last_access != ents[y].last_access)
		return ents[x].last_access < ents[y].last_access ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* An empty index over t with a fresh policy. 0 or -errno. */
static int rebuild_reset(struct kvr_index *idx, struct kvr_slot_table *t)
{
	struct kvr_policy *pol;
	unsigned q = idx->quorum ? idx->quorum : 1; /* several quorums: at most a block a slot */
	uint32_t capacity = idx->n_slots / q ? idx->n_slots / q : 1; /* blocks */
	int rc = kvr_policy_new(idx->policy_name, idx->n_slots, capacity, &pol);
	if (rc < 0)
		return rc;
	kvr_policy_free(idx->pol);
	idx->pol = pol;
	idx->t = t;
	memset(idx->htab, 0xff, (size_t)(idx->hmask + 1) * sizeof(*idx->htab));
	memset(idx->ents, 0, (size_t)idx->n_slots * sizeof(*idx->ents));
	idx->n_free_ents = 0;
	for (uint32_t e = idx->n_slots; e-- > 0;)
		idx->free_ents[idx->n_free_ents++] = e; /* entry 0 is taken first */
	idx->n_free_slots = 0;
	idx->stamp = 0;
	return 0;
}

/* Track slot s (WRITING or COMMITTED) as a lane of its block; strays are released.
 * Returns 1 when it made a new block. */
static int rebuild_slot(struct kvr_index *idx, struct kvr_slot_table *t, uint32_t s)
{
	idx->slot_ent[s] = NONE;
	struct kvr_slot *sl = kvr_slot_at(t, s);
	uint32_t st = kvr_slot_state(t, s);
	/* EVICTING only ever lasts inside one eviction by the lookup actor: one that died
	 * mid-eviction left it. Nothing was freed yet, the bytes are the block's: it goes
	 * back to COMMITTED (a block left without some lanes is evicted in its turn). */
	if (st == KVR_SLOT_EVICTING && kvr_slot_evict_cancel(t, s, kvr_slot_epoch(t, s)) == 0)
		st = KVR_SLOT_COMMITTED;
	if (st != KVR_SLOT_WRITING && st != KVR_SLOT_COMMITTED)
		return 0;
	/* a promotion of a lookup actor that died: nobody waits for it any more; a slot of
	 * another block size than the table's (mixed: any, but one was set), or whose lane or
	 * lane count does not fit (mixed: set, and the same for every lane of the block) is
	 * not ours */
	unsigned lanes = kvr_slot_block_lanes(t, s);
	uint32_t e = h_find(idx, sl->key);
	if (!lanes || lanes > idx->lanes || sl->lane >= lanes ||
	    (t->block_tokens ? sl->block_tokens != t->block_tokens : !sl->block_tokens) ||
	    (e != NONE && idx->ents[e].full != lanes_mask(lanes)) ||
	    (st == KVR_SLOT_WRITING && sl->owner == KVR_SLOT_OWNER_LOOKUP)) {
		release_stray(t, s);
		return 0;
	}
	int made = 0;
	if (e == NONE) {
		e = ent_new(idx, sl->key, lanes);
		made = 1;
	} else if (*lane_slot(idx, e, sl->lane) != NONE) {
		/* a second slot for the same key and lane: keep a committed one */
		uint32_t prev = *lane_slot(idx, e, sl->lane);
		if (st != KVR_SLOT_COMMITTED || kvr_slot_state(t, prev) == KVR_SLOT_COMMITTED) {
			release_stray(t, s);
			return 0;
		}
		release_stray(t, prev);
		idx->slot_ent[prev] = NONE;
	}
	struct ent *en = &idx->ents[e];
	*lane_slot(idx, e, sl->lane) = s;
	en->alloc_mask |= (uint16_t)(1u << sl->lane);
	if (st == KVR_SLOT_COMMITTED)
		en->commit_mask |= (uint16_t)(1u << sl->lane);
	if (sl->last_access > en->last_access)
		en->last_access = sl->last_access;
	idx->slot_ent[s] = e;
	return made;
}

/* The rebuilt blocks into the policy, oldest first, so the most recent ends at the head.
 * 0 or -ENOMEM. */
static int rebuild_policy(struct kvr_index *idx, uint32_t blocks)
{
	uint32_t *order = malloc((size_t)(blocks ? blocks : 1) * sizeof(*order));
	if (!order)
		return -ENOMEM;
	uint32_t k = 0;
	for (uint32_t e = 0; e < idx->n_slots && k < blocks; e++)
		if (idx->ents[e].alloc_mask)
			order[k++] = e;
	qsort_r(order, k, sizeof(*order), cmp_recency, idx->ents);
	for (uint32_t i = 0; i < k; i++)
		kvr_policy_insert(idx->pol, order[i], idx->ents[order[i]].key, true);
	free(order);
	return 0;
}

int kvr_index_rebuild(struct kvr_index *idx, struct kvr_slot_table *t)
{
	if (!idx || !t || t->n_slots != idx->n_slots || t->quorum != idx->quorum || kvr_slots_lanes_max(t) != idx->lanes)
		return -EINVAL;
	int rc = rebuild_reset(idx, t);
	if (rc < 0)
		return rc;
	uint32_t blocks = 0;
	for (uint32_t s = 0; s < idx->n_slots; s++)
		blocks += (uint32_t)rebuild_slot(idx, t, s);
	/* free list after the strays were released; lowest slot on top. DRAINING slots (an
	 * I/O of a dead actor may still be landing in them) wait for kvr_index_reap. */
	idx->n_draining = 0;
	for (uint32_t s = idx->n_slots; s-- > 0;) {
		uint32_t st = kvr_slot_state(t, s);
		if (st == KVR_SLOT_FREE)
			idx->free_slots[idx->n_free_slots++] = s;
		else if (st == KVR_SLOT_DRAINING)
			idx->draining[idx->n_draining++] = s;
	}
	rc = rebuild_policy(idx, blocks);
	return rc < 0 ? rc : (int)blocks;
}

int kvr_index_match(struct kvr_index *idx, const kvr_key *keys, uint32_t n, unsigned lane,
		    struct kvr_index_ref *ret_slots)
{
	if (!idx || lane >= idx->lanes || (n && !keys) || n > INT32_MAX)
		return -EINVAL;
	uint32_t i;
	for (i = 0; i < n; i++) {
		progress(idx, i);
		uint32_t e = h_find(idx, keys[i]);
		if (e == NONE || !visible(&idx->ents[e]) || !(idx->ents[e].full & (1u << lane)))
			break;
		uint32_t s = *lane_slot(idx, e, lane);
		(void)kvr_slot_touch(idx->t, s, kvr_slots_tick(idx->t));
		if (lane == 0)
			kvr_policy_hit(idx->pol, e);
		if (ret_slots)
			ret_slots[i] = (struct kvr_index_ref){.slot = s, .epoch = kvr_slot_epoch(idx->t, s)};
	}
	return (int)i;
}

int kvr_index_alloc(struct kvr_index *idx, const kvr_key *keys, uint32_t n, unsigned lane, unsigned owner,
		    struct kvr_index_ref *ret_slots, struct kvr_index_alloc_stats *ret_stats)
{
	const struct kvr_slot_tag tag = {.lanes = idx ? (uint8_t)idx->quorum : 0};
	return kvr_index_alloc_tagged(idx, keys, n, lane, &tag, owner, ret_slots, ret_stats);
}

int kvr_index_alloc_tagged(struct kvr_index *idx, const kvr_key *keys, uint32_t n, unsigned lane,
			   const struct kvr_slot_tag *tag, unsigned owner, struct kvr_index_ref *ret_slots,
			   struct kvr_index_alloc_stats *ret_stats)
{
	const unsigned lanes = tag ? tag->lanes : 0;
	if (!idx || !lanes || lanes > idx->lanes || (idx->quorum && lanes != idx->quorum) || lane >= lanes ||
	    (owner >= KVR_SLOT_MAX_WORKERS && owner != KVR_SLOT_OWNER_LOOKUP) || (n && (!keys || !ret_slots)))
		return -EINVAL;
	struct kvr_index_alloc_stats st = {0};
	const uint16_t bit = (uint16_t)(1u << lane);

	/* protect every block of this request from being chosen as a victim by it */
	if (++idx->stamp == 0)
		idx->stamp = 1;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t e = h_find(idx, keys[i]);
		if (e != NONE)
			idx->ents[e].mark = idx->stamp;
	}

	bool gap = false;
	for (uint32_t i = 0; i < n; i++) {
		progress(idx, i);
		uint32_t e = h_find(idx, keys[i]);
		if (e != NONE && (idx->ents[e].alloc_mask & bit)) {
			ret_slots[i] = (struct kvr_index_ref){KVR_INDEX_PRESENT, 0};
			st.present++;
			continue;
		}
		if (e != NONE && idx->ents[e].full != lanes_mask(lanes)) {
			/* the key of a block of another lane count: keys chain from a namespace that
			 * holds the TP size, so only a collision gets here; never mix the two */
			ret_slots[i] = (struct kvr_index_ref){KVR_INDEX_NOROOM, 0};
			st.noroom++;
			gap = true;
			continue;
		}
		uint32_t s = NONE, epoch = 0;
		while (!gap && s == NONE) {
			if (!idx->n_free_slots && idx->n_draining)
				(void)kvr_index_reap(idx);
			if (!idx->n_free_slots) {
				if (evict_one(idx) < 0) {
					gap = true;
					break;
				}
				st.evicted++;
				continue;
			}
			uint32_t c = idx->free_slots[--idx->n_free_slots];
			if (kvr_slot_alloc_tagged(idx->t, c, keys[i], (uint16_t)lane, (uint8_t)owner, tag, &epoch) == 0)
				s = c; /* else the slot is not FREE in the table: drop it from the free list */
		}
		if (s == NONE) {
			ret_slots[i] = (struct kvr_index_ref){KVR_INDEX_NOROOM, 0};
			st.noroom++;
			continue;
		}
		if (e == NONE) {
			/* cannot fail: every entry holds a slot and slot s is not tracked yet */
			e = ent_new(idx, keys[i], lanes);
			if (e == NONE) {
				slot_aborted(idx, s, kvr_slot_abort(idx->t, s, epoch));
				ret_slots[i] = (struct kvr_index_ref){KVR_INDEX_NOROOM, 0};
				st.noroom++;
				gap = true;
				continue;
			}
			idx->ents[e].mark = idx->stamp;
			kvr_policy_insert(idx->pol, e, keys[i], false);
		}
		*lane_slot(idx, e, lane) = s;
		idx->ents[e].alloc_mask |= bit;
		idx->slot_ent[s] = e;
		ret_slots[i] = (struct kvr_index_ref){s, epoch};
		st.allocated++;
	}
	idx->noroom += st.noroom;
	if (ret_stats)
		*ret_stats = st;
	return 0;
}

/* The entry and lane of a tracked slot, after checking it against the caller's lane. */
static int tracked(const struct kvr_index *idx, uint32_t slot, uint32_t *ret_e, unsigned *ret_lane)
{
	if (slot >= idx->n_slots)
		return -EINVAL;
	uint32_t e = idx->slot_ent[slot];
	if (e == NONE)
		return -ESTALE;
	for (unsigned l = 0; l < idx->lanes; l++)
		if (*lane_slot(idx, e, l) == slot) {
			*ret_e = e;
			*ret_lane = l;
			return 0;
		}
	return -ESTALE;
}

int kvr_index_commit(struct kvr_index *idx, unsigned lane, uint32_t slot, uint32_t epoch)
{
	if (!idx)
		return -EINVAL;
	uint32_t e;
	unsigned l;
	int rc = tracked(idx, slot, &e, &l);
	if (rc < 0)
		return rc;
	if (l != lane)
		return -EINVAL;
	rc = kvr_slot_commit(idx->t, slot, epoch);
	if (rc < 0)
		return rc;
	struct ent *en = &idx->ents[e];
	bool was = visible(en);
	en->commit_mask |= (uint16_t)(1u << l);
	return !was && visible(en);
}

int kvr_index_abort(struct kvr_index *idx, uint32_t slot, uint32_t epoch)
{
	if (!idx)
		return -EINVAL;
	uint32_t e;
	unsigned l;
	int rc = tracked(idx, slot, &e, &l);
	if (rc < 0)
		return rc;
	rc = kvr_slot_abort(idx->t, slot, epoch);
	if (rc < 0)
		return rc;
	struct ent *en = &idx->ents[e];
	en->alloc_mask &= (uint16_t)~(1u << l);
	en->commit_mask &= (uint16_t)~(1u << l);
	*lane_slot(idx, e, l) = NONE;
	slot_aborted(idx, slot, rc);
	if (!en->alloc_mask)
		ent_drop(idx, e, false);
	return rc;
}

int kvr_index_abort_owner(struct kvr_index *idx, unsigned w)
{
	if (!idx || (w >= KVR_SLOT_MAX_WORKERS && w != KVR_SLOT_OWNER_LOOKUP))
		return -EINVAL;
	int n = 0;
	for (uint32_t s = 0; s < idx->n_slots; s++) {
		const struct kvr_slot *sl = kvr_slot_at(idx->t, s);
		if (idx->slot_ent[s] != NONE && kvr_slot_state(idx->t, s) == KVR_SLOT_WRITING && sl->owner == w &&
		    kvr_index_abort(idx, s, kvr_slot_epoch(idx->t, s)) >= 0)
			n++;
	}
	return n;
}

int kvr_index_release_worker(struct kvr_index *idx, unsigned w, struct kvr_slots_release *ret)
{
	if (!idx || w >= KVR_SLOT_MAX_WORKERS)
		return -EINVAL;
	int aborted = kvr_index_abort_owner(idx, w);
	struct kvr_slots_release r;
	int rc = kvr_slots_release_worker(idx->t, w, &r);
	if (rc < 0)
		return rc;
	/* WRITING slots of w the index did not track were returned to FREE (or DRAINING) by
	 * the table: they are free (or draining) slots now */
	if (r.aborted) {
		uint8_t *listed = calloc(idx->n_slots, 1);
		if (!listed)
			return -ENOMEM;
		for (uint32_t k = 0; k < idx->n_free_slots; k++)
			listed[idx->free_slots[k]] = 1;
		for (uint32_t k = 0; k < idx->n_draining; k++)
			listed[idx->draining[k]] = 1;
		for (uint32_t s = 0; s < idx->n_slots; s++) {
			if (listed[s] || idx->slot_ent[s] != NONE)
				continue;
			uint32_t st = kvr_slot_state(idx->t, s);
			if (st == KVR_SLOT_FREE)
				idx->free_slots[idx->n_free_slots++] = s;
			else if (st == KVR_SLOT_DRAINING)
				idx->draining[idx->n_draining++] = s;
		}
		free(listed);
	}
	r.aborted += (uint32_t)aborted;
	if (ret)
		*ret = r;
	return 0;
}

int kvr_index_get(const struct kvr_index *idx, kvr_key key, struct kvr_index_block *ret)
{
	if (!idx || !ret)
		return -EINVAL;
	uint32_t e = h_find(idx, key);
	if (e == NONE)
		return -ENOENT;
	const struct ent *en = &idx->ents[e];
	struct kvr_index_block b = {.key = en->key, .alloc_mask = en->alloc_mask, .commit_mask = en->commit_mask,
				    .visible = visible(en), .lanes = (uint8_t)__builtin_popcount(en->full)};
	for (unsigned l = 0; l < KVR_INDEX_MAX_LANES; l++)
		b.slot[l] = l < idx->lanes ? *lane_slot(idx, e, l) : NONE;
	*ret = b;
	return 0;
}

void kvr_index_stats(const struct kvr_index *idx, struct kvr_index_stats *ret)
{
	struct kvr_index_stats s = {0};
	s.blocks = idx->n_slots - idx->n_free_ents;
	for (uint32_t e = 0; e < idx->n_slots; e++)
		if (visible(&idx->ents[e]))
			s.visible++;
	s.free_slots = idx->n_free_slots;
	s.lanes = idx->lanes;
	s.evictions = idx->evictions;
	s.noroom = idx->noroom;
	s.policy = idx->policy_name;
	*ret = s;
}
