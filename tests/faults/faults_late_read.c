/* Defect 1, deterministic: an L2 promotion read held in flight while its owner dies and another worker stores. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../ipc/ipc_test.h"
#include "client_harness.h"
#include "faults_harness.h"
#include "l2file.h"

/*
 * The disk actor's read gate (KVRING_TEST_READ_GATE, actors/disk/disk.c) holds every L2
 * read after its slot was checked and before its I/O is submitted. The interleaving:
 *
 *   1. worker 1 stores A (one block; written through to L2), then F (four blocks) that
 *      evict A from an L1 of four slots;
 *   2. worker 1 looks A up: the lookup actor allocates slot X (WRITING, owned by worker 1)
 *      and sends the L2 read; the disk actor checks X and stops at the gate;
 *   3. worker 1 is killed (kill -9); the test waits until the lookup actor handled its
 *      WORKER_GONE (its counter, not a time);
 *   4. worker 2 stores B (four blocks: every slot of L1, X included if X is free);
 *   5. the gate opens; the test waits for the read to end (the lookup actor's L2 read
 *      counters) and for B's write-throughs;
 *   6. worker 2 loads B: every byte must be B's; once quiet the slot table holds only FREE
 *      and COMMITTED slots without pins; every committed slot and every L2 file holds its
 *      key's bytes; a fresh worker loads A, byte-exact, from its L2 file.
 *
 * Before the fix the read lands in X after X was given to B (its epoch moved on): B's
 * block in X holds A's payload, in L1 and, written through from X, in B's L2 file.
 */

static struct ct_env env;
static char l2dir[256], gatedir[256];
static int gate_fd = -1;
static struct fh_rank w2, w3;
static pid_t child;

static const struct ct_model tiny = {.layers = FH_LAYERS, .kv_heads = FH_LANE_HEADS, .head_dim = FH_HEAD_DIM,
				     .dtype_bytes = FH_DTYPE, .block_tokens = FH_BT, .tp_size = 1};

static void setup(void)
{
	ct_init(&env);
	w2.fd = w3.fd = -1;
	snprintf(l2dir, sizeof(l2dir), "%s/l2", env.h.dir);
	snprintf(gatedir, sizeof(gatedir), "%s/gate.d", env.h.dir);
	cr_assert_eq(mkdir(l2dir, 0700), 0);
	cr_assert_eq(mkdir(gatedir, 0700), 0);
	char fifo[300];
	snprintf(fifo, sizeof(fifo), "%s/gate", gatedir);
	cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo %s: %s", fifo, strerror(errno));
	/* read-write: opening never blocks, a write never blocks, and the disk actor's open
	 * for reading finds a writer */
	gate_fd = open(fifo, O_RDWR | O_CLOEXEC);
	cr_assert_geq(gate_fd, 0);
	cr_assert_eq(setenv("KVRING_TEST_READ_GATE", gatedir, 1), 0); /* kvringd and its actors inherit it */
}

static void teardown(void)
{
	if (child > 0) {
		(void)kill(child, SIGKILL);
		(void)waitpid(child, NULL, 0);
		child = 0;
	}
	fh_rank_close(&w2);
	fh_rank_close(&w3);
	if (env.h.pid > 0)
		(void)kill(env.h.pid, SIGKILL); /* a disk actor stuck at the gate does not drain */
	if (gate_fd >= 0)
		close(gate_fd);
	gate_fd = -1;
	(void)unsetenv("KVRING_TEST_READ_GATE");
	ct_fini(&env);
}

TestSuite(faults, .init = setup, .fini = teardown, .timeout = 60);

/* ---- worker 1: a child process driven over two pipes ------------------------------------ */

struct w1_rep {
	int rc;          /* attach: the worker slot; store: the completion status */
	uint32_t n_stored, n_failed;
};

static int cmd_fd = -1, rep_fd = -1;

static void w1_reply(int fd, struct w1_rep r)
{
	if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(1);
}

