/* General geometry through the real kvringd: MLA at TP 4 end to end, bad geometry refused at attach with its reason. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kvring/kvring.h>

#include "../shm/shm_test.h"
#include "../supervisor/sup_harness.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_proto.h"
#include "kvr_slots.h"

static struct h_inst inst;

static void setup(void)
{
	h_init(&inst, 0700);
}

static void teardown(void)
{
	h_fini(&inst);
}

TestSuite(dcp_kvringd, .init = setup, .fini = teardown, .timeout = 60);

/* A config with an explicit model (no preset) and an arena of n_slots slots. */
static void write_config(const char *model_json, unsigned max_workers, uint64_t lane_bytes, unsigned n_slots)
{
	char json[4096];
	snprintf(json, sizeof(json),
		 "{\n"
		 "  \"instance\": {\"socket\": \"%s\", \"max_workers\": %u, \"log_level\": \"info\"},\n"
		 "  \"rings\": {\"capacity\": 64},\n"
		 "  \"supervisor\": {\"ready_timeout_ms\": 3000, \"stable_after_ms\": 1000,\n"
		 "    \"restart_backoff_initial_ms\": 20, \"restart_backoff_max_ms\": 200,\n"
		 "    \"crash_loop_window_s\": 10, \"crash_loop_max_deaths\": 5,\n"
		 "    \"health_interval_ms\": 1000, \"drain_timeout_ms\": 3000},\n"
		 "  \"model\": %s,\n"
		 "  \"l1\": {\"capacity_bytes\": %llu, \"huge_pages\": false, \"eviction\": \"lru\"},\n"
		 "  \"staging\": {\"ceiling_bytes\": %llu, \"load_percent\": 50}\n"
		 "}\n",
		 inst.sock, max_workers, model_json,
		 (unsigned long long)(KVR_SLOTS_ARENA_DATA_OFF + (uint64_t)n_slots * kvr_slots_slot_bytes(lane_bytes)),
		 (unsigned long long)(16 * lane_bytes));
	h_write_config_raw(&inst, json);
}

/* ---- MLA, TP 4: one rank stores, four look up and load -------------------------------- */

/* DeepSeek-V3's latent (kv_lora_rank 512 + rope 64, bf16: 1152-byte rows) on 4 layers
 * instead of 61, 16-token blocks. */
#define MLA_LAYERS 4
#define MLA_LATENT 576
#define MLA_BLOCK 16
#define MLA_TP 4
#define MLA_NB 8 /* engine blocks per rank */

struct rank {
	struct kvr_client *c;
	struct kvr_geometry g;
	int fd;
	uint8_t *kv;
	uint64_t bytes;
};

static struct rank ranks[MLA_TP];

