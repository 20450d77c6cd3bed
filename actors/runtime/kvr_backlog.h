/* kvr_backlog: requests an actor took off its input ring but cannot start yet, kept in arrival order with the input held. */
#ifndef KVR_BACKLOG_H
#define KVR_BACKLOG_H

#include <stdbool.h>

#include "kvr_actor.h"

/*
 * An actor with a bounded number of request slots (the disk actor's I/O slots, the remote
 * actor's requests in flight) takes a burst of messages off its input ring at a time. A
 * request that finds every slot busy waits here, and so does every later one (arrival order
 * is kept); while any waits, the input ring is held (kvr_actor_hold_input): it fills, and a
 * full ring is the producer's backpressure. The completion that frees a slot calls
 * kvr_backlog_retry(), which starts the waiting requests oldest first until one does not fit,
 * and releases the input once none waits.
 *
 * KVR_BACKLOG_MAX exceeds the runtime's burst, so the rest of the burst that filled the slots
 * always fits before the input is held.
 */
#define KVR_BACKLOG_MAX 128u

struct kvr_backlog {
	struct kvr_actor *a;
	struct kvr_ring *in;       /* the input ring held while requests wait */
	struct kvr_msg q[KVR_BACKLOG_MAX];
	unsigned head, n;
};

/* start: 0 when the request was started or answered, -EAGAIN when it does not fit yet. */
typedef int (*kvr_backlog_start_fn)(void *ctx, const struct kvr_msg *m);

void kvr_backlog_init(struct kvr_backlog *b, struct kvr_actor *a, struct kvr_ring *in);

/* A request taken off the input: started with start() unless older ones wait, else queued.
 * -ENOSPC (the request is not kept; the caller rejects it) only if the input was not held
 * in time, which the bound above rules out. */
int kvr_backlog_offer(struct kvr_backlog *b, const struct kvr_msg *m, kvr_backlog_start_fn start, void *ctx);

/* Start waiting requests, oldest first, while they fit; the input is released when none waits. */
void kvr_backlog_retry(struct kvr_backlog *b, kvr_backlog_start_fn start, void *ctx);

/* Take the oldest waiting request (at stop: to answer it as failed). false when none waits. */
bool kvr_backlog_take(struct kvr_backlog *b, struct kvr_msg *ret);

#endif
