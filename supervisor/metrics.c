/* kvringd's HTTP listener: GET /metrics (Prometheus text format 0.0.4) from the shared segments; /status and /. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include <kvring/kvring.h>


#include "kvr_log.h"
#include "metrics_read.h"
#include "status.h"
#include "sup.h"

/*
 * Threading: libmicrohttpd runs its own polling thread (MHD_USE_INTERNAL_POLLING_THREAD)
 * and calls the handler there, one request at a time. The handler only reads shared
 * memory: counters and states with atomic loads, names and ring geometry that are fixed
 * once the segments exist. So a scrape never waits for the supervisor's loop, and the loop
 * (restarts, attach, drain) never waits for a scrape. docs/metrics.md says why this was
 * chosen over MHD's external-select mode inside the epoll loop.
 *
 * The socket is bound by sup_metrics_open() before anything else starts, so a port in use
 * refuses the start; serving begins with sup_metrics_start() once the segments exist.
 *
 * Every page is read under one lock, m->lock: the main thread takes it (sup_metrics_pause)
 * while it maps a client area over the place a render reads ring counters from, and while
 * it copies its engine table into m->engines (sup_metrics_engines): engines live only in
 * kvringd's memory, and the main loop changes them. /status and / (status.c,
 * status_html.c) collect their document under the lock and print it after releasing it.
 */

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define CONTENT_JSON "application/json; charset=utf-8"
#define CONTENT_HTML "text/html; charset=utf-8"
#define CONTENT_TEXT "text/plain; charset=utf-8"
#define NS_PER_S 1000000000ull

struct sup_metrics {
	int fd;                      /* the bound, listening socket (ours; MHD gets a dup) */
	struct MHD_Daemon *d;
	pthread_mutex_t lock;        /* over view and engines: renders are serialised */
	struct sup_metrics_view view;
	struct kvr_inspect_engine engines[KVR_CTL_MAX_ENGINES]; /* the main thread's table, copied */
	unsigned n_engines;
	char listen[64];
};

/* ---- rendering ----------------------------------------------------------------------- */

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value from a fixed-size name field (maybe not NUL-terminated), escaped. */
static void label_value(FILE *f, const char *s, size_t max)
{
	size_t n = strnlen(s, max);
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '\\' || s[i] == '"')
			fputc('\\', f);
		if (s[i] == '\n')
			fputs("\\n", f);
		else
			fputc(s[i], f);
	}
}

/* Nanoseconds as exact decimal seconds, without trailing zeros: "1.5", "0.000016", "0". */
static void seconds(FILE *f, uint64_t ns)
{
	char frac[16];
	fprintf(f, "%llu", (unsigned long long)(ns / NS_PER_S));
	if (!(ns % NS_PER_S))
		return;
	int n = snprintf(frac, sizeof(frac), "%09llu", (unsigned long long)(ns % NS_PER_S));
	while (n > 0 && frac[n - 1] == '0')
		frac[--n] = 0;
	fprintf(f, ".%s", frac);
}

static void actor_label(FILE *f, const char *metric, const struct kvr_actor_ent *e)
{
	fprintf(f, "%s{actor=\"", metric);
	label_value(f, e->name, sizeof(e->name));
	fputs("\"} ", f);
}

static void render_instance(FILE *f, const struct kvr_ctl *c)
{
	unsigned st = atomic_load(&((struct kvr_ctl *)c)->state);
	family(f, "kvring_instance_state", "gauge", "Instance state: 1 for the current state, 0 for the others.");
	for (unsigned s = KVR_INST_STARTING; s <= KVR_INST_STOPPED; s++)
		fprintf(f, "kvring_instance_state{state=\"%s\"} %d\n", kvr_inst_state_name(s), s == st);

	unsigned attached = 0;
	for (unsigned w = 0; w < c->max_workers; w++)
		attached += atomic_load(&kvr_ctl_worker(c, w)->state) == KVR_WORKER_ATTACHED;
	family(f, "kvring_workers_attached", "gauge", "Worker slots with an attached worker.");
	fprintf(f, "kvring_workers_attached %u\n", attached);
}

/* A gauge family of one 64-bit word of the actor entry (at `off`), for the running actors
 * (an exited actor's words are its last run's). */
static void running_gauge(FILE *f, const struct kvr_ctl *c, const char *name, const char *help, size_t off)
{
	family(f, name, "gauge", help);
	for (unsigned i = 0; i < kvr_mr_n_actors(c); i++) {
		struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
		if (!kvr_mr_actor_used(c, i) || atomic_load(&e->pid) <= 0)
			continue;
		actor_label(f, name, e);
		fprintf(f, "%llu\n", (unsigned long long)atomic_load((_Atomic uint64_t *)((uint8_t *)e + off)));
	}
}

