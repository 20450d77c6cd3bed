/* Pipelined stores (issue 13): several stores of one worker in flight up to the store pool depth, committed in producer order. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"
#include "kvr_time.h"

/*
 * The real kvringd, a ct_tiny model (one 4 KiB lane per block) and staging sized for a store
 * pool of 4 leases: staging.ceiling_bytes = 8 lanes, load_percent 50, one lane per lease.
 * The storer then keeps up to 4 stores in its window (KVR_STAT_XF_STORES_INFLIGHT, with
 * its high-water mark KVR_STAT_XF_STORES_INFLIGHT_MAX). Nothing here is proven by sleeping:
 * the pipeline is frozen by stopping the lookup actor (SIGSTOP) — the storer's first ALLOC
 * then stays unanswered and the stores behind it wait in the window — and the test waits
 * for the gauge to say so. Faults are real: kill -9 of the lookup actor or of the storer.
 * Every test ends with the slot table clean (only FREE and COMMITTED, no pins) and every
 * stored block loaded back and compared byte for byte.
 */

static struct ct_env env;

static void setup(void)
{
	ct_init(&env);
}

static void teardown(void)
{
	if (env.h.pid > 0)
		(void)kill(env.h.pid, SIGKILL);
	ct_fini(&env);
	(void)unsetenv("KVRING_STORE_DEPTH");
}

TestSuite(store_pipe, .init = setup, .fini = teardown, .timeout = 120);


#define BT 16
#define N_STORES 8
#define PER 2 /* blocks per store */
#define TAG(p, i) (9100ull * (p) + (i) + 1)

static uint32_t tokens[N_STORES][PER * BT];

/* The instance: a 4-deep store pool (plus `sections`, e.g. timeouts); rank 0 with 64 blocks. */
static struct ct_rank *start4(const char *sections)
{
	struct ct_opts o = {.l1_slots = 64, .staging_ceiling = 8 * ct_lane_bytes(&ct_tiny),
			    .staging_buffer = ct_lane_bytes(&ct_tiny), .load_percent = 50, .sections_extra = sections};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r), 0);
	return r;
}

static const char *storer_name(const struct ct_rank *r)
{
	static char name[32];
	snprintf(name, sizeof(name), "storer.%u", r->worker);
	return name;
}

static uint64_t inflight(const struct ct_rank *r)
{
	return ct_stat(&env, storer_name(r), KVR_STAT_XF_STORES_INFLIGHT);
}

static uint64_t inflight_max(const struct ct_rank *r)
{
	return ct_stat(&env, storer_name(r), KVR_STAT_XF_STORES_INFLIGHT_MAX);
}

/* Store p: prompt 500 + p, its PER blocks from engine blocks PER*p.. holding TAG(p, i). */
static void fill_store(struct ct_rank *r, unsigned p, uint32_t *blocks)
{
	ct_prompt(tokens[p], PER * BT, 500 + p);
	for (uint32_t i = 0; i < PER; i++) {
		blocks[i] = PER * p + i;
		ct_fill(r, blocks[i], TAG(p, i));
	}
}

/* Submit stores 0..N_STORES-1 (request ids 1..) without waiting for any. */
static void submit_all(struct ct_rank *r)
{
	for (unsigned p = 0; p < N_STORES; p++) {
		uint32_t blocks[PER];
		fill_store(r, p, blocks);
		int rc = kvr_store(r->c, p + 1, tokens[p], PER * BT, NULL, 0, blocks, PER);
		cr_assert_eq(rc, 0, "store %u: %s", p, kvr_last_error(r->c));
	}
}

/* Freeze the pipeline: the lookup actor stopped, every store submitted, and the storer's
 * window full (4 in flight: the first waiting for its ALLOC_REP, three behind it). */
static pid_t freeze_with_four(struct ct_rank *r)
{
	pid_t lk = ct_actor_pid(&env, "lookup");
	ct_stop_process(lk);
	submit_all(r);
	cr_assert(H_WAIT(inflight(r) == 4, 5000), "stores in flight: %llu, want 4", (unsigned long long)inflight(r));
	cr_assert_eq(inflight_max(r), 4, "never more than the pool depth in flight");
	return lk;
}

