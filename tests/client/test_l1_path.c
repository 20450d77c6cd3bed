/* L1 data path through the real kvringd, actors and libkvring: round trips, quorum, sharing, eviction, failures. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"
#include "kvr_list.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"

static struct ct_env env;

static void setup(void)
{
	ct_init(&env);
}

static void teardown(void)
{
	ct_fini(&env);
}

TestSuite(client, .init = setup, .fini = teardown, .timeout = 60);

#define TAG(prompt, i) (1000ull * (prompt) + (i) + 1)

static void assert_holds(const struct ct_rank *r, uint32_t block, uint64_t tag, const char *what)
{
	char why[200] = "";
	cr_assert(ct_holds(r, block, tag, why, sizeof(why)), "%s: %s", what, why);
}

/* Store n blocks of prompt `seed` from engine blocks src[] (which the caller filled). */
static void store_ok(struct ct_rank *r, uint64_t req, const uint32_t *tokens, size_t n_tokens, const uint32_t *src,
		     uint32_t n, uint32_t want_stored, uint32_t want_present, uint64_t lane_bytes)
{
	struct ct_done d;
	ct_store(r, req, tokens, n_tokens, src, n, &d);
	cr_assert_eq(d.c.status, 0, "rank %u store: status %d", r->rank, d.c.status);
	cr_assert_eq(d.c.n_failed, 0);
	cr_assert_eq(d.c.n_stored, want_stored, "rank %u: n_stored %u, want %u", r->rank, d.c.n_stored, want_stored);
	cr_assert_eq(d.c.n_present, want_present, "rank %u: n_present %u, want %u", r->rank, d.c.n_present,
		     want_present);
	cr_assert_eq(d.c.diag.bytes, (uint64_t)want_stored * lane_bytes);
}

/* Load n matched blocks of req into dst[] and expect every one restored. */
static void load_ok(struct ct_rank *r, uint64_t req, const uint32_t *dst, uint32_t n, uint64_t lane_bytes)
{
	struct ct_done d;
	ct_load(r, req, dst, n, &d);
	cr_assert_eq(d.c.status, 0, "rank %u load: status %d, %u failed", r->rank, d.c.status, d.c.n_failed);
	cr_assert_eq(d.c.n_failed, 0);
	cr_assert_eq(d.c.diag.bytes, (uint64_t)n * lane_bytes);
	cr_assert_eq(d.c.diag.l1_hits, n);
}

/* ---- 1. byte-exact round trips over a parameter table ---------------------------------- */

struct rt_param {
	struct ct_model m;
	uint32_t n;  /* blocks in the prompt */
};

ParameterizedTestParameters(client, roundtrip)
{
	static struct rt_param p[] = {
		{{2, 2, 16, 2, 16, 1}, 4},   /* the ct_tiny model, block 16 */
		{{2, 2, 16, 2, 128, 1}, 4},  /* block 128 */
		{{2, 2, 16, 2, 16, 2}, 5},   /* TP 2, one head per rank */
		{{3, 4, 8, 2, 128, 2}, 3},   /* TP 2, 3 layers, 2 heads per rank of 8 */
		{{2, 4, 16, 2, 16, 4}, 4},   /* TP 4 */
		{{1, 8, 16, 4, 128, 4}, 2},  /* TP 4, fp32, 1 layer */
		{{2, 2, 32, 1, 16, 4}, 3},   /* TP 4 over 2 heads: one replicated head per rank, fp8 */
		{{5, 1, 24, 1, 16, 1}, 6},   /* 5 layers, 384-byte pages (rows of 24 bytes) */
	};
	return cr_make_param_array(struct rt_param, p, sizeof(p) / sizeof(p[0]));
}

/*
 * Every rank stores the prompt from engine blocks 1..n (its own contents: the pattern
 * depends on the rank), looks it up (n full blocks; the prompt has half a block more) and
 * loads it into blocks 2n+1 down to n+2 — other ids, reversed. Blocks 0, n+1 and 2n+2 are
 * canaries no copy may touch; the source blocks must be unchanged.
 */
ParameterizedTest(struct rt_param *p, client, roundtrip)
{
	const uint32_t n = p->n, bt = p->m.block_tokens, tp = p->m.tp_size, nb = 2 * n + 3;
	ct_start(&env, &p->m, NULL);
	struct ct_rank *r[4];
	uint32_t src[8], dst[8];
	for (uint32_t i = 0; i < n; i++) {
		src[i] = 1 + i;
		dst[i] = 2 * n + 1 - i;
	}
	for (unsigned k = 0; k < tp; k++) {
		int rc = ct_rank_open(&env, k, nb, 0, &r[k]);
		cr_assert_eq(rc, 0, "attach rank %u: %s", k, kvr_last_error(NULL));
		for (uint32_t i = 0; i < n; i++)
			ct_fill(r[k], src[i], TAG(7, i));
	}
	size_t n_tokens = (size_t)n * bt + bt / 2;
	uint32_t *tokens = malloc(n_tokens * sizeof(*tokens));
	ct_prompt(tokens, n_tokens, 7);

	for (unsigned k = 0; k < tp; k++)
		store_ok(r[k], 1, tokens, n_tokens, src, n, n, 0, env.lane_bytes);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), n * tp, "one committed slot per block and lane");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_COMMITTED), n * tp);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_VISIBLE), n);
	kvr_key keys[8];
	ct_keys(&env, tokens, n_tokens, keys);
	for (unsigned k = 0; k < tp; k++)
		for (uint32_t i = 0; i < n; i++) {
			int s = ct_find_slot(&env, keys[i], k);
			cr_assert(s >= 0, "block %u lane %u has no slot", i, k);
			char why[160] = "";
			cr_assert(ct_slot_holds(&env, r[k], (uint32_t)s, TAG(7, i), why, sizeof(why)),
				  "L1 copy of block %u lane %u: %s", i, k, why);
		}

	for (unsigned k = 0; k < tp; k++) {
		cr_assert_eq(ct_lookup(r[k], 2, tokens, n_tokens), n, "rank %u: matched blocks", k);
		load_ok(r[k], 2, dst, n, env.lane_bytes);
	}
	for (unsigned k = 0; k < tp; k++) {
		char what[64];
		for (uint32_t i = 0; i < n; i++) {
			snprintf(what, sizeof(what), "rank %u loaded block %u", k, i);
			assert_holds(r[k], dst[i], TAG(7, i), what);
			snprintf(what, sizeof(what), "rank %u source block %u", k, i);
			assert_holds(r[k], src[i], TAG(7, i), what);
		}
		assert_holds(r[k], 0, CT_CANARY, "canary before the source blocks");
		assert_holds(r[k], n + 1, CT_CANARY, "canary between source and destination");
		assert_holds(r[k], 2 * n + 2, CT_CANARY, "canary after the destination blocks");
	}
	cr_assert_eq(ct_stat(&env, "loader.0", KVR_STAT_XF_BLOCKS), n);
	free(tokens);
}

/*
 * A layered load through the real daemon (kvr_load_layered, 3 layers): kvr_wait_layers for
 * the first layer and for all of them returns 0 within the timeout, the completion is the
 * load's one result (every block, byte-exact, canaries untouched), and once it was collected
 * a wait for every layer returns at once (nothing layered in flight). The loader copied
 * layer by layer: XF_CHUNKS counts 2 chunks for each of the 3 layers.
 */
