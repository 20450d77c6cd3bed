/* l2perm tests: block files 0600 and the namespace directory 0700 whatever the umask and whatever was there
 * before (fixed at open and adoption), read-only changes no mode, and what is not ours to change is refused. */
#include <criterion/criterion.h>

#include <sys/wait.h>

#include "disk_test.h"

#define LANE_BYTES 20000u
#define N_SLOTS 16
#define QD 8
#define NOBODY 65534

static char root[128];
static struct dt_arena arena;
static struct kvr_l2_store *s;

static const struct kvr_l2_ident ID = {
	.ns = {0x7777, 0x8888},
	.fingerprint = {0xabcd, 0xef01},
	.block_tokens = 16,
	.lane_bytes = LANE_BYTES,
};

static void setup(void)
{
	cr_assert_not_null(dt_mkdtemp("l2perm", root)); /* 0755, as an operator's directory often is */
	cr_assert_eq(dt_arena_new(N_SLOTS, LANE_BYTES, &arena), 0);
}

static void teardown(void)
{
	kvr_l2_store_close(s);
	s = NULL;
	dt_arena_free(&arena);
	dt_rmrf(root);
	umask(022);
}

TestSuite(l2perm, .init = setup, .fini = teardown);

static struct kvr_l2_store_config config(kvr_key ns, enum kvr_l2_durability dur)
{
	struct kvr_l2_ident id = ID;
	id.ns = ns;
	return (struct kvr_l2_store_config){
		.root = root,
		.ident = id,
		.lanes = 2,
		.capacity_bytes = 100 * kvr_l2_file_bytes(LANE_BYTES),
		.queue_depth = QD,
		.durability = dur,
		.io_mode = KVR_L2_IO_AUTO,
		DT_ARENA_CFG(arena),
	};
}

static kvr_key K(unsigned i)
{
	return dt_key(43, i);
}

/* Put blocks [first, first + n) (pattern seed 3) and wait for every completion. */
static void put_n(struct kvr_l2_store *st, unsigned first, unsigned n)
{
	for (unsigned i = first; i < first + n; i++) {
		uint8_t *src = dt_slot(&arena, i % (N_SLOTS - 1));
		struct kvr_l2_done d;
		dt_fill(src, LANE_BYTES, K(i), 0, 3);
		cr_assert_eq(kvr_l2_store_put(st, K(i), 0, src, i), 0);
		cr_assert_eq(kvr_l2_store_poll(st, &d, 1, 1), 1);
		cr_assert_eq(d.res, 0, "put %u: %s", i, strerror(-d.res));
	}
}

/* Block i is served byte for byte. */
static void get_ok(struct kvr_l2_store *st, unsigned i)
{
	uint8_t *dst = dt_slot(&arena, N_SLOTS - 1);
	struct kvr_l2_done d;
	memset(dst, 0xcc, arena.slot_bytes);
	cr_assert_eq(kvr_l2_store_get(st, K(i), 0, dst, 1), 0);
	cr_assert_eq(kvr_l2_store_poll(st, &d, 1, 1), 1);
	cr_assert_eq(d.res, 0, "get %u: %s", i, kvr_l2_reason_name(d.reason));
	cr_assert_eq(dt_check(dst, LANE_BYTES, K(i), 0, 3), 0, "block %u byte-exact", i);
}

static mode_t mode_of(const char *path)
{
	struct stat st;
	cr_assert_eq(lstat(path, &st), 0, "stat %s: %s", path, strerror(errno));
	return st.st_mode & 07777;
}

/* The namespace directory has mode dir_mode; the lock file and every block file file_mode; there are
 * want_files block files and no temporary ones. Entries that are not ours are not looked at. */
