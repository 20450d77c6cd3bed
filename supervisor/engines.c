/* kvringd engines: which engine each worker and scheduler belongs to, and its key namespace. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "kvr_log.h"
#include "sup.h"

/*
 * Several inference engines share one instance. An engine is named by its engine_id (one
 * worker per (engine, TP rank, DCP rank)) and brings a model namespace: engines of one
 * model_ns share blocks (eight TP-1 replicas of a model keep one L1 copy of a prefix),
 * engines of different model_ns share none, because model_ns replaces model.model_id in
 * the key namespace (kvr_geometry_namespace). With a model section the instance's geometry
 * binds every engine; without one engines of any geometry share the slots (attach.c,
 * slots_fit), and a scheduler takes its engine's geometry from one of its workers.
 *
 * Engine indices (0..KVR_CTL_MAX_ENGINES-1) are what the lookup actor sees (a lease is
 * keyed by (engine index, lease id)); an index is kept while any client of the engine is
 * attached and reused after that.
 */

static bool id_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
	       ch == '_' || ch == ':' || ch == '-';
}

int sup_engine_parse(const struct kvr_attach_engine *in, struct sup_engine_id *ret, char *why, size_t len)
{
	const char *id = in->engine_id, *ns = in->model_ns;
	size_t n_id = strnlen(id, sizeof(in->engine_id)), n_ns = strnlen(ns, sizeof(in->model_ns));
	if (n_id == sizeof(in->engine_id)) {
		snprintf(why, len, "engine_id: longer than %zu bytes", sizeof(in->engine_id) - 1);
		return -EINVAL;
	}
	if (n_ns == sizeof(in->model_ns)) {
		snprintf(why, len, "model_ns: longer than %zu bytes", sizeof(in->model_ns) - 1);
		return -EINVAL;
	}
	for (size_t i = 0; i < n_id; i++)
		if (!id_char(id[i])) {
			snprintf(why, len, "engine_id: byte %zu (0x%02x) is not one of [A-Za-z0-9._:-]", i,
				 (unsigned char)id[i]);
			return -EINVAL;
		}
	for (size_t i = 0; i < n_ns; i++)
		if ((unsigned char)ns[i] < 0x20 || (unsigned char)ns[i] > 0x7e) {
			snprintf(why, len, "model_ns: byte %zu (0x%02x) is not printable ASCII", i, (unsigned char)ns[i]);
			return -EINVAL;
		}
	for (size_t i = 0; i < sizeof(in->reserved) / sizeof(in->reserved[0]); i++)
		if (in->reserved[i]) {
			snprintf(why, len, "engine identity: reserved bytes not zero");
			return -EINVAL;
		}
	/* the rest of each array must be zero too: the strings are compared as arrays */
	for (size_t i = n_id; i < sizeof(in->engine_id); i++)
		if (id[i]) {
			snprintf(why, len, "engine_id: bytes after its NUL not zero");
			return -EINVAL;
		}
	for (size_t i = n_ns; i < sizeof(in->model_ns); i++)
		if (ns[i]) {
			snprintf(why, len, "model_ns: bytes after its NUL not zero");
			return -EINVAL;
		}
	memset(ret, 0, sizeof(*ret));
	snprintf(ret->id, sizeof(ret->id), "%s", n_id ? id : "default");
	memcpy(ret->model_ns, ns, n_ns);
	return 0;
}

const char *sup_engine_model(const struct sup *s, const struct sup_engine_id *e)
{
	return e->model_ns[0] ? e->model_ns : s->cfg.model.model_id;
}

/* The model entry of namespace ns: the one that holds it, else the first never used (named
 * now, for the instance's life), else KVR_CTL_MODEL_OTHER. */
static uint8_t model_entry(struct sup *s, const char *ns)
{
	for (unsigned i = 1; i <= KVR_CTL_MAX_MODELS; i++) {
		struct kvr_model_ent *m = kvr_ctl_model(s->ctl, i);
		if (!m->name[0]) {
			/* a longer one (a model_id of up to 127 bytes) is cut */
			size_t n = strnlen(ns, sizeof(m->name) - 1);
			memcpy(m->name, ns, n);
			m->name[n] = '\0';
			return (uint8_t)i;
		}
		if (!strncmp(m->name, ns, sizeof(m->name) - 1))
			return (uint8_t)i;
	}
	return KVR_CTL_MODEL_OTHER;
}

