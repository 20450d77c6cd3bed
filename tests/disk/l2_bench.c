/* L2 bench: whole-block write/read throughput through l2store vs fio (same dir, block size, queue depth), and the time
 * to adopt 100k files at start. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <inttypes.h>
#include <sys/resource.h>

#include "disk_test.h"

struct opts {
	const char *dir;
	uint64_t block_bytes;
	unsigned blocks;
	unsigned qd;
	unsigned rounds;
	enum kvr_l2_durability dur;
	unsigned adopt_files;
	unsigned adopt_limit_ms; /* 0 = report only */
	int skip_fio, skip_tp, skip_adopt, drop_caches;
	const char *direct_label;
};

static double now_s(void)
{
	return (double)kvr_now_ns() / 1e9;
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "l2_bench: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
	exit(1);
}

static struct kvr_l2_store_config store_cfg(const char *root, uint64_t lane_bytes, uint64_t cap, unsigned qd,
					    enum kvr_l2_durability dur, const struct dt_arena *a)
{
	return (struct kvr_l2_store_config){
		.root = root,
		.ident = {.ns = {0xbe4c, 0x12}, .fingerprint = {1, 2}, .block_tokens = 128, .lane_bytes = lane_bytes},
		.lanes = 1,
		.capacity_bytes = cap,
		.queue_depth = qd,
		.durability = dur,
		.io_mode = KVR_L2_IO_AUTO,
		.arena = a ? a->base : NULL,
		.arena_bytes = a ? a->bytes : 0,
		.arena_data_off = a ? a->data_off : 0,
		.slot_bytes = a ? a->slot_bytes : 0,
	};
}

/* kvr_l2_store_open; when pinning the arena fails (RLIMIT_MEMLOCK for a non-root user), once
 * more without registering it (plain reads and writes), saying so. */
static int open_store(struct kvr_l2_store_config *cfg, struct kvr_l2_adopt_stats *ast, struct kvr_l2_store **ret)
{
	int rc = kvr_l2_store_open(cfg, ast, ret);
	if ((rc == -ENOMEM || rc == -EPERM) && cfg->arena) {
		fprintf(stderr, "l2_bench: cannot register the arena (%s): raise RLIMIT_MEMLOCK; going on without\n",
			strerror(-rc));
		cfg->arena = NULL;
		cfg->arena_bytes = 0;
		rc = kvr_l2_store_open(cfg, ast, ret);
	}
	return rc;
}

/* Put n blocks (block i from slot i % n_src) keeping the queue full; returns seconds. */
static double put_all(struct kvr_l2_store *s, const struct dt_arena *a, unsigned n_src, unsigned n, unsigned qd)
{
	struct kvr_l2_done d[KVR_L2IO_MAX_QD];
	unsigned done = 0, failed = 0;
	double t0 = now_s();
	for (unsigned i = 0; i < n;) {
		int rc = kvr_l2_store_put(s, dt_key(9, i), 0, dt_slot(a, i % n_src), i);
		if (rc == 0) {
			i++;
			continue;
		}
		if (rc != -EAGAIN)
			die("put", rc);
		int k = kvr_l2_store_poll(s, d, qd, 1);
		if (k < 0)
			die("poll", k);
		for (int j = 0; j < k; j++)
			failed += d[j].res != 0;
		done += (unsigned)k;
	}
	while (done < n) {
		int k = kvr_l2_store_poll(s, d, qd, 1);
		if (k <= 0)
			die("poll", k ? k : -EIO);
		for (int j = 0; j < k; j++)
			failed += d[j].res != 0;
		done += (unsigned)k;
	}
	double t = now_s() - t0;
	if (failed) {
		fprintf(stderr, "l2_bench: %u puts failed\n", failed);
		exit(1);
	}
	return t;
}

