/* kvring-ringbench: 64-byte message latency and throughput between two processes: kvr ring, pipe, iceoryx. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "json_writer.h"
#include "kvr_time.h"
#include "ringbench.h"

#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define READY_TIMEOUT_MS 30000
#define STAMP 0x9e3779b97f4a7c15ull

enum phase { PH_PINGPONG, PH_STREAM };

struct params {
	uint64_t messages;   /* stream */
	uint64_t roundtrips; /* ping-pong, measured */
	uint64_t warmup;     /* ping-pong, not measured */
	uint32_t capacity;
	unsigned timeout_s;  /* per phase */
	bool json;
	bool want[3];        /* kvr, pipe, iceoryx */
};

/* What one child reports; lives in a MAP_SHARED page both children and the parent see. */
struct side {
	int status;
	char why[200];
	uint64_t t_start, t_end; /* CLOCK_MONOTONIC */
	uint64_t count;          /* messages sent (A) or received and verified (B) */
	uint64_t cpu_ns;         /* user + system time over the phase */
	uint64_t rtt_min, rtt_p50, rtt_p99, rtt_p999, rtt_max, rtt_sum;
};

struct shared {
	struct side side[2];
};

struct row {
	const struct rb_transport *t;
	int state; /* 0 not asked, 1 ok, -1 skipped (setup failed), -2 failed */
	char why[320];
	struct side pp[2], st[2];
	double msgs_per_s, stream_s, stream_cpu_pct;
};

/* ---- message stamps ------------------------------------------------------------------- */

static void stamp(struct kvr_msg *m, uint64_t i)
{
	m->hdr.req_id = i;
	m->hdr.seq = (uint32_t)i;
	uint64_t a = i * STAMP, b = ~i;
	memcpy(m->body, &a, sizeof(a));
	memcpy(m->body + KVR_MSG_BODY - sizeof(b), &b, sizeof(b));
}

static bool stamp_ok(const struct kvr_msg *m, uint64_t i)
{
	uint64_t a, b;
	memcpy(&a, m->body, sizeof(a));
	memcpy(&b, m->body + KVR_MSG_BODY - sizeof(b), sizeof(b));
	return m->hdr.type == KVR_MSG_PING && m->hdr.req_id == i && m->hdr.seq == (uint32_t)i && a == i * STAMP &&
	       b == ~i;
}

static void msg_template(struct kvr_msg *m)
{
	kvr_msg_build(m, KVR_MSG_PING, 0, 0, 0, NULL, 0);
	m->hdr.body_len = KVR_MSG_BODY;
}

/* ---- the four loops --------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array. */
static uint64_t pct(const uint64_t *v, uint64_t n, unsigned per_mille)
{
	uint64_t rank = (n * per_mille + 999) / 1000;
	return v[rank ? rank - 1 : 0];
}

static int pinger(const struct rb_transport *t, struct rb_chan *c, const struct params *p, struct side *s)
{
	uint64_t *rtt = malloc(sizeof(uint64_t) * (p->roundtrips ? p->roundtrips : 1));
	if (!rtt) {
		snprintf(s->why, sizeof(s->why), "out of memory");
		return -ENOMEM;
	}
	struct kvr_msg m, r;
	msg_template(&m);
	int rc = 0;
	uint64_t total = p->warmup + p->roundtrips;
	s->t_start = kvr_now_ns();
	for (uint64_t i = 0; i < total; i++) {
		stamp(&m, i);
		uint64_t t0 = kvr_now_ns();
		if ((rc = t->send(c, &m)) || (rc = t->recv(c, &r))) {
			snprintf(s->why, sizeof(s->why), "round trip %llu: %s", (unsigned long long)i, strerror(-rc));
			goto out;
		}
		uint64_t t1 = kvr_now_ns();
		if (!stamp_ok(&r, i)) {
			snprintf(s->why, sizeof(s->why), "round trip %llu: reply carries req %llu", (unsigned long long)i,
				 (unsigned long long)r.hdr.req_id);
			rc = -EBADMSG;
			goto out;
		}
		if (i >= p->warmup)
			rtt[i - p->warmup] = t1 - t0;
		s->count++;
	}
	s->t_end = kvr_now_ns();
	if (p->roundtrips) {
		qsort(rtt, p->roundtrips, sizeof(*rtt), cmp_u64);
		s->rtt_min = rtt[0];
		s->rtt_max = rtt[p->roundtrips - 1];
		s->rtt_p50 = pct(rtt, p->roundtrips, 500);
		s->rtt_p99 = pct(rtt, p->roundtrips, 990);
		s->rtt_p999 = pct(rtt, p->roundtrips, 999);
		for (uint64_t i = 0; i < p->roundtrips; i++)
			s->rtt_sum += rtt[i];
	}
out:
	free(rtt);
	return rc;
}

