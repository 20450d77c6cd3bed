/* Tests of kvring-ringbench: a short run whose JSON must show every message verified, and its argument checks. */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tool_test.h"

static char out_path[128], err_path[128];

static void setup(void)
{
	snprintf(out_path, sizeof(out_path), "/tmp/kvr-test-ringbench-%d.out", getpid());
	snprintf(err_path, sizeof(err_path), "/tmp/kvr-test-ringbench-%d.err", getpid());
}

static void teardown(void)
{
	(void)unlink(out_path);
	(void)unlink(err_path);
}

TestSuite(ringbench, .init = setup, .fini = teardown, .timeout = 240);

static char *slurp(const char *path)
{
	return tool_slurp(path);
}

/* Run kvring-ringbench with args (NULL-terminated); returns its exit status. */
static int run_bench(const char *const *args)
{
	pid_t pid = tool_spawn("tools/ringbench/kvring-ringbench", args, out_path, err_path);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st), "kvring-ringbench died of signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	return WEXITSTATUS(st);
}

static double num(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	cr_assert(cJSON_IsNumber(v), "%s missing or not a number", k);
	return v->valuedouble;
}

static const cJSON *transport(const cJSON *root, const char *name)
{
	const cJSON *t;
	cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "transports"))
	{
		if (strcmp(cJSON_GetObjectItem(t, "name")->valuestring, name) == 0)
			return t;
	}
	cr_assert_fail("transport %s missing", name);
	return NULL;
}

/* A verified row: every message and every round trip accounted for, sane percentiles. */
static void check_row(const cJSON *t, double messages, double roundtrips)
{
	const char *name = cJSON_GetObjectItem(t, "name")->valuestring;
	cr_assert_str_eq(cJSON_GetObjectItem(t, "result")->valuestring, "ok", "%s: %s", name,
			 cJSON_IsString(cJSON_GetObjectItem(t, "reason")) ? cJSON_GetObjectItem(t, "reason")->valuestring
									  : "");
	const cJSON *l = cJSON_GetObjectItem(t, "latency");
	cr_assert_eq(num(l, "roundtrips"), roundtrips, "%s", name);
	cr_assert_gt(num(l, "rtt_min_ns"), 0);
	cr_assert_leq(num(l, "rtt_min_ns"), num(l, "rtt_p50_ns"));
	cr_assert_leq(num(l, "rtt_p50_ns"), num(l, "rtt_p99_ns"));
	cr_assert_leq(num(l, "rtt_p99_ns"), num(l, "rtt_p999_ns"));
	cr_assert_leq(num(l, "rtt_p999_ns"), num(l, "rtt_max_ns"));
	cr_assert_eq(num(l, "one_way_p50_ns") * 2, num(l, "rtt_p50_ns"));
	const cJSON *th = cJSON_GetObjectItem(t, "throughput");
	cr_assert_eq(num(th, "messages_sent"), messages, "%s", name);
	cr_assert_eq(num(th, "messages_verified"), messages, "%s", name);
	cr_assert_gt(num(th, "msgs_per_s"), 0);
	cr_assert_gt(num(th, "seconds"), 0);
}

Test(ringbench, kvr_and_pipe_verify_every_message)
{
	const char *args[] = {"--transports", "kvr,pipe", "--messages", "200000", "--roundtrips", "5000",
			      "--capacity", "256", "--json", NULL};
	int rc = run_bench(args);
	char *out = slurp(out_path), *err = slurp(err_path);
	cr_assert_eq(rc, 0, "exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
	cJSON *root = cJSON_Parse(out);
	cr_assert_not_null(root, "stdout is not JSON:\n%s", out);
	const cJSON *p = cJSON_GetObjectItem(root, "params");
	cr_assert_eq(num(p, "message_bytes"), 64);
	cr_assert_eq(num(p, "messages"), 200000);
	cr_assert_eq(num(p, "roundtrips"), 5000);
	cr_assert_eq(num(p, "warmup_roundtrips"), 500);
	cr_assert_eq(num(p, "kvr_ring_capacity"), 256);
	cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(root, "transports")), 2);
	check_row(transport(root, "kvr"), 200000, 5000);
	check_row(transport(root, "pipe"), 200000, 5000);
	const cJSON *ratios = cJSON_GetObjectItem(root, "ratios");
	const cJSON *kp = cJSON_GetObjectItem(ratios, "kvr/pipe");
	cr_assert(cJSON_IsObject(kp));
	double kvr_tput = num(cJSON_GetObjectItem(transport(root, "kvr"), "throughput"), "msgs_per_s");
	double pipe_tput = num(cJSON_GetObjectItem(transport(root, "pipe"), "throughput"), "msgs_per_s");
	cr_assert_float_eq(num(kp, "throughput"), kvr_tput / pipe_tput, 1e-9 * kvr_tput / pipe_tput);
	cr_assert(cJSON_IsNull(cJSON_GetObjectItem(ratios, "kvr/iceoryx")));
	cJSON_Delete(root);
	free(out);
	free(err);
}

Test(ringbench, text_table_names_every_transport)
{
	const char *args[] = {"--transports", "pipe,kvr", "--messages", "20000", "--roundtrips", "1000", NULL};
	int rc = run_bench(args);
	char *out = slurp(out_path);
	cr_assert_eq(rc, 0, "%s", out);
	cr_assert_not_null(strstr(out, "\nkvr ring "), "%s", out);
	cr_assert_not_null(strstr(out, "\npipe "), "%s", out);
	cr_assert_not_null(strstr(out, "\nkvr/pipe     p50 latency "), "%s", out);
	cr_assert_not_null(strstr(out, "\nkvr/iceoryx  n/a (iceoryx: not run)\n"), "%s", out);
	free(out);
}

Test(ringbench, bad_arguments_exit_2)
{
	const char *cases[][3] = {{"--messages", "0", NULL},	{"--messages", "x", NULL},
				  {"--capacity", "1000", NULL}, {"--transports", "kvr,zmq", NULL},
				  {"--transports", ",", NULL},	{"stray", NULL}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_assert_eq(run_bench(cases[i]), 2, "case %zu", i);
		char *err = slurp(err_path);
		cr_assert_not_null(strstr(err, "kvring-ringbench: bad argument: "), "case %zu: %s", i, err);
		free(err);
	}
}

/* Needs RouDi (a machine-wide daemon): only when asked (the 'stress' suite sets the variable). */
Test(ringbench, iceoryx_row_runs_or_says_why)
{
	if (!getenv("KVR_RINGBENCH_ICEORYX"))
		cr_skip_test("set KVR_RINGBENCH_ICEORYX=1 to start RouDi and run the iceoryx row");
	const char *args[] = {"--transports", "kvr,iceoryx", "--messages", "100000", "--roundtrips", "2000", "--json", NULL};
	int rc = run_bench(args);
	char *out = slurp(out_path), *err = slurp(err_path);
	cr_assert_eq(rc, 0, "exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
	cJSON *root = cJSON_Parse(out);
	cr_assert_not_null(root, "%s", out);
	const cJSON *t = transport(root, "iceoryx");
	const char *result = cJSON_GetObjectItem(t, "result")->valuestring;
	if (strcmp(result, "ok") == 0) {
		check_row(t, 100000, 2000);
		cr_assert(cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "ratios"), "kvr/iceoryx")));
	} else {
		cr_assert_str_eq(result, "skipped");
		cr_assert_gt(strlen(cJSON_GetObjectItem(t, "reason")->valuestring), 0);
	}
	cJSON_Delete(root);
	free(out);
	free(err);
}
