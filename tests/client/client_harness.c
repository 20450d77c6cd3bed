/* Harness for the L1 data-path tests: a real kvringd with a small model, libkvring ranks over memfd KV memory. */
#include "client_harness.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvr_list.h"

#define MAX_RANKS 16
#define MAX_CHILDREN 16

static struct ct_rank rank_pool[MAX_RANKS]; /* outlives the test body: teardown closes them */
static bool rank_used[MAX_RANKS];
static pid_t children[MAX_CHILDREN];

void ct_init(struct ct_env *e)
{
	memset(e, 0, sizeof(*e));
	e->slots_seg.fd = e->ctl_seg.fd = e->arena_seg.fd = -1;
	h_init(&e->h, 0700);
}

void ct_track_child(pid_t pid)
{
	for (unsigned i = 0; i < MAX_CHILDREN; i++)
		if (!children[i]) {
			children[i] = pid;
			return;
		}
	cr_assert_fail("too many children");
}

void ct_untrack_child(pid_t pid)
{
	for (unsigned i = 0; i < MAX_CHILDREN; i++)
		if (children[i] == pid)
			children[i] = 0;
}

const struct ct_model ct_tiny = {.layers = 2, .kv_heads = 2, .head_dim = 16, .dtype_bytes = 2, .block_tokens = 16,
				 .tp_size = 1};
const struct ct_model ct_tiny_tp2 = {.layers = 2, .kv_heads = 2, .head_dim = 16, .dtype_bytes = 2, .block_tokens = 16,
				     .tp_size = 2};

void ct_fini(struct ct_env *e)
{
	ct_close_all();
	for (unsigned i = 0; i < MAX_CHILDREN; i++)
		if (children[i] > 0) {
			(void)kill(children[i], SIGKILL);
			(void)waitpid(children[i], NULL, 0);
			children[i] = 0;
		}
	if (e->slots_seg.base)
		kvr_segment_close(&e->slots_seg);
	if (e->ctl_seg.base)
		kvr_segment_close(&e->ctl_seg);
	if (e->arena_seg.base)
		kvr_segment_close(&e->arena_seg);
	h_fini(&e->h);
}

uint64_t ct_lane_bytes(const struct ct_model *m)
{
	uint32_t per_rank = m->kv_heads >= m->tp_size ? m->kv_heads / m->tp_size : 1;
	return (uint64_t)m->layers * 2 * m->block_tokens * per_rank * m->head_dim * m->dtype_bytes;
}