static void rank_close(struct rank *r)
{
	kvr_detach(r->c);
	r->c = NULL;
	if (r->kv)
		munmap(r->kv, r->bytes);
	r->kv = NULL;
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

/* Runs before the suite's teardown (which stops kvringd). */
static void mla_teardown(void)
{
	for (unsigned i = 0; i < MLA_TP; i++)
		rank_close(&ranks[i]);
}

static uint8_t *page(const struct rank *r, unsigned region, uint32_t block)
{
	struct kvr_region g = kvr_geometry_region(&r->g, region);
	return r->kv + g.offset + (uint64_t)block * g.stride;
}

static void rank_open(struct rank *r, unsigned tp_rank)
{
	memset(r, 0, sizeof(*r));
	r->fd = -1;
	cr_assert_eq(kvr_geometry_fill_vllm_mla(&r->g, MLA_LAYERS, MLA_LATENT, 2, MLA_BLOCK, MLA_NB), 0);
	r->g.tp_size = MLA_TP;
	r->g.tp_rank = tp_rank;
	r->bytes = kvr_geometry_kv_extent(&r->g);
	r->fd = memfd_create("dcp-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert(r->fd >= 0);
	cr_assert_eq(ftruncate(r->fd, (off_t)r->bytes), 0);
	r->kv = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	cr_assert(r->kv != MAP_FAILED);
	memset(r->kv, 0xa5, r->bytes); /* canary: no load may touch a block it was not given */
	struct kvr_attach_opts o = {
		.socket = inst.sock, .geometry = &r->g, .kv_fd = r->fd, .kv_bytes = r->bytes, .timeout_ms = 5000};
	int rc = kvr_attach(&o, &r->c);
	cr_assert_eq(rc, 0, "rank %u attach: %d (%s); log:\n%s", tp_rank, rc, kvr_last_error(r->c),
		     h_read_file(inst.log));
}

static struct kvr_completion wait_one(struct rank *r, uint64_t req, uint32_t op)
{
	struct kvr_completion c;
	int n = kvr_wait(r->c, &c, 1, 5000);
	cr_assert_eq(n, 1, "no completion of request %llu: %d %s", (unsigned long long)req, n, kvr_last_error(r->c));
	cr_assert_eq(c.req_id, req);
	cr_assert_eq(c.op, op);
	return c;
}

Test(dcp_kvringd, mla_tp4_one_stores_four_load, .fini = mla_teardown)
{
	uint64_t lane = (uint64_t)MLA_LAYERS * MLA_BLOCK * MLA_LATENT * 2;
	char model[512];
	snprintf(model, sizeof(model),
		 "{\"preset\": \"\", \"model_id\": \"test/deepseek-v3-4-layers\", \"layers\": %u, \"kv_heads\": 1, "
		 "\"head_dim\": %u, \"dtype_bytes\": 2, \"block_tokens\": %u, \"tp_size\": %u, \"attention\": \"mla\"}",
		 MLA_LAYERS, MLA_LATENT, MLA_BLOCK, MLA_TP);
	write_config(model, MLA_TP, lane, 32);
	h_start(&inst);
	for (unsigned r = 0; r < MLA_TP; r++)
		rank_open(&ranks[r], r);

	struct rng rng = {test_seed("dcp_kvringd::mla_tp4_one_stores_four_load")};
	/* a 70-token prompt: 4 full blocks and 6 tokens that are never stored */
	uint32_t tokens[70], other[70];
	for (unsigned i = 0; i < 70; i++) {
		tokens[i] = rng_below(&rng, 150000);
		other[i] = tokens[i] ^ 1;
	}
	/* rank 2 stores its blocks 3, 0, 6, 1 (any rank may: every rank holds the latent) */
	struct rank *st = &ranks[2];
	const uint32_t src_blocks[4] = {3, 0, 6, 1};
	for (unsigned b = 0; b < 4; b++)
		for (unsigned l = 0; l < MLA_LAYERS; l++) {
			uint8_t *p = page(st, l, src_blocks[b]);
			for (uint32_t k = 0; k < st->g.page_bytes[l]; k++)
				p[k] = (uint8_t)rng_next(&rng);
		}
	uint8_t *stored = malloc(st->bytes);
	cr_assert(stored);
	memcpy(stored, st->kv, st->bytes);
	cr_assert_eq(kvr_store(st->c, 7, tokens, 70, NULL, 0, src_blocks, 4), 0, "%s", kvr_last_error(st->c));
	struct kvr_completion c = wait_one(st, 7, KVR_OP_STORE_DONE);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.n_blocks, 4);
	cr_assert_eq(c.n_stored, 4, "one lane for MLA: 4 new blocks");
	cr_assert_eq(c.n_present, 0);

	/* every rank sees the same 64 tokens, none of the other prompt */
	const uint32_t dst_blocks[MLA_TP][4] = {{4, 5, 2, 7}, {7, 6, 5, 4}, {2, 4, 5, 7}, {0, 1, 2, 3}};
	for (unsigned r = 0; r < MLA_TP; r++) {
		struct kvr_lookup_result res;
		cr_assert_eq(kvr_lookup(ranks[r].c, 100 + r, tokens, 70, NULL, 0, &res), 0, "%s",
			     kvr_last_error(ranks[r].c));
		cr_assert_eq(res.matched_tokens, 64, "rank %u matched %u tokens", r, res.matched_tokens);
		cr_assert_eq(res.matched_blocks, 4);
		cr_assert_eq(kvr_lookup(ranks[r].c, 200 + r, other, 70, NULL, 0, &res), 0);
		cr_assert_eq(res.matched_tokens, 0, "rank %u: another prompt matched %u tokens", r, res.matched_tokens);
	}
	/* all four load at once, then each checks its bytes */
	for (unsigned r = 0; r < MLA_TP; r++)
		cr_assert_eq(kvr_load(ranks[r].c, 100 + r, dst_blocks[r], 4), 0, "rank %u: %s", r,
			     kvr_last_error(ranks[r].c));
	for (unsigned r = 0; r < MLA_TP; r++) {
		c = wait_one(&ranks[r], 100 + r, KVR_OP_LOAD_DONE);
		cr_assert_eq(c.status, 0, "rank %u load: %d", r, c.status);
		cr_assert_eq(c.n_failed, 0);
		cr_assert_eq(c.diag.bytes, 4 * lane, "rank %u moved %llu bytes", r, (unsigned long long)c.diag.bytes);
	}
	for (unsigned r = 0; r < MLA_TP; r++) {
		struct rank *rk = &ranks[r];
		for (uint32_t b = 0; b < MLA_NB; b++) {
			int j = -1; /* which stored block went to b */
			for (int k = 0; k < 4; k++)
				if (dst_blocks[r][k] == b)
					j = k;
			for (unsigned l = 0; l < MLA_LAYERS; l++) {
				const uint8_t *got = page(rk, l, b);
				uint32_t n = rk->g.page_bytes[l];
				if (j >= 0) {
					const uint8_t *want = stored + (page(st, l, src_blocks[j]) - st->kv);
					cr_assert_eq(memcmp(got, want, n), 0,
						     "rank %u block %u layer %u: not the stored bytes", r, b, l);
				} else if (rk == st) {
					cr_assert_eq(memcmp(got, stored + (got - rk->kv), n), 0,
						     "rank %u block %u layer %u: touched", r, b, l);
				} else {
					for (uint32_t k = 0; k < n; k++)
						cr_assert_eq(got[k], 0xa5, "rank %u block %u layer %u byte %u: touched",
							     r, b, l, k);
				}
			}
		}
	}
	free(stored);
}

/* ---- bad geometry at attach ----------------------------------------------------------- */

/* Attach with geometry g over a fresh memfd of kv_bytes; the reply in *ret_rep. The
 * connection stays open in *ret_sock when the attach was accepted (closed otherwise). */
static void raw_attach(const struct kvr_geometry *g, uint64_t kv_bytes, struct kvr_proto_rep *ret_rep, int *ret_sock)
{
	int kv = memfd_create("dcp-bad", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert(kv >= 0);
	cr_assert_eq(ftruncate(kv, (off_t)kv_bytes), 0);
	int s = kvr_proto_connect(inst.sock);
	cr_assert(s >= 0, "connect %s: %s", inst.sock, strerror(-s));
	struct kvr_proto_req req = {
		.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_ATTACH, .payload_len = sizeof(*g)};
	memcpy(req.payload, g, sizeof(*g));
	(void)kvr_proto_send(s, &req, offsetof(struct kvr_proto_req, payload) + sizeof(*g), &kv, 1);
	close(kv);
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds = 0;
	memset(ret_rep, 0, sizeof(*ret_rep));
	ssize_t n = kvr_proto_recv(s, ret_rep, sizeof(*ret_rep), fds, KVR_PROTO_MAX_FDS, &n_fds);
	cr_assert_gt(n, 0, "no attach reply");
	cr_assert_eq(ret_rep->magic, KVR_PROTO_MAGIC);
	for (unsigned i = 0; i < n_fds; i++)
		close(fds[i]);
	if (ret_rep->status) {
		close(s);
		s = -1;
	}
	*ret_sock = s;
}

/* The instance: MHA, 2 layers, 4 KV heads of 64 bf16 over TP 2 (2 a rank), 16-token blocks. */
static struct kvr_geometry mha_rank(uint32_t rank)
{
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 2, 2, 64, 2, 16, 4), 0);
	g.tp_size = 2;
	g.tp_rank = rank;
	return g;
}

