/* kvringd's /status and /: the live instance after a known workload against /metrics and kvring-inspect --json; escaping; HTTP answers. */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../inspect/tool_test.h"
#include "metrics_test.h"
#include "status.h"

/* An engine id of every kind of byte the id rules allow ([A-Za-z0-9._:-]), and a model
 * namespace (any printable ASCII) that is markup: the page must show it, never run it. */
#define ENGINE_ID "vllm-A.1:x_y"
#define HOSTILE_NS "<script>alert(\"x&y\")</script>'<b>"
#define HOSTILE_NS_HTML "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;&#39;&lt;b&gt;"

M_FIXTURE(status, 60); /* inst and worker: a fresh instance directory, no worker yet */

/* ---- helpers ----------------------------------------------------------------------------- */

static const cJSON *jget(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	cr_assert_not_null(v, "JSON key %s missing", key);
	return v;
}

static double jnum(const cJSON *o, const char *key)
{
	const cJSON *v = jget(o, key);
	cr_assert(cJSON_IsNumber(v), "JSON key %s is not a number", key);
	return v->valuedouble;
}

static const char *jstr(const cJSON *o, const char *key)
{
	const cJSON *v = jget(o, key);
	cr_assert(cJSON_IsString(v), "JSON key %s is not a string", key);
	return v->valuestring;
}

/* The element of array a whose string key equals want (NULL when none). */
static const cJSON *find_by(const cJSON *a, const char *key, const char *want)
{
	const cJSON *e;
	cJSON_ArrayForEach(e, a) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
		if (cJSON_IsString(v) && !strcmp(v->valuestring, want))
			return e;
	}
	return NULL;
}

static cJSON *get_status(uint16_t port)
{
	struct m_http r;
	cr_assert_eq(m_http(port, "GET", "/status", &r), 0);
	cr_assert_eq(r.status, 200, "GET /status: %d\n%s", r.status, r.body);
	cr_assert(strstr(r.head, "Content-Type: application/json"), "headers:\n%s", r.head);
	cJSON *doc = cJSON_Parse(r.body);
	cr_assert_not_null(doc, "/status is not JSON:\n%s", r.body);
	m_http_free(&r);
	cr_assert_eq(jnum(doc, "schema"), SUP_STATUS_SCHEMA);
	return doc;
}

/* kvring-inspect --json of the live instance. */
static cJSON *inspect_json(void)
{
	char out[160], err[160];
	snprintf(out, sizeof(out), "%s/inspect.out", inst.dir);
	snprintf(err, sizeof(err), "%s/inspect.err", inst.dir);
	const char *args[] = {"--socket", inst.sock, "--json", NULL};
	int st = h_wait_exit(tool_spawn("tools/inspect/kvring-inspect", args, out, err), 5000);
	char *e = tool_slurp(err), *o = tool_slurp(out);
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvring-inspect: status %#x: %s", st, e);
	cJSON *doc = cJSON_Parse(o);
	cr_assert_not_null(doc, "kvring-inspect --json is not JSON:\n%s", o);
	free(e);
	free(o);
	return doc;
}

static double metric(const char *scrape, const char *fmt, const char *label)
{
	char series[256];
	snprintf(series, sizeof(series), fmt, label);
	return m_get(scrape, series);
}

