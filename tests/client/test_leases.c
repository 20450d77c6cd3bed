/* Engines and lookup leases (issue 12): several engines on one instance, a scheduler that leases, workers that load exactly the lease. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"

/*
 * The real kvringd, lookup, loader, storer (and disk) actors with a ct_tiny model. A scheduler
 * client (kvr_attach_scheduler) leases a prefix; the engine's workers take the lease and
 * load it; the test checks the bytes, the lease counters and, at the end, that the slot
 * table is clean (only FREE and COMMITTED, no pins): a lease that ended left no pin.
 */

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
	ct_fini(&env);
}

TestSuite(leases, .init = setup, .fini = teardown, .timeout = 120);


#define BT 16
#define TAG(p, i) (5000ull * (p) + (i) + 1)

static uint64_t lk(unsigned s)
{
	return ct_stat(&env, "lookup", s);
}


static struct kvr_client *sched_open(const char *engine, const char *model_ns)
{
	struct kvr_sched_opts o = {.socket = env.h.sock, .engine_id = engine, .model_ns = model_ns, .timeout_ms = 5000};
	struct kvr_client *s = NULL;
	int rc = kvr_attach_scheduler(&o, &s);
	cr_assert_eq(rc, 0, "scheduler attach: %s", kvr_last_error(NULL));
	return s;
}

/* Store prompt p (n blocks) from rank r: engine blocks base.., tags TAG(p, i). */
static void store_prompt(struct ct_rank *r, unsigned p, const uint32_t *tokens, uint32_t n, uint32_t base)
{
	uint32_t blocks[64];
	for (uint32_t i = 0; i < n; i++) {
		blocks[i] = base + i;
		ct_fill(r, base + i, TAG(p, i));
	}
	struct ct_done d;
	ct_store(r, 100 + p, tokens, (size_t)n * BT, blocks, n, &d);
	cr_assert_eq(d.c.status, 0, "store of prompt %u: %d", p, d.c.status);
}

/* Take lease `id` on rank r and load its first n blocks into dst..; assert byte-exact. */
static void take_load_exact(struct ct_rank *r, uint64_t id, uint32_t n, uint32_t dst, unsigned p)
{
	struct kvr_lookup_result res;
	int rc = kvr_lease_take(r->c, id, &res);
	cr_assert_eq(rc, 0, "lease take: %s", kvr_last_error(r->c));
	cr_assert_eq(res.matched_blocks, n);
	uint32_t blocks[64];
	for (uint32_t i = 0; i < n; i++)
		blocks[i] = dst + i;
	struct ct_done d;
	ct_load(r, id, blocks, n, &d);
	cr_assert_eq(d.c.status, 0, "load of the lease: %d (%u failed)", d.c.status, d.c.n_failed);
	char why[160];
	for (uint32_t i = 0; i < n; i++)
		cr_assert(ct_holds(r, dst + i, TAG(p, i), why, sizeof(why)), "block %u: %s", i, why);
}

/* TP 2: the scheduler's lease pins both lanes; L1 pressure that evicts everything else
 * cannot take them; both ranks load exactly the leased bytes; the second LEASE_DONE ends it. */
