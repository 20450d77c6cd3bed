/* Tests of the config module: exact errors for bad input, parsed values, defaults, round trip, docs/config.md drift. */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvr_config.h"
#include "kvr_log.h"
#include "kvr_geometry.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Every key set to a value other than its default; strings with characters JSON must escape. */
static const char full_json[] =
	"{\n"
	"  \"instance\": {\"socket\": \"/tmp/kvr-rt.sock\", \"socket_mode\": \"0660\", \"max_workers\": 16,\n"
	"                \"log_level\": \"debug\", \"actor_dir\": \"/opt/kvring/actors\"},\n"
	"  \"rings\": {\"capacity\": 4096, \"spin_ns\": 0},\n"
	"  \"supervisor\": {\"ready_timeout_ms\": 100, \"stable_after_ms\": 0, \"restart_backoff_initial_ms\": 7,\n"
	"                  \"restart_backoff_max_ms\": 7, \"crash_loop_window_s\": 86400,\n"
	"                  \"crash_loop_max_deaths\": 1,\n"
	"                  \"health_interval_ms\": 10, \"drain_timeout_ms\": 0},\n"
	"  \"model\": {\"preset\": \"\", \"model_id\": \"org/M \\\"q\\\" \\\\ \\t \\u00e9\\n\",\n"
	"             \"layers\": 40, \"kv_heads\": 4, \"head_dim\": 128, \"dtype_bytes\": 2, \"block_tokens\": 16,\n"
	"             \"tp_size\": 2, \"attention\": \"mha\",\n"
	"             \"cache_salt\": \"salt-1\"},\n"
	"  \"l1\": {\"capacity_bytes\": 0, \"workload_prompts\": 200, \"workload_tokens\": 10000,\n"
	"          \"huge_pages\": false,\n"
	"          \"eviction\": \"lru\"},\n"
	"  \"staging\": {\"ceiling_bytes\": \"1GiB\", \"load_percent\": 25, \"buffer_bytes\": 12345},\n"
	"  \"l2\": {\"dirs\": [\"/mnt/a\", \"/mnt/b\"], \"capacity_bytes\": \"64GiB\", \"mode\": \"write-back\",\n"
	"          \"durability\": \"none\", \"queue_depth\": 4096, \"read_only\": true},\n"
	"  \"metrics\": {\"enabled\": true, \"listen\": \"[::1]:1\"}\n"
	"}\n";

static void fill_pattern(struct kvr_config *c)
{
	memset(c, 0xa5, sizeof(*c));
}

static bool is_pattern(const struct kvr_config *c)
{
	const unsigned char *p = (const unsigned char *)c;

	for (size_t i = 0; i < sizeof(*c); i++)
		if (p[i] != 0xa5)
			return false;
	return true;
}

TestSuite(config);

