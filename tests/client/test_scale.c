/* Production scale (issue 13): an arena of any size starts without touching its pages, and is faulted in off the ready path. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"

/*
 * A 64 GiB arena on a machine with 24 GiB: kvringd creates it sparse, no actor faults it in
 * at start, and the background prefault declines an arena larger than the memory
 * available (it would only push the node into reclaim). So every process is small right
 * after start; a store and a load then touch only their own slots. A small arena is faulted
 * in by kvringd's prefault thread after it is ready, and kvring-inspect's counters show it.
 */

static struct ct_env env;
static void setup(void) { ct_init(&env); }
static void teardown(void) { ct_fini(&env); }
TestSuite(scale, .init = setup, .fini = teardown, .timeout = 120);

/* 4 MiB a block lane: 8 layers x 8 KV heads x 128 x bf16 x 128 tokens x K,V */
static const struct ct_model big = {.layers = 8, .kv_heads = 8, .head_dim = 128, .dtype_bytes = 2,
				    .block_tokens = 128, .tp_size = 1};

static uint64_t meminfo(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	unsigned long long kb = 0;
	size_t n = strlen(key);
	cr_assert(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && sscanf(line + n, ": %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb << 10;
}

static uint64_t rss_bytes(pid_t pid)
{
	char path[64], line[128];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	cr_assert(f, "no process %d", (int)pid);
	unsigned long long kb = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb << 10;
}

#define SMALL_RSS (256ull << 20)

/* A 64 GiB arena just laid out: nothing faulted in beyond what is asked (a prefault it
 * declines when the memory is short), the actors' RSS small, and a store and a load of two
 * blocks byte-exact through it. */
static void sparse_and_serving(struct ct_rank *r)
{
	cr_assert_geq(env.ctl->arena_bytes, 64ull << 30);
	bool declined = env.ctl->arena_bytes > meminfo("MemAvailable") / 10 * 9;
	if (declined)
		cr_assert(H_WAIT(atomic_load(&env.ctl->prefault_state) == KVR_PREFAULT_SKIPPED, 2000),
			  "an arena larger than the memory available must not be faulted in");
	static const char *const who[] = {"lookup", "loader.0", "storer.0"};
	for (unsigned i = 0; i < 3; i++) {
		uint64_t rss = rss_bytes(ct_actor_pid(&env, who[i]));
		cr_assert_lt(rss, SMALL_RSS, "%s: RSS %llu bytes right after start", who[i], (unsigned long long)rss);
	}
	if (declined) {
		uint64_t rss = rss_bytes(env.h.pid);
		cr_assert_lt(rss, SMALL_RSS, "kvringd: RSS %llu bytes right after start", (unsigned long long)rss);
	}

	uint32_t tokens[2 * 128], blocks[2] = {0, 1};
	ct_prompt(tokens, 2 * 128, 5);
	ct_fill(r, 0, 11);
	ct_fill(r, 1, 12);
	struct ct_done d;
	ct_store(r, 1, tokens, 2 * 128, blocks, 2, &d);
	cr_assert_eq(d.c.status, 0);
	cr_assert_eq(ct_lookup_load_exact(r, 2, tokens, 2 * 128, 2, 11), 2);
	uint64_t rss = rss_bytes(ct_actor_pid(&env, "loader.0"));
	cr_assert_lt(rss, SMALL_RSS, "loader.0: RSS %llu bytes after one load", (unsigned long long)rss);
}

Test(scale, a_64gib_arena_starts_sparse_and_serves)
{
	const uint64_t lane = ct_lane_bytes(&big);
	const uint32_t n_slots = (uint32_t)((64ull << 30) / kvr_slots_slot_bytes(lane));
	uint64_t t0 = kvr_now_ns();
	ct_start(&env, &big, &(struct ct_opts){.l1_slots = n_slots});
	uint64_t ready_ns = kvr_now_ns() - t0;
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 4, 0, &r), 0, "%s", kvr_last_error(NULL));
	uint64_t attached_ns = kvr_now_ns() - t0;
	printf("64 GiB arena (%u slots of %llu bytes): kvringd ready after %.0f ms, a worker attached after %.0f ms\n",
	       n_slots, (unsigned long long)kvr_slots_slot_bytes(lane), ready_ns / 1e6, attached_ns / 1e6);
	sparse_and_serving(r);
}

