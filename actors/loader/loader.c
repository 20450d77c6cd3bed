/* loader: one worker's loads, LOAD -> pin, copy slots to KV, unpin -> LOAD_DONE: the stage and its path. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_actor.h"
#include "kvr_grow.h"
#include "kvr_log.h"
#include "kvr_time.h"
#include "stage_common.h"

/*
 * One loader per attached worker, a DCP rank's too (it scatters its own tokens out of the
 * canonical lane: supervisor/dcp_groups.c). No other actor loads, so the load path lives
 * here with the stage; what it shares with the store path (the worker's KV memory, chunked
 * copies, replies) is actors/common.
 */

/* ---- the load path: LOAD -> pin, copy slots to KV, unpin -> LOAD_DONE ------------------ */

struct load {
	struct kvr_list_asm req;
	uint32_t *blocks;          /* engine block ids to copy */
	uint64_t *slot_offs;       /* their slots' arena offsets */
	uint32_t *slots;           /* pinned slot indices */
	uint32_t *failed;          /* block ids not restored */
	uint32_t cap;
};

/*
 * Loads. A LOAD lists (slot, epoch, engine block id) triples the client got from its
 * lookup. For each block the path pins the slot for this worker — which fails if the slot
 * was evicted or reused since the lookup (its epoch moved on) — copies the pinned slots
 * into the worker's blocks through the transfer backend, in chunks of one staging lease
 * so a large request streams through the load pool, and unpins. The reply names exactly
 * the block ids not restored. A DCP rank's copy takes its own tokens out of the
 * canonical lane (stage_copy_chunks plans with kvr_dcp_lane_runs).
 *
 * Requests carry the generation of the actor the client addressed (kvr_wire_gen of the wire id): one
 * addressed to an earlier incarnation is answered -ESTALE without touching anything,
 * because the client already failed it when that incarnation died.
 */

static void load_init(struct load *ld)
{
	memset(ld, 0, sizeof(*ld));
	kvr_list_asm_init(&ld->req, KVR_MSG_LOAD);
}

static void load_fini(struct load *ld)
{
	if (!ld)
		return;
	kvr_list_asm_free(&ld->req);
	free(ld->blocks);
	free(ld->slot_offs);
	free(ld->slots);
	free(ld->failed);
	memset(ld, 0, sizeof(*ld));
}

/* Drop every pin of sw's worker (a previous incarnation died holding them: its loads were
 * failed by the client when it saw the restart). Returns how many. */
static unsigned drop_pins(struct stage_worker *sw)
{
	unsigned dropped = 0;
	for (uint32_t i = 0; i < sw->slots->n_slots; i++)
		while (kvr_slot_unpin(sw->slots, i, sw->worker) == 0)
			dropped++;
	return dropped;
}

static int load_grow(struct load *ld, uint32_t n)
{
	if (n <= ld->cap)
		return 0;
	if (kvr_realloc_n(&ld->blocks, n, sizeof(*ld->blocks)) || kvr_realloc_n(&ld->slot_offs, n, sizeof(*ld->slot_offs)) ||
	    kvr_realloc_n(&ld->slots, n, sizeof(*ld->slots)) || kvr_realloc_n(&ld->failed, n, sizeof(*ld->failed)))
		return -ENOMEM;
	ld->cap = n;
	return 0;
}

static void load_reply(struct stage_worker *sw, struct load *ld, uint64_t wire, int status, uint32_t n_blocks,
		       uint32_t n_failed, const struct kvr_xfer_stats *st, uint64_t queue_ns)
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
	stage_reply(sw, KVR_MSG_LOAD_DONE, wire, status, &d, sizeof(d), ld->failed, n_failed, ld->req.first_ns);
}

