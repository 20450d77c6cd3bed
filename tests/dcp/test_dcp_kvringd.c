/* General geometry through the real kvringd: MLA at TP 4 end to end, bad geometry refused at attach with its reason. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kvring/kvring.h>

#include "../ipc/ipc_test.h"
#include "../supervisor/sup_harness.h"
#include "../../supervisor/sup.h"
#include "kvr_dcp.h"
#include "kvr_geometry.h"
#include "kvr_list.h"
#include "kvr_keys.h"
#include "kvr_proto.h"
#include "kvr_ring_names.h"
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

/* A config with a model (explicit or a preset) and an arena of n_slots slots; DCP stores
 * wait dcp_timeout_ms for every rank of their group. */
static const char *config_l2 = ""; /* a test's ",\n  \"l2\": {...}" section, or none */

static void write_config_dcp(const char *model_json, unsigned max_workers, uint64_t lane_bytes, unsigned n_slots,
			     unsigned dcp_timeout_ms)
{
	char sections[2048];
	snprintf(sections, sizeof(sections),
		 ",\n  \"model\": %s,\n"
		 "  \"l1\": {\"capacity_bytes\": %llu, \"huge_pages\": false, \"eviction\": \"lru\"},\n"
		 "  \"staging\": {\"ceiling_bytes\": %llu, \"load_percent\": 50},\n"
		 "  \"dcp\": {\"store_timeout_ms\": %u}%s",
		 model_json,
		 (unsigned long long)(KVR_SLOTS_ARENA_DATA_OFF + (uint64_t)n_slots * kvr_slots_slot_bytes(lane_bytes)),
		 (unsigned long long)(16 * lane_bytes), dcp_timeout_ms, config_l2);
	h_write_config_with(&inst, NULL, max_workers, H_SUP_DATA, sections);
}

