/* kvring-bench rank process: one emulated TP/DCP worker — KV memory, attach, cold/warm phases, memcpy baselines. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <kvring/kvring.h>

#include "bench.h"
#include "kvr_config.h"
#include "kvr_dcp.h"
#include "kvr_time.h"

#define WAIT_BATCH 64
#define REQ_WARM (1ull << 32)

/* ---- barrier ----------------------------------------------------------------------------- */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
	/* not FUTEX_PRIVATE_FLAG: the word is shared between processes */
	return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

void bench_barrier_init(struct bench_barrier *b, uint32_t parties)
{
	atomic_store(&b->arrived, 0);
	atomic_store(&b->gen, 0);
	atomic_store(&b->abort, 0);
	b->parties = parties;
}

int bench_barrier_wait(struct bench_barrier *b, int64_t timeout_ms)
{
	uint32_t gen = atomic_load(&b->gen);
	if (atomic_load(&b->abort))
		return -ECANCELED;
	if (atomic_fetch_add(&b->arrived, 1) + 1 == b->parties) {
		/* the last one in: reset before releasing, so a released party cannot arrive early */
		atomic_store(&b->arrived, 0);
		atomic_fetch_add(&b->gen, 1);
		(void)futex(&b->gen, FUTEX_WAKE, INT_MAX, NULL);
		return atomic_load(&b->abort) ? -ECANCELED : 0;
	}
	uint64_t deadline = kvr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	while (atomic_load(&b->gen) == gen) {
		uint64_t now = kvr_now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		uint64_t left = deadline - now;
		struct timespec ts = {.tv_sec = (time_t)(left / 1000000000ull), .tv_nsec = (long)(left % 1000000000ull)};
		(void)futex(&b->gen, FUTEX_WAIT, gen, &ts); /* EAGAIN (gen moved), EINTR, ETIMEDOUT: re-check */
	}
	return atomic_load(&b->abort) ? -ECANCELED : 0;
}

void bench_barrier_abort(struct bench_barrier *b)
{
	atomic_store(&b->abort, 1);
	atomic_fetch_add(&b->gen, 1); /* releases every waiter; they see abort */
	(void)futex(&b->gen, FUTEX_WAKE, INT_MAX, NULL);
}

/* ---- one rank ----------------------------------------------------------------------------- */

struct rank {
	struct bench_rank_ctx *x;
	const struct bench_opts *o;
	const struct bench_plan *pl;
	struct bench_rank_result *res;
	const struct bench_layout *lay; /* the layout attached now (pl->st or pl->ld) */
	struct kvr_geometry g;
	bool mla;
	uint32_t group;       /* DCP group: tp_rank / D */
	uint32_t lane;        /* the lane its group stores (MLA: 0) */
	int kv_fd;
	uint8_t *kv;          /* the engine's KV memory (lay->kv_bytes) */
	uint64_t kv_bytes;
	uint8_t *scratch;     /* memcpy baseline: num_blocks canonical lanes, laid out like slots */
	uint64_t scratch_bytes;
	struct kvr_client *c;
	uint32_t *tokens;     /* inflight x input_len */
	uint64_t *seeds;      /* inflight x full_blocks */
	uint32_t *blocks;     /* inflight x blocks_per_prompt: engine block ids */
	uint32_t inflight;
};

static void note(struct rank *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct rank *r, const char *fmt, ...)
{
	if (r->res->err[0])
		return;
	int n = snprintf(r->res->err, BENCH_ERR_MAX, "rank %u: ", r->x->rank);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->res->err + n, BENCH_ERR_MAX - (size_t)n, fmt, ap);
	va_end(ap);
}

/* Whether this rank keeps its group's cold-phase counts: DCP rank 0 (every rank when D = 1). */
static bool group_leader(const struct rank *r)
{
	return r->g.dcp_rank == 0;
}

/* Whether this rank stores in the cold phase: every group under MHA (one lane each), the first
 * group under MLA (every group holds the same latent). */
static bool storing(const struct rank *r)
{
	return r->group < r->pl->storing_groups;
}

/* Tokens, seeds and engine block ids of batch entry i holding prompt p. */
static void prepare_prompt(struct rank *r, uint32_t i, uint32_t p)
{
	uint32_t *tok = r->tokens + (size_t)i * r->o->input_len;
	bench_prompt_tokens(r->o, p, tok);
	bench_content_seeds(tok, r->pl->full_blocks, r->o->block_tokens, r->seeds + (size_t)i * r->pl->full_blocks);
	for (uint32_t b = 0; b < r->pl->blocks_per_prompt; b++)
		r->blocks[(size_t)i * r->pl->blocks_per_prompt + b] = i * r->pl->blocks_per_prompt + b;
}

