/* kvring-bench --spawn: run kvringd from the build tree on a generated config, then stop it and check its exit. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kvr_log.h"
#include "bench.h"
#include "kvr_time.h"

#define START_TIMEOUT_NS (20ull * 1000000000ull)

char *bench_server_config(const struct bench_opts *o, const struct bench_plan *pl, const char *socket)
{
	uint64_t cap = o->l1_bytes;
	if (!cap) { /* the workload + 25%, rounded up to MiB, + 1 MiB for headers */
		cap = pl->unique_bytes + pl->unique_bytes / 4;
		if (o->evict) /* a third of it: most blocks must come back from L2 */
			cap = pl->unique_bytes / 3;
		cap = ((cap + (1u << 20) - 1) >> 20 << 20) + (1u << 20);
	}
	cJSON *root = cJSON_CreateObject();
	if (!root)
		return NULL;
	cJSON *inst = cJSON_AddObjectToObject(root, "instance");
	cJSON_AddStringToObject(inst, "socket", socket);
	/* a cross-layout run attaches every rank twice; a slot is freed once its gather actor exited */
	bool relayout = pl->ld.dcp != pl->st.dcp || pl->ld.interleave != pl->st.interleave;
	cJSON_AddNumberToObject(inst, "max_workers", relayout ? 2 * o->tp : o->tp);
	cJSON *model = cJSON_AddObjectToObject(root, "model");
	cJSON_AddStringToObject(model, "preset", o->model);
	cJSON_AddNumberToObject(model, "block_tokens", o->block_tokens);
	/* the canonical block: MLA as without DCP; MHA's tp_size is the number of lanes, tp / dcp */
	cJSON_AddNumberToObject(model, "tp_size", pl->preset->attention == KVR_ATTN_MLA ? o->tp : pl->lanes);
	cJSON *l1 = cJSON_AddObjectToObject(root, "l1");
	cJSON_AddNumberToObject(l1, "capacity_bytes", (double)cap);
	if (o->evict) { /* L2 beside the socket: <tmpdir>/l2, twice the workload */
		char dir[PATH_MAX];
		snprintf(dir, sizeof(dir), "%s", socket);
		char *slash = strrchr(dir, '/');
		if (slash)
			snprintf(slash, sizeof(dir) - (size_t)(slash - dir), "/l2");
		cJSON *l2 = cJSON_AddObjectToObject(root, "l2");
		cJSON *dirs = cJSON_AddArrayToObject(l2, "dirs");
		cJSON_AddItemToArray(dirs, cJSON_CreateString(dir));
		cJSON_AddNumberToObject(l2, "capacity_bytes", (double)(pl->unique_bytes * 2 + (64u << 20)));
		cJSON_AddStringToObject(l2, "durability", "none");
	}
	cJSON *metrics = cJSON_AddObjectToObject(root, "metrics");
	cJSON_AddBoolToObject(metrics, "enabled", 0);
	char *text = cJSON_Print(root);
	cJSON_Delete(root);
	return text;
}

/* <dir of /proc/self/exe>/../../supervisor/kvringd: build/tools/bench -> build/supervisor. */
static int default_kvringd(char *buf, size_t len)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0)
		return -errno;
	self[n] = '\0';
	int w = snprintf(buf, len, "%s/../../supervisor/kvringd", dirname(self));
	return w < 0 || (size_t)w >= len ? -ENAMETOOLONG : 0;
}

static int write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	size_t len = strlen(text), off = 0;
	while (off < len) {
		ssize_t n = write(fd, text + off, len - off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			int rc = -errno;
			close(fd);
			return rc;
		}
		off += (size_t)n;
	}
	return close(fd) < 0 ? -errno : 0;
}

/* The last lines of kvringd's log, to stderr, so a failed start explains itself. */
static void print_log_tail(const struct bench_server *s)
{
	FILE *f = fopen(s->log, "re");
	if (!f)
		return;
	static char buf[8192];
	(void)fseek(f, 0, SEEK_END);
	long end = ftell(f);
	(void)fseek(f, end > (long)sizeof(buf) - 1 ? end - (long)sizeof(buf) + 1 : 0, SEEK_SET);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	if (n)
		fprintf(stderr, "kvring-bench: kvringd log (%s), last lines:\n%s%s", s->log, buf,
			buf[n - 1] == '\n' ? "" : "\n");
}

static void remove_dir(struct bench_server *s)
{
	char p[200];
	static const char *files[] = {"kvringd.json", "kvringd.log", "kvringd.sock"};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", s->dir, files[i]);
		(void)unlink(p);
	}
	(void)rmdir(s->dir);
}