Test(leases, pinned_through_pressure_then_loaded_by_every_rank)
{
	ct_start(&env, &ct_tiny_tp2, &(struct ct_opts){.l1_slots = 24});
	struct ct_rank *r0, *r1;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r0), 0);
	cr_assert_eq(ct_rank_open(&env, 1, 64, 0, &r1), 0);
	uint32_t a[4 * BT];
	ct_prompt(a, 4 * BT, 1);
	store_prompt(r0, 1, a, 4, 0);
	store_prompt(r1, 1, a, 4, 0);
	struct kvr_client *s = sched_open(NULL, NULL);
	cr_assert_eq(kvr_block_tokens(s), BT);

	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lease(s, 42, a, 4 * BT, NULL, 0, NULL, &res), 0, "%s", kvr_last_error(s));
	cr_assert_eq(res.matched_blocks, 4);
	cr_assert_eq(res.matched_tokens, 4 * BT);
	cr_assert_eq(lk(KVR_STAT_LK_LEASES), 1);
	cr_assert_eq(lk(KVR_STAT_LK_LEASES_GRANTED), 1);
	kvr_key keys[4];
	ct_keys(&env, a, 4 * BT, keys);
	for (unsigned i = 0; i < 4; i++)
		for (unsigned lane = 0; lane < 2; lane++) {
			int sl = ct_find_slot(&env, keys[i], lane);
			cr_assert(sl >= 0);
			cr_assert_eq(kvr_slot_pins_of(env.slots, (uint32_t)sl, KVR_PIN_LOOKUP), 1,
				     "block %u lane %u not pinned by the lease", i, lane);
		}

	/* 24 slots = 12 blocks of 2 lanes: 4 leased, then 3 x 4 more blocks evict the rest */
	for (unsigned p = 2; p < 5; p++) {
		uint32_t t[4 * BT];
		ct_prompt(t, 4 * BT, p);
		store_prompt(r0, p, t, 4, 8 + 4 * p);
		store_prompt(r1, p, t, 4, 8 + 4 * p);
	}
	cr_assert_gt(lk(KVR_STAT_LK_EVICTED), 0, "the workload must evict");
	for (unsigned i = 0; i < 4; i++)
		cr_assert(ct_find_slot(&env, keys[i], 0) >= 0 && ct_find_slot(&env, keys[i], 1) >= 0,
			  "leased block %u was evicted", i);

	take_load_exact(r0, 42, 4, 40, 1);
	cr_assert_eq(lk(KVR_STAT_LK_LEASES), 1, "one of two loaders done: the lease holds");
	take_load_exact(r1, 42, 4, 40, 1);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_LEASES_LOADED) == 1, 5000), "the lease did not end after both loads");
	cr_assert_eq(lk(KVR_STAT_LK_LEASES), 0);
	cr_assert_eq(lk(KVR_STAT_LK_LEASES_TAKEN), 2);
	ct_assert_table_clean(&env); /* no pin left after the lease ended */
	kvr_detach(s);
}

/* The scheduler releases (request finished), a ttl ends another, a replaced lease is
 * counted; taking a lease that ended is -ENOENT; a lease of nothing keeps nothing. */
Test(leases, released_expired_replaced_missing)
{
	ct_start(&env, &ct_tiny, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 32, 0, &r), 0);
	uint32_t a[3 * BT], none[3 * BT];
	ct_prompt(a, 3 * BT, 7);
	ct_prompt(none, 3 * BT, 8);
	store_prompt(r, 7, a, 3, 0);
	struct kvr_client *s = sched_open("default", NULL);
	struct kvr_lookup_result res;

	cr_assert_eq(kvr_lease(s, 1, a, 3 * BT, NULL, 0, NULL, &res), 0);
	cr_assert_eq(res.matched_blocks, 3);
	cr_assert_eq(kvr_lease(s, 1, a, 2 * BT + 5, NULL, 0, NULL, &res), 0); /* replaces it: 2 whole blocks */
	cr_assert_eq(res.matched_blocks, 2);
	cr_assert_eq(lk(KVR_STAT_LK_LEASES), 1);
	cr_assert_eq(kvr_lease_release(s, 1), 0);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_LEASES_RELEASED) == 1, 5000));
	cr_assert_eq(lk(KVR_STAT_LK_LEASES), 0);
	struct kvr_lookup_result tr;
	cr_assert_eq(kvr_lease_take(r->c, 1, &tr), -ENOENT);
	cr_assert(strstr(kvr_last_error(r->c), "no such lease"), "%s", kvr_last_error(r->c));
	cr_assert_eq(lk(KVR_STAT_LK_LEASES_MISSING), 1);
	cr_assert_eq(kvr_load(r->c, 1, (uint32_t[]){9}, 1), -ENOENT);

	struct kvr_lease_opts short_ttl = {.ttl_ms = 150};
	cr_assert_eq(kvr_lease(s, 2, a, 3 * BT, NULL, 0, &short_ttl, &res), 0);
	cr_assert_eq(res.matched_blocks, 3);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_LEASES_EXPIRED) == 1, 5000), "the ttl did not end the lease");
	cr_assert_eq(lk(KVR_STAT_LK_LEASES), 0);

	cr_assert_eq(kvr_lease(s, 3, none, 3 * BT, NULL, 0, NULL, &res), 0);
	cr_assert_eq(res.matched_blocks, 0);
	cr_assert_eq(lk(KVR_STAT_LK_LEASES), 0, "a lease of nothing is not kept");
	/* a scheduler client neither loads nor stores, a worker does not lease */
	cr_assert_eq(kvr_load(s, 3, (uint32_t[]){0}, 1), -EINVAL);
	cr_assert_eq(kvr_lease(r->c, 4, a, 3 * BT, NULL, 0, NULL, &res), -EINVAL);
	ct_assert_table_clean(&env);
	kvr_detach(s);
}

