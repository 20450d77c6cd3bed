/* GPU tests of the CUDA transfer backend: byte-exact round trips through IPC memory of a separate worker process. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_test.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"

/*
 * Every test starts tests/gpu/gpu_worker (the inference worker: cudaMalloc'd KV memory in
 * several allocations, exported in a KV descriptor) and plays the loader/storer: it reads
 * the descriptor from the fd, opens the CUDA backend on it and an arena memfd, and moves
 * blocks KV -> slots -> KV, checking every byte of the slots, of the whole KV memory, and
 * the worker's guard bytes. Copy methods: auto, memcpy, batch, kernel (KVR_CUDA_COPY).
 * Without a GPU, main() exits 77 before Criterion starts.
 */

#define WAIT_NS (20ll * 1000000000ll)

static const char *const modes[] = {"auto", "memcpy", "batch", "kernel"};

struct lay {
	struct kvr_xfer_region regions[KVR_GEOM_MAX_REGIONS];
	struct kvr_xfer_layout L;
	uint64_t kv_extent;  /* bytes the worker allocates */
	uint64_t slot_bytes; /* one lane's block */
	uint64_t slot_stride;/* rounded to 4 KiB, as kvringd's slots */
};

static void lay_finish(struct lay *l, uint32_t n_regions, uint32_t num_blocks)
{
	l->L = (struct kvr_xfer_layout){.regions = l->regions, .n_regions = n_regions, .num_blocks = num_blocks};
	l->kv_extent = 0;
	for (uint32_t r = 0; r < n_regions; r++) {
		uint64_t end = l->regions[r].offset + (uint64_t)(num_blocks - 1) * l->regions[r].stride +
			       l->regions[r].page_bytes;
		if (end > l->kv_extent)
			l->kv_extent = end;
	}
}

static void lay_from_geometry(struct lay *l, const struct kvr_geometry *g)
{
	for (uint32_t r = 0; r < g->n_regions; r++) {
		struct kvr_region gr = kvr_geometry_region(g, r);
		l->regions[r] = (struct kvr_xfer_region){.offset = gr.offset, .stride = gr.stride,
							 .page_bytes = gr.page_bytes, .sem_bytes = gr.sem_bytes};
	}
	lay_finish(l, g->n_regions, g->num_blocks);
}

/* Bind the layout to a worker and an arena of n_slots slots. */
static void lay_bind(struct lay *l, const struct gw *w, uint32_t n_slots)
{
	l->L.kv_size = w->desc_fd_bytes;
	l->slot_bytes = kvr_xfer_slot_bytes(&l->L);
	l->slot_stride = (l->slot_bytes + 4095) / 4096 * 4096;
	l->L.arena_size = l->slot_stride * n_slots;
	struct kvr_xfer_err xe = {0};
	cr_assert_eq(kvr_xfer_layout_check(&l->L, &xe), 0, "layout does not check (what %u region %u)", xe.what,
		     xe.region);
}

static void start_worker(struct gw *w, uint64_t kv_bytes, unsigned split, const char *const *extra)
{
	char why[256] = "";
	int rc = gw_start(w, kv_bytes, split, extra, why, sizeof(why));
	cr_assert_eq(rc, 0, "gpu_worker: %s", why);
}

static struct kvr_xfer *open_mode(const struct gw *w, const struct gpu_arena *a, const char *mode)
{
	char why[256] = "";
	struct kvr_xfer *x = NULL;
	setenv("KVR_CUDA_COPY", mode, 1);
	int rc = gpu_open(w, a, &x, why, sizeof(why));
	if (rc == -EOPNOTSUPP && !strcmp(mode, "kernel")) {
		cr_log_warn("copy mode kernel not in this build (no nvcc): skipped");
		return NULL;
	}
	cr_assert_eq(rc, 0, "open (%s): %s", mode, why);
	cr_assert_str_eq(kvr_xfer_backend_name(x), "cuda");
	return x;
}

