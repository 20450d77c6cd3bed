/* Filesystems the test mounts: a 1 MiB tmpfs (a write fails cleanly with -ENOSPC, temp file removed, nothing under
 * a real name, earlier blocks intact; also with joined transfers, whose short write resumes in separate steps)
 * and ramfs (no O_DIRECT: AUTO falls back to buffered I/O). 77: cannot mount. */
#include <criterion/criterion.h>

#include "disk_test.h"

static char dir[256];
static int dir_fd = -1;
static struct dt_arena arena;

static void setup(void)
{
	static int n;
	/* Criterion runs each test in a re-executed worker: the mount point comes by environment */
	const char *m = getenv("KVR_L2FULL_MNT");
	cr_assert(m && *m, "KVR_L2FULL_MNT is set by main()");
	snprintf(dir, sizeof(dir), "%s/t%d-%d", m, (int)getpid(), n++);
	cr_assert_eq(mkdir(dir, 0755), 0, "mkdir %s: %s", dir, strerror(errno));
	dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cr_assert_geq(dir_fd, 0);
	cr_assert_eq(dt_arena_new(4, 2u << 20, &arena), 0);
}

static void teardown(void)
{
	if (dir_fd >= 0)
		close(dir_fd);
	dir_fd = -1;
	dt_arena_free(&arena);
	dt_rmrf(dir);
}

TestSuite(l2full, .init = setup, .fini = teardown);

static void engine_enospc(enum kvr_l2_iomode mode, bool join)
{
	if (mode == KVR_L2_IO_DIRECT && kvr_l2io_probe_direct(dir_fd) != 1)
		cr_skip_test("this tmpfs does not take O_DIRECT (kernel < 6.6)");
	struct kvr_l2io_config cfg = {
		.dir_fd = dir_fd,
		.ident = {.ns = {1, 2}, .fingerprint = {3, 4}, .block_tokens = 16, .lane_bytes = 2u << 20},
		.queue_depth = 4,
		.durability = KVR_L2_DUR_BLOCK,
		.io_mode = mode,
		.join_header = join,
		DT_ARENA_CFG(arena),
	};
	struct kvr_l2io *io = NULL;
	cr_assert_eq(kvr_l2io_open(&cfg, &io), 0);
	dt_fill(dt_slot(&arena, 0), 2u << 20, dt_key(1, 0), 0, 1);
	cr_assert_eq(kvr_l2io_write(io, dt_key(1, 0), 0, dt_slot(&arena, 0), 7), 0);
	struct kvr_l2io_done d;
	cr_assert_eq(kvr_l2io_reap(io, &d, 1, 1), 1);
	cr_assert_eq(d.res, -ENOSPC, "a 2 MiB block on a 1 MiB disk: %d (%s)", d.res, strerror(-d.res));
	cr_assert_eq(d.reason, KVR_L2_R_IO);
	struct kvr_l2io_stats st;
	kvr_l2io_stats(io, &st);
	cr_assert_eq(st.cleanups, 1);
	cr_assert_eq(st.failed[KVR_L2IO_WRITE], 1);
	fprintf(stderr, "enospc (%s%s): %llu short writes resumed\n", mode == KVR_L2_IO_DIRECT ? "direct" : "buffered",
		join ? ", joined" : "", (unsigned long long)st.resumed);
	if (join && mode == KVR_L2_IO_DIRECT) {
		/* header and payload went out as one writev that the full disk cut short (4 KiB
		 * + 2 MiB into 1 MiB); the rest resumed in the separate steps and failed there */
		cr_assert_eq(st.joined_ios, 1, "one joined transfer, the first: %llu", (unsigned long long)st.joined_ios);
		cr_assert_geq(st.resumed, 1, "the short joined write resumed");
	} else {
		cr_assert_eq(st.joined_ios, 0);
	}
	struct dt_listing l = dt_list(dir);
	cr_assert_eq(l.real, 0, "nothing under a real name");
	cr_assert_eq(l.tmp, 0, "the temporary file is removed");
	cr_assert_eq(l.other, 0);
	kvr_l2io_close(io);
}

Test(l2full, engine_direct) { engine_enospc(KVR_L2_IO_DIRECT, false); }
Test(l2full, engine_buffered) { engine_enospc(KVR_L2_IO_BUFFERED, false); }
Test(l2full, engine_direct_joined) { engine_enospc(KVR_L2_IO_DIRECT, true); }

