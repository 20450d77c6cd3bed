/* kvring-bench internals: options, the synthetic workload and its byte pattern, statistics, results, report. */
#ifndef KVR_BENCH_H
#define KVR_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "kvr_ctl.h"
#include "kvr_geometry.h"
#include "kvr_segment.h"

/* ---- options (opts.c) ------------------------------------------------------------------ */

enum bench_phase { BENCH_COLD = 1u << 0, BENCH_WARM = 1u << 1 };

#define BENCH_REMOTE_SEEDS_MAX 16 /* remote.cluster's limits (docs/config.md) */
#define BENCH_REMOTE_SEED_LEN 64  /* 63 bytes + NUL */
#define BENCH_REMOTE_INFLIGHT 4   /* remote.max_inflight unless --remote-inflight */
#define BENCH_REMOTE_TIMEOUT_MS 5000 /* remote.timeout_ms: a 5 MiB SET on a busy 2-core box < 1 s */

struct bench_opts {
	const char *socket;      /* --socket; NULL with --spawn */
	bool spawn;              /* --spawn: start kvringd from the build tree */
	const char *kvringd;     /* --kvringd PATH (spawn); NULL = beside the build tree */
	const char *model;       /* --model preset name */
	uint32_t tp;             /* --tp: ranks, one process each */
	uint32_t block_tokens;
	uint32_t prompts;
	uint32_t input_len;      /* tokens per prompt */
	uint32_t prefix_len;     /* shared prefix tokens (<= input_len) */
	uint32_t concurrency;    /* prompts in flight per rank */
	uint32_t warm_concurrency; /* --warm-concurrency: the warm phase's (<= concurrency; 0 = concurrency) */
	uint64_t seed;
	unsigned phases;         /* enum bench_phase bits */
	const char *json;        /* --json FILE ("-" = stdout) */
	const char *plot;        /* --plot FILE.png; NULL = beside --json (see bench_plot_path) */
	bool no_plot;            /* --no-plot: no PNG, not even beside --json */
	bool quiet;
	bool dry_run;            /* print the plan, connect to nothing */
	bool allow_misses;       /* warm misses after a cold phase are not errors */
	bool cold_actors;        /* --cold-actors: time from attach, not after the actors populated */
	uint64_t l1_bytes;       /* --l1-bytes (spawn): 0 = workload + 25% */
	int64_t timeout_ms;      /* per-call ceiling and per-batch completion wait */
	bool evict;              /* --evict: small L1 + an L2 directory (with --spawn): both tiers serve */
	bool no_model;           /* --no-model: the spawned kvringd has no model section */
	uint32_t dcp;            /* --dcp: decode context parallel size D (divides tp; 1 = none) */
	uint32_t interleave;     /* --interleave: DCP interleave I (block_tokens % (D * I) == 0) */
	uint32_t load_dcp;       /* --load-dcp: the warm phase's D (0 = dcp): cross-layout loads */
	uint32_t load_interleave; /* --load-interleave: the warm phase's I (0 = interleave) */
	/* --remote SEEDS (spawn): the shared tier. Two instances, A and B, from the same config +
	 * a remote section naming these seeds; A stores, B loads from the cluster (bench.c) */
	char remote_seed[BENCH_REMOTE_SEEDS_MAX][BENCH_REMOTE_SEED_LEN];
	uint32_t n_remote;        /* 0: no --remote */
	uint32_t remote_inflight; /* --remote-inflight: remote.max_inflight (default 4) */
};

/* The warm phase's layout: load_dcp / load_interleave, or the store layout when not given. */
uint32_t bench_load_dcp(const struct bench_opts *o);
uint32_t bench_load_interleave(const struct bench_opts *o);

/* Defaults, then argv. Returns 0; 1 when --help was printed to out; -EINVAL with a one-line
 * reason in err (always NUL-terminated). Checks what needs no preset: --dcp and --load-dcp
 * divide --tp, and both layouts obey the DCP rule (kvr_dcp_check's reason in err). */
int bench_opts_parse(int argc, char **argv, struct bench_opts *ret, FILE *out, char *err, size_t errlen);

void bench_usage(FILE *f);

