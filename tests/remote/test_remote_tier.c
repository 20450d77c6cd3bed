/* The shared tier through two real kvring instances (two "nodes") and a real Redis Cluster (tests/remote/with-cluster.sh). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "client_harness.h"
#include "kvr_time.h"
#include "rcluster.h"
#include "rvalue.h"

/*
 * Instance A and instance B stand for two nodes: separate kvringd, sockets, arenas and slot
 * tables, one cluster. Every test starts with the cluster empty (FLUSHALL on every master).
 * The test itself reads and writes the cluster through hiredis (rcluster.h's slot map and
 * MOVED parsing) to damage values the way an operator or a bug would.
 */

static struct ct_env A, B;
static char remote_section[1024];
static struct kvr_rc_map cmap;
static redisContext *conns[KVR_RC_MAX_NODES];

#define PROMPTS 8
#define BLOCKS 4
#define BT 16
#define TAG(prompt, i) (7000ull * (prompt) + (i) + 1)

static uint32_t tokens[PROMPTS][BLOCKS * BT];

/* ---- the cluster, as the test sees it ------------------------------------------------------ */

static redisContext *node_conn(unsigned ni)
{
	if (!conns[ni]) {
		struct timeval tv = {.tv_sec = 2};
		conns[ni] = redisConnectWithTimeout(cmap.nodes[ni].host, cmap.nodes[ni].port, tv);
		cr_assert(conns[ni] && !conns[ni]->err, "connect %s:%u", cmap.nodes[ni].host, cmap.nodes[ni].port);
		(void)redisSetTimeout(conns[ni], tv);
	}
	return conns[ni];
}

static void drop_conn(unsigned ni)
{
	redisFree(conns[ni]);
	conns[ni] = NULL;
}

/* The slot map from any master that answers. */
static void map_refresh(void)
{
	kvr_rc_map_init(&cmap);
	char list[512];
	snprintf(list, sizeof(list), "%s", getenv("KVR_TEST_CLUSTER"));
	for (char *save = NULL, *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
		struct kvr_rc_node n;
		cr_assert_eq(kvr_rc_node_parse(s, &n), 0, "KVR_TEST_CLUSTER entry %s", s);
		(void)kvr_rc_map_node(&cmap, n.host, n.port);
	}
	for (unsigned ni = 0; ni < cmap.n_nodes; ni++) {
		struct timeval tv = {.tv_sec = 1};
		redisContext *c = redisConnectWithTimeout(cmap.nodes[ni].host, cmap.nodes[ni].port, tv);
		redisReply *r = c && !c->err ? redisCommand(c, "CLUSTER SLOTS") : NULL;
		int rc = r && r->type == REDIS_REPLY_ARRAY ? kvr_rc_map_from_slots(&cmap, r, cmap.nodes[ni].host) : -EIO;
		freeReplyObject(r);
		redisFree(c);
		if (rc == 0 && kvr_rc_map_covered(&cmap) == KVR_RC_SLOTS)
			return;
	}
	cr_assert_fail("no master gave a full slot map");
}

/* One command on the master of key's slot (following one MOVED). The caller frees the reply. */
static redisReply *cl_argv(const char *key, int argc, const char **argv, const size_t *lens)
{
	for (int attempt = 0; attempt < 3; attempt++) {
		unsigned ni = cmap.owner[kvr_rc_key_slot(key, strlen(key))];
		cr_assert_neq(ni, KVR_RC_NONE);
		redisContext *c = node_conn(ni);
		redisReply *r = redisCommandArgv(c, argc, argv, lens);
		if (!r) {
			drop_conn(ni);
			map_refresh();
			continue;
		}
		if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "MOVED", 5)) {
			freeReplyObject(r);
			map_refresh();
			continue;
		}
		return r;
	}
	cr_assert_fail("no answer for %s", key);
	return NULL;
}

static redisReply *cl_get(const char *key)
{
	const char *argv[2] = {"GET", key};
	size_t lens[2] = {3, strlen(key)};
	return cl_argv(key, 2, argv, lens);
}

static void cl_set(const char *key, const void *val, size_t len)
{
	const char *argv[3] = {"SET", key, val};
	size_t lens[3] = {3, strlen(key), len};
	redisReply *r = cl_argv(key, 3, argv, lens);
	cr_assert(r->type == REDIS_REPLY_STATUS, "SET %s: %s", key, r->str);
	freeReplyObject(r);
}

/* Which nodes of the map own a hash slot (the masters). */
static void mark_masters(bool master[KVR_RC_MAX_NODES])
{
	memset(master, 0, KVR_RC_MAX_NODES * sizeof(bool));
	for (unsigned s = 0; s < KVR_RC_SLOTS; s++)
		master[cmap.owner[s]] = true;
}

