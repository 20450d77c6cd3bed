/* l2store tests: round trip, re-put accounting, exact LRU eviction, vanished and bad files, the adoption table of
 * damaged files, mtime order and cap at adoption, the directory lock, kill -9 mid-write. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>

#include "disk_test.h"

#define LANE_BYTES 20000u
#define N_SLOTS 32
#define QD 8

static char root[128];
static struct dt_arena arena;
static struct kvr_l2_store *s;
static uint64_t FB; /* bytes of one file */
static int direct_ok; /* the temp dir takes O_DIRECT (else AUTO falls back to buffered I/O) */

static const struct kvr_l2_ident ID = {
	.ns = {0x1234, 0x5678},
	.fingerprint = {0xabcd, 0xef01},
	.block_tokens = 16,
	.lane_bytes = LANE_BYTES,
};

static void setup(void)
{
	cr_assert_not_null(dt_mkdtemp("l2store", root));
	cr_assert_eq(dt_arena_new(N_SLOTS, LANE_BYTES, &arena), 0);
	FB = kvr_l2_file_bytes(LANE_BYTES);
	direct_ok = dt_direct_ok(root);
	cr_assert_geq(direct_ok, 0);
}

static void teardown(void)
{
	kvr_l2_store_close(s);
	s = NULL;
	dt_arena_free(&arena);
	dt_rmrf(root);
}

TestSuite(l2store, .init = setup, .fini = teardown);

static struct kvr_l2_store_config config(const struct kvr_l2_ident *id, uint64_t cap_files)
{
	return (struct kvr_l2_store_config){
		.root = root,
		.ident = *id,
		.lanes = 2,
		.capacity_bytes = cap_files * kvr_l2_file_bytes(id->lane_bytes),
		.queue_depth = QD,
		.durability = KVR_L2_DUR_NONE,
		.io_mode = KVR_L2_IO_AUTO,
		DT_ARENA_CFG(arena),
	};
}

static struct kvr_l2_store *open_store(uint64_t cap_files, struct kvr_l2_adopt_stats *ast)
{
	struct kvr_l2_store_config cfg = config(&ID, cap_files);
	return dt_store_open(&cfg, ast);
}

/* One completion, waiting for it. */
static struct kvr_l2_done wait_one(struct kvr_l2_store *st)
{
	struct kvr_l2_done d;
	int n = kvr_l2_store_poll(st, &d, 1, 1);
	cr_assert_eq(n, 1, "poll: %d", n);
	return d;
}

/* Put block i (pattern seed 3) from slot (i % N_SLOTS) and wait for its completion. */
static int put_wait(struct kvr_l2_store *st, kvr_key key, uint32_t lane, unsigned slot)
{
	dt_fill(dt_slot(&arena, slot), LANE_BYTES, key, lane, 3);
	int rc = kvr_l2_store_put(st, key, lane, dt_slot(&arena, slot), 77);
	if (rc)
		return rc;
	struct kvr_l2_done d = wait_one(st);
	cr_assert_eq(d.kind, KVR_L2_PUT);
	cr_assert_eq(d.tag, 77);
	return d.res;
}

/* Get into the last slot and wait: the completion's res (or get's own error). */
static struct kvr_l2_done get_wait(struct kvr_l2_store *st, kvr_key key, uint32_t lane)
{
	uint8_t *dst = dt_slot(&arena, N_SLOTS - 1);
	memset(dst, 0xcc, arena.slot_bytes);
	int rc = kvr_l2_store_get(st, key, lane, dst, 88);
	if (rc)
		return (struct kvr_l2_done){.res = rc, .kind = 0};
	struct kvr_l2_done d = wait_one(st);
	cr_assert_eq(d.kind, KVR_L2_GET);
	cr_assert_eq(d.tag, 88);
	if (d.res == 0)
		cr_assert_eq(dt_check(dst, LANE_BYTES, key, lane, 3), 0, "a hit is byte-exact");
	return d;
}

static kvr_key K(unsigned i)
{
	return dt_key(42, i);
}