/* Lines of the exposition that start with prefix (the series of one family). */
static unsigned count_series(const char *scrape, const char *prefix)
{
	unsigned n = 0;
	size_t len = strlen(prefix);
	for (const char *p = scrape; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		n += !strncmp(p, prefix, len);
	return n;
}

/* ---- /status against /metrics and kvring-inspect ----------------------------------------- */

static void check_slots(const cJSON *st, const char *scrape, const cJSON *insp)
{
	static const char *const states[] = {"free", "writing", "committed", "reading", "evicting", "draining"};
	const cJSON *sl = jget(st, "l1_slots"), *isl = jget(insp, "l1_slots");
	double sum = 0;
	for (unsigned i = 0; i < 6; i++) {
		cr_assert_eq(jnum(sl, states[i]), metric(scrape, "kvring_l1_slots{state=\"%s\"}", states[i]),
			     "slots %s", states[i]);
		sum += jnum(sl, states[i]);
	}
	cr_assert_eq(sum, M_SLOTS, "the states add up to the slots");
	cr_assert_eq(jnum(sl, "slots"), M_SLOTS);
	cr_assert_eq(jnum(sl, "slots"), jnum(isl, "slots"));
	/* kvring-inspect counts reading slots within committed; /status, as /metrics, apart */
	cr_assert_eq(jnum(sl, "committed") + jnum(sl, "reading"), jnum(isl, "committed"));
	cr_assert_eq(jnum(sl, "reading"), jnum(isl, "reading"));
	cr_assert_eq(jnum(sl, "free"), jnum(isl, "free"));
	cr_assert_eq(jnum(sl, "writing"), jnum(isl, "writing"));
	cr_assert_eq(jnum(sl, "evicting"), jnum(isl, "evicting"));
	cr_assert_eq(jnum(sl, "draining"), jnum(isl, "draining"));
	cr_assert_eq(jnum(sl, "committed"), 12, "the workload's 12 stored blocks");
	cr_assert_eq(jnum(sl, "block_tokens"), M_BLOCK_TOKENS);
}

static void check_actors(const cJSON *st, const char *scrape, const cJSON *insp)
{
	const cJSON *a = jget(st, "actors"), *e;
	cr_assert_eq((unsigned)cJSON_GetArraySize(a), count_series(scrape, "kvring_actor_up{"),
		     "every actor /metrics names");
	cr_assert_eq(cJSON_GetArraySize(a), cJSON_GetArraySize(jget(insp, "actors")));
	cJSON_ArrayForEach(e, a) {
		const char *name = jstr(e, "name");
		const struct kvr_actor_ent *ent = h_actor(&inst, name);
		cr_assert_not_null(ent, "actor %s is not in the actor table", name);
		cr_assert_eq(jnum(e, "pid"), atomic_load(&ent->pid), "%s: pid", name);
		cr_assert_eq(jnum(e, "index"), h_actor_index(inst.ctl, name), "%s: index", name);
		cr_assert_str_eq(jstr(e, "state"), kvr_actor_state_name(atomic_load(&ent->state)), "%s: state", name);
		cr_assert_eq(jnum(e, "restarts"), metric(scrape, "kvring_actor_restarts_total{actor=\"%s\"}", name));
		cr_assert_eq(jnum(e, "last_exit_code"), metric(scrape, "kvring_actor_last_exit_code{actor=\"%s\"}", name));
		cr_assert_eq(jnum(e, "last_exit_signal"),
			     metric(scrape, "kvring_actor_last_exit_signal{actor=\"%s\"}", name));
		cr_assert_eq(cJSON_IsTrue(jget(e, "up")), metric(scrape, "kvring_actor_up{actor=\"%s\"}", name) == 1);
		const cJSON *ie = find_by(jget(insp, "actors"), "name", name);
		cr_assert_not_null(ie, "kvring-inspect lacks actor %s", name);
		cr_assert_eq(jnum(e, "pid"), jnum(ie, "pid"), "%s: pid", name);
		cr_assert_str_eq(jstr(e, "kind"), jstr(ie, "kind"));
	}
	const cJSON *lk = find_by(a, "name", "lookup"), *ld = find_by(a, "name", "loader.0");
	cr_assert(lk && ld && jnum(lk, "pid") > 0 && jnum(ld, "pid") > 0, "lookup and loader.0 run");
}

static void check_rings(const cJSON *st, const char *scrape, const cJSON *insp)
{
	const cJSON *a = jget(st, "rings"), *r;
	cr_assert_eq((unsigned)cJSON_GetArraySize(a), count_series(scrape, "kvring_ring_fill_ratio{"));
	cr_assert_eq(cJSON_GetArraySize(a), cJSON_GetArraySize(jget(insp, "rings")));
	cJSON_ArrayForEach(r, a) {
		const char *name = jstr(r, "name");
		if (!strncmp(name, "ctl.", 4))
			continue; /* health pings flow through the control rings between the reads */
		cr_assert_eq(jnum(r, "fill_ratio"), metric(scrape, "kvring_ring_fill_ratio{ring=\"%s\"}", name), "%s", name);
		cr_assert_eq(jnum(r, "rejected"), metric(scrape, "kvring_ring_rejected_messages_total{ring=\"%s\"}", name));
		const cJSON *ir = cJSON_GetArrayItem(jget(insp, "rings"), (int)jnum(r, "index"));
		cr_assert_str_eq(jstr(ir, "name"), name);
		cr_assert_eq(jnum(r, "capacity"), jnum(ir, "capacity"), "%s", name);
		cr_assert_eq(jnum(r, "enqueued"), jnum(ir, "enqueued"), "%s", name);
		cr_assert_str_eq(jstr(jget(r, "producer"), "name"), jstr(jget(ir, "producer"), "name"), "%s", name);
		cr_assert_str_eq(jstr(jget(r, "consumer"), "name"), jstr(jget(ir, "consumer"), "name"), "%s", name);
		cr_assert_eq(jnum(jget(r, "consumer"), "pid"), jnum(jget(ir, "consumer"), "pid"), "%s", name);
	}
	const cJSON *req = find_by(a, "name", "store.req.0");
	cr_assert_not_null(req);
	cr_assert_eq(jnum(jget(req, "producer"), "pid"), getpid(), "the worker produces store.req.0");
	cr_assert_eq(jnum(req, "fill"), 0);
}

static void check_hits(const cJSON *st, const char *scrape)
{
	const cJSON *h = jget(st, "hit_rate"), *x = jget(st, "transfer");
	cr_assert_eq(jnum(h, "lookups"), m_get(scrape, "kvring_lookup_requests_total"));
	cr_assert_eq(jnum(h, "requested_blocks"), m_get(scrape, "kvring_lookup_requested_blocks_total"));
	cr_assert_eq(jnum(h, "matched_blocks"), m_get(scrape, "kvring_lookup_matched_blocks_total"));
	cr_assert_eq(jnum(h, "requested_tokens"), m_get(scrape, "kvring_requested_tokens_total"));
	cr_assert_eq(jnum(h, "matched_tokens"), m_get(scrape, "kvring_matched_tokens_total"));
	cr_assert_eq(jnum(h, "l1_hits"), m_get(scrape, "kvring_l1_hits_total"));
	cr_assert_eq(jnum(h, "l1_misses"), m_get(scrape, "kvring_l1_misses_total"));
	/* the workload's: 3 lookups, 12 blocks asked for, 8 found */
	cr_assert_eq(jnum(h, "lookups"), 3);
	cr_assert_eq(jnum(h, "requested_blocks"), 12);
	cr_assert_eq(jnum(h, "matched_blocks"), 8);
	cr_assert_eq(jnum(h, "matched_tokens"), 8 * M_BLOCK_TOKENS);
	cr_assert_float_eq(jnum(h, "ratio"), 8.0 / 12.0, 1e-12);
	cr_assert_eq(jnum(x, "stored_blocks"), m_get(scrape, "kvring_store_blocks_total{result=\"stored\"}"));
	cr_assert_eq(jnum(x, "present_blocks"), m_get(scrape, "kvring_store_blocks_total{result=\"present\"}"));
	cr_assert_eq(jnum(x, "loaded_blocks"), m_get(scrape, "kvring_load_blocks_total{result=\"loaded\"}"));
	cr_assert_eq(jnum(x, "stored_bytes"), m_get(scrape, "kvring_bytes_total{direction=\"store\",tier=\"l1\"}"));
	cr_assert_eq(jnum(x, "stored_blocks"), 12);
	cr_assert_eq(jnum(x, "present_blocks"), 4);
	cr_assert_eq(jnum(x, "loaded_blocks"), 8);
}

static void check_instance(const cJSON *st, const char *scrape, const cJSON *insp)
{
	const cJSON *in = jget(st, "instance"), *iin = jget(insp, "instance");
	cr_assert_str_eq(jstr(in, "state"), "running");
	cr_assert_eq(m_get(scrape, "kvring_instance_state{state=\"running\"}"), 1);
	cr_assert_eq(jnum(in, "supervisor_pid"), inst.pid);
	cr_assert_str_eq(jstr(in, "socket"), inst.sock);
	cr_assert_str_eq(jstr(in, "socket"), jstr(iin, "socket"));
	cr_assert_eq(jnum(in, "generation"), jnum(iin, "generation"));
	cr_assert_eq(jnum(in, "started_real_ns"), jnum(iin, "started_real_ns"));
	cr_assert(jnum(in, "uptime_s") > 0 && jnum(in, "uptime_s") < 600);
	cr_assert_eq(jnum(in, "workers_attached"), m_get(scrape, "kvring_workers_attached"));
	cr_assert_eq(jnum(in, "workers_attached"), 1);
	cr_assert_eq(jnum(in, "max_workers"), jnum(iin, "max_workers"));
	cr_assert_eq(jnum(jget(in, "arena"), "bytes"), jnum(jget(insp, "arena"), "bytes"));
	const cJSON *m = jget(jget(st, "config"), "model");
	cr_assert_eq(jnum(m, "layers"), M_LAYERS);
	cr_assert_eq(jnum(m, "kv_heads"), M_HEADS);
	cr_assert_eq(jnum(m, "head_dim"), M_HEAD_DIM);
	cr_assert_eq(jnum(m, "block_tokens"), M_BLOCK_TOKENS);
	cr_assert(cJSON_IsNull(jget(st, "l2")), "no l2.dirs: l2 is null");
	cr_assert(cJSON_IsNull(jget(st, "remote")), "no remote.cluster: remote is null");
}

static void check_engines(const cJSON *st, const cJSON *insp)
{
	const cJSON *a = jget(st, "engines"), *ia = jget(insp, "engines");
	cr_assert_eq(cJSON_GetArraySize(a), 1);
	cr_assert_eq(cJSON_GetArraySize(ia), 1);
	const cJSON *e = cJSON_GetArrayItem(a, 0), *ie = cJSON_GetArrayItem(ia, 0);
	cr_assert_str_eq(jstr(e, "id"), ENGINE_ID);
	cr_assert_str_eq(jstr(e, "model_ns"), HOSTILE_NS);
	cr_assert_str_eq(jstr(e, "id"), jstr(ie, "id"));
	cr_assert_str_eq(jstr(e, "model_ns"), jstr(ie, "model_ns"));
	cr_assert_eq(jnum(e, "index"), jnum(ie, "index"));
	cr_assert_eq(jnum(e, "workers"), 1);
	cr_assert_eq(jnum(e, "workers"), jnum(ie, "workers"));
	cr_assert_eq(jnum(e, "schedulers"), 0);
	cr_assert(cJSON_IsFalse(jget(e, "model_ns_is_model_id")));
	/* the worker's engine index, as the segment and inspect name it */
	cr_assert_eq(jnum(cJSON_GetArrayItem(jget(insp, "workers"), 0), "engine"), jnum(e, "index"));
}

Test(status, matches_metrics_and_inspect_after_workload)
{
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	m_worker_attach_engine(&worker, inst.sock, ENGINE_ID, HOSTILE_NS);
	m_workload(&worker);

	/* the instance is quiet after the workload: the three reads see one state */
	cJSON *st = get_status(port);
	char *scrape = m_scrape(port);
	cJSON *insp = inspect_json();
	check_instance(st, scrape, insp);
	check_slots(st, scrape, insp);
	check_actors(st, scrape, insp);
	check_rings(st, scrape, insp);
	check_hits(st, scrape);
	check_engines(st, insp);
	cJSON_Delete(insp);
	free(scrape);
	cJSON_Delete(st);

	/* the engine leaves with its last client: /status follows kvringd's table */
	m_worker_close(&worker);
	cJSON *after = NULL;
	bool gone = H_WAIT((cJSON_Delete(after), after = get_status(port),
			    cJSON_GetArraySize(jget(after, "engines")) == 0 &&
				    jnum(jget(after, "instance"), "workers_attached") == 0),
			   5000);
	cr_assert(gone, "the engine is still listed after its worker detached");
	cJSON_Delete(after);
}

/* ---- the page --------------------------------------------------------------------------- */

Test(status, page_escapes_client_strings)
{
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	m_worker_attach_engine(&worker, inst.sock, ENGINE_ID, HOSTILE_NS);
	m_workload(&worker);
	struct m_http r;
	cr_assert_eq(m_http(port, "GET", "/", &r), 0);
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.head, "Content-Type: text/html; charset=utf-8"), "headers:\n%s", r.head);
	cr_assert(strstr(r.body, "<td class=\"engine-ns\">" HOSTILE_NS_HTML "</td>"), "the namespace, escaped:\n%s",
		  r.body);
	cr_assert(strstr(r.body, "<td class=\"engine-id\">" ENGINE_ID "</td>"));
	char want[256];
	snprintf(want, sizeof(want), "<code id=\"socket\">%s</code>", inst.sock);
	cr_assert(strstr(r.body, want), "the socket path");
	cr_assert(strstr(r.body, "<td class=\"n\" id=\"slots-committed\">12</td>"));
	/* no script at all: not the hostile one, and none of our own */
	for (char *p = r.body; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	cr_assert_null(strstr(r.body, "<script"), "a script element in the page");
	cr_assert_null(strstr(r.body, "<b>"), "the namespace's markup reached the page");
	cr_assert_null(strstr(r.body, "http://"), "no external resource");
	cr_assert_null(strstr(r.body, "https://"), "no external resource");
	m_http_free(&r);
}