/* cmd on every master of the map; returns the sum of its integer replies and the masters asked. */
static long long on_masters(const char *cmd, unsigned reply_type, unsigned *ret_masters)
{
	long long sum = 0;
	unsigned n = 0;
	bool master[KVR_RC_MAX_NODES];
	mark_masters(master);
	for (unsigned ni = 0; ni < cmap.n_nodes; ni++) {
		if (!master[ni])
			continue;
		redisReply *r = redisCommand(node_conn(ni), cmd);
		cr_assert(r && (unsigned)r->type == reply_type, "%s on %s:%u", cmd, cmap.nodes[ni].host, cmap.nodes[ni].port);
		if (r->type == REDIS_REPLY_INTEGER)
			sum += r->integer;
		freeReplyObject(r);
		n++;
	}
	*ret_masters = n;
	return sum;
}

/* Every master: FLUSHALL (a cluster restarted empty). */
static void cl_flush(void)
{
	unsigned n;
	(void)on_masters("FLUSHALL", REDIS_REPLY_STATUS, &n);
	cr_assert_eq(n, 3);
}

static unsigned cl_dbsize(void)
{
	unsigned n;
	return (unsigned)on_masters("DBSIZE", REDIS_REPLY_INTEGER, &n);
}

static void key_name(const struct ct_env *e, kvr_key key, unsigned lane, char *buf)
{
	cr_assert_gt(kvr_rv_key_fmt(buf, KVR_RV_KEY_MAX, e->slots->ns, key, lane), 0);
}

static int cluster_sh(const char *verb, unsigned port)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "'%s' %s '%s' %u >&2", getenv("KVR_REDIS_CLUSTER_SH"), verb,
		 getenv("KVR_TEST_CLUSTER_DIR"), port);
	return system(cmd);
}

/* ---- instances ---------------------------------------------------------------------------- */

static void setup(void)
{
	cr_assert(getenv("KVR_TEST_CLUSTER") && getenv("KVR_TEST_CLUSTER_DIR"),
		  "run through tests/remote/with-cluster.sh (meson test does)");
	ct_init(&A);
	ct_init(&B);
	char list[512];
	snprintf(list, sizeof(list), "%s", getenv("KVR_TEST_CLUSTER"));
	size_t off = 0;
	char seeds[600] = "";
	for (char *save = NULL, *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save))
		off += (size_t)snprintf(seeds + off, sizeof(seeds) - off, "%s\"%s\"", off ? ", " : "", s);
	snprintf(remote_section, sizeof(remote_section),
		 ",\n  \"remote\": {\"cluster\": [%s], \"timeout_ms\": 1000, \"max_inflight\": 32}", seeds);
	map_refresh();
	unsigned n;
	/* a test that failed midway may have left the masters refusing writes */
	(void)on_masters("CONFIG SET maxmemory 0", REDIS_REPLY_STATUS, &n);
	cl_flush();
}

static void teardown(void)
{
	ct_fini(&B);
	ct_fini(&A);
	for (unsigned ni = 0; ni < KVR_RC_MAX_NODES; ni++)
		drop_conn(ni);
}

TestSuite(remote, .init = setup, .fini = teardown, .timeout = 120);

static struct ct_rank *start(struct ct_env *e, uint32_t l1_slots)
{
	struct ct_opts o = {.l1_slots = l1_slots, .sections_extra = remote_section};
	ct_start(e, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(e, 0, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	cr_assert(H_WAIT(ct_stat(e, "remote", KVR_STAT_RM_SLOTS_COVERED) == KVR_RC_SLOTS, 5000),
		  "the remote actor has no full slot map: %llu slots",
		  (unsigned long long)ct_stat(e, "remote", KVR_STAT_RM_SLOTS_COVERED));
	return r;
}

/* Prompt p stored on r in engine blocks 0..BLOCKS-1, block i holding TAG(p, i). */
static void store_prompt(struct ct_rank *r, unsigned p)
{
	ct_prompt(tokens[p], BLOCKS * BT, 4200 + p);
	uint32_t blocks[BLOCKS];
	for (uint32_t i = 0; i < BLOCKS; i++) {
		blocks[i] = i;
		ct_fill(r, i, TAG(p, i));
	}
	struct ct_done d;
	ct_store(r, 1 + p, tokens[p], BLOCKS * BT, blocks, BLOCKS, &d);
	cr_assert_eq(d.c.status, 0, "store %u: %d", p, d.c.status);
	cr_assert_eq(d.c.n_stored, BLOCKS);
}

/* A stores prompts [0, n) and waits until the cluster acknowledged every lane. */
static void a_stores(struct ct_rank *ra, unsigned n)
{
	uint64_t before = ct_stat(&A, "remote", KVR_STAT_RM_WRITES);
	for (unsigned p = 0; p < n; p++)
		store_prompt(ra, p);
	cr_assert(H_WAIT(ct_stat(&A, "remote", KVR_STAT_RM_WRITES) == before + n * BLOCKS, 5000),
		  "the cluster acknowledged %llu of %u writes (errors %llu, stale %llu, skipped %llu)",
		  (unsigned long long)(ct_stat(&A, "remote", KVR_STAT_RM_WRITES) - before), n * BLOCKS,
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_WRITE_ERRORS),
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_WRITES_STALE),
		  (unsigned long long)ct_stat(&A, "lookup", KVR_STAT_LK_RM_WRITES_SKIPPED));
}

