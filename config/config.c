/* config: the key table (one row per field of struct kvr_config, with its section, default, range and doc), its
 * defaults and how a key's values print. parse.c, check.c and emit.c all work from it (config_table.h). */
#include "config_table.h"

#include <inttypes.h>
#include <stdio.h>

#include "kvr_ctl.h"
#include "kvr_geometry.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)
#define TiB (UINT64_C(1) << 40)
#define PiB (UINT64_C(1) << 50)
/* Byte sizes stop at 1 PiB: every JSON integer up to it is exact in a double (cJSON's number type). */
#define SIZE_MAX_BYTES PiB

/* The field named f, its type checked at compile time (a mismatch has no _Generic association). */
#define FLD(f, T) .off = offsetof(struct kvr_config, f) + _Generic(((struct kvr_config *)0)->f, T: 0), \
	.size = sizeof(((struct kvr_config *)0)->f)
#define U32(p, f, d, lo, hi, u, dc) \
	{ .path = p, .kind = K_U32, FLD(f, uint32_t), .def = d, .min = lo, .max = hi, .unit = u, .doc = dc }
#define SIZE(p, f, d, lo, dc) \
	{ .path = p, .kind = K_SIZE, FLD(f, uint64_t), .def = d, .min = lo, .max = SIZE_MAX_BYTES, .unit = "bytes", \
	  .doc = dc }
#define BOOL(p, f, d, dc) { .path = p, .kind = K_BOOL, FLD(f, bool), .def = d, .min = 0, .max = 1, .doc = dc }
#define STR(p, f, fl, d, dc) { .path = p, .kind = K_STR, .flags = fl, FLD(f, char *), .def_str = d, .doc = dc }
#define ENUM(p, f, d, vals, dc) \
	{ .path = p, .kind = K_ENUM, FLD(f, char *), .def_str = d, .values = vals, .doc = dc }
#define MODE(p, f, d, hi, dc) \
	{ .path = p, .kind = K_MODE, FLD(f, uint32_t), .def = d, .min = 0, .max = hi, .unit = "octal", .doc = dc }
/* A K_PATHS key: a JSON array of strings into char[max_items][size] with a uint32_t count. */
#define STRINGS(p, f, n, fl, dc) \
	{ .path = p, .kind = K_PATHS, .flags = fl, .off = offsetof(struct kvr_config, f), \
	  .size = sizeof(((struct kvr_config *)0)->f[0]), .count_off = offsetof(struct kvr_config, n), \
	  .max_items = ARRAY_SIZE(((struct kvr_config *)0)->f) + _Generic(((struct kvr_config *)0)->n, uint32_t: 0), \
	  .doc = dc }
#define PATHS(p, f, n, dc) STRINGS(p, f, n, F_ABS, dc)   /* absolute paths */
#define ADDRS(p, f, n, dc) STRINGS(p, f, n, F_ADDR, dc)  /* host:port addresses */

/* Each value at the index of its enum (config_table.h, kvr_config.h, kvr_log.h): cfg_derive() turns a string
 * into it. */
static const char *const log_level_values[] = { [KVR_LOG_ERROR] = "error", [KVR_LOG_WARN] = "warn",
						[KVR_LOG_INFO] = "info", [KVR_LOG_DEBUG] = "debug", NULL };
static const char *const attention_values[] = { [CFG_ATTN_MHA] = "mha", [CFG_ATTN_MLA] = "mla", NULL };
static const char *const eviction_values[] = { [KVR_CFG_EVICT_LRU] = "lru", [KVR_CFG_EVICT_S3FIFO] = "s3fifo", NULL };
static const char *const kv_layout_values[] = { [CFG_KV_SPLIT] = "kv-split", [CFG_KV_FUSED] = "kv-fused", NULL };
static const char *const prefault_values[] = { [CFG_PREFAULT_BACKGROUND] = "background", [CFG_PREFAULT_OFF] = "off",
						NULL };
static const char *const l2_mode_values[] = { [CFG_L2_WRITE_THROUGH] = "write-through",
					      [CFG_L2_WRITE_BACK] = "write-back", NULL };
