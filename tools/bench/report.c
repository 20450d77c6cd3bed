/* kvring-bench report: combine the ranks' results, print the table, build the JSON document. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "kvr_build_config.h"

#define LOOKUP_GOAL_NS 20000ull /* hash + index for a 10,000-token prompt */

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

enum sample_field { F_LAT, F_HASH, F_INDEX, F_RT, F_HASH_INDEX, F_STORE_LAT };

/* One field of every rank's samples in one array (caller frees); NULL when there are none. */
static uint64_t *gather(const struct bench_opts *o, const struct bench_rank_result *res,
			const struct bench_samples *samples, enum sample_field field, size_t *ret_n)
{
	size_t total = 0;
	for (uint32_t r = 0; r < o->tp; r++)
		total += field == F_STORE_LAT ? res[r].st_samples : res[r].ld_samples;
	*ret_n = 0;
	uint64_t *v = total ? malloc(total * sizeof(*v)) : NULL;
	if (!v)
		return NULL;
	size_t n = 0;
	for (uint32_t r = 0; r < o->tp; r++) {
		const struct bench_samples *x = &samples[r];
		if (field == F_STORE_LAT) {
			if (res[r].st_samples)
				memcpy(v + n, x->st_lat_ns, res[r].st_samples * sizeof(*v));
			n += res[r].st_samples;
			continue;
		}
		for (uint64_t i = 0; i < res[r].ld_samples; i++)
			v[n++] = field == F_LAT ? x->lat_ns[i] : field == F_HASH ? x->hash_ns[i]
				 : field == F_INDEX ? x->index_ns[i] : field == F_RT ? x->rt_ns[i]
				 : x->hash_ns[i] + x->index_ns[i];
	}
	*ret_n = n;
	return v;
}

/* Merge one field of every rank's samples into one array and summarise it. */
static struct bench_dist merged(const struct bench_opts *o, const struct bench_rank_result *res,
				const struct bench_samples *samples, enum sample_field field)
{
	size_t n;
	uint64_t *v = gather(o, res, samples, field, &n);
	struct bench_dist d = bench_dist_of(v, n);
	free(v);
	return d;
}

uint64_t *bench_samples_merge(const struct bench_opts *o, const struct bench_rank_result *res,
			      const struct bench_samples *samples, bool warm, size_t *ret_n)
{
	return gather(o, res, samples, warm ? F_LAT : F_STORE_LAT, ret_n);
}

