/* /metrics rendering on a synthetic instance: every family, exact values, cumulative histograms, escaping. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_test.h"
#include "sup.h"

static struct m_fake fake;

static void setup(void)
{
	m_fake_init(&fake);
}

static void teardown(void)
{
	m_fake_fini(&fake);
}

TestSuite(metrics_render, .init = setup, .fini = teardown, .timeout = 20);

static char *render(struct sup_metrics_view *v)
{
	size_t len = 0;
	char *text = sup_metrics_render(v, &len);
	cr_assert(text);
	cr_assert_eq(strlen(text), len);
	return text;
}

/* The line must be in the text, whole. */
static void has_line(const char *text, const char *line)
{
	size_t n = strlen(line);
	for (const char *p = text; (p = strstr(p, line)); p++)
		if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0))
			return;
	cr_assert_fail("line \"%s\" not in:\n%s", line, text);
}

Test(metrics_render, instance_and_actors)
{
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots};
	char *t = render(&v);
	has_line(t, "# TYPE kvring_instance_state gauge");
	has_line(t, "kvring_instance_state{state=\"starting\"} 0");
	has_line(t, "kvring_instance_state{state=\"running\"} 1");
	has_line(t, "kvring_instance_state{state=\"degraded\"} 0");
	has_line(t, "kvring_instance_state{state=\"draining\"} 0");
	has_line(t, "kvring_instance_state{state=\"stopped\"} 0");
	has_line(t, "kvring_workers_attached 1");
	has_line(t, "kvring_actor_up{actor=\"lookup\"} 1");
	has_line(t, "kvring_actor_up{actor=\"loader.0\"} 1");
	has_line(t, "kvring_actor_up{actor=\"storer.0\"} 0");
	has_line(t, "kvring_actor_up{actor=\"a\\\"b\\\\c\"} 0");
	has_line(t, "kvring_actor_restarts_total{actor=\"storer.0\"} 2");
	has_line(t, "kvring_actor_restarts_total{actor=\"lookup\"} 0");
	has_line(t, "kvring_actor_last_exit_signal{actor=\"storer.0\"} 9");
	has_line(t, "kvring_actor_last_exit_code{actor=\"lookup\"} -1");
	has_line(t, "kvring_malformed_messages_total{actor=\"lookup\"} 1");
	has_line(t, "kvring_malformed_messages_total{actor=\"loader.0\"} 0");
	/* the unused fifth slot is not exported: 4 actors, 4 series per actor family */
	size_t up = 0;
	for (const char *p = t; (p = strstr(p, "\nkvring_actor_up{")); p++)
		up++;
	cr_assert_eq(up, 4);
	free(t);
}

Test(metrics_render, lookup_transfer_l1_rings)
{
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots};
	char *t = render(&v);
	has_line(t, "# TYPE kvring_lookup_requests_total counter");
	has_line(t, "kvring_lookup_requests_total 3");
	has_line(t, "kvring_lookup_requested_blocks_total 10");
	has_line(t, "kvring_lookup_matched_blocks_total 6");
	has_line(t, "kvring_requested_tokens_total 160");
	has_line(t, "kvring_matched_tokens_total 96");
	has_line(t, "kvring_l1_hits_total 5");
	has_line(t, "kvring_l1_misses_total 4");
	has_line(t, "kvring_evictions_total{reason=\"capacity\"} 2");
	has_line(t, "kvring_l2_blocks_total{op=\"read\",result=\"ok\"} 0");
	has_line(t, "kvring_l2_blocks_total{op=\"write\",result=\"skipped\"} 0");
	/* storer.0 and the idle storer `a"b\c` (zero counters) are summed */
	has_line(t, "kvring_store_blocks_total{result=\"stored\"} 7");
	has_line(t, "kvring_store_blocks_total{result=\"present\"} 2");
	has_line(t, "kvring_store_blocks_total{result=\"failed\"} 1");
	has_line(t, "kvring_load_blocks_total{result=\"loaded\"} 5");
	has_line(t, "kvring_load_blocks_total{result=\"failed\"} 1");
	has_line(t, "kvring_bytes_total{direction=\"store\",tier=\"l1\"} 7000");
	has_line(t, "kvring_bytes_total{direction=\"load\",tier=\"l1\"} 5000");
	has_line(t, "kvring_l1_slots{state=\"free\"} 4");
	has_line(t, "kvring_l1_slots{state=\"writing\"} 1");
	has_line(t, "kvring_l1_slots{state=\"committed\"} 2");
	has_line(t, "kvring_l1_slots{state=\"evicting\"} 0");
	has_line(t, "kvring_l1_slots{state=\"draining\"} 0");
	has_line(t, "kvring_l1_slots{state=\"reading\"} 1");
	has_line(t, "kvring_ring_fill_ratio{ring=\"lookup.req.0\"} 0.25");
	has_line(t, "kvring_ring_fill_ratio{ring=\"ctl.lookup.in\"} 0");
	has_line(t, "kvring_ring_producer_blocked_seconds_total{ring=\"lookup.req.0\"} 1.5");
	has_line(t, "kvring_ring_producer_blocked_seconds_total{ring=\"ctl.lookup.in\"} 0");
	has_line(t, "kvring_ring_rejected_messages_total{ring=\"lookup.req.0\"} 3");
	has_line(t, "kvring_ring_rejected_messages_total{ring=\"ctl.lookup.in\"} 0");
	free(t);

	/* without a slot table the L1 family is left out, the rest stays */
	v.slots = NULL;
	t = render(&v);
	cr_assert_null(strstr(t, "kvring_l1_slots"));
	has_line(t, "kvring_l1_hits_total 5");
	free(t);
}

