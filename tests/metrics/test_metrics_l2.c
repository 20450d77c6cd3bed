/* The disk tier's metrics (kvring_l2_*) and kvring-inspect's l2 view: exact values after known L2 workloads. */
#include <criterion/criterion.h>

#include <cJSON.h>
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

#include "kvr_keys.h"
#include "l2file.h"
#include "metrics_test.h"
#include "sup.h"
#include "tool_test.h"

/*
 * One kvringd with metrics and one L2 directory (disk.0). The workload (m_workload) writes
 * 12 block lanes through to L2: prompts 0, 1, 2 of 4 blocks, TP 1 (lane 0). Every file is
 * kvr_l2_file_bytes(M_LANE_BYTES) = 4096 + 16384 = 20480 bytes.
 */

#define FB 20480ull                /* one block file */
#define WRITTEN 12u                /* files the workload writes */

static struct h_inst inst;
static struct m_worker worker = {.kv_fd = -1};
static char l2dir[160];
static char dir_label[200];          /* {dir="<l2dir>"} */
static char out_path[128], err_path[128];

static void setup(void)
{
	h_init(&inst, 0700);
	memset(&worker, 0, sizeof(worker));
	worker.kv_fd = -1;
	snprintf(l2dir, sizeof(l2dir), "%s/l2", inst.dir);
	cr_assert_eq(mkdir(l2dir, 0700), 0);
	snprintf(dir_label, sizeof(dir_label), "{dir=\"%s\"", l2dir);
	snprintf(out_path, sizeof(out_path), "%s/inspect.out", inst.dir);
	snprintf(err_path, sizeof(err_path), "%s/inspect.err", inst.dir);
}

static void teardown(void)
{
	m_worker_close(&worker);
	h_fini(&inst);
}

TestSuite(metrics_l2, .init = setup, .fini = teardown, .timeout = 60);

/* The value of `name{dir="<l2dir>"<more>}` in an exposition (more: "" or ",result=\"tmp\""). */
static double l2v(const char *text, const char *name, const char *more)
{
	char series[512];
	snprintf(series, sizeof(series), "%s%s%s}", name, dir_label, more);
	return m_get(text, series);
}

static double adoption(const char *text, const char *result)
{
	char more[64];
	snprintf(more, sizeof(more), ",result=\"%s\"", result);
	return l2v(text, "kvring_l2_adoption_files_total", more);
}

/* Every adoption result other than those named in `nonzero` ("tmp,over_cap,") is 0. */
static void adoption_rest_zero(const char *text, const char *nonzero)
{
	for (unsigned r = 1; r < KVR_L2_R_MAX; r++) {
		if (r == KVR_L2_R_PAYLOAD_CSUM)
			continue;
		const char *n = kvr_l2_reason_name(r);
		char key[40];
		snprintf(key, sizeof(key), "%s,", n);
		if (!strstr(nonzero, key))
			cr_assert_eq(adoption(text, n), 0, "adoption result %s", n);
	}
	char more[256];
	snprintf(more, sizeof(more), "%s,result=\"payload_checksum\"}", dir_label);
	cr_assert_null(strstr(text, more), "adoption never reads payloads: no payload_checksum result");
}

/* The namespace directory under l2dir (the only subdirectory) and its namespace. */
static void ns_dir(char *buf, size_t len, kvr_key *ret_ns)
{
	DIR *d = opendir(l2dir);
	cr_assert_not_null(d);
	struct dirent *de;
	bool found = false;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' && strlen(de->d_name) == 32) {
			cr_assert(!found, "two namespace directories");
			found = true;
			snprintf(buf, len, "%s/%s", l2dir, de->d_name);
			cr_assert_eq(kvr_key_parse(de->d_name, ret_ns), 0);
		}
	closedir(d);
	cr_assert(found, "no namespace directory in %s", l2dir);
}