/* Two engines of one model share blocks; an engine of another model_ns shares none; a
 * lease is its engine's only; one worker per (engine, TP rank); bad identities refused. */
Test(leases, engines_share_one_model_and_isolate_others)
{
	ct_start(&env, &ct_tiny, &(struct ct_opts){.max_workers = 4});
	struct ct_rank *ea, *eb, *ec, *dup;
	cr_assert_eq(ct_rank_open_engine(&env, 0, 32, 0, "engine-a", NULL, &ea), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(ct_rank_open_engine(&env, 0, 32, 0, "engine-b", NULL, &eb), 0,
		     "a second engine's TP rank 0: %s", kvr_last_error(NULL));
	cr_assert_eq(ct_rank_open_engine(&env, 0, 32, 0, "engine-c", "another-model", &ec), 0, "%s",
		     kvr_last_error(NULL));
	cr_assert_eq(ct_rank_open_engine(&env, 0, 32, 0, "engine-a", NULL, &dup), -EEXIST);
	cr_assert(strstr(kvr_last_error(NULL), "engine \"engine-a\": TP rank 0"), "%s", kvr_last_error(NULL));

	uint32_t p[4 * BT];
	ct_prompt(p, 4 * BT, 11);
	store_prompt(ea, 11, p, 4, 0);
	cr_assert_eq(ct_lookup_load_exact(eb, 500, p, 4 * BT, 10, TAG(11, 0)), 4, "engine b does not share a's blocks");
	cr_assert_eq(ct_lookup(ec, 501, p, 4 * BT), 0, "another model namespace must share nothing");

	struct kvr_client *sa = sched_open("engine-a", NULL);
	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lease(sa, 77, p, 4 * BT, NULL, 0, NULL, &res), 0);
	cr_assert_eq(res.matched_blocks, 4);
	cr_assert_eq(kvr_lease_take(eb->c, 77, &res), -ENOENT, "a lease belongs to its engine");
	take_load_exact(ea, 77, 4, 20, 11);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_LEASES_LOADED) == 1, 5000));

	struct kvr_sched_opts bad = {.socket = env.h.sock, .engine_id = "engine-a", .model_ns = "other", .timeout_ms = 2000};
	struct kvr_client *x = NULL;
	cr_assert_eq(kvr_attach_scheduler(&bad, &x), -EINVAL);
	cr_assert(strstr(kvr_last_error(NULL), "engine \"engine-a\" is attached with model_ns"), "%s",
		  kvr_last_error(NULL));
	bad = (struct kvr_sched_opts){.socket = env.h.sock, .engine_id = "bad id!", .timeout_ms = 2000};
	cr_assert_eq(kvr_attach_scheduler(&bad, &x), -EINVAL);
	cr_assert(strstr(kvr_last_error(NULL), "engine_id: byte 3"), "%s", kvr_last_error(NULL));
	char nosock[300];
	snprintf(nosock, sizeof(nosock), "%s/none.sock", env.h.dir);
	bad = (struct kvr_sched_opts){.socket = nosock, .timeout_ms = 2000};
	cr_assert_lt(kvr_attach_scheduler(&bad, &x), 0);
	cr_assert(strstr(kvr_last_error(NULL), nosock), "%s", kvr_last_error(NULL));
	kvr_detach(sa);
	ct_assert_table_clean(&env);
}

/* With L2, a lease after a restart promotes from disk first (every lane), then loads
 * byte-exact from the leased slots. */