Test(client, layered_load_lands_and_wait_layers_returns)
{
	const struct ct_model m = {3, 2, 16, 2, 16, 1};
	ct_start(&env, &m, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "attach: %s", kvr_last_error(NULL));
	const uint32_t n = 5, src[5] = {1, 2, 3, 4, 5}, dst[5] = {12, 11, 10, 9, 8};
	for (uint32_t i = 0; i < n; i++)
		ct_fill(r, src[i], TAG(3, i));
	uint32_t tokens[5 * 16];
	ct_prompt(tokens, 5 * 16, 3);
	store_ok(r, 1, tokens, 5 * 16, src, n, n, 0, env.lane_bytes);
	cr_assert_eq(ct_lookup(r, 2, tokens, 5 * 16), n);
	uint64_t chunks0 = ct_stat(&env, "loader.0", KVR_STAT_XF_CHUNKS);
	cr_assert_eq(kvr_load_layered(r->c, 2, dst, n), 0, "%s", kvr_last_error(r->c));
	cr_assert_eq(kvr_wait_layers(r->c, 1, 5000), 0, "layer 0: %s", kvr_last_error(r->c));
	cr_assert_eq(kvr_wait_layers(r->c, 3, 5000), 0, "every layer: %s", kvr_last_error(r->c));
	struct ct_done d;
	ct_wait_done(r, &d, 5000);
	cr_assert_eq(d.c.op, KVR_OP_LOAD_DONE);
	cr_assert_eq(d.c.status, 0, "load: status %d, %u failed", d.c.status, d.c.n_failed);
	cr_assert_eq(d.c.diag.bytes, (uint64_t)n * env.lane_bytes);
	for (uint32_t i = 0; i < n; i++)
		assert_holds(r, dst[i], TAG(3, i), "layered load");
	assert_holds(r, 0, CT_CANARY, "canary below");
	assert_holds(r, 6, CT_CANARY, "canary between");
	assert_holds(r, 13, CT_CANARY, "canary above");
	/* a lease is one lane (one block of every layer): a layer's chunk is 3 blocks of that
	 * layer, so 5 blocks take 2 chunks a layer */
	cr_assert_eq(ct_stat(&env, "loader.0", KVR_STAT_XF_CHUNKS) - chunks0, 3 * 2, "chunks of a layer at a time");
	cr_assert_eq(kvr_wait_layers(r->c, 1000, 0), 0, "nothing layered in flight: in place at once");
	cr_assert_eq(kvr_inflight(r->c), 0);
	/* a plain load counts as in place only once it completed: its completion is there */
	cr_assert_eq(ct_lookup(r, 3, tokens, 5 * 16), n);
	cr_assert_eq(kvr_load(r->c, 3, src, n), 0, "%s", kvr_last_error(r->c));
	cr_assert_eq(kvr_wait_layers(r->c, 1, 5000), 0, "plain load: %s", kvr_last_error(r->c));
	struct kvr_completion comp;
	cr_assert_eq(kvr_poll(r->c, &comp, 1), 1, "the plain load completed before wait_layers returned");
	cr_assert_eq(comp.req_id, 3);
	cr_assert_eq(comp.status, 0);
	for (uint32_t i = 0; i < n; i++)
		assert_holds(r, src[i], TAG(3, i), "plain load");
	ct_assert_table_clean(&env);
}

/* ---- 2. commit quorum ------------------------------------------------------------------- */

Test(client, quorum_visible_only_when_every_rank_stored)
{
	const uint32_t n = 3, bt = 16;
	ct_start(&env, &ct_tiny_tp2, NULL);
	struct ct_rank *r0, *r1;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r0), 0);
	cr_assert_eq(ct_rank_open(&env, 1, 16, 0, &r1), 0);
	uint32_t src[] = {0, 1, 2}, dst[] = {10, 11, 12};
	for (uint32_t i = 0; i < n; i++) {
		ct_fill(r0, src[i], TAG(1, i));
		ct_fill(r1, src[i], TAG(1, i));
	}
	uint32_t tokens[3 * 16];
	ct_prompt(tokens, n * bt, 1);
	kvr_key keys[3];
	ct_keys(&env, tokens, n * bt, keys);

	store_ok(r0, 1, tokens, n * bt, src, n, n, 0, env.lane_bytes);
	/* lane 0 committed, lane 1 absent: invisible from both ranks */
	for (uint32_t i = 0; i < n; i++) {
		int s = ct_find_slot(&env, keys[i], 0);
		cr_assert(s >= 0);
		cr_assert_eq(kvr_slot_state(env.slots, (uint32_t)s), KVR_SLOT_COMMITTED);
		cr_assert_eq(kvr_slot_at(env.slots, (uint32_t)s)->owner, r0->worker);
		cr_assert_eq(ct_find_slot(&env, keys[i], 1), -1);
	}
	cr_assert_eq(ct_lookup(r0, 2, tokens, n * bt), 0);
	cr_assert_eq(ct_lookup(r1, 2, tokens, n * bt), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_VISIBLE), 0);
	cr_assert_eq(kvr_load(r0->c, 2, dst, 1), -ENOENT, "nothing matched: nothing to load");

	store_ok(r1, 3, tokens, n * bt, src, n, n, 0, env.lane_bytes);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_VISIBLE), n);
	for (uint32_t i = 0; i < n; i++)
		cr_assert_eq(kvr_slot_state(env.slots, (uint32_t)ct_find_slot(&env, keys[i], 1)), KVR_SLOT_COMMITTED);
	cr_assert_eq(ct_lookup(r0, 4, tokens, n * bt), n);
	cr_assert_eq(ct_lookup(r1, 4, tokens, n * bt), n);
	load_ok(r0, 4, dst, n, env.lane_bytes);
	load_ok(r1, 4, dst, n, env.lane_bytes);
	for (uint32_t i = 0; i < n; i++) {
		assert_holds(r0, dst[i], TAG(1, i), "rank 0");
		assert_holds(r1, dst[i], TAG(1, i), "rank 1");
	}
}

/*
 * Rank 1 dies before it commits: with storer.1 stopped the test stands in for it on
 * commit.req.1 / commit.rep.1 (SPSC: their real producer and consumer is stopped), so slots
 * are WRITING, owned by worker 1, when the rank-1 process is killed. kvringd tells the
 * lookup actor (WORKER_GONE): those slots go back to FREE and nothing becomes visible.
 */