void ct_start(struct ct_env *e, const struct ct_model *m, const struct ct_opts *o)
{
	static const struct ct_opts none;
	if (!o)
		o = &none;
	e->m = *m;
	e->lane_bytes = ct_lane_bytes(m);
	uint64_t slot = kvr_slots_slot_bytes(e->lane_bytes);
	uint32_t n_slots = o->l1_slots ? o->l1_slots : 64;
	char l2[768] = "";
	if (o->l2_dir)
		snprintf(l2, sizeof(l2),
			 ",\n  \"l2\": {\"dirs\": [\"%s\"%s%s%s], \"capacity_bytes\": %llu, \"durability\": \"block\", "
			 "\"mode\": \"%s\"%s}",
			 o->l2_dir, o->l2_dir2 ? ", \"" : "", o->l2_dir2 ? o->l2_dir2 : "", o->l2_dir2 ? "\"" : "",
			 (unsigned long long)(o->l2_bytes ? o->l2_bytes : 64ull << 20),
			 o->l2_mode ? o->l2_mode : "write-through", o->l2_extra ? o->l2_extra : "");
	char dcp[64] = "";
	if (o->dcp_timeout_ms)
		snprintf(dcp, sizeof(dcp), ",\n  \"dcp\": {\"store_timeout_ms\": %u}", o->dcp_timeout_ms);
	char sup[512], sections[3072];
	snprintf(sup, sizeof(sup),
		 "\"ready_timeout_ms\": 3000, \"stable_after_ms\": 1000, \"restart_backoff_initial_ms\": 20, "
		 "\"restart_backoff_max_ms\": 200, \"crash_loop_window_s\": 10, \"crash_loop_max_deaths\": %u, "
		 "\"health_interval_ms\": %u, \"drain_timeout_ms\": 3000%s",
		 o->crash_loop_max ? o->crash_loop_max : 5, o->health_ms ? o->health_ms : 1000,
		 o->sup_extra ? o->sup_extra : "");
	char model[256];
	if (o->no_model)
		snprintf(model, sizeof(model), "{}");
	else
		snprintf(model, sizeof(model),
			 "{\"preset\": \"\", \"model_id\": \"test/tiny\", \"layers\": %u, \"kv_heads\": %u,\n"
			 "    \"head_dim\": %u, \"dtype_bytes\": %u, \"block_tokens\": %u, \"tp_size\": %u}",
			 m->layers, m->kv_heads, m->head_dim, m->dtype_bytes, m->block_tokens, m->tp_size);
	snprintf(sections, sizeof(sections),
		 ",\n  \"model\": %s,\n"
		 "  \"l1\": {\"capacity_bytes\": %llu, \"huge_pages\": %s, \"eviction\": \"%s\"%s},\n"
		 "  \"staging\": {\"ceiling_bytes\": %llu, \"load_percent\": %u, \"buffer_bytes\": %llu}%s%s%s",
		 model,
		 (unsigned long long)(KVR_SLOTS_ARENA_DATA_OFF + (uint64_t)n_slots * slot),
		 o->huge_pages || getenv("KVR_TEST_HUGE_PAGES") ? "true" : "false", o->eviction ? o->eviction : "lru",
		 o->l1_extra ? o->l1_extra : "",
		 (unsigned long long)(o->staging_ceiling ? o->staging_ceiling : 64 * e->lane_bytes),
		 o->load_percent ? o->load_percent : 50, (unsigned long long)o->staging_buffer, l2, dcp,
		 o->sections_extra ? o->sections_extra : "");
	h_write_config_with(&e->h, NULL, o->max_workers ? o->max_workers : m->tp_size, sup, sections);
	h_start(&e->h);
	e->n_slots = n_slots;
	h_daemon_ctl(&e->h, 1, &e->ctl_seg);
	int rc = kvr_ctl_attach(&e->ctl_seg, &e->ctl, &e->rings);
	cr_assert_eq(rc, 0);
	if (!o->no_model)
		ct_map_l1(e);
}

void ct_map_l1(struct ct_env *e)
{
	struct kvr_actor_ent *lk = h_actor(&e->h, "lookup");
	(void)H_WAIT(atomic_load(&lk->state) == KVR_ACTOR_READY || atomic_load(&lk->state) == KVR_ACTOR_FAILED, 3000);
	cr_assert(lk && atomic_load(&lk->state) == KVR_ACTOR_READY, "lookup not READY; log:\n%s",
		  h_read_file(e->h.log));

	int fd = h_daemon_memfd(e->h.pid, "kvring-slots", O_RDONLY);
	int rc = kvr_segment_map(fd, KVR_SEG_SLOTS, 0, &e->slots_seg);
	close(fd);
	cr_assert_eq(rc, 0, "map the slot table: %s", strerror(-rc));
	rc = kvr_slots_attach(&e->slots_seg, &e->slots);
	cr_assert_eq(rc, 0, "slot table: %s", strerror(-rc));
	cr_assert_eq(e->slots->n_slots, e->n_slots, "slots sized from the lane (%llu bytes)",
		     (unsigned long long)e->lane_bytes);
	cr_assert_eq(e->slots->slot_bytes, kvr_slots_slot_bytes(e->lane_bytes));

	fd = h_daemon_memfd(e->h.pid, "kvring-arena", O_RDONLY);
	rc = kvr_segment_map(fd, KVR_SEG_ARENA, 0, &e->arena_seg);
	close(fd);
	cr_assert_eq(rc, 0, "map the arena: %s", strerror(-rc));
}

/* ---- ranks -------------------------------------------------------------------------- */

int ct_rank_open(struct ct_env *e, unsigned rank, uint32_t num_blocks, uint32_t head_dim, struct ct_rank **ret)
{
	return ct_rank_open_engine(e, rank, num_blocks, head_dim, NULL, NULL, ret);
}

