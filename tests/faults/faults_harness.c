/* Fault suites: key-derived KV bytes, ranks, the worker process loop, slot-table and L2 checks. */
#include "faults_harness.h"
#include "kvr_ring.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "../ipc/ipc_test.h"
#include "kvr_ctl.h"
#include "l2file.h"

/* ---- models and content ----------------------------------------------------------------- */

const struct fh_model fh_model_default = {.name = "default", .layers = FH_LAYERS, .lane_heads = FH_LANE_HEADS,
					  .head_dim = FH_HEAD_DIM, .dtype = FH_DTYPE, .tp = FH_TP};

void fh_lane_content(kvr_key key, unsigned lane, uint8_t out[FH_LANE_BYTES])
{
	uint64_t base = mix64(key.lo ^ mix64(key.hi + 0x9e3779b97f4a7c15ull * (lane + 1)));
	for (uint32_t w = 0; w < FH_LANE_BYTES / 8; w++) {
		uint64_t v = mix64(base + w * 0xd1b54a32d192ed03ull);
		memcpy(out + 8 * w, &v, 8);
	}
}

/* ---- prompts ---------------------------------------------------------------------------- */

static void random_tokens(uint32_t *t, size_t n, struct rng *g)
{
	for (size_t i = 0; i < n; i++)
		t[i] = rng_below(g, 151000);
}

void fh_make_prompts(struct fh_prompt *p, unsigned n, unsigned families, unsigned max_blk, uint64_t seed, kvr_key ns,
		     uint32_t bt)
{
	struct rng g = {seed ^ 0x70726f6d707473ull};
	static uint32_t base[64][FH_MAX_BLK * FH_MAX_BT];
	if (families > 64)
		families = 64;
	if (max_blk > FH_MAX_BLK)
		max_blk = FH_MAX_BLK;
	if (!bt || bt > FH_MAX_BT)
		bt = FH_BT;
	for (unsigned f = 0; f < families; f++)
		random_tokens(base[f], FH_MAX_BLK * bt, &g);
	for (unsigned i = 0; i < n; i++) {
		struct fh_prompt *q = &p[i];
		uint32_t pre = 1 + rng_below(&g, max_blk), suf = rng_below(&g, max_blk - pre + 1);
		q->n = pre + suf;
		q->bt = bt;
		memcpy(q->tokens, base[rng_below(&g, families)], pre * bt * sizeof(uint32_t));
		random_tokens(q->tokens + pre * bt, suf * bt, &g);
		(void)kvr_keys_chain(ns, q->tokens, q->n * bt, bt, NULL, 0, q->keys, q->n);
	}
}

void fh_make_prompt(struct fh_prompt *p, unsigned n_blocks, uint64_t seed, kvr_key ns, uint32_t bt)
{
	struct rng g = {seed ^ 0x6f6e65ull};
	memset(p, 0, sizeof(*p));
	p->n = n_blocks < FH_MAX_BLK ? n_blocks : FH_MAX_BLK;
	p->bt = bt && bt <= FH_MAX_BT ? bt : FH_BT;
	random_tokens(p->tokens, p->n * p->bt, &g);
	(void)kvr_keys_chain(ns, p->tokens, p->n * p->bt, p->bt, NULL, 0, p->keys, p->n);
}

/* ---- ranks ------------------------------------------------------------------------------ */

/* The geometry of a rank of m: vLLM's layer-major pages, each region's blocks contiguous. */
static int rank_geometry(struct kvr_geometry *g, const struct fh_model *m, unsigned tp_size, unsigned tp_rank,
			 unsigned dcp_size, unsigned il, uint32_t num_blocks)
{
	uint32_t rt = fh_model_bt(m) / dcp_size;
	if (fh_model_lane_bytes(m) > FH_LANE_BYTES || fh_model_bt(m) > FH_MAX_BT)
		return -EINVAL;
	int rc = kvr_geometry_fill_vllm_layer_major(g, m->layers, m->lane_heads, m->head_dim, m->dtype, rt, num_blocks);
	if (rc)
		return rc;
	g->block_tokens = fh_model_bt(m);
	g->tp_size = tp_size;
	g->tp_rank = tp_rank;
	g->dcp_size = dcp_size;
	g->dcp_rank = tp_rank % dcp_size;
	g->dcp_interleave = dcp_size > 1 ? il : 1;
	uint64_t page = (uint64_t)rt * fh_model_row(m);
	for (unsigned l = 0; l < g->n_regions; l++) {
		struct kvr_region reg = {.offset = (uint64_t)l * num_blocks * page, .stride = page,
					 .page_bytes = (uint32_t)page, .sem_bytes = (uint32_t)page};
		if ((rc = kvr_geometry_set_region(g, l, &reg)))
			return rc;
	}
	return 0;
}