Test(leases, lease_promotes_from_l2_after_restart)
{
	struct ct_opts o = {.l1_slots = 32, .l2_dir = l2dir, .max_workers = 2};
	ct_start(&env, &ct_tiny_tp2, &o);
	struct ct_rank *r0, *r1;
	cr_assert_eq(ct_rank_open(&env, 0, 32, 0, &r0), 0);
	cr_assert_eq(ct_rank_open(&env, 1, 32, 0, &r1), 0);
	uint32_t a[3 * BT];
	ct_prompt(a, 3 * BT, 21);
	store_prompt(r0, 21, a, 3, 0);
	store_prompt(r1, 21, a, 3, 0);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == 6, 10000), "write-through of 3 blocks x 2 lanes");
	ct_stop_clean(&env);
	ct_start(&env, &ct_tiny_tp2, &o);
	cr_assert_eq(ct_rank_open(&env, 0, 32, 0, &r0), 0);
	cr_assert_eq(ct_rank_open(&env, 1, 32, 0, &r1), 0);
	struct kvr_client *s = sched_open(NULL, NULL);
	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lease(s, 9, a, 3 * BT, NULL, 0, NULL, &res), 0, "%s", kvr_last_error(s));
	cr_assert_eq(res.matched_blocks, 3, "after the restart the lease comes from L2");
	cr_assert_eq(res.l2_blocks, 3);
	cr_assert_eq(lk(KVR_STAT_LK_L2_READS), 6, "both lanes promoted");
	take_load_exact(r0, 9, 3, 10, 21);
	take_load_exact(r1, 9, 3, 10, 21);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_LEASES_LOADED) == 1, 5000));
	ct_assert_table_clean(&env);
	kvr_detach(s);
}

static uint32_t slots_writing(void)
{
	struct kvr_slot_counts n;
	kvr_slots_counts(env.slots, &n);
	return n.by_state[KVR_SLOT_WRITING];
}

/*
 * Prefill/decode on one node (issue 25): a store in flight — its slots allocated and
 * WRITING, its copy held by the storer's test hold (KVRING_TEST_STORE_HOLD) — is reported
 * to a lease as pending blocks, never matched: nothing uncommitted is leased. Once the
 * copy runs and commits, the same lease matches every block and loads them byte-exact. A
 * store whose worker detaches while it is held is never committed: pending drops to 0 and
 * the table ends quiet.
 */
Test(leases, a_store_in_flight_is_pending_never_matched)
{
	char hold[300];
	snprintf(hold, sizeof(hold), "%s/store-hold", env.h.dir);
	FILE *f = fopen(hold, "w");
	cr_assert_not_null(f);
	fclose(f);
	cr_assert_eq(setenv("KVRING_TEST_STORE_HOLD", hold, 1), 0); /* kvringd and its storers inherit it */
	ct_start(&env, &ct_tiny, &(struct ct_opts){.l1_slots = 32});
	(void)unsetenv("KVRING_TEST_STORE_HOLD");
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r), 0);
	struct kvr_client *s = sched_open(NULL, NULL);

	uint32_t a[4 * BT], blocks[4] = {0, 1, 2, 3};
	ct_prompt(a, 4 * BT, 61);
	for (uint32_t i = 0; i < 4; i++)
		ct_fill(r, i, TAG(61, i));
	cr_assert_eq(kvr_store(r->c, 161, a, 4 * BT, NULL, 0, blocks, 4), 0, "%s", kvr_last_error(r->c));
	cr_assert(H_WAIT(slots_writing() == 4, 5000), "the store's 4 slots allocated: %u WRITING", slots_writing());

	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lease(s, 1, a, 4 * BT, NULL, 0, NULL, &res), 0, "%s", kvr_last_error(s));
	cr_assert_eq(res.matched_blocks, 0, "nothing uncommitted is leased");
	cr_assert_eq(res.pending_blocks, 4, "the store's blocks are pending");
	cr_assert_eq(res.miss_reason, KVR_MISS_IN_FLIGHT, "miss: %s", kvr_miss_reason_name(res.miss_reason));
	/* a prompt sharing A's first 2 blocks: only those 2 are pending, the rest unknown */
	uint32_t b[4 * BT];
	memcpy(b, a, sizeof(uint32_t) * 2 * BT);
	ct_prompt(b + 2 * BT, 2 * BT, 62);
	cr_assert_eq(kvr_lease(s, 2, b, 4 * BT, NULL, 0, NULL, &res), 0);
	cr_assert_eq(res.matched_blocks, 0);
	cr_assert_eq(res.pending_blocks, 2);

	cr_assert_eq(unlink(hold), 0); /* the copy runs */
	struct ct_done d;
	ct_wait_done(r, &d, 5000);
	cr_assert_eq(d.c.req_id, 161);
	cr_assert_eq(d.c.status, 0, "store: %d", d.c.status);
	cr_assert_eq(d.c.n_stored, 4);
	cr_assert_eq(kvr_lease(s, 1, a, 4 * BT, NULL, 0, &(struct kvr_lease_opts){.loaders = 1}, &res), 0);
	cr_assert_eq(res.matched_blocks, 4, "committed: every block leased");
	cr_assert_eq(res.pending_blocks, 0);
	cr_assert_eq(res.miss_reason, KVR_MISS_NONE);
	take_load_exact(r, 1, 4, 20, 61);
	cr_assert_eq(kvr_lease_release(s, 2), 0);

	/* held again; the worker detaches with its store in flight */
	f = fopen(hold, "w");
	cr_assert_not_null(f);
	fclose(f);
	uint32_t c[4 * BT];
	ct_prompt(c, 4 * BT, 63);
	cr_assert_eq(kvr_store(r->c, 163, c, 4 * BT, NULL, 0, blocks, 4), 0);
	cr_assert(H_WAIT(slots_writing() == 4, 5000));
	cr_assert_eq(kvr_lease(s, 3, c, 4 * BT, NULL, 0, NULL, &res), 0);
	cr_assert_eq(res.pending_blocks, 4);
	ct_rank_close(r);
	cr_assert(H_WAIT(slots_writing() == 0, 5000), "the detached worker's store left %u WRITING", slots_writing());
	cr_assert_eq(kvr_lease(s, 3, c, 4 * BT, NULL, 0, NULL, &res), 0);
	cr_assert_eq(res.matched_blocks, 0, "never committed");
	cr_assert_eq(res.pending_blocks, 0, "nothing in flight any more: the decode recomputes");
	cr_assert_eq(res.miss_reason, KVR_MISS_NEVER_STORED, "an aborted store left no trace: %s",
		     kvr_miss_reason_name(res.miss_reason));
	/* every block a lease did not match is counted under the first one's reason: 4 + 4 (the
	 * shared-prefix prompt's first block was in flight) + 4 */
	cr_assert_eq(lk(KVR_STAT_LK_MISS_FIRST + KVR_MISS_IN_FLIGHT - 1), 12, "blocks missed in flight");
	(void)unlink(hold);
	ct_assert_table_clean(&env);
	kvr_detach(s);
}

