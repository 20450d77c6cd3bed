/* inspect_render: copy a control segment's observable state (read-only) and print it as text or JSON. */
#include "inspect_render.h"

#include <kvring/kvring.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"
#include "json_writer.h"
#include "kvr_proto.h"

/* Loads from a segment we may only read. The fields are _Atomic because their writers use
 * atomics; a relaxed load is enough for a snapshot that is stale by the time it prints. */
#define LD(p) atomic_load_explicit((p), memory_order_relaxed)

#define PID_MAX_LIMIT 4194304 /* Linux: pids are 1..2^22 */
#define BAR_WIDTH 20
#define HASH_SLOTS 16384u /* a Redis Cluster's hash slots (all covered when it is healthy) */

/* Copy a name of at most srcmax bytes (NUL-terminated or not); non-printable -> '?'. */
static void copy_name(char *dst, size_t dstsz, const char *src, size_t srcmax)
{
	size_t n = 0;
	for (; n < srcmax && n + 1 < dstsz && src[n]; n++) {
		unsigned char ch = (unsigned char)src[n];
		dst[n] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
	}
	dst[n] = '\0';
}

/* ---- snapshot ------------------------------------------------------------------------- */

static void snap_ring(const struct kvr_ctl *c, unsigned i, struct kvr_insp_snap *s, struct kvr_insp_ring *out)
{
	const struct kvr_ring_ent *e = kvr_ctl_ring_ent(c, i);
	size_t seg_size = c->seg.size;

	out->index = i;
	copy_name(out->name, sizeof(out->name), e->name, KVR_RING_NAME_MAX);
	out->producer = e->producer;
	out->consumer = e->consumer;
	out->msgs = s->msg_store + (size_t)i * s->max_msgs;

	/* Re-check what kvr_ctl_attach() checked: the directory could have changed since. */
	if (e->offset < c->ring_area_off || e->offset > seg_size || e->bytes > seg_size - e->offset) {
		out->error = -EBADMSG;
		return;
	}
	struct kvr_ring view;
	const struct kvr_ring_waiters legal = kvr_ctl_legal_waiters(c);
	int rc = kvr_ring_view((uint8_t *)c + e->offset, e->bytes, &legal, &view); /* only reads */
	if (rc) {
		out->error = rc;
		return;
	}
	const struct kvr_ring_shm *r = view.shm;
	out->valid = 1;
	out->capacity = view.mask + 1;
	out->msg_size = view.msg_size;
	/* head before tail: the consumer never passes the tail it will later be read at */
	out->head = atomic_load_explicit(&r->head, memory_order_acquire);
	out->tail = atomic_load_explicit(&r->tail, memory_order_acquire);
	uint32_t fill = out->tail - out->head;
	out->fill = fill > out->capacity ? out->capacity : fill;
	out->prod_pid = LD(&r->prod_pid);
	out->cons_pid = LD(&r->cons_pid);
	out->prod_blocked = LD(&r->prod_blocked);
	out->cons_blocked = LD(&r->cons_blocked);
	out->enqueued = LD(&r->enqueued);
	out->dequeued = LD(&r->dequeued);
	out->full_waits = LD(&r->full_waits);
	out->full_wait_ns = LD(&r->full_wait_ns);
	out->empty_sleeps = LD(&r->empty_sleeps);
	out->rejected = LD(&r->rejected);

	/* kvr_ring_peek copies msg_size bytes: only rings of struct kvr_msg are read */
	if (out->msg_size != sizeof(struct kvr_msg))
		return;
	unsigned want = out->fill < s->max_msgs ? out->fill : s->max_msgs;
	for (unsigned k = 0; k < want; k++) {
		if (kvr_ring_peek(&view, k, &out->msgs[k]) < 0)
			break; /* consumed meanwhile */
		out->n_msgs++;
	}
}

/* The effective config the segment carries, parsed by kvr_config_parse from a private copy
 * (the segment is not ours). false when it does not parse: then no l2.dirs entry is named. */
static bool segment_config(const struct kvr_ctl *c, struct kvr_config *ret_cfg)
{
	char err[256];
	char *copy = strndup(kvr_ctl_config_json(c), c->config_cap);
	bool ok = copy && kvr_config_parse(copy, ret_cfg, err, sizeof(err)) == 0;
	free(copy);
	return ok;
}

static void snap_l2(const struct kvr_ctl *c, unsigned i, const struct kvr_config *cfg, struct kvr_insp_l2 *o)
{
	const struct kvr_actor_ent *a = kvr_ctl_actor(c, i);
	const struct kvr_actor_stats *st = kvr_ctl_stats(c, i);
	o->actor = i;
	copy_name(o->name, sizeof(o->name), a->name, KVR_ACTOR_NAME_MAX);
	o->state = LD(&a->state);
	o->dir_index = a->index;
	if (cfg && a->index < cfg->l2.n_dirs)
		copy_name(o->dir, sizeof(o->dir), cfg->l2.dirs[a->index], KVR_PATH_MAX);
	o->used_bytes = LD(&st->c[KVR_STAT_DK_BYTES]);
	o->files = LD(&st->c[KVR_STAT_DK_FILES]);
	o->capacity_bytes = LD(&st->c[KVR_STAT_DK_CAPACITY_BYTES]);
	o->adopted = LD(&st->c[KVR_STAT_DK_ADOPTED]);
	for (unsigned r = 1; r < KVR_STAT_DK_REASON_MAX; r++)
		o->rejected[r] = LD(&st->c[kvr_stat_dk_rejected(r)]);
	o->evicted = LD(&st->c[KVR_STAT_DK_EVICTED]);
	o->reads_damaged = LD(&st->c[KVR_STAT_DK_READS_DAMAGED]);
	o->reads_vanished = LD(&st->c[KVR_STAT_DK_READS_VANISHED]);
	o->reads_io_error = LD(&st->c[KVR_STAT_DK_READS_IO_ERROR]);
	o->writes_refused = LD(&st->c[KVR_STAT_DK_WRITES_REFUSED]);
	o->left_in_place = LD(&st->c[KVR_STAT_DK_LEFT_IN_PLACE]);
	o->bad_kept = LD(&st->c[KVR_STAT_DK_BAD_KEPT]);
	o->xfer_joined = LD(&st->c[KVR_STAT_DK_XFER_JOINED]);
	o->xfer_registered = LD(&st->c[KVR_STAT_DK_XFER_REGISTERED]);
	o->xfer_unregistered = LD(&st->c[KVR_STAT_DK_XFER_UNREGISTERED]);
}

static void snap_remote(const struct kvr_ctl *c, unsigned i, struct kvr_insp_remote *o)
{
	const struct kvr_actor_ent *a = kvr_ctl_actor(c, i);
	const struct kvr_actor_stats *st = kvr_ctl_stats(c, i);
	o->actor = i;
	copy_name(o->name, sizeof(o->name), a->name, KVR_ACTOR_NAME_MAX);
	o->state = LD(&a->state);
	o->nodes = LD(&st->c[KVR_STAT_RM_NODES]);
	o->nodes_up = LD(&st->c[KVR_STAT_RM_NODES_UP]);
	o->inflight = LD(&st->c[KVR_STAT_RM_INFLIGHT]);
	o->slots_covered = LD(&st->c[KVR_STAT_RM_SLOTS_COVERED]);
	o->reads = LD(&st->c[KVR_STAT_RM_READS]);
	o->hits = LD(&st->c[KVR_STAT_RM_HITS]);
	o->misses = LD(&st->c[KVR_STAT_RM_MISSES]);
	o->bad_values = LD(&st->c[KVR_STAT_RM_BAD_VALUES]);
	o->read_errors = LD(&st->c[KVR_STAT_RM_READ_ERRORS]);
	o->writes = LD(&st->c[KVR_STAT_RM_WRITES]);
	o->write_errors = LD(&st->c[KVR_STAT_RM_WRITE_ERRORS]);
	o->writes_stale = LD(&st->c[KVR_STAT_RM_WRITES_STALE]);
	o->bytes_in = LD(&st->c[KVR_STAT_RM_BYTES_IN]);
	o->bytes_out = LD(&st->c[KVR_STAT_RM_BYTES_OUT]);
	o->moved = LD(&st->c[KVR_STAT_RM_MOVED]);
	o->ask = LD(&st->c[KVR_STAT_RM_ASK]);
	o->timeouts = LD(&st->c[KVR_STAT_RM_TIMEOUTS]);
	o->conn_errors = LD(&st->c[KVR_STAT_RM_CONN_ERRORS]);
	o->reply_errors = LD(&st->c[KVR_STAT_RM_REPLY_ERRORS]);
	o->refreshes = LD(&st->c[KVR_STAT_RM_REFRESHES]);
}

