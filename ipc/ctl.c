/* Control segment: layout planning, initialisation, client areas and validation. */
#include "kvr_ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)
#define ALIGN_AREA(x) (((x) + KVR_CTL_AREA_ALIGN - 1) & ~(size_t)(KVR_CTL_AREA_ALIGN - 1))

struct plan {
	size_t actors_off, workers_off, rings_off, stats_off, config_off, geom_off, models_off, areas_off, ring_area_off,
		total;
	unsigned n_areas;
	struct kvr_area_ent area[KVR_CTL_MAX_CLIENTS];
};

/* The client slot whose area holds a ring between these endpoints, or -1 (no client). */
static int ring_client(int producer, int consumer, unsigned n_areas)
{
	int ep = KVR_EP_IS_CLIENT(producer) ? producer : consumer;
	if (!KVR_EP_IS_CLIENT(ep) || (unsigned)KVR_EP_CLIENT_SLOT(ep) >= n_areas)
		return -1;
	return KVR_EP_CLIENT_SLOT(ep);
}

static int plan_layout(unsigned max_actors, unsigned max_workers, const struct kvr_ctl_ring_spec *rings,
		       unsigned n_rings, size_t config_cap, struct plan *p, size_t *ring_offs)
{
	if (!max_actors || max_actors > KVR_CTL_MAX_ACTORS || max_workers > KVR_CTL_MAX_WORKERS ||
	    n_rings > KVR_CTL_MAX_RINGS || (n_rings && !rings))
		return -EINVAL;
	p->n_areas = max_workers + KVR_CTL_MAX_SCHEDULERS;
	size_t off = ALIGN64(sizeof(struct kvr_ctl));
	p->actors_off = off;
	off = ALIGN64(off + max_actors * sizeof(struct kvr_actor_ent));
	p->workers_off = off;
	off = ALIGN64(off + (max_workers + KVR_CTL_MAX_SCHEDULERS) * sizeof(struct kvr_worker_ent));
	p->rings_off = off;
	off = ALIGN64(off + KVR_CTL_MAX_RINGS * sizeof(struct kvr_ring_ent));
	p->stats_off = off;
	off = ALIGN64(off + max_actors * sizeof(struct kvr_actor_stats));
	p->config_off = off;
	off = ALIGN64(off + config_cap);
	p->geom_off = off;
	off = ALIGN64(off + (size_t)max_workers * KVR_CTL_GEOM_BYTES);
	p->models_off = off;
	off = ALIGN64(off + (KVR_CTL_MAX_MODELS + 1) * sizeof(struct kvr_model_ent));
	p->areas_off = off;
	off = ALIGN64(off + p->n_areas * sizeof(struct kvr_area_ent));
	p->ring_area_off = off;
	/* the rings no client uses, then one area per client slot with that client's rings */
	for (int slot = -1; slot < (int)p->n_areas; slot++) {
		if (slot >= 0) {
			off = ALIGN_AREA(off);
			p->area[slot].offset = off;
			off += sizeof(struct kvr_client_area);
		}
		for (unsigned i = 0; i < n_rings; i++) {
			if (ring_client(rings[i].producer, rings[i].consumer, p->n_areas) != slot)
				continue;
			size_t sz = kvr_ring_memsize(rings[i].capacity, KVR_CTL_RING_MSG_SIZE);
			if (!sz)
				return -EINVAL;
			if (ring_offs)
				ring_offs[i] = off;
			off = ALIGN64(off + sz);
		}
		if (slot >= 0) {
			off = ALIGN_AREA(off);
			p->area[slot].bytes = off - p->area[slot].offset;
		}
	}
	p->total = off;
	return 0;
}

size_t kvr_ctl_memsize(unsigned max_actors, unsigned max_workers, const struct kvr_ctl_ring_spec *rings,
		       unsigned n_rings, size_t config_cap)
{
	struct plan p;
	return plan_layout(max_actors, max_workers, rings, n_rings, config_cap, &p, NULL) ? 0 : p.total;
}

