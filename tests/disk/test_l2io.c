/* uring engine tests: byte-exact round trips through fixed buffers (direct and buffered, every durability), reads of
 * bad or vanished files, probes, unlinks, queue depth. */
#include <criterion/criterion.h>

#include "disk_test.h"

#define LANE_BYTES 20000u /* not a multiple of 4096: the padding path is exercised */
#define N_SLOTS 16
#define QD 8

static char dir[128];
static int dir_fd = -1;
static int direct_ok;               /* the temp dir's filesystem takes O_DIRECT */
static enum kvr_l2_iomode dmode;    /* DIRECT where it does, else BUFFERED */
static struct dt_arena arena;
static struct kvr_l2io *io;

static const struct kvr_l2_ident ID = {
	.ns = {0xaaaa, 0xbbbb},
	.fingerprint = {0xf00d, 0xbeef},
	.block_tokens = 16,
	.lane_bytes = LANE_BYTES,
};

static void setup(void)
{
	cr_assert_not_null(dt_mkdtemp("l2io", dir));
	dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cr_assert_geq(dir_fd, 0);
	direct_ok = kvr_l2io_probe_direct(dir_fd);
	cr_assert_geq(direct_ok, 0, "probe: %s", strerror(-direct_ok));
	dmode = direct_ok ? KVR_L2_IO_DIRECT : KVR_L2_IO_BUFFERED;
	cr_assert_eq(dt_arena_new(N_SLOTS, LANE_BYTES, &arena), 0);
}

static void teardown(void)
{
	kvr_l2io_close(io);
	io = NULL;
	dt_arena_free(&arena);
	if (dir_fd >= 0)
		close(dir_fd);
	dir_fd = -1;
	dt_rmrf(dir);
}

TestSuite(l2io, .init = setup, .fini = teardown);

static bool join; /* engines made by engine(): cfg.join_header */

static struct kvr_l2io *engine(enum kvr_l2_iomode mode, enum kvr_l2_durability dur, uint32_t qd)
{
	struct kvr_l2io_config cfg = {
		.join_header = join,
		.dir_fd = dir_fd,
		.ident = ID,
		.queue_depth = qd,
		.durability = dur,
		.io_mode = mode,
		DT_ARENA_CFG(arena),
	};
	struct kvr_l2io *e = NULL;
	int rc = kvr_l2io_open(&cfg, &e);
	cr_assert_eq(rc, 0, "kvr_l2io_open: %s", strerror(-rc));
	return e;
}

/* Reap exactly n completions (waiting), into d. */
static void reap_n(struct kvr_l2io *e, struct kvr_l2io_done *d, unsigned n)
{
	unsigned got = 0;
	while (got < n) {
		int k = kvr_l2io_reap(e, d + got, n - got, n - got);
		cr_assert_geq(k, 0, "reap: %s", strerror(-k));
		cr_assert(k > 0 || kvr_l2io_busy(e), "nothing in flight but %u completions missing", n - got);
		got += (unsigned)k;
	}
}

