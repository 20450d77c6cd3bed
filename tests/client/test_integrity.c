/* Integrity under faults (issue 11): one regression test per slot-lifecycle defect, each causing its fault for real. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"

/*
 * Every test runs the real kvringd with an L2 tier and a ct_tiny model (one 4 KiB slot per
 * block lane). Faults are caused, not simulated: kill -9 of a worker or an actor, SIGSTOP
 * of the disk actor, and the disk actor's read gate (KVRING_TEST_READ_GATE, disk.c), which
 * holds every L2 read after its slot was claimed and before its I/O is submitted — a read
 * that completes as late as the test wants. Each test ends with the slot table checked
 * (only FREE and COMMITTED, no pins, once quiet) and every loaded byte compared.
 */

static struct ct_env env;
static char l2dir[256], gatedir[256];
static int gate_fd = -1, wgate_fd = -1;

static void setup(void)
{
	ct_init(&env);
	snprintf(l2dir, sizeof(l2dir), "%s/l2", env.h.dir);
	snprintf(gatedir, sizeof(gatedir), "%s/gate", env.h.dir);
	cr_assert_eq(mkdir(l2dir, 0700), 0);
}

static void teardown(void)
{
	if (env.h.pid > 0)
		(void)kill(env.h.pid, SIGKILL);
	ct_fini(&env);
	if (gate_fd >= 0)
		(void)close(gate_fd);
	if (wgate_fd >= 0)
		(void)close(wgate_fd);
	gate_fd = wgate_fd = -1;
	(void)unsetenv("KVRING_TEST_READ_GATE");
}

TestSuite(integrity, .init = setup, .fini = teardown, .timeout = 120);


#define BT 16
#define BLOCKS 4
#define MAXP 32
#define TAG(p, i) (7000ull * (p) + (i) + 1)

static uint32_t tokens[MAXP][BLOCKS * BT];

/* ---- the read gate ---------------------------------------------------------------------- */

/* Every L2 read of the kvringd started next waits at the gate. */
static void gate_arm(void)
{
	char p[300];
	cr_assert_eq(mkdir(gatedir, 0700), 0);
	snprintf(p, sizeof(p), "%s/gate", gatedir);
	cr_assert_eq(mkfifo(p, 0600), 0);
	gate_fd = open(p, O_RDWR | O_CLOEXEC); /* O_RDWR: never blocks, writes never block */
	cr_assert(gate_fd >= 0);
	cr_assert_eq(setenv("KVRING_TEST_READ_GATE", gatedir, 1), 0);
}

/* Every L2 write waits at the gate too (gate_arm first). */
static void wgate_arm(void)
{
	char p[300];
	snprintf(p, sizeof(p), "%s/wgate", gatedir);
	cr_assert_eq(mkfifo(p, 0600), 0);
	wgate_fd = open(p, O_RDWR | O_CLOEXEC);
	cr_assert(wgate_fd >= 0);
}

static void release(int fd, unsigned n)
{
	char b[64] = {0};
	while (n) {
		unsigned k = n < sizeof(b) ? n : sizeof(b);
		cr_assert_eq(write(fd, b, k), (ssize_t)k);
		n -= k;
	}
}

/* Let n held (or future) reads go. */
static void gate_release(unsigned n)
{
	release(gate_fd, n);
}

static unsigned lines_of(const char *name)
{
	char p[300];
	snprintf(p, sizeof(p), "%s/%s", gatedir, name);
	FILE *f = fopen(p, "r");
	if (!f)
		return 0;
	unsigned n = 0;
	for (int c; (c = fgetc(f)) != EOF;)
		n += c == '\n';
	fclose(f);
	return n;
}

/* Reads that reached the gate so far. */
static unsigned gate_held(void)
{
	return lines_of("held.log");
}

/* ---- workload ----------------------------------------------------------------------------- */

