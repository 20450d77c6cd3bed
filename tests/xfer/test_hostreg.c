/* Chunked arena registration (kvr_hostreg, what the CUDA backend registers with) against a stand-in registrar that refuses large ranges as the driver does. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "kvr_hostreg.h"

/*
 * The stand-in plays cudaHostRegister: it records every call, refuses a range larger than
 * `limit` (one registration of a 512 GiB arena fails on real drivers: vLLM #51080) and can
 * fail the k-th call or answer "already registered" for one chunk. The arena is a fake
 * address: nothing is touched, so terabyte ranges cost nothing.
 */
struct standin {
	uint64_t limit;
	int fail_at;      /* call index that fails with -ENOMEM; -1 none */
	int already_at;   /* call index answered "already registered"; -1 none */
	unsigned calls;
	uintptr_t p[256];
	uint64_t n[256];
	unsigned unregs;
	uintptr_t up[256];
};

static int reg(void *ctx, void *p, uint64_t n)
{
	struct standin *s = ctx;
	unsigned i = s->calls++;
	s->p[i] = (uintptr_t)p;
	s->n[i] = n;
	if (n > s->limit || (int)i == s->fail_at)
		return -ENOMEM;
	return (int)i == s->already_at ? 1 : 0;
}

static void unreg(void *ctx, void *p, uint64_t n)
{
	struct standin *s = ctx;
	(void)n;
	s->up[s->unregs++] = (uintptr_t)p;
}

#define GiB (1ull << 30)
#define BASE ((void *)(uintptr_t)0x7f0000000000ull)

static struct standin fresh(uint64_t limit)
{
	return (struct standin){.limit = limit, .fail_at = -1, .already_at = -1};
}

Test(hostreg, a_512_gib_arena_is_registered_in_chunks_the_driver_accepts)
{
	struct standin s = fresh(100 * GiB);
	struct kvr_hostreg_ops ops = {.reg = reg, .unreg = unreg, .ctx = &s};
	struct kvr_hostreg r;
	cr_assert_eq(kvr_hostreg_register(BASE, 512 * GiB, KVR_HOSTREG_CHUNK, &ops, &r), 0);
	cr_assert_eq(s.calls, 8);
	cr_assert_eq(r.n, 8);
	cr_assert_eq(r.ours, 0xff);
	uint64_t covered = 0;
	for (unsigned i = 0; i < s.calls; i++) {
		cr_assert_eq(s.p[i], (uintptr_t)BASE + covered, "chunk %u starts where the last ended", i);
		cr_assert_leq(s.n[i], 64 * GiB);
		covered += s.n[i];
	}
	cr_assert_eq(covered, 512 * GiB, "every byte, once");
	/* one registration of the whole range is what the driver refuses */
	struct standin one = fresh(100 * GiB);
	ops.ctx = &one;
	struct kvr_hostreg r1;
	cr_assert_eq(kvr_hostreg_register(BASE, 512 * GiB, 1024 * GiB, &ops, &r1), -ENOMEM);
	cr_assert_eq(one.unregs, 0, "nothing registered, nothing undone");
	ops.ctx = &s;
	kvr_hostreg_unregister(&r, &ops);
	cr_assert_eq(s.unregs, 8);
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(s.up[i], s.p[7 - i], "unregistered last first");
}

Test(hostreg, an_odd_size_ends_with_a_short_chunk_and_chunks_stay_aligned)
{
	struct standin s = fresh(UINT64_MAX);
	struct kvr_hostreg_ops ops = {.reg = reg, .unreg = unreg, .ctx = &s};
	struct kvr_hostreg r;
	uint64_t size = 3 * GiB + 4096;
	cr_assert_eq(kvr_hostreg_register(BASE, size, GiB + 12345, &ops, &r), 0);
	cr_assert_eq(r.chunk, GiB, "asked 1 GiB + 12345: cut at a 2 MiB multiple");
	cr_assert_eq(s.calls, 4);
	cr_assert_eq(s.n[3], 4096);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(s.n[i] % KVR_HOSTREG_ALIGN, 0);
	cr_assert_eq(kvr_hostreg_count(size, GiB), 4);
}

Test(hostreg, a_huge_range_gets_larger_chunks_never_more_than_the_cap)
{
	struct standin s = fresh(UINT64_MAX);
	struct kvr_hostreg_ops ops = {.reg = reg, .unreg = unreg, .ctx = &s};
	struct kvr_hostreg r;
	cr_assert_eq(kvr_hostreg_register(BASE, 8192 * GiB, KVR_HOSTREG_CHUNK, &ops, &r), 0);
	cr_assert_leq(s.calls, KVR_HOSTREG_MAX_CHUNKS);
	cr_assert_eq(r.chunk, 128 * GiB);
	cr_assert_eq(kvr_hostreg_chunk_bytes(1, 0), KVR_HOSTREG_ALIGN, "at least one aligned chunk");
}

Test(hostreg, a_failed_chunk_undoes_the_earlier_ones_in_reverse)
{
	struct standin s = fresh(UINT64_MAX);
	s.fail_at = 5;
	s.already_at = 2;
	struct kvr_hostreg_ops ops = {.reg = reg, .unreg = unreg, .ctx = &s};
	struct kvr_hostreg r;
	memset(&r, 0x5a, sizeof(r));
	cr_assert_eq(kvr_hostreg_register(BASE, 512 * GiB, KVR_HOSTREG_CHUNK, &ops, &r), -ENOMEM);
	cr_assert_eq(s.calls, 6, "stopped at the failed chunk");
	cr_assert_eq(s.unregs, 4, "chunks 0, 1, 3, 4 undone; chunk 2 was registered by someone else");
	uintptr_t want[4] = {s.p[4], s.p[3], s.p[1], s.p[0]};
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(s.up[i], want[i]);
	cr_assert_eq(r.n, 0, "nothing left registered");
	cr_assert_null(r.base);
}

Test(hostreg, chunks_registered_by_someone_else_are_never_unregistered)
{
	struct standin s = fresh(UINT64_MAX);
	s.already_at = 0;
	struct kvr_hostreg_ops ops = {.reg = reg, .unreg = unreg, .ctx = &s};
	struct kvr_hostreg r;
	cr_assert_eq(kvr_hostreg_register(BASE, 100 * GiB, KVR_HOSTREG_CHUNK, &ops, &r), 0);
	cr_assert_eq(r.n, 2);
	cr_assert_eq(r.ours, 0x2);
	kvr_hostreg_unregister(&r, &ops);
	cr_assert_eq(s.unregs, 1);
	cr_assert_eq(s.up[0], s.p[1]);
	cr_assert_eq(kvr_hostreg_register(NULL, 1, 0, &ops, &r), -EINVAL);
	cr_assert_eq(kvr_hostreg_register(BASE, 0, 0, &ops, &r), -EINVAL);
}