int fh_model_namespace(const struct fh_model *m, const char *model_id, kvr_key *ret_ns)
{
	struct kvr_geometry g;
	memset(&g, 0, sizeof(g));
	int rc = rank_geometry(&g, m, m->tp, 0, 1, 1, 1);
	return rc ? rc : kvr_geometry_namespace(&g, m->model_ns ? m->model_ns : model_id, NULL, ret_ns);
}

int fh_rank_prepare(struct fh_rank *r, unsigned tp_size, unsigned tp_rank, unsigned dcp_size, unsigned il,
		    uint32_t num_blocks)
{
	return fh_rank_prepare_model(r, &fh_model_default, NULL, tp_size, tp_rank, dcp_size, il, num_blocks);
}

int fh_rank_prepare_model(struct fh_rank *r, const struct fh_model *m, const char *engine, unsigned tp_size,
			  unsigned tp_rank, unsigned dcp_size, unsigned il, uint32_t num_blocks)
{
	memset(r, 0, sizeof(*r));
	r->fd = -1;
	r->m = m;
	r->engine = engine;
	int rc = rank_geometry(&r->g, m, tp_size, tp_rank, dcp_size, il, num_blocks);
	if (rc)
		return rc;
	r->lane = tp_rank / dcp_size;
	r->bytes = kvr_geometry_kv_extent(&r->g);
	r->fd = memfd_create("fh-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (r->fd < 0 || ftruncate(r->fd, (off_t)r->bytes) < 0)
		goto fail;
	r->kv = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	if (r->kv == MAP_FAILED) {
		r->kv = NULL;
		goto fail;
	}
	memset(r->kv, FH_CANARY, r->bytes);
	return 0;
fail:
	rc = -errno;
	fh_rank_close(r);
	return rc;
}

int fh_rank_attach(struct fh_rank *r, const char *sock, int64_t timeout_ms)
{
	struct kvr_attach_opts o = {.socket = sock, .geometry = &r->g, .kv_fd = r->fd, .kv_bytes = r->bytes,
				    .timeout_ms = timeout_ms, .engine_id = r->engine, .model_ns = r->m->model_ns};
	return kvr_attach(&o, &r->c);
}

void fh_rank_close(struct fh_rank *r)
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

uint64_t fh_rank_share(const struct fh_rank *r)
{
	return kvr_geometry_lane_bytes(&r->g);
}

/* The rank's page of region reg of engine block `block`. */
static uint8_t *page_of(const struct fh_rank *r, unsigned reg, uint32_t block)
{
	struct kvr_region g = kvr_geometry_region(&r->g, reg);
	return r->kv + g.offset + (uint64_t)block * g.stride;
}

/* Whether global token t of a block is this rank's: (t / I) mod D == dcp_rank. */
static bool owns(const struct fh_rank *r, uint32_t t)
{
	return (t / r->g.dcp_interleave) % r->g.dcp_size == r->g.dcp_rank;
}

void fh_fill(const struct fh_rank *r, uint32_t block, kvr_key key)
{
	uint8_t lane[FH_LANE_BYTES];
	const uint32_t row = fh_model_row(r->m), bt = fh_model_bt(r->m);
	fh_lane_content(key, r->lane, lane);
	for (unsigned reg = 0; reg < r->g.n_regions; reg++) {
		uint8_t *p = page_of(r, reg, block);
		for (uint32_t t = 0, j = 0; t < bt; t++)
			if (owns(r, t))
				memcpy(p + row * j++, lane + (reg * bt + t) * row, row);
	}
}

void fh_fill_canary(const struct fh_rank *r, uint32_t block)
{
	for (unsigned reg = 0; reg < r->g.n_regions; reg++)
		memset(page_of(r, reg, block), FH_CANARY, r->g.page_bytes[reg]);
}

/* fh_check against lane `ln` of key. */
static uint64_t check_as(const struct fh_rank *r, uint32_t block, kvr_key key, unsigned ln, struct fh_bad *ret_bad)
{
	uint8_t lane[FH_LANE_BYTES];
	const uint32_t row = fh_model_row(r->m), bt = fh_model_bt(r->m);
	fh_lane_content(key, ln, lane);
	uint64_t wrong = 0;
	bool canary = true;
	struct fh_bad first = {0};
	for (unsigned reg = 0; reg < r->g.n_regions; reg++) {
		const uint8_t *p = page_of(r, reg, block);
		for (uint32_t t = 0, j = 0; t < bt; t++) {
			if (!owns(r, t))
				continue;
			const uint8_t *got = p + row * j++, *want = lane + (reg * bt + t) * row;
			for (uint32_t k = 0; k < row; k++) {
				canary &= got[k] == FH_CANARY;
				if (got[k] == want[k])
					continue;
				if (!wrong++)
					first = (struct fh_bad){.key = key, .lane = r->lane, .block = block,
								.offset = (reg * bt + t) * row + k, .got = got[k],
								.want = want[k]};
			}
		}
	}
	if (wrong && ret_bad) {
		first.canary = canary;
		*ret_bad = first;
	}
	return wrong;
}

uint64_t fh_check(const struct fh_rank *r, uint32_t block, kvr_key key, struct fh_bad *ret_bad)
{
	return check_as(r, block, key, r->lane, ret_bad);
}

int fh_identify(const struct fh_rank *r, uint32_t block, const struct fh_prompt *p, unsigned n, unsigned *ret_block,
		unsigned *ret_lane)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned b = 0; b < p[i].n; b++)
			for (unsigned ln = 0; ln < r->m->tp; ln++)
				if (!check_as(r, block, p[i].keys[b], ln, NULL)) {
					*ret_block = b;
					*ret_lane = ln;
					return (int)i;
				}
	return -1;
}

