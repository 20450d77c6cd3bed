/* L1 data path under pressure: random shared-prefix workloads with eviction, and actors killed at random. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_harness.h"
#include "ipc_test.h"

static struct ct_env env;

static void setup(void)
{
	ct_init(&env);
}

static void teardown(void)
{
	ct_fini(&env);
}

TestSuite(client_stress, .init = setup, .fini = teardown, .timeout = 240);

/*
 * Contents follow the block key: the engine block a store copies from holds tag(key) (on
 * each rank its own pattern of it), so any block a load restores must hold tag(key) of the
 * block matched at that position, whatever was shared, evicted or re-stored meanwhile.
 */
static uint64_t tag_of(kvr_key k)
{
	return k.lo | 1;
}

#define MAX_BLK 10
#define N_FAMILIES 6
#define N_PROMPTS 40
#define SRC_BASE 0     /* engine blocks 0..127: store sources */
#define DST_BASE 128   /* engine blocks 128..255: load destinations */
#define N_ENGINE 256

struct prompt {
	uint32_t tokens[MAX_BLK * 16];
	uint32_t n;          /* blocks */
	kvr_key keys[MAX_BLK];
};

static struct prompt prompts[N_PROMPTS];

/* Prompts share prefixes: a family's base tokens, then a prompt-specific suffix. */
static void make_prompts(struct rng *g)
{
	static uint32_t base[N_FAMILIES][MAX_BLK * 16];
	for (unsigned f = 0; f < N_FAMILIES; f++)
		ct_prompt(base[f], MAX_BLK * 16, rng_next(g));
	for (unsigned p = 0; p < N_PROMPTS; p++) {
		struct prompt *q = &prompts[p];
		uint32_t pre = 1 + rng_below(g, 6), suf = rng_below(g, 4);
		q->n = pre + suf;
		memcpy(q->tokens, base[rng_below(g, N_FAMILIES)], pre * 16 * sizeof(uint32_t));
		ct_prompt(q->tokens + pre * 16, suf * 16, rng_next(g));
		ct_keys(&env, q->tokens, q->n * 16, q->keys);
	}
}

struct loadcheck {
	const struct prompt *p;
	uint32_t m;            /* matched blocks loaded */
	uint32_t dst[MAX_BLK];
};

/* Fill the destination window with canaries and pick destination ids for m blocks. */
static void prepare_load(struct ct_rank *r, struct loadcheck *lc, const struct prompt *p, uint32_t m, uint32_t *cursor)
{
	lc->p = p;
	lc->m = m;
	for (uint32_t i = 0; i < m; i++) {
		lc->dst[i] = DST_BASE + (*cursor)++ % (N_ENGINE - DST_BASE);
		ct_fill(r, lc->dst[i], CT_CANARY);
	}
}

/* A load's completion: each block restored byte-exact or listed failed (and untouched). */
static void check_load(struct ct_rank *r, const struct loadcheck *lc, const struct ct_done *d, bool may_pipe,
		       uint64_t *ok, uint64_t *failed)
{
	cr_assert_eq(d->c.n_blocks, lc->m);
	if (d->c.status == -EPIPE) {
		cr_assert(may_pipe, "load failed -EPIPE without an actor death");
		cr_assert_eq(d->c.n_failed, lc->m, "-EPIPE fails every block");
	} else {
		cr_assert(d->c.status == 0 || d->c.status == -EIO, "load status %d", d->c.status);
		cr_assert_eq(d->c.status == 0, d->c.n_failed == 0);
	}
	for (uint32_t i = 0; i < lc->m; i++) {
		bool f = false;
		for (uint32_t k = 0; k < d->c.n_failed; k++)
			f |= d->failed[k] == lc->dst[i];
		char why[200] = "";
		if (f) {
			/* an -EPIPE load may have been half copied by the dying loader; -EIO not */
			if (d->c.status != -EPIPE)
				cr_assert(ct_holds(r, lc->dst[i], CT_CANARY, why, sizeof(why)),
					  "failed block written: %s", why);
			(*failed)++;
			continue;
		}
		cr_assert(ct_holds(r, lc->dst[i], tag_of(lc->p->keys[i]), why, sizeof(why)), "wrong bytes: %s", why);
		(*ok)++;
	}
}

