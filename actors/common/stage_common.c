/* Shared loader/storer plumbing: geometry from the control segment, transfer backend, chunked copies. */
#include "stage_common.h"

#include <errno.h>
#include <stddef.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvr_dcp.h"
#include "kvr_grow.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_time.h"

/* Staging: leases of buffer_bytes (0 = one block), a pool of ceiling * percent (at least
 * one lease); the copy-run buffers one lease needs. */
static int size_pool(struct stage_worker *sw, unsigned pool_percent)
{
	const struct kvr_config *cfg = &sw->a->cfg;
	uint64_t lease = cfg->staging.buffer_bytes ? cfg->staging.buffer_bytes : sw->rank_lane_bytes;
	if (lease < sw->rank_lane_bytes)
		lease = sw->rank_lane_bytes;
	uint64_t pool = cfg->staging.ceiling_bytes * pool_percent / 100;
	sw->chunk_blocks = (uint32_t)(lease / sw->rank_lane_bytes);
	sw->pool_leases = (uint32_t)(pool / lease);
	if (sw->pool_leases == 0)
		sw->pool_leases = 1;
	if (sw->dcp) {
		size_t per_block = kvr_dcp_lane_max_runs(&sw->geom);
		sw->cap_dcp = per_block;
		sw->cap_runs = per_block * sw->chunk_blocks;
		sw->dcp_runs = calloc(per_block, sizeof(*sw->dcp_runs));
		sw->sorted = calloc(sw->chunk_blocks, sizeof(*sw->sorted));
		if (!sw->dcp_runs || !sw->sorted)
			return -ENOMEM;
	} else {
		sw->cap_runs = kvr_xfer_plan_max_runs(sw->geom.n_regions, sw->chunk_blocks);
	}
	sw->runs = calloc(sw->cap_runs, sizeof(*sw->runs));
	return sw->runs ? 0 : -ENOMEM;
}

/* The fence's view of the worker: its slot's generation and state now, and a pidfd of its
 * process. Opened after the worker attached (kvringd spawns us then), so the pid is that
 * worker's; one that already exited makes every fence fire. */
static void fence_open(struct stage_worker *sw)
{
	const struct kvr_worker_ent *we = kvr_ctl_worker(sw->a->ctl, sw->worker);
	sw->fence_gen = we->generation;
	sw->fence_attached = atomic_load(&we->state) == KVR_WORKER_ATTACHED;
	pid_t pid = atomic_load(&we->pid);
	if (!sw->fence_attached || pid <= 0)
		return;
	int fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (fd >= 0)
		sw->pidfd = fd;
	else if (errno == ESRCH)
		sw->worker_dead = true;
	else
		kvr_warn("worker %u: pidfd_open(%d): %s; its death is seen only when kvringd marks it detached",
			 sw->worker, (int)pid, strerror(errno));
}

int stage_fence(struct stage_worker *sw, uint64_t wire, bool exact)
{
	const struct kvr_worker_ent *we = kvr_ctl_worker(sw->a->ctl, sw->worker);
	if (we->generation != sw->fence_gen ||
	    (sw->fence_attached && atomic_load_explicit(&we->state, memory_order_acquire) != KVR_WORKER_ATTACHED))
		return -ESHUTDOWN;
	if (!sw->worker_dead && sw->pidfd >= 0) {
		uint64_t now = exact ? 0 : kvr_now_ns();
		if (exact || now - sw->fence_polled_ns >= STAGE_FENCE_POLL_NS) {
			struct pollfd p = {.fd = sw->pidfd, .events = POLLIN};
			sw->worker_dead = poll(&p, 1, 0) == 1;
			sw->fence_polled_ns = now;
		}
	}
	if (sw->worker_dead)
		return -EOWNERDEAD;
	if (wire) {
		struct kvr_client_area *ar = kvr_ctl_area(sw->a->ctl, sw->worker);
		for (unsigned i = 0; i < KVR_AREA_CANCEL_MAX; i++)
			if (atomic_load_explicit(&ar->cancel[i], memory_order_acquire) == wire)
				return -ECANCELED;
	}
	return 0;
}

