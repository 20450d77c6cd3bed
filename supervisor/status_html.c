/* kvringd's status page (GET /): a /status document rendered as one self-contained HTML page. */
#include <stdlib.h>
#include <string.h>

#include "status.h"

/*
 * Server-side rendered: every number is in the markup, so the page reads the same without
 * JavaScript (a headless `--dump-dom`, a text browser, curl). No script, no external
 * resource: inline CSS only. Elements that tests and scripts read have ids (slots-free,
 * socket, ...) named in docs/status-page.md. Strings come from clients (engine ids, model
 * namespaces) and from the segment: every one goes through sup_html_escape().
 */

static const char css[] =
	"body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f4f5f7;color:#1d232b}"
	"header{background:#1d2b3a;color:#fff;padding:14px 24px}"
	"header h1{margin:0 0 4px;font-size:22px}header a{color:#9cd0ff}"
	"header code{background:#2d3e52;padding:1px 5px;border-radius:3px}"
	".st{font-size:14px;padding:2px 8px;border-radius:10px;vertical-align:middle;background:#777}"
	".st-running,.st-ready{background:#2e8540}.st-degraded,.st-backoff{background:#b7791f}"
	".st-failed,.st-stopped{background:#c53030}.st-draining,.st-starting,.st-stopping{background:#2b6cb0}"
	"td .st{color:#fff;font-size:12px}"
	"main{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:14px;padding:14px 24px}"
	"section{background:#fff;border-radius:6px;padding:10px 14px;box-shadow:0 1px 2px #0002}"
	"section.wide{grid-column:1/-1}h2{font-size:16px;margin:2px 0 8px}"
	"table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:2px 8px 2px 0;"
	"border-bottom:1px solid #eceef1;white-space:nowrap}td.n,th.n{text-align:right}"
	"td.engine-ns,td.engine-id{white-space:normal;word-break:break-all}"
	".big{font-size:34px;font-weight:600;margin:0}.muted{color:#6b7380}"
	".bar{display:flex;height:22px;border-radius:4px;overflow:hidden;background:#e2e5ea;margin:4px 0 8px}"
	".bar span{display:block;height:100%}.fill{display:inline-block;width:90px;height:9px;background:#e2e5ea;"
	"border-radius:4px;overflow:hidden;vertical-align:middle}.fill span{display:block;height:100%;background:#3182ce}"
	".s-free{background:#c8d3df}.s-writing{background:#d69e2e}.s-committed{background:#38a169}"
	".s-reading{background:#3182ce}.s-evicting{background:#e53e3e}.s-draining{background:#805ad5}"
	".key{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}";

void sup_html_escape(FILE *f, const char *s)
{
	for (; s && *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		case '\'': fputs("&#39;", f); break;
		default: fputc(*s, f);
		}
	}
}

/* ---- reading the document ------------------------------------------------------------ */

static const cJSON *get(const cJSON *o, const char *key)
{
	return cJSON_GetObjectItemCaseSensitive(o, key);
}

static double num(const cJSON *o, const char *key)
{
	const cJSON *it = get(o, key);
	if (cJSON_IsRaw(it))
		return strtod(it->valuestring, NULL);
	return cJSON_IsNumber(it) ? it->valuedouble : 0;
}

static const char *text(const cJSON *o, const char *key)
{
	const cJSON *it = get(o, key);
	return cJSON_IsString(it) ? it->valuestring : "";
}

/* A number of the document as it is in /status: integers whole, "-" when absent or null. */
static void put_num(FILE *f, const cJSON *o, const char *key)
{
	const cJSON *it = get(o, key);
	if (cJSON_IsRaw(it))
		sup_html_escape(f, it->valuestring);
	else if (cJSON_IsNumber(it) && it->valuedouble > -9e15 && it->valuedouble < 9e15 &&
		 it->valuedouble == (double)(long long)it->valuedouble)
		fprintf(f, "%lld", (long long)it->valuedouble); /* an integer: whole, as /status has it */
	else if (cJSON_IsNumber(it))
		fprintf(f, "%g", it->valuedouble);
	else
		fputc('-', f);
}

static void put_str(FILE *f, const cJSON *o, const char *key)
{
	sup_html_escape(f, text(o, key));
}

