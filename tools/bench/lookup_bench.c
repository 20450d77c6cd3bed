/* kvring-lookup-bench: back-to-back lookups of one stored prompt — hashing, index work and the ring round trip. */
#include <kvring/kvring.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvr_geometry.h"

/*
 * Usage: kvring-lookup-bench --socket PATH [--model PRESET] [--tokens N] [--iterations N]
 * The instance must serve the preset at TP 1 with its block size (the defaults match
 * kvringd's embedded config: qwen3-8b, 128-token blocks). Stores one prompt of N tokens,
 * then looks it up N times in a row and prints p50/p99 of the client's hashing, the
 * lookup actor's index work and the round trip through the rings.
 */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void pct(const char *what, uint64_t *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	printf("  %-22s p50 %8.1f us   p99 %8.1f us\n", what, v[n / 2] / 1e3, v[n * 99 / 100] / 1e3);
}

int main(int argc, char **argv)
{
	const char *sock = NULL, *model = "qwen3-8b";
	unsigned tokens = 10000, iters = 2000, block_tokens = 128;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--socket"))
			sock = argv[i + 1];
		else if (!strcmp(argv[i], "--model"))
			model = argv[i + 1];
		else if (!strcmp(argv[i], "--tokens"))
			tokens = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--iterations"))
			iters = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--block-tokens"))
			block_tokens = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else
			goto usage;
	}
	if (argc % 2 == 0 || !tokens || !iters || !block_tokens || tokens / block_tokens == 0)
		goto usage;
	const struct kvr_preset *p = kvr_preset_find(model);
	if (!p) {
		fprintf(stderr, "kvring-lookup-bench: unknown model %s (one of: %s)\n", model, kvr_preset_list());
		return 2;
	}
	unsigned nb = tokens / block_tokens;
	struct kvr_geometry g;
	if (kvr_preset_geometry(p, 1, 0, block_tokens, nb, &g))
		return 2;
	uint64_t kv_bytes = kvr_geometry_kv_extent(&g);
	int fd = memfd_create("kvring-lookup-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)kv_bytes) < 0) {
		perror("kvring-lookup-bench: KV memory");
		return 1;
	}
	struct kvr_attach_opts o = {.socket = sock, .geometry = &g, .kv_fd = fd, .kv_bytes = kv_bytes,
				    .model_ns = p->hf_id ? p->hf_id : p->name}; /* required without a model section */
	struct kvr_client *c;
	int rc = kvr_attach(&o, &c);
	if (rc) {
		fprintf(stderr, "kvring-lookup-bench: %s\n", kvr_last_error(NULL));
		return 1;
	}
	uint32_t *tok = malloc(tokens * sizeof(*tok)), *blocks = malloc(nb * sizeof(*blocks));
	uint64_t *hash = malloc(iters * 8), *index = malloc(iters * 8), *rt = malloc(iters * 8);
	if (!tok || !blocks || !hash || !index || !rt)
		return 1;
	for (unsigned i = 0; i < tokens; i++)
		tok[i] = (i * 2654435761u) % 151936u;
	for (unsigned i = 0; i < nb; i++)
		blocks[i] = i;
	struct kvr_completion done;
	if ((rc = kvr_store(c, 1, tok, (size_t)nb * block_tokens, NULL, 0, blocks, nb)) ||
	    kvr_wait(c, &done, 1, 60000) != 1 || done.status) {
		fprintf(stderr, "kvring-lookup-bench: store failed: %s\n", rc ? kvr_last_error(c) : strerror(-done.status));
		return 1;
	}
	struct kvr_lookup_result r;
	for (unsigned i = 0; i < iters; i++) {
		if ((rc = kvr_lookup(c, 2 + i, tok, tokens, NULL, 0, &r))) {
			fprintf(stderr, "kvring-lookup-bench: lookup: %s\n", kvr_last_error(c));
			return 1;
		}
		hash[i] = r.hash_ns;
		index[i] = r.index_ns;
		rt[i] = r.roundtrip_ns;
	}
	printf("kvring-lookup-bench: %s, %u-token prompt = %u blocks of %u, %u lookups back to back, matched %u tokens\n",
	       model, tokens, nb, block_tokens, iters, r.matched_tokens);
	pct("client hashing", hash, iters);
	pct("lookup index work", index, iters);
	pct("ring round trip", rt, iters);
	kvr_detach(c);
	return r.matched_tokens == nb * block_tokens ? 0 : 1;
usage:
	fprintf(stderr, "usage: kvring-lookup-bench --socket PATH [--model PRESET] [--block-tokens N] [--tokens N] "
			"[--iterations N]\n");
	return 2;
}
