/* l2.read_only: a legacy 16-token L2 store served byte-exact by kvringd without a single change on disk. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "client_harness.h"
#include "l2store.h"

/*
 * The operator's story (issue #5): a store written by 16-token engines is served, after the
 * engines moved to 128-token blocks, by a kvringd with l2.read_only to the engines that still
 * run 16-token blocks, next to a 128-token instance on the same L2 directory. Every test
 * snapshots the directories it must not change (name, type, size, mtime and a hash of the
 * bytes of every entry, and the directory's own mtime) and compares after the instances stopped.
 */

static struct ct_env env, env2; /* env2: the 128-token instance next to the read-only one */
static char l2dir[256];

static void setup(void)
{
	ct_init(&env);
	ct_init(&env2);
	snprintf(l2dir, sizeof(l2dir), "%s/l2", env.h.dir);
	cr_assert_eq(mkdir(l2dir, 0700), 0);
}

static void teardown(void)
{
	if (env.h.pid > 0)
		(void)kill(env.h.pid, SIGKILL);
	if (env2.h.pid > 0)
		(void)kill(env2.h.pid, SIGKILL);
	ct_fini(&env2);
	ct_fini(&env);
}

TestSuite(l2ro, .init = setup, .fini = teardown, .timeout = 60);

/* ct_tiny (client_harness.h) with 128-token blocks: 32 KiB a lane. */
static const struct ct_model tiny128 = {.layers = 2, .kv_heads = 2, .head_dim = 16, .dtype_bytes = 2,
					.block_tokens = 128, .tp_size = 1};

#define BT 16
#define BLOCKS 8       /* 8 x 16 = 128 tokens: one block for the 128-token instance */
#define PROMPTS 4
#define TOKENS (BLOCKS * BT)
#define TAG(p, i) (7000ull * (p) + (i) + 1)
#define DST 8          /* loads go to engine blocks 8..15 */

static const struct ct_opts rw_opts = {.l1_slots = 64, .l2_dir = l2dir};
static const struct ct_opts ro_opts = {.l1_slots = 64, .l2_dir = l2dir, .l2_extra = ", \"read_only\": true"};

static uint32_t tokens[PROMPTS][TOKENS];
static kvr_key keys16[PROMPTS][BLOCKS]; /* their 16-token keys */
static kvr_key ns16;                    /* the 16-token namespace */

/* ---- snapshots of a directory ------------------------------------------------------------- */

struct entry {
	char name[256];
	mode_t type;
	off_t size;
	struct timespec mtime;
	uint64_t hash;   /* FNV-1a of the bytes (regular files) */
};

struct snap {
	struct timespec dir_mtime;
	unsigned n;
	struct entry e[64];
};

static uint64_t hash_file(const char *path)
{
	uint64_t h = 0xcbf29ce484222325ull;
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	int c;
	while ((c = fgetc(f)) != EOF)
		h = (h ^ (uint8_t)c) * 0x100000001b3ull;
	fclose(f);
	return h;
}

static int entry_cmp(const void *a, const void *b)
{
	return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static void snapshot(const char *dir, struct snap *s)
{
	struct stat st;
	memset(s, 0, sizeof(*s));
	cr_assert_eq(stat(dir, &st), 0, "%s: %s", dir, strerror(errno));
	s->dir_mtime = st.st_mtim;
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "%s: %s", dir, strerror(errno));
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		cr_assert_lt(s->n, 64u);
		struct entry *e = &s->e[s->n++];
		char path[1024];
		snprintf(e->name, sizeof(e->name), "%s", de->d_name);
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		cr_assert_eq(lstat(path, &st), 0);
		e->type = st.st_mode & S_IFMT;
		e->size = S_ISREG(st.st_mode) ? st.st_size : 0;
		e->mtime = st.st_mtim;
		e->hash = S_ISREG(st.st_mode) ? hash_file(path) : 0;
	}
	closedir(d);
	qsort(s->e, s->n, sizeof(s->e[0]), entry_cmp);
}

