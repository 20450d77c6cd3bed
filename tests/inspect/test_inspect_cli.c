/* Tests of the kvring-inspect program: INSPECT over a Unix socket, exit codes, --json, --watch and SIGINT. */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "tool_test.h"
#include "kvr_ctl.h"
#include "kvr_proto.h"
#include "kvr_segment.h"


/* ---- a stand-in for kvringd's INSPECT handler ------------------------------------------ */

struct fake {
	char path[108];
	int lsock;
	int status;        /* reply status: 0 sends the ctl fd, < 0 refuses */
	unsigned serve_n;  /* connections answered before the thread ends (0 = 1; teardown's
			    * shutdown of lsock ends it early) */
	unsigned served;
	struct kvr_segment seg;
	pthread_t thr;
	int got_op;        /* what the client asked for */
	int got_magic_ok;
};

static struct fake fk;
static char out_path[128], err_path[128];

static void serve_one(struct fake *f, int c);

static void *serve(void *arg)
{
	struct fake *f = arg;
	do {
		int c = accept4(f->lsock, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0)
			return NULL;
		serve_one(f, c);
		f->served++;
	} while (f->served < f->serve_n);
	return NULL;
}

/* Answer one INSPECT (kvring-inspect sends one per connection; --watch one per frame). */
static void serve_one(struct fake *f, int c)
{
	struct kvr_proto_req req;
	unsigned n_fds = 0;
	int fds[KVR_PROTO_MAX_FDS];
	ssize_t n = kvr_proto_recv(c, &req, sizeof(req), fds, KVR_PROTO_MAX_FDS, &n_fds);
	if (n >= (ssize_t)offsetof(struct kvr_proto_req, payload)) {
		f->got_op = (int)req.op;
		f->got_magic_ok = req.magic == KVR_PROTO_MAGIC && req.version == KVR_PROTO_VERSION;
	}
	struct kvr_proto_rep rep = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .status = f->status};
	if (f->status < 0) {
		snprintf(rep.reason, sizeof(rep.reason), "peer uid 1234 is not the instance owner");
		kvr_proto_send(c, &rep, sizeof(rep), NULL, 0);
	} else {
		rep.n_fds = 1;
		kvr_proto_send(c, &rep, sizeof(rep), &f->seg.fd, 1);
	}
	close(c);
}

static void setup(void)
{
	static const struct kvr_ctl_ring_spec specs[] = {{"ctl.lookup.in", 8, KVR_EP_SUPERVISOR, 0}};
	size_t sz = kvr_ctl_memsize(2, 1, specs, 1, 8);
	cr_assert_eq(kvr_segment_create("kvr-test-inspect-cli", KVR_SEG_CTL, sz, 1, 0, &fk.seg), 0);
	cr_assert_eq(kvr_ctl_init(&fk.seg, 2, 1, specs, 1, "{}"), 0);
	struct kvr_ctl *c;
	static struct kvr_ctl_rings rings;
	cr_assert_eq(kvr_ctl_attach(&fk.seg, &c, &rings), 0);
	atomic_store(&c->state, KVR_INST_RUNNING);
	c->supervisor_pid = getpid();
	c->generation = 7;
	struct kvr_actor_ent *a = kvr_ctl_actor(c, 0);
	snprintf(a->name, sizeof(a->name), "lookup");
	atomic_store(&a->state, KVR_ACTOR_READY);
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_PING, 0, 7, 0, NULL, 0);
	cr_assert_eq(kvr_ring_try_enqueue(kvr_ctl_ring(&rings, 0), &m), 0);

	snprintf(fk.path, sizeof(fk.path), "/tmp/kvr-test-inspect-%d.sock", getpid());
	snprintf(out_path, sizeof(out_path), "/tmp/kvr-test-inspect-%d.out", getpid());
	snprintf(err_path, sizeof(err_path), "/tmp/kvr-test-inspect-%d.err", getpid());
	(void)unlink(fk.path);
	fk.lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	cr_assert_geq(fk.lsock, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, fk.path);
	cr_assert_eq(bind(fk.lsock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(fk.lsock, 4), 0);
}

