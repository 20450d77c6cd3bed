/* kvring-inspect's L2 view: the disk actors' stats and directories rendered exactly, as text and JSON. */
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

/*
 * Actors: 0 lookup; 1 disk.0 (l2.dirs[0]) with every adoption reason counted, evictions and
 * failed reads; 2 disk.1 (the long dir) with read-only counters; 3 disk.5, whose dir the
 * config does not name.
 */
static void setup(void)
{
	size_t sz = kvr_ctl_memsize(4, 1, specs, 1, sizeof(CONFIG));
	char name[64];
	snprintf(name, sizeof(name), "kvr-test-inspect-l2-%d", getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_CTL, sz, 1, 0, &seg), 0);
	cr_assert_eq(kvr_ctl_init(&seg, 4, 1, specs, 1, CONFIG), 0);
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
	atomic_store(&wctl->n_actors, 4);
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
	cr_assert_eq(kvr_ctl_attach(&ro, &c), 0);
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