/* The first n blocks of prompt p from engine blocks 0.. of r; asserts every one was stored. */
static void store_n(struct ct_rank *r, unsigned p, uint32_t n)
{
	ct_prompt(tokens[p], BLOCKS * BT, 900 + p);
	uint32_t blocks[BLOCKS];
	for (uint32_t i = 0; i < n; i++) {
		blocks[i] = i;
		ct_fill(r, i, TAG(p, i));
	}
	struct ct_done d;
	ct_store(r, 1000 + p, tokens[p], n * BT, blocks, n, &d);
	cr_assert_eq(d.c.status, 0, "store of prompt %u: %d", p, d.c.status);
	cr_assert_eq(d.c.n_stored + d.c.n_present, n, "prompt %u: %u stored, %u failed", p, d.c.n_stored,
		     d.c.n_failed);
}

static void store_prompt(struct ct_rank *r, unsigned p)
{
	store_n(r, p, BLOCKS);
}

/* Look prompt p up, load what matched into blocks 8.. and compare every byte. Returns the
 * blocks matched. */
static uint32_t load_exact(struct ct_rank *r, uint64_t req, unsigned p)
{
	return ct_lookup_load_exact(r, req, tokens[p], BLOCKS * BT, 8, TAG(p, 0));
}

static uint64_t lk(unsigned s)
{
	return ct_stat(&env, "lookup", s);
}

static void assert_table_clean(void)
{
	ct_assert_table_clean(&env);
}

/* A worker in a child process: attaches, looks prompt p up (that starts its promotion
 * reads) and waits to be killed. */
static pid_t spawn_lookup_child(unsigned p, int *ret_worker)
{
	return ct_spawn_rank_child(&env, 0, 16, tokens[p], BLOCKS * BT, ret_worker);
}

/* The worker slot went back to FREE: its actors exited and the lookup actor handled its death. */
static void wait_worker_free(unsigned w)
{
	struct kvr_worker_ent *we = kvr_ctl_worker(env.h.ctl, w);
	cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_FREE, 5000), "worker slot %u not freed", w);
}

/* Close rank r (this engine's only rank 0) and wait until its worker slot is free. */
static void close_rank(struct ct_rank *r)
{
	unsigned w = r->worker;
	ct_rank_close(r);
	wait_worker_free(w);
}

static void kill_child(pid_t pid)
{
	cr_assert_eq(kill(pid, SIGKILL), 0);
	cr_assert_eq(waitpid(pid, NULL, 0), pid);
	ct_untrack_child(pid);
}

/* L1 of 8 slots (two prompts): prompts 0..2 stored and written through; prompt 0 is only
 * on disk afterwards, 1 and 2 in L1. */
static struct ct_rank *three_prompts_one_on_disk(const struct ct_opts *o)
{
	ct_start(&env, &ct_tiny, o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	for (unsigned p = 0; p < 3; p++) {
		store_prompt(r, p);
		cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == (p + 1) * BLOCKS, 5000), "prompt %u written through", p);
	}
	kvr_key k0;
	ct_keys(&env, tokens[0], BT, &k0);
	cr_assert_eq(ct_find_slot(&env, k0, 0), -1, "prompt 0 still in L1");
	return r;
}

/*
 * Defect 1: a late L2 read into a recycled slot. Worker A's lookup promotes prompt 0 from
 * L2: 4 slots allocated, the first read held at the gate. A is killed -9. Worker B then
 * stores prompt 3, which needs room. The held read completes only after that. Before the
 * fix, A's death freed the promotion slots, B's store got them (LIFO) and the late read
 * overwrote B's committed block with prompt 0's payload. Now the promotion slots belong to
 * the lookup actor, an aborted one with its read in flight drains, and B's bytes are B's.
 */
