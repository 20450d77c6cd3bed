/* Tests of kvring-bench: options, plan, prompts, pattern, stats, report, plot, barrier, --remote's summary; runs through kvringd. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "kvr_dcp.h"

TestSuite(bench);

static int parse(struct bench_opts *o, char *err, size_t errlen, int argc, const char **argv)
{
	FILE *devnull = fopen("/dev/null", "w");
	cr_assert_not_null(devnull);
	int rc = bench_opts_parse(argc, (char **)argv, o, devnull, err, errlen);
	fclose(devnull);
	return rc;
}

#define PARSE(o, err, ...)                                                                                     \
	({                                                                                                     \
		const char *argv_[] = {"kvring-bench", __VA_ARGS__, NULL};                                     \
		parse(o, err, sizeof(err), (int)(sizeof(argv_) / sizeof(argv_[0])) - 1, argv_);               \
	})

/* ---- options ----------------------------------------------------------------------------- */

Test(bench, opts_defaults)
{
	struct bench_opts o;
	char err[256];
	const char *argv[] = {"kvring-bench", NULL};
	cr_assert_eq(parse(&o, err, sizeof(err), 1, argv), 0);
	cr_assert_str_eq(o.model, "qwen3-8b");
	cr_assert_eq(o.tp, 1);
	cr_assert_eq(o.block_tokens, 128);
	cr_assert_eq(o.prompts, 8);
	cr_assert_eq(o.input_len, 1024);
	cr_assert_eq(o.prefix_len, 512);
	cr_assert_eq(o.concurrency, 2);
	cr_assert_eq(o.seed, 1);
	cr_assert_eq(o.phases, BENCH_COLD | BENCH_WARM);
	cr_assert_null(o.socket);
	cr_assert(!o.spawn && !o.quiet && !o.dry_run && !o.allow_misses);
	cr_assert_eq(o.timeout_ms, 30000);
	cr_assert_eq(o.dcp, 1);
	cr_assert_eq(o.interleave, 1);
	cr_assert_eq(o.load_dcp, 0);
	cr_assert_eq(o.load_interleave, 0);
	cr_assert_eq(bench_load_dcp(&o), 1, "the warm layout is the cold one");
	cr_assert_eq(bench_load_interleave(&o), 1);
}

Test(bench, opts_every_option)
{
	struct bench_opts o;
	char err[256];
	int rc = PARSE(&o, err, "--spawn", "--model", "glm-4-9b-chat-1m", "--tp", "2", "--block-tokens", "16",
		       "--prompts", "200", "--input-len", "10000", "--prefix-len", "0", "--concurrency", "4", "--seed",
		       "0x10", "--phases", "warm", "--json", "out.json", "--quiet", "--l1-bytes", "3GiB",
		       "--allow-misses", "--timeout-ms", "500", "--kvringd", "/x/kvringd");
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert(o.spawn);
	cr_assert_str_eq(o.model, "glm-4-9b-chat-1m");
	cr_assert_eq(o.tp, 2);
	cr_assert_eq(o.block_tokens, 16);
	cr_assert_eq(o.prompts, 200);
	cr_assert_eq(o.input_len, 10000);
	cr_assert_eq(o.prefix_len, 0);
	cr_assert_eq(o.concurrency, 4);
	cr_assert_eq(o.seed, 16);
	cr_assert_eq(o.phases, BENCH_WARM);
	cr_assert_str_eq(o.json, "out.json");
	cr_assert(o.quiet && o.allow_misses);
	cr_assert_eq(o.l1_bytes, 3ull << 30);
	cr_assert_eq(o.timeout_ms, 500);
	cr_assert_str_eq(o.kvringd, "/x/kvringd");
}

Test(bench, opts_errors_name_the_option)
{
	struct bench_opts o;
	char err[256];
	cr_assert_eq(PARSE(&o, err, "--bogus"), -EINVAL);
	cr_assert(strstr(err, "--bogus"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--tp"), -EINVAL);
	cr_assert(strstr(err, "--tp") && strstr(err, "needs a value"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--tp", "17"), -EINVAL);
	cr_assert(strstr(err, "out of range"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--tp", "0"), -EINVAL);
	cr_assert_eq(PARSE(&o, err, "--prompts", "12x"), -EINVAL);
	cr_assert(strstr(err, "not a number"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--prompts", "-1"), -EINVAL);
	cr_assert_eq(PARSE(&o, err, "--model", "gpt-5"), -EINVAL);
	cr_assert(strstr(err, "gpt-5") && strstr(err, "qwen3-8b"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--socket", "/a", "--spawn"), -EINVAL);
	cr_assert(strstr(err, "exclude"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--l1-bytes", "1GiB"), -EINVAL);
	cr_assert(strstr(err, "--spawn"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--input-len", "100", "--prefix-len", "101"), -EINVAL);
	cr_assert(strstr(err, "--prefix-len 101"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--phases", "cold,hot"), -EINVAL);
	cr_assert_eq(PARSE(&o, err, "stray"), -EINVAL);
	cr_assert(strstr(err, "stray"), "%s", err);
}

Test(bench, opts_help)
{
	struct bench_opts o;
	char err[256];
	cr_assert_eq(PARSE(&o, err, "--help"), 1);
}

Test(bench, phases_and_sizes)
{
	unsigned ph;
	cr_assert_eq(bench_parse_phases("cold,warm", &ph), 0);
	cr_assert_eq(ph, BENCH_COLD | BENCH_WARM);
	cr_assert_eq(bench_parse_phases("warm,cold", &ph), 0);
	cr_assert_eq(ph, BENCH_COLD | BENCH_WARM);
	cr_assert_eq(bench_parse_phases("cold", &ph), 0);
	cr_assert_eq(ph, BENCH_COLD);
	cr_assert_eq(bench_parse_phases("cold,", &ph), -EINVAL);
	cr_assert_eq(bench_parse_phases("", &ph), -EINVAL);
	cr_assert_eq(bench_parse_phases("colder", &ph), -EINVAL);

	uint64_t v;
	cr_assert_eq(bench_parse_size("4096", &v), 0);
	cr_assert_eq(v, 4096);
	cr_assert_eq(bench_parse_size("2KiB", &v), 0);
	cr_assert_eq(v, 2048);
	cr_assert_eq(bench_parse_size("3M", &v), 0);
	cr_assert_eq(v, 3u << 20);
	cr_assert_eq(bench_parse_size("1GB", &v), 0);
	cr_assert_eq(v, 1u << 30);
	cr_assert_eq(bench_parse_size("5TiB", &v), 0);
	cr_assert_eq(v, 5ull << 40);
	cr_assert_eq(bench_parse_size("1Q", &v), -EINVAL);
	cr_assert_eq(bench_parse_size("1GiBs", &v), -EINVAL);
	cr_assert_eq(bench_parse_size("-1", &v), -EINVAL);
	cr_assert_eq(bench_parse_size("99999999999999TiB", &v), -ERANGE);
}

/* ---- plan ------------------------------------------------------------------------------- */

static struct bench_opts defaults(void)
{
	struct bench_opts o;
	char err[256];
	const char *argv[] = {"kvring-bench", NULL};
	cr_assert_eq(parse(&o, err, sizeof(err), 1, argv), 0);
	return o;
}

Test(bench, plan_qwen3_8b)
{
	struct bench_opts o = defaults();
	struct bench_plan pl;
	char err[256];
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	/* 36 layers x K,V x 128 tokens x 8 heads x 128 dims x 2 bytes */
	cr_assert_eq(pl.lane_bytes, 36ull * 2 * 128 * 8 * 128 * 2);
	cr_assert_eq(pl.block_bytes, pl.lane_bytes);
	cr_assert_eq(pl.lanes, 1);
	cr_assert_eq(pl.full_blocks, 8);
	cr_assert_eq(pl.blocks_per_prompt, 8);
	cr_assert_eq(pl.num_blocks, 16);
	cr_assert_eq(pl.prefix_blocks, 4);
	cr_assert_eq(pl.unique_blocks, 4 + 8 * 4);
	cr_assert_eq(pl.unique_bytes, 36 * pl.lane_bytes);
	cr_assert_eq(pl.kv_bytes, 16 * pl.lane_bytes);
}

Test(bench, plan_glm_tp2_matches_design)
{
	/* DESIGN.md section 4: GLM-4-9B, TP 2, block 128 -> 10,485,760 bytes per block over both
	 * ranks; 200 prompts of 10,000 tokens -> 15,800 blocks (78 full of 79 per prompt). */
	struct bench_opts o = defaults();
	o.model = "glm-4-9b-chat-1m";
	o.tp = 2;
	o.prompts = 200;
	o.input_len = 10000;
	o.prefix_len = 0;
	o.concurrency = 1;
	struct bench_plan pl;
	char err[256];
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.block_bytes, 10485760);
	cr_assert_eq(pl.lanes, 2);
	cr_assert_eq(pl.blocks_per_prompt, 79);
	cr_assert_eq((uint64_t)o.prompts * pl.blocks_per_prompt, 15800);
	cr_assert_eq(pl.full_blocks, 78);
	cr_assert_eq(pl.unique_blocks, 200 * 78);
	struct kvr_geometry g0, g1;
	cr_assert_eq(bench_rank_geometry(&o, &pl, 0, 1, 1, &g0), 0);
	cr_assert_eq(bench_rank_geometry(&o, &pl, 1, 1, 1, &g1), 0);
	cr_assert_eq(g0.tp_rank, 0);
	cr_assert_eq(g1.tp_rank, 1);
	cr_assert_eq(g1.tp_size, 2);
	cr_assert_eq(g1.num_blocks, 79);
	cr_assert_eq(kvr_geometry_kv_extent(&g1), pl.kv_bytes);
}

Test(bench, plan_mla_and_errors)
{
	struct bench_opts o = defaults();
	struct bench_plan pl;
	char err[256];
	o.model = "deepseek-v2-lite";
	o.tp = 4;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.lanes, 1);
	cr_assert_eq(pl.lane_bytes, 27ull * 128 * 576 * 2);
	cr_assert_eq(pl.block_bytes, pl.lane_bytes);

	o = defaults();
	o.tp = 3; /* 8 KV heads */
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "--tp 3"), "%s", err);
	o = defaults();
	o.input_len = 100;
	o.prefix_len = 0;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "shorter than one block"), "%s", err);
	o = defaults();
	o.evict = true;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "--evict"), "%s", err);
	o = defaults();
	o.dcp = 3; /* the parser refuses it first; the plan too */
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "--dcp 3"), "%s", err);

	/* concurrency above prompts: only prompts are ever in flight */
	o = defaults();
	o.prompts = 3;
	o.concurrency = 64;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.num_blocks, 3 * 8);
	/* identical prompts: one prompt's blocks */
	o = defaults();
	o.prefix_len = o.input_len;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.unique_blocks, 8);
	/* a prefix that ends inside a block shares only the blocks before it */
	o = defaults();
	o.prefix_len = 200;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.prefix_blocks, 1);
	cr_assert_eq(pl.unique_blocks, 1 + 8 * 7);
}

/* ---- prompts and content seeds ---------------------------------------------------------- */

Test(bench, prompts_share_exactly_the_prefix)
{
	struct bench_opts o = defaults();
	o.input_len = 1000;
	o.prefix_len = 300;
	uint32_t *a = calloc(o.input_len, 4), *b = calloc(o.input_len, 4), *a2 = calloc(o.input_len, 4);
	bench_prompt_tokens(&o, 0, a);
	bench_prompt_tokens(&o, 1, b);
	bench_prompt_tokens(&o, 0, a2);
	cr_assert_arr_eq(a, a2, o.input_len * 4, "deterministic");
	cr_assert_arr_eq(a, b, 300 * 4, "shared prefix");
	unsigned same = 0;
	for (uint32_t j = 300; j < o.input_len; j++) {
		same += a[j] == b[j];
		cr_assert_lt(a[j], 151936u);
	}
	cr_assert_lt(same, 10, "own tokens differ (%u equal of 700)", same);

	/* content seeds: equal for the blocks inside the prefix, different after */
	uint64_t sa[7], sb[7], sa2[7];
	bench_content_seeds(a, 7, 128, sa);
	bench_content_seeds(b, 7, 128, sb);
	bench_content_seeds(a2, 7, 128, sa2);
	cr_assert_arr_eq(sa, sa2, sizeof(sa));
	cr_assert_eq(sa[0], sb[0]);
	cr_assert_eq(sa[1], sb[1]);
	for (int i = 2; i < 7; i++)
		cr_assert_neq(sa[i], sb[i], "block %d", i);

	/* another seed, another workload */
	o.seed = 2;
	bench_prompt_tokens(&o, 0, b);
	cr_assert(memcmp(a, b, 300 * 4), "prefix depends on the seed");
	free(a);
	free(b);
	free(a2);

	cr_assert_neq(bench_block_seed(5, 0, false), bench_block_seed(5, 1, false), "MHA lanes differ");
	cr_assert_eq(bench_block_seed(5, 0, true), bench_block_seed(5, 3, true), "MLA: same latent on every rank");
}

/* ---- pattern --------------------------------------------------------------------------- */

Test(bench, pattern_is_a_function_of_position)
{
	enum { N = 4096 };
	uint8_t *ref = malloc(N), *buf = malloc(N);
	bench_pattern_fill(42, 0, ref, N);
	/* any slice at any offset equals the same bytes of the whole */
	const size_t offs[] = {0, 1, 7, 8, 9, 561, 1000, 4095};
	const size_t lens[] = {0, 1, 3, 8, 15, 561, 1024};
	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++)
		for (size_t j = 0; j < sizeof(lens) / sizeof(lens[0]); j++) {
			size_t off = offs[i], len = lens[j] < N - off ? lens[j] : N - off;
			memset(buf, 0xee, N);
			bench_pattern_fill(42, off, buf, len);
			cr_assert_arr_eq(buf, ref + off, len, "off %zu len %zu", off, len);
			cr_assert_eq(bench_pattern_check(42, off, buf, len), -1);
			if (len < N)
				cr_assert_eq(buf[len], 0xee, "no write past the end");
		}
	/* a flipped byte is found at its exact offset */
	memcpy(buf, ref, N);
	buf[1234] ^= 0x10;
	cr_assert_eq(bench_pattern_check(42, 0, buf, N), 1234);
	cr_assert_eq(bench_pattern_check(42, 3, buf + 3, N - 3), 1231);
	buf[1234] ^= 0x10;
	buf[N - 1] ^= 1;
	cr_assert_eq(bench_pattern_check(42, 0, buf, N), N - 1);
	/* another seed, other bytes */
	cr_assert_neq(bench_pattern_check(43, 0, ref, N), -1);
	free(ref);
	free(buf);
}

Test(bench, block_fill_check_zero_touch_only_the_block)
{
	/* odd page widths (3 x 16 x 1 = 48... use head_dim 35, 1 byte: 560-byte pages) */
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 3, 1, 35, 1, 16, 5), 0);
	uint64_t ext = kvr_geometry_kv_extent(&g);
	uint8_t *kv = calloc(1, ext), *copy = malloc(ext);
	bench_block_fill(&g, kv, 2, 77);
	cr_assert(bench_block_check(&g, kv, 2, 77));
	cr_assert(!bench_block_check(&g, kv, 2, 78));
	cr_assert(!bench_block_is_zero(&g, kv, 2));
	for (uint32_t b = 0; b < 5; b++)
		if (b != 2)
			cr_assert(bench_block_is_zero(&g, kv, b), "block %u untouched", b);
	/* the lane is the regions' pages in order: region 1's page continues region 0's bytes */
	uint8_t want[560];
	struct kvr_region r1 = kvr_geometry_region(&g, 1);
	bench_pattern_fill(77, 560, want, 560);
	cr_assert_arr_eq(kv + r1.offset + 2 * r1.stride, want, 560);
	/* one wrong byte anywhere in the block fails the check */
	struct kvr_region r5 = kvr_geometry_region(&g, 5);
	memcpy(copy, kv, ext);
	kv[r5.offset + 2 * r5.stride + 559] ^= 1;
	cr_assert(!bench_block_check(&g, kv, 2, 77));
	memcpy(kv, copy, ext);
	bench_block_zero(&g, kv, 2);
	cr_assert(bench_block_is_zero(&g, kv, 2));
	for (size_t i = 0; i < ext; i++)
		cr_assert_eq(kv[i], 0, "byte %zu", i);
	free(kv);
	free(copy);
}