/* ---- tests -------------------------------------------------------------------------------- */

/*
 * The point of the tier: A computes (stores) 8 prompts, B — empty, another "node" — loads
 * all of them byte-exact from the cluster (every block a hit), and then serves them from
 * its own L1 without asking the cluster again.
 */
Test(remote, a_prompt_stored_on_one_node_loads_on_another)
{
	struct ct_rank *ra = start(&A, 64);
	a_stores(ra, PROMPTS);
	cr_assert_eq(cl_dbsize(), PROMPTS * BLOCKS, "one value per block lane in the cluster");
	cr_assert_eq(ct_stat(&A, "remote", KVR_STAT_RM_BYTES_OUT), (uint64_t)PROMPTS * BLOCKS * A.slots->slot_bytes);

	struct ct_rank *rb = start(&B, 64);
	for (unsigned p = 0; p < PROMPTS; p++)
		cr_assert_eq(ct_lookup_load_exact(rb, 100 + p, tokens[p], BLOCKS * BT, 0, TAG(p, 0)), BLOCKS,
			     "prompt %u on B", p);
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_HITS), PROMPTS * BLOCKS, "hit rate 100%%");
	cr_assert_eq(ct_stat(&B, "lookup", KVR_STAT_LK_RM_READS), PROMPTS * BLOCKS);
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_MISSES) + ct_stat(&B, "remote", KVR_STAT_RM_BAD_VALUES), 0);
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_BYTES_IN), (uint64_t)PROMPTS * BLOCKS * B.slots->slot_bytes);

	/* B's L1 serves them now: no further read reaches the cluster */
	uint64_t reads = ct_stat(&B, "remote", KVR_STAT_RM_READS);
	for (unsigned p = 0; p < PROMPTS; p++)
		cr_assert_eq(ct_lookup_load_exact(rb, 200 + p, tokens[p], BLOCKS * BT, 4, TAG(p, 0)), BLOCKS);
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_READS), reads, "L1 hits on B asked the cluster");
	ct_assert_table_clean(&A);
	ct_assert_table_clean(&B);
}

/*
 * A value that is not exactly the block is a miss, never served: a flipped payload byte, a
 * truncated value, a forged length (header checksum recomputed), another model's block
 * under this key. Each damages block 1 of one prompt: B matches block 0 only (and loads it
 * byte-exact), the bad value is counted.
 */
Test(remote, damaged_foreign_truncated_and_forged_values_are_misses)
{
	struct ct_rank *ra = start(&A, 64);
	a_stores(ra, 4);
	const struct kvr_l2_ident id = {.ns = A.slots->ns, .fingerprint = A.slots->ns,
					.block_tokens = A.slots->block_tokens, .lane_bytes = A.slots->slot_bytes};
	for (unsigned p = 0; p < 4; p++) {
		kvr_key keys[BLOCKS];
		ct_keys(&A, tokens[p], BLOCKS * BT, keys);
		char name[KVR_RV_KEY_MAX];
		key_name(&A, keys[1], 0, name);
		redisReply *v = cl_get(name);
		cr_assert(v->type == REDIS_REPLY_STRING && v->len == KVR_RV_HDR_BYTES + id.lane_bytes, "value of %s", name);
		cr_assert_eq(kvr_rv_check(v->str, v->len, &id, keys[1], 0, NULL), 0, "the stored value checks");
		char *val = malloc(v->len);
		memcpy(val, v->str, v->len);
		size_t len = v->len;
		freeReplyObject(v);
		struct kvr_rv_hdr h;
		switch (p) {
		case 0: /* one payload byte flipped */
			val[KVR_RV_HDR_BYTES + 1000] ^= 0x20;
			break;
		case 1: /* truncated */
			len -= 100;
			break;
		case 2: /* a forged length: a well-formed header that claims fewer payload bytes */
		{
			struct kvr_l2_ident shorter = id;
			shorter.lane_bytes -= 512;
			kvr_rv_hdr_build(&h, &shorter, keys[1], 0, val + KVR_RV_HDR_BYTES);
			memcpy(val, &h, sizeof(h));
			break;
		}
		case 3: /* another model's block (its namespace) under this key */
		{
			struct kvr_l2_ident other = id;
			other.ns.lo ^= 1;
			other.fingerprint = other.ns;
			kvr_rv_hdr_build(&h, &other, keys[1], 0, val + KVR_RV_HDR_BYTES);
			memcpy(val, &h, sizeof(h));
			break;
		}
		}
		cl_set(name, val, len);
		free(val);
	}
	struct ct_rank *rb = start(&B, 64);
	for (unsigned p = 0; p < 4; p++)
		cr_assert_eq(ct_lookup_load_exact(rb, 300 + p, tokens[p], BLOCKS * BT, 0, TAG(p, 0)), 1,
			     "prompt %u: block 0 verified, block 1 refused", p);
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_BAD_VALUES), 4, "each bad value counted once");
	cr_assert(h_log_contains(&B.h, "value refused (payload_checksum"), "the flipped byte is named");
	ct_assert_table_clean(&B);
	/* B's slot table holds the verified blocks only: 4 prompts x block 0 (+ whatever was read
	 * ahead past block 1 and verified: blocks 2 and 3 are intact) */
	for (uint32_t s = 0; s < B.slots->n_slots; s++)
		cr_assert(kvr_slot_state(B.slots, s) == KVR_SLOT_FREE || kvr_slot_state(B.slots, s) == KVR_SLOT_COMMITTED);
}