static void write_config(const char *model_json, unsigned max_workers, uint64_t lane_bytes, unsigned n_slots)
{
	write_config_dcp(model_json, max_workers, lane_bytes, n_slots, 10000);
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
	snprintf(want, sizeof(want), "engine \"default\": TP rank 1 (DCP rank 0) is already attached (worker slot %u, pid %d)", w1,
		 (int)getpid());
	expect_refused(&g, kvr_geometry_kv_extent(&g), -EEXIST, want);

	/* DCP: a layout whose ranks would hold different tokens of different blocks */
	g = mha_rank(0);
	g.dcp_size = 2;
	g.dcp_interleave = 16;
	expect_refused(&g, kvr_geometry_kv_extent(&g), -EINVAL,
		       "geometry: dcp: block_tokens 16 is not a multiple of dcp_size 2 x dcp_interleave 16 = 32 (in "
		       "block 0 rank 0 would hold 16 tokens, rank 1 0)");
	/* DCP ranks: a group is dcp_size consecutive TP ranks (TP rank 0 is DCP rank 0) */
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&h, 2, 2, 64, 2, 8, 4), 0);
	h.block_tokens = 16;
	h.tp_size = 2;
	h.dcp_size = 2;
	h.dcp_rank = 1;
	char err[KVR_GEOM_ERR_MAX];
	cr_assert_eq(kvr_geometry_validate(&h, kvr_geometry_kv_extent(&h), err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvr_dcp_canonical_lane_bytes(&h), lane, "its canonical lane is the instance's");
	expect_refused(&h, kvr_geometry_kv_extent(&h), -EINVAL,
		       "geometry: dcp_rank: 1, but TP rank 0 is DCP rank 0 of its group (dcp_rank = tp_rank mod dcp_size "
		       "2)");
	/* a DCP 2 group of a TP 2 engine stores one lane of all 4 heads: not this model */
	h.dcp_rank = 0;
	expect_refused(&h, kvr_geometry_kv_extent(&h), -EINVAL,
		       "geometry mismatch: tp_size 1, the instance serves 2 (model.tp_size)");

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

/* ---- DCP through the gather actor ------------------------------------------------------ */

/*
 * A DCP rank's engine block holds its share of one canonical block: block_tokens / D rows
 * (local token j is global token kvr_dcp_global_token(j, D, I, rank)), then an optional
 * per-token tail. Content is a function of (prompt block, layer, global token, byte) for
 * rows and of (prompt block, layer, rank's layout, byte) for tails, so any rank under any
 * layout knows exactly what its pages must hold after a load.
 */
#define G_BLOCK 16   /* canonical block tokens */
#define G_NB 12      /* engine blocks per rank */
#define G_TP 4
#define G_PROMPT 3   /* full blocks stored */

struct grank {
	struct kvr_client *c;
	struct kvr_geometry g;
	int fd;
	uint8_t *kv;
	uint64_t bytes;
	int rc;
	char err[256];
	const char *engine_id; /* NULL: the default engine */
};

static struct grank granks[G_TP];
static unsigned gather_of_rank(const struct grank *r);

struct glayout {
	unsigned layers;
	uint32_t head_dim;       /* elements of one token's row (MLA: the latent record) */
	uint32_t dtype;          /* bytes per element */
	uint32_t tail_per_token; /* opaque tail bytes per token of a page */
	unsigned block;          /* canonical block tokens */
	uint32_t row;            /* bytes of one token's row in one region: head_dim x dtype
				  * (MHA: x kv_heads) */
	uint32_t kv_heads;       /* 0: MLA (one latent region a layer); else MHA/GQA with this
				  * many KV heads a lane (K and V regions a layer) */
};

static void grank_close(struct grank *r)
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

/* grank_close on a thread of its own: the detach is fenced (it returns once the rank's
 * loader and its group's gather actor exited), and these tests hold one of them stopped
 * while the rank leaves. Join with pthread_join. */
static void *close_thread(void *arg)
{
	grank_close(arg);
	return NULL;
}

static void granks_close(void)
{
	for (unsigned i = 0; i < G_TP; i++)
		grank_close(&granks[i]);
}

/* Detach every rank and wait until kvringd freed their worker slots (their actors, and
 * the gather actors of their groups, exited), so the next layout's ranks find room. */
static void granks_detach_all(void)
{
	granks_close();
	bool all_free = H_WAIT(({
		bool f = true;
		for (unsigned i = 0; i < inst.ctl->max_workers; i++)
			f &= atomic_load(&kvr_ctl_worker(inst.ctl, i)->state) == KVR_WORKER_FREE;
		f;
	}), 10000);
	cr_assert(all_free, "worker slots not freed after detach; log:\n%s", h_read_file(inst.log));
}

/* Rank tp_rank of TP 4 under (D, I): vLLM's MLA or MHA layout with pages of lay.block / D
 * tokens, each followed by its tail. */
static void grank_geometry(struct grank *r, const struct glayout *lay, unsigned tp_rank, unsigned d, unsigned il)
{
	uint32_t rt = lay->block / d;
	struct kvr_geometry *g = &r->g;
	if (lay->kv_heads)
		cr_assert_eq(kvr_geometry_fill_vllm_layer_major(g, lay->layers, lay->kv_heads, lay->head_dim, lay->dtype, rt,
								G_NB), 0);
	else
		cr_assert_eq(kvr_geometry_fill_vllm_mla(g, lay->layers, lay->head_dim, lay->dtype, rt, G_NB), 0);
	g->block_tokens = lay->block;
	g->tp_size = G_TP;
	g->tp_rank = tp_rank;
	g->dcp_size = d;
	g->dcp_rank = tp_rank % d;
	g->dcp_interleave = il;
	uint64_t page = (uint64_t)rt * (lay->row + lay->tail_per_token);
	for (unsigned l = 0; l < g->n_regions; l++) {
		struct kvr_region reg = {.offset = (uint64_t)l * G_NB * page, .stride = page, .page_bytes = (uint32_t)page,
					 .sem_bytes = rt * lay->row};
		cr_assert_eq(kvr_geometry_set_region(g, l, &reg), 0);
	}
}

/* Rank tp_rank's geometry under (D, I) and its KV memory (a memfd, every byte the 0xa5
 * canary: no load may touch a block it was not given); not attached yet. */
static void grank_prepare(struct grank *r, const struct glayout *lay, unsigned tp_rank, unsigned d, unsigned il)
{
	memset(r, 0, sizeof(*r));
	grank_geometry(r, lay, tp_rank, d, il);
	r->bytes = kvr_geometry_kv_extent(&r->g);
	r->fd = memfd_create("dcp-gather-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert(r->fd >= 0);
	cr_assert_eq(ftruncate(r->fd, (off_t)r->bytes), 0);
	r->kv = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	cr_assert(r->kv != MAP_FAILED);
	memset(r->kv, 0xa5, r->bytes);
}

static void *attach_thread(void *arg)
{
	struct grank *r = arg;
	struct kvr_attach_opts o = {.socket = inst.sock, .geometry = &r->g, .kv_fd = r->fd, .kv_bytes = r->bytes,
				    .timeout_ms = 8000, .engine_id = r->engine_id};
	r->rc = kvr_attach(&o, &r->c);
	if (r->rc)
		snprintf(r->err, sizeof(r->err), "%s", kvr_last_error(NULL));
	return NULL;
}

/* Attach all four ranks of TP 4 under (D, I) at once: a DCP rank's attach returns when
 * its whole group is there (the gather actor then serves it). */
static void granks_open_engine(const struct glayout *lay, unsigned d, unsigned il, const char *engine_id)
{
	pthread_t t[G_TP];
	for (unsigned i = 0; i < G_TP; i++) {
		grank_prepare(&granks[i], lay, i, d, il);
		granks[i].engine_id = engine_id;
		cr_assert_eq(pthread_create(&t[i], NULL, attach_thread, &granks[i]), 0);
	}
	for (unsigned i = 0; i < G_TP; i++)
		pthread_join(t[i], NULL);
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(granks[i].rc, 0, "rank %u (dcp %u/%u) attach: %d %s; log:\n%s", i, i % d, d, granks[i].rc,
			     granks[i].err, h_read_file(inst.log));
}

static void granks_open(const struct glayout *lay, unsigned d, unsigned il)
{
	granks_open_engine(lay, d, il, NULL);
}

static uint8_t row_byte(uint64_t seed, unsigned b, unsigned l, uint64_t t, uint32_t k)
{
	uint64_t x = seed ^ ((uint64_t)b << 48) ^ ((uint64_t)l << 40) ^ (t << 20) ^ k;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 29;
	return (uint8_t)x;
}

static uint8_t tail_byte(uint64_t seed, unsigned b, unsigned l, const struct kvr_geometry *g, uint32_t k)
{
	return row_byte(~seed, b, l, ((uint64_t)g->dcp_size << 8 | g->dcp_interleave) << 5 | g->dcp_rank, k);
}

static uint8_t *gpage(const struct grank *r, unsigned l, uint32_t block)
{
	struct kvr_region g = kvr_geometry_region(&r->g, l);
	return r->kv + g.offset + (uint64_t)block * g.stride;
}

/* Write prompt block b into engine block `block` of rank r: its tokens' rows, its tail. */
static void gfill(struct grank *r, const struct glayout *lay, uint64_t seed, unsigned b, uint32_t block)
{
	const struct kvr_geometry *g = &r->g;
	uint32_t rt = lay->block / g->dcp_size;
	for (unsigned l = 0; l < g->n_regions; l++) {
		uint8_t *p = gpage(r, l, block);
		for (uint32_t j = 0; j < rt; j++) {
			uint64_t t = kvr_dcp_global_token(j, g->dcp_size, g->dcp_interleave, g->dcp_rank);
			for (uint32_t k = 0; k < lay->row; k++)
				p[j * lay->row + k] = row_byte(seed, b, l, t, k);
		}
		for (uint32_t k = 0; k < rt * lay->tail_per_token; k++)
			p[rt * lay->row + k] = tail_byte(seed, b, l, g, k);
	}
}

/* Whether engine block `block` of rank r holds prompt block b exactly (rows and, when
 * `tails`, the tail written under the same layout); names the first wrong byte. */
static void gcheck(const struct grank *r, const struct glayout *lay, uint64_t seed, unsigned b, uint32_t block)
{
	const struct kvr_geometry *g = &r->g;
	uint32_t rt = lay->block / g->dcp_size;
	for (unsigned l = 0; l < g->n_regions; l++) {
		const uint8_t *p = gpage(r, l, block);
		for (uint32_t j = 0; j < rt; j++) {
			uint64_t t = kvr_dcp_global_token(j, g->dcp_size, g->dcp_interleave, g->dcp_rank);
			for (uint32_t k = 0; k < lay->row; k++)
				if (p[j * lay->row + k] != row_byte(seed, b, l, t, k))
					cr_assert_fail("TP rank %u (DCP %u/%u, I %u) block %u layer %u: local token %u (global %llu) "
						 "byte %u is %02x, stored %02x", g->tp_rank, g->dcp_rank, g->dcp_size,
						 g->dcp_interleave, block, l, j, (unsigned long long)t, k,
						 p[j * lay->row + k], row_byte(seed, b, l, t, k));
		}
		for (uint32_t k = 0; k < rt * lay->tail_per_token; k++)
			if (p[rt * lay->row + k] != tail_byte(seed, b, l, g, k))
				cr_assert_fail("TP rank %u (DCP %u/%u) block %u layer %u: tail byte %u differs (seed 002: a page "
					 "tail must round-trip)", g->tp_rank, g->dcp_rank, g->dcp_size, block, l, k);
	}
}

/* Engine block `block` of rank r was not written by any load: still the canary. */
static void gcheck_canary(const struct grank *r, const struct glayout *lay, uint32_t block)
{
	(void)lay;
	for (unsigned l = 0; l < r->g.n_regions; l++) {
		const uint8_t *p = gpage(r, l, block);
		for (uint32_t k = 0; k < r->g.page_bytes[l]; k++)
			if (p[k] != 0xa5)
				cr_assert_fail("TP rank %u block %u layer %u byte %u: touched", r->g.tp_rank, block, l, k);
	}
}

static struct kvr_completion gwait(struct grank *r, uint64_t req, uint32_t op)
{
	struct kvr_completion c;
	int n = kvr_wait(r->c, &c, 1, 8000);
	cr_assert_eq(n, 1, "rank %u: no completion of request %llu: %d %s", r->g.tp_rank, (unsigned long long)req, n,
		     kvr_last_error(r->c));
	cr_assert_eq(c.req_id, req);
	cr_assert_eq(c.op, op);
	return c;
}

/* Every rank stores the prompt from its engine blocks src[rank][0..G_PROMPT). Returns
 * the blocks stored over all groups (the other groups of an MLA engine find them present). */
static unsigned gstore_all(const struct glayout *lay, uint64_t seed, const uint32_t *tokens, size_t n_tokens,
			   const uint32_t src[G_TP][G_PROMPT], uint64_t req)
{
	for (unsigned i = 0; i < G_TP; i++)
		for (unsigned b = 0; b < G_PROMPT; b++)
			gfill(&granks[i], lay, seed, b, src[i][b]);
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(kvr_store(granks[i].c, req, tokens, n_tokens, NULL, 0, src[i], G_PROMPT), 0, "rank %u: %s", i,
			     kvr_last_error(granks[i].c));
	unsigned stored = 0, per_group[G_TP] = {0};
	for (unsigned i = 0; i < G_TP; i++) {
		struct kvr_completion c = gwait(&granks[i], req, KVR_OP_STORE_DONE);
		cr_assert_eq(c.status, 0, "rank %u store: %d", i, c.status);
		cr_assert_eq(c.n_blocks, G_PROMPT);
		cr_assert_eq(c.n_failed, 0);
		cr_assert_eq(c.n_stored + c.n_present, G_PROMPT, "rank %u: %u stored + %u present", i, c.n_stored,
			     c.n_present);
		unsigned grp = i / granks[i].g.dcp_size;
		if (granks[i].g.dcp_rank == 0) {
			stored += c.n_stored;
			per_group[grp] = c.n_stored;
		} else {
			cr_assert_eq(c.n_stored, per_group[grp], "ranks of one group report one store");
		}
	}
	return stored;
}

/* Every rank looks the prompt up (all G_PROMPT blocks) and loads it into dst[rank]. */
static void gload_all(const struct glayout *lay, uint64_t seed, const uint32_t *tokens, size_t n_tokens,
		      const uint32_t dst[G_TP][G_PROMPT], uint64_t req)
{
	for (unsigned i = 0; i < G_TP; i++) {
		struct kvr_lookup_result res;
		cr_assert_eq(kvr_lookup(granks[i].c, req, tokens, n_tokens, NULL, 0, &res), 0, "%s",
			     kvr_last_error(granks[i].c));
		cr_assert_eq(res.matched_blocks, G_PROMPT, "rank %u (DCP %u/%u) matched %u blocks", i,
			     granks[i].g.dcp_rank, granks[i].g.dcp_size, res.matched_blocks);
		cr_assert_eq(kvr_load(granks[i].c, req, dst[i], G_PROMPT), 0, "rank %u: %s", i, kvr_last_error(granks[i].c));
	}
	for (unsigned i = 0; i < G_TP; i++) {
		struct kvr_completion c = gwait(&granks[i], req, KVR_OP_LOAD_DONE);
		cr_assert_eq(c.status, 0, "rank %u load: %d", i, c.status);
		cr_assert_eq(c.n_failed, 0);
		cr_assert_eq(c.diag.bytes, (uint64_t)G_PROMPT * kvr_geometry_lane_bytes(&granks[i].g),
			     "rank %u moved %llu bytes: exactly its pages", i, (unsigned long long)c.diag.bytes);
	}
	for (unsigned i = 0; i < G_TP; i++)
		for (uint32_t blk = 0; blk < G_NB; blk++) {
			int j = -1;
			for (int k = 0; k < G_PROMPT; k++)
				if (dst[i][k] == blk)
					j = k;
			if (j >= 0)
				gcheck(&granks[i], lay, seed, (unsigned)j, blk);
			else
				gcheck_canary(&granks[i], lay, blk);
		}
}

static unsigned glookup_blocks(struct grank *r, const uint32_t *tokens, size_t n_tokens, uint64_t req)
{
	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lookup(r->c, req, tokens, n_tokens, NULL, 0, &res), 0, "%s", kvr_last_error(r->c));
	return res.matched_blocks;
}

/* The test's seed (printed) -> a content seed, and n random prompt tokens. */
static uint64_t gprompt(const char *test, uint32_t *tokens, size_t n)
{
	struct rng rng = {test_seed(test)};
	uint64_t seed = rng_next(&rng);
	for (size_t i = 0; i < n; i++)
		tokens[i] = rng_below(&rng, 150000);
	return seed;
}

/* An MLA model with odd 561-byte rows (fp8), 3 layers, TP 4, 16-token blocks. */
static const struct glayout odd_rows = {.layers = 3, .head_dim = 561, .dtype = 1, .block = G_BLOCK, .row = 561};

static void gconfig(const struct glayout *lay, unsigned dcp_timeout_ms)
{
	char model[512];
	snprintf(model, sizeof(model),
		 "{\"preset\": \"\", \"model_id\": \"test/mla-561\", \"layers\": %u, \"kv_heads\": 1, "
		 "\"head_dim\": %u, \"dtype_bytes\": 1, \"block_tokens\": %u, \"tp_size\": %u, \"attention\": \"mla\"}",
		 lay->layers, lay->head_dim, lay->block, G_TP);
	write_config_dcp(model, 8, (uint64_t)lay->layers * lay->block * lay->row, 32, dcp_timeout_ms);
}

/* Store under DCP 2 (TP 4: two groups of two ranks), load under DCP 4 with interleave 2,
 * under DCP 1 and under DCP 2 with interleave 8: byte-exact, nothing else written. */
Test(dcp_kvringd, cross_layout_dcp2_to_dcp4_and_dcp1, .fini = granks_close)
{
	gconfig(&odd_rows, 10000);
	h_start(&inst);
	uint32_t tokens[G_PROMPT * G_BLOCK + 5];
	uint64_t seed = gprompt("dcp_kvringd::cross_layout_dcp2_to_dcp4_and_dcp1", tokens,
				 sizeof(tokens) / sizeof(tokens[0]));
	const size_t nt = sizeof(tokens) / sizeof(tokens[0]);

	granks_open(&odd_rows, 2, 1);
	/* a DCP rank stores through its group's gather actor and loads through its own loader */
	for (unsigned i = 0; i < G_TP; i++) {
		unsigned w = kvr_worker_slot(granks[i].c);
		cr_assert_eq(atomic_load(&kvr_ctl_actor(inst.ctl, SUP_ACTOR_STORER(w))->state), KVR_ACTOR_IDLE,
			     "a DCP rank has no storer of its own");
		cr_assert_eq(atomic_load(&kvr_ctl_actor(inst.ctl, SUP_ACTOR_LOADER(w))->state), KVR_ACTOR_READY);
	}
	cr_assert_eq(kvr_rank_tokens(granks[1].c, nt), 26, "DCP rank 1 of 2 holds 26 of the 53 tokens (8+8+8+2)");
	cr_assert_eq(kvr_rank_tokens(granks[0].c, nt), 27);
	const uint32_t src[G_TP][G_PROMPT] = {{5, 0, 9}, {1, 7, 3}, {2, 11, 4}, {8, 6, 10}};
	cr_assert_eq(gstore_all(&odd_rows, seed, tokens, nt, src, 1), G_PROMPT,
		     "MLA: one group stores each block, the other finds it present");
	/* the same layout loads it back too */
	const uint32_t back[G_TP][G_PROMPT] = {{3, 4, 8}, {0, 2, 5}, {9, 1, 7}, {11, 10, 0}};
	for (unsigned i = 0; i < G_TP; i++)
		memset(granks[i].kv, 0xa5, granks[i].bytes);
	gload_all(&odd_rows, seed, tokens, nt, back, 2);
	granks_detach_all();

	/* DCP 4, interleave 2: one group of four */
	granks_open(&odd_rows, 4, 2);
	const uint32_t dst4[G_TP][G_PROMPT] = {{7, 8, 9}, {0, 1, 2}, {11, 3, 6}, {4, 10, 5}};
	gload_all(&odd_rows, seed, tokens, nt, dst4, 3);
	granks_detach_all();

	/* DCP 1: every rank holds every token */
	granks_open(&odd_rows, 1, 1);
	const uint32_t dst1[G_TP][G_PROMPT] = {{0, 1, 2}, {11, 10, 9}, {6, 4, 5}, {3, 8, 7}};
	gload_all(&odd_rows, seed, tokens, nt, dst1, 4);
	granks_detach_all();

	/* and DCP 2 with interleave 8 */
	granks_open(&odd_rows, 2, 8);
	gload_all(&odd_rows, seed, tokens, nt, dst1, 5);
}

/* Start kvringd for odd_rows (DCP stores wait timeout_ms), draw a prompt of G_PROMPT
 * full blocks into tokens, attach TP 4 under (D, I) and write prompt block b into engine
 * block src[b] of every rank. Returns the content seed. */
static uint64_t gsetup(const char *test, unsigned timeout_ms, unsigned d, unsigned il, uint32_t *tokens,
		       const uint32_t src[G_PROMPT])
{
	gconfig(&odd_rows, timeout_ms);
	h_start(&inst);
	uint64_t seed = gprompt(test, tokens, G_PROMPT * G_BLOCK);
	granks_open(&odd_rows, d, il);
	for (unsigned i = 0; i < G_TP; i++)
		for (unsigned b = 0; b < G_PROMPT; b++)
			gfill(&granks[i], &odd_rows, seed, b, src[b]);
	return seed;
}

/* Seed 003: a connector that stored rank 0's shard alone. A DCP store that not every rank
 * of the group sends is never committed: it fails after dcp.store_timeout_ms, every block
 * listed, and no lookup finds it; once all ranks send it, it is stored. */
Test(dcp_kvringd, store_needs_every_rank, .fini = granks_close)
{
	uint32_t tokens[G_PROMPT * G_BLOCK];
	const uint32_t src[G_PROMPT] = {4, 2, 9};
	(void)gsetup("dcp_kvringd::store_needs_every_rank", 300, 4, 1, tokens, src);
	/* ranks 0 and 2 send the store, 1 and 3 do not */
	cr_assert_eq(kvr_store(granks[0].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	cr_assert_eq(kvr_store(granks[2].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	/* while they wait the gather actor holds them (drain and inspect see it) */
	const struct kvr_actor_ent *ge = kvr_ctl_actor(inst.ctl, gather_of_rank(&granks[0]));
	cr_assert(H_WAIT(atomic_load(&ge->held) == 2, 250), "held %u", atomic_load(&ge->held));
	for (unsigned i = 0; i < G_TP; i += 2) {
		struct kvr_completion c = gwait(&granks[i], 1, KVR_OP_STORE_DONE);
		cr_assert_eq(c.status, -ETIMEDOUT, "rank %u: %d", i, c.status);
		cr_assert_eq(c.n_stored, 0);
		cr_assert_eq(c.n_failed, G_PROMPT);
		for (unsigned b = 0; b < G_PROMPT; b++)
			cr_assert_eq(c.failed[b], src[b]);
	}
	cr_assert_eq(atomic_load(&ge->held), 0);
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(glookup_blocks(&granks[i], tokens, G_PROMPT * G_BLOCK, 10 + i), 0,
			     "rank %u found a block stored from half the shards", i);
	char *log = h_read_file(inst.log);
	cr_assert(strstr(log, "no matching store from rank(s) 1,3 within 300 ms"), "log:\n%s", log);
	free(log);

	/* all four: stored once, and found by every rank */
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(kvr_store(granks[i].c, 2, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	for (unsigned i = 0; i < G_TP; i++) {
		struct kvr_completion c = gwait(&granks[i], 2, KVR_OP_STORE_DONE);
		cr_assert_eq(c.status, 0, "rank %u: %d", i, c.status);
		cr_assert_eq(c.n_stored, G_PROMPT);
	}
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(glookup_blocks(&granks[i], tokens, G_PROMPT * G_BLOCK, 20 + i), G_PROMPT);
	/* the gather actor's store counters (what /metrics sums with the storers'): 3 blocks
	 * stored once, 2 x 3 failed by the timeout, 2 + 4 requests answered */
	const struct kvr_actor_stats *gs = kvr_ctl_stats(inst.ctl, gather_of_rank(&granks[0]));
	cr_assert_eq(atomic_load(&gs->c[KVR_STAT_XF_BLOCKS]), G_PROMPT);
	cr_assert_eq(atomic_load(&gs->c[KVR_STAT_XF_FAILED_BLOCKS]), 2 * G_PROMPT);
	cr_assert_eq(atomic_load(&gs->c[KVR_STAT_XF_REQUESTS]), 6);
	cr_assert_eq(atomic_load(&gs->c[KVR_STAT_XF_BYTES]), 4ull * G_PROMPT * odd_rows.layers * 4 * odd_rows.row,
		     "every rank's 4 rows of every layer of each block");
}

/* Ranks of one group must agree on the layout; a rank that does not is refused, naming
 * both layouts, and the group still forms with the right rank. */
Test(dcp_kvringd, group_layout_mismatch_refused, .fini = granks_close)
{
	gconfig(&odd_rows, 10000);
	h_start(&inst);
	struct kvr_geometry g0, g1;
	struct grank tmp;
	grank_geometry(&tmp, &odd_rows, 0, 2, 1);
	g0 = tmp.g;
	grank_geometry(&tmp, &odd_rows, 1, 2, 2);
	g1 = tmp.g;
	struct kvr_proto_rep rep;
	int s0;
	raw_attach(&g0, kvr_geometry_kv_extent(&g0), &rep, &s0);
	cr_assert_eq(rep.status, 0, "%s", rep.reason);
	struct kvr_attach_info info;
	memcpy(&info, rep.payload, sizeof(info));
	cr_assert_eq(info.group_ranks, 2);
	cr_assert_str_eq(kvr_ctl_actor(inst.ctl, info.storer_actor)->name, "gather.0");
	cr_assert_eq(info.loader_actor, SUP_ACTOR_LOADER(rep.worker));
	expect_refused(&g1, kvr_geometry_kv_extent(&g1), -EINVAL,
		       "DCP group 0 (TP ranks 0..1) has tp_size 4, dcp_size 2, dcp_interleave 1; this rank says 4, 2, 2");
	/* the gather actor waits for the group */
	cr_assert_eq(atomic_load(&kvr_ctl_actor(inst.ctl, info.storer_actor)->state), KVR_ACTOR_IDLE);
	close(s0);
}

/* Seed 002 at its production shape: DeepSeek-V3.2's fp8_ds_mla pages (656-byte records)
 * with the indexer's 132-byte-per-token tail, TP 4 / DCP 4, 64-token blocks (the preset
 * deepseek-v3.2-fp8, all 61 layers). Every rank's tail round-trips byte for byte; a tail
 * cannot be re-split, so DCP 2 and DCP 1 ranks never see these blocks (their keys differ)
 * instead of restoring garbage. */
Test(dcp_kvringd, tails_round_trip_under_their_layout_only, .fini = granks_close, .timeout = 120)
{
	const struct glayout fp8 = {.layers = 61, .head_dim = 656, .dtype = 1, .tail_per_token = 132, .block = 64, .row = 656};
	uint64_t lane = 61ull * 64 * (656 + 132);
	char model[256];
	snprintf(model, sizeof(model), "{\"preset\": \"deepseek-v3.2-fp8\", \"block_tokens\": 64, \"tp_size\": %u}",
		 G_TP);
	write_config_dcp(model, 8, lane, 8, 10000);
	h_start(&inst);
	uint32_t tokens[G_PROMPT * 64];
	uint64_t seed = gprompt("dcp_kvringd::tails_round_trip_under_their_layout_only", tokens, G_PROMPT * 64);

	granks_open(&fp8, 4, 1);
	cr_assert_eq(granks[0].g.page_bytes[0], 16 * (656 + 132), "a rank's page: 16 records + 16 tail entries");
	const uint32_t src[G_TP][G_PROMPT] = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 0}};
	cr_assert_eq(gstore_all(&fp8, seed, tokens, G_PROMPT * 64, src, 1), G_PROMPT);
	const uint32_t dst[G_TP][G_PROMPT] = {{9, 0, 5}, {3, 2, 1}, {11, 6, 4}, {8, 7, 10}};
	for (unsigned i = 0; i < G_TP; i++)
		memset(granks[i].kv, 0xa5, granks[i].bytes);
	gload_all(&fp8, seed, tokens, G_PROMPT * 64, dst, 2);
	granks_detach_all();

	granks_open(&fp8, 2, 1);
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(glookup_blocks(&granks[i], tokens, G_PROMPT * 64, 3), 0, "DCP 2 rank %u matched tail blocks of "
			     "DCP 4", i);
	granks_detach_all();
	granks_open(&fp8, 1, 1);
	cr_assert_eq(glookup_blocks(&granks[0], tokens, G_PROMPT * 64, 4), 0, "DCP 1 matched tail blocks of DCP 4");
}

/* The gather actor storing for a DCP rank: the consumer of its store ring. */
static unsigned gather_of_rank(const struct grank *r)
{
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), KVR_RING_STORE_REQ, kvr_worker_slot(r->c));
	int i = kvr_ctl_find_ring(inst.ctl, name);
	cr_assert_geq(i, 0);
	int cons = kvr_ctl_ring_ent(inst.ctl, (unsigned)i)->consumer;
	cr_assert_geq(cons, 0, "%s is consumed by %d", name, cons);
	cr_assert_eq(kvr_ctl_actor(inst.ctl, (unsigned)cons)->kind, KVR_ACTOR_GATHER);
	return (unsigned)cons;
}

/* A gather actor killed with SIGKILL is restarted and serves its group again; when a rank
 * of the group detaches, the group's gather actor stops (the others' stores fail at once,
 * -EPIPE, their loads still work: each rank has its own loader) and starts again when the
 * rank is back, with its new KV memory. */
Test(dcp_kvringd, gather_restarts_and_group_reforms, .fini = granks_close)
{
	gconfig(&odd_rows, 10000);
	h_start(&inst);
	uint32_t tokens[G_PROMPT * G_BLOCK];
	uint64_t seed = gprompt("dcp_kvringd::gather_restarts_and_group_reforms", tokens, G_PROMPT * G_BLOCK);
	granks_open(&odd_rows, 2, 1);
	const uint32_t src[G_TP][G_PROMPT] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}};
	cr_assert_eq(gstore_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, src, 1), G_PROMPT);

	unsigned ga = gather_of_rank(&granks[0]);
	cr_assert_eq(gather_of_rank(&granks[1]), ga, "TP ranks 0 and 1 are one group");
	cr_assert_neq(gather_of_rank(&granks[2]), ga, "TP ranks 2 and 3 are the other");
	struct kvr_actor_ent *e = kvr_ctl_actor(inst.ctl, ga);
	uint32_t gen = atomic_load(&e->generation);
	pid_t pid = atomic_load(&e->pid);
	cr_assert_gt(pid, 0);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_assert(H_WAIT(atomic_load(&e->generation) != gen && atomic_load(&e->state) == KVR_ACTOR_READY, 5000),
		  "%s not back: state %u; log:\n%s", e->name, atomic_load(&e->state), h_read_file(inst.log));
	/* the restarted gather actor stores again: another prompt, its blocks new */
	uint32_t tokens2[G_PROMPT * G_BLOCK];
	for (unsigned i = 0; i < G_PROMPT * G_BLOCK; i++)
		tokens2[i] = tokens[i] + 1;
	cr_assert_eq(gstore_all(&odd_rows, seed + 1, tokens2, G_PROMPT * G_BLOCK, src, 5), G_PROMPT);
	const uint32_t dst[G_TP][G_PROMPT] = {{11, 10, 9}, {8, 7, 6}, {5, 4, 3}, {2, 1, 0}};
	for (unsigned i = 0; i < G_TP; i++)
		memset(granks[i].kv, 0xa5, granks[i].bytes);
	gload_all(&odd_rows, seed + 1, tokens2, G_PROMPT * G_BLOCK, dst, 6);
	for (unsigned i = 0; i < G_TP; i++)
		for (unsigned b = 0; b < G_PROMPT; b++)
			gfill(&granks[i], &odd_rows, seed, b, src[i][b]);

	/* rank 1 leaves: its group's gather actor stops, rank 0 cannot store but still loads */
	grank_close(&granks[1]);
	cr_assert(H_WAIT(atomic_load(&e->state) == KVR_ACTOR_IDLE && atomic_load(&e->pid) == 0, 5000));
	cr_assert_eq(kvr_store(granks[0].c, 3, tokens, G_PROMPT * G_BLOCK, NULL, 0, src[0], G_PROMPT), -EPIPE);
	cr_assert(strstr(kvr_last_error(granks[0].c), "not running"), "%s", kvr_last_error(granks[0].c));
	struct kvr_lookup_result res;
	memset(granks[0].kv, 0xa5, granks[0].bytes);
	cr_assert_eq(kvr_lookup(granks[0].c, 3, tokens, G_PROMPT * G_BLOCK, NULL, 0, &res), 0);
	cr_assert_eq(res.matched_blocks, G_PROMPT, "lookups do not need the gather actor");
	cr_assert_eq(kvr_load(granks[0].c, 3, dst[0], G_PROMPT), 0, "%s", kvr_last_error(granks[0].c));
	struct kvr_completion lc = gwait(&granks[0], 3, KVR_OP_LOAD_DONE);
	cr_assert_eq(lc.status, 0, "a rank loads on its own while its group is incomplete: %d", lc.status);
	for (unsigned b = 0; b < G_PROMPT; b++)
		gcheck(&granks[0], &odd_rows, seed, b, dst[0][b]);
	/* the other group is not affected */
	cr_assert_eq(atomic_load(&kvr_ctl_actor(inst.ctl, gather_of_rank(&granks[2]))->state), KVR_ACTOR_READY);

	/* rank 1 is back (new KV memory): the group is served again */
	struct grank *r1 = &granks[1];
	grank_prepare(r1, &odd_rows, 1, 2, 1);
	attach_thread(r1);
	cr_assert_eq(r1->rc, 0, "%s", r1->err);
	cr_assert_eq(gather_of_rank(r1), ga);
	for (unsigned i = 0; i < G_TP; i++)
		memset(granks[i].kv, 0xa5, granks[i].bytes);
	gload_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, src, 4);
}

