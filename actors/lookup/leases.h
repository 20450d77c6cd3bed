/* leases: prefixes a scheduler looked up, pinned for its engine's workers to load. */
#ifndef KVR_LEASES_H
#define KVR_LEASES_H

#include <stdint.h>

#include "kvr_index.h"
#include "kvr_slots.h"

/*
 * A lease is (engine, lease id) -> the matched blocks' slots on every lane, each holding a
 * lookup pin (KVR_PIN_LOOKUP) so that no eviction can take them before the workers loaded
 * them. It ends when `loaders` workers reported their load done, when the scheduler
 * releases it, when its deadline passes, or when a new lease of the same key replaces it;
 * ending drops the pins. The table lives in the lookup actor's heap: a restarted lookup
 * actor starts with none, after dropping every lookup pin (lookup_init), so nothing leaks.
 */

enum lease_end { LEASE_LOADED, LEASE_RELEASED, LEASE_EXPIRED, LEASE_REPLACED };

struct lease {
	uint64_t id;
	uint16_t engine;
	uint32_t n;                 /* leased blocks */
	uint32_t lanes;
	uint32_t loaders, done;     /* LEASE_DONEs expected / received */
	uint64_t deadline;          /* CLOCK_MONOTONIC ns */
	struct kvr_index_ref *refs; /* lanes * n: lane l's slot of block i at refs[l * n + i] */
};

struct leases;

/* A table for at most max leases; NULL when out of memory. */
struct leases *leases_new(struct kvr_slot_table *slots, uint32_t max);
void leases_free(struct leases *t);

/* The lease (engine, id), or NULL. */
struct lease *leases_find(struct leases *t, uint16_t engine, uint64_t id);

/* Record a lease of n blocks (refs: lanes * n, lane-major) and pin every slot. Replaces a
 * lease of the same key (ended as LEASE_REPLACED). Returns the blocks leased — fewer than n
 * when a slot could not be pinned (the prefix ends there) — 0 with n == 0 (nothing kept),
 * -ENOSPC when the table is full, -ENOMEM. */
int leases_grant(struct leases *t, uint16_t engine, uint64_t id, uint32_t n, uint32_t lanes,
		 const struct kvr_index_ref *refs, uint32_t loaders, uint64_t deadline);

/* End a lease: unpin its slots and forget it. */
void leases_end(struct leases *t, struct lease *l, enum lease_end why);

/* End every lease whose deadline is <= now; returns how many. */
unsigned leases_expire(struct leases *t, uint64_t now);

/* Leases held now, and how many ended for each reason since start. */
uint32_t leases_count(const struct leases *t);
uint64_t leases_ended(const struct leases *t, enum lease_end why);

#endif
