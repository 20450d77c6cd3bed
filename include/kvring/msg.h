/* kvring message formats: the fixed-size records every ring carries. */
#ifndef KVRING_MSG_H
#define KVRING_MSG_H

#include <stddef.h>
#include <stdint.h>

/*
 * Every message is 64 bytes: one cache line, so a producer's copy touches exactly one line
 * and a ring of 1024 messages is 64 KiB. A 16-byte common header is followed by a 48-byte
 * body whose layout depends on the type. A request larger than one body (a key list, a
 * block-id list) streams as several messages of one request id with KVR_MSGF_MORE set on
 * all but the last, seq counting 0, 1, 2, ... (docs/messages.md explains the choice).
 *
 * Receivers never read a body field before the type's decode function validated the
 * whole message: type known, flags within the type's allowed set, body_len equal to the
 * type's body length (or within its range for streamed lists), reserved bytes zero, field
 * values in range. A message that fails is rejected (-EBADMSG) and counted by the
 * receiver; it is never acted on.
 */

#define KVR_MSG_SIZE 64
#define KVR_MSG_BODY 48

enum kvr_msg_type {
	KVR_MSG_NONE = 0,
	/* supervisor <-> actor control */
	KVR_MSG_PING = 1,  /* supervisor -> actor: are you alive */
	KVR_MSG_PONG = 2,  /* actor -> supervisor: yes, with its stats epoch */
	KVR_MSG_STOP = 3,  /* supervisor -> actor: finish in-flight work and exit 0 */
	KVR_MSG_WORKER_GONE = 4, /* supervisor -> lookup: worker slot detached or died */
	/* client <-> lookup */
	KVR_MSG_LOOKUP = 16,     /* list of block keys (2 per message) */
	KVR_MSG_LOOKUP_REP = 17, /* result, followed by KVR_MSG_SLOTS when blocks matched */
	KVR_MSG_SLOTS = 18,      /* list of (slot, epoch), 5 per message */
	/* client <-> loader */
	KVR_MSG_LOAD = 20,       /* list of (slot, epoch, block id), 3 per message */
	KVR_MSG_LOAD_DONE = 21,  /* result and diagnostics, then KVR_MSG_BLOCKS of failed ids */
	KVR_MSG_BLOCKS = 22,     /* list of engine block ids, 10 per message */
	/* client <-> storer */
	KVR_MSG_STORE = 24,      /* list of (key, block id), 2 per message; final request */
	KVR_MSG_STORE_DONE = 25, /* result, then KVR_MSG_BLOCKS of failed ids */
	/* storer <-> lookup */
	KVR_MSG_ALLOC = 28,      /* list of keys to allocate on the storer's lane */
	KVR_MSG_ALLOC_REP = 29,  /* list of (slot, epoch) per key; slot ~0 = present, ~1 = no room */
	KVR_MSG_COMMIT = 30,     /* list of (slot, epoch) written */
	KVR_MSG_COMMIT_REP = 31, /* result */
	KVR_MSG_RESET = 32,      /* storer -> lookup at start: abort my lane's WRITING slots */
	/* lookup <-> disk (L2), one block lane per message, body struct kvr_msg_l2 */
	KVR_MSG_L2_WRITE = 36,      /* lookup -> disk: write (key, lane) from COMMITTED slot (slot, epoch) */
	KVR_MSG_L2_WRITE_DONE = 37, /* disk -> lookup: status 0 (flags L2F_PRESENT: already on disk) or -errno */
	KVR_MSG_L2_READ = 38,       /* lookup -> disk: read (key, lane) into WRITING slot (slot, epoch) */
	KVR_MSG_L2_READ_DONE = 39,  /* disk -> lookup: status 0 (verified bytes in the slot) or -errno (a miss) */
	KVR_MSG_L2_SYNC = 40,       /* lookup -> disk: list everything you hold (no body) */
	KVR_MSG_L2_HAVE = 41,       /* disk -> lookup: (key, lane) is on disk; flags L2F_LAST ends a SYNC */
	KVR_MSG_L2_GONE = 42,       /* disk -> lookup: (key, lane) left the disk (cap eviction, bad file) */
	KVR_MSG_L2_TOUCH = 43,      /* lookup -> disk: (key, lane) was used in L1: the recent end of L2's LRU (no reply) */
	/* lookup leases (scheduler <-> lookup on sched.req/rep.N; worker -> lookup on lookup.req.W) */
	KVR_MSG_LEASE = 44,         /* scheduler: lease what the KVR_MSG_LOOKUP list of this wire id matches */
	KVR_MSG_LEASE_REP = 45,     /* lookup -> scheduler: result (body struct kvr_msg_lookup_rep, no list) */
	KVR_MSG_LEASE_RELEASE = 46, /* scheduler: drop the lease (no reply) */
	KVR_MSG_LEASE_TAKE = 47,    /* worker: my lane's slots of the lease -> LOOKUP_REP + SLOTS */
	KVR_MSG_LEASE_DONE = 48,    /* worker: my load of the lease completed (no reply) */
	KVR_MSG_TYPE_MAX = 64,
};

