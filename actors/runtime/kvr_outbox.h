/* kvr_outbox: replies that did not fit in a reader's ring, kept in order and sent as room appears — a sender never blocks on one slow reader. */
#ifndef KVR_OUTBOX_H
#define KVR_OUTBOX_H

#include <stdbool.h>
#include <stdint.h>

#include <kvring/msg.h>

#include "kvr_ring.h"

/*
 * An actor that answers many readers (the lookup actor: every worker and scheduler) must
 * not wait for room in one reader's full ring: every other reader would wait behind it
 * (head-of-line blocking). It sends through one outbox per ring instead:
 *
 *   kvr_outbox_send()    enqueue on the ring when nothing is queued before it and there is
 *                        room; else queue the message in the outbox (in order, in the heap);
 *   kvr_outbox_flush()   (each pass of the actor's loop) move queued messages to the ring
 *                        while there is room; a reader whose oldest queued message waited
 *                        longer than the timeout has stopped reading: everything queued for
 *                        it is dropped and counted (its client has timed out on those
 *                        requests long since).
 *
 * Order is kept per ring: a message never overtakes one queued before it. At most
 * KVR_OUTBOX_MAX messages are queued per ring; beyond that the new message is dropped.
 */

#define KVR_OUTBOX_MAX (1u << 20) /* 64 MiB of messages for one reader */

struct kvr_outbox {
	struct kvr_ring *ring;
	struct kvr_msg *q;     /* circular: n messages from head */
	uint32_t head, n, cap;
	uint64_t since_ns;     /* when the oldest queued message was queued (0: none queued) */
	uint64_t dropped;      /* messages dropped since init */
	uint64_t queued;       /* messages that waited in the outbox since init */
};

void kvr_outbox_init(struct kvr_outbox *ob, struct kvr_ring *ring);
void kvr_outbox_free(struct kvr_outbox *ob);

/* Send or queue m. 0, or -ENOBUFS when it was dropped (outbox full, or out of memory). */
int kvr_outbox_send(struct kvr_outbox *ob, const struct kvr_msg *m, uint64_t now_ns);

/* Queue m behind what waits, without trying the ring: a sender answering a batch defers
 * each answer and flushes once after it (kvr_outbox_flush / kvr_outbox_pass), so its
 * reader is woken once per batch instead of once per answer. 0 or -ENOBUFS (dropped). */
int kvr_outbox_defer(struct kvr_outbox *ob, const struct kvr_msg *m, uint64_t now_ns);

/* A whole list of `total` items (kvr_msg_build_list) through the outbox. 0 or -ENOBUFS
 * (some message of it was dropped: the reader will see an incomplete list and fail it). */
int kvr_outbox_send_list(struct kvr_outbox *ob, unsigned type, uint64_t req_id, uint8_t lane, uint8_t flags,
			 const void *items, uint32_t total, uint64_t now_ns);

/* Move queued messages to the ring while it has room; drop them all when the oldest waited
 * more than timeout_ns. Returns the messages dropped by this call. */
uint32_t kvr_outbox_flush(struct kvr_outbox *ob, uint64_t now_ns, uint64_t timeout_ns);

/* kvr_outbox_flush for an actor's pass: the first drop since init is logged (naming the
 * ring), every drop is in ob->dropped. Returns true while messages wait (KVR_PASS_WAITING). */
bool kvr_outbox_pass(struct kvr_outbox *ob, uint64_t now_ns, uint64_t timeout_ns);

/* At exit (never in the loop: it sleeps): flush until nothing is queued or for_ns passed,
 * then drop the rest. Returns the messages dropped. */
uint32_t kvr_outbox_drain(struct kvr_outbox *ob, uint64_t for_ns);

/* Drop whatever is queued (its reader is gone). Returns how many. */
uint32_t kvr_outbox_clear(struct kvr_outbox *ob);

static inline bool kvr_outbox_pending(const struct kvr_outbox *ob)
{
	return ob->n != 0;
}

#endif