/* The file of workload prompt p block i (lane 0). */
static void block_path(char *buf, size_t len, const char *ns_path, kvr_key ns, unsigned p, unsigned i)
{
	uint32_t t[M_PROMPT_TOKENS];
	kvr_key keys[4];
	m_prompt(t, p);
	cr_assert_eq(kvr_keys_chain(ns, t, M_PROMPT_TOKENS, M_BLOCK_TOKENS, NULL, 0, keys, 4), 4);
	char name[KVR_L2_NAME_MAX];
	snprintf(buf, len, "%s/%s", ns_path, kvr_l2_name_fmt(keys[i], 0, name));
}

static void set_mtime(const char *path, time_t sec)
{
	struct timespec ts[2] = {{.tv_sec = sec}, {.tv_sec = sec}};
	cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0, "%s: %s", path, strerror(errno));
}

/* Run the workload and wait until the lookup actor counted every write-through. */
static void workload_written(void)
{
	m_worker_attach(&worker, inst.sock);
	m_workload(&worker);
	cr_assert(H_WAIT(h_stat(&inst, "lookup", KVR_STAT_LK_L2_WRITES) == WRITTEN, 5000), "written through: %llu",
		  (unsigned long long)h_stat(&inst, "lookup", KVR_STAT_LK_L2_WRITES));
}

static void stop_kvringd(void)
{
	m_worker_close(&worker);
	cr_assert_eq(kill(inst.pid, SIGTERM), 0);
	int st = h_wait_exit(inst.pid, 10000);
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvringd exit status %#x", st);
	inst.pid = 0;
	h_unmap(&inst);
}

/* kvring-inspect on the live instance: its stdout (caller frees). */
static char *inspect(bool json)
{
	const char *args[] = {"--socket", inst.sock, json ? "--json" : "--messages", json ? NULL : "0", NULL};
	pid_t pid = tool_spawn("tools/inspect/kvring-inspect", args, out_path, err_path);
	int st = h_wait_exit(pid, 5000);
	char *err = tool_slurp(err_path);
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvring-inspect: status %#x: %s", st, err);
	free(err);
	return tool_slurp(out_path);
}

static bool has_line(const char *text, const char *line)
{
	size_t n = strlen(line);
	for (const char *p = text; (p = strstr(p, line)); p++)
		if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0))
			return true;
	return false;
}

static double jnum(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	cr_assert(cJSON_IsNumber(v), "JSON key %s missing or not a number", key);
	return v->valuedouble;
}

/* kvring-inspect --json's l2[0], checked against the scrape for every key it shares with
 * /metrics; returns the document (caller deletes). */