static void teardown(void)
{
	(void)shutdown(fk.lsock, SHUT_RDWR); /* ends a serve() still waiting in accept */
	if (fk.thr)
		pthread_join(fk.thr, NULL);
	close(fk.lsock);
	(void)unlink(fk.path);
	(void)unlink(out_path);
	(void)unlink(err_path);
	kvr_segment_close(&fk.seg);
}

TestSuite(inspect_cli, .init = setup, .fini = teardown, .timeout = 60);

static void start_server(int status)
{
	fk.status = status;
	cr_assert_eq(pthread_create(&fk.thr, NULL, serve, &fk), 0);
}

static char *slurp(const char *path)
{
	return tool_slurp(path);
}

/* Start kvring-inspect with args; stdout and stderr go to out_path and err_path. */
static pid_t spawn_inspect(const char *const *args)
{
	return tool_spawn("tools/inspect/kvring-inspect", args, out_path, err_path);
}

static int wait_exit(pid_t pid)
{
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st), "kvring-inspect died of signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	return WEXITSTATUS(st);
}

static int run_inspect(const char *const *args)
{
	return wait_exit(spawn_inspect(args));
}

Test(inspect_cli, json_over_the_socket)
{
	start_server(0);
	const char *args[] = {"--socket", fk.path, "--json", NULL};
	cr_assert_eq(run_inspect(args), 0);
	pthread_join(fk.thr, NULL);
	fk.thr = 0;
	cr_assert_eq(fk.got_op, KVR_OP_INSPECT);
	cr_assert(fk.got_magic_ok);

	char *js = slurp(out_path);
	cJSON *root = cJSON_Parse(js);
	cr_assert_not_null(root, "%s", js);
	const cJSON *inst = cJSON_GetObjectItem(root, "instance");
	cr_assert_str_eq(cJSON_GetObjectItem(inst, "state")->valuestring, "running");
	cr_assert_eq(cJSON_GetObjectItem(inst, "supervisor_pid")->valuedouble, getpid());
	cr_assert_eq(cJSON_GetObjectItem(inst, "generation")->valuedouble, 7);
	const cJSON *r = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "rings"), 0);
	cr_assert_eq(cJSON_GetObjectItem(r, "fill")->valuedouble, 1);
	const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "messages"), 0);
	cr_assert_str_eq(cJSON_GetObjectItem(m, "type_name")->valuestring, "ping");
	cr_assert_eq(cJSON_GetObjectItem(m, "req_id")->valuedouble, 7);
	cJSON_Delete(root);
	free(js);
	/* the observer left the ring as it was */
	cr_assert_eq(kvr_ring_shm_count(kvr_ctl_ring_shm(fk.seg.base, 0)), 1);
}

Test(inspect_cli, text_over_the_socket)
{
	start_server(0);
	const char *args[] = {"--socket", fk.path, "--messages", "1", NULL};
	cr_assert_eq(run_inspect(args), 0);
	char *txt = slurp(out_path);
	cr_assert_not_null(strstr(txt, "kvring instance: running\n"), "%s", txt);
	cr_assert_not_null(strstr(txt, "    in flight: 1\n      #0 ping req=7 seq=0 flags=- len=0\n"), "%s", txt);
	free(txt);
}

Test(inspect_cli, cannot_connect_exits_1)
{
	char missing[128];
	snprintf(missing, sizeof(missing), "/tmp/kvr-test-inspect-%d-missing.sock", getpid());
	const char *args[] = {"--socket", missing, NULL};
	cr_assert_eq(run_inspect(args), 1);
	char *err = slurp(err_path);
	char want[256];
	snprintf(want, sizeof(want), "kvring-inspect: cannot connect to %s: No such file or directory\n", missing);
	cr_assert_str_eq(err, want);
	free(err);
	char *out = slurp(out_path);
	cr_assert_str_eq(out, "");
	free(out);
}

