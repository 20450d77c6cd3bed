/* Control-segment tests: layout, initialisation, validation of corrupt copies, ring directory. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "kvr_ctl.h"
#include "ipc_test.h"

#define N_ACTORS 4
#define N_WORKERS 2

static const struct kvr_ctl_ring_spec specs[] = {
	{"ctl.lookup.in", 8, KVR_EP_SUPERVISOR, 0},
	{"ctl.lookup.out", 8, 0, KVR_EP_SUPERVISOR},
	{"lookup.req.0", 64, KVR_EP_CLIENT(0), 0},
	{"lookup.resp.0", 64, 0, KVR_EP_CLIENT(0)},
	{"loader.req.1", 16, KVR_EP_CLIENT(1), 1},
	{"a-name-exactly-31-chars-long-xx", 2, 1, 2},
};
#define N_RINGS (sizeof(specs) / sizeof(specs[0]))
static const char config_json[] = "{\"instance\":\"test\",\"rings\":{\"capacity\":64}}";

static struct kvr_segment seg = {.fd = -1}, copy = {.fd = -1}, ro = {.fd = -1};
static struct kvr_ctl *ctl;
static struct kvr_ctl_rings rings; /* views through seg */

static void setup(void)
{
	size_t sz = kvr_ctl_memsize(N_ACTORS, N_WORKERS, specs, N_RINGS, sizeof(config_json));
	cr_assert_gt(sz, 0);
	cr_assert_eq(kvr_segment_create("kvr-test-ctl", KVR_SEG_CTL, sz, 9, 0, &seg), 0);
	cr_assert_eq(kvr_ctl_init(&seg, N_ACTORS, N_WORKERS, specs, N_RINGS, config_json), 0);
	cr_assert_eq(kvr_ctl_attach(&seg, &ctl, &rings), 0);
}

static void teardown(void)
{
	kvr_segment_close(&seg);
	kvr_segment_close(&copy);
	kvr_segment_close(&ro);
}

TestSuite(ctl, .init = setup, .fini = teardown);