static int ponger(const struct rb_transport *t, struct rb_chan *c, const struct params *p, struct side *s)
{
	struct kvr_msg m;
	uint64_t total = p->warmup + p->roundtrips;
	for (uint64_t i = 0; i < total; i++) {
		int rc = t->recv(c, &m);
		if (rc) {
			snprintf(s->why, sizeof(s->why), "ping %llu: %s", (unsigned long long)i, strerror(-rc));
			return rc;
		}
		if (!stamp_ok(&m, i)) {
			snprintf(s->why, sizeof(s->why), "ping %llu carries req %llu", (unsigned long long)i,
				 (unsigned long long)m.hdr.req_id);
			return -EBADMSG;
		}
		if ((rc = t->send(c, &m))) {
			snprintf(s->why, sizeof(s->why), "pong %llu: %s", (unsigned long long)i, strerror(-rc));
			return rc;
		}
		s->count++;
	}
	return 0;
}

static int producer(const struct rb_transport *t, struct rb_chan *c, const struct params *p, struct side *s)
{
	struct kvr_msg m;
	msg_template(&m);
	s->t_start = kvr_now_ns();
	for (uint64_t i = 0; i < p->messages; i++) {
		stamp(&m, i);
		int rc = t->send(c, &m);
		if (rc) {
			snprintf(s->why, sizeof(s->why), "message %llu: %s", (unsigned long long)i, strerror(-rc));
			return rc;
		}
		s->count++;
	}
	s->t_end = kvr_now_ns();
	return 0;
}

static int consumer(const struct rb_transport *t, struct rb_chan *c, const struct params *p, struct side *s)
{
	struct kvr_msg m;
	s->t_start = kvr_now_ns();
	for (uint64_t i = 0; i < p->messages; i++) {
		int rc = t->recv(c, &m);
		if (rc) {
			snprintf(s->why, sizeof(s->why), "message %llu: %s", (unsigned long long)i, strerror(-rc));
			return rc;
		}
		if (!stamp_ok(&m, i)) {
			snprintf(s->why, sizeof(s->why), "message %llu out of sequence: got req %llu",
				 (unsigned long long)i, (unsigned long long)m.hdr.req_id);
			return -EBADMSG;
		}
		s->count++;
	}
	s->t_end = kvr_now_ns();
	return 0;
}

/* ---- processes -------------------------------------------------------------------------- */

