/* Tests of kvring-inspect: exact rendering of a known control segment from a read-only mapping, JSON, CLI. */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "inspect_render.h"
#include "kvr_ctl.h"
#include "kvr_proto.h"
#include "kvr_segment.h"
#include "kvr_time.h"

extern char **environ;

#define S_NS 1000000000ull
#define NOW_MONO (500 * S_NS)
#define NOW_REAL (1800000000ull * S_NS)

/* ---- fixture: a control segment in a known state ------------------------------------- */

enum { R_CTL_IN, R_CTL_OUT, R_LOOKUP_REQ, R_LOADER_IN, N_RINGS };

static const struct kvr_ctl_ring_spec specs[N_RINGS] = {
	[R_CTL_IN] = {"ctl.lookup.in", 8, KVR_EP_SUPERVISOR, 0},
	[R_CTL_OUT] = {"ctl.lookup.out", 8, 0, KVR_EP_SUPERVISOR},
	[R_LOOKUP_REQ] = {"lookup.req.0", 16, KVR_EP_CLIENT(0), 0},
	[R_LOADER_IN] = {"loader.0.in", 4, KVR_EP_CLIENT(0), 1},
};

static struct kvr_segment seg;    /* the writer's mapping (what kvringd and actors hold) */
static struct kvr_segment ro;     /* the observer's mapping: PROT_READ */
static struct kvr_ctl *wctl;      /* through seg */
static const struct kvr_ctl *rctl; /* through ro */

static struct kvr_ctl_rings wrings; /* the writer's views */

static struct kvr_ring *wring(unsigned i)
{
	return kvr_ctl_ring(&wrings, i);
}

static void set_actor(unsigned i, const char *name, unsigned kind, unsigned state, int pid, unsigned restarts,
		      int code, int sig, uint64_t heartbeat)
{
	struct kvr_actor_ent *a = kvr_ctl_actor(wctl, i);
	snprintf(a->name, sizeof(a->name), "%s", name);
	a->kind = kind;
	atomic_store(&a->state, state);
	atomic_store(&a->pid, pid);
	atomic_store(&a->generation, restarts + 1);
	a->restarts = restarts;
	a->last_exit_code = code;
	a->last_exit_signal = sig;
	atomic_store(&a->heartbeat_ns, heartbeat);
}

static void enqueue(unsigned ring, unsigned type, unsigned flags, uint64_t req, uint32_t seq, size_t body_len)
{
	struct kvr_msg m;
	uint8_t body[KVR_MSG_BODY] = {0};
	kvr_msg_build(&m, type, flags, req, seq, body, body_len);
	cr_assert_eq(kvr_ring_try_enqueue(wring(ring), &m), 0);
}

static void build_segment(void)
{
	size_t sz = kvr_ctl_memsize(4, 2, specs, N_RINGS, 64);
	cr_assert_gt(sz, 0);
	char name[64];
	snprintf(name, sizeof(name), "kvr-test-inspect-%d", getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_CTL, sz, 3, 0, &seg), 0);
	cr_assert_eq(kvr_ctl_init(&seg, 4, 2, specs, N_RINGS, "{}"), 0);
	cr_assert_eq(kvr_ctl_attach(&seg, &wctl, &wrings), 0);

	atomic_store(&wctl->state, KVR_INST_DEGRADED);
	wctl->supervisor_pid = 4242;
	wctl->generation = 3;
	wctl->started_ns = NOW_REAL - 3723 * S_NS; /* 1h02m03s */
	snprintf(wctl->socket_path, sizeof(wctl->socket_path), "/tmp/kvring-test.sock");

	set_actor(0, "lookup", KVR_ACTOR_LOOKUP, KVR_ACTOR_READY, 5001, 0, -1, 0, NOW_MONO - 250000000ull);
	set_actor(1, "loader.0", KVR_ACTOR_LOADER, KVR_ACTOR_FAILED, 0, 4, -1, 9, NOW_MONO - 12500000000ull);
	set_actor(2, "storer.0", KVR_ACTOR_STORER, KVR_ACTOR_BACKOFF, 0, 1, 1, 0, 0);
	atomic_store(&wctl->n_actors, 3);

	struct kvr_worker_ent *w = kvr_ctl_worker(wctl, 0);
	atomic_store(&w->state, KVR_WORKER_ATTACHED);
	atomic_store(&w->pid, 6001);
	w->tp_rank = 0;
	w->tp_size = 2;
	w->dcp_rank = 0;
	w->dcp_size = 1;
	w->generation = 1;
	w->block_tokens = 16;

	/* ring X = ctl.lookup.in: 6 messages through (head 6), then ping/pong/stop 7, 8, 9 in
	 * flight: slots 6, 7, 0 (the third wraps) */
	struct kvr_msg scratch;
	for (unsigned i = 0; i < 6; i++) {
		enqueue(R_CTL_IN, KVR_MSG_PING, 0, 100 + i, 0, sizeof(struct kvr_msg_ping));
		cr_assert_eq(kvr_ring_try_dequeue(wring(R_CTL_IN), &scratch), 0);
	}
	enqueue(R_CTL_IN, KVR_MSG_PING, 0, 7, 0, sizeof(struct kvr_msg_ping));
	enqueue(R_CTL_IN, KVR_MSG_PONG, 0, 8, 0, sizeof(struct kvr_msg_pong));
	enqueue(R_CTL_IN, KVR_MSG_STOP, 0, 9, 0, 0);
	kvr_ring_claim_producer(wring(R_CTL_IN), 4242);
	kvr_ring_claim_consumer(wring(R_CTL_IN), 5001);

	kvr_ring_claim_producer(wring(R_CTL_OUT), 5001);
	kvr_ring_claim_consumer(wring(R_CTL_OUT), 4242);
	atomic_store(&wring(R_CTL_OUT)->shm->cons_blocked, 1);

	/* loader.0.in: full (4 of 4), its consumer (loader.0) dead, the client blocked */
	for (uint32_t s = 0; s < 4; s++)
		enqueue(R_LOADER_IN, KVR_MSG_LOAD, s < 3 ? KVR_MSGF_MORE : 0, 77, s, 40);
	struct kvr_ring *ld = wring(R_LOADER_IN);
	kvr_ring_claim_producer(ld, 6001);
	atomic_store(&ld->shm->prod_blocked, 1);
	atomic_store(&ld->shm->full_waits, 2);
	atomic_store(&ld->shm->full_wait_ns, 1500000000ull);
	atomic_store(&ld->shm->rejected, 1);

	/* the observer's mapping */
	cr_assert_eq(kvr_segment_map(seg.fd, KVR_SEG_CTL, 0, &ro), 0);
	struct kvr_ctl *c;
	cr_assert_eq(kvr_ctl_attach(&ro, &c, NULL), 0);
	rctl = c;
}

