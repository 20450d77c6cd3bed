/* The Grafana dashboard and the Prometheus rules against the /metrics of a real kvringd (L2 and a remote tier configured) after a libkvring workload. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "metrics_test.h"

/*
 * Every family kvringd writes appears in this scrape: the L2 families need an l2.dirs entry
 * (one disk actor), the kvring_remote_* ones a remote.cluster (the remote actor runs whether
 * or not the cluster answers: here it points at a loopback port nobody listens on, so its
 * counters stay at 0 but its series are written). Histograms and labelled counters are
 * written with every label value from the first scrape, so the names do not depend on what
 * the workload did; the workload is there so the scrape is one of a working instance.
 */

M_FIXTURE(monitoring_live, 60); /* inst and worker: a fresh instance directory, no worker yet */

/* The metrics test's model and arena (metrics_test.h), metrics on, one L2 dir, a remote tier. */
static void write_config(uint16_t port, const char *l2_dir, uint16_t remote_port)
{
	char sections[2048];
	snprintf(sections, sizeof(sections),
		 ",\n  \"model\": {\"preset\": \"\", \"model_id\": \"kvring-monitoring-test\", \"layers\": %u, \"kv_heads\": %u,\n"
		 "    \"head_dim\": %u, \"dtype_bytes\": 2, \"block_tokens\": %u},\n"
		 "  \"l1\": {\"capacity_bytes\": %llu, \"huge_pages\": false, \"eviction\": \"lru\"},\n"
		 "  \"staging\": {\"ceiling_bytes\": \"1MiB\"},\n"
		 "  \"l2\": {\"dirs\": [\"%s\"], \"capacity_bytes\": %llu, \"mode\": \"write-through\", \"durability\": \"none\"},\n"
		 "  \"remote\": {\"cluster\": [\"127.0.0.1:%u\"], \"timeout_ms\": 200},\n"
		 "  \"metrics\": {\"enabled\": true, \"listen\": \"127.0.0.1:%u\"}",
		 M_LAYERS, M_HEADS, M_HEAD_DIM, M_BLOCK_TOKENS,
		 (unsigned long long)(KVR_SLOTS_ARENA_DATA_OFF + M_SLOTS * M_LANE_BYTES), l2_dir,
		 (unsigned long long)(64 * 20480), remote_port, port);
	h_write_config_with(&inst, NULL, 2, H_SUP_DATA, sections);
}

/* Run tools/check-monitoring.py on the scrape in `scrape` with extra arguments; returns its
 * exit status, its output in out. */