static uint64_t cpu_ns(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000ull +
	       (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ull;
}

static void full_write(int fd, char ch)
{
	while (write(fd, &ch, 1) < 0 && errno == EINTR)
		;
}

static __attribute__((noreturn)) void child(const struct rb_transport *t, struct rb_env *env, enum phase ph,
					    enum rb_role role, const struct params *p, struct side *s, int ready_w,
					    int go_r)
{
	dup2(2, 1); /* stdout is the report (maybe JSON): libraries' chatter goes to stderr */
	struct rb_chan *c = NULL;
	int rc = t->open(env, role, &c, s->why, sizeof(s->why));
	if (rc) {
		s->status = rc;
		full_write(ready_w, 'E');
		exit(1); /* see below */
	}
	full_write(ready_w, 'R');
	char go;
	while (read(go_r, &go, 1) < 0 && errno == EINTR)
		;
	uint64_t cpu0 = cpu_ns();
	if (ph == PH_PINGPONG)
		rc = role == RB_A ? pinger(t, c, p, s) : ponger(t, c, p, s);
	else
		rc = role == RB_A ? producer(t, c, p, s) : consumer(t, c, p, s);
	s->cpu_ns = cpu_ns() - cpu0;
	t->close(c);
	s->status = rc;
	/* exit(), not _exit(): iceoryx's runtime removes its socket and lock files in a static
	 * destructor. stdio was flushed before fork(), so nothing of the parent's is written twice. */
	exit(rc ? 1 : 0);
}

static void reap(pid_t *pids, int *status)
{
	for (int i = 0; i < 2; i++)
		if (pids[i] > 0) {
			kill(pids[i], SIGKILL);
			waitpid(pids[i], &status[i], 0);
			pids[i] = 0;
		}
}

static const char *death(int st, char *buf, size_t len)
{
	if (WIFSIGNALED(st))
		snprintf(buf, len, "killed by signal %d", WTERMSIG(st));
	else
		snprintf(buf, len, "exit status %d", WEXITSTATUS(st));
	return buf;
}

/* Run one phase in two fresh processes. 0, or -1 with the reason in why. */
static int run_phase(const struct rb_transport *t, struct rb_env *env, enum phase ph, const struct params *p,
		     struct shared *sh, char *why, size_t len)
{
	memset(sh, 0, sizeof(*sh));
	int ready[2], go[2];
	if (pipe(ready) < 0)
		return snprintf(why, len, "pipe: %s", strerror(errno)), -1;
	if (pipe(go) < 0) {
		close(ready[0]);
		close(ready[1]);
		return snprintf(why, len, "pipe: %s", strerror(errno)), -1;
	}
	fflush(NULL);
	pid_t pids[2] = {0, 0};
	int status[2] = {0, 0};
	int ret = -1;
	for (int r = 1; r >= 0; r--) { /* B (the receiver) first */
		pids[r] = fork();
		if (pids[r] < 0) {
			pids[r] = 0;
			snprintf(why, len, "fork: %s", strerror(errno));
			goto out;
		}
		if (pids[r] == 0) {
			close(ready[0]);
			close(go[1]);
			child(t, env, ph, (enum rb_role)r, p, &sh->side[r], ready[1], go[0]);
		}
	}
	close(ready[1]);
	ready[1] = -1;
	close(go[0]);
	go[0] = -1;

	for (int n = 0; n < 2;) {
		struct pollfd pfd = {.fd = ready[0], .events = POLLIN};
		int prc = poll(&pfd, 1, READY_TIMEOUT_MS);
		char b;
		if (prc <= 0 || read(ready[0], &b, 1) != 1) {
			snprintf(why, len, "the two processes did not get ready within %d s", READY_TIMEOUT_MS / 1000);
			goto out;
		}
		if (b == 'E') {
			for (int r = 0; r < 2; r++)
				if (sh->side[r].status)
					snprintf(why, len, "%s", sh->side[r].why);
			goto out;
		}
		n++;
	}
	full_write(go[1], 'G');
	full_write(go[1], 'G');

	uint64_t deadline = kvr_now_ns() + (uint64_t)p->timeout_s * 1000000000ull;
	int left = 2;
	while (left) {
		bool reaped = false;
		/* by pid: the bench has another child (RouDi) this must not reap */
		for (int r = 0; r < 2; r++) {
			int st;
			if (pids[r] <= 0 || waitpid(pids[r], &st, WNOHANG) != pids[r])
				continue;
			pids[r] = 0;
			status[r] = st;
			left--;
			reaped = true;
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
				char d[64];
				snprintf(why, len, "%s side: %s", r == RB_A ? "sending" : "receiving",
					 sh->side[r].why[0] ? sh->side[r].why : death(st, d, sizeof(d)));
				goto out;
			}
		}
		if (reaped)
			continue;
		if (kvr_now_ns() > deadline) {
			snprintf(why, len, "phase did not finish within %u s", p->timeout_s);
			goto out;
		}
		struct timespec ts = {.tv_nsec = 5000000};
		nanosleep(&ts, NULL);
	}
	ret = 0;
out:
	reap(pids, status);
	for (int i = 0; i < 2; i++) {
		if (ready[i] >= 0)
			close(ready[i]);
		if (go[i] >= 0)
			close(go[i]);
	}
	return ret;
}

