/* kvring-bench report: combine the ranks' results, print the table, build the JSON document. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "fmt.h"
#include "json_writer.h"
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
		s.populate_wait_ns = max_u64(s.populate_wait_ns, x->populate_wait_ns);
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
		s.ld_failed_written_blocks += x->ld_failed_written_blocks;
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
	/* --allow-misses: a block evicted between its lookup and its load is a miss (rank.c) */
	s.errors = s.st_errors + s.st_failed_blocks + s.ld_errors + (o->allow_misses ? 0 : s.ld_failed_blocks) +
		   s.ld_mismatch_blocks + s.ld_stray_blocks + extra_errors;
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

/* A goal's verdict: "-" when the phase moved no bytes. */
static const char *verdict(uint64_t bytes, bool met)
{
	return bytes ? (met ? "met" : "missed") : "-";
}

/* The end of a row with a goal: " <ratio>    >= <goal> <verdict>" (op ">=" or "<="). */
static void goal_tail(FILE *f, double ratio, const char *op, double goal, uint64_t bytes, bool met)
{
	fprintf(f, " %11.2f    %s %.2f %s\n", ratio, op, goal, verdict(bytes, met));
}

/* "  <label>  [mean M  ]p50 P[  p99 Q  (<what>)]": a distribution of ns on one line. */
static void print_dist(FILE *f, const char *label, const struct bench_dist *d, bool mean, const char *p99_what)
{
	char a[32];
	fprintf(f, "  %-23s", label);
	if (mean)
		fprintf(f, "mean %s  ", kvr_fmt_ns(d->mean, a, sizeof(a)));
	fprintf(f, "p50 %s", kvr_fmt_ns((double)d->p50, a, sizeof(a)));
	if (p99_what)
		fprintf(f, "  p99 %s  (%s)", kvr_fmt_ns((double)d->p99, a, sizeof(a)), p99_what);
	fputc('\n', f);
}

void bench_print_header(FILE *f, const struct bench_opts *o, const struct bench_plan *pl)
{
	fprintf(f, "kvring-bench %s: model %s (%s)\n", KVR_VERSION, o->model, pl->preset->hf_id);
	fprintf(f, "geometry: tp %u, %u-token blocks of %.2f MiB per %s, %.2f MiB over %u lane%s\n", o->tp,
		o->block_tokens, kvr_fmt_mib(pl->lane_bytes), o->dcp > 1 ? "lane" : "rank", kvr_fmt_mib(pl->block_bytes),
		pl->lanes, pl->lanes == 1 ? "" : "s");
	fprintf(f, "workload: %u prompts x %u tokens, shared prefix %u tokens, concurrency %u", o->prompts, o->input_len,
		o->prefix_len, o->concurrency);
	if (o->warm_concurrency && o->warm_concurrency != o->concurrency)
		fprintf(f, " (warm %u)", o->warm_concurrency);
	fprintf(f, ", seed %" PRIu64 "\n", o->seed);
	fprintf(f, "          %" PRIu64 " distinct blocks = %.1f MiB over all ranks; engine KV memory %.1f MiB per "
		"rank\n", pl->unique_blocks, kvr_fmt_mib(pl->unique_bytes), kvr_fmt_mib(pl->kv_bytes));
	if (pl->st.dcp == 1 && pl->ld.dcp == 1 && pl->st.interleave == 1 && pl->ld.interleave == 1)
		return;
	fprintf(f, "dcp: cold D %u I %u, %u group%s of %u ranks, %u storing", pl->st.dcp, pl->st.interleave, pl->st.groups,
		pl->st.groups == 1 ? "" : "s", pl->st.dcp, pl->storing_groups);
	const struct bench_layout *l[2] = {&pl->st, &pl->ld};
	for (int i = 0; i < 2; i++) {
		if (i)
			fprintf(f, "     warm D %u I %u", l[i]->dcp, l[i]->interleave);
		fprintf(f, ": a rank's block %.2f MiB in %u runs <= %.1f KiB\n", kvr_fmt_mib(l[i]->rank_bytes), l[i]->runs,
			(double)l[i]->run_bytes / 1024.0);
	}
}

