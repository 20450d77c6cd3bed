/* The gather actor's stage (actors/gather/gather.c: a DCP group's stores) stepped one message, pass or tick at a time over an in-memory control segment, with an injected clock (tests/runtime/step_stage.h). */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "../runtime/step_stage.h"
#include "dcp_test.h"

#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_keys.h"
#include "kvr_list.h"
#include "kvr_time.h"

/*
 * The stage is reached by compiling gather.c into this test (its stage is static; its
 * main() is renamed). No processes: the test builds what kvringd gives a gather actor — a
 * control segment with the group's store rings (store.req.w / store.rep.w of both ranks)
 * and its owner's commit rings (commit.req.0 / commit.rep.0, rank 0's worker slot), a slot
 * table, an arena, each rank's KV memory (a memfd, the host backend, opened by the real
 * stage_worker_open) and --group 0,1 — and plays the other parties itself:
 *
 *   the ranks' clients   send STOREs on store.req.0 / store.req.1 and read STORE_DONE (and
 *                        its BLOCKS list of failed ids) off store.rep.0 / store.rep.1;
 *   the lookup actor     takes ALLOC / COMMIT / RESET off commit.req.0, allocates and commits
 *                        slots it chooses in the slot table (worker 0 owns them: the group's
 *                        slots are its rank-0 worker's), answers on commit.rep.0 — or not;
 *   the runtime          serves the inputs that are not held (serve(): one message at a
 *                        time, so a hold set by the message before is seen), runs due
 *                        timers and on_pass (step_pass) and on_tick (step_tick) at the
 *                        test's `now`.
 *
 * One thing is not a step: init (stage_store_open) sends a RESET and waits for its answer,
 * so setup answers that one RESET from a helper thread (as tests/storer/test_store_machine.c).
 * The clock starts at the real CLOCK_MONOTONIC (what init read) and only moves ahead of it.
 *
 * Geometry: DCP 2 of TP 2 (one group, lane 0), interleave 2, 16-token canonical blocks: each
 * rank's page of a region holds 8 tokens' rows (1 head x 32 dims x 2 bytes = 64 bytes a row)
 * and a 40-byte opaque tail; 2 layers x (K, V) = 4 regions; pages 24 bytes apart and rank
 * 1's regions at other offsets than rank 0's. The canonical lane is, per region, the 16 rows
 * in global order then rank 0's tail then rank 1's (kvr_dcp.h); the test computes it from
 * that rule alone (bf_owner of dcp_test.h), never with the product's copy plan. Staging:
 * ceiling 8 rank lanes, load_percent 50, one block a lease: a store pool of 4 leases, so
 * the pipe's window is 4 stores.
 */
int gather_actor_main(int argc, char **argv);
#define main gather_actor_main
#include "../../actors/gather/gather.c"
#undef main

#define D 2             /* ranks of the group */
#define IL 2            /* dcp_interleave */
#define BT 16           /* canonical block tokens */
#define RT (BT / D)     /* tokens of a rank's page */
#define LAYERS 2
#define N_REGIONS (2 * LAYERS)
#define HEAD_DIM 32
#define ROW (HEAD_DIM * 2)         /* one token's row: 1 head x 32 dims x 2 bytes */
#define TAIL 40                    /* a rank page's opaque tail */
#define PAGE (RT * ROW + TAIL)     /* a rank's page */
#define STRIDE (PAGE + 24)
#define CANON_PAGE (BT * ROW + D * TAIL)
#define CANON_LANE (N_REGIONS * CANON_PAGE)
#define RANK_LANE (N_REGIONS * PAGE) /* what one rank moves per block */
#define NUM_BLOCKS 32
#define MW 2                       /* worker slots: the group's ranks are workers 0 and 1 */
#define GATHER KVR_ACTOR_IX_GATHER(MW, 0, 0)
#define N_ACTORS (GATHER + 1)
#define N_SLOTS 32
#define MAXN 16                    /* blocks per store in these tests */
#define GEN 1                      /* the gather actor's and the lookup actor's generation */
#define UNTOUCHED 0xa5
#define MS 1000000ull
#define DCP_TIMEOUT_MS 3000        /* dcp.store_timeout_ms here (default 10000) */
#define REP_CAP 16                 /* store.rep.w */

static struct step_env e;
static struct kvr_slot_table *st;
static struct kvr_geometry geom[D];
static int kv_fd[D] = {-1, -1};
static uint8_t *kv[D];
static uint64_t kv_bytes[D];
static struct kvr_ring *sreq[D], *srep[D], *creq, *crep;
static uint64_t now;               /* the injected clock */
static uint64_t lc_ns, dcp_ns, reply_ns;
static uint64_t seq = 1;

/* ---- the instance --------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* DCP rank r of the group (TP rank r of TP 2): its pages hold RT tokens' rows + the tail. */
static struct kvr_geometry rank_geometry(unsigned r)
{
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, LAYERS, 1, HEAD_DIM, 2, RT, NUM_BLOCKS), 0);
	g.block_tokens = BT;
	g.tp_size = D;
	g.tp_rank = r;
	g.dcp_size = D;
	g.dcp_rank = r;
	g.dcp_interleave = IL;
	for (unsigned i = 0; i < N_REGIONS; i++) {
		/* rank 1's regions start elsewhere: each rank's copy reads its own geometry */
		struct kvr_region reg = {.offset = 64 * r + (uint64_t)i * (NUM_BLOCKS * STRIDE + 8), .stride = STRIDE,
					 .page_bytes = PAGE, .sem_bytes = RT * ROW};
		cr_assert_eq(kvr_geometry_set_region(&g, i, &reg), 0);
	}
	char err[KVR_GEOM_ERR_MAX];
	cr_assert_eq(kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), err, sizeof(err)), 0, "%s", err);
	return g;
}

/* stage_store_open's RESET, answered by the lookup actor's stand-in. */
struct reset_answer {
	int rc;
	struct kvr_msg req;
};

static void *answer_open_reset(void *arg)
{
	struct reset_answer *ra = arg;
	ra->rc = kvr_ring_dequeue(creq, &ra->req, 10000 * (int64_t)MS);
	if (ra->rc)
		return NULL;
	struct kvr_msg_commit_rep r = {0};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_COMMIT_REP, 0, ra->req.hdr.req_id, 0, &r, sizeof(r));
	ra->rc = kvr_ring_enqueue(crep, &m, 10000 * (int64_t)MS);
	return NULL;
}

static struct kvr_ring *ring_w(const char *fmt, unsigned w)
{
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), fmt, w);
	return step_ring(&e, name);
}