static void assert_same(const struct snap *a, const struct snap *b, const char *what)
{
	cr_assert_eq(a->n, b->n, "%s: %u entries before, %u after", what, a->n, b->n);
	for (unsigned i = 0; i < a->n; i++) {
		const struct entry *x = &a->e[i], *y = &b->e[i];
		cr_assert_str_eq(x->name, y->name, "%s: entry %u", what, i);
		cr_assert_eq(x->type, y->type, "%s: %s changed type", what, x->name);
		cr_assert_eq(x->size, y->size, "%s: %s size %lld -> %lld", what, x->name, (long long)x->size,
			     (long long)y->size);
		cr_assert(x->mtime.tv_sec == y->mtime.tv_sec && x->mtime.tv_nsec == y->mtime.tv_nsec,
			  "%s: %s was modified", what, x->name);
		cr_assert_eq(x->hash, y->hash, "%s: the bytes of %s changed", what, x->name);
	}
	cr_assert(a->dir_mtime.tv_sec == b->dir_mtime.tv_sec && a->dir_mtime.tv_nsec == b->dir_mtime.tv_nsec,
		  "%s: the directory itself was modified (an entry created or removed meanwhile)", what);
}

static bool snap_has(const struct snap *s, const char *name)
{
	for (unsigned i = 0; i < s->n; i++)
		if (!strcmp(s->e[i].name, name))
			return true;
	return false;
}

static unsigned snap_count(const struct snap *s, const char *suffix)
{
	unsigned n = 0;
	size_t sl = strlen(suffix);
	for (unsigned i = 0; i < s->n; i++) {
		size_t l = strlen(s->e[i].name);
		n += l >= sl && !strcmp(s->e[i].name + l - sl, suffix);
	}
	return n;
}

/* ---- instances ------------------------------------------------------------------------------ */

static void stop_env(struct ct_env *e)
{
	cr_assert_eq(kill(e->h.pid, SIGTERM), 0);
	int st = h_wait_exit(e->h.pid, 10000);
	cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvringd exit %d; log:\n%s", st,
		  h_read_file(e->h.log));
	e->h.pid = 0;
	kvr_segment_close(&e->slots_seg);
	kvr_segment_close(&e->ctl_seg);
	kvr_segment_close(&e->arena_seg);
	h_unmap(&e->h);
}

/* The file of a 16-token block lane (kvr_l2_name_fmt in the namespace directory). */
static void path_of(char *buf, size_t len, kvr_key key, unsigned lane)
{
	char ns[KVR_KEY_FMT_LEN], name[KVR_L2_NAME_MAX];
	snprintf(buf, len, "%s/%s/%s", l2dir, kvr_key_fmt(ns16, ns), kvr_l2_name_fmt(key, lane, name));
}

static void ns_dir_of(char *buf, size_t len, const struct ct_env *e)
{
	char ns[KVR_KEY_FMT_LEN];
	snprintf(buf, len, "%s/%s", l2dir, kvr_key_fmt(e->slots->ns, ns));
}

/* The legacy store: a 16-token kvringd (write-through) stores PROMPTS prompts of BLOCKS
 * blocks, every lane reaches the disk, SIGTERM. Leaves env stopped and ns (the 16-token
 * namespace directory) filled in. */
static void write_legacy_store(char *ns, size_t nslen)
{
	ct_start(&env, &ct_tiny, &rw_opts);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	for (unsigned p = 0; p < PROMPTS; p++) {
		ct_prompt(tokens[p], TOKENS, 300 + p);
		uint32_t blocks[BLOCKS];
		for (uint32_t i = 0; i < BLOCKS; i++) {
			blocks[i] = i;
			ct_fill(r, i, TAG(p, i));
		}
		struct ct_done d;
		ct_store(r, 1 + p, tokens[p], TOKENS, blocks, BLOCKS, &d);
		cr_assert_eq(d.c.status, 0, "store %u: %d", p, d.c.status);
		cr_assert_eq(d.c.n_stored, BLOCKS);
	}
	cr_assert(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES) == PROMPTS * BLOCKS, 5000),
		  "written through: %llu", (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES));
	ns_dir_of(ns, nslen, &env);
	ns16 = env.slots->ns;
	for (unsigned p = 0; p < PROMPTS; p++)
		ct_keys(&env, tokens[p], TOKENS, keys16[p]);
	ct_close_all();
	stop_env(&env);
	struct snap s;
	snapshot(ns, &s);
	cr_assert_eq(snap_count(&s, ".kvb"), PROMPTS * BLOCKS, "one file per stored block");
}

/* Look prompt p up on r (a 16-token rank): returns the matched blocks, *ret_promoted those
 * read from L2; loads what matched into DST.. and checks every byte. */
