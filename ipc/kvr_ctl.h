/* kvr_ctl: layout of the control segment (instance, actors, workers, ring directory, stats, rings). */
#ifndef KVR_CTL_H
#define KVR_CTL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_ring.h"
#include "kvr_segment.h"

/*
 * The control segment is created by kvringd at start and never resized. Layout:
 *
 *   struct kvr_ctl                       header, instance state, offsets
 *   struct kvr_actor_ent [max_actors]    one per actor slot (lookup, loader.N, storer.N, ...)
 *   struct kvr_worker_ent[max_workers    one per attachable worker slot, then
 *                  + max_schedulers]     one per scheduler slot (kvr_ctl_sched)
 *   struct kvr_ring_ent  [max_rings]     the ring directory: name, offset, endpoints
 *   struct kvr_actor_stats[max_actors]   counters each actor writes and kvringd exports
 *   char config_json[config_cap]         the effective config, as --check-config prints it
 *   uint8_t geometry[max_workers][18560] each attached worker's geometry (loader/storer read it)
 *   struct kvr_area_ent [n_areas]        where each client slot's area lies
 *   rings ...                            the rings no client uses, 64-byte aligned
 *   client areas [n_areas]               one per client slot (worker w: area w; scheduler i:
 *                                        area max_workers + i), KVR_CTL_AREA_ALIGN aligned:
 *     struct kvr_client_area             its header (a segment header of kind KVR_SEG_CLIENT),
 *                                        the waiter the client sleeps on, its cancel table,
 *                                        its layer-ordered loads' progress
 *     rings ...                          every ring that client produces or consumes
 *
 * All references are offsets from the segment base. Writers: kvringd writes the instance
 * fields, actor/worker table entries and the directory; each actor writes its own
 * heartbeat, stats and the rings it produces/consumes. Observers (kvring-inspect) map it
 * read-only.
 *
 * A client writes only its area. kvringd builds the segment in one memfd, then moves each
 * area into a memfd of its own (kvr_ctl_split_areas) and maps it over its place: every
 * process that serves clients maps the control segment and every area over it
 * (kvr_ctl_map_area; the offsets stay those of one segment). A client gets the control
 * segment read-only and its own area read-write; where the other areas lie it reads zeros.
 * Nothing in an area is trusted: where it lies and its size come from the area table.
 * A segment that was never split (tests building one in memory) keeps its areas inside.
 */

#define KVR_CTL_MAX_ACTORS 64
#define KVR_CTL_MAX_WORKERS 16
#define KVR_CTL_MAX_SCHEDULERS 16 /* scheduler slots: client entries after the workers' */
#define KVR_CTL_MAX_RINGS 256
#define KVR_ACTOR_NAME_MAX 24
#define KVR_CTL_GEOM_BYTES 18560 /* per worker: the geometry it attached with (kvr_geometry.h), 64-aligned */
#define KVR_CTL_RING_MSG_SIZE 64 /* every control-segment ring carries struct kvr_msg */
#define KVR_CTL_MAX_CLIENTS (KVR_CTL_MAX_WORKERS + KVR_CTL_MAX_SCHEDULERS) /* client slots, one area each */
#define KVR_CTL_AREA_ALIGN 65536u /* a client area's offset and size: a multiple of every Linux page size */
#define KVR_AREA_CANCEL_MAX 64   /* cancels a client can have outstanding (kvr_cancel: -EBUSY beyond) */
#define KVR_AREA_LAYERED_MAX 64  /* layer-ordered loads a client can have in flight (kvr_load_layered) */

enum kvr_inst_state {
	KVR_INST_STARTING = 1,
	KVR_INST_RUNNING = 2,
	KVR_INST_DEGRADED = 3, /* running, but at least one actor was given up on */
	KVR_INST_DRAINING = 4, /* SIGTERM received: no new work admitted */
	KVR_INST_STOPPED = 5,
};

enum kvr_actor_kind {
	KVR_ACTOR_LOOKUP = 1,
	KVR_ACTOR_LOADER = 2,
	KVR_ACTOR_STORER = 3,
	KVR_ACTOR_DISK = 4,
	KVR_ACTOR_GATHER = 5,
	KVR_ACTOR_REMOTE = 6,
};

/*
 * Where each actor sits in the actor table: the one home of the numbering. kvringd lays
 * the table out with these (supervisor/sup.h's SUP_ACTOR_* are these with its config);
 * actors find each other with them. mw = max_workers, nd = l2 dirs (disk actors).
 *   0                       lookup
 *   1 + 2w, 2 + 2w          loader.w, storer.w          (w < mw)
 *   1 + 2mw + d             disk.d                      (d < nd)
 *   1 + 2mw + nd + g        gather.g                    (g < mw / 2: a DCP group has >= 2 ranks)
 *   1 + 2mw + nd + mw / 2   remote                      (when remote.cluster is set)
 */
#define KVR_ACTOR_IX_LOOKUP 0u
#define KVR_ACTOR_IX_LOADER(w) (1u + 2u * (w))
#define KVR_ACTOR_IX_STORER(w) (2u + 2u * (w))
#define KVR_ACTOR_IX_DISK(mw, d) (1u + 2u * (mw) + (d))
#define KVR_N_GATHER(mw) ((mw) / 2u)
#define KVR_ACTOR_IX_GATHER(mw, nd, g) (1u + 2u * (mw) + (nd) + (g))
#define KVR_ACTOR_IX_REMOTE(mw, nd) (KVR_ACTOR_IX_GATHER(mw, nd, 0) + KVR_N_GATHER(mw))