/* Collect the N_STORES completions: in submission order when `ordered` (the storer
 * answers in producer order; a client failing the requests of a dead storer does not keep
 * one). ok[p]: store p succeeded; when ok_only, every one must have. A failed store lists
 * all its blocks. */
static void collect_as(struct ct_rank *r, bool ok_only, bool ordered, bool *ok)
{
	bool seen[N_STORES] = {0};
	for (unsigned k = 0; k < N_STORES; k++) {
		struct ct_done d;
		ct_wait_done(r, &d, 8000);
		cr_assert_eq(d.c.op, KVR_OP_STORE_DONE);
		if (ordered)
			cr_assert_eq(d.c.req_id, k + 1, "completion %u is of request %llu: not in submission order", k,
				     (unsigned long long)d.c.req_id);
		cr_assert(d.c.req_id >= 1 && d.c.req_id <= N_STORES && !seen[d.c.req_id - 1], "completion of request %llu",
			  (unsigned long long)d.c.req_id);
		unsigned p = (unsigned)d.c.req_id - 1;
		seen[p] = true;
		cr_assert_eq(d.c.n_blocks, PER);
		if (d.c.status == 0) {
			cr_assert_eq(d.c.n_stored + d.c.n_present, PER, "store %u: %u stored, %u present", p, d.c.n_stored,
				     d.c.n_present);
			cr_assert_eq(d.c.n_failed, 0);
			ok[p] = true;
			continue;
		}
		cr_assert(!ok_only, "store %u failed: %d (%u blocks failed)", p, d.c.status, d.c.n_failed);
		cr_log_info("store %u failed: %s, all %u blocks listed", p, strerror(-d.c.status), PER);
		cr_assert_eq(d.c.n_failed, PER, "store %u failed (%d) but lists %u of its %u blocks", p, d.c.status,
			     d.c.n_failed, PER);
		for (uint32_t i = 0; i < PER; i++)
			cr_assert_eq(d.failed[i], PER * p + i, "store %u: failed block %u is %u", p, i, d.failed[i]);
		ok[p] = false;
	}
}

static void collect(struct ct_rank *r, bool ok_only, bool *ok)
{
	collect_as(r, ok_only, true, ok);
}

/* Every stored block loads byte-exact: a store that succeeded matches all its blocks; one
 * that failed matches what the slot table kept of it (a commit that got through), exactly. */
static void verify_loads(struct ct_rank *r, const bool *ok, uint64_t req0)
{
	for (unsigned p = 0; p < N_STORES; p++) {
		uint32_t got = ct_lookup_load_exact(r, req0 + p, tokens[p], PER * BT, 40, TAG(p, 0));
		if (ok[p])
			cr_assert_eq(got, PER, "store %u succeeded but %u of %u blocks are found", p, got, PER);
	}
}

Test(store_pipe, four_in_flight_in_submission_order)
{
	struct ct_rank *r = start4(NULL);
	cr_assert(h_log_contains(&env.h, "up to 4 stores in flight (store pool of 4 leases)"),
		  "the storer logs its depth; log:\n%s", h_read_file(env.h.log));
	pid_t lk = freeze_with_four(r);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_WRITING), 0, "nothing allocated while the lookup actor is stopped");
	cr_assert_eq(kill(lk, SIGCONT), 0);

	bool ok[N_STORES];
	collect(r, true, ok);
	cr_assert_eq(inflight_max(r), 4, "the window held 4 stores at most and at least once");
	cr_assert(H_WAIT(inflight(r) == 0, 2000), "in flight once every store was answered: %llu",
		  (unsigned long long)inflight(r));
	cr_assert_eq(ct_stat(&env, storer_name(r), KVR_STAT_XF_BLOCKS), N_STORES * PER);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_COMMITTED), N_STORES * PER);
	verify_loads(r, ok, 100);
	ct_assert_table_clean(&env);
}

