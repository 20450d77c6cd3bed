/* loader: one worker's loads, LOAD -> pin, copy slots to KV, unpin -> LOAD_DONE: a window of jobs that never blocks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_actor.h"
#include "kvr_grow.h"
#include "kvr_log.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "stage_common.h"

/*
 * One loader per attached worker, a DCP rank's too (it scatters its own tokens out of the
 * canonical lane: supervisor/dcp_groups.c). No other actor loads, so the load path lives
 * here with the stage; what it shares with the store path (the worker's KV memory, chunked
 * copies, replies) is actors/common.
 *
 * Loads. A LOAD lists (slot, epoch, engine block id) triples the client got from its
 * lookup. For each block the loader pins the slot for this worker — which fails if the
 * slot was evicted or reused since the lookup (its epoch moved on) — copies the pinned
 * slots into the worker's blocks through the transfer backend, in chunks of one staging
 * lease, and unpins. The reply names exactly the block ids not restored. A DCP rank's copy
 * takes its own tokens out of the canonical lane (stage_copy plans with kvr_dcp_lane_runs).
 *
 * Jobs. No handler waits for a copy. A complete LOAD becomes a job; up to LOADER_WINDOW
 * jobs of the worker are in flight at once, and each pass of the loop submits their next
 * chunks round robin — at most the load pool's leases in flight for the worker — and
 * reaps finished chunks by polling (stage_copy: kvr_xfer_poll; on CUDA the copies' events
 * are queried). A job whose copy is over is unpinned and answered at once, so loads
 * complete independently and, when their sizes differ, out of order: the client matches
 * answers by request id. Answers go through the worker's outbox (stage_reply), so a client
 * that does not read its ring holds up nothing but its own answers. While LOADER_WINDOW
 * jobs wait, load.req is held: a full ring is the client's backpressure. Jobs accepted and
 * not answered are reported held, so a drain waits for them.
 *
 * Layer-ordered loads (kvr_load_layered). A load whose wire id the client put in its area's
 * progress table is copied layer by layer — layer 0 of every block, then layer 1, ... — in
 * chunks of one lease's bytes (stage_copy_layered), and after each layer lands the loader
 * stores the count of layers in place into the entry and wakes the client, so a forward
 * pass can start on the first layers while the later ones still copy (kvr_wait_layers).
 * The count only grows and covers only bytes already copied without an error; the reply is
 * still the load's one result (a load failing at layer 5 fails every block, as any failed
 * load does). Where the geometry has no layers to order by (a DCP rank, a cross-layer
 * layout) the load runs as one piece and only its reply says it landed.
 *
 * Requests carry the generation of the actor the client addressed (kvr_wire_gen of the
 * wire id): one addressed to an earlier incarnation is answered -ESTALE without touching
 * anything, because the client already failed it when that incarnation died.
 */

#define LOADER_WINDOW 8 /* loads of one worker copying at once */

struct load {
	struct kvr_list_asm req;   /* the LOAD as it arrived */
	uint32_t *blocks;          /* engine block ids to copy */
	uint64_t *slot_offs;       /* their slots' arena offsets */
	uint32_t *slots;           /* pinned slot indices */
	uint32_t *failed;          /* block ids not restored */
	uint32_t cap;
	uint32_t n_ok, n_failed;
	bool started;              /* pinned, its copy set up */
	uint32_t progress_plus1;   /* layered: its entry in the client's progress table + 1; 0 = none */
	uint32_t published;        /* layer groups stored into that entry */
	uint64_t queue_ns;         /* arrival -> start */
	struct stage_copy copy;    /* its stats: copy.st[0] */
};

struct loader {
	struct stage_worker sw;
	struct kvr_list_asm in;    /* the LOAD being assembled */
	struct load **jobs;        /* arrival order; the first LOADER_WINDOW are started */
	unsigned n_jobs, cap_jobs;
	unsigned rr;               /* the job whose chunk goes first on the next pass */
	bool held;                 /* load.req held: the window is full */
};