/* Submit one plan and wait for it; returns the stats. */
static struct kvr_xfer_stats move(struct kvr_xfer *x, const struct lay *l, uint32_t dir, const uint32_t *ids,
				  const uint64_t *slots, size_t n, const struct kvr_xfer_dep *dep)
{
	size_t cap = kvr_xfer_plan_max_runs(l->L.n_regions, n);
	struct kvr_xfer_run *runs = calloc(cap, sizeof(*runs));
	struct kvr_xfer_err xe = {0};
	uint64_t bytes = 0, ticket = 0;
	cr_assert(runs);
	int nr = kvr_xfer_plan(&l->L, ids, slots, n, runs, cap, &bytes, &xe);
	cr_assert_geq(nr, 1, "plan: %d (what %u, block %u)", nr, xe.what, xe.block_id);
	cr_assert_eq(kvr_xfer_submit(x, dir, runs, (size_t)nr, dep, &ticket), 0, "submit: %s",
		     kvr_xfer_cuda_last_error());
	free(runs);
	struct kvr_xfer_stats st = {0};
	int rc = kvr_xfer_wait(x, ticket, WAIT_NS, &st);
	cr_assert_eq(rc, 0, "wait: %d (%s)", rc, kvr_xfer_cuda_last_error());
	cr_assert_eq(st.bytes, bytes, "stats: %llu bytes moved, planned %llu", (unsigned long long)st.bytes,
		     (unsigned long long)bytes);
	cr_assert_eq(st.runs, (uint64_t)nr);
	cr_assert_geq(st.copies, 1);
	return st;
}

/* Every byte of the lane block in slot s equals block id's pages in the KV image img. */
static void check_slot(const struct lay *l, const uint8_t *arena, uint64_t slot_off, const uint8_t *img, uint32_t id,
		       const char *what)
{
	uint64_t so = slot_off;
	for (uint32_t r = 0; r < l->L.n_regions; r++) {
		const struct kvr_xfer_region *g = &l->regions[r];
		const uint8_t *kv = img + g->offset + (uint64_t)id * g->stride;
		if (memcmp(arena + so, kv, g->page_bytes)) {
			uint32_t k = 0;
			while (arena[so + k] == kv[k])
				k++;
			cr_assert_fail("%s: block %u region %u byte %u: slot has %#x, KV has %#x", what, id, r, k,
				       arena[so + k], kv[k]);
		}
		so += g->page_bytes;
	}
}

/* Store n random blocks into slots, check them; load them into other blocks of a zeroed
 * KV memory, check the whole KV memory; check the guards. */