/* kill -9 every node of the cluster and start them all again from their config: a cluster
 * restarted empty (no persistence), its slot assignment kept in nodes.conf. */
static void restart_cluster(void)
{
	DIR *d = opendir(getenv("KVR_TEST_CLUSTER_DIR"));
	cr_assert_not_null(d);
	unsigned ports[16], n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < 16) {
		char *end;
		unsigned long port = strtoul(e->d_name, &end, 10);
		if (*end == '\0' && port > 0 && port < 65536)
			ports[n++] = (unsigned)port;
	}
	closedir(d);
	cr_assert_eq(n, 6, "3 masters and 3 replicas");
	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(cluster_sh("kill", ports[i]), 0);
	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(cluster_sh("restart", ports[i]), 0);
	cr_assert_eq(cluster_sh("wait", 30), 0, "the restarted cluster did not settle");
	for (unsigned ni = 0; ni < KVR_RC_MAX_NODES; ni++)
		drop_conn(ni);
	map_refresh();
}

/* The cluster restarted empty under two running instances: everything is a miss (or, while
 * the connections come back, an error: never a hit), nothing breaks, and it fills again. */
Test(remote, a_cluster_restarted_empty_is_all_misses, .timeout = 180)
{
	struct ct_rank *ra = start(&A, 64);
	a_stores(ra, 2);
	struct ct_rank *rb = start(&B, 64);
	restart_cluster();
	cr_assert_eq(cl_dbsize(), 0, "restarted empty");
	for (unsigned p = 0; p < 2; p++)
		cr_assert_eq(ct_lookup(rb, 400 + p, tokens[p], BLOCKS * BT), 0);
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_MISSES) + ct_stat(&B, "remote", KVR_STAT_RM_READ_ERRORS), 2,
		     "one read per prompt: the window stops at the miss");
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_HITS), 0);
	ct_assert_table_clean(&B);
	/* A's L1 is untouched */
	cr_assert_eq(ct_lookup_load_exact(ra, 405, tokens[0], BLOCKS * BT, 8, TAG(0, 0)), BLOCKS);
	/* and it fills again: a new prompt stored on A loads on B */
	uint64_t w = ct_stat(&A, "remote", KVR_STAT_RM_WRITES);
	store_prompt(ra, 2);
	cr_assert(H_WAIT(ct_stat(&A, "remote", KVR_STAT_RM_WRITES) == w + BLOCKS, 5000));
	cr_assert_eq(ct_lookup_load_exact(rb, 410, tokens[2], BLOCKS * BT, 0, TAG(2, 0)), BLOCKS);
	ct_assert_table_clean(&B);
}

/*
 * A master killed -9 mid-workload: lookups of blocks on its slots miss or wait for the
 * failover, none hangs past the request timeout, no wrong byte is loaded, A keeps serving its
 * L1; after the replica took over, routing follows (MOVED / a refreshed map) and both
 * instances use the cluster again; the killed node comes back (as a replica) and nothing breaks.
 */
