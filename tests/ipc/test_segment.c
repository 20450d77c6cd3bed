/* Segment tests: memfd create/map round trip, header, mode, seals, validation, read-only maps. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "kvr_segment.h"
#include "ipc_test.h"

static struct kvr_segment seg = {.fd = -1}, seg2 = {.fd = -1};

static void teardown(void)
{
	kill_kids();
	kvr_segment_close(&seg);
	kvr_segment_close(&seg2);
}

TestSuite(segment, .fini = teardown);

static void fill_canary(struct kvr_segment *s)
{
	memset(s, 0x5c, sizeof(*s));
}

static int is_canary(const struct kvr_segment *s)
{
	struct kvr_segment c;
	fill_canary(&c);
	return memcmp(s, &c, sizeof(c)) == 0;
}

Test(segment, create_and_map_round_trip)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t t0 = kvr_realtime_ns();
	cr_assert_eq(kvr_segment_create("kvr-test-seg", KVR_SEG_ARENA, 10000, 7, 0, &seg), 0);
	uint64_t t1 = kvr_realtime_ns();
	size_t want = (10000 + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
	cr_assert_eq(seg.size, want);
	cr_assert_geq(seg.fd, 0);
	cr_assert_not_null(seg.base);
	cr_assert_eq(seg.writable, 1);
	cr_assert_eq(seg.huge, 0);

	const struct kvr_seg_hdr *h = kvr_segment_hdr(&seg);
	cr_assert_eq(h->magic, KVR_SEG_MAGIC);
	cr_assert_eq(h->layout_version, KVR_LAYOUT_VERSION);
	cr_assert_eq(h->kind, KVR_SEG_ARENA);
	cr_assert_eq(h->size, want);
	cr_assert_eq(h->creator_pid, getpid());
	cr_assert_eq(h->generation, 7);
	cr_assert(h->created_ns >= t0 && h->created_ns <= t1);
	for (size_t i = 0; i < sizeof(h->reserved); i++)
		cr_assert_eq(h->reserved[i], 0);

	/* bytes written through one mapping appear in the other, both ways */
	uint8_t *a = seg.base;
	for (size_t i = sizeof(*h); i < seg.size; i++)
		a[i] = (uint8_t)(i * 13);
	cr_assert_eq(kvr_segment_map(seg.fd, KVR_SEG_ARENA, 1, &seg2), 0);
	cr_assert_neq(seg2.fd, seg.fd, "map must dup the fd");
	cr_assert_neq(seg2.base, seg.base);
	cr_assert_eq(seg2.size, seg.size);
	cr_assert_eq(seg2.writable, 1);
	cr_assert_arr_eq(seg2.base, seg.base, seg.size);
	((uint8_t *)seg2.base)[seg.size - 1] = 0x77;
	cr_assert_eq(a[seg.size - 1], 0x77);

	/* the caller's fd survives closing the mapping made from it */
	int fd = seg.fd;
	kvr_segment_close(&seg2);
	cr_assert_eq(seg2.fd, -1);
	cr_assert_null(seg2.base);
	cr_assert_geq(fcntl(fd, F_GETFD), 0);
	cr_assert_eq(kvr_segment_map(seg.fd, 0, 0, &seg2), 0, "expect_kind 0 accepts any kind");
	cr_assert_eq(seg2.writable, 0);
	cr_assert_eq(((uint8_t *)seg2.base)[seg.size - 1], 0x77);
}