int kvr_insp_snapshot(const struct kvr_ctl *c, const struct kvr_insp_clock *now, unsigned max_msgs,
		      struct kvr_insp_snap **ret_snap)
{
	if (!c || !now || !ret_snap)
		return -EINVAL;
	if (max_msgs > KVR_INSP_MAX_MSGS)
		max_msgs = KVR_INSP_MAX_MSGS;
	struct kvr_insp_snap *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->msg_store = calloc((size_t)KVR_CTL_MAX_RINGS * max_msgs + 1, sizeof(struct kvr_msg));
	if (!s->msg_store) {
		free(s);
		return -ENOMEM;
	}
	s->now = *now;
	s->max_msgs = max_msgs;

	s->state = LD(&c->state);
	s->supervisor_pid = c->supervisor_pid;
	s->generation = c->generation;
	s->started_ns = c->started_ns;
	copy_name(s->socket_path, sizeof(s->socket_path), c->socket_path, sizeof(c->socket_path));
	s->max_actors = c->max_actors > KVR_CTL_MAX_ACTORS ? KVR_CTL_MAX_ACTORS : c->max_actors;
	s->max_workers = c->max_workers > KVR_CTL_MAX_WORKERS ? KVR_CTL_MAX_WORKERS : c->max_workers;

	for (unsigned i = 0; i < s->max_actors; i++) {
		const struct kvr_actor_ent *a = kvr_ctl_actor(c, i);
		uint32_t st = LD(&a->state);
		if (st == KVR_ACTOR_UNUSED)
			continue;
		struct kvr_insp_actor *o = &s->actors[s->n_actors++];
		o->index = i;
		copy_name(o->name, sizeof(o->name), a->name, KVR_ACTOR_NAME_MAX);
		o->kind = a->kind;
		o->state = st;
		o->pid = LD(&a->pid);
		o->generation = LD(&a->generation);
		o->restarts = a->restarts;
		o->last_exit_code = a->last_exit_code;
		o->last_exit_signal = a->last_exit_signal;
		o->started_ns = a->started_ns;
		o->ready_ns = a->ready_ns;
		o->heartbeat_ns = LD(&a->heartbeat_ns);
		o->held = LD(&a->held);
		o->populated = LD(&a->populated);
		o->populate_total = LD(&a->populate_total);
	}
	for (unsigned i = 0; i < s->max_workers; i++) {
		const struct kvr_worker_ent *w = kvr_ctl_worker(c, i);
		uint32_t st = LD(&w->state);
		if (st == KVR_WORKER_FREE)
			continue;
		struct kvr_insp_worker *o = &s->workers[s->n_workers++];
		*o = (struct kvr_insp_worker){.slot = i, .state = st, .uid = w->uid, .generation = w->generation,
					      .tp_rank = w->tp_rank, .tp_size = w->tp_size, .dcp_rank = w->dcp_rank,
					      .dcp_size = w->dcp_size, .pid = LD(&w->pid), .attached_ns = w->attached_ns,
					      .engine = w->engine, .block_tokens = w->block_tokens};
	}
	for (unsigned i = 0; i <= KVR_CTL_MAX_MODELS && c->models_off; i++) {
		const struct kvr_model_ent *m = kvr_ctl_model(c, i);
		struct kvr_insp_model o = {.index = i, .engines = LD(&m->engines), .lookups = LD(&m->lookups),
					   .keys = LD(&m->keys), .matched = LD(&m->matched), .stored = LD(&m->stored),
					   .l2_lanes = LD(&m->l2_lanes)};
		memcpy(o.name, m->name, sizeof(o.name) - 1);
		o.name[sizeof(o.name) - 1] = '\0';
		if (i == KVR_CTL_MODEL_OTHER ? (o.engines || o.lookups || o.stored || o.l2_lanes) : o.name[0] != '\0')
			s->models[s->n_models++] = o;
	}
	s->arena_bytes = c->arena_bytes;
	s->arena_huge = c->arena_huge;
	s->prefault_state = LD(&c->prefault_state);
	s->prefault_bytes = LD(&c->prefault_bytes);
	unsigned n_sched = c->max_schedulers == KVR_CTL_MAX_SCHEDULERS ? KVR_CTL_MAX_SCHEDULERS : 0;
	for (unsigned i = 0; i < n_sched; i++) {
		const struct kvr_worker_ent *w = kvr_ctl_sched(c, i);
		uint32_t st = LD(&w->state);
		if (st == KVR_WORKER_FREE)
			continue;
		s->scheds[s->n_scheds++] = (struct kvr_insp_worker){.slot = i, .state = st, .uid = w->uid,
								   .generation = w->generation, .pid = LD(&w->pid),
								   .attached_ns = w->attached_ns, .engine = w->engine,
								   .block_tokens = w->block_tokens};
	}
	for (unsigned i = 0; i < s->max_actors; i++) {
		const struct kvr_actor_ent *a = kvr_ctl_actor(c, i);
		if (LD(&a->state) == KVR_ACTOR_UNUSED || a->kind != KVR_ACTOR_LOOKUP)
			continue;
		const struct kvr_actor_stats *st = kvr_ctl_stats(c, i);
		static const unsigned ends[5] = {KVR_STAT_LK_LEASES_LOADED, KVR_STAT_LK_LEASES_RELEASED,
						 KVR_STAT_LK_LEASES_EXPIRED, KVR_STAT_LK_LEASES_REFUSED,
						 KVR_STAT_LK_LEASES_MISSING};
		s->leases = LD(&st->c[KVR_STAT_LK_LEASES]);
		s->leases_granted = LD(&st->c[KVR_STAT_LK_LEASES_GRANTED]);
		s->leases_taken = LD(&st->c[KVR_STAT_LK_LEASES_TAKEN]);
		for (unsigned k = 0; k < 5; k++)
			s->lease_ends[k] = LD(&st->c[ends[k]]);
		for (unsigned k = 0; k < 6; k++)
			s->miss_blocks[k] = LD(&st->c[KVR_STAT_LK_MISS_FIRST + k]);
		s->remote.lk_reads = LD(&st->c[KVR_STAT_LK_RM_READS]);
		s->remote.lk_read_fails = LD(&st->c[KVR_STAT_LK_RM_READ_FAILS]);
		s->remote.lk_writes = LD(&st->c[KVR_STAT_LK_RM_WRITES]);
		s->remote.lk_writes_skipped = LD(&st->c[KVR_STAT_LK_RM_WRITES_SKIPPED]);
	}
	unsigned n = LD(&c->n_rings);
	if (n > KVR_CTL_MAX_RINGS)
		n = KVR_CTL_MAX_RINGS;
	s->n_rings = n;
	for (unsigned i = 0; i < n; i++)
		snap_ring(c, i, s, &s->rings[i]);

	struct kvr_config *cfg = NULL; /* parsed at the first disk actor */
	bool parsed = false;
	for (unsigned i = 0; i < s->max_actors; i++) {
		const struct kvr_actor_ent *a = kvr_ctl_actor(c, i);
		if (LD(&a->state) == KVR_ACTOR_UNUSED || a->kind != KVR_ACTOR_DISK)
			continue;
		if (!parsed) {
			parsed = true;
			cfg = malloc(sizeof(*cfg));
			if (cfg && !segment_config(c, cfg)) {
				free(cfg);
				cfg = NULL;
			}
		}
		snap_l2(c, i, cfg, &s->l2[s->n_l2++]);
	}
	free(cfg);
	for (unsigned i = 0; i < s->max_actors && !s->has_remote; i++) {
		const struct kvr_actor_ent *a = kvr_ctl_actor(c, i);
		if (LD(&a->state) == KVR_ACTOR_UNUSED || a->kind != KVR_ACTOR_REMOTE)
			continue;
		snap_remote(c, i, &s->remote);
		s->has_remote = true;
	}

	*ret_snap = s;
	return 0;
}

int kvr_insp_snapshot_engines(struct kvr_insp_snap *s, const struct kvr_ctl *c, const void *table, size_t len)
{
	if (!s || (!table && len))
		return -EINVAL;
	s->has_engines = false;
	s->n_engines = 0;
	const size_t esz = sizeof(struct kvr_inspect_engine);
	if (len % esz || len / esz > KVR_CTL_MAX_ENGINES) {
		s->engines_error = -EBADMSG;
		return -EBADMSG;
	}
	struct kvr_config *cfg = NULL; /* parsed for the first model_ns cut short */
	bool parsed = false;
	for (size_t k = 0; k < len / esz; k++) {
		struct kvr_inspect_engine in; /* the payload is bytes: copy, then read */
		memcpy(&in, (const uint8_t *)table + k * esz, esz);
		struct kvr_insp_engine *o = &s->engines[s->n_engines++];
		o->index = in.index;
		o->workers = in.workers;
		o->schedulers = in.schedulers;
		copy_name(o->id, sizeof(o->id), in.id, sizeof(in.id));
		copy_name(o->model_ns, sizeof(o->model_ns), in.model_ns, sizeof(in.model_ns));
		/* the instance's model_id, cut to fit the entry: take it whole from the config */
		size_t n = strlen(o->model_ns);
		if (!(in.flags & KVR_INSPECT_ENGINE_NS_MODEL_ID) || n + 1 < sizeof(in.model_ns) || !c)
			continue;
		if (!parsed) {
			parsed = true;
			cfg = malloc(sizeof(*cfg));
			if (cfg && !segment_config(c, cfg)) {
				free(cfg);
				cfg = NULL;
			}
		}
		if (cfg && strlen(cfg->model.model_id) > n && !strncmp(cfg->model.model_id, in.model_ns, n))
			copy_name(o->model_ns, sizeof(o->model_ns), cfg->model.model_id, sizeof(cfg->model.model_id));
	}
	free(cfg);
	s->has_engines = true;
	s->engines_error = 0;
	return 0;
}