static void expect_refused(const struct kvr_geometry *g, uint64_t kv_bytes, int status, const char *reason)
{
	struct kvr_proto_rep rep;
	int s;
	raw_attach(g, kv_bytes, &rep, &s);
	cr_assert_eq(rep.status, status, "status %d (%s), expected %d", rep.status, rep.reason, status);
	cr_assert_str_eq(rep.reason, reason);
	cr_assert_eq(s, -1);
}

Test(dcp_kvringd, bad_geometry_refused_with_reason)
{
	uint64_t lane = 2ull * 2 * 16 * 2 * 64 * 2; /* layers x (K, V) x tokens x heads x dim x bf16 = 16384 */
	write_config("{\"preset\": \"\", \"model_id\": \"test/mha\", \"layers\": 2, \"kv_heads\": 4, \"head_dim\": 64, "
		     "\"dtype_bytes\": 2, \"block_tokens\": 16, \"tp_size\": 2}",
		     4, lane, 16);
	h_start(&inst);

	/* page bigger than its stride: consecutive blocks would overlap */
	struct kvr_geometry g = mha_rank(0);
	struct kvr_region r = kvr_geometry_region(&g, 1);
	r.page_bytes = (uint32_t)r.stride + 64;
	r.sem_bytes = (uint32_t)r.stride;
	cr_assert_eq(kvr_geometry_set_region(&g, 1, &r), 0);
	expect_refused(&g, kvr_geometry_kv_extent(&g) + 4096, -EINVAL,
		       "geometry: region 1 (layer 0 V): page_bytes 4160 > stride 4096");

	/* zero layers */
	g = mha_rank(0);
	g.layers = 0;
	expect_refused(&g, kvr_geometry_kv_extent(&g), -EINVAL, "geometry: layers: must be > 0");

	/* a page that ends past the KV memory it came with */
	g = mha_rank(0);
	expect_refused(&g, kvr_geometry_kv_extent(&g) - 1, -EINVAL,
		       "geometry: region 3 (layer 1 V): block 3 ends at 65536 > kv_bytes 65535");

	/* ranks of one group that disagree: a rank of a TP 4 group in a TP 2 instance */
	g = mha_rank(1);
	g.tp_size = 4;
	g.kv_heads = 1;
	expect_refused(&g, kvr_geometry_kv_extent(&g), -EINVAL,
		       "geometry mismatch: tp_size 4, the instance serves 2 (model.tp_size)");
	/* ... a rank whose heads differ from its group's */
	struct kvr_geometry h;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&h, 2, 1, 64, 2, 16, 4), 0);
	h.tp_size = 2;
	h.tp_rank = 1;
	expect_refused(&h, kvr_geometry_kv_extent(&h), -EINVAL,
		       "geometry mismatch: kv_heads 1, the instance serves 2 (model.kv_heads per rank)");
	/* ... a block size other than the group's */
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&h, 2, 2, 64, 2, 32, 4), 0);
	h.tp_size = 2;
	expect_refused(&h, kvr_geometry_kv_extent(&h), -EINVAL,
		       "geometry mismatch: block_tokens 32, the instance serves 16 (model.block_tokens)");
	/* ... and the same rank twice */
	struct kvr_proto_rep rep;
	int s1, s0;
	g = mha_rank(1);
	raw_attach(&g, kvr_geometry_kv_extent(&g), &rep, &s1);
	cr_assert_eq(rep.status, 0, "%s", rep.reason);
	unsigned w1 = rep.worker;
	char want[KVR_PROTO_REASON_MAX];
	snprintf(want, sizeof(want), "TP rank 1 (DCP rank 0) is already attached (worker slot %u, pid %d)", w1,
		 (int)getpid());
	expect_refused(&g, kvr_geometry_kv_extent(&g), -EEXIST, want);

	/* DCP: a layout whose ranks would hold different tokens of different blocks */
	g = mha_rank(0);
	g.dcp_size = 2;
	g.dcp_interleave = 16;
	expect_refused(&g, kvr_geometry_kv_extent(&g), -EINVAL,
		       "geometry: dcp: block_tokens 16 is not a multiple of dcp_size 2 x dcp_interleave 16 = 32 (in "
		       "block 0 rank 0 would hold 16 tokens, rank 1 0)");
	/* a valid DCP shard (8 of the 16 tokens a page) is refused rather than stored as if it
	 * were the whole block (seed 003: rank 0's shard alone): the gather stage is not wired */
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&h, 2, 2, 64, 2, 8, 4), 0);
	h.block_tokens = 16;
	h.tp_size = 2;
	h.dcp_size = 2;
	h.dcp_rank = 1;
	char err[KVR_GEOM_ERR_MAX];
	cr_assert_eq(kvr_geometry_validate(&h, kvr_geometry_kv_extent(&h), err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvr_dcp_canonical_lane_bytes(&h), lane, "its canonical lane is the instance's");
	expect_refused(&h, kvr_geometry_kv_extent(&h), -EINVAL,
		       "geometry mismatch: 8192 bytes per block on this rank, the instance's slots hold 16384");

	/* the refusals left nothing behind: rank 0 attaches next to rank 1 */
	g = mha_rank(0);
	raw_attach(&g, kvr_geometry_kv_extent(&g), &rep, &s0);
	cr_assert_eq(rep.status, 0, "%s", rep.reason);
	cr_assert_neq(rep.worker, w1);
	unsigned attached = 0;
	for (unsigned i = 0; i < 4; i++)
		if (atomic_load(&kvr_ctl_worker(inst.ctl, i)->state) == KVR_WORKER_ATTACHED)
			attached++;
	cr_assert_eq(attached, 2);
	close(s0);
	close(s1);
}
