/* Tests for the host backend: memfd KV memory <-> arena segment round trips, tails, tickets, stats, errors. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvr_segment.h"
#include "kvr_xfer.h"

/*
 * Geometry (16 blocks):
 *   region 0 "K":    offset 0,      stride 8192, page 4133 = 4096 semantic + 37 opaque tail
 *   region 1 "V":    offset 131072, stride 4133, page 4133 (exact fit, odd width)
 *   region 2 "tail": offset 197200, stride 40,   page 37   (an opaque 37-byte state region)
 * slot bytes 8303; arena slots every 16384 bytes from arena offset 4096 (after the header).
 */
#define NB 16
#define SEM 4096u
#define TAIL 37u
#define KV_SIZE (197200u + NB * 40u)
#define SLOT0 4096u
#define SLOT_STRIDE 16384u
#define ARENA_SIZE (SLOT0 + NB * SLOT_STRIDE)

static const struct kvr_xfer_region geo[3] = {
	{ 0, 8192, SEM + TAIL, SEM }, /* sem_bytes 4096: the planner must still move all 4133 */
	{ 131072, 4133, 4133, 0 },
	{ 197200, 40, TAIL, 0 },
};

static int kv_fd = -1;
static unsigned char *kv;         /* our own mapping of the worker's KV memory */
static struct kvr_segment arena;
static uint64_t seed;

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void fill_random(unsigned char *p, size_t n, uint64_t s)
{
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = rng_next(&s);
		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
}

static void setup(void)
{
	char name[64];
	const char *e = getenv("KVR_TEST_SEED");

	seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	fprintf(stderr, "xfer_host seed=%#lx (KVR_TEST_SEED to repeat)\n", (unsigned long)seed);

	snprintf(name, sizeof(name), "kvr-test-kv-%d", getpid());
	kv_fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(kv_fd, 0);
	cr_assert_eq(ftruncate(kv_fd, KV_SIZE), 0);
	kv = mmap(NULL, KV_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, kv_fd, 0);
	cr_assert_neq(kv, MAP_FAILED);
	fill_random(kv, KV_SIZE, seed);

	snprintf(name, sizeof(name), "kvr-test-arena-%d", getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_ARENA, ARENA_SIZE, 1, 0, &arena), 0);
	memset((unsigned char *)arena.base + SLOT0, 0xee, ARENA_SIZE - SLOT0);
}

static void teardown(void)
{
	if (kv && kv != MAP_FAILED)
		munmap(kv, KV_SIZE);
	if (kv_fd >= 0)
		close(kv_fd);
	kvr_segment_close(&arena);
}

TestSuite(xfer_host, .init = setup, .fini = teardown);

static struct kvr_xfer_layout layout(const struct kvr_xfer_region *g, uint32_t n)
{
	return (struct kvr_xfer_layout){
		.regions = g, .n_regions = n, .num_blocks = NB, .kv_size = KV_SIZE, .arena_size = arena.size,
	};
}

static struct kvr_xfer *open_host(void)
{
	struct kvr_xfer_kvmem m = { .kind = KVR_XFER_MEM_HOST, .size = KV_SIZE, .u.host = { .fd = kv_fd } };
	struct kvr_xfer_arena a = { .base = arena.base, .size = arena.size };
	struct kvr_xfer *x = NULL;

	cr_assert_eq(kvr_xfer_open(&m, &a, &x), 0);
	cr_assert_not_null(x);
	cr_assert_str_eq(kvr_xfer_backend_name(x), "host");
	return x;
}

/* Plan, submit, wait; returns the stats and checks them against the plan. */
static struct kvr_xfer_stats move(struct kvr_xfer *x, const struct kvr_xfer_layout *l, uint32_t dir,
				  const uint32_t *ids, const uint64_t *slots, size_t n)
{
	struct kvr_xfer_run runs[NB * 3];
	struct kvr_xfer_stats st = { 0 };
	struct kvr_xfer_err err;
	uint64_t bytes = 0, ticket = 0;
	int nr = kvr_xfer_plan(l, ids, slots, n, runs, NB * 3, &bytes, &err);

	cr_assert_geq(nr, 0, "plan: %d (what %u index %u)", nr, err.what, err.index);
	cr_assert_eq(kvr_xfer_submit(x, dir, runs, (size_t)nr, NULL, &ticket), 0);
	cr_assert_neq(ticket, 0);
	cr_assert_eq(kvr_xfer_wait(x, ticket, 1000000000, &st), 0);
	cr_assert_eq(st.bytes, bytes, "stats bytes %lu, plan %lu", (unsigned long)st.bytes, (unsigned long)bytes);
	cr_assert_eq(st.runs, (uint64_t)nr);
	cr_assert_eq(st.copies, (uint64_t)nr);
	cr_assert_eq(st.queue_ns, 0);
	cr_assert_eq(kvr_xfer_poll(x, ticket, &st), -ENOENT, "a reaped ticket is gone");
	return st;
}