Test(client, quorum_rank_dies_before_commit)
{
	const uint32_t n = 3, bt = 16;
	ct_start(&env, &ct_tiny_tp2, NULL);
	/* fork before this process holds any client: the child must not inherit its socket */
	int w1;
	pid_t child = ct_spawn_rank_child(&env, 1, 16, NULL, 0, &w1);
	struct ct_rank *r0;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r0), 0);
	cr_assert_neq((unsigned)w1, r0->worker);
	uint32_t src[] = {0, 1, 2}, dst[] = {8, 9, 10};
	for (uint32_t i = 0; i < n; i++)
		ct_fill(r0, src[i], TAG(2, i));
	uint32_t tokens[3 * 16];
	ct_prompt(tokens, n * bt, 2);
	kvr_key keys[3];
	ct_keys(&env, tokens, n * bt, keys);
	store_ok(r0, 1, tokens, n * bt, src, n, n, 0, env.lane_bytes);
	cr_assert_eq(ct_lookup(r0, 2, tokens, n * bt), 0);

	char storer1[32], name[32];
	snprintf(storer1, sizeof(storer1), "storer.%d", w1);
	pid_t sp = ct_actor_pid(&env, storer1);
	ct_stop_process(sp);
	uint64_t alloc0 = ct_stat(&env, "lookup", KVR_STAT_LK_ALLOCATED);
	uint64_t aborted0 = ct_stat(&env, "lookup", KVR_STAT_LK_ABORTED);
	uint64_t gone0 = ct_stat(&env, "lookup", KVR_STAT_LK_WORKERS_GONE);

	snprintf(name, sizeof(name), KVR_RING_COMMIT_REQ, (unsigned)w1);
	struct kvr_ring *creq = ct_ring(&env, name);
	snprintf(name, sizeof(name), KVR_RING_COMMIT_REP, (unsigned)w1);
	struct kvr_ring *crep = ct_ring(&env, name);
	_Static_assert(sizeof(kvr_key) == sizeof(struct kvr_msg_key), "key wire format");
	cr_assert_eq(kvr_list_send(creq, KVR_MSG_ALLOC, 0x51, 1, keys, n, kvr_now_ns() + 2000000000ull), 0);
	struct kvr_msg_slot got[3];
	cr_assert_eq(ct_recv_list(crep, KVR_MSG_ALLOC_REP, 0x51, got, 3, 3000), (int)n);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_ALLOCATED), alloc0 + n);
	for (uint32_t i = 0; i < n; i++) {
		cr_assert(got[i].slot < env.slots->n_slots, "key %u: slot %#x", i, got[i].slot);
		const struct kvr_slot *s = kvr_slot_at(env.slots, got[i].slot);
		cr_assert_eq(kvr_slot_state(env.slots, got[i].slot), KVR_SLOT_WRITING);
		cr_assert_eq(kvr_slot_epoch(env.slots, got[i].slot), got[i].epoch);
		cr_assert_eq(s->owner, (unsigned)w1);
		cr_assert_eq(s->lane, 1);
		cr_assert(kvr_key_eq(s->key, keys[i]));
	}
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_WRITING), n);
	cr_assert_eq(ct_lookup(r0, 3, tokens, n * bt), 0, "allocated is not committed");

	cr_assert_eq(kill(child, SIGKILL), 0);
	cr_assert_eq(waitpid(child, NULL, 0), child);
	ct_untrack_child(child);
	/* The storer is stopped, not dead: it could still copy into those slots, so they must
	 * stay WRITING (not reclaimed, never given to another store) until it has exited. */
	struct kvr_worker_ent *we = kvr_ctl_worker(env.h.ctl, (unsigned)w1);
	cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_DETACHING, 3000), "worker %d not detaching", w1);
	/* Step both processes past the point where WORKER_GONE would go: the loader exits and is
	 * reaped (kvringd looks at the worker in the same loop pass), an INSPECT round trip means
	 * that pass ended, and a lookup round trip means the lookup actor drained its ctl ring
	 * (it does so before its other rings) after anything kvringd sent in it. */
	char loader1[32];
	snprintf(loader1, sizeof(loader1), "loader.%d", w1);
	cr_assert(H_WAIT(ct_actor_pid(&env, loader1) <= 0, 5000), "%s did not exit", loader1);
	int ifd = h_inspect_fd(env.h.sock);
	cr_assert_geq(ifd, 0);
	close(ifd);
	cr_assert_eq(ct_lookup(r0, 5, tokens, n * bt), 0);
	cr_assert(h_pid_alive(sp));
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_WORKERS_GONE), gone0, "WORKER_GONE before its storer exited");
	for (uint32_t i = 0; i < n; i++)
		cr_assert_eq(kvr_slot_state(env.slots, got[i].slot), KVR_SLOT_WRITING);

	/* let the supervisor stop storer.1: then the slots are reclaimed and the worker slot freed */
	(void)kill(sp, SIGCONT);
	cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_FREE, 5000), "worker slot %d not freed", w1);
	cr_assert(!h_pid_alive(sp));
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_WRITING), 0, "the dead rank's WRITING slots were not reclaimed");
	for (uint32_t i = 0; i < n; i++)
		cr_assert_eq(kvr_slot_state(env.slots, got[i].slot), KVR_SLOT_FREE);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_ABORTED), aborted0 + n);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_WORKERS_GONE), gone0 + 1);
	cr_assert_eq(ct_lookup(r0, 4, tokens, n * bt), 0);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), n, "rank 0's lane is kept");

	/* a new rank 1 completes the quorum */
	struct ct_rank *r1;
	cr_assert_eq(ct_rank_open(&env, 1, 16, 0, &r1), 0, "%s", kvr_last_error(NULL));
	for (uint32_t i = 0; i < n; i++)
		ct_fill(r1, src[i], TAG(2, i) + 50);
	store_ok(r1, 5, tokens, n * bt, src, n, n, 0, env.lane_bytes);
	cr_assert_eq(ct_lookup(r0, 6, tokens, n * bt), n);
	cr_assert_eq(ct_lookup(r1, 6, tokens, n * bt), n);
	load_ok(r0, 6, dst, n, env.lane_bytes);
	load_ok(r1, 6, dst, n, env.lane_bytes);
	for (uint32_t i = 0; i < n; i++) {
		assert_holds(r0, dst[i], TAG(2, i), "rank 0");
		assert_holds(r1, dst[i], TAG(2, i) + 50, "rank 1");
	}
}

/* ---- 3. prefix sharing: only the missing suffix is stored -------------------------------- */

Test(client, prefix_sharing_stores_suffix_only)
{
	const uint32_t bt = 16;
	ct_start(&env, &ct_tiny, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 32, 0, &r), 0);
	/* A: 10 blocks in engine blocks 0..9. B: A's first 7 blocks (same engine blocks, as a
	 * prefix-caching engine shares them) and 3 blocks of its own in 10..12. */
	uint32_t ta[10 * 16], tb[10 * 16], ba[10], bb[10];
	ct_prompt(ta, 10 * bt, 3);
	memcpy(tb, ta, 7 * bt * sizeof(uint32_t));
	ct_prompt(tb + 7 * bt, 3 * bt, 4);
	for (uint32_t i = 0; i < 10; i++) {
		ba[i] = i;
		ct_fill(r, i, TAG(3, i));
		bb[i] = i < 7 ? i : 10 + (i - 7);
	}
	for (uint32_t i = 7; i < 10; i++)
		ct_fill(r, bb[i], TAG(4, i));

	store_ok(r, 1, ta, 10 * bt, ba, 10, 10, 0, env.lane_bytes);
	uint64_t alloc0 = ct_stat(&env, "lookup", KVR_STAT_LK_ALLOCATED);
	uint64_t present0 = ct_stat(&env, "lookup", KVR_STAT_LK_PRESENT);
	uint64_t bytes0 = ct_stat(&env, "storer.0", KVR_STAT_XF_BYTES);
	cr_assert_eq(alloc0, 10);
	store_ok(r, 2, tb, 10 * bt, bb, 10, 3, 7, env.lane_bytes);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_ALLOCATED), alloc0 + 3);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_PRESENT), present0 + 7);
	cr_assert_eq(ct_stat(&env, "storer.0", KVR_STAT_XF_BYTES), bytes0 + 3 * env.lane_bytes, "only 3 copied");
	cr_assert_eq(ct_stat(&env, "storer.0", KVR_STAT_XF_PRESENT_BLOCKS), 7);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), 13);

	uint32_t dst[10];
	for (uint32_t i = 0; i < 10; i++)
		dst[i] = 20 + i;
	cr_assert_eq(ct_lookup(r, 3, tb, 10 * bt), 10);
	load_ok(r, 3, dst, 10, env.lane_bytes);
	for (uint32_t i = 0; i < 10; i++)
		assert_holds(r, dst[i], i < 7 ? TAG(3, i) : TAG(4, i), "prompt B");
	cr_assert_eq(ct_lookup(r, 4, ta, 10 * bt), 10, "A is intact");
	cr_assert_eq(ct_lookup(r, 5, tb, 9 * bt + 5), 9, "only whole blocks count");
}

