/* kvring-inspect's L2 and remote views: the disk actors' stats and directories, the remote actor's stats, rendered exactly as text and JSON. */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inspect_render.h"
#include "kvr_ctl.h"
#include "kvr_segment.h"

#define S_NS 1000000000ull
#define FB 20480ull /* one block file of a 16 KiB lane */

/* l2.dirs[1]: 100 characters, longer than a text line has room for */
#define LONG_DIR "/mnt/nvme0/" \
	"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx/l2-b"
#define CONFIG "{\"l2\": {\"dirs\": [\"/var/lib/kvring/l2-a\", \"" LONG_DIR "\"], \"capacity_bytes\": 2147483648}}"

static const struct kvr_ctl_ring_spec specs[] = {{"ctl.lookup.in", 8, KVR_EP_SUPERVISOR, 0}};
static struct kvr_segment seg, ro;
static struct kvr_ctl *wctl;

static struct kvr_actor_stats *disk(unsigned slot, const char *name, unsigned index, unsigned state)
{
	struct kvr_actor_ent *a = kvr_ctl_actor(wctl, slot);
	snprintf(a->name, sizeof(a->name), "%s", name);
	a->kind = KVR_ACTOR_DISK;
	a->index = index;
	atomic_store(&a->state, state);
	return kvr_ctl_stats(wctl, slot);
}

static void set(struct kvr_actor_stats *st, unsigned s, uint64_t v)
{
	atomic_store(&st->c[s], v);
}

/* The remote actor's counters: each a distinct value (enum kvr_stat_remote order). */
static const struct {
	unsigned stat;
	uint64_t v;
} remote_stats[] = {
	{KVR_STAT_RM_READS, 1001},       {KVR_STAT_RM_HITS, 1002},          {KVR_STAT_RM_MISSES, 1003},
	{KVR_STAT_RM_BAD_VALUES, 1004},  {KVR_STAT_RM_READ_ERRORS, 1005},   {KVR_STAT_RM_WRITES, 1006},
	{KVR_STAT_RM_WRITE_ERRORS, 1007}, {KVR_STAT_RM_WRITES_STALE, 1008}, {KVR_STAT_RM_BYTES_IN, 5 * FB},
	{KVR_STAT_RM_BYTES_OUT, 3ull << 30}, {KVR_STAT_RM_MOVED, 1011},     {KVR_STAT_RM_ASK, 1012},
	{KVR_STAT_RM_TIMEOUTS, 1013},    {KVR_STAT_RM_CONN_ERRORS, 1014},   {KVR_STAT_RM_REPLY_ERRORS, 1015},
	{KVR_STAT_RM_REFRESHES, 1016},   {KVR_STAT_RM_NODES, 3},            {KVR_STAT_RM_NODES_UP, 2},
	{KVR_STAT_RM_INFLIGHT, 7},       {KVR_STAT_RM_SLOTS_COVERED, 10923},
};

/*
 * Actors: 0 lookup (its remote counters 1021..1024); 1 disk.0 (l2.dirs[0]) with every
 * adoption reason counted, evictions and failed reads; 2 disk.1 (the long dir) with
 * read-only counters; 3 disk.5, whose dir the config does not name; 4 remote, READY, with
 * remote_stats and a cluster missing a node (2 of 3 up, 10923 of 16384 slots).
 */
