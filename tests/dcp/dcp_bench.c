/* dcp_bench: DCP gather (rank pages -> canonical) and scatter throughput against memcpy of the same bytes. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "dcp_test.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_time.h"
#include "kvr_xfer.h"

/*
 * Per model and layout (D ranks, interleave I): each rank's KV memory holds NB blocks of
 * the model's vLLM layer-major pages for its block_tokens / D tokens; the arena holds NB
 * canonical lanes. One round times, on the same buffers and the same bytes:
 *   memcpy      one memcpy per rank of its whole KV memory into the arena (no runs: the
 *               best case for the bytes moved; glibc switches to non-temporal stores for
 *               copies beyond its threshold, about 16 MiB here, which D = 2 reaches)
 *   gather      per block, kvr_dcp_lane_runs() of every rank, then the copies kv -> slot
 *               through kvr_copy_stream() (what the host backend uses for a submission of
 *               >= 1 MiB), in slot order: run k of every rank, then run k + 1 (every rank
 *               of a group has the same number of runs, and that order writes the
 *               canonical lane front to back)
 *   scatter     the same, slot -> kv
 *   gather nt / scatter nt   the same runs copied with non-temporal stores and ONE store
 *               fence per block (stream_run below), instead of kvr_copy_stream's fence per
 *               run of >= 4 KiB and cached stores below: what a batch streaming copy in the
 *               copy layer would give small runs
 * The variants are interleaved REPS times; each figure is the best round (the machine is
 * shared: the best round is the one least disturbed). Every variant is checked byte-exact
 * first: gathers against the canonical blocks built by brute force, scatters against the
 * rank pages (exit 1 otherwise). GB/s = 1e9 bytes a second.
 */
#define NB 4
#define REPS 9
#define MAX_D 8
#define BT 128

struct model {
	const char *name;
	unsigned regions; /* one region per layer (MLA) or per layer and K/V */
	uint32_t row; /* bytes a token in one region */
};

static const struct model models[] = {
	{"deepseek-v3 (MLA bf16)", 61, 1152},
	{"qwen2.5-72b TP4 (GQA bf16)", 160, 512},
};

static const uint32_t layouts[][2] = {{2, 1}, {2, 16}, {4, 1}, {4, 16}, {8, 1}, {8, 16}};

/* enough for any lane here: 160 regions x (128 / (2 x 1) + 1) runs, per rank */
#define MAX_RUNS (160 * (BT / 2 + 1))
static struct kvr_dcp_run runs[MAX_D][MAX_RUNS];

struct rank {
	struct kvr_geometry g;
	uint8_t *kv, *kv_ref;
	uint64_t bytes;
};

struct group {
	const struct model *m;
	uint32_t d, il;
	uint64_t lane;
	struct rank rk[MAX_D];
	uint8_t *arena;
};

/* Page-aligned like an arena slot or an engine's KV tensor. */
static void *page_alloc(uint64_t bytes)
{
	return aligned_alloc(4096, (bytes + 4095) & ~4095ull);
}

static uint64_t best(const uint64_t *v)
{
	uint64_t b = v[0];
	for (int i = 1; i < REPS; i++)
		if (v[i] < b)
			b = v[i];
	return b;
}

static int rank_geom(struct kvr_geometry *g, const struct model *m, uint32_t d, uint32_t il, uint32_t r)
{
	uint32_t n = BT / d;
	int rc;
	if (m->regions == 61) {
		rc = kvr_geometry_fill_vllm_mla(g, m->regions, m->row / 2, 2, n, NB);
	} else {
		rc = kvr_geometry_fill_vllm_layer_major(g, m->regions / 2, m->row / 256, 128, 2, n, NB);
		g->tp_size = 4;
	}
	g->block_tokens = BT;
	g->dcp_size = d;
	g->dcp_rank = r;
	g->dcp_interleave = il;
	return rc;
}

