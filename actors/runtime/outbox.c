/* kvr_outbox: per-ring FIFO of replies waiting for room (see kvr_outbox.h). */
#include "kvr_outbox.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_log.h"
#include "kvr_time.h"

void kvr_outbox_init(struct kvr_outbox *ob, struct kvr_ring *ring)
{
	memset(ob, 0, sizeof(*ob));
	ob->ring = ring;
}

void kvr_outbox_free(struct kvr_outbox *ob)
{
	free(ob->q);
	memset(ob, 0, sizeof(*ob));
}

static int grow(struct kvr_outbox *ob)
{
	uint32_t cap = ob->cap ? ob->cap * 2 : 64;
	if (cap > KVR_OUTBOX_MAX)
		return -ENOBUFS;
	struct kvr_msg *q = malloc((size_t)cap * sizeof(*q));
	if (!q)
		return -ENOBUFS;
	for (uint32_t i = 0; i < ob->n; i++) /* unwrap into the new array */
		q[i] = ob->q[(ob->head + i) % ob->cap];
	free(ob->q);
	ob->q = q;
	ob->cap = cap;
	ob->head = 0;
	return 0;
}

/* Queue m behind what waits already (the ring had no room for it; or deferred, not
 * counted in queued: it waits for the sender's flush, not for room). */
static int put(struct kvr_outbox *ob, const struct kvr_msg *m, uint64_t now_ns, bool for_room)
{
	if (ob->n == ob->cap && grow(ob)) {
		ob->dropped++;
		return -ENOBUFS;
	}
	if (!ob->n)
		ob->since_ns = now_ns;
	ob->q[(ob->head + ob->n) % ob->cap] = *m;
	ob->n++;
	ob->queued += for_room;
	return 0;
}

static int queue(struct kvr_outbox *ob, const struct kvr_msg *m, uint64_t now_ns)
{
	return put(ob, m, now_ns, true);
}

int kvr_outbox_defer(struct kvr_outbox *ob, const struct kvr_msg *m, uint64_t now_ns)
{
	return put(ob, m, now_ns, false);
}

int kvr_outbox_send(struct kvr_outbox *ob, const struct kvr_msg *m, uint64_t now_ns)
{
	if (!ob->n && kvr_ring_try_enqueue(ob->ring, m) == 0)
		return 0;
	return queue(ob, m, now_ns);
}

#define LIST_BURST 32 /* as kvr_list_send: one publish and at most one wake per burst */

int kvr_outbox_send_list(struct kvr_outbox *ob, unsigned type, uint64_t req_id, uint8_t lane, uint8_t flags,
			 const void *items, uint32_t total, uint64_t now_ns)
{
	int rc = 0;
	uint32_t done = 0, seq = 0;
	while (done < total) {
		struct kvr_msg burst[LIST_BURST];
		unsigned n = 0;
		for (; n < LIST_BURST && done < total; n++, seq++) {
			unsigned k = kvr_msg_build_list(&burst[n], type, req_id, seq, lane, flags, items, total);
			if (!k)
				return -EINVAL;
			done += k;
		}
		unsigned sent = ob->n ? 0 : kvr_ring_enqueue_burst(ob->ring, burst, n);
		for (unsigned i = sent; i < n; i++)
			if (queue(ob, &burst[i], now_ns))
				rc = -ENOBUFS;
	}
	return rc;
}

uint32_t kvr_outbox_clear(struct kvr_outbox *ob)
{
	uint32_t n = ob->n;
	ob->dropped += n;
	ob->n = ob->head = 0;
	ob->since_ns = 0;
	return n;
}

uint32_t kvr_outbox_flush(struct kvr_outbox *ob, uint64_t now_ns, uint64_t timeout_ns)
{
	while (ob->n) {
		/* the queued messages up to the array's end in one burst */
		uint32_t run = ob->cap - ob->head < ob->n ? ob->cap - ob->head : ob->n;
		unsigned sent = kvr_ring_enqueue_burst(ob->ring, &ob->q[ob->head], run);
		if (!sent)
			break;
		ob->head = (ob->head + sent) % ob->cap;
		ob->n -= sent;
		ob->since_ns = now_ns; /* the reader took some: measure its next stall from here */
	}
	if (ob->n && now_ns > ob->since_ns && now_ns - ob->since_ns > timeout_ns) /* a now older than the queueing: not overdue */
		return kvr_outbox_clear(ob);
	return 0;
}

uint32_t kvr_outbox_drain(struct kvr_outbox *ob, uint64_t for_ns)
{
	uint64_t until = kvr_now_ns() + for_ns;
	while (ob->n) {
		uint64_t now = kvr_now_ns();
		if (now >= until)
			return kvr_outbox_clear(ob);
		(void)kvr_outbox_flush(ob, now, UINT64_MAX);
		if (ob->n)
			(void)usleep(1000); /* at exit only: nothing else to serve */
	}
	return 0;
}

bool kvr_outbox_pass(struct kvr_outbox *ob, uint64_t now_ns, uint64_t timeout_ns)
{
	bool first = ob->dropped == 0;
	uint32_t lost = kvr_outbox_flush(ob, now_ns, timeout_ns);
	if (lost && first)
		kvr_warn("%s: %u messages dropped after %llu ms without room; its reader stopped reading (said once)",
			 ob->ring->shm->name, lost, (unsigned long long)(timeout_ns / 1000000ull));
	return kvr_outbox_pending(ob);
}
