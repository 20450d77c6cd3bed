/* The L2 tier through the real kvringd, lookup and disk actors: write-through, promotion, restart, damage. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"

static struct ct_env env;
static char l2dir[256];

static void setup(void)
{
	ct_init(&env);
	snprintf(l2dir, sizeof(l2dir), "%s/l2", env.h.dir);
	cr_assert_eq(mkdir(l2dir, 0700), 0);
}

static void teardown(void)
{
	if (env.h.pid > 0)
		(void)kill(env.h.pid, SIGKILL);
	(void)umount2(l2dir, MNT_DETACH); /* the disk-full test's tmpfs, if any */
	ct_fini(&env);
}

TestSuite(l2, .init = setup, .fini = teardown, .timeout = 90);

#define TAG(prompt, i) (5000ull * (prompt) + (i) + 1)
#define PROMPTS 6
#define BLOCKS 4
#define BT 16

static uint32_t tokens[PROMPTS][BLOCKS * BT];

/* Prompt p (tokens from seed) in engine blocks 0..BLOCKS-1, stored; the store must succeed
 * (in L1, whatever the disk does). */
static void store_prompt(struct ct_rank *r, unsigned p, uint64_t seed)
{
	ct_prompt(tokens[p], BLOCKS * BT, seed);
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

/* Look prompt p up and load whatever is found into blocks 8..: byte-exact. Returns the
 * blocks found. */
static uint32_t load_found_exact(struct ct_rank *r, uint64_t req, unsigned p)
{
	return ct_lookup_load_exact(r, req, tokens[p], BLOCKS * BT, 8, TAG(p, 0));
}

static void store_prompts(struct ct_rank *r)
{
	for (unsigned p = 0; p < PROMPTS; p++) {
		store_prompt(r, p, 100 + p);
		/* the disk actor pins a slot while it writes it through: with an L1 of 4 slots the
		 * next prompt finds room only once these are on disk */
		cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == (p + 1) * BLOCKS, 5000),
			  "prompt %u written through: %llu", p,
			  (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES));
	}
}

/* Look every prompt up and load it into blocks 8..11: all from L1 or L2, byte-exact. */
static void load_all_exact(struct ct_rank *r, uint64_t req0)
{
	for (unsigned p = 0; p < PROMPTS; p++)
		cr_assert_eq(load_found_exact(r, req0 + p, p), BLOCKS, "prompt %u: not every block found in L1+L2", p);
}

static void stop_kvringd(void)
{
	ct_stop_clean(&env);
}

static void restart(const struct ct_opts *o)
{
	stop_kvringd();
	ct_start(&env, &ct_tiny, o);
}

/* A ct_tiny L1 (4 slots) in front of a large L2: every block is written through, most are
 * evicted from L1; SIGTERM, start again (L1 empty), and every prompt is served from L2. */
Test(l2, survives_restart_byte_exact)
{
	struct ct_opts o = {.l1_slots = 4, .l2_dir = l2dir};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	store_prompts(r);
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == PROMPTS * BLOCKS, 5000),
		  "written through: %llu", (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES));
	cr_assert_eq(h_count_files(l2dir, ".kvb"), PROMPTS * BLOCKS);
	cr_assert_gt(ct_stat(&env, "lookup", KVR_STAT_LK_EVICTED), 0, "L1 of 4 slots must have evicted");
	load_all_exact(r, 100);
	cr_assert_gt(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), 0, "some blocks came from L2");

	restart(&o);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), 0, "L1 starts empty");
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	/* the disk actor adopted the files and told the lookup actor */
	load_all_exact(r, 200);
	cr_assert_geq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), PROMPTS * BLOCKS - 4,
		      "served from L2 after the restart: %llu",
		      (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS));
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0);
}

/* Whether files in dir can be opened O_DIRECT (the disk actor's l2 io mode "auto" then uses it). */
static bool dir_takes_direct(const char *dir)
{
	char path[300];
	snprintf(path, sizeof(path), "%s/.direct-probe", dir);
	int fd = open(path, O_CREAT | O_RDWR | O_DIRECT, 0600);
	if (fd >= 0) {
		close(fd);
		unlink(path);
	}
	return fd >= 0;
}