Test(metrics_render, histograms_cumulative)
{
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots};
	char *t = render(&v);
	/* observations 16000 ns (<= 16 us), 16001 ns (<= 32 us) and 1 s (over 524.288 ms) */
	has_line(t, "# TYPE kvring_load_duration_seconds histogram");
	has_line(t, "kvring_load_duration_seconds_bucket{le=\"0.000016\"} 1");
	has_line(t, "kvring_load_duration_seconds_bucket{le=\"0.000032\"} 2");
	has_line(t, "kvring_load_duration_seconds_bucket{le=\"0.001024\"} 2");
	has_line(t, "kvring_load_duration_seconds_bucket{le=\"0.524288\"} 2");
	has_line(t, "kvring_load_duration_seconds_bucket{le=\"+Inf\"} 3");
	has_line(t, "kvring_load_duration_seconds_sum 1.000032001");
	has_line(t, "kvring_load_duration_seconds_count 3");
	has_line(t, "kvring_store_duration_seconds_bucket{le=\"+Inf\"} 0");
	has_line(t, "kvring_store_duration_seconds_sum 0");
	has_line(t, "kvring_store_duration_seconds_count 0");
	/* 16 finite buckets plus +Inf, in increasing order */
	unsigned n = 0;
	double last = 0;
	for (const char *p = t; (p = strstr(p, "\nkvring_load_duration_seconds_bucket{le=\"")); p++, n++) {
		double le = strtod(p + strlen("\nkvring_load_duration_seconds_bucket{le=\""), NULL);
		if (n < 16)
			cr_assert_gt(le, last, "bucket %u", n);
		last = le;
	}
	cr_assert_eq(n, 17);
	free(t);
}

Test(metrics_render, histogram_buckets_of_observe)
{
	struct kvr_hist h;
	memset(&h, 0, sizeof(h));
	const uint64_t ns[] = {0, 16000, 16001, 32000, 524288000, 524288001, UINT64_MAX / 2};
	const unsigned want[] = {0, 0, 1, 1, 15, 16, 16};
	for (unsigned i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
		uint64_t before = atomic_load(&h.bucket[want[i]]);
		kvr_hist_observe(&h, ns[i]);
		cr_assert_eq(atomic_load(&h.bucket[want[i]]), before + 1, "%llu ns: bucket %u", (unsigned long long)ns[i],
			     want[i]);
	}
	cr_assert_eq(atomic_load(&h.count), 7);
	cr_assert_eq(kvr_hist_bound_us(0), 16);
	cr_assert_eq(kvr_hist_bound_us(KVR_HIST_FINITE - 1), 524288);
}

Test(metrics_render, l2_counts_from_the_lookup_actor)
{
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots};
	struct kvr_actor_stats *lk = kvr_ctl_stats(fake.ctl, 0);
	atomic_store(&lk->c[KVR_STAT_LK_L2_READS], 7);
	atomic_store(&lk->c[KVR_STAT_LK_L2_WRITE_FAILS], 2);
	char *t = render(&v);
	has_line(t, "# TYPE kvring_l2_blocks_total counter");
	has_line(t, "kvring_l2_blocks_total{op=\"read\",result=\"ok\"} 7");
	has_line(t, "kvring_l2_blocks_total{op=\"write\",result=\"failed\"} 2");
	free(t);
	atomic_store(&lk->c[KVR_STAT_LK_L2_READS], 0);
	atomic_store(&lk->c[KVR_STAT_LK_L2_WRITE_FAILS], 0);
}