/* Fill the source blocks of prompt p on rank r and submit its store. */
static int submit_store(struct ct_rank *r, uint64_t req, const struct prompt *p, uint32_t *cursor)
{
	uint32_t src[MAX_BLK];
	for (uint32_t i = 0; i < p->n; i++) {
		src[i] = SRC_BASE + (*cursor)++ % (DST_BASE - SRC_BASE);
		ct_fill(r, src[i], tag_of(p->keys[i]));
	}
	return kvr_store(r->c, req, p->tokens, p->n * 16, NULL, 0, src, p->n);
}

static void check_store(const struct ct_done *d, uint32_t n, bool may_pipe)
{
	cr_assert_eq(d->c.n_blocks, n);
	if (d->c.status == -EPIPE) {
		cr_assert(may_pipe, "store failed -EPIPE without an actor death");
		cr_assert_eq(d->c.n_failed, n);
		return;
	}
	cr_assert(d->c.status == 0 || d->c.status == -EIO, "store status %d", d->c.status);
	cr_assert_eq(d->c.n_stored + d->c.n_present + d->c.n_failed, n, "stored %u + present %u + failed %u != %u",
		     d->c.n_stored, d->c.n_present, d->c.n_failed, n);
	cr_assert_eq(d->c.status == 0, d->c.n_failed == 0);
}

/* Every committed slot holds the bytes of its key, on its lane. */
static void check_l1(struct ct_rank **ranks, unsigned n_ranks)
{
	uint32_t checked = 0;
	for (uint32_t s = 0; s < env.slots->n_slots; s++) {
		if (kvr_slot_state(env.slots, s) != KVR_SLOT_COMMITTED)
			continue;
		const struct kvr_slot *sl = kvr_slot_at(env.slots, s);
		cr_assert(sl->lane < n_ranks);
		char why[160] = "";
		cr_assert(ct_slot_holds(&env, ranks[sl->lane], s, tag_of(sl->key), why, sizeof(why)), "L1: %s", why);
		checked++;
	}
	cr_assert_gt(checked, 0);
}

/* Wait until no slot is WRITING and no pin is held (the pipeline has settled). */
static void settle(void)
{
	struct kvr_slot_counts c;
	bool ok = H_WAIT((kvr_slots_counts(env.slots, &c), c.by_state[KVR_SLOT_WRITING] == 0 && c.pins == 0), 5000);
	cr_assert(ok, "slots leaked: %u WRITING, %llu pins", c.by_state[KVR_SLOT_WRITING], (unsigned long long)c.pins);
}

/*
 * TP 2, an L1 of 12 blocks, 40 prompts over 6 shared prefixes. Each step stores a prompt
 * from both ranks (sometimes only rank 0: never visible), looks one up and loads it on both
 * ranks, or loads one while stores that evict run concurrently in the storers.
 */
