/* kvr_index: the lookup actor's private block index (quorum, suffix-only allocation, LRU / S3-FIFO eviction). */
#ifndef KVR_INDEX_H
#define KVR_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr_keys.h"
#include "kvr_slots.h"

/*
 * A hash map block key -> block entry { slot per lane, allocated lane mask, committed lane
 * mask, eviction-policy links }, in the lookup actor's heap. Nothing in it needs to
 * survive a restart: kvr_index_rebuild() re-creates every entry from the slot table (the
 * source of truth), so a restarted lookup loses nothing committed.
 *
 * Lanes: a block has `lanes` = table quorum lanes (tp_size for MHA, 1 for MLA), or, on a
 * table of several quorums (quorum 0, no model section), its own, given when it is first
 * allocated (kvr_index_alloc_tagged). It is VISIBLE when every one of its lanes is
 * committed. For MLA the caller maps every rank to lane 0.
 *
 * Every function that changes a slot does it through the kvr_slot_* transitions, so the
 * index and the table never disagree; the index is the table's single writer (the lookup
 * actor). Not thread-safe.
 */

#define KVR_INDEX_MAX_LANES KVR_SLOT_MAX_WORKERS

/* One (slot, epoch) reference; layout-identical to struct kvr_msg_slot, and the two
 * sentinels are KVR_SLOT_PRESENT / KVR_SLOT_NOROOM of include/kvring/msg.h. */
struct kvr_index_ref {
	uint32_t slot, epoch;
};
#define KVR_INDEX_PRESENT 0xffffffffu /* alloc: this lane of the block is already allocated or committed */
#define KVR_INDEX_NOROOM 0xfffffffeu  /* alloc: no free slot and nothing evictable */

struct kvr_index;

/* Create an index over table t with eviction policy `policy` ("lru" or "s3fifo", see
 * kvr_policy_names()) and rebuild it from the table. Returns 0 and *ret, or -EINVAL
 * (unknown policy, NULL), -ENOMEM. */
int kvr_index_new(struct kvr_slot_table *t, const char *policy, struct kvr_index **ret);

/* An eviction veto: called for a candidate block (after the index's own checks) with its
 * key and its slot per lane (lanes entries, KVR_SLOT_NONE where a lane has none); false
 * keeps it (an L2 write of a lane is still queued; write-back: not on disk yet). NULL = none. */
typedef bool (*kvr_index_evict_hook_fn)(void *ctx, kvr_key key, const uint32_t *lane_slots);
void kvr_index_set_evict_hook(struct kvr_index *idx, kvr_index_evict_hook_fn fn, void *ctx);

/* Progress: called every KVR_INDEX_PROGRESS_KEYS keys of a long match or allocation, so
 * the lookup actor can show it is busy, not stuck (kvr_actor_beat). NULL = none. */
#define KVR_INDEX_PROGRESS_KEYS 4096u
typedef void (*kvr_index_progress_fn)(void *ctx);
void kvr_index_set_progress(struct kvr_index *idx, kvr_index_progress_fn fn, void *ctx);

/* Free; accepts NULL. The slot table is left as it is. */
void kvr_index_free(struct kvr_index *idx);

/* Drop every entry and re-create them from table t (t may be a new mapping of the same
 * table, or the table the index was created with; its n_slots and quorum must equal the
 * index's, else -EINVAL): WRITING and COMMITTED slots become lanes of their block, FREE
 * slots the free list, recency order from last_access (the policy is re-filled oldest
 * first; S3-FIFO puts rebuilt blocks in its main queue). Slots that cannot belong to a
 * block (lane >= lanes, another block size, a second slot for the same key and lane) are
 * released (aborted / evicted) unless pinned, and so are WRITING slots owned by
 * KVR_SLOT_OWNER_LOOKUP (promotions of a lookup actor that died); EVICTING slots (an
 * eviction the dead lookup actor did not finish) go back to COMMITTED; DRAINING slots wait
 * for kvr_index_reap.
 * Returns the number of blocks, or -errno. */
int kvr_index_rebuild(struct kvr_index *idx, struct kvr_slot_table *t);

