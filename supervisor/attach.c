/* kvringd attach protocol: ATTACH and ATTACH_SCHED checked and served, DETACH and its fence, freeing a worker slot. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "kvr_log.h"
#include "kvr_proto.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "sup.h"

/* Compare one geometry field with the instance's model; fill rep on a mismatch. */
#define GEOM_FIELD(field, key)                                                                                         \
	do {                                                                                                           \
		if (g->field != want.field) {                                                                          \
			sup_rep_init(s, rep, -EINVAL, "geometry mismatch: " #field " %u, the instance serves %u (%s)", \
				     g->field, want.field, key);                                                       \
			return -EINVAL;                                                                                \
		}                                                                                                      \
	} while (0)

/*
 * The worker's KV memory descriptor, before any actor maps it: every loader and storer
 * (and each restart of one) maps it shared read-write and copies through it, so memory an
 * actor cannot map, or that can shrink under its mapping (SIGBUS in the actor), would
 * crash-loop them and degrade the whole instance. Refused here instead, with the reason in
 * rep: an O_PATH or not read-write descriptor, anything but a memfd (F_GET_SEALS fails),
 * hugetlbfs, a memfd sealed against writes (unless it is a CUDA KV descriptor, which is
 * sealed F_SEAL_FUTURE_WRITE on purpose, kvr_proto.h), one that cannot be sealed against
 * shrinking. A memfd without F_SEAL_SHRINK is sealed here, before its size is read, so it
 * can never be truncated afterwards. *ret_bytes: its size.
 */
static int kv_memory_check(struct sup *s, int fd, struct kvr_proto_rep *rep, uint64_t *ret_bytes)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0) {
		sup_rep_init(s, rep, -EBADF, "the KV memory descriptor is not usable: %s", strerror(errno));
		return -EBADF;
	}
	if (fl & O_PATH) {
		sup_rep_init(s, rep, -EBADF, "the KV memory descriptor is an O_PATH descriptor: send the memfd opened "
			     "read-write");
		return -EBADF;
	}
	if ((fl & O_ACCMODE) != O_RDWR) {
		sup_rep_init(s, rep, -EBADF, "the KV memory descriptor is open %s: it must be open read-write",
			     (fl & O_ACCMODE) == O_RDONLY ? "read-only" : "write-only");
		return -EBADF;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		sup_rep_init(s, rep, -EBADF, "the KV memory descriptor is not a memfd (not even a regular file)");
		return -EBADF;
	}
	struct statfs sfs;
	if (fstatfs(fd, &sfs) == 0 && sfs.f_type == HUGETLBFS_MAGIC) {
		sup_rep_init(s, rep, -EINVAL, "the KV memory is a hugetlbfs memfd (MFD_HUGETLB): not supported, use a "
			     "plain memfd");
		return -EINVAL;
	}
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		sup_rep_init(s, rep, -EBADF, "the KV memory is not a memfd (F_GET_SEALS: %s): a regular file can be "
			     "truncated under the actors", strerror(errno));
		return -EBADF;
	}
	if (seals & F_SEAL_WRITE) {
		sup_rep_init(s, rep, -EPERM, "the KV memory memfd is sealed against writes (F_SEAL_WRITE): loads could "
			     "not write into it");
		return -EPERM;
	}
	if (seals & F_SEAL_FUTURE_WRITE) {
		uint32_t magic = 0;
		if (pread(fd, &magic, sizeof(magic), 0) != (ssize_t)sizeof(magic) || magic != KVR_CUDA_DESC_MAGIC) {
			sup_rep_init(s, rep, -EPERM, "the KV memory memfd is sealed against writes (F_SEAL_FUTURE_WRITE) and "
				     "is no CUDA KV descriptor");
			return -EPERM;
		}
	}
	if (!(seals & F_SEAL_SHRINK) && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		sup_rep_init(s, rep, -EPERM, "the KV memory memfd cannot be sealed against shrinking (F_SEAL_SHRINK: %s): "
			     "create it with MFD_ALLOW_SEALING", strerror(errno));
		return -EPERM;
	}
	/* sealed: the size read now is a floor for as long as anyone holds the memfd */
	if (fstat(fd, &st) < 0 || st.st_size <= 0) {
		sup_rep_init(s, rep, -EINVAL, "the KV memory memfd is empty");
		return -EINVAL;
	}
	*ret_bytes = (uint64_t)st.st_size;
	return 0;
}

/* No model section: engines of any model, block size and TP size share the slots, so what
 * must agree is the slot size L1 was laid out with for the first worker: a lane must fit a
 * slot, and a staging pool hold one. 0, or -EINVAL with rep naming what differs and what to do. */
static int slots_fit(struct sup *s, const struct kvr_geometry *g, struct kvr_proto_rep *rep)
{
	uint64_t lane = kvr_geometry_lane_bytes(g);
	char err[KVR_PROTO_REASON_MAX];
	if (g->tp_size > s->cfg.instance.max_workers)
		sup_rep_init(s, rep, -EINVAL, "tp_size %u exceeds $.instance.max_workers (%u): each rank of a TP group "
			     "attaches as one worker, so no group could ever be complete", g->tp_size,
			     s->cfg.instance.max_workers);
	else if (lane > s->slots->slot_bytes)
		sup_rep_init(s, rep, -EINVAL, "a block lane of %llu bytes does not fit this instance's slots of %llu: set "
			     "$.l1.slot_bytes to the largest model's lane", (unsigned long long)lane,
			     (unsigned long long)s->slots->slot_bytes);
	else if (kvr_config_check_block(&s->cfg, lane, err, sizeof(err)))
		sup_rep_init(s, rep, -EINVAL, "%s", err);
	else
		return 0;
	return -EINVAL;
}