static void drop_segment(void)
{
	kvr_segment_close(&ro);
	kvr_segment_close(&seg);
}

TestSuite(inspect, .init = build_segment, .fini = drop_segment, .timeout = 30);

static const struct kvr_insp_clock now = {.mono_ns = NOW_MONO, .real_ns = NOW_REAL};

/* Render into a string the caller frees. */
static char *render(const struct kvr_ctl *c, unsigned max_msgs, unsigned flags)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	cr_assert_eq(kvr_insp_render(f, c, &now, max_msgs, flags), 0);
	fclose(f);
	return buf;
}

static char *render_snaps(const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev, int json)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	cr_assert_eq(json ? kvr_insp_render_json(f, cur, prev, false) : kvr_insp_render_text(f, cur, prev), 0);
	fclose(f);
	return buf;
}

static const char expected_text[] =
	"kvring instance: degraded\n"
	"  kvringd pid 4242  generation 3  uptime 1h02m\n"
	"  socket /tmp/kvring-test.sock\n"
	"  actors 3 in use of 4  workers 1 of 2 attached  rings 4\n"
	"\n"
	"attention\n"
	"  actor loader.0: failed, 4 restarts, last exit signal 9\n"
	"  actor storer.0: backoff, 1 restarts, last exit code 1\n"
	"  ring loader.0.in: FULL, 1 malformed rejected\n"
	"    producer client.0 (pid 6001) BLOCKED\n"
	"    consumer loader.0: no process attached\n"
	"\n"
	"actors\n"
	"  NAME                    STATE    PID     RESTARTS  LAST EXIT  HEARTBEAT\n"
	"  lookup                  ready    5001           0  -          0.25s ago\n"
	"  loader.0                failed   -              4  signal 9   12.5s ago\n"
	"  storer.0                backoff  -              1  code 1     -\n"
	"\n"
	"workers\n"
	"  client.0   pid 6001     attached   tp 0/2  dcp 0/1  16-token blocks  engine 0\n"
	"\n"
	"rings\n"
	"  ctl.lookup.in  capacity 8\n"
	"    fill 3/8  37% [#######.............]\n"
	"    producer kvringd                 pid 4242\n"
	"    consumer lookup                  pid 5001\n"
	"    head 6  tail 9  rejected 0\n"
	"    enqueued 9  dequeued 6\n"
	"    full waits 0  waited 0.000 s\n"
	"    in flight: 3\n"
	"      #0 ping req=7 seq=0 flags=- len=16\n"
	"      #1 pong req=8 seq=0 flags=- len=24\n"
	"      #2 stop req=9 seq=0 flags=- len=0\n"
	"  ctl.lookup.out  capacity 8\n"
	"    fill 0/8   0% [....................]\n"
	"    producer lookup                  pid 5001\n"
	"    consumer kvringd                 pid 4242    waiting (ring empty)\n"
	"    head 0  tail 0  rejected 0\n"
	"    enqueued 0  dequeued 0\n"
	"    full waits 0  waited 0.000 s\n"
	"  lookup.req.0  capacity 16\n"
	"    fill 0/16   0% [....................]\n"
	"    producer client.0                pid -\n"
	"    consumer lookup                  pid -\n"
	"    head 0  tail 0  rejected 0\n"
	"    enqueued 0  dequeued 0\n"
	"    full waits 0  waited 0.000 s\n"
	"  loader.0.in  capacity 4  FULL\n"
	"    fill 4/4 100% [####################]\n"
	"    producer client.0                pid 6001    BLOCKED (ring full)\n"
	"    consumer loader.0                pid -       (ring full)\n"
	"    head 0  tail 4  rejected 1\n"
	"    enqueued 4  dequeued 0\n"
	"    full waits 2  waited 1.500 s\n"
	"    in flight: 4\n"
	"      #0 load req=77 seq=0 flags=M len=40\n"
	"      #1 load req=77 seq=1 flags=M len=40\n"
	"      #2 load req=77 seq=2 flags=M len=40\n"
	"      #3 load req=77 seq=3 flags=- len=40\n";