/* The same without a model section: kvringd is ready before any arena exists, and the first
 * worker's attach lays the 64 GiB out for its geometry (slot table and memfd; nothing touched). */
Test(scale, a_64gib_arena_without_a_model_is_laid_out_at_the_first_attach)
{
	const uint64_t lane = ct_lane_bytes(&big);
	const uint32_t n_slots = (uint32_t)((64ull << 30) / kvr_slots_slot_bytes(lane));
	uint64_t t0 = kvr_now_ns();
	ct_start(&env, &big, &(struct ct_opts){.l1_slots = n_slots, .no_model = true});
	uint64_t ready_ns = kvr_now_ns() - t0;
	cr_assert_eq(env.ctl->arena_bytes, 0, "an arena before the first worker");
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open_engine(&env, 0, 4, 0, "big", "org/big", &r), 0, "%s", kvr_last_error(NULL));
	uint64_t attached_ns = kvr_now_ns() - t0;
	ct_map_l1(&env);
	printf("no model section, 64 GiB arena (%u slots of %llu bytes): kvringd ready after %.0f ms, the first worker "
	       "attached (L1 laid out for it) after %.0f ms\n",
	       n_slots, (unsigned long long)kvr_slots_slot_bytes(lane), ready_ns / 1e6, attached_ns / 1e6);
	sparse_and_serving(r);
}

Test(scale, a_small_arena_is_faulted_in_after_ready)
{
	ct_start(&env, &big, &(struct ct_opts){.l1_slots = 64});
	uint64_t size = env.ctl->arena_bytes;
	cr_assert(H_WAIT(atomic_load(&env.ctl->prefault_state) == KVR_PREFAULT_DONE, 20000),
		  "prefault state %u, %llu of %llu bytes", atomic_load(&env.ctl->prefault_state),
		  (unsigned long long)atomic_load(&env.ctl->prefault_bytes), (unsigned long long)size);
	cr_assert_eq(atomic_load(&env.ctl->prefault_bytes), size);
	cr_assert_geq(rss_bytes(env.h.pid), size, "kvringd holds the faulted-in arena");
	/* the thread publishes DONE, then logs: under load the line may come a moment later */
	cr_assert(H_WAIT(h_log_contains(&env.h, "faulted in, in"), 5000));
}

Test(scale, prefault_off_touches_nothing)
{
	ct_start(&env, &big, &(struct ct_opts){.l1_slots = 64, .l1_extra = ", \"prefault\": \"off\""});
	cr_assert_eq(atomic_load(&env.ctl->prefault_state), KVR_PREFAULT_OFF);
	cr_assert_eq(atomic_load(&env.ctl->prefault_bytes), 0);
	cr_assert_lt(rss_bytes(env.h.pid), SMALL_RSS);
}

/* One completion (up to timeout_ms); on a failure the assertion shows kvringd's log. */
static struct kvr_completion wait_one(struct ct_rank *r, int64_t timeout_ms)
{
	struct kvr_completion c;
	int n = kvr_wait(r->c, &c, 1, timeout_ms);
	cr_assert_eq(n, 1, "no completion within %lld ms (%d)", (long long)timeout_ms, n);
	cr_assert_eq(c.status, 0, "op %u: status %d, %u of %u blocks failed; kvringd's log:\n%s", c.op, c.status,
		     c.n_failed, c.n_blocks, h_read_file(env.h.log));
	return c;
}