void kvr_insp_snap_free(struct kvr_insp_snap *s)
{
	if (!s)
		return;
	free(s->msg_store);
	free(s);
}

/* ---- shared formatting ------------------------------------------------------------------ */

static const struct kvr_insp_actor *find_actor(const struct kvr_insp_snap *s, int index)
{
	for (unsigned i = 0; i < s->n_actors; i++)
		if ((int)s->actors[i].index == index)
			return &s->actors[i];
	return NULL;
}

char *kvr_insp_endpoint_name(const struct kvr_insp_snap *s, int endpoint, char *buf, size_t len)
{
	if (endpoint == KVR_EP_SUPERVISOR) {
		snprintf(buf, len, "kvringd");
	} else if (KVR_EP_IS_CLIENT(endpoint)) {
		snprintf(buf, len, "client.%d", KVR_EP_CLIENT_SLOT(endpoint));
	} else {
		const struct kvr_insp_actor *a = find_actor(s, endpoint);
		if (a && a->name[0])
			snprintf(buf, len, "%s", a->name);
		else
			snprintf(buf, len, "actor.%d", endpoint);
	}
	return buf;
}

static char *fmt_pid(int32_t pid, char *buf, size_t len)
{
	if (pid == 0)
		snprintf(buf, len, "-");
	else if (pid < 0 || pid > PID_MAX_LIMIT)
		snprintf(buf, len, "?");
	else
		snprintf(buf, len, "%d", pid);
	return buf;
}

static char *fmt_exit(int32_t code, int32_t sig, char *buf, size_t len)
{
	if (sig > 0 && sig < 128)
		snprintf(buf, len, "signal %d", sig);
	else if (sig != 0)
		snprintf(buf, len, "?");
	else if (code >= 0 && code <= 255)
		snprintf(buf, len, "code %d", code);
	else if (code == -1)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "?");
	return buf;
}

static char *fmt_pair(uint32_t a, uint32_t b, char *buf, size_t len)
{
	if (a > 99999 || b > 99999)
		snprintf(buf, len, "?");
	else
		snprintf(buf, len, "%u/%u", a, b);
	return buf;
}

static const char *worker_state_name(uint32_t st)
{
	switch (st) {
	case KVR_WORKER_FREE:
		return "free";
	case KVR_WORKER_ATTACHED:
		return "attached";
	case KVR_WORKER_DETACHING:
		return "detaching";
	default:
		return "?";
	}
}

/* The same ring in the previous snapshot, if the directory did not change. */
static const struct kvr_insp_ring *prev_ring(const struct kvr_insp_snap *prev, const struct kvr_insp_ring *r)
{
	if (!prev || r->index >= prev->n_rings)
		return NULL;
	const struct kvr_insp_ring *p = &prev->rings[r->index];
	if (!p->valid || !r->valid || strcmp(p->name, r->name) != 0)
		return NULL;
	return p;
}

/* Messages per second enqueued between prev and cur; < 0 when unknown. */
static double ring_rate(const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev,
			const struct kvr_insp_ring *r)
{
	const struct kvr_insp_ring *p = prev_ring(prev, r);
	if (!p || cur->now.mono_ns <= prev->now.mono_ns || r->enqueued < p->enqueued)
		return -1.0;
	return (double)(r->enqueued - p->enqueued) * 1e9 / (double)(cur->now.mono_ns - prev->now.mono_ns);
}

/* Full ring whose consumer dequeued nothing since the previous snapshot. */
static bool ring_stuck(const struct kvr_insp_snap *prev, const struct kvr_insp_ring *r)
{
	const struct kvr_insp_ring *p = prev_ring(prev, r);
	return p && r->fill == r->capacity && r->dequeued == p->dequeued;
}

/* ---- text ------------------------------------------------------------------------------- */

/* Print one line: trailing blanks trimmed, cut at KVR_INSP_COLUMNS. */
__attribute__((format(printf, 2, 3))) static void pline(FILE *out, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	size_t len = n < 0 ? 0 : (size_t)n >= sizeof(buf) ? sizeof(buf) - 1 : (size_t)n;
	if (len > KVR_INSP_COLUMNS)
		len = KVR_INSP_COLUMNS;
	while (len && buf[len - 1] == ' ')
		len--;
	fwrite(buf, 1, len, out);
	fputc('\n', out);
}

/* No model section and no worker yet: kvringd laid no L1 out and started no lookup actor. */
static bool lookup_never_started(const struct kvr_insp_snap *s)
{
	for (unsigned i = 0; i < s->n_actors; i++)
		if (s->actors[i].kind == KVR_ACTOR_LOOKUP)
			return s->actors[i].state == KVR_ACTOR_IDLE && !s->actors[i].started_ns;
	return false;
}

static void text_instance(FILE *out, const struct kvr_insp_snap *s)
{
	char pid[16], up[16];
	pline(out, "kvring instance: %s", kvr_inst_state_name(s->state));
	if (s->started_ns && s->started_ns <= s->now.real_ns)
		kvr_fmt_duration(s->now.real_ns - s->started_ns, up, sizeof(up));
	else
		snprintf(up, sizeof(up), "-");
	pline(out, "  kvringd pid %s  generation %u  uptime %s", fmt_pid(s->supervisor_pid, pid, sizeof(pid)),
	      s->generation, up);
	size_t plen = strlen(s->socket_path);
	if (!plen)
		pline(out, "  socket -");
	else if (plen <= KVR_INSP_COLUMNS - 9)
		pline(out, "  socket %s", s->socket_path);
	else /* keep the end of a long path, which names the instance */
		pline(out, "  socket ...%s", s->socket_path + plen - (KVR_INSP_COLUMNS - 12));
	unsigned attached = 0;
	for (unsigned i = 0; i < s->n_workers; i++)
		attached += s->workers[i].state == KVR_WORKER_ATTACHED;
	pline(out, "  actors %u in use of %u  workers %u of %u attached  rings %u", s->n_actors, s->max_actors,
	      attached, s->max_workers, s->n_rings);
	if (s->arena_bytes) {
		static const char *const pf[] = {"off", "running", "done", "skipped (exceeds available memory)",
						 "failed"};
		pline(out, "  arena %.1f GiB%s  prefault %s  %.1f GiB in", kvr_fmt_gib(s->arena_bytes),
		      s->arena_huge ? " (huge pages)" : "", s->prefault_state < 5 ? pf[s->prefault_state] : "?",
		      kvr_fmt_gib(s->prefault_bytes));
	} else if (lookup_never_started(s)) {
		pline(out, "%s", "  L1 not laid out yet: no model section; the first worker to attach lays it out");
	}
	/* what mapping it costs the actors: their page tables, and how far they populated */
	uint64_t pt = 0, pt_max = 0, pop = 0, pop_total = 0;
	unsigned n_pt = 0;
	const char *biggest = "";
	for (unsigned i = 0; i < s->n_actors; i++) {
		const struct kvr_insp_actor *a = &s->actors[i];
		if (a->pid > 0) { /* an exited actor's counters are its last run's */
			pop += a->populated;
			pop_total += a->populate_total;
		}
		if (!a->page_tables_known)
			continue;
		n_pt++;
		pt += a->page_table_bytes;
		if (a->page_table_bytes >= pt_max) {
			pt_max = a->page_table_bytes;
			biggest = a->name;
		}
	}
	if (n_pt || pop_total)
		pline(out, "  populated %.1f/%.1f GiB  page tables %.1f MiB in %u actors (most %.1f, %.12s)",
		      kvr_fmt_gib(pop), kvr_fmt_gib(pop_total), kvr_fmt_mib(pt), n_pt, kvr_fmt_mib(pt_max),
		      n_pt ? biggest : "-");
}

void kvr_insp_read_page_tables(struct kvr_insp_snap *s)
{
	for (unsigned i = 0; i < s->n_actors; i++) {
		struct kvr_insp_actor *a = &s->actors[i];
		a->page_tables_known = a->pid > 0 && kvr_proc_page_tables(a->pid, &a->page_table_bytes) == 0;
	}
}