/* ---- 4. eviction under pressure ---------------------------------------------------------- */

#define EV_PROMPTS 30

/* 30 prompts of 2 blocks into an L1 of 8 slots; prompt p from engine blocks 2p, 2p+1. */
static void store_30(struct ct_rank *r, uint32_t tokens[][32])
{
	for (uint32_t p = 0; p < EV_PROMPTS; p++) {
		ct_prompt(tokens[p], 32, 100 + p);
		uint32_t src[2] = {2 * p, 2 * p + 1};
		ct_fill(r, src[0], TAG(100 + p, 0));
		ct_fill(r, src[1], TAG(100 + p, 1));
		store_ok(r, p + 1, tokens[p], 32, src, 2, 2, 0, env.lane_bytes);
	}
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_ALLOCATED), 2 * EV_PROMPTS);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_EVICTED), 2 * EV_PROMPTS - 8, "60 blocks through 8 slots");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_NOROOM), 0);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), 8);
}

/* Lookup and load prompt p into blocks 60, 61 (canaries before): every block is either
 * not matched, reported failed, or byte-exact. Returns blocks restored. */
static uint32_t lookup_load_checked(struct ct_rank *r, uint32_t p, const uint32_t *tokens, uint64_t req)
{
	uint32_t dst[2] = {60, 61};
	ct_fill(r, 60, CT_CANARY);
	ct_fill(r, 61, CT_CANARY);
	uint32_t m = ct_lookup(r, req, tokens, 32);
	cr_assert(m <= 2);
	if (!m) {
		cr_assert_eq(kvr_load(r->c, req, dst, 1), -ENOENT);
		return 0;
	}
	struct ct_done d;
	ct_load(r, req, dst, m, &d);
	uint32_t ok = 0;
	for (uint32_t i = 0; i < m; i++) {
		bool failed = false;
		for (uint32_t f = 0; f < d.c.n_failed; f++)
			failed |= d.failed[f] == dst[i];
		if (failed) {
			assert_holds(r, dst[i], CT_CANARY, "a failed block is not written");
			continue;
		}
		assert_holds(r, dst[i], TAG(100 + p, i), "a restored block");
		ok++;
	}
	cr_assert_eq(ok + d.c.n_failed, m);
	cr_assert_eq(d.c.status, d.c.n_failed ? -EIO : 0);
	for (uint32_t i = m; i < 2; i++)
		assert_holds(r, dst[i], CT_CANARY, "a block not asked for");
	return ok;
}

Test(client, eviction_lru_exact)
{
	struct ct_opts o = {.l1_slots = 8, .eviction = "lru"};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r), 0);
	static uint32_t tokens[EV_PROMPTS + 4][32];
	store_30(r, tokens);
	/* LRU: the last 4 prompts (8 blocks) are resident, every earlier one was evicted */
	for (uint32_t p = 0; p < EV_PROMPTS; p++) {
		uint32_t ok = lookup_load_checked(r, p, tokens[p], 1000 + p);
		cr_assert_eq(ok, p >= EV_PROMPTS - 4 ? 2u : 0u, "prompt %u: %u blocks restored", p, ok);
	}
	/* A lookup's slots evicted before its load: the load reports exactly those block ids. */
	uint32_t p = EV_PROMPTS - 4, dst[2] = {60, 61};
	ct_fill(r, 60, CT_CANARY);
	ct_fill(r, 61, CT_CANARY);
	cr_assert_eq(ct_lookup(r, 2000, tokens[p], 32), 2);
	for (uint32_t q = EV_PROMPTS; q < EV_PROMPTS + 4; q++) {
		ct_prompt(tokens[q], 32, 100 + q);
		uint32_t src[2] = {2 * (q - EV_PROMPTS), 2 * (q - EV_PROMPTS) + 1};
		store_ok(r, 3000 + q, tokens[q], 32, src, 2, 2, 0, env.lane_bytes);
	}
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_EVICTED), 2 * (EV_PROMPTS + 4) - 8);
	struct ct_done d;
	ct_load(r, 2000, dst, 2, &d);
	cr_assert_eq(d.c.status, -EIO);
	cr_assert_eq(d.c.n_failed, 2);
	cr_assert_eq(d.failed[0], 60);
	cr_assert_eq(d.failed[1], 61);
	cr_assert_eq(d.c.diag.bytes, 0);
	assert_holds(r, 60, CT_CANARY, "evicted block not written");
	assert_holds(r, 61, CT_CANARY, "evicted block not written");
	cr_assert_eq(ct_stat(&env, "loader.0", KVR_STAT_XF_FAILED_BLOCKS), 2);
}

Test(client, eviction_s3fifo_never_wrong_bytes)
{
	struct ct_opts o = {.l1_slots = 8, .eviction = "s3fifo"};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r), 0);
	static uint32_t tokens[EV_PROMPTS][32];
	store_30(r, tokens);
	uint32_t restored = 0;
	for (uint32_t p = 0; p < EV_PROMPTS; p++)
		restored += lookup_load_checked(r, p, tokens[p], 1000 + p);
	cr_assert(restored <= 8, "%u blocks restored from 8 slots", restored);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_MATCHED), restored);
}

/*
 * Nothing evictable: L1 is full of committed blocks, then every slot is taken WRITING (the
 * test stands in for the stopped storer.0 and allocates 8 keys of its own, evicting all 8
 * blocks). A store now waits timeouts.alloc_wait_ms (300 ms here) for room — WRITING slots
 * are what stores in flight commit — then gets NOROOM for each block: it fails with exactly
 * its block ids and nothing is copied. RESET (as storer.0) reclaims the slots and stores
 * work again.
 */