Test(ctl, layout)
{
	struct kvr_ctl *c = ctl;
	cr_assert_eq((void *)c, seg.base);
	cr_assert_eq(c->seg.magic, KVR_SEG_MAGIC, "init overwrote the segment header");
	cr_assert_eq(c->seg.kind, KVR_SEG_CTL);
	cr_assert_eq(c->seg.generation, 9);
	cr_assert_eq(c->max_actors, N_ACTORS);
	cr_assert_eq(c->max_workers, N_WORKERS);
	cr_assert_eq(c->max_rings, KVR_CTL_MAX_RINGS);
	cr_assert_eq(atomic_load(&c->n_rings), N_RINGS);
	cr_assert_eq(atomic_load(&c->n_actors), 0);
	cr_assert_eq(atomic_load(&c->state), 0);

	/* regions in order, 64-byte aligned, none overlapping the next */
	const uint64_t start[] = {c->actors_off, c->workers_off, c->rings_off, c->stats_off, c->config_off,
				  c->ring_area_off};
	const uint64_t len[] = {N_ACTORS * sizeof(struct kvr_actor_ent), N_WORKERS * sizeof(struct kvr_worker_ent),
				KVR_CTL_MAX_RINGS * sizeof(struct kvr_ring_ent),
				N_ACTORS * sizeof(struct kvr_actor_stats), c->config_cap, 0};
	cr_assert_geq(c->actors_off, sizeof(struct kvr_ctl));
	for (int i = 0; i < 6; i++) {
		cr_assert_eq(start[i] % 64, 0, "region %d at %llu", i, (unsigned long long)start[i]);
		if (i)
			cr_assert_geq(start[i], start[i - 1] + len[i - 1], "region %d overlaps region %d", i, i - 1);
	}
	cr_assert_str_eq(kvr_ctl_config_json(c), config_json);
	cr_assert_eq(c->config_len, strlen(config_json));
	cr_assert_eq(c->config_cap, sizeof(config_json));

	for (unsigned i = 0; i < N_ACTORS; i++) {
		struct kvr_actor_ent *a = kvr_ctl_actor(c, i);
		cr_assert_eq(atomic_load(&a->state), KVR_ACTOR_UNUSED);
		cr_assert_eq(atomic_load(&a->pid), 0);
		cr_assert_eq(a->last_exit_code, -1);
		cr_assert_eq(atomic_load(&a->waiter.sleepers), 0);
		for (unsigned k = 0; k < KVR_STAT_MAX; k++)
			cr_assert_eq(atomic_load(&kvr_ctl_stats(c, i)->c[k]), 0);
	}
	for (unsigned i = 0; i < N_WORKERS; i++)
		cr_assert_eq(atomic_load(&kvr_ctl_worker(c, i)->state), KVR_WORKER_FREE);

	/* the client areas: one per client slot, in slot order, aligned, each starting with its
	 * header (a segment header of kind CLIENT naming the slot) */
	cr_assert_eq(c->n_areas, N_WORKERS + KVR_CTL_MAX_SCHEDULERS);
	cr_assert_geq(c->areas_off, c->geom_off + N_WORKERS * KVR_CTL_GEOM_BYTES);
	cr_assert_geq(c->ring_area_off, c->areas_off + c->n_areas * sizeof(struct kvr_area_ent));
	uint64_t area_end = c->ring_area_off;
	for (unsigned a = 0; a < c->n_areas; a++) {
		const struct kvr_area_ent *ae = kvr_ctl_area_ent(c, a);
		cr_assert_eq(ae->offset % KVR_CTL_AREA_ALIGN, 0);
		cr_assert_eq(ae->bytes % KVR_CTL_AREA_ALIGN, 0);
		cr_assert_geq(ae->offset, area_end, "area %u overlaps the one before", a);
		const struct kvr_client_area *ar = kvr_ctl_area(c, a);
		cr_assert_eq(ar->seg.magic, KVR_SEG_MAGIC);
		cr_assert_eq(ar->seg.kind, KVR_SEG_CLIENT);
		cr_assert_eq(ar->seg.size, ae->bytes);
		cr_assert_eq(ar->seg.generation, 9);
		cr_assert_eq(ar->slot, a);
		area_end = ae->offset + ae->bytes;
	}
	cr_assert_eq(area_end, seg.size);
	cr_assert_eq(area_end, kvr_ctl_memsize(N_ACTORS, N_WORKERS, specs, N_RINGS, sizeof(config_json)));

	/* every ring sized for its capacity, named; those no client uses in the ring area in
	 * directory order, a client's inside that client's area, after its header */
	uint64_t end = c->ring_area_off;
	for (unsigned i = 0; i < N_RINGS; i++) {
		struct kvr_ring_ent *e = kvr_ctl_ring_ent(c, i);
		struct kvr_ring *r = kvr_ctl_ring(&rings, i);
		cr_assert_str_eq(e->name, specs[i].name);
		cr_assert_eq(e->offset % 64, 0);
		int ep = KVR_EP_IS_CLIENT(specs[i].producer) ? specs[i].producer : specs[i].consumer;
		if (KVR_EP_IS_CLIENT(ep)) {
			const struct kvr_area_ent *ae = kvr_ctl_area_ent(c, (unsigned)KVR_EP_CLIENT_SLOT(ep));
			cr_assert_geq(e->offset, ae->offset + sizeof(struct kvr_client_area), "ring %u", i);
			cr_assert_leq(e->offset + e->bytes, ae->offset + ae->bytes, "ring %u", i);
		} else {
			cr_assert_geq(e->offset, end, "ring %u overlaps the one before", i);
			cr_assert_leq(e->offset + e->bytes, kvr_ctl_area_ent(c, 0)->offset);
			end = e->offset + e->bytes;
		}
		cr_assert_eq(e->bytes, kvr_ring_memsize(specs[i].capacity, KVR_CTL_RING_MSG_SIZE));
		cr_assert_eq(e->producer, specs[i].producer);
		cr_assert_eq(e->consumer, specs[i].consumer);
		cr_assert_eq(r->shm->magic, KVR_RING_MAGIC);
		cr_assert_eq(r->shm->capacity, specs[i].capacity);
		cr_assert_eq(r->msg_size, KVR_CTL_RING_MSG_SIZE);
		cr_assert_str_eq(r->shm->name, specs[i].name);
	}
	/* the two rings of client 0 lie one after the other in its area */
	cr_assert_eq(kvr_ctl_ring_ent(c, 2)->offset, kvr_ctl_area_ent(c, 0)->offset + sizeof(struct kvr_client_area));
	cr_assert_eq(kvr_ctl_ring_ent(c, 3)->offset, kvr_ctl_ring_ent(c, 2)->offset + kvr_ctl_ring_ent(c, 2)->bytes);
	for (unsigned i = N_RINGS; i < KVR_CTL_MAX_RINGS; i++)
		cr_assert_eq(kvr_ctl_ring_ent(c, i)->name[0], '\0');
}

/*
 * kvringd's split: every area moves into a memfd of its own, mapped over its place. A client
 * given the segment read-only and its own area sees its rings (a message a "server" mapping
 * enqueues arrives) and zeros where the other areas lie; a write outside its area faults.
 */