Test(inspect, text_exact_from_read_only_mapping)
{
	char *txt = render(rctl, 8, 0);
	cr_assert_not_null(txt);
	if (strcmp(txt, expected_text) != 0)
		fprintf(stderr, "---- got ----\n%s---- expected ----\n%s", txt, expected_text);
	cr_assert_str_eq(txt, expected_text);
	free(txt);
}

Test(inspect, rendering_changes_nothing)
{
	size_t n = seg.size;
	uint8_t *before = malloc(n);
	cr_assert_not_null(before);
	memcpy(before, seg.base, n);
	struct kvr_ring *x = wring(R_CTL_IN);

	free(render(rctl, 64, 0));
	free(render(rctl, 64, KVR_INSP_JSON));

	cr_assert_eq(atomic_load(&x->shm->head), 6);
	cr_assert_eq(atomic_load(&x->shm->tail), 9);
	cr_assert_eq(atomic_load(&x->shm->enqueued), 9);
	cr_assert_eq(atomic_load(&x->shm->dequeued), 6);
	cr_assert_eq(kvr_ring_count(x), 3);
	cr_assert_eq(atomic_load(&wring(R_LOADER_IN)->shm->full_waits), 2);
	/* every byte of the segment: counters, waiters, sleeper counts, messages */
	cr_assert_eq(memcmp(before, seg.base, n), 0, "the segment changed while it was rendered");
	free(before);

	/* and the messages are still there to be consumed, in order */
	struct kvr_msg m;
	uint64_t want[] = {7, 8, 9};
	for (unsigned i = 0; i < 3; i++) {
		cr_assert_eq(kvr_ring_try_dequeue(x, &m), 0);
		cr_assert_eq(m.hdr.req_id, want[i]);
	}
}

static cJSON *obj(const cJSON *o, const char *k)
{
	cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	cr_assert_not_null(v, "missing JSON field %s", k);
	return v;
}

static double num(const cJSON *o, const char *k)
{
	cJSON *v = obj(o, k);
	cr_assert(cJSON_IsNumber(v), "%s is not a number", k);
	return v->valuedouble;
}

static const char *str(const cJSON *o, const char *k)
{
	cJSON *v = obj(o, k);
	cr_assert(cJSON_IsString(v), "%s is not a string", k);
	return v->valuestring;
}

static int boolean(const cJSON *o, const char *k)
{
	cJSON *v = obj(o, k);
	cr_assert(cJSON_IsBool(v), "%s is not a bool", k);
	return cJSON_IsTrue(v);
}

