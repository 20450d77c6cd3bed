/* kvringd's /status document: the instance, read from the segments /metrics reads, as one cJSON tree. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_read.h"
#include "status.h"

/*
 * Numbers: counters and sizes are unsigned 64-bit; those above 2^53 are written as raw JSON
 * integers (a double would round them), the rest as cJSON numbers, so every integer is exact.
 * A failed allocation anywhere marks the collection failed (cJSON's Add* only return NULL).
 */

#define EXACT_MAX (1ull << 53)

struct coll {
	const struct sup_metrics_view *v;
	const struct kvr_ctl *c;
	const struct kvr_config *cfg; /* the effective config in the segment; NULL when it did not parse */
	bool oom;
};

static cJSON *check(struct coll *k, cJSON *item)
{
	if (!item)
		k->oom = true;
	return item;
}

static void u64(struct coll *k, cJSON *o, const char *key, uint64_t v)
{
	char raw[24];
	if (v <= EXACT_MAX) {
		check(k, cJSON_AddNumberToObject(o, key, (double)v));
		return;
	}
	snprintf(raw, sizeof(raw), "%llu", (unsigned long long)v);
	check(k, cJSON_AddRawToObject(o, key, raw));
}

static void i64(struct coll *k, cJSON *o, const char *key, int64_t v)
{
	check(k, cJSON_AddNumberToObject(o, key, (double)v));
}

static void boolean(struct coll *k, cJSON *o, const char *key, bool v)
{
	check(k, cJSON_AddBoolToObject(o, key, v));
}

/* A string of at most max bytes (a fixed-size field: maybe not NUL-terminated), bytes
 * outside printable ASCII as '?'. */
static void str(struct coll *k, cJSON *o, const char *key, const char *s, size_t max)
{
	char buf[4096];
	size_t n = strnlen(s, max < sizeof(buf) - 1 ? max : sizeof(buf) - 1);
	for (size_t i = 0; i < n; i++)
		buf[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] <= 0x7e ? s[i] : '?';
	buf[n] = 0;
	check(k, cJSON_AddStringToObject(o, key, buf));
}

static cJSON *object(struct coll *k, cJSON *parent, const char *key)
{
	return check(k, cJSON_AddObjectToObject(parent, key));
}

/* A new object appended to array a (NULL when out of memory). */
static cJSON *element(struct coll *k, cJSON *a)
{
	cJSON *o = cJSON_CreateObject();
	if (o && !cJSON_AddItemToArray(a, o)) {
		cJSON_Delete(o);
		o = NULL;
	}
	return check(k, o);
}

/* o[key] = a/b as a number, or null when b is 0. */
static void ratio(struct coll *k, cJSON *o, const char *key, uint64_t a, uint64_t b)
{
	check(k, b ? cJSON_AddNumberToObject(o, key, (double)a / (double)b) : cJSON_AddNullToObject(o, key));
}

/* ---- the instance and its config ---------------------------------------------------- */

static unsigned clients_attached(const struct kvr_ctl *c, unsigned first, unsigned n)
{
	unsigned attached = 0;
	for (unsigned i = first; i < first + n; i++)
		attached += atomic_load(&kvr_ctl_worker(c, i)->state) == KVR_WORKER_ATTACHED;
	return attached;
}

static void collect_arena(struct coll *k, cJSON *inst)
{
	static const char *const pf[] = {"off", "running", "done", "skipped", "failed"};
	const struct kvr_ctl *c = k->c;
	cJSON *a = object(k, inst, "arena");
	if (!a)
		return;
	unsigned st = atomic_load(&((struct kvr_ctl *)c)->prefault_state);
	u64(k, a, "bytes", c->arena_bytes);
	boolean(k, a, "huge_pages", c->arena_huge != 0);
	str(k, a, "prefault", st < sizeof(pf) / sizeof(pf[0]) ? pf[st] : "?", 16);
	u64(k, a, "prefault_bytes", atomic_load(&((struct kvr_ctl *)c)->prefault_bytes));
}

