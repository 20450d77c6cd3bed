/* kvringd /metrics end to end: exact counters after a known workload, HTTP answers, disabled, port in use, restarts. */
#include <criterion/criterion.h>

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "metrics_test.h"

M_FIXTURE(metrics, 30); /* inst and worker: a fresh instance directory, no worker yet */

static unsigned threads_of(pid_t pid)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
	char *st = h_read_file(p);
	const char *t = strstr(st, "\nThreads:");
	unsigned n = t ? (unsigned)strtoul(t + 9, NULL, 10) : 0;
	free(st);
	return n;
}

/* kvringd's threads once the arena's prefault thread is gone: it logs "faulted in, in" and
 * then exits, so a count read right after the line can still include it (seen beside two
 * busy loops). Waits up to 5 s for `want`, then returns the count as it is. */
static unsigned threads_after_prefault(pid_t pid, unsigned want)
{
	cr_assert(H_WAIT(h_log_contains(&inst, "faulted in, in"), 20000), "the arena prefault did not finish");
	(void)H_WAIT(threads_of(pid) == want, 5000);
	return threads_of(pid);
}

Test(metrics, exact_counters_after_workload)
{
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	/* the arena's background prefault is kvringd's third thread, while it runs */
	cr_assert_eq(threads_after_prefault(inst.pid, 2), 2, "kvringd runs its loop and the metrics thread");

	char *t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_instance_state{state=\"running\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_lookup_requests_total"), 0);
	cr_assert_eq(m_get(t, "kvring_l1_slots{state=\"free\"}"), M_SLOTS);
	cr_assert_eq(m_get(t, "kvring_workers_attached"), 0);
	cr_assert_eq(m_get(t, "kvring_actor_up{actor=\"loader.0\"}"), 0);
	free(t);

	m_worker_attach(&worker, inst.sock);
	m_workload(&worker);

	t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_instance_state{state=\"running\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_instance_state{state=\"draining\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_workers_attached"), 1);
	cr_assert_eq(m_get(t, "kvring_actor_up{actor=\"lookup\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_actor_up{actor=\"loader.0\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_actor_up{actor=\"storer.0\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_actor_up{actor=\"loader.1\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_actor_restarts_total{actor=\"lookup\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_malformed_messages_total{actor=\"storer.0\"}"), 0);

	/* lookups: prompts 0 and 1 (4 blocks each, all stored) and one unknown prompt */
	cr_assert_eq(m_get(t, "kvring_lookup_requests_total"), 3);
	cr_assert_eq(m_get(t, "kvring_lookup_requested_blocks_total"), 12);
	cr_assert_eq(m_get(t, "kvring_lookup_matched_blocks_total"), 8);
	cr_assert_eq(m_get(t, "kvring_requested_tokens_total"), 12 * M_BLOCK_TOKENS);
	cr_assert_eq(m_get(t, "kvring_matched_tokens_total"), 8 * M_BLOCK_TOKENS);
	cr_assert_eq(m_get(t, "kvring_l1_hits_total"), 8);
	cr_assert_eq(m_get(t, "kvring_l1_misses_total"), 4);
	cr_assert_eq(m_get(t, "kvring_evictions_total{reason=\"capacity\"}"), 0);

	/* stores: 3 prompts x 4 blocks stored, then prompt 0 again: 4 present */
	cr_assert_eq(m_get(t, "kvring_store_blocks_total{result=\"stored\"}"), 12);
	cr_assert_eq(m_get(t, "kvring_store_blocks_total{result=\"present\"}"), 4);
	cr_assert_eq(m_get(t, "kvring_store_blocks_total{result=\"failed\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_load_blocks_total{result=\"loaded\"}"), 8);
	cr_assert_eq(m_get(t, "kvring_load_blocks_total{result=\"failed\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_bytes_total{direction=\"store\",tier=\"l1\"}"), 12 * M_LANE_BYTES);
	cr_assert_eq(m_get(t, "kvring_bytes_total{direction=\"load\",tier=\"l1\"}"), 8 * M_LANE_BYTES);

	/* latency: one observation per request answered */
	cr_assert_eq(m_get(t, "kvring_store_duration_seconds_count"), 4);
	cr_assert_eq(m_get(t, "kvring_store_duration_seconds_bucket{le=\"+Inf\"}"), 4);
	cr_assert_eq(m_get(t, "kvring_load_duration_seconds_count"), 2);
	cr_assert_eq(m_get(t, "kvring_load_duration_seconds_bucket{le=\"+Inf\"}"), 2);
	double sum = m_get(t, "kvring_load_duration_seconds_sum");
	cr_assert(sum > 0 && sum < 10, "load latency sum %g s", sum);

	/* L1: 12 committed slots, nothing pinned or half written */
	cr_assert_eq(m_get(t, "kvring_l1_slots{state=\"committed\"}"), 12);
	cr_assert_eq(m_get(t, "kvring_l1_slots{state=\"free\"}"), M_SLOTS - 12);
	cr_assert_eq(m_get(t, "kvring_l1_slots{state=\"writing\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_l1_slots{state=\"reading\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_l1_slots{state=\"evicting\"}"), 0);

	/* rings: every reply was read, nothing rejected */
	cr_assert_eq(m_get(t, "kvring_ring_fill_ratio{ring=\"load.rep.0\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_ring_rejected_messages_total{ring=\"store.req.0\"}"), 0);
	double blocked;
	cr_assert(m_value(t, "kvring_ring_producer_blocked_seconds_total{ring=\"lookup.req.0\"}", &blocked));
	free(t);

	/* the exporter reads what the actors wrote: the same numbers as the stats page */
	cr_assert_eq(h_stat(&inst, "storer.0", KVR_STAT_XF_BLOCKS), 12);
	cr_assert_eq(h_stat(&inst, "loader.0", KVR_STAT_XF_BYTES), 8 * M_LANE_BYTES);
}