int sup_engine_join(struct sup *s, const struct sup_engine_id *e, char *why, size_t len)
{
	int free_ix = -1;
	for (unsigned i = 0; i < KVR_CTL_MAX_ENGINES; i++) {
		struct sup_engine *en = &s->engines[i];
		if (!en->refs) {
			if (free_ix < 0)
				free_ix = (int)i;
			continue;
		}
		if (strcmp(en->id.id, e->id))
			continue;
		if (strcmp(en->id.model_ns, e->model_ns)) {
			snprintf(why, len, "engine \"%s\" is attached with model_ns \"%s\", not \"%s\"", e->id,
				 sup_engine_model(s, &en->id), sup_engine_model(s, e));
			return -EINVAL;
		}
		en->refs++;
		return (int)i;
	}
	if (free_ix < 0) {
		snprintf(why, len, "%u engines are attached already (the most an instance serves)", KVR_CTL_MAX_ENGINES);
		return -EBUSY;
	}
	struct sup_engine *en = &s->engines[free_ix];
	en->id = *e;
	en->refs = 1;
	en->model = model_entry(s, sup_engine_model(s, e));
	atomic_fetch_add(&kvr_ctl_model(s->ctl, en->model)->engines, 1);
	kvr_info("engine %d: \"%s\", model namespace \"%s\"%s", free_ix, e->id, sup_engine_model(s, e),
		 en->model == KVR_CTL_MODEL_OTHER ? " (counted under model \"other\": the model table is full)" : "");
	return free_ix;
}

void sup_engine_leave(struct sup *s, int ix)
{
	if (ix < 0 || ix >= KVR_CTL_MAX_ENGINES || !s->engines[ix].refs)
		return;
	if (--s->engines[ix].refs == 0) {
		atomic_fetch_sub(&kvr_ctl_model(s->ctl, s->engines[ix].model)->engines, 1);
		kvr_info("engine %d (\"%s\"): no client attached any more", ix, s->engines[ix].id.id);
	}
}

const struct kvr_geometry *sup_engine_geometry(const struct sup *s, int ix)
{
	for (unsigned w = 0; w < s->cfg.instance.max_workers; w++)
		if (s->worker_engine[w] == ix && atomic_load(&kvr_ctl_worker(s->ctl, w)->state) == KVR_WORKER_ATTACHED)
			return kvr_ctl_worker_geometry(s->ctl, w);
	return NULL;
}

int sup_engine_namespace(const struct sup *s, int ix, const struct kvr_geometry *g, kvr_key *ret)
{
	const struct sup_engine_id *e = &s->engines[ix].id;
	return kvr_geometry_namespace(g, sup_engine_model(s, e), s->cfg.model.cache_salt, ret);
}

unsigned sup_engine_table(const struct sup *s, struct kvr_inspect_engine ret[KVR_CTL_MAX_ENGINES])
{
	uint32_t workers[KVR_CTL_MAX_ENGINES] = {0}, scheds[KVR_CTL_MAX_ENGINES] = {0};
	for (unsigned w = 0; w < KVR_CTL_MAX_WORKERS; w++)
		if (s->worker_engine[w] >= 0 && s->worker_engine[w] < KVR_CTL_MAX_ENGINES)
			workers[s->worker_engine[w]]++;
	for (unsigned i = 0; i < KVR_CTL_MAX_SCHEDULERS; i++)
		if (s->sched_engine[i] >= 0 && s->sched_engine[i] < KVR_CTL_MAX_ENGINES)
			scheds[s->sched_engine[i]]++;
	unsigned n = 0;
	for (unsigned e = 0; e < KVR_CTL_MAX_ENGINES; e++) {
		const struct sup_engine *en = &s->engines[e];
		if (!en->refs)
			continue;
		struct kvr_inspect_engine ent = {.index = e, .workers = workers[e], .schedulers = scheds[e]};
		snprintf(ent.id, sizeof(ent.id), "%s", en->id.id);
		const char *model = sup_engine_model(s, &en->id); /* a model_id over 63 bytes is cut */
		memcpy(ent.model_ns, model, strnlen(model, sizeof(ent.model_ns) - 1));
		if (!en->id.model_ns[0])
			ent.flags |= KVR_INSPECT_ENGINE_NS_MODEL_ID;
		ret[n++] = ent;
	}
	return n;
}

void sup_engine_publish(struct sup *s)
{
	struct kvr_inspect_engine t[KVR_CTL_MAX_ENGINES];
	sup_metrics_engines(s, t, sup_engine_table(s, t));
}