static void collect_instance(struct coll *k, cJSON *doc, uint64_t now_real_ns)
{
	const struct kvr_ctl *c = k->c;
	cJSON *o = object(k, doc, "instance");
	if (!o)
		return;
	str(k, o, "state", kvr_inst_state_name(atomic_load(&((struct kvr_ctl *)c)->state)), 16);
	i64(k, o, "supervisor_pid", c->supervisor_pid);
	u64(k, o, "generation", c->generation);
	u64(k, o, "started_real_ns", c->started_ns);
	if (c->started_ns && now_real_ns >= c->started_ns)
		check(k, cJSON_AddNumberToObject(o, "uptime_s", (double)(now_real_ns - c->started_ns) / 1e9));
	else
		check(k, cJSON_AddNullToObject(o, "uptime_s"));
	str(k, o, "socket", c->socket_path, sizeof(c->socket_path));
	u64(k, o, "max_actors", c->max_actors);
	u64(k, o, "max_workers", c->max_workers);
	u64(k, o, "max_schedulers", c->max_schedulers);
	u64(k, o, "workers_attached", clients_attached(c, 0, c->max_workers));
	u64(k, o, "schedulers_attached", clients_attached(c, c->max_workers, c->max_schedulers));
	collect_arena(k, o);
	uint64_t pop = 0, target = 0;
	for (unsigned i = 0; i < kvr_mr_n_actors(c); i++) {
		struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
		if (!kvr_mr_actor_used(c, i) || atomic_load(&e->pid) <= 0)
			continue;
		pop += atomic_load(&e->populated);
		target += atomic_load(&e->populate_total);
	}
	u64(k, o, "populated_bytes", pop);
	u64(k, o, "populate_target_bytes", target);
}

/* The essentials of the effective config: the model (the geometry every engine's workers
 * must match) and the sizes that bound the instance. null when the segment's config does
 * not parse. */
static void collect_config(struct coll *k, cJSON *doc)
{
	const struct kvr_config *cfg = k->cfg;
	if (!cfg) {
		check(k, cJSON_AddNullToObject(doc, "config"));
		return;
	}
	cJSON *o = object(k, doc, "config");
	cJSON *m = o ? object(k, o, "model") : NULL;
	if (!m)
		return;
	str(k, m, "model_id", cfg->model.model_id, sizeof(cfg->model.model_id));
	str(k, m, "preset", cfg->model.preset, sizeof(cfg->model.preset));
	u64(k, m, "layers", cfg->model.layers);
	u64(k, m, "kv_heads", cfg->model.kv_heads);
	u64(k, m, "head_dim", cfg->model.head_dim);
	u64(k, m, "dtype_bytes", cfg->model.dtype_bytes);
	u64(k, m, "block_tokens", cfg->model.block_tokens);
	u64(k, m, "tp_size", cfg->model.tp_size);
	str(k, m, "attention", cfg->model.attention, sizeof(cfg->model.attention));
	str(k, m, "kv_layout", cfg->model.kv_layout, sizeof(cfg->model.kv_layout));
	u64(k, o, "ring_capacity", cfg->rings.capacity);
	str(k, o, "eviction", cfg->l1.eviction, sizeof(cfg->l1.eviction));
	u64(k, o, "max_leases", cfg->l1.max_leases);
	u64(k, o, "l2_dirs", cfg->l2.n_dirs);
	u64(k, o, "remote_seeds", cfg->remote.n_cluster);
	str(k, o, "metrics_listen", cfg->metrics.listen, sizeof(cfg->metrics.listen));
}

/* ---- L1, hit rate, transfers, engines ------------------------------------------------- */