Test(metrics, http_paths_and_methods)
{
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	struct m_http r;

	cr_assert_eq(m_http(port, "GET", "/metrics", &r), 0);
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.head, "Content-Type: text/plain; version=0.0.4"), "headers:\n%s", r.head);
	cr_assert(strstr(r.body, "# TYPE kvring_actor_up gauge\n"));
	m_http_free(&r);

	cr_assert_eq(m_http(port, "HEAD", "/metrics", &r), 0);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body_len, 0);
	m_http_free(&r);

	/* "/" and "/status" are served too (tests/metrics/test_status.c) */
	const char *not_found[] = {"/metrics/", "/metricsx", "/favicon.ico", "/index.html"};
	for (unsigned i = 0; i < 4; i++) {
		cr_assert_eq(m_http(port, "GET", not_found[i], &r), 0);
		cr_assert_eq(r.status, 404, "GET %s: %d", not_found[i], r.status);
		cr_assert_str_eq(r.body, "not found: kvringd serves /, /status and /metrics\n");
		m_http_free(&r);
	}
	const char *methods[] = {"POST", "PUT", "DELETE", "OPTIONS"};
	for (unsigned i = 0; i < 4; i++) {
		cr_assert_eq(m_http(port, methods[i], "/metrics", &r), 0);
		cr_assert_eq(r.status, 405, "%s /metrics: %d", methods[i], r.status);
		cr_assert(strstr(r.head, "Allow: GET, HEAD"), "headers:\n%s", r.head);
		m_http_free(&r);
	}
	/* a query string does not change the path */
	cr_assert_eq(m_http(port, "GET", "/metrics?x=1", &r), 0);
	cr_assert_eq(r.status, 200);
	m_http_free(&r);
}

Test(metrics, disabled_nothing_listens)
{
	uint16_t port = m_free_port();
	m_start(&inst, false, port);
	struct m_http r;
	cr_assert_eq(m_http(port, "GET", "/metrics", &r), -ECONNREFUSED);
	/* the arena's background prefault is kvringd's other thread, while it runs */
	cr_assert_eq(threads_after_prefault(inst.pid, 1), 1, "no metrics thread when disabled");
	cr_assert(!h_log_contains(&inst, "metrics on"));
}