static void setup(void)
{
	step_spec_ctl(&e, GATHER, "gather.0");
	for (unsigned w = 0; w < D; w++) {
		step_spec(&e, 64, KVR_EP_CLIENT(w), GATHER, KVR_RING_STORE_REQ, w);
		step_spec(&e, REP_CAP, GATHER, KVR_EP_CLIENT(w), KVR_RING_STORE_REP, w);
	}
	step_spec(&e, 64, GATHER, KVR_ACTOR_IX_LOOKUP, KVR_RING_COMMIT_REQ, 0);
	step_spec(&e, 256, KVR_ACTOR_IX_LOOKUP, GATHER, KVR_RING_COMMIT_REP, 0);
	now = kvr_now_ns();
	step_build(&e, "gather.0", N_ACTORS, MW, GATHER, KVR_ACTOR_GATHER, now);
	atomic_store(&e.act.ent->generation, GEN);
	kvr_ctl_actor(e.act.ctl, KVR_ACTOR_IX_LOOKUP)->kind = KVR_ACTOR_LOOKUP;
	atomic_store(&kvr_ctl_actor(e.act.ctl, KVR_ACTOR_IX_LOOKUP)->generation, GEN);

	for (unsigned r = 0; r < D; r++) {
		geom[r] = rank_geometry(r);
		memcpy(kvr_ctl_worker_geometry(e.act.ctl, r), &geom[r], sizeof(geom[r]));
		cr_assert_eq(kvr_geometry_lane_bytes(&geom[r]), RANK_LANE);
		cr_assert_eq(kvr_dcp_lane(&geom[r]), 0, "the group stores lane 0");
		/* the rank's KV memory: every 8-byte word distinct across both ranks, so a row or a
		 * tail copied from the wrong rank, block, region or offset cannot compare equal */
		kv_bytes[r] = (kvr_geometry_kv_extent(&geom[r]) + 7) & ~7ull;
		kv_fd[r] = memfd_create("kvr-gather-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		cr_assert_geq(kv_fd[r], 0);
		cr_assert_eq(ftruncate(kv_fd[r], (off_t)kv_bytes[r]), 0);
		kv[r] = mmap(NULL, kv_bytes[r], PROT_READ | PROT_WRITE, MAP_SHARED, kv_fd[r], 0);
		cr_assert_neq(kv[r], MAP_FAILED);
		for (uint64_t i = 0; i < kv_bytes[r] / 8; i++)
			((uint64_t *)kv[r])[i] = splitmix(i ^ ((uint64_t)(r + 1) << 40));
		e.act.kv_fds[r] = kv_fd[r];
		e.act.kv_sizes[r] = kv_bytes[r];
		e.act.group[r] = r;
	}
	e.act.n_kv = D;
	e.act.n_group = D;
	cr_assert_eq(kvr_dcp_canonical_lane_bytes(&geom[0]), CANON_LANE);

	e.act.cfg.staging.ceiling_bytes = 8 * RANK_LANE;
	e.act.cfg.staging.load_percent = 50;
	e.act.cfg.staging.buffer_bytes = 0; /* a lease is one block */
	e.act.cfg.dcp.store_timeout_ms = DCP_TIMEOUT_MS;
	lc_ns = kvr_ms_to_ns(e.act.cfg.timeouts.lookup_call_ms);
	dcp_ns = kvr_ms_to_ns(DCP_TIMEOUT_MS);
	reply_ns = kvr_ms_to_ns(e.act.cfg.timeouts.reply_ms);
	cr_assert_lt(dcp_ns, lc_ns, "the tests tell the group's wait from the lookup actor's");
	st = step_slots(&e, N_SLOTS, CANON_LANE, 1, 1);
	step_arena(&e, UNTOUCHED);
	for (unsigned r = 0; r < D; r++) {
		sreq[r] = ring_w(KVR_RING_STORE_REQ, r);
		srep[r] = ring_w(KVR_RING_STORE_REP, r);
	}
	creq = ring_w(KVR_RING_COMMIT_REQ, 0);
	crep = ring_w(KVR_RING_COMMIT_REP, 0);
	(void)unsetenv("KVRING_STORE_DEPTH");
	(void)unsetenv("KVRING_TEST_STORE_HOLD");

	pthread_t th;
	struct reset_answer ra = {0};
	cr_assert_eq(pthread_create(&th, NULL, answer_open_reset, &ra), 0);
	e.stage = &gather_stage;
	int rc = gather_stage.init(&e.act);
	cr_assert_eq(pthread_join(th, NULL), 0);
	e.inited = true; /* fini frees what a failed init left */
	cr_assert_eq(rc, 0, "gather init: %s", strerror(-rc));
	cr_assert_eq(ra.rc, 0);
	cr_assert_eq(ra.req.hdr.type, KVR_MSG_RESET, "init resets the owner's lane first");
	cr_assert_eq(kvr_ring_count(creq), 0);
	cr_assert_eq(kvr_ring_count(crep), 0, "its answer was taken");
	struct gather *g = e.act.data;
	cr_assert_eq(g->d, D);
	cr_assert(g->pipe_open);
	cr_assert_eq(g->pipe.depth, 4);
	cr_assert_eq(g->pipe.n_ranks, D);
	cr_assert(!g->pipe.can_hold, "no L2: the lookup actor never holds an ALLOC");
	cr_assert_eq(g->ss.lane, 0);
	cr_assert_eq(g->timeout_ns, dcp_ns);
}

static void teardown(void)
{
	/* a test that failed half-way may leave stores in flight: fini waits for the lookup
	 * actor at most lookup_call_ms, and for a full reply ring at most reply_ms */
	e.act.cfg.timeouts.lookup_call_ms = 100;
	e.act.cfg.timeouts.reply_ms = 10;
	bool closed0 = e.act.n_kv > 0; /* step_close closes kv_fds[0] */
	step_close(&e);
	for (unsigned r = 0; r < D; r++) {
		if (kv[r] && kv[r] != MAP_FAILED)
			(void)munmap(kv[r], kv_bytes[r]);
		kv[r] = NULL;
		if (kv_fd[r] >= 0 && !(r == 0 && closed0))
			(void)close(kv_fd[r]);
		kv_fd[r] = -1;
	}
	st = NULL;
}

TestSuite(gather_stage, .init = setup, .fini = teardown, .timeout = 30);

static struct gather *gat(void)
{
	return e.act.data;
}

static uint64_t stat(unsigned s)
{
	return step_stat(&e, s);
}

static uint32_t held(void)
{
	return atomic_load(&e.act.ent->held);
}

/* Whether input ring r is held (kvr_actor_hold_input): the loop does not serve it. */
static bool input_held(const struct kvr_ring *r)
{
	for (unsigned i = 0; i < e.act.n_inputs; i++)
		if (e.act.inputs[i].ring == r)
			return e.act.inputs[i].held;
	cr_assert_fail("%s is not an input", r->shm->name);
	return false;
}

/* ---- the runtime ---------------------------------------------------------------------- */

/* Serve every input that is not held, as the loop does at `now` (message by message: a
 * hold the previous message set is seen at once). Returns the messages handled. */
static unsigned serve(void)
{
	e.act.now_ns = now;
	unsigned n = 0;
	for (unsigned i = 0; i < e.act.n_inputs; i++)
		while (!e.act.inputs[i].held && kvr_ring_count(e.act.inputs[i].ring)) {
			cr_assert_eq(step_msg(&e, e.act.inputs[i].ring), 0, "a message of %s rejected",
				     e.act.inputs[i].ring->shm->name);
			n++;
		}
	return n;
}

/* One message of ring r (not held) at `now`. */
static void serve_one(struct kvr_ring *r)
{
	cr_assert(!input_held(r));
	e.act.now_ns = now;
	cr_assert_eq(step_msg(&e, r), 0);
}

/* One pass at `now`: due timers, on_pass. */
static int pass(void)
{
	return step_pass(&e, now);
}

/* The inputs, then a pass. */
static int loop_once(void)
{
	(void)serve();
	return pass();
}

static void tick(void)
{
	step_tick(&e, now);
}

/* ---- the ranks' clients --------------------------------------------------------------- */

struct store {
	uint64_t wire[D];
	uint32_t n;
	struct kvr_msg_store_item items[D][MAXN];
};
static struct store S[8];

static kvr_key key_of(unsigned p, unsigned i)
{
	uint64_t in[2] = {p, i};
	return kvr_key_hash(in, sizeof(in));
}

/* Engine block of rank r for position i of a store whose blocks start at b0: the ranks'
 * engines number their blocks differently, so each rank's copy must read its own. */
static uint32_t block_of(uint32_t b0, unsigned r, uint32_t i)
{
	return (b0 + 3 * i + 7 * r) % NUM_BLOCKS;
}

/* Store p: n blocks, the keys of prompt kp from key k0 on, engine blocks from b0. */
static void define_store(unsigned p, unsigned kp, uint32_t k0, uint32_t n, uint32_t b0)
{
	struct store *s = &S[p];
	cr_assert_leq(n, MAXN);
	s->n = n;
	for (unsigned r = 0; r < D; r++)
		for (uint32_t i = 0; i < n; i++) {
			kvr_key k = key_of(kp, k0 + i);
			s->items[r][i] = (struct kvr_msg_store_item){.key = {k.lo, k.hi}, .block = block_of(b0, r, i)};
		}
}

/* Rank r's client sends store p (n items of it) addressed to generation gen: its wire id. */
static uint64_t send_store_n(unsigned r, unsigned p, uint32_t n, uint32_t gen)
{
	uint64_t wire = kvr_wire_make(gen, seq++);
	S[p].wire[r] = wire;
	cr_assert_eq(kvr_list_send(sreq[r], KVR_MSG_STORE, wire, 0, S[p].items[r], n, 0), 0);
	return wire;
}

static void send_store(unsigned r, unsigned p)
{
	(void)send_store_n(r, p, S[p].n, GEN);
}

struct done {
	uint64_t wire;
	struct kvr_msg_store_done d;
	uint32_t failed[MAXN];
};

/* The next STORE_DONE on rank r's store.rep (and its failed block ids); false when none. */
static bool take_done(unsigned r, struct done *ret)
{
	struct kvr_msg m;
	if (kvr_ring_try_dequeue(srep[r], &m))
		return false;
	cr_assert_eq(m.hdr.type, KVR_MSG_STORE_DONE, "rank %u got a %s", r, kvr_msg_type_name(m.hdr.type));
	cr_assert_eq(kvr_msg_decode_store_done(&m, &ret->d), 0);
	ret->wire = m.hdr.req_id;
	cr_assert_eq(!!(m.hdr.flags & KVR_MSGF_ERROR), ret->d.status != 0);
	if (!ret->d.n_failed)
		return true;
	struct kvr_list_asm l;
	kvr_list_asm_init(&l, KVR_MSG_BLOCKS);
	int fed;
	do {
		cr_assert_eq(kvr_ring_try_dequeue(srep[r], &m), 0, "the failed ids follow at once");
		fed = kvr_list_feed(&l, &m);
	} while (fed == 0);
	cr_assert_eq(fed, 1);
	cr_assert_eq(l.req_id, ret->wire);
	cr_assert_eq(l.total, ret->d.n_failed);
	cr_assert_leq(l.total, MAXN);
	memcpy(ret->failed, l.items, l.total * sizeof(uint32_t));
	kvr_list_asm_free(&l);
	return true;
}

/* Rank r's answer to store p comes next: status, counts; failed: every block of its (all)
 * or none. A stored block moved RANK_LANE bytes of this rank. */
static void expect_done(unsigned r, unsigned p, int status, uint32_t stored, uint32_t present, bool all_failed)
{
	struct done d;
	cr_assert(take_done(r, &d), "rank %u: store %u answered", r, p);
	cr_assert_eq(d.wire, S[p].wire[r], "rank %u: answer %llx, expected store %u's (%llx)", r,
		     (unsigned long long)d.wire, p, (unsigned long long)S[p].wire[r]);
	cr_assert_eq(d.d.status, status, "rank %u store %u: status %d, expected %d", r, p, d.d.status, status);
	cr_assert_eq(d.d.n_blocks, S[p].n);
	cr_assert_eq(d.d.n_stored, stored, "rank %u store %u: %u stored", r, p, d.d.n_stored);
	cr_assert_eq(d.d.n_present, present);
	cr_assert_eq(d.d.n_failed, all_failed ? S[p].n : 0, "rank %u store %u: %u failed", r, p, d.d.n_failed);
	for (uint32_t k = 0; all_failed && k < S[p].n; k++)
		cr_assert_eq(d.failed[k], S[p].items[r][k].block, "rank %u store %u: failed id %u is its own block", r, p, k);
	cr_assert_eq(d.d.bytes, (uint64_t)stored * RANK_LANE, "rank %u copied its shard of each stored block", r);
}

static void expect_no_done(unsigned r, const char *why)
{
	cr_assert_eq(kvr_ring_count(srep[r]), 0, "no answer for rank %u (%s)", r, why);
}

/* ---- the lookup actor ----------------------------------------------------------------- */

struct lk_req {
	unsigned type;
	uint64_t id;
	uint8_t lane;
	uint32_t n;
	kvr_key keys[MAXN];              /* ALLOC */
	struct kvr_msg_slot slots[MAXN]; /* COMMIT */
};

/* The next whole request on commit.req.0; false when the ring is empty. */
static bool next_req(struct lk_req *r)
{
	struct kvr_msg m;
	if (kvr_ring_try_dequeue(creq, &m))
		return false;
	memset(r, 0, sizeof(*r));
	r->type = m.hdr.type;
	r->id = m.hdr.req_id;
	if (m.hdr.type == KVR_MSG_RESET) {
		cr_assert_eq(kvr_msg_decode_reset(&m), 0);
		return true;
	}
	cr_assert(m.hdr.type == KVR_MSG_ALLOC || m.hdr.type == KVR_MSG_COMMIT, "the lookup actor got a %s",
		  kvr_msg_type_name(m.hdr.type));
	struct kvr_list_asm l;
	kvr_list_asm_init(&l, m.hdr.type);
	int fed;
	while ((fed = kvr_list_feed(&l, &m)) == 0)
		cr_assert_eq(kvr_ring_try_dequeue(creq, &m), 0, "a list cut short in the ring");
	cr_assert_eq(fed, 1);
	cr_assert_leq(l.total, MAXN);
	r->n = l.total;
	r->lane = l.lane;
	if (r->type == KVR_MSG_ALLOC)
		memcpy(r->keys, l.items, l.total * sizeof(kvr_key));
	else
		memcpy(r->slots, l.items, l.total * sizeof(struct kvr_msg_slot));
	kvr_list_asm_free(&l);
	return true;
}

static struct lk_req expect_req(unsigned type)
{
	struct lk_req r;
	cr_assert(next_req(&r), "a %s was sent", kvr_msg_type_name(type));
	cr_assert_eq(r.type, type, "sent a %s, expected a %s", kvr_msg_type_name(r.type), kvr_msg_type_name(type));
	return r;
}

static void expect_no_req(const char *why)
{
	cr_assert_eq(kvr_ring_count(creq), 0, "nothing sent to the lookup actor (%s)", why);
}

/* One ALLOC for store p: its keys (the same in every rank's STORE) in order, on lane 0. */
static struct lk_req expect_alloc(unsigned p)
{
	struct lk_req r = expect_req(KVR_MSG_ALLOC);
	cr_assert_eq(r.n, S[p].n, "ALLOC of store %u", p);
	cr_assert_eq(r.lane, 0);
	for (uint32_t k = 0; k < r.n; k++)
		cr_assert(r.keys[k].lo == S[p].items[0][k].key.lo && r.keys[k].hi == S[p].items[0][k].key.hi,
			  "ALLOC of store %u: key %u", p, k);
	return r;
}

static void send_list(unsigned type, uint64_t id, uint8_t lane, const void *items, uint32_t n)
{
	for (uint32_t seq_ = 0, done = 0; done < n; seq_++) {
		struct kvr_msg m;
		unsigned k = kvr_msg_build_list(&m, type, id, seq_, lane, 0, items, n);
		cr_assert_gt(k, 0);
		done += k;
		cr_assert_eq(kvr_ring_try_enqueue(crep, &m), 0);
	}
}

static void send_commit_rep(uint64_t id, uint32_t committed)
{
	struct kvr_msg_commit_rep r = {.status = 0, .n_committed = committed, .n_visible = committed};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_COMMIT_REP, 0, id, 0, &r, sizeof(r));
	cr_assert_eq(kvr_ring_try_enqueue(crep, &m), 0);
}