/* A request of 60,000 blocks takes far longer than 5 health intervals of 10 ms: the actors
 * serving it (storer, loader, lookup) are busy, not dead, and none is killed. */
Test(scale, a_60000_block_store_and_load_outlive_the_health_check)
{
	enum { NB = 60000 };
	ct_start(&env, &ct_tiny, &(struct ct_opts){.l1_slots = NB + 64, .health_ms = 10});
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, NB + 8, 0, &r), 0, "%s", kvr_last_error(NULL));
	static uint32_t tokens[NB * 16], blocks[NB];
	ct_prompt(tokens, (size_t)NB * 16, 77);
	for (uint32_t i = 0; i < NB; i++) {
		blocks[i] = i;
		ct_fill(r, i, 1000 + i);
	}
	uint32_t gens[3] = {ct_actor_gen(&env, "lookup"), ct_actor_gen(&env, "loader.0"), ct_actor_gen(&env, "storer.0")};
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(kvr_store(r->c, 1, tokens, (size_t)NB * 16, NULL, 0, blocks, NB), 0, "%s", kvr_last_error(r->c));
	struct kvr_completion d = wait_one(r, 60000);
	uint64_t store_ns = kvr_now_ns() - t0;
	cr_assert_eq(d.n_stored, NB);
	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lookup(r->c, 2, tokens, (size_t)NB * 16, NULL, 0, &res), 0, "%s", kvr_last_error(r->c));
	cr_assert_eq(res.matched_blocks, NB);
	for (uint32_t i = 0; i < NB; i++) {
		blocks[i] = (i + 1) % NB; /* every block lands somewhere else: a wrong one shows */
		ct_fill(r, i, CT_CANARY);
	}
	t0 = kvr_now_ns();
	cr_assert_eq(kvr_load(r->c, 2, blocks, NB), 0, "%s", kvr_last_error(r->c));
	d = wait_one(r, 60000);
	uint64_t load_ns = kvr_now_ns() - t0;
	char why[160];
	for (uint32_t i = 0; i < NB; i++)
		cr_assert(ct_holds(r, (i + 1) % NB, 1000 + i, why, sizeof(why)), "block %u: %s", i, why);
	printf("60,000 blocks with health_interval_ms 10: store %.0f ms, load %.0f ms\n", store_ns / 1e6, load_ns / 1e6);
	cr_assert_eq(ct_actor_gen(&env, "lookup"), gens[0], "the lookup actor was restarted");
	cr_assert_eq(ct_actor_gen(&env, "loader.0"), gens[1], "the loader was restarted");
	cr_assert_eq(ct_actor_gen(&env, "storer.0"), gens[2], "the storer was restarted");
	char *log = h_read_file(env.h.log);
	bool missed = strstr(log, "missed") != NULL;
	free(log);
	cr_assert(!missed, "an actor missed pings (kvringd's log says which)");
}

/* Engines a and b attached (one worker each); a stored a 2-block prompt of `seed` in its
 * engine blocks 0 and 1, holding tag0 and tag0 + 1. */