static void render_actors(FILE *f, const struct kvr_ctl *c)
{
	unsigned n = kvr_mr_n_actors(c);
	family(f, "kvring_actor_up", "gauge",
	       "1 while the actor is ready and serving (loader.N/storer.N are 0 while worker slot N is free).");
	for (unsigned i = 0; i < n; i++)
		if (kvr_mr_actor_used(c, i)) {
			actor_label(f, "kvring_actor_up", kvr_ctl_actor(c, i));
			fprintf(f, "%d\n", atomic_load(&kvr_ctl_actor(c, i)->state) == KVR_ACTOR_READY);
		}
	family(f, "kvring_actor_restarts_total", "counter", "Times kvringd restarted the actor after it died.");
	for (unsigned i = 0; i < n; i++)
		if (kvr_mr_actor_used(c, i)) {
			struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
			actor_label(f, "kvring_actor_restarts_total", e);
			fprintf(f, "%u\n", __atomic_load_n(&e->restarts, __ATOMIC_RELAXED));
		}
	family(f, "kvring_actor_last_exit_code", "gauge",
	       "Exit code of the actor's last exit, -1 when it has not exited or was killed by a signal.");
	for (unsigned i = 0; i < n; i++)
		if (kvr_mr_actor_used(c, i)) {
			struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
			actor_label(f, "kvring_actor_last_exit_code", e);
			fprintf(f, "%d\n", __atomic_load_n(&e->last_exit_code, __ATOMIC_RELAXED));
		}
	family(f, "kvring_actor_last_exit_signal", "gauge",
	       "Signal that ended the actor's last run, 0 when none did.");
	for (unsigned i = 0; i < n; i++)
		if (kvr_mr_actor_used(c, i)) {
			struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
			actor_label(f, "kvring_actor_last_exit_signal", e);
			fprintf(f, "%d\n", __atomic_load_n(&e->last_exit_signal, __ATOMIC_RELAXED));
		}
	family(f, "kvring_actor_page_table_bytes", "gauge",
	       "Page tables the actor's process holds (VmPTE): 8 bytes per 4 KiB of the arena and KV memory it "
	       "mapped and touched, per 2 MiB with huge pages. Running actors only.");
	for (unsigned i = 0; i < n; i++) {
		struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
		int32_t pid = atomic_load(&e->pid);
		uint64_t pte;
		if (kvr_mr_actor_used(c, i) && pid > 0 && kvr_proc_page_tables(pid, &pte) == 0) {
			actor_label(f, "kvring_actor_page_table_bytes", e);
			fprintf(f, "%llu\n", (unsigned long long)pte);
		}
	}
	running_gauge(f, c, "kvring_actor_populated_bytes",
		      "Bytes of its mappings (arena, KV memory) the actor has faulted in since it started: it populates "
		      "them in the background after it is ready, up to kvring_actor_populate_target_bytes. Running actors.",
		      offsetof(struct kvr_actor_ent, populated));
	running_gauge(f, c, "kvring_actor_populate_target_bytes",
		      "Bytes of its mappings the actor means to populate (0: none; the arena counts only where kvringd "
		      "faulted it in).",
		      offsetof(struct kvr_actor_ent, populate_total));
	family(f, "kvring_malformed_messages_total", "counter", "Messages the actor rejected as malformed.");
	for (unsigned i = 0; i < n; i++)
		if (kvr_mr_actor_used(c, i)) {
			actor_label(f, "kvring_malformed_messages_total", kvr_ctl_actor(c, i));
			fprintf(f, "%llu\n", (unsigned long long)kvr_mr_stat(c, i, KVR_STAT_MALFORMED));
		}
}

static void counter(FILE *f, const char *name, const char *help, uint64_t v)
{
	family(f, name, "counter", help);
	fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

static void render_lookup(FILE *f, struct sup_metrics_view *v)
{
	const struct kvr_ctl *c = v->ctl;
	/* keys first: the lookup actor adds keys before matched, so keys >= matched read later */
	uint64_t keys = kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_KEYS);
	uint64_t matched = kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_MATCHED);
	v->l1_misses = kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_MISSED); /* counted by the lookup actor */

	counter(f, "kvring_lookup_requests_total", "Lookup requests answered.",
		kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_LOOKUPS));
	counter(f, "kvring_lookup_requested_blocks_total", "Blocks asked for by lookups (whole blocks, every rank).",
		keys);
	counter(f, "kvring_lookup_matched_blocks_total", "Blocks of the longest stored prefix returned by lookups.",
		matched);
	counter(f, "kvring_requested_tokens_total",
		"Tokens asked for by lookups (requested blocks x their engine's block_tokens).",
		kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_TOKENS_ASKED));
	counter(f, "kvring_matched_tokens_total", "Tokens matched by lookups (matched blocks x their engine's block_tokens).",
		kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_TOKENS_MATCHED));
	counter(f, "kvring_l1_hits_total", "Matched blocks lookups found in L1 (not promoted from L2 or the shared tier).",
		kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_L1_HITS));
	counter(f, "kvring_l1_misses_total", "Blocks lookups asked for and did not find in L1.", v->l1_misses);
	family(f, "kvring_evictions_total", "counter", "Blocks evicted from L1.");
	fprintf(f, "kvring_evictions_total{reason=\"capacity\"} %llu\n",
		(unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_EVICTED));
	family(f, "kvring_leases", "gauge", "Lookup leases held now (their blocks pinned for the engine's workers).");
	fprintf(f, "kvring_leases %llu\n", (unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_LEASES));
	counter(f, "kvring_leases_granted_total", "Leases granted to schedulers (at least one block).",
		kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_LEASES_GRANTED));
	counter(f, "kvring_lease_takes_total", "Lease takes answered with the lease's slots (one per loading worker).",
		kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_LEASES_TAKEN));
	family(f, "kvring_leases_ended_total", "counter",
	       "Leases ended, by reason: loaded (every loader done), released (by the scheduler, or replaced), "
	       "expired (ttl), refused (table full), missing (a take found no lease).");
	static const struct {
		const char *reason;
		unsigned stat;
	} ends[] = {
		{"loaded", KVR_STAT_LK_LEASES_LOADED},   {"released", KVR_STAT_LK_LEASES_RELEASED},
		{"expired", KVR_STAT_LK_LEASES_EXPIRED}, {"refused", KVR_STAT_LK_LEASES_REFUSED},
		{"missing", KVR_STAT_LK_LEASES_MISSING},
	};
	for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++)
		fprintf(f, "kvring_leases_ended_total{reason=\"%s\"} %llu\n", ends[i].reason,
			(unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, ends[i].stat));
	family(f, "kvring_miss_tokens_total", "counter",
	       "Tokens leases asked for and did not match, by the reason of the first block that did not "
	       "(enum kvr_miss_reason: never_stored, evicted, in_flight, quorum, l2_failed, no_room).");
	for (unsigned r = KVR_MISS_NEVER_STORED; r < KVR_MISS_REASONS; r++)
		fprintf(f, "kvring_miss_tokens_total{reason=\"%s\"} %llu\n", kvr_miss_reason_name(r),
			(unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, KVR_STAT_LK_MISS_TOKENS_FIRST + r - 1));
}