Test(inspect_cli, refused_exits_1_with_reason)
{
	start_server(-EPERM);
	const char *args[] = {"--socket", fk.path, NULL};
	cr_assert_eq(run_inspect(args), 1);
	char *err = slurp(err_path);
	cr_assert_not_null(strstr(err, "inspect refused: Operation not permitted (peer uid 1234 is not the instance owner)"),
			   "%s", err);
	free(err);
}

Test(inspect_cli, bad_arguments_exit_2)
{
	const char *cases[][4] = {
		{"--messages", "-1", NULL},	   {"--messages", "lots", NULL}, {"--bogus", NULL},
		{"--watch", "abc", NULL},	   {"--watch=0", NULL},		 {"stray", NULL},
		{"--socket", NULL},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_assert_eq(run_inspect(cases[i]), 2, "case %zu (%s)", i, cases[i][0]);
		char *err = slurp(err_path);
		cr_assert_not_null(strstr(err, "kvring-inspect: "), "case %zu: %s", i, err);
		free(err);
	}
	const char *help[] = {"--help", NULL};
	cr_assert_eq(run_inspect(help), 0);
	char *out = slurp(out_path);
	cr_assert_not_null(strstr(out, "usage: kvring-inspect"));
	free(out);
}

static unsigned count(const char *hay, const char *needle)
{
	unsigned n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

Test(inspect_cli, watch_refreshes_and_exits_0_on_sigint)
{
	fk.serve_n = 1000; /* every frame after the first asks again for the engine table */
	start_server(0);
	const char *args[] = {"--socket", fk.path, "--watch", "0.1", NULL};
	pid_t pid = spawn_inspect(args);
	/* wait for at least three frames (the second and later carry rates), at most 10 s */
	char *txt = NULL;
	for (int i = 0; i < 200; i++) {
		struct timespec ts = {.tv_nsec = 50000000};
		nanosleep(&ts, NULL);
		free(txt);
		txt = slurp(out_path);
		if (count(txt, "kvring-inspect --watch") >= 3)
			break;
	}
	cr_assert_geq(count(txt, "kvring-inspect --watch"), 3, "%s", txt);
	cr_assert_eq(kill(pid, SIGINT), 0);
	cr_assert_eq(wait_exit(pid), 0);
	free(txt);
	txt = slurp(out_path);
	cr_assert_geq(count(txt, "\033[H\033[2J"), 3);
	cr_assert_not_null(strstr(txt, "  ctl.lookup.in  capacity 8  0 msg/s\n"), "%s", txt);
	cr_assert_null(strstr(txt, "engines: unknown"), "a frame without kvringd's engine table:\n%s", txt);
	cr_assert_geq(count(txt, "engines: none attached\n"), 3, "%s", txt);
	free(txt);
	(void)shutdown(fk.lsock, SHUT_RDWR);
	pthread_join(fk.thr, NULL);
	fk.thr = 0;
	cr_assert_geq(fk.served, 3, "INSPECT once per frame");
}

/* --watch when kvringd stops answering: the frame still comes (the segment is mapped), its
 * engines section says why there is none after at most a second. */
Test(inspect_cli, watch_frame_without_engine_table)
{
	start_server(0); /* answers the first INSPECT only */
	const char *args[] = {"--socket", fk.path, "--watch", "0.1", NULL};
	pid_t pid = spawn_inspect(args);
	char *txt = NULL;
	for (int i = 0; i < 200; i++) {
		struct timespec ts = {.tv_nsec = 50000000};
		nanosleep(&ts, NULL);
		free(txt);
		txt = slurp(out_path);
		if (count(txt, "kvring-inspect --watch") >= 2)
			break;
	}
	cr_assert_eq(kill(pid, SIGINT), 0);
	cr_assert_eq(wait_exit(pid), 0);
	free(txt);
	txt = slurp(out_path);
	cr_assert_geq(count(txt, "kvring-inspect --watch"), 2, "%s", txt);
	cr_assert_not_null(strstr(txt, "\nengines: none attached\n"), "%s", txt);
	cr_assert_not_null(strstr(txt, "\nengines: unknown (kvringd's table: Connection timed out)\n"), "%s", txt);
	free(txt);
}