Test(ctl, split_areas_and_a_client_mapping)
{
	int afd[KVR_CTL_MAX_CLIENTS];
	cr_assert_eq(kvr_ctl_split_areas(&seg, kvr_ctl_ring_shm(ctl, 0)->spin_ns, afd), 0);
	/* the server side: the segment and every area */
	struct kvr_segment srv = {.fd = -1};
	cr_assert_eq(kvr_ctl_map(seg.fd, afd, ctl->n_areas - 1, 1, &srv), -EBADMSG, "an area missing");
	cr_assert_eq(kvr_ctl_map(seg.fd, afd, ctl->n_areas, 1, &srv), 0);
	struct kvr_ctl *sc;
	static struct kvr_ctl_rings srings;
	cr_assert_eq(kvr_ctl_attach(&srv, &sc, &srings), 0);
	cr_assert_eq(kvr_ctl_area(sc, 1)->slot, 1, "area 1 through its own memfd");

	/* client 1: the segment read-only (a read-only open of it), its area read-write */
	char p[64];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", seg.fd);
	int ro_fd = open(p, O_RDONLY | O_CLOEXEC);
	cr_assert_geq(ro_fd, 0);
	struct kvr_segment cl = {.fd = -1};
	cr_assert_eq(kvr_segment_map(ro_fd, KVR_SEG_CTL, 0, &cl), 0);
	close(ro_fd);
	cr_assert_eq(kvr_ctl_map_area(&cl, ctl->n_areas, afd[1], 1), -EINVAL, "no such slot");
	cr_assert_eq(kvr_ctl_map_area(&cl, 1, afd[1], 1), 0);
	struct kvr_ctl *cc;
	static struct kvr_ctl_rings crings;
	cr_assert_eq(kvr_ctl_attach_client(&cl, ctl->n_areas, &cc, &crings), -EBADMSG, "no such slot");
	cr_assert_eq(kvr_ctl_attach_client(&cl, 1, &cc, &crings), 0);
	cr_assert_not_null(kvr_ctl_ring(&crings, 4), "loader.req.1: client 1's");
	for (unsigned i = 0; i < N_RINGS; i++)
		if (i != 4)
			cr_assert_null(kvr_ctl_ring(&crings, i), "ring %u is not client 1's", i);
	/* area 0 (client 0's rings) reads as zeros here; the server's mapping has them */
	const struct kvr_area_ent *a0 = kvr_ctl_area_ent(cc, 0);
	const uint8_t *z = (const uint8_t *)cc + a0->offset;
	for (uint64_t b = 0; b < a0->bytes; b++)
		if (z[b])
			cr_assert_fail("area 0 byte %llu visible to client 1", (unsigned long long)b);
	cr_assert_eq(kvr_ctl_ring_shm(sc, 2)->magic, KVR_RING_MAGIC);
	/* a message from client 1 to its actor, and one back */
	struct kvr_msg m, got;
	kvr_msg_build(&m, KVR_MSG_PING, 0, 42, 0, NULL, 0);
	cr_assert_eq(kvr_ring_try_enqueue(kvr_ctl_ring(&crings, 4), &m), 0);
	cr_assert_eq(kvr_ring_try_dequeue(kvr_ctl_ring(&srings, 4), &got), 0);
	cr_assert_eq(got.hdr.req_id, 42);
	/* the client's waiter is in its area, and its consumed rings point there */
	cr_assert_eq(kvr_ring_consumer_waiter(kvr_ctl_ring(&srings, 3)), &kvr_ctl_area(sc, 0)->waiter);
	/* a write outside its area faults */
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		signal(SIGSEGV, SIG_DFL);
		atomic_store(&kvr_ctl_actor(cc, 0)->state, KVR_ACTOR_FAILED);
		_exit(0);
	}
	int st;
	cr_assert_eq(waitpid(child, &st, 0), child);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "the write went through (%#x)", st);
	/* an fd of another size (the control segment's own) is no area */
	cr_assert_eq(kvr_ctl_map_area(&cl, 0, seg.fd, 0), -EBADMSG);
	/* nothing in an area is trusted: its client may scribble over its header, and it still
	 * maps (where and how big come from the area table) */
	memset(kvr_ctl_area(cc, 1), 0xa5, sizeof(struct kvr_client_area));
	struct kvr_segment again = {.fd = -1};
	cr_assert_eq(kvr_ctl_map(seg.fd, afd, ctl->n_areas, 0, &again), 0);
	struct kvr_ctl *ac;
	cr_assert_eq(kvr_ctl_attach(&again, &ac, NULL), 0);
	kvr_ctl_area_reset(sc, 1);
	cr_assert_eq(kvr_ctl_area(ac, 1)->slot, 1, "the header as kvr_ctl_init() wrote it");
	cr_assert_eq(kvr_ctl_area(ac, 1)->seg.kind, KVR_SEG_CLIENT);
	kvr_segment_close(&again);
	kvr_segment_close(&cl);
	kvr_segment_close(&srv);
	for (unsigned a = 0; a < ctl->n_areas; a++)
		close(afd[a]);
}