/* How the disk actor moved each payload (kvring_l2_transfers_total): with L1 in huge pages
 * and O_DIRECT, every write and read is one joined transfer (header and payload, one device
 * request); in 4 KiB pages each goes through the registered arena. Asked for huge pages,
 * kvringd takes them where the machine has them free (vm.nr_hugepages) and falls back to
 * 4 KiB pages otherwise: the counts must follow what it got. Every byte loaded is compared. */
Test(l2, transfers_joined_exactly_when_l1_in_huge_pages)
{
	struct ct_opts o = {.l1_slots = 4, .l2_dir = l2dir, .huge_pages = true};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	store_prompts(r);
	load_all_exact(r, 100);
	uint64_t writes = ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES);
	uint64_t reads = ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS);
	cr_assert_eq(writes, PROMPTS * BLOCKS);
	cr_assert_gt(reads, 0, "some blocks came from L2");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0);
	/* published before the replies the lookup actor counted */
	uint64_t joined = ct_stat(&env, "disk.0", KVR_STAT_DK_XFER_JOINED);
	uint64_t reg = ct_stat(&env, "disk.0", KVR_STAT_DK_XFER_REGISTERED);
	uint64_t unreg = ct_stat(&env, "disk.0", KVR_STAT_DK_XFER_UNREGISTERED);
	bool huge = env.ctl->arena_huge != 0, direct = dir_takes_direct(l2dir);
	fprintf(stderr, "L1 in %s, %s: %llu writes, %llu reads: joined %llu, registered %llu, unregistered %llu\n",
		huge ? "huge pages" : "4 KiB pages", direct ? "O_DIRECT" : "buffered", (unsigned long long)writes,
		(unsigned long long)reads, (unsigned long long)joined, (unsigned long long)reg,
		(unsigned long long)unreg);
	cr_assert_eq(unreg, 0, "L1 slots are in the registered arena");
	if (huge && direct) {
		cr_assert_eq(joined, writes + reads, "one joined transfer per file each way");
		cr_assert_eq(reg, 0);
	} else {
		cr_assert_eq(joined, 0, "nothing joins in 4 KiB pages or buffered I/O");
		cr_assert_eq(reg, writes + reads);
	}
	ct_assert_table_clean(&env);
}

/* A file damaged on disk is a miss, never served: the lookup stops before that block. */
Test(l2, damaged_file_is_a_miss)
{
	struct ct_opts o = {.l1_slots = 4, .l2_dir = l2dir};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	store_prompts(r);
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == PROMPTS * BLOCKS, 5000));
	restart(&o); /* L1 empty: everything must come from disk */
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);

	/* flip one payload byte of prompt 0's block 2 */
	kvr_key keys[BLOCKS];
	ct_keys(&env, tokens[0], BLOCKS * BT, keys);
	char hex[KVR_KEY_FMT_LEN], ns[KVR_KEY_FMT_LEN], path[768];
	snprintf(path, sizeof(path), "%s/%s/%s.0.kvb", l2dir, kvr_key_fmt(env.slots->ns, ns), kvr_key_fmt(keys[2], hex));
	h_flip_byte(path, 4096 + 100);

	uint32_t got = ct_lookup(r, 300, tokens[0], BLOCKS * BT);
	cr_assert_eq(got, 2, "blocks 0 and 1 verified, block 2 damaged: %u", got);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 1);
	/* the store drops the file from its index before the miss is answered; its unlink completes just after */
	cr_assert(H_WAIT(access(path, F_OK) == -1, 5000), "the damaged file is dropped");
	uint32_t dst[2] = {8, 9};
	struct ct_done d;
	ct_load(r, 300, dst, 2, &d);
	cr_assert_eq(d.c.status, 0);
	for (uint32_t i = 0; i < 2; i++) {
		char why[200] = "";
		cr_assert(ct_holds(r, dst[i], TAG(0, i), why, sizeof(why)), "block %u: %s", i, why);
	}
	/* the other prompts are intact */
	got = ct_lookup(r, 301, tokens[1], BLOCKS * BT);
	cr_assert_eq(got, BLOCKS);
}

static bool log_has_synced(unsigned n)
{
	char want[96];
	snprintf(want, sizeof(want), "synced: %u block lanes on disk", n);
	return h_log_contains(&env.h, want);
}

/* kill -9 the disk actor while it writes blocks through: kvringd restarts it, what it left
 * half-written is removed, its pins are dropped, and after a restart of kvringd exactly the
 * files that were complete are adopted and served — byte-exact, never a partial block. */
