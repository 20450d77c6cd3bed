/* backlog: the waiting requests of an actor with bounded request slots (kvr_backlog.h). */
#include "kvr_backlog.h"

#include <errno.h>

void kvr_backlog_init(struct kvr_backlog *b, struct kvr_actor *a, struct kvr_ring *in)
{
	b->a = a;
	b->in = in;
	b->head = b->n = 0;
}

int kvr_backlog_offer(struct kvr_backlog *b, const struct kvr_msg *m, kvr_backlog_start_fn start, void *ctx)
{
	if (!b->n && start(ctx, m) != -EAGAIN)
		return 0;
	if (b->n == KVR_BACKLOG_MAX)
		return -ENOSPC;
	b->q[(b->head + b->n) % KVR_BACKLOG_MAX] = *m;
	b->n++;
	(void)kvr_actor_hold_input(b->a, b->in, true);
	return 0;
}

void kvr_backlog_retry(struct kvr_backlog *b, kvr_backlog_start_fn start, void *ctx)
{
	while (b->n) {
		if (start(ctx, &b->q[b->head]) == -EAGAIN)
			return;
		b->head = (b->head + 1) % KVR_BACKLOG_MAX;
		b->n--;
	}
	(void)kvr_actor_hold_input(b->a, b->in, false);
}

bool kvr_backlog_take(struct kvr_backlog *b, struct kvr_msg *ret)
{
	if (!b->n)
		return false;
	*ret = b->q[b->head];
	b->head = (b->head + 1) % KVR_BACKLOG_MAX;
	b->n--;
	if (!b->n)
		(void)kvr_actor_hold_input(b->a, b->in, false);
	return true;
}