/* Answer ALLOC r: slot_for[k] is the slot chosen for key k (allocated WRITING for worker 0,
 * the group's owner, on the lane: its new epoch in the answer), or KVR_SLOT_PRESENT /
 * KVR_SLOT_NOROOM. ret (may be NULL) gets the answer. */
static void answer_alloc(const struct lk_req *r, const uint32_t *slot_for, struct kvr_msg_slot *ret)
{
	struct kvr_msg_slot out[MAXN];
	for (uint32_t k = 0; k < r->n; k++) {
		out[k] = (struct kvr_msg_slot){.slot = slot_for[k], .epoch = 0};
		if (slot_for[k] < N_SLOTS)
			cr_assert_eq(kvr_slot_alloc(st, slot_for[k], r->keys[k], r->lane, 0, &out[k].epoch), 0,
				     "slot %u was free", slot_for[k]);
	}
	send_list(KVR_MSG_ALLOC_REP, r->id, r->lane, out, r->n);
	if (ret)
		memcpy(ret, out, r->n * sizeof(*out));
}

/* COMMIT r: every (slot, epoch) WRITING under that epoch becomes COMMITTED. */
static void answer_commit(const struct lk_req *r)
{
	uint32_t c = 0;
	for (uint32_t k = 0; k < r->n; k++)
		if (kvr_slot_commit(st, r->slots[k].slot, r->slots[k].epoch) == 0)
			c++;
	send_commit_rep(r->id, c);
}