/* ---- the worker process ----------------------------------------------------------------- */

struct wctx {
	const struct fh_worker_cfg *cfg;
	const struct fh_role *role;
	struct fh_wshared *sh;
	struct rng g;
	struct fh_rank r[2];
	unsigned n_ranks;
	bool attached;
	uint32_t src_cur, dst_cur;
};

static void count(struct wctx *w, unsigned c, uint64_t n)
{
	atomic_fetch_add(&w->sh->c[c], n);
}

static void set_err(struct wctx *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct wctx *w, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w->sh->last_err, sizeof(w->sh->last_err), fmt, ap);
	va_end(ap);
}

static void detach_all(struct wctx *w)
{
	for (unsigned i = 0; i < w->n_ranks; i++)
		fh_rank_close(&w->r[i]);
	w->attached = false;
}

struct attach_arg {
	struct fh_rank *r;
	const struct fh_worker_cfg *cfg;
	int rc;
	char err[200];
};

static void *attach_thread(void *p)
{
	struct attach_arg *a = p;
	a->rc = fh_rank_attach(a->r, a->cfg->sock, a->cfg->attach_timeout_ms);
	if (a->rc)
		snprintf(a->err, sizeof(a->err), "%s", kvr_last_error(NULL));
	return NULL;
}

/* Attach every rank of the role (a DCP group's ranks at once: each attach returns when the
 * whole group is there). */
static int attach_all(struct wctx *w)
{
	const struct fh_role *ro = w->role;
	const struct fh_model *m = ro->m ? ro->m : &fh_model_default;
	int rc = 0;
	for (unsigned i = 0; i < w->n_ranks && !rc; i++)
		rc = ro->kind == FH_ROLE_TP
			     ? fh_rank_prepare_model(&w->r[i], m, ro->engine, m->tp, ro->tp_rank, 1, 1, w->cfg->num_blocks)
			     : fh_rank_prepare_model(&w->r[i], m, ro->engine, m->tp * w->cfg->dcp_size, ro->tp_rank + i,
						     w->cfg->dcp_size, w->cfg->dcp_interleave, w->cfg->num_blocks);
	for (unsigned i = 0; i < w->n_ranks && !rc; i++) {
		atomic_store(&w->sh->kv_fd[i], w->r[i].fd);
		atomic_store(&w->sh->kv_bytes[i], w->r[i].bytes);
	}
	atomic_store(&w->sh->n_kv, rc ? 0 : w->n_ranks);
	struct attach_arg a[2] = {0};
	pthread_t t[2];
	bool started[2] = {false, false};
	for (unsigned i = 0; i < w->n_ranks && !rc; i++) {
		a[i] = (struct attach_arg){.r = &w->r[i], .cfg = w->cfg};
		if (w->n_ranks == 1)
			attach_thread(&a[i]);
		else
			started[i] = pthread_create(&t[i], NULL, attach_thread, &a[i]) == 0;
	}
	for (unsigned i = 0; i < w->n_ranks; i++)
		if (started[i])
			pthread_join(t[i], NULL);
	for (unsigned i = 0; i < w->n_ranks && !rc; i++)
		if (a[i].rc) {
			rc = a[i].rc;
			set_err(w, "attach of rank %u: %s", w->r[i].g.tp_rank, a[i].err);
		}
	if (rc) {
		detach_all(w);
		count(w, FH_C_ATTACH_FAILS, 1);
		return rc;
	}
	count(w, FH_C_ATTACHES, 1);
	w->attached = true;
	return 0;
}

static void report_bad(struct wctx *w, unsigned rank, unsigned prompt, const struct fh_bad *b)
{
	uint32_t no = 0;
	if (!atomic_compare_exchange_strong(&w->sh->have_bad, &no, 2))
		return;
	w->sh->bad = *b;
	w->sh->bad_prompt = prompt;
	w->sh->bad_rank = w->r[rank].g.tp_rank;
	atomic_store(&w->sh->have_bad, 1);
}