Test(remote, a_killed_master_fails_over_and_routing_recovers, .timeout = 240)
{
	struct ct_rank *ra = start(&A, 64);
	a_stores(ra, 4);
	struct ct_rank *rb = start(&B, 64);
	unsigned victim = cmap.nodes[cmap.owner[0]].port;
	cr_assert_eq(cluster_sh("kill", victim), 0);
	for (unsigned p = 0; p < 4; p++) {
		uint64_t t0 = kvr_now_ns();
		uint32_t got = ct_lookup_load_exact(rb, 500 + p, tokens[p], BLOCKS * BT, 0, TAG(p, 0)); /* asserts bytes */
		uint64_t ms = (kvr_now_ns() - t0) / 1000000;
		cr_assert_leq(ms, 3000, "prompt %u: the lookup took %llu ms with a master dead", p, (unsigned long long)ms);
		cr_assert_leq(got, BLOCKS);
		/* A's own L1 is not affected at all */
		cr_assert_eq(ct_lookup_load_exact(ra, 520 + p, tokens[p], BLOCKS * BT, 8, TAG(p, 0)), BLOCKS);
	}
	cr_assert_eq(cluster_sh("wait", 30), 0, "the replica did not take over");
	map_refresh();
	for (unsigned ni = 0; ni < KVR_RC_MAX_NODES; ni++)
		drop_conn(ni);
	/* new prompts after the failover: every lane written, every block loaded on B */
	uint64_t w = ct_stat(&A, "remote", KVR_STAT_RM_WRITES);
	for (unsigned p = 4; p < PROMPTS; p++)
		store_prompt(ra, p);
	cr_assert(H_WAIT(ct_stat(&A, "remote", KVR_STAT_RM_WRITES) == w + 4 * BLOCKS, 10000),
		  "after the failover %llu of %u writes acknowledged (errors %llu, refreshes %llu, moved %llu, conn errors "
		  "%llu, timeouts %llu)", (unsigned long long)(ct_stat(&A, "remote", KVR_STAT_RM_WRITES) - w), 4 * BLOCKS,
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_WRITE_ERRORS),
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_REFRESHES),
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_MOVED),
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_CONN_ERRORS),
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_TIMEOUTS));
	for (unsigned p = 4; p < PROMPTS; p++)
		cr_assert_eq(ct_lookup_load_exact(rb, 540 + p, tokens[p], BLOCKS * BT, 0, TAG(p, 0)), BLOCKS,
			     "prompt %u after the failover", p);
	cr_assert_eq(cluster_sh("restart", victim), 0);
	cr_assert_eq(cluster_sh("wait", 30), 0);
	for (unsigned p = 4; p < PROMPTS; p++)
		cr_assert_eq(ct_lookup_load_exact(rb, 560 + p, tokens[p], BLOCKS * BT, 4, TAG(p, 0)), BLOCKS);
	ct_assert_table_clean(&A);
	ct_assert_table_clean(&B);
}

static uint64_t rss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	uint64_t kib = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %llu", (unsigned long long *)&kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* 10,000 blocks out of A and into B: the remote actors' memory stays flat (nothing per block is
 * kept: requests live in a fixed pool, hiredis's buffers are reused). */
Test(remote, memory_stays_flat_over_ten_thousand_blocks, .timeout = 300)
{
	enum { N = 2500, WARM = 250 }; /* prompts of BLOCKS blocks: 10,000 blocks */
	struct ct_rank *ra = start(&A, 64);
	struct ct_rank *rb = start(&B, 64);
	uint32_t tok[BLOCKS * BT];
	uint64_t rss_a = 0, rss_b = 0;
	for (unsigned p = 0; p < N; p++) {
		if (p == WARM) {
			rss_a = rss_kib(ct_actor_pid(&A, "remote"));
			rss_b = rss_kib(ct_actor_pid(&B, "remote"));
		}
		ct_prompt(tok, BLOCKS * BT, 900000 + p);
		uint32_t blocks[BLOCKS];
		for (uint32_t i = 0; i < BLOCKS; i++) {
			blocks[i] = i;
			ct_fill(ra, i, TAG(p, i));
		}
		struct ct_done d;
		ct_store(ra, 10000 + p, tok, BLOCKS * BT, blocks, BLOCKS, &d);
		cr_assert_eq(d.c.n_stored, BLOCKS);
		uint64_t want = (uint64_t)(p + 1) * BLOCKS;
		cr_assert(H_WAIT(ct_stat(&A, "remote", KVR_STAT_RM_WRITES) == want, 5000), "prompt %u not written", p);
		cr_assert_eq(ct_lookup_load_exact(rb, 20000 + p, tok, BLOCKS * BT, 0, TAG(p, 0)), BLOCKS,
			     "prompt %u: B's lookup: keys %llu matched %llu remote promotions %llu failed %llu; B's remote "
			     "actor: reads %llu hits %llu misses %llu bad %llu errors %llu timeouts %llu", p,
			     (unsigned long long)ct_stat(&B, "lookup", KVR_STAT_LK_KEYS),
			     (unsigned long long)ct_stat(&B, "lookup", KVR_STAT_LK_MATCHED),
			     (unsigned long long)ct_stat(&B, "lookup", KVR_STAT_LK_RM_READS),
			     (unsigned long long)ct_stat(&B, "lookup", KVR_STAT_LK_RM_READ_FAILS),
			     (unsigned long long)ct_stat(&B, "remote", KVR_STAT_RM_READS),
			     (unsigned long long)ct_stat(&B, "remote", KVR_STAT_RM_HITS),
			     (unsigned long long)ct_stat(&B, "remote", KVR_STAT_RM_MISSES),
			     (unsigned long long)ct_stat(&B, "remote", KVR_STAT_RM_BAD_VALUES),
			     (unsigned long long)ct_stat(&B, "remote", KVR_STAT_RM_READ_ERRORS),
			     (unsigned long long)ct_stat(&B, "remote", KVR_STAT_RM_TIMEOUTS));
	}
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_HITS), (uint64_t)N * BLOCKS);
	uint64_t end_a = rss_kib(ct_actor_pid(&A, "remote")), end_b = rss_kib(ct_actor_pid(&B, "remote"));
	cr_log_info("remote actor RSS after %u and %u blocks: A %llu -> %llu KiB, B %llu -> %llu KiB", WARM * BLOCKS,
		    N * BLOCKS, (unsigned long long)rss_a, (unsigned long long)end_a, (unsigned long long)rss_b,
		    (unsigned long long)end_b);