static void roundtrip(struct lay *l, unsigned split, uint32_t n, uint64_t seed, int reverse_slots)
{
	struct gw w;
	struct gpu_arena a = {.fd = -1};
	start_worker(&w, l->kv_extent, split, NULL);
	lay_bind(l, &w, n);
	cr_assert_eq(gpu_arena_create(&a, l->L.arena_size), 0);
	uint32_t *src = calloc(n, 4), *dst = calloc(n, 4), *perm = calloc(l->L.num_blocks, 4);
	uint64_t *slots = calloc(n, 8);
	uint8_t *expect = malloc(l->kv_extent);
	cr_assert(src && dst && perm && slots && expect);

	for (unsigned m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		struct kvr_xfer *x = open_mode(&w, &a, modes[m]);
		if (!x)
			continue;
		uint64_t s = seed + m;
		fprintf(stderr, "roundtrip %s: seed %llu, %u of %u blocks, %u regions, %llu KV bytes in %u pieces\n",
			modes[m], (unsigned long long)s, n, l->L.num_blocks, l->L.n_regions,
			(unsigned long long)l->kv_extent, split);
		/* random distinct ids: a shuffled prefix */
		for (uint32_t i = 0; i < l->L.num_blocks; i++)
			perm[i] = i;
		for (uint32_t i = l->L.num_blocks - 1; i > 0; i--) {
			uint32_t j = (uint32_t)(gpu_pat(s, i * 8) | (uint32_t)gpu_pat(s, i * 8 + 1) << 8) % (i + 1);
			uint32_t t = perm[i];
			perm[i] = perm[j];
			perm[j] = t;
		}
		for (uint32_t i = 0; i < n; i++) {
			src[i] = perm[i];
			dst[i] = perm[l->L.num_blocks - 1 - i]; /* load into other blocks where possible */
			slots[i] = (reverse_slots ? n - 1 - i : i) * l->slot_stride;
		}

		/* store */
		gpu_fill(w.mirror, l->kv_extent, s);
		cr_assert_eq(gw_cmd(&w, GW_WRITE, 0, 0, l->kv_extent, 0, 0, NULL), 0);
		memset(a.base, 0xA5, a.size);
		move(x, l, KVR_XFER_KV_TO_SLOT, src, slots, n, NULL);
		for (uint32_t i = 0; i < n; i++) {
			check_slot(l, a.base, slots[i], w.mirror, src[i], "store");
			for (uint64_t p = l->slot_bytes; p < l->slot_stride; p++)
				cr_assert_eq(a.base[slots[i] + p], 0xA5, "store wrote slot padding (slot %u byte %llu)",
					     i, (unsigned long long)p);
		}

		/* load into a zeroed KV memory */
		memset(w.mirror, 0, l->kv_extent);
		cr_assert_eq(gw_cmd(&w, GW_WRITE, 0, 0, l->kv_extent, 0, 0, NULL), 0);
		move(x, l, KVR_XFER_SLOT_TO_KV, dst, slots, n, NULL);
		memset(w.mirror, 0x77, l->kv_extent);
		cr_assert_eq(gw_cmd(&w, GW_READ, 0, 0, l->kv_extent, 0, 0, NULL), 0);
		memset(expect, 0, l->kv_extent);
		for (uint32_t i = 0; i < n; i++) {
			uint64_t so = slots[i];
			for (uint32_t r = 0; r < l->L.n_regions; r++) {
				const struct kvr_xfer_region *g = &l->regions[r];
				memcpy(expect + g->offset + (uint64_t)dst[i] * g->stride, a.base + so, g->page_bytes);
				so += g->page_bytes;
			}
		}
		for (uint64_t b = 0; b < l->kv_extent; b++)
			if (w.mirror[b] != expect[b])
				cr_assert_fail("load (%s): KV byte %llu is %#x, want %#x", modes[m],
					       (unsigned long long)b, w.mirror[b], expect[b]);
		struct gw_rep rep;
		cr_assert_eq(gw_cmd(&w, GW_GUARDS, 0, 0, 0, 0, 0, &rep), 0);
		cr_assert_eq(rep.value, 0, "%llu guard bytes outside the KV ranges changed",
			     (unsigned long long)rep.value);

		struct kvr_xfer_totals t;
		kvr_xfer_get_totals(x, &t);
		cr_assert_eq(t.completed, 2);
		cr_assert_eq(t.failed, 0);
		cr_assert_eq(t.sum.bytes, 2 * n * l->slot_bytes);
		kvr_xfer_close(x);
	}
	free(src);
	free(dst);
	free(perm);
	free(slots);
	free(expect);
	gpu_arena_destroy(&a);
	gw_stop(&w);
}

static uint64_t seed_of(const char *test)
{
	const char *e = getenv("KVR_TEST_SEED");
	uint64_t s = e && *e ? strtoull(e, NULL, 0) : (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
	fprintf(stderr, "%s: seed %llu (repeat with KVR_TEST_SEED=%llu)\n", test, (unsigned long long)s,
		(unsigned long long)s);
	return s;
}

TestSuite(gpu_xfer, .timeout = 120);

/* vLLM's layer-major MHA layout (K then V per layer, each [blocks, 16, 2, 128] bf16),
 * the KV offset space cut into 5 pieces across 3 allocations (runs cross pieces). */
Test(gpu_xfer, vllm_layer_major)
{
	struct kvr_geometry g;
	static struct lay l;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 4, 2, 128, 2, 16, 64), 0);
	lay_from_geometry(&l, &g);
	roundtrip(&l, 5, 24, seed_of("vllm_layer_major"), 0);
}

/* 561-byte rows (odd width, odd offsets, two strides) into reversed slots: every copy
 * method must be exact bytewise where alignment does not allow vectors. */
Test(gpu_xfer, odd_rows_561)
{
	static struct lay l;
	l.regions[0] = (struct kvr_xfer_region){.offset = 3, .stride = 561, .page_bytes = 561, .sem_bytes = 561};
	l.regions[1] = (struct kvr_xfer_region){.offset = 3 + 561 * 40 + 5, .stride = 600, .page_bytes = 561,
						.sem_bytes = 561};
	lay_finish(&l, 2, 40);
	l.kv_extent += 13;
	roundtrip(&l, 3, 17, seed_of("odd_rows_561"), 1);
}

/* A K page that declares a 37-byte opaque tail past its semantic 4096 bytes, and a
 * separate 37-byte tail region: every declared byte travels, stride gaps stay untouched
 * (the whole-KV comparison checks both). */