static cJSON *inspect_l2_matches(const char *scrape, const cJSON **ret_l2)
{
	char *out = inspect(true);
	cJSON *doc = cJSON_Parse(out);
	cr_assert_not_null(doc, "kvring-inspect --json is not JSON:\n%s", out);
	free(out);
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(doc, "l2");
	cr_assert(cJSON_IsArray(arr) && cJSON_GetArraySize(arr) == 1, "one disk actor in l2[]");
	const cJSON *l = cJSON_GetArrayItem(arr, 0);
	const cJSON *s = cJSON_GetObjectItemCaseSensitive(l, "actor");
	cr_assert(cJSON_IsString(s) && !strcmp(s->valuestring, "disk.0"));
	s = cJSON_GetObjectItemCaseSensitive(l, "dir");
	cr_assert(cJSON_IsString(s) && !strcmp(s->valuestring, l2dir), "dir");
	cr_assert_eq(jnum(l, "dir_index"), 0);
	cr_assert_eq(jnum(l, "used_bytes"), l2v(scrape, "kvring_l2_bytes", ""));
	cr_assert_eq(jnum(l, "files"), l2v(scrape, "kvring_l2_files", ""));
	cr_assert_eq(jnum(l, "capacity_bytes"), l2v(scrape, "kvring_l2_capacity_bytes", ""));
	cr_assert_eq(jnum(l, "evicted_files"), l2v(scrape, "kvring_l2_evicted_files_total", ""));
	const cJSON *ad = cJSON_GetObjectItemCaseSensitive(l, "adoption");
	cr_assert_eq(jnum(ad, "adopted"), adoption(scrape, "adopted"));
	for (unsigned r = 1; r < KVR_L2_R_MAX; r++) {
		const char *n = kvr_l2_reason_name(r);
		if (r != KVR_L2_R_PAYLOAD_CSUM)
			cr_assert_eq(jnum(ad, n), adoption(scrape, n), "adoption.%s", n);
	}
	const cJSON *rf = cJSON_GetObjectItemCaseSensitive(l, "read_failures");
	cr_assert_eq(jnum(rf, "damaged"), l2v(scrape, "kvring_l2_read_failures_total", ",reason=\"damaged\""));
	cr_assert_eq(jnum(rf, "vanished"), l2v(scrape, "kvring_l2_read_failures_total", ",reason=\"vanished\""));
	cr_assert_eq(jnum(rf, "io_error"), l2v(scrape, "kvring_l2_read_failures_total", ",reason=\"io_error\""));
	cr_assert_eq(jnum(l, "read_only_refused_writes"), 0);
	const cJSON *kept = cJSON_GetObjectItemCaseSensitive(l, "read_only_kept_files");
	cr_assert_eq(jnum(kept, "adoption"), 0);
	cr_assert_eq(jnum(kept, "read"), 0);
	const cJSON *xf = cJSON_GetObjectItemCaseSensitive(l, "transfers");
	const char *const how[] = {"joined", "registered", "unregistered"};
	for (unsigned i = 0; i < 3; i++) {
		char more[40];
		snprintf(more, sizeof(more), ",how=\"%s\"", how[i]);
		cr_assert_eq(jnum(xf, how[i]), l2v(scrape, "kvring_l2_transfers_total", more), "transfers.%s", how[i]);
	}
	/* the slot table kvringd hands to INSPECT: states and pins agree with /metrics */
	const cJSON *sl = cJSON_GetObjectItemCaseSensitive(doc, "l1_slots");
	cr_assert(cJSON_IsObject(sl), "l1_slots missing");
	const char *const st[] = {"free", "writing", "evicting", "draining"};
	double sum = jnum(sl, "committed");
	cr_assert_eq(sum, m_get(scrape, "kvring_l1_slots{state=\"committed\"}") +
				  m_get(scrape, "kvring_l1_slots{state=\"reading\"}"));
	for (unsigned i = 0; i < 4; i++) {
		char series[64];
		snprintf(series, sizeof(series), "kvring_l1_slots{state=\"%s\"}", st[i]);
		cr_assert_eq(jnum(sl, st[i]), m_get(scrape, series), "l1_slots.%s", st[i]);
		sum += jnum(sl, st[i]);
	}
	cr_assert_eq(sum, jnum(sl, "slots"), "the states add up to the slot count");
	cr_assert_gt(jnum(sl, "committed"), 0);
	const cJSON *pins = cJSON_GetObjectItemCaseSensitive(sl, "pins");
	const char *const owners[] = {"loaders", "lookup", "io", "remote"};
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(jnum(pins, owners[i]), 0, "a quiet instance holds no %s pin", owners[i]);
	*ret_l2 = l;
	return doc;
}

/* The cap holds 8 files: 12 writes evict the 4 oldest. Gauges, evictions, the files on
 * disk, /metrics and kvring-inspect (text and JSON) agree. */