#if defined(__SANITIZE_ADDRESS__)
	/* under ASan every freed buffer waits in the sanitizer's quarantine (256 MiB): RSS then
	 * measures the quarantine, not kvring; the 10,000 blocks are still checked byte for byte */
	cr_log_info("built with ASan: RSS not compared");
#else
	cr_assert_leq(end_a, rss_a + 1024, "A's remote actor grew %llu KiB", (unsigned long long)(end_a - rss_a));
	cr_assert_leq(end_b, rss_b + 1024, "B's remote actor grew %llu KiB", (unsigned long long)(end_b - rss_b));
#endif
}

static pid_t node_pid(unsigned port)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%u/redis.pid", getenv("KVR_TEST_CLUSTER_DIR"), port);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	int pid = 0;
	cr_assert_eq(fscanf(f, "%d", &pid), 1);
	fclose(f);
	return (pid_t)pid;
}

/*
 * The remote actor killed -9 with a promotion read in flight (its master is stopped, so
 * the GET hangs): the lookup actor aborts the read, the slot waits DRAINING under the dead
 * actor's pin until the successor drops it, then the table is quiet (only FREE and
 * COMMITTED, no pins) and every block loads byte-exact from the cluster once the master
 * runs again.
 */
Test(remote, a_killed_remote_actor_leaves_a_quiet_table)
{
	struct ct_rank *ra = start(&A, 64);
	a_stores(ra, 1);
	kvr_key keys[BLOCKS];
	ct_keys(&A, tokens[0], BLOCKS * BT, keys);
	char name[KVR_RV_KEY_MAX];
	key_name(&A, keys[0], 0, name);
	pid_t master = node_pid(cmap.nodes[cmap.owner[kvr_rc_key_slot(name, strlen(name))]].port);
	struct ct_opts o = {.l1_slots = 64, .sections_extra = remote_section, .max_workers = 2};
	ct_start(&B, &ct_tiny, &o); /* two worker slots: the child's, then the test's own */
	cr_assert(H_WAIT(ct_stat(&B, "remote", KVR_STAT_RM_SLOTS_COVERED) == KVR_RC_SLOTS, 5000));
	cr_assert_eq(kill(master, SIGSTOP), 0);
	int w;
	pid_t child = ct_spawn_rank_child(&B, 0, 16, tokens[0], BLOCKS * BT, &w);
	cr_assert(H_WAIT(ct_stat(&B, "remote", KVR_STAT_RM_READS) >= 1, 3000), "the promotion read was not taken");
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_HITS), 0);
	pid_t rpid = ct_actor_pid(&B, "remote");
	cr_assert_eq(kill(rpid, SIGKILL), 0);
	cr_assert(ct_wait_ready(&B, "remote", rpid, 5000) > 0, "the remote actor was not restarted");
	cr_assert_eq(kill(master, SIGCONT), 0);
	(void)kill(child, SIGKILL);
	(void)waitpid(child, NULL, 0);
	ct_untrack_child(child);
	cr_assert(H_WAIT(ct_table_clean(&B), 10000), "the slot table did not get quiet");
	struct ct_rank *rb;
	cr_assert_eq(ct_rank_open(&B, 0, 16, 0, &rb), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(ct_lookup_load_exact(rb, 600, tokens[0], BLOCKS * BT, 0, TAG(0, 0)), BLOCKS);
	ct_assert_table_clean(&B);
	ct_assert_table_clean(&A);
}