Test(gpu_xfer, opaque_tail)
{
	static struct lay l;
	l.regions[0] = (struct kvr_xfer_region){.offset = 0, .stride = 8192, .page_bytes = 4096 + 37,
						.sem_bytes = 4096};
	l.regions[1] = (struct kvr_xfer_region){.offset = 8192 * 32, .stride = 64, .page_bytes = 37, .sem_bytes = 37};
	lay_finish(&l, 2, 32);
	roundtrip(&l, 2, 9, seed_of("opaque_tail"), 0);
}

/* 80 small regions (40 layers x K,V of 512 bytes): many runs per block, the batch and
 * kernel paths' case. */
Test(gpu_xfer, many_small_runs)
{
	static struct lay l;
	for (uint32_t r = 0; r < 80; r++)
		l.regions[r] = (struct kvr_xfer_region){.offset = (uint64_t)r * 512 * 32, .stride = 512,
							.page_bytes = 512, .sem_bytes = 512};
	lay_finish(&l, 80, 32);
	roundtrip(&l, 7, 16, seed_of("many_small_runs"), 1);
}

/* Two stores under one request id, each waiting on its own producer event; the worker
 * destroys the first event right after its store was submitted. The worker's stream
 * sleeps 300 ms before writing A (event 0) and again before writing B (event 1): a copy
 * that did not wait would read the old bytes, one that waited on the wrong event B. */
Test(gpu_xfer, event_lifetime)
{
	struct kvr_geometry g;
	static struct lay l;
	struct gw w;
	struct gpu_arena a = {.fd = -1};
	struct gw_rep rep;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 4, 2, 128, 2, 16, 32), 0);
	lay_from_geometry(&l, &g);
	start_worker(&w, l.kv_extent, 4, NULL);
	lay_bind(&l, &w, 16);
	cr_assert_eq(gpu_arena_create(&a, l.L.arena_size), 0);
	uint64_t K = l.kv_extent, seed = seed_of("event_lifetime");

	for (unsigned m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		struct kvr_xfer *x = open_mode(&w, &a, modes[m]);
		if (!x)
			continue;
		gpu_fill(w.mirror, K, seed);              /* OLD, in the KV memory now */
		gpu_fill(w.mirror + K, K, seed + 1);      /* A */
		gpu_fill(w.mirror + 2 * K, K, seed + 2);  /* B */
		cr_assert_eq(gw_cmd(&w, GW_WRITE, 0, 0, K, 0, 0, NULL), 0);
		memset(a.base, 0, a.size);

		uint32_t ids1[8], ids2[8];
		uint64_t sl1[8], sl2[8];
		for (uint32_t i = 0; i < 8; i++) {
			ids1[i] = i;
			ids2[i] = 8 + i;
			sl1[i] = i * l.slot_stride;
			sl2[i] = (8 + i) * l.slot_stride;
		}
		struct kvr_xfer_run runs[2][16 * 8];
		uint64_t t1 = 0, t2 = 0;
		int n1 = kvr_xfer_plan(&l.L, ids1, sl1, 8, runs[0], 16 * 8, NULL, NULL);
		int n2 = kvr_xfer_plan(&l.L, ids2, sl2, 8, runs[1], 16 * 8, NULL, NULL);
		cr_assert(n1 > 0 && n2 > 0);

		struct kvr_xfer_dep d0 = {.kind = KVR_XFER_DEP_CUDA_IPC_EVENT, .len = KVR_CUDA_IPC_BYTES};
		cr_assert_eq(gw_cmd(&w, GW_WRITE_EVENT, 0, 0, K, K, 300000, &rep), 0);
		memcpy(d0.blob, rep.handle, KVR_CUDA_IPC_BYTES);
		cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, runs[0], (size_t)n1, &d0, &t1), 0, "submit 1: %s",
			     kvr_xfer_cuda_last_error());
		/* The worker's stream sleeps 300 ms before event 0: the copy cannot be done. */
		cr_assert_eq(kvr_xfer_poll(x, t1, NULL), -EAGAIN, "store 1 completed before its producer event");
		cr_assert_eq(gw_cmd(&w, GW_DESTROY_EVENT, 0, 0, 0, 0, 0, NULL), 0);
		memset(d0.blob, 0xCD, sizeof(d0.blob)); /* our copy of the handle is gone too */

		struct kvr_xfer_dep d1 = {.kind = KVR_XFER_DEP_CUDA_IPC_EVENT, .len = KVR_CUDA_IPC_BYTES};
		cr_assert_eq(gw_cmd(&w, GW_WRITE_EVENT, 1, 0, K, 2 * K, 300000, &rep), 0);
		memcpy(d1.blob, rep.handle, KVR_CUDA_IPC_BYTES);
		cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, runs[1], (size_t)n2, &d1, &t2), 0, "submit 2: %s",
			     kvr_xfer_cuda_last_error());

		struct kvr_xfer_stats st1 = {0}, st2 = {0};
		cr_assert_eq(kvr_xfer_wait(x, t1, WAIT_NS, &st1), 0, "store 1: %s", kvr_xfer_cuda_last_error());
		cr_assert_eq(kvr_xfer_wait(x, t2, WAIT_NS, &st2), 0, "store 2: %s", kvr_xfer_cuda_last_error());
		cr_assert_geq(st1.queue_ns + st1.copy_ns, 250000000ull, "store 1 took %llu ns: it did not wait",
			      (unsigned long long)(st1.queue_ns + st1.copy_ns));
		for (uint32_t i = 0; i < 8; i++) {
			check_slot(&l, a.base, sl1[i], w.mirror + K, ids1[i], "store 1 (A)");
			check_slot(&l, a.base, sl2[i], w.mirror + 2 * K, ids2[i], "store 2 (B)");
		}
		cr_assert_eq(gw_cmd(&w, GW_SYNC, 0, 0, 0, 0, 0, NULL), 0);
		cr_assert_eq(gw_cmd(&w, GW_DESTROY_EVENT, 1, 0, 0, 0, 0, NULL), 0);
		struct kvr_xfer_totals t;
		kvr_xfer_get_totals(x, &t);
		cr_assert_eq(t.completed, 2);
		cr_assert_eq(t.failed, 0);
		kvr_xfer_close(x);
	}
	gpu_arena_destroy(&a);
	gw_stop(&w);
}