static const uint32_t ids[] = { 5, 2, 9, 10, 11, 0, 15 };
static const uint64_t slot_idx[] = { 3, 0, 7, 8, 9, 1, 12 };
#define N (sizeof(ids) / sizeof(ids[0]))

static void slots_of(uint64_t *slots)
{
	for (size_t i = 0; i < N; i++)
		slots[i] = SLOT0 + slot_idx[i] * SLOT_STRIDE;
}

/* 1 where a byte of KV memory belongs to a page of a block in ids[] under layout g. */
static unsigned char *kv_mask(const struct kvr_xfer_region *g, uint32_t nr)
{
	unsigned char *m = calloc(1, KV_SIZE);
	cr_assert_not_null(m);
	for (size_t i = 0; i < N; i++)
		for (uint32_t r = 0; r < nr; r++)
			memset(m + g[r].offset + (uint64_t)ids[i] * g[r].stride, 1, g[r].page_bytes);
	return m;
}

Test(xfer_host, round_trip_with_opaque_tails)
{
	struct kvr_xfer_layout l = layout(geo, 3);
	struct kvr_xfer *x = open_host();
	unsigned char *a = arena.base, *orig = malloc(KV_SIZE), *mask = kv_mask(geo, 3);
	uint64_t slots[N];
	struct kvr_xfer_totals tot;

	cr_assert_not_null(orig);
	memcpy(orig, kv, KV_SIZE);
	slots_of(slots);
	cr_assert_eq(kvr_xfer_slot_bytes(&l), 8303);

	/* store: KV -> slots */
	move(x, &l, KVR_XFER_KV_TO_SLOT, ids, slots, N);
	for (size_t i = 0; i < N; i++) {
		const unsigned char *s = a + slots[i];
		const unsigned char *k = kv + geo[0].offset + ids[i] * geo[0].stride;
		cr_assert(memcmp(s, k, SEM) == 0, "block %u: K payload not in its slot", ids[i]);
		const unsigned char *v = kv + geo[1].offset + ids[i] * geo[1].stride;
		cr_assert(memcmp(s + SEM, k + SEM, TAIL) == 0, "block %u: K page's 37-byte opaque tail not stored",
			  ids[i]);
		cr_assert(memcmp(s + 4133, v, 4133) == 0, "block %u: V", ids[i]);
		cr_assert(memcmp(s + 8266, kv + geo[2].offset + ids[i] * geo[2].stride, TAIL) == 0,
			  "block %u: 37-byte tail region not stored", ids[i]);
		for (size_t b = 8303; b < SLOT_STRIDE; b++)
			cr_assert_eq(s[b], 0xee, "block %u: wrote %zu bytes past its slot block", ids[i], b - 8303 + 1);
	}
	for (size_t b = 0; b < SLOT_STRIDE; b++) /* slot 2 is in no plan */
		cr_assert_eq(a[SLOT0 + 2 * SLOT_STRIDE + b], 0xee);

	/* load: wipe KV memory, slots -> KV */
	memset(kv, 0x5a, KV_SIZE);
	move(x, &l, KVR_XFER_SLOT_TO_KV, ids, slots, N);
	for (size_t i = 0; i < KV_SIZE; i++) {
		if (mask[i])
			cr_assert_eq(kv[i], orig[i], "KV byte %zu (a planned page) not restored (seed %#lx)", i,
				     (unsigned long)seed);
		else
			cr_assert_eq(kv[i], 0x5a, "KV byte %zu outside every planned page was written", i);
	}
	/* The tails explicitly: K page bytes 4096..4132 and the tail region of each block. */
	for (size_t i = 0; i < N; i++) {
		cr_assert(memcmp(kv + ids[i] * 8192 + SEM, orig + ids[i] * 8192 + SEM, TAIL) == 0);
		cr_assert(memcmp(kv + 197200 + ids[i] * 40, orig + 197200 + ids[i] * 40, TAIL) == 0);
	}

	kvr_xfer_get_totals(x, &tot);
	cr_assert_eq(tot.submitted, 2);
	cr_assert_eq(tot.completed, 2);
	cr_assert_eq(tot.failed, 0);
	cr_assert_eq(tot.sum.bytes, 2 * N * 8303);
	cr_assert_eq(kvr_xfer_inflight(x), 0);
	kvr_xfer_close(x);
	free(orig);
	free(mask);
}