Test(metrics_l2, gauges_and_evictions)
{
	cr_assert_eq(kvr_l2_file_bytes(M_LANE_BYTES), FB);
	uint16_t port = m_free_port();
	m_start_l2(&inst, port, l2dir, 8 * FB);

	char *t = m_scrape(port);
	cr_assert_eq(l2v(t, "kvring_l2_bytes", ""), 0);
	cr_assert_eq(l2v(t, "kvring_l2_files", ""), 0);
	cr_assert_eq(l2v(t, "kvring_l2_capacity_bytes", ""), 8 * FB);
	cr_assert_eq(adoption(t, "adopted"), 0);
	adoption_rest_zero(t, "");
	cr_assert_eq(l2v(t, "kvring_l2_evicted_files_total", ""), 0);
	free(t);

	workload_written();
	t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_l2_blocks_total{op=\"write\",result=\"ok\"}"), WRITTEN);
	cr_assert_eq(l2v(t, "kvring_l2_files", ""), 8);
	cr_assert_eq(l2v(t, "kvring_l2_bytes", ""), 8 * FB);
	cr_assert_eq(l2v(t, "kvring_l2_capacity_bytes", ""), 8 * FB);
	cr_assert_eq(l2v(t, "kvring_l2_evicted_files_total", ""), WRITTEN - 8);
	cr_assert_eq(l2v(t, "kvring_l2_read_failures_total", ",reason=\"damaged\""), 0);
	cr_assert_eq(l2v(t, "kvring_l2_read_only_refused_writes_total", ""), 0);
	cr_assert_eq(l2v(t, "kvring_l2_read_only_kept_files_total", ",found=\"adoption\""), 0);
	cr_assert_eq(l2v(t, "kvring_l2_read_only_kept_files_total", ",found=\"read\""), 0);
	cr_assert_eq(h_stat(&inst, "disk.0", KVR_STAT_DK_FILES), 8);
	cr_assert_eq(h_stat(&inst, "disk.0", KVR_STAT_DK_EVICTED), 4);
	/* L1 in 4 KiB pages (l1.huge_pages false here): each write's payload went through the
	 * registered arena, its header separately; nothing joined (operations.md, huge pages) */
	cr_assert_eq(l2v(t, "kvring_l2_transfers_total", ",how=\"registered\""), WRITTEN);
	cr_assert_eq(l2v(t, "kvring_l2_transfers_total", ",how=\"joined\""), 0);
	cr_assert_eq(l2v(t, "kvring_l2_transfers_total", ",how=\"unregistered\""), 0);

	char ns_path[256];
	kvr_key ns;
	ns_dir(ns_path, sizeof(ns_path), &ns);
	cr_assert(H_WAIT(h_count_files(ns_path, ".kvb") == 8, 2000), "%u block files on disk",
		  h_count_files(ns_path, ".kvb"));
	/* the 8 on disk are workload blocks (the three stores commit interleaved, so which 4 were
	 * the least recently written is not fixed) */
	unsigned present = 0;
	for (unsigned k = 0; k < WRITTEN; k++) {
		char path[512];
		block_path(path, sizeof(path), ns_path, ns, k / 4, k % 4);
		present += access(path, F_OK) == 0;
	}
	cr_assert_eq(present, 8);

	const cJSON *l;
	cJSON *doc = inspect_l2_matches(t, &l);
	cr_assert_eq(jnum(l, "used_bytes"), 163840);
	cr_assert_eq(jnum(l, "files"), 8);
	cr_assert_eq(jnum(l, "evicted_files"), 4);
	cJSON_Delete(doc);

	char *text = inspect(false);
	char want[256];
	snprintf(want, sizeof(want), "  disk.0  %s", l2dir);
	cr_assert(has_line(text, "l2"), "no l2 section:\n%s", text);
	cr_assert(has_line(text, want), "no \"%s\" in:\n%s", want, text);
	cr_assert(has_line(text, "    used 160.0 KiB of 160.0 KiB (100%)  files 8  evicted 4"), "text:\n%s", text);
	cr_assert(has_line(text, "    adopted 0"), "text:\n%s", text);
	cr_assert(has_line(text, "    transfers: joined 0, registered 12, unregistered 0"), "text:\n%s", text);
	cr_assert(strstr(text, "\nL1 slots ") && strstr(text, "  pins: loaders 0  lookup 0  io 0  remote 0\n"),
		  "no slot table in the text:\n%s", text);
	free(text);
	free(t);
}

/*
 * Restart over a directory with the 12 files (mtimes set: file k = prompt k/4 block k%4 is
 * k seconds newer than file 0), a tmp leftover, a foreign file, file 0 with a damaged header
 * and file 11 with a damaged payload, under a cap of 8 files: adoption counts 1 tmp, 1
 * foreign, 1 header_checksum and keeps the 8 newest good files (4..11), 3 over_cap (1..3).
 * A lookup of prompt 2 then reads file 11 and finds it damaged: 7 files left.
 */
