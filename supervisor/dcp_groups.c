/* kvringd: DCP groups — which workers form one, and the gather actor that serves it once all its ranks attached. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <kvring/msg.h>

#include "kvr_log.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "sup.h"

/*
 * A DCP rank's stores need every rank's shard of a block: the D ranks of a group store
 * through one gather actor (actors/gather). When a rank attaches, its store and commit
 * rings (both directions) are rebound in the ring directory to the group's gather actor,
 * and the attach reply names that actor as the worker's storer, so the client library
 * addresses it, checks its liveness and stamps its generation exactly as a storer's. The
 * gather actor starts when the last rank of the group attached and stops as soon as one
 * leaves (its KV memory is gone: the group cannot store a block); a returning rank
 * restarts it. A slot of a rank that left is freed only after the gather actor exited,
 * and its rings then go back to its own storer.
 *
 * Loads need nothing from the other ranks: each DCP rank keeps its own loader, which
 * scatters its tokens out of the canonical lane (the same kvr_dcp runs), so the ranks'
 * loads run in parallel, and keep working while the group is incomplete.
 *
 * Group slot g uses actor SUP_ACTOR_GATHER(cfg, g). Groups are keyed by (engine, tp_rank /
 * D): two engines using DCP on one instance get groups of their own, each with its gather
 * actor; every rank of one group must declare the same tp_size, dcp_size and
 * dcp_interleave.
 */

/* Worker w still references group slot g (detaching, or a member). */
static bool slot_referenced_by_other(const struct sup *s, unsigned g, const struct sup_dcp_group *gr)
{
	for (unsigned v = 0; v < KVR_CTL_MAX_WORKERS; v++) {
		if (s->worker_group[v] != (int)g)
			continue;
		bool member = false;
		for (unsigned r = 0; r < gr->dcp_size && r < KVR_DCP_MAX; r++)
			member |= gr->members[r] == (int)v;
		if (!member)
			return true;
	}
	return false;
}

void sup_groups_init(struct sup *s)
{
	for (unsigned g = 0; g < sizeof(s->groups) / sizeof(s->groups[0]); g++) {
		s->groups[g] = (struct sup_dcp_group){.owner = -1};
		for (unsigned r = 0; r < KVR_DCP_MAX; r++)
			s->groups[g].members[r] = -1;
	}
	for (unsigned w = 0; w < KVR_CTL_MAX_WORKERS; w++)
		s->worker_group[w] = -1;
}

unsigned sup_group_members(const struct sup_dcp_group *gr)
{
	unsigned n = 0;
	for (unsigned r = 0; r < KVR_DCP_MAX; r++)
		n += gr->members[r] >= 0;
	return n;
}

const struct sup_dcp_group *sup_gather_group(const struct sup *s, unsigned actor)
{
	unsigned first = SUP_ACTOR_GATHER(&s->cfg, 0);
	if (actor < first || actor >= first + SUP_N_GATHER(&s->cfg))
		return NULL;
	return &s->groups[actor - first];
}

static struct sup_actor *gather_of(struct sup *s, unsigned g)
{
	return &s->actors[SUP_ACTOR_GATHER(&s->cfg, g)];
}