/* The slot table by state, split as kvring_l1_slots is: committed excludes reading. */
static void collect_slots(struct coll *k, cJSON *doc)
{
	const struct kvr_slot_table *t = k->v->slots;
	if (!t) {
		check(k, cJSON_AddNullToObject(doc, "l1_slots"));
		return;
	}
	struct kvr_slot_counts sc;
	kvr_slots_counts(t, &sc);
	uint32_t committed = sc.by_state[KVR_SLOT_COMMITTED];
	uint32_t reading = sc.reading <= committed ? sc.reading : committed;
	cJSON *o = object(k, doc, "l1_slots");
	if (!o)
		return;
	u64(k, o, "slots", t->n_slots);
	u64(k, o, "slot_bytes", t->slot_bytes);
	u64(k, o, "block_tokens", t->block_tokens);
	u64(k, o, "free", sc.by_state[KVR_SLOT_FREE]);
	u64(k, o, "writing", sc.by_state[KVR_SLOT_WRITING]);
	u64(k, o, "committed", committed - reading);
	u64(k, o, "reading", reading);
	u64(k, o, "evicting", sc.by_state[KVR_SLOT_EVICTING]);
	u64(k, o, "draining", sc.by_state[KVR_SLOT_DRAINING]);
	u64(k, o, "invalid", sc.invalid);
	u64(k, o, "pins", sc.pins);
}

/* The counters of kvring_lookup_*, kvring_*_tokens_total and kvring_l1_{hits,misses}_total. */
static void collect_hits(struct coll *k, cJSON *doc)
{
	const struct kvr_ctl *c = k->c;
	/* keys first: the lookup actor adds keys before matched, so keys >= matched read later */
	uint64_t keys = kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_KEYS);
	uint64_t matched = kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_MATCHED);
	cJSON *o = object(k, doc, "hit_rate");
	if (!o)
		return;
	u64(k, o, "lookups", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_LOOKUPS));
	u64(k, o, "requested_blocks", keys);
	u64(k, o, "matched_blocks", matched);
	u64(k, o, "requested_tokens", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_TOKENS_ASKED));
	u64(k, o, "matched_tokens", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_TOKENS_MATCHED));
	u64(k, o, "l1_hits", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_L1_HITS));
	u64(k, o, "l1_misses", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_MISSED));
	ratio(k, o, "ratio", matched, keys);
}

/* The counters of kvring_store_blocks_total, kvring_load_blocks_total, kvring_bytes_total. */
static void collect_transfer(struct coll *k, cJSON *doc)
{
	const struct kvr_ctl *c = k->c;
	cJSON *o = object(k, doc, "transfer");
	if (!o)
		return;
	u64(k, o, "stored_blocks", kvr_mr_xf_sum(c, true, KVR_STAT_XF_BLOCKS));
	u64(k, o, "present_blocks", kvr_mr_xf_sum(c, true, KVR_STAT_XF_PRESENT_BLOCKS));
	u64(k, o, "store_failed_blocks", kvr_mr_xf_sum(c, true, KVR_STAT_XF_FAILED_BLOCKS));
	u64(k, o, "loaded_blocks", kvr_mr_xf_sum(c, false, KVR_STAT_XF_BLOCKS));
	u64(k, o, "load_failed_blocks", kvr_mr_xf_sum(c, false, KVR_STAT_XF_FAILED_BLOCKS));
	u64(k, o, "stored_bytes", kvr_mr_xf_sum(c, true, KVR_STAT_XF_BYTES));
	u64(k, o, "loaded_bytes", kvr_mr_xf_sum(c, false, KVR_STAT_XF_BYTES));
}

/* kvringd's engine table (sup_metrics_engines() copied it under the lock we hold); null in
 * a view without one. */
static void collect_engines(struct coll *k, cJSON *doc)
{
	const struct sup_metrics_view *v = k->v;
	if (!v->engines) {
		check(k, cJSON_AddNullToObject(doc, "engines"));
		return;
	}
	cJSON *a = check(k, cJSON_AddArrayToObject(doc, "engines"));
	for (unsigned i = 0; a && i < v->n_engines && i < KVR_CTL_MAX_ENGINES; i++) {
		const struct kvr_inspect_engine *e = &v->engines[i];
		cJSON *o = element(k, a);
		if (!o)
			return;
		u64(k, o, "index", e->index);
		str(k, o, "id", e->id, sizeof(e->id));
		str(k, o, "model_ns", e->model_ns, sizeof(e->model_ns));
		boolean(k, o, "model_ns_is_model_id", e->flags & KVR_INSPECT_ENGINE_NS_MODEL_ID);
		u64(k, o, "workers", e->workers);
		u64(k, o, "schedulers", e->schedulers);
	}
}

/* ---- actors and rings ---------------------------------------------------------------- */

