/* Helpers of the /metrics tests: a synthetic instance, kvringd with metrics on, a libkvring workload, HTTP, promtool. */
#include "metrics_test.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- synthetic instance ------------------------------------------------------------- */

static const struct kvr_ctl_ring_spec fake_rings[] = {
	{"lookup.req.0", 8, KVR_EP_CLIENT(0), 0},
	{"ctl.lookup.in", 4, KVR_EP_SUPERVISOR, 0},
};

static void fake_actor(struct kvr_ctl *c, unsigned i, const char *name, unsigned kind, unsigned state)
{
	struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->kind = kind;
	atomic_store(&e->state, state);
}

void m_fake_init(struct m_fake *f)
{
	m_fake_init_config(f, "{}");
}

void m_fake_init_config(struct m_fake *f, const char *json)
{
	memset(f, 0, sizeof(*f));
	f->ctl_seg.fd = f->slots_seg.fd = -1;
	size_t sz = kvr_ctl_memsize(MF_ACTORS, 2, fake_rings, 2, strlen(json) + 1);
	cr_assert_gt(sz, 0);
	cr_assert_eq(kvr_segment_create("kvr-test-metrics-ctl", KVR_SEG_CTL, sz, 1, 0, &f->ctl_seg), 0);
	cr_assert_eq(kvr_ctl_init(&f->ctl_seg, MF_ACTORS, 2, fake_rings, 2, json), 0);
	static struct kvr_ctl_rings rings;
	cr_assert_eq(kvr_ctl_attach(&f->ctl_seg, &f->ctl, &rings), 0);
	struct kvr_ctl *c = f->ctl;
	atomic_store(&c->state, KVR_INST_RUNNING);
	fake_actor(c, 0, "lookup", KVR_ACTOR_LOOKUP, KVR_ACTOR_READY);
	fake_actor(c, 1, "loader.0", KVR_ACTOR_LOADER, KVR_ACTOR_READY);
	fake_actor(c, 2, "storer.0", KVR_ACTOR_STORER, KVR_ACTOR_BACKOFF);
	fake_actor(c, 3, "a\"b\\c", KVR_ACTOR_STORER, KVR_ACTOR_IDLE);
	atomic_store(&c->n_actors, 4);
	kvr_ctl_actor(c, 2)->restarts = 2;
	kvr_ctl_actor(c, 2)->last_exit_signal = 9;
	atomic_store(&kvr_ctl_worker(c, 0)->state, KVR_WORKER_ATTACHED);

	struct kvr_actor_stats *lk = kvr_ctl_stats(c, 0), *ld = kvr_ctl_stats(c, 1), *st = kvr_ctl_stats(c, 2);
	atomic_store(&lk->c[KVR_STAT_LK_LOOKUPS], 3);
	atomic_store(&lk->c[KVR_STAT_LK_KEYS], 10);
	atomic_store(&lk->c[KVR_STAT_LK_MATCHED], 6);
	atomic_store(&lk->c[KVR_STAT_LK_TOKENS_ASKED], 10 * MF_BLOCK_TOKENS);
	atomic_store(&lk->c[KVR_STAT_LK_TOKENS_MATCHED], 6 * MF_BLOCK_TOKENS);
	atomic_store(&lk->c[KVR_STAT_LK_L1_HITS], 5); /* one of the 6 promoted from L2 */
	atomic_store(&lk->c[KVR_STAT_LK_MISSED], 4);
	atomic_store(&lk->c[KVR_STAT_LK_EVICTED], 2);
	atomic_store(&lk->c[KVR_STAT_MALFORMED], 1);
	atomic_store(&ld->c[KVR_STAT_XF_BLOCKS], 5);
	atomic_store(&ld->c[KVR_STAT_XF_FAILED_BLOCKS], 1);
	atomic_store(&ld->c[KVR_STAT_XF_BYTES], 5000);
	atomic_store(&st->c[KVR_STAT_XF_BLOCKS], 7);
	atomic_store(&st->c[KVR_STAT_XF_PRESENT_BLOCKS], 2);
	atomic_store(&st->c[KVR_STAT_XF_FAILED_BLOCKS], 1);
	atomic_store(&st->c[KVR_STAT_XF_BYTES], 7000);
	struct kvr_hist *h = kvr_stats_hist(ld, KVR_STAT_XF_HIST_FIRST);
	kvr_hist_observe(h, 16000);
	kvr_hist_observe(h, 16001);
	kvr_hist_observe(h, 1000000000);

	struct kvr_ring *r = kvr_ctl_ring(&rings, 0);
	uint8_t msg[KVR_CTL_RING_MSG_SIZE] = {0};
	cr_assert_eq(kvr_ring_try_enqueue(r, msg), 0);
	cr_assert_eq(kvr_ring_try_enqueue(r, msg), 0);
	atomic_store(&r->shm->full_wait_ns, 1500000000ull);
	atomic_store(&r->shm->rejected, 3);

	size_t tsz = kvr_slots_memsize(MF_SLOTS);
	cr_assert_eq(kvr_segment_create("kvr-test-metrics-slots", KVR_SEG_SLOTS, tsz, 1, 0, &f->slots_seg), 0);
	struct kvr_slots_config sc = {.n_slots = MF_SLOTS, .lane_bytes = 4096, .block_tokens = MF_BLOCK_TOKENS,
				      .tp_size = 1, .quorum = 1};
	cr_assert_eq(kvr_slots_init(f->slots_seg.base, f->slots_seg.size, &sc, &f->slots), 0);
	for (uint32_t i = 0; i < 4; i++) {
		uint32_t epoch;
		kvr_key k = {.lo = i + 1, .hi = 7};
		cr_assert_eq(kvr_slot_alloc(f->slots, i, k, 0, 0, &epoch), 0);
		if (i < 3)
			cr_assert_eq(kvr_slot_commit(f->slots, i, epoch), 0);
		if (i == 2)
			cr_assert_eq(kvr_slot_pin(f->slots, i, epoch, 0), 0);
	}
}

