/* Shared loader/storer plumbing: geometry from the control segment, transfer backend, chunked copies. */
#include "stage_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_time.h"

int stage_worker_open(struct kvr_actor *a, struct stage_worker *sw, const char *req_fmt, const char *rep_fmt,
		      unsigned pool_percent)
{
	memset(sw, 0, sizeof(*sw));
	sw->a = a;
	sw->worker = a->ent->index;
	if (sw->worker >= a->ctl->max_workers || !a->slots)
		return -EINVAL;
	memcpy(&sw->geom, kvr_ctl_worker_geometry(a->ctl, sw->worker), sizeof(sw->geom));
	char err[KVR_GEOM_ERR_MAX];
	if (kvr_geometry_validate(&sw->geom, kvr_geometry_kv_extent(&sw->geom), err, sizeof(err))) {
		kvr_err("worker %u geometry: %s", sw->worker, err);
		return -EINVAL;
	}
	sw->slots = a->slots;
	sw->lane = sw->geom.attention == KVR_ATTN_MLA ? 0 : sw->geom.tp_rank;
	sw->req = kvr_actor_ring_w(a, req_fmt, sw->worker);
	sw->rep = kvr_actor_ring_w(a, rep_fmt, sw->worker);
	if (!sw->req || !sw->rep) {
		kvr_err("worker %u: rings %s / %s not found", sw->worker, req_fmt, rep_fmt);
		return -ENOENT;
	}

	sw->regions = calloc(sw->geom.n_regions, sizeof(*sw->regions));
	if (!sw->regions)
		return -ENOMEM;
	for (unsigned r = 0; r < sw->geom.n_regions; r++) {
		struct kvr_region g = kvr_geometry_region(&sw->geom, r);
		sw->regions[r] = (struct kvr_xfer_region){.offset = g.offset, .stride = g.stride, .page_bytes = g.page_bytes};
	}
	sw->layout = (struct kvr_xfer_layout){.regions = sw->regions, .n_regions = sw->geom.n_regions,
					      .num_blocks = sw->geom.num_blocks, .kv_size = a->kv_bytes,
					      .arena_size = a->arena_seg.size};
	struct kvr_xfer_err xe = {0};
	int rc = kvr_xfer_layout_check(&sw->layout, &xe);
	if (rc) {
		kvr_xfer_err_format(&xe, err, sizeof(err));
		kvr_err("worker %u layout: %s", sw->worker, err);
		return rc;
	}
	uint64_t lane_bytes = kvr_xfer_slot_bytes(&sw->layout);
	if (lane_bytes > sw->slots->slot_bytes) {
		kvr_err("worker %u: lane bytes %llu exceed the slot size %llu", sw->worker,
			(unsigned long long)lane_bytes, (unsigned long long)sw->slots->slot_bytes);
		return -EINVAL;
	}

	/* Staging: leases of buffer_bytes (0 = one block), a pool of ceiling * percent. */
	uint64_t lease = a->cfg.staging.buffer_bytes ? a->cfg.staging.buffer_bytes : lane_bytes;
	if (lease < lane_bytes)
		lease = lane_bytes;
	uint64_t pool = a->cfg.staging.ceiling_bytes * pool_percent / 100;
	sw->chunk_blocks = (uint32_t)(lease / lane_bytes);
	sw->pool_leases = (uint32_t)(pool / lease);
	if (sw->pool_leases == 0)
		sw->pool_leases = 1;
	sw->cap_runs = kvr_xfer_plan_max_runs(sw->geom.n_regions, sw->chunk_blocks);
	sw->runs = calloc(sw->cap_runs, sizeof(*sw->runs));
	if (!sw->runs)
		return -ENOMEM;

	/* The worker's KV memory: a memfd with the pages (host), or a memfd holding a CUDA
	 * descriptor (IPC handles of its GPU tensors and a table of store events). */
	struct kvr_xfer_kvmem kv = {.kind = KVR_XFER_MEM_HOST, .size = a->kv_bytes};
	struct kvr_xfer_arena arena = {.base = a->arena_seg.base, .size = a->arena_seg.size};
	void *blob = NULL;
	size_t blob_len = 0;
	int d = kvr_cuda_desc_read(a->kv_fd, &blob, &blob_len, err, sizeof(err));
	if (d == 0) {
		kv.kind = KVR_XFER_MEM_CUDA;
		kv.u.cuda.blob = blob;
		kv.u.cuda.blob_len = (uint32_t)blob_len;
		kv.u.cuda.device = -1;
		sw->cuda = true;
		rc = kvr_cuda_events_map(a->kv_fd, &sw->events);
		if (rc) {
			free(blob);
			kvr_err("worker %u: cannot map its store events: %s", sw->worker, strerror(-rc));
			return rc;
		}
	} else if (d == -ENOMSG) {
		kv.u.host.fd = a->kv_fd;
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
	kvr_info("serving worker %u (lane %u, %u regions, %llu bytes per block, lease %u blocks x %u)", sw->worker,
		 sw->lane, sw->geom.n_regions, (unsigned long long)lane_bytes, sw->chunk_blocks, sw->pool_leases);
	return 0;
}

void stage_worker_close(struct stage_worker *sw)
{
	if (!sw)
		return;
	kvr_xfer_close(sw->xfer);
	sw->xfer = NULL;
	kvr_cuda_events_unmap(&sw->events);
	free(sw->regions);
	free(sw->runs);
	sw->regions = NULL;
	sw->runs = NULL;
}

int stage_copy_chunks(struct stage_worker *sw, uint32_t dir, const uint32_t *blocks, const uint64_t *slot_offs,
		      uint32_t n, const struct kvr_xfer_dep *ready, struct kvr_xfer_stats *st)
{
	/* Up to pool_leases chunks in flight; each waits for its copies before the lease is
	 * reused. The host backend completes inside submit, the CUDA one asynchronously. */
	uint64_t tickets[KVR_XFER_MAX_INFLIGHT];
	uint32_t depth = sw->pool_leases < KVR_XFER_MAX_INFLIGHT ? sw->pool_leases : KVR_XFER_MAX_INFLIGHT;
	uint32_t head = 0, inflight = 0;
	int rc = 0;
	for (uint32_t done = 0; done < n || inflight;) {
		if (done < n && inflight < depth && !rc) {
			uint32_t k = n - done < sw->chunk_blocks ? n - done : sw->chunk_blocks;
			struct kvr_xfer_err xe = {0};
			uint64_t bytes = 0;
			int nr = kvr_xfer_plan(&sw->layout, blocks + done, slot_offs + done, k, sw->runs, sw->cap_runs,
					       &bytes, &xe);
			if (nr < 0) {
				char why[160];
				kvr_xfer_err_format(&xe, why, sizeof(why));
				kvr_warn("worker %u: copy plan refused: %s", sw->worker, why);
				rc = nr;
				n = done; /* stop issuing */
				continue;
			}
			rc = kvr_xfer_submit(sw->xfer, dir, sw->runs, (size_t)nr, ready, &tickets[(head + inflight) % depth]);
			if (rc) {
				n = done;
				continue;
			}
			inflight++;
			done += k;
			kvr_actor_count(sw->a, KVR_STAT_XF_CHUNKS, 1);
			continue;
		}
		struct kvr_xfer_stats s = {0};
		int wrc = kvr_xfer_wait(sw->xfer, tickets[head], -1, &s);
		head = (head + 1) % depth;
		inflight--;
		if (wrc && !rc)
			rc = wrc;
		st->bytes += s.bytes;
		st->runs += s.runs;
		st->copies += s.copies;
		st->copy_ns += s.copy_ns;
		st->queue_ns += s.queue_ns;
		if (done >= n && !inflight)
			break;
	}
	return rc;
}

void stage_reply(struct stage_worker *sw, unsigned type, uint64_t wire, int status, const void *body,
		 size_t body_len, const uint32_t *failed, uint32_t n_failed, uint64_t first_ns)
{
	kvr_actor_count(sw->a, KVR_STAT_XF_REQUESTS, 1);
	kvr_actor_count(sw->a, KVR_STAT_XF_FAILED_BLOCKS, n_failed);
	struct kvr_msg m;
	kvr_msg_build(&m, type, (n_failed ? KVR_MSGF_MORE : 0) | (status ? KVR_MSGF_ERROR : 0), wire, 0, body, body_len);
	uint64_t now = kvr_now_ns(), deadline = now + STAGE_REPLY_TIMEOUT_NS;
	kvr_hist_observe(kvr_stats_hist(sw->a->stats, KVR_STAT_XF_HIST_FIRST), now - first_ns);
	int rc = kvr_msg_send(sw->rep, &m, deadline);
	if (!rc && n_failed)
		rc = kvr_list_send(sw->rep, KVR_MSG_BLOCKS, wire, 0, failed, n_failed, deadline);
	if (rc)
		kvr_err("worker %u does not read its %s replies (%s): reply to request %llx dropped", sw->worker,
			kvr_msg_type_name(type), strerror(-rc), (unsigned long long)wire);
}

bool stage_wire_current(const struct kvr_actor *a, uint64_t wire)
{
	return (uint32_t)(wire >> 48) == (atomic_load(&a->ent->generation) & 0xffff);
}
