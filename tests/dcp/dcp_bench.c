/* dcp_bench: DCP gather (rank pages -> canonical) and scatter throughput against memcpy of the same bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_test.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_time.h"
#include "kvr_xfer.h"

/*
 * Per model and layout (D ranks, interleave I): each rank's KV memory holds NB blocks of
 * the model's vLLM layer-major pages for its block_tokens / D tokens; the arena holds NB
 * canonical lanes. One round:
 *   gather   every block of every rank: kvr_dcp_lane_runs() + the copies (kv -> slot)
 *   scatter  the same runs the other way (slot -> kv)
 *   memcpy   the same bytes between the same buffers: one memcpy per rank of its whole
 *            KV memory (the best case: no runs at all)
 * Copies go through kvr_copy_stream(), what the host backend uses for a submission of
 * >= 1 MiB. The three are interleaved REPS times; each figure is the median. The gather
 * result is checked byte-exact against the canonical block built by brute force (exit 1
 * otherwise). Throughput is bytes moved / time, GB/s = 1e9 bytes a second.
 */
#define NB 4
#define REPS 7
#define MAX_D 8

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
#define BT 128

struct rank {
	struct kvr_geometry g;
	uint8_t *kv;
	uint64_t bytes;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v)
{
	qsort(v, REPS, sizeof(*v), cmp_u64);
	return v[REPS / 2];
}

static void rank_geom(struct kvr_geometry *g, const struct model *m, uint32_t d, uint32_t il, uint32_t r)
{
	uint32_t n = BT / d;
	if (m->regions == 61) {
		(void)kvr_geometry_fill_vllm_mla(g, m->regions, m->row / 2, 2, n, NB);
	} else {
		(void)kvr_geometry_fill_vllm_layer_major(g, m->regions / 2, m->row / 256, 128, 2, n, NB);
		g->tp_size = 4;
	}
	g->block_tokens = BT;
	g->dcp_size = d;
	g->dcp_rank = r;
	g->dcp_interleave = il;
}

/* enough for any lane here: 160 regions x (128 / (2 x 1) + 1) runs */
static struct kvr_dcp_run runs[160 * (BT / 2 + 1)];
static const size_t max_runs = sizeof(runs) / sizeof(runs[0]);

int main(void)
{
	int bad = 0;
	uint64_t seed = 42;
	printf("DCP gather/scatter: block %u tokens, %u blocks a round, median of %u rounds, GB/s\n", BT, NB, REPS);
	printf("| model | D | I | run bytes | runs/block | MiB/round | memcpy | gather | scatter | gather/memcpy | "
	       "scatter/memcpy |\n");
	printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
	for (unsigned mi = 0; mi < sizeof(models) / sizeof(models[0]); mi++) {
		const struct model *m = &models[mi];
		uint64_t lane = (uint64_t)m->regions * BT * m->row;
		uint8_t *arena = malloc(lane * NB), *truth = malloc(lane * NB);
		if (!arena || !truth)
			return 2;
		for (uint64_t i = 0; i < lane * NB; i += 8) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			memcpy(truth + i, &seed, 8);
		}
		for (unsigned li = 0; li < sizeof(layouts) / sizeof(layouts[0]); li++) {
			uint32_t d = layouts[li][0], il = layouts[li][1];
			struct rank rk[MAX_D];
			char err[KVR_GEOM_ERR_MAX];
			uint64_t runs_per_block = 0;
			for (uint32_t r = 0; r < d; r++) {
				rank_geom(&rk[r].g, m, d, il, r);
				if (kvr_geometry_validate(&rk[r].g, kvr_geometry_kv_extent(&rk[r].g), err,
							  sizeof(err)) ||
				    kvr_dcp_canonical_lane_bytes(&rk[r].g) != lane) {
					fprintf(stderr, "%s D %u I %u: bad geometry: %s\n", m->name, d, il, err);
					return 2;
				}
				rk[r].bytes = kvr_geometry_kv_extent(&rk[r].g);
				rk[r].kv = malloc(rk[r].bytes);
				if (!rk[r].kv)
					return 2;
				/* each rank's pages: brute force from the truth */
				for (uint32_t b = 0; b < NB; b++)
					for (unsigned i = 0; i < m->regions; i++) {
						struct kvr_region reg = kvr_geometry_region(&rk[r].g, i);
						bf_rank_rows(rk[r].kv + reg.offset + b * reg.stride,
							     truth + b * lane + (uint64_t)i * BT * m->row, m->row, BT,
							     d, il, r);
					}
				size_t cap = kvr_dcp_lane_max_runs(&rk[r].g);
				int n = kvr_dcp_lane_runs(&rk[r].g, 0, 0, runs, cap, err, sizeof(err));
				if (n <= 0) {
					fprintf(stderr, "%s D %u I %u: runs: %s\n", m->name, d, il, err);
					return 2;
				}
				runs_per_block += (uint64_t)n;
			}
			uint64_t t_mem[REPS], t_gat[REPS], t_sca[REPS];
			for (int rep = -1; rep < REPS; rep++) { /* rep -1 warms up (faults the pages in) and checks */
				uint64_t t0 = kvr_now_ns();
				uint64_t off = 0;
				for (uint32_t r = 0; r < d; off += rk[r].bytes, r++)
					memcpy(arena + off, rk[r].kv, rk[r].bytes);
				uint64_t t1 = kvr_now_ns();
				memset(arena, 0, lane * NB); /* a gather that skips a run shows */
				uint64_t t2 = kvr_now_ns();
				for (uint32_t b = 0; b < NB; b++)
					for (uint32_t r = 0; r < d; r++) {
						int n = kvr_dcp_lane_runs(&rk[r].g, b, b * lane, runs, max_runs, NULL,
									  0);
						for (int k = 0; k < n; k++)
							kvr_copy_stream(arena + runs[k].slot_off,
									rk[r].kv + runs[k].kv_off, runs[k].len);
					}
				uint64_t t3 = kvr_now_ns();
				if (rep == -1 && memcmp(arena, truth, lane * NB)) {
					fprintf(stderr, "%s D %u I %u: gather is not the canonical block\n", m->name, d,
						il);
					bad = 1;
				}
				uint64_t t4 = kvr_now_ns();
				for (uint32_t b = 0; b < NB; b++)
					for (uint32_t r = 0; r < d; r++) {
						int n = kvr_dcp_lane_runs(&rk[r].g, b, b * lane, runs, max_runs, NULL,
									  0);
						for (int k = 0; k < n; k++)
							kvr_copy_stream(rk[r].kv + runs[k].kv_off,
									arena + runs[k].slot_off, runs[k].len);
					}
				uint64_t t5 = kvr_now_ns();
				if (rep >= 0) {
					t_mem[rep] = t1 - t0;
					t_gat[rep] = t3 - t2;
					t_sca[rep] = t5 - t4;
				}
			}
			double bytes = (double)lane * NB;
			double g_mem = bytes / (double)median(t_mem), g_gat = bytes / (double)median(t_gat),
			       g_sca = bytes / (double)median(t_sca);
			printf("| %s | %u | %u | %u | %llu | %.1f | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n", m->name, d,
			       il, il * m->row, (unsigned long long)runs_per_block, bytes / (1 << 20), g_mem, g_gat,
			       g_sca, g_gat / g_mem, g_sca / g_mem);
			fflush(stdout);
			for (uint32_t r = 0; r < d; r++)
				free(rk[r].kv);
		}
		free(arena);
		free(truth);
	}
	return bad;
}