static uint64_t seed_of(struct rank *r, uint32_t i, uint32_t b)
{
	return bench_block_seed(r->seeds[(size_t)i * r->pl->full_blocks + b], r->lane, r->mla);
}

/* Collect completions until `want` have arrived or the deadline passes; on_done is called for
 * each. Returns 0, or -ETIMEDOUT / the kvr_wait error (the caller gives up on the client). */
static int collect(struct rank *r, unsigned want, void (*on_done)(struct rank *, const struct kvr_completion *, void *),
		   void *arg)
{
	struct kvr_completion comp[WAIT_BATCH];
	uint64_t deadline = kvr_now_ns() + (uint64_t)r->o->timeout_ms * 1000000ull;
	unsigned got = 0;
	while (got < want) {
		uint64_t now = kvr_now_ns();
		if (now >= deadline) {
			note(r, "%u of %u completions missing after %lld ms", want - got, want, (long long)r->o->timeout_ms);
			return -ETIMEDOUT;
		}
		int n = kvr_wait(r->c, comp, WAIT_BATCH, (int64_t)((deadline - now + 999999) / 1000000));
		if (n < 0) {
			note(r, "kvr_wait: %s (%s)", strerror(-n), kvr_last_error(r->c));
			return n;
		}
		for (int k = 0; k < n; k++)
			on_done(r, &comp[k], arg);
		got += (unsigned)n;
	}
	return 0;
}

static int sync_all(struct rank *r, const char *where)
{
	int rc = bench_barrier_wait(r->x->barrier, r->o->timeout_ms * 4);
	if (rc == -ETIMEDOUT)
		note(r, "the other ranks did not reach %s", where);
	else if (rc)
		note(r, "another rank failed before %s", where);
	return rc;
}

/* The window of the current batch of this rank's group: its ranks' earliest batch_t0 to their
 * latest batch_t1 (a batch_t0 of 0: that rank sent nothing). Call after the batch's closing
 * barrier. */
static uint64_t group_window(const struct rank *r)
{
	const struct bench_rank_result *g = r->x->all + r->group * r->g.dcp_size;
	uint64_t t0 = UINT64_MAX, t1 = 0;
	for (uint32_t q = 0; q < r->g.dcp_size; q++) {
		if (!g[q].batch_t0)
			continue;
		t0 = g[q].batch_t0 < t0 ? g[q].batch_t0 : t0;
		t1 = g[q].batch_t1 > t1 ? g[q].batch_t1 : t1;
	}
	return t1 > t0 ? t1 - t0 : 0;
}

/* ---- cold ---------------------------------------------------------------------------------- */

static void store_done(struct rank *r, const struct kvr_completion *d, void *arg)
{
	(void)arg;
	struct bench_rank_result *res = r->res;
	if (d->op != KVR_OP_STORE_DONE) {
		res->st_errors++;
		note(r, "unexpected completion op %u for request %llu", d->op, (unsigned long long)d->req_id);
		return;
	}
	if (d->status) {
		res->st_errors++;
		note(r, "store of request %llu: %s (%u of %u blocks failed)", (unsigned long long)d->req_id,
		     strerror(-d->status), d->n_failed, d->n_blocks);
	}
	res->st_failed_blocks += d->n_failed;
	if (group_leader(r)) { /* every rank of a DCP group gets the group's counts */
		res->st_stored += d->n_stored;
		res->st_present += d->n_present;
		res->st_bytes += (uint64_t)d->n_stored * r->pl->lane_bytes;
	}
	if (!d->status && res->st_samples < r->o->prompts)
		r->x->samples.st_lat_ns[res->st_samples++] = d->diag.total_ns;
}

/* One batch of stores: every rank of a storing group sends its own STORE of the same prompts
 * (a DCP group's block is committed once all its ranks sent it). Window: submit -> last
 * completion of this rank, in res->batch_t0/t1. */
