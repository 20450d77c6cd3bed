/* kvring-bench plot: latency CDFs per phase and throughput against memcpy as a PNG, drawn by a gnuplot child. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "fmt.h"
#include "kvr_log.h"

#define GNUPLOT_TIMEOUT_MS 60000
#define PNG_WIDTH 1400
#define PNG_HEIGHT 560
#define ROW_STEP 4 /* x distance between the phases' bar pairs */

/* ---- where -------------------------------------------------------------------------------- */

int bench_plot_path(const struct bench_opts *o, char *ret, size_t len)
{
	const char *base = o->plot ? o->plot : o->json;
	const char *ext = o->plot ? "" : ".png";
	if (o->no_plot || !base || (!o->plot && !strcmp(base, "-")))
		return 0;
	size_t n = strlen(base);
	if (!o->plot && n > 5 && !strcmp(base + n - 5, ".json"))
		n -= 5;
	if (n + strlen(ext) >= len)
		return -ENAMETOOLONG; /* ret untouched */
	memcpy(ret, base, n);
	strcpy(ret + n, ext);
	return 1;
}

/* ---- data ---------------------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void cdf(FILE *f, const char *name, uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	fprintf(f, "\n\n# %s: ns cumulative_fraction\n", name);
	fprintf(f, "%" PRIu64 " %.6f\n", v[0], 0.0);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%" PRIu64 " %.6f\n", v[i], (double)(i + 1) / (double)n);
}

int bench_plot_write_data(FILE *f, struct bench_plot_input *in)
{
	const struct bench_summary *s = in->s;
	fprintf(f, "# kvring-bench plot data\n");
	fprintf(f, "# throughput: phase kvring_gbps memcpy_gbps\n");
	if (s->ran_cold)
		fprintf(f, "store %.4f %.4f\n", s->st_gbps, s->st_memcpy_gbps);
	if (s->ran_warm)
		fprintf(f, "load %.4f %.4f\n", s->ld_gbps, s->ld_memcpy_gbps);
	if (in->n_cold)
		cdf(f, "cold latency", in->cold_ns, in->n_cold);
	if (in->n_warm)
		cdf(f, "warm latency", in->warm_ns, in->n_warm);
	return fflush(f) || ferror(f) ? -EIO : 0;
}

/* ---- script -------------------------------------------------------------------------------- */

/* A gnuplot single-quoted string: no escapes and no `command` substitution inside; '' is a quote. */
static void q(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		if (*s == '\'')
			fputc('\'', f);
		fputc(*s, f);
	}
	fputc('\'', f);
}

static void minmax(const uint64_t *v, size_t n, uint64_t *lo, uint64_t *hi)
{
	for (size_t i = 0; i < n; i++) {
		if (v[i] < *lo)
			*lo = v[i];
		if (v[i] > *hi)
			*hi = v[i];
	}
}

static void cdf_title(FILE *f, const char *what, const struct bench_dist *d, size_t n)
{
	char a[32], b[32], t[160];
	snprintf(t, sizeof(t), "%s (n=%zu, p50 %s, p99 %s)", what, n, kvr_fmt_ns((double)d->p50, a, sizeof(a)),
		 kvr_fmt_ns((double)d->p99, b, sizeof(b)));
	q(f, t);
}