Test(l2, disk_actor_killed_mid_writes)
{
	struct ct_opts o = {.l1_slots = 64, .l2_dir = l2dir};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	pid_t disk = ct_actor_pid(&env, "disk.0");
	for (unsigned p = 0; p < PROMPTS; p++) {
		store_prompt(r, p, 400 + p);
		if (p == PROMPTS / 2)
			cr_assert_eq(kill(disk, SIGKILL), 0); /* writes of this prompt are in flight */
	}
	cr_assert_neq(ct_wait_ready(&env, "disk.0", disk, 5000), 0, "disk.0 restarted");
	/* the L1 copies stay served; no slot stays pinned by the dead disk actor once the
	 * writes that were still queued are done */
	cr_assert(H_WAIT(ct_count_state(&env, KVR_SLOT_WRITING) == 0, 3000));
	for (unsigned p = 0; p < PROMPTS; p++)
		cr_assert_eq(ct_lookup(r, 50 + p, tokens[p], BLOCKS * BT), BLOCKS, "L1 serves prompt %u", p);
	/* SIGTERM drains the writes still queued; then count what is complete on disk */
	stop_kvringd();
	unsigned complete = h_count_files(l2dir, ".kvb");
	cr_assert_leq(complete, PROMPTS * BLOCKS);
	ct_start(&env, &ct_tiny, &o);
	cr_assert_eq(h_count_files(l2dir, ".kvb"), complete, "adoption keeps every complete file");
	cr_assert(log_has_synced(complete), "the lookup actor learned of exactly %u files", complete);
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	unsigned served = 0;
	for (unsigned p = 0; p < PROMPTS; p++)
		served += load_found_exact(r, 600 + p, p);
	cr_assert_gt(served, 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0, "no damaged file was ever offered");
	ct_assert_table_clean(&env);
}

/* L2 on a 64 KiB filesystem: write-throughs fail with ENOSPC after a few files; every store
 * still succeeds in L1 and is served from it; nothing half-written is left under a real
 * name (a restart adopts only complete files and none of them fails its checksum). */
Test(l2, disk_full_keeps_l1_serving)
{
	if (mount("kvr-l2-full", l2dir, "tmpfs", 0, "size=64k,mode=0700") != 0)
		cr_skip_test("cannot mount a small tmpfs here (%s)", strerror(errno));
	struct ct_opts o = {.l1_slots = 64, .l2_dir = l2dir, .l2_bytes = 64ull << 20};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	for (unsigned p = 0; p < PROMPTS; p++)
		store_prompt(r, p, 700 + p);
	const uint64_t total = PROMPTS * BLOCKS;
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) +
				 ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITE_FAILS) +
				 ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES_SKIPPED) ==
			 total,
			 5000));
	uint64_t written = ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES);
	uint64_t failed = ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITE_FAILS);
	cr_assert_gt(failed, 0, "the disk filled up");
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES_SKIPPED), 0, "no write is ever skipped");
	/* a failed write is logged with its dir, file and errno — once, then rate-limited */
	char want[400];
	snprintf(want, sizeof(want), "write failed: %s", strerror(ENOSPC));
	cr_assert(H_WAIT(h_log_contains(&env.h, want), 3000), "no log line names the failed write");
	cr_assert(h_log_contains(&env.h, l2dir));
	unsigned lines = 0;
	char *log = h_read_file(env.h.log);
	for (const char *q = log; (q = strstr(q, "write failed:")); q++)
		lines++;
	free(log);
	cr_assert(lines >= 1 && lines < failed, "%u lines for %llu failed writes: not rate-limited", lines,
		  (unsigned long long)failed);
	load_all_exact(r, 100); /* from L1 */
	stop_kvringd();
	cr_assert_eq(h_count_files(l2dir, ".kvb"), written, "only complete files under real names");

	ct_start(&env, &ct_tiny, &o);
	cr_assert(log_has_synced((unsigned)written), "want %llu files adopted; log:\n%s", (unsigned long long)written,
		  h_read_file(env.h.log));
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	for (unsigned p = 0; p < PROMPTS; p++)
		(void)ct_lookup(r, 800 + p, tokens[p], BLOCKS * BT);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0, "no adopted file is damaged");
	cr_assert_gt(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), 0);
}