/* RESET: abort every WRITING slot of worker 0. Returns how many. */
static unsigned answer_reset(const struct lk_req *r)
{
	unsigned n = 0;
	for (uint32_t s = 0; s < N_SLOTS; s++)
		if (kvr_slot_state(st, s) == KVR_SLOT_WRITING && kvr_slot_at(st, s)->owner == 0) {
			cr_assert_eq(kvr_slot_abort(st, s, kvr_slot_epoch(st, s)), 0);
			n++;
		}
	send_commit_rep(r->id, 0);
	return n;
}

/* ---- what the slots hold -------------------------------------------------------------- */

/*
 * The canonical lane of the block whose rank-r shard is engine block blk[r], from the
 * layout's definition alone: per region, global token t's row is the row of local token j
 * of rank bf_owner(t) (j: the tokens of that rank before t), then each rank's tail in rank
 * order.
 */
static void canonical_lane(uint8_t *out, const uint32_t *blk)
{
	uint64_t at = 0;
	for (unsigned i = 0; i < N_REGIONS; i++) {
		uint32_t local[D] = {0};
		for (uint32_t t = 0; t < BT; t++) {
			int o = bf_owner(t, D, IL);
			struct kvr_region g = kvr_geometry_region(&geom[o], i);
			memcpy(out + at, kv[o] + g.offset + (uint64_t)blk[o] * g.stride + (uint64_t)local[o]++ * ROW, ROW);
			at += ROW;
		}
		for (unsigned r = 0; r < D; r++) {
			cr_assert_eq(local[r], RT, "rank %u holds %u tokens of a block", r, RT);
			struct kvr_region g = kvr_geometry_region(&geom[r], i);
			memcpy(out + at, kv[r] + g.offset + (uint64_t)blk[r] * g.stride + RT * ROW, TAIL);
			at += TAIL;
		}
	}
	cr_assert_eq(at, CANON_LANE);
}

/* Slot `slot` holds position i of store p: the canonical lane of its ranks' blocks, byte for
 * byte, and nothing was written past it. */
static void assert_slot_holds(uint32_t slot, unsigned p, uint32_t i)
{
	uint32_t blk[D];
	for (unsigned r = 0; r < D; r++)
		blk[r] = S[p].items[r][i].block;
	static uint8_t want[CANON_LANE];
	canonical_lane(want, blk);
	const uint8_t *d = kvr_slot_data(st, e.act.arena_seg.base, slot);
	cr_assert_not_null(d);
	for (uint64_t b = 0; b < CANON_LANE; b++)
		if (d[b] != want[b])
			cr_assert_fail("slot %u (store %u block %u): byte %llu (region %llu, offset %llu) is %#x, the canonical "
				       "lane has %#x", slot, p, i, (unsigned long long)b, (unsigned long long)(b / CANON_PAGE),
				       (unsigned long long)(b % CANON_PAGE), d[b], want[b]);
	for (uint64_t b = CANON_LANE; b < st->slot_bytes; b++)
		if (d[b] != UNTOUCHED)
			cr_assert_fail("slot %u: byte %llu past the canonical lane was written", slot, (unsigned long long)b);
}

static void assert_slot_untouched(uint32_t slot)
{
	const uint8_t *d = kvr_slot_data(st, e.act.arena_seg.base, slot);
	for (uint64_t b = 0; b < st->slot_bytes; b++)
		if (d[b] != UNTOUCHED)
			cr_assert_fail("slot %u byte %llu was written", slot, (unsigned long long)b);
}

static unsigned count_state(uint32_t state)
{
	unsigned n = 0;
	for (uint32_t s = 0; s < N_SLOTS; s++)
		n += kvr_slot_state(st, s) == state;
	return n;
}

/* Only FREE and COMMITTED slots (`committed` of them), no pin on any. */
static void assert_slot_table(unsigned committed)
{
	cr_assert_eq(count_state(KVR_SLOT_COMMITTED), committed, "%u slots COMMITTED", count_state(KVR_SLOT_COMMITTED));
	cr_assert_eq(count_state(KVR_SLOT_FREE), N_SLOTS - committed, "the rest FREE: nothing WRITING, EVICTING, DRAINING");
	for (uint32_t s = 0; s < N_SLOTS; s++)
		cr_assert_eq(kvr_slot_pins(st, s), 0, "slot %u pinned", s);
}

