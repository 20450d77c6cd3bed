/* An instance with no model section (the embedded default): L1 is laid out for the first worker that attaches;
 * refusals name the first worker, the config key and the sizes; L2 is adopted after a restart once bound again. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"
#include "l2file.h"
#include "kvr_time.h"

static struct ct_env env;
static char l2dir[256];

static void setup(void)
{
	ct_init(&env);
	snprintf(l2dir, sizeof(l2dir), "%s/l2", env.h.dir);
	cr_assert_eq(mkdir(l2dir, 0700), 0);
}

static void teardown(void)
{
	if (env.h.pid > 0)
		(void)kill(env.h.pid, SIGKILL);
	ct_fini(&env);
}

TestSuite(no_model, .init = setup, .fini = teardown, .timeout = 90);

#define MAX_PROMPTS 8

#define BLOCKS 4
#define BT 16 /* ct_tiny's block_tokens */
#define TAG(prompt, i) (7000ull * (prompt) + (i) + 1)

static uint32_t tokens[8][BLOCKS * BT];

/* Store prompt p on rank r from engine blocks 0..3 with tags TAG(p + salt, i). */
static void store_tagged(struct ct_rank *r, unsigned p, uint64_t salt, uint64_t req)
{
	uint32_t blocks[BLOCKS];
	for (uint32_t i = 0; i < BLOCKS; i++) {
		blocks[i] = i;
		ct_fill(r, i, TAG(p + salt, i));
	}
	struct ct_done d;
	ct_store(r, req, tokens[p], BLOCKS * BT, blocks, BLOCKS, &d);
	cr_assert_eq(d.c.status, 0, "store %u: %d", p, d.c.status);
	cr_assert_eq(d.c.n_stored, BLOCKS, "store %u stored %u", p, d.c.n_stored);
}

/* Prompt p of tokens from seed 300 + p, stored with tags TAG(p, i). */
static void store_prompt(struct ct_rank *r, unsigned p)
{
	ct_prompt(tokens[p], BLOCKS * BT, 300 + p);
	store_tagged(r, p, 0, 1 + p);
}

static int open_rank(unsigned rank, uint32_t head_dim, const char *engine, const char *model_ns, struct ct_rank **r)
{
	return ct_rank_open_engine(&env, rank, 16, head_dim, engine, model_ns, r);
}

/* Nothing is laid out or started before the first worker: the lookup actor idle, no arena; a
 * scheduler and an engine that names no model are refused with what to do; the first worker
 * lays L1 out for its own geometry (the slots ct_start sized for ct_tiny) and is served byte-exact. */
Test(no_model, binds_at_the_first_attach_and_serves_byte_exact)
{
	struct ct_opts o = {.no_model = true};
	ct_start(&env, &ct_tiny, &o);
	cr_assert_eq(env.ctl->arena_bytes, 0, "no arena before the first attach");
	cr_assert_eq(atomic_load(&h_actor(&env.h, "lookup")->state), KVR_ACTOR_IDLE, "lookup started before a model");
	cr_assert_eq(atomic_load(&env.ctl->state), KVR_INST_RUNNING, "an instance without a model serves attaches");
	cr_assert(h_log_contains(&env.h, "no model section: L1 (266240 bytes) is laid out for the geometry of the first "
					 "worker that attaches"));

	struct kvr_client *sc = NULL;
	struct kvr_sched_opts so = {.socket = env.h.sock, .engine_id = "e1", .model_ns = "org/a", .timeout_ms = 5000};
	cr_assert_eq(kvr_attach_scheduler(&so, &sc), -EAGAIN);
	cr_assert(strstr(kvr_last_error(NULL), "no worker has attached yet"), "%s", kvr_last_error(NULL));

	struct ct_rank *r;
	cr_assert_eq(open_rank(0, 0, "e1", NULL, &r), -EINVAL);
	cr_assert(strstr(kvr_last_error(NULL), "engine \"e1\" names no model"), "%s", kvr_last_error(NULL));
	cr_assert_eq(env.ctl->arena_bytes, 0, "a refused attach lays nothing out");

	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &r), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env); /* 64 slots of ct_tiny's 4096-byte lane */
	cr_assert_eq(env.slots->block_tokens, 0, "each slot records its engine's block size");
	cr_assert_eq(env.slots->quorum, 0, "each block records its own lanes");
	cr_assert_eq(env.ctl->arena_bytes, env.arena_seg.size);
	cr_assert(h_log_contains(&env.h, "L1 laid out for the geometry of engine \"e1\" rank 0 pid"));

	store_prompt(r, 0);
	cr_assert_eq(ct_lookup_load_exact(r, 50, tokens[0], BLOCKS * BT, 8, TAG(0, 0)), BLOCKS);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), BLOCKS);

	/* the scheduler of that engine attaches now, sees the bound block size and the blocks */
	cr_assert_eq(kvr_attach_scheduler(&so, &sc), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(kvr_block_tokens(sc), BT);
	struct kvr_lookup_result lr;
	cr_assert_eq(kvr_lease(sc, 77, tokens[0], BLOCKS * BT, NULL, 0, NULL, &lr), 0, "%s", kvr_last_error(sc));
	cr_assert_eq(lr.matched_blocks, BLOCKS);
	cr_assert_eq(kvr_lease_release(sc, 77), 0);
	kvr_detach(sc);
	ct_assert_table_clean(&env);
}

