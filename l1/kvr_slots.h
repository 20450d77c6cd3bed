/* kvr_slots: the L1 slot table (segment KVR_SEG_SLOTS): per-slot state, key, lane, epoch, pins. */
#ifndef KVR_SLOTS_H
#define KVR_SLOTS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_keys.h"
#include "kvr_segment.h"

/*
 * The slot table is the source of truth for L1. Segment layout (created by kvringd with
 * kvr_segment_create(KVR_SEG_SLOTS, kvr_slots_memsize(n)), then kvr_slots_init()):
 *
 *   struct kvr_slot_table      segment header, geometry summary, clocks     (256 bytes)
 *   struct kvr_slot [n_slots]  one 64-byte line per slot
 *
 * Slot i's bytes live in the arena segment at arena_data_off + i * slot_bytes
 * (kvr_slot_data()). A slot holds one lane (one TP rank's shard) of one block.
 *
 * State machine (FREE -> WRITING -> COMMITTED -> FREE, WRITING -> FREE on abort,
 * COMMITTED -> EVICTING -> FREE when a copy to L2 must finish first, WRITING -> DRAINING ->
 * FREE when an aborted slot still has I/O in flight):
 *
 *   alloc        FREE -> WRITING          epoch++, key/lane/owner set     else -EBUSY
 *   commit       WRITING -> COMMITTED     epoch must match                else -ESTALE
 *   abort        WRITING -> FREE          epoch must match                else -ESTALE;
 *                WRITING -> DRAINING      (returns 1) when an I/O pin is held: a read may
 *                                         still land in the slot, so it is not reusable
 *   drained      DRAINING -> FREE         no pin left, else -EBUSY; -ESTALE when not DRAINING
 *   pin(o)       COMMITTED, pin o++       epoch must match, else -ESTALE; -EOVERFLOW at 255
 *   pin_io       WRITING or COMMITTED (as asked), io pin++: the disk actor around one I/O
 *   unpin(o)     pin o--                  any state; -ENOENT when pin o is already 0
 *   drop_pins(o) pin o = 0                a dead owner's pins (its successor calls it)
 *   evict_begin  COMMITTED -> EVICTING    all pins 0                      -EBUSY / -ESTALE
 *   evict_cancel EVICTING -> COMMITTED    epoch must match                else -ESTALE
 *   evict        COMMITTED|EVICTING -> FREE, all pins 0: -EBUSY when WRITING or pinned,
 *                                         -ESTALE when FREE or the epoch differs
 *
 * Pins and their owners (DESIGN.md 7a: each pin has exactly one owner, and a restarted
 * owner releases exactly what its predecessor held):
 *   KVR_PIN_WORKER(w)  0..15  the loader of worker w, around a copy out of the slot;
 *   KVR_PIN_LOOKUP     16     the lookup actor: the L1 prefix of a lookup that waits for
 *                             promotions from L2 (a restarted lookup actor drops them all);
 *   KVR_PIN_IO         17     the disk actor the slot's key routes to, for exactly one I/O in
 *                             flight into or out of the slot (its successor drops them);
 *   KVR_PIN_REMOTE     18     the remote (cluster) tier actor, likewise.
 * A slot is reusable only once nothing can still write into it: an aborted slot with an
 * I/O pin waits in DRAINING (key, lane and epoch kept, so its owner can be found) until
 * the I/O is done or its actor is dead and replaced.
 *
 * A committed slot with any pin > 0 is "reading" (inspect shows it so).
 *
 * Concurrency: the lookup actor is the single writer of state, epoch, key, lane, owner,
 * last_access and commit_seq. Pin and eviction (and pin and abort) race safely: the
 * pinner increments, fences, then re-checks state and epoch; the evictor moves the slot to
 * EVICTING (the aborter to DRAINING), fences, then re-checks the pins — at least one of
 * them sees the other and backs off.
 * state is published with release after the fields it covers are written, and read with
 * acquire. Functions taking a const table are safe on a read-only mapping.
 */

enum kvr_slot_state {
	KVR_SLOT_FREE = 0,
	KVR_SLOT_WRITING = 1,
	KVR_SLOT_COMMITTED = 2,
	KVR_SLOT_EVICTING = 3,
	KVR_SLOT_DRAINING = 4,
	KVR_SLOT_STATE_MAX = 5,
};