/* Get blocks 0..n-1 into a pool of qd destination slots (after the n_src source slots). */
static double get_all(struct kvr_l2_store *s, const struct dt_arena *a, unsigned n_src, unsigned n, unsigned qd)
{
	struct kvr_l2_done d[KVR_L2IO_MAX_QD];
	unsigned *free_slots = malloc(qd * sizeof(unsigned)), n_free = qd, done = 0, failed = 0;
	for (unsigned i = 0; i < qd; i++)
		free_slots[i] = n_src + i;
	double t0 = now_s();
	for (unsigned i = 0; i < n || done < n;) {
		if (i < n && n_free) {
			unsigned slot = free_slots[n_free - 1];
			int rc = kvr_l2_store_get(s, dt_key(9, i), 0, dt_slot(a, slot), slot);
			if (rc == 0) {
				n_free--;
				i++;
				continue;
			}
			if (rc != -EAGAIN)
				die("get", rc);
		}
		int k = kvr_l2_store_poll(s, d, qd, 1);
		if (k < 0)
			die("poll", k);
		for (int j = 0; j < k; j++) {
			failed += d[j].res != 0;
			free_slots[n_free++] = (unsigned)d[j].tag;
		}
		done += (unsigned)k;
	}
	double t = now_s() - t0;
	free(free_slots);
	if (failed) {
		fprintf(stderr, "l2_bench: %u gets failed\n", failed);
		exit(1);
	}
	return t;
}

/* Run fio once; its bandwidth in bytes/s for rw ("write" or "read"), or -1. */
static double fio_bw(const struct opts *o, const char *dir, const char *rw)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd),
		 "fio --name=kvr-l2 --directory=%s --ioengine=io_uring --direct=1 --rw=%s --bs=%" PRIu64
		 " --iodepth=%u --size=%" PRIu64 " --output-format=json 2>/dev/null",
		 dir, rw, o->block_bytes, o->qd, (uint64_t)o->blocks * o->block_bytes);
	FILE *f = popen(cmd, "r");
	if (!f)
		return -1;
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	size_t k;
	while ((k = fread(buf + len, 1, cap - len - 1, f)) > 0) {
		len += k;
		if (len + 1 == cap)
			buf = realloc(buf, cap *= 2);
	}
	buf[len] = 0;
	int st = pclose(f);
	double bw = -1;
	cJSON *j = st == 0 ? cJSON_Parse(buf) : NULL;
	cJSON *jobs = j ? cJSON_GetObjectItem(j, "jobs") : NULL;
	cJSON *job = jobs ? cJSON_GetArrayItem(jobs, 0) : NULL;
	cJSON *side = job ? cJSON_GetObjectItem(job, rw) : NULL;
	cJSON *b = side ? cJSON_GetObjectItem(side, "bw_bytes") : NULL;
	if (cJSON_IsNumber(b))
		bw = b->valuedouble;
	cJSON_Delete(j);
	free(buf);
	return bw;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One round: kvring writes then reads o->blocks blocks in a fresh namespace dir, then fio does
 * the same in a fresh dir; bandwidths in bytes/s (fio: -1 when it did not run). */
static void round_once(const struct opts *o, const char *root, const struct dt_arena *a, unsigned r, double *kw,
		       double *kr, double *fw, double *fr, struct kvr_l2_store_stats *st)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/r%u", root, r);
	mkdir(dir, 0755);
	uint64_t fb = kvr_l2_file_bytes(o->block_bytes);
	struct kvr_l2_store_config cfg = store_cfg(dir, o->block_bytes, 2 * (uint64_t)o->blocks * fb, o->qd, o->dur, a);
	struct kvr_l2_store *s;
	int rc = open_store(&cfg, NULL, &s);
	if (rc)
		die("store open", rc);
	double bytes = (double)o->blocks * (double)o->block_bytes;
	*kw = bytes / put_all(s, a, o->qd, o->blocks, o->qd);
	*kr = bytes / get_all(s, a, o->qd, o->blocks, o->qd);
	kvr_l2_store_stats(s, st);
	kvr_l2_store_close(s);
	dt_rmrf(dir);
	*fw = *fr = -1;
	if (!o->skip_fio) {
		snprintf(dir, sizeof(dir), "%s/fio%u", root, r);
		mkdir(dir, 0755);
		*fw = fio_bw(o, dir, "write");
		*fr = fio_bw(o, dir, "read");
		dt_rmrf(dir);
	}
}