/* No model section, and a worker of another slot format (without l1.slot_bytes: a lane that
 * rounds to another slot size than the first worker's) while no client is attached: L1 is given up and laid out again for it. The slots serve nobody, and an
 * operator who switched the node's engines expects the new ones served as a restart would
 * serve them: not refused until kvringd restarts, nor kept in slots of the old size away from
 * their own L2 files. The old format's L2 files stay in their own directory, adopted again
 * when it comes back. true: rep says to attach again (-EAGAIN). */
static bool rebind_when_idle(struct sup *s, unsigned w, const struct kvr_geometry *canon,
			     const struct sup_engine_id *eng, struct kvr_proto_rep *rep)
{
	uint64_t lane = kvr_geometry_lane_bytes(canon);
	/* without l1.slot_bytes the slots are the first worker's lane: a lane that needs another
	 * slot size (larger: it does not fit; smaller: its L2 files are in its own format's
	 * directory) lays L1 out again, as a restart would */
	bool other_format = !s->cfg.l1.slot_bytes && kvr_slots_slot_bytes(lane) != s->slots->slot_bytes;
	if (!s->cfg.model.unbound || !other_format || !sup_l1_idle(s, (int)w))
		return false;
	char why[256];
	snprintf(why, sizeof(why), "engine \"%.40s\" attaches with %u-token blocks, %u lanes of %llu bytes, and no "
		 "client is attached", eng->id, canon->block_tokens, kvr_geometry_lanes(canon), (unsigned long long)lane);
	sup_l1_release_begin(s, why);
	sup_rep_init(s, rep, -EAGAIN, "L1 is being laid out again for this worker's block format (no engine was "
		     "attached): attach again in a moment");
	return true;
}

/* The canonical block g of an attaching rank (rank_g) against the instance's model: the
 * fields, a DCP rank's rows per page, the bytes per lane and the page layout (no model section:
 * slots_fit). 0, or
 * -EINVAL with rep naming the field and the numbers. */
static int geometry_matches(struct sup *s, const struct kvr_geometry *rank_g, const struct kvr_geometry *g,
			    struct kvr_proto_rep *rep)
{
	struct kvr_geometry want;
	char why[KVR_GEOM_ERR_MAX + 64];
	if (s->cfg.model.unbound) {
		return slots_fit(s, g, rep);
	} else if (sup_model_geometry(&s->cfg, g->tp_rank < g->tp_size ? g->tp_rank : 0, g->num_blocks, &want, why,
				      sizeof(why))) {
		sup_rep_init(s, rep, -EINVAL, "%s", why);
		return -EINVAL;
	}
	GEOM_FIELD(block_tokens, "model.block_tokens");
	GEOM_FIELD(tp_size, "model.tp_size");
	GEOM_FIELD(attention, "model.attention");
	GEOM_FIELD(layers, "model.layers");
	GEOM_FIELD(kv_heads, "model.kv_heads per rank");
	GEOM_FIELD(head_dim, "model.head_dim");
	GEOM_FIELD(dtype_bytes, "model.dtype_bytes");
	/* A DCP rank's split of each page into rows and tail decides where its rows land in
	 * the canonical block: it must be the model's (ranks of a group then agree too). */
	for (unsigned i = 0; rank_g->dcp_size > 1 && i < g->n_regions && i < want.n_regions; i++)
		if (g->sem_bytes[i] != want.sem_bytes[i]) {
			char name[32];
			kvr_geometry_region_name(g, i, name, sizeof(name));
			sup_rep_init(s, rep, -EINVAL, "geometry mismatch: region %u (%s) of this DCP rank's group holds %u bytes "
				     "of token rows per block, the model %u (row width or page tail differ)", i, name,
				     g->sem_bytes[i], want.sem_bytes[i]);
			return -EINVAL;
		}
	uint64_t lane = kvr_geometry_lane_bytes(g);
	if (lane != s->lane_bytes) {
		if (rank_g->dcp_size > 1)
			sup_rep_init(s, rep, -EINVAL, "geometry mismatch: the canonical block of this DCP rank's group (dcp_size "
				     "%u) is %llu bytes per lane, the instance's slots hold %llu (a page tail is kept once per "
				     "rank)", rank_g->dcp_size, (unsigned long long)lane, (unsigned long long)s->lane_bytes);
		else
			sup_rep_init(s, rep, -EINVAL, "geometry mismatch: %llu bytes per block on this rank, the instance's "
				     "slots hold %llu", (unsigned long long)lane, (unsigned long long)s->lane_bytes);
		return -EINVAL;
	}
	kvr_key ns;
	if (kvr_geometry_namespace(g, s->cfg.model.model_id, s->cfg.model.cache_salt, &ns) || !kvr_key_eq(ns, s->ns)) {
		sup_rep_init(s, rep, -EINVAL, "geometry mismatch: the page layout differs from the instance's model "
			     "(model.kv_layout \"%s\": %u regions of %u bytes per block, this worker %u of %u)",
			     s->cfg.model.kv_layout, s->geom.n_regions, s->geom.page_bytes[0], g->n_regions,
			     g->page_bytes[0]);
		return -EINVAL;
	}
	return 0;
}

/* No model section: an engine must name its model, else two models of one geometry would
 * share blocks (the namespace would hold the geometry alone). 0, or -EINVAL with rep. */