/* Committed slots tagged with model entry m (kvr_slot.model). */
static uint64_t slots_of_model(unsigned m)
{
	uint64_t n[KVR_CTL_MAX_MODELS + 1];
	kvr_slots_model_counts(env.slots, n, KVR_CTL_MAX_MODELS + 1);
	return n[m];
}

/* Two engines of two geometries (head_dim 16 and 8: lanes of 4 and 2 KiB) on one instance
 * without a model section share its slots: L1 holds 8, each prompt takes 4, so every store
 * evicts the other engine's older blocks; whatever is matched loads byte-exact into the
 * engine's own layout, and neither engine ever matches the other's blocks. */
Test(no_model, engines_of_two_geometries_share_the_slots_under_eviction)
{
	struct ct_opts o = {.no_model = true, .l1_slots = 8, .max_workers = 3};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *a, *b;
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	cr_assert_eq(open_rank(0, 8, "e2", "org/b", &b), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(env.slots->slot_bytes, 4096);
	uint8_t ma = kvr_ctl_worker(env.ctl, a->worker)->model, mb = kvr_ctl_worker(env.ctl, b->worker)->model;
	cr_assert(ma && mb && ma != mb, "models %u and %u", ma, mb);

	for (unsigned p = 0; p < 5; p++) {
		ct_prompt(tokens[p], BLOCKS * BT, 400 + p);
		store_tagged(a, p, 0, 10 + p);
		store_tagged(b, p, 100, 20 + p); /* the same tokens: other keys in org/b's namespace */
		/* the two latest prompts fill L1: both load byte-exact, each in its own geometry */
		cr_assert_eq(ct_lookup_load_exact(a, 30 + p, tokens[p], BLOCKS * BT, 8, TAG(p, 0)), BLOCKS, "a, prompt %u", p);
		cr_assert_eq(ct_lookup_load_exact(b, 40 + p, tokens[p], BLOCKS * BT, 8, TAG(p + 100, 0)), BLOCKS,
			     "b, prompt %u", p);
		cr_assert_eq(slots_of_model(ma), BLOCKS);
		cr_assert_eq(slots_of_model(mb), BLOCKS);
	}
	cr_assert_geq(ct_stat(&env, "lookup", KVR_STAT_LK_EVICTED), 4 * 2 * BLOCKS, "each store evicted the other's");
	cr_assert_eq(ct_lookup(a, 50, tokens[0], BLOCKS * BT), 0, "prompt 0 was evicted");
	struct kvr_model_ent *me = kvr_ctl_model(env.ctl, ma);
	cr_assert_str_eq(me->name, "org/a");
	cr_assert_eq(atomic_load(&me->stored), 5 * BLOCKS);
	ct_close_all();
	ct_assert_table_clean(&env);
}

/* What must agree with the slots: a lane that does not fit them is refused naming the key
 * (another block size or TP size is served: below). */
Test(no_model, what_does_not_fit_the_slots_is_refused_naming_it)
{
	struct ct_opts o = {.no_model = true, .max_workers = 3};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *a, *r;
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);

	cr_assert_eq(open_rank(0, 32, "e2", "org/b", &r), -EINVAL);
	const char *why = kvr_last_error(NULL);
	cr_assert(strstr(why, "a block lane of 8192 bytes does not fit this instance's slots of 4096: set "
			      "$.l1.slot_bytes to the largest model's lane"),
		  "%s", why);

	cr_assert_eq(kvr_ctl_worker(env.ctl, a->worker)->state, KVR_WORKER_ATTACHED);
}

#define BT2 32 /* the second engine's block size */

