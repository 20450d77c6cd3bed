/* kvring-storer: the worker KV -> L1 copy actor. Placeholder stage: serves health only, rejects data messages. */
#include <errno.h>

#include "kvr_actor.h"

static int storer_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	(void)a;
	(void)ring;
	(void)m;
	return -EBADMSG; /* no data message type is served yet: every one is unknown here */
}

static const struct kvr_stage storer_stage = {
	.name = "storer",
	.kind = KVR_ACTOR_STORER,
	.on_msg = storer_on_msg,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &storer_stage);
}