static void collect_actor(struct coll *k, cJSON *o, unsigned i)
{
	const struct kvr_actor_ent *e = kvr_ctl_actor(k->c, i);
	unsigned st = atomic_load(&((struct kvr_actor_ent *)e)->state);
	int32_t pid = atomic_load(&((struct kvr_actor_ent *)e)->pid);
	u64(k, o, "index", i);
	str(k, o, "name", e->name, sizeof(e->name));
	str(k, o, "kind", kvr_actor_kind_name(e->kind), 16);
	str(k, o, "state", kvr_actor_state_name(st), 16);
	boolean(k, o, "up", st == KVR_ACTOR_READY);
	i64(k, o, "pid", pid > 0 ? pid : 0);
	u64(k, o, "generation", atomic_load(&((struct kvr_actor_ent *)e)->generation));
	u64(k, o, "restarts", __atomic_load_n(&e->restarts, __ATOMIC_RELAXED));
	i64(k, o, "last_exit_code", __atomic_load_n(&e->last_exit_code, __ATOMIC_RELAXED));
	i64(k, o, "last_exit_signal", __atomic_load_n(&e->last_exit_signal, __ATOMIC_RELAXED));
	u64(k, o, "malformed", kvr_mr_stat(k->c, i, KVR_STAT_MALFORMED));
	u64(k, o, "populated_bytes", pid > 0 ? atomic_load(&((struct kvr_actor_ent *)e)->populated) : 0);
	u64(k, o, "populate_target_bytes", pid > 0 ? atomic_load(&((struct kvr_actor_ent *)e)->populate_total) : 0);
}

static void collect_actors(struct coll *k, cJSON *doc)
{
	cJSON *a = check(k, cJSON_AddArrayToObject(doc, "actors"));
	for (unsigned i = 0; a && i < kvr_mr_n_actors(k->c); i++) {
		if (!kvr_mr_actor_used(k->c, i))
			continue;
		cJSON *o = element(k, a);
		if (!o)
			return;
		collect_actor(k, o, i);
	}
}

/* A ring endpoint as kvring-inspect names it: the actor's name, "kvringd" or "client.N". */
static void endpoint(struct coll *k, cJSON *ring, const char *key, int ep, int32_t pid, bool blocked)
{
	const struct kvr_ctl *c = k->c;
	char name[KVR_ACTOR_NAME_MAX + 16];
	if (ep == KVR_EP_SUPERVISOR)
		snprintf(name, sizeof(name), "kvringd");
	else if (KVR_EP_IS_CLIENT(ep))
		snprintf(name, sizeof(name), "client.%d", KVR_EP_CLIENT_SLOT(ep));
	else if (ep >= 0 && (unsigned)ep < kvr_mr_n_actors(c))
		snprintf(name, sizeof(name), "%.*s", (int)sizeof(kvr_ctl_actor(c, (unsigned)ep)->name),
			 kvr_ctl_actor(c, (unsigned)ep)->name);
	else
		snprintf(name, sizeof(name), "actor.%d", ep);
	cJSON *o = object(k, ring, key);
	if (!o)
		return;
	str(k, o, "name", name, sizeof(name));
	i64(k, o, "pid", pid > 0 ? pid : 0);
	boolean(k, o, "blocked", blocked);
}

static void collect_ring(struct coll *k, cJSON *o, unsigned i)
{
	const struct kvr_ring_ent *e = kvr_ctl_ring_ent(k->c, i);
	struct kvr_ring_shm *r = kvr_ctl_ring_shm(k->c, i);
	uint32_t cap = r->capacity ? r->capacity : 1;
	uint32_t fill = kvr_mr_ring_fill(r);
	u64(k, o, "index", i);
	str(k, o, "name", e->name, sizeof(e->name));
	u64(k, o, "capacity", r->capacity);
	u64(k, o, "fill", fill);
	ratio(k, o, "fill_ratio", fill, cap);
	boolean(k, o, "full", fill == r->capacity);
	endpoint(k, o, "producer", e->producer, atomic_load(&r->prod_pid), atomic_load(&r->prod_blocked));
	endpoint(k, o, "consumer", e->consumer, atomic_load(&r->cons_pid), atomic_load(&r->cons_blocked));
	u64(k, o, "enqueued", atomic_load_explicit(&r->enqueued, memory_order_relaxed));
	u64(k, o, "dequeued", atomic_load_explicit(&r->dequeued, memory_order_relaxed));
	u64(k, o, "rejected", atomic_load_explicit(&r->rejected, memory_order_relaxed));
	u64(k, o, "full_waits", atomic_load_explicit(&r->full_waits, memory_order_relaxed));
	check(k, cJSON_AddNumberToObject(o, "full_wait_s",
					 (double)atomic_load_explicit(&r->full_wait_ns, memory_order_relaxed) / 1e9));
}