Test(client, store_with_nothing_evictable)
{
	struct ct_opts o = {.l1_slots = 8, .eviction = "lru",
			    .sections_extra = ",\n  \"timeouts\": {\"reply_ms\": 100, \"alloc_wait_ms\": 300}"};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 64, 0, &r), 0);
	static uint32_t tokens[5][32];
	for (uint32_t p = 0; p < 4; p++) {
		ct_prompt(tokens[p], 32, 200 + p);
		uint32_t src[2] = {2 * p, 2 * p + 1};
		ct_fill(r, src[0], TAG(200 + p, 0));
		ct_fill(r, src[1], TAG(200 + p, 1));
		store_ok(r, p + 1, tokens[p], 32, src, 2, 2, 0, env.lane_bytes);
	}
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), 8);

	pid_t sp = ct_actor_pid(&env, "storer.0");
	ct_stop_process(sp);
	kvr_key fake[8];
	for (unsigned i = 0; i < 8; i++)
		fake[i] = (kvr_key){.lo = 0x5eed0000ull + i, .hi = 0xfeedull};
	struct kvr_ring *creq = ct_ring(&env, "commit.req.0"), *crep = ct_ring(&env, "commit.rep.0");
	cr_assert_eq(kvr_list_send(creq, KVR_MSG_ALLOC, 0x77, 0, fake, 8, kvr_now_ns() + 2000000000ull), 0);
	struct kvr_msg_slot got[8];
	cr_assert_eq(ct_recv_list(crep, KVR_MSG_ALLOC_REP, 0x77, got, 8, 3000), 8);
	for (unsigned i = 0; i < 8; i++)
		cr_assert(got[i].slot < 8, "fake key %u: slot %#x", i, got[i].slot);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_WRITING), 8);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_EVICTED), 8);
	cr_assert_eq(kill(sp, SIGCONT), 0);

	ct_prompt(tokens[4], 32, 204);
	uint32_t src[2] = {8, 9};
	ct_fill(r, 8, TAG(204, 0));
	ct_fill(r, 9, TAG(204, 1));
	uint64_t noroom0 = ct_stat(&env, "lookup", KVR_STAT_LK_NOROOM);
	struct ct_done d;
	ct_store(r, 10, tokens[4], 32, src, 2, &d);
	cr_assert_eq(d.c.status, -EIO);
	cr_assert_eq(d.c.n_stored, 0);
	cr_assert_eq(d.c.n_failed, 2);
	cr_assert_eq(d.failed[0], 8);
	cr_assert_eq(d.failed[1], 9);
	cr_assert_eq(d.c.diag.bytes, 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_NOROOM), noroom0 + 2);
	cr_assert_eq(ct_lookup(r, 11, tokens[4], 32), 0);
	cr_assert_eq(ct_lookup(r, 12, tokens[0], 32), 0, "evicted for the fake keys");

	/* RESET as storer.0: its WRITING slots are aborted */
	ct_stop_process(sp);
	uint64_t aborted0 = ct_stat(&env, "lookup", KVR_STAT_LK_ABORTED);
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_RESET, 0, 0x78, 0, NULL, 0);
	cr_assert_eq(kvr_msg_send(creq, &m, kvr_now_ns() + 2000000000ull), 0);
	cr_assert_eq(ct_recv_msg(crep, 0x78, &m, 3000), 0);
	struct kvr_msg_commit_rep cr;
	cr_assert_eq(kvr_msg_decode_commit_rep(&m, &cr), 0);
	cr_assert_eq(cr.status, 0);
	cr_assert_eq(kill(sp, SIGCONT), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_ABORTED), aborted0 + 8);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_FREE), 8);
	store_ok(r, 13, tokens[4], 32, src, 2, 2, 0, env.lane_bytes);
	cr_assert_eq(ct_lookup(r, 14, tokens[4], 32), 2);
	uint32_t dst[2] = {60, 61};
	load_ok(r, 14, dst, 2, env.lane_bytes);
	assert_holds(r, 60, TAG(204, 0), "after RESET");
	assert_holds(r, 61, TAG(204, 1), "after RESET");
}

/* ---- 5. staging: requests stream through a pool of 2 leases ----------------------------- */

struct stage_param {
	uint32_t buffer_lanes; /* staging.buffer_bytes in lanes */
	uint32_t chunks;       /* expected leases for 50 blocks */
};

ParameterizedTestParameters(client, staging_streams)
{
	/*
	 * staging.ceiling_bytes = 4 buffers and load_percent 50: each pool (load, store) holds
	 * 2 leases of buffer_bytes. stage_copy copies chunk_blocks = buffer / lane
	 * blocks per lease and counts KVR_STAT_XF_CHUNKS once per lease used, so a 50-block
	 * request uses ceil(50 / chunk_blocks) leases: 50 of 1 block, 25 of 2, 17 of 3 (16
	 * full, the last holding 2) — taking turns between the pool's 2 leases.
	 */
	static struct stage_param p[] = {{1, 50}, {2, 25}, {3, 17}};
	return cr_make_param_array(struct stage_param, p, sizeof(p) / sizeof(p[0]));
}

ParameterizedTest(struct stage_param *p, client, staging_streams)
{
	const uint64_t lane = ct_lane_bytes(&ct_tiny), buf = p->buffer_lanes * lane;
	struct ct_opts o = {.staging_ceiling = 4 * buf, .staging_buffer = buf, .load_percent = 50};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 102, 0, &r), 0);
	char line[64];
	snprintf(line, sizeof(line), "lease %u blocks x 2", p->buffer_lanes);
	cr_assert(h_log_contains(&env.h, line), "loader and storer log their pool: %s", line);

	static uint32_t tokens[50 * 16];
	uint32_t src[50], dst[50];
	ct_prompt(tokens, 50 * 16, 5);
	for (uint32_t i = 0; i < 50; i++) {
		src[i] = i;
		dst[i] = 99 - i;
		ct_fill(r, i, TAG(5, i));
	}
	uint64_t sc0 = ct_stat(&env, "storer.0", KVR_STAT_XF_CHUNKS);
	store_ok(r, 1, tokens, 50 * 16, src, 50, 50, 0, lane);
	cr_assert_eq(ct_stat(&env, "storer.0", KVR_STAT_XF_CHUNKS) - sc0, p->chunks);
	cr_assert_eq(ct_stat(&env, "storer.0", KVR_STAT_XF_BLOCKS), 50);

	uint64_t lc0 = ct_stat(&env, "loader.0", KVR_STAT_XF_CHUNKS);
	cr_assert_eq(ct_lookup(r, 2, tokens, 50 * 16), 50);
	load_ok(r, 2, dst, 50, lane);
	cr_assert_eq(ct_stat(&env, "loader.0", KVR_STAT_XF_CHUNKS) - lc0, p->chunks);
	for (uint32_t i = 0; i < 50; i++)
		assert_holds(r, dst[i], TAG(5, i), "streamed load");
	assert_holds(r, 100, CT_CANARY, "canary");
	assert_holds(r, 101, CT_CANARY, "canary");
}

/* ---- 6. actors killed mid-request ------------------------------------------------------- */

/* Store a 4-block prompt (tag prompt 6) from blocks 0..3 of a TP-1 rank. */
static void store_four(struct ct_rank *r, uint32_t *tokens)
{
	uint32_t src[4] = {0, 1, 2, 3};
	ct_prompt(tokens, 64, 6);
	for (uint32_t i = 0; i < 4; i++)
		ct_fill(r, i, TAG(6, i));
	store_ok(r, 1, tokens, 64, src, 4, 4, 0, env.lane_bytes);
}

