/* kvringd layout: which rings and actors an instance has, and the segments that hold them. */
#include <errno.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "kvr_log.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "sup.h"


/* Symbolic endpoints of the per-worker rings, resolved for worker slot w. */
enum ep { EP_CLIENT, EP_LOOKUP, EP_LOADER, EP_STORER };

/* storer: the actor serving worker w's stores (-1: its own storer, SUP_ACTOR_STORER(w)). */
static int ep_resolve(enum ep e, unsigned w, int storer)
{
	switch (e) {
	case EP_CLIENT:
		return KVR_EP_CLIENT(w);
	case EP_LOOKUP:
		return (int)SUP_ACTOR_LOOKUP;
	case EP_LOADER:
		return (int)SUP_ACTOR_LOADER(w);
	case EP_STORER:
		return storer >= 0 ? storer : (int)SUP_ACTOR_STORER(w);
	}
	return KVR_EP_SUPERVISOR;
}

/* Per worker slot w: one ring per direction per edge. Add a row to add a ring. */
static const struct {
	const char *fmt; /* printf format taking the worker slot */
	enum ep producer, consumer;
} worker_rings[] = {
	{KVR_RING_LOOKUP_REQ, EP_CLIENT, EP_LOOKUP},
	{KVR_RING_LOOKUP_REP, EP_LOOKUP, EP_CLIENT},
	{KVR_RING_LOAD_REQ, EP_CLIENT, EP_LOADER},
	{KVR_RING_LOAD_REP, EP_LOADER, EP_CLIENT},
	{KVR_RING_STORE_REQ, EP_CLIENT, EP_STORER},
	{KVR_RING_STORE_REP, EP_STORER, EP_CLIENT},
	{KVR_RING_COMMIT_REQ, EP_STORER, EP_LOOKUP},
	{KVR_RING_COMMIT_REP, EP_LOOKUP, EP_STORER},
};

static void actor_name(const struct kvr_config *cfg, unsigned i, char *buf, size_t len)
{
	unsigned mw = cfg->instance.max_workers;
	if (i == SUP_ACTOR_LOOKUP)
		snprintf(buf, len, "lookup");
	else if (i >= SUP_ACTOR_REMOTE(cfg))
		snprintf(buf, len, "remote");
	else if (i >= SUP_ACTOR_GATHER(cfg, 0))
		snprintf(buf, len, "gather.%u", i - SUP_ACTOR_GATHER(cfg, 0));
	else if (i >= SUP_ACTOR_DISK(mw, 0))
		snprintf(buf, len, "disk.%u", i - SUP_ACTOR_DISK(mw, 0));
	else
		snprintf(buf, len, "%s.%u", (i - 1) % 2 ? "storer" : "loader", (i - 1) / 2);
}