enum kvr_actor_state {
	KVR_ACTOR_UNUSED = 0,   /* slot not in use */
	KVR_ACTOR_IDLE = 1,     /* configured, not running (e.g. no worker attached) */
	KVR_ACTOR_STARTING = 2, /* spawned, readiness not yet signalled */
	KVR_ACTOR_READY = 3,    /* rings attached, serving */
	KVR_ACTOR_BACKOFF = 4,  /* died; waiting to be restarted */
	KVR_ACTOR_FAILED = 5,   /* crash loop: given up */
	KVR_ACTOR_STOPPING = 6, /* asked to stop */
};

/* Who produces or consumes a ring. */
#define KVR_EP_SUPERVISOR (-1)
#define KVR_EP_CLIENT(w) (-2 - (int)(w)) /* worker slot w's client */
#define KVR_EP_IS_CLIENT(e) ((e) <= -2)
#define KVR_EP_CLIENT_SLOT(e) (-2 - (e))

struct kvr_actor_ent {
	char name[KVR_ACTOR_NAME_MAX]; /* "lookup", "loader.0", "disk.1" */
	uint32_t kind;                 /* enum kvr_actor_kind */
	uint32_t index;                /* worker slot, disk or gather index */
	_Atomic uint32_t state;        /* enum kvr_actor_state */
	_Atomic int32_t pid;           /* 0 when not running */
	_Atomic uint32_t generation;   /* +1 on every (re)start: clients fail requests of older ones */
	uint32_t restarts;             /* restarts since the instance started */
	int32_t last_exit_code;        /* -1 when none */
	int32_t last_exit_signal;      /* 0 when none */
	uint64_t started_ns;           /* CLOCK_MONOTONIC of the last spawn */
	uint64_t ready_ns;             /* CLOCK_MONOTONIC of the last readiness */
	_Atomic uint64_t heartbeat_ns; /* the actor's loop writes CLOCK_MONOTONIC here */
	uint16_t ctl_in;               /* ring index: supervisor -> actor */
	uint16_t ctl_out;              /* ring index: actor -> supervisor */
	_Atomic uint32_t busy;         /* 1 while a message handler runs (drain waits for it) */
	/* every ring this actor consumes points its consumer waiter here */
	_Alignas(8) struct kvr_waiter waiter;
	_Atomic uint32_t held;         /* requests accepted, not yet answered (drain waits for them) */
	/* health ticks kvringd did not count as missed pings: the actor waited for a CPU
	 * since the last one (supervisor/actors.c), over the instance's life */
	_Atomic uint32_t health_starved;
	/* background populate (actors/runtime/populate.c): bytes of its mappings the actor has
	 * faulted in since its start, of populate_total it registered */
	_Atomic uint64_t populated;
	_Atomic uint64_t populate_total;
	uint8_t reserved[8];
};
_Static_assert(sizeof(struct kvr_actor_ent) == 128, "actor entry");
_Static_assert(offsetof(struct kvr_actor_ent, populated) == 104, "actor entry: populate words");

/* kvringd faults the L1 arena in off the ready path (supervisor/prefault.c). */
enum kvr_prefault_state {
	KVR_PREFAULT_OFF = 0,     /* l1.prefault "off": pages are allocated on first use */
	KVR_PREFAULT_RUNNING = 1, /* a kvringd thread is faulting it in; prefault_bytes so far */
	KVR_PREFAULT_DONE = 2,    /* every page is in */
	KVR_PREFAULT_SKIPPED = 3, /* the arena exceeds the memory available: allocated on first use */
	KVR_PREFAULT_FAILED = 4,  /* madvise failed (old kernel, out of memory): kvringd's log says why */
};

enum kvr_client_kind {
	KVR_CLIENT_WORKER = 0,    /* KV memory, a loader and a storer */
	KVR_CLIENT_SCHEDULER = 1, /* lookups and leases only */
};

#define KVR_CTL_MAX_ENGINES 64 /* engines attached at once (engine indices 0..63) */

/*
 * Models: the model namespaces (model_ns) engines attached with, for per-model visibility
 * (/metrics' `model` label, kvring-inspect's models table). kvringd gives a namespace the
 * first free entry 1..KVR_CTL_MAX_MODELS when its first engine attaches and keeps it for the
 * instance's life (a label never changes meaning); namespaces beyond that count under entry 0,
 * "other". Each client entry carries its engine's model index (kvr_worker_ent.model); the
 * lookup actor counts every lookup and store under it and tags the slots it allocates
 * (kvr_slot.model), so L1 blocks and bytes per model are a count over the slot table.
 */
#define KVR_CTL_MAX_MODELS 16
#define KVR_CTL_MODEL_OTHER 0u

struct kvr_model_ent {
	char name[64];                  /* the namespace ("" for "other" and for entries never used) */
	_Atomic uint32_t engines;       /* engines attached with it now (kvringd) */
	uint32_t reserved0;
	/* the lookup actor's counters (monotonic; a restarted lookup actor goes on from them) */
	_Atomic uint64_t lookups;       /* lookups and leases answered */
	_Atomic uint64_t keys;          /* blocks asked for */
	_Atomic uint64_t matched;       /* blocks matched (L1, L2 or the shared tier) */
	_Atomic uint64_t stored;        /* slots allocated for its stores (lanes) */
	/* gauge: block lanes on disk (L2) stored for it, as the lookup actor knows them: a file
	 * adopted at a restart (or listed to a restarted lookup actor) counts for its model once
	 * a lookup promoted it or it was written again; until then in KVR_STAT_LK_L2_UNATTRIBUTED */
	_Atomic uint64_t l2_lanes;
	/* keys and matched in tokens (each block with its requester's block size) */
	_Atomic uint64_t tokens_asked;
	_Atomic uint64_t tokens_matched;
};
_Static_assert(sizeof(struct kvr_model_ent) == 128, "model entry");

