/* The status page in a real browser: headless Chromium's screenshot and --dump-dom of kvringd's / after a workload. Exits 77 without chromium. */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../inspect/tool_test.h"
#include "metrics_test.h"

/*
 * What a browser does with the page, no JavaScript involved: the screenshot is a PNG of the
 * window's size with more than one colour in it (tests/metrics/png_info.py decodes it), and
 * the DOM Chromium built holds the instance's socket path, every actor's name, the slot
 * counts by state /status reports, and the client's model namespace as text, not markup.
 * The screenshot, the DOM and /status stay in <build>/meson-logs/ (status-page.png, .html, .json).
 */

#define ENGINE_ID "chromium-test"
#define MODEL_NS "<i>ns</i>&co"
#define CHROMIUM_MS 60000 /* one headless run, start to exit (about 4 s on 2 cores) */

static char chromium[512]; /* found by find_chromium(): in main, and again in the test's process */
M_FIXTURE(status_page, 180); /* inst and worker: a fresh instance directory, no worker yet */

/* The first of names found on PATH, into ret; false when none is. */
static bool find_program(const char *const *names, char *ret, size_t len)
{
	const char *path = getenv("PATH");
	for (; *names; names++) {
		char *dirs = strdup(path ? path : "/usr/bin:/bin"), *save = NULL;
		for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
			snprintf(ret, len, "%s/%s", d, *names);
			if (access(ret, X_OK) == 0) {
				free(dirs);
				return true;
			}
		}
		free(dirs);
	}
	return false;
}

/* $KVR_CHROMIUM, else chromium or chromium-browser on PATH, into chromium[]. */
static bool find_chromium(void)
{
	const char *env = getenv("KVR_CHROMIUM");
	if (env && *env) {
		snprintf(chromium, sizeof(chromium), "%s", env);
		return access(chromium, X_OK) == 0;
	}
	return find_program((const char *const[]){"chromium", "chromium-browser", NULL}, chromium, sizeof(chromium));
}

/* Run argv (argv[0] a path) in its own process group with stdout to out_path and stderr to
 * err_path; wait for it at most ms. Returns its wait status; whatever of its group is left
 * (Chromium's helpers) is killed. */
static int run(char *const *argv, const char *out_path, const char *err_path, int ms)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawnattr_init(&at);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
	posix_spawnattr_setpgroup(&at, 0);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	cr_assert_eq(rc, 0, "cannot run %s: %s", argv[0], strerror(rc));
	int st = h_wait_exit(pid, ms);
	(void)kill(-pid, SIGKILL); /* its group: this run's helpers only */
	if (st == -1) {
		(void)waitpid(pid, NULL, 0);
		char *err = tool_slurp(err_path);
		cr_assert_fail("%s did not exit within %d ms; stderr:\n%s", argv[0], ms, err);
	}
	return st;
}

/* Headless Chromium on url with one extra argument (--screenshot=... or --dump-dom). */
static void chromium_run(const char *url, const char *what, const char *out_path)
{
	char profile[160], err_path[160], size[] = "--window-size=1280,1600";
	snprintf(profile, sizeof(profile), "--user-data-dir=%s/chromium", inst.dir);
	snprintf(err_path, sizeof(err_path), "%s/chromium.err", inst.dir);
	char *argv[] = {chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
			"--no-first-run", profile, size, (char *)what, (char *)url, NULL};
	int st = run(argv, out_path, err_path, CHROMIUM_MS);
	char *err = tool_slurp(err_path);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "chromium %s: status %#x; stderr:\n%s", what, st, err);
	free(err);
}

static void check_png(const char *png)
{
	const char *src = getenv("KVR_SOURCE_ROOT");
	cr_assert_not_null(src, "KVR_SOURCE_ROOT is not set (run through meson test)");
	char script[512], python[512], out[160], err[160];
	snprintf(script, sizeof(script), "%s/tests/metrics/png_info.py", src);
	snprintf(out, sizeof(out), "%s/png.out", inst.dir);
	snprintf(err, sizeof(err), "%s/png.err", inst.dir);
	cr_assert(find_program((const char *const[]){"python3", NULL}, python, sizeof(python)));
	char *argv[] = {python, script, (char *)png, NULL};
	int st = run(argv, out, err, 30000);
	char *o = tool_slurp(out), *e = tool_slurp(err);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "png_info: %s", e);
	unsigned w = 0, h = 0, colours = 0;
	cr_assert_eq(sscanf(o, "%u %u %u", &w, &h, &colours), 3, "png_info said: %s", o);
	cr_assert_eq(w, 1280, "screenshot width");
	cr_assert_eq(h, 1600, "screenshot height");
	cr_assert_gt(colours, 2, "the screenshot is blank: %u colours", colours);
	free(o);
	free(e);
}

