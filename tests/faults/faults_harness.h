/* Fault suites (issue 11): the model, key-derived KV bytes, worker processes over libkvring, slot and L2 checks. */
#ifndef FAULTS_HARNESS_H
#define FAULTS_HARNESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <kvring/kvring.h>

#include "kvr_geometry.h"
#include "kvr_keys.h"
#include "kvr_slots.h"

/*
 * The model every fault test has (fh_model_default, the FH_* constants): MHA, 2 layers, 4 KV
 * heads of 16 bf16 elements, 16-token blocks, TP 2 (2 heads a lane). A lane of a block is 4
 * regions (layer 0 K, V, layer 1 K, V) of 16 token rows of 64 bytes: 4096 bytes, one 4 KiB
 * slot, one 8 KiB L2 file. A test may run engines of other models beside it (struct
 * fh_model): same block tokens and lane count (an instance requires both), a lane of at most
 * FH_LANE_BYTES, so every model's lane fits the 4 KiB slots.
 *
 * Bytes follow the block key (the chained hash of the block's tokens and everything before
 * them, under the engine's model namespace): byte o of the canonical lane `lane` of block
 * `key` is fh_lane_content(key, lane)[o] for o below the model's lane bytes, where o counts
 * region by region, token row by token row (the slot's layout). A TP rank holds that lane in
 * its engine block as is; a DCP rank holds its tokens' rows of it (token t belongs to rank
 * (t / I) mod D, its rows in increasing t), computed here by brute force, independent of
 * kvr_dcp.c. So every byte a load restores, every committed slot and every L2 payload can be
 * checked against the key alone, whoever stored it.
 *
 * Nothing in this file asserts through Criterion: worker processes (fh_worker_run) use it
 * after fork; functions return 0 / -errno or counts.
 */

#define FH_BT 16u     /* the default model's block size */
#define FH_MAX_BT 32u /* the largest a model may have (fh_model.bt) */
#define FH_LAYERS 2u
#define FH_LANE_HEADS 2u
#define FH_HEAD_DIM 16u
#define FH_DTYPE 2u
#define FH_TP 2u
#define FH_ROW (FH_LANE_HEADS * FH_HEAD_DIM * FH_DTYPE) /* 64 bytes: one token of one region */
#define FH_REGIONS (2u * FH_LAYERS)
#define FH_LANE_BYTES (FH_REGIONS * FH_BT * FH_ROW)      /* 4096: the largest lane, the slot */
#define FH_CANARY 0xa5u                                   /* a block no load was given */
#define FH_MAX_MODELS 4u

/* ct_model of the default model (client_harness). */
#define FH_CT_MODEL {.layers = FH_LAYERS, .kv_heads = FH_LANE_HEADS * FH_TP, .head_dim = FH_HEAD_DIM, \
		     .dtype_bytes = FH_DTYPE, .block_tokens = FH_BT, .tp_size = FH_TP}

/* A model an engine attaches with: its geometry (bt-token blocks, tp lanes of lane_heads
 * KV heads) and the model namespace its engines name. */
struct fh_model {
	const char *name;     /* in messages: "A" */
	const char *model_ns; /* what its workers name in kvr_attach_opts (NULL: none, the instance's model) */
	uint32_t layers, lane_heads, head_dim, dtype, tp;
	uint32_t bt;          /* tokens a block, at most FH_MAX_BT; 0 = FH_BT */
};

static inline uint32_t fh_model_bt(const struct fh_model *m)
{
	return m->bt ? m->bt : FH_BT;
}

extern const struct fh_model fh_model_default; /* the FH_* model, no model_ns */

static inline uint32_t fh_model_row(const struct fh_model *m)
{
	return m->lane_heads * m->head_dim * m->dtype;
}

static inline uint32_t fh_model_lane_bytes(const struct fh_model *m)
{
	return 2 * m->layers * fh_model_bt(m) * fh_model_row(m);
}