/* The block size recorded in every L2 file under dir (its header): how many say 16, 32, other. */
static void l2_block_sizes(const char *dir, unsigned *n16, unsigned *n32, unsigned *other)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "find '%s' -name '*.kvb'", dir);
	FILE *p = popen(cmd, "r");
	cr_assert(p);
	char path[1024];
	*n16 = *n32 = *other = 0;
	while (fgets(path, sizeof(path), p)) {
		path[strcspn(path, "\n")] = 0;
		struct kvr_l2_hdr h;
		int fd = open(path, O_RDONLY);
		cr_assert_geq(fd, 0, "%s", path);
		cr_assert_eq(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
		close(fd);
		cr_assert_eq(h.magic, KVR_L2_MAGIC, "%s", path);
		*n16 += h.block_tokens == BT;
		*n32 += h.block_tokens == BT2;
		*other += h.block_tokens != BT && h.block_tokens != BT2;
	}
	pclose(p);
}

/* Committed slots holding blocks of n tokens. */
static unsigned slots_of_block_size(uint32_t n)
{
	unsigned c = 0;
	for (uint32_t i = 0; i < env.slots->n_slots; i++)
		c += kvr_slot_state(env.slots, i) == KVR_SLOT_COMMITTED && kvr_slot_at(env.slots, i)->block_tokens == n;
	return c;
}

/* Store n_blocks blocks of prompt `tok` (n_tokens) on rank r from engine blocks 0.. with tags tag0 + i. */
static void store_blocks(struct ct_rank *r, uint64_t req, const uint32_t *tok, size_t n_tokens, uint64_t tag0)
{
	uint32_t blocks[BLOCKS];
	for (uint32_t i = 0; i < BLOCKS; i++) {
		blocks[i] = i;
		ct_fill(r, i, tag0 + i);
	}
	struct ct_done d;
	ct_store(r, req, tok, n_tokens, blocks, BLOCKS, &d);
	cr_assert_eq(d.c.status, 0, "store %llu: %d", (unsigned long long)req, d.c.status);
	cr_assert_eq(d.c.n_stored, BLOCKS);
}

/*
 * Engines of 16- and 32-token blocks at the same time on one instance started from {}:
 * each computes its keys with its own block size (attach says it), each slot and each L2
 * file records the block size of its engine, a scheduler of the second engine matches in
 * its block size, both load byte-exact; after a restart, with the 32-token engine attaching
 * first this time, both are served from the adopted L2 files.
 */
