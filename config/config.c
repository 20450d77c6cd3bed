/* config: kvringd's JSON configuration; one key table drives the strict parser, defaults, effective JSON, docs. */
#include "kvr_config.h"
#include "kvr_log.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_ctl.h"
#include "kvr_geometry.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)
#define TiB (UINT64_C(1) << 40)
#define PiB (UINT64_C(1) << 50)
/* Byte sizes stop at 1 PiB: every JSON integer up to it is exact in a double (cJSON's number type). */
#define SIZE_MAX_BYTES PiB
#define CONFIG_FILE_MAX (1u << 20)

enum kind {
	K_U32,   /* JSON unsigned integer */
	K_SIZE,  /* uint64_t bytes: JSON unsigned integer or a string "512MiB" */
	K_BOOL,
	K_STR,   /* char[size] */
	K_ENUM,  /* char[size], one of values[] (NULL: "" or a preset name of kvr_geometry.h) */
	K_MODE,  /* uint32_t permission bits, JSON string of 3 or 4 octal digits "0600" */
	K_PATHS, /* char[max_items][size] + uint32_t count: JSON array of strings */
};

enum {
	F_ABS = 1u << 0,          /* string must be an absolute path */
	F_ABS_OR_EMPTY = 1u << 1, /* string must be "" or an absolute path */
	F_ADDR = 1u << 2,         /* K_PATHS entries are host:port addresses, not paths */
};

struct kvr_key {
	const char *path; /* "section.key" */
	enum kind kind;
	unsigned flags;
	size_t off, size;          /* the field in struct kvr_config (K_PATHS: one entry) */
	size_t count_off;          /* K_PATHS: uint32_t entry count */
	uint32_t max_items;        /* K_PATHS */
	uint64_t def;              /* K_U32, K_SIZE, K_BOOL, K_MODE */
	const char *def_str;       /* K_STR, K_ENUM */
	uint64_t min, max;         /* K_U32, K_SIZE, K_MODE */
	const char *const *values; /* K_ENUM, NULL-terminated; NULL = the presets (enum_value) */
	const char *unit;
	const char *doc;
};

struct kvr_section {
	const char *name;
	const char *doc;
};

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

static const char *const log_level_values[] = { "error", "warn", "info", "debug", NULL };
static const char *const attention_values[] = { "mha", "mla", NULL };
static const char *const eviction_values[] = { "lru", "s3fifo", NULL };
static const char *const kv_layout_values[] = { "kv-split", "kv-fused", NULL };
static const char *const prefault_values[] = { "background", "off", NULL };
static const char *const l2_mode_values[] = { "write-through", "write-back", NULL };
static const char *const durability_values[] = { "none", "block", "batch", NULL };
static const char *const remote_mode_values[] = { "write-through", NULL }; /* write-back: not yet */

static const struct kvr_section sections[] = {
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

/* THE key table: one row per field of struct kvr_config, grouped by section in sections[] order. */
static const struct kvr_key keys[] = {
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

	ENUM("model.preset", model.preset, "qwen3-8b", NULL,
	     "model preset that fills the geometry (see Model presets); \"\" = give the geometry below"),
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
	    "a store's ALLOC, or an L2 promotion, waits this long for L1 room held by writes to L2; then it is "
	    "answered with what there is (no room)"),
	U32("timeouts.l2_answer_ms", timeouts.l2_answer_ms, 8000, 100, 600000, "ms",
	    "an L2 read or write the disk actor has not answered this long is lost: the read is given up (a "
	    "miss), the write sent again"),
	U32("timeouts.lookup_call_ms", timeouts.lookup_call_ms, 10000, 100, 600000, "ms",
	    "a storer waits this long for the lookup actor's answer to an ALLOC, COMMIT or RESET; then the "
	    "store fails"),
};

/* The cross-key checks done after parsing, in the order check_config() makes them (for the docs). */
static const char *const checks_doc[] = {
	"`instance.socket_mode` has the owner's write bit (0200): only the instance owner's uid may attach, and "
	"connecting to a Unix socket needs write permission.",
	"`rings.capacity` is a power of two.",
	"`timeouts.reply_ms` < `timeouts.alloc_wait_ms` < `timeouts.lookup_call_ms`, and `timeouts.l2_answer_ms` < "
	"`timeouts.lookup_call_ms`: each wait ends before the one waiting on it.",
	"`supervisor.restart_backoff_initial_ms` <= `supervisor.restart_backoff_max_ms`.",
	"`model.preset` \"\": `model.layers`, `model.kv_heads`, `model.head_dim` and `model.dtype_bytes` are required "
	"(> 0), `model.dtype_bytes` is 1, 2 or 4, and `model.model_id` is required (not \"\": it keeps two models "
	"of one geometry apart in the key namespace). With a preset, each of them is 0 (taken from the preset) or "
	"equal to the preset's value, "
	"`model.attention` when given equals the preset's (else it is taken from the preset), and `model.model_id` "
	"\"\" becomes the preset's Hugging Face id.",
	"`model.tp_size` divides `model.kv_heads`, or is a multiple of it (each rank then holds one replicated head, "
	"as vLLM does), unless `model.attention` is \"mla\".",
	"`model.tp_size` <= `instance.max_workers`: every rank of a TP group attaches as one worker.",
	"`l1.capacity_bytes` not 0: `l1.workload_prompts` and `l1.workload_tokens` are 0 (they would be ignored).",
	"`l1.capacity_bytes` 0: `l1.workload_prompts` and `l1.workload_tokens` are required (> 0).",
	"Each staging pool (load: `staging.ceiling_bytes` x `staging.load_percent` / 100, store: the rest) holds at "
	"least one buffer: `staging.buffer_bytes`, or when that is 0 one block of one rank "
	"(layers x KV heads per rank x head_dim x dtype_bytes x block_tokens, x 2 for K and V unless MLA).",
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

/* --- errors -------------------------------------------------------------------------------------------------- */

#define FAIL(...) kvr_errf(err, errlen, -EINVAL, __VA_ARGS__)

/* Bytes of the well-formed UTF-8 sequence at s (RFC 3629: shortest form, no surrogates, at most
 * U+10FFFF), 0 when there is none. s is NUL-terminated: a cut sequence stops at the NUL. */
static size_t utf8_len(const char *s)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t n;

	if (u[0] < 0x80)
		return 1;
	if (u[0] < 0xc2 || u[0] > 0xf4)
		return 0; /* a continuation byte, an overlong lead (c0, c1) or beyond U+10FFFF */
	n = u[0] < 0xe0 ? 2 : u[0] < 0xf0 ? 3 : 4;
	for (size_t i = 1; i < n; i++)
		if ((u[i] & 0xc0) != 0x80)
			return 0;
	if ((u[0] == 0xe0 && u[1] < 0xa0) || (u[0] == 0xed && u[1] > 0x9f) || (u[0] == 0xf0 && u[1] < 0x90) ||
	    (u[0] == 0xf4 && u[1] > 0x8f))
		return 0; /* overlong, a surrogate (U+D800..DFFF), or beyond U+10FFFF */
	return n;
}

/* The first byte of s that does not start a well-formed UTF-8 sequence, NULL when s is all UTF-8. */
static const char *utf8_invalid(const char *s)
{
	size_t n;

	for (; *s; s += n) {
		n = utf8_len(s);
		if (!n)
			return s;
	}
	return NULL;
}