static int store_batch(struct rank *r, uint32_t base, uint32_t k)
{
	const struct bench_opts *o = r->o;
	const struct bench_plan *pl = r->pl;
	struct bench_rank_result *res = r->res;
	bool lead = group_leader(r);
	uint64_t t0 = kvr_now_ns();
	unsigned sent = 0;
	if (!res->st_first_ns)
		res->st_first_ns = t0;
	for (uint32_t i = 0; i < k; i++) {
		int rc = kvr_store(r->c, base + i + 1, r->tokens + (size_t)i * o->input_len, o->input_len, NULL, 0,
				   r->blocks + (size_t)i * pl->blocks_per_prompt, pl->full_blocks);
		if (lead) {
			res->st_requests++;
			res->st_tokens += o->input_len;
			res->st_blocks += pl->full_blocks;
		}
		if (rc) {
			res->st_errors++;
			note(r, "kvr_store(prompt %u): %s", base + i, kvr_last_error(r->c));
			continue;
		}
		sent++;
	}
	int rc = collect(r, sent, store_done, NULL);
	res->batch_t0 = t0;
	res->batch_t1 = kvr_now_ns();
	if (rc)
		res->st_errors++;
	return rc;
}

/* The cold phase in lockstep: every batch starts at a barrier, so the ranks of a group submit
 * together, and ends at one; then the group's rank 0 adds the group's window (its earliest
 * submit to its latest completion) to st_ns. Ranks that do not store meet the same barriers. */
static int phase_cold(struct rank *r)
{
	const struct bench_opts *o = r->o;
	const struct bench_plan *pl = r->pl;
	struct bench_rank_result *res = r->res;
	bool stores = storing(r);
	for (uint32_t base = 0; base < o->prompts; base += r->inflight) {
		uint32_t k = o->prompts - base < r->inflight ? o->prompts - base : r->inflight;
		if (stores) {
			uint64_t t = kvr_now_ns();
			for (uint32_t i = 0; i < k; i++) {
				prepare_prompt(r, i, base + i);
				for (uint32_t b = 0; b < pl->full_blocks; b++)
					bench_block_fill(&r->g, r->kv, r->blocks[(size_t)i * pl->blocks_per_prompt + b],
							 seed_of(r, i, b));
			}
			res->st_fill_ns += kvr_now_ns() - t;
		}
		int rc = sync_all(r, "a store batch");
		if (!rc && stores)
			rc = store_batch(r, base, k);
		if (!rc)
			rc = sync_all(r, "the end of a store batch");
		if (rc)
			return rc;
		if (stores && group_leader(r))
			res->st_ns += group_window(r);
	}
	return 0;
}

/* ---- warm ---------------------------------------------------------------------------------- */

struct warm_batch {
	uint32_t base, k;
	uint64_t t_load;             /* the first load's submit; 0 = none yet */
	uint32_t matched[1024];      /* per batch entry (concurrency <= 1024) */
	bool looked_up[1024];        /* the lookup succeeded: the entry has samples */
	int32_t status[1024];        /* load status; 1 = no completion (yet) */
	uint64_t lat_ns[1024], hash_ns[1024], index_ns[1024], rt_ns[1024];
	uint8_t *failed;             /* k x blocks_per_prompt: 1 = the loader reported the block failed */
};

static void load_done(struct rank *r, const struct kvr_completion *d, void *arg)
{
	struct warm_batch *wb = arg;
	struct bench_rank_result *res = r->res;
	uint64_t i = d->req_id - REQ_WARM - wb->base;
	if (d->op != KVR_OP_LOAD_DONE || d->req_id < REQ_WARM + wb->base || i >= wb->k || wb->status[i] != 1) {
		res->ld_errors++;
		note(r, "unexpected completion op %u for request %llu", d->op, (unsigned long long)d->req_id);
		return;
	}
	wb->status[i] = d->status;
	/* With an L1 smaller than the workload a block can be evicted between its lookup and its
	 * load: the loader reports it failed (-EIO, listed) and an engine recomputes it. With
	 * --allow-misses that is a miss, not an error (warm_verify checks nothing was written). */
	bool evicted = d->status == -EIO && d->n_failed && r->o->allow_misses;
	if (d->status && !evicted) {
		res->ld_errors++;
		note(r, "load of prompt %llu: %s (%u of %u blocks failed)", (unsigned long long)(wb->base + i),
		     strerror(-d->status), d->n_failed, d->n_blocks);
	}
	uint32_t bpp = r->pl->blocks_per_prompt;
	for (uint32_t f = 0; f < d->n_failed; f++) {
		uint32_t id = d->failed[f];
		if (id / bpp == i)
			wb->failed[i * bpp + id % bpp] = 1;
	}
	res->ld_failed_blocks += d->n_failed;
	wb->lat_ns[i] += d->diag.total_ns;
}