static void store_fills_up(enum kvr_l2_iomode mode, bool join)
{
	if (mode == KVR_L2_IO_DIRECT && kvr_l2io_probe_direct(dir_fd) != 1)
		cr_skip_test("this tmpfs does not take O_DIRECT (kernel < 6.6)");
	const uint64_t lane = 256u << 10; /* 260 KiB files: 3 fit in 1 MiB, the 4th does not */
	struct kvr_l2_store_config cfg = {
		.root = dir,
		.ident = {.ns = {5, 6}, .fingerprint = {7, 8}, .block_tokens = 16, .lane_bytes = lane},
		.lanes = 1,
		.capacity_bytes = 1ull << 30, /* the cap is not what stops it: the disk is */
		.queue_depth = 4,
		.durability = KVR_L2_DUR_BATCH,
		.io_mode = mode,
		.join_header = join,
		DT_ARENA_CFG(arena),
	};
	struct kvr_l2_store *s = NULL;
	cr_assert_eq(kvr_l2_store_open(&cfg, NULL, &s), 0);
	struct kvr_l2_done d;
	unsigned ok = 0;
	int res = 0;
	for (unsigned i = 0; i < 8 && res == 0; i++) {
		dt_fill(dt_slot(&arena, 0), lane, dt_key(2, i), 0, 3);
		cr_assert_eq(kvr_l2_store_put(s, dt_key(2, i), 0, dt_slot(&arena, 0), i), 0);
		cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 1), 1);
		res = d.res;
		ok += res == 0;
	}
	cr_assert_eq(res, -ENOSPC, "the disk fills up: %s", strerror(-res));
	cr_assert_eq(ok, 3);
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.files, 3);
	cr_assert_eq(st.used_bytes, 3 * kvr_l2_file_bytes(lane), "the failed write holds no bytes");
	cr_assert_eq(st.writing_bytes, 0);
	cr_assert_eq(st.puts_failed, 1);
	struct dt_listing l = dt_list(kvr_l2_store_dir(s));
	cr_assert_eq(l.real, 3);
	cr_assert_eq(l.tmp, 0, "the failed write's temporary file is gone");
	cr_assert(!kvr_l2_store_contains(s, dt_key(2, 3), 0));
	/* the earlier blocks are intact */
	for (unsigned i = 0; i < 3; i++) {
		cr_assert_eq(kvr_l2_store_get(s, dt_key(2, i), 0, dt_slot(&arena, 1), i), 0);
		cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 1), 1);
		cr_assert_eq(d.res, 0);
		cr_assert_eq(dt_check(dt_slot(&arena, 1), lane, dt_key(2, i), 0, 3), 0);
	}
	/* room again after a removal */
	cr_assert_eq(kvr_l2_store_remove(s, dt_key(2, 0), 0), 0);
	cr_assert_eq(kvr_l2_store_flush(s), 0);
	dt_fill(dt_slot(&arena, 0), lane, dt_key(2, 3), 0, 3);
	cr_assert_eq(kvr_l2_store_put(s, dt_key(2, 3), 0, dt_slot(&arena, 0), 9), 0);
	cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 1), 1);
	cr_assert_eq(d.res, 0);
	/* the block written into the freed room reads back exact */
	cr_assert_eq(kvr_l2_store_get(s, dt_key(2, 3), 0, dt_slot(&arena, 1), 10), 0);
	cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 1), 1);
	cr_assert_eq(d.res, 0);
	cr_assert_eq(dt_check(dt_slot(&arena, 1), lane, dt_key(2, 3), 0, 3), 0);
	kvr_l2_store_stats(s, &st);
	/* joined (O_DIRECT): 4 writes whole + the one the disk stopped + 4 reads, one transfer each */
	cr_assert_eq(st.io.joined_ios, join && st.direct ? 9 : 0, "joined transfers: %llu",
		     (unsigned long long)st.io.joined_ios);
	kvr_l2_store_close(s);
}

Test(l2full, store_direct) { store_fills_up(KVR_L2_IO_DIRECT, false); }
Test(l2full, store_buffered) { store_fills_up(KVR_L2_IO_BUFFERED, false); }
Test(l2full, store_direct_joined) { store_fills_up(KVR_L2_IO_DIRECT, true); }

/* ---- ramfs: no O_DIRECT ---------------------------------------------------------------- */

static char rdir[256];

static void rsetup(void)
{
	static int n;
	const char *m = getenv("KVR_L2RAMFS_MNT");
	if (!m || !*m)
		cr_skip_test("ramfs could not be mounted");
	snprintf(rdir, sizeof(rdir), "%s/t%d-%d", m, (int)getpid(), n++);
	cr_assert_eq(mkdir(rdir, 0755), 0);
	cr_assert_eq(dt_arena_new(4, 20000, &arena), 0);
}

static void rteardown(void)
{
	dt_arena_free(&arena);
	dt_rmrf(rdir);
}

TestSuite(l2ramfs, .init = rsetup, .fini = rteardown);