enum kvr_msg_flags {
	KVR_MSGF_MORE = 1u << 0,  /* more messages of this request follow */
	KVR_MSGF_ERROR = 1u << 1, /* completion carries an error (body.status < 0) */
};

struct kvr_msg_hdr {
	uint16_t type;     /* enum kvr_msg_type */
	uint8_t flags;     /* enum kvr_msg_flags */
	uint8_t body_len;  /* bytes of body in use, <= KVR_MSG_BODY */
	uint32_t seq;      /* position within a streamed request, 0 for single messages */
	uint64_t req_id;   /* request id chosen by the requester; echoed in replies */
};

struct kvr_msg {
	struct kvr_msg_hdr hdr;
	uint8_t body[KVR_MSG_BODY];
};

/*
 * A client's request id (the "wire id"), 64 bits:
 *   bits 48..63  the low 16 bits of the generation of the actor it addressed. An actor
 *                answers only requests addressed to its own incarnation (kvr_wire_for): a
 *                request meant for its dead predecessor is answered -ESTALE and not done,
 *                so a successor never runs what the client has already failed.
 *   bits 32..47  the low 16 bits of the attach generation of the client's worker (or
 *                scheduler) slot (ipc/kvr_ctl.h: kvr_worker_ent.generation, +1 per attach).
 *                A reply the slot's previous owner never read (it died with a request in
 *                flight) can still sit in the reply ring; with another attach generation it
 *                can never be taken for the answer to one of ours (its slots hold another
 *                prompt's KV). libkvring seeds its sequence with it at attach
 *                (client/client.c: next_wire = attach generation << 32).
 *   bits 0..31   a per-client sequence, incremented for each request.
 * The one home of that layout: the client builds ids with kvr_wire_make (its sequence
 * argument carries bits 0..47: the attach generation and the sequence), actors read the
 * actor generation with kvr_wire_gen.
 */
#define KVR_WIRE_GEN_SHIFT 48
#define KVR_WIRE_SEQ_MASK ((UINT64_C(1) << KVR_WIRE_GEN_SHIFT) - 1)

static inline uint64_t kvr_wire_make(uint32_t actor_gen, uint64_t seq)
{
	return ((uint64_t)(actor_gen & 0xffff) << KVR_WIRE_GEN_SHIFT) | (seq & KVR_WIRE_SEQ_MASK);
}

/* The 16 generation bits a wire id was addressed to. */
static inline uint32_t kvr_wire_gen(uint64_t wire)
{
	return (uint32_t)(wire >> KVR_WIRE_GEN_SHIFT);
}

/* Whether wire was addressed to the incarnation whose generation is actor_gen. */
static inline int kvr_wire_for(uint64_t wire, uint32_t actor_gen)
{
	return kvr_wire_gen(wire) == (actor_gen & 0xffff);
}

_Static_assert(sizeof(struct kvr_msg_hdr) == 16, "message header");
_Static_assert(sizeof(struct kvr_msg) == KVR_MSG_SIZE, "message size");

/* PING / PONG bodies */
struct kvr_msg_ping {
	uint64_t sent_ns;  /* sender's CLOCK_MONOTONIC, echoed in the pong */
	uint32_t nonce;
	uint32_t reserved;
};
struct kvr_msg_pong {
	uint64_t sent_ns;  /* echoed from the ping */
	uint32_t nonce;    /* echoed from the ping */
	int32_t pid;       /* the actor's pid */
	uint64_t handled;  /* messages the actor has handled since it started */
};
_Static_assert(sizeof(struct kvr_msg_ping) <= KVR_MSG_BODY, "ping body");
_Static_assert(sizeof(struct kvr_msg_pong) <= KVR_MSG_BODY, "pong body");

