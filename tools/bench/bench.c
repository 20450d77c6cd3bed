/* kvring-bench: emulated TP/DCP workers store, look up, load, verify via kvringd (--remote: two instances, one Redis Cluster). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "fmt.h"
#include "kvr_time.h"

#define STOP_TIMEOUT_MS 60000
#define POLL_NS 1000000L          /* --remote: the parent reads A's counters every 1 ms */
#define REMOTE_READY_NS (10ull * 1000000000ull) /* a remote actor's full slot map (or --timeout-ms) */
#define PREFAULT_NS (60ull * 1000000000ull) /* --remote: the arenas' background fault-in */
#define RC_SLOTS 16384u           /* Redis Cluster's hash slots */
#define HDR 128                   /* the mapping's first bytes: the ranks' barrier, the gate */

/* Everything the ranks share with the parent, in one MAP_SHARED anonymous mapping. */
struct shared {
	void *base;
	size_t size;
	struct bench_rank_result *res;   /* tp of them */
	uint64_t *samples;               /* tp x BENCH_SAMPLE_ARRAYS x prompts */
};

static int shared_map(const struct bench_opts *o, struct shared *ret)
{
	size_t res_bytes = (size_t)o->tp * sizeof(struct bench_rank_result);
	size_t size = HDR + res_bytes + (size_t)o->tp * BENCH_SAMPLE_ARRAYS * o->prompts * sizeof(uint64_t);
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	*ret = (struct shared){.base = p, .size = size};
	ret->res = (struct bench_rank_result *)((uint8_t *)p + HDR);
	ret->samples = (uint64_t *)((uint8_t *)p + HDR + res_bytes);
	return 0;
}

_Static_assert(sizeof(struct bench_barrier) <= HDR / 2, "two barriers fit the mapping's header");

static struct bench_barrier *shared_barrier(struct shared *sh)
{
	return (struct bench_barrier *)sh->base; /* the first 64 bytes */
}

/* The parent's gate after the cold phase (--remote): the next 64 bytes. */
static struct bench_barrier *shared_gate(struct shared *sh)
{
	return (struct bench_barrier *)((uint8_t *)sh->base + HDR / 2);
}

static struct bench_samples rank_samples(const struct bench_opts *o, struct shared *sh, uint32_t r)
{
	size_t n = o->prompts;
	uint64_t *b = sh->samples + (size_t)r * BENCH_SAMPLE_ARRAYS * n;
	return (struct bench_samples){.lat_ns = b, .hash_ns = b + n, .index_ns = b + 2 * n, .rt_ns = b + 3 * n,
				      .st_lat_ns = b + 4 * n};
}

/* What the parent does every POLL_NS while the ranks run. */
struct watch {
	void (*fn)(void *arg);
	void *arg;
};

/* Fork the tp rank processes of one step (options o, kvringd at socket; gate: the ranks wait
 * at shared_gate after their cold phase) and reap them, calling w->fn every POLL_NS while they
 * run (w NULL: just wait). A rank that fails aborts both barriers so the others stop too.
 * Returns the errors to count: fork failures, failed ranks, servers of srv[0..n_srv) that
 * died (their pid set to -1). */