void m_fake_add_disk(struct m_fake *f, unsigned index, const char *name)
{
	struct kvr_ctl *c = f->ctl;
	fake_actor(c, 4, name, KVR_ACTOR_DISK, KVR_ACTOR_READY);
	kvr_ctl_actor(c, 4)->index = index;
	atomic_store(&c->n_actors, 5);
	struct kvr_actor_stats *st = kvr_ctl_stats(c, 4);
	atomic_store(&st->c[KVR_STAT_DK_BYTES], 3 * 20480);
	atomic_store(&st->c[KVR_STAT_DK_FILES], 3);
	atomic_store(&st->c[KVR_STAT_DK_CAPACITY_BYTES], 1u << 20);
	atomic_store(&st->c[KVR_STAT_DK_ADOPTED], 5);
	atomic_store(&st->c[kvr_stat_dk_rejected(2)], 2); /* KVR_L2_R_TMP */
	atomic_store(&st->c[kvr_stat_dk_rejected(18)], 7); /* KVR_L2_R_OVER_CAP */
	atomic_store(&st->c[KVR_STAT_DK_EVICTED], 11);
	atomic_store(&st->c[KVR_STAT_DK_READS_DAMAGED], 1);
	atomic_store(&st->c[KVR_STAT_DK_READS_VANISHED], 2);
	atomic_store(&st->c[KVR_STAT_DK_READS_IO_ERROR], 3);
	atomic_store(&st->c[KVR_STAT_DK_WRITES_REFUSED], 4);
	atomic_store(&st->c[KVR_STAT_DK_LEFT_IN_PLACE], 9);
	atomic_store(&st->c[KVR_STAT_DK_BAD_KEPT], 6);
	atomic_store(&st->c[KVR_STAT_DK_XFER_JOINED], 13);
	atomic_store(&st->c[KVR_STAT_DK_XFER_REGISTERED], 14);
	atomic_store(&st->c[KVR_STAT_DK_XFER_UNREGISTERED], 15);
}

