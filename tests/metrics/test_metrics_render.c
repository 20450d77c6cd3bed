/* /metrics rendering on a synthetic instance: every family, exact values, cumulative histograms, escaping. */
#include <criterion/criterion.h>

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
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots, .block_tokens = MF_BLOCK_TOKENS};
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
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots, .block_tokens = MF_BLOCK_TOKENS};
	char *t = render(&v);
	has_line(t, "# TYPE kvring_lookup_requests_total counter");
	has_line(t, "kvring_lookup_requests_total 3");
	has_line(t, "kvring_lookup_requested_blocks_total 10");
	has_line(t, "kvring_lookup_matched_blocks_total 6");
	has_line(t, "kvring_requested_tokens_total 160");
	has_line(t, "kvring_matched_tokens_total 96");
	has_line(t, "kvring_l1_hits_total 6");
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
	has_line(t, "kvring_l1_hits_total 6");
	free(t);
}

Test(metrics_render, histograms_cumulative)
{
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots, .block_tokens = MF_BLOCK_TOKENS};
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
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots, .block_tokens = MF_BLOCK_TOKENS};
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
	struct sup_metrics_view v = {.ctl = fake.ctl, .slots = fake.slots, .block_tokens = MF_BLOCK_TOKENS};
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