/* A JSON-supplied name or value made printable for a one-line message (and cut at 64 bytes): control
 * characters, quotes and bytes that are not UTF-8 become '?', and a cut never splits a character, so the
 * message itself is valid UTF-8. */
static const char *clean(const char *s, char *buf, size_t n)
{
	size_t i = 0, len;

	for (; *s && i + 4 < n && i < 64; s += len) {
		len = utf8_len(s);
		if (len > 1 && i + len + 4 < n && i + len <= 64) {
			memcpy(buf + i, s, len);
			i += len;
			continue;
		}
		if (len > 1)
			break;
		buf[i++] = (len == 0 || (unsigned char)*s < 0x20 || *s == 0x7f || *s == '"') ? '?' : *s;
		len = 1;
	}
	if (*s && i + 3 < n) {
		memcpy(buf + i, "...", 3);
		i += 3;
	}
	buf[i] = '\0';
	return buf;
}

/* Value i of an enum key, NULL past the last. */
static const char *enum_value(const struct kvr_key *k, unsigned i)
{
	const struct kvr_preset *p;

	if (k->values)
		return k->values[i];
	if (i == 0)
		return "";
	p = kvr_preset_at(i - 1);
	return p ? p->name : NULL;
}

static const char *json_type_name(const cJSON *v)
{
	if (cJSON_IsBool(v))
		return "boolean";
	if (cJSON_IsNull(v))
		return "null";
	if (cJSON_IsNumber(v))
		return "number";
	if (cJSON_IsString(v))
		return "string";
	if (cJSON_IsArray(v))
		return "array";
	if (cJSON_IsObject(v))
		return "object";
	return "invalid value";
}

/* A double as JSON would show it: integers exactly, others in the shortest form that reads back. */
static const char *fmt_double(double d, char *buf, size_t n)
{
	if (isfinite(d) && d > -9.2e18 && d < 9.2e18 && (double)(int64_t)d == d) {
		snprintf(buf, n, "%" PRId64, (int64_t)d);
		return buf;
	}
	snprintf(buf, n, "%.15g", d);
	if (isfinite(d) && strtod(buf, NULL) != d)
		snprintf(buf, n, "%.17g", d);
	return buf;
}

/* Bytes in the largest binary unit that divides them exactly: "256MiB", "4KiB", "1000" (no unit). */
static const char *fmt_size(uint64_t v, char *buf, size_t n)
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

static const char *fmt_range(const struct kvr_key *k, char *buf, size_t n)
{
	char lo[32], hi[32];

	if (k->kind == K_SIZE)
		snprintf(buf, n, "%s..%s", fmt_size(k->min, lo, sizeof(lo)), fmt_size(k->max, hi, sizeof(hi)));
	else if (k->kind == K_MODE)
		snprintf(buf, n, "%04" PRIo64 "..%04" PRIo64, k->min, k->max);
	else
		snprintf(buf, n, "%" PRIu64 "..%" PRIu64, k->min, k->max);
	return buf;
}

/* --- table access -------------------------------------------------------------------------------------------- */

static void *field(struct kvr_config *c, size_t off)
{
	return (char *)c + off;
}

static const void *cfield(const struct kvr_config *c, size_t off)
{
	return (const char *)c + off;
}

static uint32_t get_u32(const struct kvr_config *c, const struct kvr_key *k)
{
	uint32_t v;

	memcpy(&v, cfield(c, k->off), sizeof(v));
	return v;
}

static uint64_t get_u64(const struct kvr_config *c, const struct kvr_key *k)
{
	uint64_t v;

	memcpy(&v, cfield(c, k->off), sizeof(v));
	return v;
}

static void set_u32(struct kvr_config *c, const struct kvr_key *k, uint32_t v)
{
	memcpy(field(c, k->off), &v, sizeof(v));
}

static void set_u64(struct kvr_config *c, const struct kvr_key *k, uint64_t v)
{
	memcpy(field(c, k->off), &v, sizeof(v));
}

/* Copy s (strlen < size) into a char[size] field, zero-filling the rest so equal configs compare equal. */
static void set_str(char *dst, size_t size, const char *s)
{
	size_t len = strlen(s);

	memset(dst, 0, size);
	memcpy(dst, s, len < size ? len : size - 1);
}

static size_t section_len(const char *path)
{
	return strcspn(path, ".");
}

static const struct kvr_key *key_find(const char *section, const char *name)
{
	size_t n = strlen(section);

	for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
		if (section_len(keys[i].path) == n && !strncmp(keys[i].path, section, n) &&
		    !strcmp(keys[i].path + n + 1, name))
			return &keys[i];
	return NULL;
}

static const struct kvr_section *section_find(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(sections); i++)
		if (!strcmp(sections[i].name, name))
			return &sections[i];
	return NULL;
}

static void table_defaults(struct kvr_config *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		const struct kvr_key *k = &keys[i];

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

/* --- number texts -------------------------------------------------------------------------------------------- */

/*
 * cJSON keeps a number as a double only, and the double hides what was written: 1e-400 underflows to 0,
 * 1024.0000000000001 rounds to 1024. So the parser pairs every number node with its text in the document
 * and decides "is it an integer" on the text, exactly.
 */
struct numtext {
	const cJSON *node;
	const char *text;
	size_t len;
};

struct numtexts {
	struct numtext *v;
	size_t n;
};

/* The number texts of json (valid JSON) in document order into v[0..max); returns how many there are. A
 * number starts with '-' or a digit outside a string and runs over [0-9+-.eE] (cJSON took exactly that run,
 * or the document would not have parsed). */
static size_t scan_numbers(const char *json, struct numtext *v, size_t max)
{
	bool in_str = false;
	size_t n = 0, len;

	for (const char *p = json; *p; p++) {
		if (in_str) {
			if (*p == '\\' && p[1])
				p++;
			else if (*p == '"')
				in_str = false;
		} else if (*p == '"') {
			in_str = true;
		} else if (*p == '-' || (*p >= '0' && *p <= '9')) {
			len = strspn(p, "0123456789+-.eE");
			if (n < max)
				v[n] = (struct numtext){ .text = p, .len = len };
			n++;
			p += len - 1;
		}
	}
	return n;
}

/* The number nodes under item and its siblings, depth first (= document order), into v[0..max); *n counts. */
static void tree_numbers(const cJSON *item, struct numtext *v, size_t max, size_t *n)
{
	for (; item; item = item->next) {
		if (cJSON_IsNumber(item)) {
			if (*n < max)
				v[*n].node = item;
			(*n)++;
		} else if (item->child) {
			tree_numbers(item->child, v, max, n);
		}
	}
}

/* Pair the number nodes of root with their texts in json. 0, -ENOMEM, or -EINVAL when the two do not
 * pair up (not expected). ret->v is freed by the caller. */
static int numtexts_build(const char *json, const cJSON *root, struct numtexts *ret)
{
	size_t n = scan_numbers(json, NULL, 0), nodes = 0;

	ret->v = NULL;
	ret->n = 0;
	if (n == 0) {
		tree_numbers(root, NULL, 0, &nodes);
		return nodes == 0 ? 0 : -EINVAL;
	}
	ret->v = calloc(n, sizeof(*ret->v));
	if (!ret->v)
		return -ENOMEM;
	(void) scan_numbers(json, ret->v, n);
	tree_numbers(root, ret->v, n, &nodes);
	if (nodes != n)
		return -EINVAL;
	ret->n = n;
	return 0;
}

static const struct numtext *numtext_of(const struct numtexts *t, const cJSON *v)
{
	for (size_t i = 0; t && i < t->n; i++)
		if (t->v[i].node == v)
			return &t->v[i];
	return NULL;
}

/* Whether the JSON number text s[0..len) is an integer, exactly: "2048", "2048.0", "1e3" and "1.5e1" are;
 * "0.5", "1e-400" and "1024.0000000000001" are not. A text that does not read as a number is not. */
static bool numtext_integral(const char *s, size_t len)
{
	size_t i = 0, digits = 0, frac = 0, last_nonzero = SIZE_MAX;
	long long e = 0;
	bool neg_e = false, point = false;

	if (i < len && s[i] == '-')
		i++;
	for (; i < len && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !point)); i++) {
		if (s[i] == '.') {
			point = true;
			continue;
		}
		if (s[i] != '0')
			last_nonzero = digits;
		digits++;
		frac += point;
	}
	if (digits == 0)
		return false;
	if (i < len && (s[i] == 'e' || s[i] == 'E')) {
		i++;
		if (i < len && (s[i] == '+' || s[i] == '-'))
			neg_e = s[i++] == '-';
		if (i == len)
			return false;
		for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
			if (e < 1000000000)
				e = e * 10 + (s[i] - '0');
	}
	if (i != len)
		return false;
	if (last_nonzero == SIZE_MAX)
		return true; /* zero */
	/* the digits read as an integer D ending in tz zeros, the value is D x 10^(e - frac): an integer
	 * exactly when no nonzero digit lands right of the point */
	long long tz = (long long)(digits - 1 - last_nonzero);
	return tz + (neg_e ? -e : e) - (long long)frac >= 0;
}