Test(ctl, find_ring)
{
	for (unsigned i = 0; i < N_RINGS; i++)
		cr_assert_eq(kvr_ctl_find_ring(ctl, specs[i].name), (int)i, "%s", specs[i].name);
	cr_assert_eq(kvr_ctl_find_ring(ctl, "nope"), -ENOENT);
	cr_assert_eq(kvr_ctl_find_ring(ctl, ""), -ENOENT);
	cr_assert_eq(kvr_ctl_find_ring(ctl, "ctl.lookup"), -ENOENT, "a prefix matched");
	cr_assert_eq(kvr_ctl_find_ring(ctl, "ctl.lookup.in.x"), -ENOENT);
	cr_assert_eq(kvr_ctl_find_ring(ctl, "a-name-exactly-31-chars-long-xxy"), -ENOENT);
}

Test(ctl, consumer_waiters)
{
	struct kvr_ctl *c = ctl;
	for (unsigned i = 0; i < N_RINGS; i++) {
		struct kvr_ring *r = kvr_ctl_ring(&rings, i);
		int cons = specs[i].consumer;
		int prod = specs[i].producer;
		/* an actor's rings point at its waiter, except the sides of rings a client uses:
		 * those keep their own, which the actor sleeps on too (a client never writes an
		 * actor's waiter); a client consumer sleeps on its entry's */
		struct kvr_waiter *want = &r->shm->own_cons_waiter;
		if (cons >= 0 && !KVR_EP_IS_CLIENT(prod))
			want = &kvr_ctl_actor(c, (unsigned)cons)->waiter;
		else if (KVR_EP_IS_CLIENT(cons))
			want = &kvr_ctl_area(c, (unsigned)KVR_EP_CLIENT_SLOT(cons))->waiter;
		cr_assert_eq(kvr_ring_consumer_waiter(r), want, "ring %s", specs[i].name);
		/* an actor waits for room on its own waiter too (a reader freeing room wakes it) */
		struct kvr_waiter *pw = prod >= 0 && !KVR_EP_IS_CLIENT(cons) ? &kvr_ctl_actor(c, (unsigned)prod)->waiter
									  : &r->shm->own_prod_waiter;
		cr_assert_eq(kvr_ring_producer_waiter(r), pw, "ring %s", specs[i].name);
	}

	/* kvringd's producer on actor 0's ring wakes actor 0's waiter */
	struct kvr_waiter *w = &kvr_ctl_actor(c, 0)->waiter;
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_STOP, 0, 1, 0, NULL, 0);
	uint32_t seen = kvr_waiter_prepare(w);
	cr_assert_eq(kvr_ring_try_enqueue(kvr_ctl_ring(&rings, 0), &m), 0);
	cr_assert_eq(atomic_load(&w->seq), seen + 1);
	/* the sleeper is woken once: a second wake before it re-arms makes no syscall */
	cr_assert_eq(kvr_ring_try_enqueue(kvr_ctl_ring(&rings, 0), &m), 0);
	cr_assert_eq(atomic_load(&w->seq), seen + 1);
	kvr_waiter_finish(w);
	seen = kvr_waiter_prepare(w);
	cr_assert_eq(kvr_ring_try_enqueue(kvr_ctl_ring(&rings, 0), &m), 0);
	cr_assert_eq(atomic_load(&w->seq), seen + 1, "re-armed sleeper woken again");
	/* a client's ring wakes its own consumer waiter, which actor 0 sleeps on beside its
	 * own (actors/runtime: sleep_set): never actor 0's */
	struct kvr_ring *req = kvr_ctl_ring(&rings, 2);
	struct kvr_waiter *rw = kvr_ring_consumer_waiter(req);
	cr_assert_eq(rw, &req->shm->own_cons_waiter);
	uint32_t rseen = kvr_waiter_prepare(rw);
	cr_assert_eq(kvr_ring_try_enqueue(req, &m), 0);
	cr_assert_eq(atomic_load(&rw->seq), rseen + 1, "the client ring's own waiter not woken");
	cr_assert_eq(atomic_load(&w->seq), seen + 1, "a client's ring woke actor 0's waiter");
	kvr_waiter_finish(rw);
	/* a ring another actor consumes leaves actor 0's waiter alone */
	cr_assert_eq(kvr_ring_try_enqueue(kvr_ctl_ring(&rings, 5), &m), 0);
	cr_assert_eq(atomic_load(&w->seq), seen + 1, "actor 2's ring woke actor 0");
	cr_assert_eq(atomic_load(&kvr_ctl_actor(c, 1)->waiter.seq), 0);
	kvr_waiter_finish(w);
}

Test(ctl, attach_readonly)
{
	cr_assert_eq(kvr_segment_map(seg.fd, KVR_SEG_CTL, 0, &ro), 0);
	struct kvr_ctl *c = NULL;
	static struct kvr_ctl_rings ro_rings;
	cr_assert_eq(kvr_ctl_attach(&ro, &c, &ro_rings), 0);
	cr_assert_eq((void *)c, ro.base);
	cr_assert_eq(kvr_ctl_find_ring(c, "lookup.resp.0"), 3);
	cr_assert_str_eq(kvr_ctl_config_json(c), config_json);
	struct kvr_msg m, out;
	kvr_msg_build(&m, KVR_MSG_STOP, 0, 77, 0, NULL, 0);
	cr_assert_eq(kvr_ring_try_enqueue(kvr_ctl_ring(&rings, 3), &m), 0);
	cr_assert_eq(kvr_ring_peek(kvr_ctl_ring(&ro_rings, 3), 0, &out), 0, "observer cannot peek");
	cr_assert_eq(out.hdr.req_id, 77);
}