static uint32_t lookup_load_exact(struct ct_rank *r, uint64_t req, unsigned p, uint32_t *ret_promoted)
{
	struct kvr_lookup_result res;
	cr_assert_eq(kvr_lookup(r->c, req, tokens[p], TOKENS, NULL, 0, &res), 0, "lookup: %s",
		     kvr_last_error(r->c));
	*ret_promoted = res.l2_blocks;
	uint32_t got = res.matched_blocks;
	if (!got)
		return 0;
	uint32_t dst[BLOCKS];
	for (uint32_t i = 0; i < got; i++)
		dst[i] = DST + i;
	struct ct_done d;
	ct_load(r, req, dst, got, &d);
	cr_assert_eq(d.c.status, 0, "prompt %u load: %d (%u failed)", p, d.c.status, d.c.n_failed);
	for (uint32_t i = 0; i < got; i++) {
		char why[200] = "";
		cr_assert(ct_holds(r, dst[i], TAG(p, i), why, sizeof(why)), "prompt %u block %u: %s", p, i, why);
	}
	return got;
}

/* ---- through kvringd ------------------------------------------------------------------------ */

/* The legacy store, then a tmp leftover, a foreign file, a block whose header is damaged
 * (adoption refuses it) and one whose payload is damaged (only a read finds it) dropped into
 * it. A read-only kvringd serves every intact block byte-exact from L2, treats both damaged
 * ones as misses, refuses an L2 write, and leaves the directory exactly as it found it. */
Test(l2ro, serves_legacy_store_changes_nothing)
{
	char ns[512], path[768], tmp[800];
	write_legacy_store(ns, sizeof(ns));

	/* prompt 2 block 5: one payload byte; prompt 3 block 0: one header byte */
	char bad_payload[768], bad_header[768];
	path_of(bad_payload, sizeof(bad_payload), keys16[2][5], 0);
	path_of(bad_header, sizeof(bad_header), keys16[3][0], 0);
	h_flip_byte(bad_payload, 4096 + 300);
	h_flip_byte(bad_header, 200); /* a reserved header byte: caught by the header checksum */
	path_of(path, sizeof(path), keys16[2][0], 0);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d.7", path, 99999);
	h_write_file(tmp, "half a block");
	snprintf(path, sizeof(path), "%s/NOTES.txt", ns);
	h_write_file(path, "operator's notes\n");

	struct snap before, before_root, after, after_root;
	snapshot(ns, &before);
	snapshot(l2dir, &before_root);
	cr_assert(snap_has(&before, ".kvr.lock"));

	ct_start(&env, &ct_tiny, &ro_opts);
	/* adoption: 32 block files - the bad header = 31 served; tmp and bad header left in place */
	cr_assert(h_log_contains(&env.h, "read-only: adopted 31 files"), "log:\n%s", h_read_file(env.h.log));
	cr_assert(h_log_contains(&env.h, "; 2 skipped and left in place (tmp 1, header_checksum 1), 1 foreign left "
					 "alone; nothing on disk is created, written, renamed or removed"),
		  "log:\n%s", h_read_file(env.h.log));
	cr_assert(h_log_contains(&env.h, "disk.0 synced: 31 block lanes on disk"));
	cr_assert_eq(ct_stat(&env, "disk.0", KVR_STAT_DK_ADOPTED), 31);
	cr_assert_eq(ct_stat(&env, "disk.0", KVR_STAT_DK_LEFT_IN_PLACE), 2);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), 0, "L1 starts empty");

	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	uint32_t promoted;
	for (unsigned p = 0; p < 2; p++) {
		cr_assert_eq(lookup_load_exact(r, 100 + p, p, &promoted), BLOCKS, "prompt %u", p);
		cr_assert_eq(promoted, BLOCKS, "prompt %u: every block promoted from L2", p);
	}
	/* again: now from L1, nothing read */
	cr_assert_eq(lookup_load_exact(r, 110, 0, &promoted), BLOCKS);
	cr_assert_eq(promoted, 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS), 2 * BLOCKS);

	/* the damaged payload is a miss at block 5; the file stays */
	cr_assert_eq(lookup_load_exact(r, 120, 2, &promoted), 5, "blocks 0..4 verified, block 5 damaged");
	cr_assert_eq(promoted, 5);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 1);
	cr_assert(H_WAIT(ct_stat(&env, "disk.0", KVR_STAT_DK_BAD_KEPT) == 1, 2000));
	cr_assert(h_log_contains(&env.h, "payload_checksum (Bad message): a miss; left on disk (l2.read_only), not "
					 "served again"), "log:\n%s", h_read_file(env.h.log));
	cr_assert_eq(access(bad_payload, F_OK), 0, "read-only: the damaged file is not removed");
	/* asked again: known gone, no second read */
	cr_assert_eq(lookup_load_exact(r, 121, 2, &promoted), 5);
	cr_assert_eq(promoted, 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS), 1);
	/* the damaged header was never adopted: prompt 3 is not there at all */
	cr_assert_eq(lookup_load_exact(r, 130, 3, &promoted), 0);

	/* nothing was written through: the lookup actor sends no L2_WRITE in read-only mode */
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITE_FAILS), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES_SKIPPED), 0);
	/* an L2_WRITE sent anyway (standing in for the idle lookup actor) is refused before any I/O */
	kvr_key k = keys16[0][7];
	int slot = ct_find_slot(&env, k, 0);
	cr_assert_geq(slot, 0);
	cr_assert_eq(kvr_slot_state(env.slots, (uint32_t)slot), KVR_SLOT_COMMITTED);
	struct kvr_msg_l2 b = {.key_lo = k.lo, .key_hi = k.hi, .slot = (uint32_t)slot,
			       .epoch = kvr_slot_epoch(env.slots, (uint32_t)slot)};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_L2_WRITE, 0, 0, 0, &b, sizeof(b));
	cr_assert_eq(kvr_ring_try_enqueue(ct_ring(&env, "disk.req.0"), &m), 0);
	cr_assert(H_WAIT(ct_stat(&env, "disk.0", KVR_STAT_DK_WRITES_REFUSED) == 1, 2000), "the write was not refused");
	/* the -EROFS answer is to a write the lookup actor never queued: not counted as its own */
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITE_FAILS), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES), 0);
	cr_assert(h_log_contains(&env.h, "L2_WRITE refused: l2.read_only"));

	ct_close_all();
	stop_env(&env);
	snapshot(ns, &after);
	snapshot(l2dir, &after_root);
	assert_same(&before, &after, "the 16-token namespace directory");
	assert_same(&before_root, &after_root, "the L2 directory");
	cr_assert(snap_has(&after, strrchr(tmp, '/') + 1), "the tmp file is still there");
	cr_assert(snap_has(&after, strrchr(bad_header, '/') + 1), "the damaged header file is still there");
}