Test(no_model, engines_of_two_block_sizes_are_served_at_once_from_l1_and_l2)
{
	struct ct_opts o = {.no_model = true, .l1_slots = 16, .l2_dir = l2dir, .max_workers = 3};
	static uint32_t tb[2][BLOCKS * BT2];
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *a, *b;
	struct ct_model keep = env.m, m32 = ct_tiny;
	m32.block_tokens = BT2; /* with head_dim 8: the same 4 KiB lane as ct_tiny's */
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	cr_assert_eq(env.slots->block_tokens, 0, "a table of several block sizes");
	env.m = m32;
	int rc = open_rank(0, 8, "e2", "org/b", &b);
	env.m = keep;
	cr_assert_eq(rc, 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(kvr_block_tokens(a->c), BT);
	cr_assert_eq(kvr_block_tokens(b->c), BT2);
	cr_assert_eq(kvr_ctl_worker(env.ctl, b->worker)->block_tokens, BT2);

	for (unsigned p = 0; p < 2; p++) {
		ct_prompt(tokens[p], BLOCKS * BT, 800 + p);
		ct_prompt(tb[p], BLOCKS * BT2, 900 + p);
		store_blocks(a, 10 + p, tokens[p], BLOCKS * BT, TAG(p, 0));
		store_blocks(b, 20 + p, tb[p], BLOCKS * BT2, TAG(p + 100, 0));
	}
	cr_assert_eq(slots_of_block_size(BT), 2 * BLOCKS);
	cr_assert_eq(slots_of_block_size(BT2), 2 * BLOCKS);
	for (unsigned p = 0; p < 2; p++) {
		cr_assert_eq(ct_lookup_load_exact(a, 30 + p, tokens[p], BLOCKS * BT, 8, TAG(p, 0)), BLOCKS, "a %u", p);
		cr_assert_eq(ct_lookup_load_exact(b, 40 + p, tb[p], BLOCKS * BT2, 8, TAG(p + 100, 0)), BLOCKS, "b %u", p);
	}
	/* 32 tokens of b's prompt are one block of b's, two of a's: never each other's keys */
	cr_assert_eq(ct_lookup(a, 50, tb[0], BLOCKS * BT), 0);
	cr_assert_eq(ct_lookup(b, 51, tokens[0], BLOCKS * BT), 0);

	struct kvr_client *sc;
	struct kvr_sched_opts so = {.socket = env.h.sock, .engine_id = "e2", .model_ns = "org/b", .timeout_ms = 5000};
	cr_assert_eq(kvr_attach_scheduler(&so, &sc), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(kvr_block_tokens(sc), BT2, "a scheduler computes keys in its engine's block size");
	struct kvr_lookup_result lr;
	cr_assert_eq(kvr_lease(sc, 7, tb[1], BLOCKS * BT2, NULL, 0, NULL, &lr), 0, "%s", kvr_last_error(sc));
	cr_assert_eq(lr.matched_blocks, BLOCKS);
	cr_assert_eq(lr.matched_tokens, BLOCKS * BT2);
	cr_assert_eq(kvr_lease_release(sc, 7), 0);
	kvr_detach(sc);
	/* tokens counted in each engine's own block size */
	uint8_t ma = kvr_ctl_worker(env.ctl, a->worker)->model, mb = kvr_ctl_worker(env.ctl, b->worker)->model;
	struct kvr_model_ent *ea = kvr_ctl_model(env.ctl, ma), *eb = kvr_ctl_model(env.ctl, mb);
	cr_assert_eq(atomic_load(&ea->tokens_asked), atomic_load(&ea->keys) * BT);
	cr_assert_eq(atomic_load(&eb->tokens_asked), atomic_load(&eb->keys) * BT2);
	cr_assert_eq(atomic_load(&eb->tokens_matched), atomic_load(&eb->matched) * BT2);

	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == 4 * BLOCKS, 5000), "%llu L2 writes",
		  (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES));
	unsigned n16, n32, other;
	l2_block_sizes(l2dir, &n16, &n32, &other);
	cr_assert(n16 == 2 * BLOCKS && n32 == 2 * BLOCKS && other == 0, "L2 files: %u of 16 tokens, %u of 32, %u other",
		  n16, n32, other);

	ct_stop_clean(&env);

	ct_start(&env, &ct_tiny, &o);
	env.m = m32;
	rc = open_rank(0, 8, "e2", "org/b", &b);
	env.m = keep;
	cr_assert_eq(rc, 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL));
	for (unsigned p = 0; p < 2; p++) {
		cr_assert_eq(ct_lookup_load_exact(b, 60 + p, tb[p], BLOCKS * BT2, 8, TAG(p + 100, 0)), BLOCKS,
			     "b %u from the adopted L2", p);
		cr_assert_eq(ct_lookup_load_exact(a, 70 + p, tokens[p], BLOCKS * BT, 8, TAG(p, 0)), BLOCKS,
			     "a %u from the adopted L2", p);
	}
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), 4 * BLOCKS);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0);
	cr_assert_eq(slots_of_block_size(BT), 2 * BLOCKS, "promoted slots carry their requester's block size");
	cr_assert_eq(slots_of_block_size(BT2), 2 * BLOCKS);
	ct_close_all();
	ct_assert_table_clean(&env);
}

Test(no_model, slot_bytes_makes_room_for_a_larger_model)
{
	struct ct_opts o = {.no_model = true, .max_workers = 3, .l1_extra = ", \"slot_bytes\": \"8KiB\""};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *a, *b;
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(open_rank(0, 32, "e2", "org/b", &b), 0, "%s", kvr_last_error(NULL));
	int fd = h_daemon_memfd(env.h.pid, "kvring-slots", O_RDONLY);
	cr_assert_eq(kvr_segment_map(fd, KVR_SEG_SLOTS, 0, &env.slots_seg), 0);
	close(fd);
	cr_assert_eq(kvr_slots_attach(&env.slots_seg, &env.slots), 0);
	cr_assert_eq(env.slots->slot_bytes, 8192);
	ct_prompt(tokens[0], BLOCKS * BT, 500);
	store_tagged(a, 0, 0, 1);
	store_tagged(b, 0, 100, 2);
	cr_assert_eq(ct_lookup_load_exact(a, 3, tokens[0], BLOCKS * BT, 8, TAG(0, 0)), BLOCKS);
	cr_assert_eq(ct_lookup_load_exact(b, 4, tokens[0], BLOCKS * BT, 8, TAG(100, 0)), BLOCKS);
	ct_close_all();
	ct_assert_table_clean(&env);
}

/* A scheduler takes its engine's geometry from one of its workers: before one attached it
 * is refused (EAGAIN); after, it leases its engine's blocks and only those. */