static void assert_modes(const char *dir, mode_t dir_mode, mode_t file_mode, unsigned want_files, const char *when)
{
	char p[512];
	unsigned files = 0;
	cr_assert_eq(mode_of(dir), dir_mode, "%s: namespace directory has mode %04o, want %04o", when,
		     (unsigned)mode_of(dir), (unsigned)dir_mode);
	DIR *d = opendir(dir);
	cr_assert_not_null(d);
	struct dirent *de;
	while ((de = readdir(d))) {
		kvr_key k;
		uint32_t lane;
		bool block = kvr_l2_name_parse(de->d_name, &k, &lane) == 0;
		cr_assert(!kvr_l2_is_tmp_name(de->d_name), "%s: a temporary file is left: %s", when, de->d_name);
		if (!block && strcmp(de->d_name, KVR_L2_LOCK_NAME))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
		cr_assert_eq(mode_of(p), file_mode, "%s: %s has mode %04o, want %04o", when, de->d_name,
			     (unsigned)mode_of(p), (unsigned)file_mode);
		files += block;
	}
	closedir(d);
	cr_assert_eq(files, want_files, "%s: %u block files", when, files);
}

/* Created by the store: the namespace directory 0700, the lock and every file written 0600, under the usual
 * umask (022, which made them 0755 / 0644 before), none at all, a group-friendly one and a strict one; the
 * renames of every durability keep the mode (BATCH renames through a hard-linked chain). */
Test(l2perm, created_modes_whatever_the_umask)
{
	static const struct {
		mode_t umask;
		enum kvr_l2_durability dur;
	} cases[] = {
		{022, KVR_L2_DUR_NONE}, {0, KVR_L2_DUR_NONE}, {002, KVR_L2_DUR_BLOCK}, {077, KVR_L2_DUR_BATCH},
		{0, KVR_L2_DUR_BATCH},
	};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char when[64], dir[256];
		struct kvr_l2_adopt_stats a;
		umask(cases[i].umask);
		struct kvr_l2_store_config cfg = config((kvr_key){0x100 + i, 0x200}, cases[i].dur);
		s = dt_store_open(&cfg, &a);
		snprintf(dir, sizeof(dir), "%s", kvr_l2_store_dir(s));
		cr_assert(!a.dir_mode_fixed, "umask %04o: a new directory is made 0700", (unsigned)cases[i].umask);
		snprintf(when, sizeof(when), "umask %04o, after open", (unsigned)cases[i].umask);
		assert_modes(dir, 0700, 0600, 0, when);
		put_n(s, 0, 5);
		cr_assert_eq(kvr_l2_store_flush(s), 0);
		snprintf(when, sizeof(when), "umask %04o, after writes", (unsigned)cases[i].umask);
		assert_modes(dir, 0700, 0600, 5, when);
		kvr_l2_store_close(s);
		s = NULL;
		cr_assert_eq(mode_of(root), 0755, "the root is the operator's: not changed");
	}
}

/* A store of n blocks written with cfg, closed, then its namespace dir set to dir_mode, its
 * lock file to 0644 and block i's file to file_modes[i]: what an older kvringd or another
 * umask left. The namespace dir's path in dir. */
static void store_then_widen(const struct kvr_l2_store_config *cfg, char *dir, size_t dirlen, unsigned n,
			     mode_t dir_mode, const mode_t *file_modes)
{
	char p[512];
	s = dt_store_open(cfg, NULL);
	put_n(s, 0, n);
	snprintf(dir, dirlen, "%s", kvr_l2_store_dir(s));
	kvr_l2_store_close(s);
	s = NULL;
	cr_assert_eq(chmod(dir, dir_mode), 0);
	snprintf(p, sizeof(p), "%s/%s", dir, KVR_L2_LOCK_NAME);
	cr_assert_eq(chmod(p, 0644), 0);
	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(chmod(dt_path(dir, K(i), 0, p), file_modes[i]), 0);
}

/* A store an older kvring left readable by everyone (a 0755 namespace directory, 0644 files, one setgid
 * bit and assorted other modes): opened under umask 022, every mode is 0700 / 0600 before anything is
 * served, the change counted (and logged), every block still adopted and served; new writes are 0600; a
 * second open changes nothing. A foreign file is left alone, mode included. */
