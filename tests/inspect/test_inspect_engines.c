/* kvring-inspect against a real kvringd: the engines attached (id, model namespace, workers, schedulers). */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvr_geometry.h"
#include "kvr_proto.h"
#include "sup_harness.h"
#include "tool_test.h"

/* The instance's model.model_id: longer than an engine entry's model_ns (63 bytes), so an
 * engine that names none shows it whole only through the segment's config. */
#define MODEL_ID "example-org/a-model-id-longer-than-an-inspect-engine-entry-holds-in-its-64-bytes-v2"
#define NS_A "tiny-llama-bb89e7b1cad4526e@54d0f074fc7c3d500fc7"
#define NS_B "other-model@fedcba98" /* short enough to share its line */

static struct h_inst inst;
static char out_path[160], err_path[160];

static void setup(void)
{
	h_init(&inst, 0700);
	snprintf(out_path, sizeof(out_path), "%s/inspect.out", inst.dir);
	snprintf(err_path, sizeof(err_path), "%s/inspect.err", inst.dir);
	h_write_config_with(&inst, NULL, 2, H_SUP_DATA,
			    ",\n  \"l1\": {\"capacity_bytes\": \"64MiB\", \"huge_pages\": false}"
			    ",\n  \"model\": {\"model_id\": \"" MODEL_ID "\"}");
	h_start(&inst);
}

static void teardown(void)
{
	h_fini(&inst);
}

TestSuite(inspect_engines, .init = setup, .fini = teardown, .timeout = 60);

/* ATTACH (sched: ATTACH_SCHED) as engine `engine` with `model_ns` (engine NULL: an ATTACH
 * of the geometry alone, engine "default" without a model_ns); asserts it was accepted.
 * The connection stays open in w->sock: closing it detaches. */
static void attach(const char *engine, const char *model_ns, bool sched, struct h_worker *w)
{
	memset(w, 0, sizeof(*w));
	static struct kvr_proto_req req;
	memset(&req, 0, sizeof(req));
	req.magic = KVR_PROTO_MAGIC;
	req.version = KVR_PROTO_VERSION;
	struct kvr_attach_engine ein = {0};
	if (engine) {
		snprintf(ein.engine_id, sizeof(ein.engine_id), "%s", engine);
		snprintf(ein.model_ns, sizeof(ein.model_ns), "%s", model_ns);
	}
	int kv = -1;
	if (sched) {
		req.op = KVR_OP_ATTACH_SCHED;
		memcpy(req.payload, &ein, sizeof(ein));
		req.payload_len = sizeof(ein);
	} else {
		struct kvr_geometry g; /* the default model's, as h_attach_rank */
		cr_assert_eq(kvr_preset_geometry(kvr_preset_find("qwen3-8b"), 1, 0, 128, 2, &g), 0);
		kv = memfd_create("h-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		cr_assert(kv >= 0 && ftruncate(kv, (off_t)kvr_geometry_kv_extent(&g)) == 0);
		req.op = KVR_OP_ATTACH;
		memcpy(req.payload, &g, sizeof(g));
		req.payload_len = sizeof(g);
		if (engine) {
			memcpy(req.payload + sizeof(g), &ein, sizeof(ein));
			req.payload_len += sizeof(ein);
		}
	}
	w->sock = kvr_proto_connect(inst.sock);
	cr_assert_geq(w->sock, 0, "connect %s: %s", inst.sock, strerror(-w->sock));
	struct timeval tv = {.tv_sec = 5};
	cr_assert_eq(setsockopt(w->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	(void)kvr_proto_send(w->sock, &req, offsetof(struct kvr_proto_req, payload) + req.payload_len, &kv,
			     kv >= 0 ? 1 : 0);
	if (kv >= 0)
		close(kv);
	static struct kvr_proto_rep rep;
	memset(&rep, 0, sizeof(rep));
	ssize_t n = kvr_proto_recv(w->sock, &rep, sizeof(rep), w->fds, KVR_PROTO_MAX_FDS, &w->n_fds);
	cr_assert_gt(n, 0, "no attach reply: %s", strerror((int)-n));
	cr_assert_eq(rep.status, 0, "attach of engine %s refused: %s", engine ? engine : "(none)", rep.reason);
	w->worker = rep.worker;
}

/* kvringd's engine table, straight from an INSPECT reply: entries into tab, their count
 * returned. Asserts the payload is a whole number of entries. */
static unsigned engine_table(struct kvr_inspect_engine *tab, unsigned cap)
{
	int sock = kvr_proto_connect(inst.sock);
	cr_assert_geq(sock, 0);
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_INSPECT};
	cr_assert_eq(kvr_proto_send(sock, &req, offsetof(struct kvr_proto_req, payload), NULL, 0), 0);
	static struct kvr_proto_rep rep;
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds = 0;
	ssize_t n = kvr_proto_recv(sock, &rep, sizeof(rep), fds, KVR_PROTO_MAX_FDS, &n_fds);
	close(sock);
	for (unsigned i = 0; i < n_fds; i++)
		close(fds[i]);
	cr_assert_gt(n, 0);
	cr_assert_eq(rep.status, 0);
	cr_assert_eq((size_t)n, offsetof(struct kvr_proto_rep, payload) + rep.payload_len);
	cr_assert_eq(rep.payload_len % sizeof(struct kvr_inspect_engine), 0, "payload_len %u", rep.payload_len);
	unsigned k = rep.payload_len / sizeof(struct kvr_inspect_engine);
	cr_assert_leq(k, cap);
	memcpy(tab, rep.payload, rep.payload_len);
	return k;
}

/* Run kvring-inspect with args (NULL-terminated, after --socket); asserts exit 0. Its
 * stdout, which the caller frees. */
static char *run_inspect(const char *a1, const char *a2)
{
	const char *args[] = {"--socket", inst.sock, a1, a2, NULL};
	pid_t pid = tool_spawn("tools/inspect/kvring-inspect", args, out_path, err_path);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	char *err = tool_slurp(err_path);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvring-inspect: status 0x%x: %s", st, err);
	free(err);
	return tool_slurp(out_path);
}

static cJSON *inspect_json(void)
{
	char *js = run_inspect("--json", NULL);
	cJSON *root = cJSON_Parse(js);
	cr_assert_not_null(root, "%s", js);
	free(js);
	return root;
}

static const cJSON *find_engine(const cJSON *root, const char *id)
{
	const cJSON *en = cJSON_GetObjectItemCaseSensitive(root, "engines"), *e;
	cr_assert(cJSON_IsArray(en), "no engines array");
	cJSON_ArrayForEach(e, en)
		if (!strcmp(cJSON_GetObjectItemCaseSensitive(e, "id")->valuestring, id))
			return e;
	return NULL;
}

static double num(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	cr_assert(cJSON_IsNumber(v), "%s is not a number", k);
	return v->valuedouble;
}

static const char *str(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	cr_assert(cJSON_IsString(v), "%s is not a string", k);
	return v->valuestring;
}

/* The engine index a client (workers[] / schedulers[] entry of that slot) names. */
static double client_engine(const cJSON *root, const char *array, unsigned slot)
{
	const cJSON *c;
	cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, array))
		if (num(c, "slot") == slot)
			return num(c, "engine");
	cr_assert_fail("no %s entry for slot %u", array, slot);
	return -1;
}