/* Parse "cold,warm" / "warm" / "cold" into enum bench_phase bits. 0 or -EINVAL. */
int bench_parse_phases(const char *s, unsigned *ret);

/* Parse --remote's comma-separated host:port list (1..BENCH_REMOTE_SEEDS_MAX entries, each
 * at most BENCH_REMOTE_SEED_LEN - 1 bytes, a host and a port 1..65535, IPv6 hosts in
 * brackets) into ret[]; *ret_n entries. 0 or -EINVAL with the reason in err. */
int bench_parse_seeds(const char *s, char ret[][BENCH_REMOTE_SEED_LEN], uint32_t *ret_n, char *err, size_t errlen);

/* Parse a byte size: integer with optional K/M/G/T suffix (binary: KiB...). 0 or -EINVAL/-ERANGE. */
int bench_parse_size(const char *s, uint64_t *ret);

/* ---- workload and pattern (pattern.c) --------------------------------------------------- */

/* A DCP layout of the ranks (D = 1: the plain, non-DCP one) and what it makes of one block. */
struct bench_layout {
	uint32_t dcp, interleave;      /* D, I */
	uint32_t groups;               /* tp / D */
	uint64_t rank_bytes;           /* one block's pages on one rank (rows + tails): kvr_geometry_lane_bytes */
	uint64_t kv_bytes;             /* one rank's KV memory */
	uint32_t runs;                 /* copy runs of one block on one rank (kvr_dcp_lane_runs) */
	uint64_t run_bytes;            /* the longest of them (I rows; D = 1: a whole page) */
};

/* What the options make, independent of any server. */
struct bench_plan {
	const struct kvr_preset *preset;
	struct bench_layout st;        /* the cold phase's layout (--dcp, --interleave) */
	struct bench_layout ld;        /* the warm phase's (--load-dcp, --load-interleave; default: st) */
	uint32_t storing_groups;       /* groups that store in the cold phase: all (MHA: one lane each) or 1 (MLA) */
	uint32_t full_blocks;          /* full blocks per prompt: input_len / block_tokens */
	uint32_t blocks_per_prompt;    /* engine blocks a prompt takes: ceil(input_len / block_tokens) */
	uint32_t num_blocks;           /* engine blocks per rank: concurrency x blocks_per_prompt */
	uint32_t prefix_blocks;        /* full blocks made only of shared-prefix tokens */
	uint32_t lanes;                /* tp / D (MHA) or 1 (MLA) */
	uint64_t lane_bytes;           /* one lane of a block: the canonical lane (D = 1: one rank's pages) */
	uint64_t block_bytes;          /* across every lane */
	uint64_t kv_bytes;             /* one rank's KV memory (the larger of the two layouts') */
	uint64_t unique_blocks;        /* distinct full blocks of the workload */
	uint64_t unique_bytes;         /* unique_blocks x block_bytes: what L1 must hold */
	uint64_t remote_value_bytes;   /* one lane as a Redis value (actors/remote/rvalue.h): header + lane_bytes */
};

/* Check the options against each other and the preset and derive the plan. -EINVAL with the
 * reason in err. Cross-layout loads (a warm layout other than the cold one) are refused for
 * MHA models when D differs (the instance's lanes are tp / D) and for presets with page
 * tails (those blocks load only under the layout that stored them). */
int bench_plan_make(const struct bench_opts *o, struct bench_plan *ret, char *err, size_t errlen);

/* Geometry of TP rank `rank` under DCP layout (dcp, interleave): the preset's vLLM layout for
 * block_tokens / dcp tokens a page (MHA: the heads of lane rank / dcp of tp / dcp lanes),
 * then block_tokens (the canonical block), tp_size, tp_rank and the DCP fields set. D = 1 is
 * the plain geometry. 0, -EINVAL (dcp does not divide tp or block_tokens) or what
 * kvr_preset_geometry returns. */
int bench_rank_geometry(const struct bench_opts *o, const struct bench_plan *pl, uint32_t rank, uint32_t dcp,
			uint32_t interleave, struct kvr_geometry *ret);

/* Tokens of prompt p (input_len of them): the shared prefix (prefix_len tokens, a function of
 * seed only), then tokens that are a function of (seed, p). */