/* Store p's blocks from engine blocks first..: the completion's status and counts. */
static struct w1_rep child_store(struct fh_rank *r, uint64_t req, const struct fh_prompt *p, uint32_t first)
{
	uint32_t blocks[FH_MAX_BLK];
	for (uint32_t i = 0; i < p->n; i++) {
		blocks[i] = first + i;
		fh_fill(r, blocks[i], p->keys[i]);
	}
	int rc = kvr_store(r->c, req, p->tokens, p->n * FH_BT, NULL, 0, blocks, p->n);
	if (rc)
		return (struct w1_rep){.rc = rc};
	struct kvr_completion c;
	if (kvr_wait(r->c, &c, 1, 10000) != 1)
		return (struct w1_rep){.rc = -ETIMEDOUT};
	return (struct w1_rep){.rc = c.status, .n_stored = c.n_stored, .n_failed = c.n_failed};
}

static __attribute__((noreturn)) void worker1(int cmd, int rep, const struct fh_prompt *a, const struct fh_prompt *f)
{
	struct fh_rank r;
	int rc = fh_rank_prepare(&r, 1, 0, 1, 1, 16);
	if (!rc)
		rc = fh_rank_attach(&r, env.h.sock, 5000);
	w1_reply(rep, (struct w1_rep){.rc = rc ? rc : (int)kvr_worker_slot(r.c)});
	if (rc)
		_exit(1);
	char c;
	while (read(cmd, &c, 1) == 1) {
		if (c == 'A') {
			w1_reply(rep, child_store(&r, 1, a, 0));
		} else if (c == 'F') {
			w1_reply(rep, child_store(&r, 2, f, 1));
		} else if (c == 'L') {
			/* promotes A from L2: blocks here until the read ends (or we are killed) */
			struct kvr_lookup_result res;
			rc = kvr_lookup(r.c, 3, a->tokens, a->n * FH_BT, NULL, 0, &res);
			w1_reply(rep, (struct w1_rep){.rc = rc ? rc : (int)res.matched_blocks});
		}
	}
	_exit(0);
}

static struct w1_rep w1_call(char c)
{
	if (c)
		cr_assert_eq(write(cmd_fd, &c, 1), 1);
	struct pollfd pf = {.fd = rep_fd, .events = POLLIN};
	cr_assert_eq(poll(&pf, 1, 15000), 1, "worker 1 did not answer '%c'", c ? c : '-');
	struct w1_rep r;
	cr_assert_eq(read(rep_fd, &r, sizeof(r)), (ssize_t)sizeof(r), "worker 1 died");
	return r;
}