/* A store on a read-only instance is refused as a whole: status -EROFS and every block in
 * the failed list; nothing reaches L1 or the disk. */
Test(l2ro, store_is_refused)
{
	char ns[512];
	write_legacy_store(ns, sizeof(ns));
	struct snap before, after;
	snapshot(ns, &before);

	ct_start(&env, &ct_tiny, &ro_opts);
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r), 0);
	uint32_t fresh[TOKENS], blocks[BLOCKS];
	ct_prompt(fresh, TOKENS, 999);
	for (uint32_t i = 0; i < BLOCKS; i++) {
		blocks[i] = i;
		ct_fill(r, i, TAG(9, i));
	}
	struct ct_done d;
	ct_store(r, 50, fresh, TOKENS, blocks, BLOCKS, &d);
	cr_assert_eq(d.c.status, -EROFS, "store status %d", d.c.status);
	cr_assert_eq(d.c.n_stored, 0);
	cr_assert_eq(d.c.n_failed, BLOCKS);
	for (uint32_t i = 0; i < BLOCKS; i++)
		cr_assert_eq(d.failed[i], blocks[i], "failed[%u]", i);
	cr_assert_eq(ct_count_state(&env, KVR_SLOT_COMMITTED), 0, "nothing reached L1");
	cr_assert_eq(ct_lookup(r, 51, fresh, TOKENS), 0);
	/* the legacy blocks are still served */
	uint32_t promoted;
	cr_assert_eq(lookup_load_exact(r, 52, 1, &promoted), BLOCKS);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES), 0);
	cr_assert_eq(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITE_FAILS), 0, "no L2_WRITE was even sent");
	cr_assert_eq(ct_stat(&env, "disk.0", KVR_STAT_DK_WRITES_REFUSED), 0);
	ct_close_all();
	stop_env(&env);
	snapshot(ns, &after);
	assert_same(&before, &after, "the 16-token namespace directory");
}