static int engine_names_model(struct sup *s, const struct sup_engine_id *eng, struct kvr_proto_rep *rep)
{
	if (!s->cfg.model.unbound || eng->model_ns[0] || s->cfg.model.model_id[0])
		return 0;
	sup_rep_init(s, rep, -EINVAL, "engine \"%.40s\" names no model: with no model section each engine sends "
		     "kvr_attach_opts.model_ns (the vLLM connector does), or set $.model.model_id", eng->id);
	return -EINVAL;
}

/* No model section and L1 not laid out yet: lay it out for this worker's canonical block
 * (sup_l1_bind). 0, or -errno with rep naming what does not fit. */
static int bind_first(struct sup *s, const struct kvr_geometry *rank_g, const struct kvr_geometry *canon,
		      const struct sup_engine_id *eng, pid_t pid, struct kvr_proto_rep *rep)
{
	char who[96], err[KVR_PROTO_REASON_MAX];
	snprintf(who, sizeof(who), "engine \"%.40s\" rank %u pid %d", eng->id, rank_g->tp_rank, (int)pid);
	int rc = sup_l1_bind(s, canon, who, err, sizeof(err));
	if (rc) {
		kvr_warn("cannot lay L1 out for %s (%llu bytes per block and lane, %u lanes): %s", who,
			 (unsigned long long)kvr_geometry_lane_bytes(canon), kvr_geometry_lanes(canon), err);
		sup_rep_init(s, rep, rc, "%s", err); /* it names the key and the sizes */
	}
	return rc;
}

/* Validate what an attaching worker sends — its geometry (payload) and its KV memory
 * (one memfd) — against the instance's model, and adopt the memfd (fds[0] = -1). *ret_ns:
 * the key namespace this worker uses (the instance's; a DCP rank with page tails: its
 * layout's). On failure rep says what was wrong, naming the field and the numbers. */
_Static_assert(sizeof(struct kvr_geometry) + sizeof(struct kvr_attach_engine) <= KVR_PROTO_PAYLOAD_MAX,
	       "geometry and engine identity fit the attach payload");

static int attach_validate(struct sup *s, unsigned w, pid_t pid, const struct kvr_proto_req *req, int *fds,
			   unsigned n_fds, const struct sup_engine_id *eng, struct kvr_proto_rep *rep, kvr_key *ret_ns)
{
	if (n_fds != 1) {
		sup_rep_init(s, rep, -EBADF, "attach needs exactly one descriptor (the KV memory), got %u", n_fds);
		return -EBADF;
	}
	uint64_t kv_bytes;
	int rc = kv_memory_check(s, fds[0], rep, &kv_bytes);
	if (rc)
		return rc;
	struct kvr_geometry gbuf, canon;
	memcpy(&gbuf, req->payload, sizeof(gbuf));
	const struct kvr_geometry *rank_g = &gbuf;
	char err[KVR_GEOM_ERR_MAX];
	/* also: every page lies inside the (sealed, so never smaller) KV memory, else
	 * "region R (...): block B ends at E > kv_bytes N" */
	if (kvr_geometry_validate(rank_g, kv_bytes, err, sizeof(err))) {
		sup_rep_init(s, rep, -EINVAL, "geometry: %s", err);
		return -EINVAL;
	}
	/* A DCP rank is checked as the canonical block its group stores (kvr_dcp.h): the
	 * instance's model describes that block, whatever (D, I) produce it. */
	if (kvr_dcp_canonical_geometry(rank_g, &canon, err, sizeof(err))) {
		sup_rep_init(s, rep, -EINVAL, "geometry: %s", err);
		return -EINVAL;
	}
	if (engine_names_model(s, eng, rep))
		return -EINVAL;
	if (s->l1_releasing) {
		sup_rep_init(s, rep, -EAGAIN, "L1 is being laid out again for another block format (no engine was "
			     "attached): attach again in a moment");
		return -EAGAIN;
	}
	if (!s->slots && (rc = bind_first(s, rank_g, &canon, eng, pid, rep)) != 0)
		return rc;
	/* idle and of another slot format: laid out again for it even where it would fit */
	if (rebind_when_idle(s, w, &canon, eng, rep))
		return -EAGAIN;
	rc = geometry_matches(s, rank_g, &canon, rep);
	if (rc)
		return rc;
	/* one worker per (engine, TP rank, DCP rank) (MLA: every rank loads the same lane, still
	 * one worker each) */
	for (unsigned i = 0; i < s->cfg.instance.max_workers; i++) {
		const struct kvr_worker_ent *o = kvr_ctl_worker(s->ctl, i);
		/* a DETACHING predecessor (its actors are stopping) does not block its successor */
		if (i != w && atomic_load(&o->state) == KVR_WORKER_ATTACHED && o->tp_rank == rank_g->tp_rank &&
		    o->dcp_rank == rank_g->dcp_rank && s->worker_engine[i] >= 0 &&
		    !strcmp(s->engines[s->worker_engine[i]].id.id, eng->id)) {
			sup_rep_init(s, rep, -EEXIST, "engine \"%s\": TP rank %u (DCP rank %u) is already attached (worker "
				     "slot %u, pid %d)", eng->id, rank_g->tp_rank, rank_g->dcp_rank, i,
				     (int)atomic_load(&o->pid));
			return -EEXIST;
		}
	}
	if (kvr_geometry_namespace(rank_g, sup_engine_model(s, eng), s->cfg.model.cache_salt, ret_ns)) {
		sup_rep_init(s, rep, -EINVAL, "geometry: no key namespace for this rank's layout");
		return -EINVAL;
	}
	memcpy(kvr_ctl_worker_geometry(s->ctl, w), rank_g, sizeof(*rank_g));
	s->kv_fd[w] = fds[0];
	s->kv_bytes[w] = kv_bytes;
	fds[0] = -1;
	return 0;
}