/* Number of leading VISIBLE blocks of keys[0..n). For each of them ret_slots[i] (may be
 * NULL) gets lane `lane`'s (slot, epoch). Matched blocks count as accessed (the slot's
 * last_access is stamped; the policy records a hit once per lookup: on lane 0).
 * Returns the count, or -EINVAL (lane >= lanes, keys NULL with n > 0). */
int kvr_index_match(struct kvr_index *idx, const kvr_key *keys, uint32_t n, unsigned lane,
		    struct kvr_index_ref *ret_slots);

struct kvr_index_alloc_stats {
	uint32_t allocated; /* new WRITING slots */
	uint32_t present;   /* lane already allocated or committed: nothing to write */
	uint32_t noroom;    /* not stored */
	uint32_t evicted;   /* blocks evicted to make room */
};

/* Allocate lane `lane` of keys[0..n) for `owner` (a worker slot, or KVR_SLOT_OWNER_LOOKUP
 * for a promotion from L2) (suffix-only). Per key,
 * ret_slots[i] is:
 *   (slot, epoch)       a new WRITING slot: write the lane's bytes, then kvr_index_commit
 *   KVR_INDEX_PRESENT   this lane of the block is already allocated or committed
 *   KVR_INDEX_NOROOM    no free slot and no evictable block (-ENOSPC for that block). Every
 *                       later key that is not PRESENT is NOROOM too: after a gap the
 *                       chain cannot match, so storing it would only evict useful blocks.
 * When no slot is free a victim block is chosen by the policy and all its lanes are freed;
 * a victim never has a WRITING lane, a pinned lane, or a key in keys[0..n).
 * Returns 0 (stats in *ret_stats, may be NULL) or -EINVAL (lane >= lanes, owner >=
 * KVR_SLOT_MAX_WORKERS, NULL arrays with n > 0). */
int kvr_index_alloc(struct kvr_index *idx, const kvr_key *keys, uint32_t n, unsigned lane, unsigned owner,
		    struct kvr_index_ref *ret_slots, struct kvr_index_alloc_stats *ret_stats);
/* kvr_index_alloc for an engine's blocks, every slot allocated tagged with *tag (its model,
 * block size and lanes: kvr_slot_alloc_tagged). tag->lanes is the blocks' lane count (their
 * quorum): on a table of several quorums (quorum 0: engines of several TP sizes) each block
 * has its own, set when its entry is made; a key whose block has another lane count is
 * NOROOM. On a table of one, it must be the table's quorum. -EINVAL as kvr_index_alloc, and
 * for a NULL tag, lanes 0, above the table's most, or lane >= lanes. */
int kvr_index_alloc_tagged(struct kvr_index *idx, const kvr_key *keys, uint32_t n, unsigned lane,
			   const struct kvr_slot_tag *tag, unsigned owner, struct kvr_index_ref *ret_slots,
			   struct kvr_index_alloc_stats *ret_stats);

/* The lane in `slot` was written: WRITING -> COMMITTED. Returns 1 when the block became
 * visible with this commit, 0 when it is not (yet) visible, -ESTALE when (slot, epoch) is
 * not a WRITING allocation the index knows (aborted, reused, already committed), -EINVAL
 * when slot is out of range or belongs to another lane. */
int kvr_index_commit(struct kvr_index *idx, unsigned lane, uint32_t slot, uint32_t epoch);

/* The write of (slot, epoch) failed: WRITING -> FREE, 0; or -> DRAINING, 1, when an I/O
 * into the slot is still in flight (the slot is reused only after kvr_index_reap found
 * it drained). A block left with no lane disappears. -ESTALE or -EINVAL as for commit. */
int kvr_index_abort(struct kvr_index *idx, uint32_t slot, uint32_t epoch);

/* Abort every WRITING slot owned by w: a worker slot (its storer restarted or it is gone,
 * so nothing of it can still write) or KVR_SLOT_OWNER_LOOKUP. Returns the count. */
int kvr_index_abort_owner(struct kvr_index *idx, unsigned w);

/* DRAINING slots whose I/O is done (no pin left), and evicted lanes left EVICTING because
 * a loader's pin attempt overlapped the eviction, go back to the free list. Returns how
 * many did; kvr_index_alloc reaps too when it finds no free slot. */
