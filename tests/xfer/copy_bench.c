/* copy_bench: memcpy vs kvr_copy vs kvr_copy_nt GB/s for 4 KiB..64 MiB, a plan-driven host store/load, planner time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvr_time.h"
#include "kvr_xfer.h"

/*
 * hot:  the same source and destination every iteration (they stay in cache up to L2/L3).
 * cold: source and destination rotate through POOL bytes each, several times the last-level
 *       cache, like KV blocks streaming between a worker and the arena.
 * Each figure is the best of REPS timed rounds of about ROUND_BYTES copied.
 * Exits 1 if any copy is not byte-exact.
 */
#define POOL (512ull << 20)
#define ROUND_BYTES (256ull << 20)
#define REPS 3

typedef void (*copy_fn)(void *, const void *, size_t);

static void libc_memcpy(void *d, const void *s, size_t n)
{
	memcpy(d, s, n);
}

static const struct {
	const char *name;
	copy_fn fn;
} fns[] = { { "memcpy", libc_memcpy }, { "kvr_copy", kvr_copy }, { "kvr_copy_nt", kvr_copy_nt },
	     { "kvr_copy_stream", kvr_copy_stream } };
#define NFN (sizeof(fns) / sizeof(fns[0]))

static unsigned char *src_pool, *dst_pool;
static int bad;

static double measure(copy_fn fn, size_t size, int cold)
{
	size_t slots = cold ? POOL / size : 1;
	uint64_t iters = ROUND_BYTES / size;
	double best = 0;

	if (iters < 4)
		iters = 4;
	for (int rep = 0; rep < REPS; rep++) {
		uint64_t t0 = kvr_now_ns();
		for (uint64_t i = 0; i < iters; i++) {
			size_t k = (size_t)(i % slots) * size;
			fn(dst_pool + k, src_pool + k, size);
		}
		uint64_t ns = kvr_now_ns() - t0;
		double gbs = (double)(iters * size) / (double)ns;
		if (gbs > best)
			best = gbs;
	}
	size_t last = (size_t)((iters - 1) % slots) * size;
	if (memcmp(dst_pool + last, src_pool + last, size) != 0) {
		fprintf(stderr, "copy not exact at size %zu\n", size);
		bad = 1;
	}
	return best;
}

static void bench_plan(const char *what, uint32_t nr, uint32_t nb, int cross_layer)
{
	struct kvr_xfer_region *g = calloc(nr, sizeof(*g));
	uint32_t *ids = calloc(nb, sizeof(*ids));
	uint64_t *slots = calloc(nb, sizeof(*slots));
	struct kvr_xfer_run *runs = calloc((size_t)nr * nb, sizeof(*runs));
	const uint32_t page = 65536, total_blocks = 4096;
	uint64_t best = UINT64_MAX, bytes = 0;
	int n = 0;

	if (!g || !ids || !slots || !runs) {
		bad = 1;
		goto out;
	}
	for (uint32_t r = 0; r < nr; r++)
		g[r] = cross_layer ? (struct kvr_xfer_region){ (uint64_t)r * page, (uint64_t)nr * page, page, 0 }
				   : (struct kvr_xfer_region){ (uint64_t)r * total_blocks * page, page, page, 0 };
	for (uint32_t i = 0; i < nb; i++) {
		ids[i] = 100 + i;
		slots[i] = (uint64_t)i * nr * page;
	}
	struct kvr_xfer_layout l = { .regions = g, .n_regions = nr, .num_blocks = total_blocks,
				     .kv_size = (uint64_t)nr * total_blocks * page,
				     .arena_size = (uint64_t)nb * nr * page };
	for (int rep = 0; rep < 50; rep++) {
		uint64_t t0 = kvr_now_ns();
		n = kvr_xfer_plan(&l, ids, slots, nb, runs, (size_t)nr * nb, &bytes, NULL);
		uint64_t dt = kvr_now_ns() - t0;
		if (dt < best)
			best = dt;
	}
	if (n < 0) {
		fprintf(stderr, "plan failed: %d\n", n);
		bad = 1;
		goto out;
	}
	printf("plan %-28s %4u regions x %3u blocks -> %5d runs, %6.1f MiB, %8.1f us\n", what, nr, nb, n,
	       (double)bytes / (1 << 20), (double)best / 1e3);
out:
	free(g);
	free(ids);
	free(slots);
	free(runs);
}

/*
 * A whole request the way the host backend moves it: GLM-4-9B per TP rank (40 layers x K,V
 * = 80 regions of 64 KiB pages, layer-major as vLLM allocates them), 80 blocks (10,240
 * tokens, 400 MiB) into 80 consecutive slots: 6,400 runs of 64 KiB. Compares memcpy per
 * run with kvr_copy_stream per run and with the host backend (which picks per submission).
 */