static void two_engines(struct ct_rank **a, struct ct_rank **b, uint32_t *tokens, uint64_t seed, uint64_t tag0)
{
	cr_assert_eq(ct_rank_open_engine(&env, 0, 16, 0, "engine-a", NULL, a), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(ct_rank_open_engine(&env, 0, 16, 0, "engine-b", NULL, b), 0, "%s", kvr_last_error(NULL));
	uint32_t blocks[2] = {0, 1};
	ct_prompt(tokens, 2 * 16, seed);
	ct_fill(*a, 0, tag0);
	ct_fill(*a, 1, tag0 + 1);
	struct ct_done d;
	ct_store(*a, 1, tokens, 2 * 16, blocks, 2, &d);
	cr_assert_eq(d.c.status, 0);
}

/* A worker that never drains its reply ring delays nobody: with timeouts.reply_ms at a
 * minute, a lookup actor that waited for room in that ring would hold every other worker's
 * lookup for a minute (their 5 s timeout would fail them). The other worker's lookup is
 * answered; the stuck worker's replies wait in the lookup actor's outbox and arrive, in
 * order, once it reads again. */
Test(scale, a_worker_that_never_reads_delays_no_other)
{
	ct_start(&env, &ct_tiny, &(struct ct_opts){.max_workers = 2, .sections_extra =
		",\n  \"timeouts\": {\"reply_ms\": 60000, \"alloc_wait_ms\": 120000, \"lookup_call_ms\": 180000}"});
	struct ct_rank *a, *b;
	uint32_t tokens[2 * 16];
	two_engines(&a, &b, tokens, 9, 21);

	/* b floods the lookup actor with lookups and reads no answer: more than its ring holds */
	char name[32];
	snprintf(name, sizeof(name), KVR_RING_LOOKUP_REQ, b->worker);
	struct kvr_ring *req = ct_ring(&env, name);
	snprintf(name, sizeof(name), KVR_RING_LOOKUP_REP, b->worker);
	struct kvr_ring *rep = ct_ring(&env, name);
	const unsigned flood = rep->shm->capacity + 500;
	kvr_key k;
	ct_keys(&env, tokens, 16, &k);
	uint64_t gen = (uint64_t)(ct_actor_gen(&env, "lookup") & 0xffff) << 48 |
		       (uint64_t)(kvr_ctl_worker(env.ctl, b->worker)->generation & 0xffff) << 32;
	for (unsigned i = 0; i < flood; i++) {
		struct kvr_msg m;
		kvr_msg_build_list(&m, KVR_MSG_LOOKUP, gen | (0x1000 + i), 0, 0, 0, &k, 1);
		cr_assert_eq(kvr_ring_enqueue(req, &m, 5000000000ll), 0, "request %u not taken", i);
	}
	cr_assert(H_WAIT(kvr_ring_count(rep) == rep->shm->capacity, 5000), "b's reply ring did not fill");

	/* a is answered at once, byte-exact, while b's answers wait */
	cr_assert_eq(ct_lookup_load_exact(a, 2, tokens, 2 * 16, 4, 21), 2, "a's lookup waited behind b");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_REPLIES_DROPPED), 0);

	/* b reads again: every answer arrives, in order (LOOKUP_REP + SLOTS each) */
	unsigned got = 0;
	uint64_t want = gen | 0x1000;
	while (got < flood) {
		struct kvr_msg m;
		cr_assert_eq(kvr_ring_dequeue(rep, &m, 5000000000ll), 0, "answer %u of %u missing", got, flood);
		if (m.hdr.type == KVR_MSG_SLOTS)
			continue;
		cr_assert_eq(m.hdr.type, KVR_MSG_LOOKUP_REP);
		cr_assert_eq(m.hdr.req_id, want + got, "answer %u out of order", got);
		got++;
	}
}

/* Llama-3.1-405B's 126 layers (GQA, K and V per layer: 252 regions) attach, store and load
 * byte-exact; so does the largest geometry there is, 512 layers (1024 regions). */
Test(scale, a_126_layer_gqa_geometry_attaches_stores_and_loads)
{
	static const struct ct_model m126 = {.layers = 126, .kv_heads = 1, .head_dim = 16, .dtype_bytes = 2,
					     .block_tokens = 16, .tp_size = 1};
	ct_start(&env, &m126, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 8, 0, &r), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(r->g.n_regions, 252);
	uint32_t tokens[3 * 16], blocks[3] = {0, 1, 2};
	ct_prompt(tokens, 3 * 16, 126);
	for (uint32_t i = 0; i < 3; i++)
		ct_fill(r, i, 1260 + i);
	struct ct_done d;
	ct_store(r, 1, tokens, 3 * 16, blocks, 3, &d);
	cr_assert_eq(d.c.status, 0);
	cr_assert_eq(ct_lookup_load_exact(r, 2, tokens, 3 * 16, 4, 1260), 3);
}