/* The stage is empty and quiet: nothing waits for its group, for the lookup actor or for a
 * reader; no input held; nothing more to say. */
static void assert_quiet(void)
{
	struct gather *g = gat();
	for (unsigned r = 0; r < D; r++) {
		cr_assert_eq(g->r[r].n, 0, "rank %u: nothing waits for its group", r);
		cr_assert(!kvr_outbox_pending(&g->r[r].st.out), "rank %u: no answer waits for room", r);
		cr_assert(!input_held(sreq[r]));
		expect_no_done(r, "quiet");
	}
	cr_assert_eq(stage_store_pipe_pending(&g->pipe), 0);
	cr_assert(!kvr_outbox_pending(&g->pipe.out));
	cr_assert_eq(held(), 0);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 0);
	cr_assert_eq(pass(), KVR_PASS_IDLE);
	expect_no_req("quiet");
	cr_assert_eq(stat(KVR_STAT_MALFORMED), 0);
}

/* ---- 1. a group of two stores: the canonical lane, byte for byte ----------------------- */

/*
 * Rank 0's STORE of 5 blocks (3 messages) arrives first and waits for its group: held for
 * the drain, no ALLOC. Rank 1's STORE of the same keys (its own engine block ids) completes
 * the group: one ALLOC of the 5 keys on the group's lane, one copy of both ranks' shards
 * into the 5 slots the lookup actor chose, one COMMIT. Each slot then holds the canonical
 * lane — per region the 16 rows in global token order, interleaved from the two ranks two
 * tokens at a time, then rank 0's tail, then rank 1's — and both ranks are answered with
 * the same counts (5 stored) and each its own bytes. A second store shares two keys with
 * the first: the lookup actor answers them PRESENT, only the other two are copied, and both
 * ranks hear 2 stored, 2 present.
 */
Test(gather_stage, two_ranks_store_the_canonical_lane_byte_for_byte)
{
	static const uint32_t slots0[5] = {9, 2, 14, 5, 27};
	define_store(0, 0, 0, 5, 1);
	send_store(0, 0);
	cr_assert_eq(kvr_ring_count(sreq[0]), 3, "5 items: 3 messages");
	cr_assert_eq(serve(), 3);
	cr_assert_eq(gat()->r[0].n, 1, "rank 0's store waits for rank 1's");
	cr_assert_eq(held(), 1, "held for kvringd's drain");
	cr_assert_eq(pass(), KVR_PASS_IDLE);
	expect_no_req("nothing is allocated for half a group");
	expect_no_done(0, "its group is not complete");

	now += MS;
	send_store(1, 0);
	cr_assert_eq(serve(), 3);
	cr_assert_eq(gat()->r[0].n + gat()->r[1].n, 0, "matched: out of the queues");
	cr_assert_eq(stage_store_pipe_pending(&gat()->pipe), 1, "one job for the group");
	cr_assert_eq(held(), 1);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 1);
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req a = expect_alloc(0);
	expect_no_req("one ALLOC for both ranks");

	struct kvr_msg_slot given[5];
	answer_alloc(&a, slots0, given);
	now += MS;
	cr_assert_eq(serve(), 1, "the ALLOC_REP: 5 slots, one message");
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req c = expect_req(KVR_MSG_COMMIT);
	expect_no_req("one COMMIT");
	cr_assert_eq(c.n, 5);
	for (unsigned k = 0; k < 5; k++) {
		cr_assert_eq(c.slots[k].slot, given[k].slot, "commits the slots it was given, in key order");
		cr_assert_eq(c.slots[k].epoch, given[k].epoch);
		cr_assert_eq(kvr_slot_state(st, slots0[k]), KVR_SLOT_WRITING, "not visible before its COMMIT");
		assert_slot_holds(slots0[k], 0, k);
	}
	expect_no_done(0, "not committed");
	expect_no_done(1, "not committed");
	cr_assert_eq(stat(KVR_STAT_XF_CHUNKS), 5 * D, "one lease a block, for each rank");

	answer_commit(&c);
	now += MS;
	cr_assert_eq(serve(), 1);
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	for (unsigned r = 0; r < D; r++)
		expect_done(r, 0, 0, 5, 0, false);
	for (unsigned k = 0; k < 5; k++) {
		cr_assert_eq(kvr_slot_state(st, slots0[k]), KVR_SLOT_COMMITTED);
		assert_slot_holds(slots0[k], 0, k);
	}
	for (uint32_t s = 0; s < N_SLOTS; s++)
		if (s != 9 && s != 2 && s != 14 && s != 5 && s != 27)
			assert_slot_untouched(s);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 2, "one answer a rank");
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 5, "a canonical block counts once");
	cr_assert_eq(stat(KVR_STAT_XF_BYTES), 5ull * D * RANK_LANE, "each rank's shards");
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 0);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT_MAX), 1);
	assert_quiet();

	/* suffix-only: keys 3 and 4 are stored (PRESENT), keys 5 and 6 are new */
	static const uint32_t slots1[4] = {KVR_SLOT_PRESENT, KVR_SLOT_PRESENT, 30, 0};
	define_store(1, 0, 3, 4, 12);
	send_store(1, 1);
	send_store(0, 1);
	now += MS;
	e.act.now_ns = now;
	cr_assert_eq(step_msgs(&e, sreq[1]), 2, "rank 1's arrives first this time");
	cr_assert_eq(gat()->r[1].n, 1);
	cr_assert_eq(serve(), 2);
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	a = expect_alloc(1);
	answer_alloc(&a, slots1, NULL);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	c = expect_req(KVR_MSG_COMMIT);
	cr_assert_eq(c.n, 2, "only the two new blocks");
	cr_assert_eq(c.slots[0].slot, 30);
	cr_assert_eq(c.slots[1].slot, 0);
	answer_commit(&c);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	for (unsigned r = 0; r < D; r++)
		expect_done(r, 1, 0, 2, 2, false);
	assert_slot_holds(30, 1, 2);
	assert_slot_holds(0, 1, 3);
	for (unsigned k = 0; k < 5; k++)
		assert_slot_holds(slots0[k], 0, k); /* the PRESENT blocks were not copied again */
	assert_slot_table(7);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 4);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 7);
	cr_assert_eq(stat(KVR_STAT_XF_PRESENT_BLOCKS), 2);
	cr_assert_eq(stat(KVR_STAT_XF_BYTES), 7ull * D * RANK_LANE);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 0);
	cr_assert_eq(stat(KVR_STAT_XF_CHUNKS), 7 * D);
	cr_assert_eq(stat(KVR_STAT_MSGS_IN), 3 + 3 + 1 + 1 + 2 + 2 + 1 + 1, "every message taken counted");
	assert_quiet();
}

/*
 * The ranks need not send in the same order: rank 0 sends A then B, rank 1 B then A. Each
 * rank's B is paired with the other's B (same keys), not with whatever came second, and a
 * group's store goes to the pipe as soon as its last rank's STORE is in: B (complete when
 * rank 1's first STORE arrives) is allocated first, A after it. Each slot holds the
 * canonical lane of its own store's blocks.
 */