static int throughput(const struct opts *o, const char *root)
{
	struct dt_arena a;
	int rc = dt_arena_new(2 * o->qd, o->block_bytes, &a); /* qd sources, then qd read destinations */
	if (rc)
		die("arena", rc);
	for (unsigned i = 0; i < o->qd; i++)
		dt_fill(dt_slot(&a, i), o->block_bytes, dt_key(9, i), 0, 1);
	double kw[16], kr[16], fw[16], fr[16];
	struct kvr_l2_store_stats st;
	for (unsigned r = 0; r < o->rounds; r++)
		round_once(o, root, &a, r, &kw[r], &kr[r], &fw[r], &fr[r], &st);
	printf("L2 throughput: %u blocks of %" PRIu64 " KiB, queue depth %u, durability %s, %s, %s; median of %u rounds\n",
	       o->blocks, o->block_bytes >> 10, o->qd, kvr_l2_durability_name(o->dur), st.direct ? "O_DIRECT" : "buffered",
	       root, o->rounds);
	for (unsigned r = 0; r < o->rounds; r++)
		if (fw[r] > 0 && fr[r] > 0)
			printf("  round %u: kvring write %.0f read %.0f MB/s, fio write %.0f read %.0f MB/s\n", r,
			       kw[r] / 1e6, kr[r] / 1e6, fw[r] / 1e6, fr[r] / 1e6);
		else
			printf("  round %u: kvring write %.0f read %.0f MB/s\n", r, kw[r] / 1e6, kr[r] / 1e6);
	double mkw = median(kw, o->rounds), mkr = median(kr, o->rounds);
	double mfw = median(fw, o->rounds), mfr = median(fr, o->rounds);
	printf("  %-6s %12s %12s %8s\n", "", "kvring MB/s", "fio MB/s", "ratio");
	if (mfw > 0 && mfr > 0) {
		printf("  %-6s %12.0f %12.0f %7.2fx\n", "write", mkw / 1e6, mfw / 1e6, mkw / mfw);
		printf("  %-6s %12.0f %12.0f %7.2fx\n", "read", mkr / 1e6, mfr / 1e6, mkr / mfr);
	} else {
		printf("  %-6s %12.0f %12s\n", "write", mkw / 1e6, "-");
		printf("  %-6s %12.0f %12s\n", "read", mkr / 1e6, "-");
	}
	printf("  last round: io_uring enters %" PRIu64 " for %" PRIu64 " requests; fixed-buffer transfers %" PRIu64
	       " of %" PRIu64 "\n",
	       st.io.enters, st.io.sqes, st.io.fixed_ios, st.io.fixed_ios + st.io.plain_ios + st.io.joined_ios);
	if (mfw < 0 && !o->skip_fio)
		printf("  (fio did not run: is it installed?)\n");
	else if (!o->skip_fio && (mkw / mfw < 0.9 || mkr / mfr < 0.9))
		printf("  below the 0.90x goal\n");
	dt_arena_free(&a);
	return 0;
}