void bench_print_phases(FILE *f, const struct bench_opts *o, const struct bench_plan *pl,
			const struct bench_summary *s)
{
	char a[32], b[32];
	if (o->cold_actors)
		fprintf(f, "\nactors: timed from attach (--cold-actors): first touches of their mappings included\n");
	else
		fprintf(f, "\nactors: loader and storer populated their mappings %s after attach (not timed)\n",
			kvr_fmt_ns((double)s->populate_wait_ns, a, sizeof(a)));
	if (s->ran_cold) {
		fprintf(f, "\ncold: store                      kvring        memcpy   kvring/memcpy    goal\n");
		fprintf(f, "  bytes newly stored     %10.1f MiB\n", kvr_fmt_mib(s->st_bytes));
		fprintf(f, "  time                   %14s %13s\n", kvr_fmt_ns((double)s->st_ns, a, sizeof(a)),
			kvr_fmt_ns((double)s->st_memcpy_ns, b, sizeof(b)));
		fprintf(f, "  throughput             %9.2f GB/s %8.2f GB/s", s->st_gbps, s->st_memcpy_gbps);
		goal_tail(f, s->st_ratio, ">=", BENCH_STORE_GOAL_MIN, s->st_bytes, s->st_ratio >= BENCH_STORE_GOAL_MIN);
		if (pl->st.dcp > 1) {
			fprintf(f, "  DCP gather, D %-2u     %14s %13s", pl->st.dcp, "", "");
			goal_tail(f, s->st_ratio, ">=", BENCH_COPY_GOAL_MIN, s->st_bytes, s->st_ratio >= BENCH_COPY_GOAL_MIN);
		}
		fprintf(f, "  requests %" PRIu64 ", tokens %" PRIu64 ", blocks %" PRIu64 ": stored %" PRIu64
			", already present %" PRIu64 ", failed %" PRIu64 ", errors %" PRIu64 "\n",
			s->st_requests, s->st_tokens, s->st_blocks, s->st_stored, s->st_present, s->st_failed_blocks,
			s->st_errors);
		print_dist(f, "latency / request", &s->st_lat, true, "store submit -> done");
		fprintf(f, "  pattern fill (not timed) %s\n", kvr_fmt_ns((double)s->st_fill_ns, a, sizeof(a)));
	}
	if (s->ran_warm) {
		fprintf(f, "\nwarm: lookup + load              kvring        memcpy   kvring/memcpy    goal\n");
		fprintf(f, "  bytes loaded           %10.1f MiB\n", kvr_fmt_mib(s->ld_bytes));
		fprintf(f, "  time                   %14s %13s", kvr_fmt_ns((double)s->ld_ns, a, sizeof(a)),
			kvr_fmt_ns((double)s->ld_memcpy_ns, b, sizeof(b)));
		goal_tail(f, s->ld_time_ratio, "<=", BENCH_LOAD_GOAL_MAX, s->ld_bytes, s->ld_time_ratio <= BENCH_LOAD_GOAL_MAX);
		fprintf(f, "  throughput             %9.2f GB/s %8.2f GB/s\n", s->ld_gbps, s->ld_memcpy_gbps);
		fprintf(f, "  loads only (GB/s)      %9.2f GB/s %8.2f GB/s", s->ld_load_gbps, s->ld_memcpy_gbps);
		goal_tail(f, s->ld_load_ratio, ">=", BENCH_COPY_GOAL_MIN, s->ld_bytes, s->ld_load_ratio >= BENCH_COPY_GOAL_MIN);
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
		print_dist(f, "latency / request", &s->lat, true, "lookup + load done");
		print_dist(f, "lookup hashing", &s->hash, true, NULL);
		print_dist(f, "lookup index", &s->index, true, NULL);
		print_dist(f, "lookup round trip", &s->rt, true, NULL);
		fprintf(f, "  hash + index p50       %s for %u tokens (goal <= %s at 10,000 tokens)\n",
			kvr_fmt_ns((double)s->hash_index_p50_ns, a, sizeof(a)), o->input_len,
			kvr_fmt_ns((double)LOOKUP_GOAL_NS, b, sizeof(b)));
		char fw[48] = "";
		if (s->ld_failed_written_blocks) /* undefined, not an error: docs/api.md "Fences" */
			snprintf(fw, sizeof(fw), " (%" PRIu64 " written)", s->ld_failed_written_blocks);
		fprintf(f, "  verify                 exact %" PRIu64 "/%" PRIu64 " prompts, mismatched blocks %" PRIu64
			", failed %" PRIu64 "%s, stray writes %" PRIu64 ", errors %" PRIu64 "\n",
			s->ld_exact_prompts, s->ld_requests, s->ld_mismatch_blocks, s->ld_failed_blocks, fw,
			s->ld_stray_blocks, s->ld_errors);
	}
}