static void latency_panel(FILE *f, const struct bench_plot_input *in, const char *data)
{
	uint64_t lo = UINT64_MAX, hi = 0;
	minmax(in->cold_ns, in->n_cold, &lo, &hi);
	minmax(in->warm_ns, in->n_warm, &lo, &hi);
	double div = hi >= 1000000 ? 1e6 : hi >= 1000 ? 1e3 : 1;
	const char *unit = hi >= 1000000 ? "ms" : hi >= 1000 ? "us" : "ns";
	fprintf(f, "set title 'Latency per request (empirical CDF)'\n");
	fprintf(f, "set xlabel 'latency (%s%s)'\n", unit, lo && hi / lo >= 10 ? ", log scale" : "");
	fprintf(f, "set ylabel 'fraction of requests at or below'\n");
	/* headroom above 1 for the key: a CDF fills every other corner */
	fprintf(f, "set yrange [0:1.3]\nset ytics 0, 0.1, 1\nset grid xtics ytics mxtics\n");
	fprintf(f, "set key top left box opaque\n");
	if (lo && hi / lo >= 10) { /* spans a decade or more: log x, tics at 1-2-5 steps inside the data's range */
		double x0 = (double)lo / div / 1.25, x1 = (double)hi / div * 1.25;
		fprintf(f, "set logscale x 10\nset xrange [%g:%g]\nset xtics (", x0, x1);
		const char *sep = "";
		for (double d = 1e-3; d <= 1e9; d *= 10)
			for (int m = 1; m <= 5; m += m == 1 ? 1 : 3) {
				if (m * d < x0 || m * d > x1)
					continue;
				fprintf(f, "%s%g", sep, m * d);
				sep = ", ";
			}
		fprintf(f, ")\n");
	}
	if (!in->n_cold && !in->n_warm) {
		fprintf(f, "set label 1 'no latency samples' at graph 0.5, 0.5 center\n");
		fprintf(f, "plot [0:1] NaN notitle\nunset label 1\n");
		return;
	}
	fprintf(f, "plot ");
	const char *sep = "";
	if (in->n_cold) {
		fprintf(f, "%s", sep);
		q(f, data);
		fprintf(f, " index 'cold latency' using ($1/%.0f):2 with steps lw 2.5 lc rgb '#e07b00' title ", div);
		cdf_title(f, "cold: store, submit -> done", &in->s->st_lat, in->n_cold);
		fprintf(f, ", \\\n  '' index 'cold latency' every ::1 using ($1/%.0f):2 with points pt 7 ps 0.8 "
			"lc rgb '#e07b00' notitle", div);
		sep = ", \\\n  ";
	}
	if (in->n_warm) {
		fprintf(f, "%s", sep);
		q(f, data);
		fprintf(f, " index 'warm latency' using ($1/%.0f):2 with steps lw 2.5 lc rgb '#1f6fb4' title ", div);
		cdf_title(f, "warm: lookup + load", &in->s->lat, in->n_warm);
		fprintf(f, ", \\\n  '' index 'warm latency' every ::1 using ($1/%.0f):2 with points pt 7 ps 0.8 "
			"lc rgb '#1f6fb4' notitle", div);
	}
	fprintf(f, "\n");
}