/* kill -9 kvringd and its disk actor together in the middle of write-throughs (a machine
 * crash, as far as L2 can tell): the next kvringd adopts exactly the complete files, leaves
 * no temporary file behind, and serves them byte-exact. */
Test(l2, kvringd_killed_mid_writes)
{
	struct ct_opts o = {.l1_slots = 64, .l2_dir = l2dir};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	pid_t disk = ct_actor_pid(&env, "disk.0");
	for (unsigned p = 0; p < PROMPTS; p++)
		store_prompt(r, p, 900 + p);
	/* some files complete, the last ones most likely still in flight */
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) >= BLOCKS, 5000));
	cr_assert_eq(kill(disk, SIGKILL), 0);
	cr_assert_eq(kill(env.h.pid, SIGKILL), 0);
	(void)h_wait_exit(env.h.pid, 5000);
	env.h.pid = 0;
	ct_close_all();
	cr_assert(H_WAIT(kill(disk, 0) != 0, 3000), "disk actor gone");
	kvr_segment_close(&env.slots_seg);
	kvr_segment_close(&env.ctl_seg);
	kvr_segment_close(&env.arena_seg);
	h_unmap(&env.h);
	usleep(200 * 1000); /* the other actors end on their parent's death */
	unsigned complete = h_count_files(l2dir, ".kvb");

	ct_start(&env, &ct_tiny, &o);
	cr_assert(log_has_synced(complete), "adopted exactly the %u complete files", complete);
	cr_assert_eq(h_count_files(l2dir, ".kvb"), complete);
	cr_assert_eq(h_count_files(l2dir, ""), complete, "no temporary file left (dot files such as the lock aside)");
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	unsigned served = 0;
	for (unsigned p = 0; p < PROMPTS; p++)
		served += load_found_exact(r, 600 + p, p);
	cr_assert_gt(served, 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0);
	ct_assert_table_clean(&env);
}

/* Write-back: nothing is written while L1 has room; when a store finds L1 full, the least
 * recently used blocks are written out and only then evicted (the store waits for it), so
 * every prompt stays loadable byte-exact — the older ones from disk. */
Test(l2, write_back_demotes_on_eviction)
{
	struct ct_opts o = {.l1_slots = 4, .l2_dir = l2dir, .l2_mode = "write-back"};
	ct_start(&env, &ct_tiny, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	store_prompt(r, 0, 1000);
	usleep(100 * 1000);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES), 0, "write-back writes nothing while L1 has room");
	cr_assert_eq(h_count_files(l2dir, ".kvb"), 0);
	for (unsigned p = 1; p < PROMPTS; p++)
		store_prompt(r, p, 1000 + p); /* each one makes L1 demote the previous prompt */
	uint64_t written = ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES);
	cr_assert_eq(written, (PROMPTS - 1) * BLOCKS, "the evicted prompts were written, the last one was not: %llu",
		     (unsigned long long)written);
	cr_assert_eq(h_count_files(l2dir, ".kvb"), written);
	load_all_exact(r, 100);
	cr_assert_gt(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 0);
}

/* Write-back with blocks of two lanes of which only one was ever stored (the other rank's
 * store failed, or it never stored that prompt): such a half-stored block leaves L1 once the
 * lane it holds is on disk. Waiting for the missing lane too kept a full L1 of them for good,
 * and every later store failed (-EIO, no room) — faults_two_models found it. */
Test(l2, write_back_evicts_half_stored_blocks)
{
	struct ct_opts o = {.l1_slots = 4, .l2_dir = l2dir, .l2_mode = "write-back"};
	ct_start(&env, &ct_tiny_tp2, &o);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 1, 16, 0, &r), 0, "%s", kvr_last_error(NULL));
	for (unsigned p = 0; p < 3; p++)
		store_prompt(r, p, 2000 + p); /* lane 1 only: L1 is full of half blocks after the first */
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_NOROOM), 0);
	uint64_t written = ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES);
	cr_assert_eq(written, 2 * BLOCKS, "the first two prompts' lanes were written out: %llu",
		     (unsigned long long)written);
	cr_assert_eq(h_count_files(l2dir, ".kvb"), 2 * BLOCKS);
	cr_assert_geq(ct_stat(&env, "lookup", KVR_STAT_LK_EVICTED), 2 * BLOCKS);
	ct_close_all();
	ct_assert_table_clean(&env);
}