/* ---- a reason for every miss (issue 25): each caused for real ------------------------------ */

static unsigned lease_miss(struct kvr_client *s, uint64_t id, const uint32_t *t, uint32_t n, uint32_t *matched)
{
	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lease(s, id, t, (size_t)n * BT, NULL, 0, &(struct kvr_lease_opts){.loaders = 1}, &res), 0,
		     "%s", kvr_last_error(s));
	if (matched)
		*matched = res.matched_blocks;
	return res.miss_reason;
}

#define MISSED(r) lk(KVR_STAT_LK_MISS_FIRST + (r) - 1)

/* No L2: a prompt never stored; a prompt evicted from L1 by two others. */
Test(leases, miss_reasons_never_stored_and_evicted)
{
	ct_start(&env, &ct_tiny, &(struct ct_opts){.l1_slots = 8});
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r), 0);
	struct kvr_client *s = sched_open(NULL, NULL);
	uint32_t t[3][4 * BT], m;
	for (unsigned p = 0; p < 3; p++)
		ct_prompt(t[p], 4 * BT, 80 + p);
	cr_assert_eq(lease_miss(s, 1, t[0], 4, &m), KVR_MISS_NEVER_STORED);
	cr_assert_eq(MISSED(KVR_MISS_NEVER_STORED), 4);
	store_prompt(r, 80, t[0], 4, 0);
	cr_assert_eq(lease_miss(s, 1, t[0], 4, &m), KVR_MISS_NONE);
	cr_assert_eq(m, 4);
	cr_assert_eq(kvr_lease_release(s, 1), 0);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_LEASES) == 0, 5000));
	store_prompt(r, 81, t[1], 4, 4);
	store_prompt(r, 82, t[2], 4, 8); /* 8 slots: prompt 0 is evicted (LRU) */
	cr_assert_gt(lk(KVR_STAT_LK_EVICTED), 0);
	unsigned why = lease_miss(s, 2, t[0], 4, &m);
	cr_assert_eq(why, KVR_MISS_EVICTED, "miss: %s", kvr_miss_reason_name(why));
	cr_assert_eq(m, 0);
	cr_assert_eq(MISSED(KVR_MISS_EVICTED), 4);
	kvr_detach(s);
}