/* The lookup actor was given up (FAILED: its crash-loop tally, actors.c) and nothing restarts
 * it short of restarting kvringd: every lookup, lease and store of a client would fail, so an
 * attach is refused at once (rep filled, -EPIPE as for any dead actor) rather than served or
 * left to wait out the client's attach timeout. A worker's own loader and storer start fresh
 * at its attach; one that fails then is seen by the client as FAILED at once (client.c). */
static bool lookup_given_up(struct sup *s, struct kvr_proto_rep *rep)
{
	const struct kvr_actor_ent *e = s->actors[SUP_ACTOR_LOOKUP].ent;
	if (atomic_load(&e->state) != KVR_ACTOR_FAILED)
		return false;
	char how[48];
	if (e->last_exit_signal)
		snprintf(how, sizeof(how), "last killed by signal %d", e->last_exit_signal);
	else
		snprintf(how, sizeof(how), "last exit code %d", e->last_exit_code);
	sup_rep_init(s, rep, -EPIPE, "the lookup actor was given up after %u deaths within %u s (%s): restart kvringd",
		     s->cfg.supervisor.crash_loop_max_deaths, s->cfg.supervisor.crash_loop_window_s, how);
	return true;
}

/* The first free worker slot for an attach from c, or -1 with rep saying why there is none
 * (or why c may not attach now). */
static int attach_slot(struct sup *s, struct sup_conn *c, struct kvr_proto_rep *rep)
{
	unsigned max = s->cfg.instance.max_workers;
	if (s->phase != PH_RUN) {
		sup_rep_init(s, rep, -ESHUTDOWN, "instance is shutting down");
		return -1;
	}
	if (sup_conn_attached(c)) {
		sup_rep_init(s, rep, -EALREADY, "already attached as %s %d", c->worker >= 0 ? "worker" : "scheduler",
			     c->worker >= 0 ? c->worker : c->sched);
		return -1;
	}
	if (lookup_given_up(s, rep))
		return -1;
	for (unsigned i = 0; i < max; i++)
		if (atomic_load(&kvr_ctl_worker(s->ctl, i)->state) == KVR_WORKER_FREE)
			return (int)i;
	sup_rep_init(s, rep, -EBUSY, "no free worker slot (max_workers=%u)", max);
	return -1;
}

/* The engine identity an attach payload carries after the geometry (all zeros when the
 * client sent none), parsed into eng: 0, or -1 with rep saying why not. */
static int attach_engine(struct sup *s, const struct kvr_proto_req *req, struct sup_engine_id *eng,
			 struct kvr_proto_rep *rep)
{
	struct kvr_attach_engine ein = {0};
	char why[KVR_PROTO_REASON_MAX];
	if (req->payload_len != sizeof(struct kvr_geometry) &&
	    req->payload_len != sizeof(struct kvr_geometry) + sizeof(ein)) {
		sup_rep_init(s, rep, -EPROTO, "attach payload is %u bytes: a geometry is %zu (+ %zu of engine identity)",
			     req->payload_len, sizeof(struct kvr_geometry), sizeof(ein));
		return -1;
	}
	if (req->payload_len > sizeof(struct kvr_geometry))
		memcpy(&ein, req->payload + sizeof(struct kvr_geometry), sizeof(ein));
	if (sup_engine_parse(&ein, eng, why, sizeof(why))) {
		sup_rep_init(s, rep, -EINVAL, "%s", why);
		return -1;
	}
	return 0;
}

/* Lanes a block of rank g's engine (its commit quorum): TP size for MHA, 1 for MLA; a DCP
 * rank's group stores the canonical block, whose TP size is tp_size / dcp_size. */
static uint8_t block_lanes(const struct kvr_geometry *g)
{
	struct kvr_geometry canon;
	return (uint8_t)kvr_geometry_lanes(kvr_dcp_canonical_geometry(g, &canon, NULL, 0) ? g : &canon);
}

/* Worker slot w's entry filled for c's process, the rank g describes and its engine, then
 * published: ATTACHED is stored last. */
static void worker_attached(struct sup *s, struct sup_conn *c, unsigned w, const struct kvr_geometry *g, int engine,
			    const struct sup_engine_id *eng)
{
	struct kvr_worker_ent *we = kvr_ctl_worker(s->ctl, w);
	atomic_store(&we->pid, c->pid);
	we->uid = c->uid;
	we->generation++;
	we->tp_rank = g->tp_rank;
	we->tp_size = g->tp_size;
	we->dcp_rank = g->dcp_rank;
	we->dcp_size = g->dcp_size;
	we->attached_ns = kvr_now_ns();
	we->engine = (uint16_t)engine;
	we->model = s->engines[engine].model;
	we->block_tokens = g->block_tokens; /* a DCP rank's: its group's canonical block */
	we->lanes = block_lanes(g);
	we->kind = KVR_CLIENT_WORKER;
	s->worker_engine[w] = engine;
	atomic_store(&kvr_ctl_area(s->ctl, w)->waiter.sleepers, 0);
	atomic_store(&we->state, KVR_WORKER_ATTACHED);
	c->worker = (int)w;
	s->worker_conn[w] = c;
	kvr_info("worker %d attached (pid %d, generation %u, engine %d \"%s\", TP rank %u)", (int)w, (int)c->pid,
		 we->generation, engine, eng->id, g->tp_rank);
	sup_engine_publish(s);
}