/* ---- statistics ------------------------------------------------------------------------ */

Test(bench, dist_nearest_rank)
{
	uint64_t v[100];
	for (int i = 0; i < 100; i++)
		v[i] = (uint64_t)(100 - i); /* 100..1, unsorted */
	struct bench_dist d = bench_dist_of(v, 100);
	cr_assert_eq(d.n, 100);
	cr_assert_float_eq(d.mean, 50.5, 1e-9);
	cr_assert_eq(d.p50, 50);
	cr_assert_eq(d.p99, 99);
	cr_assert_eq(d.max, 100);
	uint64_t one = 7;
	d = bench_dist_of(&one, 1);
	cr_assert(d.p50 == 7 && d.p99 == 7 && d.max == 7 && d.mean == 7.0);
	uint64_t three[] = {30, 10, 20};
	d = bench_dist_of(three, 3);
	cr_assert_eq(d.p50, 20);
	cr_assert_eq(d.p99, 30);
	d = bench_dist_of(NULL, 0);
	cr_assert(d.n == 0 && d.p50 == 0 && d.mean == 0.0);
	cr_assert_float_eq(bench_gbps(3000000000ull, 1000000000ull), 3.0, 1e-12);
	cr_assert_float_eq(bench_gbps(1, 0), 0.0, 1e-12);
}

/* ---- summary and JSON ------------------------------------------------------------------- */

static cJSON *path(cJSON *root, const char *a, const char *b)
{
	cJSON *x = cJSON_GetObjectItemCaseSensitive(root, a);
	cr_assert_not_null(x, "key %s", a);
	if (!b)
		return x;
	cJSON *y = cJSON_GetObjectItemCaseSensitive(x, b);
	cr_assert_not_null(y, "key %s.%s", a, b);
	return y;
}