Test(gather_stage, stores_are_paired_by_keys_not_by_arrival)
{
	static const uint32_t sa[2] = {3, 4}, sb[3] = {10, 11, 12};
	define_store(0, 1, 0, 2, 0);  /* A */
	define_store(1, 2, 0, 3, 20); /* B */
	send_store(0, 0);
	send_store(0, 1);
	send_store(1, 1);
	send_store(1, 0);
	e.act.now_ns = now;
	cr_assert_eq(step_msgs(&e, sreq[0]), 1 + 2, "rank 0's A and B");
	cr_assert_eq(gat()->r[0].n, 2, "A and B of rank 0 wait");
	serve_one(sreq[1]); /* rank 1's B: 3 items, 2 messages */
	serve_one(sreq[1]);
	cr_assert_eq(gat()->r[0].n, 1, "B paired, A waits");
	cr_assert_eq(stage_store_pipe_pending(&gat()->pipe), 1);
	serve_one(sreq[1]); /* rank 1's A */
	cr_assert_eq(gat()->r[0].n + gat()->r[1].n, 0);
	cr_assert_eq(stage_store_pipe_pending(&gat()->pipe), 2);
	cr_assert_eq(held(), 2);
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req b = expect_alloc(1);
	expect_no_req("one ALLOC outstanding at a time");
	answer_alloc(&b, sb, NULL);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req a = expect_alloc(0); /* A's ALLOC before B's copy and COMMIT */
	struct lk_req cb = expect_req(KVR_MSG_COMMIT);
	cr_assert_eq(cb.n, 3);
	answer_alloc(&a, sa, NULL);
	answer_commit(&cb);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req ca = expect_req(KVR_MSG_COMMIT);
	cr_assert_eq(ca.n, 2);
	answer_commit(&ca);
	(void)serve();
	(void)pass();
	for (unsigned r = 0; r < D; r++) {
		expect_done(r, 1, 0, 3, 0, false);
		expect_done(r, 0, 0, 2, 0, false);
	}
	for (unsigned k = 0; k < 2; k++)
		assert_slot_holds(sa[k], 0, k);
	for (unsigned k = 0; k < 3; k++)
		assert_slot_holds(sb[k], 1, k);
	assert_slot_table(5);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 4);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 5);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT_MAX), 2);
	assert_quiet();
}

/* ---- 2. an ALLOC the lookup actor never answers ---------------------------------------- */

/*
 * The group's store 0 is matched and its ALLOC taken, never answered. Until the deadline
 * (timeouts.lookup_call_ms after the ALLOC went out, store_path.h) the stage goes on
 * serving its ranks: store 1 of both ranks is accepted behind it (no second ALLOC: one at a
 * time), a STORE addressed to a previous incarnation is answered -ESTALE at once, and a
 * store of rank 0 that rank 1 never sends fails at dcp.store_timeout_ms (its own wait) —
 * while store 0 waits on. 1 ns before the deadline nothing of store 0 moves; at it store 0
 * fails -ETIMEDOUT for both ranks (every block of each listed), a RESET goes out and store
 * 1's ALLOC behind it; store 1 then completes. Nothing was allocated for store 0, nothing
 * stays WRITING.
 */
Test(gather_stage, an_alloc_never_answered_fails_the_group_at_lookup_call_ms_while_the_rest_is_served)
{
	uint64_t t0 = now;
	define_store(0, 0, 0, 2, 1);
	define_store(1, 1, 0, 3, 5);
	define_store(2, 2, 0, 1, 9);  /* rank 0 only */
	define_store(3, 3, 0, 2, 12); /* rank 1, to a dead incarnation */
	send_store(0, 0);
	send_store(1, 0);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	(void)expect_alloc(0); /* taken, never answered */

	now = t0 + 1 * MS;
	send_store(0, 1);
	send_store(1, 1);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_IDLE, "nothing moves without an answer");
	expect_no_req("store 1 waits behind store 0's ALLOC");
	cr_assert_eq(stage_store_pipe_pending(&gat()->pipe), 2);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 2);

	now = t0 + 2 * MS;
	send_store(0, 2);
	(void)send_store_n(1, 3, S[3].n, GEN + 1);
	(void)serve();
	expect_done(1, 3, -ESTALE, 0, 0, true);
	expect_no_done(0, "store 2 waits for rank 1");
	cr_assert_eq(held(), 3, "two jobs, one store waiting for its group");

	now = t0 + 2 * MS + dcp_ns - 1;
	tick();
	(void)pass();
	expect_no_done(0, "store 2 is not overdue");
	now = t0 + 2 * MS + dcp_ns;
	tick();
	(void)pass();
	expect_done(0, 2, -ETIMEDOUT, 0, 0, true);
	expect_no_done(0, "store 0 still waits for the lookup actor");
	expect_no_done(1, "store 0 still waits for the lookup actor");
	cr_assert_eq(held(), 2);
	expect_no_req("no RESET, no ALLOC yet");

	now = t0 + lc_ns - 1;
	tick();
	cr_assert_eq(pass(), KVR_PASS_IDLE);
	for (unsigned r = 0; r < D; r++)
		expect_no_done(r, "1 ns before the deadline");
	expect_no_req("1 ns before the deadline");

	now = t0 + lc_ns;
	cr_assert_eq(pass(), KVR_PASS_MOVED, "the deadline's timer fails store 0");
	cr_assert_eq(count_state(KVR_SLOT_WRITING), 0);
	for (unsigned r = 0; r < D; r++) {
		expect_done(r, 0, -ETIMEDOUT, 0, 0, true);
		expect_no_done(r, "store 1 is not done");
	}
	struct lk_req reset = expect_req(KVR_MSG_RESET);
	struct lk_req a1 = expect_alloc(1);
	expect_no_req("a RESET, then store 1's ALLOC");
	cr_assert_eq(answer_reset(&reset), 0, "nothing was allocated for store 0");
	static const uint32_t s1[3] = {7, 8, 31};
	answer_alloc(&a1, s1, NULL);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req c1 = expect_req(KVR_MSG_COMMIT);
	answer_commit(&c1);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	for (unsigned r = 0; r < D; r++)
		expect_done(r, 1, 0, 3, 0, false);
	for (unsigned k = 0; k < 3; k++)
		assert_slot_holds(s1[k], 1, k);
	assert_slot_table(3);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 1 + 1 + D + D, "stale, store 2, store 0 and 1 for each rank");
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 2 + 1 + 2 * D);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 3);
	cr_assert_eq(stat(KVR_STAT_XF_BYTES), 3ull * D * RANK_LANE);
	cr_assert_eq(stat(KVR_STAT_XF_FENCED), 0);
	assert_quiet();
}

/* ---- 3. a rank that does not read its replies ------------------------------------------ */

static unsigned fill_ring(struct kvr_ring *r, uint32_t room)
{
	return step_fill_ring(r, room, KVR_MSG_PING);
}

static void drain_fillers(struct kvr_ring *r, unsigned n)
{
	step_drain_fillers(r, n, KVR_MSG_PING);
}

/* One store of the group, allocated into slots[] and committed; the answers left to the
 * caller. */