/* The attach reply of worker slot w (its store path: gather actor `gather`, or -1 for its
 * own storer): what the client needs of the instance, and two descriptors to come. */
static void attach_info(struct sup *s, unsigned w, const struct kvr_geometry *g, int gather, kvr_key ns,
			struct kvr_proto_rep *rep)
{
	rep->worker = (uint32_t)w;
	rep->n_fds = 2;
	struct kvr_attach_info info = {
		.ns_lo = ns.lo,
		.ns_hi = ns.hi,
		.lane = kvr_dcp_lane(g),
		.lanes = block_lanes(g), /* its own engine's (without a model section engines' differ) */
		.n_slots = s->slots->n_slots,
		.block_tokens = g->block_tokens, /* its own (without a model section, engines' differ) */
		.slot_bytes = s->slots->slot_bytes,
		/* its own block's lane (without a model section the slots may be larger) */
		.lane_bytes = kvr_dcp_canonical_lane_bytes(g),
		.kv_bytes = s->kv_bytes[w],
		.loader_actor = SUP_ACTOR_LOADER(w),
		.storer_actor = gather >= 0 ? (uint32_t)gather : SUP_ACTOR_STORER(w),
		.lookup_actor = SUP_ACTOR_LOOKUP,
		.group_ranks = g->dcp_size,
	};
	memcpy(rep->payload, &info, sizeof(info));
	rep->payload_len = sizeof(info);
}

/* Worker slot w's KV memory, adopted by attach_validate, closed again: the attach failed after. */
static void attach_drop_kv(struct sup *s, int w)
{
	(void)close(s->kv_fd[w]);
	s->kv_fd[w] = -1;
}

void sup_handle_attach(struct sup *s, struct sup_conn *c, const struct kvr_proto_req *req, int *fds,
		       unsigned n_fds)
{
	struct kvr_proto_rep rep;
	struct sup_engine_id eng;
	char why[KVR_PROTO_REASON_MAX];
	kvr_key ns;

	int w = attach_slot(s, c, &rep);
	if (w < 0)
		goto reply;
	sup_rep_init(s, &rep, 0, NULL);
	if (attach_engine(s, req, &eng, &rep))
		goto reply;
	if (attach_validate(s, (unsigned)w, c->pid, req, fds, n_fds, &eng, &rep, &ns) || rep.status) {
		if (!rep.status)
			rep.status = -EINVAL;
		goto reply;
	}
	int engine = sup_engine_join(s, &eng, why, sizeof(why));
	if (engine < 0) {
		sup_rep_init(s, &rep, engine, "%s", why);
		attach_drop_kv(s, w);
		goto reply;
	}

	const struct kvr_geometry *g = kvr_ctl_worker_geometry(s->ctl, (unsigned)w);
	/* a DCP rank stores through its group's gather actor (and loads through its own
	 * loader); every other worker has its own loader and storer */
	int gather = -1;
	if (g->dcp_size > 1) {
		gather = sup_group_join(s, (unsigned)w, g, engine, why, sizeof(why));
		if (gather < 0) {
			sup_rep_init(s, &rep, gather, "%s", why);
			sup_engine_leave(s, engine);
			attach_drop_kv(s, w);
			goto reply;
		}
	}
	worker_attached(s, c, (unsigned)w, g, engine, &eng);
	sup_actor_start(s, &s->actors[SUP_ACTOR_LOADER((unsigned)w)]);
	if (gather < 0)
		sup_actor_start(s, &s->actors[SUP_ACTOR_STORER((unsigned)w)]);
	else
		sup_groups_update(s);

	attach_info(s, (unsigned)w, g, gather, ns, &rep);
	/* the control segment, read-only, and the worker's own area (kvr_proto.h): no worker
	 * gets the arena, the slot table or another client's rings */
	if (sup_send_client_fds(s, c->fd, &rep, (unsigned)w))
		kvr_warn("worker %d: attach reply not sent; it detaches when the connection closes", w);
	return;
reply:
	if (rep.status)
		kvr_info("attach from pid %d refused: %s", (int)c->pid, rep.reason);
	(void)sup_send_rep(c->fd, &rep, NULL, 0);
}

/* A scheduler's attach checked (phase, connection, no descriptors, its engine identity
 * parsed into eng) and a free scheduler slot for it: the slot, or -1 with rep saying why not. */
static int sched_slot(struct sup *s, struct sup_conn *c, const struct kvr_proto_req *req, unsigned n_fds,
		      struct sup_engine_id *eng, struct kvr_proto_rep *rep)
{
	struct kvr_attach_engine ein;
	char why[KVR_PROTO_REASON_MAX];
	unsigned max = s->cfg.instance.max_schedulers;
	if (s->phase != PH_RUN) {
		sup_rep_init(s, rep, -ESHUTDOWN, "instance is shutting down");
		return -1;
	}
	if (sup_conn_attached(c)) {
		sup_rep_init(s, rep, -EALREADY, "already attached");
		return -1;
	}
	if (lookup_given_up(s, rep))
		return -1;
	if (n_fds) {
		sup_rep_init(s, rep, -EBADF, "a scheduler attaches without descriptors, got %u", n_fds);
		return -1;
	}
	if (req->payload_len != sizeof(ein)) {
		sup_rep_init(s, rep, -EPROTO, "scheduler attach payload is %u bytes, an engine identity is %zu",
			     req->payload_len, sizeof(ein));
		return -1;
	}
	memcpy(&ein, req->payload, sizeof(ein));
	if (sup_engine_parse(&ein, eng, why, sizeof(why))) {
		sup_rep_init(s, rep, -EINVAL, "%s", why);
		return -1;
	}
	for (unsigned i = 0; i < max; i++)
		if (atomic_load(&kvr_ctl_sched(s->ctl, i)->state) == KVR_WORKER_FREE)
			return (int)i;
	sup_rep_init(s, rep, -EBUSY, "no free scheduler slot (instance.max_schedulers=%u)", max);
	return -1;
}