/* The worker's geometry, copied from its control-segment area and checked. */
static int worker_geometry(struct stage_worker *sw)
{
	char err[KVR_GEOM_ERR_MAX];
	memcpy(&sw->geom, kvr_ctl_worker_geometry(sw->a->ctl, sw->worker), sizeof(sw->geom));
	if (kvr_geometry_validate(&sw->geom, kvr_geometry_kv_extent(&sw->geom), err, sizeof(err)) ||
	    kvr_dcp_group_check(&sw->geom, err, sizeof(err))) {
		kvr_err("worker %u geometry: %s", sw->worker, err);
		return -EINVAL;
	}
	return 0;
}

/* The worker's request and reply rings, and the outbox on its reply ring. */
static int worker_rings(struct stage_worker *sw, const char *req_fmt, const char *rep_fmt)
{
	sw->req = kvr_actor_ring_w(sw->a, req_fmt, sw->worker);
	sw->rep = kvr_actor_ring_w(sw->a, rep_fmt, sw->worker);
	if (!sw->req || !sw->rep) {
		kvr_err("worker %u: rings %s / %s not found", sw->worker, req_fmt, rep_fmt);
		return -ENOENT;
	}
	kvr_outbox_init(&sw->out, sw->rep);
	sw->out_open = true;
	return 0;
}

/* The transfer layout of the worker's regions, checked, and what one block of it takes in a
 * slot (*ret_canon_bytes: the canonical lane, which a DCP rank holds a shard of). */
static int worker_layout(struct stage_worker *sw, uint64_t kv_bytes, uint64_t *ret_canon_bytes)
{
	char err[KVR_GEOM_ERR_MAX];
	sw->regions = calloc(sw->geom.n_regions, sizeof(*sw->regions));
	if (!sw->regions)
		return -ENOMEM;
	for (unsigned r = 0; r < sw->geom.n_regions; r++) {
		struct kvr_region g = kvr_geometry_region(&sw->geom, r);
		sw->regions[r] = (struct kvr_xfer_region){.offset = g.offset, .stride = g.stride, .page_bytes = g.page_bytes};
	}
	sw->layout = (struct kvr_xfer_layout){.regions = sw->regions, .n_regions = sw->geom.n_regions,
					      .num_blocks = sw->geom.num_blocks, .kv_size = kv_bytes,
					      .arena_size = sw->a->arena_seg.size};
	struct kvr_xfer_err xe = {0};
	int rc = kvr_xfer_layout_check(&sw->layout, &xe);
	if (rc) {
		kvr_xfer_err_format(&xe, err, sizeof(err));
		kvr_err("worker %u layout: %s", sw->worker, err);
		return rc;
	}
	/* What one block of this rank moves, and what its (canonical) lane takes in a slot:
	 * the same without DCP; a DCP rank moves its shard of a canonical lane. */
	sw->rank_lane_bytes = kvr_xfer_slot_bytes(&sw->layout);
	uint64_t canon_bytes = sw->dcp ? kvr_dcp_canonical_lane_bytes(&sw->geom) : sw->rank_lane_bytes;
	if (!canon_bytes || canon_bytes > sw->slots->slot_bytes) {
		kvr_err("worker %u: lane bytes %llu exceed the slot size %llu", sw->worker, (unsigned long long)canon_bytes,
			(unsigned long long)sw->slots->slot_bytes);
		return -EINVAL;
	}
	*ret_canon_bytes = canon_bytes;
	return 0;
}

/* The worker's KV memory: a memfd with the pages (host), or a memfd holding a CUDA
 * descriptor (IPC handles of its GPU tensors and a table of store events). */