static void setup(void)
{
	size_t sz = kvr_ctl_memsize(5, 1, specs, 1, sizeof(CONFIG));
	char name[64];
	snprintf(name, sizeof(name), "kvr-test-inspect-l2-%d", getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_CTL, sz, 1, 0, &seg), 0);
	cr_assert_eq(kvr_ctl_init(&seg, 5, 1, specs, 1, CONFIG), 0);
	wctl = seg.base;
	atomic_store(&wctl->state, KVR_INST_RUNNING);
	struct kvr_actor_ent *lk = kvr_ctl_actor(wctl, 0);
	snprintf(lk->name, sizeof(lk->name), "lookup");
	lk->kind = KVR_ACTOR_LOOKUP;
	atomic_store(&lk->state, KVR_ACTOR_READY);

	struct kvr_actor_stats *d0 = disk(1, "disk.0", 0, KVR_ACTOR_READY);
	set(d0, KVR_STAT_DK_BYTES, 12 * FB);
	set(d0, KVR_STAT_DK_FILES, 12);
	set(d0, KVR_STAT_DK_CAPACITY_BYTES, 1ull << 30);
	set(d0, KVR_STAT_DK_EVICTED, 3);
	set(d0, KVR_STAT_DK_ADOPTED, 12);
	for (unsigned r = 1; r < KVR_STAT_DK_REASON_MAX; r++)
		set(d0, kvr_stat_dk_rejected(r), r); /* reason r counted r times (payload_checksum too: never shown) */
	set(d0, KVR_STAT_DK_READS_DAMAGED, 1);
	set(d0, KVR_STAT_DK_READS_IO_ERROR, 2);

	struct kvr_actor_stats *d1 = disk(2, "disk.1", 1, KVR_ACTOR_BACKOFF);
	set(d1, KVR_STAT_DK_CAPACITY_BYTES, 1ull << 30);
	set(d1, KVR_STAT_DK_BYTES, 1000);
	set(d1, KVR_STAT_DK_FILES, 1);
	set(d1, KVR_STAT_DK_WRITES_REFUSED, 4);
	set(d1, KVR_STAT_DK_LEFT_IN_PLACE, 2);
	set(d1, KVR_STAT_DK_BAD_KEPT, 1);

	(void)disk(3, "disk.5", 5, KVR_ACTOR_IDLE);

	struct kvr_actor_ent *rm = kvr_ctl_actor(wctl, 4);
	snprintf(rm->name, sizeof(rm->name), "remote");
	rm->kind = KVR_ACTOR_REMOTE;
	atomic_store(&rm->state, KVR_ACTOR_READY);
	for (size_t i = 0; i < sizeof(remote_stats) / sizeof(remote_stats[0]); i++)
		set(kvr_ctl_stats(wctl, 4), remote_stats[i].stat, remote_stats[i].v);
	struct kvr_actor_stats *lks = kvr_ctl_stats(wctl, 0);
	set(lks, KVR_STAT_LK_RM_READS, 1021);
	set(lks, KVR_STAT_LK_RM_READ_FAILS, 1022);
	set(lks, KVR_STAT_LK_RM_WRITES, 1023);
	set(lks, KVR_STAT_LK_RM_WRITES_SKIPPED, 1024);
	atomic_store(&wctl->n_actors, 5);
	cr_assert_eq(kvr_segment_map(seg.fd, KVR_SEG_CTL, 0, &ro), 0); /* the observer's: PROT_READ */
}

static void teardown(void)
{
	kvr_segment_close(&ro);
	kvr_segment_close(&seg);
}

TestSuite(inspect_l2, .init = setup, .fini = teardown, .timeout = 20);

static char *render(unsigned flags)
{
	struct kvr_ctl *c;
	cr_assert_eq(kvr_ctl_attach(&ro, &c, NULL), 0);
	struct kvr_insp_clock now = {.mono_ns = 500 * S_NS, .real_ns = 1800000000ull * S_NS};
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_eq(kvr_insp_render(f, c, &now, 0, flags), 0);
	fclose(f);
	return buf;
}

Test(inspect_l2, text_section_exact)
{
	char *t = render(0);
	const char *want =
		"l2\n"
		"  disk.0  /var/lib/kvring/l2-a\n"
		"    used 240.0 KiB of 1.0 GiB (0%)  files 12  evicted 3\n"
		"    adopted 12, not adopted: foreign 1, tmp 2, not_regular 3, short 4, size 5,\n"
		"      magic 6, version 7, header_checksum 8, namespace 9, key 10, lane 11,\n"
		"      block_tokens 12, lane_bytes 13, fingerprint 14, vanished 16, io_error 17,\n"
		"      over_cap 18, reserved 19, mode 20\n"
		"    reads failed: damaged 1, vanished 0, io_error 2\n"
		"  disk.1  ...xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx/l2-b\n"
		"    used 1000 B of 1.0 GiB (0%)  files 1  evicted 0\n"
		"    adopted 0\n"
		"    read-only: 4 writes refused, kept 2 at adoption, 1 after reads\n"
		"  disk.5  (l2.dirs[5]: not in the config)\n"
		"    used 0 B of 0 B (0%)  files 0  evicted 0\n"
		"    adopted 0\n"
		"\n";
	const char *at = strstr(t, "\nl2\n");
	cr_assert_not_null(at, "no l2 section:\n%s", t);
	cr_assert(!strncmp(at + 1, want, strlen(want)), "l2 section:\n%s\nwant:\n%s", at + 1, want);
	/* the section comes after the workers and before the rings */
	cr_assert_lt(strstr(t, "workers"), at);
	cr_assert_gt(strstr(t, "\nrings"), at);
	for (const char *l = t; *l;) {
		const char *e = strchr(l, '\n');
		cr_assert_not_null(e);
		cr_assert_leq(e - l, KVR_INSP_COLUMNS, "line over %d columns: %.*s", KVR_INSP_COLUMNS, (int)(e - l), l);
		l = e + 1;
	}
	free(t);
}

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	cr_assert(cJSON_IsNumber(v), "key %s", key);
	return v->valuedouble;
}