/* TP 2: only rank 0 stored the prompt — the quorum is incomplete. */
Test(leases, miss_reason_quorum)
{
	ct_start(&env, &ct_tiny_tp2, &(struct ct_opts){.l1_slots = 16});
	struct ct_rank *r0, *r1;
	cr_assert_eq(ct_rank_open(&env, 0, 32, 0, &r0), 0);
	cr_assert_eq(ct_rank_open(&env, 1, 32, 0, &r1), 0);
	struct kvr_client *s = sched_open(NULL, NULL);
	uint32_t t[3 * BT], m;
	ct_prompt(t, 3 * BT, 90);
	store_prompt(r0, 90, t, 3, 0);
	unsigned why = lease_miss(s, 1, t, 3, &m);
	cr_assert_eq(why, KVR_MISS_QUORUM, "miss: %s", kvr_miss_reason_name(why));
	cr_assert_eq(m, 0);
	store_prompt(r1, 90, t, 3, 0);
	cr_assert_eq(lease_miss(s, 1, t, 3, &m), KVR_MISS_NONE);
	cr_assert_eq(m, 3);
	kvr_detach(s);
}

/* Damage the L2 file of lane 0 of key k: its payload's first bytes flipped. */
static void damage_file(kvr_key k)
{
	char hex[KVR_KEY_FMT_LEN], name[64], path[1024];
	snprintf(name, sizeof(name), "%s.0.kvb", kvr_key_fmt(k, hex));
	DIR *d = opendir(l2dir);
	cr_assert_not_null(d);
	struct dirent *de;
	int fd = -1;
	while (fd < 0 && (de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s/%s", l2dir, de->d_name, name);
		fd = open(path, O_RDWR);
	}
	closedir(d);
	cr_assert_geq(fd, 0, "no L2 file %s", name);
	uint8_t junk[64];
	memset(junk, 0x5a, sizeof(junk));
	cr_assert_eq(pwrite(fd, junk, sizeof(junk), 4096), (ssize_t)sizeof(junk));
	close(fd);
}

/*
 * L2 on, L1 of 4 slots. A (4 blocks) is written through, then B evicts it from L1. With B
 * leased (every slot pinned) a lease of A cannot promote: no room. B released, A's first
 * file damaged: its promotion read fails verification — a miss, never served.
 */
Test(leases, miss_reasons_no_room_and_l2_failed)
{
	ct_start(&env, &ct_tiny, &(struct ct_opts){.l1_slots = 4, .l2_dir = l2dir});
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r), 0);
	struct kvr_client *s = sched_open(NULL, NULL);
	uint32_t a[4 * BT], b[4 * BT], m;
	ct_prompt(a, 4 * BT, 95);
	ct_prompt(b, 4 * BT, 96);
	store_prompt(r, 95, a, 4, 0);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == 4, 10000));
	store_prompt(r, 96, b, 4, 4);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == 8, 10000));
	cr_assert_eq(lease_miss(s, 1, b, 4, &m), KVR_MISS_NONE);
	cr_assert_eq(m, 4, "B is in L1, now pinned by its lease");
	unsigned why = lease_miss(s, 2, a, 4, &m);
	cr_assert_eq(why, KVR_MISS_NO_ROOM, "miss: %s", kvr_miss_reason_name(why));
	cr_assert_eq(m, 0);
	cr_assert_eq(MISSED(KVR_MISS_NO_ROOM), 4);
	cr_assert_eq(kvr_lease_release(s, 1), 0);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_LEASES) == 0, 5000));

	kvr_key keys[4];
	ct_keys(&env, a, 4 * BT, keys);
	damage_file(keys[0]);
	uint64_t fails = lk(KVR_STAT_LK_L2_READ_FAILS);
	why = lease_miss(s, 3, a, 4, &m);
	cr_assert_eq(why, KVR_MISS_L2_FAILED, "miss: %s", kvr_miss_reason_name(why));
	cr_assert_eq(m, 0, "a damaged file is a miss, never served");
	cr_assert_gt(lk(KVR_STAT_LK_L2_READ_FAILS), fails);
	cr_assert_eq(MISSED(KVR_MISS_L2_FAILED), 4);
	cr_assert_eq(kvr_lease_release(s, 3), 0);
	ct_assert_table_clean(&env);
	kvr_detach(s);
}