int ct_rank_open_engine(struct ct_env *e, unsigned rank, uint32_t num_blocks, uint32_t head_dim,
			const char *engine_id, const char *model_ns, struct ct_rank **ret)
{
	unsigned slot = 0;
	while (slot < MAX_RANKS && rank_used[slot])
		slot++;
	cr_assert(slot < MAX_RANKS, "too many ranks");
	struct ct_rank *r = &rank_pool[slot];
	memset(r, 0, sizeof(*r));
	r->kv_fd = -1;
	r->rank = rank;
	rank_used[slot] = true;
	const struct ct_model *m = &e->m;
	uint32_t per_rank = m->kv_heads >= m->tp_size ? m->kv_heads / m->tp_size : 1;
	int rc = kvr_geometry_fill_vllm_layer_major(&r->g, m->layers, per_rank, head_dim ? head_dim : m->head_dim,
						    m->dtype_bytes, m->block_tokens, num_blocks);
	cr_assert_eq(rc, 0);
	r->g.tp_size = m->tp_size;
	r->g.tp_rank = rank;
	r->kv_bytes = kvr_geometry_kv_extent(&r->g);
	r->kv_fd = memfd_create("ct-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert(r->kv_fd >= 0);
	cr_assert_eq(ftruncate(r->kv_fd, (off_t)r->kv_bytes), 0);
	r->kv = mmap(NULL, r->kv_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->kv_fd, 0);
	cr_assert(r->kv != MAP_FAILED);
	for (uint32_t b = 0; b < num_blocks; b++)
		ct_fill(r, b, CT_CANARY);
	struct kvr_attach_opts ao = {.socket = e->h.sock, .geometry = &r->g, .kv_fd = r->kv_fd, .kv_bytes = r->kv_bytes,
				     .timeout_ms = 5000, .engine_id = engine_id, .model_ns = model_ns};
	rc = kvr_attach(&ao, &r->c);
	if (rc) {
		ct_rank_close(r);
		return rc;
	}
	r->worker = kvr_worker_slot(r->c);
	/* the slot may have got a fresh area since the test mapped the control segment */
	if (e->ctl_seg.base)
		h_daemon_areas(&e->h, 1, &e->ctl_seg);
	*ret = r;
	return 0;
}

void ct_rank_close(struct ct_rank *r)
{
	if (!r)
		return;
	kvr_detach(r->c);
	r->c = NULL;
	if (r->kv && r->kv != MAP_FAILED)
		munmap(r->kv, r->kv_bytes);
	r->kv = NULL;
	if (r->kv_fd >= 0)
		close(r->kv_fd);
	r->kv_fd = -1;
	for (unsigned i = 0; i < MAX_RANKS; i++)
		if (r == &rank_pool[i])
			rank_used[i] = false;
}

void ct_close_all(void)
{
	for (unsigned i = 0; i < MAX_RANKS; i++)
		if (rank_used[i])
			ct_rank_close(&rank_pool[i]);
}

void ct_stop_clean(struct ct_env *e)
{
	ct_close_all();
	cr_assert_eq(kill(e->h.pid, SIGTERM), 0);
	int st = h_wait_exit(e->h.pid, 10000);
	cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvringd exit %d", st);
	e->h.pid = 0;
	kvr_segment_close(&e->slots_seg);
	kvr_segment_close(&e->ctl_seg);
	kvr_segment_close(&e->arena_seg);
	e->slots = NULL;
}

/* ---- bytes -------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* Word w (8 bytes) of region `reg` of a block holding tag on rank. */
static inline uint64_t word(uint64_t tag, unsigned rank, unsigned reg, uint64_t w)
{
	if (tag == CT_CANARY)
		return CT_CANARY;
	return mix64(tag * 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank << 56) ^ ((uint64_t)reg << 40) ^ w);
}

static void gen_page(uint8_t *dst, uint32_t bytes, uint64_t tag, unsigned rank, unsigned reg)
{
	for (uint32_t i = 0; i < bytes; i += 8) {
		uint64_t v = word(tag, rank, reg, i / 8);
		memcpy(dst + i, &v, bytes - i < 8 ? bytes - i : 8);
	}
}

void ct_fill(const struct ct_rank *r, uint32_t block, uint64_t tag)
{
	cr_assert(block < r->g.num_blocks);
	for (unsigned reg = 0; reg < r->g.n_regions; reg++) {
		struct kvr_region g = kvr_geometry_region(&r->g, reg);
		gen_page(r->kv + g.offset + (uint64_t)block * g.stride, g.page_bytes, tag, r->rank, reg);
	}
}