#define KVR_SLOT_MAX_WORKERS 16     /* pins[] entries: one per worker slot */
#define KVR_PIN_WORKER(w) (w)
#define KVR_PIN_LOOKUP 16u
#define KVR_PIN_IO 17u
#define KVR_PIN_REMOTE 18u
#define KVR_PIN_OWNERS 19u
#define KVR_SLOT_OWNER_LOOKUP 0xfeu /* owner of a WRITING slot the lookup actor fills from L2 */
#define KVR_SLOT_ALIGN 4096u        /* slot_bytes and arena_data_off alignment (O_DIRECT) */
#define KVR_SLOTS_ARENA_DATA_OFF 4096u /* where slot 0 starts in the arena (after its header) */
#define KVR_SLOTS_MAGIC 0x53544f4c53524b56ull /* "VKRSLOTS" */
#define KVR_SLOT_NONE 0xffffffffu

struct kvr_slot {
	_Atomic uint32_t state;   /* enum kvr_slot_state */
	uint32_t epoch;           /* +1 per allocation; (slot, epoch) names one allocation */
	kvr_key key;              /* the block's key (zero when FREE) */
	uint16_t lane;            /* TP rank whose shard this is */
	uint8_t owner;            /* worker slot that wrote (or is writing) it, or KVR_SLOT_OWNER_LOOKUP */
	uint8_t model;            /* model entry of the engine it was allocated for (kvr_ctl_model; 0 "other") */
	uint32_t block_tokens;    /* block size it was stored under */
	uint64_t last_access;     /* table clock at commit / last hit */
	uint32_t commit_seq;      /* table commit sequence at commit */
	_Atomic uint8_t pins[KVR_SLOT_MAX_WORKERS]; /* loads of worker w holding it */
	_Atomic uint8_t lk_pins;  /* KVR_PIN_LOOKUP */
	_Atomic uint8_t io_pins;  /* KVR_PIN_IO */
	_Atomic uint8_t rm_pins;  /* KVR_PIN_REMOTE */
	uint8_t lanes;            /* lanes of its block (its engine's quorum) in a table of several
				   * (quorum 0); 0 in a table of one */
};
_Static_assert(sizeof(struct kvr_slot) == 64, "a slot is one cache line");
_Static_assert(offsetof(struct kvr_slot, key) == 8, "slot layout");
_Static_assert(offsetof(struct kvr_slot, lane) == 24, "slot layout");
_Static_assert(offsetof(struct kvr_slot, last_access) == 32, "slot layout");
_Static_assert(offsetof(struct kvr_slot, pins) == 44, "slot layout");
_Static_assert(offsetof(struct kvr_slot, lk_pins) == 60 && offsetof(struct kvr_slot, rm_pins) == 62, "slot layout");

struct kvr_slot_table {
	struct kvr_seg_hdr seg;   /* kind KVR_SEG_SLOTS */
	uint64_t magic;           /* KVR_SLOTS_MAGIC, written last by kvr_slots_init */
	uint32_t n_slots;
	uint32_t block_tokens;    /* tokens a block; 0: each slot's own (kvr_slot.block_tokens; no model section) */
	uint64_t slot_bytes;      /* bytes per slot in the arena, multiple of KVR_SLOT_ALIGN */
	uint64_t arena_data_off;  /* offset of slot 0 in the arena segment */
	uint64_t slots_off;       /* offset of slot 0's struct kvr_slot from this header */
	kvr_key ns;               /* key namespace of every block in this table */
	uint32_t tp_size;         /* lanes are below it (a table of several quorums: KVR_SLOT_MAX_WORKERS) */
	uint32_t quorum;          /* lanes that must commit before a block is visible; 0: each block's own
				   * (kvr_slot.lanes: engines of several TP sizes, no model section) */
	_Atomic uint64_t clock;   /* logical clock for last_access (kvr_slots_tick) */
	_Atomic uint32_t commit_seq; /* next commit sequence number */
	uint32_t reserved0;
	uint8_t reserved[112];
};
_Static_assert(sizeof(struct kvr_slot_table) == 256, "slot table header");
_Static_assert(offsetof(struct kvr_slot_table, ns) == 104, "slot table layout");

struct kvr_slots_config {
	uint32_t n_slots;         /* >= 1 */
	uint64_t lane_bytes;      /* bytes one lane of a block needs; aligned up to KVR_SLOT_ALIGN */
	uint64_t arena_data_off;  /* 0 = KVR_SLOTS_ARENA_DATA_OFF; else a multiple of KVR_SLOT_ALIGN */
	kvr_key ns;
	uint32_t block_tokens;    /* 0: engines of several block sizes, each slot's its own */
	uint32_t tp_size;         /* 1..KVR_SLOT_MAX_WORKERS */
	uint32_t quorum;          /* 1..tp_size; 0: each block's own (kvr_slot.lanes, kvr_slot_alloc_tagged) */
};

/* Bytes of a slot-table segment (header included) with n_slots slots; 0 if n_slots is 0
 * or too large. */
