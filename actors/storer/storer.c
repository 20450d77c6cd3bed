/* storer stage: copy one worker's finished KV blocks into L1 slots and commit them (STORE -> STORE_DONE). */
#include <errno.h>
#include <stdlib.h>

#include "kvr_actor.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_ring_names.h"
#include "store_path.h"

/*
 * One storer per attached worker (a DCP rank's stores go to its group's gather actor,
 * which needs every rank's shard of a block). A STORE lists (block key, engine block id)
 * pairs of blocks the engine reported final; each complete STORE becomes a job of the
 * store pipe (stage_store_pipe_*, store_pipe.c beside this file): ALLOC, copy, COMMIT,
 * STORE_DONE, driven by this loop — replies of the lookup actor arrive on commit.rep as
 * messages, the pipe moves on in on_pass, and a timer (the slow tick as a fallback) fires
 * deadlines and looks for a restart of the lookup actor while stores wait for it. Up to the pipe's depth (the store pool's leases,
 * at most STAGE_STORE_DEPTH_MAX) stores are in flight; while the window is full the
 * store.req ring is held (its producer sees the backpressure). Commits and answers follow
 * producer order. Jobs accepted and not answered are reported held, so a drain waits for
 * them.
 */

#define STORER_TICK_NS 1000000000ull /* fallback: lookup restarts and overdue answers (the pipe arms a timer) */

struct storer {
	struct stage_worker sw;
	struct stage_store ss;
	struct stage_store_pipe pipe;
	struct kvr_list_asm req;
	bool held; /* store.req held: the window is full */
};

static int storer_init(struct kvr_actor *a)
{
	struct storer *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	kvr_actor_set_data(a, s);
	kvr_list_asm_init(&s->req, KVR_MSG_STORE);
	int rc = stage_worker_open(a, &s->sw, a->ent->index, a->n_kv ? a->kv_fds[0] : -1, a->kv_sizes[0], KVR_RING_STORE_REQ, KVR_RING_STORE_REP,
				   100 - a->cfg.staging.load_percent);
	if (rc)
		return rc;
	stage_populate(&s->sw, true, true, false); /* reads the KV memory, writes the arena */
	rc = stage_store_open(&s->ss, a, s->sw.worker, s->sw.lane);
	if (rc)
		return rc;
	struct stage_worker *sw = &s->sw;
	return stage_store_pipe_open(&s->pipe, &s->ss, &sw, 1);
}

static void storer_fini(struct kvr_actor *a)
{
	struct storer *s = a->data;
	if (!s)
		return;
	stage_store_pipe_close(&s->pipe); /* answers what is left: before the rings go */
	stage_worker_close(&s->sw);
	stage_store_close(&s->ss);
	kvr_list_asm_free(&s->req);
	free(s);
}

static void hold(struct kvr_actor *a, struct storer *s, bool on)
{
	if (s->held == on)
		return;
	s->held = on;
	(void)kvr_actor_hold_input(a, s->sw.req, on);
}

static int storer_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct storer *s = a->data;
	if (ring == s->ss.commit_rep)
		return stage_store_pipe_reply(&s->pipe, m, a->now_ns);
	if (ring != s->sw.req)
		return -EBADMSG;
	int rc = kvr_list_feed(&s->req, m);
	if (rc < 0)
		return -EBADMSG;
	if (rc == 1) {
		struct stage_store_req rq = {.wire = s->req.req_id, .flags = s->req.flags, .first_ns = s->req.first_ns,
					     .n = s->req.total, .items = s->req.items};
		if (stage_store_pipe_submit(&s->pipe, &rq))
			hold(a, s, true); /* the rest of this burst waits behind the window */
	}
	return 0;
}

static int storer_on_pass(struct kvr_actor *a, uint64_t now)
{
	struct storer *s = a->data;
	bool room;
	int rc = stage_store_pipe_pass(&s->pipe, now, &room);
	if (room)
		hold(a, s, false);
	int out = stage_worker_pass(&s->sw, now); /* STORE_DONEs that found store.rep full */
	return out > rc ? out : rc;
}

static void storer_on_tick(struct kvr_actor *a, uint64_t now)
{
	struct storer *s = a->data;
	stage_store_pipe_tick(&s->pipe, now);
}

static const struct kvr_stage storer_stage = {
	.name = "storer",
	.kind = KVR_ACTOR_STORER,
	.tick_ns = STORER_TICK_NS,
	.init = storer_init,
	.on_msg = storer_on_msg,
	.on_tick = storer_on_tick,
	.on_pass = storer_on_pass,
	.fini = storer_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &storer_stage);
}
