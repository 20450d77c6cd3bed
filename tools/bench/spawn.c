/* kvring-bench --spawn: run kvringd from the build tree on a generated config, then stop it and check its exit. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "json_writer.h"
#include "kvr_log.h"
#include "kvr_proto.h"
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
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	struct kvr_jw w;
	kvr_jw_init(&w, f, KVR_JW_TABS);
	kvr_jw_object(&w, NULL);
	kvr_jw_object(&w, "instance");
	kvr_jw_str(&w, "socket", socket);
	/* a cross-layout run attaches every rank twice; a slot is freed once its gather actor exited */
	bool relayout = pl->ld.dcp != pl->st.dcp || pl->ld.interleave != pl->st.interleave;
	kvr_jw_u64(&w, "max_workers", relayout ? 2 * o->tp : o->tp);
	kvr_jw_end(&w);
	if (!o->no_model) { /* --no-model: L1 laid out for the first rank that attaches */
		kvr_jw_object(&w, "model");
		kvr_jw_str(&w, "preset", o->model);
		kvr_jw_u64(&w, "block_tokens", o->block_tokens);
		/* the canonical block: MLA as without DCP; MHA's tp_size is the number of lanes, tp / dcp */
		kvr_jw_u64(&w, "tp_size", pl->preset->attention == KVR_ATTN_MLA ? o->tp : pl->lanes);
		kvr_jw_end(&w);
	}
	kvr_jw_object(&w, "l1");
	kvr_jw_u64(&w, "capacity_bytes", cap);
	kvr_jw_end(&w);
	if (o->evict) { /* L2 beside the socket: <tmpdir>/l2, twice the workload */
		char dir[PATH_MAX];
		snprintf(dir, sizeof(dir), "%s", socket);
		char *slash = strrchr(dir, '/');
		if (slash)
			snprintf(slash, sizeof(dir) - (size_t)(slash - dir), "/l2");
		kvr_jw_object(&w, "l2");
		kvr_jw_array(&w, "dirs");
		kvr_jw_str(&w, NULL, dir);
		kvr_jw_end(&w);
		kvr_jw_u64(&w, "capacity_bytes", pl->unique_bytes * 2 + (64u << 20));
		kvr_jw_str(&w, "durability", "none");
		kvr_jw_end(&w);
	}
	if (o->n_remote) {
		kvr_jw_object(&w, "remote");
		kvr_jw_array(&w, "cluster");
		for (uint32_t i = 0; i < o->n_remote; i++)
			kvr_jw_str(&w, NULL, o->remote_seed[i]);
		kvr_jw_end(&w);
		kvr_jw_u64(&w, "timeout_ms", BENCH_REMOTE_TIMEOUT_MS);
		kvr_jw_u64(&w, "max_inflight", o->remote_inflight);
		kvr_jw_end(&w);
	}
	kvr_jw_object(&w, "metrics");
	kvr_jw_bool(&w, "enabled", false);
	kvr_jw_end(&w);
	kvr_jw_end(&w);
	int rc = kvr_jw_finish(&w);
	if (fclose(f) != 0 || rc) {
		free(text);
		return NULL;
	}
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
		fprintf(stderr, "kvring-bench: %s log (%s), last lines:\n%s%s", s->name, s->log, buf,
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

int bench_server_start(const struct bench_opts *o, const struct bench_plan *pl, const char *name,
		       struct bench_server *ret, char *err, size_t errlen)
{
	struct bench_server s = {.pid = -1, .ctl_seg = {.fd = -1}};
	snprintf(s.name, sizeof(s.name), "%s", name);
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
			rc = kvr_errf(err, errlen, -ECHILD, "%s exited during start-up (%s %d)", s.name,
				  WIFEXITED(status) ? "status" : "signal",
				  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			goto fail;
		}
		if (kvr_now_ns() >= deadline) {
			rc = kvr_errf(err, errlen, -ETIMEDOUT, "%s did not create %s within %llu s", s.name, s.socket,
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
		return kvr_errf(err, errlen, -ECHILD, "%s is not running", s->name);
	int rc;
	if (kill(s->pid, SIGTERM) < 0) {
		rc = kvr_errf(err, errlen, -errno, "kill(%s %d, SIGTERM): %s", s->name, s->pid, strerror(errno));
		goto out;
	}
	if (s->ctl_seg.base)
		kvr_segment_close(&s->ctl_seg);
	s->ctl = NULL;
	uint64_t deadline = kvr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int status;
	for (;;) {
		pid_t w = waitpid(s->pid, &status, WNOHANG);
		if (w == s->pid)
			break;
		if (w < 0 && errno != EINTR) {
			rc = kvr_errf(err, errlen, -errno, "waitpid(%s): %s", s->name, strerror(errno));
			goto out;
		}
		if (kvr_now_ns() >= deadline) {
			(void)kill(s->pid, SIGKILL);
			(void)waitpid(s->pid, NULL, 0);
			rc = kvr_errf(err, errlen, -ETIMEDOUT, "%s did not exit within %lld ms of SIGTERM: killed", s->name,
				  (long long)timeout_ms);
			goto out;
		}
		struct timespec ts = {.tv_nsec = 10 * 1000000};
		nanosleep(&ts, NULL);
	}
	if (WIFEXITED(status)) {
		rc = WEXITSTATUS(status);
		if (rc)
			kvr_errf(err, errlen, rc, "%s exited with status %d", s->name, rc);
	} else {
		rc = kvr_errf(err, errlen, -EINTR, "%s was killed by signal %d (%s)", s->name, WTERMSIG(status),
			  strsignal(WTERMSIG(status)));
	}
out:
	s->pid = -1;
	if (rc || show_log)
		print_log_tail(s);
	remove_dir(s);
	return rc;
}

int bench_server_ctl(struct bench_server *s, char *err, size_t errlen)
{
	if (s->ctl)
		return 0;
	/* the socket's file exists from bind(), a moment before listen(): refused until then */
	uint64_t deadline = kvr_now_ns() + START_TIMEOUT_NS;
	int sock;
	while ((sock = kvr_proto_connect(s->socket)) == -ECONNREFUSED && kvr_now_ns() < deadline) {
		struct timespec ts = {.tv_nsec = 10 * 1000000};
		nanosleep(&ts, NULL);
	}
	if (sock < 0)
		return kvr_errf(err, errlen, sock, "%s: connect %s: %s", s->name, s->socket, strerror(-sock));
	struct timeval tv = {.tv_sec = 5};
	(void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_INSPECT};
	static struct kvr_proto_rep rep; /* large: not on the stack */
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds = 0;
	int rc = kvr_proto_send(sock, &req, offsetof(struct kvr_proto_req, payload), NULL, 0);
	ssize_t n = rc ? rc : kvr_proto_recv(sock, &rep, sizeof(rep), fds, KVR_PROTO_MAX_FDS, &n_fds);
	close(sock);
	if (n <= 0)
		return kvr_errf(err, errlen, n ? (int)n : -ECONNRESET, "%s: INSPECT: %s", s->name,
				n ? strerror((int)-n) : "connection closed without a reply");
	if ((size_t)n < offsetof(struct kvr_proto_rep, payload) || rep.magic != KVR_PROTO_MAGIC ||
	    rep.version != KVR_PROTO_VERSION)
		rc = kvr_errf(err, errlen, -EPROTO, "%s: INSPECT: not a kvring protocol reply", s->name);
	else if (rep.status < 0 || n_fds < 1)
		rc = kvr_errf(err, errlen, rep.status < 0 ? rep.status : -EPROTO, "%s: INSPECT refused: %s", s->name,
			      rep.status < 0 ? strerror(-rep.status) : "no control segment");
	else if ((rc = kvr_ctl_map(fds[0], fds + 2, n_fds >= 2 ? n_fds - 2 : 0, 0, &s->ctl_seg)))
		kvr_errf(err, errlen, rc, "%s: map the control segment: %s", s->name, strerror(-rc));
	else if ((rc = kvr_ctl_attach(&s->ctl_seg, &s->ctl, NULL))) {
		kvr_errf(err, errlen, rc, "%s: the control segment does not validate: %s", s->name, strerror(-rc));
		kvr_segment_close(&s->ctl_seg);
		s->ctl = NULL;
	}
	for (unsigned i = 0; i < n_fds; i++)
		close(fds[i]);
	return rc;
}

uint64_t bench_server_stat(const struct bench_server *s, const char *actor, unsigned stat)
{
	if (!s->ctl || stat >= KVR_STAT_MAX)
		return 0;
	unsigned n = atomic_load(&s->ctl->n_actors);
	for (unsigned i = 0; i < n && i < s->ctl->max_actors; i++)
		if (!strncmp(kvr_ctl_actor(s->ctl, i)->name, actor, KVR_ACTOR_NAME_MAX))
			return atomic_load(&kvr_ctl_stats(s->ctl, i)->c[stat]);
	return 0;
}