Test(inspect, json_exact_values)
{
	char *js = render(rctl, 8, KVR_INSP_JSON);
	if (getenv("KVR_TEST_PRINT"))
		fputs(js, stderr);
	cJSON *root = cJSON_Parse(js);
	cr_assert_not_null(root, "JSON does not parse:\n%s", js);

	cr_assert_eq(num(root, "schema"), 1);
	cr_assert_eq(num(root, "now_mono_ns"), (double)NOW_MONO);
	cr_assert(cJSON_IsNull(obj(root, "interval_s")));
	const cJSON *inst = obj(root, "instance");
	cr_assert_str_eq(str(inst, "state"), "degraded");
	cr_assert_eq(num(inst, "state_code"), KVR_INST_DEGRADED);
	cr_assert_eq(num(inst, "supervisor_pid"), 4242);
	cr_assert_eq(num(inst, "generation"), 3);
	cr_assert_eq(num(inst, "uptime_s"), 3723.0);
	cr_assert_str_eq(str(inst, "socket"), "/tmp/kvring-test.sock");
	cr_assert_eq(num(inst, "max_actors"), 4);
	cr_assert_eq(num(inst, "max_workers"), 2);

	const cJSON *actors = obj(root, "actors");
	cr_assert_eq(cJSON_GetArraySize(actors), 3);
	const cJSON *ld = cJSON_GetArrayItem(actors, 1);
	cr_assert_str_eq(str(ld, "name"), "loader.0");
	cr_assert_str_eq(str(ld, "kind"), "loader");
	cr_assert_str_eq(str(ld, "state"), "failed");
	cr_assert_eq(num(ld, "state_code"), KVR_ACTOR_FAILED);
	cr_assert_eq(num(ld, "pid"), 0);
	cr_assert_eq(num(ld, "restarts"), 4);
	cr_assert_eq(num(ld, "generation"), 5);
	cr_assert_eq(num(ld, "last_exit_code"), -1);
	cr_assert_eq(num(ld, "last_exit_signal"), 9);
	cr_assert_eq(num(ld, "heartbeat_age_s"), 12.5);
	cr_assert(cJSON_IsNull(obj(cJSON_GetArrayItem(actors, 2), "heartbeat_age_s")));

	const cJSON *workers = obj(root, "workers");
	cr_assert_eq(cJSON_GetArraySize(workers), 1);
	cr_assert_str_eq(str(cJSON_GetArrayItem(workers, 0), "name"), "client.0");
	cr_assert_eq(num(cJSON_GetArrayItem(workers, 0), "pid"), 6001);
	cr_assert_eq(num(cJSON_GetArrayItem(workers, 0), "tp_size"), 2);

	const cJSON *rings = obj(root, "rings");
	cr_assert_eq(cJSON_GetArraySize(rings), N_RINGS);
	const cJSON *x = cJSON_GetArrayItem(rings, R_CTL_IN);
	cr_assert_str_eq(str(x, "name"), "ctl.lookup.in");
	cr_assert(boolean(x, "valid"));
	cr_assert_eq(num(x, "capacity"), 8);
	cr_assert_eq(num(x, "msg_size"), 64);
	cr_assert_eq(num(x, "head"), 6);
	cr_assert_eq(num(x, "tail"), 9);
	cr_assert_eq(num(x, "fill"), 3);
	cr_assert_eq(num(x, "fill_percent"), 37.5);
	cr_assert_not(boolean(x, "full"));
	cr_assert_eq(num(x, "enqueued"), 9);
	cr_assert_eq(num(x, "dequeued"), 6);
	cr_assert(cJSON_IsNull(obj(x, "rate_msgs_per_s")));
	const cJSON *p = obj(x, "producer");
	cr_assert_str_eq(str(p, "name"), "kvringd");
	cr_assert_eq(num(p, "endpoint"), KVR_EP_SUPERVISOR);
	cr_assert_eq(num(p, "pid"), 4242);
	cr_assert_not(boolean(p, "blocked"));
	cr_assert_str_eq(str(obj(x, "consumer"), "name"), "lookup");
	const cJSON *msgs = obj(x, "messages");
	cr_assert_eq(cJSON_GetArraySize(msgs), 3);
	const char *types[] = {"ping", "pong", "stop"};
	for (int i = 0; i < 3; i++) {
		const cJSON *m = cJSON_GetArrayItem(msgs, i);
		cr_assert_eq(num(m, "index"), i);
		cr_assert_str_eq(str(m, "type_name"), types[i]);
		cr_assert_eq(num(m, "type"), i + 1);
		cr_assert_eq(num(m, "req_id"), 7 + i);
		cr_assert_eq(num(m, "flags"), 0);
		cr_assert_not(boolean(m, "more"));
	}

	const cJSON *l = cJSON_GetArrayItem(rings, R_LOADER_IN);
	cr_assert(boolean(l, "full"));
	cr_assert_eq(num(l, "fill_percent"), 100.0);
	cr_assert(boolean(obj(l, "producer"), "blocked"));
	cr_assert_str_eq(str(obj(l, "producer"), "name"), "client.0");
	cr_assert_str_eq(str(obj(l, "consumer"), "name"), "loader.0");
	cr_assert_eq(num(obj(l, "consumer"), "pid"), 0);
	cr_assert_eq(num(l, "full_waits"), 2);
	cr_assert_eq(num(l, "full_wait_ns"), 1500000000.0);
	cr_assert_eq(num(l, "full_wait_s"), 1.5);
	cr_assert_eq(num(l, "rejected"), 1);
	cr_assert_eq(cJSON_GetArraySize(obj(l, "messages")), 4);
	cr_assert(boolean(cJSON_GetArrayItem(obj(l, "messages"), 0), "more"));
	cr_assert_not(boolean(cJSON_GetArrayItem(obj(l, "messages"), 3), "more"));
	cr_assert(cJSON_IsFalse(obj(cJSON_GetArrayItem(rings, R_CTL_OUT), "full")));
	cr_assert(boolean(obj(cJSON_GetArrayItem(rings, R_CTL_OUT), "consumer"), "blocked"));

	cJSON_Delete(root);
	free(js);
}

Test(inspect, message_limit)
{
	char *txt = render(rctl, 2, 0);
	static const char tail[] = "    in flight: 4 (first 2)\n"
				   "      #0 load req=77 seq=0 flags=M len=40\n"
				   "      #1 load req=77 seq=1 flags=M len=40\n";
	size_t n = strlen(txt);
	cr_assert_geq(n, sizeof(tail) - 1);
	cr_assert_str_eq(txt + n - (sizeof(tail) - 1), tail, "%s", txt);
	cr_assert_not_null(strstr(txt, "    in flight: 3 (first 2)\n"
					"      #0 ping req=7 seq=0 flags=- len=16\n"
					"      #1 pong req=8 seq=0 flags=- len=24\n"
					"  ctl.lookup.out"),
			   "%s", txt);
	cr_assert_null(strstr(txt, "#2 "));
	free(txt);

	txt = render(rctl, 0, 0);
	cr_assert_null(strstr(txt, "in flight"));
	cr_assert_not_null(strstr(txt, "    fill 4/4 100% [####################]\n"));
	free(txt);
}

/* Two snapshots 0.5 s apart: 500 messages through lookup.req.0, none out of the full
 * loader ring. The text shows the rate and a stuck consumer, the JSON the same numbers. */