/* The control for the test above: a layout that declares only the 4096 semantic bytes
 * (and drops the tail region) must lose exactly the tail bytes. If this ever passes the
 * round-trip check, the check above cannot detect a missing tail. */
Test(xfer_host, semantic_only_layout_loses_the_tail)
{
	struct kvr_xfer_region sem[2] = { { 0, 8192, SEM, 0 }, { 131072, 4133, 4133, 0 } };
	struct kvr_xfer_layout l = layout(sem, 2);
	struct kvr_xfer *x = open_host();
	unsigned char *orig = malloc(KV_SIZE);
	uint64_t slots[N];
	size_t lost = 0;

	memcpy(orig, kv, KV_SIZE);
	slots_of(slots);
	move(x, &l, KVR_XFER_KV_TO_SLOT, ids, slots, N);
	memset(kv, 0x5a, KV_SIZE);
	move(x, &l, KVR_XFER_SLOT_TO_KV, ids, slots, N);
	for (size_t i = 0; i < N; i++)
		for (size_t b = 0; b < TAIL; b++) {
			lost += kv[ids[i] * 8192 + SEM + b] != orig[ids[i] * 8192 + SEM + b];
			lost += kv[197200 + ids[i] * 40 + b] != orig[197200 + ids[i] * 40 + b];
		}
	/* random bytes equal 0x5a by chance about 1 in 256: nearly all 2 * 7 * 37 differ */
	cr_assert_gt(lost, 2 * N * TAIL * 9 / 10, "only %zu tail bytes lost: the round-trip check is blind", lost);
	kvr_xfer_close(x);
	free(orig);
}

Test(xfer_host, contiguous_plan_is_one_copy)
{
	struct kvr_xfer_region g = { 0, 4133, 4133, 0 };
	struct kvr_xfer_layout l = layout(&g, 1);
	struct kvr_xfer *x = open_host();
	uint32_t cids[5] = { 3, 4, 5, 6, 7 };
	uint64_t cslots[5];
	unsigned char *a = arena.base;

	for (int i = 0; i < 5; i++)
		cslots[i] = SLOT0 + 100 + (uint64_t)i * 4133;
	struct kvr_xfer_stats st = move(x, &l, KVR_XFER_KV_TO_SLOT, cids, cslots, 5);
	cr_assert_eq(st.runs, 1);
	cr_assert_eq(st.copies, 1);
	cr_assert_eq(st.bytes, 5 * 4133);
	cr_assert(memcmp(a + SLOT0 + 100, kv + 3 * 4133, 5 * 4133) == 0);
	cr_assert_eq(a[SLOT0 + 99], 0xee);
	cr_assert_eq(a[SLOT0 + 100 + 5 * 4133], 0xee);
	kvr_xfer_close(x);
}