Test(client_stress, random_workload_tp2)
{
	struct rng g = {test_seed("client_stress::random_workload_tp2")};
	struct ct_opts o = {.l1_slots = 24, .eviction = "s3fifo"};
	ct_start(&env, &(struct ct_model){2, 2, 16, 2, 16, 2}, &o);
	struct ct_rank *r[2];
	cr_assert_eq(ct_rank_open(&env, 0, N_ENGINE, 0, &r[0]), 0);
	cr_assert_eq(ct_rank_open(&env, 1, N_ENGINE, 0, &r[1]), 0);
	make_prompts(&g);
	uint32_t scur[2] = {0, 0}, dcur[2] = {0, 0};
	uint64_t ok = 0, failed = 0, matched = 0, req = 1;
	const unsigned steps = 1500;
	for (unsigned step = 0; step < steps; step++) {
		const struct prompt *p = &prompts[rng_below(&g, N_PROMPTS)];
		uint32_t op = rng_below(&g, 100);
		struct ct_done d;
		if (op < 40) {
			unsigned ranks = rng_below(&g, 100) < 15 ? 1 : 2;
			for (unsigned k = 0; k < ranks; k++) {
				cr_assert_eq(submit_store(r[k], req, p, &scur[k]), 0, "%s", kvr_last_error(r[k]->c));
				ct_wait_done(r[k], &d, 5000);
				check_store(&d, p->n, false);
			}
			req++;
			continue;
		}
		uint32_t m0 = ct_lookup(r[0], req, p->tokens, p->n * 16);
		uint32_t m1 = ct_lookup(r[1], req, p->tokens, p->n * 16);
		cr_assert_eq(m0, m1, "step %u: ranks disagree on the visible prefix", step);
		cr_assert(m0 <= p->n);
		matched += m0;
		if (!m0) {
			req++;
			continue;
		}
		struct loadcheck lc[2];
		for (unsigned k = 0; k < 2; k++) {
			prepare_load(r[k], &lc[k], p, m0, &dcur[k]);
			cr_assert_eq(kvr_load(r[k]->c, req, lc[k].dst, m0), 0, "%s", kvr_last_error(r[k]->c));
		}
		uint64_t lreq = req++;
		if (op >= 85) {
			/* stores of another prompt race the loads: eviction against pinned slots */
			const struct prompt *q = &prompts[rng_below(&g, N_PROMPTS)];
			for (unsigned k = 0; k < 2; k++)
				cr_assert_eq(submit_store(r[k], req, q, &scur[k]), 0);
			for (unsigned k = 0; k < 2; k++)
				for (int got = 0; got < 2; got++) {
					ct_wait_done(r[k], &d, 5000);
					if (d.c.op == KVR_OP_STORE_DONE) {
						cr_assert_eq(d.c.req_id, req);
						check_store(&d, q->n, false);
					} else {
						cr_assert_eq(d.c.req_id, lreq);
						check_load(r[k], &lc[k], &d, false, &ok, &failed);
					}
				}
			req++;
			continue;
		}
		for (unsigned k = 0; k < 2; k++) {
			ct_wait_done(r[k], &d, 5000);
			cr_assert_eq(d.c.op, KVR_OP_LOAD_DONE);
			check_load(r[k], &lc[k], &d, false, &ok, &failed);
			cr_assert_eq(d.c.n_failed, 0, "nothing evicts between a lookup and its load here");
		}
	}
	settle();
	check_l1(r, 2);
	uint64_t evicted = ct_stat(&env, "lookup", KVR_STAT_LK_EVICTED);
	fprintf(stderr, "random_workload_tp2: %u steps, %llu blocks matched, %llu restored, %llu failed, "
		"%llu evicted\n",
		steps, (unsigned long long)matched, (unsigned long long)ok, (unsigned long long)failed,
		(unsigned long long)evicted);
	cr_assert_gt(ok, 0);
	cr_assert_gt(evicted, 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_MALFORMED), 0);
	for (unsigned i = 0; i < atomic_load(&env.h.ctl->n_actors); i++)
		cr_assert_eq(kvr_ctl_actor(env.h.ctl, i)->restarts, 0);
}

/* ---- actors killed at random --------------------------------------------------------- */

struct killer {
	uint64_t seed;
	unsigned kills;
	atomic_bool stop;
	_Atomic unsigned done;
	pid_t last_killed[3];    /* per victim: its last pid killed (read after join) */
};

static const char *const victims[] = {"lookup", "loader.0", "storer.0"};

static void *killer_thread(void *arg)
{
	struct killer *k = arg;
	struct rng g = {k->seed ^ 0x4b494c4cull};
	while (!atomic_load(&k->stop) && k->done < k->kills) {
		usleep(150000 + rng_below(&g, 250000));
		unsigned v = rng_below(&g, 3);
		struct kvr_actor_ent *a = h_actor(&env.h, victims[v]);
		pid_t pid = a ? atomic_load(&a->pid) : 0;
		if (pid > 0 && atomic_load(&a->state) == KVR_ACTOR_READY && kill(pid, SIGKILL) == 0) {
			k->last_killed[v] = pid;
			atomic_fetch_add(&k->done, 1);
		}
	}
	return NULL;
}

/*
 * While a thread kills the lookup actor, the loader or the storer every 150-400 ms, the
 * worker keeps storing, looking up and loading. Every call returns within its timeout;
 * every completion is success, a clean partial failure (-EIO with the failed ids) or the
 * dead actor's -EPIPE with every block id; no restored block holds wrong bytes; once the
 * killing stops no slot stays WRITING or pinned and the pipeline works again.
 */