/* One completion of request req on rank i: 1 when it came, 0 on a hang (counted, the
 * ranks detached: the next operation attaches again). */
static int wait_done(struct wctx *w, unsigned i, uint64_t req, struct kvr_completion *ret, uint32_t *failed,
		     uint32_t cap)
{
	for (;;) {
		int n = kvr_wait(w->r[i].c, ret, 1, w->cfg->hang_ms);
		if (n == 1 && ret->req_id != req)
			continue; /* a late completion of a request given up on */
		if (n == 1) {
			uint32_t k = ret->n_failed < cap ? ret->n_failed : cap;
			if (k)
				memcpy(failed, ret->failed, k * sizeof(*failed));
			return 1;
		}
		count(w, FH_C_HANGS, 1);
		set_err(w, "rank %u: request %llu: no completion within %lld ms (%d: %s)", w->r[i].g.tp_rank,
			(unsigned long long)req, (long long)w->cfg->hang_ms, n, kvr_last_error(w->r[i].c));
		detach_all(w);
		return 0;
	}
}

/* Store prompt p from every rank of the role. Returns the errors seen (0: all answered). */
static int op_store(struct wctx *w, unsigned pi)
{
	const struct fh_prompt *p = &w->cfg->prompts[pi];
	uint32_t half = w->cfg->num_blocks / 2, src[FH_MAX_BLK];
	for (uint32_t b = 0; b < p->n; b++)
		src[b] = w->src_cur++ % half;
	uint64_t req[2];
	bool sent[2] = {false, false};
	int errs = 0;
	for (unsigned i = 0; i < w->n_ranks; i++) {
		for (uint32_t b = 0; b < p->n; b++)
			fh_fill(&w->r[i], src[b], p->keys[b]);
		req[i] = ++w->r[i].next_req;
		int rc = kvr_store(w->r[i].c, req[i], p->tokens, p->n * p->bt, NULL, 0, src, p->n);
		sent[i] = rc == 0;
		if (rc) {
			errs++;
			count(w, FH_C_SUBMIT_ERRS, 1);
			set_err(w, "store submit: %d %s", rc, kvr_last_error(w->r[i].c));
		}
	}
	for (unsigned i = 0; i < w->n_ranks; i++) {
		struct kvr_completion c;
		uint32_t failed[FH_MAX_BLK];
		if (!sent[i])
			continue;
		if (!wait_done(w, i, req[i], &c, failed, FH_MAX_BLK))
			return errs + 1;
		count(w, FH_C_STORES, 1);
		count(w, FH_C_STORES_FAILED, c.status != 0);
		count(w, FH_C_STORED_BLOCKS, c.n_stored);
		errs += c.status != 0;
	}
	return errs;
}

/* Look prompt p up on every rank of the role and load what each one matched; every block
 * reported restored is compared byte by byte. Returns the errors seen. */