/* SIGTERM while half of a DCP group sent a store: the drain waits for the store the
 * gather actor holds; the other ranks' stores arrive during the drain, the blocks are
 * stored (every rank answered 0), and only then kvringd exits 0. */
Test(dcp_kvringd, drain_waits_for_a_group_store, .fini = granks_close)
{
	uint32_t tokens[G_PROMPT * G_BLOCK];
	const uint32_t src[G_PROMPT] = {3, 1, 4};
	(void)gsetup("dcp_kvringd::drain_waits_for_a_group_store", 5000, 2, 1, tokens, src);
	for (unsigned i = 0; i < G_TP; i += 2)
		cr_assert_eq(kvr_store(granks[i].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	for (unsigned i = 0; i < G_TP; i += 2) {
		const struct kvr_actor_ent *ge = kvr_ctl_actor(inst.ctl, gather_of_rank(&granks[i]));
		cr_assert(H_WAIT(atomic_load(&ge->held) == 1, 2000), "%s holds %u", ge->name, atomic_load(&ge->held));
	}
	cr_assert_eq(kill(inst.pid, SIGTERM), 0);
	cr_assert(H_WAIT(atomic_load(&inst.ctl->state) == KVR_INST_DRAINING, 2000), "not draining");
	usleep(300 * 1000);
	cr_assert_eq(atomic_load(&inst.ctl->state), KVR_INST_DRAINING, "drain did not wait for the held stores");
	cr_assert_eq(waitpid(inst.pid, NULL, WNOHANG), 0, "kvringd exited with DCP stores held");
	for (unsigned i = 1; i < G_TP; i += 2)
		cr_assert_eq(kvr_store(granks[i].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	unsigned stored = 0;
	for (unsigned i = 0; i < G_TP; i++) {
		struct kvr_completion c = gwait(&granks[i], 1, KVR_OP_STORE_DONE);
		cr_assert_eq(c.status, 0, "rank %u store during drain: %d", i, c.status);
		cr_assert_eq(c.n_stored + c.n_present, G_PROMPT);
		if (granks[i].g.dcp_rank == 0)
			stored += c.n_stored;
	}
	cr_assert_eq(stored, G_PROMPT, "one group stored each block");
	granks_close();
	int st = h_wait_exit(inst.pid, 10000);
	cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvringd exit status %d", st);
	inst.pid = 0;
}

/* ---- MLA, TP 4: one rank stores, four look up and load ------------------------------- */

Test(dcp_kvringd, mla_tp4_one_stores_four_load, .fini = granks_close)
{
	/* DeepSeek-V3's latent (kv_lora_rank 512 + rope 64, bf16: 1152-byte rows) on 4 layers
	 * instead of 61, 16-token blocks */
	const struct glayout mla = {.layers = 4, .head_dim = 576, .dtype = 2, .block = 16, .row = 1152};
	uint64_t lane = (uint64_t)mla.layers * mla.block * mla.row;
	char model[512];
	snprintf(model, sizeof(model),
		 "{\"preset\": \"\", \"model_id\": \"test/deepseek-v3-4-layers\", \"layers\": %u, \"kv_heads\": 1, "
		 "\"head_dim\": %u, \"dtype_bytes\": 2, \"block_tokens\": %u, \"tp_size\": %u, \"attention\": \"mla\"}",
		 mla.layers, mla.head_dim, mla.block, G_TP);
	write_config(model, G_TP, lane, 32);
	h_start(&inst);
	granks_open(&mla, 1, 1);

	struct rng rng = {test_seed("dcp_kvringd::mla_tp4_one_stores_four_load")};
	/* a 70-token prompt: 4 full blocks and 6 tokens that are never stored */
	uint32_t tokens[70], other[70];
	for (unsigned i = 0; i < 70; i++) {
		tokens[i] = rng_below(&rng, 150000);
		other[i] = tokens[i] ^ 1;
	}
	/* rank 2 stores its blocks 3, 0, 6, 1 (any rank may: every rank holds the latent) */
	struct grank *st = &granks[2];
	const uint32_t src_blocks[4] = {3, 0, 6, 1};
	for (unsigned b = 0; b < 4; b++)
		for (unsigned l = 0; l < mla.layers; l++) {
			uint8_t *p = gpage(st, l, src_blocks[b]);
			for (uint32_t k = 0; k < st->g.page_bytes[l]; k++)
				p[k] = (uint8_t)rng_next(&rng);
		}
	uint8_t *stored = malloc(st->bytes);
	cr_assert(stored);
	memcpy(stored, st->kv, st->bytes);
	cr_assert_eq(kvr_store(st->c, 7, tokens, 70, NULL, 0, src_blocks, 4), 0, "%s", kvr_last_error(st->c));
	struct kvr_completion c = gwait(st, 7, KVR_OP_STORE_DONE);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.n_blocks, 4);
	cr_assert_eq(c.n_stored, 4, "one lane for MLA: 4 new blocks");
	cr_assert_eq(c.n_present, 0);

	/* every rank sees the same 64 tokens, none of the other prompt */
	const uint32_t dst_blocks[G_TP][4] = {{4, 5, 2, 7}, {7, 6, 5, 4}, {2, 4, 5, 7}, {0, 1, 2, 3}};
	for (unsigned r = 0; r < G_TP; r++) {
		struct kvr_lookup_result res;
		cr_assert_eq(kvr_lookup(granks[r].c, 100 + r, tokens, 70, NULL, 0, &res), 0, "%s",
			     kvr_last_error(granks[r].c));
		cr_assert_eq(res.matched_tokens, 64, "rank %u matched %u tokens", r, res.matched_tokens);
		cr_assert_eq(res.matched_blocks, 4);
		cr_assert_eq(kvr_lookup(granks[r].c, 200 + r, other, 70, NULL, 0, &res), 0);
		cr_assert_eq(res.matched_tokens, 0, "rank %u: another prompt matched %u tokens", r, res.matched_tokens);
	}
	/* all four load at once, then each checks its bytes */
	for (unsigned r = 0; r < G_TP; r++)
		cr_assert_eq(kvr_load(granks[r].c, 100 + r, dst_blocks[r], 4), 0, "rank %u: %s", r,
			     kvr_last_error(granks[r].c));
	for (unsigned r = 0; r < G_TP; r++) {
		c = gwait(&granks[r], 100 + r, KVR_OP_LOAD_DONE);
		cr_assert_eq(c.status, 0, "rank %u load: %d", r, c.status);
		cr_assert_eq(c.n_failed, 0);
		cr_assert_eq(c.diag.bytes, 4 * lane, "rank %u moved %llu bytes", r, (unsigned long long)c.diag.bytes);
	}
	for (unsigned r = 0; r < G_TP; r++) {
		struct grank *rk = &granks[r];
		for (uint32_t b = 0; b < G_NB; b++) {
			int j = -1; /* which stored block went to b */
			for (int k = 0; k < 4; k++)
				if (dst_blocks[r][k] == b)
					j = k;
			for (unsigned l = 0; l < mla.layers; l++) {
				const uint8_t *got = gpage(rk, l, b);
				uint32_t n = rk->g.page_bytes[l];
				if (j >= 0) {
					const uint8_t *want = stored + (gpage(st, l, src_blocks[j]) - st->kv);
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

/* The disk tier keeps canonical blocks: stored under DCP 2 with L2 write-through, kvringd
 * stopped (drained) and started again with an empty L1, the blocks are promoted from L2
 * and load byte-exact under DCP 4 / I 2 (a decode node restarting with another layout). */
Test(dcp_kvringd, l2_restart_then_another_layout, .fini = granks_close)
{
	char dir[512], l2[700];
	snprintf(dir, sizeof(dir), "%s/l2", inst.dir);
	cr_assert_eq(mkdir(dir, 0700), 0);
	snprintf(l2, sizeof(l2), ",\n  \"l2\": {\"dirs\": [\"%s\"], \"capacity_bytes\": %u, \"mode\": \"write-through\"}",
		 dir, 64u << 20);
	config_l2 = l2;
	uint32_t tokens[G_PROMPT * G_BLOCK];
	const uint32_t src[G_PROMPT] = {8, 3, 5};
	uint64_t seed = gsetup("dcp_kvringd::l2_restart_then_another_layout", 10000, 2, 1, tokens, src);
	config_l2 = "";
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(kvr_store(granks[i].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(gwait(&granks[i], 1, KVR_OP_STORE_DONE).status, 0);
	granks_close();
	cr_assert_eq(kill(inst.pid, SIGTERM), 0);
	int st = h_wait_exit(inst.pid, 10000);
	cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvringd exit status %d", st);
	inst.pid = 0;

	h_start(&inst); /* same config, L1 empty: the blocks are on disk only */
	granks_open(&odd_rows, 4, 2);
	const uint32_t dst[G_TP][G_PROMPT] = {{0, 9, 2}, {6, 1, 11}, {4, 7, 3}, {10, 5, 8}};
	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lookup(granks[0].c, 2, tokens, G_PROMPT * G_BLOCK, NULL, 0, &res), 0);
	cr_assert_eq(res.matched_blocks, G_PROMPT);
	cr_assert_eq(res.l2_blocks, G_PROMPT, "promoted from L2: %u", res.l2_blocks);
	gload_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, dst, 3);
}

/* GQA with DCP: 4 KV heads, TP 4 in two DCP groups of two. Each group holds 2 of the heads
 * (its lane) for half the tokens a rank; the instance serves tp_size 2 (two lanes). A
 * block is visible once both groups stored their lane (the quorum); then every rank loads
 * its own heads and tokens byte-exact, under DCP 2 with interleave 1 and with interleave 8. */
Test(dcp_kvringd, gqa_lanes_and_quorum, .fini = granks_close)
{
	const struct glayout gqa = {.layers = 2, .head_dim = 64, .dtype = 2, .block = G_BLOCK, .row = 2 * 64 * 2,
				    .kv_heads = 2};
	write_config("{\"preset\": \"\", \"model_id\": \"test/gqa\", \"layers\": 2, \"kv_heads\": 4, \"head_dim\": 64, "
		     "\"dtype_bytes\": 2, \"block_tokens\": 16, \"tp_size\": 2}",
		     8, 2ull * 2 * G_BLOCK * gqa.row, 32);
	h_start(&inst);
	uint32_t tokens[G_PROMPT * G_BLOCK];
	uint64_t seed = gprompt("dcp_kvringd::gqa_lanes_and_quorum", tokens, G_PROMPT * G_BLOCK);
	granks_open(&gqa, 2, 1);
	/* lane = group: TP ranks 0, 1 store lane 0, TP ranks 2, 3 lane 1; each lane's content
	 * differs (another seed per group), as different heads do */
	const uint32_t src[G_TP][G_PROMPT] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}};
	for (unsigned i = 0; i < G_TP; i++)
		for (unsigned b = 0; b < G_PROMPT; b++)
			gfill(&granks[i], &gqa, seed + i / 2, b, src[i][b]);
	for (unsigned i = 0; i < 2; i++)
		cr_assert_eq(kvr_store(granks[i].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src[i], G_PROMPT), 0);
	for (unsigned i = 0; i < 2; i++) {
		struct kvr_completion c = gwait(&granks[i], 1, KVR_OP_STORE_DONE);
		cr_assert_eq(c.status, 0);
		cr_assert_eq(c.n_stored, G_PROMPT, "lane 0 stored");
	}
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(glookup_blocks(&granks[i], tokens, G_PROMPT * G_BLOCK, 2), 0,
			     "rank %u: visible with lane 1 missing", i);
	for (unsigned i = 2; i < G_TP; i++)
		cr_assert_eq(kvr_store(granks[i].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src[i], G_PROMPT), 0);
	for (unsigned i = 2; i < G_TP; i++)
		cr_assert_eq(gwait(&granks[i], 1, KVR_OP_STORE_DONE).n_stored, G_PROMPT, "lane 1 stored");

	const uint32_t dst[G_TP][G_PROMPT] = {{11, 10, 9}, {8, 7, 6}, {5, 4, 3}, {2, 1, 0}};
	for (unsigned il = 1; il <= 8; il += 7) {
		if (il > 1) {
			granks_detach_all();
			granks_open(&gqa, 2, il);
		}
		for (unsigned i = 0; i < G_TP; i++) {
			cr_assert_eq(glookup_blocks(&granks[i], tokens, G_PROMPT * G_BLOCK, 3 + il), G_PROMPT);
			cr_assert_eq(kvr_load(granks[i].c, 3 + il, dst[i], G_PROMPT), 0, "%s", kvr_last_error(granks[i].c));
		}
		for (unsigned i = 0; i < G_TP; i++) {
			struct kvr_completion c = gwait(&granks[i], 3 + il, KVR_OP_LOAD_DONE);
			cr_assert_eq(c.status, 0, "rank %u: %d", i, c.status);
			for (unsigned b = 0; b < G_PROMPT; b++)
				gcheck(&granks[i], &gqa, seed + i / 2, b, dst[i][b]);
		}
	}
}

/* Review finding: a rank that leaves and comes back in another worker slot while its old
 * slot's loader is still stopping. The group's gather actor must not start before the old
 * slot was released (else that slot stays DETACHING for as long as the group runs, its KV
 * memory held); it starts once the old loader exited, and the group stores again. */
Test(dcp_kvringd, quick_rejoin_frees_the_old_slot, .fini = granks_close)
{
	uint32_t tokens[G_PROMPT * G_BLOCK];
	const uint32_t src[G_PROMPT] = {1, 2, 3};
	uint64_t seed = gsetup("dcp_kvringd::quick_rejoin_frees_the_old_slot", 10000, 2, 1, tokens, src);
	unsigned w1 = kvr_worker_slot(granks[1].c);
	struct kvr_actor_ent *ge = kvr_ctl_actor(inst.ctl, gather_of_rank(&granks[0]));
	struct kvr_actor_ent *le = kvr_ctl_actor(inst.ctl, SUP_ACTOR_LOADER(w1));
	pid_t lpid = atomic_load(&le->pid);
	cr_assert_gt(lpid, 0);
	cr_assert_eq(kill(lpid, SIGSTOP), 0); /* a loader slow to stop */
	static struct grank departed; /* closed on its own thread while granks[1] attaches anew */
	departed = granks[1];
	granks[1].c = NULL;
	granks[1].kv = NULL;
	granks[1].fd = -1;
	pthread_t leaving;
	cr_assert_eq(pthread_create(&leaving, NULL, close_thread, &departed), 0);
	cr_assert(H_WAIT(atomic_load(&ge->state) == KVR_ACTOR_IDLE && atomic_load(&ge->pid) == 0, 5000));

	struct grank *r = &granks[1];
	grank_prepare(r, &odd_rows, 1, 2, 1);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, attach_thread, r), 0);
	usleep(300 * 1000);
	cr_assert_eq(atomic_load(&ge->state), KVR_ACTOR_IDLE, "gather actor started while the old slot is held");
	cr_assert_eq(kill(lpid, SIGCONT), 0);
	pthread_join(leaving, NULL); /* the departed rank's detach returns once its loader exited */
	pthread_join(t, NULL);
	cr_assert_eq(r->rc, 0, "%s", r->err);
	cr_assert_neq(kvr_worker_slot(r->c), w1);
	cr_assert(H_WAIT(atomic_load(&kvr_ctl_worker(inst.ctl, w1)->state) == KVR_WORKER_FREE, 5000),
		  "worker slot %u of the departed rank is in state %u", w1, atomic_load(&kvr_ctl_worker(inst.ctl, w1)->state));
	cr_assert_eq(atomic_load(&ge->state), KVR_ACTOR_READY);
	for (unsigned b = 0; b < G_PROMPT; b++)
		gfill(r, &odd_rows, seed, b, src[b]);
	for (unsigned i = 0; i < 2; i++)
		cr_assert_eq(kvr_store(granks[i].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	for (unsigned i = 0; i < 2; i++)
		cr_assert_eq(gwait(&granks[i], 1, KVR_OP_STORE_DONE).n_stored, G_PROMPT);
}

/* Review finding: a STORE left on a DCP rank's store ring (addressed to the gather actor)
 * must not be executed by the storer that serves the slot next (each counts its own
 * generations): kvringd drops what is on the ring when it changes hands. */
Test(dcp_kvringd, stale_store_does_not_cross_actors, .fini = granks_close)
{
	gconfig(&odd_rows, 10000);
	h_start(&inst);
	uint32_t tokens[G_PROMPT * G_BLOCK];
	(void)gprompt("dcp_kvringd::stale_store_does_not_cross_actors", tokens, G_PROMPT * G_BLOCK);
	granks_open(&odd_rows, 2, 1);
	unsigned w1 = kvr_worker_slot(granks[1].c);
	unsigned ga = gather_of_rank(&granks[1]);
	uint32_t ggen = atomic_load(&kvr_ctl_actor(inst.ctl, ga)->generation);
	kvr_key ns;
	cr_assert_eq(kvr_geometry_namespace(&granks[1].g, "test/mla-561", "", &ns), 0);
	grank_close(&granks[0]); /* the gather actor stops */
	cr_assert(H_WAIT(atomic_load(&kvr_ctl_actor(inst.ctl, ga)->state) == KVR_ACTOR_IDLE, 5000));
	/* a STORE rank 1's client had just sent to the (now stopped) gather actor */
	kvr_key keys[G_PROMPT];
	cr_assert_eq(kvr_keys_chain(ns, tokens, G_PROMPT * G_BLOCK, G_BLOCK, NULL, 0, keys, G_PROMPT), G_PROMPT);
	struct kvr_msg_store_item items[G_PROMPT];
	for (unsigned b = 0; b < G_PROMPT; b++)
		items[b] = (struct kvr_msg_store_item){.key = {keys[b].lo, keys[b].hi}, .block = b};
	/* a writable view of the control segment and its client areas, from kvringd's own
	 * descriptors */
	struct kvr_segment wseg;
	struct kvr_ctl *wctl;
	h_daemon_ctl(&inst, 1, &wseg);
	static struct kvr_ctl_rings wrings;
	cr_assert_eq(kvr_ctl_attach(&wseg, &wctl, &wrings), 0);
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), KVR_RING_STORE_REQ, w1);
	struct kvr_ring *ring = kvr_ctl_ring(&wrings, (unsigned)kvr_ctl_find_ring(wctl, name));
	uint64_t wire = ((uint64_t)(ggen & 0xffff) << 48) | 77;
	cr_assert_eq(kvr_list_send(ring, KVR_MSG_STORE, wire, 0, items, G_PROMPT, 0), 0);
	granks_detach_all();
	cr_assert_eq(kvr_ring_count(ring), 0, "%s still holds the stale STORE", name);
	kvr_segment_close(&wseg);
	cr_assert(h_log_contains(&inst, "stale messages dropped before it changes hands"));
	/* the next engine: TP 4 without DCP, a storer per rank: nothing was stored */
	granks_open(&odd_rows, 1, 1);
	usleep(200 * 1000);
	cr_assert_eq(glookup_blocks(&granks[0], tokens, G_PROMPT * G_BLOCK, 9), 0,
		     "a prompt nobody stored is a hit; log:\n%s", h_read_file(inst.log));
}

/* Review finding: ranks of one group that split a page into rows and tail differently
 * (here rows of 560 and an 8-byte tail against the model's 561-byte rows) would write
 * misaligned rows into one canonical block: refused at attach, naming the numbers. */
Test(dcp_kvringd, rank_row_split_must_be_the_models)
{
	gconfig(&odd_rows, 10000);
	h_start(&inst);
	struct grank tmp;
	grank_geometry(&tmp, &odd_rows, 0, 2, 1);
	struct kvr_geometry g = tmp.g;
	for (unsigned l = 0; l < g.n_regions; l++) {
		struct kvr_region reg = kvr_geometry_region(&g, l);
		reg.sem_bytes = 8 * 560; /* the page stays 8 x 561 bytes: the rest would be "tail" */
		cr_assert_eq(kvr_geometry_set_region(&g, l, &reg), 0);
	}
	expect_refused(&g, kvr_geometry_kv_extent(&g), -EINVAL,
		       "geometry mismatch: region 0 (layer 0) of this DCP rank's group holds 8960 bytes of token rows "
		       "per block, the model 8976 (row width or page tail differ)");
}

/* kvringd's control segment and slot table, mapped read-only as an observer. */
static void map_daemon(struct kvr_segment *ctl_seg, struct kvr_ctl **ctl, struct kvr_segment *slots_seg,
		       struct kvr_slot_table **st)
{
	h_daemon_ctl(&inst, 1, ctl_seg);
	cr_assert_eq(kvr_ctl_attach(ctl_seg, ctl, NULL), 0);
	int fd = h_daemon_memfd(inst.pid, "kvring-slots", O_RDONLY);
	cr_assert_eq(kvr_segment_map(fd, KVR_SEG_SLOTS, 0, slots_seg), 0);
	close(fd);
	cr_assert_eq(kvr_slots_attach(slots_seg, st), 0);
}

/* Count of slots in `state` in a mapped slot table. */
static uint32_t count_state(const struct kvr_slot_table *t, unsigned state)
{
	struct kvr_slot_counts c;
	kvr_slots_counts(t, &c);
	return state < KVR_SLOT_STATE_MAX ? c.by_state[state] : 0;
}

/* Once quiet: only FREE and COMMITTED slots, no pin. */
static bool slots_quiet(const struct kvr_slot_table *t)
{
	struct kvr_slot_counts c;
	kvr_slots_counts(t, &c);
	return c.by_state[KVR_SLOT_FREE] + c.by_state[KVR_SLOT_COMMITTED] == t->n_slots && !c.pins && !c.invalid;
}

/*
 * Defect 7 (issue 11): a gather actor killed while its DCP group leaves left WRITING slots
 * until another group attached. The gather actor allocates under the group's owner (its
 * first rank's worker slot). Here it is stopped and the test stands in for it on the
 * owner's commit ring: 3 slots WRITING, then the owner detaches, then 3 more are allocated
 * — what a gather actor that still runs after its owner left does — and the gather actor is
 * killed -9. Before the fix kvringd announced the owner's death at once, so the second 3
 * were never reclaimed. Now WORKER_GONE waits until the group's gather actor has exited.
 */
Test(dcp_kvringd, gather_killed_while_its_owner_leaves_leaks_no_slot, .fini = granks_close)
{
	gconfig(&odd_rows, 10000);
	h_start(&inst);
	granks_open(&odd_rows, 2, 1);
	struct kvr_segment ctl_seg = {.fd = -1}, slots_seg = {.fd = -1};
	struct kvr_ctl *ctl;
	struct kvr_slot_table *st;
	map_daemon(&ctl_seg, &ctl, &slots_seg, &st);

	unsigned ga = gather_of_rank(&granks[0]), owner = kvr_worker_slot(granks[0].c);
	struct kvr_actor_ent *e = kvr_ctl_actor(ctl, ga);
	pid_t gpid = atomic_load(&e->pid);
	cr_assert_gt(gpid, 0);
	cr_assert_eq(kill(gpid, SIGSTOP), 0);
	char name[KVR_RING_NAME_MAX];
	snprintf(name, sizeof(name), KVR_RING_COMMIT_REQ, owner);
	struct kvr_ring *creq = h_ring(ctl, name);
	cr_assert(creq);
	int lki = h_actor_index(ctl, "lookup");
	cr_assert_geq(lki, 0);
	_Atomic uint64_t *allocated = &kvr_ctl_stats(ctl, (unsigned)lki)->c[KVR_STAT_LK_ALLOCATED];
	uint64_t a0 = atomic_load(allocated);
	kvr_key keys[6];
	for (unsigned i = 0; i < 6; i++)
		keys[i] = (kvr_key){.lo = 0x7e57000 + i, .hi = 0xdcb0000 + i};
	cr_assert_eq(kvr_list_send(creq, KVR_MSG_ALLOC, 0x71, 0, keys, 3, kvr_now_ns() + 2000000000ull), 0);
	cr_assert(H_WAIT(atomic_load(allocated) == a0 + 3, 3000));
	cr_assert_eq(count_state(st, KVR_SLOT_WRITING), 3);

	pthread_t leaving; /* the owner leaves; its group's gather actor is told to stop */
	cr_assert_eq(pthread_create(&leaving, NULL, close_thread, &granks[0]), 0);
	struct kvr_worker_ent *we = kvr_ctl_worker(ctl, owner);
	cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_DETACHING, 3000));
	cr_assert_eq(kvr_list_send(creq, KVR_MSG_ALLOC, 0x72, 0, keys + 3, 3, kvr_now_ns() + 2000000000ull), 0);
	cr_assert(H_WAIT(atomic_load(allocated) == a0 + 6, 3000), "the second ALLOC was not served");
	cr_assert_eq(kill(gpid, SIGKILL), 0);
	pthread_join(leaving, NULL); /* its detach returned once the gather actor was gone */
	cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_FREE, 5000), "the owner's worker slot is not freed");
	cr_assert(H_WAIT(slots_quiet(st), 3000), "%u slots left WRITING (or other than FREE/COMMITTED, or pinned)",
		  count_state(st, KVR_SLOT_WRITING));

	/* the owner comes back: the group stores and loads byte-exact, and L1 is quiet again */
	grank_prepare(&granks[0], &odd_rows, 0, 2, 1);
	attach_thread(&granks[0]);
	cr_assert_eq(granks[0].rc, 0, "%s", granks[0].err);
	uint32_t tokens[G_PROMPT * G_BLOCK];
	uint64_t seed = gprompt("dcp_kvringd::gather_killed_while_its_owner_leaves_leaks_no_slot", tokens,
				G_PROMPT * G_BLOCK);
	const uint32_t src[G_TP][G_PROMPT] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}};
	cr_assert_eq(gstore_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, src, 1), G_PROMPT);
	const uint32_t dst[G_TP][G_PROMPT] = {{11, 10, 9}, {8, 7, 6}, {5, 4, 3}, {2, 1, 0}};
	for (unsigned i = 0; i < G_TP; i++)
		memset(granks[i].kv, 0xa5, granks[i].bytes);
	gload_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, dst, 2);
	cr_assert(H_WAIT(slots_quiet(st), 3000), "the slot table is not quiet after the group's store and load");
	kvr_segment_close(&slots_seg);
	kvr_segment_close(&ctl_seg);
}