static const char *const durability_values[] = { [KVR_CFG_DUR_NONE] = "none", [KVR_CFG_DUR_BLOCK] = "block",
						 [KVR_CFG_DUR_BATCH] = "batch", NULL };
static const char *const remote_mode_values[] = { "write-through", NULL }; /* write-back: not yet */

const struct kvr_section cfg_sections[] = {
	{ "instance", "The instance: where workers attach, how many may, and logging." },
	{ "rings", "The single-producer single-consumer shared-memory rings between actors and clients." },
	{ "supervisor", "How kvringd starts, watches, restarts and stops its actors." },
	{ "model", "The model whose KV cache is stored: its geometry sizes blocks and goes into the key namespace." },
	{ "l1", "L1: the host-memory arena of block slots." },
	{ "staging", "Staging buffers per worker, split into a load pool and a store pool." },
	{ "dcp", "Decode context parallelism: the gather actor that assembles a DCP group's shards into canonical blocks." },
	{ "l2", "L2: the disk tier, one file per block." },
	{ "remote", "The shared tier across nodes: a Redis Cluster (or Valkey) that every instance of the same model "
		    "writes its blocks to and promotes misses from (docs/cluster.md)." },
	{ "metrics", "Prometheus text format on /metrics over HTTP." },
	{ "timeouts", "Every deadline of the data path, in one place; kvringd checks their order at load "
		      "(reply_ms < alloc_wait_ms < lookup_call_ms, l2_answer_ms < lookup_call_ms). A client's own "
		      "timeout (kvr_attach_opts.timeout_ms, default 10000) should exceed alloc_wait_ms + l2_answer_ms." },
};