/* One store + load of 4 blocks through x, checked against the worker's KV image. */
static void small_check(struct kvr_xfer *x, struct gw *w, struct lay *l, struct gpu_arena *a, uint64_t seed)
{
	uint32_t ids[4] = {1, 5, 2, 7}, back[4] = {9, 10, 11, 12};
	uint64_t sl[4];
	for (uint32_t i = 0; i < 4; i++)
		sl[i] = i * l->slot_stride;
	gpu_fill(w->mirror, l->kv_extent, seed);
	cr_assert_eq(gw_cmd(w, GW_WRITE, 0, 0, l->kv_extent, 0, 0, NULL), 0);
	move(x, l, KVR_XFER_KV_TO_SLOT, ids, sl, 4, NULL);
	for (uint32_t i = 0; i < 4; i++)
		check_slot(l, a->base, sl[i], w->mirror, ids[i], "store");
	move(x, l, KVR_XFER_SLOT_TO_KV, back, sl, 4, NULL);
	cr_assert_eq(gw_cmd(w, GW_READ, 0, 0, l->kv_extent, 0, 0, NULL), 0);
	for (uint32_t i = 0; i < 4; i++)
		check_slot(l, a->base, sl[i], w->mirror, back[i], "load");
}

/* Open, close, open again (three times); two contexts on one arena at once (the arena
 * stays registered until the last closes); a new worker after the first exited: stale
 * IPC state never blocks the next open. */
Test(gpu_xfer, reopen_and_restart)
{
	struct kvr_geometry g;
	static struct lay l;
	struct gw w;
	struct gpu_arena a = {.fd = -1};
	uint64_t seed = seed_of("reopen_and_restart");
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 2, 2, 128, 2, 16, 16), 0);
	lay_from_geometry(&l, &g);
	start_worker(&w, l.kv_extent, 3, NULL);
	lay_bind(&l, &w, 4);
	cr_assert_eq(gpu_arena_create(&a, l.L.arena_size), 0);
	for (int i = 0; i < 3; i++) {
		struct kvr_xfer *x = open_mode(&w, &a, "auto");
		small_check(x, &w, &l, &a, seed + (uint64_t)i);
		kvr_xfer_close(x);
	}
	struct kvr_xfer *x1 = open_mode(&w, &a, "memcpy");
	struct kvr_xfer *x2 = open_mode(&w, &a, "kernel");
	if (!x2)
		x2 = open_mode(&w, &a, "batch");
	small_check(x1, &w, &l, &a, seed + 10);
	small_check(x2, &w, &l, &a, seed + 11);
	kvr_xfer_close(x1);
	small_check(x2, &w, &l, &a, seed + 12); /* the arena is still registered (mapped) for x2 */
	kvr_xfer_close(x2);
	gw_stop(&w);

	start_worker(&w, l.kv_extent, 2, NULL);
	lay_bind(&l, &w, 4);
	struct kvr_xfer *x = open_mode(&w, &a, "auto");
	small_check(x, &w, &l, &a, seed + 20);
	kvr_xfer_close(x);
	gpu_arena_destroy(&a);
	gw_stop(&w);
}