/*
 * Which waiter each side of a ring sleeps on. An actor sleeps once for every ring it
 * serves: on its own waiter, where the rings kvringd and other actors produce point their
 * consumer waiter and the rings other actors consume point their producer waiter (a
 * reader freeing room wakes an actor whose replies wait in its outbox, kvr_outbox.h). A
 * ring a client produces or consumes keeps its own waiter on the actor's side, and the
 * actor adds it to its sleep (kvr_waiters_wait): a client never writes an actor's waiter.
 * A client sleeps on its area's waiter for the rings it consumes (the actors that produce
 * them wake it).
 */
static void waiters_of(const struct kvr_ctl *c, struct kvr_ring_shm *r, int prod, int cons, struct kvr_waiter **ret_cw,
		       struct kvr_waiter **ret_pw)
{
	bool prod_actor = prod >= 0 && (unsigned)prod < c->max_actors;
	bool cons_actor = cons >= 0 && (unsigned)cons < c->max_actors;
	bool cons_client = KVR_EP_IS_CLIENT(cons) && (unsigned)KVR_EP_CLIENT_SLOT(cons) < c->n_areas;
	struct kvr_waiter *cw = &r->own_cons_waiter, *pw = &r->own_prod_waiter;
	if (cons_actor && !KVR_EP_IS_CLIENT(prod))
		cw = &kvr_ctl_actor(c, (unsigned)cons)->waiter;
	else if (cons_client)
		cw = &kvr_ctl_area(c, (unsigned)KVR_EP_CLIENT_SLOT(cons))->waiter;
	if (prod_actor && !KVR_EP_IS_CLIENT(cons))
		pw = &kvr_ctl_actor(c, (unsigned)prod)->waiter;
	*ret_cw = cw;
	*ret_pw = pw;
}

static void point_waiters(struct kvr_ctl *c, struct kvr_ring_shm *r, int prod, int cons)
{
	struct kvr_waiter *cw, *pw;
	waiters_of(c, r, prod, cons, &cw, &pw);
	kvr_ring_set_consumer_waiter(r, cw);
	kvr_ring_set_producer_waiter(r, pw);
}

/* Client slot `slot`'s area header as kvr_ctl_init() writes it, into *ar. */
static void area_header(const struct kvr_ctl *c, unsigned slot, struct kvr_client_area *ar)
{
	/* a segment header of its own (informational: what a reader of the memfd alone sees) */
	memset(ar, 0, sizeof(*ar));
	ar->seg.layout_version = KVR_LAYOUT_VERSION;
	ar->seg.kind = KVR_SEG_CLIENT;
	ar->seg.size = kvr_ctl_area_ent(c, slot)->bytes;
	ar->seg.creator_pid = c->seg.creator_pid;
	ar->seg.generation = c->seg.generation;
	ar->seg.created_ns = c->seg.created_ns;
	ar->seg.magic = KVR_SEG_MAGIC;
	ar->slot = slot;
}

void kvr_ctl_area_reset(struct kvr_ctl *c, unsigned slot)
{
	area_header(c, slot, kvr_ctl_area(c, slot));
}