Test(integrity, late_read_never_lands_in_a_recycled_slot)
{
	gate_arm();
	struct ct_opts o = {.l1_slots = 8, .l2_dir = l2dir, .max_workers = 2};
	close_rank(three_prompts_one_on_disk(&o)); /* one engine of TP 1: one rank 0 at a time */
	uint64_t gone0 = lk(KVR_STAT_LK_WORKERS_GONE), reads0 = lk(KVR_STAT_LK_L2_READS);
	int wa;
	pid_t a = spawn_lookup_child(0, &wa);
	cr_assert(H_WAIT(gate_held() >= 1, 5000), "no promotion read reached the gate");
	/* the lookup actor may still be allocating the later blocks when the first read is held */
	cr_assert(H_WAIT(ct_count_state(&env, KVR_SLOT_WRITING) == BLOCKS, 3000), "the promotion's slots");
	kill_child(a);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_WORKERS_GONE) == gone0 + 1, 5000), "WORKER_GONE not handled");
	wait_worker_free((unsigned)wa);

	struct ct_rank *b;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &b), 0, "%s", kvr_last_error(NULL));
	store_prompt(b, 3); /* needs room: evicts prompt 1 (the promotion's slots are not free) */
	gate_release(64);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_READS) + lk(KVR_STAT_LK_L2_READ_FAILS) >= reads0 + BLOCKS, 5000),
		  "the held reads did not finish");
	cr_assert_eq(load_exact(b, 2000, 3), BLOCKS, "prompt 3 not all in L1");
	cr_assert_eq(load_exact(b, 2001, 0), BLOCKS, "prompt 0 (promoted for the dead worker) in L1 or L2");
	cr_assert_eq(load_exact(b, 2002, 2), BLOCKS);
	assert_table_clean();
	/* every file on disk still holds its own block: prompt 1 (evicted) comes back from L2 */
	cr_assert_eq(load_exact(b, 2003, 1), BLOCKS);
	assert_table_clean();
}

/*
 * Defect 2: one pin index, two owners. A lookup that waits for promotions pins its L1
 * prefix (the lookup actor's own pin); the lookup actor is killed -9 meanwhile. Before the
 * fix those pins (shared with the disk actors') stayed forever and the promotion slots
 * stayed WRITING. Now the successor drops every lookup pin at start and aborts the dead
 * actor's promotions (the one with a read in flight drains until the read ends).
 */
Test(integrity, killed_lookup_leaves_no_pins)
{
	gate_arm();
	struct ct_opts o = {.l1_slots = 8, .l2_dir = l2dir, .max_workers = 2};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	/* prompt 0's first two blocks stay in L1, its last two go to disk only */
	for (unsigned p = 0; p < 2; p++) {
		store_prompt(r, p);
		cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == (p + 1) * BLOCKS, 5000));
	}
	cr_assert_eq(ct_lookup(r, 10, tokens[0], 2 * BT), 2);
	cr_assert_eq(load_exact(r, 11, 1), BLOCKS);
	store_n(r, 2, 2); /* evicts prompt 0's blocks 2 and 3, the least recent */
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == 2 * BLOCKS + 2, 5000));
	cr_assert_eq(ct_lookup(r, 12, tokens[0], 2 * BT), 2, "prompt 0: 2 blocks in L1 (the lookup pins them)");
	close_rank(r);
	int w;
	pid_t child = spawn_lookup_child(0, &w);
	cr_assert(H_WAIT(gate_held() >= 1, 5000), "no promotion read reached the gate");
	pid_t lpid = ct_actor_pid(&env, "lookup");
	cr_assert_eq(kill(lpid, SIGKILL), 0);
	pid_t np = ct_wait_ready(&env, "lookup", lpid, 5000);
	cr_assert(np > 0 && np != lpid);
	kill_child(child);
	gate_release(64);
	wait_worker_free((unsigned)w); /* the new lookup actor handled the child's death */
	assert_table_clean();
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(load_exact(r, 20, 0), BLOCKS, "prompt 0 from L1 or L2 after the restart");
	cr_assert_eq(load_exact(r, 21, 1), BLOCKS);
	assert_table_clean();
}

/*
 * A lookup actor killed -9 after it took a gone worker's WORKER_GONE off its ring and before
 * it acknowledged it took the message with it. kvringd had sent it once, so the slot stayed
 * DETACHING forever: no worker could attach there again (tools/tsan.sh hit it: "no free
 * worker slot" for the second bench's rank 1). The test takes the message off the stopped
 * lookup actor's ring itself, kills the actor, and the restarted one must get WORKER_GONE
 * again: the slot goes free, a new worker attaches there, stores and loads byte-exact.
 */
