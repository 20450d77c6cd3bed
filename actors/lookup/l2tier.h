/* l2tier: the lookup actor's view of the disk tier — which block lanes are on disk, write-through, promotion reads. */
#ifndef KVR_L2TIER_H
#define KVR_L2TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr_actor.h"
#include "kvr_index.h"
#include "kvr_keys.h"

/*
 * With l2.dirs configured the lookup actor
 *   - learns what the disk actors hold (L2_SYNC at start -> L2_HAVE per block lane; then
 *     L2_WRITE_DONE adds, L2_GONE removes);
 *   - writes every lane it commits through to L2 (L2_WRITE through a write queue: a lane
 *     waits there, unevictable, until its disk actor answered — a full ring delays a write,
 *     never drops it; a disk actor that died has its unanswered writes sent again);
 *   - extends a lookup past the L1 prefix over blocks whose every lane is in L1 or L2: the
 *     requester's lane is promoted — a slot allocated (WRITING, owned by the requester)
 *     and filled by an L2_READ — and the LOOKUP_REP waits until every read is verified
 *     and committed. The reply covers the blocks up to the first read that failed.
 * A disk actor is chosen by key (kvr_key_disk). Promotion slots are the lookup actor's
 * (KVR_SLOT_OWNER_LOOKUP), so a requester that dies or resets cannot free them. Reads
 * outstanding on a disk actor that died are aborted at once: a slot the dead actor may
 * still be reading into keeps its I/O pin and waits DRAINING until the successor released
 * its predecessor's pins. A read that failed forgets the block lane only when the disk
 * actor says the file is gone (KVR_L2F_GONE), not when the read was merely aborted.
 *
 * With remote.cluster configured (the shared tier, docs/cluster.md) the same module also
 *   - hands every lane it commits to the remote actor (L2_WRITE on remote.req, no answer
 *     awaited: the shared tier is a cache; a full ring skips the write and counts it);
 *   - extends a lookup past L1 and L2 over blocks the cluster may hold: the requester's
 *     lane is read into a slot of its own exactly as an L2 promotion (the remote actor
 *     checks that every TP lane is in the cluster and verifies the value first), at most
 *     L2T_RM_WINDOW reads ahead (one at first, doubled by each hit); the first miss ends
 *     the prefix. A lane promoted from the
 *     cluster is written through to L2 when there is one.
 * The instance may have the shared tier without L2 (l2.dirs empty).
 *
 * With l2.read_only nothing is ever written: no write-through (l2t_committed does nothing),
 * no write-back (l2.mode is ignored: l2t_demote returns 0 and no eviction veto is set, so
 * an L1 eviction just frees the slot; a promoted block is on disk already). Lookups over L2
 * and promotions work as above.
 */

#define L2T_MAX_DISKS KVR_L2_MAX_DIRS
#define L2T_RM_WINDOW 16 /* remote promotion reads of one lookup in flight at once */

/* The l2tier requester of a lease's lane: after the worker slots, one entry per
 * (scheduler slot, lane), so every lane of a lease promotes at once. */
#define L2T_LEASE_REQUESTER(max_workers, lanes, sched, lane) ((max_workers) + (sched) * (lanes) + (lane))

struct l2t_done {             /* a promotion that finished: reply to this requester */
	unsigned worker;          /* requester: a worker slot (< max_workers), else
				   * L2T_LEASE_REQUESTER(max_workers, lanes, scheduler slot, lane): one
				   * lane of the lease that scheduler slot extends */
	uint64_t wire;
	unsigned lane;
	uint32_t matched;         /* blocks to report */
	uint32_t promoted;        /* of those, read from L2 */
	const struct kvr_index_ref *refs;
	uint64_t index_ns;
	unsigned why;             /* enum kvr_miss_reason: why it stopped before the key list's end
				   * for a reason of the tier (a read failed, no room); 0 otherwise */
};

struct l2tier;

/* NULL (and 0) when the instance has neither L2 nor the shared tier. */
int l2t_open(struct kvr_actor *a, struct kvr_index *idx, struct l2tier **ret);
void l2t_close(struct l2tier *t);

/* Messages from disk.rep.N: 0 handled, -EBADMSG rejected, 1 not an L2 ring. When a
 * promotion finishes, *done is filled and 2 is returned (the caller replies). */
int l2t_on_msg(struct l2tier *t, struct kvr_ring *ring, const struct kvr_msg *m, struct l2t_done *done);

/* A lane was committed in L1: write it through (no-op without L2, read-only, or when on disk already). */
void l2t_committed(struct l2tier *t, kvr_key key, unsigned lane, uint32_t slot, uint32_t epoch);

/* Extend a lookup of keys[0..total) whose L1 prefix is `matched` blocks (refs[0..matched)
 * filled) over L2. refs must hold total entries. Returns the number of blocks when the
 * reply can go at once, or -EINPROGRESS when promotions were started (the reply comes
 * through l2t_on_msg / l2t_tick). */
int l2t_extend(struct l2tier *t, unsigned worker, uint64_t wire, unsigned lane, const kvr_key *keys, uint32_t total,
	       uint32_t matched, struct kvr_index_ref *refs, uint64_t index_ns);

/* Why requester worker's last extension stopped short for a reason of the tier (enum
 * kvr_miss_reason; 0 none) — also when l2t_extend answered at once, without a done. */
unsigned l2t_last_why(const struct l2tier *t, unsigned worker);

/* The worker starts a new lookup: forget the one still waiting (its client gave up; the
 * keys it points at are about to be overwritten). Its reads finish on their own. */
void l2t_cancel(struct l2tier *t, unsigned worker);

/* Housekeeping (the actor's tick): abort reads lost with a dead disk actor. May finish a
 * promotion: returns 1 and fills *done (call again until 0). */
int l2t_tick(struct l2tier *t, struct l2t_done *done);
/* Wake the disk actors sent to since the last call (requests are enqueued without a wake,
 * so that a burst of them costs one): the lookup actor calls it at the end of every pass,
 * after whatever sent in it. NULL: nothing. */
void l2t_wake(struct l2tier *t);

/* Write-back: L1 is full of blocks not on disk yet: write up to `want` of the least
 * recently used ones (they become evictable when their writes complete). Returns how many
 * writes were sent (0 without write-back, and always 0 read-only). */
unsigned l2t_demote(struct l2tier *t, unsigned want);

/* Lanes in the write queue: queued or sent, not yet answered (they cannot be evicted). */
unsigned l2t_writes_inflight(const struct l2tier *t);

/* Whether (key, lane) is on disk. */
bool l2t_has(const struct l2tier *t, kvr_key key, unsigned lane);

#endif