static pid_t spawn_worker1(const struct fh_prompt *a, const struct fh_prompt *f)
{
	int c[2], r[2];
	cr_assert_eq(pipe(c), 0);
	cr_assert_eq(pipe(r), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(c[1]);
		close(r[0]);
		worker1(c[0], r[1], a, f);
	}
	close(c[0]);
	close(r[1]);
	cmd_fd = c[1];
	rep_fd = r[0];
	return pid;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t lk(unsigned s)
{
	return ct_stat(&env, "lookup", s);
}

static unsigned held_lines(void)
{
	char p[320];
	snprintf(p, sizeof(p), "%s/held.log", gatedir);
	char *t = h_read_file(p);
	unsigned n = 0;
	for (char *s = t; *s; s++)
		n += *s == '\n';
	free(t);
	return n;
}

/* Line i (0-based) of held.log: "slot epoch key_lo key_hi lane". */
static void held_line(unsigned i, uint32_t *slot, uint32_t *epoch, kvr_key *key, unsigned *lane)
{
	char p[320];
	snprintf(p, sizeof(p), "%s/held.log", gatedir);
	char *t = h_read_file(p), *s = t;
	for (unsigned k = 0; k < i && s; k++)
		s = strchr(s, '\n') ? strchr(s, '\n') + 1 : NULL;
	unsigned long long lo, hi;
	cr_assert(s && sscanf(s, "%u %u %llx %llx %u", slot, epoch, &lo, &hi, lane) == 5, "held.log: %s", t);
	*key = (kvr_key){.lo = lo, .hi = hi};
	free(t);
}

static void gate_open(unsigned reads)
{
	char buf[64];
	memset(buf, 'x', sizeof(buf));
	cr_assert(reads <= sizeof(buf));
	cr_assert_eq(write(gate_fd, buf, reads), (ssize_t)reads);
}

/* Look p up on r and load what matched into engine blocks 8..: the wrong bytes over every
 * matched block (each reported restored, or counted in *ret_missed). */
static uint64_t load_and_check(struct fh_rank *r, uint64_t req, const struct fh_prompt *p, uint32_t *ret_matched,
			       uint32_t *ret_missed, const char *what)
{
	struct kvr_lookup_result res;
	int rc = kvr_lookup(r->c, req, p->tokens, p->n * FH_BT, NULL, 0, &res);
	cr_assert_eq(rc, 0, "%s: lookup: %s", what, kvr_last_error(r->c));
	*ret_matched = res.matched_blocks;
	*ret_missed = 0;
	if (!res.matched_blocks)
		return 0;
	uint32_t dst[FH_MAX_BLK];
	for (uint32_t i = 0; i < res.matched_blocks; i++) {
		dst[i] = 8 + i;
		fh_fill_canary(r, dst[i]);
	}
	cr_assert_eq(kvr_load(r->c, req, dst, res.matched_blocks), 0, "%s: load: %s", what, kvr_last_error(r->c));
	struct kvr_completion c;
	cr_assert_eq(kvr_wait(r->c, &c, 1, 10000), 1, "%s: no load completion", what);
	uint64_t wrong = 0;
	for (uint32_t i = 0; i < res.matched_blocks; i++) {
		bool failed = false;
		for (uint32_t k = 0; k < c.n_failed; k++)
			failed |= c.failed[k] == dst[i];
		if (failed) {
			(*ret_missed)++;
			continue;
		}
		struct fh_bad bad;
		uint64_t w = fh_check(r, dst[i], p->keys[i], &bad);
		if (w)
			fprintf(stderr, "faults_late_read: %s block %u: %llu of %u bytes wrong, first at offset %u: 0x%02x, "
				"want 0x%02x%s\n", what, i, (unsigned long long)w, FH_LANE_BYTES, bad.offset, bad.got,
				bad.want, bad.canary ? " (never written)" : "");
		wrong += w;
	}
	return wrong;
}

/* Whether the bytes now in slot s are lane 0 of key k. */
static bool slot_holds(uint32_t s, kvr_key k)
{
	uint8_t want[FH_LANE_BYTES];
	fh_lane_content(k, 0, want);
	return memcmp(kvr_slot_data(env.slots, env.arena_seg.base, s), want, FH_LANE_BYTES) == 0;
}

/* ---- the test ------------------------------------------------------------------------------ */

Test(faults, late_read_after_owner_died)
{
	uint64_t seed = test_seed("faults_late_read");
	struct ct_opts o = {.l1_slots = 4, .l2_dir = l2dir, .max_workers = 4,
			    .health_ms = 3000 /* the held disk actor misses no ping that matters */};
	ct_start(&env, &tiny, &o);
	static struct fh_prompt a, f, b;
	struct rng g = {seed};
	fh_make_prompt(&a, 1, rng_next(&g), env.slots->ns, FH_BT);
	fh_make_prompt(&f, 4, rng_next(&g), env.slots->ns, FH_BT);
	fh_make_prompt(&b, 4, rng_next(&g), env.slots->ns, FH_BT);

	child = spawn_worker1(&a, &f);
	struct w1_rep rep = w1_call(0);
	cr_assert_geq(rep.rc, 0, "worker 1 attach: %s", strerror(-rep.rc));
	cr_assert_lt((unsigned)rep.rc, 4u, "worker 1 slot %d", rep.rc);

	/* 1. A is written through, then evicted by F */
	rep = w1_call('A');
	cr_assert_eq(rep.rc, 0, "store A: %d", rep.rc);
	cr_assert_eq(rep.n_stored, 1);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == 1, 5000), "A written through: %llu",
		  (unsigned long long)lk(KVR_STAT_LK_L2_WRITES));
	rep = w1_call('F');
	cr_assert_eq(rep.rc, 0, "store F: %d", rep.rc);
	cr_assert_eq(rep.n_stored, 4);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) == 5, 5000));
	cr_assert_eq(ct_find_slot(&env, a.keys[0], 0), -1, "A is no longer in L1");
	struct fh_l2_scan scan = {0};
	fh_l2_scan(l2dir, env.slots->ns, NULL, &scan);
	cr_assert_eq(scan.ok, 5, "A and F on disk, intact");

	/* 2. worker 1's lookup of A starts the promotion; the read stops at the gate */
	uint64_t reads0 = lk(KVR_STAT_LK_L2_READS) + lk(KVR_STAT_LK_L2_READ_FAILS);
	uint64_t gone0 = lk(KVR_STAT_LK_WORKERS_GONE);
	cr_assert_eq(write(cmd_fd, "L", 1), 1);
	cr_assert(H_WAIT(held_lines() >= 1, 5000), "no L2 read reached the gate");
	uint32_t x, ex;
	kvr_key hk;
	unsigned hl;
	held_line(0, &x, &ex, &hk, &hl);
	cr_assert(kvr_key_eq(hk, a.keys[0]) && hl == 0, "the held read is A's");
	cr_assert_eq(kvr_slot_state(env.slots, x), KVR_SLOT_WRITING);
	/* the promotion slot is the lookup actor's: worker 1's death cannot free it */
	cr_assert_eq(kvr_slot_at(env.slots, x)->owner, KVR_SLOT_OWNER_LOOKUP, "the promotion slot is owned by %u",
		     kvr_slot_at(env.slots, x)->owner);
	cr_assert_eq(kvr_slot_pins_of(env.slots, x, KVR_PIN_IO), 1, "the held read holds the slot's I/O pin");

	/* 3. worker 1 dies with its read in flight */
	cr_assert_eq(kill(child, SIGKILL), 0);
	cr_assert_eq(waitpid(child, NULL, 0), child);
	child = 0;
	cr_assert(H_WAIT(lk(KVR_STAT_LK_WORKERS_GONE) > gone0, 10000), "the lookup actor never handled WORKER_GONE");
	fprintf(stderr, "faults_late_read: read of A held in slot %u (epoch %u); after WORKER_GONE the slot is %s, "
		"epoch %u\n", x, ex, kvr_slot_state_name(kvr_slot_state(env.slots, x)), kvr_slot_epoch(env.slots, x));

	/* 4. worker 2 stores B: L1's four slots */
	cr_assert_eq(fh_rank_prepare(&w2, 1, 0, 1, 1, 16), 0);
	cr_assert_eq(fh_rank_attach(&w2, env.h.sock, 5000), 0, "worker 2 attach: %s", kvr_last_error(NULL));
	uint32_t src[4] = {0, 1, 2, 3};
	for (unsigned i = 0; i < 4; i++)
		fh_fill(&w2, src[i], b.keys[i]);
	cr_assert_eq(kvr_store(w2.c, 10, b.tokens, b.n * FH_BT, NULL, 0, src, 4), 0, "%s", kvr_last_error(w2.c));
	struct kvr_completion c;
	cr_assert_eq(kvr_wait(w2.c, &c, 1, 10000), 1, "store B: no completion");
	cr_assert(c.status == 0 || c.status == -EIO, "store B: status %d", c.status);
	cr_assert_geq(c.n_stored, 1, "store B stored nothing: the test shows nothing");
	uint32_t b_stored = c.n_stored;
	int in_x = -1;
	for (unsigned i = 0; i < 4; i++)
		if (ct_find_slot(&env, b.keys[i], 0) == (int)x)
			in_x = (int)i;
	fprintf(stderr, "faults_late_read: B stored %u of 4 blocks; %s\n", b_stored,
		in_x >= 0 ? "its block in the held read's slot:" : "none of them in the held read's slot");
	if (in_x >= 0)
		fprintf(stderr, "faults_late_read:   block %d, slot %u epoch %u, holds B's bytes before the gate "
			"opens: %s\n", in_x, x, kvr_slot_epoch(env.slots, x), slot_holds(x, b.keys[in_x]) ? "yes" : "no");

	/* 5. the read goes on; then B's write-throughs */
	uint64_t w0 = 5;
	gate_open(1);
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_READS) + lk(KVR_STAT_LK_L2_READ_FAILS) > reads0, 10000),
		  "the held read never ended");
	gate_open(64); /* every later read passes */
	cr_assert(H_WAIT(lk(KVR_STAT_LK_L2_WRITES) + lk(KVR_STAT_LK_L2_WRITE_FAILS) +
				 lk(KVR_STAT_LK_L2_WRITES_SKIPPED) >= w0 + b_stored,
			 10000),
		  "B's write-throughs did not finish");
	fprintf(stderr, "faults_late_read: read ended: %llu promoted, %llu failed; slot %u now %s epoch %u%s\n",
		(unsigned long long)lk(KVR_STAT_LK_L2_READS), (unsigned long long)lk(KVR_STAT_LK_L2_READ_FAILS), x,
		kvr_slot_state_name(kvr_slot_state(env.slots, x)), kvr_slot_epoch(env.slots, x),
		in_x >= 0 && slot_holds(x, a.keys[0]) ? ", holding A's payload" : "");

	/* 6. B byte-exact from L1 */
	uint32_t matched, missed;
	uint64_t wrong = load_and_check(&w2, 11, &b, &matched, &missed, "B");
	fprintf(stderr, "faults_late_read: B: %u blocks matched, %u missed, %llu wrong bytes\n", matched, missed,
		(unsigned long long)wrong);
	cr_expect_geq(matched, 1, "B is not found at all");
	cr_expect_eq(wrong, 0, "worker 2 loaded B and got %llu wrong bytes (A's payload landed in B's slot)",
		     (unsigned long long)wrong);

	/* quiet: only FREE and COMMITTED, no pins; every committed slot holds its key's bytes */
	bool clean = H_WAIT(fh_slots_offending(env.slots, NULL, false, NULL) == 0, 5000);
	uint32_t leaked = fh_slots_offending(env.slots, env.h.ctl, !clean, "leaked");
	cr_expect_eq(leaked, 0, "%u slots not FREE/COMMITTED or pinned once quiet", leaked);
	uint32_t l1_checked, l1_wrong = fh_l1_check(env.slots, env.arena_seg.base, NULL, &l1_checked);
	cr_expect_eq(l1_wrong, 0, "%u of %u committed slots hold wrong bytes", l1_wrong, l1_checked);

	/* every file on disk holds its key's bytes: A, F and B */
	memset(&scan, 0, sizeof(scan));
	fh_l2_scan(l2dir, env.slots->ns, NULL, &scan);
	fprintf(stderr, "faults_late_read: L2: %llu files, %llu intact, %llu wrong, %llu damaged\n",
		(unsigned long long)scan.files, (unsigned long long)scan.ok, (unsigned long long)scan.wrong,
		(unsigned long long)scan.damaged);
	cr_expect_eq(scan.wrong, 0, "%llu L2 files with a valid checksum hold wrong bytes",
		     (unsigned long long)scan.wrong);
	cr_expect_eq(scan.damaged, 0);

	/* A's file still holds A: a fresh worker promotes and loads it */
	fh_rank_close(&w2);
	cr_assert_eq(fh_rank_prepare(&w3, 1, 0, 1, 1, 16), 0);
	cr_assert_eq(fh_rank_attach(&w3, env.h.sock, 5000), 0, "worker 3 attach: %s", kvr_last_error(NULL));
	wrong = load_and_check(&w3, 20, &a, &matched, &missed, "A");
	cr_expect_eq(matched, 1, "A not found on disk after all this");
	cr_expect_eq(missed, 0);
	cr_expect_eq(wrong, 0, "A from its L2 file: %llu wrong bytes", (unsigned long long)wrong);
}