void kvr_insp_snapshot_slots(struct kvr_insp_snap *s, const struct kvr_slot_table *t)
{
	if (!s || !t)
		return;
	s->has_slots = true;
	s->n_slots = t->n_slots;
	kvr_slots_counts(t, &s->slots);
	memset(s->pins_by, 0, sizeof(s->pins_by));
	uint64_t by_model[KVR_CTL_MAX_MODELS + 1];
	kvr_slots_model_counts(t, by_model, KVR_CTL_MAX_MODELS + 1);
	for (unsigned m = 0; m < s->n_models; m++) {
		s->models[m].l1_slots = by_model[s->models[m].index];
		s->models[m].l1_bytes = by_model[s->models[m].index] * t->slot_bytes;
		s->models[m].l2_bytes = s->models[m].l2_lanes * t->slot_bytes; /* a file holds one slot */
	}
	for (uint32_t i = 0; i < t->n_slots; i++) {
		for (unsigned w = 0; w < KVR_SLOT_MAX_WORKERS; w++)
			s->pins_by[0] += kvr_slot_pins_of(t, i, KVR_PIN_WORKER(w));
		s->pins_by[1] += kvr_slot_pins_of(t, i, KVR_PIN_LOOKUP);
		s->pins_by[2] += kvr_slot_pins_of(t, i, KVR_PIN_IO);
		s->pins_by[3] += kvr_slot_pins_of(t, i, KVR_PIN_REMOTE);
	}
}

/* The slot table: states, and pins by owner (a quiet instance has only free and committed
 * slots and no pin; writing, evicting, draining and pins belong to work in flight). */
static void text_slots(FILE *out, const struct kvr_insp_snap *s)
{
	if (!s->has_slots)
		return;
	const struct kvr_slot_counts *c = &s->slots;
	pline(out, "L1 slots %u: free %u  writing %u  committed %u (reading %u)", s->n_slots,
	      c->by_state[KVR_SLOT_FREE], c->by_state[KVR_SLOT_WRITING], c->by_state[KVR_SLOT_COMMITTED], c->reading);
	pline(out, "  evicting %u  draining %u%s  pins: loaders %" PRIu64 "  lookup %" PRIu64 "  io %" PRIu64
	      "  remote %" PRIu64, c->by_state[KVR_SLOT_EVICTING], c->by_state[KVR_SLOT_DRAINING],
	      c->invalid ? "  INVALID" : "", s->pins_by[0], s->pins_by[1], s->pins_by[2], s->pins_by[3]);
	pline(out, "%s", "");
}

/* A loader/storer slot of a free worker: idle and never started. */
static bool actor_idle(const struct kvr_insp_actor *a)
{
	return a->state == KVR_ACTOR_IDLE && a->pid <= 0 && !a->heartbeat_ns && a->restarts == 0;
}

static bool endpoint_idle(const struct kvr_insp_snap *s, int ep)
{
	if (ep >= 0)
		return (unsigned)ep < s->n_actors && actor_idle(&s->actors[ep]);
	if (KVR_EP_IS_CLIENT(ep)) {
		unsigned w = (unsigned)KVR_EP_CLIENT_SLOT(ep);
		for (unsigned i = 0; i < s->n_workers; i++)
			if (s->workers[i].slot == w)
				return false;
		return true;
	}
	return false;
}

/* A ring nobody uses: never carried a message and one of its ends is an idle slot. */
static bool ring_idle(const struct kvr_insp_snap *s, const struct kvr_insp_ring *r)
{
	return r->valid && !r->enqueued && !r->fill && !r->rejected && !r->prod_blocked &&
	       (endpoint_idle(s, r->producer) || endpoint_idle(s, r->consumer));
}

static void text_actors(FILE *out, const struct kvr_insp_snap *s)
{
	pline(out, "actors");
	if (!s->n_actors) {
		pline(out, "  (none)");
		return;
	}
	pline(out, "  %-23s %-8s %-7s %8s  %-9s  %s", "NAME", "STATE", "PID", "RESTARTS", "LAST EXIT", "HEARTBEAT");
	unsigned hidden = 0;
	for (unsigned i = 0; i < s->n_actors; i++) {
		const struct kvr_insp_actor *a = &s->actors[i];
		char pid[16], ex[24], hb[24], d[16];
		if (s->hide_idle && actor_idle(a)) {
			hidden++;
			continue;
		}
		if (!a->heartbeat_ns)
			snprintf(hb, sizeof(hb), "-");
		else
			snprintf(hb, sizeof(hb), "%s ago",
				 kvr_fmt_duration(s->now.mono_ns > a->heartbeat_ns ? s->now.mono_ns - a->heartbeat_ns : 0,
						       d, sizeof(d)));
		pline(out, "  %-23s %-8s %-7s %8u  %-9s  %s", a->name[0] ? a->name : "?", kvr_actor_state_name(a->state),
		      fmt_pid(a->pid, pid, sizeof(pid)), a->restarts,
		      fmt_exit(a->last_exit_code, a->last_exit_signal, ex, sizeof(ex)), hb);
	}
	if (hidden)
		pline(out, "  (%u idle actors of free worker slots not shown: --all)", hidden);
}

static void text_workers(FILE *out, const struct kvr_insp_snap *s)
{
	if (!s->n_workers) {
		pline(out, "workers: none attached");
		return;
	}
	pline(out, "workers");
	for (unsigned i = 0; i < s->n_workers; i++) {
		const struct kvr_insp_worker *w = &s->workers[i];
		char pid[16], tp[16], dcp[16];
		pline(out, "  client.%-3u pid %-7s  %-9s  tp %s  dcp %s  %u-token blocks  engine %u", w->slot,
		      fmt_pid(w->pid, pid, sizeof(pid)), worker_state_name(w->state),
		      fmt_pair(w->tp_rank, w->tp_size, tp, sizeof(tp)), fmt_pair(w->dcp_rank, w->dcp_size, dcp, sizeof(dcp)),
		      w->block_tokens, w->engine);
	}
}

/* src cut to at most room bytes by taking out its middle ("..."): both ends of an id or a
 * namespace tell it apart (the model's name, its fingerprint). */
static char *cut_middle(const char *src, size_t room, char *buf, size_t len)
{
	size_t n = strlen(src);
	if (n <= room)
		snprintf(buf, len, "%s", src);
	else if (room < 5)
		snprintf(buf, len, "%.*s", (int)room, src);
	else
		snprintf(buf, len, "%.*s...%s", (int)(room - 3 + 1) / 2, src, src + n - (room - 3) / 2);
	return buf;
}

/* Engines attached to kvringd: one line each, or, when the line would pass 80 columns,
 * the namespace on a line of its own (a namespace of up to 63 bytes always fits there
 * whole); an id still too long loses its middle. */
static void text_engines(FILE *out, const struct kvr_insp_snap *s)
{
	if (s->engines_error) {
		pline(out, "engines: unknown (kvringd's table: %s)", strerror(-s->engines_error));
		pline(out, "%s", "");
		return;
	}
	if (!s->has_engines)
		return;
	if (!s->n_engines) {
		pline(out, "engines: none attached");
		pline(out, "%s", "");
		return;
	}
	pline(out, "engines");
	for (unsigned i = 0; i < s->n_engines; i++) {
		const struct kvr_insp_engine *e = &s->engines[i];
		char head[32], tail[64], id[sizeof(e->id)], ns[sizeof(e->model_ns)];
		snprintf(head, sizeof(head), "  engine %u  \"", e->index);
		snprintf(tail, sizeof(tail), "\"  workers %u  schedulers %u", e->workers, e->schedulers);
		static const char mid[] = "\"  namespace \"";
		size_t fixed = strlen(head) + strlen(tail), lid = strlen(e->id), lns = strlen(e->model_ns);
		if (fixed + sizeof(mid) - 1 + lid + lns <= KVR_INSP_COLUMNS) {
			pline(out, "%s%s%s%s%s", head, e->id, mid, e->model_ns, tail);
			continue;
		}
		size_t room = fixed < KVR_INSP_COLUMNS ? KVR_INSP_COLUMNS - fixed : 0;
		pline(out, "%s%s%s", head, cut_middle(e->id, room, id, sizeof(id)), tail);
		pline(out, "    namespace \"%s\"", cut_middle(e->model_ns, KVR_INSP_COLUMNS - 16, ns, sizeof(ns)));
	}
	pline(out, "%s", "");
}

/* Model namespaces: engines, what L1 holds of each, and their hit rate (blocks matched of
 * blocks asked for, lookups and leases both). A name too long for its column loses its middle. */