static void throughput_panel(FILE *f, const struct bench_plot_input *in, const char *data)
{
	const struct bench_summary *s = in->s;
	double top = 0;
	unsigned rows = 0;
	fprintf(f, "unset logscale x\nunset label\nset grid noxtics nomxtics ytics\n");
	fprintf(f, "set title 'Throughput per phase (GB/s = 10^9 bytes/s)'\n");
	fprintf(f, "set xlabel ''\nset ylabel 'GB/s'\nset ytics autofreq\n");
	fprintf(f, "set style fill solid 0.85 border -1\nset boxwidth 0.9\nset xtics nomirror scale 0 (");
	if (s->ran_cold) {
		if (s->st_bytes)
			fprintf(f, "\"store (cold)\\nkvring/memcpy GB/s %.2f\\ngoal >= %.2f: %s\" %u", s->st_ratio,
				BENCH_STORE_GOAL_MIN, s->st_ratio >= BENCH_STORE_GOAL_MIN ? "met" : "missed",
				rows * ROW_STEP);
		else
			fprintf(f, "\"store (cold)\\nno bytes newly stored\" %u", rows * ROW_STEP);
		top = s->st_gbps > top ? s->st_gbps : top;
		top = s->st_memcpy_gbps > top ? s->st_memcpy_gbps : top;
		rows++;
	}
	if (s->ran_warm) {
		fprintf(f, "%s", rows ? ", " : "");
		if (s->ld_bytes)
			fprintf(f, "\"load (warm)\\nkvring/memcpy time %.2f\\ngoal <= %.2f: %s\" %u", s->ld_time_ratio,
				BENCH_LOAD_GOAL_MAX, s->ld_time_ratio <= BENCH_LOAD_GOAL_MAX ? "met" : "missed",
				rows * ROW_STEP);
		else
			fprintf(f, "\"load (warm)\\nno bytes loaded\" %u", rows * ROW_STEP);
		top = s->ld_gbps > top ? s->ld_gbps : top;
		top = s->ld_memcpy_gbps > top ? s->ld_memcpy_gbps : top;
		rows++;
	}
	fprintf(f, ")\n");
	/* row r: kvring at ROW_STEP r - 0.5, memcpy at ROW_STEP r + 0.5; room above the bars for their
	 * values and the key */
	fprintf(f, "set xrange [-1.5:%d.5]\nset yrange [0:%g]\nset key top right box opaque\n",
		rows ? ROW_STEP * (int)rows - ROW_STEP + 1 : 1, top > 0 ? top * 1.35 : 1.0);
	if (!rows) {
		fprintf(f, "plot NaN notitle\n");
		return;
	}
	fprintf(f, "plot ");
	q(f, data);
	fprintf(f, " index 'throughput' using ($0*%d-0.5):2 with boxes lc rgb '#1f6fb4' title 'kvring', \\\n"
		"  '' index 'throughput' using ($0*%d+0.5):3 with boxes lc rgb '#9a9a9a' "
		"title 'memcpy (same bytes, same pieces, same run)', \\\n"
		"  '' index 'throughput' using ($0*%d-0.5):2:(sprintf('%%.2f', $2)) with labels offset 0,0.8 "
		"notitle, \\\n"
		"  '' index 'throughput' using ($0*%d+0.5):3:(sprintf('%%.2f', $3)) with labels offset 0,0.8 "
		"notitle\n",
		ROW_STEP, ROW_STEP, ROW_STEP, ROW_STEP);
}

char *bench_plot_script(const struct bench_plot_input *in, const char *data_path, const char *png_path)
{
	char *buf = NULL, title[512], when[64] = "";
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	const struct bench_opts *o = in->o;
	struct tm tm;
	if (localtime_r(&in->when, &tm))
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M", &tm);
	char dcp[48] = "";
	if (o->dcp > 1 || bench_load_dcp(o) > 1)
		snprintf(dcp, sizeof(dcp), ", dcp %u / %u (load %u / %u)", o->dcp, o->interleave, bench_load_dcp(o),
			 bench_load_interleave(o));
	snprintf(title, sizeof(title), "kvring-bench: %s (%s), tp %u%s, %u prompts x %u tokens (shared prefix %u), %s%s",
		 o->model, in->pl->preset->hf_id, o->tp, dcp, o->prompts, o->input_len, o->prefix_len, when,
		 in->s->ok ? "" : ", FAILED");
	fprintf(f, "# kvring-bench plot script (fed to gnuplot on stdin)\n");
	fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
		"  set terminal pngcairo size %d,%d font 'Sans,11' noenhanced\n"
		"} else {\n"
		"  set terminal png size %d,%d font 'Sans,9' noenhanced\n"
		"}\n", PNG_WIDTH, PNG_HEIGHT, PNG_WIDTH, PNG_HEIGHT);
	fprintf(f, "set output ");
	q(f, png_path);
	fprintf(f, "\nset multiplot layout 1,2 title ");
	q(f, title);
	fprintf(f, " font ',13'\nset bmargin 6\n");
	latency_panel(f, in, data_path);
	throughput_panel(f, in, data_path);
	fprintf(f, "unset multiplot\nset output\n");
	if (fclose(f)) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* ---- gnuplot -------------------------------------------------------------------------------- */

