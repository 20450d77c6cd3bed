/* Disk full: on a 1 MiB tmpfs a write fails cleanly with -ENOSPC (temp file removed, nothing under a real name), earlier
 * blocks stay intact, and the store's accounting follows. Exits 77 (skip) when the tmpfs cannot be mounted. */
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

static void engine_enospc(enum kvr_l2_iomode mode)
{
	struct kvr_l2io_config cfg = {
		.dir_fd = dir_fd,
		.ident = {.ns = {1, 2}, .fingerprint = {3, 4}, .block_tokens = 16, .lane_bytes = 2u << 20},
		.queue_depth = 4,
		.durability = KVR_L2_DUR_BLOCK,
		.io_mode = mode,
		.arena = arena.base,
		.arena_bytes = arena.bytes,
		.arena_data_off = arena.data_off,
		.slot_bytes = arena.slot_bytes,
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
	fprintf(stderr, "enospc (%s): %llu short writes resumed\n", mode == KVR_L2_IO_DIRECT ? "direct" : "buffered",
		(unsigned long long)st.resumed);
	struct dt_listing l = dt_list(dir);
	cr_assert_eq(l.real, 0, "nothing under a real name");
	cr_assert_eq(l.tmp, 0, "the temporary file is removed");
	cr_assert_eq(l.other, 0);
	kvr_l2io_close(io);
}

Test(l2full, engine_direct) { engine_enospc(KVR_L2_IO_DIRECT); }
Test(l2full, engine_buffered) { engine_enospc(KVR_L2_IO_BUFFERED); }

static void store_fills_up(enum kvr_l2_iomode mode)
{
	const uint64_t lane = 256u << 10; /* 260 KiB files: 3 fit in 1 MiB, the 4th does not */
	struct kvr_l2_store_config cfg = {
		.root = dir,
		.ident = {.ns = {5, 6}, .fingerprint = {7, 8}, .block_tokens = 16, .lane_bytes = lane},
		.lanes = 1,
		.capacity_bytes = 1ull << 30, /* the cap is not what stops it: the disk is */
		.queue_depth = 4,
		.durability = KVR_L2_DUR_BATCH,
		.io_mode = mode,
		.arena = arena.base,
		.arena_bytes = arena.bytes,
		.arena_data_off = arena.data_off,
		.slot_bytes = arena.slot_bytes,
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
	kvr_l2_store_close(s);
}

Test(l2full, store_direct) { store_fills_up(KVR_L2_IO_DIRECT); }
Test(l2full, store_buffered) { store_fills_up(KVR_L2_IO_BUFFERED); }

int main(int argc, char *argv[])
{
	char mnt[128];
	snprintf(mnt, sizeof(mnt), "/tmp/kvr-l2full-%d", (int)getpid());
	if (mkdir(mnt, 0755) && errno != EEXIST)
		return 77;
	if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")) {
		fprintf(stderr, "cannot mount a 1 MiB tmpfs on %s (%s): skipped\n", mnt, strerror(errno));
		rmdir(mnt);
		return 77;
	}
	setenv("KVR_L2FULL_MNT", mnt, 1);
	struct criterion_test_set *tests = criterion_initialize();
	int result = 0;
	if (criterion_handle_args(argc, argv, true))
		result = !criterion_run_all_tests(tests);
	criterion_finalize(tests);
	if (umount2(mnt, MNT_DETACH) == 0)
		rmdir(mnt);
	return result;
}