/* Write n blocks from slots 0..n-1, read them into slots n..2n-1, compare. */
static void round_trip(enum kvr_l2_iomode mode, enum kvr_l2_durability dur, unsigned n)
{
	if (mode == KVR_L2_IO_DIRECT && !direct_ok)
		cr_skip_test("%s does not take O_DIRECT", dir);
	io = engine(mode, dur, QD);
	bool want_direct = mode == KVR_L2_IO_DIRECT || (mode == KVR_L2_IO_AUTO && direct_ok);
	cr_assert_eq(kvr_l2io_direct(io), want_direct, "AUTO uses O_DIRECT exactly where the filesystem takes it");
	struct kvr_l2io_done d[N_SLOTS];
	for (unsigned i = 0; i < n; i++) {
		dt_fill(dt_slot(&arena, i), LANE_BYTES, dt_key(1, i), i % 4, 7);
		int rc = kvr_l2io_write(io, dt_key(1, i), i % 4, dt_slot(&arena, i), 100 + i);
		cr_assert_eq(rc, 0, "write %u: %s", i, strerror(-rc));
	}
	reap_n(io, d, n);
	uint32_t seen = 0;
	for (unsigned i = 0; i < n; i++) {
		cr_assert_eq(d[i].op, KVR_L2IO_WRITE);
		cr_assert_eq(d[i].res, 0, "write tag %llu: %s", (unsigned long long)d[i].tag, strerror(-d[i].res));
		cr_assert_eq(d[i].reason, KVR_L2_OK);
		unsigned b = (unsigned)d[i].tag - 100;
		cr_assert_lt(b, n);
		cr_assert(kvr_key_eq(d[i].key, dt_key(1, b)) && d[i].lane == b % 4);
		seen |= 1u << b;
	}
	cr_assert_eq(seen, (1u << n) - 1, "every write completed once");
	struct dt_listing l = dt_list(dir);
	cr_assert_eq(l.real, n);
	cr_assert_eq(l.tmp, 0, "no temporary file left");
	cr_assert_eq(l.other, 0);
	char path[512];
	for (unsigned i = 0; i < n; i++) {
		struct stat st;
		cr_assert_eq(stat(dt_path(dir, dt_key(1, i), i % 4, path), &st), 0);
		cr_assert_eq((uint64_t)st.st_size, kvr_l2_file_bytes(LANE_BYTES), "file size is exact");
	}
	for (unsigned i = 0; i < n; i++) {
		memset(dt_slot(&arena, n + i), 0xcc, arena.slot_bytes);
		cr_assert_eq(kvr_l2io_read(io, dt_key(1, i), i % 4, dt_slot(&arena, n + i), 200 + i), 0);
	}
	reap_n(io, d, n);
	for (unsigned i = 0; i < n; i++) {
		cr_assert_eq(d[i].op, KVR_L2IO_READ);
		cr_assert_eq(d[i].res, 0, "read: %s (%s)", strerror(-d[i].res), kvr_l2_reason_name(d[i].reason));
		unsigned b = (unsigned)d[i].tag - 200;
		cr_assert_eq(dt_check(dt_slot(&arena, n + b), LANE_BYTES, dt_key(1, b), b % 4, 7), 0,
			     "block %u read back byte-exact", b);
	}
	struct kvr_l2io_stats st;
	kvr_l2io_stats(io, &st);
	cr_assert_eq(st.ops[KVR_L2IO_WRITE], n);
	cr_assert_eq(st.ops[KVR_L2IO_READ], n);
	cr_assert_eq(st.failed[KVR_L2IO_WRITE] + st.failed[KVR_L2IO_READ], 0);
	if (join && kvr_l2io_direct(io)) { /* header and payload in one vectored transfer per file */
		cr_assert_eq(st.joined_ios, 2 * n, "joined: one transfer per file each way");
		cr_assert_eq(st.plain_ios, 0, "a joined transfer is counted once, as joined");
		cr_assert_eq(st.fixed_ios, 0);
	} else { /* buffered I/O does not join: the page cache makes the requests */
		cr_assert_eq(st.fixed_ios, 2 * n, "every payload went through a registered buffer");
		cr_assert_eq(st.plain_ios, 0);
		cr_assert_eq(st.joined_ios, 0);
	}
	cr_assert_eq(st.bytes_written, (uint64_t)n * LANE_BYTES);
	cr_assert_eq(st.bytes_read, (uint64_t)n * LANE_BYTES);
	cr_assert_eq(st.fsyncs, dur == KVR_L2_DUR_NONE ? 0 : n, "fdatasync per file under %s", kvr_l2_durability_name(dur));
	if (dur == KVR_L2_DUR_BATCH)
		cr_assert(st.batches >= 1 && st.batches <= n, "batches %llu", (unsigned long long)st.batches);
	else
		cr_assert_eq(st.batches, 0);
	cr_assert_lt(st.enters, 8 * (uint64_t)n, "submissions are batched (%llu enters)", (unsigned long long)st.enters);
	cr_assert_eq(kvr_l2io_busy(io), 0);
}