/* --- values -------------------------------------------------------------------------------------------------- */

/* A JSON number that must be an integer in [min, max]: never truncated, never clamped, and never read as
 * something other than what its text says (t: the document's number texts, NULL = the double only). */
static int parse_uint(const struct kvr_key *k, const cJSON *v, const struct numtexts *t, const char *path,
		      uint64_t *ret, char *err, size_t errlen)
{
	const struct numtext *nt = numtext_of(t, v);
	double d = v->valuedouble;
	char num[40], range[64];

	if (nt && !numtext_integral(nt->text, nt->len))
		return FAIL("%s: wrong type: expected unsigned integer, got fractional number %.*s", path,
			    (int)(nt->len < 40 ? nt->len : 40), nt->text);
	if (isfinite(d) && d > -9.2e18 && d < 9.2e18 && (double)(int64_t)d != d)
		return FAIL("%s: wrong type: expected unsigned integer, got fractional number %s", path,
			    fmt_double(d, num, sizeof(num)));
	if (!isfinite(d) || d < (double)k->min || d > (double)k->max)
		return FAIL("%s: out of range: %s (must be %s)", path, fmt_double(d, num, sizeof(num)),
			    fmt_range(k, range, sizeof(range)));
	*ret = (uint64_t)d;
	return 0;
}

/* "123", "123B", "4KiB" ... "1PiB": 0, -EINVAL (syntax) or -ERANGE (over 64 bits). */
static int parse_size_str(const char *s, uint64_t *ret)
{
	static const struct {
		const char *name;
		unsigned shift;
	} units[] = {
		{ "", 0 }, { "B", 0 }, { "KiB", 10 }, { "MiB", 20 }, { "GiB", 30 }, { "TiB", 40 }, { "PiB", 50 },
	};
	uint64_t v = 0;
	const char *p = s;

	if (*p < '0' || *p > '9')
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		unsigned dig = (unsigned)(*p - '0');

		if (v > (UINT64_MAX - dig) / 10)
			return -ERANGE;
		v = v * 10 + dig;
	}
	for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
		if (strcmp(p, units[i].name))
			continue;
		if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
			return -ERANGE;
		*ret = v << units[i].shift;
		return 0;
	}
	return -EINVAL;
}

static int parse_size(const struct kvr_key *k, const cJSON *v, const struct numtexts *t, const char *path,
		      uint64_t *ret, char *err, size_t errlen)
{
	char s[80], range[64];
	uint64_t u;
	int r;

	if (cJSON_IsNumber(v))
		return parse_uint(k, v, t, path, ret, err, errlen);
	if (!cJSON_IsString(v))
		return FAIL("%s: wrong type: expected unsigned integer or size string, got %s", path,
			    json_type_name(v));
	r = parse_size_str(v->valuestring, &u);
	if (r == -EINVAL)
		return FAIL("%s: invalid size \"%s\" (bytes, or a string like \"512MiB\"; units B, KiB, MiB, GiB, TiB, "
			    "PiB)", path, clean(v->valuestring, s, sizeof(s)));
	if (r < 0 || u < k->min || u > k->max)
		return FAIL("%s: out of range: \"%s\" (must be %s)", path, clean(v->valuestring, s, sizeof(s)),
			    fmt_range(k, range, sizeof(range)));
	*ret = u;
	return 0;
}

static int parse_mode(const struct kvr_key *k, const cJSON *v, const char *path, uint32_t *ret, char *err,
		      size_t errlen)
{
	char s[80], range[64];
	const char *p;
	size_t len;
	uint32_t m = 0;

	if (!cJSON_IsString(v))
		return FAIL("%s: wrong type: expected octal mode string, got %s", path, json_type_name(v));
	p = v->valuestring;
	len = strlen(p);
	if (len < 3 || len > 4 || strspn(p, "01234567") != len)
		return FAIL("%s: invalid mode \"%s\" (3 or 4 octal digits, like \"0600\")", path,
			    clean(p, s, sizeof(s)));
	for (; *p; p++)
		m = m * 8 + (uint32_t)(*p - '0');
	if (m < k->min || m > k->max)
		return FAIL("%s: out of range: \"%s\" (must be %s)", path, clean(v->valuestring, s, sizeof(s)),
			    fmt_range(k, range, sizeof(range)));
	*ret = m;
	return 0;
}

/* A string that fits a char[size] field, with the path rules of its flags. */
static int check_string(const struct kvr_key *k, const cJSON *v, const char *path, char *err, size_t errlen)
{
	char s[80];
	const char *str, *bad;

	if (!cJSON_IsString(v))
		return FAIL("%s: wrong type: expected string, got %s", path, json_type_name(v));
	str = v->valuestring;
	if (strlen(str) >= k->size)
		return FAIL("%s: too long (max %zu)", path, k->size - 1);
	/* cJSON passes raw bytes through: one that is not UTF-8 would make the effective config (--check-config,
	 * the control segment's copy) text that is no longer JSON */
	bad = utf8_invalid(str);
	if (bad)
		return FAIL("%s: not valid UTF-8: byte 0x%02x at offset %zu", path, (unsigned)(unsigned char)*bad,
			    (size_t)(bad - str));
	if (((k->flags & F_ABS) || ((k->flags & F_ABS_OR_EMPTY) && str[0])) && str[0] != '/')
		return FAIL("%s: not an absolute path: \"%s\"", path, clean(str, s, sizeof(s)));
	return 0;
}