enum kvr_worker_state {
	KVR_WORKER_FREE = 0,
	KVR_WORKER_ATTACHED = 1,
	KVR_WORKER_DETACHING = 2,
};

struct kvr_worker_ent {
	_Atomic uint32_t state; /* enum kvr_worker_state */
	_Atomic int32_t pid;    /* the worker process (SO_PEERCRED) */
	uint32_t uid;
	uint32_t generation;    /* +1 per attach of this slot */
	uint32_t tp_rank, tp_size;
	uint32_t dcp_rank, dcp_size;
	uint64_t attached_ns;
	/* the generation whose fresh client area the lookup actor has mapped (it writes it, before
	 * gone_ack): kvringd then maps it too and closes the old one */
	_Atomic uint32_t area_ack;
	/* tokens a block of its engine (kvringd, at attach; workers and schedulers): without a
	 * model section engines of several block sizes share the slots, and the lookup actor
	 * records it in each slot it allocates for this client (kvr_slot.block_tokens) */
	uint32_t block_tokens;
	/* the generation whose WORKER_GONE the lookup actor has handled (it writes it): kvringd
	 * frees the worker slot only then, so a new worker in this slot never meets the abort
	 * of its predecessor's slots */
	_Atomic uint32_t gone_ack;
	uint16_t engine;        /* engine index kvringd gave its engine (workers and schedulers) */
	uint8_t kind;           /* enum kvr_client_kind */
	uint8_t model;          /* its engine's model entry (kvr_ctl_model), KVR_CTL_MODEL_OTHER past 16 */
	uint8_t lanes;          /* lanes a block of its engine (the commit quorum: TP size for MHA,
				 * 1 for MLA; a DCP rank: its group's); kvringd, at attach */
	uint8_t reserved[7];
};
_Static_assert(sizeof(struct kvr_worker_ent) == 64, "worker entry");

/* The start of a client slot's area (kvr_ctl_area()). */
struct kvr_client_area {
	struct kvr_seg_hdr seg; /* kind KVR_SEG_CLIENT, size = the area's bytes: the area is a segment */
	uint32_t slot;          /* the client slot it belongs to */
	uint32_t reserved0;
	/* every ring the client consumes points its consumer waiter here */
	_Alignas(8) struct kvr_waiter waiter;
	uint8_t reserved[48];
	/*
	 * Requests the client cancelled (kvr_cancel): the wire ids of its loads and stores it
	 * wants stopped, 0 = a free entry. The client writes an entry and clears it when the
	 * request's completion arrived; its loader, storer or gather actor reads them before
	 * every copy chunk and before a commit (stage_fence). Untrusted like all of the area:
	 * a scribbled entry can only cancel that client's own requests.
	 */
	_Atomic uint64_t cancel[KVR_AREA_CANCEL_MAX];
	/*
	 * Layer-ordered loads in flight (kvr_load_layered): the client writes layers 0, then the
	 * load's wire id (release), before it sends the LOAD; the loader, finding its request's
	 * wire id here, copies the blocks layer by layer and stores how many layers are in place
	 * (release, only ever growing, only while the entry still holds its wire id), then wakes
	 * the area's waiter. The client clears the entry (wire 0) once the load completed.
	 * Untrusted like the rest: a scribbled entry misleads only its own client's waits.
	 */
	struct kvr_load_progress {
		_Atomic uint64_t wire;
		_Atomic uint32_t layers;
		uint32_t reserved;
	} progress[KVR_AREA_LAYERED_MAX];
};
_Static_assert(sizeof(struct kvr_client_area) == 128 + 8 * KVR_AREA_CANCEL_MAX + 16 * KVR_AREA_LAYERED_MAX,
	       "client area header");
_Static_assert(offsetof(struct kvr_client_area, cancel) == 128, "cancel table after the first 128 bytes");
_Static_assert(offsetof(struct kvr_client_area, progress) == 128 + 8 * KVR_AREA_CANCEL_MAX, "progress table after it");

struct kvr_area_ent {
	uint64_t offset; /* from the segment base; KVR_CTL_AREA_ALIGN aligned */
	uint64_t bytes;  /* a multiple of KVR_CTL_AREA_ALIGN */
};

struct kvr_ring_ent {
	char name[KVR_RING_NAME_MAX]; /* "lookup.req.0", "ctl.loader.0.in" */
	uint64_t offset;              /* from the segment base */
	uint64_t bytes;
	int16_t producer;             /* actor index, KVR_EP_SUPERVISOR or KVR_EP_CLIENT(w) */
	int16_t consumer;
	uint32_t reserved[3];
};
_Static_assert(sizeof(struct kvr_ring_ent) == 64, "ring entry");

/* Counter indices of struct kvr_actor_stats. Later stages append; never reorder. */
enum kvr_stat {
	KVR_STAT_MSGS_IN = 0,
	KVR_STAT_MSGS_OUT,
	KVR_STAT_MALFORMED,   /* messages rejected by a decoder */
	KVR_STAT_PINGS,
	KVR_STAT_LOOP_WAKEUPS,
	KVR_STAT_FIRST_STAGE, /* first index a stage may define for itself */
	KVR_STAT_MAX = 64,
};

/*
 * A latency histogram kept in consecutive counters of a struct kvr_actor_stats (one writer:
 * the actor that owns the stats; readers: kvringd's /metrics, inspect). Fixed buckets with
 * power-of-two upper bounds: bucket i < KVR_HIST_FINITE counts observations <= 16 us << i
 * (16 us .. 524.288 ms); bucket KVR_HIST_FINITE counts the rest (+Inf). Counts are per
 * bucket, not cumulative. The writer adds the bucket first, then sum_ns, then count, so
 * a reader that wants buckets and count to agree sums the buckets itself.
 */
