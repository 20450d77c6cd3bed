/* kvring-bench command line: defaults, parsing and checks of single options. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_dcp.h"
#include "kvr_log.h"
#include "bench.h"

void bench_usage(FILE *f)
{
	fprintf(f,
		"usage: kvring-bench [--socket PATH | --spawn] [options]\n"
		"\n"
		"Drives kvringd like tp inference workers would (one process per TP rank): a cold phase\n"
		"stores every prompt's KV blocks, a warm phase looks them up, loads them back and checks\n"
		"every loaded byte. Each phase is measured against memcpy of the same bytes in the same\n"
		"pieces, in the same run. Exit 0 only when every loaded block matched and nothing failed.\n"
		"\n"
		"  --socket PATH        attach to a running kvringd (default: its default socket)\n"
		"  --spawn              start kvringd from the build tree on a generated config, stop it\n"
		"                       with SIGTERM at the end and require exit status 0\n"
		"  --kvringd PATH       the kvringd to spawn (default: <build>/supervisor/kvringd)\n"
		"  --l1-bytes SIZE      spawn: L1 capacity (default: the workload's blocks + 25%%)\n"
		"  --model PRESET       model geometry (default qwen3-8b): %s\n"
		"  --tp N               tensor-parallel ranks, one process each (default 1)\n"
		"  --block-tokens N     tokens per block (default 128)\n"
		"  --prompts N          prompts (default 8)\n"
		"  --input-len TOKENS   tokens per prompt (default 1024)\n"
		"  --prefix-len TOKENS  tokens of a prefix every prompt shares (default 512)\n"
		"  --concurrency N      prompts in flight per rank (default 2)\n"
		"  --warm-concurrency N the warm phase's prompts in flight (default --concurrency; at most\n"
		"                       that): 1 measures each prompt's lookup + load alone\n"
		"  --seed N             workload seed (default 1)\n"
		"  --phases LIST        cold,warm (default), cold or warm\n"
		"  --allow-misses       warm misses after a cold phase are not errors (L1 smaller than\n"
		"                       the workload), nor blocks evicted between lookup and load\n"
		"  --cold-actors        start timing right after attach: the worker's loader and storer\n"
		"                       fault their mappings in on first use (default: wait until they\n"
		"                       populated them, as before an engine's first request)\n"
		"  --timeout-ms MS      per-call ceiling and completion wait (default 30000)\n"
		"  --json FILE          write the results as JSON (\"-\": stdout)\n"
		"  --plot FILE.png      draw latency CDFs and throughput against memcpy with gnuplot\n"
		"                       (default with --json FILE: FILE.png beside it, .json replaced)\n"
		"  --no-plot            no PNG, not even beside --json\n"
		"  --quiet              no table\n"
		"  --dry-run            print the workload plan and exit; connects to nothing\n"
		"  --evict              with --spawn: L1 a third of the workload + an L2 directory\n"
		"  --no-model           with --spawn: a config without a model section (L1 laid out for\n"
		"                       the first rank that attaches)\n"
		"  --dcp N              decode context parallel size: groups of N consecutive TP ranks,\n"
		"                       each rank holds 1/N of every block's tokens (default 1; divides --tp)\n"
		"  --interleave N       DCP interleave: a rank holds runs of N consecutive tokens (default 1;\n"
		"                       --block-tokens must be a multiple of --dcp x --interleave)\n"
		"  --load-dcp N         the warm phase's DCP size (default --dcp): load under another layout\n"
		"  --load-interleave N  the warm phase's interleave (default --interleave; 1 without DCP)\n"
		"  --remote SEEDS       with --spawn: the shared tier on the Redis Cluster of these nodes\n"
		"                       (host:port,...): two instances A and B; the cold phase on A, wait\n"
		"                       until the cluster acknowledged every lane (remote write GB/s),\n"
		"                       warm on B, every block from the cluster (remote read GB/s),\n"
		"                       then warm on A (L1 hits) for comparison\n"
		"  --remote-inflight N  remote.max_inflight of both instances (default %u)\n"
		"  --help               this text\n",
		kvr_preset_list(), BENCH_REMOTE_INFLIGHT);
}

static int parse_u64(const char *s, uint64_t *ret)
{
	if (!s || !*s || *s == '-' || *s == '+')
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end)
		return errno == ERANGE ? -ERANGE : -EINVAL;
	*ret = v;
	return 0;
}

static int parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *ret)
{
	uint64_t v;
	int rc = parse_u64(s, &v);
	if (rc)
		return rc;
	if (v < min || v > max)
		return -ERANGE;
	*ret = (uint32_t)v;
	return 0;
}

int bench_parse_size(const char *s, uint64_t *ret)
{
	if (!s || !*s || *s == '-' || *s == '+')
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return errno == ERANGE ? -ERANGE : -EINVAL;
	unsigned shift = 0;
	if (*end) {
		switch (*end) {
		case 'K': shift = 10; break;
		case 'M': shift = 20; break;
		case 'G': shift = 30; break;
		case 'T': shift = 40; break;
		default: return -EINVAL;
		}
		end++;
		if (!strcmp(end, "iB") || !strcmp(end, "B"))
			end += strlen(end);
		if (*end)
			return -EINVAL;
	}
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*ret = (uint64_t)v << shift;
	return 0;
}

int bench_parse_seeds(const char *s, char ret[][BENCH_REMOTE_SEED_LEN], uint32_t *ret_n, char *err, size_t errlen)
{
	uint32_t n = 0;
	const char *p = s;
	if (!s || !*s)
		return kvr_errf(err, errlen, -EINVAL, "--remote: empty list");
	for (;;) {
		size_t len = strcspn(p, ",");
		if (n == BENCH_REMOTE_SEEDS_MAX)
			return kvr_errf(err, errlen, -EINVAL, "--remote: more than %u nodes", BENCH_REMOTE_SEEDS_MAX);
		if (!len || len >= BENCH_REMOTE_SEED_LEN)
			return kvr_errf(err, errlen, -EINVAL, "--remote: \"%.*s\": want host:port of at most %u bytes",
					(int)len, p, BENCH_REMOTE_SEED_LEN - 1);
		char e[BENCH_REMOTE_SEED_LEN];
		memcpy(e, p, len);
		e[len] = '\0';
		char *colon = strrchr(e, ':');
		uint32_t port;
		if (!colon || colon == e || parse_u32(colon + 1, 1, 65535, &port) ||
		    (e[0] == '[' && colon[-1] != ']'))
			return kvr_errf(err, errlen, -EINVAL, "--remote: \"%s\": want host:port (port 1..65535)", e);
		for (uint32_t i = 0; i < n; i++)
			if (!strcmp(ret[i], e))
				return kvr_errf(err, errlen, -EINVAL, "--remote: %s given twice", e);
		memcpy(ret[n++], e, len + 1);
		p += len;
		if (!*p)
			break;
		p++; /* the comma: a trailing one leaves an empty entry, refused above */
	}
	*ret_n = n;
	return 0;
}