#define KIND(k) (1u << (k)) /* a kind in histogram()'s mask */

/* Sum of the latency histograms stored from counter `first` on of every actor whose kind is
 * in `kinds` (a mask of 1u << enum kvr_actor_kind), as a Prometheus histogram. */
static void histogram(FILE *f, const struct kvr_ctl *c, unsigned kinds, unsigned first, const char *name,
		      const char *help)
{
	uint64_t b[KVR_HIST_BUCKETS] = {0}, sum_ns = 0;
	for (unsigned i = 0; i < kvr_mr_n_actors(c); i++) {
		unsigned k_i = kvr_ctl_actor(c, i)->kind;
		if (!kvr_mr_actor_used(c, i) || k_i >= 32 || !(kinds & (1u << k_i)))
			continue;
		const struct kvr_hist *h = kvr_stats_hist(kvr_ctl_stats(c, i), first);
		sum_ns += atomic_load_explicit(&((struct kvr_hist *)h)->sum_ns, memory_order_relaxed);
		for (unsigned k = 0; k < KVR_HIST_BUCKETS; k++)
			b[k] += atomic_load_explicit(&((struct kvr_hist *)h)->bucket[k], memory_order_relaxed);
	}
	family(f, name, "histogram", help);
	/* cumulative; _count is the +Inf bucket, so the two always agree */
	uint64_t cum = 0;
	for (unsigned k = 0; k < KVR_HIST_FINITE; k++) {
		cum += b[k];
		fprintf(f, "%s_bucket{le=\"", name);
		seconds(f, kvr_hist_bound_us(k) * 1000u);
		fprintf(f, "\"} %llu\n", (unsigned long long)cum);
	}
	cum += b[KVR_HIST_FINITE];
	fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum ", name, (unsigned long long)cum, name);
	seconds(f, sum_ns);
	fprintf(f, "\n%s_count %llu\n", name, (unsigned long long)cum);
}