static void print_remote(FILE *f, const struct bench_summary *s)
{
	const struct bench_remote *rm = &s->rm;
	char a[32];
	fprintf(f, "\nremote: shared tier, %u seed%s, max_inflight %u, one value per lane: %" PRIu64 " bytes\n",
		rm->seeds, rm->seeds == 1 ? "" : "s", rm->inflight, rm->value_bytes);
	fprintf(f, "  write (A, SET)         %9.2f GB/s  %" PRIu64 " of %" PRIu64 " lanes acknowledged, %.1f MiB in %s\n",
		rm->wr_gbps, rm->wr_acked, rm->wr_expected, kvr_fmt_mib(rm->wr_bytes),
		kvr_fmt_ns((double)rm->wr_ns, a, sizeof(a)));
	fprintf(f, "                         first lane handed over -> last ack, %s of it after the last store\n",
		kvr_fmt_ns((double)rm->wr_tail_ns, a, sizeof(a)));
	fprintf(f, "                         errors %" PRIu64 ", stale %" PRIu64 ", skipped %" PRIu64 "%s\n", rm->wr_errors,
		rm->wr_stale, rm->wr_skipped, rm->wr_settled ? "" : ", NOT SETTLED (timed out)");
	fprintf(f, "  read (B, GET)          %9.2f GB/s  %" PRIu64 " hits of %" PRIu64 " lanes, %.1f MiB in %s of lookups\n",
		rm->rd_gbps, rm->rd_hits, rm->rd_expected, kvr_fmt_mib(rm->rd_bytes),
		kvr_fmt_ns((double)rm->rd_ns, a, sizeof(a)));
	fprintf(f, "                         misses %" PRIu64 ", bad values %" PRIu64 ", errors %" PRIu64 "\n",
		rm->rd_misses, rm->rd_bad, rm->rd_errors);
	print_dist(f, "B warm per prompt", &rm->b_lat, false, "lookup + load, blocks from the cluster");
	print_dist(f, "A warm per prompt", &rm->a_lat, false, "lookup + load, L1 hits");
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

/* cJSON_Print's layout (the document's format before json_writer), integers exact. */
static void dist_json(struct kvr_jw *w, const char *key, const struct bench_dist *d)
{
	kvr_jw_object(w, key);
	kvr_jw_u64(w, "n", d->n);
	kvr_jw_double(w, "mean", d->mean);
	kvr_jw_u64(w, "p50", d->p50);
	kvr_jw_u64(w, "p99", d->p99);
	kvr_jw_u64(w, "max", d->max);
	kvr_jw_end(w);
}

static void remote_json(struct kvr_jw *w, const struct bench_opts *o, const struct bench_remote *rm)
{
	kvr_jw_object(w, "remote");
	kvr_jw_array(w, "cluster");
	for (uint32_t i = 0; i < o->n_remote; i++)
		kvr_jw_str(w, NULL, o->remote_seed[i]);
	kvr_jw_end(w);
	kvr_jw_u64(w, "max_inflight", rm->inflight);
	kvr_jw_u64(w, "value_bytes", rm->value_bytes);
	kvr_jw_object(w, "write");
	kvr_jw_u64(w, "expected_lanes", rm->wr_expected);
	kvr_jw_u64(w, "handed_lanes", rm->wr_handed);
	kvr_jw_u64(w, "skipped_lanes", rm->wr_skipped);
	kvr_jw_u64(w, "acked_lanes", rm->wr_acked);
	kvr_jw_u64(w, "errors", rm->wr_errors);
	kvr_jw_u64(w, "stale", rm->wr_stale);
	kvr_jw_u64(w, "bytes", rm->wr_bytes);
	kvr_jw_u64(w, "time_ns", rm->wr_ns);
	kvr_jw_u64(w, "tail_ns", rm->wr_tail_ns);
	kvr_jw_bool(w, "settled", rm->wr_settled);
	kvr_jw_double(w, "gbps", rm->wr_gbps);
	kvr_jw_end(w);
	kvr_jw_object(w, "read");
	kvr_jw_u64(w, "expected_lanes", rm->rd_expected);
	kvr_jw_u64(w, "reads", rm->rd_reads);
	kvr_jw_u64(w, "hits", rm->rd_hits);
	kvr_jw_u64(w, "misses", rm->rd_misses);
	kvr_jw_u64(w, "bad_values", rm->rd_bad);
	kvr_jw_u64(w, "errors", rm->rd_errors);
	kvr_jw_u64(w, "lookup_reads", rm->rd_lk_reads);
	kvr_jw_u64(w, "bytes", rm->rd_bytes);
	kvr_jw_u64(w, "time_ns", rm->rd_ns);
	kvr_jw_double(w, "gbps", rm->rd_gbps);
	kvr_jw_end(w);
	kvr_jw_object(w, "b_warm");
	kvr_jw_u64(w, "prompts", rm->b_prompts);
	kvr_jw_u64(w, "exact_prompts", rm->b_exact);
	kvr_jw_u64(w, "missed_blocks", rm->b_missed);
	kvr_jw_u64(w, "errors", rm->b_errors);
	kvr_jw_u64(w, "bytes", rm->b_bytes);
	kvr_jw_u64(w, "time_ns", rm->b_ns);
	kvr_jw_double(w, "gbps", rm->b_gbps);
	dist_json(w, "latency_ns", &rm->b_lat);
	kvr_jw_end(w);
	kvr_jw_object(w, "a_warm");
	kvr_jw_double(w, "gbps", rm->a_gbps);
	dist_json(w, "latency_ns", &rm->a_lat);
	kvr_jw_end(w);
	kvr_jw_double(w, "p50_ratio", rm->p50_ratio);
	kvr_jw_double(w, "p99_ratio", rm->p99_ratio);
	kvr_jw_u64(w, "errors", rm->errors);
	kvr_jw_end(w);
}

static void config_json(struct kvr_jw *w, const struct bench_opts *o, const struct bench_plan *pl,
			const struct bench_summary *s)
{
	kvr_jw_object(w, "config");
	kvr_jw_str(w, "model", o->model);
	kvr_jw_str(w, "model_id", pl->preset->hf_id);
	kvr_jw_u64(w, "tp", o->tp);
	kvr_jw_u64(w, "block_tokens", o->block_tokens);
	kvr_jw_u64(w, "prompts", o->prompts);
	kvr_jw_u64(w, "input_len", o->input_len);
	kvr_jw_u64(w, "prefix_len", o->prefix_len);
	kvr_jw_u64(w, "concurrency", o->concurrency);
	kvr_jw_u64(w, "warm_concurrency", o->warm_concurrency ? o->warm_concurrency : o->concurrency);
	kvr_jw_u64(w, "seed", o->seed);
	kvr_jw_array(w, "phases");
	if (s->ran_cold)
		kvr_jw_str(w, NULL, "cold");
	if (s->ran_warm)
		kvr_jw_str(w, NULL, "warm");
	kvr_jw_end(w);
	kvr_jw_u64(w, "dcp", o->dcp);
	kvr_jw_u64(w, "interleave", o->interleave);
	kvr_jw_u64(w, "load_dcp", bench_load_dcp(o));
	kvr_jw_u64(w, "load_interleave", bench_load_interleave(o));
	kvr_jw_bool(w, "spawn", o->spawn);
	kvr_jw_bool(w, "allow_misses", o->allow_misses);
	kvr_jw_u64(w, "remote_nodes", o->n_remote);
	kvr_jw_u64(w, "remote_inflight", o->n_remote ? o->remote_inflight : 0);
	kvr_jw_end(w);

	kvr_jw_object(w, "plan");
	kvr_jw_u64(w, "lane_bytes", pl->lane_bytes);
	kvr_jw_u64(w, "block_bytes", pl->block_bytes);
	kvr_jw_u64(w, "lanes", pl->lanes);
	kvr_jw_u64(w, "full_blocks_per_prompt", pl->full_blocks);
	kvr_jw_u64(w, "prefix_blocks", pl->prefix_blocks);
	kvr_jw_u64(w, "engine_blocks_per_rank", pl->num_blocks);
	kvr_jw_u64(w, "kv_bytes_per_rank", pl->st.kv_bytes);
	kvr_jw_u64(w, "load_kv_bytes_per_rank", pl->ld.kv_bytes);
	kvr_jw_u64(w, "dcp_groups", pl->st.groups);
	kvr_jw_u64(w, "storing_groups", pl->storing_groups);
	kvr_jw_u64(w, "rank_bytes", pl->st.rank_bytes);
	kvr_jw_u64(w, "load_rank_bytes", pl->ld.rank_bytes);
	kvr_jw_u64(w, "copy_runs_per_rank", pl->st.runs);
	kvr_jw_u64(w, "load_copy_runs_per_rank", pl->ld.runs);
	kvr_jw_u64(w, "copy_run_bytes_max", pl->st.run_bytes);
	kvr_jw_u64(w, "load_copy_run_bytes_max", pl->ld.run_bytes);
	kvr_jw_u64(w, "unique_blocks", pl->unique_blocks);
	kvr_jw_u64(w, "unique_bytes", pl->unique_bytes);
	kvr_jw_u64(w, "remote_value_bytes", pl->remote_value_bytes);
	kvr_jw_end(w);
}

static void cold_json(struct kvr_jw *w, const struct bench_summary *s)
{
	kvr_jw_object(w, "cold");
	kvr_jw_u64(w, "requests", s->st_requests);
	kvr_jw_u64(w, "tokens", s->st_tokens);
	kvr_jw_u64(w, "blocks", s->st_blocks);
	kvr_jw_u64(w, "stored_blocks", s->st_stored);
	kvr_jw_u64(w, "present_blocks", s->st_present);
	kvr_jw_u64(w, "failed_blocks", s->st_failed_blocks);
	kvr_jw_u64(w, "errors", s->st_errors);
	kvr_jw_u64(w, "bytes", s->st_bytes);
	kvr_jw_u64(w, "time_ns", s->st_ns);
	kvr_jw_u64(w, "fill_ns", s->st_fill_ns);
	kvr_jw_double(w, "gbps", s->st_gbps);
	kvr_jw_u64(w, "memcpy_time_ns", s->st_memcpy_ns);
	kvr_jw_double(w, "memcpy_gbps", s->st_memcpy_gbps);
	kvr_jw_double(w, "ratio", s->st_ratio);
	kvr_jw_double(w, "goal_ratio_min", BENCH_STORE_GOAL_MIN);
	kvr_jw_bool(w, "goal_met", s->st_bytes && s->st_ratio >= BENCH_STORE_GOAL_MIN);
	kvr_jw_double(w, "copy_goal_ratio_min", BENCH_COPY_GOAL_MIN);
	kvr_jw_bool(w, "copy_goal_met", s->st_bytes && s->st_ratio >= BENCH_COPY_GOAL_MIN);
	dist_json(w, "latency_ns", &s->st_lat);
	kvr_jw_end(w);
}

static void warm_json(struct kvr_jw *w, const struct bench_opts *o, const struct bench_summary *s)
{
	kvr_jw_object(w, "warm");
	kvr_jw_u64(w, "requests", s->ld_requests);
	kvr_jw_u64(w, "tokens", s->ld_tokens);
	kvr_jw_u64(w, "matched_tokens", s->ld_matched_tokens);
	kvr_jw_u64(w, "matched_blocks", s->ld_matched_blocks);
	kvr_jw_double(w, "hit_rate", s->hit_rate);
	kvr_jw_u64(w, "missed_blocks", s->ld_misses);
	kvr_jw_u64(w, "l1_hit_blocks", s->ld_l1_hits);
	kvr_jw_u64(w, "l1_miss_blocks", s->ld_l1_misses);
	kvr_jw_u64(w, "l2_read_blocks", s->ld_l2_blocks);
	kvr_jw_u64(w, "bytes", s->ld_bytes);
	kvr_jw_u64(w, "time_ns", s->ld_ns);
	kvr_jw_double(w, "gbps", s->ld_gbps);
	kvr_jw_u64(w, "memcpy_time_ns", s->ld_memcpy_ns);
	kvr_jw_double(w, "memcpy_gbps", s->ld_memcpy_gbps);
	kvr_jw_double(w, "time_ratio", s->ld_time_ratio);
	kvr_jw_double(w, "goal_time_ratio_max", BENCH_LOAD_GOAL_MAX);
	kvr_jw_bool(w, "goal_met", s->ld_bytes && s->ld_time_ratio <= BENCH_LOAD_GOAL_MAX);
	kvr_jw_u64(w, "load_time_ns", s->ld_load_ns);
	kvr_jw_double(w, "load_gbps", s->ld_load_gbps);
	kvr_jw_double(w, "load_ratio", s->ld_load_ratio);
	kvr_jw_u64(w, "lookup_time_ns", s->ld_lookup_ns);
	kvr_jw_array(w, "rank_load_ratio");
	for (uint32_t r = 0; r < o->tp && r < KVR_MAX_TP; r++)
		kvr_jw_double(w, NULL, s->ld_rank_ratio[r]);
	kvr_jw_end(w);
	kvr_jw_double(w, "rank_load_ratio_min", s->ld_rank_ratio_min);
	kvr_jw_u64(w, "group_load_time_ns", s->ld_group_ns);
	kvr_jw_double(w, "group_load_gbps", s->ld_group_gbps);
	kvr_jw_u64(w, "group_memcpy_time_ns", s->ld_group_memcpy_ns);
	kvr_jw_double(w, "group_memcpy_gbps", s->ld_group_memcpy_gbps);
	kvr_jw_double(w, "group_load_ratio", s->ld_group_ratio);
	kvr_jw_double(w, "copy_goal_ratio_min", BENCH_COPY_GOAL_MIN);
	kvr_jw_bool(w, "copy_goal_met", s->ld_bytes && s->ld_rank_ratio_min >= BENCH_COPY_GOAL_MIN);
	dist_json(w, "latency_ns", &s->lat);
	kvr_jw_object(w, "lookup");
	dist_json(w, "hash_ns", &s->hash);
	dist_json(w, "index_ns", &s->index);
	dist_json(w, "roundtrip_ns", &s->rt);
	kvr_jw_u64(w, "hash_index_p50_ns", s->hash_index_p50_ns);
	kvr_jw_end(w);
	kvr_jw_object(w, "verify");
	kvr_jw_u64(w, "prompts", s->ld_requests);
	kvr_jw_u64(w, "exact_prompts", s->ld_exact_prompts);
	kvr_jw_u64(w, "mismatch_blocks", s->ld_mismatch_blocks);
	kvr_jw_u64(w, "failed_blocks", s->ld_failed_blocks);
	kvr_jw_u64(w, "stray_blocks", s->ld_stray_blocks);
	kvr_jw_u64(w, "failed_written_blocks", s->ld_failed_written_blocks);
	kvr_jw_u64(w, "errors", s->ld_errors);
	kvr_jw_end(w);
	kvr_jw_end(w);
}

char *bench_json(const struct bench_opts *o, const struct bench_plan *pl, const struct bench_summary *s)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	struct kvr_jw w;
	kvr_jw_init(&w, f, KVR_JW_TABS);
	kvr_jw_object(&w, NULL);
	kvr_jw_str(&w, "tool", "kvring-bench");
	kvr_jw_str(&w, "version", KVR_VERSION);
	config_json(&w, o, pl, s);
	if (s->ran_cold)
		cold_json(&w, s);
	else
		kvr_jw_null(&w, "cold");
	if (s->ran_warm)
		warm_json(&w, o, s);
	else
		kvr_jw_null(&w, "warm");
	if (s->rm.ran)
		remote_json(&w, o, &s->rm);
	else
		kvr_jw_null(&w, "remote");
	kvr_jw_bool(&w, "cold_actors", o->cold_actors);
	kvr_jw_u64(&w, "populate_wait_ns", s->populate_wait_ns);
	kvr_jw_u64(&w, "errors", s->errors);
	kvr_jw_bool(&w, "exact_match", s->exact);
	kvr_jw_bool(&w, "ok", s->ok);
	kvr_jw_end(&w);
	int rc = kvr_jw_finish(&w);
	if (fclose(f) || rc) {
		free(text);
		return NULL;
	}
	return text;
}