/* A descriptor with a hole (piece 1 not exported): a run touching it is refused with
 * -ERANGE before anything is copied; runs elsewhere work. A descriptor with a corrupt
 * handle fails to open with an error (not a crash), and a good one opens afterwards. */
Test(gpu_xfer, holes_and_bad_handles)
{
	static const char *const hole[] = {"--hole", "1", NULL}, *const bad[] = {"--bad-handle", NULL};
	struct gw w, wb;
	struct gpu_arena a = {.fd = -1};
	const uint64_t K = 64 * 1024;
	start_worker(&w, K, 4, hole);
	cr_assert_eq(gpu_arena_create(&a, K), 0);
	struct kvr_xfer *x = open_mode(&w, &a, "auto");
	uint64_t b1 = K / 4, b2 = K / 2, ticket = 0; /* piece 1 is [b1, b2) */
	memset(a.base, 0x11, a.size);
	struct kvr_xfer_run across = {.kv_off = b1 - 100, .slot_off = 0, .len = 200};
	struct kvr_xfer_run inside = {.kv_off = b1 + 10, .slot_off = 0, .len = 10};
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &across, 1, NULL, &ticket), -ERANGE);
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, &inside, 1, NULL, &ticket), -ERANGE);
	cr_assert_eq(kvr_xfer_inflight(x), 0);
	for (uint64_t i = 0; i < a.size; i++)
		cr_assert_eq(a.base[i], 0x11, "a refused submit wrote arena byte %llu", (unsigned long long)i);
	gpu_fill(w.mirror, K, 42);
	cr_assert_eq(gw_cmd(&w, GW_WRITE, 0, 0, K, 0, 0, NULL), 0);
	struct kvr_xfer_run ok[2] = {{.kv_off = 7, .slot_off = 0, .len = b1 - 7},
				     {.kv_off = b2, .slot_off = b1, .len = K - b2}};
	struct kvr_xfer_stats st;
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, ok, 2, NULL, &ticket), 0);
	cr_assert_eq(kvr_xfer_wait(x, ticket, WAIT_NS, &st), 0);
	cr_assert_eq(memcmp(a.base, w.mirror + 7, b1 - 7), 0);
	cr_assert_eq(memcmp(a.base + b1, w.mirror + b2, K - b2), 0);
	kvr_xfer_close(x);

	start_worker(&wb, K, 2, bad);
	char why[256] = "";
	struct kvr_xfer *xb = NULL;
	setenv("KVR_CUDA_COPY", "auto", 1);
	int rc = gpu_open(&wb, &a, &xb, why, sizeof(why));
	cr_assert_lt(rc, 0, "a corrupt IPC handle opened");
	cr_assert_null(xb);
	fprintf(stderr, "corrupt handle refused as expected: %s\n", why);
	gw_stop(&wb);

	x = open_mode(&w, &a, "auto");
	cr_assert_eq(kvr_xfer_submit(x, KVR_XFER_KV_TO_SLOT, ok, 2, NULL, &ticket), 0);
	cr_assert_eq(kvr_xfer_wait(x, ticket, WAIT_NS, &st), 0);
	kvr_xfer_close(x);
	gpu_arena_destroy(&a);
	gw_stop(&w);
}

int main(int argc, char *argv[])
{
	if (gpu_probe() != 0) {
		printf("no usable CUDA device: skipping the GPU tests\n");
		return 77;
	}
	struct criterion_test_set *tests = criterion_initialize();
	int result = 0;
	if (criterion_handle_args(argc, argv, true))
		result = !criterion_run_all_tests(tests);
	criterion_finalize(tests);
	return result;
}

/* ---- DCP through CUDA memory: the gather actor's copies ------------------------------------ */

#define DG_LAYERS 3
#define DG_ROW 561 /* fp8 MLA record of an odd width */
#define DG_BLOCK 16
#define DG_NB 8
#define DG_MAXD 4

struct dg_rank {
	struct kvr_geometry g;
	struct gw w;
	struct kvr_xfer *x;
};