Test(no_model, a_scheduler_takes_its_engines_geometry)
{
	struct ct_opts o = {.no_model = true, .max_workers = 3};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *a, *b;
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	struct kvr_client *sc;
	struct kvr_sched_opts so = {.socket = env.h.sock, .engine_id = "e2", .model_ns = "org/b", .timeout_ms = 5000};
	cr_assert_eq(kvr_attach_scheduler(&so, &sc), -EAGAIN);
	cr_assert(strstr(kvr_last_error(NULL), "no worker of engine \"e2\" has attached yet"), "%s",
		  kvr_last_error(NULL));
	cr_assert_eq(open_rank(0, 8, "e2", "org/b", &b), 0, "%s", kvr_last_error(NULL));
	ct_prompt(tokens[0], BLOCKS * BT, 600);
	store_tagged(a, 0, 0, 1);
	store_tagged(b, 0, 100, 2);
	ct_prompt(tokens[1], BLOCKS * BT, 601);
	store_tagged(a, 1, 0, 3);
	cr_assert_eq(kvr_attach_scheduler(&so, &sc), 0, "%s", kvr_last_error(NULL));
	struct kvr_lookup_result lr;
	cr_assert_eq(kvr_lease(sc, 7, tokens[0], BLOCKS * BT, NULL, 0, NULL, &lr), 0, "%s", kvr_last_error(sc));
	cr_assert_eq(lr.matched_blocks, BLOCKS, "engine e2's own prompt");
	cr_assert_eq(kvr_lease(sc, 8, tokens[1], BLOCKS * BT, NULL, 0, NULL, &lr), 0);
	cr_assert_eq(lr.matched_blocks, 0, "engine e1's prompt must not match for e2");
	cr_assert_eq(kvr_lease_release(sc, 7), 0);
	kvr_detach(sc);
	ct_close_all();
	ct_assert_table_clean(&env);
}

/* A first worker whose block cannot fit is refused naming the key and the sizes, and leaves
 * nothing laid out: a worker that fits binds afterwards. */
Test(no_model, a_block_that_does_not_fit_is_refused_naming_the_key)
{
	/* L1 of one 4 KiB slot: a head_dim-64 lane is 16 KiB */
	struct ct_opts o = {.no_model = true, .l1_slots = 1, .max_workers = 2};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(open_rank(0, 64, "e1", "org/a", &r), -EINVAL);
	const char *why = kvr_last_error(NULL);
	cr_assert(strstr(why, "$.l1.capacity_bytes: 8192 bytes hold 0 slots of 16384 bytes, one block needs 1"), "%s",
		  why);
	cr_assert_eq(env.ctl->arena_bytes, 0);

	/* the staging pools (64 lanes of 4 KiB, half for loads) cannot hold a head_dim-1024 block */
	cr_assert_eq(open_rank(0, 1024, "e1", "org/a", &r), -EINVAL);
	why = kvr_last_error(NULL);
	cr_assert(strstr(why, "$.staging.ceiling_bytes: the load pool (131072 bytes) cannot hold one block (262144 "
			      "bytes)"),
		  "%s", why);
	cr_assert_eq(env.ctl->arena_bytes, 0);

	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &r), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	/* one block: what an L1 of one slot holds */
	ct_prompt(tokens[1], BT, 301);
	ct_fill(r, 0, TAG(1, 0));
	struct ct_done d;
	uint32_t blk = 0;
	ct_store(r, 2, tokens[1], BT, &blk, 1, &d);
	cr_assert_eq(d.c.status, 0, "store: %d", d.c.status);
	cr_assert_eq(ct_lookup_load_exact(r, 3, tokens[1], BT, 8, TAG(1, 0)), 1);
	ct_assert_table_clean(&env);
}

/* With L2 on: stored, kvringd stopped and started again (no model again), the first worker
 * binds the same geometry and every block comes back from the adopted files, byte-exact. */