/* Runs of every rank for block b into runs[r]; the count (the same for every rank). */
static int plan(struct group *gr, uint32_t b)
{
	int n = 0;
	for (uint32_t r = 0; r < gr->d; r++) {
		int k = kvr_dcp_lane_runs(&gr->rk[r].g, b, b * gr->lane, runs[r], MAX_RUNS, NULL, 0);
		if (k <= 0 || (r && k != n))
			return -1;
		n = k;
	}
	return n;
}

enum { GATHER, SCATTER, GATHER_NT, SCATTER_NT, N_MOVES };

/* Copy with non-temporal stores for the cache-line aligned body and no fence: the caller
 * fences once after the last run (stream_fence). */
static void stream_run(uint8_t *d, const uint8_t *s, size_t len)
{
#if defined(__x86_64__)
	size_t head = (64 - ((uintptr_t)d & 63)) & 63; /* whole cache lines: no partial write-combining */
	if (head > len)
		head = len;
	memcpy(d, s, head);
	d += head;
	s += head;
	len -= head;
	for (; len >= 64; d += 64, s += 64, len -= 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), c);
		_mm_stream_si128((__m128i *)(d + 48), e);
	}
#endif
	memcpy(d, s, len);
}

static void stream_fence(void)
{
#if defined(__x86_64__)
	_mm_sfence();
#endif
}

static int move(struct group *gr, int how)
{
	for (uint32_t b = 0; b < NB; b++) {
		int n = plan(gr, b);
		if (n < 0)
			return -1;
		for (int k = 0; k < n; k++)
			for (uint32_t r = 0; r < gr->d; r++) {
				uint8_t *slot = gr->arena + runs[r][k].slot_off, *kv = gr->rk[r].kv + runs[r][k].kv_off;
				uint64_t len = runs[r][k].len;
				switch (how) {
				case GATHER:
					kvr_copy_stream(slot, kv, len);
					break;
				case SCATTER:
					kvr_copy_stream(kv, slot, len);
					break;
				case GATHER_NT:
					stream_run(slot, kv, len);
					break;
				default:
					stream_run(kv, slot, len);
					break;
				}
			}
		if (how >= GATHER_NT)
			stream_fence();
	}
	return 0;
}

static void copy_all(struct group *gr)
{
	uint64_t off = 0;
	for (uint32_t r = 0; r < gr->d; off += gr->rk[r].bytes, r++)
		memcpy(gr->arena + off, gr->rk[r].kv, gr->rk[r].bytes);
}

/* Rank memories from the truth (brute force); 0 or -1. */
static int group_open(struct group *gr, const struct model *m, uint32_t d, uint32_t il, const uint8_t *truth)
{
	char err[KVR_GEOM_ERR_MAX];
	memset(gr, 0, sizeof(*gr));
	gr->m = m;
	gr->d = d;
	gr->il = il;
	gr->lane = (uint64_t)m->regions * BT * m->row;
	gr->arena = page_alloc(gr->lane * NB);
	if (!gr->arena)
		return -1;
	for (uint32_t r = 0; r < d; r++) {
		struct rank *rk = &gr->rk[r];
		if (rank_geom(&rk->g, m, d, il, r) ||
		    kvr_geometry_validate(&rk->g, kvr_geometry_kv_extent(&rk->g), err, sizeof(err)) ||
		    kvr_dcp_canonical_lane_bytes(&rk->g) != gr->lane) {
			fprintf(stderr, "%s D %u I %u: bad geometry: %s\n", m->name, d, il, err);
			return -1;
		}
		rk->bytes = kvr_geometry_kv_extent(&rk->g);
		rk->kv = page_alloc(rk->bytes);
		rk->kv_ref = page_alloc(rk->bytes);
		if (!rk->kv || !rk->kv_ref)
			return -1;
		for (uint32_t b = 0; b < NB; b++)
			for (unsigned i = 0; i < m->regions; i++) {
				struct kvr_region reg = kvr_geometry_region(&rk->g, i);
				bf_rank_rows(rk->kv_ref + reg.offset + b * reg.stride,
					     truth + b * gr->lane + (uint64_t)i * BT * m->row, m->row, BT, d, il, r);
			}
		memcpy(rk->kv, rk->kv_ref, rk->bytes);
	}
	return 0;
}