Test(l2io, round_trip_direct_none) { round_trip(KVR_L2_IO_DIRECT, KVR_L2_DUR_NONE, 8); }
Test(l2io, round_trip_direct_block) { round_trip(KVR_L2_IO_DIRECT, KVR_L2_DUR_BLOCK, 8); }
Test(l2io, round_trip_direct_batch) { round_trip(KVR_L2_IO_DIRECT, KVR_L2_DUR_BATCH, 8); }
Test(l2io, round_trip_auto_batch) { round_trip(KVR_L2_IO_AUTO, KVR_L2_DUR_BATCH, 5); }
Test(l2io, round_trip_buffered_none) { round_trip(KVR_L2_IO_BUFFERED, KVR_L2_DUR_NONE, 8); }
Test(l2io, round_trip_buffered_batch) { round_trip(KVR_L2_IO_BUFFERED, KVR_L2_DUR_BATCH, 8); }
/* join_header: header and payload in one vectored write and one vectored read */
Test(l2io, round_trip_joined_direct_none) { join = true; round_trip(dmode, KVR_L2_DUR_NONE, 8); }
Test(l2io, round_trip_joined_direct_batch) { join = true; round_trip(dmode, KVR_L2_DUR_BATCH, 8); }
Test(l2io, round_trip_joined_buffered) { join = true; round_trip(KVR_L2_IO_BUFFERED, KVR_L2_DUR_BLOCK, 8); }

Test(l2io, probe_direct)
{
	fprintf(stderr, "%s: O_DIRECT %s\n", dir, direct_ok ? "supported" : "refused (buffered fallback)");
	cr_assert_eq(kvr_l2io_probe_direct(dir_fd), direct_ok, "the probe is repeatable");
	struct dt_listing l = dt_list(dir);
	cr_assert_eq(l.real + l.tmp + l.other, 0, "the probe leaves nothing behind");
	cr_assert_lt(kvr_l2io_probe_direct(-1), 0);
}

Test(l2io, unregistered_buffers)
{
	io = engine(dmode, KVR_L2_DUR_NONE, QD);
	void *src, *dst;
	cr_assert_eq(posix_memalign(&src, 4096, kvr_l2_payload_bytes(LANE_BYTES)), 0);
	cr_assert_eq(posix_memalign(&dst, 4096, kvr_l2_payload_bytes(LANE_BYTES)), 0);
	dt_fill(src, LANE_BYTES, dt_key(2, 0), 0, 9);
	struct kvr_l2io_done d;
	cr_assert_eq(kvr_l2io_write(io, dt_key(2, 0), 0, src, 1), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, 0);
	cr_assert_eq(kvr_l2io_read(io, dt_key(2, 0), 0, dst, 2), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, 0);
	cr_assert_eq(dt_check(dst, LANE_BYTES, dt_key(2, 0), 0, 9), 0);
	struct kvr_l2io_stats st;
	kvr_l2io_stats(io, &st);
	cr_assert_eq(st.plain_ios, 2);
	cr_assert_eq(st.fixed_ios, 0);
	if (direct_ok) { /* O_DIRECT needs alignment */
		cr_assert_eq(kvr_l2io_write(io, dt_key(2, 1), 0, (uint8_t *)src + 8, 3), -EINVAL);
		cr_assert_eq(kvr_l2io_read(io, dt_key(2, 1), 0, (uint8_t *)dst + 512, 3), -EINVAL);
	}
	cr_assert_eq(kvr_l2io_write(io, dt_key(2, 1), 65536, src, 3), -EINVAL, "lane out of range");
	free(src);
	free(dst);
}