Test(metrics_l2, adoption_after_restart)
{
	uint16_t port = m_free_port();
	m_start_l2(&inst, port, l2dir, 64ull << 20);
	workload_written();
	char *t = m_scrape(port);
	cr_assert_eq(l2v(t, "kvring_l2_files", ""), WRITTEN);
	cr_assert_eq(l2v(t, "kvring_l2_bytes", ""), WRITTEN * FB);
	cr_assert_eq(l2v(t, "kvring_l2_capacity_bytes", ""), 64ull << 20);
	cr_assert_eq(l2v(t, "kvring_l2_evicted_files_total", ""), 0);
	free(t);
	stop_kvringd();

	char ns_path[256], path[512], tmp[600];
	kvr_key ns;
	ns_dir(ns_path, sizeof(ns_path), &ns);
	cr_assert_eq(h_count_files(ns_path, ".kvb"), WRITTEN);
	block_path(path, sizeof(path), ns_path, ns, 0, 0);
	h_flip_byte(path, 200); /* a reserved header byte: the header checksum */
	block_path(path, sizeof(path), ns_path, ns, 2, 3);
	h_flip_byte(path, 4096 + 300); /* a payload byte: found by the first read */
	time_t t0 = time(NULL) - 100;
	for (unsigned k = 0; k < WRITTEN; k++) {
		block_path(path, sizeof(path), ns_path, ns, k / 4, k % 4);
		set_mtime(path, t0 + k);
	}
	block_path(path, sizeof(path), ns_path, ns, 0, 1);
	snprintf(tmp, sizeof(tmp), "%s.tmp.99999.7", path);
	h_write_file(tmp, "half a block");
	snprintf(path, sizeof(path), "%s/NOTES.txt", ns_path);
	h_write_file(path, "operator's notes\n");

	port = m_free_port();
	m_start_l2(&inst, port, l2dir, 8 * FB);
	cr_assert(h_log_contains(&inst, "disk.0 synced: 8 block lanes on disk"), "log:\n%s", h_read_file(inst.log));
	t = m_scrape(port);
	cr_assert_eq(adoption(t, "adopted"), 8);
	cr_assert_eq(adoption(t, "tmp"), 1);
	cr_assert_eq(adoption(t, "foreign"), 1);
	cr_assert_eq(adoption(t, "header_checksum"), 1);
	cr_assert_eq(adoption(t, "over_cap"), 3);
	adoption_rest_zero(t, "tmp,foreign,header_checksum,over_cap,");
	cr_assert_eq(l2v(t, "kvring_l2_files", ""), 8);
	cr_assert_eq(l2v(t, "kvring_l2_bytes", ""), 8 * FB);
	cr_assert_eq(l2v(t, "kvring_l2_capacity_bytes", ""), 8 * FB);
	cr_assert_eq(l2v(t, "kvring_l2_evicted_files_total", ""), 0, "adoption's over-cap deletions are not evictions");
	free(t);
	/* tmp, the damaged header and the 3 over the cap removed; the foreign file left alone */
	cr_assert_eq(h_count_files(ns_path, ".kvb"), 8);
	cr_assert_eq(h_count_files(ns_path, ".7"), 0, "the tmp file is removed");
	cr_assert_eq(access(path, F_OK), 0, "NOTES.txt is left alone");

	/* prompt 1 is promoted whole; prompt 2's block 3 is damaged: 3 promoted, a miss */
	m_worker_attach(&worker, inst.sock);
	uint32_t tok[M_PROMPT_TOKENS];
	struct kvr_lookup_result lr;
	m_prompt(tok, 1);
	cr_assert_eq(kvr_lookup(worker.c, 1, tok, M_PROMPT_TOKENS, NULL, 0, &lr), 0);
	cr_assert_eq(lr.matched_blocks, 4);
	cr_assert_eq(lr.l2_blocks, 4);
	m_prompt(tok, 2);
	cr_assert_eq(kvr_lookup(worker.c, 2, tok, M_PROMPT_TOKENS, NULL, 0, &lr), 0);
	cr_assert_eq(lr.matched_blocks, 3);
	cr_assert_eq(lr.l2_blocks, 3);

	/* prompt 1 again: from L1 now */
	m_prompt(tok, 1);
	cr_assert_eq(kvr_lookup(worker.c, 3, tok, M_PROMPT_TOKENS, NULL, 0, &lr), 0);
	cr_assert_eq(lr.matched_blocks, 4);
	cr_assert_eq(lr.l2_blocks, 0);

	t = m_scrape(port);
	cr_assert_eq(m_get(t, "kvring_l2_blocks_total{op=\"read\",result=\"ok\"}"), 7);
	cr_assert_eq(m_get(t, "kvring_l2_blocks_total{op=\"read\",result=\"failed\"}"), 1);
	cr_assert_eq(m_get(t, "kvring_lookup_matched_blocks_total"), 4 + 3 + 4);
	cr_assert_eq(m_get(t, "kvring_l1_hits_total"), 4, "the promoted blocks are matched, not L1 hits");
	cr_assert_eq(l2v(t, "kvring_l2_read_failures_total", ",reason=\"damaged\""), 1);
	cr_assert_eq(l2v(t, "kvring_l2_read_failures_total", ",reason=\"vanished\""), 0);
	cr_assert_eq(l2v(t, "kvring_l2_read_failures_total", ",reason=\"io_error\""), 0);
	cr_assert_eq(l2v(t, "kvring_l2_files", ""), 7);
	cr_assert_eq(l2v(t, "kvring_l2_bytes", ""), 7 * FB);
	cr_assert_eq(l2v(t, "kvring_l2_evicted_files_total", ""), 0);
	cr_assert(H_WAIT(h_count_files(ns_path, ".kvb") == 7, 2000), "the damaged file is removed");

	const cJSON *l;
	cJSON *doc = inspect_l2_matches(t, &l);
	const cJSON *ad = cJSON_GetObjectItemCaseSensitive(l, "adoption");
	cr_assert_eq(jnum(ad, "adopted"), 8);
	cr_assert_eq(jnum(ad, "over_cap"), 3);
	cr_assert_eq(jnum(cJSON_GetObjectItemCaseSensitive(l, "read_failures"), "damaged"), 1);
	cr_assert_eq(jnum(l, "used_bytes"), 7 * FB);
	cJSON_Delete(doc);

	char *text = inspect(false);
	cr_assert(has_line(text, "    used 140.0 KiB of 160.0 KiB (87%)  files 7  evicted 0"), "text:\n%s", text);
	const char *adopted = "    adopted 8, not adopted: foreign 1, tmp 1, header_checksum 1, over_cap 3";
	cr_assert(has_line(text, adopted), "text:\n%s", text);
	cr_assert(has_line(text, "    reads failed: damaged 1, vanished 0, io_error 0"), "text:\n%s", text);
	free(text);
	free(t);
}

