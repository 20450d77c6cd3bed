/* kvring-bench statistics: nearest-rank percentiles, means and throughput. */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Nearest rank: the smallest value with at least p% of the samples at or below it. */
static uint64_t rank_of(const uint64_t *sorted, size_t n, unsigned pct)
{
	size_t k = ((size_t)pct * n + 99) / 100;
	return sorted[k ? k - 1 : 0];
}

struct bench_dist bench_dist_of(uint64_t *v, size_t n)
{
	struct bench_dist d = {0};
	if (!n)
		return d;
	qsort(v, n, sizeof(*v), cmp_u64);
	long double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += v[i];
	d.n = n;
	d.mean = (double)(sum / n);
	d.p50 = rank_of(v, n, 50);
	d.p99 = rank_of(v, n, 99);
	d.max = v[n - 1];
	return d;
}

double bench_gbps(uint64_t bytes, uint64_t ns)
{
	return ns ? (double)bytes / (double)ns : 0.0;
}