static void text_models(FILE *out, const struct kvr_insp_snap *s)
{
	if (!s->n_models)
		return;
	pline(out, "models");
	pline(out, "  %-26s %7s %8s %9s %9s %7s %6s", "NAMESPACE", "ENGINES", "L1 SLOTS", "L1 BYTES", "L2 BYTES",
	      "LOOKUPS", "HIT");
	for (unsigned i = 0; i < s->n_models; i++) {
		const struct kvr_insp_model *m = &s->models[i];
		char name[40], bytes[32], l2[32], hit[16] = "-";
		cut_middle(m->index == KVR_CTL_MODEL_OTHER ? "(other)" : m->name, 26, name, sizeof(name));
		if (m->keys)
			snprintf(hit, sizeof(hit), "%.1f%%", 100.0 * (double)m->matched / (double)m->keys);
		pline(out, "  %-26s %7u %8" PRIu64 " %9s %9s %7" PRIu64 " %6s", name, m->engines, m->l1_slots,
		      kvr_fmt_bytes(m->l1_bytes, bytes, sizeof(bytes)), kvr_fmt_bytes(m->l2_bytes, l2, sizeof(l2)),
		      m->lookups, hit);
	}
	pline(out, "%s", "");
}

/* Scheduler clients and the leases they hold for their engines' workers. */
static void text_leases(FILE *out, const struct kvr_insp_snap *s)
{
	for (unsigned i = 0; i < s->n_scheds; i++) {
		char pid[16];
		pline(out, "  sched.%-4u pid %-7s  %-9s  %u-token blocks  engine %u", s->scheds[i].slot,
		      fmt_pid(s->scheds[i].pid, pid, sizeof(pid)), worker_state_name(s->scheds[i].state),
		      s->scheds[i].block_tokens, s->scheds[i].engine);
	}
	bool any = s->leases || s->leases_granted || s->leases_taken;
	for (unsigned k = 0; k < 5; k++)
		any |= s->lease_ends[k] != 0;
	if (!s->n_scheds && !any)
		return; /* no engine uses leases here */
	pline(out, "leases held %" PRIu64 "  granted %" PRIu64 "  taken %" PRIu64, s->leases, s->leases_granted,
	      s->leases_taken);
	pline(out, "  ended: loaded %" PRIu64 "  released %" PRIu64 "  expired %" PRIu64 "  refused %" PRIu64
	      "  missing %" PRIu64, s->lease_ends[0], s->lease_ends[1], s->lease_ends[2], s->lease_ends[3],
	      s->lease_ends[4]);
	/* why the blocks leases asked for were not there (the first missing block's reason) */
	pline(out, "  missed blocks: never_stored %" PRIu64 "  evicted %" PRIu64 "  in_flight %" PRIu64
	      "  quorum %" PRIu64 "  l2_failed %" PRIu64 "  no_room %" PRIu64,
	      s->miss_blocks[0], s->miss_blocks[1], s->miss_blocks[2], s->miss_blocks[3], s->miss_blocks[4],
	      s->miss_blocks[5]);
}

/* The name of adoption reason r, NULL for payload_checksum (adoption reads headers only). */
static const char *adoption_reason(unsigned r)
{
	const char *n = kvr_stat_dk_reason_name(r);
	return n && strcmp(n, "payload_checksum") ? n : NULL;
}

/* Items "name n" after a lead, wrapped at KVR_INSP_COLUMNS with continuation lines indented. */
struct wrap {
	FILE *out;
	char line[KVR_INSP_COLUMNS + 1];
	size_t len, indent;
	unsigned items;
};

static void wrap_item(struct wrap *w, const char *name, uint64_t n)
{
	char item[64];
	int k = snprintf(item, sizeof(item), "%s%s %" PRIu64, w->items ? ", " : "", name, n);
	if (k < 0)
		return;
	if (w->len + (size_t)k > KVR_INSP_COLUMNS && w->items) {
		pline(w->out, "%s,", w->line);
		memset(w->line, ' ', w->indent);
		w->len = w->indent;
		k = snprintf(item, sizeof(item), "%s %" PRIu64, name, n);
	}
	w->len += (size_t)snprintf(w->line + w->len, sizeof(w->line) - w->len, "%s", item);
	if (w->len >= sizeof(w->line))
		w->len = sizeof(w->line) - 1;
	w->items++;
}

static void text_l2(FILE *out, const struct kvr_insp_snap *s)
{
	if (!s->n_l2)
		return;
	pline(out, "l2");
	for (unsigned i = 0; i < s->n_l2; i++) {
		const struct kvr_insp_l2 *l = &s->l2[i];
		char used[16], cap[16];
		size_t plen = strlen(l->dir), room = KVR_INSP_COLUMNS - 4 - strlen(l->name);
		if (!plen)
			pline(out, "  %s  (l2.dirs[%u]: not in the config)", l->name, l->dir_index);
		else if (plen <= room)
			pline(out, "  %s  %s", l->name, l->dir);
		else /* the end of a long path names the directory */
			pline(out, "  %s  ...%s", l->name, l->dir + plen - (room - 3));
		unsigned pct = l->capacity_bytes ? (unsigned)(l->used_bytes * 100 / l->capacity_bytes) : 0;
		pline(out, "    used %s of %s (%u%%)  files %" PRIu64 "  evicted %" PRIu64,
		      kvr_fmt_bytes(l->used_bytes, used, sizeof(used)), kvr_fmt_bytes(l->capacity_bytes, cap, sizeof(cap)), pct,
		      l->files, l->evicted);
		struct wrap w = {.out = out, .indent = 6};
		w.len = (size_t)snprintf(w.line, sizeof(w.line), "    adopted %" PRIu64, l->adopted);
		bool lead = false;
		for (unsigned r = 1; r < KVR_STAT_DK_REASON_MAX; r++) {
			if (!l->rejected[r] || !adoption_reason(r))
				continue;
			if (!lead)
				w.len += (size_t)snprintf(w.line + w.len, sizeof(w.line) - w.len, ", not adopted: ");
			lead = true;
			wrap_item(&w, kvr_stat_dk_reason_name(r), l->rejected[r]);
		}
		pline(out, "%s", w.line);
		if (l->reads_damaged || l->reads_vanished || l->reads_io_error)
			pline(out, "    reads failed: damaged %" PRIu64 ", vanished %" PRIu64 ", io_error %" PRIu64,
			      l->reads_damaged, l->reads_vanished, l->reads_io_error);
		if (l->writes_refused || l->left_in_place || l->bad_kept)
			pline(out, "    read-only: %" PRIu64 " writes refused, kept %" PRIu64 " at adoption, %" PRIu64
			      " after reads", l->writes_refused, l->left_in_place, l->bad_kept);
		if (l->xfer_joined || l->xfer_registered || l->xfer_unregistered)
			pline(out, "    transfers: joined %" PRIu64 ", registered %" PRIu64 ", unregistered %" PRIu64,
			      l->xfer_joined, l->xfer_registered, l->xfer_unregistered);
	}
	pline(out, "%s", "");
}

/* The remote tier: the actor and its cluster (gauges), what it read and wrote, what went
 * wrong with the cluster, and what the lookup actor sent it. */
static void text_remote(FILE *out, const struct kvr_insp_snap *s)
{
	if (!s->has_remote)
		return;
	const struct kvr_insp_remote *r = &s->remote;
	char in[16], outb[16];
	pline(out, "remote");
	pline(out, "  %s  %s  nodes %" PRIu64 "/%" PRIu64 " up  slots %" PRIu64 "/%u  inflight %" PRIu64,
	      r->name[0] ? r->name : "?", kvr_actor_state_name(r->state), r->nodes_up, r->nodes, r->slots_covered,
	      HASH_SLOTS, r->inflight);
	pline(out, "    bytes in %s, out %s", kvr_fmt_bytes(r->bytes_in, in, sizeof(in)),
	      kvr_fmt_bytes(r->bytes_out, outb, sizeof(outb)));
	struct wrap w = {.out = out, .indent = 6};
	w.len = (size_t)snprintf(w.line, sizeof(w.line), "    reads %" PRIu64 ": ", r->reads);
	wrap_item(&w, "hits", r->hits);
	wrap_item(&w, "misses", r->misses);
	wrap_item(&w, "bad", r->bad_values);
	wrap_item(&w, "errors", r->read_errors);
	pline(out, "%s", w.line);
	w = (struct wrap){.out = out, .indent = 6};
	w.len = (size_t)snprintf(w.line, sizeof(w.line), "    writes %" PRIu64 ": ", r->writes);
	wrap_item(&w, "errors", r->write_errors);
	wrap_item(&w, "stale", r->writes_stale);
	pline(out, "%s", w.line);
	w = (struct wrap){.out = out, .indent = 6};
	w.len = (size_t)snprintf(w.line, sizeof(w.line), "    cluster: ");
	wrap_item(&w, "moved", r->moved);
	wrap_item(&w, "ask", r->ask);
	wrap_item(&w, "timeouts", r->timeouts);
	wrap_item(&w, "conn errors", r->conn_errors);
	wrap_item(&w, "reply errors", r->reply_errors);
	wrap_item(&w, "refreshes", r->refreshes);
	pline(out, "%s", w.line);
	w = (struct wrap){.out = out, .indent = 6};
	w.len = (size_t)snprintf(w.line, sizeof(w.line), "    lookup: ");
	wrap_item(&w, "promoted", r->lk_reads);
	wrap_item(&w, "not promoted", r->lk_read_fails);
	wrap_item(&w, "writes sent", r->lk_writes);
	wrap_item(&w, "skipped", r->lk_writes_skipped);
	pline(out, "%s", w.line);
	pline(out, "%s", "");
}

