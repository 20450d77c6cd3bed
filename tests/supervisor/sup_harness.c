/* Test harness for kvringd: temp instances, the real daemon from KVR_BUILD_ROOT, socket requests. */
#include "sup_harness.h"

#include <sys/mman.h>
#include <sys/prctl.h>

#include "kvr_geometry.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned inst_counter;

void h_build_path(char *buf, size_t len, const char *rel)
{
	const char *root = getenv("KVR_BUILD_ROOT");
	cr_assert(root, "KVR_BUILD_ROOT is not set (run through meson test)");
	snprintf(buf, len, "%s/%s", root, rel);
}

void h_init(struct h_inst *in, unsigned dir_mode)
{
	memset(in, 0, sizeof(*in));
	in->ro.fd = -1;
	/* mkdtemp, not pid + counter: a dir kept by a crashed earlier run under a recycled pid must not fail this one */
	snprintf(in->dir, sizeof(in->dir), "/tmp/kvr-sup-%u-XXXXXX", inst_counter++);
	cr_assert(mkdtemp(in->dir), "mkdtemp %s: %s", in->dir, strerror(errno));
	cr_assert(chmod(in->dir, dir_mode) == 0);
	snprintf(in->sock, sizeof(in->sock), "%s/run/kvring.sock", in->dir);
	snprintf(in->cfg, sizeof(in->cfg), "%s/kvring.json", in->dir);
	snprintf(in->log, sizeof(in->log), "%s/kvringd.log", in->dir);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	(void)remove(path);
	return 0;
}

void h_fini(struct h_inst *in)
{
	h_unmap(in);
	if (in->pid > 0) {
		(void)kill(in->pid, SIGKILL);
		(void)h_wait_exit(in->pid, 2000);
		in->pid = 0;
	}
	if (in->dir[0]) {
		if (getenv("KVR_KEEP_TEST_DIRS"))
			return;
		(void)nftw(in->dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
	}
}

void h_write_config_raw(struct h_inst *in, const char *json)
{
	FILE *f = fopen(in->cfg, "w");
	cr_assert(f, "cannot write %s", in->cfg);
	fputs(json, f);
	fclose(f);
}

void h_write_config_with(struct h_inst *in, const char *instance_extra, unsigned max_workers, const char *supervisor,
			 const char *sections)
{
	char json[8192];
	/* the model these tests were written for (h_attach_rank's), unless sections name one:
	 * since the embedded default has no model, a config without one binds at the first attach */
	bool model = sections && strstr(sections, "\"model\"");
	int n = snprintf(json, sizeof(json),
			 "{\n"
			 "  \"instance\": {\"socket\": \"%s\", \"max_workers\": %u, \"log_level\": \"info\"%s},\n"
			 "  \"rings\": {\"capacity\": 64},\n"
			 "  \"supervisor\": {%s}%s%s\n"
			 "}\n",
			 in->sock, max_workers, instance_extra ? instance_extra : "", supervisor, sections ? sections : "",
			 model ? "" : ",\n  \"model\": {\"preset\": \"qwen3-8b\"}");
	cr_assert(n > 0 && (size_t)n < sizeof(json), "test config longer than %zu bytes", sizeof(json));
	h_write_config_raw(in, json);
}

void h_write_config(struct h_inst *in, unsigned max_workers, const char *extra_instance, const char *extra_supervisor)
{
	char sup[1024];
	snprintf(sup, sizeof(sup), "%s%s", H_SUP_WATCH, extra_supervisor ? extra_supervisor : "");
	h_write_config_with(in, extra_instance, max_workers, sup,
			    ",\n  \"l1\": {\"capacity_bytes\": \"64MiB\", \"huge_pages\": false}");
}

pid_t h_spawn_kvringd(struct h_inst *in, const char *const *args)
{
	char exe[512];
	h_build_path(exe, sizeof(exe), "supervisor/kvringd");
	const char *argv[16] = {exe};
	unsigned n = 1;
	for (; args && *args && n < 15; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	pid_t parent = getpid();
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		/* kvringd drains and exits when the test process ends, even one that crashed or
		 * failed an assertion before its teardown: a test never leaks a daemon. */
		if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
			_exit(125);
		int fd = open(in->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	return pid;
}

int h_wait_exit(pid_t pid, int timeout_ms)
{
	for (int t = 0; t <= timeout_ms; t += 5) {
		int st;
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return st;
		if (r < 0)
			return -1;
		usleep(5000);
	}
	return -1;
}

char *h_read_file(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return strdup("");
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	char chunk[4096];
	size_t n;
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
		fwrite(chunk, 1, n, m);
	fclose(f);
	fclose(m);
	return buf;
}

unsigned h_count_files(const char *dir, const char *suffix)
{
	unsigned n = 0;
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	size_t sl = strlen(suffix);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (e->d_type == DT_DIR) {
			char sub[PATH_MAX];
			snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
			n += h_count_files(sub, suffix);
		} else {
			size_t l = strlen(e->d_name);
			n += l >= sl && !strcmp(e->d_name + l - sl, suffix);
		}
	}
	closedir(d);
	return n;
}

void h_flip_byte(const char *path, long off)
{
	FILE *f = fopen(path, "r+b");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	cr_assert_eq(fseek(f, off, SEEK_SET), 0);
	int c = fgetc(f);
	cr_assert_neq(c, EOF, "%s has no byte %ld", path, off);
	cr_assert_eq(fseek(f, off, SEEK_SET), 0);
	cr_assert_neq(fputc(c ^ 0x5a, f), EOF);
	cr_assert_eq(fclose(f), 0);
}

void h_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	cr_assert(fputs(text, f) >= 0);
	cr_assert_eq(fclose(f), 0);
}

bool h_log_contains(const struct h_inst *in, const char *s)
{
	char *text = h_read_file(in->log);
	bool found = strstr(text, s) != NULL;
	free(text);
	return found;
}

/* INSPECT's descriptors (the control segment, the slot table, every client area) into
 * fds[KVR_PROTO_MAX_FDS]; returns how many, or -errno. */
static int inspect_fds(const char *sock, int *fds)
{
	int fd = kvr_proto_connect(sock);
	if (fd < 0)
		return fd;
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_INSPECT};
	int rc = kvr_proto_send(fd, &req, offsetof(struct kvr_proto_req, payload), NULL, 0);
	static struct kvr_proto_rep rep;
	unsigned n_fds = 0;
	if (!rc) {
		ssize_t n = kvr_proto_recv(fd, &rep, sizeof(rep), fds, KVR_PROTO_MAX_FDS, &n_fds);
		rc = n < 0 ? (int)n : n == 0 ? -ECONNRESET : 0;
	}
	close(fd);
	if (rc)
		return rc;
	if (rep.status || n_fds < 1) {
		for (unsigned i = 0; i < n_fds; i++)
			close(fds[i]);
		return rep.status ? rep.status : -EPROTO;
	}
	return (int)n_fds;
}