static const char *str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	cr_assert(cJSON_IsString(v), "key %s", key);
	return v->valuestring;
}

Test(inspect_l2, json_keys_exact)
{
	char *t = render(KVR_INSP_JSON);
	cJSON *doc = cJSON_Parse(t);
	cr_assert_not_null(doc, "not JSON:\n%s", t);
	cr_assert_eq(num(doc, "schema"), 1);
	const cJSON *l2 = cJSON_GetObjectItemCaseSensitive(doc, "l2");
	cr_assert(cJSON_IsArray(l2));
	cr_assert_eq(cJSON_GetArraySize(l2), 3);

	const cJSON *d0 = cJSON_GetArrayItem(l2, 0);
	cr_assert_str_eq(str(d0, "actor"), "disk.0");
	cr_assert_eq(num(d0, "actor_index"), 1);
	cr_assert_str_eq(str(d0, "state"), "ready");
	cr_assert_eq(num(d0, "dir_index"), 0);
	cr_assert_str_eq(str(d0, "dir"), "/var/lib/kvring/l2-a");
	cr_assert_eq(num(d0, "used_bytes"), 12 * FB);
	cr_assert_eq(num(d0, "files"), 12);
	cr_assert_eq(num(d0, "capacity_bytes"), 1073741824.0);
	cr_assert_eq(num(d0, "evicted_files"), 3);
	const cJSON *ad = cJSON_GetObjectItemCaseSensitive(d0, "adoption");
	cr_assert_eq(num(ad, "adopted"), 12);
	for (unsigned r = 1; r < KVR_STAT_DK_REASON_MAX; r++) {
		const char *n = kvr_stat_dk_reason_name(r);
		if (!strcmp(n, "payload_checksum"))
			cr_assert_null(cJSON_GetObjectItemCaseSensitive(ad, n), "adoption never reads payloads");
		else
			cr_assert_eq(num(ad, n), r, "adoption.%s", n);
	}
	cr_assert_eq(cJSON_GetArraySize(ad), 1 + KVR_STAT_DK_REASON_MAX - 2);
	const cJSON *rf = cJSON_GetObjectItemCaseSensitive(d0, "read_failures");
	cr_assert_eq(num(rf, "damaged"), 1);
	cr_assert_eq(num(rf, "vanished"), 0);
	cr_assert_eq(num(rf, "io_error"), 2);
	cr_assert_eq(num(d0, "read_only_refused_writes"), 0);

	const cJSON *d1 = cJSON_GetArrayItem(l2, 1);
	cr_assert_str_eq(str(d1, "actor"), "disk.1");
	cr_assert_str_eq(str(d1, "state"), "backoff");
	cr_assert_str_eq(str(d1, "dir"), LONG_DIR, "the whole path in JSON");
	cr_assert_eq(num(d1, "used_bytes"), 1000);
	cr_assert_eq(num(d1, "read_only_refused_writes"), 4);
	const cJSON *kept = cJSON_GetObjectItemCaseSensitive(d1, "read_only_kept_files");
	cr_assert_eq(num(kept, "adoption"), 2);
	cr_assert_eq(num(kept, "read"), 1);

	const cJSON *d5 = cJSON_GetArrayItem(l2, 2);
	cr_assert_str_eq(str(d5, "actor"), "disk.5");
	cr_assert_eq(num(d5, "dir_index"), 5);
	cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(d5, "dir")), "no such l2.dirs entry: null");
	cr_assert_eq(num(d5, "capacity_bytes"), 0);
	cJSON_Delete(doc);
	free(t);
}