int bench_parse_phases(const char *s, unsigned *ret)
{
	if (!s || !*s)
		return -EINVAL;
	unsigned bits = 0;
	const char *p = s;
	while (*p) {
		size_t len = strcspn(p, ",");
		if (len == 4 && !strncmp(p, "cold", 4))
			bits |= BENCH_COLD;
		else if (len == 4 && !strncmp(p, "warm", 4))
			bits |= BENCH_WARM;
		else
			return -EINVAL;
		p += len;
		if (*p == ',') {
			p++;
			if (!*p)
				return -EINVAL;
		}
	}
	*ret = bits;
	return 0;
}

uint32_t bench_load_dcp(const struct bench_opts *o)
{
	return o->load_dcp ? o->load_dcp : o->dcp;
}

uint32_t bench_load_interleave(const struct bench_opts *o)
{
	if (o->load_interleave)
		return o->load_interleave;
	return bench_load_dcp(o) > 1 ? o->interleave : 1; /* without DCP the interleave is 1 (kvr_geometry.h) */
}

/* A DCP group is D consecutive TP ranks, and every rank must hold block_tokens / D tokens of
 * every block (kvr_dcp.h's rule). */
static int check_layout(const struct bench_opts *o, const char *dname, uint32_t d, const char *iname, uint32_t il,
			char *err, size_t errlen)
{
	if (o->tp % d)
		return kvr_errf(err, errlen, -EINVAL, "%s %u does not divide --tp %u (a DCP group is %u consecutive TP ranks)",
				dname, d, o->tp, d);
	char why[160];
	if (kvr_dcp_check(o->block_tokens, d, il, why, sizeof(why)))
		return kvr_errf(err, errlen, -EINVAL, "%s %u %s %u with --block-tokens %u: %s", dname, d, iname, il,
				o->block_tokens, why);
	return 0;
}