Test(config, defaults)
{
	struct kvr_config d, p;
	char err[256] = "junk";

	kvr_config_defaults(&d);
	cr_assert_str_eq(d.instance.socket, "/tmp/kvring.sock");
	cr_assert_eq(d.instance.socket_mode, 0600);
	cr_assert_eq(d.instance.max_workers, 8);
	cr_assert_str_eq(d.instance.log_level, "info");
	cr_assert_str_eq(d.instance.actor_dir, "");
	cr_assert_eq(d.rings.capacity, 1024);
	cr_assert_eq(d.rings.spin_ns, 10000);
	cr_assert_eq(d.supervisor.ready_timeout_ms, 5000);
	cr_assert_eq(d.supervisor.stable_after_ms, 1000);
	cr_assert_eq(d.supervisor.restart_backoff_initial_ms, 100);
	cr_assert_eq(d.supervisor.restart_backoff_max_ms, 5000);
	cr_assert_eq(d.supervisor.crash_loop_window_s, 30);
	cr_assert_eq(d.supervisor.crash_loop_max_deaths, 5);
	cr_assert_eq(d.supervisor.health_interval_ms, 1000);
	cr_assert_eq(d.supervisor.drain_timeout_ms, 30000);
	/* no model: L1 is laid out for the first worker that attaches (docs/engines.md) */
	cr_assert_str_eq(d.model.preset, "");
	cr_assert_str_eq(d.model.model_id, "");
	cr_assert(d.model.unbound);
	cr_assert_eq(d.model.layers, 0);
	cr_assert_eq(d.model.kv_heads, 0);
	cr_assert_eq(d.model.head_dim, 0);
	cr_assert_eq(d.model.dtype_bytes, 0);
	cr_assert_eq(d.model.block_tokens, 128);
	cr_assert_eq(d.model.tp_size, 1);
	cr_assert_str_eq(d.model.attention, "mha");
	cr_assert_str_eq(d.model.cache_salt, "");
	cr_assert_eq(d.l1.capacity_bytes, 1ull << 30);
	cr_assert_eq(d.l1.workload_prompts, 0);
	cr_assert_eq(d.l1.workload_tokens, 0);
	cr_assert_eq(d.l1.huge_pages, true);
	cr_assert_str_eq(d.l1.eviction, "s3fifo");
	cr_assert_eq(d.staging.ceiling_bytes, 256ull << 20);
	cr_assert_eq(d.staging.load_percent, 50);
	cr_assert_eq(d.staging.buffer_bytes, 0);
	cr_assert_eq(d.l2.n_dirs, 0);
	cr_assert_eq(d.l2.capacity_bytes, 0);
	cr_assert_str_eq(d.l2.mode, "write-through");
	cr_assert_str_eq(d.l2.durability, "batch");
	cr_assert_eq(d.l2.queue_depth, 32);
	cr_assert_eq(d.l2.read_only, false);
	cr_assert_eq(d.metrics.enabled, false);
	cr_assert_str_eq(d.metrics.listen, "127.0.0.1:9464");

	/* "{}" (and whitespace around it) is exactly the defaults, byte for byte; err is emptied. */
	fill_pattern(&p);
	cr_assert_eq(kvr_config_parse("{}", &p, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(err, "");
	cr_assert_eq(memcmp(&p, &d, sizeof(d)), 0);
	fill_pattern(&p);
	cr_assert_eq(kvr_config_parse(" \n\t{ }\n", &p, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(&p, &d, sizeof(d)), 0);
	/* Empty sections change nothing either. */
	cr_assert_eq(kvr_config_parse("{\"instance\": {}, \"l2\": {}, \"metrics\": {}}", &p, err, sizeof(err)), 0);
	cr_assert_eq(memcmp(&p, &d, sizeof(d)), 0);
}

struct bad_case {
	const char *json;
	const char *err;
};

#define S107 "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" \
	"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define S108 S107 "a"
#define S64 "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define S128 S64 S64
_Static_assert(sizeof(S107) == 108 && sizeof(S108) == 109 && sizeof(S128) == 129, "test strings");

static const struct bad_case bad_cases[] = {
	/* unknown and duplicate keys */
	{ "{\"foo\": {}}", "$.foo: unknown key" },
	{ "{\"l1\": {\"capacity\": 1}}", "$.l1.capacity: unknown key" },
	{ "{\"l1\": {\"Eviction\": \"lru\"}}", "$.l1.Eviction: unknown key" },
	{ "{\"rings\": {\"capacity\": 1024, \"capacity\": 2048}}", "$.rings.capacity: duplicate key" },
	{ "{\"rings\": {}, \"rings\": {}}", "$.rings: duplicate key" },
	{ "{\"x\\ny\": 1}", "$.x?y: unknown key" },
	/* wrong types */
	{ "[]", "$: wrong type: expected object, got array" },
	{ "42", "$: wrong type: expected object, got number" },
	{ "{\"rings\": 5}", "$.rings: wrong type: expected object, got number" },
	{ "{\"rings\": {\"capacity\": \"1024\"}}",
	  "$.rings.capacity: wrong type: expected unsigned integer, got string" },
	{ "{\"instance\": {\"max_workers\": null}}",
	  "$.instance.max_workers: wrong type: expected unsigned integer, got null" },
	{ "{\"rings\": {\"capacity\": 1.5}}",
	  "$.rings.capacity: wrong type: expected unsigned integer, got fractional number 1.5" },
	{ "{\"l1\": {\"capacity_bytes\": 0.25}}",
	  "$.l1.capacity_bytes: wrong type: expected unsigned integer, got fractional number 0.25" },
	{ "{\"l1\": {\"capacity_bytes\": true}}",
	  "$.l1.capacity_bytes: wrong type: expected unsigned integer or size string, got boolean" },
	{ "{\"metrics\": {\"enabled\": \"yes\"}}", "$.metrics.enabled: wrong type: expected boolean, got string" },
	{ "{\"metrics\": {\"enabled\": 1}}", "$.metrics.enabled: wrong type: expected boolean, got number" },
	{ "{\"l1\": {\"eviction\": [\"lru\"]}}", "$.l1.eviction: wrong type: expected string, got array" },
	{ "{\"instance\": {\"socket\": {}}}", "$.instance.socket: wrong type: expected string, got object" },
	{ "{\"instance\": {\"socket_mode\": 384}}",
	  "$.instance.socket_mode: wrong type: expected octal mode string, got number" },
	{ "{\"l2\": {\"dirs\": \"/mnt/a\"}}", "$.l2.dirs: wrong type: expected array of strings, got string" },
	{ "{\"l2\": {\"dirs\": [\"/a\", 5]}}", "$.l2.dirs[1]: wrong type: expected string, got number" },
	{ "{\"l2\": {\"read_only\": 1}}", "$.l2.read_only: wrong type: expected boolean, got number" },
	{ "{\"l2\": {\"read_only\": \"true\"}}", "$.l2.read_only: wrong type: expected boolean, got string" },
	/* out of range: never truncated or clamped */
	{ "{\"supervisor\": {\"restart_backoff_max_ms\": 0}}",
	  "$.supervisor.restart_backoff_max_ms: out of range: 0 (must be 1..600000)" },
	{ "{\"rings\": {\"capacity\": -2}}", "$.rings.capacity: out of range: -2 (must be 2..1048576)" },
	{ "{\"rings\": {\"capacity\": 4294967296}}",
	  "$.rings.capacity: out of range: 4294967296 (must be 2..1048576)" },
	{ "{\"rings\": {\"capacity\": 1e400}}", "$.rings.capacity: out of range: inf (must be 2..1048576)" },
	{ "{\"instance\": {\"max_workers\": 17}}", "$.instance.max_workers: out of range: 17 (must be 1..16)" },
	{ "{\"staging\": {\"load_percent\": 100}}", "$.staging.load_percent: out of range: 100 (must be 1..99)" },
	{ "{\"staging\": {\"load_percent\": 0}}", "$.staging.load_percent: out of range: 0 (must be 1..99)" },
	{ "{\"staging\": {\"ceiling_bytes\": 4095}}",
	  "$.staging.ceiling_bytes: out of range: 4095 (must be 4KiB..1PiB)" },
	{ "{\"l1\": {\"capacity_bytes\": -1}}", "$.l1.capacity_bytes: out of range: -1 (must be 0..1PiB)" },
	{ "{\"l1\": {\"capacity_bytes\": \"2PiB\"}}", "$.l1.capacity_bytes: out of range: \"2PiB\" (must be 0..1PiB)" },
	{ "{\"l1\": {\"capacity_bytes\": \"99999999999999999999\"}}",
	  "$.l1.capacity_bytes: out of range: \"99999999999999999999\" (must be 0..1PiB)" },
	{ "{\"l1\": {\"capacity_bytes\": \"16777216TiB\"}}",
	  "$.l1.capacity_bytes: out of range: \"16777216TiB\" (must be 0..1PiB)" },
	{ "{\"instance\": {\"socket_mode\": \"1777\"}}",
	  "$.instance.socket_mode: out of range: \"1777\" (must be 0000..0777)" },
	/* malformed values */
	{ "{\"l1\": {\"capacity_bytes\": \"1GB\"}}",
	  "$.l1.capacity_bytes: invalid size \"1GB\" (bytes, or a string like \"512MiB\"; units B, KiB, MiB, GiB, TiB, "
	  "PiB)" },
	{ "{\"l1\": {\"capacity_bytes\": \"1.5GiB\"}}",
	  "$.l1.capacity_bytes: invalid size \"1.5GiB\" (bytes, or a string like \"512MiB\"; units B, KiB, MiB, GiB, "
	  "TiB, PiB)" },
	{ "{\"l1\": {\"capacity_bytes\": \"-1\"}}",
	  "$.l1.capacity_bytes: invalid size \"-1\" (bytes, or a string like \"512MiB\"; units B, KiB, MiB, GiB, TiB, "
	  "PiB)" },
	{ "{\"instance\": {\"socket_mode\": \"0800\"}}",
	  "$.instance.socket_mode: invalid mode \"0800\" (3 or 4 octal digits, like \"0600\")" },
	{ "{\"instance\": {\"socket_mode\": \"60\"}}",
	  "$.instance.socket_mode: invalid mode \"60\" (3 or 4 octal digits, like \"0600\")" },
	/* enums */
	{ "{\"l1\": {\"eviction\": \"fifo\"}}", "$.l1.eviction: invalid value \"fifo\" (one of: lru, s3fifo)" },
	{ "{\"l2\": {\"mode\": \"write-around\"}}",
	  "$.l2.mode: invalid value \"write-around\" (one of: write-through, write-back)" },
	{ "{\"remote\": {\"mode\": \"write-back\"}}",
	  "$.remote.mode: invalid value \"write-back\" (one of: write-through)" },
	/* the shared tier's seeds and options */
	{ "{\"remote\": {\"cluster\": [\"127.0.0.1\"]}}",
	  "$.remote.cluster[0]: invalid \"127.0.0.1\" (expected host:port, port 1..65535)" },
	{ "{\"remote\": {\"cluster\": [\"10.0.0.1:7000\", \"10.0.0.2:0\"]}}",
	  "$.remote.cluster[1]: invalid \"10.0.0.2:0\" (expected host:port, port 1..65535)" },
	{ "{\"remote\": {\"cluster\": [\"a:7000\", \"b:7000\", \"a:7000\"]}}",
	  "$.remote.cluster[2]: duplicate of $.remote.cluster[0] (\"a:7000\")" },
	{ "{\"remote\": {\"cluster\": \"a:7000\"}}", "$.remote.cluster: wrong type: expected array of strings, got string" },
	{ "{\"remote\": {\"tls\": true}}",
	  "$.remote.tls: TLS is not built into this kvring (hiredis without hiredis_ssl): use a private network or a TLS "
	  "proxy, and tls false" },
	{ "{\"remote\": {\"user\": \"kv\"}}", "$.remote.user: \"kv\" needs remote.password" },
	{ "{\"remote\": {\"timeout_ms\": 5}}", "$.remote.timeout_ms: out of range: 5 (must be 10..600000)" },
	{ "{\"remote\": {\"max_inflight\": 0}}", "$.remote.max_inflight: out of range: 0 (must be 1..4096)" },
	{ "{\"remote\": {\"clusters\": []}}", "$.remote.clusters: unknown key" },
	{ "{\"l2\": {\"durability\": \"fsync\"}}",
	  "$.l2.durability: invalid value \"fsync\" (one of: none, block, batch)" },
	{ "{\"instance\": {\"log_level\": \"INFO\"}}",
	  "$.instance.log_level: invalid value \"INFO\" (one of: error, warn, info, debug)" },
	{ "{\"model\": {\"attention\": \"gqa\"}}", "$.model.attention: invalid value \"gqa\" (one of: mha, mla)" },
	{ "{\"model\": {\"dtype_bytes\": 8}}", "$.model.dtype_bytes: out of range: 8 (must be 0..4)" },
	{ "{\"model\": {\"tp_size\": 17}}", "$.model.tp_size: out of range: 17 (must be 1..16)" },
	/* integer keys: the number's text decides, not the double it rounds to */
	{ "{\"rings\": {\"spin_ns\": 1e-400}}",
	  "$.rings.spin_ns: wrong type: expected unsigned integer, got fractional number 1e-400" },
	{ "{\"rings\": {\"spin_ns\": -1e-400}}",
	  "$.rings.spin_ns: wrong type: expected unsigned integer, got fractional number -1e-400" },
	{ "{\"l1\": {\"capacity_bytes\": 1e-400, \"workload_prompts\": 1, \"workload_tokens\": 1}}",
	  "$.l1.capacity_bytes: wrong type: expected unsigned integer, got fractional number 1e-400" },
	{ "{\"supervisor\": {\"drain_timeout_ms\": 0.3}}",
	  "$.supervisor.drain_timeout_ms: wrong type: expected unsigned integer, got fractional number 0.3" },
	{ "{\"supervisor\": {\"drain_timeout_ms\": 1E-5}}",
	  "$.supervisor.drain_timeout_ms: wrong type: expected unsigned integer, got fractional number 1E-5" },
	{ "{\"rings\": {\"capacity\": 1024.0000000000001}}",
	  "$.rings.capacity: wrong type: expected unsigned integer, got fractional number 1024.0000000000001" },
	{ "{\"staging\": {\"buffer_bytes\": 40960.00000000001e-1}}",
	  "$.staging.buffer_bytes: wrong type: expected unsigned integer, got fractional number 40960.00000000001e-1" },
	/* numbers inside strings are not numbers: the texts pair with the right nodes */
	{ "{\"model\": {\"model_id\": \"-1 2.5e3 \\\"7\\\" 0.5\"}, \"rings\": {\"capacity\": [1], \"spin_ns\": 2.5}}",
	  "$.rings.capacity: wrong type: expected unsigned integer, got array" },
	{ "{\"model\": {\"model_id\": \"-1 2.5e3 \\\"7\\\" 0.5\"}, \"rings\": {\"spin_ns\": 1e-400}}",
	  "$.rings.spin_ns: wrong type: expected unsigned integer, got fractional number 1e-400" },
	{ "{\"l1\": {\"capacity_bytes\": \"0.0000001GiB\"}}",
	  "$.l1.capacity_bytes: invalid size \"0.0000001GiB\" (bytes, or a string like \"512MiB\"; units B, KiB, MiB, "
	  "GiB, TiB, PiB)" },
	/* strings are UTF-8: anything else would make the effective config stop being JSON */
	{ "{\"model\": {\"model_id\": \"\xff\"}}", "$.model.model_id: not valid UTF-8: byte 0xff at offset 0" },
	{ "{\"model\": {\"model_id\": \"caf\xc3\"}}", "$.model.model_id: not valid UTF-8: byte 0xc3 at offset 3" },
	{ "{\"model\": {\"model_id\": \"caf\xc3\xa9\x80\"}}",
	  "$.model.model_id: not valid UTF-8: byte 0x80 at offset 5" },
	{ "{\"model\": {\"cache_salt\": \"\xc0\xaf\"}}", /* overlong '/' */
	  "$.model.cache_salt: not valid UTF-8: byte 0xc0 at offset 0" },
	{ "{\"model\": {\"cache_salt\": \"a\xe0\x80\xaf\"}}", /* overlong, 3 bytes */
	  "$.model.cache_salt: not valid UTF-8: byte 0xe0 at offset 1" },
	{ "{\"model\": {\"cache_salt\": \"ab\xed\xa0\x80\"}}", /* the surrogate U+D800 */
	  "$.model.cache_salt: not valid UTF-8: byte 0xed at offset 2" },
	{ "{\"model\": {\"cache_salt\": \"\xf4\x90\x80\x80\"}}", /* U+110000 */
	  "$.model.cache_salt: not valid UTF-8: byte 0xf4 at offset 0" },
	{ "{\"model\": {\"cache_salt\": \"\xf8\x88\x80\x80\x80\"}}",
	  "$.model.cache_salt: not valid UTF-8: byte 0xf8 at offset 0" },
	{ "{\"instance\": {\"socket\": \"/tmp/k\xfe.sock\"}}", "$.instance.socket: not valid UTF-8: byte 0xfe at offset 6" },
	{ "{\"instance\": {\"actor_dir\": \"\x80\"}}", "$.instance.actor_dir: not valid UTF-8: byte 0x80 at offset 0" },
	{ "{\"metrics\": {\"listen\": \"h\xff:1\"}}", "$.metrics.listen: not valid UTF-8: byte 0xff at offset 1" },
	{ "{\"l2\": {\"dirs\": [\"/a\", \"/b\xc3\x28\"], \"capacity_bytes\": \"1TiB\"}}",
	  "$.l2.dirs[1]: not valid UTF-8: byte 0xc3 at offset 2" },
	/* and a refusal never echoes the bytes: its message stays UTF-8 */
	{ "{\"l1\": {\"eviction\": \"lr\xffu\"}}", "$.l1.eviction: invalid value \"lr?u\" (one of: lru, s3fifo)" },
	{ "{\"\xff\xfe\": {}}", "$.??: unknown key" },
	{ "{\"l1\": {\"caf\xc3\xa9\xc3\": 1}}", "$.l1.caf\xc3\xa9?: unknown key" },
	/* not JSON: position of the error */
	{ "", "config: not valid JSON near line 1 column 1" },
	{ "{\"rings\": {\"capacity\": 1024,}}", "config: not valid JSON near line 1 column 30" },
	{ "{\n  \"rings\": {\n    \"capacity\": 1024\n  }\n", "config: not valid JSON near line 5 column 1" },
	{ "{\n  \"l1\": {\n    \"eviction\": lru\n  }\n}\n", "config: not valid JSON near line 3 column 17" },
	{ "{} {}", "config: not valid JSON near line 1 column 4" },
	{ "{\"model\": {\"model_id\": \"a\\u0000b\"}}", "config: \\u0000 in a string near line 1 column 26" },
	/* too long */
	{ "{\"instance\": {\"socket\": \"" S108 "\"}}", "$.instance.socket: too long (max 107)" },
	{ "{\"model\": {\"model_id\": \"" S128 "\"}}", "$.model.model_id: too long (max 127)" },
	{ "{\"l2\": {\"dirs\": [\"/a\", \"" S108 "\"], \"capacity_bytes\": 1}}", "$.l2.dirs[1]: too long (max 107)" },
	{ "{\"metrics\": {\"listen\": \"" S128 "\"}}", "$.metrics.listen: too long (max 63)" },
	/* paths */
	{ "{\"instance\": {\"socket\": \"kvring.sock\"}}", "$.instance.socket: not an absolute path: \"kvring.sock\"" },
	{ "{\"instance\": {\"socket\": \"\"}}", "$.instance.socket: not an absolute path: \"\"" },
	{ "{\"instance\": {\"actor_dir\": \"build/actors\"}}",
	  "$.instance.actor_dir: not an absolute path: \"build/actors\"" },
	{ "{\"l2\": {\"dirs\": [\"data\"]}}", "$.l2.dirs[0]: not an absolute path: \"data\"" },
	{ "{\"l2\": {\"dirs\": [\"/a\", \"/b\", \"/a\"], \"capacity_bytes\": 1}}",
	  "$.l2.dirs[2]: duplicate of $.l2.dirs[0]: \"/a\" is the same directory as \"/a\"" },
	/* one directory, spelt twice: two disk actors would share one store */
	{ "{\"l2\": {\"dirs\": [\"/x/l2\", \"/x/l2/\"], \"capacity_bytes\": \"1TiB\"}}",
	  "$.l2.dirs[1]: duplicate of $.l2.dirs[0]: \"/x/l2/\" is the same directory as \"/x/l2\"" },
	{ "{\"l2\": {\"dirs\": [\"/y\", \"/x/./l2\", \"/x/l2\"], \"capacity_bytes\": \"1TiB\"}}",
	  "$.l2.dirs[2]: duplicate of $.l2.dirs[1]: \"/x/l2\" is the same directory as \"/x/./l2\"" },
	{ "{\"l2\": {\"dirs\": [\"//x//l2//\", \"/x/l2/.\"], \"capacity_bytes\": \"1TiB\"}}",
	  "$.l2.dirs[1]: duplicate of $.l2.dirs[0]: \"/x/l2/.\" is the same directory as \"//x//l2//\"" },
	{ "{\"l2\": {\"dirs\": [\"/\", \"/./\"], \"capacity_bytes\": \"1TiB\"}}",
	  "$.l2.dirs[1]: duplicate of $.l2.dirs[0]: \"/./\" is the same directory as \"/\"" },
	{ "{\"l2\": {\"dirs\": [\"/a\",\"/b\",\"/c\",\"/d\",\"/e\",\"/f\",\"/g\",\"/h\",\"/i\"], "
	  "\"capacity_bytes\": 1}}",
	  "$.l2.dirs: too many entries: 9 (max 8)" },
	/* an actor needs more than a millisecond to exec, map its segments and attach its rings */
	{ "{\"supervisor\": {\"ready_timeout_ms\": 1}}",
	  "$.supervisor.ready_timeout_ms: out of range: 1 (must be 100..600000)" },
	{ "{\"supervisor\": {\"ready_timeout_ms\": 99}}",
	  "$.supervisor.ready_timeout_ms: out of range: 99 (must be 100..600000)" },
	/* checks across keys */
	{ "{\"rings\": {\"capacity\": 1000}}", "$.rings.capacity: 1000 is not a power of two" },
	{ "{\"timeouts\": {\"reply_ms\": 5000}}",
	  "$.timeouts.reply_ms: 5000 must be below timeouts.alloc_wait_ms (5000): a reply dropped for a full ring "
	  "must not outlast a wait for room" },
	{ "{\"timeouts\": {\"alloc_wait_ms\": 12000}}",
	  "$.timeouts.alloc_wait_ms: 12000 must be below timeouts.lookup_call_ms (10000): the storer would give up on "
	  "an ALLOC the lookup actor still holds" },
	{ "{\"timeouts\": {\"l2_answer_ms\": 10000}}",
	  "$.timeouts.l2_answer_ms: 10000 must be below timeouts.lookup_call_ms (10000)" },
	{ "{\"model\": {\"preset\": \"deepseek-v3\", \"kv_layout\": \"kv-fused\"}}",
	  "$.model.kv_layout: \"kv-fused\" is for K and V pages (mha); an mla layer has one latent page already" },
	{ "{\"model\": {\"kv_layout\": \"fused\"}}",
	  "$.model.kv_layout: invalid value \"fused\" (one of: kv-split, kv-fused)" },
	{ "{\"instance\": {\"max_schedulers\": 17}}",
	  "$.instance.max_schedulers: out of range: 17 (must be 0..16)" },
	{ "{\"supervisor\": {\"restart_backoff_initial_ms\": 6000}}",
	  "$.supervisor.restart_backoff_initial_ms: 6000 exceeds supervisor.restart_backoff_max_ms (5000)" },
	{ "{\"supervisor\": {\"restart_backoff_initial_ms\": 50, \"restart_backoff_max_ms\": 49}}",
	  "$.supervisor.restart_backoff_initial_ms: 50 exceeds supervisor.restart_backoff_max_ms (49)" },
	{ "{\"model\": {\"preset\": \"\", \"layers\": 40}}", "$.model.kv_heads: required when model.preset is empty" },
	/* no model: the keys that describe one are refused, not ignored */
	{ "{\"model\": {\"attention\": \"mla\"}}",
	  "$.model.attention: given without a model: set model.preset (or model.layers, kv_heads, head_dim, dtype_bytes), "
	  "or leave it out and the instance takes the first worker's geometry" },
	{ "{\"model\": {\"model_id\": \"org/m\", \"block_tokens\": 16}}",
	  "$.model.block_tokens: given without a model: set model.preset (or model.layers, kv_heads, head_dim, "
	  "dtype_bytes), or leave it out and the instance takes the first worker's geometry" },
	{ "{\"model\": {\"preset\": \"\", \"layers\": 40, \"kv_heads\": 4}}",
	  "$.model.head_dim: required when model.preset is empty" },
	{ "{\"model\": {\"preset\": \"\", \"layers\": 40, \"kv_heads\": 4, \"head_dim\": 128}}",
	  "$.model.dtype_bytes: required when model.preset is empty" },
	{ "{\"model\": {\"preset\": \"qwen3-8b\", \"layers\": 40}}", "$.model.layers: 40 conflicts with model.preset \"qwen3-8b\" (36)" },
	{ "{\"model\": {\"preset\": \"llama-3.1-8b\", \"kv_heads\": 4}}",
	  "$.model.kv_heads: 4 conflicts with model.preset \"llama-3.1-8b\" (8)" },
	{ "{\"model\": {\"preset\": \"qwen3-8b\", \"attention\": \"mla\"}}",
	  "$.model.attention: \"mla\" conflicts with model.preset \"qwen3-8b\" (mha)" },
	{ "{\"model\": {\"preset\": \"\", \"layers\": 40, \"kv_heads\": 4, \"head_dim\": 128, \"dtype_bytes\": 3}}",
	  "$.model.dtype_bytes: 3 is not 1, 2 or 4" },
	/* an explicit geometry needs a model identity: the namespace would not tell two models apart */
	{ "{\"model\": {\"preset\": \"\", \"layers\": 40, \"kv_heads\": 4, \"head_dim\": 128, \"dtype_bytes\": 2}}",
	  "$.model.model_id: required when model.preset is empty (without it two models of one geometry would share "
	  "blocks)" },
	/* a socket its owner cannot connect to (nobody else may attach) */
	{ "{\"instance\": {\"socket_mode\": \"0000\"}}",
	  "$.instance.socket_mode: \"0000\" lacks owner write (0200): only the instance owner may attach, and "
	  "connecting needs write permission" },
	{ "{\"instance\": {\"socket_mode\": \"0466\"}}",
	  "$.instance.socket_mode: \"0466\" lacks owner write (0200): only the instance owner may attach, and "
	  "connecting needs write permission" },
	{ "{\"model\": {\"preset\": \"deepseek-v2-lite\", \"attention\": \"mha\"}}",
	  "$.model.attention: \"mha\" conflicts with model.preset \"deepseek-v2-lite\" (mla)" },
	{ "{\"model\": {\"preset\": \"qwen3-8b\", \"tp_size\": 16}}",
	  "$.model.tp_size: 16 exceeds instance.max_workers (8): each rank of a TP group attaches as one worker, so no "
	  "group could ever be complete" },
	{ "{\"instance\": {\"max_workers\": 2}, \"model\": {\"preset\": \"deepseek-v2-lite\", \"tp_size\": 4}}",
	  "$.model.tp_size: 4 exceeds instance.max_workers (2): each rank of a TP group attaches as one worker, so no "
	  "group could ever be complete" },
	{ "{\"model\": {\"preset\": \"qwen3-8b\", \"tp_size\": 3}}",
	  "$.model.tp_size: 3 neither divides model.kv_heads (8) nor is a multiple of it" },
	{ "{\"model\": {\"preset\": \"\", \"model_id\": \"m\", \"layers\": 40, \"kv_heads\": 6, \"head_dim\": 128, "
	  "\"dtype_bytes\": 2, \"tp_size\": 4}}",
	  "$.model.tp_size: 4 neither divides model.kv_heads (6) nor is a multiple of it" },
	{ "{\"l1\": {\"capacity_bytes\": 0}}", "$.l1.workload_prompts: required when l1.capacity_bytes is 0" },
	/* the workload keys size L1 only when its capacity is 0: else they would be ignored */
	{ "{\"l1\": {\"workload_prompts\": 200, \"workload_tokens\": 10000}}",
	  "$.l1.workload_prompts: only used when l1.capacity_bytes is 0 (it is 1073741824)" },
	{ "{\"l1\": {\"capacity_bytes\": \"2GiB\", \"workload_tokens\": 10000}}",
	  "$.l1.workload_tokens: only used when l1.capacity_bytes is 0 (it is 2147483648)" },
	{ "{\"l1\": {\"capacity_bytes\": \"0\", \"workload_prompts\": 10}}",
	  "$.l1.workload_tokens: required when l1.capacity_bytes is 0" },
	{ "{\"staging\": {\"buffer_bytes\": \"200MiB\"}}",
	  "$.staging.buffer_bytes: 209715200 does not fit the load pool (134217728 bytes)" },
	{ "{\"staging\": {\"buffer_bytes\": \"100MiB\", \"load_percent\": 80}}",
	  "$.staging.buffer_bytes: 104857600 does not fit the store pool (53687092 bytes)" },
	/* qwen3-8b, one rank: 36 layers x 8 heads x 128 x 2 bytes x 128 tokens x (K, V) = 18874368 */
	{ "{\"model\": {\"preset\": \"qwen3-8b\"}, \"staging\": {\"ceiling_bytes\": \"16MiB\"}}",
	  "$.staging.ceiling_bytes: the load pool (8388608 bytes) cannot hold one block (18874368 bytes)" },
	{ "{\"l2\": {\"dirs\": [\"/mnt/a\"]}}", "$.l2.capacity_bytes: required when l2.dirs is not empty" },
	/* qwen3-8b: one block file is 4096 + 18874368 bytes; a dir whose share is smaller could store nothing */
	{ "{\"model\": {\"preset\": \"qwen3-8b\"}, \"l2\": {\"dirs\": [\"/mnt/a\"], \"capacity_bytes\": \"16MiB\"}}",
	  "$.l2.capacity_bytes: 16777216 split over 1 l2.dirs leaves 16777216 bytes a dir, less than one block file "
	  "(18878464 bytes)" },
	{ "{\"model\": {\"preset\": \"qwen3-8b\"}, \"l2\": {\"dirs\": [\"/mnt/a\", \"/mnt/b\"], \"capacity_bytes\": 37756927}}",
	  "$.l2.capacity_bytes: 37756927 split over 2 l2.dirs leaves 18878463 bytes a dir, less than one block file "
	  "(18878464 bytes)" },
	{ "{\"model\": {\"preset\": \"qwen3-8b\"}, \"l2\": {\"dirs\": [\"/mnt/a\"], \"capacity_bytes\": 1, \"read_only\": true}}",
	  "$.l2.capacity_bytes: 1 split over 1 l2.dirs leaves 1 bytes a dir, less than one block file (18878464 bytes)" },
	{ "{\"l2\": {\"read_only\": true}}", "$.l2.read_only: needs l2.dirs (there is no disk store to serve)" },
	{ "{\"l2\": {\"dirs\": [], \"read_only\": true, \"capacity_bytes\": \"1GiB\"}}",
	  "$.l2.read_only: needs l2.dirs (there is no disk store to serve)" },
	{ "{\"l2\": {\"dirs\": [\"/mnt/a\"], \"read_only\": true}}",
	  "$.l2.capacity_bytes: required when l2.dirs is not empty" },
	{ "{\"metrics\": {\"enabled\": true, \"listen\": \"localhost\"}}",
	  "$.metrics.listen: invalid \"localhost\" (expected host:port, port 1..65535)" },
	{ "{\"metrics\": {\"enabled\": true, \"listen\": \"127.0.0.1:0\"}}",
	  "$.metrics.listen: invalid \"127.0.0.1:0\" (expected host:port, port 1..65535)" },
	{ "{\"metrics\": {\"enabled\": true, \"listen\": \"127.0.0.1:65536\"}}",
	  "$.metrics.listen: invalid \"127.0.0.1:65536\" (expected host:port, port 1..65535)" },
	{ "{\"metrics\": {\"enabled\": true, \"listen\": \":9464\"}}",
	  "$.metrics.listen: invalid \":9464\" (expected host:port, port 1..65535)" },
	{ "{\"metrics\": {\"enabled\": true, \"listen\": \"::1:9464\"}}",
	  "$.metrics.listen: invalid \"::1:9464\" (expected host:port, port 1..65535)" },
};

Test(config, bad_inputs)
{
	cr_assert_geq(ARRAY_SIZE(bad_cases), 25);
	for (size_t i = 0; i < ARRAY_SIZE(bad_cases); i++) {
		struct kvr_config c;
		char err[512];
		int r;

		fill_pattern(&c);
		memset(err, 'x', sizeof(err));
		r = kvr_config_parse(bad_cases[i].json, &c, err, sizeof(err));
		cr_expect_eq(r, -EINVAL, "case %zu %s: returned %d", i, bad_cases[i].json, r);
		cr_expect_str_eq(err, bad_cases[i].err, "case %zu %s: got\n%s", i, bad_cases[i].json, err);
		cr_expect(is_pattern(&c), "case %zu %s: *cfg was changed on failure", i, bad_cases[i].json);
	}
}

enum vkind { V_U32, V_U64, V_BOOL, V_STR };

struct good_case {
	const char *json;
	size_t off;
	enum vkind kind;
	uint64_t u;
	const char *s;
};

#define GU32(j, f, v) { j, offsetof(struct kvr_config, f), V_U32, v, NULL }
#define GU64(j, f, v) { j, offsetof(struct kvr_config, f), V_U64, v, NULL }
#define GBOOL(j, f, v) { j, offsetof(struct kvr_config, f), V_BOOL, v, NULL }
#define GSTR(j, f, v) { j, offsetof(struct kvr_config, f), V_STR, 0, v }

static const struct good_case good_cases[] = {
	GU64("{\"l1\": {\"capacity_bytes\": \"512MiB\"}}", l1.capacity_bytes, 512ull << 20),
	GU64("{\"l1\": {\"capacity_bytes\": \"2GiB\"}}", l1.capacity_bytes, 2ull << 30),
	GU64("{\"l1\": {\"capacity_bytes\": 1073741824}}", l1.capacity_bytes, 1073741824ull),
	GU64("{\"l1\": {\"capacity_bytes\": \"64GiB\"}}", l1.capacity_bytes, 64ull << 30),
	GU64("{\"l1\": {\"capacity_bytes\": \"3TiB\"}}", l1.capacity_bytes, 3ull << 40),
	GU64("{\"l1\": {\"capacity_bytes\": \"1PiB\"}}", l1.capacity_bytes, 1ull << 50),
	GU64("{\"l1\": {\"capacity_bytes\": 1125899906842624}}", l1.capacity_bytes, 1ull << 50),
	GU64("{\"l1\": {\"capacity_bytes\": \"4096\"}}", l1.capacity_bytes, 4096),
	GU64("{\"l1\": {\"capacity_bytes\": \"4097B\"}}", l1.capacity_bytes, 4097),
	GU64("{\"l1\": {\"capacity_bytes\": \"8KiB\"}}", l1.capacity_bytes, 8192),
	GU64("{\"l1\": {\"capacity_bytes\": 1e9}}", l1.capacity_bytes, 1000000000ull),
	GU64("{\"l1\": {\"capacity_bytes\": 0, \"workload_prompts\": 200, \"workload_tokens\": 10000}}",
	     l1.capacity_bytes, 0),
	GU32("{\"l1\": {\"capacity_bytes\": 0, \"workload_prompts\": 200, \"workload_tokens\": 10000}}",
	     l1.workload_prompts, 200),
	GU64("{\"staging\": {\"ceiling_bytes\": \"64MiB\", \"buffer_bytes\": \"4MiB\"}}", staging.buffer_bytes,
	     4ull << 20),
	GU32("{\"supervisor\": {\"restart_backoff_max_ms\": 600000}}", supervisor.restart_backoff_max_ms, 600000),
	GU32("{\"supervisor\": {\"restart_backoff_initial_ms\": 5000}}", supervisor.restart_backoff_initial_ms, 5000),
	GU32("{\"rings\": {\"capacity\": 2}}", rings.capacity, 2),
	GU32("{\"rings\": {\"capacity\": 1048576}}", rings.capacity, 1048576),
	GU32("{\"rings\": {\"capacity\": 2048.0}}", rings.capacity, 2048),
	GU32("{\"rings\": {\"spin_ns\": -0}}", rings.spin_ns, 0),
	/* integral texts in every JSON form */
	GU32("{\"rings\": {\"capacity\": 1.024e3}}", rings.capacity, 1024),
	GU32("{\"rings\": {\"capacity\": 10240e-1}}", rings.capacity, 1024),
	GU32("{\"rings\": {\"capacity\": 0.1024E+4}}", rings.capacity, 1024),
	GU32("{\"rings\": {\"capacity\": 1024.000}}", rings.capacity, 1024),
	GU32("{\"rings\": {\"spin_ns\": 0e400}}", rings.spin_ns, 0),
	GU32("{\"rings\": {\"spin_ns\": -0.0e-5}}", rings.spin_ns, 0),
	GU32("{\"rings\": {\"spin_ns\": 0.000}}", rings.spin_ns, 0),
	GU64("{\"l1\": {\"capacity_bytes\": 11258999068426.24e2}}", l1.capacity_bytes, 1ull << 50),
	GU32("{\"model\": {\"model_id\": \"0.5 1e-400\"}, \"rings\": {\"spin_ns\": 7}}", rings.spin_ns, 7),
	GU32("{\"supervisor\": {\"ready_timeout_ms\": 100}}", supervisor.ready_timeout_ms, 100),
	GU32("{\"instance\": {\"socket_mode\": \"0660\"}}", instance.socket_mode, 0660),
	GU32("{\"instance\": {\"socket_mode\": \"600\"}}", instance.socket_mode, 0600),
	GU32("{\"instance\": {\"socket_mode\": \"0200\"}}", instance.socket_mode, 0200),
	GU32("{\"instance\": {\"max_workers\": 16}}", instance.max_workers, 16),
	GSTR("{\"instance\": {\"socket\": \"/run/kvring/k.sock\"}}", instance.socket, "/run/kvring/k.sock"),
	/* 107 bytes: the longest socket path that fits sun_path */
	GSTR("{\"instance\": {\"socket\": \"" S107 "\"}}", instance.socket, S107),
	GSTR("{\"instance\": {\"log_level\": \"debug\"}}", instance.log_level, "debug"),
	GSTR("{\"instance\": {\"actor_dir\": \"/opt/kvring\"}}", instance.actor_dir, "/opt/kvring"),
	GSTR("{\"l1\": {\"eviction\": \"lru\"}}", l1.eviction, "lru"),
	GBOOL("{\"l1\": {\"huge_pages\": false}}", l1.huge_pages, false),
	GBOOL("{\"metrics\": {\"enabled\": true}}", metrics.enabled, true),
	GSTR("{\"metrics\": {\"enabled\": true, \"listen\": \"[::1]:9090\"}}", metrics.listen, "[::1]:9090"),
	GSTR("{\"metrics\": {\"enabled\": true, \"listen\": \"0.0.0.0:65535\"}}", metrics.listen, "0.0.0.0:65535"),
	/* not checked while disabled */
	GSTR("{\"metrics\": {\"listen\": \"nonsense\"}}", metrics.listen, "nonsense"),
	GSTR("{\"l2\": {\"mode\": \"write-back\", \"durability\": \"block\"}}", l2.mode, "write-back"),
	GSTR("{\"l2\": {\"durability\": \"none\"}}", l2.durability, "none"),
	GU32("{\"l2\": {\"dirs\": [\"/a\", \"/b\", \"/c\"], \"capacity_bytes\": \"1TiB\"}}", l2.n_dirs, 3),
	GSTR("{\"l2\": {\"dirs\": [\"/a\", \"/b\", \"/mnt/nvme1/kv\"], \"capacity_bytes\": \"1TiB\"}}", l2.dirs[2],
	     "/mnt/nvme1/kv"),
	GU32("{\"l2\": {\"dirs\": [], \"capacity_bytes\": 0}}", l2.n_dirs, 0),
	GU32("{\"l2\": {\"dirs\": [\"/a\",\"/b\",\"/c\",\"/d\",\"/e\",\"/f\",\"/g\",\"/h\"], \"capacity_bytes\": "
	     "\"1TiB\"}}", l2.n_dirs, 8),
	/* distinct however alike they look; ".." is kept (through a symlink it is not where it looks) */
	GU32("{\"l2\": {\"dirs\": [\"/x/l2\", \"/x/l22\", \"/x/l2/sub\", \"/x/y/../l2\"], \"capacity_bytes\": \"1TiB\"}}",
	     l2.n_dirs, 4),
	GSTR("{\"l2\": {\"dirs\": [\"/x/l2/\", \"/y\"], \"capacity_bytes\": \"1TiB\"}}", l2.dirs[0], "/x/l2/"),
	/* each dir's share holds exactly one block file of qwen3-8b */
	GU64("{\"l2\": {\"dirs\": [\"/mnt/a\", \"/mnt/b\"], \"capacity_bytes\": 37756928}}", l2.capacity_bytes,
	     37756928),
	GU32("{\"l2\": {\"queue_depth\": 1}}", l2.queue_depth, 1),
	GBOOL("{\"l2\": {\"dirs\": [\"/srv/kv16\"], \"capacity_bytes\": \"1TiB\", \"read_only\": true}}", l2.read_only,
	      true),
	GBOOL("{\"l2\": {\"read_only\": false}}", l2.read_only, false),
	/* model: explicit geometry (GLM-4-9B of DESIGN.md section 4), presets, MLA, values equal to a preset's */
	GU32("{\"model\": {\"preset\": \"\", \"model_id\": \"m\", \"layers\": 40, \"kv_heads\": 4, \"head_dim\": 128, "
	     "\"dtype_bytes\": 2, \"tp_size\": 2}}", model.kv_heads, 4),
	GSTR("{\"model\": {\"preset\": \"\", \"model_id\": \"THUDM/glm-4-9b\", \"layers\": 40, \"kv_heads\": 4, "
	     "\"head_dim\": 128, \"dtype_bytes\": 2}}", model.model_id, "THUDM/glm-4-9b"),
	GU32("{\"model\": {\"preset\": \"qwen3-32b\"}}", model.layers, 64),
	GSTR("{\"model\": {\"preset\": \"qwen3-32b\"}}", model.model_id, "Qwen/Qwen3-32B"),
	/* TP over more ranks than KV heads: heads replicated, as vLLM does */
	GU32("{\"model\": {\"preset\": \"glm-4-9b-chat-1m\", \"tp_size\": 8}}", model.tp_size, 8),
	GU32("{\"model\": {\"preset\": \"glm-4-9b-chat-1m\", \"tp_size\": 2}}", model.kv_heads, 4),
	/* an MLA preset brings its attention kind; TP does not split the latent */
	GSTR("{\"instance\": {\"max_workers\": 16}, \"model\": {\"preset\": \"deepseek-v2-lite\", \"tp_size\": 16}}",
	     model.attention, "mla"),
	/* as many workers as TP ranks is enough */
	GU32("{\"instance\": {\"max_workers\": 2}, \"model\": {\"preset\": \"qwen3-8b\", \"tp_size\": 2}}", model.tp_size, 2),
	GU32("{\"model\": {\"preset\": \"deepseek-v2-lite\", \"attention\": \"mla\"}}", model.head_dim, 576),
	GSTR("{\"model\": {\"preset\": \"qwen3-32b\", \"model_id\": \"Qwen/Qwen3-32B-AWQ\"}}", model.model_id,
	     "Qwen/Qwen3-32B-AWQ"),
	GU32("{\"model\": {\"preset\": \"llama-3.1-8b\"}}", model.layers, 32),
	GU32("{\"model\": {\"preset\": \"qwen3-8b\", \"layers\": 36, \"kv_heads\": 8}}", model.layers, 36),
	GU32("{\"model\": {\"preset\": \"qwen3-8b\", \"layers\": 0}}", model.layers, 36),
	GU32("{\"model\": {\"preset\": \"qwen3-8b\", \"tp_size\": 8}}", model.tp_size, 8),
	GU32("{\"model\": {\"preset\": \"qwen3-8b\", \"block_tokens\": 16}}", model.block_tokens, 16),
	GSTR("{\"model\": {\"preset\": \"qwen3-8b\", \"attention\": \"mha\"}}", model.attention, "mha"),
	GSTR("{\"model\": {\"preset\": \"\", \"model_id\": \"m\", \"layers\": 27, \"kv_heads\": 1, \"head_dim\": 576, "
	     "\"dtype_bytes\": 2, \"tp_size\": 4, \"attention\": \"mla\"}}", model.attention, "mla"),
	GU32("{\"model\": {\"preset\": \"\", \"model_id\": \"m\", \"layers\": 27, \"kv_heads\": 1, \"head_dim\": 576, "
	     "\"dtype_bytes\": 2, \"tp_size\": 4, \"attention\": \"mla\"}}", model.tp_size, 4),
	GU32("{\"model\": {\"preset\": \"\", \"model_id\": \"m\", \"layers\": 2, \"kv_heads\": 2, \"head_dim\": 64, "
	     "\"dtype_bytes\": 1}}", model.dtype_bytes, 1),
	GU32("{\"model\": {\"preset\": \"\", \"model_id\": \"m\", \"layers\": 2, \"kv_heads\": 2, \"head_dim\": 64, "
	     "\"dtype_bytes\": 4}}", model.dtype_bytes, 4),
	GSTR("{\"model\": {\"cache_salt\": \"tenant-7\"}}", model.cache_salt, "tenant-7"),
	GSTR("{\"model\": {\"model_id\": \"caf\\u00e9 \\\"x\\\"\"}}", model.model_id, "caf\xc3\xa9 \"x\""),
	/* raw UTF-8 of every length, kept byte for byte */
	GSTR("{\"model\": {\"model_id\": \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xed\x9f\xbf\"}}", model.model_id,
	     "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xed\x9f\xbf"),
	GU32("{\"staging\": {\"load_percent\": 99, \"ceiling_bytes\": \"4GiB\"}}", staging.load_percent, 99),
};

Test(config, good_inputs)
{
	for (size_t i = 0; i < ARRAY_SIZE(good_cases); i++) {
		const struct good_case *g = &good_cases[i];
		const char *json = g->json;
		struct kvr_config c;
		char err[512];
		int r;

		fill_pattern(&c);
		r = kvr_config_parse(json, &c, err, sizeof(err));
		cr_expect_eq(r, 0, "case %zu %s: %d %s", i, json, r, err);
		if (r)
			continue;
		const char *f = (const char *)&c + g->off;
		uint32_t u32;
		uint64_t u64;
		switch (g->kind) {
		case V_U32:
			memcpy(&u32, f, sizeof(u32));
			cr_expect_eq(u32, g->u, "case %zu %s: %" PRIu32 " != %" PRIu64, i, json, u32, g->u);
			break;
		case V_U64:
			memcpy(&u64, f, sizeof(u64));
			cr_expect_eq(u64, g->u, "case %zu %s: %" PRIu64 " != %" PRIu64, i, json, u64, g->u);
			break;
		case V_BOOL:
			cr_expect_eq(*(const bool *)f, g->u != 0, "case %zu %s", i, json);
			break;
		case V_STR:
			cr_expect_str_eq(f, g->s, "case %zu %s", i, json);
			break;
		}
	}
}

/* Every preset of kv/presets.c fills the geometry it names; the preset list is the enum's. */
Test(config, presets)
{
	const struct kvr_preset *p;
	char want[1024], err[1024];
	struct kvr_config d;
	unsigned i;

	cr_assert_gt(kvr_preset_count(), 0);
	for (i = 0; (p = kvr_preset_at(i)); i++) {
		struct kvr_config c;
		char json[128];

		snprintf(json, sizeof(json), "{\"model\": {\"preset\": \"%s\"}}", p->name);
		cr_assert_eq(kvr_config_parse(json, &c, err, sizeof(err)), 0, "%s: %s", json, err);
		cr_expect_str_eq(c.model.preset, p->name);
		cr_expect_eq(c.model.layers, p->layers, "%s", p->name);
		cr_expect_eq(c.model.kv_heads, p->kv_heads_total, "%s", p->name);
		cr_expect_eq(c.model.head_dim, p->head_dim, "%s", p->name);
		cr_expect_eq(c.model.dtype_bytes, p->dtype_bytes, "%s", p->name);
		cr_expect_str_eq(c.model.attention, p->attention == KVR_ATTN_MLA ? "mla" : "mha", "%s", p->name);
		cr_expect_str_eq(c.model.model_id, p->hf_id, "%s", p->name);
	}
	cr_assert_eq(i, kvr_preset_count());

	/* an unknown preset lists "" and every preset */
	snprintf(want, sizeof(want), "$.model.preset: invalid value \"gpt-5\" (one of: \"\", %s)", kvr_preset_list());
	cr_assert_eq(kvr_config_parse("{\"model\": {\"preset\": \"gpt-5\"}}", &d, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, want);
}

Test(config, round_trip)
{
	struct kvr_config a, b, d;
	char err[512];
	char *j1, *j2;

	cr_assert_eq(kvr_config_parse(full_json, &a, err, sizeof(err)), 0, "%s", err);
	kvr_config_defaults(&d);
	/* full_json really sets every key to something else than its default */
	cr_assert_neq(memcmp(&a, &d, sizeof(a)), 0);
	cr_assert_str_eq(a.model.model_id, "org/M \"q\" \\ \t \xc3\xa9\n");
	cr_assert_eq(a.l2.n_dirs, 2);
	cr_assert_str_eq(a.l2.dirs[1], "/mnt/b");
	cr_assert_eq(a.l2.capacity_bytes, 64ull << 30);
	cr_assert_eq(a.l2.read_only, true);
	cr_assert_eq(a.staging.ceiling_bytes, 1ull << 30);
	cr_assert_eq(a.instance.socket_mode, 0660);

	j1 = kvr_config_to_json(&a);
	cr_assert_not_null(j1);
	fill_pattern(&b);
	cr_assert_eq(kvr_config_parse(j1, &b, err, sizeof(err)), 0, "%s\n%s", err, j1);
	cr_assert_eq(memcmp(&a, &b, sizeof(a)), 0, "parse(to_json(cfg)) differs from cfg:\n%s", j1);
	j2 = kvr_config_to_json(&b);
	cr_assert_not_null(j2);
	cr_assert_str_eq(j1, j2);
	/* sizes are integers of bytes, modes octal strings, arrays inline */
	cr_assert_not_null(strstr(j1, "\n    \"capacity_bytes\": 68719476736,\n"), "%s", j1);
	cr_assert_not_null(strstr(j1, "\n    \"ceiling_bytes\": 1073741824,\n"), "%s", j1);
	cr_assert_not_null(strstr(j1, "\n    \"socket_mode\": \"0660\",\n"), "%s", j1);
	cr_assert_not_null(strstr(j1, "\n    \"dirs\": [\"/mnt/a\", \"/mnt/b\"],\n"), "%s", j1);
	cr_assert_not_null(strstr(j1, "\n    \"queue_depth\": 4096,\n    \"read_only\": true\n  },\n"), "%s", j1);
	cr_assert_not_null(strstr(j1, "\n    \"model_id\": \"org/M \\\"q\\\" \\\\ \\u0009 \xc3\xa9\\u000a\",\n"), "%s",
			   j1);
	free(j1);
	free(j2);

	/* the defaults round-trip too */
	j1 = kvr_config_to_json(&d);
	cr_assert_not_null(j1);
	cr_assert_eq(kvr_config_parse(j1, &b, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(&d, &b, sizeof(d)), 0);
	cr_assert_not_null(strstr(j1, "\n    \"capacity_bytes\": 1073741824,\n"), "%s", j1);
	cr_assert_not_null(strstr(j1, "\n    \"dirs\": [],\n"), "%s", j1);
	cr_assert_eq(strncmp(j1, "{\n  \"instance\": {\n    \"socket\": \"/tmp/kvring.sock\",\n", 50), 0, "%s", j1);
	const char *tail = "\n    \"lookup_call_ms\": 10000\n  }\n}\n";
	cr_assert_str_eq(j1 + strlen(j1) - strlen(tail), tail);
	free(j1);
}

/* The effective JSON has every key exactly once, in table (= docs) order, and nothing else. */
Test(config, to_json_keys)
{
	static const char *const sections[] = { "instance", "rings", "supervisor", "model", "l1", "staging", "dcp", "l2",
						"remote", "metrics", "timeouts" };
	struct kvr_config d;
	char *j, *md;
	cJSON *root, *sec, *item;
	size_t s = 0, n = 0;
	const char *last = NULL;

	kvr_config_defaults(&d);
	j = kvr_config_to_json(&d);
	md = kvr_config_doc_markdown();
	cr_assert_not_null(j);
	cr_assert_not_null(md);
	root = cJSON_Parse(j);
	cr_assert_not_null(root);
	cJSON_ArrayForEach(sec, root) {
		cr_assert_lt(s, ARRAY_SIZE(sections));
		cr_expect_str_eq(sec->string, sections[s], "section %zu", s);
		s++;
		cJSON_ArrayForEach(item, sec) {
			char row[128];
			const char *at;

			snprintf(row, sizeof(row), "\n| `%s.%s` | ", sec->string, item->string);
			at = strstr(md, row);
			cr_expect_not_null(at, "docs have no row for %s.%s", sec->string, item->string);
			cr_expect(at && (!last || at > last), "docs order differs at %s.%s", sec->string, item->string);
			if (at)
				cr_expect_null(strstr(at + 1, row), "two doc rows for %s.%s", sec->string,
					       item->string);
			last = at;
			n++;
		}
	}
	cr_expect_eq(s, ARRAY_SIZE(sections));
	cr_expect_eq(n, 60, "keys in the effective JSON: %zu", n);
	cJSON_Delete(root);
	free(j);
	free(md);
}

static char *read_all(const char *path, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t len = 0, cap = 0, n;

	if (!f)
		return NULL;
	do {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 65536;
			buf = realloc(buf, cap + 1);
			cr_assert_not_null(buf);
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n > 0);
	fclose(f);
	buf[len] = '\0';
	*ret_len = len;
	return buf;
}

Test(config, doc_drift)
{
	const char *src = getenv("KVR_SOURCE_ROOT"), *build = getenv("KVR_BUILD_ROOT");
	char path[4096], cmd[4200];
	char *md, *file, *gen;
	size_t len, glen;
	FILE *p;

	cr_assert_not_null(src, "KVR_SOURCE_ROOT is not set (run through meson test)");
	cr_assert_not_null(build, "KVR_BUILD_ROOT is not set (run through meson test)");
	md = kvr_config_doc_markdown();
	cr_assert_not_null(md);
	cr_assert_not_null(strstr(md, "| `l1.eviction` | enum | `\"s3fifo\"` | `lru`, `s3fifo` |"), "%s", md);
	cr_assert_not_null(strstr(md, "| `l1.capacity_bytes` | size (bytes) | `\"1GiB\"` | 0..1PiB |"), "%s", md);
	cr_assert_not_null(strstr(md, "| `supervisor.restart_backoff_max_ms` | uint32 (ms) | `5000` | 1..600000 |"));
	snprintf(path, sizeof(path), "%s/docs/config.md", src);
	file = read_all(path, &len);
	cr_assert_not_null(file, "%s is missing: regenerate it with: %s/tests/config/gen-config-doc > docs/config.md",
			   path, build);
	cr_assert(len == strlen(md) && !memcmp(file, md, len),
		  "docs/config.md is out of date with the key table in config/config.c: regenerate it with: "
		  "%s/tests/config/gen-config-doc > docs/config.md", build);

	/* the generator prints exactly that */
	snprintf(cmd, sizeof(cmd), "'%s/tests/config/gen-config-doc'", build);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	gen = malloc(len + 2);
	cr_assert_not_null(gen);
	glen = fread(gen, 1, len + 1, p);
	cr_assert_eq(pclose(p), 0);
	cr_assert_eq(glen, len);
	cr_assert_eq(memcmp(gen, md, len), 0);
	free(gen);
	free(file);
	free(md);
}

/* A fresh directory under /tmp for one test (mkdtemp: a dir left by an earlier run never collides). */
static char tmpdir[128];

static void tmpdir_setup(void)
{
	static unsigned n;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvr-config-%u-XXXXXX", n++);
	cr_assert(mkdtemp(tmpdir), "mkdtemp %s: %s", tmpdir, strerror(errno));
}

static void tmpdir_teardown(void)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	cr_expect_eq(system(cmd), 0);
}

static void write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, data, len), (ssize_t)len);
	cr_assert_eq(close(fd), 0);
}

Test(config, load_file, .init = tmpdir_setup, .fini = tmpdir_teardown)
{
	struct kvr_config c, want;
	char path[256], err[512];
	char *big;

	snprintf(path, sizeof(path), "%s/kvring.json", tmpdir);
	write_file(path, full_json, strlen(full_json));
	fill_pattern(&c);
	cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvr_config_parse(full_json, &want, err, sizeof(err)), 0);
	cr_assert_eq(memcmp(&c, &want, sizeof(c)), 0);

	/* a missing file */
	snprintf(path, sizeof(path), "%s/missing.json", tmpdir);
	fill_pattern(&c);
	cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), -ENOENT);
	char want_err[512];
	snprintf(want_err, sizeof(want_err), "config %s: No such file or directory", path);
	cr_assert_str_eq(err, want_err);
	cr_assert(is_pattern(&c));

	/* a directory */
	cr_assert_eq(kvr_config_load_file(tmpdir, &c, err, sizeof(err)), -EISDIR);
	snprintf(want_err, sizeof(want_err), "config %s: Is a directory", tmpdir);
	cr_assert_str_eq(err, want_err);

	/* parse errors come through unchanged */
	snprintf(path, sizeof(path), "%s/bad.json", tmpdir);
	write_file(path, "{\"l1\": {\"eviction\": \"fifo\"}}\n", 29);
	cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "$.l1.eviction: invalid value \"fifo\" (one of: lru, s3fifo)");
	cr_assert(is_pattern(&c));

	/* a NUL byte would hide the rest of the file from the parser */
	write_file(path, "{}\0{\"x\": 1}", 11);
	cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), -EINVAL);
	snprintf(want_err, sizeof(want_err), "config %s: contains a NUL byte", path);
	cr_assert_str_eq(err, want_err);

	/* exactly 1 MiB is read; one byte more is refused */
	big = malloc((1u << 20) + 1);
	cr_assert_not_null(big);
	memset(big, ' ', (1u << 20) + 1);
	big[0] = '{';
	big[(1u << 20) - 1] = '}';
	write_file(path, big, 1u << 20);
	cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), 0, "%s", err);
	kvr_config_defaults(&want);
	cr_assert_eq(memcmp(&c, &want, sizeof(c)), 0);
	write_file(path, big, (1u << 20) + 1);
	fill_pattern(&c);
	cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), -EFBIG);
	snprintf(want_err, sizeof(want_err), "config %s: larger than 1 MiB", path);
	cr_assert_str_eq(err, want_err);
	cr_assert(is_pattern(&c));
	free(big);

	/* unreadable (not for root, who may read anything) */
	if (geteuid() != 0) {
		snprintf(path, sizeof(path), "%s/kvring.json", tmpdir);
		cr_assert_eq(chmod(path, 0), 0);
		cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), -EACCES);
		snprintf(want_err, sizeof(want_err), "config %s: Permission denied", path);
		cr_assert_str_eq(err, want_err);
	}
}

