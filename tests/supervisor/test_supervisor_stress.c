/* kvringd stress tests: random kills, attach/detach churn, drain timeout escalation (suite 'stress'). */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sup_harness.h"

static struct h_inst inst;

static void setup(void)
{
	h_init(&inst, 0700);
}

static void teardown(void)
{
	h_fini(&inst);
}

TestSuite(supervisor_stress, .init = setup, .fini = teardown, .timeout = 120);

static void write_lenient_config(unsigned drain_ms)
{
	char sup[512];
	snprintf(sup, sizeof(sup),
		 "\"ready_timeout_ms\": 3000, \"stable_after_ms\": 100, \"restart_backoff_initial_ms\": 10, "
		 "\"restart_backoff_max_ms\": 50, \"crash_loop_max_deaths\": 1000, \"crash_loop_window_s\": 10, "
		 "\"health_interval_ms\": 200, \"drain_timeout_ms\": %u",
		 drain_ms);
	h_write_config_with(&inst, NULL, 2, sup,
			    ",\n  \"model\": {\"preset\": \"qwen3-8b\", \"tp_size\": 2},\n  \"l1\": {\"capacity_bytes\": \"64MiB\", \"huge_pages\": false}");
}

static struct kvr_actor_ent *wait_ready(const char *name)
{
	struct kvr_actor_ent *e = h_actor(&inst, name);
	cr_assert(e);
	cr_assert(H_WAIT(atomic_load(&e->state) == KVR_ACTOR_READY && atomic_load(&e->pid) > 0, 5000),
		  "%s not ready (state %s)", name, kvr_actor_state_name(atomic_load(&e->state)));
	return e;
}

/* Kill random actors one at a time; each comes back with a new pid and generation. */
Test(supervisor_stress, random_kills)
{
	unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
	if (getenv("KVR_TEST_SEED"))
		seed = (unsigned)strtoul(getenv("KVR_TEST_SEED"), NULL, 0);
	fprintf(stderr, "supervisor_stress/random_kills: seed %u (KVR_TEST_SEED=%u to repeat)\n", seed, seed);
	srand(seed);

	write_lenient_config(3000);
	h_start(&inst);
	struct h_worker w0, w1;
	cr_assert_eq(h_attach_rank(inst.sock, 2, 0, &w0), 0);
	cr_assert_eq(h_attach_rank(inst.sock, 2, 1, &w1), 0);
	cr_assert_eq(w0.status, 0);
	cr_assert_eq(w1.status, 0);
	static const char *const names[] = {"lookup", "loader.0", "storer.0", "loader.1", "storer.1"};
	unsigned kills[5] = {0};
	const unsigned rounds = 40;
	for (unsigned r = 0; r < rounds; r++) {
		unsigned k = (unsigned)rand() % 5;
		struct kvr_actor_ent *e = wait_ready(names[k]);
		pid_t pid = atomic_load(&e->pid);
		uint32_t gen = atomic_load(&e->generation);
		cr_assert_eq(kill(pid, SIGKILL), 0);
		kills[k]++;
		bool back = H_WAIT(atomic_load(&e->generation) == gen + 1 &&
					   atomic_load(&e->state) == KVR_ACTOR_READY, 5000);
		cr_assert(back, "round %u: %s not back", r, names[k]);
		cr_assert_neq(atomic_load(&e->pid), pid);
	}
	for (unsigned k = 0; k < 5; k++) {
		struct kvr_actor_ent *e = wait_ready(names[k]);
		cr_assert_eq(e->restarts, kills[k], "%s restarts %u, killed %u", names[k], e->restarts, kills[k]);
		cr_assert_eq(atomic_load(&e->generation), kills[k] + 1);
		/* and it still answers */
		uint64_t pings = h_stat(&inst, names[k], KVR_STAT_PINGS);
		cr_assert(H_WAIT(h_stat(&inst, names[k], KVR_STAT_PINGS) > pings, 2000));
	}
	cr_assert_eq(atomic_load(&inst.ctl->state), KVR_INST_RUNNING);
	h_worker_close(&w0);
	h_worker_close(&w1);
}