static int add_spec(struct kvr_ctl_ring_spec *specs, unsigned cap, unsigned *n, uint32_t capacity, int producer,
		    int consumer, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static int add_spec(struct kvr_ctl_ring_spec *specs, unsigned cap, unsigned *n, uint32_t capacity, int producer,
		    int consumer, const char *fmt, ...)
{
	if (*n >= cap)
		return -ENOSPC;
	struct kvr_ctl_ring_spec *sp = &specs[*n];
	memset(sp, 0, sizeof(*sp));
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(sp->name, sizeof(sp->name), fmt, ap);
	va_end(ap);
	if (len < 0 || (size_t)len >= sizeof(sp->name))
		return -ENAMETOOLONG;
	sp->capacity = capacity;
	sp->producer = (int16_t)producer;
	sp->consumer = (int16_t)consumer;
	(*n)++;
	return 0;
}

int sup_ring_specs(const struct kvr_config *cfg, struct kvr_ctl_ring_spec *specs, unsigned cap)
{
	unsigned n = 0, n_actors = SUP_N_ACTORS(cfg);
	uint32_t capacity = cfg->rings.capacity;
	char name[KVR_ACTOR_NAME_MAX];
	int rc;

	for (unsigned i = 0; i < n_actors; i++) {
		actor_name(cfg, i, name, sizeof(name));
		rc = add_spec(specs, cap, &n, capacity, KVR_EP_SUPERVISOR, (int)i, KVR_RING_CTL_IN, name);
		if (rc)
			return rc;
		rc = add_spec(specs, cap, &n, capacity, (int)i, KVR_EP_SUPERVISOR, KVR_RING_CTL_OUT, name);
		if (rc)
			return rc;
	}
	for (unsigned w = 0; w < cfg->instance.max_workers; w++)
		for (size_t k = 0; k < sizeof(worker_rings) / sizeof(worker_rings[0]); k++) {
			rc = add_spec(specs, cap, &n, capacity, ep_resolve(worker_rings[k].producer, w, -1),
				      ep_resolve(worker_rings[k].consumer, w, -1), worker_rings[k].fmt, w);
			if (rc)
				return rc;
		}
	/* scheduler slots: lookups and leases only, with the lookup actor */
	for (unsigned i = 0; i < cfg->instance.max_schedulers; i++) {
		int client = KVR_EP_CLIENT(cfg->instance.max_workers + i);
		rc = add_spec(specs, cap, &n, capacity, client, (int)SUP_ACTOR_LOOKUP, KVR_RING_SCHED_REQ, i);
		if (!rc)
			rc = add_spec(specs, cap, &n, capacity, (int)SUP_ACTOR_LOOKUP, client, KVR_RING_SCHED_REP, i);
		if (rc)
			return rc;
	}
	/* L2: the lookup actor talks to each disk actor */
	for (unsigned d = 0; d < cfg->l2.n_dirs; d++) {
		int disk = (int)SUP_ACTOR_DISK(cfg->instance.max_workers, d);
		rc = add_spec(specs, cap, &n, capacity, (int)SUP_ACTOR_LOOKUP, disk, KVR_RING_DISK_REQ, d);
		if (!rc)
			rc = add_spec(specs, cap, &n, capacity, disk, (int)SUP_ACTOR_LOOKUP, KVR_RING_DISK_REP, d);
		if (rc)
			return rc;
	}
	/* the shared tier: the lookup actor talks to the remote actor */
	if (SUP_N_REMOTE(cfg)) {
		int rm = (int)SUP_ACTOR_REMOTE(cfg);
		rc = add_spec(specs, cap, &n, capacity, (int)SUP_ACTOR_LOOKUP, rm, KVR_RING_REMOTE_REQ);
		if (!rc)
			rc = add_spec(specs, cap, &n, capacity, rm, (int)SUP_ACTOR_LOOKUP, KVR_RING_REMOTE_REP);
		if (rc)
			return rc;
	}
	return (int)n;
}

void sup_storer_rings_bind(struct sup *s, unsigned w, int storer)
{
	char name[KVR_RING_NAME_MAX];
	for (size_t k = 0; k < sizeof(worker_rings) / sizeof(worker_rings[0]); k++) {
		enum ep prod = worker_rings[k].producer, cons = worker_rings[k].consumer;
		if (prod != EP_STORER && cons != EP_STORER)
			continue;
		snprintf(name, sizeof(name), worker_rings[k].fmt, w);
		int i = kvr_ctl_find_ring(s->ctl, name);
		if (i < 0) {
			kvr_err("ring %s missing from the directory", name);
			continue;
		}
		if (cons != EP_LOOKUP) {
			struct kvr_msg m;
			unsigned dropped = 0;
			while (kvr_ring_try_dequeue(kvr_ctl_ring(&s->rings, (unsigned)i), &m) == 0)
				dropped++;
			if (dropped)
				kvr_info("ring %s: %u stale messages dropped before it changes hands", name, dropped);
		}
		(void)kvr_ctl_ring_rebind(s->ctl, (unsigned)i, ep_resolve(prod, w, storer), ep_resolve(cons, w, storer));
	}
}

static int l1_slots(const struct kvr_config *cfg, uint64_t lane_bytes, uint32_t lanes, uint32_t block_tokens,
		    uint32_t *ret, char *err, size_t errlen);

int sup_check_config(const struct kvr_config *cfg, char *err, size_t errlen)
{
	if (cfg->instance.max_workers < 1 || cfg->instance.max_workers > KVR_CTL_MAX_WORKERS) {
		snprintf(err, errlen, "$.instance.max_workers: out of range for this build: %u (must be 1..%u)",
			 cfg->instance.max_workers, KVR_CTL_MAX_WORKERS);
		return -EINVAL;
	}
	if (cfg->supervisor.crash_loop_max_deaths < 1) {
		snprintf(err, errlen, "$.supervisor.crash_loop_max_deaths: must be >= 1");
		return -EINVAL;
	}
	if (cfg->instance.socket[0] != '/') {
		snprintf(err, errlen, "$.instance.socket: must be an absolute path");
		return -EINVAL;
	}
	/* the model must resolve to a geometry and L1 must hold at least one block of it (no
	 * model: checked when the first worker attaches, sup_l1_bind) */
	if (cfg->model.unbound)
		return 0;
	struct kvr_geometry g;
	int rc = sup_model_geometry(cfg, 0, 1, &g, err, errlen);
	if (rc)
		return rc;
	uint32_t n_slots;
	uint64_t lane = kvr_geometry_lane_bytes(&g);
	if (cfg->l1.slot_bytes && kvr_slots_slot_bytes(cfg->l1.slot_bytes) < lane)
		return kvr_errf(err, errlen, -EINVAL, "$.l1.slot_bytes: %llu is smaller than one block lane of the model "
				"(%llu bytes)", (unsigned long long)cfg->l1.slot_bytes, (unsigned long long)lane);
	return l1_slots(cfg, cfg->l1.slot_bytes ? kvr_slots_slot_bytes(cfg->l1.slot_bytes) : lane,
			kvr_geometry_lanes(&g), g.block_tokens, &n_slots, err, errlen);
}

static void fill_actor_table(struct sup *s)
{
	struct kvr_ctl *c = s->ctl;
	unsigned n_actors = SUP_N_ACTORS(&s->cfg), mw = s->cfg.instance.max_workers;
	char name[KVR_ACTOR_NAME_MAX], ring[KVR_RING_NAME_MAX];

	for (unsigned i = 0; i < n_actors; i++) {
		struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
		actor_name(&s->cfg, i, name, sizeof(name));
		memcpy(e->name, name, sizeof(e->name));
		if (i >= SUP_ACTOR_REMOTE(&s->cfg)) {
			e->kind = KVR_ACTOR_REMOTE;
			e->index = 0;
		} else if (i >= SUP_ACTOR_GATHER(&s->cfg, 0)) {
			e->kind = KVR_ACTOR_GATHER;
			e->index = i - SUP_ACTOR_GATHER(&s->cfg, 0);
		} else if (i >= SUP_ACTOR_DISK(mw, 0)) {
			e->kind = KVR_ACTOR_DISK;
			e->index = i - SUP_ACTOR_DISK(mw, 0);
		} else {
			e->kind = i == SUP_ACTOR_LOOKUP ? KVR_ACTOR_LOOKUP
				  : (i - 1) % 2	       ? KVR_ACTOR_STORER
							       : KVR_ACTOR_LOADER;
			e->index = i == SUP_ACTOR_LOOKUP ? 0 : (i - 1) / 2;
		}
		atomic_store(&e->state, KVR_ACTOR_IDLE);
		e->last_exit_code = -1;
		snprintf(ring, sizeof(ring), KVR_RING_CTL_IN, name);
		e->ctl_in = (uint16_t)kvr_ctl_find_ring(c, ring);
		snprintf(ring, sizeof(ring), KVR_RING_CTL_OUT, name);
		e->ctl_out = (uint16_t)kvr_ctl_find_ring(c, ring);
	}
	atomic_store(&c->n_actors, n_actors);
}

int sup_model_geometry(const struct kvr_config *cfg, uint32_t rank, uint32_t num_blocks, struct kvr_geometry *ret,
		       char *err, size_t errlen)
{
	const struct kvr_preset *p = cfg->model.preset[0] ? kvr_preset_find(cfg->model.preset) : NULL;
	int rc;
	if (cfg->model.preset[0] && !p) {
		snprintf(err, errlen, "$.model.preset: unknown preset \"%s\" (one of: %s)", cfg->model.preset,
			 kvr_preset_list());
		return -EINVAL;
	}
	bool fused = cfg->model.kv_fused;
	if (p && fused && (p->attention != KVR_ATTN_MHA || p->tail_per_token)) {
		snprintf(err, errlen, "$.model.kv_layout: \"kv-fused\" does not apply to preset \"%s\" (%s)", p->name,
			 p->attention != KVR_ATTN_MHA ? "mla" : "its pages carry a tail");
		return -EINVAL;
	} else if (p && fused) {
		uint32_t tp = cfg->model.tp_size, heads = p->kv_heads_total;
		rc = kvr_geometry_fill_vllm_fused(ret, p->layers, heads >= tp ? heads / tp : 1, p->head_dim,
						  p->dtype_bytes, cfg->model.block_tokens, num_blocks);
		if (!rc) {
			ret->tp_size = tp;
			ret->tp_rank = rank;
		}
	} else if (p) {
		rc = kvr_preset_geometry(p, cfg->model.tp_size, rank, cfg->model.block_tokens, num_blocks, ret);
	} else if (cfg->model.mla) {
		rc = kvr_geometry_fill_vllm_mla(ret, cfg->model.layers, cfg->model.head_dim, cfg->model.dtype_bytes,
						cfg->model.block_tokens, num_blocks);
		if (!rc) {
			ret->tp_size = cfg->model.tp_size;
			ret->tp_rank = rank;
		}
	} else {
		uint32_t tp = cfg->model.tp_size, heads = cfg->model.kv_heads;
		uint32_t per_rank = heads >= tp ? heads / tp : 1;
		rc = (!cfg->model.kv_fused ? kvr_geometry_fill_vllm_layer_major
								: kvr_geometry_fill_vllm_fused)(
			ret, cfg->model.layers, per_rank, cfg->model.head_dim, cfg->model.dtype_bytes,
			cfg->model.block_tokens, num_blocks);
		if (!rc) {
			ret->tp_size = tp;
			ret->tp_rank = rank;
		}
	}
	if (rc)
		snprintf(err, errlen, "$.model: cannot build the model geometry: %s", strerror(-rc));
	return rc;
}

/* How many slots L1 has: l1.capacity_bytes / slot bytes, or the workload's blocks x lanes. */
static int l1_slots(const struct kvr_config *cfg, uint64_t lane_bytes, uint32_t lanes, uint32_t block_tokens,
		    uint32_t *ret, char *err, size_t errlen)
{
	uint64_t slot_bytes = kvr_slots_slot_bytes(lane_bytes), n;
	if (cfg->l1.capacity_bytes) {
		uint64_t cap = cfg->l1.capacity_bytes;
		n = (cap > KVR_SLOTS_ARENA_DATA_OFF ? cap - KVR_SLOTS_ARENA_DATA_OFF : 0) / slot_bytes;
		if (n < lanes)
			return kvr_errf(err, errlen, -EINVAL,
					"$.l1.capacity_bytes: %llu bytes hold %llu slots of %llu bytes, one block needs %u "
					"(%llu bytes with the arena's 4 KiB header): raise l1.capacity_bytes",
					(unsigned long long)cap, (unsigned long long)n, (unsigned long long)slot_bytes,
					lanes, (unsigned long long)(slot_bytes * lanes + KVR_SLOTS_ARENA_DATA_OFF));
	} else {
		n = kvr_capacity_blocks(cfg->l1.workload_prompts, cfg->l1.workload_tokens, block_tokens) * lanes;
	}
	if (n > UINT32_MAX - 1 || !kvr_slots_memsize((uint32_t)n) || !kvr_slots_arena_memsize((uint32_t)n, lane_bytes))
		return kvr_errf(err, errlen, -EINVAL, "$.l1: %llu slots of %llu bytes is more than one arena holds",
				(unsigned long long)n, (unsigned long long)slot_bytes);
	*ret = (uint32_t)n;
	return 0;
}

/* L1: the slot table and the arena, sized from the model geometry and l1.* */
/*
 * One line on the arena's pages and what they cost. Every process that maps the arena and
 * touches all of it (each loader, storer, disk and remote actor, once populated: a worker's
 * actors populate in the background) holds one page-table entry per page: 8 bytes per
 * 4 KiB, 2 GiB per TiB — 512 times less with 2 MiB pages.
 */
static void log_arena_pages(const struct sup *s)
{
	uint64_t size = s->arena_seg.size, pte_4k = size / 4096 * 8, pte_2m = size / (2u << 20) * 8;
	char mode[24];
	if (s->arena_seg.huge) {
		kvr_info("arena: hugetlb pages of 2 MiB; a process that maps all of it needs %llu KiB of page tables",
			 (unsigned long long)(pte_2m >> 10));
	} else if (s->arena_seg.thp) {
		kvr_info("arena: transparent huge pages asked (shmem_enabled \"%s\"): %llu KiB of page tables per "
			 "process where the kernel gives them, %llu MiB where it falls back to 4 KiB pages",
			 kvr_shmem_thp_mode(mode, sizeof(mode)), (unsigned long long)(pte_2m >> 10),
			 (unsigned long long)(pte_4k >> 20));
	} else {
		kvr_info("arena: 4 KiB pages (%s, shmem_enabled \"%s\"): a process that maps all of it needs "
			 "%llu MiB of page tables; reserve huge pages (vm.nr_hugepages, docs/operations.md) for %llu KiB",
			 s->cfg.l1.huge_pages ? "no hugetlb pages free" : "l1.huge_pages false",
			 kvr_shmem_thp_mode(mode, sizeof(mode)), (unsigned long long)(pte_4k >> 20),
			 (unsigned long long)(pte_2m >> 10));
	}
}

/* L1 (slot table and arena) laid out for geometry g (rank 0's view), or a reason in err. */
static int create_l1(struct sup *s, const struct kvr_geometry *g, char *err, size_t errlen)
{
	uint64_t model_lane = kvr_geometry_lane_bytes(g);
	/* a slot holds l1.slot_bytes when given (a larger model's lanes fit it too) */
	uint64_t lane_bytes = s->cfg.l1.slot_bytes ? kvr_slots_slot_bytes(s->cfg.l1.slot_bytes) : model_lane;
	uint32_t lanes = kvr_geometry_lanes(g), n_slots;
	if (lane_bytes < model_lane)
		return kvr_errf(err, errlen, -EINVAL, "$.l1.slot_bytes: %llu is smaller than one block lane (%llu bytes)",
				(unsigned long long)s->cfg.l1.slot_bytes, (unsigned long long)model_lane);
	kvr_key ns;
	/* no model section: the slot format names the instance (engines of several models share it) */
	int rc = s->cfg.model.unbound ? kvr_slots_namespace(kvr_slots_slot_bytes(lane_bytes), s->cfg.model.cache_salt, &ns)
				      : kvr_geometry_namespace(g, s->cfg.model.model_id, s->cfg.model.cache_salt, &ns);
	if (rc)
		return kvr_errf(err, errlen, rc, "no key namespace for this geometry");
	rc = l1_slots(&s->cfg, lane_bytes, lanes, g->block_tokens, &n_slots, err, errlen);
	if (rc)
		return rc;
	uint64_t slot_bytes = kvr_slots_slot_bytes(lane_bytes);
	size_t tsize = kvr_slots_memsize((uint32_t)n_slots);
	uint64_t asize = kvr_slots_arena_memsize((uint32_t)n_slots, lane_bytes);
	if (!tsize || !asize)
		return kvr_errf(err, errlen, -EOVERFLOW, "$.l1: %u slots of %llu bytes overflow", n_slots,
				(unsigned long long)slot_bytes);
	rc = kvr_segment_create("kvring-slots", KVR_SEG_SLOTS, tsize, s->generation, 0, &s->slots_seg);
	if (rc)
		return kvr_errf(err, errlen, rc, "cannot create the slot table (%zu bytes): %s", tsize, strerror(-rc));
	/* no model section: engines of any block size and TP size share the slots, each slot
	 * records its block's size and lanes; a TP group has at most instance.max_workers ranks
	 * (attach refuses more), so no block has more lanes (the index's stride: kept small) */
	bool mixed = s->cfg.model.unbound;
	struct kvr_slots_config sc = {.n_slots = (uint32_t)n_slots, .lane_bytes = lane_bytes, .ns = ns,
				      .block_tokens = mixed ? 0 : g->block_tokens,
				      .tp_size = mixed ? s->cfg.instance.max_workers : g->tp_size, .quorum = mixed ? 0 : lanes};
	struct kvr_slot_table *slots;
	rc = kvr_slots_init(s->slots_seg.base, s->slots_seg.size, &sc, &slots);
	if (rc) {
		kvr_segment_close(&s->slots_seg);
		return kvr_errf(err, errlen, rc, "cannot initialise the slot table: %s", strerror(-rc));
	}
	/* huge pages need a 2 MiB multiple */
	if (s->cfg.l1.huge_pages)
		asize = (asize + (2ull << 20) - 1) & ~((2ull << 20) - 1);
	rc = kvr_segment_create("kvring-arena", KVR_SEG_ARENA, asize, s->generation,
				s->cfg.l1.huge_pages ? KVR_SEG_TRY_HUGE : 0, &s->arena_seg);
	if (rc) {
		kvr_segment_close(&s->slots_seg);
		return kvr_errf(err, errlen, rc, "cannot create the arena (%llu bytes): %s", (unsigned long long)asize,
				strerror(-rc));
	}
	/* published: the loop reads s->slots as "L1 is laid out" */
	s->geom = *g;
	s->geom.tp_rank = 0;
	s->lane_bytes = model_lane;
	s->lanes = lanes;
	s->ns = ns;
	s->slots = slots;
	s->ctl->arena_bytes = s->arena_seg.size;
	s->ctl->arena_huge = (uint32_t)s->arena_seg.huge;
	/* Nothing touches the arena here: kvringd is ready in the same time for 1 GiB or 1 TiB.
	 * sup_prefault_start() faults it in afterwards, in the background. */
	log_arena_pages(s);
	char nsbuf[KVR_KEY_FMT_LEN];
	if (!s->slots->quorum)
		kvr_info("L1: %llu slots of %llu bytes (block lanes of engines of any TP size), arena %llu bytes%s, "
			 "namespace %s", (unsigned long long)n_slots, (unsigned long long)slot_bytes,
			 (unsigned long long)s->arena_seg.size, s->arena_seg.huge ? " (huge pages)" : "",
			 kvr_key_fmt(s->ns, nsbuf));
	else
		kvr_info("L1: %llu slots of %llu bytes (%llu blocks x %u lanes), arena %llu bytes%s, namespace %s",
			 (unsigned long long)n_slots, (unsigned long long)slot_bytes,
			 (unsigned long long)(n_slots / s->lanes), s->lanes, (unsigned long long)s->arena_seg.size,
			 s->arena_seg.huge ? " (huge pages)" : "", kvr_key_fmt(s->ns, nsbuf));
	return 0;
}

int sup_l1_bind(struct sup *s, const struct kvr_geometry *g, const char *who, char *err, size_t errlen)
{
	if (s->slots)
		return kvr_errf(err, errlen, -EALREADY, "L1 is laid out already");
	if (g->tp_size > s->cfg.instance.max_workers)
		return kvr_errf(err, errlen, -EINVAL, "tp_size %u exceeds $.instance.max_workers (%u): each rank of a TP "
				"group attaches as one worker, so no group could ever be complete", g->tp_size,
				s->cfg.instance.max_workers);
	int rc = kvr_config_check_block(&s->cfg, kvr_geometry_lane_bytes(g), err, errlen);
	if (rc)
		return rc;
	rc = create_l1(s, g, err, errlen);
	if (rc)
		return rc;
	snprintf(s->bound_by, sizeof(s->bound_by), "%s", who);
	kvr_info("L1 laid out for the geometry of %s: %u layers, %u KV heads per rank of %u, head_dim %u, %u-byte "
		 "elements, %u-token blocks, %u regions", who, g->layers, g->kv_heads, g->tp_size, g->head_dim,
		 g->dtype_bytes, g->block_tokens, g->n_regions);
	/* what a model section starts at once (kvringd.c), started now that L1 exists */
	sup_metrics_bind(s);
	sup_prefault_start(s);
	sup_actor_start(s, &s->actors[SUP_ACTOR_LOOKUP]);
	for (unsigned d = 0; d < s->cfg.l2.n_dirs; d++)
		sup_actor_start(s, &s->actors[SUP_ACTOR_DISK(s->cfg.instance.max_workers, d)]);
	if (SUP_N_REMOTE(&s->cfg))
		sup_actor_start(s, &s->actors[SUP_ACTOR_REMOTE(&s->cfg)]);
	return 0;
}

bool sup_l1_idle(const struct sup *s, int except)
{
	if (!s->cfg.model.unbound || !s->slots || s->l1_releasing || s->phase != PH_RUN)
		return false;
	for (unsigned w = 0; w < s->cfg.instance.max_workers; w++)
		if ((int)w != except && atomic_load(&kvr_ctl_worker(s->ctl, w)->state) != KVR_WORKER_FREE)
			return false;
	for (unsigned i = 0; i < s->cfg.instance.max_schedulers; i++)
		if (atomic_load(&kvr_ctl_sched(s->ctl, i)->state) != KVR_WORKER_FREE)
			return false;
	return true;
}

/* The actors that serve L1 as a whole: what sup_l1_bind starts. */
static unsigned l1_actors(const struct sup *s, struct sup_actor **ret)
{
	unsigned n = 0;
	ret[n++] = (struct sup_actor *)&s->actors[SUP_ACTOR_LOOKUP];
	for (unsigned d = 0; d < s->cfg.l2.n_dirs; d++)
		ret[n++] = (struct sup_actor *)&s->actors[SUP_ACTOR_DISK(s->cfg.instance.max_workers, d)];
	if (SUP_N_REMOTE(&s->cfg))
		ret[n++] = (struct sup_actor *)&s->actors[SUP_ACTOR_REMOTE(&s->cfg)];
	return n;
}

void sup_l1_release_begin(struct sup *s, const char *why)
{
	struct sup_actor *a[2 + KVR_L2_MAX_DIRS];
	unsigned n = l1_actors(s, a);
	kvr_info("L1 (laid out for %s) is given up: %s; the next worker lays it out for its format", s->bound_by, why);
	s->l1_releasing = true;
	s->ctl->arena_bytes = 0; /* readers: "L1 not laid out" from now on */
	sup_prefault_stop(s);
	for (unsigned i = 0; i < n; i++)
		sup_actor_event(s, a[i], EV_STOP, 0);
}

void sup_l1_release_update(struct sup *s)
{
	if (!s->l1_releasing)
		return;
	struct sup_actor *a[2 + KVR_L2_MAX_DIRS];
	unsigned n = l1_actors(s, a);
	for (unsigned i = 0; i < n; i++)
		if (a[i]->pid > 0 || atomic_load(&a[i]->ent->state) == KVR_ACTOR_STOPPING)
			return;
	s->slots = NULL;
	sup_metrics_bind(s); /* /metrics stops reading the table before it goes (under its lock) */
	kvr_segment_close(&s->slots_seg);
	kvr_segment_close(&s->arena_seg);
	memset(&s->geom, 0, sizeof(s->geom));
	s->lanes = 0;
	s->lane_bytes = 0;
	s->ns = (kvr_key){0, 0};
	s->bound_by[0] = '\0';
	s->l1_releasing = false;
	kvr_info("L1 released: the lookup, disk and remote actors stopped; laid out again at the next worker's attach");
}

int sup_segments_create(struct sup *s)
{
	static struct kvr_ctl_ring_spec specs[KVR_CTL_MAX_RINGS];
	int n = sup_ring_specs(&s->cfg, specs, KVR_CTL_MAX_RINGS);
	if (n < 0) {
		kvr_err("ring list does not fit the control segment (max %u rings): %s", KVR_CTL_MAX_RINGS,
			strerror(-n));
		return n;
	}
	size_t cfg_len = strlen(s->cfg_json);
	size_t size = kvr_ctl_memsize(KVR_CTL_MAX_ACTORS, s->cfg.instance.max_workers, specs, (unsigned)n, cfg_len + 1);
	if (!size) {
		kvr_err("cannot size the control segment (ring capacity %u)", s->cfg.rings.capacity);
		return -EINVAL;
	}
	int rc = kvr_segment_create("kvring-ctl", KVR_SEG_CTL, size, s->generation, 0, &s->ctl_seg);
	if (rc) {
		kvr_err("cannot create the control segment (%zu bytes): %s", size, strerror(-rc));
		return rc;
	}
	rc = kvr_ctl_init(&s->ctl_seg, KVR_CTL_MAX_ACTORS, s->cfg.instance.max_workers, specs, (unsigned)n,
			  s->cfg_json);
	if (rc) {
		kvr_err("cannot initialise the control segment: %s", strerror(-rc));
		goto fail;
	}
	for (int i = 0; i < n; i++)
		kvr_ctl_ring_shm(s->ctl_seg.base, (unsigned)i)->spin_ns = s->cfg.rings.spin_ns;
	/* every client slot's rings and waiter into a memfd of its own: a client is handed the
	 * control segment read-only and only its area writable (kvr_ctl.h) */
	rc = kvr_ctl_split_areas(&s->ctl_seg, s->cfg.rings.spin_ns, s->area_fd);
	if (rc) {
		kvr_err("cannot give the client areas their own memory: %s", strerror(-rc));
		goto fail;
	}
	/* our own ring views, checked like anyone else's */
	rc = kvr_ctl_attach(&s->ctl_seg, &s->ctl, &s->rings);
	if (rc) {
		kvr_err("the control segment just built does not validate: %s", strerror(-rc));
		goto fail;
	}

	/* with a model section L1 is laid out now; without one at the first worker's attach
	 * (sup_l1_bind) */
	if (!s->cfg.model.unbound) {
		char err[KVR_GEOM_ERR_MAX + 160];
		struct kvr_geometry g;
		rc = sup_model_geometry(&s->cfg, 0, 1, &g, err, sizeof(err));
		if (!rc)
			rc = create_l1(s, &g, err, sizeof(err));
		if (rc) {
			kvr_err("%s", err);
			goto fail;
		}
	} else {
		kvr_info("no model section: L1 (%llu bytes) is laid out for the geometry of the first worker that "
			 "attaches", (unsigned long long)s->cfg.l1.capacity_bytes);
	}

	struct kvr_ctl *c = s->ctl;
	atomic_store(&c->state, KVR_INST_STARTING);
	c->supervisor_pid = getpid();
	c->generation = s->generation;
	c->started_ns = kvr_realtime_ns();
	snprintf(c->socket_path, sizeof(c->socket_path), "%s", s->cfg.instance.socket);
	fill_actor_table(s);
	return 0;
fail:
	sup_segments_close(s);
	return rc;
}

void sup_segments_close(struct sup *s)
{
	kvr_segment_close(&s->slots_seg);
	s->slots = NULL;
	kvr_segment_close(&s->arena_seg);
	kvr_segment_close(&s->ctl_seg);
	s->ctl = NULL;
	for (unsigned a = 0; a < KVR_CTL_MAX_CLIENTS; a++)
		if (s->area_fd[a] >= 0) {
			(void)close(s->area_fd[a]);
			s->area_fd[a] = -1;
		}
}