Test(segment, mode_and_seals)
{
	cr_assert_eq(kvr_segment_create("kvr-test-seal", KVR_SEG_SLOTS, 3 * 4096, 1, 0, &seg), 0);
	struct stat st;
	cr_assert_eq(fstat(seg.fd, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);
	cr_assert_eq((size_t)st.st_size, seg.size);
	cr_assert_eq(st.st_uid, getuid());

	int seals = fcntl(seg.fd, F_GET_SEALS);
	cr_assert_eq(seals & (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL), F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL,
		     "seals 0x%x", seals);
	errno = 0;
	cr_assert_eq(ftruncate(seg.fd, (off_t)seg.size * 2), -1);
	cr_assert_eq(errno, EPERM, "grow: %s", strerror(errno));
	errno = 0;
	cr_assert_eq(ftruncate(seg.fd, 4096), -1);
	cr_assert_eq(errno, EPERM, "shrink: %s", strerror(errno));
	errno = 0;
	cr_assert_eq(fcntl(seg.fd, F_ADD_SEALS, F_SEAL_WRITE), -1, "seals can still be added");
	cr_assert_eq(errno, EPERM);
	cr_assert_eq(fstat(seg.fd, &st), 0);
	cr_assert_eq((size_t)st.st_size, seg.size);
	cr_assert(fcntl(seg.fd, F_GETFD) & FD_CLOEXEC, "segment fd is not close-on-exec");

	/* and the dup a map makes carries the same seals */
	cr_assert_eq(kvr_segment_map(seg.fd, KVR_SEG_SLOTS, 1, &seg2), 0);
	errno = 0;
	cr_assert_eq(ftruncate(seg2.fd, 0), -1);
	cr_assert_eq(errno, EPERM);
	cr_assert(fcntl(seg2.fd, F_GETFD) & FD_CLOEXEC);
}

Test(segment, huge_pages_or_fallback)
{
	cr_assert_eq(kvr_segment_create("kvr-test-huge", KVR_SEG_ARENA, 2u << 20, 3, KVR_SEG_TRY_HUGE, &seg), 0);
	cr_assert_eq(seg.size, 2u << 20);
	cr_assert(seg.huge == 0 || seg.huge == 1);
	cr_assert_eq(kvr_segment_hdr(&seg)->size, seg.size);
	cr_assert_eq(kvr_segment_hdr(&seg)->kind, KVR_SEG_ARENA);
	memset((uint8_t *)seg.base + 64, 0xab, seg.size - 64);
	cr_assert_eq(kvr_segment_map(seg.fd, KVR_SEG_ARENA, 1, &seg2), 0);
	cr_assert_eq(((uint8_t *)seg2.base)[seg.size - 1], 0xab);
	fprintf(stderr, "segment: 2 MiB with KVR_SEG_TRY_HUGE got %s pages\n", seg.huge ? "huge" : "normal");

	/* a size that is not a multiple of 2 MiB never tries huge pages */
	kvr_segment_close(&seg2);
	kvr_segment_close(&seg);
	cr_assert_eq(kvr_segment_create("kvr-test-huge", KVR_SEG_ARENA, 4096, 3, KVR_SEG_TRY_HUGE, &seg), 0);
	cr_assert_eq(seg.huge, 0);
	cr_assert_eq(seg.size, 4096);
}

Test(segment, create_rejects)
{
	struct kvr_segment s;
	fill_canary(&s);
	cr_assert_eq(kvr_segment_create(NULL, KVR_SEG_ARENA, 4096, 1, 0, &s), -EINVAL);
	cr_assert_eq(kvr_segment_create("x", KVR_SEG_ARENA, 63, 1, 0, &s), -EINVAL);
	cr_assert_eq(kvr_segment_create("x", KVR_SEG_ARENA, 0, 1, 0, &s), -EINVAL);
	cr_assert(is_canary(&s), "ret written on failure");
	cr_assert_eq(kvr_segment_create("x", KVR_SEG_ARENA, 4096, 1, 0, NULL), -EINVAL);
}

/* A copy of seg's contents in a fresh memfd of `size` bytes, with one field changed. */
static int corrupt_copy(size_t size, void (*edit)(struct kvr_seg_hdr *))
{
	int fd = memfd_create("kvr-test-corrupt", MFD_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, (off_t)size), 0);
	uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert_neq(p, MAP_FAILED);
	memcpy(p, seg.base, size < seg.size ? size : seg.size);
	if (edit)
		edit((struct kvr_seg_hdr *)p);
	munmap(p, size);
	return fd;
}

static void bad_magic(struct kvr_seg_hdr *h) { h->magic ^= 0x100; }
static void bad_version(struct kvr_seg_hdr *h) { h->layout_version = KVR_LAYOUT_VERSION + 1; }
static void bad_size_small(struct kvr_seg_hdr *h) { h->size -= 4096; }
static void bad_size_big(struct kvr_seg_hdr *h) { h->size += 4096; }
static void bad_size_huge(struct kvr_seg_hdr *h) { h->size = UINT64_MAX; }
static void bad_kind(struct kvr_seg_hdr *h) { h->kind = KVR_SEG_KV; }