Test(l2store, round_trip_and_accounting)
{
	struct kvr_l2_adopt_stats ast;
	s = open_store(100, &ast);
	cr_assert_eq(ast.entries, 0);
	cr_assert_eq(ast.adopted, 0);
	char hex[KVR_KEY_FMT_LEN], want[256];
	snprintf(want, sizeof(want), "%s/%s", root, kvr_l2_ns_dir_fmt(ID.ns, hex));
	cr_assert_str_eq(kvr_l2_store_dir(s), want);
	struct kvr_l2_done d[12];
	int got = 0;
	for (unsigned i = 0; i < 12; i++) {
		dt_fill(dt_slot(&arena, i), LANE_BYTES, K(i), i % 2, 3);
		int rc;
		while ((rc = kvr_l2_store_put(s, K(i), i % 2, dt_slot(&arena, i), i)) == -EAGAIN) {
			cr_assert_geq(i, QD, "the engine is full only after queue_depth puts");
			int n = kvr_l2_store_poll(s, d + got, 12 - (unsigned)got, 1);
			cr_assert_gt(n, 0);
			got += n;
		}
		cr_assert_eq(rc, 0);
	}
	while (got < 12) {
		int n = kvr_l2_store_poll(s, d + got, 12 - (unsigned)got, 1);
		cr_assert_gt(n, 0);
		got += n;
	}
	for (int i = 0; i < 12; i++) {
		cr_assert_eq(d[i].res, 0);
		cr_assert_eq(d[i].kind, KVR_L2_PUT);
	}
	for (unsigned i = 0; i < 12; i++) {
		cr_assert(kvr_l2_store_contains(s, K(i), i % 2));
		cr_assert(!kvr_l2_store_contains(s, K(i), 1 - i % 2));
		struct kvr_l2_done g = get_wait(s, K(i), i % 2);
		cr_assert_eq(g.res, 0);
	}
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.files, 12);
	cr_assert_eq(st.used_bytes, 12 * FB);
	cr_assert_eq(st.writing_bytes, 0);
	cr_assert_eq(st.evicting_bytes, 0);
	cr_assert_eq(st.puts, 12);
	cr_assert_eq(st.gets, 12);
	cr_assert_eq(st.get_hits, 12);
	cr_assert_eq(st.io.fixed_ios, 24, "arena slots are fixed buffers");
	cr_assert_eq(st.direct, direct_ok == 1, "AUTO: O_DIRECT exactly where the filesystem takes it");
	struct dt_listing l = dt_list(kvr_l2_store_dir(s));
	cr_assert_eq(l.real, 12);
	cr_assert_eq(l.tmp + l.other, 0);
	cr_assert_eq(kvr_l2_store_get(s, K(99), 0, dt_slot(&arena, 0), 0), -ENOENT, "a miss needs no I/O");
	cr_assert_eq(kvr_l2_store_put(s, K(0), 2, dt_slot(&arena, 0), 0), -EINVAL, "lane >= lanes");
	if (direct_ok)
		cr_assert_eq(kvr_l2_store_get(s, K(0), 0, dt_slot(&arena, 0) + 512, 0), -EINVAL, "misaligned in direct mode");
}

Test(l2store, re_put_costs_nothing)
{
	s = open_store(100, NULL);
	cr_assert_eq(put_wait(s, K(1), 0, 0), 0);
	struct kvr_l2_store_stats before, after;
	kvr_l2_store_stats(s, &before);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(kvr_l2_store_put(s, K(1), 0, dt_slot(&arena, 0), 9), KVR_L2_PRESENT);
	struct kvr_l2_done d;
	cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 0), 0, "a present put has no completion");
	kvr_l2_store_stats(s, &after);
	cr_assert_eq(after.used_bytes, before.used_bytes, "accounting unchanged");
	cr_assert_eq(after.used_bytes, FB);
	cr_assert_eq(after.files, 1);
	cr_assert_eq(after.io.ops[KVR_L2IO_WRITE], 1, "no second write issued");
	cr_assert_eq(after.io.sqes, before.io.sqes, "no I/O at all");
	cr_assert_eq(after.puts_present, 5);
	/* a put of a key whose write is in flight */
	dt_fill(dt_slot(&arena, 1), LANE_BYTES, K(2), 1, 3);
	cr_assert_eq(kvr_l2_store_put(s, K(2), 1, dt_slot(&arena, 1), 1), 0);
	cr_assert_eq(kvr_l2_store_put(s, K(2), 1, dt_slot(&arena, 1), 2), KVR_L2_INFLIGHT);
	kvr_l2_store_stats(s, &after);
	cr_assert_eq(after.used_bytes, 2 * FB, "the write in flight holds its bytes once");
	cr_assert_eq(after.writing_bytes, FB);
	cr_assert_eq(kvr_l2_store_get(s, K(2), 1, dt_slot(&arena, 2), 3), -ENOENT, "not readable before it is complete");
	d = wait_one(s);
	cr_assert_eq(d.tag, 1);
	cr_assert_eq(d.res, 0);
	cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 0), 0, "exactly one completion");
	kvr_l2_store_stats(s, &after);
	cr_assert_eq(after.io.ops[KVR_L2IO_WRITE], 2);
	cr_assert_eq(after.puts_inflight, 1);
	cr_assert_eq(get_wait(s, K(2), 1).res, 0);
}

static void assert_lru(const unsigned *want, unsigned n)
{
	kvr_key keys[16];
	uint32_t lanes[16];
	unsigned got = kvr_l2_store_lru(s, keys, lanes, 16);
	cr_assert_eq(got, n, "LRU length %u, want %u", got, n);
	for (unsigned i = 0; i < n; i++)
		cr_assert(kvr_key_eq(keys[i], K(want[i])), "LRU position %u is not block %u", i, want[i]);
}