#define KVR_HIST_FINITE 16
#define KVR_HIST_BUCKETS (KVR_HIST_FINITE + 1)
#define KVR_HIST_FIRST_BOUND_US 16u

/* Stage counters (indices from KVR_STAT_FIRST_STAGE; their meaning depends on the kind). */
enum kvr_stat_lookup {
	KVR_STAT_LK_WORKERS_GONE = KVR_STAT_FIRST_STAGE, /* WORKER_GONE handled */
	KVR_STAT_LK_LOOKUPS,          /* LOOKUP requests answered */
	KVR_STAT_LK_KEYS,             /* blocks asked for */
	KVR_STAT_LK_MATCHED,          /* blocks matched */
	KVR_STAT_LK_ALLOCATED,        /* slots allocated for stores */
	KVR_STAT_LK_PRESENT,          /* store keys already present on their lane */
	KVR_STAT_LK_NOROOM,           /* store keys refused: nothing evictable */
	KVR_STAT_LK_EVICTED,          /* blocks evicted */
	KVR_STAT_LK_COMMITTED,        /* lanes committed */
	KVR_STAT_LK_VISIBLE,          /* blocks that became visible (quorum) */
	KVR_STAT_LK_ABORTED,          /* unfinished slots reclaimed */
	KVR_STAT_LK_REPLIES_DROPPED,  /* replies dropped: reader stopped reading */
	KVR_STAT_LK_STALE,            /* requests addressed to an earlier incarnation */
	KVR_STAT_LK_MISSED,           /* blocks asked for beyond the matched prefix (L1 misses) */
	KVR_STAT_LK_L2_READS,         /* block lanes promoted from L2 (read, verified, committed) */
	KVR_STAT_LK_L2_READ_FAILS,    /* promotions that failed (missing or bad file, I/O error) */
	KVR_STAT_LK_L2_WRITES,        /* block lanes written through to L2 */
	KVR_STAT_LK_L2_WRITE_FAILS,   /* write-throughs that failed (disk full, I/O error) */
	KVR_STAT_LK_L2_WRITES_SKIPPED,/* L2 writes dropped because their slot changed while queued
				       * (never expected: a queued lane cannot be evicted) */
	KVR_STAT_LK_DRAINING,         /* gauge: aborted slots waiting for their I/O (DRAINING) */
	KVR_STAT_LK_L2_WRITES_QUEUED, /* gauge: lanes waiting for their L2 write (queued or sent) */
	KVR_STAT_LK_PINS_RELEASED,    /* lookup pins (KVR_PIN_LOOKUP) a predecessor left, dropped at start */
	KVR_STAT_LK_L2_ANSWERS_LOST,  /* L2 reads given up and writes sent again: no answer within 8 s */
	KVR_STAT_LK_LEASES,           /* gauge: lookup leases held (their blocks pinned) */
	KVR_STAT_LK_LEASES_GRANTED,   /* leases granted to schedulers (of at least one block) */
	KVR_STAT_LK_LEASES_TAKEN,     /* LEASE_TAKEs answered with the lease's slots */
	KVR_STAT_LK_LEASES_LOADED,    /* leases ended: every loader reported its load done */
	KVR_STAT_LK_LEASES_RELEASED,  /* leases ended by their scheduler (request finished) or replaced */
	KVR_STAT_LK_LEASES_EXPIRED,   /* leases ended by their ttl */
	KVR_STAT_LK_LEASES_REFUSED,   /* leases refused: table full (l1.max_leases) */
	KVR_STAT_LK_LEASES_MISSING,   /* LEASE_TAKEs of a lease that did not exist (-ENOENT) */
	KVR_STAT_LK_REPLIES_QUEUED,   /* reply messages that found their reader's ring full and waited in an outbox */
	KVR_STAT_LK_RM_READS,         /* block lanes promoted from the shared tier (remote actor) */
	KVR_STAT_LK_RM_READ_FAILS,    /* remote promotions that ended without the block (a miss, a bad
				       * value, no node, a timeout) */
	KVR_STAT_LK_RM_WRITES,        /* committed lanes handed to the remote actor (write-through) */
	KVR_STAT_LK_RM_WRITES_SKIPPED,/* ... not handed over: its ring was full (a cache: counted, not retried) */
	KVR_STAT_LK_L2_RING_STALLS,   /* promotion reads that found disk.req / remote.req full: the
				       * promotion waited for room instead of the lookup actor */
	KVR_STAT_LK_MISS_FIRST,       /* blocks leases asked for and did not match, by the reason of
				       * the first of them: KVR_STAT_LK_MISS_FIRST + reason - 1 for
				       * enum kvr_miss_reason 1..6 (never stored, evicted, in flight,
				       * quorum, L2 failed, no room) */
	KVR_STAT_LK_L1_HITS = KVR_STAT_LK_MISS_FIRST + 6, /* matched blocks that were in L1 when
				       * asked for (the matched ones less those promoted from L2 or
				       * the shared tier for the request) */
	KVR_STAT_LK_L2_TOUCHES,       /* L2_TOUCHes sent: lanes on disk used in L1 since last looked at */
	KVR_STAT_LK_L2_UNATTRIBUTED,  /* gauge: lanes on disk no model is known for yet (kvr_model_ent.l2_lanes) */
	/* the same in tokens, each block counted with its requester's block size (engines of
	 * several block sizes may share an instance without a model section) */
	KVR_STAT_LK_TOKENS_ASKED,     /* KVR_STAT_LK_KEYS in tokens */
	KVR_STAT_LK_TOKENS_MATCHED,   /* KVR_STAT_LK_MATCHED in tokens */
	KVR_STAT_LK_MISS_TOKENS_FIRST,/* KVR_STAT_LK_MISS_FIRST in tokens, the same 6 reasons */
	KVR_STAT_LK_END = KVR_STAT_LK_MISS_TOKENS_FIRST + 6,
};
_Static_assert((int)KVR_STAT_LK_END <= (int)KVR_STAT_MAX, "lookup counters fit the stats");