/* The benchmark knob: KVRING_STORE_DEPTH=1 serves one store at a time. */
Test(store_pipe, depth_knob_one_at_a_time)
{
	cr_assert_eq(setenv("KVRING_STORE_DEPTH", "1", 1), 0);
	struct ct_rank *r = start4(NULL);
	cr_assert(h_log_contains(&env.h, "up to 1 stores in flight (store pool of 4 leases, KVRING_STORE_DEPTH)"),
		  "log:\n%s", h_read_file(env.h.log));
	pid_t lk = ct_actor_pid(&env, "lookup");
	ct_stop_process(lk);
	submit_all(r);
	cr_assert(H_WAIT(inflight(r) == 1, 5000));
	cr_assert_eq(kill(lk, SIGCONT), 0);
	bool ok[N_STORES];
	collect(r, true, ok);
	cr_assert_eq(inflight_max(r), 1);
	verify_loads(r, ok, 100);
	ct_assert_table_clean(&env);
}

static int count_key_slots(kvr_key key)
{
	int n = 0;
	for (uint32_t s = 0; s < env.slots->n_slots; s++) {
		const struct kvr_slot *sl = kvr_slot_at(env.slots, s);
		if (kvr_slot_state(env.slots, s) != KVR_SLOT_FREE && sl->lane == 0 && kvr_key_eq(sl->key, key))
			n++;
	}
	return n;
}

/*
 * Two stores of one prompt in flight together: A its first 4 blocks, B all 6, from other
 * engine blocks holding other bytes. B's ALLOC goes out as soon as A's slots are known,
 * before A's copy and commit: the 4 keys A allocated come back PRESENT for B (the lookup
 * actor does not allocate a lane twice), B copies only its 2 new blocks. Producer order
 * shows in the bytes: the first 4 blocks load with A's contents, the last 2 with B's.
 */
Test(store_pipe, overlapping_stores_commit_in_producer_order)
{
	struct ct_rank *r = start4(NULL);
	static uint32_t toks[6 * BT];
	ct_prompt(toks, 6 * BT, 77);
	uint32_t a_blocks[4], b_blocks[6];
	for (uint32_t i = 0; i < 6; i++) {
		if (i < 4) {
			a_blocks[i] = i;
			ct_fill(r, a_blocks[i], TAG(20, i));
		}
		b_blocks[i] = 10 + i;
		ct_fill(r, b_blocks[i], TAG(21, i));
	}
	pid_t lk = ct_actor_pid(&env, "lookup");
	ct_stop_process(lk);
	cr_assert_eq(kvr_store(r->c, 1, toks, 4 * BT, NULL, 0, a_blocks, 4), 0, "%s", kvr_last_error(r->c));
	cr_assert_eq(kvr_store(r->c, 2, toks, 6 * BT, NULL, 0, b_blocks, 6), 0, "%s", kvr_last_error(r->c));
	cr_assert(H_WAIT(inflight(r) == 2, 5000), "both stores in flight: %llu", (unsigned long long)inflight(r));
	cr_assert_eq(kill(lk, SIGCONT), 0);

	struct ct_done a, b;
	ct_wait_done(r, &a, 5000);
	ct_wait_done(r, &b, 5000);
	cr_assert_eq(a.c.req_id, 1, "A answered first");
	cr_assert_eq(b.c.req_id, 2);
	cr_assert_eq(a.c.status, 0, "A: %d", a.c.status);
	cr_assert_eq(a.c.n_stored, 4);
	cr_assert_eq(a.c.n_present, 0);
	cr_assert_eq(b.c.status, 0, "B: %d", b.c.status);
	cr_assert_eq(b.c.n_present, 4, "the keys A allocated are PRESENT for B");
	cr_assert_eq(b.c.n_stored, 2);
	cr_assert_eq(b.c.diag.bytes, 2 * env.lane_bytes, "B copied its 2 new blocks only");

	kvr_key keys[6];
	ct_keys(&env, toks, 6 * BT, keys);
	for (unsigned i = 0; i < 6; i++) {
		cr_assert_eq(count_key_slots(keys[i]), 1, "block %u is in %d slots", i, count_key_slots(keys[i]));
		int s = ct_find_slot(&env, keys[i], 0);
		cr_assert_eq(kvr_slot_state(env.slots, (uint32_t)s), KVR_SLOT_COMMITTED);
	}
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_ALLOCATED), 6, "nothing allocated twice");
	cr_assert_eq(ct_stat(&env, storer_name(r), KVR_STAT_XF_BLOCKS), 6);
	cr_assert_eq(ct_stat(&env, storer_name(r), KVR_STAT_XF_PRESENT_BLOCKS), 4);

	cr_assert_eq(ct_lookup(r, 3, toks, 6 * BT), 6);
	uint32_t dst[6] = {30, 31, 32, 33, 34, 35};
	struct ct_done d;
	ct_load(r, 3, dst, 6, &d);
	cr_assert_eq(d.c.status, 0);
	for (uint32_t i = 0; i < 6; i++) {
		char why[200] = "";
		uint64_t want = i < 4 ? TAG(20, i) : TAG(21, i);
		cr_assert(ct_holds(r, dst[i], want, why, sizeof(why)), "block %u: not the %s store's bytes: %s", i,
			  i < 4 ? "first" : "second", why);
	}
	ct_assert_table_clean(&env);
}