/* Two engines of different namespaces: a worker of one, a worker and a scheduler of the
 * other. --json lists both with their ids, namespaces and counts, under the indices their
 * clients name; the text has a line each. Once one engine's clients left, its entry goes. */
Test(inspect_engines, two_engines_then_one_leaves)
{
	struct h_worker wa, wb, sb;
	attach("vllm-a", NS_A, false, &wa);
	attach("vllm-b", NS_B, false, &wb);
	attach("vllm-b", NS_B, true, &sb);

	cJSON *root = inspect_json();
	cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "engines")), 2);
	const cJSON *a = find_engine(root, "vllm-a"), *b = find_engine(root, "vllm-b");
	cr_assert_not_null(a);
	cr_assert_not_null(b);
	cr_assert_str_eq(str(a, "model_ns"), NS_A);
	cr_assert_eq(num(a, "workers"), 1);
	cr_assert_eq(num(a, "schedulers"), 0);
	cr_assert_str_eq(str(b, "model_ns"), NS_B);
	cr_assert_eq(num(b, "workers"), 1);
	cr_assert_eq(num(b, "schedulers"), 1);
	cr_assert_neq(num(a, "index"), num(b, "index"));
	cr_assert_eq(client_engine(root, "workers", wa.worker), num(a, "index"));
	cr_assert_eq(client_engine(root, "workers", wb.worker), num(b, "index"));
	cr_assert_eq(client_engine(root, "schedulers", sb.worker), num(b, "index"));
	/* each client's engine's block size (qwen3-8b here with 128-token blocks) */
	const cJSON *wl = cJSON_GetObjectItemCaseSensitive(root, "workers"), *sl = cJSON_GetObjectItemCaseSensitive(root, "schedulers");
	cr_assert_eq(num(cJSON_GetArrayItem(wl, 0), "block_tokens"), 128);
	cr_assert_eq(num(cJSON_GetArrayItem(sl, 0), "block_tokens"), 128);
	unsigned ia = (unsigned)num(a, "index"), ib = (unsigned)num(b, "index");
	/* the model table: one entry per namespace, in the order they attached, nothing stored yet */
	const cJSON *models = cJSON_GetObjectItemCaseSensitive(root, "models");
	cr_assert_eq(cJSON_GetArraySize(models), 2);
	const cJSON *ma = cJSON_GetArrayItem(models, 0), *mb = cJSON_GetArrayItem(models, 1);
	cr_assert_str_eq(str(ma, "namespace"), NS_A);
	cr_assert_eq(num(ma, "engines"), 1);
	cr_assert_str_eq(str(mb, "namespace"), NS_B);
	cr_assert_eq(num(mb, "engines"), 1);
	cr_assert_eq(num(mb, "lookups"), 0);
	cr_assert_eq(num(mb, "l1_slots"), 0);
	cJSON_Delete(root);

	char *txt = run_inspect(NULL, NULL);
	char want[512];
	snprintf(want, sizeof(want), "\nmodels\n  %-26s %7s %8s %9s %9s %7s %6s\n", "NAMESPACE", "ENGINES", "L1 SLOTS",
		 "L1 BYTES", "L2 BYTES", "LOOKUPS", "HIT");
	cr_assert_not_null(strstr(txt, want), "%s", txt);
	snprintf(want, sizeof(want), "\n  %-26s %7u %8u %9s %9s %7u %6s\n", NS_B, 1u, 0u, "0 B", "0 B", 0u, "-");
	cr_assert_not_null(strstr(txt, want), "%s", txt);
	/* NS_A does not fit beside the rest: a line of its own */
	snprintf(want, sizeof(want), "\n  engine %u  \"vllm-a\"  workers 1  schedulers 0\n    namespace \"" NS_A "\"\n", ia);
	cr_assert_not_null(strstr(txt, want), "%s", txt);
	snprintf(want, sizeof(want), "\n  engine %u  \"vllm-b\"  namespace \"" NS_B "\"  workers 1  schedulers 1\n", ib);
	cr_assert_not_null(strstr(txt, want), "%s", txt);
	snprintf(want, sizeof(want), "  client.%-3u pid %-7d  attached   tp 0/1  dcp 0/1  128-token blocks  engine %u\n", wb.worker,
		 (int)getpid(), ib);
	cr_assert_not_null(strstr(txt, want), "%s", txt);
	free(txt);

	/* engine b's worker and scheduler leave: kvringd drops it at once */
	h_worker_close(&wb);
	h_worker_close(&sb);
	struct kvr_inspect_engine tab[KVR_CTL_MAX_ENGINES];
	cr_assert(H_WAIT(engine_table(tab, KVR_CTL_MAX_ENGINES) == 1, 3000), "engine vllm-b still listed");
	cr_assert_eq(tab[0].index, ia);
	cr_assert_str_eq(tab[0].id, "vllm-a");
	cr_assert_str_eq(tab[0].model_ns, NS_A);
	cr_assert_eq(tab[0].flags, 0);
	root = inspect_json();
	cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "engines")), 1);
	cr_assert_null(find_engine(root, "vllm-b"));
	a = find_engine(root, "vllm-a");
	cr_assert_not_null(a);
	cr_assert_eq(num(a, "workers"), 1);
	cr_assert_eq(num(a, "schedulers"), 0);
	cJSON_Delete(root);

	h_worker_close(&wa);
	cr_assert(H_WAIT(engine_table(tab, KVR_CTL_MAX_ENGINES) == 0, 3000), "engine vllm-a still listed");
	txt = run_inspect(NULL, NULL);
	cr_assert_not_null(strstr(txt, "\nengines: none attached\n"), "%s", txt);
	free(txt);
}