int kvr_ctl_init(struct kvr_segment *seg, unsigned max_actors, unsigned max_workers,
		 const struct kvr_ctl_ring_spec *rings, unsigned n_rings, const char *config_json)
{
	size_t cfg_len = config_json ? strlen(config_json) : 0;
	size_t ring_offs[KVR_CTL_MAX_RINGS];
	struct plan p;
	int rc = plan_layout(max_actors, max_workers, rings, n_rings, cfg_len + 1, &p, ring_offs);
	if (rc)
		return rc;
	if (!seg || !seg->base || seg->size < p.total)
		return -ENOSPC;

	struct kvr_ctl *c = seg->base;
	/* keep the segment header written by kvr_segment_create() */
	memset((uint8_t *)c + sizeof(c->seg), 0, p.ring_area_off - sizeof(c->seg));
	c->max_actors = max_actors;
	c->max_workers = max_workers;
	c->max_schedulers = KVR_CTL_MAX_SCHEDULERS;
	c->max_rings = KVR_CTL_MAX_RINGS;
	c->actors_off = p.actors_off;
	c->workers_off = p.workers_off;
	c->rings_off = p.rings_off;
	c->stats_off = p.stats_off;
	c->config_off = p.config_off;
	c->geom_off = p.geom_off;
	c->models_off = p.models_off;
	c->ring_area_off = p.ring_area_off;
	c->areas_off = p.areas_off;
	c->n_areas = p.n_areas;
	c->config_cap = (uint32_t)(cfg_len + 1);
	c->config_len = (uint32_t)cfg_len;
	if (cfg_len)
		memcpy((uint8_t *)c + p.config_off, config_json, cfg_len + 1);
	for (unsigned i = 0; i < max_actors; i++)
		kvr_ctl_actor(c, i)->last_exit_code = -1;
	for (unsigned a = 0; a < p.n_areas; a++) {
		((struct kvr_area_ent *)((uint8_t *)c + p.areas_off))[a] = p.area[a];
		kvr_ctl_area_reset(c, a);
	}
	for (unsigned i = 0; i < n_rings; i++) {
		struct kvr_ring_ent *e = kvr_ctl_ring_ent(c, i);
		strncpy(e->name, rings[i].name, KVR_RING_NAME_MAX - 1);
		e->offset = ring_offs[i];
		e->bytes = kvr_ring_memsize(rings[i].capacity, KVR_CTL_RING_MSG_SIZE);
		e->producer = rings[i].producer;
		e->consumer = rings[i].consumer;
		rc = kvr_ring_init((uint8_t *)c + e->offset, rings[i].capacity, KVR_CTL_RING_MSG_SIZE, e->name);
		if (rc)
			return rc;
		point_waiters(c, kvr_ctl_ring_shm(c, i), rings[i].producer, rings[i].consumer);
	}
	atomic_store(&c->n_rings, n_rings);
	return 0;
}

/* Region [off, off + len) of a segment of size bytes: 64-byte aligned, starting at or after
 * *end (the end of the region before it, in layout order), inside the segment. On success
 * moves *end past it. No sum can wrap: off and len are each checked against size first. */
static bool region_ok(uint64_t off, uint64_t len, uint64_t size, uint64_t *end)
{
	if (off % 64 || off < *end || off > size || len > size - off)
		return false;
	*end = off + len;
	return true;
}

/* addr is the waiter of entry k < n of a table of n entries of stride bytes at base. */
static bool table_waiter(uintptr_t addr, uintptr_t base, unsigned n, size_t stride, size_t waiter_off)
{
	if (addr < base || addr >= base + (uintptr_t)n * stride)
		return false;
	return (addr - base) % stride == waiter_off;
}

/* kvr_ring_waiters.ok for control-segment rings: an actor's or a client area's waiter. */
static bool ctl_waiter_ok(const void *ctx, uintptr_t addr)
{
	const struct kvr_ctl *c = ctx;
	uintptr_t base = (uintptr_t)c;
	if (table_waiter(addr, base + c->actors_off, c->max_actors, sizeof(struct kvr_actor_ent),
			 offsetof(struct kvr_actor_ent, waiter)))
		return true;
	for (unsigned a = 0; a < c->n_areas; a++)
		if (addr == (uintptr_t)&kvr_ctl_area(c, a)->waiter)
			return true;
	return false;
}

/* The capacity of a control-segment ring of `bytes` bytes (a directory entry's), or 0 when
 * no capacity gives exactly that size. */