static int adoption(struct opts *o, const char *root)
{
	struct dt_arena a;
	const uint64_t lane = 64; /* 8 KiB files */
	int rc = dt_arena_new(1, lane, &a);
	if (rc)
		die("arena", rc);
	dt_fill(dt_slot(&a, 0), lane, dt_key(9, 0), 0, 1);
	uint64_t fb = kvr_l2_file_bytes(lane);
	struct kvr_l2_store_config cfg = store_cfg(root, lane, (uint64_t)o->adopt_files * fb, 64, KVR_L2_DUR_NONE, &a);
	struct kvr_l2_store *s;
	rc = open_store(&cfg, NULL, &s);
	if (rc)
		die("store open", rc);
	double tc = put_all(s, &a, 1, o->adopt_files, 64);
	struct kvr_l2_store_stats sst;
	kvr_l2_store_stats(s, &sst);
	o->direct_label = sst.direct ? "O_DIRECT" : "buffered I/O";
	kvr_l2_store_close(s);
	sync(); /* a restart finds the files written back, not 100k dirty inodes */
	if (o->drop_caches) {
		int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
		if (fd < 0 || write(fd, "3", 1) != 1)
			fprintf(stderr, "l2_bench: cannot drop caches\n");
		if (fd >= 0)
			close(fd);
	}
	struct kvr_l2_adopt_stats ast;
	double t0 = now_s();
	rc = open_store(&cfg, &ast, &s);
	double t = now_s() - t0;
	if (rc)
		die("store reopen", rc);
	kvr_l2_store_close(s);
	printf("L2 adoption: %" PRIu64 " of %u files (%" PRIu64 " bytes each) adopted in %.3f s (%.0f files/s; headers "
	       "read with %s, %s; %u probes in flight); created in %.2f s\n",
	       ast.adopted, o->adopt_files, fb, t, ast.adopted / t, o->direct_label,
	       o->drop_caches ? "caches dropped first" : "inodes and dentries cached", KVR_L2_ADOPT_DEPTH, tc);
	/* reopen with room for one file: adoption deletes the rest, oldest first, through io_uring */
	struct kvr_l2_adopt_stats del;
	cfg.capacity_bytes = fb;
	t0 = now_s();
	rc = open_store(&cfg, &del, &s);
	double td = now_s() - t0;
	if (rc)
		die("store reopen (cap 1 file)", rc);
	kvr_l2_store_close(s);
	printf("L2 adoption over the cap: kept %" PRIu64 ", deleted %" PRIu64 " in %.2f s\n", del.adopted, del.deleted, td);
	if (del.adopted != 1 || del.deleted != o->adopt_files - 1) {
		fprintf(stderr, "l2_bench: over-cap adoption kept %" PRIu64 " and deleted %" PRIu64 "\n", del.adopted,
			del.deleted);
		rc = 1;
	}
	dt_arena_free(&a);
	if (rc)
		return 1;
	if (ast.adopted != o->adopt_files) {
		fprintf(stderr, "l2_bench: adopted %" PRIu64 " of %u\n", ast.adopted, o->adopt_files);
		return 1;
	}
	if (o->adopt_limit_ms && t * 1000 > o->adopt_limit_ms) {
		fprintf(stderr, "l2_bench: adoption took %.0f ms, over the %u ms limit\n", t * 1000, o->adopt_limit_ms);
		return 1;
	}
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: l2_bench [--dir D] [--blocks N] [--block-kib K] [--qd Q] [--rounds R]\n"
			"                [--durability none|block|batch]\n"
			"                [--adopt-files N] [--adopt-limit-ms MS] [--no-fio] [--no-throughput] [--no-adopt]\n"
			"                [--drop-caches]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct opts o = {.block_bytes = 2u << 20, .blocks = 512, .qd = 32, .rounds = 3, .dur = KVR_L2_DUR_NONE,
			 .adopt_files = 100000, .adopt_limit_ms = 0};
	static const struct option lo[] = {
		{"dir", required_argument, NULL, 'd'},       {"blocks", required_argument, NULL, 'n'},
		{"block-kib", required_argument, NULL, 'b'}, {"qd", required_argument, NULL, 'q'},
		{"durability", required_argument, NULL, 'D'}, {"adopt-files", required_argument, NULL, 'a'},
		{"adopt-limit-ms", required_argument, NULL, 'l'}, {"no-fio", no_argument, NULL, 'F'},
		{"no-throughput", no_argument, NULL, 'T'},   {"no-adopt", no_argument, NULL, 'A'},
		{"drop-caches", no_argument, NULL, 'C'},     {"rounds", required_argument, NULL, 'r'},
		{0},
	};
	int c;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'd': o.dir = optarg; break;
		case 'n': o.blocks = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'b': o.block_bytes = strtoull(optarg, NULL, 0) << 10; break;
		case 'q': o.qd = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'D':
			if (kvr_l2_durability_parse(optarg, &o.dur))
				usage();
			break;
		case 'a': o.adopt_files = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'l': o.adopt_limit_ms = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'F': o.skip_fio = 1; break;
		case 'T': o.skip_tp = 1; break;
		case 'A': o.skip_adopt = 1; break;
		case 'C': o.drop_caches = 1; break;
		case 'r': o.rounds = (unsigned)strtoul(optarg, NULL, 0); break;
		default: usage();
		}
	}
	if (!o.blocks || !o.block_bytes || !o.qd || o.qd > KVR_L2IO_MAX_QD || !o.adopt_files || !o.rounds ||
	    o.rounds > 16)
		usage();
	const char *lim = getenv("KVR_L2_ADOPT_LIMIT_MS"); /* a slower machine's CI may relax it (0: report only) */
	if (lim && *lim)
		o.adopt_limit_ms = (unsigned)strtoul(lim, NULL, 0);
	struct rlimit rl; /* the arena is pinned: take what the hard limit allows */
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_MEMLOCK, &rl);
	}
	char base[256], root[300];
	if (o.dir)
		snprintf(base, sizeof(base), "%s/kvr-l2bench-%d", o.dir, (int)getpid());
	else
		snprintf(base, sizeof(base), "/tmp/kvr-l2bench-%d", (int)getpid());
	dt_rmrf(base);
	if (mkdir(base, 0755))
		die(base, errno);
	int rc = 0;
	if (!o.skip_tp) {
		snprintf(root, sizeof(root), "%s/tp", base);
		mkdir(root, 0755);
		rc |= throughput(&o, root);
		dt_rmrf(root);
	}
	if (!o.skip_adopt) {
		snprintf(root, sizeof(root), "%s/adopt", base);
		mkdir(root, 0755);
		rc |= adoption(&o, root);
	}
	dt_rmrf(base);
	return rc;
}
