/* leases: a fixed-capacity table of (engine, lease id) -> pinned slots, open addressing. */
#include "leases.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define EMPTY UINT32_MAX

struct leases {
	struct kvr_slot_table *slots;
	uint32_t max, used;
	struct lease *ent;          /* max entries */
	uint32_t *free_list;        /* free entry indices (a stack) */
	uint32_t n_free;
	uint32_t *hash;             /* mask + 1 buckets: an entry index or EMPTY */
	uint32_t mask;
	uint64_t ended[LEASE_REPLACED + 1];
};

static uint32_t bucket(const struct leases *t, uint16_t engine, uint64_t id)
{
	uint64_t h = (id ^ ((uint64_t)engine << 48)) * 0x9e3779b97f4a7c15ull;
	return (uint32_t)(h >> 32) & t->mask;
}

struct leases *leases_new(struct kvr_slot_table *slots, uint32_t max)
{
	struct leases *t = calloc(1, sizeof(*t));
	if (!t || !max)
		goto fail;
	uint32_t buckets = 2;
	while (buckets < 2 * max)
		buckets <<= 1;
	t->slots = slots;
	t->max = max;
	t->mask = buckets - 1;
	t->ent = calloc(max, sizeof(*t->ent));
	t->free_list = malloc(max * sizeof(*t->free_list));
	t->hash = malloc(buckets * sizeof(*t->hash));
	if (!t->ent || !t->free_list || !t->hash)
		goto fail;
	for (uint32_t i = 0; i < max; i++)
		t->free_list[i] = max - 1 - i;
	t->n_free = max;
	memset(t->hash, 0xff, buckets * sizeof(*t->hash));
	return t;
fail:
	leases_free(t);
	return NULL;
}

void leases_free(struct leases *t)
{
	if (!t)
		return;
	for (uint32_t i = 0; t->ent && i < t->max; i++)
		free(t->ent[i].refs);
	free(t->ent);
	free(t->free_list);
	free(t->hash);
	free(t);
}

/* The bucket holding (engine, id), or the empty bucket where it would go. */
static uint32_t probe(const struct leases *t, uint16_t engine, uint64_t id)
{
	uint32_t b = bucket(t, engine, id);
	while (t->hash[b] != EMPTY) {
		const struct lease *l = &t->ent[t->hash[b]];
		if (l->id == id && l->engine == engine)
			return b;
		b = (b + 1) & t->mask;
	}
	return b;
}

struct lease *leases_find(struct leases *t, uint16_t engine, uint64_t id)
{
	uint32_t b = probe(t, engine, id);
	return t->hash[b] == EMPTY ? NULL : &t->ent[t->hash[b]];
}

/* Remove bucket b and shift the entries after it back (linear probing without tombstones). */
static void hash_remove(struct leases *t, uint32_t b)
{
	t->hash[b] = EMPTY;
	for (uint32_t j = (b + 1) & t->mask; t->hash[j] != EMPTY; j = (j + 1) & t->mask) {
		const struct lease *l = &t->ent[t->hash[j]];
		uint32_t home = bucket(t, l->engine, l->id);
		/* j's entry may move to the hole b when its home is not in (b, j] (cyclically) */
		bool stays = b <= j ? (home > b && home <= j) : (home > b || home <= j);
		if (stays)
			continue;
		t->hash[b] = t->hash[j];
		t->hash[j] = EMPTY;
		b = j;
	}
}

void leases_end(struct leases *t, struct lease *l, enum lease_end why)
{
	for (uint32_t i = 0; i < l->n * l->lanes; i++)
		(void)kvr_slot_unpin(t->slots, l->refs[i].slot, KVR_PIN_LOOKUP);
	hash_remove(t, probe(t, l->engine, l->id));
	free(l->refs);
	uint32_t ix = (uint32_t)(l - t->ent);
	memset(l, 0, sizeof(*l));
	t->free_list[t->n_free++] = ix;
	t->used--;
	t->ended[why]++;
}

int leases_grant(struct leases *t, uint16_t engine, uint64_t id, uint32_t n, uint32_t lanes,
		 const struct kvr_index_ref *refs, uint32_t loaders, uint64_t deadline)
{
	struct lease *old = leases_find(t, engine, id);
	if (old)
		leases_end(t, old, LEASE_REPLACED);
	if (!n || !lanes)
		return 0;
	if (!t->n_free)
		return -ENOSPC;
	struct kvr_index_ref *mine = malloc((size_t)n * lanes * sizeof(*mine));
	if (!mine)
		return -ENOMEM;
	/* pin block by block, every lane; the prefix ends at the first block that cannot be
	 * pinned (its slot changed: not expected, the caller matched it just now) */
	uint32_t got = 0;
	for (; got < n; got++) {
		uint32_t l;
		for (l = 0; l < lanes; l++)
			if (kvr_slot_pin(t->slots, refs[(size_t)l * n + got].slot, refs[(size_t)l * n + got].epoch,
					 KVR_PIN_LOOKUP))
				break;
		if (l < lanes) {
			while (l--)
				(void)kvr_slot_unpin(t->slots, refs[(size_t)l * n + got].slot, KVR_PIN_LOOKUP);
			break;
		}
	}
	if (!got) {
		free(mine);
		return 0;
	}
	for (uint32_t l = 0; l < lanes; l++)
		memcpy(mine + (size_t)l * got, refs + (size_t)l * n, got * sizeof(*mine));
	uint32_t ix = t->free_list[--t->n_free];
	t->ent[ix] = (struct lease){.id = id, .engine = engine, .n = got, .lanes = lanes, .loaders = loaders,
				    .deadline = deadline, .refs = mine};
	t->hash[probe(t, engine, id)] = ix;
	t->used++;
	return (int)got;
}

unsigned leases_expire(struct leases *t, uint64_t now)
{
	unsigned n = 0;
	for (uint32_t i = 0; i < t->max && t->used; i++)
		if (t->ent[i].refs && t->ent[i].deadline <= now) {
			leases_end(t, &t->ent[i], LEASE_EXPIRED);
			n++;
		}
	return n;
}

uint32_t leases_count(const struct leases *t)
{
	return t ? t->used : 0;
}

uint64_t leases_ended(const struct leases *t, enum lease_end why)
{
	return t ? t->ended[why] : 0;
}