static int op_load(struct wctx *w, unsigned pi)
{
	const struct fh_prompt *p = &w->cfg->prompts[pi];
	uint32_t half = w->cfg->num_blocks / 2;
	uint32_t dst[2][FH_MAX_BLK], m[2] = {0, 0};
	uint64_t req[2];
	int errs = 0;
	for (unsigned i = 0; i < w->n_ranks; i++) {
		struct kvr_lookup_result res;
		req[i] = ++w->r[i].next_req;
		int rc = kvr_lookup(w->r[i].c, req[i], p->tokens, p->n * p->bt, NULL, 0, &res);
		if (rc) {
			errs++;
			count(w, FH_C_LOOKUP_ERRS, 1);
			set_err(w, "lookup: %d %s", rc, kvr_last_error(w->r[i].c));
			continue;
		}
		count(w, FH_C_LOOKUPS, 1);
		if (!res.matched_blocks)
			continue;
		for (uint32_t b = 0; b < res.matched_blocks; b++) {
			dst[i][b] = half + w->dst_cur++ % half;
			fh_fill_canary(&w->r[i], dst[i][b]);
		}
		rc = kvr_load(w->r[i].c, req[i], dst[i], res.matched_blocks);
		if (rc) {
			errs++;
			count(w, FH_C_SUBMIT_ERRS, 1);
			set_err(w, "load submit: %d %s", rc, kvr_last_error(w->r[i].c));
			continue;
		}
		m[i] = res.matched_blocks;
	}
	for (unsigned i = 0; i < w->n_ranks; i++) {
		if (!m[i])
			continue;
		struct kvr_completion c;
		uint32_t failed[FH_MAX_BLK];
		if (!wait_done(w, i, req[i], &c, failed, FH_MAX_BLK))
			return errs + 1;
		count(w, FH_C_LOADS, 1);
		count(w, FH_C_LOADS_FAILED, c.status != 0);
		errs += c.status != 0;
		for (uint32_t b = 0; b < m[i]; b++) {
			bool miss = false;
			for (uint32_t k = 0; k < c.n_failed && k < FH_MAX_BLK; k++)
				miss |= failed[k] == dst[i][b];
			if (miss) {
				count(w, FH_C_BLOCKS_MISSED, 1);
				continue;
			}
			struct fh_bad bad;
			uint64_t wrong = fh_check(&w->r[i], dst[i][b], p->keys[b], &bad);
			count(w, FH_C_BLOCKS_CHECKED, 1);
			count(w, FH_C_BYTES, fh_rank_share(&w->r[i]));
			if (wrong) {
				count(w, FH_C_WRONG_BLOCKS, 1);
				count(w, FH_C_WRONG_BYTES, wrong);
				report_bad(w, i, pi, &bad);
				unsigned ob, ol;
				int op = fh_identify(&w->r[i], dst[i][b], w->cfg->prompts, w->cfg->n_prompts, &ob, &ol);
				char what[96];
				if (bad.canary)
					snprintf(what, sizeof(what), "never written (the canary)");
				else if (op >= 0)
					snprintf(what, sizeof(what), "prompt %d block %u lane %u's bytes", op, ob, ol);
				else
					snprintf(what, sizeof(what), "no stored block's bytes");
				fprintf(stderr, "faults: t=%.3f s: WRONG BYTES: %s (TP rank %u) loaded prompt %u block %u (key "
					"%016llx%016llx lane %u): %llu of %llu bytes wrong from offset %u (0x%02x, want "
					"0x%02x): %s\n", (double)(kvr_now_ns() - w->cfg->t0_ns) / 1e9, w->role->name,
					w->r[i].g.tp_rank, pi, b, (unsigned long long)p->keys[b].hi,
					(unsigned long long)p->keys[b].lo, w->r[i].lane, (unsigned long long)wrong,
					(unsigned long long)fh_rank_share(&w->r[i]), bad.offset, bad.got, bad.want, what);
			}
		}
	}
	return errs;
}

/* The seal prompt after a restart, looked up and loaded until every block of it was restored
 * on every rank of the role: the lookups of the other roles' promotions may cut one short
 * (a lane another rank is promoting is a miss for now, L1 full of pinned slots too), never for
 * long. What the last try restored and checked is counted. */
static void verify_seal(struct wctx *w)
{
	const struct fh_prompt *p = &w->cfg->prompts[w->cfg->n_prompts];
	uint64_t want = (uint64_t)p->n * w->n_ranks, got = 0;
	for (unsigned t = 0; t < 50 && got < want && w->attached; t++) {
		if (t)
			usleep(20000);
		uint64_t c0 = atomic_load(&w->sh->c[FH_C_BLOCKS_CHECKED]), k0 = atomic_load(&w->sh->c[FH_C_WRONG_BLOCKS]);
		op_load(w, w->cfg->n_prompts);
		got = atomic_load(&w->sh->c[FH_C_BLOCKS_CHECKED]) - c0 - (atomic_load(&w->sh->c[FH_C_WRONG_BLOCKS]) - k0);
	}
	count(w, FH_C_SEAL_RESTORED, got);
}

static void ack(struct wctx *w, unsigned state, uint32_t seq)
{
	atomic_store(&w->sh->state, state);
	atomic_store(&w->sh->ack_seq, seq);
}