Test(no_model, l2_is_adopted_once_bound_again_after_a_restart)
{
	struct ct_opts o = {.no_model = true, .l1_slots = 4, .l2_dir = l2dir, .max_workers = 2};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &r), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	for (unsigned p = 0; p < 3; p++) {
		store_prompt(r, p);
		cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == (p + 1) * BLOCKS, 5000));
	}
	cr_assert_eq(h_count_files(l2dir, ".kvb"), 3 * BLOCKS);
	/* each model's lanes on disk, in its entry of the model table (published every tick) */
	struct kvr_model_ent *ma = kvr_ctl_model(env.ctl, kvr_ctl_worker(env.ctl, r->worker)->model);
	cr_assert(H_WAIT(atomic_load(&ma->l2_lanes) == 3 * BLOCKS, 3000), "org/a: %llu lanes on disk",
		  (unsigned long long)atomic_load(&ma->l2_lanes));
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_UNATTRIBUTED), 0);

	ct_stop_clean(&env);

	ct_start(&env, &ct_tiny, &o);
	cr_assert_eq(env.ctl->arena_bytes, 0);
	cr_assert_eq(h_count_files(l2dir, ".kvb"), 3 * BLOCKS, "nothing adopted or removed before a geometry is known");
	/* a worker of another geometry binds first this time: the slots (4 KiB) and so the L2
	 * namespace are the same, and its engine shares the instance with the first one's */
	struct ct_rank *b;
	cr_assert_eq(open_rank(0, 8, "e2", "org/b", &b), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &r), 0, "%s", kvr_last_error(NULL));
	/* the adopted files say nothing of their model: unattributed until promoted */
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_UNATTRIBUTED) == 3 * BLOCKS, 3000),
		  "%llu lanes unattributed", (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_UNATTRIBUTED));
	ma = kvr_ctl_model(env.ctl, kvr_ctl_worker(env.ctl, r->worker)->model);
	struct kvr_model_ent *mb = kvr_ctl_model(env.ctl, kvr_ctl_worker(env.ctl, b->worker)->model);
	cr_assert_eq(atomic_load(&ma->l2_lanes), 0);
	for (unsigned p = 0; p < 3; p++)
		cr_assert_eq(ct_lookup_load_exact(r, 90 + p, tokens[p], BLOCKS * BT, 8, TAG(p, 0)), BLOCKS,
			     "prompt %u from the adopted L2", p);
	cr_assert_eq(ct_lookup(b, 95, tokens[0], BLOCKS * BT), 0, "org/b must not match org/a's files");
	uint64_t reads = ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS);
	cr_assert_geq(reads, 3 * BLOCKS - 4);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0);
	/* every promoted lane is org/a's now (its requester's model), the rest still unattributed */
	cr_assert(H_WAIT(atomic_load(&ma->l2_lanes) == reads, 3000), "org/a: %llu lanes on disk after %llu promotions",
		  (unsigned long long)atomic_load(&ma->l2_lanes), (unsigned long long)reads);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_UNATTRIBUTED), 3 * BLOCKS - reads);
	cr_assert_eq(atomic_load(&mb->l2_lanes), 0, "org/b stored nothing");
	ct_close_all();
	ct_assert_table_clean(&env);
}

/* Every worker slot FREE (a detached worker's slot goes FREE once the lookup actor let it go). */
static bool all_workers_free(void)
{
	for (unsigned w = 0; w < env.ctl->max_workers; w++)
		if (atomic_load(&kvr_ctl_worker(env.ctl, w)->state) != KVR_WORKER_FREE)
			return false;
	return true;
}

/* Open rank `rank` of engine `engine` with the geometry of m, attaching again while kvringd
 * answers -EAGAIN (L1 being laid out again); the last result. */
static int open_rank_of(const struct ct_model *m, unsigned rank, const char *engine, const char *model_ns,
			struct ct_rank **r, unsigned *eagains)
{
	struct ct_model keep = env.m;
	env.m = *m;
	int rc;
	uint64_t end = kvr_now_ns() + 10000000000ull;
	while ((rc = open_rank(rank, 0, engine, model_ns, r)) == -EAGAIN && kvr_now_ns() < end) {
		cr_assert(strstr(kvr_last_error(NULL), "L1 is being laid out again"), "%s", kvr_last_error(NULL));
		++*eagains;
		usleep(20000);
	}
	env.m = keep;
	return rc;
}

/*
 * Engines of TP 1 and TP 2 at once (no model section: each block has its own lanes, its
 * slots say how many): the TP-2 engine's block is visible only once both its ranks stored
 * it, its scheduler leases both lanes; both are served byte-exact from L1, and after a
 * restart (the TP-2 engine binding first this time) from the L2 files of both.
 */