static void run_transport(struct row *row, const struct params *p, struct shared *sh)
{
	struct rb_env env = {.ring_capacity = p->capacity, .pipe_a2b = {-1, -1}, .pipe_b2a = {-1, -1}};
	char why[256];
	if (row->t->setup(&env, why, sizeof(why))) {
		row->state = -1;
		snprintf(row->why, sizeof(row->why), "%s", why);
		return;
	}
	row->state = -2;
	if (run_phase(row->t, &env, PH_PINGPONG, p, sh, why, sizeof(why))) {
		snprintf(row->why, sizeof(row->why), "latency: %s", why);
		goto out;
	}
	memcpy(row->pp, sh->side, sizeof(row->pp));
	if (run_phase(row->t, &env, PH_STREAM, p, sh, why, sizeof(why))) {
		snprintf(row->why, sizeof(row->why), "throughput: %s", why);
		goto out;
	}
	memcpy(row->st, sh->side, sizeof(row->st));
	if (row->st[RB_B].count != p->messages || row->pp[RB_A].count != p->warmup + p->roundtrips) {
		snprintf(row->why, sizeof(row->why), "verified %llu of %llu messages", (unsigned long long)row->st[RB_B].count,
			 (unsigned long long)p->messages);
		goto out;
	}
	/* from the producer's first send to the consumer's last receive */
	uint64_t ns = row->st[RB_B].t_end - row->st[RB_A].t_start;
	row->stream_s = (double)ns / 1e9;
	row->msgs_per_s = ns ? (double)p->messages * 1e9 / (double)ns : 0.0;
	row->stream_cpu_pct = ns ? (double)(row->st[0].cpu_ns + row->st[1].cpu_ns) * 100.0 / (double)ns : 0.0;
	row->state = 1;
out:
	row->t->teardown(&env);
}

/* ---- report ----------------------------------------------------------------------------- */

struct machine {
	long cpus_online;
	int cpus_allowed;
	char cpu_model[128];
	char kernel[200];
};

static void machine_info(struct machine *m)
{
	memset(m, 0, sizeof(*m));
	m->cpus_online = sysconf(_SC_NPROCESSORS_ONLN);
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		m->cpus_allowed = CPU_COUNT(&set);
	snprintf(m->cpu_model, sizeof(m->cpu_model), "unknown CPU");
	FILE *f = fopen("/proc/cpuinfo", "r");
	if (f) {
		char line[256];
		while (fgets(line, sizeof(line), f)) {
			char *colon = strchr(line, ':');
			if (strncmp(line, "model name", 10) == 0 && colon) {
				colon += 1 + (colon[1] == ' ');
				colon[strcspn(colon, "\n")] = '\0';
				snprintf(m->cpu_model, sizeof(m->cpu_model), "%s", colon);
				break;
			}
		}
		fclose(f);
	}
	struct utsname u;
	if (uname(&u) == 0)
		snprintf(m->kernel, sizeof(m->kernel), "%s %s %s", u.sysname, u.release, u.machine);
}

static double us(uint64_t ns)
{
	return (double)ns / 1000.0;
}

static const struct row *find_row(const struct row *rows, const char *name)
{
	for (int i = 0; i < 3; i++)
		if (strcmp(rows[i].t->name, name) == 0)
			return &rows[i];
	return NULL;
}