Test(ctl, init_rejects)
{
	struct kvr_ctl_ring_spec bad[2] = {specs[0], specs[1]};
	bad[1].capacity = 3;
	cr_assert_eq(kvr_ctl_memsize(0, 1, specs, 1, 0), 0);
	cr_assert_eq(kvr_ctl_memsize(KVR_CTL_MAX_ACTORS + 1, 1, specs, 1, 0), 0);
	cr_assert_eq(kvr_ctl_memsize(1, KVR_CTL_MAX_WORKERS + 1, specs, 1, 0), 0);
	cr_assert_eq(kvr_ctl_memsize(1, 1, bad, 2, 0), 0);
	cr_assert_eq(kvr_ctl_memsize(1, 1, NULL, 1, 0), 0);
	cr_assert_gt(kvr_ctl_memsize(KVR_CTL_MAX_ACTORS, KVR_CTL_MAX_WORKERS, NULL, 0, 0), 0);

	cr_assert_eq(kvr_ctl_init(&seg, 0, 1, specs, 1, NULL), -EINVAL);
	cr_assert_eq(kvr_ctl_init(&seg, KVR_CTL_MAX_ACTORS + 1, 1, specs, 1, NULL), -EINVAL);
	cr_assert_eq(kvr_ctl_init(&seg, 1, KVR_CTL_MAX_WORKERS + 1, specs, 1, NULL), -EINVAL);
	cr_assert_eq(kvr_ctl_init(&seg, 1, 1, specs, KVR_CTL_MAX_RINGS + 1, NULL), -EINVAL);
	cr_assert_eq(kvr_ctl_init(&seg, 1, 1, bad, 2, NULL), -EINVAL);
	cr_assert_eq(kvr_ctl_init(&seg, 1, 1, NULL, 2, NULL), -EINVAL);
	cr_assert_eq(kvr_ctl_init(NULL, 1, 1, specs, 1, NULL), -ENOSPC);
	cr_assert_eq(kvr_segment_create("kvr-test-small", KVR_SEG_CTL, 4096, 1, 0, &copy), 0);
	cr_assert_eq(kvr_ctl_init(&copy, N_ACTORS, N_WORKERS, specs, N_RINGS, config_json), -ENOSPC);
	/* the rejected calls left the real segment as it was */
	struct kvr_ctl *c;
	cr_assert_eq(kvr_ctl_attach(&seg, &c, NULL), 0);
	cr_assert_eq(atomic_load(&c->n_rings), N_RINGS);
	cr_assert_eq(c->max_actors, N_ACTORS);

	/* no config, no rings */
	kvr_segment_close(&copy);
	size_t sz = kvr_ctl_memsize(1, 0, NULL, 0, 1);
	cr_assert_eq(kvr_segment_create("kvr-test-min", KVR_SEG_CTL, sz, 1, 0, &copy), 0);
	cr_assert_eq(kvr_ctl_init(&copy, 1, 0, NULL, 0, NULL), 0);
	cr_assert_eq(kvr_ctl_attach(&copy, &c, NULL), 0);
	cr_assert_str_eq(kvr_ctl_config_json(c), "");
	cr_assert_eq(kvr_ctl_find_ring(c, "ctl.lookup.in"), -ENOENT);
}

/* ---- corrupt copies ------------------------------------------------------------------- */

static struct kvr_ctl *fresh_copy(void)
{
	if (copy.base == NULL)
		cr_assert_eq(kvr_segment_create("kvr-test-ctlcopy", KVR_SEG_CTL, seg.size, 9, 0, &copy), 0);
	cr_assert_eq(copy.size, seg.size);
	memcpy(copy.base, seg.base, seg.size);
	return copy.base;
}

static struct kvr_ring_ent *ent(struct kvr_ctl *c, unsigned i) { return kvr_ctl_ring_ent(c, i); }
static struct kvr_ring_shm *ring(struct kvr_ctl *c, unsigned i) { return kvr_ctl_ring_shm(c, i); }