static void put_bytes(FILE *f, double b)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	unsigned u = 0;
	while (b >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		b /= 1024;
		u++;
	}
	fprintf(f, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
}

static void put_duration(FILE *f, double s)
{
	unsigned long long t = (unsigned long long)s;
	if (t >= 86400)
		fprintf(f, "%llud%02lluh", t / 86400, t % 86400 / 3600);
	else if (t >= 3600)
		fprintf(f, "%lluh%02llum", t / 3600, t % 3600 / 60);
	else if (t >= 60)
		fprintf(f, "%llum%02llus", t / 60, t % 60);
	else
		fprintf(f, "%.1fs", s);
}

/* A state badge: class st-<state> (only [a-z?] reach the class: the names are ours). */
static void badge(FILE *f, const char *state, const char *id)
{
	fputs("<span class=\"st st-", f);
	sup_html_escape(f, state);
	fputc('"', f);
	if (id)
		fprintf(f, " id=\"%s\"", id);
	fputc('>', f);
	sup_html_escape(f, state);
	fputs("</span>", f);
}

/* ---- sections ------------------------------------------------------------------------ */

static void render_header(FILE *f, const cJSON *doc)
{
	const cJSON *in = get(doc, "instance");
	fputs("<header><h1>kvring ", f);
	badge(f, text(in, "state"), "instance-state");
	fputs("</h1>\n<p>socket <code id=\"socket\">", f);
	put_str(f, in, "socket");
	fputs("</code> &middot; kvringd pid <span id=\"supervisor-pid\">", f);
	put_num(f, in, "supervisor_pid");
	fputs("</span> &middot; generation ", f);
	put_num(f, in, "generation");
	fputs(" &middot; up ", f);
	if (cJSON_IsNumber(get(in, "uptime_s")))
		put_duration(f, num(in, "uptime_s"));
	else
		fputc('-', f);
	fputs(" &middot; workers <span id=\"workers-attached\">", f);
	put_num(f, in, "workers_attached");
	fputs("</span>/", f);
	put_num(f, in, "max_workers");
	fputs(" &middot; schedulers <span id=\"schedulers-attached\">", f);
	put_num(f, in, "schedulers_attached");
	fputs("</span>/", f);
	put_num(f, in, "max_schedulers");
	fputs("</p>\n<p><a href=\"/status\">/status</a> (JSON) &middot; <a href=\"/metrics\">/metrics</a> "
	      "(Prometheus) &middot; a snapshot: reload for a new one</p></header>\n",
	      f);
}

static const char *const slot_states[] = {"free", "writing", "committed", "reading", "evicting", "draining"};
#define N_SLOT_STATES (sizeof(slot_states) / sizeof(slot_states[0]))

static void render_slots(FILE *f, const cJSON *doc)
{
	const cJSON *sl = get(doc, "l1_slots"), *in = get(doc, "instance"), *ar = get(in, "arena");
	fputs("<section id=\"l1\"><h2>L1 slots</h2>\n", f);
	if (!cJSON_IsObject(sl)) {
		fputs("<p class=\"muted\">no slot table</p></section>\n", f);
		return;
	}
	double total = num(sl, "slots");
	fputs("<div class=\"bar\">", f);
	for (size_t i = 0; i < N_SLOT_STATES && total > 0; i++) {
		double n = num(sl, slot_states[i]);
		if (n > 0)
			fprintf(f, "<span class=\"s-%s\" style=\"width:%.3f%%\" title=\"%s %.0f\"></span>", slot_states[i],
				100.0 * n / total, slot_states[i], n);
	}
	fputs("</div>\n<table>", f);
	for (size_t i = 0; i < N_SLOT_STATES; i++) {
		fprintf(f, "<tr><th><span class=\"key s-%s\"></span>%s</th><td class=\"n\" id=\"slots-%s\">", slot_states[i],
			slot_states[i], slot_states[i]);
		put_num(f, sl, slot_states[i]);
		fputs("</td></tr>", f);
	}
	fputs("<tr><th>slots</th><td class=\"n\" id=\"slots-total\">", f);
	put_num(f, sl, "slots");
	fputs("</td></tr></table>\n<p class=\"muted\">", f);
	put_bytes(f, num(sl, "slot_bytes"));
	fputs(" per slot, ", f);
	put_num(f, sl, "block_tokens");
	fputs(" tokens per block &middot; arena ", f);
	put_bytes(f, num(ar, "bytes"));
	fputs(num(ar, "bytes") && cJSON_IsTrue(get(ar, "huge_pages")) ? " (huge pages)" : "", f);
	fputs(", prefault ", f);
	put_str(f, ar, "prefault");
	fputs(" &middot; populated by actors ", f);
	put_bytes(f, num(in, "populated_bytes"));
	fputs(" of ", f);
	put_bytes(f, num(in, "populate_target_bytes"));
	fputs("</p></section>\n", f);
}