static void render_transfer(FILE *f, const struct kvr_ctl *c)
{
	family(f, "kvring_store_blocks_total", "counter",
	       "Blocks of completed store requests: stored (copied to L1 and committed), present (already stored), "
	       "failed.");
	fprintf(f, "kvring_store_blocks_total{result=\"stored\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, true, KVR_STAT_XF_BLOCKS));
	fprintf(f, "kvring_store_blocks_total{result=\"present\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, true, KVR_STAT_XF_PRESENT_BLOCKS));
	fprintf(f, "kvring_store_blocks_total{result=\"failed\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, true, KVR_STAT_XF_FAILED_BLOCKS));
	family(f, "kvring_load_blocks_total", "counter",
	       "Blocks of completed load requests: loaded into the worker's KV memory, or failed.");
	fprintf(f, "kvring_load_blocks_total{result=\"loaded\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, false, KVR_STAT_XF_BLOCKS));
	fprintf(f, "kvring_load_blocks_total{result=\"failed\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, false, KVR_STAT_XF_FAILED_BLOCKS));
	family(f, "kvring_fenced_requests_total", "counter",
	       "Loads and stores a fence stopped: cancelled by their client, or their worker detached or died "
	       "before the copy was whole (a store so stopped is never committed).");
	fprintf(f, "kvring_fenced_requests_total{direction=\"store\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, true, KVR_STAT_XF_FENCED));
	fprintf(f, "kvring_fenced_requests_total{direction=\"load\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, false, KVR_STAT_XF_FENCED));
	family(f, "kvring_bytes_total", "counter", "Bytes copied between workers' KV memory and a tier.");
	fprintf(f, "kvring_bytes_total{direction=\"store\",tier=\"l1\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, true, KVR_STAT_XF_BYTES));
	fprintf(f, "kvring_bytes_total{direction=\"load\",tier=\"l1\"} %llu\n",
		(unsigned long long)kvr_mr_xf_sum(c, false, KVR_STAT_XF_BYTES));
	histogram(f, c, KIND(KVR_ACTOR_LOADER), KVR_STAT_XF_HIST_FIRST, "kvring_load_duration_seconds",
		  "Load request latency in the loader: first request message received to reply sent.");
	histogram(f, c, KIND(KVR_ACTOR_STORER) | KIND(KVR_ACTOR_GATHER), KVR_STAT_XF_HIST_FIRST,
		  "kvring_store_duration_seconds",
		  "Store request latency in the storer (or gather actor, waits for the group included): first request message received to reply sent.");
	/* L2: what the lookup actor counted of the disk tier (block lanes) */
	family(f, "kvring_l2_blocks_total", "counter",
	       "Block lanes moved to and from the disk tier (L2) by result: read = promoted into L1 for a lookup, "
	       "write = written through.");
	static const struct {
		const char *labels;
		unsigned stat;
	} l2[] = {
		{"op=\"read\",result=\"ok\"", KVR_STAT_LK_L2_READS},
		{"op=\"read\",result=\"failed\"", KVR_STAT_LK_L2_READ_FAILS},
		{"op=\"write\",result=\"ok\"", KVR_STAT_LK_L2_WRITES},
		{"op=\"write\",result=\"failed\"", KVR_STAT_LK_L2_WRITE_FAILS},
		{"op=\"write\",result=\"skipped\"", KVR_STAT_LK_L2_WRITES_SKIPPED},
	};
	for (size_t i = 0; i < sizeof(l2) / sizeof(l2[0]); i++)
		fprintf(f, "kvring_l2_blocks_total{%s} %llu\n", l2[i].labels,
			(unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, l2[i].stat));
}

static void render_l1(FILE *f, const struct kvr_slot_table *t)
{
	struct kvr_slot_counts sc;
	kvr_slots_counts(t, &sc);
	uint32_t reading = sc.reading <= sc.by_state[KVR_SLOT_COMMITTED] ? sc.reading : sc.by_state[KVR_SLOT_COMMITTED];
	family(f, "kvring_l1_slots", "gauge",
	       "L1 slots by state (committed excludes reading: committed slots a loader has pinned).");
	fprintf(f, "kvring_l1_slots{state=\"free\"} %u\n", sc.by_state[KVR_SLOT_FREE]);
	fprintf(f, "kvring_l1_slots{state=\"writing\"} %u\n", sc.by_state[KVR_SLOT_WRITING]);
	fprintf(f, "kvring_l1_slots{state=\"committed\"} %u\n", sc.by_state[KVR_SLOT_COMMITTED] - reading);
	fprintf(f, "kvring_l1_slots{state=\"evicting\"} %u\n", sc.by_state[KVR_SLOT_EVICTING]);
	fprintf(f, "kvring_l1_slots{state=\"draining\"} %u\n", sc.by_state[KVR_SLOT_DRAINING]);
	fprintf(f, "kvring_l1_slots{state=\"reading\"} %u\n", reading);
}

/* One sample of a per-model family: the model table's name, "other" for entry 0. */
static void model_sample(FILE *f, const char *metric, const struct kvr_model_ent *m, unsigned i, uint64_t v)
{
	fprintf(f, "%s{model=\"", metric);
	if (i == KVR_CTL_MODEL_OTHER)
		fputs("other", f);
	else
		label_value(f, m->name, sizeof(m->name));
	fprintf(f, "\"} %llu\n", (unsigned long long)v);
}

/* Per model namespace (kvr_ctl.h's model table: the first KVR_CTL_MAX_MODELS namespaces engines
 * attached with, the rest under "other"): what its engines asked for and matched, what they
 * stored, and what of it L1 holds (committed slots tagged with it, a scan of the slot table). */
static void render_models(FILE *f, const struct kvr_ctl *c, const struct kvr_slot_table *t)
{
	enum { N = KVR_CTL_MAX_MODELS + 1 };
	uint64_t l1[N] = {0}, v[8][N];
	bool used[N], any = false;
	if (t)
		kvr_slots_model_counts(t, l1, N);
	for (unsigned i = 0; i < N; i++) {
		struct kvr_model_ent *m = kvr_ctl_model(c, i);
		v[0][i] = atomic_load(&m->engines);
		v[1][i] = atomic_load_explicit(&m->lookups, memory_order_relaxed);
		v[2][i] = atomic_load_explicit(&m->tokens_asked, memory_order_relaxed);
		v[3][i] = atomic_load_explicit(&m->tokens_matched, memory_order_relaxed);
		v[4][i] = atomic_load_explicit(&m->stored, memory_order_relaxed);
		v[5][i] = l1[i];
		v[6][i] = l1[i] * (t ? t->slot_bytes : 0);
		v[7][i] = atomic_load_explicit(&m->l2_lanes, memory_order_relaxed) * (t ? t->slot_bytes : 0);
		/* a named entry from its first engine on; "other" once it counted anything */
		used[i] = i == KVR_CTL_MODEL_OTHER ? v[0][i] || v[1][i] || v[4][i] || l1[i] || v[7][i] : m->name[0] != '\0';
		any |= used[i];
	}
	if (!any)
		return; /* no engine attached yet */
	static const struct {
		const char *name, *type, *help;
	} fam[8] = {
		{"kvring_model_engines", "gauge", "Engines attached with this model namespace."},
		{"kvring_model_lookups_total", "counter", "Lookups and leases of this model's engines."},
		{"kvring_model_requested_tokens_total", "counter", "Tokens of full blocks its lookups and leases asked for."},
		{"kvring_model_matched_tokens_total", "counter", "Tokens of those matched in L1, L2 or the shared tier."},
		{"kvring_model_stored_lanes_total", "counter", "L1 slots allocated for its stores (one per block lane)."},
		{"kvring_model_l1_slots", "gauge", "Committed L1 slots (block lanes) holding its blocks."},
		{"kvring_model_l1_bytes", "gauge", "Bytes of those slots."},
		{"kvring_model_l2_bytes", "gauge",
		 "Bytes of its block lanes on disk (one slot a file); files adopted at a restart count once a lookup promoted them."},
	};
	for (size_t k = 0; k < 8; k++) {
		family(f, fam[k].name, fam[k].type, fam[k].help);
		for (unsigned i = 0; i < N; i++)
			if (used[i])
				model_sample(f, fam[k].name, kvr_ctl_model(c, i), i, v[k][i]);
	}
}

static void ring_label(FILE *f, const char *metric, const struct kvr_ring_ent *e)
{
	fprintf(f, "%s{ring=\"", metric);
	label_value(f, e->name, sizeof(e->name));
	fputs("\"} ", f);
}

static void render_rings(FILE *f, const struct kvr_ctl *c)
{
	unsigned n = atomic_load(&((struct kvr_ctl *)c)->n_rings);
	if (n > c->max_rings)
		n = c->max_rings;
	family(f, "kvring_ring_fill_ratio", "gauge", "Messages in the ring divided by its capacity.");
	for (unsigned i = 0; i < n; i++) {
		struct kvr_ring_shm *r = kvr_ctl_ring_shm(c, i);
		uint32_t cap = r->capacity ? r->capacity : 1;
		uint32_t fill = kvr_mr_ring_fill(r);
		ring_label(f, "kvring_ring_fill_ratio", kvr_ctl_ring_ent(c, i));
		fprintf(f, "%.9g\n", (double)fill / (double)cap);
	}
	family(f, "kvring_ring_producer_blocked_seconds_total", "counter",
	       "Time the ring's producer waited on a full ring (backpressure), counted when each wait ends.");
	for (unsigned i = 0; i < n; i++) {
		ring_label(f, "kvring_ring_producer_blocked_seconds_total", kvr_ctl_ring_ent(c, i));
		seconds(f, atomic_load_explicit(&kvr_ctl_ring_shm(c, i)->full_wait_ns, memory_order_relaxed));
		fputc('\n', f);
	}
	family(f, "kvring_ring_rejected_messages_total", "counter", "Malformed messages the ring's consumer rejected.");
	for (unsigned i = 0; i < n; i++) {
		ring_label(f, "kvring_ring_rejected_messages_total", kvr_ctl_ring_ent(c, i));
		fprintf(f, "%llu\n",
			(unsigned long long)atomic_load_explicit(&kvr_ctl_ring_shm(c, i)->rejected, memory_order_relaxed));
	}
}

/* ---- L2: the disk actors' stats pages ------------------------------------------------- */

/* l2.dirs of the effective config in the control segment (kvringd wrote it with
 * kvr_config_to_json, so it parses): dirs[i] points into *cfg, NULL where there is none. */
static void config_dirs(const struct kvr_ctl *c, struct kvr_config *cfg, const char *dirs[KVR_L2_MAX_DIRS])
{
	char err[256];
	bool ok = kvr_config_parse(kvr_ctl_config_json(c), cfg, err, sizeof(err)) == 0;
	for (unsigned i = 0; i < KVR_L2_MAX_DIRS; i++)
		dirs[i] = ok && i < cfg->l2.n_dirs ? cfg->l2.dirs[i] : NULL;
}

/* `metric{dir="<l2.dirs[N]>"` for disk actor e (its name "disk.N" when the config does not
 * name the dir); the caller adds further labels and the closing brace. */
static void dir_label(FILE *f, const char *metric, const struct kvr_actor_ent *e, const char *const *dirs)
{
	const char *dir = e->index < KVR_L2_MAX_DIRS ? dirs[e->index] : NULL;
	fprintf(f, "%s{dir=\"", metric);
	if (dir)
		label_value(f, dir, strlen(dir));
	else
		label_value(f, e->name, sizeof(e->name));
	fputc('"', f);
}

static bool is_disk(const struct kvr_ctl *c, unsigned i)
{
	return kvr_mr_actor_used(c, i) && kvr_ctl_actor(c, i)->kind == KVR_ACTOR_DISK;
}

/* One family of one stats counter per disk actor. */
static void per_dir(FILE *f, const struct kvr_ctl *c, const char *const *dirs, const char *name, const char *type,
		    const char *help, unsigned stat)
{
	family(f, name, type, help);
	for (unsigned i = 0; i < kvr_mr_n_actors(c); i++)
		if (is_disk(c, i)) {
			dir_label(f, name, kvr_ctl_actor(c, i), dirs);
			fprintf(f, "} %llu\n", (unsigned long long)kvr_mr_stat(c, i, stat));
		}
}

/* A counter family per disk actor with one more label: label="<value>" for each row of
 * rows (ended by a NULL value), in that order. */
struct per_dir_row {
	const char *value;
	unsigned stat;
};

static void per_dir_by(FILE *f, const struct kvr_ctl *c, const char *const *dirs, const char *name, const char *help,
		       const char *label, const struct per_dir_row *rows)
{
	family(f, name, "counter", help);
	for (unsigned i = 0; i < kvr_mr_n_actors(c); i++)
		for (const struct per_dir_row *r = rows; is_disk(c, i) && r->value; r++) {
			dir_label(f, name, kvr_ctl_actor(c, i), dirs);
			fprintf(f, ",%s=\"%s\"} %llu\n", label, r->value, (unsigned long long)kvr_mr_stat(c, i, r->stat));
		}
}

static void render_l2(FILE *f, const struct kvr_ctl *c)
{
	bool any = false;
	for (unsigned i = 0; i < kvr_mr_n_actors(c) && !any; i++)
		any = is_disk(c, i);
	if (!any)
		return; /* no l2.dirs: no per-dir series */
	struct kvr_config cfg;
	const char *dirs[KVR_L2_MAX_DIRS];
	config_dirs(c, &cfg, dirs);

	per_dir(f, c, dirs, "kvring_l2_bytes", "gauge",
		"Bytes of the complete block files the disk actor serves (files x file size; header and padding "
		"included).", KVR_STAT_DK_BYTES);
	per_dir(f, c, dirs, "kvring_l2_files", "gauge", "Complete block files the disk actor serves.",
		KVR_STAT_DK_FILES);
	per_dir(f, c, dirs, "kvring_l2_capacity_bytes", "gauge",
		"The disk actor's byte cap: l2.capacity_bytes divided by the number of l2.dirs.",
		KVR_STAT_DK_CAPACITY_BYTES);

	static const char adopt[] = "kvring_l2_adoption_files_total";
	family(f, adopt, "counter",
	       "Directory entries the disk actor found at start, by result: adopted, or the reason it was not.");
	for (unsigned i = 0; i < kvr_mr_n_actors(c); i++) {
		if (!is_disk(c, i))
			continue;
		const struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
		dir_label(f, adopt, e, dirs);
		fprintf(f, ",result=\"adopted\"} %llu\n", (unsigned long long)kvr_mr_stat(c, i, KVR_STAT_DK_ADOPTED));
		for (unsigned r = 1; r < KVR_STAT_DK_REASON_MAX; r++) {
			if (!strcmp(kvr_stat_dk_reason_name(r), "payload_checksum"))
				continue; /* adoption reads headers only: a read finds these */
			dir_label(f, adopt, e, dirs);
			fprintf(f, ",result=\"%s\"} %llu\n", kvr_stat_dk_reason_name(r),
				(unsigned long long)kvr_mr_stat(c, i, kvr_stat_dk_rejected(r)));
		}
	}
	per_dir(f, c, dirs, "kvring_l2_evicted_files_total", "counter",
		"Files the disk actor deleted to make room for a write under its cap.", KVR_STAT_DK_EVICTED);

	static const struct per_dir_row rf[] = {
		{"damaged", KVR_STAT_DK_READS_DAMAGED},
		{"vanished", KVR_STAT_DK_READS_VANISHED},
		{"io_error", KVR_STAT_DK_READS_IO_ERROR},
		{NULL, 0},
	};
	per_dir_by(f, c, dirs, "kvring_l2_read_failures_total",
		   "Reads of indexed files that failed (a miss; the file is no longer served), by reason.", "reason", rf);
	static const struct per_dir_row xf[] = {
		{"joined", KVR_STAT_DK_XFER_JOINED},
		{"registered", KVR_STAT_DK_XFER_REGISTERED},
		{"unregistered", KVR_STAT_DK_XFER_UNREGISTERED},
		{NULL, 0},
	};
	per_dir_by(f, c, dirs, "kvring_l2_transfers_total",
		   "Payload transfers of the disk actor's reads and writes, by how: joined (header and payload in one "
		   "vectored transfer, one device request per file: O_DIRECT with L1 in huge pages), registered or "
		   "unregistered (the payload alone, through a registered buffer or not; the header separately).",
		   "how", xf);
	per_dir(f, c, dirs, "kvring_l2_read_only_refused_writes_total", "counter",
		"l2.read_only: L2 writes the disk actor refused (-EROFS, nothing written).",
		KVR_STAT_DK_WRITES_REFUSED);
	static const struct per_dir_row kept[] = {
		{"adoption", KVR_STAT_DK_LEFT_IN_PLACE},
		{"read", KVR_STAT_DK_BAD_KEPT},
		{NULL, 0},
	};
	per_dir_by(f, c, dirs, "kvring_l2_read_only_kept_files_total",
		   "l2.read_only: files not served but left on disk, by when they were found: at adoption (tmp, bad, "
		   "other lanes, over the cap) or by a read (bad or unreadable).",
		   "found", kept);
}

/* ---- the remote tier: the remote actor's stats page, and the lookup's view of it ------- */

/* The lookup actor's side, named as kvring_l2_blocks_total is: block lanes. */
static void remote_lookup_side(FILE *f, const struct kvr_ctl *c)
{
	family(f, "kvring_remote_blocks_total", "counter",
	       "Block lanes moved to and from the remote tier by result, as the lookup actor counted them: read = "
	       "promoted into L1 for a lookup (failed: a miss, a bad value, no node, a timeout), write = handed to the "
	       "remote actor after a commit (skipped: its ring was full).");
	static const struct {
		const char *labels;
		unsigned stat;
	} lk[] = {
		{"op=\"read\",result=\"ok\"", KVR_STAT_LK_RM_READS},
		{"op=\"read\",result=\"failed\"", KVR_STAT_LK_RM_READ_FAILS},
		{"op=\"write\",result=\"sent\"", KVR_STAT_LK_RM_WRITES},
		{"op=\"write\",result=\"skipped\"", KVR_STAT_LK_RM_WRITES_SKIPPED},
	};
	for (size_t i = 0; i < sizeof(lk) / sizeof(lk[0]); i++)
		fprintf(f, "kvring_remote_blocks_total{%s} %llu\n", lk[i].labels,
			(unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_LOOKUP, lk[i].stat));
}

/* The remote actor's own counters and gauges, one family each. */
static void remote_actor_stats(FILE *f, const struct kvr_ctl *c)
{
	static const struct {
		const char *name, *type, *help;
		unsigned stat;
	} rm[] = {
		{"kvring_remote_reads_total", "counter", "Promotion reads the remote actor was asked for.",
		 KVR_STAT_RM_READS},
		{"kvring_remote_hits_total", "counter", "Promotion reads whose value was found, verified and copied into "
		 "its L1 slot.", KVR_STAT_RM_HITS},
		{"kvring_remote_misses_total", "counter", "Promotion reads that found a lane of the block missing in the "
		 "cluster.", KVR_STAT_RM_MISSES},
		{"kvring_remote_bad_values_total", "counter", "Promotion reads whose value failed its check (damaged, "
		 "truncated, another model's): a miss, never served.", KVR_STAT_RM_BAD_VALUES},
		{"kvring_remote_read_errors_total", "counter", "Promotion reads that failed otherwise (no node, "
		 "connection, timeout, stale slot).", KVR_STAT_RM_READ_ERRORS},
		{"kvring_remote_writes_total", "counter", "Write-through SETs the cluster acknowledged.",
		 KVR_STAT_RM_WRITES},
		{"kvring_remote_write_errors_total", "counter", "Write-through SETs that failed (error reply, connection, "
		 "timeout, no node).", KVR_STAT_RM_WRITE_ERRORS},
		{"kvring_remote_stale_writes_total", "counter", "Write-throughs not sent: the L1 slot changed before its "
		 "copy.", KVR_STAT_RM_WRITES_STALE},
		{"kvring_remote_moved_redirects_total", "counter", "MOVED redirects followed (each refreshes the slot "
		 "map).", KVR_STAT_RM_MOVED},
		{"kvring_remote_ask_redirects_total", "counter", "ASK redirects followed.", KVR_STAT_RM_ASK},
		{"kvring_remote_timeouts_total", "counter", "Connections closed for a request older than "
		 "remote.timeout_ms.", KVR_STAT_RM_TIMEOUTS},
		{"kvring_remote_connection_errors_total", "counter", "Connects that failed and connections that dropped.",
		 KVR_STAT_RM_CONN_ERRORS},
		{"kvring_remote_reply_errors_total", "counter", "Error replies other than MOVED and ASK (CLUSTERDOWN, OOM, "
		 "...).", KVR_STAT_RM_REPLY_ERRORS},
		{"kvring_remote_slot_map_refreshes_total", "counter", "Slot maps taken from CLUSTER SLOTS.",
		 KVR_STAT_RM_REFRESHES},
		{"kvring_remote_nodes", "gauge", "Masters in the remote actor's slot map.", KVR_STAT_RM_NODES},
		{"kvring_remote_nodes_up", "gauge", "Masters of the slot map the remote actor is connected to.",
		 KVR_STAT_RM_NODES_UP},
		{"kvring_remote_inflight", "gauge", "Requests sent to the cluster and not answered yet.",
		 KVR_STAT_RM_INFLIGHT},
		{"kvring_remote_slots_covered", "gauge", "Hash slots of the 16384 that have a master in the slot map.",
		 KVR_STAT_RM_SLOTS_COVERED},
	};
	for (size_t i = 0; i < sizeof(rm) / sizeof(rm[0]); i++) {
		family(f, rm[i].name, rm[i].type, rm[i].help);
		fprintf(f, "%s %llu\n", rm[i].name, (unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_REMOTE, rm[i].stat));
	}
}

/* The remote actor's payload bytes by direction and its GET and SET latencies. */
static void remote_actor_traffic(FILE *f, const struct kvr_ctl *c)
{
	family(f, "kvring_remote_bytes_total", "counter",
	       "Value payload bytes moved by the remote actor: in = copied from the cluster into L1 slots, out = sent in "
	       "acknowledged SETs.");
	fprintf(f, "kvring_remote_bytes_total{direction=\"in\"} %llu\n",
		(unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_REMOTE, KVR_STAT_RM_BYTES_IN));
	fprintf(f, "kvring_remote_bytes_total{direction=\"out\"} %llu\n",
		(unsigned long long)kvr_mr_kind_sum(c, KVR_ACTOR_REMOTE, KVR_STAT_RM_BYTES_OUT));
	histogram(f, c, KIND(KVR_ACTOR_REMOTE), KVR_STAT_RM_HIST_GET, "kvring_remote_get_seconds",
		  "Latency of remote promotion reads that hit: request taken by the remote actor to value verified and "
		  "copied into L1.");
	histogram(f, c, KIND(KVR_ACTOR_REMOTE), KVR_STAT_RM_HIST_SET, "kvring_remote_set_seconds",
		  "Latency of remote write-throughs the cluster acknowledged: request taken by the remote actor to the "
		  "SET's acknowledgement.");
}

/*
 * One remote actor at most ("remote", when the config has remote.cluster); the series are
 * sums over actors of the kind all the same, unlabelled, like the instance-wide ones. Its
 * gauges are the running actor's last word (kept while it is down). Nothing of this section
 * is written without a remote actor.
 */
static void render_remote(FILE *f, const struct kvr_ctl *c)
{
	bool any = false;
	for (unsigned i = 0; i < kvr_mr_n_actors(c) && !any; i++)
		any = kvr_mr_actor_used(c, i) && kvr_ctl_actor(c, i)->kind == KVR_ACTOR_REMOTE;
	if (!any)
		return;
	remote_lookup_side(f, c);
	remote_actor_stats(f, c);
	remote_actor_traffic(f, c);
}

char *sup_metrics_render(struct sup_metrics_view *v, size_t *ret_len)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	render_instance(f, v->ctl);
	render_actors(f, v->ctl);
	render_lookup(f, v);
	render_transfer(f, v->ctl);
	render_l2(f, v->ctl);
	render_remote(f, v->ctl);
	if (v->slots)
		render_l1(f, v->slots);
	render_models(f, v->ctl, v->slots);
	render_rings(f, v->ctl);
	if (ferror(f)) {
		fclose(f);
		free(buf);
		return NULL;
	}
	if (fclose(f)) {
		free(buf);
		return NULL;
	}
	*ret_len = len;
	return buf;
}

/* ---- HTTP ---------------------------------------------------------------------------- */

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, const char *type, char *body, size_t len,
			       enum MHD_ResponseMemoryMode mode, const char *allow)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
	if (!r) {
		if (mode == MHD_RESPMEM_MUST_FREE)
			free(body);
		return MHD_NO;
	}
	enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (ok == MHD_YES && allow)
		ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	/* a snapshot: never served from a cache */
	if (ok == MHD_YES && code == MHD_HTTP_OK)
		ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (ok == MHD_YES)
		ok = MHD_queue_response(conn, code, r);
	MHD_destroy_response(r);
	return ok;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned code, const char *text, const char *allow)
{
	return respond(conn, code, CONTENT_TEXT, (char *)text, strlen(text), MHD_RESPMEM_PERSISTENT, allow);
}

enum page { PAGE_METRICS, PAGE_STATUS, PAGE_HTML };

/* The body of a page, or NULL (out of memory). /status and /: the document is collected
 * under the lock and printed after it. */
static char *render_page(struct sup_metrics *m, enum page p, size_t *ret_len)
{
	char *body = NULL;
	pthread_mutex_lock(&m->lock);
	if (p == PAGE_METRICS) {
		body = sup_metrics_render(&m->view, ret_len);
		pthread_mutex_unlock(&m->lock);
		return body;
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	cJSON *doc = sup_status_collect(&m->view, (uint64_t)now.tv_sec * NS_PER_S + (uint64_t)now.tv_nsec);
	pthread_mutex_unlock(&m->lock);
	if (!doc)
		return NULL;
	if (p == PAGE_HTML) {
		body = sup_status_html(doc, ret_len);
	} else if ((body = cJSON_Print(doc))) {
		size_t n = strlen(body);
		char *nl = realloc(body, n + 2); /* a trailing newline, as curl users expect */
		if (nl) {
			body = nl;
			memcpy(body + n, "\n", 2);
			n++;
		}
		*ret_len = n;
	}
	cJSON_Delete(doc);
	return body;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				  const char *version, const char *upload_data, size_t *upload_data_size, void **req_cls)
{
	static const struct {
		const char *path, *type;
		enum page page;
	} pages[] = {
		{"/metrics", CONTENT_TYPE, PAGE_METRICS},
		{"/status", CONTENT_JSON, PAGE_STATUS},
		{"/", CONTENT_HTML, PAGE_HTML},
	};
	struct sup_metrics *m = cls;
	(void)version;
	(void)upload_data;
	(void)upload_data_size;
	(void)req_cls;
	size_t i = 0;
	while (i < sizeof(pages) / sizeof(pages[0]) && strcmp(url, pages[i].path) != 0)
		i++;
	if (i == sizeof(pages) / sizeof(pages[0]))
		return respond_text(conn, MHD_HTTP_NOT_FOUND, "not found: kvringd serves /, /status and /metrics\n", NULL);
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: use GET\n", "GET, HEAD");
	size_t len = 0;
	char *body = render_page(m, pages[i].page, &len);
	if (!body)
		return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", NULL);
	return respond(conn, MHD_HTTP_OK, pages[i].type, body, len, MHD_RESPMEM_MUST_FREE, NULL);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	char line[256];
	vsnprintf(line, sizeof(line), fmt, ap);
	line[strcspn(line, "\n")] = 0;
	/* debug: what MHD reports is mostly about clients (resets, bad requests); a failed
	 * start is logged by sup_metrics_start() itself */
	kvr_debug("metrics: %s", line);
}

/* ---- lifecycle ----------------------------------------------------------------------- */

/* Split "host:port" / "[v6]:port" into host and port. */
static int split_listen(const char *listen, char *host, size_t hostlen, char *port, size_t portlen)
{
	const char *colon = strrchr(listen, ':');
	if (!colon || (size_t)snprintf(port, portlen, "%s", colon + 1) >= portlen)
		return -EINVAL;
	const char *h = listen;
	size_t n = (size_t)(colon - listen);
	if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
		h++;
		n -= 2;
	}
	if (n == 0 || n >= hostlen)
		return -EINVAL;
	memcpy(host, h, n);
	host[n] = 0;
	return 0;
}

int sup_metrics_open(struct sup *s, char *err, size_t errlen)
{
	if (!s->cfg.metrics.enabled || s->metrics)
		return 0;
	const char *where = s->cfg.metrics.listen;
	char host[64], port[8];
	if (split_listen(where, host, sizeof(host), port, sizeof(port))) {
		snprintf(err, errlen, "cannot listen on %s: not host:port", where);
		return -EINVAL;
	}
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	int gai = getaddrinfo(host, port, &hints, &res);
	if (gai) {
		snprintf(err, errlen, "cannot listen on %s: %s", where, gai_strerror(gai));
		return -EADDRNOTAVAIL;
	}
	int fd = -1, rc = -EADDRNOTAVAIL;
	for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
		int one = 1;
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
		    bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0)
			break;
		if (ai == res)
			rc = -errno; /* report the first address's reason */
		if (fd >= 0)
			(void)close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", where, strerror(-rc));
		return rc;
	}
	struct sup_metrics *m = calloc(1, sizeof(*m));
	if (!m) {
		(void)close(fd);
		snprintf(err, errlen, "cannot listen on %s: %s", where, strerror(ENOMEM));
		return -ENOMEM;
	}
	m->fd = fd;
	pthread_mutex_init(&m->lock, NULL);
	snprintf(m->listen, sizeof(m->listen), "%s", where);
	s->metrics = m;
	return 0;
}

int sup_metrics_start(struct sup *s)
{
	struct sup_metrics *m = s->metrics;
	if (!m || m->d)
		return 0;
	pthread_mutex_lock(&m->lock);
	m->view = (struct sup_metrics_view){.ctl = s->ctl, .slots = s->slots,
					    .engines = m->engines, .n_engines = m->n_engines};
	pthread_mutex_unlock(&m->lock);
	int fd = fcntl(m->fd, F_DUPFD_CLOEXEC, 3); /* MHD closes its copy when it stops */
	if (fd < 0) {
		kvr_err("metrics: dup of the listening socket: %s", strerror(errno));
		return -errno;
	}
	/* MHD's thread inherits our signal mask: every signal stays with the loop's signalfd */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, 0, NULL, NULL,
				on_request, m, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET,
				(MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned)32, MHD_OPTION_CONNECTION_TIMEOUT,
				(unsigned)10, MHD_OPTION_END);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!m->d) {
		/* not closed: MHD may have closed it already (a failed start ends kvringd anyway) */
		kvr_err("metrics: cannot start the HTTP server on %s", m->listen);
		return -EIO;
	}
	kvr_info("metrics on http://%s/metrics (status page: http://%s/)", m->listen, m->listen);
	return 0;
}

void sup_metrics_close(struct sup *s)
{
	struct sup_metrics *m = s->metrics;
	if (!m)
		return;
	if (m->d)
		MHD_stop_daemon(m->d);
	if (m->fd >= 0)
		(void)close(m->fd);
	pthread_mutex_destroy(&m->lock);
	free(m);
	s->metrics = NULL;
}

void sup_metrics_pause(struct sup *s)
{
	if (s->metrics)
		pthread_mutex_lock(&s->metrics->lock);
}

void sup_metrics_resume(struct sup *s)
{
	if (s->metrics)
		pthread_mutex_unlock(&s->metrics->lock);
}

void sup_metrics_engines(struct sup *s, const struct kvr_inspect_engine *t, unsigned n)
{
	struct sup_metrics *m = s->metrics;
	if (!m)
		return;
	if (n > KVR_CTL_MAX_ENGINES)
		n = KVR_CTL_MAX_ENGINES;
	pthread_mutex_lock(&m->lock);
	memcpy(m->engines, t, n * sizeof(t[0]));
	m->n_engines = n;
	m->view.n_engines = n;
	pthread_mutex_unlock(&m->lock);
}

void sup_metrics_bind(struct sup *s)
{
	struct sup_metrics *m = s->metrics;
	if (!m)
		return;
	pthread_mutex_lock(&m->lock);
	m->view.slots = s->slots;
	pthread_mutex_unlock(&m->lock);
}