Test(segment, map_rejects)
{
	cr_assert_eq(kvr_segment_create("kvr-test-rej", KVR_SEG_SLOTS, 2 * 4096, 1, 0, &seg), 0);
	static const struct {
		const char *what;
		void (*edit)(struct kvr_seg_hdr *);
		int expect_kind;
		int want;
	} t[] = {
		{"good", NULL, KVR_SEG_SLOTS, 0},
		{"good, any kind", NULL, 0, 0},
		{"wrong kind", NULL, KVR_SEG_CTL, -EMEDIUMTYPE},
		{"wrong kind in header", bad_kind, KVR_SEG_SLOTS, -EMEDIUMTYPE},
		{"wrong magic", bad_magic, KVR_SEG_SLOTS, -EPROTO},
		{"wrong magic, any kind", bad_magic, 0, -EPROTO},
		{"wrong version", bad_version, KVR_SEG_SLOTS, -EPROTO},
		{"header size too small", bad_size_small, KVR_SEG_SLOTS, -EBADMSG},
		{"header size too big", bad_size_big, KVR_SEG_SLOTS, -EBADMSG},
		{"header size ~0", bad_size_huge, 0, -EBADMSG},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		int fd = corrupt_copy(seg.size, t[i].edit);
		for (int writable = 0; writable < 2; writable++) {
			struct kvr_segment s;
			fill_canary(&s);
			int rc = kvr_segment_map(fd, (enum kvr_seg_kind)t[i].expect_kind, writable, &s);
			cr_expect_eq(rc, t[i].want, "%s (writable %d): got %d, want %d", t[i].what, writable, rc, t[i].want);
			if (rc == 0)
				kvr_segment_close(&s);
			else
				cr_expect(is_canary(&s), "%s: ret written on failure", t[i].what);
		}
		close(fd);
	}

	/* an fd whose size disagrees with an otherwise good header, and one too small for it */
	int fd = corrupt_copy(seg.size + 4096, NULL);
	struct kvr_segment s;
	fill_canary(&s);
	cr_expect_eq(kvr_segment_map(fd, KVR_SEG_SLOTS, 1, &s), -EBADMSG);
	close(fd);
	fd = corrupt_copy(32, NULL);
	cr_expect_eq(kvr_segment_map(fd, 0, 0, &s), -EBADMSG);
	close(fd);
	fd = memfd_create("kvr-test-empty", MFD_CLOEXEC);
	cr_expect_eq(kvr_segment_map(fd, 0, 0, &s), -EBADMSG);
	close(fd);
	cr_expect_eq(kvr_segment_map(-1, 0, 0, &s), -EINVAL);
	cr_expect_eq(kvr_segment_map(1000000, 0, 0, &s), -EBADF);
	cr_expect(is_canary(&s), "ret written on failure");
	cr_expect_eq(kvr_segment_map(seg.fd, 0, 0, NULL), -EINVAL);
}

static int write_readonly(void *arg)
{
	struct kvr_segment *ro = arg;
	/* the sanitizers catch SIGSEGV to report it; here it is the expected outcome */
	signal(SIGSEGV, SIG_DFL);
	signal(SIGBUS, SIG_DFL);
	volatile uint8_t *p = (uint8_t *)ro->base + 100;
	uint8_t v = *p; /* reading is fine */
	*p = (uint8_t)(v + 1);
	return 0;
}

Test(segment, readonly_mapping_faults_on_write)
{
	cr_assert_eq(kvr_segment_create("kvr-test-ro", KVR_SEG_CTL, 4096, 1, 0, &seg), 0);
	((uint8_t *)seg.base)[100] = 41;
	cr_assert_eq(kvr_segment_map(seg.fd, KVR_SEG_CTL, 0, &seg2), 0);
	cr_assert_eq(seg2.writable, 0);
	cr_assert_eq(((uint8_t *)seg2.base)[100], 41);
	pid_t pid = spawn(write_readonly, &seg2);
	cr_assert_gt(pid, 0);
	int st;
	cr_assert_eq(reap(pid, 10000, &st), 0);
	cr_assert(WIFSIGNALED(st), "the write to a read-only mapping did not kill the child (exit %d)", exit_code(st));
	cr_assert_eq(WTERMSIG(st), SIGSEGV, "child died of signal %d", WTERMSIG(st));
	cr_assert_eq(((uint8_t *)seg.base)[100], 41, "the read-only write landed");
}

Test(segment, close_accepts_null_zeroed_and_twice)
{
	kvr_segment_close(NULL);
	int fd0_open = fcntl(0, F_GETFD) >= 0;
	struct kvr_segment z = {0};
	kvr_segment_close(&z);
	cr_assert_eq(z.fd, -1);
	cr_assert_eq(fcntl(0, F_GETFD) >= 0, fd0_open, "closing a zeroed segment closed fd 0");
	cr_assert_eq(kvr_segment_create("kvr-test-close", KVR_SEG_ARENA, 4096, 1, 0, &seg), 0);
	int fd = seg.fd;
	kvr_segment_close(&seg);
	cr_assert_eq(seg.fd, -1);
	cr_assert_null(seg.base);
	cr_assert_eq(fcntl(fd, F_GETFD), -1, "fd left open");
	kvr_segment_close(&seg);
	cr_assert_eq(seg.fd, -1);
}
