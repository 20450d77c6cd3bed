/* Harness for the L1 data-path tests: a real kvringd with a small model, libkvring ranks over memfd KV memory. */
#ifndef CLIENT_HARNESS_H
#define CLIENT_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <kvring/kvring.h>

#include "kvr_ctl.h"
#include "kvr_geometry.h"
#include "kvr_keys.h"
#include "kvr_segment.h"
#include "kvr_slots.h"
#include "sup_harness.h"

/*
 * ct_start() writes a config with an explicit model (no preset), starts kvringd from the
 * build tree (sup_harness) and maps more views of the instance next to the INSPECT one:
 * the slot table and the arena read-only (to assert slot states and L1 bytes) and the
 * control segment read-write (to inject messages on rings whose real endpoint is idle or
 * stopped). They are opened through /proc/<kvringd>/fd: the test owns the daemon, so it
 * may look inside.
 *
 * A rank (ct_rank) is one libkvring client over its own memfd KV memory, mapped so the
 * test can fill and check bytes. Contents are generated from a tag: block b of rank r
 * "holds tag t" when every byte of every region page of b equals ct_byte(t, r, region, i).
 * Ranks opened through ct_rank_open are closed by ct_close_all (the fixture's teardown),
 * also when an assertion ended the test early.
 */

struct ct_model {
	uint32_t layers, kv_heads, head_dim, dtype_bytes, block_tokens, tp_size; /* kv_heads: all ranks */
};

/* The model most tests use: 2 layers x K,V x 16 tokens x 2 heads x 16 x bf16 = 4096 bytes a
 * lane (one 4 KiB slot); ct_tiny_tp2 is the same at TP 2 (one KV head a rank). */
extern const struct ct_model ct_tiny, ct_tiny_tp2;

struct ct_opts {
	unsigned max_workers;      /* 0 = tp_size */
	uint32_t l1_slots;         /* arena holds this many slots; 0 = 64 */
	const char *eviction;      /* NULL = "lru" */
	uint64_t staging_ceiling;  /* 0 = 64 lanes */
	uint64_t staging_buffer;   /* 0 = one lane */
	unsigned load_percent;     /* 0 = 50 */
	unsigned health_ms;        /* 0 = 1000 (a stopped actor is killed after 5 missed pings) */
	unsigned crash_loop_max;   /* deaths in 10 s that give up on an actor; 0 = 5 */
	const char *l2_dir;        /* an L2 tier in this directory (NULL = none) */
	const char *l2_dir2;       /* and a second directory (a second disk actor); NULL = one */
	uint64_t l2_bytes;         /* its cap; 0 = 64 MiB */
	const char *l2_mode;       /* NULL = "write-through" */
	const char *l2_extra;      /* spliced into the "l2" object after mode, e.g. ", \"read_only\": true" */
	const char *sup_extra;     /* spliced into the "supervisor" object, e.g. ", \"attach_timeout_ms\": 500" */
	unsigned dcp_timeout_ms;   /* dcp.store_timeout_ms; 0 = the default */
	const char *l1_extra;      /* spliced into the "l1" object, e.g. ", \"prefault\": \"off\"" */
	const char *sections_extra; /* more top-level sections, e.g. ",\n  \"timeouts\": {...}" */
	bool no_model;             /* "model": {} — L1 is laid out at the first attach: ct_map_l1 after it */
	bool huge_pages;           /* l1.huge_pages true, as kvringd's default (hugetlb pages when the pool
	                            * has them free, else THP where shmem_enabled allows); false = 4 KiB,
	                            * unless KVR_TEST_HUGE_PAGES is set (tools/test.sh's rerun of the L2
	                            * suite: the disk actor's joined transfers through every test) */
};

struct ct_env {
	struct h_inst h;
	struct ct_model m;
	uint64_t lane_bytes;            /* one rank's bytes per block */
	struct kvr_segment slots_seg;   /* read-only */
	struct kvr_slot_table *slots;
	struct kvr_segment ctl_seg;     /* read-write */
	struct kvr_ctl *ctl;
	struct kvr_ctl_rings rings; /* the test's views of its rings */
	struct kvr_segment arena_seg;   /* read-only: the L1 bytes */
	uint32_t n_slots;               /* what ct_start sized L1 for (with e->m's lane) */
};

struct ct_rank {
	struct kvr_client *c;
	struct kvr_geometry g;
	int kv_fd;
	uint8_t *kv;
	uint64_t kv_bytes;
	unsigned rank, worker;
};

#define CT_MAX_FAILED 1024

/* One completion with its failed ids copied (the client's array dies at the next poll). */
struct ct_done {
	struct kvr_completion c;
	uint32_t failed[CT_MAX_FAILED];
};

#define CT_CANARY 0xca11ab1eca11ab1eull /* tag of bytes no load may touch */

void ct_init(struct ct_env *e);              /* fixture setup: h_init */
void ct_fini(struct ct_env *e);              /* fixture teardown: ranks, children, mappings, kvringd */

uint64_t ct_lane_bytes(const struct ct_model *m);
void ct_start(struct ct_env *e, const struct ct_model *m, const struct ct_opts *o);
/* Map the slot table and the arena (ct_start does, unless o->no_model: then call it once the
 * first worker attached and L1 exists); asserts the lookup actor is READY and the table holds
 * the slots ct_start sized for e->m. */