static int run_checker(const char *scrape, const char *extra, char *out, size_t outlen)
{
	const char *src = getenv("KVR_SOURCE_ROOT");
	cr_assert(src, "KVR_SOURCE_ROOT is not set (run through meson test)");
	char cmd[4096];
	snprintf(cmd, sizeof(cmd),
		 "python3 %s/tools/check-monitoring.py --metrics %s --rules %s/monitoring/prometheus/kvring-alerts.yml "
		 "--docs %s/docs/monitoring.md --list %s 2>&1",
		 src, scrape, src, src, extra);
	FILE *p = popen(cmd, "r");
	cr_assert(p, "popen: %s", strerror(errno));
	size_t n = fread(out, 1, outlen - 1, p);
	out[n] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Start kvringd with write_config's tiers and wait until the actors that always run are up. */
static void start_full(uint16_t port)
{
	char l2_dir[160];
	snprintf(l2_dir, sizeof(l2_dir), "%s/l2", inst.dir);
	write_config(port, l2_dir, m_free_port());
	h_start(&inst);
	struct kvr_actor_ent *lk = h_actor(&inst, "lookup"), *dk = h_actor(&inst, "disk.0");
	cr_assert(lk && atomic_load(&lk->state) == KVR_ACTOR_READY, "the lookup actor is not ready");
	cr_assert(dk && H_WAIT(atomic_load(&dk->state) == KVR_ACTOR_READY, 3000), "disk.0 is not ready");
	cr_assert(h_actor(&inst, "remote"), "no remote actor in the actor table");
}

Test(monitoring_live, dashboard_and_rules_use_only_exported_metrics)
{
	char scrape[160], out[65536];
	snprintf(scrape, sizeof(scrape), "%s/metrics.txt", inst.dir);
	uint16_t port = m_free_port();
	start_full(port);

	m_worker_attach(&worker, inst.sock);
	m_workload(&worker);
	char *t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_store_blocks_total{result=\"stored\"}"), 12);
	cr_assert_eq(m_get(t, "kvring_load_blocks_total{result=\"loaded\"}"), 8);
	cr_assert_eq(m_get(t, "kvring_load_duration_seconds_count"), 2);
	cr_assert(strstr(t, "\nkvring_l2_bytes{dir=\""), "no L2 series in the scrape:\n%s", t);
	cr_assert(strstr(t, "\nkvring_remote_nodes "), "no remote-tier series in the scrape:\n%s", t);
	h_write_file(scrape, t);
	free(t);

	const char *src = getenv("KVR_SOURCE_ROOT");
	char extra[1024];
	snprintf(extra, sizeof(extra), "--dashboard %s/monitoring/grafana/kvring.json%s", src,
		 m_have_promtool() ? " --promtool promtool" : "");
	int rc = run_checker(scrape, extra, out, sizeof(out));
	cr_assert_eq(rc, 0, "check-monitoring.py failed (%d):\n%s", rc, out);
	/* what the histograms and the tiers contribute is checked, not skipped */
	cr_assert(strstr(out, "uses kvring_load_duration_seconds_bucket\n"), "%s", out);
	cr_assert(strstr(out, "uses kvring_l2_bytes\n"), "%s", out);
	cr_assert(strstr(out, "uses kvring_remote_get_seconds_bucket\n"), "%s", out);
	cr_assert(strstr(out, "check-monitoring: ok: "), "%s", out);
	cr_log_info("%s", out);
}

Test(monitoring_live, a_dashboard_naming_a_missing_metric_fails)
{
	char scrape[160], dash[160], out[65536];
	uint16_t port = m_free_port();
	start_full(port);
	char *t = m_scrape(port);
	snprintf(scrape, sizeof(scrape), "%s/metrics.txt", inst.dir);
	h_write_file(scrape, t);
	free(t);

	/* the real dashboard with one expr changed to name a metric kvringd does not export */
	const char *src = getenv("KVR_SOURCE_ROOT");
	char path[512];
	snprintf(path, sizeof(path), "%s/monitoring/grafana/kvring.json", src);
	char *json = h_read_file(path);
	cr_assert(json);
	const char *needle = "kvring_l1_slots{";
	char *at = strstr(json, needle);
	cr_assert(at, "the dashboard has no %s", needle);
	size_t head = (size_t)(at - json);
	snprintf(dash, sizeof(dash), "%s/broken.json", inst.dir);
	FILE *f = fopen(dash, "w");
	cr_assert(f);
	fprintf(f, "%.*skvring_l1_slotz{%s", (int)head, json, at + strlen(needle));
	fclose(f);
	free(json);

	char extra[256];
	snprintf(extra, sizeof(extra), "--dashboard %s", dash);
	int rc = run_checker(scrape, extra, out, sizeof(out));
	cr_assert_eq(rc, 1, "check-monitoring.py passed a dashboard naming kvring_l1_slotz (%d):\n%s", rc, out);
	cr_assert(strstr(out, "\nkvring_l1_slotz: not in the exposition; used by "), "%s", out);
	/* and only that one: the rules and the rest of the dashboard are fine on this instance */
	cr_assert(strstr(out, "check-monitoring: 1 problem\n"), "%s", out);
	cr_log_info("%s", out);
}
