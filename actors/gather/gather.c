/* gather stage: one DCP group's stores — every rank's shard assembled into one canonical block before it is committed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_actor.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "store_path.h"

/*
 * With decode context parallelism a block's tokens are spread over the D ranks of a DCP
 * group (kvr_dcp.h: rank r holds the tokens t with (t / I) mod D == r). kvring stores the
 * canonical block — every token in global order — so that a block stored under one
 * layout loads under another. kvringd starts one gather actor per group once all D ranks
 * attached, and hands it every rank's store rings.
 *
 * Each rank sends its own STORE for the blocks the engine finished; the ranks run the
 * same schedule, so their requests list the same keys. The gather actor queues each
 * rank's request until every rank sent one with the same keys, then hands the group's
 * requests to its store pipe as one job (stage_store_pipe_*, store_pipe.c, D ranks): one
 * slot per block, every rank's rows (and its page tail) copied into their places in the
 * canonical lane — every rank's copies of a chunk submitted before any is reaped — and
 * one commit. No handler waits for the lookup actor or a copy: the pipe moves on in
 * on_pass, its replies arrive on commit.rep as messages, and while the pipe's window is
 * full every rank's store.req is held. A block is never
 * committed with a shard missing (seed 003: a connector that stored rank 0's shard alone
 * served a block with 1/D of its tokens). A request whose partners do not arrive within
 * dcp.store_timeout_ms fails with -ETIMEDOUT, nothing of it stored, and the log names the
 * ranks that did not send it. While requests wait, the actor reports them as held, so a
 * drain waits for them.
 *
 * The split on load needs nothing from the other ranks: each rank's own loader copies its
 * tokens out of the canonical lane (the same kvr_dcp runs; actors/loader/loader.c), so the
 * D ranks' loads run in parallel — one gather thread serving them all measured 0.52x
 * memcpy per rank at D = 4 (docs/benchmarks.md).
 *
 * The copies go straight between each rank's KV memory and the slot, one hop: on the host
 * backend memcpy runs, on CUDA each rank's device copies over its own link.
 */

_Static_assert(KVR_DCP_MAX <= KVR_ACTOR_MAX_KV, "a DCP group fits the actor's KV table");

#define GATHER_QUEUE 64                  /* stores one rank may be ahead of the slowest */
#define GATHER_TICK_NS (50ull * 1000000ull) /* how often waiting stores are checked for expiry */

struct pend {
	struct stage_store_req rq;
	struct kvr_msg_store_item *items; /* owned */
};

struct rank {
	struct stage_worker st; /* its KV memory, store rings and store pool */
	struct kvr_list_asm store_asm;
	struct pend q[GATHER_QUEUE]; /* arrival order */
	unsigned n;
};

struct gather {
	unsigned d;
	struct rank r[KVR_DCP_MAX];
	struct stage_store ss;
	struct stage_store_pipe pipe;
	bool pipe_open;
	bool held;         /* every rank's store.req held: the pipe's window is full */
	uint64_t timeout_ns;
};

/* Requests waiting for their group count as held with the pipe's jobs (a drain waits). */
static void update_held(struct kvr_actor *a, struct gather *g)
{
	unsigned held = 0;
	for (unsigned r = 0; r < g->d; r++)
		held += g->r[r].n;
	if (g->pipe_open)
		stage_store_pipe_set_waiting(&g->pipe, held);
	else
		kvr_actor_set_held(a, held);
}

static void hold(struct kvr_actor *a, struct gather *g, bool on)
{
	if (g->held == on)
		return;
	g->held = on;
	for (unsigned r = 0; r < g->d; r++)
		(void)kvr_actor_hold_input(a, g->r[r].st.req, on);
}

/* Take request i out of rank rk's queue; the caller owns (and frees) its items. */
static struct kvr_msg_store_item *pend_take(struct rank *rk, unsigned i)
{
	struct kvr_msg_store_item *items = rk->q[i].items;
	memmove(&rk->q[i], &rk->q[i + 1], (rk->n - i - 1) * sizeof(rk->q[0]));
	rk->n--;
	return items;
}

/* Answer rank r's request i with status, out of the queue and the held count first: a
 * rank that has its answer never sees its store still held. */
static void pend_fail(struct kvr_actor *a, struct gather *g, unsigned r, unsigned i, int status)
{
	struct rank *rk = &g->r[r];
	struct stage_store_req rq = rk->q[i].rq;
	struct kvr_msg_store_item *owned = pend_take(rk, i);
	update_held(a, g);
	stage_store_fail(&g->ss, &rk->st, &rq, status);
	free(owned);
}

static bool same_keys(const struct pend *a, const struct pend *b)
{
	if (a->rq.n != b->rq.n)
		return false;
	for (uint32_t i = 0; i < a->rq.n; i++)
		if (memcmp(&a->items[i].key, &b->items[i].key, sizeof(a->items[i].key)))
			return false;
	return true;
}