Test(l2perm, existing_wider_modes_fixed_at_open)
{
	static const mode_t file_modes[] = {0644, 0666, 0640, 0604, 0400, 0700, 0600};
	enum { N = sizeof(file_modes) / sizeof(file_modes[0]) };
	char dir[256], p[512];
	struct kvr_l2_store_config cfg = config(ID.ns, KVR_L2_DUR_NONE);
	store_then_widen(&cfg, dir, sizeof(dir), N, 02755, file_modes);
	snprintf(p, sizeof(p), "%s/notes.txt", dir);
	cr_assert_eq(dt_write_file(p, "hello", 5), 0);
	cr_assert_eq(chmod(p, 0644), 0);

	umask(022);
	struct kvr_l2_adopt_stats a;
	s = dt_store_open(&cfg, &a);
	cr_assert(a.dir_mode_fixed);
	cr_assert_eq(a.dir_mode_was, 02755);
	cr_assert_eq(a.modes_fixed, N - 1, "every file not 0600 was set to 0600 (%llu)",
		     (unsigned long long)a.modes_fixed);
	cr_assert_eq(a.adopted, N);
	for (unsigned r = 0; r < KVR_L2_R_MAX; r++)
		cr_assert_eq(a.rejected[r], r == KVR_L2_R_FOREIGN ? 1u : 0u, "reason %s: %llu", kvr_l2_reason_name(r),
			     (unsigned long long)a.rejected[r]);
	assert_modes(dir, 0700, 0600, N, "after open");
	cr_assert_eq(mode_of(p), 0644, "notes.txt is not ours: left alone");
	for (unsigned i = 0; i < N; i++)
		get_ok(s, i);
	put_n(s, N, 3);
	cr_assert_eq(kvr_l2_store_flush(s), 0);
	assert_modes(dir, 0700, 0600, N + 3, "after new writes");
	kvr_l2_store_close(s);
	s = NULL;

	s = dt_store_open(&cfg, &a);
	cr_assert(!a.dir_mode_fixed);
	cr_assert_eq(a.modes_fixed, 0);
	cr_assert_eq(a.adopted, N + 3);
	assert_modes(dir, 0700, 0600, N + 3, "after a second open");
}

/* l2.read_only never changes the disk, modes included: a 0755 / 0644 store is served as it is. */
Test(l2perm, read_only_changes_no_mode)
{
	char dir[256];
	struct kvr_l2_store_config cfg = config(ID.ns, KVR_L2_DUR_NONE);
	static const mode_t wide[] = {0644, 0644, 0644};
	store_then_widen(&cfg, dir, sizeof(dir), 3, 0755, wide);

	cfg.read_only = true;
	struct kvr_l2_adopt_stats a;
	s = dt_store_open(&cfg, &a);
	cr_assert_eq(a.adopted, 3);
	cr_assert(!a.dir_mode_fixed);
	cr_assert_eq(a.modes_fixed, 0);
	for (unsigned i = 0; i < 3; i++)
		get_ok(s, i);
	assert_modes(dir, 0755, 0644, 3, "read-only");
}

/* Run fn as uid/gid NOBODY in a child; its int result comes back (or -ECHILD when it could not run). */
static int as_nobody(int (*fn)(void *), void *arg)
{
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int rc = -ECHILD;
		close(fds[0]);
		if (setgid(NOBODY) == 0 && setuid(NOBODY) == 0)
			rc = fn(arg);
		if (write(fds[1], &rc, sizeof(rc)) != sizeof(rc))
			_exit(2);
		_exit(0);
	}
	close(fds[1]);
	int rc = -ECHILD, status;
	cr_assert_eq(read(fds[0], &rc, sizeof(rc)), (ssize_t)sizeof(rc));
	close(fds[0]);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return rc;
}