Test(bench, summary_and_json_two_ranks)
{
	struct bench_opts o = defaults();
	o.model = "glm-4-9b-chat-1m";
	o.tp = 2;
	o.prompts = 4;
	struct bench_plan pl;
	char err[256];
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	struct bench_rank_result res[2] = {0};
	uint64_t lat[2][4] = {{10, 20, 30, 40}, {50, 60, 70, 80}}, hash[2][4] = {{1, 1, 1, 1}, {2, 2, 2, 2}};
	uint64_t idx[2][4] = {{3, 3, 3, 3}, {4, 4, 4, 4}}, rt[2][4] = {{5, 6, 7, 8}, {5, 6, 7, 8}};
	struct bench_samples smp[2];
	for (int r = 0; r < 2; r++) {
		res[r].st_requests = 4;
		res[r].st_tokens = 4096;
		res[r].st_blocks = 32;
		res[r].st_stored = 20;
		res[r].st_present = 12;
		res[r].st_bytes = 20 * pl.lane_bytes;
		res[r].st_ns = r ? 2000000000ull : 1000000000ull;
		res[r].st_memcpy_ns = 1000000000ull;
		res[r].ld_requests = 4;
		res[r].ld_tokens = 4096;
		res[r].ld_matched_blocks = 32;
		res[r].ld_matched_tokens = 4096;
		res[r].ld_bytes = 32 * pl.lane_bytes;
		res[r].ld_ns = 1100000000ull;
		res[r].ld_memcpy_ns = 1000000000ull;
		res[r].ld_exact_prompts = 4;
		res[r].ld_samples = 4;
		smp[r] = (struct bench_samples){lat[r], hash[r], idx[r], rt[r]};
	}
	struct bench_summary s;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert(s.ok && s.exact);
	cr_assert_eq(s.errors, 0);
	cr_assert_eq(s.st_stored, 40);
	cr_assert_eq(s.st_bytes, 40 * pl.lane_bytes);
	cr_assert_eq(s.st_ns, 2000000000ull, "the slowest rank");
	cr_assert_float_eq(s.st_ratio, 0.5, 1e-9);
	cr_assert_float_eq(s.hit_rate, 1.0, 1e-12);
	cr_assert_float_eq(s.ld_time_ratio, 1.1, 1e-9);
	cr_assert_eq(s.ld_misses, 0);
	cr_assert_eq(s.lat.n, 8);
	cr_assert_eq(s.lat.p50, 40);
	cr_assert_eq(s.lat.max, 80);
	cr_assert_eq(s.hash.p50, 1);
	cr_assert_eq(s.hash_index_p50_ns, 4);
	cr_assert_eq(s.rt.p99, 8);

	char *text = bench_json(&o, &pl, &s);
	cr_assert_not_null(text);
	cJSON *root = cJSON_Parse(text);
	cr_assert_not_null(root, "%s", text);
	cr_assert_str_eq(path(root, "tool", NULL)->valuestring, "kvring-bench");
	cr_assert_str_eq(path(root, "config", "model")->valuestring, "glm-4-9b-chat-1m");
	cr_assert_eq(path(root, "config", "tp")->valuedouble, 2);
	cr_assert_eq(path(root, "plan", "block_bytes")->valuedouble, 10485760);
	cr_assert_eq(path(root, "cold", "stored_blocks")->valuedouble, 40);
	cr_assert_eq(path(root, "cold", "present_blocks")->valuedouble, 24);
	cr_assert_float_eq(path(root, "cold", "ratio")->valuedouble, 0.5, 1e-9);
	cr_assert(cJSON_IsFalse(path(root, "cold", "goal_met")));
	cr_assert_eq(path(root, "warm", "hit_rate")->valuedouble, 1.0);
	cr_assert(cJSON_IsTrue(path(root, "warm", "goal_met")));
	cJSON *latency = path(root, "warm", "latency_ns");
	cr_assert_eq(cJSON_GetObjectItem(latency, "p99")->valuedouble, 80);
	cJSON *verify = path(root, "warm", "verify");
	cr_assert_eq(cJSON_GetObjectItem(verify, "exact_prompts")->valuedouble, 8);
	cr_assert(cJSON_IsTrue(path(root, "ok", NULL)));
	cr_assert(cJSON_IsTrue(path(root, "exact_match", NULL)));
	cr_assert_eq(path(root, "errors", NULL)->valuedouble, 0);
	cJSON_Delete(root);
	free(text);

	/* one mismatched block on rank 1: not exact, not ok; a miss after our own cold phase is an error */
	res[1].ld_mismatch_blocks = 1;
	res[1].ld_exact_prompts = 3;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert(!s.ok && !s.exact);
	cr_assert_eq(s.errors, 1);
	res[1].ld_mismatch_blocks = 0;
	res[1].ld_exact_prompts = 4;
	res[1].ld_matched_blocks = 30;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert_eq(s.ld_misses, 2);
	cr_assert(!s.ok);
	o.allow_misses = true;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert(s.ok);
	bench_summarise(&o, &pl, res, smp, 1, &s);
	cr_assert(!s.ok, "an extra error (kvringd's exit) fails the run");
	/* a block evicted between lookup and load (the loader listed it failed): an error unless
	 * misses are allowed */
	res[1].ld_failed_blocks = 1;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert(s.ok, "an evicted block is a miss with --allow-misses");
	cr_assert_eq(s.ld_failed_blocks, 1);
	o.allow_misses = false;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert(!s.ok);
	cr_assert_eq(s.errors, 2 + 1, "two misses and the failed block");
	o.allow_misses = true;
	res[1].ld_failed_blocks = 0;

	/* a warm-only run: no cold key, misses are not errors */
	o.allow_misses = false;
	o.phases = BENCH_WARM;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert(s.ok);
	text = bench_json(&o, &pl, &s);
	root = cJSON_Parse(text);
	cr_assert(cJSON_IsNull(path(root, "cold", NULL)));
	cJSON_Delete(root);
	free(text);

	/* the table fits 100 columns */
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	bench_print_header(f, &o, &pl);
	o.phases = BENCH_COLD | BENCH_WARM;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	bench_print_table(f, &o, &pl, &s);
	fclose(f);
	cr_assert(strstr(buf, "cold: store") && strstr(buf, "warm: lookup + load") && strstr(buf, "result: "));
	for (char *line = buf, *nl; *line; line = nl + 1) {
		nl = strchr(line, '\n');
		cr_assert_not_null(nl);
		cr_assert_leq(nl - line, 100, "line too long: %.*s", (int)(nl - line), line);
	}
	free(buf);
}

Test(bench, spawn_config)
{
	struct bench_opts o = defaults();
	o.spawn = true;
	o.tp = 2;
	struct bench_plan pl;
	char err[256];
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	char *text = bench_server_config(&o, &pl, "/tmp/x/kvringd.sock");
	cJSON *root = cJSON_Parse(text);
	cr_assert_not_null(root);
	cr_assert_str_eq(path(root, "instance", "socket")->valuestring, "/tmp/x/kvringd.sock");
	cr_assert_eq(path(root, "instance", "max_workers")->valuedouble, 2);
	cr_assert_str_eq(path(root, "model", "preset")->valuestring, "qwen3-8b");
	cr_assert_eq(path(root, "model", "tp_size")->valuedouble, 2);
	cr_assert_eq(path(root, "model", "block_tokens")->valuedouble, 128);
	double cap = path(root, "l1", "capacity_bytes")->valuedouble;
	cr_assert_geq(cap, (double)pl.unique_bytes * 1.25);
	cr_assert_leq(cap, (double)pl.unique_bytes * 1.25 + (2 << 20));
	cr_assert_eq((uint64_t)cap % (1 << 20), 0);
	cr_assert(cJSON_IsFalse(path(root, "metrics", "enabled")));
	cJSON_Delete(root);
	free(text);
	o.l1_bytes = 5ull << 30;
	text = bench_server_config(&o, &pl, "/s");
	root = cJSON_Parse(text);
	cr_assert_eq(path(root, "l1", "capacity_bytes")->valuedouble, (double)(5ull << 30));
	cJSON_Delete(root);
	free(text);
}

/* ---- barrier ----------------------------------------------------------------------------- */

Test(bench, barrier_timeout_abort_single)
{
	struct bench_barrier *b = mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(b, MAP_FAILED);
	bench_barrier_init(b, 1);
	cr_assert_eq(bench_barrier_wait(b, 10), 0);
	cr_assert_eq(bench_barrier_wait(b, 10), 0);
	bench_barrier_init(b, 2);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(bench_barrier_wait(b, 50), -ETIMEDOUT);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	cr_assert_geq(ms, 49.0);
	cr_assert_lt(ms, 1000.0);
	bench_barrier_abort(b);
	cr_assert_eq(bench_barrier_wait(b, 1000), -ECANCELED);
	munmap(b, sizeof(*b));
}