Test(integrity, a_worker_gone_lost_with_a_killed_lookup_actor_is_sent_again)
{
	struct ct_opts o = {.l1_slots = 16, .max_workers = 1};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	store_prompt(r, 0);
	unsigned w = r->worker;
	uint32_t gen = kvr_ctl_worker(env.ctl, w)->generation;
	pid_t lpid = ct_actor_pid(&env, "lookup");
	ct_stop_process(lpid); /* from here the test is the ring's one consumer */
	ct_rank_close(r);
	/* kvringd sends WORKER_GONE once the worker's loader and storer have exited */
	struct kvr_ring *in = ct_ring(&env, "ctl.lookup.in");
	cr_assert(H_WAIT(kvr_ring_count(in) >= 1, 5000), "no WORKER_GONE on the lookup actor's ring");
	struct kvr_msg m;
	struct kvr_msg_worker_gone g;
	bool taken = false;
	while (!taken && kvr_ring_try_dequeue(in, &m) == 0) /* PINGs may come first */
		taken = m.hdr.type == KVR_MSG_WORKER_GONE;
	cr_assert(taken, "WORKER_GONE taken off the ring, as the lookup actor would");
	cr_assert_eq(kvr_msg_decode_worker_gone(&m, &g), 0);
	cr_assert_eq(g.worker, w);
	cr_assert_eq(g.generation, gen);
	cr_assert_eq(kill(lpid, SIGKILL), 0); /* ... and died with it */
	pid_t np = ct_wait_ready(&env, "lookup", lpid, 5000);
	cr_assert(np > 0 && np != lpid);
	wait_worker_free(w);
	cr_assert(h_log_contains(&env.h, "WORKER_GONE again, to the restarted lookup actor"));
	assert_table_clean();

	/* the slot serves a new worker */
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(r->worker, w);
	cr_assert_eq(kvr_ctl_worker(env.ctl, w)->generation, gen + 1);
	cr_assert_eq(load_exact(r, 30, 0), BLOCKS, "prompt 0, stored by the worker before");
	store_prompt(r, 1);
	cr_assert_eq(load_exact(r, 31, 1), BLOCKS);
	cr_assert_eq(atomic_load(&kvr_ctl_worker(env.ctl, w)->state), KVR_WORKER_ATTACHED, "the new worker kept its slot");
	close_rank(r);
	assert_table_clean();
}

/*
 * Defect 3: an aborted promotion forgot that a block is on disk. A promotion of prompt 0
 * is in flight (first read held) when its requester is killed -9. Before the fix that freed
 * the promotion slots, the disk actor answered the reads still queued -ESTALE, and -ESTALE
 * removed those block lanes from the on-disk set: later lookups missed blocks whose files
 * are intact. Now the promotion completes for L1 (the slots are the lookup actor's), and a
 * lane is forgotten only when the disk actor says its file is gone. Then the disk actor is
 * killed with a promotion in flight too: the same must hold across its restart.
 */
Test(integrity, aborted_promotion_keeps_the_block_on_disk)
{
	gate_arm();
	struct ct_opts o = {.l1_slots = 8, .l2_dir = l2dir, .max_workers = 2};
	close_rank(three_prompts_one_on_disk(&o));
	uint64_t reads0 = lk(KVR_STAT_LK_L2_READS) + lk(KVR_STAT_LK_L2_READ_FAILS);
	int w;
	pid_t child = spawn_lookup_child(0, &w);
	cr_assert(H_WAIT(gate_held() >= 1, 5000), "no promotion read reached the gate");
	kill_child(child);
	wait_worker_free((unsigned)w);
	gate_release(64);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_READS) + lk(KVR_STAT_LK_L2_READ_FAILS) >= reads0 + BLOCKS, 5000),
		  "the promotion's reads did not end");
	assert_table_clean();
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	/* push prompt 0 out of L1 again: every one of its blocks must come back from disk */
	store_prompt(r, 3);
	store_prompt(r, 4);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == 5 * BLOCKS, 5000));
	cr_assert_eq(h_count_files(l2dir, ".kvb"), 5 * BLOCKS, "every file is there");
	uint32_t got = load_exact(r, 30, 0);
	cr_assert_eq(got, BLOCKS, "prompt 0's files are intact: all 4 blocks must be found, got %u", got);
	assert_table_clean();

	/* and with the disk actor killed while a promotion read is held */
	store_prompt(r, 1);
	store_prompt(r, 2); /* prompt 0 out of L1 once more */
	uint32_t held = gate_held();
	close_rank(r);
	child = spawn_lookup_child(0, &w);
	cr_assert(H_WAIT(gate_held() > held, 5000), "no promotion read reached the gate");
	pid_t dpid = ct_actor_pid(&env, "disk.0");
	cr_assert_eq(kill(dpid, SIGKILL), 0);
	cr_assert(ct_wait_ready(&env, "disk.0", dpid, 5000) > 0);
	kill_child(child);
	wait_worker_free((unsigned)w);
	gate_release(64);
	assert_table_clean();
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	got = load_exact(r, 31, 0);
	cr_assert_eq(got, BLOCKS, "after the disk actor's restart: got %u of prompt 0", got);
	assert_table_clean();
}