Test(l2io, queue_depth_bound)
{
	io = engine(dmode, KVR_L2_DUR_NONE, 4);
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(kvr_l2io_write(io, dt_key(3, i), 0, dt_slot(&arena, i), i), 0);
	cr_assert_eq(kvr_l2io_busy(io), 4);
	cr_assert_eq(kvr_l2io_write(io, dt_key(3, 4), 0, dt_slot(&arena, 4), 4), -EAGAIN);
	cr_assert_eq(kvr_l2io_read(io, dt_key(3, 0), 0, dt_slot(&arena, 5), 4), -EAGAIN);
	cr_assert_eq(kvr_l2io_unlink(io, dt_key(3, 0), 0, 4), -EAGAIN);
	struct kvr_l2io_done d[4];
	reap_n(io, d, 4);
	cr_assert_eq(kvr_l2io_busy(io), 0, "reaping frees the ops");
	cr_assert_eq(kvr_l2io_write(io, dt_key(3, 4), 0, dt_slot(&arena, 4), 4), 0);
	reap_n(io, d, 1);
	cr_assert_eq(d[0].res, 0);
	int efd = kvr_l2io_event_fd(io);
	cr_assert_geq(efd, 0);
	cr_assert_eq(kvr_l2io_event_fd(io), efd, "one eventfd");
	cr_assert_eq(kvr_l2io_unlink(io, dt_key(3, 4), 0, 9), 0);
	cr_assert_eq(kvr_l2io_submit(io), 1);
	struct pollfd pfd = {.fd = efd, .events = POLLIN};
	cr_assert_eq(poll(&pfd, 1, 5000), 1, "the eventfd wakes a poller when a completion arrives");
	reap_n(io, d, 1);
	cr_assert_eq(d[0].res, 0);
	cr_assert_eq(poll(&pfd, 1, 0), 0, "reap drained the eventfd");
}

/* Read chains go to the kernel in groups of four (a chain's linked read is queued only when
 * the submitting call returns): the fourth read submits the four without kvr_l2io_submit. */
Test(l2io, reads_submitted_in_groups)
{
	io = engine(dmode, KVR_L2_DUR_NONE, QD);
	struct kvr_l2io_done d[8];
	for (unsigned i = 0; i < 8; i++)
		dt_fill(dt_slot(&arena, i), LANE_BYTES, dt_key(12, i), 0, 4);
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(kvr_l2io_write(io, dt_key(12, i), 0, dt_slot(&arena, i), i), 0);
	reap_n(io, d, 8);
	struct kvr_l2io_stats a, b;
	kvr_l2io_stats(io, &a);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(kvr_l2io_read(io, dt_key(12, i), 0, dt_slot(&arena, 8 + i), 100 + i), 0);
	kvr_l2io_stats(io, &b);
	cr_assert_eq(b.sqes, a.sqes, "three read chains wait for the fourth");
	cr_assert_eq(kvr_l2io_read(io, dt_key(12, 3), 0, dt_slot(&arena, 11), 103), 0);
	kvr_l2io_stats(io, &b);
	unsigned chain = join && kvr_l2io_direct(io) ? 3 : 4; /* open, read(s), close */
	cr_assert_eq(b.sqes - a.sqes, 4 * chain, "the fourth read submitted all four chains");
	cr_assert_eq(b.enters, a.enters + 1);
	reap_n(io, d, 4);
	for (unsigned i = 0; i < 4; i++) {
		cr_assert_eq(d[i].res, 0);
		unsigned k = (unsigned)d[i].tag - 100;
		cr_assert_eq(dt_check(dt_slot(&arena, 8 + k), LANE_BYTES, dt_key(12, k), 0, 4), 0, "read %u byte-exact", k);
	}
}

/* A file written in two transfers reads back through one and the other way round: the
 * format is the same (files of an older kvring, or of a kvringd on 4 KiB pages, stay good). */