Test(client, loader_killed_mid_load)
{
	ct_start(&env, &ct_tiny, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	uint32_t tokens[64], dst[4] = {12, 10, 8, 6};
	store_four(r, tokens);
	cr_assert_eq(ct_lookup(r, 2, tokens, 64), 4);

	pid_t lp = ct_actor_pid(&env, "loader.0");
	uint32_t gen = ct_actor_gen(&env, "loader.0");
	ct_stop_process(lp);
	cr_assert_eq(kvr_load(r->c, 2, dst, 4), 0);
	cr_assert_eq(kvr_ring_count(ct_ring(&env, "load.req.0")), 2, "4 items: 2 LOAD messages wait");
	cr_assert_eq(kvr_inflight(r->c), 1);
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(kill(lp, SIGKILL), 0);
	struct ct_done d;
	ct_wait_done(r, &d, 5000);
	uint64_t ms = (kvr_now_ns() - t0) / 1000000;
	cr_assert(ms < 5000, "failed after %llu ms: beyond the client timeout", (unsigned long long)ms);
	cr_assert_eq(d.c.op, KVR_OP_LOAD_DONE);
	cr_assert_eq(d.c.status, -EPIPE, "status %d (%s)", d.c.status, strerror(-d.c.status));
	cr_assert_eq(d.c.n_failed, 4);
	for (uint32_t i = 0; i < 4; i++)
		cr_assert_eq(d.failed[i], dst[i], "failed[%u] = %u, want %u", i, d.failed[i], dst[i]);
	cr_assert_eq(kvr_inflight(r->c), 0);
	for (uint32_t i = 0; i < 4; i++)
		assert_holds(r, dst[i], CT_CANARY, "nothing copied by the dead loader");

	pid_t np = ct_wait_ready(&env, "loader.0", lp, 5000);
	cr_assert_neq(np, lp);
	cr_assert_gt(ct_actor_gen(&env, "loader.0"), gen);
	struct kvr_slot_counts sc;
	kvr_slots_counts(env.slots, &sc);
	cr_assert_eq(sc.pins, 0, "no pin left behind");
	cr_assert_eq(ct_lookup(r, 3, tokens, 64), 4);
	load_ok(r, 3, dst, 4, env.lane_bytes);
	for (uint32_t i = 0; i < 4; i++)
		assert_holds(r, dst[i], TAG(6, i), "after the loader restarted");
}

/*
 * The same death, but the client looks only after the new loader has served the request
 * the dead one left in load.req.0: the new incarnation answers it (addressed to its
 * predecessor) without copying anything, and the client must still report -EPIPE with
 * every block id, as for any request a dead actor had.
 */
Test(client, loader_restarted_before_client_polls)
{
	ct_start(&env, &ct_tiny, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	uint32_t tokens[64], dst[4] = {9, 8, 7, 6};
	store_four(r, tokens);
	cr_assert_eq(ct_lookup(r, 2, tokens, 64), 4);
	pid_t lp = ct_actor_pid(&env, "loader.0");
	ct_stop_process(lp);
	cr_assert_eq(kvr_load(r->c, 2, dst, 4), 0);
	cr_assert_eq(kill(lp, SIGKILL), 0);
	ct_wait_ready(&env, "loader.0", lp, 5000);
	struct kvr_ring *req = ct_ring(&env, "load.req.0"), *rep = ct_ring(&env, "load.rep.0");
	cr_assert(H_WAIT(kvr_ring_count(req) == 0 && kvr_ring_count(rep) > 0, 3000), "the new loader did not answer");
	struct ct_done d;
	ct_wait_done(r, &d, 5000);
	cr_assert_eq(d.c.op, KVR_OP_LOAD_DONE, "op %u of request %llu", d.c.op, (unsigned long long)d.c.req_id);
	cr_assert_eq(d.c.req_id, 2);
	cr_assert_eq(d.c.status, -EPIPE, "status %d (%s), %u failed, %llu bytes", d.c.status, strerror(-d.c.status),
		     d.c.n_failed, (unsigned long long)d.c.diag.bytes);
	cr_assert_eq(d.c.n_failed, 4);
	for (uint32_t i = 0; i < 4; i++)
		cr_assert_eq(d.failed[i], dst[i]);
	for (uint32_t i = 0; i < 4; i++)
		assert_holds(r, dst[i], CT_CANARY, "nothing copied for a request of the dead loader");
	cr_assert_eq(ct_stat(&env, "loader.0", KVR_STAT_XF_BLOCKS), 0);
	cr_assert_eq(ct_lookup(r, 3, tokens, 64), 4);
	load_ok(r, 3, dst, 4, env.lane_bytes);
	for (uint32_t i = 0; i < 4; i++)
		assert_holds(r, dst[i], TAG(6, i), "after the loader restarted");
}

struct lookup_call {
	struct kvr_client *c;
	const uint32_t *tokens;
	int rc;
	struct kvr_lookup_result res;
};

static void *lookup_thread(void *arg)
{
	struct lookup_call *l = arg;
	l->rc = kvr_lookup(l->c, 9, l->tokens, 64, NULL, 0, &l->res);
	return NULL;
}

Test(client, lookup_killed_mid_lookup)
{
	ct_start(&env, &ct_tiny, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	uint32_t tokens[64], dst[4] = {4, 5, 6, 7};
	store_four(r, tokens);

	pid_t lp = ct_actor_pid(&env, "lookup");
	ct_stop_process(lp);
	struct lookup_call call = {.c = r->c, .tokens = tokens, .rc = 1};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, lookup_thread, &call), 0);
	bool sent = H_WAIT(kvr_ring_count(ct_ring(&env, "lookup.req.0")) == 2, 2000);
	uint64_t t0 = kvr_now_ns();
	(void)kill(lp, SIGKILL);
	pthread_join(th, NULL);
	uint64_t ms = (kvr_now_ns() - t0) / 1000000;
	cr_assert(sent, "the 4 keys (2 LOOKUP messages) were not sent");
	cr_assert_eq(call.rc, -EPIPE, "lookup returned %d: %s", call.rc, kvr_last_error(r->c));
	cr_assert(strstr(kvr_last_error(r->c), "restarted"), "%s", kvr_last_error(r->c));
	cr_assert(ms < 5000, "failed after %llu ms", (unsigned long long)ms);
	cr_assert_eq(kvr_load(r->c, 9, dst, 4), -ENOENT, "a failed lookup leaves nothing to load");

	ct_wait_ready(&env, "lookup", lp, 5000);
	cr_assert(h_log_contains(&env.h, "index rebuilt from the slot table: 4 blocks (4 visible)"));
	cr_assert_eq(ct_lookup(r, 10, tokens, 64), 4, "committed blocks survive the restart");
	load_ok(r, 10, dst, 4, env.lane_bytes);
	for (uint32_t i = 0; i < 4; i++)
		assert_holds(r, dst[i], TAG(6, i), "after the lookup actor restarted");
	/* and new stores commit through the new incarnation */
	uint32_t t2[32], src2[2] = {8, 9}, dst2[2] = {10, 11};
	ct_prompt(t2, 32, 66);
	ct_fill(r, 8, TAG(66, 0));
	ct_fill(r, 9, TAG(66, 1));
	store_ok(r, 11, t2, 32, src2, 2, 2, 0, env.lane_bytes);
	cr_assert_eq(ct_lookup(r, 12, t2, 32), 2);
	load_ok(r, 12, dst2, 2, env.lane_bytes);
	assert_holds(r, 10, TAG(66, 0), "new store");
	assert_holds(r, 11, TAG(66, 1), "new store");
}

/*
 * The lookup actor dies with a request of ours and its successor answers that request
 * before the client reads: the client (in a child process, stopped meanwhile) must still
 * see -EPIPE. The child attaches, stores 4 blocks, then on "go" runs one kvr_lookup and
 * writes its return value back.
 */
Test(client, lookup_restarted_before_client_reads)
{
	ct_start(&env, &ct_tiny, NULL);
	int to_child[2], from_child[2];
	cr_assert_eq(pipe(to_child), 0);
	cr_assert_eq(pipe(from_child), 0);
	pid_t child = fork();
	cr_assert(child >= 0);
	if (child == 0) {
		struct kvr_geometry g;
		int val = kvr_geometry_fill_vllm_layer_major(&g, 2, 2, 16, 2, 16, 16);
		int kv = memfd_create("ct-child-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		struct kvr_client *c = NULL;
		uint32_t tokens[64], src[4] = {0, 1, 2, 3};
		ct_prompt(tokens, 64, 6);
		if (!val && (kv < 0 || ftruncate(kv, (off_t)kvr_geometry_kv_extent(&g)) < 0))
			val = -errno;
		struct kvr_attach_opts o = {.socket = env.h.sock, .geometry = &g, .kv_fd = kv,
					    .kv_bytes = kvr_geometry_kv_extent(&g), .timeout_ms = 5000};
		if (!val)
			val = kvr_attach(&o, &c);
		if (!val)
			val = kvr_store(c, 1, tokens, 64, NULL, 0, src, 4);
		struct kvr_completion done;
		if (!val)
			val = kvr_wait(c, &done, 1, 5000) == 1 && done.status == 0 && done.n_stored == 4 ? 0 : -EIO;
		char go;
		if (write(from_child[1], &val, sizeof(val)) != sizeof(val) || val ||
		    read(to_child[0], &go, 1) != 1)
			_exit(1);
		struct kvr_lookup_result res;
		val = kvr_lookup(c, 2, tokens, 64, NULL, 0, &res);
		if (write(from_child[1], &val, sizeof(val)) != sizeof(val))
			_exit(1);
		for (;;)
			pause();
	}
	ct_track_child(child);
	close(to_child[0]);
	close(from_child[1]);
	struct pollfd pf = {.fd = from_child[0], .events = POLLIN};
	int val = -1;
	cr_assert_eq(poll(&pf, 1, 8000), 1);
	cr_assert_eq(read(from_child[0], &val, sizeof(val)), (ssize_t)sizeof(val));
	cr_assert_eq(val, 0, "child setup: %d", val);

	pid_t lp = ct_actor_pid(&env, "lookup");
	ct_stop_process(lp);
	cr_assert_eq(write(to_child[1], "g", 1), 1);
	struct kvr_ring *req = ct_ring(&env, "lookup.req.0"), *rep = ct_ring(&env, "lookup.rep.0");
	cr_assert(H_WAIT(kvr_ring_count(req) == 2, 2000), "the child's LOOKUP was not sent");
	ct_stop_process(child);
	cr_assert_eq(kill(lp, SIGKILL), 0);
	ct_wait_ready(&env, "lookup", lp, 5000);
	cr_assert(H_WAIT(kvr_ring_count(req) == 0 && kvr_ring_count(rep) > 0, 3000), "the new lookup did not answer");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_STALE), 1);
	cr_assert_eq(kill(child, SIGCONT), 0);
	cr_assert_eq(poll(&pf, 1, 8000), 1);
	cr_assert_eq(read(from_child[0], &val, sizeof(val)), (ssize_t)sizeof(val));
	cr_assert_eq(val, -EPIPE, "kvr_lookup returned %d (%s)", val, strerror(-val));
	close(to_child[1]);
	close(from_child[0]);
}