static void load_free(struct load *ld)
{
	if (!ld)
		return;
	kvr_list_asm_free(&ld->req);
	free(ld->blocks);
	free(ld->slot_offs);
	free(ld->slots);
	free(ld->failed);
	free(ld);
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

static void load_reply(struct stage_worker *sw, struct load *ld, int status, uint32_t n_failed,
		       const struct kvr_xfer_stats *st)
{
	struct kvr_msg_load_done d = {
		.status = status,
		.n_blocks = ld->req.total,
		.n_failed = n_failed,
		.copies = st ? (uint32_t)st->copies : 0,
		.bytes = st ? st->bytes : 0,
		.copy_ns = st ? st->copy_ns : 0,
		.runs = st ? (uint32_t)st->runs : 0,
		.queue_us = (uint32_t)(ld->queue_ns / 1000),
	};
	stage_reply(sw, KVR_MSG_LOAD_DONE, ld->req.req_id, status, &d, sizeof(d), ld->failed, n_failed,
		    ld->req.first_ns);
}

/* Every block of the request failed with status (no room to list them: the status alone). */
static void load_fail_all(struct stage_worker *sw, struct load *ld, int status)
{
	uint32_t n = ld->req.total, n_failed = 0;
	if (ld->cap >= n) {
		const struct kvr_msg_load_item *items = ld->req.items;
		for (uint32_t i = 0; i < n; i++)
			ld->failed[n_failed++] = items[i].block;
	}
	load_reply(sw, ld, status, n_failed, &ld->copy.st[0]);
}

/* The client's progress-table entry holding wire + 1, 0 when it asked for no layered load. */
static uint32_t find_progress(const struct stage_worker *sw, uint64_t wire)
{
	const struct kvr_client_area *ar = kvr_ctl_area(sw->a->ctl, sw->worker);
	for (uint32_t e = 0; e < KVR_AREA_LAYERED_MAX; e++)
		if (atomic_load_explicit(&ar->progress[e].wire, memory_order_acquire) == wire)
			return e + 1;
	return 0;
}

/* A layered load: tell its client how many layers are in place (the bytes are ordered
 * before the count: the copy ends in a store fence, the store releases), and wake it. */
static void publish_layers(struct stage_worker *sw, struct load *ld)
{
	if (!ld->progress_plus1 || ld->copy.groups_done <= ld->published)
		return;
	struct kvr_client_area *ar = kvr_ctl_area(sw->a->ctl, sw->worker);
	struct kvr_load_progress *p = &ar->progress[ld->progress_plus1 - 1];
	ld->published = ld->copy.groups_done;
	if (atomic_load_explicit(&p->wire, memory_order_acquire) != ld->req.req_id)
		return; /* the client gave the entry up (it failed this load on its side) */
	atomic_store_explicit(&p->layers, ld->published, memory_order_release);
	kvr_waiter_wake(&ar->waiter);
}

/* Start a job: pin its slots (from here until load_finish they cannot be evicted or
 * reused) and set up its copy. false when it was answered at once (nothing to copy). */
static bool load_start(struct stage_worker *sw, struct load *ld, uint64_t now)
{
	const struct kvr_msg_load_item *items = ld->req.items;
	uint32_t n = ld->req.total;
	ld->started = true;
	ld->queue_ns = now > ld->req.first_ns ? now - ld->req.first_ns : 0;
	if (load_grow(ld, n)) {
		load_reply(sw, ld, -ENOMEM, 0, NULL);
		return false;
	}
	if (!stage_wire_current(sw->a, ld->req.req_id)) {
		load_fail_all(sw, ld, -ESTALE);
		return false;
	}
	ld->n_ok = ld->n_failed = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = items[i].slot;
		bool ok = s < sw->slots->n_slots && items[i].block < sw->geom.num_blocks &&
			  kvr_slot_at(sw->slots, s)->lane == sw->lane &&
			  kvr_slot_pin(sw->slots, s, items[i].epoch, sw->worker) == 0;
		if (!ok) {
			ld->failed[ld->n_failed++] = items[i].block;
			continue;
		}
		ld->blocks[ld->n_ok] = items[i].block;
		ld->slots[ld->n_ok] = s;
		ld->slot_offs[ld->n_ok] = sw->slots->arena_data_off + (uint64_t)s * sw->slots->slot_bytes;
		ld->n_ok++;
	}
	const uint32_t *blocks = ld->blocks;
	(void)stage_copy_start(&ld->copy, &sw, 1, KVR_XFER_SLOT_TO_KV, &blocks, ld->slot_offs, ld->n_ok, NULL,
			       &ld->req.req_id);
	ld->progress_plus1 = find_progress(sw, ld->req.req_id);
	if (ld->progress_plus1 && stage_copy_layered(&ld->copy) == 1)
		ld->progress_plus1 = 0; /* nothing to order by: the reply alone says it landed */
	return true;
}