Test(l2io, joined_and_separate_transfers_read_each_others_files)
{
	struct kvr_l2io_done d[4];
	for (unsigned pass = 0; pass < 2; pass++) {
		join = pass == 1; /* writer */
		io = engine(dmode, KVR_L2_DUR_NONE, QD);
		for (unsigned i = 0; i < 4; i++) {
			dt_fill(dt_slot(&arena, i), LANE_BYTES, dt_key(13 + pass, i), i, 6);
			cr_assert_eq(kvr_l2io_write(io, dt_key(13 + pass, i), i, dt_slot(&arena, i), i), 0);
		}
		reap_n(io, d, 4);
		for (unsigned i = 0; i < 4; i++)
			cr_assert_eq(d[i].res, 0);
		kvr_l2io_close(io);
		join = !join; /* reader */
		io = engine(dmode, KVR_L2_DUR_NONE, QD);
		for (unsigned i = 0; i < 4; i++) {
			memset(dt_slot(&arena, 4 + i), 0xcc, arena.slot_bytes);
			cr_assert_eq(kvr_l2io_read(io, dt_key(13 + pass, i), i, dt_slot(&arena, 4 + i), i), 0);
		}
		reap_n(io, d, 4);
		for (unsigned i = 0; i < 4; i++) {
			cr_assert_eq(d[i].res, 0, "%s: %s", join ? "joined read" : "separate read", kvr_l2_reason_name(d[i].reason));
			unsigned k = (unsigned)d[i].tag;
			cr_assert_eq(dt_check(dt_slot(&arena, 4 + k), LANE_BYTES, dt_key(13 + pass, k), k, 6), 0,
				     "pass %u: block %u byte-exact", pass, k);
		}
		struct kvr_l2io_stats st;
		kvr_l2io_stats(io, &st);
		cr_assert_eq(st.joined_ios, join && kvr_l2io_direct(io) ? 4 : 0);
		kvr_l2io_close(io);
		io = NULL;
	}
}

/* Write one good block (slot 0) and return its path. */
static const char *write_one(kvr_key key, uint32_t lane, char *path)
{
	struct kvr_l2io_done d;
	dt_fill(dt_slot(&arena, 0), LANE_BYTES, key, lane, 1);
	cr_assert_eq(kvr_l2io_write(io, key, lane, dt_slot(&arena, 0), 0), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, 0);
	return dt_path(dir, key, lane, path);
}

static struct kvr_l2io_done read_one(kvr_key key, uint32_t lane)
{
	struct kvr_l2io_done d;
	memset(dt_slot(&arena, 1), 0, arena.slot_bytes);
	cr_assert_eq(kvr_l2io_read(io, key, lane, dt_slot(&arena, 1), 5), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.op, KVR_L2IO_READ);
	cr_assert_eq(d.tag, 5);
	return d;
}