static int worker_kvmem(struct stage_worker *sw, int kv_fd, uint64_t kv_bytes)
{
	char err[KVR_GEOM_ERR_MAX];
	struct kvr_xfer_kvmem kv = {.kind = KVR_XFER_MEM_HOST, .size = kv_bytes};
	struct kvr_xfer_arena arena = {.base = sw->a->arena_seg.base, .size = sw->a->arena_seg.size};
	void *blob = NULL;
	size_t blob_len = 0;
	int rc;
	int d = kvr_cuda_desc_read(kv_fd, &blob, &blob_len, err, sizeof(err));
	if (d == 0) {
		kv.kind = KVR_XFER_MEM_CUDA;
		kv.u.cuda.blob = blob;
		kv.u.cuda.blob_len = (uint32_t)blob_len;
		kv.u.cuda.device = -1;
		sw->cuda = true;
		rc = kvr_cuda_events_map(kv_fd, &sw->events);
		if (rc) {
			free(blob);
			kvr_err("worker %u: cannot map its store events: %s", sw->worker, strerror(-rc));
			return rc;
		}
	} else if (d == -ENOMSG) {
		kv.u.host.fd = kv_fd;
	} else {
		kvr_err("worker %u: KV descriptor: %s", sw->worker, err);
		return d;
	}
	rc = kvr_xfer_open(&kv, &arena, &sw->xfer);
	free(blob);
	if (rc) {
		kvr_err("worker %u: cannot open its KV memory (%s backend): %s", sw->worker, sw->cuda ? "cuda" : "host",
			strerror(-rc));
		return rc;
	}
	return 0;
}

/* The one line that says a worker is served, with its lane, sizes and lease pool. */
static void log_serving(const struct stage_worker *sw, uint64_t canon_bytes)
{
	if (sw->dcp)
		kvr_info("serving worker %u (DCP rank %u of %u, interleave %u, lane %u, %u regions, %llu of %llu bytes per "
			 "block, lease %u blocks x %u)", sw->worker, sw->geom.dcp_rank, sw->geom.dcp_size,
			 sw->geom.dcp_interleave, sw->lane, sw->geom.n_regions, (unsigned long long)sw->rank_lane_bytes,
			 (unsigned long long)canon_bytes, sw->chunk_blocks, sw->pool_leases);
	else
		kvr_info("serving worker %u (lane %u, %u regions, %llu bytes per block, lease %u blocks x %u)", sw->worker,
			 sw->lane, sw->geom.n_regions, (unsigned long long)sw->rank_lane_bytes, sw->chunk_blocks,
			 sw->pool_leases);
}

int stage_worker_open(struct kvr_actor *a, struct stage_worker *sw, unsigned worker, int kv_fd, uint64_t kv_bytes,
		      const char *req_fmt, const char *rep_fmt, unsigned pool_percent)
{
	memset(sw, 0, sizeof(*sw));
	sw->a = a;
	sw->worker = worker;
	sw->pidfd = -1;
	if (sw->worker >= a->ctl->max_workers || !a->slots || kv_fd < 0)
		return -EINVAL;
	fence_open(sw);
	int rc = worker_geometry(sw);
	if (rc)
		return rc;
	sw->slots = a->slots;
	sw->dcp = sw->geom.dcp_size > 1;
	sw->lane = kvr_dcp_lane(&sw->geom);
	rc = worker_rings(sw, req_fmt, rep_fmt);
	if (rc)
		return rc;
	uint64_t canon_bytes = 0;
	rc = worker_layout(sw, kv_bytes, &canon_bytes);
	if (rc)
		return rc;
	rc = size_pool(sw, pool_percent);
	if (rc)
		return rc;
	rc = worker_kvmem(sw, kv_fd, kv_bytes);
	if (rc)
		return rc;
	log_serving(sw, canon_bytes);
	return 0;
}

void stage_populate(struct stage_worker *sw, bool arena, bool arena_write, bool kv_write)
{
	struct kvr_actor *a = sw->a;
	void *base;
	size_t len;
	int rc = 0;
	if (arena)
		rc = kvr_actor_populate_add(a, a->arena_seg.base, a->arena_seg.size, arena_write, "arena");
	if (!rc && kvr_xfer_mapping(sw->xfer, &base, &len) == 0)
		rc = kvr_actor_populate_add(a, base, len, kv_write, "worker's KV memory");
	if (rc)
		kvr_warn("worker %u: no background populate: %s", sw->worker, strerror(-rc));
}