void bench_summarise(const struct bench_opts *o, const struct bench_plan *pl, const struct bench_rank_result *res,
		     struct bench_samples *samples, uint64_t extra_errors, struct bench_summary *ret)
{
	struct bench_summary s = {0};
	s.ran_cold = o->phases & BENCH_COLD;
	s.ran_warm = o->phases & BENCH_WARM;
	for (uint32_t r = 0; r < o->tp; r++) {
		const struct bench_rank_result *x = &res[r];
		s.st_requests += x->st_requests;
		s.st_tokens += x->st_tokens;
		s.st_blocks += x->st_blocks;
		s.st_stored += x->st_stored;
		s.st_present += x->st_present;
		s.st_bytes += x->st_bytes;
		s.st_ns = max_u64(s.st_ns, x->st_ns);
		s.st_fill_ns = max_u64(s.st_fill_ns, x->st_fill_ns);
		s.st_errors += x->st_errors;
		s.st_failed_blocks += x->st_failed_blocks;
		s.st_memcpy_ns = max_u64(s.st_memcpy_ns, x->st_memcpy_ns);
		s.ld_requests += x->ld_requests;
		s.ld_tokens += x->ld_tokens;
		s.ld_matched_tokens += x->ld_matched_tokens;
		s.ld_matched_blocks += x->ld_matched_blocks;
		s.ld_l2_blocks += x->ld_l2_blocks;
		s.ld_bytes += x->ld_bytes;
		s.ld_ns = max_u64(s.ld_ns, x->ld_ns);
		s.ld_load_ns = max_u64(s.ld_load_ns, x->ld_load_ns);
		s.ld_lookup_ns = max_u64(s.ld_lookup_ns, x->ld_lookup_ns);
		s.ld_group_ns = max_u64(s.ld_group_ns, x->ld_group_ns);
		s.ld_group_memcpy_ns = max_u64(s.ld_group_memcpy_ns, x->ld_group_memcpy_ns);
		s.ld_memcpy_ns = max_u64(s.ld_memcpy_ns, x->ld_memcpy_ns);
		s.ld_errors += x->ld_errors;
		s.ld_failed_blocks += x->ld_failed_blocks;
		s.ld_mismatch_blocks += x->ld_mismatch_blocks;
		s.ld_stray_blocks += x->ld_stray_blocks;
		s.ld_exact_prompts += x->ld_exact_prompts;
	}
	s.st_gbps = bench_gbps(s.st_bytes, s.st_ns);
	s.st_memcpy_gbps = bench_gbps(s.st_bytes, s.st_memcpy_ns);
	s.st_ratio = s.st_memcpy_gbps > 0 ? s.st_gbps / s.st_memcpy_gbps : 0;
	s.hit_rate = s.ld_tokens ? (double)s.ld_matched_tokens / (double)s.ld_tokens : 0;
	s.ld_gbps = bench_gbps(s.ld_bytes, s.ld_ns);
	s.ld_memcpy_gbps = bench_gbps(s.ld_bytes, s.ld_memcpy_ns);
	s.ld_time_ratio = s.ld_memcpy_ns ? (double)s.ld_ns / (double)s.ld_memcpy_ns : 0;
	s.ld_load_gbps = bench_gbps(s.ld_bytes, s.ld_load_ns);
	s.ld_load_ratio = s.ld_memcpy_gbps > 0 ? s.ld_load_gbps / s.ld_memcpy_gbps : 0;
	s.ld_group_gbps = bench_gbps(s.ld_bytes, s.ld_group_ns);
	s.ld_group_memcpy_gbps = bench_gbps(s.ld_bytes, s.ld_group_memcpy_ns);
	s.ld_group_ratio = s.ld_group_memcpy_gbps > 0 ? s.ld_group_gbps / s.ld_group_memcpy_gbps : 0;
	bool any = false;
	for (uint32_t r = 0; r < o->tp && r < KVR_MAX_TP; r++) {
		const struct bench_rank_result *x = &res[r];
		if (!x->ld_bytes || !x->ld_load_ns || !x->ld_memcpy_ns)
			continue;
		/* its bytes / its load time against its bytes / its memcpy time */
		s.ld_rank_ratio[r] = (double)x->ld_memcpy_ns / (double)x->ld_load_ns;
		if (!any || s.ld_rank_ratio[r] < s.ld_rank_ratio_min)
			s.ld_rank_ratio_min = s.ld_rank_ratio[r];
		any = true;
	}
	uint64_t expect = s.ld_requests * pl->full_blocks;
	s.ld_misses = expect > s.ld_matched_blocks ? expect - s.ld_matched_blocks : 0;
	s.ld_l1_hits = s.ld_matched_blocks - s.ld_l2_blocks;
	s.ld_l1_misses = expect - s.ld_l1_hits;
	if (s.ran_cold)
		s.st_lat = merged(o, res, samples, F_STORE_LAT);
	if (s.ran_warm) {
		s.lat = merged(o, res, samples, F_LAT);
		s.hash = merged(o, res, samples, F_HASH);
		s.index = merged(o, res, samples, F_INDEX);
		s.rt = merged(o, res, samples, F_RT);
		s.hash_index_p50_ns = merged(o, res, samples, F_HASH_INDEX).p50;
	}
	s.exact = !s.ran_warm || s.ld_exact_prompts == s.ld_requests;
	s.errors = s.st_errors + s.st_failed_blocks + s.ld_errors + s.ld_failed_blocks + s.ld_mismatch_blocks +
		   s.ld_stray_blocks + extra_errors;
	/* after our own cold phase every full block must be found, unless L1 is known to be smaller */
	if (s.ran_cold && s.ran_warm && !o->allow_misses)
		s.errors += s.ld_misses;
	/* --evict exists to exercise both tiers: a run where one of them served nothing failed */
	if (o->evict && s.ran_warm && (!s.ld_l1_hits || !s.ld_l2_blocks || !s.ld_l1_misses))
		s.errors++;
	s.ok = s.errors == 0 && s.exact;
	*ret = s;
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

void bench_remote_summarise(const struct bench_plan *pl, const struct bench_summary *b, const struct bench_remote *raw,
			    struct bench_summary *s)
{
	struct bench_remote rm = *raw;
	rm.ran = true;
	rm.value_bytes = pl->remote_value_bytes;
	rm.wr_gbps = bench_gbps(rm.wr_bytes, rm.wr_ns);
	rm.rd_gbps = bench_gbps(rm.rd_bytes, rm.rd_ns);
	rm.b_bytes = b->ld_bytes;
	rm.b_ns = b->ld_ns;
	rm.b_gbps = b->ld_gbps;
	rm.b_prompts = b->ld_requests;
	rm.b_exact = b->ld_exact_prompts;
	rm.b_missed = b->ld_misses;
	rm.b_errors = b->errors;
	rm.b_lat = b->lat;
	rm.a_lat = s->lat;
	rm.a_gbps = s->ld_gbps;
	rm.p50_ratio = ratio((double)rm.b_lat.p50, (double)rm.a_lat.p50);
	rm.p99_ratio = ratio((double)rm.b_lat.p99, (double)rm.a_lat.p99);
	/* A: every lane it stored handed to the remote actor and acknowledged by the cluster */
	uint64_t e = rm.wr_skipped + rm.wr_errors + rm.wr_stale;
	uint64_t handed_all = rm.wr_handed + rm.wr_skipped;
	e += handed_all > rm.wr_expected ? handed_all - rm.wr_expected : rm.wr_expected - handed_all;
	uint64_t answered = rm.wr_acked + rm.wr_errors + rm.wr_stale;
	e += answered < rm.wr_handed ? rm.wr_handed - answered : 0;
	e += !rm.wr_settled || !rm.wr_expected;
	/* B: every block from the cluster, each distinct lane read once, every byte as stored */
	e += rm.rd_misses + rm.rd_bad + rm.rd_errors;
	e += rm.rd_hits > rm.rd_expected ? rm.rd_hits - rm.rd_expected : rm.rd_expected - rm.rd_hits;
	e += b->errors + b->ld_misses + (b->exact ? 0 : 1);
	rm.errors = e;
	s->rm = rm;
	s->errors += e;
	s->ok = s->errors == 0 && s->exact;
}

/* ---- table ------------------------------------------------------------------------------- */

static double mib(uint64_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0);
}

