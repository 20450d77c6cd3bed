/* kvring-disk through the real kvringd: write-through files land on disk, an L1 miss is promoted back byte-exact. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include "client_harness.h"
#include "kvr_list.h"
#include "l2file.h"
#include "kvr_time.h"

static struct ct_env env;
static char l2dir[64];

static void setup(void)
{
	snprintf(l2dir, sizeof(l2dir), "/tmp/kvr-dact-%d-XXXXXX", (int)getpid());
	cr_assert_not_null(mkdtemp(l2dir));
	ct_init(&env);
}

static void teardown(void)
{
	ct_fini(&env);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", l2dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", l2dir);
}

TestSuite(disk_actor, .init = setup, .fini = teardown, .timeout = 60);

#define TAG(prompt, i) (1000ull * (prompt) + (i) + 1)

static unsigned wait_files(const char *root, unsigned want, int ms)
{
	uint64_t end = kvr_now_ns() + (uint64_t)ms * 1000000ull;
	unsigned n;
	while ((n = h_count_files(root, ".kvb")) < want && kvr_now_ns() < end)
		usleep(10000);
	return n;
}

static void store_prompt(struct ct_rank *r, uint64_t req, uint64_t seed, const uint32_t *src, uint32_t n)
{
	size_t n_tokens = (size_t)n * ct_tiny.block_tokens;
	uint32_t tokens[16 * 16];
	ct_prompt(tokens, n_tokens, seed);
	struct ct_done d;
	ct_store(r, req, tokens, n_tokens, src, n, &d);
	cr_assert_eq(d.c.status, 0, "store: status %d", d.c.status);
	cr_assert_eq(d.c.n_stored, n, "stored %u of %u", d.c.n_stored, n);
}

/*
 * L1 holds 8 slots. Prompt A (4 blocks) is stored and written through: 4 files. Prompt B
 * (8 blocks) pushes A out of L1: 12 files. A lookup of A then matches all 4 blocks through
 * promotion reads, and loading them restores A's bytes exactly.
 */
Test(disk_actor, write_through_then_promote)
{
	struct ct_opts o = {.l1_slots = 8, .l2_dir = l2dir};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 32, 0, &r), 0, "attach: %s", kvr_last_error(NULL));
	uint32_t a_src[4] = {1, 2, 3, 4}, b_src[8] = {5, 6, 7, 8, 9, 10, 11, 12}, dst[4] = {20, 21, 22, 23};
	for (uint32_t i = 0; i < 4; i++)
		ct_fill(r, a_src[i], TAG(1, i));
	for (uint32_t i = 0; i < 8; i++)
		ct_fill(r, b_src[i], TAG(2, i));

	store_prompt(r, 1, 101, a_src, 4);
	cr_assert_eq(wait_files(l2dir, 4, 5000), 4, "A's 4 lanes written through");
	store_prompt(r, 2, 202, b_src, 8);
	cr_assert_eq(wait_files(l2dir, 12, 5000), 12, "A and B on disk");
	kvr_key keys[4];
	uint32_t tokens[4 * 16];
	ct_prompt(tokens, 4 * 16, 101);
	ct_keys(&env, tokens, 4 * 16, keys);
	for (unsigned i = 0; i < 4; i++)
		cr_assert_lt(ct_find_slot(&env, keys[i], 0), 0, "A's block %u left L1", i);

	cr_assert_eq(ct_lookup(r, 3, tokens, 4 * 16), 4, "A matched through L2");
	struct ct_done d;
	ct_load(r, 3, dst, 4, &d);
	cr_assert_eq(d.c.status, 0, "load: status %d", d.c.status);
	cr_assert_eq(d.c.n_failed, 0);
	for (uint32_t i = 0; i < 4; i++) {
		char why[200] = "";
		cr_assert(ct_holds(r, dst[i], TAG(1, i), why, sizeof(why)), "promoted block %u: %s", i, why);
	}
	cr_assert_eq(ct_stat(&env, "disk.0", KVR_STAT_MALFORMED), 0);
	cr_assert_geq(ct_stat(&env, "disk.0", KVR_STAT_MSGS_IN), 12 + 4 + 1, "writes, reads and the sync");
}

/*
 * L2 holds 6 files (header + one 4 KiB lane each). A (4 blocks) then B (8 blocks): each of
 * B's writes past the cap evicts the least recently written file — A's 4, then B's first 2
 * — and the disk actor tells the lookup actor (L2_GONE). A lookup of A then matches nothing
 * without a single promotion read attempted (the lookup actor knew the files were gone).
 */