/* THE key table: one row per field of struct kvr_config, grouped by section in cfg_sections[] order. */
const struct kvr_key cfg_keys[] = {
	STR("instance.socket", instance.socket, F_ABS, KVR_CONFIG_DEFAULT_SOCKET,
	    "Unix socket that workers attach to (absolute path)"),
	MODE("instance.socket_mode", instance.socket_mode, 0600, 0777, "permission bits of the socket"),
	U32("instance.max_workers", instance.max_workers, 8, 1, KVR_CTL_MAX_WORKERS, "workers",
	    "attachable worker slots (each gets one loader and one storer)"),
	U32("instance.max_schedulers", instance.max_schedulers, 4, 0, KVR_CTL_MAX_SCHEDULERS, "schedulers",
	    "attachable scheduler slots: an engine's scheduler attaches without KV memory to look prefixes up "
	    "and lease them for its workers (libkvring kvr_attach_scheduler)"),
	ENUM("instance.log_level", instance.log_level, "info", log_level_values, "least severe level that is logged"),
	STR("instance.actor_dir", instance.actor_dir, F_ABS_OR_EMPTY, "",
	    "directory of the actor executables; \"\" = the built-in location"),

	U32("rings.capacity", rings.capacity, 1024, 2, 1u << 20, "messages", "messages per ring (a power of two)"),
	U32("rings.spin_ns", rings.spin_ns, 10000, 0, 1000000, "ns",
	    "bounded spin before a waiter sleeps on its futex"),

	U32("supervisor.ready_timeout_ms", supervisor.ready_timeout_ms, 5000, 100, 600000, "ms",
	    "an actor not ready by then is killed and counts as a death; at least 100: an actor execs, maps the "
	    "segments and attaches its rings before it can be ready (L2 adoption too)"),
	U32("supervisor.stable_after_ms", supervisor.stable_after_ms, 1000, 0, 3600000, "ms",
	    "an actor ready this long is restarted at once when it dies (backoff reset)"),
	U32("supervisor.restart_backoff_initial_ms", supervisor.restart_backoff_initial_ms, 100, 1, 600000, "ms",
	    "first restart delay; doubles per death up to the maximum"),
	U32("supervisor.restart_backoff_max_ms", supervisor.restart_backoff_max_ms, 5000, 1, 600000, "ms",
	    "longest restart delay"),
	U32("supervisor.crash_loop_window_s", supervisor.crash_loop_window_s, 30, 1, 86400, "s",
	    "window in which deaths are counted"),
	U32("supervisor.crash_loop_max_deaths", supervisor.crash_loop_max_deaths, 5, 1, 1000, "deaths",
	    "this many deaths within the window give up on the actor"),
	U32("supervisor.health_interval_ms", supervisor.health_interval_ms, 1000, 10, 600000, "ms",
	    "period of the health ping to every actor"),
	U32("supervisor.drain_timeout_ms", supervisor.drain_timeout_ms, 30000, 0, 3600000, "ms",
	    "on SIGTERM, how long in-flight work may take to finish"),
	U32("supervisor.attach_timeout_ms", supervisor.attach_timeout_ms, 5000, 10, 600000, "ms",
	    "a connection to the socket that has not attached this long after it was accepted (or after its "
	    "last DETACH) is closed; with 128 connections open, the oldest such is closed to admit a new one"),

	ENUM("model.preset", model.preset, "", NULL,
	     "model preset that fills the geometry (see Model presets); \"\" = give the geometry below, or none: "
	     "without preset and geometry the instance has no model and lays L1 out for the geometry of the first "
	     "worker that attaches"),
	STR("model.model_id", model.model_id, 0, "",
	    "model identity in the key namespace; \"\" = the preset's Hugging Face id"),
	U32("model.layers", model.layers, 0, 0, 1024, "layers", "layers with a KV cache; 0 = from the preset"),
	U32("model.kv_heads", model.kv_heads, 0, 0, 1024, "heads",
	    "KV heads in total over all TP ranks; 0 = from the preset"),
	U32("model.head_dim", model.head_dim, 0, 0, 4096, "elements",
	    "elements per head (MLA: latent plus rope width); 0 = from the preset"),
	U32("model.dtype_bytes", model.dtype_bytes, 0, 0, 4, "bytes",
	    "bytes per KV element: 1 (fp8), 2 (bf16/fp16) or 4 (fp32); 0 = from the preset"),
	U32("model.block_tokens", model.block_tokens, 128, 1, 4096, "tokens", "tokens per block"),
	U32("model.tp_size", model.tp_size, 1, 1, KVR_MAX_TP, "ranks", "tensor-parallel ranks of a worker group"),
	ENUM("model.attention", model.attention, "mha", attention_values,
	     "mha (MHA and GQA: K and V per head, split over TP ranks) or mla (one latent, same on every rank)"),
	ENUM("model.kv_layout", model.kv_layout, "kv-split", kv_layout_values,
	     "mha: kv-split = per layer a K page then a V page (vLLM's GPU backends); kv-fused = one page per "
	     "layer holding K and V (vLLM's CPU backend); part of the key namespace"),
	STR("model.cache_salt", model.cache_salt, 0, "",
	    "mixed into the key namespace: different salts share no block"),

	SIZE("l1.capacity_bytes", l1.capacity_bytes, 1 * GiB, 0,
	     "arena bytes; 0 = derive from l1.workload_prompts x l1.workload_tokens"),
	SIZE("l1.slot_bytes", l1.slot_bytes, 0, 0,
	     "bytes of one L1 slot (one block lane, rounded up to 4 KiB); 0 = the lane of the model section's "
	     "block, or without one of the first worker's: without a model section engines of other models share "
	     "the slots when their lanes fit (docs/engines.md)"),
	U32("l1.workload_prompts", l1.workload_prompts, 0, 0, 10000000, "prompts",
	    "prompts to hold when the capacity is derived"),
	U32("l1.workload_tokens", l1.workload_tokens, 0, 0, 100000000, "tokens",
	    "tokens per prompt when the capacity is derived"),
	BOOL("l1.huge_pages", l1.huge_pages, true, "try huge pages (MFD_HUGETLB) for the arena, else normal pages"),
	ENUM("l1.prefault", l1.prefault, "background", prefault_values,
	     "background: a kvringd thread faults the arena in after start (off the ready path; skipped, and "
	     "logged, when the arena exceeds the memory available); off: pages are allocated on first use"),
	ENUM("l1.eviction", l1.eviction, "s3fifo", eviction_values, "eviction policy (s3fifo resists scans)"),
	U32("l1.max_leases", l1.max_leases, 4096, 1, 1u << 20, "leases",
	    "lookup leases held at once; a scheduler's lease beyond them is refused (-ENOSPC) and its prefix "
	    "not pinned"),

	SIZE("staging.ceiling_bytes", staging.ceiling_bytes, 256 * MiB, 4 * KiB,
	     "staging bytes per worker, both pools"),
	U32("staging.load_percent", staging.load_percent, 50, 1, 99, "%", "share of the ceiling for the load pool"),
	SIZE("staging.buffer_bytes", staging.buffer_bytes, 0, 0, "bytes of one staging buffer (lease); 0 = one block"),

	U32("dcp.store_timeout_ms", dcp.store_timeout_ms, 10000, 10, 600000, "ms",
	    "how long a DCP rank's store waits for the same store from every other rank of its group; then it "
	    "fails and nothing of it is stored (a canonical block needs every rank's shard)"),

	PATHS("l2.dirs", l2.dirs, l2.n_dirs, "directories of the disk tier, one disk actor each; none = no L2"),
	SIZE("l2.capacity_bytes", l2.capacity_bytes, 0, 0,
	     "byte cap over all dirs, oldest evicted first; must be > 0 when there are dirs"),
	ENUM("l2.mode", l2.mode, "write-through", l2_mode_values,
	     "write-through: every block written to L2 once committed in L1; write-back: written only "
	     "when L1 must make room (the least recently used first)"),
	ENUM("l2.durability", l2.durability, "batch", durability_values,
	     "fsync: none, every block, or in batches"),
	U32("l2.queue_depth", l2.queue_depth, 32, 1, 4096, "I/Os", "io_uring queue depth of each disk actor"),
	BOOL("l2.read_only", l2.read_only, false,
	     "serve the blocks already on disk and never change the disk: no writes, deletions or renames; "
	     "stores are refused (-EROFS); l2.mode and l2.durability have no effect (see docs/l2.md)"),

	ADDRS("remote.cluster", remote.cluster, remote.n_cluster,
	      "host:port of one or more cluster nodes to discover the cluster from (CLUSTER SLOTS); none = no "
	      "shared tier"),
	ENUM("remote.mode", remote.mode, "write-through", remote_mode_values,
	     "write-through: every block lane sent to the cluster once committed in L1 (the only mode so far)"),
	U32("remote.timeout_ms", remote.timeout_ms, 1000, 10, 600000, "ms",
	    "a request to the cluster (connect, GET, SET) unanswered this long fails: a read is a miss, a write "
	    "is dropped and counted"),
	U32("remote.max_inflight", remote.max_inflight, 64, 1, 4096, "requests",
	    "requests sent to the cluster and not answered yet, over all nodes; more wait in the remote actor's "
	    "ring (backpressure)"),
	U32("remote.ttl_s", remote.ttl_s, 0, 0, 365u * 86400u, "s",
	    "expiry of every block written (SET .. EX); 0 = none: the cluster's maxmemory policy evicts"),
	STR("remote.user", remote.user, 0, "", "ACL user to AUTH as (empty: the default user)"),
	STR("remote.password", remote.password, 0, "", "password to AUTH with (empty: no AUTH)"),
	BOOL("remote.tls", remote.tls, false, "TLS to the cluster (not built: true is refused)"),

	BOOL("metrics.enabled", metrics.enabled, false, "serve /metrics"),
	STR("metrics.listen", metrics.listen, 0, "127.0.0.1:9464",
	    "host:port to listen on, IPv6 host in brackets (checked when enabled)"),

	U32("timeouts.reply_ms", timeouts.reply_ms, 2000, 10, 600000, "ms",
	    "an actor whose reply ring stays full this long drops the reply and counts it (its reader stopped "
	    "reading): one stuck client cannot stall an actor for longer"),
	U32("timeouts.alloc_wait_ms", timeouts.alloc_wait_ms, 5000, 10, 600000, "ms",
	    "a store's ALLOC, or an L2 promotion, waits this long for L1 room held by writes to L2 or by other "
	    "stores' slots still being written (WRITING: evictable once committed); then it is answered with "
	    "what there is (no room)"),
	U32("timeouts.l2_answer_ms", timeouts.l2_answer_ms, 8000, 100, 600000, "ms",
	    "an L2 read or write the disk actor has not answered this long is lost: the read is given up (a "
	    "miss), the write sent again"),
	U32("timeouts.lookup_call_ms", timeouts.lookup_call_ms, 10000, 100, 600000, "ms",
	    "a storer waits this long for the lookup actor's answer to an ALLOC, COMMIT or RESET; then the "
	    "store fails"),
};