size_t kvr_slots_memsize(uint32_t n_slots);

/* lane_bytes aligned up to KVR_SLOT_ALIGN (0 on overflow). */
uint64_t kvr_slots_slot_bytes(uint64_t lane_bytes);

/* Bytes of the arena segment that holds n_slots slots of lane_bytes (header area
 * included); 0 on overflow. */
uint64_t kvr_slots_arena_memsize(uint32_t n_slots, uint64_t lane_bytes);

/* Lay out a table in mem (the base of a KVR_SEG_SLOTS segment of mem_size bytes whose
 * kvr_seg_hdr kvr_segment_create already wrote; it is left alone). Every slot FREE, epoch
 * 0. Returns 0 and *ret, or -EINVAL (bad config) / -ENOSPC (mem_size too small). */
int kvr_slots_init(void *mem, size_t mem_size, const struct kvr_slots_config *cfg, struct kvr_slot_table **ret);

/* Validate a mapped slot-table segment: kind, magic, n_slots and offsets inside the
 * segment, slot_bytes aligned, quorum <= tp_size <= KVR_SLOT_MAX_WORKERS (quorum 0: each
 * block's own).
 * Returns 0 and *ret, or -EPROTO (not initialised / bad magic), -EMEDIUMTYPE (other
 * segment kind), -EBADMSG (fields out of range). Safe on a read-only mapping. */
int kvr_slots_attach(const struct kvr_segment *seg, struct kvr_slot_table **ret);

static inline struct kvr_slot *kvr_slot_at(const struct kvr_slot_table *t, uint32_t i)
{
	return (struct kvr_slot *)((uint8_t *)t + t->slots_off) + i;
}

/* Slot i's bytes in the arena mapped at arena_base (NULL when i is out of range). */
void *kvr_slot_data(const struct kvr_slot_table *t, void *arena_base, uint32_t i);

static inline uint32_t kvr_slot_state(const struct kvr_slot_table *t, uint32_t i)
{
	return atomic_load_explicit(&kvr_slot_at(t, i)->state, memory_order_acquire);
}

static inline uint32_t kvr_slot_epoch(const struct kvr_slot_table *t, uint32_t i)
{
	return __atomic_load_n(&kvr_slot_at(t, i)->epoch, __ATOMIC_RELAXED);
}

/* The next value of the table's logical clock (lookup only). */
uint64_t kvr_slots_tick(struct kvr_slot_table *t);

/* ---- transitions (lookup actor only, except the pins). Every one returns 0 or -errno; all
 * return -EINVAL for a slot index >= n_slots, a pin owner >= KVR_PIN_OWNERS or a lane
 * >= tp_size. ---------------------------------------------------------------------------- */

/* What a slot records of the engine it is allocated for, beside its key and lane. A field
 * the table fixes for every slot (a model section's block size and quorum) is ignored. */
struct kvr_slot_tag {
	uint32_t block_tokens;    /* its block size, on a table of mixed sizes (block_tokens 0) */
	uint8_t lanes;            /* its block's lanes, on a table of several quorums (quorum 0) */
	uint8_t model;            /* its engine's model entry (kvr_ctl.h's model table; 0 "other") */
};

/* FREE -> WRITING for `owner` (a worker slot or KVR_SLOT_OWNER_LOOKUP) on `lane`, tagged with
 * *tag (NULL: untagged — model 0, no lanes or block size of its own); epoch+1 returned in
 * *ret_epoch. The tag is written before the state, so whoever sees WRITING sees it. */
int kvr_slot_alloc_tagged(struct kvr_slot_table *t, uint32_t i, kvr_key key, uint16_t lane, uint8_t owner,
			  const struct kvr_slot_tag *tag, uint32_t *ret_epoch);
static inline int kvr_slot_alloc(struct kvr_slot_table *t, uint32_t i, kvr_key key, uint16_t lane, uint8_t owner,
				 uint32_t *ret_epoch)
{
	return kvr_slot_alloc_tagged(t, i, key, lane, owner, NULL, ret_epoch);
}
/* The most lanes a block of t has: its quorum, or (a table of several) tp_size. */
static inline unsigned kvr_slots_lanes_max(const struct kvr_slot_table *t)
{
	return t->quorum ? t->quorum : t->tp_size;
}

/* The lanes of slot i's block: the table's quorum, or the slot's own (0: not set). */
static inline unsigned kvr_slot_block_lanes(const struct kvr_slot_table *t, uint32_t i)
{
	return t->quorum ? t->quorum : kvr_slot_at(t, i)->lanes;
}

static inline uint8_t kvr_slot_model(const struct kvr_slot_table *t, uint32_t i)
{
	return __atomic_load_n(&kvr_slot_at(t, i)->model, __ATOMIC_RELAXED);
}

