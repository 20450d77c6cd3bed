/* The shared stepping harness (SPDK's ut_multithread as the model): one stage over an in-memory control segment, stepped one message, pass, tick or timer at a time with the clock the test gives. */
#ifndef KVR_STEP_STAGE_H
#define KVR_STEP_STAGE_H

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "step_test.h"

#include "kvr_actor.h"
#include "kvr_ctl.h"
#include "kvr_ring_names.h"
#include "kvr_slots.h"
#include "watch.h"

/*
 * No processes. A test describes the rings it wants (step_spec), builds the control
 * segment and the struct kvr_actor the runtime would give actor `me` (step_build: every
 * ring the directory assigns to `me` becomes an input or an output as kvr_actor_main's
 * attach makes them, ctl.<name>.in / .out the control rings), optionally a slot table
 * (step_slots), an arena (step_arena) and a worker's KV memory (step_kv: a memfd, as
 * kvringd hands a loader or storer --kv-fd), then calls the stage's init (step_init) and steps it:
 *
 *   step_msg(e, ring)      takes one message off `ring` and hands it to on_msg, counted as
 *                          the runtime counts it (MSGS_IN; MALFORMED and ring->rejected on
 *                          -EBADMSG); returns what on_msg returned
 *   step_pass(e, now)      due timers (kvr_watch_dispatch), then on_pass, at `now`
 *   step_tick(e, now)      on_tick at `now`
 *
 * `now` goes into act.now_ns before each call, as the loop sets it at the start of a pass.
 * The test plays every other endpoint itself: it enqueues requests on the stage's input
 * rings and takes the answers off its output rings (step_take). Everything is released by
 * step_close (NULL-safe on a half-built env, so it can be a fixture's fini).
 */

#define STEP_MAX_SPECS 64

struct step_env {
	struct kvr_segment ctl_seg, slots_seg;
	struct kvr_actor act;
	uint8_t *kv;                   /* step_kv's mapping of act.kv_fds[0] */
	struct kvr_actor_stats stats;
	const struct kvr_stage *stage;
	bool inited;
	struct kvr_ctl_ring_spec specs[STEP_MAX_SPECS];
	unsigned n_specs;
};

/* Add ring fmt... between producer and consumer (actor index, KVR_EP_SUPERVISOR,
 * KVR_EP_CLIENT(w)) to the rings step_build lays out. */