Test(inspect, watch_rates_and_stuck_consumer)
{
	struct kvr_insp_snap *a, *b;
	cr_assert_eq(kvr_insp_snapshot(rctl, &now, 8, &a), 0);
	struct kvr_ring *q = wring(R_LOOKUP_REQ);
	struct kvr_msg m;
	for (unsigned i = 0; i < 500; i++) {
		kvr_msg_build(&m, KVR_MSG_PING, 0, i, 0, NULL, 0);
		cr_assert_eq(kvr_ring_try_enqueue(q, &m), 0);
		cr_assert_eq(kvr_ring_try_dequeue(q, &m), 0);
	}
	struct kvr_insp_clock later = {.mono_ns = NOW_MONO + S_NS / 2, .real_ns = NOW_REAL + S_NS / 2};
	cr_assert_eq(kvr_insp_snapshot(rctl, &later, 8, &b), 0);

	char *txt = render_snaps(b, a, 0);
	cr_assert_not_null(strstr(txt, "attention\n"
					"  actor loader.0: failed, 4 restarts, last exit signal 9\n"
					"  actor storer.0: backoff, 1 restarts, last exit code 1\n"
					"  ring loader.0.in: FULL, 1 malformed rejected\n"
					"    producer client.0 (pid 6001) BLOCKED\n"
					"    consumer loader.0 (pid -) STUCK (no progress)\n\n"),
			   "%s", txt);
	cr_assert_not_null(strstr(txt, "  lookup.req.0  capacity 16  1.0k msg/s\n"), "%s", txt);
	cr_assert_not_null(strstr(txt, "  ctl.lookup.in  capacity 8  0 msg/s\n"), "%s", txt);
	cr_assert_not_null(strstr(txt, "  loader.0.in  capacity 4  0 msg/s  FULL\n"
					"    fill 4/4 100% [####################]\n"
					"    producer client.0                pid 6001    BLOCKED (ring full)\n"
					"    consumer loader.0                pid -       STUCK (ring full, no progress)\n"),
			   "%s", txt);
	free(txt);

	char *js = render_snaps(b, a, 1);
	cr_assert_null(strchr(js, '\n') == js + strlen(js) - 1 ? NULL : js, "NDJSON is one line");
	cJSON *root = cJSON_Parse(js);
	cr_assert_not_null(root);
	cr_assert_eq(num(root, "interval_s"), 0.5);
	const cJSON *rings = obj(root, "rings");
	cr_assert_eq(num(cJSON_GetArrayItem(rings, R_LOOKUP_REQ), "rate_msgs_per_s"), 1000.0);
	cr_assert_eq(num(cJSON_GetArrayItem(rings, R_LOADER_IN), "rate_msgs_per_s"), 0.0);
	cr_assert(boolean(cJSON_GetArrayItem(rings, R_LOADER_IN), "stuck"));
	cr_assert_not(boolean(cJSON_GetArrayItem(rings, R_CTL_IN), "stuck"));
	cJSON_Delete(root);
	free(js);
	kvr_insp_snap_free(a);
	kvr_insp_snap_free(b);
}

/* Worst case: the longest names, the largest counters, garbage pids and exit statuses,
 * control characters in names. Every line still fits 80 columns and holds no escape. */
Test(inspect, fits_80_columns_whatever_the_segment_holds)
{
	struct kvr_actor_ent *a = kvr_ctl_actor(wctl, 0);
	memset(a->name, 'A', sizeof(a->name)); /* no NUL */
	a->name[3] = '\033';
	atomic_store(&a->pid, -7);
	a->restarts = UINT32_MAX;
	a->last_exit_code = INT32_MIN;
	a->last_exit_signal = INT32_MAX;
	atomic_store(&a->heartbeat_ns, 1);
	memset(wctl->socket_path, 'p', sizeof(wctl->socket_path) - 1);
	wctl->supervisor_pid = INT32_MAX;
	wctl->generation = UINT32_MAX;
	wctl->started_ns = 1;
	struct kvr_worker_ent *w = kvr_ctl_worker(wctl, 1);
	atomic_store(&w->state, 77);
	atomic_store(&w->pid, INT32_MIN);
	w->tp_rank = UINT32_MAX;
	w->dcp_size = UINT32_MAX;
	for (unsigned i = 0; i < N_RINGS; i++) {
		struct kvr_ring_ent *e = kvr_ctl_ring_ent(wctl, i);
		memset(e->name, 'r', sizeof(e->name)); /* no NUL */
		e->name[5] = '\n';
		struct kvr_ring *r = wring(i);
		atomic_store(&r->shm->enqueued, UINT64_MAX);
		atomic_store(&r->shm->dequeued, UINT64_MAX - 1);
		atomic_store(&r->shm->rejected, UINT64_MAX);
		atomic_store(&r->shm->full_waits, UINT64_MAX);
		atomic_store(&r->shm->full_wait_ns, UINT64_MAX);
		atomic_store(&r->shm->prod_pid, INT32_MAX);
		atomic_store(&r->shm->prod_blocked, 1);
	}
	kvr_ctl_ring_ent(wctl, R_CTL_OUT)->producer = INT16_MIN;
	kvr_ctl_ring_ent(wctl, R_CTL_OUT)->consumer = INT16_MAX;
	struct kvr_msg m;
	memset(&m, 0xff, sizeof(m));
	m.hdr.type = KVR_MSG_TYPE_MAX - 1;
	cr_assert_eq(kvr_ring_try_enqueue(wring(R_CTL_IN), &m), 0);

	struct kvr_insp_snap *prev, *cur;
	struct kvr_insp_clock t0 = {.mono_ns = 0, .real_ns = NOW_REAL};
	struct kvr_insp_clock t1 = {.mono_ns = UINT64_MAX, .real_ns = UINT64_MAX};
	cr_assert_eq(kvr_insp_snapshot(rctl, &t0, KVR_INSP_MAX_MSGS, &prev), 0);
	for (unsigned i = 0; i < N_RINGS; i++)
		atomic_store(&wring(i)->shm->enqueued, 0); /* prev sees UINT64_MAX, cur 0: no rate */
	atomic_store(&wring(R_LOOKUP_REQ)->shm->enqueued, UINT64_MAX); /* same: rate 0 */
	t1.mono_ns = 1; /* and a rate over 1 ns */
	cr_assert_eq(kvr_insp_snapshot(rctl, &t1, KVR_INSP_MAX_MSGS, &cur), 0);
	prev->now.mono_ns = 0;
	prev->rings[R_LOOKUP_REQ].enqueued = 0; /* UINT64_MAX messages in 1 ns */

	for (int with_prev = 0; with_prev < 2; with_prev++) {
		char *txt = render_snaps(cur, with_prev ? prev : NULL, 0);
		if (getenv("KVR_TEST_PRINT")) /* to look at the worst case */
			fputs(txt, stderr);
		unsigned lines = 0;
		for (char *line = txt; *line; lines++) {
			char *nl = strchr(line, '\n');
			cr_assert_not_null(nl, "every line ends in a newline");
			cr_assert_leq(nl - line, 80, "line %u is %d columns: %.*s", lines, (int)(nl - line),
				      (int)(nl - line), line);
			for (char *ch = line; ch < nl; ch++)
				cr_assert((unsigned char)*ch >= 0x20 && (unsigned char)*ch < 0x7f,
					  "line %u holds byte 0x%02x", lines, (unsigned char)*ch);
			line = nl + 1;
		}
		cr_assert_gt(lines, 40);
		cr_assert_not_null(strstr(txt, "AAA?AAAAAAAAAAAAAAAAAAAA ready    ?"), "%s", txt);
		cr_assert_not_null(strstr(txt, "producer client.32766"), "%s", txt);
		cr_assert_not_null(strstr(txt, "consumer actor.32767"), "%s", txt);
		cr_assert_not_null(strstr(txt, "unknown req=18446744073709551615"), "%s", txt);
		if (with_prev)
			cr_assert_not_null(strstr(txt, ">999G msg/s"), "%s", txt);
		free(txt);

		/* and the JSON of the same still parses, names escaped */
		char *js = render_snaps(cur, with_prev ? prev : NULL, 1);
		cJSON *root = cJSON_Parse(js);
		cr_assert_not_null(root, "%s", js);
		const cJSON *r0 = cJSON_GetArrayItem(obj(root, "rings"), 0);
		cr_assert_str_eq(str(r0, "name"), "rrrrr?rrrrrrrrrrrrrrrrrrrrrrrrrr");
		cr_assert_eq(num(r0, "fill"), 4);
		cJSON_Delete(root);
		free(js);
	}
	kvr_insp_snap_free(prev);
	kvr_insp_snap_free(cur);
}