enum corruption {
	C_NONE,
	C_KIND,
	C_RING_OFF_END,
	C_RING_OFF_TAIL,
	C_RING_OFF_MISALIGNED,
	C_RING_OFF_LOW,
	C_RING_OFF_ZERO,
	C_RING_OFF_HUGE,
	C_RING_OFF_ALIAS,
	C_RING_BYTES_ZERO,
	C_RING_BYTES_HUGE,
	C_RING_MAGIC,
	C_RING_MSG_SIZE,
	C_RING_NAME,
	C_ENT_NAME,
	C_CONS_WAITER_HDR,
	C_CONS_WAITER_END,
	C_CONS_WAITER_MISALIGNED,
	C_CONS_WAITER_MAX,
	C_CONS_WAITER_MIN,
	C_PROD_WAITER_END,
	C_PROD_WAITER_NEG,
	C_CONS_WAITER_STATS,
	C_CONS_WAITER_HEARTBEAT,
	C_PROD_WAITER_OTHER_RING,
	C_CONS_WAITER_OTHER_ACTOR,
	C_MAX_ACTORS_65,
	C_MAX_ACTORS_BIG,
	C_MAX_ACTORS_OVERLAP,
	C_MAX_ACTORS_ZERO,
	C_MAX_WORKERS,
	C_MAX_RINGS,
	C_N_RINGS,
	C_ACTORS_OFF_WRAP,
	C_ACTORS_OFF_HDR,
	C_STATS_OFF_MISALIGNED,
	C_CONFIG_LEN,
	C_CONFIG_NUL,
	C_CONFIG_OFF_WRAP,
	C_RING_AREA_OFF,
	N_CORRUPTIONS
};

/* want HEADER: a ring header scribbled over (a client can write its rings' headers). The
 * segment still attaches and ring 2's view is the one its directory entry describes: the
 * header's sizes are never read, and a waiter offset that names no legal waiter gives the
 * ring's own waiter. */
#define HEADER 1

static const struct {
	const char *what;
	int want;
} corruptions[N_CORRUPTIONS] = {
	[C_NONE] = {"none", 0},
	[C_KIND] = {"segment kind", -EPROTO},
	[C_RING_OFF_END] = {"ring offset = segment size", -EBADMSG},
	[C_RING_OFF_TAIL] = {"ring offset 64 bytes before the end", -EBADMSG},
	[C_RING_OFF_MISALIGNED] = {"ring offset + 8", -EBADMSG},
	[C_RING_OFF_LOW] = {"ring offset in the actor table", -EBADMSG},
	[C_RING_OFF_ZERO] = {"ring offset 0", -EBADMSG},
	[C_RING_OFF_HUGE] = {"ring offset ~0", -EBADMSG},
	[C_RING_OFF_ALIAS] = {"two directory entries, one ring", -EBADMSG},
	[C_RING_BYTES_ZERO] = {"ring bytes 0", -EBADMSG},
	[C_RING_BYTES_HUGE] = {"ring bytes ~0", -EBADMSG},
	[C_RING_MAGIC] = {"ring magic", HEADER},
	[C_RING_MSG_SIZE] = {"ring msg_size 128 (capacity halved to fit)", HEADER},
	[C_RING_NAME] = {"ring header name without NUL", HEADER},
	[C_ENT_NAME] = {"directory name without NUL", -EBADMSG},
	[C_CONS_WAITER_HDR] = {"consumer waiter in the segment header", HEADER},
	[C_CONS_WAITER_END] = {"consumer waiter past the end", HEADER},
	[C_CONS_WAITER_MISALIGNED] = {"consumer waiter misaligned", HEADER},
	[C_CONS_WAITER_MAX] = {"consumer waiter offset INT64_MAX", HEADER},
	[C_CONS_WAITER_MIN] = {"consumer waiter offset INT64_MIN", HEADER},
	[C_PROD_WAITER_END] = {"producer waiter straddles the end", HEADER},
	[C_PROD_WAITER_NEG] = {"producer waiter before the segment", HEADER},
	[C_CONS_WAITER_STATS] = {"consumer waiter on an actor's counters (inside, aligned, not a waiter)", HEADER},
	[C_CONS_WAITER_HEARTBEAT] = {"consumer waiter on an actor entry's heartbeat", HEADER},
	[C_CONS_WAITER_OTHER_ACTOR] = {"consumer waiter on another actor's waiter (legal: it only wakes)", HEADER},
	[C_PROD_WAITER_OTHER_RING] = {"producer waiter on another ring's own waiter", HEADER},
	[C_MAX_ACTORS_65] = {"max_actors 65", -EBADMSG},
	[C_MAX_ACTORS_BIG] = {"max_actors 0xffffffff", -EBADMSG},
	[C_MAX_ACTORS_OVERLAP] = {"max_actors 8 (actor table overlaps the worker table)", -EBADMSG},
	[C_MAX_ACTORS_ZERO] = {"max_actors 0", -EBADMSG},
	[C_MAX_WORKERS] = {"max_workers 17", -EBADMSG},
	[C_MAX_RINGS] = {"max_rings 255", -EBADMSG},
	[C_N_RINGS] = {"n_rings 257", -EBADMSG},
	[C_ACTORS_OFF_WRAP] = {"actors_off wraps around", -EBADMSG},
	[C_ACTORS_OFF_HDR] = {"actors_off inside the ctl header", -EBADMSG},
	[C_STATS_OFF_MISALIGNED] = {"stats_off misaligned", -EBADMSG},
	[C_CONFIG_LEN] = {"config_len = config_cap", -EBADMSG},
	[C_CONFIG_NUL] = {"config without its NUL", -EBADMSG},
	[C_CONFIG_OFF_WRAP] = {"config_off wraps around", -EBADMSG},
	[C_RING_AREA_OFF] = {"ring_area_off past the end", -EBADMSG},
};