/* A worker that names no engine: engine "default", whose namespace is the instance's
 * model.model_id — whole in --json although it is longer than the table entry holds. */
Test(inspect_engines, worker_without_model_ns_shows_model_id)
{
	struct h_worker w;
	attach(NULL, NULL, false, &w);
	struct kvr_inspect_engine tab[KVR_CTL_MAX_ENGINES];
	cr_assert_eq(engine_table(tab, KVR_CTL_MAX_ENGINES), 1);
	cr_assert_eq(tab[0].flags, KVR_INSPECT_ENGINE_NS_MODEL_ID);
	cr_assert_eq(strnlen(tab[0].model_ns, sizeof(tab[0].model_ns)), 63, "cut to the entry, NUL-terminated");
	cr_assert_eq(strncmp(tab[0].model_ns, MODEL_ID, 63), 0);

	cJSON *root = inspect_json();
	cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "engines")), 1);
	const cJSON *e = find_engine(root, "default");
	cr_assert_not_null(e);
	cr_assert_str_eq(str(e, "model_ns"), MODEL_ID);
	cr_assert_eq(num(e, "workers"), 1);
	cr_assert_eq(num(e, "schedulers"), 0);
	cr_assert_eq(client_engine(root, "workers", w.worker), num(e, "index"));
	cJSON_Delete(root);

	/* the text keeps both ends of a namespace too long for its line, within 80 columns */
	char *txt = run_inspect(NULL, NULL);
	cr_assert_not_null(strstr(txt, "  engine 0  \"default\"  workers 1  schedulers 0\n"
				       "    namespace \"example-org/a-model-id-longer-t...entry-holds-in-its-64-bytes-v2\"\n"),
			   "%s", txt);
	for (const char *l = txt, *nl; (nl = strchr(l, '\n')); l = nl + 1)
		cr_assert_leq(nl - l, 80, "%.*s", (int)(nl - l), l);
	free(txt);
	h_worker_close(&w);
}