/* The job's copy is over: unpin and answer. */
static void load_finish(struct stage_worker *sw, struct load *ld)
{
	uint64_t wire = ld->req.req_id;
	int rc = ld->copy.rc;
	for (uint32_t i = 0; i < ld->n_ok; i++)
		(void)kvr_slot_unpin(sw->slots, ld->slots[i], sw->worker);
	if (rc) {
		/* Nothing of this request can be trusted in the worker's blocks: fail them all (a
		 * failed block may be partly written: the engine recomputes it). A fenced load
		 * (cancelled, its worker detached or died) stopped before a chunk and wrote
		 * nothing after: this reply is the cancel's acknowledgment. */
		if (rc == -ECANCELED || rc == -ESHUTDOWN || rc == -EOWNERDEAD) {
			kvr_actor_count(sw->a, KVR_STAT_XF_FENCED, 1);
			kvr_info("load %llx: stopped after %llu bytes: %s", (unsigned long long)wire,
				 (unsigned long long)ld->copy.st[0].bytes,
				 rc == -ECANCELED ? "cancelled" : rc == -ESHUTDOWN ? "its worker detached" : "its worker died");
		} else {
			kvr_warn("load %llx: copy failed: %s", (unsigned long long)wire, strerror(-rc));
		}
		load_fail_all(sw, ld, rc);
		return;
	}
	kvr_actor_count(sw->a, KVR_STAT_XF_BLOCKS, ld->n_ok);
	kvr_actor_count(sw->a, KVR_STAT_XF_BYTES, ld->copy.st[0].bytes);
	kvr_debug("load %llx: %u blocks, %u failed, %llu bytes, %llu runs, copy %llu us", (unsigned long long)wire,
		  ld->req.total, ld->n_failed, (unsigned long long)ld->copy.st[0].bytes, (unsigned long long)ld->copy.st[0].runs,
		  (unsigned long long)(ld->copy.st[0].copy_ns / 1000));
	load_reply(sw, ld, ld->n_failed ? -EIO : 0, ld->n_failed, &ld->copy.st[0]);
}

/* ---- the window ------------------------------------------------------------------------ */

static void hold(struct loader *l, bool on)
{
	if (l->held == on)
		return;
	l->held = on;
	(void)kvr_actor_hold_input(l->sw.a, l->sw.req, on);
}

static void window_changed(struct loader *l)
{
	kvr_actor_set_held(l->sw.a, l->n_jobs);
	hold(l, l->n_jobs >= LOADER_WINDOW);
}

/* Remove job i (arrival order kept) and free it. */
static void window_remove(struct loader *l, unsigned i)
{
	load_free(l->jobs[i]);
	memmove(&l->jobs[i], &l->jobs[i + 1], (l->n_jobs - i - 1) * sizeof(*l->jobs));
	l->n_jobs--;
	if (l->rr > i)
		l->rr--;
}

/* A complete LOAD: a job at the end of the window (started when it is within the first
 * LOADER_WINDOW). 0 or -ENOMEM (answered: every block failed). */
static int window_add(struct loader *l)
{
	struct load *ld = calloc(1, sizeof(*ld));
	if (ld && KVR_GROW(l->jobs, l->cap_jobs, l->n_jobs + 1, 2 * LOADER_WINDOW)) {
		free(ld);
		ld = NULL;
	}
	if (!ld) {
		struct load tmp = {.req = l->in};
		load_reply(&l->sw, &tmp, -ENOMEM, 0, NULL);
		return -ENOMEM;
	}
	ld->req = l->in; /* the assembler's items move to the job */
	kvr_list_asm_init(&l->in, KVR_MSG_LOAD);
	l->jobs[l->n_jobs++] = ld;
	window_changed(l);
	return 0;
}

/* One pass over the window: start jobs that entered it, reap finished chunks, answer jobs
 * whose copy is over, and submit the next chunks round robin — at most the pool's leases
 * in flight for the worker. Returns enum kvr_pass. */