/* ---- 7. bad inputs: the specific errno, and the instance keeps serving ------------------- */

Test(client, bad_inputs_rejected)
{
	struct ct_opts o = {.max_workers = 4};
	ct_start(&env, &ct_tiny_tp2, &o);
	struct ct_rank *r0, *r1, *bad;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r0), 0);
	cr_assert_eq(ct_rank_open(&env, 1, 16, 0, &r1), 0);

	/* attach: geometry mismatch, rank taken */
	cr_assert_eq(ct_rank_open(&env, 0, 16, 32, &bad), -EINVAL);
	cr_assert(strstr(kvr_last_error(NULL), "head_dim 32"), "reason: %s", kvr_last_error(NULL));
	cr_assert(strstr(kvr_last_error(NULL), "16"), "reason: %s", kvr_last_error(NULL));
	cr_assert_eq(ct_rank_open(&env, 1, 16, 0, &bad), -EEXIST);
	cr_assert(strstr(kvr_last_error(NULL), "already attached"), "%s", kvr_last_error(NULL));

	uint32_t tokens[48], src[2] = {0, 1}, dst[2] = {6, 7};
	ct_prompt(tokens, 48, 8);
	for (uint32_t i = 0; i < 2; i++) {
		ct_fill(r0, src[i], TAG(8, i));
		ct_fill(r1, src[i], TAG(8, i));
	}
	/* load without lookup */
	cr_assert_eq(kvr_load(r0->c, 1, dst, 2), -ENOENT);
	cr_assert(strstr(kvr_last_error(r0->c), "lookup first"), "%s", kvr_last_error(r0->c));
	/* block ids out of range */
	uint32_t far[2] = {0, 16};
	cr_assert_eq(kvr_store(r0->c, 2, tokens, 32, NULL, 0, far, 2), -ERANGE);
	cr_assert(strstr(kvr_last_error(r0->c), "block id 16"), "%s", kvr_last_error(r0->c));
	/* tokens vs block ids: 40 tokens are 2 whole blocks of 16 */
	uint32_t three[3] = {0, 1, 2};
	cr_assert_eq(kvr_store(r0->c, 3, tokens, 40, NULL, 0, three, 3), -EINVAL);
	cr_assert_eq(kvr_store(r0->c, 3, tokens, 40, NULL, 0, three, 1), -EINVAL);
	cr_assert_eq(kvr_store(r0->c, 3, tokens, 15, NULL, 0, three, 0), -EINVAL, "less than a block");
	cr_assert_eq(kvr_inflight(r0->c), 0, "nothing was submitted");

	store_ok(r0, 4, tokens, 40, src, 2, 2, 0, env.lane_bytes);
	store_ok(r1, 4, tokens, 40, src, 2, 2, 0, env.lane_bytes);
	cr_assert_eq(ct_lookup(r0, 5, tokens, 40), 2);
	cr_assert_eq(kvr_load(r0->c, 5, far, 2), -ERANGE);
	cr_assert_eq(kvr_load(r0->c, 5, dst, 3), -ERANGE, "more blocks than matched");
	load_ok(r0, 5, dst, 2, env.lane_bytes); /* the refused loads left the lookup usable */

	/* malformed messages on lookup.req.0 (its producer, the rank-0 client, is idle) */
	struct kvr_ring *lreq = ct_ring(&env, "lookup.req.0");
	uint64_t rej0 = atomic_load(&lreq->shm->rejected), mal0 = ct_stat(&env, "lookup", KVR_STAT_MALFORMED);
	struct kvr_msg m;
	kvr_msg_build(&m, 99, 0, 1, 0, NULL, 0); /* unknown type */
	cr_assert_eq(kvr_ring_try_enqueue(lreq, &m), 0);
	kvr_key k2[2] = {{1, 2}, {3, 4}};
	kvr_msg_build_list(&m, KVR_MSG_LOOKUP, 2, 0, 0, 0, k2, 2);
	m.hdr.body_len = 24; /* says 2 keys, carries 1 */
	cr_assert_eq(kvr_ring_try_enqueue(lreq, &m), 0);
	kvr_msg_build_list(&m, KVR_MSG_LOOKUP, 3, 0, 0, 0, k2, 2);
	m.hdr.flags |= KVR_MSGF_MORE; /* claims more follows although the list is complete */
	cr_assert_eq(kvr_ring_try_enqueue(lreq, &m), 0);
	cr_assert(H_WAIT(atomic_load(&lreq->shm->rejected) == rej0 + 3, 2000), "rejected %llu, want %llu",
		  (unsigned long long)atomic_load(&lreq->shm->rejected), (unsigned long long)(rej0 + 3));
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_MALFORMED), mal0 + 3);
	cr_assert_eq(ct_lookup(r0, 6, tokens, 40), 2, "the next real lookup works");

	/* a store the client would refuse, sent straight to storer.0: it checks for itself */
	struct kvr_ring *sreq = ct_ring(&env, "store.req.0"), *srep = ct_ring(&env, "store.rep.0");
	kvr_key keys[2];
	ct_keys(&env, tokens, 32, keys);
	struct kvr_msg_store_item items[2] = {{{keys[0].lo, keys[0].hi}, 0}, {{keys[1].lo, keys[1].hi}, 16}};
	uint64_t wire = ((uint64_t)(ct_actor_gen(&env, "storer.0") & 0xffff) << 48) | 0x123;
	cr_assert_eq(kvr_list_send(sreq, KVR_MSG_STORE, wire, 0, items, 2, kvr_now_ns() + 1000000000ull), 0);
	cr_assert_eq(ct_recv_msg(srep, wire, &m, 3000), 0);
	struct kvr_msg_store_done sd;
	cr_assert_eq(kvr_msg_decode_store_done(&m, &sd), 0);
	cr_assert_eq(sd.status, -ERANGE);
	cr_assert_eq(sd.n_failed, 2);
	uint32_t failed[2];
	cr_assert_eq(ct_recv_list(srep, KVR_MSG_BLOCKS, wire, failed, 2, 3000), 2);
	cr_assert_eq(failed[0], 0);
	cr_assert_eq(failed[1], 16);
	/* a load naming block 16, straight to loader.0: that block fails, the other loads */
	int s0 = ct_find_slot(&env, keys[0], 0), s1 = ct_find_slot(&env, keys[1], 0);
	cr_assert(s0 >= 0 && s1 >= 0);
	struct kvr_msg_load_item li[2] = {{(uint32_t)s0, kvr_slot_epoch(env.slots, (uint32_t)s0), 9},
					  {(uint32_t)s1, kvr_slot_epoch(env.slots, (uint32_t)s1), 16}};
	struct kvr_ring *ldq = ct_ring(&env, "load.req.0"), *ldp = ct_ring(&env, "load.rep.0");
	wire = ((uint64_t)(ct_actor_gen(&env, "loader.0") & 0xffff) << 48) | 0x124;
	cr_assert_eq(kvr_list_send(ldq, KVR_MSG_LOAD, wire, 0, li, 2, kvr_now_ns() + 1000000000ull), 0);
	cr_assert_eq(ct_recv_msg(ldp, wire, &m, 3000), 0);
	struct kvr_msg_load_done ld;
	cr_assert_eq(kvr_msg_decode_load_done(&m, &ld), 0);
	cr_assert_eq(ld.status, -EIO);
	cr_assert_eq(ld.n_failed, 1);
	cr_assert_eq(ld.bytes, env.lane_bytes);
	cr_assert_eq(ct_recv_list(ldp, KVR_MSG_BLOCKS, wire, failed, 2, 3000), 1);
	cr_assert_eq(failed[0], 16);
	assert_holds(r0, 9, TAG(8, 0), "the valid block of the injected load");

	/* the other worker was served all along, and rank 0 still is */
	cr_assert_eq(ct_lookup(r1, 7, tokens, 40), 2);
	load_ok(r1, 7, dst, 2, env.lane_bytes);
	cr_assert_eq(ct_lookup(r0, 8, tokens, 40), 2);
	uint32_t dst0[2] = {12, 13};
	load_ok(r0, 8, dst0, 2, env.lane_bytes);
	for (uint32_t i = 0; i < 2; i++) {
		assert_holds(r0, dst[i], TAG(8, i), "rank 0");
		assert_holds(r0, dst0[i], TAG(8, i), "rank 0");
		assert_holds(r1, dst[i], TAG(8, i), "rank 1");
	}
	cr_assert_eq(atomic_load(&kvr_ctl_actor(env.h.ctl, 0)->state), KVR_ACTOR_READY);
	for (unsigned i = 0; i < atomic_load(&env.h.ctl->n_actors); i++)
		cr_assert_eq(kvr_ctl_actor(env.h.ctl, i)->restarts, 0, "%s died", kvr_ctl_actor(env.h.ctl, i)->name);
}