/* Scheduler slot `slot`'s entry filled for c's process and its engine, then published:
 * ATTACHED is stored last. */
static void sched_attached(struct sup *s, struct sup_conn *c, unsigned slot, int engine,
			   const struct sup_engine_id *eng, uint32_t tp_size, uint32_t block_tokens, uint8_t lanes)
{
	struct kvr_worker_ent *se = kvr_ctl_sched(s->ctl, slot);
	atomic_store(&se->pid, c->pid);
	se->uid = c->uid;
	se->generation++;
	se->tp_rank = se->dcp_rank = 0;
	se->tp_size = tp_size; /* its engine's: a lease's loaders by default */
	se->dcp_size = 1;
	se->attached_ns = kvr_now_ns();
	se->engine = (uint16_t)engine;
	se->model = s->engines[engine].model;
	se->block_tokens = block_tokens;
	se->lanes = lanes;
	se->kind = KVR_CLIENT_SCHEDULER;
	atomic_store(&kvr_ctl_area(s->ctl, s->ctl->max_workers + slot)->waiter.sleepers, 0);
	atomic_store(&se->state, KVR_WORKER_ATTACHED);
	c->sched = (int)slot;
	s->sched_engine[slot] = engine;
	kvr_info("scheduler %d attached (pid %d, engine %d \"%s\")", (int)slot, (int)c->pid, engine, eng->id);
	sup_engine_publish(s);
}

/* ATTACH_SCHED: an engine's scheduler takes a scheduler slot (no KV memory, no actors of
 * its own): it gets the control segment and talks to the lookup actor on sched.req/rep.N. */
void sup_handle_attach_sched(struct sup *s, struct sup_conn *c, const struct kvr_proto_req *req, unsigned n_fds)
{
	struct kvr_proto_rep rep;
	struct sup_engine_id eng;
	char why[KVR_PROTO_REASON_MAX];
	kvr_key ns;

	int slot = sched_slot(s, c, req, n_fds, &eng, &rep);
	if (slot < 0)
		goto reply;
	if (!s->slots || s->l1_releasing) {
		sup_rep_init(s, &rep, -EAGAIN, "no worker has attached yet: this instance has no model section and lays "
			     "L1 out for the first worker's geometry; a scheduler attaches once its engine's workers did");
		goto reply;
	}
	if (engine_names_model(s, &eng, &rep))
		goto reply;
	int engine = sup_engine_join(s, &eng, why, sizeof(why));
	if (engine < 0) {
		sup_rep_init(s, &rep, engine, "%s", why);
		goto reply;
	}
	/* its engine's geometry: the model section's, or without one a worker's of the engine
	 * (engines of several models share such an instance) */
	const struct kvr_geometry *eg = s->cfg.model.unbound ? sup_engine_geometry(s, engine) : &s->geom;
	if (!eg) {
		sup_engine_leave(s, engine);
		sup_rep_init(s, &rep, -EAGAIN, "no worker of engine \"%.40s\" has attached yet: without a model section "
			     "a scheduler takes its engine's geometry from one", eng.id);
		goto reply;
	}
	if (sup_engine_namespace(s, engine, eg, &ns)) {
		sup_engine_leave(s, engine);
		sup_rep_init(s, &rep, -EINVAL, "no key namespace for engine \"%s\"", eng.id);
		goto reply;
	}
	sched_attached(s, c, (unsigned)slot, engine, &eng, eg->tp_size, eg->block_tokens, block_lanes(eg));

	sup_rep_init(s, &rep, 0, NULL);
	rep.worker = (uint32_t)slot;
	rep.n_fds = 2;
	struct kvr_attach_info info = {
		.ns_lo = ns.lo,
		.ns_hi = ns.hi,
		.lanes = block_lanes(eg),
		.n_slots = s->slots->n_slots,
		.block_tokens = eg->block_tokens, /* its engine's */
		.slot_bytes = s->slots->slot_bytes,
		.lane_bytes = kvr_dcp_canonical_lane_bytes(eg), /* = its lane without DCP */
		.lookup_actor = SUP_ACTOR_LOOKUP,
		.group_ranks = 1,
	};
	memcpy(rep.payload, &info, sizeof(info));
	rep.payload_len = sizeof(info);
	if (sup_send_client_fds(s, c->fd, &rep, s->ctl->max_workers + (unsigned)slot))
		kvr_warn("scheduler %d: attach reply not sent; it detaches when the connection closes", slot);
	return;
reply:
	/* EAGAIN (no worker yet) is asked again every few ms while requests come: not logged each time */
	if (rep.status == -EAGAIN)
		kvr_debug("scheduler attach from pid %d refused: %s", (int)c->pid, rep.reason);
	else
		kvr_info("scheduler attach from pid %d refused: %s", (int)c->pid, rep.reason);
	(void)sup_send_rep(c->fd, &rep, NULL, 0);
}

/* A scheduler is gone: its slot is free at once. Its leases stay until their workers loaded
 * them or their ttl passed (they belong to the engine, not to this connection); a reply
 * still in its ring cannot be taken by the next one (wire ids carry the slot's generation). */
