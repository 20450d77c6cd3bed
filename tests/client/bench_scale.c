/* kvringd start to ready, and a worker attached, for arenas of 1, 4, 16 and 64 GiB side by side (issue 13: flat in arena size). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"
#include "kvr_time.h"

/*
 * The same model (4 MiB block lanes) with arenas of 1, 4, 16 and 64 GiB, one after the other
 * in one run: time from spawning kvringd until its lookup actor is ready, then until a
 * worker's kvr_attach returned (its loader and storer ready). l1.prefault "off": the
 * background prefault is not on the ready path either way, and with it on, a 16 GiB
 * prefault would still be running while the next size is measured. Speed is printed, never
 * asserted; the bench asserts that every size started and attached.
 */

static struct ct_env env;
static void setup(void) { ct_init(&env); }
static void teardown(void) { ct_fini(&env); }
TestSuite(bench_scale, .init = setup, .fini = teardown, .timeout = 300);

static const struct ct_model big = {.layers = 8, .kv_heads = 8, .head_dim = 128, .dtype_bytes = 2,
				    .block_tokens = 128, .tp_size = 1};

static void stop_kvringd(void)
{
	ct_close_all();
	cr_assert_eq(kill(env.h.pid, SIGTERM), 0);
	int st = h_wait_exit(env.h.pid, 20000);
	cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvringd exit %d", st);
	env.h.pid = 0;
	kvr_segment_close(&env.slots_seg);
	kvr_segment_close(&env.ctl_seg);
	kvr_segment_close(&env.arena_seg);
}

Test(bench_scale, start_to_ready_by_arena_size)
{
	static const unsigned gib[] = {1, 4, 16, 64};
	double ready_ms[4], attach_ms[4];
	for (unsigned k = 0; k < 4; k++) {
		uint32_t n_slots = (uint32_t)(((uint64_t)gib[k] << 30) / kvr_slots_slot_bytes(ct_lane_bytes(&big)));
		uint64_t t0 = kvr_now_ns();
		ct_start(&env, &big, &(struct ct_opts){.l1_slots = n_slots, .l1_extra = ", \"prefault\": \"off\""});
		ready_ms[k] = (kvr_now_ns() - t0) / 1e6;
		struct ct_rank *r;
		cr_assert_eq(ct_rank_open(&env, 0, 4, 0, &r), 0, "%u GiB: %s", gib[k], kvr_last_error(NULL));
		attach_ms[k] = (kvr_now_ns() - t0) / 1e6;
		stop_kvringd();
	}
	printf("kvringd start to ready (lookup actor ready) and to a worker attached, by arena size:\n");
	printf("  arena           1 GiB     4 GiB    16 GiB    64 GiB   64 GiB / 1 GiB\n");
	printf("  ready (ms)   %8.1f  %8.1f  %8.1f  %8.1f   %.2f\n", ready_ms[0], ready_ms[1], ready_ms[2], ready_ms[3],
	       ready_ms[3] / ready_ms[0]);
	printf("  attached (ms)%8.1f  %8.1f  %8.1f  %8.1f   %.2f\n", attach_ms[0], attach_ms[1], attach_ms[2],
	       attach_ms[3], attach_ms[3] / attach_ms[0]);
}
