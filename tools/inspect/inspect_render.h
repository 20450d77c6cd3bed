/* inspect_render: read-only snapshot of a kvring control segment, rendered as text or JSON. */
#ifndef KVR_INSPECT_RENDER_H
#define KVR_INSPECT_RENDER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <kvring/msg.h>

#include "kvr_config.h"
#include "kvr_ctl.h"
#include "kvr_slots.h"

/*
 * Contract
 * --------
 * kvr_insp_snapshot() copies everything kvring-inspect shows out of a control segment
 * into private memory: the instance fields, every actor slot in use, every attached
 * worker, every ring (indices, counters, endpoints, blocked flags) and up to max_msgs
 * in-flight messages per ring (kvr_ring_peek). It only loads from the segment: it is
 * meant for a PROT_READ mapping and never changes a ring, a counter or a waiter.
 *
 * The segment is shared memory written by other processes, so nothing read from it is
 * trusted: names are cut at their field size and non-printable bytes become '?', a ring
 * whose directory entry or header does not validate is reported as invalid and not read,
 * messages are only copied from rings of struct kvr_msg size and are described, never
 * decoded into actions; pids and exit statuses out of range are shown as "?".
 *
 * "Now" is a parameter (both clocks), so rendering is deterministic: heartbeat ages use
 * the monotonic clock (heartbeat_ns is CLOCK_MONOTONIC), the uptime the real-time clock
 * (kvr_ctl.started_ns is CLOCK_REALTIME).
 *
 * Disk actors (kind KVR_ACTOR_DISK) also get their L2 stats copied (struct kvr_insp_l2): the
 * gauges and counters of enum kvr_stat_disk, and the directory they serve, l2.dirs[N] of the
 * effective config the segment carries (parsed from a private copy; "" when it names none).
 *
 * The remote tier actor (kind KVR_ACTOR_REMOTE; one at most, the first is taken) gets its
 * stats copied too (struct kvr_insp_remote): the gauges and counters of enum kvr_stat_remote,
 * and the lookup actor's counts of the traffic it sent there (KVR_STAT_LK_RM_*).
 *
 * The engines attached to kvringd are not in the segment: kvringd sends them with its
 * INSPECT reply (struct kvr_inspect_engine, kvr_proto.h), and kvr_insp_snapshot_engines()
 * adds that table to a snapshot, validated and sanitised like the segment's names. A
 * snapshot without it shows no engines section (JSON "engines": null).
 *
 * Renderers write to a FILE*. The text form fits 80 columns whatever the segment holds;
 * the JSON form is documented field by field in docs/inspect.md (schema version
 * KVR_INSP_JSON_SCHEMA). Given the previous snapshot (prev, may be NULL) both add per-ring
 * rates (delta enqueued / delta monotonic time); without it rates are absent (text) or
 * null (JSON).
 *
 * Return values: 0, or negative errno: -ENOMEM (snapshot), -EINVAL (NULL argument),
 * -EIO (the FILE* reported a write error).
 */

#define KVR_INSP_JSON_SCHEMA 1
#define KVR_INSP_MAX_MSGS 4096u /* upper bound for max_msgs */
#define KVR_INSP_COLUMNS 80

struct kvr_insp_clock {
	uint64_t mono_ns; /* CLOCK_MONOTONIC */
	uint64_t real_ns; /* CLOCK_REALTIME */
};

struct kvr_insp_actor {
	unsigned index;
	char name[KVR_ACTOR_NAME_MAX + 1];
	uint32_t kind, state, generation, restarts;
	int32_t pid, last_exit_code, last_exit_signal;
	uint64_t started_ns, ready_ns, heartbeat_ns; /* CLOCK_MONOTONIC, 0 = never */
	uint32_t held;                               /* requests accepted, not answered (gather: waiting stores) */
	uint64_t populated, populate_total;          /* its background populate (actors/runtime/populate.c) */
	uint64_t page_table_bytes;                   /* VmPTE (kvr_insp_read_page_tables) */
	bool page_tables_known;                      /* ... read from /proc: a running actor on this host */
};

/* A model namespace of kvringd's model table (kvr_ctl.h): its engines, the lookup actor's
 * counters for them, and the committed L1 slots tagged with it (kvr_insp_snapshot_slots). */
struct kvr_insp_model {
	unsigned index;                 /* 0: "other" */
	char name[64];
	uint32_t engines;
	uint64_t lookups, keys, matched, stored; /* blocks asked for, matched; lanes stored */
	uint64_t l1_slots, l1_bytes;
	uint64_t l2_lanes, l2_bytes;  /* on disk, as the lookup actor knows them (kvr_model_ent.l2_lanes) */
};