static int parse_enum(const struct kvr_key *k, const cJSON *v, const char *path, char *err, size_t errlen)
{
	char s[80], list[512];
	const char *e;
	size_t n = 0;

	if (!cJSON_IsString(v))
		return FAIL("%s: wrong type: expected string, got %s", path, json_type_name(v));
	for (unsigned i = 0; (e = enum_value(k, i)); i++)
		if (!strcmp(e, v->valuestring))
			return 0;
	list[0] = '\0';
	for (unsigned i = 0; (e = enum_value(k, i)) && n < sizeof(list); i++)
		n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", n ? ", " : "", *e ? e : "\"\"");
	return FAIL("%s: invalid value \"%s\" (one of: %s)", path, clean(v->valuestring, s, sizeof(s)), list);
}

/* An absolute path with repeated '/', "." components and a trailing '/' dropped into buf (>= strlen(p) + 2):
 * "/x//./l2/" -> "/x/l2". ".." is kept: through a symlink "a/.." is not where it looks (kvr_config_check_fs
 * compares what exists by inode). */
static const char *path_lexical(const char *p, char *buf)
{
	size_t n = 0, len;

	buf[n++] = '/';
	while (*p) {
		p += strspn(p, "/");
		len = strcspn(p, "/");
		if (len == 0 || (len == 1 && p[0] == '.')) {
			p += len;
			continue;
		}
		if (n > 1)
			buf[n++] = '/';
		memcpy(buf + n, p, len);
		n += len;
		p += len;
	}
	buf[n] = '\0';
	return buf;
}

static bool listen_valid(const char *s);

static int parse_paths(const struct kvr_key *k, const cJSON *v, const char *path, struct kvr_config *c, char *err,
		       size_t errlen)
{
	char epath[128], dpath[128], a[80], b[80], na[KVR_PATH_MAX + 2], nb[KVR_PATH_MAX + 2];
	const cJSON *e;
	uint32_t n = 0, i = 0;
	int r;

	if (!cJSON_IsArray(v))
		return FAIL("%s: wrong type: expected array of strings, got %s", path, json_type_name(v));
	cJSON_ArrayForEach(e, v)
		n++;
	if (n > k->max_items)
		return FAIL("%s: too many entries: %" PRIu32 " (max %" PRIu32 ")", path, n, k->max_items);
	cJSON_ArrayForEach(e, v) {
		snprintf(epath, sizeof(epath), "%s[%" PRIu32 "]", path, i);
		r = check_string(k, e, epath, err, errlen);
		if (r < 0)
			return r;
		if ((k->flags & F_ADDR) && !listen_valid(e->valuestring))
			return FAIL("%s: invalid \"%s\" (expected host:port, port 1..65535)", epath,
				    clean(e->valuestring, a, sizeof(a)));
		/* one directory under two spellings would get two disk actors over one store */
		for (uint32_t j = 0; j < i && (k->flags & F_ADDR); j++)
			if (!strcmp(field(c, k->off + j * k->size), e->valuestring)) {
				snprintf(dpath, sizeof(dpath), "%s[%" PRIu32 "]", path, j);
				return FAIL("%s: duplicate of %s (\"%s\")", epath, dpath, clean(e->valuestring, a, sizeof(a)));
			}
		for (uint32_t j = 0; j < i && !(k->flags & F_ADDR); j++) {
			const char *prev = field(c, k->off + j * k->size);

			if (strcmp(path_lexical(prev, na), path_lexical(e->valuestring, nb)))
				continue;
			snprintf(dpath, sizeof(dpath), "%s[%" PRIu32 "]", path, j);
			return FAIL("%s: duplicate of %s: \"%s\" is the same directory as \"%s\"", epath, dpath,
				    clean(e->valuestring, a, sizeof(a)), clean(prev, b, sizeof(b)));
		}
		set_str(field(c, k->off + i * k->size), k->size, e->valuestring);
		i++;
	}
	for (; i < k->max_items; i++)
		memset(field(c, k->off + i * k->size), 0, k->size);
	memcpy(field(c, k->count_off), &n, sizeof(n));
	return 0;
}

static int set_value(const struct kvr_key *k, const cJSON *v, const struct numtexts *t, struct kvr_config *c,
		     char *err, size_t errlen)
{
	char path[96];
	uint64_t u = 0;
	uint32_t m = 0;
	int r;

	snprintf(path, sizeof(path), "$.%s", k->path);
	switch (k->kind) {
	case K_U32:
		if (!cJSON_IsNumber(v))
			return FAIL("%s: wrong type: expected unsigned integer, got %s", path, json_type_name(v));
		r = parse_uint(k, v, t, path, &u, err, errlen);
		if (r == 0)
			set_u32(c, k, (uint32_t)u);
		return r;
	case K_SIZE:
		r = parse_size(k, v, t, path, &u, err, errlen);
		if (r == 0)
			set_u64(c, k, u);
		return r;
	case K_BOOL:
		if (!cJSON_IsBool(v))
			return FAIL("%s: wrong type: expected boolean, got %s", path, json_type_name(v));
		*(bool *)field(c, k->off) = cJSON_IsTrue(v);
		return 0;
	case K_STR:
		r = check_string(k, v, path, err, errlen);
		if (r == 0)
			set_str(field(c, k->off), k->size, v->valuestring);
		return r;
	case K_ENUM:
		r = parse_enum(k, v, path, err, errlen);
		if (r == 0)
			set_str(field(c, k->off), k->size, v->valuestring);
		return r;
	case K_MODE:
		r = parse_mode(k, v, path, &m, err, errlen);
		if (r == 0)
			set_u32(c, k, m);
		return r;
	case K_PATHS:
		return parse_paths(k, v, path, c, err, errlen);
	}
	return FAIL("%s: internal error: bad key kind", path);
}

/* Whether a sibling before item (first: the parent's first child) has the same name. */
static bool duplicate_before(const cJSON *first, const cJSON *item)
{
	for (const cJSON *p = first; p && p != item; p = p->next)
		if (!strcmp(p->string, item->string))
			return true;
	return false;
}

/* Apply every key of root to c; ret_set[i] tells whether keys[i] was given. t: root's number texts. */
static int walk(const cJSON *root, const struct numtexts *t, struct kvr_config *c, bool *ret_set, char *err,
		size_t errlen)
{
	char a[80], b[80];
	const cJSON *sec, *item;
	int r;

	if (!cJSON_IsObject(root))
		return FAIL("$: wrong type: expected object, got %s", json_type_name(root));
	for (sec = root->child; sec; sec = sec->next) {
		if (duplicate_before(root->child, sec))
			return FAIL("$.%s: duplicate key", clean(sec->string, a, sizeof(a)));
		if (!section_find(sec->string))
			return FAIL("$.%s: unknown key", clean(sec->string, a, sizeof(a)));
		if (!cJSON_IsObject(sec))
			return FAIL("$.%s: wrong type: expected object, got %s", sec->string, json_type_name(sec));
		for (item = sec->child; item; item = item->next) {
			const struct kvr_key *k;

			if (duplicate_before(sec->child, item))
				return FAIL("$.%s.%s: duplicate key", sec->string, clean(item->string, b, sizeof(b)));
			k = key_find(sec->string, item->string);
			if (!k)
				return FAIL("$.%s.%s: unknown key", sec->string, clean(item->string, b, sizeof(b)));
			r = set_value(k, item, t, c, err, errlen);
			if (r < 0)
				return r;
			ret_set[k - keys] = true;
		}
	}
	return 0;
}