void bench_print_header(FILE *f, const struct bench_opts *o, const struct bench_plan *pl)
{
	fprintf(f, "kvring-bench %s: model %s (%s)\n", KVR_VERSION, o->model, pl->preset->hf_id);
	fprintf(f, "geometry: tp %u, %u-token blocks of %.2f MiB per %s, %.2f MiB over %u lane%s\n", o->tp,
		o->block_tokens, mib(pl->lane_bytes), o->dcp > 1 ? "lane" : "rank", mib(pl->block_bytes), pl->lanes,
		pl->lanes == 1 ? "" : "s");
	fprintf(f, "workload: %u prompts x %u tokens, shared prefix %u tokens, concurrency %u", o->prompts, o->input_len,
		o->prefix_len, o->concurrency);
	if (o->warm_concurrency && o->warm_concurrency != o->concurrency)
		fprintf(f, " (warm %u)", o->warm_concurrency);
	fprintf(f, ", seed %" PRIu64 "\n", o->seed);
	fprintf(f, "          %" PRIu64 " distinct blocks = %.1f MiB over all ranks; engine KV memory %.1f MiB per "
		"rank\n", pl->unique_blocks, mib(pl->unique_bytes), mib(pl->kv_bytes));
	if (pl->st.dcp == 1 && pl->ld.dcp == 1 && pl->st.interleave == 1 && pl->ld.interleave == 1)
		return;
	fprintf(f, "dcp: cold D %u I %u, %u group%s of %u ranks, %u storing", pl->st.dcp, pl->st.interleave, pl->st.groups,
		pl->st.groups == 1 ? "" : "s", pl->st.dcp, pl->storing_groups);
	const struct bench_layout *l[2] = {&pl->st, &pl->ld};
	for (int i = 0; i < 2; i++) {
		if (i)
			fprintf(f, "     warm D %u I %u", l[i]->dcp, l[i]->interleave);
		fprintf(f, ": a rank's block %.2f MiB in %u runs <= %.1f KiB\n", mib(l[i]->rank_bytes), l[i]->runs,
			(double)l[i]->run_bytes / 1024.0);
	}
}