static inline void step_spec(struct step_env *e, uint32_t capacity, int producer, int consumer, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static inline void step_spec(struct step_env *e, uint32_t capacity, int producer, int consumer, const char *fmt, ...)
{
	cr_assert_lt(e->n_specs, STEP_MAX_SPECS);
	struct kvr_ctl_ring_spec *sp = &e->specs[e->n_specs++];
	memset(sp, 0, sizeof(*sp));
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(sp->name, sizeof(sp->name), fmt, ap);
	va_end(ap);
	cr_assert(len > 0 && (size_t)len < sizeof(sp->name));
	sp->capacity = capacity;
	sp->producer = (int16_t)producer;
	sp->consumer = (int16_t)consumer;
}

/* The control rings of actor `me` named `name` (ctl.<name>.in, ctl.<name>.out). */
static inline void step_spec_ctl(struct step_env *e, unsigned me, const char *name)
{
	step_spec(e, 64, KVR_EP_SUPERVISOR, (int)me, KVR_RING_CTL_IN, name);
	step_spec(e, 64, (int)me, KVR_EP_SUPERVISOR, KVR_RING_CTL_OUT, name);
}

/* The ring named `name`; asserts it exists. */
static inline struct kvr_ring *step_ring(struct step_env *e, const char *name)
{
	int i = kvr_ctl_find_ring(e->act.ctl, name);
	cr_assert_geq(i, 0, "ring %s", name);
	struct kvr_ring *r = kvr_ctl_ring(&e->act.rings, (unsigned)i);
	cr_assert_not_null(r, "ring %s", name);
	return r;
}

/* Lay out the control segment (n_actors entries, max_workers worker slots, the specs so far)
 * and the struct kvr_actor of actor `me` of `kind` named `name`: its rings attached, config
 * defaults (change e->act.cfg before step_init), clock at now_ns. */
static inline void step_build(struct step_env *e, const char *name, unsigned n_actors, unsigned max_workers, unsigned me,
			      enum kvr_actor_kind kind, uint64_t now_ns)
{
	e->ctl_seg.fd = -1;
	e->slots_seg.fd = -1;
	size_t sz = kvr_ctl_memsize(n_actors, max_workers, e->specs, e->n_specs, 4096);
	cr_assert_gt(sz, 0);
	char seg[64];
	snprintf(seg, sizeof(seg), "kvr-step-%s-%d", name, (int)getpid());
	cr_assert_eq(kvr_segment_create(seg, KVR_SEG_CTL, sz, 1, 0, &e->ctl_seg), 0);
	cr_assert_eq(kvr_ctl_init(&e->ctl_seg, n_actors, max_workers, e->specs, e->n_specs, "{}"), 0);
	struct kvr_actor *a = &e->act;
	memset(a, 0, sizeof(*a));
	cr_assert_eq(kvr_ctl_attach(&e->ctl_seg, &a->ctl, &a->rings), 0);
	a->ctl_seg = e->ctl_seg;
	a->index = me;
	a->stats = &e->stats;
	a->ent = kvr_ctl_actor(a->ctl, me);
	a->ent->kind = kind;
	atomic_store(&a->ctl->n_actors, n_actors);
	char ring[KVR_RING_NAME_MAX];
	snprintf(ring, sizeof(ring), KVR_RING_CTL_IN, name);
	int ci = kvr_ctl_find_ring(a->ctl, ring);
	snprintf(ring, sizeof(ring), KVR_RING_CTL_OUT, name);
	int co = kvr_ctl_find_ring(a->ctl, ring);
	/* as kvr_actor_main's attach_rings: ours by the directory's endpoints */
	unsigned n = atomic_load(&a->ctl->n_rings);
	for (unsigned i = 0; i < n; i++) {
		const struct kvr_ring_ent *re = kvr_ctl_ring_ent(a->ctl, i);
		struct kvr_ring *r = kvr_ctl_ring(&a->rings, i);
		if (re->consumer == (int)me) {
			if ((int)i == ci) {
				a->ctl_in = r;
				a->ent->ctl_in = (uint16_t)i;
				continue;
			}
			cr_assert_lt(a->n_inputs, KVR_ACTOR_MAX_RINGS);
			a->inputs[a->n_inputs++] = (struct kvr_actor_ring){r, (int)i, false};
		} else if (re->producer == (int)me) {
			if ((int)i == co) {
				a->ctl_out = r;
				a->ent->ctl_out = (uint16_t)i;
				continue;
			}
			cr_assert_lt(a->n_outputs, KVR_ACTOR_MAX_RINGS);
			a->outputs[a->n_outputs++] = (struct kvr_actor_ring){r, (int)i, false};
		}
	}
	kvr_config_defaults(&a->cfg);
	a->now_ns = now_ns;
}

/* The slot table (--slots-fd): n_slots slots of lane_bytes, tp_size lanes, quorum. */
static inline struct kvr_slot_table *step_slots(struct step_env *e, uint32_t n_slots, uint64_t lane_bytes,
						uint32_t tp_size, uint32_t quorum)
{
	char seg[64];
	snprintf(seg, sizeof(seg), "kvr-step-slots-%d", (int)getpid());
	cr_assert_eq(kvr_segment_create(seg, KVR_SEG_SLOTS, kvr_slots_memsize(n_slots), 1, 0, &e->slots_seg), 0);
	struct kvr_slots_config sc = {.n_slots = n_slots, .lane_bytes = lane_bytes, .ns = {7, 7}, .block_tokens = 16,
				      .tp_size = tp_size, .quorum = quorum};
	cr_assert_eq(kvr_slots_init(e->slots_seg.base, e->slots_seg.size, &sc, &e->act.slots), 0);
	e->act.slots_seg = e->slots_seg;
	return e->act.slots;
}

/* The arena (--arena-fd) for the slot table step_slots made, every data byte `fill`. */
static inline uint8_t *step_arena(struct step_env *e, uint8_t fill)
{
	struct kvr_slot_table *st = e->act.slots;
	cr_assert_not_null(st, "step_slots first");
	char seg[64];
	snprintf(seg, sizeof(seg), "kvr-step-arena-%d", (int)getpid());
	uint64_t sz = st->arena_data_off + (uint64_t)st->n_slots * st->slot_bytes;
	cr_assert_eq(kvr_segment_create(seg, KVR_SEG_ARENA, sz, 1, 0, &e->act.arena_seg), 0);
	memset((uint8_t *)e->act.arena_seg.base + st->arena_data_off, fill, (size_t)st->n_slots * st->slot_bytes);
	return e->act.arena_seg.base;
}

/* The worker's KV memory (--kv-fd, --kv-bytes): a memfd of `bytes`, mapped for the test. */
static inline uint8_t *step_kv(struct step_env *e, uint64_t bytes)
{
	int fd = memfd_create("kvr-step-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, (off_t)bytes), 0);
	e->kv = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert_neq(e->kv, MAP_FAILED);
	e->act.kv_fds[0] = fd;
	e->act.kv_sizes[0] = bytes;
	e->act.n_kv = 1;
	return e->kv;
}

/* stage->init, which must succeed. */
static inline void step_init(struct step_env *e, const struct kvr_stage *stage)
{
	e->stage = stage;
	cr_assert_eq(e->act.ent->kind, stage->kind);
	int rc = stage->init(&e->act);
	cr_assert_eq(rc, 0, "%s init: %s", stage->name, strerror(-rc));
	e->inited = true;
}

/* Take one message off input `ring` (one must be there) and hand it to on_msg. */
static inline int step_msg(struct step_env *e, struct kvr_ring *ring)
{
	struct kvr_msg m;
	cr_assert_eq(kvr_ring_try_dequeue(ring, &m), 0, "nothing on %s", ring->shm->name);
	kvr_actor_count(&e->act, KVR_STAT_MSGS_IN, 1);
	int rc = e->stage->on_msg(&e->act, ring, &m);
	if (rc == -EBADMSG) {
		kvr_actor_count(&e->act, KVR_STAT_MALFORMED, 1);
		atomic_fetch_add_explicit(&ring->shm->rejected, 1, memory_order_relaxed);
	} else {
		e->act.handled++;
	}
	return rc;
}

/* Step every message waiting on `ring`, each must be handled (0); returns how many. */
static inline unsigned step_msgs(struct step_env *e, struct kvr_ring *ring)
{
	unsigned n = 0;
	while (kvr_ring_count(ring)) {
		cr_assert_eq(step_msg(e, ring), 0, "message %u on %s rejected", n, ring->shm->name);
		n++;
	}
	return n;
}

/* One pass at `now`: due timers, then on_pass (KVR_PASS_IDLE without one). */
static inline int step_pass(struct step_env *e, uint64_t now)
{
	e->act.now_ns = now;
	(void)kvr_watch_dispatch(&e->act, now);
	return e->stage->on_pass ? e->stage->on_pass(&e->act, now) : KVR_PASS_IDLE;
}

/* on_tick at `now`. */
static inline void step_tick(struct step_env *e, uint64_t now)
{
	e->act.now_ns = now;
	cr_assert_not_null(e->stage->on_tick);
	e->stage->on_tick(&e->act, now);
}

/* The next message on ring r, which must be of `type`. */
static inline struct kvr_msg step_take(struct kvr_ring *r, unsigned type)
{
	struct kvr_msg m;
	cr_assert_eq(kvr_ring_try_dequeue(r, &m), 0, "nothing on %s", r->shm->name);
	cr_assert_eq(m.hdr.type, type, "%s: a %s, not a %s", r->shm->name, kvr_msg_type_name(m.hdr.type),
		     kvr_msg_type_name(type));
	return m;
}

static inline uint64_t step_stat(const struct step_env *e, unsigned s)
{
	return atomic_load(&e->stats.c[s]);
}

/* fini (when init ran), watches, populate, KV memory, arena, segments. */
static inline void step_close(struct step_env *e)
{
	if (e->inited && e->stage->fini)
		e->stage->fini(&e->act);
	e->inited = false;
	if (e->act.ctl) {
		kvr_watch_close(&e->act);
		kvr_actor_populate_free(&e->act);
	}
	if (e->kv && e->kv != MAP_FAILED)
		(void)munmap(e->kv, e->act.kv_sizes[0]);
	if (e->act.n_kv)
		(void)close(e->act.kv_fds[0]);
	if (e->act.arena_seg.base)
		kvr_segment_close(&e->act.arena_seg);
	if (e->slots_seg.base)
		kvr_segment_close(&e->slots_seg);
	if (e->ctl_seg.base)
		kvr_segment_close(&e->ctl_seg);
	memset(e, 0, sizeof(*e));
}

#endif
