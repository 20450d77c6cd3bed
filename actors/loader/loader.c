/* loader stage: copy committed L1 slots into one worker's KV blocks (LOAD -> LOAD_DONE). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_actor.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_time.h"
#include "stage_common.h"

/*
 * One loader per attached worker. A LOAD lists (slot, epoch, engine block id) triples the
 * client got from its lookup. For each block the loader pins the slot for this worker —
 * which fails if the slot was evicted or reused since the lookup (its epoch moved on) —
 * copies the pinned slots into the worker's blocks through the transfer backend, in
 * chunks of one staging lease (staging.buffer_bytes) so a large request streams through
 * the load pool, and unpins. The reply names exactly the block ids not restored.
 *
 * Requests carry the generation of the loader the client addressed (wire id >> 48): one
 * addressed to an earlier incarnation is answered -ESTALE without touching anything,
 * because the client already failed it when that incarnation died.
 */

struct loader {
	struct stage_worker sw;
	struct kvr_list_asm req;
	uint32_t *blocks;          /* per request: engine block ids to copy */
	uint64_t *slot_offs;       /* their slots' arena offsets */
	uint32_t *slots;           /* pinned slot indices */
	uint32_t *failed;          /* block ids not restored */
	uint32_t cap;
};

static int grow(struct loader *l, uint32_t n)
{
	if (n <= l->cap)
		return 0;
	uint32_t *b = realloc(l->blocks, n * sizeof(*b));
	if (b)
		l->blocks = b;
	uint64_t *o = realloc(l->slot_offs, n * sizeof(*o));
	if (o)
		l->slot_offs = o;
	uint32_t *s = realloc(l->slots, n * sizeof(*s));
	if (s)
		l->slots = s;
	uint32_t *f = realloc(l->failed, n * sizeof(*f));
	if (f)
		l->failed = f;
	if (!b || !o || !s || !f)
		return -ENOMEM;
	l->cap = n;
	return 0;
}

static int loader_init(struct kvr_actor *a)
{
	struct loader *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	int rc = stage_worker_open(a, &l->sw, "load.req.%u", "load.rep.%u", a->cfg.staging.load_percent);
	if (rc) {
		free(l);
		return rc;
	}
	/* A previous incarnation may have died holding pins: its loads were failed by the
	 * client when it saw us restart, so every pin of this worker is stale. */
	unsigned dropped = 0;
	for (uint32_t i = 0; i < l->sw.slots->n_slots; i++)
		while (kvr_slot_unpin(l->sw.slots, i, l->sw.worker) == 0)
			dropped++;
	if (dropped)
		kvr_warn("dropped %u pins left by a previous loader of worker %u", dropped, l->sw.worker);
	kvr_list_asm_init(&l->req, KVR_MSG_LOAD);
	kvr_actor_set_data(a, l);
	return 0;
}

static void loader_fini(struct kvr_actor *a)
{
	struct loader *l = a->data;
	if (!l)
		return;
	stage_worker_close(&l->sw);
	kvr_list_asm_free(&l->req);
	free(l->blocks);
	free(l->slot_offs);
	free(l->slots);
	free(l->failed);
	free(l);
}

static void reply(struct loader *l, uint64_t wire, int status, uint32_t n_blocks, uint32_t n_failed,
		  const struct kvr_xfer_stats *st, uint64_t queue_ns)
{
	struct kvr_msg_load_done d = {
		.status = status,
		.n_blocks = n_blocks,
		.n_failed = n_failed,
		.copies = st ? (uint32_t)st->copies : 0,
		.bytes = st ? st->bytes : 0,
		.copy_ns = st ? st->copy_ns : 0,
		.runs = st ? (uint32_t)st->runs : 0,
		.queue_us = (uint32_t)(queue_ns / 1000),
	};
	stage_reply(&l->sw, KVR_MSG_LOAD_DONE, wire, status, &d, sizeof(d), l->failed, n_failed, l->req.first_ns);
}

static void execute(struct kvr_actor *a, struct loader *l)
{
	const struct kvr_msg_load_item *items = l->req.items;
	uint32_t n = l->req.total;
	uint64_t wire = l->req.req_id, queue_ns = kvr_now_ns() - l->req.first_ns;
	if (grow(l, n)) {
		reply(l, wire, -ENOMEM, n, 0, NULL, queue_ns); /* no room to list them: the status fails all */
		return;
	}
	if (!stage_wire_current(a, wire)) {
		for (uint32_t i = 0; i < n; i++)
			l->failed[i] = items[i].block;
		reply(l, wire, -ESTALE, n, n, NULL, queue_ns);
		return;
	}

	/* Pin: from here until the unpin below the slots cannot be evicted or reused. */
	uint32_t n_ok = 0, n_failed = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = items[i].slot;
		bool ok = s < l->sw.slots->n_slots && items[i].block < l->sw.geom.num_blocks &&
			  kvr_slot_at(l->sw.slots, s)->lane == l->sw.lane &&
			  kvr_slot_pin(l->sw.slots, s, items[i].epoch, l->sw.worker) == 0;
		if (!ok) {
			l->failed[n_failed++] = items[i].block;
			continue;
		}
		l->blocks[n_ok] = items[i].block;
		l->slots[n_ok] = s;
		l->slot_offs[n_ok] = l->sw.slots->arena_data_off + (uint64_t)s * l->sw.slots->slot_bytes;
		n_ok++;
	}

	struct kvr_xfer_stats st = {0};
	int rc = stage_copy_chunks(&l->sw, KVR_XFER_SLOT_TO_KV, l->blocks, l->slot_offs, n_ok, NULL, &st);
	for (uint32_t i = 0; i < n_ok; i++)
		(void)kvr_slot_unpin(l->sw.slots, l->slots[i], l->sw.worker);
	if (rc) {
		/* Nothing of this request can be trusted in the worker's blocks: fail them all. */
		kvr_warn("load %llx: copy failed: %s", (unsigned long long)wire, strerror(-rc));
		n_failed = 0;
		for (uint32_t i = 0; i < n; i++)
			l->failed[n_failed++] = items[i].block;
		reply(l, wire, rc, n, n_failed, &st, queue_ns);
		return;
	}
	kvr_actor_count(a, KVR_STAT_XF_BLOCKS, n_ok);
	kvr_actor_count(a, KVR_STAT_XF_BYTES, st.bytes);
	kvr_debug("load %llx: %u blocks, %u failed, %llu bytes, %llu runs, copy %llu us", (unsigned long long)wire, n,
		  n_failed, (unsigned long long)st.bytes, (unsigned long long)st.runs,
		  (unsigned long long)(st.copy_ns / 1000));
	reply(l, wire, n_failed ? -EIO : 0, n, n_failed, &st, queue_ns);
}

static int loader_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct loader *l = a->data;
	if (ring != l->sw.req)
		return -EBADMSG;
	int rc = kvr_list_feed(&l->req, m);
	if (rc < 0)
		return -EBADMSG;
	if (rc == 1)
		execute(a, l);
	return 0;
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