/* kvring-inspect without --all: the actors and rings of free worker slots that never did
 * anything are summarised in one line each; everything with traffic or trouble stays. */
Test(inspect, hide_idle_slots)
{
	set_actor(3, "loader.1", KVR_ACTOR_LOADER, KVR_ACTOR_IDLE, 0, 0, -1, 0, 0);
	atomic_store(&wctl->n_actors, 4);
	atomic_store(&kvr_ctl_worker(wctl, 0)->state, KVR_WORKER_FREE); /* lookup.req.0 now idle */

	struct kvr_insp_clock now = {.mono_ns = NOW_MONO, .real_ns = NOW_REAL};
	struct kvr_insp_snap *s;
	cr_assert_eq(kvr_insp_snapshot(rctl, &now, 8, &s), 0);
	char *all = render_snaps(s, NULL, 0);
	cr_assert_not_null(strstr(all, "  loader.1 "));
	cr_assert_not_null(strstr(all, "  lookup.req.0  capacity 16"));
	cr_assert_null(strstr(all, "not shown"));

	s->hide_idle = true;
	char *t = render_snaps(s, NULL, 0);
	cr_assert_null(strstr(t, "  loader.1 "), "idle actor listed:\n%s", t);
	cr_assert_not_null(strstr(t, "  (1 idle actors of free worker slots not shown: --all)\n"));
	cr_assert_null(strstr(t, "lookup.req.0"), "idle ring listed:\n%s", t);
	cr_assert_not_null(strstr(t, "  (1 idle rings of free worker slots not shown: --all)\n"));
	/* a failed actor, a full ring and rings with traffic are never hidden */
	cr_assert_not_null(strstr(t, "  loader.0 "));
	cr_assert_not_null(strstr(t, "  loader.0.in  capacity 4"));
	cr_assert_not_null(strstr(t, "  ctl.lookup.in  capacity 8"));
	free(all);
	free(t);
	kvr_insp_snap_free(s);
}

/* ---- the engine table kvringd sends with its INSPECT reply ------------------------------ */

static struct kvr_inspect_engine engine_ent(uint32_t index, const char *id, const char *ns, uint32_t workers,
					    uint32_t scheds, uint32_t flags)
{
	struct kvr_inspect_engine e = {.index = index, .workers = workers, .schedulers = scheds, .flags = flags};
	/* as kvringd writes them: cut to fit, NUL-terminated and NUL-padded */
	memcpy(e.id, id, strnlen(id, sizeof(e.id) - 1));
	memcpy(e.model_ns, ns, strnlen(ns, sizeof(e.model_ns) - 1));
	return e;
}