void ct_map_l1(struct ct_env *e);

/* Attach rank `rank` with num_blocks engine blocks (head_dim 0 = the model's). Returns what
 * kvr_attach returned; on success *ret points at a rank the harness owns (ct_close_all
 * closes it after the test body) whose every block holds CT_CANARY. */
int ct_rank_open(struct ct_env *e, unsigned rank, uint32_t num_blocks, uint32_t head_dim, struct ct_rank **ret);
/* The same as a worker of engine engine_id with model namespace model_ns (NULL: defaults). */
int ct_rank_open_engine(struct ct_env *e, unsigned rank, uint32_t num_blocks, uint32_t head_dim,
			const char *engine_id, const char *model_ns, struct ct_rank **ret);
void ct_rank_close(struct ct_rank *r);
void ct_close_all(void);
/* Every rank closed, kvringd stopped by SIGTERM (asserted: exit 0 within 10 s), the segments
 * unmapped: ready for ct_start again (a restart). */
void ct_stop_clean(struct ct_env *e);

/* Remember a forked child: ct_fini kills it (SIGKILL) and reaps it. */
void ct_track_child(pid_t pid);
void ct_untrack_child(pid_t pid); /* it was reaped by the test */

/* Bytes */
void ct_fill(const struct ct_rank *r, uint32_t block, uint64_t tag);
/* true when block holds tag; else false and why names the region and the first bad offset. */
bool ct_holds(const struct ct_rank *r, uint32_t block, uint64_t tag, char *why, size_t whylen);

/* Does L1 slot `slot` hold rank r's lane of a block whose engine block held tag? */
bool ct_slot_holds(const struct ct_env *e, const struct ct_rank *r, uint32_t slot, uint64_t tag, char *why,
		   size_t whylen);

/* Prompts and keys */
void ct_prompt(uint32_t *tokens, size_t n, uint64_t seed);
void ct_keys(const struct ct_env *e, const uint32_t *tokens, size_t n_tokens, kvr_key *ret_keys);

/* Operations that assert they were accepted and wait (up to 5 s) for their completion. */
void ct_wait_done(struct ct_rank *r, struct ct_done *ret, int64_t timeout_ms);
void ct_store(struct ct_rank *r, uint64_t req, const uint32_t *tokens, size_t n_tokens, const uint32_t *blocks,
	      size_t n_blocks, struct ct_done *ret);
/* lookup; asserts it succeeded; returns matched blocks */
uint32_t ct_lookup(struct ct_rank *r, uint64_t req, const uint32_t *tokens, size_t n_tokens);
void ct_load(struct ct_rank *r, uint64_t req, const uint32_t *blocks, size_t n_blocks, struct ct_done *ret);

/* Look tokens up and load what matched (at most 64 blocks) into engine blocks dst0, dst0+1,
 * ...: asserts the load succeeded and that block i holds tag0 + i, byte by byte. Returns the
 * blocks matched. */
uint32_t ct_lookup_load_exact(struct ct_rank *r, uint64_t req, const uint32_t *tokens, size_t n_tokens, uint32_t dst0,
			      uint64_t tag0);

/* A rank in a child process (no Criterion asserts there): attaches as TP rank `rank` of the
 * env's model with num_blocks engine blocks, reports its worker slot in *ret_worker, then —
 * when lookup_tokens is not NULL — looks them up (that may start promotions), and waits to
 * be killed. The child is tracked (ct_fini kills it). Fork before the test holds a client. */
pid_t ct_spawn_rank_child(const struct ct_env *e, unsigned rank, uint32_t num_blocks, const uint32_t *lookup_tokens,
			  size_t n_lookup_tokens, int *ret_worker);

/* Slot table: the slot holding (key, lane) in any state other than FREE, or -1. */
int ct_find_slot(const struct ct_env *e, kvr_key key, unsigned lane);
uint32_t ct_count_state(const struct ct_env *e, unsigned state);
/* Quiet: the slot table holds only FREE and COMMITTED slots and no pin at all. */
bool ct_table_clean(const struct ct_env *e);
/* Waits (up to 5 s) for ct_table_clean; else logs every slot that is not and fails. */
void ct_assert_table_clean(const struct ct_env *e);

/* Actors and processes */
pid_t ct_actor_pid(const struct ct_env *e, const char *name);
uint32_t ct_actor_gen(const struct ct_env *e, const char *name);
/* Wait until name is READY with a pid other than old_pid (0: any); returns the pid. */
pid_t ct_wait_ready(const struct ct_env *e, const char *name, pid_t old_pid, int ms);
/* SIGSTOP pid and wait until /proc shows it stopped. */
void ct_stop_process(pid_t pid);
uint64_t ct_stat(const struct ct_env *e, const char *actor, unsigned s);
/* A ring of the read-write control mapping. */
struct kvr_ring *ct_ring(const struct ct_env *e, const char *name);

/* Read one whole list reply (messages of req_id on ring, others skipped) as a consumer
 * standing in for a stopped actor: polls up to ms. Returns the item count or -errno. */
int ct_recv_list(struct kvr_ring *ring, unsigned type, uint64_t req_id, void *items, uint32_t cap, int ms);
/* One single message of req_id (skipping others); 0 or -ETIMEDOUT. */
int ct_recv_msg(struct kvr_ring *ring, uint64_t req_id, struct kvr_msg *ret, int ms);

#endif