int h_inspect_fd(const char *sock)
{
	int fds[KVR_PROTO_MAX_FDS];
	int n = inspect_fds(sock, fds);
	if (n < 0)
		return n;
	for (int i = 1; i < n; i++) /* the slot table and the client areas: not needed here */
		close(fds[i]);
	return fds[0];
}

void h_inspect_map(struct h_inst *in)
{
	h_unmap(in);
	int fds[KVR_PROTO_MAX_FDS];
	int n = inspect_fds(in->sock, fds);
	cr_assert(n >= 1, "INSPECT on %s failed: %s", in->sock, strerror(-n));
	struct stat st;
	cr_assert(fstat(fds[0], &st) == 0);
	in->ctl_ino = st.st_ino;
	in->ctl_dev = st.st_dev;
	/* fds: the control segment, the slot table, every client area in slot order */
	cr_assert_geq(n, 2, "INSPECT sent %d fds", n);
	int rc = kvr_ctl_map(fds[0], fds + 2, (unsigned)n - 2, 0, &in->ro); /* the areas over their places */
	for (int i = 0; i < n; i++)
		close(fds[i]);
	cr_assert(rc == 0, "map ctl read-only: %s", strerror(-rc));
	rc = kvr_ctl_attach(&in->ro, &in->ctl, NULL);
	cr_assert(rc == 0, "ctl attach: %s", strerror(-rc));
}

void h_unmap(struct h_inst *in)
{
	if (in->ro.base)
		kvr_segment_close(&in->ro);
	in->ro.fd = -1;
	in->ctl = NULL;
}

void h_start(struct h_inst *in)
{
	const char *args[] = {"--config", in->cfg, NULL};
	in->pid = h_spawn_kvringd(in, args);
	int fd = -1;
	bool up = H_WAIT((fd = h_inspect_fd(in->sock)) >= 0 || waitpid(in->pid, NULL, WNOHANG) != 0, 5000);
	char *log = h_read_file(in->log);
	cr_assert(up && fd >= 0, "kvringd did not come up on %s; log:\n%s", in->sock, log);
	free(log);
	close(fd);
	h_inspect_map(in);
	struct kvr_actor_ent *lk = h_actor(in, "lookup");
	cr_assert(lk);
	/* no model section: nothing starts before the first worker attaches (its L1 is not laid out) */
	if (!((struct kvr_ctl *)in->ctl)->arena_bytes)
		return;
	(void)H_WAIT(atomic_load(&lk->state) == KVR_ACTOR_READY || atomic_load(&lk->state) == KVR_ACTOR_FAILED, 3000);
}