static void assert_80_printable(const char *txt)
{
	unsigned lines = 0;
	for (const char *line = txt; *line; lines++) {
		const char *nl = strchr(line, '\n');
		cr_assert_not_null(nl);
		cr_assert_leq(nl - line, 80, "line %u is %d columns: %.*s", lines, (int)(nl - line), (int)(nl - line), line);
		for (const char *ch = line; ch < nl; ch++)
			cr_assert((unsigned char)*ch >= 0x20 && (unsigned char)*ch < 0x7f, "line %u holds 0x%02x", lines,
				  (unsigned char)*ch);
		line = nl + 1;
	}
}

/* The section between "engines" and the next blank line of txt (caller frees). */
static char *engines_section(const char *txt)
{
	const char *b = strstr(txt, "\nengines");
	cr_assert_not_null(b, "no engines section:\n%s", txt);
	b++;
	const char *e = strstr(b, "\n\n");
	cr_assert_not_null(e);
	return strndup(b, (size_t)(e - b) + 1);
}

/* One line per engine when it fits; a namespace that does not fit beside the rest gets a
 * line of its own, whole; the JSON has every engine, its id and namespace whole. */
Test(inspect, engines_text_and_json_exact)
{
	struct kvr_inspect_engine tab[2] = {
		engine_ent(0, "vllm-a", "Qwen/Qwen3-8B", 2, 1, KVR_INSPECT_ENGINE_NS_MODEL_ID),
		engine_ent(3, "tiny", "tiny-llama-bb89e7b1cad4526e@54d0f074fc7c3d500fc7", 1, 0, 0),
	};
	struct kvr_insp_snap *s;
	cr_assert_eq(kvr_insp_snapshot(rctl, &now, 8, &s), 0);
	cr_assert_eq(kvr_insp_snapshot_engines(s, rctl, tab, sizeof(tab)), 0);
	char *txt = render_snaps(s, NULL, 0);
	char *sec = engines_section(txt);
	cr_assert_str_eq(sec, "engines\n"
			      "  engine 0  \"vllm-a\"  namespace \"Qwen/Qwen3-8B\"  workers 2  schedulers 1\n"
			      "  engine 3  \"tiny\"  workers 1  schedulers 0\n"
			      "    namespace \"tiny-llama-bb89e7b1cad4526e@54d0f074fc7c3d500fc7\"\n");
	/* between the actors and the clients that name them */
	cr_assert_not_null(strstr(txt, "schedulers 0\n    namespace \"tiny-llama-bb89e7b1cad4526e@54d0f074fc7c3d500fc7\"\n"
				       "\nworkers\n  client.0   pid 6001     attached   tp 0/2  dcp 0/1  16-token blocks  engine 0\n"),
			   "%s", txt);
	assert_80_printable(txt);
	free(sec);
	free(txt);

	char *js = render_snaps(s, NULL, 1);
	cJSON *root = cJSON_Parse(js);
	cr_assert_not_null(root, "%s", js);
	const cJSON *en = obj(root, "engines");
	cr_assert(cJSON_IsArray(en));
	cr_assert_eq(cJSON_GetArraySize(en), 2);
	const cJSON *e0 = cJSON_GetArrayItem(en, 0), *e1 = cJSON_GetArrayItem(en, 1);
	cr_assert_eq(num(e0, "index"), 0);
	cr_assert_str_eq(str(e0, "id"), "vllm-a");
	cr_assert_str_eq(str(e0, "model_ns"), "Qwen/Qwen3-8B");
	cr_assert_eq(num(e0, "workers"), 2);
	cr_assert_eq(num(e0, "schedulers"), 1);
	cr_assert_eq(num(e1, "index"), 3);
	cr_assert_str_eq(str(e1, "id"), "tiny");
	cr_assert_str_eq(str(e1, "model_ns"), "tiny-llama-bb89e7b1cad4526e@54d0f074fc7c3d500fc7");
	cr_assert_eq(num(e1, "workers"), 1);
	cr_assert_eq(num(e1, "schedulers"), 0);
	cr_assert_eq(cJSON_GetArraySize(e0), 5, "index, id, model_ns, workers, schedulers");
	cJSON_Delete(root);
	free(js);
	kvr_insp_snap_free(s);
}

/* No table: no section, JSON null; an empty one: "none attached", []; a table that is not
 * a whole number of entries: "unknown", null. */
Test(inspect, engines_absent_empty_malformed)
{
	struct kvr_insp_snap *s;
	cr_assert_eq(kvr_insp_snapshot(rctl, &now, 8, &s), 0);
	char *txt = render_snaps(s, NULL, 0), *js = render_snaps(s, NULL, 1);
	cr_assert_null(strstr(txt, "engines"), "%s", txt);
	cr_assert_not_null(strstr(js, "\"engines\":null"), "%s", js);
	free(txt);
	free(js);

	cr_assert_eq(kvr_insp_snapshot_engines(s, rctl, NULL, 0), 0);
	txt = render_snaps(s, NULL, 0);
	js = render_snaps(s, NULL, 1);
	cr_assert_not_null(strstr(txt, "\n\nengines: none attached\n\nworkers\n"), "%s", txt);
	cr_assert_not_null(strstr(js, "\"engines\":[]"), "%s", js);
	free(txt);
	free(js);

	struct kvr_inspect_engine tab[2] = {engine_ent(0, "a", "b", 1, 0, 0), engine_ent(1, "c", "d", 1, 0, 0)};
	cr_assert_eq(kvr_insp_snapshot_engines(s, rctl, tab, sizeof(tab) - 1), -EBADMSG);
	txt = render_snaps(s, NULL, 0);
	js = render_snaps(s, NULL, 1);
	cr_assert_not_null(strstr(txt, "\nengines: unknown (kvringd's table: Bad message)\n"), "%s", txt);
	cr_assert_null(strstr(txt, "engine 0  "), "%s", txt);
	cr_assert_not_null(strstr(js, "\"engines\":null"), "%s", js);
	free(txt);
	free(js);
	cr_assert_eq(kvr_insp_snapshot_engines(s, rctl, tab, (KVR_CTL_MAX_ENGINES + 1) * sizeof(tab[0])), -EBADMSG);
	cr_assert_eq(kvr_insp_snapshot_engines(s, rctl, NULL, sizeof(tab[0])), -EINVAL);
	kvr_insp_snap_free(s);
}