/* --- cross-key checks ---------------------------------------------------------------------------------------- */

/* Fill the geometry from model.preset, refusing explicit values that contradict it. attention_set: whether
 * model.attention was given (else it is taken from the preset). */
static int resolve_model(struct kvr_config *c, bool attention_set, char *err, size_t errlen)
{
	struct {
		const char *name;
		uint32_t *v, preset;
	} g[] = {
		{ "layers", &c->model.layers, 0 },
		{ "kv_heads", &c->model.kv_heads, 0 },
		{ "head_dim", &c->model.head_dim, 0 },
		{ "dtype_bytes", &c->model.dtype_bytes, 0 },
	};
	const struct kvr_preset *p;
	const char *attention;

	if (c->model.preset[0] == '\0') {
		for (size_t i = 0; i < ARRAY_SIZE(g); i++)
			if (*g[i].v == 0)
				return FAIL("$.model.%s: required when model.preset is empty", g[i].name);
		if (c->model.dtype_bytes == 3)
			return FAIL("$.model.dtype_bytes: 3 is not 1, 2 or 4");
		if (c->model.model_id[0] == '\0')
			return FAIL("$.model.model_id: required when model.preset is empty (without it two models of "
				    "one geometry would share blocks)");
		return 0;
	}
	p = kvr_preset_find(c->model.preset);
	if (!p)
		return FAIL("$.model.preset: internal error: no geometry for \"%s\"", c->model.preset);
	g[0].preset = p->layers;
	g[1].preset = p->kv_heads_total;
	g[2].preset = p->head_dim;
	g[3].preset = p->dtype_bytes;
	for (size_t i = 0; i < ARRAY_SIZE(g); i++) {
		if (*g[i].v && *g[i].v != g[i].preset)
			return FAIL("$.model.%s: %" PRIu32 " conflicts with model.preset \"%s\" (%" PRIu32 ")",
				    g[i].name, *g[i].v, p->name, g[i].preset);
	}
	attention = p->attention == KVR_ATTN_MLA ? "mla" : "mha";
	if (attention_set && strcmp(c->model.attention, attention))
		return FAIL("$.model.attention: \"%s\" conflicts with model.preset \"%s\" (%s)", c->model.attention,
			    p->name, attention);
	for (size_t i = 0; i < ARRAY_SIZE(g); i++)
		*g[i].v = g[i].preset;
	set_str(c->model.attention, sizeof(c->model.attention), attention);
	if (c->model.model_id[0] == '\0')
		set_str(c->model.model_id, sizeof(c->model.model_id), p->hf_id ? p->hf_id : p->name);
	return 0;
}

static bool is_mla(const struct kvr_config *c)
{
	return !strcmp(c->model.attention, "mla");
}

/* Bytes of one block of one TP rank (MLA: every rank holds the whole latent; TP over the KV heads: one
 * replicated head a rank). Fits in 64 bits: each factor is bounded by the key table. */
static uint64_t block_bytes_per_rank(const struct kvr_config *c)
{
	uint64_t heads;

	if (is_mla(c))
		heads = c->model.kv_heads;
	else if (c->model.tp_size > c->model.kv_heads)
		heads = 1;
	else
		heads = c->model.kv_heads / c->model.tp_size;

	return (uint64_t)c->model.layers * heads * c->model.head_dim * c->model.dtype_bytes * c->model.block_tokens *
	       (is_mla(c) ? 1 : 2);
}

/* "host:port", port 1..65535; an IPv6 host in brackets. */
static bool listen_valid(const char *s)
{
	const char *colon = strrchr(s, ':');
	size_t hlen, plen;
	unsigned long port;

	if (!colon)
		return false;
	hlen = (size_t)(colon - s);
	plen = strlen(colon + 1);
	if (hlen == 0 || plen == 0 || plen > 5 || strspn(colon + 1, "0123456789") != plen)
		return false;
	port = strtoul(colon + 1, NULL, 10);
	if (port < 1 || port > 65535)
		return false;
	if (s[0] == '[')
		return hlen > 2 && s[hlen - 1] == ']' && !memchr(s + 1, ']', hlen - 2) && !memchr(s, ' ', hlen);
	return !memchr(s, ':', hlen) && !memchr(s, ' ', hlen) && !memchr(s, '[', hlen) && !memchr(s, ']', hlen);
}

