/* kvring-lookup: the prefix-index actor. Placeholder stage: serves health only, rejects data messages. */
#include <errno.h>

#include "kvr_actor.h"
#include "kvr_log.h"

#define LOOKUP_STAT_WORKERS_GONE KVR_STAT_FIRST_STAGE

static int lookup_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct kvr_msg_worker_gone gone;
	if (ring == a->ctl_in && kvr_msg_decode_worker_gone(m, &gone) == 0) {
		kvr_debug("worker %u (generation %u) gone", gone.worker, gone.generation);
		kvr_actor_count(a, LOOKUP_STAT_WORKERS_GONE, 1);
		return 0;
	}
	return -EBADMSG; /* no data message type is served yet: every one is unknown here */
}

static const struct kvr_stage lookup_stage = {
	.name = "lookup",
	.kind = KVR_ACTOR_LOOKUP,
	.on_msg = lookup_on_msg,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &lookup_stage);
}