Test(metrics_render, misses_are_the_lookup_actors_count)
{
	/* misses come from the lookup actor's own counter, not from keys - matched: a scrape
	 * between its adds never shows a lookup's blocks as misses */
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots};
	struct kvr_actor_stats *lk = kvr_ctl_stats(fake.ctl, 0);
	atomic_store(&lk->c[KVR_STAT_LK_KEYS], 14);
	char *t = render(&v);
	has_line(t, "kvring_lookup_requested_blocks_total 14");
	has_line(t, "kvring_l1_misses_total 4");
	free(t);
	atomic_store(&lk->c[KVR_STAT_LK_MISSED], 9);
	t = render(&v);
	has_line(t, "kvring_l1_misses_total 9");
	free(t);
	atomic_store(&lk->c[KVR_STAT_LK_KEYS], 10);
	atomic_store(&lk->c[KVR_STAT_LK_MISSED], 4);
}

/* The remote tier: every kvring_remote_* series of the fake remote actor (distinct values per
 * counter), its two histograms, and the lookup actor's remote counts. */
Test(metrics_render, remote_every_series_exact)
{
	m_fake_add_remote(&fake);
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots};
	char *t = render(&v);
	static const char *const lines[] = {
		"# TYPE kvring_remote_blocks_total counter",
		"kvring_remote_blocks_total{op=\"read\",result=\"ok\"} 121",
		"kvring_remote_blocks_total{op=\"read\",result=\"failed\"} 122",
		"kvring_remote_blocks_total{op=\"write\",result=\"sent\"} 123",
		"kvring_remote_blocks_total{op=\"write\",result=\"skipped\"} 124",
		"# TYPE kvring_remote_reads_total counter",
		"kvring_remote_reads_total 101",
		"kvring_remote_hits_total 102",
		"kvring_remote_misses_total 103",
		"kvring_remote_bad_values_total 104",
		"kvring_remote_read_errors_total 105",
		"kvring_remote_writes_total 106",
		"kvring_remote_write_errors_total 107",
		"kvring_remote_stale_writes_total 108",
		"# TYPE kvring_remote_bytes_total counter",
		"kvring_remote_bytes_total{direction=\"in\"} 109",
		"kvring_remote_bytes_total{direction=\"out\"} 110",
		"kvring_remote_moved_redirects_total 111",
		"kvring_remote_ask_redirects_total 112",
		"kvring_remote_timeouts_total 113",
		"kvring_remote_connection_errors_total 114",
		"kvring_remote_reply_errors_total 115",
		"# TYPE kvring_remote_slot_map_refreshes_total counter",
		"kvring_remote_slot_map_refreshes_total 116",
		"# TYPE kvring_remote_nodes gauge",
		"kvring_remote_nodes 3",
		"# TYPE kvring_remote_nodes_up gauge",
		"kvring_remote_nodes_up 2",
		"# TYPE kvring_remote_inflight gauge",
		"kvring_remote_inflight 117",
		"# TYPE kvring_remote_slots_covered gauge",
		"kvring_remote_slots_covered 10923",
		/* GET: 16000 ns (<= 16 us), 100000 ns (<= 128 us), 2 s (+Inf) */
		"# TYPE kvring_remote_get_seconds histogram",
		"kvring_remote_get_seconds_bucket{le=\"0.000016\"} 1",
		"kvring_remote_get_seconds_bucket{le=\"0.000064\"} 1",
		"kvring_remote_get_seconds_bucket{le=\"0.000128\"} 2",
		"kvring_remote_get_seconds_bucket{le=\"0.524288\"} 2",
		"kvring_remote_get_seconds_bucket{le=\"+Inf\"} 3",
		"kvring_remote_get_seconds_sum 2.000116",
		"kvring_remote_get_seconds_count 3",
		/* SET: 1 ms (<= 1.024 ms) */
		"# TYPE kvring_remote_set_seconds histogram",
		"kvring_remote_set_seconds_bucket{le=\"0.000512\"} 0",
		"kvring_remote_set_seconds_bucket{le=\"0.001024\"} 1",
		"kvring_remote_set_seconds_bucket{le=\"+Inf\"} 1",
		"kvring_remote_set_seconds_sum 0.001",
		"kvring_remote_set_seconds_count 1",
	};
	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
		has_line(t, lines[i]);
	/* one series per family (no labels beyond those above), 17 buckets per histogram */
	unsigned series = 0, buckets = 0;
	for (const char *p = t; (p = strstr(p, "\nkvring_remote_")); p++) {
		series++;
		buckets += !strncmp(p, "\nkvring_remote_get_seconds_bucket{", 34);
	}
	cr_assert_eq(buckets, KVR_HIST_BUCKETS);
	cr_assert_eq(series, 4 + 18 + 2 + 2 * (KVR_HIST_BUCKETS + 2), "kvring_remote_* series:\n%s", t);
	/* the remote actor is an actor like the others */
	has_line(t, "kvring_actor_up{actor=\"remote\"} 1");
	/* the lookup's L2 series are not the remote's */
	has_line(t, "kvring_l2_blocks_total{op=\"read\",result=\"ok\"} 0");
	/* the transfer histograms do not take the remote actor's */
	has_line(t, "kvring_load_duration_seconds_count 3");
	has_line(t, "kvring_store_duration_seconds_count 0");
	free(t);
}