/* Every damaged or missing file is a miss with its reason, with the engine's two read chains. */
static void bad_and_vanished_reads(bool joined)
{
	join = joined;
	io = engine(dmode, KVR_L2_DUR_NONE, QD);
	char path[512];
	struct kvr_l2io_done d;

	/* vanished: never written, and deleted behind the engine's back */
	d = read_one(dt_key(4, 0), 0);
	cr_assert_eq(d.res, -ENOENT);
	cr_assert_eq(d.reason, KVR_L2_R_VANISHED);
	cr_assert_eq(unlink(write_one(dt_key(4, 1), 0, path)), 0);
	d = read_one(dt_key(4, 1), 0);
	cr_assert_eq(d.res, -ENOENT);
	cr_assert_eq(d.reason, KVR_L2_R_VANISHED);

	struct {
		const char *what;
		off_t flip;      /* byte to flip, or -1 */
		off_t truncate;  /* new size, or -1 */
		unsigned reason;
	} cases[] = {
		{"payload byte", 4096 + 12345, -1, KVR_L2_R_PAYLOAD_CSUM},
		{"last payload byte", 4096 + LANE_BYTES - 1, -1, KVR_L2_R_PAYLOAD_CSUM},
		{"header key byte", 33, -1, KVR_L2_R_HDR_CSUM},
		{"header reserved byte", 3000, -1, KVR_L2_R_HDR_CSUM},
		{"magic", 0, -1, KVR_L2_R_MAGIC},
		{"payload truncated", -1, 4096 + 8192, KVR_L2_R_SHORT},
		{"header truncated", -1, 100, KVR_L2_R_SHORT},
		{"empty", -1, 0, KVR_L2_R_SHORT},
	};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		kvr_key k = dt_key(5, i);
		write_one(k, 1, path);
		if (cases[i].flip >= 0)
			cr_assert_eq(dt_flip(path, cases[i].flip), 0);
		if (cases[i].truncate >= 0)
			cr_assert_eq(truncate(path, cases[i].truncate), 0);
		d = read_one(k, 1);
		cr_assert_eq(d.res, -EBADMSG, "%s: res %d", cases[i].what, d.res);
		cr_assert_eq(d.reason, cases[i].reason, "%s: reason %s", cases[i].what, kvr_l2_reason_name(d.reason));
		cr_assert(dt_exists(dir, strrchr(path, '/') + 1), "%s: the engine leaves the file to its owner",
			  cases[i].what);
	}
	/* a file renamed under another key's name is not served as that key */
	char other[512];
	write_one(dt_key(6, 0), 0, path);
	cr_assert_eq(rename(path, dt_path(dir, dt_key(6, 1), 0, other)), 0);
	d = read_one(dt_key(6, 1), 0);
	cr_assert_eq(d.res, -EBADMSG);
	cr_assert_eq(d.reason, KVR_L2_R_KEY);
	/* a symlink under a block name is not followed */
	write_one(dt_key(6, 2), 0, path);
	cr_assert_eq(symlink(path, dt_path(dir, dt_key(6, 3), 0, other)), 0);
	d = read_one(dt_key(6, 3), 0);
	cr_assert_eq(d.res, -EBADMSG);
	cr_assert_eq(d.reason, KVR_L2_R_NOTREG);

	/* a reserved header byte that is not 0 under a good checksum: damaged, never served */
	static const size_t reserved_at[] = {100, 104, 3000, 4087};
	for (unsigned i = 0; i < sizeof(reserved_at) / sizeof(reserved_at[0]); i++) {
		kvr_key k = dt_key(9, i);
		write_one(k, 1, path);
		cr_assert_eq(dt_hdr_poke(path, reserved_at[i], 0x01), 0);
		d = read_one(k, 1);
		cr_assert_eq(d.res, -EBADMSG, "reserved byte %zu: res %d", reserved_at[i], d.res);
		cr_assert_eq(d.reason, KVR_L2_R_RESERVED, "reserved byte %zu: reason %s", reserved_at[i],
			     kvr_l2_reason_name(d.reason));
		cr_assert(dt_exists(dir, strrchr(path, '/') + 1), "the engine leaves the file to its owner");
	}

	struct kvr_l2io_stats st;
	kvr_l2io_stats(io, &st);
	cr_assert_eq(st.failed[KVR_L2IO_READ], 2 + sizeof(cases) / sizeof(cases[0]) + 2 + 4);
	/* the engine still works: a good read after all that */
	write_one(dt_key(7, 0), 3, path);
	d = read_one(dt_key(7, 0), 3);
	cr_assert_eq(d.res, 0);
	cr_assert_eq(dt_check(dt_slot(&arena, 1), LANE_BYTES, dt_key(7, 0), 3, 1), 0);
	kvr_l2io_stats(io, &st);
	cr_assert_eq(st.joined_ios > 0, joined && kvr_l2io_direct(io), "joined transfers exactly when asked (O_DIRECT)");
}

Test(l2io, bad_and_vanished_reads) { bad_and_vanished_reads(false); }
Test(l2io, bad_and_vanished_reads_joined) { bad_and_vanished_reads(true); }