Test(l2store, cap_evicts_least_recent_first)
{
	s = open_store(4, NULL);
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(put_wait(s, K(i), 0, i), 0);
	assert_lru((unsigned[]){0, 1, 2, 3}, 4);
	cr_assert_eq(get_wait(s, K(1), 0).res, 0);                                /* touch 1 */
	cr_assert_eq(kvr_l2_store_put(s, K(0), 0, dt_slot(&arena, 0), 0), KVR_L2_PRESENT); /* touch 0 */
	assert_lru((unsigned[]){2, 3, 1, 0}, 4);
	cr_assert_eq(put_wait(s, K(4), 0, 4), 0);
	assert_lru((unsigned[]){3, 1, 0, 4}, 4);
	cr_assert(!kvr_l2_store_contains(s, K(2), 0), "2 was the least recent");
	cr_assert_eq(put_wait(s, K(5), 0, 5), 0);
	assert_lru((unsigned[]){1, 0, 4, 5}, 4);
	cr_assert_eq(put_wait(s, K(6), 0, 6), 0);
	assert_lru((unsigned[]){0, 4, 5, 6}, 4);
	cr_assert_eq(kvr_l2_store_flush(s), 0); /* let the unlinks land */
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.evictions, 3);
	cr_assert_eq(st.files, 4);
	cr_assert_eq(st.used_bytes, 4 * FB);
	cr_assert_eq(st.evicting_bytes, 0);
	char path[512];
	for (unsigned i = 0; i < 7; i++) {
		bool kept = i == 0 || i >= 4;
		cr_assert_eq(dt_exists(kvr_l2_store_dir(s), strrchr(dt_path("", K(i), 0, path), '/') + 1), kept,
			     "block %u on disk: %d", i, !kept);
	}
	struct dt_listing l = dt_list(kvr_l2_store_dir(s));
	cr_assert_eq(l.real, 4, "the files on disk are exactly the cap");
	cr_assert_eq(get_wait(s, K(2), 0).res, -ENOENT);
}

/* A lane used in L1 (kvr_l2_store_touch, the disk actor's L2_TOUCH) moves to the recent end
 * like a read: the cap evicts the others first. A lane not on disk is nothing to touch. */
Test(l2store, a_touch_keeps_a_lane_used_in_l1)
{
	s = open_store(3, NULL);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(put_wait(s, K(i), 0, i), 0);
	cr_assert(kvr_l2_store_touch(s, K(0), 0));
	assert_lru((unsigned[]){1, 2, 0}, 3);
	cr_assert(!kvr_l2_store_touch(s, K(9), 0), "not on disk");
	cr_assert(!kvr_l2_store_touch(s, K(0), 1), "another lane of a block on disk");
	cr_assert_eq(put_wait(s, K(3), 0, 3), 0);
	assert_lru((unsigned[]){2, 0, 3}, 3);
	cr_assert(kvr_l2_store_contains(s, K(0), 0), "the touched lane outlived the write");
	cr_assert(!kvr_l2_store_contains(s, K(1), 0), "1 was the least recent");
}

Test(l2store, cap_smaller_than_a_file)
{
	struct kvr_l2_store_config cfg = config(&ID, 1);
	cfg.capacity_bytes = FB - 1;
	s = dt_store_open(&cfg, NULL);
	cr_assert_eq(kvr_l2_store_put(s, K(0), 0, dt_slot(&arena, 0), 0), -ENOSPC);
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.puts_nospace, 1);
	cr_assert_eq(st.io.sqes, 0);
}

Test(l2store, vanished_file_is_a_miss)
{
	s = open_store(100, NULL);
	cr_assert_eq(put_wait(s, K(0), 0, 0), 0);
	cr_assert_eq(put_wait(s, K(1), 0, 1), 0);
	char path[512];
	cr_assert_eq(unlink(dt_path(kvr_l2_store_dir(s), K(0), 0, path)), 0, "deleted behind the store's back");
	struct kvr_l2_done d = get_wait(s, K(0), 0);
	cr_assert_eq(d.res, -ENOENT, "a vanished file is a miss, not a hit");
	cr_assert_eq(d.reason, KVR_L2_R_VANISHED);
	cr_assert(!kvr_l2_store_contains(s, K(0), 0), "the index dropped it");
	cr_assert_eq(kvr_l2_store_get(s, K(0), 0, dt_slot(&arena, 3), 0), -ENOENT);
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.files, 1);
	cr_assert_eq(st.used_bytes, FB);
	cr_assert_eq(st.dropped[KVR_L2_R_VANISHED], 1);
	/* the key can be stored again */
	cr_assert_eq(put_wait(s, K(0), 0, 0), 0);
	cr_assert_eq(get_wait(s, K(0), 0).res, 0);
	/* removing works, and removing what is gone is not an error */
	cr_assert_eq(unlink(dt_path(kvr_l2_store_dir(s), K(1), 0, path)), 0);
	cr_assert_eq(kvr_l2_store_remove(s, K(1), 0), 0);
	cr_assert_eq(kvr_l2_store_flush(s), 0);
	cr_assert_eq(kvr_l2_store_poll(s, &d, 1, 0), 0, "a removal has no completion");
	cr_assert_eq(kvr_l2_store_pending(s), 0);
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.unlink_errors, 0);
	cr_assert_eq(st.files, 1);
	cr_assert_eq(kvr_l2_store_remove(s, K(1), 0), -ENOENT);
}