/* No remote actor (no remote.cluster): no kvring_remote_* family at all, even with the
 * lookup's remote counters set; one that is not in use counts as none. */
Test(metrics_render, no_remote_nothing_exported)
{
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots};
	struct kvr_actor_stats *lk = kvr_ctl_stats(fake.ctl, 0);
	atomic_store(&lk->c[KVR_STAT_LK_RM_READS], 5);
	char *t = render(&v);
	cr_assert_null(strstr(t, "kvring_remote_"), "exposition:\n%s", t);
	free(t);
	m_fake_add_remote(&fake);
	atomic_store(&kvr_ctl_actor(fake.ctl, 5)->state, KVR_ACTOR_UNUSED);
	t = render(&v);
	cr_assert_null(strstr(t, "kvring_remote_"), "exposition:\n%s", t);
	free(t);
}

/* docs/metrics.md lists every family the exporter writes, and nothing it does not: the
 * metric tables' first column against the # TYPE lines of an instance with every tier. */
Test(metrics_render, docs_list_every_family)
{
	m_fake_fini(&fake);
	m_fake_init_config(&fake, MF_L2_CONFIG);
	m_fake_add_disk(&fake, 0, "disk.0");
	m_fake_add_remote(&fake);
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots};
	char *t = render(&v);

	const char *root = getenv("KVR_SOURCE_ROOT");
	cr_assert_not_null(root, "KVR_SOURCE_ROOT is not set (meson test sets it)");
	char path[512];
	snprintf(path, sizeof(path), "%s/docs/metrics.md", root);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	char *doc = NULL;
	size_t cap = 0, doc_len = 0;
	FILE *m = open_memstream(&doc, &doc_len);
	char *line = NULL;
	ssize_t n;
	while ((n = getline(&line, &cap, f)) > 0)
		if (!strncmp(line, "| `kvring_", 10)) /* a table row: | `name` | type | ... */
			fprintf(m, "%.*s\n", (int)strcspn(line + 3, "`"), line + 3);
	free(line);
	fclose(f);
	fclose(m);

	unsigned families = 0;
	for (const char *p = t; (p = strstr(p, "# TYPE ")); p++) {
		p += 7;
		char name[128], want[132];
		snprintf(name, sizeof(name), "%.*s", (int)strcspn(p, " "), p);
		snprintf(want, sizeof(want), "%s\n", name);
		families++;
		const char *at = strstr(doc, want);
		cr_assert(at && (at == doc || at[-1] == '\n'), "%s is exported but not in docs/metrics.md", name);
	}
	for (const char *p = doc; *p;) {
		size_t k = strcspn(p, "\n");
		char want[140];
		snprintf(want, sizeof(want), "# TYPE %.*s ", (int)k, p);
		cr_assert_not_null(strstr(t, want), "docs/metrics.md lists %.*s, which is not exported", (int)k, p);
		p += k + 1;
	}
	cr_assert_gt(families, 40);
	free(doc);
	free(t);
}