static int window_pass(struct loader *l, uint64_t now)
{
	struct stage_worker *sw = &l->sw;
	bool moved = false, copying = false;
	uint32_t inflight = 0, submitted = 0;
	unsigned active = l->n_jobs < LOADER_WINDOW ? l->n_jobs : LOADER_WINDOW;
	for (unsigned i = 0; i < active;) {
		struct load *ld = l->jobs[i];
		if (!ld->started && !load_start(sw, ld, now)) {
			window_remove(l, i);
			active = l->n_jobs < LOADER_WINDOW ? l->n_jobs : LOADER_WINDOW;
			moved = true;
			continue;
		}
		while (stage_copy_reap(&ld->copy, false) == 1)
			moved = true;
		publish_layers(sw, ld);
		if (stage_copy_over(&ld->copy)) {
			load_finish(sw, ld);
			window_remove(l, i);
			active = l->n_jobs < LOADER_WINDOW ? l->n_jobs : LOADER_WINDOW;
			moved = true;
			continue;
		}
		inflight += ld->copy.inflight;
		i++;
	}
	/* one chunk per job per round, starting where the last pass stopped */
	for (bool again = active > 0; again && inflight + submitted < sw->pool_leases;) {
		again = false;
		for (unsigned k = 0; k < active && inflight + submitted < sw->pool_leases; k++) {
			struct load *ld = l->jobs[(l->rr + k) % active];
			if (stage_copy_submit(&ld->copy)) {
				submitted++;
				again = true;
				if (ld->progress_plus1) { /* a layer may have landed (host: inside the submit): say so now */
					while (stage_copy_reap(&ld->copy, false) == 1)
						moved = true;
					publish_layers(sw, ld);
				}
			}
		}
	}
	if (active)
		l->rr = (l->rr + 1) % active;
	for (unsigned i = 0; i < active; i++)
		copying |= l->jobs[i]->copy.inflight > 0;
	window_changed(l);
	int out = stage_worker_pass(sw, now);
	if (moved || submitted || out == KVR_PASS_MOVED)
		return KVR_PASS_MOVED;
	if (copying) {
		kvr_actor_poll_within(sw->a, STAGE_COPY_POLL_NS); /* a copy's completion is polled, not waited for */
		return KVR_PASS_WAITING;
	}
	return out;
}

/* ---- the stage ------------------------------------------------------------------------ */

static int loader_init(struct kvr_actor *a)
{
	struct loader *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	kvr_actor_set_data(a, l);
	kvr_list_asm_init(&l->in, KVR_MSG_LOAD);
	int rc = stage_worker_open(a, &l->sw, a->ent->index, a->n_kv ? a->kv_fds[0] : -1, a->kv_sizes[0], KVR_RING_LOAD_REQ, KVR_RING_LOAD_REP,
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
	/* stopping with loads in flight (the worker detached, or a drain timed out): each
	 * copy is reaped before its pins go, and answered */
	for (unsigned i = 0; i < l->n_jobs; i++) {
		struct load *ld = l->jobs[i];
		if (!ld->started) {
			load_fail_all(&l->sw, ld, -ESHUTDOWN);
			continue;
		}
		ld->copy.rc = ld->copy.rc ? ld->copy.rc : -ESHUTDOWN;
		while (stage_copy_reap(&ld->copy, true) == 1)
			;
		load_finish(&l->sw, ld);
	}
	for (unsigned i = 0; i < l->n_jobs; i++)
		load_free(l->jobs[i]);
	free(l->jobs);
	kvr_actor_set_held(a, 0);
	stage_worker_close(&l->sw);
	kvr_list_asm_free(&l->in);
	free(l);
}

static int loader_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct loader *l = a->data;
	if (ring != l->sw.req)
		return -EBADMSG;
	int rc = kvr_list_feed(&l->in, m);
	if (rc < 0)
		return -EBADMSG;
	if (rc == 1)
		(void)window_add(l);
	return 0;
}

static int loader_on_pass(struct kvr_actor *a, uint64_t now)
{
	return window_pass(a->data, now);
}

static const struct kvr_stage loader_stage = {
	.name = "loader",
	.kind = KVR_ACTOR_LOADER,
	.init = loader_init,
	.on_msg = loader_on_msg,
	.on_pass = loader_on_pass,
	.fini = loader_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &loader_stage);
}