/* kvringd with 8 L1 slots and an L2 tier whose every read and write waits at the test's
 * gates; one rank attached. */
static struct ct_rank *start_write_gated(void)
{
	gate_arm();
	wgate_arm();
	struct ct_opts o = {.l1_slots = 8, .l2_dir = l2dir, .max_workers = 2};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	return r;
}

/*
 * Defect 4: a dead disk actor failed stores instead of backpressuring. L1 (8 slots) fills
 * with lanes waiting for their write; the disk actor has taken the first write off its ring
 * and holds it (the write gate); a store that needs room waits for those writes. The disk
 * actor is killed -9 with that write in hand. Before the fix the lookup actor forgot every
 * write in flight when it saw the death and answered the waiting store NOROOM at once. Now
 * the dead actor's unanswered writes go to its successor again, they complete, the waiting
 * store finds room: nothing fails, and every lane reaches L2.
 */
Test(integrity, dead_disk_actor_backpressures_stores)
{
	struct ct_rank *r = start_write_gated();
	store_prompt(r, 0);
	store_prompt(r, 1);
	cr_assert(H_WAIT(lines_of("wheld.log") == 1, 3000), "the disk actor holds no write");
	struct kvr_ring *dreq = ct_ring(&env, "disk.req.0");
	/* prompt 2 needs room that only those writes can make */
	ct_prompt(tokens[2], BLOCKS * BT, 902);
	uint32_t blocks[BLOCKS] = {4, 5, 6, 7};
	for (uint32_t i = 0; i < BLOCKS; i++)
		ct_fill(r, blocks[i], TAG(2, i));
	cr_assert_eq(kvr_store(r->c, 1002, tokens[2], BLOCKS * BT, NULL, 0, blocks, BLOCKS), 0);
	pid_t dpid = ct_actor_pid(&env, "disk.0");
	uint32_t sent = atomic_load(&dreq->shm->tail); /* the lookup actor is its only producer */
	cr_assert_eq(kill(dpid, SIGKILL), 0);
	cr_assert(ct_wait_ready(&env, "disk.0", dpid, 5000) > 0);
	/* the lookup actor saw the death once it asks the successor for its list (L2_SYNC):
	 * whatever it decides about the waiting store, it decides in that same pass */
	cr_assert(H_WAIT(atomic_load(&dreq->shm->tail) != sent, 3000), "the lookup actor did not notice the death");
	struct ct_done d;
	bool early = kvr_poll(r->c, &d.c, 1) == 1;
	cr_assert(!early || d.c.status == 0, "the store failed when the disk actor died: %d (%u failed)", d.c.status,
		  d.c.n_failed);
	release(wgate_fd, 64);
	if (!early)
		ct_wait_done(r, &d, 10000);
	cr_assert_eq(d.c.status, 0, "store while the disk actor died: %d", d.c.status);
	cr_assert_eq(d.c.n_stored, BLOCKS, "%u stored, %u failed: a dead disk actor is backpressure, not NOROOM",
		     d.c.n_stored, d.c.n_failed);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) >= 3 * BLOCKS, 5000), "every lane reaches L2: %llu",
		  (unsigned long long)lk(KVR_STAT_LK_L2_WRITES));
	cr_assert_eq(lk(KVR_STAT_LK_L2_WRITE_FAILS), 0);
	unsigned files = h_count_files(l2dir, ".kvb");
	cr_assert_eq(files, 3 * BLOCKS, "%u block files, want %u (L2 writes %llu, queued %llu)", files, 3 * BLOCKS,
		     (unsigned long long)lk(KVR_STAT_LK_L2_WRITES), (unsigned long long)lk(KVR_STAT_LK_L2_WRITES_QUEUED));
	gate_release(64); /* promotion reads of the prompts evicted meanwhile */
	for (unsigned p = 0; p < 3; p++)
		cr_assert_eq(load_exact(r, 40 + p, p), BLOCKS);
	assert_table_clean();
}