static __attribute__((noreturn)) void worker_main(const struct fh_worker_cfg *cfg, const struct fh_role *role,
						  struct fh_wshared *sh, uint64_t seed)
{
	struct wctx w = {.cfg = cfg, .role = role, .sh = sh, .g = {seed},
			 .n_ranks = role->kind == FH_ROLE_DCP ? 2 : 1};
	w.src_cur = rng_below(&w.g, cfg->num_blocks);
	w.dst_cur = rng_below(&w.g, cfg->num_blocks);
	uint32_t done_seq = 0;
	for (;;) {
		uint32_t seq = atomic_load(&sh->cmd_seq), cmd = atomic_load(&sh->cmd);
		if (cmd == FH_CMD_EXIT) {
			detach_all(&w);
			_exit(0);
		}
		if (!w.attached) {
			atomic_store(&sh->state, FH_W_ATTACHING);
			if (attach_all(&w)) {
				usleep(20000);
				continue;
			}
		}
		switch (cmd) {
		case FH_CMD_RUN: {
			atomic_store(&sh->state, FH_W_RUNNING);
			unsigned p = rng_below(&w.g, cfg->n_prompts);
			int errs = rng_below(&w.g, 100) < 40 ? op_store(&w, p) : op_load(&w, p);
			if (errs) /* an actor is restarting: do not spin on its -EPIPE */
				usleep(2000);
			else if (cfg->think_us)
				usleep(rng_below(&w.g, cfg->think_us));
			break;
		}
		case FH_CMD_VERIFY:
			if (done_seq != seq) {
				atomic_store(&sh->state, FH_W_RUNNING);
				if (cfg->seal)
					verify_seal(&w);
				for (unsigned p = 0; p < cfg->n_prompts && w.attached; p++) {
					op_load(&w, p);
					count(&w, FH_C_VERIFIED, 1);
				}
				if (!w.attached)
					break; /* a hang: attach and go through them again */
				done_seq = seq;
			}
			ack(&w, FH_W_VERIFIED, seq);
			(void)kvr_futex_wait(&sh->cmd_seq, seq, 100000000); /* until the next command */
			break;
		case FH_CMD_SEAL:
			if (done_seq != seq) {
				atomic_store(&sh->state, FH_W_RUNNING);
				/* quiet: an error is a transient one (an actor still starting) */
				for (unsigned t = 0; t < 50 && op_store(&w, cfg->n_prompts); t++)
					usleep(20000);
				if (!w.attached)
					break;
				count(&w, FH_C_SEAL_STORED, cfg->prompts[cfg->n_prompts].n * w.n_ranks);
				done_seq = seq;
			}
			ack(&w, FH_W_SEALED, seq);
			(void)kvr_futex_wait(&sh->cmd_seq, seq, 100000000);
			break;
		default: /* FH_CMD_QUIET: attached, doing nothing */
			ack(&w, FH_W_IDLE, seq);
			(void)kvr_futex_wait(&sh->cmd_seq, seq, 100000000);
			break;
		}
	}
}

pid_t fh_worker_spawn(const struct fh_worker_cfg *cfg, const struct fh_role *role, struct fh_wshared *sh,
		      uint64_t seed)
{
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(125);
		atomic_store(&sh->pid, (int32_t)getpid());
		worker_main(cfg, role, sh, seed);
	}
	return pid;
}

/* ---- the slot table ----------------------------------------------------------------------- */

bool fh_slot_offends(const struct kvr_slot_table *t, uint32_t i)
{
	uint32_t st = kvr_slot_state(t, i);
	return (st != KVR_SLOT_FREE && st != KVR_SLOT_COMMITTED) || kvr_slot_pins(t, i) > 0;
}

/* "attached, TP rank 1 of 2" / "free" / "detaching": who worker slot w is now. */
static const char *worker_now(const struct kvr_ctl *ctl, unsigned w, char *buf, size_t len)
{
	if (!ctl || w >= ctl->max_workers)
		return "not a worker slot";
	const struct kvr_worker_ent *we = kvr_ctl_worker(ctl, w);
	uint32_t st = atomic_load(&we->state);
	if (st == KVR_WORKER_ATTACHED)
		snprintf(buf, len, "attached: TP rank %u of %u, DCP rank %u of %u", we->tp_rank, we->tp_size,
			 we->dcp_rank, we->dcp_size);
	else
		snprintf(buf, len, "%s", st == KVR_WORKER_FREE ? "free" : "detaching");
	return buf;
}

void fh_slot_describe(const struct kvr_slot_table *t, const struct kvr_ctl *ctl, uint32_t i, char *buf, size_t len)
{
	const struct kvr_slot *s = kvr_slot_at(t, i);
	char pins[160] = "";
	size_t off = 0;
	for (unsigned o = 0; o < KVR_PIN_OWNERS; o++) {
		unsigned v = kvr_slot_pins_of(t, i, o);
		const char *who = o == KVR_PIN_LOOKUP ? "lookup" : o == KVR_PIN_IO ? "io" : o == KVR_PIN_REMOTE ? "remote" : "w";
		if (v && off < sizeof(pins))
			off += o < KVR_SLOT_MAX_WORKERS ? (size_t)snprintf(pins + off, sizeof(pins) - off, " %s%u:%u", who, o, v)
							: (size_t)snprintf(pins + off, sizeof(pins) - off, " %s:%u", who, v);
	}
	char who[96];
	snprintf(buf, len, "slot %u %s epoch %u key %016llx%016llx lane %u owner %u (%s) pins%s", i,
		 kvr_slot_state_name(kvr_slot_state(t, i)), kvr_slot_epoch(t, i), (unsigned long long)s->key.hi,
		 (unsigned long long)s->key.lo, s->lane, s->owner, worker_now(ctl, s->owner, who, sizeof(who)),
		 off ? pins : " none");
}

uint32_t fh_slots_offending(const struct kvr_slot_table *t, const struct kvr_ctl *ctl, bool dump, const char *what)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < t->n_slots; i++) {
		if (!fh_slot_offends(t, i))
			continue;
		n++;
		if (!dump)
			continue;
		char d[320];
		fh_slot_describe(t, ctl, i, d, sizeof(d));
		fprintf(stderr, "  %s: %s\n", what, d);
	}
	return n;
}

