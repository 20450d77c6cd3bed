/* kvring-bench: the L1 benchmark — tp emulated workers (DCP groups too) store, look up, load, verify via kvringd. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define STOP_TIMEOUT_MS 60000

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
	size_t size = 64 + res_bytes + (size_t)o->tp * BENCH_SAMPLE_ARRAYS * o->prompts * sizeof(uint64_t);
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	*ret = (struct shared){.base = p, .size = size};
	ret->res = (struct bench_rank_result *)((uint8_t *)p + 64);
	ret->samples = (uint64_t *)((uint8_t *)p + 64 + res_bytes);
	return 0;
}

_Static_assert(sizeof(struct bench_barrier) <= 64, "the barrier fits the mapping's first 64 bytes");

static struct bench_barrier *shared_barrier(struct shared *sh)
{
	return (struct bench_barrier *)sh->base; /* the first 64 bytes */
}

static struct bench_samples rank_samples(const struct bench_opts *o, struct shared *sh, uint32_t r)
{
	size_t n = o->prompts;
	uint64_t *b = sh->samples + (size_t)r * BENCH_SAMPLE_ARRAYS * n;
	return (struct bench_samples){.lat_ns = b, .hash_ns = b + n, .index_ns = b + 2 * n, .rt_ns = b + 3 * n,
				      .st_lat_ns = b + 4 * n};
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
		       (double)l1 / (1024.0 * 1024.0));
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

	struct shared sh = {0};
	if ((rc = shared_map(&o, &sh))) {
		fprintf(stderr, "kvring-bench: shared results mapping: %s\n", strerror(-rc));
		return 1;
	}
	bench_barrier_init(shared_barrier(&sh), o.tp);

	struct bench_server srv = {.pid = -1};
	const char *socket = o.socket;
	uint64_t extra_errors = 0;
	if (o.spawn) {
		if (bench_server_start(&o, &pl, &srv, err, sizeof(err))) {
			fprintf(stderr, "kvring-bench: %s\n", err);
			return 1;
		}
		socket = srv.socket;
	}
	if (!o.quiet) {
		bench_print_header(stdout, &o, &pl);
		printf("server: %s%s\n", socket ? socket : "the default socket",
		       o.spawn ? " (spawned kvringd)" : "");
	}

	pid_t *pids = calloc(o.tp, sizeof(*pids));
	if (!pids) {
		fprintf(stderr, "kvring-bench: out of memory\n");
		return 1;
	}
	uint32_t started = 0;
	fflush(NULL);
	for (uint32_t r = 0; r < o.tp; r++) {
		pid_t pid = fork();
		if (pid < 0) {
			fprintf(stderr, "kvring-bench: fork: %s\n", strerror(errno));
			bench_barrier_abort(shared_barrier(&sh));
			extra_errors++;
			break;
		}
		if (pid == 0) {
			(void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* no rank outlives a killed bench */
			struct bench_rank_ctx ctx = {.o = &o, .pl = &pl, .socket = socket, .rank = r,
						     .barrier = shared_barrier(&sh), .res = &sh.res[r], .all = sh.res,
						     .samples = rank_samples(&o, &sh, r)};
			_exit(bench_rank_run(&ctx) ? 1 : 0);
		}
		pids[r] = pid;
		started++;
	}
	/* reap the ranks; a rank that fails aborts the barrier so the others stop too */
	for (uint32_t left = started; left;) {
		int status;
		pid_t w = waitpid(-1, &status, 0);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		bool failed = !WIFEXITED(status) || WEXITSTATUS(status);
		if (w == srv.pid) {
			fprintf(stderr, "kvring-bench: kvringd died during the run (%s %d)\n",
				WIFEXITED(status) ? "status" : "signal",
				WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			srv.pid = -1;
			extra_errors++;
			continue;
		}
		for (uint32_t r = 0; r < started; r++) {
			if (pids[r] != w)
				continue;
			left--;
			if (failed) {
				extra_errors++;
				bench_barrier_abort(shared_barrier(&sh));
				if (!WIFEXITED(status))
					fprintf(stderr, "kvring-bench: rank %u killed by signal %d\n", r, WTERMSIG(status));
			}
		}
	}
	free(pids);

	if (o.spawn && srv.pid > 0) {
		bool trouble = extra_errors > 0;
		for (uint32_t r = 0; r < o.tp; r++)
			trouble |= sh.res[r].err[0] != '\0';
		int st = bench_server_stop(&srv, STOP_TIMEOUT_MS, trouble, err, sizeof(err));
		if (st) {
			fprintf(stderr, "kvring-bench: %s\n", err);
			extra_errors++;
		} else if (!o.quiet) {
			printf("kvringd stopped with SIGTERM: exit status 0\n");
		}
	} else if (o.spawn) {
		extra_errors++;
	}

	struct bench_samples *samples = calloc(o.tp, sizeof(*samples));
	if (!samples) {
		fprintf(stderr, "kvring-bench: out of memory\n");
		return 1;
	}
	for (uint32_t r = 0; r < o.tp; r++)
		samples[r] = rank_samples(&o, &sh, r);
	struct bench_summary s;
	bench_summarise(&o, &pl, sh.res, samples, extra_errors, &s);
	free(samples);
	if (!o.quiet)
		bench_print_table(stdout, &o, &pl, &s);
	fflush(stdout);
	for (uint32_t r = 0; r < o.tp; r++) /* the first error of each rank, after the table */
		if (sh.res[r].err[0])
			fprintf(stderr, "kvring-bench: %s\n", sh.res[r].err);
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
	return s.ok ? 0 : 1;
}