enum kvr_stat_xfer { /* loader and storer */
	KVR_STAT_XF_BLOCKS = KVR_STAT_FIRST_STAGE, /* blocks copied */
	KVR_STAT_XF_BYTES,            /* bytes copied */
	KVR_STAT_XF_FAILED_BLOCKS,    /* blocks reported failed */
	KVR_STAT_XF_PRESENT_BLOCKS,   /* store: already stored, not copied */
	KVR_STAT_XF_CHUNKS,           /* staging leases used */
	KVR_STAT_XF_REQUESTS,         /* requests completed */
	KVR_STAT_XF_HIST_FIRST,       /* struct kvr_hist of request latency (kvr_stats_hist()) ... */
	KVR_STAT_XF_NEXT = KVR_STAT_XF_HIST_FIRST + KVR_HIST_BUCKETS + 2, /* ... up to here: the next free */
	KVR_STAT_XF_STORES_INFLIGHT = KVR_STAT_XF_NEXT, /* storer gauge: stores in its pipeline's window
				       * (accepted, not answered; at most its depth, docs: stage_common.h) */
	KVR_STAT_XF_STORES_INFLIGHT_MAX, /* storer: the most stores in that window at once (high-water mark) */
	KVR_STAT_XF_FENCED,           /* requests a fence stopped (cancelled, worker detached or died; stage_fence) */
	KVR_STAT_XF_END,              /* the next free after the storer's counters */
};

/*
 * The disk actor's (kind KVR_ACTOR_DISK, "disk.N" serves l2.dirs[N]: N is its entry's index).
 * Counters are summed over the actor's starts (a restarted disk actor adds its own adoption
 * again). Gauges are counters the running actor overwrites (atomic_store) with its store's
 * state: after adoption, after every batch of completions (before their replies are sent) and
 * after every request; they keep their last value while the actor is down.
 */
#define KVR_STAT_DK_REASON_MAX 21   /* = KVR_L2_R_MAX (actors/disk/l2file.h; disk.c asserts it) */
#define KVR_STAT_DK_REASON_SLOTS 24 /* counters reserved for adoption reasons 1..KVR_STAT_DK_REASON_MAX-1 */

enum kvr_stat_disk {
	KVR_STAT_DK_ADOPTED = KVR_STAT_FIRST_STAGE, /* files adopted into the index at start */
	KVR_STAT_DK_LEFT_IN_PLACE,    /* l2.read_only: files adoption skipped and did not remove
				       * (tmp leftovers, bad files, foreign lanes, over the cap) */
	KVR_STAT_DK_WRITES_REFUSED,   /* l2.read_only: L2_WRITEs answered -EROFS (no I/O issued) */
	KVR_STAT_DK_BAD_KEPT,         /* l2.read_only: reads that found a bad file: a miss, the
				       * file left on disk */
	KVR_STAT_DK_BYTES,            /* gauge: bytes of the complete files the store indexes
				       * (files x kvr_l2_file_bytes(lane bytes); writes in flight and
				       * files being unlinked not included) */
	KVR_STAT_DK_FILES,            /* gauge: complete files the store indexes (served) */
	KVR_STAT_DK_CAPACITY_BYTES,   /* gauge: the store's cap: l2.capacity_bytes / number of l2.dirs */
	KVR_STAT_DK_EVICTED,          /* files evicted (unlinked) to make room for a write under the cap
				       * (adoption's over-cap deletions are counted by reason instead) */
	KVR_STAT_DK_READS_DAMAGED,    /* reads that found a bad file (header, size, payload checksum):
				       * a miss; the file is removed (left on disk with l2.read_only) */
	KVR_STAT_DK_READS_VANISHED,   /* reads that found the file gone: a miss */
	KVR_STAT_DK_READS_IO_ERROR,   /* reads that failed with an I/O error: as a damaged file */
	KVR_STAT_DK_REJECTED_FIRST,   /* adoption: entries not adopted, by enum kvr_l2_reason r >= 1, in
				       * counter kvr_stat_dk_rejected(r) (REASON_SLOTS of them) */
	KVR_STAT_DK_READS_DISCARDED = KVR_STAT_DK_REJECTED_FIRST + KVR_STAT_DK_REASON_SLOTS,
				      /* reads that completed into a slot the lookup actor had aborted
				       * meanwhile (its I/O pin kept the slot from reuse): bytes discarded */
	KVR_STAT_DK_TOUCHED,          /* L2_TOUCHes that moved a file to the recent end of the LRU */
	/* How the payloads of reads and writes went to and from the disk, one per transfer
	 * (resumed short transfers count again): */
	KVR_STAT_DK_XFER_JOINED,      /* header and payload in one vectored transfer: one device
				       * request per file (O_DIRECT with L1 in huge pages) */
	KVR_STAT_DK_XFER_REGISTERED,  /* the payload through a registered buffer, the header in a
				       * transfer of its own */
	KVR_STAT_DK_XFER_UNREGISTERED, /* the payload through memory not registered, the header
				       * in a transfer of its own */
	KVR_STAT_DK_NEXT,
};
_Static_assert(KVR_STAT_DK_REASON_MAX - 1 <= KVR_STAT_DK_REASON_SLOTS, "disk adoption reasons fit their counters");
_Static_assert((int)KVR_STAT_DK_NEXT <= (int)KVR_STAT_MAX, "disk counters fit the stats");

/* The counter of adoption reason r (1 <= r < KVR_STAT_DK_REASON_MAX). */
static inline unsigned kvr_stat_dk_rejected(unsigned r)
{
	return KVR_STAT_DK_REJECTED_FIRST + r - 1;
}