static int check_config(struct kvr_config *c, const bool *set, char *err, size_t errlen)
{
	char s[80];
	uint64_t buf, load, store, small;
	const char *pool;
	int r;

	if (!(c->instance.socket_mode & 0200))
		return FAIL("$.instance.socket_mode: \"%04" PRIo32 "\" lacks owner write (0200): only the instance "
			    "owner may attach, and connecting needs write permission", c->instance.socket_mode);
	if (c->rings.capacity & (c->rings.capacity - 1))
		return FAIL("$.rings.capacity: %" PRIu32 " is not a power of two", c->rings.capacity);
	if (c->timeouts.reply_ms >= c->timeouts.alloc_wait_ms)
		return FAIL("$.timeouts.reply_ms: %" PRIu32 " must be below timeouts.alloc_wait_ms (%" PRIu32 "): a "
			    "reply dropped for a full ring must not outlast a wait for room", c->timeouts.reply_ms,
			    c->timeouts.alloc_wait_ms);
	if (c->timeouts.alloc_wait_ms >= c->timeouts.lookup_call_ms)
		return FAIL("$.timeouts.alloc_wait_ms: %" PRIu32 " must be below timeouts.lookup_call_ms (%" PRIu32
			    "): the storer would give up on an ALLOC the lookup actor still holds", c->timeouts.alloc_wait_ms,
			    c->timeouts.lookup_call_ms);
	if (c->timeouts.l2_answer_ms >= c->timeouts.lookup_call_ms)
		return FAIL("$.timeouts.l2_answer_ms: %" PRIu32 " must be below timeouts.lookup_call_ms (%" PRIu32 ")",
			    c->timeouts.l2_answer_ms, c->timeouts.lookup_call_ms);
	if (c->supervisor.restart_backoff_initial_ms > c->supervisor.restart_backoff_max_ms)
		return FAIL("$.supervisor.restart_backoff_initial_ms: %" PRIu32
			    " exceeds supervisor.restart_backoff_max_ms (%" PRIu32 ")",
			    c->supervisor.restart_backoff_initial_ms, c->supervisor.restart_backoff_max_ms);
	r = resolve_model(c, set[key_find("model", "attention") - keys], err, errlen);
	if (r < 0)
		return r;
	if (!is_mla(c) && c->model.kv_heads % c->model.tp_size && c->model.tp_size % c->model.kv_heads)
		return FAIL("$.model.tp_size: %" PRIu32 " neither divides model.kv_heads (%" PRIu32
			    ") nor is a multiple of it", c->model.tp_size, c->model.kv_heads);
	if (is_mla(c) && !strcmp(c->model.kv_layout, "kv-fused"))
		return FAIL("$.model.kv_layout: \"kv-fused\" is for K and V pages (mha); an mla layer has one latent "
			    "page already");
	if (c->model.tp_size > c->instance.max_workers)
		return FAIL("$.model.tp_size: %" PRIu32 " exceeds instance.max_workers (%" PRIu32 "): each rank of a "
			    "TP group attaches as one worker, so no group could ever be complete",
			    c->model.tp_size, c->instance.max_workers);
	if (c->l1.capacity_bytes && c->l1.workload_prompts)
		return FAIL("$.l1.workload_prompts: only used when l1.capacity_bytes is 0 (it is %" PRIu64 ")",
			    c->l1.capacity_bytes);
	if (c->l1.capacity_bytes && c->l1.workload_tokens)
		return FAIL("$.l1.workload_tokens: only used when l1.capacity_bytes is 0 (it is %" PRIu64 ")",
			    c->l1.capacity_bytes);
	if (c->l1.capacity_bytes == 0 && c->l1.workload_prompts == 0)
		return FAIL("$.l1.workload_prompts: required when l1.capacity_bytes is 0");
	if (c->l1.capacity_bytes == 0 && c->l1.workload_tokens == 0)
		return FAIL("$.l1.workload_tokens: required when l1.capacity_bytes is 0");

	load = c->staging.ceiling_bytes * c->staging.load_percent / 100;
	store = c->staging.ceiling_bytes - load;
	buf = c->staging.buffer_bytes ? c->staging.buffer_bytes : block_bytes_per_rank(c);
	pool = load <= store ? "load" : "store";
	small = load <= store ? load : store;
	if (c->staging.buffer_bytes && buf > small)
		return FAIL("$.staging.buffer_bytes: %" PRIu64 " does not fit the %s pool (%" PRIu64 " bytes)", buf,
			    pool, small);
	if (buf > small)
		return FAIL("$.staging.ceiling_bytes: the %s pool (%" PRIu64 " bytes) cannot hold one block (%" PRIu64
			    " bytes)", pool, small, buf);

	if (c->l2.n_dirs > 0 && c->l2.capacity_bytes == 0)
		return FAIL("$.l2.capacity_bytes: required when l2.dirs is not empty");
	/* each dir's share must hold one block file (a 4 KiB header + one rank's block, 4 KiB aligned: a lower
	 * bound, the slot may be larger): else every write to it fails */
	buf = block_bytes_per_rank(c);
	buf = 4096 + (buf + 4095) / 4096 * 4096;
	if (c->l2.n_dirs > 0 && c->l2.capacity_bytes / c->l2.n_dirs < buf)
		return FAIL("$.l2.capacity_bytes: %" PRIu64 " split over %" PRIu32 " l2.dirs leaves %" PRIu64
			    " bytes a dir, less than one block file (%" PRIu64 " bytes)", c->l2.capacity_bytes,
			    c->l2.n_dirs, c->l2.capacity_bytes / c->l2.n_dirs, buf);
	if (c->l2.read_only && c->l2.n_dirs == 0)
		return FAIL("$.l2.read_only: needs l2.dirs (there is no disk store to serve)");
	if (c->metrics.enabled && !listen_valid(c->metrics.listen))
		return FAIL("$.metrics.listen: invalid \"%s\" (expected host:port, port 1..65535)",
			    clean(c->metrics.listen, s, sizeof(s)));
	if (c->remote.tls)
		return FAIL("$.remote.tls: TLS is not built into this kvring (hiredis without hiredis_ssl): use a "
			    "private network or a TLS proxy, and tls false");
	if (c->remote.password[0] == 0 && c->remote.user[0])
		return FAIL("$.remote.user: \"%s\" needs remote.password", clean(c->remote.user, s, sizeof(s)));
	return 0;
}

/* --- public -------------------------------------------------------------------------------------------------- */

/* The derived fields of the enum keys (kvr_config.h): the strings were checked against their values[]. */
static void derive(struct kvr_config *c)
{
	enum kvr_log_level lvl = KVR_LOG_INFO;
	(void) kvr_log_level_parse(c->instance.log_level, &lvl);
	c->instance.log_level_id = (int)lvl;
	c->model.mla = !strcmp(c->model.attention, "mla");
	c->model.kv_fused = !strcmp(c->model.kv_layout, "kv-fused");
	c->l1.prefault_background = !strcmp(c->l1.prefault, "background");
	c->l2.write_back = !strcmp(c->l2.mode, "write-back");
	c->l2.durability_id = !strcmp(c->l2.durability, "none")    ? KVR_CFG_DUR_NONE
			      : !strcmp(c->l2.durability, "block") ? KVR_CFG_DUR_BLOCK
								    : KVR_CFG_DUR_BATCH;
}

void kvr_config_defaults(struct kvr_config *cfg)
{
	char err[8];

	table_defaults(cfg);
	(void) resolve_model(cfg, false, err, sizeof(err)); /* the default preset always resolves (tested) */
	derive(cfg);
}

/* 1-based line and column (in characters, UTF-8 continuation bytes not counted) of at in text. */
static void line_col(const char *text, const char *at, unsigned *ret_line, unsigned *ret_col)
{
	unsigned line = 1, col = 1;

	for (const char *p = text; p < at && *p; p++) {
		if (*p == '\n') {
			line++;
			col = 1;
		} else if (((unsigned char)*p & 0xc0) != 0x80) {
			col++;
		}
	}
	*ret_line = line;
	*ret_col = col;
}

/* cJSON turns "\u0000" into an end of string, silently cutting it: refuse it. text is valid JSON. */
static int check_nul_escape(const char *text, char *err, size_t errlen)
{
	bool in_str = false;
	unsigned line, col;

	for (const char *p = text; *p; p++) {
		if (!in_str) {
			in_str = *p == '"';
		} else if (*p == '"') {
			in_str = false;
		} else if (*p == '\\') {
			if (!strncmp(p, "\\u0000", 6)) {
				line_col(text, p, &line, &col);
				return FAIL("config: \\u0000 in a string near line %u column %u", line, col);
			}
			p++;
		}
	}
	return 0;
}

#define UTF8_BOM "\xef\xbb\xbf"

int kvr_config_parse(const char *json, struct kvr_config *cfg, char *err, size_t errlen)
{
	bool set[ARRAY_SIZE(keys)] = { false };
	struct numtexts nums = { 0 };
	struct kvr_config tmp;
	const char *end = NULL;
	unsigned line, col;
	cJSON *root;
	int r;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!json)
		return FAIL("config: no JSON text");
	/* A UTF-8 byte-order mark before the text (editors on Windows write one) is skipped on
	 * purpose, and every position counts from after it, as an editor shows them. cJSON would
	 * skip one too, and a second one after it: a second one is refused here, as a mark
	 * anywhere else is (it is not JSON whitespace). */
	if (!strncmp(json, UTF8_BOM, 3)) {
		json += 3;
		if (!strncmp(json, UTF8_BOM, 3))
			return FAIL("config: not valid JSON near line 1 column 1 (a second UTF-8 byte-order mark)");
	}
	root = cJSON_ParseWithOpts(json, &end, true);
	if (!root) {
		if (!end)
			end = cJSON_GetErrorPtr();
		if (!end)
			return FAIL("config: not valid JSON");
		line_col(json, end, &line, &col);
		return FAIL("config: not valid JSON near line %u column %u", line, col);
	}
	table_defaults(&tmp);
	r = check_nul_escape(json, err, errlen);
	if (r == 0) {
		r = numtexts_build(json, root, &nums);
		if (r == -ENOMEM)
			r = kvr_errf(err, errlen, -ENOMEM, "config: out of memory");
		else if (r < 0)
			r = FAIL("config: internal error: the numbers of the document do not pair up");
	}
	if (r == 0)
		r = walk(root, &nums, &tmp, set, err, errlen);
	if (r == 0)
		r = check_config(&tmp, set, err, errlen); /* resolves the model preset too */
	if (r == 0)
		derive(&tmp);
	free(nums.v);
	cJSON_Delete(root);
	if (r == 0 && cfg)
		memcpy(cfg, &tmp, sizeof(tmp));
	return r;
}