/* A table row: label, then the document's number o[key] (id when given). */
static void row_num(FILE *f, const char *label, const cJSON *o, const char *key, const char *id)
{
	fprintf(f, "<tr><th>%s</th><td class=\"n\"%s%s%s>", label, id ? " id=\"" : "", id ? id : "", id ? "\"" : "");
	put_num(f, o, key);
	fputs("</td></tr>", f);
}

static void render_hits(FILE *f, const cJSON *doc)
{
	const cJSON *h = get(doc, "hit_rate"), *x = get(doc, "transfer");
	fputs("<section id=\"hits\"><h2>Hit rate</h2>\n<p class=\"big\" id=\"hit-ratio\">", f);
	if (cJSON_IsNumber(get(h, "ratio")))
		fprintf(f, "%.1f%%", 100.0 * num(h, "ratio"));
	else
		fputs("-", f);
	fputs("</p><p class=\"muted\">blocks of the longest stored prefix / blocks asked for by lookups</p>\n<table>", f);
	row_num(f, "lookups", h, "lookups", "hit-lookups");
	row_num(f, "blocks matched", h, "matched_blocks", "hit-matched-blocks");
	row_num(f, "blocks requested", h, "requested_blocks", "hit-requested-blocks");
	row_num(f, "tokens matched", h, "matched_tokens", "hit-matched-tokens");
	row_num(f, "tokens requested", h, "requested_tokens", "hit-requested-tokens");
	row_num(f, "L1 misses", h, "l1_misses", NULL);
	row_num(f, "blocks stored", x, "stored_blocks", NULL);
	row_num(f, "blocks already present", x, "present_blocks", NULL);
	row_num(f, "blocks loaded", x, "loaded_blocks", NULL);
	row_num(f, "store blocks failed", x, "store_failed_blocks", NULL);
	row_num(f, "load blocks failed", x, "load_failed_blocks", NULL);
	fputs("</table></section>\n", f);
}

static void render_model(FILE *f, const cJSON *doc)
{
	const cJSON *cfg = get(doc, "config"), *m = get(cfg, "model");
	fputs("<section id=\"model\"><h2>Model</h2>\n", f);
	if (!cJSON_IsObject(m)) {
		fputs("<p class=\"muted\">the config in the segment does not parse</p></section>\n", f);
		return;
	}
	fputs("<table><tr><th>model_id</th><td id=\"model-id\">", f);
	put_str(f, m, "model_id");
	fputs("</td></tr><tr><th>preset</th><td>", f);
	put_str(f, m, "preset");
	fputs("</td></tr><tr><th>attention, layout</th><td>", f);
	put_str(f, m, "attention");
	fputs(", ", f);
	put_str(f, m, "kv_layout");
	fputs("</td></tr>", f);
	row_num(f, "layers", m, "layers", NULL);
	row_num(f, "KV heads", m, "kv_heads", NULL);
	row_num(f, "head_dim", m, "head_dim", NULL);
	row_num(f, "dtype bytes", m, "dtype_bytes", NULL);
	row_num(f, "block tokens", m, "block_tokens", NULL);
	row_num(f, "TP size", m, "tp_size", NULL);
	row_num(f, "ring capacity", cfg, "ring_capacity", NULL);
	fputs("<tr><th>eviction</th><td>", f);
	put_str(f, cfg, "eviction");
	fputs("</td></tr></table></section>\n", f);
}

