/* gpu_bench: pinned cudaMemcpy peak vs kvring's CUDA backend (arena <-> IPC KV memory), and one prompt's load time. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "gpu_test.h"
#include "kvr_geometry.h"
#include "kvr_time.h"

/*
 * Three tables, one run, one GPU (tools/gpu-check.sh runs it):
 *   1. peak: cudaMemcpyAsync between cudaHostAlloc'd memory and cudaMalloc'd memory in this
 *      process, H2D and D2H, per size (best of --reps);
 *   2. kvring: the CUDA backend copying one run of the same size between the arena (a
 *      memfd registered by the backend) and a worker's KV memory opened by IPC handle;
 *      wall time submit -> completion, best of --reps;
 *   3. prompt: store and load of one --tokens prompt of the --preset geometry at TP --tp
 *      (vLLM layer-major, full blocks only), per copy method, best and median of --reps.
 * Exit 77 without a GPU, 1 when a byte came back wrong or a call failed.
 */

#define MAX_SIZES 16

static int fail(const char *what, cudaError_t e)
{
	fprintf(stderr, "gpu_bench: %s: %s\n", what, cudaGetErrorString(e));
	return 1;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double gbps(uint64_t bytes, uint64_t ns)
{
	return ns ? (double)bytes / (double)ns : 0;
}

/* Table 1: best ns per size and direction with plain pinned memory in this process. */
static int peak(const uint64_t *sizes, unsigned ns, unsigned reps, uint64_t out[][2])
{
	uint64_t max = 0;
	for (unsigned i = 0; i < ns; i++)
		max = sizes[i] > max ? sizes[i] : max;
	void *h = NULL, *d = NULL;
	cudaStream_t st;
	cudaEvent_t e0, e1;
	cudaError_t e;
	if ((e = cudaHostAlloc(&h, max, cudaHostAllocDefault)) != cudaSuccess)
		return fail("cudaHostAlloc", e);
	if ((e = cudaMalloc(&d, max)) != cudaSuccess)
		return fail("cudaMalloc", e);
	memset(h, 1, max);
	if ((e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) != cudaSuccess ||
	    (e = cudaEventCreate(&e0)) != cudaSuccess || (e = cudaEventCreate(&e1)) != cudaSuccess)
		return fail("stream/event", e);
	for (unsigned i = 0; i < ns; i++) {
		for (int dir = 0; dir < 2; dir++) {
			uint64_t best = UINT64_MAX;
			for (unsigned r = 0; r < reps + 1; r++) { /* the first run warms up */
				float ms = 0;
				cudaEventRecord(e0, st);
				e = dir ? cudaMemcpyAsync(h, d, sizes[i], cudaMemcpyDeviceToHost, st)
					: cudaMemcpyAsync(d, h, sizes[i], cudaMemcpyHostToDevice, st);
				if (e != cudaSuccess)
					return fail("cudaMemcpyAsync", e);
				cudaEventRecord(e1, st);
				if ((e = cudaEventSynchronize(e1)) != cudaSuccess)
					return fail("cudaEventSynchronize", e);
				cudaEventElapsedTime(&ms, e0, e1);
				uint64_t t = (uint64_t)((double)ms * 1e6);
				if (r && t < best)
					best = t;
			}
			out[i][dir] = best;
		}
	}
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaStreamDestroy(st);
	cudaFreeHost(h);
	cudaFree(d);
	return 0;
}

static int one(struct kvr_xfer *x, uint32_t dir, const struct kvr_xfer_run *runs, size_t n, uint64_t *ret_ns)
{
	uint64_t t, t0 = kvr_now_ns();
	struct kvr_xfer_stats st;
	int rc = kvr_xfer_submit(x, dir, runs, n, NULL, &t);
	if (!rc)
		rc = kvr_xfer_wait(x, t, 60ll * 1000000000ll, &st);
	if (rc) {
		fprintf(stderr, "gpu_bench: transfer failed: %s (%s)\n", strerror(-rc), kvr_xfer_cuda_last_error());
		return 1;
	}
	*ret_ns = kvr_now_ns() - t0;
	return 0;
}

/*
 * What attaching to a large arena costs (issue 26: one cudaHostRegister of 512 GiB fails;
 * about 0.1 s per GB): an arena of gib GiB, opened (IPC handles + the arena registered in
 * chunks, KVR_CUDA_REG_CHUNK_GIB or 64 GiB), its registration time as the backend measured
 * it, and the whole open's.
 */
static int reg_bench(const struct gw *w, unsigned gib)
{
	struct gpu_arena big = {.fd = -1};
	uint64_t bytes = (uint64_t)gib << 30;
	if (gpu_arena_create(&big, bytes)) {
		fprintf(stderr, "gpu_bench: arena of %u GiB: %s\n", gib, strerror(errno));
		return 1;
	}
	struct kvr_xfer *x = NULL;
	char why[256] = "";
	uint64_t t0 = kvr_now_ns();
	int rc = gpu_open(w, &big, &x, why, sizeof(why));
	uint64_t open_ns = kvr_now_ns() - t0;
	if (rc) {
		fprintf(stderr, "gpu_bench: open with a %u GiB arena: %s\n", gib, why);
	} else {
		uint64_t reg = kvr_xfer_cuda_arena_reg_ns(big.base);
		const char *c = getenv("KVR_CUDA_REG_CHUNK_GIB");
		printf("\narena registration: %u GiB in chunks of %s GiB: %.1f ms (%.2f s/TB); open in all %.1f ms\n", gib,
		       c && *c ? c : "64", reg / 1e6, reg / 1e9 / ((double)bytes / 1e12), open_ns / 1e6);
		kvr_xfer_close(x);
	}
	gpu_arena_destroy(&big);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"reps", required_argument, NULL, 'r'},   {"tokens", required_argument, NULL, 't'},
		{"preset", required_argument, NULL, 'p'}, {"tp", required_argument, NULL, 'T'},
		{"block", required_argument, NULL, 'b'},  {"reg-gib", required_argument, NULL, 'g'},
		{NULL, 0, NULL, 0},
	};
	unsigned reps = 10, tokens = 10000, tp = 1, block = 128, reg_gib = 0;
	const char *preset = "glm-4-9b-chat-1m";
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'r': reps = (unsigned)strtoul(optarg, NULL, 0); break;
		case 't': tokens = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'p': preset = optarg; break;
		case 'T': tp = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'b': block = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'g': reg_gib = (unsigned)strtoul(optarg, NULL, 0); break;
		default:
			fprintf(stderr,
				"usage: gpu_bench [--reps N] [--tokens N] [--preset NAME] [--tp N] [--block N] [--reg-gib N]\n");
			return 2;
		}
	}
	if (!reps || !tokens || !tp || !block)
		return 2;
	if (gpu_probe() != 0) {
		printf("gpu_bench: no usable CUDA device\n");
		return 77;
	}

	/* the prompt's geometry: rank 0 of tp, full blocks only, a few spare blocks */
	const struct kvr_preset *p = kvr_preset_find(preset);
	struct kvr_geometry g;
	uint32_t n_blocks = tokens / block, num_blocks = n_blocks + 8;
	if (!p || !n_blocks || kvr_preset_geometry(p, tp, 0, block, num_blocks, &g)) {
		fprintf(stderr, "gpu_bench: preset %s (%s) at TP %u, block %u, %u tokens: no geometry\n", preset,
			kvr_preset_list(), tp, block, tokens);
		return 2;
	}
	static struct kvr_xfer_region regions[KVR_GEOM_MAX_REGIONS];
	for (uint32_t r = 0; r < g.n_regions; r++) {
		struct kvr_region gr = kvr_geometry_region(&g, r);
		regions[r] = (struct kvr_xfer_region){gr.offset, gr.stride, gr.page_bytes, gr.sem_bytes};
	}
	uint64_t kv_bytes = kvr_geometry_kv_extent(&g), lane = kvr_geometry_lane_bytes(&g);
	uint64_t slot_stride = (lane + 4095) / 4096 * 4096, arena_bytes = slot_stride * n_blocks;

	static const uint64_t sizes[] = {64 << 10, 1 << 20, 16 << 20, 256 << 20};
	unsigned ns = 0;
	uint64_t sz[MAX_SIZES];
	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		if (sizes[i] <= kv_bytes && sizes[i] <= arena_bytes)
			sz[ns++] = sizes[i];

	/* The worker first: it must fork before this process initialises CUDA. */
	struct gw w;
	char why[256] = "";
	/* one piece per region: vLLM allocates one tensor per layer and role */
	if (gw_start(&w, kv_bytes, g.n_regions, NULL, why, sizeof(why))) {
		fprintf(stderr, "gpu_bench: gpu_worker: %s\n", why);
		gw_stop(&w);
		return 1;
	}
	struct gpu_arena a = {.fd = -1};
	if (gpu_arena_create(&a, arena_bytes)) {
		fprintf(stderr, "gpu_bench: arena of %llu bytes: %s\n", (unsigned long long)arena_bytes,
			strerror(errno));
		gw_stop(&w);
		return 1;
	}
	uint64_t pk[MAX_SIZES][2];
	int rc = peak(sz, ns, reps, pk);
	if (rc)
		goto out;

	struct cudaDeviceProp prop;
	cudaGetDeviceProperties(&prop, 0);
	printf("\nGPU: %s; prompt: %s, TP %u (rank 0), block %u, %u tokens -> %u full blocks of %llu bytes "
	       "(%u regions), %.1f MiB\n",
	       prop.name, preset, tp, block, tokens, n_blocks, (unsigned long long)lane, g.n_regions,
	       (double)(lane * n_blocks) / (1 << 20));

	/* Table 2: one run per size through the backend (auto: one cudaMemcpyAsync). */
	struct kvr_xfer *x = NULL;
	setenv("KVR_CUDA_COPY", "auto", 1);
	uint64_t t0 = kvr_now_ns();
	if ((rc = gpu_open(&w, &a, &x, why, sizeof(why)))) {
		fprintf(stderr, "gpu_bench: %s\n", why);
		rc = 1;
		goto out;
	}
	printf("open (IPC handles + cudaHostRegister of a %.1f MiB arena): %.1f ms\n",
	       (double)arena_bytes / (1 << 20), (double)(kvr_now_ns() - t0) / 1e6);
	printf("\n%-10s %14s %14s %14s %14s %8s %8s\n", "size", "peak H2D GB/s", "kvring H2D", "peak D2H GB/s",
	       "kvring D2H", "H2D %", "D2H %");
	for (unsigned i = 0; i < ns && !rc; i++) {
		uint64_t best[2] = {UINT64_MAX, UINT64_MAX};
		struct kvr_xfer_run run = {.kv_off = 0, .slot_off = 0, .len = sz[i]};
		for (int dir = 0; dir < 2 && !rc; dir++)
			for (unsigned r = 0; r < reps + 1 && !rc; r++) {
				uint64_t t;
				rc = one(x, dir ? KVR_XFER_KV_TO_SLOT : KVR_XFER_SLOT_TO_KV, &run, 1, &t);
				if (r && t < best[dir])
					best[dir] = t;
			}
		double ph = gbps(sz[i], pk[i][0]), kh = gbps(sz[i], best[0]), pd = gbps(sz[i], pk[i][1]),
		       kd = gbps(sz[i], best[1]);
		printf("%-10llu %14.1f %14.1f %14.1f %14.1f %7.0f%% %7.0f%%\n", (unsigned long long)sz[i], ph, kh, pd,
		       kd, ph ? 100 * kh / ph : 0, pd ? 100 * kd / pd : 0);
	}
	kvr_xfer_close(x);
	if (rc)
		goto out;

	/* Table 3: one prompt, every copy method; blocks 0..n-1 into slots 0..n-1, checked. */
	uint32_t *ids = calloc(n_blocks, 4), *back = calloc(n_blocks, 4);
	uint64_t *slots = calloc(n_blocks, 8), *times = calloc(reps, 8);
	struct kvr_xfer_layout L = {.regions = regions, .n_regions = g.n_regions, .num_blocks = num_blocks,
				    .kv_size = w.desc_fd_bytes, .arena_size = arena_bytes};
	size_t cap = kvr_xfer_plan_max_runs(g.n_regions, n_blocks);
	struct kvr_xfer_run *runs = calloc(cap, sizeof(*runs));
	if (!ids || !back || !slots || !times || !runs) {
		rc = 1;
		goto out;
	}
	for (uint32_t i = 0; i < n_blocks; i++) {
		ids[i] = i;
		back[i] = num_blocks - 1 - i;
		slots[i] = i * slot_stride;
	}
	int nst = kvr_xfer_plan(&L, ids, slots, n_blocks, runs, cap, NULL, NULL);
	if (nst < 0) {
		fprintf(stderr, "gpu_bench: plan: %s\n", strerror(-nst));
		rc = 1;
		goto out;
	}
	gpu_fill(w.mirror, kv_bytes, 7);
	printf("\nprompt of %u blocks, %d runs of %u bytes\n%-8s %12s %12s %10s %12s %12s %10s\n", n_blocks, nst,
	       g.page_bytes[0], "method", "store best", "median ms", "GB/s", "load best", "median ms", "GB/s");
	static const char *const methods[] = {"auto", "memcpy", "batch", "kernel"};
	for (unsigned m = 0; m < 4 && !rc; m++) {
		setenv("KVR_CUDA_COPY", methods[m], 1);
		x = NULL;
		if (gw_cmd(&w, GW_WRITE, 0, 0, kv_bytes, 0, 0, NULL)) { /* the image, again: loads overwrote blocks */
			rc = 1;
			break;
		}
		if (gpu_open(&w, &a, &x, why, sizeof(why))) {
			printf("%-8s (not available: %s)\n", methods[m], why);
			continue;
		}
		uint64_t best[2], med[2];
		for (int dir = 0; dir < 2 && !rc; dir++) {
			/* store blocks 0..n-1; load the same slots into blocks in reverse order */
			int n = kvr_xfer_plan(&L, dir ? back : ids, slots, n_blocks, runs, cap, NULL, NULL);
			for (unsigned r = 0; r < reps && !rc; r++)
				rc = one(x, dir ? KVR_XFER_SLOT_TO_KV : KVR_XFER_KV_TO_SLOT, runs, (size_t)n,
					 &times[r]);
			qsort(times, reps, 8, cmp_u64);
			best[dir] = times[0];
			med[dir] = times[reps / 2];
		}
		kvr_xfer_close(x);
		if (rc)
			break;
		/* check: slot i holds block i of the image, block back[i] came back equal */
		if (gw_cmd(&w, GW_READ, 0, 0, kv_bytes, kv_bytes, 0, NULL)) {
			rc = 1;
			break;
		}
		for (uint32_t i = 0; i < n_blocks && !rc; i++) {
			uint64_t so = slots[i];
			for (uint32_t r = 0; r < g.n_regions && !rc; r++) {
				const struct kvr_xfer_region *rg = &regions[r];
				const uint8_t *src = w.mirror + rg->offset + (uint64_t)ids[i] * rg->stride;
				const uint8_t *dst = w.mirror + kv_bytes + rg->offset + (uint64_t)back[i] * rg->stride;
				if (memcmp(a.base + so, src, rg->page_bytes) || memcmp(dst, src, rg->page_bytes)) {
					fprintf(stderr, "gpu_bench: %s: block %u region %u: bytes differ\n",
						methods[m], i, r);
					rc = 1;
				}
				so += regions[r].page_bytes;
			}
		}
		uint64_t bytes = lane * n_blocks;
		printf("%-8s %10.2f ms %12.2f %10.1f %10.2f ms %12.2f %10.1f\n", methods[m], (double)best[0] / 1e6,
		       (double)med[0] / 1e6, gbps(bytes, best[0]), (double)best[1] / 1e6, (double)med[1] / 1e6,
		       gbps(bytes, best[1]));
	}
	free(ids);
	free(back);
	free(slots);
	free(times);
	free(runs);
	if (reg_gib)
		rc = reg_bench(&w, reg_gib);
out:
	gpu_arena_destroy(&a);
	gw_stop(&w);
	if (rc)
		fprintf(stderr, "gpu_bench: FAILED\n");
	return rc ? 1 : 0;
}