/*
 * kill -9 of the lookup actor with 4 stores in flight (frozen: the first one's ALLOC sits
 * in commit.req). Its successor may take that ALLOC from the ring and answer it, or the
 * storer may see the restart first and fail the store with -EPIPE: either way each store
 * completes — succeeded, or failed with every one of its blocks listed — in order, nothing
 * is left WRITING or pinned, and what was stored loads byte-exact.
 */
Test(store_pipe, lookup_killed_with_four_in_flight)
{
	struct ct_rank *r = start4(NULL);
	pid_t lk = freeze_with_four(r);
	cr_assert_eq(kill(lk, SIGKILL), 0);
	(void)ct_wait_ready(&env, "lookup", lk, 5000);

	bool ok[N_STORES];
	collect(r, false, ok);
	ct_assert_table_clean(&env);
	verify_loads(r, ok, 100);
	/* and the lane works: every store again, each succeeds */
	submit_all(r);
	collect(r, true, ok);
	verify_loads(r, ok, 200);
	ct_assert_table_clean(&env);
}

/* The same, the lookup actor killed while 8 stores of 24 blocks flow (no freeze: whatever
 * step each store is in). */
Test(store_pipe, lookup_killed_mid_flow)
{
	struct ct_opts o = {.l1_slots = 256, .staging_ceiling = 8 * ct_lane_bytes(&ct_tiny),
			    .staging_buffer = ct_lane_bytes(&ct_tiny), .load_percent = 50};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 256, 0, &r), 0);
	enum { BIG = 24 };
	static uint32_t toks[N_STORES][BIG * BT];
	pid_t lk = ct_actor_pid(&env, "lookup");
	for (unsigned p = 0; p < N_STORES; p++) {
		uint32_t blocks[BIG];
		ct_prompt(toks[p], BIG * BT, 700 + p);
		for (uint32_t i = 0; i < BIG; i++) {
			blocks[i] = BIG * p + i;
			ct_fill(r, blocks[i], TAG(40 + p, i));
		}
		cr_assert_eq(kvr_store(r->c, p + 1, toks[p], BIG * BT, NULL, 0, blocks, BIG), 0, "%s", kvr_last_error(r->c));
		if (p == 2)
			cr_assert_eq(kill(lk, SIGKILL), 0);
	}
	(void)ct_wait_ready(&env, "lookup", lk, 5000);
	unsigned failed = 0;
	for (unsigned p = 0; p < N_STORES; p++) {
		struct ct_done d;
		ct_wait_done(r, &d, 8000);
		cr_assert_eq(d.c.req_id, p + 1, "in submission order");
		if (d.c.status) {
			failed++;
			/* a failed store lists all its blocks, or (-EIO) exactly those not stored */
			if (d.c.status != -EIO)
				cr_assert_eq(d.c.n_failed, BIG, "store %u (%d) lists %u of %u blocks", p, d.c.status,
					     d.c.n_failed, BIG);
			else
				cr_assert_eq(d.c.n_stored + d.c.n_present + d.c.n_failed, BIG);
		} else {
			cr_assert_eq(d.c.n_stored + d.c.n_present, BIG);
		}
	}
	cr_log_info("lookup killed mid-flow: %u of %u stores failed", failed, N_STORES);
	ct_assert_table_clean(&env);
	for (unsigned p = 0; p < N_STORES; p++) {
		uint32_t got = ct_lookup(r, 100 + p, toks[p], BIG * BT);
		if (!got)
			continue;
		uint32_t dst[BIG];
		for (uint32_t i = 0; i < got; i++)
			dst[i] = 200 + i;
		struct ct_done d;
		ct_load(r, 100 + p, dst, got, &d);
		cr_assert_eq(d.c.status, 0);
		for (uint32_t i = 0; i < got; i++) {
			char why[200] = "";
			cr_assert(ct_holds(r, dst[i], TAG(40 + p, i), why, sizeof(why)), "store %u block %u: WRONG BYTES: %s",
				  p, i, why);
		}
	}
	ct_assert_table_clean(&env);
}