Test(metrics, port_in_use_refuses_start)
{
	/* someone else listens on the port */
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(fd, 1), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	uint16_t port = ntohs(a.sin_port);

	m_write_config(&inst, true, port);
	const char *args[] = {"--config", inst.cfg, NULL};
	inst.pid = h_spawn_kvringd(&inst, args);
	int st = h_wait_exit(inst.pid, 5000);
	close(fd);
	cr_assert(st != -1, "kvringd did not exit");
	inst.pid = 0;
	char *log = h_read_file(inst.log);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "exit status %#x; log:\n%s", st, log);
	char want[128];
	snprintf(want, sizeof(want), "$.metrics.listen: cannot listen on 127.0.0.1:%u: Address already in use", port);
	cr_assert(strstr(log, want), "log lacks \"%s\":\n%s", want, log);
	/* refused before anything started: no actor, no socket left behind */
	cr_assert_null(strstr(log, "lookup started"), "log:\n%s", log);
	free(log);
	struct stat sb;
	cr_assert_neq(stat(inst.sock, &sb), 0, "the attach socket was left behind");
}

Test(metrics, restart_counted)
{
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	struct kvr_actor_ent *lk = h_actor(&inst, "lookup");
	pid_t pid = atomic_load(&lk->pid);
	uint32_t gen = atomic_load(&lk->generation);
	cr_assert(pid > 0);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_assert(H_WAIT(atomic_load(&lk->generation) == gen + 1 && atomic_load(&lk->state) == KVR_ACTOR_READY, 5000),
		  "lookup was not restarted");
	char *t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_actor_restarts_total{actor=\"lookup\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_actor_last_exit_signal{actor=\"lookup\"}"), SIGKILL);
	cr_assert_eq(m_get(t, "kvring_actor_last_exit_code{actor=\"lookup\"}"), -1);
	cr_assert_eq(m_get(t, "kvring_actor_up{actor=\"lookup\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_instance_state{state=\"running\"}"), 1);
	free(t);

	/* SIGTERM: metrics stay up through the drain, and the port is free after the exit */
	cr_assert_eq(kill(inst.pid, SIGTERM), 0);
	int st = h_wait_exit(inst.pid, 5000);
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %#x", st);
	inst.pid = 0;
	struct m_http r;
	cr_assert_eq(m_http(port, "GET", "/metrics", &r), -ECONNREFUSED);
}

/* Per model namespace: engines, lookups, tokens asked for and matched, lanes stored, and what
 * L1 holds of each (the slots the lookup actor tagged) — two engines of two namespaces on one
 * instance, exact; a namespace keeps its label after its engine left; past KVR_CTL_MAX_MODELS
 * namespaces the rest count as "other". */