/* The name of L2 reason r ("tmp", "header_checksum", ...), in enum kvr_l2_reason order
 * (actors/disk/l2file.h): the one table of these names — kvr_l2_reason_name() returns
 * them, kvringd and inspect (which do not link the disk tier) read them here. NULL out of
 * range. */
static inline const char *kvr_stat_dk_reason_name(unsigned r)
{
	static const char *const names[KVR_STAT_DK_REASON_MAX] = {
		"ok", "foreign", "tmp", "not_regular", "short", "size", "magic", "version", "header_checksum",
		"namespace", "key", "lane", "block_tokens", "lane_bytes", "fingerprint", "payload_checksum",
		"vanished", "io_error", "over_cap", "reserved", "mode",
	};
	return r < KVR_STAT_DK_REASON_MAX ? names[r] : NULL;
}

/*
 * The remote tier actor's (kind KVR_ACTOR_REMOTE, "remote": the Redis Cluster of
 * remote.cluster). Gauges are overwritten by the running actor.
 */
enum kvr_stat_remote {
	KVR_STAT_RM_READS = KVR_STAT_FIRST_STAGE, /* promotion reads asked for (L2_READ) */
	KVR_STAT_RM_HITS,             /* ... verified and copied into their slot */
	KVR_STAT_RM_MISSES,           /* ... not in the cluster (a lane missing: nil or EXISTS short) */
	KVR_STAT_RM_BAD_VALUES,       /* ... whose value failed its check (damaged, truncated, another
				       * model's, a forged length): a miss, logged with the reason */
	KVR_STAT_RM_READ_ERRORS,      /* ... failed otherwise (no node, connection, timeout, stale slot) */
	KVR_STAT_RM_WRITES,           /* SETs the cluster acknowledged */
	KVR_STAT_RM_WRITE_ERRORS,     /* SETs that failed (error reply, connection, timeout, no node) */
	KVR_STAT_RM_WRITES_STALE,     /* writes not sent: the slot changed before its copy */
	KVR_STAT_RM_BYTES_IN,         /* payload bytes copied into slots */
	KVR_STAT_RM_BYTES_OUT,        /* payload bytes sent in acknowledged SETs */
	KVR_STAT_RM_MOVED,            /* MOVED redirects followed (the slot map is refreshed) */
	KVR_STAT_RM_ASK,              /* ASK redirects followed */
	KVR_STAT_RM_TIMEOUTS,         /* connections given up on for a request older than timeout_ms */
	KVR_STAT_RM_CONN_ERRORS,      /* connects that failed and connections that dropped */
	KVR_STAT_RM_REPLY_ERRORS,     /* error replies other than MOVED/ASK (CLUSTERDOWN, OOM, ...) */
	KVR_STAT_RM_REFRESHES,        /* slot maps taken from CLUSTER SLOTS */
	KVR_STAT_RM_NODES,            /* gauge: masters in the slot map */
	KVR_STAT_RM_NODES_UP,         /* gauge: of those, connected */
	KVR_STAT_RM_INFLIGHT,         /* gauge: requests sent and not answered */
	KVR_STAT_RM_SLOTS_COVERED,    /* gauge: hash slots with a master (16384 when healthy) */
	KVR_STAT_RM_HIST_GET,         /* struct kvr_hist: latency of reads that hit (taken off the ring ->
				       * verified in the slot) ... */
	KVR_STAT_RM_HIST_SET = KVR_STAT_RM_HIST_GET + KVR_HIST_BUCKETS + 2, /* ... of acknowledged writes ... */
	KVR_STAT_RM_NEXT = KVR_STAT_RM_HIST_SET + KVR_HIST_BUCKETS + 2,      /* ... up to here */
};

struct kvr_actor_stats {
	_Atomic uint64_t c[KVR_STAT_MAX];
};

struct kvr_hist {
	_Atomic uint64_t bucket[KVR_HIST_BUCKETS];
	_Atomic uint64_t count;
	_Atomic uint64_t sum_ns;
};
#define KVR_HIST_WORDS (sizeof(struct kvr_hist) / sizeof(uint64_t))
_Static_assert(sizeof(struct kvr_hist) == (KVR_HIST_BUCKETS + 2) * sizeof(uint64_t), "histogram is counters");
_Static_assert(KVR_STAT_XF_HIST_FIRST + KVR_HIST_WORDS == KVR_STAT_XF_NEXT, "transfer histogram words");
_Static_assert((int)KVR_STAT_XF_NEXT <= (int)KVR_STAT_MAX, "transfer histogram fits the stats");
_Static_assert((int)KVR_STAT_XF_END <= (int)KVR_STAT_MAX, "storer counters fit the stats");
_Static_assert((int)KVR_STAT_RM_NEXT <= (int)KVR_STAT_MAX, "remote histograms fit the stats");

/* Upper bound of bucket i < KVR_HIST_FINITE, in microseconds. */
static inline uint64_t kvr_hist_bound_us(unsigned i)
{
	return (uint64_t)KVR_HIST_FIRST_BOUND_US << i;
}

/* The histogram stored from counter `first` on. */
static inline struct kvr_hist *kvr_stats_hist(const struct kvr_actor_stats *st, unsigned first)
{
	return (struct kvr_hist *)(void *)&((struct kvr_actor_stats *)st)->c[first];
}

/* Record one observation of ns nanoseconds (the owning actor only). */
static inline void kvr_hist_observe(struct kvr_hist *h, uint64_t ns)
{
	unsigned i = 0;
	while (i < KVR_HIST_FINITE && ns > kvr_hist_bound_us(i) * 1000u)
		i++;
	atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->count, 1, memory_order_release);
}