int h_attach_rank(const char *sock, unsigned tp_size, unsigned rank, struct h_worker *w)
{
	memset(w, 0, sizeof(*w));
	/* A real worker's attach: the default model's geometry for this rank and a KV memfd. */
	struct kvr_geometry g;
	if (kvr_preset_geometry(kvr_preset_find("qwen3-8b"), tp_size, rank, 128, 2, &g))
		return -EINVAL;
	int kv = memfd_create("h-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (kv < 0 || ftruncate(kv, (off_t)kvr_geometry_kv_extent(&g)) < 0)
		return -errno;
	w->sock = kvr_proto_connect(sock);
	if (w->sock < 0) {
		close(kv);
		return w->sock;
	}
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_ATTACH,
				    .payload_len = sizeof(g)};
	memcpy(req.payload, &g, sizeof(g));
	int rc = kvr_proto_send(w->sock, &req, offsetof(struct kvr_proto_req, payload) + sizeof(g), &kv, 1);
	(void)rc; /* a refused peer may see EPIPE here: its reply is still readable */
	close(kv);
	static struct kvr_proto_rep rep;
	memset(&rep, 0, sizeof(rep));
	ssize_t n = kvr_proto_recv(w->sock, &rep, sizeof(rep), w->fds, KVR_PROTO_MAX_FDS, &w->n_fds);
	if (n <= 0)
		return n < 0 ? (int)n : -ECONNRESET;
	if (rep.magic != KVR_PROTO_MAGIC || rep.n_fds != w->n_fds)
		return -EPROTO;
	w->status = rep.status;
	w->worker = rep.worker;
	snprintf(w->reason, sizeof(w->reason), "%s", rep.reason);
	return 0;
}

int h_attach(const char *sock, struct h_worker *w)
{
	return h_attach_rank(sock, 1, 0, w);
}

void h_worker_close(struct h_worker *w)
{
	for (unsigned i = 0; i < w->n_fds; i++)
		close(w->fds[i]);
	w->n_fds = 0;
	if (w->sock >= 0)
		close(w->sock);
	w->sock = -1;
}

int h_actor_index(const struct kvr_ctl *c, const char *name)
{
	unsigned n = atomic_load(&((struct kvr_ctl *)c)->n_actors);
	for (unsigned i = 0; i < n; i++)
		if (strncmp(kvr_ctl_actor(c, i)->name, name, KVR_ACTOR_NAME_MAX) == 0)
			return (int)i;
	return -1;
}

struct kvr_actor_ent *h_actor(const struct h_inst *in, const char *name)
{
	int i = h_actor_index(in->ctl, name);
	return i < 0 ? NULL : kvr_ctl_actor(in->ctl, (unsigned)i);
}

/* Views handed out by the ring helpers: each test is its own process, the pool outlives it. */
static struct kvr_ring view_pool[256];
static unsigned view_pool_used;

static struct kvr_ring *view_of(const struct kvr_ctl *c, unsigned i)
{
	cr_assert_lt(view_pool_used, sizeof(view_pool) / sizeof(view_pool[0]), "ring view pool exhausted");
	struct kvr_ring *v = &view_pool[view_pool_used++];
	int rc = kvr_ctl_ring_view(c, i, v);
	cr_assert_eq(rc, 0, "ring %u does not validate: %d", i, rc);
	return v;
}

struct kvr_ring *h_ring(const struct kvr_ctl *c, const char *name)
{
	int i = kvr_ctl_find_ring(c, name);
	cr_assert(i >= 0, "no ring %s", name);
	return view_of(c, (unsigned)i);
}

uint64_t h_stat(const struct h_inst *in, const char *actor, unsigned s)
{
	int i = h_actor_index(in->ctl, actor);
	cr_assert(i >= 0);
	return atomic_load(&kvr_ctl_stats(in->ctl, (unsigned)i)->c[s]);
}

bool h_pid_alive(pid_t pid)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	char *st = h_read_file(p);
	/* "pid (comm) S ...": a zombie (Z) or a missing file is not alive */
	char *rp = strrchr(st, ')');
	bool alive = rp && rp[1] == ' ' && rp[2] && rp[2] != 'Z' && rp[2] != 'X';
	free(st);
	return alive;
}