void stage_worker_close(struct stage_worker *sw)
{
	if (!sw)
		return;
	void *base;
	size_t len;
	if (sw->xfer && kvr_xfer_mapping(sw->xfer, &base, &len) == 0)
		kvr_actor_populate_forget(sw->a, base);
	kvr_xfer_close(sw->xfer);
	kvr_cuda_events_unmap(&sw->events);
	if (sw->out_open) {
		/* answers queued behind a client that stopped reading: a last chance, then dropped */
		uint32_t dropped = kvr_outbox_drain(&sw->out, kvr_ms_to_ns(sw->a->cfg.timeouts.reply_ms));
		if (dropped)
			kvr_warn("worker %u: %u replies dropped at exit (its client does not read %s)", sw->worker,
				 dropped, sw->rep->shm->name);
		kvr_outbox_free(&sw->out);
		sw->out_open = false;
	}
	if (sw->pidfd >= 0)
		(void)close(sw->pidfd);
	sw->pidfd = -1;
	free(sw->regions);
	sw->xfer = NULL;
	sw->regions = NULL;
	free(sw->runs);
	free(sw->dcp_runs);
	free(sw->sorted);
	free(sw->group_offs);
	sw->group_offs = NULL;
	sw->cap_group_offs = 0;
	sw->runs = NULL;
	sw->dcp_runs = NULL;
	sw->sorted = NULL;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/* A DCP rank's copy runs for k blocks: each block's shard against its canonical lane
 * (kvr_dcp_lane_runs). Two blocks of one load with the same engine block id would write
 * the same KV twice: refused as kvr_xfer_plan refuses it. Count, or -errno. */
static int plan_dcp(struct stage_worker *sw, uint32_t dir, const uint32_t *blocks, const uint64_t *slot_offs,
		    uint32_t k, uint64_t *ret_bytes)
{
	if (dir == KVR_XFER_SLOT_TO_KV && k > 1) {
		memcpy(sw->sorted, blocks, k * sizeof(*blocks));
		qsort(sw->sorted, k, sizeof(*sw->sorted), cmp_u32);
		for (uint32_t i = 1; i < k; i++)
			if (sw->sorted[i] == sw->sorted[i - 1]) {
				kvr_warn("worker %u: engine block %u twice in one load", sw->worker, sw->sorted[i]);
				return -EINVAL;
			}
	}
	size_t n = 0;
	uint64_t bytes = 0;
	char err[160];
	for (uint32_t b = 0; b < k; b++) {
		int nr = kvr_dcp_lane_runs(&sw->geom, blocks[b], slot_offs[b], sw->dcp_runs, sw->cap_dcp, err, sizeof(err));
		if (nr < 0) {
			kvr_warn("worker %u: DCP copy plan refused: %s", sw->worker, err[0] ? err : strerror(-nr));
			return nr;
		}
		if (n + (size_t)nr > sw->cap_runs)
			return -ENOSPC;
		for (int r = 0; r < nr; r++) {
			sw->runs[n++] = (struct kvr_xfer_run){.kv_off = sw->dcp_runs[r].kv_off,
							      .slot_off = sw->dcp_runs[r].slot_off,
							      .len = sw->dcp_runs[r].len};
			bytes += sw->dcp_runs[r].len;
		}
	}
	*ret_bytes = bytes;
	return (int)n;
}

/* The copy runs of k blocks of one rank: count, or -errno (logged). */
static int plan_chunk(struct stage_worker *sw, uint32_t dir, const uint32_t *blocks, const uint64_t *slot_offs,
		      uint32_t k)
{
	uint64_t bytes = 0;
	if (sw->dcp)
		return plan_dcp(sw, dir, blocks, slot_offs, k, &bytes);
	struct kvr_xfer_err xe = {0};
	int nr = kvr_xfer_plan(&sw->layout, blocks, slot_offs, k, sw->runs, sw->cap_runs, &bytes, &xe);
	if (nr < 0) {
		char why[160];
		kvr_xfer_err_format(&xe, why, sizeof(why));
		kvr_warn("worker %u: copy plan refused: %s", sw->worker, why);
	}
	return nr;
}

/* The copy runs of k blocks of one rank, of layer group g only (of `groups`, layer-major):
 * the group's regions against their place in each block's lane. Count, or -errno. */
static int plan_group(struct stage_worker *sw, const uint32_t *blocks, const uint64_t *slot_offs, uint32_t k,
		      uint32_t g, uint32_t groups)
{
	uint32_t per = sw->layout.n_regions / groups;
	if (KVR_GROW(sw->group_offs, sw->cap_group_offs, k, 64))
		return -ENOMEM;
	uint64_t shift = kvr_xfer_region_slot_offset(&sw->layout, g * per);
	for (uint32_t b = 0; b < k; b++)
		sw->group_offs[b] = slot_offs[b] + shift;
	struct kvr_xfer_layout sub = sw->layout;
	sub.regions += g * per;
	sub.n_regions = per;
	uint64_t bytes = 0;
	struct kvr_xfer_err xe = {0};
	int nr = kvr_xfer_plan(&sub, blocks, sw->group_offs, k, sw->runs, sw->cap_runs, &bytes, &xe);
	if (nr < 0) {
		char why[160];
		kvr_xfer_err_format(&xe, why, sizeof(why));
		kvr_warn("worker %u: copy plan of layer %u refused: %s", sw->worker, g, why);
	}
	return nr;
}

static void add_stats(struct kvr_xfer_stats *st, const struct kvr_xfer_stats *s)
{
	st->bytes += s->bytes;
	st->runs += s->runs;
	st->copies += s->copies;
	st->copy_ns += s->copy_ns;
	st->queue_ns += s->queue_ns;
}

int stage_copy_start(struct stage_copy *c, struct stage_worker *const *sw, unsigned n_ranks, uint32_t dir,
		     const uint32_t *const *blocks, const uint64_t *slot_offs, uint32_t n,
		     const struct kvr_xfer_dep *const *ready, const uint64_t *wire)
{
	memset(c, 0, offsetof(struct stage_copy, tickets));
	if (!n_ranks || n_ranks > KVR_ACTOR_MAX_KV)
		return -EINVAL;
	c->n_ranks = n_ranks;
	c->dir = dir;
	c->n = n;
	c->slot_offs = slot_offs;
	c->fence = wire != NULL;
	c->depth = KVR_XFER_MAX_INFLIGHT;
	c->chunk = UINT32_MAX;
	c->groups = 1;
	for (unsigned r = 0; r < n_ranks; r++) {
		c->sw[r] = sw[r];
		c->blocks[r] = blocks[r];
		c->ready[r] = ready ? ready[r] : NULL;
		c->wire[r] = wire ? wire[r] : 0;
		if (sw[r]->pool_leases < c->depth)
			c->depth = sw[r]->pool_leases;
		if (sw[r]->chunk_blocks < c->chunk)
			c->chunk = sw[r]->chunk_blocks;
	}
	return 0;
}

uint32_t stage_copy_layered(struct stage_copy *c)
{
	const struct stage_worker *sw = c->sw[0];
	const struct kvr_geometry *g = &sw->geom;
	if (c->n_ranks == 1 && c->n && !sw->dcp && g->layout == KVR_LAYOUT_LAYER_MAJOR && g->layers > 1 &&
	    sw->layout.n_regions % g->layers == 0 && !c->done && !c->inflight)
		c->groups = g->layers;
	return c->groups;
}

bool stage_copy_can_submit(const struct stage_copy *c)
{
	return !c->rc && c->done < c->n && c->inflight < c->depth;
}

bool stage_copy_submit(struct stage_copy *c)
{
	/* the fence, before every chunk: a cancel, detach or death stops the copy here */
	for (unsigned r = 0; c->fence && stage_copy_can_submit(c) && r < c->n_ranks; r++)
		c->rc = stage_fence(c->sw[r], c->wire[r], false);
	if (!stage_copy_can_submit(c))
		return false;
	/* a layer group's chunk moves the bytes of a whole-block chunk: groups times the blocks */
	uint64_t per_chunk = (uint64_t)c->chunk * c->groups;
	uint32_t k = c->n - c->done < per_chunk ? c->n - c->done : (uint32_t)per_chunk;
	uint32_t slot = (c->head + c->inflight) % c->depth;
	uint64_t *t = c->tickets[slot];
	for (unsigned r = 0; r < c->n_ranks; r++) {
		t[r] = 0; /* 0: nothing of this rank in flight (not submitted, or already reaped) */
		if (c->rc)
			continue;
		const uint32_t *blocks = c->blocks[r] + c->done;
		int nr = c->groups > 1 ? plan_group(c->sw[r], blocks, c->slot_offs + c->done, k, c->group, c->groups)
				       : plan_chunk(c->sw[r], c->dir, blocks, c->slot_offs + c->done, k);
		c->rc = nr < 0 ? nr : kvr_xfer_submit(c->sw[r]->xfer, c->dir, c->sw[r]->runs, (size_t)nr, c->ready[r], &t[r]);
	}
	/* a chunk that failed half-way is still reaped: what it submitted finishes before its
	 * lease or its slots are reused */
	c->inflight++;
	c->ends_group[slot] = 0;
	if (c->rc)
		return true;
	c->done += k;
	if (c->done == c->n) {
		c->ends_group[slot] = c->group + 1;
		if (c->group + 1 < c->groups) { /* the next layer group starts over at block 0 */
			c->group++;
			c->done = 0;
		}
	}
	for (unsigned r = 0; r < c->n_ranks; r++)
		kvr_actor_count(c->sw[r]->a, KVR_STAT_XF_CHUNKS, 1);
	return true;
}

int stage_copy_reap(struct stage_copy *c, bool wait)
{
	if (!c->inflight)
		return 0;
	uint64_t *t = c->tickets[c->head];
	for (unsigned r = 0; r < c->n_ranks; r++) {
		if (!t[r])
			continue;
		struct kvr_xfer_stats s = {0};
		int rc = wait ? kvr_xfer_wait(c->sw[r]->xfer, t[r], -1, &s) : kvr_xfer_poll(c->sw[r]->xfer, t[r], &s);
		if (rc == -EAGAIN)
			return -EAGAIN; /* chunks complete in order: nothing later is looked at */
		t[r] = 0;
		if (rc && !c->rc)
			c->rc = rc;
		add_stats(&c->st[r], &s);
	}
	if (!c->rc && c->ends_group[c->head])
		c->groups_done = c->ends_group[c->head]; /* chunks complete in order: every earlier group too */
	c->head = (c->head + 1) % c->depth;
	c->inflight--;
	return 1;
}

void stage_reply(struct stage_worker *sw, unsigned type, uint64_t wire, int status, const void *body,
		 size_t body_len, const uint32_t *failed, uint32_t n_failed, uint64_t first_ns)
{
	kvr_actor_count(sw->a, KVR_STAT_XF_REQUESTS, 1);
	kvr_actor_count(sw->a, KVR_STAT_XF_FAILED_BLOCKS, n_failed);
	struct kvr_msg m;
	kvr_msg_build(&m, type, (n_failed ? KVR_MSGF_MORE : 0) | (status ? KVR_MSGF_ERROR : 0), wire, 0, body, body_len);
	uint64_t now = kvr_now_ns();
	kvr_hist_observe(kvr_stats_hist(sw->a->stats, KVR_STAT_XF_HIST_FIRST), now - first_ns);
	uint64_t pass_now = kvr_actor_now(sw->a); /* the outbox runs on the loop's clock */
	int rc = kvr_outbox_send(&sw->out, &m, pass_now);
	if (!rc && n_failed)
		rc = kvr_outbox_send_list(&sw->out, KVR_MSG_BLOCKS, wire, 0, 0, failed, n_failed, pass_now);
	if (rc)
		kvr_err("worker %u: reply %s to request %llx dropped (%u replies queued for its client)", sw->worker,
			kvr_msg_type_name(type), (unsigned long long)wire, sw->out.n);
}

int stage_worker_pass(struct stage_worker *sw, uint64_t now)
{
	if (!sw->out_open || !kvr_outbox_pending(&sw->out))
		return KVR_PASS_IDLE;
	uint32_t before = sw->out.n;
	bool waits = kvr_outbox_pass(&sw->out, now, kvr_ms_to_ns(sw->a->cfg.timeouts.reply_ms));
	if (sw->out.n < before && !waits)
		return KVR_PASS_MOVED;
	return waits ? KVR_PASS_WAITING : KVR_PASS_IDLE;
}

bool stage_wire_current(const struct kvr_actor *a, uint64_t wire)
{
	return kvr_wire_for(wire, atomic_load(&a->ent->generation));
}
