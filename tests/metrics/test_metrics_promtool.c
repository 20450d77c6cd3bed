/* /metrics against `promtool check metrics`: a live kvringd after a workload, and the synthetic instance. Exits 77 without promtool. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrics_test.h"
#include "sup.h"

M_FIXTURE(metrics_promtool, 30); /* inst and worker: a fresh instance directory, no worker yet */

static void check(const char *text, const char *what)
{
	char out[8192];
	int rc = m_promtool(text, out, sizeof(out));
	cr_assert_neq(rc, -1, "promtool vanished");
	cr_assert_eq(rc, 0, "promtool check metrics on %s:\n%s\n--- exposition ---\n%s", what, out, text);
}

Test(metrics_promtool, live_after_workload)
{
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	char *t = m_scrape(port);
	check(t, "an idle instance");
	free(t);
	m_worker_attach(&worker, inst.sock);
	m_workload(&worker);
	t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_store_blocks_total{result=\"stored\"}"), 12);
	check(t, "an instance after the workload");
	free(t);
}

Test(metrics_promtool, synthetic)
{
	struct m_fake f;
	m_fake_init(&f);
	struct sup_metrics_view v = {.ctl = f.ctl, .slots = f.slots};
	size_t len;
	char *t = sup_metrics_render(&v, &len);
	cr_assert(t);
	check(t, "the synthetic instance (escaped labels, non-zero histogram)");
	free(t);
	m_fake_add_remote(&f);
	t = sup_metrics_render(&v, &len);
	cr_assert(t);
	cr_assert(strstr(t, "\nkvring_remote_get_seconds_count 3\n"));
	check(t, "the synthetic instance with a remote actor");
	free(t);
	m_fake_fini(&f);
}

/* The kvring_l2_* families: a live instance with an L2 directory after the workload (12
 * files written through), and the synthetic disk actor whose dir needs escaping. */
Test(metrics_promtool, l2_live_and_synthetic)
{
	char l2dir[160];
	snprintf(l2dir, sizeof(l2dir), "%s/l2", inst.dir);
	cr_assert_eq(mkdir(l2dir, 0700), 0);
	uint16_t port = m_free_port();
	m_start_l2(&inst, port, l2dir, 64ull << 20);
	m_worker_attach(&worker, inst.sock);
	m_workload(&worker);
	cr_assert(H_WAIT(h_stat(&inst, "lookup", KVR_STAT_LK_L2_WRITES) == 12, 5000));
	char *t = m_scrape(port);
	char series[256];
	snprintf(series, sizeof(series), "kvring_l2_files{dir=\"%s\"}", l2dir);
	cr_assert_eq(m_get(t, series), 12);
	check(t, "an instance with L2 after the workload");
	free(t);

	struct m_fake f;
	m_fake_init_config(&f, MF_L2_CONFIG);
	m_fake_add_disk(&f, 0, "disk.0");
	struct sup_metrics_view v = {.ctl = f.ctl, .slots = f.slots};
	size_t len;
	t = sup_metrics_render(&v, &len);
	cr_assert(t);
	check(t, "the synthetic instance with a disk actor (escaped dir label)");
	free(t);
	m_fake_fini(&f);
}

int main(int argc, char **argv)
{
	if (!m_have_promtool()) {
		fprintf(stderr, "promtool not installed (Debian: prometheus; tools/install-deps.sh): skipped\n");
		return 77;
	}
	struct criterion_test_set *tests = criterion_initialize();
	int result = 0;
	if (criterion_handle_args(argc, argv, true))
		result = !criterion_run_all_tests(tests);
	criterion_finalize(tests);
	return result;
}