Test(status, html_escape)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	sup_html_escape(f, "a<b>&\"c'd\t\xc3\xa9");
	sup_html_escape(f, NULL);
	sup_html_escape(f, "");
	fclose(f);
	cr_assert_str_eq(buf, "a&lt;b&gt;&amp;&quot;c&#39;d\t\xc3\xa9");
	free(buf);
}

/* A synthetic instance with every section: the L2 and remote tiers, an actor name that
 * needs escaping, slots by state; JSON and page. */
Test(status, synthetic_instance_every_section)
{
	struct m_fake f;
	m_fake_init_config(&f, MF_L2_CONFIG);
	m_fake_add_disk(&f, 0, "disk.0");
	m_fake_add_remote(&f);
	struct sup_metrics_view v = {.ctl = f.ctl, .slots = f.slots};
	f.ctl->started_ns = 1700000000ull * 1000000000ull;
	cJSON *doc = sup_status_collect(&v, f.ctl->started_ns + 90 * 1000000000ull);
	cr_assert_not_null(doc);
	cr_assert(cJSON_IsNull(jget(doc, "engines")), "a view without kvringd's table: engines unknown");
	cr_assert_float_eq(jnum(jget(doc, "instance"), "uptime_s"), 90, 1e-9);
	const cJSON *sl = jget(doc, "l1_slots");
	cr_assert_eq(jnum(sl, "free"), 4);
	cr_assert_eq(jnum(sl, "writing"), 1);
	cr_assert_eq(jnum(sl, "committed"), 2);
	cr_assert_eq(jnum(sl, "reading"), 1);
	const cJSON *h = jget(doc, "hit_rate");
	cr_assert_eq(jnum(h, "requested_blocks"), 10);
	cr_assert_eq(jnum(h, "matched_blocks"), 6);
	cr_assert_eq(jnum(h, "matched_tokens"), 6 * MF_BLOCK_TOKENS);
	cr_assert_not_null(find_by(jget(doc, "actors"), "name", "a\"b\\c"), "the odd actor name, whole");
	const cJSON *d = cJSON_GetArrayItem(jget(jget(doc, "l2"), "dirs"), 0);
	cr_assert_str_eq(jstr(d, "dir"), "/srv/kv\"l2\\a");
	cr_assert_eq(jnum(d, "used_bytes"), 61440);
	cr_assert_eq(jnum(d, "files"), 3);
	cr_assert_eq(jnum(d, "read_failures"), 6);
	const cJSON *rm = jget(doc, "remote");
	cr_assert_eq(jnum(rm, "nodes"), 3);
	cr_assert_eq(jnum(rm, "nodes_up"), 2);
	cr_assert_eq(jnum(rm, "hits"), 102);
	cr_assert_eq(jnum(rm, "lookup_promoted"), 121);
	const cJSON *ring = find_by(jget(doc, "rings"), "name", "lookup.req.0");
	cr_assert_eq(jnum(ring, "fill"), 2);
	cr_assert_eq(jnum(ring, "capacity"), 8);
	cr_assert_eq(jnum(ring, "rejected"), 3);
	cr_assert_float_eq(jnum(ring, "full_wait_s"), 1.5, 1e-9);

	size_t len;
	char *page = sup_status_html(doc, &len);
	cr_assert_not_null(page);
	cr_assert_eq(strlen(page), len);
	cr_assert(strstr(page, "<td class=\"actor-name\">a&quot;b\\c</td>"), "the actor name, escaped");
	cr_assert(strstr(page, "/srv/kv&quot;l2\\a"), "the L2 dir, escaped");
	cr_assert(strstr(page, "<section id=\"remote\">"));
	cr_assert(strstr(page, "<td class=\"n\" id=\"slots-reading\">1</td>"));
	cr_assert(strstr(page, "<p class=\"big\" id=\"hit-ratio\">60.0%</p>"));
	cr_assert(strstr(page, "<p class=\"muted\">unknown</p>"), "engines unknown");
	free(page);
	cJSON_Delete(doc);
	m_fake_fini(&f);
}