Test(l2store, bad_file_on_read_is_dropped)
{
	s = open_store(100, NULL);
	char path[512];
	struct {
		off_t flip, trunc;
		unsigned reason;
	} cases[] = {
		{4096 + 777, -1, KVR_L2_R_PAYLOAD_CSUM},
		{200, -1, KVR_L2_R_HDR_CSUM},
		{-1, 4096 + 4096, KVR_L2_R_SHORT},
	};
	for (unsigned i = 0; i < 3; i++) {
		cr_assert_eq(put_wait(s, K(i), 0, i), 0);
		dt_path(kvr_l2_store_dir(s), K(i), 0, path);
		if (cases[i].flip >= 0)
			cr_assert_eq(dt_flip(path, cases[i].flip), 0);
		else
			cr_assert_eq(truncate(path, cases[i].trunc), 0);
		struct kvr_l2_done d = get_wait(s, K(i), 0);
		cr_assert_eq(d.res, -EBADMSG, "case %u", i);
		cr_assert_eq(d.reason, cases[i].reason, "case %u: %s", i, kvr_l2_reason_name(d.reason));
		cr_assert(!kvr_l2_store_contains(s, K(i), 0));
		cr_assert_eq(kvr_l2_store_flush(s), 0);
		cr_assert_eq(kvr_l2_store_pending(s), 0);
		cr_assert(!dt_exists(kvr_l2_store_dir(s), strrchr(path, '/') + 1), "case %u: the bad file is unlinked", i);
	}
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.files, 0);
	cr_assert_eq(st.used_bytes, 0);
	cr_assert_eq(st.evicting_bytes, 0);
	cr_assert_eq(st.dropped[KVR_L2_R_PAYLOAD_CSUM], 1);
	cr_assert_eq(st.dropped[KVR_L2_R_HDR_CSUM], 1);
	cr_assert_eq(st.dropped[KVR_L2_R_SHORT], 1);
	cr_assert_eq(st.get_misses, 3);
	cr_assert_eq(st.get_hits, 0);
}

/* defer_verify (the disk actor's mode): a get whose header checks out and whose payload
 * was read whole completes unverified, res 0, the header's checksum with it; only
 * kvr_l2_store_verify compares it. An intact lane stays a hit; a flipped payload byte
 * becomes the PAYLOAD_CSUM miss it is, and the file leaves the index and the disk
 * (read-only: the index only), counted as any bad read. A header fault is still caught
 * before completion. */
static void deferred_case(bool read_only)
{
	struct kvr_l2_store_config cfg = config(&ID, 100);
	s = dt_store_open(&cfg, NULL);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(put_wait(s, K(i), 0, i), 0);
	kvr_l2_store_close(s);
	cfg.read_only = read_only;
	cfg.defer_verify = true;
	s = dt_store_open(&cfg, NULL);
	/* damaged after adoption (which checks headers): only a read finds them */
	char path[512], bad_hdr[512];
	dt_path(kvr_l2_store_dir(s), K(1), 0, path);
	cr_assert_eq(dt_flip(path, 4096 + 777), 0);
	dt_path(kvr_l2_store_dir(s), K(2), 0, bad_hdr);
	cr_assert_eq(dt_flip(bad_hdr, 200), 0);

	uint8_t *dst = dt_slot(&arena, N_SLOTS - 1);
	for (unsigned i = 0; i < 3; i++) {
		memset(dst, 0xcc, arena.slot_bytes);
		cr_assert_eq(kvr_l2_store_get(s, K(i), 0, dst, 88), 0);
		struct kvr_l2_done d = wait_one(s);
		cr_assert_eq(d.kind, KVR_L2_GET);
		if (i == 2) { /* the header is checked before completion, as without defer_verify */
			cr_assert_eq(d.res, -EBADMSG);
			cr_assert_eq(d.reason, KVR_L2_R_HDR_CSUM);
			cr_assert(!d.unverified);
			continue;
		}
		cr_assert_eq(d.res, 0, "key %u: read whole, not yet compared", i);
		cr_assert(d.unverified, "key %u", i);
		cr_assert_eq(kvr_l2_store_verify(s, &d, dst), 0);
		cr_assert(!d.unverified);
		if (i == 0) {
			cr_assert_eq(d.res, 0);
			cr_assert_eq(dt_check(dst, LANE_BYTES, K(0), 0, 3), 0, "the verified hit is byte-exact");
			cr_assert(kvr_l2_store_contains(s, K(0), 0));
			continue;
		}
		cr_assert_eq(d.res, -EBADMSG);
		cr_assert_eq(d.reason, KVR_L2_R_PAYLOAD_CSUM, "%s", kvr_l2_reason_name(d.reason));
		cr_assert(!kvr_l2_store_contains(s, K(1), 0), "a failed checksum leaves the index");
		cr_assert_eq(kvr_l2_store_verify(s, &d, dst), 0, "verified already: nothing more to do");
		cr_assert_eq(d.res, -EBADMSG);
	}
	cr_assert_eq(kvr_l2_store_flush(s), 0);
	cr_assert_eq(kvr_l2_store_pending(s), 0);
	const char *dir = kvr_l2_store_dir(s);
	cr_assert_eq(dt_exists(dir, strrchr(path, '/') + 1), read_only, "the damaged payload's file: %s",
		     read_only ? "kept (read-only)" : "unlinked");
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.files, 1, "key 0 alone is served");
	cr_assert_eq(st.get_hits, 1);
	cr_assert_eq(st.get_misses, 2);
	cr_assert_eq(st.dropped[KVR_L2_R_PAYLOAD_CSUM], 1);
	cr_assert_eq(st.dropped[KVR_L2_R_HDR_CSUM], 1);
	cr_assert_eq(st.bad_kept, read_only ? 2 : 0);
}

Test(l2store, deferred_checksum_is_compared_before_a_hit) { deferred_case(false); }
Test(l2store, deferred_checksum_read_only_keeps_the_file) { deferred_case(true); }

/* A header whose reserved bytes are not all 0 (under a good checksum) is damaged: not adopted and removed
 * at start, a miss and removed when a read finds it; counted under its own reason either way. */