void bench_prompt_tokens(const struct bench_opts *o, uint32_t p, uint32_t *ret_tokens);

/* Content seeds of the first n full blocks of tokens: s_i = XXH3_64(tokens of block i, seed
 * s_{i-1}), s_{-1} a constant. Identical prefixes give identical seeds. */
void bench_content_seeds(const uint32_t *tokens, uint32_t n_blocks, uint32_t block_tokens, uint64_t *ret_seeds);

/* Seed of a block's bytes in one lane (MLA: every rank holds the same bytes: lane ignored). The
 * lane of TP rank t is t / D (a DCP group stores one lane). */
uint64_t bench_block_seed(uint64_t content_seed, uint32_t lane, bool mla);

/* The pattern: byte `pos` of a lane is byte (pos % 8) of splitmix64(seed, pos / 8). Fill
 * dst[0..len) with lane bytes [pos, pos + len). */
void bench_pattern_fill(uint64_t seed, uint64_t pos, void *dst, size_t len);

/* Compare src[0..len) with the pattern of lane bytes [pos, pos + len). Returns the offset of the
 * first differing byte, or -1 when all match. */
int64_t bench_pattern_check(uint64_t seed, uint64_t pos, const void *src, size_t len);

/* Fill / check engine block `block` of a rank's KV memory kv. The bytes are those of the
 * block's canonical lane (its regions' canonical pages in order, kvr_dcp.h): under (D, I),
 * local row j of region i is global token t = kvr_dcp_global_token(j, D, I, dcp_rank) and
 * holds lane bytes [off_i + t * row, + row) of the pattern, off_i =
 * kvr_dcp_canonical_region_offset(g, i); the region's tail holds lane bytes
 * [off_i + block_tokens * row + dcp_rank * tail, + tail) of the pattern seeded by
 * bench_tail_seed(seed, D, I). So every row byte is a function of (block, region, GLOBAL
 * token, byte) and every tail byte of (block, region, layout, rank, byte): a row loaded at
 * the wrong place or a tail of another layout or rank fails the check. With D = 1 this is
 * the lane pattern: the pages in region order, bytes [0, lane_bytes). */
void bench_block_fill(const struct kvr_geometry *g, uint8_t *kv, uint32_t block, uint64_t seed);
bool bench_block_check(const struct kvr_geometry *g, const uint8_t *kv, uint32_t block, uint64_t seed);

/* The tail pattern's seed under (D, I): seed itself when D = 1, else seed mixed with D and I. */
uint64_t bench_tail_seed(uint64_t seed, uint32_t dcp, uint32_t interleave);
/* Zero engine block `block`; and whether every byte of it is zero. */
void bench_block_zero(const struct kvr_geometry *g, uint8_t *kv, uint32_t block);
bool bench_block_is_zero(const struct kvr_geometry *g, const uint8_t *kv, uint32_t block);

/* ---- statistics (stats.c) --------------------------------------------------------------- */

struct bench_dist {
	uint64_t n;
	double mean;
	uint64_t p50, p99, max;
};

/* Summarise v[0..n) (sorted in place): nearest-rank percentiles. All zero when n is 0. */
struct bench_dist bench_dist_of(uint64_t *v, size_t n);

/* The goals the report checks (docs/benchmarks.md). */
#define BENCH_STORE_GOAL_MIN 0.85    /* kvring store throughput / memcpy throughput */
#define BENCH_LOAD_GOAL_MAX 1.10     /* kvring load time / memcpy time */
#define BENCH_COPY_GOAL_MIN 0.70     /* DCP gather (store) and scatter (load, per rank) GB/s / memcpy GB/s */

/* bytes / ns in GB/s (10^9 bytes per second); 0 when ns is 0. */
double bench_gbps(uint64_t bytes, uint64_t ns);

/* ---- results (filled by the rank processes in a shared mapping) --------------------------- */

#define BENCH_ERR_MAX 256

/* Cold-phase counts (requests, tokens, blocks, stored, present, bytes, memcpy) are the storing
 * group's, kept by its DCP rank 0 (D = 1: every storing rank); errors and failed blocks are
 * every rank's own. */