/* A UTF-8 byte-order mark before the text is skipped on purpose (docs/config.md): the same
 * values as without it, positions counted from after it; anywhere else it is refused with
 * its position. */
#define BOM "\xef\xbb\xbf"
Test(config, utf8_bom, .init = tmpdir_setup, .fini = tmpdir_teardown)
{
	struct kvr_config c, want;
	char path[256], err[512];
	char text[sizeof(full_json) + 3];

	/* a file with one: every value as in the same file without */
	snprintf(path, sizeof(path), "%s/bom.json", tmpdir);
	snprintf(text, sizeof(text), BOM "%s", full_json);
	write_file(path, text, strlen(text));
	fill_pattern(&c);
	cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvr_config_parse(full_json, &want, err, sizeof(err)), 0);
	cr_assert_eq(memcmp(&c, &want, sizeof(c)), 0, "a BOM changed the parsed values");
	char *json = kvr_config_to_json(&c);
	cr_assert_not_null(json);
	cr_assert_neq(strncmp(json, BOM, 3), 0, "the effective JSON carries no BOM");
	free(json);

	/* a reason's position is where an editor shows it: the mark takes no column */
	static const struct {
		const char *text, *err;
	} pos[] = {
		{ BOM "{\"x\" 1}", "config: not valid JSON near line 1 column 6" },
		{ BOM "{\n  \"l1\": {\n    \"eviction\": lru\n  }\n}\n", "config: not valid JSON near line 3 column 17" },
		{ BOM "{\"rings\": {\"capacity\": 1024,}}", "config: not valid JSON near line 1 column 30" },
		{ BOM, "config: not valid JSON near line 1 column 1" },
		{ BOM "{\"x\": \"\\u0000\"}", "config: \\u0000 in a string near line 1 column 8" },
		/* anywhere but first it is refused, with its position */
		{ BOM BOM "{}", "config: not valid JSON near line 1 column 1 (a second UTF-8 byte-order mark)" },
		{ "{\"instance\": " BOM "{\"max_workers\": 4}}", "config: not valid JSON near line 1 column 14" },
		{ "{\n  \"instance\": {}\n}\n" BOM, "config: not valid JSON near line 4 column 1" },
		{ " " BOM "{}", "config: not valid JSON near line 1 column 2" },
	};
	for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++) {
		fill_pattern(&c);
		cr_expect_eq(kvr_config_parse(pos[i].text, &c, err, sizeof(err)), -EINVAL, "case %zu", i);
		cr_expect_str_eq(err, pos[i].err, "case %zu", i);
		cr_expect(is_pattern(&c), "case %zu", i);
	}
	/* and the same through a file */
	snprintf(path, sizeof(path), "%s/mid.json", tmpdir);
	write_file(path, pos[6].text, strlen(pos[6].text));
	cr_assert_eq(kvr_config_load_file(path, &c, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, pos[6].err);
}