/* The text of the element with id `id` in the serialised DOM (caller frees). */
static char *by_id(const char *dom, const char *id)
{
	char pat[96];
	snprintf(pat, sizeof(pat), "id=\"%s\">", id);
	const char *p = strstr(dom, pat);
	cr_assert_not_null(p, "no element with id %s in the DOM", id);
	p += strlen(pat);
	return strndup(p, strcspn(p, "<"));
}

static void check_dom(const char *dom, const cJSON *st)
{
	static const char *const states[] = {"free", "writing", "committed", "reading", "evicting", "draining"};
	const cJSON *in = cJSON_GetObjectItem(st, "instance"), *sl = cJSON_GetObjectItem(st, "l1_slots"), *a;
	char *sock = by_id(dom, "socket");
	cr_assert_str_eq(sock, cJSON_GetObjectItem(in, "socket")->valuestring);
	cr_assert_str_eq(sock, inst.sock);
	free(sock);
	for (unsigned i = 0; i < 6; i++) {
		char id[32], want[32];
		snprintf(id, sizeof(id), "slots-%s", states[i]);
		snprintf(want, sizeof(want), "%.0f", cJSON_GetObjectItem(sl, states[i])->valuedouble);
		char *got = by_id(dom, id);
		cr_assert_str_eq(got, want, "slots %s: the page says %s, /status %s", states[i], got, want);
		free(got);
	}
	unsigned n = 0;
	cJSON_ArrayForEach(a, cJSON_GetObjectItem(st, "actors")) {
		char want[128];
		snprintf(want, sizeof(want), "<td class=\"actor-name\">%s</td>", cJSON_GetObjectItem(a, "name")->valuestring);
		cr_assert(strstr(dom, want), "actor %s is not on the page", cJSON_GetObjectItem(a, "name")->valuestring);
		n++;
	}
	cr_assert_geq(n, 3, "lookup, loader.0, storer.0 at least");
	/* the namespace is text in the DOM: serialised escaped, and no <i> element was made of it */
	cr_assert(strstr(dom, "<td class=\"engine-ns\">&lt;i&gt;ns&lt;/i&gt;&amp;co</td>"), "the engine's namespace");
	cr_assert_null(strstr(dom, "<i>"), "the namespace became markup");
	cr_assert(strstr(dom, "<td class=\"engine-id\">" ENGINE_ID "</td>"));
}

Test(status_page, headless_chromium_renders_the_instance)
{
	/* Criterion runs each test in a process of its own: main's globals are not here */
	cr_assert(find_chromium(), "chromium is gone");
	uint16_t port = m_free_port();
	m_start(&inst, true, port);
	m_worker_attach_engine(&worker, inst.sock, ENGINE_ID, MODEL_NS);
	m_workload(&worker);

	struct m_http r;
	cr_assert_eq(m_http(port, "GET", "/status", &r), 0);
	cr_assert_eq(r.status, 200);
	cJSON *st = cJSON_Parse(r.body);
	cr_assert_not_null(st, "/status is not JSON:\n%s", r.body);

	const char *root = getenv("KVR_BUILD_ROOT");
	cr_assert_not_null(root, "KVR_BUILD_ROOT is not set (run through meson test)");
	char logs[512], png[600], dom_path[600], shot[640], url[64], out[160];
	snprintf(logs, sizeof(logs), "%s/meson-logs", root);
	cr_assert(mkdir(logs, 0755) == 0 || errno == EEXIST, "%s: %s", logs, strerror(errno));
	snprintf(png, sizeof(png), "%s/status-page.json", logs); /* what the page was compared with */
	h_write_file(png, r.body);
	m_http_free(&r);
	snprintf(png, sizeof(png), "%s/status-page.png", logs);
	snprintf(dom_path, sizeof(dom_path), "%s/status-page.html", logs);
	snprintf(shot, sizeof(shot), "--screenshot=%s", png);
	snprintf(url, sizeof(url), "http://127.0.0.1:%u/", port);
	snprintf(out, sizeof(out), "%s/chromium.out", inst.dir);
	(void)unlink(png); /* the check must see this run's file */
	chromium_run(url, shot, out);
	check_png(png);

	chromium_run(url, "--dump-dom", dom_path);
	char *dom = tool_slurp(dom_path);
	check_dom(dom, st);
	free(dom);
	cJSON_Delete(st);
}

int main(int argc, char **argv)
{
	if (!find_chromium()) {
		fprintf(stderr, "chromium not installed (Debian: chromium; tools/install-deps.sh): skipped\n");
		return 77;
	}
	char python[512];
	if (!find_program((const char *const[]){"python3", NULL}, python, sizeof(python))) {
		fprintf(stderr, "python3 not installed (it decodes the screenshot): skipped\n");
		return 77;
	}
	struct criterion_test_set *tests = criterion_initialize();
	int result = 0;
	if (criterion_handle_args(argc, argv, true))
		result = !criterion_run_all_tests(tests);
	criterion_finalize(tests);
	return result;
}