Test(disk_actor, eviction_reported_gone)
{
	struct ct_opts o = {.l1_slots = 8, .l2_dir = l2dir, .l2_bytes = 6 * 8192};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 32, 0, &r), 0, "attach: %s", kvr_last_error(NULL));
	uint32_t a_src[4] = {1, 2, 3, 4}, b_src[8] = {5, 6, 7, 8, 9, 10, 11, 12};
	for (uint32_t i = 0; i < 4; i++)
		ct_fill(r, a_src[i], TAG(1, i));
	for (uint32_t i = 0; i < 8; i++)
		ct_fill(r, b_src[i], TAG(2, i));
	store_prompt(r, 1, 101, a_src, 4);
	cr_assert_eq(wait_files(l2dir, 4, 5000), 4);
	store_prompt(r, 2, 202, b_src, 8);
	/* all 12 writes answered, then the files settle at the cap */
	uint64_t end = kvr_now_ns() + 5000000000ull;
	while (ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) < 12 && kvr_now_ns() < end)
		usleep(10000);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES), 12);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITE_FAILS), 0);
	usleep(100000);
	cr_assert_eq(h_count_files(l2dir, ".kvb"), 6, "the cap holds 6 files");

	uint32_t tokens[4 * 16];
	ct_prompt(tokens, 4 * 16, 101);
	cr_assert_eq(ct_lookup(r, 3, tokens, 4 * 16), 0, "A is gone from L1 and L2");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0, "no read of a file known gone");
	cr_assert_eq(ct_stat(&env, "disk.0", KVR_STAT_MALFORMED), 0);
}

/* Whether (key, lane 0)'s block file is in the L2 root's namespace directory. */
static bool on_disk(kvr_key key)
{
	char name[KVR_L2_NAME_MAX], p[PATH_MAX];
	kvr_l2_name_fmt(key, 0, name);
	DIR *d = opendir(l2dir);
	cr_assert_not_null(d);
	bool found = false;
	for (struct dirent *e; !found && (e = readdir(d));) {
		snprintf(p, sizeof(p), "%s/%s/%s", l2dir, e->d_name, name);
		found = e->d_name[0] != '.' && access(p, F_OK) == 0;
	}
	closedir(d);
	return found;
}

/*
 * L2 holds 6 files, L1 8 slots. A (4 blocks) is written first, C (2) after it: A's files
 * are the least recent on disk. A is hot in L1 (a lookup hits all 4; its files are never
 * read): the lookup actor's tick sends its 4 lanes as L2_TOUCH and the disk actor moves
 * them to the recent end. B's 2 writes then evict C's 2 files, not A's — which, before
 * the touch, were the first to go however hot A was.
 */
Test(disk_actor, a_lane_hot_in_l1_keeps_its_file)
{
	struct ct_opts o = {.l1_slots = 8, .l2_dir = l2dir, .l2_bytes = 6 * 8192};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 32, 0, &r), 0, "attach: %s", kvr_last_error(NULL));
	uint32_t a_src[4] = {1, 2, 3, 4}, c_src[2] = {5, 6}, b_src[2] = {7, 8};
	for (uint32_t i = 0; i < 4; i++)
		ct_fill(r, a_src[i], TAG(1, i));
	for (uint32_t i = 0; i < 2; i++) {
		ct_fill(r, c_src[i], TAG(3, i));
		ct_fill(r, b_src[i], TAG(2, i));
	}
	store_prompt(r, 1, 101, a_src, 4);
	cr_assert_eq(wait_files(l2dir, 4, 5000), 4);
	store_prompt(r, 2, 303, c_src, 2);
	cr_assert_eq(wait_files(l2dir, 6, 5000), 6);

	uint32_t tokens[4 * 16];
	kvr_key a[4], c[2];
	ct_prompt(tokens, 4 * 16, 101);
	ct_keys(&env, tokens, 4 * 16, a);
	uint32_t ctok[2 * 16];
	ct_prompt(ctok, 2 * 16, 303);
	ct_keys(&env, ctok, 2 * 16, c);
	uint64_t t0 = ct_stat(&env, "disk.0", KVR_STAT_DK_TOUCHED);
	cr_assert_eq(ct_lookup(r, 3, tokens, 4 * 16), 4, "A in L1");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), 0, "hits in L1, no read");
	cr_assert(H_WAIT(ct_stat(&env, "disk.0", KVR_STAT_DK_TOUCHED) - t0 >= 4, 5000),
		  "A's 4 lanes were not touched on disk (%llu)",
		  (unsigned long long)(ct_stat(&env, "disk.0", KVR_STAT_DK_TOUCHED) - t0));
	cr_assert_eq(ct_stat(&env, "disk.0", KVR_STAT_DK_TOUCHED) - t0, 4, "touched once per use");

	store_prompt(r, 4, 202, b_src, 2);
	uint64_t end = kvr_now_ns() + 5000000000ull;
	while (ct_stat(&env, "disk.0", KVR_STAT_DK_EVICTED) < 2 && kvr_now_ns() < end)
		usleep(10000);
	cr_assert_eq(ct_stat(&env, "disk.0", KVR_STAT_DK_EVICTED), 2);
	for (unsigned i = 0; i < 4; i++)
		cr_assert(on_disk(a[i]), "A's block %u was evicted from L2 though hot in L1", i);
	/* the unlinks of the evicted files land behind the count */
	cr_assert(H_WAIT(!on_disk(c[0]) && !on_disk(c[1]), 5000), "C's blocks (least recent) are still on disk");
}