static void dg_geometry(struct kvr_geometry *g, unsigned d, unsigned il, unsigned r)
{
	cr_assert_eq(kvr_geometry_fill_vllm_mla(g, DG_LAYERS, DG_ROW, 1, DG_BLOCK / d, DG_NB), 0);
	g->block_tokens = DG_BLOCK;
	g->tp_size = d;
	g->tp_rank = r;
	g->dcp_size = d;
	g->dcp_rank = r;
	g->dcp_interleave = il;
}

static uint8_t dg_byte(uint64_t seed, unsigned blk, unsigned l, uint64_t t, uint32_t k)
{
	return gpu_pat(seed, ((((uint64_t)blk * DG_LAYERS + l) * DG_BLOCK + t) * DG_ROW) + k);
}

/* Copy prompt blocks between D ranks' GPU KV memory (rank r's engine block ids[r][i]) and
 * canonical slots, every rank's runs from kvr_dcp_lane_runs submitted before any is
 * waited for — what the gather actor does through the same interface. */
static void dg_move(struct dg_rank *rk, unsigned d, uint32_t dir, const uint32_t ids[DG_MAXD][2],
		    const uint64_t *slot_offs, unsigned n)
{
	uint64_t tickets[DG_MAXD];
	for (unsigned r = 0; r < d; r++) {
		size_t per = kvr_dcp_lane_max_runs(&rk[r].g), nr = 0;
		struct kvr_dcp_run *dr = calloc(per, sizeof(*dr));
		struct kvr_xfer_run *runs = calloc(per * n, sizeof(*runs));
		cr_assert(dr && runs);
		char err[160];
		for (unsigned i = 0; i < n; i++) {
			int k = kvr_dcp_lane_runs(&rk[r].g, ids[r][i], slot_offs[i], dr, per, err, sizeof(err));
			cr_assert_gt(k, 0, "lane runs: %s", err);
			for (int j = 0; j < k; j++)
				runs[nr++] = (struct kvr_xfer_run){.kv_off = dr[j].kv_off, .slot_off = dr[j].slot_off,
								   .len = dr[j].len};
		}
		cr_assert_eq(kvr_xfer_submit(rk[r].x, dir, runs, nr, NULL, &tickets[r]), 0, "submit rank %u: %s", r,
			     kvr_xfer_cuda_last_error());
		free(dr);
		free(runs);
	}
	for (unsigned r = 0; r < d; r++) {
		struct kvr_xfer_stats st = {0};
		cr_assert_eq(kvr_xfer_wait(rk[r].x, tickets[r], WAIT_NS, &st), 0, "wait rank %u: %s", r,
			     kvr_xfer_cuda_last_error());
	}
}

static void dg_open(struct dg_rank *rk, unsigned d, unsigned il, const struct gpu_arena *a, const char *mode)
{
	for (unsigned r = 0; r < d; r++) {
		dg_geometry(&rk[r].g, d, il, r);
		start_worker(&rk[r].w, kvr_geometry_kv_extent(&rk[r].g), 3, NULL);
		memset(rk[r].w.mirror, 0, rk[r].w.kv_bytes);
		cr_assert_eq(gw_cmd(&rk[r].w, GW_WRITE, 0, 0, rk[r].w.kv_bytes, 0, 0, NULL), 0);
		rk[r].x = open_mode(&rk[r].w, a, mode);
	}
}

static void dg_close(struct dg_rank *rk, unsigned d)
{
	for (unsigned r = 0; r < d; r++) {
		struct gw_rep rep;
		cr_assert_eq(gw_cmd(&rk[r].w, GW_GUARDS, 0, 0, 0, 0, 0, &rep), 0);
		cr_assert_eq(rep.value, 0, "rank %u: %llu guard bytes changed", r, (unsigned long long)rep.value);
		kvr_xfer_close(rk[r].x);
		gw_stop(&rk[r].w);
	}
}

/* Store two blocks under DCP 2 (each rank's 8 of 16 tokens, 561-byte rows, from its own
 * GPU worker process), check the canonical slots byte for byte, load them under DCP 4 with
 * interleave 2 and under DCP 1 into four / one other workers: every row where its global
 * token says, everything else zero, no guard byte touched. */