static uint64_t run_ranks(const struct bench_opts *o, const struct bench_plan *pl, const char *socket,
			  struct shared *sh, bool gate, struct bench_server *srv, unsigned n_srv, const struct watch *w)
{
	uint64_t errors = 0;
	bench_barrier_init(shared_barrier(sh), o->tp);
	bench_barrier_init(shared_gate(sh), o->tp + 1);
	pid_t *pids = calloc(o->tp, sizeof(*pids));
	if (!pids) {
		fprintf(stderr, "kvring-bench: out of memory\n");
		return 1;
	}
	uint32_t started = 0;
	fflush(NULL);
	for (uint32_t r = 0; r < o->tp; r++) {
		pid_t pid = fork();
		if (pid < 0) {
			fprintf(stderr, "kvring-bench: fork: %s\n", strerror(errno));
			bench_barrier_abort(shared_barrier(sh));
			bench_barrier_abort(shared_gate(sh));
			errors++;
			break;
		}
		if (pid == 0) {
			(void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* no rank outlives a killed bench */
			struct bench_rank_ctx ctx = {.o = o, .pl = pl, .socket = socket, .rank = r,
						     .barrier = shared_barrier(sh), .res = &sh->res[r], .all = sh->res,
						     .samples = rank_samples(o, sh, r), .gate = gate ? shared_gate(sh) : NULL};
			_exit(bench_rank_run(&ctx) ? 1 : 0);
		}
		pids[r] = pid;
		started++;
	}
	for (uint32_t left = started; left;) {
		int status;
		pid_t got = waitpid(-1, &status, w ? WNOHANG : 0);
		if (got == 0) {
			w->fn(w->arg);
			struct timespec ts = {.tv_nsec = POLL_NS};
			nanosleep(&ts, NULL);
			continue;
		}
		if (got < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		bool failed = !WIFEXITED(status) || WEXITSTATUS(status), server = false;
		for (unsigned i = 0; i < n_srv; i++) {
			if (got != srv[i].pid)
				continue;
			fprintf(stderr, "kvring-bench: %s died during the run (%s %d)\n", srv[i].name,
				WIFEXITED(status) ? "status" : "signal",
				WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			srv[i].pid = -1;
			errors++;
			server = true;
		}
		if (server)
			continue;
		for (uint32_t r = 0; r < started; r++) {
			if (pids[r] != got)
				continue;
			left--;
			if (failed) {
				errors++;
				bench_barrier_abort(shared_barrier(sh));
				bench_barrier_abort(shared_gate(sh));
				if (!WIFEXITED(status))
					fprintf(stderr, "kvring-bench: rank %u killed by signal %d\n", r, WTERMSIG(status));
			}
		}
	}
	free(pids);
	return errors;
}

/* ---- --remote ------------------------------------------------------------------------------ */

/* A's write-through, watched from the parent while the cold phase runs: when the counter of
 * acknowledged SETs last moved; once every rank waits at the gate (every store completed),
 * until every lane handed to the remote actor is answered (or timeout_ms), then the gate is
 * opened and the ranks go on (their store baseline, detach) on a quiet machine. */
struct ack_watch {
	struct bench_server *a;
	struct shared *sh;
	const struct bench_opts *o;
	struct bench_remote *rm;
	uint64_t base_acked, base_handed, base_skipped, base_errors, base_stale, base_bytes; /* before the cold phase */
	uint64_t acked, ack_ns;      /* acknowledged since, and when that count was first seen */
	uint64_t hand_ns;            /* when the first lane handed to the remote actor was seen; 0 = none yet */
	uint64_t cold_end_ns;        /* every rank at the gate; 0 = not yet */
	bool released;
};

static uint64_t stat_a(const struct ack_watch *x, const char *actor, unsigned stat)
{
	return bench_server_stat(x->a, actor, stat);
}

static void ack_snapshot(struct ack_watch *x)
{
	x->base_acked = stat_a(x, "remote", KVR_STAT_RM_WRITES);
	x->base_handed = stat_a(x, "lookup", KVR_STAT_LK_RM_WRITES);
	x->base_skipped = stat_a(x, "lookup", KVR_STAT_LK_RM_WRITES_SKIPPED);
	x->base_errors = stat_a(x, "remote", KVR_STAT_RM_WRITE_ERRORS);
	x->base_stale = stat_a(x, "remote", KVR_STAT_RM_WRITES_STALE);
	x->base_bytes = stat_a(x, "remote", KVR_STAT_RM_BYTES_OUT);
}

static void ack_poll(void *arg)
{
	struct ack_watch *x = arg;
	if (x->released)
		return;
	uint64_t now = kvr_now_ns();
	uint64_t acked = stat_a(x, "remote", KVR_STAT_RM_WRITES) - x->base_acked;
	if (acked != x->acked) {
		x->acked = acked;
		x->ack_ns = now;
	}
	if (!x->hand_ns && stat_a(x, "lookup", KVR_STAT_LK_RM_WRITES) != x->base_handed)
		x->hand_ns = now;
	struct bench_barrier *g = shared_gate(x->sh);
	if (!x->cold_end_ns) {
		if (atomic_load(&g->arrived) < x->o->tp)
			return;
		x->cold_end_ns = now;
	}
	struct bench_remote *rm = x->rm;
	rm->wr_expected = 0;
	for (uint32_t r = 0; r < x->o->tp; r++)
		rm->wr_expected += x->sh->res[r].st_stored; /* the group leaders': each lane once */
	rm->wr_handed = stat_a(x, "lookup", KVR_STAT_LK_RM_WRITES) - x->base_handed;
	rm->wr_skipped = stat_a(x, "lookup", KVR_STAT_LK_RM_WRITES_SKIPPED) - x->base_skipped;
	rm->wr_errors = stat_a(x, "remote", KVR_STAT_RM_WRITE_ERRORS) - x->base_errors;
	rm->wr_stale = stat_a(x, "remote", KVR_STAT_RM_WRITES_STALE) - x->base_stale;
	bool done = rm->wr_handed + rm->wr_skipped >= rm->wr_expected &&
		    acked + rm->wr_errors + rm->wr_stale >= rm->wr_handed;
	if (!done && now - x->cold_end_ns < (uint64_t)x->o->timeout_ms * 1000000ull)
		return;
	rm->wr_settled = done;
	rm->wr_acked = acked;
	rm->wr_bytes = stat_a(x, "remote", KVR_STAT_RM_BYTES_OUT) - x->base_bytes;
	/* the tier's window: the first lane handed over (the stores before it are L1's time) ->
	 * the last ack, or the stores' end when the SETs kept up with them */
	uint64_t first = x->hand_ns;
	uint64_t last = x->ack_ns > x->cold_end_ns ? x->ack_ns : x->cold_end_ns;
	rm->wr_ns = first && last > first ? last - first : 0;
	rm->wr_tail_ns = x->ack_ns > x->cold_end_ns ? x->ack_ns - x->cold_end_ns : 0;
	x->released = true;
	(void)bench_barrier_wait(g, x->o->timeout_ms); /* the last party: releases the ranks at once */
}

/* Both instances' remote actors hold a full slot map (they connect to a master when a request
 * first goes there; up to REMOTE_READY_NS or timeout_ms), and their arenas are faulted in
 * (kvringd's background thread would compete with what is measured; up to PREFAULT_NS, then
 * the run goes on, saying so). 0, or 1 after saying which remote actor was not ready. */
static int remote_ready(struct bench_server *srv, unsigned n, int64_t timeout_ms)
{
	uint64_t wait = (uint64_t)timeout_ms * 1000000ull < REMOTE_READY_NS ? (uint64_t)timeout_ms * 1000000ull : REMOTE_READY_NS;
	uint64_t t0 = kvr_now_ns();
	for (unsigned i = 0; i < n; i++) {
		uint64_t cov;
		while ((cov = bench_server_stat(&srv[i], "remote", KVR_STAT_RM_SLOTS_COVERED)) != RC_SLOTS) {
			if (kvr_now_ns() - t0 >= wait) {
				fprintf(stderr, "kvring-bench: %s: its remote actor covers %llu of %u hash slots after %llu ms "
					"(is the cluster up?)\n", srv[i].name, (unsigned long long)cov, RC_SLOTS,
					(unsigned long long)(wait / 1000000ull));
				return 1;
			}
			struct timespec ts = {.tv_nsec = 10 * POLL_NS};
			nanosleep(&ts, NULL);
		}
	}
	for (unsigned i = 0; i < n; i++) {
		while (atomic_load(&srv[i].ctl->prefault_state) == KVR_PREFAULT_RUNNING) {
			if (kvr_now_ns() - t0 >= PREFAULT_NS) {
				fprintf(stderr, "kvring-bench: %s: its arena is still being faulted in after %llu s: going on\n",
					srv[i].name, PREFAULT_NS / 1000000000ull);
				break;
			}
			struct timespec ts = {.tv_nsec = 10 * POLL_NS};
			nanosleep(&ts, NULL);
		}
	}
	return 0;
}

/* B's promotion counters: RM_READS, RM_HITS, RM_MISSES, RM_BAD_VALUES, RM_READ_ERRORS, RM_BYTES_IN. */
static void read_counters(const struct bench_server *b, uint64_t ret[6])
{
	static const unsigned st[6] = {KVR_STAT_RM_READS, KVR_STAT_RM_HITS, KVR_STAT_RM_MISSES, KVR_STAT_RM_BAD_VALUES,
				       KVR_STAT_RM_READ_ERRORS, KVR_STAT_RM_BYTES_IN};
	for (int i = 0; i < 6; i++)
		ret[i] = bench_server_stat(b, "remote", st[i]);
}

static int write_json(const char *path, const char *text)
{
	if (!strcmp(path, "-")) {
		printf("%s\n", text);
		return fflush(stdout) ? -errno : 0;
	}
	FILE *f = fopen(path, "we");
	if (!f)
		return -errno;
	int ok = fprintf(f, "%s\n", text) >= 0;
	if (fclose(f) || !ok)
		return -EIO;
	return 0;
}

/* The PNG (--plot, or beside --json): never changes the exit status. */
static void plot(const struct bench_opts *o, const struct bench_plan *pl, const struct bench_summary *s,
		 const struct bench_rank_result *res, struct shared *sh)
{
	char png[4096], err[512];
	int rc = bench_plot_path(o, png, sizeof(png));
	if (rc <= 0) {
		if (rc)
			fprintf(stderr, "plot: path too long, skipped\n");
		return;
	}
	struct bench_samples *samples = calloc(o->tp, sizeof(*samples));
	if (!samples) {
		fprintf(stderr, "plot: out of memory, skipped\n");
		return;
	}
	for (uint32_t r = 0; r < o->tp; r++)
		samples[r] = rank_samples(o, sh, r);
	struct bench_plot_input in = {.o = o, .pl = pl, .s = s, .when = time(NULL)};
	in.cold_ns = bench_samples_merge(o, res, samples, false, &in.n_cold);
	in.warm_ns = bench_samples_merge(o, res, samples, true, &in.n_warm);
	free(samples);
	rc = bench_plot(&in, png, err, sizeof(err));
	fflush(stdout);
	if (rc == -ENOENT)
		fprintf(stderr, "plot: gnuplot not found, skipped\n");
	else if (rc)
		fprintf(stderr, "plot: %s\n", err);
	else if (!o->quiet)
		printf("plot: %s\n", png);
	free(in.cold_ns);
	free(in.warm_ns);
}

static int dry_run(const struct bench_opts *o, const struct bench_plan *pl)
{
	uint64_t l1 = pl->unique_bytes + pl->unique_bytes / 4;
	if (!o->quiet) {
		bench_print_header(stdout, o, pl);
		printf("L1 for the whole workload + 25%%: %" PRIu64 " bytes (%.1f MiB)\n", l1,
		       kvr_fmt_mib(l1));
		if (o->n_remote)
			printf("remote: two instances of that L1, %u seed%s, max_inflight %u; one Redis value per lane: "
			       "%" PRIu64 " bytes, %" PRIu64 " of them\n", o->n_remote, o->n_remote == 1 ? "" : "s",
			       o->remote_inflight, pl->remote_value_bytes, pl->unique_blocks * pl->lanes);
	}
	if (o->json) {
		struct bench_summary s = {0};
		char *text = bench_json(o, pl, &s);
		if (!text || write_json(o->json, text)) {
			free(text);
			fprintf(stderr, "kvring-bench: cannot write %s\n", o->json);
			return 1;
		}
		free(text);
	}
	return 0;
}

/* Combine the ranks' results of one mapping (bench_summarise). */
static void summarise(const struct bench_opts *o, const struct bench_plan *pl, struct shared *sh, uint64_t extra_errors,
		      struct bench_summary *ret)
{
	struct bench_samples samples[KVR_MAX_TP];
	for (uint32_t r = 0; r < o->tp; r++)
		samples[r] = rank_samples(o, sh, r);
	bench_summarise(o, pl, sh->res, samples, extra_errors, ret);
}

static uint64_t stop_servers(struct bench_server *srv, unsigned n, bool trouble, bool quiet)
{
	uint64_t errors = 0;
	char err[512];
	for (unsigned i = 0; i < n; i++) {
		if (srv[i].pid <= 0) {
			errors++;
			continue;
		}
		if (bench_server_stop(&srv[i], STOP_TIMEOUT_MS, trouble, err, sizeof(err))) {
			fprintf(stderr, "kvring-bench: %s\n", err);
			errors++;
		} else if (!quiet) {
			printf("%s stopped with SIGTERM: exit status 0\n", srv[i].name);
		}
	}
	return errors;
}

static bool any_rank_error(const struct bench_opts *o, const struct shared *sh)
{
	for (uint32_t r = 0; sh->base && r < o->tp; r++)
		if (sh->res[r].err[0])
			return true;
	return false;
}

static void print_rank_errors(const struct bench_opts *o, const struct shared *sh, const char *who)
{
	for (uint32_t r = 0; sh->base && r < o->tp; r++) /* the first error of each rank, after the table */
		if (sh->res[r].err[0])
			fprintf(stderr, "kvring-bench: %s%s\n", who, sh->res[r].err);
}

/*
 * --remote: A stores (cold), the parent watches A's acknowledgements until every lane is in
 * the cluster, then B (empty) looks up and loads every prompt (warm: promotions from the
 * cluster), then A does the same from its L1. A's results (cold + warm) live in sh, B's in
 * shb. Returns the errors to count.
 */
static uint64_t run_remote(const struct bench_opts *o, const struct bench_plan *pl, struct shared *sh,
			   struct shared *shb, struct bench_server *srv, struct bench_remote *rm)
{
	struct bench_opts cold = *o, warm = *o;
	cold.phases = BENCH_COLD;
	warm.phases = BENCH_WARM;
	struct ack_watch aw = {.a = &srv[0], .sh = sh, .o = o, .rm = rm};
	ack_snapshot(&aw);
	struct watch w = {ack_poll, &aw};
	uint64_t errors = run_ranks(&cold, pl, srv[0].socket, sh, true, srv, 2, &w);
	if (!aw.released) {
		fprintf(stderr, "kvring-bench: the cold phase on A did not finish: no write-through figures\n");
		errors++;
	}
	if (errors)
		return errors;

	uint64_t before[6], after[6];
	read_counters(&srv[1], before);
	uint64_t lk = bench_server_stat(&srv[1], "lookup", KVR_STAT_LK_RM_READS);
	errors += run_ranks(&warm, pl, srv[1].socket, shb, false, srv, 2, NULL);
	read_counters(&srv[1], after);
	rm->rd_reads = after[0] - before[0];
	rm->rd_hits = after[1] - before[1];
	rm->rd_misses = after[2] - before[2];
	rm->rd_bad = after[3] - before[3];
	rm->rd_errors = after[4] - before[4];
	rm->rd_bytes = after[5] - before[5];
	rm->rd_lk_reads = bench_server_stat(&srv[1], "lookup", KVR_STAT_LK_RM_READS) - lk;
	rm->rd_expected = pl->unique_blocks * pl->lanes;
	for (uint32_t r = 0; r < o->tp; r++)
		rm->rd_ns = shb->res[r].ld_lookup_ns > rm->rd_ns ? shb->res[r].ld_lookup_ns : rm->rd_ns;
	if (errors)
		return errors;
	return run_ranks(&warm, pl, srv[0].socket, sh, false, srv, 2, NULL);
}

int main(int argc, char **argv)
{
	struct bench_opts o;
	struct bench_plan pl;
	char err[512];
	int rc = bench_opts_parse(argc, argv, &o, stdout, err, sizeof(err));
	if (rc == 1)
		return 0;
	if (rc) {
		fprintf(stderr, "kvring-bench: %s (try --help)\n", err);
		return 2;
	}
	if (bench_plan_make(&o, &pl, err, sizeof(err))) {
		fprintf(stderr, "kvring-bench: %s\n", err);
		return 2;
	}
	if (o.dry_run)
		return dry_run(&o, &pl);
	(void)signal(SIGPIPE, SIG_IGN);

	bool remote = o.n_remote > 0;
	struct shared sh = {0}, shb = {0};
	if ((rc = shared_map(&o, &sh)) || (remote && (rc = shared_map(&o, &shb)))) {
		fprintf(stderr, "kvring-bench: shared results mapping: %s\n", strerror(-rc));
		return 1;
	}

	struct bench_server srv[2] = {{.pid = -1}, {.pid = -1}};
	unsigned n_srv = 0;
	const char *socket = o.socket;
	uint64_t extra_errors = 0;
	if (o.spawn) {
		for (unsigned want = remote ? 2 : 1; n_srv < want; n_srv++) {
			const char *name = !remote ? "kvringd" : n_srv ? "kvringd B" : "kvringd A";
			if (bench_server_start(&o, &pl, name, &srv[n_srv], err, sizeof(err))) {
				fprintf(stderr, "kvring-bench: %s\n", err);
				(void)stop_servers(srv, n_srv, true, true);
				return 1;
			}
		}
		socket = srv[0].socket;
	}
	err[0] = '\0';
	for (unsigned i = 0; remote && i < n_srv; i++) {
		if (bench_server_ctl(&srv[i], err, sizeof(err)) || (i == n_srv - 1 && remote_ready(srv, n_srv, o.timeout_ms))) {
			if (err[0])
				fprintf(stderr, "kvring-bench: %s\n", err);
			(void)stop_servers(srv, n_srv, true, true);
			return 1;
		}
	}
	if (!o.quiet) {
		bench_print_header(stdout, &o, &pl);
		if (remote) {
			printf("servers: A %s, B %s (spawned kvringd, same config)\nremote:", srv[0].socket, srv[1].socket);
			for (uint32_t i = 0; i < o.n_remote; i++)
				printf("%s%s", i ? "," : " ", o.remote_seed[i]);
			printf(" (max_inflight %u, timeout_ms %u)\n", o.remote_inflight, BENCH_REMOTE_TIMEOUT_MS);
		} else {
			printf("server: %s%s\n", socket ? socket : "the default socket", o.spawn ? " (spawned kvringd)" : "");
		}
	}

	struct bench_remote rm = {.seeds = o.n_remote, .inflight = o.remote_inflight};
	if (remote)
		extra_errors += run_remote(&o, &pl, &sh, &shb, srv, &rm);
	else
		extra_errors += run_ranks(&o, &pl, socket, &sh, false, srv, n_srv, NULL);
	if (o.spawn)
		extra_errors += stop_servers(srv, n_srv, extra_errors > 0 || any_rank_error(&o, &sh) || any_rank_error(&o, &shb),
					     o.quiet);

	struct bench_opts warm = o;
	warm.phases = BENCH_WARM;
	struct bench_summary s, b;
	summarise(&o, &pl, &sh, extra_errors, &s);
	if (remote) {
		summarise(&warm, &pl, &shb, 0, &b);
		bench_remote_summarise(&pl, &b, &rm, &s);
	}
	if (!o.quiet && remote) {
		printf("\ninstance A: the cold phase; after B's, the warm phase from its own L1\n");
		bench_print_phases(stdout, &o, &pl, &s);
		printf("\ninstance B: an empty L1; the warm phase, every block promoted from the cluster\n");
		bench_print_phases(stdout, &warm, &pl, &b);
		bench_print_tail(stdout, &s);
	} else if (!o.quiet) {
		bench_print_table(stdout, &o, &pl, &s);
	}
	fflush(stdout);
	print_rank_errors(&o, &sh, remote ? "A: " : "");
	print_rank_errors(&o, &shb, "B: ");
	if (o.json) {
		char *text = bench_json(&o, &pl, &s);
		if (!text || (rc = write_json(o.json, text))) {
			fprintf(stderr, "kvring-bench: cannot write %s\n", o.json);
			s.ok = false;
		}
		free(text);
	}
	plot(&o, &pl, &s, sh.res, &sh);
	munmap(sh.base, sh.size);
	if (shb.base)
		munmap(shb.base, shb.size);
	return s.ok ? 0 : 1;
}