unsigned kvr_index_reap(struct kvr_index *idx);
/* Slots waiting in DRAINING. */
unsigned kvr_index_draining(const struct kvr_index *idx);

/* Worker w is gone: abort its WRITING slots and drop all its pins. 0 or -EINVAL. */
int kvr_index_release_worker(struct kvr_index *idx, unsigned w, struct kvr_slots_release *ret);

struct kvr_index_block {
	kvr_key key;
	uint16_t alloc_mask, commit_mask;
	bool visible;
	uint8_t lanes;          /* lanes of the block (its quorum) */
	uint32_t slot[KVR_INDEX_MAX_LANES]; /* KVR_SLOT_NONE where the lane has none */
};

/* The entry of key: 0 and *ret, or -ENOENT. */
int kvr_index_get(const struct kvr_index *idx, kvr_key key, struct kvr_index_block *ret);

/* The memory of what left (for a miss's reason, never for a decision): blocks evicted from
 * L1 are remembered by the index itself, callers add what left another tier (an L2 file
 * deleted) and forget what came back. Direct-mapped over KVR_INDEX_GONE_SLOTS cells: a
 * departure long ago is forgotten. */
#define KVR_INDEX_GONE_SLOTS 65536u
void kvr_index_remember_gone(struct kvr_index *idx, kvr_key key);
void kvr_index_forget_gone(struct kvr_index *idx, kvr_key key);
bool kvr_index_gone_recently(const struct kvr_index *idx, kvr_key key);

struct kvr_index_stats {
	uint32_t blocks;        /* entries */
	uint32_t visible;       /* entries with every lane committed */
	uint32_t free_slots;
	uint32_t lanes;
	uint64_t evictions;     /* blocks evicted since creation */
	uint64_t noroom;        /* keys answered KVR_INDEX_NOROOM */
	const char *policy;
};
void kvr_index_stats(const struct kvr_index *idx, struct kvr_index_stats *ret);

/* ---- eviction policies -----------------------------------------------------------------
 * One small interface over entry ids 0..max_ents-1, used by the index; public for tests.
 *   lru     least recently inserted/hit first.
 *   s3fifo  S3-FIFO (Yang et al., SOSP'23): new blocks enter a small FIFO (10% of the
 *           capacity); a block hit while there moves to the main FIFO when it reaches the
 *           tail, others are evicted and their key kept in a ghost FIFO (as many keys as
 *           the main queue holds); a block whose key is in the ghost enters main directly.
 *           Main is a FIFO with a 2-bit frequency: a block at the tail with freq > 0 is
 *           reinserted with freq - 1. One-off scans pass through the small queue without
 *           displacing the main queue's hot set.
 * victim() never returns an entry the evictable callback rejects; rejected entries keep
 * their place in LRU order and go round to the head of their S3-FIFO queue. */

struct kvr_policy;
typedef bool (*kvr_policy_evictable_fn)(void *ctx, uint32_t ent);

/* capacity: blocks the cache holds (sizes S3-FIFO's queues and ghost). -EINVAL for an
 * unknown name or zero sizes, -ENOMEM. */
int kvr_policy_new(const char *name, uint32_t max_ents, uint32_t capacity, struct kvr_policy **ret);
void kvr_policy_free(struct kvr_policy *p);
const char *kvr_policy_name(const struct kvr_policy *p);
/* "lru, s3fifo" (for error messages). */
const char *kvr_policy_names(void);
/* A new entry (warm: it was in the cache before a restart). */
void kvr_policy_insert(struct kvr_policy *p, uint32_t ent, kvr_key key, bool warm);
void kvr_policy_hit(struct kvr_policy *p, uint32_t ent);
/* The entry leaves (evicted: chosen by victim() and evicted; else removed for another
 * reason, e.g. its only lane aborted). */
void kvr_policy_remove(struct kvr_policy *p, uint32_t ent, bool evicted);
/* The entry to evict next, or KVR_SLOT_NONE when no entry is evictable. */
uint32_t kvr_policy_victim(struct kvr_policy *p, kvr_policy_evictable_fn evictable, void *ctx);

#endif