static uint32_t ring_capacity(uint64_t bytes)
{
	if (bytes <= sizeof(struct kvr_ring_shm) || bytes > kvr_ring_memsize(1u << 30, KVR_CTL_RING_MSG_SIZE))
		return 0;
	uint64_t cap = (bytes - sizeof(struct kvr_ring_shm)) / KVR_CTL_RING_MSG_SIZE;
	if (cap > UINT32_MAX || kvr_ring_memsize((uint32_t)cap, KVR_CTL_RING_MSG_SIZE) != bytes)
		return 0;
	return (uint32_t)cap;
}

struct kvr_ring_waiters kvr_ctl_legal_waiters(const struct kvr_ctl *c)
{
	return (struct kvr_ring_waiters){.ok = ctl_waiter_ok, .ctx = c};
}

/* The area table: n_areas entries in slot order from `*end` on, aligned, none overlapping the
 * next, all inside the segment. Moves *end past the last. */
static bool areas_ok(const struct kvr_ctl *c, uint64_t size, uint64_t *end)
{
	if (c->n_areas != c->max_workers + c->max_schedulers)
		return false;
	for (unsigned a = 0; a < c->n_areas; a++) {
		const struct kvr_area_ent *e = kvr_ctl_area_ent(c, a);
		uint64_t off = e->offset, bytes = e->bytes;
		if (off % KVR_CTL_AREA_ALIGN || bytes % KVR_CTL_AREA_ALIGN || bytes < sizeof(struct kvr_client_area) ||
		    !region_ok(off, bytes, size, end))
			return false;
	}
	return true;
}

/* Validate the tables of a mapped control segment; build the views of its rings into
 * ret_rings (when not NULL) — of every ring, or only of client `only`'s (only >= 0). */
static int attach(const struct kvr_segment *seg, int only, struct kvr_ctl **ret_ctl, struct kvr_ctl_rings *ret_rings)
{
	if (!seg || !seg->base || seg->size < sizeof(struct kvr_ctl))
		return -EINVAL;
	struct kvr_ctl *c = seg->base;
	if (c->seg.kind != KVR_SEG_CTL)
		return -EPROTO;
	uint64_t size = seg->size;
	if (!c->max_actors || c->max_actors > KVR_CTL_MAX_ACTORS || c->max_workers > KVR_CTL_MAX_WORKERS ||
	    c->max_schedulers != KVR_CTL_MAX_SCHEDULERS || c->max_rings != KVR_CTL_MAX_RINGS ||
	    atomic_load(&c->n_rings) > c->max_rings)
		return -EBADMSG;
	/* The tables lie in kvr_ctl_init()'s order, none overlapping the next: a corrupt count or
	 * offset must not make one table alias another (or the header). */
	uint64_t end = sizeof(struct kvr_ctl);
	if (!region_ok(c->actors_off, (uint64_t)c->max_actors * sizeof(struct kvr_actor_ent), size, &end) ||
	    !region_ok(c->workers_off, (uint64_t)(c->max_workers + c->max_schedulers) * sizeof(struct kvr_worker_ent),
		       size, &end) ||
	    !region_ok(c->rings_off, (uint64_t)c->max_rings * sizeof(struct kvr_ring_ent), size, &end) ||
	    !region_ok(c->stats_off, (uint64_t)c->max_actors * sizeof(struct kvr_actor_stats), size, &end) ||
	    !region_ok(c->config_off, c->config_cap, size, &end) ||
	    !region_ok(c->geom_off, (uint64_t)c->max_workers * KVR_CTL_GEOM_BYTES, size, &end) ||
	    !region_ok(c->models_off, (uint64_t)(KVR_CTL_MAX_MODELS + 1) * sizeof(struct kvr_model_ent), size, &end) ||
	    c->n_areas > KVR_CTL_MAX_CLIENTS ||
	    !region_ok(c->areas_off, (uint64_t)c->n_areas * sizeof(struct kvr_area_ent), size, &end) ||
	    !region_ok(c->ring_area_off, 0, size, &end))
		return -EBADMSG;
	uint64_t ring_end = end; /* the rings no client uses end before the first area */
	if (!areas_ok(c, size, &end) || (only >= 0 && (unsigned)only >= c->n_areas))
		return -EBADMSG;
	uint64_t first_area = c->n_areas ? kvr_ctl_area_ent(c, 0)->offset : size;
	/* readers use the config as a C string */
	if (!c->config_cap || c->config_len >= c->config_cap || kvr_ctl_config_json(c)[c->config_len] != '\0')
		return -EBADMSG;
	uint64_t area_end[KVR_CTL_MAX_CLIENTS];
	for (unsigned a = 0; a < c->n_areas; a++)
		area_end[a] = kvr_ctl_area_ent(c, a)->offset + sizeof(struct kvr_client_area);
	unsigned n = atomic_load(&c->n_rings);
	const struct kvr_ring_waiters legal = kvr_ctl_legal_waiters(c);
	for (unsigned i = 0; i < n; i++) {
		struct kvr_ring_ent *e = kvr_ctl_ring_ent(c, i);
		struct kvr_ring view;
		if (!memchr(e->name, '\0', sizeof(e->name)))
			return -EBADMSG;
		/* Each ring where kvr_ctl_init() put it: a client's inside its area, the others
		 * before the first area; in directory order there, none overlapping another (two
		 * names, one ring, would give it two producers). */
		int cl = ring_client(e->producer, e->consumer, c->n_areas);
		if (cl >= 0) {
			const struct kvr_area_ent *ae = kvr_ctl_area_ent(c, (unsigned)cl);
			if (!region_ok(e->offset, e->bytes, ae->offset + ae->bytes, &area_end[cl]))
				return -EBADMSG;
		} else if (!region_ok(e->offset, e->bytes, first_area, &ring_end)) {
			return -EBADMSG;
		}
		if (only >= 0 && cl != only) {
			if (ret_rings)
				memset(&ret_rings->ring[i], 0, sizeof(ret_rings->ring[i]));
			continue;
		}
		/* The view's sizes come from the directory (kvringd's), never from the ring header,
		 * which a client writes: every ring here carries struct kvr_msg, and the entry's
		 * bytes say the capacity. */
		uint32_t cap = ring_capacity(e->bytes);
		if (!cap || kvr_ring_view_sized((uint8_t *)c + e->offset, cap, KVR_CTL_RING_MSG_SIZE, &legal, &view))
			return -EBADMSG;
		if (ret_rings)
			ret_rings->ring[i] = view;
	}
	if (ret_rings) {
		ret_rings->ctl = c;
		ret_rings->n = n;
	}
	*ret_ctl = c;
	return 0;
}

