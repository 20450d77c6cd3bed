/* kvr_config: kvringd's JSON configuration — one table of keys drives parsing, defaults, checks and docs. */
#ifndef KVR_CONFIG_H
#define KVR_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The effective configuration. Every field has exactly one row in the key table in
 * config.c (JSON path, type, default, range, one-line doc); parsing, the defaults,
 * --check-config output and docs/config.md all come from that table.
 *
 * Parsing is strict: an unknown key, a wrong type, a value out of range or inconsistent
 * values fail with the JSON path and the reason, e.g.
 *   "$.supervisor.restart_backoff_max_ms: out of range: 0 (must be 1..600000)"
 * Nothing is silently changed or clamped.
 */

#define KVR_PATH_MAX 108 /* sun_path */
/* instance.socket's default, and where libkvring connects when a client names no socket
 * (libkvring needs only this of the configuration: it links no JSON parser). */
#define KVR_CONFIG_DEFAULT_SOCKET "/tmp/kvring.sock"
#define KVR_STR_MAX 128
#define KVR_L2_MAX_DIRS 8
#define KVR_REMOTE_MAX_SEEDS 16

/* l2.durability as a number (the disk tier's enum kvr_l2_durability has the same values:
 * actors/disk asserts it). */
enum kvr_cfg_durability {
	KVR_CFG_DUR_NONE = 0,
	KVR_CFG_DUR_BLOCK = 1,
	KVR_CFG_DUR_BATCH = 2,
};

/* l1.eviction as a number: the lookup actor's eviction policy. */
enum kvr_cfg_eviction {
	KVR_CFG_EVICT_LRU = 0,
	KVR_CFG_EVICT_S3FIFO = 1,
};

/*
 * Enum-valued keys stay strings in the struct (the effective JSON and the logs show them
 * as written) and are also parsed once, by kvr_config_parse() and kvr_config_defaults(),
 * into the "derived" fields next to them: code tests those, never the strings.
 */

struct kvr_config {
	struct {
		char socket[KVR_PATH_MAX];   /* Unix socket workers attach to */
		uint32_t socket_mode;        /* permission bits of the socket, default 0600 */
		uint32_t max_workers;        /* attachable worker slots (one loader+storer each) */
		uint32_t max_schedulers;     /* attachable scheduler slots (lookups and leases only) */
		char log_level[16];          /* error|warn|info|debug */
		int log_level_id;            /* derived: enum kvr_log_level of log_level */
		char actor_dir[KVR_PATH_MAX];/* where the actor executables live ("" = built-in) */
	} instance;
	struct {
		uint32_t capacity;           /* messages per ring, power of two */
		uint32_t spin_ns;            /* bounded spin before a waiter sleeps on its futex */
	} rings;
	struct {
		uint32_t ready_timeout_ms;       /* an actor that is not ready by then is killed */
		uint32_t stable_after_ms;        /* ready this long => restarted at once when it dies */
		uint32_t restart_backoff_initial_ms;
		uint32_t restart_backoff_max_ms;
		uint32_t crash_loop_window_s;    /* deaths counted within this window... */
		uint32_t crash_loop_max_deaths;  /* ...and this many give up on the actor */
		uint32_t health_interval_ms;     /* ping period */
		uint32_t drain_timeout_ms;       /* SIGTERM: how long in-flight work may finish */
		uint32_t attach_timeout_ms;      /* a connection not attached by then is closed */
	} supervisor;
	struct {
		char preset[KVR_STR_MAX];    /* model preset name, "" = explicit geometry below */
		char model_id[KVR_STR_MAX];  /* goes into the key namespace */
		uint32_t layers;
		uint32_t kv_heads;           /* total KV heads (all TP ranks) */
		uint32_t head_dim;
		uint32_t dtype_bytes;
		uint32_t block_tokens;
		uint32_t tp_size;
		char attention[8];           /* "mha" (MHA/GQA) or "mla" */
		char kv_layout[16];          /* "kv-split" (K page, V page per layer) or "kv-fused" (one page) */
		bool mla;                    /* derived: attention is "mla" */
		bool kv_fused;               /* derived: kv_layout is "kv-fused" */
		bool unbound;                /* derived: no preset and no geometry: kvringd lays L1 out for the
					      * geometry of the first worker that attaches (docs/engines.md) */
		char cache_salt[KVR_STR_MAX];
	} model;
	struct {
		uint64_t capacity_bytes;     /* arena bytes; 0 = derive from workload below */
		uint64_t slot_bytes;         /* one slot (block lane); 0 = the model's or the first worker's lane */
		uint32_t workload_prompts;   /* derive capacity: prompts x tokens */
		uint32_t workload_tokens;
		bool huge_pages;             /* try MFD_HUGETLB for the arena */
		char prefault[16];           /* "background" or "off" */
		bool prefault_background;    /* derived: prefault is "background" */
		char eviction[16];           /* "lru" or "s3fifo" */
		enum kvr_cfg_eviction eviction_id; /* derived: eviction */
		uint32_t max_leases;         /* lookup leases held at once (the lookup actor's table) */
	} l1;
	struct {
		uint64_t ceiling_bytes;      /* staging ceiling per worker */
		uint32_t load_percent;       /* share of the ceiling for the load pool */
		uint64_t buffer_bytes;       /* one staging buffer (lease); 0 = one block */
	} staging;
	struct {
		uint32_t store_timeout_ms;   /* a DCP store waits this long for every rank's shard */
	} dcp;
	struct {
		uint32_t n_dirs;
		char dirs[KVR_L2_MAX_DIRS][KVR_PATH_MAX];
		uint64_t capacity_bytes;     /* L2 byte cap across dirs */
		char mode[16];               /* "write-through" or "write-back" */
		char durability[16];         /* "none", "block", "batch" */
		bool write_back;             /* derived: mode is "write-back" */
		enum kvr_cfg_durability durability_id; /* derived: durability */
		uint32_t queue_depth;
		bool read_only;              /* serve what is on disk, never change it (docs/l2.md) */
	} l2;
	struct {                         /* the shared tier (docs/cluster.md) */
		uint32_t n_cluster;          /* 0 = no remote tier */
		char cluster[KVR_REMOTE_MAX_SEEDS][64]; /* seed nodes "host:port" */
		char mode[16];               /* "write-through" (the only mode so far) */
		uint32_t timeout_ms;         /* one request (connect, GET, SET) */
		uint32_t max_inflight;       /* requests in flight over all nodes */
		uint32_t ttl_s;              /* 0 = no expiry */
		char user[64];
		char password[KVR_STR_MAX];
		bool tls;                    /* always false (refused at load) */
	} remote;
	struct {
		bool enabled;
		char listen[64];             /* "127.0.0.1:9464" */
	} metrics;
	struct {                         /* every deadline of the data path, in one place */
		uint32_t reply_ms;           /* an actor's reply ring full this long: its reader is gone */
		uint32_t alloc_wait_ms;      /* a store's ALLOC (a promotion) waits this long for room */
		uint32_t l2_answer_ms;       /* an L2 read/write unanswered this long was lost */
		uint32_t lookup_call_ms;     /* a storer waits this long for the lookup actor's answer */
	} timeouts;
};