int bench_which(const char *name, const char *path_env, char *ret, size_t len)
{
	if (!path_env)
		return -ENOENT;
	for (const char *p = path_env; *p;) {
		size_t dlen = strcspn(p, ":");
		char buf[4096];
		/* an empty entry is the current directory, as in execvp */
		int w = snprintf(buf, sizeof(buf), "%.*s%s%s", (int)dlen, p, dlen ? "/" : "", name);
		struct stat st;
		if (w > 0 && (size_t)w < sizeof(buf) && !stat(buf, &st) && S_ISREG(st.st_mode) && !access(buf, X_OK)) {
			if ((size_t)w >= len)
				return -ENAMETOOLONG;
			memcpy(ret, buf, (size_t)w + 1);
			return 0;
		}
		p += dlen;
		if (*p == ':')
			p++;
	}
	return -ENOENT;
}

/* -errno, but never -ENOENT: that one means "gnuplot is not installed". */
static int neg_errno(void)
{
	return errno == ENOENT ? -EIO : -errno;
}

/* What gnuplot's stderr says went wrong: its first error ("line N: ..." that is no warning), else
 * its first warning, else its last line; with the "system error: ..." line when there is one. */
static void first_error(int fd, char *out, size_t len)
{
	char buf[8192];
	const char *error = NULL, *warning = NULL, *last = NULL, *sys = NULL;
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	out[0] = '\0';
	if (n <= 0)
		return;
	buf[n] = '\0';
	for (char *line = buf, *nl; line && *line; line = nl) {
		nl = strchr(line, '\n');
		if (nl)
			*nl++ = '\0';
		line += strspn(line, " \t");
		if (!*line || strspn(line, " ^") == strlen(line) || !strncmp(line, "gnuplot>", 8))
			continue; /* the echoed command and the caret under it */
		last = line;
		if (!strncmp(line, "system error", 12))
			sys = sys ? sys : line;
		else if (!strncmp(line, "line ", 5) && strstr(line, "warning:"))
			warning = warning ? warning : line;
		else if (!strncmp(line, "line ", 5))
			error = error ? error : line;
	}
	const char *pick = error ? error : warning ? warning : last;
	size_t k = 0;
	for (const char *p = pick; p && *p && k + 1 < len; p++) /* runs of blanks as one */
		if (*p != ' ' || (k && out[k - 1] != ' '))
			out[k++] = *p;
	out[k] = '\0';
	if (sys && sys != pick && k + 3 < len)
		snprintf(out + k, len - k, "; %s", sys);
}

/* Wait for the child, SIGKILL after timeout_ms. Returns its wait status, or -errno. */
static int wait_child(pid_t pid, int timeout_ms)
{
	int status;
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd >= 0) {
		struct pollfd p = {.fd = pfd, .events = POLLIN};
		int n;
		do
			n = poll(&p, 1, timeout_ms);
		while (n < 0 && errno == EINTR);
		if (n == 0)
			(void)kill(pid, SIGKILL);
		close(pfd);
	}
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return status;
}

/* Feed the script to the child's stdin; SIGPIPE ignored meanwhile (gnuplot may exit early). */
static int feed(int fd, const char *text)
{
	struct sigaction ign = {.sa_handler = SIG_IGN}, old;
	sigemptyset(&ign.sa_mask);
	(void)sigaction(SIGPIPE, &ign, &old);
	int rc = 0;
	for (size_t off = 0, len = strlen(text); off < len;) {
		ssize_t n = write(fd, text + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			break;
		}
		off += (size_t)n;
	}
	(void)sigaction(SIGPIPE, &old, NULL);
	return rc;
}