bool ct_holds(const struct ct_rank *r, uint32_t block, uint64_t tag, char *why, size_t whylen)
{
	for (unsigned reg = 0; reg < r->g.n_regions; reg++) {
		struct kvr_region g = kvr_geometry_region(&r->g, reg);
		const uint8_t *p = r->kv + g.offset + (uint64_t)block * g.stride;
		uint8_t *want = malloc(g.page_bytes);
		cr_assert(want);
		gen_page(want, g.page_bytes, tag, r->rank, reg);
		bool same = memcmp(p, want, g.page_bytes) == 0;
		if (!same && why) {
			uint32_t i = 0;
			while (p[i] == want[i])
				i++;
			snprintf(why, whylen, "rank %u block %u region %u byte %u of %u: 0x%02x, want 0x%02x", r->rank,
				 block, reg, i, g.page_bytes, p[i], want[i]);
		}
		free(want);
		if (!same)
			return false;
	}
	return true;
}

bool ct_slot_holds(const struct ct_env *e, const struct ct_rank *r, uint32_t slot, uint64_t tag, char *why,
		   size_t whylen)
{
	const uint8_t *p = kvr_slot_data(e->slots, e->arena_seg.base, slot);
	cr_assert(p, "slot %u out of range", slot);
	uint64_t off = 0;
	for (unsigned reg = 0; reg < r->g.n_regions; reg++) {
		uint32_t bytes = r->g.page_bytes[reg];
		cr_assert(off + bytes <= e->slots->slot_bytes);
		uint8_t *want = malloc(bytes);
		cr_assert(want);
		gen_page(want, bytes, tag, r->rank, reg);
		bool same = memcmp(p + off, want, bytes) == 0;
		free(want);
		if (!same) {
			if (why)
				snprintf(why, whylen, "slot %u region %u (lane offset %llu) differs", slot, reg,
					 (unsigned long long)off);
			return false;
		}
		off += bytes;
	}
	return true;
}

/* ---- prompts ------------------------------------------------------------------------ */

void ct_prompt(uint32_t *tokens, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		tokens[i] = (uint32_t)mix64(seed * 0x100000001b3ull + i) % 151000u;
}

void ct_keys(const struct ct_env *e, const uint32_t *tokens, size_t n_tokens, kvr_key *ret_keys)
{
	int n = kvr_keys_chain(e->slots->ns, tokens, n_tokens, e->slots->block_tokens, NULL, 0, ret_keys,
			       n_tokens / e->slots->block_tokens);
	cr_assert_eq(n, (int)(n_tokens / e->slots->block_tokens));
}

/* ---- operations --------------------------------------------------------------------- */

void ct_wait_done(struct ct_rank *r, struct ct_done *ret, int64_t timeout_ms)
{
	struct kvr_completion c;
	int n = kvr_wait(r->c, &c, 1, timeout_ms);
	cr_assert_eq(n, 1, "rank %u: no completion within %lld ms (%d: %s)", r->rank, (long long)timeout_ms, n,
		     kvr_last_error(r->c));
	cr_assert(c.n_failed <= CT_MAX_FAILED);
	ret->c = c;
	if (c.n_failed)
		memcpy(ret->failed, c.failed, c.n_failed * sizeof(uint32_t));
	ret->c.failed = ret->failed;
}

void ct_store(struct ct_rank *r, uint64_t req, const uint32_t *tokens, size_t n_tokens, const uint32_t *blocks,
	      size_t n_blocks, struct ct_done *ret)
{
	int rc = kvr_store(r->c, req, tokens, n_tokens, NULL, 0, blocks, n_blocks);
	cr_assert_eq(rc, 0, "rank %u store: %s", r->rank, kvr_last_error(r->c));
	ct_wait_done(r, ret, 5000);
	cr_assert_eq(ret->c.op, KVR_OP_STORE_DONE);
	cr_assert_eq(ret->c.req_id, req);
	cr_assert_eq(ret->c.n_blocks, n_blocks);
}

uint32_t ct_lookup(struct ct_rank *r, uint64_t req, const uint32_t *tokens, size_t n_tokens)
{
	struct kvr_lookup_result res;
	int rc = kvr_lookup(r->c, req, tokens, n_tokens, NULL, 0, &res);
	cr_assert_eq(rc, 0, "rank %u lookup: %s", r->rank, kvr_last_error(r->c));
	cr_assert_eq(res.matched_tokens, res.matched_blocks * r->g.block_tokens);
	return res.matched_blocks;
}