/* Fill *cfg with every default. */
void kvr_config_defaults(struct kvr_config *cfg);

/* Parse JSON text over the defaults. Returns 0, or -EINVAL with a one-line reason
 * ("$.path: why") in err (always NUL-terminated), -ENOMEM. *cfg is untouched on failure.
 * One UTF-8 byte-order mark at the very start is accepted on purpose (editors write it);
 * anywhere else, or twice, it is refused with its position.
 * Pure: it never looks at the filesystem (the actors re-parse the copy kvringd embeds in the
 * control segment, and must not fail over a disk that changed under a running instance). */
int kvr_config_parse(const char *json, struct kvr_config *cfg, char *err, size_t errlen);

/* The checks that need the filesystem, made by kvr_config_load_file (so by kvringd and
 * --check-config): no two l2.dirs entries are one directory by (st_dev, st_ino) — a symlink,
 * a bind mount — nor the same path below one existing directory (a symlinked parent of a dir
 * that is not created yet). A path that does not exist at all is compared by its text only
 * (kvr_config_parse already refuses "/x/l2" next to "/x/l2/" or "/x/./l2"). 0 or -EINVAL with
 * "$.l2.dirs[j]: duplicate of $.l2.dirs[i]: ..." in err. */
int kvr_config_check_fs(const struct kvr_config *cfg, char *err, size_t errlen);

/* Read a file, parse it and make kvr_config_check_fs. -ENOENT/-EACCES/-EINVAL/... with the
 * reason in err; *cfg is untouched on failure. */
int kvr_config_load_file(const char *path, struct kvr_config *cfg, char *err, size_t errlen);

/* The effective config as pretty JSON (every key, defaults filled in). Caller frees. */
char *kvr_config_to_json(const struct kvr_config *cfg);

/* docs/config.md body generated from the key table (markdown). Caller frees. */
char *kvr_config_doc_markdown(void);

/* The checks of sizes against one block of lane_bytes (one TP rank's block): each staging
 * pool holds a buffer, each L2 dir's share a block file. kvr_config_parse makes them for the
 * configured model; kvringd makes them again when an instance without a model binds to the
 * first worker's geometry. 0 or -EINVAL with err naming the key and the sizes. */
int kvr_config_check_block(const struct kvr_config *cfg, uint64_t lane_bytes, char *err, size_t errlen);

/* A config duration in ms as CLOCK_MONOTONIC nanoseconds. */
static inline uint64_t kvr_ms_to_ns(uint32_t ms)
{
	return (uint64_t)ms * 1000000ull;
}

#endif