/* "SET refused" lines in e's log; *ret_counted: what they count in all (a line is one refusal,
 * "(and N more since the last such line)" N more). */
static unsigned set_refused_lines(const struct ct_env *e, unsigned long long *ret_counted)
{
	char *log = h_read_file(e->h.log);
	unsigned lines = 0;
	unsigned long long counted = 0;
	for (const char *p = log; (p = strstr(p, "remote: SET refused: ")); p++) {
		const char *eol = strchrnul(p, '\n'), *more = strstr(p, "(and ");
		unsigned long long k = 0;
		if (more && more < eol)
			cr_assert_eq(sscanf(more, "(and %llu more since the last such line)", &k), 1, "%.*s",
				     (int)(eol - p), p);
		lines++;
		counted += 1 + k;
	}
	free(log);
	*ret_counted = counted;
	return lines;
}

/*
 * Every master refuses writes (maxmemory 1 byte: "-OOM command not allowed ..."): each SET
 * is counted as a write error, and the remote actor logs at most one "SET refused" line a
 * second, the next one saying how many it did not log (issue 22: 52 lines in a second while
 * a master was stopped).
 */
Test(remote, set_refusals_are_rate_limited)
{
	struct ct_rank *ra = start(&A, 64);
	unsigned n;
	(void)on_masters("CONFIG SET maxmemory 1", REDIS_REPLY_STATUS, &n);
	cr_assert_eq(n, 3);
	enum { BURST = PROMPTS - 1 }; /* prompts 0..6 now, prompt 7 after a second */
	uint64_t t0 = kvr_now_ns();
	for (unsigned p = 0; p < BURST; p++)
		store_prompt(ra, p);
	cr_assert(H_WAIT(ct_stat(&A, "remote", KVR_STAT_RM_WRITE_ERRORS) == BURST * BLOCKS, 10000),
		  "%llu of %u SETs refused (writes %llu, skipped %llu)",
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_WRITE_ERRORS), BURST * BLOCKS,
		  (unsigned long long)ct_stat(&A, "remote", KVR_STAT_RM_WRITES),
		  (unsigned long long)ct_stat(&A, "lookup", KVR_STAT_LK_RM_WRITES_SKIPPED));
	uint64_t burst_ms = (kvr_now_ns() - t0) / 1000000u;
	unsigned long long counted;
	unsigned lines = set_refused_lines(&A, &counted);
	cr_assert_geq(lines, 1, "the first refusal is logged");
	cr_assert(h_log_contains(&A.h, "remote: SET refused: OOM command not allowed"), "the reason is named");
	cr_assert_leq(lines, 1 + burst_ms / 1000, "%u SET refused lines for %u refusals in %llu ms", lines,
		      BURST * BLOCKS, (unsigned long long)burst_ms);

	/* a second later: one line, which counts what the burst did not log */
	usleep(1100 * 1000);
	store_prompt(ra, BURST);
	cr_assert(H_WAIT(ct_stat(&A, "remote", KVR_STAT_RM_WRITE_ERRORS) == PROMPTS * BLOCKS, 10000));
	unsigned lines2 = set_refused_lines(&A, &counted);
	cr_assert_eq(lines2, lines + 1, "%u lines after the burst's %u", lines2, lines);
	/* every refusal up to this line is accounted for: the burst's and this one (its 3 others
	 * wait for the next line) */
	cr_assert_eq(counted, BURST * BLOCKS + 1, "the lines count %llu refusals", counted);
	cr_assert_eq(ct_stat(&A, "remote", KVR_STAT_RM_WRITES), 0);
	(void)on_masters("CONFIG SET maxmemory 0", REDIS_REPLY_STATUS, &n);
}

/* Every value in the cluster: how many headers say 16 tokens a block, 32, something else. */
static void cl_block_sizes(unsigned *n16, unsigned *n32, unsigned *other)
{
	*n16 = *n32 = *other = 0;
	bool master[KVR_RC_MAX_NODES];
	mark_masters(master);
	for (unsigned ni = 0; ni < cmap.n_nodes; ni++) {
		if (!master[ni])
			continue;
		redisReply *keys = redisCommand(node_conn(ni), "KEYS *");
		cr_assert(keys && keys->type == REDIS_REPLY_ARRAY);
		for (size_t i = 0; i < keys->elements; i++) {
			redisReply *v = cl_get(keys->element[i]->str);
			cr_assert(v->type == REDIS_REPLY_STRING && v->len >= (size_t)KVR_RV_HDR_BYTES);
			struct kvr_rv_hdr h;
			memcpy(&h, v->str, sizeof(h));
			*n16 += h.block_tokens == 16;
			*n32 += h.block_tokens == 32;
			*other += h.block_tokens != 16 && h.block_tokens != 32;
			freeReplyObject(v);
		}
		freeReplyObject(keys);
	}
}