Test(xfer_host, tickets)
{
	struct kvr_xfer *x = open_host();
	struct kvr_xfer_run r = { 0, SLOT0, 64 };
	uint64_t t[KVR_XFER_MAX_INFLIGHT + 1], extra;
	struct kvr_xfer_stats st;
	struct kvr_xfer_totals tot;

	for (unsigned i = 0; i < KVR_XFER_MAX_INFLIGHT; i++) {
		r.kv_off = i * 64;
		cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &r, 1, NULL, &t[i]), 0);
		cr_assert_neq(t[i], 0);
		for (unsigned j = 0; j < i; j++)
			cr_assert_neq(t[i], t[j], "ticket reused while unreaped");
	}
	cr_assert_eq(kvr_xfer_inflight(x), KVR_XFER_MAX_INFLIGHT);
	extra = 42;
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &r, 1, NULL, &extra), -EBUSY);
	cr_assert_eq(extra, 42, "ret_ticket written on failure");

	/* reap one out of order, then a new ticket differs from every old one */
	cr_assert_eq(kvr_xfer_poll(x, t[17], &st), 0);
	cr_assert_eq(st.bytes, 64);
	cr_assert_eq(st.runs, 1);
	cr_assert_eq(kvr_xfer_poll(x, t[17], &st), -ENOENT);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &r, 1, NULL, &t[KVR_XFER_MAX_INFLIGHT]), 0);
	for (unsigned j = 0; j < KVR_XFER_MAX_INFLIGHT; j++)
		cr_assert_neq(t[KVR_XFER_MAX_INFLIGHT], t[j]);
	cr_assert_eq(kvr_xfer_poll(x, t[17], &st), -ENOENT, "old ticket must not alias its slot's new ticket");
	cr_assert_eq(kvr_xfer_poll(x, 0, &st), -ENOENT);
	cr_assert_eq(kvr_xfer_poll(x, 12345678, &st), -ENOENT);

	/* the last run (kv_off 63 * 64) is what the slot holds now */
	cr_assert(memcmp((unsigned char *)arena.base + SLOT0, kv + 63 * 64, 64) == 0);

	/* n == 0: complete at once, zero stats */
	cr_assert_eq(kvr_xfer_poll(x, t[0], NULL), 0);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_SLOT_TO_KV, NULL, 0, NULL, &t[0]), 0);
	st.bytes = 99;
	cr_assert_eq(kvr_xfer_wait(x, t[0], 0, &st), 0);
	cr_assert_eq(st.bytes, 0);
	cr_assert_eq(st.runs, 0);

	kvr_xfer_get_totals(x, &tot);
	cr_assert_eq(tot.submitted, KVR_XFER_MAX_INFLIGHT + 2);
	cr_assert_eq(tot.completed, 3);
	cr_assert_eq(tot.sum.bytes, 2 * 64);
	cr_assert_eq(kvr_xfer_inflight(x), KVR_XFER_MAX_INFLIGHT - 1);
	kvr_xfer_close(x); /* closes with unreaped tickets */
}

Test(xfer_host, submit_rejects_bad_input_and_copies_nothing)
{
	struct kvr_xfer *x = open_host();
	unsigned char *a = arena.base;
	uint64_t t = 7;
	struct kvr_xfer_run good = { 0, SLOT0, 100 };
	struct kvr_xfer_run bad[2] = { { 0, SLOT0, 100 }, { KV_SIZE - 10, SLOT0 + 200, 11 } };
	struct kvr_xfer_run bad_slot = { 0, arena.size - 10, 11 };
	struct kvr_xfer_run wrap = { UINT64_MAX - 5, SLOT0, 10 };
	struct kvr_xfer_run empty = { 0, SLOT0, 0 };
	struct kvr_xfer_dep ev = { .kind = KVR_XFER_DEP_CUDA_IPC_EVENT, .len = 64 };
	struct kvr_xfer_dep junk = { .kind = 9 };
	struct kvr_xfer_dep none_len = { .kind = KVR_XFER_DEP_NONE, .len = 3 };

	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, bad, 2, NULL, &t), -ERANGE);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &bad_slot, 1, NULL, &t), -ERANGE);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &wrap, 1, NULL, &t), -ERANGE);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &empty, 1, NULL, &t), -ERANGE);
	cr_assert_eq(kvr_xfer_submit(x, 0, &good, 1, NULL, &t), -EINVAL);
	cr_assert_eq(kvr_xfer_submit(x, 3, &good, 1, NULL, &t), -EINVAL);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, NULL, 1, NULL, &t), -EINVAL);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &good, 1, NULL, NULL), -EINVAL);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &good, 1, &junk, &t), -EINVAL);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &good, 1, &none_len, &t), -EINVAL);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &good, 1, &ev, &t), -EOPNOTSUPP);
	cr_assert_eq(t, 7, "ret_ticket written on failure");
	cr_assert_eq(kvr_xfer_inflight(x), 0);
	for (size_t i = SLOT0; i < arena.size; i++)
		cr_assert_eq(a[i], 0xee, "arena byte %zu written by a rejected submit", i);

	struct kvr_xfer_totals tot;
	kvr_xfer_get_totals(x, &tot);
	cr_assert_eq(tot.submitted, 0);
	kvr_xfer_close(x);
	kvr_xfer_close(NULL);
}

Test(xfer_host, open_checks_the_kv_memory)
{
	struct kvr_xfer_arena a = { .base = arena.base, .size = arena.size };
	struct kvr_xfer_kvmem m = { .kind = KVR_XFER_MEM_HOST, .size = KV_SIZE, .u.host = { .fd = kv_fd } };
	struct kvr_xfer *x = (struct kvr_xfer *)0x1;
	struct kvr_xfer_arena no_arena = { .base = NULL, .size = 10 };
	char path[64];
	int fd;

	m.size = KV_SIZE + 1; /* larger than the fd */
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), -EINVAL);
	m.size = KV_SIZE;
	m.u.host.offset = 8; /* offset + size beyond the fd */
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), -EINVAL);
	m.u.host.offset = 0;
	m.u.host.fd = -1;
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), -EINVAL);
	m.u.host.fd = kv_fd;
	cr_assert_eq(kvr_xfer_open(&m, &no_arena, &x), -EINVAL);
	m.kind = 7;
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), -EINVAL);
	m.kind = KVR_XFER_MEM_CUDA;