/* What needs a look, first: actors given up on or waiting to restart, a ready remote actor
 * whose cluster is not whole (a node down, hash slots without a master), full rings and
 * their blocked or stuck ends, rings whose consumer rejected messages. Nothing when all is
 * well. */
static void text_attention(FILE *out, const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev)
{
	bool any = false;
	char a[48], b[16];
	for (unsigned i = 0; i < cur->n_actors; i++) {
		const struct kvr_insp_actor *x = &cur->actors[i];
		if (x->state != KVR_ACTOR_FAILED && x->state != KVR_ACTOR_BACKOFF)
			continue;
		if (!any)
			pline(out, "attention");
		any = true;
		pline(out, "  actor %s: %s, %u restarts, last exit %s", x->name[0] ? x->name : "?",
		      kvr_actor_state_name(x->state), x->restarts,
		      fmt_exit(x->last_exit_code, x->last_exit_signal, a, sizeof(a)));
	}
	for (unsigned i = 0; i < cur->n_actors; i++) {
		const struct kvr_insp_actor *x = &cur->actors[i];
		if (x->kind != KVR_ACTOR_GATHER || !x->held)
			continue;
		if (!any)
			pline(out, "attention");
		any = true;
		pline(out, "  actor %s: %u stores waiting for the rest of their DCP group", x->name[0] ? x->name : "?",
		      x->held);
	}
	const struct kvr_insp_remote *rm = &cur->remote;
	if (cur->has_remote && rm->state == KVR_ACTOR_READY &&
	    (rm->nodes_up < rm->nodes || rm->slots_covered < HASH_SLOTS)) {
		if (!any)
			pline(out, "attention");
		any = true;
		pline(out, "  remote: %" PRIu64 " of %" PRIu64 " nodes up, %" PRIu64 " of %u hash slots covered",
		      rm->nodes_up, rm->nodes, rm->slots_covered, HASH_SLOTS);
	}
	for (unsigned i = 0; i < cur->n_rings; i++) {
		const struct kvr_insp_ring *r = &cur->rings[i];
		if (!r->valid) {
			if (!any)
				pline(out, "attention");
			any = true;
			pline(out, "  ring %s: INVALID", r->name);
			continue;
		}
		bool full = r->fill == r->capacity, stuck = ring_stuck(prev, r);
		if (!full && !r->prod_blocked && !r->rejected)
			continue;
		if (!any)
			pline(out, "attention");
		any = true;
		char rej[48] = "";
		if (r->rejected)
			snprintf(rej, sizeof(rej), "%s%" PRIu64 " malformed rejected", full ? ", " : "", r->rejected);
		pline(out, "  ring %s: %s%s", r->name, full ? "FULL" : "", rej);
		if (r->prod_blocked)
			pline(out, "    producer %s (pid %s) BLOCKED", kvr_insp_endpoint_name(cur, r->producer, a, sizeof(a)),
			      fmt_pid(r->prod_pid, b, sizeof(b)));
		if (stuck)
			pline(out, "    consumer %s (pid %s) STUCK (no progress)",
			      kvr_insp_endpoint_name(cur, r->consumer, a, sizeof(a)), fmt_pid(r->cons_pid, b, sizeof(b)));
		else if (full && !r->cons_pid)
			pline(out, "    consumer %s: no process attached", kvr_insp_endpoint_name(cur, r->consumer, a, sizeof(a)));
	}
	if (any)
		pline(out, "%s", "");
}

static void text_ring(FILE *out, const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev,
		      const struct kvr_insp_ring *r)
{
	char a[48], b[16];
	if (!r->valid) {
		pline(out, "  %s  INVALID (error %d: not read)", r->name, r->error);
		return;
	}
	bool full = r->fill == r->capacity;
	double rate = ring_rate(cur, prev, r);
	if (rate >= 0)
		snprintf(a, sizeof(a), "  %s msg/s", kvr_fmt_rate(rate, b, sizeof(b)));
	else
		a[0] = '\0';
	pline(out, "  %s  capacity %u%s%s", r->name, r->capacity, a, full ? "  FULL" : "");

	char bar[BAR_WIDTH + 1];
	unsigned nb = r->capacity ? (unsigned)((uint64_t)r->fill * BAR_WIDTH / r->capacity) : 0;
	if (r->fill && !nb)
		nb = 1;
	for (unsigned k = 0; k < BAR_WIDTH; k++)
		bar[k] = k < nb ? '#' : '.';
	bar[BAR_WIDTH] = '\0';
	unsigned pct = r->capacity ? (unsigned)((uint64_t)r->fill * 100 / r->capacity) : 0;
	pline(out, "    fill %u/%u %3u%% [%s]", r->fill, r->capacity, pct, bar);

	const char *pmark = r->prod_blocked ? "BLOCKED (ring full)" : "";
	const char *cmark = r->cons_blocked ? "waiting (ring empty)"
			    : ring_stuck(prev, r) ? "STUCK (ring full, no progress)"
			    : full		   ? "(ring full)"
						   : "";
	pline(out, "    producer %-23s pid %-7s %s", kvr_insp_endpoint_name(cur, r->producer, a, sizeof(a)),
	      fmt_pid(r->prod_pid, b, sizeof(b)), pmark);
	pline(out, "    consumer %-23s pid %-7s %s", kvr_insp_endpoint_name(cur, r->consumer, a, sizeof(a)),
	      fmt_pid(r->cons_pid, b, sizeof(b)), cmark);
	pline(out, "    head %u  tail %u  rejected %" PRIu64, r->head, r->tail, r->rejected);
	pline(out, "    enqueued %" PRIu64 "  dequeued %" PRIu64, r->enqueued, r->dequeued);
	pline(out, "    full waits %" PRIu64 "  waited %.3f s", r->full_waits, (double)r->full_wait_ns / 1e9);

	if (!r->fill || !cur->max_msgs)
		return;
	if (r->msg_size != sizeof(struct kvr_msg)) {
		pline(out, "    in flight: %u (message size %u B: not decoded)", r->fill, r->msg_size);
		return;
	}
	if (r->n_msgs < r->fill)
		pline(out, "    in flight: %u (first %u)", r->fill, r->n_msgs);
	else
		pline(out, "    in flight: %u", r->fill);
	for (unsigned k = 0; k < r->n_msgs; k++) {
		char d[128];
		kvr_msg_describe(&r->msgs[k], d, sizeof(d));
		pline(out, "      #%u %s", k, d);
	}
}

int kvr_insp_render_text(FILE *out, const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev)
{
	if (!out || !cur)
		return -EINVAL;
	text_instance(out, cur);
	pline(out, "%s", "");
	text_attention(out, cur, prev);
	text_slots(out, cur);
	text_actors(out, cur);
	pline(out, "%s", "");
	text_engines(out, cur);
	text_models(out, cur);
	text_workers(out, cur);
	text_leases(out, cur);
	pline(out, "%s", "");
	text_l2(out, cur);
	text_remote(out, cur);
	pline(out, cur->n_rings ? "rings" : "rings: none");
	unsigned hidden = 0;
	for (unsigned i = 0; i < cur->n_rings; i++) {
		if (cur->hide_idle && ring_idle(cur, &cur->rings[i])) {
			hidden++;
			continue;
		}
		text_ring(out, cur, prev, &cur->rings[i]);
	}
	if (hidden)
		pline(out, "  (%u idle rings of free worker slots not shown: --all)", hidden);
	return ferror(out) ? -EIO : 0;
}

/* ---- JSON ------------------------------------------------------------------------------- */

static void json_endpoint(struct kvr_jw *w, const char *key, const struct kvr_insp_snap *s, int ep, int32_t pid,
			  uint32_t blocked)
{
	char name[48];
	kvr_jw_object(w, key);
	kvr_jw_i64(w, "endpoint", ep);
	kvr_jw_str(w, "name", kvr_insp_endpoint_name(s, ep, name, sizeof(name)));
	kvr_jw_i64(w, "pid", pid);
	kvr_jw_bool(w, "blocked", blocked != 0);
	kvr_jw_end(w);
}