/* The cross-key checks done after parsing, in the order cfg_check_config() makes them (for the docs). */
const char *const cfg_checks_doc[] = {
	"`instance.socket_mode` has the owner's write bit (0200): only the instance owner's uid may attach, and "
	"connecting to a Unix socket needs write permission.",
	"`rings.capacity` is a power of two.",
	"`timeouts.reply_ms` < `timeouts.alloc_wait_ms` < `timeouts.lookup_call_ms`, and `timeouts.l2_answer_ms` < "
	"`timeouts.lookup_call_ms`: each wait ends before the one waiting on it.",
	"`supervisor.restart_backoff_initial_ms` <= `supervisor.restart_backoff_max_ms`.",
	"`model.preset` \"\" and none of `model.layers`, `model.kv_heads`, `model.head_dim`, `model.dtype_bytes` "
	"given: the instance has no model (the default) and lays L1 out for the first worker that attaches; every "
	"engine must then name its model (the connector sends its weights' namespace), and `model.block_tokens`, "
	"`model.tp_size`, `model.attention` and `model.kv_layout` other than their defaults are refused (they "
	"would describe a model there is none of). `model.preset` \"\" and any of the four given: all are required "
	"(> 0), `model.dtype_bytes` is 1, 2 or 4, and `model.model_id` is required (not \"\": it keeps two models "
	"of one geometry apart in the key namespace). With a preset, each of them is 0 (taken from the preset) or "
	"equal to the preset's value, "
	"`model.attention` when given equals the preset's (else it is taken from the preset), and `model.model_id` "
	"\"\" becomes the preset's Hugging Face id.",
	"`model.tp_size` divides `model.kv_heads`, or is a multiple of it (each rank then holds one replicated head, "
	"as vLLM does), unless `model.attention` is \"mla\" or there is no model.",
	"`model.tp_size` <= `instance.max_workers`: every rank of a TP group attaches as one worker (no model: "
	"checked against the first worker's TP size when it attaches).",
	"`l1.capacity_bytes` not 0: `l1.workload_prompts` and `l1.workload_tokens` are 0 (they would be ignored).",
	"`l1.capacity_bytes` 0: `l1.workload_prompts` and `l1.workload_tokens` are required (> 0).",
	"Each staging pool (load: `staging.ceiling_bytes` x `staging.load_percent` / 100, store: the rest) holds at "
	"least one buffer: `staging.buffer_bytes`, or when that is 0 one block of one rank "
	"(layers x KV heads per rank x head_dim x dtype_bytes x block_tokens, x 2 for K and V unless MLA; with no "
	"model: checked when the first worker attaches, against its block, and that attach refused naming the key).",
	"`l2.dirs` are absolute and distinct once `//`, `.` components and a trailing `/` are dropped (`/x/l2`, "
	"`/x/l2/` and `/x/./l2` are one directory); with at least one dir `l2.capacity_bytes` is > 0 (no unbounded "
	"disk tier) and each dir's share (`l2.capacity_bytes` / number of dirs) holds at least one block file "
	"(4 KiB header + one block of one rank, rounded up to 4 KiB). With no dirs L2 is off and "
	"`l2.capacity_bytes` is not used.",
	"`l2.read_only` true: at least one `l2.dirs` entry (there is no disk store to serve otherwise).",
	"`metrics.enabled`: `metrics.listen` is host:port with a port in 1..65535.",
	"Reading a file (kvringd, `--check-config`) also looks at the disk: no two `l2.dirs` entries are one "
	"directory by device and inode (a symlink, a bind mount), nor the same path under one existing directory "
	"(a symlinked parent of a dir not created yet).",
};