/* Lookup and load every entry of the batch; returns how many loads were submitted. */
static unsigned warm_submit(struct rank *r, struct warm_batch *wb)
{
	const struct bench_opts *o = r->o;
	struct bench_rank_result *res = r->res;
	unsigned sent = 0;
	for (uint32_t i = 0; i < wb->k; i++) {
		uint32_t p = wb->base + i;
		uint64_t req = REQ_WARM + p, t = kvr_now_ns();
		struct kvr_lookup_result lr;
		res->ld_requests++;
		res->ld_tokens += o->input_len;
		int rc = kvr_lookup(r->c, req, r->tokens + (size_t)i * o->input_len, o->input_len, NULL, 0, &lr);
		uint64_t now = kvr_now_ns();
		wb->lat_ns[i] = now - t;
		if (rc) {
			res->ld_errors++;
			note(r, "kvr_lookup(prompt %u): %s", p, kvr_last_error(r->c));
			continue;
		}
		if (lr.matched_blocks > r->pl->full_blocks) {
			res->ld_errors++;
			note(r, "lookup of prompt %u matched %u blocks of %u", p, lr.matched_blocks, r->pl->full_blocks);
			continue;
		}
		wb->looked_up[i] = true;
		wb->hash_ns[i] = lr.hash_ns;
		wb->index_ns[i] = lr.index_ns;
		wb->rt_ns[i] = lr.roundtrip_ns;
		res->ld_matched_blocks += lr.matched_blocks;
		res->ld_l2_blocks += lr.l2_blocks;
		res->ld_matched_tokens += lr.matched_tokens;
		if (!lr.matched_blocks) {
			wb->status[i] = 0;
			continue;
		}
		if (!wb->t_load)
			wb->t_load = now;
		if (kvr_load(r->c, req, r->blocks + (size_t)i * r->pl->blocks_per_prompt, lr.matched_blocks)) {
			res->ld_errors++;
			note(r, "kvr_load(prompt %u, %u blocks): %s", p, lr.matched_blocks, kvr_last_error(r->c));
			continue;
		}
		wb->matched[i] = lr.matched_blocks;
		sent++;
	}
	return sent;
}

/* Every loaded byte against the pattern; blocks that were not loaded must still be zero. */
static void warm_verify(struct rank *r, struct warm_batch *wb)
{
	struct bench_rank_result *res = r->res;
	uint32_t bpp = r->pl->blocks_per_prompt;
	for (uint32_t i = 0; i < wb->k; i++) {
		bool exact = wb->looked_up[i] &&
			     (wb->status[i] == 0 || (wb->status[i] == -EIO && r->o->allow_misses));
		for (uint32_t b = 0; b < bpp; b++) {
			uint32_t id = r->blocks[(size_t)i * bpp + b];
			if (b < wb->matched[i]) {
				if (wb->status[i] == 1) {
					exact = false;
					continue;
				}
				if (wb->failed[(size_t)i * bpp + b]) {
					/* failed: undefined, maybe partly written (a loader killed mid-copy, a
					 * cancel between two chunks; docs/api.md) — the engine recomputes it.
					 * Counted, not an error; an allowed miss keeps the prompt exact. */
					if (!bench_block_is_zero(&r->g, r->kv, id))
						res->ld_failed_written_blocks++;
					if (!r->o->allow_misses)
						exact = false;
					continue;
				}
				res->ld_bytes += r->lay->rank_bytes;
				if (!bench_block_check(&r->g, r->kv, id, seed_of(r, i, b))) {
					res->ld_mismatch_blocks++;
					exact = false;
					note(r, "prompt %u block %u: loaded bytes differ from the stored ones", wb->base + i, b);
				}
			} else if (!bench_block_is_zero(&r->g, r->kv, id)) {
				res->ld_stray_blocks++;
				exact = false;
				note(r, "prompt %u block %u: written although it was not loaded", wb->base + i, b);
			}
		}
		res->ld_exact_prompts += exact;
		if (wb->looked_up[i] && res->ld_samples < r->o->prompts) {
			uint64_t s = res->ld_samples++;
			r->x->samples.lat_ns[s] = wb->lat_ns[i];
			r->x->samples.hash_ns[s] = wb->hash_ns[i];
			r->x->samples.index_ns[s] = wb->index_ns[i];
			r->x->samples.rt_ns[s] = wb->rt_ns[i];
		}
	}
}