static void bench_request(void)
{
	const uint32_t nr = 80, nb = 80, total_blocks = 96, page = 65536;
	const uint64_t kv_size = (uint64_t)nr * total_blocks * page, arena_size = (uint64_t)nb * nr * page;
	struct kvr_xfer_region *g = calloc(nr, sizeof(*g));
	struct kvr_xfer_run *runs = calloc((size_t)nr * nb, sizeof(*runs));
	uint32_t ids[80];
	uint64_t slots[80];
	unsigned char *kv = MAP_FAILED, *arena = MAP_FAILED;
	struct kvr_xfer *x = NULL;
	int fd = -1, n;

	if (!g || !runs)
		goto fail;
	for (uint32_t r = 0; r < nr; r++)
		g[r] = (struct kvr_xfer_region){ (uint64_t)r * total_blocks * page, page, page, 0 };
	for (uint32_t i = 0; i < nb; i++) {
		ids[i] = 8 + i;
		slots[i] = (uint64_t)i * nr * page;
	}
	struct kvr_xfer_layout l = { .regions = g, .n_regions = nr, .num_blocks = total_blocks, .kv_size = kv_size,
				     .arena_size = arena_size };
	n = kvr_xfer_plan(&l, ids, slots, nb, runs, (size_t)nr * nb, NULL, NULL);
	fd = memfd_create("copy-bench-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (n < 0 || fd < 0 || ftruncate(fd, (off_t)kv_size) < 0)
		goto fail;
	kv = mmap(NULL, kv_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	arena = mmap(NULL, arena_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (kv == MAP_FAILED || arena == MAP_FAILED)
		goto fail;
	for (uint64_t i = 0; i < kv_size; i += 64)
		kv[i] = (unsigned char)(i >> 6);
	memset(arena, 0, arena_size);
	struct kvr_xfer_kvmem m = { .kind = KVR_XFER_MEM_HOST, .size = kv_size, .u.host = { .fd = fd } };
	struct kvr_xfer_arena a = { .base = arena, .size = arena_size };
	if (kvr_xfer_open(&m, &a, &x) < 0)
		goto fail;

	double best[3][2] = { { 0 } };
	for (int rep = 0; rep < REPS; rep++) {
		for (int how = 0; how < 3; how++) {
			for (int dir = 0; dir < 2; dir++) {
				uint64_t t0 = kvr_now_ns();
				if (how < 2) {
					copy_fn fn = how == 0 ? libc_memcpy : kvr_copy_stream;
					for (int i = 0; i < n; i++) {
						if (dir == 0)
							fn(arena + runs[i].slot_off, kv + runs[i].kv_off, runs[i].len);
						else
							fn(kv + runs[i].kv_off, arena + runs[i].slot_off, runs[i].len);
					}
				} else {
					uint64_t t;
					uint32_t d = dir == 0 ? KVR_XFER_KV_TO_SLOT : KVR_XFER_SLOT_TO_KV;
					if (kvr_xfer_submit(x, d, runs, (size_t)n, NULL, &t) < 0 ||
					    kvr_xfer_wait(x, t, -1, NULL) < 0)
						goto fail;
				}
				double gbs = (double)arena_size / (double)(kvr_now_ns() - t0);
				if (gbs > best[how][dir])
					best[how][dir] = gbs;
			}
		}
	}
	for (uint32_t i = 0; i < nb; i++)
		for (uint32_t r = 0; r < nr; r += 7)
			if (memcmp(arena + slots[i] + (uint64_t)r * page, kv + g[r].offset + (uint64_t)ids[i] * page,
				   page))
				goto fail;
	printf("request: %u blocks x %u regions x 64 KiB (layer-major), %d runs, %.0f MiB; GB/s store / load\n", nb,
	       nr, n, (double)arena_size / (1 << 20));
	printf("  memcpy per run           %6.2f / %6.2f\n", best[0][0], best[0][1]);
	printf("  kvr_copy_stream per run  %6.2f / %6.2f\n", best[1][0], best[1][1]);
	printf("  host backend submit      %6.2f / %6.2f\n", best[2][0], best[2][1]);
	goto out;
fail:
	fprintf(stderr, "request bench failed\n");
	bad = 1;
out:
	kvr_xfer_close(x);
	if (kv != MAP_FAILED)
		munmap(kv, kv_size);
	if (arena != MAP_FAILED)
		munmap(arena, arena_size);
	if (fd >= 0)
		close(fd);
	free(g);
	free(runs);
}

int main(void)
{
	static const size_t sizes[] = { 4u << 10, 16u << 10, 64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20,
					32u << 20, 64u << 20 };

	src_pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	dst_pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src_pool == MAP_FAILED || dst_pool == MAP_FAILED) {
		fprintf(stderr, "mmap: %s\n", strerror(errno));
		return 1;
	}
	for (size_t i = 0; i < POOL; i += 4096) { /* fault every page in before timing */
		src_pool[i] = (unsigned char)(i >> 12);
		dst_pool[i] = 0;
	}
	for (size_t i = 0; i < POOL; i += 64)
		src_pool[i + 7] = (unsigned char)(i * 31);

	printf("%-10s %-5s", "size", "cache");
	for (size_t f = 0; f < NFN; f++)
		printf(" %15s", fns[f].name);
	printf("   (GB/s, best of %d)\n", REPS);
	for (int cold = 0; cold < 2; cold++) {
		for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			char label[32];
			if (sizes[s] >= (1u << 20))
				snprintf(label, sizeof(label), "%zu MiB", sizes[s] >> 20);
			else
				snprintf(label, sizeof(label), "%zu KiB", sizes[s] >> 10);
			printf("%-10s %-5s", label, cold ? "cold" : "hot");
			for (size_t f = 0; f < NFN; f++)
				printf(" %15.2f", measure(fns[f].fn, sizes[s], cold));
			printf("\n");
			fflush(stdout);
		}
	}

	/* GLM-4-9B per rank: 40 layers x K,V, 64 KiB pages; 80 blocks = 10,240 tokens */
	bench_plan("layer-major (no merge)", 80, 80, 0);
	bench_plan("cross-layer (one run)", 80, 80, 1);
	bench_plan("layer-major, 1 block", 80, 1, 0);

	munmap(src_pool, POOL);
	munmap(dst_pool, POOL);
	bench_request();
	if (bad)
		printf("FAILED: a copy was not exact or a plan failed\n");
	return bad;
}