const size_t cfg_n_sections = ARRAY_SIZE(cfg_sections);
const size_t cfg_n_keys = ARRAY_SIZE(cfg_keys);
const size_t cfg_n_checks_doc = ARRAY_SIZE(cfg_checks_doc);
_Static_assert(ARRAY_SIZE(cfg_keys) <= CFG_KEYS_MAX, "CFG_KEYS_MAX: raise it");

/* --- values of a key ----------------------------------------------------------------------------------------- */

/* Value i of an enum key, NULL past the last. */
const char *cfg_enum_value(const struct kvr_key *k, unsigned i)
{
	const struct kvr_preset *p;

	if (k->values)
		return k->values[i];
	if (i == 0)
		return "";
	p = kvr_preset_at(i - 1);
	return p ? p->name : NULL;
}

int cfg_enum_index(const char *section, const char *name, const char *s)
{
	const struct kvr_key *k = cfg_key_find(section, name);
	const char *e;

	for (unsigned i = 0; k && (e = cfg_enum_value(k, i)); i++)
		if (!strcmp(e, s))
			return (int)i;
	return -1;
}

/* Bytes in the largest binary unit that divides them exactly: "256MiB", "4KiB", "1000" (no unit). */
const char *cfg_fmt_size(uint64_t v, char *buf, size_t n)
{
	static const char *const units[] = { "PiB", "TiB", "GiB", "MiB", "KiB" };

	for (size_t i = 0; i < ARRAY_SIZE(units) && v; i++) {
		unsigned shift = 50 - 10 * (unsigned)i;

		if ((v & ((UINT64_C(1) << shift) - 1)) == 0) {
			snprintf(buf, n, "%" PRIu64 "%s", v >> shift, units[i]);
			return buf;
		}
	}
	snprintf(buf, n, "%" PRIu64, v);
	return buf;
}