int bench_plot(struct bench_plot_input *in, const char *png_path, char *err, size_t errlen)
{
	char gnuplot[4096], data[64] = "", errpath[64], line[256];
	int data_fd = -1, err_fd = -1, null_fd = -1, pipe_fd[2] = {-1, -1}, rc, frc, status;
	char *script = NULL;
	FILE *f = NULL;
	struct stat st;
	pid_t pid;

	if (errlen)
		err[0] = '\0';
	rc = bench_which("gnuplot", getenv("PATH"), gnuplot, sizeof(gnuplot));
	if (rc)
		return kvr_errf(err, errlen, rc, "%s", rc == -ENOENT ? "gnuplot not found" : "gnuplot: path too long");

	snprintf(data, sizeof(data), "/tmp/kvring-bench-plot.%d.XXXXXX", (int)getpid());
	data_fd = mkostemp(data, O_CLOEXEC);
	if (data_fd < 0) {
		rc = kvr_errf(err, errlen, neg_errno(), "temp data file: %s", strerror(errno));
		data[0] = '\0';
		goto out;
	}
	f = fdopen(data_fd, "w");
	if (!f) {
		rc = kvr_errf(err, errlen, neg_errno(), "temp data file: %s", strerror(errno));
		goto out;
	}
	data_fd = -1;
	rc = bench_plot_write_data(f, in);
	if (fclose(f) && !rc)
		rc = -EIO;
	f = NULL;
	if (rc) {
		rc = kvr_errf(err, errlen, rc, "cannot write the data file %s", data);
		goto out;
	}
	script = bench_plot_script(in, data, png_path);
	if (!script) {
		rc = kvr_errf(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}

	snprintf(errpath, sizeof(errpath), "/tmp/kvring-bench-plot-err.%d.XXXXXX", (int)getpid());
	err_fd = mkostemp(errpath, O_CLOEXEC);
	if (err_fd >= 0)
		(void)unlink(errpath);
	null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (err_fd < 0 || null_fd < 0 || pipe2(pipe_fd, O_CLOEXEC)) {
		rc = kvr_errf(err, errlen, neg_errno(), "cannot start gnuplot: %s", strerror(errno));
		goto out;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		rc = kvr_errf(err, errlen, neg_errno(), "fork: %s", strerror(errno));
		goto out;
	}
	if (pid == 0) {
		if (dup2(pipe_fd[0], 0) < 0 || dup2(null_fd, 1) < 0 || dup2(err_fd, 2) < 0)
			_exit(127);
		execl(gnuplot, "gnuplot", (char *)NULL);
		_exit(127);
	}
	close(pipe_fd[0]);
	pipe_fd[0] = -1;
	frc = feed(pipe_fd[1], script);
	close(pipe_fd[1]);
	pipe_fd[1] = -1;
	status = wait_child(pid, GNUPLOT_TIMEOUT_MS);
	if (status < 0) {
		rc = kvr_errf(err, errlen, status, "waiting for gnuplot: %s", strerror(-status));
		goto out;
	}
	first_error(err_fd, line, sizeof(line));
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		rc = kvr_errf(err, errlen, -EIO, "gnuplot %s %d%s%s",
			  WIFEXITED(status) ? "exited with status" : "killed by signal",
			  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), line[0] ? ": " : "", line);
		goto out;
	}
	if (frc || stat(png_path, &st) || !st.st_size) {
		rc = kvr_errf(err, errlen, -EIO, "gnuplot wrote no %s%s%s", png_path, line[0] ? ": " : "", line);
		goto out;
	}
	rc = 0;
out:
	if (f)
		fclose(f);
	if (data_fd >= 0)
		close(data_fd);
	if (data[0])
		(void)unlink(data);
	if (err_fd >= 0)
		close(err_fd);
	if (null_fd >= 0)
		close(null_fd);
	if (pipe_fd[0] >= 0)
		close(pipe_fd[0]);
	if (pipe_fd[1] >= 0)
		close(pipe_fd[1]);
	free(script);
	return rc;
}