Test(bench, barrier_across_processes)
{
	/* 3 processes x 200 rounds: after barrier k every process has finished round k */
	enum { P = 3, ROUNDS = 200 };
	struct area {
		struct bench_barrier b;
		_Atomic uint32_t done[P];
		_Atomic uint32_t bad;
	} *a = mmap(NULL, sizeof(struct area), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(a, MAP_FAILED);
	memset(a, 0, sizeof(*a));
	bench_barrier_init(&a->b, P);
	pid_t pids[P - 1];
	for (int p = 1; p < P; p++) {
		pids[p - 1] = fork();
		cr_assert_geq(pids[p - 1], 0);
		if (!pids[p - 1]) {
			for (uint32_t k = 1; k <= ROUNDS; k++) {
				atomic_store(&a->done[p], k);
				if (bench_barrier_wait(&a->b, 5000))
					_exit(1);
				for (int q = 0; q < P; q++)
					if (atomic_load(&a->done[q]) < k)
						atomic_fetch_add(&a->bad, 1);
				if (bench_barrier_wait(&a->b, 5000))
					_exit(1);
			}
			_exit(0);
		}
	}
	for (uint32_t k = 1; k <= ROUNDS; k++) {
		atomic_store(&a->done[0], k);
		cr_assert_eq(bench_barrier_wait(&a->b, 5000), 0, "round %u", k);
		for (int q = 0; q < P; q++)
			cr_assert_geq(atomic_load(&a->done[q]), k, "round %u process %d", k, q);
		cr_assert_eq(bench_barrier_wait(&a->b, 5000), 0);
	}
	for (int p = 0; p < P - 1; p++) {
		int st;
		cr_assert_eq(waitpid(pids[p], &st, 0), pids[p]);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	cr_assert_eq(atomic_load(&a->bad), 0);
	munmap(a, sizeof(*a));
}

/* ---- cold latency samples and the plot ---------------------------------------------------- */

Test(bench, store_latency_samples_merge_and_json)
{
	struct bench_opts o = defaults();
	o.tp = 2;
	o.prompts = 3;
	struct bench_plan pl;
	char err[256];
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	struct bench_rank_result res[2] = {0};
	uint64_t st[2][3] = {{30, 10, 20}, {99, 0, 0}}, lat[2][3] = {{7, 8, 9}, {1, 2, 3}};
	uint64_t z[3] = {0};
	struct bench_samples smp[2] = {{.lat_ns = lat[0], .hash_ns = z, .index_ns = z, .rt_ns = z, .st_lat_ns = st[0]},
				       {.lat_ns = lat[1], .hash_ns = z, .index_ns = z, .rt_ns = z, .st_lat_ns = st[1]}};
	res[0].st_samples = 3;
	res[1].st_samples = 1;
	res[0].ld_samples = 3;
	res[1].ld_samples = 2;
	size_t n;
	uint64_t *v = bench_samples_merge(&o, res, smp, false, &n);
	cr_assert_eq(n, 4);
	cr_assert_arr_eq(v, ((uint64_t[]){30, 10, 20, 99}), 4 * sizeof(uint64_t), "rank order, unsorted");
	free(v);
	v = bench_samples_merge(&o, res, smp, true, &n);
	cr_assert_eq(n, 5);
	cr_assert_arr_eq(v, ((uint64_t[]){7, 8, 9, 1, 2}), 5 * sizeof(uint64_t));
	free(v);
	res[0].st_samples = res[1].st_samples = 0;
	cr_assert_null(bench_samples_merge(&o, res, smp, false, &n));
	cr_assert_eq(n, 0);
	res[0].st_samples = 3;
	res[1].st_samples = 1;

	struct bench_summary s;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert_eq(s.st_lat.n, 4);
	cr_assert_eq(s.st_lat.p50, 20);
	cr_assert_eq(s.st_lat.max, 99);
	cr_assert_float_eq(s.st_lat.mean, 39.75, 1e-9);
	cr_assert_arr_eq(st[0], ((uint64_t[]){30, 10, 20}), sizeof(st[0]), "the samples are left as they are");
	char *text = bench_json(&o, &pl, &s);
	cJSON *root = cJSON_Parse(text);
	cr_assert_not_null(root, "%s", text);
	cJSON *l = path(root, "cold", "latency_ns");
	cr_assert_eq(cJSON_GetObjectItem(l, "n")->valuedouble, 4);
	cr_assert_eq(cJSON_GetObjectItem(l, "p99")->valuedouble, 99);
	cJSON_Delete(root);
	free(text);
}

Test(bench, opts_plot_and_plot_path)
{
	struct bench_opts o;
	char err[256], p[64];
	cr_assert_eq(PARSE(&o, err, "--plot", "x.png"), 0, "%s", err);
	cr_assert_str_eq(o.plot, "x.png");
	cr_assert(!o.no_plot);
	cr_assert_eq(bench_plot_path(&o, p, sizeof(p)), 1);
	cr_assert_str_eq(p, "x.png");
	cr_assert_eq(PARSE(&o, err, "--plot", "x.png", "--no-plot"), -EINVAL);
	cr_assert(strstr(err, "exclude"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--plot", ""), -EINVAL);

	/* beside --json: .json replaced, else .png appended; not for stdout; not with --no-plot */
	cr_assert_eq(PARSE(&o, err, "--json", "out/bench.json"), 0, "%s", err);
	cr_assert_eq(bench_plot_path(&o, p, sizeof(p)), 1);
	cr_assert_str_eq(p, "out/bench.png");
	cr_assert_eq(PARSE(&o, err, "--json", "run.out"), 0, "%s", err);
	cr_assert_eq(bench_plot_path(&o, p, sizeof(p)), 1);
	cr_assert_str_eq(p, "run.out.png");
	cr_assert_eq(PARSE(&o, err, "--json", ".json"), 0, "%s", err);
	cr_assert_eq(bench_plot_path(&o, p, sizeof(p)), 1);
	cr_assert_str_eq(p, ".json.png");
	cr_assert_eq(PARSE(&o, err, "--json", "-"), 0, "%s", err);
	cr_assert_eq(bench_plot_path(&o, p, sizeof(p)), 0);
	cr_assert_eq(PARSE(&o, err, "--json", "a.json", "--no-plot"), 0, "%s", err);
	cr_assert_eq(bench_plot_path(&o, p, sizeof(p)), 0);
	cr_assert_eq(PARSE(&o, err, "--json", "a.json", "--plot", "b.png"), 0, "%s", err);
	cr_assert_eq(bench_plot_path(&o, p, sizeof(p)), 1);
	cr_assert_str_eq(p, "b.png");
	cr_assert_eq(PARSE(&o, err, "--quiet"), 0, "%s", err);
	cr_assert_eq(bench_plot_path(&o, p, sizeof(p)), 0, "no --json, no --plot: no plot");
	strcpy(p, "untouched");
	cr_assert_eq(PARSE(&o, err, "--json", "a-rather-long-name.json"), 0, "%s", err);
	cr_assert_eq(bench_plot_path(&o, p, 10), -ENAMETOOLONG);
	cr_assert_str_eq(p, "untouched");
	cr_assert_eq(bench_plot_path(&o, p, sizeof("a-rather-long-name.png")), 1, "exactly fits");
	cr_assert_str_eq(p, "a-rather-long-name.png");
}

/* A known small run: two phases, 3 cold and 2 warm samples (unsorted). */
struct plot_fixture {
	struct bench_opts o;
	struct bench_plan pl;
	struct bench_summary s;
	uint64_t cold[3], warm[2];
	struct bench_plot_input in;
};

static void plot_fixture(struct plot_fixture *x)
{
	char err[256];
	memset(x, 0, sizeof(*x));
	x->o = defaults();
	x->o.prompts = 3;
	cr_assert_eq(bench_plan_make(&x->o, &x->pl, err, sizeof(err)), 0, "%s", err);
	x->s = (struct bench_summary){.ran_cold = true, .ran_warm = true, .st_gbps = 5.5, .st_memcpy_gbps = 4.25,
				      .st_ratio = 5.5 / 4.25, .ld_gbps = 3.125, .ld_memcpy_gbps = 6.0,
				      .ld_time_ratio = 1.92, .st_bytes = 1, .ld_bytes = 1, .ok = true};
	x->s.st_lat = (struct bench_dist){.n = 3, .mean = 200, .p50 = 200, .p99 = 300, .max = 300};
	x->s.lat = (struct bench_dist){.n = 2, .mean = 2500, .p50 = 1000, .p99 = 4000, .max = 4000};
	memcpy(x->cold, (uint64_t[]){300, 100, 200}, sizeof(x->cold));
	memcpy(x->warm, (uint64_t[]){4000, 1000}, sizeof(x->warm));
	x->in = (struct bench_plot_input){.o = &x->o, .pl = &x->pl, .s = &x->s, .cold_ns = x->cold, .n_cold = 3,
					  .warm_ns = x->warm, .n_warm = 2,
					  .when = 1767225600 /* 2026-01-01 00:00 UTC */};
}

static char *data_text(struct bench_plot_input *in)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	cr_assert_eq(bench_plot_write_data(f, in), 0);
	fclose(f);
	return buf;
}

Test(bench, plot_data_file_exact)
{
	struct plot_fixture x;
	plot_fixture(&x);
	char *text = data_text(&x.in);
	cr_assert_str_eq(text, "# kvring-bench plot data\n"
			       "# throughput: phase kvring_gbps memcpy_gbps\n"
			       "store 5.5000 4.2500\n"
			       "load 3.1250 6.0000\n"
			       "\n\n# cold latency: ns cumulative_fraction\n"
			       "100 0.000000\n"
			       "100 0.333333\n"
			       "200 0.666667\n"
			       "300 1.000000\n"
			       "\n\n# warm latency: ns cumulative_fraction\n"
			       "1000 0.000000\n"
			       "1000 0.500000\n"
			       "4000 1.000000\n");
	free(text);
	cr_assert_arr_eq(x.cold, ((uint64_t[]){100, 200, 300}), sizeof(x.cold), "sorted in place");

	/* a warm-only run, and a run where no store completed: only what exists */
	x.s.ran_cold = false;
	x.in.n_cold = 0;
	text = data_text(&x.in);
	cr_assert_str_eq(text, "# kvring-bench plot data\n"
			       "# throughput: phase kvring_gbps memcpy_gbps\n"
			       "load 3.1250 6.0000\n"
			       "\n\n# warm latency: ns cumulative_fraction\n"
			       "1000 0.000000\n"
			       "1000 0.500000\n"
			       "4000 1.000000\n");
	free(text);
	x.s.ran_cold = true;
	x.s.ran_warm = false;
	x.in.n_warm = 0;
	text = data_text(&x.in);
	cr_assert_str_eq(text, "# kvring-bench plot data\n"
			       "# throughput: phase kvring_gbps memcpy_gbps\n"
			       "store 5.5000 4.2500\n");
	free(text);
}

Test(bench, plot_script_names_what_exists)
{
	struct plot_fixture x;
	plot_fixture(&x);
	cr_assert_eq(setenv("TZ", "UTC", 1), 0);
	tzset();
	char *text = data_text(&x.in);
	free(text);
	char *sc = bench_plot_script(&x.in, "/tmp/d.dat", "/tmp/it's.png");
	cr_assert_not_null(sc);
	cr_assert(strstr(sc, "set output '/tmp/it''s.png'\n"), "%s", sc);
	cr_assert(strstr(sc, "'pngcairo'") && strstr(sc, "set terminal png size 1400,560"), "%s", sc);
	cr_assert(strstr(sc, "kvring-bench: qwen3-8b (Qwen/Qwen3-8B), tp 1, 3 prompts x 1024 tokens "
			     "(shared prefix 512), 2026-01-01 00:00'"), "%s", sc);
	cr_assert(strstr(sc, "'/tmp/d.dat' index 'cold latency' using ($1/1000):2 with steps"), "%s", sc);
	cr_assert(strstr(sc, "'/tmp/d.dat' index 'warm latency' using ($1/1000):2 with steps"), "%s", sc);
	cr_assert(strstr(sc, "p50 200 ns, p99 300 ns"), "%s", sc);
	cr_assert(strstr(sc, "set logscale x 10\nset xrange [0.08:5]\nset xtics (0.1, 0.2, 0.5, 1, 2, 5)\n"),
		  "100 ns .. 4 us spans a decade: log x in us; %s", sc);
	cr_assert(strstr(sc, "\"store (cold)\\nkvring/memcpy GB/s 1.29\\ngoal >= 0.85: met\" 0, "
			     "\"load (warm)\\nkvring/memcpy time 1.92\\ngoal <= 1.10: missed\" 4)"), "%s", sc);
	cr_assert(strstr(sc, "set yrange [0:8.1]"), "6.0 GB/s highest bar + 35%%: %s", sc);
	cr_assert_null(strchr(sc, '`'), "no command substitution");
	free(sc);

	/* warm only, narrow: linear x, no cold plot */
	x.s.ran_cold = false;
	x.in.n_cold = 0;
	x.warm[0] = 3000;
	x.s.ok = false;
	sc = bench_plot_script(&x.in, "/tmp/d.dat", "/tmp/p.png");
	cr_assert_null(strstr(sc, "cold latency"), "%s", sc);
	cr_assert_null(strstr(sc, "logscale x 10"), "%s", sc);
	cr_assert_null(strstr(sc, "store (cold)"), "%s", sc);
	cr_assert(strstr(sc, "\"load (warm)\\nkvring/memcpy time 1.92\\ngoal <= 1.10: missed\" 0)"), "%s", sc);
	cr_assert(strstr(sc, "2026-01-01 00:00, FAILED'"), "%s", sc);
	free(sc);
	x.s.ld_bytes = 0;
	sc = bench_plot_script(&x.in, "/tmp/d.dat", "/tmp/p.png");
	cr_assert(strstr(sc, "(\"load (warm)\\nno bytes loaded\" 0)"), "no ratio without bytes: %s", sc);
	free(sc);
}

Test(bench, plot_which)
{
	char dir[64], file[128], got[256];
	snprintf(dir, sizeof(dir), "/tmp/kvr-bench-which.%d", (int)getpid());
	cr_assert_eq(mkdir(dir, 0700), 0);
	snprintf(file, sizeof(file), "%s/gnuplot", dir);
	FILE *f = fopen(file, "w");
	cr_assert_not_null(f);
	fclose(f);
	char path_env[256];
	snprintf(path_env, sizeof(path_env), "/nonexistent:%s:%s", dir, dir);
	cr_assert_eq(bench_which("gnuplot", path_env, got, sizeof(got)), -ENOENT, "not executable: skipped");
	cr_assert_eq(chmod(file, 0755), 0);
	cr_assert_eq(bench_which("gnuplot", path_env, got, sizeof(got)), 0);
	cr_assert_str_eq(got, file);
	cr_assert_eq(bench_which("gnuplot", path_env, got, 8), -ENAMETOOLONG);
	cr_assert_eq(bench_which("gnuplot", "/nonexistent:", got, sizeof(got)), -ENOENT);
	cr_assert_eq(bench_which("gnuplot", NULL, got, sizeof(got)), -ENOENT);
	cr_assert_eq(bench_which("gnuplot", dir, got, sizeof(got)), 0, "a directory is not a program");
	cr_assert_eq(bench_which("kvr-bench-which", "/tmp", got, sizeof(got)), -ENOENT);
	unlink(file);
	rmdir(dir);
}

/* No /tmp/kvring-bench-plot.<pid>.* left behind. */
static unsigned leftovers(void)
{
	char pat[64];
	int n = snprintf(pat, sizeof(pat), "kvring-bench-plot.%d.", (int)getpid());
	unsigned found = 0;
	DIR *d = opendir("/tmp");
	cr_assert_not_null(d);
	for (struct dirent *e; (e = readdir(d));)
		found += !strncmp(e->d_name, pat, (size_t)n);
	closedir(d);
	return found;
}

Test(bench, plot_without_gnuplot_is_enoent)
{
	struct plot_fixture x;
	plot_fixture(&x);
	char png[64], err[256];
	snprintf(png, sizeof(png), "/tmp/kvr-bench-plot-test.%d.png", (int)getpid());
	cr_assert_eq(setenv("PATH", "/nonexistent", 1), 0);
	cr_assert_eq(bench_plot(&x.in, png, err, sizeof(err)), -ENOENT);
	cr_assert_str_eq(err, "gnuplot not found");
	cr_assert_neq(access(png, F_OK), 0);
	cr_assert_eq(leftovers(), 0);
}

Test(bench, plot_png_through_gnuplot)
{
	char gp[256];
	if (bench_which("gnuplot", getenv("PATH"), gp, sizeof(gp)))
		cr_skip_test("gnuplot is not installed");
	struct plot_fixture x;
	plot_fixture(&x);
	char png[64], err[256];
	snprintf(png, sizeof(png), "/tmp/kvr-bench-plot-test.%d.png", (int)getpid());
	unlink(png);
	cr_assert_eq(bench_plot(&x.in, png, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(leftovers(), 0);
	/* a PNG of 1400 x 560: signature, then the IHDR chunk */
	uint8_t head[24];
	FILE *f = fopen(png, "rb");
	cr_assert_not_null(f);
	cr_assert_eq(fread(head, 1, sizeof(head), f), sizeof(head));
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	fclose(f);
	static const uint8_t want[24] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
					 0, 0, 0x05, 0x78, 0, 0, 0x02, 0x30}; /* 1400 = 0x578, 560 = 0x230 */
	cr_assert_arr_eq(head, want, sizeof(head));
	cr_assert_gt(size, 10000);
	cr_assert_lt(size, 200000);
	unlink(png);

	/* a directory that does not exist: gnuplot fails, and says why */
	cr_assert_eq(bench_plot(&x.in, "/nonexistent/dir/p.png", err, sizeof(err)), -EIO);
	cr_assert(strstr(err, "gnuplot"), "%s", err);
	cr_assert_eq(leftovers(), 0);
}

/* ---- DCP: options, plan, pattern ------------------------------------------------------------ */

Test(bench, opts_dcp_and_its_rules)
{
	struct bench_opts o;
	char err[256];
	cr_assert_eq(PARSE(&o, err, "--tp", "4", "--dcp", "2", "--interleave", "16"), 0, "%s", err);
	cr_assert_eq(o.dcp, 2);
	cr_assert_eq(o.interleave, 16);
	cr_assert_eq(bench_load_dcp(&o), 2);
	cr_assert_eq(bench_load_interleave(&o), 16);
	cr_assert_eq(PARSE(&o, err, "--tp", "4", "--dcp", "2", "--load-dcp", "4", "--load-interleave", "8"), 0, "%s",
		     err);
	cr_assert_eq(bench_load_dcp(&o), 4);
	cr_assert_eq(bench_load_interleave(&o), 8);
	cr_assert_eq(PARSE(&o, err, "--tp", "4", "--dcp", "4", "--load-interleave", "2"), 0, "%s", err);
	cr_assert_eq(bench_load_dcp(&o), 4, "--load-dcp defaults to --dcp alone");
	cr_assert_eq(bench_load_interleave(&o), 2);

	/* a DCP group is D consecutive TP ranks */
	cr_assert_eq(PARSE(&o, err, "--tp", "4", "--dcp", "3"), -EINVAL);
	cr_assert_str_eq(err, "--dcp 3 does not divide --tp 4 (a DCP group is 3 consecutive TP ranks)");
	cr_assert_eq(PARSE(&o, err, "--dcp", "2"), -EINVAL, "--tp defaults to 1");
	cr_assert(strstr(err, "--dcp 2 does not divide --tp 1"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--tp", "4", "--dcp", "2", "--load-dcp", "3"), -EINVAL);
	cr_assert(strstr(err, "--load-dcp 3 does not divide --tp 4"), "%s", err);
	/* the interleave rule, with kvr_dcp_check's reason */
	cr_assert_eq(PARSE(&o, err, "--tp", "2", "--dcp", "2", "--interleave", "128"), -EINVAL);
	cr_assert_str_eq(err, "--dcp 2 --interleave 128 with --block-tokens 128: dcp: block_tokens 128 is not a multiple "
			      "of dcp_size 2 x dcp_interleave 128 = 256 (in block 0 rank 0 would hold 128 tokens, rank 1 0)");
	cr_assert_eq(PARSE(&o, err, "--tp", "4", "--dcp", "4", "--block-tokens", "64", "--load-interleave", "32"), -EINVAL);
	cr_assert(strstr(err, "--load-dcp 4 --load-interleave 32 with --block-tokens 64: dcp: block_tokens 64 is not a "
			      "multiple of dcp_size 4 x dcp_interleave 32 = 128"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--tp", "2", "--dcp", "2", "--block-tokens", "24", "--interleave", "16"), -EINVAL);
	cr_assert(strstr(err, "(in block 0 rank 0 would hold 16 tokens, rank 1 8)"), "%s", err);
	/* D = 1: any interleave splits (it has no effect) */
	cr_assert_eq(PARSE(&o, err, "--interleave", "16"), 0, "%s", err);
	/* ranges */
	cr_assert_eq(PARSE(&o, err, "--dcp", "0"), -EINVAL);
	cr_assert(strstr(err, "out of range"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--tp", "16", "--dcp", "17"), -EINVAL);
	cr_assert(strstr(err, "out of range"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--interleave", "0"), -EINVAL);
	cr_assert_eq(PARSE(&o, err, "--dcp"), -EINVAL);
	cr_assert(strstr(err, "needs a value"), "%s", err);
}

Test(bench, plan_dcp_mla_mha_and_cross_layout)
{
	struct bench_opts o = defaults();
	struct bench_plan pl;
	char err[256];
	/* DeepSeek-V3 (61 layers, 1,152-byte latent rows), TP 4 / DCP 2 / I 16, 128-token blocks */
	o.model = "deepseek-v3";
	o.tp = 4;
	o.dcp = 2;
	o.interleave = 16;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.lanes, 1);
	cr_assert_eq(pl.lane_bytes, 61ull * 128 * 1152, "the canonical lane");
	cr_assert_eq(pl.block_bytes, pl.lane_bytes);
	cr_assert_eq(pl.st.dcp, 2);
	cr_assert_eq(pl.st.groups, 2);
	cr_assert_eq(pl.storing_groups, 1, "MLA: one group stores, every group holds the same latent");
	cr_assert_eq(pl.st.rank_bytes, 61ull * 64 * 1152);
	cr_assert_eq(pl.st.runs, 61 * 4, "64 rows a page in runs of 16");
	cr_assert_eq(pl.st.run_bytes, 16 * 1152);
	cr_assert_eq(pl.st.kv_bytes, 16 * pl.st.rank_bytes);
	cr_assert_eq(memcmp(&pl.st, &pl.ld, sizeof(pl.st)), 0);
	struct kvr_geometry g;
	cr_assert_eq(bench_rank_geometry(&o, &pl, 3, 2, 16, &g), 0);
	cr_assert(g.tp_rank == 3 && g.tp_size == 4 && g.dcp_size == 2 && g.dcp_rank == 1 && g.dcp_interleave == 16);
	cr_assert_eq(g.block_tokens, 128, "the canonical block");
	cr_assert_eq(g.page_bytes[60], 64 * 1152);
	cr_assert_eq(kvr_dcp_group_index(&g), 1);
	cr_assert_eq(kvr_geometry_validate(&g, kvr_geometry_kv_extent(&g), err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(bench_rank_geometry(&o, &pl, 4, 2, 16, &g), -EINVAL, "no rank 4 of 4");
	cr_assert_eq(bench_rank_geometry(&o, &pl, 0, 3, 1, &g), -EINVAL, "3 does not divide 4");

	/* cross-layout: rows load under any layout; the warm KV memory is the DCP 4 one */
	o.load_dcp = 4;
	o.load_interleave = 1;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.ld.rank_bytes, 61ull * 32 * 1152);
	cr_assert_eq(pl.ld.runs, 61 * 32);
	cr_assert_eq(pl.ld.run_bytes, 1152);
	cr_assert_eq(pl.kv_bytes, pl.st.kv_bytes, "the larger of the two");

	/* deepseek-v3.2-fp8 at TP 4 / DCP 4, 64-token blocks: 16 rows of 656 + a 16 x 132-byte tail */
	o = defaults();
	o.model = "deepseek-v3.2-fp8";
	o.tp = 4;
	o.dcp = 4;
	o.block_tokens = 64;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.st.rank_bytes, 61ull * 16 * (656 + 132));
	cr_assert_eq(pl.lane_bytes, 3076352, "docs/geometry.md: the same canonical lane at D = 1 and D = 4");
	cr_assert_eq(pl.st.runs, 61 * 17, "16 row runs and a tail per page");
	cr_assert_eq(pl.storing_groups, 1);
	o.load_dcp = 2;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "page tails") && strstr(err, "(dcp 4, interleave 1)"), "%s", err);
	o.load_dcp = 4;
	o.load_interleave = 2; /* D = 4: the interleave is part of the layout */
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), -EINVAL);

	/* MHA (qwen3-8b: 8 KV heads), TP 4 / DCP 2: two lanes of 4 heads, each stored by a group */
	o = defaults();
	o.tp = 4;
	o.dcp = 2;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl.lanes, 2);
	cr_assert_eq(pl.storing_groups, 2);
	cr_assert_eq(pl.lane_bytes, 36ull * 2 * 128 * 4 * 128 * 2);
	cr_assert_eq(pl.st.rank_bytes, pl.lane_bytes / 2);
	cr_assert_eq(pl.block_bytes, 2 * pl.lane_bytes);
	cr_assert_eq(bench_rank_geometry(&o, &pl, 2, 2, 1, &g), 0);
	cr_assert(g.kv_heads == 4 && g.tp_rank == 2 && g.dcp_rank == 0 && kvr_dcp_lane(&g) == 1);
	o.load_dcp = 4;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "MHA") && strstr(err, "(2, 1)"), "%s", err);
	o.load_dcp = 2;
	o.load_interleave = 4; /* same lanes, rows only: fine */
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
}

/* A small DCP model: deepseek-v3.2-fp8 (656-byte rows, 132 tail bytes a token) at TP 2 /
 * DCP 2 / I 2 with 16-token blocks, two engine blocks a rank. */
static void small_dcp_plan(struct bench_opts *o, struct bench_plan *pl, uint32_t il)
{
	char err[256];
	*o = defaults();
	o->model = "deepseek-v3.2-fp8";
	o->tp = 2;
	o->dcp = 2;
	o->interleave = il;
	o->block_tokens = 16;
	o->input_len = 32;
	o->prefix_len = 0;
	o->prompts = 1;
	o->concurrency = 1;
	cr_assert_eq(bench_plan_make(o, pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl->num_blocks, 2);
}

Test(bench, dcp_pattern_is_a_function_of_the_global_token)
{
	struct bench_opts o;
	struct bench_plan pl;
	small_dcp_plan(&o, &pl, 2);
	struct kvr_geometry g[2];
	uint8_t *kv[2];
	const uint64_t seed = 0x1234;
	for (uint32_t r = 0; r < 2; r++) {
		cr_assert_eq(bench_rank_geometry(&o, &pl, r, 2, 2, &g[r]), 0);
		kv[r] = calloc(1, pl.st.kv_bytes);
		bench_block_fill(&g[r], kv[r], 1, seed);
		cr_assert(bench_block_check(&g[r], kv[r], 1, seed));
		cr_assert(bench_block_is_zero(&g[r], kv[r], 0), "block 0 untouched");
	}
	/* gather both ranks' pages with kvringd's runs: rows are the lane pattern in global order,
	 * each rank's tail the tail pattern at its place */
	uint8_t *lane = calloc(1, pl.lane_bytes);
	struct kvr_dcp_run runs[61 * 9];
	char err[160];
	for (uint32_t r = 0; r < 2; r++) {
		int n = kvr_dcp_lane_runs(&g[r], 1, 0, runs, 61 * 9, err, sizeof(err));
		cr_assert_eq(n, 61 * 5, "%s", err);
		for (int k = 0; k < n; k++)
			memcpy(lane + runs[k].slot_off, kv[r] + runs[k].kv_off, runs[k].len);
	}
	const uint32_t row = 656, tail = 8 * 132;
	uint64_t off = 0, tseed = bench_tail_seed(seed, 2, 2);
	cr_assert_neq(tseed, seed);
	cr_assert_eq(bench_tail_seed(seed, 1, 16), seed, "D = 1: the page is one piece of the lane pattern");
	for (unsigned i = 0; i < 61; i++) {
		cr_assert_eq(kvr_dcp_canonical_region_offset(&g[0], i), off);
		cr_assert_eq(bench_pattern_check(seed, off, lane + off, 16 * row), -1, "region %u rows", i);
		for (uint32_t r = 0; r < 2; r++) {
			uint64_t t = off + 16 * row + r * tail;
			cr_assert_eq(bench_pattern_check(tseed, t, lane + t, tail), -1, "region %u tail of rank %u", i, r);
		}
		off += 16 * row + 2 * tail;
	}
	cr_assert_eq(off, pl.lane_bytes);

	/* rows at the wrong place fail: swap local rows 1 and 2 (global tokens 1 and 4) of region 7 */
	struct kvr_region reg = kvr_geometry_region(&g[0], 7);
	uint8_t *p = kv[0] + reg.offset + reg.stride, tmp[656];
	memcpy(tmp, p + row, row);
	memcpy(p + row, p + 2 * row, row);
	memcpy(p + 2 * row, tmp, row);
	cr_assert(!bench_block_check(&g[0], kv[0], 1, seed));
	memcpy(p + 2 * row, p + row, row);
	memcpy(p + row, tmp, row);
	cr_assert(bench_block_check(&g[0], kv[0], 1, seed));
	/* rank 1's page is not rank 0's, and a tail of another layout is not this one's */
	cr_assert(!bench_block_check(&g[0], kv[1], 1, seed));
	struct kvr_geometry g1 = g[0];
	g1.dcp_interleave = 1;
	uint8_t *other = calloc(1, pl.st.kv_bytes);
	bench_block_fill(&g1, other, 1, seed);
	memcpy(p + 8 * row, other + reg.offset + reg.stride + 8 * row, tail); /* region 7's tail under I = 1 */
	cr_assert(!bench_block_check(&g[0], kv[0], 1, seed));
	free(other);
	free(lane);
	free(kv[0]);
	free(kv[1]);
}

Test(bench, spawn_config_dcp)
{
	struct bench_opts o = defaults();
	struct bench_plan pl;
	char err[256];
	o.spawn = true;
	o.tp = 4;
	o.dcp = 2;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	char *text = bench_server_config(&o, &pl, "/s");
	cJSON *root = cJSON_Parse(text);
	cr_assert_eq(path(root, "model", "tp_size")->valuedouble, 2, "MHA: the instance serves tp / dcp lanes");
	cr_assert_eq(path(root, "instance", "max_workers")->valuedouble, 4);
	cr_assert_geq(path(root, "l1", "capacity_bytes")->valuedouble, (double)pl.unique_bytes * 1.25);
	cJSON_Delete(root);
	free(text);
	o.model = "deepseek-v3";
	o.load_dcp = 4;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	text = bench_server_config(&o, &pl, "/s");
	root = cJSON_Parse(text);
	cr_assert_eq(path(root, "model", "tp_size")->valuedouble, 4, "MLA: the model as without DCP");
	cr_assert_eq(path(root, "instance", "max_workers")->valuedouble, 8, "every rank attaches twice");
	cJSON_Delete(root);
	free(text);
}

Test(bench, summary_rank_load_ratios)
{
	struct bench_opts o = defaults();
	o.model = "deepseek-v3";
	o.tp = 2;
	o.dcp = 2;
	o.prompts = 2;
	struct bench_plan pl;
	char err[256];
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	struct bench_rank_result res[2] = {0};
	uint64_t z[2] = {0};
	struct bench_samples smp[2] = {{z, z, z, z, z}, {z, z, z, z, z}};
	for (int r = 0; r < 2; r++) {
		res[r].ld_requests = 2;
		res[r].ld_matched_blocks = 16;
		res[r].ld_exact_prompts = 2;
		res[r].ld_bytes = 16 * pl.st.rank_bytes;
		res[r].ld_ns = 3000000;
		res[r].ld_memcpy_ns = 1000000;
	}
	res[0].ld_load_ns = 2000000; /* 0.5 of memcpy */
	res[1].ld_load_ns = 800000;  /* 1.25 */
	res[0].ld_group_ns = 2000000; /* the group's rank 0: both ranks' bytes, the group's window */
	res[0].ld_group_memcpy_ns = 1800000;
	res[0].st_stored = 10;
	res[0].st_bytes = 10 * pl.lane_bytes;
	res[0].st_ns = 4000000;
	res[0].st_memcpy_ns = 3000000;
	struct bench_summary s;
	bench_summarise(&o, &pl, res, smp, 0, &s);
	cr_assert_float_eq(s.ld_rank_ratio[0], 0.5, 1e-12);
	cr_assert_float_eq(s.ld_rank_ratio[1], 1.25, 1e-12);
	cr_assert_float_eq(s.ld_rank_ratio_min, 0.5, 1e-12);
	cr_assert_eq(s.ld_load_ns, 2000000, "the slowest rank");
	cr_assert_float_eq(s.ld_load_ratio, 0.5, 1e-9);
	cr_assert_float_eq(s.st_ratio, 0.75, 1e-9, "the group's bytes over its window vs one memcpy thread");
	cr_assert_float_eq(s.ld_group_ratio, 0.9, 1e-9);
	cr_assert_float_eq(s.ld_group_gbps, (double)(32 * pl.st.rank_bytes) / 2e6, 1e-9);
	char *text = bench_json(&o, &pl, &s);
	cJSON *root = cJSON_Parse(text);
	cr_assert_not_null(root, "%s", text);
	cr_assert_eq(path(root, "config", "dcp")->valuedouble, 2);
	cr_assert_eq(path(root, "config", "load_dcp")->valuedouble, 2);
	cr_assert_eq(path(root, "plan", "rank_bytes")->valuedouble, (double)pl.st.rank_bytes);
	cr_assert_eq(path(root, "plan", "copy_runs_per_rank")->valuedouble, 61 * 64);
	cJSON *rr = path(root, "warm", "rank_load_ratio");
	cr_assert_eq(cJSON_GetArraySize(rr), 2);
	cr_assert_float_eq(cJSON_GetArrayItem(rr, 1)->valuedouble, 1.25, 1e-12);
	cr_assert_float_eq(path(root, "warm", "rank_load_ratio_min")->valuedouble, 0.5, 1e-12);
	cr_assert(cJSON_IsFalse(path(root, "warm", "copy_goal_met")), "0.5 < 0.7");
	cr_assert(cJSON_IsTrue(path(root, "cold", "copy_goal_met")), "0.75 >= 0.7");
	cr_assert_float_eq(path(root, "cold", "copy_goal_ratio_min")->valuedouble, 0.7, 1e-12);
	cr_assert_float_eq(path(root, "warm", "group_load_ratio")->valuedouble, 0.9, 1e-9);
	cr_assert_eq(path(root, "warm", "group_memcpy_time_ns")->valuedouble, 1800000);
	cJSON_Delete(root);
	free(text);

	/* the table names the layout and fits 100 columns */
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	bench_print_header(f, &o, &pl);
	bench_print_table(f, &o, &pl, &s);
	fclose(f);
	cr_assert(strstr(buf, "dcp: cold D 2 I 1, 1 group of 2 ranks, 1 storing: a rank's block 4.29 MiB in 3904 runs "
			     "<= 1.1 KiB\n     warm D 2 I 1: a rank's block 4.29 MiB in 3904 runs <= 1.1 KiB\n"), "%s", buf);
	cr_assert(strstr(buf, "  DCP gather, D 2 ") && strstr(buf, "0.75    >= 0.70 met"), "%s", buf);
	cr_assert(strstr(buf, " 0.50 1.25   min 0.50"), "%s", buf);
	cr_assert(strstr(buf, "  DCP scatter, D 2 ") && strstr(buf, "0.90    (a group: D loaders, 1 memcpy)"), "%s", buf);
	for (char *line = buf, *nl; *line; line = nl + 1) {
		nl = strchr(line, '\n');
		cr_assert_not_null(nl);
		cr_assert_leq(nl - line, 100, "line too long: %.*s", (int)(nl - line), line);
	}
	free(buf);
}

/* ---- DCP through a real kvringd (--spawn) ----------------------------------------------------- */

/* Run kvring-bench from the build tree with args (--spawn --quiet --no-plot --json FILE added);
 * returns its exit status and the parsed JSON (NULL when none). The output goes to a log that
 * a failed assertion prints. */
static int run_bench(const char *const *args, cJSON **ret_json, char *log, size_t loglen)
{
	const char *root = getenv("KVR_BUILD_ROOT");
	cr_assert_not_null(root, "KVR_BUILD_ROOT is not set (meson test sets it)");
	char exe[512], json[96], logp[96];
	snprintf(exe, sizeof(exe), "%s/tools/bench/kvring-bench", root);
	snprintf(json, sizeof(json), "/tmp/kvr-bench-dcp.%d.json", (int)getpid());
	snprintf(logp, sizeof(logp), "/tmp/kvr-bench-dcp.%d.log", (int)getpid());
	const char *argv[48] = {exe, "--spawn", "--quiet", "--no-plot", "--json", json};
	size_t n = 6;
	for (size_t i = 0; args[i]; i++) {
		cr_assert_lt(n, 47);
		argv[n++] = args[i];
	}
	argv[n] = NULL;
	unlink(json);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (!pid) {
		FILE *l = freopen(logp, "w", stdout);
		if (!l || dup2(fileno(stdout), STDERR_FILENO) < 0)
			_exit(126);
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	FILE *l = fopen(logp, "r");
	size_t got = l ? fread(log, 1, loglen - 1, l) : 0;
	log[got] = '\0';
	if (l)
		fclose(l);
	unlink(logp);
	*ret_json = NULL;
	FILE *f = fopen(json, "r");
	if (f) {
		static char text[1 << 16];
		size_t len = fread(text, 1, sizeof(text) - 1, f);
		text[len] = '\0';
		fclose(f);
		*ret_json = cJSON_Parse(text);
	}
	unlink(json);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static double jnum(cJSON *root, const char *a, const char *b)
{
	return path(root, a, b)->valuedouble;
}

/* One run, every byte checked: ranks x prompts exact, every full block matched, the store and
 * load ratios against memcpy present and > 0. */
static void dcp_run(const char *model, uint32_t tp, const char *const *extra, uint32_t prompts, uint32_t blocks,
		    uint32_t unique)
{
	char tps[16], pr[16], log[8192];
	snprintf(tps, sizeof(tps), "%u", tp);
	snprintf(pr, sizeof(pr), "%u", prompts);
	const char *args[32] = {"--model", model, "--tp", tps, "--prompts", pr, "--concurrency", "2"};
	size_t n = 8;
	for (size_t i = 0; extra[i]; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	cJSON *j;
	int rc = run_bench(args, &j, log, sizeof(log));
	cr_assert_eq(rc, 0, "kvring-bench exit %d:\n%s", rc, log);
	cr_assert_not_null(j, "no JSON:\n%s", log);
	cr_assert(cJSON_IsTrue(path(j, "ok", NULL)));
	cr_assert_eq(jnum(j, "errors", NULL), 0);
	/* cold: the group's counts, canonical bytes */
	cr_assert_eq(jnum(j, "cold", "stored_blocks"), unique, "%s", log);
	cr_assert_eq(jnum(j, "cold", "stored_blocks") + jnum(j, "cold", "present_blocks"), prompts * blocks);
	cr_assert_eq(jnum(j, "cold", "bytes"), unique * jnum(j, "plan", "lane_bytes"));
	cr_assert_gt(jnum(j, "cold", "ratio"), 0);
	cr_assert_gt(jnum(j, "cold", "memcpy_time_ns"), 0);
	/* warm: every rank loads every prompt, every byte checked */
	cJSON *v = path(j, "warm", "verify");
	cr_assert_eq(cJSON_GetObjectItem(v, "exact_prompts")->valuedouble, tp * prompts);
	cr_assert_eq(cJSON_GetObjectItem(v, "mismatch_blocks")->valuedouble, 0);
	cr_assert_eq(cJSON_GetObjectItem(v, "stray_blocks")->valuedouble, 0);
	cr_assert_eq(jnum(j, "warm", "matched_blocks"), tp * prompts * blocks);
	cr_assert_eq(jnum(j, "warm", "bytes"), tp * prompts * blocks * jnum(j, "plan", "load_rank_bytes"));
	cr_assert_gt(jnum(j, "warm", "load_ratio"), 0);
	cJSON *rr = path(j, "warm", "rank_load_ratio");
	cr_assert_eq(cJSON_GetArraySize(rr), (int)tp);
	for (uint32_t r = 0; r < tp; r++)
		cr_assert_gt(cJSON_GetArrayItem(rr, (int)r)->valuedouble, 0, "rank %u", r);
	cr_assert_gt(jnum(j, "warm", "rank_load_ratio_min"), 0);
	cr_assert_gt(jnum(j, "warm", "group_load_ratio"), 0);
	cr_assert_gt(jnum(j, "warm", "group_memcpy_time_ns"), 0);
	cJSON_Delete(j);
}

/* 3 prompts of 4 blocks of 64 tokens sharing their first block: 10 distinct blocks */
#define SMALL "--block-tokens", "64", "--input-len", "256", "--prefix-len", "64"

Test(bench, spawn_dcp2_mla, .timeout = 60)
{
	dcp_run("deepseek-v2-lite", 2, (const char *const[]){SMALL, "--dcp", "2", NULL}, 3, 4, 10);
}

Test(bench, spawn_dcp2_interleave8_mla, .timeout = 60)
{
	dcp_run("deepseek-v2-lite", 2, (const char *const[]){SMALL, "--dcp", "2", "--interleave", "8", NULL}, 3, 4, 10);
}

Test(bench, spawn_dcp2_tails_fp8, .timeout = 60)
{
	dcp_run("deepseek-v3.2-fp8", 2, (const char *const[]){SMALL, "--dcp", "2", "--interleave", "4", NULL}, 3, 4, 10);
}

Test(bench, spawn_dcp2_cross_layout_to_dcp1, .timeout = 60)
{
	dcp_run("deepseek-v2-lite", 2, (const char *const[]){SMALL, "--dcp", "2", "--load-dcp", "1", NULL}, 3, 4, 10);
}

/* ---- --remote ------------------------------------------------------------------------------ */

Test(bench, opts_remote)
{
	struct bench_opts o;
	char err[256];
	int rc = PARSE(&o, err, "--spawn", "--remote", "127.0.0.1:7000,localhost:7001,[::1]:7002", "--remote-inflight", "8",
		       "--warm-concurrency", "1");
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_eq(o.n_remote, 3);
	cr_assert_str_eq(o.remote_seed[0], "127.0.0.1:7000");
	cr_assert_str_eq(o.remote_seed[1], "localhost:7001");
	cr_assert_str_eq(o.remote_seed[2], "[::1]:7002");
	cr_assert_eq(o.remote_inflight, 8);
	cr_assert_eq(o.warm_concurrency, 1);
	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", "h:1"), 0, "%s", err);
	cr_assert_eq(o.n_remote, 1);
	cr_assert_eq(o.remote_inflight, BENCH_REMOTE_INFLIGHT);
	cr_assert_eq(o.warm_concurrency, 0, "the warm phase's concurrency is --concurrency's");
	cr_assert_eq(defaults().n_remote, 0);

	static const char *const bad[] = {"127.0.0.1", ":7000", "h:0", "h:70000", "h:7x", "a:1,a:1", "a:1,", ",a:1",
					  "[::1:7000", ""};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", bad[i]), -EINVAL, "\"%s\" accepted", bad[i]);
		cr_assert(strstr(err, "--remote"), "%s", err);
	}
	char many[17 * 8 + 1] = "", lng[80];
	for (int i = 0; i < 17; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sh:%d", i ? "," : "", 7000 + i);
	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", many), -EINVAL);
	cr_assert(strstr(err, "more than 16"), "%s", err);
	memset(lng, 'h', 60);
	snprintf(lng + 60, sizeof(lng) - 60, ":7000");
	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", lng), -EINVAL, "a 65-byte seed");
	lng[58] = '\0';
	strcat(lng, ":7000");
	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", lng), 0, "a 63-byte seed: %s", err);

	cr_assert_eq(PARSE(&o, err, "--remote", "h:1"), -EINVAL);
	cr_assert(strstr(err, "--spawn"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote-inflight", "4"), -EINVAL);
	cr_assert(strstr(err, "needs --remote"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", "h:1", "--remote-inflight", "0"), -EINVAL);
	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", "h:1", "--phases", "warm"), -EINVAL);
	cr_assert(strstr(err, "--phases"), "%s", err);
	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", "h:1", "--evict"), -EINVAL);
	cr_assert_eq(PARSE(&o, err, "--concurrency", "2", "--warm-concurrency", "3"), -EINVAL);
	cr_assert(strstr(err, "--warm-concurrency 3"), "%s", err);
}

Test(bench, spawn_config_remote)
{
	struct bench_opts o = defaults();
	char err[256];
	struct bench_plan pl;
	cr_assert_eq(bench_plan_make(&o, &pl, err, sizeof(err)), 0, "%s", err);
	char *text = bench_server_config(&o, &pl, "/s");
	cJSON *root = cJSON_Parse(text);
	cr_assert_null(cJSON_GetObjectItem(root, "remote"), "no remote section without --remote");
	cJSON_Delete(root);
	free(text);

	cr_assert_eq(PARSE(&o, err, "--spawn", "--remote", "127.0.0.1:7000,127.0.0.1:7001", "--remote-inflight", "6"), 0);
	text = bench_server_config(&o, &pl, "/s");
	root = cJSON_Parse(text);
	cr_assert_not_null(root, "%s", text);
	cJSON *cl = path(root, "remote", "cluster");
	cr_assert_eq(cJSON_GetArraySize(cl), 2);
	cr_assert_str_eq(cJSON_GetArrayItem(cl, 0)->valuestring, "127.0.0.1:7000");
	cr_assert_str_eq(cJSON_GetArrayItem(cl, 1)->valuestring, "127.0.0.1:7001");
	cr_assert_eq(path(root, "remote", "max_inflight")->valuedouble, 6);
	cr_assert_eq(path(root, "remote", "timeout_ms")->valuedouble, BENCH_REMOTE_TIMEOUT_MS);
	cJSON_Delete(root);
	free(text);
}

/* The 5 MiB geometry of tools/bench/remote-bench.sh: 40 tokens of Llama-3.1-8B (128 KiB each). */
static void remote_plan(struct bench_opts *o, struct bench_plan *pl)
{
	char err[256];
	cr_assert_eq(PARSE(o, err, "--spawn", "--remote", "127.0.0.1:7000", "--model", "llama-3.1-8b", "--block-tokens",
			   "40", "--input-len", "320", "--prefix-len", "0", "--concurrency", "8", "--warm-concurrency", "1"),
		     0, "%s", err);
	cr_assert_eq(bench_plan_make(o, pl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(pl->lane_bytes, 5ull << 20, "one lane of one block is 5 MiB");
	cr_assert_eq(pl->unique_blocks, 64);
	cr_assert_eq(pl->remote_value_bytes, (5ull << 20) + 128, "the value: rvalue.h's 128-byte header + the lane");
}

static struct bench_dist lat_of(uint64_t p50, uint64_t p99)
{
	return (struct bench_dist){.n = 8, .mean = (double)p50, .p50 = p50, .p99 = p99, .max = p99};
}

Test(bench, remote_summary_counts_what_failed)
{
	struct bench_opts o;
	struct bench_plan pl;
	remote_plan(&o, &pl);
	const uint64_t bytes = 64 * pl.lane_bytes;
	/* A: cold + warm from L1, clean; B: warm, every block loaded exactly */
	struct bench_summary a0 = {.ran_cold = true, .ran_warm = true, .exact = true, .ok = true, .ld_gbps = 4.0,
				   .ld_requests = 8, .ld_exact_prompts = 8, .lat = lat_of(10000000, 12000000)};
	struct bench_summary b = {.ran_warm = true, .exact = true, .ok = true, .ld_bytes = bytes, .ld_ns = 800000000,
				  .ld_gbps = bench_gbps(bytes, 800000000), .ld_requests = 8, .ld_exact_prompts = 8,
				  .lat = lat_of(100000000, 180000000)};
	struct bench_remote raw = {.seeds = 1, .inflight = 4, .wr_expected = 64, .wr_handed = 64, .wr_acked = 64,
				   .wr_bytes = bytes, .wr_ns = 1000000000, .wr_tail_ns = 400000000, .wr_settled = true,
				   .rd_expected = 64, .rd_reads = 64, .rd_hits = 64, .rd_lk_reads = 64, .rd_bytes = bytes,
				   .rd_ns = 500000000};
	struct bench_summary s = a0;
	bench_remote_summarise(&pl, &b, &raw, &s);
	cr_assert(s.rm.ran && s.ok, "errors %" PRIu64, s.rm.errors);
	cr_assert_eq(s.rm.errors, 0);
	cr_assert_eq(s.rm.value_bytes, pl.remote_value_bytes);
	cr_assert_float_eq(s.rm.wr_gbps, (double)bytes / 1e9, 1e-9);
	cr_assert_float_eq(s.rm.rd_gbps, (double)bytes / 5e8, 1e-9);
	cr_assert_float_eq(s.rm.p50_ratio, 10.0, 1e-9);
	cr_assert_float_eq(s.rm.p99_ratio, 15.0, 1e-9);
	cr_assert_float_eq(s.rm.a_gbps, 4.0, 1e-12);
	cr_assert_float_eq(s.rm.b_gbps, b.ld_gbps, 1e-12);
	cr_assert_eq(s.rm.b_exact, 8);

	char *text = bench_json(&o, &pl, &s);
	cJSON *root = cJSON_Parse(text);
	cr_assert_not_null(root, "%s", text);
	cJSON *rm = path(root, "remote", NULL);
	cr_assert_eq(path(rm, "write", "gbps")->valuedouble, s.rm.wr_gbps);
	cr_assert_eq(path(rm, "write", "acked_lanes")->valuedouble, 64);
	cr_assert(cJSON_IsTrue(path(rm, "write", "settled")));
	cr_assert_eq(path(rm, "read", "hits")->valuedouble, 64);
	cr_assert_eq(path(rm, "read", "gbps")->valuedouble, s.rm.rd_gbps);
	cr_assert_eq(cJSON_GetObjectItem(path(rm, "b_warm", "latency_ns"), "p50")->valuedouble, 100000000);
	cr_assert_eq(cJSON_GetObjectItem(path(rm, "a_warm", "latency_ns"), "p99")->valuedouble, 12000000);
	cr_assert_eq(path(rm, "p50_ratio", NULL)->valuedouble, 10.0);
	cr_assert_eq(path(rm, "value_bytes", NULL)->valuedouble, (double)pl.remote_value_bytes);
	cr_assert_str_eq(cJSON_GetArrayItem(path(rm, "cluster", NULL), 0)->valuestring, "127.0.0.1:7000");
	cr_assert_eq(path(root, "plan", "remote_value_bytes")->valuedouble, (double)pl.remote_value_bytes);
	cr_assert_eq(path(root, "config", "warm_concurrency")->valuedouble, 1);
	cJSON_Delete(root);
	free(text);

	/* the table: every line of the tier's part fits 100 columns */
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	bench_print_tail(f, &s);
	fclose(f);
	cr_assert(strstr(buf, "write (A, SET)") && strstr(buf, "read (B, GET)") && strstr(buf, "result: PASS"), "%s", buf);
	for (char *line = buf, *nl; *line; line = nl + 1) {
		nl = strchr(line, '\n');
		cr_assert_not_null(nl);
		cr_assert_leq(nl - line, 100, "line too long: %.*s", (int)(nl - line), line);
	}
	free(buf);

	/* each failure of the tier is counted, and fails the run */
	struct bench_remote r;
	struct bench_summary bb;
#define SPOIL(expect, ...)                                                                                     \
	do {                                                                                                   \
		r = raw;                                                                                       \
		bb = b;                                                                                        \
		__VA_ARGS__;                                                                                   \
		s = a0;                                                                                        \
		bench_remote_summarise(&pl, &bb, &r, &s);                                                      \
		cr_assert_eq(s.rm.errors, (uint64_t)(expect), "%s: %" PRIu64 " errors", #__VA_ARGS__, s.rm.errors); \
		cr_assert(!s.ok && s.errors == (uint64_t)(expect), "%s", #__VA_ARGS__);                        \
	} while (0)
	SPOIL(1, r.wr_handed = 63, r.wr_acked = 63, r.wr_skipped = 1);
	SPOIL(2, r.wr_acked = 62, r.wr_errors = 2);
	SPOIL(1, r.wr_acked = 63, r.wr_stale = 1);
	SPOIL(3, r.wr_acked = 62, r.wr_settled = false);  /* two unanswered, and the wait timed out */
	SPOIL(1, r.wr_handed = 63, r.wr_acked = 63);      /* a lane never handed over */
	SPOIL(2, r.rd_hits = 63, r.rd_misses = 1);        /* one not a hit, and one hit short */
	SPOIL(2, r.rd_hits = 63, r.rd_bad = 1);
	SPOIL(1, r.rd_hits = 65);                          /* a lane read twice */
	SPOIL(3, bb.ld_misses = 2, bb.exact = false, bb.ld_exact_prompts = 7);
	SPOIL(1, bb.errors = 1);
#undef SPOIL
}

/* --remote with no cluster behind the seed: the bench says so and fails, it does not hang. */
Test(bench, spawn_remote_without_a_cluster_fails, .timeout = 60)
{
	char log[8192];
	cJSON *j;
	const char *args[] = {"--remote", "127.0.0.1:1", "--timeout-ms", "1500", SMALL, "--prompts", "2", NULL};
	int rc = run_bench(args, &j, log, sizeof(log));
	cr_assert_eq(rc, 1, "kvring-bench exit %d:\n%s", rc, log);
	cr_assert(strstr(log, "hash slots") && strstr(log, "kvringd A"), "%s", log);
	cJSON_Delete(j);
}