#define KVR_CTL_MAGIC 0x4c5443524b564b00ull

struct kvr_ctl {
	struct kvr_seg_hdr seg;        /* kind KVR_SEG_CTL */
	/* instance */
	_Atomic uint32_t state;        /* enum kvr_inst_state */
	int32_t supervisor_pid;
	uint32_t generation;           /* bumped on every kvringd start */
	uint32_t max_actors, max_workers, max_rings;
	_Atomic uint32_t n_actors, n_rings;
	uint64_t started_ns;           /* CLOCK_REALTIME */
	uint64_t actors_off, workers_off, rings_off, stats_off, config_off, ring_area_off;
	uint32_t config_len, config_cap;
	char socket_path[108];
	uint64_t geom_off;             /* per worker slot: its attach geometry (KVR_CTL_GEOM_BYTES each) */
	uint32_t max_schedulers;       /* KVR_CTL_MAX_SCHEDULERS client entries after the workers' */
	_Atomic uint32_t prefault_state; /* enum kvr_prefault_state: the arena's background fault-in */
	_Atomic uint64_t prefault_bytes; /* arena bytes faulted in so far */
	uint64_t arena_bytes;          /* the L1 arena's size */
	uint32_t arena_huge;           /* 1: huge pages back it */
	uint32_t n_areas;              /* client areas: max_workers + max_schedulers */
	uint64_t areas_off;            /* struct kvr_area_ent [n_areas] */
	uint64_t models_off;           /* struct kvr_model_ent [KVR_CTL_MAX_MODELS + 1] */
	uint8_t reserved[56];
};
_Static_assert(offsetof(struct kvr_ctl, geom_off) == 272, "ctl header: 4 bytes of padding after socket_path");
_Static_assert(sizeof(struct kvr_ctl) == 384, "ctl header");

static inline struct kvr_actor_ent *kvr_ctl_actor(const struct kvr_ctl *c, unsigned i)
{
	return (struct kvr_actor_ent *)((uint8_t *)c + c->actors_off) + i;
}
static inline struct kvr_worker_ent *kvr_ctl_worker(const struct kvr_ctl *c, unsigned i)
{
	return (struct kvr_worker_ent *)((uint8_t *)c + c->workers_off) + i;
}
/* Scheduler slot i's client entry (kvr_worker_ent, kind KVR_CLIENT_SCHEDULER): the entries
 * after the workers'. Its rings are sched.req.i / sched.rep.i; endpoint KVR_EP_CLIENT(max_workers + i). */
static inline struct kvr_worker_ent *kvr_ctl_sched(const struct kvr_ctl *c, unsigned i)
{
	return kvr_ctl_worker(c, c->max_workers + i);
}
static inline struct kvr_ring_ent *kvr_ctl_ring_ent(const struct kvr_ctl *c, unsigned i)
{
	return (struct kvr_ring_ent *)((uint8_t *)c + c->rings_off) + i;
}
/* Ring i's shared header: for kvringd's layout code and for observers reading counters.
 * Ring operations go through a view (kvr_ctl_ring()). */
static inline struct kvr_ring_shm *kvr_ctl_ring_shm(const struct kvr_ctl *c, unsigned i)
{
	return (struct kvr_ring_shm *)((uint8_t *)c + kvr_ctl_ring_ent(c, i)->offset);
}
static inline struct kvr_actor_stats *kvr_ctl_stats(const struct kvr_ctl *c, unsigned i)
{
	return (struct kvr_actor_stats *)((uint8_t *)c + c->stats_off) + i;
}
/* Model entry i (0 = "other", 1..KVR_CTL_MAX_MODELS), or NULL past them. */
static inline struct kvr_model_ent *kvr_ctl_model(const struct kvr_ctl *c, unsigned i)
{
	return i <= KVR_CTL_MAX_MODELS ? (struct kvr_model_ent *)((uint8_t *)c + c->models_off) + i : NULL;
}
static inline void *kvr_ctl_worker_geometry(const struct kvr_ctl *c, unsigned w)
{
	return (uint8_t *)c + c->geom_off + (size_t)w * KVR_CTL_GEOM_BYTES;
}
static inline const struct kvr_area_ent *kvr_ctl_area_ent(const struct kvr_ctl *c, unsigned slot)
{
	return (const struct kvr_area_ent *)((const uint8_t *)c + c->areas_off) + slot;
}
/* Client slot `slot`'s area (its header; its rings follow). */
static inline struct kvr_client_area *kvr_ctl_area(const struct kvr_ctl *c, unsigned slot)
{
	return (struct kvr_client_area *)((uint8_t *)c + kvr_ctl_area_ent(c, slot)->offset);
}
static inline const char *kvr_ctl_config_json(const struct kvr_ctl *c)
{
	return (const char *)c + c->config_off;
}

/* Layout planning: kvringd describes the rings it wants, then builds the segment. */
struct kvr_ctl_ring_spec {
	char name[KVR_RING_NAME_MAX];
	uint32_t capacity;
	int16_t producer, consumer;
};

/* Bytes needed for a control segment with these tables and rings. */
size_t kvr_ctl_memsize(unsigned max_actors, unsigned max_workers, const struct kvr_ctl_ring_spec *rings,
		       unsigned n_rings, size_t config_cap);

/* Lay out and initialise a control segment inside seg (created with kvr_ctl_memsize()).
 * Initialises every ring, the tables (all UNUSED/FREE) and copies the config JSON.
 * Returns 0 or -EINVAL / -ENOSPC. */
int kvr_ctl_init(struct kvr_segment *seg, unsigned max_actors, unsigned max_workers,
		 const struct kvr_ctl_ring_spec *rings, unsigned n_rings, const char *config_json);