/* WRITING -> COMMITTED; stamps last_access (clock) and commit_seq. */
int kvr_slot_commit(struct kvr_slot_table *t, uint32_t i, uint32_t epoch);
/* WRITING -> FREE (0), or WRITING -> DRAINING (1) while an I/O pin is held: the slot must
 * not be reused before kvr_slot_drained() says so. */
int kvr_slot_abort(struct kvr_slot_table *t, uint32_t i, uint32_t epoch);
/* DRAINING -> FREE once no pin is left (-EBUSY while one is; -ESTALE when not DRAINING). */
int kvr_slot_drained(struct kvr_slot_table *t, uint32_t i);
/* Record a hit: last_access = clock (COMMITTED only; -ESTALE otherwise). */
int kvr_slot_touch(struct kvr_slot_table *t, uint32_t i, uint64_t clock);
/* Pin `owner` (KVR_PIN_*) ++ on a COMMITTED slot of that epoch. */
int kvr_slot_pin(struct kvr_slot_table *t, uint32_t i, uint32_t epoch, unsigned owner);
/* The I/O pin ++ on a slot in `state` (KVR_SLOT_WRITING: a read fills it; KVR_SLOT_COMMITTED:
 * a write copies it out) of that epoch; -ESTALE otherwise. Held until the I/O completed. */
int kvr_slot_pin_io(struct kvr_slot_table *t, uint32_t i, uint32_t epoch, unsigned state);
/* The same for the remote tier actor's pin (KVR_PIN_REMOTE): around one GET into a WRITING
 * slot, or around the copy of a COMMITTED slot into a SET. */
int kvr_slot_pin_remote(struct kvr_slot_table *t, uint32_t i, uint32_t epoch, unsigned state);
/* Pin `owner` -- (atomic; any process). -ENOENT when it is 0. */
int kvr_slot_unpin(struct kvr_slot_table *t, uint32_t i, unsigned owner);
/* Pin `owner` of slot i set to 0 (its owner is dead); returns how many it held. */
unsigned kvr_slot_drop_pins(struct kvr_slot_table *t, uint32_t i, unsigned owner);
/* Pin `owner` of slot i. */
unsigned kvr_slot_pins_of(const struct kvr_slot_table *t, uint32_t i, unsigned owner);
/* Sum of pins over every owner. */
unsigned kvr_slot_pins(const struct kvr_slot_table *t, uint32_t i);
/* COMMITTED -> EVICTING (no pins). */
int kvr_slot_evict_begin(struct kvr_slot_table *t, uint32_t i, uint32_t epoch);
/* EVICTING -> COMMITTED (an eviction that must not proceed after all). */
int kvr_slot_evict_cancel(struct kvr_slot_table *t, uint32_t i, uint32_t epoch);
/* COMMITTED or EVICTING -> FREE (no pins; from COMMITTED through evict_begin). */
int kvr_slot_evict(struct kvr_slot_table *t, uint32_t i, uint32_t epoch);

struct kvr_slots_release {
	uint32_t unpinned_slots; /* slots on which pins[w] was > 0 */
	uint32_t pins;           /* pins dropped in total */
	uint32_t aborted;        /* WRITING slots owned by w returned to FREE (or DRAINING) */
	uint32_t draining;       /* of those, left DRAINING: an I/O into them is in flight */
};

/* Worker w is gone: zero pins[w] on every slot and abort every WRITING slot it owns.
 * Counts in *ret (may be NULL). Returns 0 or -EINVAL. */
int kvr_slots_release_worker(struct kvr_slot_table *t, unsigned w, struct kvr_slots_release *ret);

struct kvr_slot_counts {
	uint32_t by_state[KVR_SLOT_STATE_MAX]; /* FREE, WRITING, COMMITTED, EVICTING, DRAINING */
	uint32_t reading;  /* COMMITTED with any pin > 0 */
	uint32_t invalid;  /* state outside the enum (never expected) */
	uint64_t pins;     /* sum of all pins */
};

/* Count slots by state (a snapshot; safe on a read-only mapping). */
void kvr_slots_counts(const struct kvr_slot_table *t, struct kvr_slot_counts *ret);

/* Committed slots by model (kvr_slot.model): ret[m] for m < n, models >= n counted in ret[0]
 * (the "other" entry). ret is zeroed first. A snapshot; safe on a read-only mapping. */
void kvr_slots_model_counts(const struct kvr_slot_table *t, uint64_t *ret, unsigned n);

/* "free", "writing", "committed", "evicting", "draining" or "invalid". */
const char *kvr_slot_state_name(unsigned s);

#endif