void m_fake_add_remote(struct m_fake *f)
{
	struct kvr_ctl *c = f->ctl;
	fake_actor(c, 5, "remote", KVR_ACTOR_REMOTE, KVR_ACTOR_READY);
	atomic_store(&c->n_actors, 6);
	struct kvr_actor_stats *st = kvr_ctl_stats(c, 5), *lk = kvr_ctl_stats(c, 0);
	static const struct {
		unsigned stat;
		uint64_t v;
	} rm[] = {
		{KVR_STAT_RM_READS, 101},       {KVR_STAT_RM_HITS, 102},         {KVR_STAT_RM_MISSES, 103},
		{KVR_STAT_RM_BAD_VALUES, 104},  {KVR_STAT_RM_READ_ERRORS, 105},  {KVR_STAT_RM_WRITES, 106},
		{KVR_STAT_RM_WRITE_ERRORS, 107}, {KVR_STAT_RM_WRITES_STALE, 108}, {KVR_STAT_RM_BYTES_IN, 109},
		{KVR_STAT_RM_BYTES_OUT, 110},   {KVR_STAT_RM_MOVED, 111},        {KVR_STAT_RM_ASK, 112},
		{KVR_STAT_RM_TIMEOUTS, 113},    {KVR_STAT_RM_CONN_ERRORS, 114},  {KVR_STAT_RM_REPLY_ERRORS, 115},
		{KVR_STAT_RM_REFRESHES, 116},   {KVR_STAT_RM_NODES, 3},          {KVR_STAT_RM_NODES_UP, 2},
		{KVR_STAT_RM_INFLIGHT, 117},    {KVR_STAT_RM_SLOTS_COVERED, 10923},
	};
	for (size_t i = 0; i < sizeof(rm) / sizeof(rm[0]); i++)
		atomic_store(&st->c[rm[i].stat], rm[i].v);
	struct kvr_hist *get = kvr_stats_hist(st, KVR_STAT_RM_HIST_GET), *set = kvr_stats_hist(st, KVR_STAT_RM_HIST_SET);
	kvr_hist_observe(get, 16000);
	kvr_hist_observe(get, 100000);
	kvr_hist_observe(get, 2000000000);
	kvr_hist_observe(set, 1000000);
	atomic_store(&lk->c[KVR_STAT_LK_RM_READS], 121);
	atomic_store(&lk->c[KVR_STAT_LK_RM_READ_FAILS], 122);
	atomic_store(&lk->c[KVR_STAT_LK_RM_WRITES], 123);
	atomic_store(&lk->c[KVR_STAT_LK_RM_WRITES_SKIPPED], 124);
}

void m_fake_fini(struct m_fake *f)
{
	kvr_segment_close(&f->ctl_seg);
	kvr_segment_close(&f->slots_seg);
}

/* ---- kvringd ------------------------------------------------------------------------ */

uint16_t m_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0, "bind: %s", strerror(errno));
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

static void write_config(struct h_inst *in, bool enabled, uint16_t port, const char *l2)
{
	char sections[2048];
	snprintf(sections, sizeof(sections),
		 ",\n  \"model\": {\"preset\": \"\", \"model_id\": \"kvring-metrics-test\", \"layers\": %u, \"kv_heads\": %u,\n"
		 "    \"head_dim\": %u, \"dtype_bytes\": 2, \"block_tokens\": %u},\n"
		 "  \"l1\": {\"capacity_bytes\": %llu, \"huge_pages\": false, \"eviction\": \"lru\"},\n"
		 "  \"staging\": {\"ceiling_bytes\": \"1MiB\"},\n"
		 "  \"metrics\": {\"enabled\": %s, \"listen\": \"127.0.0.1:%u\"}%s",
		 M_LAYERS, M_HEADS, M_HEAD_DIM, M_BLOCK_TOKENS,
		 (unsigned long long)(KVR_SLOTS_ARENA_DATA_OFF + M_SLOTS * M_LANE_BYTES), enabled ? "true" : "false",
		 port, l2);
	h_write_config_with(in, NULL, 2, H_SUP_WATCH, sections);
}

void m_write_config(struct h_inst *in, bool enabled, uint16_t port)
{
	write_config(in, enabled, port, "");
}