void bench_print_phases(FILE *f, const struct bench_opts *o, const struct bench_plan *pl,
			const struct bench_summary *s)
{
	char a[32], b[32], c[32], d[32];
	if (s->ran_cold) {
		fprintf(f, "\ncold: store                      kvring        memcpy   kvring/memcpy    goal\n");
		fprintf(f, "  bytes newly stored     %10.1f MiB\n", mib(s->st_bytes));
		fprintf(f, "  time                   %14s %13s\n", bench_fmt_ns(a, sizeof(a), (double)s->st_ns),
			bench_fmt_ns(b, sizeof(b), (double)s->st_memcpy_ns));
		fprintf(f, "  throughput             %9.2f GB/s %8.2f GB/s %11.2f    >= %.2f %s\n", s->st_gbps,
			s->st_memcpy_gbps, s->st_ratio, BENCH_STORE_GOAL_MIN,
			s->st_bytes ? (s->st_ratio >= BENCH_STORE_GOAL_MIN ? "met" : "missed") : "-");
		if (pl->st.dcp > 1)
			fprintf(f, "  DCP gather, D %-2u     %14s %13s %11.2f    >= %.2f %s\n", pl->st.dcp, "", "",
				s->st_ratio, BENCH_COPY_GOAL_MIN,
				s->st_bytes ? (s->st_ratio >= BENCH_COPY_GOAL_MIN ? "met" : "missed") : "-");
		fprintf(f, "  requests %" PRIu64 ", tokens %" PRIu64 ", blocks %" PRIu64 ": stored %" PRIu64
			", already present %" PRIu64 ", failed %" PRIu64 ", errors %" PRIu64 "\n",
			s->st_requests, s->st_tokens, s->st_blocks, s->st_stored, s->st_present, s->st_failed_blocks,
			s->st_errors);
		fprintf(f, "  latency / request      mean %s  p50 %s  p99 %s  (store submit -> done)\n",
			bench_fmt_ns(a, sizeof(a), s->st_lat.mean), bench_fmt_ns(b, sizeof(b), (double)s->st_lat.p50),
			bench_fmt_ns(c, sizeof(c), (double)s->st_lat.p99));
		fprintf(f, "  pattern fill (not timed) %s\n", bench_fmt_ns(a, sizeof(a), (double)s->st_fill_ns));
	}
	if (s->ran_warm) {
		fprintf(f, "\nwarm: lookup + load              kvring        memcpy   kvring/memcpy    goal\n");
		fprintf(f, "  bytes loaded           %10.1f MiB\n", mib(s->ld_bytes));
		fprintf(f, "  time                   %14s %13s %11.2f    <= %.2f %s\n",
			bench_fmt_ns(a, sizeof(a), (double)s->ld_ns),
			bench_fmt_ns(b, sizeof(b), (double)s->ld_memcpy_ns),
			s->ld_time_ratio, BENCH_LOAD_GOAL_MAX,
			s->ld_bytes ? (s->ld_time_ratio <= BENCH_LOAD_GOAL_MAX ? "met" : "missed") : "-");
		fprintf(f, "  throughput             %9.2f GB/s %8.2f GB/s\n", s->ld_gbps, s->ld_memcpy_gbps);
		fprintf(f, "  loads only (GB/s)      %9.2f GB/s %8.2f GB/s %11.2f    >= %.2f %s\n", s->ld_load_gbps,
			s->ld_memcpy_gbps, s->ld_load_ratio, BENCH_COPY_GOAL_MIN,
			s->ld_bytes ? (s->ld_load_ratio >= BENCH_COPY_GOAL_MIN ? "met" : "missed") : "-");
		fprintf(f, "  per rank (GB/s ratio) ");
		for (uint32_t r = 0; r < o->tp && r < KVR_MAX_TP; r++)
			fprintf(f, " %.2f", s->ld_rank_ratio[r]);
		fprintf(f, "   min %.2f  (%s)\n", s->ld_rank_ratio_min,
			pl->ld.dcp > 1 ? "DCP scatter: its bytes, its runs" : "its bytes, its pages");
		if (pl->ld.dcp > 1)
			fprintf(f, "  DCP scatter, D %-2u     %9.2f GB/s %8.2f GB/s %11.2f    (a group: D loaders, 1 memcpy)\n",
				pl->ld.dcp, s->ld_group_gbps, s->ld_group_memcpy_gbps, s->ld_group_ratio);
		fprintf(f, "  hit rate %.2f %% (%" PRIu64 " of %" PRIu64 " tokens; %" PRIu64 " in full blocks), %" PRIu64
			" blocks missed\n", 100.0 * s->hit_rate, s->ld_matched_tokens, s->ld_tokens,
			s->ld_requests * pl->full_blocks * o->block_tokens, s->ld_misses);
		if (o->evict || s->ld_l2_blocks)
			fprintf(f, "  tiers                  L1 hits %" PRIu64 " blocks, L1 misses %" PRIu64 ", L2 reads %" PRIu64
				"\n", s->ld_l1_hits, s->ld_l1_misses, s->ld_l2_blocks);
		fprintf(f, "  latency / request      mean %s  p50 %s  p99 %s  (lookup + load done)\n",
			bench_fmt_ns(a, sizeof(a), s->lat.mean), bench_fmt_ns(b, sizeof(b), (double)s->lat.p50),
			bench_fmt_ns(c, sizeof(c), (double)s->lat.p99));
		fprintf(f, "  lookup hashing         mean %s  p50 %s\n", bench_fmt_ns(a, sizeof(a), s->hash.mean),
			bench_fmt_ns(b, sizeof(b), (double)s->hash.p50));
		fprintf(f, "  lookup index           mean %s  p50 %s\n", bench_fmt_ns(a, sizeof(a), s->index.mean),
			bench_fmt_ns(b, sizeof(b), (double)s->index.p50));
		fprintf(f, "  lookup round trip      mean %s  p50 %s\n", bench_fmt_ns(a, sizeof(a), s->rt.mean),
			bench_fmt_ns(b, sizeof(b), (double)s->rt.p50));
		fprintf(f, "  hash + index p50       %s for %u tokens (goal <= %s at 10,000 tokens)\n",
			bench_fmt_ns(d, sizeof(d), (double)s->hash_index_p50_ns), o->input_len,
			bench_fmt_ns(c, sizeof(c), (double)LOOKUP_GOAL_NS));
		fprintf(f, "  verify                 exact %" PRIu64 "/%" PRIu64 " prompts, mismatched blocks %" PRIu64
			", failed %" PRIu64 ", stray writes %" PRIu64 ", errors %" PRIu64 "\n",
			s->ld_exact_prompts, s->ld_requests, s->ld_mismatch_blocks, s->ld_failed_blocks,
			s->ld_stray_blocks, s->ld_errors);
	}
}