/*
 * kill -9 of the storer with 4 stores in flight: the client fails every store of the dead
 * storer (-EPIPE, all blocks). Its successor RESETs the lane (the ALLOC its predecessor
 * left in the ring is answered and then aborted): nothing stays WRITING, and stores work.
 */
Test(store_pipe, storer_killed_with_four_in_flight)
{
	struct ct_rank *r = start4(NULL);
	pid_t lk = freeze_with_four(r);
	pid_t st = ct_actor_pid(&env, storer_name(r));
	cr_assert_eq(kill(st, SIGKILL), 0);
	cr_assert_eq(kill(lk, SIGCONT), 0); /* the successor's RESET needs the lookup actor */
	(void)ct_wait_ready(&env, storer_name(r), st, 5000);

	bool ok[N_STORES];
	collect_as(r, false, false, ok);
	for (unsigned p = 0; p < N_STORES; p++)
		cr_assert(!ok[p], "store %u of a killed storer succeeded", p);
	ct_assert_table_clean(&env);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), 0);
	submit_all(r);
	collect(r, true, ok);
	verify_loads(r, ok, 100);
	ct_assert_table_clean(&env);
}

/*
 * An ALLOC unanswered for timeouts.lookup_call_ms fails its store (-ETIMEDOUT, every block)
 * and the lane is reset; once the lookup actor runs again it answers the abandoned ALLOC
 * late (the storer drops the answer and resets once more) and the stores behind it go on.
 */
Test(store_pipe, unanswered_alloc_times_out)
{
	struct ct_rank *r = start4(",\n  \"timeouts\": {\"reply_ms\": 100, \"alloc_wait_ms\": 200, \"l2_answer_ms\": 300, "
				   "\"lookup_call_ms\": 500}");
	pid_t lk = freeze_with_four(r);
	struct ct_done d;
	ct_wait_done(r, &d, 5000); /* the first store: its ALLOC is overdue */
	cr_assert_eq(d.c.req_id, 1);
	cr_assert_eq(d.c.status, -ETIMEDOUT, "status %d", d.c.status);
	cr_assert_eq(d.c.n_failed, PER);
	cr_assert(H_WAIT(inflight(r) == 4, 2000), "the next store took its place: %llu", (unsigned long long)inflight(r));
	cr_assert_eq(kill(lk, SIGCONT), 0);
	/* the others: the second may time out too (its ALLOC went out behind the first's) */
	bool ok[N_STORES] = {0};
	for (unsigned p = 1; p < N_STORES; p++) {
		ct_wait_done(r, &d, 8000);
		cr_assert_eq(d.c.req_id, p + 1);
		cr_assert(d.c.status == 0 || (d.c.status == -ETIMEDOUT && d.c.n_failed == PER), "store %u: %d", p,
			  d.c.status);
		ok[p] = d.c.status == 0;
	}
	for (unsigned p = 2; p < N_STORES; p++)
		cr_assert(ok[p], "store %u: its ALLOC went out after the lookup actor ran again", p);
	ct_assert_table_clean(&env);
	verify_loads(r, ok, 100);
}