Test(metrics, per_model_counters_and_l1)
{
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	char *t = m_scrape(port);
	double v;
	cr_assert(!m_value(t, "kvring_model_engines{model=\"other\"}", &v), "model families before any engine");
	free(t);

	m_worker_attach_engine(&worker, inst.sock, "ea", "org/a");
	m_workload(&worker); /* 3 lookups of 4 blocks (8 matched), 12 lanes stored */
	struct m_worker b = {.kv_fd = -1};
	m_worker_attach_engine(&b, inst.sock, "eb", "org/b");
	uint32_t tok[M_PROMPT_TOKENS], ids[4] = {0, 1, 2, 3};
	m_prompt(tok, 0); /* the same tokens: other keys in org/b's namespace */
	cr_assert_eq(kvr_store(b.c, 1, tok, M_PROMPT_TOKENS, NULL, 0, ids, 4), 0, "%s", kvr_last_error(b.c));
	struct kvr_completion done;
	cr_assert_eq(kvr_wait(b.c, &done, 1, 5000), 1);
	cr_assert_eq(done.n_stored, 4);
	struct kvr_lookup_result lr;
	m_prompt(tok, 1);
	cr_assert_eq(kvr_lookup(b.c, 2, tok, M_PROMPT_TOKENS, NULL, 0, &lr), 0);
	cr_assert_eq(lr.matched_blocks, 0, "org/b must not match org/a's blocks");

	t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_model_engines{model=\"org/a\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_model_engines{model=\"org/b\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_model_lookups_total{model=\"org/a\"}"), 3);
	cr_assert_eq(m_get(t, "kvring_model_lookups_total{model=\"org/b\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_model_requested_tokens_total{model=\"org/a\"}"), 12 * M_BLOCK_TOKENS);
	cr_assert_eq(m_get(t, "kvring_model_matched_tokens_total{model=\"org/a\"}"), 8 * M_BLOCK_TOKENS);
	cr_assert_eq(m_get(t, "kvring_model_requested_tokens_total{model=\"org/b\"}"), 4 * M_BLOCK_TOKENS);
	cr_assert_eq(m_get(t, "kvring_model_matched_tokens_total{model=\"org/b\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_model_stored_lanes_total{model=\"org/a\"}"), 12);
	cr_assert_eq(m_get(t, "kvring_model_stored_lanes_total{model=\"org/b\"}"), 4);
	cr_assert_eq(m_get(t, "kvring_model_l1_slots{model=\"org/a\"}"), 12);
	cr_assert_eq(m_get(t, "kvring_model_l1_slots{model=\"org/b\"}"), 4);
	cr_assert_eq(m_get(t, "kvring_model_l1_bytes{model=\"org/a\"}"), 12 * M_LANE_BYTES);
	cr_assert_eq(m_get(t, "kvring_model_l1_bytes{model=\"org/b\"}"), 4 * M_LANE_BYTES);
	cr_assert(!m_value(t, "kvring_model_engines{model=\"other\"}", &v), "nothing counted under other yet");
	char out[4096];
	if (m_have_promtool())
		cr_assert_eq(m_promtool(t, out, sizeof(out)), 0, "promtool: %s", out);
	free(t);

	/* org/b's engine leaves: its label stays (a counter never changes meaning), 0 engines */
	m_worker_close(&b);
	t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_model_engines{model=\"org/b\"}"), 0);
	cr_assert_eq(m_get(t, "kvring_model_l1_slots{model=\"org/b\"}"), 4);
	free(t);

	/* 14 more namespaces fill the table (16 with org/a and org/b); the 15th is "other" */
	for (unsigned i = 0; i < 15; i++) {
		char ns[32], id[32];
		snprintf(ns, sizeof(ns), "org/s%u", i);
		snprintf(id, sizeof(id), "s%u", i);
		struct kvr_sched_opts so = {.socket = inst.sock, .engine_id = id, .model_ns = ns, .timeout_ms = 5000};
		struct kvr_client *sc;
		cr_assert_eq(kvr_attach_scheduler(&so, &sc), 0, "%s", kvr_last_error(NULL));
		m_prompt(tok, 0);
		cr_assert_eq(kvr_lease(sc, 9, tok, M_PROMPT_TOKENS, NULL, 0, NULL, &lr), 0, "%s", kvr_last_error(sc));
		t = m_scrape(port);
		if (i < 14) {
			cr_assert_eq(m_get(t, (snprintf(out, sizeof(out), "kvring_model_lookups_total{model=\"%s\"}", ns), out)),
				     1);
		} else {
			cr_assert(!m_value(t, "kvring_model_engines{model=\"org/s14\"}", &v), "a 17th label");
			cr_assert_eq(m_get(t, "kvring_model_engines{model=\"other\"}"), 1);
			cr_assert_eq(m_get(t, "kvring_model_lookups_total{model=\"other\"}"), 1);
			cr_assert_eq(m_get(t, "kvring_model_requested_tokens_total{model=\"other\"}"), 4 * M_BLOCK_TOKENS);
		}
		free(t);
		kvr_detach(sc);
	}
	cr_assert(h_log_contains(&inst, "model namespace \"org/s14\" (counted under model \"other\": the model table is "
					"full)"));
}