/* ---- which model a key is ----------------------------------------------------------------- */

static int key_cmp(kvr_key a, kvr_key b)
{
	if (a.hi != b.hi)
		return a.hi < b.hi ? -1 : 1;
	return a.lo < b.lo ? -1 : a.lo > b.lo;
}

static int ent_cmp(const void *a, const void *b)
{
	return key_cmp(((const struct fh_keyent *)a)->key, ((const struct fh_keyent *)b)->key);
}

int fh_keymap_add(struct fh_keymap *km, const struct fh_model *m, const struct fh_prompt *p, unsigned n)
{
	unsigned mi = 0;
	while (mi < km->n_models && km->models[mi] != m)
		mi++;
	if (mi == FH_MAX_MODELS)
		return -E2BIG;
	km->models[mi] = m;
	km->n_models = mi == km->n_models ? mi + 1 : km->n_models;
	for (unsigned i = 0; i < n; i++)
		for (unsigned b = 0; b < p[i].n; b++) {
			if (km->n == km->cap) {
				uint32_t cap = km->cap ? 2 * km->cap : 256;
				struct fh_keyent *e = realloc(km->e, cap * sizeof(*e));
				if (!e)
					return -ENOMEM;
				km->e = e;
				km->cap = cap;
			}
			km->e[km->n++] = (struct fh_keyent){.key = p[i].keys[b], .model = mi};
		}
	qsort(km->e, km->n, sizeof(*km->e), ent_cmp);
	return 0;
}

int fh_keymap_find(const struct fh_keymap *km, kvr_key key)
{
	const struct fh_keyent want = {.key = key};
	const struct fh_keyent *e = bsearch(&want, km->e, km->n, sizeof(*km->e), ent_cmp);
	return e ? (int)e->model : -1;
}

void fh_keymap_free(struct fh_keymap *km)
{
	free(km->e);
	memset(km, 0, sizeof(*km));
}

/* The model of key (the default without a keymap): its index in *ret_mi; NULL when no prompt has it. */
static const struct fh_model *model_of(const struct fh_keymap *km, kvr_key key, int *ret_mi)
{
	*ret_mi = km ? fh_keymap_find(km, key) : 0;
	return !km ? &fh_model_default : *ret_mi >= 0 ? km->models[*ret_mi] : NULL;
}

/* ---- the L1 bytes ------------------------------------------------------------------------ */

/* Slot i (COMMITTED when read) against its key's lane: 1 when wrong (printed), 0 when right,
 * -1 when it moved on meanwhile (not judged). */
static int l1_slot_check(const struct kvr_slot_table *t, void *arena_base, const struct fh_keymap *km, uint32_t i,
			 int *ret_mi)
{
	const struct kvr_slot *s = kvr_slot_at(t, i);
	kvr_key key = s->key;
	unsigned lane = s->lane;
	uint8_t tag = kvr_slot_model(t, i);
	const struct fh_model *m = model_of(km, key, ret_mi);
	uint32_t len = m ? fh_model_lane_bytes(m) : 0;
	uint8_t want[FH_LANE_BYTES];
	fh_lane_content(key, lane, want);
	const uint8_t *got = kvr_slot_data(t, arena_base, i);
	/* the slot may have moved on since we read its key: only a stable epoch counts */
	uint32_t ep = kvr_slot_epoch(t, i);
	bool bad = !m || memcmp(got, want, len) != 0;
	bool bad_tag = m && km && km->tag[*ret_mi] && tag != km->tag[*ret_mi];
	/* a table of several block sizes (no model section): each slot says its model's */
	uint32_t bt = s->block_tokens;
	bool bad_bt = m && !t->block_tokens && bt != fh_model_bt(m);
	/* ... and a table of several quorums: each slot says its block's lanes (the model's TP size) */
	unsigned lanes = kvr_slot_block_lanes(t, i);
	bool bad_lanes = m && !t->quorum && lanes != m->tp;
	if (kvr_slot_state(t, i) != KVR_SLOT_COMMITTED || kvr_slot_epoch(t, i) != ep)
		return -1;
	if (bad_bt)
		fprintf(stderr, "  L1: slot %u (key %016llx%016llx of model %s) says %u-token blocks, want %u\n", i,
			(unsigned long long)key.hi, (unsigned long long)key.lo, m->name, bt, fh_model_bt(m));
	if (bad_lanes)
		fprintf(stderr, "  L1: slot %u (key %016llx%016llx of model %s) says %u lanes a block, want %u\n", i,
			(unsigned long long)key.hi, (unsigned long long)key.lo, m->name, lanes, m->tp);
	if (!m)
		fprintf(stderr, "  L1: slot %u (key %016llx%016llx lane %u, epoch %u) holds a key of no prompt\n", i,
			(unsigned long long)key.hi, (unsigned long long)key.lo, lane, ep);
	if (bad_tag)
		fprintf(stderr, "  L1: slot %u (key %016llx%016llx of model %s) is tagged model entry %u, want %u\n", i,
			(unsigned long long)key.hi, (unsigned long long)key.lo, m->name, tag, km->tag[*ret_mi]);
	if (!m || !bad)
		return !m || bad_tag || bad_bt || bad_lanes;
	uint32_t o = 0;
	while (got[o] == want[o])
		o++;
	fprintf(stderr, "  L1: slot %u (key %016llx%016llx lane %u of model %s, epoch %u) holds wrong bytes from "
		"offset %u of %u (0x%02x, want 0x%02x)\n", i, (unsigned long long)key.hi, (unsigned long long)key.lo,
		lane, m->name, ep, o, len, got[o], want[o]);
	return 1;
}