Test(l2store, reserved_bytes_not_zero_are_damaged)
{
	char path[512], dir[256];
	s = open_store(100, NULL);
	for (unsigned i = 0; i < 6; i++)
		cr_assert_eq(put_wait(s, K(i), 0, i), 0);
	snprintf(dir, sizeof(dir), "%s", kvr_l2_store_dir(s));
	kvr_l2_store_close(s);
	s = NULL;
	cr_assert_eq(dt_hdr_poke(dt_path(dir, K(0), 0, path), 100, 0x01), 0);  /* reserved0 */
	cr_assert_eq(dt_hdr_poke(dt_path(dir, K(1), 0, path), 2000, 0xff), 0); /* reserved[] */
	cr_assert_eq(dt_hdr_poke(dt_path(dir, K(2), 0, path), 4087, 0x01), 0); /* the last one */

	struct kvr_l2_adopt_stats a;
	s = open_store(100, &a);
	cr_assert_eq(a.entries, 6);
	cr_assert_eq(a.adopted, 3);
	for (unsigned r = 0; r < KVR_L2_R_MAX; r++)
		cr_assert_eq(a.rejected[r], r == KVR_L2_R_RESERVED ? 3u : 0u, "reason %s: %llu", kvr_l2_reason_name(r),
			     (unsigned long long)a.rejected[r]);
	cr_assert_eq(a.deleted, 3);
	for (unsigned i = 0; i < 3; i++) {
		cr_assert(!kvr_l2_store_contains(s, K(i), 0), "block %u not served", i);
		cr_assert(!dt_exists(dir, strrchr(dt_path(dir, K(i), 0, path), '/') + 1), "block %u removed", i);
		cr_assert_eq(get_wait(s, K(i), 0).res, -ENOENT);
	}
	/* a file damaged the same way after adoption: the read is a miss and drops it */
	cr_assert_eq(dt_hdr_poke(dt_path(dir, K(3), 0, path), 1234, 0x10), 0);
	struct kvr_l2_done d = get_wait(s, K(3), 0);
	cr_assert_eq(d.res, -EBADMSG);
	cr_assert_eq(d.reason, KVR_L2_R_RESERVED, "%s", kvr_l2_reason_name(d.reason));
	cr_assert(!kvr_l2_store_contains(s, K(3), 0));
	cr_assert_eq(kvr_l2_store_flush(s), 0);
	cr_assert(!dt_exists(dir, strrchr(path, '/') + 1), "the damaged file is unlinked");
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.dropped[KVR_L2_R_RESERVED], 1);
	cr_assert_eq(st.files, 2);
	for (unsigned i = 4; i < 6; i++)
		cr_assert_eq(get_wait(s, K(i), 0).res, 0, "block %u intact and served byte-exact", i);
}

/* Place a crafted block file image of (key, lane) under ident into the namespace dir of ID. */
static void craft(const char *dir, const struct kvr_l2_ident *ident, kvr_key key, uint32_t lane, const char *as_name)
{
	uint8_t *img = dt_image(ident, key, lane, 3);
	char path[512], name[KVR_L2_NAME_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, as_name ? as_name : kvr_l2_name_fmt(key, lane, name));
	cr_assert_eq(dt_write_file(path, img, kvr_l2_file_bytes(ident->lane_bytes)), 0);
	free(img);
}