/*
 * Without a model section an instance serves engines of several block sizes, and so does the
 * tier: on node A a 16-token engine and a 32-token one (another head size, the same lane)
 * store; each value's header records its block's size; node B, with the same two engines
 * attached (the 32-token one first: its slots, the same format), loads both byte-exact from
 * the cluster.
 */
Test(remote, engines_of_two_block_sizes_share_the_tier_without_a_model_section)
{
	struct ct_opts o = {.no_model = true, .l1_slots = 64, .max_workers = 3, .sections_extra = remote_section};
	static uint32_t t32[2][BLOCKS * 32];
	struct ct_model keep = ct_tiny, m32 = ct_tiny;
	m32.block_tokens = 32;
	struct ct_rank *a16, *a32, *b16, *b32;
	ct_start(&A, &ct_tiny, &o);
	cr_assert_eq(ct_rank_open_engine(&A, 0, 16, 0, "e16", "org/a", &a16), 0, "%s", kvr_last_error(NULL));
	A.m = m32;
	cr_assert_eq(ct_rank_open_engine(&A, 0, 16, 8, "e32", "org/b", &a32), 0, "%s", kvr_last_error(NULL));
	A.m = keep;
	ct_map_l1(&A);
	cr_assert(H_WAIT(ct_stat(&A, "remote", KVR_STAT_RM_SLOTS_COVERED) == KVR_RC_SLOTS, 5000));
	uint64_t before = ct_stat(&A, "remote", KVR_STAT_RM_WRITES);
	for (unsigned p = 0; p < 2; p++) {
		store_prompt(a16, p);
		ct_prompt(t32[p], BLOCKS * 32, 4300 + p);
		uint32_t blocks[BLOCKS];
		for (uint32_t i = 0; i < BLOCKS; i++) {
			blocks[i] = i;
			ct_fill(a32, i, TAG(p + 50, i));
		}
		struct ct_done d;
		ct_store(a32, 10 + p, t32[p], BLOCKS * 32, blocks, BLOCKS, &d);
		cr_assert(d.c.status == 0 && d.c.n_stored == BLOCKS, "store %u: %d", p, d.c.status);
	}
	cr_assert(H_WAIT(ct_stat(&A, "remote", KVR_STAT_RM_WRITES) == before + 4 * BLOCKS, 5000), "%llu writes",
		  (unsigned long long)(ct_stat(&A, "remote", KVR_STAT_RM_WRITES) - before));
	unsigned n16, n32, other;
	cl_block_sizes(&n16, &n32, &other);
	cr_assert(n16 == 2 * BLOCKS && n32 == 2 * BLOCKS && other == 0, "values: %u of 16 tokens, %u of 32, %u other",
		  n16, n32, other);

	ct_start(&B, &ct_tiny, &o);
	B.m = m32;
	cr_assert_eq(ct_rank_open_engine(&B, 0, 16, 8, "e32", "org/b", &b32), 0, "%s", kvr_last_error(NULL));
	B.m = keep;
	ct_map_l1(&B);
	cr_assert_eq(ct_rank_open_engine(&B, 0, 16, 0, "e16", "org/a", &b16), 0, "%s", kvr_last_error(NULL));
	cr_assert(H_WAIT(ct_stat(&B, "remote", KVR_STAT_RM_SLOTS_COVERED) == KVR_RC_SLOTS, 5000));
	for (unsigned p = 0; p < 2; p++) {
		cr_assert_eq(ct_lookup_load_exact(b32, 100 + p, t32[p], BLOCKS * 32, 0, TAG(p + 50, 0)), BLOCKS,
			     "32-token prompt %u on B", p);
		cr_assert_eq(ct_lookup_load_exact(b16, 110 + p, tokens[p], BLOCKS * BT, 0, TAG(p, 0)), BLOCKS,
			     "16-token prompt %u on B", p);
	}
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_HITS), 4 * BLOCKS);
	cr_assert_eq(ct_stat(&B, "remote", KVR_STAT_RM_MISSES) + ct_stat(&B, "remote", KVR_STAT_RM_BAD_VALUES), 0);
	ct_close_all();
	ct_assert_table_clean(&A);
	ct_assert_table_clean(&B);
}