static void print_remote(FILE *f, const struct bench_summary *s)
{
	const struct bench_remote *rm = &s->rm;
	char a[32], b[32];
	fprintf(f, "\nremote: shared tier, %u seed%s, max_inflight %u, one value per lane: %" PRIu64 " bytes\n",
		rm->seeds, rm->seeds == 1 ? "" : "s", rm->inflight, rm->value_bytes);
	fprintf(f, "  write (A, SET)         %9.2f GB/s  %" PRIu64 " of %" PRIu64 " lanes acknowledged, %.1f MiB in %s\n",
		rm->wr_gbps, rm->wr_acked, rm->wr_expected, mib(rm->wr_bytes), bench_fmt_ns(a, sizeof(a), (double)rm->wr_ns));
	fprintf(f, "                         first store -> last ack, %s of it after the last store\n",
		bench_fmt_ns(b, sizeof(b), (double)rm->wr_tail_ns));
	fprintf(f, "                         errors %" PRIu64 ", stale %" PRIu64 ", skipped %" PRIu64 "%s\n", rm->wr_errors,
		rm->wr_stale, rm->wr_skipped, rm->wr_settled ? "" : ", NOT SETTLED (timed out)");
	fprintf(f, "  read (B, GET)          %9.2f GB/s  %" PRIu64 " hits of %" PRIu64 " lanes, %.1f MiB in %s of lookups\n",
		rm->rd_gbps, rm->rd_hits, rm->rd_expected, mib(rm->rd_bytes), bench_fmt_ns(a, sizeof(a), (double)rm->rd_ns));
	fprintf(f, "                         misses %" PRIu64 ", bad values %" PRIu64 ", errors %" PRIu64 "\n",
		rm->rd_misses, rm->rd_bad, rm->rd_errors);
	fprintf(f, "  B warm per prompt      p50 %s  p99 %s  (lookup + load, blocks from the cluster)\n",
		bench_fmt_ns(a, sizeof(a), (double)rm->b_lat.p50), bench_fmt_ns(b, sizeof(b), (double)rm->b_lat.p99));
	fprintf(f, "  A warm per prompt      p50 %s  p99 %s  (lookup + load, L1 hits)\n",
		bench_fmt_ns(a, sizeof(a), (double)rm->a_lat.p50), bench_fmt_ns(b, sizeof(b), (double)rm->a_lat.p99));
	fprintf(f, "  B / A                  p50 %.1fx  p99 %.1fx;  warm GB/s (lookup + load) B %.2f  A %.2f\n",
		rm->p50_ratio, rm->p99_ratio, rm->b_gbps, rm->a_gbps);
	fprintf(f, "  B verify               exact %" PRIu64 "/%" PRIu64 " prompts, missed blocks %" PRIu64
		"; tier errors %" PRIu64 "\n", rm->b_exact, rm->b_prompts, rm->b_missed, rm->errors);
}