/* Where an absolute path leads, for "the same directory": the deepest directory on it that exists (st_dev,
 * st_ino; stat follows symlinks) and the lexical rest below it ("" when the whole path exists). */
struct dir_id {
	bool found;
	dev_t dev;
	ino_t ino;
	char norm[KVR_PATH_MAX + 2];
	const char *rest;
};

static void dir_identity(const char *path, struct dir_id *ret)
{
	struct stat st;
	size_t cut;
	char save;
	bool ok;

	path_lexical(path, ret->norm);
	cut = strlen(ret->norm);
	for (;;) {
		save = ret->norm[cut];
		ret->norm[cut] = '\0';
		ok = stat(cut ? ret->norm : "/", &st) == 0;
		ret->norm[cut] = save;
		if (ok || cut == 0)
			break;
		do
			cut--;
		while (cut > 0 && ret->norm[cut] != '/');
	}
	ret->found = ok;
	ret->dev = ok ? st.st_dev : 0;
	ret->ino = ok ? st.st_ino : 0;
	ret->rest = ret->norm + (ok ? cut : 0);
}

int kvr_config_check_fs(const struct kvr_config *cfg, char *err, size_t errlen)
{
	struct dir_id id[KVR_L2_MAX_DIRS];
	char a[80], b[80];
	uint32_t n;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!cfg)
		return FAIL("config: no configuration");
	n = cfg->l2.n_dirs < KVR_L2_MAX_DIRS ? cfg->l2.n_dirs : KVR_L2_MAX_DIRS;
	for (uint32_t i = 0; i < n; i++) {
		dir_identity(cfg->l2.dirs[i], &id[i]);
		for (uint32_t j = 0; j < i; j++) {
			if (!id[i].found || !id[j].found || id[i].dev != id[j].dev || id[i].ino != id[j].ino ||
			    strcmp(id[i].rest, id[j].rest))
				continue;
			return FAIL("$.l2.dirs[%" PRIu32 "]: duplicate of $.l2.dirs[%" PRIu32 "]: \"%s\" is the same "
				    "directory as \"%s\" (same device and inode%s)", i, j,
				    clean(cfg->l2.dirs[i], a, sizeof(a)), clean(cfg->l2.dirs[j], b, sizeof(b)),
				    id[i].rest[0] ? " of an existing parent" : "");
		}
	}
	return 0;
}