Test(scale, the_largest_geometry_attaches_and_one_more_region_is_refused)
{
	static const struct ct_model m512 = {.layers = KVR_GEOM_MAX_REGIONS / 2, .kv_heads = 1, .head_dim = 8,
					     .dtype_bytes = 2, .block_tokens = 16, .tp_size = 1};
	ct_start(&env, &m512, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 4, 0, &r), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(r->g.n_regions, KVR_GEOM_MAX_REGIONS);
	uint32_t tokens[16], blocks[1] = {0};
	ct_prompt(tokens, 16, 512);
	ct_fill(r, 0, 5120);
	struct ct_done d;
	ct_store(r, 1, tokens, 16, blocks, 1, &d);
	cr_assert_eq(d.c.status, 0);
	cr_assert_eq(ct_lookup_load_exact(r, 2, tokens, 16, 2, 5120), 1);
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, KVR_GEOM_MAX_REGIONS / 2 + 1, 1, 8, 2, 16, 4), -EINVAL,
		     "a geometry of more than KVR_GEOM_MAX_REGIONS regions cannot be built");
}

/* ---- a worker that scribbles over its rings ----------------------------------------- */

/* The rings a worker's client reads and writes (all of them in its area, the only memory
 * it can write: kvr_ctl.h). */
static const char *const worker_ring_fmts[] = {KVR_RING_LOOKUP_REQ, KVR_RING_LOOKUP_REP, KVR_RING_LOAD_REQ,
					       KVR_RING_LOAD_REP, KVR_RING_STORE_REQ, KVR_RING_STORE_REP};
#define N_WORKER_RINGS (sizeof(worker_ring_fmts) / sizeof(worker_ring_fmts[0]))

struct scribble_target {
	uint8_t *mem;
	size_t bytes;
};

static void worker_rings(unsigned w, struct scribble_target *ret)
{
	for (unsigned k = 0; k < N_WORKER_RINGS; k++) {
		char name[KVR_RING_NAME_MAX];
		snprintf(name, sizeof(name), worker_ring_fmts[k], w);
		int i = kvr_ctl_find_ring(env.ctl, name);
		cr_assert_geq(i, 0, "no ring %s", name);
		const struct kvr_ring_ent *e = kvr_ctl_ring_ent(env.ctl, (unsigned)i);
		ret[k] = (struct scribble_target){(uint8_t *)env.ctl + e->offset, e->bytes};
		const struct kvr_area_ent *ae = kvr_ctl_area_ent(env.ctl, w);
		cr_assert(e->offset >= ae->offset && e->offset + e->bytes <= ae->offset + ae->bytes,
			  "ring %s lies in worker %u's area", name, w);
	}
}

/* Everything worker w can write: its area (header, waiter, rings, the padding). */
static struct scribble_target worker_area(unsigned w)
{
	const struct kvr_area_ent *ae = kvr_ctl_area_ent(env.ctl, w);
	return (struct scribble_target){(uint8_t *)env.ctl + ae->offset, ae->bytes};
}

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* The values that broke a ring that trusted its header: sizes that overrun every buffer,
 * indices far apart, waiter offsets outside the mapping, at a non-waiter, at another
 * client's waiter (legal: it only wakes). */
