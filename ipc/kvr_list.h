/* kvr_list: reassembling streamed list messages and sending lists and results over rings. */
#ifndef KVR_LIST_H
#define KVR_LIST_H

#include <stdbool.h>
#include <stdint.h>

#include <kvring/msg.h>

#include "kvr_ring.h"

/*
 * A receiver keeps one struct kvr_list_asm per (sender, list type). Messages of one
 * request arrive in order on one SPSC ring. kvr_list_feed() validates each message
 * (kvr_msg_decode_list), checks it continues the list in progress (same request id, next
 * seq) and copies its items. A message with seq 0 starts a new list; one that does not
 * continue the list in progress is rejected (-EBADMSG) and the partial list dropped, so a
 * sender that gave up half-way (timeout) cannot corrupt the next request.
 */
struct kvr_list_asm {
	unsigned type;
	uint64_t req_id;
	uint32_t next_seq;
	uint32_t total, got;
	uint8_t lane, flags;
	void *items;          /* total * item size bytes */
	uint32_t cap;         /* items allocated */
	uint64_t first_ns;    /* arrival of seq 0 (CLOCK_MONOTONIC) */
};

void kvr_list_asm_init(struct kvr_list_asm *l, unsigned type);
void kvr_list_asm_free(struct kvr_list_asm *l);

/* Feed one message. Returns 1 when the list is complete (items[0..total) valid until the
 * next feed), 0 when more is expected, -EBADMSG when the message is rejected, -ENOMEM. */
int kvr_list_feed(struct kvr_list_asm *l, const struct kvr_msg *m);

/* Send a whole list of `total` items (total >= 1) as messages of `type`, blocking on a
 * full ring up to deadline_ns (CLOCK_MONOTONIC; 0 = no deadline). 0, -ETIMEDOUT, -EINTR. */
int kvr_list_send(struct kvr_ring *r, unsigned type, uint64_t req_id, uint8_t lane, const void *items,
		  uint32_t total, uint64_t deadline_ns);

/* The same with list flags and a caller's way of sending one message when the ring is
 * full (send_one(ctx, r, m, deadline_ns); NULL = kvr_msg_send): the client uses it to keep
 * draining its reply rings while it waits for room. Messages go in bursts of 32 — one
 * publish, one fence and at most one wake per burst. */
typedef int (*kvr_list_send_one_fn)(void *ctx, struct kvr_ring *r, const struct kvr_msg *m, uint64_t deadline_ns);
int kvr_list_send_ex(struct kvr_ring *r, unsigned type, uint64_t req_id, uint8_t lane, uint8_t flags,
		     const void *items, uint32_t total, uint64_t deadline_ns, kvr_list_send_one_fn send_one, void *ctx);

/* Send one message with the same deadline rule. */
int kvr_msg_send(struct kvr_ring *r, const struct kvr_msg *m, uint64_t deadline_ns);

#endif
