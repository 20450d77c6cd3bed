/* l2set: the lookup actor's set of (key, lane) pairs on disk — open addressing, linear probing, tombstones. */
#ifndef KVR_L2SET_H
#define KVR_L2SET_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr_keys.h"

/* Private to the lookup actor (l2tier.c fills it from L2_HAVE, L2_WRITE_DONE and L2_GONE).
 * Lookups are inline: the tier asks once per block lane of every lookup it extends. */

struct l2ent {
	uint64_t lo, hi;
	uint16_t lane;
	uint8_t used, dead;
	uint8_t model;            /* the model entry (kvr_ctl.h) it was stored for, or L2SET_UNKNOWN */
};

#define L2SET_UNKNOWN 0xffu       /* listed by the disk actor (adopted at a start): whose is not known */

struct l2set {
	struct l2ent *e;          /* cap entries, cap a power of two (0: not opened) */
	uint32_t cap, n, dead;    /* n: pairs in the set; dead: tombstones */
	uint64_t by_model[256];   /* pairs in the set by their model byte */
};

/* The first table (zeroes *s first). 0 or -ENOMEM. */
int l2set_open(struct l2set *s);
/* Free the table; a set that never opened is fine. */
void l2set_close(struct l2set *s);
/* Add (k, lane) stored for `model` (L2SET_UNKNOWN: not known). When there already, only an
 * unknown model is replaced by a known one. Out of memory the pair is simply not known to be
 * on disk. */
void l2set_add(struct l2set *s, kvr_key k, unsigned lane, uint8_t model);
/* Remove (k, lane) (no-op when absent). */
void l2set_del(struct l2set *s, kvr_key k, unsigned lane);

static inline uint64_t l2set_mix(kvr_key k, unsigned lane)
{
	uint64_t h = k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)lane << 48);
	h ^= h >> 31;
	return h * 0xbf58476d1ce4e5b9ull;
}

/* The entry of (k, lane), or NULL; for_insert: else the place to insert it (the first
 * tombstone on its probe path, or the empty entry ending it; NULL when the table is full). */
static inline struct l2ent *l2set_find(const struct l2set *s, kvr_key k, unsigned lane, bool for_insert)
{
	if (!s->cap)
		return NULL;
	uint32_t mask = s->cap - 1, i = (uint32_t)l2set_mix(k, lane) & mask;
	struct l2ent *tomb = NULL;
	for (uint32_t n = 0; n < s->cap; n++, i = (i + 1) & mask) {
		struct l2ent *e = &s->e[i];
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

static inline bool l2set_has(const struct l2set *s, kvr_key k, unsigned lane)
{
	return l2set_find(s, k, lane, false) != NULL;
}

#endif