Test(client_stress, actors_killed_at_random)
{
	struct rng g = {test_seed("client_stress::actors_killed_at_random")};
	struct ct_opts o = {.l1_slots = 16, .eviction = "lru", .crash_loop_max = 1000};
	ct_start(&env, &(struct ct_model){2, 2, 16, 2, 16, 1}, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, N_ENGINE, 0, &r), 0);
	make_prompts(&g);
	struct killer k = {.seed = g.s, .kills = 20};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, killer_thread, &k), 0);
	uint32_t scur = 0, dcur = 0;
	uint64_t ok = 0, failed = 0, req = 1, pipes = 0, steps = 0;
	uint64_t t_end = kvr_now_ns() + 20ull * 1000000000ull;
	while (k.done < k.kills && kvr_now_ns() < t_end) {
		steps++;
		const struct prompt *p = &prompts[rng_below(&g, N_PROMPTS)];
		struct ct_done d;
		uint64_t t0 = kvr_now_ns();
		if (rng_below(&g, 100) < 40) {
			int rc = submit_store(r, req, p, &scur);
			if (rc == -EPIPE) { /* the storer is restarting */
				pipes++;
				usleep(5000);
				continue;
			}
			cr_assert_eq(rc, 0, "store: %s", kvr_last_error(r->c));
			ct_wait_done(r, &d, 6000);
			check_store(&d, p->n, true);
			pipes += d.c.status == -EPIPE;
		} else {
			struct kvr_lookup_result res;
			int rc = kvr_lookup(r->c, req, p->tokens, p->n * 16, NULL, 0, &res);
			if (rc == -EPIPE) {
				pipes++;
				usleep(5000);
				continue;
			}
			cr_assert_eq(rc, 0, "lookup: %d %s", rc, kvr_last_error(r->c));
			if (res.matched_blocks) {
				struct loadcheck lc;
				prepare_load(r, &lc, p, res.matched_blocks, &dcur);
				rc = kvr_load(r->c, req, lc.dst, lc.m);
				if (rc == -EPIPE) {
					pipes++;
					usleep(5000);
					continue;
				}
				cr_assert_eq(rc, 0, "load: %s", kvr_last_error(r->c));
				ct_wait_done(r, &d, 6000);
				check_load(r, &lc, &d, true, &ok, &failed);
				pipes += d.c.status == -EPIPE;
			}
		}
		req++;
		uint64_t ms = (kvr_now_ns() - t0) / 1000000;
		cr_assert(ms < 6000, "a step took %llu ms", (unsigned long long)ms);
	}
	atomic_store(&k.stop, true);
	pthread_join(th, NULL);
	fprintf(stderr, "actors_killed_at_random: %u kills, %llu steps, %llu -EPIPE, %llu restored, %llu failed\n",
		atomic_load(&k.done), (unsigned long long)steps, (unsigned long long)pipes, (unsigned long long)ok,
		(unsigned long long)failed);
	cr_assert_eq(atomic_load(&k.done), k.kills, "only %u kills in 20 s", atomic_load(&k.done));

	/* READY under a new pid: a victim killed last may show READY until kvringd reaps it */
	for (unsigned i = 0; i < 3; i++)
		ct_wait_ready(&env, victims[i], k.last_killed[i], 5000);
	settle();
	/* the pipeline works again, byte-exact */
	const struct prompt *p = &prompts[0];
	struct ct_done d;
	cr_assert_eq(submit_store(r, req, p, &scur), 0);
	ct_wait_done(r, &d, 5000);
	check_store(&d, p->n, false);
	cr_assert_eq(d.c.status, 0);
	cr_assert_eq(ct_lookup(r, req + 1, p->tokens, p->n * 16), p->n);
	struct loadcheck lc;
	prepare_load(r, &lc, p, p->n, &dcur);
	ct_load(r, req + 1, lc.dst, lc.m, &d);
	cr_assert_eq(d.c.status, 0);
	check_load(r, &lc, &d, false, &ok, &failed);
	check_l1(&r, 1);
}