static void corrupt(struct kvr_ctl *c, enum corruption k)
{
	const unsigned i = 2; /* lookup.req.0: a client's ring, consumed by actor 0 */
	uint64_t size = copy.size;
	switch (k) {
	case C_NONE: break;
	case C_KIND: c->seg.kind = KVR_SEG_ARENA; break;
	case C_RING_OFF_END: ent(c, i)->offset = size; break;
	case C_RING_OFF_TAIL: ent(c, i)->offset = size - 64; break;
	case C_RING_OFF_MISALIGNED: ent(c, i)->offset += 8; break;
	case C_RING_OFF_LOW: ent(c, i)->offset = c->actors_off; break;
	case C_RING_OFF_ZERO: ent(c, i)->offset = 0; break;
	case C_RING_OFF_HUGE: ent(c, i)->offset = UINT64_MAX - 63; break;
	case C_RING_OFF_ALIAS:
		ent(c, i)->offset = ent(c, i + 1)->offset;
		ent(c, i)->bytes = ent(c, i + 1)->bytes;
		break;
	case C_RING_BYTES_ZERO: ent(c, i)->bytes = 0; break;
	case C_RING_BYTES_HUGE: ent(c, i)->bytes = UINT64_MAX; break;
	case C_RING_MAGIC: ring(c, i)->magic = 0; break;
	case C_RING_MSG_SIZE:
		ring(c, i)->msg_size = 128;
		ring(c, i)->capacity /= 2;
		break;
	case C_RING_NAME: memset(ring(c, i)->name, 'x', KVR_RING_NAME_MAX); break;
	case C_ENT_NAME: memset(ent(c, i)->name, 'x', KVR_RING_NAME_MAX); break;
	case C_CONS_WAITER_HDR: ring(c, i)->cons_waiter_off = -(int64_t)ent(c, i)->offset + 8; break;
	case C_CONS_WAITER_END: ring(c, i)->cons_waiter_off = (int64_t)(size - ent(c, i)->offset); break;
	case C_CONS_WAITER_MISALIGNED: ring(c, i)->cons_waiter_off += 4; break;
	case C_CONS_WAITER_MAX: ring(c, i)->cons_waiter_off = INT64_MAX; break;
	case C_CONS_WAITER_MIN: ring(c, i)->cons_waiter_off = INT64_MIN; break;
	case C_PROD_WAITER_END: ring(c, i)->prod_waiter_off = (int64_t)(size - ent(c, i)->offset) - 4; break;
	case C_CONS_WAITER_STATS:
		ring(c, i)->cons_waiter_off = (int64_t)c->stats_off + 8 - (int64_t)ent(c, i)->offset;
		break;
	case C_CONS_WAITER_HEARTBEAT:
		ring(c, i)->cons_waiter_off = (int64_t)(c->actors_off + offsetof(struct kvr_actor_ent, heartbeat_ns)) -
					      (int64_t)ent(c, i)->offset;
		break;
	case C_CONS_WAITER_OTHER_ACTOR:
		ring(c, i)->cons_waiter_off = (int64_t)(c->actors_off + sizeof(struct kvr_actor_ent) +
						       offsetof(struct kvr_actor_ent, waiter)) -
					      (int64_t)ent(c, i)->offset;
		break;
	case C_PROD_WAITER_OTHER_RING:
		ring(c, i)->prod_waiter_off = (int64_t)(ent(c, i + 1)->offset +
						       offsetof(struct kvr_ring_shm, own_prod_waiter)) -
					      (int64_t)ent(c, i)->offset;
		break;
	case C_PROD_WAITER_NEG: ring(c, i)->prod_waiter_off = -(int64_t)ent(c, i)->offset - 64; break;
	case C_MAX_ACTORS_65: c->max_actors = KVR_CTL_MAX_ACTORS + 1; break;
	case C_MAX_ACTORS_BIG: c->max_actors = UINT32_MAX; break;
	case C_MAX_ACTORS_OVERLAP: c->max_actors = 8; break;
	case C_MAX_ACTORS_ZERO: c->max_actors = 0; break;
	case C_MAX_WORKERS: c->max_workers = KVR_CTL_MAX_WORKERS + 1; break;
	case C_MAX_RINGS: c->max_rings = KVR_CTL_MAX_RINGS - 1; break;
	case C_N_RINGS: atomic_store(&c->n_rings, KVR_CTL_MAX_RINGS + 1); break;
	case C_ACTORS_OFF_WRAP: c->actors_off = UINT64_MAX - 127; break;
	case C_ACTORS_OFF_HDR: c->actors_off = 64; break;
	case C_STATS_OFF_MISALIGNED: c->stats_off += 8; break;
	case C_CONFIG_LEN: c->config_len = c->config_cap; break;
	case C_CONFIG_NUL: ((char *)c + c->config_off)[c->config_len] = 'x'; break;
	case C_CONFIG_OFF_WRAP: c->config_off = UINT64_MAX - 15; break;
	case C_RING_AREA_OFF: c->ring_area_off = size + 64; break;
	case N_CORRUPTIONS: break;
	}
}