static int phase_warm(struct rank *r)
{
	const struct bench_opts *o = r->o;
	struct bench_rank_result *res = r->res;
	uint32_t bpp = r->pl->blocks_per_prompt;
	struct warm_batch *wb = calloc(1, sizeof(*wb));
	if (!wb || !(wb->failed = calloc((size_t)r->inflight * bpp, 1))) {
		free(wb);
		note(r, "out of memory");
		return -ENOMEM;
	}
	int rc = 0;
	uint32_t n_in = o->warm_concurrency && o->warm_concurrency < r->inflight ? o->warm_concurrency : r->inflight;
	for (uint32_t base = 0; base < o->prompts && !rc; base += n_in) {
		uint32_t k = o->prompts - base < n_in ? o->prompts - base : n_in;
		wb->base = base;
		wb->k = k;
		wb->t_load = 0;
		memset(wb->failed, 0, (size_t)k * bpp);
		for (uint32_t i = 0; i < k; i++) {
			prepare_prompt(r, i, base + i);
			for (uint32_t b = 0; b < bpp; b++)
				bench_block_zero(&r->g, r->kv, r->blocks[(size_t)i * bpp + b]);
			wb->matched[i] = 0;
			wb->looked_up[i] = false;
			wb->status[i] = 1;
		}
		rc = sync_all(r, "a load batch");
		if (rc)
			break;
		uint64_t t0 = kvr_now_ns();
		unsigned sent = warm_submit(r, wb);
		res->ld_lookup_ns += kvr_now_ns() - t0; /* a lookup answers after its promotions */
		rc = collect(r, sent, load_done, wb);
		uint64_t t1 = kvr_now_ns();
		res->ld_ns += t1 - t0;
		if (wb->t_load)
			res->ld_load_ns += t1 - wb->t_load;
		res->batch_t0 = wb->t_load;
		res->batch_t1 = t1;
		if (rc) {
			res->ld_errors++;
		} else {
			rc = sync_all(r, "the end of a load batch");
			if (!rc && group_leader(r))
				res->ld_group_ns += group_window(r);
		}
		uint64_t tv = kvr_now_ns();
		warm_verify(r, wb);
		res->ld_verify_ns += kvr_now_ns() - tv;
	}
	free(wb->failed);
	free(wb);
	return rc;
}

/* ---- memcpy baselines --------------------------------------------------------------------- */

/* The copy runs of every engine block of geometry g against canonical lane blk of the scratch
 * (slot offset blk x lane_bytes): runs of block b at *ret_runs + b * cap, counts in
 * (*ret_n)[b]. What kvringd's stages plan (kvr_dcp_lane_runs). 0 or -errno (noted). */
static int plan_runs(struct rank *r, const struct kvr_geometry *g, struct kvr_dcp_run **ret_runs, uint32_t **ret_n,
		     size_t *ret_cap)
{
	uint32_t nb = r->pl->num_blocks;
	size_t cap = kvr_dcp_lane_max_runs(g);
	struct kvr_dcp_run *runs = calloc((size_t)nb * cap, sizeof(*runs));
	uint32_t *n = calloc(nb, sizeof(*n));
	if (!runs || !n) {
		free(runs);
		free(n);
		note(r, "out of memory for the baseline's copy runs");
		return -ENOMEM;
	}
	for (uint32_t b = 0; b < nb; b++) {
		char err[160];
		int k = kvr_dcp_lane_runs(g, b, (uint64_t)b * r->pl->lane_bytes, runs + b * cap, cap, err, sizeof(err));
		if (k < 0) {
			note(r, "copy runs of block %u: %s", b, err[0] ? err : strerror(-k));
			free(runs);
			free(n);
			return k;
		}
		n[b] = (uint32_t)k;
	}
	*ret_runs = runs;
	*ret_n = n;
	*ret_cap = cap;
	return 0;
}

/* Group baseline, run by a group's rank 0: one thread copies what the group's gather actor
 * (one thread too) copied for a store, or what the group's loaders (one per rank) copied
 * for a load: n[q] blocks of every rank q's runs between its KV memory and
 * canonical lanes of the scratch (block j -> engine block and lane j mod num_blocks), in the
 * actor's order: a request's blocks (full_blocks of them) rank after rank. to_engine: scratch
 * -> KV (scatter, loads), else KV -> scratch (gather, stores). The other ranks' KV memory is
 * a resident buffer of the same layout. Sets *ret_ns; 0 or -errno. */