/* ---- HTTP ------------------------------------------------------------------------------- */

Test(status, http_paths_and_methods)
{
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	struct m_http r;
	const char *paths[] = {"/", "/status", "/metrics"};
	for (unsigned i = 0; i < 3; i++) {
		cr_assert_eq(m_http(port, "HEAD", paths[i], &r), 0);
		cr_assert_eq(r.status, 200, "HEAD %s: %d", paths[i], r.status);
		cr_assert_eq(r.body_len, 0);
		cr_assert(strstr(r.head, "Cache-Control: no-store"), "headers:\n%s", r.head);
		m_http_free(&r);
		const char *methods[] = {"POST", "PUT", "DELETE", "OPTIONS"};
		for (unsigned k = 0; k < 4; k++) {
			cr_assert_eq(m_http(port, methods[k], paths[i], &r), 0);
			cr_assert_eq(r.status, 405, "%s %s: %d", methods[k], paths[i], r.status);
			cr_assert(strstr(r.head, "Allow: GET, HEAD"), "headers:\n%s", r.head);
			m_http_free(&r);
		}
	}
	const char *not_found[] = {"/status/", "/index.html", "/statusx", "/favicon.ico", "//"};
	for (unsigned i = 0; i < 5; i++) {
		cr_assert_eq(m_http(port, "GET", not_found[i], &r), 0);
		cr_assert_eq(r.status, 404, "GET %s: %d", not_found[i], r.status);
		cr_assert_str_eq(r.body, "not found: kvringd serves /, /status and /metrics\n");
		m_http_free(&r);
	}
	/* a query string does not change the path */
	cr_assert_eq(m_http(port, "GET", "/status?pretty=1", &r), 0);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body[r.body_len - 1], '\n');
	m_http_free(&r);
	cr_assert_eq(m_http(port, "GET", "/?x=1", &r), 0);
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.body, "<!DOCTYPE html>"));
	m_http_free(&r);
}