/* Attach and detach many times: slots are always freed, no process is left behind. */
Test(supervisor_stress, attach_detach_churn)
{
	write_lenient_config(3000);
	h_start(&inst);
	const unsigned rounds = 30;
	for (unsigned r = 0; r < rounds; r++) {
		struct h_worker w;
		cr_assert_eq(h_attach_rank(inst.sock, 2, 0, &w), 0);
		cr_assert_eq(w.status, 0, "round %u: %s", r, w.reason);
		cr_assert_eq(w.worker, 0, "round %u: slot 0 not reused", r);
		pid_t ld = atomic_load(&wait_ready("loader.0")->pid);
		pid_t st = atomic_load(&wait_ready("storer.0")->pid);
		h_worker_close(&w);
		struct kvr_worker_ent *we = kvr_ctl_worker(inst.ctl, 0);
		cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_FREE, 6000), "round %u: slot not freed", r);
		cr_assert(!h_pid_alive(ld) && !h_pid_alive(st));
		cr_assert_eq(we->generation, r + 1);
	}
	struct kvr_actor_ent *ld = h_actor(&inst, "loader.0");
	cr_assert_eq(atomic_load(&ld->generation), rounds);
	cr_assert_eq(ld->restarts, 0);
	cr_assert_eq(ld->last_exit_code, 0);
	/* lookup heard WORKER_GONE once per detach */
	cr_assert(H_WAIT(h_stat(&inst, "lookup", KVR_STAT_LK_WORKERS_GONE) == rounds, 1000), "workers gone: %llu",
		  (unsigned long long)h_stat(&inst, "lookup", KVR_STAT_LK_WORKERS_GONE));
	cr_assert_eq(h_stat(&inst, "lookup", KVR_STAT_MALFORMED), 0);
}

/* An actor that cannot finish: drain times out, STOP is not answered, SIGTERM is not
 * delivered (stopped process), SIGKILL at 5 s ends it; kvringd still exits 0. */
Test(supervisor_stress, drain_timeout_escalates_to_sigkill)
{
	write_lenient_config(500);
	h_start(&inst);
	pid_t lk = atomic_load(&wait_ready("lookup")->pid);
	cr_assert_eq(kill(lk, SIGSTOP), 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(kill(inst.pid, SIGTERM), 0);
	int st = h_wait_exit(inst.pid, 9000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	inst.pid = 0;
	/* rings were empty: STOP at once, SIGTERM after 2 s, SIGKILL after 5 s */
	cr_assert(dt > 4.9 && dt < 7.0, "took %.2f s", dt);
	cr_assert(h_log_contains(&inst, "still running 2 s after STOP: SIGTERM"));
	cr_assert(h_log_contains(&inst, "still running 5 s after STOP: SIGKILL"));
	cr_assert(!h_pid_alive(lk));
}

/* A loader that never read its STOP is killed at 5 s; the STOP it left on ctl.in must not
 * end its successor: the next attach gets a loader that stays up. */
Test(supervisor_stress, stale_stop_not_inherited)
{
	write_lenient_config(3000);
	h_start(&inst);
	struct h_worker w;
	cr_assert_eq(h_attach_rank(inst.sock, 2, 0, &w), 0);
	cr_assert_eq(w.status, 0);
	struct kvr_actor_ent *ld = wait_ready("loader.0");
	pid_t pid = atomic_load(&ld->pid);
	cr_assert_eq(kill(pid, SIGSTOP), 0);
	h_worker_close(&w);
	struct kvr_worker_ent *we = kvr_ctl_worker(inst.ctl, 0);
	cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_FREE, 8000), "slot not freed");
	cr_assert_eq(ld->last_exit_signal, SIGKILL);
	cr_assert_eq(kvr_ring_count(h_ring(inst.ctl, "ctl.loader.0.in")), 1, "the STOP is still queued");

	cr_assert_eq(h_attach_rank(inst.sock, 2, 0, &w), 0);
	cr_assert_eq(w.status, 0);
	ld = wait_ready("loader.0");
	pid_t pid2 = atomic_load(&ld->pid);
	uint64_t pings = h_stat(&inst, "loader.0", KVR_STAT_PINGS);
	cr_assert(H_WAIT(h_stat(&inst, "loader.0", KVR_STAT_PINGS) >= pings + 2, 2000));
	cr_assert_eq(atomic_load(&ld->pid), pid2);
	cr_assert_eq(atomic_load(&ld->state), KVR_ACTOR_READY);
	cr_assert_eq(ld->restarts, 0);
	cr_assert_eq(atomic_load(&ld->generation), 2);
	h_worker_close(&w);
}