/* ---- rendering on a synthetic instance ------------------------------------------------- */

static char *render_fake(struct m_fake *f)
{
	struct sup_metrics_view v = {.ctl = f->ctl, .slots = f->slots};
	size_t len;
	char *t = sup_metrics_render(&v, &len);
	cr_assert_not_null(t);
	cr_assert_eq(strlen(t), len);
	return t;
}

TestSuite(metrics_l2_render, .timeout = 20);

/* The names kvr_ctl.h gives the adoption reasons (for kvringd and inspect, which do not link
 * the disk tier) are l2file.h's. */
Test(metrics_l2_render, reason_names_agree)
{
	cr_assert_eq(KVR_STAT_DK_REASON_MAX, KVR_L2_R_MAX);
	for (unsigned r = 0; r < KVR_L2_R_MAX; r++)
		cr_assert_str_eq(kvr_stat_dk_reason_name(r), kvr_l2_reason_name(r), "reason %u", r);
	cr_assert_null(kvr_stat_dk_reason_name(KVR_L2_R_MAX));
	cr_assert_eq(kvr_stat_dk_rejected(1), KVR_STAT_DK_REJECTED_FIRST);
	cr_assert_lt(kvr_stat_dk_rejected(KVR_L2_R_MAX - 1), KVR_STAT_DK_NEXT);
}