static void json_ring(struct kvr_jw *w, const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev,
		      const struct kvr_insp_ring *r)
{
	kvr_jw_object(w, NULL);
	kvr_jw_u64(w, "index", r->index);
	kvr_jw_str(w, "name", r->name);
	kvr_jw_bool(w, "valid", r->valid);
	if (!r->valid) {
		kvr_jw_i64(w, "error", r->error);
		kvr_jw_end(w);
		return;
	}
	kvr_jw_u64(w, "capacity", r->capacity);
	kvr_jw_u64(w, "msg_size", r->msg_size);
	kvr_jw_u64(w, "head", r->head);
	kvr_jw_u64(w, "tail", r->tail);
	kvr_jw_u64(w, "fill", r->fill);
	kvr_jw_fixed3(w, "fill_percent", r->capacity ? (double)r->fill * 100.0 / r->capacity : 0.0);
	kvr_jw_bool(w, "full", r->fill == r->capacity);
	json_endpoint(w, "producer", cur, r->producer, r->prod_pid, r->prod_blocked);
	json_endpoint(w, "consumer", cur, r->consumer, r->cons_pid, r->cons_blocked);
	kvr_jw_u64(w, "enqueued", r->enqueued);
	kvr_jw_u64(w, "dequeued", r->dequeued);
	kvr_jw_u64(w, "rejected", r->rejected);
	kvr_jw_u64(w, "full_waits", r->full_waits);
	kvr_jw_u64(w, "full_wait_ns", r->full_wait_ns);
	kvr_jw_secs(w, "full_wait_s", r->full_wait_ns);
	kvr_jw_u64(w, "empty_sleeps", r->empty_sleeps);
	double rate = ring_rate(cur, prev, r);
	if (rate >= 0)
		kvr_jw_fixed3(w, "rate_msgs_per_s", rate);
	else
		kvr_jw_null(w, "rate_msgs_per_s");
	kvr_jw_bool(w, "stuck", ring_stuck(prev, r));
	kvr_jw_array(w, "messages");
	for (unsigned k = 0; k < r->n_msgs; k++) {
		const struct kvr_msg *m = &r->msgs[k];
		char d[128];
		kvr_jw_object(w, NULL);
		kvr_jw_u64(w, "index", k);
		kvr_jw_u64(w, "type", m->hdr.type);
		kvr_jw_str(w, "type_name", kvr_msg_type_name(m->hdr.type));
		kvr_jw_u64(w, "req_id", m->hdr.req_id);
		kvr_jw_u64(w, "seq", m->hdr.seq);
		kvr_jw_u64(w, "flags", m->hdr.flags);
		kvr_jw_bool(w, "more", m->hdr.flags & KVR_MSGF_MORE);
		kvr_jw_bool(w, "error", m->hdr.flags & KVR_MSGF_ERROR);
		kvr_jw_u64(w, "body_len", m->hdr.body_len);
		kvr_jw_str(w, "text", kvr_msg_describe(m, d, sizeof(d)));
		kvr_jw_end(w);
	}
	kvr_jw_end(w);
	kvr_jw_end(w);
}

static void json_l2(struct kvr_jw *w, const struct kvr_insp_l2 *l)
{
	kvr_jw_object(w, NULL);
	kvr_jw_str(w, "actor", l->name);
	kvr_jw_u64(w, "actor_index", l->actor);
	kvr_jw_str(w, "state", kvr_actor_state_name(l->state));
	kvr_jw_u64(w, "dir_index", l->dir_index);
	if (l->dir[0])
		kvr_jw_str(w, "dir", l->dir);
	else
		kvr_jw_null(w, "dir");
	kvr_jw_u64(w, "used_bytes", l->used_bytes);
	kvr_jw_u64(w, "files", l->files);
	kvr_jw_u64(w, "capacity_bytes", l->capacity_bytes);
	kvr_jw_u64(w, "evicted_files", l->evicted);
	kvr_jw_object(w, "adoption");
	kvr_jw_u64(w, "adopted", l->adopted);
	for (unsigned r = 1; r < KVR_STAT_DK_REASON_MAX; r++)
		if (adoption_reason(r))
			kvr_jw_u64(w, adoption_reason(r), l->rejected[r]);
	kvr_jw_end(w);
	kvr_jw_object(w, "read_failures");
	kvr_jw_u64(w, "damaged", l->reads_damaged);
	kvr_jw_u64(w, "vanished", l->reads_vanished);
	kvr_jw_u64(w, "io_error", l->reads_io_error);
	kvr_jw_end(w);
	kvr_jw_u64(w, "read_only_refused_writes", l->writes_refused);
	kvr_jw_object(w, "read_only_kept_files");
	kvr_jw_u64(w, "adoption", l->left_in_place);
	kvr_jw_u64(w, "read", l->bad_kept);
	kvr_jw_end(w);
	kvr_jw_object(w, "transfers");
	kvr_jw_u64(w, "joined", l->xfer_joined);
	kvr_jw_u64(w, "registered", l->xfer_registered);
	kvr_jw_u64(w, "unregistered", l->xfer_unregistered);
	kvr_jw_end(w);
	kvr_jw_end(w);
}

static void json_remote(struct kvr_jw *w, const struct kvr_insp_remote *r)
{
	kvr_jw_object(w, "remote");
	kvr_jw_str(w, "actor", r->name);
	kvr_jw_u64(w, "actor_index", r->actor);
	kvr_jw_str(w, "state", kvr_actor_state_name(r->state));
	kvr_jw_u64(w, "nodes", r->nodes);
	kvr_jw_u64(w, "nodes_up", r->nodes_up);
	kvr_jw_u64(w, "slots_covered", r->slots_covered);
	kvr_jw_u64(w, "inflight", r->inflight);
	kvr_jw_u64(w, "reads", r->reads);
	kvr_jw_u64(w, "hits", r->hits);
	kvr_jw_u64(w, "misses", r->misses);
	kvr_jw_u64(w, "bad_values", r->bad_values);
	kvr_jw_u64(w, "read_errors", r->read_errors);
	kvr_jw_u64(w, "writes", r->writes);
	kvr_jw_u64(w, "write_errors", r->write_errors);
	kvr_jw_u64(w, "stale_writes", r->writes_stale);
	kvr_jw_u64(w, "bytes_in", r->bytes_in);
	kvr_jw_u64(w, "bytes_out", r->bytes_out);
	kvr_jw_u64(w, "moved_redirects", r->moved);
	kvr_jw_u64(w, "ask_redirects", r->ask);
	kvr_jw_u64(w, "timeouts", r->timeouts);
	kvr_jw_u64(w, "connection_errors", r->conn_errors);
	kvr_jw_u64(w, "reply_errors", r->reply_errors);
	kvr_jw_u64(w, "slot_map_refreshes", r->refreshes);
	kvr_jw_object(w, "lookup");
	kvr_jw_u64(w, "promoted", r->lk_reads);
	kvr_jw_u64(w, "promotion_failures", r->lk_read_fails);
	kvr_jw_u64(w, "writes_sent", r->lk_writes);
	kvr_jw_u64(w, "writes_skipped", r->lk_writes_skipped);
	kvr_jw_end(w);
	kvr_jw_end(w);
}

