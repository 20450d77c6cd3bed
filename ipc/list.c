/* Streamed list reassembly and sending. */
#include "kvr_list.h"

#include <errno.h>
#include <stdlib.h>

#include "kvr_time.h"

void kvr_list_asm_init(struct kvr_list_asm *l, unsigned type)
{
	*l = (struct kvr_list_asm){.type = type};
}

void kvr_list_asm_free(struct kvr_list_asm *l)
{
	if (!l)
		return;
	free(l->items);
	l->items = NULL;
	l->cap = 0;
}

int kvr_list_feed(struct kvr_list_asm *l, const struct kvr_msg *m)
{
	struct kvr_msg_list_hdr h;
	if (kvr_msg_decode_list(m, l->type, &h))
		goto bad;
	if (m->hdr.seq == 0) {
		if (h.total > l->cap) {
			void *n = realloc(l->items, (size_t)h.total * kvr_msg_list_item_size(l->type));
			if (!n)
				return -ENOMEM;
			l->items = n;
			l->cap = h.total;
		}
		l->req_id = m->hdr.req_id;
		l->total = h.total;
		l->got = 0;
		l->next_seq = 0;
		l->lane = h.lane;
		l->flags = h.flags;
		l->first_ns = kvr_now_ns();
	} else if (l->total == 0 || m->hdr.req_id != l->req_id || m->hdr.seq != l->next_seq || h.total != l->total ||
		   h.lane != l->lane || h.flags != l->flags) {
		goto bad;
	}
	kvr_msg_list_items(m, l->items);
	l->got += h.count;
	l->next_seq++;
	if (m->hdr.flags & KVR_MSGF_MORE)
		return 0;
	l->total = l->got; /* complete; a following seq != 0 no longer continues it */
	l->next_seq = UINT32_MAX;
	return 1;
bad:
	l->total = 0; /* drop any partial list */
	l->got = 0;
	return -EBADMSG;
}

int kvr_msg_send(struct kvr_ring *r, const struct kvr_msg *m, uint64_t deadline_ns)
{
	if (kvr_ring_try_enqueue(r, m) == 0)
		return 0;
	int64_t t = -1;
	if (deadline_ns) {
		uint64_t now = kvr_now_ns();
		if (now >= deadline_ns)
			return -ETIMEDOUT;
		t = (int64_t)(deadline_ns - now);
	}
	return kvr_ring_enqueue(r, m, t);
}

int kvr_list_send_ex(struct kvr_ring *r, unsigned type, uint64_t req_id, uint8_t lane, uint8_t flags,
		     const void *items, uint32_t total, uint64_t deadline_ns, kvr_list_send_one_fn send_one, void *ctx)
{
	unsigned per = kvr_msg_list_per_msg(type);
	if (!per || !total)
		return -EINVAL;
	struct kvr_msg batch[32];
	uint32_t n_msgs = (total + per - 1) / per;
	for (uint32_t seq = 0; seq < n_msgs;) {
		unsigned n = n_msgs - seq < 32 ? n_msgs - seq : 32;
		for (unsigned i = 0; i < n; i++)
			kvr_msg_build_list(&batch[i], type, req_id, seq + i, lane, flags, items, total);
		unsigned done = kvr_ring_enqueue_burst(r, batch, n);
		for (unsigned i = done; i < n; i++) { /* the ring filled up: wait for room */
			int rc = send_one ? send_one(ctx, r, &batch[i], deadline_ns) : kvr_msg_send(r, &batch[i], deadline_ns);
			if (rc)
				return rc;
		}
		seq += n;
	}
	return 0;
}

int kvr_list_send(struct kvr_ring *r, unsigned type, uint64_t req_id, uint8_t lane, const void *items,
		  uint32_t total, uint64_t deadline_ns)
{
	return kvr_list_send_ex(r, type, req_id, lane, 0, items, total, deadline_ns, NULL, NULL);
}