struct bench_rank_result {
	uint64_t populate_wait_ns;  /* attach -> its loader and storer populated their mappings */
	/* cold */
	uint64_t st_requests, st_tokens, st_blocks, st_stored, st_present;
	uint64_t st_bytes;          /* newly stored bytes (n_stored x lane_bytes: canonical lanes) */
	uint64_t st_ns;             /* sum of batch windows: the group's first submit -> its last completion */
	uint64_t batch_t0, batch_t1; /* this rank's window of the current batch, for its group's rank 0 */
	uint64_t st_fill_ns;        /* pattern generation, outside the windows */
	uint64_t st_errors, st_failed_blocks;
	uint64_t st_memcpy_ns;      /* the same bytes, same pieces (every rank's runs), one memcpy thread */
	uint64_t st_samples;        /* store completions with samples: entries used in bench_samples.st_lat_ns */
	uint64_t st_first_ns;       /* kvr_now_ns() of the first store submit (0: none): --remote's write window */
	/* warm */
	uint64_t ld_requests, ld_tokens, ld_matched_tokens, ld_matched_blocks;
	uint64_t ld_l2_blocks;      /* matched blocks the lookup promoted from L2 */
	uint64_t ld_bytes;          /* loaded bytes (loaded blocks x the rank's page bytes of a block) */
	uint64_t ld_ns;             /* sum of batch windows: first lookup -> last completion */
	uint64_t ld_load_ns;        /* sum of batch windows: first load submit -> last completion */
	uint64_t ld_lookup_ns;      /* sum of batch windows: first lookup -> the last lookup's answer (promotions) */
	uint64_t ld_group_ns;       /* group's rank 0: sum of its group's load windows (earliest submit, latest completion) */
	uint64_t ld_group_memcpy_ns; /* group's rank 0: its group's loaded bytes, every rank's runs, one memcpy thread */
	uint64_t ld_errors, ld_failed_blocks, ld_mismatch_blocks, ld_stray_blocks, ld_exact_prompts;
	uint64_t ld_failed_written_blocks; /* failed blocks found written (undefined: not an error) */
	uint64_t ld_memcpy_ns;      /* the rank's loaded bytes, its pieces (copy runs), memcpy */
	uint64_t ld_verify_ns;
	uint64_t ld_samples;        /* lookups with samples: entries used in struct bench_samples */
	char err[BENCH_ERR_MAX];    /* the first error, for the report */
};

/* Per-request samples of one rank (arrays of `prompts` each, in the shared mapping). */
struct bench_samples {
	uint64_t *lat_ns;    /* warm: lookup + load completion (ld_samples entries) */
	uint64_t *hash_ns;
	uint64_t *index_ns;
	uint64_t *rt_ns;
	uint64_t *st_lat_ns; /* cold: store submit -> completion (st_samples entries; may be NULL when 0) */
};
#define BENCH_SAMPLE_ARRAYS 5 /* uint64_t arrays of `prompts` entries in struct bench_samples */

/* --remote: the shared tier, from both instances' counters (bench.c collects the raw ones,
 * bench_remote_summarise derives the rest and the errors). */