/* The upgrade: a 128-token instance (its own socket, the same L2 directory) runs next to
 * the read-only 16-token one. It finds none of the 16-token blocks — the same tokens are
 * other keys in another namespace directory — stores into its own directory, and never
 * touches the 16-token one; the read-only instance keeps serving meanwhile. */
Test(l2ro, next_to_a_128_token_instance)
{
	char ns16[512], ns128[512];
	write_legacy_store(ns16, sizeof(ns16));
	struct snap before, after, s128;
	snapshot(ns16, &before);

	ct_start(&env, &ct_tiny, &ro_opts);
	ct_start(&env2, &tiny128, &(struct ct_opts){.l1_slots = 16, .l2_dir = l2dir});
	ns_dir_of(ns128, sizeof(ns128), &env2);
	cr_assert_str_neq(ns128, ns16, "block_tokens is part of the namespace");
	cr_assert(h_log_contains(&env2.h, "disk.0 synced: 0 block lanes on disk"), "log:\n%s",
		  h_read_file(env2.h.log));

	struct ct_rank *r128, *r16;
	cr_assert_eq(ct_rank_open(&env2, 0, 4, 0, &r128), 0);
	cr_assert_eq(ct_rank_open(&env, 0, 16, 0, &r16), 0);
	for (unsigned p = 0; p < PROMPTS; p++) {
		struct kvr_lookup_result res;
		cr_assert_eq(kvr_lookup(r128->c, 10 + p, tokens[p], TOKENS, NULL, 0, &res), 0);
		cr_assert_eq(res.matched_blocks, 0, "prompt %u: a 16-token block served as a 128-token one", p);
		cr_assert_eq(res.l2_blocks, 0);
	}
	cr_assert_eq(ct_stat(&env2, "lookup", KVR_STAT_LK_KEYS), PROMPTS, "one 128-token block asked per prompt");
	cr_assert_eq(ct_stat(&env2, "lookup", KVR_STAT_LK_MATCHED), 0);
	cr_assert_eq(ct_stat(&env2, "lookup", KVR_STAT_LK_L2_READS), 0);

	/* the 128-token engines store prompt 0 again, as one 128-token block: their own file */
	ct_fill(r128, 0, TAG(20, 0));
	struct ct_done d;
	ct_store(r128, 20, tokens[0], TOKENS, (uint32_t[]){0}, 1, &d);
	cr_assert_eq(d.c.status, 0);
	cr_assert_eq(d.c.n_stored, 1);
	cr_assert(H_WAIT(ct_stat(&env2, "lookup", KVR_STAT_LK_L2_WRITES) == 1, 5000));

	/* meanwhile the 16-token engines are served from the legacy store */
	uint32_t promoted;
	cr_assert_eq(lookup_load_exact(r16, 30, 0, &promoted), BLOCKS);
	cr_assert_eq(promoted, BLOCKS);

	ct_close_all();
	stop_env(&env2);
	stop_env(&env);
	snapshot(ns16, &after);
	assert_same(&before, &after, "the 16-token namespace directory");
	snapshot(ns128, &s128);
	cr_assert_eq(snap_count(&s128, ".kvb"), 1, "the 128-token block in its own directory");
	for (unsigned i = 0; i < s128.n; i++)
		if (strstr(s128.e[i].name, ".kvb"))
			cr_assert_eq(s128.e[i].size, (off_t)kvr_l2_file_bytes(32768), "header + one 32 KiB lane");
}

/* ---- the store on its own (actors/disk/l2store.h) ----------------------------------------- */

#define SLANE 4096u

static struct kvr_l2_store_config store_cfg(bool read_only, uint32_t lanes, uint64_t cap_files)
{
	return (struct kvr_l2_store_config){
		.root = l2dir,
		.ident = {.ns = {0x16, 0x5eed}, .fingerprint = {0x16, 0x5eed}, .block_tokens = 16, .lane_bytes = SLANE},
		.lanes = lanes,
		.capacity_bytes = cap_files * kvr_l2_file_bytes(SLANE),
		.queue_depth = 8,
		.io_mode = KVR_L2_IO_AUTO,
		.report_gone = true,
		.read_only = read_only,
	};
}

static kvr_key skey(unsigned i)
{
	return (kvr_key){.lo = 0x1000 + i, .hi = 0xabc0 + i};
}