Test(gpu_xfer, dcp_gather_scatter)
{
	uint64_t seed = seed_of("dcp_gather_scatter");
	struct kvr_geometry g1;
	dg_geometry(&g1, 1, 1, 0);
	uint64_t lane = kvr_geometry_lane_bytes(&g1), stride = (lane + 4095) / 4096 * 4096;
	struct gpu_arena a = {.fd = -1};
	cr_assert_eq(gpu_arena_create(&a, 2 * stride), 0);
	const uint64_t slots[2] = {stride, 0};
	for (unsigned m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		static struct dg_rank rk[DG_MAXD];
		/* gather under DCP 2 */
		dg_open(rk, 2, 1, &a, modes[m]);
		if (!rk[0].x) {
			dg_close(rk, 2);
			continue;
		}
		const uint32_t src[DG_MAXD][2] = {{5, 2}, {0, 7}};
		for (unsigned r = 0; r < 2; r++) {
			for (unsigned i = 0; i < 2; i++)
				for (unsigned l = 0; l < DG_LAYERS; l++) {
					struct kvr_region reg = kvr_geometry_region(&rk[r].g, l);
					uint8_t *p = rk[r].w.mirror + reg.offset + (uint64_t)src[r][i] * reg.stride;
					for (uint32_t j = 0; j < DG_BLOCK / 2; j++)
						for (uint32_t k = 0; k < DG_ROW; k++)
							p[j * DG_ROW + k] = dg_byte(seed, i, l, kvr_dcp_global_token(j, 2, 1, r), k);
				}
			cr_assert_eq(gw_cmd(&rk[r].w, GW_WRITE, 0, 0, rk[r].w.kv_bytes, 0, 0, NULL), 0);
		}
		memset(a.base, 0xA5, a.size);
		dg_move(rk, 2, KVR_XFER_KV_TO_SLOT, src, slots, 2);
		for (unsigned i = 0; i < 2; i++)
			for (unsigned l = 0; l < DG_LAYERS; l++)
				for (uint32_t t = 0; t < DG_BLOCK; t++)
					for (uint32_t k = 0; k < DG_ROW; k++) {
						uint64_t at = slots[i] + kvr_dcp_canonical_region_offset(&g1, l) +
							      (uint64_t)t * DG_ROW + k;
						if (a.base[at] != dg_byte(seed, i, l, t, k))
							cr_assert_fail("%s: slot %u layer %u token %u byte %u is %#x, want %#x",
								       modes[m], i, l, t, k, a.base[at],
								       dg_byte(seed, i, l, t, k));
					}
		dg_close(rk, 2);

		/* scatter under DCP 4 / interleave 2, then DCP 1 */
		static const unsigned layouts[2][2] = {{4, 2}, {1, 1}};
		for (unsigned y = 0; y < 2; y++) {
			unsigned d = layouts[y][0], il = layouts[y][1];
			dg_open(rk, d, il, &a, modes[m]);
			const uint32_t dst[DG_MAXD][2] = {{1, 6}, {3, 4}, {7, 0}, {2, 5}};
			dg_move(rk, d, KVR_XFER_SLOT_TO_KV, dst, slots, 2);
			for (unsigned r = 0; r < d; r++) {
				memset(rk[r].w.mirror, 0x77, rk[r].w.kv_bytes);
				cr_assert_eq(gw_cmd(&rk[r].w, GW_READ, 0, 0, rk[r].w.kv_bytes, 0, 0, NULL), 0);
				for (uint32_t b = 0; b < DG_NB; b++) {
					int i = b == dst[r][0] ? 0 : b == dst[r][1] ? 1 : -1;
					for (unsigned l = 0; l < DG_LAYERS; l++) {
						struct kvr_region reg = kvr_geometry_region(&rk[r].g, l);
						const uint8_t *p = rk[r].w.mirror + reg.offset + (uint64_t)b * reg.stride;
						for (uint32_t j = 0; j < DG_BLOCK / d; j++)
							for (uint32_t k = 0; k < DG_ROW; k++) {
								uint8_t want = i < 0 ? 0 :
									dg_byte(seed, (unsigned)i, l,
										kvr_dcp_global_token(j, d, il, r), k);
								if (p[j * DG_ROW + k] != want)
									cr_assert_fail("%s: DCP %u/%u block %u layer %u row %u "
										       "byte %u is %#x, want %#x", modes[m],
										       r, d, b, l, j, k, p[j * DG_ROW + k], want);
							}
					}
				}
			}
			dg_close(rk, d);
		}
	}
	gpu_arena_destroy(&a);
}
