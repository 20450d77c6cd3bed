/* A client built only from an installed kvring (pkg-config kvring): test_install.sh compiles and runs it. */
#include <kvring/kvr_geometry.h>
#include <kvring/kvring.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

/*
 * Calls the API without a kvringd: an attach without options, a vLLM geometry built, sized
 * and validated, one region rewritten. Prints one line per check; exits 0 only when every
 * result is the one kvring.h and kvr_geometry.h promise.
 */
static struct kvr_geometry g; /* 18 KiB: not on the stack */

#define CHECK(cond, ...)                                   \
	do {                                               \
		if (!(cond)) {                             \
			fprintf(stderr, "FAIL: " __VA_ARGS__); \
			fputc('\n', stderr);               \
			return 1;                          \
		}                                          \
	} while (0)

int main(void)
{
	struct kvr_client *c = NULL;
	int rc = kvr_attach(NULL, &c);
	CHECK(rc == -EINVAL && !c, "kvr_attach(NULL) = %d", rc);
	CHECK(strstr(kvr_last_error(NULL), "attach:") != NULL, "kvr_last_error: \"%s\"", kvr_last_error(NULL));
	printf("attach: %s (%s)\n", strerror(-rc), kvr_last_error(NULL));

	/* 2 layers x K,V of 4 blocks; a page is 16 tokens x 1 head x 8 elements x 2 bytes */
	rc = kvr_geometry_fill_vllm_layer_major(&g, 2, 1, 8, 2, 16, 4);
	CHECK(rc == 0 && g.n_regions == 4, "fill_vllm_layer_major = %d, %u regions", rc, g.n_regions);
	uint64_t lane = kvr_geometry_lane_bytes(&g), extent = kvr_geometry_kv_extent(&g);
	CHECK(lane == 4 * 256 && extent == 4 * 4 * 256, "lane %llu, extent %llu", (unsigned long long)lane,
	      (unsigned long long)extent);
	printf("geometry: %u regions, lane %llu bytes, extent %llu bytes\n", g.n_regions, (unsigned long long)lane,
	       (unsigned long long)extent);

	char err[KVR_GEOM_ERR_MAX];
	rc = kvr_geometry_validate(&g, extent, err, sizeof(err));
	CHECK(rc == 0, "validate(extent) = %d: %s", rc, err);
	rc = kvr_geometry_validate(&g, extent - 1, err, sizeof(err));
	CHECK(rc == -EINVAL && strstr(err, "region 3") != NULL, "validate(extent - 1) = %d: %s", rc, err);
	printf("validate: ok at %llu bytes; at %llu: %s\n", (unsigned long long)extent,
	       (unsigned long long)(extent - 1), err);

	struct kvr_region r = { .offset = 1ull << 48, .stride = 256, .page_bytes = 256, .sem_bytes = 256 };
	rc = kvr_geometry_set_region(&g, 0, &r);
	CHECK(rc == -ERANGE, "set_region(offset 2^48) = %d", rc);
	printf("set_region: offset 2^48 refused (%s)\n", strerror(-rc));
	return 0;
}