struct bench_remote {
	bool ran;
	uint32_t seeds, inflight;    /* --remote's nodes, remote.max_inflight */
	uint64_t value_bytes;        /* one lane's Redis value: the 128-byte header + lane_bytes */
	/* A: the write-through of the cold phase */
	uint64_t wr_expected;        /* lanes newly stored on A (the cold phase's stored_blocks) */
	uint64_t wr_handed, wr_skipped;           /* A lookup: LK_RM_WRITES, LK_RM_WRITES_SKIPPED */
	uint64_t wr_acked, wr_errors, wr_stale;   /* A remote: RM_WRITES, RM_WRITE_ERRORS, RM_WRITES_STALE */
	uint64_t wr_bytes;           /* A remote: RM_BYTES_OUT (payload bytes of acknowledged SETs) */
	uint64_t wr_ns;              /* the first store's submit -> the last acknowledgement seen (1 ms polls) */
	uint64_t wr_tail_ns;         /* the cold phase's end (every store completed) -> that acknowledgement */
	bool wr_settled;             /* every lane handed over was answered before the timeout */
	double wr_gbps;              /* wr_bytes / wr_ns */
	/* B: the promotions of its warm phase */
	uint64_t rd_expected;        /* lanes B must read from the cluster: distinct blocks x lanes */
	uint64_t rd_reads, rd_hits, rd_misses, rd_bad, rd_errors; /* B remote: RM_READS .. RM_READ_ERRORS */
	uint64_t rd_bytes;           /* B remote: RM_BYTES_IN (payload bytes copied into slots) */
	uint64_t rd_lk_reads;        /* B lookup: LK_RM_READS */
	uint64_t rd_ns;              /* B's lookup windows (ld_lookup_ns of its slowest rank) */
	double rd_gbps;              /* rd_bytes / rd_ns */
	/* B's warm phase (every block from the cluster) against A's (L1 hits) */
	uint64_t b_bytes, b_ns, b_prompts, b_exact, b_missed, b_errors;
	double b_gbps, a_gbps;       /* loaded bytes / the warm phase (lookups + loads) */
	struct bench_dist b_lat, a_lat; /* per prompt: lookup + load */
	double p50_ratio, p99_ratio; /* B / A */
	uint64_t errors;             /* what failed in the tier (counted into the run's errors) */
};

/* The whole run, summarised (report.c). */
struct bench_summary {
	bool ran_cold, ran_warm;
	uint64_t populate_wait_ns;   /* the slowest rank's wait for its actors to populate (0: not waited) */
	/* cold */
	uint64_t st_requests, st_tokens, st_blocks, st_stored, st_present, st_bytes, st_ns, st_fill_ns;
	uint64_t st_errors, st_failed_blocks, st_memcpy_ns;
	double st_gbps, st_memcpy_gbps, st_ratio; /* ratio: kvring GB/s / memcpy GB/s */
	struct bench_dist st_lat;    /* store completion latency per request */
	/* warm */
	uint64_t ld_requests, ld_tokens, ld_matched_tokens, ld_matched_blocks, ld_bytes, ld_ns, ld_memcpy_ns;
	uint64_t ld_errors, ld_failed_blocks, ld_mismatch_blocks, ld_stray_blocks, ld_exact_prompts, ld_misses;
	uint64_t ld_failed_written_blocks; /* failed blocks found written: undefined, the engine recomputes them */
	uint64_t ld_l2_blocks, ld_l1_hits, ld_l1_misses; /* tiers: L1 hits + L2 reads = matched blocks */
	double hit_rate, ld_gbps, ld_memcpy_gbps, ld_time_ratio; /* ratio: kvring time / memcpy time */
	uint64_t ld_load_ns;         /* the slowest rank's load windows (lookups not included) */
	uint64_t ld_lookup_ns;       /* the slowest rank's lookup windows (first lookup -> last answer) */
	double ld_load_gbps, ld_load_ratio; /* ld_bytes / ld_load_ns; ld_load_gbps / ld_memcpy_gbps */
	double ld_rank_ratio[KVR_MAX_TP];   /* per rank: its load GB/s / its memcpy GB/s (= memcpy / load time) */
	double ld_rank_ratio_min;           /* the smallest of them (ranks that loaded) */
	uint64_t ld_group_ns, ld_group_memcpy_ns; /* the slowest group's load windows and one-thread memcpy */
	double ld_group_gbps, ld_group_memcpy_gbps, ld_group_ratio; /* ld_bytes over them; gbps / memcpy gbps */
	struct bench_dist lat, hash, index, rt;
	uint64_t hash_index_p50_ns;  /* p50 of hash + index per lookup */
	uint64_t errors;             /* every error of the run, spawn and exit status included */
	bool exact;                  /* warm phase: every prompt matched exactly */
	bool ok;                     /* exit 0 */
	struct bench_remote rm;      /* --remote (bench_remote_summarise); rm.ran false otherwise */
};

/* Combine the ranks' results and samples (samples[r] for rank r; the samples are not changed). */
void bench_summarise(const struct bench_opts *o, const struct bench_plan *pl, const struct bench_rank_result *res,
		     struct bench_samples *samples, uint64_t extra_errors, struct bench_summary *ret);