int kvr_ctl_attach(const struct kvr_segment *seg, struct kvr_ctl **ret_ctl, struct kvr_ctl_rings *ret_rings)
{
	return attach(seg, -1, ret_ctl, ret_rings);
}

int kvr_ctl_attach_client(const struct kvr_segment *seg, unsigned slot, struct kvr_ctl **ret_ctl,
			  struct kvr_ctl_rings *ret_rings)
{
	return attach(seg, slot < KVR_CTL_MAX_CLIENTS ? (int)slot : KVR_CTL_MAX_CLIENTS, ret_ctl, ret_rings);
}

int kvr_ctl_split_areas(struct kvr_segment *seg, uint32_t spin_ns, int *ret_fds)
{
	if (!seg || !seg->base || !seg->writable || !ret_fds)
		return -EINVAL;
	struct kvr_ctl *c = seg->base;
	uint64_t end = c->ring_area_off;
	if (!areas_ok(c, seg->size, &end))
		return -EBADMSG;
	unsigned done = 0;
	int rc = 0;
	for (; done < c->n_areas; done++) {
		/* the area as kvr_ctl_init() lays it out, in its own memfd, over its place */
		const struct kvr_area_ent *e = kvr_ctl_area_ent(c, done);
		int fd;
		if ((rc = kvr_ctl_area_fresh(c, done, spin_ns, &fd)))
			break;
		if ((rc = kvr_segment_map_over(fd, 1, (uint8_t *)seg->base + e->offset, e->bytes))) {
			(void)close(fd);
			break;
		}
		ret_fds[done] = fd;
		/* what the control segment's own memfd held there is never read again */
		(void)fallocate(seg->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)e->offset, (off_t)e->bytes);
	}
	if (rc)
		while (done)
			(void)close(ret_fds[--done]);
	return rc;
}