int sup_group_join(struct sup *s, unsigned w, const struct kvr_geometry *g, int engine, char *err, size_t errlen)
{
	unsigned n = SUP_N_GATHER(&s->cfg), idx = kvr_dcp_group_index(g), first = g->tp_rank - g->dcp_rank;
	int slot = -1;
	if (!s->exe[KVR_ACTOR_GATHER][0])
		return kvr_errf(err, errlen, -ENOENT, "DCP rank refused: this instance has no kvring-gather executable");
	if (g->dcp_size > s->cfg.instance.max_workers)
		return kvr_errf(err, errlen, -EINVAL,
				"dcp_size %u > instance.max_workers %u: the DCP group could never be complete", g->dcp_size,
				s->cfg.instance.max_workers);
	for (unsigned i = 0; i < n && slot < 0; i++) {
		struct sup_dcp_group *gr = &s->groups[i];
		if (!sup_group_members(gr) || gr->index != idx || gr->engine != engine)
			continue;
		if (gr->tp_size != g->tp_size || gr->dcp_size != g->dcp_size || gr->interleave != g->dcp_interleave)
			return kvr_errf(err, errlen, -EINVAL,
					"DCP group %u (TP ranks %u..%u) has tp_size %u, dcp_size %u, dcp_interleave %u; "
					"this rank says %u, %u, %u",
					idx, first, first + gr->dcp_size - 1, gr->tp_size, gr->dcp_size, gr->interleave,
					g->tp_size, g->dcp_size, g->dcp_interleave);
		if (gr->members[g->dcp_rank] >= 0)
			return kvr_errf(err, errlen, -EEXIST, "DCP rank %u of group %u is already attached (worker slot %d)",
					g->dcp_rank, idx, gr->members[g->dcp_rank]);
		slot = (int)i;
	}
	/* a new group: a slot with no members whose gather actor has exited */
	for (unsigned i = 0; i < n && slot < 0; i++) {
		if (sup_group_members(&s->groups[i]) || gather_of(s, i)->pid > 0 ||
		    atomic_load(&gather_of(s, i)->ent->state) != KVR_ACTOR_IDLE)
			continue;
		bool held = false;
		for (unsigned v = 0; v < KVR_CTL_MAX_WORKERS; v++)
			held |= s->worker_group[v] == (int)i;
		if (held)
			continue;
		struct sup_dcp_group *gr = &s->groups[i];
		*gr = (struct sup_dcp_group){.tp_size = g->tp_size, .dcp_size = g->dcp_size,
					     .interleave = g->dcp_interleave, .index = idx, .engine = engine,
					     .owner = -1};
		for (unsigned r = 0; r < KVR_DCP_MAX; r++)
			gr->members[r] = -1;
		slot = (int)i;
	}
	if (slot < 0)
		return kvr_errf(err, errlen, -EBUSY, "no free DCP group (%u gather actors, instance.max_workers %u)", n,
				s->cfg.instance.max_workers);
	struct sup_dcp_group *gr = &s->groups[slot];
	gr->members[g->dcp_rank] = (int)w;
	s->worker_group[w] = slot;
	sup_storer_rings_bind(s, w, (int)SUP_ACTOR_GATHER(&s->cfg, (unsigned)slot));
	kvr_info("worker %u joins DCP group %u of engine %d as rank %u of %u (%u attached)", w, idx, engine, g->dcp_rank,
		 g->dcp_size, sup_group_members(gr));
	return (int)SUP_ACTOR_GATHER(&s->cfg, (unsigned)slot);
}

void sup_group_leave(struct sup *s, unsigned w)
{
	int slot = s->worker_group[w];
	if (slot < 0)
		return;
	struct sup_dcp_group *gr = &s->groups[slot];
	for (unsigned r = 0; r < gr->dcp_size; r++)
		if (gr->members[r] == (int)w)
			gr->members[r] = -1;
	kvr_info("worker %u left DCP group %u: its gather actor stops until the group is complete again", w, gr->index);
	sup_actor_event(s, gather_of(s, (unsigned)slot), EV_STOP, 0);
}

bool sup_group_release(struct sup *s, unsigned w)
{
	int slot = s->worker_group[w];
	if (slot < 0)
		return true;
	if (gather_of(s, (unsigned)slot)->pid > 0)
		return false;
	sup_storer_rings_bind(s, w, -1);
	s->worker_group[w] = -1;
	return true;
}

/* A gather actor that exited while its group is incomplete is not restarted, so nothing
 * would RESET what it left WRITING (it may have been killed mid-store): kvringd sends the
 * RESET on the owner's commit ring itself (its producer, the gather actor, is gone). */
static void reset_owner(struct sup *s, struct sup_dcp_group *gr)
{
	gr->reset_due = false;
	bool still_member = false;
	for (unsigned r = 0; r < gr->dcp_size && r < KVR_DCP_MAX; r++)
		still_member |= gr->members[r] == gr->owner;
	if (gr->owner < 0 || !still_member)
		return; /* the owner left: WORKER_GONE reclaimed its slots */
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), KVR_RING_COMMIT_REQ, (unsigned)gr->owner);
	int i = kvr_ctl_find_ring(s->ctl, name);
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_RESET, 0, (uint64_t)kvr_now_ns() << 8 | 0xff, 0, NULL, 0);
	if (i < 0 || kvr_ring_try_enqueue(kvr_ctl_ring(&s->rings, (unsigned)i), &m))
		kvr_warn("DCP group %u: RESET of worker %d's unfinished slots not sent", gr->index, gr->owner);
}

void sup_groups_update(struct sup *s)
{
	if (s->phase != PH_RUN)
		return;
	for (unsigned i = 0; i < SUP_N_GATHER(&s->cfg); i++) {
		struct sup_dcp_group *gr = &s->groups[i];
		struct sup_actor *a = gather_of(s, i);
		if (!sup_group_members(gr) || a->pid > 0 || atomic_load(&a->ent->state) != KVR_ACTOR_IDLE)
			continue;
		if (!sup_group_complete(gr)) {
			if (gr->reset_due)
				reset_owner(s, gr);
			continue;
		}
		/* a rank that left and came back in another slot: start only once the old slot
		 * was released (its rings back to its own storer), or it would stay DETACHING */
		if (slot_referenced_by_other(s, i, gr))
			continue;
		kvr_info("DCP group %u complete (%u ranks): starting %s", gr->index, gr->dcp_size, a->ent->name);
		gr->owner = gr->members[0];
		gr->reset_due = true;
		sup_actor_start(s, a);
	}
}