Test(l2ramfs, auto_falls_back_to_buffered)
{
	cr_assert_eq(dt_direct_ok(rdir), 0, "ramfs refuses O_DIRECT");
	struct dt_listing l = dt_list(rdir);
	cr_assert_eq(l.real + l.tmp + l.other, 0, "the probe leaves nothing behind (ramfs creates, then refuses)");
	struct kvr_l2_store_config cfg = {
		.root = rdir,
		.ident = {.ns = {9, 9}, .fingerprint = {1, 1}, .block_tokens = 16, .lane_bytes = 20000},
		.lanes = 1,
		.capacity_bytes = 1 << 20,
		.queue_depth = 4,
		.durability = KVR_L2_DUR_BATCH,
		.io_mode = KVR_L2_IO_AUTO,
		DT_ARENA_CFG(arena),
	};
	struct kvr_l2_store *s = NULL;
	cr_assert_eq(kvr_l2_store_open(&cfg, NULL, &s), 0);
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert(!st.direct, "AUTO fell back to buffered I/O");
	struct kvr_l2_done d;
	for (unsigned i = 0; i < 3; i++) {
		dt_fill(dt_slot(&arena, i), 20000, dt_key(3, i), 0, 3);
		cr_assert_eq(kvr_l2_store_put(s, dt_key(3, i), 0, dt_slot(&arena, i), i), 0);
	}
	for (unsigned i = 0; i < 3; i++) {
		cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 1), 1);
		cr_assert_eq(d.res, 0, "buffered write: %s", strerror(-d.res));
	}
	kvr_l2_store_close(s);
	/* reopen: adoption through buffered probes, then byte-exact reads */
	struct kvr_l2_adopt_stats a;
	cr_assert_eq(kvr_l2_store_open(&cfg, &a, &s), 0);
	cr_assert_eq(a.adopted, 3);
	for (unsigned i = 0; i < 3; i++) {
		cr_assert_eq(kvr_l2_store_get(s, dt_key(3, i), 0, dt_slot(&arena, 3), i), 0);
		cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 1), 1);
		cr_assert_eq(d.res, 0);
		cr_assert_eq(dt_check(dt_slot(&arena, 3), 20000, dt_key(3, i), 0, 3), 0);
	}
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.io.fixed_ios, 3, "buffered I/O still uses the registered buffers");
	kvr_l2_store_close(s);
}

Test(l2ramfs, forced_direct_fails_cleanly)
{
	int fd = open(rdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cr_assert_geq(fd, 0);
	struct kvr_l2io_config cfg = {
		.dir_fd = fd,
		.ident = {.ns = {9, 9}, .fingerprint = {1, 1}, .block_tokens = 16, .lane_bytes = 20000},
		.queue_depth = 2,
		.io_mode = KVR_L2_IO_DIRECT,
		DT_ARENA_CFG(arena),
	};
	struct kvr_l2io *io = NULL;
	cr_assert_eq(kvr_l2io_open(&cfg, &io), 0);
	cr_assert_eq(kvr_l2io_write(io, dt_key(4, 0), 0, dt_slot(&arena, 0), 1), 0);
	struct kvr_l2io_done d;
	cr_assert_eq(kvr_l2io_reap(io, &d, 1, 1), 1);
	cr_assert_eq(d.res, -EINVAL, "O_DIRECT refused: %s", strerror(-d.res));
	struct dt_listing l = dt_list(rdir);
	cr_assert_eq(l.real + l.tmp + l.other, 0, "the temporary file ramfs created is removed");
	kvr_l2io_close(io);
	close(fd);
}

int main(int argc, char *argv[])
{
	char mnt[128], rmnt[128];
	if (!dt_uring_ok()) {
		fprintf(stderr, "io_uring (with direct descriptors) is not available: skipped\n");
		return 77;
	}
	snprintf(mnt, sizeof(mnt), "/tmp/kvr-l2full-%d", (int)getpid());
	snprintf(rmnt, sizeof(rmnt), "/tmp/kvr-l2ramfs-%d", (int)getpid());
	if (mkdir(mnt, 0755) && errno != EEXIST)
		return 77;
	if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")) {
		fprintf(stderr, "cannot mount a 1 MiB tmpfs on %s (%s): skipped\n", mnt, strerror(errno));
		rmdir(mnt);
		return 77;
	}
	/* Criterion runs each test in a re-executed worker: mount points go by environment */
	setenv("KVR_L2FULL_MNT", mnt, 1);
	if (mkdir(rmnt, 0755) == 0 && mount("ramfs", rmnt, "ramfs", MS_NOSUID | MS_NODEV, "mode=0755") == 0)
		setenv("KVR_L2RAMFS_MNT", rmnt, 1);
	else
		fprintf(stderr, "cannot mount ramfs on %s (%s): its tests are skipped\n", rmnt, strerror(errno));
	struct criterion_test_set *tests = criterion_initialize();
	int result = 0;
	if (criterion_handle_args(argc, argv, true))
		result = !criterion_run_all_tests(tests);
	criterion_finalize(tests);
	if (umount2(mnt, MNT_DETACH) == 0)
		rmdir(mnt);
	if (getenv("KVR_L2RAMFS_MNT") && umount2(rmnt, MNT_DETACH) == 0)
		rmdir(rmnt);
	else
		rmdir(rmnt);
	return result;
}