Test(no_model, engines_of_two_tp_sizes_share_the_slots_at_once)
{
	struct ct_opts o = {.no_model = true, .l1_slots = 16, .l2_dir = l2dir, .max_workers = 3};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *a, *b0, *b1;
	unsigned eagains = 0;
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	cr_assert_eq(env.slots->quorum, 0, "a table of several quorums");
	cr_assert_eq(open_rank_of(&ct_tiny_tp2, 0, "e2", "org/b", &b0, &eagains), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(open_rank_of(&ct_tiny_tp2, 1, "e2", "org/b", &b1, &eagains), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(eagains, 0, "served beside e1, not laid out again");
	cr_assert_eq(kvr_ctl_worker(env.ctl, a->worker)->lanes, 1);
	cr_assert_eq(kvr_ctl_worker(env.ctl, b1->worker)->lanes, 2);

	store_prompt(a, 0);
	cr_assert_eq(ct_lookup_load_exact(a, 10, tokens[0], BLOCKS * BT, 8, TAG(0, 0)), BLOCKS);
	ct_prompt(tokens[1], BLOCKS * BT, 301);
	store_tagged(b0, 1, 50, 60);
	cr_assert_eq(ct_lookup(b0, 61, tokens[1], BLOCKS * BT), 0, "one lane of two: not visible");
	store_tagged(b1, 1, 51, 62);
	struct ct_rank *bs[2] = {b0, b1};
	for (unsigned k = 0; k < 2; k++)
		cr_assert_eq(ct_lookup_load_exact(bs[k], 70 + k, tokens[1], BLOCKS * BT, 8, TAG(1 + 50 + k, 0)), BLOCKS,
			     "e2 rank %u", k);
	cr_assert_eq(ct_lookup(a, 72, tokens[1], BLOCKS * BT), 0, "e1 never matches e2's blocks");
	struct kvr_client *sc;
	struct kvr_sched_opts so = {.socket = env.h.sock, .engine_id = "e2", .model_ns = "org/b", .timeout_ms = 5000};
	cr_assert_eq(kvr_attach_scheduler(&so, &sc), 0, "%s", kvr_last_error(NULL));
	struct kvr_lookup_result lr;
	cr_assert_eq(kvr_lease(sc, 7, tokens[1], BLOCKS * BT, NULL, 0, NULL, &lr), 0, "%s", kvr_last_error(sc));
	cr_assert_eq(lr.matched_blocks, BLOCKS, "a lease over both lanes of e2's blocks");
	cr_assert_eq(kvr_lease_release(sc, 7), 0);
	kvr_detach(sc);
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == 3 * BLOCKS, 5000), "%llu L2 writes",
		  (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES));

	ct_stop_clean(&env);
	ct_start(&env, &ct_tiny, &o);
	cr_assert_eq(open_rank_of(&ct_tiny_tp2, 0, "e2", "org/b", &b0, &eagains), 0, "%s", kvr_last_error(NULL));
	ct_map_l1(&env);
	cr_assert_eq(open_rank_of(&ct_tiny_tp2, 1, "e2", "org/b", &b1, &eagains), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(open_rank(0, 0, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL));
	bs[0] = b0;
	bs[1] = b1;
	for (unsigned k = 0; k < 2; k++)
		cr_assert_eq(ct_lookup_load_exact(bs[k], 80 + k, tokens[1], BLOCKS * BT, 8, TAG(1 + 50 + k, 0)), BLOCKS,
			     "e2 rank %u from L2", k);
	cr_assert_eq(ct_lookup_load_exact(a, 82, tokens[0], BLOCKS * BT, 8, TAG(0, 0)), BLOCKS, "e1 from L2");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), 3 * BLOCKS);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0);
	unsigned two = 0;
	for (uint32_t i = 0; i < env.slots->n_slots; i++)
		two += kvr_slot_state(env.slots, i) == KVR_SLOT_COMMITTED && kvr_slot_at(env.slots, i)->lanes == 2;
	cr_assert_eq(two, 2 * BLOCKS, "e2's promoted slots say 2 lanes");
	ct_close_all();
	ct_assert_table_clean(&env);
}

/* Open rank 0 of engine `engine` (head_dim hd), attaching again while kvringd answers
 * -EAGAIN (L1 being laid out again); asserts it attached, returns the -EAGAIN count. */
static unsigned open_retry(uint32_t hd, const char *engine, const char *model_ns, struct ct_rank **r)
{
	int rc;
	unsigned eagains = 0;
	uint64_t end = kvr_now_ns() + 10000000000ull;
	while ((rc = open_rank(0, hd, engine, model_ns, r)) == -EAGAIN && kvr_now_ns() < end) {
		cr_assert(strstr(kvr_last_error(NULL), "L1 is being laid out again"), "%s", kvr_last_error(NULL));
		eagains++;
		usleep(20000);
	}
	cr_assert_eq(rc, 0, "%s", kvr_last_error(NULL));
	return eagains;
}