static void scribble_nasty(struct kvr_ring_shm *h, unsigned variant, int64_t other_waiter_off)
{
	switch (variant % 6) {
	case 0:
		h->msg_size = 4096;
		h->capacity = 1u << 30;
		break;
	case 1:
		h->data_off = UINT32_MAX;
		atomic_store(&h->tail, atomic_load(&h->head) + 5); /* five messages the header says are there */
		break;
	case 2:
		atomic_store(&h->tail, atomic_load(&h->head) + (1u << 31)); /* fill above any capacity */
		atomic_store(&h->cons_waiter_off, INT64_MIN);
		atomic_store(&h->prod_waiter_off, INT64_MAX);
		break;
	case 3:
		atomic_store(&h->cons_waiter_off, -(int64_t)sizeof(struct kvr_seg_hdr)); /* in the ctl header */
		atomic_store(&h->prod_waiter_off, 4);
		break;
	case 4:
		atomic_store(&h->cons_waiter_off, other_waiter_off);
		atomic_store(&h->prod_waiter_off, other_waiter_off);
		break;
	case 5:
		memset(h, 0xff, sizeof(*h));
		break;
	}
}

/* The scribbler: every byte of worker w's area, random, over and over, until killed. */
static void scribble_forever(struct scribble_target t, uint64_t seed)
{
	uint64_t s = seed | 1;
	for (;;) {
		uint64_t *p = (uint64_t *)(void *)t.mem;
		for (size_t j = 0; j < t.bytes / 8; j++)
			p[j] = xorshift(&s);
		usleep(200); /* two cores: the actors and the test must run too */
	}
}

/*
 * Worker b scribbles over every byte of the memory it can write — its area of the control
 * segment: its waiter and its rings' headers, indices, waiter offsets, messages — first with
 * the values that break a trusting ring, then with random bytes from another process while
 * worker a stores and loads. No actor dies or
 * restarts, the lookup actor rejects (and counts) what it cannot decode, every byte a
 * loads is a's, and once b is gone the slot table holds only FREE and COMMITTED slots.
 */