static void store_through(unsigned p, const uint32_t *slots)
{
	send_store(0, p);
	send_store(1, p);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req a = expect_alloc(p);
	answer_alloc(&a, slots, NULL);
	(void)serve();
	(void)pass();
	struct lk_req c = expect_req(KVR_MSG_COMMIT);
	answer_commit(&c);
	(void)serve();
	cr_assert_eq(pass(), KVR_PASS_MOVED);
}

/*
 * Rank 1's client stops reading store.rep.1 and it fills. The group goes on: store 0 is
 * allocated, copied and committed, rank 0 gets its STORE_DONE, rank 1's waits in its
 * outbox (a reply never waits for room) and the pass says WAITING; store 1 goes through
 * the same way behind it. Once rank 1's client reads again the next pass delivers both
 * answers, in order.
 */
Test(gather_stage, a_full_reply_ring_of_one_rank_holds_up_only_its_answers)
{
	static const uint32_t s0[2] = {12, 13}, s1[2] = {14, 15};
	define_store(0, 0, 0, 2, 2);
	define_store(1, 1, 0, 2, 6);
	unsigned fill = fill_ring(srep[1], 0);
	store_through(0, s0);
	expect_done(0, 0, 0, 2, 0, false);
	cr_assert_eq(gat()->r[1].st.out.n, 1, "rank 1's STORE_DONE waits in its outbox");
	cr_assert_eq(kvr_ring_count(srep[1]), fill, "none of it in the full ring");
	now += MS;
	cr_assert_eq(pass(), KVR_PASS_WAITING, "an answer waits for room");
	cr_assert_eq(held(), 0, "nothing of the group's is held but an answer");

	now += MS;
	store_through(1, s1);
	expect_done(0, 1, 0, 2, 0, false);
	cr_assert_eq(gat()->r[1].st.out.n, 2, "both of rank 1's answers wait");
	for (unsigned k = 0; k < 2; k++) {
		assert_slot_holds(s0[k], 0, k);
		assert_slot_holds(s1[k], 1, k);
	}
	assert_slot_table(4);

	now += MS;
	drain_fillers(srep[1], fill);
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	cr_assert_eq(gat()->r[1].st.out.n, 0);
	expect_done(1, 0, 0, 2, 0, false);
	expect_done(1, 1, 0, 2, 0, false);
	cr_assert_eq(gat()->r[1].st.out.queued, 2, "2 messages waited in the outbox");
	cr_assert_eq(gat()->r[1].st.out.dropped, 0);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 4);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 4);
	assert_quiet();
}

/*
 * Rank 1's client does not read for timeouts.reply_ms (on the stage's clock): its queued
 * answer is dropped (its own call timed out long before, docs of stage_worker_pass), the
 * stage goes on, and the next answer reaches the client once it reads again.
 */
Test(gather_stage, an_answer_its_rank_does_not_read_for_reply_ms_is_dropped)
{
	static const uint32_t s0[1] = {1}, s1[1] = {2};
	define_store(0, 0, 0, 1, 3);
	define_store(1, 1, 0, 1, 4);
	unsigned fill = fill_ring(srep[1], 0);
	store_through(0, s0);
	expect_done(0, 0, 0, 1, 0, false);
	cr_assert_eq(gat()->r[1].st.out.n, 1);
	uint64_t queued = now;
	now = queued + reply_ns;
	cr_assert_eq(pass(), KVR_PASS_WAITING, "reply_ms, not more: still waiting");
	cr_assert_eq(gat()->r[1].st.out.n, 1);
	now = queued + reply_ns + 1;
	(void)pass();
	cr_assert_eq(gat()->r[1].st.out.n, 0);
	cr_assert_eq(gat()->r[1].st.out.dropped, 1);

	store_through(1, s1);
	expect_done(0, 1, 0, 1, 0, false);
	cr_assert_eq(gat()->r[1].st.out.n, 1, "the ring is still full");
	drain_fillers(srep[1], fill);
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	expect_done(1, 1, 0, 1, 0, false); /* store 0's answer is gone */
	assert_slot_holds(1, 0, 0);
	assert_slot_holds(2, 1, 0);
	assert_slot_table(2);
	cr_assert_eq(gat()->r[1].st.out.dropped, 1);
	cr_assert_eq(gat()->r[0].st.out.dropped, 0);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 4, "the dropped answer was given (and counted)");
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 2);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 0);
	assert_quiet();
}

/* ---- 4. a rank's store that does not come (or does not match) -------------------------- */

/*
 * Rank 0 stores 3 blocks; rank 1 never sends that store. Nothing is allocated for half a
 * group: no ALLOC, no slot touched. The store waits dcp.store_timeout_ms from its arrival
 * (on the stage's clock): 1 ns before, the tick leaves it; at it, rank 0 is answered
 * -ETIMEDOUT with every block of its listed. Rank 1's copy of the same store arriving
 * later does not pair with the answered one: it waits, and fails, on its own.
 */
Test(gather_stage, a_store_whose_partner_never_arrives_fails_at_store_timeout_ms)
{
	uint64_t t0 = now;
	define_store(0, 0, 0, 3, 0);
	send_store(0, 0);
	(void)loop_once();
	cr_assert_eq(held(), 1);
	expect_no_req("half a group allocates nothing");
	now = t0 + dcp_ns - 1;
	tick();
	(void)pass();
	expect_no_done(0, "1 ns before store_timeout_ms");
	cr_assert_eq(held(), 1);
	now = t0 + dcp_ns;
	tick();
	expect_done(0, 0, -ETIMEDOUT, 0, 0, true);
	cr_assert_eq(held(), 0, "answered: no longer held");
	cr_assert_eq(gat()->r[0].n, 0);
	expect_no_done(1, "rank 1 sent nothing");

	uint64_t t1 = now + MS;
	now = t1;
	send_store(1, 0);
	(void)loop_once();
	cr_assert_eq(gat()->r[1].n, 1, "rank 1's late store waits alone");
	expect_no_req("still half a group");
	now = t1 + dcp_ns;
	tick();
	expect_done(1, 0, -ETIMEDOUT, 0, 0, true);
	expect_no_done(0, "rank 0 was answered once");
	expect_no_req("nothing was ever allocated");
	for (uint32_t s = 0; s < N_SLOTS; s++)
		assert_slot_untouched(s);
	assert_slot_table(0);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 2);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 6);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 0);
	cr_assert_eq(stat(KVR_STAT_XF_BYTES), 0);
	assert_quiet();
}

/*
 * The ranks' STOREs disagree on the block count (rank 0: keys 0..2, rank 1: keys 0..1, a
 * second later). A group's stores pair only when every rank lists the same keys, so neither
 * pairs: no ALLOC, and each fails -ETIMEDOUT at store_timeout_ms after its own arrival —
 * rank 0's first, rank 1's a second later — with its own block ids.
 */