static void sched_detach(struct sup *s, struct sup_conn *c)
{
	unsigned i = (unsigned)c->sched;
	struct kvr_worker_ent *se = kvr_ctl_sched(s->ctl, i);
	c->sched = -1;
	sup_engine_leave(s, s->sched_engine[i]);
	s->sched_engine[i] = -1;
	sup_engine_publish(s);
	atomic_store(&se->pid, 0);
	atomic_store(&se->state, KVR_WORKER_FREE);
	kvr_info("scheduler %u detached (pid %d)", i, (int)c->pid);
}

/* The worker is gone (connection closed or DETACH): stop its actors; sup_workers_update
 * announces it to the lookup actor once they have exited and frees its slot after that. */
static void worker_detach(struct sup *s, struct sup_conn *c)
{
	unsigned w = (unsigned)c->worker;
	struct kvr_worker_ent *we = kvr_ctl_worker(s->ctl, w);
	c->worker = -1;
	s->worker_conn[w] = NULL;
	s->worker_gone_sent[w] = false;
	sup_engine_leave(s, s->worker_engine[w]);
	s->worker_engine[w] = -1;
	sup_engine_publish(s);
	atomic_store(&we->state, KVR_WORKER_DETACHING);
	kvr_info("worker %u detached (pid %d)", w, (int)c->pid);
	sup_actor_event(s, &s->actors[SUP_ACTOR_LOADER(w)], EV_STOP, 0);
	sup_actor_event(s, &s->actors[SUP_ACTOR_STORER(w)], EV_STOP, 0);
	sup_group_leave(s, w);
}

/* DETACH from c: a scheduler detaches and is answered at once; a worker's answer is its
 * fence, given by sup_workers_update once the worker's loader, storer and gather actor have
 * exited — nothing of it can copy any more (docs/api.md). Either may attach again. */
void sup_handle_detach(struct sup *s, struct sup_conn *c)
{
	struct kvr_proto_rep rep;
	if (!sup_conn_attached(c)) {
		sup_rep_init(s, &rep, -ENOTCONN, "not attached");
	} else if (c->worker >= 0) {
		c->fence_slot = c->worker;
		c->fence_ns = kvr_now_ns();
		worker_detach(s, c);
		c->deadline = kvr_now_ns() + sup_attach_timeout_ns(s); /* it may attach again */
		return;
	} else {
		sched_detach(s, c);
		c->deadline = kvr_now_ns() + sup_attach_timeout_ns(s); /* it may attach again */
		sup_rep_init(s, &rep, 0, NULL);
	}
	(void)sup_send_rep(c->fd, &rep, NULL, 0);
}

void sup_conn_detach(struct sup *s, struct sup_conn *c)
{
	if (c->worker >= 0)
		worker_detach(s, c);
	if (c->sched >= 0)
		sched_detach(s, c);
}

/* A detached worker's load and store rings, once every actor serving them has exited, as
 * kvringd laid them out: the next worker of the slot inherits nothing its predecessor left
 * (scribbled indices would leave a ring stuck). The lookup actor resets lookup.req/rep at
 * WORKER_GONE. */
static void reset_worker_rings(struct sup *s, unsigned w)
{
	static const char *const fmts[] = {KVR_RING_LOAD_REQ, KVR_RING_LOAD_REP, KVR_RING_STORE_REQ, KVR_RING_STORE_REP};
	for (unsigned k = 0; k < sizeof(fmts) / sizeof(fmts[0]); k++) {
		char name[KVR_RING_NAME_MAX];
		snprintf(name, sizeof(name), fmts[k], w);
		int i = kvr_ctl_find_ring(s->ctl, name);
		const struct kvr_ring_ent *e = i < 0 ? NULL : kvr_ctl_ring_ent(s->ctl, (unsigned)i);
		int other = e ? (KVR_EP_IS_CLIENT(e->producer) ? e->consumer : e->producer) : -1;
		/* a DCP group's gather actor may serve it: only when that actor is not running */
		if (other >= 0 && (unsigned)other < s->ctl->max_actors &&
		    atomic_load(&kvr_ctl_actor(s->ctl, (unsigned)other)->pid) > 0) {
			kvr_warn("worker slot %u: ring %s not reset: %s still runs", w, name,
				 kvr_ctl_actor(s->ctl, (unsigned)other)->name);
			continue;
		}
		int rc = i < 0 ? i : kvr_ctl_ring_reset(s->ctl, (unsigned)i, s->cfg.rings.spin_ns);
		if (rc)
			kvr_warn("worker slot %u: cannot reset ring %s: %s", w, name, strerror(-rc));
	}
}

/* The lookup actor acknowledged WORKER_GONE: if it mapped the slot's fresh area (area_ack),
 * map it here too and drop the old one — from now on every process that serves the slot
 * (the lookup actor; the next loader, storer, gather actor, client: spawned or handed the
 * fresh fd) shares the fresh area, and the old one is mapped only by whoever kept it. If not
 * (it could not open it), the old area's rings are laid out again in place. false: the
 * lookup actor maps the fresh area and we cannot (out of memory): the slot must not serve
 * anyone until we can, so it stays DETACHING and this is tried again on the next pass. */