Test(metrics_l2_render, every_family_exact)
{
	struct m_fake f;
	m_fake_init_config(&f, MF_L2_CONFIG);
	m_fake_add_disk(&f, 0, "disk.0");
	char *t = render_fake(&f);
	const char *L = "{dir=\"" MF_ODD_DIR_LABEL "\"";
	struct {
		const char *name, *more;
		double want;
	} rows[] = {
		{"kvring_l2_bytes", "", 3 * FB},
		{"kvring_l2_files", "", 3},
		{"kvring_l2_capacity_bytes", "", 1 << 20},
		{"kvring_l2_adoption_files_total", ",result=\"adopted\"", 5},
		{"kvring_l2_adoption_files_total", ",result=\"tmp\"", 2},
		{"kvring_l2_adoption_files_total", ",result=\"over_cap\"", 7},
		{"kvring_l2_adoption_files_total", ",result=\"foreign\"", 0},
		{"kvring_l2_adoption_files_total", ",result=\"io_error\"", 0},
		{"kvring_l2_evicted_files_total", "", 11},
		{"kvring_l2_read_failures_total", ",reason=\"damaged\"", 1},
		{"kvring_l2_read_failures_total", ",reason=\"vanished\"", 2},
		{"kvring_l2_read_failures_total", ",reason=\"io_error\"", 3},
		{"kvring_l2_read_only_refused_writes_total", "", 4},
		{"kvring_l2_read_only_kept_files_total", ",found=\"adoption\"", 9},
		{"kvring_l2_read_only_kept_files_total", ",found=\"read\"", 6},
		{"kvring_l2_transfers_total", ",how=\"joined\"", 13},
		{"kvring_l2_transfers_total", ",how=\"registered\"", 14},
		{"kvring_l2_transfers_total", ",how=\"unregistered\"", 15},
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		char series[256];
		snprintf(series, sizeof(series), "%s%s%s}", rows[i].name, L, rows[i].more);
		cr_assert_eq(m_get(t, series), rows[i].want, "%s", series);
	}
	cr_assert(strstr(t, "# TYPE kvring_l2_bytes gauge\n"));
	cr_assert(strstr(t, "# TYPE kvring_l2_files gauge\n"));
	cr_assert(strstr(t, "# TYPE kvring_l2_capacity_bytes gauge\n"));
	cr_assert(strstr(t, "# TYPE kvring_l2_adoption_files_total counter\n"));
	cr_assert(strstr(t, "# TYPE kvring_l2_evicted_files_total counter\n"));
	cr_assert(strstr(t, "# TYPE kvring_l2_read_failures_total counter\n"));
	cr_assert(strstr(t, "# TYPE kvring_l2_transfers_total counter\n"));
	/* adopted + every reason but ok and payload_checksum */
	unsigned n = 0;
	for (const char *p = t; (p = strstr(p, "\nkvring_l2_adoption_files_total{")); p++)
		n++;
	cr_assert_eq(n, 1 + (KVR_L2_R_MAX - 2));
	cr_assert_null(strstr(t, "result=\"payload_checksum\""));
	free(t);
	m_fake_fini(&f);
}

/* No disk actor: no per-dir family at all. A disk actor whose dir the config does not name
 * is labelled with its actor name. */
Test(metrics_l2_render, no_disk_and_unnamed_dir)
{
	struct m_fake f;
	m_fake_init(&f);
	char *t = render_fake(&f);
	cr_assert_null(strstr(t, "kvring_l2_bytes"));
	cr_assert_null(strstr(t, "kvring_l2_adoption_files_total"));
	cr_assert(strstr(t, "kvring_l2_blocks_total{op=\"read\",result=\"ok\"} 0\n"), "the lookup's L2 series stay");
	free(t);
	m_fake_add_disk(&f, 3, "disk.3");
	t = render_fake(&f);
	cr_assert_eq(m_get(t, "kvring_l2_files{dir=\"disk.3\"}"), 3);
	cr_assert_eq(m_get(t, "kvring_l2_adoption_files_total{dir=\"disk.3\",result=\"tmp\"}"), 2);
	free(t);
	m_fake_fini(&f);
}