static void load_execute(struct stage_worker *sw, struct load *ld)
{
	const struct kvr_msg_load_item *items = ld->req.items;
	uint32_t n = ld->req.total;
	uint64_t wire = ld->req.req_id, queue_ns = kvr_now_ns() - ld->req.first_ns;
	if (load_grow(ld, n)) {
		load_reply(sw, ld, wire, -ENOMEM, n, 0, NULL, queue_ns); /* no room to list them: the status fails all */
		return;
	}
	if (!stage_wire_current(sw->a, wire)) {
		for (uint32_t i = 0; i < n; i++)
			ld->failed[i] = items[i].block;
		load_reply(sw, ld, wire, -ESTALE, n, n, NULL, queue_ns);
		return;
	}

	/* Pin: from here until the unpin below the slots cannot be evicted or reused. */
	uint32_t n_ok = 0, n_failed = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = items[i].slot;
		bool ok = s < sw->slots->n_slots && items[i].block < sw->geom.num_blocks &&
			  kvr_slot_at(sw->slots, s)->lane == sw->lane &&
			  kvr_slot_pin(sw->slots, s, items[i].epoch, sw->worker) == 0;
		if (!ok) {
			ld->failed[n_failed++] = items[i].block;
			continue;
		}
		ld->blocks[n_ok] = items[i].block;
		ld->slots[n_ok] = s;
		ld->slot_offs[n_ok] = sw->slots->arena_data_off + (uint64_t)s * sw->slots->slot_bytes;
		n_ok++;
	}

	struct kvr_xfer_stats st = {0};
	const uint32_t *blocks = ld->blocks;
	int rc = stage_copy_chunks(&sw, 1, KVR_XFER_SLOT_TO_KV, &blocks, ld->slot_offs, n_ok, NULL, &wire, &st);
	for (uint32_t i = 0; i < n_ok; i++)
		(void)kvr_slot_unpin(sw->slots, ld->slots[i], sw->worker);
	if (rc) {
		/* Nothing of this request can be trusted in the worker's blocks: fail them all (a
		 * failed block may be partly written: the engine recomputes it). A fenced load
		 * (cancelled, its worker detached or died) stopped before a chunk and wrote
		 * nothing after: this reply is the cancel's acknowledgment. */
		if (rc == -ECANCELED || rc == -ESHUTDOWN || rc == -EOWNERDEAD) {
			kvr_actor_count(sw->a, KVR_STAT_XF_FENCED, 1);
			kvr_info("load %llx: stopped after %llu bytes: %s", (unsigned long long)wire,
				 (unsigned long long)st.bytes,
				 rc == -ECANCELED ? "cancelled" : rc == -ESHUTDOWN ? "its worker detached" : "its worker died");
		} else {
			kvr_warn("load %llx: copy failed: %s", (unsigned long long)wire, strerror(-rc));
		}
		n_failed = 0;
		for (uint32_t i = 0; i < n; i++)
			ld->failed[n_failed++] = items[i].block;
		load_reply(sw, ld, wire, rc, n, n_failed, &st, queue_ns);
		return;
	}
	kvr_actor_count(sw->a, KVR_STAT_XF_BLOCKS, n_ok);
	kvr_actor_count(sw->a, KVR_STAT_XF_BYTES, st.bytes);
	kvr_debug("load %llx: %u blocks, %u failed, %llu bytes, %llu runs, copy %llu us", (unsigned long long)wire, n,
		  n_failed, (unsigned long long)st.bytes, (unsigned long long)st.runs,
		  (unsigned long long)(st.copy_ns / 1000));
	load_reply(sw, ld, wire, n_failed ? -EIO : 0, n, n_failed, &st, queue_ns);
}

/* Feed one message of sw->req; a complete LOAD is executed and answered on sw->rep.
 * 0, or -EBADMSG (the runtime counts it). */
static int load_feed(struct stage_worker *sw, struct load *ld, const struct kvr_msg *m)
{
	int rc = kvr_list_feed(&ld->req, m);
	if (rc < 0)
		return -EBADMSG;
	if (rc == 1)
		load_execute(sw, ld);
	return 0;
}

/* ---- the stage ------------------------------------------------------------------------ */

struct loader {
	struct stage_worker sw;
	struct load ld;
};

static int loader_init(struct kvr_actor *a)
{
	struct loader *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	kvr_actor_set_data(a, l);
	load_init(&l->ld);
	int rc = stage_worker_open(a, &l->sw, a->ent->index, a->n_kv ? a->kv_fds[0] : -1, a->kv_sizes[0], "load.req.%u", "load.rep.%u",
				   a->cfg.staging.load_percent);
	if (rc)
		return rc;
	stage_populate(&l->sw, true, false, true); /* reads the arena, writes the KV memory */
	unsigned dropped = drop_pins(&l->sw);
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
	load_fini(&l->ld);
	free(l);
}

static int loader_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct loader *l = a->data;
	if (ring != l->sw.req)
		return -EBADMSG;
	return load_feed(&l->sw, &l->ld, m);
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