uint32_t fh_l1_check(const struct kvr_slot_table *t, void *arena_base, const struct fh_keymap *km,
		     uint32_t *ret_checked)
{
	uint32_t wrong = 0, checked[FH_MAX_MODELS] = {0};
	for (uint32_t i = 0; i < t->n_slots; i++) {
		if (kvr_slot_state(t, i) != KVR_SLOT_COMMITTED)
			continue;
		int mi, r = l1_slot_check(t, arena_base, km, i, &mi);
		if (r < 0)
			continue;
		if (mi >= 0)
			checked[mi]++;
		wrong += (uint32_t)r;
	}
	if (ret_checked)
		memcpy(ret_checked, checked, (km ? km->n_models : 1) * sizeof(*checked));
	return wrong;
}

/* ---- L2 files ------------------------------------------------------------------------------ */

static void scan_file(const char *path, const char *name, kvr_key ns, const struct fh_keymap *km,
		      struct fh_l2_scan *acc)
{
	kvr_key key;
	uint32_t lane;
	if (kvr_l2_is_tmp_name(name)) {
		acc->tmp++;
		return;
	}
	if (kvr_l2_name_parse(name, &key, &lane))
		return; /* not a block file (the lock, ...) */
	acc->files++;
	const uint64_t size = kvr_l2_file_bytes(FH_LANE_BYTES);
	uint8_t *buf = malloc(size + 1);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 && buf ? pread(fd, buf, size + 1, 0) : -1;
	if (fd >= 0)
		close(fd);
	int mi;
	const struct fh_model *m = model_of(km, key, &mi);
	/* the header must say the block size of the key's model (several share a table without a model section) */
	struct kvr_l2_ident id = {.ns = ns, .fingerprint = ns, .block_tokens = m ? fh_model_bt(m) : FH_BT,
				  .lane_bytes = FH_LANE_BYTES};
	const struct kvr_l2_hdr *h = (const void *)buf;
	enum kvr_l2_reason why = n != (ssize_t)size ? KVR_L2_R_SIZE : kvr_l2_hdr_check(h, &id, key, lane);
	if (why == KVR_L2_OK)
		why = kvr_l2_payload_check(h, buf + KVR_L2_HDR_BYTES);
	if (why != KVR_L2_OK) {
		acc->damaged++;
		fprintf(stderr, "  L2: %s: damaged under a real name (%s; %zd bytes)\n", path, kvr_l2_reason_name(why), n);
		free(buf);
		return;
	}
	uint32_t len = m ? fh_model_lane_bytes(m) : 0;
	uint8_t want[FH_LANE_BYTES];
	fh_lane_content(key, lane, want);
	acc->bytes += len;
	const uint8_t *got = buf + KVR_L2_HDR_BYTES;
	if (!m) {
		acc->wrong++;
		fprintf(stderr, "  L2: %s: valid header and checksum, the key of no prompt\n", path);
	} else if (memcmp(got, want, len)) {
		uint32_t o = 0;
		while (got[o] == want[o])
			o++;
		acc->wrong++;
		fprintf(stderr, "  L2: %s: valid header and checksum, wrong bytes from offset %u of model %s's %u (0x%02x, "
			"want 0x%02x)\n", path, o, m->name, len, got[o], want[o]);
	} else {
		acc->ok++;
		acc->ok_by_model[mi]++;
	}
	free(buf);
}

void fh_l2_scan(const char *dir, kvr_key ns, const struct fh_keymap *km, struct fh_l2_scan *acc)
{
	char nsd[KVR_KEY_FMT_LEN], sub[512];
	snprintf(sub, sizeof(sub), "%s/%s", dir, kvr_l2_ns_dir_fmt(ns, nsd));
	DIR *d = opendir(sub);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[800];
		snprintf(path, sizeof(path), "%s/%s", sub, e->d_name);
		scan_file(path, e->d_name, ns, km, acc);
	}
	closedir(d);
}