Test(l2store, adoption_table)
{
	/* the good blocks 0..11 written through a store, which is then closed */
	s = open_store(100, NULL);
	for (unsigned i = 0; i < 12; i++)
		cr_assert_eq(put_wait(s, K(i), 0, i), 0);
	char dir[256];
	snprintf(dir, sizeof(dir), "%s", kvr_l2_store_dir(s));
	kvr_l2_store_close(s);
	s = NULL;

	/* another model's namespace next to ours: must be left exactly as it is */
	struct kvr_l2_ident other_ns = ID;
	other_ns.ns.lo ^= 0xff;
	{
		struct kvr_l2_store_config cfg = config(&other_ns, 100);
		struct kvr_l2_store *o = dt_store_open(&cfg, NULL);
		for (unsigned i = 0; i < 3; i++)
			cr_assert_eq(put_wait(o, dt_key(7, i), 0, i), 0);
		kvr_l2_store_close(o);
	}
	char odir[256], hex[KVR_KEY_FMT_LEN];
	snprintf(odir, sizeof(odir), "%s/%s", root, kvr_l2_ns_dir_fmt(other_ns.ns, hex));
	cr_assert_eq(dt_list(odir).real, 3);

	char path[512], name[KVR_L2_NAME_MAX];
	/* damage some of ours */
	cr_assert_eq(truncate(dt_path(dir, K(0), 0, path), 4096 + 100), 0);           /* size */
	cr_assert_eq(truncate(dt_path(dir, K(1), 0, path), 1000), 0);                 /* short */
	cr_assert_eq(dt_flip(dt_path(dir, K(2), 0, path), 4096 + 5), 0);              /* payload: adopted, caught on read */
	cr_assert_eq(dt_flip(dt_path(dir, K(3), 0, path), 64), 0);                    /* header byte */
	cr_assert_eq(truncate(dt_path(dir, K(4), 0, path), (off_t)FB + 4096), 0);     /* size: too long */
	char other[512];
	cr_assert_eq(rename(dt_path(dir, K(5), 0, path), dt_path(dir, K(100), 0, other)), 0); /* key */
	/* crafted files under our names */
	craft(dir, &other_ns, K(101), 0, NULL);                                        /* namespace */
	struct kvr_l2_ident bt = ID;
	bt.block_tokens = 128;
	craft(dir, &bt, K(102), 0, NULL);                                              /* block size */
	struct kvr_l2_ident lb = ID;
	lb.lane_bytes = 8192;
	craft(dir, &lb, K(103), 0, NULL);                                              /* lane_bytes */
	struct kvr_l2_ident fp = ID;
	fp.fingerprint.hi ^= 1;
	craft(dir, &fp, K(104), 0, NULL);                                              /* fingerprint */
	static uint8_t junk[8192];
	memset(junk, 'j', sizeof(junk));
	cr_assert_eq(dt_write_file(dt_path(dir, K(105), 0, path), junk, sizeof(junk)), 0); /* magic */
	craft(dir, &ID, K(106), 7, NULL);                                              /* lane 7 of 2 */
	/* foreign things: left alone */
	snprintf(path, sizeof(path), "%s/notes.txt", dir);
	cr_assert_eq(dt_write_file(path, "hello", 5), 0);
	kvr_l2_name_fmt(K(107), 0, name);
	for (char *c = name; *c; c++)
		if (*c >= 'a' && *c <= 'f')
			*c = (char)(*c - 'a' + 'A');
	craft(dir, &ID, K(107), 0, name);                                              /* upper case name */
	cr_assert_eq(mkdir(dt_path(dir, K(108), 0, path), 0755), 0);                   /* a dir with our name */
	snprintf(path, sizeof(path), "%s/subdir", dir);
	cr_assert_eq(mkdir(path, 0755), 0);
	/* a leftover temporary file of a complete-looking block */
	char tmp[KVR_L2_TMP_MAX];
	craft(dir, &ID, K(109), 0, kvr_l2_tmp_name_fmt(K(109), 0, 99999, 3, tmp));

	struct kvr_l2_adopt_stats a;
	s = open_store(100, &a);
	cr_assert_eq(a.entries, 11 + 1 + 6 + 4 + 1, "every entry seen once (%llu)", (unsigned long long)a.entries);
	cr_assert_eq(a.adopted, 7, "blocks 2, 6..11 adopted (%llu)", (unsigned long long)a.adopted);
	cr_assert_eq(a.adopted_bytes, 7 * FB);
	uint64_t want[KVR_L2_R_MAX] = {0};
	want[KVR_L2_R_SIZE] = 2;
	want[KVR_L2_R_SHORT] = 1;
	want[KVR_L2_R_HDR_CSUM] = 1;
	want[KVR_L2_R_KEY] = 1;
	want[KVR_L2_R_NS] = 1;
	want[KVR_L2_R_BLOCK_TOKENS] = 1;
	want[KVR_L2_R_LANE_BYTES] = 1;
	want[KVR_L2_R_FINGERPRINT] = 1;
	want[KVR_L2_R_MAGIC] = 1;
	want[KVR_L2_R_LANE] = 1;
	want[KVR_L2_R_FOREIGN] = 3; /* notes.txt, the upper-case name, subdir */
	want[KVR_L2_R_NOTREG] = 1;  /* the directory with our name */
	want[KVR_L2_R_TMP] = 1;
	for (unsigned r = 0; r < KVR_L2_R_MAX; r++)
		cr_assert_eq(a.rejected[r], want[r], "reason %s: %llu, want %llu", kvr_l2_reason_name(r),
			     (unsigned long long)a.rejected[r], (unsigned long long)want[r]);
	cr_assert_eq(a.deleted, 12, "tmp + every bad file of ours");
	cr_assert_eq(a.left_alone, 4);
	struct dt_listing l = dt_list(dir);
	cr_assert_eq(l.real, 7 + 1, "adopted + the directory with our name");
	cr_assert_eq(l.tmp, 0);
	cr_assert_eq(l.other, 3, "foreign entries untouched");
	cr_assert_eq(dt_list(odir).real, 3, "the other namespace's files are untouched");

	/* block 2 passed adoption (header only) but its payload is caught on read */
	struct kvr_l2_done d = get_wait(s, K(2), 0);
	cr_assert_eq(d.res, -EBADMSG);
	cr_assert_eq(d.reason, KVR_L2_R_PAYLOAD_CSUM);
	for (unsigned i = 6; i < 12; i++)
		cr_assert_eq(get_wait(s, K(i), 0).res, 0, "block %u adopted and served byte-exact", i);
	for (unsigned i = 100; i < 110; i++)
		cr_assert(!kvr_l2_store_contains(s, K(i), 0) && !kvr_l2_store_contains(s, K(i), 1));
	cr_assert(!kvr_l2_store_contains(s, K(5), 0));
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.files, 6);
	cr_assert_eq(st.used_bytes, 6 * FB);
}