static const char remote_text[] =
	"remote\n"
	"  remote  ready  nodes 2/3 up  slots 10923/16384  inflight 7\n"
	"    bytes in 100.0 KiB, out 3.0 GiB\n"
	"    reads 1001: hits 1002, misses 1003, bad 1004, errors 1005\n"
	"    writes 1006: errors 1007, stale 1008\n"
	"    cluster: moved 1011, ask 1012, timeouts 1013, conn errors 1014,\n"
	"      reply errors 1015, refreshes 1016\n"
	"    lookup: promoted 1021, not promoted 1022, writes sent 1023, skipped 1024\n"
	"\n";

/* Every line of text within KVR_INSP_COLUMNS. */
static void fits(const char *t)
{
	for (const char *l = t; *l;) {
		const char *e = strchr(l, '\n');
		cr_assert_not_null(e);
		cr_assert_leq(e - l, KVR_INSP_COLUMNS, "line over %d columns: %.*s", KVR_INSP_COLUMNS, (int)(e - l), l);
		l = e + 1;
	}
}

Test(inspect_l2, remote_text_section_exact)
{
	char *t = render(0);
	const char *at = strstr(t, "\nremote\n");
	cr_assert_not_null(at, "no remote section:\n%s", t);
	cr_assert(!strncmp(at + 1, remote_text, strlen(remote_text)), "remote section:\n%s\nwant:\n%s", at + 1,
		  remote_text);
	/* after the l2 section, before the rings; a cluster not whole is in "attention" */
	cr_assert_lt(strstr(t, "\nl2\n"), at);
	cr_assert_gt(strstr(t, "\nrings"), at);
	const char *att = strstr(t, "\nattention\n");
	cr_assert_not_null(att, "text:\n%s", t);
	const char *line = strstr(t, "\n  remote: 2 of 3 nodes up, 10923 of 16384 hash slots covered\n");
	cr_assert(line && line > att && line < at, "attention:\n%s", t);
	fits(t);
	free(t);

	/* a whole cluster needs no attention; an actor that is not ready is not judged by its
	 * last gauges (a failed one is listed as an actor) */
	set(kvr_ctl_stats(wctl, 4), KVR_STAT_RM_NODES_UP, 3);
	set(kvr_ctl_stats(wctl, 4), KVR_STAT_RM_SLOTS_COVERED, 16384);
	t = render(0);
	cr_assert_null(strstr(t, "  remote: "), "text:\n%s", t);
	cr_assert_not_null(strstr(t, "\n  remote  ready  nodes 3/3 up  slots 16384/16384  inflight 7\n"));
	free(t);
	set(kvr_ctl_stats(wctl, 4), KVR_STAT_RM_NODES_UP, 0);
	atomic_store(&kvr_ctl_actor(wctl, 4)->state, KVR_ACTOR_BACKOFF);
	t = render(0);
	cr_assert_null(strstr(t, "  remote: "), "text:\n%s", t);
	cr_assert_not_null(strstr(t, "\n  actor remote: backoff, 0 restarts, last exit -\n"), "text:\n%s", t);
	cr_assert_not_null(strstr(t, "\n  remote  backoff  nodes 0/3 up  slots 16384/16384  inflight 7\n"));
	free(t);
}

/* --watch frames (text with a previous snapshot) carry the same section. */
Test(inspect_l2, remote_in_watch_frames)
{
	struct kvr_ctl *c;
	cr_assert_eq(kvr_ctl_attach(&ro, &c, NULL), 0);
	struct kvr_insp_clock t0 = {.mono_ns = 500 * S_NS, .real_ns = 1800000000ull * S_NS};
	struct kvr_insp_clock t1 = {.mono_ns = 501 * S_NS, .real_ns = 1800000001ull * S_NS};
	struct kvr_insp_snap *prev, *cur;
	cr_assert_eq(kvr_insp_snapshot(c, &t0, 0, &prev), 0);
	cr_assert_eq(kvr_insp_snapshot(c, &t1, 0, &cur), 0);
	cr_assert(cur->has_remote);
	cr_assert_eq(cur->remote.actor, 4);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_eq(kvr_insp_render_text(f, cur, prev), 0);
	fclose(f);
	const char *at = strstr(buf, "\nremote\n");
	cr_assert(at && !strncmp(at + 1, remote_text, strlen(remote_text)), "frame:\n%s", buf);
	free(buf);
	kvr_insp_snap_free(prev);
	kvr_insp_snap_free(cur);
}