static bool take_fresh_area(struct sup *s, unsigned w, const struct kvr_worker_ent *we)
{
	int fresh = s->area_next_fd[w];
	if (fresh >= 0 && atomic_load_explicit(&we->area_ack, memory_order_acquire) == we->generation) {
		sup_metrics_pause(s); /* a render reads the area's ring counters */
		int rc = kvr_ctl_map_area(&s->ctl_seg, w, fresh, 1);
		sup_metrics_resume(s);
		if (rc) {
			if (!s->area_map_failed[w])
				kvr_err("worker slot %u: cannot map the fresh client area the lookup actor maps: %s; "
					"the slot waits until it can", w, strerror(-rc));
			s->area_map_failed[w] = true;
			return false;
		}
		s->area_map_failed[w] = false;
		s->area_next_fd[w] = -1;
		(void)close(s->area_fd[w]);
		s->area_fd[w] = fresh;
		return true;
	}
	s->area_next_fd[w] = -1;
	if (fresh >= 0)
		(void)close(fresh);
	reset_worker_rings(s, w);
	kvr_ctl_area_reset(s->ctl, w); /* its header and waiter: its client wrote there */
	return true;
}

/* Worker slot w's loader, storer and gather actor have exited: a DETACH waiting for that
 * (its fence) is answered. */
static void answer_fence(struct sup *s, unsigned w)
{
	for (struct sup_conn *c = s->conns; c; c = c->next) {
		if (c->fence_slot != (int)w || c->fd < 0)
			continue;
		struct kvr_proto_rep rep;
		sup_rep_init(s, &rep, 0, NULL);
		if (sup_send_rep(c->fd, &rep, NULL, 0))
			kvr_warn("worker slot %u: detach answer not sent (pid %d)", w, (int)c->pid);
		kvr_debug("worker slot %u: detach fenced in %llu us", w,
			  (unsigned long long)((kvr_now_ns() - c->fence_ns) / 1000));
		c->fence_slot = -1;
		c->deadline = kvr_now_ns() + sup_attach_timeout_ns(s); /* it may attach again */
	}
}

/*
 * A DETACHING worker slot goes FREE in three steps, each waiting for the one before:
 *   1. its loader, its storer and its DCP group's gather actor have exited: nothing can
 *      copy into or out of a slot for it any more, nor out of or into its memory — the
 *      worker's DETACH is answered now (its fence);
 *   2. WORKER_GONE goes to the lookup actor, which drops the worker's pins and aborts its
 *      WRITING slots — only now, so no copy still running lands in a slot given to another
 *      store (a full ctl ring is retried on the next pass);
 *   3. the lookup actor acknowledged it (gone_ack == generation): only then may a new
 *      worker attach in this slot, so its own WRITING slots can never be taken for its
 *      predecessor's. A lookup actor that restarts meanwhile gets the message from its
 *      ctl ring, which is kept across restarts.
 */
void sup_workers_update(struct sup *s)
{
	for (unsigned w = 0; w < s->cfg.instance.max_workers; w++) {
		struct kvr_worker_ent *we = kvr_ctl_worker(s->ctl, w);
		if (atomic_load(&we->state) != KVR_WORKER_DETACHING)
			continue;
		const struct sup_actor *l = &s->actors[SUP_ACTOR_LOADER(w)], *st = &s->actors[SUP_ACTOR_STORER(w)];
		if (l->pid > 0 || st->pid > 0 || !sup_group_release(s, w))
			continue;
		answer_fence(s, w);
		/* The lookup actor restarted since WORKER_GONE went out: it may have died with the
		 * message (taken off its ring, not acknowledged), or have acknowledged it and mapped
		 * the fresh area just before it died, its successor mapping the old one it was
		 * spawned with. Either way the successor gets the message again, and only its own
		 * answer counts (the acknowledgments are cleared first; it may handle the message
		 * twice — the kept ring copy and this — which is harmless: the second finds nothing
		 * to release and maps the same area again). */
		uint32_t lgen = atomic_load(&s->actors[SUP_ACTOR_LOOKUP].ent->generation);
		if (s->worker_gone_sent[w] && s->worker_gone_lgen[w] != lgen) {
			kvr_info("worker slot %u: WORKER_GONE again, to the restarted lookup actor", w);
			atomic_store(&we->area_ack, 0);
			atomic_store(&we->gone_ack, 0);
			s->worker_gone_sent[w] = false;
		}
		if (!s->worker_gone_sent[w]) {
			/* the slot's next client gets a fresh area: the gone one may live on and keep
			 * its mapping of the old one (a worker that detached and did not exit) */
			if (s->area_next_fd[w] < 0) {
				int rc = kvr_ctl_area_fresh(s->ctl, w, s->cfg.rings.spin_ns, &s->area_next_fd[w]);
				if (rc) {
					s->area_next_fd[w] = -1;
					kvr_warn("worker slot %u: no fresh client area (%s): its rings are reset in place",
						 w, strerror(-rc));
				}
			}
			struct kvr_msg m;
			struct kvr_msg_worker_gone gone = {.worker = w, .generation = we->generation,
							   .area_fd = s->area_next_fd[w]};
			kvr_msg_build(&m, KVR_MSG_WORKER_GONE, 0, 0, 0, &gone, sizeof(gone));
			if (sup_actor_send(&s->actors[SUP_ACTOR_LOOKUP], &m))
				continue; /* ctl ring full: again on the next pass */
			s->worker_gone_sent[w] = true;
			s->worker_gone_lgen[w] = lgen;
		}
		if (atomic_load_explicit(&we->gone_ack, memory_order_acquire) != we->generation)
			continue;
		if (s->kv_fd[w] >= 0)
			(void)close(s->kv_fd[w]);
		s->kv_fd[w] = -1;
		if (!take_fresh_area(s, w, we))
			continue;
		s->worker_gone_sent[w] = false;
		atomic_store(&we->pid, 0);
		atomic_store(&we->state, KVR_WORKER_FREE);
		kvr_debug("worker slot %u free", w);
	}
	sup_groups_update(s);
}