/* The key namespace its TP ranks' blocks are keyed under: kvringd's (kvr_geometry_namespace
 * of the rank's geometry, under model_ns or else model_id, no cache salt). 0 or -EINVAL. */
int fh_model_namespace(const struct fh_model *m, const char *model_id, kvr_key *ret_ns);

/* The first FH_LANE_BYTES of lane `lane` of key's content stream (a model's lane: its prefix). */
void fh_lane_content(kvr_key key, unsigned lane, uint8_t out[FH_LANE_BYTES]);

/* ---- prompts ------------------------------------------------------------------------ */

#define FH_MAX_BLK 8u

struct fh_prompt {
	uint32_t n;  /* blocks */
	uint32_t bt; /* tokens a block (its model's) */
	uint32_t tokens[FH_MAX_BLK * FH_MAX_BT];
	kvr_key keys[FH_MAX_BLK];
};

/* n prompts of bt-token blocks over `families` shared prefixes (1..max_blk blocks each) from
 * seed, keyed under ns (its model's namespace). */
void fh_make_prompts(struct fh_prompt *p, unsigned n, unsigned families, unsigned max_blk, uint64_t seed, kvr_key ns,
		     uint32_t bt);
/* One prompt of exactly n_blocks random blocks of bt tokens. */
void fh_make_prompt(struct fh_prompt *p, unsigned n_blocks, uint64_t seed, kvr_key ns, uint32_t bt);

/* ---- ranks -------------------------------------------------------------------------- */

struct fh_rank {
	const struct fh_model *m;
	const char *engine;  /* engine_id it attaches as (NULL: the default engine) */
	struct kvr_client *c;
	struct kvr_geometry g;
	int fd;
	uint8_t *kv;
	uint64_t bytes;
	unsigned lane;      /* the lane it stores and loads: tp_rank / dcp_size */
	uint64_t next_req;
};

/* Geometry and KV memory (a memfd, every byte FH_CANARY), not attached, of the default
 * model. A TP rank of the model: tp_size FH_TP, dcp_size 1. A DCP rank: TP 2 x dcp_size
 * ranks, DCP rank tp_rank mod dcp_size, interleave il. 0 or -errno. */
int fh_rank_prepare(struct fh_rank *r, unsigned tp_size, unsigned tp_rank, unsigned dcp_size, unsigned il,
		    uint32_t num_blocks);
/* The same for a rank of model m (-EINVAL: its lane is larger than FH_LANE_BYTES); it
 * attaches as engine `engine` naming m->model_ns. */
int fh_rank_prepare_model(struct fh_rank *r, const struct fh_model *m, const char *engine, unsigned tp_size,
			  unsigned tp_rank, unsigned dcp_size, unsigned il, uint32_t num_blocks);
int fh_rank_attach(struct fh_rank *r, const char *sock, int64_t timeout_ms);
void fh_rank_close(struct fh_rank *r); /* detach, unmap, close; safe on a closed rank */

/* Write block key's lane into engine block `block` (this rank's share of it). */
void fh_fill(const struct fh_rank *r, uint32_t block, kvr_key key);
void fh_fill_canary(const struct fh_rank *r, uint32_t block);

struct fh_bad {               /* the first wrong byte of a block */
	kvr_key key;
	uint32_t lane, block;     /* block: engine block id */
	uint32_t offset;          /* canonical offset in the lane */
	uint8_t got, want;
	uint8_t canary;           /* every byte of the block was still the canary */
};

/* Compare engine block `block` with key's lane: the number of wrong bytes (0: exact); the
 * first one in *ret_bad when not NULL. Bytes compared: fh_rank_share(r). */
uint64_t fh_check(const struct fh_rank *r, uint32_t block, kvr_key key, struct fh_bad *ret_bad);
/* Whose bytes a wrong block holds: the prompt index (and its block and lane) whose content
 * it matches exactly, or -1. */