static const char *row_state(const struct row *r)
{
	return r->state == 1 ? "ok" : r->state == -1 ? "skipped" : r->state == -2 ? "failed" : "not run";
}

static void print_ratio(const struct row *kvr, const struct row *peer)
{
	printf("kvr/%-8s", peer->t->name);
	if (kvr->state != 1 || peer->state != 1) {
		const struct row *r = kvr->state != 1 ? kvr : peer;
		printf(" n/a (%s: %s)\n", r->t->name, row_state(r));
		return;
	}
	double lat = (double)kvr->pp[RB_A].rtt_p50 / (double)peer->pp[RB_A].rtt_p50;
	double tput = kvr->msgs_per_s / peer->msgs_per_s;
	printf(" p50 latency %.3f (kvr %.1fx lower)   throughput %.2f (kvr %.1fx higher)\n", lat, 1.0 / lat, tput,
	       tput);
}

static void print_text(const struct row *rows, const struct params *p, const struct machine *m)
{
	printf("kvring-ringbench: 64-byte messages between two processes (fork), three transports\n");
	printf("machine: %ld CPUs online (%d usable), %s, %s\n", m->cpus_online, m->cpus_allowed, m->cpu_model,
	       m->kernel);
	printf("latency: %llu ping-pong round trips after %llu warm-up; one-way = RTT/2\n",
	       (unsigned long long)p->roundtrips, (unsigned long long)p->warmup);
	printf("throughput: %llu messages streamed, every sequence number checked by the consumer\n",
	       (unsigned long long)p->messages);
	printf("kvr ring capacity %u (spin then futex); pipe buffer 64 KiB; iceoryx queue 256\n\n", p->capacity);
	printf("%-14s %12s %12s %9s %9s %12s %6s\n", "transport", "one-way p50", "one-way p99", "RTT p50", "RTT p99",
	       "msgs/s", "CPU%");
	for (int i = 0; i < 3; i++) {
		const struct row *r = &rows[i];
		if (r->state == 0)
			continue;
		if (r->state != 1) {
			if (r->state == -1) /* "iceoryx: not built (...)", "iceoryx: iox-roudi not found ..." */
				printf("%s: %s (row skipped)\n", r->t->name, r->why);
			else
				printf("%s: FAILED: %s\n", r->t->name, r->why);
			continue;
		}
		const struct side *a = &r->pp[RB_A];
		printf("%-14s %9.2f us %9.2f us %6.2f us %6.2f us %10.2f M %5.0f%%\n", r->t->label, us(a->rtt_p50) / 2,
		       us(a->rtt_p99) / 2, us(a->rtt_p50), us(a->rtt_p99), r->msgs_per_s / 1e6, r->stream_cpu_pct);
	}
	printf("\n");
	const struct row *kvr = find_row(rows, "kvr");
	if (kvr->state) {
		print_ratio(kvr, find_row(rows, "pipe"));
		print_ratio(kvr, find_row(rows, "iceoryx"));
	}
	printf("(CPU%%: both processes during the stream, of one CPU: 200%% = two CPUs busy)\n");
}