Test(l2store, adoption_keeps_newest_in_mtime_order)
{
	s = open_store(100, NULL);
	enum { N = 10, CAP = 6 };
	for (unsigned i = 0; i < N; i++)
		cr_assert_eq(put_wait(s, K(i), i % 2, i), 0);
	char dir[256];
	snprintf(dir, sizeof(dir), "%s", kvr_l2_store_dir(s));
	kvr_l2_store_close(s);
	s = NULL;
	/* a random order of write times */
	unsigned perm[N];
	struct rng r = {test_seed("l2store.adoption_keeps_newest_in_mtime_order")};
	for (unsigned i = 0; i < N; i++)
		perm[i] = i;
	for (unsigned i = N - 1; i > 0; i--) {
		unsigned j = rng_below(&r, i + 1), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	char path[512];
	for (unsigned i = 0; i < N; i++) /* block i written at time 1e9 + perm[i] */
		cr_assert_eq(dt_set_mtime(dt_path(dir, K(i), i % 2, path), 1000000000 + perm[i]), 0);

	struct kvr_l2_adopt_stats a;
	s = open_store(CAP, &a);
	cr_assert_eq(a.adopted, CAP);
	cr_assert_eq(a.rejected[KVR_L2_R_OVER_CAP], N - CAP);
	cr_assert_eq(a.deleted, N - CAP);
	/* kept: the CAP newest (perm >= N - CAP), in the LRU oldest first */
	kvr_key keys[N];
	uint32_t lanes[N];
	cr_assert_eq(kvr_l2_store_lru(s, keys, lanes, N), CAP);
	for (unsigned pos = 0; pos < CAP; pos++) {
		unsigned want_time = N - CAP + pos, b = 0;
		while (perm[b] != want_time)
			b++;
		cr_assert(kvr_key_eq(keys[pos], K(b)) && lanes[pos] == b % 2, "LRU position %u is block %u", pos, b);
	}
	for (unsigned i = 0; i < N; i++) {
		bool kept = perm[i] >= N - CAP;
		cr_assert_eq(kvr_l2_store_contains(s, K(i), i % 2), kept);
		cr_assert_eq(dt_exists(dir, strrchr(dt_path(dir, K(i), i % 2, path), '/') + 1), kept,
			     "block %u (time %u)", i, perm[i]);
	}
	/* the next put evicts the oldest adopted block */
	unsigned oldest = 0;
	while (perm[oldest] != N - CAP)
		oldest++;
	cr_assert_eq(put_wait(s, K(50), 0, 0), 0);
	cr_assert(!kvr_l2_store_contains(s, K(oldest), oldest % 2));
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(s, &st);
	cr_assert_eq(st.used_bytes, CAP * FB);
}

Test(l2store, directory_lock)
{
	s = open_store(10, NULL);
	struct kvr_l2_store *two = (struct kvr_l2_store *)0x1;
	struct kvr_l2_store_config cfg = config(&ID, 10);
	cr_assert_eq(kvr_l2_store_open(&cfg, NULL, &two), -EBUSY, "one store per namespace directory");
	cr_assert_eq(two, (struct kvr_l2_store *)0x1);
	struct kvr_l2_ident other = ID;
	other.ns.hi++;
	cfg = config(&other, 10);
	two = dt_store_open(&cfg, NULL);
	kvr_l2_store_close(two);
	kvr_l2_store_close(s);
	s = NULL;
	cfg = config(&ID, 10);
	s = dt_store_open(&cfg, NULL);
	cfg.root = "/nonexistent/kvr-l2";
	cr_assert_eq(kvr_l2_store_open(&cfg, NULL, &two), -ENOENT);
	cfg = config(&ID, 10);
	cfg.lanes = 0;
	cr_assert_eq(kvr_l2_store_open(&cfg, NULL, &two), -EINVAL);
	kvr_l2_store_close(NULL);
}

/* kill -9 a writer mid-way; adoption must count exactly the renamed files and serve no tmp. */
static void crash_case(enum kvr_l2_durability dur)
{
	enum { LANES = 2, CHILD_QD = 16, MIN_DONE = 40 };
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		struct kvr_l2_store_config cfg = config(&ID, 100000);
		cfg.queue_depth = CHILD_QD;
		cfg.durability = dur;
		struct kvr_l2_store *c = NULL;
		if (kvr_l2_store_open(&cfg, NULL, &c))
			_exit(2);
		for (unsigned i = 0; i < N_SLOTS; i++)
			dt_fill(dt_slot(&arena, i), LANE_BYTES, K(1000 + i), i % LANES, 3);
		/* keep CHILD_QD writes in flight forever; block i always comes from slot i % N_SLOTS
		 * with key K(1000 + i % N_SLOTS + N_SLOTS * round) -> the pattern is the slot's */
		uint64_t i = 0;
		for (;;) {
			kvr_key key = K(1000 + (unsigned)(i % N_SLOTS));
			key.hi += i / N_SLOTS; /* a new key per round, same payload */
			int rc = kvr_l2_store_put(c, key, (unsigned)(i % N_SLOTS) % LANES, dt_slot(&arena, i % N_SLOTS), i);
			if (rc == 0) {
				i++;
				continue;
			}
			struct kvr_l2_done d[CHILD_QD];
			int n = kvr_l2_store_poll(c, d, CHILD_QD, 1);
			for (int k = 0; k < n; k++)
				if (d[k].res == 0 && write(pfd[1], "w", 1) != 1)
					_exit(3);
		}
	}
	close(pfd[1]);
	char b;
	unsigned done = 0;
	while (done < MIN_DONE && read(pfd[0], &b, 1) == 1)
		done++;
	cr_assert_eq(done, MIN_DONE, "the child reported %u writes", done);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	while (read(pfd[0], &b, 1) == 1)
		done++; /* completions reported before the kill */
	close(pfd[0]);

	char dir[256], hex[KVR_KEY_FMT_LEN];
	snprintf(dir, sizeof(dir), "%s/%s", root, kvr_l2_ns_dir_fmt(ID.ns, hex));
	struct dt_listing before = dt_list(dir);
	fprintf(stderr, "crash (%s): %u writes reported, %u renamed files, %u temporary files\n",
		kvr_l2_durability_name(dur), done, before.real, before.tmp);
	cr_assert_geq(before.real, done, "every reported write has its file");
	cr_assert_eq(before.other, 0);

	struct kvr_l2_adopt_stats a;
	s = open_store(100000, &a);
	cr_assert_eq(a.adopted, before.real, "adoption counts exactly the renamed (complete) files");
	cr_assert_eq(a.rejected[KVR_L2_R_TMP], before.tmp, "every temporary file removed");
	for (unsigned r = 0; r < KVR_L2_R_MAX; r++)
		if (r != KVR_L2_R_TMP)
			cr_assert_eq(a.rejected[r], 0, "nothing else rejected (%s)", kvr_l2_reason_name(r));
	struct dt_listing after = dt_list(dir);
	cr_assert_eq(after.real, before.real);
	cr_assert_eq(after.tmp, 0);
	/* every adopted file is served byte-exact */
	DIR *d = opendir(dir);
	struct dirent *de;
	unsigned served = 0;
	uint8_t *dst = dt_slot(&arena, N_SLOTS - 1);
	while ((de = readdir(d))) {
		kvr_key key;
		uint32_t lane;
		if (kvr_l2_name_parse(de->d_name, &key, &lane))
			continue;
		cr_assert_eq(kvr_l2_store_get(s, key, lane, dst, 0), 0);
		struct kvr_l2_done g = wait_one(s);
		cr_assert_eq(g.res, 0, "%s: %s", de->d_name, kvr_l2_reason_name(g.reason));
		/* the payload is that of slot (key.lo's block) with the round's original key */
		unsigned slot = 0;
		while (slot < N_SLOTS && K(1000 + slot).lo != key.lo)
			slot++;
		cr_assert_lt(slot, N_SLOTS);
		cr_assert_eq(dt_check(dst, LANE_BYTES, K(1000 + slot), slot % LANES, 3), 0);
		served++;
	}
	closedir(d);
	cr_assert_eq(served, before.real);
}