int kvr_ctl_map_area(struct kvr_segment *seg, unsigned slot, int fd, int writable)
{
	if (!seg || !seg->base || seg->size < sizeof(struct kvr_ctl) || fd < 0)
		return -EINVAL;
	const struct kvr_ctl *c = seg->base;
	uint64_t end = c->ring_area_off;
	if (c->n_areas > KVR_CTL_MAX_CLIENTS || c->areas_off > seg->size ||
	    (uint64_t)c->n_areas * sizeof(struct kvr_area_ent) > seg->size - c->areas_off || !areas_ok(c, seg->size, &end))
		return -EBADMSG;
	if (slot >= c->n_areas)
		return -EINVAL;
	const struct kvr_area_ent *e = kvr_ctl_area_ent(c, slot);
	return kvr_segment_map_over(fd, writable, (uint8_t *)seg->base + e->offset, e->bytes);
}

int kvr_ctl_map(int ctl_fd, const int *area_fds, unsigned n_areas, int writable, struct kvr_segment *ret)
{
	if (!ret || (n_areas && !area_fds))
		return -EINVAL;
	struct kvr_segment seg;
	int rc = kvr_segment_map(ctl_fd, KVR_SEG_CTL, writable, &seg);
	if (rc)
		return rc;
	if (n_areas && n_areas != ((const struct kvr_ctl *)seg.base)->n_areas)
		rc = -EBADMSG;
	for (unsigned i = 0; !rc && i < n_areas; i++)
		rc = kvr_ctl_map_area(&seg, i, area_fds[i], writable);
	if (rc) {
		kvr_segment_close(&seg);
		return rc;
	}
	*ret = seg;
	return 0;
}

int kvr_ctl_ring_view(const struct kvr_ctl *c, unsigned i, struct kvr_ring *ret)
{
	if (i >= atomic_load(&((struct kvr_ctl *)c)->n_rings) || i >= c->max_rings)
		return -ENOENT;
	const struct kvr_ring_ent *e = kvr_ctl_ring_ent(c, i);
	uint64_t size = c->seg.size;
	uint32_t cap = ring_capacity(e->bytes);
	if (e->offset < c->ring_area_off || e->offset % 64 || e->offset > size || e->bytes > size - e->offset || !cap)
		return -EBADMSG;
	const struct kvr_ring_waiters legal = kvr_ctl_legal_waiters(c);
	struct kvr_ring v;
	if (kvr_ring_view_sized((uint8_t *)c + e->offset, cap, KVR_CTL_RING_MSG_SIZE, &legal, &v))
		return -EBADMSG;
	*ret = v;
	return 0;
}

int kvr_ctl_find_ring(const struct kvr_ctl *c, const char *name)
{
	unsigned n = atomic_load(&((struct kvr_ctl *)c)->n_rings);
	for (unsigned i = 0; i < n; i++)
		if (strncmp(kvr_ctl_ring_ent(c, i)->name, name, KVR_RING_NAME_MAX) == 0)
			return (int)i;
	return -ENOENT;
}

const char *kvr_inst_state_name(unsigned s)
{
	static const char *const n[] = {"?", "starting", "running", "degraded", "draining", "stopped"};
	return s < sizeof(n) / sizeof(n[0]) ? n[s] : "?";
}

const char *kvr_actor_state_name(unsigned s)
{
	static const char *const n[] = {"unused", "idle", "starting", "ready", "backoff", "failed", "stopping"};
	return s < sizeof(n) / sizeof(n[0]) ? n[s] : "?";
}