/* Whatever kvringd's table holds: lines fit 80 columns and are printable (an id too long
 * for its line loses its middle, a namespace longer than its own line too), the JSON keeps
 * both whole (non-printable bytes as '?'); a model.model_id too long for the entry is
 * taken whole from the segment's config. */
Test(inspect, engines_fit_80_columns_whatever_the_table_holds)
{
	char long_id[48], long_ns[64], model_id[121];
	memset(long_id, 'i', sizeof(long_id)); /* no NUL */
	long_id[0] = 'A';
	long_id[sizeof(long_id) - 1] = 'Z';
	memset(long_ns, 'n', sizeof(long_ns));
	long_ns[1] = '\033';
	long_ns[sizeof(long_ns) - 1] = 'E';
	for (unsigned i = 0; i < sizeof(model_id) - 1; i++)
		model_id[i] = (char)('a' + i % 26);
	model_id[sizeof(model_id) - 1] = '\0';

	/* a segment whose effective config names that model_id */
	char cfg[256], name[64];
	snprintf(cfg, sizeof(cfg), "{\"model\": {\"model_id\": \"%s\"}}", model_id);
	snprintf(name, sizeof(name), "kvr-test-inspect-eng-%d", getpid());
	size_t sz = kvr_ctl_memsize(4, 2, specs, N_RINGS, 512);
	struct kvr_segment s2;
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_CTL, sz, 3, 0, &s2), 0);
	cr_assert_eq(kvr_ctl_init(&s2, 4, 2, specs, N_RINGS, cfg), 0);
	struct kvr_ctl *c2;
	cr_assert_eq(kvr_ctl_attach(&s2, &c2, NULL), 0);

	struct kvr_inspect_engine tab[3];
	memset(tab, 0, sizeof(tab));
	tab[0] = (struct kvr_inspect_engine){.index = UINT32_MAX, .workers = UINT32_MAX, .schedulers = UINT32_MAX};
	memcpy(tab[0].id, long_id, sizeof(long_id));
	memcpy(tab[0].model_ns, long_ns, sizeof(long_ns));
	tab[1] = engine_ent(1, "default", model_id, 1, 0, KVR_INSPECT_ENGINE_NS_MODEL_ID); /* cut at 63 */
	tab[2] = engine_ent(2, "other", model_id, 1, 0, 0); /* same bytes, not the model_id: stays cut */

	struct kvr_insp_snap *s;
	cr_assert_eq(kvr_insp_snapshot(c2, &now, 8, &s), 0);
	cr_assert_eq(kvr_insp_snapshot_engines(s, c2, tab, sizeof(tab)), 0);
	char *txt = render_snaps(s, NULL, 0);
	if (getenv("KVR_TEST_PRINT"))
		fputs(txt, stderr);
	assert_80_printable(txt);
	char *sec = engines_section(txt);
	cr_assert_str_eq(sec, "engines\n"
			      "  engine 4294967295  \"Aiiiii...iiiiZ\"  workers 4294967295  schedulers 4294967295\n"
			      "    namespace \"n?nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnE\"\n"
			      "  engine 1  \"default\"  workers 1  schedulers 0\n"
			      "    namespace \"abcdefghijklmnopqrstuvwxyzabcde...mnopqrstuvwxyzabcdefghijklmnop\"\n"
			      "  engine 2  \"other\"  workers 1  schedulers 0\n"
			      "    namespace \"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk\"\n",
			   "%s", sec);
	free(sec);
	free(txt);

	char *js = render_snaps(s, NULL, 1);
	cJSON *root = cJSON_Parse(js);
	cr_assert_not_null(root, "%s", js);
	const cJSON *en = obj(root, "engines");
	cr_assert_eq(cJSON_GetArraySize(en), 3);
	char want_id[49], want_ns[65];
	memcpy(want_id, long_id, 48);
	want_id[48] = '\0';
	memcpy(want_ns, long_ns, 64);
	want_ns[1] = '?';
	want_ns[64] = '\0';
	cr_assert_str_eq(str(cJSON_GetArrayItem(en, 0), "id"), want_id);
	cr_assert_str_eq(str(cJSON_GetArrayItem(en, 0), "model_ns"), want_ns);
	cr_assert_eq(num(cJSON_GetArrayItem(en, 0), "index"), (double)UINT32_MAX);
	cr_assert_str_eq(str(cJSON_GetArrayItem(en, 1), "model_ns"), model_id);
	cr_assert_eq(strlen(str(cJSON_GetArrayItem(en, 2), "model_ns")), 63);
	cJSON_Delete(root);
	free(js);
	kvr_insp_snap_free(s);
	kvr_segment_close(&s2);
}
