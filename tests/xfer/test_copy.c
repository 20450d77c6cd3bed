/* Tests for the exact copy: every width x misalignment on both sides, guard bytes before and after. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdlib.h>
#include <string.h>

#include "kvr_xfer.h"

#define GUARD 64
#define GUARD_BYTE 0xcd

static size_t widths[] = { 1, 2, 3, 7, 63, 64, 65, 561, 4095, 4096, 4097, (1u << 20) + 3 };

typedef void (*copy_fn)(void *, const void *, size_t);

/* Copy w bytes for every (src misalignment, dst misalignment) in 0..7 x 0..7 from buffers
 * that start 64-byte aligned, and check the copied bytes and 64 guard bytes on each side. */
static void check_width(copy_fn fn, const char *name, size_t w)
{
	size_t total = GUARD + 8 + w + GUARD;
	unsigned char *src = aligned_alloc(64, (total + 63) & ~(size_t)63);
	unsigned char *dst = aligned_alloc(64, (total + 63) & ~(size_t)63);

	cr_assert(src && dst);
	for (size_t i = 0; i < total; i++)
		src[i] = (unsigned char)((i * 2654435761u) >> 13); /* not periodic in 64 */

	for (size_t sa = 0; sa < 8; sa++) {
		for (size_t da = 0; da < 8; da++) {
			unsigned char *d = dst + GUARD + da;
			const unsigned char *s = src + GUARD + sa;

			memset(dst, GUARD_BYTE, total);
			fn(d, s, w);
			cr_assert(memcmp(d, s, w) == 0, "%s width %zu src+%zu dst+%zu: bytes differ", name, w, sa, da);
			for (unsigned char *p = dst; p < d; p++)
				cr_assert_eq(*p, GUARD_BYTE, "%s width %zu src+%zu dst+%zu: wrote %td bytes before dst",
					     name, w, sa, da, d - p);
			for (unsigned char *p = d + w; p < dst + total; p++)
				cr_assert_eq(*p, GUARD_BYTE, "%s width %zu src+%zu dst+%zu: wrote byte %td past end",
					     name, w, sa, da, p - (d + w));
		}
	}
	free(src);
	free(dst);
}

ParameterizedTestParameters(xfer_copy, widths)
{
	return cr_make_param_array(size_t, widths, sizeof(widths) / sizeof(widths[0]));
}

ParameterizedTest(size_t *w, xfer_copy, widths)
{
	check_width(kvr_copy, "kvr_copy", *w);
	check_width(kvr_copy_stream, "kvr_copy_stream", *w);
	check_width(kvr_copy_nt, "kvr_copy_nt", *w);
}

Test(xfer_copy, zero_length_touches_nothing)
{
	unsigned char a[16], b[16];

	memset(a, 1, sizeof(a));
	memset(b, 2, sizeof(b));
	kvr_copy(a + 3, b + 5, 0);
	kvr_copy_nt(a + 3, b + 5, 0);
	kvr_copy_stream(a + 3, b + 5, 0);
	kvr_copy(NULL, NULL, 0);
	for (size_t i = 0; i < sizeof(a); i++)
		cr_assert_eq(a[i], 1);
}

/* Every length 0..300 at every misalignment: covers each head/body/tail split of the
 * non-temporal path (its threshold is 256) and of memcpy's size classes. Lengths around
 * the 4 KiB streaming threshold are in the width table. */
Test(xfer_copy, every_small_length)
{
	unsigned char src[512], dst[512 + 2 * GUARD];

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (unsigned char)(i * 7 + 1);
	for (size_t len = 0; len <= 300; len++) {
		for (size_t a = 0; a < 16; a++) {
			for (int f = 0; f < 3; f++) {
				copy_fn fn = f == 0 ? kvr_copy : f == 1 ? kvr_copy_nt : kvr_copy_stream;
				memset(dst, GUARD_BYTE, sizeof(dst));
				fn(dst + GUARD + a, src + (15 - a), len);
				cr_assert(memcmp(dst + GUARD + a, src + (15 - a), len) == 0, "len %zu align %zu", len,
					  a);
				for (size_t i = 0; i < GUARD + a; i++)
					cr_assert_eq(dst[i], GUARD_BYTE);
				for (size_t i = GUARD + a + len; i < sizeof(dst); i++)
					cr_assert_eq(dst[i], GUARD_BYTE, "len %zu align %zu: byte after end", len, a);
			}
		}
	}
}

/* Around kvr_copy's switch to streaming stores (1 MiB and 16 MiB) and glibc's own
 * thresholds: exact bytes, guards intact, at a few misalignments. */
Test(xfer_copy, dispatch_boundaries)
{
	static const size_t lens[] = { (1u << 20) - 1, 1u << 20, (1u << 20) + 1, (16u << 20) - 1, 16u << 20,
				       (16u << 20) + 1, (20u << 20) + 13 };
	size_t max = (20u << 20) + 13 + 2 * GUARD + 16;
	unsigned char *src = malloc(max), *dst = malloc(max);

	cr_assert(src && dst);
	for (size_t i = 0; i < max; i++)
		src[i] = (unsigned char)((i * 2654435761u) >> 11);
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		for (size_t a = 0; a < 16; a += 5) {
			size_t len = lens[k], sa = (a * 3) % 16;
			memset(dst, GUARD_BYTE, len + 2 * GUARD + 16);
			(a % 2 ? kvr_copy_stream : kvr_copy)(dst + GUARD + a, src + sa, len);
			cr_assert(memcmp(dst + GUARD + a, src + sa, len) == 0, "len %zu dst+%zu src+%zu", len, a, sa);
			for (size_t i = 0; i < GUARD + a; i++)
				cr_assert_eq(dst[i], GUARD_BYTE, "len %zu: byte before dst written", len);
			for (size_t i = GUARD + a + len; i < len + 2 * GUARD + 16; i++)
				cr_assert_eq(dst[i], GUARD_BYTE, "len %zu: byte after end written", len);
		}
	}
	free(src);
	free(dst);
}