static void render_engines(FILE *f, const cJSON *doc)
{
	const cJSON *a = get(doc, "engines"), *e;
	fputs("<section id=\"engines\"><h2>Engines</h2>\n", f);
	if (!cJSON_IsArray(a) || !cJSON_GetArraySize(a)) {
		fputs(cJSON_IsArray(a) ? "<p class=\"muted\">none attached</p>" : "<p class=\"muted\">unknown</p>", f);
		fputs("</section>\n", f);
		return;
	}
	fputs("<table><tr><th>#</th><th>engine id</th><th>namespace</th><th class=\"n\">workers</th>"
	      "<th class=\"n\">schedulers</th></tr>\n",
	      f);
	cJSON_ArrayForEach(e, a) {
		fputs("<tr class=\"engine\"><td>", f);
		put_num(f, e, "index");
		fputs("</td><td class=\"engine-id\">", f);
		put_str(f, e, "id");
		fputs("</td><td class=\"engine-ns\">", f);
		put_str(f, e, "model_ns");
		fputs(cJSON_IsTrue(get(e, "model_ns_is_model_id")) ? " <span class=\"muted\">(model.model_id)</span>" : "",
		      f);
		fputs("</td><td class=\"n\">", f);
		put_num(f, e, "workers");
		fputs("</td><td class=\"n\">", f);
		put_num(f, e, "schedulers");
		fputs("</td></tr>\n", f);
	}
	fputs("</table></section>\n", f);
}

static void render_actors(FILE *f, const cJSON *doc)
{
	const cJSON *a = get(doc, "actors"), *e;
	fputs("<section id=\"actors\" class=\"wide\"><h2>Actors</h2>\n<table><tr><th>name</th><th>kind</th>"
	      "<th>state</th><th class=\"n\">pid</th><th class=\"n\">restarts</th><th>last exit</th>"
	      "<th class=\"n\">malformed</th><th class=\"n\">populated</th></tr>\n",
	      f);
	cJSON_ArrayForEach(e, a) {
		fputs("<tr class=\"actor\"><td class=\"actor-name\">", f);
		put_str(f, e, "name");
		fputs("</td><td>", f);
		put_str(f, e, "kind");
		fputs("</td><td>", f);
		badge(f, text(e, "state"), NULL);
		fputs("</td><td class=\"n actor-pid\">", f);
		if (num(e, "pid") > 0)
			put_num(f, e, "pid");
		else
			fputc('-', f);
		fputs("</td><td class=\"n\">", f);
		put_num(f, e, "restarts");
		if (num(e, "last_exit_signal") > 0)
			fprintf(f, "</td><td>signal %.0f", num(e, "last_exit_signal"));
		else if (num(e, "last_exit_code") >= 0)
			fprintf(f, "</td><td>code %.0f", num(e, "last_exit_code"));
		else
			fputs("</td><td>-", f);
		fputs("</td><td class=\"n\">", f);
		put_num(f, e, "malformed");
		fputs("</td><td class=\"n\">", f);
		put_bytes(f, num(e, "populated_bytes"));
		fputs("</td></tr>\n", f);
	}
	fputs("</table></section>\n", f);
}

static void render_endpoint(FILE *f, const cJSON *ring, const char *key)
{
	const cJSON *ep = get(ring, key);
	put_str(f, ep, "name");
	if (num(ep, "pid") > 0) {
		fputs(" <span class=\"muted\">", f);
		put_num(f, ep, "pid");
		fputs("</span>", f);
	}
	if (cJSON_IsTrue(get(ep, "blocked")))
		fputs(!strcmp(key, "producer") ? " <strong>BLOCKED</strong>" : " <span class=\"muted\">waiting</span>", f);
}

static void render_rings(FILE *f, const cJSON *doc)
{
	const cJSON *a = get(doc, "rings"), *r;
	fputs("<section id=\"rings\" class=\"wide\"><h2>Rings</h2>\n<table><tr><th>ring</th><th>fill</th>"
	      "<th class=\"n\">messages</th><th>producer (pid)</th><th>consumer (pid)</th><th class=\"n\">enqueued</th>"
	      "<th class=\"n\">rejected</th><th class=\"n\">full waits</th></tr>\n",
	      f);
	cJSON_ArrayForEach(r, a) {
		fputs("<tr class=\"ring\"><td>", f);
		put_str(f, r, "name");
		fprintf(f, "</td><td><span class=\"fill\"><span style=\"width:%.1f%%\"></span></span>%s</td><td class=\"n\">",
			100.0 * num(r, "fill_ratio"), cJSON_IsTrue(get(r, "full")) ? " <strong>FULL</strong>" : "");
		put_num(f, r, "fill");
		fputs("/", f);
		put_num(f, r, "capacity");
		fputs("</td><td>", f);
		render_endpoint(f, r, "producer");
		fputs("</td><td>", f);
		render_endpoint(f, r, "consumer");
		fputs("</td><td class=\"n\">", f);
		put_num(f, r, "enqueued");
		fputs("</td><td class=\"n\">", f);
		put_num(f, r, "rejected");
		fputs("</td><td class=\"n\">", f);
		put_num(f, r, "full_waits");
		fputs("</td></tr>\n", f);
	}
	fputs("</table></section>\n", f);
}