static void print_json(const struct row *rows, const struct params *p, const struct machine *m)
{
	struct kvr_jw w;
	kvr_jw_init(&w, stdout, KVR_JW_TABS);
	kvr_jw_object(&w, NULL);
	kvr_jw_object(&w, "machine");
	kvr_jw_u64(&w, "cpus_online", (uint64_t)m->cpus_online);
	kvr_jw_i64(&w, "cpus_usable", m->cpus_allowed);
	kvr_jw_str(&w, "cpu_model", m->cpu_model);
	kvr_jw_str(&w, "kernel", m->kernel);
	kvr_jw_end(&w);
	kvr_jw_object(&w, "params");
	kvr_jw_u64(&w, "message_bytes", KVR_MSG_SIZE);
	kvr_jw_u64(&w, "messages", p->messages);
	kvr_jw_u64(&w, "roundtrips", p->roundtrips);
	kvr_jw_u64(&w, "warmup_roundtrips", p->warmup);
	kvr_jw_u64(&w, "kvr_ring_capacity", p->capacity);
	kvr_jw_end(&w);
	kvr_jw_array(&w, "transports");
	for (int i = 0; i < 3; i++) {
		const struct row *r = &rows[i];
		if (r->state == 0)
			continue;
		kvr_jw_object(&w, NULL);
		kvr_jw_str(&w, "name", r->t->name);
		kvr_jw_str(&w, "label", r->t->label);
		kvr_jw_str(&w, "result", row_state(r));
		if (r->state != 1) {
			kvr_jw_str(&w, "reason", r->why);
			kvr_jw_end(&w);
			continue;
		}
		const struct side *a = &r->pp[RB_A];
		kvr_jw_object(&w, "latency");
		kvr_jw_u64(&w, "roundtrips", a->count - p->warmup);
		kvr_jw_double(&w, "one_way_p50_ns", (double)a->rtt_p50 / 2);
		kvr_jw_double(&w, "one_way_p99_ns", (double)a->rtt_p99 / 2);
		kvr_jw_u64(&w, "rtt_min_ns", a->rtt_min);
		kvr_jw_u64(&w, "rtt_p50_ns", a->rtt_p50);
		kvr_jw_u64(&w, "rtt_p99_ns", a->rtt_p99);
		kvr_jw_u64(&w, "rtt_p999_ns", a->rtt_p999);
		kvr_jw_u64(&w, "rtt_max_ns", a->rtt_max);
		kvr_jw_double(&w, "rtt_mean_ns", p->roundtrips ? (double)a->rtt_sum / (double)p->roundtrips : 0);
		kvr_jw_end(&w);
		kvr_jw_object(&w, "throughput");
		kvr_jw_u64(&w, "messages_sent", r->st[RB_A].count);
		kvr_jw_u64(&w, "messages_verified", r->st[RB_B].count);
		kvr_jw_double(&w, "seconds", r->stream_s);
		kvr_jw_double(&w, "msgs_per_s", r->msgs_per_s);
		kvr_jw_double(&w, "producer_cpu_s", (double)r->st[RB_A].cpu_ns / 1e9);
		kvr_jw_double(&w, "consumer_cpu_s", (double)r->st[RB_B].cpu_ns / 1e9);
		kvr_jw_double(&w, "cpu_percent", r->stream_cpu_pct);
		kvr_jw_end(&w);
		kvr_jw_end(&w);
	}
	kvr_jw_end(&w);
	kvr_jw_object(&w, "ratios");
	const struct row *kvr = find_row(rows, "kvr");
	const char *peers[] = {"pipe", "iceoryx"};
	for (int i = 0; i < 2; i++) {
		const struct row *peer = find_row(rows, peers[i]);
		/* keys are written as given: both are literals */
		const char *key = i == 0 ? "kvr/pipe" : "kvr/iceoryx";
		if (kvr->state != 1 || peer->state != 1) {
			kvr_jw_null(&w, key);
			continue;
		}
		kvr_jw_object(&w, key);
		kvr_jw_double(&w, "p50_latency", (double)kvr->pp[RB_A].rtt_p50 / (double)peer->pp[RB_A].rtt_p50);
		kvr_jw_double(&w, "throughput", kvr->msgs_per_s / peer->msgs_per_s);
		kvr_jw_end(&w);
	}
	kvr_jw_end(&w);
	kvr_jw_end(&w);
	if (kvr_jw_finish(&w) == 0)
		putchar('\n');
}