/*
 * Two engines using DCP on one instance (issue 24): each engine's ranks form groups of
 * their own, with a gather actor each. Groups were keyed by TP rank alone, so engine B's
 * DCP rank 0 found engine A's group and was refused ("DCP rank 0 of group 0 is already
 * attached"). Engine A stores a prompt through its group; engine B's ranks (same model
 * namespace) load it byte-exact, and B's own store of it finds every block present.
 */
static struct grank granks_b[G_TP];

static void granks_b_close(void)
{
	granks_close();
	for (unsigned i = 0; i < G_TP; i++)
		grank_close(&granks_b[i]);
}

Test(dcp_kvringd, two_engines_each_with_their_own_dcp_groups, .fini = granks_b_close)
{
	gconfig(&odd_rows, 10000);
	h_start(&inst);
	uint32_t tokens[G_PROMPT * G_BLOCK];
	uint64_t seed = gprompt("dcp_kvringd::two_engines_each_with_their_own_dcp_groups", tokens, G_PROMPT * G_BLOCK);
	granks_open_engine(&odd_rows, 4, 1, "engine-b");
	memcpy(granks_b, granks, sizeof(granks));
	granks_open_engine(&odd_rows, 4, 1, "engine-a");
	unsigned ga = gather_of_rank(&granks[0]), gb = gather_of_rank(&granks_b[0]);
	cr_assert_neq(ga, gb, "both engines' ranks were put in one group (gather actor %u)", ga);
	const struct kvr_actor_ent *ea = kvr_ctl_actor(inst.ctl, ga), *eb = kvr_ctl_actor(inst.ctl, gb);
	cr_assert(H_WAIT(atomic_load(&ea->state) == KVR_ACTOR_READY && atomic_load(&eb->state) == KVR_ACTOR_READY, 10000),
		  "a gather actor per engine's group; log:\n%s", h_read_file(inst.log));

	const uint32_t src[G_TP][G_PROMPT] = {{1, 2, 3}, {1, 2, 3}, {1, 2, 3}, {1, 2, 3}};
	const uint32_t dst[G_TP][G_PROMPT] = {{7, 5, 9}, {7, 5, 9}, {7, 5, 9}, {7, 5, 9}};
	cr_assert_eq(gstore_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, src, 1), G_PROMPT, "engine A stored");
	struct grank a_ranks[G_TP];
	memcpy(a_ranks, granks, sizeof(granks));
	memcpy(granks, granks_b, sizeof(granks)); /* the helpers act on granks: engine B's ranks */
	gload_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, dst, 2);
	cr_assert_eq(gstore_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, src, 3), 0,
		     "engine B's store of the same prompt finds every block present");
	memcpy(granks_b, granks, sizeof(granks));
	memcpy(granks, a_ranks, sizeof(granks));
	char *log = h_read_file(inst.log);
	cr_assert(strstr(log, "DCP group 0 of engine 0") && strstr(log, "DCP group 0 of engine 1"), "log:\n%s", log);
	free(log);
}