/* Every client gone: drop our mappings of the slot table and arena kvringd is about to give up. */
static void all_gone(void)
{
	ct_close_all();
	cr_assert(H_WAIT(all_workers_free(), 5000), "the worker slots never went FREE");
	kvr_segment_close(&env.slots_seg);
	kvr_segment_close(&env.arena_seg);
	env.slots = NULL;
}

/*
 * Without l1.slot_bytes the slots are the first worker's lane. A smaller lane shares them
 * while an engine is attached (4 KiB lanes in 8 KiB slots); once nothing is attached, a
 * worker whose lane rounds to another slot size lays L1 out again for itself, as a restart
 * would (its first attach -EAGAIN), rather than being kept in slots of the old size. Each
 * slot size keeps its L2 files in its own directory: the 8 KiB engine, back last, is served
 * its prompt from the files it left.
 */
Test(no_model, a_smaller_lane_shares_the_slots_and_lays_them_out_again_when_idle)
{
	struct ct_opts o = {.no_model = true, .l1_slots = 8, .l2_dir = l2dir, .max_workers = 3};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *a, *b;
	cr_assert_eq(open_rank(0, 32, "e1", "org/a", &a), 0, "%s", kvr_last_error(NULL)); /* 8 KiB lanes */
	uint64_t lane0 = env.lane_bytes;
	uint32_t n0 = env.n_slots;
	env.lane_bytes = 2 * lane0; /* what ct_map_l1 expects: the L1 of 8 x 4 KiB in 8 KiB slots */
	env.n_slots = n0 / 2;
	ct_map_l1(&env);
	cr_assert_eq(env.slots->slot_bytes, 8192);
	ct_prompt(tokens[2], BLOCKS * BT, 302);
	store_tagged(a, 2, 0, 5);
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == BLOCKS, 5000));
	cr_assert_eq(open_rank(0, 16, "e2", "org/b", &b), 0, "%s", kvr_last_error(NULL)); /* 4 KiB */
	store_prompt(b, 0);
	cr_assert_eq(ct_lookup_load_exact(b, 10, tokens[0], BLOCKS * BT, 8, TAG(0, 0)), BLOCKS);
	all_gone();

	cr_assert_geq(open_retry(16, "e2", "org/b", &b), 1, "laid out again: the first attach was answered -EAGAIN");
	env.lane_bytes = lane0;
	env.n_slots = n0;
	ct_map_l1(&env);
	cr_assert_eq(env.slots->slot_bytes, 4096, "slots of e2's own lane now");
	/* the 8 KiB format's directory stays, and the new disk actor says so */
	cr_assert(H_WAIT(h_log_contains(&env.h, "1 other namespace directory beside this instance's"), 3000), "%s",
		  h_read_file(env.h.log));
	store_prompt(b, 1);
	cr_assert_eq(ct_lookup_load_exact(b, 11, tokens[1], BLOCKS * BT, 8, TAG(1, 0)), BLOCKS);
	all_gone();

	cr_assert_geq(open_retry(32, "e1", "org/a", &a), 1, "e1's slot size once more");
	env.lane_bytes = 2 * lane0;
	env.n_slots = n0 / 2;
	ct_map_l1(&env);
	cr_assert_eq(ct_lookup_load_exact(a, 12, tokens[2], BLOCKS * BT, 8, TAG(2, 0)), BLOCKS,
		     "e1's prompt from its slot size's L2 directory");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), BLOCKS);
	ct_close_all();
	ct_assert_table_clean(&env);
}

Test(no_model, check_config_of_an_empty_object_says_so)
{
	h_write_config_raw(&env.h, "{}");
	const char *args[] = {"--check-config", env.h.cfg, NULL};
	int st = h_wait_exit(h_spawn_kvringd(&env.h, args), 3000);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	cr_assert(h_log_contains(&env.h, "\"preset\": \"\""));
	cr_assert(h_log_contains(&env.h, "kvringd: no model section: L1 (1073741824 bytes) is laid out for the geometry "
					 "of the first worker that attaches, and every engine must name its model"));

	/* with a model section, slots smaller than its block lane are a bad config */
	h_write_config_raw(&env.h, "{\"model\": {\"preset\": \"qwen3-8b\"}, \"l1\": {\"slot_bytes\": \"1MiB\"}}");
	cr_assert_eq(truncate(env.h.log, 0), 0);
	st = h_wait_exit(h_spawn_kvringd(&env.h, args), 3000);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status 0x%x", st);
	cr_assert(h_log_contains(&env.h, "kvringd: $.l1.slot_bytes: 1048576 is smaller than one block lane of the model "
					 "(18874368 bytes)"));
}