static void collect_rings(struct coll *k, cJSON *doc)
{
	unsigned n = atomic_load(&((struct kvr_ctl *)k->c)->n_rings);
	if (n > k->c->max_rings)
		n = k->c->max_rings;
	cJSON *a = check(k, cJSON_AddArrayToObject(doc, "rings"));
	for (unsigned i = 0; a && i < n; i++) {
		cJSON *o = element(k, a);
		if (!o)
			return;
		collect_ring(k, o, i);
	}
}

/* ---- the tiers: L2 (disk actors) and the remote actor --------------------------------- */

static void collect_disk(struct coll *k, cJSON *o, unsigned i)
{
	const struct kvr_ctl *c = k->c;
	const struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
	const char *dir = k->cfg && e->index < k->cfg->l2.n_dirs ? k->cfg->l2.dirs[e->index] : NULL;
	str(k, o, "actor", e->name, sizeof(e->name));
	u64(k, o, "actor_index", i);
	str(k, o, "state", kvr_actor_state_name(atomic_load(&((struct kvr_actor_ent *)e)->state)), 16);
	u64(k, o, "dir_index", e->index);
	if (dir)
		str(k, o, "dir", dir, strlen(dir));
	else
		check(k, cJSON_AddNullToObject(o, "dir"));
	u64(k, o, "used_bytes", kvr_mr_stat(c, i, KVR_STAT_DK_BYTES));
	u64(k, o, "capacity_bytes", kvr_mr_stat(c, i, KVR_STAT_DK_CAPACITY_BYTES));
	u64(k, o, "files", kvr_mr_stat(c, i, KVR_STAT_DK_FILES));
	u64(k, o, "evicted_files", kvr_mr_stat(c, i, KVR_STAT_DK_EVICTED));
	u64(k, o, "touched_files", kvr_mr_stat(c, i, KVR_STAT_DK_TOUCHED));
	u64(k, o, "read_failures", kvr_mr_stat(c, i, KVR_STAT_DK_READS_DAMAGED) +
					   kvr_mr_stat(c, i, KVR_STAT_DK_READS_VANISHED) +
					   kvr_mr_stat(c, i, KVR_STAT_DK_READS_IO_ERROR));
}

/* null without disk actors (no l2.dirs); else the lookup actor's L2 traffic and each dir. */
static void collect_l2(struct coll *k, cJSON *doc)
{
	const struct kvr_ctl *c = k->c;
	bool any = false;
	for (unsigned i = 0; i < kvr_mr_n_actors(c) && !any; i++)
		any = kvr_mr_actor_used(c, i) && kvr_ctl_actor(c, i)->kind == KVR_ACTOR_DISK;
	if (!any) {
		check(k, cJSON_AddNullToObject(doc, "l2"));
		return;
	}
	cJSON *o = object(k, doc, "l2");
	cJSON *lk = o ? object(k, o, "lookup") : NULL;
	cJSON *dirs = lk ? check(k, cJSON_AddArrayToObject(o, "dirs")) : NULL;
	if (!dirs)
		return;
	u64(k, lk, "reads", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_L2_READS));
	u64(k, lk, "read_failures", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_L2_READ_FAILS));
	u64(k, lk, "writes", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_L2_WRITES));
	u64(k, lk, "write_failures", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_L2_WRITE_FAILS));
	u64(k, lk, "writes_skipped", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_L2_WRITES_SKIPPED));
	for (unsigned i = 0; i < kvr_mr_n_actors(c); i++) {
		if (!kvr_mr_actor_used(c, i) || kvr_ctl_actor(c, i)->kind != KVR_ACTOR_DISK)
			continue;
		cJSON *d = element(k, dirs);
		if (!d)
			return;
		collect_disk(k, d, i);
	}
}