struct kvr_insp_worker {
	unsigned slot;
	uint32_t state, uid, generation, tp_rank, tp_size, dcp_rank, dcp_size;
	uint32_t engine;    /* engine index (kvringd's log names it) */
	uint32_t block_tokens; /* its engine's block size (engines of several may share an instance) */
	int32_t pid;
	uint64_t attached_ns;
};

/* An engine attached to kvringd (from the INSPECT reply, not the segment). */
struct kvr_insp_engine {
	uint32_t index;                     /* what its clients' engine field names */
	uint32_t workers, schedulers;       /* its worker and scheduler slots attached */
	char id[48 + 1];
	char model_ns[KVR_STR_MAX + 1];     /* whole, also a long model.model_id */
};

struct kvr_insp_ring {
	unsigned index;
	char name[KVR_RING_NAME_MAX + 1];
	int valid;   /* 0: directory entry or ring header did not validate; only name/error set */
	int error;   /* negative errno when !valid */
	int16_t producer, consumer; /* endpoints: actor index, KVR_EP_SUPERVISOR, KVR_EP_CLIENT(w) */
	uint32_t capacity, msg_size;
	uint32_t head, tail, fill;  /* fill = tail - head, clamped to capacity */
	int32_t prod_pid, cons_pid;
	uint32_t prod_blocked, cons_blocked;
	uint64_t enqueued, dequeued, full_waits, full_wait_ns, empty_sleeps, rejected;
	unsigned n_msgs;            /* messages copied into msgs (<= max_msgs, <= fill) */
	struct kvr_msg *msgs;       /* inside the snapshot's own storage */
};

/* One disk actor's L2 tier (enum kvr_stat_disk in kvr_ctl.h). */
struct kvr_insp_l2 {
	unsigned actor;                  /* actor slot */
	char name[KVR_ACTOR_NAME_MAX + 1];
	uint32_t state;                  /* enum kvr_actor_state */
	uint32_t dir_index;              /* the actor entry's index: it serves l2.dirs[dir_index] */
	char dir[KVR_PATH_MAX + 1];      /* that path; "" when the config does not name it */
	uint64_t used_bytes, files, capacity_bytes;       /* gauges */
	uint64_t adopted;
	uint64_t rejected[KVR_STAT_DK_REASON_MAX];        /* adoption, by enum kvr_l2_reason ([0] unused) */
	uint64_t evicted;
	uint64_t reads_damaged, reads_vanished, reads_io_error;
	uint64_t writes_refused, left_in_place, bad_kept; /* l2.read_only */
	uint64_t xfer_joined, xfer_registered, xfer_unregistered; /* payload transfers, by how */
};

/* The remote tier actor's stats (enum kvr_stat_remote in kvr_ctl.h) and the lookup's side. */
struct kvr_insp_remote {
	unsigned actor;                  /* actor slot */
	char name[KVR_ACTOR_NAME_MAX + 1];
	uint32_t state;                  /* enum kvr_actor_state */
	uint64_t nodes, nodes_up, inflight, slots_covered; /* gauges */
	uint64_t reads, hits, misses, bad_values, read_errors;
	uint64_t writes, write_errors, writes_stale;
	uint64_t bytes_in, bytes_out;
	uint64_t moved, ask, timeouts, conn_errors, reply_errors, refreshes;
	/* the lookup actor's: block lanes promoted / not, write-throughs handed over / skipped */
	uint64_t lk_reads, lk_read_fails, lk_writes, lk_writes_skipped;
};