/* The first request of rank rk listing the same keys as p, or -1. */
static int find_same(const struct rank *rk, const struct pend *p)
{
	for (unsigned j = 0; j < rk->n; j++)
		if (same_keys(p, &rk->q[j]))
			return (int)j;
	return -1;
}

/* Hand every store that all ranks sent to the pipe, in rank 0's arrival order. */
static void match(struct kvr_actor *a, struct gather *g)
{
	struct stage_store_req rq[KVR_DCP_MAX];
	unsigned at[KVR_DCP_MAX];
	for (unsigned i = 0; i < g->r[0].n;) {
		const struct pend *p0 = &g->r[0].q[i];
		bool all = true;
		at[0] = i;
		for (unsigned r = 1; r < g->d && all; r++) {
			int j = find_same(&g->r[r], p0);
			all = j >= 0;
			at[r] = (unsigned)j;
		}
		if (!all) {
			i++;
			continue;
		}
		/* out of the queues (and out of the held count) before any rank hears back:
		 * a rank that has its answer never sees its store still held */
		struct kvr_msg_store_item *owned[KVR_DCP_MAX];
		for (unsigned r = 0; r < g->d; r++) {
			rq[r] = g->r[r].q[at[r]].rq;
			owned[r] = pend_take(&g->r[r], at[r]);
		}
		update_held(a, g);
		if (stage_store_pipe_submit(&g->pipe, rq)) /* copies the items */
			hold(a, g, true); /* the rest waits in the rings behind the window */
		for (unsigned r = 0; r < g->d; r++)
			free(owned[r]);
		/* i now names the next request of rank 0 */
	}
	update_held(a, g);
}

/* A rank's STORE is complete: queue it (copying its items) and try to match. */
static void store_arrived(struct kvr_actor *a, struct gather *g, unsigned r)
{
	struct rank *rk = &g->r[r];
	const struct kvr_list_asm *l = &rk->store_asm;
	struct stage_store_req rq = {.wire = l->req_id, .flags = l->flags, .first_ns = l->first_ns, .n = l->total,
				     .items = l->items};
	if (!stage_wire_current(a, rq.wire)) {
		stage_store_fail(&g->ss, &rk->st, &rq, -ESTALE);
		return;
	}
	if (rk->n == GATHER_QUEUE) {
		kvr_warn("DCP rank %u is %u stores ahead of its group: store %llx refused", r, GATHER_QUEUE,
			 (unsigned long long)rq.wire);
		stage_store_fail(&g->ss, &rk->st, &rq, -EBUSY);
		return;
	}
	struct kvr_msg_store_item *items = malloc((rq.n ? rq.n : 1) * sizeof(*items));
	if (!items) {
		stage_store_fail(&g->ss, &rk->st, &rq, -ENOMEM);
		return;
	}
	memcpy(items, l->items, rq.n * sizeof(*items));
	rq.items = items;
	rk->q[rk->n++] = (struct pend){.rq = rq, .items = items};
	match(a, g);
}

/* Whether rank r's next store is on its way (messages unread, or a list half assembled). */
static bool store_arriving(const struct rank *rk)
{
	return kvr_ring_count(rk->st.req) || (rk->store_asm.got && rk->store_asm.got < rk->store_asm.total);
}

static void gather_tick(struct kvr_actor *a, uint64_t now)
{
	struct gather *g = a->data;
	stage_store_pipe_tick(&g->pipe, now); /* the lookup actor's restarts, overdue answers */
	for (unsigned r = 0; r < g->d; r++) {
		struct rank *rk = &g->r[r];
		for (unsigned i = 0; i < rk->n;) {
			const struct pend *p = &rk->q[i];
			char missing[KVR_DCP_MAX * 4] = "";
			size_t off = 0;
			bool arriving = false;
			/* the fence: a store waiting for its group that its rank cancelled (or whose
			 * worker left) is answered now, not when the group's wait times out */
			int frc = stage_fence(&rk->st, p->rq.wire, false);
			if (frc) {
				kvr_actor_count(a, KVR_STAT_XF_FENCED, 1);
				pend_fail(a, g, r, i, frc);
				continue;
			}
			if (now < p->rq.first_ns || now - p->rq.first_ns < g->timeout_ns) { /* arrived after the tick read its clock, or not overdue */
				i++;
				continue;
			}
			for (unsigned o = 0; o < g->d; o++)
				if (o != r && find_same(&g->r[o], p) < 0) {
					off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%u", off ? "," : "", o);
					arriving |= store_arriving(&g->r[o]);
				}
			if (arriving) {
				i++; /* a missing rank's store may be the one still on its way */
				continue;
			}
			kvr_warn("DCP store %llx of rank %u (%u blocks): no matching store from rank(s) %s within %llu ms: "
				 "nothing stored (a canonical block needs every rank's shard)",
				 (unsigned long long)p->rq.wire, r, p->rq.n, missing,
				 (unsigned long long)(g->timeout_ns / 1000000));
			pend_fail(a, g, r, i, -ETIMEDOUT);
		}
	}
}