int kvr_insp_render_json(FILE *out, const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev, bool pretty)
{
	if (!out || !cur)
		return -EINVAL;
	struct kvr_jw w;
	kvr_jw_init(&w, out, pretty ? KVR_JW_INDENT : KVR_JW_COMPACT);
	const struct kvr_insp_snap *s = cur;

	kvr_jw_object(&w, NULL);
	kvr_jw_u64(&w, "schema", KVR_INSP_JSON_SCHEMA);
	kvr_jw_u64(&w, "now_mono_ns", s->now.mono_ns);
	kvr_jw_u64(&w, "now_real_ns", s->now.real_ns);
	if (prev && prev->now.mono_ns < s->now.mono_ns)
		kvr_jw_secs(&w, "interval_s", s->now.mono_ns - prev->now.mono_ns);
	else
		kvr_jw_null(&w, "interval_s");

	kvr_jw_object(&w, "instance");
	kvr_jw_str(&w, "state", kvr_inst_state_name(s->state));
	kvr_jw_u64(&w, "state_code", s->state);
	kvr_jw_i64(&w, "supervisor_pid", s->supervisor_pid);
	kvr_jw_u64(&w, "generation", s->generation);
	kvr_jw_u64(&w, "started_real_ns", s->started_ns);
	if (s->started_ns && s->started_ns <= s->now.real_ns)
		kvr_jw_secs(&w, "uptime_s", s->now.real_ns - s->started_ns);
	else
		kvr_jw_null(&w, "uptime_s");
	kvr_jw_str(&w, "socket", s->socket_path);
	kvr_jw_u64(&w, "max_actors", s->max_actors);
	kvr_jw_u64(&w, "max_workers", s->max_workers);
	kvr_jw_end(&w);

	kvr_jw_array(&w, "actors");
	for (unsigned i = 0; i < s->n_actors; i++) {
		const struct kvr_insp_actor *a = &s->actors[i];
		kvr_jw_object(&w, NULL);
		kvr_jw_u64(&w, "index", a->index);
		kvr_jw_str(&w, "name", a->name);
		kvr_jw_str(&w, "kind", kvr_actor_kind_name(a->kind));
		kvr_jw_str(&w, "state", kvr_actor_state_name(a->state));
		kvr_jw_u64(&w, "state_code", a->state);
		kvr_jw_i64(&w, "pid", a->pid);
		kvr_jw_u64(&w, "generation", a->generation);
		kvr_jw_u64(&w, "restarts", a->restarts);
		kvr_jw_i64(&w, "last_exit_code", a->last_exit_code);
		kvr_jw_i64(&w, "last_exit_signal", a->last_exit_signal);
		kvr_jw_u64(&w, "heartbeat_mono_ns", a->heartbeat_ns);
		if (a->heartbeat_ns)
			kvr_jw_secs(&w, "heartbeat_age_s", s->now.mono_ns > a->heartbeat_ns ? s->now.mono_ns - a->heartbeat_ns : 0);
		else
			kvr_jw_null(&w, "heartbeat_age_s");
		kvr_jw_u64(&w, "held", a->held);
		kvr_jw_u64(&w, "populated_bytes", a->populated);
		kvr_jw_u64(&w, "populate_target_bytes", a->populate_total);
		if (a->page_tables_known)
			kvr_jw_u64(&w, "page_table_bytes", a->page_table_bytes);
		else
			kvr_jw_null(&w, "page_table_bytes");
		kvr_jw_end(&w);
	}
	kvr_jw_end(&w);

	if (s->has_slots) {
		const struct kvr_slot_counts *c = &s->slots;
		kvr_jw_object(&w, "l1_slots");
		kvr_jw_u64(&w, "slots", s->n_slots);
		kvr_jw_u64(&w, "free", c->by_state[KVR_SLOT_FREE]);
		kvr_jw_u64(&w, "writing", c->by_state[KVR_SLOT_WRITING]);
		kvr_jw_u64(&w, "committed", c->by_state[KVR_SLOT_COMMITTED]);
		kvr_jw_u64(&w, "reading", c->reading);
		kvr_jw_u64(&w, "evicting", c->by_state[KVR_SLOT_EVICTING]);
		kvr_jw_u64(&w, "draining", c->by_state[KVR_SLOT_DRAINING]);
		kvr_jw_u64(&w, "invalid", c->invalid);
		kvr_jw_object(&w, "pins");
		kvr_jw_u64(&w, "loaders", s->pins_by[0]);
		kvr_jw_u64(&w, "lookup", s->pins_by[1]);
		kvr_jw_u64(&w, "io", s->pins_by[2]);
		kvr_jw_u64(&w, "remote", s->pins_by[3]);
		kvr_jw_end(&w);
		kvr_jw_end(&w);
	} else {
		kvr_jw_null(&w, "l1_slots");
	}
	kvr_jw_array(&w, "workers");
	for (unsigned i = 0; i < s->n_workers; i++) {
		const struct kvr_insp_worker *k = &s->workers[i];
		char name[24];
		snprintf(name, sizeof(name), "client.%u", k->slot);
		kvr_jw_object(&w, NULL);
		kvr_jw_u64(&w, "slot", k->slot);
		kvr_jw_str(&w, "name", name);
		kvr_jw_str(&w, "state", worker_state_name(k->state));
		kvr_jw_i64(&w, "pid", k->pid);
		kvr_jw_u64(&w, "uid", k->uid);
		kvr_jw_u64(&w, "generation", k->generation);
		kvr_jw_u64(&w, "tp_rank", k->tp_rank);
		kvr_jw_u64(&w, "tp_size", k->tp_size);
		kvr_jw_u64(&w, "dcp_rank", k->dcp_rank);
		kvr_jw_u64(&w, "dcp_size", k->dcp_size);
		kvr_jw_u64(&w, "engine", k->engine);
		kvr_jw_u64(&w, "block_tokens", k->block_tokens);
		kvr_jw_end(&w);
	}
	kvr_jw_end(&w);
	kvr_jw_array(&w, "schedulers");
	for (unsigned i = 0; i < s->n_scheds; i++) {
		const struct kvr_insp_worker *k = &s->scheds[i];
		kvr_jw_object(&w, NULL);
		kvr_jw_u64(&w, "slot", k->slot);
		kvr_jw_str(&w, "state", worker_state_name(k->state));
		kvr_jw_i64(&w, "pid", k->pid);
		kvr_jw_u64(&w, "generation", k->generation);
		kvr_jw_u64(&w, "engine", k->engine);
		kvr_jw_u64(&w, "block_tokens", k->block_tokens);
		kvr_jw_end(&w);
	}
	kvr_jw_end(&w);
	if (s->has_engines) {
		kvr_jw_array(&w, "engines");
		for (unsigned i = 0; i < s->n_engines; i++) {
			const struct kvr_insp_engine *e = &s->engines[i];
			kvr_jw_object(&w, NULL);
			kvr_jw_u64(&w, "index", e->index);
			kvr_jw_str(&w, "id", e->id);
			kvr_jw_str(&w, "model_ns", e->model_ns);
			kvr_jw_u64(&w, "workers", e->workers);
			kvr_jw_u64(&w, "schedulers", e->schedulers);
			kvr_jw_end(&w);
		}
		kvr_jw_end(&w);
	} else {
		kvr_jw_null(&w, "engines");
	}
	kvr_jw_array(&w, "models");
	for (unsigned i = 0; i < s->n_models; i++) {
		const struct kvr_insp_model *m = &s->models[i];
		kvr_jw_object(&w, NULL);
		kvr_jw_str(&w, "namespace", m->index == KVR_CTL_MODEL_OTHER ? "" : m->name);
		kvr_jw_bool(&w, "other", m->index == KVR_CTL_MODEL_OTHER);
		kvr_jw_u64(&w, "engines", m->engines);
		kvr_jw_u64(&w, "lookups", m->lookups);
		kvr_jw_u64(&w, "requested_blocks", m->keys);
		kvr_jw_u64(&w, "matched_blocks", m->matched);
		kvr_jw_u64(&w, "stored_lanes", m->stored);
		kvr_jw_u64(&w, "l1_slots", m->l1_slots);
		kvr_jw_u64(&w, "l1_bytes", m->l1_bytes);
		kvr_jw_u64(&w, "l2_lanes", m->l2_lanes);
		kvr_jw_u64(&w, "l2_bytes", m->l2_bytes);
		kvr_jw_end(&w);
	}
	kvr_jw_end(&w);
	kvr_jw_object(&w, "arena");
	kvr_jw_u64(&w, "bytes", s->arena_bytes);
	kvr_jw_u64(&w, "huge_pages", s->arena_huge);
	static const char *const pfs[] = {"off", "running", "done", "skipped", "failed"};
	kvr_jw_str(&w, "prefault", s->prefault_state < 5 ? pfs[s->prefault_state] : "?");
	kvr_jw_u64(&w, "prefaulted_bytes", s->prefault_bytes);
	kvr_jw_end(&w);
	kvr_jw_object(&w, "leases");
	kvr_jw_u64(&w, "held", s->leases);
	kvr_jw_u64(&w, "granted", s->leases_granted);
	kvr_jw_u64(&w, "taken", s->leases_taken);
	kvr_jw_u64(&w, "loaded", s->lease_ends[0]);
	kvr_jw_u64(&w, "released", s->lease_ends[1]);
	kvr_jw_u64(&w, "expired", s->lease_ends[2]);
	kvr_jw_u64(&w, "refused", s->lease_ends[3]);
	kvr_jw_u64(&w, "missing", s->lease_ends[4]);
	kvr_jw_object(&w, "missed_blocks");
	for (unsigned k = 0; k < 6; k++)
		kvr_jw_u64(&w, kvr_miss_reason_name(k + 1), s->miss_blocks[k]);
	kvr_jw_end(&w);
	kvr_jw_end(&w);

	kvr_jw_array(&w, "rings");
	for (unsigned i = 0; i < s->n_rings; i++)
		json_ring(&w, cur, prev, &s->rings[i]);
	kvr_jw_end(&w);

	kvr_jw_array(&w, "l2");
	for (unsigned i = 0; i < s->n_l2; i++)
		json_l2(&w, &s->l2[i]);
	kvr_jw_end(&w);
	if (s->has_remote)
		json_remote(&w, &s->remote);
	else
		kvr_jw_null(&w, "remote");
	kvr_jw_end(&w);
	fputc('\n', out);
	return kvr_jw_finish(&w);
}

int kvr_insp_render(FILE *out, const struct kvr_ctl *c, const struct kvr_insp_clock *now, unsigned max_msgs,
		    unsigned flags)
{
	if (!out)
		return -EINVAL;
	struct kvr_insp_snap *s;
	int rc = kvr_insp_snapshot(c, now, max_msgs, &s);
	if (rc)
		return rc;
	rc = (flags & KVR_INSP_JSON) ? kvr_insp_render_json(out, s, NULL, true) : kvr_insp_render_text(out, s, NULL);
	kvr_insp_snap_free(s);
	return rc;
}