/*
 * The lookup actor stops reading its answers (SIGSTOP) while the disk actor owes it more
 * of them than disk.rep holds: one L2_SYNC over 96 files on disk is 97 answers for a ring
 * of 64. The disk actor keeps the rest in its outbox and its loop goes on: its heartbeat
 * moves on for 300 ms with the ring full (a handler blocked in the send, as it was, stopped
 * the heartbeat for up to timeouts.reply_ms per answer: 2 s, and health checks kill an
 * actor whose heartbeat stands). Once the lookup actor runs again every answer arrives,
 * none dropped. (The stop is shorter than the 5 s after which kvringd kills the stopped
 * lookup actor itself.)
 */
Test(disk_actor, a_full_reply_ring_never_stops_its_loop)
{
	enum { FILES = 96 };
	struct ct_opts o = {.l1_slots = 16, .l2_dir = l2dir};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "attach: %s", kvr_last_error(NULL));
	uint32_t src[8] = {0, 1, 2, 3, 4, 5, 6, 7};
	for (unsigned p = 0; p < FILES / 8; p++) {
		for (uint32_t i = 0; i < 8; i++)
			ct_fill(r, src[i], TAG(p, i));
		store_prompt(r, 10 + p, 300 + p, src, 8);
	}
	cr_assert_eq(wait_files(l2dir, FILES, 5000), FILES);
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == FILES, 5000));
	struct kvr_ring *dreq = ct_ring(&env, "disk.req.0"), *drep = ct_ring(&env, "disk.rep.0");
	cr_assert(H_WAIT(kvr_ring_count(drep) == 0, 2000), "the lookup actor reads its answers");
	uint32_t cap = kvr_ring_free(drep);
	cr_assert_lt(cap, FILES + 1, "the ring (%u) must be smaller than the answers owed", cap);

	pid_t lpid = ct_actor_pid(&env, "lookup"), dpid = ct_actor_pid(&env, "disk.0");
	uint32_t dgen = ct_actor_gen(&env, "disk.0");
	/* Counted where the answers go: disk.rep's own enqueue counter. (The disk actor's
	 * KVR_STAT_MSGS_OUT also counts its PONGs to kvringd's health pings, one a second: a
	 * run slowed by a busy machine saw 101 "answers" for 97 — four pongs, no duplicate.) */
	uint64_t enq0 = atomic_load(&drep->shm->enqueued);
	uint64_t req0 = atomic_load(&dreq->shm->enqueued);
	cr_assert_eq(kill(lpid, SIGSTOP), 0);
	/* the stopped lookup actor is disk.req.0's only producer: the test sends in its place */
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_L2_SYNC, 0, 0, 0, NULL, 0);
	cr_assert_eq(kvr_msg_send(dreq, &m, kvr_now_ns() + 1000000000ull), 0);
	cr_assert(H_WAIT(kvr_ring_count(drep) == cap, 2000), "the answers fill disk.rep");
	struct kvr_actor_ent *de = h_actor(&env.h, "disk.0");
	uint64_t full_at = kvr_now_ns();
	bool alive = H_WAIT(atomic_load(&de->heartbeat_ns) > full_at + 300000000ull, 3000);
	uint32_t still = kvr_ring_count(drep);
	cr_assert_eq(kill(lpid, SIGCONT), 0);
	cr_assert(alive, "the disk actor's loop stopped with its reply ring full");
	cr_assert_eq(still, cap, "nobody read the ring meanwhile");
	cr_assert_eq(ct_actor_pid(&env, "disk.0"), dpid, "the disk actor was not killed");
	cr_assert_eq(ct_actor_gen(&env, "disk.0"), dgen);
	cr_assert(H_WAIT(atomic_load(&drep->shm->enqueued) - enq0 >= FILES + 1, 3000),
		  "every answer of the sync was sent: %llu of %u",
		  (unsigned long long)(atomic_load(&drep->shm->enqueued) - enq0), FILES + 1);
	cr_assert(H_WAIT(kvr_ring_count(drep) == 0, 3000), "and read by the lookup actor");
	cr_assert_eq(atomic_load(&drep->shm->enqueued) - enq0, FILES + 1, "no answer sent twice: %llu, requests %llu",
		     (unsigned long long)(atomic_load(&drep->shm->enqueued) - enq0), (unsigned long long)(atomic_load(&dreq->shm->enqueued) - req0));
	cr_assert_eq(ct_actor_pid(&env, "lookup"), lpid);
	cr_assert_eq(ct_stat(&env, "disk.0", KVR_STAT_MALFORMED), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_MALFORMED), 0);
	/* and the tier still works: a prompt that left L1 comes back from disk, every byte */
	uint32_t tokens[8 * 16];
	ct_prompt(tokens, 8 * 16, 300);
	cr_assert_eq(ct_lookup_load_exact(r, 99, tokens, 8 * 16, 8, TAG(0, 0)), 8);
	ct_assert_table_clean(&env);
}