/*
 * With an L2 tier the lookup actor may hold an ALLOC for up to alloc_wait_ms (waiting for
 * room that L2 writes free), and it keeps one ALLOC per worker: after giving up on an ALLOC
 * the storer sends no other until the lookup actor cannot hold it any more (its late
 * answer, alloc_wait_ms after the answer to the RESET behind it, or lookup_call_ms). With
 * the lookup actor stopped: the first store times out at lookup_call_ms; the second's ALLOC
 * waits lookup_call_ms more before it goes out, so it times out no sooner than
 * 2 x lookup_call_ms after the first (a lower bound: a slow machine only adds to it).
 */
Test(store_pipe, abandoned_alloc_bars_the_next_with_a_tier)
{
	static char l2dir[256];
	snprintf(l2dir, sizeof(l2dir), "%s/l2", env.h.dir);
	cr_assert_eq(mkdir(l2dir, 0700), 0);
	struct ct_opts o = {.l1_slots = 64, .staging_ceiling = 8 * ct_lane_bytes(&ct_tiny),
			    .staging_buffer = ct_lane_bytes(&ct_tiny), .load_percent = 50, .l2_dir = l2dir,
			    .sections_extra = ",\n  \"timeouts\": {\"reply_ms\": 100, \"alloc_wait_ms\": 200, "
					      "\"l2_answer_ms\": 300, \"lookup_call_ms\": 500}"};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r), 0);
	pid_t lk = freeze_with_four(r);
	struct ct_done d;
	ct_wait_done(r, &d, 5000);
	uint64_t t1 = kvr_now_ns();
	cr_assert_eq(d.c.req_id, 1);
	cr_assert_eq(d.c.status, -ETIMEDOUT);
	ct_wait_done(r, &d, 5000);
	uint64_t gap_ms = (kvr_now_ns() - t1) / 1000000;
	cr_assert_eq(d.c.req_id, 2);
	cr_assert_eq(d.c.status, -ETIMEDOUT);
	cr_assert_geq(gap_ms, 900, "the second ALLOC went out %llu ms after the first store failed: it did not wait",
		      (unsigned long long)gap_ms);
	cr_assert_eq(kill(lk, SIGCONT), 0);
	bool ok[N_STORES] = {0};
	for (unsigned p = 2; p < N_STORES; p++) {
		ct_wait_done(r, &d, 8000);
		cr_assert_eq(d.c.req_id, p + 1);
		cr_assert(d.c.status == 0 || (d.c.status == -ETIMEDOUT && d.c.n_failed == PER), "store %u: %d", p,
			  d.c.status);
		ok[p] = d.c.status == 0;
	}
	ct_assert_table_clean(&env);
	verify_loads(r, ok, 100);
}

static bool ring_has(const struct kvr_ring *r, unsigned type)
{
	struct kvr_msg m;
	for (uint32_t i = 0; kvr_ring_peek(r, i, &m) == 0; i++)
		if (m.hdr.type == type)
			return true;
	return false;
}

/*
 * The worker leaves with 4 stores in flight, the lookup actor stopped: kvringd stops the
 * storer, then sends WORKER_GONE, which the lookup actor takes (its control ring first)
 * before the ALLOC still in commit.req — that ALLOC then allocates slots for a worker that
 * is gone. The stopping storer leaves a RESET behind it, so those slots are aborted too:
 * the table ends clean.
 */
Test(store_pipe, worker_leaves_with_stores_in_flight)
{
	struct ct_rank *r = start4(NULL);
	unsigned w = r->worker;
	pid_t lk = freeze_with_four(r);
	pid_t st = ct_actor_pid(&env, storer_name(r));
	const struct kvr_ring *gone = ct_ring(&env, "ctl.lookup.in");
	ct_rank_close(r); /* detach */
	cr_assert(H_WAIT(!h_pid_alive(st), 5000), "the storer of a detached worker still runs");
	cr_assert(H_WAIT(ring_has(gone, KVR_MSG_WORKER_GONE), 5000), "no WORKER_GONE sent");
	cr_assert(ring_has(ct_ring(&env, "commit.req.0"), KVR_MSG_ALLOC), "the ALLOC is still unread");
	cr_assert_eq(kill(lk, SIGCONT), 0);
	struct kvr_worker_ent *we = kvr_ctl_worker(env.h.ctl, w);
	cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_FREE, 5000), "worker slot %u not freed", w);
	ct_assert_table_clean(&env);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), 0);
}