int fh_identify(const struct fh_rank *r, uint32_t block, const struct fh_prompt *p, unsigned n, unsigned *ret_block,
		unsigned *ret_lane);
uint64_t fh_rank_share(const struct fh_rank *r);

/* ---- worker processes ----------------------------------------------------------------- */

enum fh_cmd { FH_CMD_RUN = 1, FH_CMD_QUIET, FH_CMD_VERIFY, FH_CMD_EXIT, FH_CMD_SEAL };
enum fh_wstate { FH_W_STARTING = 0, FH_W_ATTACHING, FH_W_RUNNING, FH_W_IDLE, FH_W_VERIFIED, FH_W_SEALED };

enum fh_counter {
	FH_C_ATTACHES,       /* attaches that succeeded */
	FH_C_ATTACH_FAILS,
	FH_C_STORES,         /* stores completed (any status) */
	FH_C_STORES_FAILED,  /* of those, status != 0 */
	FH_C_STORED_BLOCKS,  /* n_stored */
	FH_C_LOOKUPS,        /* lookups answered */
	FH_C_LOOKUP_ERRS,    /* lookups that returned an error (-EPIPE, -ETIMEDOUT, ...) */
	FH_C_SUBMIT_ERRS,    /* store/load submissions refused (-EPIPE: actor restarting) */
	FH_C_LOADS,          /* loads completed */
	FH_C_LOADS_FAILED,   /* of those, status != 0 */
	FH_C_BLOCKS_CHECKED, /* blocks a load reported restored, each compared byte by byte */
	FH_C_BLOCKS_MISSED,  /* blocks a load reported failed (a miss for the engine) */
	FH_C_BYTES,          /* bytes compared */
	FH_C_WRONG_BLOCKS,   /* restored blocks with a wrong byte */
	FH_C_WRONG_BYTES,
	FH_C_HANGS,          /* requests without a completion within the hang limit */
	FH_C_VERIFIED,       /* prompts gone through by FH_CMD_VERIFY */
	FH_C_SEAL_STORED,    /* blocks FH_CMD_SEAL stored (the seal prompt, every rank) */
	FH_C_SEAL_RESTORED,  /* blocks of the seal prompt FH_CMD_VERIFY restored and checked */
	FH_C_MAX,
};

struct fh_wshared {           /* one per worker role, MAP_SHARED: the parent commands, the child reports */
	_Atomic uint32_t cmd, cmd_seq;
	_Atomic uint32_t state, ack_seq;
	_Atomic int32_t pid;
	_Atomic uint32_t have_bad;
	/* the worker's KV memfds, published so the parent can keep the memory after a kill -9
	 * and write over it at once (the fence: no store of the dead worker commits it) */
	_Atomic uint32_t n_kv;
	_Atomic int32_t kv_fd[2];
	_Atomic uint64_t kv_bytes[2];
	_Atomic uint64_t c[FH_C_MAX];
	struct fh_bad bad;        /* the first wrong block any incarnation found (have_bad) */
	uint32_t bad_prompt, bad_rank;
	char last_err[200];
};

enum fh_role_kind { FH_ROLE_TP, FH_ROLE_DCP };

struct fh_role {
	const char *name;
	unsigned kind;      /* enum fh_role_kind */
	unsigned tp_rank;   /* TP: its rank; DCP: the first TP rank of the group */
	const struct fh_model *m; /* NULL: fh_model_default */
	const char *engine;       /* its engine_id (NULL: the default engine) */
};

struct fh_worker_cfg {
	const char *sock;
	const struct fh_prompt *prompts;
	unsigned n_prompts;                /* RUN's: prompts[0..n_prompts) */
	bool seal;                         /* prompts[n_prompts] is the seal prompt (FH_CMD_SEAL) */
	unsigned dcp_size, dcp_interleave; /* the DCP role's layout */
	uint32_t num_blocks;               /* engine blocks a rank */
	int64_t hang_ms;                   /* a request not completed by then is a hang */
	int64_t attach_timeout_ms;
	unsigned think_us;                 /* at most this long between two operations */
	uint64_t t0_ns;                    /* kvr_now_ns() of the test's start: times printed relative to it */
};