int kvr_config_load_file(const char *path, struct kvr_config *cfg, char *err, size_t errlen)
{
	struct kvr_config tmp;
	char ebuf[128];
	size_t n = 0;
	ssize_t got;
	char *text;
	int fd, r;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!path || !path[0])
		return FAIL("config: no file name");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		return kvr_errf(err, errlen, r, "config %s: %s", path, strerror_r(-r, ebuf, sizeof(ebuf)));
	}
	text = malloc(CONFIG_FILE_MAX + 2);
	if (!text) {
		close(fd);
		return kvr_errf(err, errlen, -ENOMEM, "config %s: out of memory", path);
	}
	/* Read one byte past the cap to tell "exactly 1 MiB" from "larger". */
	while (n <= CONFIG_FILE_MAX) {
		got = read(fd, text + n, CONFIG_FILE_MAX + 1 - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			r = -errno;
			kvr_errf(err, errlen, r, "config %s: %s", path, strerror_r(-r, ebuf, sizeof(ebuf)));
			goto out;
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	if (n > CONFIG_FILE_MAX) {
		r = kvr_errf(err, errlen, -EFBIG, "config %s: larger than 1 MiB", path);
		goto out;
	}
	if (memchr(text, '\0', n)) {
		r = FAIL("config %s: contains a NUL byte", path);
		goto out;
	}
	text[n] = '\0';
	r = kvr_config_parse(text, &tmp, err, errlen);
	if (r == 0)
		r = kvr_config_check_fs(&tmp, err, errlen);
	if (r == 0 && cfg)
		memcpy(cfg, &tmp, sizeof(tmp));
out:
	free(text);
	close(fd);
	return r;
}

/* --- text output --------------------------------------------------------------------------------------------- */

struct sbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void __attribute__((format(printf, 2, 3))) sb_printf(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if (b->p && (size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap ? b->cap : 4096;
		while (cap - b->len <= (size_t)n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

static void sb_json_str(struct sbuf *b, const char *s)
{
	sb_printf(b, "\"");
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			sb_printf(b, "\\%c", ch);
		else if (ch < 0x20)
			sb_printf(b, "\\u%04x", ch);
		else
			sb_printf(b, "%c", ch);
	}
	sb_printf(b, "\"");
}

static char *sb_finish(struct sbuf *b)
{
	if (b->oom || !b->p) {
		free(b->p);
		return NULL;
	}
	return b->p;
}

char *kvr_config_to_json(const struct kvr_config *cfg)
{
	struct sbuf b = { 0 };
	size_t cur_len = 0;
	const char *cur = NULL;

	if (!cfg)
		return NULL;
	sb_printf(&b, "{");
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		const struct kvr_key *k = &keys[i];
		size_t slen = section_len(k->path);
		uint32_t n;

		if (!cur || slen != cur_len || strncmp(cur, k->path, slen)) {
			sb_printf(&b, "%s\n  \"%.*s\": {\n", cur ? "\n  }," : "", (int)slen, k->path);
			cur = k->path;
			cur_len = slen;
		} else {
			sb_printf(&b, ",\n");
		}
		sb_printf(&b, "    \"%s\": ", k->path + slen + 1);
		switch (k->kind) {
		case K_U32:
			sb_printf(&b, "%" PRIu32, get_u32(cfg, k));
			break;
		case K_MODE:
			sb_printf(&b, "\"%04" PRIo32 "\"", get_u32(cfg, k));
			break;
		case K_SIZE:
			sb_printf(&b, "%" PRIu64, get_u64(cfg, k));
			break;
		case K_BOOL:
			sb_printf(&b, "%s", *(const bool *)cfield(cfg, k->off) ? "true" : "false");
			break;
		case K_STR:
		case K_ENUM:
			sb_json_str(&b, cfield(cfg, k->off)); /* NUL-terminated: parse and set_str keep it so */
			break;
		case K_PATHS:
			memcpy(&n, cfield(cfg, k->count_off), sizeof(n));
			sb_printf(&b, "[");
			for (uint32_t j = 0; j < n && j < k->max_items; j++) {
				sb_printf(&b, "%s", j ? ", " : "");
				sb_json_str(&b, cfield(cfg, k->off + j * k->size));
			}
			sb_printf(&b, "]");
			break;
		}
	}
	sb_printf(&b, "\n  }\n}\n");
	return sb_finish(&b);
}

/* Markdown table cell text: '|' would end the cell. */
static void sb_md(struct sbuf *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '|')
			sb_printf(b, "\\|");
		else
			sb_printf(b, "%c", *s);
	}
}

static void doc_type(struct sbuf *b, const struct kvr_key *k)
{
	static const char *const names[] = {
		[K_U32] = "uint32", [K_SIZE] = "size", [K_BOOL] = "bool", [K_STR] = "string",
		[K_ENUM] = "enum", [K_MODE] = "mode", [K_PATHS] = "array of strings",
	};

	sb_printf(b, "%s", names[k->kind]);
	if (k->unit && k->kind == K_U32)
		sb_printf(b, " (%s)", k->unit);
	else if (k->kind == K_SIZE)
		sb_printf(b, " (bytes)");
	else if (k->kind == K_MODE)
		sb_printf(b, " (octal)");
}

static void doc_default(struct sbuf *b, const struct kvr_key *k)
{
	char s[32];

	switch (k->kind) {
	case K_U32:
		sb_printf(b, "`%" PRIu64 "`", k->def);
		break;
	case K_SIZE:
		fmt_size(k->def, s, sizeof(s));
		if (strspn(s, "0123456789") == strlen(s))
			sb_printf(b, "`%s`", s);
		else
			sb_printf(b, "`\"%s\"`", s);
		break;
	case K_BOOL:
		sb_printf(b, "`%s`", k->def ? "true" : "false");
		break;
	case K_MODE:
		sb_printf(b, "`\"%04" PRIo64 "\"`", k->def);
		break;
	case K_STR:
	case K_ENUM:
		sb_printf(b, "`\"");
		sb_md(b, k->def_str);
		sb_printf(b, "\"`");
		break;
	case K_PATHS:
		sb_printf(b, "`[]`");
		break;
	}
}

static void doc_range(struct sbuf *b, const struct kvr_key *k)
{
	const char *e;
	char s[64];

	switch (k->kind) {
	case K_U32:
	case K_SIZE:
	case K_MODE:
		sb_printf(b, "%s", fmt_range(k, s, sizeof(s)));
		break;
	case K_BOOL:
		sb_printf(b, "`true`, `false`");
		break;
	case K_ENUM:
		for (unsigned i = 0; (e = enum_value(k, i)); i++)
			sb_printf(b, "%s`%s%s%s`", i ? ", " : "", *e ? "" : "\"", e, *e ? "" : "\"");
		break;
	case K_STR:
		sb_printf(b, "at most %zu bytes", k->size - 1);
		if (k->flags & F_ABS)
			sb_printf(b, ", absolute path");
		if (k->flags & F_ABS_OR_EMPTY)
			sb_printf(b, ", absolute path or `\"\"`");
		break;
	case K_PATHS:
		sb_printf(b, "0..%" PRIu32 " absolute paths of at most %zu bytes, distinct", k->max_items, k->size - 1);
		break;
	}
}

char *kvr_config_doc_markdown(void)
{
	const struct kvr_preset *p;
	struct sbuf b = { 0 };

	sb_printf(&b,
		  "# kvring configuration\n"
		  "\n"
		  "<!-- Generated from the key table in config/config.c: do not edit. Regenerate with\n"
		  "     BUILDDIR/tests/config/gen-config-doc > docs/config.md -->\n"
		  "\n"
		  "kvringd reads one JSON object with the sections below. Every key is optional: a missing key\n"
		  "takes its default, so `{}` is a complete configuration. Parsing is strict: an unknown or\n"
		  "duplicate key, a value of the wrong type, a number out of range or a fractional/negative\n"
		  "number for an integer key, a string that is too long or not valid UTF-8 and inconsistent\n"
		  "values (see the checks at the end) all refuse the file with one line naming the key and the\n"
		  "reason, for example\n"
		  "\n"
		  "    $.supervisor.restart_backoff_max_ms: out of range: 0 (must be 1..600000)\n"
		  "\n"
		  "Nothing is silently changed or clamped. `kvringd --check-config` prints the effective\n"
		  "configuration: every key, defaults filled in, sizes as integers of bytes.\n"
		  "\n"
		  "Types: `uint32` is a JSON integer; `size` is bytes, a JSON integer or a string with a binary\n"
		  "unit (`\"512MiB\"`, `\"64GiB\"`; units B, KiB, MiB, GiB, TiB, PiB), at most 1 PiB; `mode` is a\n"
		  "string of 3 or 4 octal digits (`\"0600\"`); `enum` is one of the listed strings; `string`\n"
		  "is UTF-8 (a byte that is not is refused with its offset, `\\u0000` is refused).\n"
		  "\n"
		  "The file may start with a UTF-8 byte-order mark (bytes EF BB BF, which some editors write):\n"
		  "it is skipped, and line and column numbers in a reason count from after it. Anywhere else\n"
		  "(a second one, one inside the object) it is refused as not valid JSON, with its position.\n"
		  "\n"
		  "An integer key takes a number whose text is an integer: `2048`, `2048.0` and `1e3` are;\n"
		  "`0.5`, `1e-400` (which a double reads as 0) and `1024.0000000000001` (which a double reads as\n"
		  "1024) are refused as fractional, whatever the double they round to. A size string has no\n"
		  "fraction (`\"1.5GiB\"` is refused: write `\"1536MiB\"`).\n");
	for (size_t s = 0; s < ARRAY_SIZE(sections); s++) {
		const char *name = sections[s].name;
		size_t nlen = strlen(name);

		sb_printf(&b, "\n## %s\n\n%s\n\n", name, sections[s].doc);
		sb_printf(&b, "| key | type | default | range / values | description |\n");
		sb_printf(&b, "| --- | --- | --- | --- | --- |\n");
		for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
			const struct kvr_key *k = &keys[i];

			if (section_len(k->path) != nlen || strncmp(k->path, name, nlen))
				continue;
			sb_printf(&b, "| `%s` | ", k->path);
			doc_type(&b, k);
			sb_printf(&b, " | ");
			doc_default(&b, k);
			sb_printf(&b, " | ");
			doc_range(&b, k);
			sb_printf(&b, " | ");
			sb_md(&b, k->doc);
			sb_printf(&b, " |\n");
		}
	}
	sb_printf(&b, "\n## Model presets\n\n");
	sb_printf(&b, "From kv/presets.c (each model's config.json). kv_heads counts all TP ranks; MLA head_dim is "
		  "the latent width.\n\n");
	sb_printf(&b, "| preset | model_id | layers | kv_heads | head_dim | dtype_bytes | attention |\n");
	sb_printf(&b, "| --- | --- | --- | --- | --- | --- | --- |\n");
	for (unsigned i = 0; (p = kvr_preset_at(i)); i++)
		sb_printf(&b, "| `%s` | %s | %" PRIu32 " | %" PRIu32 " | %" PRIu32 " | %" PRIu32 " | %s |\n", p->name,
			  p->hf_id, p->layers, p->kv_heads_total, p->head_dim, p->dtype_bytes,
			  p->attention == KVR_ATTN_MLA ? "mla" : "mha");
	sb_printf(&b, "\n## Checks across keys\n\nMade after every key has parsed, in this order:\n\n");
	for (size_t i = 0; i < ARRAY_SIZE(checks_doc); i++)
		sb_printf(&b, "%zu. %s\n", i + 1, checks_doc[i]);
	return sb_finish(&b);
}