/* --remote: s is instance A's summary (its cold phase and its warm phase over L1 hits), b
 * instance B's (its warm phase only, every block from the cluster), rm the raw counters.
 * Derives rm's rates and the B / A comparison, counts what failed into rm->errors (a lane
 * not acknowledged or skipped, a read that was not a hit, B missing or mismatching a
 * block, B's hits other than rd_expected) and stores rm in s, s->errors and s->ok
 * included. */
void bench_remote_summarise(const struct bench_plan *pl, const struct bench_summary *b, const struct bench_remote *rm,
			    struct bench_summary *s);

/* The readable table (fits 100 columns): the phases (bench_print_phases), then
 * bench_print_tail: the shared tier when s->rm.ran, the result line. */
void bench_print_header(FILE *f, const struct bench_opts *o, const struct bench_plan *pl);
void bench_print_table(FILE *f, const struct bench_opts *o, const struct bench_plan *pl,
		       const struct bench_summary *s);
void bench_print_phases(FILE *f, const struct bench_opts *o, const struct bench_plan *pl,
			const struct bench_summary *s);
void bench_print_tail(FILE *f, const struct bench_summary *s);

/* The JSON document (keys documented in docs/benchmarks.md; "remote" null unless s->rm.ran).
 * Caller frees. NULL on ENOMEM. */
char *bench_json(const struct bench_opts *o, const struct bench_plan *pl, const struct bench_summary *s);

/* Every rank's samples of one kind in one array (caller frees; NULL with *ret_n = 0 when there
 * are none or on ENOMEM): warm = lookup + load latency, else store completion latency. */
uint64_t *bench_samples_merge(const struct bench_opts *o, const struct bench_rank_result *res,
			      const struct bench_samples *samples, bool warm, size_t *ret_n);

/* ---- plot (plot.c) ------------------------------------------------------------------------ */

/* What the PNG shows: the latency samples of each phase (sorted in place by the writers) and the
 * summary's throughputs. */
struct bench_plot_input {
	const struct bench_opts *o;
	const struct bench_plan *pl;
	const struct bench_summary *s;
	uint64_t *cold_ns;     /* store completion latency per request; n_cold entries */
	size_t n_cold;
	uint64_t *warm_ns;     /* lookup + load latency per request; n_warm entries */
	size_t n_warm;
	time_t when;           /* the date in the title (local time) */
};

/* Where the PNG goes: --plot FILE; else, with --json FILE (not "-") and no --no-plot, FILE with a
 * trailing ".json" replaced by ".png" (or ".png" appended). Writes the path to ret (NUL-terminated)
 * and returns 1; 0 when there is no plot; -ENAMETOOLONG when it does not fit len. */
int bench_plot_path(const struct bench_opts *o, char *ret, size_t len);

/* The data file gnuplot reads, made of data sets separated by two blank lines, in this order:
 *   "throughput": one line per phase run: `store|load kvring_gbps memcpy_gbps` (%.4f)
 *   "cold latency" (when n_cold > 0), "warm latency" (when n_warm > 0): the empirical CDF, one
 *     line `ns fraction` per sample in ascending order (fraction = (i+1)/n, %.6f), after a first
 *     line `min_ns 0.000000`.
 * Each set starts with a comment line naming it. Sorts the sample arrays. 0 or -EIO. */
int bench_plot_write_data(FILE *f, struct bench_plot_input *in);

/* The gnuplot script that turns data_path into png_path (pngcairo when gnuplot has it, else png).
 * Call after bench_plot_write_data (the samples sorted). Caller frees. NULL on ENOMEM. */
char *bench_plot_script(const struct bench_plot_input *in, const char *data_path, const char *png_path);

/* The first executable `name` in the colon list path_env (NULL or "" = not found). Writes its path
 * to ret; 0, -ENOENT, or -ENAMETOOLONG. */
int bench_which(const char *name, const char *path_env, char *ret, size_t len);

/* Write the data to a temp file and run gnuplot (found in $PATH) on the script, fed on its stdin.
 * 0; -ENOENT when gnuplot is not installed; otherwise -errno with the reason in err (gnuplot's
 * first error line when it failed). */