/* ---- L1 data path ------------------------------------------------------------------
 * Lists (keys, slots, block ids) stream as several messages of one request id: every
 * message carries the list's total item count and its own count; items are in order, the
 * first item of message seq is seq * per_message. KVR_MSGF_MORE is set on all but the last.
 * A result message (LOOKUP_REP, LOAD_DONE, STORE_DONE, COMMIT_REP) comes first in a reply
 * and is followed by its list (if any). */

#define KVR_MSG_MAX_LIST 65536u /* items per request: 8M tokens at 128-token blocks */

struct kvr_msg_key { uint64_t lo, hi; };
struct kvr_msg_slot { uint32_t slot, epoch; };
struct kvr_msg_load_item { uint32_t slot, epoch, block; };
struct __attribute__((packed, aligned(4))) kvr_msg_store_item { struct kvr_msg_key key; uint32_t block; };
_Static_assert(sizeof(struct kvr_msg_store_item) == 20, "store item");

#define KVR_SLOT_PRESENT 0xffffffffu /* ALLOC_REP: block already stored on this lane */
#define KVR_SLOT_NOROOM 0xfffffffeu  /* ALLOC_REP: nothing evictable, block not stored */

/* Common prefix of every list message body. */
struct kvr_msg_list_hdr {
	uint32_t total;  /* items in the whole list */
	uint16_t count;  /* items in this message */
	uint8_t lane;    /* LOOKUP, ALLOC: TP lane; else 0 */
	uint8_t flags;   /* type-specific */
};

/* kvr_msg_list_hdr.flags of KVR_MSG_STORE (on every message of the list): wait for the
 * worker's CUDA IPC event in its KV descriptor's event table (kvr_proto.h) before copying. */
#define KVR_STOREF_CUDA_EVENT 0x01u

#define KVR_LIST_KEYS 2
#define KVR_LIST_SLOTS 5
#define KVR_LIST_LOAD 3
#define KVR_LIST_STORE 2
#define KVR_LIST_BLOCKS 10

struct kvr_msg_lookup_rep {
	int32_t status;         /* 0 or -errno */
	uint32_t matched;       /* leading visible blocks */
	uint32_t lane;          /* lane the slots below belong to */
	uint32_t promoted;      /* of the matched blocks, how many were read from L2 for this lookup */
	uint64_t index_ns;      /* time spent in the index */
	uint32_t pending;       /* LEASE_REP: blocks right after the match that a store is writing now
				 * (a lane WRITING, not every lane committed); else 0 */
	uint32_t miss;          /* LEASE_REP: enum kvr_miss_reason (kvring.h) of the first block not
				 * matched, 0 when every block matched; else 0 */
};
_Static_assert(sizeof(struct kvr_msg_lookup_rep) == 32, "lookup reply body");

struct kvr_msg_load_done {
	int32_t status;         /* 0 all restored, -EIO some failed (list follows), other -errno */
	uint32_t n_blocks;      /* blocks requested */
	uint32_t n_failed;      /* block ids that follow in KVR_MSG_BLOCKS */
	uint32_t copies;        /* copy operations issued */
	uint64_t bytes;         /* bytes moved into the worker's KV memory */
	uint64_t copy_ns;       /* time spent copying */
	uint32_t runs;          /* coalesced copy runs */
	uint32_t queue_us;      /* time between arrival and first copy, microseconds */
};

struct kvr_msg_store_done {
	int32_t status;         /* 0, -EIO some failed (list follows), other -errno */
	uint32_t n_blocks;      /* blocks in the request */
	uint32_t n_stored;      /* newly written and committed */
	uint32_t n_present;     /* already stored on this lane (suffix-only: not copied) */
	uint32_t n_failed;      /* block ids that follow in KVR_MSG_BLOCKS */
	uint32_t copies;
	uint64_t bytes;
	uint64_t copy_ns;
	uint32_t queue_us;
	uint32_t reserved;
};