uint32_t ct_lookup_load_exact(struct ct_rank *r, uint64_t req, const uint32_t *tokens, size_t n_tokens, uint32_t dst0,
			      uint64_t tag0)
{
	uint32_t got = ct_lookup(r, req, tokens, n_tokens);
	if (!got)
		return 0;
	uint32_t dst[64];
	cr_assert_leq(got, 64);
	for (uint32_t i = 0; i < got; i++)
		dst[i] = dst0 + i;
	struct ct_done d;
	ct_load(r, req, dst, got, &d);
	cr_assert_eq(d.c.status, 0, "request %llu: load %d (%u failed)", (unsigned long long)req, d.c.status,
		     d.c.n_failed);
	for (uint32_t i = 0; i < got; i++) {
		char why[200] = "";
		cr_assert(ct_holds(r, dst[i], tag0 + i, why, sizeof(why)), "request %llu block %u: WRONG BYTES: %s",
			  (unsigned long long)req, i, why);
	}
	return got;
}

pid_t ct_spawn_rank_child(const struct ct_env *e, unsigned rank, uint32_t num_blocks, const uint32_t *lookup_tokens,
			  size_t n_lookup_tokens, int *ret_worker)
{
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		close(pfd[0]);
		struct kvr_geometry g;
		int val = kvr_geometry_fill_vllm_layer_major(&g, e->m.layers, e->m.kv_heads / e->m.tp_size, e->m.head_dim,
							     e->m.dtype_bytes, e->m.block_tokens, num_blocks);
		g.tp_size = e->m.tp_size;
		g.tp_rank = rank;
		int kv = memfd_create("ct-child-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		struct kvr_client *c = NULL;
		if (!val && (kv < 0 || ftruncate(kv, (off_t)kvr_geometry_kv_extent(&g)) < 0))
			val = -errno;
		if (!val) {
			struct kvr_attach_opts o = {.socket = e->h.sock, .geometry = &g, .kv_fd = kv,
						    .kv_bytes = kvr_geometry_kv_extent(&g), .timeout_ms = 5000};
			val = kvr_attach(&o, &c);
			if (!val)
				val = (int)kvr_worker_slot(c);
		}
		if (write(pfd[1], &val, sizeof(val)) != sizeof(val) || val < 0)
			_exit(1);
		if (lookup_tokens) {
			struct kvr_lookup_result res;
			(void)kvr_lookup(c, 1, lookup_tokens, n_lookup_tokens, NULL, 0, &res);
		}
		for (;;)
			pause();
	}
	close(pfd[1]);
	ct_track_child(pid);
	struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
	cr_assert_eq(poll(&pf, 1, 8000), 1, "the rank %u child did not report", rank);
	int val = -1;
	cr_assert_eq(read(pfd[0], &val, sizeof(val)), (ssize_t)sizeof(val));
	close(pfd[0]);
	cr_assert(val >= 0, "the rank %u child could not attach: %s", rank, strerror(-val));
	*ret_worker = val;
	return pid;
}

void ct_load(struct ct_rank *r, uint64_t req, const uint32_t *blocks, size_t n_blocks, struct ct_done *ret)
{
	int rc = kvr_load(r->c, req, blocks, n_blocks);
	cr_assert_eq(rc, 0, "rank %u load: %s", r->rank, kvr_last_error(r->c));
	ct_wait_done(r, ret, 5000);
	cr_assert_eq(ret->c.op, KVR_OP_LOAD_DONE);
	cr_assert_eq(ret->c.req_id, req);
	cr_assert_eq(ret->c.n_blocks, n_blocks);
}

/* ---- slot table and actors ---------------------------------------------------------- */

int ct_find_slot(const struct ct_env *e, kvr_key key, unsigned lane)
{
	for (uint32_t i = 0; i < e->slots->n_slots; i++) {
		const struct kvr_slot *s = kvr_slot_at(e->slots, i);
		if (kvr_slot_state(e->slots, i) != KVR_SLOT_FREE && s->lane == lane && kvr_key_eq(s->key, key))
			return (int)i;
	}
	return -1;
}

uint32_t ct_count_state(const struct ct_env *e, unsigned state)
{
	struct kvr_slot_counts n;
	kvr_slots_counts(e->slots, &n);
	return n.by_state[state];
}

pid_t ct_actor_pid(const struct ct_env *e, const char *name)
{
	struct kvr_actor_ent *a = h_actor(&e->h, name);
	cr_assert(a, "no actor %s", name);
	return atomic_load(&a->pid);
}

