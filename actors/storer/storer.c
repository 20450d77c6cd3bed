/* storer stage: copy one worker's finished KV blocks into L1 slots and commit them (STORE -> STORE_DONE). */
#include <errno.h>
#include <stdlib.h>

#include "kvr_actor.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "stage_common.h"

/*
 * One storer per attached worker (a DCP rank's stores go to its group's gather actor,
 * which needs every rank's shard of a block). A STORE lists (block key, engine block id)
 * pairs of blocks the engine reported final; the store path — ALLOC, copy, COMMIT,
 * STORE_DONE — is stage_store_run() (actors/common/stage_paths.c) with one rank.
 * Requests are handled one after the other, so commits follow producer order.
 */

struct storer {
	struct stage_worker sw;
	struct stage_store ss;
	struct kvr_list_asm req;
};

static int storer_init(struct kvr_actor *a)
{
	struct storer *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	kvr_actor_set_data(a, s);
	kvr_list_asm_init(&s->req, KVR_MSG_STORE);
	int rc = stage_worker_open(a, &s->sw, a->ent->index, a->n_kv ? a->kv_fds[0] : -1, a->kv_sizes[0], "store.req.%u", "store.rep.%u",
				   100 - a->cfg.staging.load_percent);
	if (rc)
		return rc;
	return stage_store_open(&s->ss, a, s->sw.worker, s->sw.lane);
}

static void storer_fini(struct kvr_actor *a)
{
	struct storer *s = a->data;
	if (!s)
		return;
	stage_worker_close(&s->sw);
	stage_store_close(&s->ss);
	kvr_list_asm_free(&s->req);
	free(s);
}

static int storer_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct storer *s = a->data;
	if (ring == s->ss.commit_rep)
		return 0; /* a late reply of a request we gave up on */
	if (ring != s->sw.req)
		return -EBADMSG;
	int rc = kvr_list_feed(&s->req, m);
	if (rc < 0)
		return -EBADMSG;
	if (rc == 1) {
		struct stage_store_req rq = {.wire = s->req.req_id, .flags = s->req.flags, .first_ns = s->req.first_ns,
					     .n = s->req.total, .items = s->req.items};
		struct stage_worker *sw = &s->sw;
		stage_store_run(&s->ss, &sw, &rq, 1);
	}
	return 0;
}

static const struct kvr_stage storer_stage = {
	.name = "storer",
	.kind = KVR_ACTOR_STORER,
	.init = storer_init,
	.on_msg = storer_on_msg,
	.fini = storer_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &storer_stage);
}