/* null without the remote actor; else its gauges and counters (kvring_remote_*). */
static void collect_remote(struct coll *k, cJSON *doc)
{
	static const struct {
		const char *key;
		unsigned stat;
	} rm[] = {
		{"nodes", KVR_STAT_RM_NODES},           {"nodes_up", KVR_STAT_RM_NODES_UP},
		{"slots_covered", KVR_STAT_RM_SLOTS_COVERED}, {"inflight", KVR_STAT_RM_INFLIGHT},
		{"reads", KVR_STAT_RM_READS},           {"hits", KVR_STAT_RM_HITS},
		{"misses", KVR_STAT_RM_MISSES},         {"bad_values", KVR_STAT_RM_BAD_VALUES},
		{"read_errors", KVR_STAT_RM_READ_ERRORS}, {"writes", KVR_STAT_RM_WRITES},
		{"write_errors", KVR_STAT_RM_WRITE_ERRORS}, {"bytes_in", KVR_STAT_RM_BYTES_IN},
		{"bytes_out", KVR_STAT_RM_BYTES_OUT},
	};
	const struct kvr_ctl *c = k->c;
	int ix = -1;
	for (unsigned i = 0; i < kvr_mr_n_actors(c) && ix < 0; i++)
		if (kvr_mr_actor_used(c, i) && kvr_ctl_actor(c, i)->kind == KVR_ACTOR_REMOTE)
			ix = (int)i;
	if (ix < 0) {
		check(k, cJSON_AddNullToObject(doc, "remote"));
		return;
	}
	const struct kvr_actor_ent *e = kvr_ctl_actor(c, (unsigned)ix);
	cJSON *o = object(k, doc, "remote");
	if (!o)
		return;
	str(k, o, "actor", e->name, sizeof(e->name));
	u64(k, o, "actor_index", (unsigned)ix);
	str(k, o, "state", kvr_actor_state_name(atomic_load(&((struct kvr_actor_ent *)e)->state)), 16);
	for (size_t i = 0; i < sizeof(rm) / sizeof(rm[0]); i++)
		u64(k, o, rm[i].key, kvr_mr_kind_sum(c, KVR_ACTOR_REMOTE, rm[i].stat));
	u64(k, o, "lookup_promoted", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_RM_READS));
	u64(k, o, "lookup_not_promoted", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_RM_READ_FAILS));
	u64(k, o, "lookup_writes_sent", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_RM_WRITES));
	u64(k, o, "lookup_writes_skipped", kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_RM_WRITES_SKIPPED));
}

/* ---- the document -------------------------------------------------------------------- */

cJSON *sup_status_collect(const struct sup_metrics_view *v, uint64_t now_real_ns)
{
	struct coll k = {.v = v, .c = v->ctl};
	/* the effective config kvringd wrote with kvr_config_to_json: it parses */
	struct kvr_config *cfg = malloc(sizeof(*cfg));
	char err[256];
	if (!cfg)
		return NULL;
	if (kvr_config_parse(kvr_ctl_config_json(v->ctl), cfg, err, sizeof(err)) == 0)
		k.cfg = cfg;
	cJSON *doc = cJSON_CreateObject();
	if (doc) {
		u64(&k, doc, "schema", SUP_STATUS_SCHEMA);
		u64(&k, doc, "now_real_ns", now_real_ns);
		collect_instance(&k, doc, now_real_ns);
		collect_config(&k, doc);
		collect_slots(&k, doc);
		collect_hits(&k, doc);
		collect_transfer(&k, doc);
		collect_engines(&k, doc);
		collect_actors(&k, doc);
		collect_rings(&k, doc);
		collect_l2(&k, doc);
		collect_remote(&k, doc);
	}
	free(cfg);
	if (doc && !k.oom)
		return doc;
	cJSON_Delete(doc);
	return NULL;
}