Test(inspect_l2, remote_json_fields_exact)
{
	char *t = render(KVR_INSP_JSON);
	cJSON *doc = cJSON_Parse(t);
	cr_assert_not_null(doc, "not JSON:\n%s", t);
	const cJSON *r = cJSON_GetObjectItemCaseSensitive(doc, "remote");
	cr_assert(cJSON_IsObject(r), "remote:\n%s", t);
	cr_assert_str_eq(str(r, "actor"), "remote");
	cr_assert_eq(num(r, "actor_index"), 4);
	cr_assert_str_eq(str(r, "state"), "ready");
	static const struct {
		const char *key;
		double want;
	} f[] = {
		{"nodes", 3},           {"nodes_up", 2},           {"slots_covered", 10923},
		{"inflight", 7},        {"reads", 1001},           {"hits", 1002},
		{"misses", 1003},       {"bad_values", 1004},      {"read_errors", 1005},
		{"writes", 1006},       {"write_errors", 1007},    {"stale_writes", 1008},
		{"bytes_in", 5 * FB},   {"bytes_out", 3221225472.0}, {"moved_redirects", 1011},
		{"ask_redirects", 1012}, {"timeouts", 1013},       {"connection_errors", 1014},
		{"reply_errors", 1015}, {"slot_map_refreshes", 1016},
	};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		cr_assert_eq(num(r, f[i].key), f[i].want, "remote.%s", f[i].key);
	const cJSON *lk = cJSON_GetObjectItemCaseSensitive(r, "lookup");
	cr_assert(cJSON_IsObject(lk));
	cr_assert_eq(num(lk, "promoted"), 1021);
	cr_assert_eq(num(lk, "promotion_failures"), 1022);
	cr_assert_eq(num(lk, "writes_sent"), 1023);
	cr_assert_eq(num(lk, "writes_skipped"), 1024);
	cr_assert_eq(cJSON_GetArraySize(lk), 4);
	/* exactly these fields: actor, actor_index, state, the table, lookup */
	cr_assert_eq(cJSON_GetArraySize(r), 3 + (int)(sizeof(f) / sizeof(f[0])) + 1);
	/* the 64-bit integers are written exactly */
	cr_assert_not_null(strstr(t, "\"bytes_out\": 3221225472,"), "json:\n%s", t);
	cJSON_Delete(doc);
	free(t);
}

/* Without a remote actor: no text section, "remote": null. */
Test(inspect_l2, none_without_remote_actor)
{
	atomic_store(&kvr_ctl_actor(wctl, 4)->state, KVR_ACTOR_UNUSED);
	char *t = render(0);
	cr_assert_null(strstr(t, "\nremote\n"), "text:\n%s", t);
	cr_assert_null(strstr(t, "\n  remote"), "text:\n%s", t);
	free(t);
	t = render(KVR_INSP_JSON);
	cJSON *doc = cJSON_Parse(t);
	cr_assert_not_null(doc);
	const cJSON *r = cJSON_GetObjectItemCaseSensitive(doc, "remote");
	cr_assert(r && cJSON_IsNull(r), "json:\n%s", t);
	cJSON_Delete(doc);
	free(t);
}

/* Without disk actors: no text section, an empty JSON array. */
Test(inspect_l2, none_without_disk_actors)
{
	for (unsigned i = 1; i < 4; i++)
		atomic_store(&kvr_ctl_actor(wctl, i)->state, KVR_ACTOR_UNUSED);
	char *t = render(0);
	cr_assert_null(strstr(t, "\nl2\n"), "text:\n%s", t);
	free(t);
	t = render(KVR_INSP_JSON);
	cJSON *doc = cJSON_Parse(t);
	const cJSON *l2 = cJSON_GetObjectItemCaseSensitive(doc, "l2");
	cr_assert(cJSON_IsArray(l2) && cJSON_GetArraySize(l2) == 0);
	cJSON_Delete(doc);
	free(t);
}