struct nobody_open {
	struct kvr_l2_store_config cfg;
	struct kvr_l2_adopt_stats a;
	int fd;                       /* a pipe end the child writes the adoption stats to */
};

static int open_as_nobody(void *arg)
{
	struct nobody_open *o = arg;
	struct kvr_l2_store *st = NULL;
	int rc = kvr_l2_store_open(&o->cfg, &o->a, &st);
	if (write(o->fd, &o->a, sizeof(o->a)) != (ssize_t)sizeof(o->a))
		rc = -EIO;
	kvr_l2_store_close(st);
	return rc;
}

/* Stats of an open run as NOBODY: its return and its adoption counts. */
static int open_nobody(const struct kvr_l2_store_config *cfg, struct kvr_l2_adopt_stats *ret)
{
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	struct nobody_open o = {.cfg = *cfg, .fd = fds[1]};
	o.cfg.arena = NULL; /* no registered buffers: NOBODY's RLIMIT_MEMLOCK is not the point here */
	o.cfg.arena_bytes = o.cfg.arena_data_off = o.cfg.slot_bytes = 0;
	int rc = as_nobody(open_as_nobody, &o);
	close(fds[1]);
	memset(ret, 0, sizeof(*ret));
	cr_assert_eq(read(fds[0], ret, sizeof(*ret)), (ssize_t)sizeof(*ret));
	close(fds[0]);
	return rc;
}

static void chown_path(const char *path, uid_t uid)
{
	cr_assert_eq(lchown(path, uid, uid), 0, "chown %s: %s", path, strerror(errno));
}

/* What the store cannot make private is not served: a block file of another uid (its mode cannot be set)
 * is not adopted but removed, reason MODE; a namespace directory of another uid wider than 0700 fails the
 * open with -EACCES and is left as it is. Needs root (to make files of two uids). */
Test(l2perm, not_ours_is_refused)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to create files of another uid");
	char dir[256], p[512];
	struct kvr_l2_store_config cfg = config(ID.ns, KVR_L2_DUR_NONE);
	s = dt_store_open(&cfg, NULL);
	put_n(s, 0, 3);
	snprintf(dir, sizeof(dir), "%s", kvr_l2_store_dir(s));
	kvr_l2_store_close(s);
	s = NULL;
	/* the store is NOBODY's, but block 2 is root's and readable by everyone */
	chown_path(dir, NOBODY);
	snprintf(p, sizeof(p), "%s/%s", dir, KVR_L2_LOCK_NAME);
	chown_path(p, NOBODY);
	for (unsigned i = 0; i < 2; i++) {
		chown_path(dt_path(dir, K(i), 0, p), NOBODY);
		cr_assert_eq(chmod(p, 0644), 0);
	}
	cr_assert_eq(chmod(dt_path(dir, K(2), 0, p), 0644), 0);

	struct kvr_l2_adopt_stats a;
	int rc = open_nobody(&cfg, &a);
	cr_assert_eq(rc, 0, "open as nobody: %s", strerror(-rc));
	cr_assert_eq(a.adopted, 2);
	cr_assert_eq(a.modes_fixed, 2);
	cr_assert_eq(a.rejected[KVR_L2_R_MODE], 1);
	cr_assert_eq(a.deleted, 1);
	cr_assert(!dt_exists(dir, strrchr(dt_path(dir, K(2), 0, p), '/') + 1), "root's 0644 file is removed");
	assert_modes(dir, 0700, 0600, 2, "after nobody's open");

	/* a namespace directory that is root's, 0755, with a lock file nobody may open */
	chown_path(dir, 0);
	cr_assert_eq(chmod(dir, 0755), 0);
	rc = open_nobody(&cfg, &a);
	cr_assert_eq(rc, -EACCES, "open as nobody: %d %s", rc, strerror(-rc));
	cr_assert_eq(mode_of(dir), 0755, "not ours: not changed");
}

DT_MAIN_NEEDS_URING