/* Whether s is well-formed UTF-8 (RFC 3629), written apart from the parser's own check. */
static bool is_utf8(const char *s)
{
	const unsigned char *u = (const unsigned char *)s;

	while (*u) {
		uint32_t cp;
		int n;

		if (u[0] < 0x80) {
			u++;
			continue;
		}
		if ((u[0] & 0xe0) == 0xc0) {
			n = 2;
			cp = u[0] & 0x1f;
		} else if ((u[0] & 0xf0) == 0xe0) {
			n = 3;
			cp = u[0] & 0x0f;
		} else if ((u[0] & 0xf8) == 0xf0) {
			n = 4;
			cp = u[0] & 0x07;
		} else {
			return false;
		}
		for (int i = 1; i < n; i++) {
			if ((u[i] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (u[i] & 0x3f);
		}
		if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		u += n;
	}
	return true;
}

/* What kvringd prints (--check-config) and embeds in the control segment stays JSON: every accepted string
 * is UTF-8 and reads back byte for byte; a refused one never reaches it, and no error message echoes a byte
 * that is not UTF-8, also where it is cut. */
Test(config, utf8_effective_json)
{
	static const char id[] = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf";
	struct kvr_config c, c2;
	char json[512], err[512];
	cJSON *root;
	char *j;

	snprintf(json, sizeof(json), "{\"model\": {\"model_id\": \"%s\", \"cache_salt\": \"\xc3\xa9\"}, "
		 "\"l2\": {\"dirs\": [\"/srv/k\xc3\xa9\"], \"capacity_bytes\": \"1TiB\"}}", id);
	cr_assert_eq(kvr_config_parse(json, &c, err, sizeof(err)), 0, "%s", err);
	j = kvr_config_to_json(&c);
	cr_assert_not_null(j);
	cr_assert(is_utf8(j), "%s", j);
	root = cJSON_Parse(j);
	cr_assert_not_null(root, "%s", j);
	cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "model_id")->valuestring, id);
	cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "l2"), "dirs"), 0)->valuestring,
			 "/srv/k\xc3\xa9");
	cr_assert_eq(kvr_config_parse(j, &c2, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(&c, &c2, sizeof(c)), 0);
	cJSON_Delete(root);
	free(j);

	/* Latin-1 (what an editor in the wrong locale writes) is refused, *cfg untouched */
	fill_pattern(&c);
	cr_assert_eq(kvr_config_parse("{\"model\": {\"cache_salt\": \"caf\xe9\"}}", &c, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "$.model.cache_salt: not valid UTF-8: byte 0xe9 at offset 3");
	cr_assert(is_pattern(&c));

	/* a name cut at 64 bytes is cut before a character, never inside one */
	char name[128];
	memset(name, 'b', 62);
	memcpy(name + 62, "\xc3\xa9x", 4);
	snprintf(json, sizeof(json), "{\"%s\": 1}", name);
	cr_assert_eq(kvr_config_parse(json, &c, err, sizeof(err)), -EINVAL);
	cr_assert(is_utf8(err), "%s", err);
	cr_assert_eq(strncmp(err + 2 + 62, "\xc3\xa9...: unknown key", 18), 0, "%s", err);
	memset(name, 'b', 63);
	memcpy(name + 63, "\xc3\xa9x", 4);
	snprintf(json, sizeof(json), "{\"%s\": 1}", name);
	cr_assert_eq(kvr_config_parse(json, &c, err, sizeof(err)), -EINVAL);
	cr_assert(is_utf8(err), "%s", err);
	cr_assert_str_eq(err + 2 + 63, "...: unknown key");
	/* a cut sequence at the end of a name */
	cr_assert_eq(kvr_config_parse("{\"l1\": {\"x\xe2\x82\": 1}}", &c, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "$.l1.x??: unknown key");
	cr_assert(is_utf8(err));
}

static void make_dir(const char *dir, const char *name)
{
	char p[256];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	cr_assert_eq(mkdir(p, 0700), 0, "mkdir %s: %s", p, strerror(errno));
}

static void make_link(const char *dir, const char *name, const char *target)
{
	char p[256];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	cr_assert_eq(symlink(target, p), 0, "symlink %s: %s", p, strerror(errno));
}

/* A config file whose l2.dirs are the given entries under tmpdir ("" = none), 1 TiB of L2. */
static void write_dirs_config(const char *path, const char *const *dirs, size_t n)
{
	char text[2048];
	size_t len = 0;

	len += (size_t)snprintf(text + len, sizeof(text) - len, "{\"l2\": {\"capacity_bytes\": \"1TiB\", \"dirs\": [");
	for (size_t i = 0; i < n; i++)
		len += (size_t)snprintf(text + len, sizeof(text) - len, "%s\"%s/%s\"", i ? ", " : "", tmpdir, dirs[i]);
	len += (size_t)snprintf(text + len, sizeof(text) - len, "]}}");
	cr_assert_lt(len, sizeof(text));
	write_file(path, text, len);
}

/* One directory under two names that only the disk tells apart (a symlink, a symlinked parent, "..") is
 * refused when a file is read (kvringd, --check-config), naming both entries; kvr_config_parse, which the
 * actors run on the embedded copy, never looks at the disk and accepts the same text. */
Test(config, l2_dirs_same_directory_on_disk, .init = tmpdir_setup, .fini = tmpdir_teardown)
{
	static const struct {
		const char *dirs[4];
		size_t n;
		int i, j;                  /* dirs[i] is refused as a duplicate of dirs[j]; i < 0: accepted */
		const char *why;
	} cases[] = {
		{ { "l2", "link" }, 2, 1, 0, "same device and inode" },
		{ { "l2", "other", "link/" }, 3, 2, 0, "same device and inode" },
		{ { "other", "l2/../other" }, 2, 1, 0, "same device and inode" },
		{ { "real/new", "other", "alias/new/" }, 3, 2, 0, "same device and inode of an existing parent" },
		{ { "real/a/b", "alias/a/b" }, 2, 1, 0, "same device and inode of an existing parent" },
		{ { "l2", "other", "real/new", "alias/new2" }, 4, -1, -1, NULL },
		{ { "l2", "missing/l2", "missing2/l2" }, 3, -1, -1, NULL },
	};
	char path[256], text_path[512], want[512], err[512];
	struct kvr_config c, p;

	make_dir(tmpdir, "l2");
	make_dir(tmpdir, "other");
	make_dir(tmpdir, "real");
	make_link(tmpdir, "link", "l2");
	make_link(tmpdir, "alias", "real");
	snprintf(path, sizeof(path), "%s/kvring.json", tmpdir);
	for (size_t k = 0; k < ARRAY_SIZE(cases); k++) {
		char *text;
		size_t len;
		int r;

		write_dirs_config(path, cases[k].dirs, cases[k].n);
		fill_pattern(&c);
		r = kvr_config_load_file(path, &c, err, sizeof(err));
		text = read_all(path, &len);
		cr_assert_not_null(text);
		cr_assert_eq(kvr_config_parse(text, &p, err + 256, sizeof(err) - 256), 0, "case %zu: parse: %s", k,
			     err + 256);
		free(text);
		if (cases[k].i < 0) {
			cr_expect_eq(r, 0, "case %zu: %s", k, err);
			cr_expect_eq(memcmp(&c, &p, sizeof(c)), 0, "case %zu: the file reads as its text parses", k);
			continue;
		}
		snprintf(want, sizeof(want), "$.l2.dirs[%d]: duplicate of $.l2.dirs[%d]: \"%s/%s\" is the same directory "
			 "as \"%s/%s\" (%s)", cases[k].i, cases[k].j, tmpdir, cases[k].dirs[cases[k].i], tmpdir,
			 cases[k].dirs[cases[k].j], cases[k].why);
		cr_expect_eq(r, -EINVAL, "case %zu: %d", k, r);
		cr_expect_str_eq(err, want, "case %zu", k);
		cr_expect(is_pattern(&c), "case %zu: *cfg changed on failure", k);
	}

	/* the check on its own: a parsed config whose dirs were made aliases after it was parsed */
	snprintf(text_path, sizeof(text_path), "{\"l2\": {\"capacity_bytes\": \"1TiB\", \"dirs\": [\"%s/later\", "
		 "\"%s/later-alias\"]}}", tmpdir, tmpdir);
	cr_assert_eq(kvr_config_parse(text_path, &c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvr_config_check_fs(&c, err, sizeof(err)), 0, "%s", err);
	make_dir(tmpdir, "later");
	make_link(tmpdir, "later-alias", "later");
	cr_assert_eq(kvr_config_check_fs(&c, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "$.l2.dirs[1]: duplicate of $.l2.dirs[0]: "), "%s", err);
}

Test(config, error_buffer)
{
	struct kvr_config c;
	char err[16];

	/* cut to the buffer, always NUL-terminated */
	memset(err, 'x', sizeof(err));
	cr_assert_eq(kvr_config_parse("{\"l1\": {\"eviction\": \"fifo\"}}", &c, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "$.l1.eviction: ");
	/* no buffer at all */
	cr_assert_eq(kvr_config_parse("{\"l1\": {\"eviction\": \"fifo\"}}", &c, NULL, 0), -EINVAL);
	cr_assert_eq(kvr_config_parse("{}", &c, NULL, 0), 0);
	cr_assert_eq(kvr_config_parse(NULL, &c, err, sizeof(err)), -EINVAL);
	/* a long unknown key is cut in the message, which stays one line */
	char json[400], big[512];
	snprintf(json, sizeof(json), "{\"%s\\n\": 1}", S128);
	cr_assert_eq(kvr_config_parse(json, &c, big, sizeof(big)), -EINVAL);
	cr_assert_str_eq(big, "$.bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb...: unknown key");
}

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

/* Random byte edits of a valid config: every result is a clean accept or a one-line refusal (UTF-8, never an
 * internal error), never a changed *cfg on failure, and whatever is accepted is UTF-8 and round-trips.
 * KVR_TEST_SEED=<n> replays a run. */
Test(config, mutations)
{
	const char *env = getenv("KVR_TEST_SEED");
	static const char alphabet[] = "{}[]\":,0123456789-.eE \\untrfalse/xMiGB\xc3\xa9\xff\x80";
	uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	size_t len = strlen(full_json), accepted = 0, refused = 0;
	char *text = malloc(len + 1);

	cr_assert_not_null(text);
	fprintf(stderr, "config mutations: seed %" PRIu64 " (replay with KVR_TEST_SEED=%" PRIu64 ")\n", seed, seed);
	rng_state = seed | 1;
	for (int it = 0; it < 3000; it++) {
		struct kvr_config c, c2;
		char err[512];
		int edits = 1 + (int)(rng_next() % 3), r;

		memcpy(text, full_json, len + 1);
		for (int e = 0; e < edits; e++)
			text[rng_next() % len] = alphabet[rng_next() % (sizeof(alphabet) - 1)];
		fill_pattern(&c);
		r = kvr_config_parse(text, &c, err, sizeof(err));
		if (r == 0) {
			char *j = kvr_config_to_json(&c);

			accepted++;
			cr_assert_not_null(j);
			cr_assert(is_utf8(j), "seed %" PRIu64 ": effective config not UTF-8:\n%s", seed, j);
			cr_assert_eq(kvr_config_parse(j, &c2, err, sizeof(err)), 0, "seed %" PRIu64 ": %s\n%s", seed,
				     err, j);
			cr_assert_eq(memcmp(&c, &c2, sizeof(c)), 0, "seed %" PRIu64 ": round trip of\n%s", seed, text);
			free(j);
		} else {
			refused++;
			cr_assert_eq(r, -EINVAL, "seed %" PRIu64 ": %d for\n%s", seed, r, text);
			cr_assert(!strncmp(err, "$", 1) || !strncmp(err, "config: ", 8), "seed %" PRIu64 ": '%s'", seed,
				  err);
			cr_assert_null(strchr(err, '\n'), "seed %" PRIu64 ": multi-line error '%s'", seed, err);
			cr_assert(is_utf8(err), "seed %" PRIu64 ": error not UTF-8 '%s'", seed, err);
			cr_assert_null(strstr(err, "internal error"), "seed %" PRIu64 ": '%s' for\n%s", seed, err, text);
			cr_assert(is_pattern(&c), "seed %" PRIu64 ": *cfg changed on failure for\n%s", seed, text);
		}
	}
	fprintf(stderr, "config mutations: %zu accepted, %zu refused\n", accepted, refused);
	cr_expect_gt(refused, 0);
	free(text);
}

/* Enum keys are parsed once into their derived fields (kvr_config.h); code tests those. */
Test(config, enum_keys_are_parsed_once_into_typed_fields)
{
	struct kvr_config c;
	char err[256];

	kvr_config_defaults(&c);
	cr_assert_eq(c.instance.log_level_id, KVR_LOG_INFO);
	cr_assert(!c.model.mla);
	cr_assert(!c.model.kv_fused);
	cr_assert(c.l1.prefault_background);
	cr_assert(!c.l2.write_back);
	cr_assert_eq(c.l2.durability_id, KVR_CFG_DUR_BATCH);
	cr_assert_eq(c.l1.eviction_id, KVR_CFG_EVICT_S3FIFO);
	cr_assert_eq(kvr_config_parse("{\"instance\": {\"log_level\": \"debug\"}, \"l1\": {\"prefault\": \"off\", "
				      "\"eviction\": \"lru\"}, "
				      "\"model\": {\"preset\": \"qwen3-8b\", \"kv_layout\": \"kv-fused\"}, "
				      "\"l2\": {\"mode\": \"write-back\", \"durability\": \"none\"}}",
				      &c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c.instance.log_level_id, KVR_LOG_DEBUG);
	cr_assert(!c.l1.prefault_background);
	cr_assert_eq(c.l1.eviction_id, KVR_CFG_EVICT_LRU);
	cr_assert(c.model.kv_fused);
	cr_assert(c.l2.write_back);
	cr_assert_eq(c.l2.durability_id, KVR_CFG_DUR_NONE);
	cr_assert_eq(kvr_config_parse("{\"l2\": {\"durability\": \"block\"}, \"model\": {\"preset\": \"\", \"attention\": "
				      "\"mla\", \"layers\": 2, \"kv_heads\": 1, \"head_dim\": 64, \"dtype_bytes\": 2, "
				      "\"model_id\": \"m\", \"block_tokens\": 16}}", &c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c.l2.durability_id, KVR_CFG_DUR_BLOCK);
	cr_assert_eq(c.l1.eviction_id, KVR_CFG_EVICT_S3FIFO);
	cr_assert(c.model.mla);
	/* a refused document leaves every field, derived ones too, as they were */
	cr_assert_eq(kvr_config_parse("{\"l2\": {\"durability\": \"fsync\"}}", &c, err, sizeof(err)), -EINVAL);
	cr_assert_eq(c.l2.durability_id, KVR_CFG_DUR_BLOCK);
}