void m_write_config_l2(struct h_inst *in, uint16_t port, const char *l2_dir, uint64_t l2_bytes)
{
	char l2[512];
	snprintf(l2, sizeof(l2),
		 ",\n  \"l2\": {\"dirs\": [\"%s\"], \"capacity_bytes\": %llu, \"mode\": \"write-through\", "
		 "\"durability\": \"none\"}",
		 l2_dir, (unsigned long long)l2_bytes);
	write_config(in, true, port, l2);
}

void m_start_l2(struct h_inst *in, uint16_t port, const char *l2_dir, uint64_t l2_bytes)
{
	m_write_config_l2(in, port, l2_dir, l2_bytes);
	h_start(in);
	struct kvr_actor_ent *lk = h_actor(in, "lookup"), *dk = h_actor(in, "disk.0");
	cr_assert(lk && atomic_load(&lk->state) == KVR_ACTOR_READY, "the lookup actor is not ready");
	cr_assert(dk && H_WAIT(atomic_load(&dk->state) == KVR_ACTOR_READY, 3000), "disk.0 is not ready");
}

void m_start(struct h_inst *in, bool enabled, uint16_t port)
{
	m_write_config(in, enabled, port);
	h_start(in);
	struct kvr_actor_ent *lk = h_actor(in, "lookup");
	cr_assert(lk && atomic_load(&lk->state) == KVR_ACTOR_READY, "the lookup actor is not ready");
}

/* ---- HTTP --------------------------------------------------------------------------- */

int m_http(uint16_t port, const char *method, const char *path, struct m_http *ret)
{
	memset(ret, 0, sizeof(*ret));
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	struct timeval tv = {.tv_sec = 5};
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	char req[256];
	int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: 127.0.0.1:%u\r\n\r\n", method, path, port);
	cr_assert_eq(write(fd, req, (size_t)n), n);
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	char chunk[4096];
	ssize_t got;
	while ((got = read(fd, chunk, sizeof(chunk))) > 0)
		fwrite(chunk, 1, (size_t)got, m);
	int rerr = got < 0 ? errno : 0;
	fclose(m);
	close(fd);
	cr_assert_eq(rerr, 0, "reading the reply: %s", strerror(rerr));
	char *sep = strstr(buf, "\r\n\r\n");
	cr_assert(sep, "no end of headers in the reply:\n%s", buf);
	cr_assert_eq(sscanf(buf, "HTTP/1.%*d %d", &ret->status), 1, "no status line:\n%s", buf);
	*sep = 0;
	ret->head = strdup(buf);
	ret->body_len = len - (size_t)(sep + 4 - buf);
	ret->body = malloc(ret->body_len + 1);
	memcpy(ret->body, sep + 4, ret->body_len);
	ret->body[ret->body_len] = 0;
	free(buf);
	return 0;
}

void m_http_free(struct m_http *r)
{
	free(r->head);
	free(r->body);
	memset(r, 0, sizeof(*r));
}

char *m_scrape(uint16_t port)
{
	struct m_http r;
	int rc = m_http(port, "GET", "/metrics", &r);
	cr_assert_eq(rc, 0, "GET /metrics on port %u: %s", port, strerror(-rc));
	cr_assert_eq(r.status, 200, "GET /metrics: status %d", r.status);
	char *body = r.body;
	r.body = NULL;
	m_http_free(&r);
	return body;
}

bool m_value(const char *text, const char *series, double *ret)
{
	size_t n = strlen(series);
	for (const char *l = text; l && *l;) {
		if (strncmp(l, series, n) == 0 && l[n] == ' ') {
			char *end;
			*ret = strtod(l + n + 1, &end);
			return end != l + n + 1 && (*end == '\n' || *end == 0);
		}
		l = strchr(l, '\n');
		if (l)
			l++;
	}
	return false;
}

double m_get(const char *text, const char *series)
{
	double v = NAN;
	cr_assert(m_value(text, series, &v), "no series %s in the exposition:\n%s", series, text);
	return v;
}

/* ---- promtool ----------------------------------------------------------------------- */