void bench_print_table(FILE *f, const struct bench_opts *o, const struct bench_plan *pl,
		       const struct bench_summary *s)
{
	bench_print_phases(f, o, pl, s);
	bench_print_tail(f, s);
}

void bench_print_tail(FILE *f, const struct bench_summary *s)
{
	if (s->rm.ran)
		print_remote(f, s);
	fprintf(f, "\nresult: %s (%" PRIu64 " error%s%s)\n", s->ok ? "PASS" : "FAIL", s->errors, s->errors == 1 ? "" : "s",
		s->exact ? "" : ", not every prompt matched exactly");
}

/* ---- JSON -------------------------------------------------------------------------------- */

static void num(cJSON *o, const char *k, double v)
{
	cJSON_AddNumberToObject(o, k, v);
}

static cJSON *dist(const struct bench_dist *d)
{
	cJSON *o = cJSON_CreateObject();
	if (o) {
		num(o, "n", (double)d->n);
		num(o, "mean", d->mean);
		num(o, "p50", (double)d->p50);
		num(o, "p99", (double)d->p99);
		num(o, "max", (double)d->max);
	}
	return o;
}

static cJSON *remote_json(const struct bench_opts *o, const struct bench_remote *rm)
{
	cJSON *r = cJSON_CreateObject();
	if (!r)
		return NULL;
	cJSON *seeds = cJSON_AddArrayToObject(r, "cluster");
	for (uint32_t i = 0; i < o->n_remote; i++)
		cJSON_AddItemToArray(seeds, cJSON_CreateString(o->remote_seed[i]));
	num(r, "max_inflight", rm->inflight);
	num(r, "value_bytes", (double)rm->value_bytes);
	cJSON *w = cJSON_AddObjectToObject(r, "write");
	num(w, "expected_lanes", (double)rm->wr_expected);
	num(w, "handed_lanes", (double)rm->wr_handed);
	num(w, "skipped_lanes", (double)rm->wr_skipped);
	num(w, "acked_lanes", (double)rm->wr_acked);
	num(w, "errors", (double)rm->wr_errors);
	num(w, "stale", (double)rm->wr_stale);
	num(w, "bytes", (double)rm->wr_bytes);
	num(w, "time_ns", (double)rm->wr_ns);
	num(w, "tail_ns", (double)rm->wr_tail_ns);
	cJSON_AddBoolToObject(w, "settled", rm->wr_settled);
	num(w, "gbps", rm->wr_gbps);
	cJSON *rd = cJSON_AddObjectToObject(r, "read");
	num(rd, "expected_lanes", (double)rm->rd_expected);
	num(rd, "reads", (double)rm->rd_reads);
	num(rd, "hits", (double)rm->rd_hits);
	num(rd, "misses", (double)rm->rd_misses);
	num(rd, "bad_values", (double)rm->rd_bad);
	num(rd, "errors", (double)rm->rd_errors);
	num(rd, "lookup_reads", (double)rm->rd_lk_reads);
	num(rd, "bytes", (double)rm->rd_bytes);
	num(rd, "time_ns", (double)rm->rd_ns);
	num(rd, "gbps", rm->rd_gbps);
	cJSON *b = cJSON_AddObjectToObject(r, "b_warm");
	num(b, "prompts", (double)rm->b_prompts);
	num(b, "exact_prompts", (double)rm->b_exact);
	num(b, "missed_blocks", (double)rm->b_missed);
	num(b, "errors", (double)rm->b_errors);
	num(b, "bytes", (double)rm->b_bytes);
	num(b, "time_ns", (double)rm->b_ns);
	num(b, "gbps", rm->b_gbps);
	cJSON_AddItemToObject(b, "latency_ns", dist(&rm->b_lat));
	cJSON *a = cJSON_AddObjectToObject(r, "a_warm");
	num(a, "gbps", rm->a_gbps);
	cJSON_AddItemToObject(a, "latency_ns", dist(&rm->a_lat));
	num(r, "p50_ratio", rm->p50_ratio);
	num(r, "p99_ratio", rm->p99_ratio);
	num(r, "errors", (double)rm->errors);
	return r;
}