/*
 * Process-private views of every ring of one mapping of a control segment (kvr_ring.h):
 * built by kvr_ctl_attach() once every offset was checked, then the only way this process
 * moves messages through those rings. A ring's waiters are legal when they are its own or
 * an actor's table entry's or a client area's waiter (whatever a ring header says later).
 * Keep it next to the mapping: its views point into it.
 */
struct kvr_ctl_rings {
	const struct kvr_ctl *ctl;
	unsigned n;
	struct kvr_ring ring[KVR_CTL_MAX_RINGS];
};

/* The view of ring i; NULL when there is no ring i (or no view of it: a client has views of
 * its own rings only). */
static inline struct kvr_ring *kvr_ctl_ring(const struct kvr_ctl_rings *v, unsigned i)
{
	return i < v->n && v->ring[i].shm ? (struct kvr_ring *)&v->ring[i] : NULL;
}

/* The waiters a ring of control segment c may legally point at besides its own (for
 * observers that build one view at a time with kvr_ring_view()). */
struct kvr_ring_waiters kvr_ctl_legal_waiters(const struct kvr_ctl *c);

/* Build a view of ring i alone, checking its directory entry against the segment again
 * (observers re-read a segment that is not theirs; tests). 0, -ENOENT (no ring i) or
 * -EBADMSG (the entry or the header does not validate). */
int kvr_ctl_ring_view(const struct kvr_ctl *c, unsigned i, struct kvr_ring *ret);

/* Validate a mapped control segment (offsets in bounds, every ring header valid) and, when
 * ret_rings is not NULL, build the views of its rings there. Returns 0 and *ret_ctl, or
 * -EPROTO / -EBADMSG. Safe on a read-only mapping. */
int kvr_ctl_attach(const struct kvr_segment *seg, struct kvr_ctl **ret_ctl, struct kvr_ctl_rings *ret_rings);

/* As kvr_ctl_attach(), for the client of slot `slot`, which maps the segment read-only and
 * only its own area (kvr_ctl_map_area()): the tables are validated as there, and views are
 * built only of the rings the client produces or consumes (kvr_ctl_ring() is NULL for the
 * others). */
int kvr_ctl_attach_client(const struct kvr_segment *seg, unsigned slot, struct kvr_ctl **ret_ctl,
			  struct kvr_ctl_rings *ret_rings);

/* kvringd, once, after kvr_ctl_init() and before anyone maps the segment: give every client
 * area a memfd of its own (kvr_ctl_area_fresh(), rings with spin_ns), mapped read-write over
 * its place in seg; the segment's own pages there are released.
 * ret_fds[n_areas] gets the memfds in slot order (the caller keeps them: they are handed
 * to the actors, the client of the slot and inspect). 0 or -errno (nothing left open). */
int kvr_ctl_split_areas(struct kvr_segment *seg, uint32_t spin_ns, int *ret_fds);

/* Map client slot `slot`'s area, fd (kvr_ctl_split_areas()'s, or a read-only reopening of
 * it), over its place in the mapping seg of its control segment, read-write when
 * `writable`. Where and how big come from seg's area table (kvringd's), never from the
 * area, which its client writes. -EINVAL (no such slot), -EBADMSG (the table does not
 * validate, or fd is not the area's size). */
int kvr_ctl_map_area(struct kvr_segment *seg, unsigned slot, int fd, int writable);

/* Map a control segment handed over as descriptors: ctl_fd the segment, area_fds[i] client
 * slot i's area for i < n_areas (0: none; else the segment's n_areas), each mapped over its
 * place. Read-only unless `writable`. *ret as kvr_segment_map(). 0 or -errno. */
int kvr_ctl_map(int ctl_fd, const int *area_fds, unsigned n_areas, int writable, struct kvr_segment *ret);

/* Client slot `slot`'s area header and waiter as kvr_ctl_init() wrote them (in place). */
void kvr_ctl_area_reset(struct kvr_ctl *c, unsigned slot);

/* A new memfd ("kvring-client.N", sealed) holding client slot `slot`'s area of c as
 * kvr_ctl_init() lays it out: header, waiter, every ring of that client empty (spin_ns,
 * waiters pointed as for their endpoints). kvringd gives a slot a fresh area before its
 * next client: its predecessor may still map the old one (kvr_ctl_map_area swaps it in at
 * the same address, so views and waiter pointers stay valid). *ret_fd, 0 or -errno. */
int kvr_ctl_area_fresh(const struct kvr_ctl *c, unsigned slot, uint32_t spin_ns, int *ret_fd);

/* Find a ring by name; returns its index or -ENOENT. */
int kvr_ctl_find_ring(const struct kvr_ctl *c, const char *name);

/* kvringd only, while neither new endpoint runs: hand ring i to other endpoints (a DCP
 * group's gather actor takes over its workers' loader/storer rings) and point its
 * consumer waiter at the new consumer's. -ENOENT when i is not a ring. */
int kvr_ctl_ring_rebind(struct kvr_ctl *c, unsigned i, int producer, int consumer);

/* Ring i as kvr_ctl_init() left it: empty, its header rewritten from the directory (sizes,
 * name, spin_ns, waiters as laid out for its endpoints), counters zero. For the one actor
 * endpoint of a client's ring, or kvringd while none runs, once the client is gone: the
 * next client of the slot must not inherit what its predecessor left there (scribbled
 * indices would leave the ring stuck full or empty). Nobody may use the ring meanwhile.
 * -ENOENT when i is not a ring, -EBADMSG when its directory entry does not validate. */
int kvr_ctl_ring_reset(struct kvr_ctl *c, unsigned i, uint32_t spin_ns);

/* Human-readable names. */
const char *kvr_inst_state_name(unsigned s);
const char *kvr_actor_state_name(unsigned s);
const char *kvr_actor_kind_name(unsigned k);

#endif