const char *kvr_actor_kind_name(unsigned k)
{
	static const char *const n[] = {"?", "lookup", "loader", "storer", "disk", "gather", "remote"};
	return k < sizeof(n) / sizeof(n[0]) ? n[k] : "?";
}

int kvr_ctl_ring_rebind(struct kvr_ctl *c, unsigned i, int producer, int consumer)
{
	if (i >= atomic_load(&c->n_rings))
		return -ENOENT;
	struct kvr_ring_ent *e = kvr_ctl_ring_ent(c, i);
	e->producer = (int16_t)producer;
	e->consumer = (int16_t)consumer;
	point_waiters(c, kvr_ctl_ring_shm(c, i), producer, consumer);
	return 0;
}

int kvr_ctl_ring_reset(struct kvr_ctl *c, unsigned i, uint32_t spin_ns)
{
	if (i >= atomic_load(&c->n_rings) || i >= c->max_rings)
		return -ENOENT;
	const struct kvr_ring_ent *e = kvr_ctl_ring_ent(c, i);
	uint32_t cap = ring_capacity(e->bytes);
	if (!cap || !memchr(e->name, '\0', sizeof(e->name)) || e->offset % 64 || e->offset > c->seg.size ||
	    e->bytes > c->seg.size - e->offset)
		return -EBADMSG;
	struct kvr_ring_shm *r = kvr_ctl_ring_shm(c, i);
	int rc = kvr_ring_reset(r, cap, KVR_CTL_RING_MSG_SIZE, spin_ns, e->name);
	if (rc)
		return rc;
	point_waiters(c, r, e->producer, e->consumer);
	return 0;
}

int kvr_ctl_area_fresh(const struct kvr_ctl *c, unsigned slot, uint32_t spin_ns, int *ret_fd)
{
	if (!c || !ret_fd || slot >= c->n_areas)
		return -EINVAL;
	const struct kvr_area_ent *ae = kvr_ctl_area_ent(c, slot);
	char name[32];
	snprintf(name, sizeof(name), "kvring-client.%u", slot);
	struct kvr_segment a;
	int rc = kvr_segment_create(name, KVR_SEG_CLIENT, ae->bytes, c->seg.generation, 0, &a);
	if (rc)
		return rc;
	if (a.size != ae->bytes) {
		kvr_segment_close(&a);
		return -EINVAL;
	}
	area_header(c, slot, a.base);
	/* its rings as kvr_ctl_init() lays them out; a waiter offset is relative to its ring,
	 * so it is computed at the area's place in c and holds wherever the area is mapped */
	unsigned n = atomic_load(&((struct kvr_ctl *)c)->n_rings);
	for (unsigned i = 0; i < n && !rc; i++) {
		const struct kvr_ring_ent *e = kvr_ctl_ring_ent(c, i);
		if (ring_client(e->producer, e->consumer, c->n_areas) != (int)slot)
			continue;
		uint32_t cap = ring_capacity(e->bytes);
		if (!cap || e->offset < ae->offset || e->offset + e->bytes > ae->offset + ae->bytes) {
			rc = -EBADMSG;
			break;
		}
		struct kvr_ring_shm *r = (struct kvr_ring_shm *)((uint8_t *)a.base + (e->offset - ae->offset));
		if ((rc = kvr_ring_init(r, cap, KVR_CTL_RING_MSG_SIZE, e->name)))
			break;
		r->spin_ns = spin_ns;
		struct kvr_ring_shm *at = kvr_ctl_ring_shm(c, i);
		struct kvr_waiter *cw, *pw;
		waiters_of(c, at, e->producer, e->consumer, &cw, &pw);
		atomic_store(&r->cons_waiter_off, (int64_t)((uint8_t *)cw - (uint8_t *)at));
		atomic_store(&r->prod_waiter_off, (int64_t)((uint8_t *)pw - (uint8_t *)at));
	}
	int fd = a.fd;
	(void)munmap(a.base, a.size);
	if (rc) {
		(void)close(fd);
		return rc;
	}
	*ret_fd = fd;
	return 0;
}