static void render_l2(FILE *f, const cJSON *doc)
{
	const cJSON *l2 = get(doc, "l2"), *lk = get(l2, "lookup"), *d;
	if (!cJSON_IsObject(l2))
		return;
	fputs("<section id=\"l2\"><h2>L2 (disk)</h2>\n<table><tr><th>dir</th><th>state</th><th class=\"n\">used</th>"
	      "<th class=\"n\">of</th><th class=\"n\">files</th><th class=\"n\">evicted</th></tr>\n",
	      f);
	cJSON_ArrayForEach(d, get(l2, "dirs")) {
		fputs("<tr><td>", f);
		put_str(f, d, cJSON_IsString(get(d, "dir")) ? "dir" : "actor");
		fputs("</td><td>", f);
		badge(f, text(d, "state"), NULL);
		fputs("</td><td class=\"n\">", f);
		put_bytes(f, num(d, "used_bytes"));
		fputs("</td><td class=\"n\">", f);
		put_bytes(f, num(d, "capacity_bytes"));
		fputs("</td><td class=\"n\">", f);
		put_num(f, d, "files");
		fputs("</td><td class=\"n\">", f);
		put_num(f, d, "evicted_files");
		fputs("</td></tr>\n", f);
	}
	fputs("</table><table>", f);
	row_num(f, "block lanes promoted", lk, "reads", NULL);
	row_num(f, "promotions failed", lk, "read_failures", NULL);
	row_num(f, "lanes written", lk, "writes", NULL);
	row_num(f, "writes failed", lk, "write_failures", NULL);
	fputs("</table></section>\n", f);
}

static void render_remote(FILE *f, const cJSON *doc)
{
	const cJSON *rm = get(doc, "remote");
	if (!cJSON_IsObject(rm))
		return;
	fputs("<section id=\"remote\"><h2>Remote tier</h2>\n<p>", f);
	put_str(f, rm, "actor");
	fputc(' ', f);
	badge(f, text(rm, "state"), NULL);
	fputs("</p><table>", f);
	row_num(f, "nodes up", rm, "nodes_up", NULL);
	row_num(f, "nodes", rm, "nodes", NULL);
	row_num(f, "hash slots covered", rm, "slots_covered", NULL);
	row_num(f, "in flight", rm, "inflight", NULL);
	row_num(f, "reads", rm, "reads", NULL);
	row_num(f, "hits", rm, "hits", NULL);
	row_num(f, "misses", rm, "misses", NULL);
	row_num(f, "writes", rm, "writes", NULL);
	row_num(f, "write errors", rm, "write_errors", NULL);
	fputs("</table></section>\n", f);
}

char *sup_status_html(const cJSON *doc, size_t *ret_len)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
	      "<meta name=\"viewport\" content=\"width=device-width\"><title>kvring ",
	      f);
	put_str(f, get(doc, "instance"), "socket");
	fprintf(f, "</title><style>%s</style></head>\n<body>\n", css);
	render_header(f, doc);
	fputs("<main>\n", f);
	render_slots(f, doc);
	render_hits(f, doc);
	render_engines(f, doc);
	render_model(f, doc);
	render_l2(f, doc);
	render_remote(f, doc);
	render_actors(f, doc);
	render_rings(f, doc);
	fputs("</main>\n</body></html>\n", f);
	bool failed = ferror(f) != 0;
	if (fclose(f) || failed) {
		free(buf);
		return NULL;
	}
	*ret_len = len;
	return buf;
}