int h_count_segment_users(ino_t ino, dev_t dev, char *who, size_t wholen)
{
	int users = 0;
	size_t off = 0;
	DIR *proc = opendir("/proc");
	cr_assert(proc);
	if (wholen)
		who[0] = 0;
	struct dirent *de;
	while ((de = readdir(proc))) {
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		bool uses = false;
		char p[300], link[512];
		snprintf(p, sizeof(p), "/proc/%ld/fd", pid);
		DIR *fdd = opendir(p);
		if (fdd) {
			struct dirent *fe;
			while (!uses && (fe = readdir(fdd))) {
				snprintf(p, sizeof(p), "/proc/%ld/fd/%s", pid, fe->d_name);
				ssize_t n = readlink(p, link, sizeof(link) - 1);
				if (n <= 0)
					continue;
				link[n] = 0;
				struct stat st;
				if (strstr(link, "memfd:kvring") && stat(p, &st) == 0 && st.st_ino == ino &&
				    st.st_dev == dev)
					uses = true;
			}
			closedir(fdd);
		}
		if (!uses) {
			/* a mapping without an fd: maps lines carry the inode */
			snprintf(p, sizeof(p), "/proc/%ld/maps", pid);
			char *maps = h_read_file(p);
			char pat[64];
			snprintf(pat, sizeof(pat), " %lu ", (unsigned long)ino);
			for (char *l = maps; l && *l && !uses;) {
				char *nl = strchr(l, '\n');
				if (nl)
					*nl = 0;
				if (strstr(l, "memfd:kvring") && strstr(l, pat))
					uses = true;
				l = nl ? nl + 1 : NULL;
			}
			free(maps);
		}
		if (uses) {
			users++;
			if (off < wholen)
				off += (size_t)snprintf(who + off, wholen - off, "%ld ", pid);
		}
	}
	closedir(proc);
	return users;
}

/* Open the daemon's own descriptor of memfd `name` (through /proc) with flags. */
int h_daemon_memfd(pid_t pid, const char *name, int flags)
{
	char dir[64], want[96];
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	snprintf(want, sizeof(want), "/memfd:%s ", name);
	DIR *d = opendir(dir);
	cr_assert(d, "open %s: %s", dir, strerror(errno));
	int fd = -1;
	struct dirent *de;
	while (fd < 0 && (de = readdir(d))) {
		char p[384], link[256];
		snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
		ssize_t n = readlink(p, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (strncmp(link, want, strlen(want)) == 0)
			fd = open(p, flags | O_CLOEXEC);
	}
	closedir(d);
	cr_assert(fd >= 0, "kvringd (pid %d) holds no memfd %s", (int)pid, name);
	return fd;
}

/* fd again, read-write (a new open of the memfd through /proc: its mode allows the owner) */
static int reopen_rw(int fd)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	int rw = open(p, O_RDWR | O_CLOEXEC);
	cr_assert_geq(rw, 0, "reopen %s read-write: %s", p, strerror(errno));
	return rw;
}

void h_daemon_ctl(const struct h_inst *in, int writable, struct kvr_segment *ret)
{
	int fds[KVR_PROTO_MAX_FDS];
	int n = inspect_fds(in->sock, fds);
	cr_assert_geq(n, 2, "INSPECT on %s: %s", in->sock, n < 0 ? strerror(-n) : "too few fds");
	for (int i = 0; writable && i < n; i++) {
		int rw = reopen_rw(fds[i]);
		close(fds[i]);
		fds[i] = rw;
	}
	int rc = kvr_ctl_map(fds[0], fds + 2, (unsigned)n - 2, writable, ret);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	cr_assert_eq(rc, 0, "map kvringd's control segment and its %d client areas: %s", n - 2, strerror(-rc));
}

void h_daemon_areas(const struct h_inst *in, int writable, struct kvr_segment *seg)
{
	int fds[KVR_PROTO_MAX_FDS];
	int n = inspect_fds(in->sock, fds);
	cr_assert_geq(n, 2, "INSPECT on %s: %s", in->sock, n < 0 ? strerror(-n) : "too few fds");
	for (int i = 2; i < n; i++) {
		int fd = writable ? reopen_rw(fds[i]) : fds[i];
		int rc = kvr_ctl_map_area(seg, (unsigned)i - 2, fd, writable);
		cr_assert_eq(rc, 0, "map client area %d again: %s", i - 2, strerror(-rc));
		if (fd != fds[i])
			close(fd);
	}
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

struct kvr_ctl *h_worker_map(const struct h_worker *w, struct kvr_segment *ret)
{
	cr_assert_eq(w->n_fds, 2, "an attach reply carries the control segment and the client's area");
	cr_assert_eq(kvr_segment_map(w->fds[0], KVR_SEG_CTL, 0, ret), 0, "map the control segment read-only");
	int rc = kvr_ctl_map_area(ret, w->worker, w->fds[1], 1);
	cr_assert_eq(rc, 0, "map the client area: %s", strerror(-rc));
	struct kvr_ctl *c;
	rc = kvr_ctl_attach_client(ret, w->worker, &c, NULL);
	cr_assert_eq(rc, 0, "attach as client %u: %s", w->worker, strerror(-rc));
	return c;
}