/* Whether process pid is stopped (state T in /proc/pid/stat). */
static bool proc_stopped(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/*
 * Issue 26: no handler of the gather actor waits for the lookup actor. The lookup actor is
 * stopped (SIGSTOP) while group A's store waits for its allocation; meanwhile group A's
 * gather actor goes on: its loop runs (heartbeat, pings), and a store that rank 0 sends
 * alone is answered -ETIMEDOUT after dcp.store_timeout_ms (300 ms) — the blocking store
 * path answered nothing before its ALLOC gave up after timeouts.lookup_call_ms (10 s). When
 * the lookup actor goes on, the waiting store completes; every rank then loads the prompt
 * byte-exact and the slot table is quiet.
 */
Test(dcp_kvringd, gather_goes_on_while_the_lookup_actor_is_stopped, .fini = granks_close)
{
	uint32_t tokens[G_PROMPT * G_BLOCK], tokens2[G_PROMPT * G_BLOCK];
	const uint32_t src[G_PROMPT] = {2, 7, 5};
	uint64_t seed = gsetup("dcp_kvringd::gather_goes_on_while_the_lookup_actor_is_stopped", 300, 2, 1, tokens, src);
	for (unsigned i = 0; i < G_PROMPT * G_BLOCK; i++)
		tokens2[i] = tokens[i] + 7;
	struct kvr_segment ctl_seg = {.fd = -1}, slots_seg = {.fd = -1};
	struct kvr_ctl *ctl;
	struct kvr_slot_table *st;
	map_daemon(&ctl_seg, &ctl, &slots_seg, &st);

	int lki = h_actor_index(ctl, "lookup");
	cr_assert_geq(lki, 0);
	pid_t lpid = atomic_load(&kvr_ctl_actor(ctl, (unsigned)lki)->pid);
	cr_assert_gt(lpid, 0);
	const struct kvr_actor_ent *ge = kvr_ctl_actor(ctl, gather_of_rank(&granks[0]));
	cr_assert_eq(kill(lpid, SIGSTOP), 0);
	cr_assert(H_WAIT(proc_stopped(lpid), 2000));

	/* group A (TP ranks 0, 1): its store waits for an allocation nobody answers */
	for (unsigned i = 0; i < 2; i++)
		cr_assert_eq(kvr_store(granks[i].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	cr_assert(H_WAIT(atomic_load(&ge->held) == 1, 2000), "held %u", atomic_load(&ge->held));
	uint64_t beat = atomic_load(&ge->heartbeat_ns);
	/* rank 0 alone stores another prompt: answered by the group's timeout meanwhile */
	cr_assert_eq(kvr_store(granks[0].c, 2, tokens2, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	struct kvr_completion c = gwait(&granks[0], 2, KVR_OP_STORE_DONE);
	cr_assert_eq(c.status, -ETIMEDOUT, "the lone store: %d", c.status);
	cr_assert_eq(c.n_failed, G_PROMPT);
	cr_assert(proc_stopped(lpid), "answered while the lookup actor is still stopped");
	cr_assert(H_WAIT(atomic_load(&ge->heartbeat_ns) > beat, 3000), "the gather actor's loop stands still");
	cr_assert_eq(atomic_load(&ge->held), 1, "store 1 still waits for its allocation");
	struct kvr_completion none;
	cr_assert_eq(kvr_poll(granks[1].c, &none, 1), 0, "rank 1's store is not answered before its allocation");

	cr_assert_eq(kill(lpid, SIGCONT), 0);
	for (unsigned i = 0; i < 2; i++) {
		c = gwait(&granks[i], 1, KVR_OP_STORE_DONE);
		cr_assert_eq(c.status, 0, "rank %u: %d", i, c.status);
		cr_assert_eq(c.n_stored, G_PROMPT, "rank %u: %u stored", i, c.n_stored);
	}
	/* group B (TP ranks 2, 3) finds the blocks present (MLA: one lane for every group) */
	for (unsigned i = 2; i < G_TP; i++)
		cr_assert_eq(kvr_store(granks[i].c, 1, tokens, G_PROMPT * G_BLOCK, NULL, 0, src, G_PROMPT), 0);
	for (unsigned i = 2; i < G_TP; i++) {
		c = gwait(&granks[i], 1, KVR_OP_STORE_DONE);
		cr_assert_eq(c.status, 0);
		cr_assert_eq(c.n_present, G_PROMPT);
	}
	const uint32_t dst[G_TP][G_PROMPT] = {{11, 10, 9}, {8, 7, 6}, {5, 4, 3}, {2, 1, 0}};
	for (unsigned i = 0; i < G_TP; i++)
		memset(granks[i].kv, 0xa5, granks[i].bytes);
	gload_all(&odd_rows, seed, tokens, G_PROMPT * G_BLOCK, dst, 3);
	for (unsigned i = 0; i < G_TP; i++)
		cr_assert_eq(glookup_blocks(&granks[i], tokens2, G_PROMPT * G_BLOCK, 10 + i), 0,
			     "rank %u found the lone store", i);
	cr_assert(H_WAIT(slots_quiet(st), 3000), "the slot table is not quiet");
	kvr_segment_close(&slots_seg);
	kvr_segment_close(&ctl_seg);
}