Test(l2store, kill9_mid_write_none) { crash_case(KVR_L2_DUR_NONE); }
Test(l2store, kill9_mid_write_batch) { crash_case(KVR_L2_DUR_BATCH); }

DT_MAIN_NEEDS_URING

/* A store of several block sizes (ident.block_tokens 0: an instance without a model
 * section) writes each file with the block size its put names and needs one; a get that
 * names one is served only a file that says it. A store of one block size takes no other. */
Test(l2store, a_store_of_several_block_sizes_records_each_files_own)
{
	struct kvr_l2_ident mixed = ID;
	mixed.block_tokens = 0;
	struct kvr_l2_store_config cfg = config(&mixed, 8);
	s = dt_store_open(&cfg, NULL);
	dt_fill(dt_slot(&arena, 0), LANE_BYTES, K(1), 0, 3);
	cr_assert_eq(kvr_l2_store_put(s, K(1), 0, dt_slot(&arena, 0), 1), -EINVAL, "a file must name its block size");
	cr_assert_eq(kvr_l2_store_put_as(s, K(1), 0, 32, dt_slot(&arena, 0), 77), 0);
	struct kvr_l2_done d = wait_one(s);
	cr_assert(d.kind == KVR_L2_PUT && d.res == 0, "put: %d", d.res);

	char path[512];
	struct kvr_l2_hdr h;
	char name[KVR_L2_NAME_MAX];
	kvr_l2_name_fmt(K(1), 0, name);
	snprintf(path, sizeof(path), "%s/%s", kvr_l2_store_dir(s), name);
	int fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0, "%s", path);
	cr_assert_eq(pread(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
	close(fd);
	cr_assert_eq(h.block_tokens, 32, "the header says the put's block size");

	uint8_t *dst = dt_slot(&arena, N_SLOTS - 1);
	cr_assert_eq(kvr_l2_store_get_as(s, K(1), 0, 32, dst, 88), 0);
	d = wait_one(s);
	cr_assert_eq(d.res, 0);
	cr_assert_eq(dt_check(dst, LANE_BYTES, K(1), 0, 3), 0, "byte-exact");
	cr_assert_eq(kvr_l2_store_get_as(s, K(1), 0, 16, dst, 89), 0);
	d = wait_one(s);
	cr_assert(d.res == -EBADMSG && d.reason == KVR_L2_R_BLOCK_TOKENS, "a get of 16-token blocks: %d, %s", d.res,
		  kvr_l2_reason_name(d.reason));
	kvr_l2_store_close(s);

	/* a store of one block size: its own, or 0 */
	cfg = config(&ID, 8);
	s = dt_store_open(&cfg, NULL);
	cr_assert_eq(kvr_l2_store_put_as(s, K(2), 0, 32, dt_slot(&arena, 0), 1), -EINVAL);
	cr_assert_eq(put_wait(s, K(2), 0, 0), 0);
}