Test(scale, a_worker_scribbling_over_its_rings_crashes_no_actor)
{
	ct_start(&env, &ct_tiny, &(struct ct_opts){.max_workers = 2});
	struct ct_rank *a, *b;
	uint32_t tokens[2 * 16];
	two_engines(&a, &b, tokens, 31, 41);
	struct ct_done d;

	unsigned n_actors = atomic_load(&env.ctl->n_actors);
	pid_t pid0[KVR_CTL_MAX_ACTORS];
	uint32_t restarts0[KVR_CTL_MAX_ACTORS];
	for (unsigned i = 0; i < n_actors; i++) {
		pid0[i] = atomic_load(&kvr_ctl_actor(env.ctl, i)->pid);
		restarts0[i] = kvr_ctl_actor(env.ctl, i)->restarts;
	}
	uint64_t malformed0 = ct_stat(&env, "lookup", KVR_STAT_MALFORMED);
	struct scribble_target t[N_WORKER_RINGS];
	worker_rings(b->worker, t);
	/* a's client waiter, as an offset from each of b's rings */
	uintptr_t a_waiter = (uintptr_t)&kvr_ctl_area(env.ctl, a->worker)->waiter;

	uint64_t req = 100;
	for (unsigned round = 0; round < 24; round++) {
		for (unsigned k = 0; k < N_WORKER_RINGS; k++)
			scribble_nasty((struct kvr_ring_shm *)(void *)t[k].mem, round + k,
				       (int64_t)(a_waiter - (uintptr_t)t[k].mem));
		cr_assert_eq(ct_lookup_load_exact(a, req++, tokens, 2 * 16, 4, 41), 2, "round %u", round);
	}

	uint64_t seed = 0x5c1bb1e5ull ^ (uint64_t)getpid();
	pid_t scribbler = fork();
	cr_assert_geq(scribbler, 0);
	if (scribbler == 0) {
		scribble_forever(worker_area(b->worker), seed);
		_exit(0);
	}
	ct_track_child(scribbler);
	for (unsigned round = 0; round < 40; round++) {
		cr_assert_eq(ct_lookup_load_exact(a, req++, tokens, 2 * 16, 4, 41), 2, "round %u", round);
		if (round % 8 == 7) { /* a new prompt of a's, stored and loaded back while b scribbles */
			uint32_t more[2 * 16];
			ct_prompt(more, 2 * 16, 1000 + round);
			ct_fill(a, 8, 500 + round);
			ct_fill(a, 9, 501 + round);
			uint32_t mb[2] = {8, 9};
			ct_store(a, req++, more, 2 * 16, mb, 2, &d);
			cr_assert_eq(d.c.status, 0, "round %u: a's store failed: %d", round, d.c.status);
			cr_assert_eq(ct_lookup_load_exact(a, req++, more, 2 * 16, 12, 500 + round), 2, "round %u", round);
		}
	}
	cr_assert_eq(kill(scribbler, SIGKILL), 0);
	cr_assert_eq(waitpid(scribbler, NULL, 0), scribbler);
	ct_untrack_child(scribbler);

	for (unsigned i = 0; i < n_actors; i++) {
		const struct kvr_actor_ent *ae = kvr_ctl_actor(env.ctl, i);
		cr_assert_eq(atomic_load(&ae->pid), pid0[i], "%s: pid %d, was %d", ae->name, atomic_load(&ae->pid), pid0[i]);
		cr_assert_eq(ae->restarts, restarts0[i], "%s restarted", ae->name);
	}
	cr_assert_gt(ct_stat(&env, "lookup", KVR_STAT_MALFORMED), malformed0,
		     "the lookup actor never saw (and rejected) a scribbled message");

	/* b goes; its slots (whatever its garbage made the lookup actor allocate) are reclaimed */
	unsigned bw = b->worker;
	ct_rank_close(b);
	ct_assert_table_clean(&env);
	cr_assert_eq(ct_lookup_load_exact(a, req++, tokens, 2 * 16, 4, 41), 2);

	/* the next worker of b's slot inherits none of the garbage: the slot got a fresh area
	 * once b was gone (the lookup actor mapped it at WORKER_GONE, kvringd when the slot went
	 * free; b's old one is mapped by nobody but whoever kept it), and it stores and loads
	 * byte-exact */
	cr_assert(H_WAIT(atomic_load(&kvr_ctl_worker(env.ctl, bw)->state) == KVR_WORKER_FREE, 5000),
		  "worker slot %u never went free", bw);
	cr_assert_eq(kvr_ctl_worker(env.ctl, bw)->area_ack, kvr_ctl_worker(env.ctl, bw)->generation,
		     "the lookup actor mapped the fresh area");
	h_daemon_areas(&env.h, 1, &env.ctl_seg); /* our mapping still showed b's old area */
	for (unsigned k = 0; k < N_WORKER_RINGS; k++) {
		const struct kvr_ring_shm *h = (const struct kvr_ring_shm *)(const void *)t[k].mem;
		cr_assert_eq(h->magic, KVR_RING_MAGIC, "%s", worker_ring_fmts[k]);
		cr_assert_eq(atomic_load(&h->head), atomic_load(&h->tail), "%s is empty", worker_ring_fmts[k]);
		cr_assert_eq(h->capacity * (uint64_t)KVR_CTL_RING_MSG_SIZE + sizeof(*h), t[k].bytes, "%s", worker_ring_fmts[k]);
	}
	struct ct_rank *c2;
	cr_assert_eq(ct_rank_open_engine(&env, 0, 16, 0, "engine-c", NULL, &c2), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(c2->worker, bw, "the new worker took b's slot");
	uint32_t fresh[2 * 16], cb[2] = {3, 4};
	ct_prompt(fresh, 2 * 16, 777);
	ct_fill(c2, 3, 900);
	ct_fill(c2, 4, 901);
	ct_store(c2, req++, fresh, 2 * 16, cb, 2, &d);
	cr_assert_eq(d.c.status, 0, "the next worker's store: %d", d.c.status);
	cr_assert_eq(d.c.n_blocks, 2);
	cr_assert_eq(ct_lookup_load_exact(c2, req++, fresh, 2 * 16, 10, 900), 2);
	ct_rank_close(c2);
}