static int group_baseline(struct rank *r, const uint64_t *n, bool to_engine, uint64_t *ret_ns)
{
	uint32_t d = r->g.dcp_size, nb = r->pl->num_blocks;
	struct kvr_dcp_run *runs[KVR_DCP_MAX] = {0};
	uint32_t *counts[KVR_DCP_MAX] = {0};
	size_t cap = 0;
	uint8_t *kv[KVR_DCP_MAX] = {r->kv};
	uint64_t peer_bytes = (uint64_t)(d - 1) * r->kv_bytes, most = 0;
	void *peers = MAP_FAILED;
	int rc = 0;
	if (peer_bytes) {
		peers = mmap(NULL, peer_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (peers == MAP_FAILED) {
			rc = -errno;
			note(r, "baseline: the other ranks' KV memory (%llu bytes): %s", (unsigned long long)peer_bytes,
			     strerror(errno));
			return rc;
		}
		memset(peers, 0x3c, peer_bytes);
	}
	for (uint32_t q = 0; q < d && !rc; q++) {
		struct kvr_geometry g = r->g;
		g.tp_rank = r->group * d + q;
		g.dcp_rank = q;
		if (q)
			kv[q] = (uint8_t *)peers + (uint64_t)(q - 1) * r->kv_bytes;
		rc = plan_runs(r, &g, &runs[q], &counts[q], &cap);
		most = n[q] > most ? n[q] : most;
	}
	if (!rc) {
		uint32_t per_req = r->pl->full_blocks;
		uint64_t t0 = kvr_now_ns();
		for (uint64_t j0 = 0; j0 < most; j0 += per_req)
			for (uint32_t q = 0; q < d; q++)
				for (uint64_t j = j0; j < j0 + per_req && j < n[q]; j++) {
					uint32_t b = (uint32_t)(j % nb);
					const struct kvr_dcp_run *ru = runs[q] + b * cap;
					for (uint32_t k = 0; k < counts[q][b]; k++) {
						if (to_engine)
							memcpy(kv[q] + ru[k].kv_off, r->scratch + ru[k].slot_off, ru[k].len);
						else
							memcpy(r->scratch + ru[k].slot_off, kv[q] + ru[k].kv_off, ru[k].len);
					}
				}
		*ret_ns = kvr_now_ns() - t0;
		__asm__ volatile("" : : "r"(r->scratch), "r"(peers), "r"(r->kv) : "memory"); /* the copies are observable */
	}
	for (uint32_t q = 0; q < d; q++) {
		free(runs[q]);
		free(counts[q]);
	}
	if (peers != MAP_FAILED)
		munmap(peers, peer_bytes);
	return rc;
}

/* Load baseline, every rank: its runs of `n` blocks from canonical lanes of the scratch into
 * its KV memory (what its loads scattered), block after block. Sets *ret_ns; 0 or -errno. */
static int load_baseline(struct rank *r, uint64_t n, uint64_t *ret_ns)
{
	struct kvr_dcp_run *runs;
	uint32_t *counts, nb = r->pl->num_blocks;
	size_t cap;
	int rc = plan_runs(r, &r->g, &runs, &counts, &cap);
	if (rc)
		return rc;
	uint64_t t0 = kvr_now_ns();
	for (uint64_t j = 0; j < n; j++) {
		uint32_t b = (uint32_t)(j % nb);
		const struct kvr_dcp_run *ru = runs + b * cap;
		for (uint32_t k = 0; k < counts[b]; k++)
			memcpy(r->kv + ru[k].kv_off, r->scratch + ru[k].slot_off, ru[k].len);
	}
	*ret_ns = kvr_now_ns() - t0;
	__asm__ volatile("" : : "r"(r->scratch), "r"(r->kv) : "memory");
	free(runs);
	free(counts);
	return 0;
}

/* ---- setup ---------------------------------------------------------------------------------- */

/* Buffers that do not depend on the layout: the baseline's scratch, prompts, block ids. */
static int setup(struct rank *r)
{
	const struct bench_opts *o = r->o;
	const struct bench_plan *pl = r->pl;
	int rc;
	r->inflight = o->concurrency < o->prompts ? o->concurrency : o->prompts;
	r->scratch_bytes = (uint64_t)pl->num_blocks * pl->lane_bytes;
	void *sc = mmap(NULL, r->scratch_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (sc == MAP_FAILED) {
		rc = -errno;
		note(r, "baseline buffer of %llu bytes: %s", (unsigned long long)r->scratch_bytes, strerror(errno));
		return rc;
	}
	r->scratch = sc;
	memset(r->scratch, 0x5a, r->scratch_bytes); /* resident before anything is timed, as a warm arena is */
	r->tokens = calloc((size_t)r->inflight * o->input_len, sizeof(*r->tokens));
	r->seeds = calloc((size_t)r->inflight * pl->full_blocks, sizeof(*r->seeds));
	r->blocks = calloc((size_t)r->inflight * pl->blocks_per_prompt, sizeof(*r->blocks));
	if (!r->tokens || !r->seeds || !r->blocks) {
		note(r, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

/*
 * Wait until this rank's loader and storer (a DCP rank: its loader) have populated their
 * mappings (actors/runtime/populate.c: the arena as far as kvringd faulted it in, and our KV
 * memory), as they have long before an engine's first request — an engine attaches at
 * start. The actors populate in the background after they are ready; a request that comes
 * first faults pages in on the data path, which --cold-actors measures. Read from the
 * actor table of kvringd's control segment (INSPECT, read-only). Bounded by 120 s.
 */
static void wait_populated(struct rank *r)
{
	struct bench_server sv = {.name = "kvringd"};
	snprintf(sv.socket, sizeof(sv.socket), "%s", r->x->socket ? r->x->socket : KVR_CONFIG_DEFAULT_SOCKET);
	char err[256];
	uint64_t t0 = kvr_now_ns();
	if (bench_server_ctl(&sv, err, sizeof(err))) {
		note(r, "cannot read the actor table (%s): timing starts cold", err);
		return;
	}
	char names[2][KVR_ACTOR_NAME_MAX + 1];
	unsigned w = kvr_worker_slot(r->c), n_names = r->g.dcp_size > 1 ? 1 : 2;
	snprintf(names[0], sizeof(names[0]), "loader.%u", w);
	snprintf(names[1], sizeof(names[1]), "storer.%u", w);
	for (;;) {
		unsigned done = 0, n = atomic_load(&sv.ctl->n_actors);
		for (unsigned i = 0; i < n && i < sv.ctl->max_actors; i++) {
			const struct kvr_actor_ent *e = kvr_ctl_actor(sv.ctl, i);
			for (unsigned k = 0; k < n_names; k++) {
				uint64_t total = atomic_load(&e->populate_total);
				if (!strncmp(e->name, names[k], KVR_ACTOR_NAME_MAX) && total &&
				    atomic_load(&e->populated) >= total)
					done++;
			}
		}
		if (done == n_names)
			break;
		if (kvr_now_ns() - t0 > 120000000000ull) {
			note(r, "the actors did not populate their mappings within 120 s: timing starts now");
			break;
		}
		struct timespec ts = {.tv_nsec = 5 * 1000000};
		nanosleep(&ts, NULL);
	}
	r->res->populate_wait_ns = kvr_now_ns() - t0;
	kvr_segment_close(&sv.ctl_seg);
}

/* The KV memory and the attachment under layout lay: geometry, memfd, attach. A DCP rank's
 * kvr_attach returns once its whole group attached (the ranks attach concurrently). */
static int kv_open(struct rank *r, const struct bench_layout *lay)
{
	const struct bench_opts *o = r->o;
	int rc = bench_rank_geometry(o, r->pl, r->x->rank, lay->dcp, lay->interleave, &r->g);
	if (rc) {
		note(r, "geometry (dcp %u, interleave %u): %s", lay->dcp, lay->interleave, strerror(-rc));
		return rc;
	}
	r->lay = lay;
	r->mla = r->g.attention == KVR_ATTN_MLA;
	r->group = kvr_dcp_group_index(&r->g);
	r->lane = kvr_dcp_lane(&r->g);
	char name[64];
	snprintf(name, sizeof(name), "kvring-bench-kv.%u", r->x->rank);
	r->kv_fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (r->kv_fd < 0) {
		rc = -errno;
		note(r, "memfd_create: %s", strerror(errno));
		return rc;
	}
	if (ftruncate(r->kv_fd, (off_t)lay->kv_bytes) < 0) {
		rc = -errno;
		note(r, "KV memory of %llu bytes: %s", (unsigned long long)lay->kv_bytes, strerror(errno));
		return rc;
	}
	void *kv = mmap(NULL, lay->kv_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->kv_fd, 0);
	if (kv == MAP_FAILED) {
		rc = -errno;
		note(r, "mmap of the KV memory: %s", strerror(errno));
		return rc;
	}
	r->kv = kv;
	r->kv_bytes = lay->kv_bytes;
	memset(r->kv, 0, lay->kv_bytes); /* resident before anything is timed, as an engine's KV memory is */
	/* the model named, as an engine does: an instance without a model section requires it */
	const struct kvr_preset *pre = kvr_preset_find(o->model);
	struct kvr_attach_opts ao = {.socket = r->x->socket, .geometry = &r->g, .kv_fd = r->kv_fd,
				     .kv_bytes = lay->kv_bytes, .timeout_ms = o->timeout_ms,
				     .model_ns = pre && pre->hf_id ? pre->hf_id : o->model};
	rc = kvr_attach(&ao, &r->c);
	if (rc) {
		note(r, "kvr_attach(%s, dcp %u, interleave %u): %s (%s)", r->x->socket ? r->x->socket : "the default socket",
		     lay->dcp, lay->interleave, strerror(-rc), kvr_last_error(NULL));
		return rc;
	}
	if (!o->cold_actors)
		wait_populated(r);
	return 0;
}

static void kv_close(struct rank *r)
{
	kvr_detach(r->c);
	r->c = NULL;
	if (r->kv)
		munmap(r->kv, r->kv_bytes);
	r->kv = NULL;
	if (r->kv_fd >= 0)
		close(r->kv_fd);
	r->kv_fd = -1;
}

static void teardown(struct rank *r)
{
	kv_close(r);
	if (r->scratch)
		munmap(r->scratch, r->scratch_bytes);
	free(r->tokens);
	free(r->seeds);
	free(r->blocks);
}

int bench_rank_run(struct bench_rank_ctx *x)
{
	struct rank r = {.x = x, .o = x->o, .pl = x->pl, .res = x->res, .kv_fd = -1};
	const struct bench_plan *pl = x->pl;
	bool cold = x->o->phases & BENCH_COLD, warm = x->o->phases & BENCH_WARM;
	int rc = setup(&r);
	if (!rc)
		rc = kv_open(&r, cold ? &pl->st : &pl->ld);
	if (!rc)
		rc = sync_all(&r, "the start");
	if (!rc && cold) {
		rc = phase_cold(&r);
		if (!rc)
			rc = sync_all(&r, "the end of the cold phase");
		if (!rc && x->gate && (rc = bench_barrier_wait(x->gate, x->o->timeout_ms * 4)))
			note(&r, "the bench did not release the ranks after the cold phase (%s)", strerror(-rc));
		if (!rc && storing(&r) && group_leader(&r)) {
			uint64_t n[KVR_DCP_MAX];
			for (uint32_t q = 0; q < r.g.dcp_size; q++)
				n[q] = x->res->st_stored; /* every rank sent its shard of every stored block */
			rc = group_baseline(&r, n, false, &x->res->st_memcpy_ns);
		}
		if (!rc)
			rc = sync_all(&r, "the end of the store baseline");
	}
	if (!rc && warm && r.lay != &pl->ld &&
	    (pl->ld.dcp != pl->st.dcp || pl->ld.interleave != pl->st.interleave)) {
		/* cross-layout: every rank leaves, then attaches again under the warm layout */
		kv_close(&r);
		rc = sync_all(&r, "the detach of every rank");
		if (!rc)
			rc = kv_open(&r, &pl->ld);
		if (!rc)
			rc = sync_all(&r, "the attach under the warm layout");
	}
	if (!rc && warm) {
		rc = phase_warm(&r);
		if (!rc)
			rc = sync_all(&r, "the end of the warm phase");
		if (!rc)
			rc = load_baseline(&r, x->res->ld_bytes / r.lay->rank_bytes, &x->res->ld_memcpy_ns);
		if (!rc)
			rc = sync_all(&r, "the end of the load baseline");
		if (!rc && group_leader(&r)) {
			uint64_t n[KVR_DCP_MAX];
			for (uint32_t q = 0; q < r.g.dcp_size; q++)
				n[q] = x->all[r.group * r.g.dcp_size + q].ld_bytes / r.lay->rank_bytes;
			rc = group_baseline(&r, n, true, &x->res->ld_group_memcpy_ns);
		}
		if (!rc)
			rc = sync_all(&r, "the end of the group load baseline");
	}
	if (rc)
		bench_barrier_abort(x->barrier);
	teardown(&r);
	return rc;
}