Test(ctl, attach_rejects_corrupt_copies)
{
	struct kvr_ctl *const canary = (struct kvr_ctl *)(uintptr_t)0x7e7e7e7e;
	for (int k = 0; k < N_CORRUPTIONS; k++) {
		struct kvr_ctl *c = fresh_copy();
		corrupt(c, (enum corruption)k);
		struct kvr_ctl *got = canary;
		static struct kvr_ctl_rings views;
		int rc = kvr_ctl_attach(&copy, &got, &views);
		int want = corruptions[k].want == HEADER ? 0 : corruptions[k].want;
		cr_expect_eq(rc, want, "%s: got %d, want %d", corruptions[k].what, rc, want);
		if (!rc && corruptions[k].want == HEADER) {
			const unsigned i = 2;
			struct kvr_ring *v = kvr_ctl_ring(&views, i);
			struct kvr_ring_shm *h = kvr_ctl_ring_shm(c, i);
			cr_expect_eq(v->mask, specs[i].capacity - 1, "%s: mask from the header", corruptions[k].what);
			cr_expect_eq(v->msg_size, KVR_CTL_RING_MSG_SIZE, "%s", corruptions[k].what);
			cr_expect_eq(v->data, (uint8_t *)h + sizeof(*h), "%s", corruptions[k].what);
			/* ring 2 is a client's: both sides keep the ring's own waiters, unless an
			 * offset names another legal one */
			struct kvr_waiter *want_cw = &h->own_cons_waiter;
			if (k == C_CONS_WAITER_OTHER_ACTOR)
				want_cw = &kvr_ctl_actor(c, 1)->waiter;
			cr_expect_eq(kvr_ring_consumer_waiter(v), want_cw, "%s: consumer waiter", corruptions[k].what);
			cr_expect_eq(kvr_ring_producer_waiter(v), &h->own_prod_waiter, "%s: producer waiter",
				     corruptions[k].what);
			/* messages go where the directory says, whatever the header claims */
			struct kvr_msg m, out;
			kvr_msg_build(&m, KVR_MSG_STOP, 0, 100 + (uint64_t)k, 0, NULL, 0);
			cr_expect_eq(kvr_ring_try_enqueue(v, &m), 0, "%s", corruptions[k].what);
			cr_expect_eq(kvr_ring_try_dequeue(v, &out), 0, "%s", corruptions[k].what);
			cr_expect_eq(memcmp(&m, &out, sizeof(m)), 0, "%s", corruptions[k].what);
		}
		if (rc)
			cr_expect_eq(got, canary, "%s: ret_ctl written on failure", corruptions[k].what);
		else
			cr_expect_eq((void *)got, copy.base);
	}
	struct kvr_ctl *got = canary;
	struct kvr_segment tiny = {.fd = -1, .base = seg.base, .size = sizeof(struct kvr_ctl) - 1};
	cr_expect_eq(kvr_ctl_attach(&tiny, &got, NULL), -EINVAL);
	cr_expect_eq(kvr_ctl_attach(NULL, &got, NULL), -EINVAL);
	cr_expect_eq(got, canary);
}

Test(ctl, names)
{
	cr_assert_str_eq(kvr_inst_state_name(KVR_INST_RUNNING), "running");
	cr_assert_str_eq(kvr_inst_state_name(KVR_INST_STOPPED), "stopped");
	cr_assert_str_eq(kvr_inst_state_name(99), "?");
	cr_assert_str_eq(kvr_actor_state_name(KVR_ACTOR_UNUSED), "unused");
	cr_assert_str_eq(kvr_actor_state_name(KVR_ACTOR_STOPPING), "stopping");
	cr_assert_str_eq(kvr_actor_state_name(7), "?");
	cr_assert_str_eq(kvr_actor_kind_name(KVR_ACTOR_LOOKUP), "lookup");
	cr_assert_str_eq(kvr_actor_kind_name(KVR_ACTOR_GATHER), "gather");
	cr_assert_str_eq(kvr_actor_kind_name(0), "?");
	cr_assert_str_eq(kvr_actor_kind_name(KVR_ACTOR_REMOTE), "remote");
	cr_assert_str_eq(kvr_actor_kind_name(7), "?");
}
