/* loader stage: copy committed L1 slots into one worker's KV blocks (LOAD -> LOAD_DONE). */
#include <errno.h>
#include <stdlib.h>

#include "kvr_actor.h"
#include "kvr_log.h"
#include "load_path.h"

/*
 * One loader per attached worker, a DCP rank's too (it scatters its own tokens out of the
 * canonical lane: supervisor/dcp_groups.c). The load path itself — pin, copy in staging-lease chunks, unpin, name
 * exactly the blocks not restored — is stage_load_feed() (load_path.c, beside this file).
 */

struct loader {
	struct stage_worker sw;
	struct stage_load ld;
};

static int loader_init(struct kvr_actor *a)
{
	struct loader *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	kvr_actor_set_data(a, l);
	stage_load_init(&l->ld);
	int rc = stage_worker_open(a, &l->sw, a->ent->index, a->n_kv ? a->kv_fds[0] : -1, a->kv_sizes[0], "load.req.%u", "load.rep.%u",
				   a->cfg.staging.load_percent);
	if (rc)
		return rc;
	unsigned dropped = stage_drop_pins(&l->sw);
	if (dropped)
		kvr_warn("dropped %u pins left by a previous loader of worker %u", dropped, l->sw.worker);
	return 0;
}

static void loader_fini(struct kvr_actor *a)
{
	struct loader *l = a->data;
	if (!l)
		return;
	stage_worker_close(&l->sw);
	stage_load_fini(&l->ld);
	free(l);
}

static int loader_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct loader *l = a->data;
	if (ring != l->sw.req)
		return -EBADMSG;
	return stage_load_feed(&l->sw, &l->ld, m);
}

static const struct kvr_stage loader_stage = {
	.name = "loader",
	.kind = KVR_ACTOR_LOADER,
	.init = loader_init,
	.on_msg = loader_on_msg,
	.fini = loader_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &loader_stage);
}