/*
 * Defect 6: a write of a lane whose first write was still in flight (a duplicate: the lookup
 * actor sends a dead disk actor's unanswered writes again, and the successor finds the old
 * ones still in its ring) was answered "done" at once, before the file it stood for existed;
 * the lookup actor then counted the lane on disk and let its slot go. Seen as a block file
 * missing right after every write was counted (dead_disk_actor_backpressures_stores, under
 * load). Here the lookup actor's write-through of one lane is held at the write gate, the
 * test (the lookup actor stopped) sends the same write again, and lets both through: the
 * duplicate is answered after the write it duplicates, when the file is there.
 */
Test(integrity, a_duplicate_write_is_answered_after_the_write_it_duplicates)
{
	struct ct_rank *r = start_write_gated();
	store_n(r, 0, 1);
	cr_assert(H_WAIT(lines_of("wheld.log") == 1, 3000), "the disk actor holds no write");
	kvr_key key;
	ct_keys(&env, tokens[0], BT, &key);
	int slot = ct_find_slot(&env, key, 0);
	cr_assert_geq(slot, 0);
	pid_t lpid = ct_actor_pid(&env, "lookup");
	ct_stop_process(lpid); /* disk.req.0's producer and disk.rep.0's consumer: the test stands in */
	struct kvr_ring *dreq = ct_ring(&env, "disk.req.0"), *drep = ct_ring(&env, "disk.rep.0");
	struct kvr_msg_l2 b = {.key_lo = key.lo, .key_hi = key.hi, .slot = (uint32_t)slot,
			       .epoch = kvr_slot_epoch(env.slots, (uint32_t)slot), .lane = 0};
	struct kvr_msg m;
	const uint64_t dup = 0xd0b1e;
	kvr_msg_build(&m, KVR_MSG_L2_WRITE, 0, dup, 0, &b, sizeof(b));
	cr_assert_eq(kvr_ring_enqueue(dreq, &m, 2000000000ll), 0);
	release(wgate_fd, 8); /* the held write, the duplicate, and the duplicate's retries */
	uint64_t first = 0;
	for (unsigned got = 0; got < 2;) {
		cr_assert_eq(kvr_ring_dequeue(drep, &m, 5000000000ll), 0, "%u of 2 answers", got);
		struct kvr_msg_l2 a;
		if (m.hdr.type != KVR_MSG_L2_WRITE_DONE || kvr_msg_decode_l2(&m, 0, &a))
			continue;
		cr_assert_eq(a.status, 0, "write %llx: %d", (unsigned long long)m.hdr.req_id, a.status);
		cr_assert_eq(h_count_files(l2dir, ".kvb"), 1, "write %llx answered done before its file exists (%s)",
			     (unsigned long long)m.hdr.req_id, m.hdr.req_id == dup ? "the duplicate" : "the first");
		if (got++ == 0)
			first = m.hdr.req_id;
	}
	cr_assert_neq(first, dup, "the duplicate was answered before the write it duplicates");
	cr_assert_eq(kill(lpid, SIGCONT), 0);
	gate_release(64);
	cr_assert_eq(load_exact(r, 50, 0), 1);
	assert_table_clean();
}