struct kvr_msg_commit_rep {
	int32_t status;
	uint32_t n_committed;
	uint32_t n_visible;     /* blocks that became visible (quorum reached) */
	uint32_t reserved;
};

struct kvr_msg_worker_gone {
	uint32_t worker;
	uint32_t generation;
	int32_t area_fd;     /* kvringd's descriptor of the slot's fresh client area, which the lookup
			      * actor maps over the old one before it acknowledges (-1: none) */
	uint32_t reserved;
};

_Static_assert(sizeof(struct kvr_msg_list_hdr) + KVR_LIST_KEYS * sizeof(struct kvr_msg_key) <= KVR_MSG_BODY, "");
_Static_assert(sizeof(struct kvr_msg_list_hdr) + KVR_LIST_SLOTS * sizeof(struct kvr_msg_slot) <= KVR_MSG_BODY, "");
_Static_assert(sizeof(struct kvr_msg_list_hdr) + KVR_LIST_LOAD * sizeof(struct kvr_msg_load_item) <= KVR_MSG_BODY, "");
_Static_assert(sizeof(struct kvr_msg_list_hdr) + KVR_LIST_STORE * sizeof(struct kvr_msg_store_item) <= KVR_MSG_BODY, "");
_Static_assert(sizeof(struct kvr_msg_list_hdr) + KVR_LIST_BLOCKS * sizeof(uint32_t) <= KVR_MSG_BODY, "");
_Static_assert(sizeof(struct kvr_msg_load_done) <= KVR_MSG_BODY, "");
_Static_assert(sizeof(struct kvr_msg_store_done) <= KVR_MSG_BODY, "");

/* Item size and items per message of a list type; 0 for non-list types. */
unsigned kvr_msg_list_item_size(unsigned type);
unsigned kvr_msg_list_per_msg(unsigned type);

/* Build message seq of a list of `total` items of `type` (items points at item 0 of the
 * whole list). Sets MORE unless it is the last. Returns the items it carries. */
unsigned kvr_msg_build_list(struct kvr_msg *m, unsigned type, uint64_t req_id, uint32_t seq, uint8_t lane,
			    uint8_t flags, const void *items, uint32_t total);

/* Validate a list message: known list type, total in 1..KVR_MSG_MAX_LIST, count ==
 * expected for its seq, MORE set exactly when items remain, unused item bytes zero.
 * On success copies its items to items_out[first..first+count) where first = seq * per
 * (items_out must hold `total` items: the caller checks total against its buffer first
 * through ret_hdr) and returns 0. -EBADMSG otherwise. */
int kvr_msg_decode_list(const struct kvr_msg *m, unsigned type, struct kvr_msg_list_hdr *ret_hdr);
/* Copy the items of an already validated list message into the whole-list array. */
void kvr_msg_list_items(const struct kvr_msg *m, void *items_out);

int kvr_msg_decode_lookup_rep(const struct kvr_msg *m, struct kvr_msg_lookup_rep *ret);
int kvr_msg_decode_load_done(const struct kvr_msg *m, struct kvr_msg_load_done *ret);
int kvr_msg_decode_store_done(const struct kvr_msg *m, struct kvr_msg_store_done *ret);
int kvr_msg_decode_commit_rep(const struct kvr_msg *m, struct kvr_msg_commit_rep *ret);
int kvr_msg_decode_worker_gone(const struct kvr_msg *m, struct kvr_msg_worker_gone *ret);
int kvr_msg_decode_reset(const struct kvr_msg *m);

/* ---- leases ----------------------------------------------------------------------------
 * An engine's scheduler leases a prefix: LEASE (its lease id, ttl, loaders) then the key list
 * as a KVR_MSG_LOOKUP list of the same wire id, answered by one LEASE_REP. The lookup actor
 * pins every lane of the matched blocks (KVR_PIN_LOOKUP) under (engine, lease id) until the
 * lease's `loaders` LEASE_DONEs arrived, a LEASE_RELEASE, or the ttl. A worker of the same
 * engine asks LEASE_TAKE for its lane's slots (answered like a lookup: LOOKUP_REP + SLOTS,
 * -ENOENT when there is no such lease) and loads them; when its load completed it sends
 * LEASE_DONE. Lease ids are the engine's own (its request ids); wire ids stay in the header. */