/* Wait for n completions of the store into out[]. */
static void drain(struct kvr_l2_store *s, struct kvr_l2_done *out, unsigned n)
{
	unsigned got = 0;
	for (int tries = 0; got < n && tries < 100; tries++) {
		int k = kvr_l2_store_poll(s, out + got, n - got, n - got);
		cr_assert_geq(k, 0);
		got += (unsigned)k;
	}
	cr_assert_eq(got, n);
}

static void spath(char *buf, size_t len, kvr_key k, unsigned lane)
{
	char ns[KVR_KEY_FMT_LEN], hex[KVR_KEY_FMT_LEN];
	snprintf(buf, len, "%s/%s/%s.%u.kvb", l2dir, kvr_key_fmt((kvr_key){0x16, 0x5eed}, ns), kvr_key_fmt(k, hex),
		 lane);
}

static void set_mtime(const char *path, time_t sec)
{
	struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = sec}};
	cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0, "%s: %s", path, strerror(errno));
}

/* Adoption skips and counts but removes nothing; puts and removes are -EROFS; a bad file is
 * a miss that stays on disk; read-only stores share the directory, a writable one excludes
 * them and is excluded by them (also when the lock file is missing); a missing namespace
 * directory is an empty store, not created. */
Test(l2ro, store_read_only_api)
{
	uint8_t *buf;
	cr_assert_eq(posix_memalign((void **)&buf, 4096, SLANE), 0);
	struct kvr_l2_done done[16];

	/* a writable store: keys 1..6 on lane 0, key 1 on lane 1 */
	struct kvr_l2_store_config wc = store_cfg(false, 2, 64);
	struct kvr_l2_store *w;
	cr_assert_eq(kvr_l2_store_open(&wc, NULL, &w), 0);
	for (unsigned i = 1; i <= 6; i++) {
		memset(buf, (int)i, SLANE);
		cr_assert_eq(kvr_l2_store_put(w, skey(i), 0, buf, i), 0);
		drain(w, done, 1);
		cr_assert_eq(done[0].res, 0);
	}
	cr_assert_eq(kvr_l2_store_put(w, skey(1), 1, buf, 7), 0);
	drain(w, done, 1);
	kvr_l2_store_close(w);

	/* mtimes 1..6 h ago in key order; then key 5's payload and key 6's header damaged */
	char p[768], nsdir[512], tmp[800];
	time_t now = time(NULL);
	for (unsigned i = 1; i <= 6; i++) {
		spath(p, sizeof(p), skey(i), 0);
		set_mtime(p, now - 3600 * (7 - (time_t)i));
	}
	spath(p, sizeof(p), skey(5), 0);
	h_flip_byte(p, 4096 + 17); /* the newest now */
	spath(p, sizeof(p), skey(6), 0);
	h_flip_byte(p, 300);
	snprintf(tmp, sizeof(tmp), "%s.tmp.4242.1", p);
	h_write_file(tmp, "x");
	snprintf(nsdir, sizeof(nsdir), "%.*s", (int)(strrchr(p, '/') - p), p);
	snprintf(p, sizeof(p), "%s/foreign.bin", nsdir);
	h_write_file(p, "y");
	struct snap before, after;
	snapshot(nsdir, &before);

	/* read-only, one lane, room for 4 files: keys 1..5 are good, key 1 (oldest) over the cap */
	struct kvr_l2_store_config rc = store_cfg(true, 1, 4);
	struct kvr_l2_adopt_stats ad;
	struct kvr_l2_store *a, *b;
	cr_assert_eq(kvr_l2_store_open(&rc, &ad, &a), 0);
	cr_assert_eq(ad.entries, 9, "7 block files, a tmp file, a foreign file");
	cr_assert_eq(ad.adopted, 4);
	cr_assert_eq(ad.deleted, 0);
	cr_assert_eq(ad.left_alone, 1);
	cr_assert_eq(ad.left_in_place, 4);
	cr_assert_eq(ad.rejected[KVR_L2_R_TMP], 1);
	cr_assert_eq(ad.rejected[KVR_L2_R_LANE], 1);
	cr_assert_eq(ad.rejected[KVR_L2_R_HDR_CSUM], 1);
	cr_assert_eq(ad.rejected[KVR_L2_R_OVER_CAP], 1);
	cr_assert(!ad.no_dir);
	cr_assert(!kvr_l2_store_contains(a, skey(1), 0), "the oldest is over the cap");
	for (unsigned i = 2; i <= 5; i++)
		cr_assert(kvr_l2_store_contains(a, skey(i), 0), "key %u", i);

	/* a second read-only store shares the directory; a writable one is refused */
	cr_assert_eq(kvr_l2_store_open(&rc, NULL, &b), 0);
	cr_assert_eq(kvr_l2_store_open(&wc, NULL, &w), -EBUSY);

	/* writes are refused without I/O */
	memset(buf, 9, SLANE);
	cr_assert_eq(kvr_l2_store_put(a, skey(9), 0, buf, 1), -EROFS);
	cr_assert_eq(kvr_l2_store_put(a, skey(2), 0, buf, 1), -EROFS, "even a present key");
	cr_assert_eq(kvr_l2_store_remove(a, skey(2), 0), -EROFS);
	cr_assert_eq(kvr_l2_store_pending(a), 0);

	/* a good read: the bytes written */
	cr_assert_eq(kvr_l2_store_get(a, skey(3), 0, buf, 33), 0);
	drain(a, done, 1);
	cr_assert_eq(done[0].kind, KVR_L2_GET);
	cr_assert_eq(done[0].res, 0);
	for (unsigned i = 0; i < SLANE; i++)
		cr_assert_eq(buf[i], 3, "byte %u", i);
	/* the damaged payload: GONE, then the failed read; dropped from the index, file kept */
	cr_assert_eq(kvr_l2_store_get(a, skey(5), 0, buf, 55), 0);
	drain(a, done, 2);
	cr_assert_eq(done[0].kind, KVR_L2_GONE);
	cr_assert_eq(done[0].reason, KVR_L2_R_PAYLOAD_CSUM);
	cr_assert_eq(done[1].kind, KVR_L2_GET);
	cr_assert_eq(done[1].tag, 55);
	cr_assert_eq(done[1].res, -EBADMSG);
	cr_assert(!kvr_l2_store_contains(a, skey(5), 0));
	cr_assert_eq(kvr_l2_store_get(a, skey(5), 0, buf, 56), -ENOENT, "not read again");
	cr_assert_eq(kvr_l2_store_get(a, skey(1), 0, buf, 57), -ENOENT, "over the cap: not served");
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(a, &st);
	cr_assert(st.read_only);
	cr_assert_eq(st.puts_refused, 3);
	cr_assert_eq(st.bad_kept, 1);
	cr_assert_eq(st.dropped[KVR_L2_R_PAYLOAD_CSUM], 1);
	cr_assert_eq(st.io.ops[KVR_L2IO_WRITE] + st.io.ops[KVR_L2IO_UNLINK], 0, "no write or unlink ever issued");
	cr_assert_eq(st.files, 3);
	kvr_l2_store_close(b);
	kvr_l2_store_close(a);
	snapshot(nsdir, &after);
	assert_same(&before, &after, "the namespace directory after two read-only stores");

	/* no lock file (a copied store): the directory lock still excludes a writer */
	snprintf(p, sizeof(p), "%s/" KVR_L2_LOCK_NAME, nsdir);
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(kvr_l2_store_open(&rc, NULL, &a), 0);
	cr_assert_eq(access(p, F_OK), -1, "read-only: the lock file is not created");
	cr_assert_eq(kvr_l2_store_open(&wc, NULL, &w), -EBUSY);
	kvr_l2_store_close(a);

	/* a writable store holds it: read-only is refused */
	cr_assert_eq(kvr_l2_store_open(&wc, NULL, &w), 0);
	cr_assert_eq(kvr_l2_store_open(&rc, NULL, &a), -EBUSY);
	kvr_l2_store_close(w);

	/* another namespace that has no directory: empty, nothing created */
	struct kvr_l2_store_config oc = rc;
	oc.ident.ns = oc.ident.fingerprint = (kvr_key){0x128, 0x5eed};
	struct snap root_before, root_after;
	snapshot(l2dir, &root_before);
	cr_assert_eq(kvr_l2_store_open(&oc, &ad, &a), 0);
	cr_assert(ad.no_dir);
	cr_assert_eq(ad.adopted, 0);
	cr_assert_eq(kvr_l2_store_get(a, skey(3), 0, buf, 1), -ENOENT);
	cr_assert_eq(kvr_l2_store_put(a, skey(3), 0, buf, 1), -EROFS);
	kvr_l2_store_close(a);
	snapshot(l2dir, &root_after);
	assert_same(&root_before, &root_after, "the L2 root");
	free(buf);
}