/*
 * Defect 5: write-through silently dropped writes when the disk actor's ring was full
 * (rings hold 64 messages here). With the disk actor stopped, 20 prompts commit 80 lanes;
 * when it runs again every one of them is written (none skipped), in order.
 */
Test(integrity, write_through_never_skips_on_a_full_ring)
{
	const unsigned P = 20;
	struct ct_opts o = {.l1_slots = 96, .l2_dir = l2dir, .max_workers = 2};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	pid_t dpid = ct_actor_pid(&env, "disk.0");
	ct_stop_process(dpid);
	for (unsigned p = 0; p < P; p++)
		store_prompt(r, p);
	cr_assert_eq(lk(KVR_STAT_LK_L2_WRITES_SKIPPED), 0);
	cr_assert_eq(kill(dpid, SIGCONT), 0);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == P * BLOCKS, 10000), "written: %llu of %u",
		  (unsigned long long)lk(KVR_STAT_LK_L2_WRITES), P * BLOCKS);
	cr_assert_eq(lk(KVR_STAT_LK_L2_WRITES_SKIPPED), 0);
	cr_assert_eq(h_count_files(l2dir, ".kvb"), P * BLOCKS);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES_QUEUED) == 0, 3000));
	for (unsigned p = 0; p < P; p++)
		cr_assert_eq(load_exact(r, 60 + p, p), BLOCKS);
	assert_table_clean();
}

/*
 * An answer lost between the disk actor and the lookup actor (the disk actor drops a reply
 * it cannot send within 5 s, when the lookup actor's ring stays full): found by the fault
 * suite as a promotion waiting forever, its slots WRITING and its prefix pinned. Here the
 * test takes the promotion's reads off the stopped disk actor's ring itself, so no answer
 * ever comes: the lookup actor gives them up after its answer timeout (8 s), the slots are
 * freed and the pins dropped, and the blocks are still known on disk.
 */
Test(integrity, a_lost_disk_answer_is_given_up)
{
	struct ct_opts o = {.l1_slots = 8, .l2_dir = l2dir, .max_workers = 2};
	close_rank(three_prompts_one_on_disk(&o));
	pid_t dpid = ct_actor_pid(&env, "disk.0");
	ct_stop_process(dpid);
	int w;
	pid_t child = spawn_lookup_child(0, &w);
	struct kvr_ring *dreq = ct_ring(&env, "disk.req.0");
	cr_assert(H_WAIT(kvr_ring_count(dreq) == BLOCKS, 3000), "the promotion's reads were not sent");
	struct kvr_msg m;
	for (unsigned i = 0; i < BLOCKS; i++) { /* the disk actor is stopped: we are its ring's only reader */
		cr_assert_eq(kvr_ring_try_dequeue(dreq, &m), 0);
		cr_assert_eq(m.hdr.type, KVR_MSG_L2_READ, "message %u on disk.req.0 is a %s", i,
			     kvr_msg_type_name(m.hdr.type));
	}
	uint64_t ended0 = lk(KVR_STAT_LK_L2_READS) + lk(KVR_STAT_LK_L2_READ_FAILS);
	cr_assert_eq(kill(dpid, SIGCONT), 0);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_WRITING), BLOCKS);
	cr_assert(H_WAIT(ct_table_clean(&env), 15000), "the unanswered promotion was never given up");
	cr_assert_eq(lk(KVR_STAT_LK_L2_READS) + lk(KVR_STAT_LK_L2_READ_FAILS), ended0 + BLOCKS,
		     "the promotion's reads ended other than by being given up; log:\n%s", h_read_file(env.h.log));
	/* the actor's line reaches kvringd's log a moment after its counters move */
	cr_assert(H_WAIT(h_log_contains(&env.h, "unanswered"), 3000), "the give-up is not logged");
	cr_assert_eq(lk(KVR_STAT_LK_L2_ANSWERS_LOST), BLOCKS, "every lost answer counted");
	kill_child(child);
	wait_worker_free((unsigned)w);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	cr_assert_eq(load_exact(r, 50, 0), BLOCKS, "prompt 0 is still known on disk");
	assert_table_clean();
}