struct kvr_insp_snap {
	struct kvr_insp_clock now;
	unsigned max_msgs;
	bool hide_idle;      /* text: leave out actors and rings of free worker slots that never
			      * carried a message (kvring-inspect without --all); JSON has all */
	/* instance */
	uint32_t state, generation;
	int32_t supervisor_pid;
	uint64_t started_ns; /* CLOCK_REALTIME, 0 = unknown */
	char socket_path[sizeof(((struct kvr_ctl *)0)->socket_path) + 1];
	uint32_t max_actors, max_workers;
	unsigned n_actors;   /* slots in use (state != UNUSED) */
	struct kvr_insp_actor actors[KVR_CTL_MAX_ACTORS];
	unsigned n_workers;  /* slots not FREE */
	struct kvr_insp_worker workers[KVR_CTL_MAX_WORKERS];
	uint64_t arena_bytes, prefault_bytes; /* the L1 arena and how much of it is faulted in */
	uint32_t arena_huge, prefault_state;  /* enum kvr_prefault_state */
	unsigned n_scheds;   /* scheduler slots attached */
	struct kvr_insp_worker scheds[KVR_CTL_MAX_SCHEDULERS];
	/* engines attached to kvringd (kvr_insp_snapshot_engines), by engine index */
	bool has_engines;    /* false: no table (nothing shown; JSON null) */
	int engines_error;   /* < 0: kvringd's table could not be had (text says why; JSON null) */
	unsigned n_engines;
	struct kvr_insp_engine engines[KVR_CTL_MAX_ENGINES];
	/* model namespaces (kvringd's model table; entry 0 "other" only when it counted anything) */
	unsigned n_models;
	struct kvr_insp_model models[KVR_CTL_MAX_MODELS + 1];
	/* lookup leases (the lookup actor's counters): held now, granted, taken, and ended by
	 * reason: loaded, released, expired, refused, missing */
	uint64_t leases, leases_granted, leases_taken, lease_ends[5];
	uint64_t miss_blocks[6]; /* blocks leases did not match, by reason (enum kvr_miss_reason 1..6) */
	unsigned n_rings;
	struct kvr_insp_ring rings[KVR_CTL_MAX_RINGS];
	struct kvr_msg *msg_store; /* n_rings * max_msgs messages */
	unsigned n_l2;       /* disk actors, by actor slot */
	struct kvr_insp_l2 l2[KVR_CTL_MAX_ACTORS];
	bool has_remote;     /* a remote actor is in the table */
	struct kvr_insp_remote remote;
	/* the L1 slot table (kvr_insp_snapshot_slots; kvringd hands it to INSPECT read-only) */
	bool has_slots;
	uint32_t n_slots;
	struct kvr_slot_counts slots;
	uint64_t pins_by[4]; /* loaders (all workers), lookup, io (disk actors), remote */
};

/* Copy the observable state of c (a validated kvr_ctl_attach() result) at time now.
 * max_msgs in [0, KVR_INSP_MAX_MSGS] (larger is clamped). *ret_snap untouched on failure. */
/* Each running actor's page-table bytes, from /proc/<pid>/status (VmPTE): what mapping the
 * arena and the KV memory costs it. Not in the snapshot itself (it reads no /proc), so a
 * rendering stays a function of the control segment; kvring-inspect calls it. */
void kvr_insp_read_page_tables(struct kvr_insp_snap *s);

int kvr_insp_snapshot(const struct kvr_ctl *c, const struct kvr_insp_clock *now, unsigned max_msgs,
		      struct kvr_insp_snap **ret_snap);
void kvr_insp_snap_free(struct kvr_insp_snap *s);

/* Add the slot table's state and pin counts to s (a snapshot, safe on a read-only mapping;
 * t may be NULL: nothing added). */
void kvr_insp_snapshot_slots(struct kvr_insp_snap *s, const struct kvr_slot_table *t);

/* Add kvringd's engine table (the INSPECT reply's payload, len bytes; kvr_proto.h) to s.
 * c (may be NULL): the segment s was taken from, whose effective config names a
 * model.model_id too long for the table's entry. 0; -EBADMSG when len is not a whole
 * number of entries (at most KVR_CTL_MAX_ENGINES): then s has no table and
 * engines_error says so; -EINVAL (s NULL, or table NULL with len > 0). */
int kvr_insp_snapshot_engines(struct kvr_insp_snap *s, const struct kvr_ctl *c, const void *table, size_t len);

/* Human-readable text (<= 80 columns per line). */
int kvr_insp_render_text(FILE *out, const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev);

/* One JSON document; pretty: indented over several lines, else one line (NDJSON). */
int kvr_insp_render_json(FILE *out, const struct kvr_insp_snap *cur, const struct kvr_insp_snap *prev, bool pretty);

/* Snapshot + render + free, for one-shot callers. */
#define KVR_INSP_JSON 0x1u
int kvr_insp_render(FILE *out, const struct kvr_ctl *c, const struct kvr_insp_clock *now, unsigned max_msgs,
		    unsigned flags);

/* Name of a ring endpoint as inspect prints it: the actor's name, "kvringd", "client.<w>".
 * Writes at most len bytes (NUL included) and returns buf. */
char *kvr_insp_endpoint_name(const struct kvr_insp_snap *s, int endpoint, char *buf, size_t len);

#endif