uint32_t ct_actor_gen(const struct ct_env *e, const char *name)
{
	struct kvr_actor_ent *a = h_actor(&e->h, name);
	cr_assert(a, "no actor %s", name);
	return atomic_load(&a->generation);
}

pid_t ct_wait_ready(const struct ct_env *e, const char *name, pid_t old_pid, int ms)
{
	struct kvr_actor_ent *a = h_actor(&e->h, name);
	cr_assert(a, "no actor %s", name);
	bool ok = H_WAIT(atomic_load(&a->state) == KVR_ACTOR_READY && atomic_load(&a->pid) > 0 &&
				 atomic_load(&a->pid) != old_pid,
			 ms);
	cr_assert(ok, "%s not READY (new pid) within %d ms: state %s pid %d", name, ms,
		  kvr_actor_state_name(atomic_load(&a->state)), (int)atomic_load(&a->pid));
	return atomic_load(&a->pid);
}

static char proc_state(pid_t pid)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	char *st = h_read_file(p);
	char *rp = strrchr(st, ')');
	char s = rp && rp[1] == ' ' ? rp[2] : '?';
	free(st);
	return s;
}

void ct_stop_process(pid_t pid)
{
	cr_assert(pid > 0);
	cr_assert_eq(kill(pid, SIGSTOP), 0);
	cr_assert(H_WAIT(proc_state(pid) == 'T', 2000), "pid %d did not stop", (int)pid);
}

uint64_t ct_stat(const struct ct_env *e, const char *actor, unsigned s)
{
	return h_stat(&e->h, actor, s);
}

struct kvr_ring *ct_ring(const struct ct_env *e, const char *name)
{
	int i = kvr_ctl_find_ring(e->ctl, name);
	cr_assert(i >= 0, "no ring %s", name);
	return kvr_ctl_ring(&e->rings, (unsigned)i);
}

int ct_recv_msg(struct kvr_ring *ring, uint64_t req_id, struct kvr_msg *ret, int ms)
{
	for (int t = 0; t <= ms; t++) {
		while (kvr_ring_try_dequeue(ring, ret) == 0)
			if (ret->hdr.req_id == req_id)
				return 0;
		usleep(1000);
	}
	return -ETIMEDOUT;
}

int ct_recv_list(struct kvr_ring *ring, unsigned type, uint64_t req_id, void *items, uint32_t cap, int ms)
{
	struct kvr_list_asm l;
	kvr_list_asm_init(&l, type);
	int rc = -ETIMEDOUT;
	struct kvr_msg m;
	while (ct_recv_msg(ring, req_id, &m, ms) == 0) {
		int fed = kvr_list_feed(&l, &m);
		if (fed < 0) {
			rc = fed;
			break;
		}
		if (fed == 1) {
			if (l.total > cap) {
				rc = -E2BIG;
				break;
			}
			memcpy(items, l.items, (size_t)l.total * kvr_msg_list_item_size(type));
			rc = (int)l.total;
			break;
		}
	}
	kvr_list_asm_free(&l);
	return rc;
}

bool ct_table_clean(const struct ct_env *e)
{
	struct kvr_slot_counts c;
	kvr_slots_counts(e->slots, &c);
	return c.by_state[KVR_SLOT_WRITING] == 0 && c.by_state[KVR_SLOT_EVICTING] == 0 &&
	       c.by_state[KVR_SLOT_DRAINING] == 0 && c.invalid == 0 && c.pins == 0;
}

void ct_assert_table_clean(const struct ct_env *e)
{
	if (H_WAIT(ct_table_clean(e), 5000))
		return;
	for (uint32_t s = 0; s < e->slots->n_slots; s++) {
		const struct kvr_slot *sl = kvr_slot_at(e->slots, s);
		uint32_t st = kvr_slot_state(e->slots, s);
		if (st != KVR_SLOT_FREE && (st != KVR_SLOT_COMMITTED || kvr_slot_pins(e->slots, s)))
			cr_log_error("slot %u: %s owner %u lane %u pins %u (io %u lookup %u)", s, kvr_slot_state_name(st),
				     sl->owner, sl->lane, kvr_slot_pins(e->slots, s), kvr_slot_pins_of(e->slots, s, KVR_PIN_IO),
				     kvr_slot_pins_of(e->slots, s, KVR_PIN_LOOKUP));
	}
	cr_assert_fail("the slot table is not clean once quiet");
}