#ifdef KVR_XFER_HAVE_CUDA /* built: a CUDA descriptor without its blob is refused */
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), -EINVAL);
	cr_assert_not_null(kvr_xfer_backend_for(KVR_XFER_MEM_CUDA));
#else /* not in this build */
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), -EOPNOTSUPP);
	cr_assert_null(kvr_xfer_backend_for(KVR_XFER_MEM_CUDA));
#endif
	cr_assert_eq(kvr_xfer_backend_for(KVR_XFER_MEM_HOST), &kvr_xfer_host_backend);
	cr_assert_eq(x, (struct kvr_xfer *)0x1, "*ret written on failure");

	/* a plain file cannot be sealed: refused */
	snprintf(path, sizeof(path), "/tmp/kvr-test-xfer-%d", getpid());
	fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	cr_assert_geq(fd, 0);
	(void) unlink(path);
	cr_assert_eq(ftruncate(fd, KV_SIZE), 0);
	m.kind = KVR_XFER_MEM_HOST;
	m.u.host.fd = fd;
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), -EPERM);
	close(fd);

	/* a memfd sealed without SHRINK: refused */
	fd = memfd_create("kvr-test-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, KV_SIZE), 0);
	cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL), 0);
	m.u.host.fd = fd;
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), -EPERM);
	close(fd);

	/* success seals ours against shrinking: truncation can no longer fault the actor */
	m.u.host.fd = kv_fd;
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), 0);
	cr_assert(fcntl(kv_fd, F_GET_SEALS) & F_SEAL_SHRINK);
	cr_assert_eq(ftruncate(kv_fd, 4096), -1);
	cr_assert_eq(errno, EPERM);
	kvr_xfer_close(x);
}

/* KV memory inside a kvr_segment (KVR_SEG_KV), KV byte 0 one page after the header. */
Test(xfer_host, kv_segment_with_offset)
{
	char name[64];
	struct kvr_segment seg;
	struct kvr_xfer *x = NULL;
	struct kvr_xfer_arena a = { .base = arena.base, .size = arena.size };
	struct kvr_xfer_region g = { 0, 512, 500, 0 };
	uint32_t bid[2] = { 6, 1 };
	uint64_t bslot[2] = { SLOT0 + 1000, SLOT0 };
	unsigned char *a8 = arena.base;

	snprintf(name, sizeof(name), "kvr-test-kvseg-%d", getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_KV, 4096 + 8 * 512, 1, 0, &seg), 0);
	unsigned char *k = (unsigned char *)seg.base + 4096;
	fill_random(k, 8 * 512, seed ^ 1);

	struct kvr_xfer_kvmem m = { .kind = KVR_XFER_MEM_HOST, .size = 8 * 512,
				    .u.host = { .fd = seg.fd, .offset = 4096 } };
	cr_assert_eq(kvr_xfer_open(&m, &a, &x), 0);
	struct kvr_xfer_layout l = { .regions = &g, .n_regions = 1, .num_blocks = 8, .kv_size = 8 * 512,
				     .arena_size = arena.size };
	move(x, &l, KVR_XFER_KV_TO_SLOT, bid, bslot, 2);
	cr_assert(memcmp(a8 + SLOT0 + 1000, k + 6 * 512, 500) == 0);
	cr_assert(memcmp(a8 + SLOT0, k + 1 * 512, 500) == 0);
	cr_assert_eq(a8[SLOT0 + 500], 0xee);
	cr_assert_eq(((struct kvr_seg_hdr *)seg.base)->magic, KVR_SEG_MAGIC, "segment header overwritten");
	memset(k, 0, 8 * 512);
	move(x, &l, KVR_XFER_SLOT_TO_KV, bid, bslot, 2);
	cr_assert(memcmp(k + 6 * 512, a8 + SLOT0 + 1000, 500) == 0);
	cr_assert_eq(k[6 * 512 + 500], 0, "stride gap written");
	cr_assert_eq(((struct kvr_seg_hdr *)seg.base)->magic, KVR_SEG_MAGIC);
	kvr_xfer_close(x);
	kvr_segment_close(&seg);
}
