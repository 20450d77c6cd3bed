/* Helpers of the /metrics tests: a synthetic instance, kvringd with metrics on, a libkvring workload, HTTP, promtool. */
#ifndef METRICS_TEST_H
#define METRICS_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kvring/kvring.h>

#include "kvr_ctl.h"
#include "kvr_geometry.h"
#include "kvr_segment.h"
#include "kvr_slots.h"
#include "sup_harness.h"

/* ---- a synthetic instance (no daemon): known counters, states, rings and slots -------- */

#define MF_BLOCK_TOKENS 16
#define MF_SLOTS 8
#define MF_ACTORS 6 /* actor slots: the four below, a disk actor, a remote actor */

struct m_fake {
	struct kvr_segment ctl_seg, slots_seg;
	struct kvr_ctl *ctl;
	struct kvr_slot_table *slots;
};

/*
 * Actors: 0 "lookup" READY, 1 "loader.0" READY, 2 "storer.0" BACKOFF (2 restarts, last
 * killed by signal 9), 3 `a"b\c` IDLE (a name that needs escaping), 4 and 5 unused.
 * Counters: lookup 3 lookups, 10 keys, 6 matched, 2 evicted, 1 malformed; loader 5 blocks,
 * 1 failed, 5000 bytes; storer 7 stored, 2 present, 1 failed, 7000 bytes. Loader latency
 * observations: 16000 ns, 16001 ns, 1 s. Worker 0 attached.
 * Rings: "lookup.req.0" (capacity 8, 2 messages in, producer waited 1.5 s, 3 rejected),
 * "ctl.lookup.in" (capacity 4, empty).
 * Slots (8): 2 committed, 1 committed and pinned (reading), 1 writing, 4 free.
 */
void m_fake_init(struct m_fake *f);
/* The same with config_json as the effective config in the control segment (m_fake_init: "{}"). */
void m_fake_init_config(struct m_fake *f, const char *config_json);
void m_fake_fini(struct m_fake *f);

/* A disk actor in slot 4 (n_actors 5), READY, entry index `index`, with known stats: bytes
 * 61440 (3 files of 20480), files 3, capacity 1 MiB, adopted 5, adoption tmp 2 and over_cap
 * 7, evicted 11, read failures damaged 1 / vanished 2 / io_error 3, read-only refused writes
 * 4, kept at adoption 9 and after reads 6. */
void m_fake_add_disk(struct m_fake *f, unsigned index, const char *name);
/* The remote actor "remote" in slot 5 (n_actors 6), READY, each counter of enum
 * kvr_stat_remote a distinct value: reads 101, hits 102, misses 103, bad values 104, read
 * errors 105, writes 106, write errors 107, stale writes 108, bytes in 109, bytes out 110,
 * MOVED 111, ASK 112, timeouts 113, connection errors 114, reply errors 115, refreshes 116;
 * gauges nodes 3, nodes up 2, inflight 117, slots covered 10923. GET latency observations
 * 16000 ns, 100000 ns and 2 s, SET 1 ms. The lookup actor's remote counters: promoted 121,
 * promotions failed 122, writes sent 123, writes skipped 124. */
void m_fake_add_remote(struct m_fake *f);
/* A config for m_fake_init_config whose l2.dirs[0] needs escaping in a label: the path
 * /srv/kv"l2\a, as JSON text and as a Prometheus label value. It must pass kvr_config_parse
 * (/metrics reads l2.dirs through it), so the cap holds a block file of the default model. */
#define MF_ODD_DIR_JSON "/srv/kv\\\"l2\\\\a"
#define MF_ODD_DIR_LABEL "/srv/kv\\\"l2\\\\a"
#define MF_L2_CONFIG "{\"l2\": {\"dirs\": [\"" MF_ODD_DIR_JSON "\"], \"capacity_bytes\": 1073741824}}"

/* ---- kvringd with metrics ------------------------------------------------------------- */

/* The test model: 2 layers, 2 KV heads, head_dim 64, bf16, 16-token blocks, TP 1. */
#define M_LAYERS 2
#define M_HEADS 2
#define M_HEAD_DIM 64
#define M_BLOCK_TOKENS 16
#define M_LANE_BYTES (2ull * M_LAYERS * M_BLOCK_TOKENS * M_HEADS * M_HEAD_DIM * 2) /* 16384 */
#define M_SLOTS 64
#define M_NUM_BLOCKS 32 /* the worker's engine blocks */