int bench_plot(struct bench_plot_input *in, const char *png_path, char *err, size_t errlen);

/* ---- rank processes (rank.c) ----------------------------------------------------------- */

/* A process-shared barrier in a MAP_SHARED anonymous mapping (futex; no spinning). */
struct bench_barrier {
	_Atomic uint32_t arrived;
	_Atomic uint32_t gen;
	_Atomic uint32_t abort;
	uint32_t parties;
};

void bench_barrier_init(struct bench_barrier *b, uint32_t parties);
/* Wait for every party. 0, -ECANCELED when aborted, -ETIMEDOUT after timeout_ms. */
int bench_barrier_wait(struct bench_barrier *b, int64_t timeout_ms);
/* Make every current and future wait return -ECANCELED. */
void bench_barrier_abort(struct bench_barrier *b);

/* Everything a rank process needs; the result and samples live in shared memory. */
struct bench_rank_ctx {
	const struct bench_opts *o;
	const struct bench_plan *pl;
	const char *socket;
	uint32_t rank;
	struct bench_barrier *barrier;
	struct bench_rank_result *res;
	struct bench_rank_result *all;  /* every rank's result (tp), res among them: a group's rank 0 reads its group's */
	struct bench_samples samples;
	struct bench_barrier *gate;     /* NULL, or tp + 1 parties: after the cold phase every rank waits here
					 * for the parent before its store baseline (--remote: the parent
					 * first waits for the cluster's acknowledgements, undisturbed) */
};

/* Run rank ctx->rank: attach, the phases with their baselines, detach. Returns 0 when the
 * rank ran every phase (errors inside phases are counted in res), or -errno after recording
 * the reason in res->err and aborting the barrier. */
int bench_rank_run(struct bench_rank_ctx *ctx);

/* ---- kvringd (spawn.c) ---------------------------------------------------------------- */

struct bench_server {
	int pid;
	char name[16];        /* "kvringd", "kvringd A": for messages */
	char dir[64];         /* temp dir: config, socket, log */
	char socket[108];
	char log[128];
	struct kvr_segment ctl_seg; /* bench_server_ctl: its control segment, read-only */
	struct kvr_ctl *ctl;        /* NULL until then */
};

/* Write the config and start kvringd; wait until its socket accepts (up to timeout_ms). name
 * labels its messages (at most 15 bytes). Call once per instance: each gets its own temp dir,
 * socket, log and arena. 0, or -errno with the reason in err (the log's tail is printed to
 * stderr). */
int bench_server_start(const struct bench_opts *o, const struct bench_plan *pl, const char *name,
		       struct bench_server *ret, char *err, size_t errlen);
/* SIGTERM, wait (up to timeout_ms, then SIGKILL) and remove the temp dir. The log's tail goes
 * to stderr when show_log is set or kvringd did not exit 0. Returns the exit status (0..255),
 * or -ETIMEDOUT (killed after the timeout) / -EINTR (it died by a signal) / -errno. */
int bench_server_stop(struct bench_server *s, int64_t timeout_ms, bool show_log, char *err, size_t errlen);

/* Map the control segment of a started server read-only (INSPECT over its socket, as
 * kvring-inspect does), once; bench_server_stop unmaps it. 0 or -errno with the reason in err. */
int bench_server_ctl(struct bench_server *s, char *err, size_t errlen);
/* Counter `stat` of the actor named `actor` (ipc/kvr_ctl.h's enums); 0 when there is no such
 * actor or no mapping (bench_server_ctl first). */
uint64_t bench_server_stat(const struct bench_server *s, const char *actor, unsigned stat);

/* The config JSON --spawn writes (exposed for tests): the model preset with the canonical
 * block (model.tp_size: tp, or the lanes tp / dcp for MHA), max_workers tp (2 x tp when the
 * warm layout differs from the cold one: every rank attaches again); with --remote a remote
 * section (the seeds, timeout_ms BENCH_REMOTE_TIMEOUT_MS, max_inflight --remote-inflight).
 * Caller frees. */
char *bench_server_config(const struct bench_opts *o, const struct bench_plan *pl, const char *socket);

#endif
