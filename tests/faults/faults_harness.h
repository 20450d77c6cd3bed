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
 * One model for every fault test: MHA, 2 layers, 4 KV heads of 16 bf16 elements, 16-token
 * blocks, TP 2 (2 heads a lane). A lane of a block is 4 regions (layer 0 K, V, layer 1 K,
 * V) of 16 token rows of 64 bytes: 4096 bytes, one 4 KiB slot, one 8 KiB L2 file.
 *
 * Bytes follow the block key (the chained hash of the block's tokens and everything before
 * them): byte o of the canonical lane `lane` of block `key` is fh_lane_content(key, lane)[o],
 * where o counts region by region, token row by token row (the slot's layout). A TP rank
 * holds that lane in its engine block as is; a DCP rank holds its tokens' rows of it (token
 * t belongs to rank (t / I) mod D, its rows in increasing t), computed here by brute force,
 * independent of kvr_dcp.c. So every byte a load restores, every committed slot and every
 * L2 payload can be checked against the key alone, whoever stored it.
 *
 * Nothing in this file asserts through Criterion: worker processes (fh_worker_run) use it
 * after fork; functions return 0 / -errno or counts.
 */

#define FH_BT 16u
#define FH_LAYERS 2u
#define FH_LANE_HEADS 2u
#define FH_HEAD_DIM 16u
#define FH_DTYPE 2u
#define FH_TP 2u
#define FH_ROW (FH_LANE_HEADS * FH_HEAD_DIM * FH_DTYPE) /* 64 bytes: one token of one region */
#define FH_REGIONS (2u * FH_LAYERS)
#define FH_LANE_BYTES (FH_REGIONS * FH_BT * FH_ROW)      /* 4096 */
#define FH_CANARY 0xa5u                                   /* a block no load was given */

/* ct_model of this model (client_harness). */
#define FH_CT_MODEL {.layers = FH_LAYERS, .kv_heads = FH_LANE_HEADS * FH_TP, .head_dim = FH_HEAD_DIM, \
		     .dtype_bytes = FH_DTYPE, .block_tokens = FH_BT, .tp_size = FH_TP}

void fh_lane_content(kvr_key key, unsigned lane, uint8_t out[FH_LANE_BYTES]);

/* ---- prompts ------------------------------------------------------------------------ */

#define FH_MAX_BLK 8u

struct fh_prompt {
	uint32_t n; /* blocks */
	uint32_t tokens[FH_MAX_BLK * FH_BT];
	kvr_key keys[FH_MAX_BLK];
};

/* n prompts over `families` shared prefixes (1..max_blk blocks each) from seed, keyed under
 * ns (the instance's namespace: the slot table's). */
void fh_make_prompts(struct fh_prompt *p, unsigned n, unsigned families, unsigned max_blk, uint64_t seed, kvr_key ns);
/* One prompt of exactly n_blocks random blocks. */
void fh_make_prompt(struct fh_prompt *p, unsigned n_blocks, uint64_t seed, kvr_key ns);

/* ---- ranks -------------------------------------------------------------------------- */

struct fh_rank {
	struct kvr_client *c;
	struct kvr_geometry g;
	int fd;
	uint8_t *kv;
	uint64_t bytes;
	unsigned lane;      /* the lane it stores and loads: tp_rank / dcp_size */
	uint64_t next_req;
};

/* Geometry and KV memory (a memfd, every byte FH_CANARY), not attached. A TP rank of the
 * model: tp_size FH_TP, dcp_size 1. A DCP rank: TP 2 x dcp_size ranks, DCP rank
 * tp_rank mod dcp_size, interleave il. 0 or -errno. */
int fh_rank_prepare(struct fh_rank *r, unsigned tp_size, unsigned tp_rank, unsigned dcp_size, unsigned il,
		    uint32_t num_blocks);
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

enum fh_cmd { FH_CMD_RUN = 1, FH_CMD_QUIET, FH_CMD_VERIFY, FH_CMD_EXIT };
enum fh_wstate { FH_W_STARTING = 0, FH_W_ATTACHING, FH_W_RUNNING, FH_W_IDLE, FH_W_VERIFIED };

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
};

struct fh_worker_cfg {
	const char *sock;
	const struct fh_prompt *prompts;
	unsigned n_prompts;
	unsigned dcp_size, dcp_interleave; /* the DCP role's layout */
	uint32_t num_blocks;               /* engine blocks a rank */
	int64_t hang_ms;                   /* a request not completed by then is a hang */
	int64_t attach_timeout_ms;
	unsigned think_us;                 /* at most this long between two operations */
	uint64_t t0_ns;                    /* kvr_now_ns() of the test's start: times printed relative to it */
};

/* Fork the process of `role`: it attaches, then follows sh->cmd (RUN: random stores and
 * loads, every restored byte checked; QUIET: idle, attached; VERIFY: every prompt looked up
 * and what hits loaded and checked, once; EXIT: detach and exit 0) until killed. It dies
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

/* Every COMMITTED slot against its key's content: wrong ones counted (and printed). */
uint32_t fh_l1_check(const struct kvr_slot_table *t, void *arena_base, uint32_t *ret_checked);

struct fh_l2_scan {
	uint64_t files;          /* block files found under real names */
	uint64_t ok;             /* header, checksum and every payload byte right */
	uint64_t wrong;          /* header and checksum valid (it would be served) but bytes wrong */
	uint64_t damaged;        /* bad header, size or checksum under a real name */
	uint64_t tmp;            /* temporary files left */
	uint64_t bytes;          /* payload bytes compared */
};

/* Read every block file under dir (the namespace's directory inside it) and check it. */
void fh_l2_scan(const char *dir, kvr_key ns, struct fh_l2_scan *acc);

#endif