char *bench_json(const struct bench_opts *o, const struct bench_plan *pl, const struct bench_summary *s)
{
	cJSON *root = cJSON_CreateObject();
	if (!root)
		return NULL;
	cJSON_AddStringToObject(root, "tool", "kvring-bench");
	cJSON_AddStringToObject(root, "version", KVR_VERSION);

	cJSON *cfg = cJSON_AddObjectToObject(root, "config");
	cJSON_AddStringToObject(cfg, "model", o->model);
	cJSON_AddStringToObject(cfg, "model_id", pl->preset->hf_id);
	num(cfg, "tp", o->tp);
	num(cfg, "block_tokens", o->block_tokens);
	num(cfg, "prompts", o->prompts);
	num(cfg, "input_len", o->input_len);
	num(cfg, "prefix_len", o->prefix_len);
	num(cfg, "concurrency", o->concurrency);
	num(cfg, "warm_concurrency", o->warm_concurrency ? o->warm_concurrency : o->concurrency);
	num(cfg, "seed", (double)o->seed);
	cJSON *ph = cJSON_AddArrayToObject(cfg, "phases");
	if (s->ran_cold)
		cJSON_AddItemToArray(ph, cJSON_CreateString("cold"));
	if (s->ran_warm)
		cJSON_AddItemToArray(ph, cJSON_CreateString("warm"));
	num(cfg, "dcp", o->dcp);
	num(cfg, "interleave", o->interleave);
	num(cfg, "load_dcp", bench_load_dcp(o));
	num(cfg, "load_interleave", bench_load_interleave(o));
	cJSON_AddBoolToObject(cfg, "spawn", o->spawn);
	cJSON_AddBoolToObject(cfg, "allow_misses", o->allow_misses);
	num(cfg, "remote_nodes", o->n_remote);
	num(cfg, "remote_inflight", o->n_remote ? o->remote_inflight : 0);

	cJSON *plan = cJSON_AddObjectToObject(root, "plan");
	num(plan, "lane_bytes", (double)pl->lane_bytes);
	num(plan, "block_bytes", (double)pl->block_bytes);
	num(plan, "lanes", pl->lanes);
	num(plan, "full_blocks_per_prompt", pl->full_blocks);
	num(plan, "prefix_blocks", pl->prefix_blocks);
	num(plan, "engine_blocks_per_rank", pl->num_blocks);
	num(plan, "kv_bytes_per_rank", (double)pl->st.kv_bytes);
	num(plan, "load_kv_bytes_per_rank", (double)pl->ld.kv_bytes);
	num(plan, "dcp_groups", pl->st.groups);
	num(plan, "storing_groups", pl->storing_groups);
	num(plan, "rank_bytes", (double)pl->st.rank_bytes);
	num(plan, "load_rank_bytes", (double)pl->ld.rank_bytes);
	num(plan, "copy_runs_per_rank", pl->st.runs);
	num(plan, "load_copy_runs_per_rank", pl->ld.runs);
	num(plan, "copy_run_bytes_max", (double)pl->st.run_bytes);
	num(plan, "load_copy_run_bytes_max", (double)pl->ld.run_bytes);
	num(plan, "unique_blocks", (double)pl->unique_blocks);
	num(plan, "unique_bytes", (double)pl->unique_bytes);
	num(plan, "remote_value_bytes", (double)pl->remote_value_bytes);

	if (s->ran_cold) {
		cJSON *c = cJSON_AddObjectToObject(root, "cold");
		num(c, "requests", (double)s->st_requests);
		num(c, "tokens", (double)s->st_tokens);
		num(c, "blocks", (double)s->st_blocks);
		num(c, "stored_blocks", (double)s->st_stored);
		num(c, "present_blocks", (double)s->st_present);
		num(c, "failed_blocks", (double)s->st_failed_blocks);
		num(c, "errors", (double)s->st_errors);
		num(c, "bytes", (double)s->st_bytes);
		num(c, "time_ns", (double)s->st_ns);
		num(c, "fill_ns", (double)s->st_fill_ns);
		num(c, "gbps", s->st_gbps);
		num(c, "memcpy_time_ns", (double)s->st_memcpy_ns);
		num(c, "memcpy_gbps", s->st_memcpy_gbps);
		num(c, "ratio", s->st_ratio);
		num(c, "goal_ratio_min", BENCH_STORE_GOAL_MIN);
		cJSON_AddBoolToObject(c, "goal_met", s->st_bytes && s->st_ratio >= BENCH_STORE_GOAL_MIN);
		num(c, "copy_goal_ratio_min", BENCH_COPY_GOAL_MIN);
		cJSON_AddBoolToObject(c, "copy_goal_met", s->st_bytes && s->st_ratio >= BENCH_COPY_GOAL_MIN);
		cJSON_AddItemToObject(c, "latency_ns", dist(&s->st_lat));
	} else {
		cJSON_AddNullToObject(root, "cold");
	}
	if (s->ran_warm) {
		cJSON *w = cJSON_AddObjectToObject(root, "warm");
		num(w, "requests", (double)s->ld_requests);
		num(w, "tokens", (double)s->ld_tokens);
		num(w, "matched_tokens", (double)s->ld_matched_tokens);
		num(w, "matched_blocks", (double)s->ld_matched_blocks);
		num(w, "hit_rate", s->hit_rate);
		num(w, "missed_blocks", (double)s->ld_misses);
		num(w, "l1_hit_blocks", (double)s->ld_l1_hits);
		num(w, "l1_miss_blocks", (double)s->ld_l1_misses);
		num(w, "l2_read_blocks", (double)s->ld_l2_blocks);
		num(w, "bytes", (double)s->ld_bytes);
		num(w, "time_ns", (double)s->ld_ns);
		num(w, "gbps", s->ld_gbps);
		num(w, "memcpy_time_ns", (double)s->ld_memcpy_ns);
		num(w, "memcpy_gbps", s->ld_memcpy_gbps);
		num(w, "time_ratio", s->ld_time_ratio);
		num(w, "goal_time_ratio_max", BENCH_LOAD_GOAL_MAX);
		cJSON_AddBoolToObject(w, "goal_met", s->ld_bytes && s->ld_time_ratio <= BENCH_LOAD_GOAL_MAX);
		num(w, "load_time_ns", (double)s->ld_load_ns);
		num(w, "load_gbps", s->ld_load_gbps);
		num(w, "load_ratio", s->ld_load_ratio);
		num(w, "lookup_time_ns", (double)s->ld_lookup_ns);
		cJSON *rr = cJSON_AddArrayToObject(w, "rank_load_ratio");
		for (uint32_t r = 0; r < o->tp && r < KVR_MAX_TP; r++)
			cJSON_AddItemToArray(rr, cJSON_CreateNumber(s->ld_rank_ratio[r]));
		num(w, "rank_load_ratio_min", s->ld_rank_ratio_min);
		num(w, "group_load_time_ns", (double)s->ld_group_ns);
		num(w, "group_load_gbps", s->ld_group_gbps);
		num(w, "group_memcpy_time_ns", (double)s->ld_group_memcpy_ns);
		num(w, "group_memcpy_gbps", s->ld_group_memcpy_gbps);
		num(w, "group_load_ratio", s->ld_group_ratio);
		num(w, "copy_goal_ratio_min", BENCH_COPY_GOAL_MIN);
		cJSON_AddBoolToObject(w, "copy_goal_met", s->ld_bytes && s->ld_rank_ratio_min >= BENCH_COPY_GOAL_MIN);
		cJSON_AddItemToObject(w, "latency_ns", dist(&s->lat));
		cJSON *lk = cJSON_AddObjectToObject(w, "lookup");
		cJSON_AddItemToObject(lk, "hash_ns", dist(&s->hash));
		cJSON_AddItemToObject(lk, "index_ns", dist(&s->index));
		cJSON_AddItemToObject(lk, "roundtrip_ns", dist(&s->rt));
		num(lk, "hash_index_p50_ns", (double)s->hash_index_p50_ns);
		cJSON *v = cJSON_AddObjectToObject(w, "verify");
		num(v, "prompts", (double)s->ld_requests);
		num(v, "exact_prompts", (double)s->ld_exact_prompts);
		num(v, "mismatch_blocks", (double)s->ld_mismatch_blocks);
		num(v, "failed_blocks", (double)s->ld_failed_blocks);
		num(v, "stray_blocks", (double)s->ld_stray_blocks);
		num(v, "errors", (double)s->ld_errors);
	} else {
		cJSON_AddNullToObject(root, "warm");
	}
	if (s->rm.ran)
		cJSON_AddItemToObject(root, "remote", remote_json(o, &s->rm));
	else
		cJSON_AddNullToObject(root, "remote");
	num(root, "errors", (double)s->errors);
	cJSON_AddBoolToObject(root, "exact_match", s->exact);
	cJSON_AddBoolToObject(root, "ok", s->ok);
	char *text = cJSON_Print(root);
	cJSON_Delete(root);
	return text;
}