enum {
	OPT_SOCKET = 256, OPT_SPAWN, OPT_KVRINGD, OPT_L1_BYTES, OPT_MODEL, OPT_TP, OPT_BLOCK_TOKENS, OPT_PROMPTS,
	OPT_INPUT_LEN, OPT_PREFIX_LEN, OPT_CONCURRENCY, OPT_SEED, OPT_PHASES, OPT_JSON, OPT_QUIET, OPT_DRY_RUN,
	OPT_ALLOW_MISSES, OPT_COLD_ACTORS, OPT_TIMEOUT, OPT_EVICT, OPT_DCP, OPT_INTERLEAVE, OPT_LOAD_DCP, OPT_LOAD_INTERLEAVE, OPT_PLOT,
	OPT_NO_PLOT, OPT_REMOTE, OPT_REMOTE_INFLIGHT, OPT_WARM_CONCURRENCY, OPT_NO_MODEL, OPT_HELP,
};

static const struct option long_opts[] = {
	{"socket", required_argument, NULL, OPT_SOCKET},
	{"spawn", no_argument, NULL, OPT_SPAWN},
	{"kvringd", required_argument, NULL, OPT_KVRINGD},
	{"l1-bytes", required_argument, NULL, OPT_L1_BYTES},
	{"model", required_argument, NULL, OPT_MODEL},
	{"tp", required_argument, NULL, OPT_TP},
	{"block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS},
	{"prompts", required_argument, NULL, OPT_PROMPTS},
	{"input-len", required_argument, NULL, OPT_INPUT_LEN},
	{"prefix-len", required_argument, NULL, OPT_PREFIX_LEN},
	{"concurrency", required_argument, NULL, OPT_CONCURRENCY},
	{"seed", required_argument, NULL, OPT_SEED},
	{"phases", required_argument, NULL, OPT_PHASES},
	{"json", required_argument, NULL, OPT_JSON},
	{"plot", required_argument, NULL, OPT_PLOT},
	{"no-plot", no_argument, NULL, OPT_NO_PLOT},
	{"quiet", no_argument, NULL, OPT_QUIET},
	{"dry-run", no_argument, NULL, OPT_DRY_RUN},
	{"allow-misses", no_argument, NULL, OPT_ALLOW_MISSES},
	{"cold-actors", no_argument, NULL, OPT_COLD_ACTORS},
	{"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
	{"evict", no_argument, NULL, OPT_EVICT},
	{"no-model", no_argument, NULL, OPT_NO_MODEL},
	{"dcp", required_argument, NULL, OPT_DCP},
	{"interleave", required_argument, NULL, OPT_INTERLEAVE},
	{"load-dcp", required_argument, NULL, OPT_LOAD_DCP},
	{"load-interleave", required_argument, NULL, OPT_LOAD_INTERLEAVE},
	{"warm-concurrency", required_argument, NULL, OPT_WARM_CONCURRENCY},
	{"remote", required_argument, NULL, OPT_REMOTE},
	{"remote-inflight", required_argument, NULL, OPT_REMOTE_INFLIGHT},
	{"help", no_argument, NULL, OPT_HELP},
	{NULL, 0, NULL, 0},
};

int bench_opts_parse(int argc, char **argv, struct bench_opts *ret, FILE *out, char *err, size_t errlen)
{
	struct bench_opts o = {
		.model = "qwen3-8b",
		.tp = 1,
		.block_tokens = 128,
		.prompts = 8,
		.input_len = 1024,
		.prefix_len = 512,
		.concurrency = 2,
		.seed = 1,
		.phases = BENCH_COLD | BENCH_WARM,
		.timeout_ms = 30000,
		.dcp = 1,
		.interleave = 1,
		.remote_inflight = BENCH_REMOTE_INFLIGHT,
	};
	bool inflight_given = false;
	if (errlen)
		err[0] = '\0';
	optind = 0; /* full re-initialisation: the parser may run more than once (tests) */
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":", long_opts, NULL)) != -1) {
		const char *name = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
		uint64_t v64;
		int rc = 0;
		switch (c) {
		case OPT_SOCKET:
			if (!*optarg)
				return kvr_errf(err, errlen, -EINVAL, "--socket: empty path");
			o.socket = optarg;
			break;
		case OPT_SPAWN: o.spawn = true; break;
		case OPT_KVRINGD: o.kvringd = optarg; break;
		case OPT_L1_BYTES:
			rc = bench_parse_size(optarg, &o.l1_bytes);
			if (!rc && !o.l1_bytes)
				rc = -ERANGE;
			break;
		case OPT_MODEL:
			if (!kvr_preset_find(optarg))
				return kvr_errf(err, errlen, -EINVAL, "--model: unknown preset \"%s\" (known: %s)", optarg,
					    kvr_preset_list());
			o.model = optarg;
			break;
		case OPT_TP: rc = parse_u32(optarg, 1, KVR_MAX_TP, &o.tp); break;
		case OPT_BLOCK_TOKENS: rc = parse_u32(optarg, 1, 4096, &o.block_tokens); break;
		case OPT_PROMPTS: rc = parse_u32(optarg, 1, 1000000, &o.prompts); break;
		case OPT_INPUT_LEN: rc = parse_u32(optarg, 1, 16u << 20, &o.input_len); break;
		case OPT_PREFIX_LEN: rc = parse_u32(optarg, 0, 16u << 20, &o.prefix_len); break;
		case OPT_CONCURRENCY: rc = parse_u32(optarg, 1, 1024, &o.concurrency); break;
		case OPT_WARM_CONCURRENCY: rc = parse_u32(optarg, 1, 1024, &o.warm_concurrency); break;
		case OPT_SEED: rc = parse_u64(optarg, &o.seed); break;
		case OPT_PHASES:
			if (bench_parse_phases(optarg, &o.phases))
				return kvr_errf(err, errlen, -EINVAL, "--phases: \"%s\": want a comma list of cold and warm", optarg);
			break;
		case OPT_JSON: o.json = optarg; break;
		case OPT_PLOT:
			if (!*optarg)
				return kvr_errf(err, errlen, -EINVAL, "--plot: empty path");
			o.plot = optarg;
			break;
		case OPT_NO_PLOT: o.no_plot = true; break;
		case OPT_QUIET: o.quiet = true; break;
		case OPT_DRY_RUN: o.dry_run = true; break;
		case OPT_ALLOW_MISSES: o.allow_misses = true; break;
		case OPT_COLD_ACTORS: o.cold_actors = true; break;
		case OPT_TIMEOUT:
			rc = parse_u64(optarg, &v64);
			if (!rc && (v64 < 1 || v64 > 3600000))
				rc = -ERANGE;
			if (!rc)
				o.timeout_ms = (int64_t)v64;
			break;
		case OPT_EVICT: o.evict = true; break;
		case OPT_NO_MODEL: o.no_model = true; break;
		case OPT_DCP: rc = parse_u32(optarg, 1, KVR_DCP_MAX, &o.dcp); break;
		case OPT_INTERLEAVE: rc = parse_u32(optarg, 1, 4096, &o.interleave); break;
		case OPT_LOAD_DCP: rc = parse_u32(optarg, 1, KVR_DCP_MAX, &o.load_dcp); break;
		case OPT_LOAD_INTERLEAVE: rc = parse_u32(optarg, 1, 4096, &o.load_interleave); break;
		case OPT_REMOTE:
			if ((rc = bench_parse_seeds(optarg, o.remote_seed, &o.n_remote, err, errlen)))
				return rc;
			break;
		case OPT_REMOTE_INFLIGHT:
			rc = parse_u32(optarg, 1, 4096, &o.remote_inflight);
			inflight_given = true;
			break;
		case OPT_HELP:
			bench_usage(out);
			return 1;
		case ':':
			return kvr_errf(err, errlen, -EINVAL, "%s: needs a value", name);
		default:
			return kvr_errf(err, errlen, -EINVAL, "%s: unknown option", name);
		}
		if (rc)
			return kvr_errf(err, errlen, -EINVAL, "%s: %s: \"%s\"", name, rc == -ERANGE ? "out of range" : "not a number",
				    optarg);
	}
	if (optind < argc)
		return kvr_errf(err, errlen, -EINVAL, "unexpected argument \"%s\"", argv[optind]);
	if (o.spawn && o.socket)
		return kvr_errf(err, errlen, -EINVAL, "--socket and --spawn exclude each other");
	if (o.no_model && !o.spawn)
		return kvr_errf(err, errlen, -EINVAL, "--no-model needs --spawn: it writes the config kvringd starts from");
	if (!o.spawn && (o.kvringd || o.l1_bytes))
		return kvr_errf(err, errlen, -EINVAL, "%s needs --spawn", o.kvringd ? "--kvringd" : "--l1-bytes");
	if (o.warm_concurrency > o.concurrency)
		return kvr_errf(err, errlen, -EINVAL, "--warm-concurrency %u exceeds --concurrency %u (the engine's KV memory "
				"holds --concurrency prompts)", o.warm_concurrency, o.concurrency);
	if (o.n_remote && !o.spawn)
		return kvr_errf(err, errlen, -EINVAL, "--remote needs --spawn: it starts the two instances it compares");
	if (inflight_given && !o.n_remote)
		return kvr_errf(err, errlen, -EINVAL, "--remote-inflight needs --remote");
	if (o.n_remote && o.phases != (BENCH_COLD | BENCH_WARM))
		return kvr_errf(err, errlen, -EINVAL, "--remote runs its own phases (cold on A, warm on B, warm on A): "
				"no --phases");
	if (o.n_remote && o.evict)
		return kvr_errf(err, errlen, -EINVAL, "--remote and --evict exclude each other (B's blocks must come "
				"from the cluster, not from an L2)");
	if (o.plot && o.no_plot)
		return kvr_errf(err, errlen, -EINVAL, "--plot and --no-plot exclude each other");
	if (o.prefix_len > o.input_len)
		return kvr_errf(err, errlen, -EINVAL, "--prefix-len %u is longer than --input-len %u", o.prefix_len, o.input_len);
	int rc = check_layout(&o, "--dcp", o.dcp, "--interleave", o.interleave, err, errlen);
	if (!rc)
		rc = check_layout(&o, "--load-dcp", bench_load_dcp(&o), "--load-interleave", bench_load_interleave(&o), err,
				  errlen);
	if (rc)
		return rc;
	*ret = o;
	return 0;
}