/* ---- 8. drain: SIGTERM lets a pending store reach L1 ----------------------------------- */

/* A store sits unread in its storer's ring (storer stopped) when kvringd gets SIGTERM. The
 * drain must wait for it: once the storer runs again the store completes, every block
 * stored, and only then does kvringd stop its actors and exit 0. */
Test(client, sigterm_drains_a_pending_store)
{
	const uint32_t bt = 16, n = 6;
	ct_start(&env, &ct_tiny, NULL);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	uint32_t tokens[6 * 16], blocks[6];
	ct_prompt(tokens, n * bt, 77);
	for (uint32_t i = 0; i < n; i++) {
		blocks[i] = i;
		ct_fill(r, i, TAG(77, i));
	}
	pid_t storer = ct_actor_pid(&env, "storer.0");
	ct_stop_process(storer);
	cr_assert_eq(kvr_store(r->c, 1, tokens, n * bt, NULL, 0, blocks, n), 0, "%s", kvr_last_error(r->c));
	cr_assert_eq(kill(env.h.pid, SIGTERM), 0);
	/* draining: the store is still in the ring, so kvringd must not stop anything yet */
	cr_assert(H_WAIT(atomic_load(&env.h.ctl->state) == KVR_INST_DRAINING, 2000), "not draining");
	usleep(300 * 1000);
	cr_assert_eq(atomic_load(&env.h.ctl->state), KVR_INST_DRAINING, "drain did not wait for the store");
	cr_assert_eq(waitpid(env.h.pid, NULL, WNOHANG), 0, "kvringd exited with a store pending");
	cr_assert_eq(kill(storer, SIGCONT), 0);

	struct ct_done d;
	ct_wait_done(r, &d, 5000);
	cr_assert_eq(d.c.op, KVR_OP_STORE_DONE);
	cr_assert_eq(d.c.status, 0, "store during drain: %d", d.c.status);
	cr_assert_eq(d.c.n_stored, n);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), n, "the blocks reached L1 before the stop");
	ct_rank_close(r);
	int st = h_wait_exit(env.h.pid, 10000);
	cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvringd exit status %d", st);
	env.h.pid = 0;
}