const char *cfg_fmt_range(const struct kvr_key *k, char *buf, size_t n)
{
	char lo[32], hi[32];

	if (k->kind == K_SIZE)
		snprintf(buf, n, "%s..%s", cfg_fmt_size(k->min, lo, sizeof(lo)), cfg_fmt_size(k->max, hi, sizeof(hi)));
	else if (k->kind == K_MODE)
		snprintf(buf, n, "%04" PRIo64 "..%04" PRIo64, k->min, k->max);
	else
		snprintf(buf, n, "%" PRIu64 "..%" PRIu64, k->min, k->max);
	return buf;
}

/* --- lookups and defaults ------------------------------------------------------------------------------------ */

const struct kvr_key *cfg_key_find(const char *section, const char *name)
{
	size_t n = strlen(section);

	for (size_t i = 0; i < ARRAY_SIZE(cfg_keys); i++)
		if (section_len(cfg_keys[i].path) == n && !strncmp(cfg_keys[i].path, section, n) &&
		    !strcmp(cfg_keys[i].path + n + 1, name))
			return &cfg_keys[i];
	return NULL;
}

const struct kvr_section *cfg_section_find(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(cfg_sections); i++)
		if (!strcmp(cfg_sections[i].name, name))
			return &cfg_sections[i];
	return NULL;
}

void cfg_table_defaults(struct kvr_config *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < ARRAY_SIZE(cfg_keys); i++) {
		const struct kvr_key *k = &cfg_keys[i];

		switch (k->kind) {
		case K_U32:
		case K_MODE:
			set_u32(c, k, (uint32_t)k->def);
			break;
		case K_SIZE:
			set_u64(c, k, k->def);
			break;
		case K_BOOL:
			*(bool *)field(c, k->off) = k->def != 0;
			break;
		case K_STR:
		case K_ENUM:
			set_str(field(c, k->off), k->size, k->def_str);
			break;
		case K_PATHS:
			break; /* no entries, count 0 */
		}
	}
}