int bench_server_start(const struct bench_opts *o, const struct bench_plan *pl, struct bench_server *ret, char *err,
		       size_t errlen)
{
	struct bench_server s = {.pid = -1};
	char exe[PATH_MAX], cfg_path[160];
	int rc;
	if (o->kvringd)
		snprintf(exe, sizeof(exe), "%s", o->kvringd);
	else if ((rc = default_kvringd(exe, sizeof(exe))))
		return kvr_errf(err, errlen, rc, "cannot locate kvringd beside this program: %s", strerror(-rc));
	if (access(exe, X_OK))
		return kvr_errf(err, errlen, -errno, "kvringd: %s: %s (build it, or give --kvringd PATH)", exe,
			    strerror(errno));

	snprintf(s.dir, sizeof(s.dir), "/tmp/kvring-bench.%d.XXXXXX", (int)getpid());
	if (!mkdtemp(s.dir))
		return kvr_errf(err, errlen, -errno, "mkdtemp %s: %s", s.dir, strerror(errno));
	snprintf(s.socket, sizeof(s.socket), "%s/kvringd.sock", s.dir);
	if (o->evict) {
		char l2[200];
		snprintf(l2, sizeof(l2), "%s/l2", s.dir);
		if (mkdir(l2, 0700) < 0) {
			rc = kvr_errf(err, errlen, -errno, "mkdir %s: %s", l2, strerror(errno));
			goto fail;
		}
	}
	snprintf(s.log, sizeof(s.log), "%s/kvringd.log", s.dir);
	snprintf(cfg_path, sizeof(cfg_path), "%s/kvringd.json", s.dir);
	char *cfg = bench_server_config(o, pl, s.socket);
	if (!cfg) {
		rc = kvr_errf(err, errlen, -ENOMEM, "out of memory");
		goto fail;
	}
	rc = write_file(cfg_path, cfg);
	free(cfg);
	if (rc) {
		rc = kvr_errf(err, errlen, rc, "%s: %s", cfg_path, strerror(-rc));
		goto fail;
	}
	int log_fd = open(s.log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (log_fd < 0) {
		rc = kvr_errf(err, errlen, -errno, "%s: %s", s.log, strerror(errno));
		goto fail;
	}
	pid_t parent = getpid();
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		rc = kvr_errf(err, errlen, -errno, "fork: %s", strerror(errno));
		close(log_fd);
		goto fail;
	}
	if (pid == 0) {
		/* kvringd must not outlive the bench, even when the bench is killed */
		(void)prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		(void)setpgid(0, 0); /* a terminal's ^C reaches the bench, not kvringd: the bench stops it */
		int null = open("/dev/null", O_RDONLY);
		if (null >= 0)
			(void)dup2(null, STDIN_FILENO);
		(void)dup2(log_fd, STDOUT_FILENO);
		(void)dup2(log_fd, STDERR_FILENO);
		execl(exe, exe, "--config", cfg_path, (char *)NULL);
		dprintf(STDERR_FILENO, "kvring-bench: exec %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(log_fd);
	s.pid = pid;

	/* ready when the socket exists (kvringd listens before it answers attaches) */
	uint64_t deadline = kvr_now_ns() + START_TIMEOUT_NS;
	for (;;) {
		struct stat st;
		if (!stat(s.socket, &st) && S_ISSOCK(st.st_mode))
			break;
		int status;
		pid_t w = waitpid(pid, &status, WNOHANG);
		if (w == pid) {
			s.pid = -1;
			rc = kvr_errf(err, errlen, -ECHILD, "kvringd exited during start-up (%s %d)",
				  WIFEXITED(status) ? "status" : "signal",
				  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			goto fail;
		}
		if (kvr_now_ns() >= deadline) {
			rc = kvr_errf(err, errlen, -ETIMEDOUT, "kvringd did not create %s within %llu s", s.socket,
				  START_TIMEOUT_NS / 1000000000ull);
			goto fail;
		}
		struct timespec ts = {.tv_nsec = 10 * 1000000};
		nanosleep(&ts, NULL);
	}
	*ret = s;
	return 0;
fail:
	print_log_tail(&s);
	if (s.pid > 0) {
		(void)kill(s.pid, SIGKILL);
		(void)waitpid(s.pid, NULL, 0);
	}
	remove_dir(&s);
	return rc;
}

int bench_server_stop(struct bench_server *s, int64_t timeout_ms, bool show_log, char *err, size_t errlen)
{
	if (s->pid <= 0)
		return kvr_errf(err, errlen, -ECHILD, "kvringd is not running");
	int rc;
	if (kill(s->pid, SIGTERM) < 0) {
		rc = kvr_errf(err, errlen, -errno, "kill(kvringd %d, SIGTERM): %s", s->pid, strerror(errno));
		goto out;
	}
	uint64_t deadline = kvr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int status;
	for (;;) {
		pid_t w = waitpid(s->pid, &status, WNOHANG);
		if (w == s->pid)
			break;
		if (w < 0 && errno != EINTR) {
			rc = kvr_errf(err, errlen, -errno, "waitpid(kvringd): %s", strerror(errno));
			goto out;
		}
		if (kvr_now_ns() >= deadline) {
			(void)kill(s->pid, SIGKILL);
			(void)waitpid(s->pid, NULL, 0);
			rc = kvr_errf(err, errlen, -ETIMEDOUT, "kvringd did not exit within %lld ms of SIGTERM: killed",
				  (long long)timeout_ms);
			goto out;
		}
		struct timespec ts = {.tv_nsec = 10 * 1000000};
		nanosleep(&ts, NULL);
	}
	if (WIFEXITED(status)) {
		rc = WEXITSTATUS(status);
		if (rc)
			kvr_errf(err, errlen, rc, "kvringd exited with status %d", rc);
	} else {
		rc = kvr_errf(err, errlen, -EINTR, "kvringd was killed by signal %d (%s)", WTERMSIG(status),
			  strsignal(WTERMSIG(status)));
	}
out:
	s->pid = -1;
	if (rc || show_log)
		print_log_tail(s);
	remove_dir(s);
	return rc;
}