struct kvr_msg_lease {
	uint64_t lease_id;
	uint32_t ttl_ms;        /* LEASE: 1..3600000; else 0 */
	uint32_t loaders;       /* LEASE: 1..KVR_MSG_LEASE_MAX_LOADERS; else 0 */
	uint32_t n_keys;        /* LEASE: the key list that follows, 1..KVR_MSG_MAX_LIST; else 0 */
	uint16_t lane;          /* TAKE, DONE: the worker's lane; else 0 */
	uint16_t reserved;
	int32_t status;         /* DONE: the load's status (0 or -errno); else 0 */
	uint32_t reserved2;
};
_Static_assert(sizeof(struct kvr_msg_lease) == 32, "lease body");
#define KVR_MSG_LEASE_MAX_LOADERS 256u
#define KVR_MSG_LEASE_MAX_TTL_MS 3600000u

/* Validate a LEASE, LEASE_RELEASE, LEASE_TAKE or LEASE_DONE message of that type: the
 * fields the type uses in range, the others zero. */
int kvr_msg_decode_lease(const struct kvr_msg *m, unsigned type, struct kvr_msg_lease *ret);
/* LEASE_REP: a struct kvr_msg_lookup_rep and no list (MORE never set). */
int kvr_msg_decode_lease_rep(const struct kvr_msg *m, struct kvr_msg_lookup_rep *ret);

/* ---- L2 ------------------------------------------------------------------------------
 * Every L1<->L2 message carries one block lane and, for WRITE/READ, the (slot, epoch) it
 * names. The lookup actor keeps the block of a queued L2_WRITE from eviction; the disk
 * actor takes the slot's I/O pin (KVR_PIN_IO, kvr_slots.h) when it starts the I/O — after
 * checking state and epoch — and drops it when the I/O completed, after checking them again.
 * A read goes into a slot the lookup actor allocated (WRITING, owner KVR_SLOT_OWNER_LOOKUP)
 * for the promotion and commits once it is verified. */
#define KVR_L2F_PRESENT 0x1u /* L2_WRITE_DONE: nothing written, the file was already there */
#define KVR_L2F_LAST 0x2u    /* L2_HAVE: the last answer to an L2_SYNC (it may carry no key: lane 0xffff) */
#define KVR_L2F_GONE 0x4u    /* L2_READ_DONE: the file is not on disk (any more): forget it */

struct kvr_msg_l2 {
	uint64_t key_lo, key_hi;
	uint32_t slot, epoch;    /* WRITE/READ and their DONE: the slot; else 0 */
	uint16_t lane;           /* 0xffff only in a keyless L2_HAVE|LAST */
	uint16_t flags;          /* KVR_L2F_* */
	int32_t status;          /* DONE messages: 0 or -errno; else 0 */
};
_Static_assert(sizeof(struct kvr_msg_l2) == 32, "l2 body");

/* Validate an L2 message of the given type (0 = any L2 type): flags allowed for the type,
 * status range, lane. */
int kvr_msg_decode_l2(const struct kvr_msg *m, unsigned type, struct kvr_msg_l2 *ret);

/* Human-readable type name ("ping", ...) or "unknown". */
const char *kvr_msg_type_name(unsigned type);

/* Build a message: zeroes it, sets the header and copies body_len bytes of body. */
void kvr_msg_build(struct kvr_msg *m, unsigned type, unsigned flags, uint64_t req_id, uint32_t seq,
		   const void *body, size_t body_len);

/* Validating decoders: 0 and *ret filled, or -EBADMSG (and *ret untouched).
 * Each checks type, flags, body_len, reserved bytes and field ranges. */
int kvr_msg_decode_ping(const struct kvr_msg *m, struct kvr_msg_ping *ret);
int kvr_msg_decode_pong(const struct kvr_msg *m, struct kvr_msg_pong *ret);
int kvr_msg_decode_stop(const struct kvr_msg *m);

/* One line describing any message for inspect: "ping req=7 seq=0 flags=- len=16".
 * Unknown or malformed messages are described as such, never trusted. Returns buf. */
char *kvr_msg_describe(const struct kvr_msg *m, char *buf, size_t len);

#endif