/* A loopback TCP port that was free a moment ago. */
uint16_t m_free_port(void);

/* Write the test config (the model above, M_SLOTS slots, short supervisor timeouts) with
 * "metrics": {"enabled": enabled, "listen": "127.0.0.1:<port>"}. */
void m_write_config(struct h_inst *in, bool enabled, uint16_t port);

/* Write the config and start kvringd (h_start: waits for INSPECT and the lookup actor). */
void m_start(struct h_inst *in, bool enabled, uint16_t port);

/* The same with metrics on and an L2 tier: "l2": {"dirs": [l2_dir], "capacity_bytes":
 * l2_bytes, "durability": "none"} (write-through, one disk actor disk.0); also waits until
 * disk.0 is ready. */
void m_write_config_l2(struct h_inst *in, uint16_t port, const char *l2_dir, uint64_t l2_bytes);
void m_start_l2(struct h_inst *in, uint16_t port, const char *l2_dir, uint64_t l2_bytes);

/* ---- HTTP --------------------------------------------------------------------------- */

struct m_http {
	int status;       /* the status code of the reply */
	char *head;       /* status line and headers */
	char *body;       /* NUL-terminated */
	size_t body_len;
};

/* One HTTP/1.0 request to 127.0.0.1:port. 0, or -errno (connect refused: -ECONNREFUSED). */
int m_http(uint16_t port, const char *method, const char *path, struct m_http *ret);
void m_http_free(struct m_http *r);
/* GET /metrics, asserting 200. */
char *m_scrape(uint16_t port);

/* The value of the series written exactly as `series` (name plus labels) in an exposition;
 * false when there is no such line. */
bool m_value(const char *text, const char *series, double *ret);
/* As m_value, asserting the series is there. */
double m_get(const char *text, const char *series);

/* promtool check metrics on text: 0 clean, 1 problems (promtool's output in out), -1 when
 * promtool is not installed. */
int m_promtool(const char *text, char *out, size_t outlen);
bool m_have_promtool(void);

/* ---- a libkvring worker and the known workload -------------------------------------- */

struct m_worker {
	struct kvr_client *c;
	struct kvr_geometry g;
	int kv_fd;
	uint8_t *kv;
	uint64_t kv_bytes;
};

void m_worker_attach(struct m_worker *w, const char *sock);
/* The same as a worker of engine engine_id with key namespace model_ns (NULL: the defaults). */
void m_worker_attach_engine(struct m_worker *w, const char *sock, const char *engine_id, const char *model_ns);
void m_worker_close(struct m_worker *w);

/* The fixture every live-kvringd test of /metrics and its pages uses: `inst` (h_init with a
 * fresh directory) and `worker` (none attached; closed after the test), a Criterion suite
 * with them. In a test file that includes criterion.h. */
void m_fixture_init(struct h_inst *inst, struct m_worker *w);
void m_fixture_fini(struct h_inst *inst, struct m_worker *w);
#define M_FIXTURE(suite_name, timeout_s)                                        \
	static struct h_inst inst;                                              \
	static struct m_worker worker = {.kv_fd = -1};                          \
	static void m_setup(void) { m_fixture_init(&inst, &worker); }           \
	static void m_teardown(void) { m_fixture_fini(&inst, &worker); }        \
	TestSuite(suite_name, .init = m_setup, .fini = m_teardown, .timeout = timeout_s)

/*
 * The workload whose counters the tests assert:
 *   store prompts 0, 1, 2 (64 tokens = 4 blocks each, engine blocks 4p..4p+3): 12 stored;
 *   store prompt 0 again (blocks 0..3): 4 present;
 *   lookup + load prompt 0 into blocks 16..19 and prompt 1 into 20..23 (bytes checked);
 *   lookup an unknown prompt: 0 matched.
 */
void m_workload(struct m_worker *w);

/* The tokens of workload prompt p (M_PROMPT_TOKENS = 4 blocks). */
#define M_PROMPT_TOKENS (4 * M_BLOCK_TOKENS)
void m_prompt(uint32_t *tokens, unsigned p);

#endif