static int gather_init(struct kvr_actor *a)
{
	struct gather *g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	kvr_actor_set_data(a, g);
	if (a->n_group < 2 || a->n_group > KVR_DCP_MAX || a->n_kv != a->n_group) {
		kvr_err("a gather actor needs its DCP group: --group W,W,... and one --kv-fd/--kv-bytes per worker");
		return -EINVAL;
	}
	g->d = a->n_group;
	g->timeout_ns = (uint64_t)a->cfg.dcp.store_timeout_ms * 1000000ull;
	for (unsigned r = 0; r < g->d; r++)
		kvr_list_asm_init(&g->r[r].store_asm, KVR_MSG_STORE);
	for (unsigned r = 0; r < g->d; r++) {
		struct rank *rk = &g->r[r];
		int rc = stage_worker_open(a, &rk->st, a->group[r], a->kv_fds[r], a->kv_sizes[r], KVR_RING_STORE_REQ,
					   KVR_RING_STORE_REP, 100 - a->cfg.staging.load_percent);
		if (rc)
			return rc;
		stage_populate(&rk->st, r == 0, true, false); /* the arena once; each rank's KV memory */
		const struct kvr_geometry *gr = &rk->st.geom, *g0 = &g->r[0].st.geom;
		if (gr->dcp_size != g->d || gr->dcp_rank != r || gr->dcp_interleave != g0->dcp_interleave ||
		    gr->tp_size != g0->tp_size || rk->st.lane != g->r[0].st.lane) {
			kvr_err("worker %u is not DCP rank %u of this group (dcp_size %u, rank %u, interleave %u, lane %u)",
				a->group[r], r, gr->dcp_size, gr->dcp_rank, gr->dcp_interleave, rk->st.lane);
			return -EINVAL;
		}
	}
	kvr_info("DCP group of %u ranks (interleave %u, lane %u): workers %u..%u", g->d, g->r[0].st.geom.dcp_interleave,
		 g->r[0].st.lane, a->group[0], a->group[g->d - 1]);
	/* the group's allocations go over its rank-0 worker's commit rings (and are its slots
	 * for RESET and WORKER_GONE) */
	int rc = stage_store_open(&g->ss, a, a->group[0], g->r[0].st.lane);
	if (rc)
		return rc;
	struct stage_worker *sw[KVR_DCP_MAX];
	for (unsigned r = 0; r < g->d; r++)
		sw[r] = &g->r[r].st;
	rc = stage_store_pipe_open(&g->pipe, &g->ss, sw, g->d);
	g->pipe_open = rc == 0;
	return rc;
}

static void gather_fini(struct kvr_actor *a)
{
	struct gather *g = a->data;
	if (!g)
		return;
	for (unsigned r = 0; r < g->d; r++) {
		struct rank *rk = &g->r[r];
		while (rk->n) {
			/* stopping (drain timed out, or a rank left): answered, not dropped */
			pend_fail(a, g, r, 0, -ESHUTDOWN);
		}
	}
	if (g->pipe_open)
		stage_store_pipe_close(&g->pipe); /* answers what is left: before the rings go */
	g->pipe_open = false;
	for (unsigned r = 0; r < g->d; r++) {
		stage_worker_close(&g->r[r].st);
		kvr_list_asm_free(&g->r[r].store_asm);
	}
	stage_store_close(&g->ss);
	kvr_actor_set_held(a, 0);
	free(g);
}

static int gather_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct gather *g = a->data;
	if (ring == g->ss.commit_rep)
		return stage_store_pipe_reply(&g->pipe, m, a->now_ns);
	for (unsigned r = 0; r < g->d; r++) {
		struct rank *rk = &g->r[r];
		if (ring == rk->st.req) {
			int rc = kvr_list_feed(&rk->store_asm, m);
			if (rc < 0)
				return -EBADMSG;
			if (m->hdr.seq == 0) /* its arrival on the stage's clock: the one gather_tick's `now` is */
				rk->store_asm.first_ns = kvr_actor_now(a);
			if (rc == 1)
				store_arrived(a, g, r);
			return 0;
		}
	}
	return -EBADMSG;
}

/* The pipe moves on; replies that found a rank's ring full go out as it makes room
 * (stage_worker_pass). */
static int gather_on_pass(struct kvr_actor *a, uint64_t now)
{
	struct gather *g = a->data;
	bool room;
	int pass = stage_store_pipe_pass(&g->pipe, now, &room);
	if (room)
		hold(a, g, false);
	for (unsigned r = 0; r < g->d; r++) {
		int p = stage_worker_pass(&g->r[r].st, now);
		if (p > pass)
			pass = p;
	}
	return pass;
}

static const struct kvr_stage gather_stage = {
	.name = "gather",
	.kind = KVR_ACTOR_GATHER,
	.tick_ns = GATHER_TICK_NS,
	.init = gather_init,
	.on_msg = gather_on_msg,
	.on_tick = gather_tick,
	.on_pass = gather_on_pass,
	.fini = gather_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &gather_stage);
}