Test(gather_stage, stores_with_mismatching_block_counts_never_pair_and_each_times_out)
{
	uint64_t t0 = now;
	define_store(0, 0, 0, 3, 0);
	send_store_n(0, 0, 3, GEN);
	(void)loop_once();
	now = t0 + 1000 * MS;
	send_store_n(1, 0, 2, GEN);
	(void)loop_once();
	cr_assert_eq(gat()->r[0].n, 1);
	cr_assert_eq(gat()->r[1].n, 1);
	cr_assert_eq(held(), 2);
	expect_no_req("they do not pair");
	now = t0 + dcp_ns;
	tick();
	expect_done(0, 0, -ETIMEDOUT, 0, 0, true);
	expect_no_done(1, "rank 1's store arrived a second later");
	cr_assert_eq(held(), 1);
	now = t0 + 1000 * MS + dcp_ns - 1;
	tick();
	expect_no_done(1, "1 ns before its own deadline");
	now = t0 + 1000 * MS + dcp_ns;
	tick();
	struct done d;
	cr_assert(take_done(1, &d));
	cr_assert_eq(d.wire, S[0].wire[1]);
	cr_assert_eq(d.d.status, -ETIMEDOUT);
	cr_assert_eq(d.d.n_blocks, 2);
	cr_assert_eq(d.d.n_stored, 0);
	cr_assert_eq(d.d.n_failed, 2);
	for (unsigned k = 0; k < 2; k++)
		cr_assert_eq(d.failed[k], S[0].items[1][k].block);
	expect_no_req("nothing allocated");
	assert_slot_table(0);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 2);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 5);
	assert_quiet();
}

/*
 * The timeout spares a store whose partner is on its way: at store_timeout_ms rank 1's
 * STORE sits unread in store.req.1 (the tick ran before the loop served it), then half
 * assembled (one of its 3 messages taken). Rank 0's store is not failed either time; once
 * rank 1's list is complete the two pair and the group's store is stored as usual.
 */
Test(gather_stage, a_partner_store_on_its_way_is_waited_for_past_the_timeout)
{
	uint64_t t0 = now;
	static const uint32_t slots[5] = {20, 21, 22, 23, 24};
	define_store(0, 0, 0, 5, 2);
	send_store(0, 0);
	(void)loop_once();
	send_store(1, 0);
	cr_assert_eq(kvr_ring_count(sreq[1]), 3);
	now = t0 + dcp_ns;
	tick();
	expect_no_done(0, "rank 1's store is in its ring");
	serve_one(sreq[1]);
	now = t0 + dcp_ns + 50 * MS;
	tick();
	expect_no_done(0, "rank 1's store is half assembled");
	cr_assert_eq(gat()->r[0].n, 1);
	(void)serve();
	cr_assert_eq(gat()->r[0].n, 0, "paired");
	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req a = expect_alloc(0);
	answer_alloc(&a, slots, NULL);
	(void)serve();
	(void)pass();
	struct lk_req c = expect_req(KVR_MSG_COMMIT);
	answer_commit(&c);
	(void)serve();
	(void)pass();
	for (unsigned r = 0; r < D; r++)
		expect_done(r, 0, 0, 5, 0, false);
	for (unsigned k = 0; k < 5; k++)
		assert_slot_holds(slots[k], 0, k);
	assert_slot_table(5);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 2);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 5);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 0, "nothing timed out");
	cr_assert_eq(stat(KVR_STAT_XF_BYTES), 5ull * D * RANK_LANE);
	assert_quiet();
}

/*
 * A store waiting for its group that its client cancels (kvr_cancel: the wire id in the
 * cancel table of its worker's area) is answered -ECANCELED at the next tick, not at
 * store_timeout_ms (gather_tick: the fence), and counted fenced.
 */
Test(gather_stage, a_waiting_store_cancelled_by_its_client_is_answered_at_the_next_tick)
{
	define_store(0, 0, 0, 2, 0);
	uint64_t wire = send_store_n(0, 0, 2, GEN);
	(void)loop_once();
	cr_assert_eq(held(), 1);
	atomic_store(&kvr_ctl_area(e.act.ctl, 0)->cancel[0], wire);
	now += 50 * MS;
	tick();
	expect_done(0, 0, -ECANCELED, 0, 0, true);
	cr_assert_eq(stat(KVR_STAT_XF_FENCED), 1);
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 1);
	cr_assert_eq(stat(KVR_STAT_XF_FAILED_BLOCKS), 2);
	cr_assert_eq(held(), 0);
	atomic_store(&kvr_ctl_area(e.act.ctl, 0)->cancel[0], 0);
	expect_no_req("nothing allocated");
	assert_slot_table(0);
	assert_quiet();
}

/* ---- 5. a full window holds every rank's input ----------------------------------------- */

/*
 * The window is 4 stores (the store pool's leases). The 4th pair fills it: both ranks'
 * store.req are held (kvr_actor_hold_input), so the 5th store of either rank stays in its
 * ring — backpressure on the clients — while commit.rep is still served. When store 0 is
 * answered the window has room, the holds are released, and the 5th store is taken.
 */
Test(gather_stage, a_full_window_holds_every_ranks_requests)
{
	static const uint32_t slots[5][1] = {{0}, {1}, {2}, {3}, {4}};
	for (unsigned p = 0; p < 5; p++)
		define_store(p, p, 0, 1, p);
	for (unsigned p = 0; p < 4; p++) {
		send_store(0, p);
		send_store(1, p);
	}
	(void)serve();
	cr_assert_eq(stage_store_pipe_pending(&gat()->pipe), 4);
	cr_assert(input_held(sreq[0]) && input_held(sreq[1]), "the window is full");
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT), 4);
	send_store(0, 4);
	send_store(1, 4);
	cr_assert_eq(serve(), 0, "held rings are not served");
	cr_assert_eq(kvr_ring_count(sreq[0]), 1);
	cr_assert_eq(kvr_ring_count(sreq[1]), 1);
	cr_assert_eq(held(), 4);

	cr_assert_eq(pass(), KVR_PASS_MOVED);
	struct lk_req a = expect_alloc(0);
	answer_alloc(&a, slots[0], NULL);
	cr_assert_eq(serve(), 1, "commit.rep is served while the store rings are held");
	(void)pass();
	a = expect_alloc(1);
	struct lk_req c = expect_req(KVR_MSG_COMMIT);
	cr_assert(input_held(sreq[0]), "store 0 is not answered yet");
	answer_commit(&c);
	(void)serve();
	(void)pass();
	for (unsigned r = 0; r < D; r++)
		expect_done(r, 0, 0, 1, 0, false);
	cr_assert(!input_held(sreq[0]) && !input_held(sreq[1]), "room again: the holds are released");
	cr_assert_eq(serve(), 2, "the 5th store of each rank");
	cr_assert_eq(stage_store_pipe_pending(&gat()->pipe), 4);
	cr_assert(input_held(sreq[0]), "full again");

	for (unsigned p = 1; p < 5; p++) {
		answer_alloc(&a, slots[p], NULL);
		(void)serve();
		(void)pass();
		if (p < 4)
			a = expect_alloc(p + 1);
		c = expect_req(KVR_MSG_COMMIT);
		answer_commit(&c);
		(void)serve();
		(void)pass();
		for (unsigned r = 0; r < D; r++)
			expect_done(r, p, 0, 1, 0, false);
	}
	for (unsigned p = 0; p < 5; p++)
		assert_slot_holds(slots[p][0], p, 0);
	assert_slot_table(5);
	cr_assert_eq(stat(KVR_STAT_XF_STORES_INFLIGHT_MAX), 4, "never more than the window");
	cr_assert_eq(stat(KVR_STAT_XF_REQUESTS), 10);
	cr_assert_eq(stat(KVR_STAT_XF_BLOCKS), 5);
	assert_quiet();
}