Test(l2io, unlink_and_probe)
{
	io = engine(dmode, KVR_L2_DUR_NONE, QD);
	char path[512];
	struct kvr_l2io_done d;
	write_one(dt_key(8, 0), 0, path);
	cr_assert_eq(dt_set_mtime(path, 1000000), 0);
	cr_assert_eq(kvr_l2io_probe(io, dt_key(8, 0), 0, 11), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.op, KVR_L2IO_PROBE);
	cr_assert_eq(d.res, 0, "probe: %s", kvr_l2_reason_name(d.reason));
	cr_assert_eq(d.size, kvr_l2_file_bytes(LANE_BYTES));
	cr_assert_eq(d.mtime_ns, 1000000ll * 1000000000ll);

	cr_assert_eq(kvr_l2io_unlink(io, dt_key(8, 0), 0, 12), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, 0);
	cr_assert(!dt_exists(dir, strrchr(path, '/') + 1));
	cr_assert_eq(kvr_l2io_unlink(io, dt_key(8, 0), 0, 13), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, 0, "unlinking a file already gone is fine");

	cr_assert_eq(kvr_l2io_probe(io, dt_key(8, 0), 0, 14), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, -ENOENT);
	cr_assert_eq(d.reason, KVR_L2_R_VANISHED);

	/* wrong size: a valid header but a page appended */
	write_one(dt_key(8, 1), 0, path);
	int fd = open(path, O_WRONLY | O_APPEND);
	static const char page[4096];
	cr_assert_eq(write(fd, page, sizeof(page)), 4096);
	close(fd);
	cr_assert_eq(kvr_l2io_probe(io, dt_key(8, 1), 0, 15), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, -EBADMSG);
	cr_assert_eq(d.reason, KVR_L2_R_SIZE);
	cr_assert_eq(d.size, kvr_l2_file_bytes(LANE_BYTES) + 4096);

	/* a directory under a block name */
	cr_assert_eq(mkdir(dt_path(dir, dt_key(8, 2), 0, path), 0755), 0);
	cr_assert_eq(kvr_l2io_probe(io, dt_key(8, 2), 0, 16), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, -EBADMSG);
	cr_assert_eq(d.reason, KVR_L2_R_NOTREG);

	cr_assert_eq(kvr_l2io_unlink_name(io, "a/b", (kvr_key){0, 0}, 0, 0), -EINVAL);
	cr_assert_eq(kvr_l2io_unlink_name(io, "", (kvr_key){0, 0}, 0, 0), -EINVAL);
	cr_assert_eq(dt_write_file(dt_path(dir, dt_key(8, 3), 0, path), "x", 1), 0);
	cr_assert_eq(kvr_l2io_unlink_name(io, strrchr(path, '/') + 1, dt_key(8, 3), 0, 17), 0);
	reap_n(io, &d, 1);
	cr_assert_eq(d.res, 0);
	cr_assert(kvr_key_eq(d.key, dt_key(8, 3)));
	cr_assert(!dt_exists(dir, strrchr(path, '/') + 1));
}

Test(l2io, bad_config)
{
	struct kvr_l2io_config cfg = {.dir_fd = dir_fd, .ident = ID, .queue_depth = 4};
	struct kvr_l2io *e = (struct kvr_l2io *)0x1;
	cfg.queue_depth = 0;
	cr_assert_eq(kvr_l2io_open(&cfg, &e), -EINVAL);
	cfg.queue_depth = KVR_L2IO_MAX_QD + 1;
	cr_assert_eq(kvr_l2io_open(&cfg, &e), -EINVAL);
	cfg.queue_depth = 4;
	cfg.ident.lane_bytes = 0;
	cr_assert_eq(kvr_l2io_open(&cfg, &e), -EINVAL);
	cfg.ident.lane_bytes = LANE_BYTES;
	cfg.dir_fd = -1;
	cr_assert_eq(kvr_l2io_open(&cfg, &e), -EINVAL);
	cfg.dir_fd = dir_fd;
	cfg.arena_data_off = 100;
	cr_assert_eq(kvr_l2io_open(&cfg, &e), -EINVAL);
	cr_assert_eq(e, (struct kvr_l2io *)0x1, "*ret untouched on failure");
	enum kvr_l2_durability dur;
	cr_assert_eq(kvr_l2_durability_parse("batch", &dur), 0);
	cr_assert_eq(dur, KVR_L2_DUR_BATCH);
	cr_assert_eq(kvr_l2_durability_parse("Batch", &dur), -EINVAL);
	kvr_l2io_close(NULL);
}

DT_MAIN_NEEDS_URING