bool m_have_promtool(void)
{
	const char *path = getenv("PATH");
	char *dirs = strdup(path ? path : "/usr/bin:/bin");
	bool found = false;
	for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
		char p[512];
		snprintf(p, sizeof(p), "%s/promtool", d);
		found = access(p, X_OK) == 0;
	}
	free(dirs);
	return found;
}

int m_promtool(const char *text, char *out, size_t outlen)
{
	if (!m_have_promtool())
		return -1;
	static unsigned counter;
	char file[96], cmd[256];
	snprintf(file, sizeof(file), "/tmp/kvr-metrics-%d-%u.prom", (int)getpid(), counter++);
	FILE *f = fopen(file, "w");
	cr_assert(f);
	fputs(text, f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", file);
	FILE *p = popen(cmd, "r");
	cr_assert(p);
	size_t n = fread(out, 1, outlen - 1, p);
	out[n] = 0;
	int st = pclose(p);
	unlink(file);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

/* ---- worker and workload ------------------------------------------------------------ */

static uint8_t pattern(uint32_t block, unsigned region, uint32_t i)
{
	return (uint8_t)(block * 37u + region * 11u + i * 3u + 1u);
}

static void fill_block(struct m_worker *w, uint32_t b, uint32_t as_block)
{
	for (unsigned r = 0; r < w->g.n_regions; r++) {
		struct kvr_region reg = kvr_geometry_region(&w->g, r);
		uint8_t *page = w->kv + reg.offset + (uint64_t)b * reg.stride;
		for (uint32_t i = 0; i < reg.page_bytes; i++)
			page[i] = as_block == UINT32_MAX ? 0 : pattern(as_block, r, i);
	}
}

static void check_block(struct m_worker *w, uint32_t b, uint32_t as_block)
{
	for (unsigned r = 0; r < w->g.n_regions; r++) {
		struct kvr_region reg = kvr_geometry_region(&w->g, r);
		const uint8_t *page = w->kv + reg.offset + (uint64_t)b * reg.stride;
		for (uint32_t i = 0; i < reg.page_bytes; i++)
			cr_assert_eq(page[i], pattern(as_block, r, i), "block %u region %u byte %u: %u, want %u", b, r, i,
				     page[i], pattern(as_block, r, i));
	}
}

void m_worker_attach(struct m_worker *w, const char *sock)
{
	m_worker_attach_engine(w, sock, NULL, NULL);
}

void m_worker_attach_engine(struct m_worker *w, const char *sock, const char *engine_id, const char *model_ns)
{
	memset(w, 0, sizeof(*w));
	w->kv_fd = -1;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&w->g, M_LAYERS, M_HEADS, M_HEAD_DIM, 2, M_BLOCK_TOKENS,
							M_NUM_BLOCKS),
		     0);
	cr_assert_eq(kvr_geometry_lane_bytes(&w->g), M_LANE_BYTES);
	w->kv_bytes = kvr_geometry_kv_extent(&w->g);
	w->kv_fd = memfd_create("kvr-metrics-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert(w->kv_fd >= 0);
	cr_assert_eq(ftruncate(w->kv_fd, (off_t)w->kv_bytes), 0);
	void *kv = mmap(NULL, w->kv_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, w->kv_fd, 0);
	cr_assert(kv != MAP_FAILED);
	w->kv = kv;
	struct kvr_attach_opts o = {.socket = sock, .geometry = &w->g, .kv_fd = w->kv_fd, .kv_bytes = w->kv_bytes,
				    .timeout_ms = 5000, .engine_id = engine_id, .model_ns = model_ns};
	int rc = kvr_attach(&o, &w->c);
	cr_assert_eq(rc, 0, "kvr_attach: %s (%s)", strerror(-rc), kvr_last_error(NULL));
}

void m_worker_close(struct m_worker *w)
{
	if (w->c)
		kvr_detach(w->c);
	w->c = NULL;
	if (w->kv)
		munmap(w->kv, w->kv_bytes);
	w->kv = NULL;
	if (w->kv_fd >= 0)
		close(w->kv_fd);
	w->kv_fd = -1;
}

#define PROMPT_TOKENS M_PROMPT_TOKENS

void m_prompt(uint32_t *t, unsigned p)
{
	for (unsigned i = 0; i < PROMPT_TOKENS; i++)
		t[i] = 1000u * (p + 1) + i;
}

/* Wait for n completions of op, each with status 0; returns them in ret. */
static void wait_done(struct m_worker *w, unsigned n, uint32_t op, struct kvr_completion *ret)
{
	unsigned got = 0;
	for (int tries = 0; got < n && tries < 100; tries++) {
		int k = kvr_wait(w->c, ret + got, n - got, 100);
		cr_assert(k >= 0, "kvr_wait: %s (%s)", strerror(-k), kvr_last_error(w->c));
		got += (unsigned)k;
	}
	cr_assert_eq(got, n, "%u of %u completions arrived", got, n);
	for (unsigned i = 0; i < n; i++) {
		cr_assert_eq(ret[i].op, op);
		cr_assert_eq(ret[i].status, 0, "request %llu: %s", (unsigned long long)ret[i].req_id,
			     strerror(-ret[i].status));
		cr_assert_eq(ret[i].n_failed, 0);
	}
}

void m_workload(struct m_worker *w)
{
	uint32_t t[PROMPT_TOKENS], ids[4];
	struct kvr_completion done[4];

	for (uint32_t b = 0; b < 12; b++)
		fill_block(w, b, b);
	for (unsigned p = 0; p < 3; p++) {
		m_prompt(t, p);
		for (unsigned i = 0; i < 4; i++)
			ids[i] = 4 * p + i;
		int rc = kvr_store(w->c, 1 + p, t, PROMPT_TOKENS, NULL, 0, ids, 4);
		cr_assert_eq(rc, 0, "kvr_store: %s (%s)", strerror(-rc), kvr_last_error(w->c));
	}
	wait_done(w, 3, KVR_OP_STORE_DONE, done);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(done[i].n_stored, 4, "store %llu stored %u", (unsigned long long)done[i].req_id,
			     done[i].n_stored);

	m_prompt(t, 0);
	uint32_t first[4] = {0, 1, 2, 3};
	cr_assert_eq(kvr_store(w->c, 4, t, PROMPT_TOKENS, NULL, 0, first, 4), 0);
	wait_done(w, 1, KVR_OP_STORE_DONE, done);
	cr_assert_eq(done[0].n_stored, 0);
	cr_assert_eq(done[0].n_present, 4);

	for (uint32_t b = 16; b < 24; b++)
		fill_block(w, b, UINT32_MAX);
	for (unsigned p = 0; p < 2; p++) {
		struct kvr_lookup_result lr;
		m_prompt(t, p);
		int rc = kvr_lookup(w->c, 10 + p, t, PROMPT_TOKENS, NULL, 0, &lr);
		cr_assert_eq(rc, 0, "kvr_lookup: %s (%s)", strerror(-rc), kvr_last_error(w->c));
		cr_assert_eq(lr.matched_blocks, 4);
		cr_assert_eq(lr.matched_tokens, PROMPT_TOKENS);
		for (unsigned i = 0; i < 4; i++)
			ids[i] = 16 + 4 * p + i;
		rc = kvr_load(w->c, 10 + p, ids, 4);
		cr_assert_eq(rc, 0, "kvr_load: %s (%s)", strerror(-rc), kvr_last_error(w->c));
	}
	wait_done(w, 2, KVR_OP_LOAD_DONE, done);
	for (uint32_t b = 0; b < 8; b++)
		check_block(w, 16 + b, b);

	struct kvr_lookup_result lr;
	m_prompt(t, 7);
	cr_assert_eq(kvr_lookup(w->c, 12, t, PROMPT_TOKENS, NULL, 0, &lr), 0);
	cr_assert_eq(lr.matched_blocks, 0);
	cr_assert_eq(lr.matched_tokens, 0);
}

void m_fixture_init(struct h_inst *inst, struct m_worker *w)
{
	h_init(inst, 0700);
	memset(w, 0, sizeof(*w));
	w->kv_fd = -1;
}

void m_fixture_fini(struct h_inst *inst, struct m_worker *w)
{
	m_worker_close(w);
	h_fini(inst);
}