/* Fork the process of `role`: it attaches, then follows sh->cmd (RUN: random stores and
 * loads, every restored byte checked; QUIET: idle, attached; VERIFY: every prompt looked up
 * and what hits loaded and checked, once; SEAL: the seal prompt stored from every rank, once;
 * EXIT: detach and exit 0) until killed. It dies
 * with its parent. Returns the pid or -errno. */
pid_t fh_worker_spawn(const struct fh_worker_cfg *cfg, const struct fh_role *role, struct fh_wshared *sh,
		      uint64_t seed);

/* ---- checks on the instance --------------------------------------------------------- */

/* A slot that is neither FREE nor COMMITTED, or holds a pin, once everything is quiet. */
bool fh_slot_offends(const struct kvr_slot_table *t, uint32_t i);
/* Slots that offend; each printed to stderr (state, epoch, key, lane, owner — and what that
 * worker slot is now, from ctl when not NULL — and pins by index) when dump. */
struct kvr_ctl;
uint32_t fh_slots_offending(const struct kvr_slot_table *t, const struct kvr_ctl *ctl, bool dump, const char *what);
/* Slot i as the dump prints it, into buf. */
void fh_slot_describe(const struct kvr_slot_table *t, const struct kvr_ctl *ctl, uint32_t i, char *buf, size_t len);

/* Which model each block key of a test's prompts belongs to (keys of two namespaces never
 * meet), and the slot model tag (kvr_slot_model) each model's slots must carry (0: not
 * checked). Filled once in the test process; fh_keymap_free releases it. */
struct fh_keymap {
	unsigned n_models;
	const struct fh_model *models[FH_MAX_MODELS];
	uint8_t tag[FH_MAX_MODELS];
	uint32_t n, cap;
	struct fh_keyent { kvr_key key; uint32_t model; } *e; /* sorted by key */
};

/* Add every key of prompts p[0..n) as model m's (added to models if new). 0 or -ENOMEM / -E2BIG. */
int fh_keymap_add(struct fh_keymap *km, const struct fh_model *m, const struct fh_prompt *p, unsigned n);
/* The model index of key, or -1. */
int fh_keymap_find(const struct fh_keymap *km, kvr_key key);
void fh_keymap_free(struct fh_keymap *km);

/* Every COMMITTED slot against its key's content: wrong ones counted (and printed). km NULL:
 * every slot holds a default-model lane, ret_checked[0] counts them; else each key's model
 * gives the lane length and the tag the slot must carry, and ret_checked[k] counts model
 * k's slots (a key of no prompt, or a wrong tag, is a wrong slot). */
uint32_t fh_l1_check(const struct kvr_slot_table *t, void *arena_base, const struct fh_keymap *km,
		     uint32_t *ret_checked);

struct fh_l2_scan {
	uint64_t files;          /* block files found under real names */
	uint64_t ok;             /* header, checksum and every payload byte right */
	uint64_t wrong;          /* header and checksum valid (it would be served) but bytes wrong */
	uint64_t damaged;        /* bad header, size or checksum under a real name */
	uint64_t tmp;            /* temporary files left */
	uint64_t bytes;          /* payload bytes compared */
	uint64_t ok_by_model[FH_MAX_MODELS]; /* of ok, the files of each keymap model */
};

/* Read every block file under dir (the directory of namespace ns inside it: the slot table's)
 * and check it: header and checksum of a slot-sized payload (FH_LANE_BYTES), then the lane of
 * the key's model (km NULL: the default model's) against the key's bytes. */
void fh_l2_scan(const char *dir, kvr_key ns, const struct fh_keymap *km, struct fh_l2_scan *acc);

#endif