/* ---- main ------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvring-ringbench [--messages M] [--roundtrips N] [--json] [--transports LIST]\n"
		"                        [--capacity C] [--timeout S]\n"
		"  --messages M       messages streamed per transport (default 5000000)\n"
		"  --roundtrips N     ping-pong round trips measured (default 100000)\n"
		"  --json             machine-readable report\n"
		"  --transports LIST  comma-separated subset of kvr,pipe,iceoryx (default all)\n"
		"  --capacity C       kvr ring capacity in messages, power of two (default 1024)\n"
		"  --timeout S        give up on a phase after S seconds (default 300)\n"
		"exit status: 0 every transport that ran verified every message (iceoryx may be skipped),\n"
		"             1 a transport failed, 2 bad arguments\n");
}

static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < min || v > max)
		return -EINVAL;
	*ret = v;
	return 0;
}

static int parse_transports(const char *list, bool want[3])
{
	static const char *const names[3] = {"kvr", "pipe", "iceoryx"};
	char *dup = strdup(list), *save = NULL;
	if (!dup)
		return -ENOMEM;
	want[0] = want[1] = want[2] = false;
	int rc = 0, any = 0;
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int k = -1;
		for (int i = 0; i < 3; i++)
			if (strcmp(tok, names[i]) == 0)
				k = i;
		if (k < 0) {
			rc = -EINVAL;
			break;
		}
		want[k] = true;
		any = 1;
	}
	free(dup);
	return rc ? rc : any ? 0 : -EINVAL;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"messages", required_argument, NULL, 'm'}, {"roundtrips", required_argument, NULL, 'r'},
		{"json", no_argument, NULL, 'j'},	    {"transports", required_argument, NULL, 't'},
		{"capacity", required_argument, NULL, 'c'}, {"timeout", required_argument, NULL, 'T'},
		{"help", no_argument, NULL, 'h'},	    {0},
	};
	struct params p = {.messages = 5000000, .roundtrips = 100000, .capacity = 1024, .timeout_s = 300,
			   .want = {true, true, true}};
	uint64_t v;
	opterr = 0;
	for (;;) {
		int o = getopt_long(argc, argv, "+m:r:jt:c:T:h", opts, NULL);
		if (o < 0)
			break;
		switch (o) {
		case 'm':
			if (parse_u64(optarg, 1, 1ull << 40, &p.messages))
				goto bad;
			break;
		case 'r':
			if (parse_u64(optarg, 1, 100000000, &p.roundtrips))
				goto bad;
			break;
		case 'j':
			p.json = true;
			break;
		case 't':
			if (parse_transports(optarg, p.want))
				goto bad;
			break;
		case 'c':
			if (parse_u64(optarg, 2, 1u << 30, &v) || (v & (v - 1)))
				goto bad;
			p.capacity = (uint32_t)v;
			break;
		case 'T':
			if (parse_u64(optarg, 1, 86400, &v))
				goto bad;
			p.timeout_s = (unsigned)v;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			goto bad;
		}
	}
	if (optind < argc) {
		optind++; /* name the stray argument below */
		goto bad;
	}
	p.warmup = p.roundtrips / 10 < 10000 ? p.roundtrips / 10 : 10000;

	struct shared *sh = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		fprintf(stderr, "kvring-ringbench: mmap: %s\n", strerror(errno));
		return EXIT_FAIL;
	}
	struct row rows[3] = {{.t = &rb_kvr_transport}, {.t = &rb_pipe_transport}, {.t = &rb_iox_transport}};
	int status = 0;
	for (int i = 0; i < 3; i++) {
		if (!p.want[i])
			continue;
		if (!p.json)
			fprintf(stderr, "kvring-ringbench: running %s ...\n", rows[i].t->label);
		run_transport(&rows[i], &p, sh);
		if (rows[i].state == -2 || (rows[i].state == -1 && i != 2))
			status = EXIT_FAIL;
	}
	munmap(sh, sizeof(*sh));

	struct machine m;
	machine_info(&m);
	if (p.json)
		print_json(rows, &p, &m);
	else
		print_text(rows, &p, &m);
	return status;

bad:
	fprintf(stderr, "kvring-ringbench: bad argument: %s\n", optind >= 1 && optind <= argc ? argv[optind - 1] : "?");
	usage(stderr);
	return EXIT_USAGE;
}