static void group_close(struct group *gr)
{
	for (uint32_t r = 0; r < gr->d; r++) {
		free(gr->rk[r].kv);
		free(gr->rk[r].kv_ref);
	}
	free(gr->arena);
}

/* Warm up and check both directions byte-exact; 0 or -1. */
static int check(struct group *gr, const uint8_t *truth)
{
	for (int how = GATHER; how < N_MOVES; how++) {
		bool scatter = how == SCATTER || how == SCATTER_NT;
		memset(gr->arena, 0, gr->lane * NB);
		if (scatter) {
			memcpy(gr->arena, truth, gr->lane * NB);
			for (uint32_t r = 0; r < gr->d; r++)
				memset(gr->rk[r].kv, 0, gr->rk[r].bytes);
		}
		if (move(gr, how))
			return -1;
		if (!scatter && memcmp(gr->arena, truth, gr->lane * NB))
			return -1;
		for (uint32_t r = 0; r < gr->d; r++)
			if (memcmp(gr->rk[r].kv, gr->rk[r].kv_ref, gr->rk[r].bytes))
				return -1;
	}
	return 0;
}

int main(void)
{
	int bad = 0;
	uint64_t seed = 42;
	printf("DCP gather/scatter: block %u tokens, %u blocks a round, best of %u rounds, GB/s\n\n", BT, NB, REPS);
	printf("| model | D | I | run bytes | runs/block | MiB/round | memcpy | gather | scatter | gather/memcpy | "
	       "scatter/memcpy | gather nt | scatter nt | gather nt/memcpy | scatter nt/memcpy |\n");
	printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
	for (unsigned mi = 0; mi < sizeof(models) / sizeof(models[0]); mi++) {
		const struct model *m = &models[mi];
		uint64_t lane = (uint64_t)m->regions * BT * m->row;
		uint8_t *truth = malloc(lane * NB);
		if (!truth)
			return 2;
		for (uint64_t i = 0; i < lane * NB; i += 8) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			memcpy(truth + i, &seed, 8);
		}
		for (unsigned li = 0; li < sizeof(layouts) / sizeof(layouts[0]); li++) {
			struct group gr;
			uint32_t d = layouts[li][0], il = layouts[li][1];
			if (group_open(&gr, m, d, il, truth))
				return 2;
			if (check(&gr, truth)) {
				fprintf(stderr, "%s D %u I %u: gather or scatter is not byte-exact\n", m->name, d, il);
				bad = 1;
			}
			uint64_t t[1 + N_MOVES][REPS];
			for (int rep = 0; rep < REPS; rep++) {
				uint64_t t0 = kvr_now_ns();
				copy_all(&gr);
				t[0][rep] = kvr_now_ns() - t0;
				for (int how = GATHER; how < N_MOVES; how++) {
					t0 = kvr_now_ns();
					(void)move(&gr, how);
					t[1 + how][rep] = kvr_now_ns() - t0;
				}
			}
			double bytes = (double)lane * NB, g[1 + N_MOVES];
			for (int v = 0; v <= N_MOVES; v++)
				g[v] = bytes / (double)best(t[v]);
			printf("| %s | %u | %u | %u | %d | %.1f | %.2f | %.2f | %.2f | %.2fx | %.2fx | %.2f | %.2f | "
			       "%.2fx | "
			       "%.2fx |\n",
			       m->name, d, il, il * m->row, plan(&gr, 0) * (int)d, bytes / (1 << 20), g[0], g[1], g[2],
			       g[1] / g[0], g[2] / g[0], g[3], g[4], g[3] / g[0], g[4] / g[0]);
			fflush(stdout);
			group_close(&gr);
		}
		free(truth);
	}
	return bad;
}
