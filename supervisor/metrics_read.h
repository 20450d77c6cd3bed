/* How the metrics thread reads the control segment: actor slots in use and their counters, by atomic loads. */
#ifndef KVR_METRICS_READ_H
#define KVR_METRICS_READ_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvr_ctl.h"

/*
 * Shared by /metrics (metrics.c) and /status (status.c), so both pages sum the same
 * counters the same way. Every function only loads: counters relaxed (a scrape is a
 * snapshot, counters of one actor may be a few messages apart), states and counts with
 * the segment's own atomics. The caller holds the /metrics lock (sup_metrics_pause()).
 */

/* Counter s of actor slot `actor`'s stats page. */
static inline uint64_t kvr_mr_stat(const struct kvr_ctl *c, unsigned actor, unsigned s)
{
	return atomic_load_explicit(&kvr_ctl_stats(c, actor)->c[s], memory_order_relaxed);
}

/* Actor slots laid out (n_actors, never more than max_actors). */
static inline unsigned kvr_mr_n_actors(const struct kvr_ctl *c)
{
	unsigned n = atomic_load(&((struct kvr_ctl *)c)->n_actors);
	return n < c->max_actors ? n : c->max_actors;
}

static inline bool kvr_mr_actor_used(const struct kvr_ctl *c, unsigned i)
{
	return atomic_load(&kvr_ctl_actor(c, i)->state) != KVR_ACTOR_UNUSED;
}

/* Sum of counter s over every actor of that kind. */
static inline uint64_t kvr_mr_kind_sum(const struct kvr_ctl *c, unsigned kind, unsigned s)
{
	uint64_t sum = 0;
	for (unsigned i = 0; i < kvr_mr_n_actors(c); i++)
		if (kvr_mr_actor_used(c, i) && kvr_ctl_actor(c, i)->kind == kind)
			sum += kvr_mr_stat(c, i, s);
	return sum;
}

/* A transfer counter of one direction over every actor that moves it: the loaders, or the
 * storers and the gather actors (a DCP group's stores). */
static inline uint64_t kvr_mr_xf_sum(const struct kvr_ctl *c, bool store, unsigned s)
{
	return store ? kvr_mr_kind_sum(c, KVR_ACTOR_STORER, s) + kvr_mr_kind_sum(c, KVR_ACTOR_GATHER, s)
		     : kvr_mr_kind_sum(c, KVR_ACTOR_LOADER, s);
}

/* A ring's fill: messages in it, clamped to its capacity (head before tail: tail then never
 * reads older than head). The header kvringd laid out: only the counters change. */
static inline uint32_t kvr_mr_ring_fill(const struct kvr_ring_shm *r)
{
	uint32_t h = atomic_load_explicit(&((struct kvr_ring_shm *)r)->head, memory_order_acquire);
	uint32_t t = atomic_load_explicit(&((struct kvr_ring_shm *)r)->tail, memory_order_acquire);
	uint32_t cap = r->capacity ? r->capacity : 1;
	return t - h > cap ? cap : t - h;
}

#endif
